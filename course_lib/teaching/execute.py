"""Re-execute notebooks top to bottom and store their outputs (what gets committed).

    python -m course_lib.teaching.execute notebooks/03_rope.ipynb [...]

Exercise cells use the worked solutions (``COURSE_SOLUTIONS=1``) and figures are written to the
repository's ``figures/`` (``COURSE_OUTPUT_DIR``): this is the one command that updates committed
figures. Needs jupyter's ``nbconvert``, which requirements.txt installs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from course_lib.classroom.notebook_format import write_notebook
from course_lib.teaching.notebook import REPO_ROOT

__all__ = ["KERNELSPEC", "execute_notebooks"]

# What JupyterLab writes for its default kernel: a notebook stored with anything else is marked
# modified as soon as it is opened.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def execute_notebooks(paths: list[str], timeout: int = 300) -> None:
    """Run each notebook in a fresh ``python3`` kernel and write it back with its outputs, in
    the form JupyterLab saves (``course_lib.classroom.notebook_format``)."""
    import nbformat
    from nbconvert.preprocessors import ExecutePreprocessor

    settings = {"COURSE_SOLUTIONS": "1", "COURSE_OUTPUT_DIR": str(REPO_ROOT / "figures")}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)  # the notebook kernels inherit these
    try:
        for path in paths:
            nb = nbformat.read(path, as_version=4)
            runner = ExecutePreprocessor(timeout=timeout, kernel_name="python3")
            runner.preprocess(nb, {"metadata": {"path": str(Path(path).parent)}})
            nb.metadata["kernelspec"] = dict(KERNELSPEC)
            write_notebook(nb, path)  # as JupyterLab saves it: opening a deck changes nothing
            print(f"executed {path}")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m course_lib.teaching.execute NOTEBOOK.ipynb [...]")
    execute_notebooks(sys.argv[1:])
