"""The kernels compile for real GPUs (H100 sm_90, A100 sm_80) and fit their limits, without a GPU.

``python -m course_lib.gpu_report --ci`` compiles ahead of time every launch the wrappers issue for
a subset of variants (bf16, head_dim 64 and 128, both targets; plain attention causal and
bidirectional, every score-bias hook in its heaviest combination) and exits 1 on a compile
error, shared memory over a target's per-block limit, or a 16-bit dot off the tensor cores.
About 3-4 minutes on 2 cores; skipped where Triton is not installed.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

from course_lib.kernel_hooks import registered_hooks  # noqa: E402


def _families(hook):
    return {"stick" if f.startswith("stick") else f for f in getattr(hook, "families", ("flash",))}


def test_planned_launches_follow_the_wrappers_configuration():
    """The report's launches are the wrappers' own: their tiles come from ``pick_config``."""
    from course_lib.gpu_static import variants

    common = variants._module("common")
    stick = variants._module("stick_breaking")
    v = variants.Variant("stick", variants.Features("interleaved"), True, 128, "bf16", 80)
    launches = variants.plan(v)
    assert [launch.name for launch in launches] == ["forward", "bwd_rows", "bwd_cols"]
    with common.planned_launches(80):
        cfg = stick.pick_config(128, torch.device("meta"), dtype=torch.bfloat16, tables=True)
    assert launches[0].kwargs["BLOCK_M"] == cfg.block_m
    assert launches[0].kwargs["num_stages"] == cfg.num_stages
    assert launches[1].kwargs["num_stages"] == cfg.bwd_stages
    # A forced block that cannot fit in an A100's shared memory is refused, not launched.
    with common.planned_launches(80), pytest.raises(ValueError, match="shared memory"):
        stick.pick_config(128, torch.device("meta"), 256, dtype=torch.float32, tables=True)


def test_ci_subset_compiles_fits_and_uses_tensor_cores(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "gpu_report"
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib.gpu_report", "--ci", "--jobs", "2", "--no-figure",
         "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=1200,
    )  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    rows = report["compiles"]
    assert rows and all(r["ok"] for r in rows)
    assert {r["arch"] for r in rows} == {90, 80}
    assert {r["head_dim"] for r in rows} == {64, 128}
    for r in rows:
        assert r["smem"] <= r["smem_limit"], r
        if r["kernel"] != "delta":
            assert r["fma"] == 0 and r["wgmma" if r["arch"] == 90 else "mma"] > 0, r
    # Every hook present at run time was compiled for every family that takes it.
    for name, hook in registered_hooks().items():
        seen = {r["family"] for r in rows if name in r["features"]}
        assert seen >= _families(hook), (name, seen)
    # Spills above the report's bound are listed.
    from course_lib.gpu_report import SPILL_NOTE

    assert len(report["spills"]) == sum(r["spill_store"] > SPILL_NOTE for r in rows)
    assert not report["failures"]
