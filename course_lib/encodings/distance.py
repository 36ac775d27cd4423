"""Score biases that are a function of the distance ``|p_i - p_j|`` (shared by several encodings).

The reference formula in torch, and the fused kernels' hook for it: ALiBi (fixed slopes) and RSE
(a learned penalty) both hand the kernels :data:`LINEAR_DISTANCE`.
"""

from __future__ import annotations

import torch

from course_lib.runtime import kernels_available

__all__ = ["LINEAR_DISTANCE", "linear_distance_bias"]


def linear_distance_bias(
    query_positions: torch.Tensor, key_positions: torch.Tensor, slopes: torch.Tensor
) -> torch.Tensor:
    """``b_ij = -slopes[h] * |p_i - p_j|``: ``[1|B, Nq]``, ``[1|B, Nk]``, ``[H]`` -> ``[1|B, H, Nq, Nk]``.

    A penalty that grows linearly with distance (RSE's lambda, ALiBi's slopes). In float32
    (float64 for float64 slopes), whatever the slopes' dtype, as the kernels compute it: in
    float16 a distance past 65504 is inf; gradients reach the slopes through the cast.
    """
    distance = (query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)).abs()  # [1|B, Nq, Nk]
    dtype = torch.promote_types(slopes.dtype, torch.float32)
    return -slopes.to(dtype).view(1, -1, 1, 1) * distance.unsqueeze(1).to(dtype)


# -- the fused kernels' hook (Triton only) --------------------------------------------------------
LINEAR_DISTANCE = None
"""The kernels' hook ``b_ij = -per_head[h] * |p_i - p_j|`` (``per_head`` ``[heads]``, learnable):
the distance is taken in registers from the positions, and the gradient of ``per_head`` is
``-sum_ij dS_ij |p_i - p_j|``, one partial sum per row of each tile. None without Triton."""
if kernels_available():
    from course_lib.kernels import score_bias as _library

    LINEAR_DISTANCE = _library.BiasHook(
        name="linear_distance",
        formula="b_ij = -per_head[h] * |p_i - p_j|",
        bias=_library.linear_distance_bias,
        grad=_library.linear_distance_grad,
        param="per_head",
        reduce=_library.per_head_total,
        split=_library.linear_distance_split,
        split_ordered=True,  # |p_i - p_j| = p_i - p_j only where the key is not after the query
    )
