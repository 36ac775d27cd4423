"""Contextual position encoding, CoPE (Golovneva, Wang, Weston & Sukhbaatar 2024) (chapter 08).

Positions are not token indices but *counts*: query ``i`` decides, with a gate per key read off
its own scores, which keys count, and the position of key ``j`` is how many counted keys lie
between ``j`` and ``i`` (``j`` and ``i`` included). For one head, with ``s_ij = scale * q_i . k_j``
the scaled scores and ``allowed`` the keys query ``i`` may see (``j <= i``, real tokens)::

    g_ij = sigmoid(s_ij)                       (0 for keys it may not see)
    p_ij = min( sum_{l=j..i} g_il , npos - 1 )  (a suffix sum along the row: the count)
    z_i[n] = q_i . e[n]                        (n = 0 .. npos-1; q unscaled)
    b_ij = (1 - w) z_i[floor p_ij] + w z_i[ceil p_ij],   w = p_ij - floor p_ij
    A_i = softmax_{j <= i}(s_ij + b_ij)

``e`` (``position_embeddings`` ``[npos, head_dim]``) is learned, one table per layer shared by
its heads, and starts at zero (the layer starts as plain causal attention). The count is a real
number, so ``e[p]`` is interpolated between the two nearest integer positions; computing the
``npos`` dot products ``z_i = q_i . e`` first and interpolating the scalars costs
``O(seq * npos * head_dim)`` instead of a vector per pair (the paper's appendix B). Gradients flow
to the gates through ``w`` (``d b / d p = z_i[ceil p] - z_i[floor p]``, zero where the count is
clamped), to ``q`` through the scores and ``z``, and to ``e``.

The gate of key ``j`` counts key ``j`` itself, so ``p_ii = g_ii`` and the count grows with
distance; when every gate is 1, ``p_ij = i - j + 1`` (capped at ``npos - 1``) and CoPE is a
relative position bias indexed by distance; when the gates fire only on some tokens (say,
separators), ``p_ij`` counts those tokens: "the 2nd sentence back", not "40 tokens back".

Causal only (the count runs from the query back to the key). Position ids are never read: the
record's shift claim (``relative``) holds because nothing depends on them.
"""

from __future__ import annotations

import torch
from torch import nn

from course_lib.checks import any_true, check_float_tensor, is_integer
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register

__all__ = [
    "CoPEAttention",
    "cope_bias",
    "contextual_positions",
    "interpolate_position_logits",
]


def contextual_positions(scores: torch.Tensor, allowed: torch.Tensor, npos: int) -> torch.Tensor:
    """``p_ij = min(sum_{l=j..i} sigmoid(s_il) [l allowed], npos - 1)``: ``[..., Nq, Nk]``.

    ``scores`` ``[..., seq_q, seq_k]`` (scaled); ``allowed`` bool, broadcastable to them (the keys
    each query may see: keys it may not see neither count nor are counted). The sum over the
    keys from ``j`` to the end of the row is a reversed cumulative sum; the keys after the query
    are not allowed, so it stops at ``i``.
    """
    gates = torch.sigmoid(scores) * allowed
    counts = gates.flip(-1).cumsum(-1).flip(-1)  # sum_{l >= j} g_il
    return counts.clamp(max=npos - 1)


def interpolate_position_logits(z: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``z[floor p] (1 - w) + z[ceil p] w`` with ``w = p - floor p``, row by row.

    ``z`` ``[..., Nq, npos]`` (``z_i[n] = q_i . e[n]``), ``positions`` ``[..., Nq, Nk]`` in
    ``[0, npos - 1]`` -> ``[..., Nq, Nk]``. Differentiable in ``z`` and in ``positions``
    (``d/dp = z[ceil p] - z[floor p]``; 0 at an integer). A position outside ``[0, npos - 1]``
    has no logit to read and is refused (:func:`contextual_positions` caps its counts at
    ``npos - 1``); a NaN one gives NaN.
    """
    npos = z.shape[-1]
    if positions.is_complex() or not positions.is_floating_point():
        raise TypeError(
            f"positions must be a real floating-point tensor (counts, read between integer "
            f"positions), got {positions.dtype}"
        )
    if any_true((positions < 0) | (positions > npos - 1)):  # one read
        finite = positions.detach()[~torch.isnan(positions.detach())]
        raise ValueError(
            f"positions must lie in [0, npos - 1] = [0, {npos - 1}] (z holds npos={npos} logits "
            f"per query), got values from {finite.min().item():g} to {finite.max().item():g}; "
            "cap the counts at npos - 1 as contextual_positions does"
        )
    lower = positions.floor()
    w = positions - lower
    z = z.expand(*positions.shape[:-1], z.shape[-1])
    # A NaN count (from NaN scores) has no row to read: read row 0 there and let w carry the NaN
    # to the result, as every other method propagates NaN input.
    z_lower = z.gather(-1, _row_index(lower, z.shape[-1]))
    z_upper = z.gather(-1, _row_index(positions.ceil(), z.shape[-1]))
    return z_lower * (1 - w) + z_upper * w


def _row_index(rows: torch.Tensor, npos: int) -> torch.Tensor:
    """Integer row numbers in ``[0, npos - 1]`` from whole-number floats (NaN -> 0)."""
    return rows.nan_to_num(0.0).clamp(0, npos - 1).long()


def cope_bias(scores: torch.Tensor, q: torch.Tensor, allowed: torch.Tensor, params: dict):
    """q_i . e[p_ij] with p_ij = sum_{l=j..i} sigmoid(s_il), interpolated between integer positions

    ``scores`` ``[B, H, Nq, Nk]`` (scaled), ``q`` ``[B, H, Nq, D]`` (unscaled), ``allowed`` bool
    broadcastable to the scores, ``params["position_embeddings"]`` ``[npos, D]`` -> the bias
    ``[B, H, Nq, Nk]`` (any value where not allowed: the softmax masks it).
    """
    table = params["position_embeddings"].to(q.dtype)  # [npos, D]
    positions = contextual_positions(scores, allowed, table.shape[0])  # [B, H, Nq, Nk]
    z = torch.matmul(q, table.transpose(0, 1))  # [B, H, Nq, npos]
    return interpolate_position_logits(z, positions)


def check_cope_params(params: dict, *, head_dim: int, device, **call) -> None:
    """``position_embeddings``: a finite floating ``[npos, head_dim]`` tensor, ``npos >= 2``."""
    table = params["position_embeddings"]
    check_float_tensor(table, "position_embeddings", "[npos, head_dim]", device)
    if table.dim() != 2 or table.shape[1] != head_dim:
        raise ValueError(
            f"position_embeddings must have shape [npos, head_dim] = [npos, {head_dim}] (one "
            f"vector per counted position, as wide as q), got {tuple(table.shape)}"
        )
    if table.shape[0] < 2:
        raise ValueError(
            f"position_embeddings needs npos >= 2 rows (counts are interpolated between two "
            f"integer positions), got npos = {table.shape[0]}"
        )


def cope_kernel_attention(q, k, v, *, causal, key_padding_mask, position_ids, scale, params):
    """The Triton backend: CoPE's own kernel family (:mod:`course_lib.cope_ops`)."""
    from course_lib.cope_ops import cope_attention

    return cope_attention(
        q, k, v, params["position_embeddings"],
        causal=causal, key_padding_mask=key_padding_mask, scale=scale,
    )  # fmt: skip


class CoPEAttention(PositionalSelfAttention):
    """Causal softmax attention with CoPE: positions counted by gates, one learned table.

    ``position_embeddings``: ``[npos, head_dim]``, shared by the heads of the layer, zeros at
    the start (so the layer starts as plain causal attention). ``npos`` (default
    ``max_position_embeddings``): counts above ``npos - 1`` are clamped to it, so it is the
    largest count the layer can tell apart, not a sequence length.
    """

    encoding = "cope"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        npos: int | None = None,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        npos = max_position_embeddings if npos is None else npos
        if not is_integer(npos) or npos < 2:
            raise ValueError(
                f"npos must be an integer >= 2 (counts are interpolated between two integer "
                f"positions), got {npos!r}"
            )
        self.npos = npos = int(npos)
        self.position_embeddings = nn.Parameter(torch.zeros(npos, self.head_dim))

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"position_embeddings": self.position_embeddings}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, npos={self.npos}"


register(
    Encoding(
        name="cope",
        chapter="08_positions_from_content",
        summary="positions counted by gates read off the scores, a learned vector per count",
        module=CoPEAttention,
        color="#5254a3",
        score_bias_from_scores=cope_bias,
        params={"position_embeddings": REQUIRED},
        check_params=check_cope_params,
        kernel_attention=cope_kernel_attention,
        speed_variants=({"npos": 64},),  # the course's models count up to 63
        relative=True,  # position ids are never read: shifting them changes nothing
        causal_only=True,
        learnable=True,
    )
)
