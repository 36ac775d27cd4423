"""Attention with a position signal: one reference function that composes the four places.

``attention(q, k, v, method=...)`` with q ``[batch, heads, seq_q, head_dim]`` and k, v
``[batch, heads, seq_k, head_dim]``. Queries are the last ``seq_q`` of the ``seq_k`` positions
(``seq_q == seq_k`` in training; ``seq_q < seq_k`` when decoding with a key/value cache), and
``position_ids`` give the position of every *key* (``[seq_k]`` or ``[batch, seq_k]``, default
``0..seq_k-1``); the queries take the last ``seq_q`` of them. ``causal`` masks by index.

``method`` is ``"softmax"`` (no position signal inside attention: the none, absolute and learned
encodings) or the name of any registered encoding that acts inside attention (see
:func:`course_lib.registry.attention_methods`). Its record supplies the parts::

    q'_i = T(p_i) q_i,   k'_j = T_k(p_j) k_j            # 2. per-token transform (or none;
                                                         #    T_k = T unless keys have their own)
    s_ij = scale * q'_i . k'_j + b(p_i, p_j)             # 3. score bias (or none)
    s_ij = s_ij + c(s, q')_ij                            #    a bias read off the scores (CoPE)
    A_i  = softmax(s_i)  or  stick-breaking(s_i)          # 4. normaliser, over visible keys
    out_i = sum_j A_ij v_j  (+ (1 - sum_j A_ij) v_i for stick-breaking: the leftover stick)

``scale = 1/sqrt(head_dim)`` unless given (a finite number > 0). A padded key
(``key_padding_mask`` False) gets weight 0, and its k and v rows are zeroed first, so it
contributes nothing whatever it holds; an empty batch or sequence gives the empty output.
``backend="reference"`` is the from-scratch PyTorch code below (it forms the ``[seq_q, seq_k]``
matrices, and refuses, before allocating, sizes whose buffers exceed the machine's memory);
``backend="triton"`` runs the fused kernels with the tables and bias the record's kernel hooks build
(``course_lib.flash_ops`` / ``course_lib.stick_ops``): the same function.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import torch

from course_lib.call_scope import call_scope, settle
from course_lib.checks import (
    check_choice,
    check_key_padding_mask,
    check_position_ids,
    check_qkv,
    check_scale,
    check_tensor_params,
    default_position_ids,
)
from course_lib.kernel_hooks import distance_score_bias
from course_lib.normalisers import softmax_weights, stick_breaking_weights
from course_lib.registry import (
    NORMALISER_NAMES,
    REQUIRED,
    Encoding,
    attention_methods,
    get_encoding,
)

__all__ = ["BACKENDS", "attention", "attention_weights", "get_attention_class"]

BACKENDS = ("reference", "triton")


def _params_for(method: str, encoding: Encoding | None, given: dict) -> dict:
    """The record's defaults, overridden by ``given``; unknown or missing ones raise."""
    defaults = {} if encoding is None else dict(encoding.params)
    accepted = [*defaults, "scale"]
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise TypeError(
            f"method={method!r} takes no parameter(s) {', '.join(unknown)}; "
            f"it accepts: {', '.join(accepted)}"
        )
    params = {**defaults, "scale": None, **given}
    missing = [name for name, value in params.items() if value is REQUIRED]
    if missing:
        raise ValueError(f"method={method!r} needs {', '.join(missing)} (see its docstring)")
    return params


def _prepare(q, k, v, method, causal, key_padding_mask, position_ids, params):
    """Validate everything once; return (encoding or None, key positions or None, params, k, v).

    Padded keys' rows of k and v come back zeroed: a padded key gets weight 0, and with its
    rows zeroed it contributes exactly nothing whatever it held (0 * NaN would be NaN), on both
    backends. ``scale`` is checked (None or a finite number > 0) and every tensor parameter is
    checked for finiteness (:func:`course_lib.checks.check_tensor_params`) before the method's
    own ``check_params``.
    """
    methods = attention_methods()
    check_choice("attention method", method, methods)
    encoding = methods[method]
    check_qkv(q, k, v)
    params = _params_for(method, encoding, params)
    params["scale"] = check_scale(params["scale"])
    check_tensor_params(method, params, q.device)
    batch, heads, _, head_dim = q.shape
    seq_k = k.shape[2]
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if encoding is not None and encoding.causal_only and not causal:
        raise ValueError(f"method={method!r} is causal only: pass causal=True")
    if key_padding_mask is not None:
        check_key_padding_mask(key_padding_mask, batch, seq_k, q.device)
        padded = ~key_padding_mask[:, None, :, None]  # [B, 1, Nk, 1]
        k, v = k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)
    if encoding is not None and encoding.uses_positions:
        dims = encoding.position_dims
        if position_ids is None and dims == 1:
            position_ids = default_position_ids(seq_k, q.device)
        elif position_ids is None:
            raise ValueError(
                f"method={method!r} needs position_ids [seq, {dims}] or [batch, seq, {dims}]: "
                f"{dims} coordinates per token (e.g. the row and column of an image patch)"
            )
        position_ids = check_position_ids(position_ids, batch, seq_k, q.device, dims)
    elif position_ids is not None:
        raise ValueError(
            f"method={method!r} uses no position ids (absolute and learned encodings add theirs to "
            "the hidden states before the projections); pass position_ids=None"
        )
    elif encoding is not None and (encoding.qk_transform or encoding.score_bias):
        # hooks that read no position (FoX's gates) still get the token indices, for shapes
        position_ids = check_position_ids(default_position_ids(seq_k, q.device), 1, seq_k, q.device)
    if encoding is not None and encoding.check_params is not None:
        encoding.check_params(
            params,
            heads=heads,
            head_dim=head_dim,
            device=q.device,
            causal=causal,
            positions=position_ids,
            batch=batch,
        )
    settle()  # the queued value checks, read in one transfer: an error comes before any work
    if params["scale"] is None:
        params["scale"] = 1.0 / math.sqrt(head_dim)
    return encoding, position_ids, params, k, v


#: How many ``[seq_q, seq_k]`` float32 buffers per (batch, head) the reference holds at once,
#: at the least (scores, bias, masked scores, weights and their temporaries: 5 to 7 measured for
#: the plain methods without gradients; T5's buckets, RSE and CoPE hold 11 to 20).
REFERENCE_BUFFERS = 6


def machine_memory(device: torch.device) -> int | None:
    """Bytes of memory ``device`` has in all (a CUDA device's, or this machine's RAM, lowered
    to a cgroup limit where one is set), or None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type != "cpu":
        return None
    return _ram_bytes()


def _ram_bytes() -> int | None:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = int(Path(limit_file).read_text().strip())
        except (OSError, ValueError):  # absent, or "max"
            continue
        total = min(total, limit)
    return total


def _check_reference_memory(q: torch.Tensor, k: torch.Tensor) -> None:
    """Refuse, before allocating, a reference call whose ``[batch, heads, seq_q, seq_k]``
    buffers clearly exceed the memory of the machine (:data:`REFERENCE_BUFFERS` of them)."""
    batch, heads, seq_q, _ = q.shape
    itemsize = 8 if q.dtype == torch.float64 else 4
    one = batch * heads * seq_q * k.shape[2] * itemsize
    need = REFERENCE_BUFFERS * one
    if need < 2**30:  # never worth a look below 1 GiB
        return
    total = machine_memory(q.device)
    if total is not None and need > total:
        where = "this machine's memory" if q.device.type == "cpu" else f"memory on {q.device}"
        raise ValueError(
            f"backend='reference' forms the attention matrix: batch {batch} x heads {heads} x "
            f"seq_q {seq_q} x seq_k {k.shape[2]} scores take {_gib(one)} per buffer, and it "
            f"holds about {REFERENCE_BUFFERS} such buffers at once ({_gib(need)}), more than "
            f"the {_gib(total)} of {where}. Use backend='triton' (the fused "
            "kernels never form the matrix), shorter sequences, or fewer sequences per call"
        )


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"


def _visible(seq_q, seq_k, causal, key_padding_mask, device):
    """Bool ``[batch or 1, 1, seq_q, seq_k]``: key j visible to query i (softmax; j <= i)."""
    query_at = torch.arange(seq_q, device=device).unsqueeze(-1) + (seq_k - seq_q)
    key_at = torch.arange(seq_k, device=device)
    visible = key_at <= query_at if causal else torch.ones(seq_q, seq_k, dtype=torch.bool)
    visible = visible.to(device)[None, None]
    if key_padding_mask is not None:
        visible = visible & key_padding_mask[:, None, None, :]
    return visible


def _weights(q, k, encoding, causal, key_padding_mask, key_pos, params):
    """Reference weights ``[batch, heads, seq_q, seq_k]`` in float32 (float64 for float64)."""
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k = q.to(dt), k.to(dt)  # [B, H, Nq, D], [B, H, Nk, D]
    seq_q, seq_k = q.shape[2], k.shape[2]
    query_pos = None if key_pos is None else key_pos[:, seq_k - seq_q :]  # [1|B, Nq(, 2)]
    # 2. per-token transform: q'_i = T(p_i) q_i, k'_j = T_k(p_j) k_j (T_k: the keys' own or T)
    if encoding is not None and encoding.qk_transform is not None:
        q = encoding.qk_transform(q, query_pos, params)
        k = (encoding.key_transform or encoding.qk_transform)(k, key_pos, params)
    # 3. scores and the encoding's bias: s_ij = scale * q'_i . k'_j + b(p_i, p_j)
    scores = torch.matmul(q, k.transpose(-1, -2)) * params["scale"]  # [B, H, Nq, Nk]
    if encoding is not None and encoding.score_bias is not None:
        scores = scores + encoding.score_bias(query_pos, key_pos, params).to(dt)
    # ... and a bias computed from the scores themselves and q' (softmax only): s_ij += c(s, q')_ij
    if encoding is not None and encoding.score_bias_from_scores is not None:
        allowed = _visible(seq_q, seq_k, causal, key_padding_mask, q.device)
        scores = scores + encoding.score_bias_from_scores(scores, q, allowed, params).to(dt)
    # 4. the normaliser, over the keys each query may see
    if encoding is not None and encoding.normaliser == "stick_breaking":
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        return stick_breaking_weights(scores, causal=causal, include_self=False, mask=mask)
    return softmax_weights(scores, _visible(seq_q, seq_k, causal, key_padding_mask, q.device))


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    method: str = "softmax",
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    normaliser: str | None = None,
    **params,
) -> torch.Tensor:
    """The reference attention matrix ``[batch, heads, seq_q, seq_k]`` (float32) of a method.

    For stick-breaking methods each row sums to at most 1 (the rest goes to the query's own value).
    """
    with call_scope():  # a value checked once in this call is not read again
        encoding, key_pos, params, k, _ = _prepare(
            q, k, k, method, causal, key_padding_mask, position_ids, params
        )  # k stands in for v: only its shape is checked
        encoding = _with_normaliser(encoding, method, normaliser)
        _check_reference_memory(q, k)
        return _weights(q, k, encoding, causal, key_padding_mask, key_pos, params)


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
    normaliser: str | None = None,
    **params,
) -> torch.Tensor:
    """Attention output ``[batch, heads, seq_q, head_dim]`` like ``q``; see the module docstring.

    ``params``: ``scale`` (every method) and the method's own (its record's ``params``, e.g.
    ``base`` and ``style`` for RoPE, ``distance_penalty`` ``[heads]`` for RSE). ``normaliser``
    (``"softmax"`` or ``"stick_breaking"``) replaces the method's own in the fourth place, the
    other three unchanged (None: the record's); both backends honour it.
    """
    check_choice("backend", backend, BACKENDS)
    with call_scope():  # a value checked once in this call is not read again
        return _attention(
            q, k, v, method, causal, key_padding_mask, position_ids, backend, normaliser, params
        )


def _attention(q, k, v, method, causal, key_padding_mask, position_ids, backend, normaliser,
               params):  # fmt: skip
    encoding, key_pos, params, k, v = _prepare(
        q, k, v, method, causal, key_padding_mask, position_ids, params
    )
    encoding = _with_normaliser(encoding, method, normaliser)
    # An empty batch or sequence has nothing to compute: both backends give the empty answer
    # (the code below handles empty tensors; no kernel is launched).
    if backend == "triton" and q.numel() > 0:
        return _triton(q, k, v, method, encoding, causal, key_padding_mask, key_pos, params)
    _check_reference_memory(q, k)
    weights = _weights(q, k, encoding, causal, key_padding_mask, key_pos, params)
    values = v.to(weights.dtype)
    out = torch.matmul(weights, values)  # [B, H, Nq, D]
    if encoding is not None and encoding.normaliser == "stick_breaking":
        own = values[:, :, k.shape[2] - q.shape[2] :]  # the leftover stick: the query's own value
        out = out + (1.0 - weights.sum(-1, keepdim=True)) * own
    return out.to(q.dtype)


def _triton(q, k, v, method, encoding, causal, key_padding_mask, key_pos, params):
    """The fused kernels, given the tables and bias the encoding's kernel hooks build.

    Everything was checked by :func:`_prepare` (positions included, once): the kernel wrappers'
    own checks of positions and mask are skipped (``checked=True``).
    """
    from course_lib.flash_ops import FLASH, STICK_BREAKING, fused_attention, prepare_kernel_call
    from course_lib.runtime import check_kernel_tensors, require_kernels

    require_kernels()
    # on the kernels' device, before an encoding reads positions or parameters for them
    check_kernel_tensors(
        q, k, v, key_pos, key_padding_mask, *(t for t in params.values() if torch.is_tensor(t))
    )
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            "backend='triton' needs seq_q == seq_k (no key/value cache); "
            f"got seq_q={q.shape[2]}, seq_k={k.shape[2]}. Use backend='reference' for decoding."
        )
    tables = bias = None
    normaliser = "softmax"
    if encoding is not None:
        if encoding.kernel_support:
            raise ValueError(
                f"backend='triton' has no kernel for method={method!r}: {encoding.kernel_support}"
            )
        if encoding.kernel_attention is not None:  # a kernel family of the encoding's own
            return encoding.kernel_attention(
                q, k, v, causal=causal, key_padding_mask=key_padding_mask, position_ids=key_pos,
                scale=params["scale"], params=params,
            )  # fmt: skip
        if encoding.kernel_tables is not None:
            tables = encoding.kernel_tables(key_pos, q.shape[-1], params)
        elif encoding.qk_transform is not None:  # a dense transform: PyTorch, then the kernel
            q = encoding.qk_transform(q, key_pos, params)  # seq_q == seq_k here
            k = (encoding.key_transform or encoding.qk_transform)(k, key_pos, params)
        if encoding.kernel_bias is not None:
            bias = encoding.kernel_bias(params, key_pos)
            if bias is None:  # never run the kernel without the bias it was asked for
                raise ValueError(
                    f"method={method!r}'s kernel_bias returned no bias for these positions, so "
                    "backend='triton' cannot compute it; use backend='reference' (or make "
                    "kernel_bias return a ScoreBias, or raise saying why)"
                )
        elif encoding.distance_bias is not None:  # plain torch: the kernels read it as a table
            reach = None if encoding.distance_reach is None else encoding.distance_reach(params)
            bias = distance_score_bias(
                encoding.distance_bias, key_pos, params, q.shape[1], reach=reach
            )
            if bias is None:
                raise ValueError(
                    f"backend='triton' reads method={method!r}'s bias by distance from a table "
                    "indexed by i - j, which needs the positions of each sequence to step by a "
                    "constant (e.g. 5 + 2 * arange(n)); got other position_ids. Use "
                    "backend='reference' for them."
                )
        normaliser = encoding.normaliser
    family = STICK_BREAKING if normaliser == "stick_breaking" else FLASH
    call = prepare_kernel_call(
        q, k, v, kernel=family.name, causal=causal, key_padding_mask=key_padding_mask,
        position_ids=key_pos if bias is not None else None,  # the tables carry the positions
        scale=params["scale"], qk_tables=tables, score_bias=bias, checked=True,
    )  # fmt: skip
    return fused_attention(family, q, k, v, call, causal)


def _with_normaliser(encoding: Encoding | None, method: str, normaliser: str | None):
    """``encoding`` with its normaliser replaced by ``normaliser`` (None: unchanged)."""
    if normaliser is None:
        return encoding
    check_choice("normaliser", normaliser, NORMALISER_NAMES)
    if encoding is None:
        if normaliser != "softmax":
            raise ValueError(f"method={method!r} has no record to change: use a registered one")
        return None
    if encoding.normaliser == normaliser:
        return encoding
    if encoding.kernel_attention is not None or encoding.score_bias_from_scores is not None:
        raise ValueError(
            f"method={method!r} computes its weights its own way; its normaliser cannot be "
            f"replaced by {normaliser!r}"
        )
    return replace(encoding, normaliser=normaliser)


def get_attention_class(name: str):
    """The attention module class of a registered encoding (``course_lib.encodings.REGISTRY``).

    Every class takes ``(hidden_size, num_heads, max_position_embeddings=512, dropout=0.0,
    backend="reference")``. Unknown names raise a ValueError listing the valid ones.
    """
    return get_encoding(name).module
