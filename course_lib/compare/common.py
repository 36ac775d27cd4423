"""What every stage of a comparison shares: its text (:class:`ComparisonText`, cut once per
process), where a run ran (:func:`hardware_description`), the checks of an objective and a seed,
the thread count a run trains with, and its results files (written whole, read back only when
they belong to the configuration asked for)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path

import torch

from course_lib.compare.files import RESULT_KEYS, ComparisonFileError, check_result, read_json
from course_lib.compare.presets import Preset
from course_lib.data import (
    comparison_splits,
    corpus_source,
    segment_windows,
    unigram_entropy,
    window_documents,
)
from course_lib.distributed import Processes
from course_lib.model import OBJECTIVES

__all__ = [
    "ComparisonText",
    "check_objective",
    "check_seed",
    "hardware_description",
    "load_average",
    "prepare_checkpoint_dir",
    "preset_threads",
    "saved_or_none",
    "torch_threads",
    "write_result",
]


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def hardware_description(device: str | torch.device, processes: Processes | None = None) -> dict:
    """Where a run ran: kind (CPU/GPU), model name, core and thread counts (threads per process),
    software versions; with ``processes``, also how many processes ran and how (``processes``,
    ``parallel_mode``, ``process_backend``; absent for one process)."""
    device = torch.device(device)
    info = {
        "kind": "GPU" if device.type == "cuda" else "CPU",
        "cpu": _cpu_model_name(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["name"] = info["gpu"]
    else:
        info["name"] = info["cpu"]
    if processes is not None:
        info["processes"] = processes.world_size
        info["parallel_mode"] = processes.mode
        info["process_backend"] = processes.backend
    return info


def load_average() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


class ComparisonText:
    """The text of a comparison, cut once per process (:func:`course_lib.data.
    comparison_splits`): the training stream, and windows of the held-out splits: ``curve``
    (selection split, training length; the validation curve), ``select`` (selection split, the
    sweep's score), ``test`` (test split, training length) and ``long`` (test split,
    ``long_multiple`` times the training length)."""

    def __init__(self, preset: Preset) -> None:
        self.splits = comparison_splits(
            select_fraction=preset.select_fraction,
            test_fraction=preset.test_fraction,
            ngram=preset.ngram,
        )
        length = preset.train.seq_len
        self.train = self.splits.train
        self.select = segment_windows(self.splits.select, length + 1, None)
        self.curve = self.select
        self.test = segment_windows(self.splits.test, length + 1, preset.eval_windows)
        self.long = segment_windows(
            self.splits.test, preset.long_multiple * length + 1, preset.long_windows
        )
        # the document of each test window: the report bootstraps the text's noise by document
        self.test_documents = window_documents(self.splits.test, length + 1, preset.eval_windows)
        self.long_documents = window_documents(
            self.splits.test, preset.long_multiple * length + 1, preset.long_windows
        )
        self.source = corpus_source()
        self.unigram_entropy = unigram_entropy(self.train)

    def describe(self) -> dict:
        return {
            "corpus_source": self.source,
            **self.splits.describe(),
            "unigram_entropy_nats": self.unigram_entropy,
            "select_windows": int(self.select.shape[0]),
            "test_windows": int(self.test.shape[0]),
            "long_windows": int(self.long.shape[0]),
            "long_window_length": int(self.long.shape[1] - 1),
            "test_window_documents": self.test_documents.tolist(),
            "long_window_documents": self.long_documents.tolist(),
        }


def check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")


def check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"a seed must be an int >= 0, got {seed!r}")


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(threads)`` (None: unchanged)."""
    previous = torch.get_num_threads()
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def write_result(path: Path, result: dict) -> None:
    """Write a results file atomically (a temporary file renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def prepare_checkpoint_dir(path: Path) -> None:
    """Create the checkpoint folder with a ``.gitignore`` of ``*`` so git never picks it up."""
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# checkpoints are large and reproducible: never committed\n*\n")


def saved_or_none(
    result_path: Path,
    checkpoint_path: Path,
    identity: dict,
    force: bool,
    what: str,
    keys: tuple[str, ...] = RESULT_KEYS,
) -> dict | None:
    """The results file at ``result_path`` if it belongs to ``identity`` (None if there is
    none); ``force`` deletes it and its checkpoint first; a file of another configuration is
    refused."""
    if force:
        result_path.unlink(missing_ok=True)
        checkpoint_path.unlink(missing_ok=True)
    if result_path.exists():
        saved = check_result(result_path, read_json(result_path), keys=keys)
        if saved.get("identity") != identity:
            raise ComparisonFileError(
                f"{result_path} was computed with a different configuration than {what}; "
                "recompute it with force=True (--force) or use another out_dir"
            )
        return saved
    prepare_checkpoint_dir(checkpoint_path.parent)
    return None


def preset_threads(preset: Preset) -> int | None:
    """The torch threads a run of ``preset`` trains with: its ``cpu_threads`` on a CPU."""
    return preset.cpu_threads if preset.device == "cpu" else None
