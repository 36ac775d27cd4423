"""A comparison read back: the runs saved in a folder that a preset would make now
(:func:`preset_results`), and the report drawn from them (:func:`write_report`: the figures of
:mod:`course_lib.compare.figures` and ``summary.md``)."""

from __future__ import annotations

import math
from pathlib import Path

from course_lib.compare.files import ComparisonFileError, no_runs_message
from course_lib.compare.presets import Preset, choose_preset
from course_lib.compare.results import LOG_FILES, load_results, summary_markdown
from course_lib.compare.sweep import chosen_learning_rates, sweep_results

__all__ = ["preset_results", "write_report"]


def write_report(out_dir: str | Path, preset: Preset | str) -> list[Path]:
    """Draw the figures and write ``summary.md`` in ``out_dir`` from every run of ``preset``
    saved there (:func:`preset_results`, with the sweep, the timing pass and the log of the
    sittings when present); returns the files written."""
    from course_lib.compare.figures import write_figures

    preset = choose_preset(preset) if isinstance(preset, str) else preset
    out_dir = Path(out_dir)
    files = [path for path in out_dir.glob("*.json") if path.name not in LOG_FILES]
    try:
        saved = preset_results(out_dir, preset) if files else []
    except FileNotFoundError:  # results files, but none of this format
        saved = []
    if not saved:
        raise ComparisonFileError(no_runs_message(out_dir, preset.name, len(files)))
    written = write_figures(saved, out_dir)
    summary = out_dir / "summary.md"
    summary.write_text(
        summary_markdown(
            saved,
            sweeps=sweep_results(out_dir, preset),
            folder=out_dir,
            planned_seeds=preset.seeds,
        ),
        encoding="utf-8",
    )
    return [*written, summary]


def preset_results(out_dir: str | Path, preset: Preset | str) -> list[dict]:
    """The runs saved in ``out_dir`` (:func:`~course_lib.compare.results.load_results` order)
    that ``preset`` would make with its current configuration: the same identity (model,
    budgets, learning rate chosen by the saved sweep, probes, evaluation); results of any other
    configuration are left out."""
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    saved = load_results(out_dir)
    sweeps = sweep_results(out_dir, preset)
    rates: dict[tuple[str, str], float | None] = {}
    for pair in {(r["objective"], r["encoding"]) for r in saved}:
        try:
            rates[pair] = chosen_learning_rates(out_dir, preset, [pair], sweeps=sweeps)[pair]
        except FileNotFoundError:  # no complete sweep: no run of this pair is the preset's
            rates[pair] = math.nan
    kept = []
    for r in saved:
        rate = rates[r["objective"], r["encoding"]]
        if not math.isnan(rate) and r.get("identity") == preset.identity(
            r["arm"], r["objective"], r["seed"], rate
        ):
            kept.append(r)
    return kept
