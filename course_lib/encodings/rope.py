"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer): q and k rotated by position (chapter 03).

Pair ``t`` of the vector at position ``p`` is rotated by the angle ``p * base**(-2t/head_dim)``, so
``R(p_i) q . R(p_j) k = q . R(p_j - p_i) k``: the score depends on the offset only.

Longer than trained (chapter 07): ``scaling`` changes the frequencies (and may scale q and k),
in Hugging Face's ``rope_parameters`` convention, see :func:`rope_frequencies`.
"""

from __future__ import annotations

import math
import numbers

import torch

from course_lib.checks import (
    check_choice,
    check_even_dim,
    check_floating_input,
    check_int,
    check_integer_tensor,
    check_real,
)
from course_lib.kernel_hooks import PAIR_LAYOUTS, QKTables
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import Encoding, register

__all__ = [
    "ROPE_STYLES",
    "ROPE_SCALING_TYPES",
    "rope_inverse_frequencies",
    "rope_frequencies",
    "check_rope_scaling",
    "rope_angles",
    "apply_rope",
    "rotate_pairs",
    "check_rotation_positions",
    "rope_half_permutation",
    "rope_transform",
    "rope_kernel_tables",
    "check_rope_params",
    "RoPEAttention",
]

ROPE_STYLES = PAIR_LAYOUTS  # "interleaved" pairs (2t, 2t+1); "half" pairs (t, t + D/2)

# rope_type -> the keys its scaling dict may hold besides "rope_type" (defaults; REQUIRED: none)
_REQUIRED = object()
_SCALING_KEYS: dict[str, dict[str, object]] = {
    "linear": {"factor": _REQUIRED, "original_max_position_embeddings": None},
    "ntk": {"factor": _REQUIRED, "original_max_position_embeddings": None},
    "dynamic": {"factor": _REQUIRED, "original_max_position_embeddings": _REQUIRED},
    "yarn": {
        "factor": _REQUIRED,
        "original_max_position_embeddings": _REQUIRED,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": None,
        "mscale": None,
        "mscale_all_dim": None,
        "truncate": True,
    },
}
ROPE_SCALING_TYPES: tuple[str, ...] = tuple(_SCALING_KEYS)


def check_rope_base(base: object) -> float:
    """RoPE's ``base``: a finite number > 0 (the wavelengths are ``2 pi base**(2t/D)``)."""
    return check_real("RoPE base", base, above=0.0)


def rope_inverse_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``w_t = base**(-2t/head_dim)`` for pairs ``t = 0..head_dim/2-1`` (float32)."""
    head_dim = check_even_dim(head_dim, "head_dim for RoPE")
    base = check_rope_base(base)
    return (base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).to(
        torch.float32
    )


def check_rope_scaling(scaling: dict | None) -> dict | None:
    """Validate a scaling dict; return it with every default filled in (None stays None).

    ``{"rope_type": "linear" | "ntk" | "dynamic" | "yarn", "factor": s >= 1, ...}``; dynamic and
    yarn also need ``original_max_position_embeddings`` (the training length ``L``, an integer
    >= 1). YaRN's options: ``beta_fast > beta_slow > 0`` (turns over ``L``), ``attention_factor``
    None or > 0, ``mscale`` and ``mscale_all_dim`` None or >= 0 (0 counts as not given, as in
    Hugging Face), ``truncate`` a bool. Numbers must be finite, and not bools.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(f"RoPE scaling must be a dict or None, got {type(scaling).__name__}")
    rope_type = scaling.get("rope_type")
    if rope_type not in _SCALING_KEYS:
        raise ValueError(
            f"unknown RoPE scaling rope_type {rope_type!r}; valid: "
            f"{', '.join(map(repr, ROPE_SCALING_TYPES))}"
        )
    allowed = _SCALING_KEYS[rope_type]
    unknown = sorted(set(scaling) - set(allowed) - {"rope_type"})
    if unknown:
        raise ValueError(
            f"RoPE scaling of rope_type {rope_type!r} takes no key(s) {', '.join(unknown)}; "
            f"it takes: rope_type, {', '.join(allowed)}"
        )
    out = {"rope_type": rope_type}
    for key, default in allowed.items():
        value = scaling.get(key, default)
        if value is _REQUIRED:
            raise ValueError(f"RoPE scaling of rope_type {rope_type!r} needs {key!r}")
        out[key] = value
    factor = out["factor"]
    if (
        isinstance(factor, bool)
        or not isinstance(factor, numbers.Real)
        or not math.isfinite(factor)
        or factor < 1
    ):
        raise ValueError(
            f"RoPE scaling factor must be a number >= 1 (how many times longer than trained), "
            f"got {factor!r}"
        )
    out["factor"] = float(factor)
    if out["original_max_position_embeddings"] is not None:
        out["original_max_position_embeddings"] = check_int(
            "original_max_position_embeddings (the training length)",
            out["original_max_position_embeddings"],
            minimum=1,
        )
    if rope_type == "yarn":
        _check_yarn_options(out)
    return out


def _check_yarn_options(c: dict) -> None:
    """YaRN's options, in place (see :func:`check_rope_scaling`)."""
    c["beta_fast"] = check_real(
        "YaRN beta_fast (turns over the training length)", c["beta_fast"], above=0.0
    )
    c["beta_slow"] = check_real(
        "YaRN beta_slow (turns over the training length)", c["beta_slow"], above=0.0
    )
    if not c["beta_fast"] > c["beta_slow"]:
        raise ValueError(
            f"YaRN needs beta_fast > beta_slow > 0 (pairs turning more than beta_fast times keep "
            f"their frequency, fewer than beta_slow are interpolated), got beta_fast="
            f"{c['beta_fast']:g}, beta_slow={c['beta_slow']:g}"
        )
    if c["attention_factor"] is not None:
        c["attention_factor"] = check_real(
            "YaRN attention_factor (multiplies q and k)", c["attention_factor"], above=0.0
        )
    for key in ("mscale", "mscale_all_dim"):
        if c[key] is not None:
            c[key] = check_real(f"YaRN {key}", c[key], at_least=0.0)
    if not isinstance(c["truncate"], bool):
        raise TypeError(f"YaRN truncate must be True or False, got {c['truncate']!r}")


def _yarn_scale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 * mscale * ln(s) + 1`` (1 for ``s <= 1``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_frequencies(head_dim: int, base: float, c: dict) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate pairs that turn fewer than ``beta_slow`` times over
    the training length ``L``, keep pairs that turn more than ``beta_fast`` times, ramp between."""
    factor, length = float(c["factor"]), c["original_max_position_embeddings"]

    def pair_turning(turns: float) -> float:
        # the (fractional) pair index t whose wavelength fits `turns` times into L
        return head_dim * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(c["beta_fast"]), pair_turning(c["beta_slow"])
    if c["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a step instead of a ramp
    t = torch.arange(head_dim // 2, dtype=torch.float64)
    interpolated_share = ((t - low) / (high - low)).clamp(0.0, 1.0)  # 0: keep, 1: divide by s
    inv_freq = rope_inverse_frequencies(head_dim, base).to(torch.float64)
    inv_freq = inv_freq * (1 - interpolated_share) + inv_freq / factor * interpolated_share
    return inv_freq.to(torch.float32), _yarn_attention_factor(c)


def _yarn_attention_factor(c: dict) -> float:
    """The factor on q and k: ``attention_factor`` if given, else ``0.1 ln s + 1`` (or the ratio
    of the two mscale terms when both are given, as in Hugging Face)."""
    factor = float(c["factor"])
    if c["attention_factor"] is not None:
        return float(c["attention_factor"])
    if c["mscale"] and c["mscale_all_dim"]:
        return _yarn_scale(factor, c["mscale"]) / _yarn_scale(factor, c["mscale_all_dim"])
    return _yarn_scale(factor)


def _ntk_base(base: float, growth: float, head_dim: int, rope_type: str) -> float:
    """NTK-aware base ``base * growth**(D/(D-2))``; needs ``head_dim >= 4`` and a finite result."""
    if head_dim < 4:
        raise ValueError(
            f"{rope_type} RoPE scaling changes the base by s^(D/(D-2)), which needs head_dim >= 4 "
            f"(got head_dim={head_dim}: its one pair is the fastest, which NTK leaves unchanged); "
            "use rope_type 'linear' or no scaling"
        )
    try:
        new_base = base * growth ** (head_dim / (head_dim - 2))
    except OverflowError:
        new_base = math.inf
    if not math.isfinite(new_base):
        raise ValueError(
            f"{rope_type} RoPE scaling by {growth:g} at head_dim={head_dim} makes the base "
            f"{base:g} * {growth:g}^({head_dim}/{head_dim - 2}) overflow a float; use a smaller "
            "factor"
        )
    return new_base


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling: dict | None = None,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim/2] float32, attention_factor)`` of RoPE, plain or scaled.

    ``scaling`` (Hugging Face's ``rope_parameters`` convention, ``s`` = ``factor``,
    ``L`` = ``original_max_position_embeddings``, ``w_t = base**(-2t/D)``):

    * None: ``w_t``, factor 1.
    * ``linear``, position interpolation (Chen et al. 2023): ``w_t / s`` (positions divided by s).
    * ``ntk``, NTK-aware (bloc97 2023): the base becomes ``base * s**(D/(D-2))``: the fastest pair
      is untouched, the slowest is divided by ``s``.
    * ``dynamic``, dynamic NTK: the NTK base for the current length ``seq_len`` (``n``):
      ``base * (s*n/L - (s-1))**(D/(D-2))`` once ``n > L``, plain RoPE up to ``L``.
    * ``yarn`` (Peng et al. 2023): each pair ``t`` gets ``w_t`` (turns more than ``beta_fast``
      times in ``L``), ``w_t / s`` (fewer than ``beta_slow``), a linear ramp between; and q, k are
      scaled by ``attention_factor = 0.1 ln s + 1`` (so the logits by its square, ``1/t``).

    Every scaling reduces to plain RoPE at ``s = 1`` (dynamic: up to ``L``; past it its effective
    factor ``s*n/L - (s-1)`` grows with ``n`` whatever ``s``). The attention factor multiplies cos
    and sin, i.e. both q and k.
    """
    head_dim = check_even_dim(head_dim, "head_dim for RoPE")
    base = check_rope_base(base)
    c = check_rope_scaling(scaling)
    if c is None:
        return rope_inverse_frequencies(head_dim, base), 1.0
    factor, rope_type = float(c["factor"]), c["rope_type"]
    if rope_type == "linear":
        return rope_inverse_frequencies(head_dim, base) / factor, 1.0
    if rope_type == "ntk":
        return rope_inverse_frequencies(head_dim, _ntk_base(base, factor, head_dim, "ntk")), 1.0
    if rope_type == "dynamic":
        length = c["original_max_position_embeddings"]
        if seq_len is None:
            raise ValueError("dynamic RoPE scaling needs seq_len (the current sequence length)")
        n = max(check_int("seq_len (the current sequence length)", seq_len, minimum=0), length)
        growth = factor * n / length - (factor - 1)
        return rope_inverse_frequencies(head_dim, _ntk_base(base, growth, head_dim, "dynamic")), 1.0
    return _yarn_frequencies(head_dim, base, c)


def rope_angles(
    position_ids: torch.Tensor,
    head_dim: int,
    base: float = 10000.0,
    *,
    scaling: dict | None = None,
    seq_len: int | None = None,
) -> torch.Tensor:
    """Rotation angles ``p * w_t`` in float32: ``[...] -> [..., head_dim/2]``.

    With ``scaling``, ``w_t`` comes from :func:`rope_frequencies` (its attention factor is not
    part of the angles: see :func:`apply_rope`).
    """
    check_integer_tensor(position_ids, "position_ids")
    inv_freq, _ = rope_frequencies(head_dim, base=base, scaling=scaling, seq_len=seq_len)
    return position_ids.to(torch.float32).unsqueeze(-1) * inv_freq.to(position_ids.device)


def check_rotation_positions(x: torch.Tensor, position_ids: torch.Tensor) -> None:
    """``x`` ``[..., seq, head_dim]`` (at least 2-D) and ``position_ids`` ``[seq]`` or
    ``[batch, seq]`` (the batch of a 4-D ``x`` ``[batch, heads, seq, head_dim]``, or 1), on one
    device: the shapes a rotation by position takes."""
    if x.dim() < 2:
        raise ValueError(
            f"x must be [..., seq, head_dim] (at least 2-D: one vector per position), got shape "
            f"{tuple(x.shape)}; for one vector use x[None] with position_ids of shape [1]"
        )
    seq = x.shape[-2]
    shape = tuple(position_ids.shape)
    if position_ids.dim() not in (1, 2) or shape[-1] != seq:
        raise ValueError(
            f"position_ids must be [seq] or [batch, seq] with seq={seq} (x is {tuple(x.shape)}), "
            f"got {shape}"
        )
    # [batch, seq] positions meet a 4-D x as [batch, 1 (heads), seq]
    fitted = (shape[0], 1, seq) if len(shape) == 2 and x.dim() == 4 else shape
    try:
        fits = torch.broadcast_shapes(fitted, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"position_ids of shape {shape} do not fit x of shape {tuple(x.shape)}: give "
            f"[seq] = [{seq}], or [batch, seq] with a batch of 1 or that of x [batch, heads, "
            "seq, head_dim]"
        )
    if position_ids.device != x.device:
        raise ValueError(f"position_ids are on {position_ids.device} but x is on {x.device}")


def _angles_for(
    x: torch.Tensor, position_ids: torch.Tensor, base: float, scaling: dict | None, seq_len
) -> torch.Tensor:
    """Angles broadcastable against ``x[..., seq, head_dim/2]``.

    ``position_ids`` ``[seq]`` gives ``[seq, D/2]``; ``[batch, seq]`` with a 4-D ``x``
    (``[batch, heads, seq, head_dim]``) gives ``[batch, 1, seq, D/2]``.
    """
    check_rotation_positions(x, position_ids)
    angles = rope_angles(position_ids, x.shape[-1], base, scaling=scaling, seq_len=seq_len)
    if position_ids.dim() == 2 and x.dim() == 4:
        angles = angles.unsqueeze(1)
    return angles


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotate channel pairs: ``(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)``.

    ``x`` ``[..., head_dim]``; ``cos``, ``sin`` ``[..., head_dim/2]`` (one per pair, broadcast);
    ``style`` picks the pairs: ``(2t, 2t+1)`` (interleaved) or ``(t, t + head_dim/2)`` (half)."""
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
    scaling: dict | None = None,
    seq_len: int | None = None,
) -> torch.Tensor:
    """Rotary position embedding of ``x`` ``[..., seq, head_dim]``; returns a tensor like ``x``.

    Pair ``t`` of the vector at position ``p`` is rotated by the angle ``p * base**(-2t/head_dim)``.
    ``style="interleaved"`` pairs channels ``(2t, 2t+1)`` (RoFormer, GPT-J);
    ``style="half"`` pairs ``(t, t + head_dim/2)`` (GPT-NeoX, Llama's ``rotate_half``).
    ``scaling``: see :func:`rope_frequencies`; its attention factor multiplies the result.
    ``seq_len`` (dynamic scaling only) defaults to ``max(position_ids) + 1``.
    Angles are float32 whatever the dtype of ``x``; the rotation runs in float32 (float64 for
    float64 inputs) and the result is cast back.
    """
    check_floating_input(x, "x", " (RoPE rotates real channel pairs: convert with x.float())")
    check_choice("RoPE style", style, ROPE_STYLES)
    check_even_dim(x.shape[-1], "head_dim for RoPE")
    check_integer_tensor(position_ids, "position_ids")
    scaling = check_rope_scaling(scaling)
    if seq_len is None and scaling is not None and scaling["rope_type"] == "dynamic":
        seq_len = _default_seq_len(position_ids)
    angles = _angles_for(x, position_ids, base, scaling, seq_len)
    _, attention_factor = rope_frequencies(x.shape[-1], base=base, scaling=scaling, seq_len=seq_len)
    dt = compute_dtype(x)
    cos, sin = angles.cos().to(dt), angles.sin().to(dt)
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return rotate_pairs(x.to(dt), cos, sin, style).to(x.dtype)


def _default_seq_len(positions: torch.Tensor) -> int:
    """Dynamic scaling's current length: ``max(positions) + 1`` (0 for no positions)."""
    length = int(positions.max()) + 1 if positions.numel() else 0
    if length < 0:
        raise ValueError(
            "dynamic RoPE scaling takes the current length from the largest position + 1, "
            f"here {length}, which is no length. Pass seq_len (the "
            "length to scale for), or positions that reach 0"
        )
    return length


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
    return apply_rope(
        x, positions, base=params["base"], style=params["style"],
        scaling=params.get("scaling"), seq_len=params.get("seq_len"),
    )  # fmt: skip


def rope_kernel_tables(positions: torch.Tensor, head_dim: int, params: dict) -> QKTables:
    """The kernels' tables of :func:`rope_transform`: fp32 cos/sin ``[1|batch, seq, D/2]``
    (times the scaling's attention factor)."""
    scaling, seq_len = params.get("scaling"), params.get("seq_len")
    angles = rope_angles(positions, head_dim, params["base"], scaling=scaling, seq_len=seq_len)
    _, factor = rope_frequencies(head_dim, base=params["base"], scaling=scaling, seq_len=seq_len)
    return QKTables(angles.cos() * factor, angles.sin() * factor, None, params["style"])


def check_rope_params(
    params: dict, *, heads: int, head_dim: int, device, positions=None, **call
) -> None:
    """``style`` in :data:`ROPE_STYLES`, ``base`` > 0, an even head_dim, a valid ``scaling``
    (dynamic scaling: ``seq_len`` defaults to ``max(positions) + 1``, the same for q and k)."""
    check_choice("RoPE style", params["style"], ROPE_STYLES)
    params["base"] = check_rope_base(params["base"])
    if head_dim % 2:
        raise ValueError(f"RoPE rotates channel pairs: head_dim must be even, got {head_dim}")
    if "scaling" in params:
        params["scaling"] = check_rope_scaling(params["scaling"])
        dynamic = params["scaling"] is not None and params["scaling"]["rope_type"] == "dynamic"
        if dynamic and params["seq_len"] is None and positions is not None:
            params["seq_len"] = _default_seq_len(positions)


class RoPEAttention(PositionalSelfAttention):
    """Rotary encoding of q and k (interleaved pairs, base 10000); no parameters.

    ``scaling`` (a :func:`rope_frequencies` dict or None) may be set at construction or later
    (``module.scaling = {...}``, e.g. to evaluate a trained model at a longer length).
    """

    encoding = "rope"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        scaling: dict | None = None,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        if self.head_dim % 2:
            raise ValueError(
                f"{type(self).__name__} rotates channel pairs: head_dim must be even, got {self.head_dim}"
            )
        self.scaling = check_rope_scaling(scaling)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {} if self.scaling is None else {"scaling": self.scaling}


register(
    Encoding(
        name="rope",
        chapter="03_rope",
        summary="q and k rotated pair by pair by angles proportional to the position",
        module=RoPEAttention,
        color="#2ca02c",
        qk_transform=rope_transform,
        params={"base": 10000.0, "style": "interleaved", "scaling": None, "seq_len": None},
        check_params=check_rope_params,
        kernel_tables=rope_kernel_tables,
        relative=True,
    )
)
