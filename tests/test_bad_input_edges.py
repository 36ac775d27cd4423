"""Inputs at the edges get the right answer or a clear error: far positions for xPos, extreme
forget gates for FoX, huge coordinates for LieRE, parameters out of range given to public
functions, shapes that do not fit, an output folder that cannot be written, and a reference
attention too large for the machine.

One test per cause, as in test_bad_input.py: the error's message must name the argument, what it
got and what is allowed; a right answer is checked against a formula computed in float64.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import course_lib.attention as attention_module
from course_lib.attention import attention, attention_weights, get_attention_class
from course_lib.compare import main as compare_main
from course_lib.encodings import (
    apply_rope,
    apply_xpos,
    interpolate_position_logits,
    kerple_bias,
    lie_rotation,
    xpos_centre,
    xpos_reach,
)
from course_lib.layers import KVCache
from course_lib.runtime import kernel_device, kernels_available

needs_kernels = pytest.mark.skipif(
    not kernels_available(), reason="Triton is not installed (it ships wheels for Linux only)"
)
BACKENDS = ["reference", pytest.param("triton", marks=needs_kernels)]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def device_for(backend: str) -> torch.device:
    return kernel_device() if backend == "triton" else torch.device("cpu")


# -- xPos far from position 0 ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("backend", "dtype"),
    [("reference", torch.float32), ("reference", torch.float64),
     pytest.param("triton", torch.float32, marks=needs_kernels)],
)  # fmt: skip
def test_xpos_far_from_position_0_is_the_same_as_near_it(backend, dtype):
    """The score depends on n - m only, and both backends measure positions from the middle of
    each sequence's: positions 40000.. give exactly what 0.. give (they used to give NaN)."""
    device = device_for(backend)
    q, k, v = torch.randn(3, 2, 2, 9, 16, generator=gen(0), dtype=dtype).to(device).unbind(0)
    near = torch.arange(9, device=device)
    outs = [
        attention(q, k, v, method="xpos", causal=True, position_ids=p, backend=backend)
        for p in (near, near + 40000, torch.stack([near + 40000, near + 7]))
    ]
    assert not outs[1].isnan().any()
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


def test_xpos_module_far_from_position_0():
    torch.manual_seed(0)
    module = get_attention_class("xpos")(64, 4)
    x = torch.randn(2, 4, 64, generator=gen(1))
    far = module(x, causal=True, position_ids=torch.arange(4) + 40000)
    assert not far.isnan().any()
    assert torch.equal(far, module(x, causal=True, position_ids=torch.arange(4)))


def test_xpos_long_generation_with_a_cache_is_the_same_text_at_position_0():
    """Decoding runs the reference with every cached key: the centre moves as the cache grows,
    and each step at position 40000 + t computes exactly what the step at t does."""
    torch.manual_seed(0)
    module = get_attention_class("xpos")(32, 2)
    x = torch.randn(2, 12, 32, generator=gen(2))

    def generate(start: int) -> torch.Tensor:
        cache = KVCache()
        steps = [module(x[:, :4], causal=True, position_ids=torch.arange(4) + start, cache=cache)]
        for t in range(4, 12):
            step = module(
                x[:, t : t + 1], causal=True, position_ids=torch.tensor([start + t]), cache=cache
            )
            steps.append(step)
        return torch.cat(steps, dim=1)

    far = generate(40000)
    assert not far.isnan().any()
    assert torch.equal(far, generate(0))
    torch.testing.assert_close(far, module(x, causal=True), atol=1e-6, rtol=1e-5)


def test_xpos_refuses_positions_its_float32_scales_cannot_hold():
    q = torch.randn(1, 1, 4, 16, generator=gen(3))
    reach = xpos_reach(16)
    assert 35000 < reach < 36000  # a sequence may span about 71,000 positions
    wide = torch.tensor([0, 1, 2, 2 * reach + 2])
    with pytest.raises(ValueError, match=r"position_ids from 0 to \d+ span too much.*scale_base"):
        attention(q, q, q, method="xpos", causal=True, position_ids=wide)
    # the plain function takes positions as given, so far ones need the shared centre
    far = torch.arange(4) + 40000
    with pytest.raises(ValueError, match=r"lies 40003 from it.*past 35694.*centre="):
        apply_xpos(q, far, side="key")
    centred = apply_xpos(q, far, side="key", centre=xpos_centre(far))
    torch.testing.assert_close(centred, apply_xpos(q, far - 40001, side="key"))
    with pytest.raises(TypeError, match="centre must be None, an int or an integer tensor"):
        apply_xpos(q, far, side="key", centre=4.5)
    # one centre per sequence of the batch
    x = torch.randn(2, 3, 4, 16, generator=gen(13))
    each = apply_xpos(x, far, side="query", centre=torch.tensor([[40000], [40002]]))
    for i, centre in enumerate((40000, 40002)):
        assert torch.equal(each[i], apply_xpos(x[i], far, side="query", centre=centre))


# -- FoX with extreme forget gates ----------------------------------------------------------------
def fox_in_float64(q, k, v, log_forget):
    """FoX written out in float64: causal softmax of q.k / sqrt(d) + (c_i - c_j)."""
    c = torch.cumsum(log_forget.double(), -1)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores + (c[..., :, None] - c[..., None, :])
    seq = q.shape[2]
    scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(scores, -1) @ v.double()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fox_one_gate_shut_hard_keeps_the_gates_after_it(backend):
    """A log gate of -1e8 among -1s: in a float32 cumulative sum the later -1s vanished below
    its rounding (outputs off by 1 or more); summed in float64 the answer is right."""
    device = device_for(backend)
    q, k, v = torch.randn(3, 1, 2, 16, 16, generator=gen(4)).unbind(0)
    log_forget = torch.full((1, 2, 16), -1.0)
    log_forget[..., 3] = -1e8
    want = fox_in_float64(q, k, v, log_forget)
    out = attention(
        *(t.to(device) for t in (q, k, v)), method="fox", causal=True,
        log_forget=log_forget.to(device), backend=backend,
    )  # fmt: skip
    torch.testing.assert_close(out.cpu().double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fox_every_gate_shut_attends_to_itself_only(backend):
    """Log gates of -2e38 overflowed a float32 sum (NaN); every key behind a shut gate gets no
    weight, so each query reads its own value."""
    device = device_for(backend)
    q, k, v = torch.randn(3, 1, 2, 8, 16, generator=gen(5)).to(device).unbind(0)
    log_forget = torch.full((1, 2, 8), -2e38, device=device)
    out = attention(q, k, v, method="fox", causal=True, log_forget=log_forget, backend=backend)
    torch.testing.assert_close(out, v)


@needs_kernels
def test_fox_kernels_refuse_a_sum_float32_cannot_resolve():
    """The kernels read the cumulative sum as float32: where it is large and later gates still
    count, the kernels refuse and name the reference, which is right there."""
    seq = 300
    q, k, v = torch.randn(3, 1, 1, seq, 16, generator=gen(6)).unbind(0)
    log_forget = torch.full((1, 1, seq), -1000.0)  # shut (e^-1000), but above the kernels' floor
    log_forget[..., -20:] = -0.5  # ... then open gates, far down the sum
    with pytest.raises(ValueError, match=r"float32.*\|c\| reaches 2\.8e\+05.*backend='reference'"):
        device = kernel_device()
        attention(
            *(t.to(device) for t in (q, k, v)), method="fox", causal=True,
            log_forget=log_forget.to(device), backend="triton",
        )  # fmt: skip
    out = attention(q, k, v, method="fox", causal=True, log_forget=log_forget)
    torch.testing.assert_close(out.double(), fox_in_float64(q, k, v, log_forget), atol=1e-5, rtol=0)


# -- LieRE ----------------------------------------------------------------------------------------
def test_lie_rotation_stays_orthogonal_for_huge_coordinates_in_float32():
    generators = torch.randn(2, 4, 4, generator=gen(7)) * 0.5
    coords = torch.randint(0, 14, (64, 2), generator=gen(8)).float() * 1e6
    rotation = lie_rotation(coords, generators)
    assert rotation.dtype == torch.float32
    identity = torch.eye(4).expand_as(rotation)
    torch.testing.assert_close(rotation.transpose(-1, -2) @ rotation, identity, atol=1e-6, rtol=0)
    exact = lie_rotation(coords.double(), generators.double())  # the same inputs, in float64
    torch.testing.assert_close(rotation, exact.float(), atol=1e-6, rtol=0)


def test_lie_rotation_names_shapes_that_do_not_broadcast():
    coords = torch.zeros(8, 2).expand(3, 8, 2)
    shapes = r"coords \(3, 8, 2\).*\(3, 8\).*generators \(5, 2, 4, 4\)"
    with pytest.raises(ValueError, match=shapes):
        lie_rotation(coords, torch.randn(5, 2, 4, 4))


def test_liere_init_std_must_be_a_number():
    with pytest.raises(TypeError, match="init_std .* must be a real number, got 'big'"):
        get_attention_class("liere")(64, 4, init_std="big")
    with pytest.raises(ValueError, match="init_std .* must be a finite number >= 0"):
        get_attention_class("liere")(64, 4, init_std=-1.0)


# -- public functions given what attention() refuses ----------------------------------------------
def test_kerple_bias_refuses_parameters_out_of_range():
    d = torch.arange(3)
    with pytest.raises(ValueError, match=r"KERPLE r1 must be > 0 for every head.*\[-1.0\]"):
        kerple_bias(d, torch.tensor([-1.0]), torch.tensor([-1.0]))
    with pytest.raises(ValueError, match=r"KERPLE r2 must be > 0 for every head"):
        kerple_bias(d, torch.tensor([1.0]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"KERPLE r2 must be > 0 for every head.*nan"):
        kerple_bias(d, torch.tensor([1.0]), torch.tensor([math.nan]), "power")
    # the power variant past r2 = 2 is a formula to look at (attention refuses it)
    assert kerple_bias(d, torch.tensor([1.0]), torch.tensor([3.0]), "power").tolist() == [
        [-0.0, -1.0, -8.0]
    ]
    with pytest.raises(ValueError, match="one value per head each"):
        kerple_bias(d, torch.tensor([1.0, 2.0]), torch.tensor([1.0]))
    with pytest.raises(TypeError, match="distances .* must be an integer tensor"):
        kerple_bias(d.float(), torch.tensor([1.0]), torch.tensor([1.0]))


def test_apply_rope_names_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match=r"position_ids of shape \(3, 8\) do not fit x .*\(2, 2"):
        apply_rope(torch.randn(2, 2, 8, 16), torch.arange(8).expand(3, 8))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., seq, head_dim\].*\(16,\)"):
        apply_rope(torch.randn(16), torch.arange(1))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., seq, head_dim\].*\(16,\)"):
        apply_xpos(torch.randn(16), torch.arange(1), side="query")
    # what fits still works: per-sequence positions with a batch of 1 or of x's
    x = torch.randn(2, 2, 8, 16, generator=gen(9))
    each = apply_rope(x, torch.stack([torch.arange(8), torch.arange(8) + 3]))
    torch.testing.assert_close(each[1:], apply_rope(x[1:], torch.arange(8) + 3))
    torch.testing.assert_close(apply_rope(x, torch.arange(8)[None]), apply_rope(x, torch.arange(8)))


def test_a_cache_names_positions_without_a_batch_axis():
    k = torch.randn(1, 2, 3, 4)
    message = r"positions must be \[1, 3\].*got \(3,\).*positions\[None\]"
    with pytest.raises(ValueError, match=message):
        KVCache().append(k, k, torch.arange(3), None)
    with pytest.raises(TypeError, match="positions must be a tensor"):
        KVCache().append(k, k, [0, 1, 2], None)
    cached = KVCache().append(k, k, torch.arange(3)[None], None)
    assert cached[2].tolist() == [[0, 1, 2]]


def test_interpolated_position_logits_refuse_positions_outside_the_table():
    z = torch.tensor([[0.0, 10.0, 30.0, 70.0]])  # npos = 4
    for bad in (-0.5, 3.5):
        with pytest.raises(ValueError, match=r"positions must lie in \[0, npos - 1\] = \[0, 3\]"):
            interpolate_position_logits(z, torch.tensor([[0.0, bad]]))
    with pytest.raises(TypeError, match="positions must be a real floating-point tensor"):
        interpolate_position_logits(z, torch.tensor([[0, 1]]))
    inside = interpolate_position_logits(z, torch.tensor([[0.0, 1.5, 3.0, math.nan]]))
    assert inside[0, :3].tolist() == [0.0, 20.0, 70.0] and math.isnan(inside[0, 3])
    # CoPE reads only counts capped at npos - 1: long rows of open gates still work
    q = torch.randn(1, 2, 40, 8, generator=gen(10))
    table = torch.randn(4, 8, generator=gen(11))
    out = attention(q, q * 20, q, method="cope", causal=True, position_embeddings=table)
    assert out.isfinite().all()


# -- the comparison's output folder ---------------------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_folder_that_cannot_be_made_is_one_clear_message(capsys):
    argv = ["--preset", "tiny", "--no-progress", "--seeds", "0", "--encodings", "none",
            "--objectives", "clm", "--out", "/proc/x"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        compare_main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and error.count("error:") == 1
    assert "--out /proc/x: the comparison cannot write there" in error
    assert "choose another --out" in error


# -- the reference backend's memory ---------------------------------------------------------------
def test_the_reference_says_when_its_matrices_exceed_the_machine(monkeypatch):
    """The reference holds several [seq_q, seq_k] buffers per batch and head: at 32,768 tokens
    each is 4 GiB. It says so before allocating, with the size and the way out."""
    q = torch.zeros(1, 1, 1, 16).expand(64, 16, 32768, 16)  # a view: nothing allocated
    message = (
        r"batch 64 x heads 16 x seq_q 32768 x seq_k 32768 scores take 4,096.0 GiB per buffer.*"
        r"about 6 such buffers.*backend='triton'.*shorter sequences"
    )
    with pytest.raises(ValueError, match=message):
        attention(q, q, q)
    with pytest.raises(ValueError, match=message):
        attention_weights(q, q, method="alibi", causal=True)
    # against a machine of 1 GiB, 8192 tokens of one head (6 x 256 MiB) are refused too ...
    monkeypatch.setattr(attention_module, "machine_memory", lambda device: 2**30)
    q = torch.zeros(1, 1, 1, 16).expand(1, 1, 8192, 16)
    with pytest.raises(ValueError, match=r"\(1.5 GiB\), more than the 1.0 GiB"):
        attention(q, q, q, method="rope", causal=True)
    # ... and fit a machine of 2 GiB; sizes under 1 GiB are never looked at
    monkeypatch.setattr(attention_module, "machine_memory", lambda device: 2 * 2**30)
    attention_module._check_reference_memory(q, q)
    monkeypatch.setattr(attention_module, "machine_memory", lambda device: 0)
    small = torch.randn(2, 2, 64, 16, generator=gen(12))
    assert attention(small, small, small).shape == small.shape
