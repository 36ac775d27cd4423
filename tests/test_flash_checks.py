"""Notebook 01b's check of the online-softmax step: the worked solution passes, and each wrong
step a careful learner could write is rejected."""

import pytest
import torch

from course_lib.teaching.flash_checks import check_merge, check_online_step, state_over
from course_lib.teaching.solutions import nb01b


def test_the_worked_solution_passes(capsys):
    assert check_online_step(nb01b.online_softmax_step)
    assert "✓ online_softmax_step: correct" in capsys.readouterr().out


def test_the_solution_keeps_a_fully_masked_row_empty():
    scores = torch.tensor([[float("-inf")] * 3, [0.5, 1.0, float("-inf")]])
    values = torch.randn(3, 4)
    state = (torch.full((2,), float("-inf")), torch.zeros(2), torch.zeros(2, 4))
    for start in range(3):
        block = scores[:, start : start + 1], values[start : start + 1]
        state = nb01b.online_softmax_step(state, *block)
    m, l_sum, acc = state
    assert m[0] == float("-inf") and l_sum[0] == 0 and (acc[0] == 0).all()
    _, l_want, acc_want = state_over(scores[1:], values)
    assert torch.allclose(l_sum[1:], l_want) and torch.allclose(acc[1:], acc_want)


def _textbook(state, scores, values, dim=-1):
    # the stable step without the masked-row guard, reading rows along `dim`
    m, l_sum, acc = state
    m_new = torch.maximum(m, scores.amax(dim=dim))
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new.unsqueeze(-1))
    return m_new, alpha * l_sum + p.sum(dim=dim), alpha.unsqueeze(-1) * acc + p @ values


class _RecomputesFromItsOwnStore:
    """Keeps every block it has seen and recomputes the state from them, ignoring the incoming
    state except to notice a fresh start (m all -inf)."""

    def __init__(self):
        self.scores, self.values = [], []

    def __call__(self, state, scores, values):
        if (state[0] == float("-inf")).all():
            self.scores, self.values = [], []
        self.scores.append(scores)
        self.values.append(values)
        return state_over(torch.cat(self.scores, -1), torch.cat(self.values, -2))


def _hard_coded_dim(state, scores, values):
    m, l_sum, acc = state
    m_new = torch.maximum(m, scores.amax(dim=3))
    shift = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - shift)
    p = torch.exp(scores - shift.unsqueeze(-1))
    return m_new, alpha * l_sum + p.sum(dim=3), alpha.unsqueeze(-1) * acc + p @ values


def _resets_every_row_on_any_empty_row(state, scores, values):
    m, l_sum, acc = state
    m_new = torch.maximum(m, scores.amax(dim=-1))
    if (m_new == float("-inf")).any():  # the guard taken for the whole tensor, not per row
        return m_new.clone(), torch.zeros_like(l_sum), torch.zeros_like(acc)
    return _textbook(state, scores, values)


def _check_rejects(step, capsys, expected: str):
    assert not check_online_step(step)
    out = capsys.readouterr().out
    assert "✗ online_softmax_step: not yet" in out and expected in out, out


def test_a_step_that_recomputes_from_its_own_store_is_rejected(capsys):
    _check_rejects(_RecomputesFromItsOwnStore(), capsys, "into a state over 7 other keys")


def test_a_step_with_a_hard_coded_dim_is_rejected(capsys):
    _check_rejects(_hard_coded_dim, capsys, "a 2-D input")


def test_a_step_that_resets_every_row_when_one_is_empty_is_rejected(capsys):
    _check_rejects(_resets_every_row_on_any_empty_row, capsys, "masked keys")


def test_a_step_without_the_masked_row_guard_is_rejected(capsys):
    _check_rejects(_textbook, capsys, "NaN in a row with no allowed key yet")


def test_an_unstabilised_step_is_rejected(capsys):
    def unstabilised(state, scores, values):
        m, l_sum, acc = state
        p = torch.exp(scores)
        return torch.maximum(m, scores.amax(dim=-1)), l_sum + p.sum(dim=-1), acc + p @ values

    _check_rejects(unstabilised, capsys, "blocks of 1")


def test_the_worked_merge_passes(capsys):
    assert check_merge(nb01b.merge_softmax_states)
    assert "✓ merge_softmax_states: correct" in capsys.readouterr().out


def _merge_without_rescaling(state_a, state_b):
    m = torch.maximum(state_a[0], state_b[0])
    return m, state_a[1] + state_b[1], state_a[2] + state_b[2]


def _merge_rescaling_the_sums_only(state_a, state_b):
    m, l_sum, _ = nb01b.merge_softmax_states(state_a, state_b)
    return m, l_sum, state_a[2] + state_b[2]


@pytest.mark.parametrize(
    ("merge", "hint"),
    [
        (lambda a, b: (a[0], a[1] + b[1], a[2] + b[2]), "the merged max should be max(m_a, m_b)"),
        (_merge_without_rescaling, "rescale l_a by exp(m_a - m)"),
        (_merge_rescaling_the_sums_only, "the merged acc is wrong: rescale like the sums"),
        (lambda a, b: nb01b.merge_softmax_states(a, b)[:2], "as a tuple (m, l, acc)"),
        (lambda a, b: [t.double() for t in nb01b.merge_softmax_states(a, b)], "m: dtype"),
    ],
)
def test_each_wrong_merge_gets_its_hint(merge, hint, capsys):
    assert not check_merge(merge)
    out = capsys.readouterr().out
    assert hint in out, out
