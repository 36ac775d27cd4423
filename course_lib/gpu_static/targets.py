"""The GPUs the report compiles for, their limits, and an occupancy estimate.

Per-SM figures of an H100 SXM (sm_90) and an A100 (sm_80): 65536 32-bit registers, at most 64
resident warps and 32 CTAs, shared memory per SM (228 / 164 KiB, of which 1 KiB is reserved per
CTA) and the most one CTA may opt in to (227 / 163 KiB; a launch asking for more fails with
``OutOfResources``). Registers are allocated per warp in units of 256.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GPU", "TARGETS", "occupancy"]


@dataclass(frozen=True)
class GPU:
    arch: int
    name: str
    sms: int
    smem_per_block: int
    smem_per_sm: int
    regs_per_sm: int = 65536
    max_warps: int = 64
    max_ctas: int = 32
    smem_reserved_per_cta: int = 1024
    reg_unit: int = 256


TARGETS: dict[int, GPU] = {
    90: GPU(90, "H100 SXM", 132, smem_per_block=227 * 1024, smem_per_sm=228 * 1024),
    80: GPU(80, "A100", 108, smem_per_block=163 * 1024, smem_per_sm=164 * 1024),
}


def occupancy(gpu: GPU, regs: int, smem: int, warps: int) -> dict:
    """CTAs per SM = min over registers, shared memory, warps and the CTA limit.

    Returns ``ctas``, ``warps_per_sm``, ``occupancy`` (resident warps / 64), ``limiter`` and
    ``smem_ok`` (the CTA's shared memory fits in one block).
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
