"""One encoding, one file: an encoding registered from this file alone works everywhere.

The toy encoding is a fixed linear distance penalty (``-m_h |p_i - p_j|``, ``m_h = 0.1 * (h+1)``)
under softmax, expressed with the kernels' existing ``linear_distance`` hook. Nothing outside this
file is edited for it, and yet the reference attention, its module via ``get_attention_class``,
the Triton backend (forward and backward), ``MiniBert``, the comparison's command line and every
check of the registry conformance tests accept it.
"""

import json

import pytest
import torch
from test_registry_conformance import run_check

from course_lib import conformance
from course_lib.attention import attention, attention_weights, get_attention_class
from course_lib.encodings import REGISTRY
from course_lib.encodings.distance import LINEAR_DISTANCE, linear_distance_bias
from course_lib.kernel_hooks import ScoreBias
from course_lib.layers import PositionalSelfAttention
from course_lib.model import BertConfig, MiniBert
from course_lib.registry import REQUIRED, Encoding, register, unregister

NAME = "toy_linear_penalty"


class ToyPenaltyAttention(PositionalSelfAttention):
    """Softmax attention with a fixed penalty ``0.1 * (h + 1)`` per unit of distance."""

    encoding = NAME

    def __init__(self, hidden_size, num_heads, *args, **kwargs):
        super().__init__(hidden_size, num_heads, *args, **kwargs)
        self.register_buffer("slopes", 0.1 * torch.arange(1, num_heads + 1, dtype=torch.float32))

    def attention_params(self, hidden_states):
        return {"slopes": self.slopes.to(hidden_states.dtype)}


def toy_bias(query_positions, key_positions, params):
    """-m_h |p_i - p_j| with fixed slopes"""
    return linear_distance_bias(query_positions, key_positions, params["slopes"])


TOY = Encoding(
    name=NAME,
    chapter="99_toy",
    summary="a fixed linear distance penalty (a test of the registry)",
    module=ToyPenaltyAttention,
    color="#17becf",
    score_bias=toy_bias,
    params={"slopes": REQUIRED},
    kernel_bias=lambda params, positions: ScoreBias(LINEAR_DISTANCE, params["slopes"]),
    relative=True,
    distance_only=True,  # a score_bias of |p_i - p_j| alone (distance_bias would derive it)
)


@pytest.fixture
def toy():
    register(TOY)
    try:
        yield TOY
    finally:
        unregister(NAME)


def test_the_registry_lists_it_only_while_registered(toy):
    assert NAME in REGISTRY and get_attention_class(NAME) is ToyPenaltyAttention
    unregister(NAME)
    assert NAME not in REGISTRY
    register(TOY)  # the fixture removes it again


def test_reference_attention_is_the_formula(toy):
    q, k, v = torch.randn(3, 2, 3, 7, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    slopes = torch.tensor([0.1, 0.2, 0.3])
    p = torch.arange(7) * 2
    weights = attention_weights(q, k, method=NAME, position_ids=p, slopes=slopes)
    scores = q @ k.transpose(-1, -2) / 8**0.5 - slopes.view(3, 1, 1) * (p[:, None] - p).abs()
    torch.testing.assert_close(weights, scores.softmax(-1))
    out = attention(q, k, v, method=NAME, position_ids=p, slopes=slopes)
    torch.testing.assert_close(out, scores.softmax(-1) @ v)


@pytest.mark.parametrize("check", list(conformance.CHECKS))
def test_passes_every_conformance_check(toy, check):
    run_check(check, NAME)


def test_minibert_trains_a_step(toy):
    torch.manual_seed(0)
    model = MiniBert(BertConfig(vocab_size=30, hidden_size=16, num_heads=2, encoding=NAME))
    ids = torch.randint(0, 30, (2, 9))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.layers[0].attention.query.weight.grad is not None


def test_comparison_command_line_runs_it(toy, tmp_path):
    from course_lib.compare import main

    main(["--preset", "tiny", "--encodings", NAME, "--objectives", "clm", "--out", str(tmp_path)])
    # the runs' results files (besides them: the sittings' log, sessions.json)
    results = [json.loads(p.read_text()) for p in tmp_path.glob("clm_*_s[0-9]*.json")]
    assert [r["encoding"] for r in results] == [NAME]
