"""Learned 2-D absolute positions for image patches: a row table plus a column table, added to
the inputs of Q, K and V (chapter 09).

``h'_p = h_p + E_row[row(p)] + E_col[col(p)]`` with ``E_row``, ``E_col`` trainable
``[max_position_embeddings, hidden]``: a factored ("axial") table, ``2L`` rows instead of the
``L * L`` of one row per patch, which cannot be afforded at the default ``L = 512``. Like the 1-D
learned table (chapter 02) it knows nothing past its last row; vision transformers evaluated on
a larger grid stretch their table by interpolation, offered here as an explicit opt-in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.checks import is_integer
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import Encoding, register

__all__ = ["Learned2DAttention"]


class Learned2DAttention(PositionalSelfAttention):
    """Trainable row and column tables ``[max_position_embeddings, hidden]`` added to the inputs.

    ``max_position_embeddings`` is the largest grid side ``L``: rows and columns ``0..L-1``.
    ``forward(..., position_ids=...)`` needs the (row, column) of every token, ``[seq, 2]`` or
    ``[batch, seq, 2]``.
    """

    encoding = "learned_2d"

    def __init__(
        self, hidden_size, num_heads, max_position_embeddings=512, dropout=0.0, backend="reference"
    ):
        super().__init__(hidden_size, num_heads, max_position_embeddings, dropout, backend)
        self.row_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.column_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        nn.init.normal_(self.row_embeddings.weight, std=0.02)
        nn.init.normal_(self.column_embeddings.weight, std=0.02)

    def add_positions(self, hidden_states, position_ids):
        """``[batch, seq, hidden]`` + ``E_row[row] + E_col[col]`` (positions ``[1|batch, seq, 2]``)."""
        limit = self.row_embeddings.num_embeddings
        if bool((position_ids < 0).any()) or bool((position_ids >= limit).any()):
            raise ValueError(
                f"the learned 2-D table covers rows and columns 0..{limit - 1}; got coordinates "
                f"{int(position_ids.min())}..{int(position_ids.max())}. It knows nothing past its "
                "last row; to stretch it to a larger grid on purpose call "
                "resize_position_table(new_size) (linear interpolation along each axis)."
            )
        rows, cols = position_ids[..., 0], position_ids[..., 1]
        table = self.row_embeddings(rows) + self.column_embeddings(cols)
        h = hidden_states + table.to(hidden_states.dtype)
        return h, h

    @torch.no_grad()
    def resize_position_table(self, new_size: int) -> None:
        """Opt-in: stretch both tables to ``new_size`` rows by linear interpolation.

        Row ``r`` of a new table is the old one read at ``r * (old - 1) / (new_size - 1)``: the
        first and last rows stay where they were, a larger grid is squeezed onto the trained one.
        """
        if not is_integer(new_size) or new_size < 2:
            raise ValueError(f"new_size must be an integer >= 2, got {new_size!r}")
        new_size = int(new_size)
        for name in ("row_embeddings", "column_embeddings"):
            old = getattr(self, name).weight  # [old, hidden]
            stretched = F.interpolate(
                old.T.unsqueeze(0), size=new_size, mode="linear", align_corners=True
            )[0].T
            table = nn.Embedding(new_size, self.hidden_size, device=old.device, dtype=old.dtype)
            table.weight.copy_(stretched)
            setattr(self, name, table)
        self.max_position_embeddings = new_size


register(
    Encoding(
        name="learned_2d",
        chapter="09_two_dimensions",
        summary="a trainable row table plus a column table, added to the inputs of Q, K and V",
        module=Learned2DAttention,
        color="#e377c2",
        inputs="adds E_row[row] + E_col[col] (trainable [max_positions, hidden] each) to the "
        "inputs of Q, K, V",
        learnable=True,
        position_dims=2,
    )
)
