"""The checks of notebook 01b's exercises: one step of the online softmax, and the merge of two
states.

A softmax *state* over a set of keys is ``(m, l, acc)``: the largest score, the sum of
``exp(s_j - m)`` and the sum of ``exp(s_j - m) v_j``. Over no keys at all (the start, or a row
whose keys are all masked with score ``-inf``) it is ``(-inf, 0, 0)``. A step folds one block of
keys into a state; the check holds it to that definition on every input the exercise allows:

* blocks of 1, 4 and 13 keys, from the empty state, with ordinary scores and with scores up to
  300 (``exp`` of a raw score overflows float32 there);
* a state built over *other* keys (here by the formula, not by the step), then the new keys
  folded into it: the result must be the state of the union, so a step that ignores the
  incoming state and recomputes from keys it has kept itself is caught;
* any number of leading dimensions: ``[batch, heads, seq_q, ...]`` and a bare ``[seq_q, ...]``
  (a step that names ``dim=3`` fails there);
* masked keys (score ``-inf``): a row whose keys are all masked keeps the empty state, with no
  NaN, while the other rows of the same call go on as usual; a row whose first blocks are all
  masked starts counting at its first allowed key.

``check_merge(fn)`` calls ``fn(state_a, state_b)`` on the states of two disjoint sets of keys (the
keys split after 1, 5 and 11 of 12, with maxima far apart) and compares the result with the state
of their union, part by part, then checks that ``acc / l`` is softmax attention. A wrong part is
named with the rescaling it misses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.attention import attention
from course_lib.teaching.answers import Exercise, answer_problem, form_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb01b

__all__ = ["check_online_step", "check_merge", "empty_state", "state_over", "EXERCISES"]

NEG_INF = float("-inf")


def empty_state(scores: torch.Tensor, values: torch.Tensor):
    """The state over no keys for queries shaped like ``scores [..., seq_q, keys]``."""
    rows = scores.shape[:-1]
    return (
        torch.full(rows, NEG_INF, dtype=scores.dtype),
        torch.zeros(rows, dtype=scores.dtype),
        torch.zeros(*rows, values.shape[-1], dtype=scores.dtype),
    )


def state_over(scores: torch.Tensor, values: torch.Tensor):
    """The state ``(m, l, acc)`` over all the keys of ``scores``, by its definition.

    A row with no allowed key (every score ``-inf``) gets the empty state ``(-inf, 0, 0)``.
    """
    m = scores.amax(dim=-1)
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    weights = torch.exp(scores - shift.unsqueeze(-1))
    return m, weights.sum(dim=-1), weights @ values


def _fold(fn: Callable, state, scores, values, block: int):
    for start in range(0, scores.shape[-1], block):
        state = fn(state, scores[..., start : start + block], values[..., start : start + block, :])
    return state


def _compare(where: str, got, want, rows=None) -> str | None:
    """The first way ``got`` differs from the state ``want`` (``rows``: a boolean mask of the
    rows to compare; the others are compared by the caller), or None."""
    failure = _state_form(where, got, want)
    if failure:
        return failure
    m, l_sum, acc = got
    m_want, l_want, acc_want = want
    if rows is not None:
        m, l_sum, acc = m[rows], l_sum[rows], acc[rows]
        m_want, l_want, acc_want = m_want[rows], l_want[rows], acc_want[rows]
    if not (torch.isfinite(acc).all() and torch.isfinite(l_sum).all()):
        return (
            f"{where}: inf or NaN; exp of a raw score overflows, and on the first block "
            "exp(m - m_new) with m = -inf must give 0"
        )
    if not torch.allclose(m, m_want):
        return f"{where}: m should end as the largest score of the row"
    if not torch.allclose(l_sum, l_want, rtol=1e-5):
        return (
            f"{where}: l should be sum_j exp(s_j - m) over every key folded so far, with the "
            "running max m (every term <= 1)"
        )
    if not torch.allclose(acc, acc_want, rtol=1e-5, atol=1e-5):
        return (
            f"{where}: acc is not sum_j exp(s_j - m) v_j; did you rescale both l and acc by "
            "exp(m - m_new) before adding the block?"
        )
    return None


def _state_form(where: str, got, want) -> str | None:
    """Why ``got`` is not a state shaped like ``want`` (a tuple of three tensors of its shapes
    and dtypes), or None."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"{where}: return the new state as a tuple (m, l, acc), got {type(got).__name__}"
    for name, tensor, wanted in zip(("m", "l", "acc"), got, want, strict=True):
        problem = form_problem(tensor, wanted)
        if problem:
            return f"{where}: {name}: {problem}"
    return None


def _run(where: str, fn: Callable, *args, rows=None, want=None) -> str | None:
    try:
        got = _fold(fn, *args)
    except Exception as error:  # a learner's step may fail in any way; say how
        return f"{where}: the step raised {type(error).__name__}: {error}"
    return _compare(where, got, want, rows)


def _masked(where: str, fn: Callable, scores, values, block: int, empty_row) -> str | None:
    try:
        got = _fold(fn, empty_state(scores, values), scores, values, block)
    except Exception as error:  # a learner's step may fail in any way; say how
        return f"{where}: the step raised {type(error).__name__}: {error}"
    failure = _state_form(where, got, empty_state(scores, values))
    if failure:
        return failure
    m, l_sum, acc = got
    if any(isinstance(t, torch.Tensor) and torch.isnan(t).any() for t in (m, l_sum, acc)):
        return (
            f"{where}: NaN in a row with no allowed key yet: there m_new = -inf and "
            "exp(m - m_new) = exp(-inf + inf); shift such a row by 0 instead of m_new"
        )
    failure = _compare(where, got, state_over(scores, values), rows=~empty_row)
    if failure:
        return failure
    if not ((m[empty_row] == NEG_INF).all() and (l_sum[empty_row] == 0).all()
            and (acc[empty_row] == 0).all()):  # fmt: skip
        return f"{where}: a row whose keys are all masked should keep m = -inf, l = 0, acc = 0"
    return None


def check_online_step(fn: Callable) -> bool:
    """Check a step ``fn(state, scores, values) -> state``; print a verdict and return it."""
    failures: list[str] = []
    gen = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(3, 1, 2, 13, 16, generator=gen).unbind(0)
    k = k * torch.linspace(0.5, 4.0, 13).view(1, 1, 13, 1)  # the max moves from block to block
    s = q @ k.transpose(-1, -2) * 16**-0.5
    large = s * 300 / s.abs().max()  # exp(300) overflows float32 (largest ~3.4e38)

    # from the empty state, ordinary and large scores, blocks of several sizes
    for scores, what in ((s, ""), (large, " (scores up to 300)")):
        for block in (1, 4, 13):
            failure = _run(f"blocks of {block}{what}", fn, empty_state(scores, v), scores, v, block,
                           want=state_over(scores, v))  # fmt: skip
            if failure:
                failures.append(failure)

    # from a state over other keys: the first 7 keys by the formula, then the rest by the step
    for block in (1, 3):
        failure = _run(
            f"folding blocks of {block} into a state over 7 other keys",
            fn, state_over(s[..., :7], v[..., :7, :]), s[..., 7:], v[..., 7:, :], block,
            want=state_over(s, v),
        )  # fmt: skip
        if failure:
            failures.append(failure)

    # no leading dimensions: scores [seq_q, keys], values [keys, d]
    flat_s, flat_v = s[0, 1], v[0, 1]
    failure = _run(
        "a 2-D input (scores [seq_q, keys], values [keys, d])",
        fn, empty_state(flat_s, flat_v), flat_s, flat_v, 4, want=state_over(flat_s, flat_v),
    )  # fmt: skip
    if failure:
        failures.append(failure)

    # masked keys: row 3 of head 0 has none allowed, row 5 none in its first 6 keys
    masked = s.clone()
    masked[0, 0, 3, :] = NEG_INF
    masked[0, 0, 5, :6] = NEG_INF
    empty_row = torch.zeros(masked.shape[:-1], dtype=torch.bool)
    empty_row[0, 0, 3] = True
    for block in (1, 4):
        where = f"masked keys (score -inf), blocks of {block}"
        failure = _masked(where, fn, masked, v, block, empty_row)
        if failure:
            failures.append(failure)
    return report_check("online_softmax_step", failures)


def check_merge(fn: Callable) -> bool:
    """Check ``fn(state_a, state_b) -> state`` (module docstring); print a verdict, return it."""
    failures: list[str] = []
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 1, 2, 12, 16, generator=gen).unbind(0)
    k = k * torch.linspace(0.5, 4.0, 12).view(1, 1, 12, 1)  # very different maxima per split
    s = q @ k.transpose(-1, -2) * 16**-0.5
    want = state_over(s, v)
    hints = (
        "the merged max should be max(m_a, m_b)",
        "the merged sum is wrong: rescale l_a by exp(m_a - m), l_b by exp(m_b - m)",
        "the merged acc is wrong: rescale like the sums",
    )
    for split in (1, 5, 11):
        a = state_over(s[..., :split], v[..., :split, :])
        b = state_over(s[..., split:], v[..., split:, :])
        where = f"keys split at {split}"
        got = fn(a, b)
        failure = _state_form(where, got, want)
        if failure:
            failures.append(failure)
            continue
        for part, wanted, hint, tol in zip(
            got,
            want,
            hints,
            ({"atol": 1e-5}, {"rtol": 1e-4}, {"rtol": 1e-4, "atol": 1e-5}),
            strict=True,
        ):
            problem = answer_problem(part, wanted, **tol)
            if problem:
                failures.append(f"{where}: {hint} ({problem})")
                break
        else:
            out = got[2] / got[1].unsqueeze(-1)
            problem = answer_problem(out, attention(q, k, v), atol=1e-5)
            if problem:
                failures.append(f"{where}: acc / l does not give softmax attention ({problem})")
    return report_check("merge_softmax_states", failures)


EXERCISES = [
    Exercise("online_softmax_step", check_online_step, nb01b.online_softmax_step),
    Exercise("merge_softmax_states", check_merge, nb01b.merge_softmax_states),
]
