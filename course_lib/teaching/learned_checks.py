"""The checks of notebook 02's exercises: counting a layer's parameters, and stretching a table.

``check_count(fn)`` calls ``fn(hidden_size, max_positions, encoding)`` for three sizes and both
encodings (``"absolute"``, ``"learned"``) and compares the answer with the parameters of the
library's :class:`~course_lib.encodings.AbsoluteAttention` and
:class:`~course_lib.encodings.LearnedAttention`. The answer must be one whole number
(:func:`~course_lib.teaching.answers.as_number`); anything else is refused with a sentence. A wrong count gets a
hint: the learned table missing, a table counted for the sinusoidal code, or the projections
miscounted.

``check_interpolation(fn)`` calls ``fn(table, new_size)`` on random ``[old, 8]`` tables (float32
and float64; stretched, and shrunk from 7 rows to 4) and compares the result with what
:meth:`~course_lib.encodings.LearnedAttention.resize_position_table` makes of the same table. A
wrong answer is told which row is wrong and where it should read the old table, with a hint for
the usual mistakes: the first or last row moved, the two weights swapped, or no blend at all (the
row ``floor(x)`` or the nearest row alone). An ``IndexError`` from ``table[floor(x) + 1]`` at the
last row is caught and explained.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.encodings import AbsoluteAttention, LearnedAttention
from course_lib.teaching.answers import Exercise, as_number, form_problem, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb02

__all__ = ["check_count", "check_interpolation", "EXERCISES"]

COUNT_CASES = ((32, 64), (384, 512), (48, 100))
INTERPOLATION_CASES = (
    (16, 31, torch.float32),
    (10, 25, torch.float32),
    (7, 4, torch.float32),
    (5, 13, torch.float64),
)


def _parameters(cls, hidden_size: int, max_positions: int) -> tuple[str, int]:
    with torch.random.fork_rng(devices=[]):  # the learner's random state stays as it was
        module = cls(hidden_size, num_heads=4, max_position_embeddings=max_positions)
    return module.encoding, sum(p.numel() for p in module.parameters())


def check_count(fn: Callable[[int, int, str], int]) -> bool:
    """Check ``fn(hidden_size, max_positions, encoding) -> int``; print one verdict, return it."""
    failures = []
    for hidden_size, max_positions in COUNT_CASES:
        for cls in (AbsoluteAttention, LearnedAttention):
            encoding, want = _parameters(cls, hidden_size, max_positions)
            where = f"{encoding}, hidden={hidden_size}, max_positions={max_positions}"
            got, problem = as_number(fn(hidden_size, max_positions, encoding), whole=True)
            if problem:
                failures.append(f"{where}: {problem}")
                return report_check("attention_parameters", failures)
            if got != want:
                projections = 4 * (hidden_size**2 + hidden_size)
                if encoding == "learned" and got == projections:
                    hint = "the learned table, max_positions x hidden, is missing"
                elif encoding == "absolute" and got == want + max_positions * hidden_size:
                    hint = "the sinusoidal code is computed, not learned: no table to count"
                else:
                    hint = "each projection has a hidden x hidden weight and a bias of size hidden"
                failures.append(f"{where}: got {got:,}, expected {want:,} ({hint})")
    return report_check("attention_parameters", failures)


def _stretched(old: int, new: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A random ``[old, 8]`` table and the library's resize of it to ``new`` rows."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(old)
        layer = LearnedAttention(8, 2, max_position_embeddings=old, init_std=1.0).to(dtype)
    before = layer.position_embeddings.weight.detach().clone()
    layer.resize_position_table(new)
    return before, layer.position_embeddings.weight.detach().clone()


def _reads(table: torch.Tensor, new: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each new row reads the old table: ``floor(x)``, ``floor(x) + 1`` (clamped) and
    ``f``."""
    old = table.shape[0]
    x = torch.arange(new, dtype=torch.float64) * (old - 1) / (new - 1)
    low = x.floor().long().clamp(max=old - 1)
    frac = (x - low).unsqueeze(1).to(table.dtype)
    return low, (low + 1).clamp(max=old - 1), frac


def _blend_hint(got: torch.Tensor, table: torch.Tensor, new: int) -> str:
    low, high, frac = _reads(table, new)
    nearest = (
        (torch.arange(new, dtype=torch.float64) * (table.shape[0] - 1) / (new - 1)).round().long()
    )
    mistakes = (
        (
            frac * table[low] + (1 - frac) * table[high],
            "the weights are swapped: row floor(x) gets 1 - f, row floor(x) + 1 gets f",
        ),
        (
            table[low],
            "each new row is the old row floor(x) alone: blend it with row floor(x) + 1, "
            "weights 1 - f and f (an integer x, from // or int(), loses f)",
        ),
        (
            table[nearest],
            "each new row is the nearest old row: blend rows floor(x) and floor(x) + 1",
        ),
    )
    for wrong, hint in mistakes:
        if torch.allclose(got.double(), wrong.double(), atol=1e-5):
            return f": {hint}"
    return ""


def check_interpolation(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check ``fn(table, new_size) -> [new_size, hidden]``; print one verdict, return it."""
    failures = []
    for old, new, dtype in INTERPOLATION_CASES:
        before, want = _stretched(old, new, dtype)
        where = f"{old} -> {new} rows ({dtype})"
        try:
            got = fn(before.clone(), new)
        except IndexError as error:
            failures.append(
                f"{where}: IndexError ({error}): at the last row x = old - 1 = {old - 1} exactly, "
                f"so floor(x) + 1 = {old} is past the table: clamp the upper index to old - 1"
            )
            continue
        problem = form_problem(got, want)
        if problem:
            failures.append(f"{where}: {problem}")
            continue
        problem = value_problem(got, want, atol=1e-5)
        if not problem:
            continue
        hint = _blend_hint(got, before, new)
        moved = [
            (name, r, o, value_problem(got[r], before[o], atol=1e-6))
            for name, r, o in (("first", 0, 0), ("last", new - 1, old - 1))
        ]
        moved = [m for m in moved if m[3]]
        if moved and not hint:
            name, r, o, problem = moved[0]
            failures.append(
                f"{where}: the first and last rows must stay the old first and last rows; "
                f"the {name} new row, {r}, is not old row {o} ({problem})"
            )
            continue
        wrong = ~torch.isclose(got.double(), want.double(), atol=1e-5)
        r = int(wrong.any(dim=1).nonzero()[0])
        x = r * (old - 1) / (new - 1)
        failures.append(
            f"{where}: row {r} is wrong; it should read the old table at x = {x:.3f}, "
            f"between rows {int(x)} and {min(int(x) + 1, old - 1)}{hint} ({problem})"
        )
    return report_check("interpolate_table", failures)


EXERCISES = [
    Exercise("attention_parameters", check_count, nb02.attention_parameters),
    Exercise("interpolate_table", check_interpolation, nb02.interpolate_table),
]
