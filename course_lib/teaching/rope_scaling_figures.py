"""Figures, tables and the explorer of notebook 07 (RoPE past its training length).

Everything about frequencies comes from :func:`course_lib.encodings.rope_frequencies`; the
experiment's figures read the results of :mod:`course_lib.teaching.rope_scaling_experiment`.
Each plotting function returns the figure it drew.

Notation: pair ``t`` of a head of dimension ``D`` turns by ``theta_t = base**(-2t/D)`` radians
per token, its wavelength is ``lambda_t = 2 pi / theta_t`` tokens, and over a training length
``L`` it turns ``r_t = L / lambda_t`` times (the YaRN paper's ``r``).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from course_lib.encodings import REGISTRY, rope_frequencies, rope_inverse_frequencies

__all__ = [
    "VARIANT_COLORS",
    "VARIANT_LABELS",
    "pair_turns",
    "frequency_ratio",
    "unseen_pairs",
    "plot_wavelengths",
    "plot_scaled_angles",
    "plot_position_curves",
    "plot_bucket_losses",
    "plot_retrieval",
    "bucket_table",
    "seed_values",
    "average_runs",
    "scaling_explorer",
]

VARIANT_LABELS = {
    "plain": "RoPE, plain",
    "linear": "PI (linear)",
    "ntk": "NTK-aware",
    "dynamic": "dynamic NTK",
    "yarn": "YaRN",
    "alibi": "ALiBi",
    "rse": "stick-breaking (rse)",
}
VARIANT_COLORS = {
    "plain": "#555555",
    "linear": "#1f77b4",
    "ntk": "#ff7f0e",
    "dynamic": "#9467bd",
    "yarn": "#2ca02c",
    "alibi": REGISTRY["alibi"].color,
    "rse": REGISTRY["rse"].color,
}
FIXES = ("linear", "ntk", "dynamic", "yarn")


def pair_turns(head_dim: int, train_len: int, base: float = 10000.0) -> torch.Tensor:
    """``r_t = L / lambda_t = L theta_t / (2 pi)`` for each pair ``[head_dim/2]`` (float64)."""
    return train_len * rope_inverse_frequencies(head_dim, base).double() / (2 * math.pi)


def _scaling(rope_type: str, factor: float, train_len: int) -> dict:
    return {"rope_type": rope_type, "factor": factor, "original_max_position_embeddings": train_len}


def frequency_ratio(
    rope_type: str,
    factor: float,
    head_dim: int,
    train_len: int,
    base: float = 10000.0,
    seq_len: int | None = None,
) -> torch.Tensor:
    """``theta'_t / theta_t`` per pair: 1 where a scaling leaves the pair alone, ``1/s`` where it
    interpolates. ``seq_len`` is the current length (dynamic only; default ``factor * L``, and
    then the factor of the dynamic rule is 1, so its effective factor is ``seq_len / L``)."""
    plain = rope_inverse_frequencies(head_dim, base).double()
    if rope_type == "dynamic":
        seq_len = seq_len if seq_len is not None else round(factor * train_len)
        scaling = _scaling("dynamic", 1.0, train_len)
    else:
        scaling = _scaling(rope_type, factor, train_len)
    scaled, _ = rope_frequencies(head_dim, base=base, scaling=scaling, seq_len=seq_len)
    return scaled.double() / plain


def unseen_pairs(
    trained: torch.Tensor, used: torch.Tensor, train_len: int, length: int
) -> torch.Tensor:
    """Bool ``[pairs]``: pairs read at angles training never showed them.

    Training at ``L`` with frequencies ``trained`` (``w_t``) showed pair ``t`` every angle when
    it completed a turn (``L w_t >= 2 pi``), and only ``[0, L w_t]`` otherwise. Reading
    ``length`` tokens with frequencies ``used`` (``w'_t``) reaches ``length * w'_t``; a small
    tolerance keeps exact interpolation (``length * w_t / s = L w_t``) inside.
    """
    shown = train_len * trained.double()
    never_turned = shown < 2 * math.pi
    return never_turned & (length * used.double() > shown * (1 + 1e-6))


def plot_wavelengths(cases: list[tuple[str, int, int]], base: float = 10000.0):
    """Wavelength ``lambda_t`` of each pair against the training length, one panel per case
    ``(title, head_dim, train_len)``; pairs with ``r_t < 1`` (fewer than one turn in training)
    are drawn in red."""
    fig, axes = plt.subplots(1, len(cases), figsize=(5.2 * len(cases), 3.4), squeeze=False)
    for ax, (title, head_dim, train_len) in zip(axes[0], cases, strict=True):
        wavelength = 2 * math.pi / rope_inverse_frequencies(head_dim, base).double()
        r = train_len / wavelength
        pairs = torch.arange(head_dim // 2)
        short = r >= 1
        ax.scatter(
            pairs[short],
            wavelength[short],
            s=18,
            color="#1f77b4",
            label="r >= 1: full turns in training",
        )
        ax.scatter(
            pairs[~short],
            wavelength[~short],
            s=18,
            color="#d62728",
            label="r < 1: never a full turn",
        )
        ax.axhline(train_len, color="black", lw=1, ls="--")
        ax.text(0, train_len * 1.3, f"training length L = {train_len}", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("pair t")
        ax.set_ylabel("wavelength 2π/θ_t (tokens)")
        ax.set_title(f"{title}: D = {head_dim}, base {base:g}", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_scaled_angles(head_dim: int, train_len: int, factor: float, base: float = 10000.0):
    """One panel per fix: ``theta'_t / theta_t`` of each pair against ``r_t`` (log-log), at
    ``s = factor``; red crosses mark pairs whose angles at ``factor * L`` leave the trained range."""
    r = pair_turns(head_dim, train_len, base)
    plain = rope_inverse_frequencies(head_dim, base)
    length = round(factor * train_len)
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.3), sharey=True)
    for ax, kind in zip(axes, FIXES, strict=True):
        ratio = frequency_ratio(kind, factor, head_dim, train_len, base)
        unseen = unseen_pairs(plain, plain.double() * ratio, train_len, length)
        ax.plot(r, ratio, "o-", ms=3, color=VARIANT_COLORS[kind])
        ax.plot(r[unseen], ratio[unseen], "x", color="#d62728", ms=7)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1 / factor, color="black", lw=0.8, ls=":")
        ax.axvline(1.0, color="#999999", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.invert_xaxis()
        title = VARIANT_LABELS[kind]
        if kind == "dynamic":
            title += f" (at n = {length})"
        if kind == "yarn":
            _, temp = rope_frequencies(
                head_dim, base=base, scaling=_scaling("yarn", factor, train_len)
            )
            ax.axvline(32.0, color="#999999", lw=0.8, ls="--")
            title += f", q,k x {temp:.3f}"
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("r = L/λ (turns in training), fast pairs left")
    axes[0].set_ylabel("θ'/θ (1 = kept, 1/s = interpolated)")
    fig.suptitle(
        f"What each fix does to each pair (D = {head_dim}, L = {train_len}, s = {factor:g}); "
        "x: angles past the trained range at s·L",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _smooth(values: list[float], window: int) -> torch.Tensor:
    x = torch.tensor(values, dtype=torch.float64)
    kernel = torch.ones(window, dtype=torch.float64) / window
    padded = torch.cat((x[:1].expand(window - 1), x))
    return torch.nn.functional.conv1d(padded[None, None], kernel[None, None])[0, 0]


def plot_position_curves(
    entries: list[dict],
    train_len: int,
    title: str,
    window: int = 16,
    dashed: list[dict] = (),
    dashed_label: str = "",
):
    """Loss by position (moving average over ``window`` positions) of each entry's
    ``per_position`` curve, the training length marked; ``dashed`` entries (e.g. the same tokens
    read with a short context) are drawn dashed in their model's colour, labelled with
    ``dashed_label``."""
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    for entry in entries:
        name = entry["model"]
        curve = _smooth(entry["per_position"], window)
        ax.plot(curve, color=VARIANT_COLORS[name], lw=1.4, label=VARIANT_LABELS[name])
    for entry in dashed:
        name = entry["model"]
        curve = _smooth(entry["per_position"], window)
        ax.plot(curve, color=VARIANT_COLORS[name], lw=1.1, ls="--",
                label=f"{VARIANT_LABELS[name]}, {dashed_label}")  # fmt: skip
    ax.axvline(train_len, color="black", lw=1, ls="--")
    low, high = ax.get_ylim()
    ax.text(train_len + 4, low + 0.02 * (high - low), "training length", fontsize=8, va="bottom")
    ax.set_xlabel("position of the predicting token")
    ax.set_ylabel(f"loss, nats/byte (mean of {window})")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=3, loc="upper center")
    fig.tight_layout()
    return fig


def plot_bucket_losses(results: dict):
    """Loss per position bucket, one panel per (protocol, length): zero-shot on top, after the
    short fine-tune below; one line per variant."""
    lengths = results["lengths"]
    buckets = results["buckets"]
    fig, axes = plt.subplots(2, len(lengths), figsize=(4.3 * len(lengths), 6.2), sharey=True)
    for row, key in enumerate(("zero_shot", "finetuned")):
        for col, length in enumerate(lengths):
            ax = axes[row, col]
            for entry in results[key]:
                if entry["length"] != length:
                    continue
                values = [v for v in entry["buckets"] if v is not None]
                name = entry["model"]
                ax.plot(range(len(values)), values, "o-", ms=4, color=VARIANT_COLORS[name],
                        label=VARIANT_LABELS[name])  # fmt: skip
            shown = [b for b in buckets if b[0] < length]
            ax.set_xticks(range(len(shown)), [f"{a}-{min(b, length) - 1}" for a, b in shown])
            protocol = "zero-shot" if key == "zero_shot" else "after the fine-tune"
            ax.set_title(f"read at {length}, {protocol}", fontsize=10)
            ax.set_xlabel("positions")
            if col == 0:
                ax.set_ylabel("loss (nats/byte)")
    handles, labels = axes[0, -1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    return fig


def plot_retrieval(results: dict):
    """Retrieval accuracy of the probe placed at the end of a window of ``n`` tokens, zero-shot
    (lines) and after the fine-tune at the longest length (stars)."""
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    lengths = [results["train_len"], *results["lengths"]]
    offsets = {name: 0.012 * (i - 3) for i, name in enumerate(VARIANT_LABELS)}
    for name in VARIANT_LABELS:
        entries = {e["length"]: e for e in results["zero_shot"] if e["model"] == name}
        if not entries:
            continue
        encoding = next(iter(entries.values()))["encoding"]
        start = results["base"][encoding]["retrieval_64"]
        values = [start] + [entries[n]["retrieval"] for n in results["lengths"]]
        shifted = [v + offsets[name] for v in values]
        ax.plot(
            lengths, shifted, "o-", color=VARIANT_COLORS[name], label=VARIANT_LABELS[name], ms=4
        )
    longest = max(results["lengths"])
    for entry in results["finetuned"]:
        if entry["length"] == longest and entry["retrieval"] is not None:
            ax.plot(
                [longest * 1.08],
                [entry["retrieval"] + offsets[entry["model"]]],
                "*",
                ms=10,
                color=VARIANT_COLORS[entry["model"]],
            )
    ax.axhline(results["probe_chance"], color="black", lw=0.8, ls=":")
    ax.text(lengths[0], results["probe_chance"] + 0.02, "chance 1/26", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("the probe ends a window of n tokens (★: after the fine-tune at 512)")
    ax.set_ylabel("retrieval accuracy\n(lines offset slightly)")
    ax.set_ylim(-0.03, 1.05)
    ax.legend(fontsize=7, ncol=2, loc="center left")
    fig.tight_layout()
    return fig


def bucket_table(
    results: dict, key: str, length: int, suffix: str = "", header: bool = True
) -> str:
    """A text table of one protocol (``"zero_shot"``, ``"finetuned"`` or ``"windowed"``) at one
    length: loss per bucket (3 decimals) and retrieval accuracy (2 decimals, ``-`` when not
    measured); ``suffix`` is appended to each row's label, ``header=False`` leaves out the
    header line (to append rows to another table)."""
    shown = [b for b in results["buckets"] if b[0] < length]
    width = max(30, max(len(label) for label in VARIANT_LABELS.values()) + len(suffix) + 1)
    lines = []
    if header:
        lines.append(
            f"{'':{width}}"
            + "".join(f"{f'{a}-{min(b, length) - 1}':>9}" for a, b in shown)
            + f"{'retrieval':>11}"
        )
    for entry in results[key]:
        if entry["length"] != length:
            continue
        cells = "".join(f"{v:9.3f}" for v in entry["buckets"] if v is not None)
        acc = entry.get("retrieval")
        label = VARIANT_LABELS[entry["model"]] + suffix
        lines.append(f"{label:{width}}{cells}{'-' if acc is None else f'{acc:.2f}':>11}")
    return "\n".join(lines)


def seed_values(
    results: dict, section: str, model: str, length: int, read=lambda entry: entry["mean"]
) -> list[float]:
    """``read(entry)`` for the entry of ``model`` read at ``length`` in ``section``
    (``"zero_shot"``, ``"finetuned"`` or ``"windowed"``) of every seed, in seed order: the
    values a paired comparison over seeds takes. ``section="base"`` reads
    ``results["runs"][i]["base"][model]`` (``length`` ignored)."""
    out = []
    for run in sorted(results["runs"], key=lambda r: r["seed"]):
        if section == "base":
            out.append(read(run["base"][model]))
            continue
        found = [e for e in run[section] if e["model"] == model and e["length"] == length]
        if len(found) != 1:
            raise ValueError(
                f"seed {run['seed']}: no single {section} entry of {model} at {length}"
            )
        out.append(read(found[0]))
    return out


def _mean(values: list) -> object:
    if all(v is None for v in values):
        return None
    if isinstance(values[0], list):
        return [_mean(list(column)) for column in zip(*values, strict=True)]
    return sum(values) / len(values)


def average_runs(results: dict) -> dict:
    """``results`` with the per-seed runs averaged: ``zero_shot``, ``finetuned`` and
    ``windowed`` entries (buckets, mean, per-position curve, retrieval) and ``base`` values as
    means over the seeds, in the layout of one seed's run (what the tables and figures read)."""
    runs = sorted(results["runs"], key=lambda r: r["seed"])
    averaged = {k: v for k, v in results.items() if k != "runs"}
    for section in ("zero_shot", "finetuned", "windowed"):
        entries = []
        for i, entry in enumerate(runs[0][section]):
            same = [run[section][i] for run in runs]
            if any((e["model"], e["length"]) != (entry["model"], entry["length"]) for e in same):
                raise ValueError(f"the seeds' {section} entries are not in the same order")
            mean = dict(entry)
            for key in ("buckets", "mean", "per_position", "retrieval"):
                if key in entry:
                    mean[key] = _mean([e[key] for e in same])
            entries.append(mean)
        averaged[section] = entries
    averaged["base"] = {
        name: {key: _mean([run["base"][name][key] for run in runs]) for key in info}
        for name, info in runs[0]["base"].items()
    }
    return averaged


def scaling_explorer(
    rope_type: str = "yarn",
    factor: float = 8.0,
    head_dim: int = 16,
    train_len: int = 64,
    base: float = 10000.0,
):
    """Left: ``theta'/theta`` per pair for one scaling (plain RoPE for comparison). Right: the
    largest angle each pair reaches at ``factor * L`` divided by the largest angle training
    showed it, ``L theta_t``: above 1, the pair is read at angles it never saw. Pairs that
    completed a turn in training saw every angle: their bars are capped at 1."""
    plain = rope_inverse_frequencies(head_dim, base).double()
    ratio = frequency_ratio(rope_type, factor, head_dim, train_len, base)
    length = round(factor * train_len)
    shown = train_len * plain
    turned = shown >= 2 * math.pi

    def reached(used: torch.Tensor) -> torch.Tensor:
        value = length * used / shown
        return torch.where(turned, value.clamp(max=1.0), value)

    reach = {"plain RoPE": reached(plain), VARIANT_LABELS[rope_type]: reached(plain * ratio)}
    pairs = torch.arange(head_dim // 2)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 3.4))
    left.plot(
        pairs, torch.ones_like(ratio), "o-", ms=3, color=VARIANT_COLORS["plain"], label="plain RoPE"
    )
    left.plot(
        pairs, ratio, "o-", ms=3, color=VARIANT_COLORS[rope_type], label=VARIANT_LABELS[rope_type]
    )
    left.set_yscale("log")
    left.set_xlabel("pair t (fast to slow)")
    left.set_ylabel("θ'_t / θ_t")
    left.set_ylim(min(0.5 / factor, 0.5), 2.0)
    left.legend(fontsize=8)
    left.set_title(f"frequencies, s = {factor:g}, L = {train_len}, D = {head_dim}", fontsize=10)
    width = 0.4
    for i, (label, values) in enumerate(reach.items()):
        color = VARIANT_COLORS["plain"] if i == 0 else VARIANT_COLORS[rope_type]
        right.bar(pairs + (i - 0.5) * width, values, width, color=color, label=label)
    right.axhline(1.0, color="black", lw=1, ls="--")
    right.set_yscale("log")
    right.set_xlabel("pair t")
    right.set_ylabel("largest angle at s·L / largest seen\n(capped at 1 after a full turn)")
    right.set_title(f"angles at n = {length}: above the line = never seen", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
