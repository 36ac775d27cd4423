"""What an encoding hands the fused kernels: per-token q/k tables and a named score-bias hook.

The kernels know no encoding. An encoding (see :mod:`course_lib.encodings`) that transforms q and
k builds :class:`QKTables`; one that adds a bias to the scores names a hook and passes the tensor
it reads as a :class:`ScoreBias`. The kernel wrappers (:mod:`course_lib.flash_ops`,
:mod:`course_lib.stick_ops`) take both.

Channel pair ``t`` of head_dim ``D`` is channels ``(2t, 2t+1)`` in the ``"interleaved"`` layout
(RoFormer, GPT-J) and ``(t, t + D/2)`` in the ``"half"`` layout (GPT-NeoX, Llama's
``rotate_half``). For the vector ``x`` at position ``p`` with pair ``(x1, x2)`` on channels
``(c1, c2)`` the kernels compute::

    x'[c1] = gain[c1] * (x1 * cos[p, t] - x2 * sin[p, t])
    x'[c2] = gain[c2] * (x1 * sin[p, t] + x2 * cos[p, t])

which covers RoPE in both layouts, any RoPE scaling (scaled angles, an attention factor folded
into cos and sin), ExpoSB's amplitude (in cos/sin) and band gain (``gain``), and axial 2D RoPE
(angles from the row or the column).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from course_lib.kernels.limits import PAIR_LAYOUTS

__all__ = ["PAIR_LAYOUTS", "QKTables", "ScoreBias"]


@dataclass(frozen=True)
class QKTables:
    """Per-token rotation tables for q and k (constants: no gradient flows into them).

    ``cos``, ``sin``: float32 ``[1 or batch, seq, head_dim // 2]`` (a leading 1 is shared by the
    whole batch); ``gain``: float32 ``[head_dim]`` or None (all ones); ``layout``: one of
    :data:`PAIR_LAYOUTS`.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    gain: torch.Tensor | None = None
    layout: str = "interleaved"


@dataclass(frozen=True)
class ScoreBias:
    """A bias ``b_ij`` added to the scores, by the name of a kernel hook.

    ``hook``: a name in ``course_lib.kernels.score_bias.SCORE_BIAS_HOOKS``, e.g.
    ``"linear_distance"`` (``b_ij = -per_head[h] * |p_i - p_j|``), ``"offset_linear_distance"``
    (``b_ij = -per_head[h, 0] * |p_i - p_j| + per_head[h, 1]``, RSE with a stick bias) or
    ``"exposb_distance"`` (``b_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))``). The tensors a hook
    reads:

    * ``per_head``: floating ``[heads]`` or ``[heads, width]`` (e.g. a table of one value per
      head and bucket), or None;
    * ``per_token``: floating ``[batch, heads, seq]`` (e.g. cumulative log forget gates), or None;
    * ``options``: the hook's compile-time constants (e.g. a number of buckets), names to ints,
      floats or bools.

    When a tensor requires grad, the kernels return its gradient, reduced from ``dS``.
    """

    hook: str
    per_head: torch.Tensor | None = None
    per_token: torch.Tensor | None = None
    options: Mapping[str, int | float | bool] = field(default_factory=dict)
