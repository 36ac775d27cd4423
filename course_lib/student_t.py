"""Student's t distribution and Holm's correction, for every verdict over seeds the course prints.

* ``t_cdf(t, df) = P(T <= t)`` and ``t_two_sided_p(t, df) = P(|T| >= |t|) =
  I_{df/(df + t^2)}(df/2, 1/2)``, the regularised incomplete beta function
  (:func:`regularized_incomplete_beta`, by its continued fraction, modified Lentz);
* ``t_quantile(q, df)``, by bisection on :func:`t_cdf`;
* :func:`holm`: Holm's (1979) step-down adjusted p-values, which bound the chance of any false
  call in a family at ``alpha`` whatever the claims' dependence.

No SciPy: ``tests/test_student_t.py`` checks these against ``scipy.stats`` (a test-only
dependency) and against closed forms. The comparison (:mod:`course_lib.compare`) and the
notebooks' verdicts over seeds (:mod:`course_lib.teaching.seed_verdicts`) both use them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["holm", "regularized_incomplete_beta", "t_cdf", "t_quantile", "t_two_sided_p"]


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (converges fast for ``x < (a + 1)/(a + b + 2)``),
    evaluated by the modified Lentz method:
    ``1 / (1 + d_1 / (1 + d_2 / (1 + ...)))`` with
    ``d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))`` and
    ``d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m))``."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            return value
    raise ArithmeticError(f"the continued fraction of I_x({a}, {b}) at x={x} did not converge")


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b) = B(x; a, b) / B(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if a <= 0 or b <= 0:
        raise ValueError(f"a and b must be > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(t):
        return 0.0
    return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * t_two_sided_p(t, df)
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``t`` with ``P(T <= t) = q`` (bisection on :func:`t_cdf` to 1e-12)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must lie in (0, 1), got {q}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        low, high = high, 2.0 * high
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < q:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the order given: ``p_(k)`` (k-th smallest of ``m``) becomes
    ``max_{j <= k} min(1, (m - j + 1) p_(j))``. Reject hypothesis ``i`` at family-wise level
    ``alpha`` when its adjusted p-value is ``< alpha``."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
