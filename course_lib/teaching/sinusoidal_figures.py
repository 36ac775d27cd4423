"""Figures of notebook 01: the sinusoidal table, its dot products, and an explorer.

``offset_similarity(offsets, dim, base)`` is the closed form of the normalised dot product of two
sinusoidal codes ``offsets`` apart: ``PE(p) . PE(p + k) / (dim/2) = mean_i cos(k * w_i)`` with
``w_i = base**(-2i/dim)``; it depends on ``k`` only, never on ``p``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from course_lib.encodings import sinusoidal_table

__all__ = [
    "inverse_frequencies",
    "offset_similarity",
    "plot_code_heatmap",
    "plot_offset_similarity",
    "show_sinusoidal",
]


def inverse_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """``w_i = base**(-2i/dim)`` for pairs ``i = 0..dim/2-1``: ``[dim/2]`` float64."""
    if dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even integer, got {dim}")
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def offset_similarity(offsets: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``mean_i cos(k * w_i)`` for each offset ``k``: ``[...] -> [...]`` float64.

    Equals ``PE(p) . PE(p + k) / (dim/2)`` for every ``p`` (``cos a cos b + sin a sin b =
    cos(a - b)``), i.e. the cosine similarity of two codes ``k`` positions apart.
    """
    angles = offsets.to(torch.float64).unsqueeze(-1) * inverse_frequencies(dim, base)
    return angles.cos().mean(dim=-1)


def plot_code_heatmap(table: torch.Tensor, ax, title: str = "", channel_label: str = "channel"):
    """Heatmap of a position code ``[positions, channels]`` (positions down, channels across)."""
    image = ax.imshow(
        table.detach().float().cpu(),
        aspect="auto",
        cmap="RdBu_r",
        vmin=-1,
        vmax=1,
        interpolation="nearest",
    )
    ax.set_xlabel(channel_label)
    ax.set_ylabel("position p")
    ax.set_title(title, fontsize=10)
    return image


def plot_offset_similarity(ax, dim: int, bases, max_offset: int = 512) -> None:
    """Curves of :func:`offset_similarity` against the offset ``k >= 0`` for several bases
    (the curve is symmetric in ``k``)."""
    offsets = torch.arange(0, max_offset + 1)
    for base in bases:
        ax.plot(offsets, offset_similarity(offsets, dim, base), lw=1, label=f"base {base:g}")
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("offset k")
    ax.set_ylabel("PE(p)·PE(p+k) / (d/2)")
    ax.legend(fontsize=8)


def show_sinusoidal(dim: int = 64, base: float = 10000.0, num_positions: int = 128):
    """The explorer's figure: the table, and the similarity of two codes against their offset.

    Left: ``sinusoidal_table(num_positions, dim, base)``. Right: ``PE(p) . PE(p + k) / (dim/2)``
    measured at three positions ``p`` (dots) on top of the closed form (line): they coincide.
    """
    table = sinusoidal_table(num_positions, dim, base)
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    image = plot_code_heatmap(table, axes[0], f"sinusoidal table, d={dim}, base={base:g}")
    fig.colorbar(image, ax=axes[0], fraction=0.046)
    max_offset = max(num_positions // 2, 1)
    offsets = torch.arange(-max_offset, max_offset + 1)
    axes[1].plot(
        offsets,
        offset_similarity(offsets, dim, base),
        color="black",
        lw=1.2,
        label="mean_i cos(k w_i)",
    )
    starts = (max_offset, 2 * max_offset, 4 * max_offset)
    for p, marker, size in zip(starts, ("o", "s", "."), (6, 4, 3), strict=True):
        codes = sinusoidal_table(p + max_offset + 1, dim, base)
        dots = codes[p + offsets] @ codes[p] / (dim / 2)
        axes[1].plot(
            offsets[::4],
            dots[::4],
            marker,
            ms=size,
            mfc="none" if marker != "." else None,
            label=f"measured at p={p}",
        )
    axes[1].set_xlabel("offset k")
    axes[1].set_ylabel("PE(p)·PE(p+k) / (d/2)")
    axes[1].set_title("depends on k only, symmetric, decays", fontsize=10)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig
