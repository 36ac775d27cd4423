"""The checks of notebook 01's exercises: the sinusoidal table, and the rotation of one pair.

``check_table(fn)`` calls ``fn(num_positions, dim, base)`` for ``(50, 16, 10000)`` and
``(20, 8, 100)`` and compares the ``[num_positions, dim]`` result with the library's
:func:`course_lib.encodings.sinusoidal_table`, in any floating dtype (the exercise gives no input
tensor whose dtype the table should follow). A wrong answer gets a hint naming the usual mistake:
sin and cos swapped, the sines in the first half and the cosines in the second instead of
interleaved, positions counted from 1, or the ``base`` argument ignored; otherwise it is told the
first wrong column, its pair and frequency, and a position where it differs.

``check_rotation(fn)`` calls ``fn(shift, omega)`` for four shifts (negative and large ones
included) and checks that the ``[2, 2]`` result maps ``(sin(p w), cos(p w))`` to
``(sin((p + shift) w), cos((p + shift) w))`` at ``p = 0, 3, 1000``, in any floating dtype. A wrong
answer gets a hint naming the usual mistake: the textbook rotation written for ``(cos, sin)``
pairs (it turns this pair backwards), the angle ``omega`` instead of ``shift * omega``, or the
identity.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from course_lib.encodings import sinusoidal_table
from course_lib.teaching.answers import Exercise, form_problem, matches, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb01

__all__ = ["check_table", "check_rotation", "EXERCISES"]

TABLE_CASES = ((50, 16, 10000.0), (20, 8, 100.0))
ROTATION_CASES = ((1, 1.0), (5, 0.1), (-3, 0.7), (40, 1e-3))


def _table_hint(got, n: int, dim: int, base: float) -> str | None:
    want = sinusoidal_table(n, dim, base)
    if matches(got[:, 0::2], want[:, 1::2], atol=1e-4):
        return "sin and cos are swapped: column 2i is sin, column 2i+1 is cos"
    halves = torch.cat((want[:, 0::2], want[:, 1::2]), dim=1)
    if matches(got, halves, atol=1e-4):
        return (
            "the sines fill the first half and the cosines the second: interleave them, "
            "column 2i is sin, column 2i+1 is cos of the same frequency"
        )
    if matches(got, sinusoidal_table(n + 1, dim, base)[1:], atol=1e-4):
        return "row p holds position p + 1: positions start at 0"
    if base != 10000.0 and matches(got, sinusoidal_table(n, dim, 10000.0), atol=1e-4):
        return f"the base argument is ignored: this table uses 10000, not {base:g}"
    return None


def check_table(fn: Callable[[int, int, float], torch.Tensor]) -> bool:
    """Check ``fn(num_positions, dim, base) -> [num_positions, dim]``; print one verdict."""
    failures = []
    for n, dim, base in TABLE_CASES:
        want = sinusoidal_table(n, dim, base)
        got = fn(n, dim, base)
        where = f"({n}, {dim}, base={base:g})"
        problem = form_problem(got, want, dtype=False)
        if problem:
            failures.append(f"{where}: {problem}")
            continue
        got = got.detach().double()
        hint = _table_hint(got, n, dim, base)
        if hint:
            failures.append(f"{where}: {hint} ({value_problem(got, want, atol=1e-4)})")
            continue
        wrong = ((got - want.double()).abs() > 1e-4).any(dim=0).nonzero().flatten()
        if len(wrong):
            c = int(wrong[0])
            bad = (got[:, c] - want[:, c]).abs() > 1e-4
            p = int(bad.nonzero()[0])
            kind = "sin" if c % 2 == 0 else "cos"
            failures.append(
                f"dim={dim}, base={base:g}: {len(wrong)} of {dim} columns wrong; column {c} "
                f"({kind} of pair {c // 2}, frequency base**(-{2 * (c // 2)}/{dim})) is wrong "
                f"at {int(bad.sum())} of {n} positions, e.g. at p={p}: "
                f"got {got[p, c]:.4f}, expected {want[p, c]:.4f}"
            )
    return report_check("my_sinusoidal_table", failures)


def _turn(angle: float) -> torch.Tensor:
    """The ``[2, 2]`` matrix that turns a ``(sin, cos)`` pair on by ``angle``."""
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, s], [-s, c]], dtype=torch.float64)


def _rotation_hint(r: torch.Tensor, shift: int, omega: float) -> str:
    if shift * omega != 0 and matches(r, _turn(-shift * omega), atol=1e-6):
        return (
            " (this turns the pair back by shift * omega: [[cos, -sin], [sin, cos]] turns a "
            "(cos, sin) pair; with sin first, sin(a + b) = sin a cos b + cos a sin b makes the "
            "first row (cos b, sin b))"
        )
    if shift != 1 and matches(r, _turn(omega), atol=1e-6):
        return " (this turns the pair by omega: a shift of k positions turns it by k * omega)"
    if shift * omega != 0 and matches(r, torch.eye(2, dtype=torch.float64), atol=1e-6):
        return " (this is the identity: the pair must turn by shift * omega)"
    return ""


def check_rotation(fn: Callable[[int, float], torch.Tensor]) -> bool:
    """Check ``fn(shift, omega) -> [2, 2]``: it moves a (sin, cos) pair ``shift`` positions on."""
    failures = []
    for shift, omega in ROTATION_CASES:
        r = fn(shift, omega)
        problem = form_problem(r, _turn(shift * omega), dtype=False)
        if problem:
            failures.append(f"shift={shift}, omega={omega}: {problem}")
            break
        r = r.detach().double()
        for p in (0, 3, 1000):
            pair = torch.tensor([math.sin(p * omega), math.cos(p * omega)], dtype=torch.float64)
            want = torch.tensor(
                [math.sin((p + shift) * omega), math.cos((p + shift) * omega)], dtype=torch.float64
            )
            got = r @ pair
            if not torch.allclose(got, want, atol=1e-6):
                failures.append(
                    f"shift={shift}, omega={omega}, p={p}: R @ (sin, cos) = "
                    f"({got[0]:.4f}, {got[1]:.4f}), expected ({want[0]:.4f}, {want[1]:.4f})"
                    + _rotation_hint(r, shift, omega)
                )
                break
    return report_check("pair_rotation", failures)


EXERCISES = [
    Exercise("my_sinusoidal_table", check_table, nb01.sinusoidal_table, accepts=("dtype",)),
    Exercise("pair_rotation", check_rotation, nb01.pair_rotation, accepts=("dtype",)),
]
