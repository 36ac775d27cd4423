"""Figures and small demonstrations for notebook 05 (stick-breaking attention).

A *row* here is the logits ``z[0..n-1]`` of one query against the ``n`` keys before it, in
position order (key ``n-1`` is the nearest). Stick-breaking (Tan et al. 2024) breaks a stick of
length 1 from the nearest key outward: key ``j`` takes the fraction ``sigmoid(z[j])`` of what the
nearer keys left over.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

__all__ = [
    "break_stick",
    "draw_stick",
    "floored_stick_weights",
    "plot_dilution",
    "plot_weights_by_distance",
]

_GREY = "0.82"
# tab10 without its grey (index 7), so no key looks like the grey left-over part
_KEY_COLORS = [plt.get_cmap("tab10")(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]


def _check_row(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 1 or not logits.is_floating_point():
        raise TypeError("logits must be a 1-D floating-point tensor [n_keys] (one query's row)")


def break_stick(
    logits: torch.Tensor, num_processed: int | None = None
) -> tuple[torch.Tensor, float]:
    """Break the stick for the ``num_processed`` nearest keys of a row ``[n]``.

    Returns ``(pieces [n], remaining)``: ``pieces[j]`` is the share key ``j`` broke off
    (0 for keys not processed yet) and ``remaining`` the length still left.
    """
    _check_row(logits)
    n = logits.shape[0]
    num_processed = n if num_processed is None else num_processed
    if not 0 <= num_processed <= n:
        raise ValueError(f"num_processed must be in 0..{n}, got {num_processed}")
    pieces = torch.zeros_like(logits)
    remaining = 1.0
    for j in range(n - 1, n - 1 - num_processed, -1):  # nearest key first
        beta = torch.sigmoid(logits[j]).item()
        pieces[j] = beta * remaining
        remaining *= 1.0 - beta
    return pieces, remaining


def draw_stick(logits: torch.Tensor, num_processed: int) -> Figure:
    """Two panels: the stick broken so far (top) and the weight of every key (bottom)."""
    n = logits.shape[0]
    pieces, remaining = break_stick(logits, num_processed)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(7.2, 4.4), gridspec_kw={"height_ratios": [1, 2.2]}
    )
    left = 0.0
    for j in range(n - 1, n - 1 - num_processed, -1):
        width = pieces[j].item()
        top.barh(0, width, left=left, color=_KEY_COLORS[j % len(_KEY_COLORS)], edgecolor="white")
        if width > 0.04:
            top.text(left + width / 2, 0, f"k{j}", ha="center", va="center", fontsize=8)
        left += width
    top.barh(0, remaining, left=left, color=_GREY, edgecolor="white", hatch="//")
    if remaining > 0.08:
        top.text(left + remaining / 2, 0, "left", ha="center", va="center", fontsize=8)
    top.set_xlim(0, 1)
    top.set_yticks([])
    top.set_title(
        f"after {num_processed} of {n} keys (nearest first): used {1 - remaining:.3f}, "
        f"left {remaining:.3f}",
        fontsize=10,
    )
    done = [j >= n - num_processed for j in range(n)]
    bottom.bar(
        range(n),
        pieces.tolist(),
        color=[_KEY_COLORS[j % len(_KEY_COLORS)] if done[j] else "white" for j in range(n)],
        edgecolor=["black" if done[j] else "0.6" for j in range(n)],
    )
    bottom.bar(n, remaining, color=_GREY, hatch="//", edgecolor="0.4")
    bottom.set_xticks(range(n + 1), [f"k{j}" for j in range(n)] + ["own\n(left over)"], fontsize=8)
    bottom.set_ylim(0, 1)
    bottom.set_ylabel("weight")
    bottom.set_xlabel("key position (the query sits right after the last key)")
    fig.tight_layout()
    return fig


def plot_dilution(
    ns: torch.Tensor, panels: dict[str, dict[str, torch.Tensor]], relevant_logit: float
) -> Figure:
    """Weight of the relevant key against the number of distractors, one panel per setting.

    ``panels`` maps a panel title to ``{curve label: weights [len(ns)]}``.
    """
    styles = ["-o", "-s", "--^", ":v"]
    if not panels or any(not 1 <= len(curves) <= len(styles) for curves in panels.values()):
        raise ValueError(f"give at least one panel, each with 1 to {len(styles)} curves")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.3), sharey=True)
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, curves) in zip(axes, panels.items(), strict=True):
        for style, (label, weights) in zip(styles, curves.items(), strict=False):
            ax.plot(ns.tolist(), weights.tolist(), style, markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("number of distractors n")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"weight of the relevant key (logit {relevant_logit:g})")
    axes[-1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def plot_weights_by_distance(weights: torch.Tensor, lambdas: list[float]) -> Figure:
    """Weights ``[len(lambdas), n_keys]`` of one query against distance, one curve per lambda."""
    if weights.dim() != 2 or weights.shape[0] != len(lambdas):
        raise ValueError(
            f"weights must be [len(lambdas), n_keys] = [{len(lambdas)}, n], got {tuple(weights.shape)}"
        )
    n = weights.shape[-1]
    distance = torch.arange(n, 0, -1)  # key j sits n - j positions before the query
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.2))
    for row, lam in zip(weights, lambdas, strict=True):
        axes[0].plot(distance.tolist(), row.tolist(), "-o", markersize=3, label=f"λ = {lam:g}")
    axes[0].set_xlabel("distance i − j")
    axes[0].set_ylabel("weight A_ij")
    axes[0].set_title("weights of one query", fontsize=10)
    axes[0].legend(fontsize=8)
    used = weights.sum(-1)
    axes[1].bar(range(len(lambdas)), used.tolist(), color="tab:blue", label="used by keys")
    axes[1].bar(range(len(lambdas)), (1 - used).tolist(), bottom=used.tolist(), color=_GREY,
                hatch="//", label="left over (own value)")  # fmt: skip
    axes[1].set_xticks(range(len(lambdas)), [f"λ = {lam:g}" for lam in lambdas], fontsize=8)
    axes[1].set_ylim(0, 1)
    axes[1].set_title("where the stick goes", fontsize=10)
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def floored_stick_weights(
    logits: torch.Tensor, *, floor: float = 1e-6, clamp: float | None = 20.0
) -> torch.Tensor:
    """Stick-breaking of a row ``[n]`` with two guards from the implementation report's kernel.

    Each logit is first clamped to ``[-clamp, clamp]`` (``clamp=None``: no clamp), and after
    every key the remaining stick is raised to at least ``floor`` (``floor=0``: no floor).
    Keys are processed nearest first, as in the paper, so only the two guards differ from the
    true process. Returns the weights ``[n]``.
    """
    _check_row(logits)
    if floor < 0:
        raise ValueError(f"floor must be >= 0, got {floor}")
    z = logits if clamp is None else logits.clamp(-clamp, clamp)
    weights = torch.zeros_like(z)
    remaining = torch.ones((), dtype=z.dtype)
    for j in range(z.shape[0] - 1, -1, -1):
        beta = torch.sigmoid(z[j])
        weights[j] = beta * remaining
        remaining = torch.clamp(remaining * (1 - beta), min=floor)
    return weights
