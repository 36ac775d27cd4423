"""Test-run settings shared by the unit tests and the notebooks run under nbval.

Notebook kernels inherit this process's environment: figures go to a temporary folder (the
committed ones in figures/ stay untouched) and exercise cells use the worked solutions.

The run uses every core, up to 4 (``-n auto --maxprocesses 4 --dist loadfile`` in
pyproject.toml: each test file and each notebook stays on one worker, in order, which nbval
needs). Files are handed out in collection order, so the slowest go first
(:data:`SLOWEST_FIRST`): a long file started last would keep one worker busy after the others
have finished. ``-n 0`` runs in one process (for ``--pdb``).
"""

import os
import tempfile

# The workers, their notebook kernels and JupyterLab's run side by side, each with PyTorch's
# OpenMP threads (one per core). By default an idle OpenMP thread spins for a while before it
# sleeps, taking a core another process needs: with two workers on 2 cores, notebook 08's CoPE
# training took 167 s instead of 8, and notebooks 05, 08 and 10 under nbval 190 s instead of
# 95. A sleeping idle thread changes no result (the threads and their shares of the work stay
# the same). Set before anything imports torch; the kernels and JupyterLab inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("COURSE_OUTPUT_DIR", tempfile.mkdtemp(prefix="course-test-output-"))
os.environ["COURSE_SOLUTIONS"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")

# The files that take longest on a 2-core CPU (the CI compile of three GPU targets; JupyterLab
# in a browser), started first.
SLOWEST_FIRST = ("tests/test_gpu_report.py", "tests/test_browser.py")


def pytest_collection_modifyitems(config, items):
    """Move the tests of :data:`SLOWEST_FIRST` to the front, keeping every file's own order;
    skip the bf16 cases of kernel tests (a ``dtype`` parameter of ``torch.bfloat16``) on a GPU
    without bf16 tensor cores, where the kernels refuse bf16 (``tests/test_bad_input.py``
    checks that refusal)."""

    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return SLOWEST_FIRST.index(path) if path in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)
    bf16 = [item for item in items if _dtype_param(item) == "torch.bfloat16"]
    if not bf16:
        return
    from course_lib.runtime import kernels_refuse_bf16

    if kernels_refuse_bf16():
        import pytest

        skip = pytest.mark.skip(reason="this GPU has no bf16 tensor cores: the kernels refuse bf16")
        for item in bf16:
            item.add_marker(skip)


def _dtype_param(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else str(callspec.params.get("dtype"))
