"""Worked solutions for notebook 01 (sinusoidal positions)."""

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
