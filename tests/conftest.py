"""Shared fixtures (on the helpers of tests/helpers.py) and the real-cluster session summary."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from hadar_slurm.rates.table import ThroughputTable, parse_csv
from hadar_slurm.slurm import commands
from tests.helpers import TOY_CSV, trace_text
from tests.slurm_cluster import SESSION, SHARDS_PER_GPU, DevCluster, start_dev_cluster


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


# ---------------------------------------------------------------- the real-cluster tests
# Every test that uses the dev cluster (directly or through another fixture) is marked `slurm`:
# `pytest -m slurm` runs just those (as `make test` does on each newer Slurm release, in its
# chroot), and the session ends with one line saying how many ran on which Slurm; with
# HADAR_SLURM_SUMMARY=FILE it also writes that as JSON.

_SLURM_OUTCOMES: Counter[str] = Counter()
_SLURM_SECONDS = [0.0]


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM or SIGHUP ends the session as Ctrl-C does: pytest then tears its fixtures down,
    so that the dev cluster's daemons (munged, slurmctld, slurmd) and any warm-start server
    stop with it instead of outliving a killed run (``timeout``, a CI job cancelled)."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _interrupt)
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


@pytest.fixture(scope="session")
def shard_cluster(dev_cluster: DevCluster) -> Iterator[DevCluster]:
    """A second real cluster whose GPUs are also shards (``SHARDS_PER_GPU`` each), for the GPU
    sharing tests; started beside ``dev_cluster`` (which it asks for, so that its tests count
    as real-cluster ones) the first time a test needs it, always stopped."""
    yield from start_dev_cluster(shards=SHARDS_PER_GPU)


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
