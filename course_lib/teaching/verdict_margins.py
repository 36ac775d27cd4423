"""How far a notebook's trained numbers move between CPU kernels and thread counts.

    python -m course_lib.teaching.verdict_margins MODULE:FUNCTION --out figures/NN_margins.json
        [--seeds 0 1 2 3 4] [--capabilities default avx2 avx512] [--threads 1 2] [--append]

``FUNCTION(seed)`` trains what a notebook cell trains and returns ``{name: number}`` (e.g.
:func:`course_lib.teaching.rse_window.window_lambdas`). Each setting (an
``ATEN_CPU_CAPABILITY`` and a thread count) runs in a subprocess of its own, since PyTorch reads
the capability once, at import. A capability the CPU lacks is not always ignored: PyTorch 2.13
takes ``avx512`` on a CPU without AVX-512 and stops at the first vectorised operation with an
illegal instruction. So a probe process tries each capability first; the file lists those this
CPU cannot run (``not_run``), and ``--append`` on another machine adds its settings to the same
file. Each setting records the capability PyTorch used; none is run twice.

The file holds every value of every setting and, per name, the **spread**: the largest
difference over the settings for one seed (``max - min``), and the same in ``log10`` when every
value is positive (for quantities that travel orders of magnitude). When the function's module
declares ``VERDICTS`` (a list of :class:`Verdict`), the file also holds, for each, the number it
compares in every setting, that number's spread over the settings and the distance from its
threshold to the nearest value in spreads (``margin``), which the course wants at least 3
(:data:`MARGIN_FACTOR`), so that another CPU's rounding cannot flip the printed verdict. A
number that moves in steps (a step count evaluated every 50 steps, an accuracy over 500 examples)
declares its step (``resolution``): a spread smaller than one step counts as one, so a number
that did not move between the settings measured still keeps its threshold 3 steps away.
``--recompute`` rewrites the verdicts of an existing file from its settings (after a change to
``VERDICTS``), training nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARGIN_FACTOR",
    "Verdict",
    "Check",
    "verdict_margins",
    "load_function",
    "measure_setting",
    "spreads",
    "margin_in_spreads",
    "values_of",
    "main",
]

CAPABILITIES = ("default", "avx2", "avx512")
THREADS = (1, 2)
MARGIN_FACTOR = 3.0


@dataclass(frozen=True)
class Verdict:
    """A printed verdict over seeds: ``reduce({seed: {name: value}})`` compared with
    ``threshold`` (``above``: the verdict says the number is larger); ``log`` measures distances
    in ``log10`` (for numbers that travel orders of magnitude); ``resolution``: the smallest step
    the number can take, in the same units (0: it varies continuously)."""

    label: str
    reduce: Callable[[Mapping[str, Mapping[str, float]]], float]
    threshold: float
    above: bool
    log: bool = False
    resolution: float = 0.0

    def holds(self, per_seed: Mapping[str, Mapping[str, float]]) -> bool:
        value = self.reduce(per_seed)
        return value > self.threshold if self.above else value < self.threshold


@dataclass(frozen=True)
class Check:
    """A verdict a notebook prints of the one seed it trains live (seed 0): that seed's
    ``name`` compared with ``threshold`` (``above``: the verdict says it is larger).
    ``every_seed``: the notebook states it in general, so it must hold in every seed measured,
    not in seed 0 only. A chapter's test keeps the threshold :data:`MARGIN_FACTOR` spreads (the
    largest over all seeds, :func:`spreads`, and at least ``resolution``, the smallest step the
    number can take) from every seed-0 value seen. The margin the script records in the file
    (:meth:`verdict`) divides by seed 0's own spread instead, which is never larger: the
    file's margin can exceed the test's, never fall below it."""

    name: str
    threshold: float
    above: bool
    every_seed: bool = True
    resolution: float = 0.0

    def holds(self, value: float) -> bool:
        return value > self.threshold if self.above else value < self.threshold

    def says(self, value: float) -> str:
        """The verdict as the notebook prints it: ``"above 0.8: True"``."""
        return f"{'above' if self.above else 'below'} {self.threshold:g}: {self.holds(value)}"

    def verdict(self) -> Verdict:
        """The same check as a :class:`Verdict` (what this module's script records): seed 0's
        number, in every setting; :func:`verdict_margins` takes its spread over those values,
        that is seed 0's spread, not the largest over all seeds that a chapter's test uses."""

        def seed_0(values: Mapping[str, Mapping[str, float]]) -> float:
            return values["0"][self.name]

        side = "above" if self.above else "below"
        label = f"{self.name} {side} {self.threshold:g}"
        return Verdict(label, seed_0, self.threshold, self.above, resolution=self.resolution)


def load_function(spec: str) -> Callable[[int], Mapping[str, float]]:
    """``"package.module:function"`` -> the function."""
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    return getattr(importlib.import_module(module_name), name)


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _worker(spec: str, seeds: list[int], threads: int) -> dict:
    """Runs inside the subprocess: the environment already holds the capability."""
    import torch

    torch.set_num_threads(threads)
    fn = load_function(spec)
    values, seconds = {}, {}
    for seed in seeds:
        start = time.process_time()
        values[str(seed)] = {name: float(x) for name, x in fn(seed).items()}
        seconds[str(seed)] = round(time.process_time() - start, 1)
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads,
        "values": values,
        "cpu_seconds": seconds,
    }


def _environment(capability: str, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["ATEN_CPU_CAPABILITY"] = capability
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    # idle OpenMP threads sleep instead of spinning: the same arithmetic, but several threads
    # on tiny tensors no longer take many times the CPU time of one on a busy machine
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def resolved_capability(capability: str) -> str | None:
    """What PyTorch uses on this CPU when ``ATEN_CPU_CAPABILITY=capability``, or None when the
    CPU cannot run it (PyTorch 2.13 takes ``avx512`` on a CPU without AVX-512 and the first
    vectorised operation stops with an illegal instruction)."""
    code = (
        "import torch; torch.softmax(torch.randn(64, 64), -1).sum().item(); "
        "print(torch.backends.cpu.get_cpu_capability())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_environment(capability, 1),
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 else None


def measure_setting(spec: str, seeds: list[int], capability: str, threads: int) -> dict:
    """Run ``spec`` for ``seeds`` in a fresh process under one setting."""
    code = (
        "import json, sys; from course_lib.teaching.verdict_margins import _worker; "
        "print(json.dumps(_worker(sys.argv[1], [int(s) for s in sys.argv[2:]], "
        f"{int(threads)})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, spec, *map(str, seeds)],
        env=_environment(capability, threads),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{spec} under {capability}, {threads} thread(s) failed:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["requested"] = capability
    return result


def values_of(settings: Iterable[Mapping], name: str, seed: str) -> list[float]:
    """Every value of ``name`` for ``seed`` over the settings that have it."""
    return [s["values"][seed][name] for s in settings if name in s["values"].get(seed, {})]


def spreads(settings: list[Mapping]) -> dict[str, dict]:
    """Per name: the spread over the settings seed by seed, its largest, and the range of values
    (linear, and ``log10`` when every value is positive)."""
    names = sorted({n for s in settings for per_seed in s["values"].values() for n in per_seed})
    seeds = sorted({seed for s in settings for seed in s["values"]}, key=int)
    out = {}
    for name in names:
        per_seed = {seed: values_of(settings, name, seed) for seed in seeds}
        per_seed = {seed: v for seed, v in per_seed.items() if v}
        everything = [x for v in per_seed.values() for x in v]
        entry = {
            "min": min(everything),
            "max": max(everything),
            "spread_per_seed": {seed: max(v) - min(v) for seed, v in per_seed.items()},
        }
        entry["spread"] = max(entry["spread_per_seed"].values())
        if all(x > 0 for x in everything):
            logs = {seed: [math.log10(x) for x in v] for seed, v in per_seed.items()}
            entry["log10_spread_per_seed"] = {s: max(v) - min(v) for s, v in logs.items()}
            entry["log10_spread"] = max(entry["log10_spread_per_seed"].values())
        out[name] = entry
    return out


def margin_in_spreads(
    values: Iterable[float], threshold: float, spread: float, log: bool, resolution: float = 0.0
) -> float:
    """The distance from ``threshold`` to the nearest of ``values``, in units of ``spread`` or
    of ``resolution`` where that is larger (``log10`` distances when ``log``): a verdict needs
    at least 3. Infinite only for a number that neither moved nor moves in steps."""
    values = list(values)
    if log:
        gaps = [abs(math.log10(v) - math.log10(threshold)) for v in values]
    else:
        gaps = [abs(v - threshold) for v in values]
    unit = max(spread, resolution)
    return min(gaps) / unit if unit > 0 else math.inf


def _write(report: dict, path: Path) -> None:
    report["spreads"] = spreads(report["settings"]) if report["settings"] else {}
    module = importlib.import_module(report["function"].partition(":")[0])
    if report["settings"] and getattr(module, "VERDICTS", None):
        report["verdicts"] = verdict_margins(report["settings"], module.VERDICTS, report["seeds"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


def verdict_margins(
    settings: list[Mapping], verdicts: Iterable[Verdict], seeds: Iterable[int]
) -> dict[str, dict]:
    """For each verdict: its number in every setting that has all ``seeds``, whether it holds
    there, the number's spread over the settings and the threshold's distance to the nearest
    value in spreads, or in steps of its ``resolution`` where that is larger (``margin``;
    infinite when both are 0)."""
    wanted = {str(seed) for seed in seeds}
    complete = [s for s in settings if wanted <= set(s["values"])]
    out = {}
    for verdict in verdicts:
        values = [verdict.reduce({seed: s["values"][seed] for seed in wanted}) for s in complete]
        if verdict.log:
            spread = math.log10(max(values)) - math.log10(min(values))
        else:
            spread = max(values) - min(values)
        out[verdict.label] = {
            "threshold": verdict.threshold,
            "above": verdict.above,
            "log10": verdict.log,
            "values": values,
            "holds_everywhere": all(
                (v > verdict.threshold) if verdict.above else (v < verdict.threshold)
                for v in values
            ),
            "spread": spread,
            "resolution": verdict.resolution,
            "margin": margin_in_spreads(
                values, verdict.threshold, spread, verdict.log, verdict.resolution
            ),
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("function", help="MODULE:FUNCTION, FUNCTION(seed) -> {name: number}")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--capabilities", nargs="+", default=list(CAPABILITIES))
    parser.add_argument("--threads", type=int, nargs="+", default=list(THREADS))
    parser.add_argument(
        "--append", action="store_true", help="add this CPU's settings to an existing --out file"
    )
    parser.add_argument(
        "--recompute",
        action="store_true",
        help="rewrite the verdicts of the existing --out file from its settings, training nothing",
    )
    args = parser.parse_args(argv)
    load_function(args.function)  # fail early on a wrong name
    if args.recompute:
        report = json.loads(args.out.read_text())
        if report["function"] != args.function:
            raise SystemExit(f"{args.out} holds {report['function']}, not {args.function}")
        _write(report, args.out)
        return report

    report = {"function": args.function, "seeds": args.seeds, "settings": []}
    if args.append and args.out.exists():
        report = json.loads(args.out.read_text())
        if report["function"] != args.function or report["seeds"] != args.seeds:
            raise SystemExit(f"{args.out} holds {report['function']} for seeds {report['seeds']}")
    import torch

    cpu = cpu_name()
    done = {(s["cpu"], s["capability"], s["threads"]) for s in report["settings"]}
    report.setdefault("not_run", [])
    for capability in args.capabilities:
        actual = resolved_capability(capability)
        if actual is None:
            print(f"{capability}: this CPU cannot run it (--append on one that can)", flush=True)
            entry = {"cpu": cpu, "requested": capability, "why": "the CPU lacks it"}
            if entry not in report["not_run"]:
                report["not_run"].append(entry)
            continue
        for threads in args.threads:
            if (cpu, actual, threads) in done:
                print(f"{capability} ({actual}), {threads} thread(s): measured", flush=True)
                continue
            print(f"{capability} ({actual}), {threads} thread(s) ...", flush=True)
            result = measure_setting(args.function, args.seeds, capability, threads)
            result.update(cpu=cpu, torch=torch.__version__)
            report["settings"].append(result)
            done.add((cpu, result["capability"], threads))
            print(f"  {sum(result['cpu_seconds'].values()):.0f} s of CPU", flush=True)
            _write(report, args.out)  # after each setting: an interrupted run keeps what it did
    _write(report, args.out)
    for name, entry in report["spreads"].items():
        log = f", log10 spread {entry['log10_spread']:.3g}" if "log10_spread" in entry else ""
        span = f"{entry['min']:.4g} .. {entry['max']:.4g}"
        print(f"{name}: {span}, spread {entry['spread']:.3g}{log}")
    for label, entry in report.get("verdicts", {}).items():
        holds = entry["holds_everywhere"]
        print(f"{label}: holds everywhere {holds}, margin {entry['margin']:.2g} spreads")
    return report


if __name__ == "__main__":
    main()
