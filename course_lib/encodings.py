"""The position encodings of the course, each written from its formula in plain PyTorch.

Everything here is vectorised over positions and keys (no Python loops over them).
Shapes: ``x`` is ``[..., seq, head_dim]`` (usually ``[batch, heads, seq, head_dim]``);
``position_ids`` are integer ``[seq]`` or ``[batch, seq]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.checks import check_choice

__all__ = [
    "ROPE_STYLES",
    "sinusoidal_table",
    "sinusoidal_embedding",
    "sinusoidal_shift_matrix",
    "rope_inverse_frequencies",
    "rope_angles",
    "apply_rope",
    "rope_half_permutation",
    "exposb_amplitude",
    "exposb_band_gain",
    "exposb_distance_factor",
    "exposb_distance_bias",
    "apply_exposb",
    "stick_breaking_weights",
]

ROPE_STYLES = ("interleaved", "half")


# --------------------------------------------------------------------------------------------
# Sinusoidal (Vaswani et al. 2017)
# --------------------------------------------------------------------------------------------
def _check_even_dim(dim: int, what: str) -> None:
    if not isinstance(dim, int) or dim <= 0 or dim % 2:
        raise ValueError(
            f"{what} must be a positive even integer (channels come in pairs), got {dim}"
        )


def sinusoidal_embedding(
    position_ids: torch.Tensor, dim: int, base: float = 10000.0
) -> torch.Tensor:
    """Sinusoidal codes of arbitrary positions: ``[...] -> [..., dim]`` (float32).

    ``PE[p, 2i] = sin(p / base**(2i/dim))``, ``PE[p, 2i+1] = cos(p / base**(2i/dim))``.
    Computed in float64 and rounded once, so large positions stay accurate.
    """
    _check_even_dim(dim, "dim")
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
    if not isinstance(num_positions, int) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative integer, got {num_positions}")
    return sinusoidal_embedding(torch.arange(num_positions), dim, base)


def sinusoidal_shift_matrix(shift: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed ``[dim, dim]`` matrix ``M_k`` with ``PE[p + k] = M_k @ PE[p]`` for every ``p``.

    Block-diagonal: each (sin, cos) pair with frequency w is rotated by the angle ``k*w``,
    ``sin(a + kw) = sin a cos kw + cos a sin kw``, ``cos(a + kw) = cos a cos kw - sin a sin kw``.
    It depends on the offset ``k`` only, never on ``p``.
    """
    _check_even_dim(dim, "dim")
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    c, s = torch.cos(shift * inv_freq), torch.sin(shift * inv_freq)
    blocks = torch.stack((torch.stack((c, s), -1), torch.stack((-s, c), -1)), -2)  # [dim/2, 2, 2]
    return torch.block_diag(*blocks).to(torch.float32)


# --------------------------------------------------------------------------------------------
# RoPE (Su et al. 2021, RoFormer)
# --------------------------------------------------------------------------------------------
def rope_inverse_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``w_t = base**(-2t/head_dim)`` for pairs ``t = 0..head_dim/2-1`` (float32)."""
    _check_even_dim(head_dim, "head_dim for RoPE")
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


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
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
    _check_even_dim(x.shape[-1], "head_dim for RoPE")
    angles = _angles_for(x, position_ids, base)
    dt = _compute_dtype(x)
    cos, sin = angles.cos().to(dt), angles.sin().to(dt)
    return _rotate_pairs(x.to(dt), cos, sin, style).to(x.dtype)


def rope_half_permutation(head_dim: int) -> torch.Tensor:
    """Channel order that turns the interleaved layout into the half layout.

    ``apply_rope(x, p, style="interleaved")[..., perm] == apply_rope(x[..., perm], p, style="half")``
    with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]``.
    """
    _check_even_dim(head_dim, "head_dim")
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


# --------------------------------------------------------------------------------------------
# ExpoSB (the implementation report's three mechanisms)
# --------------------------------------------------------------------------------------------
def exposb_amplitude(position_ids: torch.Tensor) -> torch.Tensor:
    """Mechanism 1, the amplitude of the rotation: ``a(m) = 1 + 0.2 * exp(-0.001 * m)`` (float32)."""
    return 1.0 + 0.2 * torch.exp(-0.001 * position_ids.to(torch.float32))


def exposb_band_gain(head_dim: int) -> torch.Tensor:
    """Mechanism 2, the band-pass gain over channel ``d`` of ``head_dim`` ``D``: ``[D]`` float32.

    ``g(d) = 0.8 + 0.4 * exp(-(d - D/4)**2 / (2 * (D/8)**2))``.
    """
    d = torch.arange(head_dim, dtype=torch.float32)
    center, width = head_dim / 4, head_dim / 8
    return 0.8 + 0.4 * torch.exp(-((d - center) ** 2) / (2 * width**2))


def exposb_distance_factor(distance: torch.Tensor) -> torch.Tensor:
    """Mechanism 3, the distance factor ``f(|m-n|) = 0.7 + 0.3 * exp(-0.005 * |m-n|)``."""
    return 0.7 + 0.3 * torch.exp(-0.005 * distance.to(torch.float32).abs())


def exposb_distance_bias(
    query_positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """``log f(|m-n|)``, added to the logits: ``[..., seq_q]``, ``[..., seq_k] -> [..., seq_q, seq_k]``.

    Adding ``log f`` to the logits multiplies each softmax weight by ``f`` and renormalises the
    row (the course's reading of the report's "attention x factor").
    """
    distance = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)
    return torch.log(exposb_distance_factor(distance))


def apply_exposb(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    base: float = 10000.0,
    style: str = "interleaved",
) -> torch.Tensor:
    """ExpoSB's transform of q or k ``[..., seq, head_dim]``: ``g * a(m) * RoPE_m(x)``.

    The report scales cos and sin by ``a(m)`` (so the whole rotated vector by ``a(m)``), then
    multiplies channel ``d`` by the band-pass gain ``g(d)``.
    """
    rotated = apply_rope(x, position_ids, base=base, style=style)
    dt = _compute_dtype(x)
    amp = exposb_amplitude(position_ids).to(dt).unsqueeze(-1)  # [..., seq, 1]
    if position_ids.dim() == 2 and x.dim() == 4:
        amp = amp.unsqueeze(1)
    gain = exposb_band_gain(x.shape[-1]).to(device=x.device, dtype=dt)
    return (rotated.to(dt) * amp * gain).to(x.dtype)


# --------------------------------------------------------------------------------------------
# Stick-breaking (Tan et al. 2024, "Scaling Stick-Breaking Attention")
# --------------------------------------------------------------------------------------------
def _exclusive_suffix_sum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{l > j} x[..., l]`` (shifted, so no subtraction and no cancellation)."""
    suffix = x.flip(-1).cumsum(-1).flip(-1)
    return F.pad(suffix[..., 1:], (0, 1))


def _exclusive_prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{l < j} x[..., l]``."""
    return F.pad(x.cumsum(-1)[..., :-1], (1, 0))


def _one_stick(z: torch.Tensor, allowed: torch.Tensor, nearest_is_last: bool) -> torch.Tensor:
    """Weights of one stick broken from the nearest allowed key outward.

    ``log A_j = logsigmoid(z_j) - sum_{allowed l between j and the query} softplus(z_l)``.
    """
    z = torch.where(allowed, z, torch.zeros((), dtype=z.dtype, device=z.device))
    log_keep = torch.where(allowed, F.softplus(z), torch.zeros((), dtype=z.dtype, device=z.device))
    between = (
        _exclusive_suffix_sum(log_keep) if nearest_is_last else _exclusive_prefix_sum(log_keep)
    )
    log_weights = F.logsigmoid(z) - between
    return torch.where(allowed, log_weights.exp(), torch.zeros((), dtype=z.dtype, device=z.device))


def stick_breaking_weights(
    logits: torch.Tensor,
    *,
    causal: bool = True,
    include_self: bool = False,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stick-breaking attention weights from logits ``[..., seq_q, seq_k]``; same shape out.

    Causal: ``A[i, j] = sigmoid(z[i, j]) * prod_{j < l < i} (1 - sigmoid(z[i, l]))`` for ``j < i``
    (``j <= i`` with ``include_self``): the nearest key breaks off its share of the stick first.
    Bidirectional (``causal=False``): one such stick over the keys left of ``i`` and one over the
    keys right of it, each broken from the nearest key outward and each given half the mass.
    Computed in log space (``log(1 - sigmoid(z)) = -softplus(z)``), so logits of any magnitude stay
    finite. Disallowed entries (the other side, or ``mask`` False, e.g. padded keys) get exactly 0
    and do not break the stick. Queries are the last ``seq_q`` of the ``seq_k`` positions.
    Each row sums to at most 1; what is left over is not returned.
    """
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    n_q, n_k = logits.shape[-2], logits.shape[-1]
    if n_q > n_k:
        raise ValueError(f"seq_q ({n_q}) must be <= seq_k ({n_k})")
    query_at = torch.arange(n_q, device=logits.device).unsqueeze(-1) + (n_k - n_q)
    key_at = torch.arange(n_k, device=logits.device)
    left = key_at <= query_at if include_self else key_at < query_at
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be bool (True = allowed), got {mask.dtype}")
        left = left & mask
    left = left.expand(logits.shape)
    weights = _one_stick(logits, left, nearest_is_last=True)
    if causal:
        return weights
    right = key_at >= query_at if include_self else key_at > query_at
    if mask is not None:
        right = right & mask
    right = right.expand(logits.shape)
    return 0.5 * (weights + _one_stick(logits, right, nearest_is_last=False))
