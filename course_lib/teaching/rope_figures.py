"""Figures and the explorer of notebook 03 (RoPE): rotations, frequency bands, long-range decay.

Everything is computed from :mod:`course_lib.encodings` (the RoPE angles ``p * base**(-2t/D)``)
and drawn with matplotlib; each function returns the figure it drew.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from course_lib.encodings import rope_angles, rope_inverse_frequencies

__all__ = [
    "rotation_matrix",
    "roformer_bound",
    "rope_score_vs_distance",
    "plot_pair_rotation",
    "plot_score_vs_distance",
    "plot_frequency_bands",
    "rope_explorer",
]


def rotation_matrix(angle: float | torch.Tensor) -> torch.Tensor:
    """The 2x2 rotation ``[[cos a, -sin a], [sin a, cos a]]`` (RoFormer eq. 13), float32."""
    a = torch.as_tensor(angle, dtype=torch.float64)
    c, s = torch.cos(a), torch.sin(a)
    return torch.stack((torch.stack((c, -s)), torch.stack((s, c)))).to(torch.float32)


def roformer_bound(head_dim: int, max_distance: int, *, base: float = 10000.0) -> torch.Tensor:
    """RoFormer's long-term-decay bound (Su et al. 2021, section 3.4.3), ``[max_distance + 1]``.

    With ``h_t = q_t conj(k_t)`` for pairs ``t = 0 .. D/2 - 1`` (pairs as complex numbers),
    ``S_j = sum_{t<j} e^{i d theta_t}`` (``S_0 = 0``) and the convention ``h_{D/2} = 0``, Abel
    summation gives ``|q . R(d) k| <= max_{0 <= t < D/2} |h_{t+1} - h_t| * sum_{j=1}^{D/2} |S_j|``;
    the maximum includes ``|h_{D/2} - h_{D/2-1}| = |h_{D/2-1}|`` (without it the bound is false:
    ``q = k`` all ones has every difference 0 and score ``D`` at ``d = 0``). This returns the
    bound's distance factor, the mean RoFormer plots, ``(1 / (D/2)) sum_{j=1}^{D/2} |S_j(d)|``
    (``(D/2 + 1) / 2`` at ``d = 0``), float64.
    """
    theta = rope_inverse_frequencies(head_dim, base).double()  # [D/2]
    distance = torch.arange(max_distance + 1, dtype=torch.float64)
    phase = distance[:, None] * theta  # [N, D/2]
    partial_sums = torch.polar(torch.ones_like(phase), phase).cumsum(-1)  # S_1 .. S_{D/2}
    return partial_sums.abs().mean(-1)


def rope_score_vs_distance(
    head_dim: int,
    max_distance: int,
    *,
    base: float = 10000.0,
    samples: int = 1024,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Two views of the RoPE score ``q . R(d) k`` as a function of the distance ``d``.

    With pairs as complex numbers, ``q . R(d) k = Re sum_t q_t conj(k_t) exp(i d theta_t)``.
    Returns float64 curves ``[max_distance + 1]`` (and ``"distance"``):

    * ``"bound"``: :func:`roformer_bound`, the distance factor of RoFormer's upper bound on
      ``|score|``;
    * ``"ones"``: ``q = k = (1, ..., 1)``, score divided by its value at ``d = 0``, i.e.
      ``mean_t cos(d theta_t)`` (also the expected curve of a random Gaussian ``q = k``);
    * ``"independent"``: independent Gaussian ``q, k``, the mean ``|score|`` over ``samples``
      draws divided by ``sqrt(head_dim)``.
    """
    theta = rope_inverse_frequencies(head_dim, base).double()  # [D/2]
    distance = torch.arange(max_distance + 1, dtype=torch.float64)
    phase = distance[:, None] * theta  # [N, D/2]
    cos, sin = phase.cos(), phase.sin()
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(samples, head_dim // 2, 2, generator=gen, dtype=torch.float64)
    k = torch.randn(samples, head_dim // 2, 2, generator=gen, dtype=torch.float64)
    # Re[q conj(k) e^{i phi}] = (q1 k1 + q2 k2) cos phi - (q2 k1 - q1 k2) sin phi
    dot = (q * k).sum(-1)  # [S, D/2]
    cross = q[..., 1] * k[..., 0] - q[..., 0] * k[..., 1]
    independent = (dot @ cos.T - cross @ sin.T).abs().mean(0)
    return {
        "distance": distance,
        "bound": roformer_bound(head_dim, max_distance, base=base),
        "ones": cos.mean(-1),
        "independent": independent / math.sqrt(head_dim),
    }


def plot_pair_rotation(x: torch.Tensor, theta: float, positions: range) -> plt.Figure:
    """One channel pair ``x`` ``[2]`` rotated by ``m * theta`` for each position ``m``."""
    fig, ax = plt.subplots(figsize=(3.8, 3.8))
    circle = torch.linspace(0, 2 * math.pi, 200)
    radius = float(x.norm())
    ax.plot(radius * circle.cos(), radius * circle.sin(), color="0.85", lw=1)
    colors = plt.cm.viridis(torch.linspace(0, 1, len(positions)).numpy())
    for color, m in zip(colors, positions, strict=True):
        y = rotation_matrix(m * theta) @ x
        ax.annotate(
            "", xy=(float(y[0]), float(y[1])), xytext=(0, 0),
            arrowprops=dict(arrowstyle="->", color=color, lw=1.8),
        )  # fmt: skip
        ax.text(1.12 * float(y[0]), 1.12 * float(y[1]), f"m={m}", fontsize=8, ha="center")
    lim = 1.35 * radius
    ax.set(
        xlim=(-lim, lim),
        ylim=(-lim, lim),
        aspect="equal",
        xlabel="channel 2t",
        ylabel="channel 2t+1",
    )
    ax.set_title(f"a pair rotated by m·θ (θ = {theta:g} rad)", fontsize=10)
    return fig


def plot_score_vs_distance(curves: dict[str, torch.Tensor], head_dim: int) -> plt.Figure:
    """Left: the distance factor of RoFormer's bound against the distance. Right: two scores
    relative to their value at distance 0, ``q = k`` and independent ``q, k`` (curves of
    :func:`rope_score_vs_distance`)."""
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.3))
    d = curves["distance"].numpy()
    ax = axes[0]
    ax.plot(d, curves["bound"].numpy(), lw=1, color="black")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, d[-1])
    ax.set_ylim(bottom=0)
    ax.set(xlabel="distance m − n (tokens)", ylabel="(1/(D/2)) Σ_j |S_j|")
    ax.set_title(f"distance factor of RoFormer's bound (head_dim {head_dim})", fontsize=10)
    ax = axes[1]
    ax.plot(d, curves["ones"].numpy(), lw=1, label="q = k: score")
    independent = curves["independent"]
    ax.plot(d, (independent / independent[0]).numpy(), lw=1, label="independent q, k: mean |score|")
    ax.axhline(0, color="0.6", lw=0.6)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, d[-1])
    ax.set(xlabel="distance m − n (tokens)", ylabel="value / value at distance 0")
    ax.set_title("actual scores, relative to distance 0", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def plot_frequency_bands(head_dim: int, num_positions: int, base: float = 10000.0) -> plt.Figure:
    """Left: ``cos(m theta_t)`` for every pair ``t`` and position ``m``. Right: the angle of a few
    pairs against the position (fast pairs wrap around many times, slow ones barely move)."""
    positions = torch.arange(num_positions)
    angles = rope_angles(positions, head_dim, base)  # [N, D/2]
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.2))
    image = axes[0].imshow(angles.cos().T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    axes[0].set(xlabel="position m", ylabel="pair t (fast → slow)")
    axes[0].set_title("cos(m·θ_t)", fontsize=10)
    fig.colorbar(image, ax=axes[0], fraction=0.05)
    half = head_dim // 2
    for t in sorted({0, 1, half // 4, half // 2, half - 1}):
        wrapped = torch.remainder(angles[:, t], 2 * math.pi)
        axes[1].plot(positions.numpy(), wrapped.numpy(), lw=1, label=f"t={t}")
    axes[1].set(xlabel="position m", ylabel="angle m·θ_t mod 2π (rad)")
    axes[1].set_title("angle per pair", fontsize=10)
    axes[1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def rope_explorer(
    position: int = 5, pair: int = 0, base: float = 10000.0, head_dim: int = 16
) -> plt.Figure:
    """Where pair ``pair`` of a vector sits at position ``position``, and what it does to scores.

    Left: the pair ``(1, 0)`` rotated to positions ``0..position`` (its trajectory on the circle).
    Middle: ``cos(m theta_t)`` of all pairs up to 4x the position, the chosen pair and position
    marked. Right: the score of ``q = k = (1, ..., 1)`` against distance for this base.
    """
    if not 0 <= pair < head_dim // 2:
        raise ValueError(
            f"pair must be in 0..{head_dim // 2 - 1} for head_dim {head_dim}, got {pair}"
        )
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    theta = float(rope_inverse_frequencies(head_dim, base)[pair])
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.2))
    ax = axes[0]
    steps = torch.arange(position + 1, dtype=torch.float64) * theta
    circle = torch.linspace(0, 2 * math.pi, 200)
    ax.plot(circle.cos(), circle.sin(), color="0.85", lw=1)
    ax.scatter(steps.cos(), steps.sin(), c=range(position + 1), cmap="viridis", s=12)
    angle = position * theta
    ax.annotate("", xy=(math.cos(angle), math.sin(angle)), xytext=(0, 0),
                arrowprops=dict(arrowstyle="->", color="crimson", lw=2))  # fmt: skip
    ax.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal")
    wavelength = 2 * math.pi / theta
    ax.set_title(f"pair {pair}: θ={theta:.3g}, wavelength {wavelength:.3g}", fontsize=9)
    ax = axes[1]
    span = max(4 * position, 32)
    angles = rope_angles(torch.arange(span + 1), head_dim, base)
    ax.imshow(angles.cos().T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    ax.axvline(position, color="k", lw=1)
    ax.axhline(pair, color="k", lw=1, ls="--")
    ax.set(xlabel="position m", ylabel="pair t")
    ax.set_title(f"cos(m·θ_t), base {base:g}", fontsize=9)
    ax = axes[2]
    curves = rope_score_vs_distance(head_dim, max(span, 64), base=base, samples=1)
    ax.plot(curves["distance"].numpy(), curves["ones"].numpy(), lw=1)
    ax.axvline(position, color="crimson", lw=1)
    ax.set(xlabel="distance", ylabel="score / score at 0")
    ax.set_title("q = k = ones: score vs distance", fontsize=9)
    fig.tight_layout()
    return fig
