"""The comparison under ``torchrun``: 2 processes on the CPU with gloo (about a minute).

What is checked: two processes training one run together (data parallel) end where one process
ends, to float rounding, and write exactly one results file and one checkpoint; so do a masked
run (whose shards hold different numbers of targets) and a run with dropout (whose masks are
drawn for the whole batch, whatever the number of processes); the tolerances are tight enough to
catch a planted bug (each process differentiating the mean loss of its own shard); the masked
run's drift from one process after its first steps is the order of float sums alone (one process
summing the same shards' gradients follows the two processes bit for bit); a run started
by one process goes on with two on the curve of an uninterrupted run; in ``runs`` mode each
process takes whole runs, equal to one process's; a killed process makes the run fail within
seconds with a report naming it (and its checkpoint then resumes in one process), and a stalled
one makes it fail after ``--dist-timeout`` with a message saying so, instead of hanging. Without
``torchrun`` no process group is created.

Each launch is ``python -m torch.distributed.run`` in a subprocess of its own session, on a free
port of 127.0.0.1, with a timeout after which the whole session is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_lib.compare import PRESETS, main, run_one
from course_lib.compare.results import hardware_label
from course_lib.compare.sweep import run_sweep_one
from course_lib.distributed import Processes, step_seed
from course_lib.train import load_checkpoint

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with gloo",
)

TINY = PRESETS["tiny"]
NO_PROBES = replace(TINY, probes=())  # the same training and evaluation, without the probes
REPO = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240  # seconds: a launch that takes longer has hung
# Two processes compute the loss of the same global batch as one (bit for bit on the same
# parameters); their gradients differ from one process's by float rounding (sums in another
# order), which AdamW amplifies where a gradient is near 0. Measured on a 2-core CPU, 2 vs 1
# process: the training losses of the first 20 steps within 7e-7 (any run); after the 100 steps
# of the tiny clm run of "none", 1.2e-6 on the curves and 1e-7 on the final validation loss.
# Other runs drift more after 20-50 steps (tiny mlm rope: 5e-4 on the final validation loss),
# so the tight tolerance applies to the first steps and a looser one to the whole run.
EARLY_STEPS = 20
MLM_STEPS = TINY.mlm_steps or TINY.train.steps  # the whole tiny mlm run
EARLY_TOLERANCE = 1e-5
LOSS_TOLERANCE = 1e-3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TQDM_DISABLE="1", PYTHONUNBUFFERED="1")
    env.pop("WORLD_SIZE", None)
    if Path("/sys/class/net/lo").exists():  # gloo on the loopback device, whatever the hostname
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _command(args: list[str], script: list[str] | None = None) -> list[str]:
    target = script or ["-m", "course_lib.compare", "--no-progress"]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
        *target, *args,
    ]  # fmt: skip


def _torchrun(args: list[str], script: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run the comparison (or ``script``) with 2 processes; kill the launch's whole session on
    timeout."""
    with subprocess.Popen(
        _command(args, script),
        cwd=REPO,
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as launch:
        try:
            out, err = launch.communicate(timeout=LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.communicate()
            pytest.fail(f"torchrun {' '.join(args)} did not finish in {LAUNCH_TIMEOUT} s")
    return subprocess.CompletedProcess(launch.args, launch.returncode, out, err)


def _check(completed: subprocess.CompletedProcess) -> str:
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed.stdout


def _max_difference(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One process: the tiny clm run of ``none`` (no probes: they do not change the training)."""
    out_dir = tmp_path_factory.mktemp("one-process")
    return run_one("none", "clm", NO_PROBES, out_dir=out_dir, progress=False)


# -- data parallel ----------------------------------------------------------------------------


def test_two_processes_end_where_one_ends_and_write_one_file(reference, tmp_path):
    out = _check(
        _torchrun(
            ["--preset", "tiny", "--encodings", "none", "--objectives", "clm"]
            + ["--out", str(tmp_path), "--no-figures"]
        )
    )
    assert out.count("finished run(s)") == 1  # rank 0 alone reports
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["clm_none_s0.json", "sessions.json"]
    (sitting,) = json.loads((tmp_path / "sessions.json").read_text())  # rank 0 logged it once
    assert (sitting["processes"], sitting["parallel_mode"]) == (2, "data")
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == ["clm_none_s0.pt"]
    assert not list(tmp_path.rglob("*.tmp"))
    result = json.loads((tmp_path / "clm_none_s0.json").read_text())
    assert result["identity"] == TINY.identity("none", "clm")  # comparable to one process
    hardware = result["hardware"]
    assert (hardware["processes"], hardware["parallel_mode"]) == (2, "data")
    assert hardware["process_backend"] == "gloo"
    assert "2 processes (data parallel, gloo)" in hardware_label(hardware)
    assert result["metrics"]["training_processes"] == [2]
    final = result["metrics"]["final_val_loss"]
    expected = reference["metrics"]["final_val_loss"]
    assert abs(final - expected) < LOSS_TOLERANCE, (final, expected)
    for kind in ("train", "val"):
        ours, theirs = result["curves"][kind], reference["curves"][kind]
        assert ours["step"] == theirs["step"]
        assert _max_difference(ours["loss"], theirs["loss"]) < LOSS_TOLERANCE, kind
    early = [
        c["loss"][:EARLY_STEPS] for c in (result["curves"]["train"], reference["curves"]["train"])
    ]
    assert _max_difference(*early) < EARLY_TOLERANCE
    assert set(result["probes"]) == {"word_order", "retrieval"}  # rank 0 probed the model


def test_a_run_resumes_with_more_processes_than_wrote_its_checkpoint(tmp_path):
    # The uninterrupted curve of one process: 30 of the 100 steps of the tiny mlm run (its
    # shards hold different numbers of masked targets).
    run_one("none", "mlm", TINY, out_dir=tmp_path / "one", progress=False, stop_after_steps=30)
    expected = load_checkpoint(tmp_path / "one" / "checkpoints" / "mlm_none_s0.pt")
    mixed = tmp_path / "mixed"
    run_one("none", "mlm", TINY, out_dir=mixed, progress=False, stop_after_steps=20)  # 1: 1-20
    args = ["--preset", "tiny", "--encodings", "none", "--objectives", "mlm", "--out", str(mixed)]
    _check(_torchrun([*args, "--stop-after-steps", "30"]))  # 2 processes: steps 21-30
    assert not list(mixed.glob("mlm_*.json"))
    saved = load_checkpoint(mixed / "checkpoints" / "mlm_none_s0.pt")
    state = saved["state"]
    assert (state["step"], state["segments"], state["processes"]) == (30, 2, [1, 2])
    ours, theirs = state["train_curve"], expected["state"]["train_curve"]
    assert ours["step"] == theirs["step"] == list(range(1, 31))
    assert ours["loss"][:20] == theirs["loss"][:20]  # one process, as uninterrupted
    assert _max_difference(ours["loss"], theirs["loss"]) < EARLY_TOLERANCE
    assert state["val_curve"]["step"] == [25]  # rank 0 validated, once, at step 25
    assert abs(state["val_curve"]["loss"][0] - expected["state"]["val_curve"]["loss"][0]) < 1e-5
    # Looser for the parameters: where a gradient is near 0, AdamW's step (up to the learning
    # rate, 3e-3) depends on its rounding.
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(saved["model"][name], tensor, atol=1e-3, rtol=0)


# -- masked LM, dropout, and a planted bug ----------------------------------------------------

WORKER = [str(REPO / "tests" / "distributed_worker.py")]
PLANTED_STEPS = 20


def _two_process_curve(tmp_path, name: str, *args: str, steps: int = PLANTED_STEPS) -> list[float]:
    out = tmp_path / name
    _check(_torchrun(["--out", str(out), "--steps", str(steps), *args], WORKER))
    (checkpoint,) = (out / "checkpoints").glob("*.pt")
    return load_checkpoint(checkpoint)["state"]["train_curve"]["loss"]


def _shards_in_one_process_curve(tmp_path, *args: str, steps: int) -> list[float]:
    """The worker without torchrun, one process summing the gradients of 2 shards."""
    out = tmp_path / "shards-in-one-process"
    command = [sys.executable, *WORKER, "--out", str(out), "--steps", str(steps), *args,
               "--shards-in-one-process", "2"]  # fmt: skip
    _check(subprocess.run(command, cwd=REPO, env=_environment(), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT))  # fmt: skip
    (checkpoint,) = (out / "checkpoints").glob("*.pt")
    return load_checkpoint(checkpoint)["state"]["train_curve"]["loss"]


def _one_process_curve(tmp_path, arm: str, objective: str, dropout: float = 0.0) -> list[float]:
    preset = replace(TINY, probes=(), dropout=dropout)
    out = tmp_path / f"one-{arm}-{objective}-{dropout}"
    run_one(arm, objective, preset, out_dir=out, progress=False, stop_after_steps=PLANTED_STEPS)
    checkpoint = out / "checkpoints" / f"{objective}_{arm}_s0.pt"
    return load_checkpoint(checkpoint)["state"]["train_curve"]["loss"]


def test_masked_and_dropout_runs_match_one_process_and_a_planted_bug_does_not(tmp_path):
    mlm = ["--arm", "rope", "--objective", "mlm"]
    one = _one_process_curve(tmp_path, "rope", "mlm")
    two = _two_process_curve(tmp_path, "mlm", *mlm, steps=MLM_STEPS)
    assert _max_difference(one, two[:PLANTED_STEPS]) < EARLY_TOLERANCE
    # After about 30 steps the masked run's curve drifts from one process's (0.042 at step 58 of
    # the tiny run, measured; 2e-4 on the final validation loss). All of it is the order of the
    # sums: one process that adds the gradients of the same two shards follows the two
    # processes' curve bit for bit, to the last step.
    assert _shards_in_one_process_curve(tmp_path, *mlm, steps=MLM_STEPS) == two
    planted = _two_process_curve(tmp_path, "planted", *mlm, "--plant", "per-shard-mean")
    assert _max_difference(one, planted) > 10 * EARLY_TOLERANCE  # the tolerance catches it
    # dropout: the masks of row r are the same whichever process holds it
    dropout = ["--arm", "rope", "--objective", "clm", "--dropout", "0.1"]
    one = _one_process_curve(tmp_path, "rope", "clm", dropout=0.1)
    without = _one_process_curve(tmp_path, "rope", "clm")
    assert _max_difference(one, without) > 1e-3  # the dropout is really on
    two = _two_process_curve(tmp_path, "dropout", *dropout)
    assert _max_difference(one, two) < EARLY_TOLERANCE


# -- whole runs per process -------------------------------------------------------------------


def test_runs_mode_gives_each_process_whole_runs_equal_to_one_process(reference, tmp_path):
    _check(
        _torchrun(
            ["--preset", "tiny", "--encodings", "none", "rope", "--objectives", "clm"]
            + ["--out", str(tmp_path), "--parallel", "runs", "--stop-after-steps", "30"]
        )
    )
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert names == ["clm_none_s0.pt", "clm_rope_s0.pt"]
    for name in names:
        state = load_checkpoint(tmp_path / "checkpoints" / name)["state"]
        assert (state["step"], state["processes"]) == (30, [1])  # one process each
    assert json.loads((tmp_path / "sessions.json").read_text())[0]["parallel_mode"] == "runs"
    # A run of its own on one thread: exactly the numbers of one process.
    curve = load_checkpoint(tmp_path / "checkpoints" / "clm_none_s0.pt")["state"]["train_curve"]
    assert curve["loss"] == reference["curves"]["train"]["loss"][:30]


# -- failures ---------------------------------------------------------------------------------


def _workers(launcher: int) -> dict[int, int]:
    """``{rank: pid}`` of the worker processes of the torchrun process ``launcher`` (Linux)."""
    workers = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                workers[int(item[5:])] = int(entry.name)
    return workers


def _launch_and_wait_for_training(args: list[str], log: Path, checkpoint: Path):
    """Start a 2-process comparison (output to ``log``) and return it with its workers' pids
    once ``checkpoint`` exists (training has run 50 steps and goes on)."""
    with log.open("w") as sink:
        launch = subprocess.Popen(
            _command(args),
            cwd=REPO,
            env=_environment(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not checkpoint.exists():
        if launch.poll() is not None or time.monotonic() > deadline:
            os.killpg(launch.pid, signal.SIGKILL)
            pytest.fail(f"training never reached its first checkpoint:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    workers = _workers(launch.pid)
    assert sorted(workers) == [0, 1], workers
    return launch, workers


def _wait(launch: subprocess.Popen, seconds: float) -> int:
    try:
        return launch.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(launch.pid, signal.SIGKILL)
        launch.wait()
        pytest.fail(f"the launch was still running {seconds} s after a process was stopped")


# The cpu preset's first sweep run of mlm `none` (1000 steps) is still training when its first
# checkpoint appears.
LONG_RUN = ["--preset", "cpu", "--encodings", "none", "--ablations", "none", "--seeds", "0"]
LONG_RUN += ["--objectives", "mlm", "--no-figures"]
FIRST_RATE = PRESETS["cpu"].rates("mlm")[0]
LONG_CHECKPOINT = Path("checkpoints") / "sweep" / f"mlm_none_lr{FIRST_RATE:g}_s1000.pt"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in /proc")
def test_a_killed_process_fails_the_run_with_a_report_instead_of_hanging(tmp_path):
    log = tmp_path / "log.txt"
    launch, workers = _launch_and_wait_for_training(
        [*LONG_RUN, "--out", str(tmp_path)], log, tmp_path / LONG_CHECKPOINT
    )
    os.kill(workers[1], signal.SIGKILL)
    killed = time.monotonic()
    returncode = _wait(launch, 60)
    assert time.monotonic() - killed < 60
    assert returncode != 0
    text = log.read_text()
    # torchrun's report names the process that failed first, and how.
    assert "Root Cause" in text and "rank      : 1" in text and "SIGKILL" in text, text[-3000:]
    assert not list(tmp_path.rglob("mlm_*.json"))
    # The checkpoint the 2 processes left resumes in one process (the command run again).
    step = load_checkpoint(tmp_path / LONG_CHECKPOINT)["state"]["step"]
    assert step >= 50
    cpu = PRESETS["cpu"]
    run_sweep_one(
        "none", "mlm", FIRST_RATE, cpu, out_dir=tmp_path, progress=False,
        stop_after_steps=step + 2,
    )  # fmt: skip
    state = load_checkpoint(tmp_path / LONG_CHECKPOINT)["state"]
    assert (state["step"], state["processes"]) == (step + 2, [2, 1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in /proc")
def test_a_stalled_process_fails_the_run_after_the_timeout(tmp_path):
    timeout = 10
    log = tmp_path / "log.txt"
    launch, workers = _launch_and_wait_for_training(
        [*LONG_RUN, "--out", str(tmp_path), "--dist-timeout", str(timeout)],
        log,
        tmp_path / LONG_CHECKPOINT,
    )
    os.kill(workers[1], signal.SIGSTOP)  # alive, so torchrun sees nothing wrong, but silent
    stalled = time.monotonic()
    try:
        deadline = stalled + timeout + 60
        while Path(f"/proc/{workers[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        waited = time.monotonic() - stalled
    finally:
        os.kill(workers[1], signal.SIGCONT)  # lets torchrun's SIGTERM end it
    assert timeout - 1 < waited < timeout + 60, waited
    assert _wait(launch, 60) != 0
    text = log.read_text()
    assert "comparison failed on rank 0 of 2 (gloo, data mode): RuntimeError" in text, text[-3000:]
    assert f"--dist-timeout ({timeout:g} s)" in text


# -- one process ------------------------------------------------------------------------------


def test_without_torchrun_no_process_group_is_created(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = ["--preset", "tiny", "--encodings", "none", "--objectives", "clm"]
    args += ["--out", str(tmp_path), "--no-progress", "--stop-after-steps", "2"]
    assert main([*args, "--parallel", "runs"]) == 0
    assert not dist.is_initialized()
    assert "one process" in capsys.readouterr().err
    state = load_checkpoint(tmp_path / "checkpoints" / "clm_none_s0.pt")["state"]
    assert (state["step"], state["processes"]) == (2, [1])


def test_a_global_batch_is_split_in_equal_consecutive_shards():
    batch = torch.arange(16 * 3).view(16, 3)
    shards = [
        Processes(rank, 4, rank, "data", "gloo", torch.device("cpu"), 60.0).shard(batch)
        for rank in range(4)
    ]
    assert torch.equal(torch.cat(shards), batch) and all(len(s) == 4 for s in shards)
    with pytest.raises(ValueError, match="divides 16"):
        Processes(0, 3, 0, "data", "gloo", torch.device("cpu"), 60.0).shard(batch)
    seeds = {step_seed(seed, step) for step in range(100) for seed in range(8)}
    assert len(seeds) == 800  # every (seed, step) draws its own dropout masks


def test_results_say_how_many_processes_made_them():
    cpu = {"kind": "CPU", "cpu": "a CPU", "logical_cpus": 8, "torch_threads": 1}
    assert hardware_label(cpu) == "CPU: a CPU (8 logical cores, 1 torch thread)"
    data = dict(cpu, processes=4, parallel_mode="data", process_backend="gloo")
    assert hardware_label(data).endswith(", 4 processes (data parallel, gloo)")
    gpu = {"kind": "GPU", "gpu": "a GPU", "processes": 8, "parallel_mode": "runs"}
    assert hardware_label(dict(gpu, process_backend="gloo")) == (
        "GPU: a GPU, 8 processes (one run each, gloo)"
    )
