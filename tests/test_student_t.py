"""Student's t distribution, the incomplete beta function and Holm's correction
(:mod:`course_lib.student_t`) against ``scipy.stats`` (a test-only dependency), closed forms and
a worked example."""

from __future__ import annotations

import math
import random

import pytest

from course_lib.student_t import (
    holm,
    regularized_incomplete_beta,
    t_cdf,
    t_quantile,
    t_two_sided_p,
)

scipy_stats = pytest.importorskip("scipy.stats")
scipy_special = pytest.importorskip("scipy.special")


# -- the t distribution -----------------------------------------------------------------------


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 10, 30])
@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.0, 2.776, 5.0, 12.0, 60.0])
def test_t_distribution_matches_scipy(df, t):
    assert t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), rel=1e-10, abs=1e-14)
    assert t_cdf(-t, df) == pytest.approx(scipy_stats.t.cdf(-t, df), rel=1e-10, abs=1e-14)
    two_sided = 2 * scipy_stats.t.sf(abs(t), df)
    assert t_two_sided_p(t, df) == pytest.approx(two_sided, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("df", [1, 2, 4, 5, 9, 29])
@pytest.mark.parametrize("q", [0.6, 0.9, 0.975, 0.995, 0.9999])
def test_t_quantile_matches_scipy(df, q):
    assert t_quantile(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), rel=1e-9)
    assert t_quantile(1 - q, df) == pytest.approx(scipy_stats.t.ppf(1 - q, df), rel=1e-9)


@pytest.mark.parametrize("a, b", [(0.5, 0.5), (2.0, 0.5), (1.5, 3.0), (10.0, 0.5), (0.7, 8.0)])
@pytest.mark.parametrize("x", [0.0, 1e-6, 0.2, 0.5, 0.9, 1.0])
def test_incomplete_beta_matches_scipy(a, b, x):
    expected = scipy_special.betainc(a, b, x)
    assert regularized_incomplete_beta(a, b, x) == pytest.approx(expected, rel=1e-10, abs=1e-15)


def test_t_distribution_by_hand():
    # one degree of freedom is the Cauchy distribution: P(T <= t) = 1/2 + atan(t) / pi
    for t in (0.5, 1.0, 3.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, rel=1e-12)
    # two degrees of freedom: P(T <= t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (0.5, 1.0, 3.0):
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), rel=1e-12)
    # the textbook value: t_{0.975} with 4 degrees of freedom is 2.776
    assert t_quantile(0.975, 4) == pytest.approx(2.7764451, abs=1e-6)
    with pytest.raises(ValueError, match="q must lie in"):
        t_quantile(1.0, 4)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_two_sided_p(1.0, 0)


# -- Holm ---------------------------------------------------------------------------------------


def test_holm_by_hand_and_by_definition():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, max(0.04, 0.06), max(0.06, 0.06), max(., 0.5)
    assert holm([0.03, 0.01, 0.5, 0.02]) == pytest.approx([0.06, 0.04, 0.5, 0.06])
    rng = random.Random(1)
    for _ in range(50):
        p = [rng.random() ** 3 for _ in range(rng.randint(1, 12))]
        adjusted = holm(p)
        order = sorted(range(len(p)), key=p.__getitem__)
        for k, i in enumerate(order):
            want = max(min(1.0, (len(p) - j) * p[order[j]]) for j in range(k + 1))
            assert adjusted[i] == pytest.approx(want)
        # the step-down procedure: reject while p_(k) <= alpha / (m - k)
        alpha, rejected = 0.05, set()
        for k, i in enumerate(order):
            if p[i] > alpha / (len(p) - k):
                break
            rejected.add(i)
        assert rejected == {i for i, q in enumerate(adjusted) if q <= alpha}
