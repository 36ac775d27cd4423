"""Sinusoidal absolute positions (Vaswani et al. 2017), added to the inputs of Q and K (chapter 01).

``PE[p, 2i] = sin(p / base**(2i/dim))``, ``PE[p, 2i+1] = cos(p / base**(2i/dim))``.
"""

from __future__ import annotations

import torch

from course_lib.checks import check_even_dim, is_integer
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import Encoding, register

__all__ = [
    "sinusoidal_table",
    "sinusoidal_embedding",
    "sinusoidal_shift_matrix",
    "AbsoluteAttention",
]


def sinusoidal_embedding(
    position_ids: torch.Tensor, dim: int, base: float = 10000.0
) -> torch.Tensor:
    """Sinusoidal codes of arbitrary positions: ``[...] -> [..., dim]`` (float32).

    ``PE[p, 2i] = sin(p / base**(2i/dim))``, ``PE[p, 2i+1] = cos(p / base**(2i/dim))``.
    Computed in float64 and rounded once, so large positions stay accurate.
    """
    check_even_dim(dim, "dim")
    if position_ids.is_floating_point() or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must be an integer tensor, got {position_ids.dtype}")
    inv_freq = base ** (
        -torch.arange(0, dim, 2, dtype=torch.float64, device=position_ids.device) / dim
    )
    angles = position_ids.to(torch.float64).unsqueeze(-1) * inv_freq  # [..., dim/2]
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # interleave sin, cos
    return pe.to(torch.float32)


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The table ``[num_positions, dim]`` of :func:`sinusoidal_embedding` for 0..num_positions-1."""
    if not is_integer(num_positions) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative integer, got {num_positions}")
    return sinusoidal_embedding(torch.arange(int(num_positions)), dim, base)


def sinusoidal_shift_matrix(shift: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed ``[dim, dim]`` matrix ``M_k`` with ``PE[p + k] = M_k @ PE[p]`` for every ``p``.

    Block-diagonal: each (sin, cos) pair with frequency w is rotated by the angle ``k*w``,
    ``sin(a + kw) = sin a cos kw + cos a sin kw``, ``cos(a + kw) = cos a cos kw - sin a sin kw``.
    It depends on the offset ``k`` only, never on ``p``.
    """
    check_even_dim(dim, "dim")
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    c, s = torch.cos(shift * inv_freq), torch.sin(shift * inv_freq)
    blocks = torch.stack((torch.stack((c, s), -1), torch.stack((-s, c), -1)), -2)  # [dim/2, 2, 2]
    return torch.block_diag(*blocks).to(torch.float32)


class AbsoluteAttention(PositionalSelfAttention):
    """Sinusoidal codes added to the hidden states that feed Q and K (not V); no parameters."""

    encoding = "absolute"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        if hidden_size % 2:
            raise ValueError(
                f"sinusoidal codes come in (sin, cos) pairs: hidden_size must be even, got {hidden_size}"
            )

    def add_positions(self, hidden_states, position_ids):
        pe = sinusoidal_embedding(position_ids, self.hidden_size).to(hidden_states.dtype)
        return hidden_states + pe, hidden_states


register(
    Encoding(
        name="absolute",
        chapter="01_sinusoidal",
        summary="fixed sin/cos codes of the absolute position added to the inputs of Q and K",
        module=AbsoluteAttention,
        color="#1f77b4",
        inputs="adds the sinusoidal code PE[p] to the hidden states that feed Q and K",
    )
)
