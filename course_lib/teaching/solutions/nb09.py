"""Worked solutions for notebook 09 (positions in two dimensions)."""

from __future__ import annotations

import torch

from course_lib.encodings import apply_rope


def rope_2d_from_1d(x: torch.Tensor, coords: torch.Tensor, base: float = 100.0) -> torch.Tensor:
    """Axial 2D RoPE from two 1-D RoPE calls: ``x`` ``[..., seq, D]``, ``coords`` ``[seq, 2]``.

    In the interleaved layout the first ``D/4`` pairs are the first ``D/2`` channels. 1-D RoPE over
    ``D/2`` channels turns pair ``t`` by ``p * base**(-2t/(D/2)) = p * base**(-t/(D/4))``, the
    axial frequencies; so rotate the first half by the row and the second by the column.
    """
    half = x.shape[-1] // 2
    rows = apply_rope(x[..., :half], coords[:, 0], base=base)
    cols = apply_rope(x[..., half:], coords[:, 1], base=base)
    return torch.cat((rows, cols), dim=-1)


def commuting_partner(a: torch.Tensor) -> torch.Tensor:
    """A skew-symmetric matrix that commutes with the skew-symmetric ``a`` and is not a multiple
    of it: ``a @ a @ a``. Odd powers of a skew matrix are skew (``(a^3)^T = (a^T)^3 = -a^3``) and
    every power of ``a`` commutes with ``a``; for a 4 x 4 ``a`` with two different rotation speeds
    ``w1 != w2``, ``a^3`` turns the two planes at ``-w1^3`` and ``-w2^3``, not in proportion."""
    return a @ a @ a
