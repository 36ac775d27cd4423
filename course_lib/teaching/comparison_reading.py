"""Reading the comparison's results in notebook 10: spreads, tested claims, checked prose.

:class:`Reading` wraps the runs of :func:`course_lib.compare.load_results` and the verdicts of
their family of claims (:func:`course_lib.compare.claims.judge`: every claim tested together,
Holm-corrected). Every statement the notebook makes about a difference goes through
:meth:`Reading.expect` (two arms), :meth:`Reading.expect_change` (a within-run difference against
zero) or :meth:`Reading.expect_bound` (an arm beyond a value): each prints the estimate, its 95%
interval and p-values, and raises an ``AssertionError`` if the verdict (or the magnitude the
prose gives, ``between=``) is not what the committed results say. A claim that is not in the
declared family (:func:`course_lib.compare.claims.questions` and the ablations) is refused: Holm
corrects for the claims that are declared, so a claim added in the notebook alone would escape
the correction. :meth:`Reading.expect_every_seed` states a plain fact about the committed seeds
(a theorem's consequence, such as exactly 1/2), not an inference.

:func:`null_calls` simulates what the rules call when nothing is there, for the notebook's
lesson on the sign rule and on Holm.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from course_lib.compare.claims import (
    Bound,
    Change,
    Difference,
    Verdict,
    judge,
    untested_questions,
)
from course_lib.compare.results import idle_probe_effect
from course_lib.compare.stats import METRICS, Paired, Spread, by_arm, holm, spread

__all__ = ["Reading", "null_calls"]


class Reading:
    """The committed runs, grouped by (objective, arm), their verdicts, and the notebook's
    checks."""

    def __init__(self, results: list[dict]) -> None:
        self.results = results
        self.runs = by_arm(results)
        self.verdicts = judge(results)
        self.checked = 0

    def arms(self, objective: str, *, ablations: bool = False) -> list[str]:
        """The arms with runs of ``objective`` (encodings only unless ``ablations``)."""
        return [
            arm
            for (o, arm), runs in self.runs.items()
            if o == objective and (ablations or runs[0]["arm"] == runs[0]["encoding"])
        ]

    def spread(self, objective: str, arm: str, metric_name: str) -> Spread | None:
        return spread(self.runs[objective, arm], metric_name)

    def per_seed(self, objective: str, arm: str, read: Callable[[dict], float]) -> Spread:
        """Any quantity ``read(run)`` over the seeds of one arm."""
        return Spread({r["seed"]: read(r) for r in self.runs[objective, arm]})

    def table(self, objective: str, metric_name: str, arms=None) -> None:
        """Print ``metric`` for each arm: mean [95% interval] over seeds, sorted by the mean."""
        digits = METRICS[metric_name].digits
        rows = []
        for arm in arms or self.arms(objective):
            value = self.spread(objective, arm, metric_name)
            if value is not None:
                rows.append((value.mean, arm, value))
        print(f"{objective}, {METRICS[metric_name].label} (mean [95% interval] over seeds):")
        for _, arm, value in sorted(rows):
            print(f"  {arm:18s} {value.interval_text(digits)}")

    def verdict(self, claim) -> Verdict:
        """The tested verdict of a declared claim (a KeyError says how to declare one)."""
        if claim not in self.verdicts:
            raise KeyError(
                f"{claim} is not in the family of tested claims: declare it in "
                "course_lib.compare.claims.questions (Holm corrects only for declared claims), "
                "or its arms have no runs with that metric"
            )
        return self.verdicts[claim]

    def _check(self, claim, verdict: str, between: tuple[float, float] | None) -> Verdict:
        tested = self.verdict(claim)
        print(f"{claim.describe()}: {tested.text()}")
        if tested.verdict != verdict:
            raise AssertionError(
                f"the text says {verdict!r} for {claim.describe()}; the results say "
                f"{tested.verdict!r} ({tested.text()})"
            )
        if between is not None and not between[0] <= tested.estimate <= between[1]:
            raise AssertionError(
                f"the text puts {claim.describe()} between {between[0]} and {between[1]}; the "
                f"estimate is {tested.estimate:.4f}"
            )
        self.checked += 1
        return tested

    def expect(
        self,
        objective: str,
        a: str,
        b: str,
        metric_name: str,
        verdict: str,
        *,
        between: tuple[float, float] | None = None,
    ) -> Verdict:
        """Print ``a - b`` of ``metric`` (paired over seeds) and assert its verdict
        (``"lower"``, ``"higher"`` or ``"within noise"``) and, with ``between``, the range of
        the mean difference the text states."""
        return self._check(Difference(objective, a, b, metric_name), verdict, between)

    def expect_change(
        self,
        objective: str,
        arm: str,
        metric_name: str,
        verdict: str,
        *,
        between: tuple[float, float] | None = None,
    ) -> Verdict:
        """The same for a within-run difference (e.g. ``context_gain@7L``) against zero."""
        return self._check(Change(objective, arm, metric_name), verdict, between)

    def expect_bound(
        self, objective: str, arm: str, metric_name: str, side: str, value: float, verdict: str
    ) -> Verdict:
        """The same for ``arm``'s mean of ``metric`` on ``side`` of ``value`` (verdict
        ``side`` or ``"not shown"``)."""
        return self._check(Bound(objective, arm, metric_name, side, value), verdict, None)

    def claims(
        self,
        *,
        objective: str | None = None,
        metric: str | tuple[str, ...] | None = None,
        kind: type | tuple[type, ...] | None = None,
        arm: str | None = None,
    ) -> list[Verdict]:
        """The tested verdicts of the family whose claim matches every filter given: its
        objective, metric name(s), kind (:class:`Difference`, :class:`Change`, :class:`Bound`)
        and an arm it involves; in the family's order."""
        metrics = (metric,) if isinstance(metric, str) else metric
        found = []
        for claim, verdict in self.verdicts.items():
            arms = (claim.a, claim.b) if isinstance(claim, Difference) else (claim.arm,)
            if (
                (objective is None or claim.objective == objective)
                and (metrics is None or claim.metric in metrics)
                and (kind is None or isinstance(claim, kind))
                and (arm is None or arm in arms)
            ):
                found.append(verdict)
        return found

    def say(self, verdicts: list[Verdict], *, called_only: bool = False) -> None:
        """Print each verdict on one line: the claim, the estimate with its 95% interval over
        seeds, the p-values and the verdict of the family's rule (called ones first)."""
        shown = [v for v in verdicts if v.called or not called_only]
        shown.sort(key=lambda v: not v.called)
        if not shown:
            print("  (no claim of this kind has runs yet)" if not verdicts else "  (none called)")
        for v in shown:
            print(f"  {v.claim.describe()}: {v.text()}")

    def say_left_out(self) -> None:
        """Print which verdicts would differ were the claims on the probes no arm cleared kept in
        the family (the rule that leaves them out was written after the runs were seen; the
        paragraph ``summary.md`` prints)."""
        for line in idle_probe_effect(self.results, self.verdicts) or [
            "No claims were left out after the runs were seen."
        ]:
            print(line)

    def say_untested(self, *, objective: str | None = None, metric: str | None = None) -> None:
        """Print the declared claims the family leaves out (matching ``objective`` and
        ``metric``), grouped by why (:func:`course_lib.compare.claims.untested_questions`)."""
        reasons: dict[str, list[str]] = {}
        for claim, why in untested_questions(self.results):
            if (objective is None or claim.objective == objective) and (
                metric is None or claim.metric == metric
            ):
                reasons.setdefault(why, []).append(claim.describe())
        if not reasons:
            print("  (every declared claim of this kind is tested)")
        for why, claims in reasons.items():
            print(f"  not tested ({len(claims)} claims): {why}")

    def expect_every_seed(
        self,
        objective: str,
        arm: str,
        what: str,
        read: Callable[[dict], float],
        holds: Callable[[float], bool],
    ) -> None:
        """Print ``read(run)`` for every seed of ``arm`` and assert ``holds`` for each: a fact
        about the committed runs (``what`` names it), for exact properties, not an inference
        about seeds not run."""
        values = {r["seed"]: read(r) for r in self.runs[objective, arm]}
        shown = ", ".join(f"{v:.3g}" for v in values.values())
        ok = all(holds(v) for v in values.values())
        print(f"{objective} {arm}: {what}: {shown} -> {'in every seed' if ok else 'FAILS'}")
        if not ok:
            raise AssertionError(f"{objective} {arm}: {what} does not hold: {values}")
        self.checked += 1


def null_calls(seeds: int, trials: int, claims: int = 1, seed: int = 0) -> dict[str, float]:
    """What each rule calls when nothing is there: ``trials`` simulated families of ``claims``
    comparisons, each ``seeds`` paired differences drawn from N(0, 1) (no true difference).
    Returns the fraction of families with at least one call by: the sign rule (every seed the
    same sign), the paired t-test at 0.05 with no correction, and with Holm's correction. A
    pure-Python generator, so every machine draws the same numbers."""
    rng = random.Random(seed)
    sign = plain = corrected = 0
    for _ in range(trials):
        family = [[rng.gauss(0.0, 1.0) for _ in range(seeds)] for _ in range(claims)]
        sign += any(all(x > 0 for x in d) or all(x < 0 for x in d) for d in family)
        p = [Paired(dict(enumerate(d))).p_value for d in family]
        plain += any(q < 0.05 for q in p)
        corrected += any(q < 0.05 for q in holm(p))
    return {
        "sign rule": sign / trials,
        "t-test": plain / trials,
        "t-test + Holm": corrected / trials,
    }
