"""Judging a learner's answer: is it a tensor of the right form, and where does it differ?

The exercise checks (``course_lib/teaching/*_checks.py``) compare what a learner's function
returns with what the library computes. Before comparing values they ask :func:`form_problem`
whether the answer can be compared at all, so that a list, ``None``, a float32 answer to a
float64 question or a transposed matrix gets a sentence saying so, not a ``RuntimeError`` from
``torch.allclose``. :func:`value_problem` then names the first entry that differs, with both
numbers and how many entries differ. :func:`matches` is how a check recognises a usual mistake
(the answer equals what the mistake computes), and :func:`as_number` reads an answer that is one
number.

Every check module lists its exercises in ``EXERCISES`` (:class:`Exercise`), which the tests
read: each worked solution passes its check, and each wrong form of its answer is refused with a
message, not an exception (``tests/test_exercise_checks.py``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Exercise", "form_problem", "value_problem", "answer_problem", "as_number", "matches"]


@dataclass(frozen=True)
class Exercise:
    """One exercise: its check, run on a learner's function, and the worked solution.

    ``run(fn)`` calls the check with ``fn`` (building whatever state it needs) and returns its
    verdict. ``accepts`` names the forms of a right answer the check accepts on purpose
    (``"dtype"``: another floating dtype; ``"sequence"``: a list or tuple of numbers), which the
    tests then do not expect it to refuse.
    """

    name: str
    run: Callable[[Callable], bool]
    solution: Callable
    accepts: tuple[str, ...] = ()


def _kind(got: object) -> str:
    if got is None:
        return "None (is the `return` missing?)"
    if isinstance(got, (list, tuple)):
        return (
            f"a {type(got).__name__}, not a tensor: build the result with torch.stack or torch.cat"
        )
    if type(got).__module__ == "numpy":
        return "a numpy array, not a tensor: stay in torch, or convert with torch.from_numpy"
    if isinstance(got, (bool, int, float, complex)):
        return f"the number {got!r}, not a tensor"
    return f"a {type(got).__name__}, not a tensor"


def _shape_hint(got: torch.Size, want: torch.Size) -> str:
    if len(got) == len(want) == 2 and tuple(got) == tuple(want)[::-1]:
        return " (transposed?)"
    if got.numel() == want.numel():
        return " (the same number of entries: a dimension of size 1 missing or extra?)"
    try:
        if torch.broadcast_shapes(got, want) == got and got.numel() > want.numel():
            return (
                " (larger: were two tensors broadcast against each other? [n, 1] + [n] is [n, n])"
            )
    except RuntimeError:
        pass
    return ""


def _dtype_hint(got: torch.dtype, want: torch.dtype) -> str:
    if want.is_floating_point and got.is_floating_point:
        return " (the inputs' dtype: make new tensors with torch.zeros_like(x), x.new_zeros(...) or dtype=x.dtype)"
    if want.is_floating_point:
        return " (an integer result: compute in the inputs' floating dtype, e.g. x.new_tensor(...))"
    if got.is_floating_point:
        return " (indices are integers: convert with .long() once the rounding is done)"
    if want == torch.int64:
        return " (convert with .long())"
    return ""


def form_problem(got: object, want: torch.Tensor, *, dtype: bool = True) -> str | None:
    """What keeps ``got`` from being compared with ``want`` entry by entry, as a sentence, or
    ``None`` when it is a tensor of ``want``'s shape (and, with ``dtype``, of its dtype)."""
    if not isinstance(got, torch.Tensor):
        return (
            f"your function returned {_kind(got)}; expected a tensor of shape {tuple(want.shape)}"
        )
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}" + _shape_hint(
            got.shape, want.shape
        )
    if got.dtype == torch.bool and want.dtype != torch.bool:
        return f"dtype torch.bool, expected {want.dtype}"
    if dtype and got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}" + _dtype_hint(got.dtype, want.dtype)
    return None


def matches(
    got: torch.Tensor, other: torch.Tensor, *, rtol: float = 1e-5, atol: float = 1e-8
) -> bool:
    """Whether ``got`` has ``other``'s shape and values (compared in float64, NaN equal to NaN):
    how the checks recognise a usual mistake in an answer whose form is right."""
    return got.shape == other.shape and bool(
        torch.allclose(got.double(), other.double(), rtol=rtol, atol=atol, equal_nan=True)
    )


def _where(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


def value_problem(
    got: torch.Tensor, want: torch.Tensor, *, rtol: float = 1e-5, atol: float = 1e-8
) -> str | None:
    """The first entry of ``got`` not within ``atol + rtol |want|`` of ``want`` (same shape),
    compared in float64, with both values and how many entries differ; ``None`` when none does.
    A NaN or an infinity where ``want`` has the same one counts as equal."""
    g, w = got.detach().double(), want.detach().double()
    wrong = ~torch.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if not wrong.any():
        return None
    first = tuple(int(i) for i in wrong.nonzero()[0])
    count = f"{int(wrong.sum())} of {wrong.numel()} entries differ; " if wrong.numel() > 1 else ""
    at = f"at {_where(first)}: " if first else ""
    gv, wv = g[first].item(), w[first].item()
    note = " (NaN: a 0/0, an inf - inf or a log of a negative number?)" if gv != gv else ""
    return f"{count}{at}got {gv:.6g}, expected {wv:.6g}{note}"


def answer_problem(
    got: object,
    want: torch.Tensor,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    dtype: bool = True,
) -> str | None:
    """:func:`form_problem`, then :func:`value_problem`: the first thing wrong with ``got``."""
    return form_problem(got, want, dtype=dtype) or value_problem(got, want, rtol=rtol, atol=atol)


def as_number(got: object, *, whole: bool = False) -> tuple[float | None, str | None]:
    """An answer that should be one number, as a Python number, or ``None`` and why it is not
    one. A tensor or numpy array of one element counts as its number; with ``whole``, the number
    must be an integer (a count, a distance in tokens), and a float with no fraction counts."""
    if got is None:
        return None, "your function returned None (is the `return` missing?)"
    if isinstance(got, torch.Tensor) or type(got).__module__ == "numpy":
        size = got.numel() if isinstance(got, torch.Tensor) else got.size
        if size != 1:
            shape = tuple(got.shape)
            return None, f"your function returned an array of shape {shape}, expected one number"
        got = got.item()
    if isinstance(got, complex):
        return None, f"your function returned the complex number {got:.4g}, expected a real one"
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return None, f"your function returned {got!r}, expected a number"
    if whole:
        if not float(got).is_integer():
            return None, (
                f"your function returned {got!r}, expected a whole number: keep to integer "
                "arithmetic (+, *, **, // rather than /)"
            )
        return int(got), None
    return got, None
