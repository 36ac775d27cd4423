"""``python -m course_lib.gpu_check``: the plan of a run, the run, the report."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.gpu_check import correctness, notebooks, report, speed, training
from course_lib.gpu_check.device import Device, NoGpuError, detect

__all__ = ["PHASES", "Plan", "main", "make_plan", "run_check"]

PHASES = ("correctness", "speed", "notebooks", "training")


@dataclass
class Plan:
    """What one run does: the cases of each phase (an empty list skips it) and how."""

    correctness: list = field(default_factory=list)
    speed: list = field(default_factory=list)
    notebooks: list = field(default_factory=list)
    training: object = None  # a Preset, or None to skip
    training_encodings: tuple | None = None
    root: Path | None = None
    workers: int = 0
    notebook_workers: int = 4
    notebook_timeout: float = 600.0
    tune: bool = True  # the speed phase's kernels choose their tiles by timing (kernels/tuning.py)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m course_lib.gpu_check",
        description="Check the course's kernels on this GPU: correctness against the reference, "
        "speed against SDPA and FlexAttention, the kernel notebooks under nbval, a short "
        "training run; writes figures/gpu_check/<device>.json and .png.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer sizes (seq 1024 and 4096, head_dim 64), 100 training steps",
    )
    p.add_argument("--seqs", type=int, nargs="+", default=None, help="speed: sequence lengths")
    p.add_argument("--head-dims", type=int, nargs="+", default=None, help="speed: head dims")
    p.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="only these methods of attention() (e.g. fox cope); training: only these encodings",
    )
    p.add_argument("--skip", nargs="+", default=[], choices=PHASES, help="phases to leave out")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes checking kernels in parallel (default: half the CPU cores, at most 8)",
    )
    p.add_argument("--notebook-workers", type=int, default=4)
    p.add_argument("--notebook-timeout", type=float, default=600.0, help="seconds per notebook")
    p.add_argument("--training-steps", type=int, default=None, help="default 200 (--quick: 100)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="report folder (default: figures/gpu_check in the checkout)",
    )
    p.add_argument("--no-figure", action="store_true")
    p.add_argument(
        "--no-tune",
        action="store_true",
        help="time the kernels' static tiles (as reports before tuning did) instead of letting "
        "the first call of each shape time the candidates and keep the fastest",
    )
    args = p.parse_args(argv)
    for name in ("seqs", "head_dims"):
        values = getattr(args, name) or []
        if any(v < 1 for v in values):
            p.error(f"--{name.replace('_', '-')} must be positive integers, got {values}")
    return args


def make_plan(device: Device, args: argparse.Namespace) -> Plan:
    """The cases of a run on ``device`` (bf16 only where it has bf16 tensor cores; the speed
    phase in bf16, else fp16)."""
    from course_lib.compare.presets import PRESETS

    seqs = args.seqs or ((1024, 4096) if args.quick else (1024, 4096, 8192))
    dims = tuple(args.head_dims or ((64,) if args.quick else (64, 128)))
    plan = Plan(root=notebooks.checkout_root())
    if "correctness" not in args.skip:
        wide = tuple(d for d in dims if d != 64)
        plan.correctness = correctness.correctness_cases(device.bf16, (64,), wide)
        # the timed dtype at an aligned length too (it also compiles what the speed phase runs)
        plan.correctness += [
            correctness.CorrectnessCase(c.method, device.timing_dtype, True, d, seq=256, heads=16)
            for d in dims
            for c in plan.correctness
            if c.dtype == "fp32" and c.head_dim == 64 and c.causal
        ]
    if "speed" not in args.skip:
        plan.speed = speed.speed_cases(seqs, dims, device.timing_dtype)
    if "notebooks" not in args.skip and plan.root is not None:
        plan.notebooks = notebooks.kernel_notebooks(plan.root)
    if "training" not in args.skip:
        steps = args.training_steps or (100 if args.quick else 200)
        autocast = "bfloat16" if device.bf16 else "float16"
        plan.training = training.short_preset(PRESETS["gpu"], steps, autocast)
    if args.methods:
        from course_lib.gpu_check.cases import methods

        unknown = sorted(set(args.methods) - set(methods()))
        if unknown:
            raise SystemExit(f"gpu_check: unknown method(s) {unknown}; known: {sorted(methods())}")
        wanted = set(args.methods)
        plan.correctness = [c for c in plan.correctness if c.method in wanted]
        plan.speed = [c for c in plan.speed if c.method in wanted]
        if plan.training is not None:
            arms = tuple(m for m in args.methods if m in plan.training.encoding_names())
            plan.training, plan.training_encodings = (plan.training, arms) if arms else (None, None)
    cpus = os.cpu_count() or 2
    plan.workers = args.workers if args.workers is not None else max(1, min(8, cpus // 2))
    plan.notebook_workers = args.notebook_workers
    plan.notebook_timeout = args.notebook_timeout
    plan.tune = not args.no_tune
    return plan


def _meta(device: Device, root: Path | None) -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    commit = None
    if root is not None:
        try:
            commit = (
                subprocess.run(
                    ["git", "rev-parse", "HEAD"],
                    cwd=root,
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout.strip()
                or None
            )
        except (OSError, subprocess.SubprocessError):
            commit = None
    return dict(
        device=device.describe(),
        torch=torch.__version__,
        triton=triton_version,
        python=platform.python_version(),
        platform=platform.platform(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=commit,
        command=" ".join(["python -m course_lib.gpu_check", *sys.argv[1:]]),
        note="measured on this device by python -m course_lib.gpu_check",
    )


def _unfinished(plan: Plan, rep: dict, speed_done: int | None = None) -> list[str]:
    """The phases of ``plan`` that ``rep`` does not hold yet (the speed phase's cases done so
    far named when it is under way)."""
    left = []
    for phase in ("correctness", "notebooks", "speed", "training"):
        if not getattr(plan, phase) or phase in rep:  # not planned (an empty list, None), or done
            continue
        if phase == "speed" and speed_done is not None:
            left.append(f"speed ({len(plan.speed) - speed_done} of {len(plan.speed)} cases left)")
        else:
            left.append(phase)
    return left


def _partial(rep: dict, seconds: dict, unfinished: list[str]) -> dict:
    """A copy of a report under way, labelled with what it does not hold yet and summarised."""
    out = dict(rep, meta=dict(rep["meta"], seconds=dict(seconds), unfinished=unfinished))
    out["summary"] = report.summarise(out)
    return out


def run_check(device: Device, plan: Plan, progress=None) -> dict:
    """Run the plan's phases on ``device`` and return the report (with its summary): the
    notebooks run alongside the correctness phase (both mostly compile kernels, on the CPU);
    speed and training run alone, as they are timed. ``progress(report)``, if given, gets a
    partial report (``meta.unfinished`` lists what it lacks) after each phase and each speed
    case, so that a run stopped early still leaves what it measured."""
    started = time.perf_counter()
    rep: dict = {"meta": _meta(device, plan.root)}
    seconds: dict[str, float] = {}
    notebook_rows: list[dict] = []
    thread = None

    def report_progress(speed_done: int | None = None) -> None:
        if progress is not None:
            progress(_partial(rep, seconds, _unfinished(plan, rep, speed_done)))

    if plan.notebooks:
        t0 = time.perf_counter()

        def run_notebooks():
            notebook_rows.extend(
                notebooks.run_notebooks(
                    plan.notebooks, plan.root, plan.notebook_workers, plan.notebook_timeout
                )
            )
            seconds["notebooks"] = round(time.perf_counter() - t0, 1)

        thread = threading.Thread(target=run_notebooks, daemon=True)
        thread.start()
    if plan.correctness:
        t0 = time.perf_counter()
        rep["correctness"] = correctness.run_correctness(
            plan.correctness, device.torch_device, plan.workers
        )
        seconds["correctness"] = round(time.perf_counter() - t0, 1)
        report_progress()
    if thread is not None:
        thread.join()
        rep["notebooks"] = notebook_rows
        report_progress()
    if plan.speed:
        from course_lib.runtime import load_kernel_module

        tuning = load_kernel_module("tuning")
        t0 = time.perf_counter()
        # the tiles each kernel timed and kept (the warm-up call of a shape chose them)
        tiles = "tuned on this GPU" if plan.tune else "static (--no-tune)"

        def after_case(records: list[dict], done: int) -> None:
            if progress is not None:
                partial = dict(rep, speed=records, tuning=tuning.choices())
                partial["meta"] = dict(rep["meta"], tiles=tiles)
                left = _unfinished(plan, rep, done)
                progress(
                    _partial(partial, dict(seconds, speed=round(time.perf_counter() - t0, 1)), left)
                )

        with nullcontext() if plan.tune else tuning.disabled():
            rep["speed"] = speed.run_speed(device, plan.speed, after_case)
        seconds["speed"] = round(time.perf_counter() - t0, 1)
        rep["meta"]["tiles"] = tiles
        rep["tuning"] = tuning.choices()
        report_progress()
    if plan.training is not None:
        t0 = time.perf_counter()
        rep["training"] = training.run_training(plan.training, plan.training_encodings)
        seconds["training"] = round(time.perf_counter() - t0, 1)
    seconds["total"] = round(time.perf_counter() - started, 1)
    rep["meta"]["seconds"] = seconds
    rep["summary"] = report.summarise(rep)
    return rep


def default_out(root: Path | None) -> Path:
    return (root / "figures" / "gpu_check") if root is not None else Path("gpu_check")


def main(argv=None) -> int:
    """Exit status: 0 all agree, 1 something failed, 2 no GPU here."""
    args = parse_args(argv)
    try:
        device = detect()
    except NoGpuError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    plan = make_plan(device, args)
    print(
        f"gpu_check on {device.name}: {len(plan.correctness)} kernel cases, "
        f"{len(plan.speed)} speed cases, {len(plan.notebooks)} notebooks, "
        f"training: {'yes' if plan.training is not None else 'no'}",
        flush=True,
    )
    out = args.out or default_out(plan.root)

    def save_progress(partial: dict) -> None:  # the JSON alone; the figure comes at the end
        report.write_report(partial, out, device.slug, figure=False)

    rep = run_check(device, plan, save_progress)
    paths = report.write_report(rep, out, device.slug, figure=not args.no_figure)
    print("\n".join(report.format_summary(rep)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if rep["summary"]["ok"] else 1
