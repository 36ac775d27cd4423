"""Bad input gets a clear error or the right answer: attention, the encodings' functions, the
modules, the key/value cache and MiniBert.

One test per cause: it feeds the bad input and checks the error's message (what was wrong, what
is allowed) or the result, on both backends where both apply. Methods are enumerated from the
registry, so a new encoding is covered with no edit. The comparison's command line and files are
in test_bad_input_compare.py; the property test over every encoding is test_properties.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from course_lib.attention import attention, attention_weights, get_attention_class
from course_lib.encodings import REGISTRY, alibi_slopes, apply_rope, rope_frequencies
from course_lib.encodings.comrope import comrope_generators
from course_lib.encodings.learned import LearnedAttention
from course_lib.encodings.liere import apply_block_rotation
from course_lib.encodings.rope import RoPEAttention, rope_angles
from course_lib.encodings.rope_2d import apply_rope_2d
from course_lib.layers import KVCache
from course_lib.model import BertConfig, MiniBert
from course_lib.registry import attention_methods, get_encoding
from course_lib.runtime import kernel_device, kernels_available

#: Every ``attention(method=...)`` name: "softmax" and each encoding that acts in attention.
METHODS = list(attention_methods())

needs_kernels = pytest.mark.skipif(
    not kernels_available(), reason="Triton is not installed (it ships wheels for Linux only)"
)
BACKENDS = ["reference", pytest.param("triton", marks=needs_kernels)]


# -- helpers (test_properties.py uses them too) ---------------------------------------------------
def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def device_for(backend: str) -> torch.device:
    """Where a backend's tensors live: the CPU for the reference, the kernels' device for Triton."""
    return kernel_device() if backend == "triton" else torch.device("cpu")


def method_kwargs(
    method: str,
    *,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: torch.device | str = "cpu",
    spread: float = 0.5,
) -> dict:
    """``method`` and what ``attention(method=...)`` needs besides q, k, v: the encoding's
    parameters taken from its own module (its learned ones redrawn with std ``spread``), its
    positions, and ``causal=True`` where the method has no bidirectional form."""
    if method == "softmax":
        return {"method": method}
    spec = get_encoding(method)
    torch.manual_seed(seed)
    hidden = heads * head_dim
    module = get_attention_class(method)(hidden, heads, max_position_embeddings=64)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.split(".")[0] not in ("query", "key", "value", "out"):
                p.normal_(0.0, spread, generator=gen(seed + 1))
    module = module.to(dtype=dtype)
    x = torch.randn(batch, seq, hidden, generator=gen(seed + 2)).to(dtype)
    kwargs = {"method": method}
    for key, value in module.attention_params(x).items():
        kwargs[key] = value.detach().clone().to(device) if torch.is_tensor(value) else value
    if spec.uses_positions:
        kwargs["position_ids"] = positions(method, seq).to(device)
    if spec.causal_only:
        kwargs["causal"] = True
    return kwargs


def positions(method: str, seq: int, offset: int = 0) -> torch.Tensor:
    """``arange(seq) + offset``, or the (row, column) of a grid 4 columns wide for an encoding
    with two coordinates per token."""
    index = torch.arange(seq)
    if get_encoding(method).position_dims == 1:
        return index + offset
    return torch.stack((index // 4, index % 4), dim=-1) + offset


def qkv(batch=2, heads=2, seq=8, head_dim=16, dtype=torch.float32, seed=0, device="cpu"):
    q, k, v = torch.randn(3, batch, heads, seq, head_dim, generator=gen(seed)).unbind(0)
    return (t.to(device=device, dtype=dtype) for t in (q, k, v))


def no_kernel(method: str) -> str | None:
    """The sentence of a method the Triton backend has no kernel for (None: it has one)."""
    return REGISTRY[method].kernel_support if method in REGISTRY else None


# -- attention: scale (silent-wrong 3) ------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "scale, error, message",
    [
        (float("nan"), ValueError, "finite number > 0, got nan"),
        (float("inf"), ValueError, "finite number > 0, got inf"),
        (-0.5, ValueError, "finite number > 0, got -0.5"),
        (0, ValueError, "finite number > 0, got 0"),
        ("0.25", TypeError, "must be a real number, got '0.25'"),
        (True, TypeError, "must be a real number, got True"),
        (torch.tensor(0.25), TypeError, "must be a real number"),
    ],
)
def test_scale_must_be_a_finite_number_above_zero(backend, scale, error, message):
    q, k, v = qkv(device=device_for(backend))
    with pytest.raises(error, match=message):
        attention(q, k, v, scale=scale, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_takes_any_real_number(backend):
    q, k, v = qkv(device=device_for(backend))
    expected = attention(q, k, v, scale=0.25)
    for scale in (0.25, np.float32(0.25), np.float64(0.25)):
        out = attention(q, k, v, scale=scale, backend=backend)
        torch.testing.assert_close(out.cpu(), expected.cpu(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        attention(q, k, v, scale=1, backend=backend).cpu(),
        attention(q, k, v, scale=1.0).cpu(),
        atol=1e-4,
        rtol=1e-4,
    )


# -- attention: every tensor parameter is finite (silent-wrong 5) ---------------------------------
TENSOR_METHODS = [
    m
    for m in METHODS
    if any(torch.is_tensor(v) for v in method_kwargs(m, batch=1, heads=2, seq=8).values())
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", TENSOR_METHODS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_every_tensor_parameter_must_be_finite(method, backend, bad):
    """LieRE's generators and ComRoPE's basis and angles included: one check in attention()
    covers every tensor parameter of every method."""
    device = device_for(backend)
    q, k, v = qkv(batch=1, seq=8, device=device)
    kwargs = method_kwargs(method, batch=1, heads=2, seq=8, device=device)
    for name, value in kwargs.items():
        if not torch.is_tensor(value) or not value.is_floating_point():
            continue
        broken = value.contiguous().clone()
        broken.view(-1)[0] = bad
        with pytest.raises(ValueError, match=f"method={method!r}: {name} must be finite"):
            attention(q, k, v, backend=backend, **{**kwargs, name: broken})


def test_liere_and_comrope_refuse_non_finite_parameters():
    """The two that used to escape the check, named."""
    q, k, v = qkv(batch=1, seq=8)
    coords = positions("liere", 8)
    generators = torch.randn(2, 2, 4, 4)
    generators[1, 0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="generators must be finite"):
        attention(q, k, v, method="liere", generators=generators, position_ids=coords)
    basis, angles = torch.randn(2, 4, 4), torch.randn(2, 2, 2)
    for name in ("basis", "angles"):
        bad = {"basis": basis.clone(), "angles": angles.clone()}
        bad[name].view(-1)[-1] = float("inf")
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            attention(q, k, v, method="comrope", position_ids=coords, **bad)


# -- attention: padded keys contribute nothing (silent-wrong 7) -----------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_padded_keys_contribute_nothing_whatever_they_hold(method, backend):
    """NaN or inf in the k and v rows of padded keys never reaches a real query's output."""
    if backend == "triton" and no_kernel(method):
        pytest.skip(no_kernel(method))
    device = device_for(backend)
    seq, real = 9, torch.tensor([[9], [6]])
    q, k, v = qkv(seq=seq, device=device)
    mask = (torch.arange(seq)[None] < real).to(device)
    kwargs = method_kwargs(method, batch=2, heads=2, seq=seq, device=device)
    clean = attention(q, k, v, key_padding_mask=mask, backend=backend, **kwargs)
    assert torch.isfinite(clean).all()
    for bad in (float("nan"), float("inf")):
        k_bad, v_bad = k.clone(), v.clone()
        k_bad[1, :, 6:] = bad
        v_bad[1, :, 6:] = bad
        out = attention(q, k_bad, v_bad, key_padding_mask=mask, backend=backend, **kwargs)
        torch.testing.assert_close(out[0], clean[0])
        torch.testing.assert_close(out[1, :, :6], clean[1, :, :6])


# -- attention: CoPE propagates NaN like every method (unclear error) -----------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_cope_with_a_nan_query_gives_nan_in_that_row_like_softmax(backend):
    """It used to fail with an IndexError (a NaN count used as a row number)."""
    device = device_for(backend)
    q, k, v = qkv(device=device)
    q[0, 1, 3, 5] = float("nan")
    table = torch.randn(8, 16, generator=gen(3)).to(device)
    for method, extra in (("softmax", {}), ("cope", {"position_embeddings": table})):
        out = attention(q, k, v, method=method, causal=True, backend=backend, **extra)
        nan_rows = torch.isnan(out).any(-1)
        assert nan_rows[0, 1, 3] and int(nan_rows.sum()) == 1, method


def test_cope_with_overflowing_scores_gives_nan_like_softmax():
    q, k, v = qkv()
    table = torch.randn(8, 16, generator=gen(3))
    huge = attention(q * 1e30, k * 1e30, v, method="cope", causal=True, position_embeddings=table)
    plain = attention(q * 1e30, k * 1e30, v, causal=True)
    assert torch.equal(torch.isnan(huge), torch.isnan(plain))


# -- attention: meta tensors (unclear error) ------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_meta_tensors_give_shapes_on_the_reference_and_a_clear_refusal_on_triton(method):
    q, k, v = (torch.empty(2, 2, 8, 16, device="meta") for _ in range(3))
    kwargs = method_kwargs(method, batch=2, heads=2, seq=8, device="meta")
    out = attention(q, k, v, **kwargs)
    assert out.device.type == "meta" and out.shape == q.shape
    if kernels_available() and not no_kernel(method):
        with pytest.raises(ValueError, match="got a tensor on 'meta'"):
            attention(q, k, v, backend="triton", **kwargs)


# -- attention: empty input -----------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("batch, seq", [(0, 8), (2, 0)])
def test_an_empty_batch_or_sequence_gives_the_empty_answer(method, backend, batch, seq):
    device = device_for(backend)
    q, k, v = qkv(batch=batch, seq=seq, device=device)
    for t in (q, k, v):
        t.requires_grad_()
    kwargs = method_kwargs(method, batch=max(batch, 1), heads=2, seq=seq, device=device)
    if batch == 0 and method in REGISTRY:  # per-key tensors (FoX's gates) have the call's batch
        for name in REGISTRY[method].per_key_params:
            kwargs[name] = kwargs[name][:0]
    out = attention(q, k, v, backend=backend, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    out.sum().backward()  # an empty gradient, not an error
    weights = attention_weights(q, k, **kwargs)
    assert weights.shape == (batch, 2, seq, seq)


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_dim_zero_is_refused(backend):
    q, k, v = qkv(head_dim=0, device=device_for(backend))
    with pytest.raises(ValueError, match="head_dim is 0 .* at least one channel"):
        attention(q, k, v, backend=backend)


def test_dynamic_rope_at_seq_zero_gives_the_empty_answer():
    q, k, v = qkv(seq=0)
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
    assert attention(q, k, v, method="rope", scaling=dynamic).shape == q.shape
    assert apply_rope(q, torch.arange(0), scaling=dynamic).shape == q.shape


# -- RoPE scaling options (silent-wrong 6, 11; unclear errors) ------------------------------------
def yarn(**options):
    return {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, **options}


@pytest.mark.parametrize(
    "scaling, error, message",
    [
        (yarn(attention_factor=float("nan")), ValueError, "attention_factor .* finite number > 0"),
        (yarn(attention_factor=-1.0), ValueError, "attention_factor .* > 0, got -1.0"),
        (yarn(attention_factor=0.0), ValueError, "attention_factor .* > 0, got 0.0"),
        (yarn(mscale=float("nan"), mscale_all_dim=1.0), ValueError, "mscale must be a finite"),
        (yarn(mscale_all_dim=-1.0, mscale=1.0), ValueError, "mscale_all_dim .* >= 0, got -1.0"),
        (yarn(beta_fast=1.0, beta_slow=32.0), ValueError, "beta_fast > beta_slow > 0"),
        (yarn(beta_fast=4.0, beta_slow=4.0), ValueError, "beta_fast > beta_slow > 0"),
        (yarn(beta_fast=0), ValueError, "beta_fast .* finite number > 0, got 0"),
        (yarn(beta_slow=-1), ValueError, "beta_slow .* finite number > 0, got -1"),
        (yarn(beta_fast=float("inf")), ValueError, "beta_fast .* finite number > 0, got inf"),
        (yarn(truncate="yes"), TypeError, "truncate must be True or False"),
        (yarn(original_max_position_embeddings=True), TypeError, "must be an integer, got True"),
        (yarn(original_max_position_embeddings=0), ValueError, "integer >= 1, got 0"),
        (yarn(factor=float("nan")), ValueError, "factor must be a number >= 1 .* got nan"),
        ({"rope_type": "linear", "factor": True}, ValueError, "factor must be a number >= 1 .* True"),
        ({"rope_type": "linear", "factor": "2"}, ValueError, "factor must be a number >= 1 .* '2'"),
        ({"rope_type": "ntk", "factor": 1e308}, ValueError, "overflow a float; use a smaller"),
        ({"rope_type": "dynamic", "factor": 1e308, "original_max_position_embeddings": 4},
         ValueError, "overflow a float"),
    ],
)  # fmt: skip
def test_rope_scaling_options_are_checked(scaling, error, message):
    with pytest.raises(error, match=message):
        rope_frequencies(16, scaling=scaling, seq_len=64)
    q, k, v = qkv()
    with pytest.raises(error, match=message):
        attention(q, k, v, method="rope", scaling=scaling)


def test_ntk_scaling_needs_four_channels():
    for rope_type in ("ntk", "dynamic"):
        scaling = {"rope_type": rope_type, "factor": 2.0, "original_max_position_embeddings": 4}
        with pytest.raises(ValueError, match=r"needs head_dim >= 4 \(got head_dim=2"):
            rope_frequencies(2, scaling=scaling, seq_len=8)


def test_valid_yarn_options_still_work():
    inv_freq, factor = rope_frequencies(16, scaling=yarn(beta_fast=16, beta_slow=2))
    assert torch.isfinite(inv_freq).all() and factor == pytest.approx(0.1 * math.log(4) + 1)
    _, factor = rope_frequencies(16, scaling=yarn(mscale=1.0, mscale_all_dim=0.0))
    assert factor == pytest.approx(0.1 * math.log(4) + 1)  # 0 = not given, as in Hugging Face
    _, factor = rope_frequencies(16, scaling=yarn(attention_factor=2))
    assert factor == 2.0


def test_head_dim_may_be_a_numpy_integer():
    torch.testing.assert_close(rope_frequencies(np.int64(16))[0], rope_frequencies(16)[0])
    with pytest.raises(ValueError, match="positive even integer .* got True"):
        rope_frequencies(True)


# -- direct calls make the checks attention() makes (silent-wrong 9) ------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_rotations_refuse_inputs_that_are_not_real_floats(dtype):
    x = torch.ones(1, 2, 8, 16).to(dtype)
    with pytest.raises(TypeError, match=f"real floating-point tensor .* got {dtype}"):
        apply_rope(x, torch.arange(8))
    with pytest.raises(TypeError, match=f"real floating-point tensor .* got {dtype}"):
        apply_rope_2d(x, positions("rope_2d", 8))
    with pytest.raises(TypeError, match=f"real floating-point tensor .* got {dtype}"):
        apply_block_rotation(x, positions("liere", 8), torch.randn(2, 4, 4))


@pytest.mark.parametrize("base", [0, -1.0, float("nan"), float("inf"), True, "100"])
def test_a_base_must_be_a_finite_number_above_zero(base):
    x = torch.randn(1, 2, 8, 16)
    error = TypeError if isinstance(base, (bool, str)) else ValueError
    with pytest.raises(error, match="RoPE base must be a"):
        rope_frequencies(16, base=base)
    with pytest.raises(error, match="RoPE base must be a"):
        apply_rope(x, torch.arange(8), base=base)
    with pytest.raises(error, match="RoPE base must be a"):
        rope_angles(torch.arange(8), 16, base)
    with pytest.raises(error, match="2D RoPE base must be a"):
        apply_rope_2d(x, positions("rope_2d", 8), base=base)
    with pytest.raises(error, match="block scales' base must be a"):
        apply_block_rotation(x, positions("liere", 8), torch.randn(2, 4, 4), base=base)
    for method in ("rope", "rope_2d", "liere", "comrope"):
        kwargs = method_kwargs(method, batch=2, heads=2, seq=8)
        with pytest.raises(error, match="base must be a"):
            attention(*qkv(), **{**kwargs, "base": base})


def test_rope_positions_must_be_integers():
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        apply_rope(torch.randn(1, 2, 8, 16), torch.arange(8.0))
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        apply_rope(torch.randn(1, 2, 8, 16), torch.arange(8).to(torch.complex64))


# -- the learned table (unclear error) ------------------------------------------------------------
def test_learned_table_names_the_negative_position():
    module = LearnedAttention(32, 2, max_position_embeddings=8)
    x = torch.randn(1, 3, 32)
    with pytest.raises(ValueError, match="got position -1: .* must be >= 0"):
        module(x, position_ids=torch.tensor([-1, 6, 2]))
    with pytest.raises(ValueError, match="got position 9. .*resize_position_table"):
        module(x, position_ids=torch.tensor([0, 9, 2]))


# -- modules (low-impact unclear errors) ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_a_module_refuses_hidden_states_of_another_dtype(dtype):
    module = RoPEAttention(32, 2)
    with pytest.raises(TypeError, match=f"hidden_states are {dtype} but the module's weights"):
        module(torch.randn(1, 4, 32).to(dtype))
    assert module.to(dtype)(torch.randn(1, 4, 32).to(dtype)).dtype == dtype


def test_a_module_refuses_integer_hidden_states():
    with pytest.raises(TypeError, match="hidden_states must be floating-point"):
        RoPEAttention(32, 2)(torch.ones(1, 4, 32, dtype=torch.long))


def test_a_module_takes_other_dtypes_under_autocast():
    module = RoPEAttention(32, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(torch.randn(1, 4, 32).bfloat16())
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "dropout, error", [("0.1", TypeError), (True, TypeError), (1.0, ValueError), (-0.1, ValueError)]
)
def test_dropout_must_be_a_probability_below_one(dropout, error):
    with pytest.raises(error, match="dropout"):
        RoPEAttention(32, 2, dropout=dropout)
    with pytest.raises(error, match="dropout"):
        BertConfig(vocab_size=20, hidden_size=32, num_heads=2, dropout=dropout)


# -- the key/value cache (silent-wrong 11, unclear error) -----------------------------------------
def test_a_cache_refuses_keys_and_values_of_different_lengths():
    with pytest.raises(ValueError, match=r"k and v must have the same shape .*\(1, 2, 3, 16\)"):
        KVCache().append(
            torch.randn(1, 2, 3, 16), torch.randn(1, 2, 5, 16), torch.arange(3)[None], None
        )


def test_a_cache_belongs_to_one_batch():
    model = clm_model()
    cache = model.new_cache()
    model(torch.tensor([[1, 2]]), cache=cache)
    with pytest.raises(
        ValueError, match="holds keys of batch 1.* new keys have batch 2.*new_cache"
    ):
        model(torch.tensor([[1], [2]]), cache=cache)


def test_a_cache_refuses_keys_of_another_dtype():
    cache = KVCache()
    cache.append(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), torch.arange(3)[None], None)
    k = torch.randn(1, 2, 1, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="torch.float32 on cpu; the new keys .* torch.float64"):
        cache.append(k, k, torch.tensor([[3]]), None)


# -- MiniBert and its config (silent-wrong 8, 11; unclear errors) ---------------------------------
def clm_model(**config) -> MiniBert:
    torch.manual_seed(0)
    options = dict(vocab_size=20, hidden_size=32, num_layers=1, num_heads=2, objective="clm")
    return MiniBert(BertConfig(**{**options, **config})).eval()


@pytest.mark.parametrize(
    "field, value, error, message",
    [
        ("num_layers", -1, ValueError, "num_layers must be an integer >= 1, got -1"),
        ("num_layers", 0, ValueError, "num_layers must be an integer >= 1, got 0"),
        ("vocab_size", -5, ValueError, "vocab_size must be an integer >= 1, got -5"),
        ("hidden_size", 32.0, TypeError, "hidden_size must be an integer, got 32.0"),
        ("num_heads", True, TypeError, "num_heads must be an integer, got True"),
        ("intermediate_size", 0, ValueError, "intermediate_size must be an integer >= 1"),
        ("max_position_embeddings", -1, ValueError, "max_position_embeddings must be an integer"),
        ("encoding_options", "fast", TypeError, "encoding_options must be None or a dict"),
        ("backend", "cuda", ValueError, "valid: 'reference', 'triton'"),
    ],
)
def test_config_checks_its_sizes_and_options(field, value, error, message):
    options = dict(vocab_size=20, hidden_size=32, num_heads=2)
    with pytest.raises(error, match=message):
        BertConfig(**{**options, field: value})


def test_input_ids_must_be_integer_token_ids():
    model = clm_model()
    with pytest.raises(TypeError, match="input_ids .* integer tensor, got torch.bool"):
        model(torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="input_ids .* integer tensor, got torch.float32"):
        model(torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"in \[0, 20\), got values from 0 to 25"):
        model(torch.tensor([[0, 25]]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(2, 0), (0, 4)])
def test_an_empty_batch_or_sequence_gives_empty_logits(backend, shape):
    model = clm_model(backend=backend).to(device_for(backend))
    out = model(torch.zeros(shape, dtype=torch.long, device=device_for(backend)))
    assert out.logits.shape == (*shape, 20) and out.loss is None


def test_a_loss_over_no_labels_is_refused():
    model = clm_model()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="every label is -100 .* at least one label"):
        model(ids, labels=torch.full_like(ids, -100))
    with pytest.raises(ValueError, match=r"labels must be token ids in \[0, 20\) or -100"):
        model(ids, labels=torch.tensor([[1, -100, 20]]))
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        model(ids, labels=ids.float())
    assert torch.isfinite(model(ids, labels=torch.tensor([[-100, 4, -100]])).loss)


def test_the_cache_is_a_list_of_kv_caches():
    model = clm_model()
    with pytest.raises(TypeError, match="list of KVCache, one per layer .* got KVCache"):
        model(torch.tensor([[1, 2]]), cache=KVCache())


@pytest.mark.parametrize(
    "temperature, error, message",
    [
        (-1.0, ValueError, "temperature .* finite number >= 0, got -1.0"),
        (float("nan"), ValueError, "temperature .* finite number >= 0, got nan"),
        (float("inf"), ValueError, "temperature .* finite number >= 0, got inf"),
        (True, TypeError, "temperature .* real number, got True"),
        ("0.7", TypeError, "temperature .* real number, got '0.7'"),
    ],
)
def test_generate_takes_a_temperature_of_zero_or_more(temperature, error, message):
    with pytest.raises(error, match=message):
        clm_model().generate(torch.tensor([[1, 2]]), 3, temperature=temperature)


@pytest.mark.parametrize(
    "count, error, message",
    [
        (-2, ValueError, "max_new_tokens must be an integer >= 0, got -2"),
        (2.5, TypeError, "max_new_tokens must be an integer, got 2.5"),
        (True, TypeError, "max_new_tokens must be an integer, got True"),
    ],
)
def test_generate_takes_a_whole_number_of_new_tokens(count, error, message):
    with pytest.raises(error, match=message):
        clm_model().generate(torch.tensor([[1, 2]]), count)


def test_generate_needs_a_prompt_token_and_gives_empty_answers_for_an_empty_batch():
    model = clm_model()
    with pytest.raises(ValueError, match=r"at least one token per row .* got shape \(1, 0\)"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    assert model.generate(torch.zeros(0, 2, dtype=torch.long), 3).shape == (0, 5)
    prompt = torch.tensor([[1, 2]])
    assert torch.equal(model.generate(prompt, 0), prompt)
    greedy = model.generate(prompt, 4)
    assert torch.equal(model.generate(prompt, np.int64(4), temperature=0), greedy)


def test_comrope_generators_are_finite_for_half_precision_parameters():
    """matrix_exp in float16 gave NaN: the generators are computed in float32."""
    basis, angles = torch.randn(2, 4, 4, generator=gen(5)), torch.randn(2, 2, 2, generator=gen(6))
    expected = comrope_generators(basis, angles)
    for dtype in (torch.float16, torch.bfloat16):
        half = comrope_generators(basis.to(dtype), angles.to(dtype))
        assert half.dtype == torch.float32
        torch.testing.assert_close(half, expected, atol=3e-2, rtol=3e-2)


def test_bools_are_not_numbers_for_module_options():
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got True"):
        alibi_slopes(True)
    with pytest.raises(TypeError, match="init_std must be a real number, got True"):
        LearnedAttention(32, 2, init_std=True)
    with pytest.raises(ValueError, match="init_std must be a finite number > 0, got nan"):
        LearnedAttention(32, 2, init_std=float("nan"))
