"""Figures and the explorer of notebook 01b: the online softmax, one query, block by block.

One query with scores ``s [n]`` against ``n`` keys with scalar values ``v [n]``. After the key
blocks ``B_1..B_t`` the online softmax holds ``m_t = max s_j``, ``l_t = sum_j exp(s_j - m_t)``
and ``a_t = sum_j exp(s_j - m_t) v_j`` (``j`` in the blocks seen so far); ``a_t / l_t`` is
exactly softmax attention over those keys, and ``a_T / l_T`` the full answer.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

__all__ = ["online_softmax_trace", "plot_online_softmax", "explorer_inputs", "flash_explorer"]


def online_softmax_trace(
    scores: torch.Tensor, values: torch.Tensor, block_size: int
) -> dict[str, torch.Tensor]:
    """Run the online softmax over ``scores`` ``[n]`` and ``values`` ``[n]`` in blocks.

    Returns float64 tensors with one entry per block: ``"end"`` (keys seen so far), ``"m"``,
    ``"l"``, ``"alpha"`` (the rescale ``exp(m_{t-1} - m_t)`` applied at that block; 0 at the
    first), ``"running"`` (``a_t / l_t``) and ``"exact"`` (``softmax(s[:end]) @ v[:end]``,
    computed directly).
    """
    if scores.dim() != 1 or scores.shape != values.shape:
        raise ValueError(
            f"scores and values must be [n], got {tuple(scores.shape)}, {tuple(values.shape)}"
        )
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    s, v = scores.double(), values.double()
    m = torch.tensor(float("-inf"), dtype=torch.float64)
    l_sum = torch.zeros((), dtype=torch.float64)
    acc = torch.zeros((), dtype=torch.float64)
    rows = {name: [] for name in ("end", "m", "l", "alpha", "running", "exact")}
    for start in range(0, len(s), block_size):
        block_s, block_v = s[start : start + block_size], v[start : start + block_size]
        m_new = torch.maximum(m, block_s.max())
        alpha = torch.exp(m - m_new)
        p = torch.exp(block_s - m_new)
        l_sum = alpha * l_sum + p.sum()
        acc = alpha * acc + (p * block_v).sum()
        m = m_new
        end = start + len(block_s)
        for name, value in (
            ("end", end), ("m", m), ("l", l_sum), ("alpha", alpha), ("running", acc / l_sum),
            ("exact", torch.softmax(s[:end], dim=0) @ v[:end]),
        ):  # fmt: skip
            rows[name].append(float(value))
    return {name: torch.tensor(values, dtype=torch.float64) for name, values in rows.items()}


def plot_online_softmax(scores: torch.Tensor, values: torch.Tensor, block_size: int) -> plt.Figure:
    """Left: the scores and the running max ``m_t`` as the blocks arrive. Right: the running
    output ``a_t / l_t`` after each block next to softmax attention over the keys seen so far."""
    trace = online_softmax_trace(scores, values, block_size)
    n = len(scores)
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.2))
    ax = axes[0]
    ax.plot(range(n), scores.double(), "o", ms=3, color="0.45", label="score s_j")
    starts = torch.cat((torch.zeros(1), trace["end"][:-1]))
    for t, (a, b) in enumerate(zip(starts.tolist(), trace["end"].tolist(), strict=True)):
        ax.hlines(float(trace["m"][t]), a - 0.5, b - 0.5, color="crimson", lw=2,
                  label="running max m_t" if t == 0 else None)  # fmt: skip
        ax.axvline(b - 0.5, color="0.85", lw=0.8)
    ax.set(xlabel="key j (blocks between the grey lines)", ylabel="score")
    ax.set_title(f"one query, {n} keys, blocks of {block_size}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[1]
    ax.plot(trace["end"], trace["exact"], "s", ms=7, mfc="none", color="black",
            label="softmax over the keys seen so far")  # fmt: skip
    ax.plot(trace["end"], trace["running"], ".-", color="crimson", label="a_t / l_t (online)")
    ax.axhline(float(trace["exact"][-1]), color="0.6", lw=0.8, ls="--", label="final answer")
    ax.set(xlabel="keys seen", ylabel="output (scalar values)")
    ax.set_title("the running output is exact at every block", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def explorer_inputs(
    spike_at: int = 40, num_keys: int = 64, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explorer's scores and values (float64 ``[num_keys]``): standard normal, seeded, with
    the score of key ``spike_at`` set to 6."""
    if not 0 <= spike_at < num_keys:
        raise ValueError(f"spike_at must be in 0..{num_keys - 1}, got {spike_at}")
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(num_keys, generator=gen, dtype=torch.float64)
    values = torch.randn(num_keys, generator=gen, dtype=torch.float64)
    scores[spike_at] = 6.0
    return scores, values


def flash_explorer(block_size: int = 8, spike_at: int = 40, num_keys: int = 64, seed: int = 0):
    """The explorer's figure: random scores with one large score at key ``spike_at``, in blocks
    of ``block_size`` (:func:`explorer_inputs`). Watch ``m_t`` jump at the spike's block and the
    output follow it."""
    return plot_online_softmax(*explorer_inputs(spike_at, num_keys, seed), block_size)
