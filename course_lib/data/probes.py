"""Probes: small tasks whose answer depends on where tokens are.

- :func:`retrieval_probe`: read the symbol at a named position of a random context.
- :func:`word_order_probe`: "the cat likes the dog. who likes?", which only word order answers.

Both return a :class:`ProbeBatch` and are fully determined by their seed.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course_lib.data._checks import check_int
from course_lib.data.tokenizer import TOKENIZER

__all__ = [
    "WORD_ORDER_NOUNS",
    "WORD_ORDER_VERBS",
    "ProbeBatch",
    "retrieval_probe",
    "word_order_probe",
]


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
    seed = check_int("seed", seed, 0)
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

        <context>@<p>?<answer>        e.g. context_len=12:  "qwhdkzmsotpa@07?s"

    ``<context>`` is ``context_len`` symbols drawn uniformly (with repeats) from ``alphabet``;
    ``<p>`` is the queried position, 0-based, uniform in ``[0, context_len)``, written in decimal
    zero-padded to ``len(str(context_len - 1))`` digits so every example has the same length
    ``T = context_len + digits + 3``; ``<answer>`` is the single token ``context[p]``.

    Without knowing where each symbol is, the best guess is right with probability
    ``1 / len(alphabet)``. ``target_position`` is ``p``, so accuracy can be binned by how far the
    target sits from the query. ``candidate_ids`` are the alphabet's ids.
    """
    num_examples = check_int("num_examples", num_examples, 1)
    context_len = check_int("context_len", context_len, 2)
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
    num_examples = check_int("num_examples", num_examples, 2)
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
