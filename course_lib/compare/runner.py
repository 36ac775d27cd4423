"""The comparison runner: the learning-rate sweep, every (arm, objective, seed) run, a timing pass.

A comparison of a preset with a learning-rate grid (``Preset.rates(objective)``) has two stages:

1. **The sweep** (:func:`run_sweep_one`): every encoding trained once per rate of the grid and
   seed of ``Preset.sweep_seeds`` (never a seed the report scores) and scored on the
   **selection** split only. :func:`chosen_learning_rates` picks, per (objective, encoding),
   the rate with the lowest mean selection loss over the sweep seeds; an ablation trains with
   its encoding's rate.
2. **The runs** (:func:`run_one`): each (arm, objective, seed) trained at its chosen rate
   (:func:`course_lib.train.train_model`), then scored on the **test** split:

   * the loss at the training length on every test window (masked LM: several mask draws),
     per window, so the report can bootstrap the test text's own noise
     (:func:`course_lib.evaluate.heldout_loss`);
   * past the training length, position and context apart, on the same targets
     (:func:`course_lib.evaluate.shift_and_context_losses`);
   * the word-order and retrieval probes (:func:`course_lib.train.probe_finetune`) with several
     fine-tune seeds, candidates in a random order, ties wrong, standard errors over word-order
     pairs;
   * the values the encoding's modules report (``reported_values``: RSE's lambda per head) with
     the range the optimiser could have reached (``reachable_values``);
   * cost: parameters, training seconds, CPU seconds (as measured during the run, on a machine
     that may be busy: :func:`timing_pass` measures speed on its own).

Each run writes ``<out_dir>/<objective>_<arm>_s<seed>.json`` (the sweep:
``<out_dir>/sweep/<objective>_<encoding>_lr<rate>_s<seed>.json``) and keeps a checkpoint in
``<checkpoint_dir>/`` (model, optimiser, step, RNG states; the default checkpoint folder ignores
itself in git). An interrupted comparison resumes where it stopped, mid-run too; a finished run
is skipped unless ``force=True``. :func:`run_comparison` makes both stages in the order of
:func:`course_lib.compare.plan.comparison_plan` (``budget_seconds``: as many as fit, resumed by
the next call), then
:func:`write_report` writes the figures (:mod:`course_lib.compare.figures`) and ``summary.md``.

Both take ``processes`` (:class:`course_lib.distributed.Processes`, from ``torchrun``; None by
default: one process, no process group). In ``"data"`` mode every run is trained by all the
processes together and rank 0 alone evaluates and writes; in ``"runs"`` mode each process takes
the next whole run whenever it is free. :mod:`course_lib.distributed` describes both.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from course_lib.compare.arms import Arm, get_arm
from course_lib.compare.files import (
    RESULT_KEYS,
    ComparisonFileError,
    check_result,
    no_runs_message,
    read_json,
)
from course_lib.compare.plan import comparison_plan, minutes_left, run_cost, timing_speeds
from course_lib.compare.presets import Preset, choose_preset
from course_lib.compare.results import (
    LOG_FILES,
    default_out_dir,
    hardware_label,
    load_results,
    mean_sweep_loss,
    run_name,
    summary_markdown,
    sweep_name,
    sweep_table,
)
from course_lib.data import (
    ProbeBatch,
    comparison_splits,
    corpus_source,
    segment_windows,
    unigram_entropy,
    window_documents,
)
from course_lib.distributed import Processes, tensor_fingerprint
from course_lib.evaluate import heldout_loss, peak_memory, shift_and_context_losses
from course_lib.model import OBJECTIVES, MiniBert
from course_lib.train import TrainState, learning_rate_sum, probe_finetune, train_model

__all__ = [
    "chosen_learning_rates",
    "comparison_plan",
    "hardware_description",
    "minutes_left",
    "preset_results",
    "retrieval_bag_baseline",
    "run_comparison",
    "run_one",
    "run_sweep_one",
    "sweep_results",
    "timing_pass",
    "write_report",
]


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def hardware_description(device: str | torch.device, processes: Processes | None = None) -> dict:
    """Where a run ran: kind (CPU/GPU), model name, core and thread counts (threads per process),
    software versions; with ``processes``, also how many processes ran and how (``processes``,
    ``parallel_mode``, ``process_backend``; absent for one process)."""
    device = torch.device(device)
    info = {
        "kind": "GPU" if device.type == "cuda" else "CPU",
        "cpu": _cpu_model_name(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["name"] = info["gpu"]
    else:
        info["name"] = info["cpu"]
    if processes is not None:
        info["processes"] = processes.world_size
        info["parallel_mode"] = processes.mode
        info["process_backend"] = processes.backend
    return info


def _load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


class _Data:
    """The text of a comparison, cut once per process (:func:`course_lib.data.
    comparison_splits`): the training stream, and windows of the held-out splits: ``curve``
    (selection split, training length; the validation curve), ``select`` (selection split, the
    sweep's score), ``test`` (test split, training length) and ``long`` (test split,
    ``long_multiple`` times the training length)."""

    def __init__(self, preset: Preset) -> None:
        self.splits = comparison_splits(
            select_fraction=preset.select_fraction,
            test_fraction=preset.test_fraction,
            ngram=preset.ngram,
        )
        length = preset.train.seq_len
        self.train = self.splits.train
        self.select = segment_windows(self.splits.select, length + 1, None)
        self.curve = self.select
        self.test = segment_windows(self.splits.test, length + 1, preset.eval_windows)
        self.long = segment_windows(
            self.splits.test, preset.long_multiple * length + 1, preset.long_windows
        )
        # the document of each test window: the report bootstraps the text's noise by document
        self.test_documents = window_documents(self.splits.test, length + 1, preset.eval_windows)
        self.long_documents = window_documents(
            self.splits.test, preset.long_multiple * length + 1, preset.long_windows
        )
        self.source = corpus_source()
        self.unigram_entropy = unigram_entropy(self.train)

    def describe(self) -> dict:
        return {
            "corpus_source": self.source,
            **self.splits.describe(),
            "unigram_entropy_nats": self.unigram_entropy,
            "select_windows": int(self.select.shape[0]),
            "test_windows": int(self.test.shape[0]),
            "long_windows": int(self.long.shape[0]),
            "long_window_length": int(self.long.shape[1] - 1),
            "test_window_documents": self.test_documents.tolist(),
            "long_window_documents": self.long_documents.tolist(),
        }


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def retrieval_bag_baseline(probe: ProbeBatch) -> float:
    """Expected accuracy of the best guess that ignores positions on a retrieval probe: one of
    the most frequent context symbols, picked at random (a bag of symbols knows counts, not
    places). It is above ``1 / len(alphabet)`` because the target is always in the context."""
    context_len = probe.texts[0].index("@")  # "<context>@<p>?<answer>"
    total = 0.0
    for row, answer in zip(probe.input_ids[:, :context_len], probe.answer_id.tolist(), strict=True):
        counts = torch.bincount(row, minlength=256)
        top = counts.max()
        if counts[answer] == top:
            total += 1.0 / int((counts == top).sum())
    return total / len(probe)


def _check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")


def _check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"a seed must be an int >= 0, got {seed!r}")


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(threads)`` (None: unchanged)."""
    previous = torch.get_num_threads()
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _write_result(path: Path, result: dict) -> None:
    """Write a results file atomically (a temporary file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _prepare_checkpoint_dir(path: Path) -> None:
    """Create the checkpoint folder with a ``.gitignore`` of ``*`` so git never picks it up."""
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# checkpoints are large and reproducible: never committed\n*\n")


def _saved_or_none(
    result_path: Path,
    checkpoint_path: Path,
    identity: dict,
    force: bool,
    what: str,
    keys: tuple[str, ...] = RESULT_KEYS,
) -> dict | None:
    """The results file at ``result_path`` if it belongs to ``identity`` (None if there is
    none); ``force`` deletes it and its checkpoint first; a file of another configuration is
    refused."""
    if force:
        result_path.unlink(missing_ok=True)
        checkpoint_path.unlink(missing_ok=True)
    if result_path.exists():
        saved = check_result(result_path, read_json(result_path), keys=keys)
        if saved.get("identity") != identity:
            raise ComparisonFileError(
                f"{result_path} was computed with a different configuration than {what}; "
                "recompute it with force=True (--force) or use another out_dir"
            )
        return saved
    _prepare_checkpoint_dir(checkpoint_path.parent)
    return None


# ---------------------------------------------------------------------------------------------
# The learning-rate sweep
# ---------------------------------------------------------------------------------------------


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
    data: _Data | None = None,
    processes: Processes | None = None,
    deadline: float | None = None,
) -> dict | None:
    """Train ``encoding`` for ``objective`` at ``learning_rate`` with ``seed`` (one of the
    preset's ``sweep_seeds``; default the first) and score it on the selection split
    (:func:`course_lib.evaluate.heldout_loss`); write and return
    ``<out_dir>/sweep/<objective>_<encoding>_lr<rate>_s<seed>.json`` (reused when it exists and
    matches; ``None`` when stopped by ``stop_after_steps`` or ``deadline``). ``processes`` and
    ``deadline`` as in :func:`run_one`."""
    get_arm(encoding)
    _check_objective(objective)
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
        _prepare_checkpoint_dir(checkpoint_dir)
        return _saved_or_none(
            result_path, checkpoint_path, identity, force, f"preset {preset.name!r}",
            keys=("identity", "metrics"),
        )  # fmt: skip

    found = saved() if team is None else team.from_main(saved)
    if found is not None:
        return found
    data = data or _Data(preset)
    config = preset.train_config(objective, seed, learning_rate)
    with _torch_threads(threads if threads is not None else _threads(preset)):
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
                    "cpu_load_average_1min": _load_average(),
                },
            }
            _write_result(result_path, result)
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


def _threads(preset: Preset) -> int | None:
    return preset.cpu_threads if preset.device == "cpu" else None


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------


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
    data: _Data | None = None,
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
    _check_objective(objective)
    _check_seed(seed)
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else out_dir / "checkpoints"
    if learning_rate is None:
        pair = (objective, spec.encoding)
        learning_rate = chosen_learning_rates(out_dir, preset, [pair])[pair]
    name = run_name(objective, arm, seed)
    result_path = out_dir / f"{name}.json"
    checkpoint_path = checkpoint_dir / f"{name}.pt"
    identity = preset.identity(arm, objective, seed, learning_rate)
    team = processes if processes is not None and processes.mode == "data" else None

    def saved() -> dict | None:
        return _saved_or_none(
            result_path, checkpoint_path, identity, force, f"preset {preset.name!r}"
        )

    found = saved() if team is None else team.from_main(saved)
    if found is not None:
        return found
    data = data or _Data(preset)
    if team is not None:
        team.check_same("the training text", tensor_fingerprint(data.train))
    threads = threads if threads is not None else _threads(preset)
    with _torch_threads(threads if preset.device == "cpu" else None):
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
    data: _Data,
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
    model = MiniBert(preset.model_config(arm, objective)).to(device)
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
        return _evaluate_and_save(
            model, state, device, spec, objective, seed, learning_rate, preset, identity, data,
            result_path, progress, (started, cpu_started), processes,
        )  # fmt: skip

    return evaluate() if team is None else team.from_main(evaluate)


def _binned_accuracy(correct: list[float], positions: list[int]) -> dict:
    """Accuracy per target position: ``{"position": [...], "accuracy": [...], "count": [...]}``
    (``correct``: 0/1 per example and fine-tune, ``positions`` alongside)."""
    table: dict[int, list[float]] = {}
    for ok, pos in zip(correct, positions, strict=True):
        table.setdefault(pos, [0.0, 0])
        table[pos][0] += float(ok)
        table[pos][1] += 1
    keys = sorted(table)
    return {
        "position": keys,
        "accuracy": [table[k][0] / table[k][1] for k in keys],
        "count": [table[k][1] for k in keys],
    }


def _probe_entry(spec, eval_probe: ProbeBatch, outcomes: list[dict]) -> dict:
    """One probe's results over its fine-tunes: the accuracy over every (example, fine-tune),
    per unit (word-order pair, or example) the number right, the standard error over units
    (``sd(unit accuracy) / sqrt(units)``, the fine-tunes averaged within a unit), and each
    fine-tune's accuracy."""
    size, tunes = spec.unit_size, len(outcomes)
    examples = len(eval_probe)
    right = [sum(int(o["correct"][i]) for o in outcomes) for i in range(examples)]
    unit_correct = [sum(right[u * size : (u + 1) * size]) for u in range(examples // size)]
    unit_accuracy = [c / (size * tunes) for c in unit_correct]
    entry = {
        "accuracy": sum(unit_correct) / (size * tunes * len(unit_correct)),
        "standard_error": statistics.stdev(unit_accuracy) / math.sqrt(len(unit_accuracy)),
        "standard_error_over": "word-order pairs" if size == 2 else "examples",
        "finetune_seeds": list(spec.finetune_seeds),
        "finetune_accuracies": [o["accuracy"] for o in outcomes],
        "chance": spec.chance,
        "eval_examples": examples,
        "final_train_loss": [o["final_train_loss"] for o in outcomes],
        "by_position": _binned_accuracy(
            [float(c) for o in outcomes for c in o["correct"]],
            eval_probe.target_position.tolist() * tunes,
        ),
        "unit_correct": unit_correct,
        "unit_count": [size * tunes] * len(unit_correct),
    }
    if spec.task == "retrieval":
        entry["bag_of_symbols_baseline"] = retrieval_bag_baseline(eval_probe)
    if spec.task == "word_order":
        both = [
            sum(o["correct"][i] and o["correct"][i + 1] for i in range(0, examples - 1, 2))
            / (examples // 2)
            for o in outcomes
        ]
        entry["pairs_both_right"] = statistics.fmean(both)
    return entry


def _evaluate_and_save(
    model: MiniBert,
    state: TrainState,
    device: torch.device,
    arm_spec: Arm,
    objective: str,
    seed: int,
    learning_rate: float,
    preset: Preset,
    identity: dict,
    data: _Data,
    result_path: Path,
    progress: bool,
    started: tuple[float, float],
    processes: Processes | None,
) -> dict:
    """Evaluate the trained ``model`` (test loss, position and context, probes, learned values)
    and write its results file."""
    arm = arm_spec.name
    name = run_name(objective, arm, seed)
    config = preset.train_config(objective, seed, learning_rate)
    common = dict(
        mask_prob=config.mask_prob, batch_size=preset.eval_batch_size,
        autocast_dtype=config.autocast_dtype,
    )  # fmt: skip
    evaluation = {
        "val": heldout_loss(
            model, data.test, mask_draws=preset.mask_draws, mask_seed=config.mask_seed, **common
        ),
        **shift_and_context_losses(
            model,
            data.long,
            config.seq_len,
            preset.offsets,
            mask_draws=preset.long_mask_draws,
            mask_seed=config.mask_seed + 1,
            **common,
        ),
    }
    evaluated = time.perf_counter()
    probes = {}
    for spec in preset.probes:
        if objective not in spec.objectives:
            continue
        train_probe, eval_probe = spec.make("train"), spec.make("eval")
        outcomes = [
            probe_finetune(
                model,
                train_probe,
                eval_probe,
                replace(spec.finetune, seed=tune_seed),
                autocast_dtype=config.autocast_dtype,
                progress=progress,
                desc=f"{name} {spec.task} (fine-tune {tune_seed})",
            )  # fmt: skip
            for tune_seed in spec.finetune_seeds
        ]
        probes[spec.task] = _probe_entry(spec, eval_probe, outcomes)
    probed = time.perf_counter()
    hardware = hardware_description(device, processes)
    movement = learning_rate_sum(config)
    learned, reach = {}, {}
    for i, layer in enumerate(model.layers):
        if values := layer.attention.reported_values():
            learned[f"layer{i}"] = values
            reachable = getattr(layer.attention, "reachable_values", None)
            if reachable is not None and (ranges := reachable(movement)):
                reach[f"layer{i}"] = {k: list(v) for k, v in ranges.items()}
    tokens_trained = config.steps * config.batch_size * config.seq_len
    val = evaluation["val"]
    result = {
        "identity": identity,
        "run": name,
        "arm": arm,
        "encoding": arm_spec.encoding,
        "seed": seed,
        "objective": objective,
        "learning_rate": float(learning_rate),
        "preset": preset.name,
        "preset_description": preset.description,
        "label": f"{preset.name} preset, {hardware_label(hardware)}",
        "hardware": hardware,
        "data": data.describe(),
        "curves": {"train": state.train_curve, "val": state.val_curve},
        "metrics": {
            "final_val_loss": val["loss"],
            "final_val_bits_per_byte": val["loss"] / math.log(2.0),
            "final_val_tokens": val["tokens"],
            "loss_note": (
                "nats per predicted byte token on the test split; for mlm over the masked tokens "
                "of every mask draw"
            ),
            "tokens_trained": tokens_trained,
            "train_seconds": state.train_seconds,
            "train_cpu_seconds": state.train_cpu_seconds,
            "tokens_per_second_during_run": tokens_trained / state.train_seconds,
            "training_segments": state.segments,
            **(
                {"training_processes": state.processes}
                if any(n > 1 for n in state.processes)
                else {}
            ),
            "evaluation_seconds": evaluated - started[0] - state.train_seconds,
            "probe_seconds": probed - evaluated,
            "wall_seconds_this_segment": probed - started[0],
            "cpu_seconds_this_segment": time.process_time() - started[1],
            "cpu_load_average_1min": _load_average(),
            "peak_memory": peak_memory(device),
            "parameters": model.parameter_counts(),
            "learning_rate_sum": movement,
        },
        "evaluation": evaluation,
        "probes": probes,
        "learned_values": learned,
        "reachable_values": reach,
    }
    _write_result(result_path, result)
    return result


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------

_CALLS = {"n": 0}  # run_comparison calls so far in this process (keys of the shared counters)


def _mine(processes: Processes | None, items: list, stage: str) -> Iterator:
    """The items this process makes: all of them (one process, or ``"data"`` mode, where every
    process takes part in each), or in ``"runs"`` mode the next one whenever it is free
    (:meth:`~course_lib.distributed.Processes.next_index`)."""
    if processes is None or processes.mode == "data":
        yield from items
        return
    key = f"{stage}-{_CALLS['n']}"
    while (index := processes.next_index(key)) < len(items):
        yield items[index]


def _gather(processes: Processes | None, mine: list[dict]) -> list[dict]:
    """``"runs"`` mode: wait for every process (a barrier that names a rank that does not
    arrive within the timeout) and return every process's results; else ``mine``."""
    if processes is None or processes.mode == "data":
        return mine
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=processes.timeout_seconds)
    dist.monitored_barrier(group=processes.objects, timeout=timeout, wait_all_ranks=True)
    return [r for part in processes.all_gather(mine) for r in part]


def run_comparison(
    preset: Preset | str = "auto",
    *,
    encodings: Sequence[str] | None = None,
    ablations: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    objectives: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    figures: bool = True,
    threads: int | None = None,
    stop_after_steps: int | None = None,
    processes: Processes | None = None,
    budget_seconds: float | None = None,
) -> list[dict]:
    """Every (seed, objective, arm) run of ``preset``; returns the results of the finished ones.

    The arms are ``encodings`` (default: the preset's, i.e. every registered sequence encoding
    unless the preset names some) and then ``ablations`` (default: the preset's; names from
    :data:`course_lib.compare.arms.ABLATIONS`), each checked before anything runs; ``seeds``
    default to the preset's. A preset with a learning-rate grid first sweeps the encodings of
    these arms (:func:`run_sweep_one`, every rate; finished sweep runs are read back), then
    trains every run at its encoding's chosen rate. Runs go seed by seed (so an interrupted
    comparison has whole seeds), then objective by objective, arm by arm; a causal-only
    encoding has no masked-LM run. Finished runs are read back, unfinished ones resumed.
    Afterwards, if all requested runs finished and ``figures``, draws the figures and
    ``summary.md`` into ``out_dir`` (default ``figures/compare_<preset>/``) from every run of
    this preset saved there (:func:`preset_results`), so running one more arm or seed into a
    folder adds it to the report instead of replacing it. ``threads`` overrides the preset's
    CPU thread count.

    ``budget_seconds`` (one process only) makes one slice of the comparison: the runs go in the
    order of :func:`comparison_plan` (the sweep seed by seed, then the scored runs seed by seed)
    until the budget is spent; no run starts after it, and a run whose training is still going
    then stops at a checkpoint (written there) and resumes from it at the next call, which goes
    on where this one stopped. A run whose training finished in time is evaluated and saved
    whole. The progress bars show an estimate of the minutes left (:func:`minutes_left`).

    With ``processes`` (every process of a ``torchrun`` launch calls this with the same
    arguments): in ``"data"`` mode the runs go in the same order, each trained by all processes
    together (:func:`run_one`); in ``"runs"`` mode each process takes the next run of the list
    whenever it is free (each made exactly as one process would), the processes wait for each
    other after the sweep and at the end, and rank 0 writes any results file it does not see
    (machines without a shared folder). Only rank 0 draws the figures; every rank returns the
    results of all finished runs, in the list's order.
    """
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    arms = (
        *(encodings if encodings is not None else preset.encoding_names()),
        *(ablations if ablations is not None else preset.ablations),
    )
    seeds = tuple(seeds if seeds is not None else preset.seeds)
    objectives = tuple(objectives or preset.objectives)
    specs = {arm: get_arm(arm) for arm in arms}  # resolved once; a ValueError lists the valid ones
    if not arms or not seeds:
        raise ValueError("a comparison needs at least one arm and one seed")
    for seed in seeds:
        _check_seed(seed)
    for objective in objectives:
        _check_objective(objective)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    _CALLS["n"] += 1
    if processes is not None and processes.mode == "data":
        for objective in objectives:
            batch = preset.train_config(objective).batch_size
            if batch % processes.world_size:
                raise ValueError(
                    f"preset {preset.name!r} trains {objective} on batches of {batch} rows, which "
                    f"{processes.world_size} processes cannot share evenly: start a number of "
                    f"processes that divides {batch}, or use --parallel runs"
                )

    if budget_seconds is not None and processes is not None:
        raise ValueError("a time budget slices the runs of one process; not under torchrun")
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    sweep, runs = comparison_plan(preset, arms, seeds, objectives)
    pairs = list(dict.fromkeys((o, specs[a].encoding) for o, a, _ in runs))
    main = processes is None or processes.is_main
    runs_mode = processes is not None and processes.mode == "runs"
    show = progress and (main or runs_mode)
    rank_note = f" (rank {processes.rank})" if runs_mode else ""
    data: _Data | None = None

    def needs_data(path: Path) -> _Data | None:
        nonlocal data
        if data is None and (force or not path.exists()):
            data = _Data(preset)
        return data

    from tqdm.auto import tqdm

    common = dict(
        out_dir=out_dir, checkpoint_dir=checkpoint_dir, force=force, progress=show,
        stop_after_steps=stop_after_steps, threads=threads, processes=processes,
        deadline=deadline,
    )  # fmt: skip
    costs: dict[str, list[float]] = {"sweep": [], "runs": []}
    timing = timing_speeds(out_dir)

    def left(done_sweep: int, done_runs: int) -> str:
        minutes = minutes_left(preset, sweep[done_sweep:], runs[done_runs:], costs, timing)
        return "?" if minutes is None else f"~{minutes:.0f} min"

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    swept: list[dict] = []
    if sweep:
        bar = tqdm(total=len(sweep), desc=f"{preset.name} sweep{rank_note}", disable=not show)
        try:
            for i, (objective, encoding, rate, seed) in enumerate(_mine(processes, sweep, "sweep")):
                if out_of_time():
                    break
                name = sweep_name(objective, encoding, rate, seed)
                bar.set_postfix(run=name, left=left(i, 0), refresh=True)
                result = run_sweep_one(
                    encoding, objective, rate, preset, seed=seed,
                    data=needs_data(out_dir / "sweep" / f"{name}.json"), **common,
                )  # fmt: skip
                if result is not None:
                    swept.append(result)
                    costs["sweep"].append(run_cost(result))
                elif deadline is not None:
                    break  # out of time: the next call resumes this run from its checkpoint
                bar.update(1)
        finally:
            bar.close()
        swept = _gather(processes, swept)
        if runs_mode and processes.is_main:
            for result in swept:
                path = out_dir / "sweep" / f"{result['run']}.json"
                if not path.exists():
                    _write_result(path, result)
        if len(swept) < len(sweep):
            return []  # stopped early (stop_after_steps): the runs need every sweep run
    rates = chosen_learning_rates(out_dir, preset, pairs, sweeps=swept)
    results: list[dict] = []
    bar = tqdm(total=len(runs), desc=f"{preset.name} comparison{rank_note}", disable=not show)
    try:
        for i, (objective, arm, seed) in enumerate(_mine(processes, runs, "runs")):
            if out_of_time():
                break
            name = run_name(objective, arm, seed)
            bar.set_postfix(run=name, left=left(len(sweep), i), refresh=True)
            result = run_one(
                specs[arm], objective, preset, seed=seed,
                learning_rate=rates[objective, specs[arm].encoding],
                data=needs_data(out_dir / f"{name}.json"), **common,
            )  # fmt: skip
            if result is not None:
                results.append(result)
                costs["runs"].append(run_cost(result))
            elif deadline is not None:
                break  # out of time: the next call resumes this run from its checkpoint
            bar.update(1)
    finally:
        bar.close()
    if runs_mode:
        finished = {r["run"]: r for r in _gather(processes, results)}
        results = [finished[run_name(*run)] for run in runs if run_name(*run) in finished]
        if processes.is_main:
            for result in results:
                path = out_dir / f"{result['run']}.json"
                if not path.exists():
                    _write_result(path, result)
    if main and figures and results and len(results) == len(runs):
        write_report(out_dir, preset)
    return results


# ---------------------------------------------------------------------------------------------
# Speed, measured on its own
# ---------------------------------------------------------------------------------------------


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
    data = _Data(preset)
    rows = []
    from tqdm.auto import tqdm

    todo = [(o, a) for o in objectives for a in arms if get_arm(a).trains(o)]
    with _torch_threads(threads if threads is not None else _threads(preset)):
        for objective, arm in tqdm(todo, desc="timing", disable=not progress):
            config = replace(
                preset.train_config(objective), steps=steps, warmup_steps=0,
                eval_every=steps, checkpoint_every=steps,
            )  # fmt: skip
            tokens = config.steps * config.batch_size * config.seq_len
            wall, cpu, loads = [], [], [_load_average()]
            for _ in range(repeats):
                torch.manual_seed(0)
                model = MiniBert(preset.model_config(arm, objective)).to(preset.device)
                state = train_model(
                    model, data.train, data.curve[:1], config, progress=False, desc="timing"
                )
                wall.append(tokens / state.train_seconds)
                cpu.append(tokens / state.train_cpu_seconds)
                loads.append(_load_average())
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
    _write_result(path, timing)
    return timing


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------
# Reading back, and the report
# ---------------------------------------------------------------------------------------------


def write_report(out_dir: str | Path, preset: Preset | str) -> list[Path]:
    """Draw the figures and write ``summary.md`` in ``out_dir`` from every run of ``preset``
    saved there (:func:`preset_results`, with the sweep, the timing pass and the log of the
    sittings when present); returns the files written."""
    from course_lib.compare.figures import write_figures

    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir)
    files = [path for path in out_dir.glob("*.json") if path.name not in LOG_FILES]
    try:
        saved = preset_results(out_dir, preset) if files else []
    except FileNotFoundError:  # results files, but none of this format
        saved = []
    if not saved:
        raise ComparisonFileError(no_runs_message(out_dir, preset.name, len(files)))
    written = write_figures(saved, out_dir)
    summary = out_dir / "summary.md"
    summary.write_text(
        summary_markdown(
            saved,
            sweeps=sweep_results(out_dir, preset),
            folder=out_dir,
            planned_seeds=preset.seeds,
        ),
        encoding="utf-8",
    )
    return [*written, summary]


def preset_results(out_dir: str | Path, preset: Preset | str) -> list[dict]:
    """The runs saved in ``out_dir`` (:func:`~course_lib.compare.results.load_results` order)
    that ``preset`` would make with its current configuration: the same identity (model,
    budgets, learning rate chosen by the saved sweep, probes, evaluation); results of any other
    configuration are left out."""
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    saved = load_results(out_dir)
    sweeps = sweep_results(out_dir, preset)
    rates: dict[tuple[str, str], float | None] = {}
    for pair in {(r["objective"], r["encoding"]) for r in saved}:
        try:
            rates[pair] = chosen_learning_rates(out_dir, preset, [pair], sweeps=sweeps)[pair]
        except FileNotFoundError:  # no complete sweep: no run of this pair is the preset's
            rates[pair] = math.nan
    kept = []
    for r in saved:
        rate = rates[r["objective"], r["encoding"]]
        if not math.isnan(rate) and r.get("identity") == preset.identity(
            r["arm"], r["objective"], r["seed"], rate
        ):
            kept.append(r)
    return kept
