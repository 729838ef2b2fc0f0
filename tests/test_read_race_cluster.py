"""Reads that race with Slurm, on the real dev cluster: the sidecar's epoch reads the nodes
(``sinfo``) and then the jobs (``squeue``), and Slurm goes on between the two.  Whatever it did
there, a job the previous epoch placed is never taken for someone else's and stopped.

The race is made to happen, not waited for: a wrapper of the real API (every call goes to the
real Slurm) hands the epoch a nodes read taken at an earlier moment:

* **started between the reads**: the nodes read from before the placed jobs started (their
  GPUs free), the jobs read after (they run);
* **ended between the reads**: a job of ours ends after the nodes read (its GPUs still used
  there) and before the jobs read (it is gone);

and the test checks the race did happen (the two reads disagree) before it checks that the
epoch neither holds, signals nor requeues any job the previous epoch placed, and places no job
twice.
"""

from __future__ import annotations

import time

from hadar_slurm.sidecar.config import load_config
from hadar_slurm.sidecar.controller import Sidecar, slurm_api
from hadar_slurm.slurm import SlurmJob, SlurmNode
from hadar_slurm.slurm.api import PassThroughApi, SlurmApi
from tests.slurm_cluster import jobs, nodes_conf
from tests.test_sidecar_cluster import FINAL, Workdir, work

__all__ = ["work"]  # the fixture, imported for pytest

TOTAL_GPUS = sum(g for _, g in nodes_conf().values())
STOPS = ("hold", "signal", "requeue", "cancel_copies")


class StaleNodesApi(PassThroughApi):
    """The real API, except that the next nodes read is ``stale`` (taken earlier), once."""

    def __init__(self, inner: SlurmApi) -> None:
        super().__init__(inner)
        self.stale: list[SlurmNode] | None = None
        self.handed: list[SlurmNode] | None = None

    def read_nodes(self) -> list[SlurmNode]:
        if self.stale is not None:
            self.handed, self.stale = self.stale, None
            return self.handed
        return self.inner.read_nodes()


def start(work: Workdir) -> tuple[Sidecar, StaleNodesApi]:
    log = work.path / "sidecar.log"
    path = work.path / "sidecar.toml"
    path.write_text(work.config.read_text().replace("@LOG@", str(log)))
    config = load_config(path)
    api = StaleNodesApi(slurm_api(config))
    sidecar = Sidecar(config, api=api)
    sidecar.backend.applier._sleep = lambda s: time.sleep(min(s, 0.2))
    sidecar.loop.epoch = sidecar.recover_epoch()
    return sidecar, api


def epoch(sidecar: Sidecar) -> list[dict[str, object]]:
    sidecar.loop.run_epoch(full=True)  # (a re-plan of every job, which could stop or hold)
    return list(sidecar.backend.stats.applied)


def wait_running(work: Workdir, ids: set[int], timeout: float = 60) -> dict[int, SlurmJob]:
    end = time.monotonic() + timeout
    while True:
        now = jobs(work.cluster)
        if all(now[j].state == "RUNNING" for j in ids):
            return now
        assert time.monotonic() < end, {j: now[j].state for j in ids}
        time.sleep(0.3)


def used(nodes: list[SlurmNode]) -> int:
    return sum(n.gpus_used for n in nodes if n.gpus > 0)


def placed(applied: list[dict[str, object]]) -> set[int]:
    return {int(a["job"]) for a in applied  # type: ignore[call-overload]
            if a["action"] in ("place", "start", "release")}


def test_jobs_started_between_the_reads_are_not_stopped(work: Workdir) -> None:
    # more jobs than GPUs: the policy fills the cluster, so a placed job taken for a foreign
    # one leaves too few GPUs for what it placed, and something would be stopped or held
    ids = [work.submit(f"race{k}", 120, hints="hadar: model=a3c steps=100000")
           for k in range(TOTAL_GPUS + 4)]
    sidecar, api = start(work)
    try:
        before = api.inner.read_nodes()
        assert used(before) == 0
        first = placed(epoch(sidecar))
        assert first and first <= set(ids)
        running = wait_running(work, first)
        api.stale = before  # the nodes read of before they started; the jobs read after
        applied = epoch(sidecar)
        assert api.handed is before
        assert used(api.inner.read_nodes()) > 0  # the race happened: the reads disagree
        assert not [a for a in applied if a["action"] in STOPS and a["job"] in first], applied
        assert not placed(applied) & first  # nothing placed twice
        # Slurm agrees: every job the first epoch placed still runs where it started
        now = jobs(work.cluster)
        assert {j: now[j].node_names for j in first} == {
            j: running[j].node_names for j in first}
    finally:
        sidecar.close()


def test_a_job_that_ended_between_the_reads_frees_its_gpus_only(work: Workdir) -> None:
    short = work.submit("race-short", 4, hints="hadar: model=a3c steps=100")
    longs = [work.submit(f"race-long{k}", 120, hints="hadar: model=a3c steps=100000")
             for k in range(TOTAL_GPUS - 1)]
    sidecar, api = start(work)
    try:
        first = placed(epoch(sidecar))
        assert short in first
        wait_running(work, first)
        stale = api.inner.read_nodes()  # the short job still holds its GPU here
        assert used(stale) == len(first)
        end = time.monotonic() + 60
        while jobs(work.cluster)[short].state not in FINAL:
            assert time.monotonic() < end
            time.sleep(0.3)
        api.stale = stale  # nodes read with the short job, jobs read without it
        applied = epoch(sidecar)
        assert api.handed is stale
        assert not [a for a in applied if a["action"] in STOPS and a["job"] in first], applied
        assert not placed(applied) & first
        # its GPU is free again: a job that waited may be placed there, nothing else moves
        assert placed(applied) <= set(longs) - first
    finally:
        sidecar.close()
