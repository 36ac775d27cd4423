"""RoPE-Mixed (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", §3.2):
every channel pair turns with a learned mix of the row and the column (chapter 09).

Axial 2D RoPE (:mod:`.rope_2d`) turns each pair with one axis. RoPE-Mixed gives pair ``t`` of
head ``h`` two learned frequencies, one per axis, and turns it by::

    angle[h, p, t] = row(p) * f[h, 0, t] + col(p) * f[h, 1, t]

so a pair can measure distance along any direction of the image (a diagonal, say). The angle is
linear in the position, so ``R(p_i) q . R(p_j) k = q . R(p_j - p_i) k``: the score depends on
the 2-D offset only. Axial 2D RoPE is the case where one of each pair's two frequencies is 0.
In matrix form ``R(p) = exp(row A_0 + col A_1)`` with ``A_i`` block-diagonal, ``f[h, i, t] J``
on pair ``t`` (``J = [[0, -1], [1, 0]]``): commuting generators, so ComRoPE's theorem applies.

Initialisation, as the authors' code: per head one random direction ``a``; the first ``D/4``
pairs get magnitudes ``base**(-t/(D/4))`` (``base = 10``) in direction ``a``, the last ``D/4``
the same magnitudes in direction ``a + pi/2``. The frequencies are per head, and the kernels'
cos/sin tables are per token, so on the Triton backend the rotation runs in PyTorch before the
plain flash kernel (autograd carries the gradient to the frequencies).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from course_lib.checks import check_choice, check_float_tensor
from course_lib.encodings.rope import rotate_pairs
from course_lib.encodings.rope_2d import check_axial_head_dim, check_coords
from course_lib.kernel_hooks import PAIR_LAYOUTS
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register

__all__ = [
    "rope_mixed_initial_frequencies",
    "rope_mixed_angles",
    "apply_rope_mixed",
    "rope_mixed_transform",
    "check_rope_mixed_params",
    "RoPEMixedAttention",
]

ROPE_MIXED_BASE = 10.0


def rope_mixed_initial_frequencies(
    head_dim: int,
    num_heads: int,
    base: float = ROPE_MIXED_BASE,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The authors' initial frequencies ``[num_heads, 2, head_dim/2]`` (float32; axis 0 = row,
    1 = column): magnitudes ``base**(-t/(D/4))`` for ``t = 0..D/4-1``, the first ``D/4`` pairs in
    a random direction ``a`` per head, the last ``D/4`` in the direction ``a + pi/2``."""
    check_axial_head_dim(head_dim)
    quarter = head_dim // 4
    magnitude = base ** (-torch.arange(quarter, dtype=torch.float64) / quarter)  # [D/4]
    direction = torch.rand(num_heads, 1, generator=generator, dtype=torch.float64) * 2 * math.pi
    both = torch.cat(
        (direction.expand(-1, quarter), direction.expand(-1, quarter) + math.pi / 2), 1
    )
    magnitude = torch.cat((magnitude, magnitude))  # [D/2]
    return torch.stack((magnitude * both.sin(), magnitude * both.cos()), dim=1).float()


def rope_mixed_angles(coords: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """``angle[..., h, p, t] = row(p) f[h, 0, t] + col(p) f[h, 1, t]``.

    ``coords``: ``[seq, 2]`` or ``[batch, seq, 2]``; ``frequencies``: ``[heads, 2, D/2]``.
    Returns ``[heads, seq, D/2]`` or ``[batch, heads, seq, D/2]``, in float32 (float64 for
    float64 frequencies): in 16 bits an angle of a few hundred radians keeps no digit after the
    point.
    """
    frequencies = frequencies.to(torch.promote_types(frequencies.dtype, torch.float32))
    c = coords.to(frequencies.dtype)
    if c.dim() == 3:
        c = c[:, None]  # [batch, 1, seq, 2]: the same for every head
    return c @ frequencies  # [..., heads, seq, 2] @ [heads, 2, D/2] -> [..., heads, seq, D/2]


def apply_rope_mixed(
    x: torch.Tensor,
    coords: torch.Tensor,
    frequencies: torch.Tensor,
    *,
    style: str = "interleaved",
) -> torch.Tensor:
    """RoPE-Mixed of ``x`` ``[batch, heads, seq, head_dim]`` (or ``[heads, seq, head_dim]``);
    returns a tensor like ``x``.

    ``coords``: the (row, column) of every token, ``[seq, 2]`` or ``[batch, seq, 2]``.
    ``frequencies``: ``[heads, 2, head_dim/2]``, pair ``t`` of head ``h`` turns by
    ``row f[h, 0, t] + col f[h, 1, t]``. ``style``: the channels of pair ``t``, ``(2t, 2t+1)``
    (interleaved) or ``(t, t + D/2)`` (half). Computed in float32 (float64 for float64 inputs).
    """
    check_choice("RoPE style", style, PAIR_LAYOUTS)
    if x.dim() not in (3, 4):
        raise ValueError(
            f"x must be [batch, heads, seq, head_dim] or [heads, seq, head_dim], got {tuple(x.shape)}"
        )
    heads, seq, dim = x.shape[-3], x.shape[-2], x.shape[-1]
    check_axial_head_dim(dim)
    check_coords(coords, seq)
    check_float_tensor(frequencies, "frequencies", "[heads, 2, head_dim/2]", x.device,
                       shape=(heads, 2, dim // 2))  # fmt: skip
    if coords.device != x.device:
        raise ValueError(f"coords are on {coords.device} but x is on {x.device}")
    if coords.dim() == 3 and (x.dim() != 4 or coords.shape[0] not in (1, x.shape[0])):
        raise ValueError(
            "coords [batch, seq, 2] need x [batch, heads, seq, head_dim] with the same batch "
            f"(or a batch of 1); got coords {tuple(coords.shape)}, x {tuple(x.shape)}"
        )
    dt = torch.float64 if torch.float64 in (x.dtype, frequencies.dtype) else torch.float32
    angles = rope_mixed_angles(coords, frequencies.to(dt))
    return rotate_pairs(x.to(dt), angles.cos(), angles.sin(), style).to(x.dtype)


# -- hooks of the registry record ----------------------------------------------------------------
def rope_mixed_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """rotates pair t of head h by row f[h,0,t] + col f[h,1,t], learned frequencies (RoPE-Mixed)"""
    return apply_rope_mixed(x, positions, params["frequencies"], style=params["style"])


def check_rope_mixed_params(
    params: dict, *, heads: int, head_dim: int, device, positions=None, **call
) -> None:
    """``frequencies``: finite floating ``[heads, 2, head_dim/2]`` on the device of q;
    ``style`` in ``PAIR_LAYOUTS``; ``head_dim`` a multiple of 4."""
    check_choice("RoPE style", params["style"], PAIR_LAYOUTS)
    check_axial_head_dim(head_dim)
    check_float_tensor(params["frequencies"], "frequencies", "[heads, 2, head_dim/2]", device,
                       shape=(heads, 2, head_dim // 2))  # fmt: skip


class RoPEMixedAttention(PositionalSelfAttention):
    """RoPE-Mixed on q and k: learned frequencies ``[heads, 2, head_dim/2]`` per layer
    (interleaved pairs), initialised as the authors' code does (base 10, a random direction per
    head). ``forward(..., position_ids=...)`` needs the (row, column) of every token, ``[seq, 2]``
    or ``[batch, seq, 2]``."""

    encoding = "rope_mixed"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        check_axial_head_dim(self.head_dim)
        self.frequencies = nn.Parameter(rope_mixed_initial_frequencies(self.head_dim, num_heads))

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"frequencies": self.frequencies}


register(
    Encoding(
        name="rope_mixed",
        chapter="09_two_dimensions",
        summary="RoPE-Mixed: each channel pair turns with a learned mix of the row and the column",
        module=RoPEMixedAttention,
        color="#9edae5",
        qk_transform=rope_mixed_transform,
        params={"frequencies": REQUIRED, "style": "interleaved"},
        check_params=check_rope_mixed_params,
        relative=True,
        learnable=True,
        position_dims=2,
    )
)
