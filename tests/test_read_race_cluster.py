"""Reads that race with Slurm, on the real dev cluster: the sidecar's epoch reads the nodes
(``sinfo``) and then the jobs (``squeue``), and Slurm goes on between the two.  Whatever it did
there, a job the previous epoch placed is never taken for someone else's and stopped.

The race is made to happen, not waited for: a wrapper of the real API (every call goes to the
real Slurm) hands the epoch a nodes read taken at an earlier moment:

* **started between the reads**: the nodes read from before the placed jobs started (their
  GPUs free), the jobs read after (they run);
* **ended between the reads**: a job of ours ends after the nodes read (its GPUs still used
  there) and before the jobs read (it is gone);
* **started in part**: of the jobs one epoch placed, Slurm has started one (a ``preempt=never``
  job, which the sidecar may not stop) and not yet the others; the epoch must not re-plan those
  because one of them runs (it did, when such a job left the policy's view once it ran);

and the test checks the race did happen (the two reads disagree) before it checks that the
epoch neither holds, signals nor requeues any job the previous epoch placed, and places no job
twice.
"""

from __future__ import annotations

import time
from dataclasses import replace

from hadar_slurm.sidecar.config import load_config
from hadar_slurm.sidecar.controller import Sidecar, slurm_api
from hadar_slurm.sidecar.record import decode
from hadar_slurm.slurm import SlurmJob, SlurmNode
from hadar_slurm.slurm.api import PassThroughApi, SlurmApi
from tests.slurm_cluster import jobs, nodes_conf
from tests.test_sidecar_cluster import FINAL, Workdir, work

__all__ = ["work"]  # the fixture, imported for pytest

TOTAL_GPUS = sum(g for _, g in nodes_conf().values())
STOPS = ("hold", "signal", "requeue", "cancel_copies")


class StaleNodesApi(PassThroughApi):
    """The real API, except that the next nodes read is ``stale`` (taken earlier), once, and
    that the next jobs read shows the jobs of ``not_started`` as they were before Slurm
    started them (pending, with the record the sidecar wrote), once."""

    def __init__(self, inner: SlurmApi) -> None:
        super().__init__(inner)
        self.stale: list[SlurmNode] | None = None
        self.handed: list[SlurmNode] | None = None
        self.not_started: set[int] = set()

    def read_nodes(self) -> list[SlurmNode]:
        if self.stale is not None:
            self.handed, self.stale = self.stale, None
            return self.handed
        return self.inner.read_nodes()

    def read_jobs(self) -> list[SlurmJob]:
        out = self.inner.read_jobs()
        if self.not_started:
            out = [replace(j, state="PENDING", state_reason="None", nodes="", node_names=(),
                           start_time=None) if j.job_id in self.not_started else j for j in out]
            self.not_started = set()
        return out


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


# the bench's mix (bench/epoch_overhead.py): models whose best GPU types differ, 1 to 8 GPUs,
# none with a preempt hint (preempt=never: never stopped once they run)
MIX = (("model=resnet50 bs=64 steps=40000", 1), ("model=resnet50 bs=32 steps=20000", 2),
       ("model=resnet50 bs=128 steps=80000", 4), ("model=resnet18 bs=128 steps=30000", 2),
       ("model=transformer bs=32 steps=15000 sync=false", 1),
       ("model=transformer bs=128 steps=25000", 2), ("model=lm bs=20 steps=50000", 1),
       ("model=lm bs=80 steps=100000 weight=2", 4), ("model=recommendation bs=512 steps=9000", 1),
       ("model=recommendation bs=2048 steps=5000", 1), ("model=a3c steps=12000", 1),
       ("model=cyclegan steps=3000", 1), ("model=resnet18 bs=256 steps=60000", 8),
       ("model=lm bs=10 steps=40000", 2))


def test_jobs_placed_beside_one_that_started_are_not_replanned(work: Workdir) -> None:
    ids = [work.submit(f"mix{k}", 120, hints=f"hadar: {MIX[k % len(MIX)][0]}",
                       gres=f"gpu:{MIX[k % len(MIX)][1]}") for k in range(2 * len(MIX))]
    sidecar, api = start(work)
    try:
        before = api.inner.read_nodes()
        first = placed(epoch(sidecar))
        assert len(first) >= 3 and first <= set(ids)
        running = wait_running(work, first)
        # the widest of them started (the first to, at a tie), the others not yet: the nodes
        # read from before any started, the jobs read with the others still pending
        wide = max(sorted(first), key=lambda j: running[j].gpus_per_node
                   * len(running[j].node_names))
        api.stale = before
        api.not_started = first - {wide}
        applied = epoch(sidecar)
        assert api.handed is before and not api.not_started
        assert not [a for a in applied if a["action"] in STOPS and a["job"] in first], applied
        assert not placed(applied) & first
    finally:
        sidecar.close()


def test_a_requeued_job_keeps_its_arrival(work: Workdir) -> None:
    """Slurm sets a requeued job's SubmitTime to the time of the requeue (each move or
    preemption of the sidecar's is one): the job's arrival, in the policy's snapshot, stays the
    submit time the sidecar recorded on it before."""
    job_id = work.submit("requeued", 120, hints="hadar: model=a3c steps=100000")
    sidecar, _ = start(work)
    try:
        first = jobs(work.cluster)[job_id].submit_time
        assert first is not None
        assert placed(epoch(sidecar)) == {job_id}
        wait_running(work, {job_id})
        time.sleep(1.2)  # (SubmitTime is in whole seconds)
        record = decode(jobs(work.cluster)[job_id].admin_comment)
        assert record.submit == first  # (written with the placement)
        sidecar.backend.applier._requeue(job_id, record, sidecar.loop.epoch)  # as a preemption
        end = time.monotonic() + 60
        while (now := jobs(work.cluster)[job_id]).state != "PENDING":
            assert time.monotonic() < end, now.state
            time.sleep(0.3)
        end = time.monotonic() + 60
        while (now := jobs(work.cluster)[job_id]).submit_time == first:
            assert time.monotonic() < end, "Slurm kept the SubmitTime of a requeued job"
            time.sleep(0.3)
        assert now.submit_time is not None and now.submit_time > first
        snap = sidecar.backend.snapshot(sidecar.loop.epoch, time.time(), 60.0, None)
        assert snap.job_ids.tolist() == [job_id]
        assert snap.arrival.tolist() == [float(first)]
    finally:
        sidecar.close()
