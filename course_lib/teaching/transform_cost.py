"""Per token once, per pair fused: what a q/k transform costs inside the attention loops and
outside them (notebook 03's kernel swap).

A rotation (RoPE, xPos, ExpoSB's amplitude) changes each row of q and k the same way whatever it
is paired with: O(seq x head_dim) work. A fused attention kernel walks the keys once for every
block of queries, so a rotation applied to the key tile inside that walk is repeated for every
query block that reads the tile; applied before the walk it is done once. Here are the counts
(no timing: they hold on any machine) and what the course's GPU check measured on an H200 when
the kernels still rotated inside the loops (committed results, labelled with the device and
commit that measured them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GPU_CHECK",
    "GPU_REPORT",
    "LoopRotations",
    "loop_rotations",
    "measured_rows",
    "pass_share",
    "print_measured",
]

FIGURES = Path(__file__).resolve().parents[2] / "figures"
GPU_CHECK = FIGURES / "gpu_check" / "nvidia_h200.json"
GPU_REPORT = FIGURES / "gpu_report.json"
TRANSFORM_PASSES = ("encode_q", "encode_k", "decode_q", "decode_k")
#: Commits whose kernels rotated q and k inside the attention loops (a GPU check of one of them
#: is labelled so; the kernels rotate once, before the loops, since the pass of
#: ``kernels/qk_transform.py``).
ROTATED_INSIDE = ("5fae098",)


@dataclass(frozen=True)
class LoopRotations:
    """How often each key row is rotated in one forward pass, by where the rotation is done."""

    seq: int
    block_m: int
    causal: bool
    inside: float  # per key row, rotated in the loop: the query blocks that read its tile

    def __str__(self) -> str:
        mask = "causal" if self.causal else "bidirectional"
        return (
            f"{self.seq} tokens, {self.block_m} queries per block, {mask}: each key row is "
            f"rotated {self.inside:g} times inside the forward loop (on average), once before it"
        )


def loop_rotations(seq: int, block_m: int, causal: bool = True) -> LoopRotations:
    """Rotations of one key row in a forward pass whose query blocks have ``block_m`` rows.

    Bidirectional: every query block reads every key tile, ``ceil(seq / block_m)`` times.
    Causal: the key at index ``j`` is read by the query blocks that hold a query ``>= j``, the
    last ``n - floor(j / block_m)`` of ``n`` blocks; averaged over the keys.
    """
    for name, value in (("seq", seq), ("block_m", block_m)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    blocks = -(-seq // block_m)
    if not causal:
        return LoopRotations(seq, block_m, causal, float(blocks))
    total = sum(blocks - j // block_m for j in range(seq))
    return LoopRotations(seq, block_m, causal, round(total / seq, 2))


def measured_rows(path: Path = GPU_CHECK, seq: int = 4096, head_dim: int = 64) -> list[dict]:
    """Forward + backward times of plain softmax, RoPE and xPos at ``seq`` tokens from a
    committed GPU check: each kernel and what a learner would run instead (SDPA; the
    encoding's PyTorch transform, then SDPA). Rows: ``method``, ``contender``, ``ms``."""
    data = json.loads(Path(path).read_text())
    rows = [
        dict(method=r["method"], contender=r["contender"], ms=r["ms"])
        for r in data["speed"]
        if r["seq"] == seq and r["head_dim"] == head_dim and r["pass_"] == "fwd+bwd"
        and r["dtype"] == "bf16" and r["causal"] and r["status"] == "ok"
        and r["method"] in ("softmax", "rope", "xpos")
        and r["contender"] in ("kernel", "SDPA", "transform + SDPA")
    ]  # fmt: skip
    if not rows:
        raise ValueError(f"{path} has no forward + backward rows at {seq} tokens, D{head_dim}")
    return rows


def print_measured(path: Path = GPU_CHECK, seq: int = 4096, head_dim: int = 64) -> None:
    """Print :func:`measured_rows` as a table, with the device, the software and the commit
    that measured them (whether those kernels rotated q and k inside the loops,
    :data:`ROTATED_INSIDE`)."""
    meta = json.loads(Path(path).read_text())["meta"]
    inside = meta["commit"][:7] in ROTATED_INSIDE
    kernels = "kernels that rotated inside the loops" if inside else "kernels that rotate once"
    print(
        f"Measured on an {meta['device']['name']} (torch {meta['torch']}, triton "
        f"{meta['triton']}, commit {meta['commit'][:7]}: {kernels}), "
        f"bf16, causal, {seq} tokens, head_dim {head_dim}, forward + backward:"
    )
    for r in measured_rows(path, seq, head_dim):
        print(f"  {r['method']:<8} {r['contender']:<17} {r['ms']:6.2f} ms")


def pass_share(
    seq: int,
    head_dim: int = 64,
    causal: bool = True,
    path: Path = GPU_REPORT,
    calibrated: bool = True,
) -> float:
    """A static estimate (no GPU): the q/k transform's passes (encode q and k, decode their
    gradients) over plain flash attention's loops, forward + backward, bf16, at ``seq`` tokens.

    The passes' cycles are the bytes they move over an H100's DRAM bandwidth
    (:func:`course_lib.gpu_static.model.token_pass_cost`). ``calibrated``: the loops' cost is the
    calibrated model's (:mod:`course_lib.gpu_static.calibrate`, fitted to the committed H200
    measurement; what the course judges its speed goals on), ``passes / (k C)``; otherwise the
    committed report's plain flash row on the uncalibrated no-overlap bound (``fwd_no +
    bwd_no``, sm_90), which charges every instruction in turn. Per pair, a pass costs less the
    longer the sequence: its bytes grow with ``seq``, the pairs with ``seq^2``."""
    from course_lib.gpu_static import calibrate, model

    rep = json.loads(Path(path).read_text())
    rows = [
        e for e in rep["model"]
        if e["family"] == "flash" and e["features"] == "plain" and e["causal"] == causal
        and e["head_dim"] == head_dim and e["dtype"] == "bf16" and "error" not in e
    ]  # fmt: skip
    if not rows:
        raise ValueError(f"{path} has no plain flash row for head_dim {head_dim}, bf16")
    passes = sum(model.token_pass_cost(n, head_dim, 2, causal, seq) for n in TRANSFORM_PASSES)
    if calibrated:
        plain = calibrate.row_features(
            rep, "flash", "plain", causal, head_dim, "bf16", seq, "fwd+bwd"
        )
        with_passes = dict(plain, passes=plain["passes"] + passes)
        row = dict(features=with_passes, plain=plain, pass_="fwd+bwd")
        return 1 / calibrate.predict(calibrate.committed_params(), row) - 1
    return passes / (rows[0]["fwd_no"] + rows[0]["bwd_no"])
