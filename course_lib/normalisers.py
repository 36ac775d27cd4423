"""The fourth place: how scores become attention weights (softmax, or stick-breaking).

Both take scores ``[..., seq_q, seq_k]`` and a bool ``allowed`` mask broadcastable to them (key
``j`` visible to query ``i``); queries are the last ``seq_q`` of the ``seq_k`` positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["softmax_weights", "stick_breaking_weights"]


def softmax_weights(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``A_ij = exp(s_ij) / sum_{allowed l} exp(s_il)`` on allowed keys, 0 elsewhere.

    A row with no allowed key gets all-zero weights (never NaN).
    """
    scores = torch.where(allowed, scores, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * allowed


def _exclusive_suffix_sum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{l > j} x[..., l]`` (shifted, so no subtraction and no cancellation)."""
    suffix = x.flip(-1).cumsum(-1).flip(-1)
    return F.pad(suffix[..., 1:], (0, 1))


def _exclusive_prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{l < j} x[..., l]``."""
    return F.pad(x.cumsum(-1)[..., :-1], (1, 0))


def _one_stick(z: torch.Tensor, allowed: torch.Tensor, nearest_is_last: bool) -> torch.Tensor:
    """Weights of one stick broken from the nearest allowed key outward.

    ``log A_j = logsigmoid(z_j) - sum_{allowed l between j and the query} softplus(z_l)``.
    """
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    z = torch.where(allowed, z, zero)
    log_keep = torch.where(allowed, F.softplus(z), zero)
    between = (
        _exclusive_suffix_sum(log_keep) if nearest_is_last else _exclusive_prefix_sum(log_keep)
    )
    log_weights = F.logsigmoid(z) - between
    return torch.where(allowed, log_weights.exp(), zero)


def stick_breaking_weights(
    logits: torch.Tensor,
    *,
    causal: bool = True,
    include_self: bool = False,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Stick-breaking attention weights from logits ``[..., seq_q, seq_k]``; same shape out.

    Causal: ``A[i, j] = sigmoid(z[i, j]) * prod_{j < l < i} (1 - sigmoid(z[i, l]))`` for ``j < i``
    (``j <= i`` with ``include_self``): the nearest key breaks off its share of the stick first
    (Tan et al. 2024, "Scaling Stick-Breaking Attention").
    Bidirectional (``causal=False``): one such stick over the keys left of ``i`` and one over the
    keys right of it, each broken from the nearest key outward and each given half the mass.
    Computed in log space (``log(1 - sigmoid(z)) = -softplus(z)``), so logits of any magnitude stay
    finite. Disallowed entries (the other side, or ``mask`` False, e.g. padded keys) get exactly 0
    and do not break the stick. Queries are the last ``seq_q`` of the ``seq_k`` positions.
    Each row sums to at most 1; what is left over is not returned.
    """
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    n_q, n_k = logits.shape[-2], logits.shape[-1]
    if n_q > n_k:
        raise ValueError(f"seq_q ({n_q}) must be <= seq_k ({n_k})")
    query_at = torch.arange(n_q, device=logits.device).unsqueeze(-1) + (n_k - n_q)
    key_at = torch.arange(n_k, device=logits.device)
    left = key_at <= query_at if include_self else key_at < query_at
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be bool (True = allowed), got {mask.dtype}")
        left = left & mask
    left = left.expand(logits.shape)
    weights = _one_stick(logits, left, nearest_is_last=True)
    if causal:
        return weights
    right = key_at >= query_at if include_self else key_at > query_at
    if mask is not None:
        right = right & mask
    right = right.expand(logits.shape)
    return 0.5 * (weights + _one_stick(logits, right, nearest_is_last=False))
