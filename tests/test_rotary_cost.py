"""LieRE and the ComRoPE family computed once per distinct position (and, for ComRoPE, in its
shared basis) are the same functions as the per-token matrix exponentials: forward and every
gradient, in float64 (chapter 09)."""

import pytest
import torch

from course_lib.attention import attention, get_attention_class
from course_lib.encodings.comrope import comrope_generators, comrope_rotation
from course_lib.encodings.comrope_ap import (
    apply_block_axes,
    apply_block_generators,
    comrope_ap_generators,
)
from course_lib.encodings.comrope_ld import comrope_ld_generators
from course_lib.encodings.liere import (
    apply_block_rotation,
    block_scales,
    lie_rotation,
    skew4_exp,
    skew_part,
)

F64 = torch.float64


def per_token_rotation(x, coords, generators, base=100.0):
    """The per-token formula, one ``matrix_exp`` per token and block: ``generators`` ``[n, b, b]``
    or ``[heads, n, b, b]`` (every block) or ``[heads, m, n, b, b]`` (one set per block)."""
    b = generators.shape[-1]
    m = x.shape[-1] // b
    w = block_scales(m, base).to(F64)
    c = coords.to(F64)
    if c.dim() == 3:
        c = c[:, None]  # [batch, 1, seq, n]
    scaled = c[..., None, :] * w[:, None]  # [..., seq, m, n]
    g = generators.to(F64)
    if g.dim() == 4:
        g = g[:, None, None]
    elif g.dim() == 5:
        g = g[:, None]
    rotation = lie_rotation(scaled, g)  # [..., seq, m, b, b]
    blocks = x.to(F64).reshape(*x.shape[:-1], m, b)
    return (rotation @ blocks[..., None])[..., 0].reshape(x.shape)


def coords_cases(seq, n, batch):
    g = torch.Generator().manual_seed(7)
    return {
        "shared": torch.randint(0, 5, (seq, n), generator=g),
        "batch_of_one": torch.randint(0, 5, (1, seq, n), generator=g),
        "per_row": torch.randint(-4, 9, (batch, seq, n), generator=g),
        "grid": torch.stack((torch.arange(seq) // 3, torch.arange(seq) % 3), -1)[:, :n],
    }


def assert_same_with_grads(new, old, inputs):
    """``new()`` and ``old()`` agree, and so do their gradients w.r.t. each tensor of ``inputs``."""
    got, want = new(), old()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    weight = torch.randn(got.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    g_new = torch.autograd.grad((got * weight).sum(), inputs)
    g_old = torch.autograd.grad((want * weight).sum(), inputs)
    for a, b in zip(g_new, g_old, strict=True):
        assert b.abs().max() > 0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def leaf(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=F64) * scale).requires_grad_()


@pytest.mark.parametrize("scale", [0.0, 1e-5, 1e-2, 1.0, 30.0])
def test_the_closed_form_of_4x4_rotations_is_matrix_exp(scale):
    """Forward and gradient (through the skew part), tiny and zero generators included."""
    g = leaf(64, 4, 4, seed=8, scale=scale)
    torch.testing.assert_close(skew4_exp(skew_part(g)), torch.linalg.matrix_exp(skew_part(g)),
                               rtol=1e-12, atol=1e-12)  # fmt: skip
    weight = torch.randn(64, 4, 4, generator=torch.Generator().manual_seed(9), dtype=F64)
    (got,) = torch.autograd.grad((skew4_exp(skew_part(g)) * weight).sum(), g)
    (want,) = torch.autograd.grad((torch.linalg.matrix_exp(skew_part(g)) * weight).sum(), g)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    single = skew4_exp(skew_part(g.detach().float()))
    torch.testing.assert_close(single.double(), torch.linalg.matrix_exp(skew_part(g.detach())),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("case", ["shared", "batch_of_one", "per_row", "grid"])
@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("b", [2, 4])
def test_liere_once_per_position_is_the_per_token_formula(n, case, per_head, b):
    coords = coords_cases(9, n, 3)[case]
    x = leaf(3, 2, 9, 8, seed=1)
    generators = leaf(*((2,) if per_head else ()), n, b, b, seed=2, scale=0.5)
    assert_same_with_grads(
        lambda: apply_block_rotation(x, coords, generators),
        lambda: per_token_rotation(x, coords, generators),
        (x, generators),
    )


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("case", ["shared", "batch_of_one", "per_row", "grid"])
def test_comrope_in_its_shared_basis_is_the_matrix_exponential(n, case):
    coords = coords_cases(9, n, 3)[case]
    x = leaf(3, 2, 9, 8, seed=1)
    basis, angles = leaf(2, 4, 4, seed=2, scale=0.5), leaf(2, n, 2, seed=3)
    assert_same_with_grads(
        lambda: comrope_rotation(x, coords, basis, angles),
        lambda: per_token_rotation(x, coords, comrope_generators(basis, angles)),
        (x, basis, angles),
    )


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("case", ["shared", "batch_of_one", "per_row", "grid"])
def test_block_generators_once_per_position_and_axis_by_axis(n, case):
    coords = coords_cases(9, n, 3)[case]
    x = leaf(3, 2, 9, 8, seed=1)
    blocks, speeds = leaf(2, 2, 4, 4, seed=2, scale=0.5), leaf(n, 2, seed=3)

    def skews():
        return blocks - blocks.transpose(-1, -2)

    def generators():  # [heads, m, n, b, b]
        return speeds.transpose(0, 1)[:, :, None, None] * skews().unsqueeze(-3)

    def old():
        return per_token_rotation(x, coords, generators())

    inputs = (x, blocks, speeds)
    assert_same_with_grads(lambda: apply_block_axes(x, coords, skews(), speeds), old, inputs)
    assert_same_with_grads(lambda: apply_block_generators(x, coords, generators()), old, inputs)


def per_token_transform(name, params):
    """The records' transforms as the per-token formula."""
    base = params.get("base", 100.0)
    if name == "liere":
        return lambda x, p: per_token_rotation(x, p, params["generators"], base)
    if name == "comrope":
        gens = comrope_generators(params["basis"], params["angles"])
        return lambda x, p: per_token_rotation(x, p, gens, base)
    if name == "comrope_ap":
        gens = comrope_ap_generators(params["blocks"])
        return lambda x, p: per_token_rotation(x, p, gens, base)
    gens = comrope_ld_generators(params["blocks"], params["scales"])
    return lambda x, p: per_token_rotation(x, p, gens, base)


@pytest.mark.parametrize("name", ["liere", "comrope", "comrope_ap", "comrope_ld"])
@pytest.mark.parametrize("per_row", [False, True])
def test_attention_with_padding_matches_the_per_token_formula(name, per_row):
    """Through ``attention()`` (causal, padded keys): output and gradients of q, k, v and every
    parameter equal those of q and k rotated token by token, then plain attention."""
    torch.manual_seed(0)
    layer = get_attention_class(name)(32, 2).double()
    params = {k: v for k, v in layer.attention_params(None).items()}
    q, k, v = (leaf(2, 2, 10, 16, seed=s) for s in (4, 5, 6))
    grid = torch.stack((torch.arange(10) // 4, torch.arange(10) % 4), -1)
    coords = torch.stack((grid, grid + torch.tensor([2, 1]))) if per_row else grid
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False
    inputs = (q, k, v, *params.values())

    def new():
        return attention(q, k, v, method=name, causal=True, key_padding_mask=mask,
                         position_ids=coords, **params)  # fmt: skip

    def old():
        rotate = per_token_transform(name, {**layer.spec.params, **params})
        p = coords if per_row else coords[None]
        return attention(rotate(q, p), rotate(k, p), v, causal=True, key_padding_mask=mask)

    assert_same_with_grads(new, old, inputs)
