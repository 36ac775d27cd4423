"""The check's report: one JSON file and one figure named by the device, and its verdicts.

``figures/gpu_check/<device>.json`` holds everything measured (``meta``, ``correctness``,
``speed``, ``notebooks``, ``training``) and the ``summary`` :func:`summarise` derives from it;
``<device>.png`` draws the speed against SDPA per head_dim and the worst error of each method
against its tolerance. The verdicts: the check passes when every kernel case agrees with the
reference (or the method states it has no kernel), every notebook passes and every short run
trains. Timings are reported, never judged, with one exception: comparisons with FlexAttention
are printed only where the run's FlexAttention without a ``score_mod`` kept at least
:data:`.speed.SANITY_MIN` x SDPA's speed (:func:`.speed.flex_sanity`); otherwise, and for a
report without that row, they are marked unreliable.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from course_lib.gpu_check.speed import FLEX_SANITY, flex_sanity, is_flex

__all__ = ["format_summary", "summarise", "write_figure", "write_report"]

BUDGET_SECONDS = 15 * 60


def summarise(report: dict) -> dict:
    """Counts, the failing items of each phase, the speed at the longest length, ``ok``."""
    out: dict = {}
    rows = report.get("correctness")
    if rows is not None:
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        failing = [
            f"{r['label']}: {r['status']} "
            + (r.get("reason") or f"worst {r['worst']:.3g} > {r['tolerance']:g} ({_worst_name(r)})")
            for r in rows
            if r["status"] in ("wrong", "error")
        ]
        out["correctness"] = dict(counts=counts, failing=failing)
    records = report.get("speed")
    if records is not None:
        longest = max((r["seq"] for r in records), default=None)
        sanity = flex_sanity(records)
        headline = []
        for r in records:
            if r["seq"] != longest or r["pass_"] != "fwd+bwd" or r["contender"] != "kernel":
                continue
            alternative = _alternative_name(records, r)
            row = dict(
                method=r["method"],
                head_dim=r["head_dim"],
                seq=r["seq"],
                ms=r["ms"],
                vs_sdpa=r.get("vs_sdpa"),
                vs_alternative=r.get("vs_alternative"),
                alternative=alternative,
                peak_mib=r["peak_mib"],
            )
            compared = (r.get("vs_alternative"), r.get("vs_alternative_unreliable")) != (None, None)
            if is_flex(alternative) and compared:  # a report without the sanity row is judged too
                row["alternative_reliable"] = sanity["reliable"]
                if not sanity["reliable"]:
                    row["vs_alternative"] = None
            headline.append(row)
        failed = [
            f"{r['method']} {r['contender']} D{r['head_dim']} N{r['seq']} {r['pass_']}: "
            f"{r['status']}"
            for r in records
            if r["status"] in ("OOM",) or r["status"].startswith("error")
        ]
        backends = sorted({r["sdpa_backend"] for r in records if r.get("sdpa_backend")})
        out["speed"] = dict(
            longest=longest,
            headline=headline,
            not_timed=failed,
            flex_sanity=dict(
                reliable=sanity["reliable"],
                reason=sanity["reason"],
                threshold=sanity["threshold"],
                worst=sanity["worst"],
            ),
            sdpa_backend=", ".join(backends) if backends else "not recorded",
        )
    if report.get("tuning"):
        out["tuning"] = tuning_summary(report["tuning"])
    notebooks = report.get("notebooks")
    if notebooks is not None:
        out["notebooks"] = dict(
            passed=[n["notebook"] for n in notebooks if n["status"] == "passed"],
            failing=[
                f"{n['notebook']}: {n['status']}" for n in notebooks if n["status"] != "passed"
            ],
        )
    training = report.get("training")
    if training is not None:
        out["training"] = dict(
            trained=[t["arm"] for t in training if t["status"] == "trained"],
            failing=[f"{t['arm']}: {t['status']}" for t in training if t["status"] != "trained"],
        )
    seconds = report.get("meta", {}).get("seconds", {}).get("total")
    out["seconds"] = seconds
    out["over_budget"] = seconds is not None and seconds > BUDGET_SECONDS
    out["ok"] = not any(part.get("failing") for part in out.values() if isinstance(part, dict))
    # a report written while the run went on (cli.run_check's progress): what it lacks
    out["unfinished"] = list(report.get("meta", {}).get("unfinished") or [])
    return out


def _tuning_label(key: list) -> str:
    """``flash backward D64 alibi N<=4096`` from a choice's key (``flash_ops._tuned_tiles``)."""
    family, pass_, _device, head_dim, _dtype, _causal, hook = key[:7]
    return f"{family} {pass_} D{head_dim} {hook or 'plain'} N<={key[-1]}"


def tuning_summary(choices: list[dict]) -> dict:
    """What the tiles chosen on the GPU (``kernels/tuning.py``) gained over the static ones,
    from the times the tuner measured: ``shapes`` tuned, ``static_kept`` (the static tiles were
    the fastest), ``static_failed`` (the GPU could not run them), and for the rest of the shapes
    the chosen tiles' time over the static tiles' (``median``, ``best`` with its ``best_shape``)."""
    ratios = []
    static_failed = 0
    for c in choices:
        times = c["times_ms"]
        if times[0] is None and len(times) > 1:
            static_failed += 1
        elif len(times) > 1 and times[c["chosen"]] is not None:
            ratios.append((times[c["chosen"]] / times[0], _tuning_label(c["key"])))
    kept = sum(1 for c in choices if c["chosen"] == 0)
    best = min(ratios, default=None)
    return dict(
        shapes=len(choices),
        static_kept=kept,
        static_failed=static_failed,
        median=statistics.median(r for r, _ in ratios) if ratios else None,
        best=None if best is None else best[0],
        best_shape=None if best is None else best[1],
    )


def _worst_name(row: dict) -> str:
    errors = row.get("errors") or {}
    return max(errors, key=errors.get) if errors else "-"


def _alternative_name(records: list[dict], kernel: dict) -> str | None:
    for r in records:
        same = all(r[k] == kernel[k] for k in ("method", "head_dim", "seq", "pass_", "causal"))
        if same and r["contender"] not in ("kernel", FLEX_SANITY):
            return r["contender"]
    return "SDPA" if kernel["method"] == "softmax" else None


def format_summary(report: dict) -> list[str]:
    """The summary as lines for the terminal."""
    s = report["summary"]
    device = report["meta"]["device"]
    lines = [f"GPU check on {device['name']} (compute capability {device['capability']})"]
    if "correctness" in s:
        c = s["correctness"]
        parts = ", ".join(f"{n} {k}" for k, n in sorted(c["counts"].items()))
        lines.append(f"kernels vs reference: {parts}")
        lines += [f"  FAIL {f}" for f in c["failing"]]
    if "speed" in s:
        sp = s["speed"]
        sanity = sp.get("flex_sanity")
        if sanity is not None:
            verdict = "comparisons reliable" if sanity["reliable"] else "UNRELIABLE"
            lines.append(f"FlexAttention sanity: {verdict}: {sanity['reason']}")
        lines.append(f"SDPA backend: {sp.get('sdpa_backend', 'not recorded')}")
        lines.append(f"speed at seq {sp['longest']}, fwd+bwd (x = other's time / kernel's):")
        for h in sp["headline"]:
            vs = "" if h["vs_sdpa"] is None else f"  {h['vs_sdpa']:.2f}x vs SDPA"
            if h.get("alternative_reliable") is False:
                vs += f", vs {h['alternative']}: unreliable (FlexAttention sanity)"
            elif h["vs_alternative"] is not None and h["alternative"] != "SDPA":
                vs += f", {h['vs_alternative']:.2f}x vs {h['alternative']}"
            ms = "-" if h["ms"] is None else f"{h['ms']:.2f} ms"
            lines.append(f"  D{h['head_dim']:<3} {h['method']:16} {ms}{vs}")
        lines += [f"  not timed: {f}" for f in sp["not_timed"]]
    if "tuning" in s:
        t = s["tuning"]
        line = (f"tiles tuned on this GPU: {t['shapes']} shapes, the static tiles fastest for "
                f"{t['static_kept']}")  # fmt: skip
        if t["static_failed"]:
            line += f", not runnable for {t['static_failed']}"
        if t["median"] is not None:
            line += (f"; the chosen tiles' time over the static ones: {t['median']:.2f} (median), "
                     f"{t['best']:.2f} at best ({t['best_shape']})")  # fmt: skip
        lines.append(line)
    if "notebooks" in s:
        nb = s["notebooks"]
        lines.append(f"notebooks under nbval: {len(nb['passed'])} passed")
        lines += [f"  FAIL {f}" for f in nb["failing"]]
    if "training" in s:
        tr = s["training"]
        lines.append(
            f"short gpu comparison (one seed, not a comparison): {len(tr['trained'])} trained"
        )
        lines += [f"  FAIL {f}" for f in tr["failing"]]
    if s["seconds"] is not None:
        minutes = s["seconds"] / 60
        lines.append(
            f"took {minutes:.1f} min" + (" (over the 15-minute plan)" if s["over_budget"] else "")
        )
    if s.get("unfinished"):
        lines.append(f"PARTIAL: the run stopped before {', '.join(s['unfinished'])}")
    verdict = "OK" if s["ok"] else "FAIL"
    lines.append(f"RESULT: {verdict} so far" if s.get("unfinished") else f"RESULT: {verdict}")
    return lines


def write_report(report: dict, out_dir: Path, slug: str, figure: bool = True) -> list[Path]:
    """``<out_dir>/<slug>.json`` (and ``.png``); returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{slug}.json"
    # written beside it, then renamed over it: a run stopped while writing leaves the last whole
    # report, never half of one
    partial = path.with_name(f".{path.name}.writing")
    partial.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(partial, path)
    written = [path]
    if figure:
        written.append(write_figure(report, out_dir / f"{slug}.png"))
    return written


def write_figure(report: dict, path: Path) -> Path:
    """Speed against SDPA (fwd+bwd, one panel per head_dim, one line per method) and each
    method's worst error over its tolerance (per dtype)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [
        r
        for r in report.get("speed") or []
        if r["contender"] == "kernel" and r["pass_"] == "fwd+bwd" and r.get("vs_sdpa")
    ]
    dims = sorted({r["head_dim"] for r in records})
    fig, axes = plt.subplots(1, len(dims) + 1, figsize=(5 * (len(dims) + 1), 4.5), squeeze=False)
    name = report["meta"]["device"]["name"]
    # more methods than colours: colour and line style together tell each line apart
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = [("-", "o"), ("--", "s"), (":", "^")]
    for ax, d in zip(axes[0], dims, strict=False):
        for n, method in enumerate(dict.fromkeys(r["method"] for r in records)):
            pts = sorted(
                (r["seq"], r["vs_sdpa"])
                for r in records
                if r["method"] == method and r["head_dim"] == d
            )
            line, marker = styles[(n // len(colours)) % len(styles)]
            if pts:
                ax.plot(
                    *zip(*pts, strict=True), ls=line, marker=marker, ms=3, label=method,
                    color=colours[n % len(colours)],
                )  # fmt: skip
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # from CoPE's 0.002 to softmax's 0.7
        ax.set_xlabel("sequence length")
        ax.set_ylabel("SDPA time / kernel time (fwd+bwd)")
        ax.set_title(f"{name}: speed vs SDPA, head_dim {d} (measured)", fontsize=9)
        ax.legend(fontsize=6, ncol=2)
    ax = axes[0][-1]
    rows = [r for r in report.get("correctness") or [] if r.get("worst") is not None]
    labels = list(dict.fromkeys(r["method"] for r in rows))
    for i, dtype in enumerate(dict.fromkeys(r["dtype"] for r in rows)):
        worst = [
            max(
                (
                    r["worst"] / r["tolerance"]
                    for r in rows
                    if r["method"] == m and r["dtype"] == dtype
                ),
                default=0.0,
            )
            for m in labels
        ]
        ax.barh([j + 0.25 * i for j in range(len(labels))], worst, height=0.25, label=dtype)
    ax.axvline(1.0, color="r", lw=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("worst error / tolerance (below 1: agrees)")
    ax.set_title("kernels vs float64 reference, fwd and bwd", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
