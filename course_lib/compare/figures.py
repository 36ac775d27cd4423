"""Figures of the encoding comparison (:mod:`course_lib.compare`), drawn from its result dicts.

Each ``plot_*`` function takes the list that :func:`course_lib.compare.load_results` returns,
draws one figure and returns it; :func:`write_figures` saves them all into a folder. Every figure
shows the spread over seeds: a mean with the 95% t interval over seeds or the seeds' range (a
band or a bar, the caption says which) and, where they fit, the seeds themselves as dots. Each encoding is drawn in its registry colour
(:func:`encoding_color`), the same in every figure of the course; the ablations appear in
their own figure (:func:`plot_ablations`), as differences from their encoding seed by seed.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from course_lib.compare.arms import ABLATIONS
from course_lib.compare.results import load_timing
from course_lib.compare.stats import by_arm, paired, spread
from course_lib.encodings import get_encoding

__all__ = [
    "encoding_color",
    "plot_ablations",
    "plot_cost_table",
    "plot_loss_curves",
    "plot_position_and_context",
    "plot_position_buckets",
    "plot_probe_accuracy",
    "plot_retrieval_by_position",
    "write_figures",
]

OBJECTIVE_TITLES = {"clm": "causal LM (clm)", "mlm": "masked LM (mlm)"}


def encoding_color(name: str) -> str:
    """The matplotlib colour of encoding ``name``: ``REGISTRY[name].color`` (an unknown name
    raises a ValueError listing the registered ones)."""
    return get_encoding(name).color


def _objectives(results: list[dict]) -> list[str]:
    return [o for o in ("clm", "mlm") if any(r["objective"] == o for r in results)]


def _encoding_groups(results: list[dict], objective: str) -> dict[str, list[dict]]:
    """``{encoding: runs by seed}`` of ``objective``, ablations left out."""
    return {
        arm: runs
        for (o, arm), runs in by_arm(results).items()
        if o == objective and runs[0]["arm"] == runs[0]["encoding"]
    }


def _axes(count: int, width: float = 4.6, height: float = 3.4):
    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, list(axes[0])


def _figure_legend(fig, axes, title: str | None = None) -> None:
    """One legend below the panels with every label of every panel, once each (panels may
    show different encodings: the causal-only ones have no masked-LM runs)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    fig.legend(
        list(seen.values()), list(seen), loc="lower center", ncol=min(8, len(seen)),
        fontsize=7, title=title, title_fontsize=7, bbox_to_anchor=(0.5, -0.02),
    )  # fmt: skip


def _source_line(results: list[dict]) -> str:
    seeds = sorted({r["seed"] for r in results})
    return f"{results[0]['label']}; seeds {', '.join(map(str, seeds))}"


def _binned_mean(steps: list[int], values: list[float], bins: int) -> tuple[list, list]:
    """Means of ``values`` over ``bins`` consecutive groups (labelled by each group's last step)."""
    size = max(1, math.ceil(len(values) / bins))
    xs, ys = [], []
    for start in range(0, len(values), size):
        group = values[start : start + size]
        xs.append(steps[start + len(group) - 1])
        ys.append(sum(group) / len(group))
    return xs, ys


def _mean_and_range(series: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Pointwise mean, minimum and maximum of equally long series (one per seed)."""
    columns = list(zip(*series, strict=True))
    return (
        [statistics.fmean(c) for c in columns],
        [min(c) for c in columns],
        [max(c) for c in columns],
    )


def plot_loss_curves(results: list[dict], *, show_train: bool = True, train_points: int = 60):
    """Validation loss against the step (solid: the mean over seeds; band: the seeds' range),
    training loss faint (the seeds' mean of each of ``train_points`` groups of steps), one
    panel per objective, with the unigram entropy (a context-free guess) dashed."""
    objectives = _objectives(results)
    fig, axes = _axes(len(objectives))
    for ax, objective in zip(axes, objectives, strict=True):
        for encoding, runs in _encoding_groups(results, objective).items():
            color = encoding_color(encoding)
            if show_train:
                binned = [
                    _binned_mean(
                        r["curves"]["train"]["step"], r["curves"]["train"]["loss"], train_points
                    )
                    for r in runs
                ]
                mean, _, _ = _mean_and_range([ys for _, ys in binned])
                ax.plot(binned[0][0], mean, color=color, alpha=0.3, lw=0.8)
            steps = runs[0]["curves"]["val"]["step"]
            mean, low, high = _mean_and_range([r["curves"]["val"]["loss"] for r in runs])
            ax.plot(steps, mean, color=color, lw=1.6, label=encoding)
            ax.fill_between(steps, low, high, color=color, alpha=0.15, lw=0)
        unigram = results[0]["data"]["unigram_entropy_nats"]
        ax.axhline(unigram, color="black", ls="--", lw=0.8, label="unigram")
        ax.set_title(OBJECTIVE_TITLES[objective], fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel("selection-split loss (nats per byte)")
        ax.set_ylim(top=unigram + 0.3)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Learning curves, band = range over seeds ({_source_line(results)})", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    _figure_legend(fig, axes)
    return fig


def _bucket_labels(results: list[dict]) -> list[str]:
    """``0-63``, ``64-127``, ... : the positions of the long windows' buckets."""
    length = results[0]["identity"]["train_config"]["seq_len"]
    edges = [0, length, 2 * length, 4 * length, 8 * length]
    count = sum(1 for k in range(4) if f"bucket{k}" in results[0]["evaluation"])
    return [f"{edges[k]}-{edges[k + 1] - 1}" for k in range(count)]


def _interval(value) -> tuple[float, float]:
    """The 95% interval of a :class:`~course_lib.compare.stats.Spread` (its mean for one
    seed)."""
    return value.ci() if value.n > 1 else (value.mean, value.mean)


def plot_position_buckets(results: list[dict]):
    """Loss by target position bucket in the long windows (the same windows for every
    encoding): the mean over seeds, with the 95% interval as error bars; an ``x`` at the bottom
    marks buckets past the learned table. For clm a target at ``t`` sees ``t + 1`` tokens, so
    position and context grow together here (:func:`plot_position_and_context` separates
    them)."""
    objectives = _objectives(results)
    fig, axes = _axes(len(objectives), width=5.2, height=3.8)
    labels = _bucket_labels(results)
    length = results[0]["identity"]["train_config"]["seq_len"]
    for ax, objective in zip(axes, objectives, strict=True):
        groups = _encoding_groups(results, objective)
        for i, (encoding, runs) in enumerate(groups.items()):
            color = encoding_color(encoding)
            shift = (i - (len(groups) - 1) / 2) * 0.035
            xs, means, errors, missing = [], [], [[], []], []
            for k in range(len(labels)):
                value = spread(runs, f"bucket{k}")
                if value is None:
                    missing.append(k + shift)
                    continue
                lo, hi = _interval(value)
                xs.append(k + shift)
                means.append(value.mean)
                errors[0].append(max(0.0, value.mean - lo))
                errors[1].append(max(0.0, hi - value.mean))
            ax.errorbar(xs, means, yerr=errors, marker="o", ms=3.5, lw=1.3, capsize=2,
                        color=color, label=encoding)  # fmt: skip
            if missing:
                ax.plot(missing, [0.02] * len(missing), "x", color=color, ms=7,
                        transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
        ax.axvline(0.5, color="black", lw=0.8, ls=":")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(f"position of the target (trained at {length} tokens)")
        ax.set_ylabel("loss (nats per byte)")
        note = "" if objective == "clm" else "; every target sees the whole window"
        ax.set_title(f"{OBJECTIVE_TITLES[objective]}{note}", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"Loss by position in long windows, bars = 95% interval ({_source_line(results)})",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    _figure_legend(fig, axes, "x at the bottom = not applicable (past the learned table)")
    return fig


def plot_position_and_context(results: list[dict]):
    """Past the training length, position and context apart (one row per objective): left, the
    loss of a block of targets read alone at positions ``s..`` minus at ``0..`` (the positions
    alone); right, the same targets inside the long window minus read alone at ``s..`` (the
    extra context alone). Mean over seeds with the 95% interval, per encoding."""
    objectives = _objectives(results)
    fig, grid = plt.subplots(
        len(objectives), 2, figsize=(10.4, 3.5 * len(objectives)), squeeze=False
    )
    length = results[0]["identity"]["train_config"]["seq_len"]
    tags = sorted(
        {k.split("@")[1] for k in results[0]["evaluation"] if k.startswith("shift@")},
        key=lambda t: int(t[:-1]),
    )
    starts = [int(t[:-1]) * length for t in tags]
    panels = (
        ("shift_cost", "positions moved, same context"),
        ("context_gain", "long context minus moved alone"),
    )
    axes = []
    for row, objective in zip(grid, objectives, strict=True):
        groups = _encoding_groups(results, objective)
        for ax, (prefix, title) in zip(row, panels, strict=True):
            for i, (encoding, runs) in enumerate(groups.items()):
                xs, means, errors = [], [], [[], []]
                for k, tag in enumerate(tags):
                    value = spread(runs, f"{prefix}@{tag}")
                    if value is None:
                        continue
                    lo, hi = _interval(value)
                    xs.append(k + (i - (len(groups) - 1) / 2) * 0.04)
                    means.append(value.mean)
                    errors[0].append(max(0.0, value.mean - lo))
                    errors[1].append(max(0.0, hi - value.mean))
                if xs:
                    ax.errorbar(xs, means, yerr=errors, marker="o", ms=3, lw=1.2, capsize=2,
                                color=encoding_color(encoding), label=encoding)  # fmt: skip
            ax.axhline(0, color="black", lw=0.8)
            ax.set_xticks(range(len(tags)), [f"{s}-{s + length - 1}" for s in starts])
            ax.set_xlabel("the targets' positions")
            ax.set_ylabel("loss difference (nats)")
            ax.set_title(f"{OBJECTIVE_TITLES[objective]}: {title}", fontsize=9)
            ax.grid(alpha=0.3)
            axes.append(ax)
    fig.suptitle(
        "Past the training length, position or context; bars = 95% interval "
        f"({_source_line(results)})",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    _figure_legend(fig, axes)
    return fig


def plot_retrieval_by_position(results: list[dict]):
    """Retrieval-probe accuracy against the position of the target in the context (the mean
    over seeds, bars: their range), with chance (1 / alphabet) and the position-blind
    bag-of-symbols baseline."""
    if not _has_probe(results, "retrieval"):
        raise ValueError("these results have no retrieval results to plot")
    objectives = _objectives([r for r in results if "retrieval" in r["probes"]])
    fig, axes = _axes(max(1, len(objectives)), width=6.4, height=3.8)
    markers = "osD^vPX*<>"
    for ax, objective in zip(axes, objectives, strict=False):
        groups = {
            e: [r for r in runs if "retrieval" in r["probes"]]
            for e, runs in _encoding_groups(results, objective).items()
        }
        groups = {e: runs for e, runs in groups.items() if runs}
        for i, (encoding, runs) in enumerate(groups.items()):
            tables = [r["probes"]["retrieval"]["by_position"] for r in runs]
            positions = tables[0]["position"]
            mean, low, high = _mean_and_range([t["accuracy"] for t in tables])
            step = min((b - a for a, b in zip(positions, positions[1:], strict=False)), default=1)
            # a small sideways offset per encoding, so lines at the same accuracy stay visible
            shift = (i - (len(groups) - 1) / 2) * 0.5 * step / max(1, len(groups))
            xs = [p + shift for p in positions]
            # (clamped at 0: the mean of equal values can exceed them by a rounding error)
            errors = [[max(0.0, m - lo) for m, lo in zip(mean, low, strict=True)],
                      [max(0.0, hi - m) for m, hi in zip(mean, high, strict=True)]]  # fmt: skip
            ax.errorbar(xs, mean, yerr=errors, marker=markers[i % len(markers)], ms=3.5, lw=1.2,
                        capsize=1.5, alpha=0.85, color=encoding_color(encoding), label=encoding)  # fmt: skip
        if groups:
            probe = next(iter(groups.values()))[0]["probes"]["retrieval"]
            ax.axhline(probe["chance"], color="black", ls=":", lw=0.8, label="chance")
            ax.axhline(probe["bag_of_symbols_baseline"], color="black", ls="--", lw=0.8,
                       label="bag of symbols")  # fmt: skip
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("position of the target in the context")
        ax.set_ylabel("accuracy (mean, range over seeds)")
        ax.set_title(OBJECTIVE_TITLES[objective], fontsize=10)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"Retrieval probe by target position ({_source_line(results)})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_probe_accuracy(results: list[dict]):
    """Accuracy of each probe (rows of panels) per encoding and objective: a bar for the mean
    over seeds, a dot per seed, chance dotted (and the bag-of-symbols floor for retrieval)."""
    if not _has_probe(results, None):
        raise ValueError("these results have no probe results to plot")
    panels = [
        (task, objective)
        for task in ("word_order", "retrieval")
        for objective in _objectives([r for r in results if task in r["probes"]])
    ]
    fig, axes = _axes(len(panels), width=4.4, height=3.3)
    for ax, (task, objective) in zip(axes, panels, strict=True):
        groups = _encoding_groups([r for r in results if task in r["probes"]], objective)
        for i, (encoding, runs) in enumerate(groups.items()):
            value = spread(runs, task)
            color = encoding_color(encoding)
            ax.bar(i, value.mean, 0.7, color=color, alpha=0.75)
            ax.plot([i] * value.n, list(value.values.values()), "o", color="black", ms=2.5)
        probe = next(iter(groups.values()))[0]["probes"][task]
        ax.axhline(probe["chance"], color="black", ls=":", lw=0.8)
        if "bag_of_symbols_baseline" in probe:
            ax.axhline(probe["bag_of_symbols_baseline"], color="black", ls="--", lw=0.8)
        ax.set_xticks(range(len(groups)), list(groups), rotation=60, fontsize=7)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("accuracy on held-out examples")
        floor = "; dashed: bag of symbols" if "bag_of_symbols_baseline" in probe else ""
        ax.set_title(f"{task.replace('_', '-')} · {objective} (dotted: chance{floor})", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"Probes after a short fine-tune, dots = seeds ({_source_line(results)})", fontsize=9
    )
    fig.tight_layout()
    return fig


def plot_ablations(results: list[dict]):
    """Each ablation minus its own encoding, seed by seed (dots), their mean (bar) and 95%
    interval (line), for the test loss, the far targets with a long context and the probes."""
    far = results[0]["identity"]["evaluation"]["offset_multiples"][-1]
    metrics = [("val_loss", "test loss"), (f"long@{far}L", "far targets, long context"),
               ("word_order", "word order"), ("retrieval", "retrieval")]  # fmt: skip
    rows = [
        (objective, ablation)
        for objective in _objectives(results)
        for ablation in ABLATIONS
        if any(
            paired(results, objective, ablation.name, ablation.encoding, name) is not None
            for name, _ in metrics
        )
    ]
    if not rows:
        raise ValueError("these results have no ablation with its encoding to compare")
    fig, axes = _axes(len(metrics), width=3.3, height=0.32 * len(rows) + 1.4)
    for ax, (name, title) in zip(axes, metrics, strict=True):
        for y, (objective, ablation) in enumerate(rows):
            diff = paired(results, objective, ablation.name, ablation.encoding, name)
            if diff is None:
                continue
            ax.barh(y, diff.mean, 0.6, color=encoding_color(ablation.encoding), alpha=0.5)
            if diff.n > 1:
                lo, hi = diff.ci()
                ax.plot([lo, hi], [y, y], color="black", lw=1)
            ax.plot(list(diff.differences.values()), [y] * diff.n, "o", color="black", ms=2.5)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [f"{o} {a.name}" for o, a in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{title}: ablation - encoding", fontsize=8)
        ax.grid(alpha=0.3, axis="x")
        if ax is not axes[0]:
            ax.set_yticklabels([])
    fig.suptitle(
        f"Ablations, paired by seed; line = 95% interval ({_source_line(results)})", fontsize=9
    )
    fig.tight_layout()
    return fig


def plot_cost_table(results: list[dict], timing: dict | None = None):
    """A table: parameters (total and in position tables) of every arm and, from a timing pass
    (:func:`course_lib.compare.timing.timing_pass`), its training tokens per second by the wall
    clock and per CPU second; without one, the speed measured during the runs (mean over
    seeds, taken while other work may have shared the machine), labelled so."""
    speeds = {}
    if timing is not None:
        speeds = {
            (row["objective"], row["arm"]): (row["tokens_per_second"], row["tokens_per_cpu_second"])
            for row in timing["rows"]
        }
    rows = []
    for (objective, arm), runs in by_arm(results).items():
        m = runs[0]["metrics"]
        if timing is not None:
            wall, cpu = speeds.get((objective, arm), (math.nan, math.nan))
            speed = [f"{wall:,.0f}", f"{cpu:,.0f}"]
        else:
            during = statistics.fmean(r["metrics"]["tokens_per_second_during_run"] for r in runs)
            speed = [f"{during:,.0f}", "n/a"]
        parameters = m["parameters"]
        rows.append(
            [
                objective,
                arm,
                f"{parameters['total']:,}",
                f"{parameters['position_embeddings']:,}",
                *speed,
            ]
        )
    wall_label = "tokens/s (timing pass)" if timing is not None else "tokens/s (during runs)"
    columns = ["objective", "arm", "parameters", "in position table", wall_label, "per CPU s"]
    fig, ax = plt.subplots(figsize=(7.6, 0.24 * (len(rows) + 1) + 0.6))
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
    "position_buckets.png": plot_position_buckets,
    "position_and_context.png": plot_position_and_context,
    "retrieval_by_position.png": plot_retrieval_by_position,
    "probe_accuracy.png": plot_probe_accuracy,
    "ablations.png": plot_ablations,
    "cost_table.png": plot_cost_table,
}


def _has_probe(results: list[dict], task: str | None = None) -> bool:
    return any((task in r["probes"]) if task else r["probes"] for r in results)


def _has_ablation(results: list[dict]) -> bool:
    return any(r["arm"] != r["encoding"] for r in results)


def write_figures(results: list[dict], out_dir: str | Path) -> list[Path]:
    """Draw every figure that has data (the probe figures need probe results, the ablation
    figure an ablation) and save it as a PNG in ``out_dir``; return the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in FIGURES.items():
        if draw is plot_probe_accuracy and not _has_probe(results):
            continue
        if draw is plot_retrieval_by_position and not _has_probe(results, "retrieval"):
            continue
        if draw is plot_ablations and not _has_ablation(results):
            continue
        fig = draw(results, load_timing(out_dir)) if draw is plot_cost_table else draw(results)
        path = out_dir / name
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
