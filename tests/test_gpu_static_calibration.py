"""The static model's calibration against measured times (course_lib.gpu_static.calibrate):
the fit recovers known parameters, the committed table is what the committed report and
measurement give, every measured method is modelled or listed with a reason."""

import json
import math
import random

import pytest

from course_lib.gpu_static import calibrate, goals


def _synthetic_rows(params: dict, methods=("a", "b", "c", "d", "e"), per_method=4) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for m in methods:
        for _ in range(per_method):
            plain = dict(overlap=0.3, no_overlap=0.5, mem=0.08, passes=0.0)
            feats = dict(
                overlap=0.3 * rng.uniform(1, 3),
                no_overlap=0.5 * rng.uniform(1, 3),
                mem=0.08 * rng.uniform(1, 6),
                passes=rng.choice((0.0, 0.02)),
            )
            row = dict(method=m, seq=4096, features=feats, plain=plain)
            row["measured"] = calibrate.predict(params, row)
            rows.append(row)
    return rows


@pytest.mark.parametrize("truth", [dict(w=0.3, s=0.6), dict(w=0.8, s=0.15)])
def test_fit_recovers_known_parameters(truth):
    rows = _synthetic_rows(truth)
    got = calibrate.fit(rows)
    assert got["w"] == pytest.approx(truth["w"], abs=2e-3)
    assert got["s"] == pytest.approx(truth["s"], abs=2e-3)
    loo = calibrate.leave_one_out(rows)
    assert loo["median_abs_log"] < 1e-3 and loo["worst_factor"] < 1.01 and loo["targets_met"]
    for v in loo["per_method"].values():
        assert v["params"]["s"] == pytest.approx(truth["s"], abs=5e-3)


def test_leave_one_out_flags_a_method_off_the_model():
    rows = _synthetic_rows(dict(w=0.5, s=0.5))
    for r in rows:
        if r["method"] == "e":
            r["measured"] /= 2.5  # what no shared parameter can explain
    loo = calibrate.leave_one_out(rows)
    assert loo["per_method"]["e"]["worst"] > 2.0 and not loo["targets_met"]


def _same(a, b, path="") -> None:
    """Equal structures; numbers to 5e-3 (``w`` lies in a flat valley when ``s`` is 1: its
    last digits may differ between CPUs' libm, the predictions do not)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=5e-3), path
    else:
        assert a == b, path


def test_committed_table_is_what_the_committed_files_give():
    committed = json.loads((calibrate.ROOT / calibrate.CALIBRATION).read_text())
    fresh = json.loads(json.dumps(calibrate.calibrate()))
    _same(committed, fresh)
    assert committed["sources"] == dict(
        report=calibrate.REPORT,
        measurement=calibrate.MEASUREMENT,
        device="NVIDIA H200",
        measured_commit=committed["sources"]["measured_commit"],
    )
    loo = committed["leave_one_method_out"]
    assert loo["targets_met"] == (loo["median_factor"] < 1.25 and loo["worst_factor"] <= 1.6)
    for r in committed["rows"]:
        assert r["predicted_loo"] > 0 and r["measured"] > 0


def test_every_measured_method_is_modelled_or_listed_with_a_reason():
    rep = calibrate._load(calibrate.REPORT)
    meas = calibrate._load(calibrate.MEASUREMENT)
    measured = {r["method"] for r in meas["speed"] if r.get("contender") == "kernel"}
    assert measured <= set(calibrate.METHODS) | set(calibrate.UNMODELLED)
    assert not set(calibrate.METHODS) & set(calibrate.UNMODELLED)
    assert all(calibrate.UNMODELLED[m] for m in measured - set(calibrate.METHODS))
    rows = {(e["family"], e["features"]) for e in rep["model"]}
    for method, (family, features, alone) in calibrate.METHODS.items():
        assert (family, features) in rows, method
        if alone:
            assert (family, "tables") in rows and (family, "plain") in rows
    table = json.loads((calibrate.ROOT / calibrate.CALIBRATION).read_text())
    fitted = {r["method"] for r in table["rows"]}
    assert fitted == measured & set(calibrate.METHODS) - {"softmax"}
    assert set(table["unmodelled"]) == measured - set(calibrate.METHODS)


def test_apply_adds_calibrated_ratios_and_goals_can_be_judged_on_them():
    rep = calibrate._load(calibrate.REPORT)
    params = calibrate.committed_params()
    calibrate.apply(rep, params)
    rows = [e for e in rep["model"] if "error" not in e]
    assert all("plain_x_cal" in e and "plain_x_cal_fwd" in e for e in rows)
    for e in rows:
        if e["family"] == "flash" and e["features"] == "plain":
            assert e["plain_x_cal"] == pytest.approx(1.0)
    # the measured RoPE row at 4096 tokens: what apply gives is the table's fit
    table = json.loads((calibrate.ROOT / calibrate.CALIBRATION).read_text())
    rope = next(
        r
        for r in table["rows"]
        if r["method"] == "rope" and r["seq"] == 4096 and r["pass_"] == "fwd+bwd"
    )
    row = next(
        e
        for e in rows
        if e["family"] == "flash"
        and e["features"] == "tables"
        and e["causal"]
        and e["head_dim"] == 64
        and e["dtype"] == "bf16"
    )
    assert row["plain_x_cal"] == pytest.approx(rope["predicted"], abs=1e-3)
    plain = goals.judge(calibrate._load(calibrate.REPORT))
    cal = goals.judge(calibrate._load(calibrate.REPORT), calibrated=params)
    assert [v["goal"] for v in plain] == [v["goal"] for v in cal]
    rope_cal = next(v for v in cal if v["goal"] == "RoPE vs plain flash" and v["head_dim"] == 64)
    assert rope_cal["value"] == pytest.approx(row["plain_x_cal"])
    assert math.isfinite(rope_cal["value"])


def test_per_token_passes_are_charged_against_plain_flashs_measured_time():
    """A pass's DRAM cycles count against ``k`` times the model's cycles of plain flash, ``k``
    being the measured time of plain flash over the model's (the loops' ratios stay as fitted)."""
    plain = dict(overlap=0.3, no_overlap=0.5, mem=0.08, passes=0.0)
    row = dict(features=dict(plain, passes=0.03), plain=plain, pass_="fwd+bwd")
    assert calibrate.predict(dict(w=0.0, s=1.0), row) == pytest.approx(1 / 1.1)
    scaled = dict(w=0.0, s=1.0, loop_scale={"fwd+bwd": 3.0})
    assert calibrate.predict(scaled, row) == pytest.approx(1 / (1 + 0.1 / 3))
    rep, meas = calibrate._load(calibrate.REPORT), calibrate._load(calibrate.MEASUREMENT)
    k = calibrate.loop_scale(rep, meas, calibrate.committed_params())
    # the model's cycles leave out most of a real kernel's time: k is well above 1
    assert set(k) == {"fwd", "fwd+bwd"} and all(2 < v < 5 for v in k.values())
    assert k == pytest.approx(calibrate.committed_params()["loop_scale"], rel=1e-3)
