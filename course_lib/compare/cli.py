"""The command line of the comparison: ``python -m course_lib.compare``.

``--encodings`` and ``--objectives`` take names separated by spaces (``--encodings rope rse``) or
commas (``--encodings rope,rse``); encodings are checked against
:data:`course_lib.encodings.REGISTRY` and an unknown name exits with the list of valid ones.
Run it again after an interruption (or after ``--stop-after-steps``) and it resumes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from course_lib.compare.presets import PRESETS, choose_preset
from course_lib.compare.results import default_out_dir, summary_markdown
from course_lib.compare.runner import run_comparison
from course_lib.encodings import REGISTRY
from course_lib.model import OBJECTIVES

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


class _Flatten(argparse.Action):
    """Store the names of every word of a ``nargs="+"`` option as one tuple, in order, once each."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        names = [name for word in values for name in word]
        setattr(namespace, self.dest, tuple(dict.fromkeys(names)))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.compare [--preset cpu] [--encodings rope rse] [--out DIR] ...``

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
        type=Path,
        metavar="DIR",
        help="results folder (default figures/compare_<preset>)",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, help="checkpoint folder (default <out-dir>/checkpoints)"
    )
    parser.add_argument(
        "--encodings",
        nargs="+",
        type=_names("encoding", tuple(REGISTRY)),
        action=_Flatten,
        metavar="NAME",
        help="encodings to run, space- or comma-separated (default: every registered one: "
        f"{', '.join(REGISTRY)})",
    )
    parser.add_argument(
        "--objectives",
        nargs="+",
        type=_names("objective", OBJECTIVES),
        action=_Flatten,
        metavar="NAME",
        help=f"objectives to run, space- or comma-separated (default: {', '.join(OBJECTIVES)})",
    )
    parser.add_argument("--force", action="store_true", help="recompute finished runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--no-figures", action="store_true", help="skip figures and summary.md")
    parser.add_argument("--threads", type=int, help="CPU threads (default: the preset's)")
    parser.add_argument(
        "--stop-after-steps",
        type=int,
        help="stop each run's training after this many steps, keeping the checkpoint "
        "(simulates an interruption; run again without it to resume)",
    )
    args = parser.parse_args(argv)
    try:
        preset = choose_preset(args.preset)
    except ValueError as error:
        parser.error(str(error))
    started = time.perf_counter()
    results = run_comparison(
        preset,
        encodings=args.encodings,
        objectives=args.objectives,
        out_dir=args.out_dir,
        checkpoint_dir=args.checkpoint_dir,
        force=args.force,
        progress=not args.no_progress,
        figures=not args.no_figures,
        threads=args.threads,
        stop_after_steps=args.stop_after_steps,
    )
    elapsed = time.perf_counter() - started
    out_dir = args.out_dir or default_out_dir(preset.name)
    print(f"{len(results)} finished run(s) in {out_dir} ({elapsed / 60:.1f} min this call)")
    if results:
        print(summary_markdown(results))
    return 0
