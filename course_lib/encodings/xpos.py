"""xPos, RoPE with an exponential decay per channel pair (Sun et al. 2022) (chapter 07).

RoPE's score depends on the offset only, but not its size: nothing makes far keys count less.
xPos (Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song & Wei 2022, "A Length-Extrapolatable
Transformer", arXiv:2212.10554, section 3.2) scales the rotated pairs, **queries and keys
differently**: pair ``t`` of the query at position ``n`` by ``zeta_t^(n / s)``, of the key at
position ``m`` by ``zeta_t^(-m / s)``, so that::

    q'_n . k'_m = sum_t zeta_t^((n - m) / s) * (pair t of RoPE's q_n . R(m - n) k_m)
    zeta_t = (t / (D/2) + gamma) / (1 + gamma),   t = 0 .. D/2 - 1   (gamma = 0.4, s = 512)

still a function of ``n - m`` (relative), and for a key behind the query (``n > m``) each pair
decays exponentially with the distance, fastest for the fast-turning pairs (small ``t``, where
``zeta_t`` is smallest) whose rotation is least reliable far away. ``zeta_t`` lies in ``[gamma /
(1 + gamma), 1)``. A key *after* the query would be amplified instead, so xPos is causal only,
as in the paper's language models.

Positions are measured from the middle of each sequence's positions, ``c = (min p + max p) // 2``
(per sequence of the batch, from the key positions, which the queries share): the scales are
``zeta^((n - c)/s)`` and ``zeta^(-(m - c)/s)``, and the rotation turns by ``(p - c) w_t``. Their
product is unchanged (the score depends on ``n - m`` only), while the scales stay within float32:
taken at the positions as given, ``zeta^(n/s)`` would underflow and ``zeta^(-m/s)`` overflow once
``n / s`` passes about 70 (``n`` past about 35,000 with ``s = 512``), and every score would be
NaN. Centred, a sequence may span about 71,000 positions (``2 s * 87 / |log zeta_0|``, 87 being
float32's range in powers of ``e``); a wider one is refused with that limit. A key/value cache
keeps its keys' positions, so a decoding step centres on all of them, queries included, and a
long generation at position 40,000 computes exactly what the same text at position 0 does.
:func:`apply_xpos` alone takes the positions as given unless told the ``centre``.

On the kernels this is RoPE's cos/sin tables with the scale folded in, ``zeta^((n - c)/s)`` in
the query tables and ``zeta^(-(m - c)/s)`` in the key tables (``QKTables.key_cos``/``key_sin``),
built from the same centred positions as the reference: the q/k transform of both kernel
families, no kernel code of its own.
"""

from __future__ import annotations

import math

import torch

from course_lib.checks import check_integer_tensor, has_values, is_integer
from course_lib.encodings.rope import (
    RoPEAttention,
    check_rope_params,
    check_rotation_positions,
    compute_dtype,
    rope_angles,
    rotate_pairs,
)
from course_lib.kernel_hooks import QKTables
from course_lib.position_facts import position_facts
from course_lib.registry import Encoding, register

__all__ = [
    "XPOS_GAMMA",
    "XPOS_SCALE_BASE",
    "XPosAttention",
    "apply_xpos",
    "xpos_centre",
    "xpos_decay",
    "xpos_reach",
]

XPOS_GAMMA = 0.4  # the paper's gamma
XPOS_SCALE_BASE = 512.0  # the paper's s
# zeta^e and zeta^-e both stay normal float32 numbers while |e log zeta| <= 87.3
_FLOAT32_LOG_RANGE = -math.log(torch.finfo(torch.float32).tiny)


def xpos_decay(head_dim: int, gamma: float = XPOS_GAMMA) -> torch.Tensor:
    """``zeta_t = (t / (D/2) + gamma) / (1 + gamma)`` for pairs ``t = 0 .. D/2 - 1``: ``[D/2]``
    float32, in ``[gamma / (1 + gamma), 1)``."""
    if not is_integer(head_dim) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even integer, got {head_dim!r}")
    head_dim = int(head_dim)
    t = torch.arange(head_dim // 2, dtype=torch.float64)
    return ((t / (head_dim // 2) + gamma) / (1 + gamma)).to(torch.float32)


def xpos_centre(positions: torch.Tensor) -> torch.Tensor:
    """The middle of each sequence's positions, ``(min + max) // 2``: integer ``[..., seq]`` ->
    int64 ``[..., 1]`` (0 for an empty sequence). Queries and keys measured from it keep their
    offsets ``n - m``, and the scales stay near 1."""
    check_integer_tensor(positions, "position_ids")
    positions = positions.to(torch.int64)
    if positions.shape[-1] == 0:
        return positions.new_zeros((*positions.shape[:-1], 1))
    low = positions.amin(dim=-1, keepdim=True)
    return low + (positions.amax(dim=-1, keepdim=True) - low) // 2


def xpos_reach(
    head_dim: int, gamma: float = XPOS_GAMMA, scale_base: float = XPOS_SCALE_BASE
) -> int:
    """How far from its centre a position may lie: the largest ``|p - c|`` for which every
    scale ``zeta_t^(+-(p - c)/s)`` is a normal float32 number (35,694 for the paper's gamma
    and ``s``; a sequence may span twice that)."""
    steepest = -math.log(float(xpos_decay(head_dim, gamma)[0]))  # |log zeta_0|, the largest
    return int(_FLOAT32_LOG_RANGE * scale_base / steepest)


def _check_reach(
    offsets: torch.Tensor, head_dim: int, gamma, scale_base, way_out, reach: int | None = None
) -> None:
    """Refuse offsets ``p - c`` whose scales would overflow or underflow float32 (``way_out()``
    says what to do); ``reach``: their largest size where the caller knows it (else read)."""
    if offsets.numel() == 0 or not has_values(offsets):
        return
    if reach is None:
        reach = int(offsets.abs().max())
    limit = xpos_reach(head_dim, gamma, scale_base)
    if reach > limit:
        raise ValueError(
            f"xPos scales pair t by zeta_t^(+-(p - c)/s), c the centre positions are measured "
            f"from; here a position lies {reach} from it, and past {limit} (scale_base="
            f"{scale_base:g}, gamma={gamma:g}) the scales overflow float32 and every score "
            f"would be NaN: {way_out()}"
        )


def xpos_scale(
    position_ids: torch.Tensor,
    head_dim: int,
    *,
    side: str,
    gamma: float = XPOS_GAMMA,
    scale_base: float = XPOS_SCALE_BASE,
) -> torch.Tensor:
    """The scale of each pair: ``zeta_t^(p / s)`` for queries, ``zeta_t^(-p / s)`` for keys;
    ``[...]`` (integer positions, already centred) -> ``[..., D/2]`` float32 (computed in
    float64)."""
    if side not in ("query", "key"):
        raise ValueError(f"side must be 'query' or 'key', got {side!r}")
    sign = 1.0 if side == "query" else -1.0
    log_zeta = torch.log(xpos_decay(head_dim, gamma).double()).to(position_ids.device)
    exponent = sign * position_ids.double().unsqueeze(-1) / scale_base
    return torch.exp(exponent * log_zeta).to(torch.float32)


def _centred(position_ids: torch.Tensor, centre) -> torch.Tensor:
    """``position_ids - centre`` in int64 (``centre``: None for 0, an int, or an integer tensor
    broadcastable against the positions, e.g. ``[batch, 1]``)."""
    positions = position_ids.to(torch.int64)
    if centre is None:
        return positions
    if isinstance(centre, torch.Tensor):
        check_integer_tensor(centre, "centre")
        if centre.device != positions.device:
            raise ValueError(f"centre is on {centre.device} but position_ids on {positions.device}")
        try:
            torch.broadcast_shapes(centre.shape, positions.shape)
        except RuntimeError:
            raise ValueError(
                f"centre of shape {tuple(centre.shape)} must broadcast against position_ids of "
                f"shape {tuple(positions.shape)} (e.g. [batch, 1]: one centre per sequence)"
            ) from None
        return positions - centre.to(torch.int64)
    if not is_integer(centre):
        raise TypeError(f"centre must be None, an int or an integer tensor, got {centre!r}")
    return positions - int(centre)


def apply_xpos(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    side: str,
    base: float = 10000.0,
    style: str = "interleaved",
    gamma: float = XPOS_GAMMA,
    scale_base: float = XPOS_SCALE_BASE,
    centre: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """xPos of ``x`` ``[..., seq, head_dim]`` (queries: ``side="query"``; keys: ``"key"``):
    RoPE's rotation of each pair by ``p - centre``, times ``zeta_t^(+-(p - centre) / s)``.
    ``position_ids`` ``[seq]`` or ``[batch, seq]`` (with a 4-D ``x``). ``centre``: None (the
    positions as given), an int, or an integer tensor broadcastable against ``position_ids``
    (e.g. ``[batch, 1]``); give queries and keys the same one, e.g. :func:`xpos_centre` of the
    key positions, as ``attention()`` does. Computed in float32 (float64 for float64 inputs).
    Positions further than :func:`xpos_reach` from the centre are refused (their scales would
    overflow float32)."""
    check_integer_tensor(position_ids, "position_ids")
    check_rotation_positions(x, position_ids)
    head_dim = x.shape[-1]
    offsets = _centred(position_ids, centre)
    check_rotation_positions(x, offsets)  # a centre per sequence may add a batch axis
    _check_reach(
        offsets, head_dim, gamma, scale_base,
        lambda: "pass centre= the middle of the positions queries and keys share (xpos_centre "
        "of the key positions), or use a larger scale_base",
    )  # fmt: skip
    angles = rope_angles(offsets, head_dim, base)
    scale = xpos_scale(offsets, head_dim, side=side, gamma=gamma, scale_base=scale_base)
    if offsets.dim() == 2 and x.dim() == 4:
        angles, scale = angles.unsqueeze(1), scale.unsqueeze(1)
    dt = compute_dtype(x)
    cos, sin = (angles.cos() * scale).to(dt), (angles.sin() * scale).to(dt)
    return rotate_pairs(x.to(dt), cos, sin, style).to(x.dtype)


# -- hooks of the registry record ----------------------------------------------------------------
def xpos_query_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """RoPE rotation by p - c, each pair scaled by zeta_t^((p - c)/512) (keys: zeta_t^(-(p -
    c)/512)), c the middle of the sequence's key positions"""
    return apply_xpos(
        x, positions, side="query", base=params["base"], style=params["style"],
        gamma=params["gamma"], scale_base=params["scale_base"], centre=params.get("centre"),
    )  # fmt: skip


def xpos_key_transform(x: torch.Tensor, positions: torch.Tensor, params: dict) -> torch.Tensor:
    """RoPE rotation by p - c, each pair scaled by zeta_t^(-(p - c)/512)"""
    return apply_xpos(
        x, positions, side="key", base=params["base"], style=params["style"],
        gamma=params["gamma"], scale_base=params["scale_base"], centre=params.get("centre"),
    )  # fmt: skip


def xpos_kernel_tables(positions: torch.Tensor, head_dim: int, params: dict) -> QKTables:
    """RoPE's cos/sin tables at ``p - c`` times ``zeta^((p - c)/s)`` for the queries and
    ``zeta^(-(p - c)/s)`` for the keys (float32 ``[1|batch, seq, D/2]``), ``c`` the middle of
    each sequence's positions (:func:`xpos_centre`): the numbers the reference multiplies by.
    The score's factor ``zeta^((n - m)/s)`` is unchanged, while the scaled keys stay within
    fp16's range (at ``p = 5000`` uncentred, ``zeta^(-p/s)`` reaches about 2e5 > 65504)."""
    centre = params.get("centre")
    offsets = _centred(positions, xpos_centre(positions) if centre is None else centre)
    angles = rope_angles(offsets, head_dim, params["base"])
    cos, sin = angles.cos(), angles.sin()
    scales = {
        side: xpos_scale(
            offsets, head_dim, side=side, gamma=params["gamma"], scale_base=params["scale_base"]
        )
        for side in ("query", "key")
    }
    return QKTables(
        cos * scales["query"], sin * scales["query"], None, params["style"],
        key_cos=cos * scales["key"], key_sin=sin * scales["key"],
    )  # fmt: skip


def check_xpos_params(params: dict, *, positions=None, **call) -> None:
    """RoPE's checks (``base``, ``style``, an even head_dim); ``gamma`` > 0 and ``scale_base``
    > 0, finite numbers. Given the call's key positions, it adds ``params["centre"]``, the middle
    of each sequence's positions ``[1|batch, 1]`` that queries and keys are measured from, and
    refuses a sequence spanning more than float32's scales hold (:func:`xpos_reach`)."""
    check_rope_params(params, positions=positions, **call)
    for name in ("gamma", "scale_base"):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"xPos {name} must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"xPos {name} must be a finite number > 0, got {value!r}")
    if positions is not None:
        params["centre"] = xpos_centre(positions)
        reach = None
        if positions.dim() == 2 and positions.numel() and has_values(positions):
            span = position_facts(positions).span  # the centre lies span // 2 above the lowest
            reach = span - span // 2
        _check_reach(
            positions.to(torch.int64) - params["centre"], call["head_dim"], params["gamma"],
            params["scale_base"],
            lambda: f"position_ids from {int(positions.min())} to {int(positions.max())} span "
            "too much for one sequence; use shorter sequences (or windows), or a larger "
            "scale_base",
            reach,
        )  # fmt: skip


class XPosAttention(RoPEAttention):
    """xPos: RoPE whose query pairs are scaled by ``zeta^(n/s)`` and key pairs by
    ``zeta^(-m/s)``, positions measured from the middle of each sequence's (no parameters;
    causal only). ``gamma`` and ``scale_base`` are the paper's 0.4 and 512 unless given."""

    encoding = "xpos"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        *,
        gamma: float = XPOS_GAMMA,
        scale_base: float = XPOS_SCALE_BASE,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        check_xpos_params(
            {"base": 10000.0, "style": "interleaved", "gamma": gamma, "scale_base": scale_base},
            heads=num_heads, head_dim=self.head_dim, device=None,
        )  # fmt: skip
        self.gamma, self.scale_base = float(gamma), float(scale_base)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"gamma": self.gamma, "scale_base": self.scale_base}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gamma={self.gamma}, scale_base={self.scale_base}"


register(
    Encoding(
        name="xpos",
        chapter="07_rope_scaling",
        summary="RoPE with pair t of queries scaled by zeta_t^(n/512) and of keys by zeta_t^(-m/512)",
        module=XPosAttention,
        color="#31a354",
        qk_transform=xpos_query_transform,
        key_transform=xpos_key_transform,
        params={
            "base": 10000.0,
            "style": "interleaved",
            "gamma": XPOS_GAMMA,
            "scale_base": XPOS_SCALE_BASE,
        },
        check_params=check_xpos_params,
        kernel_tables=xpos_kernel_tables,
        relative=True,
        causal_only=True,
    )
)
