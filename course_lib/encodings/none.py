"""No position signal at all: plain softmax attention, a bag of words (chapter 00)."""

from __future__ import annotations

from course_lib.layers import PositionalSelfAttention
from course_lib.registry import Encoding, register

__all__ = ["NoPositionAttention"]


class NoPositionAttention(PositionalSelfAttention):
    """Softmax attention with no position signal: permutation-equivariant."""

    encoding = "none"


register(
    Encoding(
        name="none",
        chapter="00_permutation_invariance",
        summary="no position signal: attention sees a bag of tokens",
        module=NoPositionAttention,
        color="#7f7f7f",
        relative=True,  # trivially: nothing depends on positions
    )
)
