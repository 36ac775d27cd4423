"""KERPLE, kernelized relative positional embedding (Chi, Fan, Ramadge & Rudnicky 2022) (chapter 06).

No position in q or k: like ALiBi, each head adds a penalty of the distance to its scores, but
one shaped by two learned numbers per head. KERPLE starts from a conditionally positive definite
kernel of the distance, shifted into a bias (Chi et al. 2022, "KERPLE: Kernelized Relative
Positional Embedding for Length Extrapolation", NeurIPS 2022, section 4, the two variants
evaluated there)::

    logarithmic:  b_ij = -r1_h * log(1 + r2_h * |p_i - p_j|)      r1_h > 0, r2_h > 0
    power:        b_ij = -r1_h * |p_i - p_j| ** r2_h              r1_h > 0, 0 < r2_h <= 2

The power variant with ``r2 = 1`` is ALiBi with a learned slope; the logarithmic one keeps
falling with distance but ever more slowly, the variant the paper finds best at extrapolation.
Both are symmetric in ``p_i - p_j`` (the paper's causal models see only ``i >= j``; a
bidirectional layer sees the same penalty on both sides, like symmetric ALiBi).

Constraints come from the parametrisation: ``r1 = softplus(raw)``, ``r2 = softplus(raw)``
(logarithmic) or ``r2 = 2 sigmoid(raw)`` (power), so no step of the optimiser leaves the allowed
set. (The authors' code projects instead, clamping the parameters to at least ``1e-2``, and
``r2`` of the power variant to at most 2, after each step.) Initial values are the authors'
uniform draws per head, floored at ``1e-2``: ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)`` (logarithmic) and
``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)`` (power).

The bias is a function of the distance alone, written here in plain torch (``distance_bias``):
the reference builds ``b`` from it. The fused kernels of both families compute it per pair from
the positions, in registers, with the kernel hooks below (one per variant: ``log2`` of
``1 + r2 d``, or ``2^(r2 log2 d)``, one or two special-function instructions per pair and no
table), and sum its two parameters' gradients per row of each tile::

    log:    d b / d r1 = -log(1 + r2 d)      d b / d r2 = -r1 d / (1 + r2 d)
    power:  d b / d r1 = -d^r2               d b / d r2 = -r1 d^r2 log d     (0 at d = 0)

(``d = |p_i - p_j|``), which autograd carries on to ``r1`` and ``r2``. Reading the bias from a
table of one value per distance, as a ``distance_bias`` alone would have the kernels do, gathers
it per pair from memory and sums its gradient per diagonal: several times slower by the course's
static GPU model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.call_scope import call_scope
from course_lib.checks import (
    check_choice,
    check_float_tensor,
    check_integer_tensor,
    refuse_if,
)
from course_lib.kernel_hooks import ScoreBias
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register
from course_lib.runtime import kernels_available

__all__ = ["KERPLE_HOOKS", "KERPLE_VARIANTS", "KERPLEAttention", "kerple_bias"]

KERPLE_VARIANTS: tuple[str, ...] = ("log", "power")
_FLOOR = 1e-2  # the authors' smallest parameter value


def kerple_bias(
    distances: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, variant: str = "log"
) -> torch.Tensor:
    """KERPLE's bias of each distance: ``[...]`` (integer ``p_i - p_j``), ``[H]``, ``[H]`` ->
    ``[H, ...]`` in float32 (float64 for float64 parameters), whatever their dtype.

    ``log``: ``-r1 log(1 + r2 |d|)``; ``power``: ``-r1 |d|^r2`` (0 at ``d = 0``, where the
    exponent's gradient ``|d|^r2 log|d|`` is taken as its limit, 0). ``r1`` and ``r2`` must be
    finite and > 0, as ``attention(method="kerple")`` requires (a negative ``r2`` would give
    ``-inf`` and NaN); the power variant's ``r2 > 2``, which attention refuses (no longer
    conditionally positive definite), is evaluated here, to be looked at.
    """
    check_integer_tensor(distances, "distances (p_i - p_j)")
    for name, value in (("r1", r1), ("r2", r2)):
        if not isinstance(value, torch.Tensor) or value.dim() != 1:
            raise ValueError(
                f"KERPLE {name} must be a 1-D tensor [heads], got "
                f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}"
            )
    if r1.shape != r2.shape:
        raise ValueError(
            f"KERPLE r1 and r2 must hold one value per head each, got shapes {tuple(r1.shape)} "
            f"and {tuple(r2.shape)}"
        )
    check_choice("KERPLE variant", variant, KERPLE_VARIANTS)
    with call_scope():  # its checks read back together, once
        _check_kerple_values(r1, r2, "log")  # power's r2 > 2 stays a formula to look at
    return _kerple_bias(distances, r1, r2, variant)


def _kerple_bias(distances, r1, r2, variant):
    """:func:`kerple_bias` of arguments already checked, in float32 (float64 if ``r1`` or ``r2``
    is), whatever their dtype."""
    shape = (-1, *([1] * distances.dim()))
    dtype = torch.promote_types(torch.promote_types(r1.dtype, r2.dtype), torch.float32)
    r1, r2 = r1.to(dtype).view(shape), r2.to(dtype).view(shape)
    distance = distances.abs().to(dtype)
    if variant == "log":
        return -r1 * torch.log1p(r2 * distance)
    positive = distance > 0
    safe = torch.where(positive, distance, torch.ones_like(distance))  # no 0 ** r2 in autograd
    return -r1 * torch.where(positive, safe**r2, torch.zeros_like(distance))


# -- hooks of the registry record ----------------------------------------------------------------
def kerple_distance_bias(distances: torch.Tensor, params: dict) -> torch.Tensor:
    """-r1_h log(1 + r2_h |p_i - p_j|) (or -r1_h |p_i - p_j|^r2_h), two learned numbers per head"""
    return _kerple_bias(distances, params["r1"], params["r2"], params["variant"])


# -- the fused kernels' hooks (Triton only) -------------------------------------------------------
KERPLE_HOOKS: dict[str, object] = {}
"""Variant -> the kernels' hook; ``per_head`` is ``[heads, 2]`` = ``(r1, r2)``. Empty without
Triton."""
if kernels_available():
    import triton
    import triton.language as tl

    from course_lib.kernels.fast_math import LN2, LOG2E, fast_log2
    from course_lib.kernels.score_bias import BiasHook, per_head_interleaved

    @triton.jit
    def _distance_again(pos_q, pos_k):
        """``|p_i - p_j|`` for a gradient, written as ``|p_j - p_i|`` so that the compiler does
        not reuse the bias's tiles of the same pair: the kernels call ``grad`` after two
        products with ``dS``, and a reused distance and logarithm stay live across them, two
        float32 tiles more per thread (ptxas then reported 388 bytes of spill stores for the
        sm_90 dK/dV kernel at head_dim 64, against 56). Recomputed, they cost one more ``lg2``
        per pair."""
        return tl.abs(pos_k - pos_q)

    @triton.jit
    def _add_sums(acc, d_r1, d_r2):
        """``acc`` (``[2 rows]``: ``r1``'s and ``r2``'s sums interleaved, one pair per row of
        the tile) plus the tile's terms summed along its columns, within each warp (keys are
        the rows in flash's dK/dV kernel, queries in stick-breaking's column kernel)."""
        return acc + tl.interleave(tl.sum(d_r1, axis=1), tl.sum(d_r2, axis=1))

    @triton.jit
    def _log_term(distance, r2):
        """``log2(1 + r2 d)``: one approximate ``lg2`` per pair (see ``fast_math``)."""
        return fast_log2(1.0 + r2 * distance)

    @triton.jit
    def kerple_log_bias(
        idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
    ):
        """``-r1 log(1 + r2 |p_i - p_j|)`` (``-r1 log2(...)`` if ``BASE2``), ``(r1, r2)`` =
        ``per_head[h, :]``."""
        r1 = tl.load(params)
        if not BASE2:
            r1 = r1 * LN2
        return -r1 * _log_term(tl.abs(pos_q - pos_k), tl.load(params + 1))

    @triton.jit
    def kerple_log_grad(
        acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
        OPTIONS: tl.constexpr = None,
    ):  # fmt: skip
        """Per row ``r`` of the tile (``_add_sums``): ``acc[2 r] += sum_c dS_rc (-log(1 + r2
        d))`` and ``acc[2 r + 1] += sum_c dS_rc (-r1 d / (1 + r2 d))``, ``d = |p_i - p_j|``."""
        r1 = tl.load(params)
        r2 = tl.load(params + 1)
        distance = _distance_again(pos_q, pos_k)
        d_r1 = ds * (_log_term(distance, r2) * -LN2)
        d_r2 = ds * (tl.fdiv(distance, 1.0 + r2 * distance, ieee_rounding=False) * -r1)
        return _add_sums(acc, d_r1, d_r2)

    @triton.jit
    def _power_terms(distance, r2):
        """``d^r2`` and ``log2 d`` (0 at ``d = 0``, where ``d^r2`` is 0 too)."""
        positive = distance > 0.0
        log2_d = tl.where(positive, fast_log2(tl.where(positive, distance, 1.0)), 0.0)
        return tl.where(positive, tl.exp2(r2 * log2_d), 0.0), log2_d

    @triton.jit
    def kerple_power_bias(
        idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
    ):
        """``-r1 |p_i - p_j|^r2`` (times ``log2 e`` if ``BASE2``), ``(r1, r2)`` =
        ``per_head[h, :]``."""
        r1 = tl.load(params)
        if BASE2:
            r1 = r1 * LOG2E
        powered, _ = _power_terms(tl.abs(pos_q - pos_k), tl.load(params + 1))
        return -r1 * powered

    @triton.jit
    def kerple_power_grad(
        acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
        OPTIONS: tl.constexpr = None,
    ):  # fmt: skip
        """Per row ``r`` of the tile (``_add_sums``): ``acc[2 r] += sum_c dS_rc (-d^r2)`` and
        ``acc[2 r + 1] += sum_c dS_rc (-r1 d^r2 log d)``, ``d = |p_i - p_j|``."""
        r1 = tl.load(params)
        powered, log2_d = _power_terms(_distance_again(pos_q, pos_k), tl.load(params + 1))
        d_r1 = -(ds * powered)
        d_r2 = d_r1 * (log2_d * (LN2 * r1))
        return _add_sums(acc, d_r1, d_r2)

    def _hook(variant: str, formula: str, bias, grad) -> BiasHook:
        """One variant's hook: ``per_head`` ``[heads, 2]``, an accumulator of two floats per row."""
        return BiasHook(
            name=f"kerple_{variant}",
            formula=f"b_ij = {formula}, (r1, r2) = per_head[h, :]",
            bias=bias,
            grad=grad,
            param="per_head",
            reduce=per_head_interleaved,
            width=lambda options: 2,
            grad_width_fn=lambda block_rows, options: 2 * block_rows,
        )

    KERPLE_HOOKS["log"] = _hook(
        "log", "-r1 log(1 + r2 |p_i - p_j|)", kerple_log_bias, kerple_log_grad
    )
    KERPLE_HOOKS["power"] = _hook(
        "power", "-r1 |p_i - p_j|^r2", kerple_power_bias, kerple_power_grad
    )


def kerple_kernel_bias(params: dict, positions: torch.Tensor) -> ScoreBias:
    """The kernels' hook of the variant, reading ``[heads, 2]`` = ``(r1, r2)`` (autograd carries
    its gradient to both)."""
    both = torch.stack((params["r1"], params["r2"]), dim=-1)
    return ScoreBias(KERPLE_HOOKS[params["variant"]], both)


def check_kerple_params(params: dict, *, heads: int, head_dim: int, device, **call) -> None:
    """``r1``, ``r2``: finite floating ``[heads]`` tensors, ``r1 > 0`` and ``r2 > 0`` (``r2 <= 2``
    for the power variant); ``variant`` in :data:`KERPLE_VARIANTS`."""
    variant = check_choice("KERPLE variant", params["variant"], KERPLE_VARIANTS)
    for name in ("r1", "r2"):
        check_float_tensor(params[name], f"KERPLE {name}", "[heads]", device, shape=(heads,))
    _check_kerple_values(params["r1"], params["r2"], variant)


def _check_kerple_values(r1: torch.Tensor, r2: torch.Tensor, variant: str) -> None:
    """Finite floating ``r1``, ``r2``, both > 0 for every head; ``r2 <= 2`` for ``power``
    (queued with the call's other checks: one read for all)."""
    pairs = (("r1", r1), ("r2", r2))
    for name, value in pairs:
        if not value.is_floating_point():
            raise TypeError(f"KERPLE {name} must be a floating-point tensor, got {value.dtype}")
    for name, value in pairs:
        values = value.detach()
        refuse_if(
            ~torch.isfinite(values) | (values <= 0),
            lambda name=name, values=values: ValueError(
                f"KERPLE {name} must be > 0 for every head, and finite (the kernel's "
                f"parameters), got {values.tolist() if values.numel() <= 8 else 'other values'}"
            ),
        )
    if variant == "power":
        refuse_if(
            r2.detach() > 2,
            lambda: ValueError(
                "KERPLE's power variant needs 0 < r2 <= 2 (|d|^r2 is conditionally positive "
                "definite only there)"
            ),
        )


class KERPLEAttention(PositionalSelfAttention):
    """Softmax attention plus KERPLE's learned penalty of the distance, two numbers per head.

    ``variant``: ``"log"`` (default, ``-r1 log(1 + r2 |d|)``) or ``"power"`` (``-r1 |d|^r2``).
    ``r1`` and ``r2`` are ``[num_heads]``, one pair per layer, constrained by their
    parametrisation (see the module docstring). ``max_position_embeddings`` is not used: the
    penalty is defined at every distance.
    """

    encoding = "kerple"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        *,
        variant: str = "log",
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        self.variant = check_choice("KERPLE variant", variant, KERPLE_VARIANTS)
        r1_high, r2_high = (2.0, 1.0) if variant == "log" else (1.0, 2.0)
        r1 = (torch.rand(num_heads) * r1_high).clamp(min=_FLOOR)
        r2 = (torch.rand(num_heads) * r2_high).clamp(min=_FLOOR)
        self.r1_raw = nn.Parameter(torch.log(torch.expm1(r1)))  # softplus^-1
        if variant == "log":
            self.r2_raw = nn.Parameter(torch.log(torch.expm1(r2)))
        else:
            half = (r2 / 2).clamp(max=1 - _FLOOR)
            self.r2_raw = nn.Parameter(torch.log(half / (1 - half)))  # sigmoid^-1

    @property
    def r1(self) -> torch.Tensor:
        """``r1`` per head, ``[heads]``, always > 0."""
        return F.softplus(self.r1_raw)

    @property
    def r2(self) -> torch.Tensor:
        """``r2`` per head, ``[heads]``: > 0, and < 2 for the power variant."""
        if self.variant == "log":
            return F.softplus(self.r2_raw)
        return 2.0 * torch.sigmoid(self.r2_raw)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {"r1": self.r1, "r2": self.r2, "variant": self.variant}

    def reported_values(self) -> dict[str, list[float]]:
        """``r1`` and ``r2`` per head, for results files."""
        return {"r1": self.r1.detach().cpu().tolist(), "r2": self.r2.detach().cpu().tolist()}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, variant={self.variant!r}"


register(
    Encoding(
        name="kerple",
        chapter="06_score_biases",
        summary="a learned penalty -r1 log(1 + r2 |i - j|) per head (or -r1 |i - j|^r2)",
        module=KERPLEAttention,
        color="#e7ba52",
        distance_bias=kerple_distance_bias,
        params={"r1": REQUIRED, "r2": REQUIRED, "variant": "log"},
        check_params=check_kerple_params,
        kernel_bias=kerple_kernel_bias,
        kernel_hooks=tuple(KERPLE_HOOKS.values()),
        relative=True,
        learnable=True,
    )
)
