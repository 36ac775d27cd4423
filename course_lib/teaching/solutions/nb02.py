"""Worked solutions for notebook 02 (learned positions)."""

from __future__ import annotations

import torch


def attention_parameters(hidden_size: int, max_positions: int, encoding: str) -> int:
    """Trainable parameters of one course attention layer.

    Four ``hidden x hidden`` projections with biases (query, key, value, output):
    ``4 * (hidden**2 + hidden)``; the learned encoding adds its table, ``max_positions * hidden``;
    the sinusoidal one adds nothing.
    """
    projections = 4 * (hidden_size * hidden_size + hidden_size)
    table = max_positions * hidden_size if encoding == "learned" else 0
    return projections + table


def interpolate_table(table: torch.Tensor, new_size: int) -> torch.Tensor:
    """Stretch ``[old, hidden]`` to ``[new_size, hidden]`` by linear interpolation.

    New row ``r`` reads the old table at ``x = r * (old - 1) / (new_size - 1)`` (first and last
    rows stay where they are): ``(1 - f) * table[floor(x)] + f * table[floor(x) + 1]``,
    ``f = x - floor(x)``.
    """
    old = table.shape[0]
    x = torch.arange(new_size, dtype=torch.float64) * (old - 1) / (new_size - 1)
    low = x.floor().long().clamp(max=old - 1)
    high = (low + 1).clamp(max=old - 1)
    frac = (x - low).unsqueeze(1).to(table.dtype)
    return (1 - frac) * table[low] + frac * table[high]
