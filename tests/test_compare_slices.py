"""The comparison made in slices (``--budget-minutes``): the order of the runs, a run cut by the
budget resumed from its checkpoint, and the report of an unfinished comparison.

A fake clock (``time.monotonic`` advancing one "second" per reading) makes the slices the same
on every machine: the training reads the clock once per step, so a budget of ``k`` seconds is
about ``k`` training steps."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from course_lib.compare import runner as compare_runner
from course_lib.compare.cli import main
from course_lib.compare.presets import PRESETS
from course_lib.compare.runner import comparison_plan, minutes_left, run_comparison

TINY = PRESETS["tiny"]
_PROBE = TINY.probes[0]  # word order
SLICE = replace(
    TINY,
    train=replace(
        TINY.train, steps=20, warmup_steps=2, eval_every=10, checkpoint_every=10, eval_windows=8
    ),
    probes=(
        replace(
            _PROBE,
            train_examples=64,
            eval_examples=64,
            finetune=replace(_PROBE.finetune, steps=10, warmup_steps=1),
        ),
    ),
    encodings=("none", "rope"),
    seeds=(0, 1),
    learning_rates=(1e-3, 3e-3),
    sweep_seeds=(1000, 1001),
    eval_windows=16,
    long_windows=2,
)
# what differs between two makings of the same run: the clock, the machine's load and memory,
# how many sittings the training took
TIMING_KEYS = {
    "train_seconds",
    "train_cpu_seconds",
    "wall_seconds_this_segment",
    "cpu_seconds_this_segment",
    "cpu_load_average_1min",
    "tokens_per_second_during_run",
    "evaluation_seconds",
    "probe_seconds",
    "training_segments",
    "training_processes",
    "peak_memory",
}


def _without_timing(path: Path) -> dict:
    result = json.loads(path.read_text(encoding="utf-8"))
    result["metrics"] = {k: v for k, v in result["metrics"].items() if k not in TIMING_KEYS}
    return result


def _files(folder: Path) -> dict[str, dict]:
    paths = [*folder.glob("*.json"), *(folder / "sweep").glob("*.json")]
    return {
        str(p.relative_to(folder)): _without_timing(p)
        for p in paths
        if p.name not in ("sessions.json", "timing.json")
    }


def test_the_plan_goes_sweep_seed_by_sweep_seed_then_seed_by_seed():
    sweep, runs = comparison_plan(SLICE)
    assert [s[3] for s in sweep] == [1000] * 8 + [1001] * 8
    assert [s[0] for s in sweep[:8]] == ["clm"] * 4 + ["mlm"] * 4  # causal first: cheaper
    assert sweep[:4] == [
        ("clm", "none", 1e-3, 1000), ("clm", "none", 3e-3, 1000),
        ("clm", "rope", 1e-3, 1000), ("clm", "rope", 3e-3, 1000),
    ]  # fmt: skip
    assert SLICE.objectives == ("mlm", "clm")
    assert runs == [
        ("mlm", "none", 0), ("mlm", "rope", 0), ("clm", "none", 0), ("clm", "rope", 0),
        ("mlm", "none", 1), ("mlm", "rope", 1), ("clm", "none", 1), ("clm", "rope", 1),
    ]  # fmt: skip


def test_minutes_left_from_the_runs_so_far_or_the_timing_pass():
    sweep, runs = comparison_plan(SLICE)
    assert minutes_left(SLICE, sweep, runs, {"sweep": [], "runs": []}) is None
    # 24 runs left, at the sweep's mean of 30 s each: 12 minutes
    assert minutes_left(SLICE, sweep, runs, {"sweep": [20.0, 40.0], "runs": []}) == 12
    assert minutes_left(SLICE, [], runs, {"sweep": [30.0], "runs": [60.0]}) == 8
    config = SLICE.train_config("clm")
    tokens = config.steps * config.batch_size * config.seq_len
    timing = {(o, a): tokens / 6.0 for o in ("clm", "mlm") for a in ("none", "rope")}
    assert minutes_left(SLICE, [], runs, {}, timing) == pytest.approx(8 * 6 / 60)


def test_slices_reach_the_same_files_as_one_call(tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    results = run_comparison(SLICE, out_dir=whole, progress=False, figures=False)
    assert len(results) == 8

    sliced = tmp_path / "sliced"
    ticks = itertools.count()
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))
    calls, report_checked = 0, False
    while True:
        calls += 1
        assert calls < 40, "the slices do not finish"
        results = run_comparison(
            SLICE, out_dir=sliced, progress=False, figures=False, budget_seconds=40
        )
        if len(results) == 8:
            break
        if any(sliced.glob("*.json")) and not report_checked:  # some runs of seed 0 made
            compare_runner.write_report(sliced, SLICE)  # --report: figures and summary.md
            text = (sliced / "summary.md").read_text(encoding="utf-8")
            assert "**Unfinished**" in text and " of 2 runs)" in text
            report_checked = True
    monkeypatch.undo()
    assert calls > 8  # 480 training steps in slices of about 40
    assert report_checked
    assert _files(sliced) == _files(whole)
    segments = [
        json.loads(p.read_text())["metrics"]["training_segments"] for p in sliced.glob("*.json")
    ]
    assert max(segments) > 1  # some run was cut by the budget and resumed from its checkpoint


def test_budget_minutes_on_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(PRESETS, "tiny", SLICE)
    out = tmp_path / "cli"
    args = ["--preset", "tiny", "--out", str(out), "--no-progress", "--no-figures"]
    assert main([*args, "--budget-minutes", "0.0001"]) == 0
    printed = capsys.readouterr().out
    assert "sweep: 0 of 16 runs; comparison: 0 of 8 runs" in printed
    assert "run the comparison again to go on" in printed
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--budget-minutes" in capsys.readouterr().out
