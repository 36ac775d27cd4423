"""LieRE (Ostmeier et al. 2024, "LieRE: Lie Rotational Positional Encodings"): q and k rotated
by the exponential of a learned skew-symmetric matrix that depends linearly on the position
(chapter 09).

A token at coordinates ``p = (p_1, ..., p_n)`` (for image patches ``n = 2``, (row, column)) is
rotated by::

    R(p) = matrix_exp(sum_i p_i A_i),    A_i = (G_i - G_i^T) / 2   (skew-symmetric)

``R(p)`` is orthogonal for every ``p`` (the exponential of a skew-symmetric matrix). When the
generators commute, ``R(p)^T R(q) = R(q - p)`` and the score depends on ``q - p`` only; LieRE
does not ask them to commute, so in general it does not (ComRoPE, :mod:`.comrope`, does).

The course's LieRE is block-diagonal: a head of ``D`` channels is ``m = D / b`` blocks of ``b``
channels, and block ``k`` is rotated by ``matrix_exp(w_k sum_i p_i A_i)`` with ``b x b``
generators learned per head and a fixed ladder of scales ``w_k = base**(-k/m)`` (as RoPE's
frequencies, ``base = 100``). Sharing one set of generators across the blocks of a head and
giving each block its own scale (a course decision) keeps the parameters independent of
``head_dim`` (``2 * b * b`` per head) and makes the blocks see positions at several scales from
the first step. ``b = 4`` by default: the smallest even block whose rotations need not commute
(``2 x 2`` rotations always do), at ``b`` multiply-adds per channel and token (RoPE: 2).
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.checks import check_floating_input, check_real, has_values
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register

__all__ = [
    "skew_part",
    "lie_rotation",
    "block_scales",
    "apply_block_rotation",
    "check_generators",
    "liere_transform",
    "check_liere_params",
    "LieREAttention",
    "LIERE_BLOCK_SIZE",
    "FLOAT32_EXP_NORM",
]

LIERE_BLOCK_SIZE = 4


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def check_generators(generators: torch.Tensor, what: str = "generators") -> None:
    """A floating tensor ``[..., n, b, b]``: ``n`` square matrices (one per coordinate)."""
    if not isinstance(generators, torch.Tensor) or not generators.is_floating_point():
        raise TypeError(
            f"{what} must be a floating-point tensor [..., n, b, b] (one square matrix per "
            f"coordinate), got {getattr(generators, 'dtype', type(generators).__name__)}"
        )
    if generators.dim() < 3 or generators.shape[-1] != generators.shape[-2]:
        raise ValueError(
            f"{what} must be square matrices, one per coordinate: shape [..., n, b, b]; got "
            f"{tuple(generators.shape)}"
        )


def _check_coords(coords: torch.Tensor, n: int) -> None:
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"coords must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype == torch.bool or coords.is_complex():
        raise TypeError(f"coords must hold integer or real coordinates, got {coords.dtype}")
    if coords.dim() < 1 or coords.shape[-1] != n:
        raise ValueError(
            f"coords must be [..., {n}]: one value per generator ({n} generators); got "
            f"{tuple(coords.shape)}"
        )


def skew_part(generators: torch.Tensor) -> torch.Tensor:
    """``A = (G - G^T) / 2`` over the last two axes: the skew-symmetric part (``A^T = -A``)."""
    return 0.5 * (generators - generators.transpose(-1, -2))


def lie_rotation(coords: torch.Tensor, generators: torch.Tensor) -> torch.Tensor:
    """``R(p) = matrix_exp(sum_i p_i A_i)`` with ``A_i`` the skew-symmetric part of
    ``generators[..., i, :, :]``: an orthogonal ``D x D`` matrix per token.

    ``coords``: ``[..., seq, n]`` (e.g. ``[seq, 2]``, the (row, column) of each patch), integer or
    real. ``generators``: ``[..., n, D, D]``. Leading axes broadcast (right-aligned) against
    ``coords.shape[:-1]``, so ``coords [seq, n]`` with ``generators [n, D, D]`` gives
    ``[seq, D, D]``, and ``coords [batch, 1, seq, n]`` with ``generators [heads, 1, n, D, D]``
    gives ``[batch, heads, seq, D, D]``. Float32 (float64 if either input is float64).

    The exponential is taken in float64 (then rounded to float32) once some ``sum_i p_i A_i``
    has a 1-norm above :data:`FLOAT32_EXP_NORM`: float32's scaling and squaring loses
    orthogonality in proportion to the norm (``|R^T R - I|`` about ``2e-7`` times it), so a
    large argument (coordinates of ``1e6``) would give no rotation at all.
    """
    check_generators(generators)
    _check_coords(coords, generators.shape[-3])
    try:
        torch.broadcast_shapes(coords.shape[:-1], generators.shape[:-3])
    except RuntimeError:
        raise ValueError(
            f"the leading axes of coords {tuple(coords.shape)} (all but the last, "
            f"{tuple(coords.shape[:-1])}) and of generators {tuple(generators.shape)} (all but "
            f"the last three, {tuple(generators.shape[:-3])}) must broadcast, right-aligned: e.g. "
            "coords [seq, n] with generators [n, D, D], or coords [batch, 1, seq, n] with "
            "generators [heads, 1, n, D, D]"
        ) from None
    dt = _compute_dtype(generators, coords if coords.is_floating_point() else generators)
    a = skew_part(generators.to(dt))  # [..., n, D, D]
    c = coords.to(device=a.device, dtype=dt)[..., None, None]  # [..., n, 1, 1]
    argument = (c * a).sum(-3)  # [..., D, D]
    if dt == torch.float64 or not _too_large_for_float32(argument):
        return torch.linalg.matrix_exp(argument)
    # the rotation of exactly these float32 inputs, as the float64 code computes it
    wide_a = skew_part(generators.to(device=a.device, dtype=torch.float64))
    wide = (coords.to(device=a.device, dtype=torch.float64)[..., None, None] * wide_a).sum(-3)
    return torch.linalg.matrix_exp(wide).to(dt)


#: The largest 1-norm of ``sum_i p_i A_i`` whose exponential float32 computes (about
#: ``256 * 2e-7 = 5e-5`` from orthogonal); larger ones are computed in float64.
FLOAT32_EXP_NORM = 256.0


def _too_large_for_float32(argument: torch.Tensor) -> bool:
    """Some matrix of ``argument`` ``[..., D, D]`` has a 1-norm above :data:`FLOAT32_EXP_NORM`
    (False for meta tensors and empty ones)."""
    if argument.numel() == 0 or not has_values(argument):
        return False
    norms = argument.detach().abs().sum(-2).amax(-1)  # the largest column sum of each matrix
    return bool((norms > FLOAT32_EXP_NORM).any())


def block_scales(num_blocks: int, base: float = 100.0) -> torch.Tensor:
    """``w_k = base**(-k / num_blocks)`` for blocks ``k = 0..num_blocks-1`` (float64; the
    rotation casts them to its compute dtype)."""
    return base ** (-torch.arange(num_blocks, dtype=torch.float64) / num_blocks)


def apply_block_rotation(
    x: torch.Tensor, coords: torch.Tensor, generators: torch.Tensor, *, base: float = 100.0
) -> torch.Tensor:
    """Block-diagonal Lie rotation of ``x`` ``[..., seq, D]``; returns a tensor like ``x``.

    Channels ``k*b .. k*b+b-1`` (block ``k`` of ``m = D/b``) are multiplied by
    ``matrix_exp(w_k sum_i p_i A_i)``, ``w_k = base**(-k/m)``, ``A_i`` the skew part of
    ``generators[..., i, :, :]``.

    ``coords``: ``[seq, n]`` or ``[batch, seq, n]`` (the latter with ``x``
    ``[batch, heads, seq, D]``). ``generators``: ``[n, b, b]`` (every head) or
    ``[heads, n, b, b]`` (one set per head, ``x`` ``[batch, heads, seq, D]``); ``b`` divides ``D``.
    """
    check_floating_input(x, "x", " (a rotation of real channels: convert with x.float())")
    check_generators(generators)
    base = check_block_base(base)
    n, b = generators.shape[-3], generators.shape[-1]
    seq, dim = x.shape[-2], x.shape[-1]
    _check_coords(coords, n)
    if coords.dim() not in (2, 3) or coords.shape[-2] != seq:
        raise ValueError(
            f"coords must have shape [seq, {n}] or [batch, seq, {n}] with seq={seq}; got "
            f"{tuple(coords.shape)}"
        )
    if dim % b:
        raise ValueError(
            f"the generators' blocks are {b} x {b}, which must divide head_dim={dim} (head_dim "
            f"is cut into blocks of {b} channels); use a block size in "
            f"{[s for s in range(2, dim + 1) if dim % s == 0]}"
        )
    if generators.dim() not in (3, 4):
        raise ValueError(
            f"generators must be [n, b, b] or [heads, n, b, b], got {tuple(generators.shape)}"
        )
    if generators.dim() == 4 and (x.dim() != 4 or generators.shape[0] not in (1, x.shape[1])):
        raise ValueError(
            f"generators [heads, n, b, b] = {tuple(generators.shape)} need x [batch, heads, seq, "
            f"head_dim] with the same number of heads; got x {tuple(x.shape)}"
        )
    if coords.dim() == 3 and (x.dim() != 4 or coords.shape[0] not in (1, x.shape[0])):
        raise ValueError(
            f"coords [batch, seq, {n}] need x [batch, heads, seq, head_dim] with the same batch "
            f"(or a batch of 1); got coords {tuple(coords.shape)}, x {tuple(x.shape)}"
        )
    if coords.device != x.device or generators.device != x.device:
        raise ValueError(
            f"x, coords and generators must be on one device, got {x.device}, {coords.device}, "
            f"{generators.device}"
        )
    m = dim // b
    dt = _compute_dtype(x, generators)
    w = block_scales(m, base).to(device=x.device, dtype=dt)  # [m]
    c = coords.to(dt)
    if coords.dim() == 3:
        c = c[:, None]  # [batch, 1, seq, n]: the same for every head
    scaled = c[..., None, :] * w[:, None]  # [..., seq, m, n]
    g = generators.to(dt)
    if g.dim() == 4:
        g = g[:, None, None]  # [heads, 1 (seq), 1 (block), n, b, b]
    rotation = lie_rotation(scaled, g)  # [..., seq, m, b, b]
    blocks = x.to(dt).reshape(*x.shape[:-1], m, b)  # [..., seq, m, b]
    out = (rotation @ blocks[..., None])[..., 0]  # [..., seq, m, b]
    return out.reshape(x.shape).to(x.dtype)


# -- hooks of the registry record ----------------------------------------------------------------
def liere_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """rotates each block of b channels by matrix_exp(w_k sum_i p_i A_i), learned generators A_i"""
    return apply_block_rotation(x, positions, params["generators"], base=params["base"])


def check_block_base(base) -> float:
    """The base of the block scales ``w_k = base**(-k/m)``: a finite number > 0."""
    return check_real("the block scales' base", base, above=0.0)


def check_liere_params(
    params: dict, *, heads: int, head_dim: int, device, positions=None, **call
) -> None:
    """``generators``: floating ``[heads, 2, b, b]`` (or ``[2, b, b]``) on the device of q,
    ``b`` dividing ``head_dim``; ``base`` > 0."""
    check_block_base(params["base"])
    g = params["generators"]
    check_generators(g)
    if g.dim() not in (3, 4) or g.shape[-3] != 2 or (g.dim() == 4 and g.shape[0] != heads):
        raise ValueError(
            f"generators must be [heads, 2, b, b] = [{heads}, 2, b, b] (or [2, b, b] for every "
            f"head): one b x b matrix per coordinate (row, column); got {tuple(g.shape)}"
        )
    if head_dim % g.shape[-1]:
        raise ValueError(
            f"the generators' {g.shape[-1]} x {g.shape[-1]} blocks must divide head_dim={head_dim}"
        )
    if g.device != device:
        raise ValueError(f"generators are on {g.device} but q is on {device}")


class LieREAttention(PositionalSelfAttention):
    """LieRE on q and k: learned generators ``[heads, 2, b, b]`` per layer, ``b = 4``.

    Initialised with independent normal entries of std ``init_std`` (their skew parts do not
    commute). ``forward(..., position_ids=...)`` needs the (row, column) of every token,
    ``[seq, 2]`` or ``[batch, seq, 2]``.
    """

    encoding = "liere"

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
        if not isinstance(block_size, int) or block_size < 2 or self.head_dim % block_size:
            raise ValueError(
                f"block_size must be an integer >= 2 that divides head_dim={self.head_dim}, got "
                f"{block_size!r}"
            )
        init_std = check_real(
            "init_std (the generators' initial standard deviation)", init_std, at_least=0.0
        )
        self.block_size = block_size
        self.generators = nn.Parameter(torch.randn(num_heads, 2, block_size, block_size) * init_std)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"generators": self.generators}


register(
    Encoding(
        name="liere",
        chapter="09_two_dimensions",
        summary="LieRE: q and k rotated by matrix_exp of learned skew-symmetric generators "
        "(blocks of 4)",
        module=LieREAttention,
        color="#8c6d31",
        qk_transform=liere_transform,
        params={"generators": REQUIRED, "base": 100.0},
        check_params=check_liere_params,
        relative=False,
        learnable=True,
        position_dims=2,
    )
)
