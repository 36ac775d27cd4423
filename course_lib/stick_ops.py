"""Autograd wrapper around the stick-breaking attention kernels (``kernels/stick_breaking.py``).

``stick_breaking_attention(q, k, v, ...)`` computes, for q, k, v ``[batch, heads, seq, head_dim]``
(Tan et al. 2024, "Scaling Stick-Breaking Attention")::

    z_ij  = scale * q'_i . k'_j  -  lambda_h * |p_i - p_j|        (lambda term if given)
    A_ij  = sigmoid(z_ij) * prod_{allowed l strictly between j and i} (1 - sigmoid(z_il))
    out_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i

Key ``j`` is allowed for query ``i`` iff it is a real token (``key_padding_mask``) and, causal,
``j < i`` (by index; the query itself is never a key, so the first token outputs its own value).
Bidirectional: one stick over the left keys and one over the right keys, each from the nearest
key outward and each worth half. With ``rope=True``, ``q' = R(p) q`` and ``k' = R(p) k``
(see :func:`course_lib.encodings.apply_rope`); RSE is ``rope=True`` plus ``distance_penalty``.
Gradients flow to q, k, v and ``distance_penalty``.
"""

from __future__ import annotations

import math

import torch

from course_lib.checks import (
    KERNEL_HEAD_DIMS,
    check_choice,
    check_distance_penalty,
    check_kernel_qkv,
    check_key_padding_mask,
    check_position_ids,
    default_position_ids,
)
from course_lib.encodings import ROPE_STYLES, rope_angles
from course_lib.runtime import check_kernel_tensors, load_kernel_module

__all__ = ["STICK_HEAD_DIMS", "stick_breaking_attention"]

STICK_HEAD_DIMS = KERNEL_HEAD_DIMS


class _StickBreakingFunction(torch.autograd.Function):
    """Forward saves q, k, v and the row mass ``sum_j A_ij``; backward recomputes the tiles."""

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        distance_penalty: torch.Tensor | None,
        positions: torch.Tensor,
        key_mask: torch.Tensor | None,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        options: dict,
    ) -> torch.Tensor:
        kernels = load_kernel_module("stick_breaking")
        penalty = None if distance_penalty is None else distance_penalty.detach().float()
        tables = None if cos is None else (cos, sin)
        out, mass = kernels.stick_breaking_forward(
            q, k, v, positions, key_mask, penalty, tables, **options
        )
        ctx.save_for_backward(q, k, v, mass, penalty, positions, key_mask, cos, sin)
        ctx.options = options
        ctx.penalty_dtype = None if distance_penalty is None else distance_penalty.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, mass, penalty, positions, key_mask, cos, sin = ctx.saved_tensors
        kernels = load_kernel_module("stick_breaking")
        tables = None if cos is None else (cos, sin)
        dq, dk, dv, dpenalty = kernels.stick_breaking_backward(
            grad_out, q, k, v, mass, positions, key_mask, penalty, tables, **ctx.options
        )
        if dpenalty is not None and ctx.needs_input_grad[3]:
            dpenalty = dpenalty.to(ctx.penalty_dtype)
        else:
            dpenalty = None
        return (
            dq.to(q.dtype),
            dk.to(k.dtype),
            dv.to(v.dtype),
            dpenalty,
            None,
            None,
            None,
            None,
            None,
        )


def _prepare_positions(
    position_ids: torch.Tensor | None, batch: int, seq: int, device: torch.device
) -> torch.Tensor:
    """Integer ``[seq]`` or ``[batch, seq]`` (default arange) -> int64 ``[1 or batch, seq]``."""
    if position_ids is None:
        position_ids = default_position_ids(seq, device)
    return check_position_ids(position_ids, batch, seq, device).to(torch.int64).contiguous()


def _rope_tables(
    positions: torch.Tensor, head_dim: int, base: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``/``sin`` of the angles ``p * base**(-2t/head_dim)`` (float32 ``[1|B, seq, D/2]``)."""
    angles = rope_angles(positions, head_dim, base)
    return angles.cos().contiguous(), angles.sin().contiguous()


def stick_breaking_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    scale: float | None = None,
    rope: bool = False,
    rope_base: float = 10000.0,
    rope_style: str = "interleaved",
    distance_penalty: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused stick-breaking attention; differentiable in q, k, v and ``distance_penalty``.

    Args:
        q, k, v: ``[batch, heads, seq, head_dim]``, one dtype of fp32/fp16/bf16, head_dim in
            {16, 32, 64, 128}, the same seq for queries and keys.
        causal: one stick over the keys ``j < i``; else two half sticks (left and right).
        key_padding_mask: bool ``[batch, seq]``, True for real tokens, or None. Padded keys get
            weight 0 and do not break the stick.
        position_ids: integer ``[seq]`` or ``[batch, seq]``; default ``arange(seq)``. Used by
            RoPE and the distance penalty; the causal order is by index.
        scale: logit scale, default ``1/sqrt(head_dim)``.
        rope: rotate q and k (RoPE) before the dot product.
        rope_base: base of the rotary frequencies ``base**(-2t/head_dim)``.
        rope_style: "interleaved" pairs channels (2t, 2t+1); "half" pairs (t, t + head_dim/2).
        distance_penalty: lambda ``[heads]`` (floating, >= 0), subtracted as
            ``lambda_h * |p_i - p_j|`` from the logits; None for none.

    Returns:
        ``[batch, heads, seq, head_dim]`` in the input dtype.
    """
    check_kernel_qkv(q, k, v, kernel="stick-breaking")
    batch, heads, seq, head_dim = q.shape
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if not isinstance(rope, bool):
        raise TypeError(f"rope must be True or False, got {rope!r}")
    check_choice("rope_style", rope_style, ROPE_STYLES)
    rope_base = float(rope_base)
    if not (math.isfinite(rope_base) and rope_base > 0):
        raise ValueError(f"rope_base must be a positive finite number, got {rope_base}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}")
    positions = _prepare_positions(position_ids, batch, seq, q.device)
    mask = None
    if key_padding_mask is not None:
        check_key_padding_mask(key_padding_mask, batch, seq, q.device)
        mask = key_padding_mask.to(torch.int8).contiguous()
    if distance_penalty is not None:
        check_distance_penalty(distance_penalty, heads, q.device)
    check_kernel_tensors(q, k, v, positions, mask, distance_penalty)
    cos, sin = _rope_tables(positions, head_dim, rope_base) if rope else (None, None)
    options = {"causal": causal, "scale": scale, "half_style": rope_style == "half"}
    return _StickBreakingFunction.apply(
        q, k, v, distance_penalty, positions, mask, cos, sin, options
    )
