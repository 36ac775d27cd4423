"""RSE's options: a learned per-head stick bias, a fixed (or absent) penalty, softmax instead of
stick-breaking; and the kernels' ``"offset_linear_distance"`` hook the stick bias runs on.

The module with ``backend="triton"`` computes what it computes with ``backend="reference"``
(outputs and every gradient, padded keys, ragged lengths, causal and bidirectional); the hook in
both kernel families against the formula written out here in float64; the options' errors; the
softmax variant against RoPE plus the penalty by hand; and default RSE as before.
"""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.attention import attention
from course_lib.encodings.rse import RSEAttention, rse_kernel_bias
from course_lib.kernel_hooks import ScoreBias
from course_lib.normalisers import stick_breaking_weights
from course_lib.runtime import kernel_device, kernels_available

needs_kernels = pytest.mark.skipif(
    not kernels_available(), reason="Triton is not installed (it ships wheels for Linux only)"
)

HIDDEN, HEADS = 32, 2  # head_dim 16
LAMBDA = (0.05, 0.3)  # one gentle and one steep penalty
BETA = (-2.0, 0.5)  # one stick bias at the option's start, one far from it

# name -> RSEAttention keyword options
CONFIGS = {
    "stick_bias": {"stick_bias_init": -2.0},
    "softmax": {"normaliser": "softmax"},
    "no_penalty": {"penalty_init": 0.0, "learn_penalty": False},
    "fixed_penalty_stick_bias": {
        "penalty_init": 0.1,
        "learn_penalty": False,
        "stick_bias_init": 1.0,
    },
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_rse(seed: int = 0, **options) -> RSEAttention:
    """An RSE module whose own parameters differ per head (so a wrong head or a wrong sign
    shows)."""
    torch.manual_seed(seed)
    module = RSEAttention(HIDDEN, HEADS, max_position_embeddings=64, **options)
    with torch.no_grad():
        gain = module.parameter_gain  # lambda = softplus(gain * raw), beta = gain * raw
        if hasattr(module, "distance_penalty_raw"):
            module.distance_penalty_raw.copy_(torch.log(torch.expm1(torch.tensor(LAMBDA))) / gain)
        if module.stick_bias_raw is not None:
            module.stick_bias_raw.copy_(torch.tensor(BETA) / gain)
    return module


# -- the options ---------------------------------------------------------------------------------
def test_default_rse_is_unchanged():
    module = RSEAttention(HIDDEN, HEADS)
    assert module.stick_bias is None and module.normaliser == "stick_breaking"
    values = module.reported_values()
    assert set(values) == {"distance_penalty"}
    assert values["distance_penalty"] == pytest.approx([0.01] * HEADS, rel=1e-5)
    own = {
        n
        for n, _ in module.named_parameters()
        if n.split(".")[0] not in ("query", "key", "value", "out")
    }
    assert own == {"distance_penalty_raw"}
    bias = rse_kernel_bias(module.attention_params(torch.zeros(1, 3, HIDDEN)))
    assert bias.hook_name == "linear_distance" and tuple(bias.per_head.shape) == (HEADS,)


def test_options_change_what_is_learned_and_reported():
    biased = RSEAttention(HIDDEN, HEADS, stick_bias_init=-2.0)
    assert biased.reported_values()["stick_bias"] == [-2.0] * HEADS
    assert biased.stick_bias.requires_grad
    bias = rse_kernel_bias(biased.attention_params(torch.zeros(1, 3, HIDDEN)))
    assert bias.hook_name == "offset_linear_distance" and tuple(bias.per_head.shape) == (HEADS, 2)
    torch.testing.assert_close(bias.per_head[:, 1], torch.full((HEADS,), -2.0))
    fixed = RSEAttention(HIDDEN, HEADS, penalty_init=0.0, learn_penalty=False)
    assert not hasattr(fixed, "distance_penalty_raw")
    assert fixed.reported_values() == {"distance_penalty": [0.0] * HEADS}
    assert not fixed.distance_penalty.requires_grad


def test_option_errors():
    with pytest.raises(ValueError, match="cannot start at 0"):
        RSEAttention(HIDDEN, HEADS, penalty_init=0.0)
    with pytest.raises(ValueError, match="penalty_init must be a finite number >= 0"):
        RSEAttention(HIDDEN, HEADS, penalty_init=-0.1)
    with pytest.raises(ValueError, match="needs normaliser='stick_breaking'"):
        RSEAttention(HIDDEN, HEADS, stick_bias_init=-2.0, normaliser="softmax")
    with pytest.raises(ValueError, match="unknown normaliser 'sparsemax'; valid:"):
        RSEAttention(HIDDEN, HEADS, normaliser="sparsemax")
    with pytest.raises(ValueError, match="stick_bias_init must be None or a finite number"):
        RSEAttention(HIDDEN, HEADS, stick_bias_init=float("inf"))


def _rope_by_hand(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0):
    """Interleaved RoPE: channel pair ``(2t, 2t+1)`` rotated by ``p * base^(-2t/D)`` (the
    angles in float32, as the course computes them)."""
    dim = x.shape[-1]
    freqs = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = (positions.float()[:, None] * freqs.float()).double()  # [seq, D/2]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_softmax_rse_is_rope_plus_the_penalty(causal):
    """``normaliser="softmax"``: softmax(RoPE scores - lambda_h |p_i - p_j|), by hand; with
    lambda = 0 exactly method "rope"."""
    batch, seq, dim = 2, 13, 16
    q, k, v = torch.randn(3, batch, HEADS, seq, dim, generator=gen(1), dtype=torch.float64)
    pos = torch.arange(seq) * 2 + 3
    mask = torch.arange(seq)[None] < torch.tensor([[seq], [seq - 4]])
    lam = torch.tensor(LAMBDA, dtype=torch.float64)
    kw = dict(causal=causal, key_padding_mask=mask, position_ids=pos)
    out = attention(q, k, v, method="rse", normaliser="softmax", distance_penalty=lam, **kw)

    qr, kr = _rope_by_hand(q, pos), _rope_by_hand(k, pos)
    scores = qr @ kr.transpose(-1, -2) / math.sqrt(dim)
    scores = scores - lam[:, None, None] * (pos[:, None] - pos[None, :]).abs().double()
    visible = mask[:, None, None, :]
    if causal:
        visible = visible & torch.ones(seq, seq, dtype=torch.bool).tril()
    ref = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v
    # the course's float32 angles and its own frequencies: agreement to ~1e-7, not to the bit
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)

    no_penalty = attention(
        q, k, v, method="rse", normaliser="softmax", distance_penalty=torch.zeros(HEADS), **kw
    )
    torch.testing.assert_close(no_penalty, attention(q, k, v, method="rope", **kw))
    stick = attention(q, k, v, method="rse", distance_penalty=lam, **kw)
    assert not torch.allclose(stick, out, atol=1e-3)  # the option does change the normaliser


def test_softmax_module_runs_the_softmax():
    """The module's option reaches ``attention``: same weights, another normaliser."""
    x = torch.randn(2, 9, HIDDEN, generator=gen(2))
    stick = make_rse()
    soft = make_rse(normaliser="softmax")
    soft.load_state_dict(stick.state_dict())
    assert not torch.allclose(stick(x, causal=True), soft(x, causal=True), atol=1e-3)


# -- the fused kernels: the module ------------------------------------------------------------
@needs_kernels
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seq", [13, 37])
def test_triton_agrees_with_reference(config, causal, seq):
    """``backend="triton"`` vs ``"reference"`` (one module, so the same weights): outputs, and
    the gradients of the input and of every parameter (``stick_bias`` and
    ``distance_penalty_raw`` included), with padded keys."""
    device = kernel_device()
    module = make_rse(**CONFIGS[config]).to(device)
    x = torch.randn(2, seq, HIDDEN, generator=gen(9)).to(device)
    mask = (torch.arange(seq)[None] < torch.tensor([[seq], [seq - 4]])).to(device)
    upstream = torch.randn(2, seq, HIDDEN, generator=gen(10)).to(device)
    names = [n for n, _ in module.named_parameters()]
    for own in ("stick_bias_raw", "distance_penalty_raw"):
        assert (own in names) == (getattr(module, own, None) is not None)
    results = []
    for backend in ("reference", "triton"):
        module.backend = backend
        xi = x.clone().requires_grad_()
        out = module(xi, attention_mask=mask, causal=causal, position_ids=torch.arange(seq) + 3)
        grads = torch.autograd.grad((out * upstream).sum(), [xi, *module.parameters()])
        results.append((out, grads))
    (out_ref, grads_ref), (out_tri, grads_tri) = results
    torch.testing.assert_close(out_tri, out_ref, atol=1e-4, rtol=1e-4)
    for name, g_tri, g_ref in zip(["input", *names], grads_tri, grads_ref, strict=True):
        torch.testing.assert_close(g_tri, g_ref, atol=2e-4, rtol=1e-3, msg=lambda m, n=name: n + m)
    if "stick_bias_raw" in names:  # the bias matters: its gradient is not ~0
        assert grads_ref[1 + names.index("stick_bias_raw")].abs().max() > 1e-3


# -- the fused kernels: the hook --------------------------------------------------------------
def _explicit_reference(q, k, v, lam, beta, pos, mask, causal, family):
    """float64: ``z = q . k / sqrt(D) - lam_h |p_i - p_j| + beta_h``, then the normaliser."""
    seq, dim = q.shape[2], q.shape[3]
    dist = (pos[:, None, :, None] - pos[:, None, None, :]).abs().double()  # [B, 1, N, N]
    scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
    scores = scores - lam[:, None, None] * dist + beta[:, None, None]
    keys = mask[:, None, None, :]
    if family == "flash":
        visible = keys & torch.ones(seq, seq, dtype=torch.bool).tril() if causal else keys
        return torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v
    weights = stick_breaking_weights(scores, causal=causal, include_self=False, mask=keys)
    return weights @ v + (1.0 - weights.sum(-1, keepdim=True)) * v


@needs_kernels
@pytest.mark.parametrize("family", ["flash", "stick_breaking"])
@pytest.mark.parametrize("causal", [True, False])
def test_offset_linear_distance_hook(family, causal):
    """``ScoreBias("offset_linear_distance", stack((lambda, beta), -1))`` in the kernels against
    the explicit formula: output and the gradients of q, k, v, lambda and beta (through the
    ``[heads, 2]`` table)."""
    _check_offset_hook(family, causal)


@needs_kernels
@pytest.mark.parametrize("causal", [True, False])
def test_offset_linear_distance_hook_on_tall_backward_tiles(monkeypatch, causal):
    """Backward tiles of 32 queries by 16 keys in the stick-breaking kernels (as on sm_90 with a
    score bias): the column kernel's tiles have queries as rows, and the hook's accumulator holds
    two sums per row, 2 x 32 floats per program, not 2 x 16."""
    from course_lib import runtime

    kernels = runtime.load_kernel_module("stick_breaking")
    original = kernels.pick_config

    def tall(*args, **kwargs):
        cfg = original(*args, **kwargs)
        cfg.block_m, cfg.block_n, cfg.block_bwd, cfg.block_bwd_n = 16, 16, 32, 16
        return cfg

    monkeypatch.setattr(kernels, "pick_config", tall)
    _check_offset_hook("stick_breaking", causal)


def _check_offset_hook(family: str, causal: bool) -> None:
    from course_lib.flash_ops import flash_attention
    from course_lib.stick_ops import stick_breaking_attention

    fused = flash_attention if family == "flash" else stick_breaking_attention
    device = kernel_device()
    batch, heads, seq, dim = 2, 3, 37, 16
    q, k, v, grad = torch.randn(4, batch, heads, seq, dim, generator=gen(11)).to(device)
    pos = torch.stack((torch.arange(seq) * 2, torch.arange(seq) + 5)).to(device)
    mask = (torch.arange(seq)[None] < torch.tensor([[seq], [seq - 6]])).to(device)
    lam = torch.tensor([0.02, 0.3, 1.0], device=device, requires_grad=True)
    beta = torch.tensor([-2.0, 0.0, 1.5], device=device, requires_grad=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    table = torch.stack((lam, beta), dim=-1)
    out = fused(
        *leaves, causal=causal, key_padding_mask=mask, position_ids=pos,
        score_bias=ScoreBias("offset_linear_distance", table),
    )  # fmt: skip
    grads = torch.autograd.grad(out, [*leaves, lam, beta], grad)

    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v, lam, beta)]
    ref = _explicit_reference(*ref_leaves, pos.cpu(), mask.cpu(), causal, family)
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad.cpu().double())
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-4, rtol=1e-4)
    for name, g, r in zip(("dq", "dk", "dv", "dlambda", "dbeta"), grads, ref_grads, strict=True):
        assert g.shape == r.shape and g.dtype == torch.float32, name
        torch.testing.assert_close(
            g.cpu().double(), r, atol=2e-4, rtol=1e-3, msg=lambda m, n=name: n + ": " + m
        )
    if family == "stick_breaking":  # softmax cancels a constant per row; the stick does not
        assert ref_grads[4].abs().min() > 1e-2


@needs_kernels
def test_offset_linear_distance_needs_a_two_column_table():
    from course_lib.flash_ops import flash_attention
    from course_lib.stick_ops import stick_breaking_attention

    q = torch.randn(1, 2, 8, 16).to(kernel_device())
    for fused in (flash_attention, stick_breaking_attention):
        for bad in (torch.ones(2), torch.ones(2, 3), torch.ones(3, 2)):
            bias = ScoreBias("offset_linear_distance", bad.to(q.device))
            with pytest.raises(ValueError, match=r"must have shape \[heads, width\] = \[2, 2\]"):
                fused(q, q, q, score_bias=bias)
