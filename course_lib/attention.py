"""Attention with a position signal: one function, five methods, two backends.

``attention(q, k, v, method=...)`` with q ``[batch, heads, seq_q, head_dim]`` and k, v
``[batch, heads, seq_k, head_dim]``. Queries are the last ``seq_q`` of the ``seq_k`` positions
(``seq_q == seq_k`` in training; ``seq_q < seq_k`` when decoding with a key/value cache), and
``position_ids`` give the position of every *key* (``[seq_k]`` or ``[batch, seq_k]``, default
``0..seq_k-1``); the queries take the last ``seq_q`` of them. ``causal`` masks by index.

Methods (``logits = scale * q'_i . k'_j``, ``scale = 1/sqrt(head_dim)`` by default):

* ``softmax``: no position signal (absolute/learned encodings add theirs before the projections).
* ``rope``: ``q' = R(p_i) q``, ``k' = R(p_j) k`` (see :func:`course_lib.encodings.apply_rope`).
* ``exposb``: ``q' = g * a(p_i) R(p_i) q`` (likewise k') and ``log f(|p_i - p_j|)`` added to the
  logits (see :func:`course_lib.encodings.apply_exposb`).
* ``stick_breaking``: stick-breaking weights instead of softmax; the leftover stick goes to the
  query's own value: ``out_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i``.
* ``rse``: RoPE, logits minus ``lambda_h * |p_i - p_j|`` (``distance_penalty``, ``[heads]``,
  ``>= 0``), then stick-breaking.

``backend="reference"`` is the from-scratch PyTorch code below; ``backend="triton"`` runs the fused
kernels (``course_lib.flash_ops`` / ``course_lib.stick_ops``), which compute the same function.
"""

from __future__ import annotations

import math

import torch

from course_lib.checks import (
    check_choice,
    check_distance_penalty,
    check_key_padding_mask,
    check_position_ids,
    check_qkv,
    default_position_ids,
)
from course_lib.encodings import (
    ROPE_STYLES,
    apply_exposb,
    apply_rope,
    exposb_distance_bias,
    stick_breaking_weights,
)

__all__ = ["METHODS", "BACKENDS", "attention", "attention_weights", "get_attention_class"]

METHODS = ("softmax", "rope", "exposb", "stick_breaking", "rse")
BACKENDS = ("reference", "triton")

# Extra keyword parameters each method accepts (besides scale).
_METHOD_PARAMS: dict[str, tuple[str, ...]] = {
    "softmax": (),
    "rope": ("base", "style"),
    "exposb": ("base", "style"),
    "stick_breaking": (),
    "rse": ("base", "style", "distance_penalty"),
}
_USES_POSITIONS = ("rope", "exposb", "rse")
_STICK_METHODS = ("stick_breaking", "rse")


def _check_params(method: str, params: dict) -> dict:
    allowed = _METHOD_PARAMS[method] + ("scale",)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise TypeError(
            f"method={method!r} takes no parameter(s) {', '.join(unknown)}; "
            f"it accepts: {', '.join(allowed)}"
        )
    out = {"scale": None, "base": 10000.0, "style": "interleaved", "distance_penalty": None}
    out.update(params)
    check_choice("RoPE style", out["style"], ROPE_STYLES)
    if method == "rse" and out["distance_penalty"] is None:
        raise ValueError("method='rse' needs distance_penalty: a tensor [heads] of lambda >= 0")
    return out


def _prepare(q, k, v, method, causal, key_padding_mask, position_ids, params):
    """Validate everything once; return (positions [1|B, seq_k] or None, params)."""
    check_choice("attention method", method, METHODS)
    check_qkv(q, k, v)
    params = _check_params(method, params)
    batch, heads, _, head_dim = q.shape
    seq_k = k.shape[2]
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if key_padding_mask is not None:
        check_key_padding_mask(key_padding_mask, batch, seq_k, q.device)
    if method in _USES_POSITIONS:
        if head_dim % 2:
            raise ValueError(
                f"method={method!r} rotates channel pairs: head_dim must be even, got {head_dim}"
            )
        if position_ids is None:
            position_ids = default_position_ids(seq_k, q.device)
        position_ids = check_position_ids(position_ids, batch, seq_k, q.device)
    elif position_ids is not None:
        raise ValueError(
            f"method={method!r} uses no position ids (absolute and learned encodings add theirs to "
            "the hidden states before the projections); pass position_ids=None"
        )
    if params["distance_penalty"] is not None:
        check_distance_penalty(params["distance_penalty"], heads, q.device)
    if params["scale"] is None:
        params["scale"] = 1.0 / math.sqrt(head_dim)
    return position_ids, params


def _allowed(batch, seq_q, seq_k, causal, strict, key_padding_mask, device):
    """Bool ``[batch or 1, 1, seq_q, seq_k]``: key j visible to query i."""
    query_at = torch.arange(seq_q, device=device).unsqueeze(-1) + (seq_k - seq_q)
    key_at = torch.arange(seq_k, device=device)
    allowed = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal:
        allowed = key_at < query_at if strict else key_at <= query_at
    allowed = allowed[None, None]
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    return allowed


def _weights(q, k, method, causal, key_padding_mask, position_ids, params):
    """Reference weights ``[batch, heads, seq_q, seq_k]`` in float32 (float64 for float64)."""
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k = q.to(dt), k.to(dt)
    seq_q, seq_k = q.shape[2], k.shape[2]
    if position_ids is not None:
        key_pos = position_ids
        query_pos = position_ids[:, seq_k - seq_q :]
        encode = apply_exposb if method == "exposb" else apply_rope
        q = encode(q, query_pos.expand(q.shape[0], -1), base=params["base"], style=params["style"])
        k = encode(k, key_pos.expand(k.shape[0], -1), base=params["base"], style=params["style"])
        distance = (
            (query_pos.unsqueeze(-1) - key_pos.unsqueeze(-2)).abs().unsqueeze(1)
        )  # [B,1,Nq,Nk]
    logits = torch.matmul(q, k.transpose(-1, -2)) * params["scale"]
    if method == "exposb":
        logits = logits + exposb_distance_bias(query_pos, key_pos).unsqueeze(1).to(dt)
    if method == "rse":
        lam = params["distance_penalty"].to(dt)
        logits = logits - lam.view(1, -1, 1, 1) * distance.to(dt)
    if method in _STICK_METHODS:
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        return stick_breaking_weights(logits, causal=causal, include_self=False, mask=mask)
    allowed = _allowed(q.shape[0], seq_q, seq_k, causal, False, key_padding_mask, q.device)
    logits = torch.where(allowed, logits, torch.finfo(dt).min)
    # A row with no visible key gets all-zero weights (never NaN).
    return torch.softmax(logits, dim=-1) * allowed


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    method: str = "softmax",
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    **params,
) -> torch.Tensor:
    """The reference attention matrix ``[batch, heads, seq_q, seq_k]`` (float32) of a method.

    For stick-breaking methods each row sums to at most 1 (the rest goes to the query's own value).
    """
    v = k  # only shapes matter for validation
    position_ids, params = _prepare(q, k, v, method, causal, key_padding_mask, position_ids, params)
    return _weights(q, k, method, causal, key_padding_mask, position_ids, params)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    method: str = "softmax",
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    backend: str = "reference",
    **params,
) -> torch.Tensor:
    """Attention output ``[batch, heads, seq_q, head_dim]`` like ``q``; see the module docstring.

    ``params``: ``scale`` (all methods), ``base`` and ``style`` (rope, exposb, rse),
    ``distance_penalty`` ``[heads]`` (rse).
    """
    check_choice("backend", backend, BACKENDS)
    position_ids, params = _prepare(q, k, v, method, causal, key_padding_mask, position_ids, params)
    if backend == "triton":
        return _triton(q, k, v, method, causal, key_padding_mask, position_ids, params)
    weights = _weights(q, k, method, causal, key_padding_mask, position_ids, params)
    values = v.to(weights.dtype)
    out = torch.matmul(weights, values)
    if method in _STICK_METHODS:
        own = values[:, :, k.shape[2] - q.shape[2] :]
        out = out + (1.0 - weights.sum(-1, keepdim=True)) * own
    return out.to(q.dtype)


def _triton(q, k, v, method, causal, key_padding_mask, position_ids, params):
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            "backend='triton' needs seq_q == seq_k (no key/value cache); "
            f"got seq_q={q.shape[2]}, seq_k={k.shape[2]}. Use backend='reference' for decoding."
        )
    if method in _STICK_METHODS:
        from course_lib.stick_ops import stick_breaking_attention

        return stick_breaking_attention(
            q, k, v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            position_ids=position_ids if method == "rse" else None,
            scale=params["scale"],
            rope=method == "rse",
            rope_base=params["base"],
            rope_style=params["style"],
            distance_penalty=params["distance_penalty"],
        )  # fmt: skip
    from course_lib.flash_ops import flash_attention

    return flash_attention(
        q, k, v,
        position_mode={"softmax": "none"}.get(method, method),
        causal=causal,
        key_padding_mask=key_padding_mask,
        position_ids=position_ids,
        scale=params["scale"],
        rope_base=params["base"],
        rope_style=params["style"],
    )  # fmt: skip


def get_attention_class(name: str):
    """The attention module class of an encoding: ``none | absolute | learned | rope | exposb | rse``.

    Every class takes ``(hidden_size, num_heads, max_position_embeddings=512, dropout=0.0,
    backend="reference")``. Unknown names raise a ValueError listing the valid ones.
    """
    from course_lib.layers import ATTENTION_CLASSES

    check_choice("encoding", name, ATTENTION_CLASSES)
    return ATTENTION_CLASSES[name]
