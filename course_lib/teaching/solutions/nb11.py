"""Worked solutions for notebook 11 (your own encoding: Sandwich, then FIRE).

FIRE (Li et al., ICLR 2024, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"), causal::

    b(i, j) = f( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(1 + c x),   j <= i

with ``f`` a small MLP from one number to one value per head, ``c > 0`` and the threshold
``L > 0`` learned. Positions are counted from each sequence's first key (as the fused kernels
count them), and at a tie ``i = L`` the position wins: ``L`` gets no gradient from that query.
"""

from __future__ import annotations

import torch

__all__ = ["FIRE_FILE", "fire_bias", "fire_mlp", "sandwich_distance_bias"]


def sandwich_distance_bias(distances: torch.Tensor, params: dict) -> torch.Tensor:
    """Sandwich (Chi et al., ACL 2023): ``b = sum_{k=1}^{d'/2} cos((m - n) / 10000^(2k / d'))``,
    the inner product of two sinusoidal position codes; ``params["dim"]`` is ``d'``.
    ``distances`` (``m - n``, any shape) -> ``[1, *distances.shape]`` (every head alike)."""
    dim = params["dim"]
    k = torch.arange(1, dim // 2 + 1, dtype=torch.float64, device=distances.device)
    inverse = 10000.0 ** (-2.0 * k / dim)  # [d'/2]
    angles = distances.to(torch.float64).unsqueeze(-1) * inverse
    dtype = distances.dtype if distances.is_floating_point() else torch.get_default_dtype()
    return torch.cos(angles).sum(-1).unsqueeze(0).to(dtype)


def fire_mlp(x: torch.Tensor, params: dict) -> torch.Tensor:
    """``f``: one hidden layer with ReLU, ``x`` ``[...]`` -> ``[heads, ...]``:
    ``w2 relu(w1 x + b1) + b2`` with ``w1, b1`` ``[hidden]``, ``w2`` ``[heads, hidden]``,
    ``b2`` ``[heads]``."""
    hidden = torch.relu(x.unsqueeze(-1) * params["w1"] + params["b1"])  # [..., hidden]
    out = hidden @ params["w2"].transpose(0, 1) + params["b2"]  # [..., heads]
    return out.movedim(-1, 0)


def fire_bias(
    query_positions: torch.Tensor, key_positions: torch.Tensor, params: dict
) -> torch.Tensor:
    """FIRE's bias ``[1|B, Nq]``, ``[1|B, Nk]`` -> ``[1|B, H, Nq, Nk]`` (module docstring); keys
    after the query get the bias of distance 0 (the causal mask removes them)."""
    first = key_positions.amin(dim=-1, keepdim=True)  # each sequence's first key
    i = (query_positions - first).to(params["c"].dtype)  # [1|B, Nq]
    j = (key_positions - first).to(params["c"].dtype)  # [1|B, Nk]
    c, threshold = params["c"], params["L"]
    distance = (i.unsqueeze(-1) - j.unsqueeze(-2)).clamp_min(0)  # [1|B, Nq, Nk]
    reach = torch.where(i >= threshold, i, threshold)  # max(L, i), the position wins a tie
    normalised = torch.log1p(c * distance) / torch.log1p(c * reach).unsqueeze(-1)
    return fire_mlp(normalised, params).movedim(0, 1)  # [1|B, H, Nq, Nk]


FIRE_FILE = '''
"""FIRE (Li et al., ICLR 2024): b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(1 + c x)."""

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.kernel_hooks import distance_score_bias
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register
from course_lib.teaching.solutions.nb11 import fire_bias, fire_mlp

HIDDEN = 32


class FireAttention(PositionalSelfAttention):
    encoding = "fire"

    def __init__(self, hidden_size, num_heads, *args, **kwargs):
        super().__init__(hidden_size, num_heads, *args, **kwargs)
        g = torch.Generator().manual_seed(0)
        self.w1 = nn.Parameter(torch.randn(HIDDEN, generator=g))
        self.b1 = nn.Parameter(torch.zeros(HIDDEN))
        self.w2 = nn.Parameter(torch.randn(num_heads, HIDDEN, generator=g) / HIDDEN**0.5)
        self.b2 = nn.Parameter(torch.zeros(num_heads))
        self.c_raw = nn.Parameter(torch.zeros(()))  # c = softplus(c_raw) / log 2: 1 at start
        self.L_raw = nn.Parameter(torch.zeros(()))  # L = 64 exp(L_raw): 64 at start

    def attention_params(self, hidden_states):
        return {
            "w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2,
            "c": F.softplus(self.c_raw) / 0.6931471805599453,
            "L": 64.0 * torch.exp(self.L_raw),
        }


def fire_kernel_bias(params, positions):
    """The kernels read FIRE from a table per distance while every query is below L (then
    psi(max(L, i)) = psi(L) for every query, and the bias is a function of i - j alone)."""
    span = positions.amax(dim=-1) - positions.amin(dim=-1)
    if bool((span >= params["L"].detach()).any()):
        raise ValueError(
            f"FIRE on the fused kernels needs every query position below L = "
            f"{float(params['L'].detach()):.1f} (counted from its sequence's first key); a sequence here "
            f"spans {int(span.max())}. Use backend='reference' for it."
        )

    def of_distance(distances, params):
        d = distances.clamp_min(0).to(params["c"].dtype)
        return fire_mlp(torch.log1p(params["c"] * d) / torch.log1p(params["c"] * params["L"]), params)

    heads = params["w2"].shape[0]
    bias = distance_score_bias(of_distance, positions, params, heads)
    if bias is None:
        raise ValueError(
            "FIRE on the fused kernels reads a table per distance i - j, which needs each "
            "sequence's positions to step by a constant; use backend='reference' for others."
        )
    return bias


register(
    Encoding(
        name="fire", summary="a learned function of the normalised log distance (FIRE)",
        module=FireAttention, color="#8c564b", score_bias=fire_bias,
        params={"w1": REQUIRED, "b1": REQUIRED, "w2": REQUIRED, "b2": REQUIRED, "c": REQUIRED,
                "L": REQUIRED},
        kernel_bias=fire_kernel_bias, relative=True, distance_only=False, causal_only=True,
        learnable=True,
    )
)
'''
"""The whole encoding file of FIRE, as the learner writes it (for ``write_encoding``)."""
