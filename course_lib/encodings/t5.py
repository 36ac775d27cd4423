"""T5's relative position bias: a learned scalar per head and distance bucket (chapter 06).

Raffel et al. 2020 (T5), after the learned relative terms of Shaw et al. 2018. No position in q or
k: each head adds a learned number to its scores, chosen by the bucket of the signed distance
``r = p_j - p_i`` (key minus query)::

    s_ij = scale * q_i . k_j + table[h, bucket(p_j - p_i)]

The buckets (per direction, ``n = |r|``, ``B`` buckets, ``E = B // 2`` exact ones)::

    bucket(n) = n                                                      if n < E
              = min(E + floor(log(n / E) / log(max_distance / E) * (B - E)), B - 1)   otherwise

so near distances each get a bucket of their own and far ones share log-spaced buckets, the last
of which holds every distance from about ``max_distance`` on. Bidirectional (T5's encoder):
``B = num_buckets / 2`` per direction, keys before the query (``r <= 0``) use buckets
``0..B-1`` and keys after it (``r > 0``) ``B..2B-1``. Unidirectional (T5's decoder):
``B = num_buckets`` for the keys before the query, and a key after it shares bucket 0 with
distance 0 (a causal mask hides it anyway).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from course_lib.checks import check_float_tensor, is_integer
from course_lib.kernel_hooks import ScoreBias, distance_score_bias
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register
from course_lib.runtime import kernels_available

__all__ = [
    "relative_position_bucket",
    "t5_bias",
    "t5_parameter_count",
    "T5Attention",
]

T5_NUM_BUCKETS = 32  # T5's defaults
T5_MAX_DISTANCE = 128


def check_bucket_options(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    """Raise a clear error for a bucket layout that cannot work (see the module docstring)."""
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be True or False, got {bidirectional!r}")
    for name, value in (("num_buckets", num_buckets), ("max_distance", max_distance)):
        if not is_integer(value):
            raise TypeError(f"{name} must be an integer, got {value!r}")
    if bidirectional and num_buckets % 2:
        raise ValueError(
            f"num_buckets must be even when bidirectional (half of the buckets for each "
            f"direction), got {num_buckets}"
        )
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    if per_direction < 2:
        raise ValueError(
            f"num_buckets={num_buckets} leaves {per_direction} bucket(s) per direction; at least "
            f"2 are needed (one exact, one log-spaced): num_buckets >= {4 if bidirectional else 2}"
        )
    exact = per_direction // 2
    if max_distance <= exact:
        raise ValueError(
            f"max_distance ({max_distance}) must be larger than the number of exact buckets "
            f"({exact} = {per_direction} buckets per direction // 2): the log-spaced buckets "
            "cover the distances from there to max_distance"
        )


def relative_position_bucket(
    relative_position: torch.Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = T5_NUM_BUCKETS,
    max_distance: int = T5_MAX_DISTANCE,
) -> torch.Tensor:
    """T5's bucket of each signed distance ``relative_position = key_position - query_position``.

    Integer tensor of any shape -> int64 tensor of the same shape, values in
    ``[0, num_buckets)``. The formula is in the module docstring; the log-spaced part is computed
    in float32, as in T5.
    """
    check_bucket_options(num_buckets, max_distance, bidirectional)
    if not isinstance(relative_position, torch.Tensor):
        relative_position = torch.as_tensor(relative_position)
    if relative_position.is_floating_point() or relative_position.dtype == torch.bool:
        raise TypeError(
            f"relative_position must be an integer tensor, got {relative_position.dtype}"
        )
    back = -relative_position.long()  # n = p_i - p_j: how far back the key is
    if bidirectional:
        per_direction = num_buckets // 2
        offset = torch.where(back < 0, per_direction, 0)  # keys after the query: upper half
        distance = back.abs()
    else:
        per_direction = num_buckets
        offset = torch.zeros_like(back)
        distance = back.clamp(min=0)  # keys after the query share bucket 0 with distance 0
    exact = per_direction // 2
    # Log-spaced buckets for n >= exact (clamped below so that log never sees 0).
    ratio = distance.clamp(min=exact).to(torch.float32) / exact
    log_part = torch.log(ratio) / math.log(max_distance / exact) * (per_direction - exact)
    far = (exact + log_part.to(torch.int64)).clamp(max=per_direction - 1)
    return offset + torch.where(distance < exact, distance, far)


def t5_distance_bias(distances: torch.Tensor, params: dict) -> torch.Tensor:
    """table[h, bucket(p_j - p_i)], a learned scalar per head and distance bucket

    ``distances`` (``p_i - p_j``, int64, any shape) -> ``[H, *distances.shape]`` in the table's
    dtype (so its gradient is the sum of ``dS`` over the entries of each bucket).
    """
    table = params["bias_table"]  # [H, num_buckets]
    buckets = relative_position_bucket(
        -distances,  # key minus query
        bidirectional=params["bidirectional"],
        num_buckets=table.shape[-1],
        max_distance=params["max_distance"],
    )
    return table[:, buckets]


def t5_distance_reach(params: dict) -> int:
    """The distance ``n = p_i - p_j`` from which every key further back falls in the last bucket
    (``B - 1``, for any table): the smallest ``n`` whose bucket is that of ``max_distance``.
    With T5's defaults (32 buckets, 128, unidirectional) that is 113; the fused kernels then take
    every tile lying further back than that as one constant."""
    distances = torch.arange(int(params["max_distance"]) + 1)
    buckets = relative_position_bucket(
        -distances,
        bidirectional=params["bidirectional"],
        num_buckets=params["bias_table"].shape[-1],
        max_distance=params["max_distance"],
    )
    return int((buckets < buckets[-1]).sum())  # the buckets never decrease with the distance


def t5_bias(query_positions: torch.Tensor, key_positions: torch.Tensor, params: dict):
    """table[h, bucket(p_j - p_i)], a learned scalar per head and distance bucket

    ``[1|B, Nq]``, ``[1|B, Nk]`` -> ``[1|B, H, Nq, Nk]`` in the table's dtype (so its gradient
    is the sum of ``dS`` over the entries of each bucket).
    """
    distances = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)  # [1|B, Nq, Nk]
    return t5_distance_bias(distances, params).movedim(0, 1)  # [H, 1|B, ..] -> [1|B, H, ..]


def check_t5_params(params: dict, *, heads: int, head_dim: int, device, causal: bool, **call):
    """``bias_table``: a finite floating ``[heads, num_buckets]`` tensor; ``bidirectional``:
    None (``not causal``: T5's encoder is bidirectional, its decoder is not) or a bool;
    ``max_distance``: an int larger than the number of exact buckets."""
    if params["bidirectional"] is None:
        params["bidirectional"] = not causal
    table = params["bias_table"]
    check_float_tensor(table, "bias_table", "[heads, num_buckets]", device)
    if table.dim() != 2 or table.shape[0] != heads:
        raise ValueError(
            f"bias_table must have shape [heads, num_buckets] = [{heads}, num_buckets], "
            f"got {tuple(table.shape)}"
        )
    check_bucket_options(table.shape[1], params["max_distance"], params["bidirectional"])


# -- the fused kernels' hook (Triton only) --------------------------------------------------------
T5_BUCKETS = None
"""``b_ij = per_head[h, bucket(p_j - p_i)]`` for the flash kernels: the tile counts how many of
the log buckets' first distances (computed once per configuration by the launcher) each distance
has reached, then reads the table; the table's gradient is summed per bucket present in the
tile. Options ``num_buckets``, ``max_distance``, ``bidirectional`` (each set compiles its own
kernel). Its functions are in ``kernels/score_bias.py``, where chapter 06 reads them. None
without Triton."""
if kernels_available():
    import triton

    from course_lib.kernels import score_bias as _library

    T5_BUCKETS = _library.BiasHook(
        name="t5_buckets",
        formula="b_ij = per_head[h, bucket(p_j - p_i)] (T5's relative position buckets)",
        bias=_library.t5_buckets_bias,
        grad=_library.t5_buckets_grad,
        param="per_head",
        reduce=_library.per_head_slots,
        options=("num_buckets", "max_distance", "bidirectional"),
        to_kernel=_library.t5_kernel_options,
        width=lambda options: options["num_buckets"],
        grad_width_fn=lambda block_rows, options: triton.next_power_of_2(options["num_buckets"]),
        families=("flash",),
        example_options={"num_buckets": 32, "max_distance": 128, "bidirectional": False},
    )


def t5_kernel_bias(params: dict, positions: torch.Tensor) -> ScoreBias:
    """The bias for the fused kernels: where the positions step by a constant (any offset and
    step: every course model), the kernels' per-distance table of :func:`t5_distance_bias`
    (torch looks the buckets up once per distance; the static GPU model counts it 2.6 / 1.8
    times faster than the bucket hook at head_dim 64 / 128, no-overlap bound); otherwise
    :data:`T5_BUCKETS`, which computes the bucket in the tile from any positions."""
    table = params["bias_table"]
    by_distance = distance_score_bias(
        t5_distance_bias, positions, params, table.shape[0], reach=t5_distance_reach(params)
    )
    if by_distance is not None:
        return by_distance
    options = {
        "num_buckets": int(table.shape[1]),
        "max_distance": int(params["max_distance"]),
        "bidirectional": bool(params["bidirectional"]),
    }
    return ScoreBias(T5_BUCKETS, per_head=table, options=options)


def t5_parameter_count(num_heads: int, num_buckets: int = T5_NUM_BUCKETS) -> int:
    """Learned numbers of one table: ``num_heads * num_buckets`` (per layer here)."""
    return num_heads * num_buckets


class T5Attention(PositionalSelfAttention):
    """Softmax attention plus T5's learned relative bias ``table[h, bucket(p_j - p_i)]``.

    ``bias_table``: ``[num_heads, num_buckets]``, **one per layer**. T5 itself computes the bias
    in the first layer of each stack and reuses it in every layer; here each layer owns its table
    because a module is one layer and owns its parameters (nothing outside it would have to hand
    a shared table around), the cost is tiny (``heads * num_buckets`` numbers per layer, 128 for
    4 heads and 32 buckets) and each layer may then prefer its own distances.
    ``max_position_embeddings`` is not used: the last bucket holds every far distance, so any
    length works. Initialised like Hugging Face's port of T5: normal, std ``hidden_size^-0.5``.
    ``bidirectional`` follows the call (``not causal``) unless given.
    """

    encoding = "t5"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        *,
        num_buckets: int = T5_NUM_BUCKETS,
        max_distance: int = T5_MAX_DISTANCE,
        bidirectional: bool | None = None,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        for flag in (True, False) if bidirectional is None else (bidirectional,):
            check_bucket_options(num_buckets, max_distance, flag)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.bias_table = nn.Parameter(torch.randn(num_heads, num_buckets) * hidden_size**-0.5)

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        return {
            "bias_table": self.bias_table,
            "bidirectional": self.bidirectional,
            "max_distance": self.max_distance,
        }

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}"
        )


register(
    Encoding(
        name="t5",
        chapter="06_score_biases",
        summary="a learned bias per head and bucket of p_j - p_i (exact near, log-spaced far)",
        module=T5Attention,
        color="#637939",
        distance_bias=t5_distance_bias,
        distance_reach=t5_distance_reach,
        params={"bias_table": REQUIRED, "bidirectional": None, "max_distance": T5_MAX_DISTANCE},
        check_params=check_t5_params,
        kernel_bias=t5_kernel_bias,
        kernel_hooks=(T5_BUCKETS,) if T5_BUCKETS is not None else (),
        relative=True,
        learnable=True,
    )
)
