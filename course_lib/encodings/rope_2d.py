"""Axial 2D RoPE (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer"): image
patches at (row, column), q and k rotated by both coordinates (chapter 09).

The ``D/2`` channel pairs of a head are split in two halves of ``D/4`` pairs. Pair ``t`` of the
first half turns by ``row * theta_t``, pair ``t`` of the second half by ``col * theta_t``, with
``theta_t = base**(-t / (D/4))``, ``t = 0..D/4-1`` and ``base = 100``::

    angle[p, t]       = row(p) * theta_t        (pairs 0 .. D/4-1)
    angle[p, D/4 + t] = col(p) * theta_t        (pairs D/4 .. D/2-1)

Each pair is a plain RoPE rotation, so ``R(p_i) q . R(p_j) k = q . R(p_j - p_i) k``: the score
depends on ``(row_j - row_i, col_j - col_i)`` only. The rotation is elementwise, so the fused
kernels run it from per-token cos/sin tables with no change.
"""

from __future__ import annotations

import torch

from course_lib.checks import check_choice, check_floating_input, check_real, is_integer
from course_lib.encodings.rope import rotate_pairs
from course_lib.kernel_hooks import PAIR_LAYOUTS, QKTables
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import Encoding, register

__all__ = [
    "rope_2d_frequencies",
    "rope_2d_angles",
    "apply_rope_2d",
    "rope_2d_transform",
    "rope_2d_kernel_tables",
    "check_rope_2d_params",
    "RoPE2DAttention",
]


def check_axial_head_dim(head_dim: int) -> None:
    """Axial 2D RoPE gives half the channel pairs to each axis: ``head_dim`` must be a positive
    multiple of 4 (an even number of pairs)."""
    if not is_integer(head_dim) or head_dim <= 0 or head_dim % 4:
        pairs = (
            f"{head_dim // 2} pairs"
            if is_integer(head_dim) and head_dim % 2 == 0
            else "channels that do not even form pairs"
        )
        raise ValueError(
            "axial 2D RoPE splits the channel pairs evenly between the row and the column, so "
            f"head_dim must be a positive multiple of 4 (an even number of pairs); got head_dim="
            f"{head_dim} ({pairs})"
        )


def check_coords(coords: torch.Tensor, seq: int, what: str = "coords") -> None:
    """``coords`` ``[seq, 2]`` or ``[batch, seq, 2]``, real-valued: the (row, column) of each token."""
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype == torch.bool or coords.is_complex():
        raise TypeError(
            f"{what} must hold integer or real (row, column) values, got {coords.dtype}"
        )
    if coords.dim() not in (2, 3) or coords.shape[-1] != 2 or coords.shape[-2] != seq:
        raise ValueError(
            f"{what} must have shape [seq, 2] or [batch, seq, 2] with seq={seq}, one (row, column) "
            f"per token; got {tuple(coords.shape)}"
        )


def check_rope_2d_base(base: object) -> float:
    """2D RoPE's ``base``: a finite number > 0."""
    return check_real("2D RoPE base", base, above=0.0)


def rope_2d_frequencies(head_dim: int, base: float = 100.0) -> torch.Tensor:
    """``theta_t = base**(-t / (D/4))`` for ``t = 0..D/4-1`` (float32): one set per axis."""
    check_axial_head_dim(head_dim)
    base = check_rope_2d_base(base)
    quarter = head_dim // 4
    return (base ** (-torch.arange(quarter, dtype=torch.float64) / quarter)).to(torch.float32)


def rope_2d_angles(coords: torch.Tensor, head_dim: int, base: float = 100.0) -> torch.Tensor:
    """Rotation angles of every pair, float32: ``coords [..., 2] -> [..., head_dim/2]``.

    The first ``D/4`` pairs get ``row * theta_t``, the last ``D/4`` get ``col * theta_t``.
    """
    theta = rope_2d_frequencies(head_dim, base).to(coords.device)
    c = coords.to(torch.float32)
    return torch.cat((c[..., 0:1] * theta, c[..., 1:2] * theta), dim=-1)


def apply_rope_2d(
    x: torch.Tensor, coords: torch.Tensor, *, base: float = 100.0, style: str = "interleaved"
) -> torch.Tensor:
    """Axial 2D RoPE of ``x`` ``[..., seq, head_dim]``; returns a tensor like ``x``.

    ``coords``: the (row, column) of every token, ``[seq, 2]`` or ``[batch, seq, 2]`` (the latter
    with ``x`` ``[batch, heads, seq, head_dim]``), integer or real. Pair ``t < D/4`` turns by
    ``row * base**(-t/(D/4))``, pair ``D/4 + t`` by ``col * base**(-t/(D/4))``. ``style`` picks
    which channels form pair ``t``: ``(2t, 2t+1)`` (interleaved) or ``(t, t + D/2)`` (half).
    ``head_dim`` must be a multiple of 4. Angles are float32; the rotation runs in float32
    (float64 for float64 inputs).
    """
    check_floating_input(x, "x", " (2D RoPE rotates real channel pairs: convert with x.float())")
    check_choice("RoPE style", style, PAIR_LAYOUTS)
    check_axial_head_dim(x.shape[-1])
    check_coords(coords, x.shape[-2])
    if coords.device != x.device:
        raise ValueError(f"coords are on {coords.device} but x is on {x.device}")
    if coords.dim() == 3 and (x.dim() != 4 or coords.shape[0] not in (1, x.shape[0])):
        raise ValueError(
            "coords [batch, seq, 2] need x [batch, heads, seq, head_dim] with the same batch "
            f"(or a batch of 1); got coords {tuple(coords.shape)}, x {tuple(x.shape)}"
        )
    angles = rope_2d_angles(coords, x.shape[-1], base)  # [seq, D/2] or [batch, seq, D/2]
    if coords.dim() == 3:
        angles = angles.unsqueeze(1)  # [batch, 1, seq, D/2]: the same for every head
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = angles.cos().to(dt), angles.sin().to(dt)
    return rotate_pairs(x.to(dt), cos, sin, style).to(x.dtype)


# -- hooks of the registry record ----------------------------------------------------------------
def rope_2d_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """rotates half the channel pairs by the row and half by the column (axial 2D RoPE)"""
    return apply_rope_2d(x, positions, base=params["base"], style=params["style"])


def rope_2d_kernel_tables(positions: torch.Tensor, head_dim: int, params: dict) -> QKTables:
    """The kernels' tables of :func:`rope_2d_transform`: fp32 cos/sin ``[1|batch, seq, D/2]``."""
    angles = rope_2d_angles(positions, head_dim, params["base"])
    return QKTables(angles.cos(), angles.sin(), None, params["style"])


def check_rope_2d_params(
    params: dict, *, heads: int, head_dim: int, device, positions=None, **call
) -> None:
    """``style`` in ``PAIR_LAYOUTS``, ``base`` > 0, ``head_dim`` a multiple of 4."""
    check_choice("RoPE style", params["style"], PAIR_LAYOUTS)
    params["base"] = check_rope_2d_base(params["base"])
    check_axial_head_dim(head_dim)


class RoPE2DAttention(PositionalSelfAttention):
    """Axial 2D RoPE on q and k (interleaved pairs, base 100); no parameters.

    ``forward(..., position_ids=...)`` needs the (row, column) of every token, ``[seq, 2]`` or
    ``[batch, seq, 2]``.
    """

    encoding = "rope_2d"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        check_axial_head_dim(self.head_dim)


register(
    Encoding(
        name="rope_2d",
        chapter="09_two_dimensions",
        summary="axial 2D RoPE: half the channel pairs turn with the row, half with the column",
        module=RoPE2DAttention,
        color="#17becf",
        qk_transform=rope_2d_transform,
        params={"base": 100.0, "style": "interleaved"},
        check_params=check_rope_2d_params,
        kernel_tables=rope_2d_kernel_tables,
        relative=True,
        position_dims=2,
    )
)
