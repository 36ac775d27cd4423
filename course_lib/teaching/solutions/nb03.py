"""Worked solutions for notebook 03 (RoPE)."""

from __future__ import annotations

import torch


def rotate_pair(
    x: torch.Tensor, y: torch.Tensor, angle: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the pair ``(x, y)`` by ``angle`` (all broadcastable): RoFormer eq. 13.

    ``(x, y) -> (x cos a - y sin a, x sin a + y cos a)``.
    """
    cos, sin = torch.cos(angle), torch.sin(angle)
    return x * cos - y * sin, x * sin + y * cos


def rope_half(x: torch.Tensor, position_ids: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE in the half convention: ``x`` ``[..., seq, D]``, ``position_ids`` ``[seq]``.

    Pair ``t`` is channels ``(t, t + D/2)``, rotated by ``p * base**(-2t/D)``.
    """
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float32) * 2 / x.shape[-1])
    angle = position_ids.to(torch.float32)[:, None] * inv_freq  # [seq, D/2]
    first, second = rotate_pair(x[..., :half], x[..., half:], angle)
    return torch.cat((first, second), dim=-1)


def decode_step(model, token_ids: torch.Tensor, cache) -> torch.Tensor:
    """One cached decoding step: logits ``[batch, vocab]`` of the last of ``token_ids``.

    The new tokens continue the positions of what the cache already holds.
    """
    past = cache[0].length
    positions = torch.arange(past, past + token_ids.shape[1])
    return model(token_ids, cache=cache, position_ids=positions).logits[:, -1]
