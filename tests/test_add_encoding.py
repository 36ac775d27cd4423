"""Adding an encoding keeps the suite green, without re-running the comparison.

A copy of the checkout (``course_lib``, ``kernels``, ``tests``, ``figures``, ``notebooks`` and
the root files the tests read) in a temporary folder gains one file,
``course_lib/encodings/alibi_again.py``: ALiBi's file with its names changed (the registered
name, the module class, the public functions), and nothing else is edited, as CONTRIBUTING's
"Add an encoding" asks of a learner. With ``PYTHONPATH`` on the copy, a fresh process then finds
the new encoding in the registry, sees it as not run yet in the committed comparison (with the
command that runs it), and passes, on the copy: the conformance tests of the new encoding
(reference and Triton, padding, decoding, shift claim, gradcheck, errors), the comparison's
tests of its committed results (README's headline, ``summary.md``, the declared questions,
every arm that was run) and notebooks 10 and 11 under nbval. The committed results are not
touched.

Run time, measured on a 2-core CPU shared with other work: about 3 CPU-minutes in all (notebook
11 adds about 40 CPU-seconds), most of it notebook 10 under nbval (about 2 of them; 2.5 minutes by the wall clock at a load of 4); by
the wall clock 7 to 8.5 minutes at a load of 4 to 8 (notebook 10 5 to 5.5 minutes, the
comparison's tests 1 to 2, the conformance tests under a minute, the copy a second).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.runtime import kernels_available

REPO = Path(__file__).resolve().parents[1]
NAME = "alibi_again"
COPIED = ("course_lib", "kernels", "tests", "figures", "notebooks")
ROOT_FILES = ("conftest.py", "pyproject.toml", "README.md", "CONTRIBUTING.md")
#: What a clone would not have (build outputs, caches, local runs and checkpoints).
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "runs", "build", "__pycache__", ".ipynb_checkpoints", ".pytest_cache",
    ".ruff_cache", "*.egg-info", "checkpoints",
)  # fmt: skip


def renamed_alibi() -> str:
    """ALiBi's file under a new name: the registered name and every name it defines."""
    text = (REPO / "course_lib" / "encodings" / "alibi.py").read_text(encoding="utf-8")
    text = re.sub(r"\balibi_", f"{NAME}_", text)
    text = text.replace('"alibi"', f'"{NAME}"')
    text = re.sub(r"\bAlibiAttention\b", "AlibiAgainAttention", text)
    text = text.replace("def check_alibi_params", f"def check_{NAME}_params")
    text = text.replace("check_params=check_alibi_params", f"check_params=check_{NAME}_params")
    return text.replace('color="#bcbd22"', 'color="#8c564b"')


@pytest.fixture(scope="module")
def copy_with_new_encoding(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkout")
    for name in COPIED:
        shutil.copytree(REPO / name, root / name, ignore=IGNORED)
    for name in ROOT_FILES:
        shutil.copy2(REPO / name, root / name)
    source = renamed_alibi()
    assert f'name="{NAME}"' in source and "AlibiAttention" not in source
    (root / "course_lib" / "encodings" / f"{NAME}.py").write_text(source, encoding="utf-8")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},  # not a worker
        "PYTHONPATH": str(root),
        "COURSE_OUTPUT_DIR": str(tmp_path_factory.mktemp("output")),
        "TQDM_DISABLE": "1",
    }
    return root, env


def run(root: Path, env: dict, *args: str, timeout: int = 600) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


def pytest_on_copy(root: Path, env: dict, *args: str) -> str:
    return run(root, env, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", *args)


def test_the_copy_registers_it_and_lists_it_as_not_run_yet(copy_with_new_encoding):
    root, env = copy_with_new_encoding
    check = (
        "import course_lib\n"
        "from course_lib.compare import PRESETS, default_out_dir, preset_results\n"
        "from course_lib.registry import REGISTRY, sequence_encodings\n"
        f"assert course_lib.__file__.startswith({str(root)!r}), course_lib.__file__\n"
        f"assert {NAME!r} in sequence_encodings() and REGISTRY[{NAME!r}].relative\n"
        "cpu = PRESETS['cpu']\n"
        "for missing in cpu.not_run_yet(preset_results(default_out_dir('cpu'), cpu)):\n"
        "    print(missing.describe())\n"
    )
    output = run(root, env, "-c", check)
    assert output.strip().splitlines() == [
        f"{NAME}: not run yet (run it with `python -m course_lib.compare --preset cpu "
        f"--encodings {NAME} --ablations none`)"
    ]


def test_the_conformance_tests_pass_for_it(copy_with_new_encoding):
    root, env = copy_with_new_encoding
    output = pytest_on_copy(root, env, "tests/test_registry_conformance.py", "-k", NAME)
    passed = int(re.search(r"(\d+) passed", output).group(1))
    assert passed >= (8 if kernels_available() else 6), output[-2000:]


def test_the_committed_comparison_still_passes(copy_with_new_encoding):
    root, env = copy_with_new_encoding
    output = pytest_on_copy(
        root, env, "tests/test_compare.py", "-k", "committed or declared or notebook_reading"
    )
    assert " passed" in output and "failed" not in output
    assert f"{NAME}: not run yet" in output  # the committed results' test lists it


def test_notebooks_10_and_11_still_pass_nbval(copy_with_new_encoding):
    root, env = copy_with_new_encoding
    output = pytest_on_copy(
        root, env, "notebooks/10_bert_comparison.ipynb", "notebooks/11_your_own_encoding.ipynb"
    )
    assert " passed" in output and "failed" not in output
