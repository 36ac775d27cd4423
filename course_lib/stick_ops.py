"""Autograd wrapper around the stick-breaking attention kernels (``kernels/stick_breaking.py``).

``stick_breaking_attention(q, k, v, ...)`` computes, for q, k, v ``[batch, heads, seq, head_dim]``
(Tan et al. 2024, "Scaling Stick-Breaking Attention")::

    z_ij  = scale * q'_i . k'_j + b_ij
    A_ij  = sigmoid(z_ij) * prod_{allowed l strictly between j and i} (1 - sigmoid(z_il))
    out_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i

Key ``j`` is allowed for query ``i`` iff it is a real token (``key_padding_mask``) and, causal,
``j < i`` (by index; the query itself is never a key, so the first token outputs its own value).
Bidirectional: one stick over the left keys and one over the right keys, each from the nearest
key outward and each worth half. ``q'``, ``k'`` come from the caller's per-token tables and
``b`` from a named score-bias hook, exactly as in :func:`course_lib.flash_ops.flash_attention`
(RSE: RoPE tables and ``ScoreBias("linear_distance", lambda)``). Gradients flow to q, k, v and
``score_bias.per_head``.
"""

from __future__ import annotations

import torch

from course_lib.flash_ops import KernelCall, prepare_kernel_call
from course_lib.kernel_hooks import QKTables, ScoreBias
from course_lib.runtime import load_kernel_module

__all__ = ["stick_breaking_attention"]


class _StickBreakingFunction(torch.autograd.Function):
    """Forward saves q, k, v and the row statistics (each stick's total ``-log2``, ``S``, as a
    float32 pair); backward recomputes the tiles."""

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias_tensor: torch.Tensor | None,
        call: KernelCall,
        causal: bool,
    ) -> torch.Tensor:
        kernels = load_kernel_module("stick_breaking")
        options = dict(
            causal=causal,
            scale=call.scale,
            qk_tables=call.qk_tables,
            bias_hook=call.hook,
            bias_params=None if bias_tensor is None else bias_tensor.detach(),
        )
        out, rowstats = kernels.stick_breaking_forward(
            q, k, v, call.positions, call.mask, **options
        )
        ctx.save_for_backward(q, k, v, rowstats)
        ctx.call, ctx.options = call, options
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, rowstats = ctx.saved_tensors
        call = ctx.call
        kernels = load_kernel_module("stick_breaking")
        want_bias_grad = ctx.needs_input_grad[3]
        dq, dk, dv, dparams = kernels.stick_breaking_backward(
            grad_out, q, k, v, rowstats, call.positions, call.mask,
            bias_grad=want_bias_grad, **ctx.options,
        )  # fmt: skip
        d_bias = dparams.to(call.bias_tensor.dtype) if want_bias_grad else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_bias, None, None


def stick_breaking_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    scale: float | None = None,
    qk_tables: QKTables | None = None,
    score_bias: ScoreBias | None = None,
) -> torch.Tensor:
    """Fused stick-breaking attention; differentiable in q, k, v and ``score_bias.per_head``.

    Args:
        q, k, v: ``[batch, heads, seq, head_dim]``, one dtype of fp32/fp16/bf16, head_dim in
            {16, 32, 64, 128}, the same seq for queries and keys; any strides, read in place.
        causal: one stick over the keys ``j < i``; else two half sticks (left and right).
        key_padding_mask: bool ``[batch, seq]``, True for real tokens, or None. Padded keys get
            weight 0 and do not break the stick.
        position_ids: integer ``[seq]`` or ``[batch, seq]``; default ``arange(seq)``. Read by
            the score bias; the causal order is by index.
        scale: logit scale, default ``1/sqrt(head_dim)``.
        qk_tables: per-token q/k tables (``cos``, ``sin`` float32 ``[1 or batch, seq,
            head_dim/2]``, optional ``gain`` ``[head_dim]``, pair ``layout``), or None.
        score_bias: a named bias hook and its ``per_head`` tensor, or None. The hooks that only
            the flash kernels take (``"t5_buckets"``, ``"cumulative_log_gates"``) are refused
            with a ValueError.

    Returns:
        ``[batch, heads, seq, head_dim]`` in the input dtype.
    """
    call = prepare_kernel_call(
        q, k, v, kernel="stick-breaking", causal=causal, key_padding_mask=key_padding_mask,
        position_ids=position_ids, scale=scale, qk_tables=qk_tables, score_bias=score_bias,
    )  # fmt: skip
    return _StickBreakingFunction.apply(q, k, v, call.bias_tensor, call, causal)
