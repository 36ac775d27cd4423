"""Training of a :class:`~course_lib.model.MiniBert` on the course corpus, and the probe fine-tune.

* :func:`train_model`: AdamW (:func:`make_optimizer`), linear warm-up then cosine decay of the
  learning rate (:func:`learning_rate_at`), gradient-norm clipping, optional autocast (bf16 on a
  GPU); the validation loss (:func:`course_lib.evaluate.evaluate_loss`) every ``eval_every``
  steps; a checkpoint (model, optimiser, step, RNG states, curves so far) every
  ``checkpoint_every`` steps. Called again with the same checkpoint path after an interruption, it
  resumes from the last checkpoint, mid-run too, and ends with exactly the result of a run that
  was never interrupted. With ``data_parallel`` (a :class:`course_lib.distributed.Processes`,
  started by ``torchrun``) the processes train the model together on shards of each batch.
* :func:`probe_finetune`: the probe protocol (seeded fine-tune of a copy of the model on probe
  examples, then the accuracy of the answer on held-out examples), see its docstring.

Evaluation (losses, extrapolation, probe scoring, memory) lives in :mod:`course_lib.evaluate`.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.data import IGNORE_INDEX, ProbeBatch, clm_batch, mlm_batch
from course_lib.distributed import Processes, step_seed
from course_lib.evaluate import (
    AUTOCAST_DTYPES,
    autocast,
    evaluate_loss,
    model_device,
    probe_correct,
    probe_inputs,
)
from course_lib.model import MiniBert

__all__ = [
    "ProbeConfig",
    "TrainConfig",
    "TrainState",
    "GlobalBatchDropout",
    "learning_rate_at",
    "learning_rate_sum",
    "load_checkpoint",
    "CheckpointError",
    "make_optimizer",
    "probe_finetune",
    "save_checkpoint",
    "train_model",
    "training_batch",
]

PROBE_LOSSES = ("candidates", "answer_span")


@dataclass(frozen=True)
class TrainConfig:
    """Budget and optimiser of one training run.

    The learning rate rises linearly over ``warmup_steps`` to ``learning_rate``, then follows a
    cosine down to ``min_lr_ratio * learning_rate`` at the last step. Every batch is
    ``batch_size`` random crops of ``seq_len`` tokens drawn from a generator seeded by ``seed``,
    so two runs with the same config see the same data in the same order.
    """

    steps: int
    batch_size: int
    seq_len: int
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    mask_prob: float = 0.15
    eval_every: int = 50
    eval_windows: int = 16  # validation windows for the curve (the final evaluation uses more)
    eval_batch_size: int = 16
    log_every: int = 1  # the train curve stores the mean loss of every `log_every` steps
    checkpoint_every: int = 100
    seed: int = 0
    mask_seed: int = 1234  # seeds the validation masks (MLM): the same for every run
    autocast_dtype: str | None = None  # None (fp32) or "bfloat16" / "float16" (CUDA)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "eval_every", "eval_windows"):
            _check_positive_int(name, getattr(self, name))
        for name in ("eval_batch_size", "log_every", "checkpoint_every"):
            _check_positive_int(name, getattr(self, name))
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be an int in [0, steps), got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.learning_rate <= 0 or self.grad_clip <= 0 or self.weight_decay < 0:
            raise ValueError("learning_rate and grad_clip must be > 0 and weight_decay >= 0")
        if self.autocast_dtype not in AUTOCAST_DTYPES:
            raise ValueError(
                f"autocast_dtype must be one of {list(AUTOCAST_DTYPES)}, got {self.autocast_dtype!r}"
            )


@dataclass(frozen=True)
class ProbeConfig:
    """Fine-tuning budget of one probe (the same for every encoding)."""

    steps: int = 150
    batch_size: int = 32
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    loss: str = "candidates"  # "candidates" or "answer_span" (see probe_finetune)

    def __post_init__(self) -> None:
        _check_positive_int("steps", self.steps)
        _check_positive_int("batch_size", self.batch_size)
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps), got {self.warmup_steps}")
        if self.loss not in PROBE_LOSSES:
            raise ValueError(f"loss must be one of {PROBE_LOSSES}, got {self.loss!r}")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Optimiser and schedule
# ---------------------------------------------------------------------------------------------


def learning_rate_at(
    step: int, steps: int, peak: float, warmup_steps: int, min_lr_ratio: float
) -> float:
    """Learning rate of (0-based) ``step`` of ``steps``.

    Warm-up: ``peak * (step + 1) / warmup_steps`` for ``step < warmup_steps``; then
    ``peak * (r + (1 - r) * (1 + cos(pi * t)) / 2)`` with ``r = min_lr_ratio`` and
    ``t = (step - warmup_steps) / (steps - 1 - warmup_steps)`` going from 0 to 1.
    """
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = max(1, steps - 1 - warmup_steps)
    t = min(1.0, (step - warmup_steps) / span)
    return peak * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t)))


def learning_rate_sum(config: TrainConfig) -> float:
    """``sum_s learning_rate_at(s)`` over the run's steps: about the farthest AdamW can move one
    parameter in the run (Adam's step is at most about the learning rate, whatever the size of
    the gradient, and exactly it while the gradient keeps its sign)."""
    return sum(
        learning_rate_at(
            s, config.steps, config.learning_rate, config.warmup_steps, config.min_lr_ratio
        )
        for s in range(config.steps)
    )


def make_optimizer(
    model: nn.Module, learning_rate: float, weight_decay: float
) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (``dim >= 2``: projections, embedding tables) only,
    none on biases, LayerNorm gains and per-head scalars."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.98), eps=1e-8)


def _set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def training_batch(
    objective: str,
    tokens: torch.Tensor,
    config: TrainConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch ``(input_ids [B, L], labels [B, L])``: next-token crops (``clm``) or BERT-masked
    crops (``mlm``; labels -100 except at the masked targets)."""
    if objective == "clm":
        return clm_batch(tokens, config.batch_size, config.seq_len, generator)
    if objective == "mlm":
        return mlm_batch(tokens, config.batch_size, config.seq_len, generator, config.mask_prob)
    raise ValueError(f"unknown objective {objective!r}; valid: 'mlm', 'clm'")


# ---------------------------------------------------------------------------------------------
# Training with checkpoints
# ---------------------------------------------------------------------------------------------


@dataclass
class TrainState:
    """What :func:`train_model` returns and what a checkpoint carries besides the tensors.

    ``train_curve`` / ``val_curve``: ``{"step": [...], "loss": [...]}`` (the train curve holds the
    mean loss of each ``log_every`` steps, labelled by the last of them); ``train_seconds``: time
    spent in training steps (summed over resumed segments), ``train_cpu_seconds`` the CPU time
    of this process in them; ``finished``: whether all steps ran;
    ``processes``: how many processes trained each segment (1 without ``torchrun``).
    """

    step: int = 0
    train_curve: dict = field(default_factory=lambda: {"step": [], "loss": []})
    val_curve: dict = field(default_factory=lambda: {"step": [], "loss": []})
    train_seconds: float = 0.0
    train_cpu_seconds: float = 0.0
    segments: int = 0
    finished: bool = False
    pending_loss_sum: float = 0.0  # losses of steps not yet logged (log_every > 1)
    pending_count: int = 0
    processes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _rng_states(generator: torch.Generator) -> dict:
    states = {"batch_generator": generator.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_rng_states(states: dict, generator: torch.Generator) -> None:
    generator.set_state(states["batch_generator"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    generator: torch.Generator,
    meta: dict,
) -> None:
    """Write model + optimiser + step + RNG states + curves to ``path`` atomically (a temporary
    file renamed over the old one, so an interruption never leaves a half-written checkpoint).
    ``meta`` (JSON-like) identifies the run; :func:`load_checkpoint` checks it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "state": state.to_dict(),
        "rng": _rng_states(generator),
        "meta": meta,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: damaged, not a checkpoint, or another run's."""


_CHECKPOINT_PARTS = ("model", "optimizer", "state", "rng", "meta")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """The dict :func:`save_checkpoint` wrote (tensors on ``map_location``); a file that is not
    one (cut short, emptied, something else) raises a :class:`CheckpointError` naming it."""
    path = Path(path)
    way_out = "delete it, or recompute the run from the start with force=True (--force)"
    try:
        saved = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch reports a damaged file in many ways (EOF, zip, pickle)
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(error).__name__}): it is damaged (cut "
            f"short?) or not a checkpoint; {way_out}"
        ) from error
    if not isinstance(saved, dict) or any(part not in saved for part in _CHECKPOINT_PARTS):
        raise CheckpointError(
            f"checkpoint {path} is not one this course wrote (it needs "
            f"{', '.join(_CHECKPOINT_PARTS)}); {way_out}"
        )
    return saved


def _check_meta(path: Path, saved: dict, expected: dict) -> None:
    if saved != expected:
        diff = sorted(k for k in set(saved) | set(expected) if saved.get(k) != expected.get(k))
        raise CheckpointError(
            f"checkpoint {path} belongs to a different run (differs in: {', '.join(diff)}); "
            "delete it or recompute with force=True (--force)"
        )


def _progress_bar(total: int, initial: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    # When enabled, leave `disable` unset so that TQDM_DISABLE=1 in the environment still works.
    options = {} if enabled else {"disable": True}
    return tqdm(total=total, initial=initial, desc=desc, leave=False, **options)


def train_model(
    model: MiniBert,
    train_tokens: torch.Tensor,
    val_tokens: torch.Tensor,
    config: TrainConfig,
    *,
    checkpoint_path: str | Path | None = None,
    meta: dict | None = None,
    stop_after_steps: int | None = None,
    progress: bool = True,
    desc: str = "train",
    data_parallel: Processes | None = None,
    deadline: float | None = None,
) -> TrainState:
    """Train ``model`` in place for ``config.steps`` steps on ``config.objective`` batches.

    Each step: ``lr = learning_rate_at(step)``, a batch from :func:`training_batch`, loss,
    backward, gradients clipped to norm ``grad_clip``, AdamW step. Every ``eval_every`` steps
    (and after the last) the validation loss on ``eval_windows`` windows of ``seq_len`` is
    appended to ``val_curve``.

    With ``checkpoint_path``: if the file exists the run resumes from it (its ``meta`` must equal
    ``meta``); a checkpoint is written every ``checkpoint_every`` steps, after the last step and
    when ``stop_after_steps`` is reached (to simulate an interruption; the returned state then has
    ``finished=False``). ``deadline`` (a :func:`time.monotonic` value) stops the training the
    same way at the first step that ends after it: a checkpoint is written there and the state
    returned with ``finished=False`` (one process only: under ``data_parallel`` the processes
    could disagree on the time). After a crash or Ctrl-C the run resumes from the last
    checkpoint written.
    The resumed run is bit-identical to an uninterrupted one on the same device (RNG states, data
    order and the not-yet-logged losses are restored).

    With ``data_parallel`` (every process of a ``torchrun`` launch calls this with the same
    arguments and its own :class:`~course_lib.distributed.Processes`): each step every process
    draws the whole batch ``[B, L]`` from the same generator, so the generator's state is that
    of one process, and trains on its shard of ``B / N`` rows (:meth:`Processes.shard`) inside
    ``DistributedDataParallel``. The loss each process differentiates is
    ``N * sum(cross-entropy over its labelled tokens) / (labelled tokens in the whole batch)``;
    DDP averages the gradients over the ``N`` processes, so the gradient is that of the mean
    loss over the global batch (exactly, up to the order of float sums), also for ``mlm`` where
    the rows hold different numbers of masked tokens. The logged loss is that global mean.
    Only rank 0 reads the checkpoint (and sends it to the others), validates and writes
    checkpoints; the other ranks' ``val_curve`` stays empty. A checkpoint does not depend on the
    number of processes that wrote it, so a run resumes with any number, one included.

    Dropout (any ``nn.Dropout`` of the model with ``p > 0``) draws its masks for the whole global
    batch from a generator seeded ``step_seed(seed, step)`` at every step, and each process keeps
    its own rows (:class:`GlobalBatchDropout`): the same masks with one process or ``N``, and
    after a resume. What differs between one process and ``N`` is only the order of float sums
    (each process sums its shard's gradients, then the processes add theirs).
    """
    if deadline is not None and data_parallel is not None:
        raise ValueError("a deadline stops one process's training; not with data_parallel")
    device = model_device(model)
    main = data_parallel is None or data_parallel.is_main
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = make_optimizer(model, config.learning_rate, config.weight_decay)
    state = TrainState()
    meta = dict(meta or {})
    checkpoint_path = None if checkpoint_path is None else Path(checkpoint_path)
    if data_parallel is None:
        saved = None
        if checkpoint_path is not None and checkpoint_path.exists():
            saved = load_checkpoint(checkpoint_path, map_location=device)
            _check_meta(checkpoint_path, saved["meta"], meta)
    else:
        saved = data_parallel.from_main(lambda: _read_checkpoint(checkpoint_path, meta))
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(**saved["state"])
        if data_parallel is None:
            _restore_rng_states(saved["rng"], generator)
        else:
            generator.set_state(saved["rng"]["batch_generator"])
    else:
        torch.manual_seed(config.seed)
    if state.finished:
        return state
    state.segments += 1
    state.processes.append(1 if data_parallel is None else data_parallel.world_size)
    trained = model if data_parallel is None else data_parallel.wrap(model)
    dropout = GlobalBatchDropout(model, data_parallel)

    def checkpoint() -> None:
        if checkpoint_path is not None and main:
            save_checkpoint(checkpoint_path, model, optimizer, state, generator, meta)

    def validate() -> float:
        loss, _ = evaluate_loss(
            model,
            val_tokens,
            config.seq_len,
            max_windows=config.eval_windows,
            batch_size=config.eval_batch_size,
            mask_prob=config.mask_prob,
            mask_seed=config.mask_seed,
            autocast_dtype=config.autocast_dtype,
        )
        return loss

    stop_at = config.steps if stop_after_steps is None else min(config.steps, stop_after_steps)
    model.train()
    running = torch.tensor(state.pending_loss_sum, device=device)
    bar = _progress_bar(config.steps, state.step, desc, progress and main)
    timer, cpu_timer = time.perf_counter(), time.process_time()
    try:
        dropout.__enter__()
        while state.step < stop_at:
            dropout.start_step(step_seed(config.seed, state.step), device)
            lr = learning_rate_at(
                state.step,
                config.steps,
                config.learning_rate,
                config.warmup_steps,
                config.min_lr_ratio,
            )
            _set_learning_rate(optimizer, lr)
            input_ids, labels = training_batch(
                model.config.objective, train_tokens, config, generator
            )
            if data_parallel is None:
                loss = _one_process_backward(
                    model, input_ids, labels, optimizer, config.autocast_dtype
                )
            else:
                loss = _data_parallel_backward(
                    trained, data_parallel, input_ids, labels, optimizer, config.autocast_dtype
                )
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            running += loss.detach().float()
            state.pending_count += 1
            state.step += 1
            if state.step % config.log_every == 0 or state.step == config.steps:
                mean_loss = float(running) / state.pending_count  # syncs the device
                state.train_curve["step"].append(state.step)
                state.train_curve["loss"].append(mean_loss)
                running.zero_()
                state.pending_count = 0
                bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.1e}", refresh=False)
            bar.update(1)
            state.finished = state.step == config.steps
            if deadline is not None and not state.finished and time.monotonic() >= deadline:
                stop_at = state.step  # out of time: save here and stop, to resume later
            evaluate_now = state.step % config.eval_every == 0 or state.finished
            save_now = state.step % config.checkpoint_every == 0 or state.step == stop_at
            if evaluate_now or save_now:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                state.train_seconds += time.perf_counter() - timer
                state.train_cpu_seconds += time.process_time() - cpu_timer
                if evaluate_now and main:
                    state.val_curve["step"].append(state.step)
                    state.val_curve["loss"].append(validate())
                    model.train()
                if save_now:
                    state.pending_loss_sum = float(running)
                    checkpoint()
                timer, cpu_timer = time.perf_counter(), time.process_time()
    finally:
        dropout.__exit__(None, None, None)
        bar.close()
    return state


class GlobalBatchDropout:
    """Dropout whose masks do not depend on how many processes share a batch.

    Inside ``with GlobalBatchDropout(model, processes):`` every ``nn.Dropout`` of ``model`` with
    ``p > 0``, in training mode, draws ``u ~ U[0, 1)`` for the *global* batch (its input's shape
    with ``N`` times the rows; ``N = processes.world_size``, 1 without ``processes``) from the
    generator of :meth:`start_step`, keeps this process's rows (those of
    :meth:`~course_lib.distributed.Processes.shard`) and returns ``x * (u >= p) / (1 - p)``. Every
    process draws the same numbers in the same order, so row ``r`` of the global batch gets the
    same mask whichever process holds it. In eval mode a dropout is the identity, as usual."""

    def __init__(self, model: nn.Module, processes: Processes | None) -> None:
        self.modules = [m for m in model.modules() if isinstance(m, nn.Dropout) and m.p > 0]
        self.world_size = 1 if processes is None else processes.world_size
        self.rank = 0 if processes is None else processes.rank
        self.generator: torch.Generator | None = None

    def __enter__(self) -> GlobalBatchDropout:
        for module in self.modules:
            module.forward = functools.partial(self._forward, module)
        return self

    def __exit__(self, *exc) -> None:
        for module in self.modules:
            module.__dict__.pop("forward", None)

    def start_step(self, seed: int, device: torch.device) -> None:
        """Seed the masks of the next forward pass (call once per training step)."""
        if self.modules:
            self.generator = torch.Generator(device=device).manual_seed(seed)

    def _forward(self, module: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
        if not module.training:
            return x
        if self.generator is None:
            raise RuntimeError("GlobalBatchDropout.start_step must be called before a forward")
        rows = x.shape[0]
        noise = torch.rand(
            (rows * self.world_size, *x.shape[1:]), generator=self.generator, device=x.device
        )[self.rank * rows : (self.rank + 1) * rows]
        return x * (noise >= module.p).to(x.dtype) / (1.0 - module.p)


def _read_checkpoint(path: Path | None, meta: dict) -> dict | None:
    """The checkpoint at ``path`` on the CPU, checked against ``meta``; None if there is none."""
    if path is None or not path.exists():
        return None
    saved = load_checkpoint(path, map_location="cpu")
    _check_meta(path, saved["meta"], meta)
    return saved


def _one_process_backward(
    model: nn.Module,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    autocast_dtype: str | None,
) -> torch.Tensor:
    """Forward and backward of the whole batch ``(input_ids, labels)`` (both ``[B, L]``) in this
    process; returns the mean loss over its labelled tokens (a 0-d tensor)."""
    device = model_device(model)
    input_ids, labels = input_ids.to(device), labels.to(device)
    with autocast(device, autocast_dtype):
        loss = model(input_ids, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss


def _data_parallel_backward(
    trained: nn.Module,
    processes: Processes,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    autocast_dtype: str | None,
) -> torch.Tensor:
    """Forward and backward of this rank's shard of the global batch ``(input_ids, labels)``
    (both ``[B, L]``); returns the mean loss over the whole global batch (a 0-d tensor).

    ``share = sum of this shard's cross-entropies / labelled tokens of the global batch``; the
    backward runs on ``N * share`` (``N`` processes), and DDP's mean over the ranks makes the
    gradient that of ``sum over ranks of share`` = the global mean loss."""
    device = processes.device
    global_count = int((labels != IGNORE_INDEX).sum())  # every rank holds the whole batch
    input_ids = processes.shard(input_ids).to(device)
    labels = processes.shard(labels).to(device)
    with autocast(device, autocast_dtype):
        logits = trained(input_ids).logits
    share = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    ) / max(global_count, 1)
    optimizer.zero_grad(set_to_none=True)
    (share * processes.world_size).backward()
    return processes.sum_(share.detach().clone())


# ---------------------------------------------------------------------------------------------
# The probe fine-tune
# ---------------------------------------------------------------------------------------------


def probe_finetune(
    model: MiniBert,
    train_probe: ProbeBatch,
    eval_probe: ProbeBatch,
    config: ProbeConfig,
    *,
    autocast_dtype: str | None = None,
    progress: bool = False,
    desc: str = "probe",
    keep_model: bool = False,
) -> dict:
    """The probe protocol: fine-tune a copy of ``model`` on ``train_probe``, score ``eval_probe``.

    A deep copy of the pretrained model (the original is untouched), with its own attention
    (causal for ``clm``, bidirectional with the answer masked for ``mlm``; see
    :func:`probe_inputs`), is trained for ``config.steps`` AdamW steps (warm-up + cosine,
    clipping) on batches of ``config.batch_size`` examples drawn with a generator seeded by
    ``config.seed``. The loss is, for ``config.loss``:

    * ``"candidates"`` (default): cross-entropy of the answer among the candidates, i.e. a
      softmax over ``logits[score_index, candidate_ids]`` only. The model need not first learn
      which tokens can be answers; it learns the decision the probe measures.
    * ``"answer_span"``: the language-model cross-entropy of the answer span over the vocabulary.

    Everything random is seeded, so every encoding gets the same examples in the same order.
    Accuracy = fraction of held-out examples whose answer scores strictly above every other
    candidate (:func:`course_lib.evaluate.probe_correct`: a tie is wrong).

    Returns ``{"accuracy", "correct" (list of bool, one per eval example), "final_train_loss"}``
    (and ``"model"``, the fine-tuned copy in eval mode, with ``keep_model``).
    """
    device = model_device(model)
    tuned = copy.deepcopy(model)
    tuned.train()
    optimizer = make_optimizer(tuned, config.learning_rate, config.weight_decay)
    inputs, labels, score_index = probe_inputs(train_probe, model.config.objective)
    candidates = train_probe.candidate_ids
    target = (candidates == train_probe.answer_id[:, None]).float().argmax(dim=1)  # [N]
    generator = torch.Generator().manual_seed(config.seed)
    fork_devices = [device] if device.type == "cuda" else []
    last_loss = float("nan")
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(config.seed)
        bar = _progress_bar(config.steps, 0, desc, progress)
        for step in range(config.steps):
            lr = learning_rate_at(
                step, config.steps, config.learning_rate, config.warmup_steps, config.min_lr_ratio
            )
            _set_learning_rate(optimizer, lr)
            index = torch.randint(0, len(train_probe), (config.batch_size,), generator=generator)
            batch_inputs = inputs[index].to(device)
            with autocast(device, autocast_dtype):
                if config.loss == "answer_span":
                    loss = tuned(batch_inputs, labels=labels[index].to(device)).loss
                else:
                    logits = tuned(batch_inputs).logits
            if config.loss == "candidates":
                rows = torch.arange(len(index), device=device)
                scored = logits[rows, score_index[index].to(device)].float()  # [batch, vocab]
                scored = scored.gather(1, candidates[index].to(device))  # [batch, candidates]
                loss = F.cross_entropy(scored, target[index].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tuned.parameters(), config.grad_clip)
            optimizer.step()
            bar.update(1)
            if step == config.steps - 1 or step % 25 == 0:
                last_loss = float(loss.detach())
                bar.set_postfix(loss=f"{last_loss:.3f}", refresh=False)
        bar.close()
    correct = probe_correct(tuned, eval_probe, autocast_dtype=autocast_dtype)
    outcome = {
        "accuracy": float(correct.float().mean()),
        "correct": correct.tolist(),
        "final_train_loss": last_loss,
    }
    if keep_model:
        outcome["model"] = tuned.eval()
    return outcome
