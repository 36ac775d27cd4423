"""Properties of the reference encodings, as the field tests them."""

import math

import pytest
import torch

from course_lib.encodings import (
    apply_exposb,
    apply_rope,
    exposb_amplitude,
    exposb_band_gain,
    exposb_distance_bias,
    exposb_distance_factor,
    rope_half_permutation,
    sinusoidal_embedding,
    sinusoidal_shift_matrix,
    sinusoidal_table,
    stick_breaking_weights,
)

STYLES = ["interleaved", "half"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- sinusoidal ----------------------------------------------------------------------------------
def test_sinusoidal_table_matches_formula_entrywise():
    table = sinusoidal_table(50, 16)
    for p in (0, 1, 7, 49):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("shift", [1, 5, 37])
def test_sinusoidal_shift_is_a_fixed_rotation(shift):
    table = sinusoidal_table(200, 32)
    m = sinusoidal_shift_matrix(shift, 32)
    moved = table[: 200 - shift] @ m.T
    torch.testing.assert_close(moved, table[shift:], atol=1e-5, rtol=0)
    torch.testing.assert_close(m @ m.T, torch.eye(32), atol=1e-6, rtol=0)  # a rotation


def test_sinusoidal_embedding_of_any_positions_matches_table():
    pos = torch.tensor([[3, 0, 99]])
    torch.testing.assert_close(
        sinusoidal_embedding(pos, 8)[0], sinusoidal_table(100, 8)[[3, 0, 99]]
    )


def test_sinusoidal_rejects_odd_dim():
    with pytest.raises(ValueError, match="even"):
        sinusoidal_table(10, 7)


# -- RoPE ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", STYLES)
def test_rope_preserves_norms(style):
    x = torch.randn(2, 3, 20, 16, generator=gen())
    y = apply_rope(x, torch.arange(20) * 13, style=style)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("style", STYLES)
def test_rope_score_depends_only_on_offset(style):
    q, k = torch.randn(2, 1, 1, 1, 32, generator=gen(1)).unbind(0)

    def score(m, n):
        qm = apply_rope(q, torch.tensor([m]), style=style)
        kn = apply_rope(k, torch.tensor([n]), style=style)
        return (qm * kn).sum().item()

    for m, n in [(5, 2), (40, 3), (7, 30)]:
        for shift in (1, 100, 1000):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert abs(score(5, 2) - score(9, 2)) > 1e-3  # but it does depend on the offset


def test_rope_position_zero_is_identity_and_rotation_is_by_angle():
    x = torch.randn(1, 1, 1, 8, generator=gen(2))
    torch.testing.assert_close(apply_rope(x, torch.tensor([0])), x)
    # first pair rotated by p * base**0 = p radians
    y = apply_rope(x, torch.tensor([3]))
    c, s = math.cos(3), math.sin(3)
    expected = torch.tensor([x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c])
    torch.testing.assert_close(y[0, 0, 0, :2], expected.flatten(), atol=1e-6, rtol=0)


def test_interleaved_and_half_agree_after_channel_permutation():
    x = torch.randn(2, 2, 9, 16, generator=gen(3))
    pos = torch.arange(9) + 4
    perm = rope_half_permutation(16)
    torch.testing.assert_close(
        apply_rope(x, pos, style="interleaved")[..., perm],
        apply_rope(x[..., perm], pos, style="half"),
    )
    assert not torch.allclose(
        apply_rope(x, pos, style="interleaved"), apply_rope(x, pos, style="half")
    )


def test_rope_batched_position_ids_and_fp32_angles():
    x = torch.randn(2, 3, 5, 8, generator=gen(4))
    pos = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])
    y = apply_rope(x, pos)
    torch.testing.assert_close(y[1:], apply_rope(x[1:], pos[1]))
    # bf16 input: angles still fp32, so the result equals the fp32 rotation rounded once
    xb = x.to(torch.bfloat16)
    torch.testing.assert_close(
        apply_rope(xb, pos), apply_rope(xb.float(), pos).to(torch.bfloat16), atol=0, rtol=0
    )


def test_rope_rejects_odd_head_dim_and_bad_positions():
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.randn(1, 1, 4, 7), torch.arange(4))
    with pytest.raises(TypeError, match="integer"):
        apply_rope(torch.randn(1, 1, 4, 8), torch.arange(4.0))
    with pytest.raises(ValueError, match="seq"):
        apply_rope(torch.randn(1, 1, 4, 8), torch.arange(5))
    with pytest.raises(ValueError, match="style"):
        apply_rope(torch.randn(1, 1, 4, 8), torch.arange(4), style="neox")


# -- ExpoSB --------------------------------------------------------------------------------------
def test_exposb_three_formulas():
    pos = torch.tensor([0, 1000])
    torch.testing.assert_close(exposb_amplitude(pos), torch.tensor([1.2, 1 + 0.2 * math.exp(-1)]))
    g = exposb_band_gain(64)
    assert g.argmax().item() == 16 and g[16].item() == pytest.approx(1.2)
    assert g[63].item() == pytest.approx(0.8 + 0.4 * math.exp(-((63 - 16) ** 2) / (2 * 8**2)))
    f = exposb_distance_factor(torch.tensor([0, 100, 1000]))
    torch.testing.assert_close(
        f, torch.tensor([1.0, 0.7 + 0.3 * math.exp(-0.5), 0.7 + 0.3 * math.exp(-5)])
    )
    bias = exposb_distance_bias(torch.arange(3), torch.arange(3))
    torch.testing.assert_close(
        bias.exp(), exposb_distance_factor(torch.arange(3)[:, None] - torch.arange(3))
    )


def test_apply_exposb_is_gain_times_amplitude_times_rope():
    x = torch.randn(1, 2, 6, 16, generator=gen(5))
    pos = torch.arange(6) * 50
    expected = apply_rope(x, pos) * exposb_amplitude(pos)[:, None] * exposb_band_gain(16)
    torch.testing.assert_close(apply_exposb(x, pos), expected)


def test_exposb_is_not_shift_invariant_but_rope_is():
    """The amplitude 1 + 0.2 exp(-0.001 m) depends on m itself, so a common shift changes scores."""
    q, k = torch.randn(2, 1, 1, 1, 16, generator=gen(6)).unbind(0)

    def score(fn, m, n):
        return (fn(q, torch.tensor([m])) * fn(k, torch.tensor([n]))).sum().item()

    assert score(apply_rope, 3, 1) == pytest.approx(score(apply_rope, 503, 501), abs=1e-4)
    s0, s500 = score(apply_exposb, 3, 1), score(apply_exposb, 503, 501)
    assert abs(s0 - s500) > 1e-2 * abs(s0)


def test_exposb_band_gain_inside_a_pair_also_breaks_relativity():
    """g(d) differs between the two channels of a rotated pair, so even without the amplitude
    the score of (m, n) is not a function of m - n alone."""
    q, k = torch.randn(2, 1, 1, 1, 16, generator=gen(6)).unbind(0)
    gain = exposb_band_gain(16)

    def score(m, n):
        return (
            apply_rope(q, torch.tensor([m])) * gain * apply_rope(k, torch.tensor([n])) * gain
        ).sum()

    assert abs(score(3, 1) - score(503, 501)).item() > 1e-3
    even_gain = gain.view(-1, 2).mean(-1).repeat_interleave(2)  # same gain on both pair channels

    def score_even(m, n):
        qm, kn = apply_rope(q, torch.tensor([m])), apply_rope(k, torch.tensor([n]))
        return (qm * even_gain * kn * even_gain).sum()

    assert score_even(3, 1).item() == pytest.approx(score_even(503, 501).item(), abs=1e-4)


# -- stick-breaking ------------------------------------------------------------------------------
def loop_stick_breaking(z: torch.Tensor, causal: bool) -> torch.Tensor:
    """The formula, one key at a time (float64)."""
    n = z.shape[-1]
    out = torch.zeros_like(z, dtype=torch.float64)
    for i in range(n):
        sides = [range(i - 1, -1, -1)] + ([] if causal else [range(i + 1, n)])
        share = 1.0 if causal else 0.5
        for keys in sides:
            remaining = 1.0
            for j in keys:
                beta = 1 / (1 + math.exp(-z[i, j].item()))
                out[i, j] = share * beta * remaining
                remaining *= 1 - beta
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_stick_breaking_matches_direct_loop(causal):
    z = torch.randn(7, 7, generator=gen(7), dtype=torch.float64) * 2
    torch.testing.assert_close(
        stick_breaking_weights(z, causal=causal), loop_stick_breaking(z, causal)
    )


@pytest.mark.parametrize("causal", [True, False])
def test_stick_breaking_weights_are_a_sub_distribution(causal):
    z = torch.randn(3, 4, 33, 33, generator=gen(8)) * 3
    mask = torch.rand(3, 1, 1, 33, generator=gen(9)) > 0.3
    a = stick_breaking_weights(z, causal=causal, mask=mask)
    assert (a >= 0).all()
    assert (a.sum(-1) <= 1 + 1e-6).all()
    assert (a.masked_select(~mask.expand_as(a)) == 0).all()
    assert (a.diagonal(dim1=-2, dim2=-1) == 0).all()
    if causal:
        assert (a.triu() == 0).all()


def test_stick_breaking_masked_keys_do_not_break_the_stick():
    z = torch.randn(6, 6, generator=gen(10))
    keep = torch.tensor([True, False, True, True, False, True])
    a = stick_breaking_weights(z, mask=keep)
    kept = keep.nonzero().flatten()
    torch.testing.assert_close(a[kept][:, kept], stick_breaking_weights(z[kept][:, kept]))


@pytest.mark.parametrize("causal", [True, False])
def test_stick_breaking_finite_for_extreme_logits(causal):
    z = (torch.randn(1, 2, 16, 16, generator=gen(11)).sign() * 1e4).requires_grad_()
    a = stick_breaking_weights(z, causal=causal)
    assert torch.isfinite(a).all()
    a.sum().backward()
    assert torch.isfinite(z.grad).all()
    big = torch.full((5, 5), 1e4)
    # the nearest key takes the whole stick
    torch.testing.assert_close(stick_breaking_weights(big), torch.diag(torch.ones(4), -1))


def test_stick_breaking_with_self_and_suffix_queries():
    z = torch.randn(5, 5, generator=gen(12), dtype=torch.float64)
    with_self = stick_breaking_weights(z, include_self=True)
    assert (with_self.diagonal() > 0).all()
    # the last two queries of a 5-key sequence see the same weights as rows 3 and 4
    torch.testing.assert_close(stick_breaking_weights(z[3:]), stick_breaking_weights(z)[3:])
