"""Worked solutions for notebook 10 (the encoding comparison in a small BERT)."""

import math


def warmup_cosine_lr(
    step: int, steps: int, peak: float, warmup_steps: int, min_lr_ratio: float
) -> float:
    """Linear warm-up to ``peak`` over ``warmup_steps``, then a cosine down to
    ``min_lr_ratio * peak`` at the last step (``step`` is 0-based, ``steps`` in all)."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    t = min(1.0, (step - warmup_steps) / max(1, steps - 1 - warmup_steps))
    return peak * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t)))


def learned_table_parameters(num_layers: int, max_positions: int, hidden_size: int) -> int:
    """Parameters of the course's learned encoding: one ``[max_positions, hidden]`` table per
    layer (each attention layer adds its own table to the inputs of Q, K and V)."""
    return num_layers * max_positions * hidden_size
