"""The fused flash-attention kernels against a direct float64 formula, forward and backward.

The kernels take their position machinery from the caller: per-token q/k tables
(``QKTables``) and a named score-bias hook (``ScoreBias``). The tests build both with plain torch
(RoPE angles, ExpoSB's amplitude and band gain) and compare ``course_lib.flash_ops.flash_attention``
with the formula written out below: outputs and the gradients of q, k, v and ``per_head``.

Without a GPU the kernels run in Triton's CPU interpreter: fp32 (and one fp16 case), head_dim
16 and 32, small ragged shapes. On a CUDA machine the same cases also run compiled in
fp32/fp16/bf16 with head_dim 64 and 128.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch

from course_lib.flash_ops import flash_attention
from course_lib.kernel_hooks import QKTables, ScoreBias, kernel_positions, resolve_hook
from course_lib.runtime import KERNEL_MODE, kernel_device

pytestmark = pytest.mark.skipif(
    KERNEL_MODE == "unavailable", reason="Triton is not installed (no wheels on this platform)"
)

DEVICE = kernel_device()
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seq: int
    head_dim: int
    tables: str | None  # None | "rope" | "exposb" (RoPE with amplitude folded in, band gain)
    bias: str | None  # None | "linear_distance" | "exposb_distance"
    causal: bool
    padding: str | None = None  # None | "mixed" (real / end-padded / start-padded) | "start"
    layout: str = "interleaved"
    positions: str = "default"  # "default" | "shared" ([seq]) | "batch" ([batch, seq])
    table_batch: str = "shared"  # "shared": cos/sin [1, seq, D/2]; "full": [batch, seq, D/2]
    gain: bool = False  # a gain on top of plain RoPE tables ("exposb" always has one)
    scale: float | None = None
    base: float = 10000.0
    noncontiguous: bool = False

    def __str__(self) -> str:
        parts = [f"{self.batch}x{self.heads}x{self.seq}x{self.head_dim}"]
        parts.append(self.tables or "notab")
        if self.tables:
            parts += [self.layout, f"tab-{self.table_batch}"] + (["gain"] if self.gain else [])
        parts.append(self.bias or "nobias")
        parts.append("causal" if self.causal else "bidir")
        parts += [p for p in (self.padding,) if p]
        if self.positions != "default":
            parts.append(f"pos-{self.positions}")
        if self.noncontiguous:
            parts.append("strided")
        return "-".join(parts)


CASES = [
    Case(2, 5, 1, 16, None, None, False),
    Case(3, 3, 17, 32, None, None, True, "mixed"),
    Case(2, 5, 100, 16, None, None, False, "start", noncontiguous=True),
    Case(3, 3, 130, 32, None, None, True, scale=0.3),
    Case(3, 3, 17, 16, "rope", None, False),
    Case(2, 5, 100, 32, "rope", None, True, "start", "half", noncontiguous=True),
    Case(3, 3, 130, 16, "rope", None, False, "mixed", positions="batch", table_batch="full"),
    Case(3, 2, 100, 16, "rope", None, True, None, "half", positions="shared", base=500.0),
    Case(2, 3, 1, 32, "rope", None, True, "start"),
    Case(3, 2, 40, 16, "rope", None, False, gain=True, positions="batch", table_batch="full"),
    Case(3, 3, 17, 32, "exposb", "exposb_distance", True, "mixed"),
    Case(2, 5, 130, 16, "exposb", "exposb_distance", False, "start", "half"),
    Case(
        3,
        3,
        100,
        32,
        "exposb",
        "exposb_distance",
        False,
        None,
        positions="batch",
        table_batch="full",
        noncontiguous=True,
    ),  # fmt: skip
    Case(3, 2, 130, 16, "exposb", "exposb_distance", True, "mixed", "half", positions="shared"),
    Case(2, 3, 1, 16, "exposb", "exposb_distance", False),
    Case(2, 3, 70, 16, None, "linear_distance", True, "mixed", positions="batch"),
    Case(3, 2, 100, 32, "rope", "linear_distance", False, "start", "half", noncontiguous=True),
    Case(2, 2, 40, 16, None, "exposb_distance", True, positions="shared"),
]

# On a GPU: the same shapes with the head dims the course's models use.
GPU_HEAD_DIM = {16: 64, 32: 128}
GPU_CASES = [replace(c, head_dim=GPU_HEAD_DIM[c.head_dim]) for c in CASES] + [
    Case(2, 3, 1000, 64, "rope", None, True, "mixed"),
    Case(2, 3, 777, 128, "exposb", "exposb_distance", False, "start", "half", positions="batch"),
    Case(2, 4, 600, 64, "rope", "linear_distance", True, "mixed", noncontiguous=True),
]


# --------------------------------------------------------------------------------------------
# Inputs, tables and the reference
# --------------------------------------------------------------------------------------------


def padding_mask(batch: int, seq: int, padding: str | None) -> torch.Tensor | None:
    """Row 0 real; "mixed": row 1 padded at the end, row 2 at the start; "start": row 1."""
    if padding is None:
        return None
    mask = torch.ones(batch, seq, dtype=torch.bool)
    n_pad = max(1, seq // 3)
    if padding == "mixed":
        mask[1, seq - n_pad :] = False
        if batch > 2:
            mask[2, :n_pad] = False
    else:
        mask[1, :n_pad] = False
    return mask


def position_ids_for(case: Case) -> torch.Tensor | None:
    if case.positions == "default":
        return None
    if case.positions == "shared":
        return torch.arange(case.seq) * 3 + 11
    offsets = torch.tensor([0, 7, 300, 41, 5][: case.batch])
    return torch.arange(case.seq)[None, :] + offsets[:, None]


def positions_2d(case: Case, pos: torch.Tensor | None) -> torch.Tensor:
    """Integer ``[batch, seq]`` positions on the CPU (the default is ``arange(seq)``)."""
    p = torch.arange(case.seq) if pos is None else pos.cpu()
    return p.expand(case.batch, case.seq)


def build_tables(case: Case, positions: torch.Tensor) -> QKTables | None:
    """The caller's tables, in plain torch: RoPE angles ``p * base**(-2t/D)`` in float32; for
    "exposb" cos/sin carry the amplitude ``1 + 0.2 exp(-0.001 p)`` and ``gain`` is the band-pass
    ``0.8 + 0.4 exp(-(d - D/4)^2 / (2 (D/8)^2))``. ``table_batch="shared"`` keeps a leading 1."""
    if case.tables is None:
        return None
    dim = case.head_dim
    pos = positions[:1] if case.table_batch == "shared" else positions
    inv_freq = (case.base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float()
    angle = pos.float()[..., None] * inv_freq
    cos, sin = torch.cos(angle), torch.sin(angle)
    d = torch.arange(dim, dtype=torch.float64)
    gain = None
    if case.tables == "exposb":
        amplitude = (1.0 + 0.2 * torch.exp(-0.001 * pos.float()))[..., None]
        cos, sin = cos * amplitude, sin * amplitude
        gain = 0.8 + 0.4 * torch.exp(-((d - dim / 4) ** 2) / (2 * (dim / 8) ** 2))
    elif case.gain:
        gain = 0.5 + torch.rand(dim, generator=torch.Generator().manual_seed(9), dtype=d.dtype)
    to = dict(device=DEVICE, dtype=torch.float32)
    gain = None if gain is None else gain.to(**to)
    return QKTables(cos.to(**to), sin.to(**to), gain, case.layout)


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.heads, case.seq, case.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=gen) for _ in range(4))
    q = q * 1.5  # somewhat peaked softmax rows
    per_head = 0.05 + 0.2 * torch.rand(case.heads, generator=gen)
    if case.noncontiguous:  # stored as [batch, seq, heads, head_dim], viewed as [b, h, s, d]
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    mask = padding_mask(case.batch, case.seq, case.padding)
    pos = position_ids_for(case)
    to = dict(device=device, dtype=dtype)
    q, k, v, grad = (x.to(**to) for x in (q, k, v, grad))
    mask = None if mask is None else mask.to(device)
    pos = None if pos is None else pos.to(device)
    per_head = per_head.to(device) if case.bias == "linear_distance" else None
    return q, k, v, grad, mask, pos, per_head


def apply_tables(x: torch.Tensor, tables: QKTables | None) -> torch.Tensor:
    """``x'[c1] = g[c1] (x1 cos - x2 sin)``, ``x'[c2] = g[c2] (x1 sin + x2 cos)`` (float64)."""
    if tables is None:
        return x
    dim = x.shape[-1]
    cos = tables.cos.cpu().double()[:, None]  # [1 or b, 1, s, d/2]
    sin = tables.sin.cpu().double()[:, None]
    t = torch.arange(dim // 2)
    first, second = (2 * t, 2 * t + 1) if tables.layout == "interleaved" else (t, t + dim // 2)
    x1, x2 = x[..., first], x[..., second]
    out = torch.zeros_like(x)
    out = out.index_copy(-1, first, x1 * cos - x2 * sin).index_copy(-1, second, x1 * sin + x2 * cos)
    if tables.gain is not None:
        out = out * tables.gain.cpu().double()
    return out


def score_bias_matrix(case: Case, positions: torch.Tensor, per_head) -> torch.Tensor | float:
    """``b_ij`` ``[batch, heads or 1, seq, seq]`` from its formula (float64)."""
    p = positions.double()
    distance = (p[:, :, None] - p[:, None, :]).abs()[:, None]
    if case.bias == "linear_distance":
        return -per_head[None, :, None, None] * distance
    if case.bias == "exposb_distance":
        return torch.log(0.7 + 0.3 * torch.exp(-0.005 * distance))
    return 0.0


def direct_attention(q, k, v, per_head, case: Case, mask, pos, tables) -> torch.Tensor:
    """softmax(scale * q' . k' + b) v from its formula, in float64 on the CPU."""
    dim = q.shape[-1]
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(dim)
    positions = positions_2d(case, pos)
    q, k = (apply_tables(x.cpu().double(), tables) for x in (q, k))
    v = v.cpu().double()
    logits = scale * q @ k.transpose(-1, -2)
    logits = logits + score_bias_matrix(case, positions, per_head)
    allowed = torch.ones(case.batch, 1, case.seq, case.seq, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask.cpu()[:, None, None, :]
    if case.causal:
        allowed = allowed & torch.ones(case.seq, case.seq, dtype=torch.bool).tril()
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return weights @ v


def kernel_attention(q, k, v, per_head, case: Case, mask, pos, tables) -> torch.Tensor:
    bias = None if case.bias is None else ScoreBias(case.bias, per_head)
    return flash_attention(
        q, k, v,
        causal=case.causal,
        key_padding_mask=mask,
        position_ids=pos,
        scale=case.scale,
        qk_tables=tables,
        score_bias=bias,
    )  # fmt: skip


def output_and_grads(fn, q, k, v, per_head, grad, case, mask, pos, tables, dtype=None):
    """Run ``fn`` (inputs cast to ``dtype`` if given); return (out, dq, dk, dv[, dper_head]),
    float64 on the CPU."""
    leaves = [(x if dtype is None else x.to(dtype)).detach().requires_grad_() for x in (q, k, v)]
    if per_head is not None:
        leaves.append(per_head.detach().to(dtype or per_head.dtype).requires_grad_())
    out = fn(*leaves[:3], leaves[3] if per_head is not None else None, case, mask, pos, tables)
    out.backward(grad.to(out.dtype).to(out.device))
    return [t.detach().double().cpu() for t in (out, *(x.grad for x in leaves))]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``, the denominator floored at 1.

    (Inputs are O(1), so a gradient that is 0 in exact arithmetic, e.g. dk at seq 1, is held to
    the same absolute error as an O(1) one.)
    """
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1.0)).item()


def check_case(case: Case, dtype: torch.dtype) -> None:
    q, k, v, grad, mask, pos, per_head = make_inputs(case, dtype, DEVICE)
    tables = build_tables(case, positions_2d(case, pos))
    args = (q, k, v, per_head, grad, case, mask, pos, tables)
    got = output_and_grads(kernel_attention, *args)
    assert got[0].shape == q.shape
    for tensor in got:
        assert torch.isfinite(tensor).all()
    direct = output_and_grads(direct_attention, *args, dtype=torch.float64)
    names = ("out", "dq", "dk", "dv", "dper_head")
    assert len(got) == len(direct) == (5 if per_head is not None else 4)
    for name, a, d in zip(names, got, direct, strict=False):
        assert relative_error(a, d) < TOLERANCE[dtype], f"{name}: {relative_error(a, d)}"


# --------------------------------------------------------------------------------------------
# Kernel vs formula
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_formula_fp32(case: Case) -> None:
    check_case(case, torch.float32)


def test_kernel_matches_formula_fp16_small() -> None:
    check_case(Case(2, 3, 40, 32, "rope", "linear_distance", True, "mixed"), torch.float16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_kernel_matches_formula_cuda(case: Case, dtype: torch.dtype) -> None:
    check_case(case, dtype)


def test_unequal_block_sizes_match_formula() -> None:
    """Causal bounds with query blocks narrower and wider than key blocks, in every kernel,
    and the per-head gradient's partial sums over several key blocks."""
    kernels = pytest.importorskip("course_lib.kernels.flash")
    case = Case(2, 3, 70, 16, "rope", "linear_distance", True, "mixed", "half", scale=0.25)
    q, k, v, grad, mask, pos, per_head = make_inputs(case, torch.float32, DEVICE, seed=3)
    positions = positions_2d(case, pos)
    tables = build_tables(case, positions)
    options = dict(
        causal=True, scale=0.25, qk_tables=tables, bias_hook=resolve_hook(case.bias),
        bias_params=per_head,
    )  # fmt: skip
    config = kernels.FlashConfig
    fpos = kernel_positions(positions.to(DEVICE))
    out, lse = kernels.flash_attention_forward(
        q, k, v, fpos, mask, config=config(16, 32), **options
    )
    dq, dk, dv, dlam = kernels.flash_attention_backward(
        grad, q, k, v, out, lse, fpos, mask, bias_grad=True,
        configs={"dkdv": config(64, 16), "dq": config(16, 64)}, **options,
    )  # fmt: skip
    ref = output_and_grads(
        direct_attention, q, k, v, per_head, grad, case, mask, pos, tables, torch.float64
    )
    for name, a, r in zip(
        ("out", "dq", "dk", "dv", "dlam"), (out, dq, dk, dv, dlam), ref, strict=True
    ):
        assert relative_error(a.double().cpu(), r) < 1e-4, name


def test_per_head_gradient_matches_autograd_of_explicit_scores() -> None:
    """``linear_distance``: ``b_ij = -m_h |p_i - p_j|``; the gradient of ``m`` against torch
    autograd through explicit scores (fp32 inputs, float64 reference)."""
    batch, heads, seq, dim = 2, 3, 45, 16
    gen = torch.Generator().manual_seed(11)
    q, k, v, g = (torch.randn(batch, heads, seq, dim, generator=gen).to(DEVICE) for _ in range(4))
    slopes = torch.tensor([0.02, 0.3, 1.0], device=DEVICE, requires_grad=True)
    pos = torch.stack((torch.arange(seq) * 2, torch.arange(seq) + 5)).to(DEVICE)
    out = flash_attention(
        q, k, v, position_ids=pos, score_bias=ScoreBias("linear_distance", slopes)
    )
    (d_slopes,) = torch.autograd.grad(out, slopes, g)
    m = slopes.detach().double().requires_grad_()
    p = pos.double().cpu()
    scores = q.double().cpu() @ k.double().cpu().transpose(-1, -2) / math.sqrt(dim)
    scores = scores - m[:, None, None] * (p[:, None, :, None] - p[:, None, None, :]).abs()
    ref = torch.softmax(scores, -1) @ v.double().cpu()
    (ref_grad,) = torch.autograd.grad(ref, m, g.double().cpu())
    assert d_slopes.shape == slopes.shape and d_slopes.dtype == slopes.dtype
    assert relative_error(d_slopes.double().cpu(), ref_grad) < 1e-4


@pytest.mark.parametrize("bias", [None, "exposb_distance"])
def test_fully_padded_row_gives_zeros_and_finite_grads(bias) -> None:
    case = Case(2, 2, 20, 16, "rope" if bias else None, bias, causal=bias is None)
    q, k, v, grad, _, _, _ = make_inputs(case, torch.float32, DEVICE, seed=1)
    tables = build_tables(case, positions_2d(case, None))
    mask = torch.ones(2, 20, dtype=torch.bool, device=DEVICE)
    mask[1] = False  # every key of batch row 1 is padding
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = kernel_attention(*leaves, None, case, mask, None, tables)
    out.backward(grad)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert out[0].abs().sum() > 0
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all()
        assert torch.equal(leaf.grad[1], torch.zeros_like(leaf.grad[1]))


def test_backward_is_deterministic() -> None:
    case = Case(2, 2, 70, 16, "exposb", "linear_distance", True, "start", noncontiguous=True)
    q, k, v, grad, mask, pos, per_head = make_inputs(case, torch.float32, DEVICE, seed=2)
    tables = build_tables(case, positions_2d(case, pos))
    args = (q, k, v, per_head, grad, case, mask, pos, tables)
    first = output_and_grads(kernel_attention, *args)
    second = output_and_grads(kernel_attention, *args)
    assert len(first) == 5
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_position_ids_forms_agree() -> None:
    """``[seq]``, ``[1, seq]`` and ``[batch, seq]`` position ids give the same output."""
    case = Case(2, 2, 20, 16, None, "exposb_distance", False)
    q, k, v, _, _, _, _ = make_inputs(case, torch.float32, DEVICE, seed=4)
    pos = (torch.arange(20, device=DEVICE) * 2 + 5).to(torch.int32)
    outs = [
        kernel_attention(q, k, v, None, case, None, p, None)
        for p in (pos, pos[None], pos[None].expand(2, -1), pos.long())
    ]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    shifted = kernel_attention(q, k, v, None, case, None, pos * 3, None)
    assert not torch.allclose(shifted, outs[0])  # positions really reach the kernel


def test_shared_tables_equal_full_batch_tables() -> None:
    """cos/sin ``[1, seq, D/2]`` (read with batch stride 0) == the same rows repeated per batch."""
    case = Case(3, 2, 40, 16, "exposb", None, True, layout="half")
    q, k, v, grad, _, _, _ = make_inputs(case, torch.float32, DEVICE, seed=5)
    shared = build_tables(case, positions_2d(case, None))
    assert shared.cos.shape[0] == 1
    full = replace(case, table_batch="full")
    full_tables = build_tables(full, positions_2d(full, None))
    assert full_tables.cos.shape[0] == 3
    a = output_and_grads(kernel_attention, q, k, v, None, grad, case, None, None, shared)
    b = output_and_grads(kernel_attention, q, k, v, None, grad, case, None, None, full_tables)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_gain_none_is_gain_of_ones_and_a_gain_matters() -> None:
    case = Case(2, 2, 30, 32, "rope", None, False, layout="interleaved")
    q, k, v, grad, _, _, _ = make_inputs(case, torch.float32, DEVICE, seed=6)
    tables = build_tables(case, positions_2d(case, None))
    ones = replace(tables, gain=torch.ones(32, device=DEVICE))
    other = replace(tables, gain=torch.linspace(0.5, 1.5, 32, device=DEVICE))
    plain = output_and_grads(kernel_attention, q, k, v, None, grad, case, None, None, tables)
    with_ones = output_and_grads(kernel_attention, q, k, v, None, grad, case, None, None, ones)
    for x, y in zip(plain, with_ones, strict=True):
        assert torch.equal(x, y)
    with_gain = output_and_grads(kernel_attention, q, k, v, None, grad, case, None, None, other)
    assert not torch.allclose(with_gain[0], plain[0])


def test_strided_views_equal_contiguous_copies() -> None:
    """q, k, v as ``x.view(b, n, h, d).transpose(1, 2)`` (read in place) and an expanded
    (stride 0) incoming gradient give exactly what contiguous copies give."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 40, 3 * 2 * 16, generator=gen).to(DEVICE)
    q, k, v = (t.view(2, 40, 2, 16).transpose(1, 2) for t in x.split(32, dim=-1))
    assert not q.is_contiguous()
    bias = ScoreBias("linear_distance", torch.tensor([0.1, 0.4], device=DEVICE))
    results = []
    for inputs in ((q, k, v), (q.contiguous(), k.contiguous(), v.contiguous())):
        leaves = [t.detach().requires_grad_() for t in inputs]
        out = flash_attention(*leaves, causal=True, score_bias=bias)
        results.append([out, *torch.autograd.grad(out.sum(), leaves)])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_gradients_only_where_asked() -> None:
    case = Case(1, 2, 20, 16, None, "linear_distance", True)
    q, k, v, grad, _, _, per_head = make_inputs(case, torch.float32, DEVICE, seed=9)
    q.requires_grad_()
    out = flash_attention(q, k, v, causal=True, score_bias=ScoreBias(case.bias, per_head))
    (dq,) = torch.autograd.grad(out, (q,), grad)
    assert torch.isfinite(dq).all() and dq.abs().max() > 0
    assert per_head.grad is None


# --------------------------------------------------------------------------------------------
# Bad input gets a clear error
# --------------------------------------------------------------------------------------------


def _qkv(shape=(2, 3, 8, 16), dtype=torch.float32):
    return [torch.randn(shape, device=DEVICE, dtype=dtype) for _ in range(3)]


def _tables(cos_shape=(1, 8, 8), gain_shape=None, layout="interleaved", dtype=torch.float32):
    cos = torch.ones(cos_shape, device=DEVICE, dtype=dtype)
    gain = None if gain_shape is None else torch.ones(gain_shape, device=DEVICE)
    return QKTables(cos, cos.clone(), gain, layout)


BAD_CALLS = {
    "head_dim_24": (lambda q, k, v: flash_attention(*_qkv((2, 3, 8, 24))), ValueError, "head_dim"),
    "head_dim_256": (
        lambda q, k, v: flash_attention(*_qkv((2, 3, 8, 256))),
        ValueError,
        "head_dim",
    ),
    "heads_mismatch": (lambda q, k, v: flash_attention(q, k[:, :2], v), ValueError, "same shape"),
    "seq_q_ne_seq_k": (
        lambda q, k, v: flash_attention(q, k[:, :, :5], v[:, :, :5]),
        ValueError,
        "seq_q",
    ),
    "dtype_mismatch": (lambda q, k, v: flash_attention(q, k.double(), v), TypeError, "dtype"),
    "integer_dtype": (
        lambda q, k, v: flash_attention(q.long(), k.long(), v.long()),
        TypeError,
        "dtype",
    ),
    "three_dims": (lambda q, k, v: flash_attention(q[0], k[0], v[0]), ValueError, "4-D"),
    "float_mask": (
        lambda q, k, v: flash_attention(q, k, v, key_padding_mask=torch.ones(2, 8, device=DEVICE)),
        TypeError,
        "bool",
    ),
    "mask_shape": (
        lambda q, k, v: flash_attention(
            q, k, v, key_padding_mask=torch.ones(2, 7, dtype=torch.bool, device=DEVICE)
        ),
        ValueError,
        "key_padding_mask",
    ),
    "float_positions": (
        lambda q, k, v: flash_attention(q, k, v, position_ids=torch.arange(8.0, device=DEVICE)),
        TypeError,
        "integer",
    ),
    "positions_shape": (
        lambda q, k, v: flash_attention(q, k, v, position_ids=torch.arange(9, device=DEVICE)),
        ValueError,
        "position_ids",
    ),
    "nan_scale": (
        lambda q, k, v: flash_attention(q, k, v, scale=float("nan")),
        ValueError,
        "scale",
    ),
    "non_bool_causal": (lambda q, k, v: flash_attention(q, k, v, causal=1), TypeError, "causal"),
    "tables_not_qktables": (
        lambda q, k, v: flash_attention(q, k, v, qk_tables=(torch.ones(1), torch.ones(1))),
        TypeError,
        "QKTables",
    ),
    "tables_wrong_pairs": (
        lambda q, k, v: flash_attention(q, k, v, qk_tables=_tables((1, 8, 16))),
        ValueError,
        r"qk_tables.cos must be float32 \[1 or 2, 8, 8\]",
    ),
    "tables_wrong_batch": (
        lambda q, k, v: flash_attention(q, k, v, qk_tables=_tables((3, 8, 8))),
        ValueError,
        "qk_tables.cos",
    ),
    "tables_fp16": (
        lambda q, k, v: flash_attention(q, k, v, qk_tables=_tables(dtype=torch.float16)),
        TypeError,
        "qk_tables.cos",
    ),
    "tables_layout": (
        lambda q, k, v: flash_attention(q, k, v, qk_tables=_tables(layout="neox")),
        ValueError,
        "layout",
    ),
    "gain_shape": (
        lambda q, k, v: flash_attention(q, k, v, qk_tables=_tables(gain_shape=(8,))),
        ValueError,
        "gain",
    ),
    "bias_not_scorebias": (
        lambda q, k, v: flash_attention(q, k, v, score_bias="linear_distance"),
        TypeError,
        "ScoreBias",
    ),
    "unknown_hook": (
        lambda q, k, v: flash_attention(q, k, v, score_bias=ScoreBias("alibi_slopes")),
        ValueError,
        "linear_distance",
    ),
    "missing_per_head": (
        lambda q, k, v: flash_attention(q, k, v, score_bias=ScoreBias("linear_distance")),
        ValueError,
        "per_head",
    ),
    "per_head_shape": (
        lambda q, k, v: flash_attention(
            q, k, v, score_bias=ScoreBias("linear_distance", torch.ones(2, device=DEVICE))
        ),
        ValueError,
        r"\[heads\]",
    ),
    "per_head_for_exposb": (
        lambda q, k, v: flash_attention(
            q, k, v, score_bias=ScoreBias("exposb_distance", torch.ones(3, device=DEVICE))
        ),
        ValueError,
        "takes no per_head",
    ),
}


@pytest.mark.parametrize(("make_call", "error", "message"), BAD_CALLS.values(), ids=BAD_CALLS)
def test_bad_input_raises_clear_error(make_call, error, message) -> None:
    q, k, v = _qkv()
    with pytest.raises(error, match=message):
        make_call(q, k, v)


def _hooks_with_factor():
    from course_lib.kernel_hooks import registered_hooks

    return [name for name, hook in registered_hooks().items() if hook.factor is not None]


@pytest.mark.parametrize("name", _hooks_with_factor())
def test_factor_form_is_exp_of_the_bias(name) -> None:
    """A hook's factor form (which the flash kernels use in its place) is ``e^b`` of its bias, on
    positions near and far (distances 0 to 10^4), in (0, 1]."""
    import triton
    import triton.language as tl

    hook = resolve_hook(name)

    @triton.jit
    def both_forms(POS, PARAMS, BIAS_OUT, FACTOR_OUT, BIAS_FN: tl.constexpr,
                   FACTOR_FN: tl.constexpr, N: tl.constexpr):  # fmt: skip
        i = tl.arange(0, N)
        pos = tl.load(POS + i)
        rows, cols = i[:, None], i[None, :]
        out = rows * N + cols
        bias = BIAS_FN(rows, cols, pos[:, None], pos[None, :], PARAMS, False, None)
        tl.store(BIAS_OUT + out, bias)
        tl.store(FACTOR_OUT + out, FACTOR_FN(rows, cols, pos[:, None], pos[None, :], PARAMS, None))

    n = 32
    torch.manual_seed(0)
    positions = torch.cat([torch.arange(16), torch.randint(0, 10**4, (16,))]).float().to(DEVICE)
    params = (torch.rand(n) * 0.1).to(DEVICE)
    bias = torch.empty(n, n, device=DEVICE)
    factor = torch.empty(n, n, device=DEVICE)
    both_forms[(1,)](positions, params, bias, factor, hook.bias, hook.factor, n)
    assert float(factor.min()) > 0 and float(factor.max()) <= 1
    torch.testing.assert_close(factor, bias.exp(), rtol=1e-6, atol=0)


def _hooks_with_split():
    from course_lib.kernel_hooks import registered_hooks

    return [name for name, hook in registered_hooks().items() if hook.split is not None]


@pytest.mark.parametrize("name", _hooks_with_split())
def test_split_form_adds_up_to_the_bias(name) -> None:
    """A hook's split form (which the flash kernels use below a causal diagonal) adds up to its
    bias times ``log2 e`` for every pair with ``j <= ref <= i``: nondecreasing positions near
    and far, a nonincreasing per-token tensor (FoX's cumulative log gates)."""
    import triton
    import triton.language as tl

    hook = resolve_hook(name)
    assert hook.factor is None

    @triton.jit
    def both_forms(POS, PARAMS, BIAS_OUT, SPLIT_OUT, REF: tl.constexpr, BIAS_FN: tl.constexpr,
                   SPLIT_FN: tl.constexpr, N: tl.constexpr):  # fmt: skip
        i = tl.arange(0, N)
        pos = tl.load(POS + i)
        rows, cols = i[:, None], i[None, :]
        out = rows * N + cols
        bias = BIAS_FN(rows, cols, pos[:, None], pos[None, :], PARAMS, True, None)
        tl.store(BIAS_OUT + out, bias)
        ref_pos = tl.load(POS + REF)
        u = SPLIT_FN(i, pos, REF, ref_pos, PARAMS, True, None)
        w = SPLIT_FN(i, pos, REF, ref_pos, PARAMS, False, None)
        tl.store(SPLIT_OUT + out, u[:, None] + w[None, :])

    n, ref = 32, 13
    torch.manual_seed(0)
    steps = torch.cat([torch.ones(16), torch.randint(0, 700, (15,)).float()])
    positions = torch.cat([torch.zeros(1), steps.cumsum(0)]).to(DEVICE)
    if hook.param == "per_token":
        params = (-torch.rand(n) * 3).cumsum(0).to(DEVICE)
    else:
        params = (torch.rand(1) * 0.5 + 0.01).to(DEVICE)
    bias = torch.empty(n, n, device=DEVICE)
    split = torch.empty(n, n, device=DEVICE)
    both_forms[(1,)](positions, params, bias, split, ref, hook.bias, hook.split, n)
    i = torch.arange(n, device=DEVICE)
    pairs = (i[None, :] <= ref) & (i[:, None] >= ref)  # key j <= ref <= query i
    torch.testing.assert_close(split[pairs], bias[pairs], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", _hooks_with_split())
def test_split_form_takes_one_token_as_scalars(name) -> None:
    """The dK/dV kernel moves a split's key part from one reference to another with one call on
    a single token (scalars): it must give that token's entry of the vector call."""
    import triton
    import triton.language as tl

    hook = resolve_hook(name)

    @triton.jit
    def one_and_all(POS, PARAMS, ONE_OUT, ALL_OUT, TOKEN: tl.constexpr, REF: tl.constexpr,
                    SPLIT_FN: tl.constexpr, N: tl.constexpr):  # fmt: skip
        i = tl.arange(0, N)
        ref_pos = tl.load(POS + REF)
        tl.store(ALL_OUT + i, SPLIT_FN(i, tl.load(POS + i), REF, ref_pos, PARAMS, False, None))
        one = SPLIT_FN(TOKEN, tl.load(POS + TOKEN), REF, ref_pos, PARAMS, False, None)
        tl.store(ONE_OUT, one)

    n, token, ref = 16, 5, 11
    torch.manual_seed(1)
    positions = torch.cat([torch.zeros(1), torch.randint(1, 9, (n - 1,)).float().cumsum(0)])
    if hook.param == "per_token":
        params = (-torch.rand(n) * 3).cumsum(0)
    else:
        params = torch.rand(1) * 0.5 + 0.01
    one = torch.empty(1, device=DEVICE)
    every = torch.empty(n, device=DEVICE)
    one_and_all[(1,)](positions.to(DEVICE), params.to(DEVICE), one, every, token, ref,
                      hook.split, n)  # fmt: skip
    assert one.item() == pytest.approx(every[token].item(), rel=1e-6, abs=1e-6)
    assert one.item() != 0.0  # a token away from the reference has a part of its own


@pytest.mark.parametrize("order", ["arange", "steps", "shuffled"])
def test_linear_distance_split_follows_the_order_of_the_positions(order) -> None:
    """ALiBi's ``|p_i - p_j|`` splits into a query and a key part only where keys come at or
    before their queries: the causal kernels take the split form for nondecreasing positions
    and the per-pair bias otherwise; both give the reference (output and gradients)."""
    from course_lib.kernels import flash as flash_kernels

    from course_lib.attention import attention

    torch.manual_seed(0)
    n = 150  # long enough for tiles below the diagonal in each kernel's blocks
    qkv = [torch.randn(1, 2, n, 16, device=DEVICE, requires_grad=True) for _ in range(3)]
    positions = {
        "arange": None,
        "steps": torch.arange(n)[None] * 3 + 5,
        "shuffled": torch.randperm(n)[None],
    }[order]
    chosen = []
    original = flash_kernels._bias_split

    def spy(*args):
        split = original(*args)
        chosen.append(split is not None)
        return split

    got = {}
    flash_kernels._bias_split = spy
    try:
        for backend in ("reference", "triton"):
            ids = None if positions is None else positions.to(DEVICE)
            out = attention(*qkv, method="alibi", causal=True, position_ids=ids, backend=backend)
            got[backend] = (out, *torch.autograd.grad(out.square().sum(), qkv))
    finally:
        flash_kernels._bias_split = original
    assert set(chosen) == {order != "shuffled"}
    for want, have in zip(got["reference"], got["triton"], strict=True):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
