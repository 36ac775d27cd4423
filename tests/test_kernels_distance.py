"""The kernels' per-distance path: a bias of ``p_i - p_j`` written in torch, read from a table.

``course_lib.kernel_hooks.distance_score_bias`` tabulates an encoding's ``distance_bias`` on the
diagonals ``i - j`` (positions that step by a constant ``s`` give ``p_i - p_j = s (i - j)``);
both kernel families read the table per pair (``DIAGONAL_TABLE``) and return the sums of
``dS`` along each diagonal, one slot per tile, which torch adds up (no atomics). Checked here:
the hook against a direct float64 formula for any table (outputs, dq, dk, dv and the table's
gradient), both families, causal and bidirectional, padded, ragged, shared or per-sequence
tables; deterministic; through ``attention()`` for T5 and ALiBi's distance biases; and the
clear error for positions that do not step by a constant.
"""

import math

import pytest
import torch

from course_lib.attention import attention
from course_lib.kernel_hooks import (
    ScoreBias,
    distance_score_bias,
    kernel_positions,
    position_steps,
)
from course_lib.runtime import kernel_device, kernels_available
from course_lib.stick_ops import stick_breaking_attention

pytestmark = pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def _fused(family):
    from course_lib.flash_ops import flash_attention

    return flash_attention if family == "flash" else stick_breaking_attention


def _direct(q, k, v, table, causal, mask, family):
    """Softmax or stick-breaking attention with ``b_ij = table[b, h, i - j + seq - 1]``, float64."""
    from course_lib.normalisers import stick_breaking_weights

    seq = q.shape[2]
    index = torch.arange(seq)[:, None] - torch.arange(seq)[None, :] + seq - 1  # [seq, seq]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + table[:, :, index]
    keys = mask[:, None, None, :]
    if family == "flash":
        allowed = keys & torch.ones(seq, seq, dtype=torch.bool).tril() if causal else keys
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        return weights.nan_to_num(0.0) @ v
    weights = stick_breaking_weights(scores, causal=causal, include_self=False, mask=keys)
    return weights @ v + (1.0 - weights.sum(-1, keepdim=True)) * v


@pytest.mark.parametrize("family", ["flash", "stick_breaking"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_diagonal_table_matches_the_formula(family, causal, shared):
    """Any table (random values on every diagonal), several tiles and a ragged end, padded keys:
    output and the gradients of q, k, v and the table, against float64 autograd."""
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    device = kernel_device()
    batch, heads, seq, dim = 2, 3, 83, 16
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(1)).unbind(0)
    table = torch.randn(1 if shared else batch, heads, 2 * seq - 1, generator=gen(2))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, -11:] = False
    leaves = [t.clone().to(device).requires_grad_() for t in (q, k, v, table)]
    out = _fused(family)(
        *leaves[:3], causal=causal, key_padding_mask=mask.to(device),
        score_bias=ScoreBias(DIAGONAL_TABLE, per_diagonal=leaves[3]),
    )  # fmt: skip
    grads = torch.autograd.grad(out, leaves, up.to(device))
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, table)]
    ref = _direct(*ref_leaves, causal, mask, family)
    ref_grads = torch.autograd.grad(ref, ref_leaves, up.double())
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-4, rtol=1e-4)
    for name, g, r in zip(("dq", "dk", "dv", "dtable"), grads, ref_grads, strict=True):
        assert g.shape == r.shape, name
        torch.testing.assert_close(
            g.cpu().double(), r, atol=2e-4, rtol=1e-3, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize("family", ["flash", "stick_breaking"])
def test_diagonal_table_gradient_is_deterministic(family):
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    device = kernel_device()
    q, k, v = torch.randn(3, 1, 2, 70, 16, generator=gen(3)).to(device).unbind(0)
    table = torch.randn(1, 2, 139, generator=gen(4)).to(device)
    runs = []
    for _ in range(2):
        leaf = table.clone().requires_grad_()
        out = _fused(family)(
            q, k, v, causal=False, score_bias=ScoreBias(DIAGONAL_TABLE, per_diagonal=leaf)
        )
        runs.append(torch.autograd.grad(out.sum(), leaf)[0])
    assert torch.equal(*runs)


def test_position_steps():
    assert position_steps(torch.tensor([[5, 7, 9, 11]])).tolist() == [[2]]
    assert position_steps(torch.tensor([[3, 4, 5], [10**9, 10**9 + 1, 10**9 + 2]])).tolist() == [
        [1],
        [1],
    ]
    assert position_steps(torch.tensor([[0, 1, 3]])) is None  # a gap
    assert position_steps(torch.tensor([[4]])).tolist() == [[0]]


@pytest.mark.parametrize("family", ["flash", "stick_breaking"])
@pytest.mark.parametrize("causal", [True, False])
def test_t5_and_alibi_by_distance_equal_the_reference(family, causal):
    """T5's and ALiBi's ``distance_bias`` through the per-distance path (positions stepping by
    3 from 40, different per sequence for ALiBi) against their references, the parameters'
    gradients included (T5's table through torch's indexing, ALiBi's slopes)."""
    from course_lib.encodings.alibi import alibi_distance_bias
    from course_lib.encodings.t5 import t5_distance_bias

    device = kernel_device()
    batch, heads, seq, dim = 2, 3, 45, 16
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(5)).to(device).unbind(0)
    cases = {
        "t5": (t5_distance_bias, torch.arange(seq) * 3 + 40, {
            "bias_table": torch.randn(heads, 32, generator=gen(6)), "bidirectional": not causal,
            "max_distance": 40,
        }),
        "alibi": (alibi_distance_bias, torch.stack((torch.arange(seq), torch.arange(seq) + 9)), {
            "slopes": torch.rand(heads, generator=gen(7)),
        }),
    }  # fmt: skip
    normaliser = None if family == "flash" else "stick_breaking"
    for method, (fn, positions, params) in cases.items():
        positions = positions.to(device)
        tensors = {key: t.to(device) for key, t in params.items() if torch.is_tensor(t)}
        results = []
        for path in ("table", "reference"):
            leaves = {key: t.clone().requires_grad_() for key, t in tensors.items()}
            qkv = [t.clone().requires_grad_() for t in (q, k, v)]
            if path == "table":
                rows = positions if positions.dim() == 2 else positions[None]
                bias = distance_score_bias(fn, rows, {**params, **leaves}, heads)
                out = _fused(family)(*qkv, causal=causal, position_ids=positions, score_bias=bias)
            else:
                out = attention(
                    *qkv, method=method, causal=causal, position_ids=positions,
                    normaliser=normaliser, **{**params, **leaves},
                )  # fmt: skip
            results.append([out, *torch.autograd.grad(out, [*qkv, *leaves.values()], up)])
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)


def test_positions_with_a_gap_are_refused_clearly_or_take_the_specialised_hook():
    """Without a constant step the per-distance table does not exist: an encoding with only a
    distance bias is refused with a clear error; T5 takes its bucket hook instead."""
    from course_lib.encodings.t5 import t5_distance_bias
    from course_lib.layers import PositionalSelfAttention
    from course_lib.registry import Encoding, register, unregister

    class Gapless(PositionalSelfAttention):
        encoding = "distance_only_probe"

    register(
        Encoding(
            name="distance_only_probe", chapter="99_probe", summary="a test", module=Gapless,
            color="#000000", distance_bias=t5_distance_bias,
            params={"bias_table": None, "bidirectional": True, "max_distance": 20},
        )
    )  # fmt: skip
    device = kernel_device()
    q = torch.randn(1, 2, 6, 16, device=device)
    gap = torch.tensor([0, 1, 2, 5, 6, 7], device=device)
    table = torch.randn(2, 32, device=device)
    try:
        with pytest.raises(ValueError, match="step by a constant"):
            attention(
                q, q, q, method="distance_only_probe", position_ids=gap, bias_table=table,
                backend="triton",
            )  # fmt: skip
    finally:
        unregister("distance_only_probe")
    out = attention(q, q, q, method="t5", position_ids=gap, bias_table=table, backend="triton")
    ref = attention(q, q, q, method="t5", position_ids=gap, bias_table=table)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _fold_past(grad, reach: int):
    """A table's gradient with every diagonal from ``reach`` on added into diagonal ``reach``
    (what the parameters of a table constant there receive either way)."""
    seq = (grad.shape[-1] + 1) // 2
    folded = grad.clone()
    folded[..., seq - 1 + reach] = grad[..., seq - 1 + reach :].sum(-1)
    folded[..., seq + reach :] = 0.0
    return folded


@pytest.mark.parametrize(("reach", "seq"), [(0, 203), (60, 203), (5, 256)])
def test_far_tiles_of_a_table_that_stops_changing_take_one_constant(reach, seq):
    """A causal flash launch with ``far_reach``: a table constant from diagonal ``reach`` on,
    padded keys and a ragged end. Output, dq, dk, dv against float64 autograd; the table's
    gradient folded at ``reach``: the kernels give the ``dS`` of every pair that far apart to
    that diagonal and nothing to the later ones (which they do only with the far form)."""
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    device = kernel_device()
    batch, heads, dim = 2, 2, 16
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(11)).unbind(0)
    table = torch.randn(1, heads, 2 * seq - 1, generator=gen(12))
    table[..., seq - 1 + reach :] = table[..., seq - 1 + reach : seq + reach]  # constant past it
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, -13:] = False
    leaves = [t.clone().to(device).requires_grad_() for t in (q, k, v, table)]
    bias = ScoreBias(DIAGONAL_TABLE, per_diagonal=leaves[3], far_reach=reach)
    out = _fused("flash")(*leaves[:3], causal=True, key_padding_mask=mask.to(device),
                          score_bias=bias)  # fmt: skip
    grads = torch.autograd.grad(out, leaves, up.to(device))
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, table)]
    ref = _direct(*ref_leaves, True, mask, "flash")
    ref_grads = torch.autograd.grad(ref, ref_leaves, up.double())
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-4, rtol=1e-4)
    for name, g, r in zip(("dq", "dk", "dv"), grads[:3], ref_grads[:3], strict=True):
        torch.testing.assert_close(
            g.cpu().double(), r, atol=2e-4, rtol=1e-3, msg=lambda m, n=name: f"{n}: {m}"
        )
    dtable = grads[3].cpu().double()
    torch.testing.assert_close(_fold_past(dtable, reach), _fold_past(ref_grads[3], reach),
                               atol=2e-4, rtol=1e-3)  # fmt: skip
    assert ref_grads[3][..., seq + reach :].abs().sum() > 0
    assert dtable[..., seq + reach :].abs().sum() == 0


def test_far_reach_is_checked_and_ignored_where_it_does_not_apply():
    """``far_reach`` needs a hook with a far form and an int >= 0; a bidirectional launch reads
    the whole table (no far tiles there), so a table that does change past the reach is read
    as it is."""
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    from course_lib.flash_ops import flash_attention

    device = kernel_device()
    q, k, v = torch.randn(3, 1, 2, 40, 16, generator=gen(13)).to(device).unbind(0)
    table = torch.randn(1, 2, 79, generator=gen(14)).to(device)
    for bad in (-1, 2.5, True):
        bias = ScoreBias(DIAGONAL_TABLE, per_diagonal=table, far_reach=bad)
        with pytest.raises(ValueError, match="bias_far_reach must be an int >= 0"):
            flash_attention(q, k, v, causal=True, score_bias=bias)
    with pytest.raises(ValueError, match="has no far form"):
        flash_attention(q, k, v, causal=True,
                        score_bias=ScoreBias("linear_distance", per_head=torch.ones(2, device=device),
                                             far_reach=3))  # fmt: skip
    both = [
        flash_attention(q, k, v, causal=False,
                        score_bias=ScoreBias(DIAGONAL_TABLE, per_diagonal=table, far_reach=r))
        for r in (None, 1)
    ]  # fmt: skip
    torch.testing.assert_close(*both, atol=0, rtol=0)


def test_t5_far_past_its_last_bucket_equals_the_reference():
    """T5 through ``attention()`` (causal, long enough for tiles past its last bucket, which
    starts at ``t5_distance_reach``: 113 for 32 buckets and 128), against the reference backend:
    output and the gradients of q, k, v and the bucket table."""
    from course_lib.encodings.t5 import t5_distance_reach

    device = kernel_device()
    batch, heads, seq, dim = 1, 2, 300, 16
    params = {"bias_table": torch.randn(heads, 32, generator=gen(15)), "max_distance": 128,
              "bidirectional": False}  # fmt: skip
    assert t5_distance_reach(params) == 113
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(16)).to(device).unbind(0)
    results = []
    for backend in ("triton", "reference"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, params["bias_table"].to(device))]
        out = attention(*leaves[:3], method="t5", causal=True, backend=backend,
                        bias_table=leaves[3], max_distance=128, bidirectional=False)  # fmt: skip
        results.append([out, *torch.autograd.grad(out, leaves, up)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dkdv", [(16, 64), (16, 32), (32, 32)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_table_gradient_slots_per_square_sub_tile(dkdv, causal):
    """The flash dK/dV kernel writes the table's gradient per square sub-tile of side
    ``block_m``, whatever multiple of it the key block is (4, 2, 1 sub-tiles per tile): sub-tiles
    past the ragged end or above the causal diagonal go to the scratch slot, every other one to
    its own; against float64 autograd, with padded keys. Tiles whose keys are not a multiple of
    their queries are refused, saying why."""
    from course_lib.kernels import flash
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    device = kernel_device()
    batch, heads, seq, dim = 2, 2, 83, 16
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(5)).unbind(0)
    table = torch.randn(batch, heads, 2 * seq - 1, generator=gen(6))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[0, -7:] = False
    x = [t.to(device) for t in (q, k, v, up, table)]
    positions = kernel_positions(torch.arange(seq, device=device)[None])
    options = dict(causal=causal, scale=dim**-0.5, bias_hook=DIAGONAL_TABLE, bias_params=x[4])
    out, lse = flash.flash_attention_forward(*x[:3], positions, mask.to(device), **options)
    grads = flash.flash_attention_backward(
        x[3], *x[:3], out, lse, positions, mask.to(device), bias_grad=True,
        configs={"dkdv": flash.FlashConfig(*dkdv), "dq": flash.FlashConfig(32, 16)}, **options,
    )  # fmt: skip
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, table)]
    ref = _direct(*ref_leaves, causal, mask, "flash")
    ref_grads = torch.autograd.grad(ref, ref_leaves, up.double())
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-4, rtol=1e-4)
    for name, g, r in zip(("dq", "dk", "dv", "dtable"), grads, ref_grads, strict=True):
        torch.testing.assert_close(
            g.cpu().double(), r, atol=2e-4, rtol=1e-3, msg=lambda m, n=name: f"{n}: {m}"
        )
    with pytest.raises(ValueError, match=r"keys \(block_n\) must be a multiple of their queries"):
        flash.flash_attention_backward(
            x[3], *x[:3], out, lse, positions, mask.to(device), bias_grad=True,
            configs={"dkdv": flash.FlashConfig(32, 16)}, **options,
        )  # fmt: skip


if kernels_available():
    import triton
    import triton.language as tl
    from course_lib.kernels.score_bias import diagonal_offset

    @triton.jit
    def _read_both_orientations(params, by_query, by_key, reach, far, seq, PAD: tl.constexpr):
        """``by_query[a, b] = table[i_a - j_b]`` read as a kernel whose rows are queries reads
        it, ``by_key[b, a]`` the same as one whose rows are keys, ``far = table[reach]``."""
        rows = tl.arange(0, PAD)[:, None]
        cols = tl.arange(0, PAD)[None, :]
        i = tl.minimum(tl.arange(0, PAD), seq - 1)
        j = tl.minimum(tl.arange(0, PAD), seq - 1)
        tl.store(
            by_query + rows * PAD + cols, tl.load(params + diagonal_offset(i[:, None], j[None, :]))
        )
        tl.store(
            by_key + rows * PAD + cols, tl.load(params + diagonal_offset(i[None, :], j[:, None]))
        )
        tl.store(far, tl.load(params + diagonal_offset(reach, 0)))

    @triton.jit
    def _offsets_past_the_end(by_query, by_key, seq, ROWS: tl.constexpr, COLS: tl.constexpr):
        """The offsets of queries ``< seq`` against keys ``0 .. COLS - 1``, unclamped (as the
        stick-breaking kernels hand them to a hook), in both orientations."""
        i = tl.minimum(tl.arange(0, ROWS), seq - 1)
        j = tl.arange(0, COLS)
        out = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
        tl.store(by_query + out, diagonal_offset(i[:, None], j[None, :]))
        tl.store(by_key + out, tl.trans(diagonal_offset(i[None, :], j[:, None])))


@pytest.mark.parametrize("seq", [1, 2, 3, 4, 5, 7, 8, 13, 33])
def test_the_tables_kernel_layout_gives_every_diagonal_in_both_orientations(seq):
    """The per-diagonal table goes to the kernels laid out for 16-byte reads
    (``diagonal_layout``); ``diagonal_offset`` finds ``table[i - j]`` in it for every pair,
    whether a tile's rows are queries (forward, dQ, stick-breaking) or keys (flash's dK/dV),
    and for a scalar distance (the far constant). Values are distinct, so any wrong slot
    shows; the last index is clamped, as the kernels clamp a tile's padding."""
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    device = kernel_device()
    table = torch.arange(2 * seq - 1, dtype=torch.float32, device=device).view(1, 1, -1) + 100.0
    pad = max(16, triton.next_power_of_2(seq))
    by_query = torch.empty(pad, pad, device=device)
    by_key = torch.empty(pad, pad, device=device)
    for reach in range(seq):
        far = torch.empty(1, device=device)
        _read_both_orientations[(1,)](DIAGONAL_TABLE.pointer(table), by_query, by_key, reach,
                                      far, seq, PAD=pad)  # fmt: skip
        assert far.item() == table[0, 0, reach + seq - 1].item(), reach
    idx = torch.arange(pad, device=device).clamp(max=seq - 1)
    want = table[0, 0, idx[:, None] - idx[None, :] + seq - 1]  # [query, key]
    assert torch.equal(by_query, want)
    assert torch.equal(by_key, want.T)
    batched = torch.zeros(2, 3, 2 * seq - 1, device=device)  # 16-byte aligned rows
    stride_b, stride_h = DIAGONAL_TABLE.strides(batched)
    assert stride_h % 32 == 0 and stride_b == 3 * stride_h
    assert DIAGONAL_TABLE.strides(batched[:1]) == (0, stride_h)
    assert DIAGONAL_TABLE.pointer(batched).storage_offset() % 4 == 0


@pytest.mark.parametrize("seq", [1, 5, 64, 100])
def test_keys_a_block_past_the_end_stay_inside_the_tables_layout(seq):
    """A key block may reach ``DIAGONAL_KEY_PAD`` tokens past the last key (stick-breaking's
    kernels pass key indices unclamped, and a forced block is at most that): every offset stays
    inside the laid-out table, and a larger block is refused."""
    from course_lib.kernels.score_bias import DIAGONAL_KEY_PAD, DIAGONAL_TABLE

    from course_lib import runtime

    device = kernel_device()
    laid = DIAGONAL_TABLE.pointer(torch.zeros(1, 1, 2 * seq - 1, device=device))
    last_key = seq - 1 + DIAGONAL_KEY_PAD
    rows, cols = 16, triton.next_power_of_2(last_key + 1)
    by_query = torch.empty(rows, cols, dtype=torch.int32, device=device)
    by_key = torch.empty(rows, cols, dtype=torch.int32, device=device)
    _offsets_past_the_end[(1,)](by_query, by_key, seq, ROWS=rows, COLS=cols)
    for offsets in (by_query[:, : last_key + 1], by_key[:, : last_key + 1]):
        assert offsets.min().item() >= -laid.storage_offset()
        assert offsets.max().item() < laid.numel()
    with pytest.raises(ValueError, match=f"power of two from 16 to {DIAGONAL_KEY_PAD}"):
        runtime.load_kernel_module("stick_breaking").pick_config(
            16, device, block=2 * DIAGONAL_KEY_PAD
        )
