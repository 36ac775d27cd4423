"""GPU benchmark of the course's attention kernels against PyTorch, in one run.

    python -m course_lib.bench                 # bf16 (a T4: fp16), head_dim 64 and 128, seq 256..8192
    python -m course_lib.bench --quick         # a few sizes
    python -m course_lib.bench --causal        # causal only (--no-causal: bidirectional only)

For every size (``batch = tokens // seq`` sequences of ``heads = hidden // head_dim`` heads, so
each size holds the same number of tokens) it times the forward pass and forward + backward of:

* our fused kernels for plain softmax attention and for every encoding of the registry
  (``course_lib.encodings.REGISTRY``) that acts inside attention, through
  ``course_lib.attention.attention(backend="triton")`` itself: the same dispatch a model uses
  (the record's q/k tables and score bias are built inside the timed call, as in training; the
  encoding's parameters come from its own module, built once per size) ("kernel <name>"),
* the from-scratch PyTorch reference ``course_lib.attention.attention(backend="reference")`` of
  the same methods ("reference <name>"; it materialises ``seq x seq`` matrices, so large sizes
  run out of memory: such sizes are skipped up front or recorded as "OOM"),
* ``torch.nn.functional.scaled_dot_product_attention`` (SDPA, the baseline of the ratios),
* "RoPE + SDPA": ``course_lib.encodings.apply_rope`` on q and k, then SDPA,
* "exposb + FlexAttention": ``apply_exposb`` on q and k, then ``flex_attention`` with the exposb
  distance bias as a ``score_mod`` ("n/a" where FlexAttention is unavailable),
* "FlexAttention, no score_mod": the sanity row. FlexAttention is compiled once for the run and
  takes a causal ``BlockMask`` built once per length (``course_lib.gpu_check.speed.FlexBaseline``);
  where this row is below 0.5x SDPA's speed (or missing) the run's FlexAttention is not the
  fused one a user gets, and every FlexAttention time is marked unreliable (``flex_sanity`` in
  the results).

SDPA's records say which backend SDPA ran (``sdpa_backend``), FlexAttention's which kernel
options (``flex_options``; None: FlexAttention's own choice).

Times are medians of ``triton.testing.do_bench``. TFLOP/s counts ``4 * B * H * N^2 * D`` for the
forward and 2.5 times that for the backward (3.5 times for forward + backward), halved when
causal. "vs SDPA" is SDPA's time divided by the method's (above 1: faster than SDPA). Peak memory
is what the call allocates on top of its inputs (``torch.cuda.max_memory_allocated``).

Writes ``<out-dir>/bench_results.json`` and ``<out-dir>/bench_tflops.png``. Without a CUDA GPU it
says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "attention_flops",
    "build_methods",
    "encoding_params",
    "exposb_score_mod",
    "kernel_call",
    "main",
    "run_benchmark",
]

DEFAULT_SEQS = (256, 1024, 4096, 8192)
QUICK_SEQS = (256, 1024)
DEFAULT_HEAD_DIMS = (64, 128)
BASELINE = "SDPA"
PASSES = ("fwd", "fwd+bwd")

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attention_flops(
    batch: int, heads: int, seq: int, head_dim: int, causal: bool, pass_: str
) -> float:
    """``4 B H N^2 D`` for the forward; x3.5 for forward + backward; halved when causal."""
    flops = 4.0 * batch * heads * seq * seq * head_dim
    if pass_ == "fwd+bwd":
        flops *= 3.5
    return flops / 2 if causal else flops


def shape_for(seq: int, head_dim: int, tokens: int, hidden: int) -> tuple[int, int]:
    """``(batch, heads)``: ``tokens // seq`` sequences (>= 1) of ``hidden // head_dim`` heads."""
    return max(1, tokens // seq), max(1, hidden // head_dim)


# --------------------------------------------------------------------------------------------
# The contenders
# --------------------------------------------------------------------------------------------


def exposb_score_mod(score, b, h, q_idx, kv_idx):
    """FlexAttention ``score_mod``: adds ``log(0.7 + 0.3 exp(-0.005 |i - j|))`` (i, j: indices)."""
    distance = (q_idx - kv_idx).abs().to(torch.float32)
    return score + torch.log(0.7 + 0.3 * torch.exp(-0.005 * distance))


#: FlexAttention with no ``score_mod``: its time against SDPA's says whether the FlexAttention
#: this run compiled is the fused one a user gets (see ``course_lib.gpu_check.speed``).
FLEX_PLAIN = "FlexAttention, no score_mod"


def encoding_params(encoding, batch: int, heads: int, seq: int, head_dim: int, device) -> dict:
    """The parameters ``attention(method=...)`` gets from the encoding's own module (as in a
    model: learned tensors, and terms computed from hidden states such as FoX's gates), for
    ``batch`` random sequences of ``seq`` tokens; built once per size, outside the timings."""
    if encoding is None:
        return {}
    torch.manual_seed(0)
    module = encoding.module(heads * head_dim, heads, max_position_embeddings=seq).to(device)
    hidden = torch.randn(batch, seq, heads * head_dim, device=device)
    return module.attention_params(hidden)


def kernel_call(encoding, causal: bool, params: dict) -> Attention:
    """``attention(method=..., backend="triton")`` of ``encoding`` (None: plain softmax
    attention): the library's one Triton dispatch, so the benchmark times what a model runs."""
    from course_lib.attention import attention

    if encoding is not None and encoding.kernel_support:
        raise ValueError(encoding.kernel_support)
    method = "softmax" if encoding is None else encoding.method
    return lambda q, k, v: attention(
        q, k, v, method=method, causal=causal, backend="triton", **params
    )


def reference_call(encoding, causal: bool, params: dict) -> Attention:
    """``attention(method=..., backend="reference")`` of the same method and parameters."""
    from course_lib.attention import attention

    method = "softmax" if encoding is None else encoding.method
    return lambda q, k, v: attention(
        q, k, v, method=method, causal=causal, backend="reference", **params
    )


def kernel_encodings() -> dict[str, object]:
    """``name -> record`` of every registered encoding that acts inside attention (None for
    plain softmax attention); input-side encodings (absolute, learned) use the plain kernel."""
    from course_lib.encodings import REGISTRY

    chosen: dict[str, object] = {"softmax": None}
    for name, encoding in REGISTRY.items():
        if encoding.acts_in_attention and encoding.position_dims == 1:  # a sequence benchmark
            chosen[name] = encoding
    return chosen


def build_methods(
    causal: bool,
    seq: int,
    device: torch.device,
    heads: int = 1,
    head_dim: int = 64,
    batch: int = 1,
) -> dict[str, Attention | str]:
    """Name -> callable ``(q, k, v) -> out``, or a status string where it cannot run here."""
    import torch.nn.functional as F

    methods: dict[str, Attention | str] = {}
    for name, encoding in kernel_encodings().items():
        if encoding is not None and encoding.causal_only and not causal:
            methods[f"kernel {name}"] = methods[f"reference {name}"] = "n/a (causal only)"
            continue
        try:
            params = encoding_params(encoding, batch, heads, seq, head_dim, device)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            methods[f"kernel {name}"] = methods[f"reference {name}"] = (
                f"n/a ({type(exc).__name__}: {exc})"[:200]
            )
            continue
        for prefix, build in (("kernel", kernel_call), ("reference", reference_call)):
            try:
                methods[f"{prefix} {name}"] = build(encoding, causal, params)
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                methods[f"{prefix} {name}"] = f"n/a ({type(exc).__name__}: {exc})"[:200]
    methods[BASELINE] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    positions = torch.arange(seq, device=device)
    try:
        from course_lib.encodings import apply_exposb, apply_rope
    except ImportError:  # noqa: BLE001 - the PyTorch encodings moved; report, do not stop
        methods["RoPE + SDPA"] = methods["exposb + FlexAttention"] = "n/a"
        methods[FLEX_PLAIN] = "n/a"
        return methods
    methods["RoPE + SDPA"] = lambda q, k, v: F.scaled_dot_product_attention(
        apply_rope(q, positions), apply_rope(k, positions), v, is_causal=causal
    )
    from course_lib.gpu_check.speed import flex_baseline

    try:
        flex = flex_baseline()  # compiled once for the run; the causal BlockMask once per length
        if flex is None:
            raise ImportError("this PyTorch has no FlexAttention")
        methods[FLEX_PLAIN] = flex.attention(seq, device, causal)
        methods["exposb + FlexAttention"] = flex.attention(
            seq,
            device,
            causal,
            exposb_score_mod,
            prepare=lambda x: apply_exposb(x, positions),
        )
    except Exception:  # noqa: BLE001 - older torch, or no compiler toolchain
        methods[FLEX_PLAIN] = methods["exposb + FlexAttention"] = "n/a"
    return methods


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def reference_bytes(batch: int, heads: int, seq: int) -> int:
    """Rough memory of the reference's fp32 ``seq x seq`` tensors for forward + backward."""
    return 6 * batch * heads * seq * seq * 4


def measure(fn: Attention, q, k, v, grad_out, pass_: str) -> tuple[float, float]:
    """``(median milliseconds, peak extra MiB)`` of one pass of ``fn``."""
    import triton.testing

    if pass_ == "fwd":
        leaves = None

        def step():
            with torch.no_grad():
                fn(q, k, v)

    else:
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]

        def step():
            fn(*leaves).backward(grad_out)

    step()  # warm-up (compilation) outside the measurements
    if leaves is not None:
        for leaf in leaves:
            leaf.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak_mib = (torch.cuda.max_memory_allocated() - before) / 2**20
    ms = triton.testing.do_bench(
        step, warmup=25, rep=100, grad_to_none=leaves, return_mode="median"
    )
    return float(ms), float(peak_mib)


def agreement(methods: dict[str, Attention | str], q, k, v) -> dict[str, float | str]:
    """Max error of each kernel against its reference, relative to the reference's max."""
    errors: dict[str, float | str] = {}
    for name, kernel in methods.items():
        if not name.startswith("kernel "):
            continue
        reference = methods.get("reference " + name.removeprefix("kernel "))
        if isinstance(kernel, str) or isinstance(reference, str) or reference is None:
            errors[name] = "n/a"
            continue
        try:
            with torch.no_grad():
                got = kernel(q, k, v).float()
                want = reference(q, k, v).float()
            errors[name] = ((got - want).abs().max() / want.abs().max()).item()
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            errors[name] = f"error: {type(exc).__name__}: {exc}"[:200]
    return errors


def time_one(name: str, fn: Attention | str, q, k, v, grad_out, causal: bool, pass_: str) -> dict:
    """One record: milliseconds, TFLOP/s and peak MiB of ``fn``, or why there are none."""
    batch, heads, seq, head_dim = q.shape
    record = {
        "method": name,
        "head_dim": head_dim,
        "causal": causal,
        "seq": seq,
        "batch": batch,
        "heads": heads,
        "pass": pass_,
        "ms": None,
        "tflops": None,
        "peak_mib": None,
        "status": "ok",
    }
    need = reference_bytes(batch, heads, seq)
    if isinstance(fn, str):
        record["status"] = fn
    elif name.startswith("reference") and need > 0.8 * torch.cuda.mem_get_info()[0]:
        record["status"] = f"skipped (needs ~{need / 2**30:.0f} GiB)"
    else:
        try:
            ms, peak = measure(fn, q, k, v, grad_out, pass_)
            flops = attention_flops(batch, heads, seq, head_dim, causal, pass_)
            record.update(ms=ms, peak_mib=peak, tflops=flops / ms / 1e9)
        except torch.cuda.OutOfMemoryError:
            record["status"] = "OOM"
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            record["status"] = f"error: {type(exc).__name__}: {exc}"[:200]
        torch.cuda.empty_cache()
        if "FlexAttention" in name:
            record["flex_options"] = getattr(fn, "options", None)
        elif name == BASELINE:
            from course_lib.gpu_check.speed import sdpa_backend

            record["sdpa_backend"] = sdpa_backend(q, k, v, causal, pass_ != "fwd")
    return record


def run_benchmark(
    seqs: tuple[int, ...],
    head_dims: tuple[int, ...],
    causal_modes: tuple[bool, ...],
    tokens: int,
    hidden: int,
    dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """Time every method at every size in ``dtype``; returns the JSON-ready records and
    agreement checks."""
    device = torch.device("cuda")
    records, checks = [], []
    for head_dim in head_dims:
        for causal in causal_modes:
            for seq in seqs:
                batch, heads = shape_for(seq, head_dim, tokens, hidden)
                gen = torch.Generator(device=device).manual_seed(0)
                shape = (batch, heads, seq, head_dim)
                q, k, v, grad_out = (
                    torch.randn(shape, device=device, dtype=dtype, generator=gen) for _ in range(4)
                )
                methods = build_methods(causal, seq, device, heads, head_dim, batch)
                if seq == seqs[0]:
                    small = build_methods(causal, seq, device, 2, head_dim)
                    errors = agreement(small, q[:1, :2], k[:1, :2], v[:1, :2])
                    checks.append(
                        {"head_dim": head_dim, "causal": causal, "seq": seq, "errors": errors}
                    )
                    print(f"agreement with the reference, D={head_dim} causal={causal}: {errors}")
                for name, fn in methods.items():
                    for pass_ in PASSES:
                        records.append(time_one(name, fn, q, k, v, grad_out, causal, pass_))
                        print(_progress_line(records[-1]), flush=True)
                del q, k, v, grad_out, methods
                torch.cuda.empty_cache()
    _add_ratios(records)
    sanity = flex_sanity(records, str(dtype).removeprefix("torch."))
    if not sanity["reliable"]:
        for r in records:
            if "FlexAttention" in r["method"] and r["method"] != FLEX_PLAIN:
                r["status"] = "unreliable (FlexAttention sanity)" if r["ms"] else r["status"]
    return {"records": records, "checks": checks, "flex_sanity": sanity}


def _progress_line(r: dict) -> str:
    kind = "causal" if r["causal"] else "bidir"
    timing = f"{r['ms']:.3f} ms" if r["ms"] is not None else r["status"]
    return f"  D={r['head_dim']} N={r['seq']} {kind} {r['pass']:<7} {r['method']:<24} {timing}"


def _add_ratios(records: list[dict]) -> None:
    """``vs_sdpa = SDPA ms / method ms`` for the same size and pass."""
    baseline = {
        (r["head_dim"], r["causal"], r["seq"], r["pass"]): r["ms"]
        for r in records
        if r["method"] == BASELINE
    }
    for r in records:
        base = baseline.get((r["head_dim"], r["causal"], r["seq"], r["pass"]))
        r["vs_sdpa"] = base / r["ms"] if base and r["ms"] else None


def flex_sanity(records: list[dict], dtype: str = "bfloat16") -> dict:
    """The gpu check's rule on this benchmark's records: FlexAttention with no ``score_mod``
    at no less than ``SANITY_MIN`` x SDPA's speed at every size and pass, or every
    FlexAttention time of the run is unreliable (``course_lib.gpu_check.speed.flex_sanity``)."""
    from course_lib.gpu_check.speed import FLEX_SANITY
    from course_lib.gpu_check.speed import flex_sanity as rule

    return rule(
        [
            dict(r, contender=FLEX_SANITY if r["method"] == FLEX_PLAIN else r["method"],
                 pass_=r["pass"], dtype=dtype)
            for r in records
        ]
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(records: list[dict]) -> str:
    """One block per (head_dim, causal, seq): a row per method, forward and forward+backward."""
    lines = []
    header = (
        f"{'method':<24}{'fwd ms':>9}{'TFLOP/s':>9}{'vs SDPA':>9}"
        f"{'f+b ms':>10}{'TFLOP/s':>9}{'vs SDPA':>9}{'peak MiB':>10}  status"
    )
    groups: dict[tuple, dict[str, dict[str, dict]]] = {}
    for r in records:
        key = (r["head_dim"], r["causal"], r["seq"], r["batch"], r["heads"])
        groups.setdefault(key, {}).setdefault(r["method"], {})[r["pass"]] = r
    for (head_dim, causal, seq, batch, heads), by_method in groups.items():
        kind = "causal" if causal else "bidirectional"
        lines.append(f"\nhead_dim={head_dim} seq={seq} batch={batch} heads={heads} {kind}")
        lines.append(header)
        for name, passes in by_method.items():
            f, b = passes.get("fwd", {}), passes.get("fwd+bwd", {})
            statuses = {f.get("status"), b.get("status")} - {"ok", None}
            lines.append(
                f"{name:<24}{_cell(f.get('ms'), '.3f'):>9}{_cell(f.get('tflops'), '.1f'):>9}"
                f"{_cell(f.get('vs_sdpa'), '.2f'):>9}{_cell(b.get('ms'), '.3f'):>10}"
                f"{_cell(b.get('tflops'), '.1f'):>9}{_cell(b.get('vs_sdpa'), '.2f'):>9}"
                f"{_cell(b.get('peak_mib'), '.0f'):>10}  {'; '.join(sorted(statuses)) or 'ok'}"
            )
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    """TFLOP/s against seq: a row of panels per (head_dim, causal), forward | forward+backward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({(r["head_dim"], r["causal"]) for r in records})
    methods = list(dict.fromkeys(r["method"] for r in records))
    fig, axes = plt.subplots(
        len(settings), len(PASSES), figsize=(12, 3.6 * len(settings)), squeeze=False
    )
    for row, (head_dim, causal) in enumerate(settings):
        for col, pass_ in enumerate(PASSES):
            ax = axes[row][col]
            for name in methods:
                points = sorted(
                    (r["seq"], r["tflops"])
                    for r in records
                    if r["method"] == name
                    and (r["head_dim"], r["causal"], r["pass"]) == (head_dim, causal, pass_)
                    and r["tflops"] is not None
                )
                if points:
                    style = "-" if name.startswith("kernel") else "--"
                    ax.plot(*zip(*points, strict=True), style, marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            kind = "causal" if causal else "bidirectional"
            ax.set_title(f"{pass_}, head_dim={head_dim}, {kind}")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(5, max(1, len(labels))))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (3.6 * len(settings))))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def environment() -> dict:
    import triton

    return dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.bench",
        description="Time the course's attention kernels against PyTorch on a CUDA GPU (bf16).",
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path("figures"), help="where to write results and figure"
    )
    parser.add_argument("--quick", action="store_true", help=f"only seq {QUICK_SEQS}")
    parser.add_argument(
        "--causal",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only causal (--causal) or only bidirectional (--no-causal); default: both",
    )
    parser.add_argument("--seqs", type=int, nargs="+", default=None, help=f"default {DEFAULT_SEQS}")
    parser.add_argument("--head-dims", type=int, nargs="+", default=list(DEFAULT_HEAD_DIMS))
    parser.add_argument(
        "--tokens", type=int, default=16384, help="tokens per size: batch = tokens // seq"
    )
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden // head_dim")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from course_lib.runtime import KERNEL_MODE, gpu_half_dtype

    if not torch.cuda.is_available() or KERNEL_MODE != "compiled":
        print(
            "course_lib.bench needs a CUDA GPU with compiled Triton kernels "
            f"(here: cuda available={torch.cuda.is_available()}, kernel mode={KERNEL_MODE}). "
            "Nothing to time; exiting."
        )
        return 0
    seqs = tuple(args.seqs or (QUICK_SEQS if args.quick else DEFAULT_SEQS))
    head_dims = tuple(args.head_dims[:1] if args.quick else args.head_dims)
    causal_modes = (True, False) if args.causal is None else (args.causal,)
    for head_dim in head_dims:
        if head_dim not in (16, 32, 64, 128):
            raise ValueError(f"--head-dims must be among 16, 32, 64, 128, got {head_dim}")
    env = environment()
    dtype = gpu_half_dtype()  # bf16, or float16 on a GPU without bf16 tensor cores (a T4)
    print(f"{env['gpu']} | torch {env['torch']} | triton {env['triton']} | {dtype}")
    results = run_benchmark(seqs, head_dims, causal_modes, args.tokens, args.hidden, dtype)
    print(format_table(results["records"]))
    sanity = results["flex_sanity"]
    print(f"\nFlexAttention sanity: {'reliable' if sanity['reliable'] else 'UNRELIABLE'}: "
          f"{sanity['reason']}")  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    payload = dict(
        environment=env,
        dtype=str(dtype).removeprefix("torch."),
        tokens_per_size=args.tokens,
        hidden=args.hidden,
        flops="4*B*H*N^2*D forward, x3.5 forward+backward, halved when causal",
        vs_sdpa="SDPA time / method time",
        **results,
    )
    json_path = args.out_dir / "bench_results.json"
    json_path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    figure_path = args.out_dir / "bench_tflops.png"
    plot(results["records"], figure_path)
    print(f"\nwrote {json_path} and {figure_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
