"""Worked solutions for notebook 01 (sinusoidal positions and the online softmax)."""

from __future__ import annotations

import math

import torch


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``[num_positions, dim]``: ``PE[p, 2i] = sin(p w_i)``, ``PE[p, 2i+1] = cos(p w_i)``,
    ``w_i = base**(-2i/dim)`` (Vaswani et al. 2017, section 3.5)."""
    positions = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # [N, 1]
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [dim/2]
    angles = positions * inv_freq  # [N, dim/2]
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()
    return table.to(torch.float32)


def pair_rotation(shift: int, omega: float) -> torch.Tensor:
    """The ``[2, 2]`` matrix ``R`` with ``(sin((p+k)w), cos((p+k)w)) = R @ (sin(pw), cos(pw))``.

    From ``sin(a + b) = sin a cos b + cos a sin b`` and ``cos(a + b) = cos a cos b - sin a sin b``
    with ``b = k w``.
    """
    c, s = math.cos(shift * omega), math.sin(shift * omega)
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


def merge_softmax_states(
    state_a: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    state_b: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two partial softmax states over disjoint sets of keys.

    A state is ``(m [...], l [...], acc [..., d])``: the running max of the scores, the sum of
    ``exp(s - m)`` and the sum of ``exp(s - m) v``. Both are rescaled to the common max
    ``m = max(m_a, m_b)``: ``l = exp(m_a - m) l_a + exp(m_b - m) l_b`` (``acc`` likewise).
    """
    m_a, l_a, acc_a = state_a
    m_b, l_b, acc_b = state_b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m_a - m), torch.exp(m_b - m)
    l_sum = scale_a * l_a + scale_b * l_b
    acc = scale_a.unsqueeze(-1) * acc_a + scale_b.unsqueeze(-1) * acc_b
    return m, l_sum, acc
