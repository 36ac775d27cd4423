"""Facts about a tensor's values, remembered for the length of one ``attention()`` call.

Checking a value (every entry finite, the span of the positions) reads it back from the device,
and each read waits for the GPU. Within one call the same tensor is looked at by several checks
(``attention()`` checks every tensor parameter for finiteness, then the encoding's own checks
look at its tensors again): :func:`remember` keeps what one check found, :func:`recall` gives
it to the next, so each fact is read once per call.

Nothing carries over from one call to the next: between calls a tensor's values can change in
ways its version counter does not see (through ``.data``, or a NumPy array sharing its memory),
and a check that trusted an earlier call would let such a change through silently. Facts are
remembered only inside :func:`call_scope` (``attention()`` opens one), weakly (a tensor freed
during the call takes its facts with it) and with the tensor's version counter (an in-place
change during the call is seen).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["call_scope", "recall", "remember"]

_SCOPE: ContextVar[dict[str, WeakIdKeyDictionary] | None] = ContextVar("call_scope", default=None)


@contextmanager
def call_scope() -> Iterator[None]:
    """Within this block :func:`remember` keeps facts, and :func:`recall` finds them; they are
    forgotten when it ends (a nested scope starts empty and gives the outer one back)."""
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def remember(kind: str, tensor: torch.Tensor, fact) -> None:
    """Keep ``fact`` (of ``kind``, e.g. ``"finite"``) about ``tensor``'s present values until
    the call scope ends; outside a scope, nothing is kept."""
    scope = _SCOPE.get()
    if scope is not None:
        scope.setdefault(kind, WeakIdKeyDictionary())[tensor] = (tensor._version, fact)


def recall(kind: str, tensor: torch.Tensor):
    """The fact of ``kind`` remembered about ``tensor`` in this call scope, or None (none kept,
    no scope, or the tensor changed in place since)."""
    scope = _SCOPE.get()
    known = None if scope is None else scope.get(kind, {}).get(tensor)
    if known is None or known[0] != tensor._version:
        return None
    return known[1]
