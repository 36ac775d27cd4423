"""Notebook 06's checks (ALiBi's slopes, T5's buckets, the half-attention distance, KERPLE's
bias): the worked solutions pass, and the wrong answers a learner is likely to write are refused
with the hint that names their mistake."""

import math

import torch
from check_verdicts import refused

from course_lib.teaching.kerple_checks import check_kerple_bias
from course_lib.teaching.score_bias_checks import (
    check_buckets,
    check_half,
    check_slopes,
    exponents,
)
from course_lib.teaching.solutions import nb06


def test_the_worked_solutions_pass(capsys):
    assert check_slopes(nb06.alibi_slopes)
    assert check_buckets(nb06.relative_bucket)
    assert check_half(nb06.half_attention_distance)
    assert check_kerple_bias(nb06.kerple_bias)
    assert capsys.readouterr().out.count("✓") == 4


def test_exponents_reads_the_slopes_as_powers_of_two():
    assert exponents(torch.tensor([0.5, 2**-1.5, 1 / 256])) == [-1.0, -1.5, -8.0]


def test_sorted_slopes_are_named(capsys):
    refused(
        check_slopes,
        lambda h: nb06.alibi_slopes(h).sort(descending=True).values,
        capsys,
        "3 heads: right slopes, wrong order (the extra ones come last)",
    )


def test_the_naive_geometric_sequence_shows_its_exponents(capsys):
    def naive(heads):
        return torch.tensor([2.0 ** (-8 * h / heads) for h in range(1, heads + 1)])

    refused(check_slopes, naive, capsys, "3 heads: got log2 [-2.667, -5.333, -8.0], expected")


def test_slopes_not_in_float32_or_not_a_tensor_are_refused(capsys):
    refused(
        check_slopes,
        lambda h: nb06.alibi_slopes(h).double(),
        capsys,
        "dtype torch.float64, expected torch.float32",
    )
    refused(check_slopes, lambda h: nb06.alibi_slopes(h).tolist(), capsys, "a list, not a tensor")


def test_the_buckets_sign_is_named(capsys):
    refused(
        check_buckets,
        lambda r, *a: nb06.relative_bucket(-r, *a),
        capsys,
        "first at r = -1000",
        "relative_position is key - query",
    )


def test_buckets_past_max_distance_not_held_in_the_last_one_are_named(capsys):
    def unclamped(r, bidirectional, num_buckets, max_distance):
        per = num_buckets // 2 if bidirectional else num_buckets
        exact = per // 2
        back = -r
        distance = back.abs() if bidirectional else back.clamp(min=0)
        offset = (back < 0).long() * per if bidirectional else torch.zeros_like(back)
        ratio = distance.clamp(min=exact).float() / exact
        far = exact + (torch.log(ratio) / math.log(max_distance / exact) * (per - exact)).long()
        return offset + torch.where(distance < exact, distance, far)

    refused(check_buckets, unclamped, capsys, "stay in the last bucket")


def test_a_unidirectional_bucket_of_the_absolute_distance_is_named(capsys):
    def absolute(r, bidirectional, num_buckets, max_distance):
        if bidirectional:
            return nb06.relative_bucket(r, True, num_buckets, max_distance)
        return nb06.relative_bucket(-r.abs(), False, num_buckets, max_distance)

    refused(check_buckets, absolute, capsys, "bidirectional=False", "all go to bucket 0")


def test_buckets_as_floats_are_refused_without_an_exception(capsys):
    refused(
        check_buckets,
        lambda *a: nb06.relative_bucket(*a).float(),
        capsys,
        "dtype torch.float32, expected torch.int64",
        ".long()",
    )


def test_a_half_distance_one_too_large_is_named(capsys):
    refused(
        check_half,
        lambda m, n: nb06.half_attention_distance(m, n) + 1,
        capsys,
        "slope 0.0, context 1: got 1, expected 0",
        "one too many",
    )


def test_a_half_distance_one_too_small_is_named(capsys):
    refused(
        check_half,
        lambda m, n: max(nb06.half_attention_distance(m, n) - 1, 0),
        capsys,
        "one too few",
    )


def test_the_unbounded_half_distance_is_named(capsys):
    def unbounded(m, n):
        return math.ceil(math.log(2) / m) - 1 if m > 0 else (n - 1) // 2

    refused(check_half, unbounded, capsys, "slope 0.001", "the unbounded context's answer")


def test_a_half_distance_as_a_tensor_is_accepted_and_none_refused(capsys):
    assert check_half(lambda m, n: torch.tensor(nb06.half_attention_distance(m, n)))
    capsys.readouterr()
    refused(check_half, lambda m, n: None, capsys, "returned None")
    refused(check_half, lambda m, n: torch.zeros(2), capsys, "expected one number")


def test_kerple_nan_at_negative_offsets_is_named(capsys):
    def signed(distance, r1, r2, variant="log"):
        shape = (-1, *([1] * distance.dim()))
        d = distance.to(r1.dtype)
        r1, r2 = r1.view(shape), r2.view(shape)
        return -r1 * torch.log1p(r2 * d) if variant == "log" else -r1 * d**r2

    refused(check_kerple_bias, signed, capsys, "NaN at negative offsets", "distance.abs()")


def test_kerple_without_the_one_is_named(capsys):
    def no_one(distance, r1, r2, variant="log"):
        if variant == "power":
            return nb06.kerple_bias(distance, r1, r2, variant)
        shape = (-1, *([1] * distance.dim()))
        return -r1.view(shape) * torch.log(r2.view(shape) * distance.abs().to(r1.dtype))

    refused(check_kerple_bias, no_one, capsys, "log(1 + r2 |d|)")


def test_kerple_as_a_list_is_refused_without_an_exception(capsys):
    refused(
        check_kerple_bias, lambda *a: nb06.kerple_bias(*a).tolist(), capsys, "a list, not a tensor"
    )
