"""HadarE in the sidecar's backend, over the in-memory FakeSlurm of test_sidecar_backend: a
hinted job forked into copies (one heterogeneous job submitted as its owner, rendered from the
real template and read back by the fake as sbatch would), adopted after a crash, moved, ended,
and never lost when the fork cannot be made.  tests/test_sidecar_fork_cluster.py runs the same
code against the real dev cluster."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hadar_slurm.loop import Change, ChangeKind
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Decision, Placement, Reason
from hadar_slurm.rates.table import default_table
from hadar_slurm.sidecar import fork as hadare
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.config import default_config
from hadar_slurm.sidecar.controller import Sidecar, epoch_state
from hadar_slurm.sidecar.record import JobRecord, decode, encode_args
from hadar_slurm.sidecar.status import explain, status_rows
from hadar_slurm.slurm import SlurmCommandError, SlurmJob, SlurmTimeoutError
from hadar_slurm.slurm.api import DryRunApi, SlurmApi
from hadar_slurm.slurm.parse import PENDING_STATES, RUNNING_STATES
from tests.test_safe_state import config_file, config_of  # noqa: F401
from tests.test_sidecar_backend import NODES, FakeSlurm, job

FORK_HINT = "hadar: model=resnet50 bs=64 steps=40000 fork=3"
J = 10
CopyRows = dict[int, list[tuple[int, int]]]
THREE: CopyRows = {0: [(0, 1)], 1: [(1, 1)], 2: [(2, 1)]}  # node1 v100, node2 p100, node3 k80
#: The script's arguments, as job_submit.lua records them at submit (Slurm 24.11+ report the
#: script's path alone as the command).
ARGS = ("--steps", "40000", "--out", "model.pt")


def hinted(tmp_path: Path, job_id: int = J, **kw: object) -> SlurmJob:
    """A hinted job of this process's user (so the sidecar may act for it, root or not)."""
    kw.setdefault("admin", f"hadar: held for the sidecar args={encode_args(ARGS)}")
    base = job(job_id, comment=str(kw.pop("comment", FORK_HINT)), **kw)  # type: ignore[arg-type]
    return replace(base, user_id=os.geteuid(), group_id=os.getegid(), workdir=str(tmp_path),
                   command=f"{tmp_path}/train.sh")


def backend(api: SlurmApi, **kw: object) -> SlurmBackend:
    return SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=lambda s: None,
                        **kw)  # type: ignore[arg-type]


def decide(b: SlurmBackend, copies: dict[int, CopyRows], epoch: int = 0,
           now: float = 2000.0) -> tuple[Decision, list[Change]]:
    """The snapshot of ``b`` and a decision placing each job as ``{copy: [(node, gpus)]}``."""
    snap = b.snapshot(epoch, now, 60.0, None)
    rows = [(j, n, c, k) for j, cp in copies.items() for k, rr in cp.items() for n, c in rr]
    cols = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(4)]
    placement = Placement(cols[0], cols[1], cols[2], cols[3])
    decision = Decision(epoch, placement, np.full(snap.num_jobs, Reason.PLACED, dtype=np.int8))
    return decision, b.reconcile(snap, decision)


def step(b: SlurmBackend, copies: dict[int, CopyRows], epoch: int,
         now: float = 2000.0) -> Decision:
    decision, actions = decide(b, copies, epoch, now)
    b.apply(actions, now)
    return decision


def components(api: FakeSlurm, original: int = J) -> list[SlurmJob]:
    return sorted((j for j in api.jobs.values() if hadare.copy_of(j.comment) == original),
                  key=lambda j: j.job_id)


def start(api: FakeSlurm, leader: int, at: int = 1900) -> None:
    """Slurm starts the heterogeneous job ``leader`` (all components at once)."""
    for k, j in list(api.jobs.items()):
        if j.het_job_id == leader:
            api.jobs[k] = replace(j, state="RUNNING", state_reason="None",
                                  nodes=j.required_nodes, node_names=(j.required_nodes,),
                                  start_time=at)


def test_fork_submits_one_hetjob_for_the_owner_and_records_it(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [3]
    # not a study's trial: HadarE forks it only when it is long (issue #17's spread is not set)
    assert snap.spread is not None and snap.spread.tolist() == [False]
    step(b, {J: THREE}, 0)
    # the script, the intent (state=forking), sbatch, the record (state=forked, Dependency)
    assert api.log == [("batch_script", J), ("update", J), ("sbatch", 0), ("update", J)]
    assert [e["action"] for e in b.stats.applied] == ["fork_intent", "fork", "record"]
    # the copies are the sidecar's from the epoch that made them (state.json: copy_jobs)
    assert {c.job_id for c in components(api)} == b.copy_ids and len(b.copy_ids) == 3
    (script, owner, dependency), = api.submitted
    tracker = tmp_path / ".hadar-tracker" / str(J)
    assert script == str(tracker / "fork.sbatch") and dependency is None
    assert (owner.uid, owner.gid) == (os.geteuid(), os.getegid())
    assert (tracker / "job.sh").read_text() == api.script
    assert (tracker / "hints").read_text() == FORK_HINT + "\n"
    text = (tracker / "fork.sbatch").read_text()
    assert text.count("#SBATCH hetjob") == 2 and "--nodelist=node3" in text
    assert f"export HADAR_TRACKER_DIR={tracker}" in text
    assert f"{tracker}/job.sh --steps 40000 --out model.pt" in " ".join(text.split())
    comps = components(api)
    leader = comps[0].job_id
    assert [c.required_nodes for c in comps] == ["node1", "node2", "node3"]
    assert [c.het_job_offset for c in comps] == [0, 1, 2]
    rec = decode(api.jobs[J].admin_comment)
    assert (rec.state, rec.group, rec.copies, rec.epoch) == ("forked", leader, 3, 0)
    assert rec.place == (("node1", 1), ("node2", 1), ("node3", 1))
    assert api.jobs[J].dependency == f"afterany:{leader}"
    assert api.jobs[J].held  # the job itself waits for its copies

    # next epoch the copies are the job's current placement: the same decision changes nothing
    api.log.clear()
    _decision, actions = decide(b, {J: THREE}, 1)
    assert [a.kind for a in actions] == [ChangeKind.KEEP]
    b.apply(actions, 2001.0)
    assert api.log == [] and b.stats.commands_apply == 0
    start(api, leader)
    snap = b.snapshot(2, 2060.0, 60.0, None)
    assert snap.current.copies_of(J) == {0: [(0, 1)], 1: [(1, 1)], 2: [(2, 1)]}
    assert snap.node_gpus.tolist() == [4, 4, 2]  # the copies' GPUs are the job's, not foreign
    table = default_table()
    rates = sum(table.rate("ResNet-50 (batch size 64)", 1, t) for t in ("v100", "p100", "k80"))
    assert snap.remaining[0] == pytest.approx(40000 - 160 * rates, rel=1e-6)


def test_copies_of_an_array_task_are_told_which_task_they_are(tmp_path: Path) -> None:
    # The copies are a job of their own, not a task of the array: Slurm sets no
    # SLURM_ARRAY_TASK_ID for them, so the plan exports the task's (a study's trial launcher
    # picks its configuration by it). A job that is no array task gets none.
    task = replace(hinted(tmp_path), array_job_id=7, array_task_id=3)
    api = FakeSlurm([task], NODES)
    step(backend(api), {J: THREE}, 0)
    text = (tmp_path / ".hadar-tracker" / str(J) / "fork.sbatch").read_text()
    assert "export SLURM_ARRAY_JOB_ID=7\nexport SLURM_ARRAY_TASK_ID=3\n" in text
    other = tmp_path / "other"
    other.mkdir()
    api = FakeSlurm([replace(hinted(other), workdir=str(other))], NODES)
    step(backend(api), {J: THREE}, 0)
    assert "SLURM_ARRAY" not in (other / ".hadar-tracker" / str(J) / "fork.sbatch").read_text()


def test_copies_are_charged_and_sized_as_the_job(tmp_path: Path) -> None:
    """Each component asks for the job's account, QOS, memory per node and CPUs per task."""
    j = replace(hinted(tmp_path), account="proj-7", qos="normal", mem_per_node_mb=16000,
                mem_per_cpu_mb=None, cpus_per_node=4, partition="gpu", time_limit_min=90)
    api = FakeSlurm([j], NODES)
    step(backend(api), {J: THREE}, 0)
    text = (tmp_path / ".hadar-tracker" / str(J) / "fork.sbatch").read_text()
    for option in ("--account=proj-7", "--qos=normal", "--mem=16000M", "--cpus-per-task=4",
                   "--partition=gpu", "--time=90"):
        assert text.count(f"#SBATCH {option}\n") == 3, option
    assert "--mem-per-cpu" not in text

    per_cpu = replace(hinted(tmp_path, J + 1), mem_per_cpu_mb=256)  # DefMemPerCPU, as squeue
    api = FakeSlurm([per_cpu], NODES)
    step(backend(api), {J + 1: THREE}, 0)
    text = (tmp_path / ".hadar-tracker" / str(J + 1) / "fork.sbatch").read_text()
    assert text.count("#SBATCH --mem-per-cpu=256M\n") == 3
    assert "--account" not in text and "--qos" not in text and "--cpus-per-task" not in text


def crash_after_sbatch(api: FakeSlurm) -> None:
    """A sidecar that dies right after sbatch, before it records the fork on the job."""

    class CrashError(BaseException):  # (a process dying: not an error the sidecar handles)
        pass

    update = api.update_job
    calls: list[int] = []

    def dies_on_record(job_id: int, fields: Mapping[str, str]) -> None:
        calls.append(job_id)
        if len(calls) == 2:
            raise CrashError  # the intent got through, the record does not
        update(job_id, fields)

    api.update_job = dies_on_record  # type: ignore[method-assign]
    with pytest.raises(CrashError):
        step(backend(api), {J: THREE}, 0)
    api.update_job = update  # type: ignore[method-assign]
    assert decode(api.jobs[J].admin_comment).state == "forking"
    assert len(components(api)) == 3 and api.jobs[J].dependency == ""


def test_crash_between_submit_and_record_adopts_the_copies(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    crash_after_sbatch(api)
    leader = components(api)[0].job_id
    api.log.clear()
    b = backend(api)  # a restarted sidecar
    _decision, actions = decide(b, {J: THREE}, 1)
    assert [a.kind for a in actions] == [ChangeKind.KEEP]  # found by its comment
    b.apply(actions, 2001.0)
    assert api.log == [("update", J)] and len(api.submitted) == 1  # adopted, not forked again
    rec = decode(api.jobs[J].admin_comment)
    assert (rec.state, rec.group, rec.copies) == ("forked", leader, 3)
    assert api.jobs[J].dependency == f"afterany:{leader}"
    assert b.stats.applied[-1]["action"] == "adopt"


def test_crash_after_sbatch_then_the_copies_end_is_not_forked_again(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    crash_after_sbatch(api)
    leader = components(api)[0].job_id
    for c in components(api):  # the copies ran and ended before the sidecar came back
        api.jobs[c.job_id] = replace(c, state="COMPLETED")
    api.log.clear()
    b = backend(api)
    snap = b.snapshot(1, 2010.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [1]
    step(b, {J: {0: [(0, 1)]}}, 1)
    assert api.log == [("update", J), ("release", J)] and len(api.submitted) == 1
    rec = decode(api.jobs[J].admin_comment)
    assert rec.state == "placed" and rec.nofork and f"hetjob {leader}) completed" in rec.why


def test_an_interrupted_fork_that_was_never_submitted_may_fork_again(tmp_path: Path) -> None:
    # an earlier fork (cancelled by a move) is still in squeue; the new one died before sbatch
    old = JobRecord(epoch=4, state="forking", place=(("node1", 1), ("node2", 1)), gpus=1, args=ARGS,
                    group=5, copies=2)
    api = FakeSlurm([hinted(tmp_path, admin=old.encode()),
                     replace(job(5, comment=f"hadar-copy-of={J}", admin="", state="CANCELLED"),
                             het_job_id=5, het_job_offset=0)], NODES)
    b = backend(api)
    snap = b.snapshot(5, 2010.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [3]
    assert b.views[J].record.state == "held"
    step(b, {J: THREE}, 5)
    assert decode(api.jobs[J].admin_comment).state == "forked"


def test_move_ends_the_copies_then_places_the_job_in_the_same_epoch(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    slept: list[float] = []
    b = SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=slept.append)
    step(b, {J: THREE}, 0)
    old = components(api)[0].job_id
    start(api, old)
    api.log.clear()
    # two copies elsewhere: signal, grace, cancel, then a new fork that waits for the old one
    step(b, {J: {0: [(0, 1)], 1: [(1, 1)]}}, 1, now=2100.0)
    assert api.log == [("update", J), ("signal_steps", old), ("cancel", old),
                       ("batch_script", J), ("update", J), ("sbatch", 0), ("update", J)]
    assert slept == [0.25] * 20 and api.submitted[-1][2] == f"afterany:{old}"
    new = components(api)[-1].het_job_id
    assert new is not None and new != old
    rec = decode(api.jobs[J].admin_comment)
    assert (rec.state, rec.group, rec.copies) == ("forked", new, 2)
    assert all(c.state == "CANCELLED" for c in components(api) if c.het_job_id == old)
    # unforked: the job itself, placed and released; its dependency keeps it until the copies
    # are gone
    start(api, new)
    api.log.clear()
    step(b, {J: {0: [(1, 1)]}}, 2, now=2200.0)
    # (the job is placed while the copies have their grace: its dependency keeps it)
    assert api.log == [("update", J), ("signal_steps", new), ("update", J), ("release", J),
                       ("cancel", new)]
    rec = decode(api.jobs[J].admin_comment)
    assert (rec.state, rec.place, rec.group, rec.copies) == ("placed", (("node2", 1),), 0, 0)
    assert api.jobs[J].dependency == f"afterany:{new}"
    assert rec.done > 0 and rec.until == 2200.0


def test_the_grace_ends_when_the_copies_have_left_their_gpus(tmp_path: Path) -> None:
    # the copies checkpoint on the signal and exit 75: slurmctld requeues the heterogeneous job
    # held (RequeueExitHold), pending: they have left their GPUs, and the grace ends there (the
    # requeued copies are cancelled), not at its deadline
    api = FakeSlurm([hinted(tmp_path)], NODES)
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        if len(slept) == 3:
            for c in components(api):
                api.jobs[c.job_id] = replace(c, state="PENDING", state_reason="JobHeldUser",
                                             nodes="", node_names=())

    b = SlurmBackend(api, default_table(), preempt_grace_s=5.0, sleep=sleep)
    step(b, {J: THREE}, 0)
    old = components(api)[0].job_id
    start(api, old)
    api.log.clear()
    step(b, {J: {0: [(1, 1)]}}, 1, now=2100.0)
    assert slept == [0.25] * 3
    assert api.log == [("update", J), ("signal_steps", old), ("update", J), ("release", J),
                       ("cancel", old)]


def test_preempted_copies_leave_the_job_held(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)
    leader = components(api)[0].job_id
    start(api, leader)
    api.log.clear()
    step(b, {}, 1)
    assert api.log == [("update", J), ("signal_steps", leader), ("cancel", leader)]
    rec = decode(api.jobs[J].admin_comment)
    assert (rec.state, rec.group) == ("held", 0) and api.jobs[J].held
    # the copies are gone; the next epoch may fork it again
    snap = b.snapshot(2, 2010.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [3]
    assert len(snap.current) == 0


def test_copies_that_ended_by_themselves_let_the_job_finish_unforked(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)
    for c in components(api):
        api.jobs[c.job_id] = replace(c, state="COMPLETED")
    tracker = tmp_path / ".hadar-tracker" / str(J)
    (tracker / "progress.json").write_text(json.dumps({
        "format": 1, "work": 40000, "done": 40000, "rounds": 9, "complete": True,
        "copy_rates": [{"copy": 0, "gpu_type": "v100", "iters_per_s": 80.0},
                       {"copy": 1, "gpu_type": "p100", "iters_per_s": 50.0}]}))
    api.log.clear()
    snap = b.snapshot(1, 2500.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [1]  # never again
    assert len(snap.current) == 0 and snap.remaining[0] == 40.0  # done, by the tracker
    progress = b.views[J].progress
    assert progress is not None and progress.total_rate == 130.0
    step(b, {J: {0: [(0, 1)]}}, 1, now=2500.0)
    assert api.log == [("update", J), ("release", J)]
    rec = decode(api.jobs[J].admin_comment)
    assert rec.state == "placed" and rec.nofork and "finishes unforked" in rec.why


@pytest.mark.parametrize("error", [
    SlurmCommandError(("sbatch",), "failed", stderr="sbatch: error: Batch job submission failed"),
    SlurmCommandError(("scontrol",), "failed"),  # the batch script cannot be fetched
])
def test_failed_fork_places_the_job_unforked_on_copy_0(tmp_path: Path,
                                                       error: Exception) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    if error.args and "scontrol" in str(error):
        api.fail.add(("batch_script", J))
    else:
        api.submit_error = error
    b = backend(api)
    step(b, {J: {0: [(1, 1)], 1: [(0, 1)]}}, 0)
    assert api.log[-2:] == [("update", J), ("release", J)]
    rec = decode(api.jobs[J].admin_comment)
    assert (rec.state, rec.place, rec.nofork) == ("placed", (("node2", 1),), True)
    assert rec.why.startswith("fork failed: ") and "fork failed" in b.report.detail[J]
    assert components(api) == []
    # it is not forked again: the policy is told it may run as one copy only
    snap = b.snapshot(1, 2010.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [1]


def test_unwritable_tracker_root_falls_back(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api, tracker_root=str(blocker))
    step(b, {J: THREE}, 0)
    assert ("sbatch", 0) not in api.log and api.log[-1] == ("release", J)
    rec = decode(api.jobs[J].admin_comment)
    assert rec.state == "placed" and rec.place == (("node1", 1),)
    assert "cannot write the tracker directory" in rec.why


def test_sbatch_timeout_leaves_the_job_held_then_adopts_or_places(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    api.submit_error = SlurmTimeoutError(("sbatch",), "timed out after 30 s")
    b = backend(api)
    step(b, {J: THREE}, 0)
    assert api.jobs[J].held and ("release", J) not in api.log  # not released: maybe submitted
    rec = decode(api.jobs[J].admin_comment)
    assert rec.state == "forking" and rec.nofork and "timed out" in rec.why
    # it was not submitted: the next epoch runs the job unforked (it may not fork any more)
    snap = b.snapshot(1, 2010.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [1]
    step(b, {J: {0: [(0, 1)]}}, 1)
    assert api.log[-1] == ("release", J)


def test_sbatch_timeout_that_did_submit_is_adopted(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)  # submitted and recorded...
    leader = components(api)[0].job_id
    rec = decode(api.jobs[J].admin_comment).with_(state="forking", group=0, nofork=True,
                                                  why="fork failed: timed out")
    api.jobs[J] = replace(api.jobs[J], admin_comment=rec.encode(), dependency="")  # ...not
    api.log.clear()
    step(b, {J: THREE}, 1)
    assert api.log == [("update", J)] and api.jobs[J].dependency == f"afterany:{leader}"
    assert decode(api.jobs[J].admin_comment).state == "forked"


def test_copies_of_a_vanished_job_are_cancelled(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)
    leader = components(api)[0].job_id
    start(api, leader)
    api.jobs[J] = replace(api.jobs[J], state="CANCELLED")  # scancel by its user
    api.log.clear()
    step(b, {}, 1)
    assert api.log == [("cancel", leader)]
    del api.jobs[J]  # gone from squeue: nothing more to do (its copies are cancelled)
    api.log.clear()
    step(b, {}, 2)
    assert api.log == []


def two_forks(tmp_path: Path) -> tuple[FakeSlurm, SlurmBackend, int, int]:
    """A job forked by the sidecar (hetjob ``first``, recorded), then a second fork of it with
    the same owner and script (hetjob ``second``) that no record names."""
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)
    first = components(api)[0].job_id
    api.submit_as(str(Path(api.submitted[0][0])), api.submitted[0][1])
    second = components(api)[-1].het_job_id
    assert second is not None
    return api, b, first, second


def test_an_older_live_fork_of_the_same_job_is_cancelled(tmp_path: Path) -> None:
    # a second fork of the same job: the sidecar recorded its intent to fork again after the
    # first (state=forking group=first), submitted, and died before recording the new one
    api, b, first, second = two_forks(tmp_path)
    rec = decode(api.jobs[J].admin_comment)
    api.update_job(J, {"AdminComment": rec.with_(state="forking", group=first).encode()})
    api.log.clear()
    step(b, {J: THREE}, 1)
    assert ("cancel", first) in api.log and ("cancel", second) not in api.log
    assert decode(api.jobs[J].admin_comment).group == second


def test_a_fork_newer_than_the_recorded_one_is_not_taken_for_ours(tmp_path: Path) -> None:
    # the record says the job runs as hetjob `first`; a newer "fork" with the same comment,
    # owner and script was not submitted by the sidecar (it records before it submits): it is
    # an ordinary job, neither cancelled nor counted as the job's copies
    api, b, first, second = two_forks(tmp_path)
    api.log.clear()
    step(b, {J: THREE}, 1)
    assert ("cancel", second) not in api.log and ("cancel", first) not in api.log
    assert decode(api.jobs[J].admin_comment).group == first
    assert second not in b.copy_ids and first in b.copy_ids


def test_who_may_be_forked(tmp_path: Path) -> None:
    api = FakeSlurm([
        hinted(tmp_path, 1, comment="hadar: model=resnet50 bs=64 steps=40000"),  # no fork hint
        hinted(tmp_path, 2),
        replace(hinted(tmp_path, 3), user_id=None),  # Slurm did not say whose it is
        replace(hinted(tmp_path, 4), dependency="afterok:1(unfulfilled)"),  # waits for job 1
        replace(hinted(tmp_path, 5), workdir=""),
        replace(hinted(tmp_path, 6), admin_comment=JobRecord(epoch=1, state="held", nofork=True,
                                                             why="fork failed: x").encode()),
        # its script's arguments were not recorded (too long, or submitted without the plugin)
        hinted(tmp_path, 7, admin="hadar: waits for the sidecar args=-"),
        hinted(tmp_path, 8, admin="hadar: waits for the sidecar"),
    ], NODES)
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [1, 3, 1, 1, 1, 1, 1, 1]
    blocked = {j: b.views[j].fork_blocked for j in range(1, 9)}
    assert blocked[1] == "" and blocked[2] == ""
    assert "user and group id" in blocked[3] and "dependency" in blocked[4]
    assert "working directory" in blocked[5] and blocked[6] == "fork failed: x"
    assert blocked[7] == blocked[8] and "arguments were not recorded" in blocked[7]
    api.can_fork = False  # e.g. the pyslurm backend
    b.snapshot(0, 2000.0, 60.0, None)
    assert "cannot fork" in b.views[2].fork_blocked and b.views[2].max_copies == 1
    # a policy that forks a job all the same gets it unforked, with the reason recorded
    step(b, {2: THREE}, 0)
    rec = decode(api.jobs[2].admin_comment)
    assert rec.state == "placed" and rec.why.startswith("not forked: the fake backend")


def test_copies_get_the_recorded_arguments_exactly(tmp_path: Path) -> None:
    # Arguments with spaces, quotes, commas and shell syntax reach the copies as they were
    # given to sbatch: one word each, quoted in the plan (no shell ever splits them).
    args = ("a", "b c", "", "it's", "$(touch x)", "x,y=%20")
    api = FakeSlurm([hinted(tmp_path, admin=f"hadar: held for the sidecar "
                                            f"args={encode_args(args)}")], NODES)
    b = backend(api)
    # an epoch that only places the job keeps the arguments in its record
    step(b, {J: {0: [(1, 1)]}}, 0)
    assert decode(api.jobs[J].admin_comment).args == args
    api.jobs[J] = replace(api.jobs[J], state_reason="JobHeldAdmin", priority=0)
    step(b, {J: THREE}, 1)
    text = (tmp_path / ".hadar-tracker" / str(J) / "fork.sbatch").read_text()
    # the command array of the plan, one element a line, read as the shell would
    lines = text.split("_hadar_cmd=(\n", 1)[1].split("\n)\n", 1)[0].splitlines()
    words = [w for line in lines for w in shlex.split(line)]
    assert words == ["bash", str(tmp_path / ".hadar-tracker" / str(J) / "job.sh"), *args]
    assert decode(api.jobs[J].admin_comment).args == args  # kept by the fork's record too


def test_a_released_job_is_held_before_it_is_forked(tmp_path: Path) -> None:
    placed = JobRecord(epoch=0, state="placed", place=(("node2", 1),), gpus=1, args=ARGS)
    api = FakeSlurm([hinted(tmp_path, reason="Resources", admin=placed.encode())], NODES)
    b = backend(api)
    step(b, {J: THREE}, 1)
    assert api.log == [("hold", J), ("update", J)] and api.submitted == []
    step(b, {J: THREE}, 2)
    assert api.log[-1] == ("update", J) and len(api.submitted) == 1


def test_a_running_unforked_job_is_preempted_to_be_forked(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path, state="RUNNING", reason="None", nodes=("node1",),
                            start=1900)], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)
    # stopped (record, signal, grace, requeue, record), then forked in the same epoch
    assert api.log[:4] == [("update", J), ("signal", J), ("requeuehold", J), ("update", J)]
    assert ("sbatch", 0) in api.log and len(components(api)) == 3
    rec = decode(api.jobs[J].admin_comment)
    assert rec.state == "forked" and rec.group == components(api)[0].job_id


def test_dry_run_forks_nothing(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    dry = DryRunApi(api)
    b = backend(dry)
    step(b, {J: THREE}, 0)
    # it reads the batch script (a read); every change is only written down
    assert api.log == [("batch_script", J)] and api.submitted == []
    assert [w[0] for w in dry.would] == ["files", "update", "sbatch", "update"]
    assert not (tmp_path / ".hadar-tracker").exists()
    assert [e["action"] for e in b.stats.applied] == ["fork_intent", "fork", "record"]
    # the fork it would have made counts as live (it never ends by itself)
    assert b.ended_since_epoch() == []


def test_status_and_explain_show_the_fork(tmp_path: Path) -> None:
    api = FakeSlurm([hinted(tmp_path)], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)
    leader = components(api)[0].job_id
    start(api, leader)
    tracker = tmp_path / ".hadar-tracker" / str(J)
    (tracker / "progress.json").write_text(json.dumps({
        "format": 1, "work": 40000, "done": 12000, "rounds": 4, "complete": False,
        "copy_rates": [{"copy": 0, "gpu_type": "v100", "iters_per_s": 80.0},
                       {"copy": 1, "gpu_type": "p100", "iters_per_s": 50.5},
                       {"copy": 2, "gpu_type": "k80", "iters_per_s": 20.0}]}))
    decision = step(b, {J: THREE}, 1, now=2100.0)
    snap = b.snapshot(1, 2100.0, 60.0, None)
    state = json.loads(json.dumps(epoch_state(default_config(), b, snap, decision)))
    info = state["jobs"][str(J)]
    assert info["forked"]["group"] == leader and info["copies"] == 3
    assert info["progress"]["done"] == 12000 and info["progress"]["rates"]["1"] == 50.5
    jobs = list(api.jobs.values())
    rows = {r["job"]: r["why"] for r in status_rows(jobs, state)}
    assert rows[str(J)].startswith(f"forked into 3 copies as hetjob {leader} on node1, node2")
    assert rows[str(leader + 2)] == f"copy 2 of job {J} (HadarE: hetjob {leader})"
    text = explain(J, jobs, state)
    assert f"forked into 3 copies as hetjob {leader} on node1 (v100), node2 (p100), node3 (k80)"\
        in text
    assert "12000 of 40000 iterations, 4 rounds" in text
    assert "copy 0 (v100) 80 it/s, copy 1 (p100) 50.5 it/s, copy 2 (k80) 20 it/s" in text
    assert f"copy 1 of job {J}" in explain(leader + 1, jobs, state)


def test_find_groups_and_helpers() -> None:
    comps = [replace(job(k, comment=f"hadar-copy-of={J}", admin=""), het_job_id=20,
                     het_job_offset=k - 20) for k in (22, 20, 21)]
    plain = replace(job(30, comment=f" hadar-copy-of={J} ", admin=""), state="COMPLETED")
    groups = hadare.find_groups([*comps, plain, job(1)])
    assert [g.leader for g in groups[J]] == [20, 30]
    g = groups[J][0]
    assert [c.job_id for c in g.components] == [20, 21, 22] and g.live and not g.running
    assert not groups[J][1].live and groups[J][1].completed
    assert hadare.copy_of("hadar-copy-of=x") is None and hadare.copy_of("hadar: x") is None
    assert hadare.dependency_jobs("afterany:57(unfulfilled),afterok:3?singleton") == [57, 3]
    assert hadare.sbatch_name("my job #1", 5) == "my_job__1" and hadare.sbatch_name("", 5) \
        == "hadar-5"
    assert hadare.LIVE_STATES == PENDING_STATES | RUNNING_STATES
    assert hadare.RUNNING_STATES == RUNNING_STATES


def test_progress_file_is_read_defensively(tmp_path: Path) -> None:
    assert hadare.read_progress(str(tmp_path)) is None
    (tmp_path / "progress.json").write_text('{"done": 5')  # half written
    assert hadare.read_progress(str(tmp_path)) is None
    (tmp_path / "progress.json").write_text('{"done": -1}')
    assert hadare.read_progress(str(tmp_path)) is None
    (tmp_path / "progress.json").write_text(json.dumps(
        {"done": 7, "work": 9, "copy_rates": [None, {"copy": "x"}, {"copy": 1,
                                                                    "iters_per_s": 2.5}]}))
    p = hadare.read_progress(str(tmp_path))
    assert p is not None and (p.done, p.work, p.rates, p.complete) == (7.0, 9.0, {1: 2.5}, False)
    (tmp_path / "elsewhere.json").write_text('{"done": 1}')
    (tmp_path / "progress.json").unlink()
    (tmp_path / "progress.json").symlink_to(tmp_path / "elsewhere.json")
    assert hadare.read_progress(str(tmp_path)) is None  # a symlink is not followed


def test_record_of_a_fork_round_trips() -> None:
    rec = JobRecord(epoch=3, state="forked", place=(("node1", 1), ("node2", 1)), gpus=1,
                    group=57, copies=2, nofork=True, why="x y")
    text = rec.encode()
    assert "state=forked" in text and "group=57 copies=2 nofork=1 why=x y" in text
    assert decode(text) == rec
    assert decode("hadar epoch=1 state=forked group=-4") == JobRecord()


def test_a_parked_job_is_forked_without_a_hold(tmp_path: Path) -> None:
    # job_submit.lua parks a job (begin time years ahead); forked, it stays parked (and waits
    # for its copies by its dependency): no hold, which would hide a hold of its user's
    J_parked = replace(hinted(tmp_path), state_reason="BeginTime",
                       admin_comment=f"hadar: waits for the sidecar args={encode_args(ARGS)}",
                       eligible_time=2000 + 10 * 365 * 86400)
    api = FakeSlurm([J_parked], NODES)
    b = backend(api)
    step(b, {J: THREE}, 0)
    assert api.log == [("batch_script", J), ("update", J), ("sbatch", 0), ("update", J)]
    step(b, {J: THREE}, 1)  # the copies run as decided: nothing to change, still no hold
    assert ("hold", J) not in api.log
    assert api.jobs[J].eligible_time == J_parked.eligible_time


def test_fork_writes_as_the_owner_the_way_slurm_commands_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """write_files_as (another owner) and SlurmRunner.run(as_user=) switch user the same way:
    the owner's uid, gid, groups and environment, in /."""
    import subprocess

    from hadar_slurm.slurm import RunAs, SlurmRunner
    from hadar_slurm.slurm.runner import write_files_as

    owner = RunAs(os.geteuid() + 1, 4242, (4242, 27), {"PATH": "/bin", "HOME": "/home/u"})
    seen: list[tuple[object, dict[str, object]]] = []

    def fake_run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        seen.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    write_files_as(owner, "/t/.hadar-tracker/7", {"hints": "model=lm"})
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    SlurmRunner(conf).run(["squeue"], as_user=owner)
    (mkdir, mk_kw), (tee, tee_kw), (_squeue, run_kw) = seen
    assert mkdir == ["mkdir", "-p", "--", "/t/.hadar-tracker/7"]
    assert tee == ["tee", "--", "/t/.hadar-tracker/7/hints"] and tee_kw["input"] == "model=lm"
    for kw in (mk_kw, tee_kw, run_kw):
        assert (kw["user"], kw["group"], kw["extra_groups"], kw["cwd"]) == (
            owner.uid, 4242, [4242, 27], "/")
    assert mk_kw["env"] == {"PATH": "/bin", "HOME": "/home/u"}
    assert run_kw["env"] == {"PATH": "/bin", "HOME": "/home/u", "SLURM_CONF": str(conf)}


def test_the_sidecar_builds_hadare_from_settings_and_slurm_tells_it_the_world(
        config_file: Path) -> None:  # noqa: F811
    # No setting is patched onto the policy: it is HadarE as the registry builds it, and what
    # Slurm allows (one node per copy) and what a move costs come in the backend's snapshots.
    config = config_of(config_file, policy="hadare", migration_s=45.0)
    sidecar = Sidecar(config, api=FakeSlurm([job(1)], NODES))
    try:
        assert sidecar.policy == make_policy("hadare")
        snap = sidecar.backend.snapshot(0, 2000.0, 60.0, None)
        assert snap.multi_node_copies is False and snap.migration_s == 45.0
    finally:
        sidecar.close()
