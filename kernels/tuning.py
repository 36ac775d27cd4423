"""Tiles chosen on the GPU: the first call of a shape times a short list of tilings and keeps
the fastest.

Each kernel family picks its tiles statically (``pick_config`` in :mod:`.flash` and
:mod:`.stick_breaking`): from the GPU's shared memory per block and what the report's static
model (``python -m course_lib.gpu_report``) found for one compiler on one GPU. A learner's GPU,
driver and Triton may disagree. So on a CUDA device the course's attention functions
(``course_lib/flash_ops.py``) ask :func:`choose`: for a key (the family, the pass, head_dim,
dtype, causal, what the loops carry, the key-padding mask and the length bucket of
:func:`length_bucket`) it runs each candidate of the family's ``tuning_candidates`` once on the
call's own inputs, times it (:func:`gpu_time`, the median of ``triton.testing.do_bench``),
and keeps the fastest for every later call with that key in this process. The static pick is
always the first candidate and wins ties. A candidate that needs more shared memory than the GPU
has (Triton's ``OutOfResources``) is skipped; if every one fails, the first failure is raised.

Nothing is tuned in Triton's CPU interpreter, while launches are planned for the static report
(:func:`.common.planned_launches`), while ``torch.compile`` traces or a CUDA graph captures, or
when :data:`ENV` is ``0``/``off``: the static pick runs. Tiles change how the sums are ordered,
so two processes can round differently if their timings picked different tiles; with tuning
off the tiles, and the results, are the same in every process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = [
    "ENV",
    "Choice",
    "Tuner",
    "active",
    "choices",
    "choose",
    "compile_only",
    "disabled",
    "gpu_time",
    "length_bucket",
    "reset",
]

ENV = "COURSE_KERNEL_TUNING"
_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def _env_allows() -> bool:
    value = os.environ.get(ENV, "1").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(
        f"{ENV}={os.environ[ENV]!r}: use one of {', '.join(_ON)} (tune tiles on the GPU, the "
        f"default) or {', '.join(_OFF)} (always the static tiles)"
    )


def length_bucket(seq: int) -> int:
    """The smallest power of two >= ``seq`` (at least 16): calls whose lengths share a bucket
    share a choice."""
    return max(16, 1 << max(0, int(seq) - 1).bit_length())


def gpu_time(run: Callable[[], object]) -> float:
    """Milliseconds of one ``run()`` on the current CUDA device: the median of Triton's
    ``do_bench`` (which calls it once first, so a compile is not timed)."""
    import triton.testing

    return float(triton.testing.do_bench(run, warmup=5, rep=25, return_mode="median"))


def _out_of_resources() -> tuple[type[BaseException], ...]:
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # pragma: no cover - every Triton the course supports has it
        return ()
    return (OutOfResources,)


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` did for one key: the candidates' launch arguments, their times in
    milliseconds (None: the GPU could not run it, ``errors`` says why) and the index kept."""

    key: tuple
    candidates: tuple[dict, ...]
    times_ms: tuple[float | None, ...]
    errors: tuple[str | None, ...]
    chosen: int

    def as_record(self) -> dict:
        """A JSON-ready summary (tiles as their ``repr``)."""
        return dict(
            key=[k if isinstance(k, (int, float, str, bool, type(None))) else repr(k)
                 for k in self.key],
            candidates=[{name: repr(value) for name, value in c.items()} for c in self.candidates],
            times_ms=[None if t is None else round(t, 4) for t in self.times_ms],
            errors=list(self.errors),
            chosen=self.chosen,
        )  # fmt: skip


class Tuner:
    """Choices per key, made once each by timing the candidates with ``timer``."""

    def __init__(self, timer: Callable[[Callable[[], object]], float] = gpu_time):
        self.timer = timer
        self._choices: dict[Hashable, Choice] = {}
        self._lock = threading.RLock()

    def choose(self, key: tuple, candidates: Sequence[dict], run: Callable[[dict], object]) -> dict:
        """The candidate (a dict of launch keyword arguments) that ran fastest for ``key``;
        ``run(candidate)`` launches the call with it. The first call of a key times them all."""
        if not candidates:
            raise ValueError(f"no tiling to choose from for {key!r}")
        with self._lock:
            known = self._choices.get(key)
            if known is not None:
                return known.candidates[known.chosen]
            if len(candidates) == 1:
                choice = Choice(key, tuple(candidates), (None,), (None,), 0)
            else:
                choice = self._time(key, tuple(candidates), run)
            self._choices[key] = choice
            return choice.candidates[choice.chosen]

    def _time(self, key: tuple, candidates: tuple[dict, ...], run) -> Choice:
        times: list[float | None] = []
        errors: list[str | None] = []
        first_error: BaseException | None = None
        for candidate in candidates:
            try:
                times.append(float(self.timer(lambda c=candidate: run(c))))
                errors.append(None)
            except _out_of_resources() as exc:
                times.append(None)
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                first_error = first_error or exc
        timed = [i for i, t in enumerate(times) if t is not None]
        if not timed:
            raise RuntimeError(
                f"none of the {len(candidates)} tilings for {key!r} runs on this GPU"
            ) from first_error
        best = min(timed, key=lambda i: (times[i], i))  # ties: the earlier (the static pick)
        return Choice(key, candidates, tuple(times), tuple(errors), best)

    def choices(self) -> list[Choice]:
        with self._lock:
            return list(self._choices.values())

    def reset(self) -> None:
        with self._lock:
            self._choices.clear()


_TUNER = Tuner()
_LOCAL = threading.local()  # this thread's overrides: ``disabled`` depth, ``compile_only`` tuner


@contextmanager
def disabled():
    """Within this block (this thread) every call runs the static tiles."""
    before = getattr(_LOCAL, "disabled", 0)
    _LOCAL.disabled = before + 1
    try:
        yield
    finally:
        _LOCAL.disabled = before


def _untimed(run: Callable[[], object]) -> float:
    run()
    return 0.0


@contextmanager
def compile_only():
    """Within this block (this thread) a call that would tune runs each candidate once, untimed,
    and keeps the static pick (every time is 0, and ties go to the pick); the choices are
    forgotten at the end. What it leaves is Triton's on-disk cache of every candidate's
    kernels: processes that compile in parallel (``gpu_check``'s correctness workers) spare a
    later timed run the compiles."""
    before = getattr(_LOCAL, "tuner", None)
    _LOCAL.tuner = Tuner(_untimed)
    try:
        yield
    finally:
        _LOCAL.tuner = before


def active(device: torch.device) -> bool:
    """Whether a call on ``device`` tunes its tiles (see the module docstring for when not)."""
    from .common import planning

    if device.type != "cuda" or planning() or getattr(_LOCAL, "disabled", 0):
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if not _env_allows():
        return False
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return False
    return True


def choose(key: tuple, candidates: Sequence[dict], run: Callable[[dict], object]) -> dict:
    """:meth:`Tuner.choose` of the process's tuner (inside :func:`compile_only`, of that
    block's)."""
    return (getattr(_LOCAL, "tuner", None) or _TUNER).choose(key, candidates, run)


def choices() -> list[dict]:
    """Every choice this process made, as JSON-ready records."""
    return [choice.as_record() for choice in _TUNER.choices()]


def reset() -> None:
    """Forget every choice (the next call of each key times its candidates again)."""
    _TUNER.reset()
