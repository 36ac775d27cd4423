"""Notebook 01's checks: the worked solutions pass (in either floating dtype), and the wrong
answers a learner is likely to write are refused with the hint that names their mistake."""

import math

import pytest
import torch
from check_verdicts import refused

from course_lib.encodings import sinusoidal_table
from course_lib.teaching.sinusoidal_checks import check_rotation, check_table
from course_lib.teaching.solutions import nb01


def test_the_worked_solutions_pass_in_either_dtype(capsys):
    assert check_table(nb01.sinusoidal_table)
    assert check_table(lambda n, d, b: nb01.sinusoidal_table(n, d, b).double())
    assert check_rotation(nb01.pair_rotation)
    assert check_rotation(lambda k, w: nb01.pair_rotation(k, w).float())
    out = capsys.readouterr().out
    assert "✓ my_sinusoidal_table: correct" in out and "✓ pair_rotation: correct" in out


def _frequencies_without_the_two(n, d, base):
    angles = torch.arange(n, dtype=torch.float64)[:, None] * base ** (-torch.arange(d // 2) / d)
    table = torch.empty(n, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = angles.sin(), angles.cos()
    return table


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda n, d, b: sinusoidal_table(n, d, b)[:, [i ^ 1 for i in range(d)]], "swapped"),
        (
            lambda n, d, b: torch.cat(
                (sinusoidal_table(n, d, b)[:, 0::2], sinusoidal_table(n, d, b)[:, 1::2]), 1
            ),
            "the sines fill the first half",
        ),
        (lambda n, d, b: sinusoidal_table(n + 1, d, b)[1:], "positions start at 0"),
        (lambda n, d, b: sinusoidal_table(n, d), "the base argument is ignored"),
        (_frequencies_without_the_two, "column 2 (sin of pair 1, frequency base**(-2/16))"),
        (lambda n, d, b: sinusoidal_table(n, d, b).T, "transposed"),
        (lambda n, d, b: sinusoidal_table(n, d, b).tolist(), "a list, not a tensor"),
        (lambda n, d, b: None, "None"),
    ],
)
def test_a_wrong_table_gets_its_hint(fn, hint, capsys):
    refused(check_table, fn, capsys, hint)


def test_a_wrong_column_is_told_where_it_differs(capsys):
    assert not check_table(_frequencies_without_the_two)
    out = capsys.readouterr().out
    assert "14 of 16 columns wrong" in out and "e.g. at p=1: got 0.5332, expected 0.3110" in out


def _textbook(shift, omega):
    # the rotation of a (cos, sin) pair: turns a (sin, cos) pair the other way
    c, s = math.cos(shift * omega), math.sin(shift * omega)
    return torch.tensor([[c, -s], [s, c]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (_textbook, "turns the pair back by shift * omega"),
        (lambda k, w: nb01.pair_rotation(1, w), "a shift of k positions turns it by k * omega"),
        (lambda k, w: torch.eye(2), "identity"),
        (lambda k, w: nb01.pair_rotation(k, w)[None], "shape (1, 2, 2)"),
        (lambda k, w: nb01.pair_rotation(k, w).tolist(), "a list, not a tensor"),
        (lambda k, w: None, "None"),
    ],
)
def test_a_wrong_rotation_gets_its_hint(fn, hint, capsys):
    refused(check_rotation, fn, capsys, hint)


def test_a_wrong_rotation_is_told_what_it_does_to_the_pair(capsys):
    assert not check_rotation(_textbook)
    out = capsys.readouterr().out
    assert (
        "shift=1, omega=1.0, p=0: R @ (sin, cos) = (-0.8415, 0.5403), expected (0.8415, 0.5403)"
        in out
    )
