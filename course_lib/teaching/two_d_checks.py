"""The checks of notebook 09's exercises: axial 2D RoPE from 1-D RoPE, and a commuting generator.

``check_rope_2d_from_1d(fn)`` calls ``fn(x, coords)`` with float32 ``x`` of shapes ``[12, 8]``,
``[2, 3, 12, 16]`` and ``[12, 32]`` and the coordinates of a 3 x 4 grid moved by (1, 6), and
compares the result with the library's :func:`course_lib.encodings.apply_rope_2d`. A wrong answer
that is one of :func:`rope_2d_mistakes` (the row and column swapped, base 10000, the "half"
layout) gets that mistake's sentence; any other names the half (row or column) that differs.

``check_commuting_partner(fn)`` calls ``fn(a)`` with four random float64 skew-symmetric 4 x 4
matrices ``A`` and checks the answer ``B`` for what the exercise asks: skew-symmetric, commuting
with ``A``, not a multiple of ``A`` (0 included), and LieRE with ``(A, B)`` relative
(:func:`relative_defect`). Each failure gives its size (``max |B^T + B|``, ``max |AB - BA|``, the
multiple); a symmetric ``B`` (an even power of ``A``, ``A^T A``) gets a hint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.encodings import apply_rope, apply_rope_2d, lie_rotation, skew_part
from course_lib.teaching.answers import Exercise, form_problem, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb09
from course_lib.vision import grid_coords

__all__ = [
    "relative_defect",
    "rope_2d_mistakes",
    "check_rope_2d_from_1d",
    "check_commuting_partner",
    "EXERCISES",
]

ROPE_2D_SHAPES = ((12, 8), (2, 3, 12, 16), (12, 32))


def relative_defect(
    gens: torch.Tensor, trials: int = 50, generator: torch.Generator | None = None
) -> float:
    """``max |R(p)^T R(r) - R(r - p)|`` of LieRE with the generators ``gens`` ``[2, D, D]``
    over ``trials`` random float64 pairs ``(p, r)`` with coordinates in ``[0, 10)``: 0 (up to
    rounding) when the rotation is relative. ``generator``: the random draws' (None: torch's
    global one)."""
    p, r = (torch.rand(2, trials, 2, generator=generator, dtype=torch.float64) * 10).unbind(0)
    lhs = lie_rotation(p, gens).transpose(-1, -2) @ lie_rotation(r, gens)
    return float((lhs - lie_rotation(r - p, gens)).abs().max())


def rope_2d_mistakes(x: torch.Tensor, c: torch.Tensor) -> dict[str, torch.Tensor]:
    """The usual wrong answers for ``x`` and ``coords`` ``c``, each under what to change."""
    half = x.shape[-1] // 2

    def per_half(style):
        return torch.cat(
            (
                apply_rope(x[..., :half], c[:, 0], base=100.0, style=style),
                apply_rope(x[..., half:], c[:, 1], base=100.0, style=style),
            ),
            dim=-1,
        )

    return {
        "the row and the column are swapped: the first half turns with coords[:, 0], the row": (
            apply_rope_2d(x, c.flip(-1))
        ),
        "these are base-10000 frequencies (apply_rope's default): pass base=base, 100 for 2D "
        "RoPE": apply_rope_2d(x, c, base=10000.0),
        "each half pairs channel t with t + D/4 (the 'half' layout): the interleaved layout pairs "
        "(2t, 2t+1), apply_rope's default style": per_half("half"),
    }


def check_rope_2d_from_1d(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(x [..., seq, D], coords [seq, 2]) -> [..., seq, D]`` (see the module); print
    one verdict."""
    failures = []
    gen = torch.Generator().manual_seed(9)
    for shape in ROPE_2D_SHAPES:
        x = torch.randn(shape, generator=gen)
        c = grid_coords(3, 4) + torch.tensor([1, 6])
        want = apply_rope_2d(x, c)
        got = fn(x.clone(), c.clone())
        problem = form_problem(got, want)
        if problem:
            failures.append(f"input {shape}: {problem}")
            continue
        problem = value_problem(got, want, rtol=1e-5, atol=1e-5)
        if problem is None:
            continue
        known = [
            hint
            for hint, wrong in rope_2d_mistakes(x, c).items()
            if torch.allclose(got, wrong, atol=1e-5)
        ]
        if known:
            failures.append(f"input {shape}: {known[0]}")
            continue
        half = shape[-1] // 2
        wrong = [
            name
            for name, part in (("row half", slice(None, half)), ("column half", slice(half, None)))
            if not torch.allclose(got[..., part], want[..., part], atol=1e-5)
        ]
        verb = "differ" if len(wrong) > 1 else "differs"
        failures.append(f"input {shape}: the {' and the '.join(wrong)} {verb}: {problem}")
    return report_check("rope_2d_from_1d", failures)


def check_commuting_partner(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Check ``fn(a [4, 4]) -> b [4, 4]`` (see the module); print one verdict."""
    failures = []
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        a = skew_part(torch.randn(4, 4, generator=gen, dtype=torch.float64))
        b = fn(a.clone())
        problem = form_problem(b, a)
        if problem:
            failures.append(f"seed {seed}: B: {problem}")
            continue
        skew_error = float((b + b.T).abs().max())
        if skew_error > 1e-10:
            symmetric = bool(torch.allclose(b, b.T, atol=1e-10)) and float(b.abs().max()) > 1e-10
            hint = (
                " (B is symmetric, as the even powers of A and A^T A are; which powers of a "
                "skew-symmetric matrix are skew?)"
                if symmetric
                else ""
            )
            failures.append(
                f"seed {seed}: B is not skew-symmetric (B^T != -B): max |B^T + B| = "
                f"{skew_error:.3g}{hint}"
            )
        commutator = float((a @ b - b @ a).abs().max())
        if commutator > 1e-9:
            failures.append(
                f"seed {seed}: B does not commute with A: max |AB - BA| = {commutator:.3g}"
            )
        ratio = float((b * a).sum() / (a * a).sum())
        if float(b.abs().max()) < 1e-12:
            failures.append(
                f"seed {seed}: B = 0 commutes with A but is a multiple of it (0 A): it adds no "
                "second axis"
            )
        elif torch.allclose(b, ratio * a, atol=1e-8):
            failures.append(
                f"seed {seed}: B is a multiple of A (B = {ratio:.3g} A; then both axes turn the "
                "same planes in step)"
            )
        if not failures:
            defect = relative_defect(torch.stack((a, b)), generator=gen)
            if defect > 1e-9:
                failures.append(
                    f"seed {seed}: LieRE with (A, B) is not relative: max |R(p)^T R(r) - "
                    f"R(r - p)| = {defect:.3g}"
                )
    return report_check("commuting_partner", failures)


EXERCISES = [
    Exercise("rope_2d_from_1d", check_rope_2d_from_1d, nb09.rope_2d_from_1d),
    Exercise("commuting_partner", check_commuting_partner, nb09.commuting_partner),
]
