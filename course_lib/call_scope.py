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

Checks that only refuse (a parameter must be finite, a slope ``>= 0``) need not read one at a
time: :func:`defer` queues the device values a check needs with the code that judges them, and
the next read of the call (:func:`read`, or :func:`settle`, which ``attention()`` calls once
its checks are done and a scope calls as it ends) brings back everything queued in one
transfer, then judges it in the order it was queued. So a call's value checks wait for the GPU
once, however many tensors and checks there are, and an error is raised before anything is
computed from the values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["call_scope", "defer", "read", "recall", "remember", "settle"]


@dataclass
class _Scope:
    """One call's facts (kind -> tensor -> (version, fact)) and its queued checks."""

    facts: dict[str, WeakIdKeyDictionary]
    deferred: list[tuple[tuple[torch.Tensor, ...], Callable[[list[float]], None]]]


_SCOPE: ContextVar[_Scope | None] = ContextVar("call_scope", default=None)


@contextmanager
def call_scope() -> Iterator[None]:
    """Within this block :func:`remember` keeps facts, and :func:`recall` finds them; they are
    forgotten when it ends (a nested scope starts empty and gives the outer one back). Checks
    still queued when the block ends (:func:`defer`) are settled then, unless it raised."""
    token = _SCOPE.set(_Scope({}, []))
    try:
        yield
        settle()
    finally:
        _SCOPE.reset(token)


def defer(scalars: Sequence[torch.Tensor], judge: Callable[[list[float]], None]) -> None:
    """Queue ``judge(values)``, ``values`` the Python numbers of ``scalars`` (one-element
    tensors; a bool reads as 0.0 or 1.0), for the call's next read. Outside a scope: read and
    judge now."""
    scope = _SCOPE.get()
    if scope is None:
        judge(_transfer(tuple(scalars)))
    else:
        scope.deferred.append((tuple(scalars), judge))


def read(*scalars: torch.Tensor) -> list[float]:
    """The Python numbers of ``scalars`` (one-element tensors), read in one transfer per device
    together with every queued check, which is judged first (and may raise)."""
    scope = _SCOPE.get()
    queued = [] if scope is None else scope.deferred[:]
    if scope is not None:
        scope.deferred.clear()
    values = _transfer(tuple(s for group, _ in queued for s in group) + scalars)
    start = 0
    for group, judge in queued:
        judge(values[start : start + len(group)])
        start += len(group)
    return values[start:]


def settle() -> None:
    """Read and judge every queued check of this call now (nothing is read if none is)."""
    scope = _SCOPE.get()
    if scope is not None and scope.deferred:
        read()


def _transfer(scalars: tuple[torch.Tensor, ...]) -> list[float]:
    """One ``tolist()`` per device for all of ``scalars`` (float64, float32 on Apple's MPS,
    which has no float64: both exact for the flags and the bounds the checks read)."""
    if not scalars:
        return []
    values: list[float | None] = [None] * len(scalars)
    by_device: dict[torch.device, list[int]] = {}
    for i, s in enumerate(scalars):
        by_device.setdefault(s.device, []).append(i)
    for device, indices in by_device.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64
        column = torch.stack([scalars[i].detach().reshape(()).to(dtype) for i in indices])
        for i, value in zip(indices, column.tolist(), strict=True):
            values[i] = value
    return values  # type: ignore[return-value]


def remember(kind: str, tensor: torch.Tensor, fact) -> None:
    """Keep ``fact`` (of ``kind``, e.g. ``"finite"``) about ``tensor``'s present values until
    the call scope ends; outside a scope, nothing is kept."""
    scope = _SCOPE.get()
    if scope is not None:
        scope.facts.setdefault(kind, WeakIdKeyDictionary())[tensor] = (tensor._version, fact)


def recall(kind: str, tensor: torch.Tensor):
    """The fact of ``kind`` remembered about ``tensor`` in this call scope, or None (none kept,
    no scope, or the tensor changed in place since)."""
    scope = _SCOPE.get()
    known = None if scope is None else scope.facts.get(kind, {}).get(tensor)
    if known is None or known[0] != tensor._version:
        return None
    return known[1]
