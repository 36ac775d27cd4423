"""Results of the comparison: where they are saved, reading them back, the summary table.

A run's results are one JSON file, ``<out_dir>/<objective>_<encoding>.json`` (see
:func:`course_lib.compare.runner.run_one` for what it holds). :func:`load_results` reads back
those that exist, for every registered encoding (a registered encoding that was never run simply
has none); :func:`summary_markdown` turns them into the headline table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from course_lib.encodings import REGISTRY
from course_lib.model import OBJECTIVES

__all__ = [
    "REPO_ROOT",
    "default_out_dir",
    "hardware_label",
    "load_results",
    "run_name",
    "summary_markdown",
]

#: The repository root (``course_lib`` is installed from it in editable mode).
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_out_dir(preset: str) -> Path:
    """``figures/compare_<preset>/`` in the repository."""
    return REPO_ROOT / "figures" / f"compare_{preset}"


def run_name(objective: str, encoding: str) -> str:
    """``<objective>_<encoding>``: the stem of a run's result and checkpoint files."""
    return f"{objective}_{encoding}"


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
    """The result dicts saved in ``out_dir``, ordered by objective, then by encoding in
    :data:`course_lib.encodings.REGISTRY` order; only the runs that have a results file (an
    encoding never run has none, and none is made up)."""
    out_dir = Path(out_dir)
    results = []
    for objective in OBJECTIVES:
        for encoding in REGISTRY:
            path = out_dir / f"{run_name(objective, encoding)}.json"
            if path.exists():
                results.append(json.loads(path.read_text(encoding="utf-8")))
    if not results:
        raise FileNotFoundError(f"no comparison results (*.json) in {out_dir}")
    return results


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def summary_markdown(results: list[dict]) -> str:
    """A markdown table of the headline numbers of each run, with a line saying what made them."""
    first = results[0]
    train_seconds = sum(r["metrics"]["train_seconds"] for r in results)
    wall_seconds = sum(r["metrics"]["wall_seconds_this_segment"] for r in results)
    loads = [r["metrics"].get("cpu_load_average_1min") for r in results]
    load_text = (
        f"; mean 1-minute load average of the machine during the runs: {sum(loads) / len(loads):.2f}"
        if all(x is not None for x in loads)
        else ""
    )
    lines = [
        f"# Encoding comparison: {first['preset']} preset",
        "",
        f"Model: {first['preset_description']}. Hardware: {hardware_label(first['hardware'])}. "
        f"Time of the {len(results)} runs: {wall_seconds / 60:.1f} min in all, of which "
        f"{train_seconds / 60:.1f} min of training steps, the rest evaluations and probes "
        f"(a run resumed after an interruption counts its last segment only){load_text}.",
        "",
        "Loss: nats per byte token on held-out text (MLM: masked tokens only); bpb = bits per byte "
        f"= loss / ln 2. Unigram baseline: {first['data']['unigram_entropy_nats']:.3f} nats. "
        '"n/a" past the learned table: it has no rows there. Probe chance: word order 0.5, '
        f"retrieval {_retrieval_chance(results)}.",
        "",
        "| objective | encoding | params (position) | val loss | bpb | loss 2x | loss 4x "
        "| word order | retrieval | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["metrics"]
        by_multiple = {e["multiple"]: e.get("loss") for e in r["extrapolation"]}
        params = m["parameters"]
        lines.append(
            f"| {r['objective']} | {r['encoding']} "
            f"| {params['total']:,} ({params['position_embeddings']:,}) "
            f"| {_fmt(m['final_val_loss'])} | {_fmt(m['final_val_bits_per_byte'])} "
            f"| {_fmt(by_multiple.get(2))} | {_fmt(by_multiple.get(4))} "
            f"| {_fmt(r['probes'].get('word_order', {}).get('accuracy'), 2)} "
            f"| {_fmt(r['probes'].get('retrieval', {}).get('accuracy'), 2)} "
            f"| {m['tokens_per_second']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def _retrieval_chance(results: list[dict]) -> str:
    probes = [r["probes"]["retrieval"] for r in results if "retrieval" in r["probes"]]
    if not probes:
        return "n/a"
    probe = probes[0]
    return (
        f"{probe['chance']:.3f} (a position-blind guess of the most frequent context symbol: "
        f"{probe['bag_of_symbols_baseline']:.3f})"
    )
