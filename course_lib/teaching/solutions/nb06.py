"""Worked solutions for notebook 06 (position as a bias on the score: ALiBi, T5 buckets, KERPLE)."""

from __future__ import annotations

import math

import torch


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's slopes ``[num_heads]`` (float32).

    ``H0`` = the largest power of two ``<= num_heads``. The first ``H0`` slopes are
    ``2^(-8h/H0)``, ``h = 1..H0``; the remaining ``num_heads - H0`` are the in-between slopes
    ``2^(-8(2k-1)/(2 H0))``, ``k = 1, 2, ...`` (the odd-numbered slopes of ``2 H0`` heads).
    """
    base = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    slopes = [2.0 ** (-8.0 * h / base) for h in range(1, base + 1)]
    slopes += [2.0 ** (-8.0 * (2 * k - 1) / (2 * base)) for k in range(1, num_heads - base + 1)]
    return torch.tensor(slopes, dtype=torch.float32)


def relative_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket of ``relative_position = key position - query position`` (int tensor).

    Per direction ``B`` buckets (``num_buckets / 2`` when bidirectional), ``E = B // 2`` exact:
    distance ``n < E`` -> ``n``; else ``min(E + floor(log(n/E) / log(max_distance/E) * (B - E)),
    B - 1)``. Bidirectional: keys after the query (``relative_position > 0``) add ``B``.
    Unidirectional: keys after the query count as distance 0.
    """
    back = -relative_position.long()  # how far back the key is
    if bidirectional:
        per_direction = num_buckets // 2
        offset = (back < 0).long() * per_direction
        distance = back.abs()
    else:
        per_direction = num_buckets
        offset = torch.zeros_like(back)
        distance = back.clamp(min=0)
    exact = per_direction // 2
    scaled = torch.log(distance.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
    far = (exact + (scaled * (per_direction - exact)).long()).clamp(max=per_direction - 1)
    return offset + torch.where(distance < exact, distance, far)


def half_attention_distance(slope: float, context: int) -> int:
    """The smallest ``D`` such that the keys at distances ``0..D`` receive at least half of a
    causal query's attention, when every content score is equal and the query sees ``context``
    keys (distances ``0..context-1``): weights ``proportional to exp(-slope * d)``."""
    weights = torch.exp(-slope * torch.arange(context, dtype=torch.float64))
    cumulative = torch.cumsum(weights, 0) / weights.sum()
    return int(torch.searchsorted(cumulative, torch.tensor([0.5], dtype=torch.float64))[0])


def kerple_bias(
    distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, variant: str = "log"
) -> torch.Tensor:
    """KERPLE's bias ``[heads, *distance.shape]`` of the offsets ``distance = p_i - p_j``
    (integer tensor), with ``r1``, ``r2`` ``[heads]``: ``-r1 log(1 + r2 |d|)`` (``"log"``) or
    ``-r1 |d|^r2`` (``"power"``), in the parameters' dtype."""
    shape = (-1, *([1] * distance.dim()))
    d = distance.abs().to(r1.dtype)
    r1, r2 = r1.view(shape), r2.view(shape)
    if variant == "log":
        return -r1 * torch.log1p(r2 * d)
    return -r1 * d**r2
