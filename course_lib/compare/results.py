"""Results of the comparison: where they are saved, reading them back, the report's text.

A run's results are one JSON file, ``<out_dir>/<objective>_<arm>_s<seed>.json`` (see
:func:`course_lib.compare.training_run.run_one` for what it holds); the learning-rate sweep's are in
``<out_dir>/sweep/``, the timing pass's in ``<out_dir>/timing.json`` and the log of the
sittings that made them in ``<out_dir>/sessions.json``. :func:`load_results` reads back the
runs that exist; :func:`summary_markdown` writes the report (``summary.md``) and
:func:`headline_markdown` README's headline, both from the same family of tested claims
(:mod:`course_lib.compare.claims`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from course_lib.compare.arms import ABLATIONS, arm_names
from course_lib.compare.claims import (
    BOOTSTRAP_RESAMPLES,
    PLATEAU_MARGIN,
    Bound,
    Difference,
    _arms_of,
    evaluation_se,
    judge,
    plateau_arms,
    report_claims,
    spread_of_called,
    uninformative_probes,
    untested_questions,
)
from course_lib.compare.files import check_result, read_json
from course_lib.compare.stats import ALPHA, METRICS, MIN_EFFECT, by_arm, spread
from course_lib.model import OBJECTIVES
from course_lib.readme_sections import replace_section

#: Version of the result and checkpoint identity; a change makes saved runs count as different.
FORMAT_VERSION = 3

__all__ = [
    "FORMAT_VERSION",
    "REPO_ROOT",
    "default_out_dir",
    "describe_runs",
    "hardware_label",
    "headline_markdown",
    "idle_probe_effect",
    "load_results",
    "load_sessions",
    "mean_sweep_loss",
    "run_name",
    "summary_markdown",
    "sweep_name",
    "sweep_table",
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


def sweep_name(objective: str, encoding: str, learning_rate: float, seed: int) -> str:
    """``<objective>_<encoding>_lr<rate>_s<seed>``: the stem of a sweep run's files."""
    return f"{objective}_{encoding}_lr{learning_rate:g}_s{seed}"


def sweep_table(sweeps: list[dict]) -> dict[tuple[str, str], dict[float, dict[int, float]]]:
    """``{(objective, encoding): {rate: {sweep seed: selection loss}}}`` of saved sweep runs."""
    table: dict[tuple[str, str], dict[float, dict[int, float]]] = {}
    for r in sweeps:
        pair = (r["objective"], r["encoding"])
        table.setdefault(pair, {}).setdefault(r["learning_rate"], {})[r["seed"]] = r["select"][
            "loss"
        ]
    return table


def mean_sweep_loss(losses: dict[int, float], seeds: Sequence[int]) -> float:
    """The mean selection loss of one rate over ``seeds`` (``losses``: seed -> loss); infinite
    when a run diverged (its loss is not finite), so that the rate is never chosen."""
    values = [losses[seed] for seed in seeds]
    if not all(math.isfinite(v) for v in values):
        return math.inf
    return sum(values) / len(values)


def hardware_label(hardware: dict) -> str:
    """One line saying where a run ran, from the dict of
    :func:`course_lib.compare.common.hardware_description` (with the number of processes when
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


#: Files in a results folder that are logs, not runs.
LOG_FILES = ("sessions.json", "timing.json")


def load_results(out_dir: str | Path) -> list[dict]:
    """The result dicts saved in ``out_dir`` (``*.json`` of this format), ordered by objective,
    then arm (:func:`course_lib.compare.arms.arm_names` order: the registry's encodings, then
    the ablations), then seed; only the runs that have a results file (none is made up)."""
    out_dir = Path(out_dir)
    order = {name: i for i, name in enumerate(arm_names())}
    results = []
    for path in sorted(out_dir.glob("*.json")):
        if path.name in LOG_FILES:
            continue
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


def load_sessions(out_dir: str | Path) -> list[dict]:
    """The sittings logged in ``<out_dir>/sessions.json`` (``[]`` when there is none)."""
    path = Path(out_dir) / "sessions.json"
    return read_json(path) if path.exists() else []


def load_timing(out_dir: str | Path) -> dict | None:
    """The timing pass of ``<out_dir>/timing.json`` (None when there is none)."""
    path = Path(out_dir) / "timing.json"
    return read_json(path) if path.exists() else None


# ---------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------


def _cell(runs: list[dict], name: str, digits: int | None = None) -> str:
    """A table cell: the metric's mean [95% interval] over the seeds of ``runs``, or n/a."""
    value = spread(runs, name)
    digits = METRICS[name].digits if digits is None else digits
    return "n/a" if value is None else value.interval_text(digits)


def _rate(rate: float) -> str:
    return f"{rate:g}"


def _arm_label(arm: str) -> str:
    return arm if "." not in arm else f"{arm} (ablation)"


OBJECTIVE_HEADINGS = {
    "mlm": (
        "Masked LM",
        "loss on the masked bytes (15%, over several mask draws), with context on both sides "
        "(not comparable with the causal loss)",
    ),
    "clm": ("Causal LM", "loss on every next byte; bpb = bits per byte = loss / ln 2"),
}


def _far(results: list[dict]) -> tuple[str, str]:
    """The far block's label (``448-511``) and the multiple of its metrics (``7L``)."""
    multiple = max(int(k.split("@")[1][:-1]) for k in results[0]["evaluation"] if "@" in k)
    length = results[0]["identity"]["train_config"]["seq_len"]
    start = multiple * length
    return f"{start}-{start + length - 1}", f"{multiple}L"


def _probes_of(runs: list[dict]) -> list[str]:
    return [t for t in ("word_order", "retrieval") if any(t in r["probes"] for r in runs)]


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def preset_description(results: list[dict]) -> str:
    """The description of the preset the runs belong to: the preset's own, as it reads now
    (runs made before a change of wording that leaves their identity alone, such as a wider
    sweep grid for other encodings, still belong to it), or the one the first run recorded
    when the preset is not one of :data:`~course_lib.compare.presets.PRESETS`."""
    from course_lib.compare.presets import PRESETS  # presets imports this module

    first = results[0]
    preset = PRESETS.get(first["preset"])
    return preset.description if preset is not None else first["preset_description"]


def describe_runs(results: list[dict], folder: str | Path | None = None) -> str:
    """One paragraph: the model, the hardware, the seeds, and what the runs cost (with the
    sittings logged in ``folder``)."""
    first = results[0]
    seeds = sorted({r["seed"] for r in results})
    cpu = sum(r["metrics"]["cpu_seconds_this_segment"] for r in results)
    train_cpu = sum(r["metrics"]["train_cpu_seconds"] for r in results)
    loads = [x for r in results if (x := r["metrics"].get("cpu_load_average_1min")) is not None]
    resumed = sum(r["metrics"].get("training_segments", 1) > 1 for r in results)
    if resumed:  # its training counts every segment, its process time the last one only
        cost = (
            f"took {_cpu_time(cpu)} (process time, evaluation and probes included; of the "
            f"{resumed} run{'s' if resumed > 1 else ''} resumed after an interruption, only the "
            f"last segment counts) and {_cpu_time(train_cpu)} in training steps (every segment "
            "counted)"
        )
    else:
        cost = (
            f"took {_cpu_time(cpu)} (process time; {_cpu_time(train_cpu)} of it in training "
            "steps, the rest evaluation and probes)"
        )
    text = (
        f"Model: {preset_description(results)}. Hardware: {hardware_label(first['hardware'])}. "
        f"Seeds: {', '.join(map(str, seeds))} (each seeds the initialisation and the order of "
        "the training data; probe examples, masks and evaluation text are the same for every "
        f"run). The {len(results)} runs {cost}"
    )
    if loads:
        text += (
            f"; the machine's 1-minute load average at the end of each run: median "
            f"{statistics.median(loads):.1f}, up to {max(loads):.1f}"
        )
    text += "."
    sessions = load_sessions(folder) if folder is not None else []
    if sessions:
        wall = sum(s["wall_seconds"] for s in sessions)
        procs = sorted({s["processes"] for s in sessions})
        total_cpu = cpu + _sweep_cpu(folder)
        # the logged sittings could not have spent this much CPU time: some were not logged
        partial = sum(s["wall_seconds"] * s["processes"] for s in sessions) < total_cpu
        text += (
            f" Wall-clock time of the command that made them (`sessions.json`): "
            f"{wall / 60:.0f} min in {len(sessions)} logged sitting"
            f"{'s' if len(sessions) > 1 else ''} "
            f"({' or '.join(map(str, procs))} process{'es' if procs != [1] else ''}), on a "
            "machine shared with other work"
            + (
                " (earlier sittings were not logged, so this is less than the whole: "
                "the logged sittings could not have spent the CPU time above)"
                if partial
                else ", the sweep included"
            )
            + ": on an idle machine with two processes it would be about the CPU time over "
            f"two ({total_cpu / 120:.0f} min, the learning-rate sweep's "
            f"{(total_cpu - cpu) / 60:.1f} CPU-minutes included)."
        )
    return text


def _cpu_time(seconds: float) -> str:
    """Process time as people read it: minutes to one decimal, under a minute in seconds."""
    return f"{seconds / 60:.1f} CPU-minutes" if seconds >= 60 else f"{seconds:.0f} CPU-seconds"


def _sweep_cpu(folder: str | Path | None) -> float:
    if folder is None or not (Path(folder) / "sweep").exists():
        return 0.0
    total = 0.0
    for path in (Path(folder) / "sweep").glob("*.json"):
        total += json.loads(path.read_text(encoding="utf-8"))["metrics"]["cpu_seconds_this_segment"]
    return total


def _bootstrap_unit_text(results: list[dict]) -> str:
    """What the bootstrap of the text's noise resamples: the test text's documents when every
    run records them, else its windows."""
    documents = [r.get("data", {}).get("test_window_documents") for r in results]
    if all(d is not None for d in documents):
        count = len(set(documents[0]))
        return (
            f"a block bootstrap over the {count} documents of the test text, each drawn with all "
            "its windows, since windows of one document are not independent"
        )
    return "a bootstrap over windows: these runs do not record their windows' documents"


def _data_section(results: list[dict], verdicts: dict) -> list[str]:
    data = results[0]["data"]
    val_tokens = {r["objective"]: r["evaluation"]["val"]["tokens"] for r in results}
    se = {}
    for objective, arm in by_arm(results):
        value = evaluation_se(results, Bound(objective, arm, "val_loss", "above", 0.0))
        if value is not None:
            se.setdefault(objective, []).append(value)
    summary = spread_of_called(verdicts)
    ratio = summary["largest_eval_se_ratio"]
    lines = [
        "## Text and evaluation",
        "",
        f"Corpus: `{data['corpus_source']}`, cut in order into training text "
        f"({data['train_tokens']:,} bytes), a selection split and a test split. Every "
        f"{data['ngram']}-byte string of a held-out split that also occurs in the training "
        "text (for the test split: in the training or the selection text) is removed with its "
        f"bytes, and windows are cut only inside what is left: selection "
        f"{data['select']['kept_bytes']:,} of {data['select']['held_out_bytes']:,} bytes kept, "
        f"test {data['test']['kept_bytes']:,} of {data['test']['held_out_bytes']:,}. The "
        "learning-rate sweep reads only the selection split; everything below is on the test "
        f"split: {data['test_windows']} windows of the training length "
        f"({', '.join(f'{o} {n:,} targets' for o, n in val_tokens.items())}, masked LM over "
        f"{results[0]['identity']['evaluation']['mask_draws']} mask draws) and "
        f"{data['long_windows']} windows of {data['long_window_length']} bytes. Unigram "
        f"entropy of the training text: {data['unigram_entropy_nats']:.3f} nats per byte.",
        "",
        "The test text's own noise ("
        + _bootstrap_unit_text(results)
        + f", {BOOTSTRAP_RESAMPLES} resamples): "
        "standard error of one arm's test loss "
        + ", ".join(f"{o} {min(v):.3f} to {max(v):.3f}" for o, v in se.items() if v)
        + " nats; of the called estimates below, at most "
        + ("n/a" if ratio is None else f"{ratio:.2f}")
        + " of their size (a call needs less than 0.25).",
        "",
    ]
    return lines


def _sweep_section(results: list[dict], sweeps: list[dict]) -> list[str]:
    if not sweeps:
        return []
    table = sweep_table(sweeps)
    seeds = sorted({s["seed"] for s in sweeps})
    rates = sorted({rate for row in table.values() for rate in row})
    chosen = {(r["objective"], r["encoding"]): r["learning_rate"] for r in results}
    several = len(seeds) > 1
    lines = [
        "## Learning rates",
        "",
        (
            f"Each encoding trained once per rate and seed {', '.join(map(str, seeds))} (seeds "
            "the report does not score), scored on the selection split; each cell is the mean "
            "loss over those seeds (the seeds' own losses in brackets), and the rate with the "
            "lowest mean (bold) trains every seed of the encoding and of its ablations: one "
            "sweep seed's luck does not choose the rate alone."
            if several
            else f"Each encoding trained once per rate at seed {seeds[0]} (a seed the report "
            "does not score), scored on the selection split; the rate with the lowest loss "
            "(bold) trains every seed of the encoding and of its ablations."
        )
        + " A rate at the edge of its objective's grid is marked: the best rate may lie beyond "
        "it.",
        "",
        "| objective | encoding | " + " | ".join(f"lr {_rate(x)}" for x in rates) + " | chosen |",
        "|---|---|" + "---|" * (len(rates) + 1),
    ]
    order = {name: i for i, name in enumerate(arm_names())}
    for (objective, encoding), row in sorted(
        table.items(), key=lambda kv: (OBJECTIVES.index(kv[0][0]), order.get(kv[0][1], 99))
    ):
        pick = chosen.get((objective, encoding))
        cells = []
        for rate in rates:
            losses = row.get(rate)
            if not losses or any(seed not in losses for seed in seeds):
                cells.append("n/a")
                continue
            mean = mean_sweep_loss(losses, seeds)
            text = f"{mean:.3f}" if math.isfinite(mean) else "diverged"
            text = f"**{text}**" if rate == pick else text
            if several:
                text += " (" + " / ".join(f"{losses[seed]:.3f}" for seed in seeds) + ")"
            cells.append(text)
        edge = pick is not None and pick in (min(row), max(row))
        pick_text = "n/a" if pick is None else _rate(pick) + (" (edge)" if edge else "")
        lines.append(f"| {objective} | {encoding} | " + " | ".join(cells) + f" | {pick_text} |")
    return lines + [""]


def _plateau_section(results: list[dict]) -> list[str]:
    mlm = [(arm, runs) for (o, arm), runs in by_arm(results).items() if o == "mlm"]
    if not mlm:
        return []
    unigram = results[0]["data"]["unigram_entropy_nats"]
    stuck = plateau_arms(results)
    threshold = unigram - PLATEAU_MARGIN
    worst = ", ".join(
        f"{arm} {max(r['evaluation']['val']['loss'] for r in runs):.3f}" for arm, runs in mlm
    )
    verdict = (
        "every masked arm left the plateau"
        if not stuck
        else "did not leave the plateau (no ranking claim is made on it): " + ", ".join(stuck)
    )
    return [
        "## Did the masked models leave the unigram plateau?",
        "",
        f"A masked model that has not started to use context sits near the unigram entropy "
        f"({unigram:.3f} nats); an arm counts as having left it when every seed's test loss is "
        f"at least {PLATEAU_MARGIN} below ({threshold:.3f}). Worst seed per arm: {worst}. "
        f"Verdict: {verdict}.",
        "",
    ]


def _objective_table(
    results: list[dict], objective: str, missing: dict | None = None, planned: int = 0
) -> list[str]:
    groups = {k: v for k, v in by_arm(results).items() if k[0] == objective}
    if not groups:
        return []
    runs0 = next(iter(groups.values()))
    far, tag = _far(results)
    probes = _probes_of([r for runs in groups.values() for r in runs])
    columns = ["arm", "seeds", "lr", "params (position)", "test loss"]
    columns += ["bpb"] if objective == "clm" else []
    length = runs0[0]["identity"]["train_config"]["seq_len"]
    columns += [
        f"{far} read at 0-{length - 1}",
        f"{far} shifted",
        f"{far} long context",
    ]
    columns += [t.replace("_", " ") for t in probes]
    title, note = OBJECTIVE_HEADINGS[objective]
    lines = [
        f"## {title}",
        "",
        f"Each cell: mean [95% t interval] over the seeds; {note}. The three far columns score "
        f"the same targets (bytes {far} of the long windows, training length {length}): read "
        f"alone at positions 0-{length - 1} as in training; read alone at their own positions "
        "(only the positions change); read inside the whole long window (the positions and all "
        "the context). Probes: accuracy over every held-out example and fine-tune seed.",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for (_, arm), runs in groups.items():
        params = runs[0]["metrics"]["parameters"]
        seeds = ", ".join(str(r["seed"]) for r in runs)
        if missing and (objective, arm) in missing:
            seeds += f" ({len(runs)} of {planned} runs)"
        cells = [
            _arm_label(arm),
            seeds,
            _rate(runs[0]["learning_rate"]),
            f"{params['total']:,} ({params['position_embeddings']:,})",
            _cell(runs, "val_loss"),
        ]
        cells += [_cell(runs, "bpb")] if objective == "clm" else []
        cells += [_cell(runs, f"{kind}@{tag}") for kind in ("near", "shift", "long")]
        cells += [_cell(runs, t) for t in probes]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _position_context_table(results: list[dict], objective: str) -> list[str]:
    groups = {k: v for k, v in by_arm(results).items() if k[0] == objective}
    if not groups:
        return []
    first = next(iter(groups.values()))[0]
    tags = sorted(
        {k.split("@")[1] for k in first["evaluation"] if k.startswith("shift@")},
        key=lambda t: int(t[:-1]),
    )
    length = first["identity"]["train_config"]["seq_len"]
    starts = [int(t[:-1]) * length for t in tags]
    columns = ["arm"]
    columns += [f"shift to {s}" for s in starts]
    columns += [f"long context at {s}" for s in starts]
    lines = [
        f"### {OBJECTIVE_HEADINGS[objective][0]}: position or context",
        "",
        "Mean [95% interval] over seeds, nats. *shift to s*: the loss of a block of "
        f"{length} targets read alone at positions s.. minus the same block at 0..{length - 1} "
        "(the same tokens and context: what the positions alone cost). *long context at s*: the "
        "same targets inside the long window minus read alone at s.. (the same positions: what "
        "the extra context adds, negative, or costs, positive).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for (_, arm), runs in groups.items():
        cells = [_arm_label(arm)]
        cells += [_cell(runs, f"shift_cost@{t}") for t in tags]
        cells += [_cell(runs, f"context_gain@{t}") for t in tags]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _verdict_row(v) -> list[str]:
    digits = METRICS[v.claim.metric].digits
    lo, hi = v.ci
    sign = "+" if not isinstance(v.claim, Bound) else ""
    return [
        f"{v.estimate:{sign}.{digits}f} [{lo:{sign}.{digits}f}, {hi:{sign}.{digits}f}]",
        _p(v.p_value),
        _p(v.p_holm),
        "n/a" if v.eval_se is None else f"{v.eval_se:.{max(digits, 3)}f}",
        f"**{v.verdict}**" if v.called else v.verdict,
    ]


def _p(p: float) -> str:
    return "< 1e-4" if p < 1e-4 else f"{p:.2g}"


def _ablation_section(verdicts: dict) -> list[str]:
    rows = []
    for ablation in ABLATIONS:
        for objective in OBJECTIVES:
            for name in ablation.metrics:
                claim = Difference(objective, ablation.name, ablation.encoding, name)
                if claim in verdicts:
                    rows.append(
                        f"| {objective} | {ablation.name} | {ablation.encoding} | "
                        f"{METRICS[name].label} | "
                        + " | ".join(_verdict_row(verdicts[claim]))
                        + " |"
                    )
    if not rows:
        return []
    return [
        "## Ablations: each against its own encoding, seed by seed",
        "",
        "Paired difference (ablation - encoding): mean [95% t interval] over seeds, the paired "
        "t-test's p, Holm's adjusted p over the whole family of claims, the test text's own "
        "standard error of the difference (bootstrap), and the verdict (rule in *Every claim*).",
        "",
        "| objective | ablation | against | metric | difference | p | Holm p | text s.e. | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _learned_section(results: list[dict]) -> list[str]:
    lines = []
    for (objective, arm), runs in by_arm(results).items():
        names = sorted(
            {n for r in runs for layer in r.get("learned_values", {}).values() for n in layer}
        )
        for name in names:
            layers = sorted(runs[0]["learned_values"])
            for layer in layers:
                per_head = list(zip(*(r["learned_values"][layer][name] for r in runs), strict=True))
                heads = "; ".join(
                    f"{statistics.fmean(v):.3g} [{min(v):.3g}, {max(v):.3g}]" for v in per_head
                )
                reach = runs[0].get("reachable_values", {}).get(layer, {}).get(name)
                reach_text = (
                    "not computed" if reach is None else f"{reach[0]:.2g} to {reach[1]:.3g}"
                )
                lines.append(f"| {objective} | {arm} | {name} | {layer} | {heads} | {reach_text} |")
    if not lines:
        return []
    return [
        "## Learned values at the end of training",
        "",
        "Per head: the mean over seeds [smallest, largest]. RSE's penalty lambda starts at 0.01 "
        "and the stick bias at -3; *reachable*: how far the optimiser could have moved them in "
        "the run (each stored parameter moved by at most the sum of the learning rates, "
        "`course_lib.encodings.rse.RSEAttention.reachable_values`), so a learned value inside "
        "that range is a choice of the training, not a limit of the parametrisation (*not "
        "computed*: the encoding does not report that range).",
        "",
        "| objective | arm | value | layer | per head | reachable |",
        "|---|---|---|---|---|---|",
        *lines,
        "",
    ]


def idle_probe_effect(results: list[dict], verdicts: dict, waiting: tuple = ()) -> list[str]:
    """A paragraph on the probes left out as uninformative: which verdicts would differ if their
    claims were kept in the family (the rule was written after the runs were seen)."""
    idle = uninformative_probes(results)
    if not idle:
        return []
    left_out = [
        c
        for c in report_claims(results, drop_idle_probes=False)
        if (c.objective, c.metric) in idle and c not in waiting
    ]
    wider = judge(results, [*verdicts, *left_out])
    changed = [
        f"{claim.describe()}: {wider[claim].verdict} instead of {verdict.verdict}"
        for claim, verdict in verdicts.items()
        if claim in wider and wider[claim].verdict != verdict.verdict
    ]
    probes = ", ".join(f"{task.replace('_', ' ')} ({objective})" for objective, task in idle)
    return [
        f"Left out after the runs were seen: the claims on {probes}, a probe no arm cleared "
        f"(the reason is listed above). With them kept in the family ({len(wider)} claims "
        f"instead of {len(verdicts)}), "
        + (
            "every verdict below would be the same."
            if not changed
            else f"these verdicts would differ: {'; '.join(changed)}."
        ),
        "",
    ]


def _claims_section(
    verdicts: dict, untested: list | None = None, idle_effect: list[str] | None = None
) -> list[str]:
    rows = []
    for claim, v in verdicts.items():
        kind = type(claim).__name__.lower()
        rows.append(f"| {kind} | {claim.describe()} | " + " | ".join(_verdict_row(v)) + " |")
    summary = spread_of_called(verdicts)
    reasons: dict[str, list[str]] = {}
    for claim, why in untested or []:
        reasons.setdefault(why, []).append(claim.describe())
    left_out = [f"{why}: " + "; ".join(claims) for why, claims in reasons.items()]
    count = sum(len(claims) for claims in reasons.values())
    untested_line = (
        [f"Declared but not tested ({count}): " + ". ".join(left_out) + ".", ""] if left_out else []
    )
    return [
        "## Every claim",
        "",
        f"The family: {summary['claims']} claims (`course_lib.compare.claims`: the ablations "
        "against their encodings, and the questions notebook 10 asks, declared before the "
        "committed run), tested together. *difference*: arm a - arm b, seed by seed (paired "
        "t-test, two-sided); *change*: a within-run difference against 0 (two-sided); *bound*: "
        "the arm's mean beyond a stated value (one-sided). A claim is called when Holm's "
        f"adjusted p is below {ALPHA}, the estimate is at least the minimum effect "
        f"({MIN_EFFECT['loss']} nats for a loss, {MIN_EFFECT['accuracy']} for an accuracy; a "
        "bound's margin is its value) and the test text's own standard error is below a quarter "
        f"of it; else *within noise* (*not shown* for a bound). {summary['called']} of "
        f"{summary['claims']} are called.",
        "",
        *untested_line,
        *(idle_effect or []),
        "| kind | claim | estimate [95% interval] | p | Holm p | text s.e. | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _cost_section(results: list[dict], folder: str | Path | None) -> list[str]:
    timing = load_timing(folder) if folder is not None else None
    params = {(r["objective"], r["arm"]): r["metrics"]["parameters"] for r in results}
    lines = [
        "## Cost",
        "",
    ]
    if timing is None:
        lines += [
            "No timing pass in this folder (`python -m course_lib.compare --timing`): speeds "
            "measured during the runs are in each results file "
            "(`metrics.tokens_per_second_during_run`), taken while other runs shared the "
            "machine.",
            "",
        ]
        return lines
    loads = [x for row in timing["rows"] for x in row["load_average_1min"] if x is not None]
    lines += [
        f"Training speed from a separate timing pass (`timing.json`, {timing['when']}): each "
        f"arm {timing['repeats']} times {timing['steps']} training steps, back to back in one "
        f"process with {timing['hardware']['torch_threads']} torch thread(s) on "
        f"{hardware_label(timing['hardware'])}; median of the repeats, by the wall clock and by "
        "the process's CPU time. The machine's 1-minute load average during the pass: "
        f"{min(loads):.1f} to {max(loads):.1f}"
        + (
            " (other work shared it: the wall-clock speeds are lower than on an idle machine; "
            "the CPU-time speeds less so)."
            if max(loads) > 1.5
            else "."
        ),
        "",
        "| objective | arm | parameters | in position tables | tokens/s (wall) | tokens/s (CPU time) |",
        "|---|---|---|---|---|---|",
    ]
    for row in timing["rows"]:
        p = params.get((row["objective"], row["arm"]))
        if p is None:
            continue
        lines.append(
            f"| {row['objective']} | {row['arm']} | {p['total']:,} | "
            f"{p['position_embeddings']:,} | {row['tokens_per_second']:,.0f} | "
            f"{row['tokens_per_cpu_second']:,.0f} |"
        )
    return lines + [""]


SEEDS_NOT_RUN = "seeds not run yet"


def missing_seeds(
    results: list[dict], planned_seeds: Sequence[int]
) -> dict[tuple[str, str], tuple[int, ...]]:
    """``{(objective, arm): seeds of planned_seeds with no run}`` for each (objective, arm) of
    ``results`` that misses some (a comparison made in slices, not finished yet)."""
    missing = {}
    for key, runs in by_arm(results).items():
        made = {r["seed"] for r in runs}
        if left := tuple(s for s in planned_seeds if s not in made):
            missing[key] = left
    return missing


def summary_markdown(
    results: list[dict],
    *,
    sweeps: list[dict] | None = None,
    folder: str | Path | None = None,
    planned_seeds: Sequence[int] | None = None,
) -> str:
    """The comparison's report: what made it, the text, the learning rates, the plateau, one
    table per objective, position against context, the ablations, the learned values, every
    claim of the family with its test, and the cost (``folder``: where the timing pass and the
    sittings' log are).

    ``planned_seeds`` (the preset's seeds) labels an unfinished comparison: an arm with fewer
    runs reads "k of n runs", and a declared claim about such an arm is not tested but listed
    with the reason "seeds not run yet" (the others are tested, Holm's correction over them).
    When every arm has every planned seed the report is the same as without it."""
    first = results[0]
    missing = {} if planned_seeds is None else missing_seeds(results, planned_seeds)
    planned = 0 if planned_seeds is None else len(planned_seeds)
    waiting: tuple = ()
    if missing:
        family = report_claims(results)
        waiting = tuple(c for c in family if any((c.objective, a) in missing for a in _arms_of(c)))
        verdicts = judge(results, [c for c in family if c not in waiting])
    else:
        verdicts = judge(results)
    probes = {}
    for r in results:
        for task, probe in r["probes"].items():
            probes[task] = probe
    probe_text = " ".join(
        f"{task.replace('_', ' ')}: {p['eval_examples']} held-out examples, "
        f"{len(p['finetune_seeds'])} fine-tune seeds, chance {p['chance']:.3f}"
        + (
            f" (a position-blind guess of the most frequent context symbol: "
            f"{p['bag_of_symbols_baseline']:.3f})"
            if "bag_of_symbols_baseline" in p
            else ""
        )
        + f"; standard errors over {p['standard_error_over']}."
        for task, p in probes.items()
    )
    lines = [
        f"# Encoding comparison: {first['preset']} preset",
        "",
        describe_runs(results, folder),
        "",
        *(_unfinished_lines(results, missing, planned, len(waiting)) if missing else []),
        f'Loss: nats per byte token on held-out text. "n/a" past the learned table: it has no '
        f"rows there. Probes (a short seeded fine-tune of a copy of each model; candidates in a "
        f"random order, a tie counts as wrong): {probe_text}",
        "",
        *_data_section(results, verdicts),
        *_sweep_section(results, sweeps or []),
        *_plateau_section(results),
    ]
    for objective in OBJECTIVES:
        lines += _objective_table(results, objective, missing, planned)
    lines += ["## Past the training length: position or context", ""]
    for objective in OBJECTIVES:
        lines += _position_context_table(results, objective)
    lines += _ablation_section(verdicts)
    lines += _learned_section(results)
    lines += _claims_section(
        verdicts,
        [*untested_questions(results), *((c, SEEDS_NOT_RUN) for c in waiting)],
        idle_probe_effect(results, verdicts, waiting),
    )
    lines += _cost_section(results, folder)
    return "\n".join(lines).rstrip() + "\n"


def _unfinished_lines(results: list[dict], missing: dict, planned: int, waiting: int) -> list[str]:
    """The paragraph that says a report is of an unfinished comparison."""
    groups = by_arm(results)
    made = sum(len(runs) for runs in groups.values())
    short = "; ".join(
        f"{objective} {arm}: {len(groups[objective, arm])} of {planned} runs"
        for objective, arm in missing
    )
    return [
        f"**Unfinished**: {made} of {planned * len(groups)} runs of the arms run so far "
        f"({short}; the others have all {planned}). "
        + (
            f"{waiting} declared claim{'s' if waiting != 1 else ''} about an arm with seeds "
            f"missing {'are' if waiting != 1 else 'is'} not tested yet ({SEEDS_NOT_RUN}); the "
            "family tested below is the rest, so its verdicts may change when the runs are "
            "finished."
            if waiting
            else "Every declared claim's arms have all their seeds."
        ),
        "",
    ]


def headline_markdown(results: list[dict]) -> str:
    """README's headline: per objective, each encoding's chosen learning rate, test loss, the
    far targets with a position shift only and with a long context, and the probes (mean [95%
    interval] over seeds); generated, never typed."""
    seeds = sorted({r["seed"] for r in results})
    far, tag = _far(results)
    stuck = plateau_arms(results)
    lines = [
        f"{first_line(results)} Mean [95% t interval] over seeds {', '.join(map(str, seeds))}; "
        f"*{far} shifted*: the targets at {far} read with the training length's context, only "
        f"their positions moved; *{far} long*: the same targets inside {results[0]['data']['long_window_length']}-byte "
        "windows (positions and context). Verdicts, ablations and figures in "
        f"`figures/compare_{results[0]['preset']}/summary.md` (the preset's default folder).",
        "",
    ]
    for objective in OBJECTIVES:
        groups = {k: v for k, v in by_arm(results).items() if k[0] == objective and "." not in k[1]}
        if not groups:
            continue
        probes = _probes_of([r for runs in groups.values() for r in runs])
        title, _ = OBJECTIVE_HEADINGS[objective]
        header = ["encoding", "lr", "test loss", f"{far} shifted", f"{far} long"]
        header += [t.replace("_", " ") for t in probes]
        lines += [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for (_, arm), runs in groups.items():
            label = arm + (" (plateau)" if objective == "mlm" and arm in stuck else "")
            cells = [label, _rate(runs[0]["learning_rate"]), _cell(runs, "val_loss")]
            cells += [_cell(runs, f"shift@{tag}"), _cell(runs, f"long@{tag}")]
            cells += [_cell(runs, t) for t in probes]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


README_SECTION = "comparison headline"


def update_readme_headline(results: list[dict], readme: str | Path | None = None) -> Path:
    """Replace README's generated section :data:`README_SECTION` by :func:`headline_markdown`
    of ``results``; returns the README's path."""
    path = Path(readme) if readme is not None else REPO_ROOT / "README.md"
    replace_section(README_SECTION, headline_markdown(results), path)
    return path


def first_line(results: list[dict]) -> str:
    first = results[0]
    return f"The `{first['preset']}` preset: {preset_description(results)}."
