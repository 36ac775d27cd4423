"""What a fused kernel costs beside plain flash attention, for the chapters that swap one in.

Two committed sources, both labelled where they are printed:

* the **static model calibrated** against an H200 (``figures/gpu_report.json`` and
  ``figures/gpu_static_calibration.json``; :mod:`course_lib.gpu_static.calibrate`): compiled
  sm_90 machine code of the kernels as they are now, no GPU needed. An estimate, not a time.
* the **H200's times** (``figures/gpu_check/nvidia_h200.json``), of the kernels at the commit
  that measured them, which may be older than the kernels the model sees.

Both at the speed goals' shape: forward + backward, causal, bf16, 4096 tokens (head_dim 64;
the model also at 128). A ratio is plain flash's time over the method's: 1.0 costs what plain
attention costs, 0.5 twice as much.
"""

from __future__ import annotations

import json
from pathlib import Path

from course_lib.gpu_static import calibrate

__all__ = ["fused_cost", "print_fused_costs", "runs"]

FIGURES = Path(__file__).resolve().parents[2] / "figures"
GPU_CHECK = FIGURES / "gpu_check" / "nvidia_h200.json"
GPU_REPORT = FIGURES / "gpu_report.json"


#: the launches that changed since the kernels the H200 measured (the calibration's rows,
#: :data:`course_lib.gpu_static.calibrate.METHODS`): KERPLE has its own hooks now (its default
#: variant's: log), where it read the per-distance table
RUNS_SINCE_MEASURED = {"kerple": ("flash", "tables+gain+kerple_log(grad)", True)}


def runs(method: str) -> tuple[str, str, bool]:
    """``(kernel family, report row, hook alone)`` of the launch ``method`` runs today, causal,
    with positions that step by a constant: the calibration's row for it
    (:data:`course_lib.gpu_static.calibrate.METHODS`, the rows with a hook compiled in their
    heaviest combination; hook alone: minus what RoPE's tables add), or the row of
    :data:`RUNS_SINCE_MEASURED`, with the far tiles where the encoding declares a
    ``distance_reach`` (T5), which the measured kernels did not have."""
    from course_lib.registry import REGISTRY

    if method not in calibrate.METHODS or method == "softmax":
        modelled = sorted(set(calibrate.METHODS) - {"softmax"})
        raise ValueError(f"method must be one of {modelled}, got {method!r}")
    family, features, alone = RUNS_SINCE_MEASURED.get(method, calibrate.METHODS[method])
    if "diagonal_table" in features and REGISTRY[method].distance_reach is not None:
        features += "+far"
    return family, features, alone


#: the module settings of a measured row that are not the course's: the GPU check times each
#: method's module as built with ``max_position_embeddings = max(seq, 512)``
#: (:func:`course_lib.gpu_check.cases.method_params`), and CoPE's ``npos`` defaults to it, so
#: its row at 4096 tokens holds 4096 counts (a ``z`` table as large as the scores; the course's
#: models count to 7 or 63); a variant such as ``npos=64`` is a row of its own (``cope npos=64``)
MEASURED_WITH = {"cope": "npos 4096 (= seq)"}

#: what the kernels of each family cost, by name (the extra work per kernel is printed)
_KERNEL_NAMES = {
    "flash": {"forward": "forward", "dkdv": "dK/dV", "dq": "dQ"},
    "stick": {"forward": "forward", "bwd_rows": "backward rows", "bwd_cols": "backward columns"},
}
_LABELS = {"alibi": "ALiBi", "t5": "T5", "kerple": "KERPLE", "fox": "FoX",
           "stick_breaking": "stick-breaking", "rse": "RSE", "cope": "CoPE"}  # fmt: skip


def _model_row(rep: dict, method: str, head_dim: int) -> dict:
    family, features, alone = runs(method)
    common = dict(causal=True, head_dim=head_dim, dtype="bf16", seq=calibrate.GOAL_SEQ,
                  pass_="fwd+bwd")  # fmt: skip
    return dict(
        features=calibrate.row_features(rep, family, features, hook_alone=alone, **common),
        plain=calibrate.row_features(rep, "flash", "plain", **common),
        pass_="fwd+bwd",
    )


def _memory_by_kernel(rep: dict, run: tuple[str, str, bool], head_dim: int) -> dict[str, float]:
    """Each kernel's memory instructions per pair over plain flash's three kernels' together
    (the term the calibrated model weighs) for one launch of :func:`runs` (hook alone where it
    says so)."""
    family, features, alone = run
    compiled = calibrate.compiled_kernels(rep)

    def mem(fam: str, feat: str, kernel: str) -> float:
        return calibrate.kernel_features(rep, fam, feat, kernel, compiled=compiled)["mem"]

    plain = sum(mem("flash", "plain", k) for k in calibrate.KERNELS["flash"])
    out = {}
    for k in calibrate.KERNELS[family]:
        own = mem(family, features, k)
        if alone:
            own += mem(family, "plain", k) - mem(family, "tables", k)
        out[_KERNEL_NAMES[family][k]] = own / plain
    return out


def _measured(method: str, seq: int = 4096, head_dim: int = 64) -> float | None:
    """Plain flash's time over the method's kernel's on the H200 (forward + backward), or None."""
    times = {}
    for r in json.loads(GPU_CHECK.read_text())["speed"]:
        if (r["contender"], r["seq"], r["head_dim"], r["dtype"], r["causal"], r["pass_"]) == (
            "kernel", seq, head_dim, "bf16", True, "fwd+bwd"
        ) and r.get("ms"):  # fmt: skip
            times[r["method"]] = r["ms"]
    if method not in times or "softmax" not in times:
        return None
    return times["softmax"] / times[method]


def _measured_model(method: str, seq: int = 4096, head_dim: int = 64) -> float | None:
    """What the calibrated model says of the kernels the H200 timed (the calibration's row of
    the measured shape, forward + backward), fitted with ``method`` left out; None without it."""
    rows = json.loads((calibrate.ROOT / calibrate.CALIBRATION).read_text())["rows"]
    for r in rows:
        if (r["method"], r["pass_"], r["seq"], r["head_dim"], r["dtype"], r["causal"]) == (
            method, "fwd+bwd", seq, head_dim, "bf16", True
        ):  # fmt: skip
            return r["predicted_loo"]
    return None


def _no_overlap(row: dict) -> float:
    """Plain flash's cycles per pair over the row's on the no-overlap bound (every instruction
    class in turn with the products; the per-token passes' cycles included)."""
    f, p = row["features"], row["plain"]
    return (p["no_overlap"] + p["passes"]) / (f["no_overlap"] + f["passes"])


def fused_cost(method: str, rep: dict | None = None) -> dict:
    """``{"calibrated": {64: ratio, 128: ratio}, "no_overlap": {64: ratio, 128: ratio},
    "memory": {kernel: share} (head_dim 64), "measured": ratio or None}`` for one modelled
    method (:func:`runs`; ratios: plain flash's time over the method's; ``no_overlap``: the
    uncalibrated bound that charges every instruction in turn; ``memory``: each kernel's memory
    instructions per pair over plain flash's, all three kernels together; ``measured_model``:
    the calibrated model of the kernels the H200 timed, that method left out of the fit, or
    None). ``rep``: the committed report, read if not given."""
    run = runs(method)
    rep = json.loads(GPU_REPORT.read_text()) if rep is None else rep
    params = calibrate.committed_params()
    rows = {d: _model_row(rep, method, d) for d in (64, 128)}
    return dict(calibrated={d: calibrate.predict(params, r) for d, r in rows.items()},
                no_overlap={d: _no_overlap(r) for d, r in rows.items()},
                memory=_memory_by_kernel(rep, run, 64), measured=_measured(method),
                measured_model=_measured_model(method))  # fmt: skip


def _times(ratio: float) -> str:
    """A speed ratio as a multiple of plain flash's time (``1.25x``; ``416x``)."""
    t = 1 / ratio
    return f"{t:.0f}x" if t >= 10 else f"{t:.2f}x"


def print_fused_costs(methods: tuple[str, ...]) -> None:
    """Print :func:`fused_cost` of each method as multiples of plain flash's time, with what
    each number is; a method the model does not cover (CoPE) gets the H200's time only, and
    says so."""
    meta = json.loads(GPU_CHECK.read_text())["meta"]
    rep = json.loads(GPU_REPORT.read_text())
    plain = _memory_by_kernel(rep, ("flash", "plain", False), 64)
    gpu = f"{meta['device']['name']} (kernels of commit {meta['commit'][:7]})"
    print("time of the fused kernel, in plain flash attention's (1.00x: the same), forward + "
          "backward, causal, bf16, 4096 tokens:")  # fmt: skip
    for m in methods:
        modelled = m in calibrate.METHODS
        cost = fused_cost(m, rep) if modelled else dict(measured=_measured(m))
        print(f"  {_LABELS.get(m, m)}")
        if modelled:
            cal, bound = cost["calibrated"], cost["no_overlap"]
            print(f"    static model, calibrated (an estimate): {_times(cal[64])} at head_dim 64, "
                  f"{_times(cal[128])} at 128")  # fmt: skip
            print(f"    static model, no-overlap bound (every instruction in turn, uncalibrated): "
                  f"{_times(bound[64])} at head_dim 64, {_times(bound[128])} at 128")  # fmt: skip
        else:
            print(f"    static model: not modelled ({calibrate.UNMODELLED.get(m, '')})")
        if cost["measured"] is not None:
            then = cost.get("measured_model")
            shape = f", {MEASURED_WITH[m]}" if m in MEASURED_WITH else ""
            print(f"    measured on the {gpu}, head_dim 64{shape}: {_times(cost['measured'])}"
                  + ("" if then is None else f"; the calibrated model of those kernels "
                     f"(fitted without {_LABELS.get(m, m)}): {_times(then)}"))  # fmt: skip
        if modelled:
            shares = ", ".join(
                f"{k} {v:.2f}" + (f" (plain {plain[k]:.2f})" if k in plain else "")
                for k, v in cost["memory"].items()
            )
            print(f"    memory instructions per pair (plain flash's total = 1): {shares}")
