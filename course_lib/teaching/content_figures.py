"""Figures of notebook 08: stick-breaking, FoX and CoPE as three uses of one running sum.

Each of the three sums something over the keys between query ``i`` and key ``j``. To put them on
the same sentence, every token gets one *gate logit* ``a_l = gate_bias + separator_weight *
[token l is a separator]`` (a stand-in for what a trained layer reads off the content), and each
encoding uses it its own way:

* stick-breaking: ``beta_il = sigmoid(a_l)``; the running sum ``sum_{j<l<i} softplus(a_l)`` is
  ``-log`` of the stick left when key ``j`` is reached;
* FoX: forget gate ``f_l = 1 - sigmoid(a_l)``, so ``-log f_l = softplus(a_l)``: the running sum
  ``-D_ij = sum_{j<l<=i} softplus(a_l)`` is subtracted from the scores;
* CoPE: gate ``g_il = sigmoid(a_l)`` (here the score itself is ``a_l``), the running sum ``p_ij =
  sum_{j<=l<=i} g_il`` is a count, and the bias ``z[p]`` is a preference for a count.

The content scores are otherwise equal for every key, so the pictures show what the sums do.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course_lib.attention import attention_weights
from course_lib.encodings import contextual_positions, stick_breaking_weights

__all__ = [
    "SEPARATORS",
    "cope_preference",
    "family_weights",
    "plot_family",
    "sentence_tokens",
]

SEPARATORS = frozenset(".!?;")
FAMILY = ("stick-breaking", "FoX", "CoPE")


def sentence_tokens(text: str) -> list[str]:
    """Words and punctuation marks, in order: ``"a b. c" -> ["a", "b", ".", "c"]``."""
    return re.findall(r"\w+|[^\w\s]", text)


def cope_preference(npos: int, target: int = 1, strength: float = 4.0) -> torch.Tensor:
    """``z[n] = -strength * |n - target|`` for ``n = 0 .. npos-1``: a CoPE head that prefers
    keys whose count is ``target`` (with gates on separators: the previous sentence)."""
    n = torch.arange(npos, dtype=torch.float64)
    return -strength * (n - min(target, npos - 1)).abs()


def family_weights(
    tokens: list[str],
    gate_bias: float = -4.0,
    npos: int = 8,
    separator_weight: float = 8.0,
    cope_strength: float = 4.0,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``name -> (weights [n, n], running sum [n, n])`` for the three encodings (float64).

    ``weights``: the attention each query ``i`` (row) puts on each key ``j <= i`` (stick-breaking:
    without the leftover, which goes to the query's own value). ``running sum``: what each one
    sums over the keys between ``j`` and ``i`` (see the module docstring). ``cope_strength``:
    that of :func:`cope_preference` (0: a zero table, CoPE without a preferred count);
    ``separator_weight`` 0: every token gets the same gate.
    """
    if len(tokens) < 2:
        raise ValueError("type at least two tokens")
    if npos < 2:
        raise ValueError(f"npos must be >= 2, got {npos}")
    n = len(tokens)
    sep = torch.tensor([t in SEPARATORS for t in tokens], dtype=torch.float64)
    a = gate_bias + separator_weight * sep  # [n], one gate logit per key
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    rows = a.expand(n, n)

    # stick-breaking: logits a_j for every query; -log(stick left) before key j
    stick = stick_breaking_weights(rows, causal=True)
    sp = torch.where(causal.tril(-1), F.softplus(rows), 0.0)
    stick_sum = torch.where(causal.tril(-1), sp.flip(-1).cumsum(-1).flip(-1) - sp, 0.0)

    # FoX: log f_l = -softplus(a_l), content scores all 0
    log_forget = -F.softplus(a).view(1, 1, n)
    zeros = torch.zeros(1, 1, n, 2, dtype=torch.float64)
    fox = attention_weights(zeros, zeros, method="fox", causal=True, log_forget=log_forget)[0, 0]
    c = log_forget[0, 0].cumsum(0)
    fox_sum = torch.where(causal, -(c[:, None] - c[None, :]), 0.0)

    # CoPE: q_i = (sqrt 2, 1), k_j = (a_j, 0), so s_ij = a_j; e[p] = (0, z[p])
    q = torch.tensor([math.sqrt(2.0), 1.0], dtype=torch.float64).expand(1, 1, n, 2)
    k = torch.stack((a, torch.zeros_like(a)), -1).view(1, 1, n, 2)
    preference = cope_preference(npos, strength=cope_strength)
    table = torch.stack((torch.zeros(npos, dtype=torch.float64), preference), -1)
    cope = attention_weights(q, k, method="cope", causal=True, position_embeddings=table)[0, 0]
    counts = contextual_positions(rows, causal, npos=10**6)  # before the clamp
    return {
        "stick-breaking": (stick, stick_sum),
        "FoX": (fox, fox_sum),
        "CoPE": (cope, torch.where(causal, counts, 0.0)),
    }


def plot_family(
    tokens: list[str], gate_bias: float = -4.0, npos: int = 8, query: int | None = None
):
    """Top: each encoding's attention on the sentence. Bottom: for one query (default the last
    token), what each one sums over the keys between it and key ``j``, and the weights."""
    family = family_weights(tokens, gate_bias=gate_bias, npos=npos)
    n = len(tokens)
    i = n - 1 if query is None else query
    labels = {
        "stick-breaking": "sum softplus(a) between: -log stick left",
        "FoX": "-D_ij = sum -log f between",
        "CoPE": f"count p_ij (the bias clamps it at {npos - 1})",
    }
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.2), gridspec_kw={"height_ratios": [1.3, 1]})
    for col, name in enumerate(FAMILY):
        weights, running = family[name]
        ax = axes[0, col]
        ax.imshow(weights.numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"{name}: attention")
        ticks = range(n) if n <= 24 else range(0, n, max(1, n // 12))
        ax.set_xticks(list(ticks), [tokens[t] for t in ticks], rotation=90, fontsize=7)
        ax.set_yticks(list(ticks), [tokens[t] for t in ticks], fontsize=7)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        ax = axes[1, col]
        keys = torch.arange(i + 1)
        ax.bar(keys.numpy(), weights[i, : i + 1].numpy(), color="#9ecae1", label="weight")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel(f"key j (query: {tokens[i]!r}, token {i})")
        twin = ax.twinx()
        twin.plot(keys.numpy(), running[i, : i + 1].numpy(), color="#d62728", marker=".")
        twin.set_ylabel(labels[name], color="#d62728", fontsize=8)
        for t in range(i + 1):
            if tokens[t] in SEPARATORS:
                ax.axvline(t, color="grey", lw=0.6, ls=":")
        ax.legend(loc="upper left", fontsize=7)
    fig.suptitle(f"gate logit a = {gate_bias:+.1f} + 8 x [separator]; CoPE prefers count 1")
    fig.tight_layout()
    return fig
