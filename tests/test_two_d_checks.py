"""Notebook 09's checks (axial 2D RoPE from 1-D RoPE, a commuting second generator): the worked
solutions pass, and each wrong answer a learner is likely to write is refused with its hint."""

import pytest
import torch
from check_verdicts import refused

from course_lib.encodings import apply_rope, comrope_generators, skew_part
from course_lib.teaching.solutions import nb09
from course_lib.teaching.two_d_checks import (
    check_commuting_partner,
    check_rope_2d_from_1d,
    relative_defect,
    rope_2d_mistakes,
)
from course_lib.vision import grid_coords


def test_the_worked_solutions_pass(capsys):
    assert check_rope_2d_from_1d(nb09.rope_2d_from_1d)
    assert check_commuting_partner(nb09.commuting_partner)
    assert capsys.readouterr().out.count("correct") == 2


def test_relative_defect_tells_commuting_generators_from_generic_ones():
    gen = torch.Generator().manual_seed(0)
    commuting = comrope_generators(
        torch.randn(4, 4, generator=gen, dtype=torch.float64),
        torch.randn(2, 2, generator=gen, dtype=torch.float64),
    )
    generic = skew_part(torch.randn(2, 4, 4, generator=gen, dtype=torch.float64))
    assert relative_defect(commuting, generator=torch.Generator().manual_seed(1)) < 1e-10
    assert relative_defect(generic, generator=torch.Generator().manual_seed(1)) > 1e-2


# --- 2D RoPE -------------------------------------------------------------------------------------


def _halves(first, second, **options):
    def rope(x, c):
        half = x.shape[-1] // 2
        return torch.cat(
            (
                apply_rope(x[..., :half], c[:, first], **options),
                apply_rope(x[..., half:], c[:, second], **options),
            ),
            -1,
        )

    return rope


MISTAKES = {
    "the row and the column are swapped": _halves(1, 0, base=100.0),
    "these are base-10000 frequencies": _halves(0, 1),
    "the 'half' layout": _halves(0, 1, base=100.0, style="half"),
}


@pytest.mark.parametrize("hint", list(MISTAKES))
def test_each_usual_2d_mistake_gets_its_own_sentence(hint, capsys):
    out = refused(check_rope_2d_from_1d, MISTAKES[hint], capsys, hint)
    assert out.count(hint) == 3  # one line per input shape
    others = [h for h in MISTAKES if h != hint]
    assert not any(h in out for h in others)


def test_the_mistakes_written_out_match_rope_2d_mistakes():
    x, c = torch.randn(12, 8), grid_coords(3, 4) + torch.tensor([1, 6])
    named = rope_2d_mistakes(x, c)
    for hint, wrong in MISTAKES.items():
        matches = [h for h, w in named.items() if torch.allclose(wrong(x, c), w, atol=1e-5)]
        assert len(matches) == 1 and hint in matches[0]


def test_a_half_not_rotated_is_named_with_numbers(capsys):
    def rows_only(x, c):
        half = x.shape[-1] // 2
        return torch.cat((apply_rope(x[..., :half], c[:, 0], base=100.0), x[..., half:]), -1)

    refused(
        check_rope_2d_from_1d,
        rows_only,
        capsys,
        "input (12, 8): the column half differs: 48 of 96 entries differ; at [0, 4]",
    )


def test_2d_wrong_forms_get_a_sentence(capsys):
    refused(
        check_rope_2d_from_1d,
        lambda x, c: nb09.rope_2d_from_1d(x, c).double(),
        capsys,
        "dtype torch.float64, expected torch.float32",
    )
    refused(
        check_rope_2d_from_1d,
        lambda x, c: nb09.rope_2d_from_1d(x, c).mT,
        capsys,
        "input (12, 8): shape (8, 12), expected (12, 8) (transposed?)",
    )
    refused(check_rope_2d_from_1d, lambda x, c: None, capsys, "returned None")


# --- the commuting partner -----------------------------------------------------------------------


def test_a_symmetric_partner_gets_a_hint(capsys):
    refused(
        check_commuting_partner,
        lambda a: a @ a,
        capsys,
        "B is not skew-symmetric (B^T != -B): max |B^T + B| =",
        "B is symmetric",
    )
    refused(check_commuting_partner, lambda a: a.T @ a, capsys, "B is symmetric")


def test_a_multiple_of_a_and_zero_are_refused(capsys):
    refused(check_commuting_partner, lambda a: -2.5 * a, capsys, "B = -2.5 A")
    refused(check_commuting_partner, lambda a: a.T, capsys, "B = -1 A")
    refused(check_commuting_partner, torch.zeros_like, capsys, "B = 0 commutes with A but")


def test_a_partner_that_does_not_commute_is_refused_with_the_commutator(capsys):
    def random_skew(a):
        return skew_part(
            torch.randn(4, 4, generator=torch.Generator().manual_seed(99), dtype=a.dtype)
        )

    refused(
        check_commuting_partner, random_skew, capsys, "B does not commute with A: max |AB - BA| ="
    )


def test_partner_wrong_forms_get_a_sentence(capsys):
    refused(
        check_commuting_partner,
        lambda a: (a @ a @ a).float(),
        capsys,
        "B: dtype torch.float32, expected torch.float64",
    )
    refused(check_commuting_partner, lambda a: (a @ a @ a)[:3], capsys, "shape (3, 4)")
    refused(check_commuting_partner, lambda a: None, capsys, "returned None")
