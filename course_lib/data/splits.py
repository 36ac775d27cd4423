"""Held-out text a loss can be read from: evaluation splits deduplicated against training.

:func:`train_val_split` cuts the corpus in two; documentation repeats itself (boilerplate,
grammar rules quoted twice), so about 9% of the 32-byte strings of that validation text also
occur in the training text, and a model can score them from memory. :func:`comparison_splits`
cuts the corpus in three, in order: training text, a **selection** split (for choosing a
learning rate: never the text a report scores) and a **test** split (what the report scores),
and keeps of each held-out split only the bytes no shared ``n``-gram touches:

* every ``n``-byte string (``n = 32`` by default) of the held-out text that also occurs in the
  training text (for the test split: in the training or the selection text) marks its ``n``
  bytes as seen;
* the unmarked bytes form **clean segments**: maximal runs of consecutive unmarked bytes. A
  window of evaluation text is cut from one segment, never across two, so no evaluation window
  holds a string of ``n`` bytes that training saw (:func:`segment_windows`).

Everything is deterministic (no randomness); :class:`TextSplits` records what was removed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from course_lib.data._checks import check_int, check_probability
from course_lib.data.corpus import load_corpus

__all__ = [
    "TextSplits",
    "clean_segments",
    "comparison_splits",
    "segment_windows",
    "shared_ngrams",
    "window_documents",
]


@dataclass(frozen=True)
class TextSplits:
    """The three parts of the corpus (see the module docstring).

    ``train``: the training token stream ``[n_train]``; ``select`` / ``test``: the clean
    segments of each held-out split (1-D token tensors, in text order); ``ngram``: the length
    of the strings matched; ``held_out_bytes`` / ``kept_bytes``: per held-out split, its bytes
    before and after removing the seen ones."""

    train: torch.Tensor
    select: tuple[torch.Tensor, ...]
    test: tuple[torch.Tensor, ...]
    ngram: int
    held_out_bytes: dict[str, int]
    kept_bytes: dict[str, int]

    def describe(self) -> dict:
        """A JSON-ready summary: sizes, segments, what was removed."""
        return {
            "train_tokens": int(self.train.numel()),
            "ngram": self.ngram,
            **{
                split: {
                    "held_out_bytes": self.held_out_bytes[split],
                    "kept_bytes": self.kept_bytes[split],
                    "segments": len(getattr(self, split)),
                }
                for split in ("select", "test")
            },
        }


def _ngram_set(data: bytes, n: int) -> set[bytes]:
    return {data[i : i + n] for i in range(len(data) - n + 1)}


def shared_ngrams(held_out: bytes, seen: set[bytes], n: int) -> torch.Tensor:
    """Bool ``[len(held_out)]``: True at every byte covered by an ``n``-byte string of
    ``held_out`` that is in ``seen`` (a set of ``n``-byte strings)."""
    starts = torch.tensor(
        [held_out[i : i + n] in seen for i in range(len(held_out) - n + 1)], dtype=torch.int32
    )
    covered = torch.zeros(len(held_out) + 1, dtype=torch.int32)
    if starts.numel():
        # a start at i covers i .. i + n - 1: difference array, then a running sum
        covered[: starts.numel()] += starts
        covered[n : n + starts.numel()] -= starts
    return covered.cumsum(0)[: len(held_out)] > 0


def clean_segments(held_out: bytes, seen: set[bytes], n: int, min_length: int = 1) -> list[bytes]:
    """The maximal runs of ``held_out`` that no seen ``n``-gram touches, at least
    ``min_length`` bytes long, in order."""
    marked = shared_ngrams(held_out, seen, n).tolist()
    segments, start = [], None
    for i, bad in enumerate([*marked, True]):
        if not bad and start is None:
            start = i
        elif bad and start is not None:
            if i - start >= min_length:
                segments.append(held_out[start:i])
            start = None
    return segments


@functools.cache
def _cached_splits(
    text: str, select_fraction: float, test_fraction: float, ngram: int
) -> TextSplits:
    n = len(text)
    train_end = round(n * (1.0 - select_fraction - test_fraction))
    select_end = round(n * (1.0 - test_fraction))
    if not 0 < train_end < select_end < n:
        raise ValueError(
            f"fractions select={select_fraction}, test={test_fraction} leave an empty part of a "
            f"{n}-character text"
        )
    parts = {
        "train": text[:train_end].encode("utf-8"),
        "select": text[train_end:select_end].encode("utf-8"),
        "test": text[select_end:].encode("utf-8"),
    }
    seen_train = _ngram_set(parts["train"], ngram)
    select = clean_segments(parts["select"], seen_train, ngram)
    seen_both = seen_train | _ngram_set(parts["select"], ngram)
    test = clean_segments(parts["test"], seen_both, ngram)

    def tensors(segments: list[bytes]) -> tuple[torch.Tensor, ...]:
        return tuple(torch.tensor(list(s), dtype=torch.long) for s in segments)

    return TextSplits(
        train=torch.tensor(list(parts["train"]), dtype=torch.long),
        select=tensors(select),
        test=tensors(test),
        ngram=ngram,
        held_out_bytes={"select": len(parts["select"]), "test": len(parts["test"])},
        kept_bytes={"select": sum(map(len, select)), "test": sum(map(len, test))},
    )


def comparison_splits(
    text: str | None = None,
    *,
    select_fraction: float = 0.06,
    test_fraction: float = 0.12,
    ngram: int = 32,
) -> TextSplits:
    """Training text, selection split and test split of ``text`` (default:
    :func:`~course_lib.data.load_corpus`), cut in that order by characters
    (``1 - select_fraction - test_fraction``, ``select_fraction``, ``test_fraction``), each
    held-out split reduced to its clean segments (see the module docstring). Cached per
    arguments (the result is read-only by convention)."""
    if text is None:
        text = load_corpus()
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    select_fraction = check_probability("select_fraction", select_fraction, open_interval=True)
    test_fraction = check_probability("test_fraction", test_fraction, open_interval=True)
    ngram = check_int("ngram", ngram, 1)
    return _cached_splits(text, select_fraction, test_fraction, ngram)


def segment_windows(
    segments: tuple[torch.Tensor, ...] | list[torch.Tensor], length: int, max_windows: int | None
) -> torch.Tensor:
    """``[W, length]`` windows of consecutive tokens, each inside one segment: every segment is
    cut into non-overlapping windows from its start (a shorter tail is dropped), and with
    ``max_windows`` only ``W = max_windows`` of them are kept, evenly spread over the whole list
    (indices ``round(linspace(0, available - 1, W))``). Deterministic."""
    length = check_int("length", length, 1)
    pieces = [
        s[: (s.numel() // length) * length].view(-1, length)
        for s in segments
        if s.numel() >= length
    ]
    if not pieces:
        raise ValueError(f"no segment holds a window of {length} tokens")
    return _spread(torch.cat(pieces), max_windows)


def _spread(rows: torch.Tensor, max_windows: int | None) -> torch.Tensor:
    """``rows`` (one per window), or ``max_windows`` of them evenly spread over the list
    (indices ``round(linspace(0, available - 1, max_windows))``)."""
    if max_windows is not None:
        max_windows = check_int("max_windows", max_windows, 1)
        if max_windows < rows.shape[0]:
            picks = torch.linspace(0, rows.shape[0] - 1, max_windows).round().long()
            rows = rows[picks]
    return rows


#: The byte that ends a document in the corpus (:func:`course_lib.data.load_corpus`: one document
#: per line).
DOCUMENT_END = 10


def window_documents(
    segments: tuple[torch.Tensor, ...] | list[torch.Tensor], length: int, max_windows: int | None
) -> torch.Tensor:
    """``[W]``: for each window of :func:`segment_windows` (same arguments, same order), the
    document its first token belongs to, counted in the segments' text (the number of
    :data:`DOCUMENT_END` bytes before it). Windows of one document share text, so a bootstrap of
    the evaluation text's noise resamples documents, not windows. A document end that fell in
    removed bytes is not seen: its two documents then count as one, which only makes the blocks
    larger (a more cautious bootstrap)."""
    length = check_int("length", length, 1)
    ids, before = [], 0
    for s in segments:
        ends = torch.cumsum((s == DOCUMENT_END).long(), 0) - (s == DOCUMENT_END).long()
        if s.numel() >= length:
            starts = torch.arange(0, (s.numel() // length) * length, length)
            ids.append(before + ends[starts])
        before += int((s == DOCUMENT_END).sum())
    if not ids:
        raise ValueError(f"no segment holds a window of {length} tokens")
    return _spread(torch.cat(ids), max_windows)
