"""Fused flash attention (forward and backward) with a compile-time position encoding.

Tensors are ``[batch, heads, seq, head_dim]`` and contiguous; ``position_ids`` is integer
``[batch, seq]``; ``key_padding_mask`` is ``[batch, seq]`` (nonzero = real token) or absent.

The function, for query ``i`` and key ``j`` of one (batch, head)::

    logits_ij = scale * q'_i . k'_j + bias_ij
    out_i     = sum_j softmax_j(logits_ij over allowed j) * v_j      (0 if no key is allowed)

with key ``j`` allowed iff it is a real token and (not causal or ``j <= i``). ``POSITION_MODE``
(a ``tl.constexpr``, so each mode is its own compiled kernel) picks ``q'``, ``k'`` and ``bias``:

* ``none``   : ``q' = q``, ``bias = 0``.
* ``rope``   : ``q'_i = R(p_i) q_i``; ``R(p)`` rotates channel pair ``t`` by ``p * base**(-2t/D)``
  (pairs ``(2t, 2t+1)`` for the interleaved style, ``(t, t + D/2)`` for the half style).
* ``exposb`` : ``q'_i = g * a(p_i) * R(p_i) q_i`` with amplitude ``a(p) = 1 + 0.2 exp(-0.001 p)``
  and band-pass gain ``g[d] = 0.8 + 0.4 exp(-(d - D/4)^2 / (2 (D/8)^2))``, and
  ``bias_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))``.

Design:

* Online softmax over key blocks (Dao et al., FlashAttention-2): memory is O(seq), the
  ``seq x seq`` matrix never exists. Work is in base 2 (``exp2``), accumulation in fp32. The
  forward stores the per-row log-sum-exp (base 2) for the backward.
* The rotation is applied to each loaded q/k tile inside the kernels, in fp32; no rotated copy of
  q or k is ever written. A tile is loaded as its two pair halves, ``x_1`` (channels ``2t`` or
  ``t``) and ``x_2`` (channels ``2t+1`` or ``t + D/2``), so a rotation is elementwise
  (``x'_1 = x_1 cos - x_2 sin``, ``x'_2 = x_1 sin + x_2 cos``) and ``q' . k'`` is two ``tl.dot``
  over half the channels; gradients are stored back through the transposed rotation the same
  way. The ``cos``/``sin`` values (times ``a(p)`` for exposb) of the fp32 angles
  ``p * inv_freq`` are computed once per call by the launch helper, ``[batch, seq, D/2]`` (O(seq)
  memory), so the inner loops spend no time on transcendental functions.
* Backward, deterministic, no atomics: a pre-pass computes ``delta_i = rowsum(dO_i * O_i)``; one
  kernel walks the query blocks for each key block (dK, dV), another walks the key blocks for each
  query block (dQ). Gradients w.r.t. ``q'``/``k'`` are mapped back to ``q``/``k`` with the
  transpose of the encoding: ``dq = a(p) R(p)^T (g * dq')``.
* Causal: key blocks entirely above the diagonal are skipped. Tails are masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "POSITION_MODES",
    "ROPE_STYLES",
    "SUPPORTED_HEAD_DIMS",
    "SUPPORTED_DTYPES",
    "FlashConfig",
    "pick_config",
    "rotary_tables",
    "flash_attention_forward",
    "flash_attention_backward",
]

POSITION_MODES: dict[str, int] = {"none": 0, "rope": 1, "exposb": 2}
ROPE_STYLES: tuple[str, ...] = ("interleaved", "half")
SUPPORTED_HEAD_DIMS: tuple[int, ...] = (16, 32, 64, 128)
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
MAX_BATCH_HEADS = 65535  # CUDA's limit on the second grid axis
LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------
# Tile helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _pair_channels(HEAD_DIM: tl.constexpr, HALF_PAD: tl.constexpr, ROPE_HALF: tl.constexpr):
    """Pair index ``t`` (padded to ``HALF_PAD``), its validity, and the two channels of the pair.

    Interleaved: pair ``t`` is channels ``(2t, 2t+1)``; half: ``(t, t + HEAD_DIM/2)``.
    """
    t = tl.arange(0, HALF_PAD)
    pair_valid = t < HEAD_DIM // 2
    if ROPE_HALF:
        first = t
        second = t + HEAD_DIM // 2
    else:
        first = 2 * t
        second = 2 * t + 1
    return t, pair_valid, first, second


@triton.jit
def _load_rows(base, offs_row, row_valid, HEAD_DIM: tl.constexpr):
    """Load a ``[rows, HEAD_DIM]`` tile of a row-major ``[seq, HEAD_DIM]`` matrix (tail rows 0)."""
    ptrs = base + offs_row[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    return tl.load(ptrs, mask=row_valid[:, None], other=0.0)


@triton.jit
def _load_encoded(
    base,
    COS,
    SIN,
    offs_row,
    row_valid,
    t,
    pair_valid,
    first,
    second,
    gain_first,
    gain_second,
    HEAD_DIM: tl.constexpr,
    POSITION_MODE: tl.constexpr,
):
    """Load a q or k tile as its pair halves ``(x'_1, x'_2)``, each ``[rows, HALF_PAD]``.

    rope: ``x'_1 = x_1 cos - x_2 sin``, ``x'_2 = x_1 sin + x_2 cos`` (fp32, cast back to the
    input dtype); exposb: the same times the gain (the amplitude is folded into cos/sin);
    none: the halves as loaded. Then ``q' . k' = q'_1 . k'_1 + q'_2 . k'_2``.
    """
    mask = row_valid[:, None] & pair_valid[None, :]
    row_ptrs = base + offs_row[:, None] * HEAD_DIM
    x1 = tl.load(row_ptrs + first[None, :], mask=mask, other=0.0)
    x2 = tl.load(row_ptrs + second[None, :], mask=mask, other=0.0)
    if POSITION_MODE != 0:
        table = offs_row[:, None] * (HEAD_DIM // 2) + t[None, :]
        cos = tl.load(COS + table, mask=mask, other=0.0)
        sin = tl.load(SIN + table, mask=mask, other=0.0)
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        y1 = x1f * cos - x2f * sin
        y2 = x1f * sin + x2f * cos
        if POSITION_MODE == 2:
            y1 = y1 * gain_first[None, :]
            y2 = y2 * gain_second[None, :]
        x1 = y1.to(x1.dtype)
        x2 = y2.to(x2.dtype)
    return x1, x2


@triton.jit
def _store_decoded(
    base,
    dy1,
    dy2,
    COS,
    SIN,
    offs_row,
    row_valid,
    t,
    pair_valid,
    first,
    second,
    gain_first,
    gain_second,
    HEAD_DIM: tl.constexpr,
    POSITION_MODE: tl.constexpr,
):
    """Store the gradient w.r.t. x given the gradients w.r.t. the halves of ``x'`` (fp32).

    The transpose of :func:`_load_encoded`: ``dx_1 = cos g_1 dy_1 + sin g_2 dy_2``,
    ``dx_2 = -sin g_1 dy_1 + cos g_2 dy_2`` (``a(p)`` is inside cos/sin; ``g = 1`` for rope).
    """
    mask = row_valid[:, None] & pair_valid[None, :]
    if POSITION_MODE != 0:
        if POSITION_MODE == 2:
            dy1 = dy1 * gain_first[None, :]
            dy2 = dy2 * gain_second[None, :]
        table = offs_row[:, None] * (HEAD_DIM // 2) + t[None, :]
        cos = tl.load(COS + table, mask=mask, other=0.0)
        sin = tl.load(SIN + table, mask=mask, other=0.0)
        dx1 = dy1 * cos + dy2 * sin
        dx2 = dy2 * cos - dy1 * sin
    else:
        dx1 = dy1
        dx2 = dy2
    row_ptrs = base + offs_row[:, None] * HEAD_DIM
    tl.store(row_ptrs + first[None, :], dx1.to(base.dtype.element_ty), mask=mask)
    tl.store(row_ptrs + second[None, :], dx2.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _distance_bias_base2(pos_a, pos_b):
    """``log2(0.7 + 0.3 exp(-0.005 |pos_a - pos_b|))`` as a ``[len(pos_a), len(pos_b)]`` tile."""
    distance = tl.abs(pos_a[:, None] - pos_b[None, :])
    return tl.log2(0.7 + 0.3 * tl.exp(-0.005 * distance))


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _flash_fwd_kernel(
    Q,
    K,
    V,
    OUT,
    LSE,
    POS,
    KPM,
    COS,
    SIN,
    GAIN,
    seq_len,
    num_heads,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    POSITION_MODE: tl.constexpr,
    ROPE_HALF: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One query block of one (batch, head): online softmax over the key blocks."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = pid_bh // num_heads
    head_offset = pid_bh.to(tl.int64) * seq_len * HEAD_DIM
    Q += head_offset
    K += head_offset
    V += head_offset
    OUT += head_offset
    LSE += pid_bh.to(tl.int64) * seq_len
    POS += batch * seq_len
    KPM += batch * seq_len
    COS += batch.to(tl.int64) * seq_len * (HEAD_DIM // 2)
    SIN += batch.to(tl.int64) * seq_len * (HEAD_DIM // 2)

    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, ROPE_HALF)
    gain_1 = tl.load(GAIN + first, mask=pair_valid, other=0.0)
    gain_2 = tl.load(GAIN + second, mask=pair_valid, other=0.0)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < seq_len
    q1, q2 = _load_encoded(
        Q, COS, SIN, offs_m, row_valid, t, pair_valid, first, second, gain_1, gain_2,
        HEAD_DIM, POSITION_MODE,
    )  # fmt: skip
    if POSITION_MODE == 2:
        pos_m = tl.load(POS + offs_m, mask=row_valid, other=0).to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (base 2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)  # later key blocks are fully masked
    else:
        hi = seq_len
    for start_n in range(0, hi, BLOCK_N):
        # (small loads are written inline: helper calls are costly in the interpreter)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_valid = offs_n < seq_len
        k1, k2 = _load_encoded(
            K, COS, SIN, offs_n, col_valid, t, pair_valid, first, second, gain_1, gain_2,
            HEAD_DIM, POSITION_MODE,
        )  # fmt: skip
        v = tl.load(
            V + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=col_valid[:, None], other=0.0
        )

        s = tl.dot(q1, tl.trans(k1), input_precision=DOT_PRECISION)
        s = tl.dot(q2, tl.trans(k2), s, input_precision=DOT_PRECISION) * qk_scale_log2
        if POSITION_MODE == 2:
            pos_n = tl.load(POS + offs_n, mask=col_valid, other=0).to(tl.float32)
            s += _distance_bias_base2(pos_m, pos_n)
        allowed = col_valid[None, :]
        if HAS_MASK:
            allowed = allowed & (tl.load(KPM + offs_n, mask=col_valid, other=0) != 0)[None, :]
        if CAUSAL:
            allowed = allowed & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(allowed, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no allowed key so far keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    out = acc / l_safe[:, None]  # exactly 0 for a row with no allowed key
    # +inf marks a row with no allowed key: the backward's exp2(s - lse) is then 0 for it.
    lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("inf"))
    tl.store(
        OUT + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=row_valid[:, None],
    )
    tl.store(LSE + offs_m, lse, mask=row_valid)


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


@triton.jit
def _flash_bwd_delta_kernel(OUT, DO, DELTA, seq_len, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta_i = sum_d dO_id * O_id`` (fp32), one row block of one (batch, head)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    head_offset = pid_bh.to(tl.int64) * seq_len * HEAD_DIM
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < seq_len
    o = _load_rows(OUT + head_offset, offs_m, row_valid, HEAD_DIM).to(tl.float32)
    do = _load_rows(DO + head_offset, offs_m, row_valid, HEAD_DIM).to(tl.float32)
    delta = tl.sum(o * do, 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * seq_len + offs_m, delta, mask=row_valid)


@triton.jit
def _flash_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    POS,
    KPM,
    COS,
    SIN,
    GAIN,
    seq_len,
    num_heads,
    scale,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    POSITION_MODE: tl.constexpr,
    ROPE_HALF: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dK and dV for one key block, walking the query blocks (transposed tiles ``[keys, queries]``).

    ``P^T = exp2(S^T - lse)``, ``dV = P^T dO``, ``dS^T = P^T * (V dO^T - delta)``,
    ``dk' = scale * dS^T q'`` (per pair half), then ``dk`` through the transposed encoding.
    """
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = pid_bh // num_heads
    head_offset = pid_bh.to(tl.int64) * seq_len * HEAD_DIM
    Q += head_offset
    K += head_offset
    V += head_offset
    DO += head_offset
    DK += head_offset
    DV += head_offset
    LSE += pid_bh.to(tl.int64) * seq_len
    DELTA += pid_bh.to(tl.int64) * seq_len
    POS += batch * seq_len
    KPM += batch * seq_len
    COS += batch.to(tl.int64) * seq_len * (HEAD_DIM // 2)
    SIN += batch.to(tl.int64) * seq_len * (HEAD_DIM // 2)

    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, ROPE_HALF)
    gain_1 = tl.load(GAIN + first, mask=pair_valid, other=0.0)
    gain_2 = tl.load(GAIN + second, mask=pair_valid, other=0.0)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = offs_n < seq_len
    key_real = col_valid
    if HAS_MASK:
        key_real = key_real & (tl.load(KPM + offs_n, mask=col_valid, other=0) != 0)
    if POSITION_MODE == 2:
        pos_n = tl.load(POS + offs_n, mask=col_valid, other=0).to(tl.float32)
    k1, k2 = _load_encoded(
        K, COS, SIN, offs_n, col_valid, t, pair_valid, first, second, gain_1, gain_2,
        HEAD_DIM, POSITION_MODE,
    )  # fmt: skip
    v = _load_rows(V, offs_n, col_valid, HEAD_DIM)

    dk1 = tl.zeros([BLOCK_N, HALF_PAD], dtype=tl.float32)
    dk2 = tl.zeros([BLOCK_N, HALF_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # earlier queries cannot see these keys
    else:
        lo = 0
    for start_m in range(lo, seq_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_valid = offs_m < seq_len
        q1, q2 = _load_encoded(
            Q, COS, SIN, offs_m, row_valid, t, pair_valid, first, second, gain_1, gain_2,
            HEAD_DIM, POSITION_MODE,
        )  # fmt: skip
        do = tl.load(
            DO + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_valid[:, None], other=0.0
        )
        lse = tl.load(LSE + offs_m, mask=row_valid, other=float("inf"))
        delta = tl.load(DELTA + offs_m, mask=row_valid, other=0.0)

        s_t = tl.dot(k1, tl.trans(q1), input_precision=DOT_PRECISION)
        s_t = tl.dot(k2, tl.trans(q2), s_t, input_precision=DOT_PRECISION) * qk_scale_log2
        if POSITION_MODE == 2:
            pos_m = tl.load(POS + offs_m, mask=row_valid, other=0).to(tl.float32)
            s_t += _distance_bias_base2(pos_n, pos_m)
        allowed = key_real[:, None] & row_valid[None, :]
        if CAUSAL:
            allowed = allowed & (offs_m[None, :] >= offs_n[:, None])
        p_t = tl.where(allowed, tl.exp2(s_t - lse[None, :]), 0.0)

        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q1.dtype)
        dk1 = tl.dot(ds_t, q1, dk1, input_precision=DOT_PRECISION)
        dk2 = tl.dot(ds_t, q2, dk2, input_precision=DOT_PRECISION)

    _store_decoded(
        DK, dk1 * scale, dk2 * scale, COS, SIN, offs_n, col_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, POSITION_MODE,
    )  # fmt: skip
    tl.store(
        DV + offs_n[:, None] * HEAD_DIM + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=col_valid[:, None],
    )


@triton.jit
def _flash_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    POS,
    KPM,
    COS,
    SIN,
    GAIN,
    seq_len,
    num_heads,
    scale,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    POSITION_MODE: tl.constexpr,
    ROPE_HALF: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dQ for one query block, walking the key blocks.

    ``P = exp2(S - lse)``, ``dS = P * (dO V^T - delta)``, ``dq' = scale * dS k'`` (per pair
    half), then ``dq`` through the transposed encoding.
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = pid_bh // num_heads
    head_offset = pid_bh.to(tl.int64) * seq_len * HEAD_DIM
    Q += head_offset
    K += head_offset
    V += head_offset
    DO += head_offset
    DQ += head_offset
    LSE += pid_bh.to(tl.int64) * seq_len
    DELTA += pid_bh.to(tl.int64) * seq_len
    POS += batch * seq_len
    KPM += batch * seq_len
    COS += batch.to(tl.int64) * seq_len * (HEAD_DIM // 2)
    SIN += batch.to(tl.int64) * seq_len * (HEAD_DIM // 2)

    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, ROPE_HALF)
    gain_1 = tl.load(GAIN + first, mask=pair_valid, other=0.0)
    gain_2 = tl.load(GAIN + second, mask=pair_valid, other=0.0)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < seq_len
    q1, q2 = _load_encoded(
        Q, COS, SIN, offs_m, row_valid, t, pair_valid, first, second, gain_1, gain_2,
        HEAD_DIM, POSITION_MODE,
    )  # fmt: skip
    do = _load_rows(DO, offs_m, row_valid, HEAD_DIM)
    lse = tl.load(LSE + offs_m, mask=row_valid, other=float("inf"))
    delta = tl.load(DELTA + offs_m, mask=row_valid, other=0.0)
    if POSITION_MODE == 2:
        pos_m = tl.load(POS + offs_m, mask=row_valid, other=0).to(tl.float32)

    dq1 = tl.zeros([BLOCK_M, HALF_PAD], dtype=tl.float32)
    dq2 = tl.zeros([BLOCK_M, HALF_PAD], dtype=tl.float32)
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)
    else:
        hi = seq_len
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_valid = offs_n < seq_len
        k1, k2 = _load_encoded(
            K, COS, SIN, offs_n, col_valid, t, pair_valid, first, second, gain_1, gain_2,
            HEAD_DIM, POSITION_MODE,
        )  # fmt: skip
        v = tl.load(
            V + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=col_valid[:, None], other=0.0
        )

        s = tl.dot(q1, tl.trans(k1), input_precision=DOT_PRECISION)
        s = tl.dot(q2, tl.trans(k2), s, input_precision=DOT_PRECISION) * qk_scale_log2
        if POSITION_MODE == 2:
            pos_n = tl.load(POS + offs_n, mask=col_valid, other=0).to(tl.float32)
            s += _distance_bias_base2(pos_m, pos_n)
        allowed = col_valid[None, :] & row_valid[:, None]
        if HAS_MASK:
            allowed = allowed & (tl.load(KPM + offs_n, mask=col_valid, other=0) != 0)[None, :]
        if CAUSAL:
            allowed = allowed & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0)

        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = (p * (dp - delta[:, None])).to(k1.dtype)
        dq1 = tl.dot(ds, k1, dq1, input_precision=DOT_PRECISION)
        dq2 = tl.dot(ds, k2, dq2, input_precision=DOT_PRECISION)

    _store_decoded(
        DQ, dq1 * scale, dq2 * scale, COS, SIN, offs_m, row_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, POSITION_MODE,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Launch helpers
# --------------------------------------------------------------------------------------------


class FlashConfig:
    """Block sizes (powers of two >= 16) and launch options of one pass."""

    def __init__(self, block_m: int, block_n: int, num_warps: int = 4, num_stages: int = 2):
        for name, size in (("block_m", block_m), ("block_n", block_n)):
            if size < 16 or size & (size - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {size}")
        self.block_m = block_m
        self.block_n = block_n
        self.num_warps = num_warps
        self.num_stages = num_stages

    def __repr__(self) -> str:
        return (
            f"FlashConfig(block_m={self.block_m}, block_n={self.block_n}, "
            f"num_warps={self.num_warps}, num_stages={self.num_stages})"
        )


KERNELS: tuple[str, ...] = ("forward", "dkdv", "dq")

# (block_m, block_n, num_warps, num_stages) on a GPU; block_m indexes queries, block_n keys.
# Chosen so that ptxas (sm_90, triton 3.6 and 3.9) needs no or only a few bytes of register
# spills in every position mode: the dK/dV kernel keeps three accumulators per key row, so it
# walks narrow query blocks; the dQ kernel the other way round. fp32 uses exact (non
# tensor-core) products and small tiles.
_GPU_CONFIGS: dict[tuple[str, str], tuple[int, int, int, int]] = {
    ("forward", "16bit"): (128, 64, 8, 3),
    ("forward", "16bit-wide"): (128, 64, 8, 2),
    ("dkdv", "16bit"): (32, 128, 8, 2),
    ("dkdv", "16bit-wide"): (32, 64, 8, 2),
    ("dq", "16bit"): (128, 32, 8, 2),
    ("dq", "16bit-wide"): (64, 32, 8, 2),
    ("forward", "fp32"): (64, 32, 8, 1),
    ("dkdv", "fp32"): (16, 32, 8, 1),
    ("dq", "fp32"): (32, 16, 8, 1),
}
# In the CPU interpreter the cost is per program step, so blocks are 32-64 wide (and unequal,
# as on the GPU, so the tests cover the block-boundary logic of each kernel).
_INTERPRETER_CONFIGS: dict[str, tuple[int, int]] = {
    "forward": (64, 32),
    "dkdv": (32, 64),
    "dq": (64, 32),
}


def pick_config(
    kernel: str, head_dim: int, dtype: torch.dtype, device: torch.device
) -> FlashConfig:
    """Block sizes and launch options of one kernel (``"forward"``, ``"dkdv"`` or ``"dq"``)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
    if device.type != "cuda":
        return FlashConfig(*_INTERPRETER_CONFIGS[kernel])
    if dtype == torch.float32:
        family = "fp32"
    else:
        family = "16bit-wide" if head_dim >= 128 else "16bit"
    block_m, block_n, num_warps, num_stages = _GPU_CONFIGS[(kernel, family)]
    return FlashConfig(block_m, block_n, num_warps=num_warps, num_stages=num_stages)


def rotary_tables(
    position_ids: torch.Tensor, head_dim: int, rope_base: float, position_mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)`` tables ``[batch, seq, head_dim/2]`` and the gain ``[head_dim]``.

    ``angle[b, i, t] = float32(p[b, i]) * inv_freq[t]`` with ``inv_freq[t] = base**(-2t/D)``
    rounded once to fp32 (so angles are fp32, as in the reference). For exposb the tables carry
    the amplitude ``a(p) = 1 + 0.2 exp(-0.001 p)`` and the gain is the band-pass
    ``0.8 + 0.4 exp(-(d - D/4)^2 / (2 (D/8)^2))``; otherwise the gain is 1.
    """
    device = position_ids.device
    d = torch.arange(head_dim, dtype=torch.float64)
    if position_mode == "exposb":
        gain = 0.8 + 0.4 * torch.exp(-((d - head_dim / 4) ** 2) / (2 * (head_dim / 8) ** 2))
    else:
        gain = torch.ones_like(d)
    gain = gain.to(torch.float32).to(device)
    if position_mode == "none":
        empty = torch.zeros(1, dtype=torch.float32, device=device)  # never read
        return empty, empty, gain
    pairs = torch.arange(0, head_dim, 2, dtype=torch.float64)
    inv_freq = (rope_base ** (-pairs / head_dim)).to(torch.float32).to(device)
    positions = position_ids.to(torch.float32)
    angle = positions[..., None] * inv_freq
    cos, sin = torch.cos(angle), torch.sin(angle)
    if position_mode == "exposb":
        amplitude = (1.0 + 0.2 * torch.exp(-0.001 * positions))[..., None]
        cos, sin = cos * amplitude, sin * amplitude
    return cos.contiguous(), sin.contiguous(), gain


def _check_launch_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position_ids: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    position_mode: str,
    rope_style: str,
) -> None:
    if position_mode not in POSITION_MODES:
        raise ValueError(
            f"position_mode must be one of {list(POSITION_MODES)}, got {position_mode!r}"
        )
    if rope_style not in ROPE_STYLES:
        raise ValueError(f"rope_style must be one of {list(ROPE_STYLES)}, got {rope_style!r}")
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            "q, k, v must all be [batch, heads, seq, head_dim] with the same shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"q, k, v must share one dtype of {SUPPORTED_DTYPES}, "
            f"got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {q.shape[-1]}")
    batch, heads, seq, _ = q.shape
    if batch * heads > MAX_BATCH_HEADS:
        raise ValueError(f"batch * heads must be <= {MAX_BATCH_HEADS}, got {batch * heads}")
    if tuple(position_ids.shape) != (batch, seq) or position_ids.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise ValueError("position_ids must be int32/int64 [batch, seq] for the kernel")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, seq):
        raise ValueError("key_padding_mask must be [batch, seq] for the kernel")
    for t in (q, k, v, position_ids, key_padding_mask):
        if t is not None and not t.is_contiguous():
            raise ValueError("the kernel takes contiguous tensors")


def _mask_buffer(key_padding_mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if key_padding_mask is None:
        return like  # never read: HAS_MASK=False
    return key_padding_mask.to(torch.int8).contiguous()


def _contiguous_halves(position_mode: str, rope_style: str) -> bool:
    """Split channels as ``(t, t + D/2)``: for the half style, and for "none" (any split of the
    channels gives the same dot product there; this one reads contiguous memory)."""
    return rope_style == "half" or position_mode == "none"


def _half_pad(head_dim: int) -> int:
    """Width of a pair-half tile: head_dim/2, padded to tl.dot's minimum of 16."""
    return max(head_dim // 2, 16)


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use exact IEEE products (tf32 would miss a 1e-4 tolerance)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def flash_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    position_ids: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    *,
    position_mode: str,
    causal: bool,
    scale: float,
    rope_base: float = 10000.0,
    rope_style: str = "interleaved",
    config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel.

    q, k, v: contiguous ``[batch, heads, seq, head_dim]``; position_ids: contiguous int
    ``[batch, seq]``; key_padding_mask: ``[batch, seq]`` (True = real) or None.
    Returns ``(out [batch, heads, seq, head_dim], lse [batch * heads, seq] fp32, base 2)``.
    """
    _check_launch_inputs(q, k, v, position_ids, key_padding_mask, position_mode, rope_style)
    batch, heads, seq, head_dim = q.shape
    cfg = config or pick_config("forward", head_dim, q.dtype, q.device)
    out = torch.empty_like(q)
    lse = torch.empty((batch * heads, seq), dtype=torch.float32, device=q.device)
    if seq == 0 or batch * heads == 0:
        return out, lse
    cos, sin, gain = rotary_tables(position_ids, head_dim, rope_base, position_mode)
    grid = (triton.cdiv(seq, cfg.block_m), batch * heads)
    _flash_fwd_kernel[grid](
        q,
        k,
        v,
        out,
        lse,
        position_ids,
        _mask_buffer(key_padding_mask, position_ids),
        cos,
        sin,
        gain,
        seq,
        heads,
        scale * LOG2E,
        HEAD_DIM=head_dim,
        HALF_PAD=_half_pad(head_dim),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        POSITION_MODE=POSITION_MODES[position_mode],
        ROPE_HALF=_contiguous_halves(position_mode, rope_style),
        CAUSAL=bool(causal),
        HAS_MASK=key_padding_mask is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out, lse


def flash_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    position_ids: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    *,
    position_mode: str,
    causal: bool,
    scale: float,
    rope_base: float = 10000.0,
    rope_style: str = "interleaved",
    configs: dict[str, FlashConfig] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernels; returns ``(dq, dk, dv)``, each like q.

    grad_out and out: ``[batch, heads, seq, head_dim]``; lse from
    :func:`flash_attention_forward`; the other arguments as given to it. ``configs`` may
    override the block sizes of ``"dkdv"`` and/or ``"dq"``.
    """
    _check_launch_inputs(q, k, v, position_ids, key_padding_mask, position_mode, rope_style)
    batch, heads, seq, head_dim = q.shape
    grad_out = grad_out.contiguous()
    configs = dict(configs or {})
    for kernel in ("dkdv", "dq"):
        configs.setdefault(kernel, pick_config(kernel, head_dim, q.dtype, q.device))
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if seq == 0 or batch * heads == 0:
        return dq, dk, dv
    delta = torch.empty_like(lse)
    _flash_bwd_delta_kernel[(triton.cdiv(seq, 64), batch * heads)](
        out, grad_out, delta, seq, HEAD_DIM=head_dim, BLOCK_M=64
    )
    cos, sin, gain = rotary_tables(position_ids, head_dim, rope_base, position_mode)
    mask = _mask_buffer(key_padding_mask, position_ids)
    shared = dict(
        HEAD_DIM=head_dim,
        HALF_PAD=_half_pad(head_dim),
        POSITION_MODE=POSITION_MODES[position_mode],
        ROPE_HALF=_contiguous_halves(position_mode, rope_style),
        CAUSAL=bool(causal),
        HAS_MASK=key_padding_mask is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
    )
    cfg = configs["dkdv"]
    _flash_bwd_dkdv_kernel[(triton.cdiv(seq, cfg.block_n), batch * heads)](
        q, k, v, grad_out, lse, delta, dk, dv, position_ids, mask, cos, sin, gain,
        seq, heads, scale, scale * LOG2E,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **shared,
    )  # fmt: skip
    cfg = configs["dq"]
    _flash_bwd_dq_kernel[(triton.cdiv(seq, cfg.block_m), batch * heads)](
        q, k, v, grad_out, lse, delta, dq, position_ids, mask, cos, sin, gain,
        seq, heads, scale, scale * LOG2E,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **shared,
    )  # fmt: skip
    return dq, dk, dv
