"""Measure how long each notebook takes to run top to bottom on this machine's CPU.

    python -m course_lib.classroom.timings [notebooks/NN_name.ipynb ...]

Each notebook runs in a fresh ``python3`` kernel, as the test run does (worked solutions,
figures to a temporary folder, nothing written back). Its run time is the sum of its code
cells' run times (from sending a cell to the kernel's reply), so kernel start-up is not counted.
Other work on the machine only slows a run down, so each notebook keeps the fastest of its
measurements (``--fresh`` forgets earlier ones), with the load average while it ran. The results
go to ``notebooks/guides/timings.json``, which the course map reads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from tqdm.auto import tqdm

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO_ROOT / "notebooks"
TIMINGS_FILE = NOTEBOOKS / "guides" / "timings.json"

__all__ = ["TIMINGS_FILE", "measure", "read_timings"]


def measure(path: Path, timeout: float = 600.0) -> float:
    """Run the notebook at ``path`` once in a fresh kernel and return the sum of its code cells'
    run times (s): each from sending the cell to the kernel's reply, which follows its last
    output. (``jupyter_client`` directly: nbclient can wait out its timeout after a widget cell.)"""
    import nbformat
    from jupyter_client.manager import start_new_kernel

    nb = nbformat.read(path, as_version=4)
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(path.parent))
    try:
        total = 0.0
        for cell in nb.cells:
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            started = time.perf_counter()
            reply = client.execute_interactive(
                cell.source, store_history=False, timeout=timeout, output_hook=lambda msg: None
            )
            total += time.perf_counter() - started
            if reply["content"]["status"] != "ok":
                content = reply["content"]
                raise RuntimeError(
                    f"{path.name} cell {cell.get('id')!r} failed: "
                    f"{content.get('ename')}: {content.get('evalue')}"
                )
        return total
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def read_timings() -> dict:
    """The committed measurements: ``{"machine": ..., "notebooks": {stem: seconds}}``."""
    if not TIMINGS_FILE.exists():
        raise FileNotFoundError(
            f"{TIMINGS_FILE} is missing: run `python -m course_lib.classroom.timings`"
        )
    return json.loads(TIMINGS_FILE.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook")
    parser.add_argument("--fresh", action="store_true", help="forget earlier measurements")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"no such notebook: {', '.join(missing)}")
    os.environ.update(
        COURSE_SOLUTIONS="1",
        COURSE_OUTPUT_DIR=tempfile.mkdtemp(prefix="course-timings-"),
        TQDM_DISABLE="1",
    )  # the kernels inherit these, as under the test run
    fresh = args.fresh or not TIMINGS_FILE.exists()
    results = {"notebooks": {}} if fresh else read_timings()
    results["machine"] = {
        "cpu_cores": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "measured": time.strftime("%Y-%m-%d"),
    }
    loads = results.setdefault("load_average_1min", {})
    for path in tqdm(paths, desc="notebooks", unit="nb", disable=False):
        load_before = os.getloadavg()[0]
        seconds = measure(path)
        load = round((load_before + os.getloadavg()[0]) / 2, 1)
        tqdm.write(f"{path.name}: {seconds:.1f} s (load average {load})")
        if seconds < results["notebooks"].get(path.stem, float("inf")):
            results["notebooks"][path.stem] = round(seconds, 1)
            loads[path.stem] = load
        TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS_FILE.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
