"""Where the Triton kernels run: decided once, when `course_lib` is imported.

* ``"compiled"``: a CUDA GPU is present, kernels are compiled for it and take CUDA tensors.
* ``"interpreter"``: no GPU; ``TRITON_INTERPRET=1`` is set *before* any kernel module is imported
  (Triton reads it when a kernel is decorated), and kernels run on CPU tensors in Triton's
  interpreter, slowly but computing exactly what the GPU code computes.
* ``"unavailable"``: Triton is not installed (it ships no wheels for macOS or Windows). Every
  reference path still works; the Triton backend raises a clear error instead of substituting
  another algorithm.

Setting ``TRITON_INTERPRET=1`` yourself before importing ``course_lib`` forces the interpreter.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import torch

__all__ = [
    "KERNEL_MODE",
    "kernel_mode",
    "kernel_device",
    "describe_kernel_mode",
    "kernels_available",
    "load_kernel_module",
    "KernelsUnavailableError",
]


class KernelsUnavailableError(RuntimeError):
    """Raised when the Triton backend is asked for but cannot run on this machine."""


def _choose_mode() -> str:
    if importlib.util.find_spec("triton") is None:
        return "unavailable"
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "interpreter"
    if torch.cuda.is_available():
        return "compiled"
    os.environ["TRITON_INTERPRET"] = "1"
    return "interpreter"


KERNEL_MODE: str = _choose_mode()


def kernel_mode() -> str:
    """``"compiled"``, ``"interpreter"`` or ``"unavailable"`` (fixed at import)."""
    return KERNEL_MODE


def kernels_available() -> bool:
    return KERNEL_MODE != "unavailable"


def kernel_device() -> torch.device:
    """The device whose tensors the Triton kernels take in this mode."""
    return torch.device("cuda" if KERNEL_MODE == "compiled" else "cpu")


def describe_kernel_mode() -> str:
    """One sentence a learner can read: where the kernels run and what that means."""
    if KERNEL_MODE == "compiled":
        return f"Triton kernels are compiled for the GPU ({torch.cuda.get_device_name()})."
    if KERNEL_MODE == "interpreter":
        return (
            "No GPU found: Triton kernels run in Triton's CPU interpreter "
            "(same code, exact results, far slower; timings need a GPU)."
        )
    return (
        "Triton is not installed (it has wheels for Linux only): the kernel cells are skipped; "
        "every from-scratch PyTorch cell still runs."
    )


def load_kernel_module(name: str) -> ModuleType:
    """Import ``course_lib.kernels.<name>``; raise a clear error where Triton cannot run."""
    if KERNEL_MODE == "unavailable":
        raise KernelsUnavailableError(
            "backend='triton' needs the triton package, which ships wheels for Linux only. "
            "Use backend='reference' (the from-scratch PyTorch version computes the same function)."
        )
    if KERNEL_MODE == "interpreter":
        _check_interpreter_versions()
    return importlib.import_module(f"course_lib.kernels.{name}")


def _check_interpreter_versions() -> None:
    """Triton's interpreter before 3.9 breaks with numpy >= 2.4 (loop bounds read from integer
    arguments fail inside the interpreter); say so instead of failing deep inside a kernel."""
    import numpy
    import triton

    def major_minor(version: str) -> tuple[int, int]:
        parts = version.split(".")
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)

    if major_minor(triton.__version__) < (3, 9) and major_minor(numpy.__version__) >= (2, 4):
        raise KernelsUnavailableError(
            f"Triton {triton.__version__}'s CPU interpreter does not work with numpy "
            f"{numpy.__version__}; install triton>=3.9 or numpy<2.4 "
            "(on a GPU, where kernels are compiled, either works)."
        )


def check_kernel_tensors(*tensors: torch.Tensor) -> None:
    """Kernels take tensors on :func:`kernel_device`; say so plainly otherwise."""
    want = kernel_device().type
    for t in tensors:
        if t is not None and t.device.type != want:
            where = "a CUDA GPU" if want == "cuda" else "the CPU (Triton's interpreter)"
            raise ValueError(
                f"backend='triton' runs on {where} on this machine, so its tensors must be on "
                f"'{want}', got a tensor on '{t.device}'."
            )
