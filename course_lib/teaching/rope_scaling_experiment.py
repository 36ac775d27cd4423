"""Notebook 07's experiment: RoPE trained at 64 tokens, read at 128, 256 and 512.

    python -m course_lib.teaching.rope_scaling_experiment [--out figures/07_rope_scaling]
        [--seeds 0 1 2 3 4]

What it does for each seed, seeded from start to end (one torch thread, about ten minutes per
seed on an idle CPU core):

1. **Pretraining.** Three causal models with the recipe of the comparison's ``cpu`` preset
   (:data:`course_lib.compare.PRESETS`: hidden 64, 2 layers, 4 heads of 16, 300 steps of batch 16
   at length ``L = 64``): RoPE, ALiBi and stick-breaking (``rse``). The seed sets the models'
   initialisation and the data order (the comparison's seeding), the same for the three.
2. **Zero-shot.** Each model reads held-out windows of ``n`` tokens, ``n`` in 128, 256, 512.
   The RoPE model reads them plain and with each scaling of
   :func:`course_lib.encodings.rope_frequencies` at ``s = n / L`` (position interpolation,
   NTK-aware, YaRN); dynamic NTK (factor 1, so its effective factor is ``max(1, m / L)`` at the
   current length ``m``) is evaluated as a decoder sees it: token by token with a key/value cache,
   each token scored with the frequencies of its own prefix length.
3. **Short fine-tune at n.** A copy of each pretrained model trains ``FINETUNE_STEPS`` steps on
   windows of ``n`` tokens (the same number of tokens per step at every ``n``) with its scaling
   on (the protocol of the position-interpolation and YaRN papers, scaled down), then reads the
   windows of ``n`` tokens.
4. **Loss per position bucket** (0-63, 64-127, 128-255, 256-511): mean next-token loss (nats per
   byte) over the windows, by the position that predicts. Every length reads the first ``n``
   tokens of the same held-out chunks of 512 tokens, so a bucket covers the same text at every
   length.
5. **The same tokens with a short context.** Buckets at different positions hold different
   text, so a bucket that is lower further out may only hold easier text. Each pretrained model
   also reads every token of the chunks with only the ``L = 64`` tokens up to it (a sliding
   window: the context length of training), ``windowed`` below. Full context minus windowed, on
   the same tokens, is what the context beyond ``L`` is worth to a model.
6. **Retrieval at far positions.** The positional-retrieval probe of the comparison
   (:func:`course_lib.data.retrieval_probe`: 8 symbols, ``@p?``, the answer; 12 tokens) is
   learned by a seeded fine-tune of a copy of each pretrained model (the comparison's ``cpu``
   budget), then scored with its tokens at positions ``n - 12 .. n - 1``, as if it ended a
   window of ``n`` tokens, with each scaling for ``n``. After the length fine-tune at 512, the
   same probe fine-tune is repeated (scaling on) and scored at 512.

Results go to ``<out>/results.json`` (one entry per seed in ``runs``); the pretrained RoPE
model of the first seed to ``<out>/rope_base.pt`` (about 0.5 MB), so notebook 07 can re-run
pieces live. Each seed is independent of the others, so ``--seeds`` may split them over
processes and ``--merge`` joins their results files.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib.compare.presets import PRESETS
from course_lib.data import ProbeBatch, corpus_source, retrieval_probe, train_val_split
from course_lib.encodings import check_rope_scaling
from course_lib.evaluate import evaluate_loss, probe_inputs
from course_lib.model import MiniBert
from course_lib.teaching.notebook import REPO_ROOT
from course_lib.train import TrainConfig, learning_rate_at, make_optimizer, train_model

__all__ = [
    "TRAIN_LEN",
    "LENGTHS",
    "BUCKETS",
    "SCALINGS",
    "ENCODINGS",
    "FINETUNE_STEPS",
    "EVAL_CHUNKS",
    "DEFAULT_OUT",
    "ProbeSetup",
    "scaling_for",
    "set_scaling",
    "bucket_means",
    "position_losses",
    "windowed_position_losses",
    "dynamic_position_losses",
    "eval_chunks",
    "retrieval_accuracy",
    "finetune_probe",
    "pretrain",
    "finetune_length",
    "run_seed",
    "run_experiment",
    "merge_results",
    "seed_runs",
    "main",
]

TRAIN_LEN = 64
LENGTHS = (128, 256, 512)
BUCKETS = ((0, 64), (64, 128), (128, 256), (256, 512))
#: the RoPE variants: no scaling, then the four fixes (rope_type of the scaling dict)
SCALINGS = ("plain", "linear", "ntk", "dynamic", "yarn")
#: the scalings that are also fine-tuned (dynamic NTK is an inference-time rule)
FINETUNED_SCALINGS = ("plain", "linear", "ntk", "yarn")
#: the experiment's arms: RoPE with each fix, beside two encodings built to extrapolate
#: (not a list of the course's encodings: those are course_lib.encodings.REGISTRY)
ENCODINGS = ("rope", "alibi", "rse")
FINETUNE_STEPS = 50
EVAL_CHUNKS = 48
SEEDS = (0, 1, 2, 3, 4)
FINETUNE_TOKENS_PER_STEP = 2048
FINETUNE_LR = 1e-3
DEFAULT_OUT = REPO_ROOT / "figures" / "07_rope_scaling"


@dataclass(frozen=True)
class ProbeSetup:
    """The retrieval probe and its fine-tune (the comparison's ``cpu`` preset values)."""

    context_len: int = 8
    train_examples: int = 2048
    eval_examples: int = 512
    steps: int = 800
    batch_size: int = 32
    learning_rate: float = 1e-3
    train_seed: int = 101
    eval_seed: int = 202

    def make(self, split: str) -> ProbeBatch:
        """The probe examples of ``split`` (``"train"`` or ``"eval"``), fixed by their seed."""
        if split == "train":
            return retrieval_probe(self.train_examples, self.context_len, self.train_seed)
        if split == "eval":
            return retrieval_probe(self.eval_examples, self.context_len, self.eval_seed)
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


# ---------------------------------------------------------------------------------------------
# The pieces (unit-tested in tests/test_rope_scaling_experiment.py)
# ---------------------------------------------------------------------------------------------


def scaling_for(kind: str, length: int, train_len: int = TRAIN_LEN) -> dict | None:
    """The scaling dict of ``kind`` for reading ``length`` tokens after training at ``train_len``.

    ``plain``: None. ``linear``, ``ntk``, ``yarn``: ``factor = length / train_len`` (at least 1).
    ``dynamic``: factor 1 whatever ``length``: the rule then follows the current length ``m`` by
    itself, with effective factor ``max(1, m / train_len)``.
    """
    if kind == "plain":
        return None
    factor = 1.0 if kind == "dynamic" else max(1.0, length / train_len)
    return check_rope_scaling(
        {"rope_type": kind, "factor": factor, "original_max_position_embeddings": train_len}
    )


def set_scaling(model: MiniBert, scaling: dict | None) -> None:
    """Set the RoPE scaling of every attention layer of ``model`` (a RoPE model only)."""
    if model.config.encoding != "rope":
        raise ValueError(f"only a RoPE model takes a scaling, got {model.config.encoding!r}")
    scaling = check_rope_scaling(scaling)
    for layer in model.layers:
        layer.attention.scaling = scaling


def bucket_means(
    losses: torch.Tensor, buckets: tuple[tuple[int, int], ...] = BUCKETS
) -> list[float | None]:
    """Mean of ``losses`` over each bucket ``[start, end)`` of positions.

    ``losses``: ``[windows, n]`` (every entry counts once) or ``[n]`` (per-position means of
    windows of equal count). A bucket that starts at or past ``n`` gives None; one cut by ``n``
    covers the positions below ``n``.
    """
    if losses.dim() not in (1, 2) or losses.shape[-1] == 0:
        raise ValueError(
            f"losses must be [n] or [windows, n] with n > 0, got {tuple(losses.shape)}"
        )
    n = losses.shape[-1]
    out: list[float | None] = []
    for start, end in buckets:
        if not 0 <= start < end:
            raise ValueError(f"a bucket is [start, end) with 0 <= start < end, got {(start, end)}")
        out.append(None if start >= n else float(losses[..., start : min(end, n)].double().mean()))
    return out


@torch.no_grad()
def position_losses(
    model: MiniBert, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 16
) -> torch.Tensor:
    """Next-token cross-entropy ``[windows, n]`` (nats) of a causal model on ``inputs [W, n]``
    whose next tokens are ``targets [W, n]``: one full forward pass per batch of windows."""
    was_training = model.training
    model.eval()
    parts = []
    for start in range(0, inputs.shape[0], batch_size):
        logits = model(inputs[start : start + batch_size]).logits.float()
        parts.append(
            F.cross_entropy(
                logits.transpose(1, 2), targets[start : start + batch_size], reduction="none"
            )
        )
    model.train(was_training)
    return torch.cat(parts)


@torch.no_grad()
def windowed_position_losses(
    model: MiniBert,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    window: int = TRAIN_LEN,
    batch_size: int = 256,
) -> torch.Tensor:
    """Next-token cross-entropy ``[W, n]`` of a causal model when every token is read with at
    most ``window`` tokens of context: the token at position ``p`` and the ``window - 1`` tokens
    before it (all of them when ``p < window``). Positions ``< window`` come from one pass over
    the first ``window`` tokens; each later position from its own window ``p - window + 1 .. p``
    (its last logits). The same tokens as :func:`position_losses`, a shorter context."""
    n = inputs.shape[1]
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    head = position_losses(model, inputs[:, :window], targets[:, :window])  # [W, min(n, window)]
    if n <= window:
        return head
    windows = inputs.unfold(1, window, 1)[:, 1:]  # [W, n - window, window]: ends at window..n-1
    flat = windows.reshape(-1, window)
    was_training = model.training
    model.eval()
    last = []
    for start in range(0, flat.shape[0], batch_size):
        last.append(model(flat[start : start + batch_size]).logits[:, -1].float())
    model.train(was_training)
    logits = torch.cat(last).view(inputs.shape[0], n - window, -1)
    tail = F.cross_entropy(logits.transpose(1, 2), targets[:, window:], reduction="none")
    return torch.cat((head, tail), dim=1)


@torch.no_grad()
def dynamic_position_losses(
    model: MiniBert, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Like :func:`position_losses`, but decoding token by token with a key/value cache.

    Each step feeds one token at position ``m - 1`` (``m`` tokens so far); the cache holds keys
    before rotation, so with dynamic scaling every step rotates every key with the frequencies of
    the current length ``m``: the token at ``m - 1`` is scored as a decoder would score it.
    """
    was_training = model.training
    model.eval()
    cache = model.new_cache()
    out = []
    for t in range(inputs.shape[1]):
        logits = model(inputs[:, t : t + 1], cache=cache).logits[:, 0].float()
        out.append(F.cross_entropy(logits, targets[:, t], reduction="none"))
    model.train(was_training)
    return torch.stack(out, dim=1)


def eval_chunks(
    val_tokens: torch.Tensor, length: int = max(LENGTHS), count: int | None = EVAL_CHUNKS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` non-overlapping chunks of ``length`` tokens of ``val_tokens``, evenly spread
    over the stream (all of them when ``count`` is None), and their next tokens: ``[W, length]``
    each. A shorter length reads the first tokens of the same chunks."""
    available = (val_tokens.shape[0] - 1) // length
    if available < 1:
        raise ValueError(f"{val_tokens.shape[0]} tokens hold no chunk of {length} + 1 tokens")
    picks = torch.arange(available)
    if count is not None and count < available:
        picks = torch.linspace(0, available - 1, count).round().long()
    starts = picks * length
    index = starts[:, None] + torch.arange(length)[None, :]
    return val_tokens[index].long(), val_tokens[index + 1].long()


def retrieval_accuracy(model: MiniBert, probe: ProbeBatch, length: int) -> float:
    """Accuracy of a causal ``model`` on the retrieval ``probe`` placed at the end of a window of
    ``length`` tokens: its ``T`` tokens take positions ``length - T .. length - 1`` (the model
    reads ``T - 1`` of them, the last is the answer), as if ``length - T`` tokens came before.

    A relative encoding (plain RoPE, ALiBi, rse) gives exactly the accuracy of ``length = T``;
    a RoPE scaling for ``length`` changes the angles between the probe's tokens.
    """
    inputs, _, score_index = probe_inputs(probe, "clm")
    offset = length - probe.input_ids.shape[1]
    if offset < 0:
        raise ValueError(
            f"length {length} is shorter than the probe ({probe.input_ids.shape[1]} tokens)"
        )
    positions = torch.arange(inputs.shape[1]) + offset
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(inputs, position_ids=positions).logits
    model.train(was_training)
    scored = logits[torch.arange(len(probe)), score_index].float()
    return float((probe.choose(scored) == probe.answer_id).float().mean())


def finetune_probe(model: MiniBert, probe: ProbeBatch, setup: ProbeSetup) -> MiniBert:
    """A copy of ``model`` fine-tuned on ``probe``: AdamW, warm-up then cosine, clipping 1,
    ``setup.steps`` steps of ``setup.batch_size`` examples (seeded), loss = cross-entropy of the
    answer among the candidates at the position that predicts it (the comparison's protocol,
    :func:`course_lib.train.probe_finetune`, which keeps only the accuracy)."""
    tuned = copy.deepcopy(model)
    tuned.train()
    optimizer = make_optimizer(tuned, setup.learning_rate, 0.0)
    inputs, _, score_index = probe_inputs(probe, "clm")
    target = (probe.candidate_ids == probe.answer_id[:, None]).float().argmax(dim=1)
    generator = torch.Generator().manual_seed(setup.train_seed)
    warmup = max(1, setup.steps // 20)
    for step in range(setup.steps):
        lr = learning_rate_at(step, setup.steps, setup.learning_rate, warmup, 0.1)
        for group in optimizer.param_groups:
            group["lr"] = lr
        index = torch.randint(0, len(probe), (setup.batch_size,), generator=generator)
        logits = tuned(inputs[index]).logits
        scored = logits[torch.arange(len(index)), score_index[index]].float()
        scored = scored.gather(1, probe.candidate_ids[index])
        loss = F.cross_entropy(scored, target[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tuned.parameters(), 1.0)
        optimizer.step()
    tuned.eval()
    return tuned


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def pretrain(
    encoding: str, train: torch.Tensor, val: torch.Tensor, seed: int = 0
) -> tuple[MiniBert, dict]:
    """The comparison's ``cpu`` recipe for a causal model of ``encoding`` (seeded as the
    comparison seeds it: ``seed`` sets the initialisation and the data order), and its
    validation loss at ``TRAIN_LEN`` on 128 windows."""
    preset = PRESETS["cpu"]
    config = preset.train_config("clm", seed=seed)
    torch.manual_seed(config.seed)
    model = MiniBert(preset.model_config(encoding, "clm"))
    started = time.perf_counter()
    train_model(model, train, val, config, progress=False)
    seconds = time.perf_counter() - started
    loss, _ = evaluate_loss(model, val, TRAIN_LEN, max_windows=config.eval_windows)
    model.eval()
    return model, {"val_loss_64": loss, "train_seconds": seconds}


def finetune_length(
    model: MiniBert,
    scaling: dict | None,
    length: int,
    train: torch.Tensor,
    val: torch.Tensor,
    seed: int = 0,
) -> MiniBert:
    """A copy of ``model`` trained ``FINETUNE_STEPS`` steps on windows of ``length`` tokens with
    ``scaling`` on (RoPE only), ``FINETUNE_TOKENS_PER_STEP`` tokens per step, peak learning
    rate ``FINETUNE_LR`` (warm-up 5 steps, cosine to a tenth); its data order is seeded by
    ``seed + 1``."""
    tuned = copy.deepcopy(model)
    if tuned.config.encoding == "rope":
        set_scaling(tuned, scaling)
    config = TrainConfig(
        steps=FINETUNE_STEPS,
        batch_size=FINETUNE_TOKENS_PER_STEP // length,
        seq_len=length,
        learning_rate=FINETUNE_LR,
        warmup_steps=5,
        eval_every=FINETUNE_STEPS,
        eval_windows=2,
        checkpoint_every=FINETUNE_STEPS,
        seed=seed + 1,
    )
    train_model(tuned, train, val, config, progress=False)
    tuned.eval()
    return tuned


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _entry(losses: torch.Tensor, length: int, keep_curve: bool) -> dict:
    losses = losses[:, :length]
    entry = {"buckets": bucket_means(losses), "mean": float(losses.double().mean())}
    if keep_curve:
        entry["per_position"] = [round(float(x), 5) for x in losses.double().mean(dim=0)]
    return entry


def _name(encoding: str, kind: str) -> str:
    return kind if encoding == "rope" else encoding


def run_seed(
    seed: int,
    train: torch.Tensor,
    val: torch.Tensor,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    bar=None,
    save_rope_to: Path | None = None,
) -> dict:
    """Every step of the module docstring for one ``seed``: ``{"seed", "base", "zero_shot",
    "finetuned", "windowed", "seconds"}``. ``inputs``/``targets`` ``[W, 512]``: the held-out
    chunks. ``save_rope_to``: where to save the pretrained RoPE model's weights (or None)."""
    started = time.perf_counter()
    setup = ProbeSetup()
    variants = [("rope", k) for k in SCALINGS] + [(e, "plain") for e in ENCODINGS[1:]]
    tuned_variants = [("rope", k) for k in FINETUNED_SCALINGS] + [
        (e, "plain") for e in ENCODINGS[1:]
    ]
    seconds: dict[str, float] = {}

    def step(text: str) -> None:
        if bar is not None:
            bar.set_postfix_str(f"seed {seed}: {text}")

    def done() -> None:
        if bar is not None:
            bar.update(1)

    train_probe, eval_probe = setup.make("train"), setup.make("eval")

    # 1. pretraining, and the probe fine-tune at the training length
    base, base_info, probed = {}, {}, {}
    for encoding in ENCODINGS:
        step(f"pretrain {encoding}")
        base[encoding], base_info[encoding] = pretrain(encoding, train, val, seed)
        done()
        step(f"probe {encoding}")
        clock = time.perf_counter()
        probed[encoding] = finetune_probe(base[encoding], train_probe, setup)
        base_info[encoding]["probe_seconds"] = time.perf_counter() - clock
        base_info[encoding]["retrieval_64"] = retrieval_accuracy(
            probed[encoding], eval_probe, TRAIN_LEN
        )
        done()
    if save_rope_to is not None:
        torch.save(base["rope"].state_dict(), save_rope_to)
    seconds["pretraining_and_probe"] = time.perf_counter() - started

    # 2. zero-shot
    clock = time.perf_counter()
    zero_shot = []
    for encoding, kind in variants:
        step(f"zero-shot {_name(encoding, kind)}")
        model, tuned = base[encoding], probed[encoding]
        static_losses = None
        for length in LENGTHS:
            scaling = scaling_for(kind, length) if encoding == "rope" else None
            if encoding == "rope":
                set_scaling(model, scaling)
                set_scaling(tuned, scaling)
            if kind == "dynamic":  # the rule follows the current length: one decode serves all n
                if static_losses is None:
                    static_losses = dynamic_position_losses(model, inputs, targets)
                losses = static_losses
            elif kind == "plain":  # causal and unscaled: the first n positions of the 512 pass
                if static_losses is None:
                    static_losses = position_losses(model, inputs, targets)
                losses = static_losses
            else:
                losses = position_losses(model, inputs[:, :length], targets[:, :length])
            entry = {"model": _name(encoding, kind), "encoding": encoding, "scaling": scaling,
                     "length": length, **_entry(losses, length, length == max(LENGTHS))}  # fmt: skip
            entry["retrieval"] = retrieval_accuracy(tuned, eval_probe, length)
            zero_shot.append(entry)
        if encoding == "rope":
            set_scaling(model, None)
            set_scaling(tuned, None)
        done()
    seconds["zero_shot"] = time.perf_counter() - clock

    # 3. the same tokens, each read with the TRAIN_LEN tokens up to it
    clock = time.perf_counter()
    windowed = []
    for encoding in ENCODINGS:
        step(f"windowed {encoding}")
        losses = windowed_position_losses(base[encoding], inputs, targets, TRAIN_LEN)
        windowed.append({"model": _name(encoding, "plain"), "encoding": encoding,
                         "window": TRAIN_LEN, "length": max(LENGTHS),
                         **_entry(losses, max(LENGTHS), True)})  # fmt: skip
        done()
    seconds["windowed"] = time.perf_counter() - clock

    # 4. short fine-tune at each length
    clock = time.perf_counter()
    finetuned = []
    for length in LENGTHS:
        for encoding, kind in tuned_variants:
            step(f"fine-tune {_name(encoding, kind)} at {length}")
            scaling = scaling_for(kind, length) if encoding == "rope" else None
            tick = time.perf_counter()
            model = finetune_length(base[encoding], scaling, length, train, val, seed)
            tune_seconds = time.perf_counter() - tick
            losses = position_losses(model, inputs[:, :length], targets[:, :length])
            entry = {"model": _name(encoding, kind), "encoding": encoding, "scaling": scaling,
                     "length": length, **_entry(losses, length, length == max(LENGTHS)),
                     "finetune_seconds": tune_seconds}  # fmt: skip
            entry["retrieval"] = None
            if length == max(LENGTHS):  # the probe fine-tune again, the scaling still on
                tuned = finetune_probe(model, train_probe, setup)
                entry["retrieval"] = retrieval_accuracy(tuned, eval_probe, length)
            finetuned.append(entry)
            done()
    seconds["finetune"] = time.perf_counter() - clock
    seconds["total"] = time.perf_counter() - started
    return {
        "seed": seed,
        "base": base_info,
        "zero_shot": zero_shot,
        "windowed": windowed,
        "finetuned": finetuned,
        "seconds": seconds,
    }


def _steps_per_seed() -> int:
    variants = len(SCALINGS) + len(ENCODINGS) - 1
    tuned = len(FINETUNED_SCALINGS) + len(ENCODINGS) - 1
    return len(ENCODINGS) * 3 + variants + len(LENGTHS) * tuned


def run_experiment(
    out_dir: Path = DEFAULT_OUT, seeds: tuple[int, ...] = SEEDS, *, progress: bool = True
) -> dict:
    """Run every seed (see the module docstring) and write ``results.json``, and the first
    seed's pretrained RoPE model as ``rope_base.pt``."""
    from tqdm.auto import tqdm

    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds!r}")
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = train_val_split()
    inputs, targets = eval_chunks(val)
    bar = tqdm(total=len(seeds) * _steps_per_seed(), desc="rope scaling", disable=not progress)
    runs = []
    for seed in seeds:
        save = out_dir / "rope_base.pt" if seed == seeds[0] else None
        runs.append(run_seed(seed, train, val, inputs, targets, bar=bar, save_rope_to=save))
    bar.close()

    preset = PRESETS["cpu"]
    results = {
        "description": (
            "RoPE, ALiBi and stick-breaking (rse) causal models trained at 64 tokens (the "
            "comparison's cpu recipe), read at 128/256/512 zero-shot with each RoPE scaling and "
            "after a short fine-tune at that length, and with a 64-token sliding window on the "
            "same tokens; loss per position bucket (nats per byte) and retrieval accuracy of a "
            "probe placed at the end of the window; one entry per seed in runs"
        ),
        "command": "python -m course_lib.teaching.rope_scaling_experiment",
        "seeds": list(seeds),
        "checkpoint_seed": seeds[0],
        "train_len": TRAIN_LEN,
        "lengths": list(LENGTHS),
        "buckets": [list(b) for b in BUCKETS],
        "model_config": preset.model_config("rope", "clm").to_dict(),
        "train_config": asdict(preset.train_config("clm")),
        "finetune": {
            "steps": FINETUNE_STEPS,
            "tokens_per_step": FINETUNE_TOKENS_PER_STEP,
            "learning_rate": FINETUNE_LR,
            "scalings": list(FINETUNED_SCALINGS),
        },
        "probe": asdict(ProbeSetup()),
        "probe_chance": 1 / 26,
        "eval_windows": int(inputs.shape[0]),
        "eval_chunk_length": int(inputs.shape[1]),
        "corpus_source": corpus_source(),
        "runs": runs,
        "hardware": {
            "cpu": platform.processor() or platform.machine(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def merge_results(parts: list[dict]) -> dict:
    """One results dict from several of :func:`run_experiment` with disjoint seeds (each seed is
    independent of the others, so this equals one run over all of them). The first part's
    checkpoint seed is kept; runs are sorted by seed."""
    if not parts:
        raise ValueError("nothing to merge: give at least one results dict")
    first = parts[0]
    for part in parts[1:]:
        for key in ("train_len", "lengths", "buckets", "model_config", "train_config",
                    "finetune", "probe", "eval_windows", "corpus_source"):  # fmt: skip
            if part[key] != first[key]:
                raise ValueError(f"cannot merge results with different {key!r}")
    runs = sorted((run for part in parts for run in part["runs"]), key=lambda r: r["seed"])
    seeds = [run["seed"] for run in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the parts share seeds ({seeds}); each seed must run once")
    return {**first, "seeds": seeds, "runs": runs}


def seed_runs(results: dict) -> list[dict]:
    """The per-seed entries of ``results``, sorted by seed."""
    return sorted(results["runs"], key=lambda r: r["seed"])


def load_results(out_dir: Path = DEFAULT_OUT) -> dict:
    """The committed ``results.json``."""
    return json.loads((Path(out_dir) / "results.json").read_text())


def load_base_model(out_dir: Path = DEFAULT_OUT) -> MiniBert:
    """The pretrained RoPE model the experiment saved (eval mode, no scaling)."""
    model = MiniBert(PRESETS["cpu"].model_config("rope", "clm"))
    state = torch.load(Path(out_dir) / "rope_base.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument(
        "--merge", nargs="+", type=Path, metavar="RESULTS",
        help="merge results.json files of runs with disjoint seeds into --out instead of training",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.merge:
        merged = merge_results([load_results(p.parent if p.is_file() else p) for p in args.merge])
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(merged, indent=1) + "\n")
        print(f"wrote {args.out / 'results.json'} (seeds {merged['seeds']})")
        return
    results = run_experiment(args.out, tuple(args.seeds))
    total = sum(run["seconds"]["total"] for run in results["runs"])
    print(f"wrote {args.out / 'results.json'} in {total:.0f} s")


if __name__ == "__main__":
    main()
