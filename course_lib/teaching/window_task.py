"""A tiny synthetic task where position matters, and a short loop that trains a model on it.

The task, "window max": the input is ``seq_len`` random tokens ``0..vocab_size-1``; the target at
position ``t`` is the largest token in the window ``t - half_width .. t + half_width``. Positions
whose window does not fit in the sequence get the ignore label -100. To solve it, a token must
attend to its neighbours and to nothing else, so the model has to know where every token is:
without a position signal it can only guess from the whole bag of tokens.

Everything random takes a seed, so a run gives the same numbers every time on one machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from course_lib.model import BertConfig, MiniBert

__all__ = [
    "IGNORE_INDEX",
    "WindowTaskConfig",
    "TrainedWindowModel",
    "window_max_batch",
    "position_table",
    "evaluate_by_position",
    "attention_beyond",
    "train_window_model",
]

IGNORE_INDEX = -100


@dataclass(frozen=True)
class WindowTaskConfig:
    """Sizes of the task and of the one-layer model that learns it."""

    vocab_size: int = 16
    half_width: int = 2
    train_length: int = 32
    max_position_embeddings: int = 48
    hidden_size: int = 32
    num_heads: int = 4
    steps: int = 600
    batch_size: int = 32
    learning_rate: float = 1e-2
    eval_every: int = 50
    seed: int = 0


@dataclass
class TrainedWindowModel:
    """A trained model, its accuracy curve and (for learned positions) snapshots of its table."""

    encoding: str
    model: MiniBert
    steps: list[int] = field(default_factory=list)  # where the curve was measured
    accuracy: list[float] = field(default_factory=list)  # held-out accuracy at those steps
    table_snapshots: list[torch.Tensor] = field(default_factory=list)  # [max_positions, hidden]


def window_max_batch(
    generator: torch.Generator, batch_size: int, seq_len: int, vocab_size: int, half_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens and window-max targets: ``(input_ids [B, L], labels [B, L])`` (long).

    ``labels[b, t] = max(input_ids[b, t - w : t + w + 1])`` for ``w <= t < L - w``, else -100.
    """
    if seq_len <= 2 * half_width:
        raise ValueError(
            f"seq_len ({seq_len}) must exceed 2 * half_width ({2 * half_width}) so that some "
            "window fits inside the sequence"
        )
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)
    padded = F.pad(ids, (half_width, half_width), value=-1)
    labels = padded.unfold(1, 2 * half_width + 1, 1).max(dim=-1).values.clone()
    labels[:, :half_width] = IGNORE_INDEX
    labels[:, seq_len - half_width :] = IGNORE_INDEX
    return ids, labels


def position_table(model: MiniBert, layer: int = 0) -> torch.Tensor:
    """A copy of the learned position table of one layer: ``[max_positions, hidden]``."""
    attention = model.layers[layer].attention
    if not hasattr(attention, "position_embeddings"):
        raise ValueError(f"encoding {model.config.encoding!r} has no learned position table")
    return attention.position_embeddings.weight.detach().clone()


@torch.no_grad()
def evaluate_by_position(
    model: MiniBert, seq_len: int, config: WindowTaskConfig, num_examples: int = 256, seed: int = 2
) -> torch.Tensor:
    """Held-out accuracy at each position: ``[seq_len]`` (NaN where no target exists)."""
    generator = torch.Generator().manual_seed(seed)
    ids, labels = window_max_batch(
        generator, num_examples, seq_len, config.vocab_size, config.half_width
    )
    predictions = model(ids).logits.argmax(dim=-1)
    scored = labels != IGNORE_INDEX
    correct = ((predictions == labels) & scored).sum(dim=0).float()
    return correct / scored.sum(dim=0).float()  # 0/0 = NaN at the edges


@torch.no_grad()
def attention_beyond(
    model: MiniBert,
    seq_len: int,
    config: WindowTaskConfig,
    first: int,
    num_examples: int = 256,
    seed: int = 2,
) -> torch.Tensor:
    """Attention weight each query puts on the keys at positions ``>= first``: ``[seq_len]``.

    Layer 0 of a model with an additive encoding (``absolute`` or ``learned``), on the same
    held-out batch as :func:`evaluate_by_position`; the weights ``softmax(q k^T / sqrt(d))`` of
    the layer's own projections, summed over those keys and averaged over heads and examples.
    """
    from course_lib.attention import attention_weights

    attention = model.layers[0].attention
    captured = []
    handle = attention.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    try:
        generator = torch.Generator().manual_seed(seed)
        ids, _ = window_max_batch(
            generator, num_examples, seq_len, config.vocab_size, config.half_width
        )
        model(ids)
    finally:
        handle.remove()
    hidden = captured[0]  # [batch, seq, hidden], the layer's (normalised) input
    h_qk, _ = attention.add_positions(hidden, torch.arange(seq_len))

    def heads(x: torch.Tensor) -> torch.Tensor:  # [batch, seq, hidden] -> [batch, heads, seq, d]
        return x.view(*x.shape[:2], attention.num_heads, attention.head_dim).transpose(1, 2)

    weights = attention_weights(heads(attention.query(h_qk)), heads(attention.key(h_qk)))
    return weights[..., first:].sum(-1).mean(dim=(0, 1))  # [seq_len]


def _overall(accuracy_by_position: torch.Tensor) -> float:
    return float(accuracy_by_position.nanmean())


def train_window_model(encoding: str, config: WindowTaskConfig) -> TrainedWindowModel:
    """Train a one-layer :class:`MiniBert` with the given position ``encoding`` on window max.

    Sequences are always ``config.train_length`` long, so rows of a learned table past that
    length never receive a gradient. AdamW without weight decay, constant learning rate.
    """
    torch.manual_seed(config.seed)
    model = MiniBert(
        BertConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=1,
            num_heads=config.num_heads,
            intermediate_size=2 * config.hidden_size,
            max_position_embeddings=config.max_position_embeddings,
            encoding=encoding,
            objective="mlm",
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed + 1)
    result = TrainedWindowModel(encoding, model)
    learned = encoding == "learned"
    if learned:
        result.table_snapshots.append(position_table(model))
    for step in range(1, config.steps + 1):
        ids, labels = window_max_batch(
            generator, config.batch_size, config.train_length, config.vocab_size, config.half_width
        )
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % config.eval_every == 0:
            model.eval()
            result.steps.append(step)
            result.accuracy.append(
                _overall(evaluate_by_position(model, config.train_length, config, 128))
            )
            model.train()
            if learned:
                result.table_snapshots.append(position_table(model))
    model.eval()
    return result
