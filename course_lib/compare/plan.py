"""The comparison's plan: which runs it makes, in which order, and how long those left may take.

:func:`comparison_plan` lists the learning-rate sweep's runs and the scored runs in the order
:func:`course_lib.compare.runner.run_comparison` makes them (so a comparison made in slices,
``--budget-minutes``, finishes whole sweep seeds and then whole seeds first);
:func:`minutes_left` estimates the minutes the runs left will take, from the runs made so far
or from the timing pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from course_lib.compare.arms import get_arm
from course_lib.compare.presets import Preset

__all__ = ["comparison_plan", "minutes_left", "run_cost", "timing_speeds"]


def comparison_plan(
    preset: Preset,
    arms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    objectives: Sequence[str] | None = None,
) -> tuple[list[tuple[str, str, float, int]], list[tuple[str, str, int]]]:
    """The comparison's runs in the order they are made: ``(sweep, runs)``.

    ``sweep``: ``(objective, encoding, rate, sweep seed)``, every rate of every (objective,
    encoding) pair for the first sweep seed, then for the next one (causal pairs first in each:
    they are the cheap ones); ``runs``: ``(objective, arm, seed)``, seed by seed (so a
    comparison cut short has whole seeds: seed 0 of every arm under every objective first),
    objective by objective, arm by arm; a causal-only encoding has no masked-LM run. ``arms``,
    ``seeds`` and ``objectives`` default to the preset's."""
    arms = tuple(arms if arms is not None else preset.arm_names())
    seeds = tuple(seeds if seeds is not None else preset.seeds)
    objectives = tuple(objectives or preset.objectives)
    runs = [(o, a, s) for s in seeds for o in objectives for a in arms if get_arm(a).trains(o)]
    pairs = list(dict.fromkeys((o, get_arm(a).encoding) for o, a, _ in runs))
    sweep = sorted(
        (
            (o, e, rate, seed)
            for seed in preset.sweep_seeds
            for o, e in pairs
            for rate in preset.rates(o)
        ),
        key=lambda x: (preset.sweep_seeds.index(x[3]), x[0] != "clm"),
    )
    return sweep, runs


def run_cost(result: dict) -> float:
    """Seconds a finished run took: its training, evaluation and probes."""
    metrics = result.get("metrics", {})
    return sum(
        float(metrics.get(key) or 0.0)
        for key in ("train_seconds", "evaluation_seconds", "probe_seconds")
    )


def timing_speeds(out_dir: Path) -> dict[tuple[str, str], float]:
    """``{(objective, arm): tokens per second}`` of ``<out_dir>/timing.json`` (empty if none)."""
    path = out_dir / "timing.json"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
        return {(r["objective"], r["arm"]): float(r["tokens_per_second"]) for r in rows}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def minutes_left(
    preset: Preset,
    sweep_left: Sequence[tuple[str, str, float, int]],
    runs_left: Sequence[tuple[str, str, int]],
    costs: dict[str, list[float]],
    timing: dict[tuple[str, str], float] | None = None,
) -> float | None:
    """An estimate of the minutes the runs left will take: each run at the mean cost of the
    runs of its stage finished so far (``costs["sweep"]``, ``costs["runs"]``, seconds; a scored
    run with none yet at the sweep's mean), or else at the training speed of the timing pass
    (``timing``: ``{(objective, arm): tokens per second}``); None when neither says."""
    timing = timing or {}

    def from_timing(objective: str, arm: str) -> float | None:
        speed = timing.get((objective, arm))
        if not speed:
            return None
        config = preset.train_config(objective)
        return config.steps * config.batch_size * config.seq_len / speed

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    total = 0.0
    for stage, items in (("sweep", sweep_left), ("runs", runs_left)):
        for item in items:
            each = mean(costs.get(stage, [])) or mean(costs.get("sweep", []))
            if each is None:
                each = from_timing(item[0], item[1])
            if each is None:
                return None
            total += each
    return total / 60
