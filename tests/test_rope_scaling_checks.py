"""Notebook 07's checks (NTK frequencies, YaRN's ramp, dynamic NTK's base): the worked solutions
pass, and each wrong answer a learner is likely to write is refused with its hint."""

import math

import pytest
import torch
from check_verdicts import refused

from course_lib.encodings import rope_inverse_frequencies
from course_lib.teaching.rope_scaling_checks import (
    YARN_CASES,
    check_dynamic_base,
    check_ntk,
    check_yarn_share,
    yarn_share,
)
from course_lib.teaching.solutions import nb07


def test_the_worked_solutions_pass(capsys):
    assert check_ntk(nb07.ntk_inverse_frequencies)
    assert check_yarn_share(nb07.yarn_interpolation_share)
    assert check_dynamic_base(nb07.dynamic_base)
    assert capsys.readouterr().out.count("correct") == 3


# --- NTK -----------------------------------------------------------------------------------------


def test_ntk_plain_frequencies_are_named(capsys):
    def plain(head_dim, base, factor):
        return rope_inverse_frequencies(head_dim, base)

    refused(check_ntk, plain, capsys, "these are the plain frequencies; change the base")


def test_ntk_position_interpolation_is_named(capsys):
    def interpolated(head_dim, base, factor):
        return rope_inverse_frequencies(head_dim, base) / factor

    refused(check_ntk, interpolated, capsys, "position interpolation", "got 0.125, expected 1")


def test_ntk_base_times_s_without_the_exponent_is_named(capsys):
    def no_exponent(head_dim, base, factor):
        return rope_inverse_frequencies(head_dim, base * factor)

    refused(check_ntk, no_exponent, capsys, "raise s to D/(D-2)", "entries differ; at [1]")


def test_ntk_float64_and_a_list_are_refused_with_a_sentence(capsys):
    def float64(head_dim, base, factor):
        return nb07.ntk_inverse_frequencies(head_dim, base, factor).double()

    refused(check_ntk, float64, capsys, "expected torch.float32", ".float()")

    def as_list(head_dim, base, factor):  # used to crash on got.shape
        return nb07.ntk_inverse_frequencies(head_dim, base, factor).tolist()

    refused(check_ntk, as_list, capsys, "a list, not a tensor")


# --- YaRN ----------------------------------------------------------------------------------------


def test_yarn_cases_reach_both_clamps_a_clamped_high_and_a_step():
    shares = [yarn_share(*case) for case in YARN_CASES]
    assert all((s >= 0).all() and (s <= 1).all() for s in shares)
    assert any((s == 1).sum() >= 3 and (s == 0).sum() >= 3 for s in shares)
    clamped_high = dict(zip(YARN_CASES, shares, strict=True))[(16, 100.0, 131072, 10000.0, 1.0)]
    assert 0 < float(clamped_high[-1]) < 1  # high = D - 1 = 15 lies past the last pair, 7
    step = dict(zip(YARN_CASES, shares, strict=True))[(16, 10000.0, 64, 32.0, 16.0)]
    assert step.tolist() == [0.0] + [1.0] * 7


def test_yarn_accepts_a_list_a_numpy_array_and_float32(capsys):
    assert check_yarn_share(lambda *a: nb07.yarn_interpolation_share(*a).tolist())
    assert check_yarn_share(lambda *a: nb07.yarn_interpolation_share(*a).numpy())
    assert check_yarn_share(lambda *a: nb07.yarn_interpolation_share(*a).float())
    assert capsys.readouterr().out.count("correct") == 3


def _ramp(head_dim, base, train_len, fast, slow, *, clamp_ends=True, clamp_share=True):
    def pair(turns):
        return head_dim * math.log(train_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = math.floor(pair(fast)), math.ceil(pair(slow))
    if clamp_ends:
        low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    share = (torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)
    return share.clamp(0, 1) if clamp_share else share


def test_yarn_an_unclamped_share_is_named(capsys):
    out = refused(
        check_yarn_share,
        lambda *a: _ramp(*a, clamp_share=False),
        capsys,
        "clamp the share to [0, 1]",
        "exactly 1 for the slow pairs from high = 3 on",
    )
    assert "got 1.33333, expected 1" in out


def test_yarn_a_reversed_ramp_is_named(capsys):
    refused(check_yarn_share, lambda *a: 1 - _ramp(*a), capsys, "the ramp is reversed")
    refused(check_yarn_share, lambda *a: _ramp(*a).flip(0), capsys, "the ramp is reversed")


def test_yarn_ends_not_clamped_or_not_rounded_are_named(capsys):
    refused(
        check_yarn_share,
        lambda *a: _ramp(*a, clamp_ends=False),
        capsys,
        "clamp low and high to [0, D-1] = [0, 15]",
        "here they are -1 and 3 unclamped",
    )
    refused(
        check_yarn_share,
        lambda *a: yarn_share(*a, truncate=False),
        capsys,
        "round the ends: low = floor(t(beta_fast))",
    )


def test_yarn_the_missing_step_offset_is_named(capsys):
    def no_offset(head_dim, base, train_len, fast, slow):
        def pair(turns):
            return head_dim * math.log(train_len / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(math.floor(pair(fast)), 0), min(math.ceil(pair(slow)), head_dim - 1)
        t = torch.arange(head_dim // 2, dtype=torch.float64)
        return ((t - low) / (high - low)).clamp(0, 1)  # 0 / 0 where low == high

    refused(check_yarn_share, no_offset, capsys, "low == high == 0: add 0.001 to high")


def test_yarn_wrong_pairs_in_a_clamped_region_are_named(capsys):
    def slowest_short_of_one(*args):
        share = _ramp(*args)
        return torch.where(share == 1, torch.full_like(share, 0.9), share)

    refused(check_yarn_share, slowest_short_of_one, capsys, "their share is exactly 1")

    def fastest_above_zero(*args):
        share = _ramp(*args)
        return torch.where(share == 0, torch.full_like(share, 0.05), share)

    refused(check_yarn_share, fastest_above_zero, capsys, "their share is exactly 0")


# --- dynamic NTK ---------------------------------------------------------------------------------


def test_dynamic_without_max_is_named_both_ways(capsys):
    def no_max(base, head_dim, factor, seq_len, train_len):
        return base * (factor * seq_len / train_len - (factor - 1)) ** (head_dim / (head_dim - 2))

    refused(
        check_dynamic_base,
        no_max,
        capsys,
        "up to L it must be plain RoPE: n' = max(n, L)",
        "the complex number",
        "gives other frequencies than the base 10000",
    )


def test_dynamic_static_and_plain_bases_and_no_exponent_are_named(capsys):
    def static(base, head_dim, factor, seq_len, train_len):
        return base * factor ** (head_dim / (head_dim - 2))

    refused(check_dynamic_base, static, capsys, "the static NTK base", "the plain base")

    def no_exponent(base, head_dim, factor, seq_len, train_len):
        n = max(seq_len, train_len)
        return base * (factor * n / train_len - (factor - 1))

    refused(check_dynamic_base, no_exponent, capsys, "to the power D/(D-2)")


@pytest.mark.parametrize(
    "answer, text",
    [
        (None, "returned None"),
        (-5.0, "a base is a finite number > 0"),
        (float("nan"), "a base is a finite number > 0"),
        ("10000", "returned '10000', expected a number"),
    ],
)
def test_dynamic_answers_that_are_not_a_base_get_a_sentence(answer, text, capsys):
    refused(check_dynamic_base, lambda *args: answer, capsys, text)
