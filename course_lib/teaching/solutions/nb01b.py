"""Worked solutions for notebook 01b (flash attention: tiles and an online softmax).

A softmax *state* over a set of keys is ``(m [...], l [...], acc [..., d])``: the largest score
``m``, the sum ``l = sum_j exp(s_j - m)`` and the weighted sum ``acc = sum_j exp(s_j - m) v_j``;
the attention output over those keys is ``acc / l``.
"""

from __future__ import annotations

import torch

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def online_softmax_step(state: State, scores: torch.Tensor, values: torch.Tensor) -> State:
    """Fold one block of keys into a state.

    ``scores`` ``[..., block]`` are the new keys' scores, ``values`` ``[..., block, d]`` their
    values. ``m' = max(m, max_j s_j)``; the old sums are rescaled by ``alpha = exp(m - m')``:
    ``l' = alpha l + sum_j exp(s_j - m')`` and ``acc' = alpha acc + sum_j exp(s_j - m') v_j``.
    Starting from ``m = -inf`` (then ``alpha = 0``) works. A row with no allowed key so far
    (every score ``-inf``, so ``m' = -inf``) would give ``exp(-inf + inf) = NaN``: there the
    shift is 0 instead, so ``alpha`` and every ``p`` are ``exp(-inf) = 0`` and the row keeps the
    state over no keys, ``(-inf, 0, 0)``. Any number of leading dimensions.
    """
    m, l_sum, acc = state
    m_new = torch.maximum(m, scores.amax(dim=-1))
    shift = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - shift)
    p = torch.exp(scores - shift.unsqueeze(-1))
    return m_new, alpha * l_sum + p.sum(dim=-1), alpha.unsqueeze(-1) * acc + p @ values


def merge_softmax_states(state_a: State, state_b: State) -> State:
    """Merge two states computed over disjoint sets of keys into the state of their union.

    Both are rescaled to the common max ``m = max(m_a, m_b)``:
    ``l = exp(m_a - m) l_a + exp(m_b - m) l_b`` (``acc`` likewise).
    """
    m_a, l_a, acc_a = state_a
    m_b, l_b, acc_b = state_b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m_a - m), torch.exp(m_b - m)
    l_sum = scale_a * l_a + scale_b * l_b
    acc = scale_a.unsqueeze(-1) * acc_a + scale_b.unsqueeze(-1) * acc_b
    return m, l_sum, acc
