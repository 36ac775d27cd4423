"""CPU benchmark of the PyTorch references: stick-breaking vs softmax, same shape, same run.

    python -m course_lib.bench_reference            # [1, 4, 1024, 64], prints the ratios

The stick-breaking reference is vectorised (cumulative sums over keys, no loop over positions),
so it should cost a small constant factor over softmax attention. Timings only: nothing here
passes or fails.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from course_lib.attention import attention


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape",
        type=int,
        nargs=4,
        default=[1, 4, 1024, 64],
        metavar=("BATCH", "HEADS", "SEQ", "HEAD_DIM"),
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    q, k, v = (torch.randn(*args.shape, requires_grad=True) for _ in range(3))
    print(f"shape {args.shape}, {torch.get_num_threads()} CPU threads, median of {args.repeats}")
    print(
        f"{'method':<16}{'causal':<8}{'forward ms':>12}{'x softmax':>11}{'fwd+bwd ms':>12}{'x softmax':>11}"
    )
    for causal in (True, False):
        rows = {}
        for method in ("softmax", "stick_breaking"):

            def forward(method=method, causal=causal):
                return attention(q, k, v, method=method, causal=causal)

            fwd = median_seconds(forward, args.repeats)
            both = median_seconds(lambda: forward().sum().backward(), args.repeats)
            rows[method] = (fwd, both)
        for method, (fwd, both) in rows.items():
            f_ratio = fwd / rows["softmax"][0]
            b_ratio = both / rows["softmax"][1]
            print(
                f"{method:<16}{str(causal):<8}{fwd * 1e3:>12.1f}{f_ratio:>11.2f}{both * 1e3:>12.1f}{b_ratio:>11.2f}"
            )


if __name__ == "__main__":
    main()
