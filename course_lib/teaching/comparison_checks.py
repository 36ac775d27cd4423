"""The checks of notebook 10's exercises: the learned tables' parameters, and the schedule.

``check_table_parameters(fn)`` calls ``fn(num_layers, max_positions, hidden_size)``, whose answer
is one whole number, for the cpu preset's clm and mlm models and compares it with how many more
parameters :class:`course_lib.model.MiniBert` has with the learned encoding than with ``none``;
then with the report's model (6 layers, 256 positions, hidden 384). It also checks that the
committed learned runs (``figures/compare_cpu``) record the model's count. A wrong count gets a
hint: one table for the whole model, one per Q, K and V, or a table missing a dimension.

``check_schedule(fn)`` calls ``fn(step, steps, peak, warmup_steps, min_lr_ratio)``, whose answer
is one number (read by :func:`~course_lib.teaching.answers.as_number`), at every step of three
schedules (one without warm-up) and compares it with
:func:`course_lib.train.learning_rate_at`, naming the first step that differs in each. A wrong
rate gets a hint: the warm-up off by one step, the cosine ending at 0 instead of
``min_lr_ratio * peak``, ``t`` divided by ``S - W`` (it never reaches 1) or not starting after
the warm-up, or float32 rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from course_lib.compare import PRESETS, default_out_dir, preset_results
from course_lib.compare.presets import Preset
from course_lib.model import BertConfig, MiniBert
from course_lib.teaching.answers import Exercise, as_number
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb10
from course_lib.train import learning_rate_at

__all__ = ["committed_runs", "check_table_parameters", "check_schedule", "EXERCISES"]

REPORT_MODEL = {"num_layers": 6, "max_positions": 256, "hidden_size": 384}
SCHEDULES = ((300, 3e-3, 30, 0.1), (50, 1.0, 5, 0.0), (20, 0.5, 0, 0.2))  # steps, peak, W, r


# --- the learned tables --------------------------------------------------------------------------


@lru_cache(maxsize=4)
def committed_runs(preset: str = "cpu") -> tuple[dict, ...]:
    """The committed runs of ``preset`` (``figures/compare_<preset>``) that its current
    configuration makes; none when the folder has none."""
    try:
        return tuple(preset_results(default_out_dir(preset), PRESETS[preset]))
    except FileNotFoundError:
        return ()


@lru_cache(maxsize=1)
def _report_table_parameters() -> int:
    config = BertConfig(
        vocab_size=259,
        hidden_size=REPORT_MODEL["hidden_size"],
        num_layers=REPORT_MODEL["num_layers"],
        num_heads=6,
        max_position_embeddings=REPORT_MODEL["max_positions"],
        encoding="learned",
    )
    return MiniBert(config).parameter_counts()["position_embeddings"]


def _table_hint(got: float, num_layers: int, max_positions: int, hidden: int) -> str:
    table = max_positions * hidden
    if got == table:
        return " One table per layer?"
    if got == 3 * num_layers * table:
        return " One table per layer, added to the inputs of Q, K and V together: it counts once."
    if got in (num_layers * max_positions, num_layers * hidden):
        return " A table has max_positions rows of hidden_size entries."
    return " One table per layer?"


def check_table_parameters(
    fn: Callable[[int, int, int], int],
    preset: Preset | None = None,
    runs: list[dict] | tuple[dict, ...] | None = None,
) -> bool:
    """Check ``fn(num_layers, max_positions, hidden_size) -> int`` (see the module) on the models
    of ``preset`` (the cpu preset), against the result dicts ``runs`` (the committed ones of the
    cpu preset); print one verdict."""
    preset = PRESETS["cpu"] if preset is None else preset
    runs = committed_runs(preset.name) if runs is None else runs
    failures = []
    for objective in ("clm", "mlm"):
        counts = {
            arm: MiniBert(preset.model_config(arm, objective)).parameter_counts()["total"]
            for arm in ("learned", "none")
        }
        cfg = preset.model_config("learned", objective)
        extra = counts["learned"] - counts["none"]
        got, problem = as_number(
            fn(cfg.num_layers, cfg.max_position_embeddings, cfg.hidden_size), whole=True
        )
        if problem:
            failures.append(f"{objective} model of the {preset.name} preset: {problem}")
        elif got != extra:
            hint = _table_hint(got, cfg.num_layers, cfg.max_position_embeddings, cfg.hidden_size)
            failures.append(
                f"{objective} model of the {preset.name} preset ({cfg.num_layers} layers, "
                f"{cfg.max_position_embeddings} positions, hidden {cfg.hidden_size}): you count "
                f"{got}, it has {extra} more parameters than `none`.{hint}"
            )
        learned = [r for r in runs if r["objective"] == objective and r["arm"] == "learned"]
        if learned and learned[0]["metrics"]["parameters"]["total"] - counts["none"] != extra:
            failures.append(f"the committed {objective} runs record another count than the model")
    want = _report_table_parameters()
    got, problem = as_number(
        fn(REPORT_MODEL["num_layers"], REPORT_MODEL["max_positions"], REPORT_MODEL["hidden_size"]),
        whole=True,
    )
    if problem or got != want:
        failures.append(
            "the report's model (6 layers, 256 positions, hidden 384) disagrees with "
            "MiniBert.parameter_counts(): " + (problem or f"you count {got}, it has {want}")
        )
    return report_check("learned_table_parameters", failures)


# --- the schedule --------------------------------------------------------------------------------


def _cosine(peak: float, floor: float, t: float) -> float:
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t)))


def _schedule_hint(got: float, s: int, steps: int, peak: float, warmup: int, floor: float) -> str:
    def near(value: float) -> bool:
        return math.isclose(got, value, rel_tol=1e-9, abs_tol=1e-12)

    if s < warmup:
        if near(peak * s / warmup):
            return " (step counts from 0: the first warm-up step already has peak * 1 / W)"
        return ""
    t = (s - warmup) / max(1, steps - 1 - warmup)
    if near(_cosine(peak, 0.0, t)):
        return " (the cosine ends at min_lr_ratio * peak, not at 0)"
    if near(_cosine(peak, floor, (s - warmup) / (steps - warmup))):
        return " (t reaches 1 at the last step, S - 1: divide by S - 1 - W)"
    if near(_cosine(peak, floor, s / max(1, steps - 1))):
        return " (t starts at 0 when the warm-up ends: t = (s - W) / (S - 1 - W))"
    return ""


def check_schedule(fn: Callable[[int, int, float, int, float], float]) -> bool:
    """Check ``fn(step, steps, peak, warmup_steps, min_lr_ratio) -> float`` (see the module);
    print one verdict."""
    failures = []
    for steps, peak, warmup, floor in SCHEDULES:
        for s in range(steps):
            want = learning_rate_at(s, steps, peak, warmup, floor)
            got, problem = as_number(fn(s, steps, peak, warmup, floor))
            where = f"steps={steps}, warmup={warmup}, step {s}"
            if problem:
                failures.append(f"{where}: {problem}")
                break
            if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
                phase = "warm-up" if s < warmup else "cosine"
                hint = _schedule_hint(got, s, steps, peak, warmup, floor)
                if not hint and math.isclose(got, want, rel_tol=1e-6):  # rounding, not the formula
                    hint = " (float32 rounding? compute in Python floats)"
                failures.append(f"{where} ({phase}): got {got:.10g}, want {want:.10g}{hint}")
                break
    return report_check("warmup_cosine_lr", failures)


EXERCISES = [
    Exercise("learned_table_parameters", check_table_parameters, nb10.learned_table_parameters),
    Exercise("warmup_cosine_lr", check_schedule, nb10.warmup_cosine_lr),
]
