"""The checks of notebook 03's exercises: one rotated pair, RoPE in the half layout, and the
position ids of a cached decoding step.

``check_rotate_pair(fn)`` calls ``fn(x, y, angle)`` on random tensors (five values and a 0-d
angle, at four angles; a ``[3, 5]`` pair with one angle per column; float64 inputs) and compares
the two results with ``(x cos a - y sin a, x sin a + y cos a)``. The answer must be a pair of
tensors; one tensor (e.g. from ``torch.stack``) or anything else is refused with a sentence. A
wrong answer is told which output is wrong, and whether it turns the pair by ``-angle`` or
returns the two outputs swapped.

``check_rope_half(fn)`` calls ``fn(x, position_ids, base)`` on random ``[..., seq, D]`` inputs
(float32 and float64, positions starting at 3, two bases) and compares the result with the
library's ``apply_rope(x, position_ids, base=base, style="half")``. A wrong answer gets a hint
naming the usual mistake: the interleaved layout, the indices ``0..seq-1`` instead of
``position_ids``, a rotation the wrong way, the frequencies ``base**(-t/D)``, or the ``base``
argument ignored; otherwise it is told which half of the channels is wrong.

``check_decode_step(fn, model, generated)`` feeds ``generated`` to ``model`` with a key/value
cache: a prompt of 5 tokens, then one token per call of ``fn(model, token_ids, cache)`` up to the
last 5 tokens, which go in 2 and then 3 at once (the step returns the logits of the last new
token), and compares every step's logits with those of one full pass over ``generated``. A step
whose logits are those of the new tokens at positions ``0, 1, ...`` is told that the positions
must continue after the cache's length; a step that fails on several tokens is told how.
:func:`decode_example` builds a small seeded ``model`` and ``generated`` like the notebook's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from course_lib.encodings import apply_rope
from course_lib.model import BertConfig, MiniBert
from course_lib.teaching.answers import Exercise, form_problem, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb03

__all__ = [
    "check_rotate_pair",
    "check_rope_half",
    "check_decode_step",
    "decode_example",
    "EXERCISES",
]


def _rotated(x, y, angle):
    """``(x cos a - y sin a, x sin a + y cos a)`` computed in float64, in ``x``'s dtype."""
    x64, y64, a64 = x.double(), y.double(), angle.double()
    cos, sin = torch.cos(a64), torch.sin(a64)
    return (x64 * cos - y64 * sin).to(x.dtype), (x64 * sin + y64 * cos).to(x.dtype)


def _pair_problem(out) -> str | None:
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return None
    if out is None:
        return "returned None (is the `return` missing?); expected the pair (x', y')"
    if isinstance(out, torch.Tensor):
        return (
            f"returned one tensor of shape {tuple(out.shape)}; return a tuple of two tensors "
            "(x', y'): return x_new, y_new, not torch.stack"
        )
    if isinstance(out, (tuple, list)):
        return f"returned {len(out)} values; expected two, the pair (x', y')"
    return f"returned a {type(out).__name__}; expected the pair of tensors (x', y')"


def _pair_close(got, want) -> bool:
    return all(
        isinstance(g, torch.Tensor)
        and g.shape == w.shape
        and torch.allclose(g.double(), w.double(), atol=1e-5)
        for g, w in zip(got, want, strict=True)
    )


def check_rotate_pair(fn: Callable) -> bool:
    """Check ``fn(x, y, angle) -> (x', y')``; print one verdict, return it."""
    failures = []
    gen = torch.Generator().manual_seed(0)
    cases = [
        (name, torch.randn(5, generator=gen), torch.randn(5, generator=gen), torch.tensor(a))
        for name, a in (
            ("angle 0 (identity)", 0.0),
            ("a quarter turn", math.pi / 2),
            ("angle 1 rad", 1.0),
            ("angle -2.5 rad", -2.5),
        )
    ]
    cases.append(
        (
            "a [3, 5] pair, one angle per column",
            torch.randn(3, 5, generator=gen),
            torch.randn(3, 5, generator=gen),
            torch.tensor([0.3, -1.2, 2.0, 0.0, 3.1]),
        )
    )
    cases.append(
        (
            "float64 inputs, angle 0.7 rad",
            torch.randn(5, generator=gen, dtype=torch.float64),
            torch.randn(5, generator=gen, dtype=torch.float64),
            torch.tensor(0.7, dtype=torch.float64),
        )
    )
    for name, x, y, angle in cases:
        got = fn(x.clone(), y.clone(), angle.clone())
        problem = _pair_problem(got)
        if problem:
            failures.append(f"{name}: {problem}")
            continue
        want = _rotated(x, y, angle)
        problems = [
            (which, form_problem(g, w))
            for which, g, w in zip(("first (x')", "second (y')"), got, want, strict=True)
        ]
        problems = [(which, p) for which, p in problems if p]
        if problems:
            which, problem = problems[0]
            failures.append(f"{name}: the {which} output: {problem}")
            continue
        if _pair_close(got, want):
            continue
        if _pair_close(got, _rotated(x, y, -angle)):
            failures.append(
                f"{name}: the pair is turned by -a (the signs of the sin terms): "
                "x' = x cos a - y sin a, y' = x sin a + y cos a"
            )
        elif _pair_close(got, want[::-1]):
            failures.append(f"{name}: the two outputs are swapped: return (x', y'), x' first")
        else:
            bad = 0 if value_problem(got[0], want[0], atol=1e-5) else 1
            failures.append(
                f"{name}: the {('first', 'second')[bad]} output is wrong (check the signs: "
                f"x' = x cos - y sin) ({value_problem(got[bad], want[bad], atol=1e-5)})"
            )
    return report_check("rotate_pair", failures)


ROPE_CASES = (
    ((7, 8), 10000.0, torch.float32),
    ((2, 3, 11, 32), 10000.0, torch.float32),
    ((5, 16), 500.0, torch.float32),
    ((3, 6, 8), 10000.0, torch.float64),
)


def _rope_hint(got, x, pos, base) -> str | None:
    seq = x.shape[-2]
    mistakes = (
        (
            apply_rope(x, pos, base=base, style="interleaved"),
            "this is the interleaved layout; pair t is (t, t + D/2)",
        ),
        (
            apply_rope(x, torch.arange(seq), base=base, style="half"),
            f"rotated by positions counted from 0 (0..{seq - 1}), not by position_ids "
            f"({int(pos[0])}..{int(pos[-1])} here)",
        ),
        (
            apply_rope(x, -pos, base=base, style="half"),
            "rotated the wrong way (by -p theta_t): x'_t = x_t cos - x_(t+D/2) sin",
        ),
        (
            apply_rope(x, pos, base=base**0.5, style="half"),
            "the frequencies are base^(-t/D), a 2 missing: theta_t = base^(-2t/D)",
        ),
    )
    if base != 10000.0:
        mistakes += (
            (
                apply_rope(x, pos, style="half"),
                f"base ignored: this uses 10000, not {base:g}",
            ),
        )
    for wrong, hint in mistakes:
        if torch.allclose(got.double(), wrong.double(), atol=1e-5):
            return hint
    return None


def check_rope_half(fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> bool:
    """Check ``fn(x, position_ids, base) -> x rotated, half layout``; print one verdict."""
    failures = []
    gen = torch.Generator().manual_seed(0)
    for shape, base, dtype in ROPE_CASES:
        x = torch.randn(shape, generator=gen, dtype=dtype)
        pos = torch.arange(shape[-2]) + 3
        want = apply_rope(x, pos, base=base, style="half")
        got = fn(x.clone(), pos.clone(), base)
        where = f"input {shape}, {dtype}, base {base:g}"
        problem = form_problem(got, want)
        if problem:
            failures.append(f"{where}: {problem}")
            continue
        problem = value_problem(got, want, atol=1e-5)
        if not problem:
            continue
        hint = _rope_hint(got, x, pos, base)
        if hint is None:
            half = shape[-1] // 2
            first = value_problem(got[..., :half], want[..., :half], atol=1e-5)
            hint = f"channels of the {'first' if first else 'second'} half are wrong"
        failures.append(f"{where}: {hint} ({problem})")
    return report_check("rope_half", failures)


def decode_example() -> tuple[MiniBert, torch.Tensor]:
    """``(model, generated)`` like the notebook's: a seeded 2-layer RoPE language model with
    sharp attention and the 14 tokens it generated greedily from a prompt of 8 (the global random
    state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=40,
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            objective="clm",
            encoding="rope",
        )
        model = MiniBert(config).eval()
        with torch.no_grad():
            for layer in model.layers:
                layer.attention.query.weight.normal_(0, 0.5)
                layer.attention.key.weight.normal_(0, 0.5)
            prompt = torch.randint(0, 40, (1, 8))
            generated = model.generate(prompt, max_new_tokens=6)
    return model, generated


def _restarted(model, generated, start: int, end: int) -> torch.Tensor:
    """The logits of token ``end - 1`` when tokens ``start..end-1`` follow a cache of ``start``
    tokens but are given the positions ``0..end-start-1`` (the bug of the exercise)."""
    cache = model.new_cache()
    model(generated[:, :start], cache=cache)
    positions = torch.arange(end - start)
    return model(generated[:, start:end], cache=cache, position_ids=positions).logits[:, -1]


def _steps(total: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each step after the prompt: one token at a time, then 2 and 3 at once."""
    chunked = total - 5
    steps = [(t, t + 1) for t in range(PROMPT, chunked)]
    return steps + [(chunked, chunked + 2), (chunked + 2, total)]


PROMPT = 5


def check_decode_step(fn: Callable, model: MiniBert, generated: torch.Tensor) -> bool:
    """Check ``fn(model, token_ids, cache) -> [batch, vocab]`` against one full pass of ``model``
    over ``generated``: after a cached prompt of 5 tokens, one token per step, then 2 and 3."""
    failures = []
    with torch.no_grad():
        full_logits = model(generated).logits
        cache = model.new_cache()
        model(generated[:, :PROMPT], cache=cache)
        for start, end in _steps(generated.shape[1]):
            if end - start == 1:
                where = f"step feeding token {start}"
            else:
                where = f"step feeding tokens {start}..{end - 1} at once"
            try:
                got = fn(model, generated[:, start:end], cache)
            except Exception as error:
                if end - start == 1:
                    raise
                # a step written for one token may fail on several in any way; say how
                failures.append(
                    f"{where}: the step raised {type(error).__name__}: {error} (the new tokens "
                    "take the positions past .. past + new - 1, one each)"
                )
                break
            want = full_logits[:, end - 1]
            problem = form_problem(got, want)
            if problem:
                failures.append(
                    f"{where}: {problem} (the logits [batch, vocab] of the last new token)"
                )
                continue
            problem = value_problem(got, want, atol=1e-5)
            if not problem:
                continue
            text = f"{where}: its logits differ from the full pass (token {end - 1} sits at position {end - 1})"
            if torch.allclose(got, _restarted(model, generated, start, end), atol=1e-5):
                text += (
                    f"; they are those of position {end - 1 - start}: the new tokens must continue "
                    f"after the {start} tokens the cache holds (cache[0].length), not restart at 0"
                )
            failures.append(f"{text} ({problem})")
    return report_check("decode_step", failures)


def _run_decode_step(fn: Callable) -> bool:
    return check_decode_step(fn, *decode_example())


EXERCISES = [
    Exercise("rotate_pair", check_rotate_pair, nb03.rotate_pair),
    Exercise("rope_half", check_rope_half, nb03.rope_half),
    Exercise("decode_step", _run_decode_step, nb03.decode_step),
]
