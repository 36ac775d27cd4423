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

from course_lib.encodings import rope_angles
from course_lib.runtime import check_kernel_tensors, load_kernel_module

__all__ = ["STICK_HEAD_DIMS", "stick_breaking_attention"]

STICK_HEAD_DIMS: tuple[int, ...] = (16, 32, 64, 128)
_ROPE_STYLES = ("interleaved", "half")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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


def _validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be [batch, heads, seq, head_dim] (4-D), got shape {tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"the stick-breaking kernel takes dtypes {list(_DTYPES)}, got {q.dtype}")
    if q.shape[2] != k.shape[2] or k.shape[2] != v.shape[2]:
        raise ValueError(
            "the stick-breaking kernel needs seq_q == seq_k (the leftover stick goes to the "
            f"query's own value), got seq_q={q.shape[2]}, seq_k={k.shape[2]}, seq_v={v.shape[2]}"
        )
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            "q, k, v must have the same shape [batch, heads, seq, head_dim], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    head_dim = q.shape[3]
    if head_dim not in STICK_HEAD_DIMS:
        raise ValueError(
            f"the stick-breaking kernel supports head_dim in {list(STICK_HEAD_DIMS)}, "
            f"got {head_dim}"
        )
    if q.shape[2] < 1:
        raise ValueError("the sequence is empty (seq = 0); stick-breaking needs seq >= 1")


def _prepare_positions(
    position_ids: torch.Tensor | None, batch: int, seq: int, device: torch.device
) -> torch.Tensor:
    """Integer ``[seq]`` or ``[batch, seq]`` (default arange) -> int64 ``[1 or batch, seq]``."""
    if position_ids is None:
        return torch.arange(seq, device=device, dtype=torch.int64).unsqueeze(0)
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be a torch.Tensor, got {type(position_ids).__name__}")
    if (
        position_ids.dtype == torch.bool
        or position_ids.dtype.is_floating_point
        or position_ids.dtype.is_complex
    ):
        raise TypeError(f"position_ids must be an integer tensor, got {position_ids.dtype}")
    if position_ids.dim() == 1 and position_ids.shape[0] == seq:
        position_ids = position_ids.unsqueeze(0)
    elif not (
        position_ids.dim() == 2
        and position_ids.shape[1] == seq
        and position_ids.shape[0] in (1, batch)
    ):
        raise ValueError(
            f"position_ids must be [seq]=[{seq}] or [batch, seq]=[{batch}, {seq}], "
            f"got shape {tuple(position_ids.shape)}"
        )
    if position_ids.device != device:
        raise ValueError(
            f"position_ids must be on {device} like q, got a tensor on {position_ids.device}"
        )
    return position_ids.to(torch.int64).contiguous()


def _prepare_mask(
    key_padding_mask: torch.Tensor | None, batch: int, seq: int, device: torch.device
) -> torch.Tensor | None:
    """Bool ``[batch, seq]`` (True = real token) -> contiguous int8, or None."""
    if key_padding_mask is None:
        return None
    if not isinstance(key_padding_mask, torch.Tensor):
        raise TypeError(
            f"key_padding_mask must be a bool torch.Tensor, got {type(key_padding_mask).__name__}"
        )
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be bool (True = real token), got {key_padding_mask.dtype}"
        )
    if tuple(key_padding_mask.shape) != (batch, seq):
        raise ValueError(
            f"key_padding_mask must be [batch, seq]=[{batch}, {seq}], "
            f"got shape {tuple(key_padding_mask.shape)}"
        )
    if key_padding_mask.device != device:
        raise ValueError(
            f"key_padding_mask must be on {device} like q, got a tensor on "
            f"{key_padding_mask.device}"
        )
    return key_padding_mask.to(torch.int8).contiguous()


def _validate_penalty(
    distance_penalty: torch.Tensor | None, heads: int, device: torch.device
) -> None:
    if distance_penalty is None:
        return
    if not isinstance(distance_penalty, torch.Tensor) or not distance_penalty.is_floating_point():
        raise TypeError(
            "distance_penalty must be a floating-point tensor [heads] (lambda >= 0), got "
            f"{getattr(distance_penalty, 'dtype', type(distance_penalty).__name__)}"
        )
    if tuple(distance_penalty.shape) != (heads,):
        raise ValueError(
            f"distance_penalty must have shape [heads] = [{heads}], "
            f"got {tuple(distance_penalty.shape)}"
        )
    if distance_penalty.device != device:
        raise ValueError(
            f"distance_penalty must be on {device} like q, got a tensor on "
            f"{distance_penalty.device}"
        )
    lam = distance_penalty.detach()
    if not bool(torch.isfinite(lam).all()):
        raise ValueError("distance_penalty (lambda) must be finite")
    if bool((lam < 0).any()):
        raise ValueError("distance_penalty (lambda) must be >= 0: it penalises distance")


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
    _validate_qkv(q, k, v)
    batch, heads, seq, head_dim = q.shape
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if not isinstance(rope, bool):
        raise TypeError(f"rope must be True or False, got {rope!r}")
    if rope_style not in _ROPE_STYLES:
        raise ValueError(f"rope_style must be one of {list(_ROPE_STYLES)}, got {rope_style!r}")
    rope_base = float(rope_base)
    if not (math.isfinite(rope_base) and rope_base > 0):
        raise ValueError(f"rope_base must be a positive finite number, got {rope_base}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}")
    positions = _prepare_positions(position_ids, batch, seq, q.device)
    mask = _prepare_mask(key_padding_mask, batch, seq, q.device)
    _validate_penalty(distance_penalty, heads, q.device)
    check_kernel_tensors(q, k, v, positions, mask, distance_penalty)
    cos, sin = _rope_tables(positions, head_dim, rope_base) if rope else (None, None)
    options = {"causal": causal, "scale": scale, "half_style": rope_style == "half"}
    return _StickBreakingFunction.apply(
        q, k, v, distance_penalty, positions, mask, cos, sin, options
    )
