"""The functional attention and the attention modules: behaviour of the function itself, and the
claims specific to one encoding. What every registered encoding must satisfy is checked in
course_lib.conformance (run per encoding by test_registry_conformance.py)."""

import pytest
import torch

from course_lib.attention import attention, attention_weights, get_attention_class
from course_lib.conformance import example_params, positions
from course_lib.encodings import REGISTRY
from course_lib.registry import attention_methods

METHODS = list(attention_methods())


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def qkv(b=2, h=3, n=9, d=8, dtype=torch.float32, seed=0):
    return torch.randn(3, b, h, n, d, generator=gen(seed), dtype=dtype).unbind(0)


def method_params(method, heads, dtype=torch.float32, batch=2, seq=9):
    """What ``attention(method=...)`` needs besides q, k, v for ``batch`` x ``seq`` tokens: the
    encoding's parameters (from its own module) and, for 2-D encodings, positions."""
    if method == "softmax":
        return {}
    params = example_params(method, heads, dtype, batch=batch, seq=seq)
    if REGISTRY[method].position_dims != 1:
        params["position_ids"] = positions(method, seq)
    return params


# -- the functional form -------------------------------------------------------------------------
def test_no_position_attention_is_permutation_equivariant():
    q, k, v = qkv()
    perm = torch.randperm(9, generator=gen(1))
    out = attention(q, k, v)
    out_perm = attention(q[:, :, perm], k[:, :, perm], v[:, :, perm])
    torch.testing.assert_close(out_perm, out[:, :, perm])


def test_exposb_is_not_invariant_to_a_common_shift():
    q, k, v = qkv()
    base = attention(q, k, v, method="exposb", position_ids=torch.arange(9))
    shifted = attention(q, k, v, method="exposb", position_ids=torch.arange(9) + 777)
    assert not torch.allclose(shifted, base, atol=1e-3)


@pytest.mark.parametrize("method", METHODS)
def test_weights_and_outputs_are_consistent(method):
    q, k, v = qkv(dtype=torch.float64)
    p = method_params(method, 3, torch.float64)
    causal_only = method in REGISTRY and REGISTRY[method].causal_only
    for causal in (True,) if causal_only else (True, False):
        w = attention_weights(q, k, method=method, causal=causal, **p)
        out = attention(q, k, v, method=method, causal=causal, **p)
        expected = w @ v
        if method in REGISTRY and REGISTRY[method].normaliser == "stick_breaking":
            expected = expected + (1 - w.sum(-1, keepdim=True)) * v
            assert (w.sum(-1) <= 1 + 1e-12).all()
        else:
            torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
        torch.testing.assert_close(out, expected)
        if causal:
            assert (w.triu(1) == 0).all()


def test_first_causal_token_of_stick_breaking_outputs_its_own_value():
    q, k, v = qkv()
    out = attention(q, k, v, method="stick_breaking", causal=True)
    torch.testing.assert_close(out[:, :, 0], v[:, :, 0])


def test_fully_padded_softmax_row_gives_zeros_not_nan():
    q, k, v = qkv(b=1, n=4)
    mask = torch.tensor(
        [[False, True, True, True]]
    )  # left padding: query 0 sees nothing when causal
    out = attention(q, k, v, causal=True, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    assert (out[:, :, 0] == 0).all()


def test_suffix_queries_equal_the_last_rows_of_the_full_pass():
    q, k, v = qkv()
    for method in METHODS:
        p = method_params(method, 3)
        full = attention(q, k, v, method=method, causal=True, **p)
        last = attention(q[:, :, -2:], k, v, method=method, causal=True, **p)
        torch.testing.assert_close(last, full[:, :, -2:], atol=1e-5, rtol=1e-5)


# -- errors --------------------------------------------------------------------------------------
def test_clear_errors_for_bad_input():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="valid: 'softmax'"):
        attention(q, k, v, method="not_a_method")
    with pytest.raises(ValueError, match="valid: 'reference', 'triton'"):
        attention(q, k, v, backend="cuda")
    with pytest.raises(ValueError, match="head_dim must be even"):
        attention(*qkv(d=7), method="rope")
    with pytest.raises(TypeError, match="one dtype"):
        attention(q, k.double(), v)
    with pytest.raises(ValueError, match="one device"):
        attention(q, k.to("meta"), v)
    with pytest.raises(ValueError, match="same shape"):
        attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError, match="4-D"):
        attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"shape \[9\] or \[2, 9\]"):
        attention(q, k, v, method="rope", position_ids=torch.arange(8))
    with pytest.raises(TypeError, match="integer"):
        attention(q, k, v, method="rope", position_ids=torch.arange(9.0))
    with pytest.raises(ValueError, match="uses no position ids"):
        attention(q, k, v, position_ids=torch.arange(9))
    with pytest.raises(TypeError, match="bool"):
        attention(q, k, v, key_padding_mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        attention(q, k, v, key_padding_mask=torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs distance_penalty"):
        attention(q, k, v, method="rse")
    with pytest.raises(ValueError, match=">= 0"):
        attention(q, k, v, method="rse", distance_penalty=-torch.ones(3))
    with pytest.raises(ValueError, match=r"\[heads\] = \[3\]"):
        attention(q, k, v, method="rse", distance_penalty=torch.ones(2))
    with pytest.raises(TypeError, match="takes no parameter"):
        attention(q, k, v, method="softmax", base=500.0)


# -- modules -------------------------------------------------------------------------------------
def test_registry_names_and_unknown_name():
    for name in REGISTRY:
        assert get_attention_class(name).encoding == name
    valid = ", ".join(map(repr, REGISTRY))
    with pytest.raises(ValueError, match=f"valid: {valid}"):
        get_attention_class("standard")


def make(name, hidden=32, heads=4, max_pos=64, seed=0):
    torch.manual_seed(seed)
    return get_attention_class(name)(hidden, heads, max_position_embeddings=max_pos).double()


def test_module_errors():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        get_attention_class("rope")(30, 4)
    with pytest.raises(ValueError, match="head_dim must be even"):
        get_attention_class("rope")(28, 4)
    m = get_attention_class("learned")(16, 2, max_position_embeddings=8)
    with pytest.raises(ValueError, match="8 rows.*resize_position_table"):
        m(torch.randn(1, 9, 16))
    with pytest.raises(ValueError, match=r"\[batch, seq, 16\]"):
        m(torch.randn(1, 4, 12))
    with pytest.raises(ValueError, match="backend"):
        get_attention_class("none")(16, 2, backend="gpu")


def test_learned_table_resize_interpolates():
    m = get_attention_class("learned")(16, 2, max_position_embeddings=8)
    old = m.position_embeddings.weight.detach().clone()
    m.resize_position_table(15)
    new = m.position_embeddings.weight.detach()
    torch.testing.assert_close(new[::2], old)  # every other row is an old row
    torch.testing.assert_close(new[1::2], (old[:-1] + old[1:]) / 2)  # the rest are midpoints
    assert m(torch.randn(1, 15, 16)).shape == (1, 15, 16)


def test_rse_distance_penalty_is_nonnegative_and_trainable():
    m = get_attention_class("rse")(16, 2)
    assert (m.distance_penalty >= 0).all()
    m(torch.randn(1, 5, 16), causal=True).sum().backward()
    assert m.distance_penalty_raw.grad is not None and m.distance_penalty_raw.grad.abs().sum() > 0
