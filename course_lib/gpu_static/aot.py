"""Compile one recorded launch ahead of time for a GPU target and read what it needs.

The launch's arguments go through Triton's own binder for a CUDA target (dtype, 16-byte
alignment, the ``== 1`` and ``% 16`` integer specialisation), then ``triton.compile`` builds it.
From the result: dynamic shared memory (Triton's metadata), registers and spill bytes (the ptxas
Triton uses, same flags, with ``-v``), and the lowering of every ``tl.dot`` read from the TTGIR:
``wgmma`` (Hopper warp-group MMA), ``tcgen5`` (Blackwell's tensor-memory MMA, sm_100), ``mma``
(``mma.sync``, the Ampere path, also sm_86, sm_89 and sm_120) or ``fma`` (CUDA cores:
expected for fp32 with IEEE products, a failure for 16-bit inputs where the compiler has a
tensor-core path for the target: :func:`tensor_core_lowering` asks it on a minimal fp16 dot;
Triton 3.9 has none for sm_75).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import torch

try:
    import triton.language as tl  # the probe kernel's namespace
except ImportError:  # no Triton: nothing here can compile
    tl = None

__all__ = [
    "compile_launch",
    "compile_key",
    "dot_lowering",
    "ptxas_usage",
    "tensor_core_lowering",
    "tool_versions",
]


def _backend(arch: int):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    target = GPUTarget("cuda", arch, 32)
    return target, make_backend(target)


_PROBE = None


def _fp16_dot(A, B, C):  # noqa: N803 - Triton's pointer-argument style
    r = tl.arange(0, 64)
    a = tl.load(A + r[:, None] * 64 + r[None, :])
    b = tl.load(B + r[:, None] * 64 + r[None, :])
    tl.store(C + r[:, None] * 64 + r[None, :], tl.dot(a, b))


def tensor_core_lowering(arch: int) -> bool:
    """Whether this Triton puts a minimal fp16 ``tl.dot`` (64 x 64 tiles, float32 result) on
    the tensor cores of ``arch`` (its TTGIR has an MMA layout or op): the kernels cannot do
    better than the compiler does on a plain product."""
    global _PROBE
    import triton
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if _PROBE is None:  # a compiled function whatever TRITON_INTERPRET says
        _PROBE = JITFunction(_fp16_dot)
    target, _ = _backend(arch)
    signature = {"A": "*fp16", "B": "*fp16", "C": "*fp32"}
    source = ASTSource(fn=_PROBE, signature=signature, constexprs={})
    compiled = triton.compile(source, target=target)
    lowering = dot_lowering(compiled.asm["ttgir"])
    return lowering["fma"] == 0 and any(lowering.values())


def _stand_in(x):
    """Tensors are replaced by small CPU tensors of the same dtype: the binder reads only the
    dtype and the alignment of the data pointer (CUDA allocations are 256-byte aligned)."""
    if isinstance(x, torch.Tensor):
        y = torch.empty(16, dtype=x.dtype)
        assert y.data_ptr() % 16 == 0
        return y
    return x


def _specialise(launch, arch: int):
    from triton.runtime.jit import create_function_from_signature

    target, backend = _backend(arch)
    fn = launch.kernel
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    args = [_stand_in(a) for a in launch.args]
    bound, specialization, options = binder(*args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, options, bound, specialization, options
    )
    return target, fn, options, signature, constexprs, attrs


def compile_key(launch, arch: int) -> str:
    """Equal for two launches that compile to the same binary."""
    _, fn, options, signature, constexprs, attrs = _specialise(launch, arch)
    consts = {k: getattr(v, "cache_key", v) for k, v in constexprs.items()}
    return repr((fn.cache_key, arch, sorted(options.__dict__.items()), signature,
                 sorted(consts.items(), key=str), sorted(attrs.items(), key=str)))  # fmt: skip


def _ptxas(arch: int):
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(arch)


def ptxas_version(arch: int) -> str:
    """The version of the ptxas Triton assembles ``arch`` with."""
    return str(_ptxas(arch).version)


def tool_versions(archs=(90, 80)) -> str:
    """Triton's version and the ptxas each target is assembled with (Triton picks one per
    target: its Blackwell ptxas from sm_90 on)."""
    import triton

    by_tool: dict[str, list[str]] = {}
    for arch in archs:
        by_tool.setdefault(str(_ptxas(arch).version), []).append(gpu_name(arch))
    tools = "; ".join(f"ptxas {v} ({', '.join(names)})" for v, names in by_tool.items())
    return f"triton {triton.__version__}, {tools}"


def gpu_name(arch: int) -> str:
    """The ``--gpu-name`` Triton gives ptxas: ``sm_90a`` from Hopper on, else ``sm_80``."""
    return f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"


def ptxas_usage(ptx: str, arch: int) -> dict:
    """Registers, spill store/load bytes and stack frame from ``ptxas -v`` (Triton's flags)."""
    tool = _ptxas(arch)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [tool.path, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu_name(arch)}",
               str(src), "-o", str(Path(tmp) / "k.o")]  # fmt: skip
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr

    def num(pattern: str, group: int = 1) -> int:
        m = re.search(pattern, log)
        return int(m.group(group)) if m else 0

    return dict(
        regs=num(r"Used (\d+) registers"),
        spill_store=num(r"(\d+) bytes spill stores"),
        spill_load=num(r"(\d+) bytes spill loads"),
        stack=num(r"(\d+) bytes stack frame"),
    )


def dot_lowering(ttgir: str) -> dict:
    """Count the dots of a TTGIR by lowering: ``wgmma``, ``tcgen5``, ``mma`` (mma.sync) and
    ``fma``."""
    versions = dict(re.findall(r"^(#mma\d*) = #ttg\.nvidia_mma<\{versionMajor = (\d)", ttgir, re.M))
    out = {"wgmma": 0, "tcgen5": 0, "mma": 0, "fma": 0}
    for line in ttgir.splitlines():
        if "ttng.warp_group_dot " in line:
            out["wgmma"] += 1
        elif "ttng.tc_gen5_mma " in line:
            out["tcgen5"] += 1
        elif re.search(r"= tt\.dot ", line):
            enc = re.search(r"-> tensor<[^,>]+, (#\w+)>", line)
            version = versions.get(enc.group(1)) if enc else None
            out[{"3": "wgmma", "2": "mma"}.get(version, "fma")] += 1
    return out


def compile_launch(launch, arch: int) -> tuple[dict, bytes]:
    """Compile for ``arch``; returns the facts (warps, stages, shared memory, registers, spills,
    dots) and the cubin."""
    import triton
    from triton.compiler import ASTSource

    target, fn, options, signature, constexprs, attrs = _specialise(launch, arch)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=target, options=options.__dict__)
    row = dict(
        warps=ck.metadata.num_warps,
        stages=ck.metadata.num_stages,
        smem=ck.metadata.shared,
        **ptxas_usage(ck.asm["ptx"], arch),
        **dot_lowering(ck.asm["ttgir"]),
    )
    return row, ck.asm["cubin"]
