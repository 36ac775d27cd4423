"""Offline data for the course: a corpus, a byte tokenizer, batches and probes.

One idea per module:

- :mod:`~course_lib.data.corpus`: the text (documentation that ships with CPython; nothing is
  downloaded), its train/validation split and the unigram baseline;
- :mod:`~course_lib.data.tokenizer`: :class:`ByteTokenizer`, ids 0..255 are UTF-8 bytes, then
  ``PAD`` (256), ``MASK`` (257), ``BOS`` (258); ``VOCAB_SIZE`` is 259;
- :mod:`~course_lib.data.batches`: causal and masked (80/10/10) training batches, validation
  windows, padding;
- :mod:`~course_lib.data.splits`: training, selection and test text for the comparison, the
  held-out parts deduplicated against training (no shared 32-byte string);
- :mod:`~course_lib.data.probes`: the retrieval and word-order probe examples.

Everything random takes a seed or a ``torch.Generator``, so every batch and probe is
reproducible. The public names of every module are available from ``course_lib.data`` directly.
"""

from __future__ import annotations

from course_lib.data.batches import (
    IGNORE_INDEX,
    clm_batch,
    eval_windows,
    mask_tokens,
    mlm_batch,
    pad_batch,
)
from course_lib.data.corpus import (
    CORPUS_MIN_CHARS,
    CORPUS_SOURCES,
    FALLBACK_MODULES,
    corpus_source,
    load_corpus,
    normalize_text,
    train_val_split,
    unigram_entropy,
)
from course_lib.data.probes import (
    WORD_ORDER_NOUNS,
    WORD_ORDER_VERBS,
    ProbeBatch,
    retrieval_probe,
    word_order_probe,
)
from course_lib.data.splits import (
    TextSplits,
    clean_segments,
    comparison_splits,
    segment_windows,
    shared_ngrams,
    window_documents,
)
from course_lib.data.tokenizer import (
    BOS_ID,
    MASK_ID,
    PAD_ID,
    TOKENIZER,
    VOCAB_SIZE,
    ByteTokenizer,
)

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
    "TextSplits",
    "clean_segments",
    "clm_batch",
    "comparison_splits",
    "corpus_source",
    "eval_windows",
    "load_corpus",
    "mask_tokens",
    "mlm_batch",
    "normalize_text",
    "pad_batch",
    "retrieval_probe",
    "segment_windows",
    "window_documents",
    "shared_ngrams",
    "train_val_split",
    "unigram_entropy",
    "word_order_probe",
]
