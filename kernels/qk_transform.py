"""The per-token q/k transform, applied once per call: ``q' = g * R(p) q`` and its transpose.

Channel pair ``t`` = ``(x_1, x_2)`` of the token at sequence index ``s`` becomes::

    x'_1 = g_1 (x_1 cos[s, t] - x_2 sin[s, t])
    x'_2 = g_2 (x_1 sin[s, t] + x_2 cos[s, t])

(``g``: the optional per-channel ``gain``; keys may read tables of their own, as xPos's do; see
:class:`course_lib.kernel_hooks.QKTables` for the tables and :mod:`.common` for their layout).
This covers RoPE in both pair layouts, its scalings, ExpoSB's amplitude and band gain, 2-D RoPE
and xPos.

The transform is per token: O(seq * head_dim) work, the same for every key a query meets. So it
is done once per call, outside the attention loops (the rule FlashAttention's rotary follows for
training): :func:`encode_qk` writes ``q'`` and ``k'`` (input dtype, contiguous), the loops of
either kernel family run on them exactly as plain attention does, and the backward maps the
loops' float32 gradients w.r.t. ``q'``, ``k'`` back with the transpose, once
(:func:`decode_qk_grads`)::

    dx_1 = cos g_1 dy_1 + sin g_2 dy_2
    dx_2 = -sin g_1 dy_1 + cos g_2 dy_2

Inside a loop the transform would be paid once per (key tile, query block): ``seq / BLOCK_M``
times per key, with the tables' loads. The rounding is the same either way: ``x'`` is computed
in float32 and rounded once to the input dtype; the gradient is transposed in float32 and
rounded once.

Both passes are one program per (block of rows, batch x head); their Triton helpers
(:func:`_load_encoded`, :func:`_store_decoded` and the pair bookkeeping) are written once here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import Launch, LaunchArgs, _check_tables, prepare_launch, run_launch

__all__ = ["ROWS_PER_PROGRAM", "decode_qk_grads", "encode_qk"]

# Rows of one program of the encode and decode passes (a bandwidth-bound pass: any size that
# keeps a few tiles in flight does; in the interpreter, the cost is per program).
ROWS_PER_PROGRAM = 64


@triton.jit
def _pair_channels(HEAD_DIM: tl.constexpr, HALF_PAD: tl.constexpr, HALF_LAYOUT: tl.constexpr):
    """Pair index ``t`` (padded to ``HALF_PAD``), its validity, and the two channels of the pair.

    Interleaved: pair ``t`` is channels ``(2t, 2t+1)``; half: ``(t, t + HEAD_DIM/2)``.
    """
    t = tl.arange(0, HALF_PAD)
    pair_valid = t < HEAD_DIM // 2
    if HALF_LAYOUT:
        first = t
        second = t + HEAD_DIM // 2
    else:
        first = 2 * t
        second = 2 * t + 1
    return t, pair_valid, first, second


@triton.jit
def _load_rows(base, offs_row, row_valid, stride_s, stride_d, HEAD_DIM: tl.constexpr,
               BOUNDS: tl.constexpr):  # fmt: skip
    """Load a ``[rows, HEAD_DIM]`` tile of a ``[seq, HEAD_DIM]`` matrix (with ``BOUNDS``, rows
    past the end are 0; without, every row must exist)."""
    ptrs = base + offs_row[:, None] * stride_s + tl.arange(0, HEAD_DIM)[None, :] * stride_d
    if BOUNDS:
        x = tl.load(ptrs, mask=row_valid[:, None], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _load_encoded(
    base,
    stride_s,
    stride_d,
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
    HALF_PAD: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    PAIR_HALVES: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BOUNDS: tl.constexpr,
):
    """Load a q or k tile for ``q' . k'``: with ``PAIR_HALVES`` (always with tables), its pair
    halves ``(x'_1, x'_2)``, each ``[rows, HALF_PAD]``; without, the whole ``[rows, HEAD_DIM]``
    tile, twice.

    With tables: ``x'_1 = x_1 cos - x_2 sin``, ``x'_2 = x_1 sin + x_2 cos`` (fp32), times the
    gain if ``HAS_GAIN``, cast back to the input dtype; then ``q' . k' = q'_1 . k'_1 + q'_2 .
    k'_2``. Rows past the end are 0 with ``BOUNDS``; without it every row must exist.
    """
    if PAIR_HALVES:
        row_ptrs = base + offs_row[:, None] * stride_s
        if BOUNDS:
            mask = row_valid[:, None] & pair_valid[None, :]
        else:  # (head_dim 16: pairs padded to tl.dot's minimum width)
            mask = (offs_row >= 0)[:, None] & pair_valid[None, :]
        if HALF_PAD != HEAD_DIM // 2:
            x1 = tl.load(row_ptrs + first[None, :] * stride_d, mask=mask, other=0.0)
            x2 = tl.load(row_ptrs + second[None, :] * stride_d, mask=mask, other=0.0)
        elif HALF_LAYOUT:
            x1 = _load_rows(base, offs_row, row_valid, stride_s, stride_d, HEAD_DIM // 2, BOUNDS)
            x2 = _load_rows(base + (HEAD_DIM // 2) * stride_d, offs_row, row_valid, stride_s,
                            stride_d, HEAD_DIM // 2, BOUNDS)  # fmt: skip
        else:  # interleaved pairs: one contiguous load, split in registers
            x = _load_rows(base, offs_row, row_valid, stride_s, stride_d, HEAD_DIM, BOUNDS)
            x1, x2 = tl.split(tl.reshape(x, [offs_row.shape[0], HEAD_DIM // 2, 2]))
        if HAS_TABLES:
            table = offs_row[:, None] * (HEAD_DIM // 2) + t[None, :]
            if BOUNDS or HALF_PAD != HEAD_DIM // 2:
                cos = tl.load(COS + table, mask=mask, other=0.0)
                sin = tl.load(SIN + table, mask=mask, other=0.0)
            else:
                cos = tl.load(COS + table)
                sin = tl.load(SIN + table)
            x1f = x1.to(tl.float32)
            x2f = x2.to(tl.float32)
            y1 = x1f * cos - x2f * sin
            y2 = x1f * sin + x2f * cos
            if HAS_GAIN:
                y1 = y1 * gain_first[None, :]
                y2 = y2 * gain_second[None, :]
            x1 = y1.to(x1.dtype)
            x2 = y2.to(x2.dtype)
    else:
        x1 = _load_rows(base, offs_row, row_valid, stride_s, stride_d, HEAD_DIM, BOUNDS)
        x2 = x1
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
    PAIR_HALVES: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
):
    """Store the gradient w.r.t. x (a contiguous ``[seq, HEAD_DIM]`` matrix) given the fp32
    gradient w.r.t. ``x'``: its pair halves ``dy1``, ``dy2`` with ``PAIR_HALVES``, the whole
    tile ``dy1`` without.

    The transpose of :func:`_load_encoded`: ``dx_1 = cos g_1 dy_1 + sin g_2 dy_2``,
    ``dx_2 = -sin g_1 dy_1 + cos g_2 dy_2`` (``g = 1`` without a gain).
    """
    if PAIR_HALVES:
        mask = row_valid[:, None] & pair_valid[None, :]
        if HAS_TABLES:
            if HAS_GAIN:
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
    else:
        ptrs = base + offs_row[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
        tl.store(ptrs, dy1.to(base.dtype.element_ty), mask=row_valid[:, None])


@triton.jit
def _pair_gains(GAIN, first, second, pair_valid, HAS_GAIN: tl.constexpr):
    """The gain of each pair's two channels (never loaded, and unused, without a gain)."""
    if HAS_GAIN:
        gain_1 = tl.load(GAIN + first, mask=pair_valid, other=0.0)
        gain_2 = tl.load(GAIN + second, mask=pair_valid, other=0.0)
    else:
        gain_1 = 1.0
        gain_2 = 1.0
    return gain_1, gain_2


@triton.jit
def _encode_kernel(
    X,
    Y,
    COS,
    SIN,
    GAIN,
    stride_xb,
    stride_xh,
    stride_xs,
    stride_xd,
    stride_tab_b,
    seq_len,
    num_heads,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``Y = g * R X`` for one block of rows of one (batch, head); X any strides, Y contiguous
    ``[batch, heads, seq, HEAD_DIM]`` of X's dtype."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // num_heads
    X += b * stride_xb + (bh % num_heads) * stride_xh
    Y += bh * seq_len * HEAD_DIM
    COS += b * stride_tab_b
    SIN += b * stride_tab_b
    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, HALF_LAYOUT)
    gain_1, gain_2 = _pair_gains(GAIN, first, second, pair_valid, HAS_GAIN)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_valid = rows < seq_len
    x1, x2 = _load_encoded(
        X, stride_xs, stride_xd, COS, SIN, rows, row_valid, t, pair_valid, first, second,
        gain_1, gain_2, HEAD_DIM, HALF_PAD, HALF_LAYOUT, True, True, HAS_GAIN, True,
    )  # fmt: skip
    mask = row_valid[:, None] & pair_valid[None, :]
    row_ptrs = Y + rows[:, None] * HEAD_DIM
    tl.store(row_ptrs + first[None, :], x1, mask=mask)
    tl.store(row_ptrs + second[None, :], x2, mask=mask)


@triton.jit
def _decode_kernel(
    DY,
    DX,
    COS,
    SIN,
    GAIN,
    stride_tab_b,
    seq_len,
    num_heads,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``DX = R^T (g * DY)`` for one block of rows of one (batch, head); DY float32 and DX
    contiguous ``[batch, heads, seq, HEAD_DIM]``."""
    bh = tl.program_id(1).to(tl.int64)
    b = bh // num_heads
    DY += bh * seq_len * HEAD_DIM
    DX += bh * seq_len * HEAD_DIM
    COS += b * stride_tab_b
    SIN += b * stride_tab_b
    t, pair_valid, first, second = _pair_channels(HEAD_DIM, HALF_PAD, HALF_LAYOUT)
    gain_1, gain_2 = _pair_gains(GAIN, first, second, pair_valid, HAS_GAIN)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_valid = rows < seq_len
    mask = row_valid[:, None] & pair_valid[None, :]
    row_ptrs = DY + rows[:, None] * HEAD_DIM
    dy1 = tl.load(row_ptrs + first[None, :], mask=mask, other=0.0)
    dy2 = tl.load(row_ptrs + second[None, :], mask=mask, other=0.0)
    _store_decoded(
        DX, dy1, dy2, COS, SIN, rows, row_valid, t, pair_valid, first, second, gain_1, gain_2,
        HEAD_DIM, True, True, HAS_GAIN,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _half_pad(head_dim: int) -> int:
    """Width of a pair-half tile: head_dim/2, padded to tl.dot's minimum of 16."""
    return max(head_dim // 2, 16)


def _pass(kernel, name: str, tensors: tuple, strides: tuple, a: LaunchArgs,
          shape: torch.Size) -> Launch:  # fmt: skip
    """One launch of the encode or decode kernel over every row of every (batch, head)."""
    batch, heads, seq, head_dim = shape
    grid = (triton.cdiv(seq, ROWS_PER_PROGRAM), batch * heads)
    return Launch(name, kernel, grid, (*tensors, a.gain, *strides, seq, heads), dict(
        HEAD_DIM=head_dim, HALF_PAD=_half_pad(head_dim), HALF_LAYOUT=a.half_layout,
        HAS_GAIN=a.has_gain, BLOCK=ROWS_PER_PROGRAM, num_warps=4,
    ))  # fmt: skip


def _table_args(x: torch.Tensor, qk_tables) -> LaunchArgs:
    """The tables (dense rows, dummies for what is absent) as the kernels read them."""
    positions = torch.zeros(1, x.shape[2], dtype=torch.float32, device=x.device)
    return prepare_launch(x, positions, None, qk_tables, None, None)


def encode_qk(q: torch.Tensor, k: torch.Tensor, qk_tables) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q', k')``: q and k ``[batch, heads, seq, head_dim]`` (any strides) through the checked
    ``qk_tables`` (keys through their own, if given), each a contiguous tensor of the input
    dtype. Two launches (``"encode_q"``, ``"encode_k"``): one read of each row and of its table
    row, one write. Tables of the wrong shape, dtype or device are refused with a ValueError or
    TypeError that says what they must be."""
    batch, _, seq, head_dim = q.shape
    _check_tables(qk_tables, batch, seq, head_dim, q.device)
    a = _table_args(q, qk_tables)
    out = []
    for name, x, cos, sin in (
        ("encode_q", q, a.cos, a.sin),
        ("encode_k", k, a.key_cos, a.key_sin),
    ):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        strides = (*x.stride(), a.stride_tab_b)
        run_launch(_pass(_encode_kernel, name, (x, y, cos, sin), strides, a, x.shape))
        out.append(y)
    return out[0], out[1]


def decode_qk_grads(
    dq: torch.Tensor, dk: torch.Tensor, qk_tables, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dL/dq, dL/dk)`` from the float32 gradients w.r.t. ``q'``, ``k'`` (contiguous ``[batch,
    heads, seq, head_dim]``), through the transpose of the checked ``qk_tables``; contiguous, in
    ``dtype``. Two launches (``"decode_q"``, ``"decode_k"``)."""
    a = _table_args(dq, qk_tables)
    out = []
    for name, dy, cos, sin in (
        ("decode_q", dq, a.cos, a.sin),
        ("decode_k", dk, a.key_cos, a.key_sin),
    ):
        dx = torch.empty(dy.shape, dtype=dtype, device=dy.device)
        run_launch(_pass(_decode_kernel, name, (dy, dx, cos, sin), (a.stride_tab_b,), a, dy.shape))
        out.append(dx)
    return out[0], out[1]
