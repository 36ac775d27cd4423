"""The checks of notebook 06's first three exercises (ALiBi's slopes, T5's buckets, the
half-attention distance); the KERPLE exercise's check is in ``kerple_checks.py``.

``check_slopes(fn)`` calls ``fn(num_heads)`` for 1 to 32, 48, 64 and 96 heads and compares the
result with the library's :func:`course_lib.encodings.alibi_slopes`. It must be a float32 tensor
``[num_heads]`` (the exercise asks for float32). A wrong answer hears whether its slopes are right
but in the wrong order (the extra slopes come last), or else gets its slopes and the expected ones
as exponents of 2 (:func:`exponents`).

``check_buckets(fn)`` calls ``fn(relative_position, bidirectional, num_buckets, max_distance)``
with the offsets ``-1000..1000`` and four bucket settings, both directions, and compares the int64
result with the library's :func:`course_lib.encodings.relative_position_bucket`, naming the first
offset that gets the wrong bucket. A hint names the usual mistake: the sign (``key - query``),
buckets past ``max_distance`` not held in the last one, a unidirectional bucket of ``|r|`` for the
keys after the query, or the log part rounded instead of truncated.

``check_half(fn)`` calls ``fn(slope, context)`` (a Python float and int) and compares the number it
returns with the smallest ``D`` whose keys at distances ``0..D`` get half of the content-free
attention (:func:`course_lib.teaching.score_bias_figures.half_distance`). A hint names an answer
one too large or too small, or the unbounded context's ``ceil(ln 2 / m) - 1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from course_lib.encodings import alibi_slopes, relative_position_bucket
from course_lib.teaching.answers import Exercise, as_number, form_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.score_bias_figures import half_distance
from course_lib.teaching.solutions import nb06

__all__ = ["exponents", "check_slopes", "check_buckets", "check_half", "EXERCISES"]


def exponents(slopes: torch.Tensor) -> list[float]:
    """log2 of each slope, rounded to 3 decimals: ALiBi's slopes are powers of two with
    half-integer exponents."""
    return [round(x, 3) for x in torch.log2(slopes.double()).tolist()]


def check_slopes(fn: Callable[[int], torch.Tensor]) -> bool:
    """Check ``fn(num_heads) -> float32 [num_heads]`` (see the module); print one verdict."""
    failures = []
    for heads in list(range(1, 33)) + [48, 64, 96]:
        want = alibi_slopes(heads)
        got = fn(heads)
        problem = form_problem(got, want, dtype=False)
        if problem:
            failures.append(f"{heads} heads: {problem}")
        elif got.dtype != torch.float32:
            failures.append(
                f"{heads} heads: dtype {got.dtype}, expected torch.float32 (the exercise asks for "
                "float32: torch.tensor(slopes, dtype=torch.float32))"
            )
        elif not torch.allclose(got, want, rtol=1e-6, atol=0):
            if torch.allclose(got.sort().values, want.sort().values, rtol=1e-6, atol=0):
                failures.append(
                    f"{heads} heads: right slopes, wrong order (the extra ones come last)"
                )
            else:
                failures.append(
                    f"{heads} heads: got log2 {exponents(got)}, expected {exponents(want)}"
                )
    return report_check("alibi slopes", failures)


def _bucket(r, bidirectional, num_buckets, max_distance, *, last=True, after=False, rounded=False):
    """T5's bucket by the formula, with one usual mistake when asked: ``last=False`` no
    ``min(..., B - 1)``, ``after`` a unidirectional distance ``|r|``, ``rounded`` the log part
    rounded instead of truncated."""
    back = -r.long()
    if bidirectional:
        per_direction = num_buckets // 2
        offset = (back < 0).long() * per_direction
        distance = back.abs()
    else:
        per_direction = num_buckets
        offset = torch.zeros_like(back)
        distance = back.abs() if after else back.clamp(min=0)
    exact = per_direction // 2
    ratio = distance.clamp(min=exact).float() / exact
    log_part = torch.log(ratio) / math.log(max_distance / exact) * (per_direction - exact)
    far = exact + (log_part.round() if rounded else log_part).long()
    if last:
        far = far.clamp(max=per_direction - 1)
    return offset + torch.where(distance < exact, distance, far)


_BUCKET_MISTAKES = (
    (
        lambda r, *case: _bucket(-r, *case),
        "the sign: relative_position is key - query, so the keys before the query have r < 0",
    ),
    (
        lambda r, *case: _bucket(r, *case, last=False),
        "the distances past max_distance must stay in the last bucket: min(..., B - 1)",
    ),
    (
        lambda r, *case: _bucket(r, *case, after=True),
        "unidirectional: the keys after the query (r > 0) all go to bucket 0, as distance 0",
    ),
    (
        lambda r, *case: _bucket(r, *case, rounded=True),
        "truncate the log part with .long(), do not round it",
    ),
)


def check_buckets(fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(relative_position, bidirectional, num_buckets, max_distance) -> int64`` of
    ``relative_position``'s shape (see the module); print one verdict."""
    failures = []
    r = torch.arange(-1000, 1001)
    for bidirectional in (True, False):
        for num_buckets, max_distance in ((32, 128), (16, 64), (8, 20), (64, 1000)):
            case = (
                f"bidirectional={bidirectional}, {num_buckets} buckets, max_distance {max_distance}"
            )
            want = relative_position_bucket(
                r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
            )
            got = fn(r.clone(), bidirectional, num_buckets, max_distance)
            problem = form_problem(got, want)
            if problem:
                if problem.startswith("shape"):
                    problem += "; one bucket per entry of relative_position"
                failures.append(f"{case}: {problem}")
                continue
            wrong = (got != want).nonzero().flatten()
            if len(wrong):
                first = int(r[wrong[0]])
                hint = next(
                    (
                        f" ({advice})"
                        for mistake, advice in _BUCKET_MISTAKES
                        if torch.equal(got, mistake(r, bidirectional, num_buckets, max_distance))
                    ),
                    "",
                )
                failures.append(
                    f"{case}: {len(wrong)} wrong, first at r = {first} "
                    f"(got {int(got[wrong[0]])}, expected {int(want[wrong[0]])})" + hint
                )
    return report_check("relative_bucket", failures)


def _half_hint(got: float, want: int, slope: float) -> str:
    if got == want + 1:
        return (
            " (one too many: D is the distance of the farthest key needed, 0 for the nearest, "
            "and keys 0..D holding exactly half are enough: >= 0.5)"
        )
    if got == want - 1:
        return " (one too few: the keys at distances 0..D, D included, must hold at least half)"
    if slope > 0 and got == math.ceil(math.log(2) / slope) - 1:
        return (
            " (that is the unbounded context's answer: here the weights are normalised over the "
            "context's distances 0..context-1 only)"
        )
    return ""


def check_half(fn: Callable[[float, int], int]) -> bool:
    """Check ``fn(slope, context) -> D`` (see the module); print one verdict."""
    failures = []
    cases = [
        (m, n)
        for m in (0.0, 0.001, 0.01, 0.0625, 0.25, 0.5, 1.0, 3.0)
        for n in (1, 2, 64, 100, 512)
    ]
    for m, n in cases:
        want = half_distance(torch.tensor([m]), n)[0]
        got, problem = as_number(fn(m, n), whole=True)
        if problem:
            failures.append(f"slope {m}, context {n}: {problem}")
        elif got != want:
            failures.append(
                f"slope {m}, context {n}: got {got}, expected {want}" + _half_hint(got, want, m)
            )
    return report_check("half_attention_distance", failures)


EXERCISES = [
    Exercise("alibi_slopes", check_slopes, nb06.alibi_slopes),
    Exercise("relative_bucket", check_buckets, nb06.relative_bucket),
    Exercise("half_attention_distance", check_half, nb06.half_attention_distance),
]
