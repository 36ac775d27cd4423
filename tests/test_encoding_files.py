"""A new encoding is one file, fused in both kernel families with its gradients, and nothing else.

Each test writes an encoding file into a temporary package, imports it (the file registers its
record), and checks its module with ``backend="triton"`` against ``backend="reference"`` (same
weights): the output, and the gradients of the input and of every parameter, the encoding's own
included, causal and bidirectional, under softmax (flash kernels) and stick-breaking (the same
record with the other normaliser). No other file is edited. The three files:

* a bias of the distance written in torch alone, with learnable parameters (the kernels read it
  from their per-distance table; autograd carries its gradient to the parameters);
* a bias with a ``@triton.jit`` hook of the file's own (its gradient hook included);
* a q/k transform that treats keys differently from queries (its own key tables).
"""

import importlib
import sys
import textwrap

import pytest
import torch

from course_lib.registry import REGISTRY, unregister
from course_lib.runtime import kernel_device, kernels_available

pytestmark = pytest.mark.skipif(not kernels_available(), reason="Triton is not installed")

DISTANCE_FILE = '''
"""A learned bias of the distance: b_ij = -a_h * sqrt(1 + c_h * |p_i - p_j|) (a test file)."""

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register


def sqrt_distance_bias(distances, params):
    """-a_h sqrt(1 + c_h |p_i - p_j|), two learned numbers per head"""
    a = params["a"].view(-1, *([1] * distances.dim()))
    c = params["c"].view(-1, *([1] * distances.dim()))
    return -a * torch.sqrt(1 + c * distances.abs().to(a.dtype))


class SqrtDistanceAttention(PositionalSelfAttention):
    encoding = "{name}"

    def __init__(self, hidden_size, num_heads, *args, **kwargs):
        super().__init__(hidden_size, num_heads, *args, **kwargs)
        self.a_raw = nn.Parameter(torch.linspace(-1.0, 1.0, num_heads))
        self.c_raw = nn.Parameter(torch.linspace(0.5, -0.5, num_heads))

    def attention_params(self, hidden_states):
        return {{"a": F.softplus(self.a_raw), "c": F.softplus(self.c_raw)}}


register(
    Encoding(
        name="{name}", chapter="99_test", summary="a test", module=SqrtDistanceAttention,
        color="#000001", distance_bias=sqrt_distance_bias,
        params={{"a": REQUIRED, "c": REQUIRED}}, relative=True, learnable=True,
    )
)
'''

HOOK_FILE = '''
"""A bias with a Triton hook of its own: b_ij = w_h * cos(0.3 * (p_i - p_j)) (a test file)."""

import torch
from torch import nn

from course_lib.kernel_hooks import ScoreBias
from course_lib.layers import PositionalSelfAttention
from course_lib.registry import REQUIRED, Encoding, register
from course_lib.runtime import kernels_available


def cosine_bias(query_positions, key_positions, params):
    """w_h cos(0.3 (p_i - p_j))"""
    distance = (query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)).unsqueeze(1)
    return params["w"].view(1, -1, 1, 1) * torch.cos(0.3 * distance.to(params["w"].dtype))


COSINE = None
if kernels_available():
    import triton
    import triton.language as tl

    from course_lib.kernels.score_bias import BiasHook, per_head_total

    @triton.jit
    def cosine_bias_tile(idx_q, idx_k, pos_q, pos_k, params, BASE2: tl.constexpr,
                         OPTIONS: tl.constexpr = None):
        weight = tl.load(params)
        if BASE2:
            weight = weight * 1.4426950408889634
        return weight * tl.cos(0.3 * (pos_q - pos_k))

    @triton.jit
    def cosine_bias_grad(acc, ds, idx_q, idx_k, pos_q, pos_k, params, QUERY_AXIS: tl.constexpr,
                         OPTIONS: tl.constexpr = None):
        return acc + tl.sum(ds * tl.cos(0.3 * (pos_q - pos_k)), axis=QUERY_AXIS)

    COSINE = BiasHook(
        name="{name}_cosine", formula="b_ij = w_h cos(0.3 (p_i - p_j))", bias=cosine_bias_tile,
        grad=cosine_bias_grad, param="per_head", reduce=per_head_total,
    )


class CosineAttention(PositionalSelfAttention):
    encoding = "{name}"

    def __init__(self, hidden_size, num_heads, *args, **kwargs):
        super().__init__(hidden_size, num_heads, *args, **kwargs)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, num_heads))

    def attention_params(self, hidden_states):
        return {{"w": self.w}}


register(
    Encoding(
        name="{name}", chapter="99_test", summary="a test", module=CosineAttention,
        color="#000002", score_bias=cosine_bias, params={{"w": REQUIRED}},
        kernel_bias=lambda params, positions: ScoreBias(COSINE, params["w"]),
        kernel_hooks=(COSINE,) if COSINE is not None else (), relative=True, learnable=True,
    )
)
'''

ASYMMETRIC_FILE = '''
"""Queries and keys transformed differently: RoPE with the query's pairs scaled by 2^(p/16) and
the key's by 2^(-p/16), so the score scales by 2^((p_i - p_j)/16) (a test file)."""

import torch

from course_lib.encodings.rope import RoPEAttention, rope_angles, rotate_pairs
from course_lib.kernel_hooks import QKTables
from course_lib.registry import Encoding, register


def _tables(positions, head_dim, sign):
    angles = rope_angles(positions, head_dim)
    scale = torch.exp2(sign * positions.to(torch.float64) / 16).to(torch.float32).unsqueeze(-1)
    return angles.cos() * scale, angles.sin() * scale


def _transform(x, positions, sign):
    cos, sin = _tables(positions, x.shape[-1], sign)
    if positions.dim() == 2 and x.dim() == 4:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    return rotate_pairs(x.to(dt), cos.to(dt), sin.to(dt), "interleaved").to(x.dtype)


def query_transform(x, positions, params):
    """RoPE by p, pairs scaled by 2^(p/16)"""
    return _transform(x, positions, 1.0)


def key_transform(x, positions, params):
    """RoPE by p, pairs scaled by 2^(-p/16)"""
    return _transform(x, positions, -1.0)


def kernel_tables(positions, head_dim, params):
    cos, sin = _tables(positions, head_dim, 1.0)
    key_cos, key_sin = _tables(positions, head_dim, -1.0)
    return QKTables(cos, sin, None, "interleaved", key_cos=key_cos, key_sin=key_sin)


class ScaledRoPEAttention(RoPEAttention):
    encoding = "{name}"

    def attention_params(self, hidden_states):
        return {{}}


register(
    Encoding(
        name="{name}", chapter="99_test", summary="a test", module=ScaledRoPEAttention,
        color="#000003", qk_transform=query_transform, key_transform=key_transform,
        kernel_tables=kernel_tables, relative=True,
    )
)
'''


@pytest.fixture
def encoding_file(tmp_path, monkeypatch):
    """Write ``source`` as ``<package>/<name>.py`` in a fresh package, import it; clean up."""
    names = []

    def write(name: str, source: str):
        package = tmp_path / "extra_encodings"
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / f"{name}.py").write_text(textwrap.dedent(source).format(name=name))
        monkeypatch.syspath_prepend(str(tmp_path))
        module = importlib.import_module(f"extra_encodings.{name}")
        names.append(name)
        return module

    yield write
    for name in names:
        if name in REGISTRY:
            unregister(name)
        sys.modules.pop(f"extra_encodings.{name}", None)
    sys.modules.pop("extra_encodings", None)


def _module(name, normaliser, backend, seed=0):
    torch.manual_seed(seed)
    module = REGISTRY[name].module(32, 2, max_position_embeddings=64, backend=backend)
    module.normaliser = normaliser
    return module.to(kernel_device())


def _agree(name, causal_modes=(True, False)):
    """The module with backend="triton" against "reference": output and every gradient
    (input, projections, the encoding's own parameters), softmax and stick-breaking."""
    device = kernel_device()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 37, 32, generator=g).to(device)
    mask = (torch.arange(37)[None] < torch.tensor([[37], [30]])).to(device)
    upstream = torch.randn(2, 37, 32, generator=g).to(device)
    positions = (torch.arange(37) * 2 + 5).to(device)
    for normaliser in ("softmax", "stick_breaking"):
        reference = _module(name, normaliser, "reference")
        fused = _module(name, normaliser, "triton")
        fused.load_state_dict(reference.state_dict())
        for causal in causal_modes:
            results = []
            for module in (reference, fused):
                xi = x.clone().requires_grad_()
                out = module(xi, attention_mask=mask, causal=causal, position_ids=positions)
                grads = torch.autograd.grad((out * upstream).sum(), [xi, *module.parameters()])
                results.append((out, grads))
            (out_ref, grads_ref), (out_tri, grads_tri) = results
            torch.testing.assert_close(out_tri, out_ref, atol=1e-4, rtol=1e-4)
            for g_tri, g_ref in zip(grads_tri, grads_ref, strict=True):
                torch.testing.assert_close(g_tri, g_ref, atol=2e-4, rtol=1e-3)


def test_a_distance_bias_in_torch_alone_is_fused_with_its_gradients(encoding_file):
    encoding_file("sqrt_distance", DISTANCE_FILE)
    record = REGISTRY["sqrt_distance"]
    assert record.kernel_bias is None and record.kernel_hooks == ()  # no kernel code at all
    _agree("sqrt_distance")


def test_a_file_with_its_own_triton_hook_is_fused_with_its_gradients(encoding_file):
    module = encoding_file("cosine_bias", HOOK_FILE)
    assert REGISTRY["cosine_bias"].kernel_hooks == (module.COSINE,)
    _agree("cosine_bias")


def test_an_asymmetric_qk_transform_is_fused_with_its_gradients(encoding_file):
    encoding_file("scaled_rope", ASYMMETRIC_FILE)
    record = REGISTRY["scaled_rope"]
    assert record.key_transform is not None and record.kernel_tables is not None
    _agree("scaled_rope")


def test_the_static_report_finds_a_new_files_hook(encoding_file):
    """``python -m course_lib.gpu_report`` enumerates hooks through the registry: a hook of a new
    file is planned (and decorated again for the compiler) like the course's own."""
    encoding_file("cosine_bias", HOOK_FILE)
    from course_lib.gpu_static import variants

    variants._HOOKS.clear()
    try:
        hooks = variants.hooks()
        assert "cosine_bias_cosine" in hooks
        assert type(hooks["cosine_bias_cosine"].bias).__name__ == "JITFunction"
        features = variants.Features("interleaved", True, "cosine_bias_cosine", True)
        launches = variants.plan(variants.Variant("flash", features, True, 64, "bf16", 90))
        # the tables are applied once, outside the loops; the hook rides in the loops
        assert [launch.name for launch in launches] == [
            "encode_q", "encode_k", "forward", "delta", "dkdv", "dq", "decode_q", "decode_k",
        ]  # fmt: skip
    finally:
        variants._HOOKS.clear()
