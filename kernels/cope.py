"""CoPE attention (forward and backward): a scan over the keys, nearest first, carrying a count.

Tensors q, k, v are ``[batch, heads, seq, head_dim]`` (any strides); ``z`` is float32
``[batch, heads, seq, npos]``, contiguous, ``z_i[n] = q_i . e[n]`` (the caller forms it with
torch, so the gradient of the position table ``e`` and q's share through ``z`` are torch's
business); ``key_mask`` int8 ``[batch, seq]`` (nonzero = real token) or absent. Causal only.

The function (Golovneva et al. 2024), for one (batch, head), key ``j`` allowed for query ``i``
iff ``j <= i`` and ``j`` is a real token::

    s_ij = scale * q_i . k_j                      g_ij = sigmoid(s_ij)   (0 if not allowed)
    p_ij = min(sum_{allowed l, j <= l <= i} g_il, npos - 1)
    t_ij = s_ij + (1 - w_ij) z_i[f_ij] + w_ij z_i[c_ij],   f = floor p, c = ceil p, w = p - f
    out_i = sum_j softmax_j(t_ij) v_j              (a query with no allowed key outputs 0)

Forward, per query block: the key blocks are visited from the diagonal block down to block 0
(nearest first, as the stick-breaking kernel does), carrying per row the sum of the gates of the
keys already passed. Inside a block a reversed ``tl.cumsum`` adds the gates of the nearer keys of
the same block, and key ``j`` itself: ``p_ij = carry_i + sum_{l >= j in block} g_il``. The two
``z`` values of each pair are gathered from ``z`` by the count, except where the count is capped:
there both are ``z_i[npos - 1]``, loaded once per row; the softmax is the online one of
flash attention (the visiting order does not matter to it). The row's log-sum-exp is stored.

Backward. With ``A = softmax(t)``, ``dt_ij = A_ij (dO_i . v_j - delta_i)``, ``delta_i = dO_i .
out_i``, and ``u_ij = dt_ij (z_i[c_ij] - z_i[f_ij])`` where the count is not clamped (else 0;
``d t / d p``), the gate of key ``l`` moves every count ``p_ij`` with ``j <= l``::

    dg_il = sum_{j <= l} u_ij = U_i - sum_{j > l} u_ij,     U_i = sum_j u_ij
    ds_il = dt_il + dg_il g_il (1 - g_il)
    dq_i  = scale sum_l ds_il k_l   (+ sum_n dz_i[n] e[n], done by torch through z)
    dk_l  = scale sum_i ds_il q_i,   dv_l = sum_i A_il dO_i
    dz_i[n] = sum_j dt_ij ((1 - w_ij) [f_ij = n] + w_ij [c_ij = n])

``sum_{j > l} u_ij`` is a sum over the keys nearer than ``l``: the same suffix structure as the
stick-breaking backward, solved the same way.

* Row kernel (one program per query block): pass A walks the key blocks nearest first, stores at
  the entry of each key block the row's running gate sum and running ``u`` sum (checkpoints),
  accumulates ``dz`` and ends with ``U_i``. Pass B walks them again and accumulates ``dq``.
  ``dz`` rows belong to this program, so it adds each tile's share to them in memory, without
  scatter or atomics. A capped count (``p = npos - 1``: every pair far enough from the diagonal
  when the table is short) reads ``z_i[npos - 1]`` with weight 1; those ``dt`` are summed per row
  in registers and added once at the end. The free counts of a row in a tile span
  ``floor(min p) .. floor(max p) + 1`` (the counts fall as ``j`` nears ``i``); the row's share
  ``sum_j dt_ij max(0, 1 - |p_ij - n|)`` (the two interpolation weights as one hat) is added over
  that window, ``CHUNK`` positions at a time.
* Column kernel (one program per key block): walks the query blocks at or after it; the
  checkpoints give every tile its count and ``u`` offsets, so each tile is exact on its own.
  It accumulates ``dk`` and ``dv``.

Deterministic (no atomics); besides O(seq) row data, the checkpoints take
``2 * seq * ceil(seq / BLOCK)`` fp32 per (batch, head). Everything is accumulated in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    Launch,
    _program_setup,
    check_dtype_on_gpu,
    gpu_arch,
    run_launch,
    smem_per_block,
)
from .limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS, MAX_BATCH_HEADS

__all__ = ["cope_backward", "cope_forward", "pick_block"]

# Positions of z handled at once when the backward adds a tile's share to dz.
CHUNK = 16


@triton.jit
def _cope_setup(Q, K, V, DO, Z, KPM, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb,
                stride_vh, stride_dob, stride_doh, num_heads, seq_len, npos):  # fmt: skip
    """Program ids -> ``(block, batch*heads index, Q, K, V, DO, Z, KPM)`` moved to this
    (batch, head) by the kernels' shared preamble (``common._program_setup``, CoPE's ``z`` in its
    score-bias slot, no positions or tables); ``DO`` is the output in the forward, ``dO`` in the
    backward."""
    blk, bh, Q, K, V, DO, _, KPM, _, _, _, _, Z = _program_setup(
        Q, K, V, DO, KPM, KPM, KPM, KPM, KPM, KPM, Z, stride_qb, stride_qh, stride_kb, stride_kh,
        stride_vb, stride_vh, stride_dob, stride_doh, 0, 0, num_heads * seq_len * npos,
        seq_len * npos, num_heads, seq_len, False,
    )  # fmt: skip
    return blk, bh, Q, K, V, DO, Z, KPM


@triton.jit
def _load_rows(base, rows, row_ok, stride_s, stride_d, HEAD_DIM: tl.constexpr):
    """A ``[rows, HEAD_DIM]`` tile (rows past the end read as 0), in its dtype."""
    d = tl.arange(0, HEAD_DIM)
    ptrs = base + rows[:, None] * stride_s + d[None, :] * stride_d
    return tl.load(ptrs, mask=row_ok[:, None], other=0.0)


@triton.jit
def _cope_tile(
    q,
    k,
    z_base,
    z_top,
    rows,
    cols,
    row_ok,
    key_ok,
    carry,
    scale,
    npos,
    DOT_PRECISION: tl.constexpr,
):
    """One ``[rows, cols]`` tile: ``allowed``, the gates ``g`` (0 where not allowed), the logits
    ``t`` (-inf where not allowed), ``free`` (allowed and the count below the cap ``npos - 1``,
    where ``d p / d g = 1``), the counts ``p`` (capped) and ``z[c] - z[f]`` (0 where not free).
    ``carry`` ``[rows]``: the gate sum of the keys in the blocks nearer to the query than this
    one; ``z_top`` ``[rows]``: ``z_i[npos - 1]``, the bias of every capped count, so only the
    free counts gather from ``z`` (far from the diagonal, with a short table, none do)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
    allowed = (cols[None, :] <= rows[:, None]) & row_ok[:, None] & key_ok[None, :]
    g = tl.where(allowed, tl.sigmoid(s), 0.0)
    p = carry[:, None] + tl.cumsum(g, axis=1, reverse=True)  # key j and the nearer keys
    top = (npos - 1).to(tl.float32)
    free = allowed & (p < top)
    p = tl.minimum(p, top)
    lower = tl.floor(p)
    w = p - lower
    f = lower.to(tl.int32)
    c = tl.minimum(f + (w > 0).to(tl.int32), npos - 1)
    z_rows = z_base + rows[:, None] * npos
    z_f = tl.load(z_rows + f, mask=free, other=0.0)
    z_c = tl.load(z_rows + c, mask=free, other=0.0)
    bias = tl.where(free, (1.0 - w) * z_f + w * z_c, z_top[:, None])
    t = tl.where(allowed, s + bias, float("-inf"))
    return allowed, g, t, free, p, z_c - z_f


@triton.jit
def _load_top(z_base, rows, row_ok, npos):
    """``z_i[npos - 1]`` of the block's rows ``[rows]`` (0 past the end)."""
    return tl.load(z_base + rows * npos + (npos - 1), mask=row_ok, other=0.0)


@triton.jit
def _load_keys(kb, k_base, v_base, mask_base, stride_ks, stride_kd, stride_vs, stride_vd,
               seq_len, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_MASK: tl.constexpr):  # fmt: skip
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < seq_len
    key_ok = col_in
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_base + cols, mask=col_in, other=0) != 0)
    k = _load_rows(k_base, cols, col_in, stride_ks, stride_kd, HEAD_DIM)
    v = _load_rows(v_base, cols, col_in, stride_vs, stride_vd, HEAD_DIM)
    return cols, key_ok, k, v


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _cope_fwd_kernel(
    q_ptr, k_ptr, v_ptr, z_ptr, out_ptr, lse_ptr, mask_ptr,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    num_heads, seq_len, npos, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, bh, q_base, k_base, v_base, out_base, z_base, mask_base = _cope_setup(
        q_ptr, k_ptr, v_ptr, out_ptr, z_ptr, mask_ptr, stride_qb, stride_qh, stride_kb,
        stride_kh, stride_vb, stride_vh, num_heads * seq_len * HEAD_DIM, seq_len * HEAD_DIM,
        num_heads, seq_len, npos,
    )  # fmt: skip
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_len
    q = _load_rows(q_base, rows, row_ok, stride_qs, stride_qd, HEAD_DIM)
    z_top = _load_top(z_base, rows, row_ok, npos)
    num_kb = tl.cdiv(seq_len, BLOCK_N)
    last = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // BLOCK_N, num_kb - 1)

    carry = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for step in range(last + 1):
        kb = last - step  # nearest key block first
        cols, key_ok, k, v = _load_keys(
            kb, k_base, v_base, mask_base, stride_ks, stride_kd, stride_vs, stride_vd, seq_len,
            HEAD_DIM, BLOCK_N, HAS_MASK,
        )  # fmt: skip
        allowed, g, t, _free, _p, _gap = _cope_tile(
            q, k, z_base, z_top, rows, cols, row_ok, key_ok, carry, scale, npos, DOT_PRECISION
        )
        carry += tl.sum(g, axis=1)
        m_new = tl.maximum(m_i, tl.max(t, axis=1))
        alpha = tl.exp(m_i - m_new)
        prob = tl.where(allowed, tl.exp(t - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    d = tl.arange(0, HEAD_DIM)
    tl.store(out_base + rows[:, None] * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])  # fmt: skip
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("inf"))
    tl.store(lse_ptr + bh * seq_len + rows, lse, mask=row_ok)


# --------------------------------------------------------------------------------------------
# Backward: row kernel (checkpoints, U, dz, dq)
# --------------------------------------------------------------------------------------------


@triton.jit
def _backward_tile(q, do, k, v, z_base, z_top, rows, cols, row_ok, key_ok, carry, lse, delta,
                   scale, npos, DOT_PRECISION: tl.constexpr):  # fmt: skip
    """The tile's ``allowed, g, A, dt, u``, ``free`` and ``p`` (see the module docstring)."""
    allowed, g, t, free, p, z_gap = _cope_tile(
        q, k, z_base, z_top, rows, cols, row_ok, key_ok, carry, scale, npos, DOT_PRECISION
    )
    a = tl.where(allowed, tl.exp(t - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    dt = a * (dp - delta[:, None])
    u = tl.where(free, dt * z_gap, 0.0)
    return allowed, g, a, dt, u, free, p


@triton.jit
def _add_dz_share(dz_base, rows, row_ok, dt, free, p, npos, CHUNK_SIZE: tl.constexpr):
    """``dz_i[n] += sum_j dt_ij max(0, 1 - |p_ij - n|)`` over the tile's free counts (the
    interpolation weights ``1 - w`` at ``floor p`` and ``w`` at ``ceil p`` as one hat).

    Row ``i`` touches only ``floor(min p) .. floor(max p) + 1``; its window starts there, and
    ``CHUNK_SIZE`` positions of every row's window are added at a time, until the widest
    window is covered: no scatter, no atomics (the rows are this program's)."""
    top = (npos - 1).to(tl.float32)
    start = tl.floor(tl.min(tl.where(free, p, top), axis=1))  # [rows]
    last = tl.floor(tl.max(tl.where(free, p, -1.0), axis=1)) + 1.0
    has_free = row_ok & (last >= 0.0)
    width = tl.max(tl.where(has_free, last - start + 1.0, 0.0)).to(tl.int32)
    dt_free = tl.where(free, dt, 0.0)
    offsets = tl.arange(0, CHUNK_SIZE).to(tl.float32)
    for n0 in range(0, width, CHUNK_SIZE):
        n = start[:, None] + (n0 + offsets)[None, :]  # [rows, CHUNK]
        hat = tl.maximum(1.0 - tl.abs(p[:, :, None] - n[:, None, :]), 0.0)
        share = tl.sum(dt_free[:, :, None] * hat, axis=1)
        n_int = n.to(tl.int32)
        keep = has_free[:, None] & (n_int < npos)
        ptrs = dz_base + rows[:, None] * npos + n_int
        tl.store(ptrs, tl.load(ptrs, mask=keep, other=0.0) + share, mask=keep)


@triton.jit
def _cope_bwd_rows_kernel(
    q_ptr, k_ptr, v_ptr, z_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dz_ptr, total_ptr,
    ckpt_g_ptr, ckpt_u_ptr, mask_ptr,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_dob, stride_doh, stride_dos, stride_dod,
    num_heads, seq_len, npos, scale,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, CHUNK_SIZE: tl.constexpr,
    HAS_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, bh, q_base, k_base, v_base, do_base, z_base, mask_base = _cope_setup(
        q_ptr, k_ptr, v_ptr, do_ptr, z_ptr, mask_ptr, stride_qb, stride_qh, stride_kb,
        stride_kh, stride_vb, stride_vh, stride_dob, stride_doh, num_heads, seq_len, npos,
    )  # fmt: skip
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < seq_len
    q = _load_rows(q_base, rows, row_ok, stride_qs, stride_qd, HEAD_DIM)
    do = _load_rows(do_base, rows, row_ok, stride_dos, stride_dod, HEAD_DIM).to(q.dtype)
    lse = tl.load(lse_ptr + bh * seq_len + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_ptr + bh * seq_len + rows, mask=row_ok, other=0.0)
    num_kb = tl.cdiv(seq_len, BLOCK)
    ckpt_g_base = ckpt_g_ptr + bh * num_kb * seq_len
    ckpt_u_base = ckpt_u_ptr + bh * num_kb * seq_len
    dz_base = dz_ptr + bh * seq_len * npos
    z_top = _load_top(z_base, rows, row_ok, npos)

    # Pass A: checkpoints at each key block's entry, dz, and the row totals U_i.
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    u_sum = tl.zeros([BLOCK], dtype=tl.float32)
    capped = tl.zeros([BLOCK], dtype=tl.float32)  # sum of dt over the capped counts
    for step in range(pid_m + 1):
        kb = pid_m - step
        tl.store(ckpt_g_base + kb * seq_len + rows, carry, mask=row_ok)
        tl.store(ckpt_u_base + kb * seq_len + rows, u_sum, mask=row_ok)
        cols, key_ok, k, v = _load_keys(
            kb, k_base, v_base, mask_base, stride_ks, stride_kd, stride_vs, stride_vd, seq_len,
            HEAD_DIM, BLOCK, HAS_MASK,
        )  # fmt: skip
        _allowed, g, _a, dt, u, free, p = _backward_tile(
            q, do, k, v, z_base, z_top, rows, cols, row_ok, key_ok, carry, lse, delta, scale,
            npos, DOT_PRECISION,
        )  # fmt: skip
        carry += tl.sum(g, axis=1)
        u_sum += tl.sum(u, axis=1)
        capped += tl.sum(tl.where(free, 0.0, dt), axis=1)  # dt is 0 where not allowed
        _add_dz_share(dz_base, rows, row_ok, dt, free, p, npos, CHUNK_SIZE)
    # every capped count reads z_i[npos - 1] with weight 1
    top_ptrs = dz_base + rows * npos + (npos - 1)
    tl.store(top_ptrs, tl.load(top_ptrs, mask=row_ok, other=0.0) + capped, mask=row_ok)
    total = u_sum
    tl.store(total_ptr + bh * seq_len + rows, total, mask=row_ok)

    # Pass B: dg_il = U_i - sum_{j > l} u_ij;  ds = dt + dg g (1 - g);  dq += ds k.
    dq = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    u_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(pid_m + 1):
        kb = pid_m - step
        cols, key_ok, k, v = _load_keys(
            kb, k_base, v_base, mask_base, stride_ks, stride_kd, stride_vs, stride_vd, seq_len,
            HEAD_DIM, BLOCK, HAS_MASK,
        )  # fmt: skip
        allowed, g, _a, dt, u, _free, _p = _backward_tile(
            q, do, k, v, z_base, z_top, rows, cols, row_ok, key_ok, carry, lse, delta, scale,
            npos, DOT_PRECISION,
        )  # fmt: skip
        nearer = u_sum[:, None] + tl.cumsum(u, axis=1, reverse=True) - u
        ds = tl.where(allowed, dt + (total[:, None] - nearer) * g * (1.0 - g), 0.0)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
        carry += tl.sum(g, axis=1)
        u_sum += tl.sum(u, axis=1)
    d = tl.arange(0, HEAD_DIM)
    tl.store(dq_ptr + bh * seq_len * HEAD_DIM + rows[:, None] * HEAD_DIM + d[None, :],
             dq * scale, mask=row_ok[:, None])  # fmt: skip


# --------------------------------------------------------------------------------------------
# Backward: column kernel (dk, dv)
# --------------------------------------------------------------------------------------------


@triton.jit
def _cope_bwd_cols_kernel(
    q_ptr, k_ptr, v_ptr, z_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, total_ptr,
    ckpt_g_ptr, ckpt_u_ptr, mask_ptr,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_dob, stride_doh, stride_dos, stride_dod,
    num_heads, seq_len, npos, scale,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
    HAS_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid_n, bh, q_base, k_base, v_base, do_base, z_base, mask_base = _cope_setup(
        q_ptr, k_ptr, v_ptr, do_ptr, z_ptr, mask_ptr, stride_qb, stride_qh, stride_kb,
        stride_kh, stride_vb, stride_vh, stride_dob, stride_doh, num_heads, seq_len, npos,
    )  # fmt: skip
    cols, key_ok, k, v = _load_keys(
        pid_n, k_base, v_base, mask_base, stride_ks, stride_kd, stride_vs, stride_vd, seq_len,
        HEAD_DIM, BLOCK, HAS_MASK,
    )  # fmt: skip
    num_qb = tl.cdiv(seq_len, BLOCK)
    ckpt_g_base = ckpt_g_ptr + bh * num_qb * seq_len + pid_n * seq_len
    ckpt_u_base = ckpt_u_ptr + bh * num_qb * seq_len + pid_n * seq_len
    dk = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32)
    for m in range(pid_n, num_qb):  # the query blocks that see these keys
        rows = m * BLOCK + tl.arange(0, BLOCK)
        row_ok = rows < seq_len
        q = _load_rows(q_base, rows, row_ok, stride_qs, stride_qd, HEAD_DIM)
        do = _load_rows(do_base, rows, row_ok, stride_dos, stride_dod, HEAD_DIM).to(q.dtype)
        lse = tl.load(lse_ptr + bh * seq_len + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + bh * seq_len + rows, mask=row_ok, other=0.0)
        total = tl.load(total_ptr + bh * seq_len + rows, mask=row_ok, other=0.0)
        carry = tl.load(ckpt_g_base + rows, mask=row_ok, other=0.0)
        u_before = tl.load(ckpt_u_base + rows, mask=row_ok, other=0.0)
        z_top = _load_top(z_base, rows, row_ok, npos)
        allowed, g, a, dt, u, _free, _p = _backward_tile(
            q, do, k, v, z_base, z_top, rows, cols, row_ok, key_ok, carry, lse, delta, scale,
            npos, DOT_PRECISION,
        )  # fmt: skip
        nearer = u_before[:, None] + tl.cumsum(u, axis=1, reverse=True) - u
        ds = tl.where(allowed, dt + (total[:, None] - nearer) * g * (1.0 - g), 0.0)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION)
        dv += tl.dot(tl.trans(a.to(q.dtype)), do, input_precision=DOT_PRECISION)
    col_in = cols < seq_len
    d = tl.arange(0, HEAD_DIM)
    offs = bh * seq_len * HEAD_DIM + cols[:, None] * HEAD_DIM + d[None, :]
    tl.store(dk_ptr + offs, dk * scale, mask=col_in[:, None])
    tl.store(dv_ptr + offs, dv, mask=col_in[:, None])


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


# Shared memory of the column kernel per element of a [BLOCK, head_dim] tile, bytes: 68 KiB at
# 32 x 128 on sm_75 (``python -m course_lib.gpu_report``; 57 KiB from sm_80 on).
_COLUMN_SMEM_PER_ELEMENT = 17


def pick_block(device: torch.device, head_dim: int, block: int | None = None) -> int:
    """Tile size: ``block`` if given (a power of two >= 16), else 64 in the interpreter (fewer,
    larger tiles run fastest there) and 32 on a GPU (the backward's ``[BLOCK, BLOCK, CHUNK]``
    comparison of counts with positions lives in registers), 16 where a 32-row tile of the
    column kernel would not fit the GPU's shared memory per block (sm_75 at head_dim 128)."""
    if block is not None:
        if not isinstance(block, int) or block < 16 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 16, got {block!r}")
        return block
    if gpu_arch(device) is None:
        return 64
    return 32 if _COLUMN_SMEM_PER_ELEMENT * 32 * head_dim <= smem_per_block(device) else 16


def _check(q, k, v, z, key_mask) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            "q, k, v must all be [batch, heads, seq, head_dim] with the same shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"q, k, v must share one dtype of {[str(d) for d in KERNEL_DTYPES]}, "
            f"got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    check_dtype_on_gpu(q.dtype, q.device)
    batch, heads, seq, head_dim = q.shape
    if head_dim not in KERNEL_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {list(KERNEL_HEAD_DIMS)}, got {head_dim}")
    if batch * heads > MAX_BATCH_HEADS:
        raise ValueError(f"batch * heads must be <= {MAX_BATCH_HEADS}, got {batch * heads}")
    if (
        z.dtype != torch.float32
        or z.dim() != 4
        or tuple(z.shape[:3]) != (batch, heads, seq)
        or z.shape[3] < 2
        or not z.is_contiguous()
    ):
        raise ValueError(
            f"z must be a contiguous float32 [{batch}, {heads}, {seq}, npos >= 2], got "
            f"{z.dtype} {tuple(z.shape)}"
        )
    if key_mask is not None and tuple(key_mask.shape) != (batch, seq):
        raise ValueError(f"key_mask must be [{batch}, {seq}], got {tuple(key_mask.shape)}")


def _mask_arg(q: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    if key_mask is None:
        return torch.ones(1, dtype=torch.int8, device=q.device)
    return key_mask.to(torch.int8).contiguous()


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def cope_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    z: torch.Tensor,
    key_mask: torch.Tensor | None,
    *,
    scale: float,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CoPE attention forward (causal; see the module docstring for the function).

    Returns ``out`` ``[batch, heads, seq, head_dim]`` (input dtype, contiguous) and the row
    log-sum-exp ``[batch * heads, seq]`` (float32; ``inf`` for a query with no allowed key),
    which the backward needs.
    """
    _check(q, k, v, z, key_mask)
    batch, heads, seq, head_dim = q.shape
    size = pick_block(q.device, head_dim, block)
    out = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch * heads, seq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(seq, size), batch * heads)
    args = (
        q, k, v, z, out, lse, _mask_arg(q, key_mask),
        *q.stride(), *k.stride(), *v.stride(),
        heads, seq, z.shape[3], float(scale),
    )  # fmt: skip
    switches = dict(
        HEAD_DIM=head_dim, BLOCK_M=size, BLOCK_N=size, HAS_MASK=key_mask is not None,
        DOT_PRECISION=_precision(q.dtype),
    )  # fmt: skip
    run_launch(Launch("forward", _cope_fwd_kernel, grid, args, switches))
    return out, lse


def cope_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    z: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    key_mask: torch.Tensor | None,
    *,
    scale: float,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`cope_forward`: ``(dq, dk, dv, dz)``, float32, contiguous.

    ``dq`` is the part through the scores (the part through ``z`` is ``dz @ e``, the caller's).
    """
    _check(q, k, v, z, key_mask)
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out must have shape {tuple(q.shape)}, got {tuple(grad_out.shape)}")
    batch, heads, seq, head_dim = q.shape
    size = pick_block(q.device, head_dim, block)
    num_blocks = triton.cdiv(seq, size)
    f32 = {"dtype": torch.float32, "device": q.device}
    grad_out = grad_out.to(q.dtype)
    delta = (grad_out.float() * out.float()).sum(-1).reshape(batch * heads, seq).contiguous()
    dq = torch.empty((batch, heads, seq, head_dim), **f32)
    dk = torch.empty((batch, heads, seq, head_dim), **f32)
    dv = torch.empty((batch, heads, seq, head_dim), **f32)
    dz = torch.zeros((batch, heads, seq, z.shape[3]), **f32)
    total = torch.empty((batch * heads, seq), **f32)
    ckpt_g = torch.empty((batch * heads, num_blocks, seq), **f32)
    ckpt_u = torch.empty((batch * heads, num_blocks, seq), **f32)
    mask = _mask_arg(q, key_mask)
    grid = (num_blocks, batch * heads)
    common = (
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(),
        heads, seq, z.shape[3], float(scale),
    )  # fmt: skip
    switches = dict(
        HEAD_DIM=head_dim, BLOCK=size, HAS_MASK=key_mask is not None,
        DOT_PRECISION=_precision(q.dtype),
    )  # fmt: skip
    rows = (q, k, v, z, grad_out, lse, delta, dq, dz, total, ckpt_g, ckpt_u, mask, *common)
    run_launch(
        Launch("bwd_rows", _cope_bwd_rows_kernel, grid, rows, dict(switches, CHUNK_SIZE=CHUNK))
    )
    cols = (q, k, v, z, grad_out, lse, delta, dk, dv, total, ckpt_g, ckpt_u, mask, *common)
    run_launch(Launch("bwd_cols", _cope_bwd_cols_kernel, grid, cols, switches))
    return dq, dk, dv, dz
