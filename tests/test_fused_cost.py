"""Chapters 05, 06 and 08's cost of a fused kernel beside plain flash attention, read from the
committed static model and H200 times (course_lib.teaching.fused_cost)."""

import json

import pytest

from course_lib.gpu_static import calibrate, goals
from course_lib.runtime import kernels_available
from course_lib.teaching import fused_cost

MODELLED = sorted(set(calibrate.METHODS) - {"softmax"})


def _report() -> dict:
    return json.loads(fused_cost.GPU_REPORT.read_text())


def test_each_method_reads_the_report_row_it_runs():
    current = {(e["family"], e["features"]) for e in _report()["model"]}
    for method in MODELLED:
        family, features, alone = fused_cost.runs(method)
        assert (family, features) in current, method
        if alone:
            assert (family, "tables") in current
    # T5 declares where its table stops changing: it runs the table's far tiles, which the speed
    # goal judges; KERPLE runs its own hook (the default variant's), which its goal judges
    t5_goal = next(g for g in goals.GOALS if g.name.startswith("T5"))
    assert fused_cost.runs("t5")[:2] == t5_goal.rows[0]
    kerple_goal = next(g for g in goals.GOALS if g.name.startswith("KERPLE"))
    assert fused_cost.runs("kerple")[:2] == kerple_goal.rows[0]
    if kernels_available():
        from course_lib.registry import REGISTRY

        default = REGISTRY["kerple"].kernel_hooks[0]
        assert default.name == "kerple_" + REGISTRY["kerple"].params["variant"]
        assert fused_cost.runs("kerple")[1] == f"tables+gain+{default.name}(grad)"
    with pytest.raises(ValueError, match="method must be one of"):
        fused_cost.runs("cope")


def test_a_hook_alone_costs_no_more_than_its_heaviest_combination():
    """The hook alone (the row minus what RoPE's tables add) is at least as fast, by the
    calibrated model, as the row with the tables, which the goals judge."""
    rep = _report()
    calibrate.apply(rep, calibrate.committed_params())
    entries = {(e["family"], e["features"], e["head_dim"]): e for e in rep["model"]
               if e["causal"] and e["dtype"] == "bf16" and e.get("arch", 90) == 90}  # fmt: skip
    alone = [m for m in MODELLED if fused_cost.runs(m)[2]]
    assert alone
    for method in alone:
        family, features, _ = fused_cost.runs(method)
        cost = fused_cost.fused_cost(method)
        for d in (64, 128):
            assert cost["calibrated"][d] >= entries[(family, features, d)]["plain_x_cal"] - 1e-9
        assert set(cost["memory"]) == {"forward", "dK/dV", "dQ"}
        assert cost["measured"] is not None and 0 < cost["measured"] < 1


def test_the_print_says_what_is_modelled_and_what_was_measured(capsys):
    fused_cost.print_fused_costs(("t5", "cope"))
    out = capsys.readouterr().out
    assert "calibrated (an estimate)" in out and "NVIDIA H200" in out
    assert "CoPE\n    static model: not modelled" in out
    # beside each H200 time, the calibrated model of the kernels it timed (method left out)
    assert "; the calibrated model of those kernels (fitted without T5): 4.70x" in out
    assert out.count("calibrated model of those kernels") == 1  # CoPE has no model
    # CoPE's row was timed with the check's default module: as many counts as tokens
    assert "head_dim 64, npos 4096 (= seq): " in out and out.count("npos") == 1


def test_the_model_of_the_measured_kernels_is_near_what_they_measured():
    # the calibration's own claim at the goals' shape: no method off by more than 1.6x
    for method in MODELLED:
        cost = fused_cost.fused_cost(method)
        ratio = cost["measured_model"] / cost["measured"]
        assert 1 / 1.6 < ratio < 1.6, (method, ratio)
