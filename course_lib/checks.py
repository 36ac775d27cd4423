"""Input checks shared by the references, the modules and the kernel wrappers.

Every check raises a ``ValueError`` or ``TypeError`` that says what was wrong and what is allowed.

A check of values (finite, ``>= 0``) reads them back from the device, and a read waits for the
GPU. Inside an ``attention()`` call the checks that only refuse are queued
(:func:`refuse_if`) and read together once the call's checks are done
(:mod:`course_lib.call_scope`): one wait per call, whatever the method checks.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping

import torch

from course_lib.call_scope import defer, read, recall, remember
from course_lib.kernels.limits import KERNEL_DTYPES, KERNEL_HEAD_DIMS

__all__ = [
    "check_choice",
    "check_int",
    "is_integer",
    "check_real",
    "check_scale",
    "check_even_dim",
    "check_floating_input",
    "check_integer_tensor",
    "check_tensor_params",
    "has_values",
    "any_true",
    "refuse_if",
    "check_qkv",
    "check_position_ids",
    "check_key_padding_mask",
    "default_position_ids",
    "check_distance_penalty",
    "check_float_tensor",
    "check_kernel_qkv",
    "KERNEL_HEAD_DIMS",
    "KERNEL_DTYPES",
]


def check_choice(what: str, value: object, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``allowed``; else raise a ValueError listing them."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(map(repr, allowed))}")
    return value  # type: ignore[return-value]


def is_integer(value: object) -> bool:
    """An integer of any kind (Python's, numpy's), never a bool: what the course's integer
    arguments take (:func:`check_int` checks and converts one)."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def check_int(what: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an ``int``: any integer (a numpy one too), never a bool; ``>= minimum``."""
    if not is_integer(value):
        raise TypeError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value}")
    return value


def check_real(
    what: str,
    value: object,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` as a finite ``float``: an int or a float (numpy's too), never a bool or a
    string; ``> above``, ``>= at_least``, ``<= at_most`` where given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {value!r} ({type(value).__name__})")
    number = float(value)
    bounds = []
    if above is not None:
        bounds.append(f"> {above:g}")
    if at_least is not None:
        bounds.append(f">= {at_least:g}")
    if at_most is not None:
        bounds.append(f"<= {at_most:g}")
    allowed = "a finite number" + (f" {' and '.join(bounds)}" if bounds else "")
    if (
        not math.isfinite(number)
        or (above is not None and not number > above)
        or (at_least is not None and not number >= at_least)
        or (at_most is not None and not number <= at_most)
    ):
        raise ValueError(f"{what} must be {allowed}, got {value!r}")
    return number


def check_scale(scale: object) -> float | None:
    """The score scale of attention: None (``1/sqrt(head_dim)``) or a finite number > 0."""
    if scale is None:
        return None
    return check_real("scale (the factor on q . k)", scale, above=0.0)


def check_even_dim(dim: int, what: str) -> int:
    """``dim`` must be a positive even integer (a numpy integer too): channels come in pairs."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim <= 0 or dim % 2:
        raise ValueError(
            f"{what} must be a positive even integer (channels come in pairs), got {dim!r}"
        )
    return int(dim)


def check_floating_input(x: object, what: str, hint: str = "") -> torch.Tensor:
    """``x`` a real floating-point tensor (not an integer, bool or complex one)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{what} must be a real floating-point tensor (float16/bfloat16/float32/float64), "
            f"got {x.dtype}{hint}"
        )
    return x


def check_integer_tensor(x: object, what: str) -> torch.Tensor:
    """``x`` an integer tensor (not a bool, floating-point or complex one)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
        raise TypeError(f"{what} must be an integer tensor, got {x.dtype}")
    return x


def has_values(t: torch.Tensor) -> bool:
    """False for a tensor that holds no memory (``meta``): its shape can be checked, its values
    cannot (and need not be: nothing is computed from them)."""
    return t.device.type != "meta"


def any_true(condition: torch.Tensor) -> bool:
    """``bool(condition.any())``, False for a ``meta`` tensor (there are no values to test); read
    together with the call's queued checks (:func:`course_lib.call_scope.read`)."""
    return has_values(condition) and bool(read(condition.any())[0])


def refuse_if(condition: torch.Tensor, error: Callable[[], Exception]) -> None:
    """Raise ``error()`` if any entry of ``condition`` is true. In an ``attention()`` call the
    test is queued and read with the call's other checks before anything is computed
    (:func:`course_lib.call_scope.defer`); outside one it is read now. Nothing is tested for a
    ``meta`` tensor."""
    if not has_values(condition):
        return

    def judge(values: list[float]) -> None:
        if values[0]:
            raise error()

    defer([condition.any()], judge)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q ``[batch, heads, seq_q, head_dim]``, k and v ``[batch, heads, seq_k, head_dim]``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be [batch, heads, seq, head_dim] (4-D), got shape {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    b, h, _, d = q.shape
    if d < 1:
        raise ValueError(
            f"head_dim is 0 (q is {tuple(q.shape)}): every head needs at least one channel"
        )
    if (k.shape[0], k.shape[1], k.shape[3]) != (b, h, d):
        raise ValueError(
            "q and k must agree in batch, heads and head_dim: "
            f"q is {tuple(q.shape)}, k is {tuple(k.shape)}"
        )
    if q.shape[2] > k.shape[2]:
        raise ValueError(
            f"q has more positions ({q.shape[2]}) than k ({k.shape[2]}); queries are the last "
            "seq_q positions of the key sequence, so seq_q <= seq_k is required"
        )


def default_position_ids(seq: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``arange(seq)`` as int64: the positions 0..seq-1 (their facts known to the kernels:
    :func:`course_lib.position_facts.arange_positions`)."""
    from course_lib.position_facts import arange_positions

    return arange_positions(0, seq, device)


def check_position_ids(
    position_ids: torch.Tensor, batch: int, seq: int, device: torch.device, dims: int = 1
) -> torch.Tensor:
    """Integer positions on ``device``, one per token, returned as int64 with a leading batch
    axis (a narrower integer dtype is widened: differences of uint8 or int16 positions would
    wrap around).

    ``dims=1``: ``[seq]`` or ``[batch, seq]`` -> ``[1 or batch, seq]``.
    ``dims=2`` (e.g. the (row, column) of image patches): ``[seq, 2]`` or ``[batch, seq, 2]`` ->
    ``[1 or batch, seq, 2]``.
    """
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be a torch.Tensor, got {type(position_ids).__name__}")
    if (
        position_ids.dtype == torch.bool
        or position_ids.is_floating_point()
        or position_ids.is_complex()
    ):
        raise TypeError(f"position_ids must be an integer tensor, got {position_ids.dtype}")
    if position_ids.device != device:
        raise ValueError(
            f"position_ids are on {position_ids.device} but the inputs are on {device}"
        )
    per_token = () if dims == 1 else (dims,)
    shape = tuple(position_ids.shape)
    position_ids = position_ids.long()  # the same tensor when it is int64 already
    if shape == (seq, *per_token):
        return position_ids.unsqueeze(0)
    if (
        len(shape) == 2 + len(per_token)
        and shape[1:] == (seq, *per_token)
        and shape[0] in (1, batch)
    ):
        return position_ids
    if dims == 1:
        want = f"[{seq}] or [{batch}, {seq}] (one position per key)"
    else:
        want = f"[{seq}, {dims}] or [{batch}, {seq}, {dims}] ({dims} coordinates per token)"
    raise ValueError(f"position_ids must have shape {want}, got {shape}")


def check_key_padding_mask(
    mask: torch.Tensor, batch: int, seq: int, device: torch.device
) -> torch.Tensor:
    """Bool ``[batch, seq]``, True for real tokens, on ``device``."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"key_padding_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be a bool tensor (True = real token), got {mask.dtype}"
        )
    if tuple(mask.shape) != (batch, seq):
        raise ValueError(
            f"key_padding_mask must have shape [batch, seq] = [{batch}, {seq}], "
            f"got {tuple(mask.shape)}"
        )
    if mask.device != device:
        raise ValueError(f"key_padding_mask is on {mask.device} but the inputs are on {device}")
    return mask


def check_float_tensor(
    value: object,
    name: str,
    layout: str,
    device: torch.device,
    shape: tuple[int, ...] | None = None,
) -> None:
    """``value``: a floating-point tensor on ``device`` with finite entries, of ``shape`` if given.

    ``layout`` names the shape in messages, e.g. ``"[heads]"``. An encoding's ``check_params``
    uses it for its own tensors (slopes, tables, gates); every tensor parameter of every method is
    also checked for finiteness by :func:`check_tensor_params`, whether or not its encoding calls
    this. A ``meta`` tensor's values are not checked (it has none).
    """
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor {layout}, got "
            f"{getattr(value, 'dtype', type(value).__name__)}"
        )
    if shape is not None and tuple(value.shape) != tuple(shape):
        want = "[" + ", ".join(map(str, shape)) + "]"
        raise ValueError(f"{name} must have shape {layout} = {want}, got {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but q is on {device}")
    _check_finite(value, name)


def _check_finite(value: torch.Tensor, name: str) -> None:
    """Every entry finite (looked at once per call: :mod:`course_lib.call_scope`)."""
    if recall("finite", value):
        return
    refuse_if(~torch.isfinite(value.detach()), lambda: _not_finite(value, name))
    # known from here on in this call: were it not, the queued check raises before any use
    remember("finite", value, True)


def _not_finite(value: torch.Tensor, name: str) -> ValueError:
    bad = value.detach()[~torch.isfinite(value.detach())]
    return ValueError(
        f"{name} must be finite, got {bad.numel()} entries that are not (e.g. {bad[0].item()})"
    )


def check_tensor_params(method: str, params: Mapping[str, object], device: torch.device) -> None:
    """Every tensor among an attention method's parameters: on ``device``, and finite if it is
    floating-point (all of them read back at once). Run by :func:`course_lib.attention.attention`
    for every method, so a new encoding's parameters are covered with no code of its own (its
    ``check_params`` adds the shapes and ranges; its finiteness checks of the same tensors then
    read nothing again in that call)."""
    floats = {}
    for name, value in params.items():
        if not isinstance(value, torch.Tensor):
            continue
        if value.is_complex():
            raise TypeError(f"method={method!r}: {name} must be real, got {value.dtype}")
        if value.device != device:
            raise ValueError(f"method={method!r}: {name} is on {value.device} but q is on {device}")
        if value.is_floating_point() and has_values(value) and not recall("finite", value):
            floats[name] = value
    if not floats:
        return

    def judge(finite: list[float]) -> None:
        for (name, value), ok in zip(floats.items(), finite, strict=True):
            if not ok:
                raise _not_finite(value, f"method={method!r}: {name}")

    # one read for all of them, and in a call with the call's other checks
    defer([torch.isfinite(v.detach()).all() for v in floats.values()], judge)
    for value in floats.values():  # known from here on (else the queued check raises first)
        remember("finite", value, True)


def check_distance_penalty(lam: torch.Tensor, heads: int, device: torch.device) -> None:
    """RSE's lambda: a finite, non-negative floating-point tensor ``[heads]`` on ``device``."""
    check_float_tensor(lam, "distance_penalty", "[heads]", device, shape=(heads,))
    refuse_if(
        lam.detach() < 0,
        lambda: ValueError("distance_penalty (lambda) must be >= 0: it penalises distance"),
    )


def check_kernel_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kernel: str,
    head_dims: tuple[int, ...] = KERNEL_HEAD_DIMS,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
) -> None:
    """:func:`check_qkv` plus what a fused kernel supports: seq_q == seq_k, head_dim, dtype."""
    four_d = all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k))
    if four_d and q.shape[2] != k.shape[2]:
        raise ValueError(
            f"the {kernel} kernel needs seq_q == seq_k, got seq_q={q.shape[2]}, seq_k={k.shape[2]}"
        )
    check_qkv(q, k, v)
    if q.shape[2] < 1:
        raise ValueError(f"the sequence is empty (seq = 0); the {kernel} kernel needs seq >= 1")
    if q.dtype not in dtypes:
        raise TypeError(
            f"the {kernel} kernel takes dtypes {[str(d) for d in dtypes]}, got {q.dtype}"
        )
    if q.shape[3] not in head_dims:
        raise ValueError(
            f"the {kernel} kernel supports head_dim in {list(head_dims)}, got {q.shape[3]}"
        )
