"""The training loop and the encoding comparison, on the tiny preset (CPU, about two minutes).

What is checked: every registered encoding learns (ends well below the unigram baseline); the
word-order probe separates the no-position model from positional ones; an interrupted run resumes
to the result of an uninterrupted one; finished runs are reused, mismatched ones refused; seeds
give different runs, each in its own file; ablations build the model they say; the command line
takes names separated by spaces or commas and refuses unknown ones; the committed results have
at least three seeds of every arm and draw; the statistics call a difference only when every
seed agrees; the pieces (learning-rate schedule, probe inputs, extrapolation and position
buckets on the same text) do what they say.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.colors import same_color

import course_lib.train as train_module
from course_lib import compare
from course_lib.compare import PRESETS, load_results, main, run_comparison, run_one
from course_lib.compare import runner as compare_runner
from course_lib.compare.arms import ABLATIONS, arm_names, get_arm
from course_lib.compare.figures import plot_position_buckets, write_figures
from course_lib.compare.results import REPO_ROOT, headline_markdown
from course_lib.compare.stats import Paired, Spread, paired
from course_lib.data import IGNORE_INDEX, MASK_ID, retrieval_probe, word_order_probe
from course_lib.encodings import REGISTRY
from course_lib.evaluate import (
    extrapolation_losses,
    position_bucket_losses,
    probe_correct,
    probe_inputs,
    spread_windows,
)
from course_lib.model import MiniBert
from course_lib.registry import sequence_encodings
from course_lib.teaching.comparison_reading import Reading
from course_lib.teaching.stick_reach import load_model, noun_reach
from course_lib.train import learning_rate_at, load_checkpoint

TINY = PRESETS["tiny"]
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
POSITIONAL_FOR_WORD_ORDER = ("rope", "learned")


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


def test_results_record_costs_and_hardware(clm_runs):
    _, runs = clm_runs
    for encoding, result in runs.items():
        metrics = result["metrics"]
        assert metrics["tokens_per_second"] > 0
        assert metrics["peak_memory"]["kind"] == "cpu_process_peak_rss"
        assert result["hardware"]["kind"] == "CPU" and result["hardware"]["cpu"]
        params = metrics["parameters"]
        assert params["total"] == sum(v for k, v in params.items() if k != "total")
        expected_table = TINY.num_layers * TINY.train.seq_len * TINY.hidden_size
        if encoding == "learned":
            assert params["position_embeddings"] == expected_table
        elif not REGISTRY[encoding].learnable:
            assert params["position_embeddings"] == 0, encoding


def test_learned_table_is_not_applicable_past_its_rows(clm_runs):
    _, runs = clm_runs
    for encoding, result in runs.items():
        statuses = {e["multiple"]: e["status"] for e in result["extrapolation"]}
        if encoding == "learned":
            assert statuses == {1: "ok", 2: "not_applicable", 4: "not_applicable"}
            assert "rows" in result["extrapolation"][1]["reason"]
        else:
            assert set(statuses.values()) == {"ok"}, encoding
            tokens = {e["tokens"] for e in result["extrapolation"]}
            assert len(tokens) == 1, f"{encoding}: lengths scored different text: {tokens}"


def test_figures_and_summary_are_written(clm_runs):
    out_dir, _ = clm_runs
    for name in ("loss_curves.png", "position_buckets.png", "cost_table.png"):
        assert (out_dir / name).stat().st_size > 1000, name
    summary = (out_dir / "summary.md").read_text()
    for encoding in sequence_encodings():
        assert f"| {encoding} | 0 |" in summary
    assert "CPU" in summary and "## Causal LM" in summary and "## Masked LM" not in summary


# -- probes ----------------------------------------------------------------------------------


def test_no_position_model_is_worse_on_word_order(word_order_runs):
    none = word_order_runs["none"]["probes"]["word_order"]
    # Bidirectional and position-blind: the two orders of a pair look identical, so exactly one
    # of them is answered right: accuracy 1/2 and no pair fully right.
    assert none["accuracy"] == 0.5
    assert none["pairs_both_right"] == 0.0
    for encoding in POSITIONAL_FOR_WORD_ORDER:
        accuracy = word_order_runs[encoding]["probes"]["word_order"]["accuracy"]
        assert accuracy > none["accuracy"] + 0.1, f"{encoding}: {accuracy:.3f}"


def test_untrained_no_position_mlm_splits_every_pair():
    torch.manual_seed(0)
    model = MiniBert(TINY.model_config("none", "mlm"))
    probe = word_order_probe(40, seed=3)
    correct = probe_correct(model, probe)
    assert correct.view(-1, 2).sum(dim=1).tolist() == [1] * 20


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


def test_held_out_probe_examples_are_unseen_and_counted_once():
    for spec in (*TINY.probes, *PRESETS["cpu"].probes):
        seen = set(spec.make("train").texts)
        held_out = spec.make("eval")
        assert len(held_out) > 0 and not seen.intersection(held_out.texts)
        assert len(set(held_out.texts)) == len(held_out)
    word_order = PRESETS["cpu"].probes[0].make("eval")
    assert len(word_order) >= 600  # a standard error of at most 0.02 per run
    texts = word_order.texts
    assert all(
        texts[i].split()[1] == texts[i + 1].split()[4].rstrip(".") for i in range(0, len(texts), 2)
    )


def test_bag_of_symbols_baseline_is_between_chance_and_one():
    probe = retrieval_probe(300, 8, seed=0)
    baseline = compare.retrieval_bag_baseline(probe)
    assert 1 / 26 < baseline < 0.5


# -- resume ----------------------------------------------------------------------------------


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
    for ours, theirs in zip(resumed["extrapolation"], reference["extrapolation"], strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
    ours = load_checkpoint(checkpoint)["model"]
    theirs = load_checkpoint(reference_dir / "checkpoints" / "clm_rse_s0.pt")["model"]
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, atol=1e-6, rtol=0)


def test_finished_runs_are_reused_and_mismatches_refused(clm_runs, monkeypatch):
    out_dir, runs = clm_runs

    def must_not_train(*args, **kwargs):
        raise AssertionError("a finished run was recomputed")

    monkeypatch.setattr(compare_runner, "train_model", must_not_train)
    again = run_one("rope", "clm", LEARNING, out_dir=out_dir, progress=False)
    assert again == json.loads((out_dir / "clm_rope_s0.json").read_text())
    other = replace(LEARNING, train=replace(LEARNING.train, learning_rate=1e-4))
    with pytest.raises(ValueError, match="force"):
        run_one("rope", "clm", other, out_dir=out_dir, progress=False)


def test_a_partial_rerun_draws_every_saved_run_of_its_preset(clm_runs, monkeypatch):
    out_dir, _ = clm_runs
    monkeypatch.setattr(compare_runner, "train_model", lambda *a, **k: pytest.fail("retrained"))
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


def test_command_line_stops_and_keeps_a_checkpoint(tmp_path, capsys):
    # Names separated by spaces, by commas, or both; a repeated name runs once.
    args = ["--preset", "tiny", "--encodings", "none", "rope,learned", "none"]
    args += ["--objectives", "clm", "--out", str(tmp_path)]
    args += ["--no-progress", "--stop-after-steps", "3"]
    assert main(args) == 0
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert checkpoints == ["clm_learned_s0.pt", "clm_none_s0.pt", "clm_rope_s0.pt"]
    assert load_checkpoint(tmp_path / "checkpoints" / "clm_none_s0.pt")["state"]["step"] == 3
    assert not list(tmp_path.glob("*.json"))
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


def test_committed_results_have_three_seeds_of_every_arm_and_draw(tmp_path):
    results = load_results(REPO_ROOT / "figures" / "compare_cpu")
    cpu = PRESETS["cpu"]
    assert compare_runner.preset_results(REPO_ROOT / "figures" / "compare_cpu", cpu) == results
    seeds: dict[tuple[str, str], set[int]] = {}
    for r in results:
        seeds.setdefault((r["objective"], r["arm"]), set()).add(r["seed"])
    for objective in ("mlm", "clm"):
        for arm in cpu.arm_names():
            if objective == "mlm" and REGISTRY[get_arm(arm).encoding].causal_only:
                assert (objective, arm) not in seeds
                continue
            assert len(seeds.get((objective, arm), ())) >= 3, (objective, arm)
    figure = plot_position_buckets(results)
    drawn = {line.get_label(): line.get_color() for ax in figure.axes for line in ax.lines}
    drawn.update(
        (c.get_label(), c.lines[0].get_color()) for ax in figure.axes for c in ax.containers
    )
    for encoding in sequence_encodings():
        assert same_color(drawn[encoding], REGISTRY[encoding].color), encoding
    plt.close(figure)
    paths = write_figures(results, tmp_path)
    assert sorted(p.name for p in paths) == sorted(
        ["loss_curves.png", "position_buckets.png", "retrieval_by_position.png"]
        + ["probe_accuracy.png", "ablations.png", "cost_table.png"]
    )


def test_readme_headline_is_generated_from_the_committed_results():
    results = load_results(REPO_ROOT / "figures" / "compare_cpu")
    readme = (REPO_ROOT / "README.md").read_text()
    start, end = "<!-- comparison headline: start -->", "<!-- comparison headline: end -->"
    block = readme.split(start, 1)[1].split(end, 1)[0]
    assert block.strip() == headline_markdown(results).strip(), (
        "README's headline differs from the results: regenerate it with "
        "python -m course_lib.compare --preset cpu --report"
    )
    summary = (REPO_ROOT / "figures" / "compare_cpu" / "summary.md").read_text()
    assert summary == compare.summary_markdown(results)


def test_notebook_reading_refuses_a_claim_the_seeds_do_not_support():
    read = Reading(load_results(REPO_ROOT / "figures" / "compare_cpu"))
    read.expect("clm", "rse", "none", "val_loss", "lower")
    with pytest.raises(AssertionError, match="results say 'lower'"):
        read.expect("clm", "rse", "none", "val_loss", "within noise")
    with pytest.raises(AssertionError, match="does not hold"):
        read.expect_value("clm", "rope", "retrieval below 1/2",
                          lambda r: r["probes"]["retrieval"]["accuracy"], lambda v: v < 0.5)  # fmt: skip
    assert read.checked == 1


def test_the_masked_stick_leaves_no_gradient_on_the_subject_and_its_bias_restores_it():
    probe = PRESETS["cpu"].probes[0].make("eval")
    models = REPO_ROOT / "figures" / "compare_cpu" / "models"
    stuck = noun_reach(load_model(models / "mlm_rse_s0.pt"), probe)["gradient"]
    fixed = noun_reach(load_model(models / "mlm_rse.stick_bias_s0.pt"), probe)["gradient"]
    assert stuck["subject"] < 1e-4 * stuck["answer_neighbours"]
    assert fixed["subject"] > 1e-2 * fixed["answer_neighbours"]


def test_seeds_are_separate_runs_and_ablations_build_their_model(tmp_path):
    results = run_comparison(
        LEARNING, encodings=["none"], ablations=["rse.no_penalty"], seeds=[0, 1],
        objectives=["clm"], out_dir=tmp_path, progress=False, figures=False,
    )  # fmt: skip
    assert [(r["arm"], r["seed"]) for r in results] == [
        ("none", 0), ("rse.no_penalty", 0), ("none", 1), ("rse.no_penalty", 1)
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "clm_none_s0.json", "clm_none_s1.json", "clm_rse.no_penalty_s0.json",
        "clm_rse.no_penalty_s1.json",
    ]  # fmt: skip
    by = {(r["arm"], r["seed"]): r for r in results}
    assert by["none", 0]["curves"]["train"]["loss"] != by["none", 1]["curves"]["train"]["loss"]
    assert by["none", 1]["identity"]["train_config"]["seed"] == 1
    ablation = by["rse.no_penalty", 0]
    assert ablation["encoding"] == "rse"
    assert ablation["learned_values"]["layer0"]["distance_penalty"] == [0.0] * TINY.num_heads


def test_every_ablation_changes_its_encoding_as_it_says():
    torch.manual_seed(0)
    models = {a.name: MiniBert(TINY.model_config(a.name, "mlm")) for a in ABLATIONS}
    assert set(arm_names()) == {*sequence_encodings(), *models}
    attention = {name: model.layers[0].attention for name, model in models.items()}
    assert attention["rse.no_penalty"].distance_penalty.tolist() == [0.0] * TINY.num_heads
    assert not any(
        "distance_penalty" in n for n, _ in attention["rse.no_penalty"].named_parameters()
    )
    assert attention["rse.softmax"].normaliser == "softmax"
    assert attention["rse.stick_bias"].stick_bias.tolist() == [-3.0] * TINY.num_heads
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
    with pytest.raises(ValueError, match="valid"):
        get_arm("rse.no_such_thing")


def test_command_line_takes_seeds_and_ablations(tmp_path, capsys):
    args = ["--preset", "tiny", "--encodings", "none", "--ablations", "learned.unit_init"]
    args += ["--seeds", "3", "--objectives", "clm", "--out", str(tmp_path)]
    args += ["--no-progress", "--stop-after-steps", "2"]
    assert main(args) == 0
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert checkpoints == ["clm_learned.unit_init_s3.pt", "clm_none_s3.pt"]
    for bad in (["--seeds", "-1"], ["--seeds", "x"], ["--ablations", "rse.nothing"]):
        with pytest.raises(SystemExit):
            main(["--preset", "tiny", *bad])
        assert "valid" in capsys.readouterr().err or bad[0] == "--seeds"


def test_paired_differences_call_a_direction_only_when_every_seed_agrees():
    def run(arm, seed, loss):
        return {"objective": "clm", "arm": arm, "seed": seed,
                "metrics": {"final_val_loss": loss}, "probes": {}}  # fmt: skip

    agree = [run("a", 0, 1.0), run("a", 1, 2.0), run("b", 0, 1.5), run("b", 1, 2.1)]
    result = paired(agree, "clm", "a", "b", "val_loss")
    assert result.verdict == "lower" and result.differences == pytest.approx({0: -0.5, 1: -0.1})
    mixed = [*agree[:3], run("b", 1, 1.9)]
    assert paired(mixed, "clm", "a", "b", "val_loss").verdict == "within noise"
    assert Paired({0: -1.0}).verdict == "within noise"  # one seed never makes a verdict
    spread = Spread({0: 1.0, 1: 2.0, 2: 3.0})
    assert (spread.mean, spread.sd, spread.low, spread.high) == (2.0, 1.0, 1.0, 3.0)
    assert spread.text(2) == "2.00 ± 1.00"
    assert paired(agree, "clm", "a", "missing", "val_loss") is None


# -- pieces ----------------------------------------------------------------------------------


def test_learning_rate_warms_up_then_decays_to_the_floor():
    steps, peak, warmup, floor = 100, 1e-3, 10, 0.1
    lrs = [learning_rate_at(s, steps, peak, warmup, floor) for s in range(steps)]
    assert lrs[0] == pytest.approx(peak / warmup)
    assert lrs[warmup - 1] == pytest.approx(peak) and lrs[warmup] == pytest.approx(peak)
    assert all(a <= b for a, b in zip(lrs[:warmup], lrs[1 : warmup + 1], strict=True))
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1 :], strict=False))
    assert lrs[-1] == pytest.approx(peak * floor)


def test_extrapolation_scores_the_same_tokens_at_every_length():
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (4000,))
    for objective in ("clm", "mlm"):
        model = MiniBert(TINY.model_config("rope", objective))
        entries = extrapolation_losses(model, tokens, 16, (1, 2, 4), eval_tokens=640)
        assert [e["length"] for e in entries] == [16, 32, 64]
        assert len({e["tokens"] for e in entries}) == 1
        assert all(math.isfinite(e["loss"]) for e in entries)
    learned = MiniBert(replace(TINY.model_config("learned", "clm"), max_position_embeddings=16))
    entries = extrapolation_losses(learned, tokens, 16, (1, 2), eval_tokens=640)
    assert [e["status"] for e in entries] == ["ok", "not_applicable"]


def test_bad_presets_are_refused():
    with pytest.raises(ValueError, match="valid"):
        compare.choose_preset("huge")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            compare.choose_preset("gpu")
    with pytest.raises(ValueError, match="training length"):
        replace(TINY, train=replace(TINY.train, seq_len=16))


def test_position_buckets_score_the_same_targets_and_bucket_zero_is_the_training_length():
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (6000,))
    model = MiniBert(TINY.model_config("rope", "clm"))
    entries = position_bucket_losses(model, tokens, 16, (1, 2, 4, 8), eval_tokens=1280)
    assert [(e["start"], e["end"]) for e in entries] == [(0, 16), (16, 32), (32, 64), (64, 128)]
    assert [e["tokens"] for e in entries] == [10 * 16, 10 * 16, 10 * 32, 10 * 64]
    # causal: the first 16 targets of a window see only the first 16 tokens, as in training
    inputs, targets = spread_windows(tokens, 128, 10)
    with torch.no_grad():
        logits = model(inputs[:, :16]).logits
    direct = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[:, :16].flatten())
    assert entries[0]["loss"] == pytest.approx(float(direct), rel=1e-5)
    learned = MiniBert(replace(TINY.model_config("learned", "mlm"), max_position_embeddings=16))
    entries = position_bucket_losses(learned, tokens, 16, (1, 2), eval_tokens=640)
    assert [e["status"] for e in entries] == ["ok", "not_applicable"]
    with pytest.raises(ValueError, match="increase"):
        position_bucket_losses(model, tokens, 16, (2, 1))
