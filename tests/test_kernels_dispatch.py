"""One dispatch and one kernels folder.

* ``course_lib.kernels`` is the ``kernels/`` folder of the checkout ``course_lib`` comes from,
  also when ``PYTHONPATH`` points at a second checkout while an editable install maps the name
  to the first; without one it fails loudly.
* The benchmark runs every encoding through ``attention(backend="triton")``, the dispatch a
  model uses (so a new encoding, or one with a PyTorch-only bias, needs no edit there).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_lib.runtime import kernels_available

ROOT = Path(__file__).resolve().parents[1]


def _copy_checkout(target: Path, with_kernels: bool = True) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "course_lib", target / "course_lib", ignore=ignore)
    if with_kernels:
        shutil.copytree(ROOT / "kernels", target / "kernels", ignore=ignore)


def _run(code: str, pythonpath: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=pythonpath
    )


def test_kernels_come_from_the_checkout_course_lib_comes_from(tmp_path):
    _copy_checkout(tmp_path)
    done = _run(
        "import course_lib, course_lib.kernels.limits as limits; "
        "print(course_lib.__file__); print(limits.__file__)",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    package, limits = done.stdout.split()
    assert Path(package).resolve().parent == (tmp_path / "course_lib").resolve()
    assert Path(limits).resolve() == (tmp_path / "kernels" / "limits.py").resolve()


def test_a_checkout_without_kernels_fails_loudly(tmp_path):
    _copy_checkout(tmp_path, with_kernels=False)
    done = _run("import course_lib", tmp_path)
    assert done.returncode != 0
    assert "KernelsLocationError" in done.stderr and "course_lib.kernels not found" in done.stderr


@pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")
@pytest.mark.parametrize("causal", [True, False])
def test_benchmark_runs_every_encoding_through_attention(causal, monkeypatch):
    """``course_lib.bench.build_methods``: every sequence encoding that acts in attention has a
    kernel entry that runs ``attention(backend="triton")`` and matches its reference (or says
    why it has none)."""
    import course_lib.attention as attention_module
    from course_lib import bench

    calls = []
    original = attention_module.attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("backend"))
        return original(*args, **kwargs)

    monkeypatch.setattr(attention_module, "attention", spy)
    methods = bench.build_methods(causal, 40, torch.device("cpu"), heads=2, head_dim=16)
    q, k, v = torch.randn(3, 1, 2, 40, 16, generator=torch.Generator().manual_seed(0)).unbind(0)
    errors = bench.agreement(methods, q, k, v)
    kernels = [name for name in methods if name.startswith("kernel ")]
    assert kernels == [f"kernel {name}" for name in bench.kernel_encodings()]
    for name in kernels:
        error = errors[name]
        if isinstance(methods[name], str):  # no kernel: it says why
            assert methods[name].startswith("n/a ("), (name, methods[name])
            continue
        assert isinstance(error, float) and error < 1e-4, (name, error)
    assert calls.count("triton") == sum(not isinstance(methods[n], str) for n in kernels)
