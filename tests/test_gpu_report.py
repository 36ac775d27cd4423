"""The kernels compile for real GPUs (H100 sm_90, and learners' A10 / RTX 30xx sm_86 and T4
sm_75) and fit their limits, without a GPU; the static model's loop finder, bounds and occupancy
on synthetic machine code.

``python -m course_lib.gpu_report --ci`` compiles ahead of time every launch the wrappers issue for
a subset of variants (bf16, fp16 on the T4, head_dim 64 and 128; plain attention causal and
bidirectional, every score-bias hook in its heaviest combination) and exits 1 on a compile
error, shared memory over a target's per-block limit, or a 16-bit dot off the tensor cores
where the compiler has them. It reuses the rows of the committed report whose compile is the same
(``--reuse``: same kernel and hook sources, launch, target, Triton and ptxas), once a fresh compile
of two of them per target agrees field for field: under a minute when the committed report is up
to date with the kernels, about 6-8 minutes on 2 cores when it is not (everything compiled).
Skipped where Triton is not installed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from course_lib.gpu_report import TRITON_FOR_REPORT  # noqa: E402
from course_lib.kernel_hooks import registered_hooks  # noqa: E402
from course_lib.runtime import triton_older_than  # noqa: E402

# The kernels run on Triton 3.4; the report compiles with 3.6 or newer and says so.
needs_report_triton = pytest.mark.skipif(
    triton_older_than(TRITON_FOR_REPORT) is not None,
    reason="python -m course_lib.gpu_report compiles with Triton {}.{} or newer".format(
        *TRITON_FOR_REPORT
    ),
)


def _families(hook):
    return {"stick" if f.startswith("stick") else f for f in getattr(hook, "families", ("flash",))}


def test_planned_launches_follow_the_wrappers_configuration():
    """The report's launches are the wrappers' own: their tiles come from ``pick_config``."""
    from course_lib.gpu_static import variants

    common = variants._module("common")
    stick = variants._module("stick_breaking")
    v = variants.Variant("stick", variants.Features("interleaved"), True, 128, "bf16", 80)
    launches = variants.plan(v)
    # the tables once before the loops and once after (their transpose, on the gradients)
    names = ["encode_q", "encode_k", "forward", "bwd_rows", "bwd_cols", "decode_q", "decode_k"]
    assert [launch.name for launch in launches] == names
    with common.planned_launches(80):
        cfg = stick.pick_config(128, torch.device("meta"), dtype=torch.bfloat16)
    assert launches[2].kwargs["BLOCK_M"] == cfg.block_m
    assert launches[2].kwargs["num_stages"] == cfg.num_stages
    assert launches[3].kwargs["num_stages"] == cfg.bwd_stages
    # A forced block that cannot fit in an A100's shared memory is refused, not launched.
    with common.planned_launches(80), pytest.raises(ValueError, match="shared memory"):
        stick.pick_config(128, torch.device("meta"), 256, dtype=torch.float32)


def test_q_k_tables_are_applied_once_outside_the_loops():
    """A call with q/k tables (RoPE; the half layout with a gain, as ExpoSB's) runs plain
    attention's loops, the same kernels with the same tiles and
    switches, plus one pass per input before them and one per gradient after. The only
    difference inside: the loops write the gradients w.r.t. q' and k' in float32, for the
    transpose to round once."""
    from course_lib.gpu_static import variants

    for family in ("flash", "stick"):
        for causal in (True, False):
            plain = variants.plan(variants.Variant(family, variants.Features(), causal, 64,
                                                   "bf16", 90))  # fmt: skip
            for features in (variants.Features("interleaved"), variants.Features("half", True)):
                launches = variants.plan(variants.Variant(family, features, causal, 64, "bf16", 90))
                names = [launch.name for launch in launches]
                assert names[:2] == ["encode_q", "encode_k"], names
                assert names[-2:] == ["decode_q", "decode_k"], names
                loops = launches[2:-2]
                assert [x.name for x in loops] == [x.name for x in plain]
                for ours, theirs in zip(loops, plain, strict=True):
                    assert ours.kernel is theirs.kernel and ours.grid == theirs.grid
                    assert ours.kwargs == theirs.kwargs, (family, ours.name)
                    dtypes = [
                        (a.dtype, b.dtype)
                        for a, b in zip(ours.args, theirs.args, strict=True)
                        if isinstance(a, torch.Tensor) and a.dtype != b.dtype
                    ]
                    assert set(dtypes) <= {(torch.float32, torch.bfloat16)}, dtypes


def test_a_split_biass_query_part_is_computed_once_for_the_dkdv_kernel():
    """A causal launch with a split bias (ALiBi's, FoX's) computes ``lse - u`` in the backward's
    per-token pass, per query block of the dK/dV kernel's tiles, and the dK/dV launch reads that
    tensor; a bidirectional launch (no split) keeps the plain ``delta`` pass."""
    from course_lib.gpu_static import variants

    for hook in ("linear_distance", "cumulative_log_gates"):
        features = variants.Features(hook=hook, grad=True)
        launches = {x.name: x for x in variants.plan(variants.Variant("flash", features, True, 64,
                                                                      "bf16", 90))}  # fmt: skip
        assert "delta" not in launches and "delta_split" in launches, list(launches)
        delta, dkdv = launches["delta_split"], launches["dkdv"]
        assert delta.kwargs["BIAS_SPLIT"] is not None
        assert delta.kwargs["BLOCK_M"] == dkdv.kwargs["BLOCK_M"]
        lse, lse_split = delta.args[3], delta.args[4]  # read, written
        assert lse_split is not lse and dkdv.args[4] is lse and dkdv.args[5] is lse_split
    features = variants.Features(hook="linear_distance", grad=True)
    names = [x.name for x in variants.plan(variants.Variant("flash", features, False, 64, "bf16",
                                                            90))]  # fmt: skip
    assert "delta" in names and "delta_split" not in names


def test_the_kernels_limits_agree_with_the_reports_targets():
    """``kernels/`` cannot import ``course_lib``, so it keeps its own table of shared memory per
    block, its own first bf16 architecture and its tcgen5 architectures: all must say what the
    report's targets say."""
    from course_lib.gpu_static import targets, variants

    common = variants._module("common")
    stick = variants._module("stick_breaking")
    for arch, gpu in targets.TARGETS.items():
        assert common.SMEM_PER_BLOCK[arch] == gpu.smem_per_block, arch
        assert (arch >= common.BF16_MIN_ARCH) == gpu.bf16, arch
        # stick-breaking sizes its column kernel's stages for Blackwell's tensor-memory products
        assert (arch in stick._TCGEN5_ARCHS) == (gpu.tensor_cores == "tcgen5"), arch


def test_tiles_follow_the_gpus_shared_memory_and_bf16_is_refused_where_it_has_no_tensor_cores():
    """Learners' GPUs get the tiles their shared memory holds (the CI compile below checks that
    they fit); on a T4 (sm_75) bf16 is refused with what to use instead, never run silently on
    the CUDA cores. Planned on meta tensors, as the report does."""
    from course_lib.gpu_static import variants

    common = variants._module("common")
    flash = variants._module("flash")
    cuda = torch.device("cuda")
    sizes = {}
    for arch in (90, 80, 86, 75):
        with common.planned_launches(arch):
            cfg = flash.pick_config("forward", 64, torch.bfloat16, cuda, bias=True)
            tile = flash.pick_config("dkdv", 64, torch.float16, cuda, bias=True, per_tile=True)
        sizes[arch] = cfg.block_m * cfg.block_n * cfg.num_stages
        # a per-tile gradient's dK/dV tiles: keys a multiple of their queries
        assert tile.block_n % tile.block_m == 0 and tile.block_n <= (32 if arch == 75 else 128)
    assert sizes[90] >= sizes[80] > sizes[86] >= sizes[75]
    q = torch.empty(1, 2, 64, 64, dtype=torch.bfloat16, device="meta")
    positions = torch.zeros(1, 64, device="meta")
    with common.planned_launches(75), pytest.raises(TypeError, match="sm_75.*float16"):
        flash.flash_attention_forward(q, q, q, positions, None, causal=True, scale=0.125)
    with common.planned_launches(86) as launches:
        flash.flash_attention_forward(q, q, q, positions, None, causal=True, scale=0.125)
    assert launches
    # Blackwell (sm_100) keeps more of each column-kernel stage in shared memory than Hopper:
    # two stages of the causal kernel at head_dim 128 would need 279 KiB there (limit 227)
    stick = variants._module("stick_breaking")
    stages = {}
    for arch in (90, 100):
        with common.planned_launches(arch):
            stages[arch] = stick.pick_config(128, cuda, dtype=torch.bfloat16).cols_stages
    assert stages == {90: 2, 100: 1}


def test_every_h100_warpgroup_at_head_dim_64_gets_rows_of_its_own():
    """An H100 warpgroup (4 warps) multiplies 64 rows at a time: a flash tile whose row side (the
    queries of the forward and dQ kernels, the keys of the dK/dV kernel) gives a warpgroup
    fewer would have both warpgroups compute the same products. At head_dim 64 no 16-bit
    launch does, the tiles of a per-tile gradient included."""
    from course_lib.gpu_static import variants

    common = variants._module("common")
    flash = variants._module("flash")
    cuda = torch.device("cuda")
    with common.planned_launches(90):
        for kernel in flash.KERNELS:
            for bias, per_tile in ((False, False), (True, False), (True, True)):
                if per_tile and kernel != "dkdv":
                    continue
                cfg = flash.pick_config(
                    kernel, 64, torch.bfloat16, cuda, bias=bias, per_tile=per_tile
                )
                rows = cfg.block_n if kernel == "dkdv" else cfg.block_m
                assert rows // (cfg.num_warps // 4) >= 64, (kernel, bias, per_tile, cfg)


def test_hopper_stick_backward_with_a_bias_at_head_dim_64_takes_two_warpgroups():
    """On sm_90 at head_dim 64 a launch with a score bias runs its backward on 128 x 64 tiles
    and 8 warps (its column kernel spills far less), one warpgroup per 64 queries; the forward,
    a launch without a bias and a per-tile gradient's square tiles keep 64 x 64 on 4 warps."""
    from course_lib.gpu_static import variants

    common = variants._module("common")
    stick = variants._module("stick_breaking")
    cuda = torch.device("cuda")
    with common.planned_launches(90):
        plain = stick.pick_config(64, cuda, dtype=torch.bfloat16)
        biased = stick.pick_config(64, cuda, dtype=torch.bfloat16, biased=True)
        square = stick.pick_config(64, cuda, dtype=torch.bfloat16, biased=True, square=True)
        wide = stick.pick_config(128, cuda, dtype=torch.bfloat16, biased=True)
    with common.planned_launches(80):
        ampere = stick.pick_config(64, cuda, dtype=torch.bfloat16, biased=True)
    assert (biased.block_bwd, biased.block_bwd_n, biased.bwd_warps) == (128, 64, 8)
    assert (biased.block_m, biased.block_n, biased.num_warps) == (64, 64, 4)
    for cfg in (plain, square):
        assert (cfg.block_bwd, cfg.block_bwd_n, cfg.bwd_warps) == (64, 64, 4)
    assert (wide.block_bwd, wide.bwd_warps) == (128, 8)
    assert ampere.block_bwd == 64


REPO = Path(__file__).resolve().parents[1]


def _report(out: Path, *args: str, timeout: int = 600) -> tuple[dict, str]:
    """Run ``python -m course_lib.gpu_report *args --out out``: (its JSON, its output)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TRITON_DEFAULT_FP_FUSION="1")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib.gpu_report", *args, "--no-figure", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads(out.with_suffix(".json").read_text()), proc.stdout + proc.stderr


def _without_times(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@needs_report_triton
def test_reused_rows_are_checked_by_a_fresh_compile_and_refused_if_it_differs(tmp_path):
    one = ("--ci", "--jobs", "2", "--filter", "^flash plain causal D64 bf16 sm90$")
    first, _ = _report(tmp_path / "first", *one)
    rows = first["compiles"]
    assert len(rows) >= 3 and first["meta"]["reused"] == 0
    # the same compiles: every row reused but the first and last planned, compiled again
    again, text = _report(tmp_path / "again", *one, "--reuse", str(tmp_path / "first.json"))
    assert (again["meta"]["reused"], again["meta"]["spot_checked"]) == (len(rows) - 2, 2)
    assert _without_times(again["compiles"]) == _without_times(rows)
    assert again["model"] == first["model"] and "rows reused" in text
    # a row that a fresh compile contradicts: nothing reused, everything compiled, and said
    tampered = json.loads((tmp_path / "first.json").read_text())
    tampered["compiles"][0]["regs"] += 1
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    third, _ = _report(tmp_path / "third", *one, "--reuse", str(tmp_path / "tampered.json"))
    assert third["meta"]["reused"] == 0
    assert _without_times(third["compiles"]) == _without_times(rows)
    (note,) = [n for n in third["notes"] if "not reused" in n]
    assert "regs" in note, note


@needs_report_triton
def test_a_job_key_is_the_same_in_another_virtual_environment():
    """Compile keys name files of Triton's installation (libdevice): a fresh clone's own
    environment must find the committed rows all the same."""
    from course_lib.gpu_report import job_key

    here = Path(triton.__file__).parent
    key = f"('extern_libs', (('libdevice', '{here}/backends/nvidia/lib/libdevice.10.bc'),))"
    assert job_key(key, 90, True) == job_key(key.replace(str(here), "<triton>"), 90, True)
    assert job_key(key, 90, True) != job_key(key, 86, True)


@needs_report_triton
def test_ci_subset_compiles_fits_and_uses_tensor_cores(tmp_path):
    out = tmp_path / "gpu_report"
    report, _ = _report(
        out,
        "--ci",
        "--jobs",
        "2",
        "--reuse",
        str(REPO / "figures" / "gpu_report.json"),
        # a guard against a hung compiler, not a speed check: about 6-8 minutes on 2 idle cores
        # when nothing is reused, and 24 minutes measured beside other tests on the same 2 cores
        timeout=2400,
    )
    rows = report["compiles"]
    assert rows and all(r["ok"] for r in rows)
    # sm_90, and learners' GPUs with 99 KiB (sm_86) and 64 KiB (sm_75) of shared memory
    assert {r["arch"] for r in rows} == {90, 86, 75}
    assert {r["head_dim"] for r in rows} == {64, 128}
    # CoPE's own scan, causal only, forward and both backward kernels on every target
    cope = {(r["arch"], r["kernel"]) for r in rows if r["family"] == "cope"}
    assert cope == {(a, k) for a in (90, 86, 75) for k in ("forward", "bwd_rows", "bwd_cols")}
    assert not any(r["family"] == "cope" and not r["causal"] for r in rows)
    # a T4 has no bf16 tensor cores: the wrappers refuse bf16 and say what to use; fp16 instead
    assert {r["dtype"] for r in rows if r["arch"] == 75} == {"fp16"}
    (refusal,) = report["refusals"]
    assert refusal["arch"] == 75 and "float16" in refusal["message"]
    # this Triton has no tensor-core path for sm_75: said once, not failed per kernel
    (note,) = report["notes"]
    assert note.startswith("sm_75:") and "CUDA cores" in note
    from course_lib.gpu_static.model import PER_TOKEN_PASSES

    lowering = {90: "wgmma", 86: "mma", 75: "fma"}
    for r in rows:
        assert r["smem"] <= r["smem_limit"], r
        if r["kernel"] not in PER_TOKEN_PASSES:  # no dot in a per-token pass
            # CoPE's 32-row tiles are below Hopper's 64-row wgmma: mma.sync there
            expected = "mma" if (r["family"], r["arch"]) == ("cope", 90) else lowering[r["arch"]]
            assert r[expected] > 0, r
            assert r["arch"] == 75 or r["fma"] == 0, r
    # Every hook present at run time was compiled for every family that takes it.
    for name, hook in registered_hooks().items():
        seen = {r["family"] for r in rows if name in r["features"]}
        assert seen >= _families(hook), (name, seen)
    # Spills above the report's bound are listed.
    from course_lib.gpu_report import SPILL_NOTE

    assert len(report["spills"]) == sum(r["spill_store"] > SPILL_NOTE for r in rows)
    assert not report["failures"]
    # T5's dK/dV tile loop holds a loop over the buckets of a tile: counted whole
    t5 = [r for r in rows if "t5" in r["features"] and r["kernel"] == "dkdv" and r["arch"] == 90]
    assert t5 and all(any(lp["nested"] for lp in r["loops"]) for r in t5)
    # every modelled variant: both bounds, its ratio to plain flash, each kernel's occupancy
    for e in report["model"]:
        assert "error" not in e, e
        assert e["fwd_no"] >= e["fwd"] and e["bwd_no"] >= e["bwd"]
        assert e["plain_x"] > 0 and e["plain_x_no"] > 0
        assert all(f["ctas"] >= 1 and f["regs"] > 0 for f in e["occupancy"].values())


# -- the static model on synthetic machine code (no compile) --------------------------------------


def _listing(*lines: str) -> str:
    """An ``nvdisasm -c``-style listing: ``".L_x_N:"`` lines are labels, the others
    instructions (``"@P0 BRA `(.L_x_0)"``), one address each."""
    out, address = [], 0
    for line in lines:
        if line.endswith(":"):
            out.append(line)
            continue
        out.append(f"        /*{address:04x}*/                   {line} ;")
        address += 16
    return "\n".join(out)


def _loops(*lines: str) -> list[dict]:
    from course_lib.gpu_static import sass

    return sass.inner_loops(sass.parse_listing(_listing(*lines)))


def test_a_nested_loop_is_counted_whole_at_one_trip():
    """T5's dK/dV loop holds a loop over the buckets present in a tile: the tile loop is
    measured with every instruction of its body, the nested loop's once (not the nested loop
    alone, as an innermost-loop finder would)."""
    inner = ["IADD3 R2, R2, 0x1, RZ"] * 40 + ["ISETP.GE.AND P1, PT, R2, R3, PT"]
    loops = _loops(
        "MOV R1, c[0x0][0x28]",
        ".L_x_0:",
        *["FFMA R4, R5, R6, R4"] * 50,
        ".L_x_1:",
        *inner,
        "@!P1 BRA `(.L_x_1)",
        "ISETP.GE.AND P0, PT, R7, R8, PT",
        "@!P0 BRA `(.L_x_0)",
        "EXIT",
    )
    assert len(loops) == 1
    (lp,) = loops
    assert lp["start"] == 1 and lp["nested"] == [len(inner) + 1]
    assert lp["total"] == 50 + len(inner) + 1 + 2
    assert lp["counts"]["fp32"] == 50 and lp["counts"]["alu"] == len(inner) + 1


def test_a_slow_path_jumping_back_is_not_a_loop_but_belongs_to_the_loop_it_serves():
    """A branch back from code placed after the exit is a loop only if its target dominates it:
    the return from a slow path into straight-line code is not one; a slow path that leaves
    a loop and returns into it is part of that loop's body."""
    loops = _loops(
        "@P1 BRA `(.L_x_5)",  # to a slow path after the exit, which returns to .L_x_4
        ".L_x_4:",
        *["FMUL R4, R4, R5"] * 40,  # straight-line code, no loop
        ".L_x_0:",
        *["FFMA R4, R5, R6, R4"] * 40,
        "@!P2 BRA `(.L_x_6)",  # the loop's slow path (a barrier wait)
        ".L_x_7:",
        "ISETP.GE.AND P0, PT, R7, R8, PT",
        "@!P0 BRA `(.L_x_0)",
        "EXIT",
        ".L_x_5:",
        "NOP",
        "BRA `(.L_x_4)",
        ".L_x_6:",
        "SYNCS.PHASECHK.TRANS64 P2, [UR4], R9",
        "BRA `(.L_x_7)",
    )
    assert len(loops) == 1
    assert loops[0]["counts"]["fp32"] == 40 and loops[0]["total"] == 40 + 1 + 2 + 2


def test_spills_barriers_and_both_bounds_of_a_loop():
    from course_lib.gpu_static import sass

    loops = _loops(
        ".L_x_0:",
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24",
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24",
        *["MUFU.EX2 R4, R4"] * 8,
        *["FFMA R4, R5, R6, R4"] * 20,
        "LDL R10, [R1+0x4]",
        "STL.64 [R1+0x8], R12",
        "LDL.LU.128 R16, [R1+0x10]",
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        "ISETP.GE.AND P0, PT, R7, R8, PT",
        "@!P0 BRA `(.L_x_0)",
        "EXIT",
    )
    (lp,) = loops
    assert lp["local"] == 3 and lp["local_bytes"] == 32 * (4 + 8 + 16)
    assert lp["barriers"] == 2
    c = sass.loop_cycles(lp, 90, warps=8)
    cyc = c["cycles"]
    assert cyc["tc"] == 2 * (2 * 64 * 64 * 16) * 2 / 4096  # two warpgroups
    assert cyc["mufu"] == 8 * 8 * 32 / 16
    assert cyc["spill"] == 32 * 28 * 8 / sass.L1_BYTES_PER_CLOCK
    rest = max(v for k, v in cyc.items() if k not in ("tc", "spill"))
    busiest = max(v for k, v in cyc.items() if k != "spill")
    assert c["overlap"] == busiest + cyc["spill"] and c["max"] == c["overlap"]
    assert c["no_overlap"] == cyc["tc"] + rest + cyc["spill"]
    assert c["no_overlap"] > c["overlap"] and c["bound"].endswith("+spill")


def test_kernel_costs_both_bounds_and_ratios_to_plain():
    from course_lib.gpu_static import model

    def loop(overlap, no_overlap):
        return dict(overlap=overlap, no_overlap=no_overlap, bound="tc")

    tiles = (128, 64)
    cost, bounds = model.kernel_cost("flash", "forward", [loop(800, 1600)], tiles, True, 8192)
    assert cost == {"overlap": 800 / 8192, "no_overlap": 1600 / 8192} and bounds == "tc"
    # causal: the masked loop weighs by the share of diagonal tiles
    cost, _ = model.kernel_cost("flash", "dq", [loop(800, 800), loop(1600, 1600)], tiles, True,
                                8192)  # fmt: skip
    share = model._diagonal_share(tiles, True, 8192, rows_are_queries=True)
    assert 0 < share < 0.1 and cost["overlap"] == pytest.approx((1 + share) * 800 / 8192)
    with pytest.raises(ValueError, match="no inner loop"):
        model.kernel_cost("flash", "dq", [], tiles, True, 8192)
    # a far form: three loops (far, near, band), weighed by the pairs each visits
    three = [loop(400, 400), loop(1600, 1600), loop(3200, 3200)]
    cost, _ = model.kernel_cost("flash", "dq", three, tiles, True, 8192, far_reach=113)
    far, near, band = model.far_tile_counts(tiles, 8192, "dq", 113)
    assert far + near + band == 8192 * (8192 + 128) // 2  # every visited pair, once
    assert near == (8192 // 128 - 1) * 128 * 128  # 128 keys before each query block but one
    want = (far * 400 + near * 1600 + band * 3200) / (far + near + band) / (128 * 64)
    assert cost["overlap"] == pytest.approx(want)
    with pytest.raises(ValueError, match="3 with a far form"):
        model.kernel_cost("flash", "dq", three, tiles, True, 8192)


def test_far_tile_counts_walk_the_tiles_the_kernels_walk():
    """dK/dV with far tiles of twice its rows: every pair once, the far tiles ending at the last
    query; the report's reach is T5's (``t5_distance_reach`` at its defaults)."""
    from course_lib.encodings.t5 import t5_distance_reach
    from course_lib.gpu_static import model

    seq = 1024
    for far_rows in (None, 128):
        far, near, band = model.far_tile_counts((64, 64), seq, "dkdv", 113, far_rows)
        assert far + near + band == seq * (seq + 64) // 2
        assert far % (64 * (far_rows or 64)) == 0 and near > 0
    params = {"bias_table": torch.zeros(2, 32), "bidirectional": False, "max_distance": 128}
    assert model.FAR_REACH == t5_distance_reach(params)

    def entry(features, fwd, bwd):
        kernels = {"forward": fwd, "dkdv": {b: v / 2 for b, v in bwd.items()},
                   "dq": {b: v / 2 for b, v in bwd.items()}}  # fmt: skip
        e = dict(family="flash", features=features, causal=True, head_dim=64, dtype="bf16")
        e.update(model.pair_costs("flash", kernels, 64))
        return e

    plain = entry(
        "plain", {"overlap": 0.07, "no_overlap": 0.13}, {"overlap": 0.22, "no_overlap": 0.37}
    )
    slow = entry(
        "hook", {"overlap": 0.14, "no_overlap": 0.26}, {"overlap": 0.44, "no_overlap": 0.74}
    )
    model.relative_to_plain([plain, slow])
    assert plain["plain_x"] == 1.0 and slow["plain_x"] == pytest.approx(0.5)
    assert slow["plain_x_no"] == pytest.approx(0.5)
    a = model.ANCHORS[64]
    assert slow["total_x_no"] == pytest.approx((a["fwd_no"] + a["bwd_no"]) / 1.0)
    # A per-token pass costs the bytes it moves, spread over a row's pairs: the q/k transform
    # (encode q and k; decode their float32 gradients) at head_dim 64 in bf16, causal 8192
    # tokens, is 1536 bytes a row over 4096 pairs; it counts in the ratios to plain flash.
    passes = sum(
        model.token_pass_cost(name, 64, 2, True, 8192)
        for name in ("encode_q", "encode_k", "decode_q", "decode_k")
    )
    assert passes == pytest.approx(1536 / model.DRAM_BYTES_PER_SM_CYCLE / 4096)
    rotary = dict(plain, features="tables", passes=passes)
    model.relative_to_plain([plain, rotary])
    assert rotary["plain_x"] == pytest.approx(
        (plain["fwd"] + plain["bwd"]) / (plain["fwd"] + plain["bwd"] + passes)
    )
    assert 0.85 < rotary["plain_x"] < 1.0
    with pytest.raises(ValueError, match="not a per-token pass"):
        model.token_pass_bytes("forward", 64, 2)


def test_targets_and_occupancy():
    from course_lib.gpu_static import targets

    t = targets.TARGETS
    assert {75, 80, 86, 89, 90, 100, 120} <= set(t)
    assert t[75].smem_per_block == 64 * 1024 and not t[75].bf16
    assert t[86].smem_per_block == t[89].smem_per_block == t[120].smem_per_block == 99 * 1024
    # 8 warps at 255 registers: one CTA per SM everywhere; 4 warps at 128: limited by warps on
    # a T4 (32 resident warps), by registers on an H100
    for gpu in t.values():
        assert targets.occupancy(gpu, 255, 48 * 1024, 8)["ctas"] == 1
    assert targets.occupancy(t[75], 128, 1024, 4) == dict(
        ctas=4, warps_per_sm=16, occupancy=0.5, limiter="regs", smem_ok=True
    )
    assert targets.occupancy(t[75], 32, 1024, 8)["limiter"] == "warps"
    assert not targets.occupancy(t[86], 128, 100 * 1024, 4)["smem_ok"]


# -- the speed goals and README's section, from a report ------------------------------------------


def _modelled(family, features, head_dim, plain_x_no, *, causal=True, local=0, sb=None, work=1.0):
    e = dict(family=family, features=features, causal=causal, head_dim=head_dim, dtype="bf16",
             plain_x_no=plain_x_no, plain_x=plain_x_no + 0.1, total_x_no=plain_x_no,
             total_x=plain_x_no + 0.1, workspace_bwd=work, bounds={"forward": "tc"},
             occupancy={"forward": dict(ctas=1, warps=8, regs=255, barriers=3, stages=2,
                                        local=local)})  # fmt: skip
    if sb is not None:
        e["sb_total_x"] = sb
    return e


def test_goals_are_judged_on_the_worst_row_and_say_by_how_much_they_miss():
    from course_lib.gpu_static import goals

    rep = {"model": [
        _modelled("flash", "plain", 64, 1.0, work=2.0),
        _modelled("flash", "tables", 64, 0.95),
        _modelled("flash", "tables", 128, 0.80),
        _modelled("stick", "tables+gain+linear_distance(grad)", 64, 0.3, sb=1.1, work=3.2),
        _modelled("stick", "tables+gain+offset_linear_distance(grad)", 64, 0.3, sb=0.9, local=7),
        _modelled("stick", "plain", 64, 0.5, causal=False, work=4.0),
    ]}  # fmt: skip
    rope = [g for g in goals.GOALS if g.rows == (("flash", "tables"),)]
    verdicts = {v["head_dim"]: v for v in goals.judge(rep, rope)}
    assert verdicts[64]["met"] and verdicts[64]["short_by"] == 0
    assert not verdicts[128]["met"] and verdicts[128]["short_by"] == pytest.approx(1 / 1.1 - 0.8)
    (rse,) = [g for g in goals.GOALS if g.metric == "sb_total_x"]
    v64, v128 = goals.judge(rep, [rse])
    # the worse of RSE's two penalties decides; a head_dim the report lacks is not "met"
    assert v64["value"] == 0.9 and "offset" in v64["row"] and not v64["met"]
    assert v128["value"] is None and not v128["met"]
    # every goal names rows the report's feature sets produce
    from course_lib.gpu_static import variants

    labels = {
        (fam, f.label) for fam in ("flash", "stick") for f in variants.feature_sets(False, fam)
    }
    assert {row for g in goals.GOALS for row in g.rows} <= labels
    (spill,) = goals.loop_spills(rep)
    assert spill["local"] == 7 and spill["kernel"] == "forward"
    ratios = {(r["row"], r["causal"]): r["ratio"] for r in goals.workspace_ratios(rep)}
    assert ratios[("stick tables+gain+linear_distance(grad)", True)] == pytest.approx(1.6)
    assert ("stick plain", False) not in ratios  # no bidirectional flash row to compare with


def test_readme_states_what_the_committed_report_says():
    """README's static-model section is generated from figures/gpu_report.json, which covers
    every target and has no failure."""
    from course_lib.gpu_static import readme, targets
    from course_lib.readme_sections import README, section

    rep = json.loads(readme.REPORT.read_text())
    assert section(readme.SECTION, readme.render(rep)) in README.read_text(), (
        "README's static-model section is out of date: run `python -m course_lib.gpu_static.readme`"
    )
    assert {r["arch"] for r in rep["compiles"]} == set(targets.TARGETS)
    assert not rep["failures"] and all(r["ok"] and r["smem_ok"] for r in rep["compiles"])
    assert all("error" not in e and "plain_x_no" in e for e in rep["model"])


def test_the_per_distance_table_is_read_four_diagonals_at_a_time():
    """The per-distance table reaches the kernels laid out so that four consecutive keys of a
    tile's row are one 16-byte load (``kernels/score_bias.py::diagonal_layout``). In the
    committed report, the sm_90 forward and dQ loops of flash's per-distance row issue fewer
    memory instructions per iteration beyond plain flash's than each thread holds pairs of the
    tile; a table read along ``i - j`` (addresses running backwards) took one per pair and more.
    The fewest of each kernel's loops is compared: the loop of unmasked tiles."""
    from course_lib.gpu_static import readme

    rep = json.loads(readme.REPORT.read_text())
    compiles = {
        (c["features"], c["head_dim"], c["kernel"]): c
        for c in rep["compiles"]
        if (c["family"], c["arch"], c["causal"], c["dtype"]) == ("flash", 90, True, "bf16")
    }
    for head_dim in (64, 128):
        for kernel in ("forward", "dq"):
            plain = compiles[("plain", head_dim, kernel)]
            table = compiles[("tables+gain+diagonal_table(grad)", head_dim, kernel)]
            rows, cols = (int(x) for x in table["tiles"].split("x"))
            pairs_per_thread = rows * cols // (32 * table["warps"])
            fewest = min(lp["counts"]["mem"] for lp in table["loops"])
            extra = fewest - min(lp["counts"]["mem"] for lp in plain["loops"])
            assert extra < pairs_per_thread, (head_dim, kernel, extra, pairs_per_thread)
