"""Notebook 05's checks of the stick-breaking rows: the worked solutions pass, and the wrong
answers a learner is likely to write are refused with the hint that names their mistake."""

import torch
import torch.nn.functional as F
from check_verdicts import refused

from course_lib.teaching.solutions import nb05
from course_lib.teaching.stick_checks import check_bidirectional, check_stick_row


def _loop(fn, capsys, *texts):
    refused(lambda f: check_stick_row("stick_loop", f), fn, capsys, *texts)


def _log(fn, capsys, *texts):
    refused(lambda f: check_stick_row("log_space_stick", f, extreme=True), fn, capsys, *texts)


def test_the_worked_solutions_pass(capsys):
    assert check_stick_row("stick_loop", nb05.stick_loop)
    assert check_stick_row("log_space_stick", nb05.log_space_stick, extreme=True)
    assert check_bidirectional(nb05.bidirectional_row)
    out = capsys.readouterr().out
    assert out.count("✓") == 3


def test_fractions_of_the_whole_stick_are_named(capsys):
    _loop(torch.sigmoid, capsys, "key 0: got", "each key takes a fraction of what is LEFT")


def test_key_j_among_the_keys_in_front_of_it_is_named(capsys):
    def includes_j(z):
        return nb05.stick_loop(z) * torch.sigmoid(-z)

    _loop(includes_j, capsys, "your sum includes key j itself")


def test_the_stick_broken_from_the_far_end_is_named(capsys):
    _loop(lambda z: nb05.stick_loop(z.flip(0)).flip(0), capsys, "you broke the stick from key 0")


def test_one_minus_sigmoid_on_huge_logits_is_named(capsys):
    def textbook(z):  # exact on small logits, 1 - sigmoid(z) rounds to 0 for z > 17
        remaining = torch.cat([torch.ones(1, dtype=z.dtype), (1 - torch.sigmoid(z)).flip(0)])
        return torch.sigmoid(z) * remaining.cumprod(0)[:-1].flip(0).clamp(min=1e-45)

    assert check_stick_row("stick_loop", textbook)
    capsys.readouterr()
    _log(textbook, capsys, "1 - sigmoid(z) rounds to 0 for z > 17")


def test_a_nan_gradient_is_named(capsys):
    def log1p_exp(z):  # log1p(exp(z)) is exp(z) / (1 + exp(z)) = inf / inf in the backward pass
        softplus = torch.log1p(torch.exp(z))
        between = F.pad(softplus.flip(-1).cumsum(-1).flip(-1)[1:], (0, 1))
        return torch.exp(F.logsigmoid(z) - between)

    _log(log1p_exp, capsys, "the gradient has NaN/inf")


def test_weights_outside_autograd_are_named(capsys):
    def detached(z):
        return torch.tensor(nb05.log_space_stick(z).tolist(), dtype=z.dtype)

    _log(detached, capsys, "carry no gradient back to z")


def test_a_list_or_another_dtype_is_refused_without_an_exception(capsys):
    _loop(lambda z: nb05.stick_loop(z).tolist(), capsys, "a list, not a tensor")
    _log(
        lambda z: nb05.log_space_stick(z).double(),
        capsys,
        "dtype torch.float64, expected torch.float32",
    )


def test_a_bidirectional_side_without_the_half_is_named(capsys):
    def whole(z, i):
        return 2 * nb05.bidirectional_row(z, i)

    refused(
        check_bidirectional,
        whole,
        capsys,
        "query 1: left side wrong, at key 0",
        "multiply its stick by 1/2",
    )


def test_a_right_side_broken_from_the_far_end_is_named(capsys):
    def far_right(z, i):
        out = nb05.bidirectional_row(z, i)
        out[i + 1 :] = 0.5 * nb05.stick_loop(z[i + 1 :])
        return out

    refused(
        check_bidirectional,
        far_right,
        capsys,
        "right side wrong, at key 1",
        "you broke it from the far end",
    )


def test_weight_on_the_query_itself_is_refused(capsys):
    def includes_i(z, i):
        out = torch.zeros_like(z)
        out[: i + 1] = 0.5 * nb05.stick_loop(z[: i + 1])
        out[i + 1 :] = 0.5 * nb05.stick_loop(z[i + 1 :].flip(0)).flip(0)
        return out

    refused(check_bidirectional, includes_i, capsys, "weight on the query's own position must be 0")


def test_a_float32_bidirectional_row_is_refused_without_an_exception(capsys):
    refused(
        check_bidirectional,
        lambda z, i: nb05.bidirectional_row(z, i).float(),
        capsys,
        "dtype torch.float32, expected torch.float64",
    )
