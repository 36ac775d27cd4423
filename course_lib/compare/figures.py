"""Figures of the encoding comparison (:mod:`course_lib.compare`), drawn from its result dicts.

Each ``plot_*`` function takes the list that :func:`course_lib.compare.load_results` returns,
draws one figure and returns it; :func:`write_figures` saves them all into a folder. Each
encoding is drawn in its registry colour (:func:`encoding_color`), the same in every figure of
the course; a figure shows the encodings that have results and no others.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from course_lib.encodings import get_encoding

__all__ = [
    "encoding_color",
    "plot_loss_curves",
    "plot_extrapolation",
    "plot_retrieval_by_position",
    "plot_probe_accuracy",
    "plot_cost_table",
    "write_figures",
]

OBJECTIVE_TITLES = {"clm": "causal LM (clm)", "mlm": "masked LM (mlm)"}


def encoding_color(name: str) -> str:
    """The matplotlib colour of encoding ``name``: ``REGISTRY[name].color`` (an unknown name
    raises a ValueError listing the registered ones)."""
    return get_encoding(name).color


def _objectives(results: list[dict]) -> list[str]:
    return [o for o in ("clm", "mlm") if any(r["objective"] == o for r in results)]


def _runs(results: list[dict], objective: str) -> list[dict]:
    return [r for r in results if r["objective"] == objective]


def _axes(count: int, width: float = 4.6, height: float = 3.4):
    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, list(axes[0])


def _source_line(results: list[dict]) -> str:
    return results[0]["label"]


def _binned_mean(steps: list[int], values: list[float], bins: int) -> tuple[list, list]:
    """Means of ``values`` over ``bins`` consecutive groups (labelled by each group's last step)."""
    size = max(1, math.ceil(len(values) / bins))
    xs, ys = [], []
    for start in range(0, len(values), size):
        group = values[start : start + size]
        xs.append(steps[start + len(group) - 1])
        ys.append(sum(group) / len(group))
    return xs, ys


def plot_loss_curves(results: list[dict], *, show_train: bool = True, train_points: int = 60):
    """Validation loss (solid) and training loss (faint; the mean of each of ``train_points``
    groups of steps) against the step, one panel per objective, with the unigram entropy (the
    loss of a context-free guess) as a dashed line."""
    objectives = _objectives(results)
    fig, axes = _axes(len(objectives))
    for ax, objective in zip(axes, objectives, strict=True):
        for r in _runs(results, objective):
            color = encoding_color(r["encoding"])
            if show_train:
                train = r["curves"]["train"]
                xs, ys = _binned_mean(train["step"], train["loss"], train_points)
                ax.plot(xs, ys, color=color, alpha=0.3, lw=0.8)
            val = r["curves"]["val"]
            ax.plot(val["step"], val["loss"], color=color, lw=1.8, label=r["encoding"])
        unigram = results[0]["data"]["unigram_entropy_nats"]
        ax.axhline(unigram, color="black", ls="--", lw=0.8, label="unigram")
        ax.set_title(OBJECTIVE_TITLES[objective], fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel("loss (nats per byte)")
        ax.set_ylim(top=unigram + 0.6)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8, ncol=2)
    fig.suptitle(f"Learning curves ({_source_line(results)})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_extrapolation(results: list[dict]):
    """Validation loss at 1x, 2x, 4x the training length; an ``x`` at the bottom marks lengths
    where the encoding is not applicable (past the learned table)."""
    objectives = _objectives(results)
    fig, axes = _axes(len(objectives))
    for ax, objective in zip(axes, objectives, strict=True):
        runs = _runs(results, objective)
        for r in runs:
            color = encoding_color(r["encoding"])
            ok = [e for e in r["extrapolation"] if e["status"] == "ok"]
            ax.plot(
                [e["multiple"] for e in ok],
                [e["loss"] for e in ok],
                marker="o",
                color=color,
                label=r["encoding"],
            )
            missing = [e["multiple"] for e in r["extrapolation"] if e["status"] != "ok"]
            if missing:
                ax.plot(missing, [0.02] * len(missing), "x", color=color, ms=8,
                        transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
        multiples = [e["multiple"] for e in runs[0]["extrapolation"]]
        seq_len = runs[0]["extrapolation"][0]["length"]
        ax.set_xscale("log", base=2)
        ax.set_xticks(multiples, [f"{m}x\n({m * seq_len})" for m in multiples])
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("validation loss (nats per byte)")
        ax.set_title(f"{OBJECTIVE_TITLES[objective]}: trained at {seq_len}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8, ncol=2, title="x = not applicable", title_fontsize=7)
    fig.suptitle(f"Longer than trained ({_source_line(results)})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_retrieval_by_position(results: list[dict]):
    """Retrieval-probe accuracy against the position of the target in the context, with chance
    (1 / alphabet) and the position-blind bag-of-symbols baseline."""
    if not _has_probe(results, "retrieval"):
        raise ValueError("these results have no retrieval results to plot")
    objectives = _objectives([r for r in results if "retrieval" in r["probes"]])
    fig, axes = _axes(max(1, len(objectives)))
    markers = "osD^vPX*<>"
    for ax, objective in zip(axes, objectives, strict=False):
        runs = [r for r in _runs(results, objective) if "retrieval" in r["probes"]]
        for i, r in enumerate(runs):
            table = r["probes"]["retrieval"]["by_position"]
            positions = table["position"]
            step = min((b - a for a, b in zip(positions, positions[1:], strict=False)), default=1)
            # a small sideways offset per encoding, so lines at the same accuracy stay visible
            shift = (i - (len(runs) - 1) / 2) * 0.5 * step / max(1, len(runs))
            ax.plot(
                [p + shift for p in positions],
                table["accuracy"],
                marker=markers[i % len(markers)],
                ms=3.5,
                lw=1.2,
                alpha=0.85,
                color=encoding_color(r["encoding"]),
                label=r["encoding"],
            )
        if runs:
            probe = runs[0]["probes"]["retrieval"]
            ax.axhline(probe["chance"], color="black", ls=":", lw=0.8, label="chance")
            ax.axhline(
                probe["bag_of_symbols_baseline"], color="black", ls="--", lw=0.8,
                label="bag of symbols",
            )  # fmt: skip
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("position of the target in the context")
        ax.set_ylabel("accuracy")
        ax.set_title(OBJECTIVE_TITLES[objective], fontsize=10)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, ncol=2, loc="center right")
    fig.suptitle(f"Retrieval probe by target position ({_source_line(results)})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_probe_accuracy(results: list[dict]):
    """Accuracy of each probe (panels) per encoding, bars grouped by objective, with chance."""
    if not _has_probe(results, None):
        raise ValueError("these results have no probe results to plot")
    tasks = [t for t in ("word_order", "retrieval") if any(t in r["probes"] for r in results)]
    encodings = list(dict.fromkeys(r["encoding"] for r in results))
    fig, axes = _axes(len(tasks), width=3.4)
    width = 0.8 / max(1, len(encodings))
    for ax, task in zip(axes, tasks, strict=True):
        objectives = _objectives([r for r in results if task in r["probes"]])
        for i, encoding in enumerate(encodings):
            heights = []
            for objective in objectives:
                run = [
                    r for r in results if r["objective"] == objective and r["encoding"] == encoding
                ]
                heights.append(run[0]["probes"][task]["accuracy"] if run else math.nan)
            xs = [j + (i - (len(encodings) - 1) / 2) * width for j in range(len(objectives))]
            ax.bar(xs, heights, width, color=encoding_color(encoding), label=encoding)
        chance = next(r["probes"][task]["chance"] for r in results if task in r["probes"])
        ax.axhline(chance, color="black", ls=":", lw=0.8)
        ax.set_xticks(range(len(objectives)), objectives)
        ax.set_xlim(-0.6, len(objectives) - 0.4)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("accuracy on held-out examples")
        ax.set_title(f"{task.replace('_', '-')} probe (dotted: chance)", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[-1].legend(fontsize=7, ncol=3)
    fig.suptitle(f"Probes after a short fine-tune ({_source_line(results)})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_cost_table(results: list[dict]):
    """A table: parameters (total and in position tables), training tokens per second and
    peak memory of every run."""
    rows = []
    for r in results:
        m = r["metrics"]
        memory = m["peak_memory"]
        mem_text = (
            f"{memory['megabytes']:.0f} MB"
            if memory["kind"] == "cuda_max_memory_allocated"
            else "n/a (CPU)"
        )
        rows.append(
            [
                r["objective"],
                r["encoding"],
                f"{m['parameters']['total']:,}",
                f"{m['parameters']['position_embeddings']:,}",
                f"{m['tokens_per_second']:,.0f}",
                mem_text,
            ]
        )
    columns = ["objective", "encoding", "parameters", "in position table", "tokens/s", "peak mem"]
    fig, ax = plt.subplots(figsize=(7.2, 0.24 * (len(rows) + 1) + 0.6))
    ax.axis("off")
    # the table fills the axes, so the title above the axes cannot overlap its header
    table = ax.table(cellText=rows, colLabels=columns, bbox=[0, 0, 1, 1], cellLoc="right")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    ax.set_title(f"Cost ({_source_line(results)})", fontsize=9, pad=8)
    fig.tight_layout()
    return fig


FIGURES = {
    "loss_curves.png": plot_loss_curves,
    "extrapolation.png": plot_extrapolation,
    "retrieval_by_position.png": plot_retrieval_by_position,
    "probe_accuracy.png": plot_probe_accuracy,
    "cost_table.png": plot_cost_table,
}


def _has_probe(results: list[dict], task: str | None = None) -> bool:
    return any((task in r["probes"]) if task else r["probes"] for r in results)


def write_figures(results: list[dict], out_dir: str | Path) -> list[Path]:
    """Draw every figure that has data (the probe figures need probe results) and save it as a
    PNG in ``out_dir``; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in FIGURES.items():
        if draw is plot_probe_accuracy and not _has_probe(results):
            continue
        if draw is plot_retrieval_by_position and not _has_probe(results, "retrieval"):
            continue
        fig = draw(results)
        path = out_dir / name
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
