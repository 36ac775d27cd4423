"""ComRoPE (Yu et al. 2025): Lie rotations whose generators commute, so the score is relative
(chapter 09).

ComRoPE's theorem: for ``R(p) = matrix_exp(sum_i p_i A_i)`` with skew-symmetric ``A_i``,
``R(p)^T R(q) = R(q - p)`` for all ``p, q`` exactly when ``A_i A_j = A_j A_i`` for all ``i, j``.
Then ``(R(p) x)^T (R(q) y) = x^T R(q - p) y``: the score depends on ``q - p`` only.

The course builds commuting generators from a shared eigenbasis: per head, an orthogonal
``Q = matrix_exp(skew(basis))`` ``[b, b]`` and, for each coordinate ``i`` and each of the ``b/2``
planes ``j`` of the block, an angle ``a_ij``::

    A_i = Q  blockdiag_j(a_ij J)  Q^T,     J = [[0, -1], [1, 0]]

Every ``A_i`` is a rotation speed on the same ``b/2`` planes, so they commute exactly (the
matrices between ``Q`` and ``Q^T`` are block-diagonal with multiples of ``J`` on the same blocks).
The rotation is then the block Lie rotation of :mod:`.liere` (``matrix_exp``, blocks of ``b``
channels scaled by ``w_k = base**(-k/m)``). Conversely every commuting family of skew-symmetric
matrices has this form (they can be brought to 2 x 2 blocks by one orthogonal ``Q``), so this is
ComRoPE in general, not a special case: RoPE-Mixed (learned frequencies mixing both axes) seen
in the basis ``Q``.

Computed at RoPE's cost (:func:`comrope_rotation`). Write ``P_i = blockdiag_j(a_ij J)``. Since
``Q`` is orthogonal, ``(Q M Q^T)^r = Q M^r Q^T`` for every power ``r``, so the exponential series
gives, for block ``k`` at position ``p``::

    matrix_exp(w_k sum_i p_i A_i) = Q matrix_exp(w_k sum_i p_i P_i) Q^T
                                  = Q blockdiag_j(rot(theta_kj(p))) Q^T,
    theta_kj(p) = w_k sum_i p_i a_ij,
    rot(t) = matrix_exp(t J) = [[cos t, -sin t], [sin t, cos t]]

(the ``P_i`` share their ``2 x 2`` blocks, and the exponential of a block-diagonal matrix is
taken block by block). So ``R(p) x = Q rot(theta(p)) Q^T x``: turn each block into the basis
``Q`` (one ``b x b`` product per token), rotate channel pairs ``(2t, 2t+1)``, ``t = k b/2 + j``,
by the angles ``theta_kj(p)`` exactly as RoPE does, and turn back with ``Q``. No ``matrix_exp``
per token: one per head (``Q``), and the angles are linear in the position. In a score,
``(R(p) q)^T (R(p') k) = rot(theta(p)) Q^T q . rot(theta(p')) Q^T k`` (``Q`` cancels), which is
the RoPE form of Yu et al. 2025's relative score. The transform still returns ``R(p) x`` (with
``Q`` applied back), the same vectors as the exponential, so nothing downstream changes.

The angles are learned (``angles``, ``basis``), and the kernels' cos/sin tables
(:class:`course_lib.kernel_hooks.QKTables`) are constants that no gradient flows into: on the
Triton backend the rotation runs in PyTorch with autograd, as RoPE-Mixed's does, before the plain
flash kernel.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from course_lib.checks import check_floating_input, is_integer
from course_lib.encodings.liere import (
    LIERE_BLOCK_SIZE,
    apply_blocks,
    block_scales,
    check_block_base,
    distinct_positions,
    gather_positions,
    skew_part,
)
from course_lib.encodings.rope import rotate_pairs
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register

__all__ = [
    "plane_generators",
    "comrope_generators",
    "comrope_rotation",
    "comrope_transform",
    "check_comrope_params",
    "ComRoPEAttention",
]


def plane_generators(angles: torch.Tensor) -> torch.Tensor:
    """``blockdiag_j(a_j J)``: ``angles`` ``[..., b/2] -> [..., b, b]``, ``J = [[0, -1], [1, 0]]``
    on channels ``(2j, 2j+1)``: a rotation speed ``a_j`` in plane ``j``."""
    half = angles.shape[-1]
    size = 2 * half
    units = torch.zeros(half, size, size, dtype=angles.dtype, device=angles.device)
    j = torch.arange(half)
    units[j, 2 * j + 1, 2 * j] = 1.0
    units[j, 2 * j, 2 * j + 1] = -1.0
    return torch.einsum("...j,jab->...ab", angles, units)


def comrope_generators(basis: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Commuting skew-symmetric generators ``A_i = Q blockdiag_j(a_ij J) Q^T``.

    ``basis``: ``[..., b, b]`` (any real matrix; ``Q = matrix_exp(skew(basis))`` is orthogonal).
    ``angles``: ``[..., n, b/2]``, one speed per coordinate ``i`` and plane ``j``.
    Returns ``[..., n, b, b]`` in float32 (float64 if an input is); ``A_i A_k = A_k A_i`` for
    all ``i, k`` up to rounding.
    """
    if not (isinstance(basis, torch.Tensor) and isinstance(angles, torch.Tensor)):
        raise TypeError("basis and angles must be torch tensors")
    if not (basis.is_floating_point() and angles.is_floating_point()):
        raise TypeError(
            f"basis and angles must be floating point, got {basis.dtype}, {angles.dtype}"
        )
    if basis.dim() < 2 or basis.shape[-1] != basis.shape[-2] or basis.shape[-1] % 2:
        raise ValueError(
            f"basis must be square [..., b, b] with an even b (b/2 planes), got {tuple(basis.shape)}"
        )
    b = basis.shape[-1]
    if angles.dim() < 2 or angles.shape[-1] != b // 2:
        raise ValueError(
            f"angles must be [..., n, b/2] = [..., n, {b // 2}] (one speed per coordinate and "
            f"plane of the {b} x {b} basis), got {tuple(angles.shape)}"
        )
    # float32 (float64 for float64): matrix_exp in float16 gives NaN
    dt = torch.float64 if torch.float64 in (basis.dtype, angles.dtype) else torch.float32
    basis, angles = basis.to(dt), angles.to(dt)
    q = torch.linalg.matrix_exp(skew_part(basis))[..., None, :, :]  # [..., 1, b, b]
    return q @ plane_generators(angles) @ q.transpose(-1, -2)  # [..., n, b, b]


def comrope_rotation(
    x: torch.Tensor,
    coords: torch.Tensor,
    basis: torch.Tensor,
    angles: torch.Tensor,
    *,
    base: float = 100.0,
) -> torch.Tensor:
    """ComRoPE's rotation of ``x`` ``[batch, heads, seq, D]`` at RoPE's cost: the same function
    as ``apply_block_rotation(x, coords, comrope_generators(basis, angles), base=base)``.

    Block ``k`` of ``b`` channels at position ``p`` is ``Q rot_j(w_k sum_i p_i a_ij) Q^T`` times
    the block: ``Q^T`` once per token (a ``b x b`` product), RoPE's pair rotation by the angles
    ``w_k sum_i p_i a_ij`` (interleaved pairs, pair ``t = k b/2 + j``), ``Q`` back. ``coords``
    ``[seq, n]`` or ``[batch, seq, n]``; ``basis`` ``[heads, b, b]``; ``angles`` ``[heads, n,
    b/2]``. Float32 (float64 if an input is); autograd reaches ``basis`` and ``angles``.
    """
    check_floating_input(x, "x", " (a rotation of real channels: convert with x.float())")
    base = check_block_base(base)
    b = basis.shape[-1]
    if x.dim() != 4 or basis.shape != (x.shape[1], b, b) or x.shape[-1] % b:
        raise ValueError(
            f"x [batch, heads, seq, head_dim] = {tuple(x.shape)} needs basis [heads, b, b] with b "
            f"dividing head_dim; got basis {tuple(basis.shape)}"
        )
    if angles.shape != (x.shape[1], coords.shape[-1], b // 2) or coords.dim() not in (2, 3):
        raise ValueError(
            f"angles must be [heads, n, b/2] = [{x.shape[1]}, {coords.shape[-1]}, {b // 2}] and "
            f"coords [seq, n] or [batch, seq, n]; got {tuple(angles.shape)}, {tuple(coords.shape)}"
        )
    dt = torch.float64 if torch.float64 in (x.dtype, basis.dtype, angles.dtype) else torch.float32
    m = x.shape[-1] // b
    q = torch.linalg.matrix_exp(skew_part(basis.to(dt)))[:, None, None]  # [heads, 1, 1, b, b]
    blocks = x.to(dt).reshape(*x.shape[:-1], m, b)  # [batch, heads, seq, m, b]
    turned = apply_blocks(q.transpose(-1, -2), blocks)  # Q^T per block
    # angles per distinct position and head, gathered: [.., heads, seq, m, b/2] -> D/2 pairs
    w = block_scales(m, base).to(device=x.device, dtype=dt)  # [m]
    unique, inverse = distinct_positions(coords)  # [U, n]
    speed = unique.to(dt) @ angles.to(dt)  # [heads, U, b/2]: sum_i p_i a_ij
    theta = (speed[:, :, None, :] * w[:, None]).flatten(-2)  # [heads, U, D/2]
    theta = gather_positions(theta, inverse, coords, per_head=True)
    turned = rotate_pairs(turned.reshape(x.shape), theta.cos(), theta.sin(), "interleaved")
    out = apply_blocks(q, turned.reshape(blocks.shape))  # Q back
    return out.reshape(x.shape).to(x.dtype)


# -- hooks of the registry record ----------------------------------------------------------------
def comrope_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """rotates each block of b channels by matrix_exp(w_k sum_i p_i A_i), commuting A_i"""
    return comrope_rotation(x, positions, params["basis"], params["angles"], base=params["base"])


def check_comrope_params(
    params: dict, *, heads: int, head_dim: int, device, positions=None, **call
) -> None:
    """``basis`` floating ``[heads, b, b]`` with ``b`` even and dividing ``head_dim``;
    ``angles`` floating ``[heads, 2, b/2]``; both on the device of q; ``base`` > 0."""
    check_block_base(params["base"])
    basis, angles = params["basis"], params["angles"]
    for name, t in (("basis", basis), ("angles", angles)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor, got "
                f"{getattr(t, 'dtype', type(t).__name__)}"
            )
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")
    if basis.dim() != 3 or basis.shape[0] != heads or basis.shape[1] != basis.shape[2]:
        raise ValueError(
            f"basis must be square matrices, one per head: [heads, b, b] = [{heads}, b, b]; "
            f"got {tuple(basis.shape)}"
        )
    b = basis.shape[-1]
    if b % 2 or head_dim % b:
        raise ValueError(
            f"the basis' block size b={b} must be even (b/2 planes) and divide head_dim={head_dim}"
        )
    if tuple(angles.shape) != (heads, 2, b // 2):
        raise ValueError(
            f"angles must be [heads, 2, b/2] = [{heads}, 2, {b // 2}] (one speed per head, "
            f"coordinate and plane), got {tuple(angles.shape)}"
        )


class ComRoPEAttention(PositionalSelfAttention):
    """ComRoPE on q and k: per head a learned basis ``[b, b]`` and angles ``[2, b/2]``, ``b = 4``.

    Initialised with a random basis (normal entries of std 0.5) and, in every plane, a speed of
    1 in a random direction of the (row, column) plane, as RoPE-Mixed starts. ``forward(...,
    position_ids=...)`` needs the (row, column) of every token, ``[seq, 2]`` or ``[batch, seq, 2]``.
    """

    encoding = "comrope"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        block_size: int = LIERE_BLOCK_SIZE,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        if (
            not is_integer(block_size)
            or block_size < 2
            or block_size % 2
            or self.head_dim % block_size
        ):
            raise ValueError(
                f"block_size must be an even integer >= 2 that divides head_dim={self.head_dim}, "
                f"got {block_size!r}"
            )
        self.block_size = block_size
        self.basis = nn.Parameter(torch.randn(num_heads, block_size, block_size) * 0.5)
        direction = torch.rand(num_heads, block_size // 2) * (2 * math.pi)
        self.angles = nn.Parameter(torch.stack((direction.cos(), direction.sin()), dim=1))

    def generators(self) -> torch.Tensor:
        """The commuting generators ``[heads, 2, b, b]`` of the current parameters."""
        return comrope_generators(self.basis, self.angles)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"basis": self.basis, "angles": self.angles}


register(
    Encoding(
        name="comrope",
        chapter="09_two_dimensions",
        summary="ComRoPE: a Lie rotation with commuting learned generators (relative, blocks of 4)",
        module=ComRoPEAttention,
        color="#393b79",
        qk_transform=comrope_transform,
        params={"basis": REQUIRED, "angles": REQUIRED, "base": 100.0},
        check_params=check_comrope_params,
        relative=True,
        learnable=True,
        position_dims=2,
    )
)
