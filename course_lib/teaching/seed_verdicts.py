"""Verdicts from experiments run over several seeds: paired differences with confidence intervals.

A notebook that reads committed results over seeds states claims such as "PI is worse than
plain RoPE on positions 0-63" or "ALiBi gains less than 0.02 from the context past 64 tokens".
Each claim compares two arms **seed by seed** (seed ``s`` of both saw the same initialisation and
data, so the difference removes that shared luck) and rests on the Student-t confidence interval
of the mean difference::

    mean +- t_{1 - alpha / (2 m), n - 1} * sd / sqrt(n)

over ``n`` seeds, with the **Bonferroni correction** for the ``m`` claims the notebook makes (each
interval at level ``1 - alpha / m``, so all of them hold together with probability at least
``1 - alpha``). :class:`SeedClaims` holds that family: ``expect`` prints a claim's numbers and
raises an ``AssertionError`` when the interval does not support it, so prose cannot drift from
data. Verdicts:

* ``"higher"`` / ``"lower"``: the interval lies above ``+margin`` / below ``-margin``;
* ``"within"``: the interval lies inside ``(-margin, +margin)`` (the two are equivalent to that
  margin);
* ``"within noise"``: the interval contains 0 (no difference shown; not a proof of equality).

The t quantile comes from :mod:`course_lib.student_t` (the project's one implementation, no
statistics package).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course_lib.student_t import t_quantile

__all__ = ["VERDICTS", "PairedDifference", "SeedClaims"]

VERDICTS = ("higher", "lower", "within", "within noise")


@dataclass(frozen=True)
class PairedDifference:
    """``a - b`` seed by seed and the t interval of its mean at confidence ``level``."""

    differences: tuple[float, ...]
    level: float

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.differences)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.differences)

    @property
    def half_width(self) -> float:
        """``t_{(1 + level) / 2, n - 1} sd / sqrt(n)``."""
        quantile = t_quantile(0.5 + self.level / 2.0, self.n - 1)
        return quantile * self.sd / math.sqrt(self.n)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def verdict(self, margin: float = 0.0) -> str:
        """What the interval supports, with ``margin`` (>= 0) as in the module docstring:
        ``"higher"``, ``"lower"``, ``"within"`` (only when ``margin > 0``) or ``"within noise"``."""
        if self.low > margin:
            return "higher"
        if self.high < -margin:
            return "lower"
        if margin > 0 and -margin < self.low and self.high < margin:
            return "within"
        return "within noise"

    def text(self, digits: int = 3) -> str:
        """``mean [low, high]`` with ``digits`` decimals."""
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


class SeedClaims:
    """The claims one notebook makes about results over seeds, checked as a family of ``family``
    claims at joint confidence ``confidence`` (Bonferroni: each at ``1 - (1 - confidence) /
    family``)."""

    def __init__(self, family: int, confidence: float = 0.95) -> None:
        if not isinstance(family, int) or family < 1:
            raise ValueError(
                f"family must be the number of claims (an integer >= 1), got {family!r}"
            )
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        self.family = family
        self.confidence = confidence
        self.checked = 0  # claims tested with an interval (they share the correction)
        self.per_seed = 0  # statements checked seed by seed (no interval, no correction)

    @property
    def level(self) -> float:
        """The confidence of each claim's interval."""
        return 1.0 - (1.0 - self.confidence) / self.family

    def paired(self, a: Sequence[float], b: Sequence[float]) -> PairedDifference:
        """``a - b`` seed by seed (``a`` and ``b`` in the same seed order, at least 2 seeds)."""
        if len(a) != len(b) or len(a) < 2:
            raise ValueError(
                f"a paired comparison needs the same seeds on both sides, at least 2; got "
                f"{len(a)} and {len(b)} values"
            )
        values = tuple(float(x) - float(y) for x, y in zip(a, b, strict=True))
        if any(math.isnan(v) for v in values):
            raise ValueError(f"NaN in the paired differences: {values}")
        return PairedDifference(values, self.level)

    def expect(
        self,
        what: str,
        a: Sequence[float],
        b: Sequence[float],
        verdict: str,
        margin: float = 0.0,
        digits: int = 3,
    ) -> PairedDifference:
        """Print ``what``, the mean of ``a - b`` over seeds and its interval, and assert that the
        interval supports ``verdict`` (one of :data:`VERDICTS`) with ``margin``."""
        if verdict not in VERDICTS:
            raise ValueError(
                f"unknown verdict {verdict!r}; valid: {', '.join(map(repr, VERDICTS))}"
            )
        if verdict == "within" and margin <= 0:
            raise ValueError("the verdict 'within' needs a margin > 0")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin!r}")
        self._count()
        diff = self.paired(a, b)
        got = diff.verdict(margin)
        band = {"higher": f"> +{margin:g}", "lower": f"< -{margin:g}",
                "within": f"inside ±{margin:g}", "within noise": "contains 0"}[verdict]  # fmt: skip
        print(f"{what}: {diff.text(digits)} -> {verdict} ({band})")
        if got != verdict:
            raise AssertionError(
                f"{what}: the text says {verdict!r} (interval {band}); over the seeds the "
                f"interval is [{diff.low:+.4f}, {diff.high:+.4f}] ({got!r}); per seed: "
                f"{[round(v, 4) for v in diff.differences]}"
            )
        return diff

    def expect_every_seed(
        self, what: str, values: Sequence[float], holds: Callable[[float], bool], digits: int = 2
    ) -> None:
        """Print ``values`` (one per seed) and assert ``holds`` for every one of them: a
        statement about each seed, not an estimate, so it takes no share of the correction."""
        self.per_seed += 1
        shown = ", ".join(f"{v:.{digits}f}" for v in values)
        ok = len(values) > 0 and all(holds(v) for v in values)
        print(f"{what}: {shown} -> {'every seed' if ok else 'FAILS'}")
        if not ok:
            raise AssertionError(f"{what} does not hold in every seed: {list(values)}")

    def summary(self) -> str:
        """One line: how many claims were checked, at which level each."""
        return (
            f"{self.checked} of {self.family} claims checked with intervals, each at "
            f"{100 * self.level:.2f}% (jointly at least {100 * self.confidence:.0f}%); "
            f"{self.per_seed} statements checked in every seed"
        )

    def _count(self) -> None:
        if self.checked >= self.family:
            raise AssertionError(
                f"more claims than the family of {self.family} the corrections were made for: "
                "raise the family size"
            )
        self.checked += 1
