"""A mini BERT whose attention layers are chosen by encoding name.

``MiniBert(config)`` maps token ids ``[batch, seq]`` to logits ``[batch, seq, vocab]``:
token embedding -> ``num_layers`` pre-norm transformer layers (attention from
``get_attention_class(config.encoding)``, then a GELU feed-forward) -> final LayerNorm -> a head.

* ``objective="mlm"``: bidirectional attention and a BERT-style masked-LM head
  (dense, GELU, LayerNorm, then the tied output projection).
* ``objective="clm"``: causal attention and a plain tied projection; ``labels[t]`` is the token
  that follows position ``t``. Supports incremental decoding with a key/value cache whose
  position ids continue from the prefix (see :meth:`MiniBert.generate`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import BACKENDS, get_attention_class
from course_lib.checks import check_choice, check_int, check_integer_tensor, check_real
from course_lib.layers import KVCache
from course_lib.registry import get_encoding

__all__ = ["BertConfig", "MiniBert", "ModelOutput", "OBJECTIVES"]

OBJECTIVES = ("mlm", "clm")

#: The label that marks a position with nothing to predict (PyTorch's ``ignore_index``).
IGNORE_LABEL = -100

#: Standard deviation of every linear and embedding weight at initialisation (BERT's).
INIT_STD = 0.02


@dataclass
class BertConfig:
    """Sizes and choices of a :class:`MiniBert`."""

    vocab_size: int
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int | None = None  # default 4 * hidden_size
    max_position_embeddings: int = 512
    encoding: str = "rope"
    # extra keyword arguments of the encoding's attention module, e.g. {"scaling": {...}} for RoPE
    encoding_options: dict | None = None
    objective: str = "mlm"
    dropout: float = 0.0
    backend: str = "reference"

    def __post_init__(self) -> None:
        check_choice("objective", self.objective, OBJECTIVES)
        get_attention_class(self.encoding)  # validates the name
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads"):
            setattr(self, name, check_int(f"BertConfig {name}", getattr(self, name), minimum=1))
        self.max_position_embeddings = check_int(
            "BertConfig max_position_embeddings", self.max_position_embeddings, minimum=1
        )
        if self.intermediate_size is not None:
            self.intermediate_size = check_int(
                "BertConfig intermediate_size", self.intermediate_size, minimum=1
            )
        self.dropout = check_real("BertConfig dropout", self.dropout, at_least=0.0)
        if not self.dropout < 1.0:
            raise ValueError(f"BertConfig dropout must be in [0, 1), got {self.dropout}")
        check_choice("backend", self.backend, BACKENDS)
        if self.encoding_options is not None and not isinstance(self.encoding_options, dict):
            raise TypeError(
                "encoding_options must be None or a dict of keyword arguments for the encoding's "
                f"attention module (e.g. {{'scaling': {{...}}}} for RoPE), got "
                f"{self.encoding_options!r}"
            )
        if self.objective == "mlm" and get_encoding(self.encoding).causal_only:
            raise ValueError(
                f"encoding {self.encoding!r} is causal only and the masked-LM objective attends "
                "both ways: use objective='clm'"
            )
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size

    def to_dict(self) -> dict:
        return asdict(self)


def _check_ids(input_ids: torch.Tensor, labels: object, vocab: int) -> None:
    """Token ids in ``[0, vocab)``; integer labels shaped like them: ids in ``[0, vocab)`` or
    -100, at least one id. Their values are read back once (each read waits for a GPU)."""
    if labels is not None:
        check_integer_tensor(labels, "labels")
        if labels.shape != input_ids.shape:
            raise ValueError(
                f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got "
                f"{tuple(labels.shape)}"
            )
        if labels.device != input_ids.device:
            raise ValueError(
                f"labels are on {labels.device} but input_ids are on {input_ids.device}"
            )
    flags = []
    if input_ids.numel():
        flags.append((input_ids.max() >= vocab) | (input_ids.min() < 0))
    if labels is not None:
        scored = labels != IGNORE_LABEL
        outside = scored & ((labels < 0) | (labels >= vocab))
        flags += [~scored.any(), outside.any()]
    if not flags:
        return
    read = torch.stack(flags).tolist()  # one sync
    if input_ids.numel() and read.pop(0):
        raise ValueError(
            f"input_ids must be in [0, {vocab}), got values from {int(input_ids.min())} to "
            f"{int(input_ids.max())}"
        )
    if labels is None:
        return
    nothing_scored, any_outside = read
    if nothing_scored:
        raise ValueError(
            f"every label is {IGNORE_LABEL} (ignored), so the loss would be a mean over no tokens "
            f"(NaN): give at least one label in [0, {vocab}), or labels=None for logits only"
        )
    if any_outside:
        raise ValueError(f"labels must be token ids in [0, {vocab}) or {IGNORE_LABEL} (ignored)")


class ModelOutput(NamedTuple):
    logits: torch.Tensor  # [batch, seq, vocab]
    loss: torch.Tensor | None  # mean cross-entropy over labels != -100


class TransformerLayer(nn.Module):
    """Pre-norm block: ``h + Attn(LN(h))``, then ``h + FF(LN(h))``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        attention_class = get_attention_class(config.encoding)
        self.attention_norm = nn.LayerNorm(config.hidden_size)
        self.attention = attention_class(
            config.hidden_size,
            config.num_heads,
            max_position_embeddings=config.max_position_embeddings,
            dropout=config.dropout,
            backend=config.backend,
            **(config.encoding_options or {}),
        )
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size)
        self.feed_forward = nn.Sequential(
            nn.Linear(config.hidden_size, config.intermediate_size),
            nn.GELU(),
            nn.Linear(config.intermediate_size, config.hidden_size),
            nn.Dropout(config.dropout),
        )

    def forward(self, h, attention_mask, causal, position_ids, cache):
        h = h + self.attention(self.attention_norm(h), attention_mask, causal, position_ids, cache)
        return h + self.feed_forward(self.feed_forward_norm(h))


class MiniBert(nn.Module):
    """Token ids ``[batch, seq]`` -> logits ``[batch, seq, vocab]`` (see the module docstring)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size)
        if config.objective == "mlm":
            self.head_transform = nn.Sequential(
                nn.Linear(config.hidden_size, config.hidden_size),
                nn.GELU(),
                nn.LayerNorm(config.hidden_size),
            )
        else:
            self.head_transform = nn.Identity()
        self.head_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.apply(self._init_weights)
        for module in self.modules():  # a module whose own init differs from the model's
            if module is not self and hasattr(module, "finish_init"):
                module.finish_init(INIT_STD)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=INIT_STD)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def causal(self) -> bool:
        return self.config.objective == "clm"

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: list[KVCache] | None = None,
    ) -> ModelOutput:
        """Logits and (given ``labels``, -100 = ignore) the mean cross-entropy.

        An empty batch or sequence gives empty logits (``[batch, 0, vocab]`` or
        ``[0, seq, vocab]``); a loss needs at least one label that is not -100.
        """
        check_integer_tensor(input_ids, "input_ids (token ids)")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        _check_ids(input_ids, labels, self.config.vocab_size)
        if cache is not None:
            if not self.causal:
                raise ValueError("a key/value cache is for causal decoding: use objective='clm'")
            if not isinstance(cache, (list, tuple)) or not all(
                isinstance(c, KVCache) for c in cache
            ):
                raise TypeError(
                    "cache must be a list of KVCache, one per layer (model.new_cache()), got "
                    f"{type(cache).__name__}"
                )
            if len(cache) != len(self.layers):
                raise ValueError(
                    f"cache must hold one KVCache per layer ({len(self.layers)}), got {len(cache)}"
                )
        h = self.embedding_dropout(self.token_embeddings(input_ids))
        for i, layer in enumerate(self.layers):
            h = layer(
                h, attention_mask, self.causal, position_ids, None if cache is None else cache[i]
            )
        h = self.head_transform(self.final_norm(h))
        logits = F.linear(h, self.token_embeddings.weight, self.head_bias)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_LABEL
            )
        return ModelOutput(logits, loss)

    # -- decoding --------------------------------------------------------------------------------
    def new_cache(self) -> list[KVCache]:
        """One empty :class:`KVCache` per layer."""
        return [KVCache() for _ in self.layers]

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``prompt_ids`` ``[batch, prompt]`` by ``max_new_tokens`` with a key/value cache.

        The prompt is encoded once; each new token is then fed alone at position
        ``cache.length`` (the layers default to ``past + 0..seq-1``), so its rotation or table
        row is the one it would get in a full forward pass. ``temperature=0`` is greedy.
        With ``backend="triton"`` the prompt runs the fused kernel and each cached step (one query
        against the cache, which the kernels do not take) runs the reference code of the same
        function. ``max_new_tokens`` is an integer >= 0, ``temperature`` a finite number >= 0
        and ``prompt_ids`` needs at least one token per row (an empty batch gives an empty
        answer).
        """
        if not self.causal:
            raise ValueError("generate() needs a causal model (objective='clm')")
        check_integer_tensor(prompt_ids, "prompt_ids (token ids)")
        if prompt_ids.dim() != 2 or prompt_ids.shape[1] < 1:
            raise ValueError(
                "prompt_ids must be [batch, prompt] with at least one token per row (each new "
                f"token continues from the last one), got shape {tuple(prompt_ids.shape)}"
            )
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=0)
        temperature = check_real("temperature (0 = greedy, > 0 samples)", temperature, at_least=0.0)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")
        cache = self.new_cache()
        logits = self(prompt_ids, cache=cache).logits[:, -1]
        out = [prompt_ids]
        for _ in range(max_new_tokens):
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)
            else:
                token = logits.argmax(-1, keepdim=True)
            out.append(token)
            logits = self(token, cache=cache).logits[:, -1]
        return torch.cat(out, dim=1)

    # -- bookkeeping -----------------------------------------------------------------------------
    def parameter_counts(self) -> dict[str, int]:
        """Trainable parameters by part (the output projection is tied to the token embedding)."""
        parts = {
            "token_embeddings": 0,
            "position_embeddings": 0,
            "attention": 0,
            "feed_forward": 0,
            "layer_norms": 0,
            "head": 0,
        }
        for name, p in self.named_parameters():
            if "position_embeddings" in name:
                part = "position_embeddings"
            elif name.startswith("token_embeddings"):
                part = "token_embeddings"
            elif ".attention." in name:
                part = "attention"
            elif ".feed_forward." in name:
                part = "feed_forward"
            elif name.startswith("head"):
                part = "head"
            else:
                part = "layer_norms"
            parts[part] += p.numel()
        parts["total"] = sum(parts.values())
        return parts

    def resize_position_tables(self, new_size: int) -> None:
        """Opt-in for learned positions: stretch every layer's table to ``new_size`` rows."""
        tables = [
            layer.attention
            for layer in self.layers
            if hasattr(layer.attention, "resize_position_table")
        ]
        if not tables:
            raise ValueError(
                f"encoding {self.config.encoding!r} has no learned position table to resize"
            )
        for attention in tables:
            attention.resize_position_table(new_size)
