"""Statistics over seeds: what every table, figure and verdict of the comparison is built from.

A comparison trains each (objective, arm) once per seed. :func:`by_arm` groups the runs;
:func:`spread` gives a metric's mean, sample standard deviation, minimum and maximum over the
seeds; :func:`paired` compares two arms seed by seed (seed ``s`` of both saw the same training
data in the same order, so the difference removes that shared luck) and calls a difference only
when every seed agrees on its sign (:attr:`Paired.verdict`); anything else is "within noise".

Metrics (:data:`METRICS`) are read from a run's results dict by name: ``val_loss``, ``bpb``,
``bucket0`` ... ``bucket3`` (loss by target position, :func:`course_lib.evaluate.
position_bucket_losses`), ``word_order``, ``retrieval`` (probe accuracies) and
``tokens_per_second``. A metric a run does not have (a probe not run, a bucket past a learned
table) is None and is left out of the spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["METRICS", "Paired", "Spread", "by_arm", "metric", "paired", "spread"]


def _bucket(index: int) -> Callable[[dict], float | None]:
    def read(result: dict) -> float | None:
        buckets = result.get("position_buckets", [])
        if index >= len(buckets) or buckets[index]["status"] != "ok":
            return None
        return buckets[index]["loss"]

    return read


def _probe(task: str) -> Callable[[dict], float | None]:
    def read(result: dict) -> float | None:
        return result["probes"].get(task, {}).get("accuracy")

    return read


#: metric name -> function reading it from one run's results dict (None when absent).
METRICS: dict[str, Callable[[dict], float | None]] = {
    "val_loss": lambda r: r["metrics"]["final_val_loss"],
    "bpb": lambda r: r["metrics"]["final_val_bits_per_byte"],
    **{f"bucket{k}": _bucket(k) for k in range(4)},
    "word_order": _probe("word_order"),
    "retrieval": _probe("retrieval"),
    "tokens_per_second": lambda r: r["metrics"]["tokens_per_second"],
}


def metric(result: dict, name: str) -> float | None:
    """The value of metric ``name`` in one run's results (None when the run has none)."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid: {', '.join(METRICS)}")
    return METRICS[name](result)


def by_arm(results: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """``{(objective, arm): [runs, by seed]}``, in the order of ``results``."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["objective"], r["arm"]), []).append(r)
    for runs in groups.values():
        runs.sort(key=lambda r: r["seed"])
    return groups


@dataclass(frozen=True)
class Spread:
    """A metric over seeds: ``values`` ``{seed: value}``, their mean, sample standard deviation
    (0 for one seed), minimum and maximum."""

    values: dict[int, float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values.values())

    @property
    def sd(self) -> float:
        return statistics.stdev(self.values.values()) if self.n > 1 else 0.0

    @property
    def low(self) -> float:
        return min(self.values.values())

    @property
    def high(self) -> float:
        return max(self.values.values())

    def text(self, digits: int = 3) -> str:
        """``mean ± sd`` (just the mean for one seed)."""
        if self.n == 1:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f}"


def spread(runs: list[dict], name: str) -> Spread | None:
    """Metric ``name`` over the seeds of ``runs`` (one arm); None if no run has it."""
    values = {r["seed"]: v for r in runs if (v := metric(r, name)) is not None}
    return Spread(values) if values else None


@dataclass(frozen=True)
class Paired:
    """``a - b`` seed by seed (only seeds both arms have). ``verdict``: ``"lower"`` or
    ``"higher"`` (``a`` than ``b``) when every seed's difference has that sign and there are
    at least two seeds, else ``"within noise"``."""

    differences: dict[int, float]

    @property
    def spread(self) -> Spread:
        return Spread(self.differences)

    @property
    def verdict(self) -> str:
        values = list(self.differences.values())
        if len(values) >= 2 and all(v < 0 for v in values):
            return "lower"
        if len(values) >= 2 and all(v > 0 for v in values):
            return "higher"
        return "within noise"

    def text(self, digits: int = 3) -> str:
        """``mean [min, max] (verdict)``."""
        s = self.spread
        return f"{s.mean:+.{digits}f} [{s.low:+.{digits}f}, {s.high:+.{digits}f}] ({self.verdict})"


def paired(results: list[dict], objective: str, a: str, b: str, name: str) -> Paired | None:
    """Metric ``name`` of arm ``a`` minus arm ``b`` for ``objective``, matched by seed; None
    when no seed has the metric in both."""
    groups = by_arm(results)
    left = {r["seed"]: metric(r, name) for r in groups.get((objective, a), [])}
    right = {r["seed"]: metric(r, name) for r in groups.get((objective, b), [])}
    diffs = {
        s: left[s] - right[s]
        for s in sorted(left)
        if s in right and left[s] is not None and right[s] is not None
    }
    if not diffs:
        return None
    if any(math.isnan(v) for v in diffs.values()):
        raise ValueError(f"NaN in the paired differences of {name} ({a} - {b}, {objective})")
    return Paired(diffs)
