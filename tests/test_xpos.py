"""xPos (Sun et al. 2022): RoPE with queries scaled by zeta^(n/s) and keys by zeta^(-m/s).

The registry conformance tests run xPos's record through every shared check (Triton against the
reference with gradients, padding, cached decoding with the keys' own transform, shift
invariance, gradcheck, errors); here: the decay rates, the score's dependence on the offset
alone, the decay itself, RoPE as its limit, the asymmetric kernel tables in both kernel
families, and bad input.
"""

import pytest
import torch

from course_lib.attention import attention, get_attention_class
from course_lib.encodings import apply_rope
from course_lib.encodings.xpos import apply_xpos, xpos_decay, xpos_kernel_tables
from course_lib.runtime import kernel_device, kernels_available

needs_kernels = pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_decay_rates_are_the_papers():
    """``zeta_t = (t / (D/2) + 0.4) / 1.4``: from 0.4/1.4 for the fastest pair towards 1."""
    zeta = xpos_decay(16)
    want = (torch.arange(8) / 8 + 0.4) / 1.4
    torch.testing.assert_close(zeta, want)
    assert zeta[0].item() == pytest.approx(0.4 / 1.4) and bool((zeta < 1).all())
    assert bool((zeta[1:] > zeta[:-1]).all())


def _score(q, k, n, m, **kw):
    qn = apply_xpos(q, torch.tensor([n]), side="query", **kw)
    km = apply_xpos(k, torch.tensor([m]), side="key", **kw)
    return (qn * km).sum(-1).item()


def test_the_score_depends_on_the_offset_only_and_decays_per_pair():
    q, k = torch.randn(2, 1, 16, generator=gen(0), dtype=torch.float64)
    for n, m in ((9, 4), (30, 2)):
        base = _score(q, k, n, m)
        for shift in (1, 17, 300):
            # (RoPE's angles are float32 products, as the reference's: equal to their rounding)
            assert _score(q, k, n + shift, m + shift) == pytest.approx(base, rel=1e-6)
    # one pair alone: the product of the scales is zeta_t^((n - m)/s), times RoPE's score
    zeta = xpos_decay(16).double()
    for t in (0, 5):
        only = torch.zeros(1, 16, dtype=torch.float64)
        only[0, 2 * t : 2 * t + 2] = 1.0
        rope = (apply_rope(only, torch.tensor([40])) * apply_rope(only, torch.tensor([10]))).sum()
        got = _score(only, only, 40, 10)
        assert got == pytest.approx(float(zeta[t] ** (30 / 512) * rope), rel=1e-6)


def test_a_huge_scale_base_is_rope():
    x = torch.randn(1, 2, 9, 16, generator=gen(1))
    p = torch.arange(9) + 3
    for side in ("query", "key"):
        got = apply_xpos(x, p, side=side, scale_base=1e12)
        torch.testing.assert_close(got, apply_rope(x, p))


def test_the_kernel_tables_give_keys_their_own_scale():
    positions = torch.arange(6)[None] + 100
    tables = xpos_kernel_tables(positions, 16, {"base": 10000.0, "style": "interleaved",
                                                "gamma": 0.4, "scale_base": 512.0})  # fmt: skip
    assert tables.key_cos is not None and tables.key_cos.shape == tables.cos.shape
    zeta = xpos_decay(16)
    # cos_q * cos_k + sin_q * sin_k = zeta^0 * (cos^2 + sin^2) = 1 at the same position
    product = tables.cos * tables.key_cos + tables.sin * tables.key_sin
    torch.testing.assert_close(product, torch.ones_like(product))
    # the scales are taken from the middle of the positions (102 here), so position 100 has
    # cos_q / cos_k = zeta^(2 (100 - 102) / 512), and the product over a pair is zeta^((n - m)/s)
    ratio = (tables.cos / tables.key_cos)[0, 0]
    torch.testing.assert_close(ratio, zeta ** (2 * (100 - 102) / 512), rtol=1e-5, atol=0)
    far = xpos_kernel_tables(positions + 10**6, 16, {"base": 10000.0, "style": "interleaved",
                                                     "gamma": 0.4, "scale_base": 512.0})  # fmt: skip
    assert float(far.key_cos.abs().max()) < 2.0  # a shift moves the angles, never the scales


def test_bad_input_is_refused_clearly():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="causal only"):
        attention(q, q, q, method="xpos")
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        attention(q, q, q, method="xpos", causal=True, gamma=0.0)
    with pytest.raises(TypeError, match="scale_base must be a number"):
        attention(q, q, q, method="xpos", causal=True, scale_base="512")
    with pytest.raises(ValueError, match="scale_base must be a finite number > 0"):
        get_attention_class("xpos")(16, 2, scale_base=float("inf"))


@needs_kernels
@pytest.mark.parametrize("normaliser", ["softmax", "stick_breaking"])
@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_asymmetric_tables_in_both_kernel_families(normaliser, style):
    """Triton (query and key tables of their own) against the reference: output and the
    gradients of q, k, v; positions from 700 (scales far from 1), padded keys, ragged tile."""
    device = kernel_device()
    batch, heads, seq, dim = 2, 2, 45, 32
    q, k, v, up = torch.randn(4, batch, heads, seq, dim, generator=gen(4)).to(device).unbind(0)
    mask = (torch.arange(seq)[None] < torch.tensor([[seq], [seq - 5]])).to(device)
    positions = (torch.arange(seq) + 700).to(device)
    results = []
    for backend in ("reference", "triton"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attention(
            *leaves, method="xpos", causal=True, key_padding_mask=mask, position_ids=positions,
            normaliser=normaliser, backend=backend, style=style,
        )  # fmt: skip
        results.append([out, *torch.autograd.grad(out, leaves, up)])
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)
