"""Notebook 06's experiment, "extrapolation in a minute": train at 64 tokens, read up to 512.

    python -m course_lib.teaching.score_bias_experiment [--out figures/06_score_biases]

What it does, seeded from start to end (one torch thread; 10-25 s per model, about 8 minutes
for the twenty runs on a 2-core CPU):

1. **Training.** Causal models with the recipe of the comparison's ``cpu`` preset
   (:data:`course_lib.compare.PRESETS`: hidden 64, 2 layers, 4 heads of 16, 300 steps of batch 16
   at length ``L = 64``, the course corpus), one per encoding in :data:`ENCODINGS` (ALiBi, the
   sinusoidal code ``absolute``, RoPE, KERPLE's log variant) and seed in :data:`SEEDS`. The seed fixes the
   initialisation, the data order and the batches; the encodings of one seed see the same data.
2. **Evaluation at 64, 128, 256 and 512 tokens**, the protocol of the ALiBi paper
   (non-overlapping windows): the validation stream is cut into every chunk of 512 tokens, and at
   length ``n`` each chunk into ``512 / n`` windows of ``n`` tokens, so every length scores the
   same tokens; only how much context each token gets, and at which positions, differs.
   The result per length: the mean next-token loss (nats per byte) over all its tokens, and the
   **loss per position bucket** (positions 0-63, 64-127, 128-255, 256-511 inside the window; a
   bucket past the window's end is None), and the same buckets by the token's place in the
   *chunk* (``chunk_buckets``): the same tokens at every length, so two lengths' chunk buckets
   compare one text read with more or less context (what notebook 06's claims about context use).

Because the models are causal, the loss at position ``p`` depends only on the ``p + 1`` tokens up
to it: position 70 of a window of 512 gets exactly what position 70 of a window of 128 starting at
the same token gets. So the buckets say *where* a model breaks, and the whole-window loss mixes
the buckets in proportion to their size.

Results go to ``<out>/results.json`` (every run, and the mean, standard deviation, minimum and
maximum over seeds); the seed-0 weights of each encoding to ``<out>/<encoding>_seed0.pt`` (about
0.5 MB each), so the notebook can re-run a piece of the evaluation live
(:func:`load_model`, :func:`live_check`).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.compare.presets import PRESETS
from course_lib.data import corpus_source, train_val_split
from course_lib.evaluate import spread_windows
from course_lib.model import MiniBert
from course_lib.teaching.notebook import REPO_ROOT
from course_lib.teaching.verdict_margins import Verdict
from course_lib.train import TrainConfig, train_model

__all__ = [
    "BUCKETS",
    "DEFAULT_OUT",
    "ENCODINGS",
    "LENGTHS",
    "LIVE_CHUNKS",
    "LIVE_DIGITS",
    "SEEDS",
    "VERDICTS",
    "TRAIN_LEN",
    "bucket_means",
    "eval_chunks",
    "evaluate_lengths",
    "live_check",
    "learned_values",
    "load_model",
    "main",
    "model_config",
    "position_losses",
    "run_experiment",
    "summarise",
    "train_config",
    "window_losses",
]

TRAIN_LEN = 64
LENGTHS = (64, 128, 256, 512)
BUCKETS = ((0, 64), (64, 128), (128, 256), (256, 512))
#: the experiment's arms: those of the ALiBi paper's Figure 1, plus KERPLE (its log variant, the
#: module's default), the learned penalty of the same chapter (not a list of the course's
#: encodings: those are course_lib.encodings.REGISTRY)
ENCODINGS = ("alibi", "absolute", "rope", "kerple")
#: five seeds: the course's claims over seeds are paired t intervals (SeedClaims), which need
#: at least five where a claim compares arms
SEEDS = (0, 1, 2, 3, 4)
LIVE_CHUNKS = 8  # chunks of 512 tokens the notebook re-scores live
LIVE_DIGITS = 2  # decimals of the live losses the notebook prints
PREFIX = 128  # the live cell compares the first PREFIX losses of a window of 512 with a window
PREFIX_CHUNKS = 2  # ... of PREFIX, on this many chunks
DEFAULT_OUT = REPO_ROOT / "figures" / "06_score_biases"
PRESET = "cpu"


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def train_config(seed: int, steps: int | None = None) -> TrainConfig:
    """The ``cpu`` preset's causal training budget with ``seed`` (and ``steps``, for tests).

    Validation runs once, after the last step (the preset validates every 25 steps for its
    curves; that costs time and changes nothing in training).
    """
    config = PRESETS[PRESET].train_config("clm")
    if config.seq_len != TRAIN_LEN:
        raise ValueError(f"the {PRESET} preset trains at {config.seq_len}, expected {TRAIN_LEN}")
    steps = config.steps if steps is None else steps
    return replace(
        config,
        seed=seed,
        steps=steps,
        warmup_steps=min(config.warmup_steps, steps - 1),
        eval_every=steps,
        checkpoint_every=steps,
    )


def model_config(encoding: str):
    """The ``cpu`` preset's causal model of ``encoding`` (a :class:`BertConfig`)."""
    return PRESETS[PRESET].model_config(encoding, "clm")


# ---------------------------------------------------------------------------------------------
# Evaluation pieces
# ---------------------------------------------------------------------------------------------


def eval_chunks(
    val_tokens: torch.Tensor, length: int = max(LENGTHS), max_chunks: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs [W, length], next tokens [W, length])``: the non-overlapping chunks of
    ``length`` tokens of the validation stream (all of them, or ``max_chunks`` spread evenly)."""
    return spread_windows(val_tokens, length, max_chunks)


@torch.no_grad()
def position_losses(
    model: MiniBert, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 8
) -> torch.Tensor:
    """Next-token cross-entropy ``[W, n]`` (nats) of a causal model on ``inputs [W, n]`` whose
    next tokens are ``targets [W, n]``: one forward pass per batch of windows, eval mode."""
    if inputs.shape != targets.shape or inputs.dim() != 2:
        raise ValueError(
            f"inputs and targets must both be [windows, n], got {tuple(inputs.shape)} and "
            f"{tuple(targets.shape)}"
        )
    was_training = model.training
    model.eval()
    parts = []
    for start in range(0, inputs.shape[0], batch_size):
        logits = model(inputs[start : start + batch_size]).logits.float()  # [b, n, vocab]
        parts.append(
            F.cross_entropy(
                logits.transpose(1, 2), targets[start : start + batch_size], reduction="none"
            )
        )
    model.train(was_training)
    return torch.cat(parts)


def window_losses(
    model: MiniBert,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    length: int,
    batch_tokens: int = 4096,
) -> torch.Tensor:
    """Per-position losses ``[W * C / length, length]`` at window length ``length``: each chunk of
    ``inputs [W, C]`` is cut into ``C / length`` windows, scored independently."""
    chunk = inputs.shape[1]
    if length < 1 or chunk % length:
        raise ValueError(f"length {length} must divide the chunk length {chunk}")
    return position_losses(
        model,
        inputs.reshape(-1, length),
        targets.reshape(-1, length),
        batch_size=max(1, batch_tokens // length),
    )


def bucket_means(
    losses: torch.Tensor, buckets: tuple[tuple[int, int], ...] = BUCKETS
) -> list[float | None]:
    """Mean of ``losses [windows, n]`` over each bucket ``[start, end)`` of positions.

    A bucket that starts at or past ``n`` gives None; a bucket cut by ``n`` covers the positions
    below ``n``.
    """
    if losses.dim() != 2 or losses.shape[1] == 0:
        raise ValueError(f"losses must be [windows, n] with n > 0, got {tuple(losses.shape)}")
    n = losses.shape[1]
    out: list[float | None] = []
    for start, end in buckets:
        if not 0 <= start < end:
            raise ValueError(f"a bucket is [start, end) with 0 <= start < end, got {(start, end)}")
        out.append(None if start >= n else float(losses[:, start : min(end, n)].double().mean()))
    return out


def evaluate_lengths(
    model: MiniBert,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    lengths: tuple[int, ...] = LENGTHS,
) -> dict:
    """``{str(n): {"loss": mean over every token, "buckets": bucket_means, "chunk_buckets": ...,
    "tokens": count}}`` for each window length ``n``, on the chunks ``inputs``/``targets``
    ``[W, max(lengths)]``; plus ``"position_curve"``: the mean loss at each position 0..max-1 of
    the longest windows.

    ``"buckets"`` groups the tokens by their position *inside the window of n*; ``"chunk_buckets"``
    by their position *inside the chunk*, whatever the window: bucket ``b`` then holds the same
    tokens at every length, so the chunk buckets of two lengths compare the same text read with
    more or less context (at 64 a token at chunk position 300 sees the 44 tokens before it in
    its window; at 512, all 300).
    """
    out: dict = {}
    chunk = inputs.shape[1]
    for length in lengths:
        losses = window_losses(model, inputs, targets, length)
        out[str(length)] = {
            "loss": float(losses.double().mean()),
            "buckets": bucket_means(losses),
            "chunk_buckets": bucket_means(losses.reshape(-1, chunk)),
            "tokens": int(losses.numel()),
        }
        if length == max(lengths):
            out["position_curve"] = [round(float(x), 5) for x in losses.double().mean(0)]
    return out


# ---------------------------------------------------------------------------------------------
# Runs and their summary
# ---------------------------------------------------------------------------------------------


def train_one(
    encoding: str, seed: int, train: torch.Tensor, val: torch.Tensor, steps: int | None = None
) -> tuple[MiniBert, float]:
    """A causal model of ``encoding`` trained with :func:`train_config` (``seed``); also the
    training time in seconds. The initialisation is seeded by ``seed`` too."""
    config = train_config(seed, steps)
    torch.manual_seed(seed)
    model = MiniBert(model_config(encoding))
    started = time.perf_counter()
    train_model(model, train, val, config, progress=False)
    model.eval()
    return model, time.perf_counter() - started


def learned_values(model: MiniBert) -> list[dict]:
    """Per layer, the numbers a layer's position encoding reports (``reported_values``, e.g.
    KERPLE's ``r1`` and ``r2`` per head); an empty list for an encoding that reports none."""
    out = []
    for layer in model.layers:
        values = layer.attention.reported_values()
        if values:
            out.append({k: [round(float(x), 5) for x in v] for k, v in values.items()})
    return out


def _spread(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarise(runs: list[dict], lengths: tuple[int, ...] = LENGTHS) -> dict:
    """Per encoding: for each length, the spread over seeds (:func:`_spread`: mean, sample
    standard deviation, min, max, n) of the whole-window loss and of each bucket's loss, and the
    mean position curve."""
    summary: dict = {}
    for encoding in dict.fromkeys(run["encoding"] for run in runs):
        mine = [run for run in runs if run["encoding"] == encoding]
        entry: dict = {"seeds": [run["seed"] for run in mine]}
        for length in lengths:
            key = str(length)
            buckets = []
            for b in range(len(mine[0]["lengths"][key]["buckets"])):
                values = [run["lengths"][key]["buckets"][b] for run in mine]
                buckets.append(None if values[0] is None else _spread(values))
            entry[key] = {
                "loss": _spread([run["lengths"][key]["loss"] for run in mine]),
                "buckets": buckets,
            }
        curves = torch.tensor(
            [run["lengths"]["position_curve"] for run in mine], dtype=torch.float64
        )
        entry["position_curve"] = [round(float(x), 5) for x in curves.mean(0)]
        summary[encoding] = entry
    return summary


@torch.no_grad()
def live_check(model: MiniBert, val_tokens: torch.Tensor, chunks: int = LIVE_CHUNKS) -> dict:
    """The loss at each length on the first ``chunks`` chunks of 512 tokens (a few seconds):
    what the notebook recomputes from the saved seed-0 weights and compares with the file."""
    inputs, targets = eval_chunks(val_tokens)
    result = evaluate_lengths(model, inputs[:chunks], targets[:chunks])
    return {key: result[key]["loss"] for key in map(str, LENGTHS)}


@torch.no_grad()
def live_values(seed: int = 0, out_dir: str | Path = DEFAULT_OUT) -> dict[str, float]:
    """What notebook 06's live cell computes, as numbers (for
    :mod:`course_lib.teaching.verdict_margins`, which runs it under every CPU kernel setting):
    per encoding, the live loss at each length from the committed seed-0 weights
    (``<encoding>_live<n>``), its distance from the value in ``results.json``
    (``<encoding>_file_gap``, the largest over the lengths), and the largest difference between
    the first :data:`PREFIX` losses of a window of 512 and a window of :data:`PREFIX` starting at
    the same token (``<encoding>_prefix_gap``). Only ``seed`` 0 has committed weights."""
    if seed != 0:
        raise ValueError(f"only the seed-0 weights are committed, got seed {seed}")
    out_dir = Path(out_dir)
    results = json.loads((out_dir / "results.json").read_text())
    _, val = train_val_split()
    inputs, targets = eval_chunks(val)
    values: dict[str, float] = {}
    for encoding in results["encodings"]:
        model = load_model(out_dir, encoding)
        live = live_check(model, val, results["live_chunks"])
        saved = next(
            run["live_check"]
            for run in results["runs"]
            if run["encoding"] == encoding and run["seed"] == results["seeds"][0]
        )
        for key, value in live.items():
            values[f"{encoding}_live{key}"] = value
        values[f"{encoding}_file_gap"] = max(abs(live[k] - saved[k]) for k in saved)
        long = position_losses(model, inputs[:PREFIX_CHUNKS], targets[:PREFIX_CHUNKS])
        short = position_losses(
            model, inputs[:PREFIX_CHUNKS, :PREFIX], targets[:PREFIX_CHUNKS, :PREFIX]
        )
        values[f"{encoding}_prefix_gap"] = float((long[:, :PREFIX] - short).abs().max())
    return values


def _largest(suffix: str):
    def reduce(per_seed) -> float:
        return max(v for seed in per_seed.values() for k, v in seed.items() if k.endswith(suffix))

    return reduce


#: the live cell's verdicts (``python -m course_lib.teaching.verdict_margins
#: course_lib.teaching.score_bias_experiment:live_values --seeds 0 --out
#: figures/06_verdict_margins.json`` measures their margins; the printed losses' distances to a
#: rounding boundary are checked by ``tests/test_verdict_margins.py``)
VERDICTS = (
    Verdict("the live losses match the file to 1e-3", _largest("_file_gap"), 1e-3, False),
    Verdict(
        "the first 128 losses of a window of 512 equal a window of 128 to 1e-4",
        _largest("_prefix_gap"),
        1e-4,
        False,
        resolution=1e-6,  # float32's rounding of a mean loss of a few nats (5e-7 at 4)
    ),
)


def load_model(out_dir: str | Path, encoding: str) -> MiniBert:
    """The seed-0 model of ``encoding`` saved by :func:`run_experiment`, in eval mode."""
    model = MiniBert(model_config(encoding))
    state = torch.load(
        Path(out_dir) / f"{encoding}_seed0.pt", map_location="cpu", weights_only=True
    )
    model.load_state_dict(state)
    return model.eval()


def run_experiment(
    out_dir: str | Path = DEFAULT_OUT,
    *,
    encodings: tuple[str, ...] = ENCODINGS,
    seeds: tuple[int, ...] = SEEDS,
    steps: int | None = None,
    max_chunks: int | None = None,
    progress: bool = True,
    command: str = "python -m course_lib.teaching.score_bias_experiment",
) -> dict:
    """Train and evaluate every (encoding, seed); write ``results.json`` and the seed-0 weights
    to ``out_dir``; return what was written. ``steps`` and ``max_chunks`` shrink it for tests."""
    from tqdm.auto import tqdm

    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = train_val_split()
    inputs, targets = eval_chunks(val, max(LENGTHS), max_chunks)
    started = time.perf_counter()
    runs = []
    jobs = [(seed, encoding) for seed in seeds for encoding in encodings]
    bar = tqdm(jobs, desc="score-bias runs", disable=not progress)
    for seed, encoding in bar:
        bar.set_postfix(encoding=encoding, seed=seed)
        model, seconds = train_one(encoding, seed, train, val, steps)
        run = {
            "encoding": encoding,
            "seed": seed,
            "train_seconds": round(seconds, 1),
            "parameters": sum(p.numel() for p in model.parameters()),
            "lengths": evaluate_lengths(model, inputs, targets),
        }
        learned = learned_values(model)
        if learned:
            run["learned"] = learned
        if seed == seeds[0]:
            torch.save(model.state_dict(), out_dir / f"{encoding}_seed0.pt")
            run["live_check"] = live_check(model, val, min(LIVE_CHUNKS, inputs.shape[0]))
        runs.append(run)
    config = train_config(seeds[0], steps)
    results = {
        "command": command,
        "preset": PRESET,
        "train_len": TRAIN_LEN,
        "lengths": list(LENGTHS),
        "buckets": [list(b) for b in BUCKETS],
        "encodings": list(encodings),
        "seeds": list(seeds),
        "steps": config.steps,
        "batch_size": config.batch_size,
        "model": {
            key: value
            for key, value in model_config(encodings[0]).to_dict().items()
            if key in ("hidden_size", "num_layers", "num_heads", "objective")
        },
        "corpus": corpus_source(),
        "eval_chunks": int(inputs.shape[0]),
        "eval_tokens_per_length": int(inputs.numel()),
        "live_chunks": min(LIVE_CHUNKS, int(inputs.shape[0])),
        "unit": "nats per byte (next-token cross-entropy)",
        "runs": runs,
        "summary": summarise(runs),
        "total_seconds": round(time.perf_counter() - started, 1),
        "hardware": {
            "machine": platform.machine(),
            "processor": platform.processor() or "unknown",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--encodings", nargs="+", default=list(ENCODINGS))
    args = parser.parse_args(argv)
    results = run_experiment(args.out, encodings=tuple(args.encodings), seeds=tuple(args.seeds))
    print(f"wrote {Path(args.out) / 'results.json'} in {results['total_seconds']} s")
    for encoding, entry in results["summary"].items():
        cells = []
        for length in LENGTHS:
            loss = entry[str(length)]["loss"]
            cells.append(f"{length}: {loss['mean']:.3f} ± {loss['std']:.3f}")
        print(f"{encoding:>9}  " + "  ".join(cells))
    if not all(
        math.isfinite(r["lengths"][str(n)]["loss"]) for r in results["runs"] for n in LENGTHS
    ):
        raise SystemExit("a loss is not finite")


if __name__ == "__main__":
    main()
