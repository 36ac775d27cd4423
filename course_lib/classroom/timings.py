"""Measure how long each notebook takes to run top to bottom on this machine's CPU.

    python -m course_lib.classroom.timings [notebooks/NN_name.ipynb ...]

Each notebook runs in a fresh ``python3`` kernel, as the test run does (worked solutions,
figures to a temporary folder, nothing written back). Its run time is the sum of its cells'
execution times (from the kernel's ``execute_input`` to its ``execute_reply``), so kernel start-up
and the runner's own waits are not counted. The results, with the machine's core count and load
average, go to ``notebooks/guides/timings.json``, which the course map reads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import datetime
from pathlib import Path

from tqdm.auto import tqdm

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO_ROOT / "notebooks"
TIMINGS_FILE = NOTEBOOKS / "guides" / "timings.json"

__all__ = ["TIMINGS_FILE", "cell_seconds", "measure", "read_timings"]


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def cell_seconds(cell: dict) -> float:
    """Seconds between a code cell's ``iopub.execute_input`` and ``shell.execute_reply`` (the
    timing nbclient records with ``record_timing=True``)."""
    timing = cell.get("metadata", {}).get("execution", {})
    if "iopub.execute_input" not in timing or "shell.execute_reply" not in timing:
        raise ValueError(f"cell {cell.get('id')!r} has no recorded execution timing")
    started = _stamp(timing["iopub.execute_input"])
    return (_stamp(timing["shell.execute_reply"]) - started).total_seconds()


def measure(path: Path, timeout: int = 600) -> float:
    """Run the notebook at ``path`` once and return the sum of its cells' run times (s)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", record_timing=True,
        resources={"metadata": {"path": str(path.parent)}},
    )  # fmt: skip
    client.execute()
    return sum(cell_seconds(c) for c in nb.cells if c.cell_type == "code" and c.source.strip())


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
    results = read_timings() if TIMINGS_FILE.exists() else {"notebooks": {}}
    results["machine"] = {
        "cpu_cores": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "measured": time.strftime("%Y-%m-%d"),
    }
    loads = results.setdefault("load_average_1min", {})
    for path in tqdm(paths, desc="notebooks", unit="nb", disable=False):
        load_before = os.getloadavg()[0]
        seconds = measure(path)
        results["notebooks"][path.stem] = round(seconds, 1)
        loads[path.stem] = round((load_before + os.getloadavg()[0]) / 2, 1)
        tqdm.write(f"{path.name}: {seconds:.1f} s (load average {loads[path.stem]})")
        TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS_FILE.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
