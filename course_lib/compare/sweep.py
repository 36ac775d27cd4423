"""The learning-rate sweep, the first stage of a comparison whose preset has a grid
(``Preset.rates(objective)``): every encoding trained once per rate of the grid and seed of
``Preset.sweep_seeds`` (never a seed the report scores) and scored on the **selection** split
only (:func:`run_sweep_one`). :func:`chosen_learning_rates` picks, per (objective, encoding),
the rate with the lowest mean selection loss over the sweep seeds; an ablation trains with its
encoding's rate. Each sweep run writes
``<out_dir>/sweep/<objective>_<encoding>_lr<rate>_s<seed>.json``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from course_lib.compare.arms import get_arm
from course_lib.compare.common import (
    ComparisonText,
    check_objective,
    hardware_description,
    load_average,
    prepare_checkpoint_dir,
    preset_threads,
    saved_or_none,
    torch_threads,
    write_result,
)
from course_lib.compare.files import check_result, read_json
from course_lib.compare.presets import Preset, choose_preset
from course_lib.compare.results import default_out_dir, mean_sweep_loss, sweep_name, sweep_table
from course_lib.distributed import Processes
from course_lib.evaluate import heldout_loss
from course_lib.model import MiniBert
from course_lib.train import train_model

__all__ = ["chosen_learning_rates", "run_sweep_one", "sweep_results"]


def run_sweep_one(
    encoding: str,
    objective: str,
    learning_rate: float,
    preset: Preset | str = "auto",
    *,
    seed: int | None = None,
    out_dir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    stop_after_steps: int | None = None,
    threads: int | None = None,
    data: ComparisonText | None = None,
    processes: Processes | None = None,
    deadline: float | None = None,
) -> dict | None:
    """Train ``encoding`` for ``objective`` at ``learning_rate`` with ``seed`` (one of the
    preset's ``sweep_seeds``; default the first) and score it on the selection split
    (:func:`course_lib.evaluate.heldout_loss`); write and return
    ``<out_dir>/sweep/<objective>_<encoding>_lr<rate>_s<seed>.json`` (reused when it exists and
    matches; ``None`` when stopped by ``stop_after_steps`` or ``deadline``). ``processes`` and
    ``deadline`` as in
    :func:`course_lib.compare.training_run.run_one`."""
    get_arm(encoding)
    check_objective(objective)
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    seed = preset.sweep_seeds[0] if seed is None else seed
    if seed not in preset.sweep_seeds:
        raise ValueError(
            f"seed {seed} is not a sweep seed of preset {preset.name!r} "
            f"(its sweep seeds: {', '.join(map(str, preset.sweep_seeds))})"
        )
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else out_dir / "checkpoints"
    name = sweep_name(objective, encoding, learning_rate, seed)
    result_path = out_dir / "sweep" / f"{name}.json"
    checkpoint_path = checkpoint_dir / "sweep" / f"{name}.pt"
    identity = preset.sweep_identity(encoding, objective, learning_rate, seed)
    team = processes if processes is not None and processes.mode == "data" else None

    def saved() -> dict | None:
        prepare_checkpoint_dir(checkpoint_dir)
        return saved_or_none(
            result_path, checkpoint_path, identity, force, f"preset {preset.name!r}",
            keys=("identity", "metrics"),
        )  # fmt: skip

    found = saved() if team is None else team.from_main(saved)
    if found is not None:
        return found
    data = data or ComparisonText(preset)
    config = preset.train_config(objective, seed, learning_rate)
    with torch_threads(threads if threads is not None else preset_threads(preset)):
        started, cpu_started = time.perf_counter(), time.process_time()
        torch.manual_seed(config.seed)
        device = torch.device(preset.device) if team is None else team.device
        model = MiniBert(preset.model_config(encoding, objective)).to(device)
        state = train_model(
            model, data.train, data.curve, config, checkpoint_path=checkpoint_path,
            meta=identity, stop_after_steps=stop_after_steps, progress=progress,
            desc=f"{name} sweep", data_parallel=team, deadline=deadline,
        )  # fmt: skip
        if not state.finished:
            return None

        def evaluate() -> dict:
            select = heldout_loss(
                model, data.select, mask_draws=preset.mask_draws, mask_prob=config.mask_prob,
                mask_seed=config.mask_seed, batch_size=preset.eval_batch_size,
                autocast_dtype=config.autocast_dtype,
            )  # fmt: skip
            result = {
                "identity": identity,
                "run": name,
                "sweep": True,
                "encoding": encoding,
                "objective": objective,
                "learning_rate": float(learning_rate),
                "seed": config.seed,
                "preset": preset.name,
                "hardware": hardware_description(device, processes),
                "select": select,
                "curves": {"train": state.train_curve, "val": state.val_curve},
                "metrics": {
                    "train_seconds": state.train_seconds,
                    "train_cpu_seconds": state.train_cpu_seconds,
                    "wall_seconds_this_segment": time.perf_counter() - started,
                    "cpu_seconds_this_segment": time.process_time() - cpu_started,
                    "cpu_load_average_1min": load_average(),
                },
            }
            write_result(result_path, result)
            return result

        return evaluate() if team is None else team.from_main(evaluate)


def sweep_results(out_dir: str | Path, preset: Preset | str) -> list[dict]:
    """The sweep runs saved in ``<out_dir>/sweep/`` that belong to ``preset``'s current
    configuration."""
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    folder = Path(out_dir) / "sweep"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        result = check_result(path, read_json(path), keys=("identity", "metrics"))
        if _belongs(result, preset):
            found.append(result)
    return found


def _belongs(sweep: dict, preset: Preset) -> bool:
    """Whether a sweep results dict is one ``preset`` would make now: a rate of its grid, the
    same configuration (an encoding that is no longer registered makes none)."""
    try:
        if sweep["learning_rate"] not in preset.rates(sweep["objective"]):
            return False
        if sweep["seed"] not in preset.sweep_seeds:
            return False
        expected = preset.sweep_identity(
            sweep["encoding"], sweep["objective"], sweep["learning_rate"], sweep["seed"]
        )
    except (KeyError, ValueError):
        return False
    return sweep.get("identity") == expected


def chosen_learning_rates(
    out_dir: str | Path,
    preset: Preset | str,
    pairs: Sequence[tuple[str, str]] | None = None,
    sweeps: list[dict] | None = None,
) -> dict[tuple[str, str], float]:
    """``{(objective, encoding): rate}``: for each pair, the rate of ``preset.rates(objective)``
    whose sweep runs have the lowest mean selection loss over ``preset.sweep_seeds``
    (:func:`sweep_table`; a rate with a diverged run, a non-finite loss, never wins; on a tie
    the smaller rate). ``pairs`` default to every pair with sweep runs. Without a grid every
    pair gets ``train.learning_rate``. Raises FileNotFoundError naming the sweep runs that are
    missing."""
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    found = sweeps if sweeps is not None else sweep_results(out_dir, preset)
    table = sweep_table(found)
    if pairs is None:
        pairs = sorted(table)
    missing = [
        sweep_name(o, e, rate, seed)
        for o, e in pairs
        for rate in preset.rates(o)
        for seed in preset.sweep_seeds
        if seed not in table.get((o, e), {}).get(rate, {})
    ]
    if missing:
        raise FileNotFoundError(
            f"the learning-rate sweep is incomplete in {Path(out_dir) / 'sweep'}: missing "
            f"{', '.join(missing)}; run the comparison (it sweeps first)"
        )
    chosen = {}
    for pair in pairs:
        if not preset.rates(pair[0]):
            chosen[pair] = preset.train.learning_rate
            continue
        means = {
            rate: mean_sweep_loss(table[pair][rate], preset.sweep_seeds)
            for rate in preset.rates(pair[0])
        }
        finite = [(loss, rate) for rate, loss in means.items() if math.isfinite(loss)]
        if not finite:
            raise ValueError(f"every rate of {pair} has a diverged sweep run: {means}")
        chosen[pair] = min(finite)[1]
    return chosen
