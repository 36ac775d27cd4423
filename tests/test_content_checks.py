"""Notebook 08's checks (FoX's bias matrix, CoPE's counts and CoPE's bias): the worked solutions
pass, and each wrong answer a learner is likely to write is refused with its hint."""

import pytest
import torch
from check_verdicts import refused

from course_lib.teaching.content_checks import (
    check_counts,
    check_fox_bias,
    check_row_bias,
    fox_gates,
    reference_fox_bias,
)
from course_lib.teaching.solutions import nb08


def test_the_worked_solutions_pass(capsys):
    assert check_fox_bias(nb08.fox_bias_matrix)
    assert check_counts(nb08.cope_counts)
    assert check_row_bias(nb08.cope_row_bias)
    assert capsys.readouterr().out.count("correct") == 3


def test_the_reference_follows_the_gates_dtype():
    for dtype in (torch.float32, torch.float64):
        gates = fox_gates(5, 1, dtype)
        assert reference_fox_bias(gates).dtype == dtype
        assert torch.allclose(reference_fox_bias(gates), nb08.fox_bias_matrix(gates), atol=1e-6)


# --- FoX -----------------------------------------------------------------------------------------


def _differences(log_f):
    c = log_f.cumsum(0)
    return c[:, None] - c[None, :]


def test_fox_a_float32_answer_to_float64_gates_gets_a_sentence(capsys):
    # used to raise RuntimeError in torch.allclose
    refused(
        check_fox_bias,
        lambda log_f: nb08.fox_bias_matrix(log_f).float(),
        capsys,
        "n=5 (float64 gates): dtype torch.float32, expected torch.float64",
    )


def test_fox_a_hard_coded_float64_is_refused_on_float32_gates(capsys):
    refused(
        check_fox_bias,
        lambda log_f: nb08.fox_bias_matrix(log_f.double()),
        capsys,
        "n=7 (float32 gates): dtype torch.float64, expected torch.float32",
    )


def test_fox_the_unmasked_and_the_transposed_matrix_are_named(capsys):
    refused(
        check_fox_bias,
        _differences,
        capsys,
        "above the diagonal must be 0",
        "at [0, 1]",
        "mask the upper triangle with torch.tril",
    )
    refused(check_fox_bias, lambda log_f: nb08.fox_bias_matrix(log_f).T, capsys, "transposed")


def test_fox_the_sign_is_named(capsys):
    refused(
        check_fox_bias, lambda log_f: -_differences(log_f).tril(), capsys, "the sign", "at [1, 0]"
    )


def test_fox_the_sum_from_key_j_is_named_with_numbers(capsys):
    def from_j(log_f):
        return (_differences(log_f) + log_f[None, :]).tril()

    out = refused(check_fox_bias, from_j, capsys, "the sum starts after key j: l = j+1 .. i")
    assert "n=5 (float64 gates): wrong values: 15 of 25 entries differ; at [0, 0]" in out


def test_fox_the_sum_without_log_f_i_is_named(capsys):
    def up_to_i_minus_1(log_f):
        c = log_f.cumsum(0) - log_f
        return (c[:, None] - c[None, :]).tril()

    refused(check_fox_bias, up_to_i_minus_1, capsys, "include log f_i, leave out log f_j")


# --- CoPE's counts -------------------------------------------------------------------------------


def _reversed_sum(s):
    return torch.sigmoid(s).flip(0).cumsum(0).flip(0)


def test_counts_not_clamped_or_clamped_at_npos_are_named(capsys):
    refused(
        check_counts,
        lambda s, npos: _reversed_sum(s),
        capsys,
        "n=9, npos=3: wrong counts:",
        "expected 2 (clamp the counts at npos - 1)",
    )
    refused(check_counts, lambda s, npos: _reversed_sum(s).clamp(max=npos), capsys, "not at npos")


def test_counts_without_key_j_are_named(capsys):
    def without_j(s, npos):
        return (_reversed_sum(s) - torch.sigmoid(s)).clamp(max=npos - 1)

    refused(check_counts, without_j, capsys, "key j counts itself: include l = j")


@pytest.mark.parametrize("clamp", [True, False])
def test_counts_a_forward_cumsum_is_named(clamp, capsys):
    def forward(s, npos):
        counts = torch.sigmoid(s).cumsum(0)
        return counts.clamp(max=npos - 1) if clamp else counts

    refused(check_counts, forward, capsys, "a forward cumsum", "at [0]: got 0.789631")


def test_counts_a_list_or_none_gets_a_sentence(capsys):
    refused(check_counts, lambda s, npos: nb08.cope_counts(s, npos).tolist(), capsys, "a list")
    refused(check_counts, lambda s, npos: None, capsys, "returned None")


# --- CoPE's bias ---------------------------------------------------------------------------------


def test_row_bias_floor_plus_one_is_explained_not_raised(capsys):
    def floor_plus_one(q, table, positions):
        z = table @ q
        lower = positions.floor()
        w = positions - lower
        return z[lower.long()] * (1 - w) + z[lower.long() + 1] * w

    out = refused(
        check_row_bias,
        floor_plus_one,
        capsys,
        "IndexError",
        "at p = npos - 1 = 4 the upper neighbour is p itself: use ceil(p), or clamp the index",
    )
    assert "1 problem(s)" in out  # the random positions stay below 4: that case passes


def test_row_bias_other_errors_are_the_learners_to_see():
    def broken(q, table, positions):
        raise ValueError("a bug of the learner's own")

    with pytest.raises(ValueError, match="own"):
        check_row_bias(broken)


def test_row_bias_swapped_weights_rounding_and_the_floor_alone_are_named(capsys):
    def swapped(q, table, positions):
        z = table @ q
        w = positions - positions.floor()
        return z[positions.floor().long()] * w + z[positions.ceil().long()] * (1 - w)

    refused(check_row_bias, swapped, capsys, "the weights are swapped", "7 of 7 entries differ")
    refused(
        check_row_bias,
        lambda q, t, p: (t @ q)[p.round().long()],
        capsys,
        "p rounded to the nearest",
    )
    refused(check_row_bias, lambda q, t, p: (t @ q)[p.floor().long()], capsys, "z[floor p] alone")


def test_row_bias_float32_gets_a_sentence(capsys):
    refused(
        check_row_bias,
        lambda q, t, p: nb08.cope_row_bias(q, t, p).float(),
        capsys,
        "dtype torch.float32, expected torch.float64",
    )
