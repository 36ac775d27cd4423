"""The checker of notebook 11's exercise: FIRE's bias, written by the learner.

``check_fire_bias(fn)`` calls ``fn(query_positions, key_positions, params)`` the way the reference
attention calls a ``score_bias`` and compares it, on the causal pairs ``j <= i``, with the
formula (:func:`course_lib.teaching.solutions.nb11.fire_bias`)::

    b(i, j) = f( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(1 + c x)

on positions that start past 0 (they count from each sequence's first key), queries below, at
and beyond ``L``, and a batch of two sequences. It names the usual mistakes when it sees one: the
distance's sign, ``psi`` without the ``+ 1``, ``f`` applied before dividing, positions not counted
from the first key, a distance not clamped at 0 (NaN on the masked pairs, which still poisons the
gradients), gradients that do not reach ``c`` and ``L``, and the gradient of ``L`` at a tie
``i = L`` (the position wins: ``L`` gets none).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.teaching.answers import Exercise, form_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions.nb11 import fire_bias, fire_mlp

__all__ = ["check_fire_bias", "example_fire_params", "EXERCISES"]

F64 = torch.float64


def example_fire_params(heads: int = 3, hidden: int = 8, seed: int = 0) -> dict:
    """Float64 leaf tensors for FIRE's ``params`` (``c = 0.7``, ``L = 6``)."""
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(hidden, generator=g, dtype=F64),
        "b1": torch.randn(hidden, generator=g, dtype=F64) * 0.5,
        "w2": torch.randn(heads, hidden, generator=g, dtype=F64),
        "b2": torch.randn(heads, generator=g, dtype=F64),
        "c": torch.tensor(0.7, dtype=F64),
        "L": torch.tensor(6.0, dtype=F64),
    }
    return {k: v.requires_grad_() for k, v in params.items()}


def _variant(mistake: str) -> Callable:
    """The formula with one usual mistake, to recognise it in a learner's answer."""

    def bias(query_positions, key_positions, params):
        first = key_positions.amin(dim=-1, keepdim=True)
        if mistake == "not counted from the first key":
            first = torch.zeros_like(first)
        i = (query_positions - first).to(F64)
        j = (key_positions - first).to(F64)
        c, threshold = params["c"], params["L"]
        signed = j.unsqueeze(-2) - i.unsqueeze(-1) if mistake == "sign" else (
            i.unsqueeze(-1) - j.unsqueeze(-2)
        )  # fmt: skip
        distance = signed.clamp_min(0)
        reach = torch.where(i >= threshold, i, threshold)

        def psi(x):
            return torch.log(c * x) if mistake == "psi without + 1" else torch.log1p(c * x)

        if mistake == "f before dividing":
            out = fire_mlp(psi(distance), params) / psi(reach).unsqueeze(-1)
            return out.movedim(0, 1)
        return fire_mlp(psi(distance) / psi(reach).unsqueeze(-1), params).movedim(0, 1)

    return bias


_MISTAKES = {
    "sign": "the distance is i - j (query minus key: how far back the key is), not j - i",
    "psi without + 1": "psi(x) = log(1 + c x): without the 1, psi(0) = log 0 = -inf",
    "f before dividing": "f applies to the ratio psi(i - j) / psi(max(L, i)), after dividing",
    "not counted from the first key": "count positions from each sequence's first key "
    "(subtract the smallest key position), as the kernels do",
}


def _failures(fn: Callable) -> list[str]:
    """What is wrong with ``fn`` (empty: nothing), the first problem found."""
    params = example_fire_params()
    # two sequences, both starting past 0: queries below, at (i = 6) and past L = 6
    query = torch.stack((torch.arange(10) + 3, torch.arange(10) + 11))  # [2, 10]
    key = query.clone()
    causal = torch.ones(10, 10).tril().bool()
    want = fire_bias(query, key, params)
    try:
        got = fn(query, key, params)
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything
        return [f"calling it raised {type(exc).__name__}: {exc}"]
    problem = form_problem(got, want, dtype=False)
    if problem:
        return [f"{problem} ([batch, heads, Nq, Nk])"]
    ours = got.to(F64)[..., causal]
    if not torch.allclose(ours, want[..., causal], atol=1e-9, rtol=1e-9):
        for mistake, advice in _MISTAKES.items():
            other = _variant(mistake)(query, key, params)[..., causal]
            if torch.allclose(ours, other, atol=1e-9, rtol=1e-9, equal_nan=True):
                return [f"values: {advice}"]
        worst = (ours - want[..., causal]).detach().abs().nan_to_num(float("inf"))
        return [f"values differ from the formula on the pairs j <= i (largest difference "
                f"{float(worst.max()):.2g})"]  # fmt: skip
    # the keys after the query: masked out, but a NaN there still reaches the gradients
    if not torch.isfinite(got.detach()).all():
        return ["values: NaN or inf on the pairs j > i (keys after the query): the causal mask "
                "removes them from the softmax, but not from the backward pass (0 * NaN is NaN), so "
                "clamp the distance at 0 first: (i - j).clamp_min(0)"]  # fmt: skip
    # the gradient of L at a tie: a query exactly at i = L
    row = got[0, :, 6, :7].sum()  # query at position 9, first key 3: i = 6 = L
    (grad_l,) = torch.autograd.grad(row, params["L"], allow_unused=True, retain_graph=True)
    tie = 0.0 if grad_l is None else float(grad_l)
    if tie != 0.0:
        return [f"at a tie i = L the position wins and L gets no gradient; yours gives L "
                f"{tie:.3g} (torch.maximum splits a tie: use torch.where(i >= L, i, L))"]  # fmt: skip
    # c and L are learned: their gradients must reach them (a float() of either cuts them off)
    weights = torch.linspace(0.5, 1.5, int(causal.sum()), dtype=F64)
    learned = (params["c"], params["L"])
    theirs = torch.autograd.grad(
        (ours * weights).sum(), learned, allow_unused=True, retain_graph=True
    )
    expected = torch.autograd.grad((want[..., causal] * weights).sum(), learned, retain_graph=True)
    for name, g, e in zip(("c", "L"), theirs, expected, strict=True):
        if g is None or not torch.allclose(g, e, rtol=1e-6, atol=1e-9):
            got_text = "none" if g is None else f"{float(g):.4g}"
            return [f"the gradient of {name} is {got_text}, expected {float(e):.4g}: {name} is "
                    f"learned, so keep params[{name!r}] a tensor in the formula (float() or "
                    ".item() cuts it off)"]  # fmt: skip
    return []


def check_fire_bias(fn: Callable) -> bool:
    """Check ``fn`` against FIRE's formula (module docstring): print the verdict, or the first
    problem found with advice, and return True when everything holds."""
    return report_check("fire_bias", _failures(fn))


EXERCISES = [Exercise("fire_bias", check_fire_bias, fire_bias, accepts=("dtype",))]
