"""Stick-breaking attention (forward and backward), in log space; positions come from the caller.

Tensors q, k, v are ``[batch, heads, seq, head_dim]`` (any strides, see :mod:`.common` for the
layout convention); ``positions`` is float32 ``[1 or batch, seq]``; ``key_mask`` is
``[batch, seq]`` (nonzero = real token) or absent.

The function (Tan et al. 2024, "Scaling Stick-Breaking Attention"), for one (batch, head)::

    z_ij   = scale * q'_i . k'_j  +  b_ij                         (b: a score-bias hook, or 0)
    beta   = sigmoid(z)
    A_ij   = beta_ij * prod_{allowed l strictly between j and i} (1 - beta_il)
    out_i  = sum_j A_ij v_j + (1 - sum_j A_ij) v_i                (leftover stick: own value)

Key ``j`` is allowed for query ``i`` iff it is a real token and, causal, ``j < i`` (by index).
Bidirectional: one stick over the keys left of ``i`` and one over the keys right of it, each broken
from the nearest key outward and each worth half: ``A_ij = 1/2 * beta_ij * prod(...)``.
With the caller's q/k tables (``HAS_TABLES``), channel pair ``t`` = ``(x_1, x_2)`` of the token
at index ``s`` becomes ``g_1 (x_1 cos[s, t] - x_2 sin[s, t])``, ``g_2 (x_1 sin[s, t] +
x_2 cos[s, t])`` (``g``: the optional per-channel gain, ``HAS_GAIN``); else ``q' = q``. The
bias ``b_ij`` is a hook of :mod:`.score_bias` passed in as the constexpr ``BIAS_FN`` (RSE:
``"linear_distance"``, ``b_ij = -lambda_h |p_i - p_j|``).

Everything is in log space (``log(1 - beta) = -softplus(z)``)::

    log A_ij = logsigmoid(z_ij) - sum_{allowed l between} softplus(z_il)   (+ log 1/2)

so logits of any finite magnitude give finite weights and gradients.

Forward, per query block: key blocks are visited from the nearest to the farthest (left stick:
from the diagonal block down to block 0; right stick: from the diagonal block up), carrying per row
the sum of ``softplus(z)`` over the keys already passed (``-log`` of what is left of the stick;
the tiles work in base 2, see ``_stick_tile``).
Inside a block, ``tl.cumsum`` (reversed for the left stick) gives the part of that sum contributed
by the nearer keys of the same block. ``sum_j A_ij v_j`` is accumulated with ``tl.dot`` and
``sum_j A_ij`` (the row's mass, stored for the backward) alongside, both in fp32.

Backward. With ``g_ij = dO_i . (v_j - v_i)`` (``out_i = v_i + sum_j A_ij (v_j - v_i)``) and
``G_ij = A_ij g_ij``::

    dz_il = G_il (1 - beta_il) - beta_il * F_il,   F_il = sum_{allowed j farther than l} G_ij
    dq'_i = scale sum_l dz_il k'_l        dk'_l = scale sum_i dz_il q'_i
    dv_j  = sum_i A_ij dO_i  +  (1 - sum_l A_jl) dO_j
    dtheta = sum_il dz_il d b_il / d theta           (a learnable bias tensor theta, e.g. lambda)

``F`` is a suffix sum in visit order: ``F_il = T_i - P_il`` with ``T_i = sum_j G_ij`` (the row
total of one stick) and ``P_il`` the sum of ``G`` over the keys at least as near as ``l``.

* Row kernel (one program per query block): pass A walks the key blocks nearest first and
  computes ``T_i``; at the entry of each key block it stores the row's two running sums
  (softplus and ``G``) as a checkpoint. Pass B walks them again and accumulates ``dq'``.
* Column kernel (one program per key block): walks the query blocks; the checkpoints give every
  tile its ``-log`` stick and ``P`` offsets, so each tile is exact on its own. It accumulates
  ``dk'``, ``dv`` and, through the hook's ``BIAS_GRAD_FN``, its partial sums of ``dtheta``
  (reduced with torch after the launch).

Why checkpoints: a program that owns a key block cannot know the ``-log`` stick of a tile (it
depends on every key between that block and the query) without them; recomputing it would cost
O(seq^3). Deterministic, no atomics. Besides O(seq) row data, the checkpoints take
``2 * sides * seq * ceil(seq / BLOCK)`` fp32 per (batch, head) (``BLOCK`` times smaller than a
``seq x seq`` matrix, which never exists). ``A`` is recomputed from q and k, never stored.
``dq'`` and ``dk'`` are mapped back through the transform (its transpose) in registers.

Precision: across blocks the ``-log`` stick only ever grows by adding nearer terms first. Inside a
block, the sum over the nearer keys is ``cumsum - softplus(z_j)``, which loses ``eps * |z_j|`` (so
``A_ij`` has a relative error of about ``1e-7 * |z_ij|`` in fp32: nothing at ordinary logits, and
still finite at ``|z| = 1e4``). Padded queries are computed like any other row (the mask removes
keys only).
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
    prepare_launch,
    run_launch,
    smem_per_block,
)
from .fast_math import LOG2E, fast_log2
from .limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS, MAX_BATCH_HEADS

__all__ = [
    "KERNEL_DTYPES",
    "KERNEL_HEAD_DIMS",
    "MAX_BATCH_HEADS",
    "StickConfig",
    "pick_config",
    "stick_breaking_backward",
    "stick_breaking_forward",
]


# --------------------------------------------------------------------------------------------
# Tile helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _pair_halves(x, HEAD_DIM: tl.constexpr, HALF_LAYOUT: tl.constexpr):
    """Split a register tile ``[rows, HEAD_DIM]`` into its pair halves ``(x_1, x_2)``, each
    ``[rows, HEAD_DIM/2]``: channels ``(2t, 2t+1)`` (interleaved) or ``(t, t + HEAD_DIM/2)``
    (half) of pair ``t``. No memory is touched."""
    rows: tl.constexpr = x.shape[0]
    if HALF_LAYOUT:
        x1, x2 = tl.split(tl.permute(tl.reshape(x, [rows, 2, HEAD_DIM // 2]), (0, 2, 1)))
    else:
        x1, x2 = tl.split(tl.reshape(x, [rows, HEAD_DIM // 2, 2]))
    return x1, x2


@triton.jit
def _join_halves(x1, x2, HEAD_DIM: tl.constexpr, HALF_LAYOUT: tl.constexpr):
    """The inverse of :func:`_pair_halves`."""
    rows: tl.constexpr = x1.shape[0]
    if HALF_LAYOUT:
        return tl.reshape(tl.permute(tl.join(x1, x2), (0, 2, 1)), [rows, HEAD_DIM])
    return tl.reshape(tl.join(x1, x2), [rows, HEAD_DIM])


@triton.jit
def _pair_tables(cos_base, sin_base, rows, row_ok, HEAD_DIM: tl.constexpr):
    """``cos``, ``sin`` of ``rows``: float32 ``[rows, HEAD_DIM/2]`` (rows past the end: 1, 0)."""
    tab = rows[:, None] * (HEAD_DIM // 2) + tl.arange(0, HEAD_DIM // 2)[None, :]
    cos = tl.load(cos_base + tab, mask=row_ok[:, None], other=1.0)
    sin = tl.load(sin_base + tab, mask=row_ok[:, None], other=0.0)
    return cos, sin


@triton.jit
def _load_rotated(
    base,
    rows,
    row_ok,
    stride_s,
    stride_d,
    cos_base,
    sin_base,
    HALF_LAYOUT: tl.constexpr,
    gain,
    HEAD_DIM: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
):
    """A ``[rows, HEAD_DIM]`` tile in its input dtype (rows past the end read as 0), through the
    tables if ``HAS_TABLES``.

    ``x' = g * (R x)``: the tile is loaded once and split into its pair halves in registers,
    ``x'_1 = x_1 cos - x_2 sin``, ``x'_2 = x_1 sin + x_2 cos`` in fp32 with ``cos``/``sin``
    ``[rows, HEAD_DIM/2]`` from the tables, joined back and multiplied by the per-channel gain
    ``g`` if ``HAS_GAIN``.
    """
    d = tl.arange(0, HEAD_DIM)
    x = tl.load(base + rows[:, None] * stride_s + d[None, :] * stride_d, mask=row_ok[:, None],
                other=0.0)  # fmt: skip
    if HAS_TABLES:
        cos, sin = _pair_tables(cos_base, sin_base, rows, row_ok, HEAD_DIM)
        x1, x2 = _pair_halves(x.to(tl.float32), HEAD_DIM, HALF_LAYOUT)
        y = _join_halves(x1 * cos - x2 * sin, x1 * sin + x2 * cos, HEAD_DIM, HALF_LAYOUT)
        if HAS_GAIN:
            y = y * gain[None, :]
        x = y.to(x.dtype)
    return x


@triton.jit
def _store_unrotated(
    base,
    rows,
    row_ok,
    grad,
    cos_base,
    sin_base,
    gain,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
):
    """Store a gradient w.r.t. ``x'`` as one w.r.t. ``x`` into a contiguous fp32 ``[seq, D]``.

    ``dx = R(p)^T (g * dx')``: with ``y = g * dx'`` split into pair halves in registers,
    ``dx_1 = y_1 cos + y_2 sin``, ``dx_2 = y_2 cos - y_1 sin``.
    """
    d = tl.arange(0, HEAD_DIM)
    if HAS_TABLES:
        if HAS_GAIN:
            grad = grad * gain[None, :]
        cos, sin = _pair_tables(cos_base, sin_base, rows, row_ok, HEAD_DIM)
        y1, y2 = _pair_halves(grad, HEAD_DIM, HALF_LAYOUT)
        grad = _join_halves(y1 * cos + y2 * sin, y2 * cos - y1 * sin, HEAD_DIM, HALF_LAYOUT)
    tl.store(base + rows[:, None] * HEAD_DIM + d[None, :], grad, mask=row_ok[:, None])


@triton.jit
def _load_keys(
    kb,
    k_base,
    v_base,
    mask_base,
    pos_base,
    cos_base,
    sin_base,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    HALF_LAYOUT: tl.constexpr,
    gain,
    seq_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BIAS_FN: tl.constexpr,
):
    """Key block ``kb``: indices, real-key flags, positions (read only for a score bias), ``k'``
    and ``v`` (input dtype)."""
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < seq_len
    key_ok = col_in
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_base + cols, mask=col_in, other=0) != 0)
    if BIAS_FN is not None:
        pos_j = tl.load(pos_base + cols, mask=col_in, other=0.0)
    else:
        pos_j = tl.zeros([BLOCK_N], dtype=tl.float32)
    k = _load_rotated(
        k_base, cols, col_in, stride_ks, stride_kd, cos_base, sin_base, HALF_LAYOUT, gain,
        HEAD_DIM, HAS_TABLES, HAS_GAIN,
    ).to(k_base.dtype.element_ty)  # fmt: skip
    d = tl.arange(0, HEAD_DIM)
    v = tl.load(
        v_base + cols[:, None] * stride_vs + d[None, :] * stride_vd, mask=col_in[:, None], other=0.0
    )
    return cols, key_ok, pos_j, k, v


@triton.jit
def _channel_gain(gain_ptr, HEAD_DIM: tl.constexpr, HAS_GAIN: tl.constexpr):
    """The per-channel gain ``[HEAD_DIM]`` (never loaded, and unused, without a gain)."""
    if HAS_GAIN:
        gain = tl.load(gain_ptr + tl.arange(0, HEAD_DIM))
    else:
        gain = 1.0
    return gain


@triton.jit
def _row_positions(pos_base, rows, row_ok, ROWS: tl.constexpr, BIAS_FN: tl.constexpr):
    """The positions of ``rows`` (float32), read only when a score bias needs them."""
    if BIAS_FN is not None:
        pos = tl.load(pos_base + rows, mask=row_ok, other=0.0)
    else:
        pos = tl.zeros([ROWS], dtype=tl.float32)
    return pos


@triton.jit
def _stick_tile(
    q,
    k,
    rows,
    cols,
    row_ok,
    key_ok,
    pos_i,
    pos_j,
    log_stick,
    scale,
    bias_params,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    BIAS_FN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One ``[rows, cols]`` tile of one stick, in base 2.

    ``log_stick`` ``[rows]`` is the sum of ``softplus(z) * log2(e)`` over the allowed keys of this
    stick in the blocks nearer to the query than this one. Returns ``allowed``,
    ``softplus(z) * log2(e)`` (0 where not allowed), the weights ``A`` and ``beta = sigmoid(z)``
    (both 0 where not allowed). Base 2 makes every exponential one ``exp2`` and the logarithm one
    approximate ``log2`` (:func:`.fast_math.fast_log2`).
    """
    # z2 = z * log2(e)
    z2 = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (scale * LOG2E)
    if BIAS_FN is not None:  # the score-bias hook, times log2(e)
        z2 += BIAS_FN(
            rows[:, None], cols[None, :], pos_i[:, None], pos_j[None, :], bias_params, True
        )
    if LEFT:
        side = cols[None, :] < rows[:, None]
    else:
        side = cols[None, :] > rows[:, None]
    allowed = side & row_ok[:, None] & key_ok[None, :]
    # softplus(z) = max(z, 0) + log(1 + e^-|z|); logsigmoid(z) = z - softplus(z); here times
    # log2(e), the argument of the log in [1, 2].
    log1p_exp = fast_log2(1.0 + tl.exp2(-tl.abs(z2)))
    log_beta = tl.minimum(z2, 0.0) - log1p_exp
    sp = tl.where(allowed, tl.maximum(z2, 0.0) + log1p_exp, 0.0)
    # Nearer keys of this block: after j for the left stick, before j for the right one.
    nearer = tl.cumsum(sp, axis=1, reverse=LEFT) - sp
    log_a = log_beta - log_stick[:, None] - nearer
    if not CAUSAL:
        log_a += -1.0  # log2(1/2): each stick holds half of the mass
    a = tl.where(allowed, tl.exp2(log_a), 0.0)
    beta = tl.where(allowed, tl.exp2(log_beta), 0.0)
    return allowed, sp, a, beta


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _forward_one_stick(
    acc,
    mass,
    q,
    rows,
    row_ok,
    pos_i,
    pid_m,
    k_base,
    v_base,
    pos_base,
    mask_base,
    cos_base,
    sin_base,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    HALF_LAYOUT: tl.constexpr,
    gain,
    seq_len,
    scale,
    bias_params,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Add one stick's ``sum_j A_ij v_j`` to ``acc`` and ``sum_j A_ij`` to ``mass``."""
    num_kb = tl.cdiv(seq_len, BLOCK_N)
    if LEFT:  # the last key block holding a key left of some row of this query block
        first = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 2) // BLOCK_N, num_kb - 1)
        count = first + 1
    else:  # the first key block holding a key right of some row
        first = (pid_m * BLOCK_M + 1) // BLOCK_N
        count = num_kb - first
    log_stick = tl.zeros([BLOCK_M], dtype=tl.float32)
    for step in range(count):
        if LEFT:
            kb = first - step
        else:
            kb = first + step
        cols, key_ok, pos_j, k, v = _load_keys(
            kb, k_base, v_base, mask_base, pos_base, cos_base, sin_base, stride_ks, stride_kd,
            stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, HEAD_DIM, BLOCK_N, HAS_MASK,
            HAS_TABLES, HAS_GAIN, BIAS_FN,
        )  # fmt: skip
        _allowed, sp, a, _beta = _stick_tile(
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, bias_params,
            LEFT, CAUSAL, BIAS_FN, DOT_PRECISION,
        )  # fmt: skip
        acc += tl.dot(a.to(v.dtype), v, input_precision=DOT_PRECISION)
        mass += tl.sum(a, axis=1)
        log_stick += tl.sum(sp, axis=1)
    return acc, mass


@triton.jit
def _stick_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    mass_ptr,
    pos_ptr,
    mask_ptr,
    cos_ptr,
    sin_ptr,
    gain_ptr,
    bias_ptr,
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
    num_heads,
    seq_len,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m, bh, q_base, k_base, v_base, out_base, pos_base, mask_base, cos_base, sin_base, bias = (
        _program_setup(
            q_ptr, k_ptr, v_ptr, out_ptr, pos_ptr, mask_ptr, cos_ptr, sin_ptr, bias_ptr,
            stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob,
            stride_oh, stride_pos_b, stride_tab_b, stride_bias_b, stride_bias_h, num_heads,
            seq_len, CAUSAL,
        )
    )  # fmt: skip
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_len
    d = tl.arange(0, HEAD_DIM)
    gain = _channel_gain(gain_ptr, HEAD_DIM, HAS_GAIN)
    pos_i = _row_positions(pos_base, rows, row_ok, BLOCK_M, BIAS_FN)
    q = _load_rotated(
        q_base, rows, row_ok, stride_qs, stride_qd, cos_base, sin_base, HALF_LAYOUT,
        gain, HEAD_DIM, HAS_TABLES, HAS_GAIN,
    ).to(q_ptr.dtype.element_ty)  # fmt: skip

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    mass = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, mass = _forward_one_stick(
        acc, mass, q, rows, row_ok, pos_i, pid_m, k_base, v_base, pos_base, mask_base, cos_base,
        sin_base, stride_ks, stride_kd, stride_vs, stride_vd, HALF_LAYOUT, gain,
        seq_len, scale, bias, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, HAS_MASK, BIAS_FN,
        HAS_TABLES, HAS_GAIN, DOT_PRECISION,
    )  # fmt: skip
    if not CAUSAL:
        acc, mass = _forward_one_stick(
            acc, mass, q, rows, row_ok, pos_i, pid_m, k_base, v_base, pos_base, mask_base,
            cos_base, sin_base, stride_ks, stride_kd, stride_vs, stride_vd, HALF_LAYOUT,
            gain, seq_len, scale, bias, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, HAS_MASK,
            BIAS_FN, HAS_TABLES, HAS_GAIN, DOT_PRECISION,
        )  # fmt: skip

    v_own = tl.load(
        v_base + rows[:, None] * stride_vs + d[None, :] * stride_vd, mask=row_ok[:, None], other=0.0
    ).to(tl.float32)
    out = acc + (1.0 - mass)[:, None] * v_own  # the leftover stick goes to the own value
    out_ptrs = out_base + rows[:, None] * HEAD_DIM + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(mass_ptr + bh * seq_len + rows, mass, mask=row_ok)


# --------------------------------------------------------------------------------------------
# Backward: row kernel (row totals, checkpoints, dq)
# --------------------------------------------------------------------------------------------


@triton.jit
def _backward_rows_one_stick(
    dq,
    q,
    do,
    delta,
    rows,
    row_ok,
    pos_i,
    pid_m,
    k_base,
    v_base,
    pos_base,
    mask_base,
    cos_base,
    sin_base,
    ckpt_sp_base,
    ckpt_g_base,
    total_base,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    HALF_LAYOUT: tl.constexpr,
    gain,
    seq_len,
    scale,
    bias_params,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One stick of a query block: store its checkpoints and row totals, add its part of dq'."""
    num_kb = tl.cdiv(seq_len, BLOCK)
    if LEFT:
        count = pid_m + 1
    else:
        count = num_kb - pid_m

    # Pass A: the row totals T_i = sum_j G_ij; at each key block's entry, the checkpoints.
    log_stick = tl.zeros([BLOCK], dtype=tl.float32)
    g_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(count):
        if LEFT:
            kb = pid_m - step
        else:
            kb = pid_m + step
        tl.store(ckpt_sp_base + kb * seq_len + rows, log_stick, mask=row_ok)
        tl.store(ckpt_g_base + kb * seq_len + rows, g_sum, mask=row_ok)
        cols, key_ok, pos_j, k, v = _load_keys(
            kb, k_base, v_base, mask_base, pos_base, cos_base, sin_base, stride_ks, stride_kd,
            stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, HEAD_DIM, BLOCK, HAS_MASK,
            HAS_TABLES, HAS_GAIN, BIAS_FN,
        )  # fmt: skip
        _allowed, sp, a, _beta = _stick_tile(
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, bias_params,
            LEFT, CAUSAL, BIAS_FN, DOT_PRECISION,
        )  # fmt: skip
        g = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION) - delta[:, None]
        log_stick += tl.sum(sp, axis=1)
        g_sum += tl.sum(a * g, axis=1)
    total = g_sum
    tl.store(total_base + rows, total, mask=row_ok)

    # Pass B: dz_il = G_il (1 - beta_il) - beta_il (T_i - P_il);  dq' += dz k'.
    log_stick = tl.zeros([BLOCK], dtype=tl.float32)
    g_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(count):
        if LEFT:
            kb = pid_m - step
        else:
            kb = pid_m + step
        cols, key_ok, pos_j, k, v = _load_keys(
            kb, k_base, v_base, mask_base, pos_base, cos_base, sin_base, stride_ks, stride_kd,
            stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, HEAD_DIM, BLOCK, HAS_MASK,
            HAS_TABLES, HAS_GAIN, BIAS_FN,
        )  # fmt: skip
        allowed, sp, a, beta = _stick_tile(
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, bias_params,
            LEFT, CAUSAL, BIAS_FN, DOT_PRECISION,
        )  # fmt: skip
        ga = a * (tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION) - delta[:, None])
        # P_il: G summed over the keys at least as near to the query as l.
        near_or_at = g_sum[:, None] + tl.cumsum(ga, axis=1, reverse=LEFT)
        dz = ga * (1.0 - beta) - beta * (total[:, None] - near_or_at)
        dz = tl.where(allowed, dz, 0.0)
        dq += tl.dot(dz.to(k.dtype), k, input_precision=DOT_PRECISION)
        log_stick += tl.sum(sp, axis=1)
        g_sum += tl.sum(ga, axis=1)
    return dq


@triton.jit
def _stick_bwd_rows_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    dq_ptr,
    delta_ptr,
    total_ptr,
    ckpt_sp_ptr,
    ckpt_g_ptr,
    pos_ptr,
    mask_ptr,
    cos_ptr,
    sin_ptr,
    gain_ptr,
    bias_ptr,
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
    num_heads,
    seq_len,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m, bh, q_base, k_base, v_base, do_base, pos_base, mask_base, cos_base, sin_base, bias = (
        _program_setup(
            q_ptr, k_ptr, v_ptr, do_ptr, pos_ptr, mask_ptr, cos_ptr, sin_ptr, bias_ptr,
            stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_dob,
            stride_doh, stride_pos_b, stride_tab_b, stride_bias_b, stride_bias_h, num_heads,
            seq_len, CAUSAL,
        )
    )  # fmt: skip
    num_kb = tl.cdiv(seq_len, BLOCK)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < seq_len
    d = tl.arange(0, HEAD_DIM)
    gain = _channel_gain(gain_ptr, HEAD_DIM, HAS_GAIN)
    pos_i = _row_positions(pos_base, rows, row_ok, BLOCK, BIAS_FN)
    q = _load_rotated(
        q_base, rows, row_ok, stride_qs, stride_qd, cos_base, sin_base, HALF_LAYOUT,
        gain, HEAD_DIM, HAS_TABLES, HAS_GAIN,
    ).to(q_ptr.dtype.element_ty)  # fmt: skip
    do_ptrs = do_base + rows[:, None] * stride_dos
    do = tl.load(do_ptrs + d[None, :] * stride_dod, mask=row_ok[:, None], other=0.0)
    v_own = tl.load(
        v_base + rows[:, None] * stride_vs + d[None, :] * stride_vd, mask=row_ok[:, None], other=0.0
    )
    delta = tl.sum(do.to(tl.float32) * v_own.to(tl.float32), axis=1)  # dO_i . v_i
    tl.store(delta_ptr + bh * seq_len + rows, delta, mask=row_ok)

    # Checkpoints are [batch*heads, sides, key blocks, seq]; row totals [batch*heads, sides, seq].
    if CAUSAL:
        sides = 1
    else:
        sides = 2
    ckpt_stride = num_kb * seq_len
    dq = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dq = _backward_rows_one_stick(
        dq, q, do, delta, rows, row_ok, pos_i, pid_m, k_base, v_base, pos_base, mask_base,
        cos_base, sin_base, ckpt_sp_ptr + bh * sides * ckpt_stride,
        ckpt_g_ptr + bh * sides * ckpt_stride, total_ptr + bh * sides * seq_len,
        stride_ks, stride_kd, stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, scale,
        bias, HEAD_DIM, BLOCK, True, CAUSAL, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN,
        DOT_PRECISION,
    )  # fmt: skip
    if not CAUSAL:
        dq = _backward_rows_one_stick(
            dq, q, do, delta, rows, row_ok, pos_i, pid_m, k_base, v_base, pos_base, mask_base,
            cos_base, sin_base, ckpt_sp_ptr + (bh * 2 + 1) * ckpt_stride,
            ckpt_g_ptr + (bh * 2 + 1) * ckpt_stride, total_ptr + (bh * 2 + 1) * seq_len,
            stride_ks, stride_kd, stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len,
            scale, bias, HEAD_DIM, BLOCK, False, CAUSAL, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN,
            DOT_PRECISION,
        )  # fmt: skip
    _store_unrotated(
        dq_ptr + bh * seq_len * HEAD_DIM, rows, row_ok, dq * scale, cos_base, sin_base, gain, BLOCK, HEAD_DIM, HAS_TABLES, HAS_GAIN, HALF_LAYOUT,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Backward: column kernel (dk, dv, the score bias's parameter gradient)
# --------------------------------------------------------------------------------------------


@triton.jit
def _backward_cols_one_stick(
    dk,
    dv,
    dbias,
    k,
    v,
    cols,
    key_ok,
    pos_j,
    pid_n,
    q_base,
    do_base,
    pos_base,
    cos_base,
    sin_base,
    delta_base,
    ckpt_sp_base,
    ckpt_g_base,
    total_base,
    stride_qs,
    stride_qd,
    stride_dos,
    stride_dod,
    HALF_LAYOUT: tl.constexpr,
    gain,
    seq_len,
    scale,
    bias_params,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_GRAD_FN: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One stick's contribution of every query block to the key block ``pid_n``.

    Each tile reads its row offsets (the ``-log`` stick and ``P`` before this key block) from
    the checkpoints of the row kernel, so the query blocks can be visited in any order.
    """
    num_qb = tl.cdiv(seq_len, BLOCK)
    if LEFT:  # the queries right of these keys see them in their left stick
        lo = pid_n
        hi = num_qb
    else:
        lo = 0
        hi = pid_n + 1
    d = tl.arange(0, HEAD_DIM)
    for m in range(lo, hi):
        rows = m * BLOCK + tl.arange(0, BLOCK)
        row_ok = rows < seq_len
        pos_i = _row_positions(pos_base, rows, row_ok, BLOCK, BIAS_FN)
        q = _load_rotated(
            q_base, rows, row_ok, stride_qs, stride_qd, cos_base, sin_base, HALF_LAYOUT,
            gain, HEAD_DIM, HAS_TABLES, HAS_GAIN,
        ).to(k.dtype)  # fmt: skip
        do = tl.load(
            do_base + rows[:, None] * stride_dos + d[None, :] * stride_dod,
            mask=row_ok[:, None],
            other=0.0,
        ).to(k.dtype)
        delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
        total = tl.load(total_base + rows, mask=row_ok, other=0.0)
        log_stick = tl.load(ckpt_sp_base + pid_n * seq_len + rows, mask=row_ok, other=0.0)
        g_before = tl.load(ckpt_g_base + pid_n * seq_len + rows, mask=row_ok, other=0.0)
        allowed, _sp, a, beta = _stick_tile(
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, bias_params,
            LEFT, CAUSAL, BIAS_FN, DOT_PRECISION,
        )  # fmt: skip
        ga = a * (tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION) - delta[:, None])
        near_or_at = g_before[:, None] + tl.cumsum(ga, axis=1, reverse=LEFT)
        dz = ga * (1.0 - beta) - beta * (total[:, None] - near_or_at)
        dz = tl.where(allowed, dz, 0.0)
        dk += tl.dot(tl.trans(dz.to(k.dtype)), q, input_precision=DOT_PRECISION)
        dv += tl.dot(tl.trans(a.to(k.dtype)), do, input_precision=DOT_PRECISION)
        if BIAS_GRAD_FN is not None:  # queries are axis 0 of these tiles
            dbias = BIAS_GRAD_FN(
                dbias, dz, rows[:, None], cols[None, :], pos_i[:, None], pos_j[None, :],
                bias_params, 0,
            )  # fmt: skip
    return dk, dv, dbias


@triton.jit
def _stick_bwd_cols_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    dk_ptr,
    dv_ptr,
    dbias_ptr,
    mass_ptr,
    delta_ptr,
    total_ptr,
    ckpt_sp_ptr,
    ckpt_g_ptr,
    pos_ptr,
    mask_ptr,
    cos_ptr,
    sin_ptr,
    gain_ptr,
    bias_ptr,
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
    num_heads,
    seq_len,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_GRAD_FN: tl.constexpr,
    GRAD_WIDTH: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n, bh, q_base, k_base, v_base, do_base, pos_base, mask_base, cos_base, sin_base, bias = (
        _program_setup(
            q_ptr, k_ptr, v_ptr, do_ptr, pos_ptr, mask_ptr, cos_ptr, sin_ptr, bias_ptr,
            stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_dob,
            stride_doh, stride_pos_b, stride_tab_b, stride_bias_b, stride_bias_h, num_heads,
            seq_len, False,
        )
    )  # fmt: skip
    num_kb = tl.cdiv(seq_len, BLOCK)
    d = tl.arange(0, HEAD_DIM)
    gain = _channel_gain(gain_ptr, HEAD_DIM, HAS_GAIN)
    cols, key_ok, pos_j, k, v = _load_keys(
        pid_n, k_base, v_base, mask_base, pos_base, cos_base, sin_base, stride_ks, stride_kd,
        stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, HEAD_DIM, BLOCK, HAS_MASK,
        HAS_TABLES, HAS_GAIN, BIAS_FN,
    )  # fmt: skip
    col_in = cols < seq_len

    if CAUSAL:
        sides = 1
    else:
        sides = 2
    ckpt_stride = num_kb * seq_len
    dk = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dbias = tl.zeros([GRAD_WIDTH], dtype=tl.float32)  # unused without BIAS_GRAD_FN
    dk, dv, dbias = _backward_cols_one_stick(
        dk, dv, dbias, k, v, cols, key_ok, pos_j, pid_n, q_base, do_base, pos_base, cos_base,
        sin_base, delta_ptr + bh * seq_len, ckpt_sp_ptr + bh * sides * ckpt_stride,
        ckpt_g_ptr + bh * sides * ckpt_stride, total_ptr + bh * sides * seq_len,
        stride_qs, stride_qd, stride_dos, stride_dod, HALF_LAYOUT, gain, seq_len, scale,
        bias, HEAD_DIM, BLOCK, True, CAUSAL, BIAS_FN, BIAS_GRAD_FN, HAS_TABLES, HAS_GAIN,
        DOT_PRECISION,
    )  # fmt: skip
    if not CAUSAL:
        dk, dv, dbias = _backward_cols_one_stick(
            dk, dv, dbias, k, v, cols, key_ok, pos_j, pid_n, q_base, do_base, pos_base,
            cos_base, sin_base, delta_ptr + bh * seq_len,
            ckpt_sp_ptr + (bh * 2 + 1) * ckpt_stride, ckpt_g_ptr + (bh * 2 + 1) * ckpt_stride,
            total_ptr + (bh * 2 + 1) * seq_len, stride_qs, stride_qd, stride_dos, stride_dod,
            HALF_LAYOUT, gain, seq_len, scale, bias, HEAD_DIM, BLOCK, False, CAUSAL,
            BIAS_FN, BIAS_GRAD_FN, HAS_TABLES, HAS_GAIN, DOT_PRECISION,
        )  # fmt: skip

    # These keys are queries too: the leftover of their own stick came from their own value.
    do_own = tl.load(
        do_base + cols[:, None] * stride_dos + d[None, :] * stride_dod,
        mask=col_in[:, None],
        other=0.0,
    ).to(tl.float32)
    mass_own = tl.load(mass_ptr + bh * seq_len + cols, mask=col_in, other=0.0)
    dv += (1.0 - mass_own)[:, None] * do_own

    _store_unrotated(
        dk_ptr + bh * seq_len * HEAD_DIM, cols, col_in, dk * scale, cos_base, sin_base, gain, BLOCK, HEAD_DIM, HAS_TABLES, HAS_GAIN, HALF_LAYOUT,
    )  # fmt: skip
    dv_ptrs = dv_ptr + bh * seq_len * HEAD_DIM + cols[:, None] * HEAD_DIM + d[None, :]
    tl.store(dv_ptrs, dv, mask=col_in[:, None])
    if BIAS_GRAD_FN is not None:
        slot = (bh * num_kb + pid_n) * GRAD_WIDTH
        tl.store(dbias_ptr + slot + tl.arange(0, GRAD_WIDTH), dbias)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


class StickConfig:
    """Tile sizes and launch options of the stick-breaking kernels."""

    def __init__(
        self,
        block_m: int,
        block_n: int,
        block_bwd: int,
        num_warps: int,
        bwd_warps: int,
        num_stages: int = 1,
        bwd_stages: int = 1,
    ):
        self.block_m = block_m
        self.block_n = block_n
        self.block_bwd = block_bwd
        self.num_warps = num_warps
        self.bwd_warps = bwd_warps
        self.num_stages = num_stages
        self.bwd_stages = bwd_stages

    def __repr__(self) -> str:
        return (
            f"StickConfig(block_m={self.block_m}, block_n={self.block_n}, "
            f"block_bwd={self.block_bwd}, num_warps={self.num_warps}, bwd_warps={self.bwd_warps}, "
            f"num_stages={self.num_stages}, bwd_stages={self.bwd_stages})"
        )


def _tile_bytes(block: int, head_dim: int, dtype: torch.dtype, tables: bool) -> int:
    """Bytes one pipelining stage of a loop holds: the two ``[block, head_dim]`` tiles the loop
    loads (k and v, or q and dO) and, with tables, ``cos`` and ``sin`` ``[block, head_dim/2]``
    in float32."""
    size = torch.empty((), dtype=dtype).element_size()
    return block * (2 * head_dim * size + (4 * head_dim if tables else 0))


def _fit_stages(limit: int, block: int, head_dim: int, dtype: torch.dtype, tables: bool) -> int:
    """The most pipelining stages (at most 3, at least 1; 0 if even 1 does not fit) whose
    shared memory fits in ``limit`` bytes.

    With triton 3.9 the kernels need about ``stages + 1/2`` stage tiles (the extra half holds the
    dot operands made in registers, such as the rotated k); ``python -m course_lib.gpu_report``
    checks the compiled figures for sm_90 and sm_80.
    """
    tile = _tile_bytes(block, head_dim, dtype, tables)
    for stages in (3, 2, 1):
        if (2 * stages + 1) * tile <= 2 * limit:
            return stages
    return 0


def pick_config(
    head_dim: int,
    device: torch.device,
    block: int | None = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    tables: bool = False,
) -> StickConfig:
    """Tiles for ``head_dim`` on ``device``; ``block`` (a power of two >= 16) forces all of them.

    64x64 tiles in the interpreter (where fewer, larger tiles run fastest). On a GPU: 64x64
    tiles, halved until one pipelining stage fits in the GPU's shared memory per block (for
    ``dtype`` and with or without q/k ``tables``), and as many stages (up to 3) as fit. A
    ``block`` that cannot fit is refused with a ValueError.
    """
    if block is not None:
        if not isinstance(block, int) or block < 16 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 16, got {block!r}")
    limit = smem_per_block(device)
    if limit == 0:  # the interpreter
        size = block or 64
        return StickConfig(size, size, size, 4, 4)
    warps = 8 if head_dim >= 128 else 4
    bwd_warps = 8 if head_dim >= 64 else 4
    for size in (block,) if block is not None else (64, 32, 16):
        stages = _fit_stages(limit, size, head_dim, dtype, tables)
        if stages:
            return StickConfig(size, size, size, warps, bwd_warps, stages, stages)
    raise ValueError(
        f"stick-breaking tiles of {block or 16} rows at head_dim {head_dim} ({dtype}"
        f"{', with tables' if tables else ''}) need more shared memory than the GPU's "
        f"{limit // 1024} KiB per block; use a smaller block"
    )


def _switches(a: LaunchArgs, head_dim: int, causal: bool, dtype: torch.dtype) -> dict:
    """The constexpr arguments every stick-breaking kernel takes."""
    return {
        "HEAD_DIM": head_dim,
        "CAUSAL": bool(causal),
        "HAS_MASK": a.has_mask,
        "BIAS_FN": None if a.hook is None else a.hook.bias,
        "HAS_TABLES": a.has_tables,
        "HAS_GAIN": a.has_gain,
        "HALF_LAYOUT": a.half_layout,
        "DOT_PRECISION": dot_precision(dtype),
    }


def stick_breaking_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    *,
    causal: bool,
    scale: float,
    qk_tables=None,
    bias_hook: str | None = None,
    bias_params: torch.Tensor | None = None,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention forward (see the module docstring for the function).

    Args: q, k, v ``[batch, heads, seq, head_dim]`` (one dtype, any strides); positions float32
    ``[1 or batch, seq]``; key_mask ``[batch, seq]`` (nonzero = real) or None; qk_tables: an
    object with ``cos``, ``sin``, ``gain``, ``layout`` (see :mod:`.common`) or None (``q' = q``);
    bias_hook: a name in :data:`.score_bias.SCORE_BIAS_HOOKS` or None, bias_params: the tensor
    it reads; block: force every tile to this size (a power of two >= 16).

    Returns ``out`` ``[batch, heads, seq, head_dim]`` (input dtype, contiguous) and the row mass
    ``sum_j A_ij`` ``[batch, heads, seq]`` (float32), which the backward needs.
    """
    check_launch_inputs(q, k, v, positions, key_mask, qk_tables, bias_hook, bias_params)
    batch, heads, seq, head_dim = q.shape
    positions = positions.contiguous()
    a = prepare_launch(q, positions, key_mask, qk_tables, bias_hook, bias_params)
    cfg = pick_config(head_dim, q.device, block, dtype=q.dtype, tables=a.has_tables)
    out = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    mass = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(seq, cfg.block_m), batch * heads)
    run_launch(Launch("forward", _stick_fwd_kernel, grid, (
        q, k, v, out, mass, positions, a.mask, a.cos, a.sin, a.gain, a.bias_params,
        *q.stride(), *k.stride(), *v.stride(), out.stride(0), out.stride(1), *a.strides(),
        heads, seq, float(scale),
    ), dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **_switches(a, head_dim, causal, q.dtype),
    )))  # fmt: skip
    return out, mass


def stick_breaking_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mass: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    *,
    causal: bool,
    scale: float,
    qk_tables=None,
    bias_hook: str | None = None,
    bias_params: torch.Tensor | None = None,
    bias_grad: bool = False,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of :func:`stick_breaking_forward`: ``(dq, dk, dv, dparams)``.

    dq, dk, dv: float32 contiguous ``[batch, heads, seq, head_dim]``; dparams: the gradient of
    ``bias_params`` (float32, its shape) if ``bias_grad``, else None. Same arguments as the
    forward, plus ``grad_out`` (like the output, any strides) and the forward's ``mass``.
    """
    check_launch_inputs(q, k, v, positions, key_mask, qk_tables, bias_hook, bias_params)
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out must have shape {tuple(q.shape)}, got {tuple(grad_out.shape)}")
    batch, heads, seq, head_dim = q.shape
    positions = positions.contiguous()
    a = prepare_launch(q, positions, key_mask, qk_tables, bias_hook, bias_params)
    if bias_grad and (a.hook is None or a.hook.grad is None):
        raise ValueError("bias_grad needs a score-bias hook with a learnable tensor")
    grad_out = grad_out.to(q.dtype)
    cfg = pick_config(head_dim, q.device, block, dtype=q.dtype, tables=a.has_tables)
    block = cfg.block_bwd
    num_blocks = triton.cdiv(seq, block)
    sides = 1 if causal else 2
    f32 = {"dtype": torch.float32, "device": q.device}
    dq = torch.empty((batch, heads, seq, head_dim), **f32)
    dk = torch.empty((batch, heads, seq, head_dim), **f32)
    dv = torch.empty((batch, heads, seq, head_dim), **f32)
    delta = torch.empty((batch * heads, seq), **f32)
    total = torch.empty((batch * heads, sides, seq), **f32)
    ckpt_sp = torch.empty((batch * heads, sides, num_blocks, seq), **f32)
    ckpt_g = torch.empty((batch * heads, sides, num_blocks, seq), **f32)
    grad_width = a.hook.grad_width(block) if bias_grad else 1
    partials = torch.empty((batch * heads, num_blocks, grad_width) if bias_grad else (1,), **f32)
    switches = _switches(a, head_dim, causal, q.dtype)
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *a.strides())
    tables = (positions, a.mask, a.cos, a.sin, a.gain, a.bias_params)
    grid = (num_blocks, batch * heads)
    run_launch(Launch("bwd_rows", _stick_bwd_rows_kernel, grid, (
        q, k, v, grad_out, dq, delta, total, ckpt_sp, ckpt_g, *tables, *strides,
        heads, seq, float(scale),
    ), dict(
        BLOCK=block, num_warps=cfg.bwd_warps, num_stages=cfg.bwd_stages, **switches,
    )))  # fmt: skip
    run_launch(Launch("bwd_cols", _stick_bwd_cols_kernel, grid, (
        q, k, v, grad_out, dk, dv, partials, mass, delta, total, ckpt_sp, ckpt_g, *tables,
        *strides, heads, seq, float(scale),
    ), dict(
        BLOCK=block, BIAS_GRAD_FN=a.hook.grad if bias_grad else None, GRAD_WIDTH=grad_width,
        num_warps=cfg.bwd_warps, num_stages=cfg.bwd_stages, **switches,
    )))  # fmt: skip
    dparams = a.hook.reduce_grad(partials, batch, heads) if bias_grad else None
    return dq, dk, dv, dparams
