"""Learned absolute positions: a trainable table added to the inputs (chapter 02)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.checks import check_real, has_values, is_integer
from course_lib.layers import PositionalSelfAttention
from course_lib.position_facts import position_facts
from course_lib.registry import Encoding, register

__all__ = ["LearnedAttention"]


class LearnedAttention(PositionalSelfAttention):
    """A trainable table ``[max_position_embeddings, hidden]`` added to the inputs of Q, K and V.

    The table starts as ``N(0, init_std^2)`` (``init_std`` 0.02, BERT's, by default). The states
    it is added to are layer-normalised (about unit scale), so at 0.02 positions start as a
    whisper; ``init_std=1.0`` starts them at the states' own scale.
    """

    encoding = "learned"

    def __init__(
        self,
        hidden_size,
        num_heads,
        max_position_embeddings=512,
        dropout=0.0,
        backend="reference",
        *,
        init_std: float = 0.02,
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        self.init_std = check_real("init_std", init_std, above=0.0)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        nn.init.normal_(self.position_embeddings.weight, std=self.init_std)

    @torch.no_grad()
    def finish_init(self, std: float) -> None:
        """Called by :class:`~course_lib.model.MiniBert` after it drew every embedding from
        ``N(0, std^2)``: rescale the table to ``init_std`` (no new random draws)."""
        if self.init_std != std:
            self.position_embeddings.weight.mul_(self.init_std / std)

    def add_positions(self, hidden_states, position_ids):
        self._check_rows(position_ids)
        h = hidden_states + self.position_embeddings(position_ids).to(hidden_states.dtype)
        return h, h

    def _check_rows(self, position_ids: torch.Tensor) -> None:
        """Every position has a row of the table: ``0 <= p < rows``. The smallest and largest
        position come from :func:`~course_lib.position_facts.position_facts` (one read, none
        for positions the layer built); no values, or a meta tensor, have nothing to check."""
        if not position_ids.numel() or not has_values(position_ids):
            return
        facts = position_facts(position_ids.reshape(-1, position_ids.shape[-1]))
        limit = self.position_embeddings.num_embeddings
        if facts.lowest < 0:
            raise ValueError(
                f"learned position table has {limit} rows (positions 0..{limit - 1}), got position "
                f"{facts.lowest}: row p of the table is position p, so positions must be >= 0"
            )
        if facts.highest >= limit:
            raise ValueError(
                f"learned position table has {limit} rows (positions 0..{limit - 1}), got position "
                f"{facts.highest}. A learned table knows nothing past its last row; "
                "to stretch it on purpose call resize_position_table(new_size) (linear interpolation)."
            )

    @torch.no_grad()
    def resize_position_table(self, new_size: int) -> None:
        """Opt-in: stretch the table to ``new_size`` rows by linear interpolation along positions.

        Row ``r`` of the new table is the old table read at ``r * (old - 1) / (new_size - 1)``.
        """
        if not is_integer(new_size) or new_size < 2:
            raise ValueError(f"new_size must be an integer >= 2, got {new_size!r}")
        new_size = int(new_size)
        old = self.position_embeddings.weight  # [old, hidden]
        stretched = F.interpolate(
            old.T.unsqueeze(0), size=new_size, mode="linear", align_corners=True
        )[0].T
        table = nn.Embedding(new_size, self.hidden_size, device=old.device, dtype=old.dtype)
        table.weight.copy_(stretched)
        self.position_embeddings = table
        self.max_position_embeddings = new_size


register(
    Encoding(
        name="learned",
        chapter="02_learned",
        summary="a trainable table of one vector per position, added to the inputs of Q, K and V",
        module=LearnedAttention,
        color="#ff7f0e",
        inputs="adds row p of a trainable table [max_positions, hidden] to the inputs of Q, K, V",
        learnable=True,
    )
)
