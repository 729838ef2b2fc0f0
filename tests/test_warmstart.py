"""Warm starts of the emulated payload (hadar_slurm.runtime.warmstart): a payload started through
the server runs as ``python -m hadar_slurm.runtime.emulate`` would, in the client's directory,
with its environment and standard streams; the client passes its signals on, ends with the
payload's status, and takes the payload with it when it is killed; with no server it starts
cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hadar_slurm.runtime.config import EXIT_PREEMPTED
from hadar_slurm.runtime.warmstart import warm_server

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("warm")
    with warm_server(d / "sock", log=d / "server.log") as path:
        yield path


def _client(socket_path: str, cwd: Path, steps: int, *extra: str,
            env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    base = {**os.environ, "HADAR_RUN_ID": f"run{time.monotonic_ns()}", "HADAR_DEVICE": "cpu",
            "PYTHONPATH": str(REPO)}
    for k in ("SLURM_JOB_ID", "HADAR_COPY_GPU_TYPE", "HADAR_TRACKER_DIR", "HADAR_COPIES"):
        base.pop(k, None)
    return subprocess.Popen(
        [sys.executable, "-m", "hadar_slurm.runtime.warmstart", "run", socket_path, "--",
         "--job-type", "A3C", "--steps", str(steps), "--gpu-type", "k80", "--round-seconds",
         "1", "--compression", "50", *extra],
        cwd=cwd, env={**base, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def _progress(cwd: Path, job: str = "local") -> Path:
    return cwd / ".hadar-tracker" / job / "progress.json"


def _wait_progress(proc: subprocess.Popen[str], path: Path) -> int:
    end = time.monotonic() + 60
    while not (path.exists() and json.loads(path.read_text())["done"] > 0):
        assert time.monotonic() < end and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return int(json.loads(path.read_text())["done"])


def _pids_in(cwd: Path) -> list[int]:
    """Processes whose working directory is ``cwd`` (the payload runs there)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "cwd") == str(cwd):
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def test_a_warm_payload_runs_in_the_clients_directory_with_its_environment(
        server: str, tmp_path: Path) -> None:
    # the job id comes from the client's environment (SLURM_JOB_ID names the tracker's dir),
    # the output goes to the client's stdout, and the client ends with the payload's status
    proc = _client(server, tmp_path, 40, env={"SLURM_JOB_ID": "4242"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    assert "emulate: A3C on 1 GPU(s) of k80" in out and "done 40/40, ran 40" in out
    assert json.loads(_progress(tmp_path, "4242").read_text())["done"] == 40
    assert "starting cold" not in err


def test_the_preemption_signal_reaches_the_payload_which_saves_and_exits_75(
        server: str, tmp_path: Path) -> None:
    work = 1200  # (7 s at 172 steps/s)
    proc = _client(server, tmp_path, work)
    _wait_progress(proc, _progress(tmp_path))
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED, (out, err)
    assert "stopping (signal USR1)" in out
    saved = json.loads(_progress(tmp_path).read_text())["done"]
    assert 0 < saved < work
    # a second run resumes from it and does exactly the rest (through the server again)
    proc = _client(server, tmp_path, work)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"done {work}/{work}, ran {work - saved}" in out


def test_a_killed_client_takes_its_payload_with_it(server: str, tmp_path: Path) -> None:
    # Slurm cancels a job by killing its processes: the payload (a fork of the server, not in
    # the job) must end too, not go on training on GPUs the job no longer holds
    proc = _client(server, tmp_path, 100_000)
    _wait_progress(proc, _progress(tmp_path))
    payload = [p for p in _pids_in(tmp_path) if p != proc.pid]
    assert payload, "the payload runs in the client's directory"
    proc.kill()
    proc.communicate(timeout=30)
    end = time.monotonic() + 10
    while _pids_in(tmp_path):
        assert time.monotonic() < end, f"still running: {_pids_in(tmp_path)}"
        time.sleep(0.05)


def test_a_signal_during_the_restart_ends_the_start_at_once(server: str, tmp_path: Path) -> None:
    proc = _client(server, tmp_path, 1000, "--restart-s", "30")
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_PREEMPTED, (out, err)
    assert time.monotonic() - sent < 5.0
    assert not _progress(tmp_path).exists()


def test_with_no_server_it_starts_cold_and_says_so(tmp_path: Path) -> None:
    proc = _client(str(tmp_path / "nothing-here"), tmp_path, 20)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (out, err)
    assert "no warm-start server at" in err and "starting cold" in err
    assert "done 20/20" in out


def test_the_socket_is_the_servers_users_only(server: str) -> None:
    assert (os.stat(server).st_mode & 0o777) == 0o600
