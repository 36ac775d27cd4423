"""Notebook 03's checks: the worked solutions pass, and the wrong answers a learner is likely to
write are refused with the hint that names their mistake (for the decoding step, also the step
that is right one token at a time and wrong for several)."""

import pytest
import torch
from check_verdicts import refused

from course_lib.encodings import apply_rope
from course_lib.teaching.rope_checks import (
    check_decode_step,
    check_rope_half,
    check_rotate_pair,
    decode_example,
)
from course_lib.teaching.solutions import nb03


def test_the_worked_solutions_pass(capsys):
    assert check_rotate_pair(nb03.rotate_pair)
    assert check_rope_half(nb03.rope_half)
    assert check_decode_step(nb03.decode_step, *decode_example())
    out = capsys.readouterr().out
    for name in ("rotate_pair", "rope_half", "decode_step"):
        assert f"✓ {name}: correct" in out


def _second_sign_wrong(x, y, a):
    first, _ = nb03.rotate_pair(x, y, a)
    return first, y * torch.cos(a) - x * torch.sin(a)


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda x, y, a: nb03.rotate_pair(x, y, -a), "the pair is turned by -a"),
        (lambda x, y, a: nb03.rotate_pair(x, y, a)[::-1], "the two outputs are swapped"),
        (_second_sign_wrong, "the second output is wrong (check the signs"),
        (lambda x, y, a: torch.stack(nb03.rotate_pair(x, y, a)), "return a tuple of two tensors"),
        (lambda x, y, a: (*nb03.rotate_pair(x, y, a), a), "returned 3 values"),
        (lambda x, y, a: tuple(t.double() for t in nb03.rotate_pair(x, y, a)), "dtype"),
        (lambda x, y, a: (nb03.rotate_pair(x, y, a)[0].tolist(), y), "first (x') output"),
        (lambda x, y, a: None, "None"),
    ],
)
def test_a_wrong_rotate_pair_gets_its_hint(fn, hint, capsys):
    refused(check_rotate_pair, fn, capsys, hint)


def test_an_angle_per_column_is_checked(capsys):
    # right for one angle, wrong when each column of a [3, 5] pair has its own
    def first_angle_only(x, y, a):
        return nb03.rotate_pair(x, y, a.flatten()[0])

    refused(check_rotate_pair, first_angle_only, capsys, "a [3, 5] pair, one angle per column")


def _slow_frequencies(x, pos, base):
    d = x.shape[-1]
    angle = pos[:, None].float() * base ** (-torch.arange(d // 2).float() / d)
    first, second = nb03.rotate_pair(x[..., : d // 2], x[..., d // 2 :], angle)
    return torch.cat((first, second), -1)


def _second_half_unrotated(x, pos, base):
    out = nb03.rope_half(x, pos, base)
    out[..., x.shape[-1] // 2 :] = x[..., x.shape[-1] // 2 :]
    return out


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (lambda x, p, b: apply_rope(x, p, base=b), "this is the interleaved layout"),
        (lambda x, p, b: nb03.rope_half(x, torch.arange(len(p)), b), "positions counted from 0"),
        (lambda x, p, b: nb03.rope_half(x, -p, b), "rotated the wrong way"),
        (lambda x, p, b: nb03.rope_half(x, p), "base ignored: this uses 10000, not 500"),
        (_slow_frequencies, "a 2 missing: theta_t = base^(-2t/D)"),
        (_second_half_unrotated, "channels of the second half are wrong"),
        (lambda x, p, b: nb03.rope_half(x.double(), p, b), "dtype torch.float64"),
        (lambda x, p, b: nb03.rope_half(x, p, b).float(), "input (3, 6, 8), torch.float64"),
        (lambda x, p, b: nb03.rope_half(x, p, b)[..., :-1], "shape"),
    ],
)
def test_a_wrong_rope_half_gets_its_hint(fn, hint, capsys):
    refused(check_rope_half, fn, capsys, hint)


def _step(positions_of):
    def step(model, token_ids, cache):
        positions = positions_of(cache[0].length, token_ids.shape[1])
        return model(token_ids, cache=cache, position_ids=positions).logits[:, -1]

    return step


def test_positions_from_zero_are_told_to_continue_after_the_cache(capsys):
    refused(
        lambda fn: check_decode_step(fn, *decode_example()),
        _step(lambda past, new: torch.arange(new)),
        capsys,
        "step feeding token 5: its logits differ from the full pass (token 5 sits at position 5); "
        "they are those of position 0: the new tokens must continue after the 5 tokens the cache "
        "holds (cache[0].length)",
    )


def test_a_step_right_for_one_token_only_is_caught_by_the_chunks(capsys):
    one_position = _step(lambda past, new: torch.full((new,), past))
    refused(
        lambda fn: check_decode_step(fn, *decode_example()),
        one_position,
        capsys,
        "step feeding tokens 9..10 at once",
    )


def test_a_step_that_fails_on_several_tokens_is_told_how(capsys):
    past_only = _step(lambda past, new: torch.tensor([past]))
    refused(
        lambda fn: check_decode_step(fn, *decode_example()),
        past_only,
        capsys,
        "step feeding tokens 9..10 at once: the step raised ValueError",
    )


def test_all_the_logits_instead_of_the_last_are_refused(capsys):
    def every_logit(model, token_ids, cache):
        past = cache[0].length
        positions = torch.arange(past, past + token_ids.shape[1])
        return model(token_ids, cache=cache, position_ids=positions).logits

    refused(
        lambda fn: check_decode_step(fn, *decode_example()),
        every_logit,
        capsys,
        "shape (1, 1, 40), expected (1, 40)",
    )


def test_decode_example_is_the_same_each_time_and_leaves_the_random_state_alone():
    state = torch.random.get_rng_state()
    (_, first), (_, second) = decode_example(), decode_example()
    assert torch.equal(first, second) and first.shape == (1, 14)
    assert torch.equal(torch.random.get_rng_state(), state)
