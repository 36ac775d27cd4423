"""The closing experiment: the same mini BERT trained once per encoding and objective.

``run_comparison(preset)`` (or ``python -m course_lib.compare``) trains
:class:`~course_lib.model.MiniBert` for every encoding in ``none, absolute, learned, rope, exposb,
rse`` and every objective in ``mlm, clm`` with the same seed, data, steps and optimiser
(:func:`course_lib.train.train_model`), then evaluates each model:

1. validation loss and bits per byte at the training length, and at 2x and 4x that length
   (the learned table has exactly ``seq_len`` rows, so past it the JSON says "not_applicable");
2. the word-order probe and the positional-retrieval probe of :mod:`course_lib.data`, with the
   protocol of :func:`course_lib.train.probe_finetune`: a seeded fine-tune of a copy of the
   pretrained model on probe examples (identical examples, order and budget for every encoding)
   and the accuracy of the answer among its candidates on held-out, unseen examples (a
   :class:`ProbeSpec` says which objectives a probe runs on);
3. cost: parameters by part, training tokens per second, peak memory.

Each run writes ``<out_dir>/<objective>_<encoding>.json`` (config, preset, hardware, curves,
metrics) and keeps a checkpoint in ``<checkpoint_dir>/<objective>_<encoding>.pt`` (model, optimiser,
step, RNG states; the default checkpoint folder ignores itself in git). An interrupted comparison
resumes where it stopped, mid-run too; a finished run is skipped unless ``force=True``. At the end
the figures (:mod:`course_lib.compare_figures`) and ``summary.md`` are written to ``out_dir``.

Presets (``PRESETS``; ``"auto"`` = ``gpu`` if CUDA is available, else ``cpu``):

* ``gpu``: the implementation report's model (hidden 384, 6 layers, 6 heads of 64, sequence
  256), Triton kernels, bf16 autocast; budget sized for about 15 minutes for all 12 runs on one
  H100 (an estimate: the preset has not been timed on a GPU yet).
* ``cpu``: hidden 64, 2 layers, 4 heads of 16, sequence 64, 300 clm / 600 mlm steps, reference
  attention, one thread; about 7 minutes on a 2-core CPU (retrieval probe on clm runs only).
  Its results are committed in ``figures/compare_cpu/``.
* ``tiny``: for tests and live demonstrations (seconds per run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from course_lib.attention import get_attention_class
from course_lib.data import (
    VOCAB_SIZE,
    ProbeBatch,
    corpus_source,
    retrieval_probe,
    train_val_split,
    unigram_entropy,
    word_order_probe,
)
from course_lib.model import OBJECTIVES, BertConfig, MiniBert
from course_lib.notebook import REPO_ROOT
from course_lib.train import (
    ProbeConfig,
    TrainConfig,
    extrapolation_losses,
    peak_memory,
    probe_finetune,
    train_model,
)

__all__ = [
    "ENCODINGS",
    "OBJECTIVES",
    "PRESETS",
    "FORMAT_VERSION",
    "Preset",
    "ProbeSpec",
    "choose_preset",
    "default_out_dir",
    "hardware_description",
    "retrieval_bag_baseline",
    "run_one",
    "run_comparison",
    "load_results",
    "summary_markdown",
    "main",
]

ENCODINGS = ("none", "absolute", "learned", "rope", "exposb", "rse")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: which task, how many examples (train / held-out eval, each with its own seed),
    the task's own parameters, and the fine-tuning budget."""

    task: str  # "word_order" | "retrieval"
    train_examples: int
    eval_examples: int
    finetune: ProbeConfig
    train_seed: int = 101
    eval_seed: int = 202
    context_len: int = 8  # retrieval only
    alphabet: str = "abcdefghijklmnopqrstuvwxyz"  # retrieval only
    objectives: tuple[str, ...] = OBJECTIVES  # the runs this probe is applied to

    def _generate(self, n: int, seed: int) -> ProbeBatch:
        if self.task == "word_order":
            return word_order_probe(n, seed)
        if self.task == "retrieval":
            return retrieval_probe(n, self.context_len, seed, alphabet=self.alphabet)
        raise ValueError(f"unknown probe task {self.task!r}; valid: 'word_order', 'retrieval'")

    def make(self, split: str) -> ProbeBatch:
        """The :class:`~course_lib.data.ProbeBatch` of ``split`` ("train" or "eval").

        Held-out means unseen: eval examples whose text is also a training example are dropped
        (word-order pairs go together, as both orders of a pair are in the training set too), so
        the eval set may be a little smaller than ``eval_examples``."""
        if split == "train":
            return self._generate(self.train_examples, self.train_seed)
        if split != "eval":
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        seen = set(self._generate(self.train_examples, self.train_seed).texts)
        probe = self._generate(self.eval_examples, self.eval_seed)
        keep = torch.tensor([text not in seen for text in probe.texts])
        return ProbeBatch(
            input_ids=probe.input_ids[keep],
            answer_index=probe.answer_index[keep],
            answer_len=probe.answer_len,
            answer_id=probe.answer_id[keep],
            candidate_ids=probe.candidate_ids[keep],
            target_position=probe.target_position[keep],
            texts=tuple(t for t, k in zip(probe.texts, keep.tolist(), strict=True) if k),
        )

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the candidates."""
        return 0.5 if self.task == "word_order" else 1.0 / len(self.alphabet)

    @property
    def sequence_length(self) -> int:
        """Tokens per example (all examples of a probe have the same length)."""
        sample = replace(self, train_examples=2).make("train")
        return sample.input_ids.shape[1]


@dataclass(frozen=True)
class Preset:
    """Everything that defines a comparison except the list of runs."""

    name: str
    description: str
    device: str  # "cpu" or "cuda"
    hidden_size: int
    num_layers: int
    num_heads: int
    dropout: float
    backend: str
    train: TrainConfig
    probes: tuple[ProbeSpec, ...]
    length_multiples: tuple[int, ...] = (1, 2, 4)
    eval_tokens: int = 8192  # validation tokens per length in the final evaluation
    eval_batch_size: int = 8
    cpu_threads: int | None = None  # torch.set_num_threads on CPU (None: leave as is)
    mlm_steps: int | None = None  # training steps of the mlm runs (None: train.steps)
    encodings: tuple[str, ...] = ENCODINGS
    objectives: tuple[str, ...] = OBJECTIVES

    def __post_init__(self) -> None:
        for spec in self.probes:
            if spec.sequence_length > self.train.seq_len:
                raise ValueError(
                    f"preset {self.name!r}: {spec.task} probe examples have "
                    f"{spec.sequence_length} tokens, more than the training length "
                    f"{self.train.seq_len} (the learned table would have no rows for them)"
                )

    def train_config(self, objective: str) -> TrainConfig:
        """The training budget of ``objective``'s runs (the same for every encoding)."""
        if objective == "mlm" and self.mlm_steps is not None:
            return replace(self.train, steps=self.mlm_steps)
        return self.train

    def model_config(self, encoding: str, objective: str) -> BertConfig:
        """The model of one run. ``max_position_embeddings`` is the training length, so the
        learned table really has no rows past it."""
        return BertConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            max_position_embeddings=self.train.seq_len,
            encoding=encoding,
            objective=objective,
            dropout=self.dropout,
            backend=self.backend,
        )

    def identity(self, encoding: str, objective: str) -> dict:
        """What must match for a saved checkpoint or result to count as this run (JSON types:
        tuples become lists, so it compares equal to what a results file holds)."""
        identity = {
            "format_version": FORMAT_VERSION,
            "preset": self.name,
            "model_config": self.model_config(encoding, objective).to_dict(),
            "train_config": asdict(self.train_config(objective)),
            "probes": [asdict(p) for p in self.probes],
            "length_multiples": list(self.length_multiples),
            "eval_tokens": self.eval_tokens,
        }
        return json.loads(json.dumps(identity))


def _probe_config(steps: int, batch_size: int, learning_rate: float) -> ProbeConfig:
    return ProbeConfig(
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=max(1, steps // 20),
    )


PRESETS: dict[str, Preset] = {
    "gpu": Preset(
        name="gpu",
        description=(
            "the implementation report's model (hidden 384, 6 layers, 6 heads of 64, sequence "
            "256) with the Triton kernels in bf16 autocast on one GPU"
        ),
        device="cuda",
        hidden_size=384,
        num_layers=6,
        num_heads=6,
        dropout=0.1,
        backend="triton",
        train=TrainConfig(
            steps=1500,
            batch_size=32,
            seq_len=256,
            learning_rate=1e-3,
            warmup_steps=100,
            eval_every=100,
            eval_windows=128,
            eval_batch_size=32,
            log_every=10,
            checkpoint_every=250,
            autocast_dtype="bfloat16",
        ),
        probes=(
            ProbeSpec("word_order", 2048, 512, _probe_config(500, 64, 3e-4)),
            ProbeSpec("retrieval", 8192, 1024, _probe_config(1500, 64, 3e-4), context_len=32),
        ),
        eval_tokens=65536,
        eval_batch_size=16,
    ),
    "cpu": Preset(
        name="cpu",
        description=(
            "a small model (hidden 64, 2 layers, 4 heads of 16, sequence 64; 300 steps for clm, "
            "600 for mlm, batch 16) with the reference attention on one CPU thread"
        ),
        device="cpu",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        dropout=0.0,
        backend="reference",
        train=TrainConfig(
            steps=300,
            batch_size=16,
            seq_len=64,
            learning_rate=3e-3,
            warmup_steps=30,
            eval_every=25,
            eval_windows=128,
            checkpoint_every=50,
        ),
        probes=(
            ProbeSpec("word_order", 512, 256, _probe_config(300, 32, 1e-3)),
            # The causal models only: it keeps the CPU budget (the gpu preset runs both).
            ProbeSpec("retrieval", 2048, 512, _probe_config(800, 32, 1e-3), objectives=("clm",)),
        ),
        eval_tokens=8192,
        cpu_threads=1,
        mlm_steps=600,
    ),
    "tiny": Preset(
        name="tiny",
        description=(
            "a tiny budget (hidden 64, 2 layers, 4 heads of 16, sequence 40, 100 steps) for tests "
            "and live demonstrations"
        ),
        device="cpu",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        dropout=0.0,
        backend="reference",
        train=TrainConfig(
            steps=100,
            batch_size=16,
            seq_len=40,
            learning_rate=3e-3,
            warmup_steps=10,
            eval_every=25,
            eval_windows=32,
            checkpoint_every=50,
        ),
        probes=(
            ProbeSpec("word_order", 256, 128, _probe_config(300, 32, 1e-3)),
            ProbeSpec("retrieval", 512, 128, _probe_config(100, 32, 1e-3), objectives=("clm",)),
        ),
        eval_tokens=2048,
        cpu_threads=1,
    ),
}


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def choose_preset(name: str = "auto") -> Preset:
    """``PRESETS[name]``; ``"auto"`` is ``gpu`` when CUDA is available, else ``cpu``."""
    if name == "auto":
        name = "gpu" if torch.cuda.is_available() else "cpu"
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: 'auto', {', '.join(map(repr, PRESETS))}")
    preset = PRESETS[name]
    if preset.device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"preset {name!r} needs a CUDA GPU and none is available; use preset='cpu' or 'tiny'"
        )
    return preset


def default_out_dir(preset: str) -> Path:
    """``figures/compare_<preset>/`` in the repository."""
    return REPO_ROOT / "figures" / f"compare_{preset}"


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def hardware_description(device: str | torch.device) -> dict:
    """Where a run ran: kind (CPU/GPU), model name, core and thread counts, software versions."""
    device = torch.device(device)
    info = {
        "kind": "GPU" if device.type == "cuda" else "CPU",
        "cpu": _cpu_model_name(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["name"] = info["gpu"]
    else:
        info["name"] = info["cpu"]
    return info


def _hardware_label(hardware: dict) -> str:
    if hardware["kind"] == "GPU":
        return f"GPU: {hardware['gpu']}"
    threads = hardware["torch_threads"]
    return (
        f"CPU: {hardware['cpu']} ({hardware['logical_cpus']} logical cores, "
        f"{threads} torch thread{'s' if threads != 1 else ''})"
    )


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------


def retrieval_bag_baseline(probe: ProbeBatch) -> float:
    """Expected accuracy of the best guess that ignores positions on a retrieval probe: one of
    the most frequent context symbols, picked at random (a bag of symbols knows counts, not
    places). It is above ``1 / len(alphabet)`` because the target is always in the context."""
    context_len = probe.texts[0].index("@")  # "<context>@<p>?<answer>"
    total = 0.0
    for row, answer in zip(probe.input_ids[:, :context_len], probe.answer_id.tolist(), strict=True):
        counts = torch.bincount(row, minlength=256)
        top = counts.max()
        if counts[answer] == top:
            total += 1.0 / int((counts == top).sum())
    return total / len(probe)


def _run_name(objective: str, encoding: str) -> str:
    return f"{objective}_{encoding}"


class _Data:
    """The token streams, loaded once per comparison."""

    def __init__(self) -> None:
        self.train, self.val = train_val_split()
        self.source = corpus_source()
        self.unigram_entropy = unigram_entropy(self.train)


def _binned_accuracy(correct: list[bool], positions: list[int]) -> dict:
    """Accuracy per target position: ``{"position": [...], "accuracy": [...], "count": [...]}``."""
    table: dict[int, list[int]] = {}
    for ok, pos in zip(correct, positions, strict=True):
        table.setdefault(pos, [0, 0])
        table[pos][0] += int(ok)
        table[pos][1] += 1
    keys = sorted(table)
    return {
        "position": keys,
        "accuracy": [table[k][0] / table[k][1] for k in keys],
        "count": [table[k][1] for k in keys],
    }


def run_one(
    encoding: str,
    objective: str,
    preset: Preset | str = "auto",
    *,
    out_dir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    stop_after_steps: int | None = None,
    threads: int | None = None,
    data: _Data | None = None,
) -> dict | None:
    """Train and evaluate one (encoding, objective) run; return its results dict.

    Reads ``<out_dir>/<objective>_<encoding>.json`` instead if it exists and matches this preset
    (``force=True`` recomputes, deleting the old checkpoint first). Resumes from
    ``<checkpoint_dir>/<objective>_<encoding>.pt`` if present. With ``stop_after_steps`` the
    training stops there (simulating an interruption), the checkpoint is kept and ``None`` is
    returned; call again without it to finish. On CPU the run uses ``threads`` (default: the
    preset's ``cpu_threads``) torch threads, restored afterwards: the thread count changes the
    order of floating-point sums, so a resumed run must use the same count to match exactly.
    """
    get_attention_class(encoding)  # validates the name
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else out_dir / "checkpoints"
    name = _run_name(objective, encoding)
    result_path = out_dir / f"{name}.json"
    checkpoint_path = checkpoint_dir / f"{name}.pt"
    identity = preset.identity(encoding, objective)

    if force:
        result_path.unlink(missing_ok=True)
        checkpoint_path.unlink(missing_ok=True)
    if result_path.exists():
        saved = json.loads(result_path.read_text(encoding="utf-8"))
        if saved.get("identity") != identity:
            raise ValueError(
                f"{result_path} was computed with a different configuration than preset "
                f"{preset.name!r}; recompute it with force=True (--force) or use another out_dir"
            )
        return saved

    _prepare_checkpoint_dir(checkpoint_dir)
    data = data or _Data()
    threads = threads if threads is not None else preset.cpu_threads
    with _torch_threads(threads if preset.device == "cpu" else None):
        return _train_and_evaluate(
            encoding, objective, preset, identity, data, result_path, checkpoint_path,
            progress, stop_after_steps,
        )  # fmt: skip


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(threads)`` (None: unchanged)."""
    previous = torch.get_num_threads()
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _train_and_evaluate(
    encoding: str,
    objective: str,
    preset: Preset,
    identity: dict,
    data: _Data,
    result_path: Path,
    checkpoint_path: Path,
    progress: bool,
    stop_after_steps: int | None,
) -> dict | None:
    name = _run_name(objective, encoding)
    device = torch.device(preset.device)
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train_config = preset.train_config(objective)
    torch.manual_seed(train_config.seed)
    model = MiniBert(preset.model_config(encoding, objective)).to(device)
    state = train_model(
        model,
        data.train,
        data.val,
        train_config,
        checkpoint_path=checkpoint_path,
        meta=identity,
        stop_after_steps=stop_after_steps,
        progress=progress,
        desc=f"{name} train",
    )
    if not state.finished:
        return None

    extrapolation = extrapolation_losses(
        model,
        data.val,
        train_config.seq_len,
        preset.length_multiples,
        eval_tokens=preset.eval_tokens,
        batch_size=preset.eval_batch_size,
        mask_prob=train_config.mask_prob,
        mask_seed=train_config.mask_seed,
        autocast_dtype=train_config.autocast_dtype,
    )
    evaluated = time.perf_counter()
    probes = {}
    for spec in preset.probes:
        if objective not in spec.objectives:
            continue
        train_probe, eval_probe = spec.make("train"), spec.make("eval")
        outcome = probe_finetune(
            model,
            train_probe,
            eval_probe,
            spec.finetune,
            autocast_dtype=train_config.autocast_dtype,
            progress=progress,
            desc=f"{name} {spec.task}",
        )
        entry = {
            "accuracy": outcome["accuracy"],
            "chance": spec.chance,
            "eval_examples": len(eval_probe),
            "final_train_loss": outcome["final_train_loss"],
            "by_position": _binned_accuracy(
                outcome["correct"], eval_probe.target_position.tolist()
            ),
        }
        if spec.task == "retrieval":
            entry["bag_of_symbols_baseline"] = retrieval_bag_baseline(eval_probe)
        if spec.task == "word_order":
            entry["pairs_both_right"] = _pairs_both_right(outcome["correct"])
        probes[spec.task] = entry

    probed = time.perf_counter()
    hardware = hardware_description(device)
    tokens_trained = train_config.steps * train_config.batch_size * train_config.seq_len
    first = extrapolation[0]
    result = {
        "identity": identity,
        "run": name,
        "encoding": encoding,
        "objective": objective,
        "preset": preset.name,
        "preset_description": preset.description,
        "label": f"{preset.name} preset, {_hardware_label(hardware)}",
        "hardware": hardware,
        "data": {
            "corpus_source": data.source,
            "train_tokens": int(data.train.numel()),
            "val_tokens": int(data.val.numel()),
            "unigram_entropy_nats": data.unigram_entropy,
        },
        "curves": {"train": state.train_curve, "val": state.val_curve},
        "metrics": {
            "final_val_loss": first["loss"],
            "final_val_bits_per_byte": first["bits_per_byte"],
            "final_val_tokens": first["tokens"],
            "loss_note": (
                "nats per predicted byte token on held-out text; for mlm over the masked tokens only"
            ),
            "tokens_trained": tokens_trained,
            "train_seconds": state.train_seconds,
            "tokens_per_second": tokens_trained / state.train_seconds,
            "training_segments": state.segments,
            "probe_seconds": probed - evaluated,
            "wall_seconds_this_segment": probed - started,
            "cpu_load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "peak_memory": peak_memory(device),
            "parameters": model.parameter_counts(),
        },
        "extrapolation": extrapolation,
        "probes": probes,
    }
    result_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, result_path)
    return result


def _pairs_both_right(correct: list[bool]) -> float:
    """Fraction of word-order pairs (examples 2k, 2k+1) with both orders answered right."""
    pairs = [correct[i] and correct[i + 1] for i in range(0, len(correct) - 1, 2)]
    return sum(pairs) / max(1, len(pairs))


def _prepare_checkpoint_dir(path: Path) -> None:
    """Create the checkpoint folder with a ``.gitignore`` of ``*`` so git never picks it up."""
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# checkpoints are large and reproducible: never committed\n*\n")


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------


def run_comparison(
    preset: Preset | str = "auto",
    *,
    encodings: Sequence[str] | None = None,
    objectives: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    figures: bool = True,
    threads: int | None = None,
    stop_after_steps: int | None = None,
) -> list[dict]:
    """Every (objective, encoding) run of ``preset``; returns the results of the finished ones.

    Runs go objective by objective, encoding by encoding (``ENCODINGS`` order). Finished runs are
    read back, unfinished ones resumed. Afterwards, if all requested runs finished and
    ``figures``, writes the figures and ``summary.md`` into ``out_dir`` (default
    ``figures/compare_<preset>/``). ``threads`` overrides the preset's CPU thread count.
    """
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    encodings = tuple(encodings or preset.encodings)
    objectives = tuple(objectives or preset.objectives)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    from tqdm.auto import tqdm

    runs = [(o, e) for o in objectives for e in encodings]
    data: _Data | None = None
    results: list[dict] = []
    bar = tqdm(runs, desc=f"{preset.name} comparison", **({} if progress else {"disable": True}))
    try:
        for objective, encoding in bar:
            bar.set_postfix(run=_run_name(objective, encoding), refresh=True)
            needs_data = force or not (out_dir / f"{_run_name(objective, encoding)}.json").exists()
            if needs_data and data is None:
                data = _Data()
            result = run_one(
                encoding,
                objective,
                preset,
                out_dir=out_dir,
                checkpoint_dir=checkpoint_dir,
                force=force,
                progress=progress,
                stop_after_steps=stop_after_steps,
                threads=threads,
                data=data,
            )
            if result is not None:
                results.append(result)
    finally:
        bar.close()
    if figures and results and len(results) == len(runs):
        from course_lib.compare_figures import write_figures

        write_figures(results, out_dir)
        (out_dir / "summary.md").write_text(summary_markdown(results), encoding="utf-8")
    return results


def load_results(out_dir: str | Path) -> list[dict]:
    """The result dicts saved in ``out_dir``, ordered by objective then ``ENCODINGS``."""
    out_dir = Path(out_dir)
    results = []
    for objective in OBJECTIVES:
        for encoding in ENCODINGS:
            path = out_dir / f"{_run_name(objective, encoding)}.json"
            if path.exists():
                results.append(json.loads(path.read_text(encoding="utf-8")))
    if not results:
        raise FileNotFoundError(f"no comparison results (*.json) in {out_dir}")
    return results


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def summary_markdown(results: list[dict]) -> str:
    """A markdown table of the headline numbers of each run, with a line saying what made them."""
    first = results[0]
    train_seconds = sum(r["metrics"]["train_seconds"] for r in results)
    wall_seconds = sum(r["metrics"]["wall_seconds_this_segment"] for r in results)
    loads = [r["metrics"].get("cpu_load_average_1min") for r in results]
    load_text = (
        f"; mean 1-minute load average of the machine during the runs: {sum(loads) / len(loads):.2f}"
        if all(x is not None for x in loads)
        else ""
    )
    lines = [
        f"# Encoding comparison: {first['preset']} preset",
        "",
        f"Model: {first['preset_description']}. Hardware: {_hardware_label(first['hardware'])}. "
        f"Time of the {len(results)} runs: {wall_seconds / 60:.1f} min in all, of which "
        f"{train_seconds / 60:.1f} min of training steps, the rest evaluations and probes "
        f"(a run resumed after an interruption counts its last segment only){load_text}.",
        "",
        "Loss: nats per byte token on held-out text (MLM: masked tokens only); bpb = bits per byte "
        f"= loss / ln 2. Unigram baseline: {first['data']['unigram_entropy_nats']:.3f} nats. "
        '"n/a" past the learned table: it has no rows there. Probe chance: word order 0.5, '
        f"retrieval {_retrieval_chance(results)}.",
        "",
        "| objective | encoding | params (position) | val loss | bpb | loss 2x | loss 4x "
        "| word order | retrieval | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["metrics"]
        by_multiple = {e["multiple"]: e.get("loss") for e in r["extrapolation"]}
        params = m["parameters"]
        lines.append(
            f"| {r['objective']} | {r['encoding']} "
            f"| {params['total']:,} ({params['position_embeddings']:,}) "
            f"| {_fmt(m['final_val_loss'])} | {_fmt(m['final_val_bits_per_byte'])} "
            f"| {_fmt(by_multiple.get(2))} | {_fmt(by_multiple.get(4))} "
            f"| {_fmt(r['probes'].get('word_order', {}).get('accuracy'), 2)} "
            f"| {_fmt(r['probes'].get('retrieval', {}).get('accuracy'), 2)} "
            f"| {m['tokens_per_second']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def _retrieval_chance(results: list[dict]) -> str:
    probes = [r["probes"]["retrieval"] for r in results if "retrieval" in r["probes"]]
    if not probes:
        return "n/a"
    probe = probes[0]
    return (
        f"{probe['chance']:.3f} (a position-blind guess of the most frequent context symbol: "
        f"{probe['bag_of_symbols_baseline']:.3f})"
    )


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _csv(valid: Sequence[str]):
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in valid]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown value(s) {', '.join(bad) or '(empty)'}; valid: {', '.join(valid)}"
            )
        return items

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_lib.compare [--preset cpu] [--out-dir DIR] [--force] ...``"""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.compare",
        description="Train the mini BERT once per encoding and objective and compare them.",
    )
    parser.add_argument(
        "--preset",
        default="auto",
        choices=["auto", *PRESETS],
        help="auto = gpu if CUDA is available, else cpu",
    )
    parser.add_argument(
        "--out-dir", type=Path, help="results folder (default figures/compare_<preset>)"
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, help="checkpoint folder (default <out-dir>/checkpoints)"
    )
    parser.add_argument("--encodings", type=_csv(ENCODINGS), help="comma list (default: all)")
    parser.add_argument("--objectives", type=_csv(OBJECTIVES), help="comma list (default: both)")
    parser.add_argument("--force", action="store_true", help="recompute finished runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--no-figures", action="store_true", help="skip figures and summary.md")
    parser.add_argument("--threads", type=int, help="CPU threads (default: the preset's)")
    parser.add_argument(
        "--stop-after-steps",
        type=int,
        help="stop each run's training after this many steps, keeping the checkpoint "
        "(simulates an interruption; run again without it to resume)",
    )
    args = parser.parse_args(argv)
    try:
        preset = choose_preset(args.preset)
    except ValueError as error:
        parser.error(str(error))
    started = time.perf_counter()
    results = run_comparison(
        preset,
        encodings=args.encodings,
        objectives=args.objectives,
        out_dir=args.out_dir,
        checkpoint_dir=args.checkpoint_dir,
        force=args.force,
        progress=not args.no_progress,
        figures=not args.no_figures,
        threads=args.threads,
        stop_after_steps=args.stop_after_steps,
    )
    elapsed = time.perf_counter() - started
    out_dir = args.out_dir or default_out_dir(preset.name)
    print(f"{len(results)} finished run(s) in {out_dir} ({elapsed / 60:.1f} min this call)")
    if results:
        print(summary_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
