"""KERPLE (Chi et al. 2022): the two kernels of the distance, their constraints, and the kernels.

The registry conformance tests already run KERPLE's record through every shared check (Triton
against the reference with the parameters' gradients, padding, cached decoding, shift
invariance, float64 gradcheck, errors); here: the formulas, the parametrisation, both variants in
both kernel families, and bad input.
"""

import math

import pytest
import torch

from course_lib.attention import attention, get_attention_class
from course_lib.encodings.kerple import KERPLE_VARIANTS, kerple_bias
from course_lib.runtime import kernel_device, kernels_available

needs_kernels = pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_the_two_kernels_by_their_formulas():
    d = torch.arange(-6, 7)
    r1, r2 = torch.tensor([0.5, 2.0]), torch.tensor([0.25, 1.5])
    log = kerple_bias(d, r1, r2, "log")
    power = kerple_bias(d, r1, r2, "power")
    for h in range(2):
        for i, dist in enumerate(d.tolist()):
            want_log = -r1[h] * math.log(1 + r2[h] * abs(dist))
            want_power = -r1[h] * abs(dist) ** r2[h]
            assert log[h, i].item() == pytest.approx(float(want_log), rel=1e-6, abs=1e-7)
            assert power[h, i].item() == pytest.approx(float(want_power), rel=1e-6, abs=1e-7)


def test_properties_worth_teaching():
    """Symmetric, 0 at distance 0, falling with distance; the power variant with r2 = 1 is
    ALiBi with slope r1; the log variant falls ever more slowly (its step from 64 to 512 is
    smaller than from 0 to 64, where a linear penalty's would be 7 times larger)."""
    d = torch.arange(0, 513)
    r1, r2 = torch.tensor([1.0]), torch.tensor([0.5])
    for variant in KERPLE_VARIANTS:
        b = kerple_bias(d, r1, r2, variant)[0]
        assert b[0] == 0 and bool((b[1:] < b[:-1]).all())
        assert torch.equal(kerple_bias(-d, r1, r2, variant), kerple_bias(d, r1, r2, variant))
    alibi_like = kerple_bias(d, torch.tensor([0.25]), torch.tensor([1.0]), "power")[0]
    torch.testing.assert_close(alibi_like, -0.25 * d.float())
    log = kerple_bias(d, r1, r2, "log")[0]
    assert (log[64] - log[512]) < (log[0] - log[64])


def test_power_exponent_gradient_is_finite_at_distance_zero():
    d = torch.arange(-3, 4)
    r1 = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    r2 = torch.tensor([1.3], dtype=torch.float64, requires_grad=True)
    kerple_bias(d, r1, r2, "power").sum().backward()
    assert torch.isfinite(r1.grad).all() and torch.isfinite(r2.grad).all()
    # d/dr2 of -r1 |d|^r2 = -r1 |d|^r2 log|d| (0 at d = 0)
    want = sum(-0.7 * abs(x) ** 1.3 * math.log(abs(x)) for x in d.tolist() if x)
    assert r2.grad.item() == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("variant", KERPLE_VARIANTS)
def test_the_module_keeps_its_parameters_in_range(variant):
    torch.manual_seed(0)
    module = get_attention_class("kerple")(32, 8, variant=variant)
    assert module.variant == variant
    r1, r2 = module.r1, module.r2
    assert r1.shape == r2.shape == (8,)
    assert bool((r1 >= 1e-2 - 1e-6).all()) and bool((r2 >= 1e-2 - 1e-6).all())
    if variant == "power":
        assert bool((r2 < 2).all())
    with torch.no_grad():  # any raw value stays in the allowed set
        module.r1_raw.fill_(-50.0)
        module.r2_raw.fill_(50.0)
    assert bool((module.r1 > 0).all()) and bool((module.r2 > 0).all())
    if variant == "power":
        assert bool((module.r2 <= 2).all())
    assert set(module.reported_values()) == {"r1", "r2"}
    assert {n for n, _ in module.named_parameters()} >= {"r1_raw", "r2_raw"}


def test_bad_input_is_refused_clearly():
    q = torch.randn(1, 2, 5, 8)
    ok = torch.ones(2)
    with pytest.raises(ValueError, match="r1 must be > 0"):
        attention(q, q, q, method="kerple", r1=torch.tensor([1.0, 0.0]), r2=ok)
    with pytest.raises(ValueError, match="0 < r2 <= 2"):
        attention(q, q, q, method="kerple", r1=ok, r2=torch.tensor([1.0, 2.5]), variant="power")
    with pytest.raises(ValueError, match="unknown KERPLE variant"):
        attention(q, q, q, method="kerple", r1=ok, r2=ok, variant="cubic")
    with pytest.raises(ValueError, match=r"r2 must have shape \[heads\]"):
        attention(q, q, q, method="kerple", r1=ok, r2=torch.ones(3))
    with pytest.raises(ValueError, match="unknown KERPLE variant"):
        get_attention_class("kerple")(16, 2, variant="cubic")


@needs_kernels
@pytest.mark.parametrize("normaliser", ["softmax", "stick_breaking"])
@pytest.mark.parametrize("variant", KERPLE_VARIANTS)
@pytest.mark.parametrize("causal", [True, False])
def test_both_variants_in_both_kernel_families(variant, normaliser, causal):
    """Triton (the variant's hook) against the reference: output and the gradients of q, k,
    v, r1 and r2; positions stepping by 2 from 9, padded keys, a ragged last tile."""
    device = kernel_device()
    batch, heads, seq, dim = 2, 3, 53, 16
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(1)).to(device).unbind(0)
    r1 = (torch.rand(heads, generator=gen(2)) + 0.2).to(device)
    r2 = (torch.rand(heads, generator=gen(3)) * 1.5 + 0.2).to(device)
    mask = (torch.arange(seq)[None] < torch.tensor([[seq], [seq - 8]])).to(device)
    positions = (torch.arange(seq) * 2 + 9).to(device)
    results = []
    for backend in ("reference", "triton"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, r1, r2)]
        out = attention(
            *leaves[:3], method="kerple", causal=causal, key_padding_mask=mask,
            position_ids=positions, normaliser=normaliser, backend=backend, r1=leaves[3],
            r2=leaves[4], variant=variant,
        )  # fmt: skip
        results.append([out, *torch.autograd.grad(out, leaves, up)])
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)


@needs_kernels
@pytest.mark.parametrize("variant", KERPLE_VARIANTS)
def test_the_kernels_compute_the_bias_from_any_positions(variant):
    """The hooks take ``|p_i - p_j|`` from the positions themselves (no table indexed by
    ``i - j``): positions with gaps, repeats and a large offset give the reference's output and
    gradients of r1 and r2."""
    from course_lib.encodings.kerple import KERPLE_HOOKS, kerple_kernel_bias

    device = kernel_device()
    heads = 2
    r1 = torch.tensor([0.7, 1.3], device=device)
    r2 = torch.tensor([0.4, 1.6], device=device)
    bias = kerple_kernel_bias({"r1": r1, "r2": r2, "variant": variant}, None)
    assert bias.hook is KERPLE_HOOKS[variant] and bias.per_head.shape == (heads, 2)
    q, k, v, up = torch.randn(4, 1, heads, 7, 16, generator=gen(4)).to(device).unbind(0)
    positions = (torch.tensor([0, 1, 2, 7, 8, 8, 40]) + 10**6).to(device)
    results = []
    for backend in ("reference", "triton"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, r1, r2)]
        out = attention(
            *leaves[:3], method="kerple", causal=True, position_ids=positions, r1=leaves[3],
            r2=leaves[4], variant=variant, backend=backend,
        )  # fmt: skip
        results.append([out, *torch.autograd.grad(out, leaves, up)])
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)
