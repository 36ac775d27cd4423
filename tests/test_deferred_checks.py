"""The value checks of one attention() call are queued and read back in one transfer
(course_lib/call_scope.py: defer, read, settle), judged in the order they were queued, before
anything is computed from the values."""

import pytest
import torch

from course_lib.attention import attention
from course_lib.call_scope import call_scope, defer, read, settle
from course_lib.checks import any_true, refuse_if
from course_lib.host_reads import HostReads
from course_lib.runtime import kernels_available


def test_queued_checks_are_judged_at_the_next_read_in_order_and_in_one_transfer():
    seen = []
    with call_scope(), HostReads() as reads:
        defer([torch.tensor(True), torch.tensor(2.5)], seen.append)
        defer([torch.tensor(-3)], seen.append)
        assert seen == []  # nothing read yet
        (value,) = read(torch.tensor(7.0))
        assert seen == [[1.0, 2.5], [-3.0]] and value == 7.0
        assert reads.count == 1
        settle()  # nothing left to read
        assert reads.count == 1


def test_a_scope_judges_what_is_still_queued_when_it_ends():
    with pytest.raises(ValueError, match="late but not lost"):
        with call_scope():
            refuse_if(torch.tensor([False, True]), lambda: ValueError("late but not lost"))
    # a block that raised keeps its own error: the queue is dropped with the scope
    with pytest.raises(KeyError):
        with call_scope():
            refuse_if(torch.tensor(True), lambda: ValueError("never judged"))
            raise KeyError("first")


def test_outside_a_scope_a_check_is_read_and_judged_at_once():
    with HostReads() as reads:
        refuse_if(torch.tensor([False]), lambda: ValueError("not raised"))
        assert not any_true(torch.tensor([False, False]))
    assert reads.count == 2
    with pytest.raises(ValueError, match="at once"):
        refuse_if(torch.tensor([True]), lambda: ValueError("at once"))
    # a meta tensor has no values to test: nothing is read, nothing refused
    with HostReads() as reads:
        refuse_if(torch.ones(3, dtype=torch.bool, device="meta"), lambda: ValueError("no"))
    assert reads.count == 0


def test_an_imperative_read_judges_the_queue_first():
    # a check that needs its answer at once (any_true) still lets the earlier checks speak first
    with pytest.raises(ValueError, match="queued first"):
        with call_scope():
            refuse_if(torch.tensor(True), lambda: ValueError("queued first"))
            any_true(torch.tensor([True]))


@pytest.mark.parametrize(
    "penalty, message",
    [
        ([float("nan"), -1.0], "distance_penalty must be finite"),  # finiteness is queued first
        ([0.1, -1.0], r"distance_penalty \(lambda\) must be >= 0"),
    ],
)
def test_attention_raises_the_first_queued_error_before_any_launch(penalty, message):
    if not kernels_available():
        pytest.skip("Triton is not installed")
    from course_lib.kernels.common import planned_launches

    q = torch.randn(1, 2, 8, 16)
    with planned_launches(90) as launches, HostReads() as reads:
        with pytest.raises(ValueError, match=message):
            attention(q, q, q, method="rse", causal=True, backend="triton",
                      distance_penalty=torch.tensor(penalty))  # fmt: skip
    assert len(launches) == 0
    assert reads.count >= 1  # the one transfer, then whatever the error's message reads


def test_fox_finds_its_lowest_gate_in_the_same_read_and_refuses_an_opening_gate():
    q = torch.randn(1, 2, 8, 16)
    gates = torch.full((1, 2, 8), -0.5)
    with HostReads() as reads:
        attention(q, q, q, method="fox", causal=True, log_forget=gates)
    assert reads.count == 1  # finite, largest and lowest: one transfer
    gates[0, 1, 3] = 0.25
    with pytest.raises(ValueError, match="log_forget must be <= 0 .* maximum of 0.25"):
        attention(q, q, q, method="fox", causal=True, log_forget=gates)
