"""Fast elementary functions for the kernels' inner loops.

``tl.exp2`` (and ``tl.exp``) compile to the GPU's approximate ``ex2`` instruction, but
``tl.log2`` and ``tl.log`` compile to a precise software logarithm of about twenty instructions
(triton 3.9). :func:`fast_log2` is the ``lg2.approx`` instruction (one special-function op,
maximum relative error about 2^-22), enough for the logs of the inner loops, whose arguments lie
in ``[0.7, 2]``. Triton's CPU interpreter has no approximate logarithm: there it is numpy's
``log2`` (the same function, correctly rounded).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

__all__ = ["LN2", "LOG2E", "fast_log2"]

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)

if knobs.runtime.interpret:

    @triton.jit
    def fast_log2(x):
        """``log2(x)`` of a float32 tile (interpreter: numpy's ``log2``)."""
        return tl.log2(x)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def fast_log2(x):
        """``log2(x)`` of a float32 tile with the approximate ``lg2`` instruction."""
        return libdevice.fast_log2f(x)
