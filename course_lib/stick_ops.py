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
``b`` from a score-bias hook object, exactly as in :func:`course_lib.flash_ops.flash_attention`
(RSE: RoPE tables and the linear distance hook with lambda), through the same checks and the
same autograd function (:func:`course_lib.flash_ops.fused_attention`). Gradients flow to q, k, v
and the hook's tensor.
"""

from __future__ import annotations

import torch

from course_lib.flash_ops import STICK_BREAKING, fused_attention, prepare_kernel_call
from course_lib.kernel_hooks import QKTables, ScoreBias

__all__ = ["stick_breaking_attention"]


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
    """Fused stick-breaking attention; differentiable in q, k, v and the score bias's tensor.

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
        score_bias: a bias hook object and the tensor it reads, or None. The hooks that only
            the flash kernels take (``"t5_buckets"``, ``"cumulative_log_gates"``) are refused
            with a ValueError.

    Returns:
        ``[batch, heads, seq, head_dim]`` in the input dtype.
    """
    call = prepare_kernel_call(
        q, k, v, kernel="stick-breaking", causal=causal, key_padding_mask=key_padding_mask,
        position_ids=position_ids, scale=scale, qk_tables=qk_tables, score_bias=score_bias,
    )  # fmt: skip
    return fused_attention(STICK_BREAKING, q, k, v, call, causal)
