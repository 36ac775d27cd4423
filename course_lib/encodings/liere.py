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

The rotation depends on the position alone, so :func:`apply_block_rotation` computes
``matrix_exp`` once per distinct position (and head and block), whatever the batch (positions
shared by the batch: ``seq`` of them per head, not ``batch * seq``), gathers them to the tokens
and applies them as one batched product. For ``b = 4`` the exponential is taken in closed form
(:func:`skew4_exp`: a ``4 x 4`` generator is the sum of two commuting ones that square to
multiples of ``-I``), elementwise. The generators do not commute, so there is no shared
basis to rotate in (ComRoPE's shortcut, :mod:`.comrope`).
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.checks import check_floating_input, check_real, has_values, is_integer
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
    "distinct_positions",
    "gather_positions",
    "apply_blocks",
    "skew4_exp",
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
    g = generators.to(dt)
    if g.dim() == 4:
        g = g[:, None, None]  # [heads, 1 (position), 1 (block), n, b, b]
    # one matrix_exp per distinct position (per head), gathered to the tokens
    unique, inverse = distinct_positions(coords)  # [U, n], [tokens]
    scaled = unique.to(dt)[:, None, :] * w[:, None]  # [U, m, n]
    rotation = _block_exp(scaled, g)  # [(heads,) U, m, b, b]
    rotation = gather_positions(rotation, inverse, coords, per_head=generators.dim() == 4)
    blocks = x.to(dt).reshape(*x.shape[:-1], m, b)  # [..., seq, m, b]
    return apply_blocks(rotation, blocks).reshape(x.shape).to(x.dtype)


def _block_exp(scaled: torch.Tensor, generators: torch.Tensor) -> torch.Tensor:
    """``lie_rotation(scaled, generators)``; for ``4 x 4`` blocks in closed form
    (:func:`skew4_exp`), elementwise instead of a batched series."""
    if generators.shape[-1] != 4 or scaled.device.type == "meta":
        return lie_rotation(scaled, generators)
    check_generators(generators)
    _check_coords(scaled, generators.shape[-3])
    a = skew_part(generators)  # [..., n, 4, 4]
    return skew4_exp((scaled[..., None, None] * a).sum(-3))


def _cos_sinc(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos(sqrt(x))`` and ``sin(sqrt(x)) / sqrt(x)`` for ``x >= 0``, with finite gradients at
    0 (a Taylor series below ``1e-4``, where its next term is below ``1e-22``)."""
    small = x < 1e-4
    r = torch.where(small, torch.ones_like(x), x).sqrt()
    cos = torch.where(small, 1 - x / 2 + x * x / 24 - x**3 / 720, r.cos())
    sinc = torch.where(small, 1 - x / 6 + x * x / 120 - x**3 / 5040, r.sin() / r)
    return cos, sinc


def skew4_exp(s: torch.Tensor) -> torch.Tensor:
    """``matrix_exp(S)`` of skew-symmetric ``4 x 4`` matrices ``[..., 4, 4]`` in closed form (only
    the entries above the diagonal are read).

    ``S = S+ + S-`` with ``S+ = (S + *S) / 2`` and ``S- = (S - *S) / 2`` (``*S`` swaps each
    plane's entry with that of the complementary plane: ``01 <-> 23``, ``02 <-> -13``,
    ``03 <-> 12``). ``S+`` and ``S-`` commute and each squares to ``-r^2 I`` (``r^2`` the sum of
    its three independent entries squared), so ``matrix_exp(S+-) = cos(r) I + sin(r)/r S+-``
    (Rodrigues' formula, as for unit quaternions) and ``matrix_exp(S) = matrix_exp(S+)
    matrix_exp(S-)``.
    """
    a, b, c = s[..., 0, 1], s[..., 0, 2], s[..., 0, 3]
    d, e, f = s[..., 1, 2], s[..., 1, 3], s[..., 2, 3]

    def skew(x01, x02, x03, x12, x13, x23):
        z = torch.zeros_like(x01)
        rows = ((z, x01, x02, x03), (-x01, z, x12, x13), (-x02, -x12, z, x23),
                (-x03, -x13, -x23, z))  # fmt: skip
        return torch.stack([torch.stack(row, -1) for row in rows], -2)

    u1, u2, u3 = (a + f) / 2, (b - e) / 2, (c + d) / 2  # S+
    v1, v2, v3 = (a - f) / 2, (b + e) / 2, (c - d) / 2  # S-
    eye = torch.eye(4, dtype=s.dtype, device=s.device)
    cos_p, sinc_p = _cos_sinc(u1 * u1 + u2 * u2 + u3 * u3)
    cos_m, sinc_m = _cos_sinc(v1 * v1 + v2 * v2 + v3 * v3)
    plus = cos_p[..., None, None] * eye + sinc_p[..., None, None] * skew(u1, u2, u3, u3, -u2, u1)
    minus = cos_m[..., None, None] * eye + sinc_m[..., None, None] * skew(v1, v2, v3, -v3, v2, -v1)
    return plus @ minus


def distinct_positions(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``coords`` ``[..., seq, n]`` -> ``(unique [U, n], inverse [tokens])`` with
    ``unique[inverse]`` the flattened coordinates: a transform of the position alone is computed
    ``U`` times (once per distinct position, whatever the batch) and gathered. Coordinates that
    require grad, or meta tensors (shapes only), are kept as they are (``U`` = every token)."""
    flat = coords.reshape(-1, coords.shape[-1])
    if coords.requires_grad or coords.device.type == "meta":
        return flat, torch.arange(flat.shape[0], device=flat.device)
    unique, inverse = torch.unique(flat, dim=0, return_inverse=True)
    return unique, inverse.reshape(-1)


def gather_positions(
    table: torch.Tensor, inverse: torch.Tensor, coords: torch.Tensor, *, per_head: bool
) -> torch.Tensor:
    """A table ``[(heads,) U, *rest]`` of one entry per distinct position -> one per token,
    shaped to broadcast against ``x`` ``[(batch, heads,) seq, ...]``: ``[(heads,) seq, *rest]``
    for ``coords`` ``[seq, n]``, ``[batch, heads or 1, seq, *rest]`` for ``[batch, seq, n]``."""
    lead = 1 if per_head else 0
    rest = table.shape[lead + 1 :]
    tokens = table.index_select(lead, inverse)  # [(heads,) tokens, *rest]
    tokens = tokens.reshape(*table.shape[:lead], *coords.shape[:-1], *rest)
    if coords.dim() == 3:  # [(heads,) batch, seq, *rest] -> [batch, heads or 1, seq, *rest]
        tokens = tokens.movedim(0, 1) if per_head else tokens.unsqueeze(1)
    return tokens


def apply_blocks(rotation: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``rotation [..., m, b, b] @ blocks [..., m, b]`` over broadcast leading axes: one batched
    product (``einsum`` contracts without copying the rotations once per batch row)."""
    return torch.einsum("...ij,...j->...i", rotation, blocks)


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
        if not is_integer(block_size) or block_size < 2 or self.head_dim % block_size:
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
