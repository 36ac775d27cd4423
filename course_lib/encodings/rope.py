"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer): q and k rotated by position (chapter 03).

Pair ``t`` of the vector at position ``p`` is rotated by the angle ``p * base**(-2t/head_dim)``, so
``R(p_i) q . R(p_j) k = q . R(p_j - p_i) k``: the score depends on the offset only.
"""

from __future__ import annotations

import math

import torch

from course_lib.checks import check_choice, check_even_dim
from course_lib.kernel_hooks import PAIR_LAYOUTS, QKTables
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import Encoding, register

__all__ = [
    "ROPE_STYLES",
    "rope_inverse_frequencies",
    "rope_angles",
    "apply_rope",
    "rope_half_permutation",
    "rope_transform",
    "rope_kernel_tables",
    "check_rope_params",
    "RoPEAttention",
]

ROPE_STYLES = PAIR_LAYOUTS  # "interleaved" pairs (2t, 2t+1); "half" pairs (t, t + D/2)


def rope_inverse_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``w_t = base**(-2t/head_dim)`` for pairs ``t = 0..head_dim/2-1`` (float32)."""
    check_even_dim(head_dim, "head_dim for RoPE")
    return (base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).to(
        torch.float32
    )


def rope_angles(position_ids: torch.Tensor, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation angles ``p * w_t`` in float32: ``[...] -> [..., head_dim/2]``."""
    if position_ids.is_floating_point() or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must be an integer tensor, got {position_ids.dtype}")
    inv_freq = rope_inverse_frequencies(head_dim, base).to(position_ids.device)
    return position_ids.to(torch.float32).unsqueeze(-1) * inv_freq


def _angles_for(x: torch.Tensor, position_ids: torch.Tensor, base: float) -> torch.Tensor:
    """Angles broadcastable against ``x[..., seq, head_dim/2]``.

    ``position_ids`` ``[seq]`` gives ``[seq, D/2]``; ``[batch, seq]`` with a 4-D ``x``
    (``[batch, heads, seq, head_dim]``) gives ``[batch, 1, seq, D/2]``.
    """
    seq, head_dim = x.shape[-2], x.shape[-1]
    if position_ids.shape[-1] != seq or position_ids.dim() > 2:
        raise ValueError(
            f"position_ids must be [seq] or [batch, seq] with seq={seq}, got {tuple(position_ids.shape)}"
        )
    if position_ids.device != x.device:
        raise ValueError(f"position_ids are on {position_ids.device} but x is on {x.device}")
    angles = rope_angles(position_ids, head_dim, base)
    if position_ids.dim() == 2 and x.dim() == 4:
        angles = angles.unsqueeze(1)
    return angles


def _rotate_pairs(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str
) -> torch.Tensor:
    """Rotate channel pairs: ``(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)``."""
    if style == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (for gradcheck); everything else is computed in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def apply_rope(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    base: float = 10000.0,
    style: str = "interleaved",
) -> torch.Tensor:
    """Rotary position embedding of ``x`` ``[..., seq, head_dim]``; returns a tensor like ``x``.

    Pair ``t`` of the vector at position ``p`` is rotated by the angle ``p * base**(-2t/head_dim)``.
    ``style="interleaved"`` pairs channels ``(2t, 2t+1)`` (RoFormer, GPT-J);
    ``style="half"`` pairs ``(t, t + head_dim/2)`` (GPT-NeoX, Llama's ``rotate_half``).
    Angles are float32 whatever the dtype of ``x``; the rotation runs in float32 (float64 for
    float64 inputs) and the result is cast back.
    """
    check_choice("RoPE style", style, ROPE_STYLES)
    check_even_dim(x.shape[-1], "head_dim for RoPE")
    angles = _angles_for(x, position_ids, base)
    dt = compute_dtype(x)
    cos, sin = angles.cos().to(dt), angles.sin().to(dt)
    return _rotate_pairs(x.to(dt), cos, sin, style).to(x.dtype)


def rope_half_permutation(head_dim: int) -> torch.Tensor:
    """Channel order that turns the interleaved layout into the half layout.

    ``apply_rope(x, p, style="interleaved")[..., perm] == apply_rope(x[..., perm], p, style="half")``
    with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]``.
    """
    check_even_dim(head_dim, "head_dim")
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


# -- hooks of the registry record ----------------------------------------------------------------
def rope_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """rotates channel pair t by the angle p * base^(-2t/D)"""
    return apply_rope(x, positions, base=params["base"], style=params["style"])


def rope_kernel_tables(positions: torch.Tensor, head_dim: int, params: dict) -> QKTables:
    """The kernels' tables of :func:`rope_transform`: fp32 cos/sin ``[1|batch, seq, D/2]``."""
    angles = rope_angles(positions, head_dim, params["base"])
    return QKTables(angles.cos(), angles.sin(), None, params["style"])


def check_rope_params(params: dict, *, heads: int, head_dim: int, device, causal: bool) -> None:
    """``style`` in :data:`ROPE_STYLES`, ``base`` > 0, an even head_dim."""
    check_choice("RoPE style", params["style"], ROPE_STYLES)
    base = params["base"]
    if not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 0:
        raise ValueError(f"RoPE base must be a positive finite number, got {base!r}")
    if head_dim % 2:
        raise ValueError(f"RoPE rotates channel pairs: head_dim must be even, got {head_dim}")


class RoPEAttention(PositionalSelfAttention):
    """Rotary encoding of q and k (interleaved pairs, base 10000); no parameters."""

    encoding = "rope"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        if self.head_dim % 2:
            raise ValueError(
                f"{type(self).__name__} rotates channel pairs: head_dim must be even, got {self.head_dim}"
            )


register(
    Encoding(
        name="rope",
        chapter="03_rope",
        summary="q and k rotated pair by pair by angles proportional to the position",
        module=RoPEAttention,
        color="#2ca02c",
        qk_transform=rope_transform,
        params={"base": 10000.0, "style": "interleaved"},
        check_params=check_rope_params,
        kernel_tables=rope_kernel_tables,
        relative=True,
    )
)
