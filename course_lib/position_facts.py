"""What the fused kernels need to know of a positions tensor, read from the device once.

The kernels take positions ``[1 or batch, seq]`` and choose their path from a few facts about
them: how far one sequence spans (they hold positions as exact float32 integers, spans below
``2^24``), whether each sequence steps by a constant (``p_b + s_b * arange(seq)``: then a bias of
``p_i - p_j`` is one value per diagonal, and the kernels compute positions instead of loading
them), whether positions never decrease along a sequence (a causal split may then trust
``p_j <= p_i``), and the smallest and largest position (a learned table has rows for
``0 .. rows - 1`` only). Each fact is a reduction over the positions, and reading a reduction back to
Python waits for the GPU: done one fact at a time, one ``attention()`` call waited up to five
times, and a model does it in every layer.

:func:`position_facts` computes all of them in one pass and reads them back once. What it
computed is remembered for the rest of the ``attention()`` call (:mod:`course_lib.call_scope`),
not beyond: another call may bring the same tensor with other values. Positions the course
builds carry their facts from the start and for good: :func:`arange_positions` (``start, start
+ 1, ...``, what every layer of :mod:`course_lib.layers` and ``attention()``'s default build)
and the relative positions :func:`course_lib.kernel_hooks.kernel_positions` makes; a view with
the same values in the same rows (``unsqueeze``, a ``[1, seq]`` reshape) shares them. A model
that numbers its tokens itself never waits for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from course_lib.call_scope import recall, remember

__all__ = ["PositionFacts", "arange_positions", "position_facts", "remember_facts"]


@dataclass(frozen=True)
class PositionFacts:
    """Facts of integer positions ``[rows, seq]`` (one row per sequence, or one for all).

    ``span``: the largest ``p - min(p)`` within a row; ``affine``: every row is
    ``p_b + s_b * arange(seq)``; ``ordered``: no row ever decreases; ``step_min``,
    ``step_max``: the smallest and largest ``s_b`` (rows of one token step by 0; both 0 where
    ``affine`` is False); ``lowest``, ``highest``: the smallest and largest position of all rows
    (both 0 for no positions)."""

    span: int
    affine: bool
    ordered: bool
    step_min: int
    step_max: int
    lowest: int
    highest: int


# tensors the course built -> (their version counter then, their last dim, their facts)
_BUILT = WeakIdKeyDictionary()


def remember_facts(positions: torch.Tensor, facts: PositionFacts) -> torch.Tensor:
    """Record ``facts`` as those of ``positions``, a tensor the caller built to have them (e.g.
    positions relative to each row's smallest keep every fact) and hands to no one who would
    change it behind its version counter; returns ``positions``."""
    _BUILT[positions] = (positions._version, positions.shape[-1], facts)
    return positions


def _recalled(positions: torch.Tensor) -> PositionFacts | None:
    for t in (positions, positions._base):
        if t is None or (t is not positions and not _same_rows(positions, t)):
            continue
        known = _BUILT.get(t)
        if known is not None and known[0] == t._version and known[1] == positions.shape[-1]:
            return known[2]
    return recall("position_facts", positions)


def _same_rows(view: torch.Tensor, base: torch.Tensor) -> bool:
    """A view that holds its base's values in the same order and rows of the same length."""
    return (
        view.numel() == base.numel()
        and view.shape[-1] == base.shape[-1]
        and view.storage_offset() == base.storage_offset()
        and view.is_contiguous()
        and base.is_contiguous()
    )


def position_facts(positions: torch.Tensor) -> PositionFacts:
    """The :class:`PositionFacts` of integer positions ``[rows, seq]``: those it was built with
    (or its base), or those found earlier in this call, else computed on its device and read
    back in one transfer (and remembered for the rest of the call)."""
    known = _recalled(positions)
    if known is not None:
        return known
    seq = positions.shape[-1]
    if positions.numel() == 0:
        return PositionFacts(0, True, True, 0, 0, 0, 0)
    p = positions.to(torch.int64)
    first = p[:, :1]
    steps = p[:, 1:2] - first if seq > 1 else torch.zeros_like(first)  # one token: step 0
    index = torch.arange(seq, device=p.device)
    affine = (p - first == steps * index).all()
    summary = torch.stack(
        (
            (p - p.amin(dim=1, keepdim=True)).max(),
            affine.long(),
            (p[:, 1:] >= p[:, :-1]).all().long(),
            torch.where(affine, steps.min(), 0),
            torch.where(affine, steps.max(), 0),
            p.min(),
            p.max(),
        )
    )
    span, is_affine, ordered, step_min, step_max, lowest, highest = summary.tolist()  # one read
    facts = PositionFacts(span, bool(is_affine), bool(ordered), step_min, step_max, lowest, highest)
    remember("position_facts", positions, facts)
    return facts


def arange_positions(start: int, seq: int, device=None) -> torch.Tensor:
    """``start, start + 1, ..., start + seq - 1`` as int64 ``[seq]``, with its facts known
    (span ``seq - 1``, step 1, ordered, from ``start`` to ``start + seq - 1``): nothing reads
    them back."""
    positions = torch.arange(start, start + seq, device=device, dtype=torch.long)
    step = 1 if seq > 1 else 0
    ends = (start, start + seq - 1) if seq else (0, 0)
    facts = PositionFacts(max(seq - 1, 0), True, True, step, step, *ends)
    return remember_facts(positions, facts)
