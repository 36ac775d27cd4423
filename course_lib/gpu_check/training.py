"""A short run of the ``gpu`` preset's comparison: the kernels inside a model that trains.

The preset's model, data and optimiser (hidden 384, 6 layers, 6 heads of 64, its sequence length,
the Triton kernels under autocast: bf16, or fp16 on a GPU without bf16), shortened to a few
hundred steps, one seed, the causal objective, no probes and a small final evaluation, for
every sequence encoding. It shows that every encoding trains on this GPU and how fast; with one
seed and so few steps its losses compare nothing (that is what the full comparison is for).
A run "trained" when its losses are finite and its last logged training loss is below its first.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path

__all__ = ["run_training", "short_preset", "training_rows"]


def short_preset(base, steps: int, autocast: str | None = "keep"):
    """``base`` (a :class:`course_lib.compare.presets.Preset`) cut to ``steps`` steps, one
    seed, causal objective, no ablations, probes or learning-rate sweep (the preset's
    ``train.learning_rate``), a small final evaluation; ``autocast`` replaces the training's
    autocast dtype unless ``"keep"``."""
    train = replace(
        base.train,
        steps=steps,
        warmup_steps=max(1, steps // 10),
        eval_every=steps,
        checkpoint_every=max(steps, base.train.checkpoint_every),
        log_every=max(1, min(base.train.log_every, steps // 10)),
        eval_windows=min(base.train.eval_windows, 16),
    )
    if autocast != "keep":
        train = replace(train, autocast_dtype=autocast)
    return replace(
        base,
        name=f"{base.name}-short",
        description=f"{base.description}; cut to {steps} steps for the GPU check",
        train=train,
        probes=(),
        learning_rates=(),  # no sweep: the preset's train.learning_rate
        mlm_learning_rates=None,
        eval_windows=min(base.eval_windows or 32, 32),
        mask_draws=1,
        long_windows=min(base.long_windows or 4, 4),
        long_mask_draws=1,
        offset_multiples=(1,),
        mlm_steps=None,
        seeds=(0,),
        ablations=(),
        objectives=("clm",),
    )


def training_rows(results: list[dict]) -> list[dict]:
    """Per run: ``arm``, ``status`` (``"trained"`` or why not), ``first_loss``, ``last_loss``,
    ``final_val_loss``, ``tokens_per_second``."""
    rows = []
    for r in results:
        losses = [x for x in r.get("curves", {}).get("train", {}).get("loss", [])]
        metrics = r.get("metrics", {})
        first, last = (losses[0], losses[-1]) if losses else (math.nan, math.nan)
        val = metrics.get("final_val_loss", math.nan)
        finite = all(math.isfinite(x) for x in (*losses, val)) and bool(losses)
        if not finite:
            status = "not finite"
        elif last < first:
            status = "trained"
        else:
            status = "loss did not fall"
        rows.append(
            dict(
                arm=r.get("arm"),
                status=status,
                first_loss=round(first, 4),
                last_loss=round(last, 4),
                final_val_loss=round(val, 4),
                tokens_per_second=round(metrics.get("tokens_per_second_during_run", 0.0)),
            )
        )
    return rows


def run_training(preset, encodings=None, out_dir: Path | None = None) -> list[dict]:
    """Train ``preset`` (every sequence encoding, or ``encodings``) into ``out_dir`` (a
    temporary folder by default, removed afterwards) and return :func:`training_rows`; a run
    that raises is reported with its error."""
    from course_lib.compare.training_run import run_one

    arms = tuple(encodings) if encodings is not None else preset.encoding_names()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_training-") as tmp:
        folder = Path(out_dir) if out_dir is not None else Path(tmp)
        from tqdm.auto import tqdm

        for arm in tqdm(arms, desc="short gpu comparison"):
            try:
                result = run_one(arm, "clm", preset, seed=0, out_dir=folder, progress=False)
            except Exception as exc:  # noqa: BLE001 - a run that fails is a result of the check
                rows.append(dict(arm=arm, status=f"error: {type(exc).__name__}: {exc}"[:300]))
                continue
            rows += training_rows([result])
    return rows
