"""Evaluation of a :class:`~course_lib.model.MiniBert`: held-out loss, length extrapolation,
probe scoring and cost.

* :func:`evaluate_loss`: mean cross-entropy in nats per predicted token over fixed, non-overlapping
  validation windows (next token for ``clm``; the masked tokens only, with seeded masks, for
  ``mlm``). :func:`bits_per_byte` converts: ``loss / ln 2`` (one token is one UTF-8 byte, i.e. one
  character for ASCII text).
* :func:`extrapolation_losses`: that loss at multiples of the training length; a learned table
  reports "not applicable" past its last row instead of crashing or clipping.
* :func:`probe_inputs` / :func:`probe_correct`: a probe's examples as model inputs, and whether the
  model picks the right candidate for each (the fine-tune before it is
  :func:`course_lib.train.probe_finetune`).
* :func:`peak_memory`: what a run cost in memory.

Nothing here changes a model's parameters.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.data import IGNORE_INDEX, MASK_ID, ProbeBatch, eval_windows, mask_tokens
from course_lib.model import MiniBert

__all__ = [
    "AUTOCAST_DTYPES",
    "bits_per_byte",
    "evaluate_loss",
    "extrapolation_losses",
    "peak_memory",
    "position_bucket_losses",
    "position_limit",
    "probe_correct",
    "probe_inputs",
    "spread_windows",
]

#: ``autocast_dtype`` names a run may use: None (fp32), or a CUDA autocast dtype.
AUTOCAST_DTYPES = {None: None, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast(device: torch.device, dtype_name: str | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``AUTOCAST_DTYPES[dtype_name]`` on ``device`` (None: a no-op)."""
    dtype = AUTOCAST_DTYPES[dtype_name]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's (first) parameters."""
    return next(model.parameters()).device


def batch_slices(n: int, size: int) -> Iterator[slice]:
    """``slice``s of ``size`` consecutive rows covering ``range(n)`` (the last may be shorter)."""
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def bits_per_byte(loss_nats: float) -> float:
    """``loss / ln 2``: nats per byte token -> bits per byte (= per character for ASCII)."""
    return loss_nats / math.log(2.0)


def position_limit(model: MiniBert) -> int | None:
    """The longest sequence the model can encode: the fewest rows of a position table
    (``attention.position_embeddings``, an ``nn.Embedding``) over its layers, or None when no
    layer has one (the encoding works at any length)."""
    rows = [
        table.num_embeddings
        for layer in model.layers
        if isinstance(table := getattr(layer.attention, "position_embeddings", None), nn.Embedding)
    ]
    return min(rows) if rows else None


@torch.no_grad()
def evaluate_loss(
    model: MiniBert,
    tokens: torch.Tensor,
    seq_len: int,
    *,
    max_windows: int | None,
    batch_size: int = 16,
    mask_prob: float = 0.15,
    mask_seed: int = 1234,
    autocast_dtype: str | None = None,
) -> tuple[float, int]:
    """Mean cross-entropy (nats per predicted token) on validation windows; also the count.

    The windows are the non-overlapping :func:`course_lib.data.eval_windows` of ``seq_len``
    tokens; with ``max_windows`` (``W``) only ``W`` of them, evenly spread over the whole stream
    (indices ``round(linspace(0, available - 1, W))``), so a short evaluation still samples every
    part of the validation text. ``clm`` predicts every next token; ``mlm`` masks each batch of
    windows with :func:`~course_lib.data.mask_tokens` from a generator seeded by ``mask_seed``
    and is scored on the masked tokens only. Returns ``(sum of losses / count, count)``.
    """
    inputs, targets = spread_windows(tokens, seq_len, max_windows)
    if model.config.objective == "mlm":
        generator = torch.Generator().manual_seed(mask_seed)
        inputs, targets = _mask_in_batches(inputs, generator, mask_prob, batch_size)
    total, count = _summed_loss(model, inputs, targets, batch_size, autocast_dtype)
    return total / max(count, 1), count


def _mask_in_batches(
    inputs: torch.Tensor, generator: torch.Generator, mask_prob: float, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~course_lib.data.mask_tokens` applied batch by batch (``(masked, labels)``)."""
    parts = [
        mask_tokens(inputs[part], generator, mask_prob)
        for part in batch_slices(len(inputs), batch_size)
    ]
    return torch.cat([m for m, _ in parts]), torch.cat([lab for _, lab in parts])


@torch.no_grad()
def _summed_loss(
    model: MiniBert,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    autocast_dtype: str | None,
) -> tuple[float, int]:
    """Sum of the cross-entropies over labels != -100, and their count, in eval mode."""
    device = model_device(model)
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for part in batch_slices(inputs.shape[0], batch_size):
        input_ids, part_labels = inputs[part].to(device), labels[part].to(device)
        with autocast(device, autocast_dtype):
            logits = model(input_ids).logits
        total += F.cross_entropy(
            logits.float().flatten(0, 1),
            part_labels.flatten(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        ).double()
        count += int((part_labels != IGNORE_INDEX).sum())
    model.train(was_training)
    return float(total), count


def spread_windows(
    tokens: torch.Tensor, seq_len: int, max_windows: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [W, L], next_ids [W, L])``: ``W = min(max_windows, available)`` of the
    :func:`course_lib.data.eval_windows` windows, evenly spread over the stream (all of them
    when ``max_windows`` is None)."""
    available = (tokens.shape[0] - 1) // seq_len
    inputs, targets = next(eval_windows(tokens, seq_len, None, batch_size=max(1, available)))
    if max_windows is not None and max_windows < inputs.shape[0]:
        picks = torch.linspace(0, inputs.shape[0] - 1, max_windows).round().long()
        inputs, targets = inputs[picks], targets[picks]
    return inputs, targets


def extrapolation_losses(
    model: MiniBert,
    tokens: torch.Tensor,
    train_len: int,
    multiples: tuple[int, ...] = (1, 2, 4),
    *,
    eval_tokens: int = 8192,
    batch_size: int = 8,
    mask_prob: float = 0.15,
    mask_seed: int = 1234,
    autocast_dtype: str | None = None,
) -> list[dict]:
    """Validation loss at ``m * train_len`` for each multiple ``m``, on the same text.

    The text is ``eval_tokens // (M * train_len)`` chunks of ``M * train_len`` tokens
    (``M = max(multiples)``) spread evenly over ``tokens`` (:func:`spread_windows`); for ``mlm``
    the chunks are masked once (generator seeded by ``mask_seed``). At multiple ``m`` each chunk
    is cut into ``M / m`` windows of ``m * train_len`` tokens, so every length scores the same
    tokens (and, for ``mlm``, the same masks); only the context each window gives differs.

    Each entry: ``{"multiple", "length", "status": "ok", "loss", "bits_per_byte", "tokens"}``, or
    for a length past a learned table ``{"multiple", "length", "status": "not_applicable",
    "reason"}`` (a learned table has no row for those positions; nothing is clipped or resized).
    """
    if not multiples or any(not isinstance(m, int) or m < 1 for m in multiples):
        raise ValueError(f"multiples must be positive ints, got {multiples}")
    longest = max(multiples) * train_len
    if any(longest % (m * train_len) for m in multiples):
        raise ValueError(f"every multiple must divide the largest one, got {multiples}")
    inputs, targets = spread_windows(tokens, longest, max(1, eval_tokens // longest))
    if model.config.objective == "mlm":
        generator = torch.Generator().manual_seed(mask_seed)
        inputs, targets = mask_tokens(inputs, generator, mask_prob)
    limit = position_limit(model)
    out = []
    for multiple in multiples:
        length = multiple * train_len
        entry: dict = {"multiple": multiple, "length": length}
        if limit is not None and length > limit:
            entry.update(
                status="not_applicable",
                reason=f"learned position table has {limit} rows; length {length} is past it",
            )
        else:
            total, count = _summed_loss(
                model,
                inputs.reshape(-1, length),
                targets.reshape(-1, length),
                max(1, batch_size // multiple),
                autocast_dtype,
            )
            loss = total / max(count, 1)
            entry.update(status="ok", loss=loss, bits_per_byte=bits_per_byte(loss), tokens=count)
        out.append(entry)
    return out


def position_bucket_losses(
    model: MiniBert,
    tokens: torch.Tensor,
    train_len: int,
    multiples: tuple[int, ...] = (1, 2, 4, 8),
    *,
    eval_tokens: int = 16384,
    batch_size: int = 8,
    mask_prob: float = 0.15,
    mask_seed: int = 1234,
    autocast_dtype: str | None = None,
) -> list[dict]:
    """Validation loss by target position, in buckets, all from windows of ``M * train_len``.

    ``M = max(multiples)``; bucket ``k`` holds the targets at positions ``[m_{k-1} L, m_k L)``
    (``m_{-1} = 0``), e.g. 0-63, 64-127, 128-255, 256-511 for ``L = 64`` and multiples
    ``(1, 2, 4, 8)``. Every bucket is scored on the same windows (``eval_tokens // (M L)`` of
    them, spread over ``tokens``; for ``mlm`` masked once with a generator seeded by
    ``mask_seed``). For ``clm`` bucket 0 is the training length's loss with the training
    length's context, and a later bucket's rise is what positions past the training length cost
    (with more context before them). For ``mlm`` every target sees the whole window on both
    sides, so even bucket 0 meets distances never seen in training: compare its buckets with the
    loss at the training length (:func:`extrapolation_losses` at multiple 1). A model with a position table (:func:`position_limit`) is scored
    on the first ``limit`` tokens of each window for the buckets that fit (the same targets;
    for ``mlm`` its context then stops at the limit) and reports the others
    ``"not_applicable"``.

    Each entry: ``{"start", "end", "status": "ok", "loss", "tokens"}`` or ``{"start", "end",
    "status": "not_applicable", "reason"}``.
    """
    if not multiples or any(not isinstance(m, int) or m < 1 for m in multiples):
        raise ValueError(f"multiples must be positive ints, got {multiples}")
    if list(multiples) != sorted(set(multiples)):
        raise ValueError(f"multiples must increase, got {multiples}")
    length = max(multiples) * train_len
    inputs, targets = spread_windows(tokens, length, max(1, eval_tokens // length))
    if model.config.objective == "mlm":
        generator = torch.Generator().manual_seed(mask_seed)
        inputs, targets = mask_tokens(inputs, generator, mask_prob)
    limit = position_limit(model)
    visible = length if limit is None else min(limit, length)
    losses = _token_losses(
        model, inputs[:, :visible], targets[:, :visible], batch_size, autocast_dtype
    )  # [W, visible], NaN where not scored
    out, start = [], 0
    for multiple in multiples:
        end = multiple * train_len
        entry: dict = {"start": start, "end": end}
        if end > visible:
            entry.update(
                status="not_applicable",
                reason=f"position table has {limit} rows; positions {start}-{end - 1} are past it",
            )
        else:
            part = losses[:, start:end]
            scored = ~torch.isnan(part)
            count = int(scored.sum())
            loss = float(part[scored].double().sum()) / max(count, 1)
            entry.update(status="ok", loss=loss, tokens=count)
        out.append(entry)
        start = end
    return out


@torch.no_grad()
def _token_losses(model, inputs, labels, batch_size, autocast_dtype) -> torch.Tensor:
    """Cross-entropy of every labelled token ``[N, T]`` (float32, NaN where the label is -100)."""
    device = model_device(model)
    was_training = model.training
    model.eval()
    rows = []
    for part in batch_slices(inputs.shape[0], batch_size):
        part_labels = labels[part].to(device)
        with autocast(device, autocast_dtype):
            logits = model(inputs[part].to(device)).logits
        loss = F.cross_entropy(
            logits.float().transpose(1, 2), part_labels, ignore_index=IGNORE_INDEX, reduction="none"
        )
        rows.append(torch.where(part_labels == IGNORE_INDEX, float("nan"), loss).cpu())
    model.train(was_training)
    return torch.cat(rows)


def peak_memory(device: torch.device) -> dict:
    """Peak memory: CUDA ``max_memory_allocated`` since the last reset (per run), or on CPU the
    peak resident set size of the whole process so far (``getrusage``; not per run)."""
    if device.type == "cuda":
        return {
            "kind": "cuda_max_memory_allocated",
            "megabytes": torch.cuda.max_memory_allocated(device) / 2**20,
        }
    try:
        import resource  # Unix only
    except ImportError:
        return {"kind": "unavailable", "megabytes": None, "note": "no getrusage on this system"}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1.0 if sys.platform == "darwin" else 1024.0  # macOS reports bytes, Linux kilobytes
    return {
        "kind": "cpu_process_peak_rss",
        "megabytes": rss * scale / 2**20,
        "note": "peak resident memory of the whole process so far, not of this run alone",
    }


def probe_inputs(
    probe: ProbeBatch, objective: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Model inputs for a probe: ``(input_ids [N, T'], labels [N, T'], score_index [N])``.

    * ``clm``: inputs are ``input_ids[:, :-1]``; the labels are the answer span's tokens at the
      positions that predict them (``answer_index - 1 ...``), -100 elsewhere; the prediction at
      ``score_index = answer_index - 1`` decides.
    * ``mlm``: the answer span is replaced by ``MASK`` and labelled with its tokens; the
      prediction at ``score_index = answer_index`` decides.
    """
    ids = probe.input_ids
    n = ids.shape[0]
    span = probe.answer_index[:, None] + torch.arange(probe.answer_len)[None, :]  # [N, span]
    rows = torch.arange(n)[:, None]
    if objective == "clm":
        inputs = ids[:, :-1].clone()
        labels = torch.full_like(inputs, IGNORE_INDEX)
        labels[rows, span - 1] = ids[rows, span]
        return inputs, labels, probe.answer_index - 1
    if objective == "mlm":
        inputs = ids.clone()
        inputs[rows, span] = MASK_ID
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[rows, span] = ids[rows, span]
        return inputs, labels, probe.answer_index.clone()
    raise ValueError(f"unknown objective {objective!r}; valid: 'mlm', 'clm'")


@torch.no_grad()
def probe_correct(
    model: MiniBert, probe: ProbeBatch, *, batch_size: int = 256, autocast_dtype: str | None = None
) -> torch.Tensor:
    """Bool ``[N]``: whether the model picks the right candidate for each probe example."""
    device = model_device(model)
    inputs, _, score_index = probe_inputs(probe, model.config.objective)
    was_training = model.training
    model.eval()
    scored = []
    for part in batch_slices(len(probe), batch_size):
        with autocast(device, autocast_dtype):
            logits = model(inputs[part].to(device)).logits
        rows = torch.arange(logits.shape[0], device=device)
        scored.append(logits[rows, score_index[part].to(device)].float().cpu())  # [n, vocab]
    model.train(was_training)
    return probe.choose(torch.cat(scored)) == probe.answer_id
