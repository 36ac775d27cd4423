"""What every phase of the check runs: the methods of ``attention()``, their inputs and their
parameters, built from the registry and the encodings' own modules (no list of encodings)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.position_facts import arange_positions
from course_lib.registry import Encoding, attention_methods

__all__ = [
    "DTYPES",
    "GRID_WIDTH",
    "Inputs",
    "make_inputs",
    "method_params",
    "methods",
    "positions_for",
    "relative_error",
]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
GRID_WIDTH = 64  # tokens per row for encodings that place tokens in 2-D
_PROJECTIONS = ("query", "key", "value", "out")


def methods() -> dict[str, Encoding | None]:
    """``attention(method=...)`` name -> record (None for plain softmax attention), in the
    registry's order."""
    return attention_methods()


def positions_for(encoding: Encoding | None, seq: int, device) -> torch.Tensor | None:
    """The ``position_ids`` ``attention()`` takes for ``encoding``: None for a method that reads
    none, ``0 .. seq - 1`` for sequences as every layer builds them (with their facts known, so
    a call waits for no read of them, as in a model: :func:`course_lib.position_facts.arange_positions`),
    ``(row, column)`` on a grid ``GRID_WIDTH`` wide for encodings of 2-D tokens."""
    if encoding is None or not encoding.uses_positions:
        return None
    if encoding.position_dims == 1:
        return arange_positions(0, seq, device)
    index = torch.arange(seq, device=device)
    return torch.stack((index // GRID_WIDTH, index % GRID_WIDTH), dim=-1)


def method_params(
    encoding: Encoding | None,
    *,
    batch: int,
    heads: int,
    head_dim: int,
    seq: int,
    device,
    seed: int = 0,
    module_options: dict | None = None,
) -> dict:
    """The keyword parameters ``attention(method=...)`` takes for ``encoding``, from its own
    module (built with ``module_options``, e.g. one of the record's ``speed_variants``): its
    learned tensors moved away from their initial values (so a gradient that should matter does)
    and the terms it computes from hidden states ``[batch, seq, hidden]``. Float tensors are
    float32 leaves, as in a model."""
    if encoding is None:
        return {}
    gen = torch.Generator().manual_seed(seed)
    hidden = heads * head_dim
    module = encoding.module(
        hidden, heads, max_position_embeddings=max(seq, 512), **(module_options or {})
    )
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.split(".")[0] not in _PROJECTIONS:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    module = module.to(device)
    x = torch.randn(batch, seq, hidden, generator=gen).to(device)
    with torch.no_grad():
        params = module.attention_params(x)
    out = {}
    for key, value in params.items():
        if torch.is_tensor(value) and value.is_floating_point():
            value = value.detach().float().requires_grad_()
        out[key] = value
    return out


@dataclass
class Inputs:
    """q, k, v and an incoming gradient ``[batch, heads, seq, head_dim]``, the positions and
    the method's parameters."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    positions: torch.Tensor | None
    params: dict


def make_inputs(
    encoding: Encoding | None,
    *,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    device,
    seed: int = 0,
    module_options: dict | None = None,
) -> Inputs:
    """Seeded inputs of one case (``dtype`` a key of :data:`DTYPES`; ``module_options``: see
    :func:`method_params`)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq, head_dim)
    q, k, v, g = (torch.randn(shape, generator=gen).to(device, DTYPES[dtype]) for _ in range(4))
    params = method_params(
        encoding, batch=batch, heads=heads, head_dim=head_dim, seq=seq, device=device,
        seed=seed + 1, module_options=module_options,
    )  # fmt: skip
    return Inputs(q, k, v, g, positions_for(encoding, seq, device), params)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``, the denominator floored at 1 (inputs are
    O(1), so a gradient that is 0 in exact arithmetic is held to the same absolute error)."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1.0)).item()
