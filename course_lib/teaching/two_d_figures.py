"""Figures and the explorer of notebook 09 (positions in two dimensions).

Scores of one query patch against every key patch under flattened 1-D RoPE, axial 2D RoPE,
LieRE and ComRoPE; the commuting theorem as a picture; the vision transformer's scenes and
results. Every function returns the figure it drew (or the numbers it plots).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from course_lib.encodings import (
    apply_block_rotation,
    apply_rope,
    apply_rope_2d,
    comrope_generators,
    lie_rotation,
)
from course_lib.vision import CLASSES, PATCH, grid_coords

__all__ = [
    "EXPLORER_ENCODINGS",
    "explorer_vectors",
    "rotate_patches",
    "pair_score",
    "score_map",
    "plot_score_maps",
    "relative_defects",
    "plot_commuting_theorem",
    "plot_scenes",
    "summarise_results",
    "plot_vit_results",
    "flat_line_limits",
    "two_d_explorer",
]

# encodings the explorer can switch between (with fixed, seeded parameters)
EXPLORER_ENCODINGS = ("rope (flattened)", "rope_2d", "liere", "comrope")


def explorer_vectors(head_dim: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """A query and a key that resemble each other (``k = q + small noise``, so the score is
    largest when nothing rotates them apart), and seeded generators for LieRE and ComRoPE
    (blocks of 4), all float64."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(head_dim, generator=g, dtype=torch.float64)
    k = q + 0.3 * torch.randn(head_dim, generator=g, dtype=torch.float64)
    liere = torch.randn(2, 4, 4, generator=g, dtype=torch.float64) * 0.5
    basis = torch.randn(4, 4, generator=g, dtype=torch.float64) * 0.5
    direction = torch.rand(2, generator=g, dtype=torch.float64) * 2 * math.pi
    angles = torch.stack((direction.cos(), direction.sin()))  # [2 axes, 2 planes]
    return {"q": q, "k": k, "liere": liere, "comrope": comrope_generators(basis, angles)}


def rotate_patches(
    encoding: str, x: torch.Tensor, coords: torch.Tensor, width: int, vectors: dict
) -> torch.Tensor:
    """Rotate ``x`` ``[n, D]`` at patches ``coords`` ``[n, 2]`` (row, column) with one of
    :data:`EXPLORER_ENCODINGS` (``width``: the grid width the flattened index uses)."""
    if encoding == "rope (flattened)":
        return apply_rope(x, coords[:, 0] * width + coords[:, 1])
    if encoding == "rope_2d":
        return apply_rope_2d(x, coords)
    if encoding in ("liere", "comrope"):
        return apply_block_rotation(x, coords, vectors[encoding])
    raise ValueError(f"unknown encoding {encoding!r}; valid: {', '.join(EXPLORER_ENCODINGS)}")


def pair_score(
    encoding: str, query: tuple[int, int], key: tuple[int, int], *, width: int = 8,
    vectors: dict | None = None,
) -> float:  # fmt: skip
    """The score ``R(query) q . R(key) k`` of the explorer's q and k at two patches."""
    vectors = explorer_vectors() if vectors is None else vectors
    coords = torch.tensor([query, key])
    x = torch.stack((vectors["q"], vectors["k"]))
    rotated = rotate_patches(encoding, x, coords, width, vectors)
    return float(rotated[0] @ rotated[1])


def score_map(
    encoding: str, query: tuple[int, int], grid: int = 8, *, vectors: dict | None = None
) -> torch.Tensor:
    """Scores ``[grid, grid]`` of the query at patch ``query`` against the key at every patch."""
    vectors = explorer_vectors() if vectors is None else vectors
    coords = grid_coords(grid, grid)
    keys = rotate_patches(encoding, vectors["k"].expand(len(coords), -1), coords, grid, vectors)
    q = rotate_patches(encoding, vectors["q"][None], torch.tensor([query]), grid, vectors)[0]
    return (keys @ q).reshape(grid, grid)


def _show_map(ax, scores: torch.Tensor, query, title: str, vmax: float, key=None) -> None:
    ax.imshow(scores.numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    ax.plot(query[1], query[0], marker="*", color="k", markersize=12, linestyle="")
    if key is not None:
        ax.plot(key[1], key[0], marker="o", markerfacecolor="none", color="k", markersize=12,
                linestyle="")  # fmt: skip
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("column")
    ax.set_ylabel("row")


def plot_score_maps(query: tuple[int, int] = (3, 3), grid: int = 8):
    """Flattened 1-D RoPE next to axial 2D RoPE: the query's score against every patch."""
    maps = {name: score_map(name, query, grid) for name in ("rope (flattened)", "rope_2d")}
    vmax = max(float(m.abs().max()) for m in maps.values())
    fig, axes = plt.subplots(1, 2, figsize=(7.6, 3.6))
    for ax, (name, scores) in zip(axes, maps.items(), strict=True):
        _show_map(ax, scores, query, f"{name}: score of the query (*) with each patch", vmax)
    fig.tight_layout()
    return fig


def relative_defects(
    generators: torch.Tensor, shifts: torch.Tensor, *, seed: int = 0, trials: int = 16
) -> torch.Tensor:
    """For each shift size ``s``: max over random ``p, r`` (coordinates up to 8) and directions of
    ``|R(p + s u)^T R(r + s u) - R(p)^T R(r)|``: 0 when moving both tokens together changes
    nothing. ``generators`` ``[2, D, D]``; returns float64 ``[len(shifts)]``."""
    g = torch.Generator().manual_seed(seed)
    p, r = (torch.rand(2, trials, 2, generator=g, dtype=torch.float64) * 8).unbind(0)
    u = torch.randn(trials, 2, generator=g, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    gen = generators.to(torch.float64)

    def product(a, b):
        return lie_rotation(a, gen).transpose(-1, -2) @ lie_rotation(b, gen)

    base = product(p, r)
    out = [float((product(p + s * u, r + s * u) - base).abs().max()) for s in shifts.tolist()]
    return torch.tensor(out, dtype=torch.float64)


def plot_commuting_theorem(commuting: torch.Tensor, generic: torch.Tensor):
    """The shift defect of commuting and of generic generators against the shift size."""
    shifts = torch.linspace(0, 20, 41, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    for name, gens, color in (("commuting (ComRoPE)", commuting, "#393b79"),
                              ("generic (LieRE)", generic, "#8c6d31")):  # fmt: skip
        defect = relative_defects(gens, shifts).clamp_min(1e-17)
        ax.semilogy(shifts, defect, marker=".", label=name, color=color)
    ax.set_xlabel("common shift s of both tokens (patches)")
    ax.set_ylabel("max |R(p+s)ᵀR(r+s) − R(p)ᵀR(r)|")
    ax.set_title("Moving both tokens together", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_scenes(images: torch.Tensor, labels: torch.Tensor, columns: int = 6):
    """A row of scenes: red square (channel 0), blue circle (channel 1), patch grid, label."""
    n = min(columns, len(images))
    fig, axes = plt.subplots(1, n, figsize=(1.9 * n, 2.2))
    for ax, image, label in zip(axes, images[:n], labels[:n], strict=True):
        rgb = torch.ones(*image.shape[1:], 3)
        rgb[image[0] > 0] = torch.tensor([0.85, 0.15, 0.1])
        rgb[image[1] > 0] = torch.tensor([0.1, 0.3, 0.85])
        ax.imshow(rgb)
        size = image.shape[-1]
        for line in range(0, size + 1, PATCH):
            ax.axhline(line - 0.5, color="0.85", linewidth=0.5)
            ax.axvline(line - 0.5, color="0.85", linewidth=0.5)
        ax.set_title(f"square {CLASSES[int(label)]}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    return fig


def summarise_results(results: dict) -> dict[str, dict[str, tuple[float, float, float]]]:
    """``{variant: {test: (mean, min, max)}}`` of the accuracies over seeds."""
    summary = {}
    for label, entry in results["variants"].items():
        tests = entry["runs"][0]["accuracy"].keys()
        summary[label] = {}
        for test in tests:
            values = [run["accuracy"][test] for run in entry["runs"]]
            summary[label][test] = (sum(values) / len(values), min(values), max(values))
    return summary


def plot_vit_results(results: dict, colors: dict[str, str]):
    """Grouped bars: accuracy per variant on each test (mean over seeds, bars from min to max)."""
    summary = summarise_results(results)
    variants = list(summary)
    tests = list(next(iter(summary.values())))
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.8 / len(variants)
    for i, label in enumerate(variants):
        means = [summary[label][t][0] for t in tests]
        low = [max(0.0, summary[label][t][0] - summary[label][t][1]) for t in tests]
        high = [max(0.0, summary[label][t][2] - summary[label][t][0]) for t in tests]
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(tests))]
        ax.bar(xs, means, width, yerr=[low, high], capsize=2, label=label,
               color=colors.get(label, "0.5"))  # fmt: skip
    ax.axhline(1 / len(CLASSES), color="k", linestyle=":", linewidth=1)
    ax.text(len(tests) - 0.5, 1 / len(CLASSES) + 0.01, "chance", fontsize=8, ha="right")
    ax.set_xticks(range(len(tests)))
    ax.set_xticklabels([t.replace(" ", "\n") for t in tests], fontsize=8)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"trained on 8x8, mean over seeds {results['seeds']} (bars: min to max)",
                 fontsize=10)  # fmt: skip
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def flat_line_limits(values: list[float], scale: float) -> tuple[float, float]:
    """The y-range of a panel that asks "is this line flat?": centred on the values, at least
    ``scale`` tall (the score's own size, so float noise of 1e-5 stays a flat line instead of
    being autoscaled into a jagged one) and tall enough for the values' own spread."""
    low, high = min(values), max(values)
    half = max(scale, 1.2 * (high - low), 1e-12) / 2
    middle = (low + high) / 2
    return middle - half, middle + half


def two_d_explorer(
    encoding: str = "rope_2d",
    query: tuple[int, int] = (3, 3),
    key: tuple[int, int] = (3, 5),
    grid: int = 8,
):
    """Left: the query's score against every patch (star: the query, circle: your key). Right:
    the score of your pair when both patches move together by ``(s, s)``, ``s = 0..12``: flat
    for a relative encoding. The right panel's y-range is at least the largest ``|score|`` of the
    left map, with plain tick labels (no offset notation), so a flat line looks flat. Returns the
    figure."""
    vectors = explorer_vectors()
    scores = score_map(encoding, query, grid, vectors=vectors)
    vmax = float(scores.abs().max())
    value = pair_score(encoding, query, key, width=grid, vectors=vectors)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4))
    _show_map(axes[0], scores, query, f"{encoding}: score(query, key) = {value:.2f}", vmax, key)
    shifts = range(13)
    moved = [
        pair_score(
            encoding,
            (query[0] + s, query[1] + s),
            (key[0] + s, key[1] + s),
            width=grid,
            vectors=vectors,
        )  # fmt: skip
        for s in shifts
    ]
    axes[1].plot(list(shifts), moved, marker="o")
    axes[1].set_ylim(*flat_line_limits(moved, vmax))
    axes[1].ticklabel_format(axis="y", style="plain", useOffset=False)
    axes[1].set_xlabel("both patches moved by (s, s)")
    axes[1].set_ylabel("score of the pair")
    axes[1].set_title("a relative encoding gives a flat line", fontsize=9)
    fig.tight_layout()
    return fig
