"""The attention module every encoding's module is built on, and the key/value cache.

Every encoding's module (``get_attention_class(name)``, defined in the encoding's own file under
:mod:`course_lib.encodings`) takes ``(hidden_size, num_heads, max_position_embeddings=512,
dropout=0.0, backend="reference")`` and maps hidden states ``[batch, seq, hidden]`` to
``[batch, seq, hidden]`` with ``forward(hidden_states, attention_mask=None, causal=False,
position_ids=None, cache=None)``. ``attention_mask`` is bool ``[batch, seq]`` (True = real token);
``position_ids`` default to ``cache.length + 0..seq-1``, so a decoding step continues the
prefix's positions by construction.

An encoding's module says where its signal enters by what it overrides: :meth:`add_positions`
(place 1, the inputs of the projections) and :meth:`attention_params` (its parameters, and any
term computed from the hidden states, handed to :func:`course_lib.attention.attention`); places
2-4 are its registry record's, read by ``attention(method=record.method)``.

Dropout is applied to the attention output (fused kernels have no dropout on the weights).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from course_lib.attention import BACKENDS, attention
from course_lib.checks import (
    check_choice,
    check_key_padding_mask,
    check_position_ids,
    check_real,
    is_integer,
)
from course_lib.position_facts import arange_positions
from course_lib.registry import Encoding, get_encoding

__all__ = ["KVCache", "PositionalSelfAttention"]


def _check_attention_mask(mask, batch: int, seq: int, past: int, device) -> None:
    """A layer's ``attention_mask``: bool ``[batch, seq]`` for the tokens of this call; with a
    cache of ``past`` earlier tokens, the new tokens only (the cache keeps the earlier ones')."""
    shape = tuple(getattr(mask, "shape", ()))
    if past and shape == (batch, past + seq):
        raise ValueError(
            f"with a key/value cache, attention_mask covers the new tokens only: [batch, new "
            f"tokens] = [{batch}, {seq}], got {shape} (the cached {past} tokens' mask is kept in "
            f"the cache); pass attention_mask[:, -{seq}:]"
        )
    check_key_padding_mask(mask, batch, seq, device)


@dataclass
class KVCache:
    """Keys and values seen so far by one attention layer, for incremental (causal) decoding.

    Keys are stored *before* any rotation, with their positions: attention re-encodes them, so a
    new token can never be rotated with the wrong position.
    ``k, v``: ``[batch, heads, length, head_dim]``; ``positions``: ``[batch, length]`` (or
    ``[batch, length, 2]`` for two coordinates per token);
    ``mask``: ``[batch, length]`` bool or None. ``per_key``: the encoding's per-key tensors
    (its record's ``per_key_params``, e.g. FoX's log forget gates ``[batch, heads, length]``; the
    key axis is the last one).
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    per_key: dict[str, torch.Tensor] = field(default_factory=dict)
    # the attention layer whose keys it holds (weakly), bound by its first append
    _owner: weakref.ref | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k, v, positions, mask, owner: nn.Module | None = None):
        """Add ``seq`` new keys/values; return everything cached (old then new).

        ``k``, ``v`` ``[batch, heads, seq, head_dim]`` (the same shape), ``positions``
        ``[1 or batch, seq(, 2)]``, ``mask`` ``[batch, seq]`` bool or None. A cache holds one
        batch of sequences: new keys must match the cached ones in batch, heads, head_dim, dtype
        and device. ``owner``: the attention layer appending; a cache holds one layer's keys,
        and another layer's append is refused (two layers sharing a cache would each attend to
        the other's keys as if they were earlier tokens).
        """
        self._check_owner(owner)
        self._check_new(k, v, positions, mask)
        batch, seq = k.shape[0], k.shape[2]
        positions = positions.expand(batch, seq, *positions.shape[2:])
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

    def _check_owner(self, owner: nn.Module | None) -> None:
        if owner is None:
            return
        bound = None if self._owner is None else self._owner()
        if bound is None:
            self._owner = weakref.ref(owner)
        elif bound is not owner:
            raise ValueError(
                "this KVCache already holds the keys of another attention layer: each layer "
                "needs a cache of its own (model.new_cache() makes one per layer; "
                "[KVCache()] * n is one cache repeated n times)"
            )

    def _check_new(self, k, v, positions, mask) -> None:
        """Clear errors for keys that cannot join this cache (see :meth:`append`)."""
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(
                    f"KVCache.append: {name} must be a 4-D tensor [batch, heads, seq, head_dim], "
                    f"got {getattr(t, 'shape', type(t).__name__)}"
                )
        if k.shape != v.shape:
            raise ValueError(
                f"KVCache.append: k and v must have the same shape (one value per key), got "
                f"{tuple(k.shape)} and {tuple(v.shape)}"
            )
        batch, _, seq, _ = k.shape
        lead = "1" if batch == 1 else f"1 or {batch}"
        if not isinstance(positions, torch.Tensor):
            raise TypeError(
                f"KVCache.append: positions must be a tensor [{lead}, {seq}] (or [{lead}, {seq}, "
                f"2]), got {type(positions).__name__}"
            )
        if positions.dim() not in (2, 3):
            raise ValueError(
                f"KVCache.append: positions must be [{lead}, {seq}] (one per new key; [{lead}, "
                f"{seq}, 2] for two coordinates), with a batch axis, got "
                f"{tuple(positions.shape)}: e.g. positions[None] for [{seq}] positions"
            )
        if positions.shape[1] != seq or positions.shape[0] not in (1, batch):
            raise ValueError(
                f"KVCache.append: positions must be [{lead}, {seq}, ...] (one per new key), "
                f"got {tuple(positions.shape)}"
            )
        if mask is not None and tuple(mask.shape) != (batch, seq):
            raise ValueError(
                f"KVCache.append: mask must be [batch, seq] = [{batch}, {seq}], got "
                f"{tuple(mask.shape)}"
            )
        if self.k is None:
            return
        cached = (self.k.shape[0], self.k.shape[1], self.k.shape[3], self.k.dtype, self.k.device)
        new = (k.shape[0], k.shape[1], k.shape[3], k.dtype, k.device)
        if cached != new:
            raise ValueError(
                "this KVCache holds keys of batch {}, {} heads, head_dim {}, {} on {}; the new "
                "keys have batch {}, {} heads, head_dim {}, {} on {}. A cache belongs to one batch "
                "of sequences decoded together: start a new one (model.new_cache()) for another "
                "batch or model".format(*cached, *new)
            )

    def append_per_key(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """Add the new keys' ``values`` ``[..., seq]`` of a per-key tensor (call after
        :meth:`append`); return it for every cached key ``[..., length]``."""
        old = self.per_key.get(name)
        self.per_key[name] = values if old is None else torch.cat((old, values), dim=-1)
        if self.per_key[name].shape[-1] != self.length:
            raise ValueError(
                f"per-key tensor {name!r} covers {self.per_key[name].shape[-1]} keys, the cache "
                f"{self.length}"
            )
        return self.per_key[name]


def _check_hidden_dtype(hidden_states: torch.Tensor, weight_dtype: torch.dtype) -> None:
    """Hidden states of the weights' floating dtype (any floating dtype under autocast)."""
    if not hidden_states.is_floating_point():
        raise TypeError(
            f"hidden_states must be floating-point (the module's weights are {weight_dtype}), "
            f"got {hidden_states.dtype}"
        )
    try:
        autocast = torch.is_autocast_enabled(hidden_states.device.type)
    except TypeError:  # torch < 2.4 takes no device type
        autocast = torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()
    if hidden_states.dtype != weight_dtype and not autocast:
        raise TypeError(
            f"hidden_states are {hidden_states.dtype} but the module's weights are "
            f"{weight_dtype}: convert one to the other (e.g. module.to({hidden_states.dtype}) or "
            f"hidden_states.to({weight_dtype})), or run under torch.autocast"
        )


class PositionalSelfAttention(nn.Module):
    """Multi-head self-attention for one registered encoding (subclasses set ``encoding``).

    Subclasses may override :meth:`add_positions` (place 1) and :meth:`attention_params`.
    """

    encoding: str = ""  # the name of the subclass's record in the registry

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        max_position_embeddings: int = 512,
        dropout: float = 0.0,
        backend: str = "reference",
    ) -> None:
        super().__init__()
        get_encoding(self.encoding)  # a registered name, or a ValueError listing them
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads)):
            if not is_integer(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        hidden_size, num_heads = int(hidden_size), int(num_heads)
        if hidden_size % num_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}); "
                f"e.g. num_heads in {[h for h in range(1, 17) if hidden_size % h == 0]}"
            )
        if not is_integer(max_position_embeddings) or max_position_embeddings <= 0:
            raise ValueError(
                f"max_position_embeddings must be a positive integer, got {max_position_embeddings!r}"
            )
        max_position_embeddings = int(max_position_embeddings)
        dropout = check_real("dropout (a probability)", dropout, at_least=0.0)
        if not dropout < 1.0:
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

    #: The fourth place, when a module's option replaces its record's (None: the record's).
    normaliser: str | None = None

    @property
    def spec(self) -> Encoding:
        """The encoding's registry record (what it does in each of the four places)."""
        return get_encoding(self.encoding)

    # -- hooks ---------------------------------------------------------------------------------
    def add_positions(
        self, hidden_states: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the hidden states that feed (Q and K, V). Default: no additive signal."""
        return hidden_states, hidden_states

    def attention_params(self, hidden_states: torch.Tensor) -> dict:
        """Keyword parameters for :func:`course_lib.attention.attention` (the module's own
        parameters, or terms computed from ``hidden_states`` ``[batch, seq, hidden]``; those its
        record lists in ``per_key_params`` cover this call's tokens and are cached per key)."""
        return {}

    def reported_values(self) -> dict[str, list[float]]:
        """Learned values worth reporting after training (e.g. RSE's lambda per head); none by
        default. The comparison stores them in each run's results."""
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
        _check_hidden_dtype(hidden_states, self.query.weight.dtype)
        batch, seq, _ = hidden_states.shape
        spec = self.spec
        past = 0 if cache is None else cache.length
        if position_ids is None and spec.position_dims != 1:
            raise ValueError(
                f"the {self.encoding!r} encoding needs position_ids [seq, {spec.position_dims}] or "
                f"[batch, seq, {spec.position_dims}]: {spec.position_dims} coordinates per token"
            )
        if position_ids is None:
            position_ids = arange_positions(past, seq, hidden_states.device)
        position_ids = check_position_ids(
            position_ids, batch, seq, hidden_states.device, spec.position_dims
        )
        if attention_mask is not None:
            _check_attention_mask(attention_mask, batch, seq, past, hidden_states.device)
        h_qk, h_v = self.add_positions(hidden_states, position_ids)
        q = self._split_heads(self.query(h_qk))
        k = self._split_heads(self.key(h_qk))
        v = self._split_heads(self.value(h_v))
        key_positions, key_mask = position_ids, attention_mask
        params = self.attention_params(hidden_states)
        if cache is not None:
            k, v, key_positions, key_mask = cache.append(
                k, v, position_ids, attention_mask, owner=self
            )
            for name in spec.per_key_params:
                params[name] = cache.append_per_key(name, params[name])
        # The fused kernels take seq_q == seq_k: a decoding step (new queries against the cache)
        # runs the reference code of the same function.
        backend = self.backend if q.shape[2] == k.shape[2] else "reference"
        context = attention(
            q, k, v,
            method=spec.method,
            causal=causal,
            key_padding_mask=key_mask,
            position_ids=key_positions if spec.uses_positions else None,
            backend=backend,
            normaliser=self.normaliser,
            **params,
        )  # fmt: skip
        context = context.transpose(1, 2).reshape(batch, seq, self.hidden_size)
        return self.dropout(self.out(context))

    def extra_repr(self) -> str:
        return (
            f"encoding={self.encoding!r}, heads={self.num_heads}, head_dim={self.head_dim}, "
            f"backend={self.backend!r}"
        )
