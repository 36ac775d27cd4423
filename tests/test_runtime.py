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
    monkeypatch.setattr(runtime, "triton_version", lambda: None)  # not installed
    find_spec = runtime.importlib.util.find_spec
    monkeypatch.setattr(
        runtime.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "triton" else find_spec(name, *a),
    )
    assert not runtime.kernels_available()
    assert "Linux" in runtime.describe_kernel_mode()
    assert runtime.unavailable_brief() == "Triton is not installed; it has wheels for Linux only"
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


def test_a_triton_older_than_the_kernels_need_is_named_with_its_upgrade(monkeypatch):
    """Triton 3.3 has no ``triton.knobs``: ``course_lib`` still imports, the kernel path is
    unavailable and every message names the version found, the one needed and the upgrade."""
    monkeypatch.setattr(runtime, "triton_version", lambda: "3.3.1")
    assert runtime._choose_mode() == "unavailable"
    monkeypatch.setattr(runtime, "KERNEL_MODE", "unavailable")
    assert "Triton 3.3.1 is installed" in runtime.describe_kernel_mode()
    assert "3.4 or newer" in runtime.describe_kernel_mode()
    assert runtime.unavailable_brief() == "Triton 3.3.1 is older than the 3.4 the kernels need"
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(runtime.KernelsUnavailableError, match=r"this is Triton 3\.3\.1") as err:
        flash_attention(q, q, q)
    assert "triton>=3.4" in str(err.value) and "backend='reference'" in str(err.value)


@pytest.mark.parametrize(
    ("version", "old"), [("3.4.0", False), ("3.3.1", True), ("3.10.0", False),
                         ("3.4.0+git4b3c2a1", False), ("2.3.1", True), ("4.0", False)],
)  # fmt: skip
def test_triton_versions_are_compared_as_numbers(monkeypatch, version, old):
    monkeypatch.setattr(runtime, "triton_version", lambda: version)
    assert (runtime.triton_older_than(runtime.TRITON_MINIMUM) is not None) == old


def test_the_static_report_refuses_a_triton_older_than_its_compiler_interface(monkeypatch, capsys):
    from course_lib import gpu_report

    monkeypatch.setattr(runtime, "triton_version", lambda: "3.5.1")
    assert gpu_report.main(["--quick", "--no-figure", "--out", "unused"]) == 2
    assert "needs Triton 3.6 or newer; this is Triton 3.5.1" in capsys.readouterr().err


def test_the_16_bit_dtype_of_a_gpu_is_bf16_from_compute_capability_8(monkeypatch):
    """A T4 (sm_75) has no bf16 tensor cores and the kernels refuse bf16 there: the notebooks'
    timings, the benchmark and the comparison's step timing run float16 on it."""
    from course_lib.teaching import kernel_swap

    if not torch.cuda.is_available():
        assert not runtime.gpu_has_bf16()
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            runtime.gpu_half_dtype()
        with pytest.raises(RuntimeError, match="Timings need a GPU"):
            kernel_swap.timing_dtype()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, dtype in (((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                              ((9, 0), torch.bfloat16), ((12, 0), torch.bfloat16)):  # fmt: skip
        monkeypatch.setattr(
            torch.cuda, "get_device_capability", lambda device=None, c=capability: c
        )
        assert runtime.gpu_half_dtype() == dtype and runtime.gpu_has_bf16() == (
            dtype != torch.float16
        )
        # the test run skips the kernels' bf16 cases exactly where the compiled kernels refuse them
        monkeypatch.setattr(runtime, "KERNEL_MODE", "compiled")
        assert runtime.kernels_refuse_bf16() == (dtype == torch.float16)
        monkeypatch.setattr(runtime, "KERNEL_MODE", "interpreter")
        assert not runtime.kernels_refuse_bf16()


@pytest.mark.skipif(not runtime.kernels_available(), reason="reads the kernels' own limit")
def test_the_bf16_limit_is_the_kernels_own():
    from course_lib.kernels.common import BF16_MIN_ARCH

    assert runtime.BF16_MIN_CAPABILITY == divmod(BF16_MIN_ARCH, 10)


def test_an_amd_gpu_leaves_the_kernels_unavailable_and_says_how_to_run_them(monkeypatch):
    """The kernels are written and checked for NVIDIA GPUs only: on a ROCm build with an AMD
    GPU the kernel path says so (and how to use the interpreter) instead of failing to
    compile."""
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert runtime._choose_mode() == "unavailable"
    monkeypatch.setattr(runtime, "KERNEL_MODE", "unavailable")
    assert "AMD GPU (ROCm)" in runtime.describe_kernel_mode()
    assert "AMD" in runtime.unavailable_brief()
    if runtime.triton_version() is not None and not runtime.triton_older_than(
        runtime.TRITON_MINIMUM
    ):
        q = torch.randn(1, 2, 4, 16)
        with pytest.raises(runtime.KernelsUnavailableError, match="TRITON_INTERPRET=1"):
            flash_attention(q, q, q)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # asked for: the interpreter, on the CPU
    if runtime.triton_version() is not None and not runtime.triton_older_than(
        runtime.TRITON_MINIMUM
    ):
        assert runtime._choose_mode() == "interpreter"
