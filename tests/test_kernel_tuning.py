"""Tiles chosen on the GPU (``kernels/tuning.py``): the tuner's choice, its cache and its
errors with a timer written here; the candidates each family offers a GPU (listed on this
machine for planned GPUs, as the static report plans its launches); every candidate's tiles
computing what the static pick computes, in the interpreter; and the course's attention
function tuning through the shared mechanism when a tuner is active.

No GPU is needed: what a GPU would time is replaced by a timer that reports given numbers.
"""

from __future__ import annotations

import json

import pytest
import torch

from course_lib import runtime

pytestmark = pytest.mark.skipif(
    not runtime.kernels_available(), reason="Triton is not installed (it has Linux wheels only)"
)

DEVICE = runtime.kernel_device()
# GPUs of each shared-memory class: Hopper, A100, the 99 KiB class (sm_86), the 64 KiB one (sm_75)
ARCHS = (90, 80, 86, 75)


def _tuning():
    from course_lib.kernels import tuning

    return tuning


class FakeTimer:
    """Milliseconds by candidate name; records what ran."""

    def __init__(self, times: dict[str, float], fail: tuple[str, ...] = ()):
        self.times, self.fail, self.ran = times, fail, []

    def __call__(self, run):
        return run()

    def runner(self):
        from triton.runtime.errors import OutOfResources

        def run(candidate):
            name = candidate["name"]
            self.ran.append(name)
            if name in self.fail:
                raise OutOfResources(300_000, 232_448, "shared memory")
            return self.times[name]

        return run


def test_the_fastest_candidate_is_kept_and_reused_without_timing_again():
    tuning = _tuning()
    timer = FakeTimer({"pick": 2.0, "wide": 1.5, "narrow": 1.8})
    tuner = tuning.Tuner(timer)
    candidates = [{"name": "pick"}, {"name": "wide"}, {"name": "narrow"}]
    key = ("flash", "forward", 64)
    assert tuner.choose(key, candidates, timer.runner()) == {"name": "wide"}
    assert timer.ran == ["pick", "wide", "narrow"]
    assert tuner.choose(key, candidates, timer.runner()) == {"name": "wide"}
    assert timer.ran == ["pick", "wide", "narrow"], "a known key timed its candidates again"
    # another key is timed on its own
    timer.times["pick"] = 1.0
    assert tuner.choose(key + (128,), candidates, timer.runner()) == {"name": "pick"}
    record = tuner.choices()[0].as_record()
    assert record["chosen"] == 1 and record["times_ms"] == [2.0, 1.5, 1.8]
    json.dumps([c.as_record() for c in tuner.choices()])


def test_ties_go_to_the_static_pick_and_a_single_candidate_is_not_timed():
    tuning = _tuning()
    timer = FakeTimer({"pick": 1.0, "other": 1.0})
    tuner = tuning.Tuner(timer)
    assert tuner.choose(("a",), [{"name": "pick"}, {"name": "other"}], timer.runner()) == {
        "name": "pick"
    }
    timer.ran.clear()
    assert tuner.choose(("b",), [{"name": "pick"}], timer.runner()) == {"name": "pick"}
    assert timer.ran == []


def test_tiles_the_gpu_cannot_hold_are_skipped_and_none_at_all_is_an_error():
    tuning = _tuning()
    timer = FakeTimer({"pick": 2.0, "big": 0.5, "small": 3.0}, fail=("big",))
    tuner = tuning.Tuner(timer)
    names = [{"name": n} for n in ("pick", "big", "small")]
    assert tuner.choose(("k",), names, timer.runner()) == {"name": "pick"}
    record = tuner.choices()[0].as_record()
    assert record["times_ms"][1] is None and "OutOfResources" in record["errors"][1]
    timer.fail = ("pick", "big", "small")
    with pytest.raises(RuntimeError, match="none of the 3 tilings"):
        tuner.choose(("other",), names, timer.runner())
    with pytest.raises(ValueError, match="no tiling to choose from"):
        tuner.choose(("empty",), [], timer.runner())


def test_an_error_that_is_not_about_resources_is_raised():
    tuning = _tuning()

    def broken(candidate):
        raise ZeroDivisionError("a bug in a launch")

    tuner = tuning.Tuner(lambda run: run())
    with pytest.raises(ZeroDivisionError):
        tuner.choose(("k",), [{"name": "a"}, {"name": "b"}], broken)


def test_length_buckets_are_powers_of_two():
    tuning = _tuning()
    assert [tuning.length_bucket(n) for n in (1, 16, 17, 1000, 1024, 1025, 4096)] == [
        16, 16, 32, 1024, 1024, 2048, 4096,
    ]  # fmt: skip


def test_tuning_runs_only_on_a_cuda_gpu_and_the_switch_says_what_it_takes(monkeypatch):
    from course_lib.kernels.common import planned_launches

    tuning = _tuning()
    cuda = torch.device("cuda")
    assert not tuning.active(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not tuning.active(cuda)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv(tuning.ENV, raising=False)
    assert tuning.active(cuda)
    with planned_launches(90):
        assert not tuning.active(cuda)
    with tuning.disabled():
        assert not tuning.active(cuda)
    assert tuning.active(cuda)
    monkeypatch.setenv(tuning.ENV, "off")
    assert not tuning.active(cuda)
    monkeypatch.setenv(tuning.ENV, "sometimes")
    with pytest.raises(ValueError, match=r"COURSE_KERNEL_TUNING='sometimes': use one of 1, on"):
        tuning.active(cuda)


def _shape(config) -> tuple:
    return tuple(vars(config).values())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash_candidates_start_with_the_static_pick_and_suit_the_gpu(arch, head_dim):
    from course_lib.kernels import flash
    from course_lib.kernels.common import planned_launches, smem_per_block

    meta = torch.device("meta")
    dtype = torch.float16 if arch < 80 else torch.bfloat16
    with planned_launches(arch):
        small = flash.smem_class(meta) is not None
        assert smem_per_block(meta) > 0
        for biased, per_tile in ((False, False), (True, False), (True, True)):
            fwd = flash.tuning_candidates(
                "forward", head_dim, dtype, meta, causal=True, biased=biased, per_tile=per_tile
            )
            pick = flash.pick_config("forward", head_dim, dtype, meta, bias=biased)
            assert _shape(fwd[0]["config"]) == _shape(pick)
            bwd = flash.tuning_candidates(
                "backward", head_dim, dtype, meta, causal=True, biased=biased, per_tile=per_tile
            )
            picks = {
                kernel: flash.pick_config(
                    kernel, head_dim, dtype, meta, bias=biased,
                    per_tile=per_tile and kernel == "dkdv",
                )
                for kernel in ("dkdv", "dq")
            }  # fmt: skip
            first = bwd[0]["configs"]
            assert all(_shape(first[k]) == _shape(picks[k]) for k in picks)
            dkdv = {_shape(c["configs"]["dkdv"]) for c in bwd}
            dq = {_shape(c["configs"]["dq"]) for c in bwd}
            assert len(bwd) == len(dkdv) * len(dq), "every pair once"
            if per_tile:
                assert all(bn % bm == 0 for bm, bn, *_ in dkdv)
            for kernel, shapes in (("forward", {_shape(c["config"]) for c in fwd}),
                                   ("dkdv", dkdv), ("dq", dq)):  # fmt: skip
                pick = _shape(picks.get(kernel) or fwd[0]["config"])
                assert len(shapes) >= 2, f"sm_{arch} D{head_dim} {kernel}: nothing to compare"
                if small:  # no larger than the pick on a small shared memory
                    assert all(bm * bn <= pick[0] * pick[1] and st <= pick[3]
                               for bm, bn, _, st in shapes)  # fmt: skip


def test_fp32_and_the_interpreter_keep_the_static_pick():
    from course_lib.kernels import flash, stick_breaking
    from course_lib.kernels.common import planned_launches

    for family in (flash, stick_breaking):
        for pass_ in ("forward", "backward"):
            got = family.tuning_candidates(
                pass_, 64, torch.float32, DEVICE, causal=True, biased=True, per_tile=False
            )
            assert len(got) == 1
    with planned_launches(90):
        got = flash.tuning_candidates(
            "backward", 64, torch.float32, torch.device("meta"), causal=True, biased=False,
            per_tile=False,
        )  # fmt: skip
    assert len(got) == 1
    with pytest.raises(ValueError, match="pass_ must be 'forward' or 'backward'"):
        flash.tuning_candidates(
            "both", 64, torch.float32, DEVICE, causal=True, biased=False, per_tile=False
        )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", [True, False])
def test_stick_candidates_fit_and_start_with_the_static_pick(arch, causal):
    from course_lib.kernels import stick_breaking as sb
    from course_lib.kernels.common import planned_launches

    meta = torch.device("meta")
    dtype = torch.float16 if arch < 80 else torch.bfloat16
    with planned_launches(arch):
        for head_dim in (64, 128):
            for biased, square in ((False, False), (True, False), (True, True)):
                pick = sb.pick_config(
                    head_dim, meta, dtype=dtype, causal=causal, square=square, biased=biased
                )
                for pass_ in ("forward", "backward"):
                    got = sb.tuning_candidates(
                        pass_, head_dim, dtype, meta, causal=causal, biased=biased,
                        per_tile=square,
                    )  # fmt: skip
                    configs = [c["config"] for c in got]
                    assert _shape(configs[0]) == _shape(pick)
                    assert len({_shape(c) for c in configs}) == len(configs)
                    for c in configs:
                        if pass_ == "forward":  # the other pass keeps the pick
                            assert (c.block_bwd, c.block_bwd_n) == (
                                pick.block_bwd,
                                pick.block_bwd_n,
                            )
                        else:
                            assert (c.block_m, c.block_n) == (pick.block_m, pick.block_n)
                            assert c.block_bwd % c.block_bwd_n == 0
                            assert not square or c.block_bwd == c.block_bwd_n


def _all_flash_shapes():
    """Every (block_m, block_n) a GPU of :data:`ARCHS` may time, per kernel, at head_dim 64 and
    128, with and without a hook, and for the per-sub-tile gradient."""
    from course_lib.kernels import flash
    from course_lib.kernels.common import planned_launches

    meta = torch.device("meta")
    shapes = {"forward": set(), "dkdv": set(), "dq": set(), "dkdv_per_tile": set()}
    for arch in ARCHS:
        dtype = torch.float16 if arch < 80 else torch.bfloat16
        with planned_launches(arch):
            for head_dim in (64, 128):
                for biased in (False, True):
                    for kernel in ("forward", "dkdv", "dq"):
                        for c in flash.config_candidates(
                            kernel, head_dim, dtype, meta, bias=biased
                        ):
                            shapes[kernel].add((c.block_m, c.block_n))
                for c in flash.config_candidates(
                    "dkdv", head_dim, dtype, meta, bias=True, per_tile=True
                ):
                    shapes["dkdv_per_tile"].add((c.block_m, c.block_n))
    return {kernel: sorted(s) for kernel, s in shapes.items()}


def _flash_inputs(seed=0, seq=83, per_diagonal=False):
    from course_lib.kernels.score_bias import DIAGONAL_TABLE

    from course_lib.kernel_hooks import kernel_positions, resolve_hook

    gen = torch.Generator().manual_seed(seed)
    batch, heads, dim = 1, 2, 16
    q, k, v, up = (torch.randn(batch, heads, seq, dim, generator=gen) for _ in range(4))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[0, -6:] = False
    if per_diagonal:
        hook, params = DIAGONAL_TABLE, torch.randn(1, heads, 2 * seq - 1, generator=gen)
    else:
        hook, params = resolve_hook("linear_distance"), torch.tensor([0.05, 0.3])
    positions = kernel_positions(torch.arange(seq)[None].to(DEVICE))
    x = [t.to(DEVICE) for t in (q, k, v, up)]
    options = dict(causal=True, scale=dim**-0.5, bias_hook=hook, bias_params=params.to(DEVICE))
    return x, positions, mask.to(torch.int8).to(DEVICE), options


def _close(got, want, what):
    for name, g, w in zip(("out/dq", "dk", "dv", "dparams"), got, want, strict=False):
        torch.testing.assert_close(
            g, w, atol=2e-5, rtol=2e-4, msg=lambda m, n=name: f"{what} {n}: {m}"
        )


def test_every_flash_candidate_computes_what_the_static_pick_computes():
    """Each tile shape a GPU may time, forward and both backward kernels, with a learnable
    score bias (and the per-distance table's per-sub-tile gradient), on a ragged causal
    sequence with padded keys: the same output and gradients as the interpreter's tiles."""
    from course_lib.kernels import flash

    shapes = _all_flash_shapes()
    for per_diagonal in (False, True):
        (q, k, v, up), positions, mask, options = _flash_inputs(per_diagonal=per_diagonal)
        out, lse = flash.flash_attention_forward(q, k, v, positions, mask, **options)
        want = flash.flash_attention_backward(
            up, q, k, v, out, lse, positions, mask, bias_grad=True, **options
        )
        if not per_diagonal:
            for bm, bn in shapes["forward"]:
                got, _ = flash.flash_attention_forward(
                    q, k, v, positions, mask, config=flash.FlashConfig(bm, bn), **options
                )
                _close([got], [out], f"forward {bm}x{bn}")
        # each dK/dV shape once and each dQ shape once, paired up (one backward per pair)
        dkdv = shapes["dkdv_per_tile"] if per_diagonal else shapes["dkdv"]
        dq = [None] if per_diagonal else shapes["dq"]
        for i in range(max(len(dkdv), len(dq))):
            pair = {"dkdv": dkdv[i % len(dkdv)], "dq": dq[i % len(dq)]}
            configs = {k: flash.FlashConfig(*shape) for k, shape in pair.items() if shape}
            got = flash.flash_attention_backward(
                up, q, k, v, out, lse, positions, mask, bias_grad=True, configs=configs,
                **options,
            )  # fmt: skip
            _close(got, want, f"backward {pair}")


def test_every_stick_candidate_computes_what_the_static_pick_computes():
    """The stick-breaking tiles a GPU may time (forward and backward shapes of every class of
    :data:`ARCHS`), with RSE's learnable penalty: the same output and gradients as the
    interpreter's tiles."""
    from course_lib.kernels import stick_breaking as sb
    from course_lib.kernels.common import planned_launches

    meta = torch.device("meta")
    forward, backward = set(), set()
    for arch in ARCHS:
        dtype = torch.float16 if arch < 80 else torch.bfloat16
        with planned_launches(arch):
            for head_dim in (64, 128):
                for pass_, found in (("forward", forward), ("backward", backward)):
                    for c in sb.tuning_candidates(
                        pass_, head_dim, dtype, meta, causal=True, biased=True, per_tile=False
                    ):
                        c = c["config"]
                        found.add((c.block_m, c.block_n, c.block_bwd, c.block_bwd_n)[
                            (0 if pass_ == "forward" else 2):(2 if pass_ == "forward" else 4)
                        ])  # fmt: skip
    (q, k, v, up), positions, mask, options = _flash_inputs(seed=1, seq=77)
    out, stats = sb.stick_breaking_forward(q, k, v, positions, mask, **options)
    want = sb.stick_breaking_backward(
        up, q, k, v, stats, positions, mask, bias_grad=True, **options
    )
    for bm, bn in sorted(forward):
        config = sb.StickConfig(bm, bn, 64, 4, 4)
        got, got_stats = sb.stick_breaking_forward(
            q, k, v, positions, mask, config=config, **options
        )
        _close([got, got_stats], [out, stats], f"stick forward {bm}x{bn}")
    for bm, bn in sorted(backward):
        config = sb.StickConfig(64, 64, bm, 4, 4, block_bwd_n=bn)
        got = sb.stick_breaking_backward(
            up, q, k, v, stats, positions, mask, bias_grad=True, config=config, **options
        )
        _close(got, want, f"stick backward {bm}x{bn}")
    with pytest.raises(ValueError, match="give block .* or config .*, not both"):
        sb.stick_breaking_forward(q, k, v, positions, mask, block=32, config=config, **options)


@pytest.mark.parametrize("family_name", ["flash", "stick_breaking"])
def test_the_attention_function_tunes_each_pass_once_through_the_shared_mechanism(
    family_name, monkeypatch
):
    """With a tuner active (as on a CUDA GPU), ``flash_attention`` and
    ``stick_breaking_attention`` time the family's candidates for the forward and the backward
    once per key, keep the fastest, and compute what the static tiles compute."""
    from course_lib.kernels import flash, stick_breaking, tuning

    from course_lib import flash_ops
    from course_lib.flash_ops import flash_attention
    from course_lib.kernel_hooks import ScoreBias
    from course_lib.stick_ops import stick_breaking_attention

    if family_name == "flash":
        family, attend = flash, flash_attention
        tiles = (flash.FlashConfig(16, 32), flash.FlashConfig(32, 16))
    else:
        family, attend = stick_breaking, stick_breaking_attention
        tiles = (stick_breaking.StickConfig(32, 32, 32, 4, 4),
                 stick_breaking.StickConfig(16, 16, 16, 4, 4))  # fmt: skip
    gen = torch.Generator().manual_seed(4)
    q, k, v, up = (torch.randn(1, 2, 45, 16, generator=gen).to(DEVICE) for _ in range(4))
    slopes = torch.tensor([0.1, 0.4], device=DEVICE)

    def run():
        leaves = [t.detach().requires_grad_() for t in (q, k, v, slopes)]
        out = attend(*leaves[:3], causal=True, score_bias=ScoreBias("linear_distance", leaves[3]))
        return [out, *torch.autograd.grad(out, leaves, up)]

    want = run()

    def candidates(pass_, *args, **kwargs):
        if family is flash and pass_ == "backward":
            return [{"configs": {"dkdv": tiles[0], "dq": tiles[1]}},
                    {"configs": {"dkdv": tiles[1], "dq": tiles[0]}}]  # fmt: skip
        return [{"config": t} for t in tiles]

    timed = []

    def timer(launch):
        launch()
        timed.append(len(timed))
        return 1.0 if len(timed) % 2 else 0.5  # the second candidate of each pass is faster

    tuner = tuning.Tuner(timer)
    monkeypatch.setattr(tuning, "_TUNER", tuner)
    monkeypatch.setattr(flash_ops, "_tunes", lambda device: True)  # as on a CUDA GPU
    monkeypatch.setattr(family, "tuning_candidates", candidates)
    got = run()
    assert len(timed) == 4, "two candidates, forward and backward"
    assert {c.key[1]: c.chosen for c in tuner.choices()} == {"forward": 1, "backward": 1}
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-4)
    run()
    assert len(timed) == 4, "a known key was timed again"


def test_compile_only_runs_each_candidate_once_and_keeps_the_static_pick(monkeypatch):
    """What ``gpu_check``'s parallel workers do before the timed phase: every candidate runs once
    (so Triton compiles it), untimed; the pick is kept and nothing is remembered after."""
    tuning = _tuning()
    monkeypatch.setattr(tuning, "_TUNER", tuning.Tuner(lambda run: 1 / 0))  # never timed here
    ran = []
    with tuning.compile_only():
        got = tuning.choose(("k",), [{"name": "pick"}, {"name": "other"}], ran.append)
    assert got == {"name": "pick"} and ran == [{"name": "pick"}, {"name": "other"}]
    assert tuning.choices() == []
