"""GPU readiness of the fused kernels without a GPU: compile, fit, tensor cores, a static model.

``python -m course_lib.gpu_report`` compiles, ahead of time, every launch the kernel wrappers
(``kernels/flash.py``, ``kernels/stick_breaking.py``, ``kernels/cope.py``) issue for the benchmark shape (seq 8192,
batch 2, heads 2048 / head_dim, projections viewed as ``[batch, heads, seq, head_dim]``) for an
H100 (sm_90) and an A100 (sm_80) (``--archs`` adds learners' GPUs: sm_75 T4, sm_86 A10 / RTX
30xx, sm_89 L4 / RTX 40xx, sm_100, sm_120; ``--ci`` compiles sm_90, sm_86 and sm_75), and
prints, per compiled kernel: tiles, warps,
stages, registers, spill bytes, shared memory against the per-block limit, how its dots are
lowered (wgmma / tcgen5 / mma.sync / FMA) and an occupancy estimate; then, from the sm_90
machine code, the static cost per (query, key) pair of each family's tile loops under two
bounds (perfect overlap of tensor cores and the rest, and none; in-loop spills charged) as
ratios against recorded anchors and against plain flash (:mod:`course_lib.gpu_static.model`),
and each kernel's occupancy and barriers per iteration beside the tutorial's. It writes
``figures/gpu_report.json`` and ``figures/gpu_report.png``.

The launches are not rebuilt here: each comes from running the wrappers themselves on ``meta``
tensors (:mod:`course_lib.gpu_static.variants`), so the report follows every change of their
configuration or argument lists.

Default: bf16, fp16 and fp32, head_dim 16-128, causal and bidirectional, for the feature sets of
:func:`course_lib.gpu_static.variants.feature_sets` (``--full`` adds more; ``--quick`` is bf16 at
head_dim 64 and 128; bf16 becomes fp16 on a target without bf16 tensor cores, where the report
checks that the wrappers refuse bf16 with a message saying what to use). Exit status 1 if a
launch fails to compile, needs more shared memory than its target allows per block, has a
16-bit dot off the tensor cores where this Triton has a tensor-core path for the target (a
minimal fp16 dot tells: Triton 3.9 has none for sm_75), or (``--fail-on-spill N``)
spills more than N bytes per thread. No kernel is run: the cost figures are a static model.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from course_lib import runtime
from course_lib.gpu_static import aot, goals, model, sass, targets, variants

__all__ = ["main", "run_report"]

FIGURES = Path(__file__).resolve().parents[1] / "figures"
# The oldest Triton the report compiles with (aot.py calls Triton's launch binder and
# get_ptxas, whose interfaces changed in 3.6; 3.4 and 3.5.1 fail). The kernels need less:
# runtime.TRITON_MINIMUM.
TRITON_FOR_REPORT = (3, 6)
SPILL_NOTE = 64  # spill bytes per thread above which a kernel is listed in the summary


def _variant_list(args) -> list[variants.Variant]:
    feats = {fam: variants.feature_sets(args.full, fam) for fam in args.families}
    if args.ci:  # plain, and the heaviest combination of each hook
        feats = {fam: [f for f in fs if f.hook or f.tables is None] for fam, fs in feats.items()}
    out = []
    for arch in args.archs:
        dims = args.dims
        if args.ci and arch != 90:  # --ci: the learners' GPUs at the widest head, the most memory
            dims = [max(args.dims)]
        for dtype in _dtypes_for(arch, args.dtypes):
            for d in dims:
                for causal in (True, False):
                    for family in args.families:
                        for f in feats[family]:
                            if args.ci and not causal and f.hook is not None:
                                continue  # --ci: bidirectional for plain only
                            if family == "cope" and not causal:
                                continue  # CoPE is causal only
                            out.append(variants.Variant(family, f, causal, d, dtype, arch))
    if args.filter:
        out = [v for v in out if re.search(args.filter, v.name)]
    return out


def _dtypes_for(arch: int, dtypes) -> list[str]:
    """The dtypes compiled for ``arch``: bf16 becomes fp16 on a GPU without bf16 tensor cores
    (the wrappers refuse bf16 there: :func:`bf16_refusals` checks it)."""
    if targets.TARGETS[arch].bf16:
        return list(dtypes)
    return list(dict.fromkeys("fp16" if d == "bf16" else d for d in dtypes))


def bf16_refusals(args) -> tuple[list[dict], list[str]]:
    """For each requested target without bf16 tensor cores: plan one bf16 launch and record the
    wrappers' refusal (``{"arch", "dtype", "message"}``). A launch planned without a refusal,
    or one whose message does not say what to use instead, is a failure."""
    refusals, failures = [], []
    if "bf16" not in args.dtypes:
        return refusals, failures
    for arch in args.archs:
        if targets.TARGETS[arch].bf16:
            continue
        family = args.families[0]
        plain = next(f for f in variants.feature_sets(False, family) if f.hook is None)
        v = variants.Variant(family, plain, True, args.dims[0], "bf16", arch)
        try:
            variants.plan(v)
        except TypeError as exc:
            message = str(exc)
            refusals.append(dict(arch=arch, dtype="bf16", message=message))
            if "float16" not in message or f"sm_{arch}" not in message:
                failures.append(f"sm{arch} bf16: the refusal does not say what to use: {message}")
        else:
            failures.append(f"sm{arch} bf16: planned without a refusal (no bf16 tensor cores)")
    return refusals, failures


def _probe_job(arch: int) -> bool:
    """Worker: does this Triton put a plain fp16 dot on ``arch``'s tensor cores?"""
    variants.compile_ready()
    return aot.tensor_core_lowering(arch)


def _compile_job(job: tuple) -> dict:
    """Worker: plan the variant again, compile its launch ``index``, analyse the loops."""
    v, index, with_loops = job
    variants.compile_ready()
    t0 = time.time()
    launch = variants.plan(v)[index]
    row = {}
    try:
        facts, cubin = aot.compile_launch(launch, v.arch)
        row.update(facts, ok=True)
        if with_loops:
            loops = sass.inner_loops(sass.disassemble(cubin))
            for lp in loops:
                lp.update(sass.loop_cycles(lp, v.arch, facts["warps"]))
            row["loops"] = loops
    except Exception as exc:  # noqa: BLE001 - a failed compile is a result of the report
        text = f"{type(exc).__name__}: {exc}"
        if exc.__cause__ is not None:
            text += f" (caused by {type(exc.__cause__).__name__}: {exc.__cause__})"
        row.update(ok=False, error=text if len(text) < 1200 else text[:300] + " ... " + text[-900:])
    row["seconds"] = round(time.time() - t0, 1)
    return row


#: What :func:`_compile_job` returns: a compile row before the target's derived figures.
JOB_FIELDS = ("warps", "stages", "smem", "regs", "spill_store", "spill_load", "stack", "wgmma",
              "tcgen5", "mma", "fma", "ok", "error", "loops", "seconds")  # fmt: skip
#: Fields a fresh compile must reproduce for a reused row to be trusted.
CHECKED_FIELDS = tuple(f for f in JOB_FIELDS if f != "seconds")


@functools.cache
def _analysis_source() -> str:
    """The source of the code that reads compiled kernels (read once per process)."""
    return "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (aot, sass))


def job_key(compile_key: str, arch: int, with_loops: bool) -> str:
    """A digest of everything a compile row depends on: the launch's compile key (the kernel's
    source and the sources it calls, hooks included, as Triton hashes them for its own cache;
    options, signature, constants, specialisation; the paths into Triton's installation it holds
    made relative, so that another virtual environment gets the same digest), the target,
    Triton's and ptxas's versions, and the source of the analysis that reads the machine code
    (``aot``, ``sass``)."""
    import triton

    analysis = _analysis_source()
    # the options name files of Triton's installation (libdevice): the same in any environment
    portable = compile_key
    for folder in {Path(triton.__file__).parent, Path(triton.__file__).resolve().parent}:
        portable = portable.replace(str(folder), "<triton>")
    parts = (portable, arch, with_loops, triton.__version__, str(aot.ptxas_version(arch)),
             analysis)  # fmt: skip
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def _job_fields(row: dict) -> dict:
    return {k: row[k] for k in JOB_FIELDS if k in row}


def _spot_checks(jobs: list[tuple[str, tuple]], reused: dict) -> list[str]:
    """Which reused compiles are compiled again to check the reuse: per target, the first and
    the last one planned (plain flash's forward and, usually, the heaviest stick-breaking
    kernel)."""
    by_arch: dict[int, list[str]] = {}
    for key, (v, _i, _loops) in jobs:
        if key in reused:
            by_arch.setdefault(v.arch, []).append(key)
    return [k for keys in by_arch.values() for k in dict.fromkeys((keys[0], keys[-1]))]


def _reusable(path: str | None, keys: dict[str, str]) -> dict[str, dict]:
    """``{compile key: job fields}`` of the rows of the report at ``path`` whose job key matches
    (:func:`job_key`); empty without a path or a file."""
    if not path or not Path(path).is_file():
        return {}
    prior = {r["job_key"]: r for r in json.loads(Path(path).read_text())["compiles"]
             if "job_key" in r}  # fmt: skip
    return {key: _job_fields(prior[jk]) for key, jk in keys.items() if jk in prior}


def _tiles(launch) -> tuple[int, int]:
    kw = launch.kwargs
    if "BLOCK_M" in kw and "BLOCK_N" in kw:
        return kw["BLOCK_M"], kw["BLOCK_N"]
    if "BLOCK" in kw:
        return kw["BLOCK"], kw["BLOCK"]
    return kw.get("BLOCK_M", 0), kw.get("HEAD_DIM", 0)


def _far_rows(launch) -> int:
    """The rows of a flash dK/dV kernel's far tiles (``FAR_BLOCK_M``; 0: no far loop)."""
    kw = launch.kwargs
    return kw.get("FAR_BLOCK_M", 0) if kw.get("BIAS_FAR") is not None else 0


def run_report(args) -> dict:
    t0 = time.time()
    vlist = _variant_list(args)
    # Plan every variant here, then compile each distinct launch once.
    keyed: dict[str, tuple] = {}
    far_rows: dict[str, int] = {}
    per_variant = []
    for v in vlist:
        launches = variants.plan(v)
        refs = []
        for i, launch in enumerate(launches):
            key = aot.compile_key(launch, v.arch)
            keyed.setdefault(key, (v, i, v.arch == 90))
            far_rows[key] = _far_rows(launch)
            refs.append((launch.name, key, _tiles(launch)))
        per_variant.append((v, refs, variants.workspace(v)))
    jobs = list(keyed.items())
    job_keys = {key: job_key(key, v.arch, loops) for key, (v, _i, loops) in jobs}
    # Rows of an earlier report for the same compiles are reused once a fresh compile of a few
    # of them agrees field for field; any disagreement and everything is compiled.
    reused = _reusable(getattr(args, "reuse", None), job_keys)
    checked = _spot_checks(jobs, reused)
    todo = [(key, job) for key, job in jobs if key not in reused or key in checked]
    print(f"gpu_report: {len(vlist)} wrapper calls -> {len(jobs)} distinct compiles "
          f"({len(reused)} reusable from {args.reuse}, {len(checked)} of them checked) "
          f"with {args.jobs} job(s)" if reused else
          f"gpu_report: {len(vlist)} wrapper calls -> {len(jobs)} distinct compiles "
          f"with {args.jobs} job(s)", file=sys.stderr, flush=True)  # fmt: skip
    results: dict[str, dict] = {}
    reuse_note = None

    def compile_all(todo: list) -> None:
        done = 0
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for (key, _), row in zip(todo, pool.map(_compile_job, [j for _, j in todo]),
                                     strict=True):  # fmt: skip
                results[key] = row
                done += 1
                if done % 20 == 0 or done == len(todo):
                    print(f"  compiled {done}/{len(todo)} ({time.time() - t0:.0f} s)",
                          file=sys.stderr, flush=True)  # fmt: skip

    compile_all(todo)
    if reused:
        differ = [
            f"{keyed[k][0].name} launch {keyed[k][1]}: {f} {reused[k].get(f)!r} -> "
            f"{results[k].get(f)!r}"[:300]
            for k in checked
            for f in CHECKED_FIELDS
            if reused[k].get(f) != results[k].get(f)
        ]
        if differ:
            reuse_note = f"rows of {args.reuse} not reused, a fresh compile differs: {differ[0]}"
            print(f"  {reuse_note}; compiling everything", file=sys.stderr, flush=True)
            compile_all([(key, job) for key, job in jobs if key not in results])
        else:
            for key, row in reused.items():
                results.setdefault(key, row)
    compiles, spills, notes = [], [], []
    if reuse_note:
        notes.append(reuse_note)
    refusals, failures = bf16_refusals(args)
    with ProcessPoolExecutor(max_workers=1) as pool:  # compiles: not in this process
        lowering = dict(zip(args.archs, pool.map(_probe_job, args.archs), strict=True))
    cuda_cores_only = {a for a, ok in lowering.items() if not ok}
    notes += [
        f"sm_{a}: this Triton has no tensor-core path for the target (a minimal fp16 dot "
        "compiles to FMA), so every dot of every kernel runs on the CUDA cores"
        for a in sorted(cuda_cores_only)
    ]
    index = {}
    for v, refs, _work in per_variant:
        for name, key, tiles in refs:
            if key in index:
                continue
            r = results[key]
            row = dict(v.to_dict(), kernel=name, tiles=f"{tiles[0]}x{tiles[1]}", **r,
                       job_key=job_keys[key])  # fmt: skip
            if far_rows[key]:
                row["far_rows"] = far_rows[key]
            gpu = targets.TARGETS[v.arch]
            if r.get("ok"):
                row.update(targets.occupancy(gpu, r["regs"], r["smem"], r["warps"]))
                row["smem_limit"] = gpu.smem_per_block
            index[key] = len(compiles)
            compiles.append(row)
            label = f"{v.family} {name} {v.features.label} {'causal' if v.causal else 'bidir'} " \
                    f"D{v.head_dim} {v.dtype} sm{v.arch}"  # fmt: skip
            if not r.get("ok"):
                failures.append(f"{label}: compile failed: {r.get('error')}")
                continue
            if not row["smem_ok"]:
                failures.append(
                    f"{label}: shared memory {r['smem']} B > limit {gpu.smem_per_block} B"
                )
            if v.dtype != "fp32" and r["fma"] and v.arch not in cuda_cores_only:
                failures.append(f"{label}: {r['fma']} 16-bit dot(s) not on tensor cores")
            if r["spill_store"] > SPILL_NOTE:
                spills.append(f"{label}: {r['spill_store']} B spill stores")
            if args.fail_on_spill is not None and r["spill_store"] > args.fail_on_spill:
                failures.append(f"{label}: {r['spill_store']} B spilled > {args.fail_on_spill}")
    # The static model: sm_90 variants with loops.
    costs = []
    for v, refs, work in per_variant:
        if v.arch != 90 or v.family not in model.FAMILIES:
            continue
        entry = dict(v.to_dict(), workspace_bwd=work)
        try:
            per_kernel, bounds, facts, passes = {}, {}, {}, {}
            elem = variants.DTYPES[v.dtype].itemsize
            for name, key, tiles in refs:
                r = results[key]
                if name in model.PER_TOKEN_PASSES:  # no inner loop: the bytes it moves
                    passes[name] = model.token_pass_cost(
                        name, v.head_dim, elem, v.causal, variants.BENCH_SEQ
                    )
                    continue
                if not r.get("ok"):
                    raise ValueError(f"{name} did not compile")
                c, b = model.kernel_cost(
                    v.family, name, r["loops"], tiles, v.causal, variants.BENCH_SEQ,
                    far_reach=variants.FAR_REACH if v.features.far else None,
                    far_rows=far_rows[key] or None,
                )  # fmt: skip
                per_kernel[name], bounds[name] = c, b
                facts[name] = model.kernel_facts(compiles[index[key]])
            entry.update(model.pair_costs(v.family, per_kernel, v.head_dim), kernels=per_kernel,
                         bounds=bounds, occupancy=facts, passes=sum(passes.values()),
                         pass_costs=passes,
                         compile_rows={name: index[key] for name, key, _ in refs})  # fmt: skip
            entry["launchable"] = all(compiles[index[k]].get("smem_ok") for _, k, _ in refs)
        except (ValueError, KeyError) as exc:
            entry["error"] = str(exc)
        costs.append(entry)
    model.relative_to_plain(costs)
    return dict(
        meta=dict(
            tools=aot.tool_versions(args.archs),
            shape=dict(
                seq=variants.BENCH_SEQ, tokens=variants.BENCH_TOKENS, hidden=variants.BENCH_HIDDEN
            ),  # fmt: skip
            targets={a: targets.TARGETS[a].name for a in args.archs},
            note="static analysis of ahead-of-time compiled kernels; no GPU was used and no "
            "time was measured; cycles per pair are a nominal-throughput model, for ratios only",
            anchors=dict(
                tutorial=model.ANCHORS,
                tutorial_occupancy=model.ANCHOR_OCCUPANCY,
                sb_reference=model.SB_REFERENCE,
            ),
            bounds="overlap: tensor cores and the rest overlap perfectly; no_overlap: they take "
            "turns; both charge in-loop spill traffic at the L1's 128 B/clock per SM",
            seconds=round(time.time() - t0, 1),
            wrapper_calls=len(vlist),
            reused=0 if reuse_note else len(reused) - len(checked),
            spot_checked=0 if reuse_note else len(checked),
            hook_users=variants.hook_users(),
        ),
        compiles=compiles,
        model=costs,
        refusals=refusals,
        notes=notes,
        failures=failures,
        spills=spills,
    )


# ---------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------


def _dots(r: dict) -> str:
    kinds = ("wgmma", "tcgen5", "mma", "fma")
    if not any(r.get(k) for k in kinds):
        return "-"
    parts = [f"{r[k]}{k}" for k in kinds if r.get(k)]
    return " ".join(parts) + ("!" if r["fma"] and r["dtype"] != "fp32" else "")


def compile_lines(rep: dict) -> list[str]:
    head = ("family", "kernel", "features", "mask", "D", "dtype", "sm", "tiles", "w", "st",
            "regs", "spill", "smem KiB/limit", "dots", "occupancy")  # fmt: skip
    rows = [head]
    for r in rep["compiles"]:
        base = (r["family"], r["kernel"], r["features"], "causal" if r["causal"] else "bidir",
                str(r["head_dim"]), r["dtype"], str(r["arch"]))  # fmt: skip
        if not r.get("ok"):
            rows.append(base + ("COMPILE FAILED: " + r.get("error", "")[:80],))
            continue
        smem = f"{r['smem'] / 1024:.0f}/{r['smem_limit'] // 1024}" + (
            "" if r["smem_ok"] else " OVER"
        )
        occ = f"{r['ctas']}x{r['warps']}w {r['occupancy']:.0%} ({r['limiter']})"
        rows.append(base + (r["tiles"], str(r["warps"]), str(r["stages"]), str(r["regs"]),
                            str(r["spill_store"]), smem, _dots(r), occ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(head))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows
    ]


def model_lines(rep: dict) -> list[str]:
    """One line per modelled variant: cycles per pair under both bounds, ratios against the
    tutorial (and the stick-breaking paper's kernel) and against plain flash."""
    lines = [
        "cycles per (query, key) pair, sm_90 inner loops (static model, not a time); a/b = "
        "overlap / no-overlap bound, in-loop spills charged at L1 cost; x = anchor / course; "
        f"tutorial = {model.ANCHOR_NAME}; SB = {model.SB_REFERENCE_NAME} (overlap bound only); "
        "plain = the course's plain flash, same mask, head_dim and dtype",
    ]
    users = rep["meta"].get("hook_users", {})
    if users:
        lines.append(
            "score-bias hooks and the encodings that can use them (diagonal_table: the "
            "per-distance path of a bias written in torch; *: its kernel_bias chooses between "
            "the table and a hook of its own): "
            + "; ".join(f"{hook} ({', '.join(names) or '-'})" for hook, names in users.items())
        )
    for e in rep["model"]:
        label = (f"  {e['family']:5} {e['features']:38} {'causal' if e['causal'] else 'bidir ':6} "
                 f"D{e['head_dim']:<3} {e['dtype']}")  # fmt: skip
        if "error" in e:
            lines.append(f"{label}  not modelled: {e['error']}")
            continue
        line = (f"{label}  fwd {e['fwd']:.4f}/{e['fwd_no']:.4f} ({e['bounds']['forward']}) "
                f"bwd {e['bwd']:.4f}/{e['bwd_no']:.4f}  tutorial {e['total_x']:.2f}/"
                f"{e['total_x_no']:.2f}x")  # fmt: skip
        if "plain_x" in e:
            line += f"  plain {e['plain_x']:.2f}/{e['plain_x_no']:.2f}x"
        if "sb_total_x" in e and e["causal"]:
            line += f"  SB {e['sb_total_x']:.2f}x"
        line += f"  bwd workspace {e['workspace_bwd'] / 2**20:.0f} MiB"
        if not e.get("launchable", True):
            line += "  [does not launch: shared memory]"
        lines.append(line)
    return lines


def goal_lines(rep: dict) -> list[str]:
    """The speed goals (:mod:`course_lib.gpu_static.goals`), one line per goal and head_dim:
    on the model calibrated against the committed GPU times (an estimate), then on the
    no-overlap bound."""
    from course_lib.gpu_static import calibrate

    lines = []
    for title, params in (
        ("calibrated model (static estimate, fitted to the committed GPU times)",
         calibrate.committed_params()),
        ("no-overlap bound, the paper's kernel on the overlap bound", None),
    ):  # fmt: skip
        lines.append(f"speed goals (causal, bf16, sm_90, fwd+bwd; {title}):")
        for v in goals.judge(rep, calibrated=params):
            if v["value"] is None:
                lines.append(
                    f"  MISSING {v['goal']} D{v['head_dim']}: not in this report (or, "
                    "calibrated, without plain flash's kernels to compare with)"
                )
                continue
            verdict = "met   " if v["met"] else f"MISSED by {v['short_by']:.3f}"
            lines.append(
                f"  {verdict} {v['goal']} D{v['head_dim']}: {v['value']:.3f} "
                f"(goal {v['floor']:.2f}; worst row: {v['row']}, bound {v['bound']})"
            )
    for s in goals.loop_spills(rep):
        lines.append(f"  spills in loop: {s['row']} {s['kernel']}: {s['local']} per iteration")
    return lines


def occupancy_lines(rep: dict) -> list[str]:
    """Per modelled kernel (causal variants): resident CTAs x warps per SM, registers,
    block-wide barriers and spill accesses per iteration, pipelining stages; the tutorial's
    kernels first, compiled the same way."""
    lines = ["occupancy on sm_90, causal (CTAs x warps per SM, registers, block-wide barriers "
             "and spill loads/stores per iteration of the busiest loop, stages, nested "
             "loops)"]  # fmt: skip
    for d, passes in model.anchor_facts().items():
        parts = [f"{name} {model.occupancy_cell(f)}" for name, f in passes.items()]
        lines.append(f"  {'tutorial':44} D{d:<3} " + "; ".join(parts))
    for e in rep["model"]:
        if "error" in e or not e["causal"]:
            continue
        parts = [f"{k} {model.occupancy_cell(f)}" for k, f in e["occupancy"].items()]
        lines.append(f"  {e['family'] + ' ' + e['features']:44} D{e['head_dim']:<3} {e['dtype']} "
                     + "; ".join(parts))  # fmt: skip
    return lines


def write_figure(rep: dict, path: Path) -> None:
    """Left: fwd+bwd cost of each causal bf16 variant relative to the tutorial, bars for the
    no-overlap bound, ticks for the overlap bound. Right: every launch's shared memory against
    its GPU's per-block limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [e for e in rep["model"] if "error" not in e and e["dtype"] == "bf16" and e["causal"]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    ax = axes[0]
    keys = list(dict.fromkeys((e["family"], e["features"]) for e in ok))
    for d, shift, color in ((64, -0.2, "C0"), (128, 0.2, "C1")):
        rows = [(i, e) for i, k in enumerate(keys) for e in ok
                if (e["family"], e["features"]) == k and e["head_dim"] == d]  # fmt: skip
        ys = [i + shift for i, _ in rows]
        ax.barh(ys, [e["total_x_no"] for _, e in rows], height=0.4, color=color,
                label=f"head_dim {d}, no overlap")  # fmt: skip
        ax.scatter([e["total_x"] for _, e in rows], ys, marker="|", s=60, color="k",
                   label="overlap bound" if d == 64 else None)  # fmt: skip
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(range(len(keys)), [f"{f} {feat}" for f, feat in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("tutorial's fwd+bwd cycles per pair / kernel's (static model, higher is better)")
    ax.set_title("Static cost model, causal, bf16, sm_90 (not a time)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    markers = "os^vD<>p"
    archs = sorted({r["arch"] for r in rep["compiles"]}, reverse=True)
    start = 0
    for arch, marker in zip(archs, markers, strict=False):
        rows = [r for r in rep["compiles"] if r.get("ok") and r["arch"] == arch]
        ax.scatter(range(start, start + len(rows)), [r["smem"] / r["smem_limit"] for r in rows],
                   s=8, marker=marker, label=f"sm_{arch} ({_smem_limit_kib(arch)} KiB)")  # fmt: skip
        start += len(rows)
    ax.axhline(1.0, color="r", lw=0.8)
    ax.set_xlabel("compiled kernel (report order, by target)")
    ax.set_ylabel("shared memory / per-block limit")
    ax.set_title("Shared memory of every compiled launch", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smem_limit_kib(arch: int) -> int:
    """A target's per-block shared-memory limit, KiB."""
    return targets.TARGETS[arch].smem_per_block // 1024


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="bf16, head_dim 64 and 128 only")
    p.add_argument("--full", action="store_true", help="more feature combinations")
    p.add_argument("--ci", action="store_true",
                   help="the CI subset: --quick, plain (causal and bidirectional), each hook's "
                   "heaviest combination and CoPE's scan (causal), for sm_90 and, at the widest "
                   "head only, two learners' GPUs with less shared memory (sm_86: 99 KiB, "
                   "sm_75: 64 KiB)")  # fmt: skip
    p.add_argument(
        "--archs", type=int, nargs="+", default=None, choices=sorted(targets.TARGETS),
        help="targets (default: 90 80; with --ci: 90 86 75)",
    )  # fmt: skip
    p.add_argument("--dims", type=int, nargs="+", default=None)
    p.add_argument("--dtypes", nargs="+", default=None, choices=sorted(variants.DTYPES))
    p.add_argument("--families", nargs="+", default=["flash", "stick", "cope"],
                   choices=["flash", "stick", "cope"])  # fmt: skip
    p.add_argument(
        "--filter", default=None, help="regex on 'family features causal|bidir D dtype smNN'"
    )
    p.add_argument("--kernels", default=None,
                   help="compile the kernels of this folder instead of the checkout's kernels/ "
                   "(e.g. an earlier version, for before/after figures)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--cache", default=None, help="Triton cache folder to keep (default: temporary)")
    p.add_argument("--reuse", default=None, metavar="REPORT",
                   help="take the rows of this earlier report (e.g. figures/gpu_report.json) "
                   "whose compile is the same (same kernel and hook sources, launch, target, "
                   "Triton and ptxas), once a fresh compile of two of them per target agrees "
                   "field for field; otherwise compile everything")  # fmt: skip
    p.add_argument("--out", default=str(FIGURES / "gpu_report"), help="path stem of .json and .png")
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--fail-on-spill", type=int, default=None)
    p.add_argument("--verbose", action="store_true", help="print the per-compile table")
    args = p.parse_args(argv)
    try:
        runtime.require_triton(
            TRITON_FOR_REPORT, "python -m course_lib.gpu_report (it compiles through Triton's "
            "own launch binder and ptxas lookup, whose interfaces changed in 3.6)",
        )  # fmt: skip
    except runtime.KernelsUnavailableError as err:
        print(f"gpu_report: {err}", file=sys.stderr)
        return 2
    if args.archs is None:
        args.archs = [90, 86, 75] if args.ci else [90, 80]
    quick = args.quick or args.ci
    if args.dims is None:
        args.dims = [64, 128] if quick else [16, 32, 64, 128]
    if args.dtypes is None:
        args.dtypes = ["bf16"] if quick else ["bf16", "fp16", "fp32"]
    if args.kernels:
        variants.KERNELS_DIR = Path(args.kernels).resolve()
    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="gpu_report-"))
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        rep = run_report(args)
    finally:
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    if not args.no_figure:
        write_figure(rep, out.with_suffix(".png"))
    text = [f"GPU report (no GPU used): {rep['meta']['tools']}; shape seq {variants.BENCH_SEQ}"]
    if args.verbose:
        text += compile_lines(rep)
    else:
        text += _summary_table(rep)
    text += ["", *model_lines(rep), "", *occupancy_lines(rep), "", *goal_lines(rep), ""]
    text += [f"spills > {SPILL_NOTE} B: {s}" for s in rep["spills"]]
    text += [
        f"sm_{r['arch']}: bf16 refused by the wrappers, compiled in fp16 instead: {r['message']}"
        for r in rep.get("refusals", [])
    ]
    text += [f"note: {n}" for n in rep.get("notes", [])]
    text += [f"FAIL {f}" for f in rep["failures"]]
    n = len(rep["compiles"])
    reused = rep["meta"].get("reused", 0)
    if reused:
        text.append(f"{reused} of the {n} rows reused from {args.reuse} (their compiles unchanged; "
                    f"{rep['meta']['spot_checked']} compiled again and identical)")  # fmt: skip
    text.append(f"{n} kernels {'reported' if reused else 'compiled'} in "
                f"{rep['meta']['seconds']:.0f} s; "
                + ("RESULT: FAIL" if rep["failures"] else "RESULT: OK (all compile, fit in "
                   "shared memory, 16-bit dots on tensor cores wherever this Triton has "
                   "them)"))  # fmt: skip
    text.append(f"wrote {out.with_suffix('.json')}" + ("" if args.no_figure else " and .png"))
    print("\n".join(text))
    return 1 if rep["failures"] else 0


def _summary_table(rep: dict) -> list[str]:
    """One line per (family, kernel, features, dtype): worst case over causal/bidir per cell
    (sm, D): regs/spill/smem KiB and dot lowering."""
    cells: dict[tuple, dict] = {}
    cols = sorted({(r["arch"], r["head_dim"]) for r in rep["compiles"]}, reverse=True)
    for r in rep["compiles"]:
        k = (r["family"], r["kernel"], r["features"], r["dtype"])
        cells.setdefault(k, {}).setdefault((r["arch"], r["head_dim"]), []).append(r)
    head = ["kernel", "features", "dtype"] + [f"sm{a} D{d}" for a, d in cols]
    rows = [head]
    for k, by in cells.items():
        row = [f"{k[0]} {k[1]}", k[2], k[3]]
        for c in cols:
            rs = by.get(c)
            if not rs:
                row.append("-")
            elif not all(r.get("ok") for r in rs):
                row.append("COMPILE FAILED")
            else:
                w = max(rs, key=lambda r: (r["smem"], r["spill_store"], r["regs"]))
                cell = f"{w['regs']}/{w['spill_store']}/{w['smem'] // 1024}K"
                cell += " " + _dots(w).replace("wgmma", "wg").replace("tcgen5", "tc5")
                if not all(r["smem_ok"] for r in rs):
                    cell += " OVER"
                row.append(cell)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    out = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows
    ]
    out.append(
        "cell: registers/spill-store bytes/shared KiB (worst of causal and bidir), dots "
        "(wg = wgmma, tc5 = tcgen5, mma = mma.sync, fma = CUDA cores, ! = a 16-bit dot off the "
        "tensor cores), OVER = more shared memory than one block may have"
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
