"""Score-bias hooks: the ``b_ij`` a fused kernel adds to its scores, given as an object.

The kernels know no encoding. A caller hands them a :class:`BiasHook` (its ``@triton.jit``
functions, the tensor they read, how that tensor's gradient is reduced) and the tensor; the
launcher passes the hook's functions to the kernel as ``tl.constexpr`` arguments (``BIAS_FN``, and
``BIAS_GRAD_FN`` when a gradient is wanted), so each hook is compiled into its own kernel and no
bias (``BIAS_FN=None``) costs nothing. For query ``i`` and key ``j``::

    logit_ij = scale * q'_i . k'_j + b_ij

Hooks live with the encoding that uses them: each encoding file under ``course_lib/encodings``
builds its :class:`BiasHook` behind the Triton-available guard and lists it in its registry record
(``kernel_hooks``), which is how ``python -m course_lib.gpu_report`` finds every hook. There is no
table of hook names anywhere. This module holds the contract, the reductions most gradients need
(:func:`per_head_total`, :func:`per_head_interleaved`, :func:`per_head_slots`,
:func:`per_token_columns`, :func:`diagonal_sums`), the kernels' own per-distance hook
(:data:`DIAGONAL_TABLE`) and the bias formulas that several encodings share or that the
chapters print (ALiBi's and RSE's linear distance, ExpoSB's distance factor, T5's buckets).

The hook contract
-----------------
``bias(idx_q, idx_k, pos_q, pos_k, params, BASE2, OPTIONS=None) -> tile`` (float32). ``idx_*``
are token indices (int; queries in ``[0, seq)``, and keys in flash, whose hooks may load
``params + idx`` unmasked; stick-breaking's masked keys may pass the end), ``pos_*`` the position ids as float32
**counted from the smallest position of the sequence**: the wrappers subtract it in integers
(and refuse a sequence spanning ``2^24`` or more), so every value, and ``pos_q - pos_k``, is an
exact integer however large the positions are (``10**8 + arange(n)`` gives the biases of
``arange(n)``). Both are handed over broadcastable to the tile: ``[rows, 1]`` and ``[1, cols]``
when queries are the rows (every forward, the flash dQ and the stick-breaking kernels),
``[1, cols]`` and ``[rows, 1]`` when keys are the rows (the flash dK/dV kernel), so a hook writes
``pos_q - pos_k`` and never cares about the orientation. ``params`` is a pointer already moved to this (batch, head) by the strides
:meth:`BiasHook.strides` gives: ``per_head`` ``[heads]`` is read with ``tl.load(params)``, a
``[heads, width]`` table with ``tl.load(params + column)``, ``per_token`` ``[batch, heads, seq]``
with ``tl.load(params + idx)``, ``per_diagonal`` ``[1 or batch, heads, 2 seq - 1]`` with
``tl.load(params + diagonal_offset(idx_q, idx_k))`` (:func:`diagonal_layout`). ``BASE2``: return
``b * log2(e)`` (the flash kernels work in base 2) instead of ``b``. ``OPTIONS``: the hook's
compile-time constants (a ``tl.constexpr`` tuple built by :meth:`BiasHook.kernel_options` from
``ScoreBias.options``; None for a hook without options): each configuration compiles its own
kernel.

``grad(acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS, OPTIONS=None) -> acc``: add this
tile's ``sum dS_ij * d b_ij / d theta`` to the float32 accumulator ``acc`` of shape
``[GRAD_WIDTH]``, ``GRAD_WIDTH = grad_width_fn(rows)`` for the tile's ``rows`` (one partial sum
per row by default); ``QUERY_AXIS`` is the tile axis that indexes queries. Only the kernel that
owns a key block calls it (flash dK/dV, stick-breaking columns), once per tile it visits; it
starts from zeros and stores ``acc`` at ``partials[batch*head, program, :]``, a float32 buffer
``[batch*heads, key blocks, GRAD_WIDTH]`` (no atomics, so deterministic). After the launch
:meth:`BiasHook.reduce_grad` turns the buffer into the parameter's gradient with torch.

Sum along axis 1, the tile's columns: the kernels' tensor-core layouts spread a tile's rows over
the warps and keep each row's columns within one warp, so a sum along axis 1 costs a few
shuffles, where a sum along axis 0 (or over the whole tile) goes through shared memory with a
block-wide barrier at every tile. The rows are keys in the flash dK/dV kernel (``QUERY_AXIS ==
1``: a sum along axis 1 keeps one value per key) and queries in the stick-breaking column kernel
(one value per query row). A learnable value per head (:func:`per_head_total`,
:func:`per_head_interleaved`) is summed the same way in both; a sum per key
(:func:`per_token_columns`) is a sum along axis 1 only in flash, so such a hook is for the flash
family alone. A hook whose sums do not fit one accumulator per program (``grad_per_tile``: the
per-diagonal table, whose tile sums land on distances that move with every tile) gets instead,
as ``acc``, pointers to slots of its own (``GRAD_WIDTH`` floats each, at :func:`tile_slot`),
stores its sums there and returns ``acc``. The slots are per square sub-tile of side ``G``: a
tile whose rows are keys (``QUERY_AXIS == 1``) may hold ``R`` key sub-blocks of ``G`` keys
stacked along its rows (``[R G, G]``, the flash dK/dV kernel's tall tiles) and ``acc`` is then
``[R]``, one slot per sub-tile; a tile whose rows are queries is square and ``acc`` is ``[1]``.
A sub-tile the buffer has no slot for (wholly above a causal diagonal, past the last key, or
with a far reach in a group whose diagonals all lie past it) gets a scratch slot that nothing
reads.

``dS_ij = d loss / d logit_ij`` is the matrix the backward kernels already form (softmax:
``P (dP - delta)``; stick-breaking: ``dz``).

A ``per_token`` bias ``b_ij = a_i - a_j`` (FoX) also has a query side, ``d loss / d a_i =
sum_j dS_ij``. Under softmax each row of ``dS`` sums to 0 in exact arithmetic, but not in the
kernels: ``delta_i = dO_i . O_i`` comes from the forward's ``O``, built from ``P`` rounded to
16 bits, while ``dS`` uses the backward's float32 ``P``. Dropping the row sums leaves each row's
leftover in the gradient, and FoX's reverse cumulative sum over the sequence adds them up (in
bf16 about 0.03 of the gradient's scale at 200 tokens, 10x PyTorch under autocast). With
``query_row_sums`` the flash dQ kernel, which walks each query's keys, adds them: the
gradient is then the exact derivative of ``a_i - a_j`` for the ``dS`` the kernels formed.

``factor(idx_q, idx_k, pos_q, pos_k, params, OPTIONS=None) -> tile`` (optional, float32, same
arguments): ``e^b_ij`` itself, for a bias with ``e^b`` in ``(0, 1]`` and bounded away from 0.
The flash kernels then multiply the softmax weights by it instead of adding ``b`` to the logits
(``e^(s + b) = e^s e^b``: the same softmax, and no logarithm per pair when ``b`` is the log of
something cheap); the row maximum they subtract is that of the scores alone, which still bounds
every weight by 1 because ``e^b <= 1``. The stick-breaking kernels always use ``bias``, since
``sigmoid(z + b)`` does not factor. The two forms must agree (``tests/test_kernels_flash.py``
checks each hook's factor against its bias).

``split(idx, pos, ref_idx, ref_pos, params, QUERY, OPTIONS=None) -> vector`` (optional, flash
only): the bias as a sum of a query part and a key part, in base 2. ``idx``, ``pos``: the
indices and positions of one side's tokens (a vector, or one token as scalars: flash's dK/dV);
``ref_idx``, ``ref_pos``: one token (scalars) that both parts count from; ``QUERY``: the query part
``u_i`` (True) or the key part ``w_j`` (False), such that ``b_ij log2(e) = u_i + w_j`` for
every pair with ``j <= ref <= i`` (``split_ordered``: only where positions never decrease
along the sequence, so that ``p_j <= p_i``; ALiBi's ``|p_i - p_j|`` is ``p_i - p_j`` there).
The flash kernels of a causal launch use it in the tiles below the diagonal (the unmasked
loops), counting from a token between the tile's keys and its queries: the first query of the
block (forward, dQ) or the last key (dK/dV). Each part is then computed once per tile, one
vector per side, and goes into the exponent's multiply-add (``s c + w_j`` per pair; ``u_i``
once per row, with the row's maximum or log-sum-exp) instead of the bias's own arithmetic per
pair; the diagonal band still calls ``bias``. Counted from a token between key and query, a
part is no larger than the bias itself when it grows with the distance (ALiBi's, FoX's), so
the split rounds as the bias does. The two forms must agree (``tests/test_kernels_flash.py``).

``far(params, reach, OPTIONS=None) -> scalar`` (optional, flash only, causal launches): the
bias, in base 2, of every pair at least ``reach`` tokens apart (``i - j >= reach``; ``reach`` a
run-time int the caller gives with the tensor, ``ScoreBias.far_reach``), where the bias no
longer changes with the distance (T5's last bucket: every distance past ``max_distance``). The
flash kernels of a causal launch walk the tiles whose every pair lies that far in a loop of
their own with no bias at all, as plain attention does, and put the constant into the running
maximum (forward) or the log-sum-exp (backward) once per row; a long sequence has almost all
its tiles there. The dQ kernel, which visits every pair once, sums ``dS`` over every pair
``reach`` or more apart, far tiles or not, and the hook's own gradient leaves the far tiles
out; ``far_reduce(grad, sums, reach, shape) -> grad`` (torch; ``sums`` ``[batch, heads]``)
puts the sums where the tensor holds the constant, in place of what the hook gave there.

Writing a hook
--------------
In the encoding's file, behind ``if kernels_available():``, write its ``bias`` (and, with a
learnable tensor, ``grad``) as ``@triton.jit`` functions of the contract above, wrap them in a
:class:`BiasHook` with one of the reductions below, return ``ScoreBias(hook, tensor)`` from the
record's ``kernel_bias`` and list the hook in the record's ``kernel_hooks``. The kernels' loops do
not change: they call whatever function they are given. A bias that is a function of the distance
``p_i - p_j`` alone needs no Triton at all: give the record a ``distance_bias`` written in torch
and the kernels read it from :data:`DIAGONAL_TABLE`.

Per-token biases and the normaliser: ``c_i`` of ``b_ij = c_i - c_j`` would also receive the row
sum ``sum_j dS_ij``, which is exactly 0 under softmax (``sum_j P_ij (dP_ij - delta_i) =
delta_i - delta_i``, as ``delta_i = sum_j P_ij dP_ij`` and each row of ``P`` sums to 1); a
constant per row does not change a softmax. Stick-breaking has no such identity (a row's weights
need not sum to 1), so a per-token hook that relies on it (FoX's) is for the flash family only,
like T5's buckets, whose options the stick-breaking kernels do not take (``BiasHook.families``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from .fast_math import LN2, LOG2E, fast_log2

__all__ = [
    "DIAGONAL_TABLE",
    "FAMILIES",
    "BiasHook",
    "GradTiles",
    "diagonal_sums",
    "diagonal_far_reduce",
    "diagonal_table_bias",
    "diagonal_table_far",
    "diagonal_table_grad",
    "exposb_distance_bias",
    "exposb_distance_factor",
    "linear_distance_bias",
    "linear_distance_grad",
    "linear_distance_split",
    "per_head_interleaved",
    "per_head_slots",
    "per_head_total",
    "per_token_columns",
    "t5_bucket_thresholds",
    "t5_buckets_bias",
    "t5_buckets_grad",
    "t5_kernel_options",
    "tile_slot",
    "tile_slot_count",
]

FAMILIES: tuple[str, ...] = ("flash", "stick_breaking")


# --------------------------------------------------------------------------------------------
# The hook object
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradTiles:
    """How a per-tile gradient buffer is laid out: one slot per square (sub-)tile of ``block``
    tokens, ``num_blocks`` of them along each axis, ``sides`` 1 (causal: query block >= key
    block) or 2 (bidirectional); ``rows``: the rows of slots per side (:func:`tile_slot`), all
    ``ceil(num_blocks / 2)`` by default. Fewer keep only the groups ``t < rows``: a causal
    launch with a far reach, whose later groups' sums all land on diagonals past the reach
    (:func:`diagonal_far_reduce` replaces those)."""

    block: int
    num_blocks: int
    sides: int
    rows: int | None = None

    @property
    def kept_rows(self) -> int:
        full = (self.num_blocks + 1) // 2
        return full if self.rows is None else min(self.rows, full)


@dataclass(frozen=True)
class BiasHook:
    """One score bias, as the kernels see it.

    ``name``: a label (reports, error messages); ``formula``: ``b_ij`` in words. ``bias`` /
    ``grad`` / ``factor``: the ``@triton.jit`` functions of the contract above (``grad`` None:
    the bias has no learnable tensor; ``factor`` None: no factor form). ``param``: the tensor it
    reads: ``"per_head"`` (float ``[heads]``, or ``[heads, width]`` with ``width`` given by
    :attr:`width`), ``"per_token"`` (float ``[batch, heads, seq]``), ``"per_diagonal"`` (float
    ``[1 or batch, heads, 2 seq - 1]``, one value per ``i - j``) or None. ``reduce``: ``(partials,
    batch, heads, shape, tiles) -> grad`` (see the reductions below). ``options``: the names of
    its compile-time options (``ScoreBias.options``), turned into the kernels' ``BIAS_OPTIONS``
    tuple by ``to_kernel``; ``example_options`` are valid ones (for the report).
    ``grad_width_fn(block_rows, options)``: the accumulator width for tiles of ``block_rows`` rows
    (default: one partial sum per row; see the contract). ``grad_per_tile``: the gradient is
    written per square sub-tile (see the contract). ``families``: the kernel families that take it.
    ``query_row_sums``: a ``per_token`` bias of the form ``b_ij = a_i - a_j`` whose query side
    ``d loss / d a_i = sum_j dS_ij`` is added by the flash dQ kernel (see below). ``split``:
    the bias as a query part plus a key part (see the contract), valid for every pair or, with
    ``split_ordered``, for pairs with ``p_j <= p_i``. ``far`` / ``far_reduce``: the constant
    bias of pairs at least a given number of tokens apart, and where its gradient goes (see the
    contract).
    """

    name: str
    formula: str
    bias: object
    grad: object | None = None
    factor: object | None = None
    param: str | None = None
    reduce: Callable | None = None
    options: tuple[str, ...] = ()
    to_kernel: Callable[[Mapping], tuple] | None = None
    width: Callable[[Mapping], int] | None = None
    grad_width_fn: Callable[[int, Mapping], int] | None = None
    grad_per_tile: bool = False
    families: tuple[str, ...] = FAMILIES
    example_options: Mapping[str, object] = field(default_factory=dict)
    query_row_sums: bool = False
    split: object | None = None
    split_ordered: bool = False
    far: object | None = None
    far_reduce: Callable | None = None

    def __post_init__(self) -> None:
        if self.param not in (None, "per_head", "per_token", "per_diagonal"):
            raise ValueError(
                f"hook {self.name!r}: param must be None, 'per_head', 'per_token' or "
                f"'per_diagonal', got {self.param!r}"
            )
        if (self.grad is None) != (self.reduce is None):
            raise ValueError(f"hook {self.name!r}: give grad and reduce together, or neither")
        if self.grad is not None and self.param is None:
            raise ValueError(f"hook {self.name!r}: a gradient needs a tensor to flow into")
        unknown = set(self.families) - set(FAMILIES)
        if unknown or not self.families:
            raise ValueError(f"hook {self.name!r}: families must be among {FAMILIES}")
        if self.query_row_sums and (self.param != "per_token" or self.families != ("flash",)):
            raise ValueError(
                f"hook {self.name!r}: query_row_sums needs a per_token tensor and the flash "
                "family alone (the flash dQ kernel forms the row sums)"
            )
        if self.split is not None and self.factor is not None:
            raise ValueError(f"hook {self.name!r}: give a split form or a factor form, not both")
        if self.far is not None and (self.split is not None or self.factor is not None):
            raise ValueError(
                f"hook {self.name!r}: a far constant works on the plain loop's logits; it "
                "cannot be combined with a split or a factor form"
            )
        if self.far is not None and self.query_row_sums:
            raise ValueError(f"hook {self.name!r}: a far constant takes no query row sums")
        if self.far is not None and self.grad is not None and self.far_reduce is None:
            raise ValueError(
                f"hook {self.name!r}: a far constant with a gradient needs far_reduce (where "
                "the far tiles' sum of dS goes)"
            )

    def kernel_options(self, options: Mapping | None) -> tuple | None:
        """The ``BIAS_OPTIONS`` constexpr of a launch (None for a hook without options)."""
        options = dict(options or {})
        if set(options) != set(self.options):
            missing = sorted(set(self.options) - set(options))
            unknown = sorted(set(options) - set(self.options))
            raise ValueError(
                f"the score bias {self.name!r} ({self.formula}) takes the options "
                f"{list(self.options)}; missing {missing}, unknown {unknown}"
            )
        return self.to_kernel(options) if self.options else None

    def tensor_shape(self, batch: int, heads: int, seq: int, options=None) -> tuple[int, ...]:
        """The shape of the tensor it reads (a leading 1 of ``per_diagonal`` is also allowed)."""
        if self.param == "per_token":
            return (batch, heads, seq)
        if self.param == "per_diagonal":
            return (batch, heads, 2 * seq - 1)
        if self.width is not None:
            return (heads, self.width(dict(options or {})))
        return (heads,)

    def check_tensor(self, tensor, *, batch: int, heads: int, seq: int, device, options=None):
        """Raise a ValueError/TypeError saying what is wrong with the tensor it reads."""
        if self.param is None:
            if tensor is not None:
                raise ValueError(
                    f"the score bias {self.name!r} ({self.formula}) takes no per_head tensor"
                )
            return
        want = self.tensor_shape(batch, heads, seq, options)
        axes = {
            "per_token": "batch, heads, seq",
            "per_diagonal": "1 or batch, heads, 2 seq - 1",
        }.get(self.param, "heads, width" if self.width is not None else "heads")
        what = f"{self.param} [{axes}] = {list(want)}"
        if tensor is None:
            raise ValueError(f"the score bias {self.name!r} ({self.formula}) needs {what}")
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError(
                f"the score bias {self.name!r} needs a floating-point {what}, got "
                f"{getattr(tensor, 'dtype', type(tensor).__name__)}"
            )
        shape = tuple(tensor.shape)
        shared = self.param == "per_diagonal" and shape == (1, *want[1:])
        if shape != want and not shared:
            raise ValueError(
                f"the score bias {self.name!r}: {self.param} must have shape [{axes}] = "
                f"{list(want)}, got {shape}"
            )
        if tensor.device != device:
            raise ValueError(f"{self.param} must be on {device}, got {tensor.device}")

    def strides(self, tensor: torch.Tensor) -> tuple[int, int]:
        """``(stride_b, stride_h)`` of the contiguous float32 tensor the kernels read."""
        if self.param == "per_token":
            return tensor.stride(0), tensor.stride(1)
        if self.param == "per_diagonal":  # the strides of its kernel layout
            return diagonal_layout_strides(tensor.shape)
        return 0, tensor.stride(0)  # per_head: one row per head, shared by the batch

    def pointer(self, tensor: torch.Tensor) -> torch.Tensor:
        """What the kernels get as ``params`` (before the per-(batch, head) strides): the
        tensor itself, or for ``per_diagonal`` its copy laid out for reads of four consecutive
        diagonals at a time (:func:`diagonal_layout`), read at ``diagonal_offset(i, j)``."""
        if self.param == "per_diagonal":
            return diagonal_layout(tensor)
        return tensor

    def grad_width(self, block_rows: int, options: Mapping | None = None) -> int:
        """Width of the gradient accumulator for tiles of ``block_rows`` rows (keys in the flash
        dK/dV kernel, queries in the stick-breaking column kernel), per program, or per slot
        with ``grad_per_tile`` (``block_rows`` then the side of the square sub-tiles); default:
        one per row."""
        if self.grad_width_fn is None:
            return block_rows
        return self.grad_width_fn(block_rows, dict(options or {}))

    def reduce_grad(
        self, partials: torch.Tensor, batch: int, heads: int, shape, tiles: GradTiles | None
    ) -> torch.Tensor:
        """The parameter's gradient (``shape``) from the kernel's buffer (``[batch*heads,
        blocks, width]``, or ``[batch*heads, tile slots, width]`` with ``grad_per_tile``)."""
        if self.reduce is None:
            raise ValueError(f"the score bias {self.name!r} has no learnable tensor")
        return self.reduce(partials, batch, heads, tuple(shape), tiles)


# --------------------------------------------------------------------------------------------
# Reductions of the gradient buffer (torch, after the launch; deterministic)
# --------------------------------------------------------------------------------------------


def per_head_total(partials, batch: int, heads: int, shape, tiles=None) -> torch.Tensor:
    """``[batch*heads, blocks, width]`` -> ``[heads]``: everything of a head summed (a bias
    with one learnable value per head, whatever the accumulator's width)."""
    return partials.view(batch, heads, -1).sum(dim=(0, 2))


def per_head_interleaved(partials, batch: int, heads: int, shape, tiles=None) -> torch.Tensor:
    """``[batch*heads, blocks, width]`` -> ``[heads, n]`` (``shape`` ``[heads, n]``): the
    accumulator holds ``n`` sums per row, interleaved (``acc[n r + k]``: row ``r``'s sum for
    value ``k``, built with ``tl.interleave``), and every row's ``k``-th sum is added up."""
    return partials.view(batch, heads, -1, shape[-1]).sum(dim=(0, 2))


def per_head_slots(partials, batch: int, heads: int, shape, tiles=None) -> torch.Tensor:
    """``[batch*heads, blocks, width]`` -> ``[heads, shape[-1]]``: one sum per slot of the
    accumulator (a ``[heads, width]`` table; slots past its width, padding to a power of two,
    are dropped)."""
    width = partials.shape[-1]
    return partials.view(batch, heads, -1, width).sum(dim=(0, 2))[:, : shape[-1]]


def per_token_columns(partials, batch: int, heads: int, shape, tiles=None) -> torch.Tensor:
    """``[batch*heads, key blocks, block]`` -> ``[batch, heads, seq]``: one sum per key column,
    laid out by key (``shape``)."""
    return partials.view(batch, heads, -1)[..., : shape[-1]]


def tile_slot_count(tiles: GradTiles) -> int:
    """The number of per-tile slots of one (batch, head) (see :func:`tile_slot`)."""
    return tiles.sides * tiles.kept_rows * (tiles.num_blocks + 1)


@triton.jit
def tile_slot(key_block, query_block, num_blocks, side):
    """The slot of the tile (``key_block``, ``query_block``) in a per-tile gradient buffer.

    Tiles are grouped by ``t = |query_block - key_block|`` and by ``side`` (0: the query block is
    at or after the key block; 1: before it; the stick-breaking kernels' right stick uses 1 for
    its diagonal tile too). Group ``t`` has ``num_blocks - t`` tiles, numbered by the smaller block
    index; groups ``t`` and ``num_blocks - 1 - t`` share a row of ``num_blocks + 1`` slots, so a
    side takes ``ceil(num_blocks / 2)`` rows and torch sums each group with two masked sums
    (:func:`diagonal_sums`). A buffer of fewer rows (``GradTiles.rows``, causal) holds the
    groups ``t`` below its row count in the same places."""
    t = tl.abs(query_block - key_block)
    i = tl.minimum(query_block, key_block)
    first = 2 * t < num_blocks
    row = tl.where(first, t, num_blocks - 1 - t)
    col = tl.where(first, i, t + 1 + i)
    rows = (num_blocks + 1) // 2
    return (side * rows + row) * (num_blocks + 1) + col


def diagonal_sums(partials, batch: int, heads: int, shape, tiles: GradTiles) -> torch.Tensor:
    """Per-tile diagonal sums -> the gradient of a ``per_diagonal`` table ``shape`` = ``[1 or
    batch, heads, 2 seq - 1]`` (index ``i - j + seq - 1``).

    Each tile stored two vectors of ``block`` sums (:func:`diagonal_table_grad`): ``lo[u]`` for
    ``i - j = c - block + 1 + u`` and ``hi[u]`` for ``i - j = c + 1 + u``, ``c`` the difference of
    the tile's first query and first key. Tiles of group ``t`` (:func:`tile_slot`) have ``c = t
    block`` (side 0) or ``-t block`` (side 1): their sums are added per group, then laid on the
    diagonals. Only torch sums; deterministic.
    """
    block, m, sides = tiles.block, tiles.num_blocks, tiles.sides
    rows = tiles.kept_rows
    x = partials.view(batch * heads, sides, rows, m + 1, 2, block)
    col = torch.arange(m + 1, device=partials.device)
    first = (col[None, :] < (m - torch.arange(rows, device=partials.device))[:, None])[
        :, :, None, None
    ]  # [rows, m + 1, 1, 1]: the slot belongs to group `row`, not to group `m - 1 - row`
    by_first = torch.where(first, x, 0.0).sum(3)  # [bh, sides, rows, 2, block]
    if rows == (m + 1) // 2:
        by_second = torch.where(first, 0.0, x).sum(3)
        groups = torch.cat((by_first, by_second.flip(2)[:, :, m % 2 :]), dim=2)  # t = 0..m-1
    else:  # only the groups t < rows were kept (a causal launch's band)
        groups = torch.cat((by_first, by_first.new_zeros(*by_first.shape[:2], m - rows,
                                                         *by_first.shape[3:])), dim=2)  # fmt: skip
    # Chunk j holds the diagonals j*block - block + 1 .. j*block, for j = -(m-1) .. m.
    chunks = torch.zeros(batch * heads, 2 * m, block, dtype=partials.dtype, device=partials.device)
    chunks[:, m - 1 : 2 * m - 1] += groups[:, 0, :, 0]  # side 0, lo: chunk t
    chunks[:, m : 2 * m] += groups[:, 0, :, 1]  # side 0, hi: chunk t + 1
    if sides == 2:
        chunks[:, :m] += groups[:, 1, :, 0].flip(1)  # side 1, lo: chunk -t
        chunks[:, 1 : m + 1] += groups[:, 1, :, 1].flip(1)  # side 1, hi: chunk 1 - t
    seq = (shape[-1] + 1) // 2
    start = m * block - seq  # the flat index of diagonal -(seq - 1)
    per_diagonal = chunks.view(batch, heads, -1)[..., start : start + 2 * seq - 1]
    if shape[0] == 1 and batch > 1:
        per_diagonal = per_diagonal.sum(0, keepdim=True)
    return per_diagonal


# --------------------------------------------------------------------------------------------
# The per-diagonal table: b_ij = table[b, h, i - j] (any bias of the distance, built by torch)
# --------------------------------------------------------------------------------------------


@triton.jit
def diagonal_table_bias(
    idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """``table[i - j]`` (times ``log2 e`` if ``BASE2``); ``params`` points at this (batch,
    head)'s row of the table in its kernel layout (:func:`diagonal_layout`)."""
    value = tl.load(params + diagonal_offset(idx_q, idx_k))
    if BASE2:
        value = value * LOG2E
    return value


@triton.jit
def diagonal_table_grad(
    acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
    OPTIONS: tl.constexpr = None,
):  # fmt: skip
    """The sums of each square ``G x G`` sub-tile of ``dS`` along its diagonals, stored at its
    slot (``acc``: ``[R]`` slot pointers, ``2 G`` floats each): ``lo[u]`` for ``i - j = c - G +
    1 + u``, ``hi[u]`` for ``i - j = c + 1 + u`` (``c``: the sub-tile's first query minus its
    first key). With ``QUERY_AXIS == 1`` (rows are keys) ``ds`` is ``[R G, G]``: ``R`` sub-tiles
    of consecutive keys; otherwise it is square and ``R = 1``.

    Column ``t`` of a circularly shifted copy of a sub-tile (row ``r`` rotated by ``r + t + 1``)
    holds, in each row, one element of diagonal ``c + t + 1`` or, past the wrap-around, of
    ``c + t + 1 - G``: two masked column sums give both vectors, no atomics."""
    G: tl.constexpr = ds.shape[1]
    R: tl.constexpr = ds.shape[0] // G
    tl.static_assert(QUERY_AXIS == 1 or R == 1, "a tile whose rows are queries must be square")
    if R == 1:  # one square tile (its code stays two-dimensional; acc [1] broadcasts)
        sub = ds
        r = tl.arange(0, G)[:, None]
        t = tl.arange(0, G)[None, :]
        u = tl.arange(0, G)
        slot = acc
    else:  # sub-tile s: rows s G .. s G + G - 1
        sub = tl.reshape(ds, [R, G, G])
        r = tl.arange(0, G)[None, :, None]
        t = tl.arange(0, G)[None, None, :]
        u = tl.arange(0, G)[None, :]
        slot = acc[:, None]
    if QUERY_AXIS == 1:  # rows are keys: i - j - c = column - row
        index = (r + t + 1) & (G - 1)
        wrapped = r + t + 1 >= G
    else:  # rows are queries: i - j - c = row - column
        index = (r - t - 1 + G) & (G - 1)
        wrapped = r < t + 1
    shifted = tl.gather(sub, tl.broadcast_to(index, sub.shape), axis=len(sub.shape) - 1)
    tl.store(slot + u, tl.sum(tl.where(wrapped, shifted, 0.0), axis=len(sub.shape) - 2))
    tl.store(slot + G + u, tl.sum(tl.where(wrapped, 0.0, shifted), axis=len(sub.shape) - 2))
    return acc


@triton.jit
def diagonal_table_far(params, reach, OPTIONS: tl.constexpr = None):
    """``table[reach] log2 e``: the bias of every pair with ``i - j >= reach``, for a table that
    no longer changes past that diagonal (``ScoreBias.far_reach``)."""
    return tl.load(params + diagonal_offset(reach, 0)) * LOG2E


def diagonal_far_reduce(grad, sums, reach: int, shape) -> torch.Tensor:
    """The table's gradient (``[1 or batch, heads, 2 seq - 1]``) with the sums of ``dS`` over
    every pair at least ``reach`` apart (``[batch, heads]``) on diagonal ``reach`` and nothing
    on the later ones: every diagonal from there on holds the same value, so its gradient is
    counted once, on the first of them (the near tiles' per-diagonal sums there are
    replaced)."""
    seq = (shape[-1] + 1) // 2
    if shape[0] == 1:
        sums = sums.sum(0, keepdim=True)
    grad = grad.clone()
    grad[..., seq - 1 + reach :] = 0.0
    grad[..., seq - 1 + reach] = sums
    return grad


DIAGONAL_TABLE = BiasHook(
    name="diagonal_table",
    formula="b_ij = table[b, h, i - j] (any bias of the distance, tabulated by torch)",
    bias=diagonal_table_bias,
    grad=diagonal_table_grad,
    param="per_diagonal",
    reduce=diagonal_sums,
    grad_width_fn=lambda block_rows, options: 2 * block_rows,
    grad_per_tile=True,
    far=diagonal_table_far,
    far_reduce=diagonal_far_reduce,
)
"""The kernels' per-distance path: a bias read per pair from a ``[1 or batch, heads, 2 seq - 1]``
table indexed by ``i - j``, its gradient the sums of ``dS`` along each diagonal (per tile, then
torch). With ``ScoreBias.far_reach`` (a table that stops changing there, such as T5's past its
last bucket), the flash kernels of a causal launch take the tiles past that diagonal as one
constant. :func:`course_lib.kernel_hooks.distance_score_bias` builds the table from an encoding's
``distance_bias`` and maps ``i - j`` to the distance of the positions."""


# --------------------------------------------------------------------------------------------
# linear_distance: b_ij = -per_head[h] * |p_i - p_j|  (ALiBi, RSE)
# --------------------------------------------------------------------------------------------


@triton.jit
def linear_distance_bias(
    idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """``-slope * |p_i - p_j|`` with ``slope = per_head[h]`` (times ``log2 e`` if ``BASE2``)."""
    slope = tl.load(params)
    if BASE2:
        slope = slope * LOG2E
    return -slope * tl.abs(pos_q - pos_k)


@triton.jit
def linear_distance_split(
    idx, pos, ref_idx, ref_pos, params, QUERY: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """Where ``p_j <= p_i``, ``-slope (p_i - p_j) log2 e`` = ``u_i + w_j`` with ``u_i = -slope
    log2(e) (p_i - p_ref)`` (``QUERY``) and ``w_j = slope log2(e) (p_j - p_ref)``: one multiply
    per token, none per pair."""
    value = (tl.load(params) * LOG2E) * (pos - ref_pos)
    if QUERY:
        value = -value
    return value


@triton.jit
def linear_distance_grad(
    acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
    OPTIONS: tl.constexpr = None,
):  # fmt: skip
    """Per row of the tile: ``acc_r -= sum_c dS_rc |p_i - p_j|`` (as ``d b_ij / d slope`` is
    ``-|p_i - p_j|``; :func:`grad_distance`); :func:`per_head_total` adds up every row."""
    return acc - tl.sum(ds * grad_distance(pos_q, pos_k, QUERY_AXIS), axis=1)


# --------------------------------------------------------------------------------------------
# exposb_distance: b_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))  (ExpoSB; chapter 04)
# --------------------------------------------------------------------------------------------


@triton.jit
def exposb_distance_factor(idx_q, idx_k, pos_q, pos_k, params, OPTIONS: tl.constexpr = None):
    """``0.7 + 0.3 exp(-0.005 |p_i - p_j|)``: the factor form of ``exposb_distance_bias`` (one
    ``exp2`` and a multiply-add per pair, no logarithm; ``exp(-0.005 d) = exp2(-0.005 log2(e)
    d)``)."""
    return 0.7 + 0.3 * tl.exp2(-0.007213475204444817 * tl.abs(pos_q - pos_k))


@triton.jit
def exposb_distance_bias(
    idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """``log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))`` (``log2`` of the same factor if ``BASE2``)."""
    # the factor lies in (0.7, 1], so the approximate log2 (one instruction, see fast_math) is
    # enough
    log2_factor = fast_log2(exposb_distance_factor(idx_q, idx_k, pos_q, pos_k, params))
    if BASE2:
        return log2_factor
    return log2_factor * LN2


# --------------------------------------------------------------------------------------------
# t5_buckets: b_ij = per_head[h, bucket(p_j - p_i)]  (T5; chapter 06)
# --------------------------------------------------------------------------------------------
#
# T5's bucket of the distance n (per direction, B buckets, E = B // 2 exact ones) is
# n for n < E, else min(E + floor(log(n / E) / log(max_distance / E) * (B - E)), B - 1).
# Where that floor lands on an integer (n = 16 of B = 16, max_distance = 128 gives exactly 2),
# the last bit of log and of the division decide the bucket, and a GPU's log is not the CPU's.
# So the kernel does not take the log: the launcher computes, once per configuration and with
# the reference's own float32 arithmetic, the smallest distance of each log-spaced bucket
# (``t5_bucket_thresholds``), and the tile counts how many of them n has reached:
# bucket(n) = min(n, E) + #{u : n >= thresholds[u]}. Exact, and no transcendental in the loop.


def _t5_far_buckets(distance: torch.Tensor, per_direction: int, max_distance: int):
    """The log-spaced part of T5's bucket for ``distance >= exact`` (float32, as in T5)."""
    exact = per_direction // 2
    ratio = distance.clamp(min=exact).to(torch.float32) / exact
    log_part = torch.log(ratio) / math.log(max_distance / exact) * (per_direction - exact)
    return (exact + log_part.to(torch.int64)).clamp(max=per_direction - 1)


def t5_bucket_thresholds(num_buckets: int, max_distance: int, bidirectional: bool):
    """The smallest distance of each log-spaced bucket ``E+1 .. B-1``, a tuple of ints.

    ``B`` buckets per direction (``num_buckets / 2`` if bidirectional), ``E = B // 2``; the
    bucket ``E`` starts at distance ``E`` and needs no threshold.
    """
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    exact = per_direction // 2
    distances = torch.arange(exact, max_distance + 1)
    far = _t5_far_buckets(distances, per_direction, max_distance)
    if bool((far[1:] < far[:-1]).any()):  # float32 log is monotone; this guards the search
        raise RuntimeError("T5 buckets are not monotone in the distance")
    wanted = torch.arange(exact + 1, per_direction)
    starts = distances[torch.searchsorted(far, wanted)]
    return tuple(int(x) for x in starts)


@triton.jit
def _t5_bucket(back, OPTIONS: tl.constexpr):
    """T5's bucket of ``back = p_i - p_j`` (float32 tile, integral values) -> int32 tile.

    ``OPTIONS = (num_buckets, bidirectional, thresholds)``: bidirectional, keys after the query
    (``back < 0``) use the upper half of the buckets; unidirectional, they share bucket 0.
    """
    NUM_BUCKETS: tl.constexpr = OPTIONS[0]
    BIDIRECTIONAL: tl.constexpr = OPTIONS[1]
    THRESHOLDS: tl.constexpr = OPTIONS[2]
    if BIDIRECTIONAL:
        PER_DIRECTION: tl.constexpr = NUM_BUCKETS // 2
        offset = tl.where(back < 0.0, PER_DIRECTION, 0)
        distance = tl.abs(back)
    else:
        PER_DIRECTION: tl.constexpr = NUM_BUCKETS
        offset = 0
        distance = tl.maximum(back, 0.0)
    EXACT: tl.constexpr = PER_DIRECTION // 2
    bucket = tl.minimum(distance, EXACT).to(tl.int32)
    for u in tl.static_range(len(THRESHOLDS)):
        bucket += (distance >= THRESHOLDS[u]).to(tl.int32)
    return offset + bucket


@triton.jit
def t5_buckets_bias(
    idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """``table[h, bucket(p_j - p_i)]`` (times ``log2 e`` if ``BASE2``); ``params`` points at
    this head's row of the ``[heads, num_buckets]`` table."""
    value = tl.load(params + _t5_bucket(pos_q - pos_k, OPTIONS))
    if BASE2:
        value = value * LOG2E
    return value


@triton.jit
def t5_buckets_grad(
    acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
    OPTIONS: tl.constexpr = None,
):  # fmt: skip
    """Per bucket: ``acc_u += sum_{ij : bucket = u} dS_ij`` (``d b_ij / d table[h, u]`` is 1
    where the bucket is ``u``). Only the buckets present in the tile are visited (one or two
    far from the diagonal)."""
    bucket = _t5_bucket(pos_q - pos_k, OPTIONS)
    slots = tl.arange(0, acc.shape[0])
    for u in range(tl.min(bucket), tl.max(bucket) + 1):
        total = tl.sum(tl.where(bucket == u, ds, 0.0))
        acc += tl.where(slots == u, total, 0.0)
    return acc


def t5_kernel_options(options: Mapping) -> tuple:
    """``ScoreBias.options`` of T5's hook -> the kernel's ``(num_buckets, bidirectional,
    thresholds)``."""
    num_buckets = options["num_buckets"]
    max_distance = options["max_distance"]
    bidirectional = options["bidirectional"]
    if not isinstance(bidirectional, bool):
        raise TypeError(f"t5_buckets: bidirectional must be True or False, got {bidirectional!r}")
    for name, value in (("num_buckets", num_buckets), ("max_distance", max_distance)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"t5_buckets: {name} must be an int, got {value!r}")
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    if (bidirectional and num_buckets % 2) or per_direction < 2:
        raise ValueError(
            f"t5_buckets: num_buckets={num_buckets} (bidirectional={bidirectional}) must give at "
            "least 2 buckets per direction, and be even when bidirectional"
        )
    if max_distance <= per_direction // 2:
        raise ValueError(
            f"t5_buckets: max_distance ({max_distance}) must exceed the number of exact buckets "
            f"({per_direction // 2})"
        )
    if max_distance > 1 << 24:
        raise ValueError(f"t5_buckets: max_distance must be <= 2^24, got {max_distance}")
    return (
        num_buckets,
        bidirectional,
        t5_bucket_thresholds(num_buckets, max_distance, bidirectional),
    )


# --------------------------------------------------------------------------------------------
# The distance a gradient needs (last in this file: a jit function's line is in its compile key)
# --------------------------------------------------------------------------------------------


@triton.jit
def grad_distance(pos_q, pos_k, QUERY_AXIS: tl.constexpr):
    """``|p_i - p_j|`` for a hook's gradient (``pos_*`` as the hook got them). Where the tile's
    rows are queries (``QUERY_AXIS == 0``: the stick-breaking column kernel) it is written
    ``|p_j - p_i|``, apart from the bias's ``|p_i - p_j|``, so the compiler computes it again
    instead of keeping the bias's float32 distance tile alive across the kernel's dK and dV
    products, where at the 255-register limit it spilled at every tile (sm_90; README, "On a
    GPU", gives the counts). Flash's dK/dV kernel, whose rows are keys, keeps the bias's form:
    written apart there, it issued one or two more memory instructions per iteration."""
    if QUERY_AXIS == 0:
        distance = tl.abs(pos_k - pos_q)
    else:
        distance = tl.abs(pos_q - pos_k)
    return distance


__all__ += ["grad_distance"]


# --------------------------------------------------------------------------------------------
# The per-diagonal table's kernel layout (after grad_distance, so no jit function above moves)
# --------------------------------------------------------------------------------------------


@triton.jit
def _quarter(index):
    """``index // 4`` for an index ``>= 0``, divided as unsigned (one shift, where a signed
    division rounds negatives toward zero with two more instructions)."""
    return (tl.cast(index, tl.uint32) // 4).to(tl.int32)


@triton.jit
def diagonal_offset(idx_q, idx_k):
    """Where ``table[i - j]`` lies in the kernel layout of a per-diagonal table
    (:func:`diagonal_layout`), for ``idx_q`` / ``idx_k`` as a hook gets them (``[rows, 1]`` /
    ``[1, cols]`` where queries are the rows, ``[1, cols]`` / ``[rows, 1]`` where keys are, or
    scalars): ``32 q + 16 o + 4 s + r``, the row part and the column part apart, so a tile
    costs one add per pair, as ``i - j`` did. Along a row, four columns ``4 c .. 4 c + 3`` are
    four consecutive floats at an offset divisible by 4, so the compiler can read them with one
    16-byte load where ``params + (i - j)`` ran backwards and took one load per pair."""
    if len(idx_q.shape) == 2 and idx_q.shape[0] == 1:  # keys are the rows: o = 1
        rows = 16 + 4 * idx_k - 48 * _quarter(idx_k)  # 16 + 4 (j % 4) - 32 (j // 4)
        cols = idx_q + 28 * _quarter(idx_q)  # 32 (i // 4) + i % 4
    else:  # queries are the rows (or scalars): o = 0
        rows = 4 * idx_q - 48 * _quarter(idx_q)  # 4 (i % 4) - 32 (i // 4)
        cols = idx_k + 28 * _quarter(idx_k)  # 32 (j // 4) + j % 4
    return rows + cols


DIAGONAL_KEY_PAD = 1024
"""Tokens past the sequence's end that :func:`diagonal_layout` covers: the stick-breaking
kernels hand a hook their key indices unclamped (a clamp would cost the table its 16-byte
reads), so a key block may reach that far past the last key, whose pairs the kernels mask."""


def _diagonal_reach(seq: int) -> tuple[int, int]:
    """``(low, high)``: ``q = j // 4 - i // 4`` (or its negative) lies in ``[-low, high]`` for
    ``i < seq`` and ``j < seq + DIAGONAL_KEY_PAD``, in either orientation."""
    reach = (seq - 1 + DIAGONAL_KEY_PAD) // 4
    return reach, reach


def diagonal_layout_strides(shape) -> tuple[int, int]:
    """``(stride_b, stride_h)`` of :func:`diagonal_layout` for a table of ``shape`` ``[1 or
    batch, heads, 2 seq - 1]`` (0 for a table the batch shares); multiples of 32."""
    low, high = _diagonal_reach((shape[-1] + 1) // 2)
    width = 32 * (low + high + 1)
    return (0 if shape[0] == 1 else shape[1] * width), width


def diagonal_layout(table: torch.Tensor) -> torch.Tensor:
    """A per-diagonal table ``[1 or batch, heads, 2 seq - 1]`` (index ``i - j + seq - 1``) laid
    out as the kernels read it: per (batch, head), ``[low + high + 1, 2, 4, 4]`` floats ``(q,
    o, s, r)`` for ``q`` in ``[-low, high]`` (:func:`_diagonal_reach`), flattened, the pointer
    at ``q = 0``.

    * ``o = 0`` (queries are the tile's rows; ``q = j // 4 - i // 4``, ``s = i % 4``, ``r = j %
      4``): ``table[s - r - 4 q]``;
    * ``o = 1`` (keys are the rows; ``q = i // 4 - j // 4``, ``s = j % 4``, ``r = i % 4``):
      ``table[4 q + r - s]``;

    both ``table[i - j]``, so that four consecutive keys (``o = 0``) or queries (``o = 1``) of a
    row are four consecutive floats. Eight copies of each value (one per ``(o, s)``), built by
    one gather per call (``O(seq)`` per head; its index is built once per length and device);
    entries no pair reads repeat the table's ends.
    """
    low = _diagonal_reach((table.shape[-1] + 1) // 2)[0]
    index = _layout_index(table.shape[-1], table.device)
    laid = table.index_select(-1, index).contiguous()  # [1 or batch, heads, 32 (low + high + 1)]
    return laid.reshape(-1)[32 * low :]


# Imported here, not at the top: Triton's compile key holds the line each ``@triton.jit``
# function starts on, so a line added above them would make every kernel compile again.
from functools import lru_cache  # noqa: E402


@lru_cache(maxsize=16)
def _layout_index(diagonals: int, device: torch.device) -> torch.Tensor:
    """The table column each entry of :func:`diagonal_layout` holds (flat ``[q, o, s, r]``):
    the same for every call at one length, so kept (the 16 latest lengths and devices) rather
    than built per call, which on a GPU costs a handful of small launches on the host."""
    seq = (diagonals + 1) // 2
    low, high = _diagonal_reach(seq)
    q = torch.arange(-low, high + 1, device=device).view(-1, 1, 1, 1)
    o = torch.arange(2, device=device).view(1, 2, 1, 1)
    s = torch.arange(4, device=device).view(1, 1, 4, 1)
    r = torch.arange(4, device=device).view(1, 1, 1, 4)
    distance = torch.where(o == 0, s - r - 4 * q, 4 * q + r - s)
    return (distance + seq - 1).clamp(0, diagonals - 1).reshape(-1)


__all__ += ["DIAGONAL_KEY_PAD", "diagonal_offset", "diagonal_layout", "diagonal_layout_strides"]
