"""Figures of notebook 06: ALiBi's bias matrices and slopes, T5's bucket map, the explorers (ALiBi
and T5; KERPLE's shape) and the extrapolation experiment. Every bias comes from the encodings'
own score-bias functions (``REGISTRY[name].score_bias``, ``kerple_bias``), so a figure shows
what the library computes.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch

from course_lib.encodings import REGISTRY, alibi_slopes, kerple_bias, relative_position_bucket

__all__ = [
    "alibi_bias",
    "content_free_weights",
    "half_distance",
    "bucket_ranges",
    "plot_alibi",
    "plot_buckets",
    "explorer_data",
    "score_bias_explorer",
    "kerple_explorer_data",
    "kerple_explorer",
    "plot_extrapolation",
]


def alibi_bias(slopes: torch.Tensor, seq: int) -> torch.Tensor:
    """The ALiBi bias ``[heads, seq, seq]`` at positions ``0..seq-1``: ``-m_h |i - j|``
    (the library's score-bias function; a causal model masks the keys ``j > i``)."""
    positions = torch.arange(seq)[None]  # [1, seq]
    return REGISTRY["alibi"].score_bias(positions, positions, {"slopes": slopes})[0]


def content_free_weights(slopes: torch.Tensor, context: int) -> torch.Tensor:
    """Attention ``[heads, context]`` of the last query of a causal sequence of ``context``
    tokens over the keys at distances ``0..context-1`` when every content score is equal:
    ``softmax_d(-m_h d)``, the weight ALiBi alone gives to each distance."""
    distance = torch.arange(context, dtype=torch.float64)
    return torch.softmax(-slopes.double()[:, None] * distance, dim=-1)


def half_distance(slopes: torch.Tensor, context: int | None) -> list[float]:
    """Per head, the smallest distance ``D`` whose keys ``0..D`` get half of the content-free
    attention in a context of ``context`` keys; ``context=None``: an unbounded context, where
    the weights are geometric and ``D = ceil(ln 2 / m) - 1`` (inf for a zero slope)."""
    if context is None:
        return [math.ceil(math.log(2) / m) - 1 if m > 0 else math.inf for m in slopes.tolist()]
    cumulative = content_free_weights(slopes, context).cumsum(-1)
    return [int((row < 0.5).sum()) for row in cumulative]


def bucket_ranges(
    num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True, upto: int = 4096
) -> list[tuple[int, int, int]]:
    """``(bucket, first distance, last distance)`` of the buckets of keys *before* the query,
    for distances ``0..upto`` (the last bucket's range ends at ``upto``: it has no end)."""
    distance = torch.arange(upto + 1)
    buckets = relative_position_bucket(
        -distance, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    out = []
    for b in torch.unique(buckets).tolist():
        where = distance[buckets == b]
        out.append((b, int(where.min()), int(where.max())))
    return out


def plot_alibi(num_heads: int = 8, seq: int = 16, context: int = 128):
    """Left: the causal bias of head 1 (masked keys blank); middle: the symmetric bidirectional
    bias of head 1; right: the content-free attention per distance of every head, with each
    head's half-attention distance (dots)."""
    slopes = alibi_slopes(num_heads)
    bias = alibi_bias(slopes, seq)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), gridspec_kw={"width_ratios": [1, 1, 1.5]})
    causal = bias[0].clone()
    causal[torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)] = float("nan")
    for ax, matrix, title in (
        (axes[0], causal, f"causal, head 1 (m = {slopes[0]:.3g})"),
        (axes[1], bias[0], "symmetric (bidirectional), head 1"),
    ):
        image = ax.imshow(matrix.numpy(), cmap="viridis", vmin=float(bias[0].min()), vmax=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
    fig.colorbar(image, ax=axes[:2], shrink=0.8, label=r"bias $-m\,|i-j|$")
    weights = content_free_weights(slopes, context)
    halves = half_distance(slopes, context)
    colors = plt.cm.plasma(np.linspace(0, 0.9, num_heads))
    for h in range(num_heads):
        axes[2].plot(weights[h].numpy(), color=colors[h], label=f"h{h + 1}: m = {slopes[h]:.3g}")
        axes[2].plot(halves[h], float(weights[h, halves[h]]), "o", color=colors[h], ms=4)
    axes[2].set_yscale("log")
    axes[2].set_ylim(1e-5, 1)
    axes[2].set_xlabel("distance i - j")
    axes[2].set_ylabel("attention weight (equal content)")
    axes[2].set_title(f"ALiBi alone, {num_heads} heads, context {context}", fontsize=10)
    axes[2].legend(fontsize=7, ncol=2)
    return fig


def plot_buckets(num_buckets: int = 32, max_distance: int = 128, seq: int = 40):
    """Left: T5's bucket of each signed distance ``r = j - i``, bidirectional and
    unidirectional; right: the bucket matrix ``bucket(j - i)`` of a bidirectional layer."""
    r = torch.arange(-2 * max_distance, max_distance + 1)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [1.6, 1]})
    for bidirectional, style in ((True, "-"), (False, "--")):
        buckets = relative_position_bucket(
            r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        label = "bidirectional (encoder)" if bidirectional else "unidirectional (decoder)"
        axes[0].step(r.numpy(), buckets.numpy(), style, where="mid", label=label)
    for x in (-max_distance, max_distance):
        axes[0].axvline(x, color="grey", lw=0.8, ls=":")
    axes[0].set_xlabel("relative position r = key - query")
    axes[0].set_ylabel("bucket")
    axes[0].set_title(f"{num_buckets} buckets, max_distance {max_distance}", fontsize=10)
    axes[0].legend(fontsize=8)
    positions = torch.arange(seq)
    matrix = relative_position_bucket(
        positions[None, :] - positions[:, None],
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    image = axes[1].imshow(matrix.numpy(), cmap="viridis")
    axes[1].set_xlabel("key position j")
    axes[1].set_ylabel("query position i")
    axes[1].set_title("bucket(j - i), bidirectional", fontsize=10)
    fig.colorbar(image, ax=axes[1], shrink=0.8)
    return fig


def explorer_data(
    num_heads: int, slope: float, num_buckets: int, max_distance: int, context: int = 256
) -> dict:
    """What the explorer draws: the paper's slopes for ``num_heads``, their half-attention
    distances in ``context``, the same for one extra head of slope ``slope``, and the T5 buckets
    (bidirectional) of the distances ``-context..context``."""
    slopes = alibi_slopes(num_heads)
    r = torch.arange(-context, context + 1)
    return {
        "slopes": slopes,
        "halves": half_distance(slopes, context),
        "extra_half": half_distance(torch.tensor([slope]), context)[0],
        "r": r,
        "buckets": relative_position_bucket(
            r, bidirectional=True, num_buckets=num_buckets, max_distance=max_distance
        ),
        "context": context,
    }


def score_bias_explorer(
    num_heads: int = 8,
    slope: float = 0.05,
    num_buckets: int = 32,
    max_distance: int = 128,
    context: int = 256,
):
    """Left: content-free attention per distance for every head (dashed: one head of your
    ``slope``); middle: half-attention distance per head; right: T5's buckets."""
    data = explorer_data(num_heads, slope, num_buckets, max_distance, context)
    slopes = data["slopes"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    weights = content_free_weights(slopes, context)
    colors = plt.cm.plasma(np.linspace(0, 0.9, num_heads))
    for h in range(num_heads):
        axes[0].plot(weights[h].numpy(), color=colors[h], lw=1)
    extra = content_free_weights(torch.tensor([slope]), context)[0]
    axes[0].plot(extra.numpy(), "k--", lw=1.5, label=f"slope {slope:.3g}")
    axes[0].set_yscale("log")
    axes[0].set_ylim(1e-6, 1)
    axes[0].set_xlabel("distance")
    axes[0].set_ylabel("weight (equal content)")
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{num_heads} heads, context {context}", fontsize=10)
    heads = np.arange(1, num_heads + 1)
    axes[1].bar(heads, data["halves"], color=colors)
    axes[1].axhline(data["extra_half"], color="k", ls="--", lw=1)
    axes[1].set_xlabel("head")
    axes[1].set_ylabel("half-attention distance")
    axes[1].set_title("half of the weight lies within", fontsize=10)
    axes[2].step(data["r"].numpy(), data["buckets"].numpy(), where="mid")
    axes[2].set_xlabel("relative position r = key - query")
    axes[2].set_ylabel("bucket")
    axes[2].set_title(f"T5: {num_buckets} buckets, max_distance {max_distance}", fontsize=10)
    fig.tight_layout()
    return fig


def kerple_explorer_data(
    variant: str = "log", r1: float = 1.0, r2: float = 0.5, context: int = 256
) -> dict:
    """One KERPLE head of ``variant`` with ``r1``, ``r2``: its bias at distances ``0..context-1``,
    the content-free attention of a causal query that sees ``context`` keys (softmax of the bias
    over the distances), and that head's half-attention distance (the smallest ``D`` whose keys
    ``0..D`` hold half of the weight). Also, for comparison, an ALiBi head of slope ``1/16`` (the
    second of 4 heads; KERPLE's power variant at ``r1 = 1/16``, ``r2 = 1``)."""
    distance = torch.arange(context)
    bias = kerple_bias(
        distance, torch.tensor([r1], dtype=torch.float64), torch.tensor([r2], dtype=torch.float64),
        variant,
    )[0]  # fmt: skip
    weights = torch.softmax(bias, 0)
    half = int(
        torch.searchsorted(torch.cumsum(weights, 0), torch.tensor([0.5], dtype=torch.float64))[0]
    )
    line = -distance.double() / 16
    return {
        "distance": distance,
        "bias": bias,
        "weights": weights,
        "half": half,
        "alibi_bias": line,
        "alibi_weights": torch.softmax(line, 0),
        "context": context,
    }


def kerple_explorer(variant: str = "log", r1: float = 1.0, r2: float = 0.5, context: int = 256):
    """Left: one KERPLE head's bias per distance, with an ALiBi head of slope 1/16; right: the
    attention it alone gives each distance (equal content), log scale, and its half-attention
    distance."""
    data = kerple_explorer_data(variant, r1, r2, context)
    color = REGISTRY["kerple"].color
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    d = data["distance"].numpy()
    axes[0].plot(d, data["bias"].numpy(), color=color, label=f"KERPLE {variant}")
    axes[0].plot(d, data["alibi_bias"].numpy(), ":", color="grey", label="ALiBi, slope 1/16")
    axes[0].set_ylim(min(float(data["bias"].min()), -1.0) * 1.1, 0.5)
    axes[0].set_xlabel("distance |i - j|")
    axes[0].set_ylabel("bias added to the score")
    axes[0].set_title(f"{variant}: r1 = {r1:.3g}, r2 = {r2:.3g}", fontsize=10)
    axes[0].legend(fontsize=8, loc="lower left")
    axes[1].plot(d, data["weights"].numpy(), color=color, label="KERPLE")
    axes[1].plot(d, data["alibi_weights"].numpy(), ":", color="grey", label="ALiBi, slope 1/16")
    axes[1].axvline(data["half"], color="k", ls="--", lw=1)
    axes[1].set_yscale("log")
    axes[1].set_ylim(1e-8, 1)
    axes[1].set_xlabel("distance")
    axes[1].set_ylabel("weight (equal content)")
    axes[1].set_title(f"half of KERPLE's weight within {data['half']} tokens", fontsize=10)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_extrapolation(results: dict, colors: dict[str, str], labels: dict[str, str]):
    """Left: mean loss per position (windows of 512 tokens, 16-position averages, mean over
    seeds); right: the whole-window loss at each length, mean over seeds with the min-max range
    of the seeds as error bars."""
    summary = results["summary"]
    train_len = results["train_len"]
    lengths = results["lengths"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    for name, entry in summary.items():
        curve = np.asarray(entry["position_curve"])
        smooth = curve.reshape(-1, 16).mean(1)
        axes[0].plot(
            np.arange(len(smooth)) * 16 + 8, smooth, color=colors[name], label=labels[name]
        )
        means = [entry[str(n)]["loss"]["mean"] for n in lengths]
        low = [entry[str(n)]["loss"]["mean"] - entry[str(n)]["loss"]["min"] for n in lengths]
        high = [entry[str(n)]["loss"]["max"] - entry[str(n)]["loss"]["mean"] for n in lengths]
        axes[1].errorbar(lengths, means, yerr=[low, high], color=colors[name], marker="o",
                         capsize=3, label=labels[name])  # fmt: skip
    axes[0].axvline(train_len, color="grey", ls=":", lw=1)
    axes[0].text(train_len + 4, axes[0].get_ylim()[1], "training length", va="top", fontsize=8)
    axes[0].set_xlabel("position in the window")
    axes[0].set_ylabel("loss (nats per byte)")
    axes[0].set_title("loss by position, windows of 512", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(lengths, [str(n) for n in lengths])
    axes[1].set_xlabel("window length (trained at 64)")
    axes[1].set_ylabel("loss (nats per byte)")
    axes[1].set_title(f"whole-window loss, {len(results['seeds'])} seeds (min-max)", fontsize=10)
    fig.tight_layout()
    return fig
