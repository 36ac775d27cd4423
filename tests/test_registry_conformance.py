"""Every registered encoding through the same checks: the registry drives the parametrisation.

An encoding added to ``course_lib.encodings`` is picked up here with no edit: reference vs Triton
(outputs and gradients, padding, causal and bidirectional where allowed), cached decoding equals
the full pass, the shift property its record claims, permutation behaviour, float64 gradcheck,
and clear errors for bad input.
"""

import pytest
import torch

from course_lib.attention import attention, get_attention_class
from course_lib.model import BertConfig, MiniBert
from course_lib.registry import REGISTRY, REQUIRED, get_encoding
from course_lib.runtime import kernel_device, kernels_available

NAMES = list(REGISTRY)
PROJECTIONS = ("query", "key", "value", "out")
needs_kernels = pytest.mark.skipif(
    not kernels_available(), reason="Triton is not installed (it ships wheels for Linux only)"
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def causal_modes(name):
    """The masks an encoding allows: causal and bidirectional, or causal only."""
    return [True] if get_encoding(name).causal_only else [True, False]


def make_module(name, hidden=32, heads=4, dtype=torch.float64, backend="reference", seed=0):
    """The encoding's module, with its own parameters moved away from their initial values (so
    a gradient or a penalty that should matter does)."""
    torch.manual_seed(seed)
    module = get_attention_class(name)(hidden, heads, max_position_embeddings=64, backend=backend)
    with torch.no_grad():
        for pname, p in module.named_parameters():
            if pname.split(".")[0] not in PROJECTIONS:
                p.normal_(0.0, 0.5, generator=gen(seed + 1))
    return module.to(dtype)


def example_params(name, heads, dtype=torch.float64, seed=0, batch=1, seq=3):
    """The keyword parameters ``attention(method=name)`` needs for ``batch`` sequences of ``seq``
    tokens, taken from the encoding's module (leaf tensors, so gradients can be checked against
    them; per-key ones are computed from random hidden states)."""
    hidden = 8 * heads
    module = make_module(name, hidden=hidden, heads=heads, dtype=dtype, seed=seed)
    x = torch.randn(batch, seq, hidden, generator=gen(seed), dtype=dtype)
    params = module.attention_params(x)
    return {
        key: value.detach().clone().requires_grad_() if torch.is_tensor(value) else value
        for key, value in params.items()
    }


def positions(name, seq, offset=0):
    """Positions of ``seq`` tokens: ``arange(seq) + offset``, or for two coordinates per token
    the (row, column) of a grid 4 columns wide, both shifted by ``offset``."""
    index = torch.arange(seq)
    if get_encoding(name).position_dims == 1:
        return index + offset
    return torch.stack((index // 4, index % 4), dim=-1) + offset


def positions_kw(name, seq, offset=0):
    used = get_encoding(name).uses_positions
    return {"position_ids": positions(name, seq, offset)} if used else {}


def module_positions_kw(name, seq, offset=0):
    """What a module needs: positions are optional for sequences, required for 2-D tokens."""
    needed = get_encoding(name).position_dims != 1 or offset
    return {"position_ids": positions(name, seq, offset)} if needed else {}


# -- the claims of each record -------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_permutation_behaviour(name):
    """Only an encoding with no position signal anywhere is permutation-equivariant."""
    spec = get_encoding(name)
    module = make_module(name)
    x = torch.randn(2, 10, 32, generator=gen(3), dtype=torch.float64)
    perm = torch.randperm(10, generator=gen(4))
    kw = {"causal": spec.causal_only, **module_positions_kw(name, 10)}
    equivariant = torch.allclose(module(x[:, perm], **kw), module(x, **kw)[:, perm], atol=1e-10)
    no_signal = spec.inputs is None and not spec.acts_in_attention
    assert equivariant == (no_signal and not spec.causal_only)


@pytest.mark.parametrize("name", NAMES)
def test_shift_property_matches_the_claim(name):
    """``relative`` claims: shifting every position by the same amount changes nothing."""
    spec = get_encoding(name)
    module = make_module(name)
    x = torch.randn(1, 8, 32, generator=gen(5), dtype=torch.float64)
    for causal in causal_modes(name):
        base = module(x, causal=causal, position_ids=positions(name, 8))
        shifted = module(x, causal=causal, position_ids=positions(name, 8, offset=40))
        assert torch.allclose(base, shifted, atol=1e-8) == spec.relative, (name, causal)


@pytest.mark.parametrize("name", NAMES)
def test_padding_does_not_change_real_tokens(name):
    module = make_module(name)
    x = torch.randn(1, 6, 32, generator=gen(6), dtype=torch.float64)
    for causal in causal_modes(name):
        ref = module(x, causal=causal, **module_positions_kw(name, 6))
        for extra in (2, 7):
            xp = torch.cat((x, torch.randn(1, extra, 32, dtype=torch.float64) * 10), 1)
            mask = torch.arange(6 + extra)[None] < 6
            kw = module_positions_kw(name, 6 + extra)
            out = module(xp, attention_mask=mask, causal=causal, **kw)[:, :6]
            torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("name", NAMES)
def test_cached_decoding_equals_the_full_pass(name):
    if get_encoding(name).position_dims != 1:
        pytest.skip("decoding is for sequences; this encoding places tokens in 2-D")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40, hidden_size=32, num_layers=2, num_heads=4, encoding=name,
        objective="clm", max_position_embeddings=32,
    )  # fmt: skip
    model = MiniBert(config).double().eval()
    ids = torch.randint(0, 40, (2, 11), generator=gen(1))
    full = model(ids).logits
    cache = model.new_cache()
    pieces = [model(ids[:, :4], cache=cache).logits]
    for t in range(4, 11):
        pieces.append(model(ids[:, t : t + 1], cache=cache).logits)
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-10, rtol=1e-10)
    assert cache[0].length == 11


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name):
    spec = get_encoding(name)
    q, k, v = (
        t.requires_grad_()
        for t in torch.randn(3, 1, 2, 5, 8, generator=gen(7), dtype=torch.float64)
    )
    params = example_params(name, heads=2, seq=5)
    tensors = {key: p for key, p in params.items() if torch.is_tensor(p)}
    mask = torch.tensor([[True, True, False, True, True]])
    for causal in causal_modes(name):

        def fn(q, k, v, *values, causal=causal):
            kw = {**params, **dict(zip(tensors, values, strict=True))}
            return attention(
                q, k, v, method=spec.method, causal=causal, key_padding_mask=mask,
                **positions_kw(name, 5, offset=2), **kw,
            )  # fmt: skip

        assert torch.autograd.gradcheck(fn, (q, k, v, *tensors.values()), fast_mode=True)


@pytest.mark.parametrize("name", NAMES)
def test_clear_errors_for_bad_input(name):
    spec = get_encoding(name)
    q, k, v = torch.randn(3, 2, 2, 6, 8, generator=gen(8)).unbind(0)
    params = example_params(name, heads=2, dtype=torch.float32, batch=2, seq=6)
    method = spec.method
    params = {**params, "causal": spec.causal_only}
    with pytest.raises(TypeError, match="takes no parameter"):
        attention(q, k, v, method=method, not_a_parameter=1.0, **params)
    with pytest.raises(ValueError, match="4-D"):
        attention(q[0], k[0], v[0], method=method, **params)
    if spec.uses_positions:
        with pytest.raises(ValueError, match="position_ids must have shape"):
            attention(q, k, v, method=method, position_ids=positions(name, 5), **params)
    else:
        with pytest.raises(ValueError, match="uses no position ids"):
            attention(q, k, v, method=method, position_ids=torch.arange(6), **params)
    if spec.causal_only:
        with pytest.raises(ValueError, match="causal only"):
            attention(q, k, v, method=method, **{**params, "causal": False})
    for key, default in spec.params.items():
        if default is REQUIRED:
            rest = {p: value for p, value in params.items() if p != key}
            with pytest.raises(ValueError, match=f"needs {key}"):
                attention(q, k, v, method=method, **rest)
    with pytest.raises(ValueError, match="valid:"):
        get_attention_class(name + "_misspelt")


# -- the fused kernels compute the same function --------------------------------------------------
@needs_kernels
@pytest.mark.parametrize("name", NAMES)
def test_triton_agrees_with_reference_forward_and_backward(name):
    """Modules with backend="triton" vs "reference" (same weights): outputs, and the gradients
    of the input and of every parameter (the encoding's own included), on a ragged length with
    padded keys, causal and bidirectional where allowed."""
    if get_encoding(name).kernel_support:
        pytest.skip(f"no kernel: {get_encoding(name).kernel_support}")
    device = kernel_device()
    reference = make_module(name, hidden=32, heads=2, dtype=torch.float32).to(device)
    fused = make_module(name, hidden=32, heads=2, dtype=torch.float32, backend="triton").to(device)
    fused.load_state_dict(reference.state_dict())
    x = torch.randn(2, 21, 32, generator=gen(9)).to(device)
    mask = (torch.arange(21)[None] < torch.tensor([[21], [17]])).to(device)
    upstream = torch.randn(2, 21, 32, generator=gen(10)).to(device)
    for causal in causal_modes(name):
        results = []
        for module in (reference, fused):
            xi = x.clone().requires_grad_()
            kw = {"position_ids": positions(name, 21, offset=3)}
            out = module(xi, attention_mask=mask, causal=causal, **kw)
            grads = torch.autograd.grad((out * upstream).sum(), [xi, *module.parameters()])
            results.append((out, grads))
        (out_ref, grads_ref), (out_tri, grads_tri) = results
        torch.testing.assert_close(out_tri, out_ref, atol=1e-4, rtol=1e-4)
        for g_tri, g_ref in zip(grads_tri, grads_ref, strict=True):
            torch.testing.assert_close(g_tri, g_ref, atol=2e-4, rtol=1e-3)


@needs_kernels
@pytest.mark.parametrize("name", NAMES)
def test_generate_with_triton_matches_reference(name):
    if get_encoding(name).position_dims != 1:
        pytest.skip("generation is for sequences; this encoding places tokens in 2-D")
    if get_encoding(name).kernel_support:
        pytest.skip(f"no kernel: {get_encoding(name).kernel_support}")
    """A causal model with backend="triton" decodes like the reference one (the prompt runs the
    kernel; each cached step, seq_q < seq_k, runs the reference code of the same function)."""
    config = dict(
        vocab_size=40, hidden_size=32, num_layers=2, num_heads=2, encoding=name,
        objective="clm", max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = MiniBert(BertConfig(**config)).eval()
    fused = MiniBert(BertConfig(**config, backend="triton")).eval()
    fused.load_state_dict(reference.state_dict())
    device = kernel_device()
    prompt = torch.randint(0, 40, (2, 5), generator=gen(11)).to(device)
    torch.testing.assert_close(
        fused.to(device).generate(prompt, 4), reference.to(device).generate(prompt, 4)
    )
