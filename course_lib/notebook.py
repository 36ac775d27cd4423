"""Small helpers the notebooks share: where figures go, exercise checks, worked solutions.

Environment variables (set by the test run, see conftest.py):

* ``COURSE_OUTPUT_DIR``: where figures and results are written (default: the repository's
  ``figures/``), so running the tests never overwrites committed files.
* ``COURSE_SOLUTIONS=1``: exercise cells use the worked solutions from
  :mod:`course_lib.solutions`, which proves every exercise solvable when the notebooks run as tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "output_dir",
    "save_figure",
    "using_solutions",
    "exercise",
    "report_check",
    "execute_notebooks",
    "display_figure",
]

REPO_ROOT = Path(__file__).resolve().parent.parent


def output_dir() -> Path:
    """The folder figures and results go to (created if needed)."""
    path = Path(os.environ.get("COURSE_OUTPUT_DIR", REPO_ROOT / "figures"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig, name: str) -> Path:
    """Save ``fig`` as ``<output_dir>/<name>`` (PNG, 110 dpi) and return the path."""
    path = output_dir() / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def display_figure(fig) -> None:
    """Show ``fig`` once in the notebook and close it (for ``interact`` callbacks that build a
    figure: ``interact(lambda x: display_figure(draw(x)), x=...)``)."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    display(fig)
    plt.close(fig)


def using_solutions() -> bool:
    return os.environ.get("COURSE_SOLUTIONS", "0") == "1"


def exercise(learner_version: Callable, solution: Callable) -> Callable:
    """The function the check cell should test: yours, or the worked solution under tests.

    With ``COURSE_SOLUTIONS=1`` (set when the notebooks run as tests) the worked solution is
    used and a line says so; otherwise your own version is checked.
    """
    if using_solutions():
        print(f"(using the worked solution {solution.__module__}.{solution.__name__})")
        return solution
    return learner_version


def report_check(name: str, failures: list[str]) -> bool:
    """Print a verdict for an exercise: what is right, or the first things that are wrong."""
    if not failures:
        print(f"✓ {name}: correct")
        return True
    print(f"✗ {name}: not yet. {len(failures)} problem(s):")
    for line in failures[:5]:
        print(f"  - {line}")
    return False


def execute_notebooks(paths: list[str], timeout: int = 300) -> None:
    """Run notebooks top to bottom and save them with their outputs (what gets committed).

    Exercise cells use the worked solutions and figures go to the repository's ``figures/``.
    Needs jupyter (``nbconvert``), which requirements.txt installs.
    """
    import nbformat
    from nbconvert.preprocessors import ExecutePreprocessor

    os.environ["COURSE_SOLUTIONS"] = "1"
    os.environ.pop("COURSE_OUTPUT_DIR", None)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        runner = ExecutePreprocessor(timeout=timeout, kernel_name="python3")
        runner.preprocess(nb, {"metadata": {"path": str(Path(path).parent)}})
        nbformat.write(nb, path)
        print(f"executed {path}")


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 2:
        sys.exit("usage: python -m course_lib.notebook NOTEBOOK.ipynb [...]")
    execute_notebooks(sys.argv[1:])
