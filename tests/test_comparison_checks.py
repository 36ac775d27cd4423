"""Notebook 10's checks (the learned tables' parameters, the learning-rate schedule): the worked
solutions pass, and each wrong answer a learner is likely to write is refused with its hint."""

import math

import pytest
import torch
from check_verdicts import refused

from course_lib.compare import PRESETS
from course_lib.teaching.comparison_checks import check_schedule, check_table_parameters
from course_lib.teaching.solutions import nb10


def test_the_worked_solutions_pass(capsys):
    assert check_table_parameters(nb10.learned_table_parameters)
    assert check_schedule(nb10.warmup_cosine_lr)
    assert capsys.readouterr().out.count("correct") == 2


# --- the learned tables --------------------------------------------------------------------------


def _table_check(fn):
    return check_table_parameters(fn, runs=[])  # the model only, not the committed runs


def test_one_table_for_the_whole_model_is_named(capsys):
    out = refused(
        _table_check,
        lambda layers, positions, hidden: positions * hidden,
        capsys,
        "clm model of the cpu preset (2 layers, 64 positions, hidden 64): you count 4096, it has "
        "8192 more parameters than `none`. One table per layer?",
    )
    assert "the report's model (6 layers, 256 positions, hidden 384)" in out


def test_a_table_per_q_k_and_v_is_named(capsys):
    refused(
        _table_check,
        lambda layers, positions, hidden: 3 * layers * positions * hidden,
        capsys,
        "counts once",
    )


def test_a_table_missing_a_dimension_is_named(capsys):
    refused(
        _table_check,
        lambda layers, positions, hidden: layers * positions,
        capsys,
        "max_positions rows of hidden_size entries",
    )


@pytest.mark.parametrize(
    "answer, text",
    [
        (None, "returned None"),
        ("8192", "returned '8192', expected a number"),
        (4096.5, "a whole number"),
        (torch.tensor([8192, 8192]), "shape (2,), expected one number"),
    ],
)
def test_a_count_that_is_not_a_number_gets_a_sentence(answer, text, capsys):
    refused(_table_check, lambda *args: answer, capsys, text)


def test_a_count_as_an_integral_float_is_accepted(capsys):
    assert _table_check(lambda *args: float(nb10.learned_table_parameters(*args)))
    assert "✓" in capsys.readouterr().out


def test_committed_runs_with_another_count_are_reported(capsys):
    preset = PRESETS["cpu"]
    run = {"objective": "clm", "arm": "learned", "metrics": {"parameters": {"total": 5}}}
    assert not check_table_parameters(nb10.learned_table_parameters, preset, runs=[run])
    out = capsys.readouterr().out
    assert "the committed clm runs record another count than the model" in out
    assert "mlm" not in out


# --- the schedule --------------------------------------------------------------------------------


def _cosine(peak, floor, t):
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def test_the_warm_up_off_by_one_is_named(capsys):
    def from_zero(step, steps, peak, warmup, floor):
        if step < warmup:
            return peak * step / warmup
        return nb10.warmup_cosine_lr(step, steps, peak, warmup, floor)

    refused(
        check_schedule,
        from_zero,
        capsys,
        "steps=300, warmup=30, step 0 (warm-up): got 0, want 0.0001 (step counts from 0",
    )


def test_a_cosine_down_to_zero_is_named(capsys):
    def to_zero(step, steps, peak, warmup, floor):
        return nb10.warmup_cosine_lr(step, steps, peak, warmup, 0.0)

    out = refused(check_schedule, to_zero, capsys, "not at 0")
    assert "steps=50" not in out  # its floor is 0: that schedule is right


def test_t_divided_by_s_minus_w_is_named_not_taken_for_rounding(capsys):
    def never_one(step, steps, peak, warmup, floor):
        if step < warmup:
            return peak * (step + 1) / warmup
        return _cosine(peak, floor, (step - warmup) / (steps - warmup))

    out = refused(check_schedule, never_one, capsys, "divide by S - 1 - W")
    assert "float32" not in out


def test_t_not_starting_after_the_warm_up_is_named(capsys):
    def unshifted(step, steps, peak, warmup, floor):
        if step < warmup:
            return peak * (step + 1) / warmup
        return _cosine(peak, floor, step / (steps - 1))

    refused(check_schedule, unshifted, capsys, "t = (s - W) / (S - 1 - W)")


def test_float32_rounding_is_named(capsys):
    def float32(*args):
        return float(torch.tensor(nb10.warmup_cosine_lr(*args), dtype=torch.float32))

    refused(check_schedule, float32, capsys, "float32 rounding? compute in Python floats")


def test_a_one_number_tensor_is_read_as_its_number(capsys):
    assert check_schedule(
        lambda *args: torch.tensor(nb10.warmup_cosine_lr(*args), dtype=torch.float64)
    )
    assert "✓" in capsys.readouterr().out


def test_a_rate_that_is_not_a_number_gets_a_sentence(capsys):
    refused(check_schedule, lambda *args: None, capsys, "step 0: your function returned None")
    refused(check_schedule, lambda *args: [0.1], capsys, "returned [0.1], expected a number")
