"""The pieces of notebook 07's experiment (course_lib.teaching.rope_scaling_experiment): buckets,
scalings per length, evaluation chunks, per-position losses (full pass and cached decoding) and
the retrieval probe at far positions. Small random models only: fast."""

import pytest
import torch

from course_lib.data import VOCAB_SIZE, retrieval_probe
from course_lib.model import BertConfig, MiniBert
from course_lib.teaching import rope_scaling_experiment as X


def tiny(encoding="rope", seed=0):
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, num_layers=2, num_heads=2,
        encoding=encoding, objective="clm",
    )  # fmt: skip
    return MiniBert(config).eval()


def test_bucket_means_by_hand():
    losses = torch.arange(10, dtype=torch.float64)  # position p has loss p
    got = X.bucket_means(losses, ((0, 4), (4, 8), (8, 16), (16, 32)))
    assert got == [1.5, 5.5, 8.5, None]  # the third bucket is cut at n = 10, the fourth is empty
    windows = torch.stack((losses, losses + 2))  # [2 windows, 10]
    assert X.bucket_means(windows, ((0, 4),)) == [2.5]
    assert X.bucket_means(torch.ones(600)) == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("bad", [torch.ones(2, 3, 4), torch.ones(0)])
def test_bucket_means_rejects_bad_shapes(bad):
    with pytest.raises(ValueError, match="losses must be"):
        X.bucket_means(bad)


def test_bucket_means_rejects_bad_buckets():
    with pytest.raises(ValueError, match="start < end"):
        X.bucket_means(torch.ones(8), ((4, 4),))


def test_scaling_for_each_kind():
    assert X.scaling_for("plain", 512) is None
    linear = X.scaling_for("linear", 512)
    assert linear["rope_type"] == "linear" and linear["factor"] == 8.0
    assert X.scaling_for("yarn", 128)["original_max_position_embeddings"] == X.TRAIN_LEN
    assert X.scaling_for("ntk", 32)["factor"] == 1.0  # never below 1
    assert X.scaling_for("dynamic", 512)["factor"] == 1.0  # follows the current length itself
    with pytest.raises(ValueError, match="unknown RoPE scaling rope_type"):
        X.scaling_for("ntk-by-parts", 128)


def test_set_scaling_reaches_every_layer_and_refuses_other_encodings():
    model = tiny()
    X.set_scaling(model, X.scaling_for("linear", 256))
    assert all(layer.attention.scaling["factor"] == 4.0 for layer in model.layers)
    with pytest.raises(ValueError, match="only a RoPE model"):
        X.set_scaling(tiny("alibi"), None)


def test_eval_chunks_are_next_token_pairs_spread_over_the_stream():
    stream = torch.arange(1000)
    inputs, targets = X.eval_chunks(stream, 100, count=4)
    assert inputs.shape == targets.shape == (4, 100)
    assert torch.equal(targets, inputs + 1)
    assert inputs[:, 0].tolist() == [0, 300, 500, 800]  # chunks 0, 3, 5, 8 of the 9
    everything, _ = X.eval_chunks(stream, 100, count=None)
    assert everything.shape == (9, 100)
    with pytest.raises(ValueError, match="no chunk"):
        X.eval_chunks(torch.arange(50), 100)


def test_position_losses_average_to_the_model_loss():
    model = tiny()
    inputs, targets = X.eval_chunks(torch.randint(0, 256, (2000,)), 48, count=5)
    losses = X.position_losses(model, inputs, targets, batch_size=2)
    assert losses.shape == (5, 48)
    with torch.no_grad():
        want = model(inputs, labels=targets).loss
    torch.testing.assert_close(losses.mean(), want, rtol=1e-5, atol=1e-5)


def test_cached_decoding_scores_like_the_full_pass_without_scaling():
    model = tiny()
    inputs, targets = X.eval_chunks(torch.randint(0, 256, (2000,)), 40, count=3)
    full = X.position_losses(model, inputs, targets)
    decoded = X.dynamic_position_losses(model, inputs, targets)
    torch.testing.assert_close(decoded, full, rtol=1e-4, atol=1e-4)


def test_dynamic_decoding_is_plain_within_the_training_length_and_differs_past_it():
    model = tiny()
    with torch.no_grad():  # sharper attention, so that the angles matter
        for layer in model.layers:
            layer.attention.query.weight.mul_(20)
            layer.attention.key.weight.mul_(20)
    inputs, targets = X.eval_chunks(torch.randint(0, 256, (4000,)), 160, count=2)
    plain = X.position_losses(model, inputs, targets)
    X.set_scaling(model, X.scaling_for("dynamic", 160))
    decoded = X.dynamic_position_losses(model, inputs, targets)
    within = slice(0, X.TRAIN_LEN)
    torch.testing.assert_close(decoded[:, within], plain[:, within], rtol=1e-4, atol=1e-4)
    assert (decoded[:, 100:] - plain[:, 100:]).abs().mean() > 1e-2


def test_retrieval_at_far_positions_is_unchanged_for_plain_rope_but_not_for_interpolation():
    model = tiny()
    probe = retrieval_probe(64, 8, seed=3)
    near = X.retrieval_accuracy(model, probe, probe.input_ids.shape[1])
    inputs = probe.input_ids[:, :-1]
    with torch.no_grad():
        at_zero = model(inputs).logits
        at_500 = model(inputs, position_ids=torch.arange(inputs.shape[1]) + 500).logits
    torch.testing.assert_close(at_500, at_zero, rtol=1e-4, atol=1e-4)  # relative: same logits
    assert X.retrieval_accuracy(model, probe, 512) == near
    X.set_scaling(model, X.scaling_for("linear", 512))
    with torch.no_grad():
        squeezed = model(inputs, position_ids=torch.arange(inputs.shape[1]) + 500).logits
    assert not torch.allclose(squeezed, at_zero, atol=1e-3)  # angles divided by 8
    with pytest.raises(ValueError, match="shorter than the probe"):
        X.retrieval_accuracy(model, probe, 5)


def test_probe_setup_is_seeded():
    setup = X.ProbeSetup(train_examples=8, eval_examples=4)
    assert torch.equal(setup.make("train").input_ids, setup.make("train").input_ids)
    assert setup.make("eval").input_ids.shape == (4, 12)
    with pytest.raises(ValueError, match="split"):
        setup.make("test")


def test_windowed_losses_read_each_token_with_the_window_up_to_it():
    model = tiny("alibi")
    inputs, targets = X.eval_chunks(torch.randint(0, 256, (3000,)), 40, count=3)
    full = X.position_losses(model, inputs, targets)
    torch.testing.assert_close(X.windowed_position_losses(model, inputs, targets, 40), full)
    windowed = X.windowed_position_losses(model, inputs, targets, window=8, batch_size=7)
    assert windowed.shape == (3, 40)
    torch.testing.assert_close(windowed[:, :8], full[:, :8])  # the first window is the full pass
    for p in (8, 21, 39):  # each later token: its own window of 8 tokens ending at it
        alone = X.position_losses(model, inputs[:, p - 7 : p + 1], targets[:, p - 7 : p + 1])
        torch.testing.assert_close(windowed[:, p], alone[:, -1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(windowed[:, 8:], full[:, 8:], atol=1e-4)  # a shorter context
    with pytest.raises(ValueError, match="window must be"):
        X.windowed_position_losses(model, inputs, targets, window=0)


def test_merge_results_joins_disjoint_seeds_in_order():
    common = {"train_len": 64, "lengths": [128], "buckets": [[0, 64]], "model_config": {},
              "train_config": {}, "finetune": {}, "probe": {}, "eval_windows": 4,
              "corpus_source": "x"}  # fmt: skip
    a = {**common, "seeds": [2], "runs": [{"seed": 2}]}
    b = {**common, "seeds": [0, 1], "runs": [{"seed": 0}, {"seed": 1}]}
    merged = X.merge_results([a, b])
    assert merged["seeds"] == [0, 1, 2] and [r["seed"] for r in X.seed_runs(merged)] == [0, 1, 2]
    with pytest.raises(ValueError, match="share seeds"):
        X.merge_results([a, a])
    with pytest.raises(ValueError, match="different 'lengths'"):
        X.merge_results([a, {**b, "lengths": [256]}])


def test_results_over_seeds_are_read_per_seed_and_averaged():
    from course_lib.teaching.rope_scaling_figures import average_runs, seed_values

    def run(seed, shift):
        entry = {"model": "plain", "length": 128, "buckets": [1.0 + shift, None],
                 "mean": 2.0 + shift, "per_position": [shift, 2 * shift], "retrieval": None}  # fmt: skip
        return {"seed": seed, "base": {"rope": {"retrieval_64": shift}}, "zero_shot": [entry],
                "finetuned": [], "windowed": []}  # fmt: skip

    results = {"lengths": [128], "runs": [run(1, 0.5), run(0, 0.1)]}
    assert seed_values(results, "zero_shot", "plain", 128) == [2.1, 2.5]  # seed order
    assert seed_values(results, "base", "rope", 0, lambda b: b["retrieval_64"]) == [0.1, 0.5]
    mean = average_runs(results)
    (entry,) = mean["zero_shot"]
    assert entry["buckets"] == [pytest.approx(1.3), None] and entry["retrieval"] is None
    assert entry["per_position"] == [pytest.approx(0.3), pytest.approx(0.6)]
    assert mean["base"]["rope"]["retrieval_64"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="no single zero_shot entry"):
        seed_values(results, "zero_shot", "ntk", 128)
