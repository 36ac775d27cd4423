"""Offline data for the course: a corpus, a byte tokenizer, batches and word-order probes.

Nothing here downloads anything. The corpus is English documentation text that ships with CPython
itself, so it exists on any fresh machine with only the standard library.

Everything random takes a seed or a ``torch.Generator``, so every batch and probe is reproducible.

Contents
- :func:`load_corpus` / :func:`corpus_source`: the text and where it came from.
- :class:`ByteTokenizer`: ids 0..255 are UTF-8 bytes, then ``PAD`` (256), ``MASK`` (257),
  ``BOS`` (258); ``vocab_size`` is 259.
- :func:`train_val_split`: the first ``1 - val_fraction`` of the characters for training, the rest
  for validation, as 1-D ``long`` token streams.
- :func:`clm_batch`, :func:`mlm_batch`, :func:`mask_tokens`, :func:`eval_windows`: training and
  validation batches for the causal (next-token) and masked (BERT) objectives.
- :func:`pad_batch`: variable-length sequences to ``[batch, max_len]`` plus a bool attention mask.
- :func:`retrieval_probe`, :func:`word_order_probe`: small tasks whose answer depends on where
  tokens are, returned as a :class:`ProbeBatch`.
- :func:`unigram_entropy`: the loss (nats per token) of the best position-blind, context-blind
  predictor, a baseline that a model has to beat.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import string
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "BOS_ID",
    "CORPUS_MIN_CHARS",
    "CORPUS_SOURCES",
    "FALLBACK_MODULES",
    "IGNORE_INDEX",
    "MASK_ID",
    "PAD_ID",
    "TOKENIZER",
    "VOCAB_SIZE",
    "WORD_ORDER_NOUNS",
    "WORD_ORDER_VERBS",
    "ByteTokenizer",
    "ProbeBatch",
    "clm_batch",
    "corpus_source",
    "eval_windows",
    "load_corpus",
    "mask_tokens",
    "mlm_batch",
    "normalize_text",
    "pad_batch",
    "retrieval_probe",
    "train_val_split",
    "unigram_entropy",
    "word_order_probe",
]

# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------

#: The smallest corpus (in characters, after normalisation) that :func:`load_corpus` accepts.
CORPUS_MIN_CHARS = 100_000

#: Valid values of ``load_corpus(source=...)``.
CORPUS_SOURCES = ("auto", "pydoc_topics", "stdlib_docstrings")

#: Standard-library modules whose docstrings form the fallback corpus (fixed, sorted order).
FALLBACK_MODULES = (
    "argparse",
    "calendar",
    "collections",
    "contextlib",
    "dataclasses",
    "difflib",
    "functools",
    "heapq",
    "inspect",
    "json",
    "logging",
    "os",
    "pathlib",
    "pydoc",
    "random",
    "re",
    "shutil",
    "statistics",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "zipfile",
)

# Typographic punctuation mapped to ASCII look-alikes, so the text is (almost) one byte per char.
_ASCII_PUNCTUATION = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": "--",
        "\u2026": "...",
        "\u00a0": " ",
    }
)
# reStructuredText heading underlines such as "*****" or "=====": 4+ repeats of one such char.
_RULE_LINE = re.compile(r"([*=~^#-])\1{3,}")
_WHITESPACE = re.compile(r"\s+")


def normalize_text(document: str) -> str:
    """Lightly normalise one document into a single line.

    1. typographic quotes, dashes, ellipsis and non-breaking spaces become ASCII;
    2. heading underlines (runs of 4 or more of one of ``* = ~ ^ # -``) are removed;
    3. every run of whitespace, newlines included, becomes one space; the ends are stripped.

    Other non-ASCII characters (a handful in the CPython docs) are kept; they encode to 2-4 bytes.
    """
    text = document.translate(_ASCII_PUNCTUATION)
    text = _RULE_LINE.sub(" ", text)
    return _WHITESPACE.sub(" ", text).strip()


def _pydoc_topic_documents() -> list[str]:
    """The values of ``pydoc_data.topics.topics`` in sorted key order ([] if not shipped)."""
    try:
        topics_module = importlib.import_module("pydoc_data.topics")
    except ImportError:
        return []
    topics = getattr(topics_module, "topics", None)
    if not isinstance(topics, dict):
        return []
    return [str(topics[key]) for key in sorted(topics)]


def _stdlib_docstring_documents() -> list[str]:
    """Docstrings of :data:`FALLBACK_MODULES`: each module, then its public classes, functions
    and methods in sorted name order. Empty under ``python -OO``, which strips docstrings."""
    documents: list[str] = []
    with warnings.catch_warnings():
        # Reading some docstrings (e.g. typing.io on 3.11) warns about deprecated aliases.
        warnings.simplefilter("ignore", DeprecationWarning)
        for module_name in FALLBACK_MODULES:
            documents.extend(_module_docstrings(module_name))
    return documents


def _module_docstrings(module_name: str) -> list[str]:
    """The docstrings of one module, its public classes and functions, and their methods."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    documents = [inspect.getdoc(module) or ""]
    for name in sorted(vars(module)):
        obj = vars(module)[name]
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        documents.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):
            for attr in sorted(vars(obj)):
                member = vars(obj)[attr]
                if not attr.startswith("_") and inspect.isfunction(member):
                    documents.append(inspect.getdoc(member) or "")
    return documents


def _build_corpus(source: str) -> str:
    """Normalise each document of ``source`` and join them with one newline (one per line)."""
    documents = (
        _pydoc_topic_documents() if source == "pydoc_topics" else _stdlib_docstring_documents()
    )
    lines = (normalize_text(doc) for doc in documents)
    return "\n".join(line for line in lines if line)


@functools.cache
def load_corpus(source: str = "auto") -> str:
    """The course corpus: English text that ships with CPython, normalised by
    :func:`normalize_text`, one document per line (documents joined by ``"\\n"``).

    ``source``:
    - ``"pydoc_topics"``: the values of ``pydoc_data.topics.topics`` (the language reference
      topics that ``help()`` shows) in sorted key order; about 418k characters on CPython 3.11.
    - ``"stdlib_docstrings"``: the docstrings of :data:`FALLBACK_MODULES` (about 220k characters
      on CPython 3.11).
    - ``"auto"`` (default): ``pydoc_topics`` if it has at least :data:`CORPUS_MIN_CHARS`
      characters, else ``stdlib_docstrings``; :func:`corpus_source` says which one was used.

    The text depends on the Python version (the docs change between releases), not on anything
    else. Cached: repeated calls return the same string. Raises ``RuntimeError`` if the chosen
    source (or, for ``"auto"``, both sources) has fewer than :data:`CORPUS_MIN_CHARS` characters.
    """
    if source not in CORPUS_SOURCES:
        raise ValueError(f"unknown corpus source {source!r}; valid: {', '.join(CORPUS_SOURCES)}")
    if source == "auto":
        return load_corpus(corpus_source())
    text = _build_corpus(source)
    if len(text) < CORPUS_MIN_CHARS:
        raise RuntimeError(
            f"corpus source {source!r} has only {len(text)} characters on this Python; at least "
            f"{CORPUS_MIN_CHARS} are needed (docstrings are stripped under `python -OO`)"
        )
    return text


@functools.cache
def corpus_source() -> str:
    """The source that ``load_corpus("auto")`` uses: ``"pydoc_topics"`` or
    ``"stdlib_docstrings"``. Raises ``RuntimeError`` if neither is large enough."""
    sizes = {}
    for source in ("pydoc_topics", "stdlib_docstrings"):
        sizes[source] = len(_build_corpus(source))
        if sizes[source] >= CORPUS_MIN_CHARS:
            return source
    raise RuntimeError(
        f"no usable offline corpus on this Python: {sizes} characters, at least "
        f"{CORPUS_MIN_CHARS} needed (pydoc_data missing and docstrings stripped by `python -OO`?)"
    )


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

PAD_ID = 256
MASK_ID = 257
BOS_ID = 258
VOCAB_SIZE = 259
#: Label value that ``torch.nn.functional.cross_entropy`` ignores by default.
IGNORE_INDEX = -100


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are the byte values, 256 is ``PAD``, 257 is ``MASK``,
    258 is ``BOS``; ``vocab_size = 259``. Every string round-trips: ``decode(encode(s)) == s``.
    """

    def __init__(self) -> None:
        self.pad_id = PAD_ID
        self.mask_id = MASK_ID
        self.bos_id = BOS_ID
        self.vocab_size = VOCAB_SIZE
        self.special_names = {PAD_ID: "[PAD]", MASK_ID: "[MASK]", BOS_ID: "[BOS]"}

    def __repr__(self) -> str:
        return (
            f"ByteTokenizer(vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"mask_id={self.mask_id}, bos_id={self.bos_id})"
        )

    @property
    def special_ids(self) -> tuple[int, ...]:
        """``(pad_id, mask_id, bos_id)``."""
        return (self.pad_id, self.mask_id, self.bos_id)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids, optionally preceded by ``bos_id``."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def encode_tensor(self, text: str, *, add_bos: bool = False) -> torch.Tensor:
        """:meth:`encode` as a 1-D ``long`` tensor ``[len]``."""
        return torch.tensor(self.encode(text, add_bos=add_bos), dtype=torch.long)

    def decode(self, ids: Sequence[int] | torch.Tensor, *, show_special: bool = False) -> str:
        """Text of a 1-D sequence of ids. Special tokens are skipped, or written as ``[PAD]``,
        ``[MASK]``, ``[BOS]`` when ``show_special=True``; invalid UTF-8 becomes U+FFFD."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(
                    f"decode expects a 1-D sequence of ids, got shape {tuple(ids.shape)}"
                )
            ids = ids.tolist()
        pieces: list[str] = []
        chunk = bytearray()
        for token in ids:
            token = int(token)
            if 0 <= token < 256:
                chunk.append(token)
            elif token in self.special_names:
                if show_special:
                    pieces.append(chunk.decode("utf-8", errors="replace"))
                    chunk = bytearray()
                    pieces.append(self.special_names[token])
            else:
                raise ValueError(
                    f"token id {token} is outside the vocabulary 0..{self.vocab_size - 1}"
                )
        pieces.append(chunk.decode("utf-8", errors="replace"))
        return "".join(pieces)


#: The default tokenizer instance.
TOKENIZER = ByteTokenizer()


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_stream(tokens: object) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a 1-D integer torch.Tensor, got {type(tokens).__name__}")
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be a 1-D token stream, got shape {tuple(tokens.shape)}")
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"tokens must hold integer ids, got dtype {tokens.dtype}")
    return tokens


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator (e.g. torch.Generator().manual_seed(0)), "
            f"got {type(generator).__name__}"
        )
    return generator


def _check_probability(name: str, value: object, *, open_interval: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    ok = 0.0 < value < 1.0 if open_interval else 0.0 <= value <= 1.0
    if not ok:
        interval = "(0, 1)" if open_interval else "[0, 1]"
        raise ValueError(f"{name} must lie in {interval}, got {value}")
    return value


# ---------------------------------------------------------------------------------------------
# Split and batches
# ---------------------------------------------------------------------------------------------


def train_val_split(
    text: str | None = None,
    val_fraction: float = 0.1,
    tokenizer: ByteTokenizer = TOKENIZER,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``text`` (default: :func:`load_corpus`) by characters: the first
    ``round(len(text) * (1 - val_fraction))`` characters are training text, the rest validation.

    Returns ``(train_ids [n_train], val_ids [n_val])``, 1-D ``long`` token streams. Deterministic;
    the two parts are disjoint and ``decode(train) + decode(val) == text``.
    """
    if text is None:
        text = load_corpus()
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    val_fraction = _check_probability("val_fraction", val_fraction, open_interval=True)
    cut = round(len(text) * (1.0 - val_fraction))
    if cut <= 0 or cut >= len(text):
        raise ValueError(
            f"val_fraction={val_fraction} leaves an empty part of a {len(text)}-character text"
        )
    return tokenizer.encode_tensor(text[:cut]), tokenizer.encode_tensor(text[cut:])


def _crops(
    tokens: torch.Tensor, batch_size: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """``[batch_size, length]`` windows of ``tokens`` starting at uniform random offsets."""
    n = tokens.shape[0]
    if length > n:
        raise ValueError(f"the token stream has {n} tokens, too few for windows of {length} tokens")
    starts = torch.randint(
        0, n - length + 1, (batch_size,), generator=generator, device=generator.device
    )
    offsets = torch.arange(length, device=tokens.device)
    return tokens[starts.to(tokens.device)[:, None] + offsets]


def clm_batch(
    tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random crops for next-token prediction.

    Draws ``batch_size`` windows of ``seq_len + 1`` consecutive tokens of the stream ``tokens``
    (start offsets uniform, from ``generator``) and returns ``(input_ids [B, L], labels [B, L])``
    with ``labels[b, t] = input_ids[b, t + 1]``, i.e. ``labels`` is the window shifted by one.
    """
    tokens = _check_stream(tokens)
    batch_size = _check_int("batch_size", batch_size, 1)
    seq_len = _check_int("seq_len", seq_len, 1)
    generator = _check_generator(generator)
    if seq_len + 1 > tokens.shape[0]:
        raise ValueError(
            f"seq_len={seq_len} needs a stream of at least seq_len + 1 = {seq_len + 1} tokens, "
            f"got {tokens.shape[0]}"
        )
    windows = _crops(tokens.long(), batch_size, seq_len + 1, generator)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def mask_tokens(
    input_ids: torch.Tensor,
    generator: torch.Generator,
    mask_prob: float = 0.15,
    *,
    special_ids: Sequence[int] = (PAD_ID, MASK_ID, BOS_ID),
    attention_mask: torch.Tensor | None = None,
    mask_id: int = MASK_ID,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    random_token_range: tuple[int, int] = (0, 256),
    ensure_target: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking (Devlin et al. 2019) of ``input_ids [..., L]``.

    Each eligible position becomes a target with probability ``mask_prob`` (independently).
    Eligible = not one of ``special_ids`` (so ``PAD`` is never masked) and, if given,
    ``attention_mask`` True. Of the targets, a fraction ``mask_replace_prob`` (0.8) is replaced by
    ``mask_id``, ``random_replace_prob`` (0.1) by a uniform id from ``random_token_range``
    (``[low, high)``, the byte range by default) and the rest (0.1) are left unchanged.
    With ``ensure_target`` a row with no target but some eligible position gets one target at a
    uniformly chosen eligible position, so no row has an all-ignored loss.

    Returns ``(masked_ids, labels)``, both shaped like ``input_ids`` (``long``):
    ``labels = input_ids`` at targets and :data:`IGNORE_INDEX` (-100) elsewhere. ``input_ids``
    is not modified. The same generator state gives the same result.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be an integer torch.Tensor, got {type(input_ids).__name__}"
        )
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise TypeError(f"input_ids must hold integer ids, got dtype {input_ids.dtype}")
    if input_ids.dim() < 1:
        raise ValueError("input_ids must have at least one dimension (the sequence)")
    generator = _check_generator(generator)
    mask_prob = _check_probability("mask_prob", mask_prob, open_interval=True)
    mask_replace_prob = _check_probability(
        "mask_replace_prob", mask_replace_prob, open_interval=False
    )
    random_replace_prob = _check_probability(
        "random_replace_prob", random_replace_prob, open_interval=False
    )
    if mask_replace_prob + random_replace_prob > 1.0 + 1e-12:
        raise ValueError(
            "mask_replace_prob + random_replace_prob must be <= 1, got "
            f"{mask_replace_prob} + {random_replace_prob}"
        )
    low, high = random_token_range
    if not (0 <= low < high):
        raise ValueError(
            f"random_token_range must be [low, high) with 0 <= low < high, got {random_token_range}"
        )
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
            raise TypeError("attention_mask must be a bool tensor (True for real tokens)")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape "
                f"{tuple(input_ids.shape)}"
            )

    device = input_ids.device
    shape = input_ids.shape
    ids = input_ids.long()
    eligible = torch.ones(shape, dtype=torch.bool, device=device)
    for special in special_ids:
        eligible &= ids != int(special)
    if attention_mask is not None:
        eligible &= attention_mask.to(device)

    # All draws happen every call, in a fixed order, so results depend only on the generator.
    gen_device = generator.device
    select_u = torch.rand(shape, generator=generator, device=gen_device).to(device)
    fallback_u = torch.rand(shape, generator=generator, device=gen_device).to(device)
    action_u = torch.rand(shape, generator=generator, device=gen_device).to(device)
    random_ids = torch.randint(low, high, shape, generator=generator, device=gen_device).to(device)

    targets = (select_u < mask_prob) & eligible
    if ensure_target:
        needs_one = eligible.any(dim=-1) & ~targets.any(dim=-1)
        scores = torch.where(eligible, fallback_u, torch.full_like(fallback_u, -1.0))
        forced = torch.zeros_like(targets)
        forced.scatter_(-1, scores.argmax(dim=-1, keepdim=True), True)
        targets |= forced & needs_one.unsqueeze(-1)

    to_mask = targets & (action_u < mask_replace_prob)
    to_random = targets & (action_u >= mask_replace_prob)
    to_random &= action_u < mask_replace_prob + random_replace_prob

    masked = ids.clone()
    masked[to_mask] = mask_id
    masked[to_random] = random_ids[to_random]
    labels = torch.where(targets, ids, torch.full_like(ids, IGNORE_INDEX))
    return masked, labels


def mlm_batch(
    tokens: torch.Tensor,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator,
    mask_prob: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random crops of ``seq_len`` tokens with BERT masking (see :func:`mask_tokens`).

    Returns ``(input_ids [B, L], labels [B, L])``: ``labels`` holds the original id at the
    ~``mask_prob`` target positions and -100 elsewhere; ``input_ids`` has 80% of targets replaced
    by ``MASK``, 10% by a random byte, 10% unchanged.
    """
    tokens = _check_stream(tokens)
    batch_size = _check_int("batch_size", batch_size, 1)
    seq_len = _check_int("seq_len", seq_len, 1)
    generator = _check_generator(generator)
    mask_prob = _check_probability("mask_prob", mask_prob, open_interval=True)
    if seq_len > tokens.shape[0]:
        raise ValueError(
            f"seq_len={seq_len} is longer than the token stream ({tokens.shape[0]} tokens)"
        )
    windows = _crops(tokens.long(), batch_size, seq_len, generator)
    return mask_tokens(windows, generator, mask_prob)


def eval_windows(
    tokens: torch.Tensor,
    seq_len: int,
    max_windows: int | None = None,
    *,
    batch_size: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic, non-overlapping validation windows for next-token prediction.

    Window ``w`` has ``input_ids = tokens[w*L : w*L + L]`` and ``labels = tokens[w*L+1 : w*L+L+1]``
    (``L = seq_len``), for ``w = 0 .. min((n - 1) // L, max_windows) - 1``, so every token is
    predicted at most once. Yields ``(input_ids [b, L], labels [b, L])`` with ``b <= batch_size``
    consecutive windows (the last batch may be smaller). For the masked objective, use the
    ``input_ids`` and :func:`mask_tokens` with a freshly seeded generator.
    """
    tokens = _check_stream(tokens)
    seq_len = _check_int("seq_len", seq_len, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    if max_windows is not None:
        max_windows = _check_int("max_windows", max_windows, 1)
    available = (tokens.shape[0] - 1) // seq_len
    if available < 1:
        raise ValueError(
            f"seq_len={seq_len} needs a stream of at least seq_len + 1 = {seq_len + 1} tokens, "
            f"got {tokens.shape[0]}"
        )
    count = available if max_windows is None else min(available, max_windows)
    return _iter_windows(tokens.long(), seq_len, count, batch_size)


def _iter_windows(
    tokens: torch.Tensor, seq_len: int, count: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    offsets = torch.arange(seq_len + 1, device=tokens.device)
    for first in range(0, count, batch_size):
        starts = torch.arange(first, min(first + batch_size, count), device=tokens.device) * seq_len
        windows = tokens[starts[:, None] + offsets]
        yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def pad_batch(
    sequences: Sequence[Sequence[int] | torch.Tensor],
    pad_id: int = PAD_ID,
    *,
    side: str = "right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad variable-length id sequences to ``Lmax`` (the longest).

    Returns ``(input_ids [B, Lmax] long, attention_mask [B, Lmax] bool)``; ``attention_mask`` is
    True at real tokens. ``side="right"`` puts the padding after the tokens, ``"left"`` before.
    """
    if side not in ("right", "left"):
        raise ValueError(f"unknown padding side {side!r}; valid: 'right', 'left'")
    if isinstance(sequences, torch.Tensor) or len(sequences) == 0:
        raise ValueError("sequences must be a non-empty list of id lists or 1-D tensors")
    rows: list[torch.Tensor] = []
    for i, seq in enumerate(sequences):
        row = seq if isinstance(seq, torch.Tensor) else torch.tensor(list(seq), dtype=torch.long)
        if row.dim() != 1:
            raise ValueError(f"sequence {i} must be 1-D, got shape {tuple(row.shape)}")
        if row.numel() and (row.dtype == torch.bool or row.is_floating_point()):
            raise TypeError(f"sequence {i} must hold integer ids, got dtype {row.dtype}")
        rows.append(row.long())
    max_len = max(row.shape[0] for row in rows)
    if max_len == 0:
        raise ValueError("all sequences are empty; nothing to pad")
    device = rows[0].device
    input_ids = torch.full((len(rows), max_len), int(pad_id), dtype=torch.long, device=device)
    attention_mask = torch.zeros((len(rows), max_len), dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        n = row.shape[0]
        span = slice(0, n) if side == "right" else slice(max_len - n, max_len)
        input_ids[i, span] = row.to(device)
        attention_mask[i, span] = True
    return input_ids, attention_mask


# ---------------------------------------------------------------------------------------------
# Probes: tasks where word order decides the answer
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeBatch:
    """A batch of probe examples, all of the same length ``T`` (no padding).

    - ``input_ids [N, T]`` long: the full text of each example, answer included (at the end).
    - ``answer_index [N]``: index in ``input_ids`` of the (first) answer token. A causal model is
      scored on its prediction at ``answer_index - 1``; a masked model on its prediction at
      ``answer_index`` after the ``answer_len`` answer tokens are replaced by ``MASK``.
    - ``answer_len``: number of answer tokens (1 for retrieval, 3 for word order); only the first
      decides, as the candidates differ in their first token.
    - ``answer_id [N]``: the id of the first answer token.
    - ``candidate_ids [N, C]``: the ids the answer is one of (``answer_id`` is among them);
      accuracy = picking ``answer_id`` among these; chance is ``1 / C``.
    - ``target_position [N]``: index in ``input_ids`` (= position in the context, which starts at 0)
      of the token the answer copies.
    - ``texts``: the decoded examples.
    """

    input_ids: torch.Tensor
    answer_index: torch.Tensor
    answer_len: int
    answer_id: torch.Tensor
    candidate_ids: torch.Tensor
    target_position: torch.Tensor
    texts: tuple[str, ...]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The candidate each example's ``logits [N, vocab]`` scores highest: ids ``[N]``.
        ``(probe.choose(logits) == probe.answer_id)`` marks the correct examples."""
        if logits.dim() != 2 or logits.shape[0] != len(self):
            raise ValueError(
                f"logits must be [{len(self)}, vocab], got shape {tuple(logits.shape)}"
            )
        candidates = self.candidate_ids.to(logits.device)
        best = logits.gather(1, candidates).argmax(dim=1, keepdim=True)
        return candidates.gather(1, best).squeeze(1)


def _seeded_generator(seed: object) -> torch.Generator:
    seed = _check_int("seed", seed, 0)
    return torch.Generator().manual_seed(seed)


def retrieval_probe(
    num_examples: int,
    context_len: int,
    seed: int,
    *,
    alphabet: str = string.ascii_lowercase,
) -> ProbeBatch:
    """Positional retrieval: read the symbol at a named position.

    Text format (one token per character, byte-level)::

        <context>@<p>?<answer>        e.g. context_len=12:  "qwhdkzmsotpa@07?m"

    ``<context>`` is ``context_len`` symbols drawn uniformly (with repeats) from ``alphabet``;
    ``<p>`` is the queried position, 0-based, uniform in ``[0, context_len)``, written in decimal
    zero-padded to ``len(str(context_len - 1))`` digits so every example has the same length
    ``T = context_len + digits + 3``; ``<answer>`` is the single token ``context[p]``.

    Without knowing where each symbol is, the best guess is right with probability
    ``1 / len(alphabet)``. ``target_position`` is ``p``, so accuracy can be binned by how far the
    target sits from the query. ``candidate_ids`` are the alphabet's ids.
    """
    num_examples = _check_int("num_examples", num_examples, 1)
    context_len = _check_int("context_len", context_len, 2)
    if not isinstance(alphabet, str):
        raise TypeError(f"alphabet must be a str, got {type(alphabet).__name__}")
    symbols = sorted(set(alphabet))
    if len(symbols) < 2 or len(symbols) != len(alphabet):
        raise ValueError(f"alphabet must hold at least 2 distinct characters, got {alphabet!r}")
    if any(not (c.isascii() and c.isprintable()) or c.isdigit() or c in "@? " for c in symbols):
        raise ValueError(
            "alphabet characters must be printable ASCII, not digits, '@', '?' or space; "
            f"got {alphabet!r}"
        )
    generator = _seeded_generator(seed)
    digits = len(str(context_len - 1))

    symbol_ids = torch.tensor([ord(c) for c in symbols], dtype=torch.long)
    context = symbol_ids[
        torch.randint(0, len(symbols), (num_examples, context_len), generator=generator)
    ]
    positions = torch.randint(0, context_len, (num_examples,), generator=generator)
    answers = context[torch.arange(num_examples), positions]

    rows = []
    for i in range(num_examples):
        query = f"@{int(positions[i]):0{digits}d}?"
        rows.append(torch.cat([context[i], TOKENIZER.encode_tensor(query), answers[i : i + 1]]))
    input_ids = torch.stack(rows)
    answer_index = torch.full((num_examples,), input_ids.shape[1] - 1, dtype=torch.long)
    return ProbeBatch(
        input_ids=input_ids,
        answer_index=answer_index,
        answer_len=1,
        answer_id=answers.clone(),
        candidate_ids=symbol_ids.expand(num_examples, -1).clone(),
        target_position=positions,
        texts=tuple(TOKENIZER.decode(row) for row in input_ids),
    )


#: Default nouns of :func:`word_order_probe`: three letters each, all first letters distinct.
WORD_ORDER_NOUNS = (
    "ant",
    "bee",
    "cat",
    "dog",
    "elk",
    "fox",
    "gnu",
    "hen",
    "jay",
    "owl",
    "pig",
    "rat",
    "yak",
)
#: Default verbs of :func:`word_order_probe`: five letters each.
WORD_ORDER_VERBS = ("likes", "helps", "calls", "feeds", "bites", "hates", "kicks", "warns")


def word_order_probe(
    num_examples: int,
    seed: int,
    *,
    nouns: Sequence[str] = WORD_ORDER_NOUNS,
    verbs: Sequence[str] = WORD_ORDER_VERBS,
) -> ProbeBatch:
    """Who did it? A question only word order can answer.

    Text format (byte-level; all examples have the same length)::

        the <A> <verb> the <B>. who <verb>? <A>      e.g. "the cat likes the dog. who likes? cat"

    ``A != B`` are drawn uniformly from ``nouns``, ``verb`` from ``verbs``. Examples come in pairs:
    example ``2k`` is ``(A, verb, B)`` and ``2k + 1`` is ``(B, verb, A)``, so both orders of the
    same multiset of words appear and the two answers differ. The answer is the subject noun, a span
    of ``answer_len`` tokens (the noun length, 3 by default) at the end; the nouns have distinct
    first letters, so its first token decides. ``candidate_ids [N, 2]`` are the first tokens of the
    two nouns in sentence order (subject, object); chance is 1/2.

    A bidirectional model with no position signal, with the answer span masked, sees the two
    examples of a pair as permutations of the same tokens and must give both the same answer, so
    it scores exactly 1/2 on every pair. (A causal mask leaks some order on its own.)
    ``target_position`` is the index of the subject noun (4).
    """
    num_examples = _check_int("num_examples", num_examples, 2)
    if num_examples % 2:
        raise ValueError(
            "num_examples must be even (examples come in pairs of both word orders), "
            f"got {num_examples}"
        )
    nouns, verbs = tuple(nouns), tuple(verbs)
    if len(nouns) < 2 or len(set(nouns)) != len(nouns):
        raise ValueError(f"nouns must hold at least 2 distinct words, got {nouns}")
    if len({n[:1] for n in nouns}) != len(nouns) or len({len(n) for n in nouns}) != 1:
        raise ValueError(
            f"nouns must share one length and have distinct first letters, got {nouns}"
        )
    if not verbs or len({len(v) for v in verbs}) != 1:
        raise ValueError(f"verbs must be a non-empty list of words of one length, got {verbs}")
    for word in nouns + verbs:
        if not (word.isascii() and word.isalpha() and word.islower()):
            raise ValueError(f"nouns and verbs must be lowercase ASCII letters, got {word!r}")

    generator = _seeded_generator(seed)
    num_pairs = num_examples // 2
    first = torch.randint(0, len(nouns), (num_pairs,), generator=generator)
    # A second, different noun: shift by 1..len-1 so it is uniform over the others.
    second = (first + torch.randint(1, len(nouns), (num_pairs,), generator=generator)) % len(nouns)
    verb_index = torch.randint(0, len(verbs), (num_pairs,), generator=generator)

    texts, answers, candidates = [], [], []
    for k in range(num_pairs):
        a, b, verb = nouns[int(first[k])], nouns[int(second[k])], verbs[int(verb_index[k])]
        for subject, obj in ((a, b), (b, a)):
            texts.append(f"the {subject} {verb} the {obj}. who {verb}? {subject}")
            answers.append(ord(subject[0]))
            candidates.append((ord(subject[0]), ord(obj[0])))
    input_ids = torch.stack([TOKENIZER.encode_tensor(text) for text in texts])
    answer_len = len(nouns[0])
    return ProbeBatch(
        input_ids=input_ids,
        answer_index=torch.full((num_examples,), input_ids.shape[1] - answer_len, dtype=torch.long),
        answer_len=answer_len,
        answer_id=torch.tensor(answers, dtype=torch.long),
        candidate_ids=torch.tensor(candidates, dtype=torch.long),
        target_position=torch.full((num_examples,), len("the "), dtype=torch.long),
        texts=tuple(texts),
    )


# ---------------------------------------------------------------------------------------------
# Baseline
# ---------------------------------------------------------------------------------------------


def unigram_entropy(tokens: torch.Tensor) -> float:
    """Entropy of the unigram distribution of ``tokens`` (any shape), in nats per token:
    ``H = -sum_v p_v log p_v`` with ``p_v = count(v) / n``. It is the cross-entropy of the best
    predictor that ignores context, the baseline a language model must go below."""
    tokens = _check_stream(tokens.reshape(-1) if isinstance(tokens, torch.Tensor) else tokens)
    if tokens.numel() == 0:
        raise ValueError("tokens is empty; the entropy of an empty stream is undefined")
    if int(tokens.min()) < 0:
        raise ValueError(f"token ids must be >= 0, got {int(tokens.min())}")
    counts = torch.bincount(tokens.long().cpu()).double()
    probs = counts[counts > 0] / tokens.numel()
    return max(float(-(probs * probs.log()).sum()), 0.0)
