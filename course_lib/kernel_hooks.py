"""What an encoding hands the fused kernels: per-token q/k tables and a score-bias hook object.

The kernels know no encoding. An encoding (see :mod:`course_lib.encodings`) that transforms q and
k builds :class:`QKTables`; one that adds a bias to the scores hands over a :class:`ScoreBias`: a
hook object (``course_lib.kernels.score_bias.BiasHook``: its ``@triton.jit`` functions, the
tensor they read, how that tensor's gradient is reduced), defined in the encoding's own file, and
the tensor. A bias that depends on the positions only through ``p_i - p_j`` needs no hook of its
own: :func:`distance_score_bias` tabulates the encoding's ``distance_bias`` (plain torch, with
autograd) for the kernels' per-distance hook. The kernel wrappers (:mod:`course_lib.flash_ops`,
:mod:`course_lib.stick_ops`) take both.

Channel pair ``t`` of head_dim ``D`` is channels ``(2t, 2t+1)`` in the ``"interleaved"`` layout
(RoFormer, GPT-J) and ``(t, t + D/2)`` in the ``"half"`` layout (GPT-NeoX, Llama's
``rotate_half``). For the vector ``x`` at position ``p`` with pair ``(x1, x2)`` on channels
``(c1, c2)`` the kernels compute::

    x'[c1] = gain[c1] * (x1 * cos[p, t] - x2 * sin[p, t])
    x'[c2] = gain[c2] * (x1 * sin[p, t] + x2 * cos[p, t])

which covers RoPE in both layouts, any RoPE scaling (scaled angles, an attention factor folded
into cos and sin), ExpoSB's amplitude (in cos/sin) and band gain (``gain``), and axial 2D RoPE
(angles from the row or the column). Keys may have tables of their own (``key_cos``,
``key_sin``), for a transform that treats queries and keys differently: xPos scales the query's
pairs by ``zeta^((n - c)/s)`` and the key's by ``zeta^(-(m - c)/s)`` (``c`` the middle of the
sequence's positions, as in the reference).

Precision: the tables are float32, built by torch from the positions exactly as the reference
builds its own (RoPE: ``p * w`` with ``p`` converted to float32), so both backends compute the
same function at any position; past ``2^24`` a position loses its low bits in that conversion
(at ``10**8`` it moves by up to 4), on both backends alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from course_lib.kernels.limits import MAX_POSITION_SPAN, PAIR_LAYOUTS
from course_lib.position_facts import position_facts, remember_facts

__all__ = [
    "PAIR_LAYOUTS",
    "QKTables",
    "ScoreBias",
    "distance_score_bias",
    "kernel_positions",
    "registered_hooks",
    "resolve_hook",
]


@dataclass(frozen=True)
class QKTables:
    """Per-token rotation tables for q and k (constants: no gradient flows into them).

    ``cos``, ``sin``: float32 ``[1 or batch, seq, head_dim // 2]`` (a leading 1 is shared by the
    whole batch); ``gain``: float32 ``[head_dim]`` or None (all ones), on both sides; ``layout``:
    one of :data:`PAIR_LAYOUTS`; ``key_cos``, ``key_sin``: the keys' own tables, of the same
    shape as ``cos`` (None: keys use ``cos`` and ``sin`` too). Both kernel families read them.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    gain: torch.Tensor | None = None
    layout: str = "interleaved"
    key_cos: torch.Tensor | None = None
    key_sin: torch.Tensor | None = None


@dataclass(frozen=True)
class ScoreBias:
    """A bias ``b_ij`` added to the scores: a hook object and the tensor it reads.

    ``hook``: a ``course_lib.kernels.score_bias.BiasHook`` (the encoding's own, e.g. RSE's
    ``offset_linear_distance``, or a shared one such as the linear distance hook of ALiBi and
    RSE in :mod:`course_lib.encodings.distance`), or the name of a hook that a registered
    encoding lists in its record's ``kernel_hooks`` (:func:`resolve_hook`). The tensor it reads
    (the one its ``param`` names):

    * ``per_head``: floating ``[heads]`` or ``[heads, width]`` (e.g. a table of one value per
      head and bucket), or None;
    * ``per_token``: floating ``[batch, heads, seq]`` (e.g. cumulative log forget gates), or None;
    * ``options``: the hook's compile-time constants (e.g. a number of buckets), names to ints,
      floats or bools;
    * ``per_diagonal``: floating ``[1 or batch, heads, 2 seq - 1]``, one value per ``i - j`` (the
      per-distance table, see :func:`distance_score_bias`), or None;
    * ``far_reach``: for a hook with a far form (the per-distance table's), the number of tokens
      ``i - j`` from which the bias is one value per head whatever the parameters (T5 past its
      last bucket); a causal launch of the flash kernels then runs those tiles without the bias.
      None: no such distance.

    When a tensor requires grad, the kernels return its gradient, reduced from ``dS``.
    """

    hook: object
    per_head: torch.Tensor | None = None
    per_token: torch.Tensor | None = None
    options: Mapping[str, int | float | bool] = field(default_factory=dict)
    per_diagonal: torch.Tensor | None = None
    far_reach: int | None = None

    @property
    def hook_name(self) -> str:
        return self.hook if isinstance(self.hook, str) else getattr(self.hook, "name", "?")


def registered_hooks() -> dict[str, object]:
    """``name -> hook`` of every score-bias hook the registered encodings list in their records
    (``kernel_hooks``), and the kernels' per-distance hook. Empty without Triton."""
    from course_lib.registry import REGISTRY
    from course_lib.runtime import kernels_available

    if not kernels_available():
        return {}
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    hooks: dict[str, object] = {DIAGONAL_TABLE.name: DIAGONAL_TABLE}
    for encoding in REGISTRY.values():
        for hook in encoding.kernel_hooks:
            if hooks.setdefault(hook.name, hook) is not hook:
                raise ValueError(
                    f"two different score-bias hooks are named {hook.name!r} (one is "
                    f"{encoding.name!r}'s): give each its own name"
                )
    return hooks


def resolve_hook(hook: object) -> object:
    """The hook object of a :class:`ScoreBias`: itself, or the registered hook of that name."""
    if not isinstance(hook, str):
        return hook
    hooks = registered_hooks()
    if hook not in hooks:
        raise ValueError(
            f"unknown score-bias hook {hook!r}; the registered encodings' hooks are: "
            f"{', '.join(map(repr, hooks))} (or pass a hook object)"
        )
    return hooks[hook]


def kernel_positions(positions: torch.Tensor) -> torch.Tensor:
    """Checked integer positions ``[1 or batch, seq]`` -> what the kernels read: each row minus
    its smallest position, subtracted in int64, as float32.

    Every value is then an exact integer (spans below ``2^24``), and so is ``p_i - p_j`` in a
    hook: any integer positions work (``10**8 + arange(n)`` gives exactly the biases of
    ``arange(n)``, where float32 positions would have lost their low bits). A sequence spanning
    ``2^24`` or more is refused. The result keeps the positions' facts
    (:func:`course_lib.position_facts.position_facts`, read once per positions tensor).
    """
    facts = position_facts(positions)
    if facts.span > MAX_POSITION_SPAN:
        raise ValueError(
            f"the positions of one sequence span {facts.span}; the kernels take positions "
            "relative to each sequence's smallest as exact float32 integers, spans up to "
            f"{MAX_POSITION_SPAN} (2^24 - 1). Use backend='reference' for such positions."
        )
    positions = positions.to(torch.int64)
    relative = (positions - positions.amin(dim=1, keepdim=True)).to(torch.float32).contiguous()
    return remember_facts(relative, replace(facts, lowest=0, highest=facts.span))


def positions_ordered(positions: torch.Tensor) -> bool:
    """Whether the positions ``[1 or batch, seq]`` never decrease along a sequence (then every
    key at or before a query in the sequence has ``p_j <= p_i``)."""
    return position_facts(positions).ordered


def position_steps(positions: torch.Tensor) -> torch.Tensor | None:
    """The step ``s_b`` of each sequence if its positions are ``p_b + s_b * arange(seq)``
    (``[1 or batch, 1]`` int64; a row of one token has step 0), else None."""
    if not position_facts(positions).affine:
        return None
    positions = positions.to(torch.int64)
    if positions.shape[-1] == 1:
        return torch.zeros_like(positions[:, :1])
    return positions[:, 1:2] - positions[:, :1]


def distance_score_bias(
    distance_bias, positions: torch.Tensor, params: dict, heads: int, reach: int | None = None
) -> ScoreBias | None:
    """The kernels' per-distance path for a bias of ``p_i - p_j`` written in torch.

    ``distance_bias(distances, params) -> [heads or 1, *distances.shape]`` (an encoding's
    record field); ``positions`` the checked key positions ``[1 or batch, seq]``. Where each
    sequence's positions step by a constant ``s`` (``p_i - p_j = s (i - j)``: any offset, any
    step), the bias of every pair is that of its diagonal ``i - j``: the table ``[1 or batch,
    heads, 2 seq - 1]`` of ``distance_bias(s * (i - j))`` goes to the kernels' per-distance hook
    (``course_lib.kernels.score_bias.DIAGONAL_TABLE``), which reads it per pair and returns the
    sums of ``dS`` along each diagonal; autograd carries them on through ``distance_bias`` to
    the encoding's parameters. Returns None for other positions (a gap in one sequence): their
    pairs would not share diagonals.

    ``reach``: the distance ``p_i - p_j`` from which ``distance_bias`` is one value per head for
    any parameters (an encoding's ``distance_reach``), or None. With positions that step forward
    (``s > 0``), the diagonals from ``ceil(reach / s)`` on then hold one value, and the table is
    handed over with that ``far_reach``: a causal launch of the flash kernels takes those tiles
    as one constant and gives all their ``dS`` to the first of those diagonals (the same
    gradient for the parameters, as every later one is the same function of them).
    """
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    steps = position_steps(positions)
    if steps is None:
        return None
    facts = position_facts(positions)
    if facts.step_min == facts.step_max:
        steps = steps[:1]  # one table for the whole batch
    seq = positions.shape[-1]
    diagonals = torch.arange(-(seq - 1), seq, device=positions.device)  # i - j
    table = distance_bias(steps * diagonals, params).movedim(0, 1)  # [1|B, H|1, 2 seq - 1]
    table = table.expand(table.shape[0], heads, table.shape[-1])
    far_reach = None
    if reach is not None and facts.step_min > 0:
        far_reach = -(-int(reach) // facts.step_min)  # ceil(reach / s), the largest of the batch
    return ScoreBias(DIAGONAL_TABLE, per_diagonal=table, far_reach=far_reach)
