"""The checks of notebook 00's exercises: causal attention, and undoing a permutation.

``check_causal_attention(fn)`` calls ``fn(q, k, v)`` on random ``[..., seq, d]`` inputs (4-D and
3-D, float32 and float64) and compares the result with the library's
``attention(q, k, v, causal=True)``. A wrong answer gets a hint naming the usual mistake: no
mask, the weights masked after the softmax (rows no longer sum to 1), the mask on the wrong side
of the diagonal, masked scores set to 0 instead of ``-inf``, or the ``1 / sqrt(d)`` scale left
out.

``check_undo(fn)`` calls ``fn(y[..., perm, :], perm)`` for random ``y`` of distinct rows and
fixed permutations of 5 and 9 positions, and compares the result with ``y`` exactly. A wrong
answer is told which row of the output holds which token's row, and whether ``perm`` was applied
again instead of its inverse.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.attention import attention
from course_lib.teaching.answers import Exercise, form_problem, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb00

__all__ = ["check_causal_attention", "check_undo", "EXERCISES"]

CAUSAL_CASES = (
    ((1, 1, 4, 8), torch.float32),
    ((2, 3, 7, 16), torch.float32),
    ((3, 5, 8), torch.float64),
)


def _attend(q, k, v, *, allowed=None, fill=float("-inf"), scale=True, after=False):
    """``softmax(q k^T [/ sqrt(d)]) v`` with the pairs outside ``allowed`` set to ``fill`` before
    the softmax, or (``after``) with the weights outside ``allowed`` zeroed after it."""
    scores = q @ k.transpose(-1, -2)
    if scale:
        scores = scores / q.shape[-1] ** 0.5
    if allowed is not None and not after:
        scores = scores.masked_fill(~allowed, fill)
    weights = torch.softmax(scores, dim=-1)
    if allowed is not None and after:
        weights = weights * allowed
    return weights @ v


def _causal_hint(got, q, k, v) -> str:
    seq = q.shape[-2]
    lower = torch.ones(seq, seq, dtype=torch.bool).tril()
    mistakes = (
        (_attend(q, k, v), "no mask: query i still sees the keys after it"),
        (
            _attend(q, k, v, allowed=lower, after=True),
            "the weights were masked after the softmax, so rows do not sum to 1: mask the scores "
            "with -inf before it",
        ),
        (
            _attend(q, k, v, allowed=lower.T),
            "the mask keeps the keys j >= i (triu): query i may see the keys j <= i (tril)",
        ),
        (
            _attend(q, k, v, allowed=lower, fill=0.0),
            "the masked scores were set to 0, not -inf: exp(0) = 1 still gives the later keys "
            "weight",
        ),
        (
            _attend(q, k, v, allowed=lower, scale=False),
            "the scores are not divided by sqrt(d)",
        ),
    )
    for wrong, hint in mistakes:
        if torch.allclose(got.double(), wrong.double(), atol=1e-5):
            return hint
    if value_problem(got[..., 0, :], v[..., 0, :], atol=1e-5):
        return "query 0 sees only key 0, so its output must be v[..., 0, :]"
    return "values differ from softmax(masked qk^T/sqrt(d)) v: scale by sqrt(d), keep j <= i, softmax over the last axis"


def check_causal_attention(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> bool:
    """Check ``fn(q, k, v) -> [..., seq, d]`` causal attention; print one verdict, return it."""
    failures = []
    gen = torch.Generator().manual_seed(0)
    for shape, dtype in CAUSAL_CASES:
        q, k, v = torch.randn(3, *shape, generator=gen, dtype=dtype).unbind(0)
        want = attention(*(t.view(-1, *t.shape[-3:]) for t in (q, k, v)), causal=True).view(shape)
        desc = f"inputs {shape}, {dtype}"
        got = fn(q, k, v)
        problem = form_problem(got, want)
        if problem:
            failures.append(f"{desc}: {problem}")
            continue
        problem = value_problem(got, want, atol=1e-5)
        if problem:
            failures.append(f"{desc}: {_causal_hint(got, q, k, v)} ({problem})")
    return report_check("my_causal_attention", failures)


def _undo_failure(got, y, perm) -> str:
    seq = len(perm)
    rows = [i for i in range(seq) if not torch.equal(got[..., i, :], y[..., i, :])]
    i = rows[0]
    held = [j for j in range(seq) if torch.equal(got[..., i, :], y[..., j, :])]
    count = f"{len(rows)} of {seq} rows wrong; "
    if not held:
        return f"{count}row {i} of the output is no row of y ({value_problem(got[..., i, :], y[..., i, :], rtol=0, atol=0)})"
    text = f"{count}row {i} of the output holds token {held[0]}'s row, expected token {i}'s"
    if torch.equal(got, y[..., perm[perm], :]):
        return f"{text}: applied perm instead of its inverse? (inv[perm[i]] = i)"
    if torch.equal(got, y[..., perm, :]):
        return f"{text}: that is y_perm unchanged: index it with the inverse of perm"
    return text


def check_undo(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(y[..., perm, :], perm) == y``; print one verdict, return it."""
    failures = []
    gen = torch.Generator().manual_seed(0)
    for seq in (5, 9):
        y = torch.randn(2, seq, 3, generator=gen)
        perm = torch.randperm(seq, generator=torch.Generator().manual_seed(seq))
        got = fn(y[..., perm, :], perm.clone())
        where = f"seq={seq}, perm={perm.tolist()}"
        problem = form_problem(got, y)
        if problem:
            failures.append(f"{where}: {problem}")
        elif not torch.equal(got, y):
            failures.append(f"{where}: {_undo_failure(got, y, perm)}")
    return report_check("undo_permutation", failures)


EXERCISES = [
    Exercise("my_causal_attention", check_causal_attention, nb00.causal_attention),
    Exercise("undo_permutation", check_undo, nb00.undo_permutation),
]
