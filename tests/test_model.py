"""The mini BERT: heads, parameter counts, cached decoding with the right positions."""

import pytest
import torch

from course_lib.encodings import REGISTRY
from course_lib.model import BertConfig, MiniBert

# Sequence encodings whose output depends on the position ids (in the inputs or in attention).
POSITIONAL = [
    name for name, e in REGISTRY.items() if (e.inputs or e.uses_positions) and e.position_dims == 1
]


def model(encoding, objective="clm", **kw):
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        encoding=encoding,
        objective=objective,
        max_position_embeddings=32,
        **kw,
    )
    return MiniBert(cfg).double().eval()


@pytest.mark.parametrize("encoding", POSITIONAL)
def test_decoding_at_position_zero_is_the_bug_the_cache_prevents(encoding):
    """Feeding the new token at position 0 (the classic RoPE decode bug) changes the logits;
    the default (cache.length) gives the full-pass logits."""
    m = model(encoding)
    ids = torch.randint(0, 40, (1, 6), generator=torch.Generator().manual_seed(2))
    full_last = m(ids).logits[:, -1]
    cache = m.new_cache()
    m(ids[:, :5], cache=cache)
    buggy = m(ids[:, 5:], cache=cache, position_ids=torch.tensor([0])).logits[:, -1]
    assert not torch.allclose(buggy, full_last, atol=1e-6)
    cache = m.new_cache()
    m(ids[:, :5], cache=cache)
    torch.testing.assert_close(m(ids[:, 5:], cache=cache).logits[:, -1], full_last)


def test_generate_matches_greedy_full_recompute():
    m = model("rope")
    prompt = torch.randint(0, 40, (2, 3), generator=torch.Generator().manual_seed(3))
    out = m.generate(prompt, 5)
    seq = prompt
    for _ in range(5):
        seq = torch.cat((seq, m(seq).logits[:, -1].argmax(-1, keepdim=True)), 1)
    assert torch.equal(out, seq)


def test_mlm_is_bidirectional_and_clm_is_causal():
    ids = torch.randint(0, 40, (1, 8), generator=torch.Generator().manual_seed(4))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 40
    clm, mlm = model("rope", "clm"), model("rope", "mlm")
    torch.testing.assert_close(clm(ids).logits[:, :-1], clm(changed).logits[:, :-1])
    assert not torch.allclose(mlm(ids).logits[:, 0], mlm(changed).logits[:, 0])


def test_loss_ignores_minus_100_and_parameter_counts_by_part():
    m = model("learned", "mlm")
    ids = torch.randint(0, 40, (2, 8))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    out = m(ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[:, 3].float(), ids[:, 3])
    torch.testing.assert_close(out.loss, expected)
    counts = m.parameter_counts()
    assert counts["total"] == sum(p.numel() for p in m.parameters())
    assert counts["position_embeddings"] == 2 * 32 * 32  # one table per layer
    assert model("rope", "mlm").parameter_counts()["position_embeddings"] == 0
    assert counts["total"] - model("absolute", "mlm").parameter_counts()["total"] == 2 * 32 * 32


def test_model_errors():
    with pytest.raises(ValueError, match="valid: 'none'"):
        BertConfig(vocab_size=10, encoding="not_an_encoding")
    with pytest.raises(ValueError, match="valid: 'mlm', 'clm'"):
        BertConfig(vocab_size=10, objective="seq2seq")
    m = model("learned")
    with pytest.raises(ValueError, match="32 rows"):
        m(torch.zeros(1, 33, dtype=torch.long))
    m.resize_position_tables(64)
    assert m(torch.zeros(1, 33, dtype=torch.long)).logits.shape == (1, 33, 40)
    with pytest.raises(ValueError, match="no learned position table"):
        model("rope").resize_position_tables(64)
    with pytest.raises(ValueError, match="causal"):
        model("rope", "mlm").generate(torch.zeros(1, 2, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"\[0, 40\)"):
        model("rope")(torch.full((1, 3), 40))
