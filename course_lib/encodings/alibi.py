"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022) (chapter 06).

No position in q or k: each head ``h`` subtracts ``m_h |p_i - p_j|`` from its scores, with fixed
geometric slopes ``m_h = 2^(-8h/H)``, ``h = 1..H``. Causal, as in the paper (keys ``j <= i``, so
the bias is ``-m_h (i - j)``), or bidirectional with the same symmetric bias.
"""

from __future__ import annotations

import math

import torch

from course_lib.checks import check_float_tensor, is_integer, refuse_if
from course_lib.encodings.distance import LINEAR_DISTANCE
from course_lib.kernel_hooks import ScoreBias
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import Encoding, register

__all__ = ["alibi_slopes", "AlibiAttention"]


def _geometric_slopes(num_heads: int) -> list[float]:
    """``2^(-8h/H)`` for ``h = 1..H`` (``H`` a power of two)."""
    return [2.0 ** (-8.0 * h / num_heads) for h in range(1, num_heads + 1)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The paper's slopes ``[num_heads]`` (float32).

    For ``H`` a power of two: ``m_h = 2^(-8h/H)``, a geometric sequence from ``2^(-8/H)`` down to
    ``2^(-8)``. Otherwise, with ``H0`` the largest power of two below ``H``: the ``H0`` slopes of
    ``H0`` heads, then the first ``H - H0`` of the odd-numbered slopes of ``2 H0`` heads (they fall
    halfway, in log scale, between the first ones).
    """
    if not is_integer(num_heads) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}")
    num_heads = int(num_heads)
    base = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _geometric_slopes(base)
    if base < num_heads:
        slopes += _geometric_slopes(2 * base)[0::2][: num_heads - base]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_distance_bias(distances: torch.Tensor, params: dict) -> torch.Tensor:
    """-m_h |p_i - p_j| with fixed geometric slopes m_h

    ``distances`` (``p_i - p_j``, int64, any shape) -> ``[heads, *distances.shape]`` in float32
    (float64 for float64 slopes), whatever the slopes' dtype.
    """
    dtype = torch.promote_types(params["slopes"].dtype, torch.float32)
    slopes = params["slopes"].to(dtype)
    return -slopes.view(-1, *([1] * distances.dim())) * distances.abs().to(dtype)


def alibi_kernel_bias(params: dict, positions: torch.Tensor) -> ScoreBias:
    """The kernels' linear distance hook (shared with RSE): per pair, two operations and no
    table, faster by the static GPU model than the per-distance table its ``distance_bias``
    would give."""
    return ScoreBias(LINEAR_DISTANCE, params["slopes"])


def check_alibi_params(params: dict, *, heads: int, head_dim: int, device, **call) -> None:
    """``slopes``: None (the paper's, for ``heads``) or a finite ``[heads]`` tensor of slopes >= 0."""
    slopes = params["slopes"]
    if slopes is None:
        params["slopes"] = alibi_slopes(heads).to(device)
        return
    check_float_tensor(slopes, "ALiBi slopes", "[heads]", device, shape=(heads,))
    refuse_if(
        slopes.detach() < 0,
        lambda: ValueError(
            "ALiBi slopes must be >= 0: the bias -m |i - j| penalises distance; a negative "
            "slope would reward it"
        ),
    )


class AlibiAttention(PositionalSelfAttention):
    """Softmax attention with ALiBi's fixed per-head linear distance penalty; no parameters."""

    encoding = "alibi"


register(
    Encoding(
        name="alibi",
        chapter="06_score_biases",
        summary="a fixed penalty -m_h |i - j| on the scores, one geometric slope per head",
        module=AlibiAttention,
        color="#bcbd22",
        distance_bias=alibi_distance_bias,
        params={"slopes": None},
        check_params=check_alibi_params,
        kernel_bias=alibi_kernel_bias,
        kernel_hooks=(LINEAR_DISTANCE,) if LINEAR_DISTANCE is not None else (),
        relative=True,
    )
)
