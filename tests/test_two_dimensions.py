"""Positions in two dimensions: axial 2D RoPE, the learned 2-D table, LieRE, ComRoPE, and the
small vision transformer's task (chapter 09)."""

import pytest
import torch

from course_lib.attention import attention
from course_lib.encodings import (
    ComRoPEAttention,
    Learned2DAttention,
    LieREAttention,
    apply_block_rotation,
    apply_rope,
    apply_rope_2d,
    comrope_generators,
    lie_rotation,
    plane_generators,
    rope_2d_angles,
    skew_part,
)
from course_lib.vision import (
    CLASSES,
    PATCH,
    TinyViT,
    draw_scenes,
    fit_to_grid,
    flat_positions,
    grid_coords,
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def score(rotate, q, k, p, r):
    """``rotate(q at p) . rotate(k at r)`` for one query and one key: q, k ``[D]``."""
    return float(rotate(q[None], p[None])[0] @ rotate(k[None], r[None])[0])


def commutator(a, b):
    return a @ b - b @ a


# -- axial 2D RoPE -------------------------------------------------------------------------------
def test_rope_2d_turns_half_the_pairs_with_the_row_and_half_with_the_column():
    D = 16
    x = torch.randn(1, D, generator=gen(1), dtype=torch.float64)
    moved_row = apply_rope_2d(x, torch.tensor([[3, 0]])) - x
    moved_col = apply_rope_2d(x, torch.tensor([[0, 3]])) - x
    # interleaved: pairs 0..3 are channels 0..7 (row), pairs 4..7 channels 8..15 (column)
    assert moved_row[0, :8].abs().min() > 0 and torch.equal(moved_row[0, 8:], torch.zeros(8))
    assert moved_col[0, 8:].abs().min() > 0 and torch.equal(moved_col[0, :8], torch.zeros(8))
    angles = rope_2d_angles(torch.tensor([[1, 0]]), D)
    torch.testing.assert_close(angles[0, :4], 100.0 ** (-torch.arange(4) / 4))


def test_rope_2d_along_one_axis_is_1d_rope_on_that_half():
    """Column 0 everywhere: the row half is 1-D RoPE with base 100 over D/2 channels."""
    x = torch.randn(2, 3, 10, 16, generator=gen(2))
    rows = torch.arange(10)
    coords = torch.stack((rows, torch.zeros_like(rows)), -1)
    out = apply_rope_2d(x, coords)
    torch.testing.assert_close(out[..., :8], apply_rope(x[..., :8], rows, base=100.0))
    torch.testing.assert_close(out[..., 8:], x[..., 8:])


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rope_2d_score_depends_only_on_the_2d_offset(style):
    q, k = torch.randn(2, 32, generator=gen(3), dtype=torch.float64)

    def rotate(x, p):
        return apply_rope_2d(x, p, style=style)

    p, r = torch.tensor([2, 7]), torch.tensor([5, 1])
    base = score(rotate, q, k, p, r)
    for shift in ([1, 0], [0, 1], [13, -4], [100, 250]):
        s = torch.tensor(shift)
        assert abs(score(rotate, q, k, p + s, r + s) - base) < 1e-5  # angles are float32
    # and the two axes are told apart: swapping the offset's components changes the score
    assert abs(score(rotate, q, k, torch.tensor([0, 0]), torch.tensor([3, 1])) -
               score(rotate, q, k, torch.tensor([0, 0]), torch.tensor([1, 3]))) > 1e-3  # fmt: skip


def test_flattened_1d_rope_is_not_a_2d_shift_test():
    """RoPE on ``row * width + col`` is shift-invariant along the flattened index, but moving a
    pair of patches to a grid of another width changes their score."""
    q, k = torch.randn(2, 32, generator=gen(4), dtype=torch.float64)

    def flat(width):
        return lambda x, p: apply_rope(x, p[..., 0] * width + p[..., 1])

    p, r = torch.tensor([1, 1]), torch.tensor([2, 1])  # r is directly below p
    assert abs(score(flat(8), q, k, p, r) - score(flat(12), q, k, p, r)) > 1e-3
    below, right = score(flat(8), q, k, p, r), score(flat(8), q, k, p, torch.tensor([1, 9]))
    assert abs(below - right) < 1e-9  # on a width-8 grid "one row down" is "8 columns right"


def test_rope_2d_rotation_keeps_norms():
    x = torch.randn(2, 4, 30, 16, generator=gen(5))
    coords = torch.randint(0, 50, (2, 30, 2), generator=gen(6))
    torch.testing.assert_close(apply_rope_2d(x, coords).norm(dim=-1), x.norm(dim=-1))


def test_rope_2d_errors_say_what_is_allowed():
    with pytest.raises(ValueError, match="multiple of 4.*3 pairs"):
        apply_rope_2d(torch.randn(5, 6), torch.zeros(5, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[seq, 2\] or \[batch, seq, 2\]"):
        apply_rope_2d(torch.randn(5, 8), torch.zeros(5, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[seq, 2\] or \[batch, seq, 2\]"):
        apply_rope_2d(torch.randn(5, 8), torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="integer or real"):
        apply_rope_2d(torch.randn(5, 8), torch.zeros(5, 2, dtype=torch.bool))
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="position_ids must have shape"):
        attention(q, q, q, method="rope_2d", position_ids=torch.arange(5))
    with pytest.raises(ValueError, match="needs position_ids"):
        attention(q, q, q, method="rope_2d")
    with pytest.raises(ValueError, match="multiple of 4"):
        attention(torch.randn(1, 2, 5, 6), *torch.randn(2, 1, 2, 5, 6), method="rope_2d",
                  position_ids=torch.zeros(5, 2, dtype=torch.long))  # fmt: skip


def test_rope_2d_kernel_tables_match_the_reference_rotation():
    from course_lib.encodings import rope_2d_kernel_tables

    coords = torch.randint(0, 20, (1, 7, 2), generator=gen(7))
    tables = rope_2d_kernel_tables(coords, 16, {"base": 100.0, "style": "interleaved"})
    x = torch.randn(1, 1, 7, 16, generator=gen(8))
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = tables.cos[:, None], tables.sin[:, None]
    by_tables = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)
    torch.testing.assert_close(by_tables, apply_rope_2d(x, coords))


# -- Lie rotations -------------------------------------------------------------------------------
def test_lie_rotation_is_orthogonal_and_uses_only_the_skew_part():
    g = torch.randn(2, 6, 6, generator=gen(9), dtype=torch.float64)
    coords = torch.randn(11, 2, generator=gen(10), dtype=torch.float64) * 5
    r = lie_rotation(coords, g)  # [11, 6, 6]
    eye = torch.eye(6, dtype=torch.float64).expand(11, 6, 6)
    torch.testing.assert_close(r.transpose(-1, -2) @ r, eye)
    torch.testing.assert_close(torch.linalg.det(r), torch.ones(11, dtype=torch.float64))
    symmetric = g + g.transpose(-1, -2)
    torch.testing.assert_close(lie_rotation(coords, g + 3 * symmetric), r)
    a = skew_part(g)
    torch.testing.assert_close(a, -a.transpose(-1, -2))
    torch.testing.assert_close(
        r[4], torch.linalg.matrix_exp(coords[4, 0] * a[0] + coords[4, 1] * a[1])
    )


def test_lie_rotation_broadcasts_heads_and_batches():
    g = torch.randn(3, 1, 2, 4, 4, generator=gen(11))  # [heads, 1 (seq), n, b, b]
    coords = torch.randint(0, 9, (2, 1, 5, 2), generator=gen(12))  # [batch, 1 (heads), seq, n]
    r = lie_rotation(coords, g)
    assert r.shape == (2, 3, 5, 4, 4)
    torch.testing.assert_close(r[1, 2, 3], lie_rotation(coords[1, 0, 3], g[2, 0]))


def relative_defect(generators, trials=20, seed=13):
    """max over random p, r of |R(p)^T R(r) - R(r - p)|."""
    p, r = (torch.randn(2, trials, 2, generator=gen(seed), dtype=torch.float64) * 4).unbind(0)
    lhs = lie_rotation(p, generators).transpose(-1, -2) @ lie_rotation(r, generators)
    return float((lhs - lie_rotation(r - p, generators)).abs().max())


def test_the_commuting_theorem_numerically():
    """R(p)^T R(r) = R(r - p) for all p, r holds for commuting generators and fails otherwise."""
    basis = torch.randn(4, 4, generator=gen(14), dtype=torch.float64)
    angles = torch.randn(2, 2, generator=gen(15), dtype=torch.float64)
    commuting = comrope_generators(basis, angles)  # [2, 4, 4]
    assert float(commutator(commuting[0], commuting[1]).abs().max()) < 1e-12
    assert relative_defect(commuting) < 1e-10
    generic = skew_part(torch.randn(2, 4, 4, generator=gen(16), dtype=torch.float64))
    assert float(commutator(generic[0], generic[1]).abs().max()) > 1e-2
    assert relative_defect(generic) > 1e-2
    # one generator always commutes with itself: each axis alone is relative even for LieRE
    along_rows = torch.stack((generic[0], torch.zeros(4, 4, dtype=torch.float64)))
    assert relative_defect(along_rows) < 1e-10


def test_comrope_is_rope_mixed_in_a_rotated_basis():
    """R(p) = Q blockdiag_j(rotation by sum_i p_i a_ij) Q^T: RoPE-Mixed seen in the basis Q."""
    basis = torch.randn(4, 4, generator=gen(17), dtype=torch.float64)
    angles = torch.randn(2, 2, generator=gen(18), dtype=torch.float64)
    q = torch.linalg.matrix_exp(skew_part(basis))
    p = torch.tensor([3.0, -2.0], dtype=torch.float64)
    mixed = torch.linalg.matrix_exp(plane_generators(p @ angles))  # planes turn by p . a_j
    torch.testing.assert_close(lie_rotation(p, comrope_generators(basis, angles)), q @ mixed @ q.T)


def test_block_rotation_matches_the_dense_block_diagonal_matrix():
    D, b = 12, 4
    g = torch.randn(2, b, b, generator=gen(19), dtype=torch.float64)
    coords = torch.randint(0, 10, (6, 2), generator=gen(20))
    x = torch.randn(6, D, generator=gen(21), dtype=torch.float64)
    w = 100.0 ** (-torch.arange(3, dtype=torch.float64) / 3)
    dense = [torch.block_diag(*[lie_rotation(c.double() * wk, g) for wk in w]) for c in coords]
    want = torch.stack([m @ v for m, v in zip(dense, x, strict=True)])
    torch.testing.assert_close(apply_block_rotation(x, coords, g), want)


@pytest.mark.parametrize("name", ["liere", "comrope"])
def test_module_shift_claims(name):
    """Shifting every patch by one 2-D offset: ComRoPE's layer output is unchanged, LieRE's is not."""
    torch.manual_seed(0)
    module = {"liere": LieREAttention, "comrope": ComRoPEAttention}[name](32, 2).double()
    x = torch.randn(1, 12, 32, generator=gen(22), dtype=torch.float64)
    coords = grid_coords(3, 4)
    same = torch.allclose(module(x, position_ids=coords), module(x, position_ids=coords + torch.tensor([5, -3])), atol=1e-9)  # fmt: skip
    assert same == (name == "comrope")


def test_lie_errors_say_what_is_allowed():
    with pytest.raises(ValueError, match="square"):
        lie_rotation(torch.zeros(3, 2), torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match=r"\[\.\.\., 2\]"):
        lie_rotation(torch.zeros(3, 3), torch.randn(2, 4, 4))
    with pytest.raises(TypeError, match="floating-point"):
        lie_rotation(torch.zeros(3, 2), torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="divide head_dim=10"):
        apply_block_rotation(torch.randn(3, 10), torch.zeros(3, 2), torch.randn(2, 4, 4))
    with pytest.raises(ValueError, match=r"\[seq, 2\] or \[batch, seq, 2\]"):
        apply_block_rotation(torch.randn(3, 8), torch.zeros(4, 2), torch.randn(2, 4, 4))
    q = torch.randn(1, 2, 5, 8)
    coords = torch.zeros(5, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"\[heads, 2, b, b\]"):
        attention(q, q, q, method="liere", position_ids=coords, generators=torch.randn(3, 2, 4, 4))
    with pytest.raises(ValueError, match="square"):
        attention(q, q, q, method="liere", position_ids=coords, generators=torch.randn(2, 2, 4, 2))
    with pytest.raises(ValueError, match="square"):
        attention(q, q, q, method="comrope", position_ids=coords, basis=torch.randn(2, 4, 2),
                  angles=torch.randn(2, 2, 2))  # fmt: skip
    with pytest.raises(ValueError, match=r"\[heads, 2, b/2\]"):
        attention(q, q, q, method="comrope", position_ids=coords, basis=torch.randn(2, 4, 4),
                  angles=torch.randn(2, 2, 4))  # fmt: skip
    with pytest.raises(ValueError, match="even"):
        comrope_generators(torch.randn(3, 3), torch.randn(2, 1))


def test_generators_get_gradients_through_the_kernel_path():
    """With backend="triton" the rotation runs in PyTorch before the plain kernel: gradients still
    reach the generators, and equal the reference's."""
    from course_lib.runtime import kernels_available

    if not kernels_available():
        pytest.skip("Triton is not installed")
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 12, 16).unbind(0)
    generators = torch.randn(2, 2, 4, 4, requires_grad=True)
    coords = grid_coords(3, 4)
    grads = []
    for backend in ("reference", "triton"):
        out = attention(q, k, v, method="liere", position_ids=coords, generators=generators,
                        backend=backend)  # fmt: skip
        (grad,) = torch.autograd.grad(out.square().sum(), generators)
        grads.append(grad)
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], atol=1e-4, rtol=1e-4)


# -- the learned 2-D table -----------------------------------------------------------------------
def test_learned_2d_table_refuses_coordinates_past_its_end_and_stretches_on_request():
    torch.manual_seed(0)
    layer = Learned2DAttention(16, 2, max_position_embeddings=8)
    x = torch.randn(1, 4, 16)
    with pytest.raises(ValueError, match="resize_position_table"):
        layer(x, position_ids=torch.tensor([[0, 0], [0, 8], [1, 0], [1, 1]]))
    old_rows = layer.row_embeddings.weight.detach().clone()
    layer.resize_position_table(15)
    new_rows = layer.row_embeddings.weight.detach()
    torch.testing.assert_close(new_rows[::2], old_rows)  # every second row is an old one
    torch.testing.assert_close(new_rows[1], (old_rows[0] + old_rows[1]) / 2)
    assert layer(x, position_ids=torch.tensor([[0, 0], [0, 14], [14, 0], [7, 7]])).shape == x.shape


# -- the vision task and model -------------------------------------------------------------------
def test_grid_coordinates_and_flattened_positions():
    coords = grid_coords(3, 5)
    assert coords.shape == (15, 2) and coords[7].tolist() == [1, 2]
    torch.testing.assert_close(flat_positions(3, 5), coords[:, 0] * 5 + coords[:, 1])


def test_scenes_have_the_labels_their_pictures_show():
    images, labels = draw_scenes(200, 8, generator=gen(23))
    assert images.shape == (200, 2, 8 * PATCH, 8 * PATCH) and labels.shape == (200,)
    assert set(labels.tolist()) == set(range(len(CLASSES)))
    pixel = torch.arange(8 * PATCH, dtype=torch.float32) + 0.5

    def centre(mask):  # mask [n, H, W] -> (y, x) [n, 2]
        mass = mask.sum((1, 2))
        return torch.stack(((mask.sum(2) * pixel).sum(1) / mass, (mask.sum(1) * pixel).sum(1) / mass), -1)  # fmt: skip

    d = centre(images[:, 0]) - centre(images[:, 1])  # square minus circle, (dy, dx)
    horizontal = d[:, 1].abs() > d[:, 0].abs()
    expected = torch.where(horizontal, (d[:, 1] > 0).long(), 2 + (d[:, 0] > 0).long())
    assert torch.equal(expected, labels)
    assert (images[:, 0] * images[:, 1]).sum() == 0  # the shapes never overlap


def test_moved_scenes_are_training_scenes_pasted_at_whole_patch_offsets():
    small, small_labels = draw_scenes(50, 8, generator=gen(24))
    big, big_labels = draw_scenes(50, 16, generator=gen(24), placement="moved")
    assert torch.equal(small_labels, big_labels)
    assert torch.equal(big.sum((1, 2, 3)), small.sum((1, 2, 3)))  # the same pixels, moved
    for i in range(5):
        rows = big[i].sum((0, 2)).nonzero()
        cols = big[i].sum((0, 1)).nonzero()
        shift_y = int(rows.min()) - int(small[i].sum((0, 2)).nonzero().min())
        shift_x = int(cols.min()) - int(small[i].sum((0, 1)).nonzero().min())
        assert shift_y % PATCH == 0 and shift_x % PATCH == 0
        assert torch.equal(big[i, :, shift_y : shift_y + 32, shift_x : shift_x + 32], small[i])


@pytest.mark.parametrize("encoding", ["none", "learned_2d", "rope", "rope_2d", "liere", "comrope"])
def test_tiny_vit_runs_on_any_grid_for_every_variant(encoding):
    torch.manual_seed(0)
    model = TinyViT(encoding, hidden_size=16, num_heads=2, num_layers=1, max_side=4)
    images, _ = draw_scenes(3, 4, generator=gen(25))
    assert model(images).shape == (3, len(CLASSES))
    big, _ = draw_scenes(2, 6, generator=gen(26))
    if encoding in ("learned_2d", "rope"):
        # "rope" is 1-D here (the flattened index) and has no table; learned_2d must be stretched
        if encoding == "learned_2d":
            with pytest.raises(ValueError, match="resize_position_table"):
                model(big)
            assert fit_to_grid(model, 6)
    else:
        assert not fit_to_grid(model, 6)
    assert model(big).shape == (2, len(CLASSES))


def test_without_positions_the_vit_cannot_tell_where_the_patches_are():
    """No position signal and a position-free pooling: shuffling the patches changes nothing."""
    torch.manual_seed(0)
    model = TinyViT("none", hidden_size=16, num_heads=2, num_layers=2)
    images, _ = draw_scenes(4, 8, generator=gen(27))
    patches = model.patches(images)
    perm = torch.randperm(64, generator=gen(28))
    shuffled = patches[:, perm].reshape(4, 8, 8, 2, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
    torch.testing.assert_close(model(shuffled.reshape(images.shape)), model(images))


# -- RoPE-Mixed, ComRoPE-AP and ComRoPE-LD ------------------------------------------------------


def test_rope_mixed_turns_each_pair_by_a_learned_mix_of_both_axes():
    from course_lib.encodings import apply_rope_mixed, rope_mixed_initial_frequencies

    freqs = torch.randn(3, 2, 4, generator=gen(1), dtype=torch.float64)  # 3 heads, D = 8
    x = torch.randn(2, 3, 12, 8, generator=gen(2), dtype=torch.float64)
    coords = grid_coords(3, 4)
    got = apply_rope_mixed(x, coords, freqs)
    for h in range(3):  # by hand: pair t of head h turns by row f[h,0,t] + col f[h,1,t]
        angles = coords.double() @ freqs[h]  # [seq, 4]
        x1, x2 = x[:, h, :, 0::2], x[:, h, :, 1::2]
        want = torch.stack((x1 * angles.cos() - x2 * angles.sin(),
                            x1 * angles.sin() + x2 * angles.cos()), -1).flatten(-2)  # fmt: skip
        torch.testing.assert_close(got[:, h], want)
    # axial 2D RoPE is the special case with one zero frequency per pair
    theta = rope_2d_angles(torch.tensor([[1, 0], [0, 1]]), 8).double()  # rows: theta per axis
    axial = torch.stack((theta[0] * torch.tensor([1.0, 1, 0, 0]),
                         theta[1] * torch.tensor([0.0, 0, 1, 1])))[None].expand(3, 2, 4)  # fmt: skip
    torch.testing.assert_close(apply_rope_mixed(x, coords, axial), apply_rope_2d(x, coords))
    init = rope_mixed_initial_frequencies(16, 4, generator=gen(3))
    assert init.shape == (4, 2, 8)
    magnitude = init.norm(dim=1)  # the ladder 10^(-t/4), twice, for every head
    ladder = 10.0 ** (-torch.arange(4) / 4)
    torch.testing.assert_close(magnitude, torch.cat((ladder, ladder)).expand(4, 8))
    first, second = init[:, :, 0], init[:, :, 4]  # the two halves point 90 degrees apart
    torch.testing.assert_close((first * second).sum(-1), torch.zeros(4), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="frequencies must have shape"):
        apply_rope_mixed(x, coords, freqs[:, :, :2])


def test_comrope_ap_gives_each_block_to_one_axis_and_ld_scales_one_matrix():
    from course_lib.encodings import comrope_ap_generators, comrope_ld_generators

    blocks = torch.randn(2, 4, 4, 4, generator=gen(4), dtype=torch.float64)  # heads, m, b, b
    ap = comrope_ap_generators(blocks)  # [2, 4, 2, 4, 4]
    assert ap.shape == (2, 4, 2, 4, 4)
    skew = blocks - blocks.transpose(-1, -2)
    for j in range(4):
        torch.testing.assert_close(ap[:, j, j % 2], skew[:, j])
        assert torch.equal(ap[:, j, 1 - j % 2], torch.zeros(2, 4, 4, dtype=torch.float64))
    scales = torch.randn(2, 4, generator=gen(5), dtype=torch.float64)
    ld = comrope_ld_generators(blocks, scales)
    for i in range(2):
        for j in range(4):
            torch.testing.assert_close(ld[:, j, i], scales[i, j] * skew[:, j])
    for gens in (ap, ld):  # the angle matrices of every block commute: relative
        torch.testing.assert_close(commutator(gens[..., 0, :, :], gens[..., 1, :, :]),
                                   torch.zeros(2, 4, 4, 4, dtype=torch.float64))  # fmt: skip


@pytest.mark.parametrize("name", ["comrope_ap", "comrope_ld", "rope_mixed"])
def test_paper_forms_match_their_dense_rotation(name):
    from course_lib.attention import get_attention_class

    torch.manual_seed(0)
    layer = get_attention_class(name)(32, 2).double()
    params = layer.attention_params(None)
    x = torch.randn(1, 2, 6, 16, generator=gen(6), dtype=torch.float64)
    coords = torch.tensor([[0, 0], [1, 2], [3, 1], [2, 5], [7, 7], [4, 0]])
    got = layer.spec.qk_transform(x, coords, {**layer.spec.params, **params})
    if name == "rope_mixed":
        gens = torch.stack([plane_generators(f) for f in params["frequencies"].unbind(-2)], 1)
        dense = lie_rotation(coords, gens[:, None])  # [heads, seq, 16, 16]
    else:
        blockwise = layer.generators()  # [heads, m, 2, 4, 4], block j scaled by 100^(-j/4)
        scale = 100.0 ** (-torch.arange(4, dtype=torch.float64) / 4)
        full = torch.zeros(2, 2, 16, 16, dtype=torch.float64)
        for j in range(4):
            full[:, :, 4 * j : 4 * j + 4, 4 * j : 4 * j + 4] = scale[j] * blockwise[:, j]
        dense = lie_rotation(coords, full[:, None])
    torch.testing.assert_close(got[0], (dense @ x[0][..., None])[..., 0])


def test_paper_forms_refuse_bad_blocks_with_the_allowed_sizes():
    from course_lib.encodings import ComRoPEAPAttention, ComRoPELDAttention

    for cls in (ComRoPEAPAttention, ComRoPELDAttention):
        with pytest.raises(ValueError, match=r"valid: \[2, 4, 8\]"):
            cls(32, 2, block_size=16)  # head_dim 16: one block, not one per axis
    q = torch.randn(1, 2, 6, 16)
    coords = grid_coords(2, 3)
    with pytest.raises(ValueError, match="blocks must be one square"):
        attention(q, q, q, method="comrope_ap", position_ids=coords, blocks=torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match=r"scales must have shape \[axes, m\]"):
        attention(q, q, q, method="comrope_ld", position_ids=coords,
                  blocks=torch.zeros(2, 4, 4, 4), scales=torch.zeros(4))  # fmt: skip


def test_explorer_shows_a_flat_line_as_flat():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_lib.teaching.two_d_figures import flat_line_limits, score_map, two_d_explorer

    assert flat_line_limits([11.09591, 11.09592], 18.0) == pytest.approx((2.095915, 20.095915))
    low, high = flat_line_limits([0.0, 30.0], 18.0)  # a spread larger than the scale shows whole
    assert low < 0 and high > 30
    fig = two_d_explorer("rope (flattened)", (2, 2), (3, 4))
    fig.canvas.draw()
    panel = fig.axes[1]
    low, high = panel.get_ylim()
    moved = panel.lines[0].get_ydata()
    assert max(moved) - min(moved) < 1e-3  # relative: flat, up to float noise
    assert high - low >= float(score_map("rope (flattened)", (2, 2)).abs().max())
    assert panel.yaxis.get_offset_text().get_text() == ""
    plt.close(fig)
