"""Every method's kernels against the reference, forward and backward, on the GPU.

A case is one (method, dtype, causal, head_dim) at a ragged length (not a multiple of any
tile). Both sides go through ``attention()``: ``backend="triton"`` on the case's dtype, and
``backend="reference"`` in float64 on the same (rounded) inputs and parameters. Compared: the
output and the gradients of q, k, v and of every float tensor parameter, each as
``max |kernel - reference| / max(max |reference|, 1)`` against the course's tolerance for the
dtype (:data:`TOLERANCE`, the kernel tests' own). In fp16 and bf16 a tensor also passes when
its error is at most twice that of PyTorch's reference under ``torch.autocast`` in that dtype
on the same inputs (FlashAttention's test criterion: the kernel rounds no worse than
mixed-precision PyTorch would; where that error is small the fixed tolerance decides). A
method whose record says it has no kernel
(``kernel_support``) is reported as such, not as a failure.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from course_lib.gpu_check.cases import make_inputs, methods, relative_error

__all__ = ["TOLERANCE", "CorrectnessCase", "check_case", "correctness_cases", "run_correctness"]

TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}


@dataclass(frozen=True)
class CorrectnessCase:
    method: str
    dtype: str
    causal: bool
    head_dim: int
    seq: int = 200
    batch: int = 2
    heads: int = 3

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "bidir"
        return f"{self.method} {self.dtype} {mask} D{self.head_dim} N{self.seq}"


def correctness_cases(
    bf16: bool, head_dims: tuple[int, ...] = (64,), wide_head_dims: tuple[int, ...] = (128,)
) -> list[CorrectnessCase]:
    """Every method x dtype (fp32, fp16, and bf16 if the GPU has it) x mask (bidirectional
    unless the method is causal-only) at ``head_dims``, and at ``wide_head_dims`` for the 16-bit
    dtype the models train in (bf16, else fp16)."""
    dtypes = ["fp32", "fp16"] + (["bf16"] if bf16 else [])
    model_dtype = "bf16" if bf16 else "fp16"
    cases = []
    for name, encoding in methods().items():
        masks = (True,) if encoding is not None and encoding.causal_only else (True, False)
        for dtype in dtypes:
            dims = head_dims + (wide_head_dims if dtype == model_dtype else ())
            for head_dim in dict.fromkeys(dims):
                for causal in masks:
                    cases.append(CorrectnessCase(name, dtype, causal, head_dim))
    return cases


def _forward_backward(case: CorrectnessCase, inputs, backend: str, dtype, param_dtype) -> dict:
    """Output and gradients of ``attention(..., backend=backend)`` on q, k, v cast to ``dtype``
    and float parameters cast to ``param_dtype``."""
    from course_lib.attention import attention

    def leaf(x, to):
        return x.detach().to(to).requires_grad_()

    q, k, v = leaf(inputs.q, dtype), leaf(inputs.k, dtype), leaf(inputs.v, dtype)
    params = {
        key: leaf(value, param_dtype)
        if torch.is_tensor(value) and value.is_floating_point()
        else value
        for key, value in inputs.params.items()
    }
    out = attention(
        q,
        k,
        v,
        method=case.method,
        causal=case.causal,
        position_ids=inputs.positions,
        backend=backend,
        **params,
    )
    out.backward(inputs.grad_out.to(dtype))
    results = {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    for key, value in params.items():
        if torch.is_tensor(value) and value.requires_grad:
            results["d" + key] = value.grad if value.grad is not None else torch.zeros_like(value)
    return results


def _mixed_precision_reference(case: CorrectnessCase, inputs) -> dict:
    """PyTorch's reference the way mixed-precision training runs it: float32 tensors under
    ``torch.autocast`` in the case's 16-bit dtype (products in 16 bits, softmax and sums in
    float32), on the same rounded inputs."""
    with torch.autocast(device_type=inputs.q.device.type, dtype=inputs.q.dtype):
        return _forward_backward(case, inputs, "reference", torch.float32, torch.float32)


def _tiles_of(case: CorrectnessCase):
    """The kernels' static tiles are what a case checks (``kernels/tuning.py``). A case shaped
    like the timed ones (16-bit, a length a multiple of 16: the same compiled specialisation)
    also runs, once each and untimed, every tiling the speed phase may time, so that the
    parallel workers compile them and the speed phase finds them in Triton's cache."""
    from course_lib.runtime import load_kernel_module

    tuning = load_kernel_module("tuning")
    if case.dtype != "fp32" and case.seq % 16 == 0:
        return tuning.compile_only()
    return tuning.disabled()


def check_case(case: CorrectnessCase, device) -> dict:
    """One case on ``device``: ``status`` ``"ok"``, ``"wrong"`` (an error above tolerance),
    ``"error"`` (an exception, e.g. a kernel that refuses the GPU, with its message) or
    ``"no kernel"``; ``errors`` per tensor, ``worst``, ``tolerance``, ``seconds``."""
    started = time.perf_counter()
    row = dict(asdict(case), label=case.label, tolerance=TOLERANCE[case.dtype])
    encoding = methods()[case.method]
    if encoding is not None and encoding.kernel_support:
        return dict(row, status="no kernel", reason=encoding.kernel_support, seconds=0.0)
    try:
        inputs = make_inputs(
            encoding,
            batch=case.batch,
            heads=case.heads,
            seq=case.seq,
            head_dim=case.head_dim,
            dtype=case.dtype,
            device=device,
        )
        want = _forward_backward(case, inputs, "reference", torch.float64, torch.float64)
        with _tiles_of(case):
            got = _forward_backward(case, inputs, "triton", inputs.q.dtype, torch.float32)
        errors = {name: relative_error(got[name], want[name]) for name in want}
        allowed = {name: row["tolerance"] for name in want}
        if case.dtype != "fp32":
            try:
                same = _mixed_precision_reference(case, inputs)
            except Exception:  # noqa: BLE001 - no 16-bit reference: the fixed tolerance alone
                same = None
            if same is not None:
                framework = {n: relative_error(same[n], want[n]) for n in want}
                row["framework_errors"] = {k: float(f"{e:.3g}") for k, e in framework.items()}
                allowed = {n: max(allowed[n], 2 * framework[n]) for n in want}
    except Exception as exc:  # noqa: BLE001 - a failing case is a result of the check
        text = f"{type(exc).__name__}: {exc}"
        return dict(
            row, status="error", reason=text[:500], seconds=round(time.perf_counter() - started, 2)
        )
    worst = max(errors.values())
    status = "ok" if all(errors[n] <= allowed[n] for n in errors) else "wrong"
    return dict(
        row,
        status=status,
        errors={k: float(f"{e:.3g}") for k, e in errors.items()},
        worst=float(f"{worst:.3g}"),
        seconds=round(time.perf_counter() - started, 2),
    )


def _worker_case(case: CorrectnessCase) -> dict:
    return check_case(case, torch.device("cuda", torch.cuda.current_device()))


def _worker_init(index: int) -> None:
    torch.cuda.set_device(index)


def run_correctness(cases: list[CorrectnessCase], device, workers: int = 0) -> list[dict]:
    """Every case, in order, with a progress bar. ``workers > 0``: that many processes share
    the GPU, so the kernels' compilation (CPU-bound, most of the time) runs in parallel; each
    process keeps its CUDA context across cases, and Triton's on-disk cache serves the
    kernels to the later phases. ``workers == 0``: in this process, on ``device``."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(cases), desc="kernels vs reference")
    results: list[dict | None] = [None] * len(cases)
    if workers <= 0:
        for i, case in enumerate(cases):
            results[i] = check_case(case, device)
            bar.update()
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")
        index = device.index if device.index is not None else torch.cuda.current_device()
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_worker_init, initargs=(index,)
        ) as pool:
            futures = {pool.submit(_worker_case, case): i for i, case in enumerate(cases)}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    results[i] = future.result()
                except Exception as exc:  # noqa: BLE001 - a worker died (e.g. a CUDA fault)
                    case = cases[i]
                    results[i] = dict(
                        asdict(case),
                        label=case.label,
                        status="error",
                        tolerance=TOLERANCE[case.dtype],
                        seconds=0.0,
                        reason=f"worker process failed: {type(exc).__name__}: {exc}"[:500],
                    )
                bar.update()
    bar.close()
    return [r for r in results if r is not None]
