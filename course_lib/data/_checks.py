"""Argument checks shared by the batch and probe builders of :mod:`course_lib.data`.

Each raises a ``TypeError`` (wrong kind of value) or a ``ValueError`` (right kind, bad value)
that names the argument and says what is allowed.
"""

from __future__ import annotations

import torch

from course_lib.checks import check_int as _check_int


def check_int(name: str, value: object, minimum: int) -> int:
    """An integer (a numpy one too, never a bool) ``>= minimum``, as an ``int``."""
    return _check_int(name, value, minimum)


def check_stream(tokens: object) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a 1-D integer torch.Tensor, got {type(tokens).__name__}")
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be a 1-D token stream, got shape {tuple(tokens.shape)}")
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"tokens must hold integer ids, got dtype {tokens.dtype}")
    return tokens


def check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
            f"got {type(generator).__name__}"
        )
    return generator


def check_probability(name: str, value: object, *, open_interval: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    ok = 0.0 < value < 1.0 if open_interval else 0.0 <= value <= 1.0
    if not ok:
        interval = "(0, 1)" if open_interval else "[0, 1]"
        raise ValueError(f"{name} must lie in {interval}, got {value}")
    return value
