"""Inputs at the edges of what the kernels take: the right answer or a clear error, never garbage.

* Positions far from 0 (``arange(n) + 10**8``): the kernels read positions as int32 counted from
  each sequence's smallest one and every hook subtracts them in integers, so each score bias is
  exactly the one of ``arange(n)``, as in the reference (which subtracts int64). Past ``2^24``
  a float32 position would lose its low bits.
* RoPE's angles are float32 products ``p * w`` on both backends (one table): they agree at any
  position, and above ``2^24`` a position is rounded to float32 first (the precision the
  docstrings state).
"""

import pytest
import torch

from course_lib.attention import attention
from course_lib.encodings import REGISTRY
from course_lib.kernel_hooks import kernel_positions
from course_lib.runtime import kernel_device, kernels_available

needs_kernels = pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")

FAR = 10**8


def gen(seed):
    return torch.Generator().manual_seed(seed)


def bias_params(method, heads, seq, seed=0):
    """Learnable parameters of each score-bias method, as leaves."""
    g = gen(seed)
    if method == "alibi":
        return {"slopes": torch.rand(heads, generator=g) * 0.5}
    if method == "t5":
        return {"bias_table": torch.randn(heads, 32, generator=g)}
    if method == "rse":
        return {
            "distance_penalty": torch.rand(heads, generator=g) * 0.3,
            "stick_bias": torch.randn(heads, generator=g),
        }
    if method == "kerple":
        return {
            "r1": torch.rand(heads, generator=g) + 0.5,
            "r2": torch.rand(heads, generator=g) + 0.5,
        }
    return {}


BIAS_METHODS = [m for m in ("alibi", "t5", "rse", "exposb", "kerple") if m in REGISTRY]


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


def test_kernel_positions_are_exact_int32_offsets():
    """What the kernels read: each row minus its smallest position, int32; a span too large for
    int32 is refused with a clear error."""
    positions = torch.tensor([[FAR + 5, FAR, FAR + 9], [7, 3, 2**40]])
    with pytest.raises(ValueError, match="span"):
        kernel_positions(positions)
    got = kernel_positions(positions[:1])
    assert got.dtype == torch.int32 and got.tolist() == [[5, 0, 9]]
    assert kernel_positions(torch.tensor([[-(2**40), -(2**40) + 3]])).tolist() == [[0, 3]]


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
