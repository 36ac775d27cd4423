"""The checks of notebook 05's row exercises (the stick broken key by key, in log space, and the
bidirectional row).

``check_stick_row(name, fn, extreme=False)`` calls ``fn(z)`` on rows of logits of one query
against the keys before it (position order, the last key nearest) and compares the weights with
the library's :func:`course_lib.encodings.stick_breaking_weights`. With ``extreme`` it adds
float32 rows with logits up to ``1e4`` and checks that the gradient stays finite (the log-space
exercise). A wrong answer gets a hint naming the usual mistake: the stick broken from the far
end, fractions of the whole stick instead of what is left, key ``j`` counted among the keys in
front of it, ``1 - sigmoid`` rounding to 0, or weights built outside autograd.

``check_bidirectional(fn)`` calls ``fn(z, i)`` for every query ``i`` of a random row of 7
logits and compares with the library's bidirectional weights (``causal=False``): a stick over the
keys left of ``i`` and one over the keys right of it, each broken from the key next to ``i``
outward, each worth half, and 0 at ``i``. A wrong side gets the first key that differs and a
hint when it sees the mistake: the factor 1/2 missing, or the side broken from its far end.

Every answer must be a tensor of the row's shape and dtype (float32 or float64, as ``z``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.encodings import stick_breaking_weights
from course_lib.teaching.answers import Exercise, form_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb05

__all__ = ["reference_row", "check_stick_row", "check_bidirectional", "EXERCISES"]


def reference_row(z: torch.Tensor) -> torch.Tensor:
    """The library's weights ``[n]`` of one query whose keys have the logits ``z`` ``[n]``."""
    return stick_breaking_weights(torch.cat([z, z.new_zeros(1)]).view(1, -1), causal=True)[0, :-1]


def _rows(extreme: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    rows = [
        torch.tensor([0.0]),
        torch.tensor([1.0, -2.0, 0.5]),
        2 * torch.randn(7, generator=gen, dtype=torch.float64),
    ]
    if extreme:  # float32 rows with huge logits (notebook 05, section 6)
        rows += [
            torch.tensor([2.0, 1.0, 25.0, -1.0]),
            torch.tensor([0.5, 1e4, 1.0, -1e4, 30.0, -2.0]),
        ]
    return rows


def _hint(got: torch.Tensor, want: torch.Tensor, z: torch.Tensor, big: bool) -> str:
    if torch.allclose(got.double(), reference_row(z.flip(0)).flip(0).double(), atol=1e-7):
        return " (you broke the stick from key 0: start from the nearest key, the last one)"
    if got.sum() > 1 + 1e-6:
        return " (the row sums to more than 1: each key takes a fraction of what is LEFT)"
    if torch.allclose(got.double(), (want * torch.sigmoid(-z)).double(), atol=1e-7):
        return " (your sum includes key j itself: only the keys l > j, nearer to the query, count)"
    if big:
        return (
            " (right on small logits, wrong here: 1 - sigmoid(z) rounds to 0 for z > 17, and "
            "total - cumsum cancels; use softplus and a reversed cumsum)"
        )
    return ""


def check_stick_row(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor], extreme: bool = False
) -> bool:
    """Check ``fn(z) -> weights [n]`` against the library; print one verdict (see the module)."""
    failures = []
    for z in _rows(extreme):
        big = bool(z.abs().max() > 20)
        desc = f"z={z.tolist()}" if len(z) <= 6 else f"the random row of {len(z)} keys"
        want = reference_row(z)  # before the learner's code, which might change z in place
        got = fn(z.clone())
        problem = form_problem(got, want)
        if problem:
            failures.append(f"{desc}: {problem}")
            continue
        if not torch.isfinite(got).all():
            j = int((~torch.isfinite(got)).nonzero()[0])
            failures.append(
                f"{desc}: non-finite weights (key {j}: {got[j].item()}); use softplus / "
                "logsigmoid, not log(1 - sigmoid)"
            )
            continue
        atol = 1e-30 if big else 1e-7
        wrong = ~torch.isclose(got.double(), want.double(), rtol=1e-4, atol=atol)
        if wrong.any():
            j = int(wrong.nonzero()[0])
            count = f" ({int(wrong.sum())} of {len(z)} keys wrong)" if len(z) > 1 else ""
            failures.append(
                f"{desc}, key {j}: got {got[j].item():.4g}, expected {want[j].item():.4g}{count}"
                + _hint(got, want, z, big)
            )
            continue
        if extreme:
            zg = z.clone().requires_grad_(True)
            out = fn(zg)
            if not (isinstance(out, torch.Tensor) and out.requires_grad):
                failures.append(
                    f"{desc}: the weights carry no gradient back to z: build them from z with "
                    "torch operations (not torch.tensor(...), .item() or .detach())"
                )
                continue
            (grad,) = torch.autograd.grad(out.sum(), zg)
            if not torch.isfinite(grad).all():
                failures.append(
                    f"{desc}: the gradient has NaN/inf: a log of sigmoid(z) or 1 - sigmoid(z) "
                    "computed as written reaches log 0 for large |z|, and so does log1p(exp(z)); "
                    "use -softplus(z) and F.logsigmoid(z)"
                )
    return report_check(name, failures)


def _side_hint(got: torch.Tensor, want: torch.Tensor, far_end: torch.Tensor) -> str:
    """A hint for one side of a bidirectional row: ``far_end`` is that side broken from the
    key farthest from the query, times 1/2."""
    g = got.double()
    if torch.allclose(g, 2 * want.double(), atol=1e-7):
        return " (each side is worth half: multiply its stick by 1/2)"
    if torch.allclose(g, far_end.double(), atol=1e-7) or torch.allclose(
        g, 2 * far_end.double(), atol=1e-7
    ):
        return " (you broke it from the far end: start next to the query)"
    return ""


def _first_wrong(got: torch.Tensor, want: torch.Tensor, start: int) -> str:
    wrong = ~torch.isclose(got.double(), want.double(), rtol=1e-5, atol=1e-7)
    j = int(wrong.nonzero()[0])
    return (
        f"at key {start + j} got {got[j].item():.4g}, expected {want[j].item():.4g} "
        f"({int(wrong.sum())} of {len(want)} keys wrong)"
    )


def check_bidirectional(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check ``fn(z [n], i) -> weights [n]`` for every query ``i`` of a row of 7 (see the
    module); print one verdict."""
    failures = []
    gen = torch.Generator().manual_seed(6)
    z = 1.5 * torch.randn(7, 7, generator=gen, dtype=torch.float64)
    want = stick_breaking_weights(z, causal=False)
    for i in range(7):
        got = fn(z[i].clone(), i)
        problem = form_problem(got, want[i])
        if problem:
            failures.append(f"query {i}: {problem}")
            continue
        left, right = z[i, :i], z[i, i + 1 :]
        if got[i] != 0:
            failures.append(
                f"query {i}: weight on the query's own position must be 0, got {got[i].item():.3g}"
            )
        elif not torch.allclose(got[:i], want[i, :i], atol=1e-7):
            far_end = 0.5 * reference_row(left.flip(0)).flip(0)
            failures.append(
                f"query {i}: left side wrong, {_first_wrong(got[:i], want[i, :i], 0)}; "
                "break z[:i] from key i-1 outward, times 1/2"
                + _side_hint(got[:i], want[i, :i], far_end)
            )
        elif not torch.allclose(got[i + 1 :], want[i, i + 1 :], atol=1e-7):
            far_end = 0.5 * reference_row(right)
            failures.append(
                f"query {i}: right side wrong, {_first_wrong(got[i + 1 :], want[i, i + 1 :], i + 1)}"
                "; break z[i+1:] from key i+1 outward, times 1/2"
                + _side_hint(got[i + 1 :], want[i, i + 1 :], far_end)
            )
    return report_check("bidirectional_row", failures)


EXERCISES = [
    Exercise("stick_loop", lambda fn: check_stick_row("stick_loop", fn), nb05.stick_loop),
    Exercise(
        "log_space_stick",
        lambda fn: check_stick_row("log_space_stick", fn, extreme=True),
        nb05.log_space_stick,
    ),
    Exercise("bidirectional_row", check_bidirectional, nb05.bidirectional_row),
]
