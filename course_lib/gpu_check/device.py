"""The GPU the check runs on, behind a small interface: a name, a compute capability, and a
way to time a step and read its peak memory (the tests pass a fake one)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median
from time import perf_counter

import torch

from course_lib.host_reads import HostReads
from course_lib.runtime import BF16_MIN_CAPABILITY

__all__ = ["HOST_REPEATS", "CudaDevice", "Device", "NoGpuError", "detect"]


class NoGpuError(RuntimeError):
    """The check cannot run here; the message says why and what to do."""


@dataclass
class Device:
    """``name`` as the driver reports it, ``capability`` ``(major, minor)``, ``memory_bytes``,
    and the torch device tensors go to."""

    name: str
    capability: tuple[int, int]
    memory_bytes: int
    torch_device: torch.device

    @property
    def bf16(self) -> bool:
        """bf16 products on the tensor cores (compute capability 8.0 and later)."""
        return tuple(self.capability) >= BF16_MIN_CAPABILITY

    @property
    def timing_dtype(self) -> str:
        """The 16-bit dtype the speed phase uses: bf16, or fp16 where bf16 is missing."""
        return "bf16" if self.bf16 else "fp16"

    @property
    def slug(self) -> str:
        """The device name as a file name: ``nvidia_h100_80gb_hbm3`` for an H100."""
        return re.sub(r"[^a-z0-9]+", "_", self.name.lower()).strip("_") or "gpu"

    def describe(self) -> dict:
        return dict(
            name=self.name,
            capability=f"{self.capability[0]}.{self.capability[1]}",
            memory_gib=round(self.memory_bytes / 2**30, 1),
            bf16=self.bf16,
        )

    def measure(self, step: Callable[[], None], leaves: list[torch.Tensor]) -> tuple[float, int]:
        """``(median milliseconds, peak bytes allocated on top of what existed before)`` of
        ``step``; ``leaves`` have their gradients cleared between repetitions."""
        raise NotImplementedError(
            "Device only describes a GPU; CudaDevice (or a test's fake device) times steps"
        )

    def free(self) -> None:
        """Give cached memory back between sizes."""

    def synchronize(self) -> None:
        """Wait for the work queued on the device (nothing to wait for on the host)."""

    def host(
        self, step: Callable[[], None], leaves: list[torch.Tensor], repeats: int = 0
    ) -> tuple[float, int]:
        """``(median milliseconds the host spends inside one step, reads of tensor values
        back to the host in one step)``: the step starts on an idle device each time, and its
        kernels are not waited for (except by its own reads, :mod:`course_lib.host_reads`).
        Where this is close to :meth:`measure`'s time, the step is bound by the host.
        ``repeats``: steps timed (0: :data:`HOST_REPEATS`)."""
        for leaf in leaves:
            leaf.grad = None
        with HostReads() as reads:
            step()
        times = []
        for _ in range(repeats or HOST_REPEATS):
            for leaf in leaves:
                leaf.grad = None
            self.synchronize()
            start = perf_counter()
            step()
            times.append(perf_counter() - start)
        self.synchronize()
        return median(times) * 1e3, reads.count


HOST_REPEATS = 21  # steps timed on the host per record at most (the median is kept)


class CudaDevice(Device):
    """The current CUDA device; times with ``triton.testing.do_bench`` (median)."""

    def measure(self, step, leaves):
        import triton.testing

        step()  # warm-up: compiles, autotunes, allocates
        for leaf in leaves:
            leaf.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        ms = triton.testing.do_bench(
            step, warmup=25, rep=100, grad_to_none=leaves or None, return_mode="median"
        )
        return float(ms), int(peak)

    def free(self) -> None:
        torch.cuda.empty_cache()

    def synchronize(self) -> None:
        torch.cuda.synchronize()


def detect() -> CudaDevice:
    """The GPU to check, or a :class:`NoGpuError` saying why there is none."""
    from course_lib.runtime import describe_kernel_mode, kernel_mode

    if not torch.cuda.is_available():
        raise NoGpuError(
            "python -m course_lib.gpu_check needs a CUDA GPU, and PyTorch sees none "
            f"(torch {torch.__version__}: torch.cuda.is_available() is False). On a machine with "
            "an NVIDIA GPU, install a CUDA build of PyTorch (https://pytorch.org) and run it "
            "again; on this machine `python -m course_lib.gpu_report` says what is known "
            "without a GPU."
        )
    if kernel_mode() != "compiled":
        hint = " (TRITON_INTERPRET=1 is set: unset it)" if kernel_mode() == "interpreter" else ""
        raise NoGpuError(
            "a GPU is present but the kernels are not compiled for it in this process: "
            f"{describe_kernel_mode()}{hint}"
        )
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return CudaDevice(
        name=props.name,
        capability=(props.major, props.minor),
        memory_bytes=int(props.total_memory),
        torch_device=torch.device("cuda", index),
    )
