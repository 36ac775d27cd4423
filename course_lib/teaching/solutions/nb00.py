"""Worked solutions for notebook 00 (permutation invariance)."""

import math

import torch


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(mask(q k^T / sqrt(d))) v`` for ``[..., seq, d]`` inputs, where the mask sets the
    score of key ``j`` for query ``i`` to ``-inf`` when ``j > i`` (each query sees its prefix)."""
    seq = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [..., seq, seq]
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def undo_permutation(y_permuted: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Given ``y_permuted[i] = y[perm[i]]`` along dim -2, return ``y``."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    return y_permuted[..., inverse, :]
