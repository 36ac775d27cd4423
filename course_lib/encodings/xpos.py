"""xPos, RoPE with an exponential decay per channel pair (Sun et al. 2022) (chapter 07).

RoPE's score depends on the offset only, but not its size: nothing makes far keys count less.
xPos (Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song & Wei 2022, "A Length-Extrapolatable
Transformer", arXiv:2212.10554, section 3.2) scales the rotated pairs, **queries and keys
differently**: pair ``t`` of the query at position ``n`` by ``zeta_t^(n / s)``, of the key at
position ``m`` by ``zeta_t^(-m / s)``, so that::

    q'_n . k'_m = sum_t zeta_t^((n - m) / s) * (pair t of RoPE's q_n . R(m - n) k_m)
    zeta_t = (t / (D/2) + gamma) / (1 + gamma),   t = 0 .. D/2 - 1   (gamma = 0.4, s = 512)

still a function of ``n - m`` (relative), and for a key behind the query (``n > m``) each pair
decays exponentially with the distance, fastest for the fast-turning pairs (small ``t``, where
``zeta_t`` is smallest) whose rotation is least reliable far away. ``zeta_t`` lies in ``[gamma /
(1 + gamma), 1)``. A key *after* the query would be amplified instead, so xPos is causal only,
as in the paper's language models.

On the kernels this is RoPE's cos/sin tables with the scale folded in, ``zeta^(n/s)`` in the
query tables and ``zeta^(-m/s)`` in the key tables (``QKTables.key_cos``/``key_sin``): the q/k
transform of both kernel families, no kernel code of its own. The scales are taken at the
positions as given (``zeta^(n/s)`` underflows and ``zeta^(-m/s)`` overflows float32 once ``n /
s`` passes about 70, i.e. ``n`` past about 35,000 with ``s = 512``; the paper's code centres the
positions of each call for that reason, which a key/value cache would have to share).
"""

from __future__ import annotations

import math

import torch

from course_lib.encodings.rope import (
    RoPEAttention,
    check_rope_params,
    compute_dtype,
    rope_angles,
    rotate_pairs,
)
from course_lib.kernel_hooks import QKTables
from course_lib.registry import Encoding, register

__all__ = ["XPOS_GAMMA", "XPOS_SCALE_BASE", "XPosAttention", "apply_xpos", "xpos_decay"]

XPOS_GAMMA = 0.4  # the paper's gamma
XPOS_SCALE_BASE = 512.0  # the paper's s


def xpos_decay(head_dim: int, gamma: float = XPOS_GAMMA) -> torch.Tensor:
    """``zeta_t = (t / (D/2) + gamma) / (1 + gamma)`` for pairs ``t = 0 .. D/2 - 1``: ``[D/2]``
    float32, in ``[gamma / (1 + gamma), 1)``."""
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even integer, got {head_dim!r}")
    t = torch.arange(head_dim // 2, dtype=torch.float64)
    return ((t / (head_dim // 2) + gamma) / (1 + gamma)).to(torch.float32)


def xpos_scale(
    position_ids: torch.Tensor,
    head_dim: int,
    *,
    side: str,
    gamma: float = XPOS_GAMMA,
    scale_base: float = XPOS_SCALE_BASE,
) -> torch.Tensor:
    """The scale of each pair: ``zeta_t^(p / s)`` for queries, ``zeta_t^(-p / s)`` for keys;
    ``[...]`` (integer positions) -> ``[..., D/2]`` float32 (computed in float64)."""
    if side not in ("query", "key"):
        raise ValueError(f"side must be 'query' or 'key', got {side!r}")
    sign = 1.0 if side == "query" else -1.0
    log_zeta = torch.log(xpos_decay(head_dim, gamma).double()).to(position_ids.device)
    exponent = sign * position_ids.double().unsqueeze(-1) / scale_base
    return torch.exp(exponent * log_zeta).to(torch.float32)


def apply_xpos(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    side: str,
    base: float = 10000.0,
    style: str = "interleaved",
    gamma: float = XPOS_GAMMA,
    scale_base: float = XPOS_SCALE_BASE,
) -> torch.Tensor:
    """xPos of ``x`` ``[..., seq, head_dim]`` (queries: ``side="query"``; keys: ``"key"``):
    RoPE's rotation of each pair, times ``zeta_t^(+-p / s)``. ``position_ids`` ``[seq]`` or
    ``[batch, seq]`` (with a 4-D ``x``). Computed in float32 (float64 for float64 inputs)."""
    head_dim = x.shape[-1]
    angles = rope_angles(position_ids, head_dim, base)
    scale = xpos_scale(position_ids, head_dim, side=side, gamma=gamma, scale_base=scale_base)
    if position_ids.dim() == 2 and x.dim() == 4:
        angles, scale = angles.unsqueeze(1), scale.unsqueeze(1)
    dt = compute_dtype(x)
    cos, sin = (angles.cos() * scale).to(dt), (angles.sin() * scale).to(dt)
    return rotate_pairs(x.to(dt), cos, sin, style).to(x.dtype)


# -- hooks of the registry record ----------------------------------------------------------------
def xpos_query_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """RoPE rotation by p, each pair scaled by zeta_t^(p/512) (keys: zeta_t^(-p/512))"""
    return apply_xpos(
        x, positions, side="query", base=params["base"], style=params["style"],
        gamma=params["gamma"], scale_base=params["scale_base"],
    )  # fmt: skip


def xpos_key_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """RoPE rotation by p, each pair scaled by zeta_t^(-p/512)"""
    return apply_xpos(
        x, positions, side="key", base=params["base"], style=params["style"],
        gamma=params["gamma"], scale_base=params["scale_base"],
    )  # fmt: skip


def xpos_kernel_tables(positions: torch.Tensor, head_dim: int, params: dict) -> QKTables:
    """RoPE's cos/sin tables times ``zeta^((p - c)/s)`` for the queries and ``zeta^(-(p - c)/s)``
    for the keys (the same angles; float32 ``[1|batch, seq, D/2]``). ``c`` is the middle of each
    sequence's positions: queries and keys share them on the kernels (seq_q == seq_k), so the
    score's factor ``zeta^((n - m)/s)`` is unchanged, while the scaled keys stay within fp16's
    range (at ``p = 5000`` uncentred, ``zeta^(-p/s)`` reaches about 2e5 > 65504)."""
    angles = rope_angles(positions, head_dim, params["base"])
    cos, sin = angles.cos(), angles.sin()
    positions = positions.to(torch.int64)
    centre = (positions.amin(dim=-1, keepdim=True) + positions.amax(dim=-1, keepdim=True)) // 2
    scales = {
        side: xpos_scale(
            positions - centre, head_dim, side=side, gamma=params["gamma"],
            scale_base=params["scale_base"],
        )  # fmt: skip
        for side in ("query", "key")
    }
    return QKTables(
        cos * scales["query"], sin * scales["query"], None, params["style"],
        key_cos=cos * scales["key"], key_sin=sin * scales["key"],
    )  # fmt: skip


def check_xpos_params(params: dict, **call) -> None:
    """RoPE's checks (``base``, ``style``, an even head_dim); ``gamma`` > 0 and ``scale_base``
    > 0, finite numbers."""
    check_rope_params(params, **call)
    for name in ("gamma", "scale_base"):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"xPos {name} must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"xPos {name} must be a finite number > 0, got {value!r}")


class XPosAttention(RoPEAttention):
    """xPos: RoPE whose query pairs are scaled by ``zeta^(n/s)`` and key pairs by
    ``zeta^(-m/s)`` (no parameters; causal only). ``gamma`` and ``scale_base`` are the paper's
    0.4 and 512 unless given."""

    encoding = "xpos"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        *,
        gamma: float = XPOS_GAMMA,
        scale_base: float = XPOS_SCALE_BASE,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        check_xpos_params(
            {"base": 10000.0, "style": "interleaved", "gamma": gamma, "scale_base": scale_base},
            heads=num_heads, head_dim=self.head_dim, device=None,
        )  # fmt: skip
        self.gamma, self.scale_base = float(gamma), float(scale_base)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"gamma": self.gamma, "scale_base": self.scale_base}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gamma={self.gamma}, scale_base={self.scale_base}"


register(
    Encoding(
        name="xpos",
        chapter="07_rope_scaling",
        summary="RoPE with pair t of queries scaled by zeta_t^(n/512) and of keys by zeta_t^(-m/512)",
        module=XPosAttention,
        color="#31a354",
        qk_transform=xpos_query_transform,
        key_transform=xpos_key_transform,
        params={
            "base": 10000.0,
            "style": "interleaved",
            "gamma": XPOS_GAMMA,
            "scale_base": XPOS_SCALE_BASE,
        },
        check_params=check_xpos_params,
        kernel_tables=xpos_kernel_tables,
        relative=True,
        causal_only=True,
    )
)
