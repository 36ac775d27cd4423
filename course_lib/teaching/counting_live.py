"""Notebook 08's live cells: the CoPE model of the counting task trained again, and its verdicts.

:func:`live_numbers` trains what the notebook trains (``train_counting_model("cope",
CountingTaskConfig(seed=seed))``), probes its gates (``gate_probe``) and returns each
verdict's number at its least favourable head (:func:`probe_numbers`: the notebook's verdicts
hold for every head). ``python -m course_lib.teaching.verdict_margins
course_lib.teaching.counting_live:live_numbers --out figures/08_verdict_margins.json`` trains
:data:`SEEDS` under every CPU kernel setting and thread count; ``tests/test_verdict_margins.py``
keeps each threshold of :data:`CHECKS` 3 spreads from every seed-0 value seen (the notebook
trains seed 0) and checks that each verdict holds in every seed.
"""

from __future__ import annotations

from course_lib.teaching.counting_task import (
    CountingTaskConfig,
    accuracy,
    gate_probe,
    train_counting_model,
)
from course_lib.teaching.verdict_margins import Check

__all__ = ["SEEDS", "CHECKS", "VERDICTS", "probe_numbers", "live_numbers"]

SEEDS = (0, 1, 2, 3, 4)

CHECKS = {
    # an accuracy over at least eval_examples scored positions moves in steps of 1/eval_examples
    # at most
    "accuracy": Check("accuracy", 0.95, True, resolution=1 / CountingTaskConfig().eval_examples),
    "lowest_gate_on_words": Check("lowest_gate_on_words", 0.5, True),
    "highest_gate_on_fillers": Check("highest_gate_on_fillers", 0.05, False),
    "lowest_count_vs_words": Check("lowest_count_vs_words", 0.99, True),
    "words_over_tokens": Check("words_over_tokens", 0.0, True),
    "lowest_attention_at_target": Check("lowest_attention_at_target", 0.8, True),
    "count_off_three_gates": Check("count_off_three_gates", 0.2, False),
}
VERDICTS = tuple(check.verdict() for check in CHECKS.values())


def probe_numbers(heads: list[dict]) -> dict[str, float]:
    """Each verdict's number from :func:`~course_lib.teaching.counting_task.gate_probe`'s
    ``heads``, at the least favourable head: the lowest mean gate on words, the highest on
    fillers, the lowest correlation of the count with the words between, the smallest lead of
    that correlation over the one with the tokens between, the lowest attention on the target
    and the largest gap between the target's count and 3 gates on words."""
    return {
        "lowest_gate_on_words": min(h["gate_on_words"] for h in heads),
        "highest_gate_on_fillers": max(h["gate_on_fillers"] for h in heads),
        "lowest_count_vs_words": min(h["count_vs_words"] for h in heads),
        "words_over_tokens": min(h["count_vs_words"] - h["count_vs_tokens"] for h in heads),
        "lowest_attention_at_target": min(h["attention_at_target"] for h in heads),
        "count_off_three_gates": max(
            abs(h["count_at_target"] - 3 * h["gate_on_words"]) for h in heads
        ),
    }


def live_numbers(seed: int) -> dict[str, float]:
    """Train and probe seed ``seed`` as the notebook does: held-out accuracy and
    :func:`probe_numbers`."""
    config = CountingTaskConfig(seed=seed)
    run = train_counting_model("cope", config)
    heads = gate_probe(run.model, config)["heads"]
    return {"accuracy": float(accuracy(run.model, config)), **probe_numbers(heads)}
