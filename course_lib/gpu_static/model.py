"""Cycles per (query, key) pair of each kernel's inner loops, and ratios against anchors.

A loop iteration covers one tile of ``BLOCK_M x BLOCK_N`` (query, key) pairs, so a loop's cost
per pair is its cycles per iteration (:func:`.sass.loop_cycles`, both bounds: ``overlap`` and
``no_overlap``, spill traffic charged in each) over the tile. Per kernel:

* flash forward, dK/dV and dQ: the loop over the other axis. Each kernel has two: first the
  unmasked one, then the masked one (the diagonal band of a causal mask; bidirectional, only the
  ragged last tile, which the benchmark shape, a multiple of every block, does not have). Causal,
  the two are weighted by the tiles each visits at the benchmark shape; bidirectional, the first
  counts alone. With a hook's far form (causal), three: the far tiles (no bias), the unmasked
  tiles nearer than the reach, the diagonal band, weighted by the tiles each visits at the
  benchmark shape for the reach given. Flash backward = dK/dV + dQ (each visits every pair
  once). A loop nested in a
  tile loop (T5's loop over the buckets present in a tile) counts at one trip per tile: at the
  benchmark shape with T5's default 128-token reach, almost every tile lies in one bucket.
* stick-breaking forward: one loop per stick (bidirectional: a left and a right one, each over
  its own half of the pairs), averaged; plus, when split off, the diagonal loops, weighted by
  the tiles they visit. Backward: all loops of the row and the column kernel summed, over the
  number of sticks (1 causal, 2 bidirectional).

The anchors are constants of the same model (triton 3.9.0, ptxas 13.4, sm_90a, fp16 at the
benchmark shape) for kernels that are not part of the course and are not compiled here:

* the Triton tutorial's fused attention (``python/tutorials/06-fused-attention.py`` of
  triton-lang/triton: its Hopper forward with tensor descriptors, 128x64 tiles, 4 warps,
  3 stages; its backward, 32x128 / 128x32 blocks, 4 warps, 5 stages), compiled with
  :func:`.aot.compile_launch` and measured with :func:`.sass.inner_loops` on its unmasked loops
  (the same numbers serve causal and bidirectional rows). Its backward spills inside its loops
  (at head_dim 128, 2.5 KB per thread and about 280 local accesses per dK/dV iteration); the
  ratios use its figures **without** that charge (``bwd_spilled`` records the charged one), so
  a ratio against the tutorial never gains from the tutorial's spills;
* the stick-breaking paper's reference kernel (causal only, 64x32 tiles, 4 warps), recorded
  for the ``overlap`` bound only, without a spill charge.

A ratio ``anchor / course`` of 1.0 means as many cycles per pair as the anchor, 0.5 twice as
many. These are static estimates, not times.

Per-token passes (:data:`PER_TOKEN_PASSES`: the q/k transform's encode and decode, the
backward's ``delta`` or ``delta_split``) have no inner loop: they move O(seq x head_dim) bytes. The ratios to plain
flash (:func:`relative_to_plain`) add their DRAM traffic (:func:`token_pass_cost`) to the
loops', as cycles per pair at the benchmark shape: a q/k transform then costs what it moves,
once per call, rather than nothing (it used to be in the loops, where the instruction count
saw it). The ratios to the tutorial stay loops against loops.
"""

from __future__ import annotations

from course_lib.gpu_static import targets

__all__ = [
    "ANCHORS",
    "ANCHOR_OCCUPANCY",
    "anchor_facts",
    "BOUNDS",
    "CLOCK_HZ",
    "DRAM_BYTES_PER_SM_CYCLE",
    "FAR_REACH",
    "PER_TOKEN_PASSES",
    "SB_REFERENCE",
    "SM_COUNT",
    "far_tile_counts",
    "kernel_cost",
    "kernel_facts",
    "occupancy_cell",
    "pair_costs",
    "relative_to_plain",
    "token_pass_bytes",
    "token_pass_cost",
]

BOUNDS = ("overlap", "no_overlap")

# cycles per (query, key) pair on sm_90; "bound" = the busiest class (overlap bound)
ANCHORS = {
    64: dict(fwd=0.0664, fwd_bound="mufu", bwd=0.2188, bwd_bound="tc+tc",
             fwd_no=0.1289, bwd_no=0.3662, bwd_spilled=0.2217, bwd_no_spilled=0.3691),
    128: dict(fwd=0.1250, fwd_bound="tc", bwd=0.4375, bwd_bound="tc+tc",
              fwd_no=0.2017, bwd_no=0.7544, bwd_spilled=0.9229, bwd_no_spilled=1.2397),
}  # fmt: skip
# The tutorial's kernels as compiled for sm_90 (per pass: registers, warps, stages, shared
# memory in bytes, block-wide barriers per iteration of the unmasked loop(s)).
ANCHOR_OCCUPANCY = {
    64: dict(fwd=dict(regs=191, warps=4, stages=3, smem=66560, barriers=5),
             bwd=dict(regs=255, warps=4, stages=5, smem=74752, barriers=2)),
    128: dict(fwd=dict(regs=254, warps=4, stages=3, smem=132096, barriers=5),
              bwd=dict(regs=255, warps=4, stages=5, smem=148480, barriers=2)),
}  # fmt: skip
SB_REFERENCE = {
    64: dict(fwd=0.2500, fwd_bound="mufu", bwd=0.5557, bwd_bound="issue"),
    128: dict(fwd=0.2500, fwd_bound="mufu", bwd=0.8145, bwd_bound="issue"),
}
ANCHOR_NAME = "Triton tutorial fused attention (fp16)"
SB_REFERENCE_NAME = "stick-breaking paper's reference kernel (causal, bf16)"


# Passes over the tokens, with no inner loop (the launches' names).
PER_TOKEN_PASSES = ("delta", "delta_split", "encode_q", "encode_k", "decode_q", "decode_k")
#: The kernel families whose tile loops the model costs (CoPE's scan is compiled, not modelled).
FAMILIES = ("flash", "stick")
# The far form's reach at the benchmark: T5's with its defaults (32 buckets, 128,
# unidirectional), where its last bucket starts (course_lib.encodings.t5.t5_distance_reach). A
# runtime value: it changes no compile, only how the far loop is weighted against the others.
FAR_REACH = 113
# An H100 SXM's (and an H200's) SMs and boost clock (NVIDIA's datasheets).
SM_COUNT = 132
CLOCK_HZ = 1.98e9
# DRAM bytes per SM per clock on an H100 SXM (its datasheet: 3.35 TB/s of HBM3); an H200 has
# 4.8 TB/s, so this is the slower of the two.
DRAM_BYTES_PER_SM_CYCLE = 3.35e12 / (SM_COUNT * CLOCK_HZ)


def token_pass_bytes(name: str, head_dim: int, elem: int) -> int:
    """DRAM bytes one pass moves per row (token of one head), 16-bit or fp32 (``elem`` bytes).

    ``encode_*``: read the row, write ``x'``. ``decode_*``: the loops write the gradient w.r.t.
    ``x'`` in float32 instead of ``elem`` bytes, the pass reads it and writes the gradient (the
    tables, ``[seq, head_dim/2]`` float32 shared by batch and heads, come from L2 after the first
    head: not counted). ``delta``: read the output and its gradient, write one float32;
    ``delta_split`` (a causal launch with a split bias) also reads ``lse`` and the hook's
    per-token value and writes ``lse - u``, three float32 more (the positions, shared by the
    heads, come from L2)."""
    if name.startswith("encode_"):
        return 2 * head_dim * elem
    if name.startswith("decode_"):
        return head_dim * (4 - elem) + head_dim * 4 + head_dim * elem
    if name == "delta":
        return 2 * head_dim * elem + 4
    if name == "delta_split":
        return 2 * head_dim * elem + 4 + 3 * 4
    raise ValueError(f"{name!r} is not a per-token pass ({', '.join(PER_TOKEN_PASSES)})")


def token_pass_cost(name: str, head_dim: int, elem: int, causal: bool, seq: int) -> float:
    """A per-token pass's cycles per (query, key) pair on one SM: its bytes per row over the
    SM's share of DRAM bandwidth, spread over the pairs of a row (``seq / 2`` causal)."""
    pairs_per_row = seq / 2 if causal else seq
    return token_pass_bytes(name, head_dim, elem) / DRAM_BYTES_PER_SM_CYCLE / pairs_per_row


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


def far_tile_counts(
    tiles: tuple[int, int], seq: int, kernel: str, reach: int, far_rows: int | None = None
) -> tuple[int, int, int]:
    """``(far, near, band)``: the (query, key) pairs a causal flash kernel visits in its three
    loops at ``seq`` tokens (a multiple of both blocks), with a far form of reach ``reach``
    (tokens): the tiles every pair of which is at least ``reach`` apart, the other unmasked
    ones, and the diagonal band, as ``kernels/flash.py`` splits them (dK/dV: far tiles of
    ``far_rows`` queries, default ``BLOCK_M``, ending at the last query)."""
    bm, bn = tiles
    far = near = band = 0
    if kernel != "dkdv":  # rows are query blocks, walking key blocks
        for q0 in range(0, seq, bm):
            mid = q0 // bn * bn
            far_end = min(max(q0 - reach + 1, 0) // bn * bn, mid)
            far += far_end * bm
            near += (mid - far_end) * bm
            band += -(-(min(q0 + bm, seq) - mid) // bn) * bn * bm
    else:  # rows are key blocks, walking query blocks
        fm = far_rows or bm
        for k0 in range(0, seq, bn):
            lo = k0 // bm * bm
            band_end = -(-(k0 + bn) // bm) * bm
            far_start = min(max(-(-(k0 + bn - 1 + reach) // bm) * bm, band_end), seq)
            far_start = seq - max(seq - far_start, 0) // fm * fm
            far += (seq - far_start) * bn
            near += max(far_start - band_end, 0) * bn
            band += (min(band_end, seq) - lo) * bn
    return far, near, band


def kernel_cost(family: str, kernel: str, loops: list[dict], tiles: tuple[int, int],
                causal: bool, seq: int, far_reach: int | None = None,
                far_rows: int | None = None) -> tuple[dict, str]:  # fmt: skip
    """Cycles per visited pair of one kernel under each bound (``{"overlap": ..,
    "no_overlap": ..}``), and the bound(s) of its loops (e.g. ``"tc/issue+spill"``);
    ``far_reach``: the reach of a hook's far form (flash, causal: three loops), ``far_rows``:
    the rows of the dK/dV kernel's far tiles (default: its ``BLOCK_M``)."""
    if not loops:
        raise ValueError(f"{family} {kernel}: no inner loop found")
    pairs = tiles[0] * tiles[1]
    bounds = "/".join(lp["bound"] for lp in loops)
    cost = {}
    for b in BOUNDS:
        per = [lp[b] / pairs for lp in loops]
        if family == "flash":
            if len(per) == 1:
                cost[b] = per[0]
            elif len(per) == 2:  # the unmasked loop, then the masked one (diagonal, ragged end)
                share = _diagonal_share(tiles, causal, seq, rows_are_queries=kernel != "dkdv")
                cost[b] = (1 - share) * per[0] + share * per[1]
            elif len(per) == 3 and causal and far_reach is not None:  # far, near, band
                counts = far_tile_counts(tiles, seq, kernel, far_reach, far_rows)
                if kernel == "dkdv" and far_rows:  # its far tiles hold far_rows x BLOCK_N pairs
                    per[0] = loops[0][b] / (far_rows * tiles[1])
                cost[b] = sum(n * c for n, c in zip(counts, per, strict=True)) / sum(counts)
            else:
                raise ValueError(
                    f"flash {kernel}: {len(per)} inner loops, expected 1 or 2 (3 with a far "
                    "form, causal, given its reach)"
                )
        elif kernel == "forward":
            cost[b] = sum(per) / len(per)
        else:
            cost[b] = sum(per) / (1 if causal else 2)
    return cost, bounds


def pair_costs(family: str, costs: dict[str, dict], head_dim: int) -> dict:
    """Forward and backward cycles per pair of a family from its kernels' costs (each
    ``{"overlap": .., "no_overlap": ..}``), with ratios against the anchors.

    Overlap bound: ``fwd``, ``bwd``, ``fwd_x``, ``bwd_x``, ``total_x`` (tutorial / course) and,
    for stick-breaking, ``sb_total_x``; no-overlap bound: the same names with ``_no``
    (``total_x_no``; no stick-breaking paper figure exists for it).
    """
    a = ANCHORS[head_dim]
    out = {}
    for b, suffix in (("overlap", ""), ("no_overlap", "_no")):
        if family == "flash":
            fwd, bwd = costs["forward"][b], costs["dkdv"][b] + costs["dq"][b]
        else:
            fwd, bwd = costs["forward"][b], costs["bwd_rows"][b] + costs["bwd_cols"][b]
        af, ab = a["fwd" + suffix], a["bwd" + suffix]
        out.update({"fwd" + suffix: fwd, "bwd" + suffix: bwd, "fwd_x" + suffix: af / fwd,
                    "bwd_x" + suffix: ab / bwd, "total_x" + suffix: (af + ab) / (fwd + bwd)})  # fmt: skip
    if family == "stick":
        s = SB_REFERENCE[head_dim]
        out["sb_total_x"] = (s["fwd"] + s["bwd"]) / (out["fwd"] + out["bwd"])
    return out


def kernel_facts(row: dict) -> dict:
    """What limits one compiled kernel on its GPU, from a report row (``compile_launch``'s
    facts, :func:`.targets.occupancy` and the loops): ``regs``, ``warps``, ``stages``, ``ctas``
    and ``warps_per_sm`` (resident per SM), ``barriers`` (block-wide barriers per iteration of
    its busiest loop), ``local`` (spill loads and stores per iteration, same loop) and
    ``nested`` (loops inside its tile loops, counted at one trip)."""
    loops = row.get("loops") or []
    busiest = max(loops, key=lambda lp: lp["overlap"], default={})
    return dict(
        regs=row["regs"], warps=row["warps"], stages=row["stages"], ctas=row["ctas"],
        warps_per_sm=row["warps_per_sm"], barriers=busiest.get("barriers", 0),
        local=busiest.get("local", 0), nested=sum(len(lp.get("nested", [])) for lp in loops),
    )  # fmt: skip


def anchor_facts() -> dict[int, dict[str, dict]]:
    """:data:`ANCHOR_OCCUPANCY` with ``ctas``, the tutorial's resident CTAs per SM on sm_90
    (:func:`.targets.occupancy`), per head_dim and pass."""
    h100 = targets.TARGETS[90]
    return {
        d: {name: dict(f, ctas=targets.occupancy(h100, f["regs"], f["smem"], f["warps"])["ctas"])
            for name, f in passes.items()}
        for d, passes in ANCHOR_OCCUPANCY.items()
    }  # fmt: skip


def occupancy_cell(facts: dict) -> str:
    """``1x8w 255r 7bar 2st 12spill 2nested``: resident CTAs x warps per SM, registers,
    block-wide barriers per iteration, stages, spill accesses per iteration and nested loops
    (the last two only when present), from :func:`kernel_facts` or :func:`anchor_facts`."""
    f = facts
    text = f"{f['ctas']}x{f['warps']}w {f['regs']}r {f['barriers']}bar {f['stages']}st"
    text += f" {f['local']}spill" if f.get("local") else ""
    return text + (f" {f['nested']}nested" if f.get("nested") else "")


def relative_to_plain(entries: list[dict]) -> None:
    """Add ``plain_x`` and ``plain_x_no`` to every modelled entry: the cycles per pair
    (forward + backward, loops and per-token passes: ``passes``, when the entry has it) of plain
    flash attention with the same mask, head_dim and dtype over the entry's, under each bound
    (1.0: as fast as plain flash by this model)."""
    plain = {
        (e["causal"], e["head_dim"], e["dtype"]): e
        for e in entries
        if e["family"] == "flash" and e["features"] == "plain" and "error" not in e
    }
    for e in entries:
        p = plain.get((e["causal"], e["head_dim"], e["dtype"]))
        if p is None or "error" in e:
            continue
        pp, ep = p.get("passes", 0.0), e.get("passes", 0.0)
        e["plain_x"] = (p["fwd"] + p["bwd"] + pp) / (e["fwd"] + e["bwd"] + ep)
        e["plain_x_no"] = (p["fwd_no"] + p["bwd_no"] + pp) / (e["fwd_no"] + e["bwd_no"] + ep)
