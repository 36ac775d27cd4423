"""RoPE scaling (position interpolation, NTK-aware, dynamic NTK, YaRN): the published formulas,
Hugging Face's values, plain RoPE at s = 1, the kernels' tables, decoding, and clear errors."""

import math

import pytest
import torch

from course_lib.attention import attention
from course_lib.encodings import apply_rope, rope_frequencies, rope_inverse_frequencies
from course_lib.model import BertConfig, MiniBert
from course_lib.runtime import kernel_device, kernels_available

L = 64  # the training length of every case below
# inv_freq and attention factor from Hugging Face transformers 5.23.0,
# ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=...) with head_dim 16, rope_theta 10000,
# factor 4 and (original_)max_position_embeddings 64, recorded once.
HUGGING_FACE = [
    ({"rope_type": "linear"}, None, 1.0,
     [0.25, 0.0790569, 0.025, 0.00790569, 0.0025, 0.000790569, 0.00025, 7.90569e-05]),
    ({"rope_type": "dynamic"}, 200, 1.0,
     [1, 0.229258, 0.0525594, 0.0120497, 0.00276249, 0.000633324, 0.000145195, 3.32871e-05]),
    ({"rope_type": "dynamic"}, 40, 1.0,
     [1, 0.316228, 0.1, 0.0316228, 0.01, 0.00316228, 0.001, 0.000316228]),
    ({"rope_type": "yarn"}, None, 1.138629436111989,
     [1, 0.237171, 0.05, 0.00790569, 0.0025, 0.000790569, 0.00025, 7.90569e-05]),
    ({"rope_type": "yarn", "beta_fast": 16.0, "beta_slow": 2.0}, None, 1.138629436111989,
     [1, 0.197642, 0.025, 0.00790569, 0.0025, 0.000790569, 0.00025, 7.90569e-05]),
]  # fmt: skip


def scaling(rope_type, factor=4.0, **extra):
    needs_length = rope_type in ("dynamic", "yarn")
    length = {"original_max_position_embeddings": L} if needs_length else {}
    return {"rope_type": rope_type, "factor": factor, **length, **extra}


@pytest.mark.parametrize("case", HUGGING_FACE, ids=lambda c: f"{c[0]['rope_type']}-{c[1]}")
def test_matches_hugging_face(case):
    extra, seq_len, want_factor, want = case
    inv_freq, factor = rope_frequencies(
        16, scaling=scaling(**{"factor": 4.0, **extra}), seq_len=seq_len
    )
    torch.testing.assert_close(inv_freq, torch.tensor(want, dtype=torch.float32), rtol=1e-5, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)


def test_published_formulas():
    plain = rope_inverse_frequencies(64).double()
    s = 8.0
    linear, _ = rope_frequencies(64, scaling=scaling("linear", s))
    torch.testing.assert_close(linear.double(), plain / s, rtol=1e-6, atol=0)  # positions / s
    ntk, _ = rope_frequencies(64, scaling=scaling("ntk", s))
    base = 10000.0 * s ** (64 / 62)  # bloc97: base * s^(D/(D-2))
    torch.testing.assert_close(
        ntk.double(), base ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64), rtol=1e-6, atol=0
    )
    assert ntk[0] == plain[0] and ntk[-1].item() == pytest.approx(plain[-1].item() / s, rel=1e-5)
    _, yarn_factor = rope_frequencies(64, scaling=scaling("yarn", s))
    assert yarn_factor == pytest.approx(0.1 * math.log(s) + 1)  # sqrt(1/t)
    yarn, _ = rope_frequencies(64, scaling=scaling("yarn", s))
    turns = L * yarn.double() / (2 * math.pi)  # how often each pair turns in the training length
    plain_turns = L * plain / (2 * math.pi)
    kept = plain_turns > 32  # beta_fast: fast pairs untouched
    interpolated = plain_turns < 1  # beta_slow: slow pairs divided by s
    torch.testing.assert_close(turns[kept], plain_turns[kept], rtol=1e-6, atol=0)
    torch.testing.assert_close(
        turns[interpolated], plain_turns[interpolated] / s, rtol=1e-6, atol=0
    )


@pytest.mark.parametrize("rope_type", ["linear", "ntk", "dynamic", "yarn"])
def test_every_scaling_is_plain_rope_at_factor_one(rope_type):
    """At s = 1 every scaling is plain RoPE (dynamic: within the training length, since its
    effective factor s*n/L - (s-1) also grows with the current length n)."""
    inv_freq, factor = rope_frequencies(32, scaling=scaling(rope_type, 1.0), seq_len=L)
    torch.testing.assert_close(inv_freq, rope_inverse_frequencies(32), rtol=1e-6, atol=0)
    assert factor == 1.0


def test_dynamic_is_plain_up_to_the_training_length():
    inv_freq, _ = rope_frequencies(32, scaling=scaling("dynamic"), seq_len=L)
    torch.testing.assert_close(inv_freq, rope_inverse_frequencies(32))
    longer, _ = rope_frequencies(32, scaling=scaling("dynamic"), seq_len=4 * L)
    assert (longer[1:] < inv_freq[1:]).all()


def test_apply_rope_scales_by_the_attention_factor_and_stays_relative():
    x = torch.randn(1, 2, 10, 16, generator=torch.Generator().manual_seed(0))
    p = torch.arange(10)
    yarn = scaling("yarn")
    _, factor = rope_frequencies(16, scaling=yarn)
    rotated = apply_rope(x, p, scaling=yarn)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1) * factor)
    q, k, v = torch.randn(3, 1, 2, 10, 16, generator=torch.Generator().manual_seed(1)).unbind(0)
    for rope_type in ("linear", "ntk", "yarn"):
        out = attention(q, k, v, method="rope", scaling=scaling(rope_type), position_ids=p)
        shifted = attention(q, k, v, method="rope", scaling=scaling(rope_type), position_ids=p + 99)
        torch.testing.assert_close(out, shifted, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")
@pytest.mark.parametrize("rope_type", ["linear", "ntk", "dynamic", "yarn"])
def test_kernel_runs_every_scaling_through_its_tables(rope_type):
    device = kernel_device()
    q, k, v = (
        t.to(device).requires_grad_()
        for t in torch.randn(3, 1, 2, 37, 16, generator=torch.Generator().manual_seed(2))
    )
    kw = dict(
        method="rope", causal=True, scaling=scaling(rope_type), position_ids=torch.arange(37) * 5
    )
    upstream = torch.randn(1, 2, 37, 16, generator=torch.Generator().manual_seed(3)).to(device)
    results = []
    for backend in ("reference", "triton"):
        out = attention(q, k, v, backend=backend, **kw)
        results.append((out, torch.autograd.grad((out * upstream).sum(), (q, k, v))))
    (ref, ref_grads), (tri, tri_grads) = results
    torch.testing.assert_close(tri, ref, atol=1e-4, rtol=1e-4)
    for a, b in zip(tri_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_dynamic_decoding_with_the_cache_equals_recomputing_each_prefix():
    """Keys are cached unrotated, so each step rotates every key with the frequencies of the
    current length: with one layer a step's logits equal a full pass over the prefix so far
    (not over the final sequence, whose frequencies differ once it is longer than L). With more
    layers the cached keys and values of layer 2 were computed by layer 1 under earlier
    frequencies, so they differ slightly from a recomputation."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30, hidden_size=32, num_layers=1, num_heads=2, encoding="rope",
        objective="clm", max_position_embeddings=8,
    )  # fmt: skip
    model = MiniBert(config).double().eval()
    for layer in model.layers:
        layer.attention.scaling = {**scaling("dynamic"), "original_max_position_embeddings": 8}
    ids = torch.randint(0, 30, (1, 20), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache()
    model(ids[:, :4], cache=cache)
    for t in range(4, 20):
        step = model(ids[:, t : t + 1], cache=cache).logits[:, -1]
        torch.testing.assert_close(step, model(ids[:, : t + 1]).logits[:, -1])
    assert not torch.allclose(model(ids).logits[:, 10], model(ids[:, :11]).logits[:, -1])


def test_clear_errors():
    with pytest.raises(ValueError, match="valid: 'linear', 'ntk', 'dynamic', 'yarn'"):
        rope_frequencies(16, scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match=">= 1"):
        rope_frequencies(16, scaling={"rope_type": "linear", "factor": 0.5})
    for rope_type in ("dynamic", "yarn"):
        with pytest.raises(ValueError, match="needs 'original_max_position_embeddings'"):
            rope_frequencies(16, scaling={"rope_type": rope_type, "factor": 2.0})
    with pytest.raises(ValueError, match="takes no key"):
        rope_frequencies(16, scaling={"rope_type": "linear", "factor": 2.0, "beta_fast": 3})
    with pytest.raises(TypeError, match="dict or None"):
        rope_frequencies(16, scaling="yarn")
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="valid: 'linear'"):
        attention(q, q, q, method="rope", scaling={"rope_type": "ntk-aware", "factor": 2.0})
