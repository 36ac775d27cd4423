"""Stick-breaking attention (forward and backward), in log space; positions come from the caller.

Tensors q, k, v are ``[batch, heads, seq, head_dim]`` (any strides, see :mod:`.common` for the
layout convention); ``positions`` is float32 ``[1 or batch, seq]`` (each sequence counted from its
smallest position, exact integers); ``key_mask`` is
``[batch, seq]`` (nonzero = real token) or absent.

The function (Tan et al. 2024, "Scaling Stick-Breaking Attention"), for one (batch, head)::

    z_ij   = scale * q'_i . k'_j  +  b_ij                         (b: a score-bias hook, or 0)
    beta   = sigmoid(z)
    A_ij   = beta_ij * prod_{allowed l strictly between j and i} (1 - beta_il)
    out_i  = sum_j A_ij v_j + (1 - sum_j A_ij) v_i                (leftover stick: own value)

Key ``j`` is allowed for query ``i`` iff it is a real token and, causal, ``j < i`` (by index).
Bidirectional: one stick over the keys left of ``i`` and one over the keys right of it, each broken
from the nearest key outward and each worth half: ``A_ij = 1/2 * beta_ij * prod(...)``.
``q'``, ``k'`` are q and k through the caller's per-token tables, if any (else ``q' = q``),
applied once per call before the loops and mapped back once on the gradients
(:mod:`.qk_transform`, shared with the flash kernels): the loops never see the tables. The
bias ``b_ij`` is a hook object of :mod:`.score_bias` whose function is passed in as the
constexpr ``BIAS_FN`` (RSE: the linear distance hook, ``b_ij = -lambda_h |p_i - p_j|``).

Everything is in log space, base 2 (``log2(1 - beta) = -softplus(z) log2(e)``; below, ``sp`` is
``softplus(z) log2(e)``, clamped at ``CLAMP``)::

    log2 A_ij = log2 sigmoid(z_ij) - sum_{allowed l between} sp_il   (- 1 bidirectional)

so logits of any finite magnitude give finite weights and gradients, and an infinite logit (a key
with an infinite entry) the weights of its limit, as the reference gives: ``+inf`` takes the
rest of the stick, ``-inf`` nothing. One tile computes ``z`` with
``tl.dot``, ``e = 2^-|z|`` and ``log2(1 + e)`` (two special-function instructions; for 16-bit
inputs half of the logs are a polynomial on the FMA units instead, :func:`_log2_1p`, which
balances the two kinds of unit), ``sp = max(z, 0) + log2(1 + e)`` and ``log2 beta = min(z, 0) -
log2(1 + e)``.
The sums of ``sp`` over the nearer keys of its own block are a product with a constant
triangular matrix of ones on the tensor cores (:func:`_key_sum`: float32 values split into two
float16 terms, about 22 bits, for float32 inputs; one float16 term, 11 bits, for 16-bit ones),
accumulated onto ``log2 beta`` minus the row's carry. A second exponential gives ``A``. Key blocks
are visited in one loop per stick without any mask (padded and masked keys get a logit of ``NEG``
through a per-key bias, which gives them ``sp = 0`` and ``A = 0``); the blocks that straddle the
diagonal are peeled off the loop and masked. (The backward kernels on mma.sync GPUs sum with
``tl.cumsum`` instead: there both operands of a product sit in registers, and the constant
triangles would take too many.)

Forward, per query block: key blocks from the nearest to the farthest, carrying per row the sum
``S`` of ``sp`` over the blocks passed (``-log2`` of what is left of the stick), kept as a
float32 pair (``hi + lo``, :func:`_two_sum`). The weights of a stick telescope, ``sum_j A_ij =
1 - prod_j (1 - beta_ij) = 1 - 2^-S``, so the leftover that goes to the own value is ``2^-S``
(the mean over both sticks, bidirectional), from the carry alone. It stores ``out`` and, per
stick, ``S`` over all the keys (``rowstats``, float32 ``[batch, heads, 2 sides, seq]``).

Backward. With ``g_ij = dO_i . (v_j - v_i)`` (``out_i = v_i + sum_j A_ij (v_j - v_i)``) and
``G_ij = A_ij g_ij``::

    dz_il = G_il (1 - beta_il) - beta_il * F_il,   F_il = sum_{allowed j farther than l} G_ij
    dq'_i = scale sum_l dz_il k'_l        dk'_l = scale sum_i dz_il q'_i
    dv_j  = sum_i A_ij dO_i  +  (1 - sum_l A_jl) dO_j          (1 - sum_l A_jl: from rowstats)
    dtheta = sum_il dz_il d b_il / d theta           (a learnable bias tensor theta, e.g. lambda)

Both kernels visit the keys of a row from the farthest to the nearest, where ``F`` is a running
sum: a carry per row plus, inside a block, a second triangular product. The ``-log2`` stick of a
block's near edge is ``S`` (from the forward) minus the block sums passed so far, subtracted as a
float32 pair, so it keeps the precision of a direct sum (the block sums are the forward's own
where both use the same tiles and warps, as on Hopper and in the interpreter; elsewhere they may
differ by their rounding, about ``1e-7 S`` over a row). ``G`` is brought into float16 range by
a power of two ``s`` per (batch, head) (:func:`_g_scale`: ``|G_ij|``, and ``|F_il|`` as ``sum_j
A_ij <= 1``, are at most ``2 |dO_i|_1 max|v|``; ``s`` brings the largest such bound of the head
to at most ``2^14``, so ``|s dz| <= 2^15``); the kernels work with ``s G``, ``s F`` and ``s dz``
and divide the finished ``dq'``, ``dk'`` and ``dtheta`` by ``s``.

* Row kernel (one program per query block): one pass over its key blocks, accumulating ``dq'``;
  after each block but the nearest, it stores a checkpoint per row on the boundary between that
  block and the next nearer one: the ``-log2`` stick there and ``s F`` there (``G`` summed over
  the keys beyond it). It also stores ``delta_i = dO_i . v_i``.
* Column kernel (one program per key block): walks the query blocks; the checkpoints on the two
  edges of its block give every tile its offsets (at the near edge of a stick's nearest block
  the ``-log2`` stick is 0, at the far edge of its farthest block ``F`` is 0: no checkpoint
  there), so each tile is exact on its own. It accumulates ``dk'``, ``dv`` and, through the
  hook's ``BIAS_GRAD_FN``, its partial sums of ``dtheta`` (reduced with torch after the launch).

Why checkpoints: a program that owns a key block cannot know the ``-log`` stick of a tile (it
depends on every key between that block and the query) without them; recomputing it would cost
O(seq^3). Deterministic, no atomics. The checkpoints exist only on the boundaries between two
key blocks that a stick of a query block visits (:func:`_boundaries`): two values per row and
boundary, about ``sides * seq * ceil(seq / BLOCK_N)`` of them per (batch, head) (a triangle per
stick), in float32 for float32 inputs and float16 for 16-bit ones. ``A`` is recomputed from q
and k, never stored. ``dq'`` and ``dk'`` are mapped back through the transform (its transpose)
in registers; the gradients are stored in the input dtype.

Precision: the ``-log2`` stick of a key is the exact carry of the blocks nearer to the query plus
the in-block sum, which loses about ``2^-22`` of the summed values (so ``A_ij`` has a relative
error of about ``1e-6 * |log2 A_ij|`` in fp32, nothing at ordinary logits), and ``log2 beta``
loses ``eps |z|`` (still finite, and within 1e-2, at ``|z| = 1e4``). With 16-bit inputs the
in-block sums (``2^-12`` of each term), the polynomial logs (within ``2.3e-6``, the same
elements in every kernel) and the float16 checkpoints (``2^-12``) stay below the rounding of the
16-bit tiles fed to the products (tested: float16 inputs stay within 2e-3 of a float64
reference, outputs and gradients). Padded queries are computed like any other row (the mask
removes keys only).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    BF16_MIN_ARCH,
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
from .fast_math import LOG2E, fast_log2
from .limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS, MAX_BATCH_HEADS
from .qk_transform import (
    _load_encoded,
    _load_rows,
    _pair_channels,
    _store_decoded,
    decode_qk_grads,
    encode_qk,
)
from .score_bias import DIAGONAL_KEY_PAD, GradTiles, tile_slot, tile_slot_count

__all__ = [
    "KERNEL_DTYPES",
    "KERNEL_HEAD_DIMS",
    "MAX_BATCH_HEADS",
    "StickConfig",
    "pick_config",
    "stick_breaking_backward",
    "stick_breaking_forward",
]

# sp (softplus(z) * log2(e)) is clamped here before it is summed: a stick with this much broken
# off leaves 2^-16384 = 0 for every key behind it anyway, and a clamped value is a float16.
CLAMP: tl.constexpr = tl.constexpr(16384.0)
# The base-2 logit of a padded or masked key (sp = 0, A = 0, beta = 0; finite, so no inf - inf).
NEG: tl.constexpr = tl.constexpr(-1.0e30)
# G is scaled by a power of two per (batch, head) so that |s G| <= 2^G_RANGE (float16 holds up
# to 65504).
G_RANGE = 14
# Row statistics of the forward (rows of ``rowstats``): ``(S_hi, S_lo)`` of the left stick and,
# bidirectional, of the right one.
_STATS_LEFT: tl.constexpr = tl.constexpr(0)
_STATS_RIGHT: tl.constexpr = tl.constexpr(2)


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
def _split_gain(gain, HEAD_DIM: tl.constexpr, HALF_LAYOUT: tl.constexpr, HAS_GAIN: tl.constexpr):
    """The per-channel gain ``[HEAD_DIM]`` as the gains of each pair's two channels
    (``[HEAD_DIM/2]`` each; 1.0 without a gain), as :func:`.flash._load_encoded` takes them."""
    if HAS_GAIN:
        g1, g2 = _pair_halves(tl.reshape(gain, [1, HEAD_DIM]), HEAD_DIM, HALF_LAYOUT)
        gain_1 = tl.reshape(g1, [HEAD_DIM // 2])
        gain_2 = tl.reshape(g2, [HEAD_DIM // 2])
    else:
        gain_1 = 1.0
        gain_2 = 1.0
    return gain_1, gain_2


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
    """A ``[rows, HEAD_DIM]`` tile in its input dtype (rows past the end read as 0; ``row_ok``
    None: every row is in bounds, no mask), through the tables if ``HAS_TABLES``.

    ``x' = g * (R x)`` is the flash kernels' own :func:`.flash._load_encoded` (one transform for
    both families), which returns the pair halves ``x'_1``, ``x'_2``; they are joined back here,
    as the stick-breaking kernels take a whole tile.
    """
    if HAS_TABLES:
        t, pair_valid, first, second = _pair_channels(HEAD_DIM, HEAD_DIM // 2, HALF_LAYOUT)
        gain_1, gain_2 = _split_gain(gain, HEAD_DIM, HALF_LAYOUT, HAS_GAIN)
        if row_ok is None:
            x1, x2 = _load_encoded(
                base, stride_s, stride_d, cos_base, sin_base, rows, rows, t, pair_valid, first,
                second, gain_1, gain_2, HEAD_DIM, HEAD_DIM // 2, HALF_LAYOUT, True, True,
                HAS_GAIN, False,
            )  # fmt: skip
        else:
            x1, x2 = _load_encoded(
                base, stride_s, stride_d, cos_base, sin_base, rows, row_ok, t, pair_valid, first,
                second, gain_1, gain_2, HEAD_DIM, HEAD_DIM // 2, HALF_LAYOUT, True, True,
                HAS_GAIN, True,
            )  # fmt: skip
        x = _join_halves(x1, x2, HEAD_DIM, HALF_LAYOUT)
    elif row_ok is None:
        x = _load_rows(base, rows, rows, stride_s, stride_d, HEAD_DIM, False)
    else:
        x = _load_rows(base, rows, row_ok, stride_s, stride_d, HEAD_DIM, True)
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
    """Store a float32 gradient w.r.t. ``x'`` as one w.r.t. ``x`` into a contiguous ``[seq, D]``
    (of ``base``'s dtype): ``dx = R(p)^T (g * dx')``, the flash kernels' own
    :func:`.flash._store_decoded` on the gradient's pair halves."""
    if HAS_TABLES:
        t, pair_valid, first, second = _pair_channels(HEAD_DIM, HEAD_DIM // 2, HALF_LAYOUT)
        gain_1, gain_2 = _split_gain(gain, HEAD_DIM, HALF_LAYOUT, HAS_GAIN)
        dy1, dy2 = _pair_halves(grad, HEAD_DIM, HALF_LAYOUT)
        _store_decoded(
            base, dy1, dy2, cos_base, sin_base, rows, row_ok, t, pair_valid, first, second,
            gain_1, gain_2, HEAD_DIM, True, True, HAS_GAIN,
        )  # fmt: skip
    else:
        d = tl.arange(0, HEAD_DIM)
        tl.store(
            base + rows[:, None] * HEAD_DIM + d[None, :], grad.to(base.dtype.element_ty),
            mask=row_ok[:, None],
        )  # fmt: skip


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
    POS_AFFINE: tl.constexpr = False,
):
    """Key block ``kb``: indices, real-key flags, the per-key logit bias (0 for a real key,
    ``NEG`` for a padded or masked one), positions (read only for a score bias), ``k'`` and ``v``
    (input dtype; the keys past the end hold the last key's, with a weight of 0)."""
    cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < seq_len
    key_ok = col_in
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_base + cols, mask=col_in, other=0) != 0)
    kbias = tl.where(key_ok, 0.0, NEG)
    pos_j = _row_positions(pos_base, cols, col_in, BLOCK_N, BIAS_FN, POS_AFFINE=POS_AFFINE)
    # keys past the end read the last one's k and v (their A is 0): no masks on these loads
    inside = tl.minimum(cols, seq_len - 1)
    k = _load_rotated(
        k_base, inside, None, stride_ks, stride_kd, cos_base, sin_base, HALF_LAYOUT, gain,
        HEAD_DIM, HAS_TABLES, HAS_GAIN,
    ).to(k_base.dtype.element_ty)  # fmt: skip
    d = tl.arange(0, HEAD_DIM)
    v = tl.load(v_base + inside[:, None] * stride_vs + d[None, :] * stride_vd)
    return cols, key_ok, kbias, pos_j, k, v


@triton.jit
def _channel_gain(gain_ptr, HEAD_DIM: tl.constexpr, HAS_GAIN: tl.constexpr):
    """The per-channel gain ``[HEAD_DIM]`` (never loaded, and unused, without a gain)."""
    if HAS_GAIN:
        gain = tl.load(gain_ptr + tl.arange(0, HEAD_DIM))
    else:
        gain = 1.0
    return gain


@triton.jit
def _row_positions(
    pos_base, rows, row_ok, ROWS: tl.constexpr, BIAS_FN: tl.constexpr,
    POS_AFFINE: tl.constexpr = False,
):  # fmt: skip
    """The positions of ``rows`` (float32), only when a score bias needs them. ``pos_base``:
    this sequence's positions, read; with ``POS_AFFINE``, their ``(p_0, step)`` instead
    (:func:`_positions_source`), and ``p_0 + step * row`` is computed (exact integers in
    float32; rows past the end get positions past the last, and their pairs are masked)."""
    if BIAS_FN is None:
        pos = tl.zeros([ROWS], dtype=tl.float32)
    elif POS_AFFINE:
        pos = pos_base[0] + pos_base[1] * rows.to(tl.float32)
    else:
        pos = tl.load(pos_base + rows, mask=row_ok, other=0.0)
    return pos


@triton.jit
def _positions_source(pos_base, seq_len, POS_AFFINE: tl.constexpr):
    """What :func:`_row_positions` reads positions from: the pointer, or with ``POS_AFFINE`` the
    sequence's ``(p_0, step)``, read here once per program (``common.position_line``; the
    row kernel's loop stores checkpoints, which keeps the compiler from hoisting a load per
    tile out of it: RSE's penalty at head_dim 64 on sm_90, 6 memory instructions per
    iteration)."""
    if POS_AFFINE:
        source = position_line(pos_base, seq_len, POS_AFFINE)
    else:
        source = pos_base
    return source


@triton.jit
def _tri_matrix(
    BLOCK_N: tl.constexpr, LEFT: tl.constexpr, NEARER: tl.constexpr, SIGN: tl.constexpr
):
    """``T [BLOCK_N, BLOCK_N]`` float16 with ``T[j, l] = SIGN`` where key ``j`` of a block is
    nearer to the queries of the stick than key ``l`` (``NEARER``) or farther from them, else 0:
    ``x @ T`` sums each row of ``x`` over the nearer (farther) keys of every column. Built once,
    before a loop, so it stays in shared memory."""
    j = tl.arange(0, BLOCK_N)
    if LEFT == NEARER:  # left stick, nearer keys; right stick, farther keys: higher indices
        pick = j[:, None] > j[None, :]
    else:
        pick = j[:, None] < j[None, :]
    return tl.where(pick, SIGN, 0.0).to(tl.float16)


@triton.jit
def _key_sum(
    x,
    tri,
    acc,
    LEFT: tl.constexpr,
    NEARER: tl.constexpr,
    SIGN: tl.constexpr,
    TWO_TERMS: tl.constexpr,
):
    """``acc + SIGN * (x summed, in each column l, over the keys of the block nearer to the
    queries than l (``NEARER``) or farther from them)``, for a float32 tile ``x``.

    With ``tri`` (:func:`_tri_matrix`, for ``|x| <= 2^14``): ``acc + x @ tri`` on the tensor
    cores, the products exact as ``tri`` holds 0 and +-1. ``TWO_TERMS``: ``x`` is split into two
    float16 terms (``x = hi + lo`` to about 22 bits, for float32 inputs); else it is rounded to
    one float16 (11 bits, for 16-bit inputs, whose tiles are rounded to 8 or 11 bits anyway). The
    products accumulate in float32. ``tri`` None: a float32 ``tl.cumsum`` (more instructions,
    no constant operand held in registers: the choice for mma.sync GPUs)."""
    if tri is None:
        out = acc + SIGN * (tl.cumsum(x, axis=1, reverse=LEFT == NEARER) - x)
    else:
        hi = x.to(tl.float16)
        if TWO_TERMS:
            acc = tl.dot((x - hi.to(tl.float32)).to(tl.float16), tri, acc=acc)
        out = tl.dot(hi, tri, acc=acc)
    return out


@triton.jit
def _two_sum(hi, lo, x):
    """``(hi, lo) + x`` as a float32 pair: ``hi`` the rounded sum, ``lo`` the running sum of
    the rounding errors (Knuth's TwoSum, exact in IEEE arithmetic)."""
    s = hi + x
    b = s - hi
    return s, lo + ((hi - (s - b)) + (x - b))


@triton.jit
def _log2_1p(e):
    """``log2(1 + e)`` for ``e`` in ``[0, 1]`` on the FMA units: a degree-6 polynomial (fitted
    to minimise the largest error, about 2.2e-6 in float32) instead of the special-function
    unit's ``lg2``. That unit computes every exponential of a tile (two per element in the
    forward, three in the backward); taking half of the logs off it balances it with the FMA
    units. For 16-bit inputs."""
    p = e * -0.026456686 + 0.123449239
    p = p * e - 0.279535676
    p = p * e + 0.458269579
    p = p * e - 0.718281651
    p = p * e + 1.442553126
    return p * e


@triton.jit
def _log2_1p_exp2(x, HALF_POLY: tl.constexpr):
    """``log2(1 + 2^-|x|)`` of a float32 tile: the approximate ``lg2`` of ``1 + e`` (its
    argument in ``[1, 2]``); if ``HALF_POLY``, the polynomial :func:`_log2_1p` of ``e`` for the
    odd columns instead. The forward and both backward kernels make the same choice for the
    same (query, key) pair, so that their sums of ``sp`` agree."""
    if HALF_POLY:
        rows: tl.constexpr = x.shape[0]
        cols: tl.constexpr = x.shape[1]
        x_mufu, x_fma = tl.split(tl.reshape(x, [rows, cols // 2, 2]))
        out = tl.reshape(
            tl.join(fast_log2(1.0 + tl.exp2(-tl.abs(x_mufu))), _log2_1p(tl.exp2(-tl.abs(x_fma)))),
            [rows, cols],
        )
    else:
        out = fast_log2(1.0 + tl.exp2(-tl.abs(x)))
    return out


@triton.jit
def _tile_logs(
    q,
    k,
    rows,
    cols,
    row_ok,
    key_ok,
    kbias,
    pos_i,
    pos_j,
    scale2,
    bias_params,
    seq_len,
    LEFT: tl.constexpr,
    MASKED: tl.constexpr,
    BIAS_FN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One ``[rows, cols]`` tile of one stick in base 2: ``sp = min(softplus(z) log2 e,
    CLAMP)`` and ``lb = log2 sigmoid(z)``. Keys with the bias ``NEG`` get ``sp = 0`` and
    ``lb = NEG``; ``MASKED`` (the tiles on the diagonal) also gives those to the keys on the
    other side of the query (and to padded queries)."""
    # z2 = z * log2(e); the per-key bias fuses into the scaling (one FFMA)
    z2 = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale2 + kbias[None, :]
    if BIAS_FN is not None:  # the score-bias hook (queries clamped; keys past the end: NEG)
        z2 += BIAS_FN(
            tl.minimum(rows, seq_len - 1)[:, None], cols[None, :],
            pos_i[:, None], pos_j[None, :], bias_params, True,
        )  # fmt: skip
    # softplus(z) = max(z, 0) + log(1 + e^-|z|); logsigmoid(z) = min(z, 0) - log(1 + e^-|z|);
    # here times log2(e). 16-bit inputs: half of the logs on the FMA units (see _log2_1p).
    log1p_exp = _log2_1p_exp2(z2, k.dtype != tl.float32)
    sp = tl.minimum(tl.maximum(z2, 0.0) + log1p_exp, CLAMP)
    # min(z, 0) - log(1 + e^-|z|) directly (not z - sp): exact, and 0 at z = +inf (an infinite
    # key), where z - sp would be inf - inf
    log_beta = tl.minimum(z2, 0.0) - log1p_exp
    if MASKED:
        if LEFT:
            side = cols[None, :] < rows[:, None]
        else:
            side = cols[None, :] > rows[:, None]
        allowed = side & row_ok[:, None] & key_ok[None, :]
        sp = tl.where(allowed, sp, 0.0)
        log_beta = tl.where(allowed, log_beta, NEG)
    return sp, log_beta


@triton.jit
def _before(kb, R: tl.constexpr):
    """``sum_{kb' < kb} kb' // R``."""
    qb = kb // R
    return R * qb * (qb - 1) // 2 + (kb % R) * qb


@triton.jit
def _boundaries(kb, m, num_m, num_kb, R: tl.constexpr, LEFT: tl.constexpr):
    """The checkpoint slots at the near and the far edge of key block ``kb`` for query block
    ``m`` (``R`` key blocks tall), and whether each exists: ``(near, has_near, far, has_far)``.

    Checkpoints sit on the boundaries between two consecutive key blocks that a stick visits;
    boundary ``b`` lies between key blocks ``b`` and ``b + 1``. The left stick of ``m`` visits
    key blocks ``0 .. last`` (``last = min(m R + R - 1, num_kb - 1)``), the right one ``m R ..
    num_kb - 1``. There is none at the near edge of the nearest block (where the ``-log2``
    stick is 0) nor at the far edge of the farthest (where ``F`` is 0). Slots are numbered
    boundary by boundary over the query blocks that visit it, so only visited pairs have one."""
    if LEFT:
        near = kb  # the boundary between kb and kb + 1
        has_near = kb < tl.minimum(m * R + R - 1, num_kb - 1)
        far = kb - 1
        has_far = kb > 0
    else:
        near = kb - 1
        has_near = kb > m * R
        far = kb
        has_far = kb < num_kb - 1
    return _slot(near, m, num_m, R, LEFT), has_near, _slot(far, m, num_m, R, LEFT), has_far


@triton.jit
def _all_or_none(ROWS: tl.constexpr, flag):
    """A ``[ROWS]`` mask, all true if the scalar ``flag`` is, else all false."""
    return tl.arange(0, ROWS) < tl.where(flag, ROWS, 0)


@triton.jit
def _slot(b, m, num_m, R: tl.constexpr, LEFT: tl.constexpr):
    """The slot of boundary ``b`` for query block ``m`` (see :func:`_boundaries`). Left stick:
    boundary ``b`` is visited by the query blocks ``m >= (b + 1) // R``; right stick: by
    ``m <= b // R``."""
    if LEFT:
        slot = b * num_m - _before(b + 1, R) + m - (b + 1) // R
    else:
        slot = _before(b, R) + b + m
    return slot.to(tl.int64)


def _num_slots(num_m: int, num_kb: int, r: int, left: bool) -> int:
    """The number of checkpoint slots of one stick (see :func:`_slot`)."""

    def before(kb: int) -> int:
        qb = kb // r
        return r * qb * (qb - 1) // 2 + (kb % r) * qb

    if num_kb < 2:
        return 0
    return (num_kb - 1) * num_m - before(num_kb) if left else before(num_kb - 1) + num_kb - 1


@triton.jit
def _stats_base(stats_ptr, bh, seq_len, CAUSAL: tl.constexpr):
    """This (batch, head)'s rows of ``rowstats``: ``(S_hi, S_lo)`` per stick, ``seq_len`` each."""
    if CAUSAL:
        n_stats = 2
    else:
        n_stats = 4
    return stats_ptr + bh * n_stats * seq_len


@triton.jit
def _stick_total(base, rows, row_ok, seq_len):
    """A stick's ``S = S_hi + S_lo`` of ``rows``, from its two rows of ``rowstats``."""
    return tl.load(base + rows, mask=row_ok, other=0.0) + tl.load(
        base + seq_len + rows, mask=row_ok, other=0.0
    )


@triton.jit
def _leftover(s_left, s_right, CAUSAL: tl.constexpr):
    """``1 - sum_j A_ij`` from the sticks' totals ``S`` (``-log2`` of what is left of each):
    ``2^-S`` causal, the mean over both sticks bidirectional (``s_right`` unused if causal).
    The weights of a stick telescope, ``sum_j A_ij = 1 - prod_j (1 - beta_ij)``."""
    left = tl.exp2(-s_left)
    if not CAUSAL:
        left = 0.5 * (left + tl.exp2(-s_right))
    return left


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _forward_tile(
    acc,
    s_hi,
    s_lo,
    q,
    rows,
    row_ok,
    pos_i,
    kb,
    near,
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
    scale2,
    bias_params,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    POS_AFFINE: tl.constexpr = False,
):
    """Key block ``kb`` of one stick: add its ``A v`` to ``acc`` and its ``sp`` to the row's
    carry ``(s_hi, s_lo)``."""
    cols, key_ok, kbias, pos_j, k, v = _load_keys(
        kb, k_base, v_base, mask_base, pos_base, cos_base, sin_base, stride_ks, stride_kd,
        stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, HEAD_DIM, BLOCK_N, HAS_MASK,
        HAS_TABLES, HAS_GAIN, BIAS_FN,
        POS_AFFINE=POS_AFFINE,
    )  # fmt: skip
    sp, log_beta = _tile_logs(
        q, k, rows, cols, row_ok, key_ok, kbias, pos_i, pos_j, scale2, bias_params, seq_len, LEFT,
        MASKED, BIAS_FN, DOT_PRECISION,
    )  # fmt: skip
    stick = s_hi + s_lo
    if not CAUSAL:
        stick += 1.0  # log2(2): each stick holds half of the mass
    # log2 A = log2 beta - (carry) - (sp of the nearer keys of this block)
    a = tl.exp2(
        _key_sum(sp, near, log_beta - stick[:, None], LEFT, True, -1.0, k.dtype == tl.float32)
    )
    acc += tl.dot(a.to(v.dtype), v, input_precision=DOT_PRECISION)
    s_hi, s_lo = _two_sum(s_hi, s_lo, tl.sum(sp, axis=1))
    return acc, s_hi, s_lo


@triton.jit
def _forward_one_stick(
    acc,
    q,
    rows,
    row_ok,
    pos_i,
    pid_m,
    stats_base,
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
    scale2,
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
    MMA_SCAN: tl.constexpr,
    POS_AFFINE: tl.constexpr = False,
):
    """Add one stick's ``sum_j A_ij v_j`` to ``acc``; store the stick's total ``S`` (a float32
    pair) at ``stats_base`` and return it (``hi + lo``)."""
    num_kb = tl.cdiv(seq_len, BLOCK_N)
    R: tl.constexpr = BLOCK_M // BLOCK_N
    band = pid_m * R  # the first of the R key blocks beside these queries
    near = None  # without MMA_SCAN: tl.cumsum (see _key_sum)
    if MMA_SCAN:
        near = _tri_matrix(BLOCK_N, LEFT, True, -1.0)
    s_hi = tl.zeros([BLOCK_M], dtype=tl.float32)
    s_lo = tl.zeros([BLOCK_M], dtype=tl.float32)
    # The key blocks beside the queries first (masked), nearest first.
    for t in tl.static_range(R):
        if LEFT:
            kb = band + (R - 1 - t)
        else:
            kb = band + t
        if kb < num_kb:
            acc, s_hi, s_lo = _forward_tile(
                acc, s_hi, s_lo, q, rows, row_ok, pos_i, kb, near, k_base, v_base,
                pos_base, mask_base, cos_base, sin_base, stride_ks, stride_kd, stride_vs,
                stride_vd, HALF_LAYOUT, gain, seq_len, scale2, bias_params, HEAD_DIM, BLOCK_N,
                LEFT, CAUSAL, True, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN, DOT_PRECISION,
                POS_AFFINE=POS_AFFINE,
            )  # fmt: skip
    # Then every other key block of the stick, nearest first, unmasked.
    if LEFT:
        count = band
    else:
        count = num_kb - band - R
    for step in range(count):
        if LEFT:
            kb = band - 1 - step
        else:
            kb = band + R + step
        acc, s_hi, s_lo = _forward_tile(
            acc, s_hi, s_lo, q, rows, row_ok, pos_i, kb, near, k_base, v_base, pos_base,
            mask_base, cos_base, sin_base, stride_ks, stride_kd, stride_vs, stride_vd,
            HALF_LAYOUT, gain, seq_len, scale2, bias_params, HEAD_DIM, BLOCK_N, LEFT, CAUSAL,
            False, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN, DOT_PRECISION,
            POS_AFFINE=POS_AFFINE,
        )  # fmt: skip
    tl.store(stats_base + rows, s_hi, mask=row_ok)
    tl.store(stats_base + seq_len + rows, s_lo, mask=row_ok)
    return acc, s_hi + s_lo


@triton.jit
def _stick_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    stats_ptr,
    pos_ptr,
    mask_ptr,
    cos_ptr,
    sin_ptr,
    kcos_ptr,
    ksin_ptr,
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
    MMA_SCAN: tl.constexpr,
    POS_AFFINE: tl.constexpr = False,
):
    (
        pid_m, bh, q_base, k_base, v_base, out_base, pos_base, mask_base, cos_base, sin_base,
        kcos_base, ksin_base, bias,
    ) = _program_setup(
        q_ptr, k_ptr, v_ptr, out_ptr, pos_ptr, mask_ptr, cos_ptr, sin_ptr, kcos_ptr, ksin_ptr,
        bias_ptr, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh,
        stride_pos_b, stride_tab_b, stride_bias_b, stride_bias_h, num_heads, seq_len, CAUSAL,
    )  # fmt: skip
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_len
    d = tl.arange(0, HEAD_DIM)
    gain = _channel_gain(gain_ptr, HEAD_DIM, HAS_GAIN)
    pos_base = _positions_source(pos_base, seq_len, POS_AFFINE)
    pos_i = _row_positions(pos_base, rows, row_ok, BLOCK_M, BIAS_FN, POS_AFFINE=POS_AFFINE)
    q = _load_rotated(
        q_base, rows, row_ok, stride_qs, stride_qd, cos_base, sin_base, HALF_LAYOUT,
        gain, HEAD_DIM, HAS_TABLES, HAS_GAIN,
    ).to(q_ptr.dtype.element_ty)  # fmt: skip
    scale2 = scale * LOG2E
    stats_base = _stats_base(stats_ptr, bh, seq_len, CAUSAL)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, s_left = _forward_one_stick(
        acc, q, rows, row_ok, pos_i, pid_m, stats_base + _STATS_LEFT * seq_len, k_base,
        v_base, pos_base, mask_base, kcos_base, ksin_base, stride_ks, stride_kd, stride_vs,
        stride_vd, HALF_LAYOUT, gain, seq_len, scale2, bias, HEAD_DIM, BLOCK_M, BLOCK_N, True,
        CAUSAL, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN, DOT_PRECISION, MMA_SCAN,
        POS_AFFINE=POS_AFFINE,
    )  # fmt: skip
    s_right = s_left  # unused when causal
    if not CAUSAL:
        acc, s_right = _forward_one_stick(
            acc, q, rows, row_ok, pos_i, pid_m, stats_base + _STATS_RIGHT * seq_len,
            k_base, v_base, pos_base, mask_base, kcos_base, ksin_base, stride_ks, stride_kd,
            stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, scale2, bias, HEAD_DIM, BLOCK_M,
            BLOCK_N, False, CAUSAL, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN, DOT_PRECISION,
            MMA_SCAN,
            POS_AFFINE=POS_AFFINE,
        )  # fmt: skip

    v_own = tl.load(
        v_base + rows[:, None] * stride_vs + d[None, :] * stride_vd, mask=row_ok[:, None], other=0.0
    ).to(tl.float32)
    # the leftover stick (1 - sum_j A_ij) goes to the own value
    out = acc + _leftover(s_left, s_right, CAUSAL)[:, None] * v_own
    out_ptrs = out_base + rows[:, None] * HEAD_DIM + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# --------------------------------------------------------------------------------------------
# Backward: row kernel (checkpoints, dq)
# --------------------------------------------------------------------------------------------


@triton.jit
def _tile_grads(
    sp,
    log_beta,
    edge,
    f_s,
    do,
    v,
    s,
    delta_s,
    near,
    far,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """The backward of one tile from its logs (:func:`_tile_logs`) and its offsets per row:
    ``edge``, the ``-log2`` stick at the block's near edge, and ``f_s``, ``s F`` at its far edge
    (``s``: the scale of G, ``delta_s = s dO_i . v_i``). Returns ``A``, ``s G`` and ``s dz``."""
    two_terms: tl.constexpr = v.dtype == tl.float32
    if not CAUSAL:
        edge += 1.0  # log2(2): each stick holds half of the mass
    a = tl.exp2(_key_sum(sp, near, log_beta - edge[:, None], LEFT, True, -1.0, two_terms))
    g_s = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION) * s - delta_s[:, None]
    ga = a * g_s  # s G
    # s (G + F): F is G summed over the farther keys (the carry, then this block's)
    gf = _key_sum(ga, far, ga + f_s[:, None], LEFT, False, 1.0, two_terms)
    dz = ga - tl.exp2(log_beta) * gf  # s dz = s (G (1 - beta) - beta F)
    return a, ga, dz


@triton.jit
def _rows_tile(
    dq,
    n_hi,
    n_lo,
    f_s,
    q,
    do,
    s,
    delta_s,
    rows,
    row_ok,
    pos_i,
    kb,
    pid_m,
    num_m,
    num_kb,
    near,
    far,
    ckpt_r_base,
    ckpt_f_base,
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
    scale2,
    bias_params,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    POS_AFFINE: tl.constexpr = False,
):
    """Key block ``kb`` of one stick, visited farthest first: add ``s dz k'`` to ``dq``, store
    the checkpoints at its near edge. ``(n_hi, n_lo)``: ``S`` minus the blocks already visited
    (the ``-log2`` stick at this block's far edge); ``f_s``: ``s F`` at its far edge."""
    cols, key_ok, kbias, pos_j, k, v = _load_keys(
        kb, k_base, v_base, mask_base, pos_base, cos_base, sin_base, stride_ks, stride_kd,
        stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, HEAD_DIM, BLOCK_N, HAS_MASK,
        HAS_TABLES, HAS_GAIN, BIAS_FN,
        POS_AFFINE=POS_AFFINE,
    )  # fmt: skip
    sp, log_beta = _tile_logs(
        q, k, rows, cols, row_ok, key_ok, kbias, pos_i, pos_j, scale2, bias_params, seq_len, LEFT,
        MASKED, BIAS_FN, DOT_PRECISION,
    )  # fmt: skip
    n_hi, n_lo = _two_sum(n_hi, n_lo, -tl.sum(sp, axis=1))
    edge = tl.where(row_ok, n_hi + n_lo, 0.0)  # -log2 stick at the near edge of this block
    a, ga, dz = _tile_grads(
        sp, log_beta, edge, f_s, do, v, s, delta_s, near, far, LEFT, CAUSAL, DOT_PRECISION
    )
    dq += tl.dot(dz.to(k.dtype), k, input_precision=DOT_PRECISION)
    f_s += tl.sum(ga, axis=1)
    slot, has_near, _, _ = _boundaries(kb, pid_m, num_m, num_kb, BLOCK_M // BLOCK_N, LEFT)
    at = slot * BLOCK_M + tl.arange(0, BLOCK_M)
    keep = _all_or_none(BLOCK_M, has_near)  # padded rows too: the slot is read whole
    tl.store(ckpt_r_base + at, edge.to(ckpt_r_base.dtype.element_ty), mask=keep)
    tl.store(ckpt_f_base + at, f_s.to(ckpt_f_base.dtype.element_ty), mask=keep)
    return dq, n_hi, n_lo, f_s


@triton.jit
def _backward_rows_one_stick(
    dq,
    q,
    do,
    s,
    delta_s,
    rows,
    row_ok,
    pos_i,
    pid_m,
    stats_base,
    ckpt_r_base,
    ckpt_f_base,
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
    scale2,
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
    MMA_SCAN: tl.constexpr,
    POS_AFFINE: tl.constexpr = False,
):
    """One stick of a query block, farthest key block first: its checkpoints and ``s dq'``."""
    num_kb = tl.cdiv(seq_len, BLOCK_N)
    num_m = tl.cdiv(seq_len, BLOCK_M)
    R: tl.constexpr = BLOCK_M // BLOCK_N
    band = pid_m * R
    near = None  # without MMA_SCAN: tl.cumsum (see _key_sum)
    far = None
    if MMA_SCAN:
        near = _tri_matrix(BLOCK_N, LEFT, True, -1.0)
        far = _tri_matrix(BLOCK_N, LEFT, False, 1.0)
    n_hi = tl.load(stats_base + rows, mask=row_ok, other=0.0)
    n_lo = tl.load(stats_base + seq_len + rows, mask=row_ok, other=0.0)
    f_s = tl.zeros([BLOCK_M], dtype=tl.float32)
    # The key blocks away from the diagonal, unmasked, farthest first.
    if LEFT:
        count = band
    else:
        count = num_kb - band - R
    for step in range(count):
        if LEFT:
            kb = step
        else:
            kb = num_kb - 1 - step
        dq, n_hi, n_lo, f_s = _rows_tile(
            dq, n_hi, n_lo, f_s, q, do, s, delta_s, rows, row_ok, pos_i, kb, pid_m, num_m,
            num_kb, near, far, ckpt_r_base, ckpt_f_base, k_base,
            v_base, pos_base, mask_base, cos_base, sin_base, stride_ks, stride_kd, stride_vs,
            stride_vd, HALF_LAYOUT, gain, seq_len, scale2, bias_params, HEAD_DIM, BLOCK_M,
            BLOCK_N, LEFT, CAUSAL, False, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN,
            DOT_PRECISION,
            POS_AFFINE=POS_AFFINE,
        )  # fmt: skip
    # The R key blocks beside the queries, masked, farthest first.
    for t in tl.static_range(R):
        if LEFT:
            kb = band + t
        else:
            kb = band + (R - 1 - t)
        if kb < num_kb:
            dq, n_hi, n_lo, f_s = _rows_tile(
                dq, n_hi, n_lo, f_s, q, do, s, delta_s, rows, row_ok, pos_i, kb, pid_m, num_m,
                num_kb, near, far, ckpt_r_base, ckpt_f_base, k_base,
                v_base, pos_base, mask_base, cos_base, sin_base, stride_ks, stride_kd,
                stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, scale2, bias_params, HEAD_DIM,
                BLOCK_M, BLOCK_N, LEFT, CAUSAL, True, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN,
                DOT_PRECISION,
                POS_AFFINE=POS_AFFINE,
            )  # fmt: skip
    return dq


@triton.jit
def _stick_bwd_rows_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    dq_ptr,
    stats_ptr,
    rowdata_ptr,
    gscale_ptr,
    ckpt_r_ptr,
    ckpt_f_ptr,
    pos_ptr,
    mask_ptr,
    cos_ptr,
    sin_ptr,
    kcos_ptr,
    ksin_ptr,
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
    ckpt_stride,
    ckpt_right,
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
    MMA_SCAN: tl.constexpr,
    POS_AFFINE: tl.constexpr = False,
):
    (
        pid_m, bh, q_base, k_base, v_base, do_base, pos_base, mask_base, cos_base, sin_base,
        kcos_base, ksin_base, bias,
    ) = _program_setup(
        q_ptr, k_ptr, v_ptr, do_ptr, pos_ptr, mask_ptr, cos_ptr, sin_ptr, kcos_ptr, ksin_ptr,
        bias_ptr, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_dob, stride_doh,
        stride_pos_b, stride_tab_b, stride_bias_b, stride_bias_h, num_heads, seq_len, CAUSAL,
    )  # fmt: skip
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_len
    d = tl.arange(0, HEAD_DIM)
    gain = _channel_gain(gain_ptr, HEAD_DIM, HAS_GAIN)
    pos_base = _positions_source(pos_base, seq_len, POS_AFFINE)
    pos_i = _row_positions(pos_base, rows, row_ok, BLOCK_M, BIAS_FN, POS_AFFINE=POS_AFFINE)
    q = _load_rotated(
        q_base, rows, row_ok, stride_qs, stride_qd, cos_base, sin_base, HALF_LAYOUT,
        gain, HEAD_DIM, HAS_TABLES, HAS_GAIN,
    ).to(q_ptr.dtype.element_ty)  # fmt: skip
    do = tl.load(
        do_base + rows[:, None] * stride_dos + d[None, :] * stride_dod, mask=row_ok[:, None],
        other=0.0,
    )  # fmt: skip
    v_own = tl.load(
        v_base + rows[:, None] * stride_vs + d[None, :] * stride_vd, mask=row_ok[:, None], other=0.0
    )
    delta = tl.sum(do.to(tl.float32) * v_own.to(tl.float32), axis=1)  # dO_i . v_i
    tl.store(rowdata_ptr + bh * seq_len + rows, delta, mask=row_ok)
    s = tl.load(gscale_ptr + bh)  # the scale of G (a power of two)

    scale2 = scale * LOG2E
    stats_base = _stats_base(stats_ptr, bh, seq_len, CAUSAL)
    ckpt_r_base = ckpt_r_ptr + bh * ckpt_stride
    ckpt_f_base = ckpt_f_ptr + bh * ckpt_stride
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dq = _backward_rows_one_stick(
        dq, q, do, s, delta * s, rows, row_ok, pos_i, pid_m, stats_base + _STATS_LEFT * seq_len,
        ckpt_r_base, ckpt_f_base, k_base, v_base, pos_base, mask_base, kcos_base, ksin_base,
        stride_ks, stride_kd, stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, scale2, bias,
        HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, HAS_MASK, BIAS_FN, HAS_TABLES, HAS_GAIN,
        DOT_PRECISION, MMA_SCAN,
        POS_AFFINE=POS_AFFINE,
    )  # fmt: skip
    if not CAUSAL:
        dq = _backward_rows_one_stick(
            dq, q, do, s, delta * s, rows, row_ok, pos_i, pid_m,
            stats_base + _STATS_RIGHT * seq_len, ckpt_r_base + ckpt_right,
            ckpt_f_base + ckpt_right, k_base, v_base, pos_base, mask_base, kcos_base, ksin_base,
            stride_ks, stride_kd, stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, scale2,
            bias, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, HAS_MASK, BIAS_FN, HAS_TABLES,
            HAS_GAIN, DOT_PRECISION, MMA_SCAN,
            POS_AFFINE=POS_AFFINE,
        )  # fmt: skip
    dq = dq * (scale / s)
    _store_unrotated(
        dq_ptr + bh * seq_len * HEAD_DIM, rows, row_ok, dq, cos_base, sin_base, gain, BLOCK_M,
        HEAD_DIM, HAS_TABLES, HAS_GAIN, HALF_LAYOUT,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Backward: column kernel (dk, dv, the score bias's parameter gradient)
# --------------------------------------------------------------------------------------------


@triton.jit
def _cols_tile(
    dk,
    dv,
    dbias,
    k,
    v,
    cols,
    key_ok,
    kbias,
    pos_j,
    m,
    pid_n,
    num_m,
    num_kb,
    s,
    near,
    far,
    q_base,
    do_base,
    pos_base,
    cos_base,
    sin_base,
    rowdata_base,
    ckpt_r_base,
    ckpt_f_base,
    stride_qs,
    stride_qd,
    stride_dos,
    stride_dod,
    HALF_LAYOUT: tl.constexpr,
    gain,
    seq_len,
    scale2,
    bias_params,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASKED: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_GRAD_FN: tl.constexpr,
    GRAD_PER_TILE: tl.constexpr,
    GRAD_WIDTH: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MMA_SCAN: tl.constexpr,
):
    """Query block ``m`` against key block ``pid_n``: its part of ``s dk'``, ``dv`` and
    ``s dtheta``, exact on its own from the checkpoints at the block's edges. With
    ``GRAD_PER_TILE`` (square tiles) ``dbias`` points at this (batch, head)'s tile slots and the
    hook stores the tile's ``s dtheta`` sums in its own slot (side 0: the left stick, side 1: the
    right one)."""
    rows = m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seq_len
    d = tl.arange(0, HEAD_DIM)
    pos_i = _row_positions(pos_base, rows, row_ok, BLOCK_M, BIAS_FN)
    q = _load_rotated(
        q_base, rows, row_ok, stride_qs, stride_qd, cos_base, sin_base, HALF_LAYOUT,
        gain, HEAD_DIM, HAS_TABLES, HAS_GAIN,
    ).to(k.dtype)  # fmt: skip
    do = tl.load(
        do_base + rows[:, None] * stride_dos + d[None, :] * stride_dod, mask=row_ok[:, None],
        other=0.0,
    ).to(k.dtype)  # fmt: skip
    delta = tl.load(rowdata_base + rows, mask=row_ok, other=0.0)
    near_slot, has_near, far_slot, has_far = _boundaries(
        pid_n, m, num_m, num_kb, BLOCK_M // cols.shape[0], LEFT
    )
    at = tl.arange(0, BLOCK_M)
    edge = tl.load(
        ckpt_r_base + near_slot * BLOCK_M + at, mask=_all_or_none(BLOCK_M, has_near), other=0.0
    )
    f_s = tl.load(
        ckpt_f_base + far_slot * BLOCK_M + at, mask=_all_or_none(BLOCK_M, has_far), other=0.0
    )
    sp, log_beta = _tile_logs(
        q, k, rows, cols, row_ok, key_ok, kbias, pos_i, pos_j, scale2, bias_params, seq_len, LEFT,
        MASKED, BIAS_FN, DOT_PRECISION,
    )  # fmt: skip
    a, ga, dz = _tile_grads(
        sp, log_beta, edge.to(tl.float32), f_s.to(tl.float32), do, v, s, delta * s, near, far,
        LEFT, CAUSAL, DOT_PRECISION,
    )  # fmt: skip
    # The order of the two products decides which float32 tile (a, dz) stays in registers while
    # the other's product forms. On sm_90 ptxas spilled less with dv's first in the left stick
    # without a bias (104 -> 91 memory instructions per iteration at head_dim 128); dk's first
    # everywhere else (a bias's gradient reads dz after both) and before sm_90 (MMA_SCAN False),
    # where dv's first spilled more (a T4's column kernel: 360 -> 712 bytes).
    if BIAS_FN is None and LEFT and MMA_SCAN:
        dv += tl.dot(tl.trans(a.to(k.dtype)), do, input_precision=DOT_PRECISION)
        dk += tl.dot(tl.trans(dz.to(k.dtype)), q, input_precision=DOT_PRECISION)
    else:
        dk += tl.dot(tl.trans(dz.to(k.dtype)), q, input_precision=DOT_PRECISION)
        dv += tl.dot(tl.trans(a.to(k.dtype)), do, input_precision=DOT_PRECISION)
    if BIAS_GRAD_FN is not None and GRAD_PER_TILE:  # queries are axis 0 of these tiles
        slot = tile_slot(pid_n, m, num_m, 0 if LEFT else 1)
        BIAS_GRAD_FN(
            dbias + slot * GRAD_WIDTH, dz, tl.minimum(rows, seq_len - 1)[:, None],
            tl.minimum(cols, seq_len - 1)[None, :], pos_i[:, None], pos_j[None, :],
            bias_params, 0,
        )  # fmt: skip
    elif BIAS_GRAD_FN is not None:
        dbias = BIAS_GRAD_FN(
            dbias, dz, tl.minimum(rows, seq_len - 1)[:, None],
            tl.minimum(cols, seq_len - 1)[None, :], pos_i[:, None], pos_j[None, :],
            bias_params, 0,
        )  # fmt: skip
    return dk, dv, dbias


@triton.jit
def _backward_cols_one_stick(
    dk,
    dv,
    dbias,
    k,
    v,
    cols,
    key_ok,
    kbias,
    pos_j,
    pid_n,
    s,
    q_base,
    do_base,
    pos_base,
    cos_base,
    sin_base,
    rowdata_base,
    ckpt_r_base,
    ckpt_f_base,
    stride_qs,
    stride_qd,
    stride_dos,
    stride_dod,
    HALF_LAYOUT: tl.constexpr,
    gain,
    seq_len,
    scale2,
    bias_params,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LEFT: tl.constexpr,
    CAUSAL: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_GRAD_FN: tl.constexpr,
    GRAD_PER_TILE: tl.constexpr,
    GRAD_WIDTH: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MMA_SCAN: tl.constexpr,
):
    """One stick's contribution of every query block to the key block ``pid_n``: the query
    blocks away from it unmasked, then the one beside it, masked."""
    num_m = tl.cdiv(seq_len, BLOCK_M)
    num_kb = tl.cdiv(seq_len, BLOCK_N)
    R: tl.constexpr = BLOCK_M // BLOCK_N
    beside = pid_n // R  # the query block holding these keys' own rows
    near = None  # without MMA_SCAN: tl.cumsum (see _key_sum)
    far = None
    if MMA_SCAN:
        near = _tri_matrix(BLOCK_N, LEFT, True, -1.0)
        far = _tri_matrix(BLOCK_N, LEFT, False, 1.0)
    if LEFT:  # the queries right of these keys see them in their left stick
        first = beside + 1
        count = num_m - beside - 1
    else:
        first = 0
        count = beside
    for step in range(count):
        m = first + step
        dk, dv, dbias = _cols_tile(
            dk, dv, dbias, k, v, cols, key_ok, kbias, pos_j, m, pid_n, num_m, num_kb, s, near,
            far, q_base, do_base, pos_base, cos_base, sin_base, rowdata_base, ckpt_r_base,
            ckpt_f_base, stride_qs, stride_qd, stride_dos, stride_dod, HALF_LAYOUT, gain, seq_len,
            scale2, bias_params, HEAD_DIM, BLOCK_M, LEFT, CAUSAL, False, BIAS_FN, BIAS_GRAD_FN,
            GRAD_PER_TILE, GRAD_WIDTH, HAS_TABLES, HAS_GAIN, DOT_PRECISION, MMA_SCAN,
        )  # fmt: skip
    dk, dv, dbias = _cols_tile(
        dk, dv, dbias, k, v, cols, key_ok, kbias, pos_j, beside, pid_n, num_m, num_kb, s, near,
        far, q_base, do_base, pos_base, cos_base, sin_base, rowdata_base, ckpt_r_base,
        ckpt_f_base, stride_qs, stride_qd, stride_dos, stride_dod, HALF_LAYOUT, gain, seq_len,
        scale2, bias_params, HEAD_DIM, BLOCK_M, LEFT, CAUSAL, True, BIAS_FN, BIAS_GRAD_FN,
        GRAD_PER_TILE, GRAD_WIDTH, HAS_TABLES, HAS_GAIN, DOT_PRECISION, MMA_SCAN,
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
    stats_ptr,
    rowdata_ptr,
    gscale_ptr,
    ckpt_r_ptr,
    ckpt_f_ptr,
    pos_ptr,
    mask_ptr,
    cos_ptr,
    sin_ptr,
    kcos_ptr,
    ksin_ptr,
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
    ckpt_stride,
    ckpt_right,
    grad_slots,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BIAS_FN: tl.constexpr,
    BIAS_GRAD_FN: tl.constexpr,
    GRAD_WIDTH: tl.constexpr,
    GRAD_PER_TILE: tl.constexpr,
    HAS_TABLES: tl.constexpr,
    HAS_GAIN: tl.constexpr,
    HALF_LAYOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    MMA_SCAN: tl.constexpr,
):
    (
        pid_n, bh, q_base, k_base, v_base, do_base, pos_base, mask_base, cos_base, sin_base,
        kcos_base, ksin_base, bias,
    ) = _program_setup(
        q_ptr, k_ptr, v_ptr, do_ptr, pos_ptr, mask_ptr, cos_ptr, sin_ptr, kcos_ptr, ksin_ptr,
        bias_ptr, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_dob, stride_doh,
        stride_pos_b, stride_tab_b, stride_bias_b, stride_bias_h, num_heads, seq_len, False,
    )  # fmt: skip
    num_kb = tl.cdiv(seq_len, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    gain = _channel_gain(gain_ptr, HEAD_DIM, HAS_GAIN)
    cols, key_ok, kbias, pos_j, k, v = _load_keys(
        pid_n, k_base, v_base, mask_base, pos_base, kcos_base, ksin_base, stride_ks, stride_kd,
        stride_vs, stride_vd, HALF_LAYOUT, gain, seq_len, HEAD_DIM, BLOCK_N, HAS_MASK,
        HAS_TABLES, HAS_GAIN, BIAS_FN,
    )  # fmt: skip
    col_in = cols < seq_len
    scale2 = scale * LOG2E
    rowdata_base = rowdata_ptr + bh * seq_len
    s = tl.load(gscale_ptr + bh)  # the scale of G (a power of two)
    ckpt_r_base = ckpt_r_ptr + bh * ckpt_stride
    ckpt_f_base = ckpt_f_ptr + bh * ckpt_stride
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if GRAD_PER_TILE:
        dbias = dbias_ptr + bh * grad_slots * GRAD_WIDTH  # this (batch, head)'s tile slots
    else:
        dbias = tl.zeros([GRAD_WIDTH], dtype=tl.float32)  # unused without BIAS_GRAD_FN
    dk, dv, dbias = _backward_cols_one_stick(
        dk, dv, dbias, k, v, cols, key_ok, kbias, pos_j, pid_n, s, q_base, do_base, pos_base,
        cos_base, sin_base, rowdata_base, ckpt_r_base, ckpt_f_base, stride_qs, stride_qd,
        stride_dos, stride_dod, HALF_LAYOUT, gain, seq_len, scale2, bias, HEAD_DIM, BLOCK_M,
        BLOCK_N, True, CAUSAL, BIAS_FN, BIAS_GRAD_FN, GRAD_PER_TILE, GRAD_WIDTH, HAS_TABLES,
        HAS_GAIN, DOT_PRECISION, MMA_SCAN,
    )  # fmt: skip
    if not CAUSAL:
        dk, dv, dbias = _backward_cols_one_stick(
            dk, dv, dbias, k, v, cols, key_ok, kbias, pos_j, pid_n, s, q_base, do_base,
            pos_base, cos_base, sin_base, rowdata_base, ckpt_r_base + ckpt_right,
            ckpt_f_base + ckpt_right, stride_qs, stride_qd, stride_dos, stride_dod, HALF_LAYOUT,
            gain, seq_len, scale2, bias, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, BIAS_FN,
            BIAS_GRAD_FN, GRAD_PER_TILE, GRAD_WIDTH, HAS_TABLES, HAS_GAIN, DOT_PRECISION,
            MMA_SCAN,
        )  # fmt: skip

    # These keys are queries too: the leftover of their own stick came from their own value.
    do_own = tl.load(
        do_base + cols[:, None] * stride_dos + d[None, :] * stride_dod,
        mask=col_in[:, None],
        other=0.0,
    ).to(tl.float32)
    stats_base = _stats_base(stats_ptr, bh, seq_len, CAUSAL)
    s_left = _stick_total(stats_base + _STATS_LEFT * seq_len, cols, col_in, seq_len)
    s_right = s_left  # unused when causal
    if not CAUSAL:
        s_right = _stick_total(stats_base + _STATS_RIGHT * seq_len, cols, col_in, seq_len)
    dv += _leftover(s_left, s_right, CAUSAL)[:, None] * do_own

    _store_unrotated(
        dk_ptr + bh * seq_len * HEAD_DIM, cols, col_in, dk * (scale / s), kcos_base, ksin_base,
        gain,
        BLOCK_N, HEAD_DIM, HAS_TABLES, HAS_GAIN, HALF_LAYOUT,
    )  # fmt: skip
    dv_ptrs = dv_ptr + bh * seq_len * HEAD_DIM + cols[:, None] * HEAD_DIM + d[None, :]
    tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=col_in[:, None])
    if BIAS_GRAD_FN is not None and not GRAD_PER_TILE:
        slot = (bh * num_kb + pid_n) * GRAD_WIDTH
        tl.store(dbias_ptr + slot + tl.arange(0, GRAD_WIDTH), dbias / s)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


class StickConfig:
    """Tile sizes and launch options of the stick-breaking kernels: ``block_m`` queries by
    ``block_n`` keys in the forward, ``block_bwd`` queries by ``block_bwd_n`` keys in both
    backward kernels (the key block divides the query block)."""

    def __init__(
        self,
        block_m: int,
        block_n: int,
        block_bwd: int,
        num_warps: int,
        bwd_warps: int,
        num_stages: int = 1,
        bwd_stages: int = 1,
        cols_stages: int = 1,
        block_bwd_n: int | None = None,
    ):
        self.block_m = block_m
        self.block_n = block_n
        self.block_bwd = block_bwd
        self.block_bwd_n = block_n if block_bwd_n is None else block_bwd_n
        self.num_warps = num_warps
        self.bwd_warps = bwd_warps
        self.num_stages = num_stages
        self.bwd_stages = bwd_stages
        self.cols_stages = cols_stages

    def __repr__(self) -> str:
        return (
            f"StickConfig(block_m={self.block_m}, block_n={self.block_n}, "
            f"block_bwd={self.block_bwd}, num_warps={self.num_warps}, bwd_warps={self.bwd_warps}, "
            f"num_stages={self.num_stages}, bwd_stages={self.bwd_stages}, "
            f"cols_stages={self.cols_stages}, block_bwd_n={self.block_bwd_n})"
        )


def _stage_bytes(rows: int, head_dim: int, size: int) -> int:
    """Bytes one pipelining stage of a loop holds: the two ``[rows, head_dim]`` tiles it loads
    (k and v, or q and dO)."""
    return rows * 2 * head_dim * size


def _fit_stages(limit: int, stage: int, single: int, fixed: int) -> int:
    """The most pipelining stages (at most 3, at least 1; 0 if even 1 does not fit) for which
    ``stages * stage + fixed`` bytes (``single + fixed`` for one stage), plus 1 KiB of slack,
    fit in ``limit``. ``python -m course_lib.gpu_report`` checks the compiled figures."""
    for stages in (3, 2, 1):
        if (stages * stage if stages > 1 else single) + fixed + 1024 <= limit:
            return stages
    return 0


def _forward_stages(limit, bm, bn, head_dim, size) -> int:
    """Stages of the forward: besides them, q and one triangle stay in shared memory (triton
    3.9)."""
    fixed = bm * head_dim * size + 2 * bn * bn
    stage = _stage_bytes(bn, head_dim, size)
    return _fit_stages(limit, stage, stage, fixed)


# Blackwell's tensor-memory products (tcgen5, sm_100) read both operands from shared memory:
# Triton 3.9's pipeliner there keeps more of each stage of the column kernel in shared memory
# than on Hopper (its causal kernel at head_dim 128, 128x64 tiles, two stages: 279,112 bytes on
# sm_100, 164,352 on sm_90). A stage is counted 1.5x there, which reproduces that figure.
_COLS_STAGE_SCALE_TCGEN5 = 1.5
_TCGEN5_ARCHS = range(100, 110)
# With a per-tile gradient (the per-distance table's hook, square tiles) the column kernel's
# stages hold far more there: at head_dim 128, 64x64 tiles and three stages it needed 238,144
# bytes on sm_100 (limit 232,448), where one stage needs 66,560. One stage is taken there.
_COLS_STAGES_PER_TILE_GRAD_TCGEN5 = 1


def _backward_stages(
    limit, bm, bn, head_dim, size, sides, arch=None, square=False
) -> tuple[int, int]:
    """Stages of the row and the column kernel. Besides them: q, dO and two triangles in the
    row kernel; k, v, two triangles and the transposed ``dz`` and
    ``A`` in the column kernel, whose loops over the query blocks each get their own stages
    (one loop per stick: triton 3.9 does not share them on Hopper). On a tcgen5 GPU (``arch``
    100-109) a column kernel's stage counts 1.5x (:data:`_COLS_STAGE_SCALE_TCGEN5`), and with a
    per-tile gradient (``square``) it takes at most :data:`_COLS_STAGES_PER_TILE_GRAD_TCGEN5`."""
    tri = 2 * 2 * bn * bn
    rows_fixed = 2 * bm * head_dim * size + tri
    cols_fixed = 2 * bn * head_dim * size + tri + 2 * bm * bn * size
    rows_stage = _stage_bytes(bn, head_dim, size)
    cols_single = _stage_bytes(bm, head_dim, size)
    cols_stage = cols_single
    if arch in _TCGEN5_ARCHS:
        cols_stage = int(cols_stage * _COLS_STAGE_SCALE_TCGEN5)
    cols = _fit_stages(limit, sides * cols_stage, sides * cols_single, cols_fixed)
    if square and arch in _TCGEN5_ARCHS:
        cols = min(cols, _COLS_STAGES_PER_TILE_GRAD_TCGEN5)
    return _fit_stages(limit, rows_stage, rows_stage, rows_fixed), cols


# The column kernel at head_dim 64 on 4 warps (64 x 64 tiles) holds dk, dv, k, v and the tile's
# float32 intermediates in 255 registers: without a hook it spills 7 accesses per iteration of
# its loop, with ExpoSB's distance factor 29, with RSE's penalty and its gradient 25 (the static
# report, sm_90, causal, bf16; README's "On a GPU"). On 8 warps, two warpgroups of 64 queries
# each over the same 64 keys, every thread holds half of dk and dv: none of the three spills,
# with the same tensor-core work per warp. Without a hook the row kernel loads more per pair that
# way (29 memory instructions per warp and iteration for 8192 pairs against 25 for 4096) and the
# column kernel spills little, so plain launches keep 64 x 64.
_HOPPER_BIASED_BACKWARD = (128, 64, 8)


def pick_config(
    head_dim: int,
    device: torch.device,
    block: int | None = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    causal: bool = True,
    square: bool = False,
    biased: bool = False,
) -> StickConfig:
    """The first of :func:`fitting_configs`' forward and backward shapes."""
    forward, _ = fitting_configs(
        head_dim, device, block, dtype=dtype, causal=causal, square=square, biased=biased
    )
    return forward[0]


def fitting_configs(
    head_dim: int,
    device: torch.device,
    block: int | None = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    causal: bool = True,
    square: bool = False,
    biased: bool = False,
) -> tuple[list[StickConfig], list[StickConfig]]:
    """Tiles for ``head_dim`` on ``device``; ``block`` (a power of two >= 16) forces all of them.

    64x64 tiles in the interpreter (where fewer, larger tiles run fastest). On a GPU, 64 keys
    per tile and, up to head_dim 64, 64 queries with 4 warps. On Hopper at head_dim 128: 128
    queries with 8 warps, one warp group per 64 queries, so that a row of a tile stays in one
    warp group. Elsewhere (mma.sync: both operands of a product in registers) fewer registers per
    thread: 64 queries with 8 warps at head_dim 128 (the backward from head_dim 64). A shape is
    halved until one stage of its kernels fits in the GPU's shared memory per block (for
    ``dtype``, ``causal`` or not), with as many pipelining stages (up to 3) as fit. A ``block``
    that cannot fit is refused with a ValueError. ``square``: the backward's query and key
    blocks equal (for a hook whose gradient is per tile). ``biased``: a score-bias hook is
    launched; on Hopper at head_dim 64 the backward then takes 128 queries with 8 warps as at
    128 (:data:`_HOPPER_BIASED_BACKWARD`).

    Returns every config that fits, as two lists in the order above: the forward's shapes, each
    with the first backward shape, and the backward's, each with the first forward shape. Their
    first entries are the same config, :func:`pick_config`'s; the interpreter has one.
    """
    if block is not None:
        # at most DIAGONAL_KEY_PAD: a key block past the sequence's end stays in the
        # per-diagonal table's padding (its kernels hand the hook unclamped key indices)
        if (not isinstance(block, int) or block < 16 or block > DIAGONAL_KEY_PAD
                or block & (block - 1)):  # fmt: skip
            raise ValueError(
                f"block must be a power of two from 16 to {DIAGONAL_KEY_PAD}, got {block!r}"
            )
    limit = smem_per_block(device)
    if limit == 0:  # the interpreter
        size = block or 64
        config = StickConfig(size, size, size, 4, 4)
        return [config], [config]
    small = [(64, 64, 4), (32, 32, 4), (16, 16, 4)]
    arch = gpu_arch(device)
    hopper = (arch or 0) >= 90
    if block is not None:
        fwd_shapes = bwd_shapes = [(block, block, 4 if head_dim < 128 or block < 64 else 8)]
    elif hopper:
        wide = [(128, 64, 8), (64, 64, 8)] if head_dim >= 128 else []
        fwd_shapes = bwd_shapes = wide + small
        if biased and 64 <= head_dim < 128 and not square:
            bwd_shapes = [_HOPPER_BIASED_BACKWARD] + small
    elif head_dim >= 128:
        fwd_shapes = bwd_shapes = [(64, 64, 8)] + small
    else:
        fwd_shapes = small
        bwd_shapes = small if head_dim < 64 else [(64, 64, 8)] + small
    if square:
        bwd_shapes = [shape for shape in bwd_shapes if shape[0] == shape[1]]
    size = torch.empty((), dtype=dtype).element_size()
    if size == 2 and (gpu_arch(device) or 0) < BF16_MIN_ARCH:
        # before sm_80 Triton has no tensor-core path: 16-bit operands of the CUDA-core
        # products are widened to float32 in shared memory
        size = 4
    sides = 1 if causal else 2
    fwd = [
        (bm, bn, w, st) for bm, bn, w in fwd_shapes
        if (st := _forward_stages(limit, bm, bn, head_dim, size))
    ]  # fmt: skip
    bwd = [
        (bm, bn, w, st) for bm, bn, w in bwd_shapes
        if all(st := _backward_stages(limit, bm, bn, head_dim, size, sides, arch, square))
    ]  # fmt: skip
    if not fwd or not bwd:
        raise ValueError(
            f"stick-breaking tiles of {block or 16} rows at head_dim {head_dim} ({dtype}) "
            f"need more shared memory than the GPU's "
            f"{limit // 1024} KiB per block; use a smaller block"
        )
    return [_stick_config(f, bwd[0]) for f in fwd], [_stick_config(fwd[0], b) for b in bwd]


def _stick_config(fwd: tuple, bwd: tuple) -> StickConfig:
    """A :class:`StickConfig` from a forward ``(bm, bn, warps, stages)`` and a backward
    ``(bm, bn, warps, (row stages, column stages))``."""
    return StickConfig(
        block_m=fwd[0], block_n=fwd[1], block_bwd=bwd[0], num_warps=fwd[2], bwd_warps=bwd[2],
        num_stages=fwd[3], bwd_stages=bwd[3][0], cols_stages=bwd[3][1], block_bwd_n=bwd[1],
    )  # fmt: skip


# Tiles of 16 rows are where a GPU's shared memory leaves nothing larger: a GPU times them only
# when they are the pick.
_SMALLEST_TUNED_BLOCK = 32


def _worth_timing(pass_: str, head_dim: int, config: StickConfig) -> bool:
    """Whether a candidate other than the pick is worth a compile and a timing: at least
    :data:`_SMALLEST_TUNED_BLOCK` rows, and not the backward at head_dim 128 on 64 rows and 4
    warps, which ptxas spilled 1.8-43 KB for (sm_90, sm_80, sm_86; compiled ahead of time)."""
    if pass_ == "forward":
        return config.block_m >= _SMALLEST_TUNED_BLOCK
    if head_dim >= 128 and config.block_bwd >= 64 and config.bwd_warps == 4:
        return False
    return config.block_bwd >= _SMALLEST_TUNED_BLOCK


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
    """Launch arguments a GPU times for one pass (:mod:`.tuning`), ``{"config": StickConfig}``
    each, :func:`pick_config`'s first: the shapes of that pass which fit the GPU
    (:func:`fitting_configs`; the other pass keeps its pick) and are worth timing
    (:func:`_worth_timing`). ``per_tile``: the backward's tiles are square. Only the pick in
    the interpreter."""
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
    forward, backward = fitting_configs(
        head_dim, device, dtype=dtype, causal=causal, square=per_tile, biased=biased
    )
    configs = forward if pass_ == "forward" else backward
    return [
        {"config": c} for i, c in enumerate(configs) if i == 0 or _worth_timing(pass_, head_dim, c)
    ]


def _mma_scan(device: torch.device, backward: bool) -> bool:
    """Sum keys with triangular products on the tensor cores, or with ``tl.cumsum`` (the
    backward kernels on mma.sync GPUs, whose products take both operands from registers: the
    two constant triangles would hold many of them, and these kernels spill less without).
    The interpreter computes what the Hopper code does."""
    arch = gpu_arch(device)
    return not backward or arch is None or arch >= 90


def _switches(
    a: LaunchArgs,
    head_dim: int,
    causal: bool,
    dtype: torch.dtype,
    device: torch.device,
    backward: bool,
    positions_affine: bool = False,
    seq: int = 0,
) -> dict:
    """The constexpr arguments every stick-breaking kernel takes. ``POS_AFFINE``: a score bias
    reads positions that step by a constant, from two tokens on (else they are read)."""
    return {
        "POS_AFFINE": bool(positions_affine) and a.hook is not None and seq > 1,
        "HEAD_DIM": head_dim,
        "CAUSAL": bool(causal),
        "HAS_MASK": a.has_mask,
        "BIAS_FN": None if a.hook is None else a.hook.bias,
        "HAS_TABLES": a.has_tables,
        "HAS_GAIN": a.has_gain,
        "HALF_LAYOUT": a.half_layout,
        "DOT_PRECISION": dot_precision(dtype),
        "MMA_SCAN": _mma_scan(device, backward),
    }


def _given_config(config: StickConfig | None, block: int | None) -> StickConfig | None:
    """A launcher's ``config`` argument, checked (None: the launcher picks)."""
    if config is None:
        return None
    if not isinstance(config, StickConfig):
        raise TypeError(f"config must be a StickConfig, got {type(config).__name__}")
    if block is not None:
        raise ValueError(f"give block ({block}) or config ({config}), not both")
    return config


def _num_stats(causal: bool) -> int:
    """Rows of ``rowstats`` per (batch, head): ``(S_hi, S_lo)`` per stick."""
    return 2 if causal else 4


def _g_scale(grad_out: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``s`` per (batch, head), float32 ``[batch * heads]``: the power of two with
    ``s * bound <= 2^G_RANGE`` for ``bound = 2 max_i |dO_i|_1 max_j |v_j|_inf``, which bounds
    ``|G_ij|``, ``|F_ij|`` (``sum_j A_ij <= 1``) and ``|dz_ij| / 2``."""
    do_l1 = torch.linalg.vector_norm(grad_out, ord=1, dim=3, dtype=torch.float32).amax(dim=2)
    v_max = torch.linalg.vector_norm(v, ord=float("inf"), dim=(2, 3), dtype=torch.float32)
    bound = (2.0 * do_l1 * v_max).clamp(2.0**-100, 2.0**100)
    exponent = G_RANGE - torch.ceil(torch.log2(bound)).to(torch.int32)
    # 2^exponent, exactly: the float32 with that biased exponent and a zero mantissa
    return ((exponent + 127) << 23).view(torch.float32).reshape(-1).contiguous()


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
    bias_hook=None,
    bias_params: torch.Tensor | None = None,
    bias_options: dict | None = None,
    block: int | None = None,
    positions_affine: bool = False,
    config: StickConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention forward (see the module docstring for the function).

    Args: q, k, v ``[batch, heads, seq, head_dim]`` (one dtype, any strides); positions float32
    ``[1 or batch, seq]``; key_mask ``[batch, seq]`` (nonzero = real) or None; qk_tables: an
    object with ``cos``, ``sin``, ``gain``, ``layout`` (see :mod:`.common`) or None (``q' = q``);
    bias_hook: a :class:`.score_bias.BiasHook` or None, bias_params: the tensor
    it reads, bias_options: its compile-time options (none: the stick-breaking kernels take no
    hook with options); block: force every tile to this size (a power of two >= 16);
    positions_affine: each sequence's positions are ``p_0 + step * index`` (the kernels then
    compute them instead of reading them); config: the tiles (a :class:`StickConfig`, e.g. one
    of :func:`tuning_candidates`), default :func:`pick_config`'s (not with ``block``).

    Returns ``out`` ``[batch, heads, seq, head_dim]`` (input dtype, contiguous) and ``rowstats``
    ``[batch, heads, 2 * sides, seq]`` (float32), which the backward needs: per stick (left,
    then right if bidirectional) ``S``, the sum of ``softplus(z) log2(e)`` over its keys (the
    ``-log2`` of what is left of it), as a float32 pair ``(hi, lo)``.
    """
    check_launch_inputs(
        q, k, v, positions, key_mask, qk_tables, bias_hook, bias_params, bias_options
    )
    batch, heads, seq, head_dim = q.shape
    positions = positions.contiguous()
    if qk_tables is not None:  # per token: once, before the loops (kernels/qk_transform.py)
        q, k = encode_qk(q, k, qk_tables)
    a = prepare_launch(q, positions, key_mask, None, bias_hook, bias_params, bias_options)
    cfg = _given_config(config, block) or pick_config(
        head_dim, q.device, block, dtype=q.dtype, causal=causal
    )
    out = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    stats = torch.empty(
        (batch, heads, _num_stats(causal), seq), dtype=torch.float32, device=q.device
    )
    grid = (triton.cdiv(seq, cfg.block_m), batch * heads)
    run_launch(Launch("forward", _stick_fwd_kernel, grid, (
        q, k, v, out, stats, positions, a.mask, a.cos, a.sin, a.key_cos, a.key_sin, a.gain,
        a.bias_params,
        *q.stride(), *k.stride(), *v.stride(), out.stride(0), out.stride(1), *a.strides(),
        heads, seq, float(scale),
    ), dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **_switches(a, head_dim, causal, q.dtype, q.device, False, positions_affine, seq),
    )))  # fmt: skip
    return out, stats


def stick_breaking_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rowstats: torch.Tensor,
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
    block: int | None = None,
    positions_affine: bool = False,
    encoded: bool = False,
    config: StickConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of :func:`stick_breaking_forward`: ``(dq, dk, dv, dparams)``.

    dq, dk, dv: contiguous ``[batch, heads, seq, head_dim]`` in the input dtype; dparams: the
    gradient of ``bias_params`` (float32, its shape) if ``bias_grad``, else None. Same arguments
    as the forward (the same ``block``; ``config``'s backward tiles need not be the forward's),
    plus ``grad_out`` (like the output, any strides) and
    the forward's ``rowstats``. With ``qk_tables``, q and k go through them first (as in the
    forward) unless ``encoded`` (they are already the forward's ``q'``, ``k'``); the float32
    gradients w.r.t. ``q'``, ``k'`` go back through the tables' transpose once, at the end.
    """
    check_launch_inputs(
        q, k, v, positions, key_mask, qk_tables, bias_hook, bias_params, bias_options
    )
    if grad_out.shape != q.shape:
        raise ValueError(f"grad_out must have shape {tuple(q.shape)}, got {tuple(grad_out.shape)}")
    batch, heads, seq, head_dim = q.shape
    want = (batch, heads, _num_stats(causal), seq)
    if tuple(rowstats.shape) != want or rowstats.dtype != torch.float32:
        raise ValueError(
            f"rowstats must be the forward's float32 {list(want)}, got {rowstats.dtype} "
            f"{tuple(rowstats.shape)}"
        )
    positions = positions.contiguous()
    rowstats = rowstats.contiguous()
    if qk_tables is not None and not encoded:  # as the forward did: once, before the loops
        q, k = encode_qk(q, k, qk_tables)
    a = prepare_launch(q, positions, key_mask, None, bias_hook, bias_params, bias_options)
    if bias_grad and (a.hook is None or a.hook.grad is None):
        raise ValueError("bias_grad needs a score-bias hook with a learnable tensor")
    per_tile = bias_grad and a.hook.grad_per_tile  # one gradient slot per tile: square tiles
    grad_out = grad_out.to(q.dtype)
    cfg = _given_config(config, block) or pick_config(
        head_dim, q.device, block, dtype=q.dtype, causal=causal, square=per_tile,
        biased=a.hook is not None,
    )  # fmt: skip
    bm, bn = cfg.block_bwd, cfg.block_bwd_n
    num_m, num_kb = triton.cdiv(seq, bm), triton.cdiv(seq, bn)
    slots_left = _num_slots(num_m, num_kb, bm // bn, True)
    slots_right = 0 if causal else _num_slots(num_m, num_kb, bm // bn, False)
    ckpt_dtype = torch.float32 if q.dtype == torch.float32 else torch.float16
    f32 = {"dtype": torch.float32, "device": q.device}
    # gradients w.r.t. q', k' stay float32 until the tables' transpose has been applied
    grad_dtype = q.dtype if qk_tables is None else torch.float32
    dq = torch.empty((batch, heads, seq, head_dim), dtype=grad_dtype, device=q.device)
    dk = torch.empty_like(dq)
    dv = torch.empty((batch, heads, seq, head_dim), dtype=q.dtype, device=q.device)
    gscale = _g_scale(grad_out, v)
    rowdata = torch.empty((batch * heads, seq), **f32)  # delta_i = dO_i . v_i
    ckpt_stride = (slots_left + slots_right) * bm
    ckpt_r = torch.empty((batch * heads, ckpt_stride), dtype=ckpt_dtype, device=q.device)
    ckpt_f = torch.empty_like(ckpt_r)
    # one slot per row of the column kernel's tiles, which are queries there (see score_bias)
    grad_width = a.hook.grad_width(bm) if bias_grad else 1
    # the gradient's partial sums: one slot per program, or per tile (zeros: not every tile is
    # visited)
    tiles = GradTiles(bn, num_kb, 1 if causal else 2) if per_tile else None
    slots = tile_slot_count(tiles) if per_tile else num_kb
    partials = (torch.zeros if per_tile else torch.empty)(
        (batch * heads, slots, grad_width) if bias_grad else (1,), **f32
    )
    switches = _switches(a, head_dim, causal, q.dtype, q.device, True, positions_affine, seq)
    # The column kernel reads its positions: it reads the queries' once per tile anyway, and
    # computing them kept more registers live there (RSE at head_dim 64 on sm_90: 37 spilled
    # accesses per iteration instead of 23).
    cols_switches = {name: value for name, value in switches.items() if name != "POS_AFFINE"}
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *a.strides())
    tables = (positions, a.mask, a.cos, a.sin, a.key_cos, a.key_sin, a.gain, a.bias_params)
    sizes = (heads, seq, float(scale), ckpt_stride, slots_left * bm)
    if per_tile and bm != bn:
        raise ValueError(f"the hook {a.hook.name!r} needs square backward tiles, got {cfg}")
    run_launch(Launch("bwd_rows", _stick_bwd_rows_kernel, (num_m, batch * heads), (
        q, k, v, grad_out, dq, rowstats, rowdata, gscale, ckpt_r, ckpt_f, *tables, *strides,
        *sizes,
    ), dict(
        BLOCK_M=bm, BLOCK_N=bn, num_warps=cfg.bwd_warps, num_stages=cfg.bwd_stages, **switches,
    )))  # fmt: skip
    run_launch(Launch("bwd_cols", _stick_bwd_cols_kernel, (num_kb, batch * heads), (
        q, k, v, grad_out, dk, dv, partials, rowstats, rowdata, gscale, ckpt_r, ckpt_f,
        *tables, *strides, *sizes, slots,
    ), dict(
        BLOCK_M=bm, BLOCK_N=bn, BIAS_GRAD_FN=a.hook.grad if bias_grad else None,
        GRAD_WIDTH=grad_width, GRAD_PER_TILE=per_tile, num_warps=cfg.bwd_warps,
        num_stages=cfg.cols_stages, **cols_switches,
    )))  # fmt: skip
    if per_tile:  # the tiles summed s dz: divide by the scale of G, s per (batch, head)
        partials = partials / gscale.view(-1, 1, 1)
    dparams = a.hook.reduce_grad(partials, batch, heads, a.bias_shape, tiles) if bias_grad else None
    if qk_tables is not None:
        dq, dk = decode_qk_grads(dq, dk, qk_tables, q.dtype)
    return dq, dk, dv, dparams
