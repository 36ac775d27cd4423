"""Measure what each notebook costs to run top to bottom on this machine's CPU.

    python -m course_lib.classroom.timings [notebooks/NN_name.ipynb ...] [--fresh]

Each notebook runs in a fresh ``python3`` kernel, as the test run does (worked solutions,
figures to a temporary folder, nothing written back), one code cell after the other. Two numbers
per notebook:

* ``cpu_s``: the CPU time of the kernel process (and the processes it waited for), read from
  ``/proc``. Other work on a shared machine hardly changes it, and on an idle machine a Run All
  takes about this long or less (PyTorch uses several cores in places). The course map shows it.
* ``wall_s``: the sum of the cells' wall-clock times, which a busy machine inflates.

Each notebook keeps its lowest CPU time over the runs (``--fresh`` forgets earlier ones), with the
wall time and the load average of that run. The results go to ``notebooks/guides/timings.json``,
which the course map reads. Linux only (``/proc``).
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


def _cpu_seconds(pid: int) -> float:
    """User and system time of process ``pid`` and of the children it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def measure(path: Path, timeout: float = 600.0) -> dict:
    """Run the notebook at ``path`` once in a fresh kernel: ``{"cpu_s", "wall_s"}`` of its code
    cells (``jupyter_client`` directly: nbclient can wait out its timeout after a widget cell)."""
    import nbformat
    from jupyter_client.manager import start_new_kernel

    nb = nbformat.read(path, as_version=4)
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(path.parent))
    try:
        pid = manager.provisioner.pid
        cpu_before, wall = _cpu_seconds(pid), 0.0
        for cell in nb.cells:
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            started = time.perf_counter()
            reply = client.execute_interactive(
                cell.source, store_history=False, timeout=timeout, output_hook=lambda msg: None
            )
            wall += time.perf_counter() - started
            if reply["content"]["status"] != "ok":
                content = reply["content"]
                raise RuntimeError(
                    f"{path.name} cell {cell.get('id')!r} failed: "
                    f"{content.get('ename')}: {content.get('evalue')}"
                )
        return {"cpu_s": _cpu_seconds(pid) - cpu_before, "wall_s": wall}
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def read_timings() -> dict:
    """The committed measurements: ``{"machine": {...}, "notebooks": {stem: {"cpu_s", "wall_s",
    "load_average_1min"}}}``."""
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
    for path in tqdm(paths, desc="notebooks", unit="nb"):
        load_before = os.getloadavg()[0]
        run = measure(path)
        run = {key: round(value, 1) for key, value in run.items()}
        run["load_average_1min"] = round((load_before + os.getloadavg()[0]) / 2, 1)
        tqdm.write(f"{path.name}: {run}")
        kept = results["notebooks"].get(path.stem)
        if kept is None or run["cpu_s"] < kept["cpu_s"]:
            results["notebooks"][path.stem] = run
        TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS_FILE.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
