"""Notebook 00's checks: the worked solutions pass, and the wrong answers a learner is likely to
write are refused with the hint that names their mistake."""

import pytest
import torch
from check_verdicts import refused

from course_lib.teaching.permutation_checks import check_causal_attention, check_undo
from course_lib.teaching.solutions import nb00


def _attend(q, k, v, *, keep=torch.tril, fill=float("-inf"), scale=True, after=False):
    n = q.shape[-2]
    allowed = keep(torch.ones(n, n, dtype=torch.bool))
    s = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5 if scale else 1.0)
    if after:
        return (torch.softmax(s, -1) * allowed) @ v
    return torch.softmax(s.masked_fill(~allowed, fill), -1) @ v


def _later_rows_off(q, k, v):
    out = _attend(q, k, v)
    out[..., 1:, :] += 0.1  # query 0 right, the others not
    return out


def test_the_worked_solutions_pass(capsys):
    assert check_causal_attention(nb00.causal_attention)
    assert check_undo(nb00.undo_permutation)
    out = capsys.readouterr().out
    assert "✓ my_causal_attention: correct" in out and "✓ undo_permutation: correct" in out


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda q, k, v: _attend(q, k, v, keep=lambda m: m), "no mask"),
        (lambda q, k, v: _attend(q, k, v, after=True), "masked after the softmax"),
        (lambda q, k, v: _attend(q, k, v, keep=torch.triu), "keeps the keys j >= i (triu)"),
        (lambda q, k, v: _attend(q, k, v, fill=0.0), "set to 0, not -inf"),
        (lambda q, k, v: _attend(q, k, v, scale=False), "not divided by sqrt(d)"),
        (lambda q, k, v: torch.zeros_like(q), "its output must be v[..., 0, :]"),
        (_later_rows_off, "scale by sqrt(d), keep j <= i"),
        (lambda q, k, v: _attend(q.float(), k.float(), v.float()), "dtype torch.float32"),
        (lambda q, k, v: _attend(q, k, v)[None], "shape"),
        (lambda q, k, v: _attend(q, k, v).tolist(), "a list, not a tensor"),
        (lambda q, k, v: None, "None"),
    ],
)
def test_a_wrong_causal_attention_gets_its_hint(fn, hint, capsys):
    refused(check_causal_attention, fn, capsys, hint)


def test_a_wrong_value_is_told_where_and_how_much(capsys):
    assert not check_causal_attention(lambda q, k, v: _attend(q, k, v, fill=0.0))
    out = capsys.readouterr().out
    assert "entries differ; at [" in out and "got " in out and "expected " in out


def test_the_permutations_are_not_their_own_inverse():
    # otherwise applying perm again would pass
    for seq in (5, 9):
        perm = torch.randperm(seq, generator=torch.Generator().manual_seed(seq))
        assert not torch.equal(perm[perm], torch.arange(seq))


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda y, perm: y[..., perm, :], "applied perm instead of its inverse?"),
        (lambda y, perm: y, "y_perm unchanged"),
        (lambda y, perm: y.flip(-2), "holds token"),
        (lambda y, perm: y[..., torch.argsort(perm), :] + 1e-3, "is no row of y"),
        (lambda y, perm: y[..., torch.argsort(perm), :].double(), "dtype torch.float64"),
        (lambda y, perm: y[..., torch.argsort(perm), :].numpy(), "numpy"),
        (lambda y, perm: None, "None"),
    ],
)
def test_a_wrong_undo_gets_its_hint(fn, hint, capsys):
    refused(check_undo, fn, capsys, hint)


def test_a_wrong_undo_names_the_row_and_the_token_it_holds(capsys):
    assert not check_undo(lambda y, perm: y[..., perm, :])
    out = capsys.readouterr().out
    # seq 5, perm [1, 3, 0, 4, 2]: row 0 of y_perm[..., perm, :] is y[perm[perm[0]]] = y[3]
    assert "5 of 5 rows wrong; row 0 of the output holds token 3's row, expected token 0's" in out


def test_the_checks_leave_the_global_random_state_alone():
    state = torch.random.get_rng_state()
    check_causal_attention(nb00.causal_attention)
    check_undo(nb00.undo_permutation)
    assert torch.equal(torch.random.get_rng_state(), state)
