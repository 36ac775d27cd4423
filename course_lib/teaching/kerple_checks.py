"""The check of notebook 06's KERPLE exercise (the bias of each distance, both variants).

``check_kerple_bias(fn)`` calls ``fn(distance, r1, r2, variant)`` with an integer tensor of
offsets ``p_i - p_j`` (negative ones included), ``r1`` and ``r2`` of one value per head, and
``variant`` ``"log"`` or ``"power"``, and compares the ``[heads, *distance.shape]`` result with
the library's :func:`course_lib.encodings.kerple_bias`. A wrong answer gets a hint naming the
usual mistake: the sign (a reward for distance instead of a penalty), the offset used without
its absolute value (NaN at the negative offsets, from the log or the power of a negative number,
or a wrong value there), ``log(r2 |d|)`` without the 1, ``r1`` and ``r2`` swapped, or the heads on
the wrong axis. The answer must be a tensor ``[heads, *distance.shape]`` in the dtype of ``r1``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.encodings import kerple_bias
from course_lib.teaching.answers import Exercise, form_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb06

__all__ = ["kerple_cases", "check_kerple_bias", "EXERCISES"]


def kerple_cases() -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(variant, distance, r1, r2)`` cases: both variants, one and three heads, offsets of
    both signs, float32 and float64 parameters."""
    offsets = torch.arange(-40, 41)
    grid = torch.arange(6)[:, None] - torch.arange(6)[None, :]  # i - j, [6, 6]
    cases = []
    for variant, r2_values in (("log", (0.5, 1.0, 3.0)), ("power", (0.5, 1.0, 2.0))):
        cases.append((variant, offsets, torch.tensor([1.0]), torch.tensor([r2_values[0]])))
        cases.append((variant, grid, torch.tensor([0.2, 1.0, 2.5]), torch.tensor(r2_values)))
        cases.append(
            (
                variant,
                offsets,
                torch.tensor([0.7, 0.05], dtype=torch.float64),
                torch.tensor(r2_values[1:], dtype=torch.float64),
            )
        )
    return cases


def _hint(got, want, distance, r1, r2, variant) -> str:
    if torch.allclose(got.double(), -want.double(), atol=1e-6):
        return " (the sign: the bias is a penalty, -r1 ..., so it is <= 0)"
    shape = (-1, *([1] * distance.dim()))
    if variant == "log":
        no_one = -r1.view(shape) * torch.log(r2.view(shape) * distance.abs().to(r1.dtype))
        if torch.allclose(got.double(), no_one.double(), atol=1e-6, equal_nan=True):
            return " (log(1 + r2 |d|): without the 1, distance 0 gives -inf)"
    negative = (distance < 0).expand_as(got)
    if negative.any():
        g, w = got.double(), want.double()
        if torch.isnan(g[negative]).any() and not torch.isnan(g[~negative]).any():
            return (
                " (NaN at negative offsets: the log or power of a negative distance; use "
                "|p_i - p_j| = distance.abs())"
            )
        right_elsewhere = torch.allclose(g[~negative], w[~negative], rtol=1e-5, atol=1e-6)
        if right_elsewhere:
            return " (use |p_i - p_j|: negative offsets must be penalised like positive ones)"
    try:
        swapped = kerple_bias(distance, r2, r1, variant)
        if torch.allclose(got.double(), swapped.double(), atol=1e-6):
            return " (r1 and r2 swapped: r1 scales the penalty, r2 sets its shape)"
    except ValueError:
        pass
    return ""


def check_kerple_bias(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, str], torch.Tensor],
) -> bool:
    """Check ``fn(distance, r1, r2, variant) -> [heads, *distance.shape]``; print one verdict."""
    failures = []
    for variant, distance, r1, r2 in kerple_cases():
        want = kerple_bias(distance, r1, r2, variant)
        desc = f"{variant}, {len(r1)} head(s), distance {tuple(distance.shape)}"
        got = fn(distance.clone(), r1.clone(), r2.clone(), variant)
        problem = form_problem(got, want, dtype=False)
        if problem:
            if problem.startswith("shape"):
                problem += "; heads first, then the distance's shape"
            failures.append(f"{desc}: {problem}")
            continue
        if got.dtype != want.dtype:
            failures.append(
                f"{desc}: dtype {got.dtype}, expected {want.dtype} (the dtype of r1: convert the "
                "distance with .to(r1.dtype), not .float())"
            )
            continue
        wrong = ~torch.isclose(got.double(), want.double(), rtol=1e-5, atol=1e-6)
        if wrong.any():
            at = wrong.nonzero()[0].tolist()
            d = int(distance[tuple(at[1:])])
            failures.append(
                f"{desc}: {int(wrong.sum())} wrong, first head {at[0]} at p_i - p_j = {d} "
                f"(got {float(got[tuple(at)]):.4g}, expected {float(want[tuple(at)]):.4g})"
                + _hint(got, want, distance, r1, r2, variant)
            )
    return report_check("kerple_bias", failures)


EXERCISES = [Exercise("kerple_bias", check_kerple_bias, nb06.kerple_bias)]
