"""Figures of notebook 02: what a learned position table looks like, and how far it reaches.

Tables are ``[positions, hidden]``; row ``p`` is the vector added at position ``p``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

__all__ = [
    "cosine_similarity_matrix",
    "neighbour_similarity",
    "principal_plane",
    "plot_similarity",
    "plot_row_trajectory",
    "plot_accuracy_by_position",
    "plot_learning_curves",
    "show_learned_table",
]


def cosine_similarity_matrix(table: torch.Tensor) -> torch.Tensor:
    """``S[p, q] = cos(angle between rows p and q)``: ``[N, hidden] -> [N, N]``."""
    rows = F.normalize(table.detach().float(), dim=-1)
    return rows @ rows.T


def neighbour_similarity(table: torch.Tensor, distance: int) -> float:
    """Mean cosine similarity of rows ``distance`` apart: ``mean_p S[p, p + distance]``."""
    return float(cosine_similarity_matrix(table).diagonal(distance).mean())


def principal_plane(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(center [hidden], basis [hidden, 2])``: the plane of the two largest principal axes.

    Rows are projected with ``(row - center) @ basis``; the sign of each axis is fixed so that
    row 0 has non-positive coordinates (an SVD leaves the sign free).
    """
    table = table.detach().double()
    center = table.mean(dim=0)
    _, _, vh = torch.linalg.svd(table - center, full_matrices=False)
    basis = vh[:2].T  # [hidden, 2]
    signs = torch.where((table[0] - center) @ basis > 0, -1.0, 1.0).to(basis.dtype)
    return center, basis * signs


def plot_similarity(table: torch.Tensor, ax, title: str = ""):
    """Heatmap of :func:`cosine_similarity_matrix` (rows and columns are positions)."""
    image = ax.imshow(
        cosine_similarity_matrix(table), cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest"
    )
    ax.set_xlabel("position q")
    ax.set_ylabel("position p")
    ax.set_title(title, fontsize=10)
    return image


def plot_row_trajectory(before: torch.Tensor, after: torch.Tensor, ax) -> None:
    """The path of the rows ``before`` (big circles, joined in position order) and the rows of
    a resized table ``after`` (small dots), both projected on the principal plane of ``before``."""
    center, basis = principal_plane(before)
    path_before = (before.double() - center) @ basis
    path_after = (after.double() - center) @ basis
    ax.plot(
        path_before[:, 0],
        path_before[:, 1],
        "o-",
        ms=6,
        mfc="none",
        lw=0.8,
        label=f"before: {len(before)} rows",
    )
    ax.plot(path_after[:, 0], path_after[:, 1], ".", ms=4, label=f"after: {len(after)} rows")
    for p in (0, len(before) - 1):
        ax.annotate(f"p={p}", path_before[p], textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("principal axis 1")
    ax.set_ylabel("principal axis 2")
    ax.legend(fontsize=8)


def plot_accuracy_by_position(
    curves: dict, train_length: int, ax, chance: float | None = None, dashed: tuple = ()
):
    """Accuracy ``[seq]`` against position for each named curve; the trained length is marked.

    Curves may have different lengths; those named in ``dashed`` are drawn dashed (e.g. a
    reference measured at the training length)."""
    for name, accuracy in curves.items():
        style = "--" if name in dashed else ".-"
        ax.plot(torch.arange(len(accuracy)), accuracy, style, ms=3, lw=1, label=name)
    ax.axvline(train_length - 0.5, color="grey", ls="--", lw=1)
    ax.text(train_length, 0.05, " longer than\n any training sequence", fontsize=8, color="grey")
    if chance is not None:
        ax.axhline(chance, color="grey", lw=0.5)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("position")
    ax.set_ylabel("held-out accuracy")
    ax.legend(fontsize=8, loc="lower left")


def plot_learning_curves(results, ax) -> None:
    """Held-out accuracy against training step for each trained model."""
    for result in results:
        ax.plot(result.steps, result.accuracy, "o-", ms=3, label=result.encoding)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out accuracy")
    ax.legend(fontsize=8)


def show_learned_table(
    snapshots: list[torch.Tensor],
    snapshot_steps: list[int],
    snapshot: int,
    position: int,
    reference_table: torch.Tensor,
):
    """The explorer's figure: the learned table at one training snapshot.

    Left: its cosine-similarity matrix. Right: row ``position``'s similarity to every row, for
    the learned table and for ``reference_table`` (the sinusoidal one, fixed from the start).
    """
    table = snapshots[snapshot]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    image = plot_similarity(table, axes[0], f"learned table at step {snapshot_steps[snapshot]}")
    fig.colorbar(image, ax=axes[0], fraction=0.046)
    positions = torch.arange(len(table))
    axes[1].plot(positions, cosine_similarity_matrix(table)[position], ".-", ms=3, label="learned")
    axes[1].plot(
        positions, cosine_similarity_matrix(reference_table)[position], lw=1, label="sinusoidal"
    )
    axes[1].axvline(position, color="grey", lw=0.5)
    axes[1].set_ylim(-1.05, 1.05)
    axes[1].set_xlabel("position q")
    axes[1].set_ylabel(f"cos(row {position}, row q)")
    axes[1].set_title(f"similarity of row {position} to the others", fontsize=10)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig
