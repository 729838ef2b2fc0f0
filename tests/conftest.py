"""Shared helpers: tiny traces and throughput tables whose numbers are easy to work by hand."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from hadar_slurm.model import Job
from hadar_slurm.rates.table import ThroughputTable, parse_csv
from hadar_slurm.slurm import commands
from tests.slurm_cluster import SESSION, DevCluster, start_dev_cluster

REPO = Path(__file__).resolve().parent.parent

# "toy" runs at 1 step/s on a v100 and 0.5 step/s on a k80; "toy2" is a 2-GPU job at 2 steps/s
# (whole job) on v100; "v100only" has no k80 rate.
TOY_CSV = """\
# job_type,scale_factor,gpu_type,steps_per_second
job_type,scale_factor,gpu_type,steps_per_second
toy,1,v100,1.0
toy,1,k80,0.5
toy2,2,v100,2.0
v100only,1,v100,1.0
"""


def trace_line(
    job_type: str, steps: float, arrival: float, *, scale: int = 1, weight: float = 1.0,
    slo: float = -1.0,
) -> str:
    """One line of a Gavel-format trace (10 TAB-separated fields)."""
    cols = [
        job_type, "python3 train.py", "toy", "--steps", "0",
        f"{steps:g}", str(scale), f"{weight:g}", f"{slo:f}", f"{arrival:g}",
    ]
    return "\t".join(cols)


def trace_text(lines: Sequence[str]) -> str:
    return "".join(line + "\n" for line in lines)


@pytest.fixture
def toy_table() -> ThroughputTable:
    return parse_csv(TOY_CSV, "toy.csv")


@pytest.fixture
def toy_csv(tmp_path: Path) -> Path:
    path = tmp_path / "toy.csv"
    path.write_text(TOY_CSV)
    return path


@pytest.fixture
def write_trace(tmp_path: Path) -> Callable[[Sequence[str]], Path]:
    def write(lines: Sequence[str], name: str = "jobs.trace") -> Path:
        path = tmp_path / name
        path.write_text(trace_text(lines))
        return path

    return write


def make_job(job_id: int, steps: float, arrival: float, job_type: str = "toy",
             scale: int = 1) -> Job:
    return Job(job_id=job_id, job_type=job_type, scale_factor=scale, total_steps=steps,
               arrival_s=arrival)


def run_cli(
    *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``python -m hadar_slurm ARGS`` in a subprocess, as a user would run it (``env``: more
    environment variables)."""
    full = dict(os.environ)
    full["PYTHONPATH"] = str(REPO) + os.pathsep + full.get("PYTHONPATH", "")
    full["MPLBACKEND"] = "Agg"
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hadar_slurm", *args], capture_output=True, text=True,
        cwd=cwd, env=full, timeout=timeout, check=False,
    )


# ---------------------------------------------------------------- the real-cluster tests
# Every test that uses the dev cluster (directly or through another fixture) is marked `slurm`:
# `pytest -m slurm` runs just those (as `make test` does on each newer Slurm release, in its
# chroot), and the session ends with one line saying how many ran on which Slurm; with
# HADAR_SLURM_SUMMARY=FILE it also writes that as JSON.

_SLURM_OUTCOMES: Counter[str] = Counter()
_SLURM_SECONDS = [0.0]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: runs against the real Slurm dev cluster (set on every test that uses "
        "the dev_cluster fixture)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "dev_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slurm" not in report.keywords:
        return
    _SLURM_SECONDS[0] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _SLURM_OUTCOMES[report.outcome] += 1
    elif report.when == "teardown" and report.outcome == "failed":
        _SLURM_OUTCOMES["error"] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ran = sum(_SLURM_OUTCOMES.values())
    if not ran:
        return
    summary = {"slurm": SESSION["slurm"] or "not started", "ran": ran,
               "passed": _SLURM_OUTCOMES["passed"], "failed": _SLURM_OUTCOMES["failed"],
               "errors": _SLURM_OUTCOMES["error"], "skipped": _SLURM_OUTCOMES["skipped"],
               "seconds": round(_SLURM_SECONDS[0], 1)}
    terminalreporter.write_line(
        f"real-cluster tests on Slurm {summary['slurm']}: {ran} ran, {summary['passed']} passed, "
        f"{summary['failed']} failed, {summary['errors']} errors, {summary['skipped']} skipped "
        f"({summary['seconds']:.0f} s)")
    out = os.environ.get("HADAR_SLURM_SUMMARY")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(summary) + "\n")


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    """A real Slurm cluster (slurm_conf/dev-cluster.sh), one per test session, always stopped."""
    yield from start_dev_cluster()


@pytest.fixture
def submitted(dev_cluster: DevCluster) -> Iterator[list[int]]:
    """Job ids a test submitted to the dev cluster; whatever of them is still queued at the end
    is cancelled."""
    ids: list[int] = []
    yield ids
    if ids:
        dev_cluster.runner.run(commands.scancel(ids), check=False)


@pytest.fixture
def clean_logger() -> Iterator[None]:
    """Leaves the "hadar_slurm" logger as it found it (setup_logging adds handlers to it)."""
    yield
    logger = logging.getLogger("hadar_slurm")
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    logger.propagate = True
    logger.setLevel(logging.NOTSET)
