"""Autograd wrappers around the fused kernel families: flash attention and stick-breaking.

``flash_attention(q, k, v, ...)`` (``kernels/flash.py``) computes, for q, k, v ``[batch, heads,
seq, head_dim]``::

    out_i = sum_j softmax_j(scale * q'_i . k'_j + b_ij  over allowed j) v_j

where key ``j`` is allowed for query ``i`` iff it is a real token (``key_padding_mask``) and,
when causal, ``j <= i`` (by index). The kernels know no encoding: ``q'``, ``k'`` come from the
caller's per-token tables (:class:`course_lib.kernel_hooks.QKTables`; ``q' = q`` without; keys
may have tables of their own) and ``b`` from a score-bias hook object
(:class:`course_lib.kernel_hooks.ScoreBias`; 0 without). A query with no allowed key outputs 0.
Gradients flow to q, k, v and the score bias's tensor (``per_head``, ``per_token`` or
``per_diagonal``, whichever its hook reads).

Both families share everything here: the checks and conversions (:func:`prepare_kernel_call`,
done once per call), and one autograd function that launches a family's forward and backward
(:func:`fused_attention`); :mod:`course_lib.stick_ops` adds the stick-breaking entry point.
``attention(backend="triton")`` calls them with inputs it has already checked.

In Triton's CPU interpreter, ``tl.dot`` on bf16 tiles is wrong (numpy has no bf16): there, bf16
inputs run the float32 kernels and the result is rounded to bf16 (a GPU runs the bf16 kernels;
the interpreter's answer is the more precise one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course_lib.checks import (
    check_kernel_qkv,
    check_key_padding_mask,
    check_position_ids,
    default_position_ids,
)
from course_lib.kernel_hooks import (
    QKTables,
    ScoreBias,
    kernel_positions,
    position_steps,
    positions_ordered,
    resolve_hook,
)
from course_lib.kernels.limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS
from course_lib.runtime import (
    check_kernel_tensors,
    first_derivative_only,
    kernel_compute_dtype,
    load_kernel_module,
)

__all__ = [
    "FLASH",
    "STICK_BREAKING",
    "KernelCall",
    "KernelFamily",
    "flash_attention",
    "fused_attention",
    "prepare_kernel_call",
]


@dataclass(frozen=True)
class KernelCall:
    """What a wrapper hands its kernels after the checks.

    ``positions``: float32 ``[1 or batch, seq]``, each row minus its smallest position
    (:func:`course_lib.kernel_hooks.kernel_positions`); ``mask``: int8 ``[batch, seq]`` or None;
    ``hook``: the score-bias hook object or None; ``bias_tensor``: the tensor it reads (as given)
    or None; ``bias_options``: its compile-time options; ``positions_ordered``: the positions
    never decrease along a sequence (checked only for a hook whose split form needs it);
    ``positions_affine``: each sequence's positions are ``p_0 + step * index`` (default
    positions are), so the kernels compute them instead of loading them; ``far_reach``: the
    score bias's (``ScoreBias.far_reach``).
    """

    scale: float
    positions: torch.Tensor
    mask: torch.Tensor | None
    qk_tables: QKTables | None
    hook: object | None
    bias_tensor: torch.Tensor | None
    bias_options: dict | None = None
    positions_ordered: bool = False
    positions_affine: bool = False
    far_reach: int | None = None

    def launch_options(self, causal: bool, bias_tensor: torch.Tensor | None) -> dict:
        """The keyword arguments of a family's forward and backward launchers."""
        return dict(
            causal=causal,
            scale=self.scale,
            qk_tables=self.qk_tables,
            bias_hook=self.hook,
            bias_params=None if bias_tensor is None else bias_tensor.detach(),
            bias_options=self.bias_options,
        )


def prepare_kernel_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kernel: str,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    scale: float | None,
    qk_tables: QKTables | None,
    score_bias: ScoreBias | None,
    checked: bool = False,
) -> KernelCall:
    """Check a wrapper's arguments and put them in the form the kernels read.

    q, k, v may be any strided views (no copy is made). Positions reach the kernels only through
    a score bias: with one, they default to ``arange(seq)`` and are converted once
    (:func:`course_lib.kernel_hooks.kernel_positions`); without, they are not read (the caller's
    tables carry them). ``checked``: the caller (``attention()``) has already checked and
    defaulted the position ids (``[1 or batch, seq]``) and the key-padding mask; only what the
    kernels need is checked.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    check_kernel_qkv(q, k, v, kernel=kernel, head_dims=KERNEL_HEAD_DIMS, dtypes=KERNEL_DTYPES)
    batch, heads, seq, head_dim = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a number, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}")
    if position_ids is not None and not checked:
        position_ids = check_position_ids(position_ids, batch, seq, q.device)
    given_positions = position_ids is not None
    if score_bias is None:  # positions reach the kernels only through a score bias
        positions = torch.zeros(1, seq, dtype=torch.float32, device=q.device)
    else:
        if position_ids is None:
            position_ids = default_position_ids(seq, q.device)[None]
        positions = kernel_positions(position_ids)
    mask = None
    if key_padding_mask is not None:
        if not checked:
            check_key_padding_mask(key_padding_mask, batch, seq, q.device)
        mask = key_padding_mask.to(torch.int8).contiguous()
    tensors = [q, k, v, positions, mask]
    if qk_tables is not None:
        if not isinstance(qk_tables, QKTables):
            raise TypeError(
                f"qk_tables must be a course_lib.kernel_hooks.QKTables, got {type(qk_tables)}"
            )
        tensors += [qk_tables.cos, qk_tables.sin, qk_tables.gain]
        tensors += [qk_tables.key_cos, qk_tables.key_sin]
    hook = tensor = options = far_reach = None
    if score_bias is not None:
        if not isinstance(score_bias, ScoreBias):
            raise TypeError(
                f"score_bias must be a course_lib.kernel_hooks.ScoreBias, got {type(score_bias)}"
            )
        hook = resolve_hook(score_bias.hook)
        tensor, options = _bias_tensor(score_bias, hook, kernel), dict(score_bias.options)
        far_reach = score_bias.far_reach
        tensors.append(tensor)
    check_kernel_tensors(*tensors)
    ordered = affine = False  # default positions are both; given ones are looked at once each
    if hook is not None:
        affine = not given_positions or position_steps(positions) is not None
        if getattr(hook, "split_ordered", False) and causal:
            ordered = not given_positions or positions_ordered(positions)
    return KernelCall(
        scale, positions, mask, qk_tables, hook, tensor, options, ordered, affine, far_reach
    )


def _bias_tensor(score_bias: ScoreBias, hook, kernel: str) -> torch.Tensor | None:
    """The one tensor the hook reads (``per_head``, ``per_token`` or ``per_diagonal``); the
    others must be None. Also refuses a hook the kernel family does not take."""
    if not (hasattr(hook, "bias") and hasattr(hook, "families")):
        raise TypeError(
            f"score_bias.hook must be a score-bias hook object (course_lib.kernels.score_bias."
            f"BiasHook) or the name of a registered one, got {type(hook).__name__}"
        )
    family = "stick_breaking" if kernel == "stick-breaking" else kernel
    if family not in hook.families:
        raise ValueError(
            f"the score bias {hook.name!r} ({hook.formula}) runs in the "
            f"{' and '.join(hook.families)} kernels only, not in the {kernel} kernel"
            + (
                ": its per-token gradient relies on softmax rows summing to 1"
                if hook.param == "per_token"
                else ": that kernel takes no compile-time bias options"
                if hook.options
                else ""
            )
            + ". Use backend='reference' for this combination (it computes any bias with "
            "either normaliser)"
        )
    for name in ("per_head", "per_token", "per_diagonal"):
        value = getattr(score_bias, name)
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"score_bias.{name} must be a tensor, got {type(value)}")
        if value is not None and hook.param is None:
            raise ValueError(
                f"the score bias {hook.name!r} ({hook.formula}) takes no {name} tensor"
            )
        if value is not None and name != hook.param:
            raise ValueError(
                f"the score bias {hook.name!r} ({hook.formula}) reads {hook.param}, not {name}"
            )
    return None if hook.param is None else getattr(score_bias, hook.param)


@dataclass(frozen=True)
class KernelFamily:
    """A kernel family as the shared autograd function drives it: its kernel module, the names of
    its forward and backward launchers, and whether its backward takes the forward's output (the
    flash backward takes ``out`` and its log-sum-exp; stick-breaking only its row statistics)."""

    name: str
    module: str
    forward: str
    backward: str
    backward_takes_output: bool


FLASH = KernelFamily("flash", "flash", "flash_attention_forward", "flash_attention_backward", True)
STICK_BREAKING = KernelFamily(
    "stick-breaking", "stick_breaking", "stick_breaking_forward", "stick_breaking_backward", False
)


def _tunes(device: torch.device) -> bool:
    """Whether a call on ``device`` chooses its tiles by timing (``kernels/tuning.py``); off a
    CUDA device the tuning module is not even looked up."""
    return device.type == "cuda" and load_kernel_module("tuning").active(device)


def _tuned_tiles(
    family: KernelFamily,
    kernels,
    pass_: str,
    q: torch.Tensor,
    call: KernelCall,
    causal: bool,
    run,
    *,
    bias_grad: bool = False,
    out_dtype: torch.dtype | None = None,
) -> dict:
    """The tiles of one pass, as launcher arguments: none (the family's static pick) except on
    a CUDA GPU, where the first call of each key times the family's candidates on this call's
    inputs with ``run(tiles)`` and later calls reuse the fastest (``kernels/tuning.py``)."""
    if not _tunes(q.device):
        return {}
    tuning = load_kernel_module("tuning")
    _, _, seq, head_dim = q.shape
    hook = call.hook
    per_tile = bias_grad and hook is not None and bool(hook.grad_per_tile)
    key = (
        family.name, pass_, str(q.device), head_dim, str(q.dtype).removeprefix("torch."),
        causal, None if hook is None else hook.name, repr(sorted((call.bias_options or {}).items())),
        bias_grad, call.mask is not None, call.positions_affine, call.positions_ordered,
        call.far_reach is not None, None if out_dtype is None else str(out_dtype),
        tuning.length_bucket(seq),
    )  # fmt: skip
    candidates = kernels.tuning_candidates(
        pass_, head_dim, q.dtype, q.device, causal=causal, biased=hook is not None,
        per_tile=per_tile,
    )  # fmt: skip
    return tuning.choose(key, candidates, run)


class _FusedAttentionFunction(torch.autograd.Function):
    """Forward saves q, k, v and what the family's backward needs (flash: the output and its
    per-row log-sum-exp; stick-breaking: each stick's total); backward recomputes the tiles.

    With q/k tables, q and k go through them once (``kernels/qk_transform.py``), the family's
    loops run on ``q'``, ``k'`` as plain attention does, and ``q'``, ``k'`` are what is saved
    (in place of q and k: no more memory); the backward maps the gradients back once."""

    @staticmethod
    def forward(ctx, q, k, v, bias_tensor, call: KernelCall, causal: bool, family: KernelFamily):
        kernels = load_kernel_module(family.module)
        options = call.launch_options(causal, bias_tensor)
        options["positions_affine"] = call.positions_affine  # computed in the loops, not read
        if family.module == "flash":  # how the flash loops may read the positions
            options["positions_ordered"] = call.positions_ordered
            options["bias_far_reach"] = call.far_reach
        launch = getattr(kernels, family.forward)
        if call.qk_tables is not None:
            q, k = load_kernel_module("qk_transform").encode_qk(q, k, call.qk_tables)
        # A learnable bias in 16 bits: the flash backward's delta is taken from the float32
        # output (see flash_attention_backward), and the caller gets it rounded to q's dtype.
        keep_fp32 = (
            family.backward_takes_output
            and ctx.needs_input_grad[3]
            and q.dtype in (torch.float16, torch.bfloat16)
        )
        extra = {"out_dtype": torch.float32} if keep_fp32 else {}
        loop_options = dict(options, qk_tables=None)  # q and k are q', k' now
        args = (q, k, v, call.positions, call.mask)
        tiles = _tuned_tiles(
            family, kernels, "forward", q, call, options["causal"],
            lambda t: launch(*args, **loop_options, **extra, **t), out_dtype=extra.get("out_dtype"),
        )  # fmt: skip
        out, state = launch(*args, **loop_options, **extra, **tiles)
        ctx.save_for_backward(
            q, k, v, *((out, state) if family.backward_takes_output else (state,))
        )
        ctx.call, ctx.options, ctx.family = call, options, family
        return out.to(q.dtype) if keep_fp32 else out

    @staticmethod
    @first_derivative_only
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, *saved = ctx.saved_tensors
        call = ctx.call
        kernels = load_kernel_module(ctx.family.module)
        want_bias_grad = ctx.needs_input_grad[3]
        launch = getattr(kernels, ctx.family.backward)
        args = (grad_out, q, k, v, *saved, call.positions, call.mask)
        options = dict(ctx.options, bias_grad=want_bias_grad, encoded=True)
        tiles = _tuned_tiles(
            ctx.family, kernels, "backward", q, call, options["causal"],
            lambda t: launch(*args, **options, **t), bias_grad=want_bias_grad,
        )  # fmt: skip
        dq, dk, dv, dparams = launch(*args, **options, **tiles)
        d_bias = dparams.to(call.bias_tensor.dtype) if want_bias_grad else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_bias, None, None, None


def fused_attention(
    family: KernelFamily, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: KernelCall,
    causal: bool,
) -> torch.Tensor:  # fmt: skip
    """Run ``family``'s kernels on a prepared call (:func:`prepare_kernel_call`), with autograd.

    In Triton's interpreter bf16 inputs run the float32 kernels (see the module docstring): the
    casts are ordinary torch operations, so gradients come back in bf16.
    """
    dtype = kernel_compute_dtype(q.dtype)
    if dtype != q.dtype:
        out = _FusedAttentionFunction.apply(
            q.to(dtype), k.to(dtype), v.to(dtype), call.bias_tensor, call, causal, family
        )
        return out.to(q.dtype)
    return _FusedAttentionFunction.apply(q, k, v, call.bias_tensor, call, causal, family)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    scale: float | None = None,
    qk_tables: QKTables | None = None,
    score_bias: ScoreBias | None = None,
) -> torch.Tensor:
    """Fused flash attention; differentiable in q, k, v and the score bias's tensor.

    Args:
        q, k, v: ``[batch, heads, seq, head_dim]``, one dtype of fp32/fp16/bf16 (bf16 computed
            in float32 in the interpreter), head_dim in {16, 32, 64, 128}, the same seq for
            queries and keys; any strides (e.g. ``x.view(b, n, h, d).transpose(1, 2)``), read in
            place.
        causal: key j is visible to query i only if ``j <= i`` (by index).
        key_padding_mask: bool ``[batch, seq]``, True for real tokens, or None.
        position_ids: integer ``[seq]`` or ``[batch, seq]``; default ``arange(seq)``. Read by
            the score bias (the tables are built by the caller from the same positions).
        scale: logit scale, default ``1/sqrt(head_dim)``.
        qk_tables: per-token q/k tables (``cos``, ``sin`` float32 ``[1 or batch, seq,
            head_dim/2]``, optional ``gain`` ``[head_dim]``, pair ``layout``, optional key
            tables ``key_cos``, ``key_sin``), or None.
        score_bias: a bias hook object with the tensor it reads (``per_head`` ``[heads]`` or
            ``[heads, width]``, ``per_token`` ``[batch, heads, seq]`` or ``per_diagonal``
            ``[1 or batch, heads, 2 seq - 1]``) and its ``options``, or None.

    Returns:
        ``[batch, heads, seq, head_dim]`` in the input dtype; rows with no allowed key are 0.
    """
    call = prepare_kernel_call(
        q, k, v, kernel="flash", causal=causal, key_padding_mask=key_padding_mask,
        position_ids=position_ids, scale=scale, qk_tables=qk_tables, score_bias=score_bias,
    )  # fmt: skip
    return fused_attention(FLASH, q, k, v, call, causal)
