"""The course corpus: English text that ships with CPython, split into training and validation.

Nothing here downloads anything. The text is the documentation that ships with CPython itself
(the ``help()`` topics, or else the docstrings of a fixed list of standard-library modules), so it
exists on any fresh machine with only the standard library.

- :func:`load_corpus` / :func:`corpus_source`: the text and where it came from;
  :func:`normalize_text`: how each document is cleaned.
- :func:`train_val_split`: the first ``1 - val_fraction`` of the characters for training, the rest
  for validation, as 1-D ``long`` token streams.
- :func:`unigram_entropy`: the loss (nats per token) of the best position-blind, context-blind
  predictor, a baseline that a model has to beat.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import warnings

import torch

from course_lib.data._checks import check_probability, check_stream
from course_lib.data.tokenizer import TOKENIZER, ByteTokenizer

__all__ = [
    "CORPUS_MIN_CHARS",
    "CORPUS_SOURCES",
    "FALLBACK_MODULES",
    "corpus_source",
    "load_corpus",
    "normalize_text",
    "train_val_split",
    "unigram_entropy",
]


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
    val_fraction = check_probability("val_fraction", val_fraction, open_interval=True)
    cut = round(len(text) * (1.0 - val_fraction))
    if cut <= 0 or cut >= len(text):
        raise ValueError(
            f"val_fraction={val_fraction} leaves an empty part of a {len(text)}-character text"
        )
    return tokenizer.encode_tensor(text[:cut]), tokenizer.encode_tensor(text[cut:])


def unigram_entropy(tokens: torch.Tensor) -> float:
    """Entropy of the unigram distribution of ``tokens`` (any shape), in nats per token:
    ``H = -sum_v p_v log p_v`` with ``p_v = count(v) / n``. It is the cross-entropy of the best
    predictor that ignores context, the baseline a language model must go below."""
    tokens = check_stream(tokens.reshape(-1) if isinstance(tokens, torch.Tensor) else tokens)
    if tokens.numel() == 0:
        raise ValueError("tokens is empty; the entropy of an empty stream is undefined")
    if int(tokens.min()) < 0:
        raise ValueError(f"token ids must be >= 0, got {int(tokens.min())}")
    counts = torch.bincount(tokens.long().cpu()).double()
    probs = counts[counts > 0] / tokens.numel()
    return max(float(-(probs * probs.log()).sum()), 0.0)
