"""What the kernels learn of a positions tensor, and how often they wait for it.

``course_lib.position_facts.position_facts`` reads a positions tensor's span, whether each row
steps by a constant (and by how much), and whether it is ordered, in one transfer to the host,
remembered for the rest of one ``attention()`` call. Checked here: the facts against a direct
row-by-row computation; one host read per call, a new read after an in-place change and in the
next call (a NumPy edit between calls is seen); a slice does not inherit its base's facts;
positions built by ``arange_positions`` (what every layer builds) are never read; and through
``attention()`` on the Triton path (launches planned, not run): no host read of positions for
default or layer-built positions, one per call otherwise; and the finiteness of every tensor
parameter read once per call, still refused clearly.
"""

import pytest
import torch

from course_lib.call_scope import call_scope
from course_lib.host_reads import HostReads
from course_lib.position_facts import PositionFacts, arange_positions, position_facts
from course_lib.registry import get_encoding, sequence_encodings
from course_lib.runtime import kernels_available


def _direct(rows: list[list[int]]) -> PositionFacts:
    spans, steps, affine, ordered = [], [], True, True
    for row in rows:
        spans.append(max(row) - min(row))
        step = row[1] - row[0] if len(row) > 1 else 0
        affine &= all(p - row[0] == step * i for i, p in enumerate(row))
        ordered &= all(b >= a for a, b in zip(row, row[1:], strict=False))
        steps.append(step)
    lo, hi = (min(steps), max(steps)) if affine else (0, 0)
    every = [p for row in rows for p in row]
    return PositionFacts(max(spans), affine, ordered, lo, hi, min(every), max(every))


CASES = {
    "arange": [[0, 1, 2, 3, 4]],
    "offset and step": [[10**9 + 3, 10**9 + 5, 10**9 + 7]],
    "per-sequence steps": [[0, 2, 4, 6], [5, 6, 7, 8]],
    "a gap": [[0, 1, 3, 4]],
    "one gap in the batch": [[0, 1, 2, 3], [0, 1, 2, 4]],
    "backwards": [[9, 6, 3, 0]],
    "constant": [[4, 4, 4]],
    "ordered with a repeat": [[0, 1, 1, 2]],
    "one token": [[7], [3]],
    "negative": [[-(2**40), -(2**40) + 3, -(2**40) + 6]],
}


@pytest.mark.parametrize("name", list(CASES))
def test_facts_match_a_direct_count(name):
    rows = CASES[name]
    assert position_facts(torch.tensor(rows)) == _direct(rows)


def test_facts_are_read_once_and_remembered_for_one_call_only():
    p = torch.tensor([[0, 1, 2, 3]])
    with call_scope():
        with HostReads() as reads:
            first = position_facts(p)
            assert position_facts(p) is first
        assert reads.count == 1 and first.affine
        p[0, 3] = 5  # in place within the call: the version counter moves
        with HostReads() as reads:
            changed = position_facts(p)
        assert reads.count == 1
        assert changed == _direct([[0, 1, 2, 5]]) and not changed.affine
    # the next call reads them again: its values may have changed where no counter sees it
    p.numpy()[0, 3] = 3
    with call_scope(), HostReads() as reads:
        assert position_facts(p) == _direct([[0, 1, 2, 3]])
    assert reads.count == 1
    with HostReads() as reads:  # outside a call nothing is kept
        position_facts(p), position_facts(p)
    assert reads.count == 2


def test_a_slice_does_not_inherit_its_base_facts():
    p = torch.tensor([[0, 1, 2, 10]])
    assert not position_facts(p).affine
    assert position_facts(p[:, :3]) == _direct([[0, 1, 2]])  # affine, span 2
    q = torch.tensor([0, 1, 2, 3, 4, 5])
    assert position_facts(q.view(1, 6)).span == 5
    assert position_facts(q.view(2, 3)) == _direct([[0, 1, 2], [3, 4, 5]])  # rows of 3


@pytest.mark.parametrize("start, seq", [(0, 1), (0, 7), (12, 5)])
def test_arange_positions_carry_their_facts(start, seq):
    with HostReads() as reads:
        p = arange_positions(start, seq)
        facts = position_facts(p[None])  # a view of the same rows shares them
    assert reads.count == 0
    assert p.dtype == torch.int64 and p.tolist() == list(range(start, start + seq))
    assert facts == position_facts(p.clone()[None]) == _direct([p.tolist()])


def _attention_reads(method: str, positions) -> int:
    """Host reads of one planned Triton call (launches recorded, not run), with the parameters
    the GPU check gives ``method``."""
    from course_lib.kernels.common import planned_launches

    from course_lib.attention import attention
    from course_lib.gpu_check.cases import method_params, methods

    q = torch.randn(1, 2, 8, 16)
    params = method_params(methods()[method], batch=1, heads=2, head_dim=16, seq=8, device="cpu")
    with planned_launches(90), torch.no_grad(), HostReads() as reads:
        attention(q, q, q, method=method, causal=True, position_ids=positions,
                  backend="triton", **params)  # fmt: skip
    return reads.count


def _sequence_methods() -> list[str]:
    from course_lib.registry import attention_methods

    return [
        name for name, enc in attention_methods().items()
        if enc is not None and enc.uses_positions and enc.position_dims == 1
        and not enc.kernel_support
    ]  # fmt: skip


@pytest.mark.parametrize("method", _sequence_methods())
def test_attention_reads_given_positions_once_per_call_and_built_ones_never(method):
    # the call's other reads (value checks) are the same either way: the difference is what
    # the positions cost
    if not kernels_available():
        pytest.skip("Triton is not installed")
    built = _attention_reads(method, arange_positions(0, 8))
    assert _attention_reads(method, None) == built
    given = torch.arange(8)
    first, again = _attention_reads(method, given), _attention_reads(method, given)
    assert first - built in (0, 1) and again == first  # the same tensor again: read again
    if get_encoding(method).score_bias is not None:  # the kernels take its positions
        assert first - built == 1


def test_a_calls_value_checks_are_read_in_one_transfer():
    from course_lib.attention import attention

    q = torch.randn(1, 2, 8, 16)
    params = dict(distance_penalty=torch.tensor([0.1, 0.2]))
    with HostReads() as reads:
        attention(q, q, q, method="rse", causal=True, **params)
    kerple = dict(r1=torch.ones(2, requires_grad=True), r2=torch.ones(2, requires_grad=True))
    with HostReads() as kerple_reads:
        attention(q, q, q, method="kerple", causal=True, **kerple)
    with HostReads() as each:  # the same checks one tensor at a time
        for value in (*params.values(), *kerple.values()):
            bool(torch.isfinite(value).all())
    assert each.count == 3
    # RSE: finite and lambda >= 0; KERPLE: finite and r1, r2 > 0: each call's checks in one read
    assert reads.count == 1 and kerple_reads.count == 1
    bad = torch.tensor([0.1, 0.2])
    bad.numpy()[1] = float("nan")  # unseen by any version counter
    with pytest.raises(ValueError, match="distance_penalty must be finite, got 1 entries"):
        attention(q, q, q, method="rse", causal=True, distance_penalty=bad)


def test_a_model_step_reads_back_once_whatever_its_depth():
    # its token ids and labels, checked together; the layers' positions are built, and ALiBi
    # checks no values of its own
    from course_lib.model import BertConfig, MiniBert

    if not kernels_available():
        pytest.skip("Triton is not installed")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=20, hidden_size=32, num_layers=2, num_heads=2,
                        encoding="alibi", backend="triton")  # fmt: skip
    model = MiniBert(config)
    ids = torch.randint(0, 20, (2, 8))
    with HostReads() as reads:
        model(ids, labels=ids).loss.backward()
    assert reads.count == 1


# Reads back to the host in one layer call (forward and backward, positions the layer built),
# and why: each is a wait for the GPU in every layer of every training step, so the list is
# kept short and each entry has a reason. Anything not listed reads nothing.
LAYER_READS = {
    "rse": (1, "its parameters' finiteness and lambda >= 0, read together"),
    "kerple": (1, "its parameters' finiteness and r1, r2 > 0 (r2 <= 2 for the power variant)"),
    "t5": (2, "the table's finiteness; the bucket reach, computed on the host (no GPU wait)"),
    "xpos": (1, "the reach of its scales, computed on the host (no GPU wait)"),
    "cope": (1, "the position vectors' finiteness"),
    "fox": (
        1,
        "the gates' finiteness, their largest (log f <= 0) and lowest (the kernels' sum "
        "bound), read together",
    ),
}


@pytest.mark.parametrize("name", list(sequence_encodings()))
def test_a_layer_reads_back_only_what_its_parameters_need(name):
    from course_lib.kernels.common import planned_launches

    if not kernels_available():
        pytest.skip("Triton is not installed")
    torch.manual_seed(0)
    layer = get_encoding(name).module(32, 2, max_position_embeddings=64, backend="triton")
    x = torch.randn(2, 16, 32, requires_grad=True)
    with planned_launches(90), HostReads() as reads:  # launches recorded, not run
        layer(x, causal=True).sum().backward()
    expected, why = LAYER_READS.get(name, (0, "nothing"))
    assert reads.count == expected, f"{name}: {reads.count} reads, expected {expected} ({why})"


def test_the_gpu_checks_positions_are_built_as_a_layers_are():
    # its speed cases time what a model runs: positions whose facts are known, never read
    from course_lib.gpu_check.cases import positions_for

    positions = positions_for(get_encoding("alibi"), 8, "cpu")
    with HostReads() as reads:
        facts = position_facts(positions[None])
    assert reads.count == 0 and facts == _direct([list(range(8))])
