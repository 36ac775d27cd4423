"""Worked solutions for notebook 04 (ExpoSB)."""

from __future__ import annotations

import torch


def band_gain(head_dim: int) -> torch.Tensor:
    """ExpoSB's band-pass gain ``[head_dim]``: ``0.8 + 0.4 exp(-(d - D/4)^2 / (2 (D/8)^2))``."""
    d = torch.arange(head_dim, dtype=torch.float32)
    center, width = head_dim / 4, head_dim / 8
    return 0.8 + 0.4 * torch.exp(-((d - center) ** 2) / (2 * width**2))


def distance_logit_bias(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """``log f(|m - n|)`` for query positions ``[Nq]`` and key positions ``[Nk]``: ``[Nq, Nk]``.

    ``f(d) = 0.7 + 0.3 exp(-0.005 d)``; added to the logits it multiplies every softmax weight
    by ``f`` and renormalises the row.
    """
    distance = (query_positions[:, None] - key_positions[None, :]).abs().to(torch.float32)
    return torch.log(0.7 + 0.3 * torch.exp(-0.005 * distance))
