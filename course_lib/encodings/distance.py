"""Score biases that are a function of the distance ``|p_i - p_j|`` (shared by several encodings)."""

from __future__ import annotations

import torch

__all__ = ["linear_distance_bias"]


def linear_distance_bias(
    query_positions: torch.Tensor, key_positions: torch.Tensor, slopes: torch.Tensor
) -> torch.Tensor:
    """``b_ij = -slopes[h] * |p_i - p_j|``: ``[1|B, Nq]``, ``[1|B, Nk]``, ``[H]`` -> ``[1|B, H, Nq, Nk]``.

    A penalty that grows linearly with distance (RSE's lambda, ALiBi's slopes). In the dtype of
    ``slopes``, so gradients reach them.
    """
    distance = (query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)).abs()  # [1|B, Nq, Nk]
    return -slopes.view(1, -1, 1, 1) * distance.unsqueeze(1).to(slopes.dtype)
