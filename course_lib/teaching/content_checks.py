"""The checks of notebook 08's exercises: FoX's bias matrix, CoPE's counts and CoPE's bias.

``check_fox_bias(fn)`` calls ``fn(log_forget)`` on log forget gates ``[n]`` (float64 for 1, 5 and
12 tokens, float32 for 7) and compares the ``[n, n]`` result, in the gates' dtype, with the
library's :func:`course_lib.encodings.fox_bias` below the diagonal and 0 above it. A wrong answer
gets a hint: the matrix transposed or not masked above the diagonal, the sign, ``log f_j``
counted in the sum (it starts after key ``j``), or ``log f_i`` left out.

``check_counts(fn)`` calls ``fn(scores, npos)`` on one query's float64 scores ``[n]`` and compares
the counts with the library's :func:`course_lib.encodings.contextual_positions`. A wrong answer
gets a hint: the counts not clamped at ``npos - 1`` (or clamped at ``npos``), key ``j`` left out
of its own count, or a forward cumulative sum where the sum runs from key ``j`` to the query.

``check_row_bias(fn)`` calls ``fn(q, table, positions)`` with float64 ``q`` ``[8]``, ``table``
``[5, 8]`` and counts ``[m]`` in ``[0, 4]`` (``p = npos - 1 = 4`` exactly among them) and compares
the bias ``[m]`` with the library's :func:`course_lib.encodings.interpolate_position_logits`. An
``IndexError`` from ``fn`` is reported (``floor(p) + 1`` reads past the table at
``p = npos - 1``, where the upper neighbour is ``p`` itself); any other exception is the
learner's to see. A wrong answer gets a hint: the two weights swapped, ``p`` rounded, or the
lower neighbour alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from course_lib.encodings import contextual_positions, fox_bias, interpolate_position_logits
from course_lib.teaching.answers import Exercise, form_problem, matches, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb08

__all__ = [
    "fox_gates",
    "reference_fox_bias",
    "check_fox_bias",
    "check_counts",
    "check_row_bias",
    "EXERCISES",
]

# (n, seed, dtype) of the gates
FOX_CASES = ((1, 0, torch.float64), (5, 1, torch.float64), (12, 2, torch.float64),
             (7, 3, torch.float32))  # fmt: skip
COUNT_CASES = ((1, 4, 0), (6, 16, 1), (9, 3, 2))  # (n, npos, seed)


def fox_gates(n: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Log forget gates ``[n]`` (``logsigmoid`` of scaled normal draws), all < 0."""
    draws = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return F.logsigmoid(draws * 2).to(dtype)


def reference_fox_bias(log_forget: torch.Tensor) -> torch.Tensor:
    """The library's ``D`` ``[n, n]``: ``c_i - c_j`` for ``j <= i``, 0 above the diagonal, in
    the gates' dtype (the library sums in float64)."""
    n = len(log_forget)
    positions = torch.arange(n)[None]
    bias = fox_bias(positions, positions, {"log_forget": log_forget.view(1, 1, n)})[0, 0]
    return bias.tril().to(log_forget.dtype)


def _fox_hint(got: torch.Tensor, want: torch.Tensor, log_f: torch.Tensor, atol: float) -> str:
    if matches(got, -want, atol=atol):
        return " (the sign: log f <= 0, so D_ij = c_i - c_j <= 0, falling with distance)"
    if matches(got, (want + log_f[None, :]).tril(), atol=atol):
        return " (the sum starts after key j: l = j+1 .. i)"
    if matches(got, (want - log_f[:, None] + log_f[None, :]).tril(), atol=atol):
        return " (the sum runs over l = j+1 .. i: include log f_i, leave out log f_j)"
    return ""


def check_fox_bias(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(log_forget [n]) -> D [n, n]`` (see the module); print one verdict."""
    failures = []
    for n, seed, dtype in FOX_CASES:
        log_f = fox_gates(n, seed, dtype)
        want = reference_fox_bias(log_f)
        atol = 1e-10 if dtype == torch.float64 else 1e-5
        desc = f"n={n} ({str(dtype).removeprefix('torch.')} gates)"
        got = fn(log_f.clone())
        problem = form_problem(got, want)
        if problem:
            failures.append(f"{desc}: {problem}")
            continue
        above = value_problem(got.triu(1), torch.zeros_like(want), atol=atol)
        if above:
            if matches(got, want.T, atol=atol):
                hint = " (transposed: row i is the query, D_ij = c_i - c_j for j <= i)"
            elif matches(got.tril(), want, atol=atol):
                hint = " (mask the upper triangle with torch.tril)"
            else:
                hint = ""
            failures.append(f"{desc}: above the diagonal must be 0: {above}{hint}")
            continue
        problem = value_problem(got, want, rtol=1e-5, atol=atol)
        if problem:
            failures.append(f"{desc}: wrong values: {problem}{_fox_hint(got, want, log_f, atol)}")
    return report_check("fox_bias_matrix", failures)


def _counts_hint(got: torch.Tensor, scores: torch.Tensor, npos: int) -> str:
    gates = torch.sigmoid(scores)
    reversed_sum = gates.flip(0).cumsum(0).flip(0)
    forward_sum = gates.cumsum(0)
    if matches(got, reversed_sum, atol=1e-10):
        return " (clamp the counts at npos - 1)"
    if matches(got, reversed_sum.clamp(max=npos), atol=1e-10):
        return " (clamp at npos - 1, the last row of the table, not at npos)"
    if matches(got, (reversed_sum - gates).clamp(max=npos - 1), atol=1e-10):
        return " (key j counts itself: include l = j)"
    if matches(got, forward_sum.clamp(max=npos - 1), atol=1e-10) or matches(
        got, forward_sum, atol=1e-10
    ):
        return (
            " (a forward cumsum sums keys 0 .. j; p_j sums from key j to the query, l = j .. i: "
            "reverse, cumsum, reverse back)"
        )
    return ""


def check_counts(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check ``fn(scores [n], npos) -> counts [n]`` (see the module); print one verdict."""
    failures = []
    for n, npos, seed in COUNT_CASES:
        gen = torch.Generator().manual_seed(seed)
        s = 2 * torch.randn(n, generator=gen, dtype=torch.float64)
        want = contextual_positions(s.view(1, n), torch.ones(1, n, dtype=torch.bool), npos)[0]
        got = fn(s.clone(), npos)
        problem = form_problem(got, want)
        if problem:
            failures.append(f"n={n}, npos={npos}: {problem}")
            continue
        problem = value_problem(got, want, rtol=1e-5, atol=1e-10)
        if problem:
            hint = _counts_hint(got, s, npos)
            failures.append(f"n={n}, npos={npos}: wrong counts: {problem}{hint}")
    return report_check("cope_counts", failures)


def _row_bias_hint(got: torch.Tensor, z: torch.Tensor, positions: torch.Tensor) -> str:
    lower, upper = positions.floor().long(), positions.ceil().long()
    w = positions - positions.floor()
    if matches(got, z[lower] * w + z[upper] * (1 - w), atol=1e-10):
        return " (the weights are swapped: z[ceil p] gets w = p - floor p, z[floor p] gets 1 - w)"
    if matches(got, z[positions.round().long()], atol=1e-10):
        return " (p rounded to the nearest row: interpolate between floor p and ceil p)"
    if matches(got, z[lower], atol=1e-10):
        return " (z[floor p] alone: add w (z[ceil p] - z[floor p]), w = p - floor p)"
    return ""


def check_row_bias(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(q [d], table [npos, d], positions [m]) -> bias [m]`` (see the module); print
    one verdict."""
    failures = []
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(8, generator=gen, dtype=torch.float64)
    table = torch.randn(5, 8, generator=gen, dtype=torch.float64)
    npos = len(table)
    cases = [
        torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64),
        4 * torch.rand(7, generator=gen, dtype=torch.float64),
    ]
    for positions in cases:
        z = table @ q
        want = interpolate_position_logits(z.view(1, -1), positions.view(1, -1))[0]
        desc = f"positions {[round(x, 2) for x in positions.tolist()]}"
        try:
            got = fn(q.clone(), table.clone(), positions.clone())
        except IndexError as error:
            at_top = bool((positions == npos - 1).any())
            why = (
                f"at p = npos - 1 = {npos - 1} the upper neighbour is p itself: use ceil(p), or "
                f"clamp the index to npos - 1"
                if at_top
                else f"an index past the table's {npos} rows"
            )
            failures.append(f"{desc}: IndexError ({error}): {why}")
            continue
        problem = form_problem(got, want)
        if problem:
            failures.append(f"{desc}: {problem}")
            continue
        problem = value_problem(got, want, rtol=1e-5, atol=1e-10)
        if problem:
            hint = _row_bias_hint(got, z, positions)
            failures.append(f"{desc}: wrong values: {problem}{hint}")
    return report_check("cope_row_bias", failures)


EXERCISES = [
    Exercise("fox_bias_matrix", check_fox_bias, nb08.fox_bias_matrix),
    Exercise("cope_counts", check_counts, nb08.cope_counts),
    Exercise("cope_row_bias", check_row_bias, nb08.cope_row_bias),
]
