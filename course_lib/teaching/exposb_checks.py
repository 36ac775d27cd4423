"""The checks of notebook 04's exercises (a gain that keeps RoPE relative; reading (a) as a bias).

``check_pairwise_gain(fn)`` calls ``fn(gain, style)`` with ExpoSB's band gain ``[D]`` (``D`` = 16
and 64) and ``style`` ``"interleaved"`` or ``"half"``, and compares the result with the gain in
which both channels of every RoPE pair get the mean of their two gains; then it runs the shift
test (:func:`shift_changes`) with it. A wrong answer hears whether the channels of a pair still
differ (with the pairs of the layout, and a note when they are the other layout's pairs) or are
equal but not the mean (one channel's gain copied to both, or the geometric mean).

``check_distance_logit_bias(fn)`` calls ``fn(query_positions, key_positions)`` with integer
positions and compares the ``[Nq, Nk]`` result with the library's
:func:`course_lib.encodings.exposb_distance_bias`, ``log f(|m - n|)``; then it checks that adding
it to logits gives the softmax weights times ``f``, renormalised. The positions are integers, so
any floating dtype is accepted. A wrong answer gets a hint naming the usual mistake: ``f`` instead
of ``log f``, the signed offset instead of ``|m - n|``, or ``log2`` instead of the natural log.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from course_lib.encodings import apply_rope, exposb_band_gain, exposb_distance_bias
from course_lib.teaching.answers import Exercise, form_problem, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb04

__all__ = ["shift_changes", "check_pairwise_gain", "check_distance_logit_bias", "EXERCISES"]


def shift_changes(gain: torch.Tensor, style: str, shifts=(1, 10, 100, 1000)) -> float:
    """The largest, over ``shifts``, median relative change of the score
    ``(gain * R_m q) . (gain * R_n k)`` of 64 random pairs when ``m`` and ``n`` both move by
    ``s`` (0 for a gain that keeps the score relative)."""
    q, k = torch.randn(2, 64, len(gain), generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([5, 0])

    def score(s):
        qr = gain * apply_rope(q[:, None], pos[:1] + s, style=style)[:, 0]
        kr = gain * apply_rope(k[:, None], pos[1:] + s, style=style)[:, 0]
        return (qr * kr).sum(-1)

    return max(
        float(((score(s) - score(0)).abs() / score(0).abs().clamp(min=1e-3)).median())
        for s in shifts
    )


def _pairs(dim: int, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(dim // 2)
    return (2 * t, 2 * t + 1) if style == "interleaved" else (t, t + dim // 2)


_PAIRS_TEXT = {"interleaved": "(2t, 2t+1)", "half": "(t, t + D/2)"}


def _gain_hint(got: torch.Tensor, gain: torch.Tensor, style: str) -> str:
    first, second = _pairs(len(gain), style)
    for name, value in (
        ("first", gain[first]),
        ("second", gain[second]),
        ("geometric", (gain[first] * gain[second]).sqrt()),
    ):
        if torch.allclose(got[first].double(), value.double(), atol=1e-6):
            if name == "geometric":
                return " (the geometric mean: take the mean (gain[a] + gain[b]) / 2)"
            return (
                f" (both channels got the {name} channel's gain: take the mean "
                "(gain[a] + gain[b]) / 2, from the gains before you change any)"
            )
    return ""


def check_pairwise_gain(fn: Callable[[torch.Tensor, str], torch.Tensor]) -> bool:
    """Check ``fn(gain [D], style) -> [D]`` (see the module); print one verdict."""
    failures = []
    for dim in (16, 64):
        g = exposb_band_gain(dim)
        for style in ("interleaved", "half"):
            where = f"D={dim}, {style}"
            first, second = _pairs(dim, style)
            want = g.clone()  # before your function runs: it gets a copy, and may change it
            want[first] = want[second] = (g[first] + g[second]) / 2
            got = fn(g.clone(), style)
            problem = form_problem(got, want)
            if problem:
                failures.append(f"{where}: {problem}")
                continue
            apart = ~torch.isclose(got[first], got[second])
            if apart.any():
                t = int(apart.nonzero()[0])
                a, b = int(first[t]), int(second[t])
                other = "half" if style == "interleaved" else "interleaved"
                o_first, o_second = _pairs(dim, other)
                note = (
                    f"; yours are equal within the pairs of the {other} layout"
                    if torch.allclose(got[o_first], got[o_second])
                    else ""
                )
                failures.append(
                    f"{where}: the two channels of a pair still differ (pairs are "
                    f"{_PAIRS_TEXT[style]}{note}): {int(apart.sum())} of {dim // 2} pairs, first "
                    f"pair {t}, channels {a} and {b}: {got[a].item():.4g} and {got[b].item():.4g}"
                )
                continue
            problem = value_problem(got, want, atol=1e-6)
            if problem:
                failures.append(
                    f"{where}: equal within pairs, but not the mean of the two gains: {problem}"
                    + _gain_hint(got, g, style)
                )
                continue
            change = shift_changes(got, style)
            if change > 1e-3:
                failures.append(
                    f"{where}: the score still changes under a shift (median change "
                    f"{100 * change:.2g}%)"
                )
    return report_check("pairwise_gain", failures)


def _bias_hint(got: torch.Tensor, want: torch.Tensor, qpos, kpos) -> str:
    g, w = got.detach().double(), want.double()
    if torch.allclose(g, w.exp(), atol=1e-5):
        return " (did you return f instead of log f?)"
    if torch.allclose(g, w / math.log(2), atol=1e-5):
        return " (log2 f: the bias is the natural log, log f; base 2 is the kernel's form)"
    offset = (qpos[:, None] - kpos[None, :]).double()
    for signed in (offset, -offset):
        bias = torch.log(0.7 + 0.3 * torch.exp(-0.005 * signed))
        if torch.allclose(g, bias, atol=1e-5, equal_nan=True):
            return " (use |m - n|: a key after the query is as far away as one before it)"
    return ""


def check_distance_logit_bias(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(query_positions [Nq], key_positions [Nk]) -> [Nq, Nk]`` (see the module);
    print one verdict."""
    failures = []
    gen = torch.Generator().manual_seed(4)
    for qpos, kpos in [
        (torch.arange(8), torch.arange(8)),
        (torch.arange(3) + 500, torch.arange(0, 1000, 50)),
    ]:
        want = exposb_distance_bias(qpos, kpos)
        got = fn(qpos.clone(), kpos.clone())
        problem = form_problem(got, want, dtype=False)
        if problem:
            failures.append(
                f"{problem}; the bias is [Nq, Nk]" if problem.startswith("shape") else problem
            )
            continue
        problem = value_problem(got, want, atol=1e-5)
        if problem:
            failures.append(
                f"positions {qpos[:2].tolist()}...: values differ from "
                f"log(0.7 + 0.3 exp(-0.005 |m-n|)): {problem}" + _bias_hint(got, want, qpos, kpos)
            )
            continue
        logits = torch.randn(len(qpos), len(kpos), generator=gen, dtype=torch.float64)
        p = torch.softmax(logits, -1) * want.double().exp()
        problem = value_problem(
            torch.softmax(logits + got.detach().double(), -1),
            p / p.sum(-1, keepdim=True),
            atol=1e-6,
        )
        if problem:
            failures.append(f"softmax(logits + bias) differs from p*f renormalised: {problem}")
    return report_check("distance_logit_bias", failures)


EXERCISES = [
    Exercise("pairwise_gain", check_pairwise_gain, nb04.pairwise_gain),
    Exercise(
        "distance_logit_bias",
        check_distance_logit_bias,
        nb04.distance_logit_bias,
        accepts=("dtype",),
    ),
]
