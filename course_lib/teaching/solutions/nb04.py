"""Worked solutions for notebook 04 (ExpoSB)."""

from __future__ import annotations

import torch


def pairwise_gain(gain: torch.Tensor, style: str) -> torch.Tensor:
    """A per-channel gain ``[D]`` made equal within every RoPE pair: both channels of pair ``t``
    get ``(gain[a] + gain[b]) / 2``, with ``(a, b) = (2t, 2t+1)`` (interleaved) or
    ``(t, t + D/2)`` (half). Equal gains within a pair scale that pair's dot product by ``g_t^2``,
    which keeps the score a function of ``m - n``."""
    half = gain.shape[-1] // 2
    t = torch.arange(half)
    first, second = (2 * t, 2 * t + 1) if style == "interleaved" else (t, t + half)
    mean = (gain[first] + gain[second]) / 2
    out = gain.clone()
    out[first] = mean
    out[second] = mean
    return out


def distance_logit_bias(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """``log f(|m - n|)`` for query positions ``[Nq]`` and key positions ``[Nk]``: ``[Nq, Nk]``.

    ``f(d) = 0.7 + 0.3 exp(-0.005 d)``; added to the logits it multiplies every softmax weight
    by ``f`` and renormalises the row.
    """
    distance = (query_positions[:, None] - key_positions[None, :]).abs().to(torch.float32)
    return torch.log(0.7 + 0.3 * torch.exp(-0.005 * distance))
