"""A task where counting matters: "the word k words back", with fillers in random places.

Each sequence is ``seq_len`` tokens: a word (``0 .. num_words-1``) or, with probability
``filler_rate``, the filler token ``num_words``. At every word that has at least ``k`` words
before it, the target is the word ``k`` words back, fillers skipped; elsewhere the target is -100
(ignored). Because the fillers fall at random, the word ``k`` words back is a varying number of
*tokens* back: an encoding that measures distance in tokens (RoPE) has to guess, one that counts
what its gates select (CoPE, gates on the words) can read it off.

``python -m course_lib.teaching.counting_task`` trains the same one-layer causal model with each
encoding of :data:`ENCODINGS` for each of :data:`SEEDS` (seeded: the seed sets the model's
initialisation and the training batches; a few seconds per model on one CPU core), probes every
CoPE model's gates and writes ``figures/08_counting/results.json``; notebook 08 reads it and
re-trains the CoPE model of seed 0 live.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from course_lib.model import BertConfig, MiniBert

__all__ = [
    "ENCODINGS",
    "SEEDS",
    "CountingTaskConfig",
    "TrainedCountingModel",
    "accuracy",
    "counting_batch",
    "gate_probe",
    "layer_scores",
    "target_index",
    "train_counting_model",
    "run_experiment",
]

IGNORE_INDEX = -100
# The runs of the committed experiment: (name in the results, encoding, layers).
ENCODINGS: tuple[tuple[str, str, int], ...] = (
    ("none", "none", 1),
    ("rope", "rope", 1),
    ("fox", "fox", 1),
    ("cope", "cope", 1),
    ("rope, 2 layers", "rope", 2),
)
RESULTS = Path("08_counting") / "results.json"
SEEDS = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class CountingTaskConfig:
    """Sizes of the task and of the small causal model that learns it."""

    num_words: int = 16
    filler_rate: float = 0.4
    k: int = 2
    seq_len: int = 32
    hidden_size: int = 32
    num_heads: int = 2
    npos: int = 8  # CoPE's largest count (the task needs k + 1)
    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 3e-3
    eval_examples: int = 256
    seed: int = 0

    @property
    def vocab_size(self) -> int:
        return self.num_words + 1  # the words and the filler

    @property
    def filler(self) -> int:
        return self.num_words


@dataclass
class TrainedCountingModel:
    name: str
    model: MiniBert
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def counting_batch(
    generator: torch.Generator, batch_size: int, seq_len: int, config: CountingTaskConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, targets)``, both long ``[batch_size, seq_len]``.

    ``targets[b, t]`` = the word ``k`` words before the word at ``t`` (fillers skipped), or -100
    at fillers and at the first ``k`` words.
    """
    filler = torch.rand(batch_size, seq_len, generator=generator) < config.filler_rate
    words = torch.randint(0, config.num_words, (batch_size, seq_len), generator=generator)
    ids = torch.where(filler, config.filler, words)
    is_word = ~filler
    # word number of each token (0 for the first word), then the token index of every word
    word_number = is_word.long().cumsum(1) - 1  # [B, L]
    index_of_word = torch.full((batch_size, seq_len), -1, dtype=torch.long)
    rows, cols = is_word.nonzero(as_tuple=True)
    index_of_word[rows, word_number[rows, cols]] = cols
    source_word = word_number - config.k  # the word k back
    has_target = is_word & (source_word >= 0)
    source_index = index_of_word.gather(1, source_word.clamp(min=0))
    targets = torch.where(has_target, ids.gather(1, source_index.clamp(min=0)), IGNORE_INDEX)
    return ids, targets


def _build(encoding: str, layers: int, config: CountingTaskConfig) -> MiniBert:
    options = {"npos": config.npos} if encoding == "cope" else None
    return MiniBert(
        BertConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=layers,
            num_heads=config.num_heads,
            intermediate_size=2 * config.hidden_size,
            max_position_embeddings=4 * config.seq_len,
            encoding=encoding,
            encoding_options=options,
            objective="clm",
        )
    )


def train_counting_model(
    encoding: str, config: CountingTaskConfig, layers: int = 1, name: str | None = None
) -> TrainedCountingModel:
    """Train a causal :class:`MiniBert` with ``encoding`` (seeded: same numbers on one machine).

    AdamW, constant learning rate, fresh random batches every step; the loss is the
    cross-entropy at the positions that have a target.
    """
    torch.manual_seed(config.seed)
    model = _build(encoding, layers, config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed + 1)
    result = TrainedCountingModel(name or encoding, model)
    start = time.perf_counter()
    for _ in range(config.steps):
        ids, targets = counting_batch(generator, config.batch_size, config.seq_len, config)
        loss = model(ids, labels=targets).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        result.losses.append(float(loss.detach()))
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


@torch.no_grad()
def accuracy(
    model: MiniBert, config: CountingTaskConfig, seq_len: int | None = None, seed: int = 99
) -> float:
    """Held-out accuracy over the positions with a target (``seq_len`` default: training's)."""
    generator = torch.Generator().manual_seed(seed)
    ids, targets = counting_batch(
        generator, config.eval_examples, seq_len or config.seq_len, config
    )
    predictions = model(ids).logits.argmax(-1)
    scored = targets != IGNORE_INDEX
    return float(((predictions == targets) & scored).sum() / scored.sum())


def _layer_input(model: MiniBert, ids: torch.Tensor, layer: int):
    """The normalised hidden states ``[batch, seq, hidden]`` that reach one layer's attention."""
    captured = []
    attention = model.layers[layer].attention
    handle = attention.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    try:
        model(ids)
    finally:
        handle.remove()
    return captured[0]


def _heads(attention, x: torch.Tensor) -> torch.Tensor:
    """``[batch, seq, hidden] -> [batch, heads, seq, head_dim]``."""
    return x.view(*x.shape[:2], attention.num_heads, attention.head_dim).transpose(1, 2)


@torch.no_grad()
def layer_scores(model: MiniBert, ids: torch.Tensor, layer: int = 0):
    """One layer's attention on ``ids``: the scaled scores ``[batch, heads, seq, seq]``, q
    ``[batch, heads, seq, head_dim]`` and the attention weights ``[batch, heads, seq, seq]``
    (its own projections of its own normalised input)."""
    from course_lib.attention import attention_weights

    attention = model.layers[layer].attention
    hidden = _layer_input(model, ids, layer)
    q, k = _heads(attention, attention.query(hidden)), _heads(attention, attention.key(hidden))
    weights = attention_weights(
        q, k, method=attention.spec.method, causal=True, **attention.attention_params(hidden)
    )
    return q @ k.transpose(-1, -2) / attention.head_dim**0.5, q, weights


def target_index(
    ids: torch.Tensor, targets: torch.Tensor, config: CountingTaskConfig
) -> torch.Tensor:
    """The token index of each position's target word (the word ``k`` words back), -1 where
    there is no target: long ``[batch, seq]`` (vectorised, as :func:`counting_batch` builds the
    targets)."""
    is_word = ids != config.filler
    word_number = is_word.long().cumsum(1) - 1
    index_of_word = torch.full_like(ids, -1)
    rows, cols = is_word.nonzero(as_tuple=True)
    index_of_word[rows, word_number[rows, cols]] = cols
    source = index_of_word.gather(1, (word_number - config.k).clamp(min=0))
    return torch.where(targets != IGNORE_INDEX, source, -1)


@torch.no_grad()
def gate_probe(model: MiniBert, config: CountingTaskConfig, seed: int = 7) -> dict:
    """What the CoPE layer's gates count, on a held-out batch of 64 sequences, per head.

    ``gate_on_words`` / ``gate_on_fillers``: the mean gate ``sigmoid(s_ij)`` of queries that are
    words (``j <= i``) on word keys / on filler keys. ``count_vs_words`` / ``count_vs_tokens``:
    the correlation, over those pairs, of the count ``p_ij`` (before clamping) with the number of
    words in ``j..i`` and with the number of tokens ``i - j + 1``. ``attention_at_target``: the
    mean attention weight on the word ``k`` back (the target). ``count_at_target``: the mean
    count ``p_ij`` (clamped at ``npos - 1``, as the model uses it) of the target key, over every
    query with a target; ``count_at_target_range``: the smallest and largest of its per-sequence
    means.
    """
    generator = torch.Generator().manual_seed(seed)
    ids, targets = counting_batch(generator, 64, config.seq_len, config)
    scores, _q, weights = layer_scores(model, ids)
    seq = ids.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    gates = torch.sigmoid(scores) * causal
    counts = gates.flip(-1).cumsum(-1).flip(-1)  # [B, H, L, L]
    is_word = ids != config.filler  # [B, L]
    words_between = (is_word[:, None, :] & causal).long().flip(-1).cumsum(-1).flip(-1)
    distance = torch.arange(seq)[:, None] - torch.arange(seq)[None, :] + 1
    tokens_between = distance.expand(ids.shape[0], seq, seq)
    pairs = is_word[:, :, None] & causal  # word queries, keys up to the query
    source = target_index(ids, targets, config)  # [B, L]
    has_target = source >= 0
    per_head = []
    for h in range(scores.shape[1]):
        p = counts[:, h][pairs].double()

        def correlation(other, p=p):
            return float(torch.corrcoef(torch.stack((p, other[pairs].double())))[0, 1])

        at = source.clamp(min=0)[..., None]  # [B, L, 1]
        target_count = counts[:, h].gather(-1, at)[..., 0].clamp(max=config.npos - 1)  # [B, L]
        target_weight = weights[:, h].gather(-1, at)[..., 0]
        per_sequence = (target_count * has_target).sum(1) / has_target.sum(1).clamp(min=1)
        per_head.append(
            {
                "gate_on_words": float(gates[:, h][pairs & is_word[:, None, :]].mean()),
                "gate_on_fillers": float(gates[:, h][pairs & ~is_word[:, None, :]].mean()),
                "count_vs_words": correlation(words_between),
                "count_vs_tokens": correlation(tokens_between),
                "attention_at_target": float(target_weight[has_target].mean()),
                "count_at_target": float(target_count[has_target].mean()),
                "count_at_target_range": [
                    float(per_sequence[has_target.any(1)].min()),
                    float(per_sequence[has_target.any(1)].max()),
                ],
            }
        )
    return {"heads": per_head}


def run_experiment(config: CountingTaskConfig, seeds: tuple[int, ...] = SEEDS) -> dict:
    """Train every run of :data:`ENCODINGS` with every seed (``config.seed`` replaced by it);
    accuracies, times, and the gate probe of every CoPE model."""
    runs: dict[str, dict] = {}
    probes = {}
    for seed in seeds:
        seeded = replace(config, seed=seed)
        for name, encoding, layers in ENCODINGS:
            trained = train_counting_model(encoding, seeded, layers=layers, name=name)
            entry = runs.setdefault(
                name,
                {"encoding": encoding, "layers": layers,
                 "parameters": sum(p.numel() for p in trained.model.parameters()), "seeds": []},
            )  # fmt: skip
            entry["seeds"].append(
                {
                    "seed": seed,
                    "accuracy": round(accuracy(trained.model, seeded), 4),
                    "accuracy_2x_length": round(
                        accuracy(trained.model, seeded, 2 * seeded.seq_len), 4
                    ),
                    "final_loss": round(sum(trained.losses[-20:]) / 20, 4),
                    "seconds": round(trained.seconds, 1),
                }
            )
            print(f"seed {seed} {name:15s} accuracy {entry['seeds'][-1]['accuracy']:.3f}")
            if encoding == "cope":
                probes[str(seed)] = gate_probe(trained.model, seeded)
    return {"config": asdict(config), "seeds": list(seeds), "runs": runs, "cope_probe": probes}


def main(argv: list[str] | None = None) -> None:
    from course_lib.teaching.notebook import REPO_ROOT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "figures" / RESULTS)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = run_experiment(CountingTaskConfig(), tuple(args.seeds))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
