"""Figures and the explorer of notebook 04 (ExpoSB): its three mechanisms and their side effects.

The formulas come from :mod:`course_lib.encodings` (``exposb_amplitude``, ``exposb_band_gain``,
``exposb_distance_factor``); each function returns the figure it drew.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import matplotlib.pyplot as plt
import torch

from course_lib.encodings import (
    apply_exposb,
    apply_rope,
    exposb_amplitude,
    exposb_band_gain,
    exposb_distance_factor,
    rope_inverse_frequencies,
)

__all__ = [
    "plot_amplitude",
    "plot_band_gain",
    "plot_distance_factor",
    "shift_test_curves",
    "plot_shift_test",
    "plot_distance_options",
    "exposb_row",
    "exposb_explorer",
]


def plot_amplitude(max_position: int = 5000, train_length: int = 256) -> plt.Figure:
    """``a(m) = 1 + 0.2 exp(-0.001 m)`` against the position, with a few values marked."""
    m = torch.arange(max_position + 1)
    a = exposb_amplitude(m)
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    ax.plot(m.numpy(), a.numpy(), lw=1.5)
    ax.axvspan(0, train_length, color="0.9", label=f"positions 0..{train_length - 1}")
    ax.axhline(1.0, color="0.5", lw=0.8, ls="--", label="plain RoPE (a = 1)")
    for p in (0, 1000, 3000):
        value = float(exposb_amplitude(torch.tensor(p)))
        ax.plot([p], [value], "o", color="crimson", ms=4)
        ax.annotate(
            f"a({p}) = {value:.3f}",
            (p, value),
            textcoords="offset points",
            xytext=(6, 6),
            fontsize=8,
        )
    ax.set(xlabel="position m", ylabel="amplitude a(m)", ylim=(0.98, 1.23))
    ax.set_title("Mechanism 1: amplitude of the rotation", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return fig


def plot_band_gain(head_dim: int = 64, base: float = 10000.0) -> plt.Figure:
    """Left: the gain ``g(d)`` of every channel. Right: the gains of the two channels of each
    rotation pair, in the interleaved and the half layout, against the pair's wavelength."""
    gain = exposb_band_gain(head_dim)
    d = torch.arange(head_dim)
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.1))
    axes[0].bar(d.numpy(), gain.numpy(), color="tab:blue", width=0.8)
    axes[0].axvline(head_dim / 4, color="crimson", lw=1, ls="--", label="centre D/4")
    axes[0].set(xlabel="channel d", ylabel="gain g(d)", ylim=(0.7, 1.25))
    axes[0].set_title(f"Mechanism 2: band-pass gain (D = {head_dim})", fontsize=10)
    axes[0].legend(fontsize=8)
    half = head_dim // 2
    wavelength = (2 * math.pi / rope_inverse_frequencies(head_dim, base).double()).numpy()
    t = torch.arange(half)
    layouts = {
        "interleaved": (gain[2 * t], gain[2 * t + 1]),
        "half": (gain[t], gain[t + half]),
    }
    for (name, (first, second)), color in zip(
        layouts.items(), ("tab:blue", "tab:orange"), strict=True
    ):
        axes[1].plot(
            wavelength, first.numpy(), "o-", color=color, ms=3, lw=1, label=f"{name}: first channel"
        )
        axes[1].plot(
            wavelength,
            second.numpy(),
            "x--",
            color=color,
            ms=4,
            lw=1,
            label=f"{name}: second channel",
        )
    axes[1].set_xscale("log")
    axes[1].set(xlabel="wavelength of the pair 2π/θ_t (tokens)", ylabel="gain", ylim=(0.7, 1.25))
    axes[1].set_title("gains of the two channels of each pair", fontsize=10)
    axes[1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def plot_distance_factor(
    max_distance: int, report_table: dict[int, float], train_length: int = 256
) -> plt.Figure:
    """``f(|m-n|) = 0.7 + 0.3 exp(-0.005 |m-n|)`` with the report's tabulated values on top."""
    distance = torch.arange(max_distance + 1)
    f = exposb_distance_factor(distance)
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    ax.plot(distance.numpy(), f.numpy(), lw=1.5, label="f(|m − n|)")
    ax.plot(list(report_table), list(report_table.values()), "x", color="crimson", ms=7,
            label="the report's table")  # fmt: skip
    ax.axhline(0.7, color="0.5", lw=0.8, ls="--", label="floor 0.7")
    ax.axvline(train_length, color="0.6", lw=0.8, ls=":", label=f"distance {train_length}")
    ax.set(xlabel="distance |m − n| (tokens)", ylabel="factor f", ylim=(0.65, 1.03))
    ax.set_title("Mechanism 3: distance factor", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def shift_test_curves(
    shifts: torch.Tensor, *, head_dim: int = 64, offset: int = 5, samples: int = 512, seed: int = 0
) -> dict[str, torch.Tensor]:
    """How much the score of a query-key pair changes when both positions move by ``s``.

    For random q, k and each variant, the score ``S(s + offset, s)`` is compared with
    ``S(offset, 0)``: returned is ``mean |S(s+offset, s) - S(offset, 0)| / mean |S(offset, 0)|``
    over ``samples`` pairs, one value per shift (``[len(shifts)]``). Variants: plain RoPE,
    ExpoSB's amplitude alone, its band-pass gain alone, and the full ExpoSB transform (both
    layouts). The distance factor depends on ``|m - n|`` only, so it cannot change under a shift.
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(samples, 1, head_dim, generator=gen)
    k = torch.randn(samples, 1, head_dim, generator=gen)
    gain = exposb_band_gain(head_dim)

    def rope(x, p, style):
        return apply_rope(x, p, style=style)

    def amplitude_only(x, p, style):
        return apply_rope(x, p, style=style) * exposb_amplitude(p)[:, None]

    def gain_only(x, p, style):
        return apply_rope(x, p, style=style) * gain

    def full(x, p, style):
        return apply_exposb(x, p, style=style)

    variants = {
        "RoPE": (rope, "interleaved"),
        "ExpoSB amplitude only": (amplitude_only, "interleaved"),
        "ExpoSB band gain only (interleaved)": (gain_only, "interleaved"),
        "ExpoSB full (interleaved)": (full, "interleaved"),
        "ExpoSB full (half)": (full, "half"),
    }
    out = {}
    for name, (encode, style) in variants.items():

        def score(m, n, encode=encode, style=style):
            qm = encode(q, torch.tensor([m]), style)
            kn = encode(k, torch.tensor([n]), style)
            return (qm * kn).sum(-1)[:, 0].double()

        reference = score(offset, 0)
        changes = [(score(int(s) + offset, int(s)) - reference).abs().mean() for s in shifts]
        out[name] = torch.stack(changes) / reference.abs().mean()
    return out


def plot_shift_test(shifts: torch.Tensor, curves: dict[str, torch.Tensor]) -> plt.Figure:
    """The pooled score changes ``mean |dS| / mean |S|`` of :func:`shift_test_curves` against the
    shift."""
    fig, ax = plt.subplots(figsize=(6.8, 3.2))
    styles = {"RoPE": dict(color="k", lw=2)}
    for name, values in curves.items():
        ax.plot(
            shifts.numpy(),
            100 * values.numpy(),
            marker="o",
            ms=3,
            label=name,
            **styles.get(name, {}),
        )
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, float(shifts[-1]))
    ax.set(xlabel="common shift s of both positions", ylabel="pooled change (%)")
    ax.set_title("Shift test: score of (s + 5, s) vs (5, 0)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def plot_distance_options(
    distance: torch.Tensor, baseline: torch.Tensor, options: dict[str, torch.Tensor]
) -> plt.Figure:
    """Left: each option's weight divided by the plain softmax weight, per key, against the
    distance. Right: each option's row sum and its mass on the 100 nearest keys."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.3), gridspec_kw={"width_ratios": [1.6, 1]})
    colors = ("tab:blue", "tab:orange", "tab:green")
    for (name, row), color in zip(options.items(), colors[: len(options)], strict=True):
        axes[0].scatter(distance.numpy(), (row / baseline).numpy(), s=3, color=color, label=name)
    axes[0].axhline(1.0, color="0.5", lw=0.8, ls="--")
    axes[0].set(xlabel="distance of the key |m − n|", ylabel="weight / softmax weight")
    axes[0].set_title("how each option reweights one query's keys", fontsize=10)
    axes[0].legend(fontsize=7, markerscale=3)
    names = ["softmax"] + list(options)
    rows = [baseline] + list(options.values())
    near = distance < 100
    x = torch.arange(len(names)).float()
    axes[1].bar(x - 0.2, [float(r.sum()) for r in rows], width=0.4, label="row sum")
    axes[1].bar(
        x + 0.2, [float(r[near].sum()) for r in rows], width=0.4, label="mass on distance < 100"
    )
    axes[1].set_xticks(x.tolist(), [n.split(":")[0] for n in names], fontsize=8)
    axes[1].set_ylim(0, 1.3)
    axes[1].set_title("row sums", fontsize=10)
    axes[1].legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    return fig


def exposb_row(
    shift: int,
    reweight: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    length: int = 256,
    head_dim: int = 32,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention row of the last of ``length`` tokens at positions ``shift + 0..length-1``.

    q, k are random (fixed ``seed``). Returns ``(rope_row, exposb_row)``, each ``[length]``:
    softmax of the RoPE logits, and ``reweight(logits, distance)`` of the ExpoSB logits
    (q and k transformed by amplitude, rotation and band gain; the distance factor is left to
    ``reweight``).
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(length, head_dim, generator=gen)
    k = torch.randn(length, head_dim, generator=gen)
    positions = shift + torch.arange(length)
    scale = 1 / math.sqrt(head_dim)
    last = positions[-1:]
    rope_logits = (apply_rope(q[-1:], last) @ apply_rope(k, positions).T)[0] * scale
    exposb_logits = (apply_exposb(q[-1:], last) @ apply_exposb(k, positions).T)[0] * scale
    distance = (last - positions).abs()
    return torch.softmax(rope_logits, -1), reweight(exposb_logits, distance)


def exposb_explorer(
    shift: int,
    option: str,
    options: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
    length: int = 256,
) -> plt.Figure:
    """One query's attention row for RoPE and ExpoSB, at positions starting at 0 and at ``shift``.

    ``options[option]`` turns ExpoSB's logits and distances into weights (see notebook 04).
    Left: the rows against the key's distance. Right: what ExpoSB does to this row, per key:
    the logit multiplier ``a(m) a(n)`` and the distance factor ``f``.
    """
    if option not in options:
        raise ValueError(f"unknown option {option!r}; valid: {', '.join(map(repr, options))}")
    if shift < 0:
        raise ValueError(f"shift must be >= 0, got {shift}")
    reweight = options[option]
    _, exposb0 = exposb_row(0, reweight, length=length)
    rope_s, exposb_s = exposb_row(shift, reweight, length=length)
    distance = torch.arange(length - 1, -1, -1)
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.2))
    ax = axes[0]
    ax.plot(
        distance.numpy(),
        rope_s.numpy(),
        color="0.6",
        lw=2.5,
        label=f"RoPE (any shift; here {shift})",
    )
    ax.plot(
        distance.numpy(),
        exposb0.numpy(),
        color="tab:blue",
        lw=1,
        ls="--",
        label="ExpoSB, positions from 0",
    )
    ax.plot(
        distance.numpy(),
        exposb_s.numpy(),
        color="crimson",
        lw=1,
        label=f"ExpoSB, positions from {shift}",
    )
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, length)
    ax.set(xlabel="distance of the key", ylabel="weight")
    ax.set_title(
        f"{option}: row sums {float(exposb0.sum()):.3f} / {float(exposb_s.sum()):.3f}", fontsize=9
    )
    ax.legend(fontsize=7)
    ax = axes[1]
    for first, color, style in ((0, "tab:blue", "--"), (shift, "crimson", "-")):
        amplitude = exposb_amplitude(first + torch.arange(length))
        ax.plot(distance.numpy(), (amplitude[-1] * amplitude).numpy(), color=color, ls=style,
                label=f"a(m)·a(n), positions from {first}")  # fmt: skip
    ax.plot(distance.numpy(), exposb_distance_factor(distance).numpy(), color="tab:green",
            label="distance factor f (any shift)")  # fmt: skip
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, length)
    ax.set(xlabel="distance of the key", ylim=(0.65, 1.5))
    ax.set_title(
        f"logit multiplier and distance factor (query at {shift + length - 1})", fontsize=9
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
