"""Notebook 04's checks: the worked solutions pass, and the wrong answers a learner is likely
to write are refused with the hint that names their mistake."""

import math

import torch
from check_verdicts import refused

from course_lib.encodings import exposb_distance_bias
from course_lib.teaching.exposb_checks import (
    check_distance_logit_bias,
    check_pairwise_gain,
    shift_changes,
)
from course_lib.teaching.solutions import nb04


def _pairs(gain, style):
    t = torch.arange(len(gain) // 2)
    return (2 * t, 2 * t + 1) if style == "interleaved" else (t, t + len(gain) // 2)


def test_the_worked_solutions_pass(capsys):
    assert check_pairwise_gain(nb04.pairwise_gain)
    assert check_distance_logit_bias(nb04.distance_logit_bias)
    out = capsys.readouterr().out
    assert "✓ pairwise_gain: correct" in out and "✓ distance_logit_bias: correct" in out


def test_the_shift_test_tells_the_band_gain_from_the_pairwise_one():
    from course_lib.encodings import exposb_band_gain

    gain = exposb_band_gain(64)
    assert shift_changes(gain, "half") > 0.1
    assert shift_changes(nb04.pairwise_gain(gain, "half"), "half") < 1e-3


def test_the_gain_unchanged_is_refused_with_the_first_pair(capsys):
    refused(
        check_pairwise_gain,
        lambda g, style: g,
        capsys,
        "the two channels of a pair still differ",
        "pairs are (t, t + D/2)",
        "first pair 0",
    )


def test_the_interleaved_pairs_in_the_half_layout_are_named(capsys):
    def always_interleaved(gain, style):
        return nb04.pairwise_gain(gain, "interleaved")

    refused(
        check_pairwise_gain,
        always_interleaved,
        capsys,
        "D=16, half",
        "equal within the pairs of the interleaved layout",
    )


def test_one_channels_gain_copied_to_both_is_named(capsys):
    def copy_first(gain, style):
        first, second = _pairs(gain, style)
        out = gain.clone()
        out[second] = gain[first]
        return out

    refused(
        check_pairwise_gain,
        copy_first,
        capsys,
        "not the mean of the two gains",
        "entries differ",
        "the first channel's gain",
    )


def test_the_geometric_mean_is_named(capsys):
    def geometric(gain, style):
        first, second = _pairs(gain, style)
        out = gain.clone()
        out[first] = out[second] = (gain[first] * gain[second]).sqrt()
        return out

    refused(check_pairwise_gain, geometric, capsys, "the geometric mean")


def test_an_in_place_update_that_reads_a_changed_gain_is_refused(capsys):
    def in_place(gain, style):
        first, second = _pairs(gain, style)
        gain[first] = (gain[first] + gain[second]) / 2
        gain[second] = (gain[first] + gain[second]) / 2  # reads the new gain[first]
        return gain

    refused(check_pairwise_gain, in_place, capsys, "the two channels of a pair still differ")


def test_a_gain_of_another_dtype_or_a_list_is_refused_without_an_exception(capsys):
    refused(
        check_pairwise_gain,
        lambda g, s: nb04.pairwise_gain(g, s).double(),
        capsys,
        "dtype torch.float64, expected torch.float32",
    )
    refused(check_pairwise_gain, lambda g, s: nb04.pairwise_gain(g, s).tolist(), capsys, "a list")


def test_f_instead_of_log_f_is_named(capsys):
    refused(
        check_distance_logit_bias,
        lambda q, k: nb04.distance_logit_bias(q, k).exp(),
        capsys,
        "did you return f instead of log f?",
        "64 of 64 entries differ; at [0, 0]: got 1, expected 0",
    )


def test_the_signed_offset_is_named(capsys):
    def signed(q, k):
        return torch.log(0.7 + 0.3 * torch.exp(-0.005 * (q[:, None] - k[None, :]).float()))

    refused(check_distance_logit_bias, signed, capsys, "use |m - n|")


def test_log2_is_named(capsys):
    def base_two(q, k):
        return nb04.distance_logit_bias(q, k) / math.log(2)

    refused(check_distance_logit_bias, base_two, capsys, "log2 f")


def test_a_float64_bias_is_accepted_and_a_transposed_one_refused(capsys):
    assert check_distance_logit_bias(lambda q, k: exposb_distance_bias(q, k).double())
    capsys.readouterr()
    refused(
        check_distance_logit_bias,
        lambda q, k: nb04.distance_logit_bias(k, q),
        capsys,
        "shape (20, 3), expected (3, 20) (transposed?)",
        "[Nq, Nk]",
    )


def test_a_missing_return_is_refused(capsys):
    refused(check_distance_logit_bias, lambda q, k: None, capsys, "returned None")
