"""RSE, the implementation report's "RoPE + stick-breaking + distance penalty" (chapter 05).

``z_ij = scale * R(p_i) q_i . R(p_j) k_j - lambda_h |p_i - p_j| (+ beta_h)`` (``lambda_h >= 0``,
learned per head; ``beta_h`` an optional learned per-head stick bias), then stick-breaking weights
instead of softmax.

The module's options take RSE apart, one change at a time (the comparison's ablations):
``penalty_init`` / ``learn_penalty`` (``0.0`` and ``False``: no penalty at all), ``stick_bias_init``
(a negative start makes every key break off a smaller share, so the stick reaches farther keys)
and ``normaliser="softmax"`` (the same scores under softmax: RoPE with a learned, ALiBi-like
penalty; a constant ``beta_h`` cancels under softmax, so it needs the stick).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.checks import check_choice, check_distance_penalty, check_float_tensor
from course_lib.encodings.distance import LINEAR_DISTANCE, linear_distance_bias
from course_lib.encodings.rope import (
    RoPEAttention,
    check_rope_params,
    rope_kernel_tables,
    rope_transform,
)
from course_lib.kernel_hooks import ScoreBias
from course_lib.registry import NORMALISER_NAMES, REQUIRED, Encoding, register
from course_lib.runtime import kernels_available

__all__ = ["RSEAttention"]


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def rse_penalty(
    query_positions: torch.Tensor, key_positions: torch.Tensor, params: dict
) -> torch.Tensor:
    """``-lambda_h |p_i - p_j|`` (a learned linear distance penalty per head), ``+ beta_h`` when
    a ``stick_bias`` ``[heads]`` is given: ``[1|B, H, Nq, Nk]``."""
    bias = linear_distance_bias(query_positions, key_positions, params["distance_penalty"])
    if params["stick_bias"] is not None:
        bias = bias + params["stick_bias"].view(1, -1, 1, 1).to(bias.dtype)
    return bias


# -- the fused kernels' hooks (Triton only) -------------------------------------------------------
OFFSET_LINEAR_DISTANCE = None
"""``b_ij = -per_head[h, 0] * |p_i - p_j| + per_head[h, 1]``: RSE's penalty with its learned
stick bias, a ``[heads, 2]`` table of ``(lambda_h, beta_h)``, in both kernel families. Without a
stick bias RSE uses the shared linear distance hook. None without Triton."""
if kernels_available():
    import triton
    import triton.language as tl

    from course_lib.kernels.fast_math import LOG2E
    from course_lib.kernels.score_bias import BiasHook, grad_distance, per_head_interleaved

    @triton.jit
    def offset_linear_distance_bias(
        idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr, OPTIONS: tl.constexpr = None
    ):
        """``-slope * |p_i - p_j| + offset`` with ``(slope, offset) = per_head[h, :]`` (times
        ``log2 e`` if ``BASE2``); ``params`` points at this head's row of the table."""
        slope = tl.load(params)
        offset = tl.load(params + 1)
        if BASE2:
            slope = slope * LOG2E
            offset = offset * LOG2E
        return offset - slope * tl.abs(pos_q - pos_k)

    @triton.jit
    def offset_linear_distance_grad(
        acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
        OPTIONS: tl.constexpr = None,
    ):  # fmt: skip
        """Per row ``r`` of the tile: ``acc[2 r] -= sum_c dS_rc |p_i - p_j|`` (``d b_ij /
        d slope = -|p_i - p_j|``) and ``acc[2 r + 1] += sum_c dS_rc`` (``d b_ij / d offset =
        1``), summed along the tile's columns, within each warp (the distance: see
        ``grad_distance``, which keeps the bias's tile from living across the products)."""
        d_slope = -tl.sum(ds * grad_distance(pos_q, pos_k, QUERY_AXIS), axis=1)
        return acc + tl.interleave(d_slope, tl.sum(ds, axis=1))

    OFFSET_LINEAR_DISTANCE = BiasHook(
        name="offset_linear_distance",
        formula="b_ij = -per_head[h, 0] * |p_i - p_j| + per_head[h, 1]",
        bias=offset_linear_distance_bias,
        grad=offset_linear_distance_grad,
        param="per_head",
        reduce=per_head_interleaved,
        width=lambda options: 2,
        grad_width_fn=lambda block_rows, options: 2 * block_rows,
    )


def rse_kernel_bias(params: dict, positions: torch.Tensor | None = None) -> ScoreBias:
    """The penalty for the fused kernels: the shared linear distance hook, or
    :data:`OFFSET_LINEAR_DISTANCE` with ``[heads, 2]`` = (lambda_h, beta_h) when there is a
    stick bias."""
    if params["stick_bias"] is None:
        return ScoreBias(LINEAR_DISTANCE, params["distance_penalty"])
    both = torch.stack((params["distance_penalty"], params["stick_bias"]), dim=-1)
    return ScoreBias(OFFSET_LINEAR_DISTANCE, both)


def check_rse_params(params: dict, *, heads: int, head_dim: int, device, **call) -> None:
    """RoPE's checks; ``distance_penalty``: a finite ``[heads]`` tensor of lambda >= 0;
    ``stick_bias``: None or a finite ``[heads]`` tensor."""
    check_rope_params(params, heads=heads, head_dim=head_dim, device=device, **call)
    check_distance_penalty(params["distance_penalty"], heads, device)
    if params["stick_bias"] is not None:
        check_float_tensor(params["stick_bias"], "stick_bias", "[heads]", device, shape=(heads,))


#: ``g``: lambda_h = softplus(g r_h) and beta_h = g b_h for the stored parameters r_h, b_h.
PARAMETER_GAIN = 25.0


class RSEAttention(RoPEAttention):
    """RoPE + learnable distance penalty ``lambda_h * |i - j|`` + stick-breaking.

    ``lambda_h = softplus(g r_h) >= 0``, one per head, initialised to ``penalty_init`` (0.01);
    the stored parameter is ``r_h`` (``distance_penalty_raw``) and ``g = parameter_gain`` (25).
    Adam moves a parameter by about its learning rate per step whatever the gradient's scale,
    so ``g`` multiplies how far ``log lambda`` can travel in a run: with ``g = 1`` a run of the
    comparison (300 steps at 3e-3) keeps lambda within a factor ~1.6 of its start; with
    ``g = 25`` it can reach 1e-3 and 1 from 0.01 at the comparison's smallest learning rate
    (``tests/test_rse_options.py`` runs the optimiser to show it). The stick bias is
    ``beta_h = g b_h`` (``stick_bias_raw``) for the same reason. Options (defaults: RSE as in
    chapter 05):

    * ``learn_penalty=False``: lambda stays at ``penalty_init`` (a buffer; ``0.0`` = no penalty);
    * ``stick_bias_init``: a float adds a learned per-head bias ``beta_h`` to every logit,
      starting there (None: no bias);
    * ``normaliser``: ``"stick_breaking"`` (RSE) or ``"softmax"`` (the same scores under softmax).
    """

    encoding = "rse"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        *,
        penalty_init: float = 0.01,
        learn_penalty: bool = True,
        stick_bias_init: float | None = None,
        normaliser: str = "stick_breaking",
        parameter_gain: float = PARAMETER_GAIN,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        if isinstance(parameter_gain, bool) or not (
            isinstance(parameter_gain, (int, float)) and 0.0 < parameter_gain < float("inf")
        ):
            raise ValueError(f"parameter_gain must be a finite number > 0, got {parameter_gain!r}")
        self.parameter_gain = float(parameter_gain)
        self.penalty_init, self.stick_bias_init = penalty_init, stick_bias_init
        if (
            isinstance(penalty_init, bool)
            or not isinstance(penalty_init, (int, float))
            or not (0.0 <= penalty_init < float("inf"))
        ):
            raise ValueError(f"penalty_init must be a finite number >= 0, got {penalty_init!r}")
        if learn_penalty and penalty_init <= 0.0:
            raise ValueError(
                "a learned penalty is softplus(raw) > 0 and cannot start at 0: use "
                "penalty_init > 0, or learn_penalty=False for a fixed lambda (0.0 = no penalty)"
            )
        init = torch.full((num_heads,), float(penalty_init))
        if learn_penalty:
            raw = torch.log(torch.expm1(init)) / self.parameter_gain
            self.distance_penalty_raw = nn.Parameter(raw)
        else:
            self.register_buffer("fixed_distance_penalty", init)
        if stick_bias_init is None:
            self.stick_bias_raw = None
        elif (
            not isinstance(stick_bias_init, bool)
            and isinstance(stick_bias_init, (int, float))
            and abs(stick_bias_init) < float("inf")
        ):
            start = float(stick_bias_init) / self.parameter_gain
            self.stick_bias_raw = nn.Parameter(torch.full((num_heads,), start))
        else:
            raise ValueError(
                f"stick_bias_init must be None or a finite number, got {stick_bias_init!r}"
            )
        self.normaliser = check_choice("normaliser", normaliser, NORMALISER_NAMES)
        if self.stick_bias_raw is not None and self.normaliser == "softmax":
            raise ValueError(
                "stick_bias_init needs normaliser='stick_breaking': a constant per head cancels "
                "under softmax"
            )

    @property
    def distance_penalty(self) -> torch.Tensor:
        """``lambda`` per head, ``[heads]``, always >= 0."""
        if hasattr(self, "distance_penalty_raw"):
            return F.softplus(self.parameter_gain * self.distance_penalty_raw)
        return self.fixed_distance_penalty

    @property
    def stick_bias(self) -> torch.Tensor | None:
        """``beta`` per head, ``[heads]`` (None without a stick bias)."""
        if self.stick_bias_raw is None:
            return None
        return self.parameter_gain * self.stick_bias_raw

    def reachable_values(self, movement: float) -> dict[str, tuple[float, float]]:
        """The range each learned value can reach when its stored parameter moves by at most
        ``movement`` from its start (about the sum of the learning rates under Adam,
        :func:`course_lib.train.learning_rate_sum`): ``lambda`` in ``[softplus(g r_0 - g m),
        softplus(g r_0 + g m)]``, ``beta`` in ``[beta_0 - g m, beta_0 + g m]``."""
        reach = {}
        step = self.parameter_gain * movement
        if hasattr(self, "distance_penalty_raw"):
            start = math.log(math.expm1(self.penalty_init))
            reach["distance_penalty"] = (_softplus(start - step), _softplus(start + step))
        if self.stick_bias_init is not None:
            reach["stick_bias"] = (self.stick_bias_init - step, self.stick_bias_init + step)
        return reach

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {
            **super().attention_params(hidden_states),
            "distance_penalty": self.distance_penalty,
            "stick_bias": self.stick_bias,
        }

    def reported_values(self) -> dict[str, list[float]]:
        """lambda per head (and beta per head when learned), for results files."""
        values = {"distance_penalty": self.distance_penalty.detach().cpu().tolist()}
        if self.stick_bias is not None:
            values["stick_bias"] = self.stick_bias.detach().cpu().tolist()
        return values


register(
    Encoding(
        name="rse",
        chapter="05_stick_breaking",
        summary="RoPE, a learned linear distance penalty per head, and stick-breaking",
        module=RSEAttention,
        color="#d62728",
        qk_transform=rope_transform,
        score_bias=rse_penalty,
        normaliser="stick_breaking",
        params={
            "base": 10000.0,
            "style": "interleaved",
            "scaling": None,
            "seq_len": None,
            "distance_penalty": REQUIRED,
            "stick_bias": None,
        },
        check_params=check_rse_params,
        kernel_tables=rope_kernel_tables,
        kernel_bias=rse_kernel_bias,
        kernel_hooks=tuple(h for h in (LINEAR_DISTANCE, OFFSET_LINEAR_DISTANCE) if h is not None),
        relative=True,
        distance_only=True,
        learnable=True,
    )
)
