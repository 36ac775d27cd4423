"""Inputs at the edges that used to give a wrong answer or an unclear error: narrow integer
positions, half-precision bias parameters, a key/value cache shared by two layers, a gradient of
a gradient through the kernels, a full-length mask on a cached step, numpy integers as sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from course_lib.attention import attention
from course_lib.encodings import alibi_slopes
from course_lib.gpu_check.cases import method_params
from course_lib.layers import KVCache
from course_lib.model import BertConfig, MiniBert
from course_lib.registry import attention_methods, get_encoding
from course_lib.runtime import kernel_device, kernels_available

needs_kernels = pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")

#: The methods whose bias or rotation reads the distance between two positions.
SEQUENCE_METHODS = [
    name
    for name, enc in attention_methods().items()
    if enc is not None and enc.uses_positions and enc.position_dims == 1
]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
@pytest.mark.parametrize("method", SEQUENCE_METHODS)
def test_narrow_integer_positions_give_what_int64_positions_give(method, dtype):
    # uint8 differences wrap around (3 - 5 = 254) unless positions are widened first
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16) for _ in range(3))
    params = method_params(get_encoding(method), batch=1, heads=2, head_dim=16, seq=6,
                           device="cpu")  # fmt: skip
    causal = get_encoding(method).causal_only
    wide = torch.tensor([0, 3, 5, 9, 20, 21])
    expected = attention(q, k, v, method=method, causal=causal, position_ids=wide, **params)
    got = attention(q, k, v, method=method, causal=causal, position_ids=wide.to(dtype), **params)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # signed ones wrap too once two positions are further apart than the dtype holds (int32's
    # reach, 2^31, is past what the methods' float32 angles and decays hold anyway)
    if dtype in (torch.int8, torch.int16):
        low, high = torch.iinfo(dtype).min, torch.iinfo(dtype).max
        spread = torch.tensor([low, low + 1, 0, high - 7, high - 1, high])
        expected = attention(q, k, v, method=method, causal=causal, position_ids=spread, **params)
        got = attention(q, k, v, method=method, causal=causal, position_ids=spread.to(dtype),
                        **params)  # fmt: skip
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_learned_table_takes_narrow_integer_positions():
    layer = get_encoding("learned").module(32, 2, max_position_embeddings=16)
    x = torch.randn(1, 5, 32)
    expected = layer(x, position_ids=torch.arange(5))
    torch.testing.assert_close(layer(x, position_ids=torch.arange(5, dtype=torch.int16)), expected)


@pytest.mark.parametrize("method", ["alibi", "rse", "kerple"])
def test_a_half_precision_bias_parameter_is_computed_in_float32(method):
    # float16 holds no distance past 65504; both backends compute the bias in float32
    params = method_params(get_encoding(method), batch=1, heads=2, head_dim=16, seq=9,
                           device="cpu")  # fmt: skip
    if method == "alibi":  # the paper's slopes unless given
        params["slopes"] = alibi_slopes(2)
    half = {n: p.half() if torch.is_tensor(p) and p.is_floating_point() else p
            for n, p in params.items()}  # fmt: skip
    first = {"alibi": "slopes", "rse": "distance_penalty"}.get(method)
    if first:  # a slope of 0 times a distance float16 made inf gave NaN
        half[first] = half[first].clone()
        half[first][0] = 0
    positions = torch.arange(9) * 10_000
    q = torch.randn(1, 2, 9, 16)
    exact = {n: p.float() if torch.is_tensor(p) and p.is_floating_point() else p
             for n, p in half.items()}  # fmt: skip
    got = attention(q, q, q, method=method, position_ids=positions, **half)
    expected = attention(q, q, q, method=method, position_ids=positions, **exact)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected)


def test_a_cache_shared_by_two_layers_is_refused():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=20, hidden_size=32, num_layers=2, num_heads=2,
                        encoding="rope", objective="clm")  # fmt: skip
    model = MiniBert(config)
    ids = torch.randint(0, 20, (1, 6))
    with pytest.raises(ValueError, match=r"another attention layer.*\[KVCache\(\)\] \* n"):
        model(ids, cache=[KVCache()] * 2)
    first, second = (get_encoding("rope").module(32, 2) for _ in range(2))
    cache, x = KVCache(), torch.randn(1, 3, 32)
    first(x, causal=True, cache=cache)
    with pytest.raises(ValueError, match="already holds the keys of another attention layer"):
        second(x, causal=True, cache=cache)
    first(x[:, :1], causal=True, cache=cache)  # its own layer goes on
    assert cache.length == 4


def test_a_full_length_mask_on_a_cached_step_says_the_mask_covers_the_new_tokens():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=20, hidden_size=32, num_layers=1, num_heads=2,
                        encoding="alibi", objective="clm")  # fmt: skip
    model, cache = MiniBert(config), None
    ids = torch.randint(0, 20, (2, 5))
    cache = model.new_cache()
    model(ids, attention_mask=torch.ones(2, 5, dtype=torch.bool), cache=cache)
    full = torch.ones(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"covers the new tokens only.*attention_mask\[:, -1:\]"):
        model(ids[:, :1], attention_mask=full, cache=cache)


@needs_kernels
@pytest.mark.parametrize("method", ["softmax", "rope", "stick_breaking", "cope"])
def test_a_gradient_of_a_gradient_through_the_kernels_is_refused(method):
    # the kernels' backward has no graph of its own: asked for one, it says so instead of
    # handing back gradients whose own gradient is silently 0
    device = kernel_device()
    params = method_params(get_encoding(method) if method != "softmax" else None, batch=1,
                           heads=2, head_dim=16, seq=8, device=device)  # fmt: skip
    q, k, v = (torch.randn(1, 2, 8, 16, device=device, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, method=method, causal=True, backend="triton", **params)
    with pytest.raises(RuntimeError, match="first derivatives only.*backend='reference'"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
    out = attention(q, k, v, method=method, causal=True, backend="triton", **params)
    (grad,) = torch.autograd.grad(out.sum(), q)  # a first derivative still works
    assert grad.shape == q.shape


@needs_kernels
def test_a_bias_one_kernel_family_lacks_points_to_the_reference():
    q = torch.randn(1, 2, 8, 16, device=kernel_device())
    gates = torch.full((1, 2, 8), -0.3, device=kernel_device())
    kwargs = dict(method="fox", causal=True, log_forget=gates, normaliser="stick_breaking")
    with pytest.raises(ValueError, match="flash kernels only.*Use backend='reference'"):
        attention(q, q, q, backend="triton", **kwargs)
    assert torch.isfinite(
        attention(q.cpu(), q.cpu(), q.cpu(), **{**kwargs, "log_forget": gates.cpu()})
    ).all()


def test_dynamic_scaling_with_only_negative_positions_asks_for_seq_len():
    q = torch.randn(1, 2, 17, 16)
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
    positions = torch.arange(17) - 50
    with pytest.raises(ValueError, match=r"largest position \+ 1, here -33.*Pass seq_len"):
        attention(q, q, q, method="rope", scaling=scaling, position_ids=positions)
    out = attention(q, q, q, method="rope", scaling=scaling, position_ids=positions, seq_len=17)
    assert out.shape == q.shape


def test_numpy_integers_are_integers_to_the_constructors():
    assert torch.equal(alibi_slopes(np.int64(4)), alibi_slopes(4))
    layer = get_encoding("t5").module(np.int64(32), np.int64(2), num_buckets=np.int64(16))
    assert layer.hidden_size == 32 and isinstance(layer.hidden_size, int)
    cope = get_encoding("cope").module(32, 2, npos=np.int64(8))
    assert cope.npos == 8 and isinstance(cope.npos, int)
    for bad in (True, 2.0, "3"):
        with pytest.raises(ValueError, match="num_heads must be a positive integer"):
            alibi_slopes(bad)
