"""Several processes for one comparison: ``torch.distributed``, started by ``torchrun``.

``torchrun --nproc_per_node N -m course_lib.compare ...`` starts N copies of the command line,
each with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its
environment. :func:`launched` tells whether this process is one of several; :func:`start` then
creates the process group (NCCL on GPUs, gloo on CPUs) and returns a :class:`Processes`. Without
``torchrun`` (or with one process) nothing here runs and no process group exists.

The processes are used in one of two modes (:data:`MODES`):

* ``"data"``, data parallel: every run is trained by all N processes together, wrapped in
  :class:`~torch.nn.parallel.DistributedDataParallel`. At each step every process draws the
  preset's whole batch of ``B`` rows from the same seeded generator (masked-LM masks included)
  and keeps its own ``B / N`` consecutive rows (:meth:`Processes.shard`), so the global batch,
  the data order, the masks, the dropout masks (:class:`course_lib.train.GlobalBatchDropout`)
  and the learning-rate schedule are those of one process; only the order of float sums
  differs. Rank 0 alone validates, evaluates, probes and writes results, checkpoints and
  figures; the others wait for it.
* ``"runs"``: each process trains whole runs, each exactly as one process would, taking the
  next run of the comparison's list whenever it is free (:meth:`Processes.next_index`); rank 0
  draws the figures at the end.

Objects (decisions, checkpoints, results) travel over a gloo group (:meth:`Processes.broadcast`):
the default group on CPUs, a second group beside NCCL on GPUs.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "MODES",
    "Processes",
    "launched",
    "start",
    "step_seed",
    "stop",
    "tensor_fingerprint",
]

#: ``"data"``: all processes train each run together; ``"runs"``: each process trains whole runs.
MODES = ("data", "runs")

#: How long a process waits at a collective operation for the others before the run fails.
DEFAULT_TIMEOUT_SECONDS = 1800.0

T = TypeVar("T")


def launched() -> bool:
    """Whether this process is one of several started by ``torchrun`` (``WORLD_SIZE > 1``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass(frozen=True)
class Processes:
    """This process's place among the others, and the operations the comparison needs."""

    rank: int
    world_size: int
    local_rank: int
    mode: str  # one of MODES
    backend: str  # "gloo" or "nccl": the backend of the default group
    device: torch.device  # this process's device: cuda:<local_rank> or cpu
    timeout_seconds: float
    objects: Any = None  # the gloo group objects travel over (None: the default group)

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files."""
        return self.rank == 0

    def describe(self) -> str:
        """``rank R of N (backend, mode)``, for messages."""
        return f"rank {self.rank} of {self.world_size} ({self.backend}, {self.mode} mode)"

    # -- objects ---------------------------------------------------------------------------------
    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank (any picklable object; tensors inside on the CPU)."""
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.objects)
        return box[0]

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order, on every rank."""
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, value, group=self.objects)
        return gathered

    def from_main(self, compute: Callable[[], T]) -> T:
        """Rank 0 calls ``compute()``, every rank gets its return value; if it raises, every rank
        raises (rank 0 its own exception, the others a copy), so no rank is left waiting."""
        outcome: tuple[str, Any] = ("ok", None)
        if self.is_main:
            try:
                outcome = ("ok", compute())
            except Exception as error:
                self.broadcast(("error", _picklable(error)))
                raise
        kind, value = self.broadcast(outcome)
        if kind == "error":
            raise value
        return value

    def next_index(self, key: str) -> int:
        """A counter shared by every process of the launch: each call, on any process, returns
        the next of 0, 1, 2, ... for ``key`` (the rendezvous store's atomic add). Processes
        that take work this way each take the next item when they are free."""
        store = dist.distributed_c10d._get_default_store()
        return int(store.add(f"course_lib/{key}", 1)) - 1

    def check_same(self, what: str, value: object) -> None:
        """Raise on every rank unless every rank holds the same ``value`` (a short summary of
        ``what``, e.g. a checksum of the corpus)."""
        values = self.all_gather(value)
        if any(v != values[0] for v in values):
            differing = [r for r, v in enumerate(values) if v != values[0]]
            raise RuntimeError(
                f"{what} differs between processes: rank 0 has {values[0]!r}, ranks {differing} "
                "have something else (are the machines running the same Python and course?)"
            )

    # -- data parallel ---------------------------------------------------------------------------
    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch ``[B, ...]``: rows ``rank * B/N`` to
        ``(rank + 1) * B/N - 1`` (``N`` = world size, which must divide ``B``)."""
        rows = batch.shape[0]
        if rows % self.world_size:
            raise ValueError(
                f"the global batch of {rows} rows cannot be split evenly over {self.world_size} "
                f"processes; use a number of processes that divides {rows}"
            )
        size = rows // self.world_size
        return batch[self.rank * size : (self.rank + 1) * size]

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place (default group: on this rank's device)."""
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` in :class:`~torch.nn.parallel.DistributedDataParallel`: rank 0's parameters
        are copied to every rank, and after each backward every gradient is the mean over ranks."""
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)


def _picklable(error: Exception) -> Exception:
    """``error`` itself if it can be sent to the other ranks, else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"rank 0 failed: {type(error).__name__}: {error}")
    return error


def start(
    device_type: str, mode: str = "data", timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
) -> Processes:
    """Create the process group from ``torchrun``'s environment (``env://``) and return this
    process's :class:`Processes`.

    ``device_type="cuda"``: this process uses GPU ``LOCAL_RANK`` (made the current device); the
    default group is NCCL in ``"data"`` mode (gradients stay on the GPU), gloo in ``"runs"`` mode
    (only objects travel). ``"cpu"``: gloo. Every collective operation that waits longer than
    ``timeout_seconds`` for another process fails instead of hanging."""
    if not launched():
        raise RuntimeError("start() needs several processes: launch with torchrun")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if not timeout_seconds > 0:
        raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) visible: "
                "start at most one process per GPU (--nproc_per_node)"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device_type == "cuda" and mode == "data" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_seconds)
    dist.init_process_group(backend=backend, timeout=timeout)
    objects = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    return Processes(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        mode=mode,
        backend=backend,
        device=device,
        timeout_seconds=timeout_seconds,
        objects=objects,
    )


def stop(processes: Processes | None) -> None:
    """Destroy the process group (after a last barrier, so no rank leaves while another still
    needs it); nothing when ``processes`` is None."""
    if processes is None or not dist.is_initialized():
        return
    dist.barrier(group=processes.objects)
    dist.destroy_process_group()


def step_seed(seed: int, step: int) -> int:
    """Seed of the dropout masks of training ``step`` of a run seeded ``seed``
    (:class:`course_lib.train.GlobalBatchDropout`): a function of the two alone, so the masks
    depend neither on where a run resumed nor on how many processes train it."""
    return (seed * 1_000_003 + step) % (2**63)


def tensor_fingerprint(tensor: torch.Tensor) -> str:
    """A short SHA-256 of a tensor's values (for checking that every process holds the same)."""
    data = tensor.detach().cpu().contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]
