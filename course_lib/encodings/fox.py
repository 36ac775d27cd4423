"""The Forgetting Transformer (FoX): softmax attention with a forget gate (chapter 08).

Lin, Nikishin, He & Courville 2025. No position embedding anywhere: each head computes, from
each token's hidden state, a scalar forget gate ``f_t = sigmoid(w_f . x_t + b_f)`` in (0, 1), and a
key ``j`` seen from query ``i`` is down-weighted by every gate in between::

    D_ij = sum_{l=j+1..i} log f_l = c_i - c_j,      c_t = sum_{l<=t} log f_l (a cumulative sum)
    s_ij = scale * q_i . k_j + D_ij,                 A_i = softmax_{j <= i}(s_i)

so ``A_ij`` is proportional to ``exp(scale q_i . k_j) * prod_{l=j+1..i} f_l``: a gate near 1
keeps the past, a gate near 0 wipes it. With every gate 1 it is plain causal softmax attention.
Causal only (the product runs over the tokens between j and i, a left-to-right notion).

``D`` is formed from ``c`` (an O(seq) cumulative sum), never by an ``L x L`` loop. The module
passes ``log_forget = logsigmoid(w_f . x + b_f)`` ``[batch, heads, seq]`` to
``attention(method="fox", log_forget=...)``; a key/value cache keeps it per key (the record's
``per_key_params``), so a decoding step sums the gates of the whole cached prefix.

Relative, in a content-dependent way: ``D_ij`` depends on the tokens between i and j, not on
position ids, so shifting every position id changes nothing (the record claims ``relative``);
the bias is also unchanged when the same text is moved elsewhere in a longer sequence, as long as
the tokens between i and j are the same. What the gate sees is content: the same distance can be
cheap (gates near 1) or expensive (a gate near 0, e.g. at a sentence boundary).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.call_scope import defer, recall, remember
from course_lib.checks import check_float_tensor, has_values
from course_lib.kernel_hooks import ScoreBias
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register
from course_lib.runtime import kernels_available

__all__ = ["FoXAttention", "cumulative_log_forget", "forget_bias_for_decay_time", "fox_bias"]


def cumulative_log_forget(log_forget: torch.Tensor) -> torch.Tensor:
    """``c_t = sum_{l <= t} log f_l``: ``[..., seq] -> [..., seq]`` (so ``D_ij = c_i - c_j``),
    float64 whatever the gates' dtype.

    In float32 one gate shut hard (``log f = -1e8``) would make ``c`` so large that the later
    gates, -1 each, vanish below its rounding, and ``c_i - c_j`` between two later tokens would
    come out 0 instead of ``-(i - j)``; gates of ``-2e38`` would overflow ``c`` to ``-inf`` and
    ``c_i - c_j`` to NaN. Float64 keeps both exact to float32's precision.
    """
    return torch.cumsum(log_forget, dim=-1, dtype=torch.float64)


def fox_bias(query_positions: torch.Tensor, key_positions: torch.Tensor, params: dict):
    """D_ij = sum_{l=j+1..i} log f_l, the log forget gates between key j and query i

    ``log_forget`` ``[B, H, Nk]`` -> ``[B, H, Nq, Nk]``; the queries are the last ``Nq`` keys
    (decoding with a cache), so ``D_ij = c[Nk - Nq + i] - c[j]`` with ``c`` the cumulative sum.
    Positions are not read (only their count): FoX's bias comes from content.
    """
    c = cumulative_log_forget(params["log_forget"])  # [B, H, Nk]
    seq_q = query_positions.shape[1]
    return c[..., c.shape[-1] - seq_q :, None] - c[..., None, :]


def check_fox_params(params: dict, *, heads: int, head_dim: int, device, positions, **call):
    """``log_forget``: a finite floating ``[batch, heads, seq_k]`` tensor of ``log f <= 0``."""
    log_forget = params["log_forget"]
    check_float_tensor(log_forget, "log_forget", "[batch, heads, seq] (log f_t <= 0)", device)
    seq_k = positions.shape[1]
    # The batch size: given by the caller, else known from per-example positions.
    batch = call.get("batch") or (positions.shape[0] if positions.shape[0] != 1 else None)
    shape = tuple(log_forget.shape)
    if len(shape) != 3 or shape[1:] != (heads, seq_k) or shape[0] != (batch or shape[0]):
        want = f"[{batch or 'batch'}, {heads}, {seq_k}]"
        raise ValueError(
            f"log_forget must have shape [batch, heads, seq_k] = {want} (one log gate per head "
            f"and key), got {shape}"
        )
    values = log_forget.detach()
    if values.numel() == 0 or not has_values(values):
        return

    def judge(extremes: list[float]) -> None:
        top, low = extremes
        if top > 0:
            raise ValueError(
                f"log_forget must be <= 0 (log of a gate f in (0, 1]); got a maximum of {top:.3g}"
            )
        remember("fox_lowest_gate", log_forget, low)  # bounds the kernels' cumulative sum

    defer([values.max(), values.min()], judge)  # read with the call's other checks


# -- the fused kernels' hook (Triton only) --------------------------------------------------------
CUMULATIVE_LOG_GATES = None
"""``b_ij = per_token[b, h, i] - per_token[b, h, j]`` with ``per_token = c = cumsum(log f)``:
FoX's forget gates in the flash kernels (``c_i - c_j = sum_{l=j+1..i} log f_l``). Flash only
(the dQ kernel adds the query side of the gradient). None without Triton."""
if kernels_available():
    import triton
    import triton.language as tl

    from course_lib.kernels.fast_math import LOG2E
    from course_lib.kernels.score_bias import BiasHook, per_token_columns

    @triton.jit
    def cumulative_log_gates_bias(
        idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
    ):
        """``c_i - c_j`` (times ``log2 e`` if ``BASE2``); ``params`` points at this (batch,
        head)'s ``c`` ``[seq]``, read at the token indices."""
        value = tl.load(params + idx_q) - tl.load(params + idx_k)
        if BASE2:
            value = value * LOG2E
        return value

    @triton.jit
    def cumulative_log_gates_grad(
        acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
        OPTIONS: tl.constexpr = None,
    ):  # fmt: skip
        """Per key column: ``acc_j -= sum_i dS_ij`` (``d b_ij / d c_j = -1``). The query side
        ``d loss / d c_i = sum_j dS_ij`` would be 0 in exact arithmetic (adding a constant to a
        row does not change a softmax), but not in 16 bits, and the cumulative sum adds up what
        is left: the flash dQ kernel adds it (``query_row_sums``)."""
        return acc - tl.sum(ds, axis=QUERY_AXIS)

    @triton.jit
    def cumulative_log_gates_split(
        idx, pos, ref_idx, ref_pos, params, QUERY: tl.constexpr, OPTIONS: tl.constexpr = None
    ):
        """``c_i - c_j`` as ``u_i + w_j``: ``u_i = (c_i - c_ref) log2 e`` (``QUERY``), ``w_j =
        (c_ref - c_j) log2 e``, read once per token of a tile. ``c`` never increases (every
        ``log f <= 0``), so from a token between key and query each part is no larger than
        ``|c_i - c_j|``."""
        value = (tl.load(params + idx) - tl.load(params + ref_idx)) * LOG2E
        if not QUERY:
            value = -value
        return value

    CUMULATIVE_LOG_GATES = BiasHook(
        name="cumulative_log_gates",
        formula="b_ij = per_token[i] - per_token[j] (FoX: cumulative log forget gates)",
        bias=cumulative_log_gates_bias,
        grad=cumulative_log_gates_grad,
        param="per_token",
        reduce=per_token_columns,
        families=("flash",),
        query_row_sums=True,
        split=cumulative_log_gates_split,
    )


#: The kernels read ``log f`` no lower than this: a gate of ``e^-1024`` already gives every key
#: behind it no weight (nor gradient) in any float format, and a lower one would make the
#: cumulative sum, which the kernels read as float32, overflow or lose the gates after it.
KERNEL_GATE_FLOOR = -1024.0
#: Largest ``|c|`` the kernels take where ``c_i - c_j`` still counts: float32 rounds ``c`` there
#: to 1/64, so ``c_i - c_j`` is right to 1/32 (bf16's rounding of a score of 8).
KERNEL_SUM_LIMIT = 2.0**18
_CLOSED = -128.0  # log f below this hides the keys before it (e^-128 < float32's smallest)


def fox_kernel_bias(params: dict, positions: torch.Tensor) -> ScoreBias:
    """:data:`CUMULATIVE_LOG_GATES`: ``b_ij = c_i - c_j`` with ``c`` ``[batch, heads, seq]`` the
    cumulative sum (in torch, so autograd carries ``dc`` back to ``log f``), summed in float64
    over the gates floored at :data:`KERNEL_GATE_FLOOR` and handed over as float32, what the
    kernels read, whatever the gates' dtype (bfloat16 would round ``c`` to 1/4 from 32 on, and
    ``c_i - c_j`` with it).
    Refused where float32 cannot hold ``c`` finely enough for the keys that count; looked at
    (a read back from the device) only where the lowest gate :func:`check_fox_params` found in
    this call lets ``|c|`` reach that limit over the sequence."""
    log_forget = params["log_forget"]
    floored = log_forget.clamp(min=KERNEL_GATE_FLOOR)
    c = cumulative_log_forget(floored)
    lowest = recall("fox_lowest_gate", log_forget)  # found by check_fox_params in this call
    steepest = None if lowest is None else min(-lowest, -KERNEL_GATE_FLOOR)
    if steepest is None or steepest * c.shape[-1] >= KERNEL_SUM_LIMIT:  # |c| may reach it
        _check_kernel_sum(floored.detach(), c.detach())
    return ScoreBias(CUMULATIVE_LOG_GATES, per_token=c.to(torch.float32))


def _check_kernel_sum(log_forget: torch.Tensor, c: torch.Tensor) -> None:
    """Query ``i`` sees keys before it only if its own gate is open (``log f_i > -128``); there
    ``c_i - c_j`` is read from float32 values of ``c``, which must stay below
    :data:`KERNEL_SUM_LIMIT` in size."""
    if c.shape[-1] < 2 or not has_values(c):
        return
    counts = log_forget[..., 1:] > _CLOSED
    largest = float(torch.where(counts, c[..., 1:].abs(), torch.zeros_like(c[..., 1:])).max())
    if largest >= KERNEL_SUM_LIMIT:
        raise ValueError(
            "backend='triton' reads FoX's cumulative log forget gates c_t = sum_(l<=t) log f_l "
            f"as float32, which keeps c_i - c_j to 1/32 only while |c| < 2^18 = "
            f"{KERNEL_SUM_LIMIT:,.0f}; here |c| reaches {largest:.3g} at a token whose earlier "
            "keys still count (its log f > -128), where float32 would lose the gates after it: "
            "use backend='reference' (it sums in float64), or shorter sequences"
        )


def forget_bias_for_decay_time(decay_time: float | torch.Tensor) -> torch.Tensor:
    """The gate bias ``b`` whose gate (with ``w_f . x = 0``) forgets with time constant ``T``:
    ``log sigmoid(b) = -1/T``, i.e. ``b = -log(expm1(1/T))`` (``T > 0`` tokens).

    A key ``T`` tokens back is then down-weighted by ``e^-1``. Zero bias is ``T = 1/log 2``
    (about 1.44 tokens, ``f = 1/2``).
    """
    t = torch.as_tensor(decay_time, dtype=torch.float32)
    if not bool((t > 0).all()) or not bool(torch.isfinite(t).all()):
        raise ValueError(f"decay_time must be finite and > 0, got {decay_time}")
    return -torch.log(torch.expm1(1.0 / t))


class FoXAttention(PositionalSelfAttention):
    """Causal softmax attention with FoX's data-dependent forget gate; no position embedding.

    ``forget_gate``: ``Linear(hidden_size, num_heads)``, one scalar gate per head and token,
    ``log f = logsigmoid(forget_gate(x))`` ``[batch, heads, seq]``. Its bias starts at 0 and its
    weights at PyTorch's default: the paper's data-dependent gate uses no special bias
    initialisation (its official code zeroes the bias, so ``f`` starts near 1/2 and the model
    starts with a strong recency bias it can learn away); the decay-time initialisation it
    describes, ``b = -log(expm1(1/T))`` with ``T`` log-spaced between ``T_min`` and ``T_max``
    across heads (:func:`forget_bias_for_decay_time`), is for its data-independent ablations.
    ``max_position_embeddings`` is not used (no table).
    """

    encoding = "fox"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        self.forget_gate = nn.Linear(hidden_size, num_heads)
        nn.init.zeros_(self.forget_gate.bias)

    def log_forget(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``log f_t = logsigmoid(w_f . x_t + b_f)``: ``[batch, seq, hidden] -> [batch, heads,
        seq]`` (always < 0)."""
        return F.logsigmoid(self.forget_gate(hidden_states)).transpose(1, 2)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"log_forget": self.log_forget(hidden_states)}


register(
    Encoding(
        name="fox",
        chapter="08_positions_from_content",
        summary="no position embedding: a learned forget gate per token, sum of log f on the scores",
        module=FoXAttention,
        color="#843c39",
        score_bias=fox_bias,
        params={"log_forget": REQUIRED},
        per_key_params=("log_forget",),
        check_params=check_fox_params,
        kernel_bias=fox_kernel_bias,
        kernel_hooks=(CUMULATIVE_LOG_GATES,) if CUMULATIVE_LOG_GATES is not None else (),
        reads_positions=False,  # the gates come from content; hooks get token indices
        relative=True,  # position ids are never read: shifting them changes nothing
        causal_only=True,
        learnable=True,
    )
)
