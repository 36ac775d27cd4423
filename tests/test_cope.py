"""CoPE (contextual positions): the reference against the formula element by element, its
properties, its errors, the registry's score-dependent bias, and the fused kernel against the
reference (forward and backward, several key blocks, padding, clamped counts)."""

import math

import pytest
import torch

from course_lib.attention import attention, attention_weights
from course_lib.encodings import CoPEAttention, contextual_positions, interpolate_position_logits
from course_lib.registry import Encoding, get_encoding
from course_lib.runtime import kernel_device, kernels_available

needs_kernels = pytest.mark.skipif(
    not kernels_available(), reason="Triton is not installed (it ships wheels for Linux only)"
)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def direct_cope_weights(q, k, table, scale, mask=None):
    """The paper's formula one element at a time (python floats, float64 inputs)."""
    batch, heads, seq, _ = q.shape
    npos = table.shape[0]
    out = torch.zeros(batch, heads, seq, seq, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(seq):
                seen = [j for j in range(i + 1) if mask is None or bool(mask[b, j])]
                s = {j: float(q[b, h, i] @ k[b, h, j]) * scale for j in seen}
                logits = {}
                for j in seen:
                    p = sum(1.0 / (1.0 + math.exp(-s[m])) for m in seen if m >= j)
                    p = min(p, npos - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    w = p - lo
                    z_lo, z_hi = float(q[b, h, i] @ table[lo]), float(q[b, h, i] @ table[hi])
                    logits[j] = s[j] + (1 - w) * z_lo + w * z_hi
                if not logits:
                    continue
                top = max(logits.values())
                total = sum(math.exp(x - top) for x in logits.values())
                for j, x in logits.items():
                    out[b, h, i, j] = math.exp(x - top) / total
    return out


@pytest.mark.parametrize("npos", [2, 3, 16])
def test_reference_is_the_formula_element_by_element(npos):
    q, k = (2.0 * torch.randn(2, 2, 2, 7, 4, generator=gen(npos), dtype=torch.float64)).unbind(0)
    table = torch.randn(npos, 4, generator=gen(100 + npos), dtype=torch.float64)
    mask = torch.tensor([[True] * 7, [True, False, True, True, False, True, True]])
    got = attention_weights(
        q, k, method="cope", causal=True, key_padding_mask=mask, position_embeddings=table
    )
    want = direct_cope_weights(q, k, table, 0.5, mask)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # a custom scale scales the scores (and so the gates) but not z = q . e
    got = attention_weights(q, k, method="cope", causal=True, position_embeddings=table, scale=0.3)
    torch.testing.assert_close(got, direct_cope_weights(q, k, table, 0.3), atol=1e-12, rtol=0)


def test_count_includes_key_j_and_stops_at_the_query():
    scores = torch.randn(1, 1, 5, 5, generator=gen(1), dtype=torch.float64)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    p = contextual_positions(scores, allowed, npos=100)
    g = torch.sigmoid(scores[0, 0])
    for i in range(5):
        for j in range(i + 1):
            assert math.isclose(float(p[0, 0, i, j]), float(g[i, j : i + 1].sum()), rel_tol=1e-12)
    assert torch.allclose(p[0, 0].diagonal(), g.diagonal())  # p_ii = g_ii
    # all gates ~1: the count is the distance plus one, capped at npos - 1
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    p = contextual_positions(torch.full((6, 6), 50.0, dtype=torch.float64), causal, npos=4)
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    want = (i - j + 1).clamp(min=0, max=3).to(torch.float64)
    assert torch.equal(p.tril(), want.tril())


def test_interpolation_between_integer_positions():
    z = torch.tensor([[0.0, 10.0, 30.0, 70.0]], dtype=torch.float64)  # [1 query, npos 4]
    p = torch.tensor([[0.0, 1.0, 1.5, 2.25, 3.0]], dtype=torch.float64)
    got = interpolate_position_logits(z, p)
    assert got.tolist() == [[0.0, 10.0, 20.0, 40.0, 70.0]]
    p.requires_grad_()
    (grad,) = torch.autograd.grad(interpolate_position_logits(z, p).sum(), p)
    assert grad.tolist() == [[0.0, 0.0, 20.0, 40.0, 0.0]]  # z[ceil] - z[floor]; 0 at integers


def test_zero_table_or_closed_gates_is_plain_causal_softmax():
    q, k, v = torch.randn(3, 1, 2, 9, 8, generator=gen(2), dtype=torch.float64).unbind(0)
    plain = attention(q, k, v, method="softmax", causal=True)
    zero = attention(q, k, v, method="cope", causal=True, position_embeddings=torch.zeros(5, 8,
                     dtype=torch.float64))  # fmt: skip
    torch.testing.assert_close(zero, plain)
    # gates all ~0 (very negative scores): every count is 0, the bias z_i[0] is one constant per
    # row, and a softmax ignores a constant per row
    table = torch.randn(5, 8, generator=gen(3), dtype=torch.float64)
    far = attention(-q.abs() * 1e3, k.abs(), v, method="cope", causal=True,
                    position_embeddings=table)  # fmt: skip
    torch.testing.assert_close(far, attention(-q.abs() * 1e3, k.abs(), v, method="softmax",
                                              causal=True))  # fmt: skip


def test_position_ids_are_never_read():
    torch.manual_seed(0)
    module = CoPEAttention(32, 4, max_position_embeddings=16).double()
    with torch.no_grad():
        module.position_embeddings.normal_(0, 1.0, generator=gen(4))
    x = torch.randn(2, 10, 32, generator=gen(5), dtype=torch.float64)
    shifted = module(x, causal=True, position_ids=torch.arange(10) + 50)
    torch.testing.assert_close(shifted, module(x, causal=True), rtol=0, atol=0)
    with pytest.raises(ValueError, match="uses no position ids"):
        attention(*torch.randn(3, 1, 1, 4, 8).unbind(0), method="cope", causal=True,
                  position_ids=torch.arange(4), position_embeddings=torch.zeros(4, 8))  # fmt: skip


def test_gradcheck_float64():
    q, k, v = (
        t.requires_grad_()
        for t in torch.randn(3, 1, 2, 6, 4, generator=gen(6), dtype=torch.float64)
    )
    table = torch.randn(4, 4, generator=gen(7), dtype=torch.float64).requires_grad_()
    mask = torch.tensor([[True, True, False, True, True, True]])

    def fn(q, k, v, table):
        return attention(q, k, v, method="cope", causal=True, key_padding_mask=mask,
                         position_embeddings=table)  # fmt: skip

    assert torch.autograd.gradcheck(fn, (q, k, v, table))


def test_clear_errors():
    q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
    with pytest.raises(ValueError, match=r"\[npos, head_dim\] = \[npos, 8\]"):
        attention(q, k, v, method="cope", causal=True, position_embeddings=torch.zeros(6, 4))
    with pytest.raises(ValueError, match="npos >= 2"):
        attention(q, k, v, method="cope", causal=True, position_embeddings=torch.zeros(1, 8))
    with pytest.raises(TypeError, match="floating-point"):
        attention(q, k, v, method="cope", causal=True, position_embeddings=[[0.0] * 8] * 3)
    with pytest.raises(ValueError, match="finite"):
        attention(q, k, v, method="cope", causal=True,
                  position_embeddings=torch.full((3, 8), float("nan")))  # fmt: skip
    with pytest.raises(ValueError, match="causal only"):
        attention(q, k, v, method="cope", position_embeddings=torch.zeros(3, 8))
    with pytest.raises(ValueError, match="needs position_embeddings"):
        attention(q, k, v, method="cope", causal=True)
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match="npos must be an integer >= 2"):
            CoPEAttention(16, 2, npos=bad)


def test_module_table_and_record():
    module = CoPEAttention(32, 4, max_position_embeddings=24)
    assert module.position_embeddings.shape == (24, 8) and not module.position_embeddings.any()
    assert CoPEAttention(32, 4, npos=5).position_embeddings.shape == (5, 8)
    spec = get_encoding("cope")
    assert spec.acts_in_attention and not spec.uses_positions and spec.method == "cope"
    assert spec.causal_only and spec.relative and spec.learnable
    assert spec.places()["score bias"].startswith("q_i . e[p_ij]")


def test_registry_extension_rules():
    def bias(scores, q, allowed, params):
        return torch.zeros_like(scores)

    common = dict(chapter="99", summary="s", module=CoPEAttention, color="#000000",
                  score_bias_from_scores=bias)  # fmt: skip
    with pytest.raises(ValueError, match="needs kernel_attention"):
        Encoding(name="from_scores_no_kernel", **common)
    with pytest.raises(ValueError, match="softmax normaliser only"):
        Encoding(name="from_scores_stick", normaliser="stick_breaking", kernel_support="x",
                 **common)  # fmt: skip
    assert Encoding(name="from_scores_ok", kernel_support="no kernel yet", **common)


# -- the fused kernel ---------------------------------------------------------------------------
def _kernel_case(batch, heads, seq, npos, seed, dtype=torch.float32):
    device = kernel_device()
    g = gen(seed)
    q = (1.5 * torch.randn(batch, heads, seq, 16, generator=g)).to(device, dtype)
    k, v = (torch.randn(batch, heads, seq, 16, generator=g).to(device, dtype) for _ in range(2))
    table = torch.randn(npos, 16, generator=g).to(device, dtype)
    return [t.requires_grad_() for t in (q, k, v, table)]


@needs_kernels
@pytest.mark.parametrize(
    "seq, npos, padded",
    [(40, 6, True), (37, 64, False), (16, 2, False)],  # clamped counts, unclamped, one block
)
def test_kernel_matches_reference_forward_and_backward(seq, npos, padded):
    from course_lib.cope_ops import cope_attention

    q, k, v, table = _kernel_case(2, 2, seq, npos, seed=seq)
    mask = None
    if padded:
        mask = torch.ones(2, seq, dtype=torch.bool)
        mask[0, 0] = False  # query 0 of sequence 0 sees no key at all: output 0
        mask[0, 5] = False
        mask[1, seq - 9 :] = False
        mask = mask.to(q.device)
    upstream = torch.randn(q.shape, generator=gen(1)).to(q.device)
    ref = attention(q.double(), k.double(), v.double(), method="cope", causal=True,
                    key_padding_mask=mask, position_embeddings=table.double())  # fmt: skip
    out = cope_attention(q, k, v, table, key_padding_mask=mask, block=16)  # 3 key blocks
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    if padded:
        assert not out[0, :, 0].any()
    grads_ref = torch.autograd.grad((ref * upstream.double()).sum(), (q, k, v, table))
    grads_out = torch.autograd.grad((out * upstream).sum(), (q, k, v, table))
    for name, a, b in zip("q k v e".split(), grads_out, grads_ref, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4, msg=f"d{name}")


@needs_kernels
@pytest.mark.parametrize("npos", [80, 40])  # never capped; capped from about 40 keys back
def test_kernel_dz_over_windows_wider_than_one_chunk(npos):
    """Gates near 1 (q and k share a direction): a row's counts across a 64-key tile span about
    60 positions, four chunks of the backward's ``dz`` window, and with ``npos = 40`` a tile
    holds capped and free counts side by side."""
    from course_lib.cope_ops import cope_attention
    from kernels.cope import CHUNK

    q, k, v, table = (t.detach() for t in _kernel_case(1, 2, 70, npos, seed=5))
    shared = torch.full((16,), 1.0, device=q.device)  # |shared| = 4
    q, k = q / 1.5 + shared, k + shared  # scores about 16 / 4: gates about 0.98
    q, k, v, table = (t.requires_grad_() for t in (q, k, v, table))
    ref = attention(q.double(), k.double(), v.double(), method="cope", causal=True,
                    position_embeddings=table.double())  # fmt: skip
    gates = torch.sigmoid(q.detach() @ k.detach().transpose(-1, -2) / 4).tril()
    # the last row of block 0 spans more than three chunks
    assert gates[0, :, 63, :64].sum(-1).min() > 3 * CHUNK
    out = cope_attention(q, k, v, table, block=64)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    upstream = torch.randn(q.shape, generator=gen(2)).to(q.device)
    grads_ref = torch.autograd.grad((ref * upstream.double()).sum(), (q, k, v, table))
    grads_out = torch.autograd.grad((out * upstream).sum(), (q, k, v, table))
    for name, a, b in zip("q k v e".split(), grads_out, grads_ref, strict=True):
        # float32 sums of about 60 gates per count: error relative to the gradient's scale
        error = (a.double() - b).abs().max() / b.abs().max()
        assert error < 3e-4, f"d{name}: max error {error:.1e} of the largest |d{name}|"


@needs_kernels
def test_gpu_tiles_fit_the_shared_memory_of_the_target():
    """The column kernel at 32 x 128 asks 68 KiB on sm_75 (64 KiB per block): 16 rows there
    (``python -m course_lib.gpu_report`` compiles both and checks them against the limit)."""
    from kernels import common
    from kernels.cope import pick_block

    sizes = {}
    for arch in (90, 86, 75):
        with common.planned_launches(arch):
            sizes[arch] = [pick_block(torch.device("meta"), d) for d in (64, 128)]
    assert sizes == {90: [32, 32], 86: [32, 32], 75: [32, 16]}


@needs_kernels
def test_kernel_through_the_backend_and_errors():
    from course_lib.cope_ops import cope_attention

    q, k, v, table = _kernel_case(1, 2, 20, 8, seed=3)
    via_backend = attention(q, k, v, method="cope", causal=True, backend="triton",
                            position_embeddings=table)  # fmt: skip
    torch.testing.assert_close(via_backend, cope_attention(q, k, v, table))
    with pytest.raises(ValueError, match="causal only"):
        cope_attention(q, k, v, table, causal=False)
    with pytest.raises(ValueError, match=r"\[npos >= 2, 16\]"):
        cope_attention(q, k, v, table[:1])
    with pytest.raises(ValueError, match="power of two"):
        cope_attention(q, k, v, table, block=24)


@needs_kernels
def test_position_logits_stay_float32_under_autocast(monkeypatch):
    """Mixed-precision training (the gpu preset's bf16 autocast) hands the kernel float32
    position logits z = q E^T, whatever dtype autocast would pick for the product."""
    from course_lib import cope_ops

    seen = {}

    def record(q, k, v, z, mask, scale, block):
        seen["z"] = z.dtype
        return torch.zeros_like(q)

    monkeypatch.setattr(cope_ops._CoPEFunction, "apply", record)
    q, k, v, table = _kernel_case(1, 2, 20, 8, seed=4)
    with torch.autocast(device_type=q.device.type, dtype=torch.bfloat16):
        cope_ops.cope_attention(q, k, v, table)
    assert seen["z"] == torch.float32
