"""README's "static model" section, generated from a GPU report.

    python -m course_lib.gpu_static.readme                     # from figures/gpu_report.json
    python -m course_lib.gpu_static.readme --report other.json --print

The section states what the committed ``figures/gpu_report.json`` says and nothing else: the
targets compiled and whether every launch fits, the static model's ratios under both bounds,
the speed goals judged on the pessimistic one (:mod:`.goals`), occupancy beside the tutorial's,
and where kernels spill inside their loops. ``tests/test_gpu_report.py`` checks that README
holds what the committed report generates.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from course_lib.gpu_static import calibrate, goals, model, targets
from course_lib.readme_sections import README, replace_section

__all__ = ["SECTION", "render", "write_readme"]

SECTION = "static model"
REPORT = Path(__file__).resolve().parents[2] / "figures" / "gpu_report.json"
_FEATURE_NAMES = {
    "plain": "plain softmax",
    "tables": "q/k tables (RoPE)",
}


def _name(family: str, features: str, users: dict | None = None) -> str:
    """``flash: tables, gain, t5_buckets(grad) (t5)``: the kernel family, its features and the
    encodings that hand the hook to the kernels (``users``: the report's ``hook_users``)."""
    kernel = "flash" if family == "flash" else "stick-breaking"
    label = _FEATURE_NAMES.get(features, features.replace("tables+gain+", "tables, gain, "))
    far = features.endswith("+far")  # the hook's far form: its own users
    hook = features.removesuffix("+far").rsplit("+", 1)[-1].removesuffix("(grad)")
    key = hook + "+far" if far else hook
    if users and users.get(key):
        label += f" ({', '.join(users[key])})"
    return f"{kernel}: {label}"


def _ratio(value: float, floor: float, met: bool) -> tuple[str, str]:
    """A value and its shortfall at 2 decimals, at 3 where 2 would hide a miss."""
    digits = 3 if not met and round(value, 2) >= floor else 2
    return f"{value:.{digits}f}", f"{floor - value:.{digits}f}"


def _lowering(rows: list[dict]) -> str:
    """How a target's 16-bit products were compiled, from its rows' instruction counts."""
    kinds = [k for k in ("wgmma", "tcgen5", "mma") if any(r.get(k) for r in rows)]
    return "/".join(kinds) or "CUDA cores (FMA)"


def _targets_table(rep: dict) -> list[str]:
    lines = [
        "| target | shared memory per block | launches | largest request | 16-bit products "
        "| most spilled |",
        "|---|---|---|---|---|---|",
    ]
    for arch in sorted({r["arch"] for r in rep["compiles"]}, reverse=True):
        rows = [r for r in rep["compiles"] if r["arch"] == arch]
        ok = [r for r in rows if r.get("ok")]
        gpu = targets.TARGETS[arch]
        biggest = max(ok, key=lambda r: r["smem"])
        spilled = max(ok, key=lambda r: r["spill_store"])
        fits = sum(r["smem_ok"] for r in ok)
        dtypes = "/".join(sorted({r["dtype"] for r in rows}))
        lowering = _lowering(ok)
        spill = (f"{spilled['spill_store']:,} B ({spilled['family']} {spilled['kernel']}, "
                 f"D{spilled['head_dim']})" if spilled["spill_store"] else "none")  # fmt: skip
        lines.append(
            f"| sm_{arch} ({gpu.name}) | {gpu.smem_per_block // 1024} KiB | {fits} of "
            f"{len(rows)} fit ({dtypes}) | {biggest['smem'] / 1024:.0f} KiB | {lowering} "
            f"| {spill} |"
        )
    return lines


def _ratio_table(rep: dict) -> list[str]:
    rep = dict(rep, model=[dict(e) for e in rep["model"]])
    calibrate.apply(rep, calibrate.committed_params())
    rows = [e for e in rep["model"] if e["causal"] and e["dtype"] == "bf16" and "error" not in e]
    users = rep["meta"].get("hook_users")
    keys = list(dict.fromkeys((e["family"], e["features"]) for e in rows))
    dims = sorted({e["head_dim"] for e in rows})
    head = " | ".join(f"head_dim {d}" for d in dims)
    lines = [f"| causal, bf16, forward + backward | {head} | bound (forward) |",
             "|---|" + "---|" * len(dims) + "---|"]  # fmt: skip
    for fam, feat in keys:
        cells, bound = [], ""
        for d in dims:
            (e,) = [
                r for r in rows if (r["family"], r["features"], r["head_dim"]) == (fam, feat, d)
            ]
            cell = f"{e['plain_x_no']:.2f} / {e['plain_x']:.2f}"
            if "plain_x_cal" in e:
                cell += f" / **{e['plain_x_cal']:.2f}**"
            if fam == "stick":
                cell += f" (paper's kernel: {e['sb_total_x']:.2f})"
            cells.append(cell)
            bound = e["bounds"]["forward"]
        lines.append(f"| {_name(fam, feat, users)} | " + " | ".join(cells) + f" | {bound} |")
    tutorial = [r for r in rows if (r["family"], r["features"]) == ("flash", "plain")]
    cells = [f"{e['total_x_no']:.2f} / {e['total_x']:.2f}" for e in sorted(tutorial,
             key=lambda e: e["head_dim"])]  # fmt: skip
    lines.append("| flash: plain softmax **against the tutorial** | " + " | ".join(cells) + " | |")
    return lines


def _calibration_note() -> str:
    cal = calibrate._load(calibrate.CALIBRATION)
    loo, src = cal["leave_one_method_out"], cal["sources"]
    targets = loo["targets"]
    median_ok = loo["median_factor"] < targets["median_factor_below"]
    worst_ok = loo["worst_factor"] <= targets["worst_factor_at_most"]
    verdicts = ["meets" if ok else "misses" for ok in (median_ok, worst_ok)]
    return (
        f"The calibrated model (`figures/gpu_static_calibration.json`, `python -m "
        f"course_lib.gpu_static.calibrate`) is fitted to the times an {src['device']} measured "
        f"for the kernels at commit {src['measured_commit'][:7]} ({cal['model']}; w = "
        f"{cal['params']['w']:.3g}, s = {cal['params']['s']:.3g}, k = "
        f"{cal['params']['loop_scale']['fwd+bwd']:.2f} forward + backward). Leaving each method "
        f"out of the fit in turn, its predictions of that method's ratios are off by a median factor of "
        f"{loo['median_factor']:.2f} and at worst {loo['worst_factor']:.2f} (it {verdicts[0]} "
        f"the median's target, below {targets['median_factor_below']}, and {verdicts[1]} the "
        f"worst's, at most {targets['worst_factor_at_most']}): an estimate, labelled as one."
    )


def _goal_lines(rep: dict, calibrated: bool = False) -> list[str]:
    if calibrated:
        verdicts = goals.judge(rep, calibrated=calibrate.committed_params())
        basis = (f"on the calibrated model at {calibrate.GOAL_SEQ} tokens (the tutorial and the "
                 "paper's kernel: as below, uncalibrated)")  # fmt: skip
    else:
        verdicts = goals.judge(rep)
        basis = "on the no-overlap bound (the paper's kernel: overlap bound, the only one it has)"
    met = [v for v in verdicts if v["met"]]
    missed = [v for v in verdicts if not v["met"]]
    out = [f"Speed goals, forward + backward, causal, bf16, sm_90, judged {basis}: {len(met)} of "
           f"{len(verdicts)} met."]  # fmt: skip
    for title, group in (("met", met), ("missed", missed)):
        if not group:
            continue
        out.append(f"* **{title}**:")
        for v in group:
            if v["value"] is None:
                out.append(f"  * {v['goal']}, head_dim {v['head_dim']}: not in the report")
                continue
            value, short = _ratio(v["value"], v["floor"], v["met"])
            text = f"  * {v['goal']}, head_dim {v['head_dim']}: {value} (goal {v['floor']:.2f}"
            out.append(text + (")" if v["met"] else f", short by {short})"))
    if calibrated:
        return out
    spills = goals.loop_spills(rep)
    if spills:
        worst = max(spills, key=lambda s: s["local"])
        out.append(
            f"* **no kernel spilling inside its loops: missed** by {len(spills)} modelled "
            f"kernel(s) on sm_90; most: {worst['row']} {worst['kernel']}, {worst['local']} spill "
            "loads and stores per iteration (charged in both bounds above)"
        )
    else:
        out.append("* **no kernel spilling inside its loops: met** (sm_90)")
    ratios = goals.workspace_ratios(rep)
    if ratios:
        over = [r for r in ratios if r["ratio"] > 1.5]
        causal = [r for r in ratios if r["causal"]]
        worst = max(causal or ratios, key=lambda r: r["ratio"])
        text = (f"* stick-breaking's backward workspace within 1.5x of flash's at seq "
                f"{rep['meta']['shape']['seq']}: causal at most {worst['ratio']:.2f}x "
                f"({worst['row']}, D{worst['head_dim']})")  # fmt: skip
        if over:
            o = max(over, key=lambda r: r["ratio"])
            text += (f"; over it: {len(over)} row(s), most {o['ratio']:.2f}x "
                     f"({o['row']}, {'causal' if o['causal'] else 'bidirectional'}, "
                     f"D{o['head_dim']})")  # fmt: skip
        out.append(text)
    return out


def _occupancy_table(rep: dict) -> list[str]:
    lines = ["| sm_90, causal | head_dim | per kernel: CTAs x warps per SM, registers, barriers "
             "and spill accesses per loop iteration, stages, nested loops |",
             "|---|---|---|"]  # fmt: skip
    for d, passes in model.anchor_facts().items():
        parts = [f"{name} {model.occupancy_cell(f)}" for name, f in passes.items()]
        lines.append(f"| Triton tutorial (fp16) | {d} | " + "; ".join(parts) + " |")
    for e in rep["model"]:
        if "error" in e or not e["causal"] or e["dtype"] != "bf16":
            continue
        parts = [f"{k} {model.occupancy_cell(f)}" for k, f in e["occupancy"].items()]
        name = _name(e["family"], e["features"], rep["meta"].get("hook_users"))
        lines.append(f"| {name} | {e['head_dim']} | " + "; ".join(parts) + " |")
    return lines


def render(rep: dict) -> str:
    """The section's Markdown from a report (the JSON ``python -m course_lib.gpu_report``
    writes)."""
    meta = rep["meta"]
    n, failures = len(rep["compiles"]), rep["failures"]
    verdict = (f"**{len(failures)} failure(s)**" if failures else "every launch compiles and fits "
               "its target's shared memory, and every 16-bit product is on the tensor cores "
               "wherever this Triton has a tensor-core path")  # fmt: skip
    out = [
        f"`figures/gpu_report.json` ({meta['tools']}; no GPU used, no time measured): {n} "
        f"launches compiled; {verdict}.",
        "",
        *_targets_table(rep),
        "",
    ]
    for r in rep.get("refusals", []):
        out.append(f'On sm_{r["arch"]} the wrappers refuse bf16: "{r["message"]}"')
    for note in rep.get("notes", []):
        out.append(f"Note, {note}.")
    if rep.get("refusals") or rep.get("notes"):
        out.append("")
    passes = any("passes" in e for e in rep["model"])
    out += [
        "The static model (sm_90 machine code of every tile loop, instructions against nominal "
        "H100 throughputs, in-loop spill traffic charged"
        + (
            "; per-token passes, such as the q/k transform before the loops and the backward's "
            "delta, charged as the DRAM bytes they move"
            if passes
            else ""
        )
        + "; ratios, not speeds): the course's "
        "plain flash attention's cycles per (query, key) pair over each kernel's, "
        "**no-overlap bound / overlap bound / calibrated** (1.00: as fast as plain flash by this "
        "model; higher is faster). Tensor cores and the other units take turns under the first, "
        f"overlap perfectly under the second; the third is calibrated, at "
        f"{calibrate.GOAL_SEQ} tokens.",
        "",
        _calibration_note(),
        "",
        *_ratio_table(rep),
        "",
        *_goal_lines(rep, calibrated=True),
        "",
        *_goal_lines(rep),
        "",
        "<details><summary>Occupancy beside the tutorial's</summary>",
        "",
        *_occupancy_table(rep),
        "",
        "</details>",
    ]
    return "\n".join(out)


def write_readme(report: str | Path = REPORT, readme: str | Path = README) -> bool:
    """Rewrite README's section from ``report``; returns whether README changed."""
    rep = json.loads(Path(report).read_text())
    return replace_section(SECTION, render(rep), readme)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", default=str(REPORT), help="the report's JSON")
    p.add_argument("--print", action="store_true", help="print the section, change nothing")
    args = p.parse_args(argv)
    if args.print:
        print(render(json.loads(Path(args.report).read_text())))
    else:
        changed = write_readme(args.report)
        print("README.md updated" if changed else "README.md already up to date")


if __name__ == "__main__":
    main()
