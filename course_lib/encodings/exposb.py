"""ExpoSB, the implementation report's three mechanisms on top of RoPE (chapter 04).

1. amplitude ``a(m) = 1 + 0.2 exp(-0.001 m)`` scaling cos and sin;
2. band-pass gain ``g(d) = 0.8 + 0.4 exp(-(d - D/4)^2 / (2 (D/8)^2))`` over channel ``d``;
3. distance factor ``f(|m-n|) = 0.7 + 0.3 exp(-0.005 |m-n|)`` on the attention weights, applied as
   ``log f`` added to the scores (multiply the weights by ``f`` and renormalise).
"""

from __future__ import annotations

import torch

from course_lib.encodings.rope import (
    RoPEAttention,
    apply_rope,
    check_rope_params,
    compute_dtype,
    rope_angles,
)
from course_lib.kernel_hooks import QKTables, ScoreBias
from course_lib.registry import Encoding, register
from course_lib.runtime import kernels_available

__all__ = [
    "exposb_amplitude",
    "exposb_band_gain",
    "exposb_distance_factor",
    "exposb_distance_bias",
    "apply_exposb",
    "ExpoSBAttention",
]


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
    dt = compute_dtype(x)
    amp = exposb_amplitude(position_ids).to(dt).unsqueeze(-1)  # [..., seq, 1]
    if position_ids.dim() == 2 and x.dim() == 4:
        amp = amp.unsqueeze(1)
    gain = exposb_band_gain(x.shape[-1]).to(device=x.device, dtype=dt)
    return (rotated.to(dt) * amp * gain).to(x.dtype)


# -- hooks of the registry record ----------------------------------------------------------------
def exposb_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """g(d) * a(p) * RoPE rotation by p"""
    return apply_exposb(x, positions, base=params["base"], style=params["style"])


def exposb_kernel_tables(positions: torch.Tensor, head_dim: int, params: dict) -> QKTables:
    """cos/sin of the RoPE angles times ``a(p)``, and the band gain ``g`` ``[D]``."""
    angles = rope_angles(positions, head_dim, params["base"])  # [1|B, seq, D/2]
    amplitude = exposb_amplitude(positions).unsqueeze(-1)  # [1|B, seq, 1]
    gain = exposb_band_gain(head_dim).to(positions.device)
    return QKTables(angles.cos() * amplitude, angles.sin() * amplitude, gain, params["style"])


def exposb_score_bias(
    query_positions: torch.Tensor, key_positions: torch.Tensor, params: dict
) -> torch.Tensor:
    """log(0.7 + 0.3 exp(-0.005 |p_i - p_j|)), the distance factor as a bias"""
    return exposb_distance_bias(query_positions, key_positions).unsqueeze(1)  # [1|B, 1, Nq, Nk]


# -- the fused kernels' hook (Triton only) --------------------------------------------------------
EXPOSB_DISTANCE = None
"""``b_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))``, no parameter, with a factor form: the flash
kernels multiply their weights by ``0.7 + 0.3 exp(-0.005 |p_i - p_j|)`` (one ``exp2`` per pair)
instead of adding its log. Its functions are in ``kernels/score_bias.py``, where chapter 04 reads
them. None without Triton."""
if kernels_available():
    from course_lib.kernels import score_bias as _library

    EXPOSB_DISTANCE = _library.BiasHook(
        name="exposb_distance",
        formula="b_ij = log(0.7 + 0.3 * exp(-0.005 * |p_i - p_j|))",
        bias=_library.exposb_distance_bias,
        factor=_library.exposb_distance_factor,
    )


def exposb_kernel_bias(params: dict, positions: torch.Tensor) -> ScoreBias:
    """The distance factor for the fused kernels (:data:`EXPOSB_DISTANCE`)."""
    return ScoreBias(EXPOSB_DISTANCE)


class ExpoSBAttention(RoPEAttention):
    """RoPE with the report's amplitude, band-pass gain and distance factor; no parameters.

    The report also declares per-head ``band_weights`` and ``decay_rates`` but never wires them
    into its kernel; they are not offered here rather than offered and ignored.
    """

    encoding = "exposb"


register(
    Encoding(
        name="exposb",
        chapter="04_exposb",
        summary="RoPE with a position-dependent amplitude, a band-pass gain and a distance factor",
        module=ExpoSBAttention,
        color="#9467bd",
        qk_transform=exposb_transform,
        score_bias=exposb_score_bias,
        params={"base": 10000.0, "style": "interleaved"},
        check_params=check_rope_params,
        kernel_tables=exposb_kernel_tables,
        kernel_bias=exposb_kernel_bias,
        kernel_hooks=(EXPOSB_DISTANCE,) if EXPOSB_DISTANCE is not None else (),
        distance_only=True,
    )
)
