"""The static model calibrated against a GPU's measured times.

The instruction count of :mod:`.model` ranks kernels by their arithmetic and issue slots; it does
not see memory. An H200 measured RoPE's fused kernel (tables applied to every key tile inside
the loops) at 0.52 of plain flash's speed, forward + backward, where the no-overlap bound said
0.90. This module adds what the count leaves out and fits the few weights of the result to the
measured ratios:

* **memory instructions per pair** (``mem``): every load, store, shared-memory access and
  asynchronous copy in the inner loops (the ``mem`` class of :func:`.sass.classify`, recorded
  per loop of every compiled launch in the report's ``compiles``), times the warps, over the
  tile's pairs, weighted over a kernel's loops as :func:`.model.kernel_cost` weights cycles (the
  diagonal share of a causal mask at the measured length). K/V/Q/dO tile copies, the q/k
  tables' loads, a bias's per-pair gathers (T5 and KERPLE's per-distance table) and its
  gradient's stores all land here, in-loop spills too (``LDL``/``STL``), and so do the
  never-executed ``@!PT LDS`` that ptxas places before each shared-memory fence: they stand
  for the fences' cost, and leaving them out made the leave-one-method-out fit worse (median
  1.14 -> 1.23);
* **the two bounds**, ``overlap`` and ``no_overlap`` cycles per pair, recomputed at the
  measured length, blended as ``(1 - w) overlap + w no_overlap``;
* **per-token passes** (``passes``: the q/k transform's encode and decode, the backward's
  ``delta``, :func:`.model.token_pass_cost` at the measured length): the DRAM cycles their
  bytes take at an H100's bandwidth (the slower of the two sm_90 GPUs). The measured kernels
  had none but ``delta``, common to all, so nothing here can weigh them; they are charged
  against plain flash's **measured** time, not against the model's cycles, which leave out
  most of it (the H200 took 2.9x the overlap bound's cycles for plain flash, forward +
  backward at 4096 tokens, at 132 SMs and 1.98 GHz): ``k``, per pass (``loop_scale``), is
  that time over the model's (:func:`loop_scale`).

Time over plain flash's (same pass, length, mask, head_dim and dtype; forward: the forward
kernel, forward + backward: every kernel summed), with ``C = (1 - w) overlap + w no_overlap``::

    T(row) / T(plain) = (1 - s) C(row) / C(plain) + s mem(row) / mem(plain)
                        + (passes(row) - passes(plain)) / (k C(plain))

and the calibrated ratio to plain flash, ``plain_x_cal``, is its inverse. Two parameters in
[0, 1]: ``w``, the blend of the bounds, and ``s``, the share of plain flash's time that goes
as its memory instructions do; fitted by least squares on ``log(predicted / measured)`` over
every (method, pass, length) the measurement holds, with no per-method constant. ``k`` is
measured at head_dim 64 (the only one timed) and 4096 tokens, the goals' length, and used at
128 too: plain flash's time and a pass's bytes both grow with the head. The uncalibrated
bounds (:func:`.model.relative_to_plain`) still charge the passes against the model's cycles.
Leave-one-method-out: refit without a method's rows, predict them.

On the committed report and H200 measurement the fit puts ``s`` at 1: the ratio of memory
instructions per pair alone predicts the measured ratios, and the instruction bounds add
nothing (``w`` is then free; it only weighs the per-token passes). Leave one method out, the
median row is off by 1.14x and the rows at 4096 tokens by at most 1.6x; at 1024 tokens (batch
16) forward rows are over-predicted by up to 2.85x (FoX): what a call does outside the inner
loops (each block's prologue, the wrapper's own torch work: FoX's cumulative gates, the
tables) is a larger share there, and the report records no instruction outside the loops.

Methods map to the report's rows (:data:`METHODS`): an encoding whose bias hook the report
compiles only in its heaviest combination (tables + gain + hook) and that has no q/k tables of
its own (ALiBi, FoX, T5, KERPLE) is modelled, kernel by kernel, as that row minus what the RoPE
tables add to plain flash (``tables`` row minus ``plain`` row): the hook alone. Methods whose
cost the report does not model are listed in :data:`UNMODELLED` with the reason.

``python -m course_lib.gpu_static.calibrate`` fits on the committed report and H200
measurement, prints predicted and measured per row and the leave-one-method-out summary, and
writes :data:`CALIBRATION` (``--check``: compare with the committed file instead).
:func:`apply` adds ``plain_x_cal`` to any report's model rows.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from course_lib.gpu_static import model

__all__ = [
    "CALIBRATION",
    "MEASUREMENT",
    "METHODS",
    "REPORT",
    "UNMODELLED",
    "apply",
    "calibrate",
    "compiled_kernels",
    "fit",
    "kernel_features",
    "leave_one_out",
    "loop_scale",
    "measured_rows",
    "predict",
    "row_features",
]

ROOT = Path(__file__).resolve().parents[2]
# The report of the kernels the GPU measured (commit 5fae098's, compiled at 512e9ca): the
# calibration pairs it with those times. ``apply`` then takes any report, the current one too.
REPORT = "figures/gpu_static/report_of_measured_kernels.json"
MEASUREMENT = "figures/gpu_check/nvidia_h200.json"
CALIBRATION = "figures/gpu_static_calibration.json"
ARCH = 90  # the measured GPU's target in the report (H100 / H200)
KERNELS = {"flash": ("forward", "dkdv", "dq"), "stick": ("forward", "bwd_rows", "bwd_cols")}
FORWARD_PASSES = ("encode_q", "encode_k")  # the per-token passes a forward call runs
GOAL_SEQ = 4096  # the length the speed goals are stated at

_HOOK = "tables+gain+{}(grad)"
# measured method -> (family, report features, hook alone: minus what the tables add)
METHODS = {
    "softmax": ("flash", "plain", False),
    "rope": ("flash", "tables", False),
    "xpos": ("flash", "tables", False),  # its key tables differ from the query's, same loads
    "rope_2d": ("flash", "tables", False),  # per-token angles from two axes, one table each
    "exposb": ("flash", "tables+gain+exposb_distance", False),
    "alibi": ("flash", _HOOK.format("linear_distance"), True),
    "fox": ("flash", _HOOK.format("cumulative_log_gates"), True),
    "t5": ("flash", _HOOK.format("diagonal_table"), True),  # regular positions: per distance
    "kerple": ("flash", _HOOK.format("diagonal_table"), True),
    "rse": ("stick", _HOOK.format("linear_distance"), False),  # RoPE + penalty; gain extra
    "stick_breaking": ("stick", "plain", False),
}
UNMODELLED = {
    "cope": "its own kernels (kernels/cope.py), which the report compiles but does not model",
    "liere": "q and k transformed in PyTorch (dense rotations) before the plain kernel; the "
    "report models only the kernels",
    "comrope": "q and k transformed in PyTorch before the plain kernel; the report models only "
    "the kernels",
    "comrope_ap": "q and k transformed in PyTorch before the plain kernel; the report models "
    "only the kernels",
    "comrope_ld": "q and k transformed in PyTorch before the plain kernel; the report models "
    "only the kernels",
    "rope_mixed": "q and k rotated in PyTorch (rope_mixed_transform) before the plain kernel; "
    "the report models only the kernels",
}
FEATURES = ("overlap", "no_overlap", "mem", "passes")


def _load(path: str | Path) -> dict:
    p = Path(path)
    return json.loads((p if p.is_absolute() else ROOT / p).read_text())


def compiled_kernels(rep: dict) -> dict:
    """The report's sm_90 compile rows that compiled, keyed (family, features, causal,
    head_dim, dtype, kernel)."""
    return {
        (c["family"], c["features"], c["causal"], c["head_dim"], c["dtype"], c["kernel"]): c
        for c in rep["compiles"]
        if c.get("arch") == ARCH and c.get("ok", True)
    }


def _kernel_features(c: dict, family: str, causal: bool, seq: int) -> dict:
    """One compiled kernel's cycles per pair (both bounds) and memory warp-instructions per
    pair at ``seq`` tokens."""
    tiles = tuple(int(t) for t in c["tiles"].split("x"))
    reach = model.FAR_REACH if c["features"].endswith("+far") else None
    cost, _ = model.kernel_cost(family, c["kernel"], c["loops"], tiles, causal, seq, reach,
                                c.get("far_rows"))  # fmt: skip
    mem_loops = [
        dict(bound="mem", overlap=lp["counts"].get("mem", 0) * c["warps"],
             no_overlap=lp["counts"].get("mem", 0) * c["warps"])
        for lp in c["loops"]
    ]  # fmt: skip
    mem, _ = model.kernel_cost(family, c["kernel"], mem_loops, tiles, causal, seq, reach,
                               c.get("far_rows"))  # fmt: skip
    return dict(overlap=cost["overlap"], no_overlap=cost["no_overlap"], mem=mem["overlap"])


def _compile_of(rep: dict, entry: dict, compiled: dict, key: tuple, kernel: str) -> dict:
    """The compile row of one kernel of a model row (``entry``, keyed ``key`` = (family,
    features, causal, head_dim, dtype)): a launch compiled once for several rows is named in
    the entry's ``compile_rows``."""
    rows = entry.get("compile_rows", {})
    return rep["compiles"][rows[kernel]] if kernel in rows else compiled[(*key, kernel)]


def kernel_features(rep: dict, family: str, features: str, kernel: str, causal: bool = True,
                    head_dim: int = 64, dtype: str = "bf16", seq: int = GOAL_SEQ,
                    compiled: dict | None = None) -> dict:  # fmt: skip
    """One kernel of a report row (sm_90): ``overlap`` and ``no_overlap`` cycles per pair and
    ``mem``, memory warp-instructions per pair, at ``seq`` tokens (``compiled``: the report's
    :func:`compiled_kernels`, made if not given)."""
    key = (family, features, causal, head_dim, dtype)
    entry = next((e for e in rep["model"] if e.get("arch", ARCH) == ARCH
                  and (e["family"], e["features"], e["causal"], e["head_dim"], e["dtype"]) == key),
                 {})  # fmt: skip
    return _kernel_features(
        _compile_of(rep, entry, compiled or compiled_kernels(rep), key, kernel), family, causal, seq
    )


def _row_passes(entry: dict, forward_only: bool, seq: int, elem: int) -> float:
    names = entry.get("pass_costs") or {}
    return sum(
        model.token_pass_cost(n, entry["head_dim"], elem, entry["causal"], seq)
        for n in names
        if not forward_only or n in FORWARD_PASSES
    )


def row_features(rep: dict, family: str, features: str, causal: bool, head_dim: int,
                 dtype: str, seq: int, pass_: str, hook_alone: bool = False,
                 compiled: dict | None = None) -> dict:  # fmt: skip
    """The model's terms for one report row (``FEATURES``: cycles per pair under each bound,
    memory warp-instructions per pair, per-token pass cycles per pair), at ``seq`` tokens, for
    ``pass_`` ``"fwd"`` or ``"fwd+bwd"``. ``hook_alone``: minus what the tables add to plain
    flash, kernel by kernel (the tables row minus the plain row)."""
    compiled = compiled_kernels(rep) if compiled is None else compiled
    elem = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
    kernels = KERNELS[family][:1] if pass_ == "fwd" else KERNELS[family]
    entries = {(e["family"], e["features"], e["causal"], e["head_dim"], e["dtype"]): e
               for e in rep["model"] if e.get("arch", ARCH) == ARCH}  # fmt: skip

    def one(feat: str, sign: float, out: dict) -> None:
        entry = entries.get((family, feat, causal, head_dim, dtype), {})
        for k in kernels:
            c = _compile_of(rep, entry, compiled, (family, feat, causal, head_dim, dtype), k)
            f = _kernel_features(c, family, causal, seq)
            for name, v in f.items():
                out[name] += sign * v
        out["passes"] += sign * _row_passes(entry, pass_ == "fwd", seq, elem)

    out = dict.fromkeys(FEATURES, 0.0)
    one(features, 1.0, out)
    if hook_alone:
        one("tables", -1.0, out)
        one("plain", 1.0, out)
    return out


def _blend(params: dict, f: dict) -> float:
    return (1 - params["w"]) * f["overlap"] + params["w"] * f["no_overlap"]


def predict(params: dict, row: dict) -> float:
    """The calibrated ratio to plain flash of one row (``features``, ``plain``: its and plain
    flash's :func:`row_features`; ``pass_``; ``params``: ``w``, ``s`` and, optionally,
    ``loop_scale`` per pass, ``k`` of the module's formula, 1 where missing)."""
    f, p = row["features"], row["plain"]
    s = params["s"]
    c_plain = _blend(params, p)
    k = params.get("loop_scale", {}).get(row.get("pass_"), 1.0)
    slower = (1 - s) * _blend(params, f) / c_plain + s * f["mem"] / p["mem"]
    return 1 / (slower + (f["passes"] - p["passes"]) / (k * c_plain))


def loop_scale(rep: dict, meas: dict, params: dict, seq: int = GOAL_SEQ) -> dict[str, float]:
    """``{pass: k}``: plain flash's measured time (``meas``, head_dim 64, bf16, causal, ``seq``
    tokens) over the time the model's cycles per pair (``C``, blended by ``params``) give at
    :data:`.model.SM_COUNT` SMs and :data:`.model.CLOCK_HZ`, for ``"fwd"`` and ``"fwd+bwd"``."""
    out = {}
    for r in meas["speed"]:
        if (r["method"], r.get("contender"), r["head_dim"], r["dtype"], r["causal"], r["seq"]) \
                != ("softmax", "kernel", 64, "bf16", True, seq) or not r.get("ms"):  # fmt: skip
            continue
        f = row_features(rep, "flash", "plain", causal=True, head_dim=64, dtype="bf16", seq=seq,
                         pass_=r["pass_"])  # fmt: skip
        pairs = r["batch"] * r["heads"] * seq * seq / 2  # as token_pass_cost counts them
        modelled_s = _blend(params, f) * pairs / (model.SM_COUNT * model.CLOCK_HZ)
        out[r["pass_"]] = r["ms"] / 1e3 / modelled_s
    missing = {"fwd", "fwd+bwd"} - set(out)
    if missing:
        raise LookupError(f"no measured plain flash time at {seq} tokens for {sorted(missing)}")
    return out


def measured_rows(rep: dict, meas: dict) -> list[dict]:
    """One row per (method, pass, head_dim, length, dtype, mask) the measurement times for
    a modelled method's kernel: ``method``, ``pass_``, ``head_dim``, ``seq``, ``dtype``,
    ``causal``, ``measured`` (softmax kernel ms / the method's kernel ms, same shape),
    ``row`` (the report row it is modelled by), ``features`` and ``plain``."""
    speed = [r for r in meas["speed"] if r.get("contender") == "kernel" and r.get("ms")]

    def shape(r: dict) -> tuple:
        return (r["pass_"], r["head_dim"], r["seq"], r["dtype"], r["causal"], r["batch"],
                r["heads"])  # fmt: skip

    plain_ms = {shape(r): r["ms"] for r in speed if r["method"] == "softmax"}
    compiled = compiled_kernels(rep)
    out = []
    for r in speed:
        if r["method"] not in METHODS or r["method"] == "softmax":
            continue
        base = plain_ms.get(shape(r))
        if base is None:
            continue
        family, feat, alone = METHODS[r["method"]]
        common = dict(causal=r["causal"], head_dim=r["head_dim"], dtype=r["dtype"],
                      seq=r["seq"], pass_=r["pass_"], compiled=compiled)  # fmt: skip
        out.append(dict(
            method=r["method"], pass_=r["pass_"], head_dim=r["head_dim"], seq=r["seq"],
            dtype=r["dtype"], causal=r["causal"], measured=base / r["ms"],
            row=f"{family} {feat}" + (" - (tables - plain)" if alone else ""),
            features=row_features(rep, family, feat, hook_alone=alone, **common),
            plain=row_features(rep, "flash", "plain", **common),
        ))  # fmt: skip
    return out


def _sq_error(params: dict, rows: list[dict]) -> float:
    return sum(math.log(predict(params, r) / r["measured"]) ** 2 for r in rows)


def _golden(f, lo: float, hi: float) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    for _ in range(50):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(c) <= f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def fit(rows: list[dict]) -> dict:
    """Least squares on ``log(predicted / measured)`` over ``rows`` for ``w`` and ``s`` in
    [0, 1]: the best of a grid by 0.02, then golden-section steps along each parameter within
    one grid step. Deterministic."""
    grid = [k / 50 for k in range(51)]
    w, s = min(((w, s) for w in grid for s in grid),
               key=lambda p: _sq_error(dict(w=p[0], s=p[1]), rows))  # fmt: skip
    for _ in range(3):
        w = _golden(lambda x, s=s: _sq_error(dict(w=x, s=s), rows), max(w - 0.02, 0),
                    min(w + 0.02, 1))  # fmt: skip
        s = _golden(lambda x, w=w: _sq_error(dict(w=w, s=x), rows), max(s - 0.02, 0),
                    min(s + 0.02, 1))  # fmt: skip
    return dict(w=w, s=s)


def _errors(params: dict, rows: list[dict]) -> list[float]:
    return [abs(math.log(predict(params, r) / r["measured"])) for r in rows]


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def leave_one_out(rows: list[dict]) -> dict:
    """Refit without each method's rows and predict them: ``per_method`` (method: params,
    ``worst`` factor off, ``median`` factor off, ``predicted`` per row), ``predicted`` (every
    row's held-out prediction, in ``rows``' order), ``median_abs_log``, ``worst_factor`` and
    ``targets_met`` (median below log 1.25, no row off by more than 1.6x)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    held = [0.0] * len(rows)
    per_method = {}
    for m in methods:
        params = fit([r for r in rows if r["method"] != m])
        idx = [i for i, r in enumerate(rows) if r["method"] == m]
        errs = []
        for i in idx:
            held[i] = predict(params, rows[i])
            errs.append(abs(math.log(held[i] / rows[i]["measured"])))
        per_method[m] = dict(params=params, worst=math.exp(max(errs)),
                             median=math.exp(_median(errs)))  # fmt: skip
    errs = [abs(math.log(p / r["measured"])) for p, r in zip(held, rows, strict=True)]
    median, worst = _median(errs), math.exp(max(errs))
    met = median < math.log(1.25) and worst <= 1.6
    return dict(per_method=per_method, predicted=held, median_abs_log=median,
                worst_factor=worst, targets_met=met)  # fmt: skip


def calibrate(report: str = REPORT, measurement: str = MEASUREMENT) -> dict:
    """The calibration table: ``sources``, ``model`` (its formula), ``params`` (fit on every
    row), ``rows`` (per row: method, pass, head_dim, seq, the report row, measured, predicted
    by the full fit and held out, the uncalibrated no-overlap ratio), ``fit`` (median and worst
    factor of the full fit), ``leave_one_method_out`` and ``unmodelled`` (measured methods with
    no report row, and why)."""
    rep, meas = _load(report), _load(measurement)
    rows = measured_rows(rep, meas)
    params = fit(rows)
    params["loop_scale"] = loop_scale(rep, meas, params)
    loo = leave_one_out(rows)
    table = []
    for r, held in zip(rows, loo["predicted"], strict=True):
        table.append(dict(
            method=r["method"], pass_=r["pass_"], head_dim=r["head_dim"], seq=r["seq"],
            dtype=r["dtype"], causal=r["causal"], row=r["row"],
            measured=round(r["measured"], 4), predicted=round(predict(params, r), 4),
            predicted_loo=round(held, 4),
            no_overlap=round(r["plain"]["no_overlap"] / r["features"]["no_overlap"], 4),
        ))  # fmt: skip
    errs = _errors(params, rows)
    by_length = {}
    for seq in sorted({r["seq"] for r in rows}):
        pairs = zip(rows, loo["predicted"], strict=True)
        held = [abs(math.log(h / r["measured"])) for r, h in pairs if r["seq"] == seq]
        by_length[str(seq)] = dict(median_factor=round(math.exp(_median(held)), 4),
                                   worst_factor=round(math.exp(max(held)), 4))  # fmt: skip
    measured_methods = sorted({r["method"] for r in meas["speed"]})
    return dict(
        sources=dict(
            report=report,
            measurement=measurement,
            device=meas.get("meta", {}).get("device", {}).get("name"),
            measured_commit=meas.get("meta", {}).get("commit"),
        ),  # fmt: skip
        model="T(row) / T(plain) = (1 - s) C(row) / C(plain) + s mem(row) / mem(plain) + "
        "(passes(row) - passes(plain)) / (k C(plain)), C = (1 - w) overlap + w no_overlap, "
        "k = plain flash's measured time over C's at 132 SMs and 1.98 GHz (per pass, head_dim "
        f"64, {GOAL_SEQ} tokens); plain_x_cal = T(plain) / T(row)",
        params=dict(
            w=round(params["w"], 4),
            s=round(params["s"], 4),
            loop_scale={p: round(v, 4) for p, v in params["loop_scale"].items()},
        ),  # fmt: skip
        rows=table,
        fit=dict(
            median_factor=round(math.exp(_median(errs)), 4),
            worst_factor=round(math.exp(max(errs)), 4),
        ),  # fmt: skip
        leave_one_method_out=dict(
            median_factor=round(math.exp(loo["median_abs_log"]), 4),
            worst_factor=round(loo["worst_factor"], 4),
            targets=dict(median_factor_below=1.25, worst_factor_at_most=1.6),
            targets_met=loo["targets_met"],
            by_length=by_length,
            per_method={
                m: dict(
                    w=round(v["params"]["w"], 4),
                    s=round(v["params"]["s"], 4),
                    worst_factor=round(v["worst"], 4),
                    median_factor=round(v["median"], 4),
                )
                for m, v in loo["per_method"].items()
            },
        ),  # fmt: skip
        unmodelled={m: UNMODELLED[m] for m in measured_methods if m in UNMODELLED},
    )


def apply(rep: dict, params: dict, seq: int = GOAL_SEQ) -> None:
    """Add ``plain_x_cal`` (forward + backward) and ``plain_x_cal_fwd`` to every sm_90 model
    row of a report without an error: the calibrated ratio to plain flash (same mask, head_dim
    and dtype) at ``seq`` tokens, from the row's own compiled kernels and per-token passes.
    ``params``: ``w`` and ``s``, e.g. the committed calibration's ``params``."""
    compiled = compiled_kernels(rep)
    for e in rep["model"]:
        if "error" in e or e.get("arch", ARCH) != ARCH:
            continue
        for pass_, key in (("fwd+bwd", "plain_x_cal"), ("fwd", "plain_x_cal_fwd")):
            common = dict(causal=e["causal"], head_dim=e["head_dim"], dtype=e["dtype"], seq=seq,
                          pass_=pass_, compiled=compiled)  # fmt: skip
            try:
                row = dict(features=row_features(rep, e["family"], e["features"], **common),
                           plain=row_features(rep, "flash", "plain", **common),
                           pass_=pass_)  # fmt: skip
            except KeyError:  # no compiled plain flash (or kernel) for this row
                continue
            e[key] = predict(params, row)


def committed_params() -> dict:
    """``w`` and ``s`` of the committed calibration table."""
    return _load(CALIBRATION)["params"]


def _print(cal: dict) -> None:
    print(f"calibrated on {cal['sources']['report']} against {cal['sources']['measurement']} "
          f"({cal['sources']['device']})")  # fmt: skip
    print(f"model: {cal['model']}")
    scale = ", ".join(f"{p} {k:.2f}" for p, k in cal["params"]["loop_scale"].items())
    print(f"fit: w = {cal['params']['w']:.3f}, s = {cal['params']['s']:.3f}; measured k: {scale}")
    print(f"  {'method':15} {'pass':8} {'D':>4} {'seq':>5} {'measured':>9} {'fit':>7} "
          f"{'held out':>9} {'off':>6} {'no-overlap':>11}")  # fmt: skip
    for r in cal["rows"]:
        off = r["predicted_loo"] / r["measured"]
        print(f"  {r['method']:15} {r['pass_']:8} {r['head_dim']:>4} {r['seq']:>5} "
              f"{r['measured']:>9.3f} {r['predicted']:>7.3f} {r['predicted_loo']:>9.3f} "
              f"{off:>5.2f}x {r['no_overlap']:>11.3f}")  # fmt: skip
    loo = cal["leave_one_method_out"]
    print("leave one method out, factor off (worst, median) per method:")
    for m, v in loo["per_method"].items():
        print(f"  {m:15} {v['worst_factor']:.2f}x {v['median_factor']:.2f}x "
              f"(w = {v['w']:.3f}, s = {v['s']:.3f})")  # fmt: skip
    verdict = "met" if loo["targets_met"] else "NOT met"
    print(f"leave one method out: median factor {loo['median_factor']:.3f} (target < 1.25), "
          f"worst {loo['worst_factor']:.3f} (target <= 1.6): {verdict}")  # fmt: skip
    for seq, v in loo["by_length"].items():
        print(f"  at {seq} tokens: median factor {v['median_factor']:.3f}, "
              f"worst {v['worst_factor']:.3f}")  # fmt: skip
    print("not modelled:")
    for m, why in cal["unmodelled"].items():
        print(f"  {m}: {why}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report", default=REPORT)
    p.add_argument("--measurement", default=MEASUREMENT)
    p.add_argument("--out", default=CALIBRATION)
    p.add_argument("--check", action="store_true",
                   help="compare with the committed table instead of writing it")  # fmt: skip
    args = p.parse_args(argv)
    cal = calibrate(args.report, args.measurement)
    _print(cal)
    out = ROOT / args.out
    if args.check:
        same = json.loads(out.read_text()) == json.loads(json.dumps(cal))
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from what the report gives'}")
        return 0 if same else 1
    out.write_text(json.dumps(cal, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
