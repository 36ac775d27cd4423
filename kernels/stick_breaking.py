"""Stick-breaking attention (forward and backward), in log space, with optional RoPE and RSE.

Tensors q, k, v are ``[batch, heads, seq, head_dim]`` (any strides); ``positions`` is integer
``[1 or batch, seq]``; ``key_mask`` is ``[batch, seq]`` (nonzero = real token) or absent.

The function (Tan et al. 2024, "Scaling Stick-Breaking Attention"), for one (batch, head)::

    z_ij   = scale * q'_i . k'_j  -  lambda_h * |p_i - p_j|      (lambda term: RSE only)
    beta   = sigmoid(z)
    A_ij   = beta_ij * prod_{allowed l strictly between j and i} (1 - beta_il)
    out_i  = sum_j A_ij v_j + (1 - sum_j A_ij) v_i                (leftover stick: own value)

Key ``j`` is allowed for query ``i`` iff it is a real token and, causal, ``j < i`` (by index).
Bidirectional: one stick over the keys left of ``i`` and one over the keys right of it, each broken
from the nearest key outward and each worth half: ``A_ij = 1/2 * beta_ij * prod(...)``.
``q' = R(p) q`` and ``k' = R(p) k`` with RoPE (channel pair ``t`` rotated by the angle
``p * base**(-2t/D)``; the caller passes the cos/sin tables ``[1 or batch, seq, D/2]``), else
``q' = q``.

Everything is in log space (``log(1 - beta) = -softplus(z)``)::

    log A_ij = logsigmoid(z_ij) - sum_{allowed l between} softplus(z_il)   (+ log 1/2)

so logits of any finite magnitude give finite weights and gradients.

Forward, per query block: key blocks are visited from the nearest to the farthest (left stick:
from the diagonal block down to block 0; right stick: from the diagonal block up), carrying per row
the sum of ``softplus(z)`` over the keys already passed (``-log`` of what is left of the stick).
Inside a block, ``tl.cumsum`` (reversed for the left stick) gives the part of that sum contributed
by the nearer keys of the same block. ``sum_j A_ij v_j`` is accumulated with ``tl.dot`` and
``sum_j A_ij`` (the row's mass, stored for the backward) alongside, both in fp32.

Backward. With ``g_ij = dO_i . (v_j - v_i)`` (``out_i = v_i + sum_j A_ij (v_j - v_i)``) and
``G_ij = A_ij g_ij``::

    dz_il = G_il (1 - beta_il) - beta_il * F_il,   F_il = sum_{allowed j farther than l} G_ij
    dq'_i = scale sum_l dz_il k'_l        dk'_l = scale sum_i dz_il q'_i
    dv_j  = sum_i A_ij dO_i  +  (1 - sum_l A_jl) dO_j          dlambda_h = -sum dz_il |p_i - p_l|

``F`` is a suffix sum in visit order: ``F_il = T_i - P_il`` with ``T_i = sum_j G_ij`` (the row
total of one stick) and ``P_il`` the sum of ``G`` over the keys at least as near as ``l``.

* Row kernel (one program per query block): pass A walks the key blocks nearest first and
  computes ``T_i``; at the entry of each key block it stores the row's two running sums
  (softplus and ``G``) as a checkpoint. Pass B walks them again and accumulates ``dq'``.
* Column kernel (one program per key block): walks the query blocks; the checkpoints give every
  tile its ``-log`` stick and ``P`` offsets, so each tile is exact on its own. It accumulates
  ``dk'``, ``dv`` and its part of ``dlambda``.

Why checkpoints: a program that owns a key block cannot know the ``-log`` stick of a tile (it
depends on every key between that block and the query) without them; recomputing it would cost
O(seq^3). Deterministic, no atomics. Besides O(seq) row data, the checkpoints take
``2 * sides * seq * ceil(seq / BLOCK)`` fp32 per (batch, head) (``BLOCK`` times smaller than a
``seq x seq`` matrix, which never exists). ``A`` is recomputed from q and k, never stored.
``dq'`` and ``dk'`` are mapped back through the rotation (its transpose) in registers.

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

__all__ = [
    "SUPPORTED_DTYPES",
    "SUPPORTED_HEAD_DIMS",
    "StickConfig",
    "pick_config",
    "stick_breaking_backward",
    "stick_breaking_forward",
]

SUPPORTED_HEAD_DIMS: tuple[int, ...] = (16, 32, 64, 128)
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
MAX_BATCH_HEADS = 65535  # CUDA's limit on the second grid axis


# --------------------------------------------------------------------------------------------
# Tile helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _rope_layout(HEAD_DIM: tl.constexpr, HALF_STYLE: tl.constexpr):
    """Per channel ``d``: its pair partner, its pair index ``t`` and the sign of the partner term.

    ``rot(x)[d] = x[d] * cos_t + sign[d] * x[partner[d]] * sin_t``.
    """
    d = tl.arange(0, HEAD_DIM)
    if HALF_STYLE:
        partner = (d + HEAD_DIM // 2) % HEAD_DIM
        pair = d % (HEAD_DIM // 2)
        sign = tl.where(d < HEAD_DIM // 2, -1.0, 1.0)
    else:
        partner = d ^ 1
        pair = d // 2
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    return partner, pair, sign


@triton.jit
def _load_rotated(
    base,
    rows,
    row_ok,
    stride_s,
    stride_d,
    cos_base,
    sin_base,
    partner,
    pair,
    sign,
    HEAD_DIM: tl.constexpr,
    ROPE: tl.constexpr,
):
    """A ``[rows, HEAD_DIM]`` tile in fp32 (rows past the end read as 0), rotated if ``ROPE``.

    ``x' = R(p) x``: the tile is loaded twice, at its channels and at their pair partners, and
    combined with per-channel ``cos``/``sin`` read from the tables ``[seq, HEAD_DIM/2]`` at the
    pair index, so the rotation needs no data movement between channels.
    """
    d = tl.arange(0, HEAD_DIM)
    row_offs = rows[:, None] * stride_s
    x = tl.load(base + row_offs + d[None, :] * stride_d, mask=row_ok[:, None], other=0.0)
    x = x.to(tl.float32)
    if ROPE:
        x_partner = tl.load(
            base + row_offs + partner[None, :] * stride_d, mask=row_ok[:, None], other=0.0
        ).to(tl.float32)
        tab = rows[:, None] * (HEAD_DIM // 2) + pair[None, :]
        cos = tl.load(cos_base + tab, mask=row_ok[:, None], other=1.0)
        sin = tl.load(sin_base + tab, mask=row_ok[:, None], other=0.0)
        x = x * cos + sign[None, :] * x_partner * sin
    return x


@triton.jit
def _swap_pairs(x, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_STYLE: tl.constexpr):
    """The register tile ``x[:, partner(d)]``: each channel exchanged with its pair partner."""
    if HALF_STYLE:
        halves = tl.permute(tl.reshape(x, [ROWS, 2, HEAD_DIM // 2]), (0, 2, 1))
        low, high = tl.split(halves)
        y = tl.reshape(tl.permute(tl.join(high, low), (0, 2, 1)), [ROWS, HEAD_DIM])
    else:
        even, odd = tl.split(tl.reshape(x, [ROWS, HEAD_DIM // 2, 2]))
        y = tl.reshape(tl.join(odd, even), [ROWS, HEAD_DIM])
    return y


@triton.jit
def _store_unrotated(
    base,
    rows,
    row_ok,
    grad,
    cos_base,
    sin_base,
    pair,
    sign,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROPE: tl.constexpr,
    HALF_STYLE: tl.constexpr,
):
    """Store a gradient w.r.t. ``x'`` as one w.r.t. ``x`` into a contiguous fp32 ``[seq, D]``.

    ``dx = R(p)^T dx'``, i.e. ``dx[d] = dx'[d] * cos_t - sign[d] * dx'[partner[d]] * sin_t``;
    the partner channels are exchanged in registers.
    """
    d = tl.arange(0, HEAD_DIM)
    if ROPE:
        tab = rows[:, None] * (HEAD_DIM // 2) + pair[None, :]
        cos = tl.load(cos_base + tab, mask=row_ok[:, None], other=1.0)
        sin = tl.load(sin_base + tab, mask=row_ok[:, None], other=0.0)
        grad_partner = _swap_pairs(grad, ROWS, HEAD_DIM, HALF_STYLE)
        grad = grad * cos - sign[None, :] * grad_partner * sin
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
    partner,
    pair,
    sign,
    seq_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    ROPE: tl.constexpr,
):
    """Key block ``kb``: indices, real-key flags, positions, ``k'`` and ``v`` (input dtype)."""
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < seq_len
    key_ok = col_in
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_base + cols, mask=col_in, other=0) != 0)
    pos_j = tl.load(pos_base + cols, mask=col_in, other=0)
    k = _load_rotated(
        k_base, cols, col_in, stride_ks, stride_kd, cos_base, sin_base, partner, pair, sign,
        HEAD_DIM, ROPE,
    ).to(k_base.dtype.element_ty)  # fmt: skip
    d = tl.arange(0, HEAD_DIM)
    v = tl.load(
        v_base + cols[:, None] * stride_vs + d[None, :] * stride_vd, mask=col_in[:, None], other=0.0
    )
    return cols, key_ok, pos_j, k, v


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
    lam,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_PENALTY: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One ``[rows, cols]`` tile of one stick.

    ``log_stick`` ``[rows]`` is the sum of ``softplus(z)`` over the allowed keys of this stick in
    the blocks nearer to the query than this one. Returns ``allowed``, ``softplus(z)`` (0 where
    not allowed), the weights ``A`` and ``beta = sigmoid(z)`` (both 0 where not allowed).
    """
    z = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
    if HAS_PENALTY:
        z -= lam * tl.abs(pos_i[:, None] - pos_j[None, :]).to(tl.float32)
    if LEFT:
        side = cols[None, :] < rows[:, None]
    else:
        side = cols[None, :] > rows[:, None]
    allowed = side & row_ok[:, None] & key_ok[None, :]
    # softplus(z) = log(1 + e^z) = max(z, 0) + log(1 + e^-|z|); logsigmoid(z) = z - softplus(z).
    log1p_exp = tl.log(1.0 + tl.exp(-tl.abs(z)))
    log_beta = tl.minimum(z, 0.0) - log1p_exp
    sp = tl.where(allowed, tl.maximum(z, 0.0) + log1p_exp, 0.0)
    # Nearer keys of this block: after j for the left stick, before j for the right one.
    nearer = tl.cumsum(sp, axis=1, reverse=LEFT) - sp
    log_a = log_beta - log_stick[:, None] - nearer
    if not CAUSAL:
        log_a += -0.6931471805599453  # log(1/2): each stick holds half of the mass
    a = tl.where(allowed, tl.exp(log_a), 0.0)
    beta = tl.where(allowed, tl.exp(log_beta), 0.0)
    return allowed, sp, a, beta


@triton.jit
def _program_ids(num_heads, REVERSED: tl.constexpr):
    """(block index, flat batch*head, batch, head); the block axis reversed if ``REVERSED``."""
    if REVERSED:  # causal rows: the last blocks have the most work, so they start first
        blk = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    return blk, bh, bh // num_heads, bh % num_heads


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
    partner,
    pair,
    sign,
    seq_len,
    scale,
    lam,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_PENALTY: tl.constexpr,
    ROPE: tl.constexpr,
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
            stride_vs, stride_vd, partner, pair, sign, seq_len, HEAD_DIM, BLOCK_N, HAS_MASK, ROPE,
        )  # fmt: skip
        _allowed, sp, a, _beta = _stick_tile(
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, lam,
            LEFT, CAUSAL, HAS_PENALTY, DOT_PRECISION,
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
    penalty_ptr,
    cos_ptr,
    sin_ptr,
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
    stride_pos_b,
    stride_tab_b,
    num_heads,
    seq_len,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_PENALTY: tl.constexpr,
    ROPE: tl.constexpr,
    HALF_STYLE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m, bh, b, h = _program_ids(num_heads, CAUSAL)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_len
    d = tl.arange(0, HEAD_DIM)
    partner, pair, sign = _rope_layout(HEAD_DIM, HALF_STYLE)
    pos_base = pos_ptr + b * stride_pos_b
    mask_base = mask_ptr + b * seq_len
    cos_base = cos_ptr + b * stride_tab_b
    sin_base = sin_ptr + b * stride_tab_b
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    pos_i = tl.load(pos_base + rows, mask=row_ok, other=0)
    lam = tl.load(penalty_ptr + h)
    q = _load_rotated(
        q_ptr + b * stride_qb + h * stride_qh, rows, row_ok, stride_qs, stride_qd, cos_base,
        sin_base, partner, pair, sign, HEAD_DIM, ROPE,
    ).to(q_ptr.dtype.element_ty)  # fmt: skip

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    mass = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, mass = _forward_one_stick(
        acc, mass, q, rows, row_ok, pos_i, pid_m, k_base, v_base, pos_base, mask_base, cos_base,
        sin_base, stride_ks, stride_kd, stride_vs, stride_vd, partner, pair, sign, seq_len, scale,
        lam, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, HAS_MASK, HAS_PENALTY, ROPE, DOT_PRECISION,
    )  # fmt: skip
    if not CAUSAL:
        acc, mass = _forward_one_stick(
            acc, mass, q, rows, row_ok, pos_i, pid_m, k_base, v_base, pos_base, mask_base,
            cos_base, sin_base, stride_ks, stride_kd, stride_vs, stride_vd, partner, pair, sign,
            seq_len, scale, lam, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, HAS_MASK, HAS_PENALTY,
            ROPE, DOT_PRECISION,
        )  # fmt: skip

    v_own = tl.load(
        v_base + rows[:, None] * stride_vs + d[None, :] * stride_vd, mask=row_ok[:, None], other=0.0
    ).to(tl.float32)
    out = acc + (1.0 - mass)[:, None] * v_own  # the leftover stick goes to the own value
    out_ptrs = out_ptr + bh * seq_len * HEAD_DIM + rows[:, None] * HEAD_DIM + d[None, :]
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
    partner,
    pair,
    sign,
    seq_len,
    scale,
    lam,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_PENALTY: tl.constexpr,
    ROPE: tl.constexpr,
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
            stride_vs, stride_vd, partner, pair, sign, seq_len, HEAD_DIM, BLOCK, HAS_MASK, ROPE,
        )  # fmt: skip
        _allowed, sp, a, _beta = _stick_tile(
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, lam,
            LEFT, CAUSAL, HAS_PENALTY, DOT_PRECISION,
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
            stride_vs, stride_vd, partner, pair, sign, seq_len, HEAD_DIM, BLOCK, HAS_MASK, ROPE,
        )  # fmt: skip
        allowed, sp, a, beta = _stick_tile(
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, lam,
            LEFT, CAUSAL, HAS_PENALTY, DOT_PRECISION,
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
    penalty_ptr,
    cos_ptr,
    sin_ptr,
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
    num_heads,
    seq_len,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_PENALTY: tl.constexpr,
    ROPE: tl.constexpr,
    HALF_STYLE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m, bh, b, h = _program_ids(num_heads, CAUSAL)
    num_kb = tl.cdiv(seq_len, BLOCK)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < seq_len
    d = tl.arange(0, HEAD_DIM)
    partner, pair, sign = _rope_layout(HEAD_DIM, HALF_STYLE)
    pos_base = pos_ptr + b * stride_pos_b
    mask_base = mask_ptr + b * seq_len
    cos_base = cos_ptr + b * stride_tab_b
    sin_base = sin_ptr + b * stride_tab_b
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    pos_i = tl.load(pos_base + rows, mask=row_ok, other=0)
    lam = tl.load(penalty_ptr + h)
    q = _load_rotated(
        q_ptr + b * stride_qb + h * stride_qh, rows, row_ok, stride_qs, stride_qd, cos_base,
        sin_base, partner, pair, sign, HEAD_DIM, ROPE,
    ).to(q_ptr.dtype.element_ty)  # fmt: skip
    do_ptrs = do_ptr + b * stride_dob + h * stride_doh + rows[:, None] * stride_dos
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
        stride_ks, stride_kd, stride_vs, stride_vd, partner, pair, sign, seq_len, scale, lam,
        HEAD_DIM, BLOCK, True, CAUSAL, HAS_MASK, HAS_PENALTY, ROPE, DOT_PRECISION,
    )  # fmt: skip
    if not CAUSAL:
        dq = _backward_rows_one_stick(
            dq, q, do, delta, rows, row_ok, pos_i, pid_m, k_base, v_base, pos_base, mask_base,
            cos_base, sin_base, ckpt_sp_ptr + (bh * 2 + 1) * ckpt_stride,
            ckpt_g_ptr + (bh * 2 + 1) * ckpt_stride, total_ptr + (bh * 2 + 1) * seq_len,
            stride_ks, stride_kd, stride_vs, stride_vd, partner, pair, sign, seq_len, scale, lam,
            HEAD_DIM, BLOCK, False, CAUSAL, HAS_MASK, HAS_PENALTY, ROPE, DOT_PRECISION,
        )  # fmt: skip
    _store_unrotated(
        dq_ptr + bh * seq_len * HEAD_DIM, rows, row_ok, dq * scale, cos_base, sin_base, pair,
        sign, BLOCK, HEAD_DIM, ROPE, HALF_STYLE,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Backward: column kernel (dk, dv, dlambda)
# --------------------------------------------------------------------------------------------


@triton.jit
def _backward_cols_one_stick(
    dk,
    dv,
    dlam,
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
    partner,
    pair,
    sign,
    seq_len,
    scale,
    lam,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_PENALTY: tl.constexpr,
    ROPE: tl.constexpr,
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
        pos_i = tl.load(pos_base + rows, mask=row_ok, other=0)
        q = _load_rotated(
            q_base, rows, row_ok, stride_qs, stride_qd, cos_base, sin_base, partner, pair, sign,
            HEAD_DIM, ROPE,
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
            q, k, rows, cols, row_ok, key_ok, pos_i, pos_j, log_stick, scale, lam,
            LEFT, CAUSAL, HAS_PENALTY, DOT_PRECISION,
        )  # fmt: skip
        ga = a * (tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION) - delta[:, None])
        near_or_at = g_before[:, None] + tl.cumsum(ga, axis=1, reverse=LEFT)
        dz = ga * (1.0 - beta) - beta * (total[:, None] - near_or_at)
        dz = tl.where(allowed, dz, 0.0)
        dk += tl.dot(tl.trans(dz.to(k.dtype)), q, input_precision=DOT_PRECISION)
        dv += tl.dot(tl.trans(a.to(k.dtype)), do, input_precision=DOT_PRECISION)
        if HAS_PENALTY:
            distance = tl.abs(pos_i[:, None] - pos_j[None, :]).to(tl.float32)
            dlam -= tl.sum(dz * distance, axis=0)
    return dk, dv, dlam


@triton.jit
def _stick_bwd_cols_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    dk_ptr,
    dv_ptr,
    dlam_ptr,
    mass_ptr,
    delta_ptr,
    total_ptr,
    ckpt_sp_ptr,
    ckpt_g_ptr,
    pos_ptr,
    mask_ptr,
    penalty_ptr,
    cos_ptr,
    sin_ptr,
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
    num_heads,
    seq_len,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_PENALTY: tl.constexpr,
    ROPE: tl.constexpr,
    HALF_STYLE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n, bh, b, h = _program_ids(num_heads, False)
    num_kb = tl.cdiv(seq_len, BLOCK)
    d = tl.arange(0, HEAD_DIM)
    partner, pair, sign = _rope_layout(HEAD_DIM, HALF_STYLE)
    pos_base = pos_ptr + b * stride_pos_b
    cos_base = cos_ptr + b * stride_tab_b
    sin_base = sin_ptr + b * stride_tab_b
    cols, key_ok, pos_j, k, v = _load_keys(
        pid_n, k_ptr + b * stride_kb + h * stride_kh, v_ptr + b * stride_vb + h * stride_vh,
        mask_ptr + b * seq_len, pos_base, cos_base, sin_base, stride_ks, stride_kd, stride_vs,
        stride_vd, partner, pair, sign, seq_len, HEAD_DIM, BLOCK, HAS_MASK, ROPE,
    )  # fmt: skip
    col_in = cols < seq_len
    lam = tl.load(penalty_ptr + h)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    do_base = do_ptr + b * stride_dob + h * stride_doh

    if CAUSAL:
        sides = 1
    else:
        sides = 2
    ckpt_stride = num_kb * seq_len
    dk = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dlam = tl.zeros([BLOCK], dtype=tl.float32)
    dk, dv, dlam = _backward_cols_one_stick(
        dk, dv, dlam, k, v, cols, key_ok, pos_j, pid_n, q_base, do_base, pos_base, cos_base,
        sin_base, delta_ptr + bh * seq_len, ckpt_sp_ptr + bh * sides * ckpt_stride,
        ckpt_g_ptr + bh * sides * ckpt_stride, total_ptr + bh * sides * seq_len,
        stride_qs, stride_qd, stride_dos, stride_dod, partner, pair, sign, seq_len, scale, lam,
        HEAD_DIM, BLOCK, True, CAUSAL, HAS_PENALTY, ROPE, DOT_PRECISION,
    )  # fmt: skip
    if not CAUSAL:
        dk, dv, dlam = _backward_cols_one_stick(
            dk, dv, dlam, k, v, cols, key_ok, pos_j, pid_n, q_base, do_base, pos_base, cos_base,
            sin_base, delta_ptr + bh * seq_len, ckpt_sp_ptr + (bh * 2 + 1) * ckpt_stride,
            ckpt_g_ptr + (bh * 2 + 1) * ckpt_stride, total_ptr + (bh * 2 + 1) * seq_len,
            stride_qs, stride_qd, stride_dos, stride_dod, partner, pair, sign, seq_len, scale,
            lam, HEAD_DIM, BLOCK, False, CAUSAL, HAS_PENALTY, ROPE, DOT_PRECISION,
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
        dk_ptr + bh * seq_len * HEAD_DIM, cols, col_in, dk * scale, cos_base, sin_base, pair,
        sign, BLOCK, HEAD_DIM, ROPE, HALF_STYLE,
    )  # fmt: skip
    dv_ptrs = dv_ptr + bh * seq_len * HEAD_DIM + cols[:, None] * HEAD_DIM + d[None, :]
    tl.store(dv_ptrs, dv, mask=col_in[:, None])
    tl.store(dlam_ptr + bh * num_kb + pid_n, tl.sum(dlam, axis=0))


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


class StickConfig:
    """Tile sizes and launch options of the stick-breaking kernels."""

    def __init__(self, block_m: int, block_n: int, block_bwd: int, num_warps: int, bwd_warps: int):
        self.block_m = block_m
        self.block_n = block_n
        self.block_bwd = block_bwd
        self.num_warps = num_warps
        self.bwd_warps = bwd_warps

    def __repr__(self) -> str:
        return (
            f"StickConfig(block_m={self.block_m}, block_n={self.block_n}, "
            f"block_bwd={self.block_bwd}, num_warps={self.num_warps}, bwd_warps={self.bwd_warps})"
        )


def pick_config(head_dim: int, device: torch.device, block: int | None = None) -> StickConfig:
    """Tiles for ``head_dim`` on ``device``; ``block`` (a power of two >= 16) forces all of them.

    64x64 tiles on the GPU and in the interpreter (where fewer, larger tiles run fastest).
    """
    if block is not None:
        if not isinstance(block, int) or block < 16 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 16, got {block!r}")
        return StickConfig(block, block, block, 4, 4)
    if device.type != "cuda":
        return StickConfig(64, 64, 64, 4, 4)
    wide = head_dim >= 128
    return StickConfig(64, 64, 64, 8 if wide else 4, 8 if head_dim >= 64 else 4)


def _check_launch_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    penalty: torch.Tensor | None,
    rope_tables: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            "q, k, v must share one shape [batch, heads, seq, head_dim], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"q, k, v must share one dtype of {list(SUPPORTED_DTYPES)}, got "
            f"{q.dtype}, {k.dtype}, {v.dtype}"
        )
    batch, heads, seq, head_dim = q.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"the stick-breaking kernel supports head_dim in {list(SUPPORTED_HEAD_DIMS)}, "
            f"got {head_dim}"
        )
    if seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq}")
    if batch * heads > MAX_BATCH_HEADS:
        raise ValueError(f"batch * heads must be <= {MAX_BATCH_HEADS}, got {batch * heads}")
    if positions.dtype != torch.int64 or positions.dim() != 2 or positions.shape[1] != seq:
        raise ValueError(
            f"positions must be int64 [1 or batch, {seq}], got {positions.dtype} "
            f"{tuple(positions.shape)}"
        )
    if positions.shape[0] not in (1, batch) or not positions.is_contiguous():
        raise ValueError(f"positions must be contiguous [1 or {batch}, {seq}]")
    if key_mask is not None and (
        tuple(key_mask.shape) != (batch, seq) or not key_mask.is_contiguous()
    ):
        raise ValueError(
            f"key_mask must be contiguous [{batch}, {seq}], got {tuple(key_mask.shape)}"
        )
    if penalty is not None and (tuple(penalty.shape) != (heads,) or penalty.dtype != torch.float32):
        raise ValueError(
            f"penalty must be float32 [{heads}], got {penalty.dtype} {tuple(penalty.shape)}"
        )
    if rope_tables is not None:
        for table in rope_tables:
            if (
                table.dtype != torch.float32
                or table.dim() != 3
                or table.shape[0] not in (1, batch)
                or tuple(table.shape[1:]) != (seq, head_dim // 2)
                or not table.is_contiguous()
            ):
                raise ValueError(
                    f"rope tables must be contiguous float32 [1 or {batch}, {seq}, {head_dim // 2}]"
                )


def _common_args(
    q: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    penalty: torch.Tensor | None,
    rope_tables: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple:
    """Placeholders for absent inputs (never read: their ``HAS_*`` switch is off)."""
    dummy_f = torch.zeros(1, dtype=torch.float32, device=q.device)
    mask = key_mask if key_mask is not None else torch.ones(1, dtype=torch.int8, device=q.device)
    lam = (
        penalty
        if penalty is not None
        else torch.zeros(q.shape[1], dtype=torch.float32, device=q.device)
    )
    if rope_tables is not None:
        cos, sin = rope_tables
        stride_tab_b = 0 if cos.shape[0] == 1 else cos.stride(0)
    else:
        cos, sin, stride_tab_b = dummy_f, dummy_f, 0
    stride_pos_b = 0 if positions.shape[0] == 1 else positions.stride(0)
    return mask, lam, cos, sin, stride_pos_b, stride_tab_b


def stick_breaking_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    penalty: torch.Tensor | None,
    rope_tables: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    causal: bool,
    scale: float,
    half_style: bool = False,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention forward (see the module docstring for the function).

    Args: q, k, v ``[batch, heads, seq, head_dim]`` (one dtype); positions int64
    ``[1 or batch, seq]``; key_mask int8/bool ``[batch, seq]`` or None; penalty float32
    ``[heads]`` (lambda) or None; rope_tables ``(cos, sin)`` float32 ``[1 or batch, seq, D/2]``
    or None (no rotation); half_style: pairs ``(t, t+D/2)`` instead of ``(2t, 2t+1)``.

    Returns ``out`` ``[batch, heads, seq, head_dim]`` (input dtype, contiguous) and the row mass
    ``sum_j A_ij`` ``[batch, heads, seq]`` (float32), which the backward needs.
    """
    _check_launch_inputs(q, k, v, positions, key_mask, penalty, rope_tables)
    batch, heads, seq, head_dim = q.shape
    cfg = pick_config(head_dim, q.device, block)
    mask, lam, cos, sin, stride_pos_b, stride_tab_b = _common_args(
        q, positions, key_mask, penalty, rope_tables
    )
    out = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    mass = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(seq, cfg.block_m), batch * heads)
    _stick_fwd_kernel[grid](
        q, k, v, out, mass, positions, mask, lam, cos, sin,
        *q.stride(), *k.stride(), *v.stride(),
        stride_pos_b, stride_tab_b, heads, seq, float(scale),
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=bool(causal),
        HAS_MASK=key_mask is not None, HAS_PENALTY=penalty is not None,
        ROPE=rope_tables is not None, HALF_STYLE=bool(half_style),
        DOT_PRECISION=_dot_precision(q.dtype), num_warps=cfg.num_warps,
    )  # fmt: skip
    return out, mass


def stick_breaking_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mass: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    penalty: torch.Tensor | None,
    rope_tables: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    causal: bool,
    scale: float,
    half_style: bool = False,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of :func:`stick_breaking_forward` w.r.t. q, k, v (float32, ``[B, H, S, D]``) and
    lambda (float32 ``[heads]``, None without a penalty). Same arguments, plus ``grad_out`` (like
    the output, any strides) and the forward's ``mass``.
    """
    _check_launch_inputs(q, k, v, positions, key_mask, penalty, rope_tables)
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out must have shape {tuple(q.shape)}, got {tuple(grad_out.shape)}")
    grad_out = grad_out.to(q.dtype)
    batch, heads, seq, head_dim = q.shape
    cfg = pick_config(head_dim, q.device, block)
    block = cfg.block_bwd
    num_blocks = triton.cdiv(seq, block)
    sides = 1 if causal else 2
    mask, lam, cos, sin, stride_pos_b, stride_tab_b = _common_args(
        q, positions, key_mask, penalty, rope_tables
    )
    f32 = {"dtype": torch.float32, "device": q.device}
    dq = torch.empty((batch, heads, seq, head_dim), **f32)
    dk = torch.empty((batch, heads, seq, head_dim), **f32)
    dv = torch.empty((batch, heads, seq, head_dim), **f32)
    delta = torch.empty((batch * heads, seq), **f32)
    total = torch.empty((batch * heads, sides, seq), **f32)
    ckpt_sp = torch.empty((batch * heads, sides, num_blocks, seq), **f32)
    ckpt_g = torch.empty((batch * heads, sides, num_blocks, seq), **f32)
    dlam = torch.empty((batch * heads, num_blocks), **f32)
    switches = {
        "HEAD_DIM": head_dim,
        "BLOCK": block,
        "CAUSAL": bool(causal),
        "HAS_MASK": key_mask is not None,
        "HAS_PENALTY": penalty is not None,
        "ROPE": rope_tables is not None,
        "HALF_STYLE": bool(half_style),
        "DOT_PRECISION": _dot_precision(q.dtype),
        "num_warps": cfg.bwd_warps,
    }
    grid = (num_blocks, batch * heads)
    _stick_bwd_rows_kernel[grid](
        q, k, v, grad_out, dq, delta, total, ckpt_sp, ckpt_g, positions, mask, lam, cos, sin,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(),
        stride_pos_b, stride_tab_b, heads, seq, float(scale), **switches,
    )  # fmt: skip
    _stick_bwd_cols_kernel[grid](
        q, k, v, grad_out, dk, dv, dlam, mass, delta, total, ckpt_sp, ckpt_g, positions, mask,
        lam, cos, sin, *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(),
        stride_pos_b, stride_tab_b, heads, seq, float(scale), **switches,
    )  # fmt: skip
    dpenalty = dlam.view(batch, heads, num_blocks).sum(dim=(0, 2)) if penalty is not None else None
    return dq, dk, dv, dpenalty


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use exact IEEE products (tf32 would miss a 1e-4 tolerance)."""
    return "ieee" if dtype == torch.float32 else "tf32"
