"""Nothing a user writes reaches the shared throughput store unchecked (issue #11, item 3).

A job's ``progress.json`` is written by the user's own script; the sidecar learns rates from it
that plan every user's jobs.  These tests forge it the way a user could, write it where the
runtime would (the job's working directory), and run the real backend over a fake Slurm (the
real store, the real Knowledge): a forged report must move neither the store nor the table the
policy plans with, across epochs and restarts, while honest jobs still teach the true rate.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.rates.learn import LEARN_FACTOR, Knowledge
from hadar_slurm.rates.store import ThroughputStore
from hadar_slurm.rates.table import ThroughputTable, default_table
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.fork import CopyGroup, read_progress
from tests.test_sidecar_backend import FakeSlurm, job, node

RESNET = "ResNet-50 (batch size 64)"
NOW = 1_000_000.0
#: Slurm started the jobs this long before NOW
RAN_S = 3600.0
BASE = default_table()
PRIOR_V100 = BASE.rate(RESNET, 1, "v100")
PRIOR_K80 = BASE.rate(RESNET, 1, "k80")
NODES = [node("n1", "v100", 4), node("n2", "k80", 4)]


def write_progress(workdir: Path, job_id: int, rounds: int, iters: float, seconds: float, *,
                   gpu_type: str | None = None, updated_at: float = NOW - 1.0,
                   run: str = "1.0", done: float = 1e8) -> None:
    """``progress.json`` of an unforked job in the runtime's format (format 1), as a user's
    script may write it: the last round's ``iters`` in ``seconds``."""
    tracker = workdir / ".hadar-tracker" / str(job_id)
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "progress.json").write_text(json.dumps({
        "format": 1, "done": done, "work": 1e9, "rounds": rounds, "copies": 1,
        "copy_rates": [{"copy": 0, "gpu_type": gpu_type, "iters": iters, "seconds": seconds,
                        "iters_per_s": iters / seconds}],
        "complete": False, "run": run, "run_rounds": rounds, "updated_at": updated_at}))


@dataclass
class Cluster:
    """A fake Slurm with running hadar jobs, the real store and the real backend over it."""

    tmp: Path
    store: ThroughputStore
    backend: SlurmBackend
    epoch: int = 0

    def run(self, job_id: int, node_name: str, *, started: float = NOW - RAN_S) -> Path:
        """Job ``job_id`` runs on ``node_name`` (as Slurm says); returns its working dir."""
        workdir = self.tmp / f"work{job_id}"
        workdir.mkdir(exist_ok=True)
        api = self.backend.api
        assert isinstance(api, FakeSlurm)
        api.jobs[job_id] = replace(
            job(job_id, state="RUNNING", reason="None", nodes=(node_name,),
                start=int(started), admin=f"hadar epoch=0 state=placed place={node_name}:1"),
            workdir=str(workdir))
        return workdir

    def epoch_at(self, now: float = NOW) -> ThroughputTable:
        """One epoch's read (the backend learns while it reads); the table it planned with."""
        self.backend.snapshot(self.epoch, now, 60.0, None)
        self.epoch += 1
        return self.backend.table

    def planned(self, gpu_type: str) -> float:
        """The rate the next epoch plans ResNet-50 on one ``gpu_type`` GPU with."""
        return self.epoch_at().rate(RESNET, 1, gpu_type)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with ThroughputStore(tmp_path / "t.db") as store:
        api = FakeSlurm([], list(NODES))
        backend = SlurmBackend(api, BASE, preempt_grace_s=5.0, sleep=lambda s: None,
                               knowledge=Knowledge(BASE, store))
        yield Cluster(tmp_path, store, backend)


def observations(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM observation").fetchone()[0])
    finally:
        conn.close()


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    return [dict(getattr(r, "hadar_fields", {})) for r in caplog.records
            if r.getMessage() == name]


# -- one forged report ---------------------------------------------------------------------------


def test_one_forged_round_of_1e6_moves_nothing(cluster: Cluster,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hadar_slurm.sidecar")
    workdir = cluster.run(5, "n2")  # on a k80, as Slurm says
    write_progress(workdir, 5, 2, 1e6 * 10, 10.0)
    assert cluster.planned("k80") == pytest.approx(PRIOR_K80)
    assert cluster.store.get(RESNET, 1, "k80") is None
    assert cluster.planned("k80") == pytest.approx(PRIOR_K80)  # nor the epoch after
    [rejected] = events(caplog, "learn_rejected")
    assert rejected["job"] == 5 and rejected["gpu_type"] == "k80"
    assert "prior" in str(rejected["why"])
    assert events(caplog, "learned") == []
    assert observations(cluster.store.path) == 0  # nothing of it was stored


def test_one_job_forging_for_many_rounds_moves_nothing_and_is_logged_once(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hadar_slurm.sidecar")
    workdir = cluster.run(5, "n2")
    for rounds in range(2, 60):
        write_progress(workdir, 5, rounds, 1e6 * 10, 10.0)
        assert cluster.planned("k80") == pytest.approx(PRIOR_K80)
    assert cluster.store.entries() == [] or all(
        e.source == "estimated" for e in cluster.store.entries())
    assert len(events(caplog, "learn_rejected")) == 1  # once per job, not per round


def test_one_job_alone_cannot_set_a_rate_even_within_the_bounds(cluster: Cluster) -> None:
    # 3.5x the prior is within LEARN_FACTOR: a plausible rate, but one job's say only
    lie = 3.5 * PRIOR_V100
    assert lie < LEARN_FACTOR * PRIOR_V100
    workdir = cluster.run(5, "n1")
    for rounds in range(2, 60):
        write_progress(workdir, 5, rounds, lie * 10, 10.0)
        assert cluster.planned("v100") == pytest.approx(PRIOR_V100)
    assert cluster.store.get(RESNET, 1, "v100") is None


# -- reports that do not fit what Slurm says -------------------------------------------------


@pytest.mark.parametrize(("claim", "why"), [
    # the report names a GPU type Slurm does not run the job on (it runs on a v100)
    ({"gpu_type": "k80", "iters": 2 * PRIOR_K80 * 10, "seconds": 10.0}, "Slurm runs it on"),
    # a round longer than Slurm has run the job
    ({"iters": 2 * PRIOR_V100 * 2 * RAN_S, "seconds": 2 * RAN_S}, "does not fit"),
    # a report dated in the future
    ({"iters": 2 * PRIOR_V100 * 10, "seconds": 10.0, "updated_at": NOW + 3600}, "future"),
    # more iterations in one round than the job has done in all
    ({"iters": 2 * PRIOR_V100 * 10, "seconds": 10.0, "done": 10.0}, "done"),
])
def test_a_report_that_does_not_fit_slurm_is_dropped(
        tmp_path: Path, claim: dict[str, Any], why: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hadar_slurm.sidecar")
    with ThroughputStore(tmp_path / "t.db") as store:
        backend = SlurmBackend(FakeSlurm([], list(NODES)), BASE, preempt_grace_s=5.0,
                               sleep=lambda s: None, knowledge=Knowledge(BASE, store))
        c = Cluster(tmp_path, store, backend)
        # three jobs (a quorum) report the same: without the check against Slurm they would
        # set the rate
        for j in (5, 6, 7):
            workdir = c.run(j, "n1")
            for rounds in (2, 3):
                write_progress(workdir, j, rounds, **claim)
                c.epoch_at()
        assert c.planned("k80") == pytest.approx(PRIOR_K80)
        assert c.planned("v100") == pytest.approx(PRIOR_V100)
        assert [e for e in store.entries() if e.source != "estimated"] == []
        rejected = events(caplog, "learn_rejected")
        assert {e["job"] for e in rejected} == {5, 6, 7} and len(rejected) == 3
        assert all(why in str(e["why"]) for e in rejected), rejected
        assert observations(store.path) == 0


# -- honest jobs still teach -------------------------------------------------------------------


def test_honest_jobs_learn_the_true_rate_despite_a_liar_with_more_rounds(
        cluster: Cluster) -> None:
    true = 1.5 * PRIOR_V100
    lie = 3.9 * PRIOR_V100  # within the bounds
    honest = {j: cluster.run(j, "n1") for j in (5, 6)}
    liar = cluster.run(9, "n1")
    for rounds in range(2, 14):
        write_progress(liar, 9, rounds, lie * 10, 10.0)  # a round every epoch
        if rounds % 3 == 0:  # the honest jobs' rounds are longer
            for j, workdir in honest.items():
                write_progress(workdir, j, rounds // 3 + 1, true * 30 * (1 + 0.01 * j), 30.0)
        cluster.epoch_at()
    entry = cluster.store.get(RESNET, 1, "v100")
    assert entry is not None and entry.source == "learned"
    # votes: the prior, two honest jobs, one liar: the honest rate, not the liar's
    assert entry.rate == pytest.approx(
        statistics.median([PRIOR_V100, 1.05 * true, 1.06 * true, lie]))
    assert entry.rate == pytest.approx(true, rel=0.07)
    assert cluster.planned("v100") == pytest.approx(entry.rate)
    assert cluster.backend.knowledge.source(RESNET, 1, "v100") == "learned"


# -- what is stored, across restarts -----------------------------------------------------------


def test_a_learned_value_out_of_bounds_from_an_old_version_is_ignored(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hadar_slurm.sidecar")
    path = tmp_path / "t.db"
    # the old schema, as hadar-slurm before per-job observations wrote it, poisoned by one job
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE entry (job_type TEXT NOT NULL, scale_factor INTEGER NOT NULL,
            gpu_type TEXT NOT NULL, rate REAL NOT NULL, source TEXT NOT NULL,
            samples INTEGER NOT NULL, updated REAL NOT NULL,
            PRIMARY KEY (job_type, scale_factor, gpu_type));
        CREATE TABLE observation (job_type TEXT NOT NULL, scale_factor INTEGER NOT NULL,
            gpu_type TEXT NOT NULL, seq INTEGER NOT NULL, rate REAL NOT NULL,
            seen REAL NOT NULL, PRIMARY KEY (job_type, scale_factor, gpu_type, seq));
        PRAGMA user_version = 1;
    """)
    conn.execute("INSERT INTO entry VALUES (?, 1, 'k80', 1e6, 'learned', 1, 5.0)", (RESNET,))
    conn.execute("INSERT INTO observation VALUES (?, 1, 'k80', 0, 1e6, 5.0)", (RESNET,))
    conn.commit()
    conn.close()
    with ThroughputStore(path) as store:
        assert observations(path) == 0  # the unattributed, unchecked window is dropped
        k = Knowledge(BASE, store, gpu_types=("v100", "k80"))
        assert k.table.rate(RESNET, 1, "k80") == pytest.approx(PRIOR_K80)
        assert k.source(RESNET, 1, "k80") == "table"
        [ignored] = events(caplog, "learned_ignored")
        assert ignored["gpu_type"] == "k80" and ignored["rate"] == 1e6
        # the entry is kept (an admin may look at it), not planned with
        entry = store.get(RESNET, 1, "k80")
        assert entry is not None and entry.rate == 1e6
        # a learned value within the bounds is planned with
        store.learn(RESNET, 1, "v100", 2.0 * PRIOR_V100)
        k.refresh()
        assert k.table.rate(RESNET, 1, "v100") == pytest.approx(2.0 * PRIOR_V100)


def test_nothing_rejected_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with ThroughputStore(path) as store:
        c = Cluster(tmp_path, store, SlurmBackend(
            FakeSlurm([], list(NODES)), BASE, preempt_grace_s=5.0, sleep=lambda s: None,
            knowledge=Knowledge(BASE, store)))
        workdir = c.run(5, "n2")
        for rounds in range(2, 10):
            write_progress(workdir, 5, rounds, 1e6 * 10, 10.0)
            c.epoch_at()
    assert observations(path) == 0
    with ThroughputStore(path) as store:  # the sidecar restarted
        k = Knowledge(BASE, store, gpu_types=("v100", "k80"))
        assert k.table.rate(RESNET, 1, "k80") == pytest.approx(PRIOR_K80)
        assert [e for e in store.entries() if e.source != "estimated"] == []


def test_a_measured_value_a_learned_rate_replaced_still_bounds_it(tmp_path: Path) -> None:
    # the admin measured 6x the base table (beyond LEARN_FACTOR of it): learning from that
    # measurement is bounded by the measurement, also after a learned rate took its place
    measured = 6.0 * PRIOR_V100
    with ThroughputStore(tmp_path / "t.db") as store:
        store.record(RESNET, 1, "v100", measured)
        backend = SlurmBackend(FakeSlurm([], list(NODES)), BASE, preempt_grace_s=5.0,
                               sleep=lambda s: None, knowledge=Knowledge(BASE, store))
        c = Cluster(tmp_path, store, backend)
        for j in (5, 6, 7):
            write_progress(c.run(j, "n1"), j, 2, 1.1 * measured * 10, 10.0)
        c.epoch_at()
        entry = store.get(RESNET, 1, "v100")
        assert entry is not None and entry.source == "learned"
        assert store.anchors() == {(RESNET, 1, "v100"): (measured, "measured")}
        assert c.planned("v100") == pytest.approx(entry.rate)
        assert entry.rate == pytest.approx(1.1 * measured)


def test_a_report_left_by_an_earlier_run_is_passed_over_quietly(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    # the job was requeued 60 s ago: its progress.json is still the last run's (honest, but
    # not this run's), so it is neither learned from nor reported as a forgery
    caplog.set_level(logging.INFO, logger="hadar_slurm.sidecar")
    workdir = cluster.run(5, "n1", started=NOW - 60)
    write_progress(workdir, 5, 7, 2 * PRIOR_V100 * 10, 10.0, updated_at=NOW - 600, run="1.0")
    cluster.epoch_at()
    assert events(caplog, "learn_rejected") == [] and events(caplog, "learned") == []
    # the new run's rounds are
    write_progress(workdir, 5, 9, 2 * PRIOR_V100 * 10, 10.0, updated_at=NOW - 5, run="1.1")
    cluster.epoch_at()
    assert [e["job"] for e in events(caplog, "learned")] == [5]
    assert observations(cluster.store.path) == 1


def test_a_forks_copies_are_checked_against_their_own_components(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """The backend tells the knowledge, per copy, the GPU type of the node its component runs
    on and when that component started: a copy that reports another type, or one whose
    component does not run, is not learned from."""
    caplog.set_level(logging.INFO, logger="hadar_slurm.sidecar")
    cluster.epoch_at()  # reads the nodes
    original = replace(job(5, state="PENDING", reason="Dependency"), workdir=str(cluster.tmp))
    parts = []
    for k, (node_name, state) in enumerate([("n1", "RUNNING"), ("n2", "RUNNING"),
                                            ("n1", "PENDING")]):
        parts.append(replace(
            job(40 + k, state=state, reason="None", nodes=(node_name,) if state == "RUNNING"
                else (), start=int(NOW - RAN_S), comment="hadar-copy-of=5"),
            het_job_id=40, het_job_offset=k))
    group = CopyGroup(5, 40, tuple(parts))
    tracker = cluster.tmp / "fork"
    tracker.mkdir()
    (tracker / "progress.json").write_text(json.dumps({
        "format": 1, "done": 1e6, "work": 1e9, "rounds": 3, "copies": 3, "run": "40.0",
        "run_rounds": 2, "updated_at": NOW - 1, "complete": False,
        "copy_rates": [
            # on the v100 of n1, as Slurm says
            {"copy": 0, "gpu_type": "v100", "iters": 2 * PRIOR_V100 * 10, "seconds": 10.0},
            # runs on the k80 of n2 but says v100 (a v100's plausible rate)
            {"copy": 1, "gpu_type": "v100", "iters": 2 * PRIOR_V100 * 10, "seconds": 10.0},
            # its component has not started
            {"copy": 2, "gpu_type": "v100", "iters": 2 * PRIOR_V100 * 10, "seconds": 10.0}]}))
    progress = read_progress(str(tracker))
    assert progress is not None
    cluster.backend._learn(original, RESNET, 1, NOW, group, str(tracker), progress)
    learned = events(caplog, "learned")
    assert [(e["job"], e["gpu_type"]) for e in learned] == [(5, "v100")]
    [rejected] = events(caplog, "learn_rejected")  # the first of the job's bad copies
    assert rejected["gpu_type"] == "k80" and "Slurm runs it on k80" in str(rejected["why"])
    assert cluster.backend.knowledge.rejected == 2
