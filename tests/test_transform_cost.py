"""Notebook 03's counts of a rotation inside the attention loops against once before them."""

import pytest

from course_lib.teaching.transform_cost import loop_rotations, measured_rows


def test_a_key_is_rotated_once_per_query_block_that_reads_it():
    assert loop_rotations(4096, 128, causal=False).inside == 32
    assert loop_rotations(100, 64, causal=False).inside == 2  # a ragged last block reads it too
    # causal, by brute force: key j is read by every block holding a query i >= j
    seq, block = 200, 64
    blocks = range(0, seq, block)
    reads = [sum(1 for start in blocks if min(start + block, seq) - 1 >= j) for j in range(seq)]
    assert loop_rotations(seq, block).inside == round(sum(reads) / seq, 2)
    assert "once before it" in str(loop_rotations(seq, block))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            loop_rotations(bad, 64)


def test_the_committed_gpu_rows_are_read_as_measured():
    rows = measured_rows()
    assert {(r["method"], r["contender"]) for r in rows} == {
        (m, c) for m in ("softmax", "rope", "xpos") for c in ("kernel", "transform + SDPA", "SDPA")
    } - {("softmax", "transform + SDPA"), ("rope", "SDPA"), ("xpos", "SDPA")}
    assert all(r["ms"] > 0 for r in rows)
    with pytest.raises(ValueError, match="no forward"):
        measured_rows(seq=12345)


def test_the_passes_share_of_plain_attention_halves_when_the_sequence_doubles():
    from course_lib.teaching.transform_cost import pass_share

    for head_dim in (64, 128):
        share = pass_share(4096, head_dim, calibrated=False)
        assert 0 < share < 1
        assert pass_share(8192, head_dim, calibrated=False) == pytest.approx(share / 2)
        # calibrated, the loops' cycles per pair move a little with the share of diagonal tiles
        assert pass_share(8192, head_dim) == pytest.approx(pass_share(4096, head_dim) / 2, rel=0.02)
    for calibrated in (True, False):
        with pytest.raises(ValueError, match="no plain flash row"):
            pass_share(4096, head_dim=32, calibrated=calibrated)


def test_the_calibrated_share_is_what_the_calibrated_model_says_of_rope():
    """RoPE's loops are plain flash's; what the calibrated model puts between them is the
    passes: RoPE's predicted ratio to plain flash is 1 / (1 + share), within the few percent
    by which its report row's loops differ from plain flash's."""
    from course_lib.teaching.fused_cost import fused_cost
    from course_lib.teaching.transform_cost import pass_share

    for head_dim, ratio in fused_cost("rope")["calibrated"].items():
        assert 1 / ratio - 1 == pytest.approx(pass_share(4096, head_dim), rel=0.05)
        # the uncalibrated bound charges the loops less, so the same bytes weigh more there
        assert pass_share(4096, head_dim, calibrated=False) > pass_share(4096, head_dim)
