"""The GPUs the report compiles for, their limits, and an occupancy estimate.

Per compute capability (NVIDIA's own table, as encoded in CCCL's
``libcudacxx/include/cuda/__device/arch_traits.h``, which follows the CUDA Programming Guide's
"Technical Specifications per Compute Capability"): shared memory per SM, shared memory one CTA
may opt in to (a launch asking for more fails with ``OutOfResources``), the shared memory the
driver reserves per CTA, resident CTAs and warps per SM. Every one has 65536 32-bit registers
per SM; registers are allocated per warp in units of 256.

How Triton 3.9.0 lowers a 16-bit ``tl.dot`` for each (observed by compiling the course's
kernels ahead of time): ``wgmma`` (Hopper warp-group products), ``tcgen5`` (Blackwell's
tensor-memory products, sm_100), ``mma`` (``mma.sync``: sm_80, sm_86, sm_89, sm_120; on sm_75
for fp16 only). sm_75 (Turing) has no bf16 tensor-core product: a bf16 dot compiles to CUDA-core
FMA there, so ``bf16`` is False and the kernels take fp16 on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GPU", "TARGETS", "occupancy"]

KiB = 1024


@dataclass(frozen=True)
class GPU:
    """One compute capability: ``arch`` (e.g. 86), the GPUs that have it, and its limits."""

    arch: int
    name: str
    smem_per_block: int  # opt-in limit of one CTA, bytes
    smem_per_sm: int
    max_warps: int
    max_ctas: int
    smem_reserved_per_cta: int
    tensor_cores: str  # the lowering of a 16-bit tl.dot: "wgmma", "tcgen5" or "mma"
    bf16: bool  # bf16 products on the tensor cores
    regs_per_sm: int = 65536
    reg_unit: int = 256


TARGETS: dict[int, GPU] = {
    90: GPU(90, "H100 / H200", 227 * KiB, 228 * KiB, 64, 32, KiB, "wgmma", True),
    80: GPU(80, "A100", 163 * KiB, 164 * KiB, 64, 32, KiB, "mma", True),
    75: GPU(75, "T4 / RTX 20xx", 64 * KiB, 64 * KiB, 32, 16, 0, "mma", False),
    86: GPU(86, "A10 / RTX 30xx", 99 * KiB, 100 * KiB, 48, 16, KiB, "mma", True),
    89: GPU(89, "L4 / RTX 40xx", 99 * KiB, 100 * KiB, 48, 24, KiB, "mma", True),
    100: GPU(100, "B200", 227 * KiB, 228 * KiB, 64, 32, KiB, "tcgen5", True),
    120: GPU(120, "RTX 50xx", 99 * KiB, 100 * KiB, 48, 32, KiB, "mma", True),
}


def occupancy(gpu: GPU, regs: int, smem: int, warps: int) -> dict:
    """CTAs per SM = min over registers, shared memory, warps and the CTA limit.

    Returns ``ctas``, ``warps_per_sm``, ``occupancy`` (resident warps / the SM's maximum),
    ``limiter`` and ``smem_ok`` (the CTA's shared memory fits in one block).
    """
    per_warp = math.ceil(max(regs, 1) * 32 / gpu.reg_unit) * gpu.reg_unit
    by = {
        "regs": gpu.regs_per_sm // per_warp // warps,
        "smem": gpu.smem_per_sm // (smem + gpu.smem_reserved_per_cta) if smem else gpu.max_ctas,
        "warps": gpu.max_warps // warps,
        "ctas": gpu.max_ctas,
    }
    limiter = min(by, key=by.get)
    ctas = by[limiter]
    return dict(
        ctas=ctas,
        warps_per_sm=ctas * warps,
        occupancy=ctas * warps / gpu.max_warps,
        limiter=limiter,
        smem_ok=smem <= gpu.smem_per_block,
    )
