"""Property tests: for every registered encoding, the two backends compute the same function on
whatever Hypothesis draws, or both refuse it with the same clear error; finite input never gives
NaN.

Drawn: batch, heads, ragged lengths (key padding, or none), head_dim among those the kernels
support, dtype, positions (shifted ranges or arbitrary integers, per example or shared; two
coordinates per token for image encodings), causal or bidirectional, the score scale, the size of
q, k, v and the spread of the encoding's own parameters (taken from its module, so an encoding
added to the registry is covered with no edit). Agreement means ``torch.allclose`` with the
documented tolerance of the dtype: atol = rtol = 1e-4 (float32), 1e-2 (float16), 2e-2 (bfloat16).

Kept small for Triton's CPU interpreter: a fixed example sequence (``derandomize``), a bounded
number of examples per encoding, sequences of at most 12 tokens.
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from test_bad_input import device_for, method_kwargs

from course_lib.attention import attention, get_attention_class
from course_lib.checks import KERNEL_HEAD_DIMS
from course_lib.registry import REGISTRY, attention_methods, get_encoding
from course_lib.runtime import KERNEL_MODE, kernels_available, kernels_refuse_bf16

# Hypothesis keeps caches in a folder of its own: a temporary one, not the checkout
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="course-hypothesis-"))

pytestmark = pytest.mark.skipif(
    not kernels_available(), reason="Triton is not installed (it ships wheels for Linux only)"
)

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
#: In the interpreter bf16 is drawn by its own test (see test_bf16_agrees_or_is_refused).
# bf16 on a GPU with bf16 tensor cores (the kernels refuse it on a T4); in the interpreter below
DTYPES = [torch.float32, torch.float16] + (
    [torch.bfloat16] if KERNEL_MODE == "compiled" and not kernels_refuse_bf16() else []
)
HEAD_DIMS = [d for d in KERNEL_HEAD_DIMS if d <= 32]  # the smallest the kernels take
METHODS = list(attention_methods())
TABLE_ROWS = 64  # max_position_embeddings of the modules drawn
ENCODINGS = list(REGISTRY)
SETTINGS = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def layouts(draw, name: str, *, module: bool = False, dtypes=tuple(DTYPES)):
    """Shapes, dtype, padding, causality and positions of one call of ``name`` (a method, or
    with ``module`` an encoding's module: positions are then drawn for every encoding, inside
    the table of one that has a table of positions)."""
    spec = get_encoding(name) if name in REGISTRY else None
    batch = draw(st.integers(1, 2))
    seq = draw(st.integers(1, 12))
    lengths = draw(
        st.one_of(st.none(), st.lists(st.integers(1, seq), min_size=batch, max_size=batch))
    )
    mask = None if lengths is None else torch.arange(seq)[None] < torch.tensor(lengths)[:, None]
    causal = True if spec is not None and spec.causal_only else draw(st.booleans())
    drawn = spec is not None and (module or spec.uses_positions)
    limit = TABLE_ROWS if spec is not None and spec.inputs is not None else 5000
    dims = 1 if spec is None else spec.position_dims
    return {
        "batch": batch,
        "heads": draw(st.integers(1, 2)),
        "seq": seq,
        "head_dim": draw(st.sampled_from(HEAD_DIMS)),
        "dtype": draw(st.sampled_from(dtypes)),
        "mask": mask,
        "causal": causal,
        "size": draw(st.floats(0.1, 2.0)),
        "spread": draw(st.floats(0.05, 1.5)),
        "seed": draw(st.integers(0, 2**16)),
        "positions": draw(position_ids(dims, batch, seq, limit)) if drawn else None,
    }


@st.composite
def position_ids(draw, dims: int, batch: int, seq: int, limit: int):
    """None (the default), or integer positions below ``limit``: a shifted range or arbitrary
    values, shared by the batch or one row per example; for two coordinates per token,
    (row, column) pairs on a 16 x 16 grid."""
    if dims == 1 and draw(st.booleans()):
        return (
            None if draw(st.booleans()) else torch.arange(seq) + draw(st.integers(0, limit - seq))
        )
    rows = draw(st.sampled_from([1, batch]))
    high = 15 if dims == 2 else limit - 1
    count = rows * seq * dims
    values = torch.tensor(draw(st.lists(st.integers(0, high), min_size=count, max_size=count)))
    values = values.view(rows, seq, dims) if dims == 2 else values.view(rows, seq)
    return values[0] if rows == 1 and draw(st.booleans()) else values


def run_both(call):
    """``call(backend)`` for both backends: their outputs, or the errors they raised."""
    outcomes = {}
    for backend in ("reference", "triton"):
        try:
            outcomes[backend] = call(backend)
        except (TypeError, ValueError) as error:
            outcomes[backend] = error
    return outcomes["reference"], outcomes["triton"]


def assert_same_function(reference, triton, dtype, what: str) -> None:
    """Both raised the same kind of error with the same message, or both gave finite outputs
    that agree within the dtype's tolerance, or the Triton backend refused an input its kernels
    do not take (README's list: e.g. positions that do not step by a constant, for a bias read
    by distance) with a ValueError that sends the caller to the reference backend."""
    if isinstance(triton, ValueError) and not isinstance(reference, Exception):
        assert "Use backend='reference'" in str(triton), f"{what}: {triton!r}"
        return
    if isinstance(reference, Exception) or isinstance(triton, Exception):
        assert type(reference) is type(triton), f"{what}: {reference!r} vs {triton!r}"
        assert str(reference) == str(triton), what
        return
    assert torch.isfinite(reference).all(), f"{what}: the reference gave NaN or inf"
    assert torch.isfinite(triton).all(), f"{what}: the Triton backend gave NaN or inf"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(
        triton.cpu().float(),
        reference.cpu().float(),
        atol=tol,
        rtol=tol,
        msg=lambda m: f"{what}\n{m}",
    )


def attention_call(method: str, draw_: dict):
    """What ``run_both`` calls: attention() on drawn q, k, v and the method's parameters."""
    d = draw_
    device = device_for("triton")
    gen = torch.Generator().manual_seed(d["seed"])
    shape = (3, d["batch"], d["heads"], d["seq"], d["head_dim"])
    q, k, v = (torch.randn(shape, generator=gen) * d["size"]).to(device, d["dtype"]).unbind(0)
    kwargs = method_kwargs(
        method, batch=d["batch"], heads=d["heads"], seq=d["seq"], head_dim=d["head_dim"],
        dtype=d["dtype"], seed=d["seed"], device=device, spread=d["spread"],
    )  # fmt: skip
    kwargs["causal"] = d["causal"]
    if d["positions"] is not None:
        kwargs["position_ids"] = d["positions"].to(device)
    if d["mask"] is not None:
        kwargs["key_padding_mask"] = d["mask"].to(device)
    if d.get("scale") is not None:
        kwargs["scale"] = d["scale"]

    def call(backend):
        return attention(q, k, v, backend=backend, **kwargs)

    return call


@pytest.mark.parametrize("method", METHODS)
@SETTINGS
@given(data=st.data())
def test_both_backends_compute_every_method_alike(method, data):
    spec = REGISTRY.get(method)
    d = data.draw(layouts(method))
    # now and then a scale both backends must refuse alike
    bad_scales = st.sampled_from([0.0, -1.0, float("nan"), float("inf"), True])
    d["scale"] = data.draw(
        st.one_of(st.none(), st.floats(0.05, 1.0), st.floats(0.05, 1.0), bad_scales)
    )
    reference, triton = run_both(attention_call(method, d))
    if spec is not None and spec.kernel_support:  # the record says why it has no kernel
        assert isinstance(triton, ValueError) and spec.kernel_support in str(triton)
        return
    assert_same_function(reference, triton, d["dtype"], f"{method} {d}")


@pytest.mark.parametrize("name", ENCODINGS)
@SETTINGS
@given(data=st.data())
def test_both_backends_compute_every_encodings_module_alike(name, data):
    """The modules, so encodings that add their signal to the inputs (place 1) are drawn too."""
    spec = get_encoding(name)
    if spec.kernel_support:
        pytest.skip(f"no kernel: {spec.kernel_support}")
    d = data.draw(layouts(name, module=True))
    device, hidden = device_for("triton"), d["heads"] * d["head_dim"]
    modules = {
        backend: get_attention_class(name)(
            hidden, d["heads"], max_position_embeddings=TABLE_ROWS, backend=backend
        )
        for backend in ("reference", "triton")
    }
    with torch.no_grad():  # the encoding's own parameters, redrawn with the drawn spread
        gen = torch.Generator().manual_seed(d["seed"] + 1)
        for pname, p in modules["reference"].named_parameters():
            if pname.split(".")[0] not in ("query", "key", "value", "out"):
                p.normal_(0.0, d["spread"], generator=gen)
    modules["triton"].load_state_dict(modules["reference"].state_dict())
    gen = torch.Generator().manual_seed(d["seed"])
    x = torch.randn(d["batch"], d["seq"], hidden, generator=gen) * d["size"]
    x = x.to(device, d["dtype"])
    kwargs = {"causal": d["causal"]}
    if d["positions"] is not None:
        kwargs["position_ids"] = d["positions"].to(device)
    if d["mask"] is not None:
        kwargs["attention_mask"] = d["mask"].to(device)

    def call(backend):
        with torch.no_grad():
            return modules[backend].to(device, d["dtype"])(x, **kwargs)

    reference, triton = run_both(call)
    assert_same_function(reference, triton, d["dtype"], f"{name} {d}")


@pytest.mark.skipif(KERNEL_MODE == "compiled", reason="bf16 is drawn with the other dtypes")
@settings(SETTINGS)
@given(data=st.data())
def test_bf16_agrees_in_the_interpreter(data):
    """bf16 in the interpreter (which runs the float32 kernels and rounds to bf16): the same
    function within 2e-2, never garbage."""
    method = data.draw(st.sampled_from(METHODS))
    d = data.draw(layouts(method, dtypes=(torch.bfloat16,)))
    reference, triton = run_both(attention_call(method, d))
    assert_same_function(reference, triton, torch.bfloat16, f"{method} {d}")
