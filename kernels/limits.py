"""What the fused kernels support, readable without Triton (this module never imports it).

Both kernel families (flash in :mod:`.flash`, stick-breaking in :mod:`.stick_breaking`) and their
wrappers check their inputs against these values; :mod:`course_lib.checks` reads them too, so a
machine without Triton (macOS, Windows) can still say what the kernels would accept. There is no
list of score-bias hooks here: a hook is an object its encoding defines (see :mod:`.score_bias`).
"""

from __future__ import annotations

import torch

__all__ = [
    "KERNEL_HEAD_DIMS",
    "KERNEL_DTYPES",
    "MAX_BATCH_HEADS",
    "MAX_POSITION_SPAN",
    "PAIR_LAYOUTS",
]

# head_dim of q, k and v: powers of two, so every tile is a power of two wide.
KERNEL_HEAD_DIMS: tuple[int, ...] = (16, 32, 64, 128)
# One dtype for q, k and v; every kernel accumulates in float32.
KERNEL_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
# batch * heads is the second grid axis of every launch; CUDA allows at most 65535 there.
MAX_BATCH_HEADS = 65535
# The kernels read positions as float32 counted from each sequence's smallest position (the
# wrappers subtract it in integers), exact below 2^24: the positions of one sequence may span at
# most this much (any integers, e.g. 10**12 + arange(n)).
MAX_POSITION_SPAN = 2**24 - 1
# How head_dim is split into the channel pairs a q/k table acts on: pair t is channels
# (2t, 2t+1) for "interleaved" and (t, t + head_dim/2) for "half".
PAIR_LAYOUTS: tuple[str, ...] = ("interleaved", "half")
