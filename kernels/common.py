"""What both kernel families share: the per-program preamble and the launch-side argument checks.

Layout convention (flash and stick-breaking alike):

* ``q``, ``k``, ``v`` and the incoming gradient ``dO`` are ``[batch, heads, seq, head_dim]`` read
  through their four strides, so views such as ``x.view(b, n, h, d).transpose(1, 2)`` go in
  without a copy. What the kernels write (outputs, gradients, row statistics) is allocated
  contiguous by the launchers.
* ``positions``: float32 ``[1 or batch, seq]``, each sequence's positions minus its smallest one,
  subtracted in integers by the wrappers (exact: spans below ``2^24``); a leading 1 is read with
  batch stride 0. So ``p_i - p_j`` in a hook is exact, whatever the positions' size.
* ``key_mask``: int8 ``[batch, seq]``, nonzero = real token.
* q/k tables (see :class:`course_lib.kernel_hooks.QKTables`): ``cos``, ``sin`` float32
  ``[1 or batch, seq, head_dim/2]`` (batch stride 0 for a leading 1; seq and pair dimensions
  contiguous), ``gain`` float32 ``[head_dim]`` or None, ``layout`` in :data:`PAIR_LAYOUTS`;
  the keys' own ``key_cos``, ``key_sin`` (same shape and strides), or the same tables again.
* score-bias parameters: the tensor a hook reads (``per_head`` float32 ``[heads]`` or ``[heads,
  width]``, ``per_token`` ``[batch, heads, seq]``, ``per_diagonal`` ``[1 or batch, heads,
  2 seq - 1]``), moved to the program's (batch, head) by ``batch * stride_bias_b + head *
  stride_bias_h`` (the hook's :meth:`BiasHook.strides`); the hook's compile-time options reach
  the kernels as the constexpr ``BIAS_OPTIONS``. The hook is an object (:class:`.score_bias.
  BiasHook`), not a name: the kernels call whatever functions it carries.

Every kernel of both families starts with :func:`_program_setup`, which turns the program ids
into the block index and the (batch, head) and moves every per-(batch, head) pointer there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from .limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS, MAX_BATCH_HEADS, PAIR_LAYOUTS
from .score_bias import BiasHook

__all__ = [
    "Launch",
    "LaunchArgs",
    "check_dtype_on_gpu",
    "check_launch_inputs",
    "dot_precision",
    "gpu_arch",
    "planned_launches",
    "position_line",
    "prepare_launch",
    "run_launch",
    "smem_per_block",
]


@triton.jit
def _program_setup(
    Q,
    K,
    V,
    OUT,
    POS,
    KPM,
    COS,
    SIN,
    KCOS,
    KSIN,
    BIAS,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_pos_b,
    stride_tab_b,
    stride_bias_b,
    stride_bias_h,
    num_heads,
    seq_len,
    REVERSED: tl.constexpr,
):
    """Program ids -> ``(block, batch*heads index, Q, K, V, OUT, POS, KPM, COS, SIN, KCOS, KSIN,
    BIAS)``.

    ``block`` is ``program_id(0)``, counted from the last block if ``REVERSED`` (causal row
    programs: the last blocks have the most work, so they start first); ``program_id(1)`` is
    ``batch * num_heads + head``. Each pointer is moved to this (batch, head): q, k, v and ``OUT``
    (the output in a forward, ``dO`` in a backward) by their batch and head strides, positions
    and tables by their batch stride (0 when shared by the batch), the key mask by
    ``batch * seq_len``, the score-bias parameters by their batch and head strides. (A family
    with other per-(batch, head) tensors passes them in the slots it does not use: CoPE's ``z``
    table as ``BIAS``.)
    """
    if REVERSED:
        blk = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // num_heads
    h = bh % num_heads
    Q += b * stride_qb + h * stride_qh
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    OUT += b * stride_ob + h * stride_oh
    POS += b * stride_pos_b
    KPM += b * seq_len
    COS += b * stride_tab_b
    SIN += b * stride_tab_b
    KCOS += b * stride_tab_b
    KSIN += b * stride_tab_b
    BIAS += b * stride_bias_b + h * stride_bias_h
    return blk, bh, Q, K, V, OUT, POS, KPM, COS, SIN, KCOS, KSIN, BIAS


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use exact IEEE products (tf32 would miss a 1e-4 tolerance)."""
    return "ieee" if dtype == torch.float32 else "tf32"


@dataclass(frozen=True)
class Launch:
    """One kernel launch exactly as a wrapper issues it: ``kernel[grid](*args, **kwargs)``.

    ``kwargs`` holds the constexpr arguments and the launch options (``num_warps``,
    ``num_stages``); ``name`` says which pass it is (``"forward"``, ``"dkdv"``, ...).
    """

    name: str
    kernel: object
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict = field(default_factory=dict)


class _Plan:
    """The launches recorded inside :func:`planned_launches`, for a GPU of ``arch``."""

    def __init__(self, arch: int):
        self.arch = arch
        self.launches: list[Launch] = []


_PLAN: list[_Plan] = []


@contextmanager
def planned_launches(arch: int) -> Iterator[list[Launch]]:
    """Within this block the wrappers record their launches instead of running them.

    The wrappers run all their own code (checks, configuration for a GPU of compute capability
    ``arch``, e.g. 90 for an H100 or 80 for an A100, output allocation, argument lists) and hand
    each launch to :func:`run_launch`, which appends it to the yielded list. With tensors on the
    ``meta`` device nothing is allocated: this is how the launches are compiled ahead of time on
    a machine without a GPU, from the wrappers' own code.
    """
    plan = _Plan(int(arch))
    _PLAN.append(plan)
    try:
        yield plan.launches
    finally:
        _PLAN.remove(plan)


def gpu_arch(device: torch.device) -> int | None:
    """The compute capability the wrappers configure for: ``major * 10 + minor`` of the CUDA
    device (the planned one inside :func:`planned_launches`), or None in the interpreter."""
    if _PLAN:
        return _PLAN[-1].arch
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


# Shared memory one CTA may opt in to, bytes, by compute capability (CUDA's per-block opt-in
# limits); an unknown GPU is assumed to have the smallest of the current ones.
SMEM_PER_BLOCK = {70: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024,
                  89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}  # fmt: skip


def smem_per_block(device: torch.device) -> int:
    """The shared memory one CTA may use on ``device`` (the planned GPU inside
    :func:`planned_launches`), in bytes; 0 in the interpreter (no limit applies there)."""
    arch = gpu_arch(device)
    if arch is None:
        return 0
    if not _PLAN:
        optin = getattr(
            torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0
        )
        if optin:
            return int(optin)
    return SMEM_PER_BLOCK.get(arch, min(SMEM_PER_BLOCK.values()))


def run_launch(launch: Launch) -> None:
    """Launch it, or record it inside :func:`planned_launches`."""
    if _PLAN:
        _PLAN[-1].launches.append(launch)
        return
    launch.kernel[launch.grid](*launch.args, **launch.kwargs)


@dataclass(frozen=True)
class LaunchArgs:
    """The tensors and switches of one launch, absent inputs replaced by never-read dummies."""

    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    key_cos: torch.Tensor  # the keys' tables (the same tensors when keys share q's)
    key_sin: torch.Tensor
    gain: torch.Tensor
    bias_params: torch.Tensor
    stride_pos_b: int
    stride_tab_b: int
    stride_bias_b: int
    stride_bias_h: int
    has_mask: bool
    has_tables: bool
    has_gain: bool
    half_layout: bool
    hook: BiasHook | None
    bias_options: tuple | None = None  # the hook's BIAS_OPTIONS constexpr
    bias_shape: tuple[int, ...] = ()  # the shape of the hook's tensor (its gradient's)

    def strides(self) -> tuple[int, int, int, int]:
        """``(stride_pos_b, stride_tab_b, stride_bias_b, stride_bias_h)``."""
        return self.stride_pos_b, self.stride_tab_b, self.stride_bias_b, self.stride_bias_h


def _fail(message: str, error: type = ValueError):
    raise error(message)


# The oldest GPUs with bf16 tensor-core products (Ampere, sm_80): below it (a T4 is sm_75) a
# bf16 dot would run on the CUDA cores, several times slower, so the kernels refuse it.
BF16_MIN_ARCH = 80


def check_dtype_on_gpu(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse bf16 on a GPU without bf16 tensor cores, naming the GPU and what to use instead
    (nothing is checked in the interpreter)."""
    arch = gpu_arch(device)
    if dtype != torch.bfloat16 or arch is None or arch >= BF16_MIN_ARCH:
        return
    if _PLAN:
        name = f"the planned sm_{arch} target"
    else:
        name = f"this GPU ({torch.cuda.get_device_name(device)}, sm_{arch})"
    _fail(
        f"bf16 needs bf16 tensor cores (compute capability 8.0 or newer); {name} has none. "
        "Use float16 instead (e.g. torch.autocast('cuda', dtype=torch.float16)) or float32",
        TypeError,
    )


def check_launch_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    qk_tables,
    bias_hook: BiasHook | None,
    bias_params: torch.Tensor | None,
    bias_options: dict | None = None,
) -> None:
    """Raise a ValueError/TypeError saying what is wrong with a launch's inputs."""
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        _fail(
            "q, k, v must all be [batch, heads, seq, head_dim] with the same shape, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in KERNEL_DTYPES:
        _fail(
            f"q, k, v must share one dtype of {[str(d) for d in KERNEL_DTYPES]}, "
            f"got {q.dtype}, {k.dtype}, {v.dtype}",
            TypeError,
        )
    check_dtype_on_gpu(q.dtype, q.device)
    batch, heads, seq, head_dim = q.shape
    if head_dim not in KERNEL_HEAD_DIMS:
        _fail(f"head_dim must be one of {list(KERNEL_HEAD_DIMS)}, got {head_dim}")
    if seq < 1:
        _fail(f"seq must be >= 1, got {seq}")
    if batch * heads > MAX_BATCH_HEADS:
        _fail(f"batch * heads must be <= {MAX_BATCH_HEADS}, got {batch * heads}")
    if (
        positions.dtype != torch.float32
        or positions.dim() != 2
        or positions.shape[0] not in (1, batch)
        or positions.shape[1] != seq
    ):
        _fail(
            f"positions must be float32 [1 or {batch}, {seq}] for the kernel (each sequence's "
            f"positions minus its smallest), got {positions.dtype} {tuple(positions.shape)}"
        )
    if key_mask is not None and tuple(key_mask.shape) != (batch, seq):
        _fail(f"key_mask must be [{batch}, {seq}], got {tuple(key_mask.shape)}")
    if qk_tables is not None:
        _check_tables(qk_tables, batch, seq, head_dim, q.device)
    if bias_hook is None:
        if bias_params is not None:
            _fail("bias parameters were given without a score-bias hook")
        return
    hook = _as_hook(bias_hook)
    hook.kernel_options(bias_options)  # its compile-time options: all given, valid
    hook.check_tensor(
        bias_params, batch=batch, heads=heads, seq=seq, device=q.device, options=bias_options
    )


def _as_hook(hook) -> BiasHook:
    """The hook object itself; anything else is refused (there are no hook names here)."""
    if not (hasattr(hook, "bias") and hasattr(hook, "check_tensor")):
        _fail(
            f"bias_hook must be a score-bias hook object (kernels/score_bias.py: BiasHook), got "
            f"{hook!r}",
            TypeError,
        )
    return hook


def _check_tables(tables, batch: int, seq: int, head_dim: int, device: torch.device) -> None:
    layout = getattr(tables, "layout", None)
    if layout not in PAIR_LAYOUTS:
        _fail(f"qk_tables.layout must be one of {list(PAIR_LAYOUTS)}, got {layout!r}")
    want = f"float32 [1 or {batch}, {seq}, {head_dim // 2}]"
    for name in ("cos", "sin"):
        table = getattr(tables, name)
        if not isinstance(table, torch.Tensor):
            _fail(f"qk_tables.{name} must be a tensor {want}", TypeError)
        if table.dtype != torch.float32:
            _fail(f"qk_tables.{name} must be {want}, got dtype {table.dtype}", TypeError)
        if (
            table.dim() != 3
            or table.shape[0] not in (1, batch)
            or tuple(table.shape[1:]) != (seq, head_dim // 2)
        ):
            _fail(f"qk_tables.{name} must be {want}, got shape {tuple(table.shape)}")
        if table.device != device:
            _fail(f"qk_tables.{name} must be on {device}, got {table.device}")
    if tables.cos.shape != tables.sin.shape:
        _fail(
            "qk_tables.cos and qk_tables.sin must have the same shape, got "
            f"{tuple(tables.cos.shape)} and {tuple(tables.sin.shape)}"
        )
    key_cos, key_sin = getattr(tables, "key_cos", None), getattr(tables, "key_sin", None)
    if (key_cos is None) != (key_sin is None):
        _fail("qk_tables.key_cos and qk_tables.key_sin must be given together (or neither)")
    for name, table in (("key_cos", key_cos), ("key_sin", key_sin)):
        if table is None:
            continue
        if not isinstance(table, torch.Tensor) or table.dtype != torch.float32:
            _fail(f"qk_tables.{name} must be a float32 tensor like qk_tables.cos", TypeError)
        if table.shape != tables.cos.shape:
            _fail(
                f"qk_tables.{name} must have the shape of qk_tables.cos, "
                f"{tuple(tables.cos.shape)}, got {tuple(table.shape)}"
            )
        if table.device != device:
            _fail(f"qk_tables.{name} must be on {device}, got {table.device}")
    gain = tables.gain
    if gain is not None:
        if not isinstance(gain, torch.Tensor) or gain.dtype != torch.float32:
            _fail(f"qk_tables.gain must be a float32 tensor [{head_dim}] or None", TypeError)
        if tuple(gain.shape) != (head_dim,):
            _fail(f"qk_tables.gain must have shape [{head_dim}], got {tuple(gain.shape)}")
        if gain.device != device:
            _fail(f"qk_tables.gain must be on {device}, got {gain.device}")


def _batch_stride(x: torch.Tensor) -> int:
    return 0 if x.shape[0] == 1 else x.stride(0)


def _dense_rows(table: torch.Tensor) -> torch.Tensor:
    """``[B, seq, W]`` with contiguous seq and pair dimensions (any batch stride); O(seq) copy
    only if they are not."""
    seq, width = table.shape[1:]
    if table.stride(2) == 1 and (table.stride(1) == width or seq == 1):
        return table
    return table.contiguous()


def prepare_launch(
    q: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    qk_tables,
    bias_hook: BiasHook | None,
    bias_params: torch.Tensor | None,
    bias_options: dict | None = None,
) -> LaunchArgs:
    """The arguments a launch passes besides q, k, v (checked by :func:`check_launch_inputs`)."""
    dummy = torch.zeros(1, dtype=torch.float32, device=q.device)
    if key_mask is None:
        mask = torch.ones(1, dtype=torch.int8, device=q.device)
    else:
        mask = key_mask.to(torch.int8).contiguous()
    if qk_tables is None:
        cos = sin = key_cos = key_sin = gain = dummy
        stride_tab_b = 0
    else:
        tables = [qk_tables.cos, qk_tables.sin]
        if getattr(qk_tables, "key_cos", None) is not None:
            tables += [qk_tables.key_cos, qk_tables.key_sin]
        tables = [_dense_rows(t) for t in tables]
        if len({t.stride() for t in tables}) > 1:  # one set of strides for every table
            tables = [t.contiguous() for t in tables]
        cos, sin = tables[:2]
        key_cos, key_sin = tables[2:] if len(tables) == 4 else (cos, sin)
        stride_tab_b = _batch_stride(cos)
        gain = dummy if qk_tables.gain is None else qk_tables.gain.contiguous()
    hook = None if bias_hook is None else _as_hook(bias_hook)
    params, stride_bias_b, stride_bias_h = dummy, 0, 0
    bias_shape = () if bias_params is None else tuple(bias_params.shape)
    if bias_params is not None:
        params = bias_params.detach().to(torch.float32).contiguous()
        stride_bias_b, stride_bias_h = hook.strides(params)  # per_head: 0 for the batch
        params = hook.pointer(params)  # per_diagonal: a view that starts at diagonal 0
    return LaunchArgs(
        mask=mask,
        cos=cos,
        sin=sin,
        key_cos=key_cos,
        key_sin=key_sin,
        gain=gain,
        bias_params=params,
        stride_pos_b=_batch_stride(positions),
        stride_tab_b=stride_tab_b,
        stride_bias_b=stride_bias_b,
        stride_bias_h=stride_bias_h,
        has_mask=key_mask is not None,
        has_tables=qk_tables is not None,
        has_gain=qk_tables is not None and qk_tables.gain is not None,
        # Without tables any split of the channels gives the same q . k; the half split reads
        # contiguous memory.
        half_layout=qk_tables is None or qk_tables.layout == "half",
        hook=hook,
        bias_options=None if hook is None else hook.kernel_options(bias_options),
        bias_shape=bias_shape,
    )


@triton.jit
def position_line(POS, seq_len, POS_AFFINE: tl.constexpr):
    """``(p_0, step)`` of this sequence's positions when they are ``p_0 + step * index``
    (``POS_AFFINE``), else zeros (unused). Read once per program, before the loops: a loop that
    stores (the backward kernels' checkpoints) keeps the compiler from hoisting loads out of
    it, so a load per tile stays one."""
    pos0 = 0.0
    pos_step = 0.0
    if POS_AFFINE:
        pos0 = tl.load(POS)
        pos_step = tl.load(POS + 1, mask=seq_len > 1, other=0.0) - pos0
    return pos0, pos_step


def planning() -> bool:
    """Whether the wrappers are inside :func:`planned_launches` (recording, not running)."""
    return bool(_PLAN)
