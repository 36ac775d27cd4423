"""Worked solutions for notebook 07 (RoPE past its training length)."""

from __future__ import annotations

import math

import torch


def ntk_inverse_frequencies(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """NTK-aware scaling (bloc97 2023): plain RoPE with the base ``base * s**(D/(D-2))``.

    ``theta_t = (base * s**(D/(D-2)))**(-2t/D)`` for ``t = 0..D/2-1`` (float32): the fastest
    pair (``t = 0``) keeps ``theta_0 = 1``; the slowest (``t = D/2-1``) is divided by exactly
    ``s``, because ``(s**(D/(D-2)))**(-(D-2)/D) = 1/s``.
    """
    new_base = base * factor ** (head_dim / (head_dim - 2))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (new_base**-exponents).to(torch.float32)


def yarn_interpolation_share(
    head_dim: int,
    base: float,
    train_len: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    """YaRN's ramp in Hugging Face's form: for each pair, the share of ``theta_t / s`` in
    ``theta'_t = (1 - share) theta_t + share theta_t / s`` (0: kept, 1: interpolated).

    The pair (as a real number) that turns ``b`` times in ``L`` tokens solves
    ``L theta_t / (2 pi) = b``: ``t(b) = D ln(L / (2 pi b)) / (2 ln base)``. The ramp runs
    linearly in the pair index from ``low = floor(t(beta_fast))`` to ``high = ceil(t(beta_slow))``
    (clamped to ``[0, D-1]``; equal ends get ``high += 0.001``).
    """

    def pair_turning(turns: float) -> float:
        return head_dim * math.log(train_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    t = torch.arange(head_dim // 2, dtype=torch.float64)
    return ((t - low) / (high - low)).clamp(0.0, 1.0)


def dynamic_base(base: float, head_dim: int, factor: float, seq_len: int, train_len: int) -> float:
    """Dynamic NTK's base at the current length ``n`` (Hugging Face's rule).

    ``base * (s n / L - (s - 1))**(D/(D-2))`` with ``n = max(seq_len, L)``: plain RoPE up to
    ``L``, then the NTK base of the effective factor ``s n / L - (s - 1)``.
    """
    n = max(seq_len, train_len)
    return base * (factor * n / train_len - (factor - 1)) ** (head_dim / (head_dim - 2))
