"""Worked solutions for notebook 00 (permutation invariance)."""

import math

import torch


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` for ``[..., seq, d]`` inputs."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def undo_permutation(y_permuted: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Given ``y_permuted[i] = y[perm[i]]`` along dim -2, return ``y``."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    return y_permuted[..., inverse, :]
