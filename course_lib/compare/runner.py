"""The comparison runner: train and evaluate one (arm, objective, seed) run, or all of them.

:func:`run_one` trains :class:`~course_lib.model.MiniBert` with the preset's data, steps and
optimiser and the run's seed (:func:`course_lib.train.train_model`), then evaluates it:

1. validation loss and bits per byte at the training length, and at 2x and 4x that length on
   the same targets (the learned table has exactly ``seq_len`` rows, so past it the JSON says
   "not_applicable"); the loss by target position bucket in windows of 8x
   (:func:`course_lib.evaluate.position_bucket_losses`);
2. the word-order probe and the positional-retrieval probe of :mod:`course_lib.data`, with the
   protocol of :func:`course_lib.train.probe_finetune`: a seeded fine-tune of a copy of the
   pretrained model on probe examples (identical examples, order and budget for every run)
   and the accuracy of the answer among its candidates on held-out, unseen examples, with its
   binomial standard error (a :class:`~course_lib.compare.presets.ProbeSpec` says which
   objectives a probe runs on);
3. the values the encoding's modules report (``reported_values``: RSE's lambda per head);
4. cost: parameters by part, training tokens per second, peak memory.

Each run writes ``<out_dir>/<objective>_<arm>_s<seed>.json`` (config, preset, hardware, curves,
metrics) and keeps a checkpoint in ``<checkpoint_dir>/<objective>_<arm>_s<seed>.pt`` (model,
optimiser, step, RNG states; the default checkpoint folder ignores itself in git). An interrupted
comparison resumes where it stopped, mid-run too; a finished run is skipped unless ``force=True``.
:func:`run_comparison` makes every run of a preset, then :func:`write_report` writes the figures
(:mod:`course_lib.compare.figures`) and ``summary.md`` into ``out_dir``.

Both take ``processes`` (:class:`course_lib.distributed.Processes`, from ``torchrun``; None by
default: one process, no process group). In ``"data"`` mode every run is trained by all the
processes together and rank 0 alone evaluates and writes; in ``"runs"`` mode each process makes
whole runs. :mod:`course_lib.distributed` describes both.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from course_lib.compare.arms import get_arm
from course_lib.compare.files import ComparisonFileError, no_runs_message, read_result
from course_lib.compare.presets import Preset, choose_preset
from course_lib.compare.results import (
    default_out_dir,
    hardware_label,
    load_results,
    run_name,
    summary_markdown,
)
from course_lib.data import ProbeBatch, corpus_source, train_val_split, unigram_entropy
from course_lib.distributed import Processes, tensor_fingerprint
from course_lib.encodings import get_encoding
from course_lib.evaluate import extrapolation_losses, peak_memory, position_bucket_losses
from course_lib.model import OBJECTIVES, MiniBert
from course_lib.train import TrainState, probe_finetune, train_model

__all__ = [
    "hardware_description",
    "preset_results",
    "retrieval_bag_baseline",
    "run_comparison",
    "run_one",
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


# ---------------------------------------------------------------------------------------------
# One run
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


class _Data:
    """The token streams, loaded once per comparison."""

    def __init__(self) -> None:
        self.train, self.val = train_val_split()
        self.source = corpus_source()
        self.unigram_entropy = unigram_entropy(self.train)


def _binned_accuracy(correct: list[bool], positions: list[int]) -> dict:
    """Accuracy per target position: ``{"position": [...], "accuracy": [...], "count": [...]}``."""
    table: dict[int, list[int]] = {}
    for ok, pos in zip(correct, positions, strict=True):
        table.setdefault(pos, [0, 0])
        table[pos][0] += int(ok)
        table[pos][1] += 1
    keys = sorted(table)
    return {
        "position": keys,
        "accuracy": [table[k][0] / table[k][1] for k in keys],
        "count": [table[k][1] for k in keys],
    }


def run_one(
    arm: str,
    objective: str,
    preset: Preset | str = "auto",
    *,
    seed: int = 0,
    out_dir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    stop_after_steps: int | None = None,
    threads: int | None = None,
    data: _Data | None = None,
    processes: Processes | None = None,
) -> dict | None:
    """Train and evaluate one (arm, objective, seed) run; return its results dict.

    ``arm`` is an encoding's name or an ablation's (:mod:`course_lib.compare.arms`); ``seed``
    seeds the model's initialisation and the order of its training data (probe examples and
    evaluation text are the same for every seed). Reads ``<out_dir>/<objective>_<arm>_s<seed>.json``
    instead if it exists and matches this preset (``force=True`` recomputes, deleting the old
    checkpoint first). Resumes from ``<checkpoint_dir>/<objective>_<arm>_s<seed>.pt`` if present. With ``stop_after_steps`` the
    training stops there (simulating an interruption), the checkpoint is kept and ``None`` is
    returned; call again without it to finish. On CPU the run uses ``threads`` (default: the
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
    get_arm(arm)  # validates the name: a ValueError lists the valid ones
    _check_objective(objective)
    _check_seed(seed)
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else out_dir / "checkpoints"
    name = run_name(objective, arm, seed)
    result_path = out_dir / f"{name}.json"
    checkpoint_path = checkpoint_dir / f"{name}.pt"
    identity = preset.identity(arm, objective, seed)
    team = processes if processes is not None and processes.mode == "data" else None

    def saved_result() -> dict | None:
        if force:
            result_path.unlink(missing_ok=True)
            checkpoint_path.unlink(missing_ok=True)
        if result_path.exists():
            saved = read_result(result_path)
            if saved.get("identity") != identity:
                raise ComparisonFileError(
                    f"{result_path} was computed with a different configuration than preset "
                    f"{preset.name!r}; recompute it with force=True (--force) or use another "
                    "out_dir"
                )
            return saved
        _prepare_checkpoint_dir(checkpoint_dir)
        return None

    saved = saved_result() if team is None else team.from_main(saved_result)
    if saved is not None:
        return saved
    data = data or _Data()
    if team is not None:
        team.check_same("the training text", tensor_fingerprint(data.train))
    threads = threads if threads is not None else preset.cpu_threads
    with _torch_threads(threads if preset.device == "cpu" else None):
        return _train_and_evaluate(
            arm, objective, seed, preset, identity, data, result_path, checkpoint_path,
            progress, stop_after_steps, processes,
        )  # fmt: skip


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


def _train_and_evaluate(
    arm: str,
    objective: str,
    seed: int,
    preset: Preset,
    identity: dict,
    data: _Data,
    result_path: Path,
    checkpoint_path: Path,
    progress: bool,
    stop_after_steps: int | None,
    processes: Processes | None = None,
) -> dict | None:
    name = run_name(objective, arm, seed)
    team = processes if processes is not None and processes.mode == "data" else None
    device = torch.device(preset.device) if team is None else team.device
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train_config = preset.train_config(objective, seed)
    torch.manual_seed(train_config.seed)
    model = MiniBert(preset.model_config(arm, objective)).to(device)
    state = train_model(
        model,
        data.train,
        data.val,
        train_config,
        checkpoint_path=checkpoint_path,
        meta=identity,
        stop_after_steps=stop_after_steps,
        progress=progress,
        desc=f"{name} train",
        data_parallel=team,
    )
    if not state.finished:
        return None

    def evaluate() -> dict:
        return _evaluate_and_save(
            model, state, device, arm, objective, seed, preset, identity, data, result_path,
            progress, started, processes,
        )  # fmt: skip

    return evaluate() if team is None else team.from_main(evaluate)


def _evaluate_and_save(
    model: MiniBert,
    state: TrainState,
    device: torch.device,
    arm: str,
    objective: str,
    seed: int,
    preset: Preset,
    identity: dict,
    data: _Data,
    result_path: Path,
    progress: bool,
    started: float,
    processes: Processes | None,
) -> dict:
    """Evaluate the trained ``model`` (extrapolation, probes, cost) and write its results file."""
    name = run_name(objective, arm, seed)
    train_config = preset.train_config(objective, seed)
    extrapolation = extrapolation_losses(
        model,
        data.val,
        train_config.seq_len,
        preset.length_multiples,
        eval_tokens=preset.eval_tokens,
        batch_size=preset.eval_batch_size,
        mask_prob=train_config.mask_prob,
        mask_seed=train_config.mask_seed,
        autocast_dtype=train_config.autocast_dtype,
    )
    buckets = position_bucket_losses(
        model,
        data.val,
        train_config.seq_len,
        preset.bucket_multiples,
        eval_tokens=preset.bucket_eval_tokens,
        batch_size=preset.eval_batch_size,
        mask_prob=train_config.mask_prob,
        mask_seed=train_config.mask_seed,
        autocast_dtype=train_config.autocast_dtype,
    )
    evaluated = time.perf_counter()
    probes = {}
    for spec in preset.probes:
        if objective not in spec.objectives:
            continue
        train_probe, eval_probe = spec.make("train"), spec.make("eval")
        outcome = probe_finetune(
            model,
            train_probe,
            eval_probe,
            spec.finetune,
            autocast_dtype=train_config.autocast_dtype,
            progress=progress,
            desc=f"{name} {spec.task}",
        )
        accuracy = outcome["accuracy"]
        entry = {
            "accuracy": accuracy,
            # binomial standard error of this run's accuracy on its eval examples
            "standard_error": math.sqrt(max(accuracy * (1 - accuracy), 0.0) / len(eval_probe)),
            "chance": spec.chance,
            "eval_examples": len(eval_probe),
            "final_train_loss": outcome["final_train_loss"],
            "by_position": _binned_accuracy(
                outcome["correct"], eval_probe.target_position.tolist()
            ),
        }
        if spec.task == "retrieval":
            entry["bag_of_symbols_baseline"] = retrieval_bag_baseline(eval_probe)
        if spec.task == "word_order":
            entry["pairs_both_right"] = _pairs_both_right(outcome["correct"])
        probes[spec.task] = entry

    probed = time.perf_counter()
    hardware = hardware_description(device, processes)
    tokens_trained = train_config.steps * train_config.batch_size * train_config.seq_len
    first = extrapolation[0]
    result = {
        "identity": identity,
        "run": name,
        "arm": arm,
        "encoding": get_arm(arm).encoding,
        "seed": seed,
        "objective": objective,
        "preset": preset.name,
        "preset_description": preset.description,
        "label": f"{preset.name} preset, {hardware_label(hardware)}",
        "hardware": hardware,
        "data": {
            "corpus_source": data.source,
            "train_tokens": int(data.train.numel()),
            "val_tokens": int(data.val.numel()),
            "unigram_entropy_nats": data.unigram_entropy,
        },
        "curves": {"train": state.train_curve, "val": state.val_curve},
        "metrics": {
            "final_val_loss": first["loss"],
            "final_val_bits_per_byte": first["bits_per_byte"],
            "final_val_tokens": first["tokens"],
            "loss_note": (
                "nats per predicted byte token on held-out text; for mlm over the masked tokens only"
            ),
            "tokens_trained": tokens_trained,
            "train_seconds": state.train_seconds,
            "tokens_per_second": tokens_trained / state.train_seconds,
            "training_segments": state.segments,
            **(
                {"training_processes": state.processes}
                if any(n > 1 for n in state.processes)
                else {}
            ),
            "probe_seconds": probed - evaluated,
            "wall_seconds_this_segment": probed - started,
            "cpu_load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "peak_memory": peak_memory(device),
            "parameters": model.parameter_counts(),
        },
        "extrapolation": extrapolation,
        "position_buckets": buckets,
        "probes": probes,
        "learned_values": {
            f"layer{i}": values
            for i, layer in enumerate(model.layers)
            if (values := layer.attention.reported_values())
        },
    }
    _write_result(result_path, result)
    return result


def _write_result(path: Path, result: dict) -> None:
    """Write a results file atomically (a temporary file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _pairs_both_right(correct: list[bool]) -> float:
    """Fraction of word-order pairs (examples 2k, 2k+1) with both orders answered right."""
    pairs = [correct[i] and correct[i + 1] for i in range(0, len(correct) - 1, 2)]
    return sum(pairs) / max(1, len(pairs))


def _prepare_checkpoint_dir(path: Path) -> None:
    """Create the checkpoint folder with a ``.gitignore`` of ``*`` so git never picks it up."""
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# checkpoints are large and reproducible: never committed\n*\n")


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------


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
) -> list[dict]:
    """Every (seed, objective, arm) run of ``preset``; returns the results of the finished ones.

    The arms are ``encodings`` (default: the preset's, i.e. every registered sequence encoding
    unless the preset names some) and then ``ablations`` (default: the preset's; names from
    :data:`course_lib.compare.arms.ABLATIONS`), each checked before anything runs; ``seeds``
    default to the preset's. Runs go seed by seed (so an interrupted comparison has whole seeds),
    then objective by objective, arm by arm; a causal-only encoding has no masked-LM run.
    Finished runs are read back, unfinished ones resumed. Afterwards, if all requested runs
    finished and ``figures``, draws the figures and ``summary.md`` into ``out_dir`` (default
    ``figures/compare_<preset>/``) from every run of this preset saved there
    (:func:`preset_results`), so running one more arm or seed into a folder adds it to the
    figures instead of replacing them. ``threads`` overrides the preset's CPU thread count.

    With ``processes`` (every process of a ``torchrun`` launch calls this with the same
    arguments): in ``"data"`` mode the runs go in the same order, each trained by all processes
    together (:func:`run_one`); in ``"runs"`` mode process ``r`` makes runs ``r, r + N, ...`` of
    the list alone (each exactly as one process would), then waits for the others, and rank 0
    writes any results file it does not see (machines without a shared folder). Only rank 0
    draws the figures; every rank returns the results of all finished runs, in the list's order.
    """
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    arms = (
        *(encodings if encodings is not None else preset.encoding_names()),
        *(ablations if ablations is not None else preset.ablations),
    )
    seeds = tuple(seeds if seeds is not None else preset.seeds)
    objectives = tuple(objectives or preset.objectives)
    for arm in arms:
        get_arm(arm)  # a ValueError lists the valid ones
    if not arms or not seeds:
        raise ValueError("a comparison needs at least one arm and one seed")
    for seed in seeds:
        _check_seed(seed)
    for objective in objectives:
        _check_objective(objective)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    from tqdm.auto import tqdm

    if processes is not None and processes.mode == "data":
        for objective in objectives:
            batch = preset.train_config(objective).batch_size
            if batch % processes.world_size:
                raise ValueError(
                    f"preset {preset.name!r} trains {objective} on batches of {batch} rows, which "
                    f"{processes.world_size} processes cannot share evenly: start a number of "
                    f"processes that divides {batch}, or use --parallel runs"
                )
    # a causal-only encoding (FoX, CoPE) has no masked-LM run: MiniBert's MLM is bidirectional
    runs = [
        (o, a, seed)
        for seed in seeds
        for o in objectives
        for a in arms
        if o == "clm" or not get_encoding(get_arm(a).encoding).causal_only
    ]
    main = processes is None or processes.is_main
    mine = runs
    if processes is not None and processes.mode == "runs":
        mine = runs[processes.rank :: processes.world_size]
    data: _Data | None = None
    results: list[dict] = []
    show = progress and (main or (processes is not None and processes.mode == "runs"))
    desc = f"{preset.name} comparison"
    if processes is not None and processes.mode == "runs":
        desc += f" (rank {processes.rank})"
    bar = tqdm(mine, desc=desc, **({} if show else {"disable": True}))
    try:
        for objective, arm, seed in bar:
            name = run_name(objective, arm, seed)
            bar.set_postfix(run=name, refresh=True)
            needs_data = force or not (out_dir / f"{name}.json").exists()
            if needs_data and data is None:
                data = _Data()
            result = run_one(
                arm,
                objective,
                preset,
                seed=seed,
                out_dir=out_dir,
                checkpoint_dir=checkpoint_dir,
                force=force,
                progress=show,
                stop_after_steps=stop_after_steps,
                threads=threads,
                data=data,
                processes=processes,
            )
            if result is not None:
                results.append(result)
    finally:
        bar.close()
    if processes is not None and processes.mode == "runs":
        results = _gather_runs(processes, runs, results, out_dir)
    if main and figures and results and len(results) == len(runs):
        write_report(out_dir, preset)
    return results


def write_report(out_dir: str | Path, preset: Preset | str) -> list[Path]:
    """Draw the figures and write ``summary.md`` in ``out_dir`` from every run of ``preset``
    saved there (:func:`preset_results`); returns the files written."""
    from course_lib.compare.figures import write_figures

    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir)
    files = list(out_dir.glob("*.json"))
    saved = preset_results(out_dir, preset) if files else []
    if not saved:
        raise ComparisonFileError(no_runs_message(out_dir, preset.name, len(files)))
    written = write_figures(saved, out_dir)
    summary = out_dir / "summary.md"
    summary.write_text(summary_markdown(saved), encoding="utf-8")
    return [*written, summary]


def _gather_runs(
    processes: Processes, runs: list[tuple[str, str, int]], mine: list[dict], out_dir: Path
) -> list[dict]:
    """``"runs"`` mode: wait for every process to finish its runs (a barrier that names a rank
    that does not arrive within the timeout), collect every rank's results in ``runs`` order,
    and on rank 0 write the results files it does not see."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=processes.timeout_seconds)
    dist.monitored_barrier(group=processes.objects, timeout=timeout, wait_all_ranks=True)
    finished = {r["run"]: r for part in processes.all_gather(mine) for r in part}
    ordered = [finished[run_name(*run)] for run in runs if run_name(*run) in finished]
    if processes.is_main:
        for result in ordered:
            path = out_dir / f"{result['run']}.json"
            if not path.exists():
                _write_result(path, result)
    return ordered


def preset_results(out_dir: str | Path, preset: Preset | str) -> list[dict]:
    """The runs saved in ``out_dir`` (:func:`~course_lib.compare.results.load_results` order)
    that ``preset`` would make with its current configuration: the same identity (model,
    budgets, probes, evaluation); results of any other configuration are left out."""
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    return [
        r
        for r in load_results(out_dir)
        if r.get("identity") == preset.identity(r["arm"], r["objective"], r["seed"])
    ]
