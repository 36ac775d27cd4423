"""One (arm, objective, seed) run of the comparison (:func:`run_one`): trained at its chosen
rate (:func:`course_lib.train.train_model`), then scored on the **test** split and saved
(:mod:`course_lib.compare.evaluation`). Each run writes
``<out_dir>/<objective>_<arm>_s<seed>.json`` and keeps a checkpoint in ``<checkpoint_dir>/``
(model, optimiser, step, RNG states; the default checkpoint folder ignores itself in git): an
interrupted run resumes where it stopped, mid-run too; a finished run is read back unless
``force=True``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from course_lib.compare.arms import Arm, get_arm
from course_lib.compare.common import (
    ComparisonText,
    check_objective,
    check_seed,
    preset_threads,
    saved_or_none,
    torch_threads,
)
from course_lib.compare.evaluation import evaluate_and_save
from course_lib.compare.presets import Preset, choose_preset
from course_lib.compare.results import default_out_dir, run_name
from course_lib.compare.sweep import chosen_learning_rates
from course_lib.distributed import Processes, tensor_fingerprint
from course_lib.model import MiniBert
from course_lib.train import train_model

__all__ = ["run_one"]


def run_one(
    arm: str | Arm,
    objective: str,
    preset: Preset | str = "auto",
    *,
    seed: int = 0,
    learning_rate: float | None = None,
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
    """Train and evaluate one (arm, objective, seed) run; return its results dict.

    ``arm`` is an encoding's name or an ablation's, or its :class:`~course_lib.compare.arms.Arm`
    (:mod:`course_lib.compare.arms`; resolved once and carried through); ``seed``
    seeds the model's initialisation and the order of its training data (probe examples and
    evaluation text are the same for every seed). ``learning_rate`` defaults to the one the
    preset's sweep chose for the arm's encoding (:func:`chosen_learning_rates`, read from
    ``out_dir``; a preset without a grid: ``train.learning_rate``). Reads
    ``<out_dir>/<objective>_<arm>_s<seed>.json`` instead if it exists and matches this preset
    (``force=True`` recomputes, deleting the old checkpoint first). Resumes from
    ``<checkpoint_dir>/<objective>_<arm>_s<seed>.pt`` if present. With ``stop_after_steps`` the
    training stops there (simulating an interruption), the checkpoint is kept and ``None`` is
    returned; call again without it to finish. ``deadline`` (a :func:`time.monotonic` value; one
    process only) stops the training the same way at the first step that ends after it (a run
    whose training is finished is evaluated, however late). On CPU the run uses ``threads`` (default: the
    preset's ``cpu_threads``) torch threads, restored afterwards: the thread count changes the
    order of floating-point sums, so a resumed run must use the same count to match exactly.

    With ``processes`` in ``"data"`` mode, every process calls this with the same arguments:
    rank 0 decides (reuse, refuse or train) and reads and writes the files; all of them train
    (:func:`course_lib.train.train_model` with ``data_parallel``); rank 0 evaluates while the
    others wait; every rank returns rank 0's result. The results file then records the number of
    processes (``hardware``) and of each training segment (``metrics.training_processes``). In
    ``"runs"`` mode this process makes the run alone, as without ``processes``; its
    ``hardware`` record says how many processes shared the machine(s).
    """
    spec = arm if isinstance(arm, Arm) else get_arm(arm)  # a ValueError lists the valid ones
    arm = spec.name
    check_objective(objective)
    check_seed(seed)
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else out_dir / "checkpoints"
    if learning_rate is None:
        pair = (objective, spec.encoding)
        learning_rate = chosen_learning_rates(out_dir, preset, [pair])[pair]
    name = run_name(objective, arm, seed)
    result_path = out_dir / f"{name}.json"
    checkpoint_path = checkpoint_dir / f"{name}.pt"
    identity = preset.identity(spec, objective, seed, learning_rate)
    team = processes if processes is not None and processes.mode == "data" else None

    def saved() -> dict | None:
        return saved_or_none(
            result_path, checkpoint_path, identity, force, f"preset {preset.name!r}"
        )

    found = saved() if team is None else team.from_main(saved)
    if found is not None:
        return found
    data = data or ComparisonText(preset)
    if team is not None:
        team.check_same("the training text", tensor_fingerprint(data.train))
    threads = threads if threads is not None else preset_threads(preset)
    with torch_threads(threads if preset.device == "cpu" else None):
        return _train_and_evaluate(
            spec, objective, seed, learning_rate, preset, identity, data, result_path,
            checkpoint_path, progress, stop_after_steps, processes, deadline,
        )  # fmt: skip


def _train_and_evaluate(
    spec: Arm,
    objective: str,
    seed: int,
    learning_rate: float,
    preset: Preset,
    identity: dict,
    data: ComparisonText,
    result_path: Path,
    checkpoint_path: Path,
    progress: bool,
    stop_after_steps: int | None,
    processes: Processes | None = None,
    deadline: float | None = None,
) -> dict | None:
    arm = spec.name
    name = run_name(objective, arm, seed)
    team = processes if processes is not None and processes.mode == "data" else None
    device = torch.device(preset.device) if team is None else team.device
    started, cpu_started = time.perf_counter(), time.process_time()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train_config = preset.train_config(objective, seed, learning_rate)
    torch.manual_seed(train_config.seed)
    model = MiniBert(preset.model_config(spec, objective)).to(device)
    state = train_model(
        model,
        data.train,
        data.curve,
        train_config,
        checkpoint_path=checkpoint_path,
        meta=identity,
        stop_after_steps=stop_after_steps,
        progress=progress,
        desc=f"{name} train",
        data_parallel=team,
        deadline=deadline,
    )
    if not state.finished:
        return None

    def evaluate() -> dict:
        return evaluate_and_save(
            model, state, device, spec, objective, seed, learning_rate, preset, identity, data,
            result_path, progress, (started, cpu_started), processes,
        )  # fmt: skip

    return evaluate() if team is None else team.from_main(evaluate)
