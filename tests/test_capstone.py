"""Chapter 11's pieces: the scratch package, the FIRE exercise's checker and its solution file.

The checker must accept the formula and reject the usual mistakes, each with its own advice; the
solution file, written to the scratch package, must pass every conformance check (the fused
kernels included, through the per-distance table while every query is below L) and refuse the
fused path, clearly, once a query passes L.
"""

import pytest
import torch

from course_lib.conformance import check_encoding
from course_lib.registry import REGISTRY, unregister
from course_lib.runtime import kernels_available
from course_lib.teaching import capstone_checks
from course_lib.teaching.capstone_checks import check_fire_bias
from course_lib.teaching.scratch import write_encoding
from course_lib.teaching.solutions.nb11 import FIRE_FILE, fire_bias, fire_mlp


def test_the_checker_accepts_the_formula(capsys):
    assert check_fire_bias(fire_bias)
    assert "fire_bias: correct" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", list(capstone_checks._MISTAKES))
def test_the_checker_names_each_usual_mistake(mistake, capsys):
    assert not check_fire_bias(capstone_checks._variant(mistake))
    assert capstone_checks._MISTAKES[mistake] in capsys.readouterr().out


def _tie_split_by_maximum(query_positions, key_positions, params):
    first = key_positions.amin(dim=-1, keepdim=True)
    i = (query_positions - first).double()
    j = (key_positions - first).double()
    distance = (i.unsqueeze(-1) - j.unsqueeze(-2)).clamp_min(0)
    reach = torch.maximum(i, params["L"])  # splits the gradient at a tie
    ratio = torch.log1p(params["c"] * distance) / torch.log1p(params["c"] * reach).unsqueeze(-1)
    return fire_mlp(ratio, params).movedim(0, 1)


def test_the_checker_rejects_a_tie_that_gives_l_a_gradient(capsys):
    assert not check_fire_bias(_tie_split_by_maximum)
    out = capsys.readouterr().out
    assert "not yet" in out and "L gets no gradient" in out


def _distance_not_clamped(query_positions, key_positions, params):
    first = key_positions.amin(dim=-1, keepdim=True)
    i = (query_positions - first).double()
    j = (key_positions - first).double()
    distance = i.unsqueeze(-1) - j.unsqueeze(-2)  # negative after the query: log1p of < -1
    reach = torch.where(i >= params["L"], i, params["L"])
    ratio = torch.log1p(params["c"] * distance) / torch.log1p(params["c"] * reach).unsqueeze(-1)
    return fire_mlp(ratio, params).movedim(0, 1)


def test_the_checker_names_a_distance_not_clamped_not_the_tie(capsys):
    assert not check_fire_bias(_distance_not_clamped)
    out = capsys.readouterr().out
    assert "clamp the distance at 0" in out and "tie" not in out


def test_the_checker_reports_a_wrong_shape_and_an_error(capsys):
    assert not check_fire_bias(lambda q, k, p: fire_bias(q, k, p)[0])
    assert not check_fire_bias(lambda q, k, p: 1 / 0)
    out = capsys.readouterr().out
    assert "expected (2, 3, 10, 10)" in out and "ZeroDivisionError" in out


@pytest.fixture
def fire():
    write_encoding("fire", FIRE_FILE)
    try:
        yield REGISTRY["fire"]
    finally:
        unregister("fire")


def test_a_rerun_replaces_the_file_s_encoding(fire):
    write_encoding("fire", FIRE_FILE.replace('"#8c564b"', '"#000000"'))
    assert REGISTRY["fire"].color == "#000000"
    with pytest.raises(ValueError, match="identifier"):
        write_encoding("not a name", FIRE_FILE)
    with pytest.raises(ValueError, match="register"):
        write_encoding("empty", "x = 1\n")


def test_the_fire_file_passes_every_conformance_check(fire):
    report = check_encoding("fire")
    assert report.passed, str(report)
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["distance"] == "pass" and statuses["shift"] == "pass"
    if kernels_available():
        assert statuses["triton"] == statuses["generation"] == "pass"


@pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")
def test_fire_on_the_kernels_refuses_queries_past_l(fire):
    from course_lib.attention import get_attention_class

    module = get_attention_class("fire")(32, 2, backend="triton")
    x = torch.randn(1, 70, 32)  # positions 0-69 pass L = 64 (its initial value)
    with pytest.raises(ValueError, match="below L = 64.0"):
        module(x, causal=True)
    assert module(x[:, :64], causal=True).shape == (1, 64, 32)


def test_the_checker_rejects_a_bias_that_cuts_the_gradients_of_c_and_l(capsys):
    def cut(query, key, params):  # float() of a learned parameter: right values, no gradient
        fixed = dict(params, c=torch.tensor(float(params["c"].detach()), dtype=torch.float64))
        return fire_bias(query, key, fixed)

    assert not check_fire_bias(cut)
    assert "the gradient of c is none" in capsys.readouterr().out
