"""The stick-breaking kernels (``kernels/stick_breaking.py`` via ``course_lib.stick_ops``) against
two references written here with plain torch: a direct float64 loop over the formula (product
form, no log space) on tiny inputs, and a vectorised float64 log-space version on ragged shapes.

The kernels take their position machinery from the caller: the tests build RoPE tables (with or
without a gain) and name the score-bias hooks (RSE: ``ScoreBias("linear_distance", lambda)``).

Without a GPU the kernels run in Triton's interpreter on the CPU, in fp32 (the interpreter's bf16
``tl.dot`` is broken); the GPU tests (fp32/bf16, head_dim 64/128) run when CUDA is available.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from course_lib import runtime
from course_lib.encodings.distance import LINEAR_DISTANCE
from course_lib.kernel_hooks import QKTables, ScoreBias, kernel_positions
from course_lib.stick_ops import stick_breaking_attention

pytestmark = pytest.mark.skipif(
    not runtime.kernels_available(), reason="Triton is not installed (it has Linux wheels only)"
)

DEVICE = runtime.kernel_device()
FP32_TOL = 1e-4
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="compiled kernels, bf16 and head_dim 64/128 are tested on a CUDA GPU only",
)


# --------------------------------------------------------------------------------------------
# Tables, references and helpers
# --------------------------------------------------------------------------------------------


def rope_tables(positions, dim, *, layout="interleaved", base=10000.0, gain=None, batch=None):
    """RoPE tables as a caller builds them: angles ``p * base**(-2t/D)`` in float32, cos/sin
    ``[1, seq, D/2]`` (``[batch, seq, D/2]`` if ``batch`` is given or the positions differ per
    row)."""
    positions = positions if positions.dim() == 2 else positions[None]
    t = torch.arange(dim // 2, dtype=torch.float64)
    inv_freq = (base ** (-2.0 * t / dim)).to(torch.float32).to(positions.device)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    if batch is not None and angles.shape[0] == 1:
        angles = angles.repeat(batch, 1, 1)
    return QKTables(angles.cos(), angles.sin(), gain, layout)


def apply_tables(x: torch.Tensor, tables: QKTables | None) -> torch.Tensor:
    """``x'[c1] = g[c1] (x1 cos - x2 sin)``, ``x'[c2] = g[c2] (x1 sin + x2 cos)`` in x's dtype."""
    if tables is None:
        return x
    dim = x.shape[-1]
    cos = tables.cos.to(x)[:, None]  # [1 or B, 1, S, D/2]
    sin = tables.sin.to(x)[:, None]
    t = torch.arange(dim // 2, device=x.device)
    first, second = (2 * t, 2 * t + 1) if tables.layout == "interleaved" else (t, t + dim // 2)
    x1, x2 = x[..., first], x[..., second]
    out = torch.zeros_like(x)
    out = out.index_copy(-1, first, x1 * cos - x2 * sin).index_copy(-1, second, x1 * sin + x2 * cos)
    return out if tables.gain is None else out * tables.gain.to(x)


def logits(q, k, *, position_ids, scale, qk_tables, score_bias):
    """``z = scale * q' . k' + b`` in float64 (``b`` from the hook's formula)."""
    batch, _, seq, dim = q.shape
    q, k = apply_tables(q.double(), qk_tables), apply_tables(k.double(), qk_tables)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    z = scale * q @ k.transpose(-1, -2)
    if score_bias is not None:
        p = torch.arange(seq, device=q.device) if position_ids is None else position_ids
        p = (p if p.dim() == 2 else p[None]).double()
        distance = (p[:, :, None] - p[:, None, :]).abs()[:, None]
        if score_bias.hook_name == "linear_distance":
            z = z - score_bias.per_head.double()[None, :, None, None] * distance
        elif score_bias.hook_name == "exposb_distance":
            z = z + torch.log(0.7 + 0.3 * torch.exp(-0.005 * distance))
        else:
            raise AssertionError(score_bias.hook_name)
    return z


def loop_reference(
    q, k, v, *, causal=True, key_padding_mask=None, position_ids=None, scale=None, qk_tables=None,
    score_bias=None,
):  # fmt: skip
    """Stick-breaking attention by direct float64 loops: for each query, walk each stick from the
    nearest allowed key outward, ``A_ij = share * beta_ij * remaining``, ``remaining *= 1 - beta``.
    """
    batch, heads, seq, dim = q.shape
    z = logits(
        q, k, position_ids=position_ids, scale=scale, qk_tables=qk_tables, score_bias=score_bias
    )
    v = v.double()
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


def vector_reference(
    q, k, v, *, causal=True, key_padding_mask=None, position_ids=None, scale=None, qk_tables=None,
    score_bias=None,
):  # fmt: skip
    """The same function in log space with cumulative sums (float64):
    ``log A_ij = logsigmoid(z_ij) - sum_{allowed l strictly between j and i} softplus(z_il)``."""
    z = logits(
        q, k, position_ids=position_ids, scale=scale, qk_tables=qk_tables, score_bias=score_bias
    )
    seq = q.shape[2]
    idx = torch.arange(seq, device=q.device)
    real = torch.ones(q.shape[0], seq, dtype=torch.bool, device=q.device)
    if key_padding_mask is not None:
        real = key_padding_mask.bool()
    real = real[:, None, None, :]
    left = (idx[None, :] < idx[:, None]) & real
    right = (idx[None, :] > idx[:, None]) & real
    softplus = torch.nn.functional.softplus(z)
    log_beta = torch.nn.functional.logsigmoid(z)
    sp_left = torch.where(left, softplus, 0.0)
    sp_right = torch.where(right, softplus, 0.0)
    # left stick, keys l with j < l < i: everything left of i minus the keys up to j
    between_left = sp_left.sum(-1, keepdim=True) - sp_left.cumsum(-1)
    # right stick, keys l with i < l < j: the keys right of i up to j, minus j itself
    between_right = sp_right.cumsum(-1) - sp_right
    weights = torch.where(left, torch.exp(log_beta - between_left), 0.0)
    if not causal:
        weights = 0.5 * (weights + torch.where(right, torch.exp(log_beta - between_right), 0.0))
    v = v.double()
    return weights @ v + (1.0 - weights.sum(-1, keepdim=True)) * v


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


def outputs_and_grads(fn, q, k, v, lam, grad_out, cast, hook="linear_distance", **kwargs):
    """Run ``fn`` on leaf copies (``cast``: dtype) and return the output and its gradients
    (``lam``, when given, is the ``per_head`` tensor of ``hook``)."""
    leaves = [t.detach().to(cast).requires_grad_() for t in (q, k, v)]
    if lam is not None:
        leaves.append(lam.detach().to(cast).requires_grad_())
        kwargs["score_bias"] = ScoreBias(hook, leaves[3])
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
    names = ("dq", "dk", "dv", "dper_head")[: len(grads)]
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


def test_the_two_references_agree():
    """The loop and the vectorised reference compute the same function (so each checks the
    other), with padding, a bias and tables, in both directions."""
    q, k, v, lam, _ = make_inputs(2, 2, 9, 16, seed=0, rse=True, dtype=torch.float64)
    pos = torch.stack((torch.arange(9) * 3, torch.arange(9) + 1)).to(DEVICE)
    kwargs = {
        "key_padding_mask": padding_mask(2, 9),
        "position_ids": pos,
        "qk_tables": rope_tables(pos, 16, layout="half"),
        "score_bias": ScoreBias("linear_distance", lam),
    }
    for causal in (True, False):
        a = loop_reference(q, k, v, causal=causal, **kwargs)
        b = vector_reference(q, k, v, causal=causal, **kwargs)
        assert torch.allclose(a, b, atol=1e-12)


# --------------------------------------------------------------------------------------------
# The kernel against the direct loop (tiny inputs)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "causal, rse, layout, padded, gain",
    [
        (True, False, "interleaved", False, False),
        (False, False, "interleaved", True, False),
        (True, True, "interleaved", True, False),
        (False, True, "half", False, False),
        (True, True, "half", True, True),
        (False, False, "interleaved", False, True),
    ],
)
def test_matches_direct_loop(causal, rse, layout, padded, gain):
    q, k, v, lam, grad_out = make_inputs(2, 3, 17, 16, seed=1, rse=rse)
    kwargs = {"causal": causal}
    if padded:
        kwargs["key_padding_mask"] = padding_mask(2, 17)
    if rse or gain:  # positions that are not 0..seq-1, different per batch row
        pos = torch.stack((torch.arange(17) * 2, torch.arange(17) + 5)).to(DEVICE)
        g = torch.linspace(0.6, 1.4, 16, device=DEVICE) if gain else None
        kwargs.update(position_ids=pos, qk_tables=rope_tables(pos, 16, layout=layout, gain=g))
    compare(loop_reference, q, k, v, lam, grad_out, **kwargs)


def test_steady_positions_are_computed_and_others_read(monkeypatch):
    """Positions that step by a constant in every sequence (a start and a step of each row's own)
    reach the forward and the row kernel as ``p_0 + step * index`` (``POS_AFFINE``: two scalar
    loads per tile where a vector of positions was read; the column kernel reads them); one
    sequence with a gap makes every launch read them. Both match the direct loop, with padding,
    in both directions."""
    kernels = runtime.load_kernel_module("stick_breaking")
    seen = []
    run_launch = kernels.run_launch

    def recording(launch):
        seen.append((launch.name, launch.kwargs.get("POS_AFFINE", False)))
        return run_launch(launch)

    monkeypatch.setattr(kernels, "run_launch", recording)
    q, k, v, lam, grad_out = make_inputs(2, 2, 21, 16, seed=21, rse=True)
    steady = torch.stack((torch.arange(21) * 3 + 4, torch.arange(21) + 1)).to(DEVICE)
    gap = steady.clone()
    gap[1, 10:] += 7
    for causal in (True, False):
        for pos, affine in ((steady, True), (gap, False)):
            seen.clear()
            kwargs = {
                "causal": causal,
                "key_padding_mask": padding_mask(2, 21),
                "position_ids": pos,
            }
            compare(loop_reference, q, k, v, lam, grad_out, **kwargs)
            want = [("forward", affine), ("bwd_rows", affine), ("bwd_cols", False)]
            assert seen == want, (causal, seen)


@pytest.mark.parametrize("causal", [True, False])
def test_exposb_distance_hook_matches_direct_loop(causal):
    """A bias hook without a parameter, under the stick-breaking normaliser."""
    q, k, v, _, grad_out = make_inputs(2, 2, 17, 16, seed=12, rse=False)
    pos = (torch.arange(17) * 40).to(DEVICE)
    kwargs = {"causal": causal, "position_ids": pos, "score_bias": ScoreBias("exposb_distance")}
    compare(loop_reference, q, k, v, None, grad_out, **kwargs)


@pytest.mark.parametrize("causal", [True, False])
def test_single_token_returns_its_value(causal):
    q, k, v, lam, grad_out = make_inputs(1, 2, 1, 16, seed=2, rse=True)
    tables = rope_tables(torch.arange(1, device=DEVICE), 16)
    out, (dq, dk, dv, dlam) = outputs_and_grads(
        stick_breaking_attention, q, k, v, lam, grad_out, torch.float32, causal=causal,
        qk_tables=tables,
    )  # fmt: skip
    assert torch.equal(out, v)
    assert torch.equal(dv, grad_out) and not dq.any() and not dk.any() and not dlam.any()
    compare(loop_reference, q, k, v, lam, grad_out, causal=causal, qk_tables=tables)


# --------------------------------------------------------------------------------------------
# The kernel against the vectorised reference (ragged shapes, several key blocks)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, causal, rse, layout, full_tables",
    [
        ((3, 2, 100, 32), True, False, "interleaved", False),
        ((1, 3, 130, 16), False, False, "interleaved", False),
        ((1, 3, 130, 32), True, True, "interleaved", False),
        ((2, 1, 100, 16), False, True, "half", True),
    ],
)
def test_matches_vector_reference(shape, causal, rse, layout, full_tables):
    batch, heads, seq, dim = shape
    q, k, v, lam, grad_out = make_inputs(*shape, seed=3, rse=rse)
    kwargs = {"causal": causal, "key_padding_mask": padding_mask(batch, seq)}
    if rse:
        pos = torch.arange(seq, device=DEVICE) + 7
        tables = rope_tables(pos, dim, layout=layout, batch=batch if full_tables else None)
        assert tables.cos.shape[0] == (batch if full_tables else 1)
        kwargs.update(qk_tables=tables, position_ids=pos)
    compare(vector_reference, q, k, v, lam, grad_out, **kwargs)


def test_small_key_blocks_match_reference():
    """16-wide blocks (3 of them, the last ragged) exercise the carries, the checkpoints and the
    per-program partial sums of the per-head gradient."""
    kernels = runtime.load_kernel_module("stick_breaking")
    batch, heads, seq, dim = 2, 1, 40, 16
    q, k, v, lam, grad_out = make_inputs(batch, heads, seq, dim, seed=4, rse=True)
    mask = padding_mask(batch, seq)
    positions = torch.arange(seq, device=DEVICE)[None]
    tables = rope_tables(positions, dim, layout="half")
    args = (q, k, v, kernel_positions(positions), mask.to(torch.int8))
    opts = {
        "causal": False, "scale": 1.0 / math.sqrt(dim), "qk_tables": tables,
        "bias_hook": LINEAR_DISTANCE, "bias_params": lam, "block": 16,
    }  # fmt: skip
    out, mass = kernels.stick_breaking_forward(*args, **opts)
    grads = kernels.stick_breaking_backward(
        grad_out, q, k, v, mass, *args[3:], bias_grad=True, **opts
    )
    ref, ref_grads = outputs_and_grads(
        vector_reference, q, k, v, lam, grad_out, torch.float64, causal=False,
        key_padding_mask=mask, qk_tables=tables,
    )  # fmt: skip
    assert_close(out, ref, FP32_TOL, "output")
    assert_grads_close(grads, ref_grads, FP32_TOL)


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
    kwargs = {
        "causal": causal, "scale": 1e4, "key_padding_mask": padding_mask(2, 70),
        "qk_tables": rope_tables(torch.arange(70, device=DEVICE), 16),
    }  # fmt: skip
    out, grads = outputs_and_grads(
        stick_breaking_attention, q, k, v, lam, grad_out, q.dtype, **kwargs
    )
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    # fp32 logits carry an absolute error of ~1e4 * 1e-7; the result still tracks float64.
    ref, ref_grads = outputs_and_grads(
        vector_reference, q, k, v, lam, grad_out, torch.float64, **kwargs
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
    tables = rope_tables(torch.arange(40, device=DEVICE), 16)
    kwargs = {"causal": True, "qk_tables": tables, "score_bias": ScoreBias("linear_distance", lam)}
    grads = [torch.autograd.grad(stick_breaking_attention(q, k, v, **kwargs).sum(), (q, k, v, lam))
             for _ in range(2)]  # fmt: skip
    for first, second in zip(*grads, strict=True):
        assert torch.equal(first, second), "the backward must be deterministic"
    contiguous = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    again = torch.autograd.grad(
        stick_breaking_attention(*contiguous, **kwargs).sum(), (*contiguous, lam)
    )
    for first, third in zip(grads[0], again, strict=True):
        assert torch.equal(first, third), "strided views must read exactly what copies hold"
    q64, k64, v64, lam64 = (t.detach().double().requires_grad_() for t in (q, k, v, lam))
    ref = vector_reference(
        q64, k64, v64, qk_tables=tables, score_bias=ScoreBias("linear_distance", lam64)
    )
    ref_grads = torch.autograd.grad(ref.sum(), (q64, k64, v64, lam64))
    assert_grads_close(grads[0], ref_grads, FP32_TOL)


def test_per_head_gradient_matches_autograd_of_explicit_weights():
    """``linear_distance`` without tables: the gradient of ``per_head`` (and q) against torch
    autograd of the explicit stick-breaking weights; none is returned where none is asked."""
    q, k, v, lam, grad_out = make_inputs(1, 2, 20, 16, seed=9, rse=True)
    pos = (torch.arange(20) * 2).to(DEVICE)
    q.requires_grad_()
    out = stick_breaking_attention(
        q, k, v, position_ids=pos, score_bias=ScoreBias("linear_distance", lam)
    )
    (dq,) = torch.autograd.grad(out, (q,), grad_out)
    assert torch.isfinite(dq).all() and dq.abs().max() > 0 and lam.grad is None
    lam.requires_grad_()
    bias = ScoreBias("linear_distance", lam)
    out = stick_breaking_attention(q, k, v, position_ids=pos, score_bias=bias)
    dq, dlam = torch.autograd.grad(out, (q, lam), grad_out)
    q64, lam64 = q.detach().double().requires_grad_(), lam.detach().double().requires_grad_()
    ref = loop_reference(
        q64, k, v, position_ids=pos, score_bias=ScoreBias("linear_distance", lam64)
    )
    ref_dq, ref_dlam = torch.autograd.grad(ref, (q64, lam64), grad_out.double())
    assert dlam.shape == lam.shape and dlam.dtype == lam.dtype
    assert_close(dq, ref_dq, FP32_TOL, "dq")
    assert_close(dlam, ref_dlam, FP32_TOL, "dper_head")


def test_shared_tables_and_gain_of_ones():
    """cos/sin ``[1, seq, D/2]`` (batch stride 0) == repeated per batch; gain None == ones."""
    q, k, v, lam, grad_out = make_inputs(2, 2, 30, 16, seed=10, rse=True)
    pos = torch.arange(30, device=DEVICE)
    shared = rope_tables(pos, 16)
    ones = torch.ones(16, device=DEVICE)
    variants = [shared, rope_tables(pos, 16, batch=2), replace(shared, gain=ones)]
    results = [
        outputs_and_grads(
            stick_breaking_attention,
            q,
            k,
            v,
            lam,
            grad_out,
            torch.float32,
            causal=False,
            qk_tables=tables,
        )  # fmt: skip
        for tables in variants
    ]
    for out, grads in results[1:]:
        assert torch.equal(out, results[0][0])
        for a, b in zip(grads, results[0][1], strict=True):
            assert torch.equal(a, b)
    other = replace(shared, gain=torch.linspace(0.5, 1.5, 16, device=DEVICE))
    out = stick_breaking_attention(q, k, v, causal=False, qk_tables=other)
    assert not torch.allclose(out, results[0][0])


def test_float16_inputs_keep_their_dtype():
    q, k, v, lam, grad_out = make_inputs(1, 2, 33, 16, seed=10, rse=True, dtype=torch.float16)
    tables = rope_tables(torch.arange(33, device=DEVICE), 16)
    compare(vector_reference, q, k, v, lam, grad_out, tol=2e-2, causal=True, qk_tables=tables)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    q, k, v, _, _ = make_inputs(2, 3, 10, 16, seed=11, rse=False)
    tables = rope_tables(torch.arange(10, device=DEVICE), 16)
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
        bias = ScoreBias("linear_distance", torch.ones(2, device=DEVICE))
        stick_breaking_attention(q, k, v, score_bias=bias)
    with pytest.raises(TypeError, match="floating-point"):
        bias = ScoreBias("linear_distance", torch.ones(3, dtype=torch.long))
        stick_breaking_attention(q, k, v, score_bias=bias)
    with pytest.raises(ValueError, match="unknown score-bias hook"):
        stick_breaking_attention(q, k, v, score_bias=ScoreBias("rse"))
    with pytest.raises(ValueError, match="layout"):
        stick_breaking_attention(q, k, v, qk_tables=replace(tables, layout="pairs"))
    with pytest.raises(ValueError, match="qk_tables.sin"):
        stick_breaking_attention(q, k, v, qk_tables=replace(tables, sin=tables.sin[:, :9]))
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
        pos = torch.arange(seq, device=DEVICE) * 3
        kwargs.update(qk_tables=rope_tables(pos, dim), position_ids=pos)
    out, grads = outputs_and_grads(
        stick_breaking_attention, q, k, v, lam, grad_out, dtype, **kwargs
    )
    assert out.dtype == dtype
    ref, ref_grads = outputs_and_grads(
        vector_reference, q, k, v, lam, grad_out, torch.float64, **kwargs
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
    tables = rope_tables(torch.arange(200, device=DEVICE), 64, layout="half")
    for causal in (True, False):
        out, grads = outputs_and_grads(
            stick_breaking_attention, q, k, v, lam, grad_out, dtype, causal=causal, scale=1e4,
            qk_tables=tables,
        )  # fmt: skip
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)


# --------------------------------------------------------------------------------------------
# Tiles and fast paths the interpreter's default configuration does not take
# --------------------------------------------------------------------------------------------


def _forced_config(monkeypatch, **fields):
    """Make the kernel wrappers use ``pick_config``'s choice with ``fields`` replaced."""
    kernels = runtime.load_kernel_module("stick_breaking")
    original = kernels.pick_config

    def patched(*args, **kwargs):
        cfg = original(*args, **kwargs)
        for name, value in fields.items():
            setattr(cfg, name, value)
        return cfg

    monkeypatch.setattr(kernels, "pick_config", patched)


@pytest.mark.parametrize("forward_rows", [32, 16])
@pytest.mark.parametrize("causal", [True, False])
def test_query_blocks_taller_than_key_blocks(monkeypatch, causal, forward_rows):
    """Backward query blocks of two key blocks (as on Hopper at head_dim 128, and at 64 with a
    score bias, where the forward's stay square): the peeled blocks beside the diagonal, the
    checkpoints between them and a ragged end (seq 70, key blocks of 16)."""
    _forced_config(
        monkeypatch, block_m=forward_rows, block_n=16, block_bwd=32, block_bwd_n=16,
        num_warps=4, bwd_warps=4,
    )  # fmt: skip
    batch, heads, seq, dim = 2, 2, 70, 16
    q, k, v, lam, grad_out = make_inputs(batch, heads, seq, dim, seed=14, rse=True)
    pos = torch.arange(seq, device=DEVICE) * 2
    kwargs = {
        "causal": causal, "key_padding_mask": padding_mask(batch, seq), "position_ids": pos,
        "qk_tables": rope_tables(pos, dim, layout="half"),
    }  # fmt: skip
    compare(vector_reference, q, k, v, lam, grad_out, **kwargs)


@pytest.mark.parametrize("causal", [True, False])
def test_float16_close_to_float64(causal):
    """float16 inputs stay within 2e-3 of a float64 reference (out, dq, dk, dv and the
    per-head gradient), half of the logs from the polynomial."""
    q, k, v, lam, grad_out = make_inputs(2, 2, 150, 32, seed=5, rse=True, dtype=torch.float16)
    pos = torch.arange(150, device=DEVICE) + 3
    kwargs = {
        "causal": causal, "key_padding_mask": padding_mask(2, 150), "position_ids": pos,
        "qk_tables": rope_tables(pos, 32),
    }  # fmt: skip
    compare(vector_reference, q, k, v, lam, grad_out, tol=2e-3, **kwargs)


def test_log2_1p_polynomial_error():
    """The polynomial for ``log2(1 + e)``, ``e`` in [0, 1], is within 2.3e-6 in float32."""
    import triton
    import triton.language as tl

    kernels = runtime.load_kernel_module("stick_breaking")

    @triton.jit
    def evaluate(x_ptr, y_ptr, FN: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, FN(tl.load(x_ptr + offs)))

    n = 1 << 16
    x = torch.linspace(0.0, 1.0, n, dtype=torch.float32, device=DEVICE)
    y = torch.empty_like(x)
    evaluate[(n // 1024,)](x, y, FN=kernels._log2_1p, BLOCK=1024)
    err = (y.double() - torch.log2(1.0 + x.double())).abs().max().item()
    assert err <= 2.3e-6, err
