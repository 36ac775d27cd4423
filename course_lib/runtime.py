"""Where the Triton kernels run: decided once, when `course_lib` is imported.

* ``"compiled"``: a CUDA GPU is present, kernels are compiled for it and take CUDA tensors.
* ``"interpreter"``: no GPU; ``TRITON_INTERPRET=1`` is set *before* any kernel module is imported
  (Triton reads it when a kernel is decorated), and kernels run on CPU tensors in Triton's
  interpreter, slowly but computing exactly what the GPU code computes.
* ``"unavailable"``: Triton is not installed (it ships no wheels for macOS or Windows), it is
  older than the kernels need (:data:`TRITON_MINIMUM`), or the GPU is an AMD one (ROCm), which
  the kernels were never written or checked for. Every reference path still works; the
  Triton backend raises a clear error saying which (:func:`describe_kernel_mode`), instead of
  substituting another algorithm.

Setting ``TRITON_INTERPRET=1`` yourself before importing ``course_lib`` forces the interpreter.

Importing this module also binds ``course_lib.kernels`` to the ``kernels/`` folder of the
checkout ``course_lib`` itself comes from (or to ``course_lib/kernels`` of an installed wheel),
before anything imports a kernel: with ``PYTHONPATH`` pointing at a second checkout, an editable
install of the first would otherwise map ``course_lib.kernels`` to the first checkout's kernels.
If it cannot be bound there it fails loudly (:class:`KernelsLocationError`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

__all__ = [
    "KERNEL_MODE",
    "kernel_mode",
    "kernel_device",
    "describe_kernel_mode",
    "unavailable_brief",
    "kernels_available",
    "kernel_compute_dtype",
    "load_kernel_module",
    "require_kernels",
    "KernelsUnavailableError",
    "KernelsLocationError",
    "kernels_folder",
    "set_triton_library_mode",
    "TRITON_MINIMUM",
    "triton_version",
    "triton_older_than",
    "require_triton",
    "BF16_MIN_CAPABILITY",
    "gpu_has_bf16",
    "gpu_half_dtype",
    "kernels_refuse_bf16",
    "first_derivative_only",
]

#: The first compute capability with bf16 tensor cores (the A100's sm_80). Before it the kernels
#: refuse bf16 (``kernels/common.py``, ``BF16_MIN_ARCH``), and a T4 (sm_75) runs float16.
BF16_MIN_CAPABILITY = (8, 0)

# The oldest Triton the kernels run on. Checked with the kernel tests in the interpreter on
# Triton 3.4.0, 3.6.0 and 3.9.0, and compiled ahead of time with 3.6.0 and 3.9.0; 3.3 has no
# ``triton.knobs`` (kernels/fast_math.py reads it), and 3.0's interpreter refuses a
# ``tl.arange`` of run-time bounds. PyTorch 2.8 is the first to bring Triton 3.4 with it.
TRITON_MINIMUM = (3, 4)


class KernelsUnavailableError(RuntimeError):
    """Raised when the Triton backend is asked for but cannot run on this machine."""


class KernelsLocationError(ImportError):
    """Raised when ``course_lib.kernels`` is not (or cannot be) this checkout's kernels."""


def kernels_folder() -> Path:
    """Where ``course_lib.kernels`` must come from: ``course_lib/kernels`` (an installed wheel)
    or the ``kernels/`` folder beside ``course_lib`` (a checkout, editable or on PYTHONPATH)."""
    package = Path(__file__).resolve().parent
    for folder in (package / "kernels", package.parent / "kernels"):
        if (folder / "__init__.py").is_file() and (folder / "limits.py").is_file():
            return folder
    raise KernelsLocationError(
        f"course_lib.kernels not found: course_lib is imported from {package}, and neither "
        f"{package / 'kernels'} nor {package.parent / 'kernels'} holds the kernels. Use a "
        "complete checkout (or reinstall: pip install -e .)."
    )


def _bind_kernels_package() -> None:
    """Make ``course_lib.kernels`` the module of :func:`kernels_folder` (once, before any kernel
    module is imported); refuse a ``course_lib.kernels`` already imported from elsewhere."""
    folder = kernels_folder()
    loaded = sys.modules.get("course_lib.kernels")
    if loaded is not None:
        where = Path(loaded.__file__).resolve().parent
        if where != folder:
            raise KernelsLocationError(
                f"course_lib.kernels was imported from {where}, but course_lib comes from "
                f"{Path(__file__).resolve().parent}: two checkouts are mixed (PYTHONPATH and an "
                f"editable install?). Import course_lib before anything else of the course."
            )
        return
    spec = importlib.util.spec_from_file_location(
        "course_lib.kernels", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["course_lib.kernels"] = module
    spec.loader.exec_module(module)
    parent = sys.modules.get("course_lib")
    if parent is not None:
        parent.kernels = module


_bind_kernels_package()


def _version_tuple(version: str) -> tuple[int, int]:
    """``"3.6.0"`` -> ``(3, 6)``; ``"3.4.0+git1234"`` -> ``(3, 4)``."""
    parts = version.split(".")
    minor = "".join(ch for ch in (parts[1] if len(parts) > 1 else "") if ch.isdigit())
    return int(parts[0]), int(minor or 0)


def triton_version() -> str | None:
    """The installed Triton's version, read from its package metadata without importing it
    (None where Triton is not installed or its metadata has no version)."""
    from importlib import metadata

    for name in ("triton", "pytorch-triton"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def triton_older_than(minimum: tuple[int, int]) -> str | None:
    """The installed Triton's version where it is older than ``minimum`` (major, minor), else
    None (also where Triton is not installed)."""
    version = triton_version()
    if version is None:
        return None
    try:
        return version if _version_tuple(version) < minimum else None
    except ValueError:  # a version string of another shape: let Triton itself decide
        return None


def _minimum_text(minimum: tuple[int, int]) -> str:
    return f"{minimum[0]}.{minimum[1]}"


def require_triton(minimum: tuple[int, int], needed_by: str, otherwise: str = "") -> None:
    """Raise :class:`KernelsUnavailableError` where the installed Triton is older than
    ``minimum``, naming what needs it (``needed_by``), the version found, the upgrade and
    ``otherwise`` (what works without it)."""
    old = triton_older_than(minimum)
    if old is not None:
        want = _minimum_text(minimum)
        raise KernelsUnavailableError(
            f"{needed_by} needs Triton {want} or newer; this is Triton {old}. Upgrade it: on a "
            f"GPU through PyTorch, whose CUDA builds pin their Triton (pip install -U torch), "
            f"without one pip install -U 'triton>={want}'.{otherwise}"
        )


def _amd_gpu() -> bool:
    """A ROCm build of PyTorch on an AMD GPU (``torch.cuda`` is then the AMD GPU)."""
    return getattr(torch.version, "hip", None) is not None and torch.cuda.is_available()


_AMD_GPU = (
    "This is an AMD GPU (ROCm): the course's Triton kernels are written and checked for NVIDIA "
    "GPUs only (their fast logarithm is NVIDIA's libdevice, their tiles are chosen for NVIDIA's "
    "shared memory), so they do not run here; every from-scratch PyTorch cell runs on the GPU. "
    "Setting TRITON_INTERPRET=1 before importing course_lib runs the kernels in Triton's CPU "
    "interpreter instead, on CPU tensors."
)


def _choose_mode() -> str:
    if importlib.util.find_spec("triton") is None or triton_older_than(TRITON_MINIMUM):
        return "unavailable"
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "interpreter"
    if torch.cuda.is_available():
        return "unavailable" if _amd_gpu() else "compiled"
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton.language" in sys.modules:  # imported before course_lib: its library is compiled
        set_triton_library_mode(interpret=True)
    return "interpreter"


def set_triton_library_mode(*, interpret: bool) -> None:
    """Decorate Triton's own ``@triton.jit`` library (``tl.zeros``, ``tl.cdiv``, the combine
    functions of ``tl.sum`` and ``tl.max``, ...) again, in place, for the interpreter or for the
    compiler.

    Triton decorates it when ``triton.language`` is first imported, in the mode
    ``TRITON_INTERPRET`` says then, and an interpreted kernel cannot call a compiled library
    function (nor a compiled one an interpreted function). ``course_lib`` calls this for the
    interpreter when Triton was imported before it; ``python -m course_lib.gpu_report``'s
    workers call it for the compiler (they compile kernels ahead of time and run none).
    """
    import triton
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    wrong = JITFunction if interpret else InterpretedFunction
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        owners = [m for name, m in list(sys.modules.items()) if name.startswith("triton.language")]
        owners.append(sys.modules["triton.language"].core.tensor)
        for owner in owners:
            for name, value in list(vars(owner).items()):
                if isinstance(value, wrong):
                    setattr(owner, name, triton.jit(value.fn))
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


KERNEL_MODE: str = _choose_mode()


def kernel_mode() -> str:
    """``"compiled"``, ``"interpreter"`` or ``"unavailable"`` (fixed at import)."""
    return KERNEL_MODE


def kernels_available() -> bool:
    return KERNEL_MODE != "unavailable"


def kernel_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels run an input of ``dtype`` in: itself, except bf16 in Triton's CPU
    interpreter, whose ``tl.dot`` on bf16 tiles returns garbage (numpy has no bf16; a 16x16
    product was off by about 1e10): there the wrappers run the float32 kernels and round the
    result to bf16. On a GPU bf16 runs the bf16 kernels."""
    if KERNEL_MODE == "interpreter" and dtype == torch.bfloat16:
        return torch.float32
    return dtype


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
            "(the same kernel code, far slower; bf16 inputs are computed in float32; timings "
            "need a GPU)."
        )
    return _unavailable_reasons()[1]


def unavailable_brief() -> str:
    """Why the kernels cannot run here, in a few words (``KERNEL_MODE == "unavailable"``; the
    whole sentence is :func:`describe_kernel_mode`'s)."""
    return _unavailable_reasons()[0]


def _unavailable_reasons() -> tuple[str, str]:
    """Why the kernels cannot run here (``KERNEL_MODE == "unavailable"``), in the order
    :func:`_choose_mode` decides it: ``(in a few words, the sentence a learner reads)``."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed; it has wheels for Linux only", (
            "Triton is not installed (it has wheels for Linux only): the kernel cells are "
            "skipped; every from-scratch PyTorch cell still runs."
        )
    old = triton_older_than(TRITON_MINIMUM)
    if old is not None:
        want = _minimum_text(TRITON_MINIMUM)
        return f"Triton {old} is older than the {want} the kernels need", (
            f"Triton {old} is installed, but the kernels need Triton {want} or newer: the "
            "kernel cells are skipped; every from-scratch PyTorch cell still runs."
        )
    return "the kernels are written for NVIDIA GPUs, and this is an AMD one", _AMD_GPU


def require_kernels() -> None:
    """Raise a clear error where Triton cannot run (before any hook or table is built)."""
    if KERNEL_MODE == "unavailable":
        reference = (
            " Or use backend='reference' (the from-scratch PyTorch version computes the same "
            "function)."
        )
        require_triton(TRITON_MINIMUM, "backend='triton'", reference)
        if importlib.util.find_spec("triton") is None:
            raise KernelsUnavailableError(
                "backend='triton' needs the triton package, which ships wheels for Linux only."
                + reference
            )
        raise KernelsUnavailableError(f"backend='triton': {_AMD_GPU}{reference}")
    if KERNEL_MODE == "interpreter":
        _check_interpreter_versions()


def load_kernel_module(name: str) -> ModuleType:
    """Import ``course_lib.kernels.<name>``; raise a clear error where Triton cannot run."""
    require_kernels()
    return importlib.import_module(f"course_lib.kernels.{name}")


def _check_interpreter_versions() -> None:
    """Triton's interpreter before 3.9 breaks with numpy >= 2.4 (loop bounds read from integer
    arguments fail inside the interpreter); say so instead of failing deep inside a kernel."""
    import numpy
    import triton

    if _version_tuple(triton.__version__) < (3, 9) and _version_tuple(numpy.__version__) >= (2, 4):
        raise KernelsUnavailableError(
            f"Triton {triton.__version__}'s CPU interpreter does not work with numpy "
            f"{numpy.__version__}; install triton>=3.9 or numpy<2.4 "
            "(on a GPU, where kernels are compiled, either works)."
        )


def gpu_has_bf16(device: torch.device | int | None = None) -> bool:
    """Whether this CUDA GPU has bf16 tensor cores (compute capability 8.0 or newer); False
    without a GPU."""
    if not torch.cuda.is_available():
        return False
    return tuple(torch.cuda.get_device_capability(device)) >= BF16_MIN_CAPABILITY


def gpu_half_dtype(device: torch.device | int | None = None) -> torch.dtype:
    """The 16-bit dtype to run (and time) on this CUDA GPU: ``torch.bfloat16`` where it has bf16
    tensor cores, ``torch.float16`` before (a T4, whose kernels refuse bf16). Raises without a
    GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError("gpu_half_dtype() needs a CUDA GPU; none is available here")
    return torch.bfloat16 if gpu_has_bf16(device) else torch.float16


def kernels_refuse_bf16() -> bool:
    """Whether the kernels run compiled on a GPU without bf16 tensor cores (a T4), where they
    refuse bf16 inputs (``kernels/common.py``, ``check_dtype_on_gpu``)."""
    return KERNEL_MODE == "compiled" and not gpu_has_bf16()


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


def first_derivative_only(backward: Callable) -> Callable:
    """An autograd ``backward`` of fused kernels, which give first derivatives only: run without
    building a graph, and refused with a clear error when asked for one (``create_graph=True``:
    a gradient of a gradient, such as a gradient penalty or a Hessian-vector product), where
    ``torch.autograd.function.once_differentiable`` hands back gradients with no graph when the
    incoming gradient has none, and the second-order term goes missing without a word."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "backend='triton' computes first derivatives only: this backward was asked "
                "for a graph of its own (create_graph=True, a gradient of a gradient). Use "
                "backend='reference' for higher derivatives"
            )
        return backward(ctx, *grads)

    return wrapper
