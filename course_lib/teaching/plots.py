"""Plot helpers shared by the notebooks (matplotlib only)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

__all__ = ["plot_attention"]


def plot_attention(weights: torch.Tensor, labels=None, *, ax=None, title: str = "", vmax=None):
    """Heatmap of one attention matrix ``[seq_q, seq_k]`` (rows: queries, columns: keys)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(3.6, 3.2))
    w = weights.detach().float().cpu()
    image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=vmax)
    if labels is not None:
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title, fontsize=10)
    return image
