"""RSE, the implementation report's "RoPE + stick-breaking + distance penalty" (chapter 05).

``z_ij = scale * R(p_i) q_i . R(p_j) k_j - lambda_h |p_i - p_j|`` (``lambda_h >= 0``, learned per
head), then stick-breaking weights instead of softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.checks import check_distance_penalty
from course_lib.encodings.distance import linear_distance_bias
from course_lib.encodings.rope import (
    RoPEAttention,
    check_rope_params,
    rope_kernel_tables,
    rope_transform,
)
from course_lib.kernel_hooks import ScoreBias
from course_lib.registry import REQUIRED, Encoding, register

__all__ = ["RSEAttention"]


def rse_penalty(
    query_positions: torch.Tensor, key_positions: torch.Tensor, params: dict
) -> torch.Tensor:
    """-lambda_h |p_i - p_j|, a learned linear distance penalty per head"""
    return linear_distance_bias(query_positions, key_positions, params["distance_penalty"])


def check_rse_params(params: dict, *, heads: int, head_dim: int, device, **call) -> None:
    """RoPE's checks, and ``distance_penalty``: a finite ``[heads]`` tensor of lambda >= 0."""
    check_rope_params(params, heads=heads, head_dim=head_dim, device=device, **call)
    check_distance_penalty(params["distance_penalty"], heads, device)


class RSEAttention(RoPEAttention):
    """RoPE + learnable distance penalty ``lambda_h * |i - j|`` + stick-breaking.

    ``lambda_h = softplus(raw_h) >= 0``, one per head, initialised to about 0.01.
    """

    encoding = "rse"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        init = torch.full((num_heads,), 0.01)
        self.distance_penalty_raw = nn.Parameter(torch.log(torch.expm1(init)))

    @property
    def distance_penalty(self) -> torch.Tensor:
        """``lambda`` per head, ``[heads]``, always >= 0."""
        return F.softplus(self.distance_penalty_raw)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {
            **super().attention_params(hidden_states),
            "distance_penalty": self.distance_penalty,
        }


register(
    Encoding(
        name="rse",
        chapter="05_stick_breaking",
        summary="RoPE, a learned linear distance penalty per head, and stick-breaking",
        module=RSEAttention,
        color="#d62728",
        qk_transform=rope_transform,
        score_bias=rse_penalty,
        normaliser="stick_breaking",
        params={
            "base": 10000.0,
            "style": "interleaved",
            "scaling": None,
            "seq_len": None,
            "distance_penalty": REQUIRED,
        },
        check_params=check_rse_params,
        kernel_tables=rope_kernel_tables,
        kernel_bias=lambda params: ScoreBias("linear_distance", params["distance_penalty"]),
        relative=True,
        learnable=True,
    )
)
