"""Counting the calls that bring a tensor's values back to Python.

``bool(t)``, ``t.item()``, ``float(t)``, ``int(t)`` and ``t.tolist()`` on a GPU tensor wait for
every kernel queued before them: the host stops feeding the GPU, and whatever the host does next
(Python, the next launches) is time the GPU idles. A fused attention call that makes no such
read runs ahead of the GPU; one that makes several pays for them at small sizes, where its
kernels are short. :class:`HostReads` counts them in a block of code, on any device (on the CPU
they cost nothing, but they are the same calls)::

    with HostReads() as reads:
        attention(q, k, v, method="alibi", backend="triton")
    reads.count
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["HOST_READS", "HostReads"]

#: The tensor methods that return a Python value computed from the tensor's data.
HOST_READS = frozenset(
    {
        torch.Tensor.__bool__,
        torch.Tensor.item,
        torch.Tensor.__float__,
        torch.Tensor.__int__,
        torch.Tensor.tolist,
    }
)


class HostReads(TorchFunctionMode):
    """Counts, in ``count``, the :data:`HOST_READS` calls made inside the block."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))
