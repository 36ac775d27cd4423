"""The notebooks that time the kernels, run under nbval on the GPU.

They are found, not listed: every notebook of the checkout whose code calls
``timings_available(`` (its timing cells run only on a GPU, so a CPU run of nbval never
executed them). Each runs in its own ``pytest`` process (the repository's nbval options from
``pyproject.toml``, its ``conftest.py``: solutions on, figures to a temporary folder), several
at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["checkout_root", "kernel_notebooks", "run_notebooks"]

MARK = "timings_available("


def checkout_root() -> Path | None:
    """The checkout ``course_lib`` runs from (None when it is installed without notebooks)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "notebooks").is_dir() and (root / "pyproject.toml").is_file() else None


def kernel_notebooks(root: Path) -> list[Path]:
    """The notebooks under ``root/notebooks`` whose code cells call ``timings_available(``."""
    found = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        code = ("".join(c.get("source", [])) for c in cells if c.get("cell_type") == "code")
        if any(MARK in text for text in code):
            found.append(path)
    return found


def run_notebooks(
    paths: list[Path], root: Path, workers: int = 4, timeout: float = 600
) -> list[dict]:
    """``pytest <notebook>`` for each, ``workers`` at a time; per notebook: ``status``
    (``"passed"``, ``"failed"`` or ``"timeout"``), ``seconds`` and the end of pytest's output."""
    from tqdm.auto import tqdm

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    pending = list(paths)
    running: dict[Path, tuple[subprocess.Popen, float, object]] = {}
    results: dict[Path, dict] = {}
    bar = tqdm(total=len(paths), desc="notebooks under nbval")
    while pending or running:
        while pending and len(running) < max(1, workers):
            path = pending.pop(0)
            log = tempfile.TemporaryFile("w+", encoding="utf-8")
            # one process per notebook (it runs several notebooks side by side itself)
            cmd = [sys.executable, "-m", "pytest", str(path.relative_to(root)), "-q", "-n", "0"]
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
            running[path] = (proc, time.perf_counter(), log)
        time.sleep(0.5)
        for path, (proc, started, log) in list(running.items()):
            elapsed = time.perf_counter() - started
            if proc.poll() is None and elapsed < timeout:
                continue
            status = "passed" if proc.returncode == 0 else "failed"
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                status = "timeout"
            log.seek(0)
            tail = log.read()[-2000:]
            log.close()
            results[path] = dict(
                notebook=path.name, status=status, seconds=round(elapsed, 1), output_tail=tail
            )
            del running[path]
            bar.update()
    bar.close()
    return [results[p] for p in paths]
