"""Score-bias hooks: the ``b_ij`` a fused kernel adds to its scores, chosen by name.

The kernels know no encoding. A caller names a hook (a key of :data:`SCORE_BIAS_HOOKS`); the
launcher passes the hook's ``@triton.jit`` functions to the kernel as ``tl.constexpr`` arguments
(``BIAS_FN``, and ``BIAS_GRAD_FN`` when a gradient is wanted), so each hook is compiled into its
own kernel and no bias (``BIAS_FN=None``) costs nothing. For query ``i`` and key ``j``::

    logit_ij = scale * q'_i . k'_j + b_ij

Hooks of the course (``p`` = the position ids, float32 in the tile):

* ``"linear_distance"``: ``b_ij = -per_head[h] * |p_i - p_j|`` (RSE's learned penalty, ALiBi);
  gradient ``d loss / d per_head[h] = -sum_ij dS_ij |p_i - p_j|``.
* ``"exposb_distance"``: ``b_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))`` (ExpoSB's distance
  factor, added as a log to the logits), no parameter.

``dS_ij = d loss / d logit_ij`` is the matrix the backward kernels already form (softmax:
``P (dP - delta)``; stick-breaking: ``dz``).

The hook contract
-----------------
``bias(idx_q, idx_k, pos_q, pos_k, params, BASE2) -> tile`` (float32). ``idx_*`` are token
indices (int), ``pos_*`` positions (float32), handed over already broadcastable to the tile:
``[rows, 1]`` and ``[1, cols]`` when queries are the rows (every forward, the flash dQ and the
stick-breaking kernels), ``[1, cols]`` and ``[rows, 1]`` when keys are the rows (the flash dK/dV
kernel). So a hook writes ``pos_q - pos_k`` and never cares about the orientation. ``params``
is a pointer already moved to this (batch, head): ``per_head`` is read with ``tl.load(params)``.
``BASE2``: return ``b * log2(e)`` (the flash kernels work in base 2) instead of ``b``.

``grad(acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS) -> acc``: add this tile's
``sum dS_ij * d b_ij / d theta`` to the float32 accumulator ``acc`` of shape ``[GRAD_WIDTH]``;
``QUERY_AXIS`` is the tile axis that indexes queries (reduce over it to keep one value per key).
Only the kernel that owns a key block calls it (flash dK/dV, stick-breaking columns), once per
tile it visits; it starts from zeros and stores ``acc`` at ``partials[batch*head, program, :]``,
a float32 buffer ``[batch*heads, key blocks, GRAD_WIDTH]`` (no atomics, so deterministic).
After the launch :meth:`BiasHook.reduce_grad` turns the buffer into the parameter's gradient
with torch. ``"linear_distance"`` keeps one partial sum per key column (``GRAD_WIDTH`` = the key
block) so its inner loop reduces only over the query axis, and sums them all afterwards.

Adding a hook
-------------
Write its ``bias`` (and, if it has learnable tensors, ``grad``) below, add a :class:`BiasHook`
to :data:`SCORE_BIAS_HOOKS` and its name to ``limits.SCORE_BIAS_HOOK_NAMES``. The kernels' loops
do not change: they call whatever function they are given. Two planned examples:

* FoX (per-token, causal softmax): ``b_ij = c_i - c_j`` with ``c`` ``[batch, heads, seq]``. Its
  tensor goes where ``per_head`` goes, with the wrapper passing its batch and head strides (the
  kernels already offset ``params`` by ``batch * stride_bias_b + head * stride_bias_h``);
  ``bias`` loads ``tl.load(params + idx_q) - tl.load(params + idx_k)``; ``grad`` keeps one value
  per key, ``acc - tl.sum(ds, axis=QUERY_AXIS)`` (``GRAD_WIDTH`` = the key block), and
  ``reduce_grad`` lays the partials out as ``[batch, heads, seq]`` (the column sums, negated).
  The row sums ``sum_j dS_ij`` that ``c_i`` would also receive are exactly 0 under softmax (each
  row of ``P`` sums to 1), so the flash family needs nothing more; a per-token bias under
  stick-breaking, which has no such identity, would also need a row accumulator in its row
  kernel.
* T5 (bucketed table ``[heads, num_buckets]``): ``bias`` computes the bucket of
  ``idx_k - idx_q`` in the tile and loads ``params + bucket``; ``grad`` uses ``GRAD_WIDTH`` =
  ``num_buckets`` and adds, for each bucket ``u``, the sum of ``ds`` where ``bucket == u``;
  ``reduce_grad`` sums the partials over the batch and the key blocks into ``[heads,
  num_buckets]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .limits import SCORE_BIAS_HOOK_NAMES

__all__ = [
    "BiasHook",
    "SCORE_BIAS_HOOKS",
    "exposb_distance_bias",
    "get_hook",
    "linear_distance_bias",
    "linear_distance_grad",
]


# --------------------------------------------------------------------------------------------
# linear_distance: b_ij = -per_head[h] * |p_i - p_j|
# --------------------------------------------------------------------------------------------


@triton.jit
def linear_distance_bias(idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr):
    """``-slope * |p_i - p_j|`` with ``slope = per_head[h]`` (times ``log2 e`` if ``BASE2``)."""
    slope = tl.load(params)
    if BASE2:
        slope = slope * 1.4426950408889634
    return -slope * tl.abs(pos_q - pos_k)


@triton.jit
def linear_distance_grad(acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr):
    """Per key column: ``acc_j -= sum_i dS_ij |p_i - p_j|`` (as ``d b_ij / d slope``
    is ``-|p_i - p_j|``)."""
    return acc - tl.sum(ds * tl.abs(pos_q - pos_k), axis=QUERY_AXIS)


def _sum_per_head(partials: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
    """``[batch*heads, blocks, width]`` partial sums -> ``[heads]``."""
    return partials.view(batch, heads, -1).sum(dim=(0, 2))


# --------------------------------------------------------------------------------------------
# exposb_distance: b_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))
# --------------------------------------------------------------------------------------------


@triton.jit
def exposb_distance_bias(idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr):
    """``log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))`` (``log2`` of the same factor if ``BASE2``)."""
    distance = tl.abs(pos_q - pos_k)
    factor = 0.7 + 0.3 * tl.exp(-0.005 * distance)
    if BASE2:
        return tl.log2(factor)
    return tl.log(factor)


# --------------------------------------------------------------------------------------------
# The table of hooks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BiasHook:
    """One named score bias.

    ``bias`` / ``grad``: the ``@triton.jit`` functions of the contract above (``grad`` None: the
    bias has no learnable tensor). ``param``: ``"per_head"`` if the hook reads a float
    ``[heads]`` tensor, else None. ``formula``: ``b_ij`` in words, for error messages and docs.
    """

    name: str
    formula: str
    bias: object
    grad: object | None = None
    param: str | None = None
    reduce: Callable[[torch.Tensor, int, int], torch.Tensor] | None = None

    def grad_width(self, block_keys: int) -> int:
        """Width of the per-program gradient accumulator (one partial sum per key column)."""
        return block_keys

    def reduce_grad(self, partials: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
        """The parameter's gradient from the kernel's ``[batch*heads, blocks, width]`` buffer."""
        if self.reduce is None:
            raise ValueError(f"the score bias {self.name!r} has no learnable tensor")
        return self.reduce(partials, batch, heads)


SCORE_BIAS_HOOKS: dict[str, BiasHook] = {
    "linear_distance": BiasHook(
        name="linear_distance",
        formula="b_ij = -per_head[h] * |p_i - p_j|",
        bias=linear_distance_bias,
        grad=linear_distance_grad,
        param="per_head",
        reduce=_sum_per_head,
    ),
    "exposb_distance": BiasHook(
        name="exposb_distance",
        formula="b_ij = log(0.7 + 0.3 * exp(-0.005 * |p_i - p_j|))",
        bias=exposb_distance_bias,
    ),
}
if tuple(SCORE_BIAS_HOOKS) != SCORE_BIAS_HOOK_NAMES:
    raise RuntimeError("SCORE_BIAS_HOOKS and limits.SCORE_BIAS_HOOK_NAMES must list the same names")


def get_hook(name: str) -> BiasHook:
    """The hook called ``name``; an unknown name lists the valid ones."""
    try:
        return SCORE_BIAS_HOOKS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown score-bias hook {name!r}; valid: {', '.join(map(repr, SCORE_BIAS_HOOKS))}"
        ) from None
