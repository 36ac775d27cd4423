"""Where kernels run is decided once; without Triton the kernel path says so, never substitutes."""

import pytest
import torch

import course_lib.runtime as runtime
from course_lib.attention import attention


def test_mode_is_decided_and_described():
    assert runtime.KERNEL_MODE in ("compiled", "interpreter", "unavailable")
    expected = "cuda" if runtime.KERNEL_MODE == "compiled" else "cpu"
    assert runtime.kernel_device().type == expected
    assert isinstance(runtime.describe_kernel_mode(), str)


def test_without_triton_the_triton_backend_raises_a_clear_error(monkeypatch):
    monkeypatch.setattr(runtime, "KERNEL_MODE", "unavailable")
    assert not runtime.kernels_available()
    assert "Linux" in runtime.describe_kernel_mode()
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(runtime.KernelsUnavailableError, match="backend='reference'"):
        attention(q, q, q, backend="triton")
    with pytest.raises(runtime.KernelsUnavailableError, match="Linux"):
        attention(q, q, q, method="stick_breaking", backend="triton")
    # the reference path is untouched
    assert attention(q, q, q).shape == q.shape


@pytest.mark.skipif(runtime.KERNEL_MODE != "interpreter", reason="checks the CPU interpreter path")
def test_kernel_tensors_must_be_on_the_kernel_device():
    q = torch.randn(1, 2, 4, 16, device="meta")
    with pytest.raises(ValueError, match="must be on 'cpu'"):
        runtime.check_kernel_tensors(q)
