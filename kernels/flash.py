"""Fused flash attention (forward and backward); position machinery comes from the caller.

Tensors are ``[batch, heads, seq, head_dim]`` (any strides, see :mod:`.common` for the layout
convention); ``positions`` is float32 ``[1 or batch, seq]`` (each sequence counted from its
smallest position, exact integers); ``key_mask`` is ``[batch, seq]``
(nonzero = real token) or absent.

The function, for query ``i`` and key ``j`` of one (batch, head)::

    logits_ij = scale * q'_i . k'_j + b_ij
    out_i     = sum_j softmax_j(logits_ij over allowed j) * v_j      (0 if no key is allowed)

with key ``j`` allowed iff it is a real token and (not causal or ``j <= i``).

* ``q'``, ``k'``: q and k through the caller's per-token tables, if any (rotation and gain per
  channel pair; keys may have tables of their own, as xPos's do; without tables ``q' = q``). The
  launchers apply them once per call, before the loops (:mod:`.qk_transform`), and map the
  gradients back once after: the loops are plain attention's, whatever the tables.
* ``b_ij``: a score-bias hook object (:mod:`.score_bias`) whose function is passed in as the
  constexpr ``BIAS_FN``, or
  None (no bias, no position loads). A hook with a factor form (``BIAS_FACTOR``; ExpoSB's, whose
  ``e^b`` lies in ``[0.7, 1]``) passes that instead: the weights are multiplied by ``e^b_ij``
  (``e^(s + b) = e^s e^b``) rather than ``b`` added to the logits, which spares the inner loops a
  logarithm per pair; the running maximum is then that of the scores alone, which bounds the
  weights as ``e^b <= 1``.

Design:

* Online softmax over key blocks (Dao et al., FlashAttention-2): memory is O(seq), the
  ``seq x seq`` matrix never exists. Work is in base 2 (``exp2``; hooks return their bias times
  ``log2 e``), accumulation in fp32. The scale is not applied to the score tile: it goes into
  the multiply-add that forms the exponent (``exp2(s * c - m)``; without a bias the forward takes
  the row maximum of the unscaled scores, so ``c >= 0`` and the scale's sign is put into q once).
  The forward stores the per-row log-sum-exp (base 2) for the backward.
* Per token, once; per pair, fused. A q/k transform is O(seq x head_dim): inside the loops it
  would be paid for every key tile in every query block, ``seq / BLOCK_M`` times per key, with
  its tables' loads. So :func:`flash_attention_forward` writes ``q'``, ``k'`` in one pass each
  (:func:`.qk_transform.encode_qk`, float32 arithmetic rounded once to the input dtype) and the
  backward's loops write the float32 gradients w.r.t. ``q'``, ``k'``, which one more pass maps
  back (:func:`.qk_transform.decode_qk_grads`). A 16-bit tile is loaded whole and ``q . k`` is
  one ``tl.dot``; fp32 splits it into the two halves of the channels (``PAIR_HALVES``: its
  CUDA-core products need fewer registers that way).
* Backward, deterministic, no atomics: a pre-pass computes ``delta_i = rowsum(dO_i * O_i)``; one
  kernel walks the query blocks for each key block (dK, dV, and the score bias's parameter
  gradient from ``dS``, as per-program partial sums reduced with torch after the launch),
  another walks the key blocks for each query block (dQ).
* Two loops per kernel: the tiles every pair of which is allowed (below the causal diagonal, or
  any whole tile when bidirectional) run a loop with no causal mask, no bounds checks and no
  index clamping (a key-padding mask still applies); the diagonal band of a causal mask and the
  ragged last tile run the same body with them. Key blocks entirely above the diagonal are
  skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    Launch,
    LaunchArgs,
    _program_setup,
    check_launch_inputs,
    dot_precision,
    gpu_arch,
    position_line,
    prepare_launch,
    run_launch,
    smem_per_block,
)
from .limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS, MAX_BATCH_HEADS
from .qk_transform import (
    _half_pad,
    _load_encoded,
    _load_rows,
    _pair_channels,
    _pair_gains,
    _store_decoded,
    decode_qk_grads,
    encode_qk,
)
from .score_bias import GradTiles, tile_slot, tile_slot_count

__all__ = [
    "KERNEL_DTYPES",
    "KERNEL_HEAD_DIMS",
    "MAX_BATCH_HEADS",
    "FlashConfig",
    "pick_config",
    "flash_attention_forward",
    "flash_attention_backward",
]

LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------
# Tile helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _scores(q1, q2, k1, k2, PAIR_HALVES: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``q' . k'`` of two tiles from :func:`_load_encoded` (rows of the first by rows of the
    second), unscaled, fp32."""
    s = tl.dot(q1, tl.trans(k1), input_precision=DOT_PRECISION)
    if PAIR_HALVES:
        s = tl.dot(q2, tl.trans(k2), s, input_precision=DOT_PRECISION)
    return s


@triton.jit
def _affine_positions(start, N: tl.constexpr, pos0, pos_step):
    """The positions of tokens ``start .. start + N - 1`` of a sequence whose positions are
    ``pos0 + pos_step * index`` (exact integers in float32): one multiply-add per block and
    one add per token, no load and no conversion per token."""
    return (pos0 + pos_step * start.to(tl.float32)) + pos_step * tl.arange(0, N).to(tl.float32)


@triton.jit
def _key_tile(
    q1,
    q2,
    K,
    V,
    POS,
    COS,
    SIN,
    BIAS,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    start_n,
    offs_n,
    col_valid,
    row_idx,
    row_pos,
    ref_idx,
    ref_pos,
    pos0,
    pos_step,
    t,
    pair_valid,
    first,
    second,
    gain_1,
    gain_2,
    seq_len,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_FACTOR: tl.constexpr,
    BIAS_OPTIONS: tl.constexpr,
    BIAS_SPLIT: tl.constexpr,
    POS_AFFINE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Load the key block ``offs_n`` (``k'`` as from :func:`_load_encoded` with ``COS``, ``SIN``
    the keys' tables, and ``v``) and score
    the query tile against it: ``s = q' . k'`` unscaled without an additive hook, the base-2
    logit ``qk_scale_log2 * q' . k' + b`` with one; ``f`` = the hook's factor ``e^b`` with
    ``BIAS_FACTOR``, else 1. With ``BIAS_SPLIT`` and not ``MASKED``, the logit holds the key
    part ``w_j`` of the bias only (counted from the token ``ref_idx``); the caller accounts for
    the rows' part.
    ``[BLOCK_M, BLOCK_N]`` fp32; no mask applied (:func:`_keep_allowed`). With ``MASKED``,
    bounded loads."""
    k1, k2 = _load_encoded(
        K, stride_ks, stride_kd, COS, SIN, offs_n, col_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, HAS_TABLES, HAS_GAIN,
        MASKED,
    )  # fmt: skip
    v_ptrs = V + offs_n[:, None] * stride_vs + tl.arange(0, HEAD_DIM)[None, :] * stride_vd
    if MASKED:
        v = tl.load(v_ptrs, mask=col_valid[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    s = _scores(q1, q2, k1, k2, PAIR_HALVES, DOT_PRECISION)
    f = 1.0
    if BIAS_FN is not None:  # the score-bias hook: in base 2, or as a factor
        if MASKED:
            pos_n = tl.load(POS + offs_n, mask=col_valid, other=0.0)
            col_idx = tl.minimum(offs_n, seq_len - 1)
        else:
            pos_n = tl.load(POS + offs_n)
            col_idx = offs_n
        if POS_AFFINE:  # p_0 + step * index: no load
            pos_n = _affine_positions(start_n, offs_n.shape[0], pos0, pos_step)
        if BIAS_SPLIT is not None and not MASKED:  # a vector per tile, in the multiply-add
            key_part = BIAS_SPLIT(col_idx, pos_n, ref_idx, ref_pos, BIAS, False, BIAS_OPTIONS)
            s = s * qk_scale_log2 + key_part[None, :]
        elif BIAS_FACTOR:
            f = BIAS_FN(row_idx, col_idx[None, :], row_pos, pos_n[None, :], BIAS, BIAS_OPTIONS)
        else:
            bias = BIAS_FN(row_idx, col_idx[None, :], row_pos, pos_n[None, :], BIAS, True,
                           BIAS_OPTIONS)  # fmt: skip
            s = s * qk_scale_log2 + bias
    return k1, k2, v, s, f


@triton.jit
def _keep_allowed(x, fill, offs_m, offs_n, col_valid, KPM, CAUSAL: tl.constexpr,
                  HAS_MASK: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """``x`` (``[BLOCK_M, BLOCK_N]``) where key ``offs_n`` is allowed for query ``offs_m``,
    ``fill`` elsewhere. Without ``MASKED`` only the key-padding mask (if any) applies; with it,
    also the causal mask (causal) or the sequence end (bidirectional). A valid row sees no key
    past the end under the causal mask; tail rows are never stored."""
    if MASKED:
        if CAUSAL:
            allowed = offs_m[:, None] >= offs_n[None, :]
        else:
            allowed = col_valid[None, :]
        if HAS_MASK:
            real = tl.load(KPM + offs_n, mask=col_valid, other=0) != 0
            allowed = allowed & real[None, :]
        x = tl.where(allowed, x, fill)
    elif HAS_MASK:
        x = tl.where((tl.load(KPM + offs_n) != 0)[None, :], x, fill)
    return x


@triton.jit
def _far_keys_end(first_query, far_reach, mid, BLOCK_N: tl.constexpr):
    """The end of the key blocks (a multiple of ``BLOCK_N``, at most ``mid``) whose every key is
    at least ``far_reach`` tokens before ``first_query``: block ``[k, k + BLOCK_N)`` is when
    ``first_query - (k + BLOCK_N - 1) >= far_reach``."""
    return tl.minimum(tl.maximum(first_query - far_reach + 1, 0) // BLOCK_N * BLOCK_N, mid)


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------
#
# Each kernel walks its tiles in two loops: the tiles every (query, key) pair of which is
# allowed (below the causal diagonal, and the loop's side of the tile inside the sequence) run a
# loop with no mask, no bounds and no clamping (only a key-padding mask, if given, still
# applies); the others (the diagonal band of a causal mask, the ragged last tile) run the same
# body with the masks. The unmasked loop comes first in the code (the report's static model
# reads the loops in that order). Rows of the program's own block past the end are computed
# like the others and never stored.


@triton.jit
def _fwd_tiles(
    acc,
    l_i,
    m_i,
    q1,
    q2,
    K,
    V,
    POS,
    KPM,
    COS,
    SIN,
    BIAS,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    offs_m,
    row_idx,
    row_pos,
    ref_idx,
    ref_pos,
    pos0,
    pos_step,
    t,
    pair_valid,
    first,
    second,
    gain_1,
    gain_2,
    seq_len,
    qk_scale_log2,
    lo,
    hi,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_FACTOR: tl.constexpr,
    BIAS_OPTIONS: tl.constexpr,
    BIAS_SPLIT: tl.constexpr,
    POS_AFFINE: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Online softmax over the key blocks starting at ``lo, lo + BLOCK_N, ... < hi`` (``COS``,
    ``SIN``: the keys' tables).

    ``qk_scale_log2 >= 0`` (the sign of the scale is in q): without a bias the row maximum is
    taken on the unscaled scores and the scale goes into the exponent's multiply-add. With
    ``MASKED``: the causal mask (causal) or the sequence end (bidirectional), bounded loads.
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_valid = offs_n < seq_len
        k1, k2, v, s, f = _key_tile(
            q1, q2, K, V, POS, COS, SIN, BIAS, stride_ks, stride_kd, stride_vs, stride_vd, start_n,
            offs_n, col_valid, row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step, t, pair_valid,
            first, second, gain_1, gain_2, seq_len, qk_scale_log2, HEAD_DIM, HALF_PAD, HALF_LAYOUT,
            PAIR_HALVES, HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR, BIAS_OPTIONS, BIAS_SPLIT,
            POS_AFFINE, DOT_PRECISION, MASKED,
        )  # fmt: skip
        s = _keep_allowed(s, float("-inf"), offs_m, offs_n, col_valid, KPM, CAUSAL, HAS_MASK,
                          MASKED)  # fmt: skip

        if BIAS_FN is not None and not BIAS_FACTOR:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale_log2)
        if MASKED or HAS_MASK:
            # A row with no allowed key so far keeps m = -inf; shift by 0 so exp2 gives 0.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_shift = m_new
        if BIAS_FN is not None and not BIAS_FACTOR:
            p = tl.exp2(s - m_shift[:, None])
        else:
            p = tl.exp2(s * qk_scale_log2 - m_shift[:, None])
        if BIAS_FACTOR:  # e^(s + b) = e^s e^b: the running max is that of the scores alone
            p = p * f
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


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
    KCOS,
    KSIN,
    GAIN,
    BIAS,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_pos_b,
    stride_tab_b,
    stride_bias_b,
    stride_bias_h,
    seq_len,
    num_heads,
    qk_scale_log2,
    q_sign,
    far_reach,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_FACTOR: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BIAS_OPTIONS: tl.constexpr = None,
    BIAS_SPLIT: tl.constexpr = None,
    POS_AFFINE: tl.constexpr = False,
    BIAS_FAR: tl.constexpr = None,
):
    """One query block of one (batch, head): online softmax over the key blocks.

    ``qk_scale_log2 = |scale| log2 e`` and ``q_sign`` the sign of the scale (+-1, exact in any
    dtype), applied to the q tile once. With ``BIAS_FAR`` (causal), the key blocks at least
    ``far_reach`` tokens before the block's first query run the plain loop, and the hook's
    constant joins the running maximum after it.
    """
    pid_m, pid_bh, Q, K, V, OUT, POS, KPM, COS, SIN, KCOS, KSIN, BIAS = _program_setup(
        Q, K, V, OUT, POS, KPM, COS, SIN, KCOS, KSIN, BIAS, stride_qb, stride_qh, stride_kb,
        stride_kh,
        stride_vb, stride_vh, stride_ob, stride_oh, stride_pos_b, stride_tab_b, stride_bias_b,
        stride_bias_h, num_heads, seq_len, False,
    )  # fmt: skip
    LSE += pid_bh * seq_len

    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, HALF_LAYOUT)
    gain_1, gain_2 = _pair_gains(GAIN, first, second, pair_valid, HAS_GAIN)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < seq_len
    q1, q2 = _load_encoded(
        Q, stride_qs, stride_qd, COS, SIN, offs_m, row_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, HAS_TABLES, HAS_GAIN, True,
    )  # fmt: skip
    q1 = (q1 * q_sign).to(q1.dtype)
    if PAIR_HALVES:
        q2 = (q2 * q_sign).to(q2.dtype)
    else:
        q2 = q1
    # query indices (tails clamped) and positions as [BLOCK_M, 1] columns, for the hook
    row_idx = tl.minimum(offs_m, seq_len - 1)[:, None]
    if BIAS_FN is not None:
        row_pos = tl.load(POS + offs_m, mask=row_valid, other=0.0)[:, None]
    else:
        row_pos = row_idx
    # a split bias (the tiles below the diagonal): both parts counted from the block's first
    # query, which lies between each pair's key and query; the unmasked loop adds the key part,
    # the rows' part (a constant per row) joins the running maximum after it
    ref_idx = tl.minimum(pid_m * BLOCK_M, seq_len - 1)
    ref_pos = 0.0
    if BIAS_SPLIT is not None:
        ref_pos = tl.load(POS + ref_idx)
    pos0, pos_step = position_line(POS, seq_len, POS_AFFINE)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (base 2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    if CAUSAL:  # keys before the block's first query; later key blocks are fully masked
        mid = (pid_m * BLOCK_M) // BLOCK_N * BLOCK_N
        hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)
    else:  # the whole key blocks; then the ragged last one
        mid = seq_len // BLOCK_N * BLOCK_N
        hi = seq_len
    far_end = 0
    if BIAS_FAR is not None:  # tiles of one constant bias: plain attention, then the constant
        far_end = _far_keys_end(pid_m * BLOCK_M, far_reach, mid, BLOCK_N)
        acc, l_i, m_i = _fwd_tiles(
            acc, l_i, m_i, q1, q2, K, V, POS, KPM, KCOS, KSIN, BIAS, stride_ks, stride_kd,
            stride_vs, stride_vd, offs_m, row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step, t,
            pair_valid, first, second, gain_1, gain_2, seq_len, qk_scale_log2, 0, far_end,
            HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, BLOCK_N, HAS_TABLES, HAS_GAIN, None,
            False, BIAS_OPTIONS, None, POS_AFFINE, CAUSAL, HAS_MASK, DOT_PRECISION, False,
        )  # fmt: skip
        m_i += BIAS_FAR(BIAS, far_reach, BIAS_OPTIONS)
    acc, l_i, m_i = _fwd_tiles(
        acc, l_i, m_i, q1, q2, K, V, POS, KPM, KCOS, KSIN, BIAS, stride_ks, stride_kd, stride_vs,
        stride_vd, offs_m, row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step, t, pair_valid, first,
        second, gain_1, gain_2, seq_len, qk_scale_log2, far_end, mid, HEAD_DIM, HALF_PAD, HALF_LAYOUT,
        PAIR_HALVES, BLOCK_N, HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR, BIAS_OPTIONS, BIAS_SPLIT,
        POS_AFFINE, CAUSAL, HAS_MASK, DOT_PRECISION, False,
    )  # fmt: skip
    if BIAS_SPLIT is not None:  # the rows' part; the masked loop adds the whole bias
        m_i += BIAS_SPLIT(
            tl.minimum(offs_m, seq_len - 1), tl.reshape(row_pos, [BLOCK_M]), ref_idx, ref_pos,
            BIAS, True, BIAS_OPTIONS,
        )  # fmt: skip
    acc, l_i, m_i = _fwd_tiles(
        acc, l_i, m_i, q1, q2, K, V, POS, KPM, KCOS, KSIN, BIAS, stride_ks, stride_kd, stride_vs,
        stride_vd, offs_m, row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step, t, pair_valid, first,
        second, gain_1, gain_2, seq_len, qk_scale_log2, mid, hi, HEAD_DIM, HALF_PAD, HALF_LAYOUT,
        PAIR_HALVES, BLOCK_N, HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR, BIAS_OPTIONS, BIAS_SPLIT,
        POS_AFFINE, CAUSAL, HAS_MASK, DOT_PRECISION, True,
    )  # fmt: skip

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
def _flash_bwd_delta_kernel(
    OUT,
    DO,
    DELTA,
    LSE,
    LSE_SPLIT,
    POS,
    BIAS,
    stride_ob,
    stride_oh,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dod,
    stride_pos_b,
    stride_bias_b,
    stride_bias_h,
    seq_len,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BIAS_SPLIT: tl.constexpr = None,
    BIAS_OPTIONS: tl.constexpr = None,
):
    """``delta_i = sum_d dO_id * O_id`` (fp32), one row block of one (batch, head).

    With ``BIAS_SPLIT`` (a causal launch's split bias) also ``lse_i - u_i``, the rows' part
    counted from the first query of the row's block of ``BLOCK_M`` (the dK/dV kernel's query
    tiles): that kernel's tiles below the diagonal read it in place of ``lse``, so the query
    part costs nothing per tile there."""
    # Only the output (in the q slot), dO, the positions and the hook's tensor are read: the
    # other slots get unused pointers.
    pid_m, pid_bh, OUT, _, _, DO, POS, _, _, _, _, _, BIAS = _program_setup(
        OUT, OUT, OUT, DO, POS, DELTA, DELTA, DELTA, DELTA, DELTA, BIAS, stride_ob, stride_oh,
        0, 0, 0, 0,
        stride_dob, stride_doh, stride_pos_b, 0, stride_bias_b, stride_bias_h, num_heads,
        seq_len, False,
    )  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < seq_len
    o = _load_rows(OUT, offs_m, row_valid, HEAD_DIM, 1, HEAD_DIM, True).to(tl.float32)
    do = _load_rows(DO, offs_m, row_valid, stride_dos, stride_dod, HEAD_DIM, True).to(tl.float32)
    delta = tl.sum(o * do, 1)
    tl.store(DELTA + pid_bh * seq_len + offs_m, delta, mask=row_valid)
    if BIAS_SPLIT is not None:
        lse = tl.load(LSE + pid_bh * seq_len + offs_m, mask=row_valid, other=0.0)
        ref_idx = tl.minimum(pid_m * BLOCK_M, seq_len - 1)
        row_pos = tl.load(POS + offs_m, mask=row_valid, other=0.0)
        rows = BIAS_SPLIT(tl.minimum(offs_m, seq_len - 1), row_pos, ref_idx,
                          tl.load(POS + ref_idx), BIAS, True, BIAS_OPTIONS)  # fmt: skip
        tl.store(LSE_SPLIT + pid_bh * seq_len + offs_m, lse - rows, mask=row_valid)


@triton.jit
def _sub_tile_slots(key_block, query_block, num_blocks, grad_slots, R: tl.constexpr,
                    CAUSAL: tl.constexpr):  # fmt: skip
    """``[R]``: the per-tile gradient slots (:func:`.score_bias.tile_slot`, blocks of one
    sub-tile side ``G``) of the ``R`` square sub-tiles of a dK/dV tile, query block
    ``query_block`` against key sub-blocks ``R key_block .. R key_block + R - 1``, counted from
    this (batch, head)'s first slot (``grad_slots`` per (batch, head)); side 1 for a query
    block before the key sub-block. A sub-tile past the last key, wholly above a causal
    diagonal (whose slot would alias one below it) or in a group the buffer does not keep
    (``GradTiles.rows``: fewer rows than ``ceil(num_blocks / 2)``) gets slot -1, this (batch,
    head)'s scratch slot, which nothing reads."""
    sub = key_block * R + tl.arange(0, R)
    side = (query_block < sub).to(tl.int32)
    slot = tile_slot(sub, query_block, num_blocks, side)
    stored = sub < num_blocks
    if CAUSAL:
        rows = grad_slots // (num_blocks + 1)  # one side: the rows kept
        kept = (query_block - sub < rows) | (2 * rows >= num_blocks)
        stored = stored & (query_block >= sub) & kept
    return tl.where(stored, slot, -1)  # the slot before this (batch, head)'s first


@triton.jit
def _dkdv_tiles(
    dk1,
    dk2,
    dv,
    dbias,
    k1,
    k2,
    v,
    Q,
    DO,
    LSE,
    LSE_SPLIT,
    DELTA,
    POS,
    COS,
    SIN,
    BIAS,
    stride_qs,
    stride_qd,
    stride_dos,
    stride_dod,
    offs_n,
    key_real,
    key_idx,
    key_pos,
    key_part,
    ref_idx,
    ref_pos,
    pos0,
    pos_step,
    t,
    pair_valid,
    first,
    second,
    gain_1,
    gain_2,
    seq_len,
    qk_scale_log2,
    lo,
    num_tiles,
    skip_from,
    skip_to,
    key_block,
    grad_slots,
    far_value,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_FACTOR: tl.constexpr,
    BIAS_GRAD_FN: tl.constexpr,
    GRAD_PER_TILE: tl.constexpr,
    GRAD_WIDTH: tl.constexpr,
    BIAS_OPTIONS: tl.constexpr,
    BIAS_SPLIT: tl.constexpr,
    POS_AFFINE: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
    FAR: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
):
    """dK, dV (and the bias gradient) from ``num_tiles`` query blocks starting at ``lo``,
    ``BLOCK_M`` apart; a block that would start at ``skip_from`` or later starts at ``skip_to``
    instead (the masked loop: the diagonal band, then the ragged last block).

    Query rows past the end have ``lse = +inf``, so their ``P`` is 0 with no mask. Key rows past
    the end are masked only where a sum over keys needs it (a key-padding mask, a bias gradient):
    otherwise they are rows of dK/dV that are never stored. With ``GRAD_PER_TILE`` ``dbias``
    points at this (batch, head)'s tile slots and the hook stores the sums of each ``BLOCK_M``
    x ``BLOCK_M`` sub-tile in its own slot (:func:`_sub_tile_slots`, ``grad_slots`` per
    (batch, head)). With ``FAR``, every pair of these tiles has the one bias ``far_value`` (base
    2): no hook is called (the dQ kernel sums these tiles' ``dS`` for the bias's gradient).
    ``ROW_ALIGN``: what ``lo`` is a multiple of.
    """
    for i in range(0, num_tiles):
        start_m = lo + i * BLOCK_M
        if MASKED:
            start_m = tl.where(start_m >= skip_from, skip_to, start_m)
        start_m = tl.multiple_of(start_m, ROW_ALIGN)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_valid = offs_m < seq_len
        q1, q2 = _load_encoded(
            Q, stride_qs, stride_qd, COS, SIN, offs_m, row_valid, t, pair_valid, first, second,
            gain_1, gain_2, HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, HAS_TABLES, HAS_GAIN,
            MASKED,
        )  # fmt: skip
        do = _load_rows(DO, offs_m, row_valid, stride_dos, stride_dod, HEAD_DIM, MASKED)
        if MASKED:
            lse = tl.load(LSE + offs_m, mask=row_valid, other=float("inf"))
            delta = tl.load(DELTA + offs_m, mask=row_valid, other=0.0)
        elif BIAS_SPLIT is not None and BIAS_FN is not None and not FAR:
            lse = tl.load(LSE_SPLIT + offs_m)  # lse_i - u_i, counted from offs_m[0]
            delta = tl.load(DELTA + offs_m)
        else:
            lse = tl.load(LSE + offs_m)
            delta = tl.load(DELTA + offs_m)

        s_t = _scores(k1, k2, q1, q2, PAIR_HALVES, DOT_PRECISION)
        if FAR:  # one constant: out of the log-sum-exp
            p_t = tl.exp2(s_t * qk_scale_log2 - (lse - far_value)[None, :])
        elif BIAS_FN is not None:
            if MASKED:
                pos_m = tl.load(POS + offs_m, mask=row_valid, other=0.0)
                query_idx = tl.minimum(offs_m, seq_len - 1)[None, :]
            else:
                pos_m = tl.load(POS + offs_m)
                query_idx = offs_m[None, :]
            if POS_AFFINE:  # p_0 + step * index: no load
                pos_m = _affine_positions(start_m, BLOCK_M, pos0, pos_step)
            if BIAS_SPLIT is not None and not MASKED:  # key part per program, lse_i - u_i
                # the key part moved from the block's last key to the tile's first query:
                # u_i(ref) - u_i(start) = w_ref(start) - w_ref(ref) for every query i here
                if POS_AFFINE:
                    start_pos = pos0 + pos_step * start_m.to(tl.float32)
                else:
                    start_pos = tl.load(POS + start_m)
                moved = BIAS_SPLIT(ref_idx, ref_pos, start_m, start_pos, BIAS, False,
                                   BIAS_OPTIONS)  # fmt: skip
                p_t = tl.exp2(s_t * qk_scale_log2 + key_part - (lse - moved)[None, :])
            elif BIAS_FACTOR:
                f_t = BIAS_FN(query_idx, key_idx, pos_m[None, :], key_pos, BIAS, BIAS_OPTIONS)
                p_t = tl.exp2(s_t * qk_scale_log2 - lse[None, :]) * f_t
            else:
                bias = BIAS_FN(query_idx, key_idx, pos_m[None, :], key_pos, BIAS, True,
                               BIAS_OPTIONS)  # fmt: skip
                p_t = tl.exp2(s_t * qk_scale_log2 + bias - lse[None, :])
        else:
            p_t = tl.exp2(s_t * qk_scale_log2 - lse[None, :])
        if MASKED and CAUSAL:
            allowed = offs_m[None, :] >= offs_n[:, None]
            if HAS_MASK or BIAS_GRAD_FN is not None:
                allowed = allowed & key_real[:, None]
            p_t = tl.where(allowed, p_t, 0.0)
        elif HAS_MASK or (BIAS_GRAD_FN is not None and not FAR):
            p_t = tl.where(key_real[:, None], p_t, 0.0)

        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if FAR:  # no hook here (the dQ kernel sums these tiles' dS for the constant)
            dbias = dbias
        elif BIAS_GRAD_FN is not None and GRAD_PER_TILE:  # queries are axis 1 of these tiles
            slots = _sub_tile_slots(key_block, start_m // BLOCK_M, tl.cdiv(seq_len, BLOCK_M),
                                    grad_slots, offs_n.shape[0] // BLOCK_M, CAUSAL)  # fmt: skip
            BIAS_GRAD_FN(dbias + slots * GRAD_WIDTH, ds_t, query_idx, key_idx, pos_m[None, :],
                         key_pos, BIAS, 1, BIAS_OPTIONS)  # fmt: skip
        elif BIAS_GRAD_FN is not None:
            dbias = BIAS_GRAD_FN(
                dbias, ds_t, query_idx, key_idx, pos_m[None, :], key_pos, BIAS, 1, BIAS_OPTIONS
            )
        ds_t = ds_t.to(q1.dtype)
        dk1 = tl.dot(ds_t, q1, dk1, input_precision=DOT_PRECISION)
        if PAIR_HALVES:
            dk2 = tl.dot(ds_t, q2, dk2, input_precision=DOT_PRECISION)
    return dk1, dk2, dv, dbias


@triton.jit
def _flash_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    LSE_SPLIT,
    DELTA,
    DK,
    DV,
    POS,
    KPM,
    COS,
    SIN,
    KCOS,
    KSIN,
    GAIN,
    BIAS,
    DBIAS,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dod,
    stride_pos_b,
    stride_tab_b,
    stride_bias_b,
    stride_bias_h,
    seq_len,
    num_heads,
    scale,
    qk_scale_log2,
    grad_slots,
    far_reach,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_FACTOR: tl.constexpr,
    BIAS_GRAD_FN: tl.constexpr,
    GRAD_WIDTH: tl.constexpr,
    GRAD_PER_TILE: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BIAS_OPTIONS: tl.constexpr = None,
    BIAS_SPLIT: tl.constexpr = None,
    POS_AFFINE: tl.constexpr = False,
    BIAS_FAR: tl.constexpr = None,
    FAR_BLOCK_M: tl.constexpr = 0,
):
    """dK and dV for one key block, walking the query blocks (transposed tiles ``[keys, queries]``).

    ``P^T = exp2(S^T - lse)``, ``dV = P^T dO``, ``dS^T = P^T * (V dO^T - delta)``,
    ``dk' = scale * dS^T q'`` (per pair half), then ``dk`` through the transposed transform.
    With ``BIAS_GRAD_FN``, the score bias's parameter gradient from ``dS`` as this program's
    partial sums, stored at ``DBIAS[batch*head, key block, :GRAD_WIDTH]``; with
    ``GRAD_PER_TILE`` (``BLOCK_N`` a multiple of ``BLOCK_M``), one slot per ``BLOCK_M`` x
    ``BLOCK_M`` sub-tile instead, ``DBIAS[batch*head, 1 + tile slot, :GRAD_WIDTH]``
    (``grad_slots`` of them per (batch, head), after a scratch slot for sub-tiles that have
    none). With ``BIAS_FAR`` (causal), the query blocks at least ``far_reach`` tokens after the
    block's last key run without the hook, ``FAR_BLOCK_M`` queries per tile (a multiple of
    ``BLOCK_M``); the dQ kernel sums their ``dS`` for the bias's gradient.
    """
    pid_n, pid_bh, Q, K, V, DO, POS, KPM, COS, SIN, KCOS, KSIN, BIAS = _program_setup(
        Q, K, V, DO, POS, KPM, COS, SIN, KCOS, KSIN, BIAS, stride_qb, stride_qh, stride_kb,
        stride_kh,
        stride_vb, stride_vh, stride_dob, stride_doh, stride_pos_b, stride_tab_b, stride_bias_b,
        stride_bias_h, num_heads, seq_len, False,
    )  # fmt: skip
    DK += pid_bh * seq_len * HEAD_DIM
    DV += pid_bh * seq_len * HEAD_DIM
    LSE += pid_bh * seq_len
    LSE_SPLIT += pid_bh * seq_len
    DELTA += pid_bh * seq_len

    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, HALF_LAYOUT)
    gain_1, gain_2 = _pair_gains(GAIN, first, second, pair_valid, HAS_GAIN)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = offs_n < seq_len
    key_real = col_valid
    if HAS_MASK:
        key_real = key_real & (tl.load(KPM + offs_n, mask=col_valid, other=0) != 0)
    # key indices (tails clamped) and positions as [BLOCK_N, 1] columns, for the hook
    key_idx = tl.minimum(offs_n, seq_len - 1)[:, None]
    if BIAS_FN is not None:
        key_pos = tl.load(POS + offs_n, mask=col_valid, other=0.0)[:, None]
    else:
        key_pos = key_idx
    # a split bias (the unmasked loop: queries after the whole key block): the key part counted
    # from the block's last key, once here; the tiles read lse_i - u_i with the rows' part
    # counted from the tile's first query (LSE_SPLIT, from the delta pass) and move the key
    # part to that reference, one scalar per tile (key_part less w_ref(ref), ref's own part)
    ref_idx = tl.minimum(pid_n * BLOCK_N + BLOCK_N - 1, seq_len - 1)
    ref_pos = 0.0
    pos0, pos_step = position_line(POS, seq_len, POS_AFFINE)
    key_part = 0.0
    if BIAS_SPLIT is not None:
        ref_pos = tl.load(POS + ref_idx)
        key_part = BIAS_SPLIT(key_idx, key_pos, ref_idx, ref_pos, BIAS, False, BIAS_OPTIONS)
        key_part -= BIAS_SPLIT(ref_idx, ref_pos, ref_idx, ref_pos, BIAS, False, BIAS_OPTIONS)
    if BIAS_GRAD_FN is not None and GRAD_PER_TILE:
        # this (batch, head)'s tile slots, after its scratch slot
        dbias = DBIAS + (pid_bh * (grad_slots + 1) + 1) * GRAD_WIDTH
    elif BIAS_GRAD_FN is not None:
        dbias = tl.zeros([GRAD_WIDTH], dtype=tl.float32)
    else:
        dbias = 0.0
    k1, k2 = _load_encoded(
        K, stride_ks, stride_kd, KCOS, KSIN, offs_n, col_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, HAS_TABLES, HAS_GAIN, True,
    )  # fmt: skip
    v = _load_rows(V, offs_n, col_valid, stride_vs, stride_vd, HEAD_DIM, True)

    if PAIR_HALVES:
        dk1 = tl.zeros([BLOCK_N, HALF_PAD], dtype=tl.float32)
        dk2 = tl.zeros([BLOCK_N, HALF_PAD], dtype=tl.float32)
    else:
        dk1 = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
        dk2 = dk1
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Query blocks [lo, band_end) hold the diagonal (causal; earlier queries cannot see these
    # keys, so lo is where the walk starts); [band_end, full_end) are whole blocks every query
    # of which sees every key; [full_end, seq_len) is the ragged last block.
    full_end = seq_len // BLOCK_M * BLOCK_M
    if CAUSAL:
        lo = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M
        band_end = tl.cdiv((pid_n + 1) * BLOCK_N, BLOCK_M) * BLOCK_M
    else:
        lo = 0
        band_end = 0
    far_start = full_end
    if BIAS_FAR is not None:  # query blocks of one constant bias: no hook in their loop
        far_start = tl.minimum(
            tl.maximum(tl.cdiv(pid_n * BLOCK_N + BLOCK_N - 1 + far_reach, BLOCK_M) * BLOCK_M,
                       band_end), full_end,
        )  # fmt: skip
        # whole tiles of FAR_BLOCK_M rows, ending at full_end; a far block left over at the
        # start runs with the hook (the same bias there)
        num_far = tl.maximum(full_end - far_start, 0) // FAR_BLOCK_M
        far_start = full_end - num_far * FAR_BLOCK_M
        dk1, dk2, dv, dbias = _dkdv_tiles(
            dk1, dk2, dv, dbias, k1, k2, v, Q, DO, LSE, LSE_SPLIT, DELTA, POS, COS, SIN, BIAS,
            stride_qs, stride_qd, stride_dos, stride_dod, offs_n, key_real, key_idx, key_pos,
            key_part, ref_idx, ref_pos, pos0, pos_step, t, pair_valid, first, second, gain_1,
            gain_2, seq_len, qk_scale_log2, far_start, num_far, 0, 0, pid_n, 0, BIAS_FAR(BIAS,
            far_reach, BIAS_OPTIONS), HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, FAR_BLOCK_M,
            HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR, BIAS_GRAD_FN, GRAD_PER_TILE, GRAD_WIDTH,
            BIAS_OPTIONS, BIAS_SPLIT, POS_AFFINE, CAUSAL, HAS_MASK, DOT_PRECISION, False, True,
            BLOCK_M,
        )  # fmt: skip
    num_free = tl.maximum(far_start - band_end, 0) // BLOCK_M
    dk1, dk2, dv, dbias = _dkdv_tiles(
        dk1, dk2, dv, dbias, k1, k2, v, Q, DO, LSE, LSE_SPLIT, DELTA, POS, COS, SIN, BIAS,
        stride_qs, stride_qd, stride_dos, stride_dod, offs_n, key_real, key_idx, key_pos, key_part,
        ref_idx, ref_pos, pos0, pos_step, t, pair_valid, first, second, gain_1, gain_2, seq_len,
        qk_scale_log2, band_end, num_free, 0, 0, pid_n, grad_slots, 0.0, HEAD_DIM, HALF_PAD,
        HALF_LAYOUT, PAIR_HALVES, BLOCK_M, HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR,
        BIAS_GRAD_FN, GRAD_PER_TILE, GRAD_WIDTH, BIAS_OPTIONS, BIAS_SPLIT, POS_AFFINE, CAUSAL,
        HAS_MASK, DOT_PRECISION, False, False, BLOCK_M,
    )  # fmt: skip
    num_band = tl.cdiv(tl.minimum(band_end, seq_len) - lo, BLOCK_M)
    num_tail = (full_end < seq_len) & (full_end >= band_end)
    dk1, dk2, dv, dbias = _dkdv_tiles(
        dk1, dk2, dv, dbias, k1, k2, v, Q, DO, LSE, LSE_SPLIT, DELTA, POS, COS, SIN, BIAS,
        stride_qs, stride_qd, stride_dos, stride_dod, offs_n, key_real, key_idx, key_pos, key_part,
        ref_idx, ref_pos, pos0, pos_step, t, pair_valid, first, second, gain_1, gain_2, seq_len,
        qk_scale_log2, lo, num_band + num_tail.to(tl.int32), band_end, full_end, pid_n, grad_slots,
        0.0, HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, BLOCK_M, HAS_TABLES, HAS_GAIN, BIAS_FN,
        BIAS_FACTOR, BIAS_GRAD_FN, GRAD_PER_TILE, GRAD_WIDTH, BIAS_OPTIONS, BIAS_SPLIT, POS_AFFINE,
        CAUSAL, HAS_MASK, DOT_PRECISION, True, False, BLOCK_M,
    )  # fmt: skip

    _store_decoded(
        DK, dk1 * scale, dk2 * scale, KCOS, KSIN, offs_n, col_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, PAIR_HALVES, HAS_TABLES, HAS_GAIN,
    )  # fmt: skip
    tl.store(
        DV + offs_n[:, None] * HEAD_DIM + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=col_valid[:, None],
    )
    if BIAS_GRAD_FN is not None and not GRAD_PER_TILE:
        slot = (pid_bh * tl.num_programs(0) + pid_n) * GRAD_WIDTH
        tl.store(DBIAS + slot + tl.arange(0, GRAD_WIDTH), dbias)


@triton.jit
def _dq_tiles(
    dq1,
    dq2,
    rows,
    far_rows,
    far_reach,
    q1,
    q2,
    do,
    lse,
    delta,
    K,
    V,
    POS,
    KPM,
    COS,
    SIN,
    BIAS,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    offs_m,
    row_idx,
    row_pos,
    ref_idx,
    ref_pos,
    pos0,
    pos_step,
    t,
    pair_valid,
    first,
    second,
    gain_1,
    gain_2,
    seq_len,
    qk_scale_log2,
    lo,
    hi,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_FACTOR: tl.constexpr,
    BIAS_OPTIONS: tl.constexpr,
    BIAS_SPLIT: tl.constexpr,
    POS_AFFINE: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
    ROW_SUMS: tl.constexpr,
    FAR_ROWS: tl.constexpr,
):
    """dQ from the key blocks starting at ``lo, lo + BLOCK_N, ... < hi`` (``COS``, ``SIN``: the
    keys' tables); with ``ROW_SUMS``, also ``rows_i += sum_j dS_ij`` (float32, ``[BLOCK_M]``);
    ``FAR_ROWS`` 1: ``far_rows_i += sum_j dS_ij`` (tiles every pair of which is ``far_reach``
    apart), 2: the same over the pairs with ``i - j >= far_reach`` only.

    Query rows past the end have ``lse = +inf`` (their ``P`` is 0 with no mask); with
    ``MASKED``, the causal mask (causal) or the sequence end (bidirectional), bounded loads.
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_valid = offs_n < seq_len
        k1, k2, v, s, f = _key_tile(
            q1, q2, K, V, POS, COS, SIN, BIAS, stride_ks, stride_kd, stride_vs, stride_vd, start_n,
            offs_n, col_valid, row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step, t, pair_valid,
            first, second, gain_1, gain_2, seq_len, qk_scale_log2, HEAD_DIM, HALF_PAD, HALF_LAYOUT,
            PAIR_HALVES, HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR, BIAS_OPTIONS, BIAS_SPLIT,
            POS_AFFINE, DOT_PRECISION, MASKED,
        )  # fmt: skip
        if BIAS_FN is not None and not BIAS_FACTOR:
            p = tl.exp2(s - lse[:, None])
        else:
            p = tl.exp2(s * qk_scale_log2 - lse[:, None])
        if BIAS_FACTOR:
            p = p * f
        p = _keep_allowed(p, 0.0, offs_m, offs_n, col_valid, KPM, CAUSAL, HAS_MASK, MASKED)

        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if ROW_SUMS:
            rows += tl.sum(ds, 1)
        if FAR_ROWS == 1:
            far_rows += tl.sum(ds, 1)
        elif FAR_ROWS == 2:
            past = offs_m[:, None] - offs_n[None, :] >= far_reach
            far_rows += tl.sum(tl.where(past, ds, 0.0), 1)
        ds = ds.to(k1.dtype)
        dq1 = tl.dot(ds, k1, dq1, input_precision=DOT_PRECISION)
        if PAIR_HALVES:
            dq2 = tl.dot(ds, k2, dq2, input_precision=DOT_PRECISION)
    return dq1, dq2, rows, far_rows


@triton.jit
def _flash_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    ROWS,
    FAR_SUMS,
    POS,
    KPM,
    COS,
    SIN,
    KCOS,
    KSIN,
    GAIN,
    BIAS,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dod,
    stride_pos_b,
    stride_tab_b,
    stride_bias_b,
    stride_bias_h,
    seq_len,
    num_heads,
    scale,
    qk_scale_log2,
    far_reach,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_FACTOR: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BIAS_OPTIONS: tl.constexpr = None,
    ROW_SUMS: tl.constexpr = False,
    BIAS_SPLIT: tl.constexpr = None,
    POS_AFFINE: tl.constexpr = False,
    BIAS_FAR: tl.constexpr = None,
    FAR_GRAD: tl.constexpr = False,
):
    """dQ for one query block, walking the key blocks.

    ``P = exp2(S - lse)``, ``dS = P * (dO V^T - delta)``, ``dq' = scale * dS k'`` (per pair
    half), then ``dq`` through the transposed transform. With ``ROW_SUMS``, also stores
    ``ROWS[bh, i] = sum_j dS_ij`` (float32): the query side of a per-token bias's gradient.
    With ``BIAS_FAR``, the key blocks at least ``far_reach`` tokens before the block's first
    query run without the hook, as in the forward; with ``FAR_GRAD``, the sum of ``dS`` over
    every pair at least that far apart (the gradient of the hook's far constant: the dK/dV
    kernel leaves those tiles out of the hook's gradient) goes to ``FAR_SUMS[bh, query
    block]``.
    """
    pid_m, pid_bh, Q, K, V, DO, POS, KPM, COS, SIN, KCOS, KSIN, BIAS = _program_setup(
        Q, K, V, DO, POS, KPM, COS, SIN, KCOS, KSIN, BIAS, stride_qb, stride_qh, stride_kb,
        stride_kh,
        stride_vb, stride_vh, stride_dob, stride_doh, stride_pos_b, stride_tab_b, stride_bias_b,
        stride_bias_h, num_heads, seq_len, False,
    )  # fmt: skip
    DQ += pid_bh * seq_len * HEAD_DIM
    LSE += pid_bh * seq_len
    DELTA += pid_bh * seq_len

    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, HALF_LAYOUT)
    gain_1, gain_2 = _pair_gains(GAIN, first, second, pair_valid, HAS_GAIN)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = offs_m < seq_len
    q1, q2 = _load_encoded(
        Q, stride_qs, stride_qd, COS, SIN, offs_m, row_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, HALF_PAD, HALF_LAYOUT, PAIR_HALVES, HAS_TABLES, HAS_GAIN, True,
    )  # fmt: skip
    do = _load_rows(DO, offs_m, row_valid, stride_dos, stride_dod, HEAD_DIM, True)
    lse = tl.load(LSE + offs_m, mask=row_valid, other=float("inf"))
    delta = tl.load(DELTA + offs_m, mask=row_valid, other=0.0)
    row_idx = tl.minimum(offs_m, seq_len - 1)[:, None]
    if BIAS_FN is not None:
        row_pos = tl.load(POS + offs_m, mask=row_valid, other=0.0)[:, None]
    else:
        row_pos = row_idx
    # a split bias (the tiles below the diagonal, as in the forward): the unmasked loop adds
    # the key part and takes the rows' part out of the log-sum-exp, once
    ref_idx = tl.minimum(pid_m * BLOCK_M, seq_len - 1)
    ref_pos = 0.0
    lse_split = lse
    pos0, pos_step = position_line(POS, seq_len, POS_AFFINE)
    if BIAS_SPLIT is not None:
        ref_pos = tl.load(POS + ref_idx)
        lse_split = lse - BIAS_SPLIT(
            tl.minimum(offs_m, seq_len - 1), tl.reshape(row_pos, [BLOCK_M]), ref_idx, ref_pos,
            BIAS, True, BIAS_OPTIONS,
        )  # fmt: skip

    if PAIR_HALVES:
        dq1 = tl.zeros([BLOCK_M, HALF_PAD], dtype=tl.float32)
        dq2 = tl.zeros([BLOCK_M, HALF_PAD], dtype=tl.float32)
    else:
        dq1 = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        dq2 = dq1
    rows = tl.zeros([BLOCK_M], dtype=tl.float32)
    far_rows = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum of dS past the far reach, per row
    if CAUSAL:
        mid = (pid_m * BLOCK_M) // BLOCK_N * BLOCK_N
        hi = tl.minimum((pid_m + 1) * BLOCK_M, seq_len)
    else:
        mid = seq_len // BLOCK_N * BLOCK_N
        hi = seq_len
    far_end = 0
    if BIAS_FAR is not None:  # tiles of one constant bias (as in the forward): out of the lse
        far_end = _far_keys_end(pid_m * BLOCK_M, far_reach, mid, BLOCK_N)
        dq1, dq2, rows, far_rows = _dq_tiles(
            dq1, dq2, rows, far_rows, far_reach, q1, q2, do,
            lse - BIAS_FAR(BIAS, far_reach, BIAS_OPTIONS), delta, K,
            V, POS, KPM, KCOS, KSIN, BIAS, stride_ks, stride_kd, stride_vs, stride_vd, offs_m,
            row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step, t, pair_valid, first, second,
            gain_1, gain_2, seq_len, qk_scale_log2, 0, far_end, HEAD_DIM, HALF_PAD, HALF_LAYOUT,
            PAIR_HALVES, BLOCK_N, HAS_TABLES, HAS_GAIN, None, False, BIAS_OPTIONS, None,
            POS_AFFINE, CAUSAL, HAS_MASK, DOT_PRECISION, False, ROW_SUMS, 1 if FAR_GRAD else 0,
        )  # fmt: skip
    dq1, dq2, rows, far_rows = _dq_tiles(
        dq1, dq2, rows, far_rows, far_reach, q1, q2, do, lse_split, delta, K, V, POS, KPM, KCOS, KSIN, BIAS, stride_ks,
        stride_kd, stride_vs, stride_vd, offs_m, row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step,
        t, pair_valid, first, second, gain_1, gain_2, seq_len, qk_scale_log2, far_end, mid, HEAD_DIM,
        HALF_PAD, HALF_LAYOUT, PAIR_HALVES, BLOCK_N, HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR,
        BIAS_OPTIONS, BIAS_SPLIT, POS_AFFINE, CAUSAL, HAS_MASK, DOT_PRECISION, False, ROW_SUMS,
        2 if FAR_GRAD else 0,
    )  # fmt: skip
    dq1, dq2, rows, far_rows = _dq_tiles(
        dq1, dq2, rows, far_rows, far_reach, q1, q2, do, lse, delta, K, V, POS, KPM, KCOS, KSIN, BIAS, stride_ks,
        stride_kd, stride_vs, stride_vd, offs_m, row_idx, row_pos, ref_idx, ref_pos, pos0, pos_step,
        t, pair_valid, first, second, gain_1, gain_2, seq_len, qk_scale_log2, mid, hi, HEAD_DIM,
        HALF_PAD, HALF_LAYOUT, PAIR_HALVES, BLOCK_N, HAS_TABLES, HAS_GAIN, BIAS_FN, BIAS_FACTOR,
        BIAS_OPTIONS, BIAS_SPLIT, POS_AFFINE, CAUSAL, HAS_MASK, DOT_PRECISION, True, ROW_SUMS,
        2 if FAR_GRAD else 0,
    )  # fmt: skip
    if FAR_GRAD:
        tl.store(FAR_SUMS + pid_bh * tl.num_programs(0) + pid_m, tl.sum(far_rows))
    if ROW_SUMS:
        tl.store(ROWS + pid_bh * seq_len + offs_m, rows, mask=row_valid)

    _store_decoded(
        DQ, dq1 * scale, dq2 * scale, COS, SIN, offs_m, row_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, PAIR_HALVES, HAS_TABLES, HAS_GAIN,
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

# (block_m, block_n, num_warps, num_stages) on a GPU, unless _CARRY_CONFIGS below has an entry;
# block_m indexes queries, block_n keys. Chosen so that ptxas (sm_90, triton 3.6 and 3.9) needs
# no or only a few bytes of register spills in every position mode: the dK/dV kernel keeps
# three accumulators per key row, so it walks narrow query blocks; the dQ kernel the other way
# round. fp32 uses exact (non tensor-core) products and small tiles.
_GPU_CONFIGS: dict[tuple[str, str], tuple[int, int, int, int]] = {
    ("forward", "16bit"): (128, 64, 8, 3),
    ("forward", "16bit-wide"): (128, 64, 8, 2),
    ("dkdv", "16bit"): (32, 128, 8, 2),
    ("dkdv", "16bit-wide"): (32, 64, 8, 2),
    ("dq", "16bit"): (128, 32, 8, 2),
    ("dq", "16bit-wide"): (64, 32, 8, 2),
    ("forward", "fp32"): (64, 32, 8, 1),
    ("dkdv", "fp32"): (16, 32, 8, 1),
    ("dq", "fp32"): (32, 16, 8, 2),
}
# 16-bit launches by what their loops carry: "plain" (no score bias; q/k tables are applied
# before the loops, kernels/qk_transform.py) or "bias" (a score-bias hook), keyed (90 for an
# H100 or None for any other GPU, kernel, family, carries); a missing entry falls back to
# _GPU_CONFIGS. On an H100 a
# warpgroup's MMA covers 64 rows, so the row side of every product of 8 warps is 128 (with 64
# rows both warpgroups would compute the same product), and the per-tile loop overhead
# (barriers, fences, descriptors) is spread over large tiles: chosen from the report's static
# model (course_lib.gpu_report, triton 3.9 / ptxas 13.4) among the tiles whose inner loops do
# no spill traffic (the dK/dV kernel with a hook keeps about 100-300 bytes of spilled values
# outside its loops; the report lists them). Elsewhere (A100) the tiles with a hook at head_dim
# 128 are those that spill least.
_CARRY_CONFIGS: dict[tuple[int | None, str, str, str], tuple[int, int, int, int]] = {
    (90, "forward", "16bit", "plain"): (256, 64, 8, 3),
    (90, "forward", "16bit", "bias"): (256, 64, 8, 2),
    (90, "dkdv", "16bit", "plain"): (64, 128, 8, 2),
    (90, "dkdv", "16bit", "bias"): (64, 128, 8, 2),
    (90, "dq", "16bit", "plain"): (128, 64, 8, 2),
    (90, "dq", "16bit", "bias"): (128, 64, 8, 2),
    (90, "dkdv", "16bit-wide", "plain"): (32, 128, 8, 2),
    (90, "dkdv", "16bit-wide", "bias"): (32, 128, 8, 2),
    (90, "dq", "16bit-wide", "plain"): (128, 32, 8, 2),
    (90, "dq", "16bit-wide", "bias"): (128, 32, 8, 2),
    # a hook whose gradient is written per square sub-tile (the per-distance table): at head_dim
    # 64 a square tile on one warpgroup issues about 4% fewer memory instructions per pair than
    # 64 x 128 on two (calibrated: 0.77 of plain flash with T5's far tiles, 0.74 on 64 x 128);
    # at 128 the bias tiles (4 sub-tiles of 32) do better than 64 x 64 did (0.78 against 0.70)
    (90, "dkdv", "16bit", "per_tile"): (64, 64, 4, 2),
    (None, "forward", "16bit-wide", "bias"): (128, 32, 8, 2),
    (None, "dkdv", "16bit-wide", "bias"): (32, 32, 4, 2),
    (None, "dq", "16bit-wide", "bias"): (32, 32, 4, 2),
}
# Learners' GPUs with less shared memory per block than an A100: 99 KiB (sm_86 A10 / RTX 30xx,
# sm_89 L4 / RTX 40xx, sm_120 RTX 50xx) or 64 KiB (sm_75 T4 / RTX 20xx). Keyed (class, kernel,
# family, carries) and looked up after the GPU's own entries, before the generic ones. The
# shared memory of each is what `python -m course_lib.gpu_report --archs 86 75` measured on the
# compiled kernels (a hook can need more than a plain launch: the per-distance table's forward
# needed 147 KiB at 128 x 64 tiles and 3 stages). On sm_75 Triton 3.9 has no tensor-core path:
# its dots run on the CUDA cores, whose operand layouts take more shared memory (the dK/dV
# kernel at 32 x 128 tiles needed 80 KiB there against 40 KiB on sm_86).
_SMEM_CLASSES: tuple[tuple[int, str], ...] = ((64 * 1024, "64k"), (100 * 1024, "99k"))
_SMEM_CLASS_CONFIGS: dict[tuple[str, str, str, str], tuple[int, int, int, int]] = {
    ("99k", "forward", "16bit", "bias"): (64, 64, 4, 2),
    **{("64k", "forward", "16bit", c): (64, 64, 4, 2) for c in ("plain", "bias")},
    **{("64k", "forward", "16bit-wide", c): (64, 32, 4, 2) for c in ("plain", "bias")},
    **{("64k", "dkdv", "16bit", c): (32, 64, 4, 2) for c in ("plain", "bias")},
    ("64k", "dkdv", "16bit", "per_tile"): (32, 32, 4, 2),
    **{("64k", "dq", "16bit", c): (64, 32, 4, 2) for c in ("plain", "bias")},
    **{("64k", "dkdv", "16bit-wide", c): (32, 32, 4, 2) for c in ("plain", "bias")},
    **{("64k", "dq", "16bit-wide", c): (32, 32, 4, 2) for c in ("plain", "bias")},
}


def smem_class(device: torch.device) -> str | None:
    """``"64k"`` or ``"99k"`` for a GPU with at most that much shared memory per block, else
    None (an A100 or larger, or the interpreter)."""
    limit = smem_per_block(device)
    if limit == 0:
        return None
    return next((name for size, name in _SMEM_CLASSES if limit <= size), None)


# In the CPU interpreter the cost is per program step, so blocks are 32-64 wide (and unequal,
# as on the GPU, so the tests cover the block-boundary logic of each kernel).
_INTERPRETER_CONFIGS: dict[str, tuple[int, int]] = {
    "forward": (64, 32),
    "dkdv": (32, 64),
    "dq": (64, 32),
}


def pick_config(
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    bias: bool = False,
    per_tile: bool = False,
) -> FlashConfig:
    """Block sizes and launch options of one kernel (``"forward"``, ``"dkdv"`` or ``"dq"``) for
    a launch whose loops carry a score-bias hook (``bias``) or not. The GPU's shared memory per
    block picks smaller tiles where the defaults would not fit (:data:`_SMEM_CLASS_CONFIGS`).
    ``per_tile``: the hook's gradient is written per square sub-tile (dK/dV), which takes the
    ``"per_tile"`` entries where there are some and the hook's tiles otherwise; every dK/dV
    tile has a multiple of its queries as keys."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
    arch = gpu_arch(device)
    if arch is None:
        return FlashConfig(*_INTERPRETER_CONFIGS[kernel])
    family = _tile_family(head_dim, dtype)
    carried = ("per_tile", "bias") if per_tile else ("bias",) if bias else ("plain",)
    small = smem_class(device)
    block_m, block_n, num_warps, num_stages = next(
        config
        for config in (
            *(
                _CARRY_CONFIGS.get((arch, kernel, family, c)) if arch == 90 else None
                for c in carried
            ),
            *(_SMEM_CLASS_CONFIGS.get((small, kernel, family, c)) for c in carried),
            *(
                _CARRY_CONFIGS.get((None, kernel, family, c)) if arch != 90 else None
                for c in carried
            ),
            _GPU_CONFIGS[(kernel, family)],
        )  # fmt: skip
        if config is not None
    )
    return FlashConfig(block_m, block_n, num_warps=num_warps, num_stages=num_stages)


def _tile_family(head_dim: int, dtype: torch.dtype) -> str:
    """The tile tables' family: ``"fp32"``, ``"16bit"`` or ``"16bit-wide"`` (head_dim 128)."""
    if dtype == torch.float32:
        return "fp32"
    return "16bit-wide" if head_dim >= 128 else "16bit"


# What a CUDA GPU times besides pick_config's tiles on the first call of a shape
# (kernels/tuning.py), (block_m, block_n, num_warps, num_stages) by (kernel, family): the Triton
# tutorial's shapes (forward 128 x 64 on 4 warps, dK/dV 32 x 128, dQ 128 x 32), the tables'
# entries of other GPUs, and 4 or 8 warps. A GPU of a small shared-memory class tries instead
# its pick on the other number of warps and halved along either side; fp32 keeps its pick.
# Every one compiles and fits on sm_90, sm_80, sm_86 and sm_75 (compiled ahead of time); at
# head_dim 128 the tutorial's shapes on 4 warps are left out: ptxas spilled 4-40 KB there (dK/dV
# 32 x 128), 0.4-0.8 KB (dQ 128 x 32) and 0.2 KB with a bias (forward 128 x 32).
_TUNING_ALTERNATIVES: dict[tuple[str, str], tuple[tuple[int, int, int, int], ...]] = {
    ("forward", "16bit"): ((128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)),
    ("forward", "16bit-wide"): ((128, 64, 8, 3), (64, 64, 4, 2)),
    ("dkdv", "16bit"): ((32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 2)),
    ("dkdv", "16bit-wide"): ((32, 64, 4, 2), (64, 64, 8, 2)),
    ("dq", "16bit"): ((128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 2)),
    ("dq", "16bit-wide"): ((64, 32, 4, 2), (64, 64, 8, 2)),
}


def config_candidates(
    kernel: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    bias: bool = False,
    per_tile: bool = False,
) -> list[FlashConfig]:
    """The tiles a GPU may time for one kernel: :func:`pick_config`'s first, then the
    alternatives of :data:`_TUNING_ALTERNATIVES` that suit the GPU (a dK/dV tile with a
    per-sub-tile gradient keeps keys a multiple of its queries). Only the pick in the
    interpreter and for fp32."""
    pick = pick_config(kernel, head_dim, dtype, device, bias=bias, per_tile=per_tile)
    family = _tile_family(head_dim, dtype)
    if gpu_arch(device) is None or family == "fp32":
        return [pick]
    bm, bn, warps, stages = pick.block_m, pick.block_n, pick.num_warps, pick.num_stages
    shapes = [(bm, bn, warps, stages)]
    if smem_class(device) is None:
        alternatives = _TUNING_ALTERNATIVES[(kernel, family)]
    else:  # nothing larger than what fits
        alternatives = ((bm, bn, 8 if warps == 4 else 4, stages), (bm // 2, bn, warps, stages),
                        (bm, bn // 2, warps, stages))  # fmt: skip
    for shape in alternatives:
        if min(shape[:2]) < 16 or (per_tile and kernel == "dkdv" and shape[1] % shape[0]):
            continue
        if shape not in shapes:
            shapes.append(shape)
    return [FlashConfig(bm, bn, num_warps=w, num_stages=st) for bm, bn, w, st in shapes]


def tuning_candidates(
    pass_: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    causal: bool,
    biased: bool,
    per_tile: bool,
) -> list[dict]:
    """Launch arguments a GPU times for one pass (:mod:`.tuning`), the static pick first:
    ``{"config": ...}`` for ``"forward"``, ``{"configs": {"dkdv": ..., "dq": ...}}`` for
    ``"backward"`` (every pair of the two kernels' candidates: each compiles once, and a pair
    costs only its timing). ``causal`` does not change the lists."""
    del causal
    if pass_ == "forward":
        return [
            {"config": c}
            for c in config_candidates("forward", head_dim, dtype, device, bias=biased)
        ]
    if pass_ != "backward":
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    dkdv = config_candidates("dkdv", head_dim, dtype, device, bias=biased, per_tile=per_tile)
    dq = config_candidates("dq", head_dim, dtype, device, bias=biased)
    return [{"configs": {"dkdv": a, "dq": b}} for a in dkdv for b in dq]


def _forward_scale(scale: float) -> tuple[float, float]:
    """The forward kernel's ``(qk_scale_log2, q_sign)``: ``|scale| log2 e`` (at least 1e-30, so
    that a masked score, -inf, stays -inf once scaled) and the sign of ``scale``, applied to q."""
    return max(abs(scale) * LOG2E, 1e-30), (-1.0 if scale < 0 else 1.0)


def _bias_split(a: LaunchArgs, causal: bool, positions_ordered: bool):
    """The hook's split form (see :mod:`.score_bias`) for a causal launch's tiles below the
    diagonal, else None; with ``split_ordered``, only where positions never decrease along a
    sequence (every key of those tiles then has ``p_j <= p_i``)."""
    split = None if a.hook is None else getattr(a.hook, "split", None)
    if split is None or not causal or (a.hook.split_ordered and not positions_ordered):
        return None
    return split


def _bias_far(a: LaunchArgs, causal: bool, far_reach: int | None):
    """The hook's far constant (see :mod:`.score_bias`) for a causal launch given a reach, else
    None."""
    far = None if a.hook is None else getattr(a.hook, "far", None)
    if far is None or not causal or far_reach is None:
        return None
    return far


def _far_reach(hook, far_reach, seq: int) -> int | None:
    """The ``far_reach`` of a launch, checked; None where no pair of ``seq`` tokens is that far
    apart (no far tile, and the hook's constant is not read)."""
    if far_reach is None:
        return None
    if hook is None or getattr(hook, "far", None) is None:
        name = "no score bias" if hook is None else f"the score bias {hook.name!r}"
        raise ValueError(f"bias_far_reach={far_reach!r} given, but {name} has no far form")
    if isinstance(far_reach, bool) or not isinstance(far_reach, int) or far_reach < 0:
        raise ValueError(f"bias_far_reach must be an int >= 0 (tokens), got {far_reach!r}")
    return far_reach if far_reach < seq else None


def _switches(
    a: LaunchArgs,
    head_dim: int,
    causal: bool,
    dtype: torch.dtype,
    positions_ordered: bool,
    positions_affine: bool,
    far_reach: int | None = None,
) -> dict:
    """The constexpr arguments every flash kernel but the delta pre-pass takes."""
    return dict(
        HEAD_DIM=head_dim,
        HALF_PAD=_half_pad(head_dim),
        HAS_TABLES=a.has_tables,
        HAS_GAIN=a.has_gain,
        HALF_LAYOUT=a.half_layout,
        # q . k over pair halves (two dots): with tables, and for fp32, whose CUDA-core products
        # need fewer registers over half the channels
        PAIR_HALVES=a.has_tables or dtype == torch.float32,
        # a hook with a factor form multiplies the weights by e^b instead of adding b to the logits
        BIAS_FN=None if a.hook is None else (a.hook.factor or a.hook.bias),
        BIAS_FACTOR=a.hook is not None and a.hook.factor is not None,
        BIAS_OPTIONS=a.bias_options,
        BIAS_SPLIT=_bias_split(a, causal, positions_ordered),
        # the tiles past the hook's reach, where its bias is one constant (causal)
        BIAS_FAR=_bias_far(a, causal, far_reach),
        # positions p_0 + step * index are computed in the loops rather than loaded
        POS_AFFINE=a.hook is not None and positions_affine,
        CAUSAL=bool(causal),
        HAS_MASK=a.has_mask,
        DOT_PRECISION=dot_precision(dtype),
    )


def flash_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    *,
    causal: bool,
    scale: float,
    qk_tables=None,
    bias_hook=None,
    bias_params: torch.Tensor | None = None,
    bias_options: dict | None = None,
    config: FlashConfig | None = None,
    out_dtype: torch.dtype | None = None,
    positions_ordered: bool = False,
    positions_affine: bool = False,
    bias_far_reach: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel.

    q, k, v: ``[batch, heads, seq, head_dim]`` (any strides); positions: float32
    ``[1 or batch, seq]`` (each sequence minus its smallest position, exact integers);
    key_mask: ``[batch, seq]`` (nonzero = real) or None; qk_tables: an object with ``cos``,
    ``sin``, ``gain``, ``layout`` (see :mod:`.common`) or None; bias_hook: a
    :class:`.score_bias.BiasHook` or None, bias_params: the tensor it reads, bias_options: its
    compile-time options (``ScoreBias.options``; each set compiles its own kernel); out_dtype:
    the output's dtype (default q's; float32 keeps the accumulator unrounded, for a backward
    whose ``delta_i = rowsum(dO_i * O_i)`` must match the kernel's own ``P`` and ``dP``: see
    :func:`flash_attention_backward`); positions_ordered: the positions never decrease along a
    sequence (a hook with ``split_ordered`` then uses its split form in a causal launch);
    positions_affine: each sequence's positions are ``p_0 + step * index`` (the loops then
    compute them instead of loading them); pass the same two to the backward; bias_far_reach: for
    a hook with a far form, the distance ``i - j`` (tokens) from which its bias is one constant
    (``ScoreBias.far_reach``; a causal launch then runs those tiles without it). Returns ``(out
    [batch, heads, seq, head_dim] contiguous, lse [batch * heads, seq] fp32, base 2)``.
    """
    check_launch_inputs(
        q, k, v, positions, key_mask, qk_tables, bias_hook, bias_params, bias_options
    )
    batch, heads, seq, head_dim = q.shape
    positions = positions.contiguous()
    far_reach = _far_reach(bias_hook, bias_far_reach, seq)
    if qk_tables is not None:  # per token: once, before the loops (kernels/qk_transform.py)
        q, k = encode_qk(q, k, qk_tables)
    a = prepare_launch(q, positions, key_mask, None, bias_hook, bias_params, bias_options)
    cfg = config or pick_config("forward", head_dim, q.dtype, q.device, bias=a.hook is not None)
    out = torch.empty((batch, heads, seq, head_dim), dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.empty((batch * heads, seq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(seq, cfg.block_m), batch * heads)
    run_launch(Launch("forward", _flash_fwd_kernel, grid, (
        q, k, v, out, lse, positions, a.mask, a.cos, a.sin, a.key_cos, a.key_sin, a.gain, a.bias_params,
        *q.stride(), *k.stride(), *v.stride(), out.stride(0), out.stride(1), *a.strides(),
        seq, heads, *_forward_scale(scale), far_reach or 0,
    ), dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **_switches(
            a, head_dim, causal, q.dtype, positions_ordered, positions_affine, far_reach
        ),
    )))  # fmt: skip
    return out, lse


def flash_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    *,
    causal: bool,
    scale: float,
    qk_tables=None,
    bias_hook=None,
    bias_params: torch.Tensor | None = None,
    bias_options: dict | None = None,
    bias_grad: bool = False,
    configs: dict[str, FlashConfig] | None = None,
    encoded: bool = False,
    positions_ordered: bool = False,
    positions_affine: bool = False,
    bias_far_reach: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the backward kernels; returns ``(dq, dk, dv, dparams)``.

    dq, dk, dv: contiguous, in q's dtype. dparams: the gradient of ``bias_params`` (float32,
    its shape) if ``bias_grad``, else None. grad_out: like the output, any strides; out and lse
    from :func:`flash_attention_forward`; the other arguments as given to it. ``configs`` may
    override the block sizes of ``"dkdv"`` and/or ``"dq"``. With ``qk_tables``, q and k are
    passed through them first (one pass, as in the forward), unless ``encoded``: q and k are then
    already ``q'``, ``k'`` (the forward's, kept by the caller); either way the loops' float32
    gradients w.r.t. ``q'``, ``k'`` go back through the tables' transpose once, at the end.

    Precision of ``dparams`` in fp16/bf16: a row of ``dS = P * (dP - delta)`` sums to 0 only
    when ``delta_i = dO_i . O_i`` matches the backward's own ``P`` and ``dP``. ``dq``, ``dk``,
    ``dv`` barely notice (``dS`` enters them times ``k`` or ``q``), but a bias gradient sums
    ``dS`` itself. Two things keep it close: a hook with ``query_row_sums`` gets the rows'
    sums (so what is left over cancels, see :mod:`.score_bias`), and a float32 ``out``
    (``out_dtype=torch.float32`` in the forward) removes the output's rounding from ``delta``.
    """
    check_launch_inputs(
        q, k, v, positions, key_mask, qk_tables, bias_hook, bias_params, bias_options
    )
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out must have shape {tuple(q.shape)}, got {tuple(grad_out.shape)}")
    batch, heads, seq, head_dim = q.shape
    positions = positions.contiguous()
    far_reach = _far_reach(bias_hook, bias_far_reach, seq)
    if qk_tables is not None and not encoded:  # as the forward did: once, before the loops
        q, k = encode_qk(q, k, qk_tables)
    a = prepare_launch(q, positions, key_mask, None, bias_hook, bias_params, bias_options)
    if bias_grad and (a.hook is None or a.hook.grad is None):
        raise ValueError("bias_grad needs a score-bias hook with a learnable tensor")
    per_tile = bias_grad and a.hook.grad_per_tile  # one gradient slot per square sub-tile
    configs = dict(configs or {})
    for kernel in ("dkdv", "dq"):
        configs.setdefault(kernel, pick_config(
            kernel, head_dim, q.dtype, q.device, bias=a.hook is not None,
            per_tile=per_tile and kernel == "dkdv",
        ))  # fmt: skip
    if per_tile and configs["dkdv"].block_n % configs["dkdv"].block_m:
        raise ValueError(
            f"the hook {a.hook.name!r} writes its gradient per square sub-tile of the dK/dV "
            f"tiles: their keys (block_n) must be a multiple of their queries (block_m), got "
            f"{configs['dkdv']}"
        )
    shape, device = (batch, heads, seq, head_dim), q.device
    # gradients w.r.t. q', k' stay float32 until the tables' transpose has been applied
    grad_dtype = q.dtype if qk_tables is None else torch.float32
    dq = torch.empty(shape, dtype=grad_dtype, device=device)
    dk = torch.empty(shape, dtype=grad_dtype, device=device)
    dv = torch.empty(shape, dtype=q.dtype, device=device)
    switches = _switches(
        a, head_dim, causal, q.dtype, positions_ordered, positions_affine, far_reach
    )
    delta = torch.empty_like(lse)
    # a split bias: also lse minus the rows' part, per query block of the dK/dV kernel's tiles
    split = switches["BIAS_SPLIT"]
    lse_split = torch.empty_like(lse) if split is not None else lse
    delta_block = configs["dkdv"].block_m if split is not None else 64
    run_launch(Launch(
        "delta" if split is None else "delta_split", _flash_bwd_delta_kernel,
        (triton.cdiv(seq, delta_block), batch * heads),
        (out, grad_out, delta, lse, lse_split, positions, a.bias_params, out.stride(0),
         out.stride(1), *grad_out.stride(), a.stride_pos_b, a.stride_bias_b, a.stride_bias_h,
         seq, heads),
        dict(HEAD_DIM=head_dim, BLOCK_M=delta_block, BIAS_SPLIT=split,
             BIAS_OPTIONS=None if split is None else a.bias_options),  # one compile without
    ))  # fmt: skip
    far = switches["BIAS_FAR"] is not None
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *a.strides())
    cfg = configs["dkdv"]
    num_key_blocks = triton.cdiv(seq, cfg.block_n)
    # the gradient's partial sums: one slot per program, or per square sub-tile of side
    # block_m (zeros: a causal launch visits only the sub-tiles at or below the diagonal, and
    # its far tiles none), after a scratch slot for the sub-tiles that have no slot. With a
    # far reach, groups t >= ceil(reach / sub) + 1 hold only diagonals past the reach, whose
    # sums the far reduction replaces: their slots are not kept.
    sub = cfg.block_m
    grad_width = (
        a.hook.grad_width(sub if per_tile else cfg.block_n, bias_options) if bias_grad else 1
    )
    band = triton.cdiv(far_reach, sub) + 1 if far else None
    tiles = GradTiles(sub, triton.cdiv(seq, sub), 1 if causal else 2, band) if per_tile else None
    slots = tile_slot_count(tiles) if per_tile else num_key_blocks
    if per_tile:  # each (batch, head)'s scratch slot, then its slots
        scratch = torch.zeros(batch * heads, slots + 1, grad_width, dtype=torch.float32,
                              device=device)  # fmt: skip
        partials = scratch[:, 1:]
    else:
        partials = torch.empty(
            (batch * heads, slots, grad_width) if bias_grad else (1,),
            dtype=torch.float32,
            device=device,
        )
    run_launch(Launch("dkdv", _flash_bwd_dkdv_kernel, (num_key_blocks, batch * heads), (
        q, k, v, grad_out, lse, lse_split, delta, dk, dv, positions, a.mask, a.cos, a.sin,
        a.key_cos, a.key_sin, a.gain, a.bias_params, scratch if per_tile else partials, *strides,
        seq, heads,
        scale, scale * LOG2E, slots,
        far_reach or 0,
    ), dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BIAS_GRAD_FN=a.hook.grad if bias_grad else None, GRAD_WIDTH=grad_width,
        GRAD_PER_TILE=per_tile, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        FAR_BLOCK_M=cfg.block_m if far else 0,
        **switches,
    )))  # fmt: skip
    # a per-token bias's query side (b_ij = a_i - a_j): d loss / d a_i += sum_j dS_ij
    row_sums = bias_grad and a.hook.query_row_sums
    rows = torch.empty_like(lse) if row_sums else delta
    cfg = configs["dq"]
    num_query_blocks = triton.cdiv(seq, cfg.block_m)
    # the far tiles' sums of dS, one per query block (no hook runs on those tiles)
    far_grad = bias_grad and far
    far_sums = torch.empty(
        (batch * heads, num_query_blocks) if far_grad else (1,), dtype=torch.float32, device=device
    )
    run_launch(Launch("dq", _flash_bwd_dq_kernel, (num_query_blocks, batch * heads), (
        q, k, v, grad_out, lse, delta, dq, rows, far_sums, positions, a.mask, a.cos, a.sin, a.key_cos,
        a.key_sin, a.gain, a.bias_params, *strides, seq, heads, scale, scale * LOG2E, far_reach or 0,
    ), dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, ROW_SUMS=row_sums, FAR_GRAD=far_grad, **switches,
    )))  # fmt: skip
    dparams = a.hook.reduce_grad(partials, batch, heads, a.bias_shape, tiles) if bias_grad else None
    if far_grad:
        sums = far_sums.view(batch, heads, num_query_blocks).sum(-1)
        dparams = a.hook.far_reduce(dparams, sums, far_reach, a.bias_shape)
    if row_sums:
        dparams = dparams + rows.view(batch, heads, seq)
    if qk_tables is not None:
        dq, dk = decode_qk_grads(dq, dk, qk_tables, q.dtype)
    return dq, dk, dv, dparams
