"""Worked solutions for notebook 08 (positions from content: FoX and CoPE).

A row holds one query's values against the keys ``0 .. i`` up to and including the query, in
position order (key ``i`` is the query itself).
"""

import torch


def fox_bias_matrix(log_forget: torch.Tensor) -> torch.Tensor:
    """FoX's ``D`` ``[n, n]`` from the log forget gates ``[n]``: ``D_ij = sum_{l=j+1..i} log f_l``
    for ``j <= i`` and 0 above the diagonal, with one cumulative sum (no loop over pairs).

    ``c_t = sum_{l <= t} log f_l``, so ``D_ij = c_i - c_j``.
    """
    c = torch.cumsum(log_forget, dim=0)
    return torch.tril(c[:, None] - c[None, :])


def cope_counts(scores: torch.Tensor, npos: int) -> torch.Tensor:
    """CoPE's positions ``[i + 1]`` of one query from its scaled scores ``[i + 1]`` against
    keys ``0 .. i``: ``p_j = min(sum_{l=j..i} sigmoid(s_l), npos - 1)``.

    The sum from key ``j`` to the query is a reversed cumulative sum (key ``j`` included).
    """
    gates = torch.sigmoid(scores)
    return gates.flip(0).cumsum(0).flip(0).clamp(max=npos - 1)


def cope_row_bias(q: torch.Tensor, table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """CoPE's bias ``[m]`` for one query ``q`` ``[d]``, the table ``e`` ``[npos, d]`` and counts
    ``positions`` ``[m]`` in ``[0, npos - 1]``: ``z[floor p] (1 - w) + z[ceil p] w`` with
    ``z = e q`` (``npos`` dot products, then scalars) and ``w = p - floor p``."""
    z = table @ q  # [npos]
    lower = positions.floor()
    w = positions - lower
    return z[lower.long()] * (1 - w) + z[positions.ceil().long()] * w
