"""The stick-breaking kernels (``kernels/stick_breaking.py`` via ``course_lib.stick_ops``) against
two references: a direct float64 loop over the formula (product form, no log space) on tiny inputs,
and ``course_lib.attention.attention(..., backend="reference")`` on ragged shapes.

Without a GPU the kernels run in Triton's interpreter on the CPU, in fp32 (the interpreter's bf16
``tl.dot`` is broken); the GPU tests (fp32/bf16, head_dim 64/128) run when CUDA is available.
"""

from __future__ import annotations

import math

import pytest
import torch

from course_lib import runtime

pytestmark = pytest.mark.skipif(
    not runtime.kernels_available(), reason="Triton is not installed (it has Linux wheels only)"
)

from course_lib.attention import attention  # noqa: E402
from course_lib.encodings import rope_angles  # noqa: E402
from course_lib.stick_ops import stick_breaking_attention  # noqa: E402

DEVICE = runtime.kernel_device()
FP32_TOL = 1e-4
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="compiled kernels, bf16 and head_dim 64/128 are tested on a CUDA GPU only",
)


# --------------------------------------------------------------------------------------------
# References and helpers
# --------------------------------------------------------------------------------------------


def rotate_float64(x: torch.Tensor, positions: torch.Tensor, base: float, style: str):
    """RoPE written out pair by pair: ``(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)``.

    ``x`` float64 ``[B, H, S, D]``; positions ``[1 or B, S]``; angles in float32.
    """
    dim = x.shape[-1]
    t = torch.arange(dim // 2, dtype=torch.float64, device=x.device)
    inv_freq = (base ** (-2.0 * t / dim)).to(torch.float32)
    angles = (positions.to(torch.float32)[..., None] * inv_freq).to(torch.float64)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # [1|B, 1, S, D/2]
    first = 2 * torch.arange(dim // 2) if style == "interleaved" else torch.arange(dim // 2)
    second = first + 1 if style == "interleaved" else first + dim // 2
    x1, x2 = x[..., first], x[..., second]
    out = torch.empty_like(x)
    out[..., first] = x1 * cos - x2 * sin
    out[..., second] = x1 * sin + x2 * cos
    return out


def loop_reference(
    q, k, v, *, causal, key_padding_mask=None, position_ids=None, scale=None, rope=False,
    rope_base=10000.0, rope_style="interleaved", distance_penalty=None,
):  # fmt: skip
    """Stick-breaking attention by direct float64 loops: for each query, walk each stick from the
    nearest allowed key outward, ``A_ij = share * beta_ij * remaining``, ``remaining *= 1 - beta``.
    """
    batch, heads, seq, dim = q.shape
    q, k, v = q.double(), k.double(), v.double()
    if position_ids is None:
        positions = torch.arange(seq, device=q.device)[None]
    else:
        positions = position_ids if position_ids.dim() == 2 else position_ids[None]
    if rope:
        q = rotate_float64(q, positions, rope_base, rope_style)
        k = rotate_float64(k, positions, rope_base, rope_style)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    z = scale * q @ k.transpose(-1, -2)
    if distance_penalty is not None:
        distance = (positions[:, :, None] - positions[:, None, :]).abs().double()[:, None]
        z = z - distance_penalty.double()[None, :, None, None] * distance
    beta = torch.sigmoid(z)
    share = 1.0 if causal else 0.5
    rows = []
    for b in range(batch):
        for h in range(heads):
            for i in range(seq):
                out_i = v[b, h, i]
                sticks = [range(i - 1, -1, -1)] + ([] if causal else [range(i + 1, seq)])
                for keys in sticks:
                    remaining = 1.0
                    for j in keys:
                        if key_padding_mask is not None and not bool(key_padding_mask[b, j]):
                            continue  # a padded key takes nothing and breaks nothing
                        out_i = out_i + share * beta[b, h, i, j] * remaining * (
                            v[b, h, j] - v[b, h, i]
                        )
                        remaining = remaining * (1.0 - beta[b, h, i, j])
                rows.append(out_i)
    return torch.stack(rows).view(batch, heads, seq, dim)


def reference_attention(
    q, k, v, *, causal, key_padding_mask=None, position_ids=None, scale=None, rope=False,
    rope_base=10000.0, rope_style="interleaved", distance_penalty=None,
):  # fmt: skip
    """``course_lib.attention.attention(..., backend="reference")`` for the same arguments:
    method "rse" (RoPE and a penalty) or "stick_breaking" (neither)."""
    kwargs = {"causal": causal, "key_padding_mask": key_padding_mask}
    if scale is not None:
        kwargs["scale"] = scale
    if rope != (distance_penalty is not None):
        raise AssertionError("the reference has rope and a penalty together (rse) or neither")
    if rope:
        return attention(
            q, k, v, method="rse", position_ids=position_ids, base=rope_base, style=rope_style,
            distance_penalty=distance_penalty, **kwargs,
        )  # fmt: skip
    return attention(q, k, v, method="stick_breaking", **kwargs)


def make_inputs(batch, heads, seq, dim, *, seed, rse, dtype=torch.float32, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(batch, heads, seq, dim, generator=gen) for _ in range(4)]
    q, k, v, grad_out = (t.to(device=device, dtype=dtype) for t in tensors)
    lam = (0.3 * torch.rand(heads, generator=gen)).to(device) if rse else None
    return q, k, v, lam, grad_out


def padding_mask(batch, seq, device=DEVICE):
    """Row 0 padded at the end, row 1 at the start, the rest real."""
    mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
    cut = max(1, seq // 5)
    mask[0, seq - cut :] = False
    if batch > 1:
        mask[1, :cut] = False
    return mask


def outputs_and_grads(fn, q, k, v, lam, grad_out, cast, **kwargs):
    """Run ``fn`` on leaf copies (``cast``: dtype) and return the output and its gradients."""
    leaves = [t.detach().to(cast).requires_grad_() for t in (q, k, v)]
    if lam is not None:
        leaves.append(lam.detach().to(cast).requires_grad_())
        kwargs["distance_penalty"] = leaves[3]
    out = fn(*leaves[:3], **kwargs)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype), materialize_grads=True)
    return out, grads


def assert_close(actual, expected, tol, what):
    """Max abs error within ``tol`` times the larger of 1 and the expected tensor's max."""
    actual = actual.detach().double().cpu()
    expected = expected.detach().double().cpu()
    assert actual.shape == expected.shape, what
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = (actual - expected).abs().max().item()
    bound = tol * max(1.0, expected.abs().max().item())
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def assert_grads_close(grads, ref_grads, tol, where=""):
    assert len(grads) == len(ref_grads)
    names = ("dq", "dk", "dv", "dlambda")[: len(grads)]
    for name, got, want in zip(names, grads, ref_grads, strict=True):
        assert_close(got, want, tol, name + where)


def compare(reference, q, k, v, lam, grad_out, tol=FP32_TOL, **kwargs):
    out, grads = outputs_and_grads(
        stick_breaking_attention, q, k, v, lam, grad_out, q.dtype, **kwargs
    )
    assert out.dtype == q.dtype and out.shape == q.shape
    ref_out, ref_grads = outputs_and_grads(
        reference, q, k, v, lam, grad_out, torch.float64, **kwargs
    )
    assert_close(out, ref_out, tol, "output")
    assert_grads_close(grads, ref_grads, tol)


# --------------------------------------------------------------------------------------------
# The kernel against the direct loop (tiny inputs)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "causal, rse, style, padded",
    [
        (True, False, "interleaved", False),
        (False, False, "interleaved", True),
        (True, True, "interleaved", True),
        (False, True, "half", False),
    ],
)
def test_matches_direct_loop(causal, rse, style, padded):
    q, k, v, lam, grad_out = make_inputs(2, 3, 17, 16, seed=1, rse=rse)
    kwargs = {"causal": causal, "rope": rse, "rope_style": style}
    if padded:
        kwargs["key_padding_mask"] = padding_mask(2, 17)
    if rse:  # positions that are not 0..seq-1, different per batch row
        kwargs["position_ids"] = torch.stack((torch.arange(17) * 2, torch.arange(17) + 5)).to(
            DEVICE
        )
    compare(loop_reference, q, k, v, lam, grad_out, **kwargs)


@pytest.mark.parametrize("causal", [True, False])
def test_single_token_returns_its_value(causal):
    q, k, v, lam, grad_out = make_inputs(1, 2, 1, 16, seed=2, rse=True)
    out, (dq, dk, dv, dlam) = outputs_and_grads(
        stick_breaking_attention, q, k, v, lam, grad_out, torch.float32, causal=causal, rope=True
    )
    assert torch.equal(out, v)
    assert torch.equal(dv, grad_out) and not dq.any() and not dk.any() and not dlam.any()
    compare(loop_reference, q, k, v, lam, grad_out, causal=causal, rope=True)


# --------------------------------------------------------------------------------------------
# The kernel against course_lib.attention's reference (ragged shapes, several key blocks)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, causal, rse, style",
    [
        ((3, 2, 100, 32), True, False, "interleaved"),
        ((1, 3, 130, 16), False, False, "interleaved"),
        ((1, 3, 130, 32), True, True, "interleaved"),
        ((2, 1, 100, 16), False, True, "half"),
    ],
)
def test_matches_reference_attention(shape, causal, rse, style):
    batch, heads, seq, dim = shape
    q, k, v, lam, grad_out = make_inputs(*shape, seed=3, rse=rse)
    kwargs = {"causal": causal, "key_padding_mask": padding_mask(batch, seq)}
    if rse:
        kwargs.update(
            rope=True, rope_style=style, position_ids=torch.arange(seq, device=DEVICE) + 7
        )
    compare(reference_attention, q, k, v, lam, grad_out, **kwargs)


def test_small_key_blocks_match_reference():
    """16-wide blocks (3 of them, the last ragged) exercise the carries and checkpoints."""
    kernels = runtime.load_kernel_module("stick_breaking")
    batch, heads, seq, dim = 2, 1, 40, 16
    q, k, v, lam, grad_out = make_inputs(batch, heads, seq, dim, seed=4, rse=True)
    mask = padding_mask(batch, seq)
    positions = torch.arange(seq, device=DEVICE)[None]
    angles = rope_angles(positions, dim)
    tables = (angles.cos().contiguous(), angles.sin().contiguous())
    args = (q, k, v, positions, mask.to(torch.int8), lam, tables)
    opts = {"causal": False, "scale": 1.0 / math.sqrt(dim), "half_style": True, "block": 16}
    out, mass = kernels.stick_breaking_forward(*args, **opts)
    grads = kernels.stick_breaking_backward(grad_out, q, k, v, mass, *args[3:], **opts)
    ref, ref_grads = outputs_and_grads(
        reference_attention, q, k, v, lam, grad_out, torch.float64, causal=False,
        key_padding_mask=mask, rope=True, rope_style="half",
    )  # fmt: skip
    assert_close(out, ref, FP32_TOL, "output")
    assert_grads_close(grads, ref_grads, FP32_TOL)


def test_triton_backend_of_attention_agrees():
    """``attention(method=..., backend="triton")`` reaches these kernels and agrees."""
    q, k, v, lam, grad_out = make_inputs(2, 2, 24, 16, seed=5, rse=True)
    mask = padding_mask(2, 24)
    for method, params in (("stick_breaking", {}), ("rse", {"distance_penalty": lam})):
        for causal in (True, False):
            kw = {"method": method, "causal": causal, "key_padding_mask": mask, **params}
            got = attention(q, k, v, backend="triton", **kw)
            want = attention(q.double(), k.double(), v.double(), backend="reference", **kw)
            assert_close(got, want, FP32_TOL, f"{method}, causal={causal}")


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


def test_own_value_where_no_key_is_allowed():
    """The first causal token, and every token of a fully padded row, output their own value."""
    q, k, v, _, _ = make_inputs(2, 3, 20, 16, seed=6, rse=False)
    mask = torch.ones(2, 20, dtype=torch.bool, device=DEVICE)
    mask[1] = False
    for causal in (True, False):
        out = stick_breaking_attention(q, k, v, causal=causal, key_padding_mask=mask)
        assert torch.equal(out[1], v[1])
        if causal:
            assert torch.equal(out[:, :, 0], v[:, :, 0])
            assert not torch.allclose(out[0, :, 1:], v[0, :, 1:])


@pytest.mark.parametrize("causal", [True, False])
def test_finite_for_huge_logits(causal):
    """Unit q, k with scale 1e4: logits of magnitude up to 1e4, and a large distance penalty."""
    q, k, v, _, grad_out = make_inputs(2, 2, 70, 16, seed=7, rse=False)
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    lam = torch.tensor([0.0, 50.0], device=DEVICE)
    kwargs = {"causal": causal, "scale": 1e4, "rope": True, "key_padding_mask": padding_mask(2, 70)}
    out, grads = outputs_and_grads(
        stick_breaking_attention, q, k, v, lam, grad_out, q.dtype, **kwargs
    )
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    # fp32 logits carry an absolute error of ~1e4 * 1e-7; the result still tracks float64.
    ref, ref_grads = outputs_and_grads(
        reference_attention, q, k, v, lam, grad_out, torch.float64, **kwargs
    )
    assert_close(out, ref, 1e-2, "output")
    assert_grads_close(grads, ref_grads, 1e-2)


def test_strided_inputs_expanded_grad_and_determinism():
    """q, k, v as views of a [batch, seq, heads, dim] tensor; out.sum() gives a stride-0 grad."""
    gen = torch.Generator().manual_seed(8)
    base = torch.randn(2, 40, 3, 3, 16, generator=gen).to(DEVICE)  # [batch, seq, q/k/v, heads, dim]
    q, k, v = (base[:, :, i].transpose(1, 2).requires_grad_() for i in range(3))
    assert not q.is_contiguous()
    lam = torch.tensor([0.1, 0.0, 0.5], device=DEVICE, requires_grad=True)
    kwargs = {"causal": True, "rope": True, "distance_penalty": lam}
    grads = [torch.autograd.grad(stick_breaking_attention(q, k, v, **kwargs).sum(), (q, k, v, lam))
             for _ in range(2)]  # fmt: skip
    for first, second in zip(*grads, strict=True):
        assert torch.equal(first, second), "the backward must be deterministic"
    q64, k64, v64, lam64 = (t.detach().double().requires_grad_() for t in (q, k, v, lam))
    ref = reference_attention(q64, k64, v64, causal=True, rope=True, distance_penalty=lam64)
    ref_grads = torch.autograd.grad(ref.sum(), (q64, k64, v64, lam64))
    assert_grads_close(grads[0], ref_grads, FP32_TOL)


def test_gradients_only_where_asked():
    q, k, v, lam, grad_out = make_inputs(1, 2, 20, 16, seed=9, rse=True)
    q.requires_grad_()
    out = stick_breaking_attention(q, k, v, rope=True, distance_penalty=lam)
    (dq,) = torch.autograd.grad(out, (q,), grad_out)
    assert torch.isfinite(dq).all() and dq.abs().max() > 0
    lam.requires_grad_()
    out = stick_breaking_attention(q, k, v, distance_penalty=lam)  # penalty without rope
    dq, dlam = torch.autograd.grad(out, (q, lam), grad_out)
    q64, lam64 = q.detach().double().requires_grad_(), lam.detach().double().requires_grad_()
    ref = loop_reference(q64, k, v, causal=True, distance_penalty=lam64)
    ref_dq, ref_dlam = torch.autograd.grad(ref, (q64, lam64), grad_out.double())
    assert_close(dq, ref_dq, FP32_TOL, "dq")
    assert_close(dlam, ref_dlam, FP32_TOL, "dlambda")


def test_float16_inputs_keep_their_dtype():
    q, k, v, lam, grad_out = make_inputs(1, 2, 33, 16, seed=10, rse=True, dtype=torch.float16)
    compare(reference_attention, q, k, v, lam, grad_out, tol=2e-2, causal=True, rope=True)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    q, k, v, _, _ = make_inputs(2, 3, 10, 16, seed=11, rse=False)
    with pytest.raises(ValueError, match="head_dim"):
        x = torch.randn(2, 3, 10, 24, device=DEVICE)
        stick_breaking_attention(x, x, x)
    with pytest.raises(ValueError, match="head_dim"):
        x = torch.randn(2, 3, 10, 8, device=DEVICE)
        stick_breaking_attention(x, x, x)
    with pytest.raises(ValueError, match="seq_q == seq_k"):
        stick_breaking_attention(q, k[:, :, :7], v[:, :, :7])
    with pytest.raises(TypeError, match="one dtype"):
        stick_breaking_attention(q, k.half(), v)
    with pytest.raises(TypeError, match="dtypes"):
        stick_breaking_attention(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match=r"shape \[heads\]"):
        stick_breaking_attention(q, k, v, distance_penalty=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match=">= 0"):
        stick_breaking_attention(q, k, v, distance_penalty=-torch.ones(3, device=DEVICE))
    with pytest.raises(TypeError, match="floating-point"):
        stick_breaking_attention(q, k, v, distance_penalty=torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="rope_style"):
        stick_breaking_attention(q, k, v, rope=True, rope_style="pairs")
    with pytest.raises(TypeError, match="bool"):
        stick_breaking_attention(q, k, v, key_padding_mask=torch.ones(2, 10, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        mask = torch.ones(2, 9, dtype=torch.bool, device=DEVICE)
        stick_breaking_attention(q, k, v, key_padding_mask=mask)
    with pytest.raises(TypeError, match="integer"):
        stick_breaking_attention(q, k, v, position_ids=torch.arange(10.0, device=DEVICE))
    with pytest.raises(ValueError, match="position_ids"):
        stick_breaking_attention(q, k, v, position_ids=torch.arange(9, device=DEVICE))
    with pytest.raises(ValueError, match="4-D"):
        stick_breaking_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="scale"):
        stick_breaking_attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="power of two"):
        runtime.load_kernel_module("stick_breaking").pick_config(16, DEVICE, block=24)


# --------------------------------------------------------------------------------------------
# GPU (compiled kernels)
# --------------------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, FP32_TOL), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("causal, rse", [(True, False), (False, True), (True, True)])
def test_cuda_matches_reference(dtype, tol, dim, causal, rse):
    batch, heads, seq = 2, 3, 300
    q, k, v, lam, grad_out = make_inputs(batch, heads, seq, dim, seed=12, rse=rse, dtype=dtype)
    kwargs = {"causal": causal, "key_padding_mask": padding_mask(batch, seq)}
    if rse:
        kwargs.update(rope=True, position_ids=torch.arange(seq, device=DEVICE) * 3)
    out, grads = outputs_and_grads(
        stick_breaking_attention, q, k, v, lam, grad_out, dtype, **kwargs
    )
    assert out.dtype == dtype
    ref, ref_grads = outputs_and_grads(
        reference_attention, q, k, v, lam, grad_out, torch.float64, **kwargs
    )
    assert_close(out, ref, tol, "output")
    grad_tol = tol if dtype == torch.float32 else 3e-2
    assert_grads_close(grads, ref_grads, grad_tol)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_finite_for_huge_logits(dtype):
    q, k, v, _, grad_out = make_inputs(2, 2, 200, 64, seed=13, rse=False, dtype=dtype)
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    lam = torch.tensor([0.0, 50.0], device=DEVICE)
    for causal in (True, False):
        out, grads = outputs_and_grads(
            stick_breaking_attention, q, k, v, lam, grad_out, dtype, causal=causal, scale=1e4,
            rope=True, rope_style="half",
        )  # fmt: skip
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
