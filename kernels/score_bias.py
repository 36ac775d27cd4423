"""Score-bias hooks: the ``b_ij`` a fused kernel adds to its scores, chosen by name.

The kernels know no encoding. A caller names a hook (a key of :data:`SCORE_BIAS_HOOKS`); the
launcher passes the hook's ``@triton.jit`` functions to the kernel as ``tl.constexpr`` arguments
(``BIAS_FN``, and ``BIAS_GRAD_FN`` when a gradient is wanted), so each hook is compiled into its
own kernel and no bias (``BIAS_FN=None``) costs nothing. For query ``i`` and key ``j``::

    logit_ij = scale * q'_i . k'_j + b_ij

Hooks of the course (``p`` = the position ids, float32 in the tile):

* ``"linear_distance"``: ``b_ij = -per_head[h] * |p_i - p_j|`` (RSE's learned penalty, ALiBi);
  gradient ``d loss / d per_head[h] = -sum_ij dS_ij |p_i - p_j|``.
* ``"offset_linear_distance"``: ``b_ij = -per_head[h, 0] * |p_i - p_j| + per_head[h, 1]`` (RSE's
  penalty with a learned per-head stick bias: a ``[heads, 2]`` table of ``(lambda_h, beta_h)``);
  gradients ``d loss / d per_head[h, 0] = -sum_ij dS_ij |p_i - p_j|`` and
  ``d loss / d per_head[h, 1] = sum_ij dS_ij``.
* ``"exposb_distance"``: ``b_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))`` (ExpoSB's distance
  factor, added as a log to the logits), no parameter. It also has a factor form (below): the
  flash kernels multiply their softmax weights by ``0.7 + 0.3 exp(-0.005 |p_i - p_j|)`` and take
  no logarithm.
* ``"t5_buckets"``: ``b_ij = per_head[h, bucket(p_j - p_i)]`` (T5's relative bias: a learned
  table ``[heads, num_buckets]``); the bucket is computed in the tile from the positions, with
  the options ``num_buckets``, ``max_distance``, ``bidirectional`` compiled in. Gradient
  ``d loss / d per_head[h, u] = sum_{ij : bucket = u} dS_ij``.
* ``"cumulative_log_gates"``: ``b_ij = per_token[b, h, i] - per_token[b, h, j]`` with
  ``per_token = c = cumsum(log f)`` (FoX's forget gates: ``c_i - c_j = sum_{l=j+1..i} log f_l``).
  Gradient ``d loss / d c_j = -sum_i dS_ij`` (softmax only, see below).

``dS_ij = d loss / d logit_ij`` is the matrix the backward kernels already form (softmax:
``P (dP - delta)``; stick-breaking: ``dz``).

The hook contract
-----------------
``bias(idx_q, idx_k, pos_q, pos_k, params, BASE2, OPTIONS=None) -> tile`` (float32). ``idx_*``
are token indices (int, in ``[0, seq)``: the kernels clamp the tail of a block to the last token,
so a hook may load ``params + idx`` without a mask), ``pos_*`` positions (float32), handed over
already broadcastable to the tile: ``[rows, 1]`` and ``[1, cols]`` when queries are the rows
(every forward, the flash dQ and the stick-breaking kernels), ``[1, cols]`` and ``[rows, 1]``
when keys are the rows (the flash dK/dV kernel). So a hook writes ``pos_q - pos_k`` and never
cares about the orientation. ``params`` is a pointer already moved to this (batch, head) by the
strides :meth:`BiasHook.strides` gives: ``per_head`` ``[heads]`` is read with
``tl.load(params)``, a ``[heads, width]`` table with ``tl.load(params + column)``, ``per_token``
``[batch, heads, seq]`` with ``tl.load(params + idx)``. ``BASE2``: return ``b * log2(e)`` (the
flash kernels work in base 2) instead of ``b``. ``OPTIONS``: the hook's compile-time constants
(a ``tl.constexpr`` tuple built by :meth:`BiasHook.kernel_options` from
``ScoreBias.options``; None for a hook without options), passed by the flash kernels as their
``BIAS_OPTIONS``: each configuration compiles its own kernel.

``grad(acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS, OPTIONS=None) -> acc``: add this
tile's ``sum dS_ij * d b_ij / d theta`` to the float32 accumulator ``acc`` of shape
``[GRAD_WIDTH]``; ``QUERY_AXIS`` is the tile axis that indexes queries (reduce over it to keep one
value per key). Only the kernel that owns a key block calls it (flash dK/dV, stick-breaking
columns), once per tile it visits; it starts from zeros and stores ``acc`` at
``partials[batch*head, program, :]``, a float32 buffer ``[batch*heads, key blocks, GRAD_WIDTH]``
(no atomics, so deterministic). After the launch :meth:`BiasHook.reduce_grad` turns the buffer
into the parameter's gradient with torch. ``"linear_distance"`` keeps one partial sum per key
column (``GRAD_WIDTH`` = the key block) so its inner loop reduces only over the query axis, and
sums them all afterwards; ``"cumulative_log_gates"`` does the same and lays the columns out as
``[batch, heads, seq]``; ``"t5_buckets"`` keeps one partial sum per bucket (``GRAD_WIDTH`` =
``num_buckets`` rounded up to a power of two); ``"offset_linear_distance"`` keeps two, slope and
offset (``GRAD_WIDTH`` = 2, each tile reduced whole), reduced to ``[heads, 2]``.

``factor(idx_q, idx_k, pos_q, pos_k, params, OPTIONS=None) -> tile`` (optional, float32, same
arguments): ``e^b_ij`` itself, for a bias with ``e^b`` in ``(0, 1]`` and bounded away from 0.
The flash kernels then multiply the softmax weights by it instead of adding ``b`` to the logits
(``e^(s + b) = e^s e^b``: the same softmax, and no logarithm per pair when ``b`` is the log of
something cheap); the row maximum they subtract is that of the scores alone, which still bounds
every weight by 1 because ``e^b <= 1``. The stick-breaking kernels always use ``bias``, since
``sigmoid(z + b)`` does not factor. The two forms must agree (``tests/test_kernels_flash.py``
checks each hook's factor against its bias).

Adding a hook
-------------
Write its ``bias`` (and, if it has learnable tensors, ``grad``) below, add a :class:`BiasHook`
to :data:`SCORE_BIAS_HOOKS` and its name to ``limits.SCORE_BIAS_HOOK_NAMES``. The kernels' loops
do not change: they call whatever function they are given.

Per-token biases and the normaliser: ``c_i`` of ``b_ij = c_i - c_j`` would also receive the row
sum ``sum_j dS_ij``, which is exactly 0 under softmax (``sum_j P_ij (dP_ij - delta_i) =
delta_i - delta_i``, as ``delta_i = sum_j P_ij dP_ij`` and each row of ``P`` sums to 1); a
constant per row does not change a softmax. Stick-breaking has no such identity (a row's weights
need not sum to 1), so ``"cumulative_log_gates"`` is for the flash family only, like
``"t5_buckets"``, whose options the stick-breaking kernels do not take (``BiasHook.families``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from .fast_math import fast_log2
from .limits import SCORE_BIAS_HOOK_NAMES

__all__ = [
    "BiasHook",
    "SCORE_BIAS_HOOKS",
    "cumulative_log_gates_bias",
    "cumulative_log_gates_grad",
    "exposb_distance_bias",
    "exposb_distance_factor",
    "get_hook",
    "linear_distance_bias",
    "linear_distance_grad",
    "offset_linear_distance_bias",
    "offset_linear_distance_grad",
    "t5_bucket_thresholds",
    "t5_buckets_bias",
    "t5_buckets_grad",
]

LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------
# linear_distance: b_ij = -per_head[h] * |p_i - p_j|
# --------------------------------------------------------------------------------------------


@triton.jit
def linear_distance_bias(
    idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """``-slope * |p_i - p_j|`` with ``slope = per_head[h]`` (times ``log2 e`` if ``BASE2``)."""
    slope = tl.load(params)
    if BASE2:
        slope = slope * 1.4426950408889634
    return -slope * tl.abs(pos_q - pos_k)


@triton.jit
def linear_distance_grad(
    acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
    OPTIONS: tl.constexpr = None,
):  # fmt: skip
    """Per key column: ``acc_j -= sum_i dS_ij |p_i - p_j|`` (as ``d b_ij / d slope``
    is ``-|p_i - p_j|``)."""
    return acc - tl.sum(ds * tl.abs(pos_q - pos_k), axis=QUERY_AXIS)


def _sum_per_head(partials: torch.Tensor, batch: int, heads: int, shape=None) -> torch.Tensor:
    """``[batch*heads, blocks, width]`` partial sums -> ``[heads]``."""
    return partials.view(batch, heads, -1).sum(dim=(0, 2))


# --------------------------------------------------------------------------------------------
# offset_linear_distance: b_ij = -per_head[h, 0] * |p_i - p_j| + per_head[h, 1]
# --------------------------------------------------------------------------------------------


@triton.jit
def offset_linear_distance_bias(
    idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """``-slope * |p_i - p_j| + offset`` with ``(slope, offset) = per_head[h, :]`` (times
    ``log2 e`` if ``BASE2``); ``params`` points at this head's row of the ``[heads, 2]`` table."""
    slope = tl.load(params)
    offset = tl.load(params + 1)
    if BASE2:
        slope = slope * 1.4426950408889634
        offset = offset * 1.4426950408889634
    return offset - slope * tl.abs(pos_q - pos_k)


@triton.jit
def offset_linear_distance_grad(
    acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
    OPTIONS: tl.constexpr = None,
):  # fmt: skip
    """``acc[0] -= sum_ij dS_ij |p_i - p_j|`` (``d b_ij / d slope = -|p_i - p_j|``) and
    ``acc[1] += sum_ij dS_ij`` (``d b_ij / d offset = 1``): the whole tile in two sums."""
    d_slope = -tl.sum(ds * tl.abs(pos_q - pos_k))
    d_offset = tl.sum(ds)
    slots = tl.arange(0, acc.shape[0])
    return acc + tl.where(slots == 0, d_slope, d_offset)


def _sum_per_head_pair(partials: torch.Tensor, batch: int, heads: int, shape=None):
    """``[batch*heads, blocks, 2]`` partial sums -> ``[heads, 2]``."""
    return partials.view(batch, heads, -1, 2).sum(dim=(0, 2))


# --------------------------------------------------------------------------------------------
# exposb_distance: b_ij = log(0.7 + 0.3 exp(-0.005 |p_i - p_j|))
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
    return log2_factor * 0.6931471805599453


# --------------------------------------------------------------------------------------------
# t5_buckets: b_ij = per_head[h, bucket(p_j - p_i)]
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
        value = value * 1.4426950408889634
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


def _t5_options(options: Mapping) -> tuple:
    """``ScoreBias.options`` -> the kernel's ``(num_buckets, bidirectional, thresholds)``."""
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


def _sum_per_bucket(partials: torch.Tensor, batch: int, heads: int, shape) -> torch.Tensor:
    """``[batch*heads, blocks, width]`` -> ``[heads, num_buckets]`` (``shape`` of the table)."""
    width = partials.shape[-1]
    return partials.view(batch, heads, -1, width).sum(dim=(0, 2))[:, : shape[-1]]


# --------------------------------------------------------------------------------------------
# cumulative_log_gates: b_ij = c_i - c_j (FoX: c = cumsum(log f), c_i - c_j = sum_{j<l<=i} log f_l)
# --------------------------------------------------------------------------------------------


@triton.jit
def cumulative_log_gates_bias(
    idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
):
    """``c_i - c_j`` (times ``log2 e`` if ``BASE2``); ``params`` points at this (batch, head)'s
    ``c`` ``[seq]``, read at the token indices."""
    value = tl.load(params + idx_q) - tl.load(params + idx_k)
    if BASE2:
        value = value * 1.4426950408889634
    return value


@triton.jit
def cumulative_log_gates_grad(
    acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
    OPTIONS: tl.constexpr = None,
):  # fmt: skip
    """Per key column: ``acc_j -= sum_i dS_ij`` (``d b_ij / d c_j = -1``). The query side
    ``d loss / d c_i = sum_j dS_ij`` is exactly 0 under softmax (each row of ``dS`` sums to 0:
    adding a constant to a row does not change a softmax), so it is not formed."""
    return acc - tl.sum(ds, axis=QUERY_AXIS)


def _per_token_columns(partials: torch.Tensor, batch: int, heads: int, shape) -> torch.Tensor:
    """``[batch*heads, key blocks, block]`` -> ``[batch, heads, seq]`` (``shape``)."""
    return partials.view(batch, heads, -1)[..., : shape[-1]]


# --------------------------------------------------------------------------------------------
# The table of hooks
# --------------------------------------------------------------------------------------------

FAMILIES: tuple[str, ...] = ("flash", "stick_breaking")


@dataclass(frozen=True)
class BiasHook:
    """One named score bias.

    ``bias`` / ``grad`` / ``factor``: the ``@triton.jit`` functions of the contract above
    (``grad`` None: the bias has no learnable tensor; ``factor`` None: no factor form).
    ``param``: the tensor it reads: ``"per_head"`` (float ``[heads]``, or ``[heads, width]``
    with ``width`` given by :attr:`width`), ``"per_token"`` (float ``[batch, heads, seq]``) or
    None. ``formula``: ``b_ij`` in words, for error messages
    and docs. ``options``: the names of its compile-time options (``ScoreBias.options``), turned
    into the kernels' ``BIAS_OPTIONS`` tuple by ``to_kernel``. ``width(options)``: the table width
    of a 2-D ``per_head``. ``grad_width_fn(block_keys, options)``: the accumulator width (default:
    one partial sum per key column). ``reduce``: ``(partials, batch, heads, shape) -> grad``.
    ``families``: the kernel families that take it.
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
    families: tuple[str, ...] = FAMILIES
    example_options: Mapping[str, object] = field(default_factory=dict)

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

    def check_tensor(self, tensor, *, batch: int, heads: int, seq: int, device, options=None):
        """Raise a ValueError/TypeError saying what is wrong with the tensor it reads."""
        if self.param is None:
            if tensor is not None:
                raise ValueError(
                    f"the score bias {self.name!r} ({self.formula}) takes no per_head tensor"
                )
            return
        if self.param == "per_token":
            want, axes = (batch, heads, seq), "batch, heads, seq"
        elif self.width is not None:
            want, axes = (heads, self.width(dict(options or {}))), "heads, width"
        else:
            want, axes = (heads,), "heads"
        what = f"{self.param} [{axes}] = {list(want)}"
        if tensor is None:
            raise ValueError(f"the score bias {self.name!r} ({self.formula}) needs {what}")
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError(
                f"the score bias {self.name!r} needs a floating-point {what}, got "
                f"{getattr(tensor, 'dtype', type(tensor).__name__)}"
            )
        if tuple(tensor.shape) != want:
            raise ValueError(
                f"the score bias {self.name!r}: {self.param} must have shape [{axes}] = "
                f"{list(want)}, got {tuple(tensor.shape)}"
            )
        if tensor.device != device:
            raise ValueError(f"{self.param} must be on {device}, got {tensor.device}")

    def strides(self, tensor: torch.Tensor) -> tuple[int, int]:
        """``(stride_b, stride_h)`` of the contiguous float32 tensor the kernels read."""
        if self.param == "per_token":
            return tensor.stride(0), tensor.stride(1)
        return 0, tensor.stride(0)  # per_head: one row per head, shared by the batch

    def grad_width(self, block_keys: int, options: Mapping | None = None) -> int:
        """Width of the per-program gradient accumulator (default: one per key column)."""
        if self.grad_width_fn is None:
            return block_keys
        return self.grad_width_fn(block_keys, dict(options or {}))

    def reduce_grad(
        self, partials: torch.Tensor, batch: int, heads: int, shape=None
    ) -> torch.Tensor:
        """The parameter's gradient (``shape``) from the kernel's ``[batch*heads, blocks,
        width]`` buffer."""
        if self.reduce is None:
            raise ValueError(f"the score bias {self.name!r} has no learnable tensor")
        return self.reduce(partials, batch, heads, shape)


SCORE_BIAS_HOOKS: dict[str, BiasHook] = {
    "linear_distance": BiasHook(
        name="linear_distance",
        formula="b_ij = -per_head[h] * |p_i - p_j|",
        bias=linear_distance_bias,
        grad=linear_distance_grad,
        param="per_head",
        reduce=_sum_per_head,
    ),
    "offset_linear_distance": BiasHook(
        name="offset_linear_distance",
        formula="b_ij = -per_head[h, 0] * |p_i - p_j| + per_head[h, 1]",
        bias=offset_linear_distance_bias,
        grad=offset_linear_distance_grad,
        param="per_head",
        reduce=_sum_per_head_pair,
        width=lambda options: 2,
        grad_width_fn=lambda block_keys, options: 2,
    ),
    "exposb_distance": BiasHook(
        name="exposb_distance",
        formula="b_ij = log(0.7 + 0.3 * exp(-0.005 * |p_i - p_j|))",
        bias=exposb_distance_bias,
        factor=exposb_distance_factor,
    ),
    "t5_buckets": BiasHook(
        name="t5_buckets",
        formula="b_ij = per_head[h, bucket(p_j - p_i)] (T5's relative position buckets)",
        bias=t5_buckets_bias,
        grad=t5_buckets_grad,
        param="per_head",
        reduce=_sum_per_bucket,
        options=("num_buckets", "max_distance", "bidirectional"),
        to_kernel=_t5_options,
        width=lambda options: options["num_buckets"],
        grad_width_fn=lambda block_keys, options: triton.next_power_of_2(options["num_buckets"]),
        families=("flash",),
        example_options={"num_buckets": 32, "max_distance": 128, "bidirectional": False},
    ),
    "cumulative_log_gates": BiasHook(
        name="cumulative_log_gates",
        formula="b_ij = per_token[i] - per_token[j] (FoX: cumulative log forget gates)",
        bias=cumulative_log_gates_bias,
        grad=cumulative_log_gates_grad,
        param="per_token",
        reduce=_per_token_columns,
        families=("flash",),
    ),
}
if tuple(SCORE_BIAS_HOOKS) != SCORE_BIAS_HOOK_NAMES:
    raise RuntimeError("SCORE_BIAS_HOOKS and limits.SCORE_BIAS_HOOK_NAMES must list the same names")


def get_hook(name: str) -> BiasHook:
    """The hook called ``name``; an unknown name lists the valid ones."""
    try:
        return SCORE_BIAS_HOOKS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown score-bias hook {name!r}; valid: {', '.join(map(repr, SCORE_BIAS_HOOKS))}"
        ) from None
