"""The checks of notebook 07's exercises: NTK-aware frequencies, YaRN's ramp, dynamic NTK's base.

``check_ntk(fn)`` calls ``fn(head_dim, base, factor)`` for four heads (``s = 1`` among them) and
compares the float32 ``[D/2]`` result with the library's
``rope_frequencies(head_dim, base=base, scaling={"rope_type": "ntk", ...})``. A wrong answer gets
a hint naming the usual mistake: the plain frequencies (base unchanged), every pair divided by
``s`` (position interpolation) or the base times ``s`` without the exponent ``D/(D-2)``.

``check_yarn_share(fn)`` calls ``fn(head_dim, base, train_len, beta_fast, beta_slow)`` and
compares the ``[D/2]`` shares with the ones the library's YaRN frequencies imply,
``(w - w') / (w - w/s)``. The cases include ramps whose slowest pairs are clamped to exactly 1 and
fastest to exactly 0, one where ``high`` is clamped to ``D - 1``, and one where ``low == high``
(the step). A list, a numpy array or any floating dtype is accepted (the exercise has no input
tensor), converted to float64. A wrong answer gets a hint: the share not clamped to ``[0, 1]``,
the ramp reversed, ``low``/``high`` not clamped to ``[0, D-1]`` or not rounded, the 0.001 missing
when ``low == high``, or which clamp (0 or 1) the wrong pairs miss.

``check_dynamic_base(fn)`` calls ``fn(base, head_dim, factor, seq_len, train_len)``, whose answer
is a Python number, and compares the frequencies of that base with the library's dynamic NTK at
``seq_len``. A wrong answer gets a hint: plain RoPE up to ``L`` (``n' = max(n, L)``; without it
the factor goes negative and the power complex), the static NTK base, or the exponent missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from course_lib.encodings import rope_frequencies, rope_inverse_frequencies
from course_lib.teaching.answers import Exercise, as_number, form_problem, matches, value_problem
from course_lib.teaching.notebook import report_check
from course_lib.teaching.solutions import nb07

__all__ = [
    "NTK_CASES",
    "YARN_CASES",
    "DYNAMIC_CASES",
    "yarn_share",
    "check_ntk",
    "check_yarn_share",
    "check_dynamic_base",
    "EXERCISES",
]

NTK_CASES = ((16, 10000.0, 8.0), (64, 10000.0, 2.0), (128, 500000.0, 4.0), (32, 10000.0, 1.0))

# (head_dim, base, train_len, beta_fast, beta_slow)
YARN_CASES = (
    (16, 10000.0, 64, 32.0, 1.0),  # low clamped up to 0; pairs 3..7 exactly 1
    (128, 10000.0, 4096, 32.0, 1.0),  # pairs 0..20 exactly 0, 46..63 exactly 1
    (64, 10000.0, 2048, 16.0, 2.0),
    (128, 500000.0, 8192, 32.0, 1.0),
    (16, 100.0, 131072, 10000.0, 1.0),  # high clamped down to D - 1 = 15: no pair reaches 1
    (16, 10000.0, 64, 32.0, 16.0),  # low == high == 0: a step, high = 0.001
)
YARN_FACTOR = 4.0  # a power of 2: the shares read back from float32 frequencies exactly

# (head_dim, factor, seq_len) at base 10000 and L = 64
DYNAMIC_CASES = ((16, 1.0, 40), (16, 1.0, 512), (16, 2.0, 200), (64, 4.0, 64), (128, 2.0, 1000),
                 (32, 4.0, 20))  # fmt: skip
DYNAMIC_BASE, DYNAMIC_TRAIN_LEN = 10000.0, 64


# --- NTK-aware scaling ---------------------------------------------------------------------------


def _ntk_hint(got: torch.Tensor, head_dim: int, base: float, factor: float) -> str:
    plain = rope_inverse_frequencies(head_dim, base)
    if factor > 1 and matches(got, plain, atol=0.0):
        return ": these are the plain frequencies; change the base"
    if factor > 1 and matches(got, plain / factor, atol=0.0):
        return (
            " (every pair divided by s is position interpolation; NTK changes the base, so the "
            "fastest pair keeps theta_0 = 1)"
        )
    if factor > 1 and matches(got, rope_inverse_frequencies(head_dim, base * factor), atol=0.0):
        return " (the base times s: raise s to D/(D-2), so that the slowest pair is divided by s)"
    return " (the slowest pair should be divided by exactly s)"


def check_ntk(fn: Callable[[int, float, float], torch.Tensor]) -> bool:
    """Check ``fn(head_dim, base, factor) -> float32 [D/2]`` (see the module); print a verdict."""
    failures = []
    for head_dim, base, factor in NTK_CASES:
        scaling = {"rope_type": "ntk", "factor": factor}
        want, _ = rope_frequencies(head_dim, base=base, scaling=scaling)
        desc = f"D={head_dim}, base={base:g}, s={factor:g}"
        got = fn(head_dim, base, factor)
        problem = form_problem(got, want, dtype=False)
        if problem is None and got.dtype != want.dtype:
            problem = (
                f"dtype {got.dtype}, expected {want.dtype}, as rope_inverse_frequencies returns "
                "(compute in float64 if you like, then .float())"
            )
        if problem:
            failures.append(f"{desc}: {problem}")
            continue
        problem = value_problem(got, want, rtol=1e-5, atol=0.0)
        if problem:
            hint = _ntk_hint(got, head_dim, base, factor)
            if hint.startswith(":"):  # the plain frequencies: a sentence of its own
                failures.append(f"{desc}{hint} ({problem})")
            else:
                failures.append(f"{desc}: wrong values: {problem}{hint}")
    return report_check("ntk_inverse_frequencies", failures)


# --- YaRN's ramp ---------------------------------------------------------------------------------


def _pair_turning(head_dim: int, base: float, train_len: int, turns: float) -> float:
    """The (fractional) pair index whose wavelength fits ``turns`` times into ``train_len``."""
    return head_dim * math.log(train_len / (turns * 2 * math.pi)) / (2 * math.log(base))


def _ramp_ends(head_dim, base, train_len, fast, slow, *, clamp_ends=True) -> tuple[float, float]:
    low = math.floor(_pair_turning(head_dim, base, train_len, fast))
    high = math.ceil(_pair_turning(head_dim, base, train_len, slow))
    if clamp_ends:
        low, high = max(low, 0), min(high, head_dim - 1)
    return low, high


def _ramp(head_dim, base, train_len, fast, slow, *, clamp_ends=True, clamp_share=True):
    """The ramp in the pair index, with or without its clamps (the mistakes the hints name)."""
    low, high = _ramp_ends(head_dim, base, train_len, fast, slow, clamp_ends=clamp_ends)
    if low == high:
        high += 0.001
    share = (torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)
    return share.clamp(0.0, 1.0) if clamp_share else share


def yarn_share(
    head_dim: int, base: float, train_len: int, beta_fast: float, beta_slow: float, **options
) -> torch.Tensor:
    """The share of ``theta_t / s`` in each pair of the library's YaRN frequencies (float64
    ``[D/2]``), read back from them: ``(w - w') / (w - w / s)``. ``options`` go to the scaling
    dict (``truncate=False``: the ramp's ends not rounded)."""
    scaling = {
        "rope_type": "yarn",
        "factor": YARN_FACTOR,
        "original_max_position_embeddings": train_len,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        **options,
    }
    plain = rope_inverse_frequencies(head_dim, base).double()
    yarn, _ = rope_frequencies(head_dim, base=base, scaling=scaling)
    return (plain - yarn.double()) / (plain - plain / YARN_FACTOR)


def _as_share(got: object) -> object:
    """A list, tuple or numpy array of numbers as a float64 tensor; anything else unchanged."""
    if isinstance(got, (list, tuple)) or type(got).__module__ == "numpy":
        try:
            return torch.as_tensor(got, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            return got
    return got


def _yarn_hint(got: torch.Tensor, want: torch.Tensor, wrong: torch.Tensor, case) -> str:
    head_dim, base, train_len, fast, slow = case
    low, high = _ramp_ends(head_dim, base, train_len, fast, slow)
    if low == high and not torch.isfinite(got).all():
        return f" (here low == high == {low}: add 0.001 to high, which makes the ramp a step)"
    if matches(got, _ramp(*case, clamp_share=False), atol=1e-4):
        return (
            f" (clamp the share to [0, 1]: exactly 0 for the fast pairs up to low = {low}, "
            f"exactly 1 for the slow pairs from high = {high} on)"
        )
    if matches(got, 1 - want, atol=1e-4) or matches(got, want.flip(0), atol=1e-4):
        return (
            " (the ramp is reversed: share 0 for the fast pairs, small t, which turn many times "
            "in L; share 1 for the slow pairs)"
        )
    if matches(got, _ramp(*case, clamp_ends=False), atol=1e-4):
        raw_low, raw_high = _ramp_ends(head_dim, base, train_len, fast, slow, clamp_ends=False)
        return (
            f" (clamp low and high to [0, D-1] = [0, {head_dim - 1}] before the ramp: here they "
            f"are {raw_low} and {raw_high} unclamped)"
        )
    if matches(got, yarn_share(*case, truncate=False), atol=1e-4):
        return " (round the ends: low = floor(t(beta_fast)), high = ceil(t(beta_slow)))"
    if bool((want[wrong] == 1).all()):
        return " (these pairs turn fewer than beta_slow times in L: their share is exactly 1)"
    if bool((want[wrong] == 0).all()):
        return " (these pairs turn more than beta_fast times in L: their share is exactly 0)"
    return ""


def check_yarn_share(fn: Callable[..., torch.Tensor]) -> bool:
    """Check ``fn(head_dim, base, train_len, beta_fast, beta_slow) -> [D/2]`` (see the module);
    print one verdict."""
    failures = []
    for case in YARN_CASES:
        head_dim, base, train_len, fast, slow = case
        want = yarn_share(*case)
        desc = f"D={head_dim}, base={base:g}, L={train_len}, betas ({fast:g}, {slow:g})"
        got = _as_share(fn(head_dim, base, train_len, fast, slow))
        problem = form_problem(got, want, dtype=False)
        if problem:
            failures.append(f"{desc}: {problem}")
            continue
        problem = value_problem(got, want, rtol=0.0, atol=1e-4)
        if problem:
            got = got.double()
            wrong = ~torch.isclose(got, want, rtol=0.0, atol=1e-4)
            bad = wrong.nonzero().flatten().tolist()
            failures.append(
                f"{desc}: pairs {bad[:6]} are off: {problem}" + _yarn_hint(got, want, wrong, case)
            )
    return report_check("yarn_interpolation_share", failures)


# --- dynamic NTK ---------------------------------------------------------------------------------


def _base_problem(got: object) -> str | None:
    """Why ``got`` is not a usable base (a finite real number > 0), or None."""
    if isinstance(got, complex):
        return (
            f"your function returned the complex number {got:.4g}: a negative number to a "
            "fractional power (the factor s n'/L - (s - 1) is below 0 when n < L: n' = max(n, L))"
        )
    value, problem = as_number(got)
    if problem is None and (not math.isfinite(value) or value <= 0):
        return f"your function returned {got!r}; a base is a finite number > 0"
    return problem


def _dynamic_hint(got: float, head_dim: int, factor: float, seq_len: int) -> str:
    if seq_len <= DYNAMIC_TRAIN_LEN:
        return " (up to L it must be plain RoPE: n' = max(n, L))"
    power = head_dim / (head_dim - 2)
    growth = factor * seq_len / DYNAMIC_TRAIN_LEN - (factor - 1)
    if math.isclose(got, DYNAMIC_BASE, rel_tol=1e-6):
        return (
            " (the plain base: past L dynamic NTK changes it, even at s = 1, by the factor "
            "s n'/L - (s - 1), which grows with n)"
        )
    if math.isclose(got, DYNAMIC_BASE * factor**power, rel_tol=1e-6):
        return (
            " (the static NTK base: dynamic NTK uses the factor of the current length, "
            "s n'/L - (s - 1))"
        )
    if math.isclose(got, DYNAMIC_BASE * growth, rel_tol=1e-6):
        return " (raise the factor s n'/L - (s - 1) to the power D/(D-2))"
    return ""


def check_dynamic_base(fn: Callable[[float, int, float, int, int], float]) -> bool:
    """Check ``fn(base, head_dim, factor, seq_len, train_len) -> float`` (see the module); print
    one verdict."""
    failures = []
    for head_dim, factor, seq_len in DYNAMIC_CASES:
        desc = f"D={head_dim}, s={factor:g}, n={seq_len}"
        scaling = {
            "rope_type": "dynamic",
            "factor": factor,
            "original_max_position_embeddings": DYNAMIC_TRAIN_LEN,
        }
        want, _ = rope_frequencies(head_dim, base=DYNAMIC_BASE, scaling=scaling, seq_len=seq_len)
        got_base = fn(DYNAMIC_BASE, head_dim, factor, seq_len, DYNAMIC_TRAIN_LEN)
        problem = _base_problem(got_base)
        if problem:
            failures.append(f"{desc}: {problem}")
            continue
        got = rope_inverse_frequencies(head_dim, float(got_base))
        problem = value_problem(got, want, rtol=1e-5, atol=0.0)
        if problem:
            # the base whose slowest pair has want's frequency: w_last = base^(-(D-2)/D)
            want_base = float(want[-1].double()) ** (-head_dim / (head_dim - 2))
            hint = _dynamic_hint(got_base, head_dim, factor, seq_len)
            failures.append(
                f"{desc}: base {got_base:.6g} gives other frequencies than the base "
                f"{want_base:.6g}{hint}: {problem}"
            )
    return report_check("dynamic_base", failures)


EXERCISES = [
    Exercise("ntk_inverse_frequencies", check_ntk, nb07.ntk_inverse_frequencies),
    Exercise(
        "yarn_interpolation_share",
        check_yarn_share,
        nb07.yarn_interpolation_share,
        accepts=("sequence", "numpy", "dtype"),
    ),
    Exercise("dynamic_base", check_dynamic_base, nb07.dynamic_base),
]
