"""Statistics over seeds: what every table, figure and verdict of the comparison is built from.

A comparison trains each (objective, arm) once per seed. :func:`by_arm` groups the runs;
:func:`spread` gives a metric's mean, sample standard deviation, 95% confidence interval,
minimum and maximum over the seeds; :func:`paired` compares two arms seed by seed (seed ``s`` of
both saw the same training data in the same order and were scored on the same text, so the
difference removes that shared luck).

The tests (all on the per-seed values, ``n`` seeds, ``d_s`` the paired differences):

* **paired t-test**: ``t = mean(d) / (sd(d) / sqrt(n))`` with ``n - 1`` degrees of freedom
  (Student 1908); two-sided p-value ``P(|T| >= |t|) = I_{nu/(nu + t^2)}(nu/2, 1/2)``, the
  regularised incomplete beta function (:func:`regularized_incomplete_beta`); the 95% interval
  ``mean(d) +- t_{0.975, n-1} sd(d) / sqrt(n)``;
* **one-sample bound**: is an arm's value above (or below) a stated threshold? The one-sided
  t-test of ``mean - threshold`` (:func:`bound_test`);
* **Holm's step-down correction** (Holm 1979, :func:`holm`): the ``m`` p-values of a family,
  sorted, ``p_(k)`` compared with ``alpha / (m - k + 1)``; as adjusted p-values
  ``max_{j <= k} min(1, (m - j + 1) p_(j))``. It bounds the chance of *any* false call among the
  ``m`` at ``alpha`` whatever their dependence; without it, 50 true-null comparisons at 0.05
  make at least one false call 92% of the time.

The verdicts (what a family of claims concludes, :mod:`course_lib.compare.claims`) use these
with a minimum effect size per kind of metric (:data:`MIN_EFFECT`): a direction is called only
when the corrected test rejects *and* the estimated effect is at least that large.

The t distribution, its quantile and Holm's correction come from :mod:`course_lib.student_t`
(no SciPy; the notebooks' verdicts over seeds use the same module), re-exported here;
``tests/test_student_t.py`` checks them against ``scipy.stats`` and hand-computed cases.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course_lib.student_t import (
    holm,
    regularized_incomplete_beta,
    t_cdf,
    t_quantile,
    t_two_sided_p,
)

__all__ = [
    "ALPHA",
    "METRICS",
    "MIN_EFFECT",
    "Metric",
    "OneSample",
    "Paired",
    "Spread",
    "bound_test",
    "by_arm",
    "holm",
    "metric",
    "metric_blocks",
    "metric_units",
    "paired",
    "regularized_incomplete_beta",
    "spread",
    "t_cdf",
    "t_quantile",
    "t_two_sided_p",
]

#: The family-wise error rate every verdict controls (Holm).
ALPHA = 0.05

#: The smallest effect a verdict may call, by kind of metric: a loss (nats per byte) or a rise
#: of a loss, and a probe accuracy.
MIN_EFFECT = {"loss": 0.02, "accuracy": 0.05}


# ---------------------------------------------------------------------------------------------
# Metrics: what is read from one run's results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """A quantity read from one run's results dict: ``read(result)`` (None when the run has
    none), its ``kind`` (``"loss"``, ``"accuracy"`` or ``"other"``: which minimum effect a
    verdict needs), a ``label`` for tables and the ``digits`` it is printed with. ``units``
    (when the value is a mean over evaluation units: windows of text, probe pairs) returns
    ``(sums, counts)`` per unit, so the evaluation set's own noise can be bootstrapped;
    ``blocks`` (text metrics) returns the document of each unit (windows of one document are
    resampled together; None: the units are independent, as generated probe examples are)."""

    name: str
    label: str
    kind: str
    read: Callable[[dict], float | None]
    units: Callable[[dict], tuple[list[float], list[float]] | None] | None = None
    digits: int = 3
    blocks: Callable[[dict], list[int] | None] | None = None

    @property
    def bounds(self) -> tuple[float, float]:
        """The values the metric can take: an accuracy lies in [0, 1]; a loss is not bounded
        above (its interval is left as it is)."""
        return (0.0, 1.0) if self.kind == "accuracy" else (-math.inf, math.inf)


def _evaluation(name: str) -> Callable[[dict], float | None]:
    def read(result: dict) -> float | None:
        entry = result.get("evaluation", {}).get(name)
        return None if entry is None or entry.get("status") != "ok" else entry["loss"]

    return read


def _evaluation_units(name: str) -> Callable[[dict], tuple[list[float], list[float]] | None]:
    def read(result: dict) -> tuple[list[float], list[float]] | None:
        entry = result.get("evaluation", {}).get(name)
        if entry is None or entry.get("status") != "ok":
            return None
        return entry["unit_sums"], entry["unit_counts"]

    return read


def _documents(field: str) -> Callable[[dict], list[int] | None]:
    """The document of each window of a run's test text (``data[field]``; None when the run
    does not record it)."""

    def read(result: dict) -> list[int] | None:
        return result.get("data", {}).get(field)

    return read


_TEST_DOCUMENTS = _documents("test_window_documents")
_LONG_DOCUMENTS = _documents("long_window_documents")


def _rise(name: str, base: str) -> Callable[[dict], float | None]:
    """The loss of ``name`` minus that of ``base`` (the same targets)."""

    def read(result: dict) -> float | None:
        a, b = _evaluation(name)(result), _evaluation(base)(result)
        return None if a is None or b is None else a - b

    return read


def _rise_units(name: str, base: str):
    def read(result: dict):
        a, b = _evaluation_units(name)(result), _evaluation_units(base)(result)
        if a is None or b is None:
            return None
        return [x - y for x, y in zip(a[0], b[0], strict=True)], a[1]

    return read


def _probe(task: str) -> Callable[[dict], float | None]:
    def read(result: dict) -> float | None:
        return result["probes"].get(task, {}).get("accuracy")

    return read


def _probe_units(task: str):
    def read(result: dict):
        probe = result["probes"].get(task)
        if probe is None:
            return None
        return probe["unit_correct"], probe["unit_count"]

    return read


def _learned(name: str, pick: Callable[[list[float]], float]) -> Callable[[dict], float | None]:
    def read(result: dict) -> float | None:
        values = [
            v for layer in result.get("learned_values", {}).values() for v in layer.get(name, [])
        ]
        return pick(values) if values else None

    return read


def _metrics() -> dict[str, Metric]:
    metrics = [
        Metric(
            "val_loss",
            "test loss",
            "loss",
            _evaluation("val"),
            _evaluation_units("val"),
            blocks=_TEST_DOCUMENTS,
        ),
        Metric(
            "bpb",
            "bits per byte",
            "other",
            lambda r: None if (v := _evaluation("val")(r)) is None else v / math.log(2.0),
        ),
        Metric(
            "word_order",
            "word order",
            "accuracy",
            _probe("word_order"),
            _probe_units("word_order"),
            2,
        ),  # fmt: skip
        Metric(
            "retrieval", "retrieval", "accuracy", _probe("retrieval"), _probe_units("retrieval"), 2
        ),  # fmt: skip
        Metric(
            "tokens_per_second",
            "tokens/s",
            "other",
            lambda r: r.get("timing", {}).get("tokens_per_second"),
            None,
            0,
        ),  # fmt: skip
        Metric(
            "lambda_min",
            "smallest learned lambda",
            "other",
            _learned("distance_penalty", min),
            None,
            4,
        ),  # fmt: skip
        Metric(
            "lambda_max",
            "largest learned lambda",
            "other",
            _learned("distance_penalty", max),
            None,
            4,
        ),  # fmt: skip
    ]
    # The position/context measurements (course_lib.evaluate.shift_and_context_losses), named
    # by the targets' offset as a multiple of the training length L: at offset kL, the same L
    # targets read at positions 0.. (near), at kL.. with the same L tokens of context (shift: a
    # position change only), and at kL.. inside the long window (long: the positions and all
    # the context before them); and the loss by position bucket of the long windows (bucket<k>).
    for multiple in range(1, 8):
        tag = f"@{multiple}L"
        for what, label in (
            ("near", "read at 0.."),
            ("shift", "shifted"),
            ("long", "long context"),
        ):
            name = f"{what}{tag}"
            metrics.append(
                Metric(
                    name,
                    f"targets at {multiple}L, {label}",
                    "loss",
                    _evaluation(name),
                    _evaluation_units(name),
                    blocks=_LONG_DOCUMENTS,
                )  # fmt: skip
            )
        metrics.append(
            Metric(f"shift_cost{tag}", f"cost of shifting the targets to {multiple}L", "loss",
                   _rise(f"shift{tag}", f"near{tag}"), _rise_units(f"shift{tag}", f"near{tag}"),
                   blocks=_LONG_DOCUMENTS)
        )  # fmt: skip
        metrics.append(
            Metric(f"context_gain{tag}", f"long context minus shifted, targets at {multiple}L",
                   "loss", _rise(f"long{tag}", f"shift{tag}"),
                   _rise_units(f"long{tag}", f"shift{tag}"), blocks=_LONG_DOCUMENTS)
        )  # fmt: skip
    for k in range(4):
        metrics.append(
            Metric(
                f"bucket{k}",
                f"long windows, bucket {k}",
                "loss",
                _evaluation(f"bucket{k}"),
                _evaluation_units(f"bucket{k}"),
                blocks=_LONG_DOCUMENTS,
            )  # fmt: skip
        )
    return {m.name: m for m in metrics}


#: metric name -> :class:`Metric`.
METRICS: dict[str, Metric] = _metrics()


def _get(name: str) -> Metric:
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid: {', '.join(METRICS)}")
    return METRICS[name]


def metric(result: dict, name: str) -> float | None:
    """The value of metric ``name`` in one run's results (None when the run has none)."""
    return _get(name).read(result)


def metric_units(result: dict, name: str) -> tuple[list[float], list[float]] | None:
    """``(sums, counts)`` per evaluation unit of metric ``name`` (None when it has none)."""
    units = _get(name).units
    return None if units is None else units(result)


def metric_blocks(result: dict, name: str) -> list[int] | None:
    """The block (document) of each evaluation unit of metric ``name``: units of one block are
    resampled together; None when the units are independent or the run does not record them."""
    blocks = _get(name).blocks
    return None if blocks is None else blocks(result)


def by_arm(results: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """``{(objective, arm): [runs, by seed]}``, in the order of ``results``."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["objective"], r["arm"]), []).append(r)
    for runs in groups.values():
        runs.sort(key=lambda r: r["seed"])
    return groups


# ---------------------------------------------------------------------------------------------
# Spreads and tests
# ---------------------------------------------------------------------------------------------


def _t_interval(values: Sequence[float], level: float) -> tuple[float, float]:
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return (-math.inf, math.inf)
    half = t_quantile(0.5 + level / 2.0, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return (mean - half, mean + half)


@dataclass(frozen=True)
class Spread:
    """A metric over seeds: ``values`` ``{seed: value}``, their mean, sample standard deviation
    (0 for one seed), standard error, 95% t interval of the mean, minimum and maximum. The
    interval is cut to ``bounds``, the values the mean can take (an accuracy's [0, 1]): the true
    mean lies inside them, so the cut interval covers it exactly as often as the t interval."""

    values: dict[int, float]
    bounds: tuple[float, float] = (-math.inf, math.inf)

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
    def se(self) -> float:
        return self.sd / math.sqrt(self.n)

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """The ``level`` t interval of the mean over seeds (infinite for one seed), cut to
        ``bounds``."""
        lo, hi = _t_interval(list(self.values.values()), level)
        return (max(lo, self.bounds[0]), min(hi, self.bounds[1]))

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

    def interval_text(self, digits: int = 3) -> str:
        """``mean [low, high]`` with the 95% interval (just the mean for one seed)."""
        if self.n == 1:
            return f"{self.mean:.{digits}f}"
        lo, hi = self.ci()
        return f"{self.mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def spread(runs: list[dict], name: str) -> Spread | None:
    """Metric ``name`` over the seeds of ``runs`` (one arm); None if no run has it."""
    values = {r["seed"]: v for r in runs if (v := metric(r, name)) is not None}
    return Spread(values, _get(name).bounds) if values else None


def _t_test(values: Sequence[float], null: float) -> tuple[float, float]:
    """``(t, two-sided p)`` of the one-sample t-test of ``mean(values) = null``. With no spread
    the data decide alone: ``p = 0`` when every value differs from ``null`` in the same
    direction, else 1; with one value, ``p = 1``."""
    n = len(values)
    if n < 2:
        return (0.0, 1.0)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values)
    if sd == 0.0:
        if mean == null:
            return (0.0, 1.0)
        return (math.copysign(math.inf, mean - null), 0.0)
    t = (mean - null) / (sd / math.sqrt(n))
    return (t, t_two_sided_p(t, n - 1))


@dataclass(frozen=True)
class Paired:
    """``a - b`` seed by seed (only seeds both arms have): the mean difference, its 95% t
    interval and the two-sided p-value of the paired t-test (uncorrected: a family's verdict
    corrects it, :mod:`course_lib.compare.claims`)."""

    differences: dict[int, float]

    @property
    def spread(self) -> Spread:
        return Spread(self.differences)

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return self.spread.mean

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        return self.spread.ci(level)

    @property
    def t(self) -> float:
        return _t_test(list(self.differences.values()), 0.0)[0]

    @property
    def p_value(self) -> float:
        """Two-sided p-value of ``mean difference = 0``."""
        return _t_test(list(self.differences.values()), 0.0)[1]

    def text(self, digits: int = 3) -> str:
        """``mean [95% interval]``."""
        lo, hi = self.ci()
        return f"{self.mean:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


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


@dataclass(frozen=True)
class OneSample:
    """One arm's values over seeds against a ``threshold``: is the mean ``side`` ("above" or
    "below") it? ``p_value``: the one-sided t-test of the mean beyond the threshold
    (uncorrected)."""

    values: dict[int, float]
    threshold: float
    side: str
    bounds: tuple[float, float] = (-math.inf, math.inf)

    @property
    def spread(self) -> Spread:
        return Spread(self.values, self.bounds)

    @property
    def mean(self) -> float:
        return self.spread.mean

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        return self.spread.ci(level)

    @property
    def p_value(self) -> float:
        t, p = _t_test(list(self.values.values()), self.threshold)
        toward = t > 0 if self.side == "above" else t < 0
        return p / 2.0 if toward else 1.0 - p / 2.0


def bound_test(
    values: dict[int, float],
    threshold: float,
    side: str,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> OneSample:
    """:class:`OneSample` of ``values`` against ``threshold`` on ``side`` (the interval cut to
    ``bounds``, as :class:`Spread`'s)."""
    if side not in ("above", "below"):
        raise ValueError(f"side must be 'above' or 'below', got {side!r}")
    if not values:
        raise ValueError("a bound needs at least one value")
    return OneSample(dict(values), float(threshold), side, bounds)
