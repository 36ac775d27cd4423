"""Where kernels run is decided once; without Triton the kernel path says so, never substitutes."""

import subprocess
import sys

import pytest
import torch

import course_lib.runtime as runtime
from course_lib.flash_ops import flash_attention
from course_lib.stick_ops import stick_breaking_attention


def test_mode_is_decided_and_described():
    assert runtime.KERNEL_MODE in ("compiled", "interpreter", "unavailable")
    expected = "cuda" if runtime.KERNEL_MODE == "compiled" else "cpu"
    assert runtime.kernel_device().type == expected
    assert isinstance(runtime.describe_kernel_mode(), str)


def test_without_triton_the_kernel_wrappers_raise_a_clear_error(monkeypatch):
    monkeypatch.setattr(runtime, "KERNEL_MODE", "unavailable")
    assert not runtime.kernels_available()
    assert "Linux" in runtime.describe_kernel_mode()
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(runtime.KernelsUnavailableError, match="backend='reference'"):
        flash_attention(q, q, q)
    with pytest.raises(runtime.KernelsUnavailableError, match="Linux"):
        stick_breaking_attention(q, q, q)


def test_kernel_limits_are_readable_without_triton():
    """Where Triton cannot be installed, ``course_lib`` imports (every encoding registered, no
    hook built) and ``course_lib.kernels.limits`` says what the kernels would accept."""
    code = (
        "import sys; sys.modules['triton'] = None  # as if Triton were not installed\n"
        "import course_lib.kernels.limits as limits, course_lib\n"
        "from course_lib.encodings import REGISTRY\n"
        "assert course_lib.KERNEL_MODE == 'unavailable', course_lib.KERNEL_MODE\n"
        "assert 'alibi' in REGISTRY and not REGISTRY['alibi'].kernel_hooks\n"
        "print(limits.KERNEL_HEAD_DIMS, limits.PAIR_LAYOUTS)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "(16, 32, 64, 128)" in done.stdout


@pytest.mark.skipif(runtime.KERNEL_MODE != "interpreter", reason="checks the CPU interpreter path")
def test_kernel_tensors_must_be_on_the_kernel_device():
    q = torch.randn(1, 2, 4, 16, device="meta")
    with pytest.raises(ValueError, match="must be on 'cpu'"):
        runtime.check_kernel_tensors(q)
