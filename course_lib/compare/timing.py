"""Training speed measured on its own (:func:`timing_pass`), apart from the comparison's runs,
which may share a busy machine: ``<out_dir>/timing.json``."""

from __future__ import annotations

import datetime
import json
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from course_lib.compare.arms import get_arm
from course_lib.compare.common import (
    ComparisonText,
    hardware_description,
    load_average,
    preset_threads,
    torch_threads,
    write_result,
)
from course_lib.compare.presets import Preset, choose_preset
from course_lib.compare.results import default_out_dir
from course_lib.model import MiniBert
from course_lib.train import train_model

__all__ = ["timing_pass"]


def timing_pass(
    preset: Preset | str,
    out_dir: str | Path | None = None,
    *,
    arms: Sequence[str] | None = None,
    objectives: Sequence[str] | None = None,
    steps: int = 40,
    repeats: int = 3,
    threads: int | None = None,
    progress: bool = True,
) -> dict:
    """Training speed of every (objective, arm), measured back to back in this process, apart
    from the comparison's runs (which may share a busy machine): ``repeats`` times, ``steps``
    training steps of a fresh model with the preset's batch and its base learning rate, the
    tokens per second of each repeat (wall clock) and of the CPU time, with the machine's
    1-minute load average before and after each. Writes and returns ``<out_dir>/timing.json``,
    keeping the rows of arms it did not time (an arm added later is timed alone)."""
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    arms = tuple(arms or preset.arm_names())
    objectives = tuple(objectives or preset.objectives)
    data = ComparisonText(preset)
    rows = []
    from tqdm.auto import tqdm

    todo = [(o, a) for o in objectives for a in arms if get_arm(a).trains(o)]
    with torch_threads(threads if threads is not None else preset_threads(preset)):
        for objective, arm in tqdm(todo, desc="timing", disable=not progress):
            config = replace(
                preset.train_config(objective), steps=steps, warmup_steps=0,
                eval_every=steps, checkpoint_every=steps,
            )  # fmt: skip
            tokens = config.steps * config.batch_size * config.seq_len
            wall, cpu, loads = [], [], [load_average()]
            for _ in range(repeats):
                torch.manual_seed(0)
                model = MiniBert(preset.model_config(arm, objective)).to(preset.device)
                state = train_model(
                    model, data.train, data.curve[:1], config, progress=False, desc="timing"
                )
                wall.append(tokens / state.train_seconds)
                cpu.append(tokens / state.train_cpu_seconds)
                loads.append(load_average())
            rows.append(
                {
                    "objective": objective,
                    "arm": arm,
                    "tokens_per_second": statistics.median(wall),
                    "tokens_per_cpu_second": statistics.median(cpu),
                    "repeats": wall,
                    "load_average_1min": loads,
                    "when": _now(),
                }
            )
    path = out_dir / "timing.json"
    timed = {(row["objective"], row["arm"]) for row in rows}
    kept = []
    if path.exists():
        kept = [
            row
            for row in json.loads(path.read_text(encoding="utf-8"))["rows"]
            if (row["objective"], row["arm"]) not in timed
        ]
    timing = {
        "steps": steps,
        "repeats": repeats,
        "hardware": hardware_description(preset.device),
        "when": _now(),
        "rows": kept + rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_result(path, timing)
    return timing


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
