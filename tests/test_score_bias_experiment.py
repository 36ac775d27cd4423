"""Notebook 06's experiment module: its pieces, and one tiny end-to-end run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from course_lib.data import VOCAB_SIZE, train_val_split
from course_lib.model import BertConfig, MiniBert
from course_lib.teaching import score_bias_experiment as experiment


def tiny_causal_model(encoding: str = "alibi") -> MiniBert:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=16, num_layers=1, num_heads=2, encoding=encoding,
        objective="clm",
    )  # fmt: skip
    return MiniBert(config).eval()


def test_bucket_means_by_hand():
    losses = torch.arange(12, dtype=torch.float32).reshape(2, 6)  # rows 0..5 and 6..11
    means = experiment.bucket_means(losses, ((0, 2), (2, 4), (4, 8), (6, 9)))
    # (0, 2): 0, 1, 6, 7; (2, 4): 2, 3, 8, 9; (4, 8) cut at 6: 4, 5, 10, 11; (6, 9): past the end
    assert means == [3.5, 5.5, 7.5, None]
    with pytest.raises(ValueError, match="windows, n"):
        experiment.bucket_means(torch.zeros(5))
    with pytest.raises(ValueError, match="start < end"):
        experiment.bucket_means(losses, ((3, 3),))


def test_window_losses_cut_chunks_and_causal_prefix():
    model = tiny_causal_model("rope")
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 256, (3, 16), generator=generator)
    targets = torch.randint(0, 256, (3, 16), generator=generator)
    long = experiment.position_losses(model, inputs, targets)
    assert long.shape == (3, 16)
    cut = experiment.window_losses(model, inputs, targets, 4)
    assert cut.shape == (12, 4)
    # The windows of 4 are scored independently: the first of each chunk is its first 4 tokens.
    assert torch.allclose(cut[0::4], long[:, :4], atol=1e-5)
    # A later window starts afresh, so it differs from the same tokens read in context.
    assert not torch.allclose(cut[1::4], long[:, 4:8], atol=1e-3)
    with pytest.raises(ValueError, match="divide"):
        experiment.window_losses(model, inputs, targets, 5)


def test_evaluate_lengths_same_tokens_at_every_length():
    model = tiny_causal_model("alibi")
    generator = torch.Generator().manual_seed(2)
    inputs = torch.randint(0, 256, (2, 512), generator=generator)
    targets = torch.randint(0, 256, (2, 512), generator=generator)
    result = experiment.evaluate_lengths(model, inputs, targets)
    for length in experiment.LENGTHS:
        entry = result[str(length)]
        assert entry["tokens"] == inputs.numel()
        present = [b for b in entry["buckets"] if b is not None]
        assert len(present) == sum(start < length for start, _ in experiment.BUCKETS)
    assert len(result["position_curve"]) == 512
    curve = torch.tensor(result["position_curve"], dtype=torch.float64)
    assert math.isclose(float(curve.mean()), result["512"]["loss"], abs_tol=1e-4)
    # chunk buckets group the tokens by their place in the chunk: the same tokens at every
    # length, so each length's bucket means, weighted by the bucket sizes, give its whole loss
    sizes = [end - start for start, end in experiment.BUCKETS]
    for length in experiment.LENGTHS:
        chunk = result[str(length)]["chunk_buckets"]
        assert all(b is not None for b in chunk)
        whole = sum(b * n for b, n in zip(chunk, sizes, strict=True)) / sum(sizes)
        assert math.isclose(whole, result[str(length)]["loss"], abs_tol=1e-6)
    # at the chunk's own length, a window's positions are the chunk's
    assert result["512"]["chunk_buckets"] == result["512"]["buckets"]
    # windows of 64: the first chunk bucket is the first window of each chunk, read alike
    assert math.isclose(result["64"]["chunk_buckets"][0], result["512"]["chunk_buckets"][0],
                        abs_tol=1e-5)  # fmt: skip


def test_learned_values_report_kerples_two_numbers_per_head():
    model = tiny_causal_model("kerple")
    (layer,) = experiment.learned_values(model)
    assert set(layer) == {"r1", "r2"} and len(layer["r1"]) == 2
    assert all(v > 0 for v in layer["r1"] + layer["r2"])
    assert experiment.learned_values(tiny_causal_model("rope")) == []


def test_kerple_check_accepts_the_solution_and_names_the_usual_mistakes(capsys):
    from course_lib.teaching.kerple_checks import check_kerple_bias
    from course_lib.teaching.solutions import nb06

    assert check_kerple_bias(nb06.kerple_bias)
    mistakes = {
        "the sign": lambda d, r1, r2, v: -nb06.kerple_bias(d, r1, r2, v),
        "|p_i - p_j|": lambda d, r1, r2, v: nb06.kerple_bias(d.clamp(min=0), r1, r2, v),
        "swapped": lambda d, r1, r2, v: nb06.kerple_bias(d, r2, r1, v),
        "shape": lambda d, r1, r2, v: nb06.kerple_bias(d, r1, r2, v).movedim(0, -1),
        "the dtype of r1": lambda d, r1, r2, v: nb06.kerple_bias(d, r1, r2, v).double(),
    }
    for hint, wrong in mistakes.items():
        capsys.readouterr()
        assert not check_kerple_bias(wrong)
        assert hint in capsys.readouterr().out


def test_summarise_spreads_over_seeds():
    def run(encoding, seed, loss):
        lengths = {
            "64": {"loss": loss, "buckets": [loss, None]},
            "128": {"loss": loss + 1, "buckets": [loss, loss + 2]},
            "position_curve": [loss, loss + 2],
        }
        return {"encoding": encoding, "seed": seed, "lengths": lengths}

    runs = [run("alibi", 0, 1.0), run("alibi", 1, 3.0), run("rope", 0, 2.0)]
    summary = experiment.summarise(runs, lengths=(64, 128))
    alibi = summary["alibi"]
    assert alibi["seeds"] == [0, 1]
    assert alibi["64"]["loss"] == {
        "mean": 2.0,
        "std": math.sqrt(2.0),
        "min": 1.0,
        "max": 3.0,
        "n": 2,
    }
    assert alibi["64"]["buckets"][1] is None
    assert alibi["128"]["buckets"][1]["mean"] == 4.0
    assert alibi["position_curve"] == [2.0, 4.0]
    assert summary["rope"]["64"]["loss"]["std"] == 0.0


def test_train_config_is_the_preset_with_a_seed():
    config = experiment.train_config(seed=3)
    assert (config.seed, config.seq_len, config.steps) == (3, experiment.TRAIN_LEN, 300)
    short = experiment.train_config(seed=0, steps=2)
    assert short.steps == 2 and short.warmup_steps < 2 and short.eval_every == 2


def test_tiny_run_writes_results_and_weights(tmp_path):
    results = experiment.run_experiment(
        tmp_path, encodings=("alibi", "kerple"), seeds=(0, 1), steps=2, max_chunks=2,
        progress=False,
    )  # fmt: skip
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["seeds"] == [0, 1] and written["eval_chunks"] == 2
    assert [(r["encoding"], r["seed"]) for r in written["runs"]] == [
        ("alibi", 0), ("kerple", 0), ("alibi", 1), ("kerple", 1),
    ]  # fmt: skip
    assert set(written["summary"]) == {"alibi", "kerple"}
    # KERPLE's learned r1, r2 are kept per layer; ALiBi learns no position numbers
    assert all(("learned" in r) == (r["encoding"] == "kerple") for r in written["runs"])
    for run in written["runs"]:
        for length in experiment.LENGTHS:
            assert math.isfinite(run["lengths"][str(length)]["loss"])
        assert ("live_check" in run) == (run["seed"] == 0)
    # The two seeds differ (initialisation and data order), so the spread is not zero.
    assert written["summary"]["alibi"]["64"]["loss"]["std"] > 0
    # The saved seed-0 weights reproduce the recorded live check.
    _, val = train_val_split()
    for encoding in ("alibi", "kerple"):
        model = experiment.load_model(tmp_path, encoding)
        saved = next(r["live_check"] for r in results["runs"] if r["encoding"] == encoding)
        live = experiment.live_check(model, val, written["live_chunks"])
        assert all(math.isclose(live[k], saved[k], abs_tol=1e-6) for k in saved)
