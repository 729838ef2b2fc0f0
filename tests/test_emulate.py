"""The emulated training job (hadar_slurm.runtime.emulate): its pace follows the throughput
table for its GPU type, scaled by the compression; it finds its GPU type from Slurm's node
records; it runs through the real runtime, so a preemption signal saves its progress (exit 75)
and a second run finishes the work exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.rates.table import default_table
from hadar_slurm.runtime.emulate import Pace, emulated_rate, node_gpu_types
from hadar_slurm.slurm.runner import CommandResult

REPO = Path(__file__).resolve().parent.parent
TABLE = default_table()


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_pace_keeps_the_rate_without_catching_up_after_a_stall() -> None:
    clock = FakeClock()
    pace = Pace(50.0, clock=clock, sleep=clock.sleep)
    for _ in range(100):
        pace.step()
        clock.t += 0.001  # the work of one iteration
    assert clock.t - 100.0 == pytest.approx(100 / 50.0, abs=0.03)
    clock.t += 10.0  # stalled (e.g. a checkpoint): the next steps are not run faster
    before = clock.t
    for _ in range(50):
        pace.step()
        clock.t += 0.001
    assert clock.t - before == pytest.approx(50 / 50.0, abs=0.05)
    with pytest.raises(ValueError):
        Pace(0.0)


def test_rate_is_the_tables_for_the_slowest_type() -> None:
    rn = "ResNet-50 (batch size 64)"
    assert emulated_rate(TABLE, rn, 2, ["v100"]) == TABLE.rate(rn, 2, "v100")
    assert emulated_rate(TABLE, rn, 2, ["v100", "k80"]) == TABLE.rate(rn, 2, "k80")
    with pytest.raises(InputError, match=r"--job-type.*no rate for 'A3C' on 2 GPU\(s\) of type "
                                         r"v100"):
        emulated_rate(TABLE, "A3C", 2, ["v100"])


class FakeRunner:
    """``scontrol show node NAME`` answered from captured records (a parser test)."""

    def __init__(self, records: dict[str, str]) -> None:
        self.records = records
        self.calls: list[list[str]] = []

    def run(self, argv: list[str]) -> CommandResult:
        self.calls.append(argv)
        return CommandResult(tuple(argv), 0, self.records[argv[-1]], "")


NODE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1\n   CPUAlloc=0 CPUTot=4\n"
        "   Gres=gpu:{gpu}:4(S:0)\n   State=IDLE ThreadsPerCore=1\n")


def test_gpu_types_come_from_the_jobs_nodes() -> None:
    runner = FakeRunner({"node1": NODE.format(name="node1", gpu="v100"),
                         "node2": NODE.format(name="node2", gpu="k80"),
                         "node3": NODE.format(name="node3", gpu="v100")})
    env = {"SLURM_JOB_NODELIST": "node[1-3]"}
    assert node_gpu_types(env, runner) == ["v100", "k80"]  # type: ignore[arg-type]
    assert [c[-1] for c in runner.calls] == ["node1", "node2", "node3"]
    with pytest.raises(InputError, match="--gpu-type"):
        node_gpu_types({}, runner)  # type: ignore[arg-type]
    untyped = FakeRunner({"n": NODE.format(name="n", gpu="4").replace("gpu:4:4", "gpu:4")})
    with pytest.raises(InputError, match="no typed gpu GRES"):
        node_gpu_types({"SLURM_JOB_NODELIST": "n"}, untyped)  # type: ignore[arg-type]


def _emulate(tmp_path: Path, steps: int, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HADAR_RUN_ID": f"run{time.monotonic_ns()}", "HADAR_DEVICE": "cpu",
           "PYTHONPATH": str(REPO)}
    for k in ("SLURM_JOB_ID", "HADAR_COPY_GPU_TYPE", "HADAR_TRACKER_DIR", "HADAR_COPIES"):
        env.pop(k, None)
    return subprocess.Popen(
        [sys.executable, "-m", "hadar_slurm.runtime.emulate", "--job-type", "A3C",
         "--steps", str(steps), "--gpu-type", "k80", "--round-seconds", "1", *extra],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_it_runs_through_the_runtime_at_the_tables_pace_and_resumes(tmp_path: Path) -> None:
    # A3C on a k80: 3.439 steps/s; 50x: 172 steps/s, so 1,000 steps take at least 5.8 s
    rate = TABLE.rate("A3C", 1, "k80") * 50
    work = 1000
    proc = _emulate(tmp_path, work, "--compression", "50")
    progress = tmp_path / ".hadar-tracker" / "local" / "progress.json"
    end = time.monotonic() + 60
    while not (progress.exists() and json.loads(progress.read_text())["done"] > 0):
        assert time.monotonic() < end and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert f"{rate:.3f} steps/s (50x)" in out
    saved = json.loads(progress.read_text())["done"]
    assert 0 < saved < work
    # the second run starts from what the first saved and does the rest, exactly
    t0 = time.monotonic()
    proc = _emulate(tmp_path, work, "--compression", "50")
    out, err = proc.communicate(timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, err
    assert f"done {work}/{work}, ran {work - saved}" in out
    assert elapsed >= (work - saved) / rate  # (never faster than the table; slower: startup)


def _loading_torch(pid: int) -> bool:
    """Whether process ``pid`` has begun to map torch's libraries (its import is under way)."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_a_signal_while_it_starts_stops_it_as_a_preemption(tmp_path: Path) -> None:
    # A job moved right after it started gets the checkpoint signal while torch loads: it
    # must exit 75 (requeued, nothing lost), not die of the signal (exit 138 in Slurm).
    proc = _emulate(tmp_path, 1000, "--compression", "50")
    end = time.monotonic() + 30
    while not _loading_torch(proc.pid):
        assert time.monotonic() < end and proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, (out, err)
    progress = tmp_path / ".hadar-tracker" / "local" / "progress.json"
    assert not progress.exists() or json.loads(progress.read_text())["done"] < 1000


def test_a_signal_before_the_runtime_has_the_signals_ends_the_process_at_once() -> None:
    # (what the handler of a signal while Python and torch load does: exit EXIT_PREEMPTED
    # there, not once the imports are done, seconds later on a loaded node)
    from hadar_slurm.runtime.config import EXIT_PREEMPTED
    proc = subprocess.run(
        [sys.executable, "-c", "import hadar_slurm.runtime.emulate as e; e._stop_early(10, None);"
         " print('went on')"], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == EXIT_PREEMPTED
    assert proc.stdout == "emulate: stopped by signal 10 before it started\n"


def test_its_restart_lasts_restart_s_from_the_process_start_and_a_signal_ends_it(
        tmp_path: Path) -> None:
    # --restart-s 6: nothing before 6 s after the start (torch's start is part of it)
    t0 = time.monotonic()
    proc = _emulate(tmp_path, 1, "--compression", "50", "--restart-s", "6")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "done 1/1" in out and time.monotonic() - t0 >= 6.0
    # a signal during the restart stops it there (exit 75, nothing done), not 6 s later
    second = tmp_path / "second"
    second.mkdir()
    proc = _emulate(second, 1000, "--compression", "50", "--restart-s", "30")
    end = time.monotonic() + 30
    while not _loading_torch(proc.pid):
        assert time.monotonic() < end and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(3.0)  # (torch has loaded by now: the restart's wait is on)
    sent = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, (out, err)
    assert time.monotonic() - sent < 5.0
    assert not (second / ".hadar-tracker" / "local" / "progress.json").exists()


def test_a_signal_after_the_work_is_done_does_not_fail_the_job(tmp_path: Path) -> None:
    # The sidecar may move a job that has just finished (it does not know yet): a preemption
    # signal while Python and torch shut down must not kill it (exit 138, FAILED)
    proc = _emulate(tmp_path, 1, "--compression", "50")
    assert proc.stdout is not None
    end = time.monotonic() + 60
    while "done 1/1" not in proc.stdout.readline():
        assert time.monotonic() < end and proc.poll() is None
    while proc.poll() is None:  # (the shutdown's every moment)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.002)
    assert proc.returncode == 0
