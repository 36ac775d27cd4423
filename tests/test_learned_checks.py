"""Notebook 02's checks: the worked solutions pass, an integer answer may come in any integer
form, and the wrong answers a learner is likely to write are refused with the hint that names
their mistake."""

import numpy as np
import pytest
import torch
from check_verdicts import refused

from course_lib.teaching.learned_checks import check_count, check_interpolation
from course_lib.teaching.solutions import nb02


@pytest.mark.parametrize(
    "form",
    [int, np.int64, torch.tensor, lambda n: torch.tensor(n, dtype=torch.int32)],
    ids=["int", "numpy int", "0-d long tensor", "0-d int32 tensor"],
)
def test_a_right_count_passes_as_any_integer(form, capsys):
    assert check_count(lambda h, m, e: form(nb02.attention_parameters(h, m, e)))
    assert "✓ attention_parameters: correct" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda h, m, e: 4 * (h * h + h), "the learned table, max_positions x hidden, is missing"),
        (lambda h, m, e: 4 * (h * h + h) + m * h, "no table to count"),
        (
            lambda h, m, e: 4 * h * h + (m * h if e == "learned" else 0),
            "a bias of size hidden",
        ),
        (lambda h, m, e: nb02.attention_parameters(h, m, e) + 0.5, "expected a whole number"),
        (lambda h, m, e: torch.tensor([nb02.attention_parameters(h, m, e)] * 2), "shape (2,)"),
        (lambda h, m, e: str(nb02.attention_parameters(h, m, e)), "expected a number"),
        (lambda h, m, e: True, "returned True"),
        (lambda h, m, e: None, "None"),
    ],
)
def test_a_wrong_count_gets_its_hint(fn, hint, capsys):
    refused(check_count, fn, capsys, hint)


def test_a_wrong_count_gives_both_numbers(capsys):
    assert not check_count(lambda h, m, e: 4 * (h * h + h))
    out = capsys.readouterr().out
    assert "learned, hidden=32, max_positions=64: got 4,224, expected 6,272" in out


def test_the_count_leaves_the_global_random_state_alone():
    state = torch.random.get_rng_state()
    check_count(nb02.attention_parameters)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_the_worked_interpolation_passes(capsys):
    assert check_interpolation(nb02.interpolate_table)
    assert "✓ interpolate_table: correct" in capsys.readouterr().out


def _reads(table, new_size, scale=None):
    old = table.shape[0]
    steps = (old - 1) / (new_size - 1) if scale is None else scale(old, new_size)
    x = torch.arange(new_size, dtype=torch.float64) * steps
    low = x.floor().long().clamp(max=old - 1)
    return x, low, (x - low).unsqueeze(1).to(table.dtype)


def _floor_plus_one(table, new_size):
    x, low, frac = _reads(table, new_size)
    return (1 - frac) * table[low] + frac * table[low + 1]  # past the table at the last row


def _swapped_weights(table, new_size):
    x, low, frac = _reads(table, new_size)
    return frac * table[low] + (1 - frac) * table[(low + 1).clamp(max=table.shape[0] - 1)]


def _floor_alone(table, new_size):
    return table[_reads(table, new_size)[1]]


def _nearest(table, new_size):
    return table[_reads(table, new_size)[0].round().long()]


def _last_row_short(table, new_size):
    # x = r * (old - 1) / new_size: the last new row stops short of the old last row
    x, low, frac = _reads(table, new_size, scale=lambda old, new: (old - 1) / new)
    high = (low + 1).clamp(max=table.shape[0] - 1)
    return (1 - frac) * table[low] + frac * table[high]


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (
            _floor_plus_one,
            "so floor(x) + 1 = 16 is past the table: clamp the upper index to old - 1",
        ),
        (_swapped_weights, "the weights are swapped"),
        (_floor_alone, "the old row floor(x) alone"),
        (_nearest, "the nearest old row"),
        (_last_row_short, "the last new row, 30, is not old row 15"),
        (lambda t, n: nb02.interpolate_table(t, n).double(), "dtype torch.float64"),
        (lambda t, n: nb02.interpolate_table(t, n).T, "transposed"),
        (lambda t, n: t.new_zeros(n, t.shape[1]), "the first new row, 0, is not old row 0"),
        (lambda t, n: None, "None"),
    ],
)
def test_a_wrong_interpolation_gets_its_hint(fn, hint, capsys):
    refused(check_interpolation, fn, capsys, hint)


def test_a_wrong_row_is_told_where_to_read(capsys):
    assert not check_interpolation(_swapped_weights)
    out = capsys.readouterr().out
    assert (
        "10 -> 25 rows (torch.float32): row 0 is wrong; it should read the old table at x = 0.000"
        in out
    )
    assert "entries differ; at [0, 0]: got" in out


def test_a_float64_table_is_answered_in_float64(capsys):
    # a result built in float32 whatever the table: right for float32 tables only
    assert not check_interpolation(lambda t, n: nb02.interpolate_table(t.float(), n))
    assert "5 -> 13 rows (torch.float64): dtype torch.float32" in capsys.readouterr().out


def test_only_an_index_error_is_caught():
    def broken(table, new_size):
        raise ValueError("a bug of its own")

    with pytest.raises(ValueError, match="a bug of its own"):
        check_interpolation(broken)
