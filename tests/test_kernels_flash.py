"""The fused flash-attention kernels against the PyTorch reference, forward and backward.

Without a GPU the kernels run in Triton's CPU interpreter: fp32 (and one fp16 case), head_dim
16 and 32, small ragged shapes. On a CUDA machine the same cases also run compiled in
fp32/fp16/bf16 with head_dim 64 and 128.

Every case is compared with ``course_lib.attention.attention(..., backend="reference")`` and with
a direct float64 formula written below, outputs and gradients of q, k and v.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch

from course_lib.attention import attention
from course_lib.flash_ops import flash_attention
from course_lib.runtime import KERNEL_MODE, kernel_device

pytestmark = pytest.mark.skipif(
    KERNEL_MODE == "unavailable", reason="Triton is not installed (no wheels on this platform)"
)

DEVICE = kernel_device()
METHOD_OF_MODE = {"none": "softmax", "rope": "rope", "exposb": "exposb"}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seq: int
    head_dim: int
    mode: str
    causal: bool
    padding: str | None = None  # None | "mixed" (real / end-padded / start-padded) | "start"
    style: str = "interleaved"
    positions: str = "default"  # "default" | "shared" ([seq]) | "batch" ([batch, seq])
    scale: float | None = None
    base: float = 10000.0
    noncontiguous: bool = False

    def __str__(self) -> str:
        parts = [f"{self.batch}x{self.heads}x{self.seq}x{self.head_dim}", self.mode]
        parts.append("causal" if self.causal else "bidir")
        parts += [p for p in (self.padding, self.style if self.mode != "none" else None) if p]
        if self.positions != "default":
            parts.append(f"pos-{self.positions}")
        if self.noncontiguous:
            parts.append("strided")
        return "-".join(parts)


CASES = [
    Case(2, 5, 1, 16, "none", False),
    Case(3, 3, 17, 32, "none", True, "mixed"),
    Case(2, 5, 100, 16, "none", False, "start", noncontiguous=True),
    Case(3, 3, 130, 32, "none", True, scale=0.3),
    Case(3, 3, 17, 16, "rope", False),
    Case(2, 5, 100, 32, "rope", True, "start", "half"),
    Case(3, 3, 130, 16, "rope", False, "mixed", positions="batch"),
    Case(3, 2, 100, 16, "rope", True, None, "half", positions="shared", base=500.0),
    Case(2, 3, 1, 32, "rope", True, "start"),
    Case(3, 3, 17, 32, "exposb", True, "mixed"),
    Case(2, 5, 130, 16, "exposb", False, "start", "half"),
    Case(3, 3, 100, 32, "exposb", False, None, positions="batch", noncontiguous=True),
    Case(3, 2, 130, 16, "exposb", True, "mixed", "half", positions="shared"),
    Case(2, 3, 1, 16, "exposb", False),
]

# On a GPU: the same shapes with the head dims the course's models use.
GPU_HEAD_DIM = {16: 64, 32: 128}
GPU_CASES = [replace(c, head_dim=GPU_HEAD_DIM[c.head_dim]) for c in CASES] + [
    Case(2, 3, 1000, 64, "rope", True, "mixed"),
    Case(2, 3, 777, 128, "exposb", False, "start", "half", positions="batch"),
]


# --------------------------------------------------------------------------------------------
# Inputs and references
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


def make_inputs(case: Case, dtype: torch.dtype, device: torch.device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.heads, case.seq, case.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=gen) for _ in range(4))
    q = q * 1.5  # somewhat peaked softmax rows
    if case.noncontiguous:  # stored as [batch, seq, heads, head_dim], viewed as [b, h, s, d]
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    mask = padding_mask(case.batch, case.seq, case.padding)
    pos = position_ids_for(case)
    to = dict(device=device, dtype=dtype)
    q, k, v, grad = (x.to(**to) for x in (q, k, v, grad))
    mask = None if mask is None else mask.to(device)
    pos = None if pos is None else pos.to(device)
    return q, k, v, grad, mask, pos


def direct_attention(q, k, v, case: Case, mask, pos) -> torch.Tensor:
    """The function from its formula, in float64 (angles, as specified, in float32)."""
    batch, _, seq, dim = q.shape
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(dim)
    positions = torch.arange(seq) if pos is None else pos.cpu()
    positions = positions.expand(batch, seq)
    q, k, v = (x.cpu().double() for x in (q, k, v))
    if case.mode != "none":
        inv_freq = (case.base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float()
        angle = (positions.float()[..., None] * inv_freq).double()[:, None]  # [b, 1, s, d/2]
        cos, sin = angle.cos(), angle.sin()

        def rotate(x):
            if case.style == "interleaved":
                x1, x2 = x[..., 0::2], x[..., 1::2]
                return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
            x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
            return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)

        q, k = rotate(q), rotate(k)
        if case.mode == "exposb":
            amplitude = (1 + 0.2 * torch.exp(-0.001 * positions.double()))[:, None, :, None]
            d = torch.arange(dim, dtype=torch.float64)
            gain = 0.8 + 0.4 * torch.exp(-((d - dim / 4) ** 2) / (2 * (dim / 8) ** 2))
            q, k = q * amplitude * gain, k * amplitude * gain
    logits = scale * q @ k.transpose(-1, -2)
    if case.mode == "exposb":
        p = positions.double()
        distance = (p[:, :, None] - p[:, None, :]).abs()
        logits = logits + torch.log(0.7 + 0.3 * torch.exp(-0.005 * distance))[:, None]
    allowed = torch.ones(batch, 1, seq, seq, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask.cpu()[:, None, None, :]
    if case.causal:
        allowed = allowed & torch.ones(seq, seq, dtype=torch.bool).tril()
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return weights @ v


def reference_attention(q, k, v, case: Case, mask, pos) -> torch.Tensor:
    """``course_lib.attention.attention(..., backend="reference")`` with the same arguments."""
    params = {} if case.scale is None else {"scale": case.scale}
    if case.mode != "none":
        params.update(base=case.base, style=case.style)
    return attention(
        q, k, v,
        method=METHOD_OF_MODE[case.mode],
        causal=case.causal,
        key_padding_mask=mask,
        position_ids=pos,
        backend="reference",
        **params,
    )  # fmt: skip


def kernel_attention(q, k, v, case: Case, mask, pos) -> torch.Tensor:
    return flash_attention(
        q, k, v,
        position_mode=case.mode,
        causal=case.causal,
        key_padding_mask=mask,
        position_ids=pos,
        scale=case.scale,
        rope_base=case.base,
        rope_style=case.style,
    )  # fmt: skip


def output_and_grads(fn, q, k, v, grad, case, mask, pos, dtype=None):
    """Run ``fn`` (inputs cast to ``dtype`` if given); return (out, dq, dk, dv), float64 on CPU."""
    leaves = [(x if dtype is None else x.to(dtype)).detach().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves, case, mask, pos)
    out.backward(grad.to(out.dtype).to(out.device))
    return [t.detach().double().cpu() for t in (out, *(x.grad for x in leaves))]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``, the denominator floored at 1.

    (Inputs are O(1), so a gradient that is 0 in exact arithmetic, e.g. dk at seq 1, is held to
    the same absolute error as an O(1) one.)
    """
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1.0)).item()


def check_case(case: Case, dtype: torch.dtype) -> None:
    q, k, v, grad, mask, pos = make_inputs(case, dtype, DEVICE)
    got = output_and_grads(kernel_attention, q, k, v, grad, case, mask, pos)
    assert got[0].shape == q.shape
    for tensor in got:
        assert torch.isfinite(tensor).all()
    # References in float64 from the very same (rounded) inputs.
    ref = output_and_grads(reference_attention, q, k, v, grad, case, mask, pos, torch.float64)
    direct = output_and_grads(direct_attention, q, k, v, grad, case, mask, pos, torch.float64)
    tol = TOLERANCE[dtype]
    for name, a, r, d in zip(("out", "dq", "dk", "dv"), got, ref, direct, strict=True):
        assert relative_error(a, r) < tol, f"{name} vs course_lib reference: {relative_error(a, r)}"
        assert relative_error(a, d) < tol, f"{name} vs direct formula: {relative_error(a, d)}"


# --------------------------------------------------------------------------------------------
# Kernel vs reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_reference_fp32(case: Case) -> None:
    check_case(case, torch.float32)


def test_kernel_matches_reference_fp16_small() -> None:
    check_case(Case(2, 3, 40, 32, "rope", True, "mixed"), torch.float16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_kernel_matches_reference_cuda(case: Case, dtype: torch.dtype) -> None:
    check_case(case, dtype)


def test_unequal_block_sizes_match_reference() -> None:
    """Causal bounds with query blocks narrower and wider than key blocks, in every kernel."""
    kernels = pytest.importorskip("course_lib.kernels.flash")
    case = Case(2, 3, 70, 16, "rope", True, "mixed", "half")
    q, k, v, grad, mask, pos = make_inputs(case, torch.float32, DEVICE, seed=3)
    positions = torch.arange(case.seq, device=DEVICE).expand(case.batch, -1).contiguous()
    options = dict(position_mode="rope", causal=True, scale=0.25, rope_style="half")
    config = kernels.FlashConfig
    out, lse = kernels.flash_attention_forward(
        q, k, v, positions, mask, config=config(16, 32), **options
    )
    dq, dk, dv = kernels.flash_attention_backward(
        grad, q, k, v, out, lse, positions, mask,
        configs={"dkdv": config(64, 16), "dq": config(16, 64)},
        **options,
    )  # fmt: skip
    scaled = replace(case, scale=0.25)
    ref = output_and_grads(reference_attention, q, k, v, grad, scaled, mask, None, torch.float64)
    for name, a, r in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), ref, strict=True):
        assert relative_error(a.double().cpu(), r) < 1e-4, name


@pytest.mark.parametrize("mode", ["none", "rope", "exposb"])
def test_fully_padded_row_gives_zeros_and_finite_grads(mode: str) -> None:
    case = Case(2, 2, 20, 16, mode, causal=mode == "rope")
    q, k, v, grad, _, _ = make_inputs(case, torch.float32, DEVICE, seed=1)
    mask = torch.ones(2, 20, dtype=torch.bool, device=DEVICE)
    mask[1] = False  # every key of batch row 1 is padding
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = kernel_attention(*leaves, case, mask, None)
    out.backward(grad)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert out[0].abs().sum() > 0
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all()
        assert torch.equal(leaf.grad[1], torch.zeros_like(leaf.grad[1]))


def test_backward_is_deterministic() -> None:
    case = Case(2, 2, 40, 16, "exposb", True, "start")
    q, k, v, grad, mask, pos = make_inputs(case, torch.float32, DEVICE, seed=2)
    first = output_and_grads(kernel_attention, q, k, v, grad, case, mask, pos)
    second = output_and_grads(kernel_attention, q, k, v, grad, case, mask, pos)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_position_ids_forms_agree() -> None:
    """``[seq]``, ``[1, seq]`` and ``[batch, seq]`` position ids give the same output."""
    case = Case(2, 2, 20, 16, "exposb", False)
    q, k, v, _, _, _ = make_inputs(case, torch.float32, DEVICE, seed=4)
    pos = (torch.arange(20, device=DEVICE) * 2 + 5).to(torch.int32)
    outs = [
        kernel_attention(q, k, v, case, None, p)
        for p in (pos, pos[None], pos[None].expand(2, -1), pos.long())
    ]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    shifted = kernel_attention(q, k, v, case, None, pos + 100)
    assert not torch.allclose(shifted, outs[0])  # positions really reach the kernel


def test_triton_backend_of_attention_uses_the_kernel() -> None:
    case = Case(2, 2, 24, 16, "rope", True, style="half")
    q, k, v, _, mask, _ = make_inputs(case, torch.float32, DEVICE, seed=5)
    via_attention = attention(q, k, v, method="rope", causal=True, backend="triton", style="half")
    direct = kernel_attention(q, k, v, case, mask, None)
    assert torch.equal(via_attention, direct)


# --------------------------------------------------------------------------------------------
# Bad input gets a clear error
# --------------------------------------------------------------------------------------------


def _qkv(shape=(2, 3, 8, 16), dtype=torch.float32):
    return [torch.randn(shape, device=DEVICE, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize(
    ("make_call", "error", "message"),
    [
        (lambda q, k, v: flash_attention(*_qkv((2, 3, 8, 24))), ValueError, "head_dim"),
        (lambda q, k, v: flash_attention(*_qkv((2, 3, 8, 256))), ValueError, "head_dim"),
        (
            lambda q, k, v: flash_attention(*_qkv((2, 3, 8, 15)), position_mode="rope"),
            ValueError,
            "head_dim in",
        ),
        (lambda q, k, v: flash_attention(q, k[:, :2], v), ValueError, "same shape"),
        (lambda q, k, v: flash_attention(q, k[:, :, :5], v[:, :, :5]), ValueError, "seq_q"),
        (lambda q, k, v: flash_attention(q, k.double(), v), TypeError, "dtype"),
        (lambda q, k, v: flash_attention(q.long(), k.long(), v.long()), TypeError, "dtype"),
        (lambda q, k, v: flash_attention(q[0], k[0], v[0]), ValueError, "4-D"),
        (lambda q, k, v: flash_attention(q, k, v, position_mode="alibi"), ValueError, "alibi"),
        (
            lambda q, k, v: flash_attention(q, k, v, position_mode="rope", rope_style="neox"),
            ValueError,
            "rope_style",
        ),
        (
            lambda q, k, v: flash_attention(
                q, k, v, key_padding_mask=torch.ones(2, 8, device=DEVICE)
            ),
            TypeError,
            "bool",
        ),
        (
            lambda q, k, v: flash_attention(
                q, k, v, key_padding_mask=torch.ones(2, 7, dtype=torch.bool, device=DEVICE)
            ),
            ValueError,
            "key_padding_mask",
        ),
        (
            lambda q, k, v: flash_attention(
                q, k, v, position_mode="rope", position_ids=torch.arange(8.0, device=DEVICE)
            ),
            TypeError,
            "integer",
        ),
        (
            lambda q, k, v: flash_attention(
                q, k, v, position_mode="rope", position_ids=torch.arange(9, device=DEVICE)
            ),
            ValueError,
            "position_ids",
        ),
        (lambda q, k, v: flash_attention(q, k, v, scale=float("nan")), ValueError, "scale"),
        (lambda q, k, v: flash_attention(q, k, v, rope_base=-1.0), ValueError, "rope_base"),
        (lambda q, k, v: flash_attention(q, k, v, causal=1), TypeError, "causal"),
    ],
    ids=[
        "head_dim_24",
        "head_dim_256",
        "odd_head_dim_rope",
        "heads_mismatch",
        "seq_q_ne_seq_k",
        "dtype_mismatch",
        "integer_dtype",
        "three_dims",
        "unknown_mode",
        "unknown_style",
        "float_mask",
        "mask_shape",
        "float_positions",
        "positions_shape",
        "nan_scale",
        "negative_base",
        "non_bool_causal",
    ],
)
def test_bad_input_raises_clear_error(make_call, error, message) -> None:
    q, k, v = _qkv()
    with pytest.raises(error, match=message):
        make_call(q, k, v)
