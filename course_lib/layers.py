"""Self-attention modules, one per encoding, behind the registry ``get_attention_class(name)``.

All take ``(hidden_size, num_heads, max_position_embeddings=512, dropout=0.0,
backend="reference")`` and map hidden states ``[batch, seq, hidden]`` to ``[batch, seq, hidden]``
with ``forward(hidden_states, attention_mask=None, causal=False, position_ids=None, cache=None)``.
``attention_mask`` is bool ``[batch, seq]`` (True = real token); ``position_ids`` default to
``cache.length + 0..seq-1``, so a decoding step continues the prefix's positions by construction.

Where the position signal enters:

* none: nowhere (bag of words);
* absolute: the sinusoidal code of each position is added to the hidden states that feed Q and K
  (not V), as in the implementation report;
* learned: a trainable table ``nn.Embedding(max_position_embeddings, hidden)`` is added to the
  hidden states that feed Q, K and V (as in the report); positions past the table raise an error;
* rope / exposb / rse: inside attention, on q and k (see :mod:`course_lib.attention`).

Dropout is applied to the attention output (fused kernels have no dropout on the weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.attention import BACKENDS, attention
from course_lib.checks import check_choice, check_key_padding_mask, check_position_ids
from course_lib.encodings import sinusoidal_embedding

__all__ = [
    "ATTENTION_CLASSES",
    "KVCache",
    "PositionalSelfAttention",
    "NoPositionAttention",
    "AbsoluteAttention",
    "LearnedAttention",
    "RoPEAttention",
    "ExpoSBAttention",
    "RSEAttention",
]


@dataclass
class KVCache:
    """Keys and values seen so far by one attention layer, for incremental (causal) decoding.

    Keys are stored *before* any rotation, with their positions: attention re-encodes them, so a
    new token can never be rotated with the wrong position.
    ``k, v``: ``[batch, heads, length, head_dim]``; ``positions``: ``[batch, length]``;
    ``mask``: ``[batch, length]`` bool or None.
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k, v, positions, mask):
        """Add ``seq`` new keys/values; return everything cached (old then new)."""
        batch, seq = k.shape[0], k.shape[2]
        positions = positions.expand(batch, seq)
        if mask is None and (self.mask is not None):
            mask = torch.ones(batch, seq, dtype=torch.bool, device=k.device)
        if mask is not None and self.k is not None and self.mask is None:
            self.mask = torch.ones(batch, self.length, dtype=torch.bool, device=k.device)
        if self.k is None:
            self.k, self.v, self.positions, self.mask = k, v, positions, mask
        else:
            self.k = torch.cat((self.k, k), dim=2)
            self.v = torch.cat((self.v, v), dim=2)
            self.positions = torch.cat((self.positions, positions), dim=1)
            if mask is not None:
                self.mask = torch.cat((self.mask, mask), dim=1)
        return self.k, self.v, self.positions, self.mask


class PositionalSelfAttention(nn.Module):
    """Multi-head self-attention; subclasses say where the position signal enters.

    Subclasses set ``method`` (the :func:`course_lib.attention.attention` method) and may
    override :meth:`add_positions` (additive encodings) and :meth:`attention_params`.
    """

    encoding: str = ""
    method: str = "softmax"
    uses_position_ids_in_attention: bool = False

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        max_position_embeddings: int = 512,
        dropout: float = 0.0,
        backend: str = "reference",
    ) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if hidden_size % num_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}); "
                f"e.g. num_heads in {[h for h in range(1, 17) if hidden_size % h == 0]}"
            )
        if not isinstance(max_position_embeddings, int) or max_position_embeddings <= 0:
            raise ValueError(
                f"max_position_embeddings must be a positive integer, got {max_position_embeddings!r}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.max_position_embeddings = max_position_embeddings
        self.backend = check_choice("backend", backend, BACKENDS)
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    # -- hooks ---------------------------------------------------------------------------------
    def add_positions(
        self, hidden_states: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the hidden states that feed (Q and K, V). Default: no additive signal."""
        return hidden_states, hidden_states

    def attention_params(self) -> dict:
        """Extra keyword parameters for :func:`course_lib.attention.attention`."""
        return {}

    # -- forward -------------------------------------------------------------------------------
    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        causal: bool = False,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """``[batch, seq, hidden] -> [batch, seq, hidden]``."""
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden_states must be [batch, seq, {self.hidden_size}], "
                f"got {tuple(hidden_states.shape)}"
            )
        batch, seq, _ = hidden_states.shape
        past = 0 if cache is None else cache.length
        if position_ids is None:
            position_ids = torch.arange(past, past + seq, device=hidden_states.device)
        position_ids = check_position_ids(position_ids, batch, seq, hidden_states.device)
        if attention_mask is not None:
            check_key_padding_mask(attention_mask, batch, seq, hidden_states.device)
        h_qk, h_v = self.add_positions(hidden_states, position_ids)
        q = self._split_heads(self.query(h_qk))
        k = self._split_heads(self.key(h_qk))
        v = self._split_heads(self.value(h_v))
        key_positions, key_mask = position_ids, attention_mask
        if cache is not None:
            k, v, key_positions, key_mask = cache.append(k, v, position_ids, attention_mask)
        context = attention(
            q, k, v,
            method=self.method,
            causal=causal,
            key_padding_mask=key_mask,
            position_ids=key_positions if self.uses_position_ids_in_attention else None,
            backend=self.backend,
            **self.attention_params(),
        )  # fmt: skip
        context = context.transpose(1, 2).reshape(batch, seq, self.hidden_size)
        return self.dropout(self.out(context))

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, backend={self.backend!r}"


class NoPositionAttention(PositionalSelfAttention):
    """Softmax attention with no position signal: permutation-equivariant."""

    encoding = "none"


class AbsoluteAttention(PositionalSelfAttention):
    """Sinusoidal codes added to the hidden states that feed Q and K (not V); no parameters."""

    encoding = "absolute"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        if hidden_size % 2:
            raise ValueError(
                f"sinusoidal codes come in (sin, cos) pairs: hidden_size must be even, got {hidden_size}"
            )

    def add_positions(self, hidden_states, position_ids):
        pe = sinusoidal_embedding(position_ids, self.hidden_size).to(hidden_states.dtype)
        return hidden_states + pe, hidden_states


class LearnedAttention(PositionalSelfAttention):
    """A trainable table ``[max_position_embeddings, hidden]`` added to the inputs of Q, K and V."""

    encoding = "learned"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        nn.init.normal_(self.position_embeddings.weight, std=0.02)

    def add_positions(self, hidden_states, position_ids):
        limit = self.position_embeddings.num_embeddings
        if bool((position_ids < 0).any()) or bool((position_ids >= limit).any()):
            raise ValueError(
                f"learned position table has {limit} rows (positions 0..{limit - 1}), got position "
                f"{int(position_ids.max())}. A learned table knows nothing past its last row; "
                "to stretch it on purpose call resize_position_table(new_size) (linear interpolation)."
            )
        h = hidden_states + self.position_embeddings(position_ids).to(hidden_states.dtype)
        return h, h

    @torch.no_grad()
    def resize_position_table(self, new_size: int) -> None:
        """Opt-in: stretch the table to ``new_size`` rows by linear interpolation along positions.

        Row ``r`` of the new table is the old table read at ``r * (old - 1) / (new_size - 1)``.
        """
        if not isinstance(new_size, int) or new_size < 2:
            raise ValueError(f"new_size must be an integer >= 2, got {new_size!r}")
        old = self.position_embeddings.weight  # [old, hidden]
        stretched = F.interpolate(
            old.T.unsqueeze(0), size=new_size, mode="linear", align_corners=True
        )[0].T
        table = nn.Embedding(new_size, self.hidden_size, device=old.device, dtype=old.dtype)
        table.weight.copy_(stretched)
        self.position_embeddings = table
        self.max_position_embeddings = new_size


class RoPEAttention(PositionalSelfAttention):
    """Rotary encoding of q and k (interleaved pairs, base 10000); no parameters."""

    encoding = "rope"
    method = "rope"
    uses_position_ids_in_attention = True

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        if self.head_dim % 2:
            raise ValueError(
                f"{type(self).__name__} rotates channel pairs: head_dim must be even, got {self.head_dim}"
            )


class ExpoSBAttention(RoPEAttention):
    """RoPE with the report's amplitude, band-pass gain and distance factor; no parameters.

    The report also declares per-head ``band_weights`` and ``decay_rates`` but never wires them
    into its kernel; they are not offered here rather than offered and ignored.
    """

    encoding = "exposb"
    method = "exposb"


class RSEAttention(RoPEAttention):
    """RoPE + learnable distance penalty ``lambda_h * |i - j|`` + stick-breaking.

    ``lambda_h = softplus(raw_h) >= 0``, one per head, initialised to about 0.01.
    """

    encoding = "rse"
    method = "rse"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        init = torch.full((num_heads,), 0.01)
        self.distance_penalty_raw = nn.Parameter(torch.log(torch.expm1(init)))

    @property
    def distance_penalty(self) -> torch.Tensor:
        """``lambda`` per head, ``[heads]``, always >= 0."""
        return F.softplus(self.distance_penalty_raw)

    def attention_params(self) -> dict:
        return {"distance_penalty": self.distance_penalty}


ATTENTION_CLASSES: dict[str, type[PositionalSelfAttention]] = {
    cls.encoding: cls
    for cls in (
        NoPositionAttention,
        AbsoluteAttention,
        LearnedAttention,
        RoPEAttention,
        ExpoSBAttention,
        RSEAttention,
    )
}
