"""Training and validation batches for the causal (next-token) and masked (BERT) objectives.

- :func:`clm_batch`: random crops with next-token labels.
- :func:`mask_tokens`: BERT masking (80% ``MASK``, 10% a random byte, 10% unchanged);
  :func:`mlm_batch`: random crops masked that way.
- :func:`eval_windows`: deterministic, non-overlapping validation windows.
- :func:`pad_batch`: variable-length sequences to ``[batch, max_len]`` plus a bool attention mask.

Labels hold :data:`IGNORE_INDEX` (-100) wherever nothing is predicted. Everything random takes a
``torch.Generator``, so every batch is reproducible.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from course_lib.data._checks import check_generator, check_int, check_probability, check_stream
from course_lib.data.tokenizer import BOS_ID, MASK_ID, PAD_ID

__all__ = [
    "IGNORE_INDEX",
    "clm_batch",
    "eval_windows",
    "mask_tokens",
    "mlm_batch",
    "pad_batch",
]

#: Label value that ``torch.nn.functional.cross_entropy`` ignores by default.
IGNORE_INDEX = -100


def _crops(
    tokens: torch.Tensor, batch_size: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """``[batch_size, length]`` windows of ``tokens`` starting at uniform random offsets."""
    n = tokens.shape[0]
    if length > n:
        raise ValueError(f"the token stream has {n} tokens, too few for windows of {length} tokens")
    starts = torch.randint(
        0, n - length + 1, (batch_size,), generator=generator, device=generator.device
    )
    offsets = torch.arange(length, device=tokens.device)
    return tokens[starts.to(tokens.device)[:, None] + offsets]


def clm_batch(
    tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random crops for next-token prediction.

    Draws ``batch_size`` windows of ``seq_len + 1`` consecutive tokens of the stream ``tokens``
    (start offsets uniform, from ``generator``) and returns ``(input_ids [B, L], labels [B, L])``
    with ``labels[b, t] = input_ids[b, t + 1]``, i.e. ``labels`` is the window shifted by one.
    """
    tokens = check_stream(tokens)
    batch_size = check_int("batch_size", batch_size, 1)
    seq_len = check_int("seq_len", seq_len, 1)
    generator = check_generator(generator)
    if seq_len + 1 > tokens.shape[0]:
        raise ValueError(
            f"seq_len={seq_len} needs a stream of at least seq_len + 1 = {seq_len + 1} tokens, "
            f"got {tokens.shape[0]}"
        )
    windows = _crops(tokens.long(), batch_size, seq_len + 1, generator)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def mask_tokens(
    input_ids: torch.Tensor,
    generator: torch.Generator,
    mask_prob: float = 0.15,
    *,
    special_ids: Sequence[int] = (PAD_ID, MASK_ID, BOS_ID),
    attention_mask: torch.Tensor | None = None,
    mask_id: int = MASK_ID,
    mask_replace_prob: float = 0.8,
    random_replace_prob: float = 0.1,
    random_token_range: tuple[int, int] = (0, 256),
    ensure_target: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking (Devlin et al. 2019) of ``input_ids [..., L]``.

    Each eligible position becomes a target with probability ``mask_prob`` (independently).
    Eligible = not one of ``special_ids`` (so ``PAD`` is never masked) and, if given,
    ``attention_mask`` True. Of the targets, a fraction ``mask_replace_prob`` (0.8) is replaced by
    ``mask_id``, ``random_replace_prob`` (0.1) by a uniform id from ``random_token_range``
    (``[low, high)``, the byte range by default) and the rest (0.1) are left unchanged.
    With ``ensure_target`` a row with no target but some eligible position gets one target at a
    uniformly chosen eligible position, so no row has an all-ignored loss.

    Returns ``(masked_ids, labels)``, both shaped like ``input_ids`` (``long``):
    ``labels = input_ids`` at targets and :data:`IGNORE_INDEX` (-100) elsewhere. ``input_ids``
    is not modified. The same generator state gives the same result.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be an integer torch.Tensor, got {type(input_ids).__name__}"
        )
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise TypeError(f"input_ids must hold integer ids, got dtype {input_ids.dtype}")
    if input_ids.dim() < 1:
        raise ValueError("input_ids must have at least one dimension (the sequence)")
    generator = check_generator(generator)
    mask_prob = check_probability("mask_prob", mask_prob, open_interval=True)
    mask_replace_prob = check_probability(
        "mask_replace_prob", mask_replace_prob, open_interval=False
    )
    random_replace_prob = check_probability(
        "random_replace_prob", random_replace_prob, open_interval=False
    )
    if mask_replace_prob + random_replace_prob > 1.0 + 1e-12:
        raise ValueError(
            "mask_replace_prob + random_replace_prob must be <= 1, got "
            f"{mask_replace_prob} + {random_replace_prob}"
        )
    low, high = random_token_range
    if not (0 <= low < high):
        raise ValueError(
            f"random_token_range must be [low, high) with 0 <= low < high, got {random_token_range}"
        )
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
            raise TypeError("attention_mask must be a bool tensor (True for real tokens)")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape "
                f"{tuple(input_ids.shape)}"
            )

    device = input_ids.device
    shape = input_ids.shape
    ids = input_ids.long()
    eligible = torch.ones(shape, dtype=torch.bool, device=device)
    for special in special_ids:
        eligible &= ids != int(special)
    if attention_mask is not None:
        eligible &= attention_mask.to(device)

    # All draws happen every call, in a fixed order, so results depend only on the generator.
    gen_device = generator.device
    select_u = torch.rand(shape, generator=generator, device=gen_device).to(device)
    fallback_u = torch.rand(shape, generator=generator, device=gen_device).to(device)
    action_u = torch.rand(shape, generator=generator, device=gen_device).to(device)
    random_ids = torch.randint(low, high, shape, generator=generator, device=gen_device).to(device)

    targets = (select_u < mask_prob) & eligible
    if ensure_target:
        needs_one = eligible.any(dim=-1) & ~targets.any(dim=-1)
        scores = torch.where(eligible, fallback_u, torch.full_like(fallback_u, -1.0))
        forced = torch.zeros_like(targets)
        forced.scatter_(-1, scores.argmax(dim=-1, keepdim=True), True)
        targets |= forced & needs_one.unsqueeze(-1)

    to_mask = targets & (action_u < mask_replace_prob)
    to_random = targets & (action_u >= mask_replace_prob)
    to_random &= action_u < mask_replace_prob + random_replace_prob

    masked = ids.clone()
    masked[to_mask] = mask_id
    masked[to_random] = random_ids[to_random]
    labels = torch.where(targets, ids, torch.full_like(ids, IGNORE_INDEX))
    return masked, labels


def mlm_batch(
    tokens: torch.Tensor,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator,
    mask_prob: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random crops of ``seq_len`` tokens with BERT masking (see :func:`mask_tokens`).

    Returns ``(input_ids [B, L], labels [B, L])``: ``labels`` holds the original id at the
    ~``mask_prob`` target positions and -100 elsewhere; ``input_ids`` has 80% of targets replaced
    by ``MASK``, 10% by a random byte, 10% unchanged.
    """
    tokens = check_stream(tokens)
    batch_size = check_int("batch_size", batch_size, 1)
    seq_len = check_int("seq_len", seq_len, 1)
    generator = check_generator(generator)
    mask_prob = check_probability("mask_prob", mask_prob, open_interval=True)
    if seq_len > tokens.shape[0]:
        raise ValueError(
            f"seq_len={seq_len} is longer than the token stream ({tokens.shape[0]} tokens)"
        )
    windows = _crops(tokens.long(), batch_size, seq_len, generator)
    return mask_tokens(windows, generator, mask_prob)


def eval_windows(
    tokens: torch.Tensor,
    seq_len: int,
    max_windows: int | None = None,
    *,
    batch_size: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic, non-overlapping validation windows for next-token prediction.

    Window ``w`` has ``input_ids = tokens[w*L : w*L + L]`` and ``labels = tokens[w*L+1 : w*L+L+1]``
    (``L = seq_len``), for ``w = 0 .. min((n - 1) // L, max_windows) - 1``, so every token is
    predicted at most once. Yields ``(input_ids [b, L], labels [b, L])`` with ``b <= batch_size``
    consecutive windows (the last batch may be smaller). For the masked objective, use the
    ``input_ids`` and :func:`mask_tokens` with a freshly seeded generator.
    """
    tokens = check_stream(tokens)
    seq_len = check_int("seq_len", seq_len, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    if max_windows is not None:
        max_windows = check_int("max_windows", max_windows, 1)
    available = (tokens.shape[0] - 1) // seq_len
    if available < 1:
        raise ValueError(
            f"seq_len={seq_len} needs a stream of at least seq_len + 1 = {seq_len + 1} tokens, "
            f"got {tokens.shape[0]}"
        )
    count = available if max_windows is None else min(available, max_windows)
    return _iter_windows(tokens.long(), seq_len, count, batch_size)


def _iter_windows(
    tokens: torch.Tensor, seq_len: int, count: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    offsets = torch.arange(seq_len + 1, device=tokens.device)
    for first in range(0, count, batch_size):
        starts = torch.arange(first, min(first + batch_size, count), device=tokens.device) * seq_len
        windows = tokens[starts[:, None] + offsets]
        yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def pad_batch(
    sequences: Sequence[Sequence[int] | torch.Tensor],
    pad_id: int = PAD_ID,
    *,
    side: str = "right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad variable-length id sequences to ``Lmax`` (the longest).

    Returns ``(input_ids [B, Lmax] long, attention_mask [B, Lmax] bool)``; ``attention_mask`` is
    True at real tokens. ``side="right"`` puts the padding after the tokens, ``"left"`` before.
    """
    if side not in ("right", "left"):
        raise ValueError(f"unknown padding side {side!r}; valid: 'right', 'left'")
    if isinstance(sequences, torch.Tensor) or len(sequences) == 0:
        raise ValueError("sequences must be a non-empty list of id lists or 1-D tensors")
    rows: list[torch.Tensor] = []
    for i, seq in enumerate(sequences):
        row = seq if isinstance(seq, torch.Tensor) else torch.tensor(list(seq), dtype=torch.long)
        if row.dim() != 1:
            raise ValueError(f"sequence {i} must be 1-D, got shape {tuple(row.shape)}")
        if row.numel() and (row.dtype == torch.bool or row.is_floating_point()):
            raise TypeError(f"sequence {i} must hold integer ids, got dtype {row.dtype}")
        rows.append(row.long())
    max_len = max(row.shape[0] for row in rows)
    if max_len == 0:
        raise ValueError("all sequences are empty; nothing to pad")
    device = rows[0].device
    input_ids = torch.full((len(rows), max_len), int(pad_id), dtype=torch.long, device=device)
    attention_mask = torch.zeros((len(rows), max_len), dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        n = row.shape[0]
        span = slice(0, n) if side == "right" else slice(max_len - n, max_len)
        input_ids[i, span] = row.to(device)
        attention_mask[i, span] = True
    return input_ids, attention_mask
