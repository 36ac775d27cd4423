"""Worked solutions for notebook 05 (stick-breaking attention).

A row ``z`` ``[n]`` holds one query's logits against the keys before it, in position order
(key ``n-1`` is the nearest), except in :func:`bidirectional_row`, where it holds the logits
against all ``n`` positions of the sequence.
"""

import torch
import torch.nn.functional as F


def stick_loop(z: torch.Tensor) -> torch.Tensor:
    """Stick-breaking weights ``[n]`` of one query, by breaking the stick key by key.

    From the nearest key outward, key ``j`` takes ``sigmoid(z[j])`` of the stick that is left.
    """
    weights = torch.zeros_like(z)
    remaining = torch.ones((), dtype=z.dtype)
    for j in reversed(range(z.shape[0])):
        beta = torch.sigmoid(z[j])
        weights[j] = beta * remaining
        remaining = remaining * (1 - beta)
    return weights


def log_space_stick(z: torch.Tensor) -> torch.Tensor:
    """The same weights ``[n]`` without a loop, in log space.

    ``log A_j = logsigmoid(z_j) - sum_{l > j} softplus(z_l)``; the sum over the keys between
    key ``j`` and the query is a reversed cumulative sum, shifted by one so it excludes ``j``.
    """
    softplus = F.softplus(z)
    suffix = softplus.flip(-1).cumsum(-1).flip(-1)  # sum_{l >= j}
    between = F.pad(suffix[1:], (0, 1))  # sum_{l > j}
    return torch.exp(F.logsigmoid(z) - between)


def bidirectional_row(z: torch.Tensor, i: int) -> torch.Tensor:
    """Bidirectional stick-breaking weights ``[n]`` of the query at position ``i``.

    One stick over the keys left of ``i`` and one over the keys right of it, each broken from
    the key next to ``i`` outward, each worth half; position ``i`` itself gets 0.
    """
    weights = torch.zeros_like(z)
    weights[:i] = 0.5 * stick_loop(z[:i])
    weights[i + 1 :] = 0.5 * stick_loop(z[i + 1 :].flip(0)).flip(0)
    return weights
