"""Inputs at the edges of what the kernels take: the right answer or a clear error, never garbage.

* Positions far from 0 (``arange(n) + 10**8``): the wrappers subtract each sequence's smallest
  position in integers and the kernels read the rest as exact float32 integers, so each score
  bias is exactly the one of ``arange(n)``, as in the reference (which subtracts int64). Past
  ``2^24`` a float32 position would lose its low bits; a span that large is refused.
* RoPE's angles are float32 products ``p * w`` on both backends (one table): they agree at any
  position, and above ``2^24`` a position is rounded to float32 first (the precision the
  docstrings state).
* An infinite key: stick-breaking's weights are those of the limit on both backends.
* bf16 on the Triton backend: right everywhere (the CPU interpreter runs the float32 kernels,
  its bf16 products being wrong).
"""

import pytest
import torch
from test_bad_input import method_kwargs

from course_lib.attention import attention
from course_lib.encodings import REGISTRY
from course_lib.kernel_hooks import kernel_positions
from course_lib.registry import attention_methods
from course_lib.runtime import kernel_device, kernels_available, kernels_refuse_bf16

needs_kernels = pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")

FAR = 10**8


def gen(seed):
    return torch.Generator().manual_seed(seed)


def bias_params(method, heads, seq, seed=0):
    """The method's learnable tensors (its own module's parameters, as ``method_kwargs`` draws
    them), without the method name, positions or ``causal``."""
    kwargs = method_kwargs(method, batch=2, heads=heads, seq=seq, seed=seed)
    return {k: v for k, v in kwargs.items() if torch.is_tensor(v) and k != "position_ids"}


def _reads_positions_through_a_bias(encoding) -> bool:
    """A score bias of the positions (not of the scores, not of per-token gates), on a kernel."""
    return (
        (encoding.score_bias is not None or encoding.distance_bias is not None)
        and encoding.score_bias_from_scores is None
        and not encoding.per_key_params
        and not encoding.kernel_support
        and encoding.position_dims == 1
    )


BIAS_METHODS = sorted(n for n, e in REGISTRY.items() if _reads_positions_through_a_bias(e))


@needs_kernels
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("method", BIAS_METHODS)
def test_far_positions_give_the_reference_bias(method, causal):
    """Triton at ``arange(n) + 10**8`` equals the reference there: outputs and the gradients of
    q, k, v and the bias's own parameters; and for a bias alone (no RoPE, whose float32 angles
    are not exact there), the reference at ``arange(n)`` too."""
    device = kernel_device()
    batch, heads, seq, dim = 2, 3, 37, 16
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(1)).unbind(0)
    params = bias_params(method, heads, seq)
    near = torch.arange(seq)
    results = {}
    for name, positions, backend in (
        ("triton far", near + FAR, "triton"),
        ("reference far", near + FAR, "reference"),
        ("reference near", near, "reference"),
    ):
        leaves = {key: t.clone().to(device).requires_grad_() for key, t in params.items()}
        qkv = [t.clone().to(device).requires_grad_() for t in (q, k, v)]
        out = attention(
            *qkv, method=method, causal=causal, position_ids=positions.to(device),
            backend=backend, **leaves,
        )  # fmt: skip
        grads = torch.autograd.grad(out, [*qkv, *leaves.values()], up.to(device))
        results[name] = [out, *grads]
    alone = REGISTRY[method].qk_transform is None
    for name in ("reference far", "reference near") if alone else ("reference far",):
        for got, want in zip(results["triton far"], results[name], strict=True):
            torch.testing.assert_close(got.cpu(), want.cpu(), atol=2e-4, rtol=1e-3)


def test_kernel_positions_are_exact_offsets():
    """What the kernels read: each row minus its smallest position (subtracted in int64), as
    float32 integers; a span of ``2^24`` or more is refused with a clear error."""
    positions = torch.tensor([[FAR + 5, FAR, FAR + 9], [7, 3, 2**24 + 3]])
    with pytest.raises(ValueError, match="span 16777216"):
        kernel_positions(positions)
    got = kernel_positions(positions[:1])
    assert got.dtype == torch.float32 and got.tolist() == [[5.0, 0.0, 9.0]]
    assert kernel_positions(torch.tensor([[-(2**40), -(2**40) + 3]])).tolist() == [[0.0, 3.0]]
    assert kernel_positions(torch.tensor([[2**40, 2**40 + 2**24 - 1]])).tolist() == [
        [0.0, 2.0**24 - 1]
    ]


@needs_kernels
@pytest.mark.parametrize("method", ["rope", "exposb"])
def test_rope_tables_at_far_positions_agree_between_backends(method):
    """Both backends build RoPE's angles as the same float32 products ``p * w`` (positions
    rounded to float32 first), so they agree at ``10**8 + arange(n)``, forward and backward."""
    device = kernel_device()
    q, k, v, up = torch.randn(4, 1, 2, 40, 16, generator=gen(3)).to(device).unbind(0)
    positions = (torch.arange(40) + FAR).to(device)
    outs = []
    for backend in ("reference", "triton"):
        qkv = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attention(*qkv, method=method, causal=True, position_ids=positions, backend=backend)
        outs.append([out, *torch.autograd.grad(out, qkv, up)])
    for got, want in zip(*outs, strict=True):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)


def test_rope_angle_precision_is_that_of_float32_positions():
    """The documented precision: a position is converted to float32 before it is multiplied,
    so below ``2^24`` the angle is that of the exact position, and at ``10**8`` (float32 spacing
    8) a position moves by at most 4: the angle of pair ``t`` by at most ``4 w_t``."""
    from course_lib.encodings.rope import rope_angles, rope_inverse_frequencies

    inv_freq = rope_inverse_frequencies(16).double()
    for start, max_shift in ((2**24 - 64, 0), (FAR, 4)):
        positions = torch.arange(start, start + 64)
        exact = positions.double()[:, None] * inv_freq  # float64: exact positions
        got = rope_angles(positions, 16).double()
        bound = max_shift * inv_freq + 1e-7 * exact.abs()  # + float32 rounding of the product
        assert bool(((got - exact).abs() <= bound).all()), start


@needs_kernels
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, inf * 0
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("method", ["stick_breaking", "rse"])
def test_an_infinite_key_gives_what_the_reference_gives(method, causal):
    """A key with an infinite entry makes its logit +-inf: stick-breaking's weights are then those
    of the limit (``+inf`` takes the rest of the stick, ``-inf`` nothing), on both backends; with
    RSE the rotation mixes the infinity into both channels of its pair, and both backends give
    the same (non-finite where the reference's is)."""
    device = kernel_device()
    q, k, v = torch.randn(3, 1, 2, 9, 16, generator=gen(7)).unbind(0)
    k[0, 0, 3, 2] = float("inf")
    k[0, 1, 5, 7] = -float("inf")
    params = {"distance_penalty": torch.tensor([0.1, 0.3])} if method == "rse" else {}
    outs = [
        attention(
            q.to(device), k.to(device), v.to(device), method=method, causal=causal,
            backend=backend, **{key: t.to(device) for key, t in params.items()},
        ).cpu()
        for backend in ("reference", "triton")
    ]  # fmt: skip
    if method == "stick_breaking":
        assert torch.isfinite(outs[0]).all()
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5, equal_nan=True)


@needs_kernels
@pytest.mark.skipif(
    kernels_refuse_bf16(),
    reason="this GPU has no bf16 tensor cores: the kernels refuse bf16",
)
@pytest.mark.parametrize(
    "method", [n for n, e in attention_methods().items() if e is None or not e.kernel_support]
)
def test_bf16_on_the_triton_backend_is_right(method):
    """bf16 inputs: the reference computes in float32; the Triton backend runs its bf16 kernels
    on a GPU and, in the CPU interpreter (whose bf16 products are wrong), its float32 kernels.
    Either way the output and the gradients are bf16 and within bf16 rounding of the reference
    (before the fix the interpreter returned values near 1e9)."""
    device = kernel_device()
    q, k, v, up = torch.randn(4, 1, 2, 24, 16, generator=gen(8)).unbind(0)
    kwargs = method_kwargs(method, batch=1, heads=2, seq=24, device=device)
    results = []
    for backend in ("reference", "triton"):
        qkv = [t.to(device, torch.bfloat16).requires_grad_() for t in (q, k, v)]
        out = attention(*qkv, backend=backend, **kwargs)
        grads = torch.autograd.grad(out, qkv, up.to(device, torch.bfloat16))
        assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)
        results.append([out, *grads])
    for got, want in zip(*[[t.float().cpu() for t in r] for r in results][::-1], strict=True):
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)
