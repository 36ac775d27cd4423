"""T5's relative bias and FoX's forget gates: the formulas, the modules, the kernel hooks.

The shared checks (shift claim, padding, cached decoding, gradcheck, module vs Triton) run for
both in ``test_registry_conformance.py``; this file checks what is specific to them: T5's bucket
function against values derived by hand, the parameter counts, FoX with every gate open is plain
causal softmax, the cache carries the gates, and the ``"t5_buckets"`` and
``"cumulative_log_gates"`` hooks against direct float64 formulas, forward and backward (the
table's and the gates' gradients included), on ragged shapes with padding.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.attention import attention
from course_lib.encodings import (
    FoXAttention,
    T5Attention,
    cumulative_log_forget,
    forget_bias_for_decay_time,
    relative_position_bucket,
    t5_parameter_count,
)
from course_lib.kernel_hooks import ScoreBias
from course_lib.model import BertConfig, MiniBert
from course_lib.runtime import KERNEL_MODE, kernel_device

needs_kernels = pytest.mark.skipif(
    KERNEL_MODE == "unavailable", reason="Triton is not installed (no wheels on this platform)"
)


def gen(seed):
    return torch.Generator().manual_seed(seed)


# -- T5: the bucket function ------------------------------------------------------------------
# Derived by hand from the formula (bidirectional, 32 buckets, max_distance 128): 16 buckets per
# direction, 8 exact; for n >= 8 the bucket is 8 + floor(8 log(n/8) / log 16) = 8 + floor(2
# log2(n/8)), so 11 -> 8 + floor(0.92) = 8, 12 -> 8 + floor(1.17) = 9, 16 -> 10, 23 -> 8 +
# floor(3.05) = 11, 45 -> 8 + floor(4.98) = 12, 46 -> 13, 90 -> 8 + floor(6.98) = 14, 91 -> 15,
# from 128 on 16 -> clamped to 15. Keys after the query add 16.
BIDIRECTIONAL_BY_HAND = {
    0: 0, -1: 1, -7: 7, -8: 8, -11: 8, -12: 9, -16: 10, -23: 11, -32: 12, -45: 12, -46: 13,
    -64: 14, -90: 14, -91: 15, -127: 15, -128: 15, -5000: 15,
    1: 17, 7: 23, 8: 24, 12: 25, 46: 29, 91: 31, 5000: 31,
}  # fmt: skip
# Unidirectional (32, 128): 32 buckets, 16 exact; 16 + floor(16 log2(n/16) / 3): 23 -> 16 +
# floor(2.79) = 18, 32 -> 21, 45 -> 16 + floor(7.96) = 23, 64 -> 26, 90 -> 16 + floor(13.29) =
# 29, 127 -> 16 + floor(15.94) = 31, and every key after the query shares bucket 0.
UNIDIRECTIONAL_BY_HAND = {
    0: 0, -1: 1, -15: 15, -16: 16, -23: 18, -32: 21, -45: 23, -64: 26, -90: 29, -127: 31,
    -128: 31, -5000: 31, 1: 0, 40: 0, 5000: 0,
}  # fmt: skip


@pytest.mark.parametrize(
    ("bidirectional", "expected"),
    [(True, BIDIRECTIONAL_BY_HAND), (False, UNIDIRECTIONAL_BY_HAND)],
    ids=["bidirectional", "unidirectional"],
)
def test_buckets_match_values_derived_by_hand(bidirectional, expected):
    relative = torch.tensor(list(expected))
    got = relative_position_bucket(relative, bidirectional=bidirectional)
    assert got.dtype == torch.int64
    assert dict(zip(expected, got.tolist(), strict=True)) == expected


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (12, 20), (64, 1000)])
def test_buckets_are_monotone_clamped_and_exact_near(bidirectional, num_buckets, max_distance):
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    exact = per_direction // 2
    back = torch.arange(0, 4 * max_distance)  # keys at or before the query: r = -back
    before = relative_position_bucket(
        -back, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(before[:exact], torch.arange(exact))  # one bucket per near distance
    assert bool((before[1:] >= before[:-1]).all())  # monotone in the distance
    assert set(before.tolist()) == set(range(per_direction))  # every bucket is used
    assert bool((before[max_distance:] == per_direction - 1).all())  # clamped from max_distance
    after = relative_position_bucket(
        back[1:], bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    if bidirectional:  # the same buckets, shifted to the upper half
        assert torch.equal(after, before[1:] + per_direction)
    else:  # the future shares bucket 0
        assert bool((after == 0).all())


def test_bucket_arguments_are_checked():
    r = torch.arange(-5, 5)
    with pytest.raises(ValueError, match="even when bidirectional"):
        relative_position_bucket(r, num_buckets=31)
    relative_position_bucket(r, bidirectional=False, num_buckets=31)  # fine one-sided
    with pytest.raises(ValueError, match="max_distance .* must be larger"):
        relative_position_bucket(r, num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="at least\n?.*2 are needed|num_buckets >= 4"):
        relative_position_bucket(r, num_buckets=2)
    with pytest.raises(TypeError, match="integer tensor"):
        relative_position_bucket(r.float())


def test_t5_bias_is_the_table_read_at_the_buckets():
    """``attention(method="t5")`` equals softmax attention with the bias matrix written out."""
    heads, seq, dim = 3, 20, 8
    q, k, v = torch.randn(3, 2, heads, seq, dim, generator=gen(0), dtype=torch.float64)
    table = torch.randn(heads, 12, generator=gen(1), dtype=torch.float64)
    pos = torch.arange(seq) * 3  # non-unit spacing: the buckets follow positions
    for causal in (True, False):
        out = attention(
            q, k, v, method="t5", causal=causal, position_ids=pos, bias_table=table,
            max_distance=30,
        )  # fmt: skip
        bucket = relative_position_bucket(
            pos[None, :] - pos[:, None], bidirectional=not causal, num_buckets=12, max_distance=30
        )
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim) + table[:, bucket]
        if causal:
            scores = scores.masked_fill(torch.ones(seq, seq).triu(1).bool(), float("-inf"))
        torch.testing.assert_close(out, torch.softmax(scores, -1) @ v)


def test_t5_parameter_count_and_module():
    module = T5Attention(32, 4)
    assert tuple(module.bias_table.shape) == (4, 32)
    own = sum(p.numel() for n, p in module.named_parameters() if n == "bias_table")
    assert own == t5_parameter_count(4) == 4 * 32
    assert t5_parameter_count(12, 16) == 192
    small = T5Attention(32, 2, num_buckets=8, max_distance=16)
    assert tuple(small.bias_table.shape) == (2, 8)
    config = BertConfig(vocab_size=30, hidden_size=32, num_layers=3, num_heads=4, encoding="t5")
    model = MiniBert(config)
    tables = [n for n, _ in model.named_parameters() if n.endswith("bias_table")]
    assert len(tables) == 3  # one table per layer
    with pytest.raises(ValueError, match="even"):
        T5Attention(32, 4, num_buckets=31)


def test_t5_errors():
    q = k = v = torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match=r"\[heads, num_buckets\] = \[2, num_buckets\]"):
        attention(q, k, v, method="t5", bias_table=torch.zeros(3, 32))
    with pytest.raises(ValueError, match="even when bidirectional"):
        attention(q, k, v, method="t5", bias_table=torch.zeros(2, 31))
    attention(q, k, v, method="t5", causal=True, bias_table=torch.zeros(2, 31))  # one-sided: fine
    with pytest.raises(ValueError, match="max_distance"):
        attention(q, k, v, method="t5", bias_table=torch.zeros(2, 32), max_distance=8)
    with pytest.raises(TypeError, match="floating-point"):
        attention(q, k, v, method="t5", bias_table=torch.zeros(2, 32, dtype=torch.long))


# -- FoX ----------------------------------------------------------------------------------------
def fox_by_loops(q, k, v, log_forget):
    """FoX written the long way (float64, small sizes): D_ij = sum_{l=j+1..i} log f_l."""
    batch, heads, seq, dim = q.shape
    d = torch.full((batch, heads, seq, seq), float("-inf"), dtype=torch.float64)
    for i in range(seq):
        for j in range(i + 1):
            d[:, :, i, j] = log_forget[:, :, j + 1 : i + 1].double().sum(-1)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(dim) + d
    return torch.softmax(scores, -1) @ v.double()


def test_fox_matches_the_sum_over_gates_written_out():
    q, k, v = torch.randn(3, 2, 3, 9, 8, generator=gen(2), dtype=torch.float64)
    log_forget = F.logsigmoid(torch.randn(2, 3, 9, generator=gen(3), dtype=torch.float64))
    out = attention(q, k, v, method="fox", causal=True, log_forget=log_forget)
    torch.testing.assert_close(out, fox_by_loops(q, k, v, log_forget))
    c = cumulative_log_forget(log_forget)
    torch.testing.assert_close(c[..., 5] - c[..., 2], log_forget[..., 3:6].sum(-1))


def test_fox_with_every_gate_open_is_plain_causal_softmax():
    q, k, v = torch.randn(3, 2, 3, 11, 8, generator=gen(4))
    mask = torch.arange(11)[None] < torch.tensor([[11], [8]])
    kw = dict(causal=True, key_padding_mask=mask)
    fox = attention(q, k, v, method="fox", log_forget=torch.zeros(2, 3, 11), **kw)
    torch.testing.assert_close(fox, attention(q, k, v, method="softmax", **kw))
    closing = torch.zeros(2, 3, 11)
    closing[..., 5] = -3.0  # one gate nearly shut: the keys before token 5 fade for later queries
    assert not torch.allclose(attention(q, k, v, method="fox", log_forget=closing, **kw), fox)


def test_fox_errors():
    q = k = v = torch.randn(2, 3, 6, 8)
    good = torch.full((2, 3, 6), -0.1)
    with pytest.raises(ValueError, match="causal only"):
        attention(q, k, v, method="fox", causal=False, log_forget=good)
    with pytest.raises(ValueError, match="log_forget must be <= 0"):
        attention(q, k, v, method="fox", causal=True, log_forget=good.abs())
    with pytest.raises(ValueError, match="finite"):
        attention(q, k, v, method="fox", causal=True, log_forget=good - float("inf"))
    with pytest.raises(ValueError, match=r"\[batch, heads, seq_k\]"):
        attention(q, k, v, method="fox", causal=True, log_forget=good[..., :5])
    with pytest.raises(ValueError, match=r"\[batch, heads, seq_k\]"):
        attention(q, k, v, method="fox", causal=True, log_forget=good[:, :2])
    with pytest.raises(ValueError, match="needs log_forget"):
        attention(q, k, v, method="fox", causal=True)


def test_fox_module_gates_and_init():
    module = FoXAttention(32, 4)
    assert torch.equal(module.forget_gate.bias, torch.zeros(4))  # the official zero bias
    x = torch.randn(2, 7, 32, generator=gen(5))
    log_f = module.log_forget(x)
    assert tuple(log_f.shape) == (2, 4, 7) and bool((log_f < 0).all())
    torch.testing.assert_close(
        log_f,
        F.logsigmoid(x @ module.forget_gate.weight.T + module.forget_gate.bias).transpose(1, 2),
    )
    # the decay-time bias: log sigmoid(b) = -1/T
    b = forget_bias_for_decay_time(torch.tensor([1.0, 10.0, 1000.0]))
    torch.testing.assert_close(F.logsigmoid(b), -1.0 / torch.tensor([1.0, 10.0, 1000.0]))
    assert math.isclose(float(forget_bias_for_decay_time(1 / math.log(2))), 0.0, abs_tol=1e-6)


def test_fox_cache_carries_the_gates_of_the_whole_prefix():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30, hidden_size=32, num_layers=2, num_heads=4, encoding="fox", objective="clm"
    )
    model = MiniBert(config).double().eval()
    ids = torch.randint(0, 30, (2, 9), generator=gen(6))
    full = model(ids).logits
    cache = model.new_cache()
    pieces = [model(ids[:, :3], cache=cache).logits]
    for t in range(3, 9):
        pieces.append(model(ids[:, t : t + 1], cache=cache).logits)
        assert cache[0].per_key["log_forget"].shape == (2, 4, t + 1)
    torch.testing.assert_close(torch.cat(pieces, 1), full)
    # the first layer's cached column is its own gates of every token, computed token by token
    first = model.layers[0]
    hidden = first.attention_norm(model.token_embeddings(ids))
    torch.testing.assert_close(cache[0].per_key["log_forget"], first.attention.log_forget(hidden))


# -- kernels -------------------------------------------------------------------------------------
if KERNEL_MODE != "unavailable":
    import triton
    import triton.language as tl
    from course_lib.kernels.score_bias import _t5_bucket

    @triton.jit
    def _buckets_of(BACK, OUT, n, OPTIONS: tl.constexpr, BLOCK: tl.constexpr):
        """``OUT = bucket(BACK)``: the kernels' in-tile T5 bucket of ``p_i - p_j``, alone."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        back = tl.load(BACK + offs, mask=offs < n, other=0.0)
        tl.store(OUT + offs, _t5_bucket(back, OPTIONS), mask=offs < n)


def _direct(q, k, v, bias, causal, mask):
    """Softmax attention with an explicit bias matrix (float64); rows with no key give 0."""
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    seq = q.shape[2]
    allowed = torch.ones(seq, seq, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    allowed = allowed[None, None] & mask[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, -1).nan_to_num(0.0)
    return weights @ v.double()


def _ragged(batch, heads, seq, dim, seed):
    g = gen(seed)
    q, k, v, up = (torch.randn(batch, heads, seq, dim, generator=g) for _ in range(4))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[-1, seq - seq // 3 :] = False  # the last row padded at the end
    if batch > 2:
        mask[1, : seq // 4] = False  # another padded at the start
    return q, k, v, up, mask


def _compare(fused_fn, direct_fn, tensors, upstream, tol=1e-4):
    """Outputs and gradients of every tensor: kernel (fp32) vs direct formula (float64)."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fused_fn(*leaves)
    grads = torch.autograd.grad(out, leaves, upstream.to(out.device))
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in tensors]
    ref = direct_fn(*ref_leaves)
    ref_grads = torch.autograd.grad(ref, ref_leaves, upstream.double())
    scale = ref.detach().abs().max()
    assert (out.double().cpu() - ref).abs().max() < tol * max(1.0, float(scale)), "out"
    for name, g, r in zip("qkvp", grads, ref_grads, strict=True):
        assert g.shape == r.shape, name
        err = (g.double().cpu() - r).abs().max() / max(1.0, float(r.abs().max()))
        assert err < tol, (name, float(err))


@needs_kernels
@pytest.mark.parametrize(
    ("heads", "seq", "num_buckets", "max_distance", "causal", "bidirectional"),
    [
        (3, 37, 32, 20, True, False),  # T5's decoder
        (5, 70, 32, 40, False, True),  # T5's encoder, two key blocks, far buckets
        (3, 45, 12, 16, False, False),  # a one-sided table without a causal mask, width 12
        (2, 19, 6, 5, True, True),  # tiny table (3 per direction), positions spaced by 3
    ],
)
def test_t5_kernel_matches_direct_formula(heads, seq, num_buckets, max_distance, causal,
                                          bidirectional):  # fmt: skip
    from course_lib.flash_ops import flash_attention

    device = kernel_device()
    q, k, v, up, mask = _ragged(3, heads, seq, 16, seed=seq)
    table = torch.randn(heads, num_buckets, generator=gen(7))
    spacing = 3 if num_buckets == 6 else 1
    pos = torch.arange(seq) * spacing + 4
    options = dict(num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    bucket = relative_position_bucket(
        pos[None, :] - pos[:, None], bidirectional=bidirectional, num_buckets=num_buckets,
        max_distance=max_distance,
    )  # fmt: skip

    def fused(q, k, v, table):
        bias = ScoreBias("t5_buckets", per_head=table, options=options)
        return flash_attention(
            q, k, v, causal=causal, key_padding_mask=mask.to(device),
            position_ids=pos.to(device), score_bias=bias,
        )  # fmt: skip

    def direct(q, k, v, table):
        return _direct(q, k, v, table[:, bucket], causal, mask)

    tensors = [t.to(device) for t in (q, k, v, table)]
    _compare(fused, direct, tensors, up)


@needs_kernels
@pytest.mark.parametrize(("heads", "seq"), [(3, 37), (5, 70), (1, 1)])
def test_fox_kernel_matches_direct_formula(heads, seq):
    """``c`` is a leaf here: its kernel gradient (the row sums of dS minus its column sums) must
    equal autograd of ``b_ij = c_i - c_j``."""
    from course_lib.flash_ops import flash_attention

    device = kernel_device()
    q, k, v, up, mask = _ragged(3, heads, seq, 16, seed=seq + 1)
    log_forget = F.logsigmoid(torch.randn(3, heads, seq, generator=gen(8)) + 1.0)
    c = cumulative_log_forget(log_forget).float()  # the kernels read c as float32

    def fused(q, k, v, c):
        bias = ScoreBias("cumulative_log_gates", per_token=c)
        return flash_attention(
            q, k, v, causal=True, key_padding_mask=mask.to(device), score_bias=bias
        )

    def direct(q, k, v, c):
        return _direct(q, k, v, c[..., :, None] - c[..., None, :], True, mask)

    _compare(fused, direct, [t.to(device) for t in (q, k, v, c)], up)


@needs_kernels
def test_fox_gate_gradients_through_the_triton_backend():
    """``attention(method="fox", backend="triton")``: the gradient reaches ``log f`` through the
    cumulative sum, as in the reference (non-power-of-two heads, padding)."""
    device = kernel_device()
    q, k, v, up, mask = _ragged(2, 3, 29, 32, seed=9)
    log_forget = F.logsigmoid(torch.randn(2, 3, 29, generator=gen(10)))
    results = []
    for backend in ("reference", "triton"):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v, log_forget)]
        out = attention(
            *leaves[:3], method="fox", causal=True, key_padding_mask=mask.to(device),
            log_forget=leaves[3], backend=backend,
        )  # fmt: skip
        results.append((out, torch.autograd.grad(out, leaves, up.to(device))))
    (ref, ref_grads), (tri, tri_grads) = results
    torch.testing.assert_close(tri, ref, atol=1e-5, rtol=1e-4)
    for g_tri, g_ref in zip(tri_grads, ref_grads, strict=True):
        torch.testing.assert_close(g_tri, g_ref, atol=1e-5, rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("gate_dtype", [torch.bfloat16, torch.float16])
def test_fox_16_bit_gates_are_summed_and_read_at_full_precision(gate_dtype):
    """Gates in 16 bits (as a bf16 autocast gives them) go to the kernels as a float32 sum:
    the output and gradients equal the reference's for the same gate values. Handed over in
    the gates' dtype, ``c`` (-46 at the end here) was rounded to 1/4 in bf16 and the output was
    off by 0.12."""
    device = kernel_device()
    g = gen(12)
    q, k, v, up = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(4))
    log_forget = F.logsigmoid(torch.randn(1, 2, 256, generator=g) + 2.0).to(gate_dtype)
    results = []
    for backend in ("reference", "triton"):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v, log_forget)]
        out = attention(
            *leaves[:3], method="fox", causal=True, log_forget=leaves[3], backend=backend
        )  # fmt: skip
        results.append((out, torch.autograd.grad(out, leaves, up.to(device))))
    (ref, ref_grads), (tri, tri_grads) = results
    torch.testing.assert_close(tri, ref, atol=1e-5, rtol=1e-4)
    for g_tri, g_ref in zip(tri_grads[:3], ref_grads[:3], strict=True):
        torch.testing.assert_close(g_tri, g_ref, atol=1e-5, rtol=1e-4)
    assert tri_grads[3].dtype == gate_dtype
    # the gates' gradient, rounded to their 16 bits, within one rounding of the reference's
    torch.testing.assert_close(tri_grads[3].float(), ref_grads[3].float(), atol=1e-3, rtol=1e-2)


@needs_kernels
def test_fox_gate_gradient_in_fp16_keeps_the_query_side():
    """In 16 bits the rows of the kernels' ``dS`` do not sum to 0 (``delta`` comes from the
    forward's rounded ``P V``), and FoX's gradient goes through a cumulative sum over the
    sequence, which adds the rows' leftovers up. The first gate shows it sharply: ``log f_0`` is
    in every ``c_i`` alike, so its gradient is exactly 0. Leaving the query side out gave about
    5e-4 of the gradient's scale there (and twice the error elsewhere); with it, 3e-7."""
    device = kernel_device()
    g = gen(3)
    q, k, v, up = (torch.randn(1, 2, 160, 32, generator=g) for _ in range(4))
    log_forget = F.logsigmoid(torch.randn(1, 2, 160, generator=g) + 2.0)
    grads = {}
    for backend, dtype in (("reference", torch.float64), ("triton", torch.float16)):
        leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
        gates = log_forget.to(device, torch.float64 if dtype == torch.float64 else torch.float32)
        gates.requires_grad_()
        out = attention(
            *leaves, method="fox", causal=True, log_forget=gates, backend=backend
        )  # fmt: skip
        (grads[backend],) = torch.autograd.grad(out, [gates], up.to(device, out.dtype))
    want, got = grads["reference"].double().cpu(), grads["triton"].double().cpu()
    scale = want.abs().max().item()
    assert want[..., 0].abs().max().item() < 1e-12 * scale
    first = got[..., 0].abs().max().item() / scale
    assert first < 1e-5, f"the first gate's gradient is {first:.1e} of the scale, not 0"
    error = (got - want).abs().max().item() / scale
    # 3e-4 here (fp16's rounding of dO alone gives 2e-4); without the query side, 7e-4
    assert error < 5e-4, f"dlog_forget in fp16 is off by {error:.1e} of its scale"


@needs_kernels
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (12, 20), (64, 1000)])
def test_t5_bucket_in_the_tile_equals_the_reference(bidirectional, num_buckets, max_distance):
    """The kernel's bucket (counted against thresholds, no log) for every distance in a range
    well past ``max_distance``, both signs."""
    import triton

    from course_lib.encodings.t5 import T5_BUCKETS

    back = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    options = T5_BUCKETS.kernel_options(
        dict(num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    )
    device = kernel_device()
    out = torch.empty(back.shape, dtype=torch.int32, device=device)
    block = 1024
    _buckets_of[(triton.cdiv(back.numel(), block),)](
        back.float().to(device), out, back.numel(), options, block
    )
    want = relative_position_bucket(
        -back, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(out.cpu().long(), want)


@needs_kernels
def test_hook_errors_are_clear():
    from course_lib.flash_ops import flash_attention
    from course_lib.stick_ops import stick_breaking_attention

    device = kernel_device()
    q = k = v = torch.randn(2, 3, 8, 16, device=device)
    table = torch.zeros(3, 8, device=device)
    options = dict(num_buckets=8, max_distance=16, bidirectional=True)
    c = torch.zeros(2, 3, 8, device=device)
    with pytest.raises(ValueError, match="flash kernels only, not in the stick-breaking"):
        stick_breaking_attention(q, k, v, score_bias=ScoreBias("t5_buckets", table, None, options))
    with pytest.raises(ValueError, match="softmax rows summing to 1"):
        stick_breaking_attention(q, k, v, score_bias=ScoreBias("cumulative_log_gates", per_token=c))
    with pytest.raises(ValueError, match="missing \\['max_distance'\\]"):
        flash_attention(
            q, k, v, score_bias=ScoreBias("t5_buckets", table, options={"num_buckets": 8,
                                                                      "bidirectional": True})
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"per_head must have shape \[heads, width\] = \[3, 16\]"):
        flash_attention(
            q,
            k,
            v,
            score_bias=ScoreBias("t5_buckets", table, options={**options, "num_buckets": 16}),
        )
    with pytest.raises(ValueError, match="reads per_token, not per_head"):
        flash_attention(q, k, v, score_bias=ScoreBias("cumulative_log_gates", per_head=c))
    with pytest.raises(
        ValueError, match=r"per_token must have shape \[batch, heads, seq\] = \[2, 3, 8\]"
    ):
        flash_attention(
            q, k, v, score_bias=ScoreBias("cumulative_log_gates", per_token=c[:, :, :7])
        )


@needs_kernels
def test_fox_cumulative_sum_past_float32s_reach_is_refused_and_looked_at_only_where_it_can_be():
    # the kernels read c = cumsum(log f) as float32: past 2^18 c_i - c_j loses 1/32 where a key
    # still counts (log f > -128 at the query); the lowest gate bounds |c| by seq * |lowest|
    from course_lib.kernels.common import planned_launches

    from course_lib.host_reads import HostReads

    seq = 2100  # 2100 * 127 > 2^18
    q = torch.randn(1, 1, seq, 16)
    steep = torch.full((1, 1, seq), -127.0)
    with pytest.raises(ValueError, match=r"cumulative log forget gates .* 2\^18"):
        attention(q, q, q, method="fox", causal=True, backend="triton", log_forget=steep)
    mild = torch.full((1, 1, seq), -0.5)  # |c| <= 1050: nothing to look at
    with planned_launches(90), torch.no_grad(), HostReads() as reads:
        attention(q, q, q, method="fox", causal=True, backend="triton", log_forget=mild)
    assert reads.count == 1  # finite, log f <= 0 and the lowest value: read together
