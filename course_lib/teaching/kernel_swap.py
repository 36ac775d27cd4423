"""The notebooks' "swap in the kernel" sections: check a kernel against its reference, time it.

``agree(label, run, wrt)`` runs ``run("reference")`` and ``run("triton")``, backpropagates the
same fixed upstream gradient through both and compares the outputs and the gradients of every
tensor in ``wrt`` (plus any the run returns itself, such as a module's parameters). It prints
one verdict line and raises ``AssertionError`` when the kernel disagrees, so a notebook cell that
calls it fails loudly. Where the kernels cannot run (no Triton, as on macOS and Windows; a Triton
too old; an AMD GPU) nothing is substituted: the line says the kernel was not run, and why.

``time_ms(fn, *args, **kwargs)`` times ``fn`` on a GPU. In Triton's CPU interpreter kernel
timings mean nothing, so there it does not time: it raises, and :func:`timings_available` tells
a cell which branch to take. :func:`timing_dtype` is the 16-bit dtype to time in on that GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from course_lib.runtime import KERNEL_MODE, gpu_half_dtype, kernels_available, unavailable_brief

__all__ = ["agree", "time_ms", "timing_dtype", "timings_available", "NO_TIMINGS"]

NO_TIMINGS = (
    "Timings need a GPU: in Triton's CPU interpreter the kernel runs one program at a time in "
    "Python, far slower than PyTorch by design."
)

RunResult = torch.Tensor | tuple[torch.Tensor, Mapping[str, torch.Tensor]]


def _outputs_and_grads(
    result: RunResult, wrt: Mapping[str, torch.Tensor], seed: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out, own = result if isinstance(result, tuple) else (result, {})
    tensors = {**wrt, **own}
    if not tensors:
        return out.detach(), {}
    generator = torch.Generator(device="cpu").manual_seed(seed)
    upstream = torch.randn(out.shape, generator=generator, dtype=torch.float32)
    upstream = upstream.to(device=out.device, dtype=out.dtype)
    grads = torch.autograd.grad(out, list(tensors.values()), upstream)
    return out.detach(), dict(zip(tensors, grads, strict=True))


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def agree(
    label: str,
    run: Callable[[str], RunResult],
    wrt: Mapping[str, torch.Tensor] | None = None,
    *,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    seed: int = 0,
) -> None:
    """Check that the Triton kernel computes what the reference computes, forward and backward.

    ``run(backend)`` is called with ``"reference"`` and ``"triton"`` and returns an output
    tensor, or ``(output, {name: tensor})`` to add tensors of its own whose gradients are
    compared (e.g. the parameters of a module built for that backend). ``wrt`` names the shared
    inputs whose gradients are compared (they must require grad). The loss backpropagated is
    ``(out * g).sum()`` with one fixed random ``g`` (seeded by ``seed``), the same for both.
    Agreement means ``torch.allclose(kernel, reference, atol=atol, rtol=rtol)`` for the output
    and every gradient.

    Prints one line when everything agrees; raises ``AssertionError`` naming what differs (and by
    how much) otherwise. Where the kernels cannot run, prints that the kernel was not run and
    why (the reference is not substituted for it). Returns nothing, so a notebook cell shows
    only the line.
    """
    wrt = dict(wrt or {})
    if not kernels_available():
        print(f"{label}: kernel not run ({unavailable_brief()}); nothing is substituted")
        return
    ref_out, ref_grads = _outputs_and_grads(run("reference"), wrt, seed)
    tri_out, tri_grads = _outputs_and_grads(run("triton"), wrt, seed)
    if tri_out.shape != ref_out.shape:
        raise AssertionError(
            f"{label}: kernel output has shape {tuple(tri_out.shape)}, "
            f"reference {tuple(ref_out.shape)}"
        )
    if ref_grads.keys() != tri_grads.keys():
        raise AssertionError(
            f"{label}: the two runs return different tensors to differentiate: "
            f"{sorted(ref_grads)} vs {sorted(tri_grads)}"
        )
    compared = {"output": (tri_out, ref_out)}
    compared.update({f"d{name}": (tri_grads[name], ref_grads[name]) for name in ref_grads})
    wrong = [
        f"{name} (max |difference| {_max_error(a.cpu(), b.cpu()):.2g})"
        for name, (a, b) in compared.items()
        if not torch.allclose(a.cpu(), b.cpu(), atol=atol, rtol=rtol)
    ]
    if wrong:
        raise AssertionError(
            f"{label}: the kernel disagrees with the reference on {', '.join(wrong)} "
            f"(atol {atol:.0e}, rtol {rtol:.0e})"
        )
    what = "output" if not ref_grads else f"output and gradients of {', '.join(ref_grads)}"
    print(f"{label}: kernel == reference ({what}; atol {atol:.0e}, rtol {rtol:.0e})")


def timings_available() -> bool:
    """True when the kernels are compiled for a GPU, the only place their timings mean anything."""
    return KERNEL_MODE == "compiled"


def timing_dtype() -> torch.dtype:
    """The 16-bit dtype the notebooks time in on this GPU: bf16, or float16 on a GPU without
    bf16 tensor cores (a T4, sm_75, where the kernels refuse bf16). Raises without a GPU, as
    :func:`time_ms` does."""
    if not timings_available():
        raise RuntimeError(NO_TIMINGS)
    return gpu_half_dtype()


def time_ms(fn: Callable, *args, repeats: int = 20, warmup: int = 2, **kwargs) -> float:
    """Mean wall-clock time of ``fn(*args, **kwargs)`` in milliseconds on the GPU.

    Runs ``warmup`` calls first (compilation, autotuning, caches), then ``repeats`` timed calls
    between two ``torch.cuda.synchronize()``. Raises ``RuntimeError`` without a GPU: in the
    interpreter, or without Triton, there is nothing meaningful to time.
    """
    if not timings_available():
        raise RuntimeError(NO_TIMINGS)
    for _ in range(warmup):
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3
