"""The training loop and the encoding comparison, on the tiny preset (CPU, a few minutes).

What is checked: every registered encoding learns (ends well below the unigram baseline); the
word-order probe separates the no-position model from positional ones, with candidates in a
random order and ties counted wrong; an interrupted run resumes to the result of an
uninterrupted one; finished runs are reused, mismatched ones refused; the learning-rate sweep
picks the rate of the lowest selection loss and every arm of an encoding trains at it; seeds
give different runs; ablations build the model they say; RSE's learned penalty and stick bias
can reach the range the report promises under the real optimiser and schedule; the evaluation
scores the same targets every way it reads them; the command line takes names separated by
spaces or commas, refuses unknown ones, logs its sittings and times the arms; the committed
results have at least five seeds of every arm that was run, a complete sweep, and regenerate
README's headline and ``summary.md``; an encoding registered after them is listed as not run
yet, with its command, and changes none of it.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import same_color

import course_lib.train as train_module
from course_lib import compare
from course_lib.compare import (
    PRESETS,
    load_results,
    main,
    run_comparison,
    run_one,
    sweep,
    training_run,
)
from course_lib.compare import runner as compare_runner
from course_lib.compare.arms import ABLATIONS, NotRunYet, arm_names, arms_run, get_arm
from course_lib.compare.claims import (
    Difference,
    _ablation_claims,
    declared_claims,
    questions,
    report_claims,
    untested_questions,
)
from course_lib.compare.figures import plot_position_buckets, write_figures
from course_lib.compare.results import (
    REPO_ROOT,
    describe_runs,
    headline_markdown,
    summary_markdown,
)
from course_lib.data import (
    IGNORE_INDEX,
    MASK_ID,
    comparison_splits,
    retrieval_probe,
    segment_windows,
    word_order_probe,
)
from course_lib.encodings import REGISTRY
from course_lib.encodings.rse import RSEAttention
from course_lib.evaluate import (
    heldout_loss,
    probe_correct,
    probe_inputs,
    shift_and_context_losses,
)
from course_lib.model import MiniBert
from course_lib.registry import register, sequence_encodings, unregister
from course_lib.teaching.comparison_reading import Reading
from course_lib.teaching.stick_reach import (
    NOTEBOOK_RUNS,
    RETRIEVAL_RUNS,
    export_model,
    identity_fingerprint,
    load_model,
    matches_run,
    retrieval_reach,
)
from course_lib.train import (
    learning_rate_at,
    learning_rate_sum,
    load_checkpoint,
    make_optimizer,
)

TINY = PRESETS["tiny"]
COMMITTED = REPO_ROOT / "figures" / "compare_cpu"
# Language-model learning only (no probes): every registered encoding, causal objective.
LEARNING = replace(TINY, probes=())
# The word-order probe only, on the masked objective (where no position means exact chance).
# After the tiny pretraining the probe's fine-tune sits on a plateau at ln 2 for a few hundred
# steps (rope: still at chance after 300, near 1 after 600), so the test gives it 600.
_WORD_ORDER_SPEC = TINY.probes[0]
WORD_ORDER = replace(
    TINY,
    probes=(replace(_WORD_ORDER_SPEC, finetune=replace(_WORD_ORDER_SPEC.finetune, steps=600)),),
)
POSITIONAL_FOR_WORD_ORDER = ("rope", "exposb")
# A sweep of two rates over two sweep seeds, short runs.
SWEEP = replace(
    LEARNING,
    train=replace(TINY.train, steps=30, warmup_steps=3, eval_every=30, checkpoint_every=30),
    learning_rates=(1e-3, 3e-3),
    sweep_seeds=(1000, 1001),
    long_windows=2,
    eval_windows=16,
)


@pytest.fixture(scope="module")
def clm_runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("compare-clm")
    results = run_comparison(LEARNING, objectives=["clm"], out_dir=out_dir, progress=False)
    return out_dir, {r["arm"]: r for r in results}


@pytest.fixture(scope="module")
def word_order_runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("compare-word-order")
    results = run_comparison(
        WORD_ORDER,
        objectives=["mlm"],
        encodings=["none", *POSITIONAL_FOR_WORD_ORDER],
        out_dir=out_dir,
        progress=False,
        figures=False,
    )
    return {r["arm"]: r for r in results}


@pytest.fixture(scope="module")
def committed():
    return load_results(COMMITTED)


# -- learning --------------------------------------------------------------------------------


def test_every_encoding_learns_well_below_unigram(clm_runs):
    _, runs = clm_runs
    assert list(runs) == list(sequence_encodings())  # the default: every sequence encoding
    for encoding, result in runs.items():
        unigram = result["data"]["unigram_entropy_nats"]
        final = result["metrics"]["final_val_loss"]
        assert final < unigram - 0.25, f"{encoding}: {final:.3f} nats vs unigram {unigram:.3f}"
        val = result["curves"]["val"]["loss"]
        assert val[-1] < val[0], f"{encoding}: validation loss did not go down: {val}"
        assert math.isclose(
            result["metrics"]["final_val_bits_per_byte"], final / math.log(2), rel_tol=1e-12
        )
        assert result["learning_rate"] == TINY.train.learning_rate  # no sweep in this preset


def test_results_record_costs_hardware_and_the_text(clm_runs):
    _, runs = clm_runs
    for encoding, result in runs.items():
        metrics = result["metrics"]
        assert metrics["tokens_per_second_during_run"] > 0 and metrics["train_cpu_seconds"] > 0
        assert metrics["peak_memory"]["kind"] == "cpu_process_peak_rss"
        assert result["hardware"]["kind"] == "CPU" and result["hardware"]["cpu"]
        params = metrics["parameters"]
        assert params["total"] == sum(v for k, v in params.items() if k != "total")
        expected_table = TINY.num_layers * TINY.train.seq_len * TINY.hidden_size
        if encoding == "learned":
            assert params["position_embeddings"] == expected_table
        elif not REGISTRY[encoding].learnable:
            assert params["position_embeddings"] == 0, encoding
        data = result["data"]
        assert data["test"]["kept_bytes"] < data["test"]["held_out_bytes"]
        assert data["test_windows"] == TINY.eval_windows


def test_positions_past_the_learned_table_are_not_applicable(clm_runs):
    _, runs = clm_runs
    for encoding, result in runs.items():
        evaluation = result["evaluation"]
        statuses = {k: e["status"] for k, e in evaluation.items()}
        if encoding == "learned":
            assert {k for k, s in statuses.items() if s == "ok"} == {
                "val",
                *(f"near@{m}L" for m in TINY.offset_multiples),
            }
            assert "rows" in evaluation["shift@7L"]["reason"]
        else:
            assert set(statuses.values()) == {"ok"}, encoding
        # the three readings of a block score the same targets
        for m in TINY.offset_multiples:
            tokens = {evaluation[f"{k}@{m}L"].get("tokens") for k in ("near", "shift", "long")}
            assert len(tokens - {None}) == 1, (encoding, m, tokens)


def test_figures_and_summary_are_written(clm_runs):
    out_dir, _ = clm_runs
    for name in ("loss_curves.png", "position_buckets.png", "position_and_context.png",
                 "cost_table.png"):  # fmt: skip
        assert (out_dir / name).stat().st_size > 1000, name
    summary = (out_dir / "summary.md").read_text()
    for encoding in sequence_encodings():
        assert f"| {encoding} | 0 |" in summary
    assert "CPU" in summary and "## Causal LM" in summary and "## Masked LM" not in summary
    assert "## Every claim" in summary


# -- probes ----------------------------------------------------------------------------------


def test_no_position_model_is_worse_on_word_order(word_order_runs):
    none = word_order_runs["none"]["probes"]["word_order"]
    # Bidirectional and position-blind: the two orders of a pair look identical, so exactly one
    # of them is answered right: accuracy 1/2 and no pair fully right.
    assert none["accuracy"] == 0.5
    assert none["pairs_both_right"] == 0.0
    assert none["unit_count"] == [2] * len(none["unit_correct"])  # pairs, one fine-tune
    for encoding in POSITIONAL_FOR_WORD_ORDER:
        accuracy = word_order_runs[encoding]["probes"]["word_order"]["accuracy"]
        assert accuracy > none["accuracy"] + 0.1, f"{encoding}: {accuracy:.3f}"


def test_untrained_no_position_mlm_splits_every_pair():
    torch.manual_seed(0)
    model = MiniBert(TINY.model_config("none", "mlm"))
    probe = word_order_probe(40, seed=3)
    correct = probe_correct(model, probe)
    assert correct.view(-1, 2).sum(dim=1).tolist() == [1] * 20


def test_candidates_come_in_a_random_order_and_a_tie_is_wrong():
    for spec in PRESETS["cpu"].probes:
        probe = spec.make("eval")
        where = (probe.candidate_ids == probe.answer_id[:, None]).float().argmax(1)
        share_first = float((where == 0).float().mean())
        assert 0.3 < share_first < 0.7 if spec.task == "word_order" else share_first < 0.2
    # a model that cannot tell the candidates apart (equal logits) is never right
    model = MiniBert(TINY.model_config("none", "clm"))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    probe = PRESETS["cpu"].probes[0].make("eval")
    assert not bool(probe_correct(model, probe).any())


def test_probe_inputs_label_only_the_answer():
    probe = word_order_probe(4, seed=0)
    start, span = int(probe.answer_index[0]), probe.answer_len
    inputs, labels, score = probe_inputs(probe, "clm")
    assert inputs.shape[1] == probe.input_ids.shape[1] - 1
    assert torch.equal(score, probe.answer_index - 1)
    assert torch.equal(labels[:, start - 1 : start - 1 + span], probe.input_ids[:, start:])
    assert (labels[:, : start - 1] == IGNORE_INDEX).all()
    inputs, labels, score = probe_inputs(probe, "mlm")
    assert (inputs[:, start:] == MASK_ID).all() and torch.equal(
        inputs[:, :start], probe.input_ids[:, :start]
    )
    assert torch.equal(labels[:, start:], probe.input_ids[:, start:])
    assert (labels[:, :start] == IGNORE_INDEX).all()
    with pytest.raises(ValueError, match="objective"):
        probe_inputs(probe, "seq2seq")


def test_held_out_probe_examples_are_unseen_whole_pairs_counted_once():
    for spec in (*TINY.probes, *PRESETS["cpu"].probes):
        seen = set(spec.make("train").texts)
        held_out = spec.make("eval")
        assert len(held_out) > 0 and not seen.intersection(held_out.texts)
        assert len(set(held_out.texts)) == len(held_out)
    word_order = PRESETS["cpu"].probes[0].make("eval")
    assert len(word_order) >= 600  # about 300 pairs: a standard error of at most 0.03 per run
    texts = word_order.texts
    assert all(
        texts[i].split()[1] == texts[i + 1].split()[4].rstrip(".") for i in range(0, len(texts), 2)
    )


def test_bag_of_symbols_baseline_is_between_chance_and_one():
    probe = retrieval_probe(300, 8, seed=0)
    baseline = compare.retrieval_bag_baseline(probe)
    assert 1 / 26 < baseline < 0.5


# -- resume and reuse ------------------------------------------------------------------------


def test_interrupted_run_resumes_to_the_same_result(clm_runs, tmp_path, monkeypatch):
    reference_dir, runs = clm_runs
    real_batch = train_module.training_batch
    calls = {"n": 0}

    def crashing_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 70:
            raise KeyboardInterrupt("simulated interruption")
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(train_module, "training_batch", crashing_batch)
    with pytest.raises(KeyboardInterrupt):
        run_one("rse", "clm", LEARNING, out_dir=tmp_path, progress=False)
    checkpoint = tmp_path / "checkpoints" / "clm_rse_s0.pt"
    assert load_checkpoint(checkpoint)["state"]["step"] == 50  # the last periodic checkpoint
    assert not (tmp_path / "clm_rse_s0.json").exists()

    monkeypatch.setattr(train_module, "training_batch", real_batch)
    resumed = run_one("rse", "clm", LEARNING, out_dir=tmp_path, progress=False)
    reference = runs["rse"]
    assert resumed["metrics"]["training_segments"] == 2
    assert resumed["curves"]["train"]["step"] == reference["curves"]["train"]["step"]
    for kind in ("train", "val"):
        assert resumed["curves"][kind]["loss"] == pytest.approx(
            reference["curves"][kind]["loss"], abs=1e-6
        )
    for name, entry in reference["evaluation"].items():
        assert resumed["evaluation"][name]["loss"] == pytest.approx(entry["loss"], abs=1e-6)
    # its training time counts both segments, its process time the last one: the report
    # says which is which instead of calling one a part of the other
    assert resumed["metrics"]["train_cpu_seconds"] > reference["metrics"]["train_cpu_seconds"] / 2
    text = describe_runs([resumed, reference])
    assert "of the 1 run resumed after an interruption, only the last segment counts" in text
    assert "in training steps (every segment counted)" in text and "of it in" not in text
    assert "of it in training steps, the rest evaluation and probes" in describe_runs([reference])
    ours = load_checkpoint(checkpoint)["model"]
    theirs = load_checkpoint(reference_dir / "checkpoints" / "clm_rse_s0.pt")["model"]
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, atol=1e-6, rtol=0)


def test_finished_runs_are_reused_and_mismatches_refused(clm_runs, monkeypatch):
    out_dir, runs = clm_runs

    def must_not_train(*args, **kwargs):
        raise AssertionError("a finished run was recomputed")

    monkeypatch.setattr(training_run, "train_model", must_not_train)
    again = run_one("rope", "clm", LEARNING, out_dir=out_dir, progress=False)
    assert again == json.loads((out_dir / "clm_rope_s0.json").read_text())
    with pytest.raises(ValueError, match="force"):
        run_one("rope", "clm", LEARNING, learning_rate=1e-4, out_dir=out_dir, progress=False)


def test_a_partial_rerun_draws_every_saved_run_of_its_preset(clm_runs, monkeypatch):
    out_dir, _ = clm_runs
    for stage in (sweep, training_run):
        monkeypatch.setattr(stage, "train_model", lambda *a, **k: pytest.fail("retrained"))
    (out_dir / "summary.md").unlink()
    again = run_comparison(
        LEARNING, encodings=["rope"], objectives=["clm"], out_dir=out_dir, progress=False
    )
    assert [r["encoding"] for r in again] == ["rope"]
    summary = (out_dir / "summary.md").read_text()
    assert all(f"| {encoding} | 0 |" in summary for encoding in sequence_encodings())
    other = replace(LEARNING, train=replace(LEARNING.train, learning_rate=1e-4))
    assert len(compare_runner.preset_results(out_dir, LEARNING)) == len(sequence_encodings())
    assert compare_runner.preset_results(out_dir, other) == []


# -- the learning-rate sweep -----------------------------------------------------------------


def test_the_sweep_picks_the_lowest_selection_loss_and_arms_inherit_it(tmp_path):
    results = run_comparison(
        SWEEP, encodings=["rope"], ablations=["rope.dynamic"], objectives=["clm"], seeds=[0],
        out_dir=tmp_path, progress=False, figures=False,
    )  # fmt: skip
    sweeps = compare_runner.sweep_results(tmp_path, SWEEP)
    assert sorted((s["learning_rate"], s["seed"]) for s in sweeps) == [
        (1e-3, 1000), (1e-3, 1001), (3e-3, 1000), (3e-3, 1001)
    ]  # fmt: skip
    # the rate with the lowest mean over the sweep seeds wins
    mean = {
        rate: sum(s["select"]["loss"] for s in sweeps if s["learning_rate"] == rate) / 2
        for rate in (1e-3, 3e-3)
    }
    best = min(mean, key=mean.get)
    assert compare_runner.chosen_learning_rates(tmp_path, SWEEP) == {("clm", "rope"): best}
    assert [(r["arm"], r["learning_rate"]) for r in results] == [
        ("rope", best), ("rope.dynamic", best)
    ]  # fmt: skip
    assert results[0]["identity"]["train_config"]["learning_rate"] == best
    # the sweep's text is the selection split, the report's the test split: they share no window
    splits = comparison_splits()
    select = {tuple(w) for w in segment_windows(splits.select, 41, None).tolist()}
    test = {tuple(w) for w in segment_windows(splits.test, 41, None).tolist()}
    assert not select & test
    # a sweep run of another configuration does not count: the runs then are not the preset's
    path = tmp_path / "sweep" / f"clm_rope_lr{best:g}_s1001.json"
    saved = json.loads(path.read_text())
    saved["identity"]["train_config"]["steps"] += 1
    path.write_text(json.dumps(saved))
    with pytest.raises(FileNotFoundError, match="sweep is incomplete"):
        compare_runner.chosen_learning_rates(tmp_path, SWEEP)
    assert compare_runner.preset_results(tmp_path, SWEEP) == []
    with pytest.raises(ValueError, match="sweep's seed"):
        replace(SWEEP, seeds=(1000,))


# -- seeds, ablations, RSE's parameters ------------------------------------------------------


def test_seeds_are_separate_runs_and_ablations_build_their_model(tmp_path):
    results = run_comparison(
        LEARNING, encodings=["none"], ablations=["rse.no_penalty"], seeds=[0, 1],
        objectives=["clm"], out_dir=tmp_path, progress=False, figures=False,
    )  # fmt: skip
    assert [(r["arm"], r["seed"]) for r in results] == [
        ("none", 0), ("rse.no_penalty", 0), ("none", 1), ("rse.no_penalty", 1)
    ]  # fmt: skip
    by = {(r["arm"], r["seed"]): r for r in results}
    assert by["none", 0]["curves"]["train"]["loss"] != by["none", 1]["curves"]["train"]["loss"]
    assert by["none", 1]["identity"]["train_config"]["seed"] == 1
    ablation = by["rse.no_penalty", 0]
    assert ablation["encoding"] == "rse"
    assert ablation["learned_values"]["layer0"]["distance_penalty"] == [0.0] * TINY.num_heads
    assert ablation["reachable_values"] == {}  # a fixed penalty reaches nothing


def test_every_ablation_changes_its_encoding_as_it_says():
    torch.manual_seed(0)
    models = {a.name: MiniBert(TINY.model_config(a.name, "mlm")) for a in ABLATIONS}
    assert set(arm_names()) == {*sequence_encodings(), *models}
    attention = {name: model.layers[0].attention for name, model in models.items()}
    for name, value in (
        ("rse.no_penalty", 0.0),
        ("rse.lambda_0.03", 0.03),
        ("rse.lambda_0.3", 0.3),
    ):
        assert attention[name].distance_penalty.tolist() == pytest.approx([value] * TINY.num_heads)
        assert not any("distance_penalty" in n for n, _ in attention[name].named_parameters())
    assert attention["rse.softmax"].normaliser == "softmax"
    assert attention["kerple.power"].variant == "power"
    assert MiniBert(TINY.model_config("kerple", "mlm")).layers[0].attention.variant == "log"
    assert attention["rse.stick_bias"].stick_bias.tolist() == pytest.approx([-3.0] * TINY.num_heads)
    table = attention["learned.unit_init"].position_embeddings.weight
    assert 0.9 < float(table.detach().std()) < 1.1
    default_table = MiniBert(TINY.model_config("learned", "mlm")).layers[0].attention
    assert float(default_table.position_embeddings.weight.detach().std()) < 0.03
    # dynamic NTK is plain RoPE up to the training length, and differs past it
    rope = MiniBert(TINY.model_config("rope", "clm"))
    dynamic = MiniBert(TINY.model_config("rope.dynamic", "clm"))
    dynamic.load_state_dict(rope.state_dict())
    short = torch.randint(0, 256, (2, TINY.train.seq_len))
    long = torch.randint(0, 256, (2, 3 * TINY.train.seq_len))
    torch.testing.assert_close(dynamic(short).logits, rope(short).logits)
    assert not torch.allclose(dynamic(long).logits, rope(long).logits)
    for ablation in ABLATIONS:
        assert ablation.metrics and all(m in compare.stats.METRICS for m in ablation.metrics)
    with pytest.raises(ValueError, match="valid"):
        get_arm("rse.no_such_thing")


def test_an_ablation_trains_only_under_the_objectives_its_question_is_about(tmp_path, capsys):
    # the causal questions (reading far, retrieval) have causal runs only; the stick bias is
    # asked about word order on the masked runs too
    assert [a.name for a in ABLATIONS if a.trains("mlm")] == ["rse.stick_bias"]
    assert all(a.trains("clm") for a in ABLATIONS)
    assert not get_arm("fox").trains("mlm") and get_arm("rope").trains("mlm")
    assert {c.a for c in _ablation_claims() if c.objective == "mlm"} == {"rse.stick_bias"}
    args = ["--preset", "tiny", "--encodings", "none", "--ablations", "rse.no_penalty"]
    args += ["--objectives", "mlm,clm", "--out", str(tmp_path), "--no-progress"]
    assert main([*args, "--stop-after-steps", "1"]) == 0
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert checkpoints == ["clm_none_s0.pt", "clm_rse.no_penalty_s0.pt", "mlm_none_s0.pt"]
    with pytest.raises(SystemExit):
        main(["--preset", "tiny", "--encodings", "fox", "--ablations", "kerple.power",
              "--objectives", "mlm"])  # fmt: skip
    error = capsys.readouterr().err
    assert (
        "fox is causal only" in error and "kerple.power: an ablation trained only on clm" in error
    )


@pytest.mark.parametrize("objective", ["clm", "mlm"])
@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_rse_lambda_and_stick_bias_can_reach_the_promised_range(direction, objective):
    """With the optimiser and the schedule the comparison trains with, the budget of each
    objective in the cpu preset and the smallest learning rate of its grid, a gradient that keeps
    its sign takes lambda from 0.01 past 1 (or below 1e-3) and the stick bias 3 away from -3."""
    cpu = PRESETS["cpu"]
    config = cpu.train_config(objective, 0, min(cpu.rates(objective)))
    module = RSEAttention(cpu.hidden_size, cpu.num_heads, stick_bias_init=-3.0)
    optimizer = make_optimizer(module, config.learning_rate, config.weight_decay)
    for step in range(config.steps):
        lr = learning_rate_at(
            step, config.steps, config.learning_rate, config.warmup_steps, config.min_lr_ratio
        )
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = -direction * (module.distance_penalty.log().sum() + module.stick_bias.sum())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), config.grad_clip)
        optimizer.step()
    lam, beta = module.distance_penalty.detach(), module.stick_bias.detach()
    if direction > 0:
        assert (lam > 1.0).all() and (beta > 0.0).all()
    else:
        assert (lam < 1e-3).all() and (beta < -6.0).all()
    low, high = module.reachable_values(learning_rate_sum(config))["distance_penalty"]
    assert low < 1e-3 and high > 1.0
    # the old parametrisation (gain 1, 300 steps at 3e-3) kept lambda within a factor of about
    # 1.6 of its start
    old = RSEAttention(cpu.hidden_size, cpu.num_heads, parameter_gain=1.0)
    low, high = old.reachable_values(learning_rate_sum(cpu.train_config("clm")))["distance_penalty"]
    assert 0.005 < low and high < 0.02


# -- evaluation pieces -----------------------------------------------------------------------


def test_heldout_loss_adds_mask_draws_per_window():
    torch.manual_seed(0)
    windows = torch.randint(0, 256, (6, 17))
    model = MiniBert(TINY.model_config("rope", "mlm"))
    one = heldout_loss(model, windows, mask_draws=1)
    three = heldout_loss(model, windows, mask_draws=3)
    assert len(three["unit_sums"]) == 6 and three["tokens"] > 2 * one["tokens"]
    assert three["loss"] == pytest.approx(sum(three["unit_sums"]) / three["tokens"], rel=1e-5)
    clm = heldout_loss(MiniBert(TINY.model_config("rope", "clm")), windows)
    assert clm["tokens"] == 6 * 16 and clm["unit_counts"] == [16] * 6


def test_shift_and_context_read_the_same_targets_three_ways():
    torch.manual_seed(0)
    windows = torch.randint(0, 256, (3, 8 * 16 + 1))
    for objective in ("clm", "mlm"):
        rope = MiniBert(TINY.model_config("rope", objective))
        out = shift_and_context_losses(rope, windows, 16, (16, 112))
        for o in ("1L", "7L"):
            counts = {out[f"{k}@{o}"]["tokens"] for k in ("near", "shift", "long")}
            assert len(counts) == 1
            # RoPE is relative: moving a block changes nothing but rounding
            assert out[f"shift@{o}"]["loss"] == pytest.approx(out[f"near@{o}"]["loss"], abs=2e-5)
        # absolute positions are not: even an untrained model (tables added with small
        # weights) reads the moved block differently
        absolute = MiniBert(TINY.model_config("absolute", objective))
        moved = shift_and_context_losses(absolute, windows, 16, (112,))
        assert abs(moved["shift@7L"]["loss"] - moved["near@7L"]["loss"]) > 2e-4
    # causal: the long window's first bucket is the training condition, read directly
    clm = MiniBert(TINY.model_config("rope", "clm"))
    out = shift_and_context_losses(clm, windows, 16, (16,))
    with torch.no_grad():
        logits = clm(windows[:, :16]).logits
    direct = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:17].flatten())
    assert out["bucket0"]["loss"] == pytest.approx(float(direct), rel=1e-5)
    with pytest.raises(ValueError, match="offsets"):
        shift_and_context_losses(clm, windows, 16, (120,))


def test_learning_rate_warms_up_then_decays_to_the_floor():
    steps, peak, warmup, floor = 100, 1e-3, 10, 0.1
    lrs = [learning_rate_at(s, steps, peak, warmup, floor) for s in range(steps)]
    assert lrs[0] == pytest.approx(peak / warmup)
    assert lrs[warmup - 1] == pytest.approx(peak) and lrs[warmup] == pytest.approx(peak)
    assert all(a <= b for a, b in zip(lrs[:warmup], lrs[1 : warmup + 1], strict=True))
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1 :], strict=False))
    assert lrs[-1] == pytest.approx(peak * floor)


def test_bad_presets_are_refused():
    with pytest.raises(ValueError, match="valid"):
        compare.choose_preset("huge")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            compare.choose_preset("gpu")
    with pytest.raises(ValueError, match="training length"):
        replace(TINY, train=replace(TINY.train, seq_len=16))
    with pytest.raises(ValueError, match="offset_multiples"):
        replace(TINY, offset_multiples=(8,))


def _fake_gpu(monkeypatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_the_gpu_preset_needs_bf16_tensor_cores(monkeypatch):
    """The gpu preset trains in bf16 autocast, which the kernels refuse on a GPU without bf16
    tensor cores: on a T4 "auto" is the cpu preset and asking for gpu says why, before any run."""
    _fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    assert compare.choose_preset("auto").name == "cpu"
    with pytest.raises(ValueError, match=r"bf16 tensor cores .*Tesla T4, compute capability 7\.5"):
        compare.choose_preset("gpu")
    _fake_gpu(monkeypatch, (9, 0), "NVIDIA H200")
    assert compare.choose_preset("auto").name == compare.choose_preset("gpu").name == "gpu"


# -- the command line ------------------------------------------------------------------------


def test_command_line_stops_keeps_a_checkpoint_and_logs_the_sitting(tmp_path, capsys):
    # Names separated by spaces, by commas, or both; a repeated name runs once.
    args = ["--preset", "tiny", "--encodings", "none", "rope,learned", "none"]
    args += ["--objectives", "clm", "--out", str(tmp_path)]
    args += ["--no-progress", "--stop-after-steps", "3"]
    assert main(args) == 0
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert checkpoints == ["clm_learned_s0.pt", "clm_none_s0.pt", "clm_rope_s0.pt"]
    assert load_checkpoint(tmp_path / "checkpoints" / "clm_none_s0.pt")["state"]["step"] == 3
    assert [p.name for p in tmp_path.glob("*.json")] == ["sessions.json"]  # no results yet
    (sitting,) = json.loads((tmp_path / "sessions.json").read_text())
    assert sitting["processes"] == 1 and sitting["outcome"] == "0 runs finished"
    assert (tmp_path / "checkpoints" / ".gitignore").read_text().strip().endswith("*")
    assert "0 finished run(s)" in capsys.readouterr().out


def test_command_line_refuses_unknown_encodings_and_lists_the_registered_ones(capsys):
    for bad in (["sinusoidal"], ["rope", "sinusoidal"], ["rope,sinusoidal"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--preset", "tiny", "--encodings", *bad])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert "'sinusoidal'" in error and f"valid: {', '.join(sequence_encodings())}" in error
    with pytest.raises(ValueError, match="valid"):
        run_comparison(TINY, encodings=["sinusoidal"], progress=False)


def test_command_line_takes_seeds_and_ablations_and_times_arms(tmp_path, capsys):
    args = ["--preset", "tiny", "--encodings", "none", "--ablations", "learned.unit_init"]
    args += ["--seeds", "3", "--objectives", "clm", "--out", str(tmp_path)]
    assert main([*args, "--no-progress", "--stop-after-steps", "2"]) == 0
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert checkpoints == ["clm_learned.unit_init_s3.pt", "clm_none_s3.pt"]
    for bad in (["--seeds", "-1"], ["--seeds", "x"], ["--ablations", "rse.nothing"]):
        with pytest.raises(SystemExit):
            main(["--preset", "tiny", *bad])
        assert "valid" in capsys.readouterr().err or bad[0] == "--seeds"
    assert main([*args, "--timing", "--no-progress"]) == 0
    timing = json.loads((tmp_path / "timing.json").read_text())
    assert [(r["objective"], r["arm"]) for r in timing["rows"]] == [
        ("clm", "none"), ("clm", "learned.unit_init")
    ]  # fmt: skip
    assert all(r["tokens_per_second"] > 0 and len(r["load_average_1min"]) == 4
               for r in timing["rows"])  # fmt: skip


# -- the committed results -------------------------------------------------------------------


def test_committed_results_have_five_seeds_of_every_arm_run_a_sweep_and_draw(committed, tmp_path):
    cpu = PRESETS["cpu"]
    assert compare_runner.preset_results(COMMITTED, cpu) == committed
    seeds: dict[tuple[str, str], set[int]] = {}
    for r in committed:
        seeds.setdefault((r["objective"], r["arm"]), set()).add(r["seed"])
    # an arm registered after the committed run is listed, never a failure; one that was run
    # has every seed of every objective it trains
    for missing in cpu.not_run_yet(committed):
        warnings.warn(missing.describe(), stacklevel=1)
    assert set(arms_run(committed)) <= set(cpu.arm_names())
    for objective in ("mlm", "clm"):
        for arm in arms_run(committed):
            if not get_arm(arm).trains(objective):
                assert (objective, arm) not in seeds
                continue
            assert len(seeds.get((objective, arm), ())) >= 5, (objective, arm)
    rates = compare_runner.chosen_learning_rates(COMMITTED, cpu)
    for r in committed:
        assert r["learning_rate"] == rates[r["objective"], r["encoding"]]
    figure = plot_position_buckets(committed)
    drawn = {line.get_label(): line.get_color() for ax in figure.axes for line in ax.lines}
    drawn.update(
        (c.get_label(), c.lines[0].get_color()) for ax in figure.axes for c in ax.containers
    )
    for encoding in (a for a in arms_run(committed) if not get_arm(a).is_ablation):
        assert same_color(drawn[encoding], REGISTRY[encoding].color), encoding
    plt.close(figure)
    paths = write_figures(committed, tmp_path)
    assert sorted(p.name for p in paths) == sorted(
        ["loss_curves.png", "position_buckets.png", "position_and_context.png"]
        + ["retrieval_by_position.png", "probe_accuracy.png", "ablations.png", "cost_table.png"]
    )


def test_readme_headline_and_summary_are_generated_from_the_committed_results(committed):
    readme = (REPO_ROOT / "README.md").read_text()
    start, end = "<!-- comparison headline: start -->", "<!-- comparison headline: end -->"
    block = readme.split(start, 1)[1].split(end, 1)[0]
    assert block.strip() == headline_markdown(committed).strip(), (
        "README's headline differs from the results: regenerate it with "
        "python -m course_lib.compare --preset cpu --report"
    )
    summary = (COMMITTED / "summary.md").read_text()
    sweeps = compare_runner.sweep_results(COMMITTED, PRESETS["cpu"])
    assert summary == summary_markdown(committed, sweeps=sweeps, folder=COMMITTED)


def test_every_declared_question_is_tested_on_the_committed_results(committed):
    tested = set(report_claims(committed))
    # a question about an arm registered after the committed run waits for its runs
    asked = set(declared_claims(committed)) & set(questions())
    not_run = {m.arm for m in PRESETS["cpu"].not_run_yet(committed)}
    for question in set(questions()) - asked:
        arms = (question.a, question.b) if isinstance(question, Difference) else (question.arm,)
        assert set(arms) & not_run, question
    # a claim leaves the family only when an arm did not leave the plateau, when the runs
    # record its metric as not applicable (the learned table's far targets), or when no arm
    # clears its probe's position-blind floor, and the summary says which and why
    dropped = [q for q in asked if q not in tested]
    untested = dict(untested_questions(committed))
    assert set(dropped) <= set(untested)
    for claim, why in untested.items():
        plateau = claim.objective == "mlm" and "plateau" in why
        idle = claim.metric == "retrieval" and "position-blind guess" in why
        # an ablation asked about retrieval under both objectives; the cpu preset probes
        # retrieval on its causal runs only
        unprobed = claim.objective == "mlm" and "no retrieval (not in this preset)" in why
        assert plateau or idle or unprobed or "position table" in why, (claim, why)
    summary = (COMMITTED / "summary.md").read_text()
    for claim in untested:
        assert claim.describe() in summary.split("Declared but not tested", 1)[1].split("\n")[0]


def test_an_encoding_registered_after_the_committed_run_is_not_run_yet(committed):
    cpu = PRESETS["cpu"]
    readme = (REPO_ROOT / "README.md").read_text()
    summary = (COMMITTED / "summary.md").read_text()
    sweeps = compare_runner.sweep_results(COMMITTED, cpu)
    family, untested = report_claims(committed), untested_questions(committed)
    before = set(cpu.not_run_yet(committed))  # empty, unless another file was added too
    name = "alibi_registered_later"
    register(replace(REGISTRY["alibi"], name=name))  # ALiBi's record under a new name
    try:
        assert compare_runner.preset_results(COMMITTED, cpu) == committed
        assert set(cpu.not_run_yet(committed)) == before | {NotRunYet(name, "cpu")}
        assert NotRunYet(name).describe() == (
            f"{name}: not run yet (run it with `python -m course_lib.compare --preset cpu "
            f"--encodings {name} --ablations none`)"
        )
        assert any(c.a == name for c in questions() if isinstance(c, Difference))
        assert report_claims(committed) == family and untested_questions(committed) == untested
        assert headline_markdown(committed).strip() in readme
        assert summary_markdown(committed, sweeps=sweeps, folder=COMMITTED) == summary
    finally:
        unregister(name)
    # an ablation runs with its encoding, whose runs are read back
    assert NotRunYet("rse.softmax").command == (
        "python -m course_lib.compare --preset cpu --encodings rse --ablations rse.softmax"
    )


def test_notebook_reading_refuses_a_claim_the_seeds_do_not_support(committed):
    read = Reading(committed)
    verdict = read.verdicts[next(iter(read.verdicts))]
    claim = verdict.claim
    wrong = "within noise" if verdict.called else "lower"
    with pytest.raises(AssertionError, match="the results say"):
        read._check(claim, wrong, None)
    with pytest.raises(KeyError, match="not in the family"):
        read.expect("clm", "none", "learned.unit_init", "val_loss", "lower")
    with pytest.raises(AssertionError, match="does not hold"):
        read.expect_every_seed("clm", "rope", "retrieval below 0",
                               lambda r: r["probes"]["retrieval"]["accuracy"], lambda v: v < 0)  # fmt: skip
    assert read.checked == 0


def test_the_models_notebook_10_reads_are_exported_from_the_committed_runs(committed):
    by_name = {r["run"]: r for r in committed}
    for run in NOTEBOOK_RUNS:
        assert matches_run(COMMITTED / "models" / f"{run}.pt", by_name[run]), (
            f"{run}: re-export it with python -m course_lib.teaching.stick_reach"
        )
    reach = json.loads((COMMITTED / "models" / "retrieval_reach.json").read_text())
    for run in RETRIEVAL_RUNS:
        assert reach[run]["identity_fingerprint"] == identity_fingerprint(by_name[run]["identity"])


def test_an_exported_model_is_tied_to_the_run_it_came_from(tmp_path):
    identity = TINY.identity("rope", "clm", 0)
    model = MiniBert(TINY.model_config("rope", "clm"))
    torch.save({"model": model.state_dict()}, tmp_path / "run.pt")
    config = identity["model_config"]
    path = export_model(tmp_path / "run.pt", config, tmp_path / "m.pt", identity=identity)
    assert matches_run(path, {"identity": identity})
    assert not matches_run(path, {"identity": TINY.identity("rope", "clm", 1)})
    assert not matches_run(tmp_path / "missing.pt", {"identity": identity})
    bare = export_model(tmp_path / "run.pt", config, tmp_path / "bare.pt")
    assert not matches_run(bare, {"identity": identity})
    assert identity_fingerprint(identity) == identity_fingerprint(json.loads(json.dumps(identity)))
    torch.testing.assert_close(load_model(path).state_dict(), model.state_dict())


def test_retrieval_reach_reads_the_attention_on_the_queried_symbol():
    torch.manual_seed(0)
    model = MiniBert(TINY.model_config("none", "clm")).eval()
    with torch.no_grad():  # equal scores everywhere: softmax spreads the weight evenly
        for layer in model.layers:
            layer.attention.query.weight.zero_()
    probe = PRESETS["cpu"].probes[1].make("eval")
    reach = retrieval_reach(model, probe)
    score_position = int(probe.answer_index[0]) - 1  # the "?" sees itself and every key before it
    even = 1.0 / (score_position + 1)
    for key in ("target", "other"):
        assert torch.tensor(reach[key]) == pytest.approx(torch.full((2, 4), even), abs=1e-6)
    with pytest.raises(ValueError, match="causal"):
        retrieval_reach(MiniBert(TINY.model_config("none", "mlm")), probe)


def test_notebook_reading_says_what_the_claims_left_out_after_the_runs_would_change(
    committed, capsys
):
    """The one rule written after the runs were seen (the probes no arm cleared) is printed
    with its effect, the paragraph summary.md gives."""
    from course_lib.compare.results import idle_probe_effect

    read = Reading(committed)
    read.say_left_out()
    out = capsys.readouterr().out
    expected = idle_probe_effect(committed, read.verdicts)
    assert expected, "the committed runs leave the retrieval probe's claims out (chapter 10, §7)"
    assert out.strip() == "\n".join(expected).strip()
    assert "Left out after the runs were seen" in out and "would differ" in out
