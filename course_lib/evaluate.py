"""Evaluation of a :class:`~course_lib.model.MiniBert`: held-out loss, length extrapolation,
probe scoring and cost.

* :func:`evaluate_loss`: mean cross-entropy in nats per predicted token over fixed, non-overlapping
  validation windows (next token for ``clm``; the masked tokens only, with seeded masks, for
  ``mlm``). :func:`bits_per_byte` converts: ``loss / ln 2`` (one token is one UTF-8 byte, i.e. one
  character for ASCII text).
* :func:`heldout_loss`: the loss on held-out windows, one unit per window (summed over several
  mask draws for ``mlm``), so a report can bootstrap the evaluation text's own noise;
* :func:`shift_and_context_losses`: past the training length, on the same targets, what far
  positions cost with the training length's context and what a long context adds; a learned
  table reports "not applicable" past its last row instead of crashing or clipping.
* :func:`probe_inputs` / :func:`probe_scores` / :func:`probe_correct`: a probe's examples as
  model inputs, the candidates' logits, and whether the answer is strictly the best (a tie is
  wrong; the fine-tune before it is :func:`course_lib.train.probe_finetune`).
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
    "heldout_loss",
    "peak_memory",
    "position_limit",
    "probe_correct",
    "probe_inputs",
    "probe_scores",
    "shift_and_context_losses",
    "spread_windows",
    "unit_entry",
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
    part of the validation text. ``tokens`` may instead be windows ``[N, seq_len + 1]`` already
    cut (:func:`course_lib.data.segment_windows`), of which ``max_windows`` are spread the same
    way. ``clm`` predicts every next token; ``mlm`` masks each batch of
    windows with :func:`~course_lib.data.mask_tokens` from a generator seeded by ``mask_seed``
    and is scored on the masked tokens only. Returns ``(sum of losses / count, count)``.
    """
    if tokens.dim() == 2:
        if tokens.shape[1] != seq_len + 1:
            raise ValueError(f"windows must be [N, {seq_len + 1}], got {tuple(tokens.shape)}")
        picks = torch.arange(tokens.shape[0])
        if max_windows is not None and max_windows < tokens.shape[0]:
            picks = torch.linspace(0, tokens.shape[0] - 1, max_windows).round().long()
        inputs, targets = tokens[picks, :-1], tokens[picks, 1:]
    else:
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


def _check_offsets(offsets: tuple[int, ...], train_len: int, long_len: int) -> None:
    if not offsets or any(
        isinstance(o, bool)
        or not isinstance(o, int)
        or o < 1
        or o % train_len
        or o + train_len > long_len
        for o in offsets
    ):
        raise ValueError(
            f"offsets must be multiples of {train_len} with offset + {train_len} <= "
            f"{long_len}, got {offsets}"
        )


def unit_entry(sums: torch.Tensor, counts: torch.Tensor) -> dict:
    """A results entry from per-unit summed losses and target counts (``[U]`` each):
    ``{"status": "ok", "loss": sum / count, "tokens", "unit_sums", "unit_counts"}``; units
    with no target are left out. The per-unit values let a report bootstrap the evaluation
    text's own noise (resampling units)."""
    keep = counts > 0
    sums, counts = sums[keep].double(), counts[keep].long()
    total = int(counts.sum())
    return {
        "status": "ok",
        "loss": float(sums.sum()) / max(total, 1),
        "tokens": total,
        "unit_sums": [round(v, 5) for v in sums.tolist()],
        "unit_counts": counts.tolist(),
    }


def _masked_draws(
    windows: torch.Tensor, draws: int, mask_prob: float, mask_seed: int, batch_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``draws`` BERT maskings ``(inputs, labels)`` of ``windows`` ``[W, T]``, from one
    generator seeded ``mask_seed`` (the same for every model, so every model is scored on the
    same targets)."""
    generator = torch.Generator().manual_seed(mask_seed)
    return [_mask_in_batches(windows, generator, mask_prob, batch_size) for _ in range(draws)]


def heldout_loss(
    model: MiniBert,
    windows: torch.Tensor,
    *,
    mask_draws: int = 4,
    mask_prob: float = 0.15,
    mask_seed: int = 1234,
    batch_size: int = 16,
    autocast_dtype: str | None = None,
) -> dict:
    """The loss on held-out windows ``[W, L + 1]`` (e.g. from
    :func:`course_lib.data.segment_windows`) at their length ``L``, per window.

    ``clm``: inputs ``windows[:, :-1]``, labels ``windows[:, 1:]`` (every next byte). ``mlm``:
    ``windows[:, :-1]`` masked ``mask_draws`` times (:func:`_masked_draws`), each draw scored on
    its masked bytes; a window's sum and count add over the draws, so a window stays one unit
    for the bootstrap. Returns :func:`unit_entry`."""
    if model.config.objective == "clm":
        draws = [(windows[:, :-1], windows[:, 1:])]
    else:
        draws = _masked_draws(windows[:, :-1], mask_draws, mask_prob, mask_seed, batch_size)
    sums = torch.zeros(windows.shape[0], dtype=torch.float64)
    counts = torch.zeros(windows.shape[0], dtype=torch.long)
    for inputs, labels in draws:
        losses = _token_losses(model, inputs, labels, batch_size, autocast_dtype)
        sums += torch.nan_to_num(losses.double()).sum(1)
        counts += (~torch.isnan(losses)).sum(1)
    return unit_entry(sums, counts)


def shift_and_context_losses(
    model: MiniBert,
    windows: torch.Tensor,
    train_len: int,
    offsets: tuple[int, ...] = (64, 128, 256, 448),
    *,
    mask_draws: int = 2,
    mask_prob: float = 0.15,
    mask_seed: int = 4321,
    batch_size: int = 8,
    autocast_dtype: str | None = None,
) -> dict[str, dict]:
    """Past the training length, position and context apart, on the same targets.

    ``windows`` ``[W, M + 1]`` of held-out text (``M`` a multiple of ``train_len``, ``L``).
    For each ``o = kL`` in ``offsets`` (multiples of ``L``), the ``L`` targets at
    ``o .. o + L - 1`` of every window are scored three ways, named by ``k``:

    * ``near@kL``: the block ``o .. o + L - 1`` alone, at positions ``0 .. L - 1`` (the
      training condition: ``L`` tokens of context);
    * ``shift@kL``: the same block alone, at positions ``o .. o + L - 1`` (``position_ids``):
      the same tokens and context, only the positions differ;
    * ``long@kL``: the targets inside the whole window of ``M`` (positions ``o ..``, with every
      token before them, and for ``mlm`` after them, as context).

    ``shift - near`` is what far positions alone cost; ``long - shift`` is what the extra
    context adds or costs at the far positions. Also ``bucket<k>``: the long windows' loss by
    target position, ``0 .. L - 1``, ``L .. 2L - 1``, ``2L .. 4L - 1``, ``4L .. 8L - 1`` (clm:
    a target at ``t`` sees ``t + 1`` tokens, so position and context grow together). ``clm``
    predicts each next byte (labels ``windows[:, 1:]``); ``mlm`` masks the long windows
    ``mask_draws`` times and every block and bucket keeps the long window's masks. A model with
    a position table (:func:`position_limit`) reports ``{"status": "not_applicable",
    "reason"}`` for what needs positions past it. ``batch_size``: long windows per forward.
    Returns ``{name: unit_entry(...)}``, one unit per window.
    """
    long_len = windows.shape[1] - 1
    if long_len % train_len:
        raise ValueError(f"the windows' length {long_len} must be a multiple of {train_len}")
    _check_offsets(tuple(offsets), train_len, long_len)
    limit = position_limit(model)
    if model.config.objective == "clm":
        draws = [(windows[:, :-1], windows[:, 1:])]
    else:
        draws = _masked_draws(windows[:, :-1], mask_draws, mask_prob, mask_seed, batch_size)
    count = windows.shape[0]

    def tag(o: int) -> str:
        return f"@{o // train_len}L"

    names = [f"{kind}{tag(o)}" for o in offsets for kind in ("near", "shift", "long")]
    edges = [0, train_len, 2 * train_len, 4 * train_len, 8 * train_len]
    buckets = [(edges[k], edges[k + 1]) for k in range(4) if edges[k + 1] <= long_len]
    names += [f"bucket{k}" for k in range(len(buckets))]
    sums = {n: torch.zeros(count, dtype=torch.float64) for n in names}
    counts = {n: torch.zeros(count, dtype=torch.long) for n in names}

    def add(name: str, losses: torch.Tensor) -> None:
        sums[name] += torch.nan_to_num(losses.double()).sum(1)
        counts[name] += (~torch.isnan(losses)).sum(1)

    def fits(last_position: int) -> bool:
        return limit is None or last_position < limit

    rows = batch_size * (long_len // train_len)  # short blocks: as many tokens per forward

    for inputs, labels in draws:
        if fits(long_len - 1):
            every = _token_losses(model, inputs, labels, batch_size, autocast_dtype)
            for o in offsets:
                add(f"long{tag(o)}", every[:, o : o + train_len])
            for k, (start, end) in enumerate(buckets):
                add(f"bucket{k}", every[:, start:end])
        for o in offsets:
            block, block_labels = inputs[:, o : o + train_len], labels[:, o : o + train_len]
            add(f"near{tag(o)}", _token_losses(model, block, block_labels, rows, autocast_dtype))
            if fits(o + train_len - 1):
                shifted = _token_losses(
                    model, block, block_labels, rows, autocast_dtype,
                    position_ids=torch.arange(o, o + train_len),
                )  # fmt: skip
                add(f"shift{tag(o)}", shifted)
    out = {}
    for name in names:
        if int(counts[name].sum()) == 0:
            out[name] = {
                "status": "not_applicable",
                "reason": f"the position table has {limit} rows; {name} needs positions past it",
            }
        else:
            out[name] = unit_entry(sums[name], counts[name])
    return out


@torch.no_grad()
def _token_losses(
    model, inputs, labels, batch_size, autocast_dtype, position_ids=None
) -> torch.Tensor:
    """Cross-entropy of every labelled token ``[N, T]`` (float32, NaN where the label is
    -100), in eval mode; ``position_ids`` ``[T]`` (default ``0 .. T - 1``)."""
    device = model_device(model)
    was_training = model.training
    model.eval()
    rows = []
    positions = None if position_ids is None else position_ids.to(device)
    for part in batch_slices(inputs.shape[0], batch_size):
        part_labels = labels[part].to(device)
        with autocast(device, autocast_dtype):
            logits = model(inputs[part].to(device), position_ids=positions).logits
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
def probe_scores(
    model: MiniBert, probe: ProbeBatch, *, batch_size: int = 256, autocast_dtype: str | None = None
) -> torch.Tensor:
    """The model's logit of every candidate of every example, ``[N, candidates]`` (float32),
    read where :func:`probe_inputs` says the answer is decided."""
    device = model_device(model)
    inputs, _, score_index = probe_inputs(probe, model.config.objective)
    was_training = model.training
    model.eval()
    scored = []
    for part in batch_slices(len(probe), batch_size):
        with autocast(device, autocast_dtype):
            logits = model(inputs[part].to(device)).logits
        rows = torch.arange(logits.shape[0], device=device)
        at = logits[rows, score_index[part].to(device)].float()  # [n, vocab]
        scored.append(at.gather(1, probe.candidate_ids[part].to(device)).cpu())
    model.train(was_training)
    return torch.cat(scored)


def probe_correct(
    model: MiniBert, probe: ProbeBatch, *, batch_size: int = 256, autocast_dtype: str | None = None
) -> torch.Tensor:
    """Bool ``[N]``: whether the answer's logit is strictly above every other candidate's
    (:func:`probe_scores`). A tie counts as wrong: a model that cannot tell the candidates
    apart scores nothing, whatever order they come in."""
    scores = probe_scores(model, probe, batch_size=batch_size, autocast_dtype=autocast_dtype)
    is_answer = probe.candidate_ids == probe.answer_id[:, None]
    if not bool((is_answer.sum(1) == 1).all()):
        raise ValueError(
            "every probe example must list its answer exactly once among the candidates"
        )
    answer = scores[is_answer]
    others = scores.masked_fill(is_answer, float("-inf")).amax(1)
    return answer > others
