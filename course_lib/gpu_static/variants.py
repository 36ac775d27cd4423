"""Every launch the kernel wrappers can issue, built by the wrappers themselves.

A :class:`Variant` is one call of a family's forward and backward wrapper (flash or
stick-breaking) with one set of features: q/k tables (pair layout, gain), a score-bias hook
(and whether its parameter gradient is wanted), a key-padding mask, causal or not, head_dim,
dtype, and the GPU it is configured for. :func:`plan` calls ``*_forward`` and ``*_backward`` of
the kernel module on ``meta`` tensors of the benchmark shape inside
:func:`~course_lib.kernels.common.planned_launches`, so the launches (kernel, grid, argument
list, constexprs, warps, stages) are exactly the ones a GPU of that compute capability would
get: the block sizes come from the wrappers' ``pick_config``, the arguments from their own
code. Nothing is allocated and nothing runs.

The kernels are loaded from ``kernels/`` as a separate package with ``TRITON_INTERPRET`` unset
(``course_lib`` sets it on a machine without a GPU, and Triton reads it when a kernel is
decorated), so they are real compiled-mode kernels. The score-bias hooks are found through the
registry (every record's ``kernel_hooks``, and the kernels' per-distance hook): a hook defined in
an encoding's file was decorated for the interpreter, so :func:`compiled_hook` decorates its
functions again for the compiler, from the same source, with the helpers they call (by name,
from their module) replaced by their compiled versions.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import sys
import types
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from course_lib.gpu_static import model

__all__ = [
    "BENCH_HIDDEN",
    "BENCH_SEQ",
    "BENCH_TOKENS",
    "DTYPES",
    "FAR_REACH",
    "Features",
    "Variant",
    "compile_ready",
    "compiled_hook",
    "feature_sets",
    "hook_users",
    "hooks",
    "kernel_package",
    "plan",
    "workspace",
]

# The benchmark shape of course_lib.bench: tokens 16384 and hidden 2048 at seq 8192, so batch 2
# and heads 2048 / head_dim.
BENCH_TOKENS, BENCH_HIDDEN, BENCH_SEQ = 16384, 2048, 8192
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COPE_NPOS = 64  # CoPE's position table in the report (a runtime size: it changes no compile)
FAR_REACH = model.FAR_REACH  # the far form's reach in the report (a runtime value)
KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
_PACKAGE = "_gpu_static_kernels"


def kernel_package():
    """``kernels/`` loaded as the package ``_gpu_static_kernels`` in compiled mode (once)."""
    if _PACKAGE in sys.modules:
        return sys.modules[_PACKAGE]
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        spec = importlib.util.spec_from_file_location(
            _PACKAGE, KERNELS_DIR / "__init__.py", submodule_search_locations=[str(KERNELS_DIR)]
        )
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[_PACKAGE] = pkg
        spec.loader.exec_module(pkg)
        for name in ("common", "score_bias", "qk_transform", "flash", "stick_breaking", "cope"):
            importlib.import_module(f"{_PACKAGE}.{name}")
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    return pkg


def _module(name: str):
    kernel_package()
    return sys.modules[f"{_PACKAGE}.{name}"]


@contextmanager
def _compiled_mode():
    """Decorate with ``TRITON_INTERPRET`` unset (Triton reads it when a function is decorated)."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def _is_triton_function(value) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return isinstance(value, (JITFunction, InterpretedFunction))


def compile_ready() -> None:
    """Make this process able to compile kernels ahead of time: Triton's own ``@triton.jit``
    library was decorated for the interpreter (``course_lib`` sets ``TRITON_INTERPRET`` without a
    GPU, before the encodings' hooks import Triton), so it is decorated again for the compiler
    (:func:`course_lib.runtime.set_triton_library_mode`). Call it only in a process that
    compiles and never runs the interpreter again (the report's workers)."""
    from course_lib.runtime import set_triton_library_mode

    set_triton_library_mode(interpret=False)


_FUNCTIONS: dict[int, object] = {}
_NAMESPACES: dict[int, dict] = {}


def _compiled_namespace(module_globals: dict) -> dict:
    """A copy of a module's globals in which every Triton function is its compiled version."""
    key = id(module_globals)
    if key not in _NAMESPACES:
        namespace = _NAMESPACES[key] = dict(module_globals)
        for name, value in module_globals.items():
            if _is_triton_function(value):
                namespace[name] = compiled_function(value)
    return _NAMESPACES[key]


def compiled_function(fn):
    """The compiled-mode version of a ``@triton.jit`` function decorated for the interpreter.

    A function of ``course_lib.kernels`` is the same-named one of :func:`kernel_package`; any
    other is decorated again from its own code, with a copy of its module's globals in which the
    Triton functions it may call are compiled versions too (helpers must be called by name).
    """
    python = getattr(fn, "fn", fn)
    module = python.__module__ or ""
    if module.startswith("course_lib.kernels."):
        return getattr(_module(module.rsplit(".", 1)[1]), python.__name__)
    key = id(python)
    if key not in _FUNCTIONS:
        namespace = _compiled_namespace(python.__globals__)
        if key not in _FUNCTIONS:  # (filling the namespace may have made it already)
            copy = types.FunctionType(
                python.__code__, namespace, python.__name__, python.__defaults__,
                python.__closure__,
            )  # fmt: skip
            copy.__module__, copy.__qualname__ = module, python.__qualname__
            copy.__doc__ = python.__doc__
            import triton

            with _compiled_mode():
                _FUNCTIONS[key] = triton.jit(copy)
    return _FUNCTIONS[key]


def compiled_hook(hook):
    """A score-bias hook object with compiled-mode functions (see :func:`compiled_function`),
    as an instance of the compiled package's ``BiasHook``."""
    fields = {f.name: getattr(hook, f.name) for f in dataclasses.fields(hook)}
    for name in ("bias", "grad", "factor", "split", "far"):
        if fields.get(name) is not None:
            fields[name] = compiled_function(fields[name])
    target = _module("score_bias").BiasHook  # an earlier kernels/ may lack newer fields
    known = {f.name for f in dataclasses.fields(target)}
    return target(**{name: value for name, value in fields.items() if name in known})


_HOOKS: dict[str, object] = {}


def hook_users() -> dict[str, list[str]]:
    """``hook name -> the encodings that can hand it to the kernels``: those that list it in
    their record's ``kernel_hooks``; for the per-distance table, those with a ``distance_bias``
    (marked ``*`` where the record's ``kernel_bias`` chooses between the table and a specialised
    hook of its own), and under ``diagonal_table+far`` those that declare a ``distance_reach``."""
    from course_lib.kernel_hooks import registered_hooks
    from course_lib.registry import REGISTRY

    users: dict[str, list[str]] = {name: [] for name in registered_hooks()}
    for name, encoding in REGISTRY.items():
        for hook in encoding.kernel_hooks:
            users.setdefault(hook.name, []).append(name)
        if encoding.distance_bias is not None and "diagonal_table" in users:
            users["diagonal_table"].append(name + ("" if encoding.kernel_bias is None else "*"))
            if encoding.distance_reach is not None:  # its table stops changing: the far form
                users.setdefault("diagonal_table+far", []).append(
                    name + ("" if encoding.kernel_bias is None else "*")
                )
    return users


def hooks() -> dict[str, object]:
    """``name -> compiled hook`` of every hook the registry knows
    (:func:`course_lib.kernel_hooks.registered_hooks`)."""
    if not _HOOKS:
        from course_lib.kernel_hooks import registered_hooks

        _HOOKS.update({name: compiled_hook(h) for name, h in registered_hooks().items()})
    return _HOOKS


@dataclass(frozen=True)
class Features:
    """What a wrapper call switches on: ``tables`` (None or a pair layout), ``gain``, ``hook``
    (the name of a registered score-bias hook, see :func:`hooks`, or None), ``grad`` (its
    parameter gradient), ``mask``, ``far`` (the hook's far form, flash only: the tiles past
    :data:`FAR_REACH` run without the bias)."""

    tables: str | None = None
    gain: bool = False
    hook: str | None = None
    grad: bool = False
    mask: bool = False
    far: bool = False

    @property
    def label(self) -> str:
        parts = []
        if self.tables:
            parts.append("tables" + ("-half" if self.tables == "half" else ""))
        if self.gain:
            parts.append("gain")
        if self.hook:
            parts.append(self.hook + ("(grad)" if self.grad else ""))
        if self.mask:
            parts.append("mask")
        if self.far:
            parts.append("far")
        return "+".join(parts) or "plain"


def _families(hook) -> tuple[str, ...]:
    names = getattr(hook, "families", ("flash", "stick_breaking"))
    return tuple("stick" if n.startswith("stick") else n for n in names)


def feature_sets(full: bool, family: str | None = None) -> list[Features]:
    """The feature combinations compiled for each family.

    Always: no tables and no bias (``plain``), interleaved tables (RoPE), and for every hook the
    registry knows (:func:`hooks`) tables + gain + the hook (with its gradient when it has a
    learnable tensor), the heaviest combination each hook can be part of (only the hooks that
    ``family`` takes, when given). ``full`` adds tables
    with a gain alone, each hook with tables but no gain and with no tables, the half pair
    layout and a key-padding mask.
    """
    if family == "cope":  # CoPE's own scan: no tables, no hooks
        return [Features()]
    chosen = {
        name: hook for name, hook in hooks().items() if family is None or family in _families(hook)
    }
    out = [Features(), Features(tables="interleaved")]
    for name, hook in chosen.items():
        out.append(Features("interleaved", True, name, hook.grad is not None))
        if family == "flash" and getattr(hook, "far", None) is not None:  # as T5 runs it
            out.append(Features("interleaved", True, name, hook.grad is not None, far=True))
    if full:
        out.append(Features("interleaved", True))
        for name, hook in chosen.items():
            learnable = hook.grad is not None
            out.append(Features("interleaved", False, name, learnable))
            out.append(Features(None, False, name, learnable))
        out.append(Features(tables="half"))
        out.append(Features(mask=True))
    return out


@dataclass(frozen=True)
class Variant:
    """One (family, features, causal, head_dim, dtype, arch) wrapper call."""

    family: str  # "flash" or "stick"
    features: Features
    causal: bool
    head_dim: int
    dtype: str
    arch: int

    @property
    def name(self) -> str:
        return (
            f"{self.family} {self.features.label} {'causal' if self.causal else 'bidir'} "
            f"D{self.head_dim} {self.dtype} sm{self.arch}"
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["features"] = self.features.label
        return d


def _hook_params(hook, batch: int, heads: int, seq: int) -> torch.Tensor | None:
    """A meta tensor of the shape the hook reads (None for a hook without one); a table's width
    comes from the hook's ``example_options``, a per-diagonal table is shared by the batch."""
    if hook.param is None:
        return None
    shape = hook.tensor_shape(batch, heads, seq, hook.example_options)
    if hook.param == "per_diagonal":
        shape = (1, *shape[1:])
    return torch.empty(shape, dtype=torch.float32, device="meta")


def _options_keyword(fn) -> str | None:
    """The wrapper's keyword for a hook's compile-time options, if it has one."""
    names = [n for n in inspect.signature(fn).parameters if "option" in n]
    return names[0] if names else None


def plan(v: Variant) -> list:
    """The launches of ``v``'s forward and backward (``common.Launch`` objects), in order."""
    return _plan(v)[0]


def workspace(v: Variant) -> int:
    """Bytes the backward wrapper allocates for one call (gradients, row data, checkpoints):
    the tensors its launches take that are neither inputs nor the forward's."""
    launches, n_forward = _plan(v)
    known = {id(a) for launch in launches[:n_forward] for a in launch.args}
    seen, total = set(), 0
    for launch in launches[n_forward:]:
        for a in launch.args:
            if isinstance(a, torch.Tensor) and id(a) not in known and id(a) not in seen:
                seen.add(id(a))
                total += a.numel() * a.element_size()
    return total


def _plan(v: Variant) -> tuple[list, int]:
    common = _module("common")
    f = v.features
    batch = max(1, BENCH_TOKENS // BENCH_SEQ)
    heads, seq, d = max(1, BENCH_HIDDEN // v.head_dim), BENCH_SEQ, v.head_dim
    meta = dict(device="meta")
    dt = DTYPES[v.dtype]

    def projection() -> torch.Tensor:  # [batch, seq, heads, d] viewed as [batch, heads, seq, d]
        return torch.empty(batch, seq, heads, d, dtype=dt, **meta).transpose(1, 2)

    q, k, val, grad_out = projection(), projection(), projection(), projection()
    positions = torch.empty(1, seq, dtype=torch.float32, **meta)
    mask = torch.empty(batch, seq, dtype=torch.int8, **meta) if f.mask else None
    tables = None
    if f.tables:
        cos = torch.empty(1, seq, d // 2, dtype=torch.float32, **meta)
        gain = torch.empty(d, dtype=torch.float32, **meta) if f.gain else None
        tables = _Tables(cos, cos.clone(), gain, f.tables)
    hook = None if f.hook is None else hooks()[f.hook]
    params = None if hook is None else _hook_params(hook, batch, heads, seq)
    options = dict(
        causal=v.causal,
        scale=1.0 / math.sqrt(d),
        qk_tables=tables,
        bias_hook=hook,
        bias_params=params,
    )
    fwd_name = "flash_attention_forward" if v.family == "flash" else "stick_breaking_forward"
    m = _module("flash" if v.family == "flash" else "stick_breaking")
    keyword = _options_keyword(getattr(m, fwd_name))  # (CoPE takes none of these options)
    if hook is not None and keyword is not None:
        options[keyword] = dict(hook.example_options or {})
    if f.far:
        options["bias_far_reach"] = FAR_REACH
    if v.family in ("flash", "stick"):  # the benchmark's positions, arange(seq): ordered, affine
        takes = inspect.signature(getattr(m, fwd_name)).parameters
        for name in ("positions_ordered", "positions_affine"):
            if name in takes:  # (an earlier kernels/ may not take them)
                options[name] = True
    with common.planned_launches(v.arch) as launches:
        if v.family == "flash":
            out, lse = m.flash_attention_forward(q, k, val, positions, mask, **options)
            n_forward = len(launches)
            m.flash_attention_backward(
                grad_out, q, k, val, out, lse, positions, mask, bias_grad=f.grad, encoded=True,
                **options,
            )  # fmt: skip
        elif v.family == "cope":  # causal only; z [batch, heads, seq, npos], the course's npos
            z = torch.empty(batch, heads, seq, COPE_NPOS, dtype=torch.float32, **meta)
            m = _module("cope")
            out, lse = m.cope_forward(q, k, val, z, mask, scale=options["scale"])
            n_forward = len(launches)
            m.cope_backward(grad_out, q, k, val, z, out, lse, mask, scale=options["scale"])
        elif v.family == "stick":
            out, mass = m.stick_breaking_forward(q, k, val, positions, mask, **options)
            n_forward = len(launches)
            m.stick_breaking_backward(
                grad_out, q, k, val, mass, positions, mask, bias_grad=f.grad, encoded=True,
                **options,
            )  # fmt: skip
        else:
            raise ValueError(f"unknown family {v.family!r}")
    return list(launches), n_forward


@dataclass(frozen=True)
class _Tables:
    """What the kernel wrappers read of the caller's q/k tables (duck-typed, as theirs)."""

    cos: torch.Tensor
    sin: torch.Tensor
    gain: torch.Tensor | None
    layout: str
