"""Autograd wrapper around the fused flash-attention kernels (``kernels/flash.py``).

``flash_attention(q, k, v, ...)`` computes, for q, k, v ``[batch, heads, seq, head_dim]``::

    out_i = sum_j softmax_j(scale * q'_i . k'_j + bias_ij  over allowed j) v_j

where key ``j`` is allowed for query ``i`` iff it is a real token (``key_padding_mask``) and,
when causal, ``j <= i`` (by index). ``position_mode`` picks the encoding of ``q'``, ``k'`` and
``bias`` ("none", "rope", "exposb"; see :mod:`course_lib.kernels.flash`). A query with no allowed
key outputs 0. Gradients flow to q, k and v.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from course_lib.checks import (
    KERNEL_HEAD_DIMS,
    check_choice,
    check_kernel_qkv,
    check_key_padding_mask,
    check_position_ids,
    default_position_ids,
)
from course_lib.encodings import ROPE_STYLES
from course_lib.runtime import check_kernel_tensors, load_kernel_module

__all__ = ["flash_attention", "FLASH_POSITION_MODES", "FLASH_HEAD_DIMS"]

FLASH_POSITION_MODES: tuple[str, ...] = ("none", "rope", "exposb")
FLASH_HEAD_DIMS = KERNEL_HEAD_DIMS


class _FlashAttentionFunction(torch.autograd.Function):
    """Forward saves q, k, v, out and the per-row log-sum-exp; backward recomputes the tiles."""

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        position_ids: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        options: dict,
    ) -> torch.Tensor:
        kernels = load_kernel_module("flash")
        out, lse = kernels.flash_attention_forward(
            q, k, v, position_ids, key_padding_mask, **options
        )
        ctx.save_for_backward(q, k, v, out, lse, position_ids, key_padding_mask)
        ctx.options = options
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse, position_ids, key_padding_mask = ctx.saved_tensors
        kernels = load_kernel_module("flash")
        dq, dk, dv = kernels.flash_attention_backward(
            grad_out.contiguous(),
            q,
            k,
            v,
            out,
            lse,
            position_ids,
            key_padding_mask,
            **ctx.options,
        )
        return dq, dk, dv, None, None, None


def _prepare_positions(
    position_ids: torch.Tensor | None, batch: int, seq: int, device: torch.device
) -> torch.Tensor:
    """Integer ``[seq]``, ``[1, seq]`` or ``[batch, seq]`` (default ``arange(seq)``) ->
    contiguous int32/int64 ``[batch, seq]``."""
    if position_ids is None:
        position_ids = default_position_ids(seq, device)
    position_ids = check_position_ids(position_ids, batch, seq, device).expand(batch, seq)
    if position_ids.dtype not in (torch.int32, torch.int64):
        position_ids = position_ids.to(torch.int64)
    return position_ids.contiguous()


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    position_mode: str = "none",
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    scale: float | None = None,
    rope_base: float = 10000.0,
    rope_style: str = "interleaved",
) -> torch.Tensor:
    """Fused flash attention with an optional position encoding; differentiable in q, k, v.

    Args:
        q, k, v: ``[batch, heads, seq, head_dim]``, one dtype of fp32/fp16/bf16, head_dim in
            {16, 32, 64, 128}, the same seq for queries and keys.
        position_mode: "none" (``scale * q.k``), "rope" (rotary q and k) or "exposb" (rotary with
            amplitude ``1 + 0.2 exp(-0.001 p)``, band-pass channel gain, and the logit bias
            ``log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))``).
        causal: key j is visible to query i only if ``j <= i`` (by index).
        key_padding_mask: bool ``[batch, seq]``, True for real tokens, or None.
        position_ids: integer ``[seq]``, ``[1, seq]`` or ``[batch, seq]``; default ``arange(seq)``.
        scale: logit scale, default ``1/sqrt(head_dim)``.
        rope_base: base of the rotary frequencies ``base**(-2t/head_dim)``.
        rope_style: "interleaved" pairs channels (2t, 2t+1); "half" pairs (t, t + head_dim/2).

    Returns:
        ``[batch, heads, seq, head_dim]`` in the input dtype; rows with no allowed key are 0.
    """
    if position_mode not in FLASH_POSITION_MODES:
        raise ValueError(
            f"position_mode must be one of {list(FLASH_POSITION_MODES)}, got {position_mode!r}"
        )
    check_choice("rope_style", rope_style, ROPE_STYLES)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    check_kernel_qkv(q, k, v, kernel="flash")
    batch, heads, seq, head_dim = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}")
    rope_base = float(rope_base)
    if not (math.isfinite(rope_base) and rope_base > 0):
        raise ValueError(f"rope_base must be a positive finite number, got {rope_base}")
    positions = _prepare_positions(position_ids, batch, seq, q.device)
    mask = None
    if key_padding_mask is not None:
        mask = check_key_padding_mask(key_padding_mask, batch, seq, q.device).contiguous()
    check_kernel_tensors(q, k, v, positions, mask)
    options = dict(
        position_mode=position_mode,
        causal=causal,
        scale=scale,
        rope_base=rope_base,
        rope_style=rope_style,
    )
    return _FlashAttentionFunction.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), positions, mask, options
    )
