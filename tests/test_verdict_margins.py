"""The margin script (course_lib.teaching.verdict_margins) and the margins notebook 05 keeps."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from course_lib.teaching import rse_window, stick_checks
from course_lib.teaching import verdict_margins as vm

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "figures" / "05_verdict_margins.json"


def _setting(values, capability="DEFAULT", threads=1):
    return {"capability": capability, "threads": threads, "values": values}


def test_spreads_are_per_seed_differences_over_the_settings():
    settings = [
        _setting({"0": {"x": 1.0, "lam": 1e-3}, "1": {"x": 5.0, "lam": 1.0}}),
        _setting({"0": {"x": 1.5, "lam": 1e-2}, "1": {"x": 5.1, "lam": 2.0}}, "AVX2"),
        _setting({"1": {"lam": 4.0}}, "AVX512"),  # a partial setting counts where it has values
    ]
    out = vm.spreads(settings)
    assert out["x"]["spread_per_seed"] == pytest.approx({"0": 0.5, "1": 0.1})
    assert out["x"]["spread"] == pytest.approx(0.5)
    assert (out["x"]["min"], out["x"]["max"]) == (1.0, 5.1)
    assert out["lam"]["log10_spread_per_seed"] == pytest.approx({"0": 1.0, "1": math.log10(4)})
    assert out["lam"]["log10_spread"] == pytest.approx(1.0)


def test_no_log_spread_for_a_quantity_that_reaches_zero():
    out = vm.spreads([_setting({"0": {"x": 0.0}}), _setting({"0": {"x": 1.0}})])
    assert "log10_spread" not in out["x"] and out["x"]["spread"] == 1.0


def test_margin_is_the_nearest_value_in_spreads():
    assert vm.margin_in_spreads([0.5, 0.95], 0.9, spread=0.01, log=False) == pytest.approx(5.0)
    assert vm.margin_in_spreads([1e-5, 1e-4], 1e-3, spread=0.5, log=True) == pytest.approx(2.0)
    assert vm.margin_in_spreads([1.0], 2.0, spread=0.0, log=False) == math.inf
    # a number that moves in steps: a spread below one step counts as one
    assert vm.margin_in_spreads([250.0], -25.0, spread=0.0, log=False, resolution=50) == 5.5
    assert vm.margin_in_spreads([0.95], 0.9, 0.01, False, resolution=0.002) == pytest.approx(5.0)


def test_verdict_margins_of_known_numbers():
    settings = [
        _setting({"0": {"x": 1.0, "lam": 1e-3}, "1": {"x": 5.0, "lam": 1.0}}),
        _setting({"0": {"x": 1.2, "lam": 1e-2}, "1": {"x": 5.0, "lam": 1.0}}, "AVX2"),
        _setting({"0": {"x": 9.0}}, "AVX512"),  # lacks seed 1: left out of every verdict
    ]
    verdicts = [
        vm.Verdict("seed 0 above 0.5", lambda v: v["0"]["x"], 0.5, True),
        vm.Verdict("mean below 4", lambda v: (v["0"]["x"] + v["1"]["x"]) / 2, 4.0, False),
        vm.Verdict("lam below 1", lambda v: v["0"]["lam"], 1.0, False, log=True),
        vm.Verdict("seed 1 above 4.5", lambda v: v["1"]["x"], 4.5, True, resolution=0.25),
        vm.Verdict("seed 1 above 6", lambda v: v["1"]["x"], 6.0, True),
    ]
    out = vm.verdict_margins(settings, verdicts, seeds=[0, 1])
    first, mean, lam, stepped, wrong = (out[v.label] for v in verdicts)
    assert first["values"] == [1.0, 1.2] and first["holds_everywhere"]
    assert first["spread"] == pytest.approx(0.2) and first["margin"] == pytest.approx(2.5)
    assert mean["values"] == pytest.approx([3.0, 3.1]) and mean["margin"] == pytest.approx(9.0)
    assert lam["spread"] == pytest.approx(1.0) and lam["margin"] == pytest.approx(2.0)
    assert stepped["spread"] == 0 and stepped["margin"] == pytest.approx(2.0)
    assert not wrong["holds_everywhere"]


def test_load_function_names_module_and_function():
    assert vm.load_function("math:sqrt") is math.sqrt
    with pytest.raises(ValueError, match="MODULE:FUNCTION"):
        vm.load_function("math.sqrt")


def test_the_script_runs_each_setting_in_a_process_of_its_own(tmp_path):
    (tmp_path / "toy_quantity.py").write_text(
        textwrap.dedent(
            """
            import torch

            def quantity(seed):
                torch.manual_seed(seed)
                return {"mean": float(torch.rand(1000).mean()),
                        "threads": torch.get_num_threads()}
            """
        )
    )
    out = tmp_path / "margins.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    command = [sys.executable, "-m", "course_lib.teaching.verdict_margins", "toy_quantity:quantity"]
    options = ["--out", str(out), "--seeds", "0", "1", "--capabilities", "default"]
    subprocess.run([*command, *options, "--threads", "1"], env=env, check=True, cwd=REPO)
    report = json.loads(out.read_text())
    (setting,) = report["settings"]
    # the portable kernels: "DEFAULT" (PyTorch 2.11, 2.13), "NO AVX" (PyTorch 2.8)
    assert setting["capability"] in ("DEFAULT", "NO AVX") and setting["requested"] == "default"
    assert setting["values"]["1"]["threads"] == 1
    assert report["spreads"]["mean"]["spread"] == 0.0
    # --append adds a thread count and skips what the file already holds
    again = [*command, *options, "--threads", "1", "2", "--append"]
    subprocess.run(again, env=env, check=True, cwd=REPO)
    report = json.loads(out.read_text())
    assert [s["threads"] for s in report["settings"]] == [1, 2]
    assert report["settings"][1]["values"]["0"]["threads"] == 2


# -- notebook 05: the committed measurement and the notebook's thresholds --------------------------


def _committed() -> dict:
    return json.loads(COMMITTED.read_text())


def _assert_covers_seeds_kernels_and_threads(report: dict, function: str, seeds: tuple) -> None:
    """The measurement is of ``function``, over at least 5 ``seeds``, in every kernel setting
    and thread count (or says the CPU lacked the setting)."""
    assert report["function"] == function
    assert tuple(report["seeds"]) == seeds and len(seeds) >= 5
    requested = {(s["requested"], s["threads"]) for s in report["settings"]}
    not_run = {entry["requested"] for entry in report["not_run"]}
    for capability in ("default", "avx2", "avx512"):
        for threads in (1, 2):
            assert (capability, threads) in requested or capability in not_run


def test_the_committed_measurement_covers_the_seeds_kernels_and_threads():
    report = _committed()
    _assert_covers_seeds_kernels_and_threads(
        report, "course_lib.teaching.rse_window:window_lambdas", rse_window.SEEDS
    )
    for setting in report["settings"]:
        assert set(setting["values"]) == {str(s) for s in rse_window.SEEDS}


def test_the_committed_verdicts_are_the_notebooks_and_recompute():
    report = _committed()
    again = vm.verdict_margins(report["settings"], rse_window.VERDICTS, rse_window.SEEDS)
    assert list(report["verdicts"]) == [v.label for v in rse_window.VERDICTS]
    for label, entry in again.items():
        assert report["verdicts"][label]["values"] == pytest.approx(entry["values"])
        assert report["verdicts"][label]["threshold"] == entry["threshold"]


@pytest.mark.parametrize("verdict", rse_window.VERDICTS, ids=lambda v: v.label[:30])
def test_every_threshold_keeps_three_spreads_from_every_value_seen(verdict):
    entry = vm.verdict_margins(_committed()["settings"], [verdict], rse_window.SEEDS)[verdict.label]
    assert entry["holds_everywhere"], entry
    assert entry["margin"] >= vm.MARGIN_FACTOR, entry


@pytest.mark.parametrize(
    ("name", "verdict_number"), [("accuracy", 0), ("lambda_1", 1)], ids=["accuracy", "lambda_1"]
)
def test_an_every_seed_verdict_also_keeps_three_per_seed_spreads(name, verdict_number):
    """ "In every seed" verdicts: each seed's own number, against the largest per-seed spread."""
    verdict = rse_window.VERDICTS[verdict_number]
    settings = _committed()["settings"]
    entry = vm.spreads(settings)[name]
    spread = entry["log10_spread"] if verdict.log else entry["spread"]
    seen = [x for seed in map(str, rse_window.SEEDS) for x in vm.values_of(settings, name, seed)]
    assert vm.margin_in_spreads(seen, verdict.threshold, spread, verdict.log) >= vm.MARGIN_FACTOR


def test_the_other_cpus_values_bound_the_verdicts_on_the_right_side():
    """Seeds 0-2 from an AVX-512 Xeon: the largest lambda over five seeds is at least the
    largest over three, and the ratio of the largest to the smallest at least theirs."""
    other = rse_window.OTHER_CPU["values"]
    settings = _committed()["settings"]
    for number in (2, 3):
        verdict = rse_window.VERDICTS[number]
        bound = verdict.reduce(other)
        entry = vm.verdict_margins(settings, [verdict], rse_window.SEEDS)[verdict.label]
        assert verdict.above and bound > verdict.threshold
        if number == 2:  # the same number on three seeds: it joins the spread
            spread = math.log10(max(entry["values"])) - math.log10(min(entry["values"] + [bound]))
        else:  # a ratio over three seeds is not the five seeds' ratio: only its side is known
            spread = entry["spread"]
        margin = vm.margin_in_spreads([bound], verdict.threshold, spread, log=True)
        assert margin >= vm.MARGIN_FACTOR, (verdict.label, bound, spread, margin)


def test_the_stick_row_check_accepts_the_solutions_and_names_a_reversed_stick(capsys):
    from course_lib.teaching.solutions import nb05

    assert stick_checks.check_stick_row("loop", nb05.stick_loop)
    assert stick_checks.check_stick_row("log", nb05.log_space_stick, extreme=True)
    capsys.readouterr()
    reversed_stick = lambda z: nb05.stick_loop(z.flip(0)).flip(0)  # noqa: E731
    assert not stick_checks.check_stick_row("reversed", reversed_stick)
    assert "you broke the stick from key 0" in capsys.readouterr().out


def _assert_margins_recompute(report: dict, verdicts) -> None:
    """The file's verdicts are ``verdicts``, and recomputed from them as they are now (not read
    from the file) each holds in every setting, at least 3 spreads from its threshold."""
    assert list(report["verdicts"]) == [v.label for v in verdicts]
    again = vm.verdict_margins(report["settings"], verdicts, report["seeds"])
    for label, entry in again.items():
        assert entry["values"] == pytest.approx(report["verdicts"][label]["values"]), label
        assert entry["holds_everywhere"], label
        assert entry["margin"] >= vm.MARGIN_FACTOR, (label, entry["margin"])


# -- notebook 06: the live cell re-scores the committed seed-0 models ----------------------------

COMMITTED_06 = REPO / "figures" / "06_verdict_margins.json"


def test_notebook_06s_live_verdicts_keep_three_spreads_in_every_setting_measured():
    from course_lib.teaching import score_bias_experiment as experiment

    report = json.loads(COMMITTED_06.read_text())
    assert report["function"] == "course_lib.teaching.score_bias_experiment:live_values"
    assert {(s["capability"], s["threads"]) for s in report["settings"]} >= {
        ("DEFAULT", 1), ("DEFAULT", 2), ("AVX2", 1), ("AVX2", 2),
    }  # fmt: skip
    _assert_margins_recompute(report, experiment.VERDICTS)


def test_notebook_06s_printed_live_losses_sit_three_spreads_from_a_rounding_boundary():
    """The cell prints each live loss to LIVE_DIGITS decimals: a value within a few spreads of
    a half-step (2.175 at 2 decimals) could print differently on another CPU."""
    from course_lib.teaching import score_bias_experiment as experiment

    report = json.loads(COMMITTED_06.read_text())
    step = 10.0**-experiment.LIVE_DIGITS
    checked = 0
    for name, entry in report["spreads"].items():
        if "_live" not in name:
            continue
        values = [x for s in report["settings"] for x in vm.values_of([s], name, "0")]
        boundary = (math.floor(values[0] / step) + 0.5) * step
        assert vm.margin_in_spreads(values, boundary, entry["spread"], log=False) >= 3, name
        assert len({round(v, experiment.LIVE_DIGITS) for v in values}) == 1, name
        checked += 1
    assert checked == 4 * len(experiment.LENGTHS)


# -- notebook 11: the live comparison is trained again at every run --------------------------------

COMMITTED_11 = REPO / "figures" / "11_verdict_margins.json"


def test_notebook_11s_live_verdicts_keep_three_spreads_in_every_setting_measured():
    from course_lib.teaching import capstone

    report = json.loads(COMMITTED_11.read_text())
    assert report["function"] == "course_lib.teaching.capstone:live_seed"
    assert {s["capability"] for s in report["settings"]} >= {"DEFAULT", "AVX2"}
    _assert_margins_recompute(report, capstone.VERDICTS)


#: Every committed measurement and the module whose VERDICTS it holds.
MARGIN_FILES = {
    "05": "course_lib.teaching.rse_window",
    "06": "course_lib.teaching.score_bias_experiment",
    "11": "course_lib.teaching.capstone",
    "02": "course_lib.teaching.learned_window",
    "08": "course_lib.teaching.counting_live",
    "09": "course_lib.teaching.vit_live",
}


@pytest.mark.parametrize("chapter", list(MARGIN_FILES))
def test_a_number_that_did_not_move_declares_the_step_it_moves_in(chapter):
    # a spread of 0 would make any threshold infinitely far: such a number says how far it can
    # move at the least (its resolution), and the margin counts in those steps
    import importlib

    module = importlib.import_module(MARGIN_FILES[chapter])
    report = json.loads((REPO / "figures" / f"{chapter}_verdict_margins.json").read_text())
    assert list(report["verdicts"]) == [v.label for v in module.VERDICTS]
    again = vm.verdict_margins(report["settings"], module.VERDICTS, report["seeds"])
    for verdict in module.VERDICTS:
        entry = again[verdict.label]
        assert entry["spread"] > 0 or verdict.resolution > 0, verdict.label
        assert math.isfinite(entry["margin"]), verdict.label
        assert report["verdicts"][verdict.label]["margin"] == pytest.approx(entry["margin"])


def test_notebook_11s_margins_train_the_sandwich_file_the_notebook_writes():
    from course_lib.teaching import capstone

    source = capstone.notebook_sandwich()
    assert "register(" in source and "sandwich" in source
    assert (capstone.LIVE_ARMS, capstone.LIVE_SEEDS, capstone.LIVE_STEPS) == (
        ("sandwich", "rope", "alibi"), 5, 60,
    )  # fmt: skip
    cells = json.loads(capstone.NOTEBOOK.read_text())["cells"]
    assert any(
        'live_comparison(["sandwich", "rope", "alibi"], seeds=5, steps=60)' in "".join(c["source"])
        for c in cells
    )


# -- chapters 02, 08 and 09: one seed trained live, verdicts of it (verdict_margins.Check) ---------

NOTEBOOK_02 = REPO / "notebooks" / "02_learned.ipynb"


#: Chapters that train one seed live and print verdicts of it (``verdict_margins.Check``):
#: {chapter: (module with CHECKS, SEEDS and live_numbers, the committed measurement)}.
LIVE_CHECKS = {
    "02": ("course_lib.teaching.learned_window", "figures/02_verdict_margins.json"),
    "08": ("course_lib.teaching.counting_live", "figures/08_verdict_margins.json"),
    "09": ("course_lib.teaching.vit_live", "figures/09_verdict_margins.json"),
}


def _live_checks() -> list[tuple[str, str]]:
    import importlib

    return [
        (chapter, name)
        for chapter, (module, _) in LIVE_CHECKS.items()
        for name in importlib.import_module(module).CHECKS
    ]


@pytest.mark.parametrize("chapter", list(LIVE_CHECKS))
def test_a_live_chapters_measurement_covers_its_seeds_kernels_and_threads(chapter):
    import importlib

    module_name, path = LIVE_CHECKS[chapter]
    module = importlib.import_module(module_name)
    report = json.loads((REPO / path).read_text())
    _assert_covers_seeds_kernels_and_threads(report, f"{module_name}:live_numbers", module.SEEDS)
    assert set(report["verdicts"]) == {v.label for v in module.VERDICTS}


@pytest.mark.parametrize(("chapter", "name"), _live_checks())
def test_a_live_chapters_verdicts_keep_three_spreads_in_seed_0_and_hold_in_every_seed(
    chapter, name
):
    """The chapter trains seed 0: each verdict's threshold sits at least 3 spreads (the
    largest difference between settings for one seed, over all seeds) from every seed-0 value
    seen; a verdict stated in general holds in every seed and setting measured."""
    import importlib

    module_name, path = LIVE_CHECKS[chapter]
    module = importlib.import_module(module_name)
    check = module.CHECKS[name]
    settings = json.loads((REPO / path).read_text())["settings"]
    spread = vm.spreads(settings)[name]["spread"]
    assert spread > 0 or check.resolution > 0, "a number that never moved declares its step"
    seed_0 = vm.values_of(settings, name, "0")
    assert seed_0 and all(check.holds(v) for v in seed_0), seed_0
    margin = vm.margin_in_spreads(seed_0, check.threshold, spread, False, check.resolution)
    assert margin >= vm.MARGIN_FACTOR
    if check.every_seed:
        for seed in module.SEEDS:
            values = vm.values_of(settings, name, str(seed))
            assert values and all(check.holds(v) for v in values), (seed, values)


def test_notebook_02_prints_its_verdicts_with_the_checks_and_its_seed_dependence_from_the_file():
    from course_lib.teaching import learned_window

    cells = json.loads(NOTEBOOK_02.read_text())["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    named = {n for n in learned_window.CHECKS if f'CHECKS["{n}"]' in source}
    if 'CHECKS[f"{name}_accuracy"]' in source:
        named |= {"learned_accuracy", "absolute_accuracy"}
    assert named == set(learned_window.CHECKS)
    assert "print_seed_dependence()" in source
    printed = "".join(
        "".join(o.get("text", "")) for c in cells if c["cell_type"] == "code" for o in c["outputs"]
    )
    assert ": False" not in printed


def test_the_seed_dependence_names_the_seeds_that_pass(capsys, tmp_path):
    from course_lib.teaching import learned_window

    settings = [
        {"cpu": "CPU", "values": {"0": {"sinusoidal_loss_3_6": 0.2, "beyond_start_over_middle": 2.0},
                                  "1": {"sinusoidal_loss_3_6": -0.001, "beyond_start_over_middle": 1.5}}},
        {"cpu": "CPU", "values": {"0": {"sinusoidal_loss_3_6": 0.1, "beyond_start_over_middle": 1.9},
                                  "1": {"sinusoidal_loss_3_6": 0.0, "beyond_start_over_middle": 1.1}}},
    ]  # fmt: skip
    path = tmp_path / "margins.json"
    path.write_text(json.dumps({"seeds": [0, 1], "settings": settings}))
    learned_window.print_seed_dependence(path)
    out = capsys.readouterr().out
    assert "2 CPU settings" in out
    assert "more than 0.05 on average: in seed(s) 0 of 0-1" in out
    assert "0: 0.10 to 0.20, 1: 0.00 to 0.00" in out  # -0.001 prints as 0.00, not -0.00
    assert "10..20 give: in seed(s) 0 of 0-1" in out  # seed 1 dips to 1.1 in one setting
