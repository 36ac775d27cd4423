"""``python -m course_lib.gpu_check`` on a CPU: its plan, its checks (the kernels in Triton's
interpreter, through the same code), its comparisons and verdicts with a fake GPU and timer,
its report and figure, its notebook and training phases, and its refusal without a GPU."""

import json
import math
import shutil
import warnings

import pytest
import torch

from course_lib.gpu_check import cases, cli, correctness, notebooks, report, speed, training
from course_lib.gpu_check import device as speed_device
from course_lib.gpu_check.device import Device
from course_lib.registry import attention_methods
from course_lib.runtime import KERNEL_MODE

needs_kernels = pytest.mark.skipif(
    KERNEL_MODE == "unavailable", reason="Triton is not installed (no wheels on this platform)"
)


class FakeDevice(Device):
    """A GPU that is the CPU, with a timer that returns the times it is given, in order, and
    never runs the step (so a test times nothing)."""

    def __init__(self, capability=(9, 0), times=None):
        super().__init__("Fake GPU 9000", capability, 80 * 2**30, torch.device("cpu"))
        self.times = list(times or [])
        self.calls = 0
        self.host_repeats = []

    def measure(self, step, leaves):
        self.calls += 1
        ms = self.times.pop(0) if self.times else 1.0
        return ms, 2**20

    def host(self, step, leaves, repeats=0):
        self.host_repeats.append(repeats)
        return 0.25, 0


def _args(*argv):
    return cli.parse_args(list(argv))


# -- the plan -----------------------------------------------------------------------------------


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "gpu_report" in err
    # a GPU whose kernels are not compiled in this process (TRITON_INTERPRET=1) is refused too
    import course_lib.runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(course_lib.runtime, "kernel_mode", lambda: "interpreter")
    assert cli.main([]) == 2
    assert "TRITON_INTERPRET=1 is set" in capsys.readouterr().err
    # an AMD GPU: the kernels are NVIDIA-only, and the reason is the runtime's own
    monkeypatch.setattr(course_lib.runtime, "kernel_mode", lambda: "unavailable")
    monkeypatch.setattr(course_lib.runtime, "KERNEL_MODE", "unavailable")
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "not compiled" in err and "AMD GPU (ROCm)" in err and "unset" not in err


def test_the_plan_follows_the_registry_and_the_gpu():
    names = set(attention_methods())
    causal_only = {n for n, e in attention_methods().items() if e is not None and e.causal_only}
    h100 = cli.make_plan(FakeDevice((9, 0)), _args("--skip", "notebooks", "training"))
    assert {c.method for c in h100.correctness} == names == {c.method for c in h100.speed}
    assert {c.dtype for c in h100.correctness} == {"fp32", "fp16", "bf16"}
    assert {(c.causal, c.method) for c in h100.correctness if not c.causal}.isdisjoint(
        {(False, n) for n in causal_only}
    )
    assert {c.head_dim for c in h100.correctness} == {64, 128}
    assert {c.seq for c in h100.correctness} == {200, 256}  # ragged, and aligned
    assert {c.dtype for c in h100.speed} == {"bf16"} and all(c.causal for c in h100.speed)
    assert {(c.seq, c.head_dim) for c in h100.speed} == {(n, d) for n in (1024, 4096, 8192)
                                                       for d in (64, 128)}  # fmt: skip
    assert h100.training is None and not h100.notebooks
    # a T4: no bf16 anywhere, the speed phase and training in fp16
    t4 = cli.make_plan(FakeDevice((7, 5)), _args("--quick", "--skip", "notebooks"))
    assert "bf16" not in {c.dtype for c in t4.correctness}
    assert {c.dtype for c in t4.speed} == {"fp16"} and {c.head_dim for c in t4.speed} == {64}
    assert t4.training.train.autocast_dtype == "float16" and t4.training.train.steps == 100
    with pytest.raises(SystemExit):
        _args("--seqs", "0")
    # --methods: only those cases; training only the ones that are sequence encodings
    some = cli.make_plan(FakeDevice((9, 0)), _args("--quick", "--methods", "fox", "softmax"))
    assert (
        {c.method for c in some.correctness} == {c.method for c in some.speed} == {"fox", "softmax"}
    )
    assert some.training_encodings == ("fox",)
    with pytest.raises(SystemExit, match="unknown method"):
        cli.make_plan(FakeDevice((9, 0)), _args("--methods", "fxo"))


# -- correctness ----------------------------------------------------------------------------------


@needs_kernels
def test_a_case_compares_outputs_and_every_gradient_and_catches_a_wrong_kernel(monkeypatch):
    """T5 (a learned table) in fp32 in the interpreter, through ``attention()``: the output,
    dq, dk, dv and the table's gradient agree; a kernel off by 1% is reported wrong."""
    case = correctness.CorrectnessCase("t5", "fp32", True, 16, seq=21, batch=1, heads=2)
    row = correctness.check_case(case, torch.device("cpu"))
    assert row["status"] == "ok", row
    assert set(row["errors"]) == {"out", "dq", "dk", "dv", "dbias_table"}
    assert row["worst"] <= correctness.TOLERANCE["fp32"]

    import course_lib.attention

    original = course_lib.attention.attention

    def off_by_one_percent(*args, backend="reference", **kw):
        out = original(*args, backend=backend, **kw)
        return out * 1.01 if backend == "triton" else out

    monkeypatch.setattr(course_lib.attention, "attention", off_by_one_percent)
    row = correctness.check_case(case, torch.device("cpu"))
    assert row["status"] == "wrong" and row["errors"]["out"] > correctness.TOLERANCE["fp32"]


def test_a_case_that_raises_is_an_error_with_its_message(monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("this GPU has 64 KiB of shared memory per block")

    monkeypatch.setattr(cases, "make_inputs", refuse)
    monkeypatch.setattr(correctness, "make_inputs", refuse)
    case = correctness.CorrectnessCase("softmax", "fp16", False, 64)
    row = correctness.check_case(case, torch.device("cpu"))
    assert row["status"] == "error" and "64 KiB" in row["reason"]


def test_16_bit_cases_pass_within_twice_the_frameworks_own_rounding(monkeypatch):
    """fp16/bf16: a tensor above the fixed tolerance still agrees when PyTorch's reference in the
    same dtype is off by at least half as much; above both it is wrong."""
    monkeypatch.setattr(correctness, "make_inputs", lambda *a, **k: _Inputs())
    exact = {"out": torch.ones(4), "dlog_forget": torch.ones(4)}

    def run(kernel_error, framework_error):
        def fake(case, inputs, backend, dtype, param_dtype):
            if backend == "triton":
                return {"out": exact["out"], "dlog_forget": exact["dlog_forget"] + kernel_error}
            if dtype == torch.float64:
                return dict(exact)
            return {"out": exact["out"], "dlog_forget": exact["dlog_forget"] + framework_error}

        monkeypatch.setattr(correctness, "_forward_backward", fake)
        case = correctness.CorrectnessCase("softmax", "bf16", True, 64)
        return correctness.check_case(case, torch.device("cpu"))

    assert run(0.01, 0.0)["status"] == "ok"  # inside the fixed tolerance
    assert run(0.03, 0.02)["status"] == "ok"  # 0.03 <= 2 x 0.02
    row = run(0.05, 0.02)
    assert row["status"] == "wrong" and row["framework_errors"]["dlog_forget"] == 0.02


class _Inputs:
    q = torch.zeros(1, dtype=torch.bfloat16)


# -- speed ----------------------------------------------------------------------------------------


def test_flex_moves_to_smaller_tiles_when_the_gpu_lacks_shared_memory():
    tried = []

    def call(q, k, v, options):
        tried.append(options)
        if options != speed.FLEX_OPTIONS[-1]:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource")
        return q

    run = speed.flex_with_smaller_tiles_on_demand(call)
    assert run.options is None  # FlexAttention's own choice until it fails
    assert run(1, 2, 3) == 1 and run(4, 5, 6) == 4
    assert tried == list(speed.FLEX_OPTIONS) + [speed.FLEX_OPTIONS[-1]]  # kept once it compiled
    assert run.options == speed.FLEX_OPTIONS[-1]  # what the record will say it ran with

    def broken(q, k, v, options):
        raise ValueError("a score_mod bug")

    with pytest.raises(ValueError, match="score_mod bug"):
        speed.flex_with_smaller_tiles_on_demand(broken)(1, 2, 3)


class _CountingFlex:
    """``torch.compile`` and ``create_block_mask`` that count, and a "compiled" FlexAttention
    that records what it is given and returns ``v``."""

    def __init__(self):
        self.compile_calls, self.mask_calls, self.calls = [], [], []

    def compile(self, fn, **kwargs):
        self.compile_calls.append(kwargs)

        def compiled(q, k, v, *, score_mod, block_mask, kernel_options):
            self.calls.append((score_mod, block_mask, kernel_options))
            return v

        return compiled

    def create_block_mask(self, mask_mod, b, h, q_len, kv_len, device):
        self.mask_calls.append((q_len, kv_len, str(device)))
        return ("mask", q_len, kv_len)


def test_the_flex_baseline_compiles_once_and_builds_each_causal_mask_once(monkeypatch):
    """Every FlexAttention of a run (each method with a distance bias, and the sanity row) at
    every length and in both modes goes through one ``torch.compile`` (``fullgraph``, static
    shapes) and one causal BlockMask per length; bidirectional attention takes none."""
    from torch.nn.attention.flex_attention import flex_attention

    fake = _CountingFlex()
    baseline = speed.FlexBaseline(flex_attention, fake.create_block_mask, compile=fake.compile)
    monkeypatch.setattr(speed, "_FLEX", [baseline])
    flex_methods = ("alibi", "t5", "exposb", "kerple")
    for causal in (True, False, True):
        for seq in (16, 32):
            fns = []
            for name in flex_methods:
                enc = attention_methods()[name]
                inputs = cases.make_inputs(enc, batch=1, heads=2, seq=seq, head_dim=16,
                                           dtype="fp32", device="cpu")  # fmt: skip
                label, fn = speed.alternative(enc, inputs, causal)
                assert speed.is_flex(label) and callable(fn), (name, label, fn)
                fns.append((fn, inputs))
            plain = cases.make_inputs(None, batch=1, heads=2, seq=seq, head_dim=16, dtype="fp32",
                                      device="cpu")  # fmt: skip
            label, fn = speed.sanity_contender(plain, causal)
            assert label == speed.FLEX_SANITY
            fns.append((fn, plain))
            before = len(fake.calls)
            for fn, inputs in fns:
                for _ in range(2):
                    assert fn(inputs.q, inputs.k, inputs.v) is inputs.v
            masks = {id(mask) for _, mask, _ in fake.calls[before:]}
            expected = ("mask", seq, seq) if causal else None
            assert all(mask == expected for _, mask, _ in fake.calls[before:])
            assert len(masks) == 1  # one mask object shared by every method at this length
    assert fake.compile_calls == [dict(dynamic=False, fullgraph=True)] and baseline.compiles == 1
    assert fake.mask_calls == [(16, 16, "cpu"), (32, 32, "cpu")] and baseline.masks_built == 2
    # the sanity row has no score_mod; ALiBi's has its slope form, T5's reads its table
    assert fake.calls[-1][0] is None
    assert [fn.score_mod for fn, _ in fns[:2]] == ["slope per head x distance",
                                                   "table per distance"]  # fmt: skip


def test_a_records_speed_variants_are_timed_beside_its_defaults_and_labelled():
    # CoPE's default table is as long as the sequence; the course trains it with 64 positions
    plan = speed.speed_cases((1024, 4096), (64,), "bf16")
    cope = [c for c in plan if c.method == "cope"]
    assert [c.label for c in cope] == ["cope", "cope npos=64"] * 2
    assert sum(c.options == () for c in plan) == len(attention_methods()) * 2
    enc = attention_methods()["cope"]
    tables = {}
    for case in cope[:2]:
        inputs = cases.make_inputs(enc, batch=1, heads=2, seq=case.seq, head_dim=16,
                                   dtype="fp32", device="cpu", module_options=dict(case.options))  # fmt: skip
        tables[case.label] = tuple(inputs.params["position_embeddings"].shape)
    assert tables == {"cope": (4096, 16), "cope npos=64": (64, 16)}  # the longest length first
    assert [c.seq for c in plan] == sorted((c.seq for c in plan), reverse=True)
    assert speed._record(cope[1], "kernel", "fwd")["method"] == "cope npos=64"
    # every record's variants are arguments its module takes
    for enc in attention_methods().values():
        for variant in enc.speed_variants if enc else ():
            enc.module(64, 4, max_position_embeddings=512, **variant)


def test_a_bias_of_alibis_form_is_one_slope_per_head_and_others_are_tables():
    enc = attention_methods()["alibi"]
    inputs = cases.make_inputs(enc, batch=1, heads=4, seq=8, head_dim=16, dtype="fp32",
                               device="cpu")  # fmt: skip
    params = speed._full_params(enc, inputs, True)
    table = speed.distance_table(enc, params, 4, 8, "cpu")
    for causal in (True, False):
        torch.testing.assert_close(speed.slope_per_distance(table, causal), -params["slopes"])
    t5 = attention_methods()["t5"]
    inputs = cases.make_inputs(t5, batch=1, heads=4, seq=40, head_dim=16, dtype="fp32",
                               device="cpu")  # fmt: skip
    params = speed._full_params(t5, inputs, True)
    assert speed.slope_per_distance(speed.distance_table(t5, params, 4, 40, "cpu"), True) is None
    # a bias linear only on the side causal attention sees is still a slope there
    distance = torch.arange(15) - 7
    one_sided = torch.where(distance <= 0, 0.5 * distance.abs(), 3.0).float()[None]
    torch.testing.assert_close(speed.slope_per_distance(one_sided, True), torch.tensor([0.5]))
    assert speed.slope_per_distance(one_sided, False) is None


def test_sdpa_records_the_backend_that_ran():
    """``torch._fused_sdp_choice`` (what SDPA calls to pick its kernel), confirmed by running SDPA
    restricted to it: on this CPU, restricted to math, it says math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = torch.randn(3, 1, 2, 32, 16).unbind(0)
    for grad in (False, True):
        name = speed.sdpa_backend(q, k, v, causal=True, requires_grad=grad)
        assert name in ("flash", "efficient", "cudnn", "math"), name
    with sdpa_kernel([SDPBackend.MATH]):
        assert speed.sdpa_backend(q, k, v, causal=True) == "math"


def test_alternatives_come_from_the_records():
    """Plain: SDPA; a transform: transform + SDPA; a distance bias: FlexAttention (its table
    checked by shifting); stick-breaking and content or score biases: none, said why."""
    chosen = {}
    for name, encoding in attention_methods().items():
        inputs = cases.make_inputs(encoding, batch=1, heads=2, seq=16, head_dim=16, dtype="fp32",
                                   device="cpu")  # fmt: skip
        label, fn = speed.alternative(encoding, inputs, causal=True)
        chosen[name] = (label, fn)
        if encoding is None:
            assert label == "SDPA"
        elif encoding.normaliser != "softmax":
            assert isinstance(fn, str) and "stick-breaking" in fn
        elif encoding.score_bias is None and encoding.score_bias_from_scores is None:
            assert label.endswith("SDPA") and callable(fn)
            if encoding.qk_transform is not None:  # the record's transform, then SDPA
                expected = torch.nn.functional.scaled_dot_product_attention(
                    *(encoding.qk_transform(x, inputs.positions[None], speed._full_params(
                        encoding, inputs, True)).float() for x in (inputs.q, inputs.k)),
                    inputs.v, is_causal=True)  # fmt: skip
                torch.testing.assert_close(fn(inputs.q, inputs.k, inputs.v), expected)
    assert chosen["softmax"][0] == "SDPA"
    assert chosen["alibi"][0] == "FlexAttention" and callable(chosen["alibi"][1])
    assert chosen["t5"][0] == "FlexAttention" and callable(chosen["t5"][1])
    assert isinstance(chosen["fox"][1], str)  # its bias comes from content


def test_a_distance_table_is_the_records_bias_and_a_position_bias_is_refused():
    enc = attention_methods()["alibi"]
    inputs = cases.make_inputs(enc, batch=1, heads=4, seq=8, head_dim=16, dtype="fp32",
                               device="cpu")  # fmt: skip
    params = speed._full_params(enc, inputs, True)
    table = speed.distance_table(enc, params, 4, 8, "cpu")
    slopes = params["slopes"]
    distance = torch.arange(15) - 7  # j - i
    torch.testing.assert_close(table, -slopes[:, None] * distance.abs()[None].float())

    class Absolute:  # a bias that reads the query's own position, wrongly claimed distance-only
        uses_positions, position_dims, distance_only = True, 1, True

        @staticmethod
        def score_bias(q_pos, k_pos, params):
            return (q_pos[..., None] * 0.1 + 0 * k_pos[:, None, :]).unsqueeze(1)

    assert "more than the distance" in speed.distance_table(Absolute, {}, 4, 8, "cpu")
    Absolute.distance_only = False  # the record's own word is taken first
    assert "not a function of the distance" in speed.distance_table(Absolute, {}, 4, 8, "cpu")


def test_speed_records_and_ratios_with_a_fake_timer():
    device = FakeDevice((9, 0))
    plan_cases = speed.speed_cases((32,), (16,), "fp32", tokens=64, hidden=32)
    assert all((c.batch, c.heads) == (2, 2) for c in plan_cases)
    records = speed.run_speed(device, plan_cases)
    by = {(r["method"], r["contender"], r["pass_"]): r for r in records}
    assert device.calls == sum(r["ms"] is not None for r in records)
    assert by[("softmax", "SDPA", "fwd")]["ms"] == 1.0
    for name in attention_methods():
        kernel = by[(name, "kernel", "fwd+bwd")]
        assert kernel["status"] == "ok" or kernel["status"].startswith("no kernel"), kernel
    # ratios: SDPA's time / the record's; the alternative's / the kernel's
    rows = [
        dict(method="softmax", contender="SDPA", ms=2.0),
        dict(method="softmax", contender="kernel", ms=1.0),
        dict(method="alibi", contender="kernel", ms=4.0),
        dict(method="alibi", contender="FlexAttention", ms=8.0),
        dict(method="rse", contender="kernel", ms=5.0),
        dict(method="rse", contender="-", ms=None),
    ]
    for r in rows:
        r.update(head_dim=64, seq=1024, causal=True, dtype="bf16", pass_="fwd+bwd")
    speed.add_ratios(rows)
    assert [r["vs_sdpa"] for r in rows] == [1.0, 2.0, 0.5, 0.25, 0.4, None]
    # no sanity row: the comparison with FlexAttention is withheld, the measured ratio kept aside
    assert [r["vs_alternative"] for r in rows] == [None, 2.0, None, None, None, None]
    assert rows[2]["vs_alternative_unreliable"] == 2.0 and "no sanity row" in rows[2][
        "alternative_unreliable"]  # fmt: skip
    for flex_ms, shown in ((2.5, 2.0), (5.0, None)):  # 0.8x SDPA passes, 0.4x does not
        sane = [dict(r) for r in rows] + [
            dict(rows[0], method="softmax", contender=speed.FLEX_SANITY, ms=flex_ms)
        ]
        speed.add_ratios(sane)
        assert sane[2]["vs_alternative"] == shown
    # the run's own records: SDPA says which backend ran, FlexAttention which tiles
    sdpa = [r for r in records if r["contender"] == "SDPA"]
    assert sdpa and all(r["sdpa_backend"] for r in sdpa)
    flex = [r for r in records if speed.is_flex(r["contender"]) and r["ms"] is not None]
    assert {r["method"] for r in flex} >= {"softmax", "alibi", "t5"}
    assert all("flex_options" in r and r["flex_score_mod"] for r in flex)
    assert {r["contender"] for r in records if r["method"] == "softmax"} == {
        "kernel", "SDPA", speed.FLEX_SANITY}  # fmt: skip


# -- notebooks and training ---------------------------------------------------------------------


def test_kernel_notebooks_are_found_not_listed(tmp_path):
    root = notebooks.checkout_root()
    found = notebooks.kernel_notebooks(root)
    assert found and all(notebooks.MARK in p.read_text() for p in found)
    assert "01b_flash_attention.ipynb" in {p.name for p in found}
    (tmp_path / "notebooks").mkdir()

    def write(name, source):
        cell = {"cell_type": "code", "source": [source], "metadata": {}, "outputs": [],
                "execution_count": None}  # fmt: skip
        nb = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        (tmp_path / "notebooks" / name).write_text(json.dumps(nb))

    write("a.ipynb", "if timings_available():\n    pass")
    write("b.ipynb", "print(1)")
    assert [p.name for p in notebooks.kernel_notebooks(tmp_path)] == ["a.ipynb"]


def test_notebooks_run_under_nbval_in_parallel_and_report_failures(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = "-p no:cacheprovider --nbval --nbval-current-env"\n'
    )
    (tmp_path / "notebooks").mkdir()

    def write(name, printed):
        cell = {"cell_type": "code", "source": ["print(1 + 1)"], "metadata": {},
                "execution_count": 1,
                "outputs": [{"name": "stdout", "output_type": "stream", "text": [printed]}]}  # fmt: skip
        nb = {"cells": [cell], "metadata": {"kernelspec": {"name": "python3",
              "display_name": "Python 3 (ipykernel)", "language": "python"}},
              "nbformat": 4, "nbformat_minor": 5}  # fmt: skip
        path = tmp_path / "notebooks" / name
        path.write_text(json.dumps(nb))
        return path

    paths = [write("good.ipynb", "2\n"), write("bad.ipynb", "3\n")]
    rows = notebooks.run_notebooks(paths, tmp_path, workers=2, timeout=300)
    assert [(r["notebook"], r["status"]) for r in rows] == [
        ("good.ipynb", "passed"),
        ("bad.ipynb", "failed"),
    ]
    assert "bad.ipynb" in rows[1]["output_tail"]


def test_training_rows_say_whether_a_run_trained():
    def result(arm, losses, val):
        return dict(arm=arm, curves={"train": {"loss": losses}},
                    metrics={"final_val_loss": val,
                             "tokens_per_second_during_run": 10.0})  # fmt: skip

    rows = training.training_rows([
        result("a", [5.0, 4.0], 4.1), result("b", [5.0, 5.5], 5.4), result("c", [5.0, math.nan], 4.0),
    ])  # fmt: skip
    assert [r["status"] for r in rows] == ["trained", "loss did not fall", "not finite"]


def test_a_short_run_of_a_preset_trains():
    from course_lib.compare.presets import PRESETS

    preset = training.short_preset(PRESETS["tiny"], 5)
    assert preset.train.steps == 5 and preset.seeds == (0,) and preset.probes == ()
    assert preset.objectives == ("clm",) and preset.ablations == ()
    rows = training.run_training(preset, encodings=("alibi",))
    assert [(r["arm"], r["status"]) for r in rows] == [("alibi", "trained")], rows


# -- the whole run and its report ----------------------------------------------------------------


@needs_kernels
def test_a_run_writes_one_report_and_one_figure_named_by_the_device(tmp_path, capsys):
    device = FakeDevice((8, 6), times=[3.0, 6.0, 1.5, 3.0, 2.0, 4.0, 1.0, 2.0])
    plan = cli.Plan(
        correctness=[
            correctness.CorrectnessCase("softmax", "fp32", True, 16, seq=21, batch=1, heads=2)
        ],  # fmt: skip
        speed=speed.speed_cases((32,), (16,), "fp32", tokens=64, hidden=32)[:2],
    )
    rep = cli.run_check(device, plan)
    assert rep["summary"]["ok"], rep["summary"]
    assert rep["meta"]["device"]["name"] == "Fake GPU 9000"
    assert set(rep["meta"]["seconds"]) == {"correctness", "speed", "total"}
    # the speed phase's tiles: tuned on a GPU (the fake one runs the interpreter: nothing to time)
    assert rep["meta"]["tiles"] == "tuned on this GPU" and rep["tuning"] == []
    paths = report.write_report(rep, tmp_path, device.slug)
    assert [p.name for p in paths] == ["fake_gpu_9000.json", "fake_gpu_9000.png"]
    saved = json.loads(paths[0].read_text())
    assert saved["correctness"][0]["status"] == "ok" and saved["speed"]
    lines = report.format_summary(saved)
    assert lines[-1] == "RESULT: OK" and any("vs SDPA" in line for line in lines)


@needs_kernels
def test_a_run_leaves_a_whole_report_after_each_phase_and_each_speed_case(tmp_path):
    """A run stopped early (a time limit, a lost machine) still leaves what it measured: the
    progress callback gets a labelled partial report after the correctness phase and after each
    speed case but the last, and writing one never leaves half a file."""
    device = FakeDevice((8, 6), times=[3.0, 6.0, 1.5, 3.0, 2.0, 4.0, 1.0, 2.0] * 2)
    plan = cli.Plan(
        correctness=[
            correctness.CorrectnessCase("softmax", "fp32", True, 16, seq=21, batch=1, heads=2)
        ],  # fmt: skip
        speed=speed.speed_cases((32,), (16,), "fp32", tokens=64, hidden=32)[:3],
    )
    seen = []

    def save(partial):
        report.write_report(partial, tmp_path, device.slug, figure=False)
        seen.append(json.loads((tmp_path / f"{device.slug}.json").read_text()))

    rep = cli.run_check(device, plan, save)
    assert [p["meta"]["unfinished"] for p in seen] == [
        ["speed"], ["speed (2 of 3 cases left)"], ["speed (1 of 3 cases left)"], [],
    ]  # fmt: skip
    assert "speed" not in seen[0] and seen[0]["correctness"][0]["status"] == "ok"
    assert (
        len({r["method"] for r in seen[1]["speed"]}) == 1 and "speed" in seen[1]["meta"]["seconds"]
    )
    lines = report.format_summary(seen[1])
    assert lines[-2] == "PARTIAL: the run stopped before speed (2 of 3 cases left)"
    assert lines[-1] == "RESULT: OK so far"
    assert seen[-1]["speed"] == json.loads(json.dumps(rep["speed"], default=str))
    assert report.format_summary(rep)[-1] == "RESULT: OK" and not rep["summary"]["unfinished"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{device.slug}.json"]


@needs_kernels
def test_no_tune_times_the_static_tiles_and_says_so(monkeypatch):
    """``--no-tune``: the speed phase runs with tuning off (``kernels/tuning.py``), and the
    report's meta says which tiles were timed."""
    from course_lib.kernels import tuning

    plan = cli.make_plan(FakeDevice((9, 0)), _args("--quick", "--no-tune", "--skip", "notebooks"))
    assert not plan.tune and cli.make_plan(FakeDevice((9, 0)), _args("--quick")).tune
    seen = []
    monkeypatch.setattr(
        speed,
        "run_speed",
        lambda device, cases, after_case=None: (
            seen.append(tuning.active(torch.device("cuda"))) or []
        ),
    )
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    small = cli.Plan(speed=plan.speed[:1], tune=False)
    rep = cli.run_check(FakeDevice((9, 0)), small)
    assert seen == [False] and rep["meta"]["tiles"] == "static (--no-tune)"
    rep = cli.run_check(FakeDevice((9, 0)), cli.Plan(speed=plan.speed[:1]))
    assert seen == [False, True] and rep["meta"]["tiles"] == "tuned on this GPU"


def test_verdicts_fail_on_a_wrong_kernel_a_failed_notebook_or_a_run_that_did_not_train():
    base = {"meta": {"device": {"name": "X", "capability": "9.0"}, "seconds": {"total": 1200}}}
    good_case = dict(label="rope bf16 causal D64 N200", method="rope", dtype="bf16", status="ok",
                     worst=0.001, tolerance=0.02, errors={"out": 0.001})  # fmt: skip
    bad_case = dict(good_case, label="t5 bf16 causal D64 N200", status="wrong", worst=0.5,
                    errors={"out": 0.01, "dbias_table": 0.5})  # fmt: skip
    error_case = dict(good_case, status="error", reason="OutOfResources: shared memory")
    rep = dict(base, correctness=[good_case, bad_case, error_case],
               notebooks=[dict(notebook="03_rope.ipynb", status="failed")],
               training=[dict(arm="rope", status="trained"), dict(arm="t5", status="not finite")])  # fmt: skip
    s = report.summarise(rep)
    assert not s["ok"] and s["over_budget"]
    assert s["correctness"]["counts"] == {"ok": 1, "wrong": 1, "error": 1}
    assert any("dbias_table" in f for f in s["correctness"]["failing"])
    assert any("OutOfResources" in f for f in s["correctness"]["failing"])
    assert s["notebooks"]["failing"] == ["03_rope.ipynb: failed"]
    assert s["training"]["failing"] == ["t5: not finite"]
    rep["summary"] = s
    lines = report.format_summary(rep)
    assert lines[-1] == "RESULT: FAIL" and "over the 15-minute plan" in lines[-2]
    # timings never fail a run, and a method with no kernel is not a failure
    ok = dict(base, correctness=[good_case, dict(good_case, status="no kernel", worst=None)],
              speed=[dict(method="rse", contender="kernel", head_dim=64, seq=8192, pass_="fwd+bwd",
                          causal=True, ms=None, peak_mib=None, status="OOM")])  # fmt: skip
    assert report.summarise(ok)["ok"]


def _speed_report(flex_ms: float | None) -> dict:
    """A report of one size: SDPA 1 ms; the sanity row at ``flex_ms`` (None: no such row);
    ALiBi against FlexAttention, ExpoSB against its transform + FlexAttention, RoPE against its
    transform + SDPA."""
    rows = [
        ("softmax", "SDPA", 1.0), ("softmax", "kernel", 1.25),
        ("alibi", "kernel", 1.5), ("alibi", "FlexAttention", 3.0),
        ("exposb", "kernel", 2.0), ("exposb", "transform + FlexAttention", 8.0),
        ("rope", "kernel", 2.0), ("rope", "transform + SDPA", 1.5),
    ]  # fmt: skip
    if flex_ms is not None:
        rows.append(("softmax", speed.FLEX_SANITY, flex_ms))
    records = [
        dict(method=m, contender=c, ms=ms, head_dim=64, seq=4096, batch=4, heads=32, dtype="bf16",
             causal=True, pass_=p, peak_mib=1.0, status="ok")
        for m, c, ms in rows
        for p in speed.PASSES
    ]  # fmt: skip
    for r in records:
        if r["contender"] == "SDPA":
            r["sdpa_backend"] = "flash"
    speed.add_ratios(records)
    rep = {"meta": {"device": {"name": "X", "capability": "9.0"}, "seconds": {"total": 60}},
           "speed": records}  # fmt: skip
    rep["summary"] = report.summarise(rep)
    return rep


@pytest.mark.parametrize("flex_ms", [None, 2.5, 1.1])
def test_flex_comparisons_are_printed_only_when_flex_without_score_mod_keeps_up(flex_ms):
    """Below 0.5x SDPA's speed (2.5 ms against 1 ms), or without the sanity row, every
    comparison with FlexAttention is marked unreliable, not printed as a speed-up; at 0.91x it
    is printed. Comparisons with SDPA are printed either way."""
    rep = _speed_report(flex_ms)
    sp = rep["summary"]["speed"]
    head = {h["method"]: h for h in sp["headline"]}
    lines = report.format_summary(rep)
    text = "\n".join(lines)
    assert sp["sdpa_backend"] == "flash" and "SDPA backend: flash" in text
    assert head["rope"]["vs_alternative"] == pytest.approx(0.75)
    assert "0.75x vs transform + SDPA" in text
    reliable = flex_ms == 1.1
    assert sp["flex_sanity"]["reliable"] is reliable
    for name, ratio in (("alibi", 2.0), ("exposb", 4.0)):
        assert head[name]["alternative_reliable"] is reliable
        assert head[name]["vs_alternative"] == (pytest.approx(ratio) if reliable else None)
        line = next(line for line in lines if f" {name} " in line)
        if reliable:
            assert f"{ratio:.2f}x vs" in line and "unreliable" not in line
        else:
            assert "unreliable" in line and f"{ratio:.2f}x" not in line
    if flex_ms is None:
        assert "no sanity row" in sp["flex_sanity"]["reason"]
    elif not reliable:
        assert "0.40x SDPA's speed" in sp["flex_sanity"]["reason"]
    assert rep["summary"]["ok"]  # timings never fail the check


def test_a_sanity_row_that_was_not_timed_makes_flex_unreliable():
    rep = _speed_report(1.1)
    rows = rep["speed"]
    sanity = [r for r in rows if r["contender"] == speed.FLEX_SANITY]
    sanity[1].update(ms=None, status="error: InductorError: out of resource")
    speed.add_ratios(rows)
    verdict = speed.flex_sanity(rows)
    assert not verdict["reliable"] and "out of resource" in verdict["reason"]
    assert all(r.get("vs_alternative") is None for r in rows
               if r["method"] in ("alibi", "exposb") and r["contender"] == "kernel")  # fmt: skip


def test_the_committed_gpu_reports_and_readme_quote_no_flex_figure_that_fails_the_sanity_row():
    """The committed reports were measured before the sanity row existed: their FlexAttention
    comparisons are unreliable, and README quotes no FlexAttention ratio from them."""
    import re

    root = notebooks.checkout_root()
    reports = sorted((root / "figures" / "gpu_check").glob("*.json"))
    reliable = {}
    for path in reports:
        rep = json.loads(path.read_text())
        if "speed" not in rep:
            continue
        summary = report.summarise(rep)
        reliable[path.name] = summary["speed"]["flex_sanity"]["reliable"]
        for h in summary["speed"]["headline"]:
            if speed.is_flex(h["alternative"]) and not reliable[path.name]:
                assert h["vs_alternative"] is None, (path.name, h)
            if h["method"] == "fox":  # no FlexAttention form, nothing timed: nothing to judge
                assert "alternative_reliable" not in h
    assert reliable, "no committed GPU report with a speed phase"
    readme = (root / "README.md").read_text()
    if all(reliable.values()):
        return
    # every paragraph or bullet that names FlexAttention quotes no ratio or time of it
    for block in re.split(r"\n\s*\n|\n(?=\* )", readme):
        if "FlexAttention" in block:
            flat = " ".join(block.split())
            for clause in re.split(r"[;(]", flat):
                if "FlexAttention" in clause:
                    assert not re.search(r"\d\s*x\b|\d\s*ms\b", clause), clause


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="torch.compile of FlexAttention on a CPU needs a C++ compiler (Inductor's CPU template)",
)
@pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 11),
    reason="PyTorch 2.8's Inductor wrote C++ for FlexAttention on a CPU that g++ 12 refused "
    "(2.11 and 2.13 compile it); on a GPU FlexAttention compiles through Triton instead",
)
def test_the_compiled_flex_baseline_agrees_with_the_reference_on_a_cpu():
    """The baseline as the GPU run builds it (torch.compile, fullgraph, the causal BlockMask),
    compiled for the CPU by Inductor: plain causal attention (the sanity row), ALiBi (its slope
    form) and T5 (its table) give what ``attention(method=...)`` gives. The forward only:
    FlexAttention has no backward on a CPU (it raises NotImplementedError for inputs that
    require grad)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from course_lib.attention import attention

    baseline = speed.FlexBaseline(flex_attention, create_block_mask)
    original = speed._FLEX[:]
    speed._FLEX[:] = [baseline]
    try:
        for name in ("softmax", "alibi", "t5"):
            enc = attention_methods()[name]
            inputs = cases.make_inputs(enc, batch=1, heads=2, seq=128, head_dim=16,
                                       dtype="fp32", device="cpu")  # fmt: skip
            if enc is None:
                label, fn = speed.sanity_contender(inputs, True)
            else:
                label, fn = speed.alternative(enc, inputs, True)
            assert speed.is_flex(label) and callable(fn), (name, fn)
            with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                want = attention(inputs.q, inputs.k, inputs.v, method=name, causal=True,
                                 position_ids=inputs.positions, **inputs.params)  # fmt: skip
                got = fn(inputs.q, inputs.k, inputs.v)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=name)
            assert fn.options is None  # FlexAttention's own tiles
            # fused by Inductor, not the unfused version that materialises the scores
            assert not [w for w in caught if "without torch.compile" in str(w.message)]
    finally:
        speed._FLEX[:] = original
    assert baseline.compiles == 1 and baseline.masks_built == 1


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_with_the_distance_table_computes_the_methods_attention(monkeypatch):
    """The FlexAttention alternative (eager here; compiled on a GPU) with the record's bias per
    distance gives what ``attention(method=...)`` gives, causal and bidirectional."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from course_lib.attention import attention

    eager = speed.FlexBaseline(flex_attention, create_block_mask, compile=lambda f, **kw: f)
    monkeypatch.setattr(speed, "_FLEX", [eager])
    timed = 0
    for name, encoding in attention_methods().items():
        for causal in (True, False):
            if encoding is not None and encoding.causal_only and not causal:
                continue
            inputs = cases.make_inputs(encoding, batch=2, heads=2, seq=24, head_dim=16,
                                       dtype="fp32", device="cpu")  # fmt: skip
            label, fn = speed.alternative(encoding, inputs, causal)
            if not label.endswith("FlexAttention") or isinstance(fn, str):
                continue
            timed += 1
            with torch.no_grad():
                want = attention(inputs.q, inputs.k, inputs.v, method=name, causal=causal,
                                 position_ids=inputs.positions, **inputs.params)  # fmt: skip
                got = fn(inputs.q, inputs.k, inputs.v)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"{name} {causal}")
    assert timed >= 4  # ALiBi, T5 and ExpoSB's distance factor, at least


# -- the host's share of a call -----------------------------------------------------------------


def test_the_host_time_runs_the_step_and_counts_its_reads_back():
    device = Device("CPU as a device", (9, 0), 2**30, torch.device("cpu"))
    leaf = torch.ones(3, requires_grad=True)
    ran = []

    def step():
        ran.append(leaf.grad)  # cleared before every step
        loss = (leaf * 2).sum()
        loss.backward()
        if bool(loss.detach() > 0):  # one read back
            float(loss.detach())  # and another

    ms, reads = device.host(step, [leaf])
    assert reads == 2 and ms > 0
    assert len(ran) == 1 + speed_device.HOST_REPEATS and all(g is None for g in ran)


def test_kernel_records_say_what_the_call_costs_the_host(monkeypatch):
    # ALiBi's kernel record gets host fields, its alternative's records do not
    monkeypatch.setattr(speed, "flex_baseline", lambda: None)
    case = speed.SpeedCase("alibi", 16, 8, "fp32", 1, 2)
    device = FakeDevice(times=[1.0, 1000.0])  # the kernel's forward, then its backward
    records = speed.measure_case(device, case)
    kernel = [r for r in records if r["contender"] == "kernel"]
    assert device.host_repeats == [speed_device.HOST_REPEATS, 3]  # about 200 ms, 3 at least
    assert [r["pass_"] for r in kernel] == list(speed.PASSES)
    assert all(r["host_ms"] == 0.25 and r["host_reads"] == 0 for r in kernel)
    assert not any("host_ms" in r for r in records if r["contender"] != "kernel")


def test_the_summary_says_what_tuning_gained_over_the_static_tiles():
    """From the tuner's own times: shapes tuned, how often the static tiles (always the first
    candidate) stayed fastest, and the chosen tiles' time over the static ones."""

    def choice(hook, pass_, times, chosen):
        key = ["flash", pass_, "cuda:0", 64, "bfloat16", True, hook, "[]", True, False, True,
               True, False, None, 4096]  # fmt: skip
        return dict(key=key, candidates=[{}] * len(times), times_ms=times,
                    errors=[None] * len(times), chosen=chosen)  # fmt: skip

    choices = [
        choice(None, "forward", [2.0, 1.0, 3.0], 1),
        choice("alibi", "backward", [4.0, 5.0], 0),
        choice("t5", "backward", [None, 8.0, 6.0], 2),  # the static tiles did not fit
        choice(None, "backward", [10.0, 8.0], 1),
    ]
    s = report.tuning_summary(choices)
    assert s["shapes"] == 4 and s["static_kept"] == 1 and s["static_failed"] == 1
    assert s["median"] == pytest.approx(0.8) and s["best"] == pytest.approx(0.5)
    assert s["best_shape"] == "flash forward D64 plain N<=4096"
    rep = {"meta": {"device": {"name": "X", "capability": "9.0"}}, "tuning": choices}
    rep["summary"] = report.summarise(rep)
    line = next(x for x in report.format_summary(rep) if x.startswith("tiles tuned"))
    assert line == (
        "tiles tuned on this GPU: 4 shapes, the static tiles fastest for 1, not runnable for 1; "
        "the chosen tiles' time over the static ones: 0.80 (median), 0.50 at best "
        "(flash forward D64 plain N<=4096)"
    )
