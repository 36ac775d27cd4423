"""The comparison, stage by stage (:func:`run_comparison`): the learning-rate sweep
(:mod:`course_lib.compare.sweep`), then every (arm, objective, seed) run
(:mod:`course_lib.compare.training_run`, each scored by :mod:`course_lib.compare.evaluation`),
in the order of :func:`course_lib.compare.plan.comparison_plan` (``budget_seconds``: as many
as fit, resumed by the next call), then the report (:mod:`course_lib.compare.report`: the
figures and ``summary.md``). A timing pass (:mod:`course_lib.compare.timing`) measures speed on
its own. What the stages share (the text, the results files, the checks) is in
:mod:`course_lib.compare.common`. An interrupted comparison resumes where it stopped, mid-run
too; a finished run is skipped unless ``force=True``.

It takes ``processes`` (:class:`course_lib.distributed.Processes`, from ``torchrun``; None by
default: one process, no process group). In ``"data"`` mode every run is trained by all the
processes together and rank 0 alone evaluates and writes; in ``"runs"`` mode each process takes
the next whole run whenever it is free. :mod:`course_lib.distributed` describes both.

The names of the stages' modules are importable from here too (``run_one``,
``run_sweep_one``, ``chosen_learning_rates``, ``sweep_results``, ``timing_pass``,
``preset_results``, ``write_report``, ``hardware_description``, ``retrieval_bag_baseline``).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from course_lib.compare.arms import get_arm
from course_lib.compare.common import (
    ComparisonText,
    check_objective,
    check_seed,
    hardware_description,
    write_result,
)
from course_lib.compare.evaluation import retrieval_bag_baseline
from course_lib.compare.plan import comparison_plan, minutes_left, run_cost, timing_speeds
from course_lib.compare.presets import Preset, choose_preset
from course_lib.compare.report import preset_results, write_report
from course_lib.compare.results import default_out_dir, run_name, sweep_name
from course_lib.compare.sweep import chosen_learning_rates, run_sweep_one, sweep_results
from course_lib.compare.timing import timing_pass
from course_lib.compare.training_run import run_one
from course_lib.distributed import Processes

__all__ = [
    "chosen_learning_rates",
    "comparison_plan",
    "hardware_description",
    "minutes_left",
    "preset_results",
    "retrieval_bag_baseline",
    "run_comparison",
    "run_one",
    "run_sweep_one",
    "sweep_results",
    "timing_pass",
    "write_report",
]

_CALLS = {"n": 0}  # run_comparison calls so far in this process (keys of the shared counters)


def _mine(processes: Processes | None, items: list, stage: str) -> Iterator:
    """The items this process makes: all of them (one process, or ``"data"`` mode, where every
    process takes part in each), or in ``"runs"`` mode the next one whenever it is free
    (:meth:`~course_lib.distributed.Processes.next_index`)."""
    if processes is None or processes.mode == "data":
        yield from items
        return
    key = f"{stage}-{_CALLS['n']}"
    while (index := processes.next_index(key)) < len(items):
        yield items[index]


def _gather(processes: Processes | None, mine: list[dict]) -> list[dict]:
    """``"runs"`` mode: wait for every process (a barrier that names a rank that does not
    arrive within the timeout) and return every process's results; else ``mine``."""
    if processes is None or processes.mode == "data":
        return mine
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=processes.timeout_seconds)
    dist.monitored_barrier(group=processes.objects, timeout=timeout, wait_all_ranks=True)
    return [r for part in processes.all_gather(mine) for r in part]


def run_comparison(
    preset: Preset | str = "auto",
    *,
    encodings: Sequence[str] | None = None,
    ablations: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    objectives: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    figures: bool = True,
    threads: int | None = None,
    stop_after_steps: int | None = None,
    processes: Processes | None = None,
    budget_seconds: float | None = None,
) -> list[dict]:
    """Every (seed, objective, arm) run of ``preset``; returns the results of the finished ones.

    The arms are ``encodings`` (default: the preset's, i.e. every registered sequence encoding
    unless the preset names some) and then ``ablations`` (default: the preset's; names from
    :data:`course_lib.compare.arms.ABLATIONS`), each checked before anything runs; ``seeds``
    default to the preset's. A preset with a learning-rate grid first sweeps the encodings of
    these arms (:func:`run_sweep_one`, every rate; finished sweep runs are read back), then
    trains every run at its encoding's chosen rate. Runs go seed by seed (so an interrupted
    comparison has whole seeds), then objective by objective, arm by arm; a causal-only
    encoding has no masked-LM run. Finished runs are read back, unfinished ones resumed.
    Afterwards, if all requested runs finished and ``figures``, draws the figures and
    ``summary.md`` into ``out_dir`` (default ``figures/compare_<preset>/``) from every run of
    this preset saved there (:func:`preset_results`), so running one more arm or seed into a
    folder adds it to the report instead of replacing it. ``threads`` overrides the preset's
    CPU thread count.

    ``budget_seconds`` (one process only) makes one slice of the comparison: the runs go in the
    order of :func:`comparison_plan` (the sweep seed by seed, then the scored runs seed by seed)
    until the budget is spent; no run starts after it, and a run whose training is still going
    then stops at a checkpoint (written there) and resumes from it at the next call, which goes
    on where this one stopped. A run whose training finished in time is evaluated and saved
    whole. The progress bars show an estimate of the minutes left (:func:`minutes_left`).

    With ``processes`` (every process of a ``torchrun`` launch calls this with the same
    arguments): in ``"data"`` mode the runs go in the same order, each trained by all processes
    together (:func:`run_one`); in ``"runs"`` mode each process takes the next run of the list
    whenever it is free (each made exactly as one process would), the processes wait for each
    other after the sweep and at the end, and rank 0 writes any results file it does not see
    (machines without a shared folder). Only rank 0 draws the figures; every rank returns the
    results of all finished runs, in the list's order.
    """
    preset = choose_preset(preset) if isinstance(preset, str) else preset
    arms = (
        *(encodings if encodings is not None else preset.encoding_names()),
        *(ablations if ablations is not None else preset.ablations),
    )
    seeds = tuple(seeds if seeds is not None else preset.seeds)
    objectives = tuple(objectives or preset.objectives)
    specs = {arm: get_arm(arm) for arm in arms}  # resolved once; a ValueError lists the valid ones
    if not arms or not seeds:
        raise ValueError("a comparison needs at least one arm and one seed")
    for seed in seeds:
        check_seed(seed)
    for objective in objectives:
        check_objective(objective)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(preset.name)
    _CALLS["n"] += 1
    if processes is not None and processes.mode == "data":
        for objective in objectives:
            batch = preset.train_config(objective).batch_size
            if batch % processes.world_size:
                raise ValueError(
                    f"preset {preset.name!r} trains {objective} on batches of {batch} rows, which "
                    f"{processes.world_size} processes cannot share evenly: start a number of "
                    f"processes that divides {batch}, or use --parallel runs"
                )

    if budget_seconds is not None and processes is not None:
        raise ValueError("a time budget slices the runs of one process; not under torchrun")
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    sweep, runs = comparison_plan(preset, arms, seeds, objectives)
    pairs = list(dict.fromkeys((o, specs[a].encoding) for o, a, _ in runs))
    main = processes is None or processes.is_main
    runs_mode = processes is not None and processes.mode == "runs"
    show = progress and (main or runs_mode)
    rank_note = f" (rank {processes.rank})" if runs_mode else ""
    data: ComparisonText | None = None

    def needs_data(path: Path) -> ComparisonText | None:
        nonlocal data
        if data is None and (force or not path.exists()):
            data = ComparisonText(preset)
        return data

    from tqdm.auto import tqdm

    common = dict(
        out_dir=out_dir, checkpoint_dir=checkpoint_dir, force=force, progress=show,
        stop_after_steps=stop_after_steps, threads=threads, processes=processes,
        deadline=deadline,
    )  # fmt: skip
    costs: dict[str, list[float]] = {"sweep": [], "runs": []}
    timing = timing_speeds(out_dir)

    def left(done_sweep: int, done_runs: int) -> str:
        minutes = minutes_left(preset, sweep[done_sweep:], runs[done_runs:], costs, timing)
        return "?" if minutes is None else f"~{minutes:.0f} min"

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    swept: list[dict] = []
    if sweep:
        bar = tqdm(total=len(sweep), desc=f"{preset.name} sweep{rank_note}", disable=not show)
        try:
            for i, (objective, encoding, rate, seed) in enumerate(_mine(processes, sweep, "sweep")):
                if out_of_time():
                    break
                name = sweep_name(objective, encoding, rate, seed)
                bar.set_postfix(run=name, left=left(i, 0), refresh=True)
                result = run_sweep_one(
                    encoding, objective, rate, preset, seed=seed,
                    data=needs_data(out_dir / "sweep" / f"{name}.json"), **common,
                )  # fmt: skip
                if result is not None:
                    swept.append(result)
                    costs["sweep"].append(run_cost(result))
                elif deadline is not None:
                    break  # out of time: the next call resumes this run from its checkpoint
                bar.update(1)
        finally:
            bar.close()
        swept = _gather(processes, swept)
        if runs_mode and processes.is_main:
            for result in swept:
                path = out_dir / "sweep" / f"{result['run']}.json"
                if not path.exists():
                    write_result(path, result)
        if len(swept) < len(sweep):
            return []  # stopped early (stop_after_steps): the runs need every sweep run
    rates = chosen_learning_rates(out_dir, preset, pairs, sweeps=swept)
    results: list[dict] = []
    bar = tqdm(total=len(runs), desc=f"{preset.name} comparison{rank_note}", disable=not show)
    try:
        for i, (objective, arm, seed) in enumerate(_mine(processes, runs, "runs")):
            if out_of_time():
                break
            name = run_name(objective, arm, seed)
            bar.set_postfix(run=name, left=left(len(sweep), i), refresh=True)
            result = run_one(
                specs[arm], objective, preset, seed=seed,
                learning_rate=rates[objective, specs[arm].encoding],
                data=needs_data(out_dir / f"{name}.json"), **common,
            )  # fmt: skip
            if result is not None:
                results.append(result)
                costs["runs"].append(run_cost(result))
            elif deadline is not None:
                break  # out of time: the next call resumes this run from its checkpoint
            bar.update(1)
    finally:
        bar.close()
    if runs_mode:
        finished = {r["run"]: r for r in _gather(processes, results)}
        results = [finished[run_name(*run)] for run in runs if run_name(*run) in finished]
        if processes.is_main:
            for result in results:
                path = out_dir / f"{result['run']}.json"
                if not path.exists():
                    write_result(path, result)
    if main and figures and results and len(results) == len(runs):
        write_report(out_dir, preset)
    return results
