"""The command line of the comparison: ``python -m course_lib.compare``.

``--encodings`` and ``--objectives`` take names separated by spaces (``--encodings rope rse``) or
commas (``--encodings rope,rse``); encodings are checked against
:data:`course_lib.encodings.REGISTRY` and an unknown name exits with the list of valid ones.
Run it again after an interruption (or after ``--stop-after-steps``) and it resumes. Each call
that trains appends one record to ``<out>/sessions.json`` (when it started, how long it ran, how
many processes, the machine's load), so the report can say how long the committed run took.
``--budget-minutes M`` makes one slice of the comparison: the runs in their fixed order (the
sweep's runs, sweep seed by sweep seed, then seed 0 of every arm under every objective, then seed
1, ...) until M minutes have passed; a run still training then stops at a checkpoint, and the
next call with the same options goes on from there. It commits nothing.
``--timing`` measures training speed in a separate pass (``timing.json``); ``--report`` only
redraws the report from what is saved.

Launched by ``torchrun`` with several processes (``torchrun --nproc_per_node N -m
course_lib.compare ...``), it creates a process group (:mod:`course_lib.distributed`) and
``--parallel`` chooses how the processes share the work: ``data`` (default) trains each run with
all of them (DistributedDataParallel), ``runs`` gives each process whole runs. Without
``torchrun`` no process group is created and the command runs as one process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from course_lib.compare.arms import ABLATIONS, get_arm
from course_lib.compare.files import ComparisonFileError, check_output_folder
from course_lib.compare.plan import comparison_plan
from course_lib.compare.presets import PRESETS, choose_preset
from course_lib.compare.report import preset_results, write_report
from course_lib.compare.results import (
    default_out_dir,
    headline_markdown,
    run_name,
    sweep_name,
    update_readme_headline,
)
from course_lib.compare.runner import run_comparison
from course_lib.compare.sweep import sweep_results
from course_lib.compare.timing import timing_pass
from course_lib.distributed import (
    DEFAULT_TIMEOUT_SECONDS,
    MODES,
    Processes,
    launched,
    start,
    stop,
)
from course_lib.model import OBJECTIVES
from course_lib.registry import sequence_encodings
from course_lib.train import CheckpointError

__all__ = ["main"]


def _names(what: str, valid: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse ``type``: one command-line word, split at commas, each part one of ``valid``."""

    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in valid]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what}(s) {', '.join(map(repr, bad)) or '(empty)'}; "
                f"valid: {', '.join(valid)}"
            )
        return items

    return parse


def _seeds(text: str) -> tuple[int, ...]:
    """An argparse ``type``: one word of seeds (ints >= 0), split at commas."""
    try:
        seeds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        seeds = ()
    if not seeds or any(x < 0 for x in seeds):
        raise argparse.ArgumentTypeError(f"seeds must be integers >= 0, got {text!r}")
    return seeds


def _positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _folder(text: str) -> Path:
    """An argparse ``type``: a folder name, not empty (an empty one is the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty; give a folder name (an empty one would write into the current folder)"
        )
    return Path(text)


def _runs_per_objective(arms: Sequence[str], objectives: Sequence[str]) -> dict[str, list[str]]:
    """The arms that have a run for each objective: a causal-only encoding has no masked-LM run
    (the masked-LM model attends both ways)."""
    return {
        objective: [arm for arm in arms if get_arm(arm).trains(objective)]
        for objective in objectives
    }


class _Flatten(argparse.Action):
    """Store the names of every word of a ``nargs="+"`` option as one tuple, in order, once each."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        names = [name for word in values for name in word]
        setattr(namespace, self.dest, tuple(dict.fromkeys(names)))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.compare [--preset cpu] [--seeds 0 1 2] [--encodings rope rse]
    [--ablations none] [--out DIR] ...``

    Returns the exit status (0); a bad argument exits through ``argparse`` (status 2) with a
    message that lists the valid values."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.compare",
        description="Train the mini BERT once per encoding and objective and compare them.",
    )
    parser.add_argument(
        "--preset",
        default="auto",
        choices=["auto", *PRESETS],
        help="auto = gpu if CUDA is available, else cpu",
    )
    parser.add_argument(
        "--out",
        "--out-dir",
        dest="out_dir",
        type=_folder,
        metavar="DIR",
        help="results folder (default figures/compare_<preset>)",
    )
    parser.add_argument(
        "--checkpoint-dir", type=_folder, help="checkpoint folder (default <out-dir>/checkpoints)"
    )
    parser.add_argument(
        "--encodings",
        nargs="+",
        type=_names("encoding", sequence_encodings()),
        action=_Flatten,
        metavar="NAME",
        help="encodings to run, space- or comma-separated (default: every registered sequence "
        f"encoding: {', '.join(sequence_encodings())})",
    )
    parser.add_argument(
        "--ablations",
        nargs="+",
        type=_names("ablation", (*(a.name for a in ABLATIONS), "none")),
        action=_Flatten,
        metavar="NAME",
        help="ablations to run too, or 'none' (default: the preset's; the cpu and gpu presets "
        f"run all of them: {', '.join(a.name for a in ABLATIONS)})",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=_seeds,
        action=_Flatten,
        metavar="SEED",
        help="training seeds, one run per seed (default: the preset's; cpu and gpu: 0 1 2 3 4)",
    )
    parser.add_argument(
        "--objectives",
        nargs="+",
        type=_names("objective", OBJECTIVES),
        action=_Flatten,
        metavar="NAME",
        help=f"objectives to run, space- or comma-separated (default: {', '.join(OBJECTIVES)})",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="train nothing: draw the figures and summary.md from the runs saved in the folder "
        "(and, for the cpu preset's committed folder, README's headline table)",
    )
    parser.add_argument(
        "--timing",
        action="store_true",
        help="train nothing for the report: time a few training steps of every arm, back to "
        "back in this process, and write timing.json (the report's cost table)",
    )
    parser.add_argument("--force", action="store_true", help="recompute finished runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--no-figures", action="store_true", help="skip figures and summary.md")
    parser.add_argument("--threads", type=_positive_int, help="CPU threads (default: the preset's)")
    parser.add_argument(
        "--stop-after-steps",
        type=_positive_int,
        help="stop each run's training after this many steps, keeping the checkpoint "
        "(simulates an interruption; run again without it to resume)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=_seconds,
        metavar="M",
        help="make the next runs of the fixed order (sweep seed by sweep seed, then seed 0 of "
        "every arm under every objective, then seed 1, ...) for about M minutes: no run starts "
        "after that, a run still training stops at a checkpoint, and the same command run again "
        "goes on from there (one process only)",
    )
    parser.add_argument(
        "--parallel",
        choices=MODES,
        help="under torchrun with several processes: 'data' (default) trains each run with all "
        "processes (DistributedDataParallel), 'runs' gives each process whole runs",
    )
    parser.add_argument(
        "--dist-timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="under torchrun: how long a process waits for the others before the run fails "
        f"(default {DEFAULT_TIMEOUT_SECONDS:.0f}); it must exceed rank 0's evaluation of a run "
        "('data') or the time between the first and the last process finishing ('runs')",
    )
    args = parser.parse_args(argv)
    try:
        preset = choose_preset(args.preset)
        for option, folder in (("--out", args.out_dir), ("--checkpoint-dir", args.checkpoint_dir)):
            if folder is not None:
                check_output_folder(folder, option)
    except ValueError as error:
        parser.error(str(error))
    if args.report:
        out_dir = args.out_dir or default_out_dir(preset.name)
        try:
            written = write_report(out_dir, preset)
        except ComparisonFileError as error:
            if not sweep_results(out_dir, preset):
                parser.exit(2, f"{parser.prog}: error: {error}\n")
            # a comparison made in slices that has not reached a scored run yet
            print(f"no scored run yet in {out_dir}: {_slice_note(preset, args, Path(out_dir))}")
            return 0
        for path in written:
            print(f"wrote {path}")
        saved = preset_results(out_dir, preset)
        if preset.name == "cpu" and Path(out_dir).resolve() == default_out_dir("cpu").resolve():
            print(f"wrote {update_readme_headline(saved)}")
        for missing in preset.not_run_yet(saved):  # registered after the runs were made
            print(missing.describe())
        return 0
    if args.timing:
        out_dir = args.out_dir or default_out_dir(preset.name)
        arms = None
        if args.encodings is not None or args.ablations is not None:
            arms = (
                *(args.encodings or preset.encoding_names()),
                *(a for a in (args.ablations or preset.ablations) if a != "none"),
            )
        timing_pass(
            preset, out_dir, arms=arms, objectives=args.objectives, threads=args.threads,
            progress=not args.no_progress,
        )  # fmt: skip
        print(f"wrote {Path(out_dir) / 'timing.json'}")
        return 0
    _check_some_run(parser, args, preset)
    if args.budget_minutes is not None and launched():
        parser.error("--budget-minutes slices the runs of one process; launch without torchrun")
    processes = None
    if launched():
        processes = start(preset.device, args.parallel or "data", args.dist_timeout)
    elif args.parallel is not None:
        print(
            f"--parallel {args.parallel}: one process (not launched by torchrun with several), "
            "so every run is made by this process",
            file=sys.stderr,
        )
    started = time.perf_counter()
    load_at_start = _load_average()
    out_dir = Path(args.out_dir or default_out_dir(preset.name))
    try:
        results = run_comparison(
            preset,
            encodings=args.encodings,
            ablations=None
            if args.ablations is None
            else tuple(a for a in args.ablations if a != "none"),
            seeds=args.seeds,
            objectives=args.objectives,
            out_dir=args.out_dir,
            checkpoint_dir=args.checkpoint_dir,
            force=args.force,
            progress=not args.no_progress,
            figures=not args.no_figures,
            threads=args.threads,
            stop_after_steps=args.stop_after_steps,
            processes=processes,
            budget_seconds=None if args.budget_minutes is None else args.budget_minutes * 60,
        )
    except BaseException as error:
        if processes is None or processes.is_main:
            _log_session(out_dir, started, load_at_start, processes, f"stopped: {error!r}")
        if processes is not None and isinstance(error, Exception):
            print(_failure_message(processes, error), file=sys.stderr, flush=True)
        elif isinstance(error, (ComparisonFileError, CheckpointError)):
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        raise
    stop(processes)
    if processes is not None and not processes.is_main:
        return 0
    elapsed = time.perf_counter() - started
    _log_session(out_dir, started, load_at_start, processes, f"{len(results)} runs finished")
    print(f"{len(results)} finished run(s) in {out_dir} ({elapsed / 60:.1f} min this call)")
    if args.budget_minutes is not None:
        print(_slice_note(preset, args, out_dir))
    if results:
        print(headline_markdown(results))
    return 0


def _slice_note(preset, args: argparse.Namespace, out_dir: Path) -> str:
    """What a call with ``--budget-minutes`` leaves (:func:`slice_note`)."""
    arms = (
        *(args.encodings or preset.encoding_names()),
        *(a for a in (args.ablations or preset.ablations) if a != "none"),
    )
    return slice_note(preset, out_dir, arms, args.seeds, args.objectives)


def slice_note(preset, out_dir, arms=None, seeds=None, objectives=None) -> str:
    """What a slice of the comparison (``budget_seconds``, ``--budget-minutes``) leaves in
    ``out_dir``: how many of the sweep's and of the scored runs of :func:`comparison_plan`
    (``arms``, ``seeds`` and ``objectives`` default to the preset's) have their results file,
    and what to do next. Notebook 10's run-it-yourself cell prints it too."""
    out_dir = Path(out_dir)
    sweep, runs = comparison_plan(preset, arms, seeds, objectives)
    swept = sum((out_dir / "sweep" / f"{sweep_name(*item)}.json").exists() for item in sweep)
    made = sum((out_dir / f"{run_name(*item)}.json").exists() for item in runs)
    left = len(sweep) - swept + len(runs) - made
    return f"sweep: {swept} of {len(sweep)} runs; comparison: {made} of {len(runs)} runs; " + (
        "all made" if not left else "run the comparison again to go on"
    )


def _load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _log_session(
    out_dir: Path, started: float, load_at_start: float | None, processes, outcome: str
) -> None:
    """Append this call's record to ``<out_dir>/sessions.json``: when it started, its wall
    time, processes and mode, the 1-minute load average at its start and end, and how it
    ended."""
    try:
        _append_session(out_dir, started, load_at_start, processes, outcome)
    except OSError as error:  # a folder that cannot be written: say so, never hide the cause
        print(
            f"{out_dir / 'sessions.json'}: this call is not recorded ({error.strerror or error})",
            file=sys.stderr,
        )


def _append_session(
    out_dir: Path, started: float, load_at_start: float | None, processes, outcome: str
) -> None:
    path = out_dir / "sessions.json"
    sessions = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
    wall = time.perf_counter() - started
    sessions.append(
        {
            "started": (
                datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=wall)
            ).isoformat(timespec="seconds"),
            "wall_seconds": round(wall, 1),
            "processes": 1 if processes is None else processes.world_size,
            "parallel_mode": None if processes is None else processes.mode,
            "load_average_1min": [load_at_start, _load_average()],
            "outcome": outcome,
        }
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(sessions, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _check_some_run(parser: argparse.ArgumentParser, args: argparse.Namespace, preset) -> None:
    """Exit with the reason when the chosen encodings, ablations and objectives make no run;
    say which chosen encodings are skipped for an objective."""
    ablations = preset.ablations if args.ablations is None else args.ablations
    arms = [
        *(args.encodings or preset.encoding_names()),
        *(a for a in ablations if a != "none"),
    ]
    runs = _runs_per_objective(arms, args.objectives or preset.objectives)
    skipped = {
        objective: [arm for arm in arms if arm not in chosen] for objective, chosen in runs.items()
    }

    def why(names: list[str], objective: str) -> str:
        causal = [n for n in names if not get_arm(n).is_ablation]
        other = [n for n in names if get_arm(n).is_ablation]
        parts = []
        if causal:
            one = len(causal) == 1
            parts.append(
                f"{', '.join(causal)} {'is' if one else 'are'} causal only, so "
                f"{'it has' if one else 'they have'} no {objective} run (the masked-LM model "
                "attends both ways)"
            )
        if other:
            parts.append(
                f"{', '.join(other)}: an ablation trained only on "
                f"{', '.join(get_arm(other[0]).objectives)} (the objective its question is about)"
            )
        return "; ".join(parts)

    if not any(runs.values()):
        reasons = "; ".join(why(names, objective) for objective, names in skipped.items() if names)
        parser.error(
            f"nothing to run: {reasons}. Add clm to --objectives, or choose an encoding that "
            "attends both ways"
        )
    for objective, names in skipped.items():
        causal = [n for n in names if not get_arm(n).is_ablation]
        if causal and args.encodings is not None:
            print(
                f"note: {', '.join(causal)}: causal only, so no {objective} run",
                file=sys.stderr,
            )


def _failure_message(processes: Processes, error: Exception) -> str:
    """What a process prints when the comparison fails under torchrun: which rank, the error,
    and (for an error of the communication, a RuntimeError) what usually causes it."""
    text = str(error).strip()
    lines = [
        f"comparison failed on {processes.describe()}: {type(error).__name__}: "
        f"{text.splitlines()[0] if text else ''}"
    ]
    if isinstance(error, RuntimeError):
        lines.append(
            "If another process died or was killed, this one lost its connection to it "
            "(torchrun's report names the process that failed first); a process that waits more "
            f"than --dist-timeout ({processes.timeout_seconds:g} s) for the others fails the "
            "same way."
        )
    lines.append(
        "Finished runs and the last checkpoint are kept: run the same command again to resume."
    )
    return "\n".join(lines)
