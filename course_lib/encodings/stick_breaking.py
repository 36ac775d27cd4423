"""Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention") (chapter 05).

The normaliser alone: for query ``i`` the nearest key breaks off ``sigmoid(z_ij)`` of a stick, the
next one the same share of what is left, and so on; the leftover goes to the query's own value.
Order enters through "nearest first", so this needs no position ids at all.
"""

from __future__ import annotations

from course_lib.layers import PositionalSelfAttention
from course_lib.normalisers import stick_breaking_weights
from course_lib.registry import Encoding, register

__all__ = ["stick_breaking_weights", "StickBreakingAttention"]


class StickBreakingAttention(PositionalSelfAttention):
    """Stick-breaking attention with no rotation and no penalty; no parameters."""

    encoding = "stick_breaking"


register(
    Encoding(
        name="stick_breaking",
        chapter="05_stick_breaking",
        summary="stick-breaking instead of softmax: the nearest key breaks off its share first",
        module=StickBreakingAttention,
        color="#8c564b",
        normaliser="stick_breaking",
        relative=True,  # order by index; position ids are not read
    )
)
