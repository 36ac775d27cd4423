"""Reading the comparison's results in notebook 10: spreads, paired verdicts, checked claims.

:class:`Reading` wraps the runs of :func:`course_lib.compare.load_results`. Every statement the
notebook makes about them goes through :meth:`Reading.expect` (two arms, seed by seed) or
:meth:`Reading.expect_value` (one arm against a threshold, every seed): it prints the numbers and
raises an ``AssertionError`` if the committed results do not support the statement, so the
notebook's prose cannot drift from its data. A difference is called only when every seed agrees
on its sign (:class:`course_lib.compare.stats.Paired`), else it is "within noise".
"""

from __future__ import annotations

from collections.abc import Callable

from course_lib.compare.stats import Spread, by_arm, metric, paired, spread

__all__ = ["Reading"]

METRIC_NAMES = {
    "val_loss": "val loss",
    "bpb": "bits per byte",
    "word_order": "word order",
    "retrieval": "retrieval",
    "tokens_per_second": "tokens/s",
}


def _name(metric_name: str) -> str:
    if metric_name.startswith("bucket"):
        return f"loss at bucket {metric_name[6:]}"
    return METRIC_NAMES.get(metric_name, metric_name)


class Reading:
    """The committed runs, grouped by (objective, arm), with the checks the notebook makes."""

    def __init__(self, results: list[dict]) -> None:
        self.results = results
        self.runs = by_arm(results)
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

    def table(self, objective: str, metric_name: str, arms=None, digits: int = 3) -> None:
        """Print ``metric`` for each arm: mean ± sd [min, max], sorted by the mean."""
        rows = []
        for arm in arms or self.arms(objective):
            value = self.spread(objective, arm, metric_name)
            if value is not None:
                rows.append((value.mean, arm, value))
        print(f"{objective}, {_name(metric_name)} (mean ± sd [min, max] over seeds):")
        for _, arm, value in sorted(rows):
            print(
                f"  {arm:18s} {value.text(digits)}  [{value.low:.{digits}f}, "
                f"{value.high:.{digits}f}]"
            )

    def expect(self, objective: str, a: str, b: str, metric_name: str, verdict: str) -> None:
        """Print ``a - b`` of ``metric`` seed by seed and assert its verdict (``"lower"``,
        ``"higher"`` or ``"within noise"``)."""
        diff = paired(self.results, objective, a, b, metric_name)
        if diff is None:
            raise AssertionError(f"no seed has {metric_name} for both {a} and {b} ({objective})")
        digits = 2 if metric_name in ("word_order", "retrieval") else 3
        print(f"{objective}: {a} - {b}, {_name(metric_name)}: {diff.text(digits)}")
        if diff.verdict != verdict:
            raise AssertionError(
                f"the text says {a} is {verdict!r} than {b} on {metric_name} ({objective}); the "
                f"results say {diff.verdict!r}: {diff.differences}"
            )
        self.checked += 1

    def expect_value(
        self,
        objective: str,
        arm: str,
        what: str,
        read: Callable[[dict], float],
        holds: Callable[[float], bool],
    ) -> None:
        """Print ``read(run)`` for every seed of ``arm`` and assert ``holds`` for each; ``what``
        names the claim."""
        values = {r["seed"]: read(r) for r in self.runs[objective, arm]}
        shown = ", ".join(f"seed {s}: {v:.3g}" for s, v in values.items())
        ok = all(holds(v) for v in values.values())
        print(f"{objective} {arm}: {what}: {shown} -> {'holds in every seed' if ok else 'FAILS'}")
        if not ok:
            raise AssertionError(f"{objective} {arm}: {what} does not hold: {values}")
        self.checked += 1


def rise(bucket: int) -> Callable[[dict], float]:
    """``run -> loss at position bucket ``bucket`` minus the loss at bucket 0``."""

    def read(run: dict) -> float:
        return metric(run, f"bucket{bucket}") - metric(run, "bucket0")

    return read


def length_rise(multiple: int) -> Callable[[dict], float]:
    """``run -> loss at multiple x the training length minus at 1x`` (the same targets)."""

    def read(run: dict) -> float:
        by = {e["multiple"]: e for e in run["extrapolation"]}
        return by[multiple]["loss"] - by[1]["loss"]

    return read


__all__ += ["length_rise", "rise"]
