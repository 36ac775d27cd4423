"""Autograd wrapper around the CoPE attention kernels (``kernels/cope.py``).

``cope_attention(q, k, v, position_embeddings, ...)`` computes, for q, k, v ``[batch, heads,
seq, head_dim]`` and ``e = position_embeddings`` ``[npos, head_dim]`` (Golovneva et al. 2024)::

    s_ij = scale * q_i . k_j,   g_ij = sigmoid(s_ij),   p_ij = min(sum_{l=j..i} g_il, npos - 1)
    t_ij = s_ij + q_i . e[p_ij]   (interpolated between floor p and ceil p)
    out_i = sum_{j <= i} softmax_j(t_ij) v_j

causal only, keys of ``key_padding_mask`` False neither seen nor counted. The ``npos`` dot
products ``z = q e^T`` ``[batch, heads, seq, npos]`` are formed here with torch (O(seq * npos *
head_dim), under autograd), the kernel does the rest: the forward scans the keys nearest first
carrying the count; the backward gives ``dq`` (through the scores), ``dk``, ``dv`` and ``dz``, and
autograd carries ``dz`` on to ``q`` and ``e``. Forward and backward are both fused kernels; the
reference is never substituted for either.
"""

from __future__ import annotations

import math

import torch

from course_lib.checks import check_kernel_qkv, check_key_padding_mask
from course_lib.kernels.limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS
from course_lib.runtime import (
    check_kernel_tensors,
    first_derivative_only,
    kernel_compute_dtype,
    load_kernel_module,
)

__all__ = ["cope_attention"]


class _CoPEFunction(torch.autograd.Function):
    """Forward saves q, k, v, z, the output and its row log-sum-exp; backward recomputes tiles."""

    @staticmethod
    def forward(ctx, q, k, v, z, mask, scale, block):
        kernels = load_kernel_module("cope")
        out, lse = kernels.cope_forward(q, k, v, z, mask, scale=scale, block=block)
        ctx.save_for_backward(q, k, v, z, out, lse)
        ctx.mask, ctx.scale, ctx.block = mask, scale, block
        return out

    @staticmethod
    @first_derivative_only
    def backward(ctx, grad_out):
        q, k, v, z, out, lse = ctx.saved_tensors
        kernels = load_kernel_module("cope")
        dq, dk, dv, dz = kernels.cope_backward(
            grad_out, q, k, v, z, out, lse, ctx.mask, scale=ctx.scale, block=ctx.block
        )
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dz, None, None, None


def cope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position_embeddings: torch.Tensor,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    block: int | None = None,
) -> torch.Tensor:
    """Fused CoPE attention; differentiable in q, k, v and ``position_embeddings``.

    Args:
        q, k, v: ``[batch, heads, seq, head_dim]``, one dtype of fp32/fp16/bf16 (bf16 computed
            in float32 in Triton's interpreter, whose bf16 products are wrong), head_dim in
            {16, 32, 64, 128}, the same seq for queries and keys; any strides.
        position_embeddings: floating ``[npos, head_dim]``, ``npos >= 2``.
        causal: must be True (CoPE counts from the query back to the key).
        key_padding_mask: bool ``[batch, seq]``, True for real tokens, or None.
        scale: the scores' scale, default ``1/sqrt(head_dim)`` (``z = q . e`` is not scaled).
        block: force the tile size (a power of two >= 16), e.g. to test several key blocks.

    Returns:
        ``[batch, heads, seq, head_dim]`` in the input dtype.
    """
    if causal is not True:
        raise ValueError("the CoPE kernel is causal only: pass causal=True")
    check_kernel_qkv(q, k, v, kernel="CoPE", head_dims=KERNEL_HEAD_DIMS, dtypes=KERNEL_DTYPES)
    batch, _heads, seq, head_dim = q.shape
    e = position_embeddings
    if not isinstance(e, torch.Tensor) or not e.is_floating_point():
        raise TypeError("position_embeddings must be a floating-point tensor [npos, head_dim]")
    if e.dim() != 2 or e.shape[1] != head_dim or e.shape[0] < 2:
        raise ValueError(
            f"position_embeddings must be [npos >= 2, {head_dim}], got {tuple(e.shape)}"
        )
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}")
    mask = None
    if key_padding_mask is not None:
        check_key_padding_mask(key_padding_mask, batch, seq, q.device)
        mask = key_padding_mask.to(torch.int8).contiguous()
    check_kernel_tensors(q, k, v, e, mask)
    dtype = kernel_compute_dtype(q.dtype)  # bf16 in the interpreter: the float32 kernels
    inputs = [t.to(dtype) for t in (q, k, v)]
    # the position logits z stay float32 under autocast too (autocast would run this product
    # in the 16-bit dtype, and the kernel's counts need float32 logits)
    with torch.autocast(device_type=q.device.type, enabled=False):
        z = torch.matmul(
            inputs[0].float(), e.float().transpose(0, 1)
        ).contiguous()  # [B, H, N, npos]
    return _CoPEFunction.apply(*inputs, z, mask, scale, block).to(q.dtype)
