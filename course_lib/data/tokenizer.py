"""The byte tokenizer: one token per UTF-8 byte, plus three special tokens.

Ids 0..255 are the byte values, then ``PAD`` (256), ``MASK`` (257) and ``BOS`` (258), so
``VOCAB_SIZE`` is 259. Every string round-trips: ``decode(encode(s)) == s``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["BOS_ID", "MASK_ID", "PAD_ID", "TOKENIZER", "VOCAB_SIZE", "ByteTokenizer"]

PAD_ID = 256
MASK_ID = 257
BOS_ID = 258
VOCAB_SIZE = 259


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are the byte values, 256 is ``PAD``, 257 is ``MASK``,
    258 is ``BOS``; ``vocab_size = 259``. Every string round-trips: ``decode(encode(s)) == s``.
    """

    def __init__(self) -> None:
        self.pad_id = PAD_ID
        self.mask_id = MASK_ID
        self.bos_id = BOS_ID
        self.vocab_size = VOCAB_SIZE
        self.special_names = {PAD_ID: "[PAD]", MASK_ID: "[MASK]", BOS_ID: "[BOS]"}

    def __repr__(self) -> str:
        return (
            f"ByteTokenizer(vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"mask_id={self.mask_id}, bos_id={self.bos_id})"
        )

    @property
    def special_ids(self) -> tuple[int, ...]:
        """``(pad_id, mask_id, bos_id)``."""
        return (self.pad_id, self.mask_id, self.bos_id)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids, optionally preceded by ``bos_id``."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def encode_tensor(self, text: str, *, add_bos: bool = False) -> torch.Tensor:
        """:meth:`encode` as a 1-D ``long`` tensor ``[len]``."""
        return torch.tensor(self.encode(text, add_bos=add_bos), dtype=torch.long)

    def decode(self, ids: Sequence[int] | torch.Tensor, *, show_special: bool = False) -> str:
        """Text of a 1-D sequence of ids. Special tokens are skipped, or written as ``[PAD]``,
        ``[MASK]``, ``[BOS]`` when ``show_special=True``; invalid UTF-8 becomes U+FFFD."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(
                    f"decode expects a 1-D sequence of ids, got shape {tuple(ids.shape)}"
                )
            ids = ids.tolist()
        pieces: list[str] = []
        chunk = bytearray()
        for token in ids:
            token = int(token)
            if 0 <= token < 256:
                chunk.append(token)
            elif token in self.special_names:
                if show_special:
                    pieces.append(chunk.decode("utf-8", errors="replace"))
                    chunk = bytearray()
                    pieces.append(self.special_names[token])
            else:
                raise ValueError(
                    f"token id {token} is outside the vocabulary 0..{self.vocab_size - 1}"
                )
        pieces.append(chunk.decode("utf-8", errors="replace"))
        return "".join(pieces)


#: The default tokenizer instance.
TOKENIZER = ByteTokenizer()
