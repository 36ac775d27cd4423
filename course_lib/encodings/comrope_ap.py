"""ComRoPE-AP (Yu et al. 2025, "ComRoPE: Scalable and Robust Rotary Position Embedding
Parameterized by Trainable Commuting Angle Matrices", §4): the axial-partition solution of the
RoPE equation (chapter 09).

A head of ``D`` channels is ``m = D / b`` blocks of ``b`` channels. ComRoPE rotates a token at
coordinates ``p = (p_1, ..., p_N)`` by ``R(p) = exp(sum_i p_i A_i)`` with block-diagonal angle
matrices ``A_i = diag(B_i1, ..., B_im)``; it is relative exactly when the ``A_i`` commute (the
paper's theorem). The axial-partition choice gives every block to one axis::

    B_ij = P_j - P_j^T   if j = i (mod N),     B_ij = 0   otherwise

with a learned ``b x b`` matrix ``P_j`` per block (and head). Two axes never turn the same
block, so the ``A_i`` commute and the score depends on the offset ``p_j - p_i`` only. Within its
block each axis turns a learned rotation of ``b`` channels, not a fixed pair rotation: with
``b = 2`` this is axial RoPE with learned frequencies.

Course conventions, the same as its LieRE (:mod:`.liere`): positions are integer patch
coordinates (the paper scales them to ``[0, 1]``), and block ``j`` is scaled by the fixed
``w_j = base**(-j/m)`` (``base = 100``), so the blocks start at a ladder of speeds as RoPE's
pairs do. ``w_j P_j`` is again a learned matrix, so the scale changes the starting point, not
the family. For image patches ``N = 2``: even blocks turn with the row, odd ones with the
column. The rotation is dense per block, so on the Triton backend it runs in PyTorch before the
plain flash kernel.

Computed axis by axis (:func:`~course_lib.encodings.comrope_ap.apply_block_axes`): a block's
angle matrices are multiples of one skew matrix ``S_j``, which commute, so ``matrix_exp(w_j
sum_i c_ij p_i S_j) = prod_i matrix_exp(w_j c_ij p_i S_j)``; the factor of axis ``i`` depends on
``p_i`` alone, so ``matrix_exp`` runs once per distinct value of each coordinate (a 64 x 64 grid:
64 per axis and block, not 4096 positions), and each factor is gathered and applied as one
batched product.
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.checks import check_float_tensor, is_integer
from course_lib.encodings.liere import (
    LIERE_BLOCK_SIZE,
    apply_blocks,
    block_scales,
    check_block_base,
    distinct_positions,
    gather_positions,
    lie_rotation,
    skew_part,
)
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register

__all__ = [
    "apply_block_generators",
    "apply_block_axes",
    "axis_owners",
    "comrope_ap_generators",
    "comrope_ap_transform",
    "check_comrope_ap_params",
    "check_block_count",
    "ComRoPEAPAttention",
]

AXES = 2  # (row, column)


def check_block_count(head_dim: int, block_size: int, what: str) -> None:
    """``block_size`` an integer >= 2 dividing ``head_dim`` into a whole number of blocks per
    axis (``head_dim / block_size`` a multiple of 2)."""
    if (
        not is_integer(block_size)
        or block_size < 2
        or head_dim % block_size
        or (head_dim // block_size) % AXES
    ):
        raise ValueError(
            f"{what}: the block size b={block_size!r} must be an integer >= 2 that cuts "
            f"head_dim={head_dim} into an even number of blocks (as many for the row as for the "
            f"column); valid: {[b for b in range(2, head_dim + 1) if head_dim % (AXES * b) == 0]}"
        )


def apply_block_generators(
    x: torch.Tensor, coords: torch.Tensor, generators: torch.Tensor, *, base: float = 100.0
) -> torch.Tensor:
    """Rotate block ``j`` of ``x`` by ``matrix_exp(w_j sum_i p_i A_ij)``, one generator per
    block: ``x`` ``[batch, heads, seq, D]``; ``coords`` ``[seq, n]`` or ``[batch, seq, n]``;
    ``generators`` ``[heads, m, n, b, b]`` (only their skew parts count), ``m * b = D``;
    ``w_j = base**(-j/m)``. Returns a tensor like ``x``."""
    if x.dim() != 4:
        raise ValueError(f"x must be [batch, heads, seq, head_dim], got {tuple(x.shape)}")
    if (
        generators.dim() != 5
        or generators.shape[0] != x.shape[1]
        or generators.shape[1] * generators.shape[-1] != x.shape[-1]
    ):
        raise ValueError(
            f"generators must be [heads, blocks, axes, b, b] with heads = {x.shape[1]} and "
            f"blocks * b = head_dim = {x.shape[-1]}; got {tuple(generators.shape)}"
        )
    m, n, b = generators.shape[1], generators.shape[2], generators.shape[-1]
    if coords.dim() not in (2, 3) or coords.shape[-1] != n or coords.shape[-2] != x.shape[-2]:
        raise ValueError(
            f"coords must be [seq, {n}] or [batch, seq, {n}] with seq = {x.shape[-2]}, got "
            f"{tuple(coords.shape)}"
        )
    dt = torch.float64 if torch.float64 in (x.dtype, generators.dtype) else torch.float32
    w = block_scales(m, base).to(device=x.device, dtype=dt)  # [m]
    # one matrix_exp per distinct position, head and block, gathered to the tokens
    unique, inverse = distinct_positions(coords)  # [U, n]
    scaled = unique.to(dt)[:, None, :] * w[:, None]  # [U, m, n]
    rotation = lie_rotation(scaled, generators.to(dt)[:, None])  # [heads, U, m, b, b]
    rotation = gather_positions(rotation, inverse, coords, per_head=True)
    blocks = x.to(dt).reshape(*x.shape[:-1], m, b)  # [batch, heads, seq, m, b]
    return apply_blocks(rotation, blocks).reshape(x.shape).to(x.dtype)


def apply_block_axes(
    x: torch.Tensor,
    coords: torch.Tensor,
    skews: torch.Tensor,
    speeds: torch.Tensor,
    *,
    base: float = 100.0,
) -> torch.Tensor:
    """Rotate block ``j`` of ``x`` by ``matrix_exp(w_j (sum_i speeds[i, j] p_i) S_j)``, one
    skew-symmetric matrix ``S_j`` per head and block: ``x`` ``[batch, heads, seq, D]``;
    ``coords`` ``[seq, n]`` or ``[batch, seq, n]``; ``skews`` ``[heads, m, b, b]`` (used as
    given: pass skew-symmetric matrices); ``speeds`` ``[n, m]``; ``w_j = base**(-j/m)``.

    The same function as :func:`apply_block_generators` with the generators ``speeds[i, j]
    S_j``, computed axis by axis: multiples of one matrix commute, so ``matrix_exp(w_j sum_i
    speeds[i, j] p_i S_j) = prod_i matrix_exp(w_j speeds[i, j] p_i S_j)``, and the factor of axis
    ``i`` depends on ``p_i`` alone: one ``matrix_exp`` per distinct value of each coordinate
    (a 64 x 64 grid: 64 per axis, not 4096 positions), gathered, one batched product per axis.
    """
    if x.dim() != 4 or skews.dim() != 4 or skews.shape[0] != x.shape[1]:
        raise ValueError(
            f"x must be [batch, heads, seq, head_dim] and skews [heads, m, b, b]; got "
            f"{tuple(x.shape)}, {tuple(skews.shape)}"
        )
    m, b = skews.shape[1], skews.shape[-1]
    n = coords.shape[-1]
    if m * b != x.shape[-1] or speeds.shape != (n, m) or coords.shape[-2] != x.shape[-2]:
        raise ValueError(
            f"skews [heads, m, b, b] need m * b = head_dim = {x.shape[-1]}, speeds [n, m] and "
            f"coords [..., seq={x.shape[-2]}, n]; got {tuple(skews.shape)}, "
            f"{tuple(speeds.shape)}, {tuple(coords.shape)}"
        )
    dt = torch.float64 if torch.float64 in (x.dtype, skews.dtype, speeds.dtype) else torch.float32
    w = block_scales(m, base).to(device=x.device, dtype=dt)  # [m]
    s = skews.to(dt)[:, None]  # [heads, 1, m, b, b]
    blocks = x.to(dt).reshape(*x.shape[:-1], m, b)  # [batch, heads, seq, m, b]
    for axis in range(n):
        values, inverse = distinct_positions(coords[..., axis : axis + 1])  # [U, 1]
        t = values.to(dt) * (w * speeds[axis].to(dt))  # [U, m]
        factor = torch.linalg.matrix_exp(t[..., None, None] * s)  # [heads, U, m, b, b]
        factor = gather_positions(factor, inverse, coords[..., axis : axis + 1], per_head=True)
        blocks = apply_blocks(factor, blocks)
    return blocks.reshape(x.shape).to(x.dtype)


def axis_owners(blocks: int, axes: int = AXES, device=None, dtype=torch.float32) -> torch.Tensor:
    """``[axes, blocks]``: 1 where block ``j`` turns with axis ``i`` (``j = i (mod axes)``)."""
    owner = torch.arange(blocks, device=device) % axes
    return (owner[None] == torch.arange(axes, device=device)[:, None]).to(dtype)


def comrope_ap_generators(blocks: torch.Tensor, axes: int = AXES) -> torch.Tensor:
    """The angle matrices of ComRoPE-AP per block: ``blocks`` ``[..., m, b, b]`` (the learned
    ``P_j``) -> ``[..., m, axes, b, b]`` with ``B_ij = P_j - P_j^T`` where ``j = i (mod axes)``
    and 0 elsewhere."""
    m = blocks.shape[-3]
    owner = torch.arange(m, device=blocks.device) % axes  # the axis of each block
    mask = (owner[:, None] == torch.arange(axes, device=blocks.device)).to(blocks.dtype)
    skew = 2 * skew_part(blocks)  # P - P^T
    return mask[:, :, None, None] * skew.unsqueeze(-3)  # [..., m, axes, b, b]


# -- hooks of the registry record ----------------------------------------------------------------
def comrope_ap_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """rotates block j by matrix_exp(w_j p_axis(j) (P_j - P_j^T)), one axis per block (ComRoPE-AP)"""
    blocks = params["blocks"]
    owners = axis_owners(blocks.shape[-3], device=blocks.device, dtype=blocks.dtype)
    return apply_block_axes(x, positions, 2 * skew_part(blocks), owners, base=params["base"])


def check_comrope_ap_params(
    params: dict, *, heads: int, head_dim: int, device, positions=None, **call
) -> None:
    """``blocks``: finite floating ``[heads, m, b, b]`` on the device of q, ``m * b = head_dim``
    with ``m`` even; ``base`` > 0."""
    check_block_base(params["base"])
    blocks = params["blocks"]
    check_float_tensor(blocks, "blocks", "[heads, m, b, b]", device)
    if blocks.dim() != 4 or blocks.shape[0] != heads or blocks.shape[-1] != blocks.shape[-2]:
        raise ValueError(
            f"blocks must be one square b x b matrix per head and block: [heads, m, b, b] = "
            f"[{heads}, m, b, b]; got {tuple(blocks.shape)}"
        )
    check_block_count(head_dim, blocks.shape[-1], "ComRoPE-AP")
    if blocks.shape[1] * blocks.shape[-1] != head_dim:
        raise ValueError(
            f"blocks: m = {blocks.shape[1]} blocks of {blocks.shape[-1]} channels must cover "
            f"head_dim={head_dim}"
        )


class ComRoPEAPAttention(PositionalSelfAttention):
    """ComRoPE-AP on q and k: a learned ``P_j`` ``[b, b]`` per head and block, ``b = 4``,
    normal entries of std ``init_std``. ``forward(..., position_ids=...)`` needs the (row,
    column) of every token, ``[seq, 2]`` or ``[batch, seq, 2]``."""

    encoding = "comrope_ap"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        block_size: int = LIERE_BLOCK_SIZE,
        init_std: float = 0.5,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        check_block_count(self.head_dim, block_size, "ComRoPEAPAttention")
        self.block_size = block_size
        m = self.head_dim // block_size
        self.blocks = nn.Parameter(torch.randn(num_heads, m, block_size, block_size) * init_std)

    def generators(self) -> torch.Tensor:
        """The angle matrices ``[heads, m, 2, b, b]`` of the current parameters."""
        return comrope_ap_generators(self.blocks)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"blocks": self.blocks}


register(
    Encoding(
        name="comrope_ap",
        chapter="09_two_dimensions",
        summary="ComRoPE-AP: each block of 4 channels turns with one axis by a learned rotation "
        "(the paper's axial partition; relative)",
        module=ComRoPEAPAttention,
        color="#6b6ecf",
        qk_transform=comrope_ap_transform,
        params={"blocks": REQUIRED, "base": 100.0},
        check_params=check_comrope_ap_params,
        relative=True,
        learnable=True,
        position_dims=2,
    )
)
