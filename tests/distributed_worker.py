"""One data-parallel run of the tiny preset under ``torchrun``, for ``tests/test_distributed.py``.

    torchrun --nproc_per_node 2 tests/distributed_worker.py --arm rope --objective mlm \
        --out DIR --steps 20 [--dropout 0.1] [--plant per-shard-mean]

It does what ``python -m course_lib.compare --preset tiny`` does for one run, with what the
command line does not offer: a dropout rate, and a **planted bug** for the test that shows its
tolerances catch one: ``--plant per-shard-mean`` makes every process differentiate the mean
loss of its own shard (the classic mistake: with masked LM the shards hold different numbers of
targets, so the mean of the shard means is not the mean over the batch). The bug is planted
here, in the test's own process, by replacing ``course_lib.train._data_parallel_backward``;
nothing in the library can switch it on.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
import torch.nn.functional as F

import course_lib.train as train
from course_lib.compare import PRESETS, run_one
from course_lib.data import IGNORE_INDEX
from course_lib.distributed import start, stop
from course_lib.evaluate import autocast


def _per_shard_mean_backward(trained, processes, input_ids, labels, optimizer, autocast_dtype):
    """The planted bug: each process's loss is the mean over its own shard's targets."""
    device = processes.device
    input_ids = processes.shard(input_ids).to(device)
    labels = processes.shard(labels).to(device)
    with autocast(device, autocast_dtype):
        logits = trained(input_ids).logits
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # DDP averages: the gradient of the mean of the shard means
    return processes.sum_(loss.detach().clone()) / processes.world_size


def _shards_in_one_process(shards: int):
    """One process doing what ``shards`` data-parallel processes do: each shard's
    ``shards * sum(cross-entropy) / (labelled tokens of the whole batch)`` differentiated on its
    own, the gradients added, then halved by the processes' count as DDP's mean does (exact for
    a power of two). The same sums in the same order, without a second process."""

    def backward(model, input_ids, labels, optimizer, autocast_dtype):
        device = next(model.parameters()).device
        global_count = int((labels != IGNORE_INDEX).sum())
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for ids, targets in zip(input_ids.chunk(shards), labels.chunk(shards), strict=True):
            with autocast(device, autocast_dtype):
                logits = model(ids.to(device)).logits
            share = F.cross_entropy(
                logits.flatten(0, 1).float(), targets.to(device).flatten(),
                ignore_index=IGNORE_INDEX, reduction="sum",
            ) / max(global_count, 1)  # fmt: skip
            (share * shards).backward()
            total = total + share.detach()
        for parameter in model.parameters():
            if parameter.grad is not None:
                parameter.grad.div_(shards)
        return total

    return backward


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arm", required=True)
    parser.add_argument("--objective", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--plant", choices=["none", "per-shard-mean"], default="none")
    parser.add_argument(
        "--shards-in-one-process",
        type=int,
        default=0,
        help="no torchrun: one process sums the gradients of this many shards",
    )
    args = parser.parse_args()
    if args.plant == "per-shard-mean":
        train._data_parallel_backward = _per_shard_mean_backward
    preset = replace(PRESETS["tiny"], probes=(), dropout=args.dropout)
    if args.shards_in_one_process:
        train._one_process_backward = _shards_in_one_process(args.shards_in_one_process)
        run_one(args.arm, args.objective, preset, out_dir=args.out, progress=False,
                stop_after_steps=args.steps)  # fmt: skip
        return
    processes = start("cpu", "data", 120.0)
    run_one(
        args.arm, args.objective, preset, out_dir=args.out, progress=False,
        stop_after_steps=args.steps, processes=processes,
    )  # fmt: skip
    stop(processes)


if __name__ == "__main__":
    main()
