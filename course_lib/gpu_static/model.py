"""Cycles per (query, key) pair of each kernel's inner loops, and ratios against anchors.

A loop iteration covers one tile of ``BLOCK_M x BLOCK_N`` (query, key) pairs, so a loop's cost
per pair is its cycles per iteration (:func:`.sass.loop_cycles`) over the tile. Per kernel:

* flash forward, dK/dV and dQ: the loop over the other axis. Each kernel has two: first the
  unmasked one, then the masked one (the diagonal band of a causal mask; bidirectional, only the
  ragged last tile, which the benchmark shape, a multiple of every block, does not have). Causal,
  the two are weighted by the tiles each visits at the benchmark shape; bidirectional, the first
  counts alone. Flash backward = dK/dV + dQ (each visits every pair once).
* stick-breaking forward: one loop per stick (bidirectional: a left and a right one, each over
  its own half of the pairs), averaged; plus, when split off, the diagonal loops, weighted by
  the tiles they visit. Backward: all loops of the row and the column kernel summed, over the
  number of sticks (1 causal, 2 bidirectional).

The anchors are recorded constants of the same model (triton 3.9.0, ptxas 13.4, sm_90a, bf16/fp16
at the benchmark shape), measured once on kernels that are not part of the course and not
compiled here: the Triton tutorial's fused attention (its unmasked loops; forward 128x64 tiles,
4 warps, 3 stages; backward 32x128 / 128x32 blocks, 4 warps, 5 stages; the same numbers serve
causal and bidirectional rows) and the stick-breaking paper's reference kernel (causal only,
64x32 tiles, 4 warps). A ratio ``anchor / course`` of 1.0 means as many cycles per pair as the
anchor, 0.5 twice as many. These are static estimates, not times.
"""

from __future__ import annotations

__all__ = ["ANCHORS", "SB_REFERENCE", "kernel_cost", "pair_costs"]

# cycles per (query, key) pair on sm_90; "bound" = the busiest class
ANCHORS = {
    64: dict(fwd=0.0664, fwd_bound="mufu", bwd=0.2188, bwd_bound="tc+tc"),
    128: dict(fwd=0.1250, fwd_bound="tc", bwd=0.4375, bwd_bound="tc+tc"),
}
SB_REFERENCE = {
    64: dict(fwd=0.2500, fwd_bound="mufu", bwd=0.5557, bwd_bound="issue"),
    128: dict(fwd=0.2500, fwd_bound="mufu", bwd=0.8145, bwd_bound="issue"),
}
ANCHOR_NAME = "Triton tutorial fused attention (fp16)"
SB_REFERENCE_NAME = "stick-breaking paper's reference kernel (causal, bf16)"


def _diagonal_share(
    tiles: tuple[int, int], causal: bool, seq: int, rows_are_queries: bool
) -> float:
    """Fraction of a causal kernel's visited tiles that lie on the diagonal band."""
    bm, bn = tiles
    if not causal:
        return 0.0
    outer, inner = (bm, bn) if rows_are_queries else (bn, bm)
    n_outer = seq // outer
    band = max(outer // inner, 1)
    visited = sum((i * outer) // inner + band for i in range(n_outer))
    return n_outer * band / visited


def kernel_cost(family: str, kernel: str, loops: list[dict], tiles: tuple[int, int],
                causal: bool, seq: int) -> tuple[float, str]:  # fmt: skip
    """Cycles per visited pair of one kernel, and the bound(s) of its loops."""
    if not loops:
        raise ValueError(f"{family} {kernel}: no inner loop found")
    pairs = tiles[0] * tiles[1]
    per = [lp["max"] / pairs for lp in loops]
    bounds = "/".join(lp["bound"] for lp in loops)
    if family == "flash":
        if len(per) == 1:
            return per[0], bounds
        if len(per) == 2:  # the unmasked loop, then the masked one (diagonal band, ragged end)
            share = _diagonal_share(tiles, causal, seq, rows_are_queries=kernel != "dkdv")
            return (1 - share) * per[0] + share * per[1], bounds
        raise ValueError(f"flash {kernel}: {len(per)} inner loops, expected 1 or 2")
    sides = 1 if causal else 2
    if kernel == "forward":
        return sum(per) / len(per), bounds
    return sum(per) / sides, bounds


def pair_costs(family: str, costs: dict[str, float], head_dim: int) -> dict:
    """Forward and backward cycles per pair of a family from its kernels' costs, with ratios."""
    if family == "flash":
        fwd, bwd = costs["forward"], costs["dkdv"] + costs["dq"]
    else:
        fwd, bwd = costs["forward"], costs["bwd_rows"] + costs["bwd_cols"]
    a = ANCHORS[head_dim]
    out = dict(fwd=fwd, bwd=bwd, fwd_x=a["fwd"] / fwd, bwd_x=a["bwd"] / bwd,
               total_x=(a["fwd"] + a["bwd"]) / (fwd + bwd))  # fmt: skip
    if family == "stick":
        s = SB_REFERENCE[head_dim]
        out["sb_total_x"] = (s["fwd"] + s["bwd"]) / (fwd + bwd)
    return out
