"""Unit tests of the sidecar's Slurm backend and its records, over an in-memory SlurmApi.

The fake below is a stand-in for Slurm in fast tests of the reconciliation logic (which
command for which difference); tests/test_sidecar_cluster.py runs the same code against a
real Slurm.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hadar_slurm.loop import Change, ChangeKind, EpochLoop, SimClock
from hadar_slurm.policy.base import Decision, Placement, Reason, Snapshot
from hadar_slurm.rates.table import default_table
from hadar_slurm.sidecar import fork as hadare
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.observe import MAX_RELAUNCH, launch_failed_text
from hadar_slurm.sidecar.record import JobRecord, decode
from hadar_slurm.slurm import RunAs, SlurmCommandError, SlurmJob, SlurmNode
from hadar_slurm.slurm.api import UPDATE_FIELDS, DryRunApi, SlurmApi
from hadar_slurm.slurm.parse import FINAL_STATES, LAUNCH_FAILED_HELD, Gres, expand_array_tasks
from hadar_slurm.slurm.runner import write_files_as
from hadar_slurm.slurm.schedconf import SchedulerConfig
from hadar_slurm.slurm.version import SlurmVersion, parse_version

HINT = "hadar: model=resnet50 bs=64 steps=40000 preempt=checkpoint"


def job(job_id: int, *, state: str = "PENDING", reason: str = "JobHeldAdmin",
        comment: str = HINT, admin: str = "hadar: held for the sidecar", gpus: int = 1,
        nodes: tuple[str, ...] = (), start: int | None = None) -> SlurmJob:
    return SlurmJob(
        job_id=job_id, name=f"j{job_id}", user="alice", state=state, state_flags=(),
        state_reason=reason, partition="gpu", nodes=",".join(nodes), node_names=nodes,
        gres=(Gres("gpu", None, gpus),), features="", comment=comment, admin_comment=admin,
        priority=0, submit_time=1000, start_time=start, time_limit_min=None)


def node(name: str, gpu_type: str, gpus: int, used: int = 0, state: str = "IDLE",
         flags: tuple[str, ...] = ()) -> SlurmNode:
    return SlurmNode(name=name, state=state, state_flags=flags,
                     gres=(Gres("gpu", gpu_type, gpus),),
                     gres_used=(Gres("gpu", gpu_type, used),), features=(gpu_type,),
                     active_features=(gpu_type,), cpus=4, alloc_cpus=0, real_memory_mb=4000,
                     partitions=("gpu",))


class FakeSlurm:
    """Jobs and nodes in memory; writes change them as Slurm would (roughly)."""

    name = "fake"

    can_fork = True

    def __init__(self, jobs: list[SlurmJob], nodes: list[SlurmNode]) -> None:
        self.jobs = {j.job_id: j for j in jobs}
        self.nodes = nodes
        self.commands = 0
        self.log: list[tuple[str, int]] = []
        self.fail: set[tuple[str, int]] = set()
        # HadarE: what sbatch got, and an error it raises instead (once)
        self.submitted: list[tuple[str, RunAs, str | None]] = []
        self.submit_error: Exception | None = None
        self.script = "#!/bin/bash\necho training\n"
        self.version = "slurm 22.05.8"  # what `scontrol version` prints
        self.sched = SchedulerConfig("sched/backfill", 1)  # what `scontrol show config` says

    def _do(self, what: str, job_id: int) -> None:
        self.commands += 1
        if (what, job_id) in self.fail:
            raise SlurmCommandError(("scontrol", what, str(job_id)), "failed")
        self.log.append((what, job_id))

    def slurm_version(self) -> SlurmVersion:
        return parse_version(self.version)

    def scheduler_config(self) -> SchedulerConfig:
        self.commands += 1
        return self.sched

    def read_jobs(self) -> list[SlurmJob]:
        self.commands += 1
        return list(self.jobs.values())

    def read_nodes(self) -> list[SlurmNode]:
        self.commands += 1
        return list(self.nodes)

    def live_job_ids(self) -> frozenset[int]:
        self.commands += 1
        return frozenset(j.job_id for j in self.jobs.values() if j.state not in FINAL_STATES)

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        unknown = set(fields) - set(UPDATE_FIELDS)  # (as the CLI backend refuses them)
        assert not unknown, f"update_job: unsupported fields {sorted(unknown)}"
        self._do("update", job_id)
        j = self.jobs[job_id]
        self.jobs[job_id] = replace(
            j, admin_comment=fields.get("AdminComment", j.admin_comment),
            features=fields.get("Features", j.features),
            dependency=fields.get("Dependency", j.dependency),
            eligible_time=None if fields.get("StartTime") == "now" else j.eligible_time,
            state_reason="None" if fields.get("StartTime") == "now"
            and j.state_reason == "BeginTime" else j.state_reason)

    def split_array_task(self, array_job_id: int, task_id: int, admin_comment: str) -> None:
        """As Slurm: the task gets the next job id; the array's record keeps the rest (and is
        the last task itself once one is left)."""
        self._do("split", task_id)
        meta = self.jobs[array_job_id]
        left = [t for t in expand_array_tasks(meta.array_tasks) if t != task_id]
        new = max(self.jobs) + 1
        self.jobs[new] = replace(meta, job_id=new, array_task_id=task_id, array_tasks="",
                                 admin_comment=admin_comment)
        self.jobs[array_job_id] = replace(
            meta, array_task_id=left[0] if len(left) == 1 else None,
            array_tasks="" if len(left) == 1 else ",".join(map(str, left)))

    def hold(self, job_id: int) -> None:
        self._do("hold", job_id)
        self.jobs[job_id] = replace(self.jobs[job_id], state_reason="JobHeldAdmin")

    def release(self, job_id: int) -> None:
        self._do("release", job_id)
        self.jobs[job_id] = replace(self.jobs[job_id], state_reason="None")

    def requeue_hold(self, job_id: int) -> None:
        self._do("requeuehold", job_id)
        # (a requeue, then the operator's hold: JobHeldAdmin)
        self.jobs[job_id] = replace(self.jobs[job_id], state="PENDING",
                                    state_reason="JobHeldAdmin", nodes="", node_names=())

    def signal(self, job_id: int, signal: str) -> None:
        self._do("signal", job_id)

    def cancel(self, job_id: int) -> None:
        self._do("cancel", job_id)
        for k, j in self.jobs.items():  # a heterogeneous job: every component
            if k == job_id or j.het_job_id == job_id:
                self.jobs[k] = replace(j, state="CANCELLED")

    def signal_steps(self, job_id: int, signal: str) -> None:
        self._do("signal_steps", job_id)

    def batch_script(self, job_id: int) -> str:
        self._do("batch_script", job_id)
        return self.script

    def write_files(self, owner: RunAs, directory: str, files: Mapping[str, str]) -> None:
        write_files_as(owner, directory, files)  # (real files: the tests read them back)

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        """Reads the rendered script as sbatch would: one pending component per
        ``#SBATCH hetjob``-separated block, with its --nodelist, --gres and --comment."""
        self._do("sbatch", 0)
        if self.submit_error is not None:
            error, self.submit_error = self.submit_error, None
            raise error
        self.submitted.append((script, owner, dependency))
        blocks = Path(script).read_text().split("#SBATCH hetjob")
        leader = max(self.jobs) + 1
        for k, block in enumerate(blocks):
            opts = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", block, re.M))
            original = self.jobs.get(hadare.copy_of(opts["comment"]) or 0)
            self.jobs[leader + k] = replace(
                job(leader + k, reason="Resources" if dependency is None else "Dependency",
                    comment=opts["comment"], admin="", gpus=int(opts["gres"].split(":")[1])),
                name=opts["job-name"], required_nodes=opts["nodelist"],
                features=opts["constraint"], het_job_id=leader if len(blocks) > 1 else None,
                het_job_offset=k if len(blocks) > 1 else None, dependency=dependency or "",
                # as Slurm shows a batch job: its owner, and the script it was submitted with
                user=original.user if original is not None else "?", command=script)
        return leader

NODES = [node("node1", "v100", 4), node("node2", "p100", 4), node("node3", "k80", 2)]


def backend(api: SlurmApi, **kw: object) -> SlurmBackend:
    return SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=lambda s: None,
                        **kw)  # type: ignore[arg-type]


def decide(b: SlurmBackend, rows: dict[int, list[tuple[int, int]]], epoch: int = 0,
           now: float = 2000.0) -> tuple[Decision, list[Change]]:
    snap = b.snapshot(epoch, now, 60.0, None)
    jobs_, nodes_, counts = [], [], []
    for j, rr in rows.items():
        for n, c in rr:
            jobs_.append(j)
            nodes_.append(n)
            counts.append(c)
    placement = Placement(np.array(jobs_, dtype=np.int64), np.array(nodes_, dtype=np.int64),
                          np.array(counts, dtype=np.int64))
    decision = Decision(epoch, placement, np.full(snap.num_jobs, Reason.PLACED, dtype=np.int8))
    return decision, b.reconcile(snap, decision)


def test_record_round_trip_and_foreign_comments() -> None:
    rec = JobRecord(epoch=7, state="placed", place=(("node2", 2),), gpus=2, done=12.5,
                    attained={"v100": 30.0, "p100": 0.0}, until=1700000000.0, relaunch=2,
                    why="two words")
    text = rec.encode()
    assert text.startswith("hadar epoch=7 state=placed place=node2:2 gpus=2 done=12.5 ")
    back = decode(text)
    assert back.place == rec.place and back.attained == {"v100": 30.0}
    assert (back.epoch, back.done, back.until, back.why) == (7, 12.5, 1700000000.0, "two words")
    assert back.relaunch == 2 and "relaunch" not in JobRecord(epoch=1, state="held").encode()
    for other in ("", "site note", "hadar: held for the sidecar", "hadar epoch=x",
                  "hadar epoch=1 state=placed relaunch=-1"):
        assert decode(other) == JobRecord()


def test_a_requeued_job_keeps_its_first_submit_time() -> None:
    """Slurm sets a requeued job's SubmitTime to the time of the requeue: after a move or a
    preemption the job looked just arrived, so its age (in the policy's utility) and its JCT
    (in the metrics) started again.  The first submit time seen is recorded on the job and
    wins over Slurm's from then on."""
    assert decode(JobRecord(epoch=1, state="held", submit=1795875496.4, why="a b").encode()
                  ) == JobRecord(epoch=1, state="held", submit=1795875496.0, why="a b")
    api = FakeSlurm([job(1), job(2)], NODES)
    b = backend(api)
    _, changes = decide(b, {1: [(0, 1)]})
    b.apply(changes, 2000.0)
    assert decode(api.jobs[1].admin_comment).submit == 1000.0  # (with the placement)
    # job 1 was moved: Slurm requeued it and reset its SubmitTime; job 2 is new
    api.jobs[1] = replace(api.jobs[1], submit_time=2010, admin_comment=JobRecord(
        epoch=0, state="preempted", submit=1000.0).encode())
    api.jobs[2] = replace(api.jobs[2], submit_time=2005)
    snap = b.snapshot(1, 2020.0, 60.0, None)
    assert dict(zip(snap.job_ids.tolist(), snap.arrival.tolist(), strict=True)) == {
        1: 1000.0, 2: 2005.0}
    assert b.views[1].arrival(2020.0) == 1000.0


def test_snapshot_reads_once_and_counts_other_jobs_gpus() -> None:
    api = FakeSlurm([
        job(1), job(2, gpus=2),
        job(3, state="RUNNING", reason="None", comment="", admin="", nodes=("node1",),
            gpus=3, start=1500),  # not a hadar job: its GPUs are not ours to hand out
        job(4, reason="JobHeldUser", admin=""),  # held by its user: left alone
        job(5, state="COMPLETED", reason="None"),
    ], [node("node1", "v100", 4, used=3, state="MIXED"), NODES[1],
        node("node3", "k80", 2, flags=("DRAIN",))])
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    assert api.commands == 2
    assert snap.job_ids.tolist() == [1, 2] and snap.scale.tolist() == [1, 2]
    assert snap.node_names == ("node1", "node2", "node3")
    assert snap.node_gpus.tolist() == [1, 4, 0]  # 3 GPUs foreign on node1; node3 drained
    assert snap.gpu_types == ("v100", "p100", "k80")
    assert snap.rate[0, 0] == pytest.approx(default_table().rate(
        "ResNet-50 (batch size 64)", 1, "v100"))


def test_snapshot_tells_the_policy_what_slurm_allows() -> None:
    # A copy is one hetjob component on one node; a move costs what the config says.
    snap = backend(FakeSlurm([job(1)], NODES), migration_s=45.0).snapshot(0, 2000.0, 60.0, None)
    assert snap.multi_node_copies is False
    assert snap.migration_s == 45.0
    assert backend(FakeSlurm([job(1)], NODES)).snapshot(0, 2000.0, 60.0, None).migration_s == 0
    # and whether a job's GPUs go out as soon as it ends ([scheduler] reschedule_on_finish)
    assert backend(FakeSlurm([job(1)], NODES), refill_on_finish=True).snapshot(
        0, 2000.0, 60.0, None).refill_on_finish is True
    assert backend(FakeSlurm([job(1)], NODES)).snapshot(
        0, 2000.0, 60.0, None).refill_on_finish is False


def test_place_is_one_update_and_a_release_and_idempotent() -> None:
    api = FakeSlurm([job(1)], NODES)
    b = backend(api)
    _, actions = decide(b, {1: [(1, 1)]})
    assert [a.kind for a in actions] == [ChangeKind.PLACE]
    b.apply(actions, 2000.0)
    assert api.log == [("update", 1), ("release", 1)]
    rec = decode(api.jobs[1].admin_comment)
    assert (rec.epoch, rec.state, rec.place, rec.gpus) == (0, "placed", (("node2", 1),), 1)
    assert api.jobs[1].features == "p100"
    # the same decision again (e.g. after a restart): the pending job counts as placed there
    _decision, actions = decide(b, {1: [(1, 1)]}, epoch=1)
    assert [a.kind for a in actions] == [ChangeKind.KEEP]
    api.log.clear()
    b.apply(actions, 2001.0)
    assert api.log == [] and b.stats.commands_apply == 0


def test_crash_between_update_and_release_is_repaired() -> None:
    api = FakeSlurm([job(1)], NODES)
    api.fail.add(("release", 1))
    b = backend(api)
    _, actions = decide(b, {1: [(1, 1)]})
    b.apply(actions, 2000.0)  # the release failed: the job is still held
    api.fail.clear()
    api.log.clear()
    _decision, actions = decide(b, {1: [(1, 1)]}, epoch=1)
    b.apply(actions, 2001.0)
    assert api.log == [("release", 1)]


def test_progress_from_run_time_starts_after_the_jobs_restart() -> None:
    """With ``restart_s`` (the config's), a running job without a runtime report is estimated
    to have made no progress in its first ``restart_s`` seconds (the GPUs count as held), as
    the simulator charges a start."""
    rec = JobRecord(epoch=0, state="placed", place=(("node3", 1),), gpus=1)
    k80 = default_table().rate("ResNet-50 (batch size 64)", 1, "k80")
    for restart, worked in ((0.0, 100.0), (30.0, 70.0), (150.0, 0.0)):
        api = FakeSlurm([job(1, state="RUNNING", reason="None", admin=rec.encode(),
                             nodes=("node3",), start=1900)], NODES)
        b = SlurmBackend(api, default_table(), restart_s=restart)
        snap = b.snapshot(1, 2000.0, 60.0, None)
        assert snap.remaining[0] == pytest.approx(40000 - worked * k80, rel=1e-6)
        assert snap.attained[0].tolist() == [0.0, 0.0, 100.0]


def test_move_of_a_running_job_signals_then_requeues_held() -> None:
    rec = JobRecord(epoch=0, state="placed", place=(("node3", 1),), gpus=1)
    api = FakeSlurm([job(1, state="RUNNING", reason="None", admin=rec.encode(),
                         nodes=("node3",), start=1900)], NODES)
    slept: list[float] = []
    b = SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=slept.append)
    _, actions = decide(b, {1: [(0, 1)]}, epoch=3, now=2000.0)
    assert [a.kind for a in actions] == [ChangeKind.MOVE]
    b.apply(actions, 2000.0)
    # the record of the move first (state=preempting), then the signal, the grace, the
    # requeue, and the record preempted; once Slurm shows it back in the queue (one read), it
    # is placed on its new GPUs in the same epoch: the placement, the release (the
    # requeue-hold's hold is the operator's already: nothing to take over)
    assert api.log == [("update", 1), ("signal", 1), ("requeuehold", 1), ("update", 1),
                       ("update", 1), ("release", 1)]
    assert slept == [0.25] * 20  # (the job never left: the whole grace, read every 0.25 s)
    # the log (and the report) of the move's record says why it is stopped
    begun = [a for a in b.report.applied if a.get("state") == "preempting"]
    assert [a.get("why") for a in begun] == ["the decision moves it"]
    rec2 = decode(api.jobs[1].admin_comment)
    k80 = default_table().rate("ResNet-50 (batch size 64)", 1, "k80")
    assert rec2.state == "placed" and rec2.place == (("node1", 1),) and rec2.epoch == 3
    assert rec2.done == pytest.approx(100 * k80, rel=1e-5)
    assert rec2.attained == {"k80": 100.0} and rec2.until == 2000.0
    # next epoch it is where the decision wants it (placed, not started yet)
    _decision, actions = decide(b, {1: [(0, 1)]}, epoch=4, now=2010.0)
    assert [a.kind for a in actions] == [ChangeKind.KEEP]
    snap = b.snapshot(4, 2010.0, 60.0, None)
    assert snap.remaining[0] == pytest.approx(40000 - 100 * k80, rel=1e-5)


def test_a_moved_job_that_does_not_leave_in_time_stays_and_the_epoch_says_so() -> None:
    rec = JobRecord(epoch=0, state="placed", place=(("node3", 1),), gpus=1)
    api = FakeSlurm([job(1, state="RUNNING", reason="None", admin=rec.encode(),
                         nodes=("node3",), start=1900)], NODES)
    requeue = api.requeue_hold

    def slow(job_id: int) -> None:  # Slurm still ends it (COMPLETING) at every read
        requeue(job_id)
        api.jobs[job_id] = replace(api.jobs[job_id], state="COMPLETING")

    api.requeue_hold = slow  # type: ignore[method-assign]
    slept: list[float] = []
    b = SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=slept.append)
    b.applier.move_polls = 3
    _, actions = decide(b, {1: [(0, 1)]}, epoch=3)
    report = b.apply(actions, 2000.0)
    # the grace, then two waits between three reads; not placed, and the report says why
    assert slept == [0.25] * 20 + [0.5, 0.5]
    assert [w for w, _ in api.log] == ["update", "signal", "requeuehold", "update"]
    assert decode(api.jobs[1].admin_comment).state == "preempted"
    assert "still leaving its GPUs after 3 reads" in report.detail[1]


def test_the_grace_period_ends_when_the_job_has_left() -> None:
    # the job checkpoints on the signal and exits 75 after 2 s; slurmctld requeues it held
    # (RequeueExitHold=75): the sidecar stops waiting then, not after the whole grace
    api = FakeSlurm([job(1, state="RUNNING", reason="None", nodes=("node3",), start=1900)],
                    NODES)
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        if len(slept) == 8:
            api.jobs[1] = replace(api.jobs[1], state="SPECIAL_EXIT", state_reason="JobHeldUser",
                                  nodes="", node_names=())

    b = SlurmBackend(api, default_table(), preempt_grace_s=30.0, sleep=sleep)
    _, actions = decide(b, {1: [(0, 1)]})
    b.apply(actions, 2000.0)
    assert slept == [0.25] * 8
    # not requeued by the sidecar (slurmctld did it), placed on its new GPUs at once
    assert [w for w, _ in api.log] == ["update", "signal", "update", "hold", "update",
                                        "release"]
    rec = decode(api.jobs[1].admin_comment)
    assert (rec.state, rec.place) == ("placed", (("node1", 1),))


def test_each_moved_job_is_placed_as_it_leaves_and_pending_ones_before_the_grace_ends(
) -> None:
    # jobs 1 and 2 move; job 1 leaves after 1 s, job 2 never does (requeued at the end of the
    # grace); job 3, pending, is placed on job 2's GPU: job 1 and job 3 must not wait for job 2
    rec = JobRecord(epoch=0, state="placed", place=(("node3", 1),), gpus=1)
    api = FakeSlurm([job(1, state="RUNNING", reason="None", admin=rec.encode(),
                         nodes=("node3",), start=1900),
                     job(2, state="RUNNING", reason="None", admin=rec.encode(),
                         nodes=("node3",), start=1900),
                     job(3)], NODES)
    slept: list[float] = []
    log_at: dict[int, int] = {}

    def sleep(s: float) -> None:
        slept.append(s)
        log_at[len(slept)] = len(api.log)
        if len(slept) == 4:
            api.jobs[1] = replace(api.jobs[1], state="SPECIAL_EXIT", state_reason="JobHeldUser",
                                  nodes="", node_names=())

    b = SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=sleep)
    _, actions = decide(b, {1: [(0, 1)], 2: [(1, 1)], 3: [(2, 1)]}, epoch=3)
    assert sorted(a.kind.value for a in actions) == ["move", "move", "place"]
    b.apply(actions, 2000.0)
    assert slept == [0.25] * 20  # (job 2 never left: the whole grace)
    # the moves' records and signals, then job 3's placement, all before the first wait
    assert api.log[:log_at[1]] == [("update", 1), ("signal", 1), ("update", 2), ("signal", 2),
                                   ("update", 3), ("release", 3)]
    # job 1 is placed at the read after it left (the 5th), long before the grace ends
    assert api.log[log_at[4]:log_at[5]] == [("update", 1), ("hold", 1), ("update", 1),
                                            ("release", 1)]
    assert api.log[log_at[20]:] == [("requeuehold", 2), ("update", 2), ("update", 2),
                                    ("release", 2)]
    for j, place in ((1, "node1"), (2, "node2"), (3, "node3")):
        r = decode(api.jobs[j].admin_comment)
        assert (r.state, r.place) == ("placed", ((place, 1),)), j


def test_job_that_finished_during_grace_is_not_requeued() -> None:
    api = FakeSlurm([job(1, state="RUNNING", reason="None", nodes=("node3",), start=1900)],
                    NODES)

    def finish(_s: float) -> None:
        api.jobs[1] = replace(api.jobs[1], state="COMPLETED")

    b = SlurmBackend(api, default_table(), preempt_grace_s=1.0, sleep=finish)
    _decision, actions = decide(b, {})
    b.apply(actions, 2000.0)
    assert [w for w, _ in api.log] == ["update", "signal"]


@pytest.mark.parametrize("exit_code,requeued", [(75, True), (0, False), (1, True), (138, True)])
def test_job_that_checkpointed_and_exited_75_during_grace_is_requeued(
        exit_code: int, requeued: bool) -> None:
    # hadar_slurm.runtime checkpoints on the preemption signal and exits 75 (EX_TEMPFAIL):
    # that job is not done and must run again, so it is requeued held like a running one
    # (on a Slurm without RequeueExitHold=75, which would requeue it itself).  So is one that
    # failed during its grace (e.g. died of the signal: 138): never left FAILED.  Exit 0: it
    # finished.
    api = FakeSlurm([job(1, state="RUNNING", reason="None", nodes=("node3",), start=1900)],
                    NODES)

    def checkpoint_and_exit(_s: float) -> None:
        api.jobs[1] = replace(api.jobs[1], state="FAILED" if exit_code else "COMPLETED",
                              exit_code=exit_code)

    b = SlurmBackend(api, default_table(), preempt_grace_s=1.0, sleep=checkpoint_and_exit)
    _decision, actions = decide(b, {})
    b.apply(actions, 2000.0)
    expected = ["update", "signal"] + (["requeuehold", "update"] if requeued else [])
    assert [w for w, _ in api.log] == expected


def test_unplaced_pending_jobs_are_held_and_bad_hints_released() -> None:
    api = FakeSlurm([
        job(1, reason="Priority", admin=""),  # no job_submit.lua: not held yet
        job(2, comment="hadar: model=nosuch steps=5"),  # held by the plugin, bad hints
        job(3, comment="hadar: model=resnet50 bs=128 steps=5", gpus=2),  # 2 GPUs of k80: 0
    ], [NODES[2]])
    b = backend(api)
    _, actions = decide(b, {})
    b.apply(actions, 2000.0)
    assert ("hold", 1) in api.log
    assert decode(api.jobs[1].admin_comment).state == "held"
    for j in (2, 3):
        assert ("release", j) in api.log, api.log
        rec = decode(api.jobs[j].admin_comment)
        assert rec.state == "unsteered" and rec.why, rec
    assert "nosuch" in decode(api.jobs[2].admin_comment).why
    # unsteered jobs stay unsteered: nothing more is done with them
    api.log.clear()
    _decision, actions = decide(b, {}, epoch=1)
    b.apply(actions, 2001.0)
    assert [x for x in api.log if x[1] in (2, 3)] == []


def test_uneven_multi_node_placement_waits_with_a_reason() -> None:
    api = FakeSlurm([job(1, gpus=4)], [node("node1", "v100", 4), node("node2", "v100", 4)])
    b = backend(api)
    _decision, actions = decide(b, {1: [(0, 3), (1, 1)]})
    b.apply(actions, 2000.0)
    assert "unequal GPU counts" in b.report.detail[1]
    assert api.log == [] and api.jobs[1].state_reason == "JobHeldAdmin"  # stays held


def test_dry_run_changes_nothing_and_failed_writes_do_not_stop_the_epoch() -> None:
    api = FakeSlurm([job(1), job(2)], NODES)
    dry = DryRunApi(api)
    b = backend(dry)
    _, actions = decide(b, {1: [(0, 1)], 2: [(1, 1)]})
    b.apply(actions, 2000.0)
    assert api.log == [] and [w[0] for w in dry.would] == ["update", "release"] * 2
    api.fail.add(("update", 1))
    b = backend(api)
    _decision, actions = decide(b, {1: [(0, 1)], 2: [(1, 1)]})
    b.apply(actions, 2000.0)
    assert api.log == [("update", 2), ("release", 2)]


def test_last_epoch_is_recovered_from_the_records() -> None:
    api = FakeSlurm([job(1, admin=JobRecord(epoch=41, state="held").encode()),
                     job(2, admin=JobRecord(epoch=7, state="placed").encode())], NODES)
    b = backend(api)
    b.read()
    assert b.last_epoch() == 41


def test_job_started_between_the_reads_is_not_held_and_stays_tracked() -> None:
    # placed and released last epoch; Slurm starts it right after the nodes read: the jobs read
    # shows it running, the nodes read not yet its GPUs
    rec = JobRecord(epoch=0, state="placed", place=(("node2", 2),), gpus=2)
    api = FakeSlurm([job(1, state="RUNNING", reason="None", admin=rec.encode(), gpus=2,
                         nodes=("node2",), start=1999)], NODES)
    b = backend(api)
    _decision, actions = decide(b, {1: [(1, 2)]}, epoch=1)
    assert b.snapshot(1, 2000.0, 60.0, None).node_gpus.tolist() == [4, 4, 2]
    b.apply(actions, 2000.0)
    assert api.log == []
    # a hold that reached it after it started (priority 0 while running): still tracked
    api.jobs[1] = replace(api.jobs[1], state_reason="JobHeldAdmin", admin_comment=JobRecord(
        epoch=1, state="held").encode())
    snap = b.snapshot(2, 2001.0, 60.0, None)
    assert snap.job_ids.tolist() == [1] and snap.current.rows_of(1) == [(1, 2)]
    assert snap.node_gpus.tolist() == [4, 4, 2]


def test_jobs_that_end_after_the_epoch_are_seen_with_one_light_read() -> None:
    """reschedule_on_finish: the jobs that held GPU nodes at the epoch (hadar's or not), minus
    those the epoch itself stops, and those it placed are watched; one that has ended freed
    its GPUs (a completing one not yet, a placed one that has not started is no reason)."""
    rec = JobRecord(epoch=0, state="placed", place=(("node1", 1),), gpus=1)
    other = job(3, state="RUNNING", reason="None", comment="", admin="", nodes=("node2",),
                start=1900)
    cpu_only = replace(job(4, state="RUNNING", reason="None", comment="", admin="",
                           nodes=("cpu1",), start=1900), gres=())
    api = FakeSlurm([job(1, state="RUNNING", reason="None", admin=rec.encode(),
                         nodes=("node1",), start=1900),
                     job(2, state="RUNNING", reason="None", admin=rec.encode(),
                         nodes=("node3",), start=1900), other, cpu_only, job(5)], NODES)
    b = backend(api)
    assert b.ended_since_epoch() == [] and api.commands == 0  # nothing watched yet
    _decision, actions = decide(b, {1: [(0, 1)], 5: [(1, 1)]}, epoch=1)  # job 2 is preempted
    b.apply(actions, 2000.0)
    assert b.watch == {1, 3, 5}  # not 2 (stopped by this epoch), not 4 (no GPU node)
    before = api.commands
    assert b.ended_since_epoch() == [] and api.commands == before + 1
    api.jobs[3] = replace(api.jobs[3], state="COMPLETING")
    assert b.ended_since_epoch() == []  # its GPUs are not free yet
    api.jobs[3] = replace(api.jobs[3], state="COMPLETED")
    api.jobs[1] = replace(api.jobs[1], state="FAILED")
    assert b.ended_since_epoch() == [1, 3]  # job 5: released, still pending
    api.jobs[5] = replace(api.jobs[5], state="CANCELLED")
    assert b.ended_since_epoch() == [1, 3, 5]


def test_a_job_that_arrives_while_gpus_are_free_is_seen_with_one_light_read() -> None:
    """reschedule_on_finish: when the last epoch left GPUs free, a job submitted since (not in
    its read, not a fork copy of the sidecar's) is worth an early epoch; when it left none, it
    is not."""
    api = FakeSlurm([job(1)], NODES)
    b = backend(api)
    _decision, actions = decide(b, {1: [(0, 1)]}, epoch=0)
    b.apply(actions, 2000.0)
    assert b.free_gpus == 4 + 4 + 2 - 1
    assert b.since_epoch() == ([], [])  # job 1 (placed) is known
    api.jobs[7] = job(7)
    b.copy_ids.add(8)
    api.jobs[8] = replace(job(8), comment="a fork copy")
    before = api.commands
    assert b.since_epoch() == ([], [7]) and api.commands == before + 1
    # a decision that uses every GPU: an arrival has nowhere to run before the next epoch
    full = FakeSlurm([job(1, gpus=4), job(2, gpus=4), job(3, gpus=2)], NODES)
    b = backend(full)
    _decision, actions = decide(b, {1: [(0, 4)], 2: [(1, 4)], 3: [(2, 2)]}, epoch=0)
    b.apply(actions, 2000.0)
    full.jobs[7] = job(7)
    assert b.free_gpus == 0 and b.since_epoch() == ([], [])  # (read for the watched jobs)


# -- issue #11: moves that survive faults, users that cannot steer ------------------------------

NO_CHECKPOINT = "hadar: model=resnet50 bs=64 steps=40000"  # (no preempt hint: never stopped)


def running(job_id: int, comment: str = HINT, admin: str = "", node_name: str = "node3",
            **kw: object) -> SlurmJob:
    rec = admin or JobRecord(epoch=0, state="placed", place=((node_name, 1),), gpus=1).encode()
    return job(job_id, state="RUNNING", reason="None", comment=comment, admin=rec,
               nodes=(node_name,), start=1900, **kw)  # type: ignore[arg-type]


def test_a_job_that_cannot_checkpoint_is_never_stopped() -> None:
    api = FakeSlurm([running(1, comment=NO_CHECKPOINT)], [*NODES[:2], node("node3", "k80", 2, 1)])
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    # the policy sees it as a running job fixed where it runs, on hadar's GPUs (not someone
    # else's: a job the last epoch placed that Slurm started must not change what is free)
    assert snap.job_ids.tolist() == [1] and 1 in b.pinned
    assert snap.fixed is not None and snap.fixed.tolist() == [True]
    assert snap.node_gpus.tolist() == [4, 4, 2]
    assert snap.current.by_job_sorted() == {1: [(2, 1)]}
    # a decision that drops it changes nothing: reconcile never sees it
    _, actions = decide(b, {})
    b.apply(actions, 2000.0)
    assert api.log == []
    # through the epoch loop, a plan that moves it and puts two jobs on its node: it stays,
    # and the job planned on its GPU waits (keep_fixed)
    api.jobs[2] = job(2)
    api.jobs[3] = job(3)

    class MovesIt:
        name = "moves-it"

        def allocate(self, snap: Snapshot) -> Decision:
            # (the pinned job comes after the jobs reconcile steers)
            assert snap.job_ids.tolist() == [2, 3, 1]
            assert snap.fixed is not None and snap.fixed.tolist() == [False, False, True]
            rows = Placement(np.array([1, 2, 3]), np.array([0, 2, 2]), np.array([1, 1, 1]))
            return Decision(snap.epoch, rows, np.full(3, Reason.PLACED, dtype=np.int8))

    b = backend(api)
    loop = EpochLoop(b, MovesIt(), SimClock(2000.0), round_s=60.0)
    loop.run_epoch(full=True)
    # node3 has 2 GPUs and job 1 holds one: of the two newcomers, job 2 (the lower id) waits
    assert not [e for e in api.log if e[1] in (1, 2)]  # job 1 untouched, job 2 not released
    assert decode(api.jobs[3].admin_comment).place == (("node3", 1),)
    assert loop.last_decision is not None
    assert loop.last_decision.reason.tolist() == [Reason.NO_FREE_GPU, Reason.PLACED,
                                                  Reason.PLACED]
    api.log.clear()
    del api.jobs[2], api.jobs[3]
    # with preempt=requeue it may be stopped: requeued at once, without a signal or grace
    api.jobs[1] = running(1, comment=NO_CHECKPOINT + " preempt=requeue")
    slept: list[float] = []
    b = SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=slept.append)
    _decision, actions = decide(b, {})
    b.apply(actions, 2000.0)
    assert api.log == [("update", 1), ("requeuehold", 1), ("update", 1)] and slept == []
    assert decode(api.jobs[1].admin_comment).state == "preempted"


@pytest.mark.parametrize("deadline,slept,signals", [(1990.0, [], 0), (2003.0, [0.25] * 12, 0)])
def test_a_move_begun_before_a_restart_is_finished_without_a_second_signal(
        deadline: float, slept: list[float], signals: int) -> None:
    # a sidecar signalled the job (record preempting) and died before the requeue: the next
    # one waits out what is left of the grace, then requeues it, whatever the decision
    rec = JobRecord(epoch=4, state="preempting", gpus=1, until=1995.0, deadline=deadline)
    api = FakeSlurm([running(1, admin=rec.encode())], NODES)
    waited: list[float] = []
    b = SlurmBackend(api, default_table(), preempt_grace_s=30.0, sleep=waited.append)
    assert b.snapshot(5, 2000.0, 60.0, None).num_jobs == 1
    _decision, actions = decide(b, {1: [(2, 1)]}, epoch=5)  # (it would stay where it is)
    b.apply(actions, 2000.0)
    assert [w for w, _ in api.log].count("signal") == signals
    assert ("requeuehold", 1) in api.log and waited == slept
    # then placed where the decision wants it, in the same epoch
    rec2 = decode(api.jobs[1].admin_comment)
    assert (rec2.state, rec2.place) == ("placed", (("node3", 1),))


@pytest.mark.parametrize("state,exit_code,requeued", [
    ("FAILED", 75, True),  # checkpointed, on a Slurm without RequeueExitHold=75
    ("FAILED", None, True),  # died of the signal (a script that does not trap it)
    ("COMPLETED", 0, False),  # finished
    ("CANCELLED", None, False),  # its user cancelled it
    ("TIMEOUT", None, False),
])
def test_a_job_that_a_move_left_ended_is_requeued_by_the_next_sidecar(
        state: str, exit_code: int | None, requeued: bool) -> None:
    rec = JobRecord(epoch=4, state="preempting", gpus=1, until=1995.0, deadline=1999.0)
    ended = replace(job(1, state=state, reason="None", admin=rec.encode()), exit_code=exit_code)
    api = FakeSlurm([ended], NODES)
    b = backend(api)
    _decision, actions = decide(b, {}, epoch=5)
    b.apply(actions, 2000.0)
    if requeued:
        assert api.log == [("requeuehold", 1), ("update", 1)]
        assert decode(api.jobs[1].admin_comment).state == "preempted"
    else:
        assert api.log == []


def test_a_checkpoint_exit_that_slurm_requeued_held_is_placed_again() -> None:
    # RequeueExitHold=75: slurmctld puts the job back itself, as SPECIAL_EXIT, JobHeldUser
    rec = JobRecord(epoch=4, state="preempting", gpus=1, until=1995.0, deadline=1999.0)
    api = FakeSlurm([job(1, state="SPECIAL_EXIT", reason="JobHeldUser", admin=rec.encode())],
                    NODES)
    b = backend(api)
    _decision, actions = decide(b, {1: [(0, 1)]}, epoch=5)
    b.apply(actions, 2000.0)
    # (its hold made the sidecar's first: see the next test)
    assert api.log == [("hold", 1), ("update", 1), ("release", 1)]
    assert decode(api.jobs[1].admin_comment).place == (("node1", 1),)


def test_a_sidecar_that_dies_between_record_and_release_leaves_no_user_hold() -> None:
    # job_submit.lua holds with a user hold; the sidecar makes it an operator's hold before it
    # writes its record, so a crash before the release leaves JobHeldAdmin + record placed,
    # which the next sidecar still takes for its own (and releases)
    api = FakeSlurm([job(1, reason="JobHeldUser")], NODES)
    b = backend(api)
    api.fail.add(("release", 1))  # (the sidecar died here)
    _, actions = decide(b, {1: [(0, 1)]})
    b.apply(actions, 2000.0)
    assert api.log == [("hold", 1), ("update", 1)]
    assert api.jobs[1].state_reason == "JobHeldAdmin"
    api.fail.clear()
    b = backend(api)
    _decision, actions = decide(b, {1: [(0, 1)]}, epoch=1)
    assert b.user_held == []
    b.apply(actions, 2000.0)
    assert api.log[-1] == ("release", 1)


def launch_failed_job(job_id: int, record: JobRecord) -> SlurmJob:
    """As slurmctld leaves a job whose launch failed (a prolog failed, or slurmd refused it)."""
    return replace(job(job_id, reason="JobHeldUser", admin=record.encode()),
                   state_desc=LAUNCH_FAILED_HELD, required_nodes="node1")


def test_a_job_slurm_held_after_its_launch_failed_is_placed_anew() -> None:
    # Before: JobHeldUser read as its user's hold, and the job stayed held for ever
    placed = JobRecord(epoch=3, state="placed", place=(("node1", 1),), gpus=1, submit=900.0)
    api = FakeSlurm([launch_failed_job(1, placed)], NODES)
    b = backend(api)
    snap = b.snapshot(4, 2000.0, 60.0, None)
    # a pending job again, no longer on node1 for the policy
    assert snap.job_ids.tolist() == [1] and b.user_held == []
    assert snap.current.job.tolist() == []
    assert "places it anew at its next epoch (relaunch 1 of 3)" in str(
        launch_failed_text(api.jobs[1]))
    _, actions = decide(b, {1: [(1, 1)]}, epoch=4)
    b.apply(actions, 2000.0)
    # its hold made the sidecar's before the record (as for any user-held job it places)
    assert api.log == [("hold", 1), ("update", 1), ("release", 1)]
    rec = decode(api.jobs[1].admin_comment)
    assert (rec.state, rec.place, rec.relaunch, rec.submit) == ("placed", (("node2", 1),), 1,
                                                                  900.0)


def test_a_job_whose_launch_failed_waits_held_by_the_sidecar_when_not_placed() -> None:
    placed = JobRecord(epoch=3, state="placed", place=(("node1", 1),), gpus=1, relaunch=1)
    api = FakeSlurm([launch_failed_job(1, placed)], NODES)
    b = backend(api)
    _, actions = decide(b, {}, epoch=4)
    b.apply(actions, 2000.0)
    assert api.log == [("hold", 1), ("update", 1)]
    rec = decode(api.jobs[1].admin_comment)
    assert (rec.state, rec.place, rec.relaunch) == ("held", (), 2)
    assert api.jobs[1].state_reason == "JobHeldAdmin"
    # counted once: the next epochs see a job the sidecar holds
    api.log.clear()
    _, actions = decide(b, {}, epoch=5)
    b.apply(actions, 2000.0)
    assert api.log == [] and decode(api.jobs[1].admin_comment).relaunch == 2


def test_a_launch_that_failed_too_often_is_left_held_for_a_person() -> None:
    placed = JobRecord(epoch=3, state="placed", place=(("node1", 1),), gpus=1,
                       relaunch=MAX_RELAUNCH)
    unplaced = JobRecord(epoch=3, state="unsteered", gpus=1, why="bad hints")
    api = FakeSlurm([launch_failed_job(1, placed), launch_failed_job(2, unplaced)], NODES)
    b = backend(api)
    snap = b.snapshot(4, 2000.0, 60.0, None)
    assert snap.job_ids.tolist() == [] and b.user_held == [1, 2]
    _, actions = decide(b, {}, epoch=4)
    b.apply(actions, 2000.0)
    assert api.log == []
    text = launch_failed_text(api.jobs[1])
    assert text is not None
    assert "(4 failed launches where hadar placed it): hadar leaves it held" in text
    assert "scontrol release 1" in text and "node1" in text
    # a job the sidecar never placed is Slurm's to launch: only its node and the way out
    assert str(launch_failed_text(api.jobs[2])).startswith(
        "Slurm held it after its launch on node1")
    # any other job has no such text (a user's own hold among them)
    users = job(3, reason="JobHeldUser", admin="hadar: held by its user")
    assert launch_failed_text(users) is None


def test_a_users_own_hold_is_respected() -> None:
    placed = JobRecord(epoch=3, state="placed", place=(("node1", 1),), gpus=1).encode()
    api = FakeSlurm([
        job(1, reason="JobHeldUser", admin="hadar: held by its user"),  # sbatch --hold
        job(4, reason="JobHeldAdmin", admin="hadar: held by its user"),  # ... by an operator
        job(2, reason="JobHeldUser", admin=placed),  # scontrol hold after the sidecar placed it
        job(3, reason="JobHeldUser"),  # held by job_submit.lua for the sidecar
    ], NODES)
    b = backend(api)
    snap = b.snapshot(4, 2000.0, 60.0, None)
    assert snap.job_ids.tolist() == [3] and b.user_held == [1, 2, 4]
    _, actions = decide(b, {3: [(0, 1)]}, epoch=4)
    b.apply(actions, 2000.0)
    assert api.log == [("hold", 3), ("update", 3), ("release", 3)]
    # released by its user: the sidecar steers it from then on
    api.jobs[1] = replace(api.jobs[1], state_reason="None")
    api.log.clear()
    _decision, actions = decide(b, {}, epoch=5)
    b.apply(actions, 2000.0)
    assert ("hold", 1) in api.log and ("release", 2) not in api.log


def test_a_forged_copy_of_another_users_job_is_an_ordinary_job() -> None:
    # bob's plain job says it is a copy of alice's job 1: the sidecar neither signals nor
    # cancels it, nor credits its run time to job 1, and its GPU is not offered
    forged = replace(running(2, comment="hadar-copy-of=1", admin="", node_name="node1"),
                     user="bob", command="/home/bob/x.sh")
    api = FakeSlurm([job(1), forged], [replace(NODES[0], gres_used=(Gres("gpu", "v100", 1),)),
                                       *NODES[1:]])
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    assert b.copy_ids == set() and b.views[1].group is None
    assert snap.remaining.tolist() == [40000.0] and snap.node_gpus.tolist() == [3, 4, 2]
    _decision, actions = decide(b, {})
    b.apply(actions, 2000.0)
    assert [e for e in api.log if e[1] == 2] == []


def test_an_error_with_one_job_is_logged_and_the_epoch_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    api = FakeSlurm([job(1), job(2), job(3)], NODES)
    b = backend(api)
    view = b._view

    def broken(j: SlurmJob, *args: object) -> object:
        if j.job_id == 1:
            raise OverflowError("int too large to convert to float")
        return view(j, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(b, "_view", broken)
    place = b.applier._place

    def broken_place(v: object, *args: object) -> None:
        if getattr(v, "job_id", 0) == 2:
            raise KeyError("boom")
        place(v, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(b.applier, "_place", broken_place)
    with caplog.at_level("ERROR", logger="hadar_slurm.sidecar"):
        _decision, actions = decide(b, {2: [(0, 1)], 3: [(1, 1)]})
        b.apply(actions, 2000.0)
    assert sorted(b.views) == [2, 3]
    # job 1: released to Slurm with the reason; job 2: its error logged; job 3: placed
    rec1 = decode(api.jobs[1].admin_comment)
    assert rec1.state == "unsteered" and "OverflowError" in rec1.why and ("release", 1) in api.log
    assert ("release", 3) in api.log and ("release", 2) not in api.log
    assert [(s, j) for s, j, _ in b.job_errors] == [("read", 1), ("place", 2)]
    events = [r for r in caplog.records if r.getMessage() == "job_error"]
    assert len(events) == 2


def test_hints_that_bypassed_the_plugin_are_unsteered_not_fatal() -> None:
    # a user can change a pending job's comment after submit (scontrol update Comment=...),
    # which job_submit.lua does not see
    huge = "hadar: model=resnet50 bs=64 steps=" + "9" * 400
    api = FakeSlurm([job(1, comment=huge), job(2)], NODES)
    b = backend(api)
    _decision, actions = decide(b, {2: [(0, 1)]})
    b.apply(actions, 2000.0)
    assert decode(api.jobs[1].admin_comment).state == "unsteered"
    assert "steps" in decode(api.jobs[1].admin_comment).why
    assert ("release", 2) in api.log


def test_status_and_explain_say_why_a_job_is_outside_the_policy() -> None:
    # a job that may not be stopped, one its user holds, a forged copy, and (dry run) where a
    # job would have been placed: status and explain say so instead of showing nothing
    from dataclasses import replace as dc_replace

    from hadar_slurm.sidecar.config import default_config
    from hadar_slurm.sidecar.controller import epoch_state
    from hadar_slurm.sidecar.status import explain, status_rows

    forged = replace(running(4, comment="hadar-copy-of=3", admin="", node_name="node1"),
                     user="bob", command="/home/bob/x.sh")
    api = FakeSlurm([running(1, comment=NO_CHECKPOINT),
                     job(2, reason="JobHeldUser", admin="hadar: held by its user"),
                     job(3), forged], NODES)
    b = backend(api)
    decision, _ = decide(b, {3: [(1, 1)]})
    snap = b.snapshot(0, 2000.0, 60.0, None)
    state = json.loads(json.dumps(epoch_state(
        dc_replace(default_config(), dry_run=True), b, snap, decision)))
    jobs_ = list(api.jobs.values())
    rows = {r["job"]: r for r in status_rows(jobs_, state)}
    assert rows["1"]["why"].endswith("never moved (preempt=never)")
    assert rows["2"]["why"].startswith("held by its user")
    assert rows["3"]["why"] == "dry run: would be placed on node2:1"
    assert (rows["3"]["type"], rows["3"]["nodes"]) == ("p100", "node2")
    assert rows["4"]["why"].startswith("not a hadar job")
    assert "preempt=checkpoint" in explain(1, jobs_, state)
    assert "held by its user" in explain(2, jobs_, state)
    assert "did not make it" in explain(4, jobs_, state)


# -- parked jobs: job_submit.lua keeps a hadar job for the sidecar by a begin time, not a hold --

PARKED_UNTIL = 2000 + 10 * 365 * 86400  # (the fake's now is 2000)


def parked(job_id: int, **kw: object) -> SlurmJob:
    return replace(job(job_id, reason="BeginTime", admin="hadar: waits for the sidecar",
                       **kw), eligible_time=PARKED_UNTIL)  # type: ignore[arg-type]


def test_a_parked_job_is_started_where_it_is_placed_in_one_update() -> None:
    api = FakeSlurm([parked(1), parked(2)], NODES)
    b = backend(api)
    _decision, actions = decide(b, {1: [(0, 1)]})
    assert b.views[1].parked and not b.views[1].held
    b.apply(actions, 2000.0)
    # placed: NodeList, Features, the record and StartTime=now at once; job 2 waits as it is
    assert api.log == [("update", 1)]
    assert api.jobs[1].eligible_time is None and api.jobs[2].eligible_time == PARKED_UNTIL


def test_a_users_hold_on_a_parked_job_is_visible_and_kept() -> None:
    # Slurm keeps one hold per job and does not say who asked: only because job_submit.lua
    # parks (not holds) can the user's own `scontrol hold` be told apart
    api = FakeSlurm([replace(parked(1), state_reason="JobHeldUser")], NODES)
    b = backend(api)
    _decision, actions = decide(b, {})
    b.apply(actions, 2000.0)
    assert b.user_held == [1] and api.log == []


def test_a_parked_job_with_bad_hints_is_started_unsteered() -> None:
    api = FakeSlurm([parked(1, comment="hadar: model=nosuch steps=5")], NODES)
    b = backend(api)
    _decision, actions = decide(b, {})
    b.apply(actions, 2000.0)
    assert api.log == [("update", 1), ("update", 1)]  # the record, then StartTime=now
    assert api.jobs[1].eligible_time is None
    assert decode(api.jobs[1].admin_comment).state == "unsteered"


def test_a_running_jobs_progress_goes_on_from_its_trackers_last_round(tmp_path: Path) -> None:
    """The tracker's ``progress.json`` counts iterations up to its last round; the job has run
    since (a round may be long).  The snapshot's progress is the tracker's plus what the job
    did after it, at the estimated rate, never before the run's restart nor past the work."""
    k80 = default_table().rate("ResNet-50 (batch size 64)", 1, "k80")
    rec = JobRecord(epoch=0, state="placed", place=(("node3", 1),), gpus=1)

    def done_at(*, updated_at: float, done: float = 1000.0, complete: bool = False,
                  restart: float = 0.0) -> float:
        work = tmp_path / f"w{updated_at}-{done}-{complete}-{restart}"
        tracker = work / ".hadar-tracker" / "1"
        tracker.mkdir(parents=True)
        (tracker / "progress.json").write_text(json.dumps({
            "format": 1, "done": done, "work": 40000, "rounds": 3, "copies": 1,
            "copy_rates": [], "complete": complete, "updated_at": updated_at}))
        api = FakeSlurm([replace(job(1, state="RUNNING", reason="None", admin=rec.encode(),
                                     nodes=("node3",), start=1900,
                                     comment=HINT + " fork=2"), workdir=str(work))], NODES)
        b = SlurmBackend(api, default_table(), restart_s=restart)
        b.snapshot(1, 2000.0, 60.0, None)
        return b.views[1].done

    # written 30 s ago: 30 s more at the k80's rate
    assert done_at(updated_at=1970.0) == pytest.approx(1000 + 30 * k80)
    # written before the run's restart was over: only from then on
    assert done_at(updated_at=1910.0, restart=50.0) == pytest.approx(1000 + 50 * k80)
    # a finished tracker, or one close to the work, is not extrapolated past it
    assert done_at(updated_at=1970.0, done=40000, complete=True) == 40000
    assert done_at(updated_at=1000.0, done=39990) == 40000


def test_a_hadar_job_array_is_split_into_tasks_then_each_is_placed_on_its_own() -> None:
    # one record stands for the pending tasks 0-3 (as squeue lists an array not started yet)
    array = replace(job(1), array_job_id=1, array_tasks="0-3")
    api = FakeSlurm([array], NODES)
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    assert snap.num_jobs == 0  # (the array's record is no job to place)
    b.apply(b.reconcile(snap, Decision(0, Placement.empty(), np.zeros(0, dtype=np.int8))),
            2000.0)
    # tasks 0, 1 and 2 get records of their own; the array's record is task 3 then
    assert api.log == [("split", 0), ("split", 1), ("split", 2)]
    assert sorted((j.job_id, j.array_task_id, j.array_tasks) for j in api.jobs.values()) == [
        (1, 3, ""), (2, 0, ""), (3, 1, ""), (4, 2, "")]
    assert all(j.admin_comment == array.admin_comment for j in api.jobs.values())
    api.log.clear()
    _, actions = decide(b, {2: [(0, 1)], 4: [(1, 1)]}, epoch=1)
    b.apply(actions, 2001.0)
    assert ("release", 2) in api.log and ("release", 4) in api.log
    assert not any(what == "release" and j in (1, 3) for what, j in api.log)
    assert {a.job_id: a.kind for a in actions}[1] is ChangeKind.WAIT


def test_a_big_array_is_split_a_bounded_number_of_tasks_per_epoch() -> None:
    from hadar_slurm.sidecar.apply import MAX_SPLITS

    api = FakeSlurm([replace(job(1), array_job_id=1, array_tasks=f"0-{MAX_SPLITS + 9}")], NODES)
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    b.apply(b.reconcile(snap, Decision(0, Placement.empty(), np.zeros(0, dtype=np.int8))),
            2000.0)
    assert len(api.log) == MAX_SPLITS
    assert expand_array_tasks(api.jobs[1].array_tasks) == tuple(
        range(MAX_SPLITS, MAX_SPLITS + 10))  # (the rest at the next epochs)
