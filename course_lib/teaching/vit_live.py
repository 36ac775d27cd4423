"""Notebook 09's live cell: axial 2D RoPE trained again on the scenes task, and its verdicts.

:func:`live_numbers` trains what the cell trains (``train_vit("rope_2d", TrainConfig(steps=150,
seed=seed))``) and returns the two numbers it compares: the mean training loss of the last 25
steps and the accuracy on 500 held-out 8 x 8 scenes. ``python -m
course_lib.teaching.verdict_margins course_lib.teaching.vit_live:live_numbers --out
figures/09_verdict_margins.json`` trains :data:`SEEDS` under every CPU kernel setting and thread
count; ``tests/test_verdict_margins.py`` keeps each threshold of :data:`CHECKS` 3 spreads from
every seed-0 value seen (the notebook trains seed 0) and checks that each verdict holds in every
seed.
"""

from __future__ import annotations

from course_lib.teaching.verdict_margins import Check
from course_lib.vision import TrainConfig, accuracy, train_vit

__all__ = ["SEEDS", "STEPS", "CHECKS", "VERDICTS", "live_numbers"]

SEEDS = (0, 1, 2, 3, 4)
STEPS = 150

EVAL_SCENES = 500  # held-out 8 x 8 scenes: the accuracy moves in steps of 1/500

CHECKS = {
    "last_loss": Check("last_loss", 0.5, False),
    "accuracy_8x8": Check("accuracy_8x8", 0.9, True, resolution=1 / EVAL_SCENES),
}
VERDICTS = tuple(check.verdict() for check in CHECKS.values())


def live_numbers(seed: int) -> dict[str, float]:
    """Train seed ``seed`` as notebook 09's live cell does: ``{"last_loss": mean loss of the
    last 25 steps, "accuracy_8x8": accuracy on 500 held-out 8 x 8 scenes}``."""
    model, history = train_vit("rope_2d", TrainConfig(steps=STEPS, seed=seed))
    return {
        "last_loss": float(history["loss"][-1]),
        "accuracy_8x8": accuracy(model, 8, n=EVAL_SCENES),
    }
