"""The check of notebook 05's row exercises (the stick broken key by key, then in log space).

``check_stick_row(name, fn, extreme=False)`` calls ``fn(z)`` on rows of logits of one query
against the keys before it (position order, the last key nearest) and compares the weights with
the library's :func:`course_lib.encodings.stick_breaking_weights`. With ``extreme`` it adds
float32 rows with logits up to ``1e4`` and checks that the gradient stays finite (the log-space
exercise). A wrong answer gets a hint naming the usual mistake: the stick broken from the far
end, fractions of the whole stick instead of what is left, key ``j`` counted among the keys in
front of it, or ``1 - sigmoid`` rounding to 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.encodings import stick_breaking_weights
from course_lib.teaching.notebook import report_check

__all__ = ["reference_row", "check_stick_row"]


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
        if got.shape != z.shape:
            failures.append(f"{desc}: shape {tuple(got.shape)}, expected {tuple(z.shape)}")
            continue
        if not torch.isfinite(got).all():
            failures.append(
                f"{desc}: non-finite weights; use softplus / logsigmoid, not log(1 - sigmoid)"
            )
            continue
        atol = 1e-30 if big else 1e-7
        wrong = ~torch.isclose(got.double(), want.double(), rtol=1e-4, atol=atol)
        if wrong.any():
            j = int(wrong.nonzero()[0])
            failures.append(
                f"{desc}, key {j}: got {got[j].item():.4g}, expected {want[j].item():.4g}"
                + _hint(got, want, z, big)
            )
            continue
        if extreme:
            zg = z.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(fn(zg).sum(), zg)
            if not torch.isfinite(grad).all():
                failures.append(
                    f"{desc}: the gradient has NaN/inf: a log of sigmoid(z) or 1 - sigmoid(z) "
                    "computed as written reaches log 0 for large |z|, and so does log1p(exp(z)); "
                    "use -softplus(z) and F.logsigmoid(z)"
                )
    return report_check(name, failures)
