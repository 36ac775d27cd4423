"""The functional attention and the attention modules: properties, padding, gradients, errors."""

import pytest
import torch

from course_lib.attention import METHODS, attention, attention_weights, get_attention_class
from course_lib.layers import ATTENTION_CLASSES

ENCODINGS = ["none", "absolute", "learned", "rope", "exposb", "rse"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def qkv(b=2, h=3, n=9, d=8, dtype=torch.float32, seed=0):
    return torch.randn(3, b, h, n, d, generator=gen(seed), dtype=dtype).unbind(0)


def method_params(method, heads, dtype=torch.float32):
    if method == "rse":
        return {"distance_penalty": torch.linspace(0.0, 0.3, heads, dtype=dtype)}
    return {}


# -- the functional form -------------------------------------------------------------------------
def test_no_position_attention_is_permutation_equivariant():
    q, k, v = qkv()
    perm = torch.randperm(9, generator=gen(1))
    out = attention(q, k, v)
    out_perm = attention(q[:, :, perm], k[:, :, perm], v[:, :, perm])
    torch.testing.assert_close(out_perm, out[:, :, perm])


@pytest.mark.parametrize("method", ["rope", "exposb", "rse"])
def test_position_methods_are_not_permutation_equivariant(method):
    q, k, v = qkv()
    perm = torch.arange(9).flip(0)
    p = method_params(method, 3)
    out = attention(q, k, v, method=method, **p)
    out_perm = attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], method=method, **p)
    assert not torch.allclose(out_perm, out[:, :, perm], atol=1e-4)


@pytest.mark.parametrize("method", ["rope", "rse"])
@pytest.mark.parametrize("causal", [True, False])
def test_relative_methods_are_invariant_to_a_common_shift(method, causal):
    q, k, v = qkv()
    p = method_params(method, 3)
    base = attention(q, k, v, method=method, causal=causal, position_ids=torch.arange(9), **p)
    shifted = attention(
        q, k, v, method=method, causal=causal, position_ids=torch.arange(9) + 777, **p
    )
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-4)


def test_exposb_is_not_invariant_to_a_common_shift():
    q, k, v = qkv()
    base = attention(q, k, v, method="exposb", position_ids=torch.arange(9))
    shifted = attention(q, k, v, method="exposb", position_ids=torch.arange(9) + 777)
    assert not torch.allclose(shifted, base, atol=1e-3)


@pytest.mark.parametrize("method", METHODS)
def test_weights_and_outputs_are_consistent(method):
    q, k, v = qkv(dtype=torch.float64)
    p = method_params(method, 3, torch.float64)
    for causal in (True, False):
        w = attention_weights(q, k, method=method, causal=causal, **p)
        out = attention(q, k, v, method=method, causal=causal, **p)
        expected = w @ v
        if method in ("stick_breaking", "rse"):
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


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [True, False])
def test_padding_gets_zero_weight_and_does_not_change_real_tokens(method, causal):
    q, k, v = qkv(b=1, n=6)
    p = method_params(method, 3)
    pos = {} if method in ("softmax", "stick_breaking") else {"position_ids": torch.arange(6)}
    reference = attention(q, k, v, method=method, causal=causal, **pos, **p)
    for extra in (1, 5):
        pad = torch.randn(3, 1, 3, extra, 8, generator=gen(extra)) * 10
        qp, kp, vp = (
            torch.cat((t, z), dim=2) for t, z in zip((q, k, v), pad.unbind(0), strict=True)
        )
        mask = torch.cat(
            (torch.ones(1, 6, dtype=torch.bool), torch.zeros(1, extra, dtype=torch.bool)), 1
        )
        pos_p = {} if not pos else {"position_ids": torch.arange(6 + extra)}
        w = attention_weights(
            qp, kp, method=method, causal=causal, key_padding_mask=mask, **pos_p, **p
        )
        assert (w[..., 6:] == 0).all()
        out = attention(
            qp, kp, vp, method=method, causal=causal, key_padding_mask=mask, **pos_p, **p
        )
        torch.testing.assert_close(out[:, :, :6], reference, atol=1e-5, rtol=1e-5)


def test_fully_padded_softmax_row_gives_zeros_not_nan():
    q, k, v = qkv(b=1, n=4)
    mask = torch.tensor(
        [[False, True, True, True]]
    )  # left padding: query 0 sees nothing when causal
    out = attention(q, k, v, causal=True, key_padding_mask=mask)
    assert torch.isfinite(out).all()
    assert (out[:, :, 0] == 0).all()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_float64(method, causal):
    q, k, v = (t.requires_grad_() for t in qkv(b=1, h=2, n=5, d=4, dtype=torch.float64))
    mask = torch.tensor([[True, True, False, True, True]])
    inputs = [q, k, v]
    if method == "rse":
        lam = torch.tensor([0.1, 0.4], dtype=torch.float64, requires_grad=True)
        inputs.append(lam)

    def fn(*args):
        extra = {"distance_penalty": args[3]} if method == "rse" else {}
        return attention(*args[:3], method=method, causal=causal, key_padding_mask=mask, **extra)

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


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
        attention(q, k, v, method="alibi")
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
    assert set(ATTENTION_CLASSES) == set(ENCODINGS)
    for name in ENCODINGS:
        assert get_attention_class(name).encoding == name
    with pytest.raises(
        ValueError, match="valid: 'none', 'absolute', 'learned', 'rope', 'exposb', 'rse'"
    ):
        get_attention_class("standard")


def make(name, hidden=32, heads=4, max_pos=64, seed=0):
    torch.manual_seed(seed)
    return get_attention_class(name)(hidden, heads, max_position_embeddings=max_pos).double()


def test_module_without_positions_is_equivariant_and_positional_ones_are_not():
    x = torch.randn(2, 10, 32, generator=gen(3), dtype=torch.float64)
    perm = torch.randperm(10, generator=gen(4))
    for name in ENCODINGS:
        m = make(name)
        equivariant = torch.allclose(m(x[:, perm]), m(x)[:, perm], atol=1e-10)
        assert equivariant == (name == "none"), name


def test_module_shift_invariance_relative_vs_absolute():
    x = torch.randn(1, 8, 32, generator=gen(5), dtype=torch.float64)
    for name in ENCODINGS:
        m = make(name)
        base = m(x, position_ids=torch.arange(8))
        shifted = m(x, position_ids=torch.arange(8) + 40)
        invariant = torch.allclose(base, shifted, atol=1e-8)
        assert invariant == (name in ("none", "rope", "rse")), name


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("causal", [True, False])
def test_module_padding_does_not_change_real_tokens(name, causal):
    m = make(name)
    x = torch.randn(1, 6, 32, generator=gen(6), dtype=torch.float64)
    ref = m(x, causal=causal)
    for extra in (2, 7):
        xp = torch.cat((x, torch.randn(1, extra, 32, dtype=torch.float64)), 1)
        mask = torch.arange(6 + extra)[None] < 6
        torch.testing.assert_close(m(xp, attention_mask=mask, causal=causal)[:, :6], ref)


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
