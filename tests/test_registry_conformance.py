"""Every registered encoding through the same checks: the registry drives the parametrisation.

The checks live in :mod:`course_lib.conformance` (``check_encoding(name)`` runs them for a learner
and prints a report); here each one is a test per encoding. An encoding added to
``course_lib.encodings`` is picked up with no edit: shapes, the causal mask, permutation
behaviour, the shift, distance and learnable claims of its record, padding, cached decoding equals the full pass,
float64 gradcheck, clear errors for bad input, and the fused kernels against the reference
(outputs and gradients, padding, causal and bidirectional where allowed; generation).
"""

from dataclasses import replace

import pytest
import torch

from course_lib import conformance, registry
from course_lib.conformance import (  # noqa: F401 - shared with test_attention
    CHECKS,
    Skipped,
    check_encoding,
    example_params,
    positions,
)
from course_lib.registry import REGISTRY, get_encoding

NAMES = list(REGISTRY)


def run_check(check: str, name: str) -> None:
    """One conformance check as a test: a check that does not apply skips, saying why."""
    try:
        conformance.CHECKS[check](name)
    except Skipped as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", NAMES)
def test_conformance(name, check):
    run_check(check, name)


# -- the report a learner reads ----------------------------------------------------------------


def test_check_encoding_reports_each_check_and_a_failure_in_words(monkeypatch):
    report = check_encoding("rope", checks=["shapes", "shift", "errors"])
    assert report.passed and [c.name for c in report.checks] == ["shapes", "shift", "errors"]
    text = str(report)
    assert "every check passed" in text and "relative" in text
    # A wrong claim is a failure that says what was seen and what the record says.
    monkeypatch.setitem(registry._REGISTRY, "rope", replace(get_encoding("rope"), relative=False))
    report = check_encoding("rope", checks=["shift"])
    assert not report.passed
    (failure,) = report.failures()
    assert "changes nothing" in failure.detail and "relative=False" in failure.detail
    with pytest.raises(ValueError, match="valid"):
        check_encoding("rope", checks=["shapez"])
    with pytest.raises(ValueError, match="valid"):
        check_encoding("ropez")


def test_a_wrong_learnable_claim_fails_both_ways(monkeypatch):
    """``learnable`` is read off the module: its trainable parameters beyond the projections."""
    for name, claim in (("t5", False), ("alibi", True)):
        monkeypatch.setitem(registry._REGISTRY, name, replace(get_encoding(name), learnable=claim))
        (check,) = check_encoding(name, checks=["learnable"]).checks
        assert check.status == "FAIL" and f"learnable={claim}" in check.detail
    monkeypatch.undo()
    (check,) = check_encoding("t5", checks=["learnable"]).checks
    assert check.status == "pass" and "bias_table" in check.detail


def test_a_check_that_raises_is_a_failure_naming_the_exception(monkeypatch):
    def broken(name):
        raise IndexError("index 3 is out of bounds")

    monkeypatch.setitem(conformance.CHECKS, "shapes", broken)
    (check,) = check_encoding("none", checks=["shapes"]).checks
    assert check.status == "FAIL" and check.detail == "IndexError: index 3 is out of bounds"


def test_a_check_that_does_not_apply_is_skipped_with_its_reason():
    two_d = next((n for n in NAMES if get_encoding(n).position_dims == 2), None)
    if two_d is None:
        pytest.skip("no 2-D encoding is registered")
    (check,) = check_encoding(two_d, checks=["decoding"]).checks
    assert check.status == "skip" and "2-D" in check.detail
    assert torch.is_tensor(positions(two_d, 8)) and positions(two_d, 8).shape == (8, 2)


# -- the record's own rules ----------------------------------------------------------------------


def test_distance_only_is_derived_from_a_distance_bias_and_refused_where_it_cannot_hold():
    from course_lib.registry import Encoding, register, unregister

    alibi, rope = get_encoding("alibi"), get_encoding("rope")
    assert alibi.distance_only and not rope.distance_only  # derived: a distance_bias, or none
    assert get_encoding("rse").distance_only  # declared: a linear bias written as score_bias
    with pytest.raises(ValueError, match="has none"):
        replace(rope, name="rope_claims_a_bias", distance_only=True)
    with pytest.raises(ValueError, match="drop distance_only=False"):
        replace(alibi, name="alibi_denies_it", distance_only=False)
    # chapter is optional: an encoding without one is listed after the course's own
    extra = Encoding(name="no_chapter_yet", summary="a test record", module=rope.module,
                     color="#000000")  # fmt: skip
    register(extra)
    try:
        assert list(registry.REGISTRY)[-1] == "no_chapter_yet"
    finally:
        unregister("no_chapter_yet")
