"""Results of the comparison: where they are saved, reading them back, the summary table.

A run's results are one JSON file, ``<out_dir>/<objective>_<encoding>.json`` (see
:func:`course_lib.compare.runner.run_one` for what it holds). :func:`load_results` reads back
those that exist, for every registered encoding (a registered encoding that was never run simply
has none); :func:`summary_markdown` turns them into the headline table.
"""

from __future__ import annotations

from pathlib import Path

from course_lib.compare.arms import ABLATIONS, arm_names
from course_lib.compare.files import check_result, read_json
from course_lib.compare.stats import by_arm, paired, spread
from course_lib.model import OBJECTIVES

#: Version of the result and checkpoint identity; a change makes saved runs count as different.
FORMAT_VERSION = 2

__all__ = [
    "REPO_ROOT",
    "default_out_dir",
    "hardware_label",
    "load_results",
    "describe_runs",
    "headline_markdown",
    "run_name",
    "summary_markdown",
    "update_readme_headline",
]

#: The repository root (``course_lib`` is installed from it in editable mode).
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_out_dir(preset: str) -> Path:
    """``figures/compare_<preset>/`` in the repository."""
    return REPO_ROOT / "figures" / f"compare_{preset}"


def run_name(objective: str, arm: str, seed: int = 0) -> str:
    """``<objective>_<arm>_s<seed>``: the stem of a run's result and checkpoint files."""
    return f"{objective}_{arm}_s{seed}"


def hardware_label(hardware: dict) -> str:
    """One line saying where a run ran, from the dict of
    :func:`course_lib.compare.runner.hardware_description` (with the number of processes when
    there were several)."""
    if hardware["kind"] == "GPU":
        label = f"GPU: {hardware['gpu']}"
    else:
        threads = hardware["torch_threads"]
        label = (
            f"CPU: {hardware['cpu']} ({hardware['logical_cpus']} logical cores, "
            f"{threads} torch thread{'s' if threads != 1 else ''})"
        )
    if hardware.get("processes", 1) > 1:
        how = "data parallel" if hardware["parallel_mode"] == "data" else "one run each"
        label += f", {hardware['processes']} processes ({how}, {hardware['process_backend']})"
    return label


def load_results(out_dir: str | Path) -> list[dict]:
    """The result dicts saved in ``out_dir`` (``*.json`` of this format), ordered by objective,
    then arm (:func:`course_lib.compare.arms.arm_names` order: the registry's encodings, then
    the ablations), then seed; only the runs that have a results file (none is made up)."""
    out_dir = Path(out_dir)
    order = {name: i for i, name in enumerate(arm_names())}
    results = []
    for path in sorted(out_dir.glob("*.json")):
        # a damaged file raises, naming it; one of an older format is left out
        result = check_result(path, read_json(path), keys=("identity",))
        if result["identity"].get("format_version") == FORMAT_VERSION:
            results.append(check_result(path, result))
    if not results:
        raise FileNotFoundError(f"no comparison results (*.json) in {out_dir}")
    results.sort(
        key=lambda r: (
            OBJECTIVES.index(r["objective"]),
            order.get(r["arm"], len(order)),
            r["arm"],
            r["seed"],
        )
    )
    return results


def _cell(runs: list[dict], name: str, digits: int = 3) -> str:
    """A table cell: the metric's ``mean ± sd`` over the seeds of ``runs``, or n/a."""
    value = spread(runs, name)
    return "n/a" if value is None else value.text(digits)


def _bucket_labels(results: list[dict]) -> list[str]:
    return [f"{b['start']}-{b['end'] - 1}" for b in results[0]["position_buckets"]]


OBJECTIVE_HEADINGS = {
    "mlm": (
        "Masked LM",
        "loss on the 15% masked tokens, with context on both sides (not comparable with the "
        "causal loss)",
    ),
    "clm": ("Causal LM", "loss on every next token; bpb = bits per byte = loss / ln 2"),
}


def _arm_label(arm: str) -> str:
    return arm if "." not in arm else f"{arm} (ablation)"


def _objective_table(results: list[dict], objective: str) -> list[str]:
    groups = {k: v for k, v in by_arm(results).items() if k[0] == objective}
    if not groups:
        return []
    runs0 = next(iter(groups.values()))
    buckets = _bucket_labels(runs0)
    probes = [t for t in ("word_order", "retrieval") if any(t in r["probes"] for r in runs0)]
    columns = ["arm", "seeds", "params (position)", "val loss"]
    columns += ["bpb"] if objective == "clm" else []
    columns += [f"loss at {b}" for b in buckets]
    columns += [t.replace("_", " ") for t in probes] + ["tokens/s"]
    title, note = OBJECTIVE_HEADINGS[objective]
    lines = [
        f"## {title}",
        "",
        f"Each cell: mean ± sample standard deviation over the seeds; {note}. Loss at a..b: the "
        "same held-out windows, scored by the position of the target (training length "
        f"{runs0[0]['identity']['train_config']['seq_len']}).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for (_, arm), runs in groups.items():
        params = runs[0]["metrics"]["parameters"]
        cells = [
            _arm_label(arm),
            ", ".join(str(r["seed"]) for r in runs),
            f"{params['total']:,} ({params['position_embeddings']:,})",
            _cell(runs, "val_loss"),
        ]
        cells += [_cell(runs, "bpb")] if objective == "clm" else []
        cells += [_cell(runs, f"bucket{k}") for k in range(len(buckets))]
        cells += [_cell(runs, t, 2) for t in probes]
        tps = spread(runs, "tokens_per_second")
        cells.append(f"{tps.mean:,.0f}" + (f" ± {tps.sd:,.0f}" if tps.n > 1 else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _ablation_table(results: list[dict]) -> list[str]:
    rows = []
    metrics = ("val_loss", "bucket3", "word_order", "retrieval")
    for ablation in ABLATIONS:
        for objective in OBJECTIVES:
            cells = []
            for name in metrics:
                diff = paired(results, objective, ablation.name, ablation.encoding, name)
                cells.append(
                    "n/a"
                    if diff is None
                    else diff.text(3 if "loss" in name or "bucket" in name else 2)
                )
            if all(c == "n/a" for c in cells):
                continue
            rows.append(
                f"| {objective} | {ablation.name} | {ablation.encoding} | "
                + " | ".join(cells)
                + " |"
            )
    if not rows:
        return []
    return [
        "## Ablations: each against its own encoding, seed by seed",
        "",
        "Paired difference (ablation - encoding) per seed: mean [min, max]; a direction is "
        'called only when every seed agrees, else "within noise".',
        "",
        "| objective | ablation | against | val loss | loss at the last bucket | word order | "
        "retrieval |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _learned_values(results: list[dict]) -> list[str]:
    lines = []
    for (objective, arm), runs in by_arm(results).items():
        names = sorted(
            {n for r in runs for layer in r.get("learned_values", {}).values() for n in layer}
        )
        for name in names:
            per_layer = []
            layers = sorted(runs[0]["learned_values"])
            for layer in layers:
                values = [v for r in runs for v in r["learned_values"][layer].get(name, [])]
                if values:
                    per_layer.append(f"{layer}: {min(values):.3g} to {max(values):.3g}")
            lines.append(f"| {objective} | {arm} | {name} | " + "; ".join(per_layer) + " |")
    if not lines:
        return []
    return [
        "## Learned values at the end of training",
        "",
        "Range over heads and seeds (RSE's penalty lambda starts at 0.01, the stick bias at -3).",
        "",
        "| objective | arm | value | per layer |",
        "|---|---|---|---|",
        *lines,
        "",
    ]


def describe_runs(results: list[dict]) -> str:
    """One paragraph: the model, the hardware, the seeds, and how long the runs took."""
    first = results[0]
    train_seconds = sum(r["metrics"]["train_seconds"] for r in results)
    wall_seconds = sum(r["metrics"]["wall_seconds_this_segment"] for r in results)
    loads = [r["metrics"].get("cpu_load_average_1min") for r in results]
    load_text = (
        f"; mean 1-minute load average of the machine during the runs: {sum(loads) / len(loads):.2f}"
        if all(x is not None for x in loads)
        else ""
    )
    seeds = sorted({r["seed"] for r in results})
    return (
        f"Model: {first['preset_description']}. Hardware: {hardware_label(first['hardware'])}. "
        f"Seeds: {', '.join(map(str, seeds))} (each seeds the initialisation and the order of "
        "the training data; probe examples and evaluation text are the same for every run). "
        f"The {len(results)} runs took {wall_seconds / 60:.1f} min of process time in all, of "
        f"which {train_seconds / 60:.1f} min of training steps, the rest evaluations and "
        f"probes (a run resumed after an interruption counts its last segment only){load_text}."
    )


def summary_markdown(results: list[dict]) -> str:
    """The comparison's report: one table per objective (mean ± sd over seeds), the ablations
    as paired differences, and the learned values, with a paragraph saying what made them."""
    first = results[0]
    lines = [
        f"# Encoding comparison: {first['preset']} preset",
        "",
        describe_runs(results),
        "",
        f"Loss: nats per byte token on held-out text. Unigram baseline: "
        f'{first["data"]["unigram_entropy_nats"]:.3f} nats. "n/a" past the learned table: it has '
        "no rows there. Probe chance: word order 0.5, "
        f"retrieval {_retrieval_chance(results)}. {_probe_sizes(results)}",
        "",
    ]
    for objective in OBJECTIVES:
        lines += _objective_table(results, objective)
    lines += _ablation_table(results)
    lines += _learned_values(results)
    return "\n".join(lines).rstrip() + "\n"


def headline_markdown(results: list[dict]) -> str:
    """README's headline: per objective, each encoding's validation loss, loss at the last
    position bucket and probe accuracies (mean ± sd over seeds); generated, never typed."""
    seeds = sorted({r["seed"] for r in results})
    lines = [
        f"{first_line(results)} Mean ± standard deviation over seeds {', '.join(map(str, seeds))};"
        " full tables, ablations and figures in `figures/compare_cpu/summary.md`.",
        "",
    ]
    for objective in OBJECTIVES:
        groups = {k: v for k, v in by_arm(results).items() if k[0] == objective and "." not in k[1]}
        if not groups:
            continue
        runs0 = next(iter(groups.values()))
        last = _bucket_labels(runs0)[-1]
        probes = [t for t in ("word_order", "retrieval") if any(t in r["probes"] for r in runs0)]
        title, _ = OBJECTIVE_HEADINGS[objective]
        header = ["encoding", "val loss", f"loss at {last}", *(t.replace("_", " ") for t in probes)]
        lines += [
            f"**{title}**",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for (_, arm), runs in groups.items():
            cells = [
                arm,
                _cell(runs, "val_loss"),
                _cell(runs, f"bucket{len(_bucket_labels(runs0)) - 1}"),
            ]
            cells += [_cell(runs, t, 2) for t in probes]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


README_MARKERS = ("<!-- comparison headline: start -->", "<!-- comparison headline: end -->")


def update_readme_headline(results: list[dict], readme: str | Path | None = None) -> Path:
    """Replace the text between README's :data:`README_MARKERS` by
    :func:`headline_markdown` of ``results``; returns the README's path."""
    path = Path(readme) if readme is not None else REPO_ROOT / "README.md"
    text = path.read_text(encoding="utf-8")
    start, end = README_MARKERS
    if start not in text or end not in text:
        raise ValueError(f"{path} has no {start} ... {end} block to fill")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    path.write_text(f"{before}{start}\n{headline_markdown(results)}{end}{after}", encoding="utf-8")
    return path


def first_line(results: list[dict]) -> str:
    first = results[0]
    return f"The `{first['preset']}` preset: {first['preset_description']}."


def _probe_sizes(results: list[dict]) -> str:
    sizes = {}
    for r in results:
        for task, probe in r["probes"].items():
            sizes[task] = probe["eval_examples"]
    if not sizes:
        return ""
    text = ", ".join(f"{t.replace('_', ' ')} {n}" for t, n in sizes.items())
    return (
        f"Held-out probe examples per run: {text} (binomial standard error of one run's "
        "accuracy at most 0.5 / sqrt(n); each results file holds its own)."
    )


def _retrieval_chance(results: list[dict]) -> str:
    probes = [r["probes"]["retrieval"] for r in results if "retrieval" in r["probes"]]
    if not probes:
        return "n/a"
    probe = probes[0]
    return (
        f"{probe['chance']:.3f} (a position-blind guess of the most frequent context symbol: "
        f"{probe['bag_of_symbols_baseline']:.3f})"
    )
