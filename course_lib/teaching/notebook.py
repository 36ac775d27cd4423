"""Small helpers the notebooks share: where figures go, exercise checks, widget figures.

Environment variables:

* ``COURSE_OUTPUT_DIR``: the folder figures and results are written to. The notebook runner
  (:mod:`course_lib.teaching.execute`) points it at the repository's ``figures/``, the test run
  (``conftest.py``) at a temporary folder. When it is not set, as when a learner runs a notebook
  in JupyterLab, figures go to a folder outside the checkout (:func:`learner_output_dir`), so
  running a notebook with unsolved exercises never overwrites the committed figures.
* ``COURSE_SOLUTIONS=1``: exercise cells use the worked solutions from
  :mod:`course_lib.teaching.solutions`, which proves every exercise solvable when the notebooks
  run as tests.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "output_dir",
    "learner_output_dir",
    "save_figure",
    "display_figure",
    "using_solutions",
    "exercise",
    "report_check",
    "at_least",
    "at_most",
]

REPO_ROOT = Path(__file__).resolve().parents[2]


def learner_output_dir() -> Path:
    """Where figures go when ``COURSE_OUTPUT_DIR`` is not set: a folder in the system's
    temporary directory, outside the checkout."""
    return Path(tempfile.gettempdir()) / "positional-encodings-course" / "figures"


def output_dir() -> Path:
    """The folder figures and results go to (created if needed): ``COURSE_OUTPUT_DIR`` when it is
    set, :func:`learner_output_dir` otherwise."""
    configured = os.environ.get("COURSE_OUTPUT_DIR")
    path = Path(configured) if configured else learner_output_dir()
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


#: How many of an exercise's problems :func:`report_check` prints.
_SHOWN_PROBLEMS = 5


def report_check(name: str, failures: list[str]) -> bool:
    """Print a verdict for an exercise: what is right, or the first things that are wrong
    (at most :data:`_SHOWN_PROBLEMS`, then how many more there are)."""
    if not failures:
        print(f"✓ {name}: correct")
        return True
    print(f"✗ {name}: not yet. {len(failures)} problem(s):")
    for line in failures[:_SHOWN_PROBLEMS]:
        print(f"  - {line}")
    if len(failures) > _SHOWN_PROBLEMS:
        print(f"  ... and {len(failures) - _SHOWN_PROBLEMS} more")
    return False


def _on_grid(value: float, step: float, rounding: str) -> str:
    """The multiple of ``step`` strictly below (``ROUND_FLOOR``) or above (``ROUND_CEILING``)
    ``value``: a value exactly on the grid moves one step out."""
    grid = Decimal(str(step))
    ratio = Decimal(repr(float(value))) / grid
    multiple = ratio.to_integral_value(rounding=rounding)
    if multiple == ratio:
        multiple += -1 if rounding == ROUND_FLOOR else 1
    bound = (multiple * grid).quantize(Decimal(1).scaleb(grid.as_tuple().exponent))
    return str(bound.copy_abs() if bound.is_zero() else bound)


def at_least(value: float, step: float) -> str:
    """A multiple of ``step`` below ``value``, written with ``step``'s decimals.

    A trained number's last digits move with the CPU's rounding (CONTRIBUTING: every printed
    verdict must hold on every CPU); a bound on a grid coarser than that spread does not:
    ``at_least(0.9794, 0.05)`` is ``"0.95"``, as is ``at_least(0.9897, 0.05)``. The bound is
    strictly below: a value exactly on the grid (an accuracy of 1 on one CPU, 0.999 on another)
    would otherwise print a bound of its own.
    """
    return _on_grid(value, step, ROUND_FLOOR)


def at_most(value: float, step: float) -> str:
    """A multiple of ``step`` above ``value``: ``at_most(0.0846, 0.05)`` is ``"0.10"``, and
    ``at_most(0, 0.005)`` is ``"0.005"`` as is ``at_most(0.0003, 0.005)`` (a difference that is 0
    with one CPU's rounding and a hair above it with another's)."""
    return _on_grid(value, step, ROUND_CEILING)
