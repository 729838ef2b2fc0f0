"""Reconcile as data: :func:`hadar_slurm.sidecar.reconcile.reconcile` is a pure function from
what the sidecar observed and a decision to a list of changes, tested here on plain data (job
views built by hand, no Slurm and no fake of it); the simulator's :func:`hadar_slurm.loop.diff`
speaks the same :class:`~hadar_slurm.loop.Change`; the applier skips changes it has applied
(by key); the crash drill is a wrapper of the API."""

from __future__ import annotations

import copy
import os
import signal
from dataclasses import replace

import numpy as np
import pytest

from hadar_slurm.hints import ModelCatalog, parse_hints
from hadar_slurm.loop import Change, ChangeKind, diff, placement_of
from hadar_slurm.policy.base import Decision, Placement, Reason, Snapshot
from hadar_slurm.rates.table import default_table
from hadar_slurm.sidecar.apply import start_time
from hadar_slurm.sidecar.fork import CopyGroup
from hadar_slurm.sidecar.observe import GroupEnd, JobView, Observed, Unsteered
from hadar_slurm.sidecar.reconcile import reconcile
from hadar_slurm.sidecar.record import JobRecord
from hadar_slurm.slurm import api as slurm_api
from hadar_slurm.slurm.api import CRASH_ENV, CrashDrillApi, with_drills
from hadar_slurm.slurm.parse import SlurmJob
from tests.test_sidecar_backend import HINT, NODES, FakeSlurm, backend, job

NAMES = ("node1", "node2", "node3")
CATALOG = ModelCatalog.from_table(default_table())


def view(job_id: int, *, running: bool = False, rows: tuple[tuple[int, int], ...] = (),
         record: JobRecord | None = None, held: bool = True, gpus: int = 1,
         group: CopyGroup | None = None, row_copy: tuple[int, ...] = (),
         fork_blocked: str = "", parked: bool = False) -> JobView:
    state = "RUNNING" if running else "PENDING"
    reason = "None" if running or not held else "JobHeldAdmin"
    sj = job(job_id, state=state, reason=reason, gpus=gpus,
             nodes=tuple(NAMES[k] for k, _ in rows) if running else ())
    return JobView(sj, parse_hints(HINT, CATALOG, gpus=gpus), record or JobRecord(), gpus,
                   running, rows, 0.0, {}, (1.0, 1.0, 1.0), row_copy=row_copy, group=group,
                   max_copies=3, fork_blocked=fork_blocked, parked=parked)


def observed(*views: JobView, unsteered: tuple[Unsteered, ...] = (),
             orphans: tuple[GroupEnd, ...] = (), moves_left: tuple[SlurmJob, ...] = ()
             ) -> Observed:
    return Observed({v.job_id: v for v in views}, unsteered, orphans, moves_left, NAMES)


def decision(epoch: int, copies: dict[int, dict[int, list[tuple[int, int]]]]) -> Decision:
    rows = [(j, n, c, k) for j, cp in copies.items() for k, rr in cp.items() for n, c in rr]
    cols = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(4)]
    return Decision(epoch, Placement(cols[0], cols[1], cols[2], cols[3]),
                    np.zeros(0, dtype=np.int8))


def kinds(changes: list[Change]) -> list[tuple[str, int]]:
    return [(c.kind.value, c.job_id) for c in changes]


def group(original: int, leader: int, nodes: tuple[str, ...], state: str = "RUNNING"
          ) -> CopyGroup:
    comps = tuple(replace(job(leader + k, state=state, reason="None", nodes=(n,)),
                          het_job_id=leader, het_job_offset=k) for k, n in enumerate(nodes))
    return CopyGroup(original, leader, comps)


def test_pending_jobs_are_placed_kept_or_wait() -> None:
    placed_there = JobRecord(epoch=0, state="placed", place=(("node2", 1),), gpus=1)
    obs = observed(view(1), view(2, record=placed_there), view(3, record=placed_there),
                   view(4))
    out = reconcile(obs, decision(5, {1: {0: [(0, 1)]}, 2: {0: [(1, 1)]}, 3: {0: [(0, 1)]}}))
    assert kinds(out) == [("keep", 2), ("place", 1), ("place", 3), ("wait", 4)]
    assert out[1].copies == (((0, 1),),) and out[1].rows == ((0, 1),)
    assert all(c.epoch == 5 for c in out)


def test_running_jobs_are_kept_moved_or_stopped() -> None:
    moving = JobRecord(epoch=3, state="preempting", deadline=10.0)
    obs = observed(view(1, running=True, rows=((0, 1),)), view(2, running=True, rows=((0, 1),)),
                   view(3, running=True, rows=((2, 1),)),
                   view(4, running=True, rows=((1, 1),), record=moving))
    out = reconcile(obs, decision(1, {1: {0: [(0, 1)]}, 2: {0: [(1, 1)]}, 4: {0: [(1, 1)]}}))
    # a move begun by an earlier epoch (record preempting) goes on even where it stands
    assert kinds(out) == [("keep", 1), ("move", 2), ("stop", 3), ("move", 4)]
    assert out[1].copies == (((1, 1),),) and out[2].copies == ()
    # a stop says why the policy did not place the job, when told
    assert out[2].why == "the decision stops it"
    told = reconcile(obs, decision(1, {1: {0: [(0, 1)]}, 2: {0: [(1, 1)]}, 4: {0: [(1, 1)]}}),
                     {3: "PRICED_OUT"})
    assert told[2].why == "the decision stops it (PRICED_OUT)"
    # a running job the decision forks is moved too (stopped now, forked later)
    out = reconcile(obs, decision(1, {1: {0: [(0, 1)], 1: [(1, 1)]}}))
    assert ("move", 1) in kinds(out)


def test_what_slurm_cannot_express_waits_or_runs_unforked_with_the_reason() -> None:
    obs = observed(view(1, gpus=4), view(2, fork_blocked="it waits for its dependency"),
                   view(3, held=False), view(4, held=False, parked=True), view(5))
    out = reconcile(obs, decision(0, {
        1: {0: [(0, 3), (1, 1)]},                       # unequal GPU counts per node
        2: {0: [(1, 1)], 1: [(0, 1)]},                  # may not be forked
        3: {0: [(1, 1)], 1: [(0, 1)]},                  # released earlier, not started
        4: {0: [(1, 1)], 1: [(2, 1)]},                  # parked: forked now
        5: {0: [(0, 1)], 1: [(1, 1)], 2: [(2, 1)]},     # held: forked now
    }))
    by = {c.job_id: c for c in out}
    assert by[1].kind is ChangeKind.WAIT and "unequal GPU counts (node1:3, node2:1)" in by[1].why
    assert (by[2].kind, by[2].nofork, by[2].copies) == (ChangeKind.PLACE, True, (((1, 1),),))
    assert by[2].why == "not forked: it waits for its dependency"
    assert by[3].kind is ChangeKind.WAIT and "forked" in by[3].why
    assert by[4].kind is ChangeKind.FORK and by[4].copies == (((1, 1),), ((2, 1),))
    assert by[5].kind is ChangeKind.FORK and len(by[5].copies) == 3 and by[5].group == 0
    assert [c.kind for c in out] == [ChangeKind.PLACE, ChangeKind.FORK, ChangeKind.FORK,
                                     ChangeKind.WAIT, ChangeKind.WAIT]


def test_a_running_job_is_not_moved_where_slurm_cannot_run_it() -> None:
    # 4 GPUs on node1 and node2 with 2 each: the decision wants node1:1 + node2:3, which one
    # Slurm job cannot express (the placement would set 1 or 3 GPUs per node): it stays
    obs = observed(view(1, running=True, rows=((0, 2), (1, 2)), gpus=4))
    out = reconcile(obs, decision(2, {1: {0: [(0, 1), (1, 3)]}}))
    assert kinds(out) == [("keep", 1)] and out[0].copies == (((0, 2), (1, 2)),)
    assert "unequal GPU counts (node1:1, node2:3)" in out[0].why and "stays" in out[0].why
    # an even move is a move
    out = reconcile(obs, decision(2, {1: {0: [(0, 2), (2, 2)]}}))
    assert kinds(out) == [("move", 1)]


def test_a_moved_job_starts_two_seconds_after_its_last_run_ended() -> None:
    assert start_time(None, 1000.0) == "now"
    assert start_time(1000.4, 1000.5) == "now+2"  # not in second 1000, nor in 1001
    assert start_time(1000.9, 1001.2) == "now+1"
    assert start_time(1000.9, 1002.0) == "now"
    assert start_time(990.0, 1000.0) == "now"


def test_forks_are_kept_ended_or_replaced() -> None:
    g = group(1, 500, ("node1", "node2"))
    forked = JobRecord(epoch=0, state="forked", group=500, copies=2)
    v = view(1, rows=((0, 1), (1, 1)), row_copy=(0, 1), group=g, record=forked)
    same = reconcile(observed(v), decision(2, {1: {0: [(1, 1)], 1: [(0, 1)]}}))
    assert kinds(same) == [("keep", 1)] and same[0].group == 500  # copy numbers aside
    other = reconcile(observed(v), decision(2, {1: {0: [(2, 1)], 1: [(0, 1)]}}))
    assert kinds(other) == [("end_fork", 1), ("fork", 1)]
    assert other[0].group == 500 and other[1].group == 500  # the new copies wait for the old
    assert "2 other copies" in other[0].why
    alone = reconcile(observed(v), decision(2, {1: {0: [(2, 1)]}}))
    assert kinds(alone) == [("end_fork", 1), ("place", 1)]
    assert alone[0].why == "the decision runs it unforked"
    stopped = reconcile(observed(v), decision(2, {}))
    assert kinds(stopped) == [("end_fork", 1), ("wait", 1)]


def test_jobs_outside_the_policy_come_first_in_apply_order() -> None:
    orphan = GroupEnd(group(7, 900, ("node3",)), None, "job 7 is gone")
    left = job(8, state="FAILED", reason="None")
    gone = Unsteered(job(9), JobRecord(), "bad hints: steps: not a number")
    out = reconcile(observed(view(1), view(2, running=True, rows=((0, 1),)),
                             unsteered=(gone,), orphans=(orphan,), moves_left=(left,)),
                    decision(4, {1: {0: [(1, 1)]}}))
    assert kinds(out) == [("requeue", 8), ("unsteer", 9), ("end_fork", 7), ("stop", 2),
                          ("place", 1)]
    assert out[1].why == "bad hints: steps: not a number" and out[2].group == 900


def test_reconcile_is_pure() -> None:
    obs = observed(view(1), view(2, running=True, rows=((0, 1),)),
                   view(3, record=JobRecord(state="placed", place=(("node1", 1),))))
    dec = decision(3, {1: {0: [(1, 1)], 1: [(2, 1)]}, 3: {0: [(1, 1)]}})
    before = copy.deepcopy(obs)
    first = reconcile(obs, dec)
    assert reconcile(obs, dec) == first
    assert obs == before and dec.detail == {}


def _snapshot(current: Placement) -> Snapshot:
    z = np.zeros(0)
    return Snapshot(0, 0.0, 360.0, (), NAMES, np.zeros(3, dtype=np.int64),
                    np.ones(3, dtype=np.int64), np.zeros(0, dtype=np.int64), (), z, z, z,
                    np.zeros(0, dtype=np.int64), z, np.zeros(0, dtype=np.bool_),
                    np.zeros((0, 0)), np.zeros((0, 0)), current)


def test_the_simulators_diff_speaks_the_same_changes() -> None:
    current = decision(0, {1: {0: [(0, 1)]}, 2: {0: [(1, 1)]}, 3: {0: [(2, 1)]}}).placement
    dec = decision(1, {1: {0: [(0, 1)]}, 2: {0: [(2, 1)]}, 4: {0: [(1, 1)]},
                       5: {0: [(0, 1)], 1: [(1, 1)]}})
    out = diff(_snapshot(current), dec)
    assert kinds(out) == [("keep", 1), ("move", 2), ("place", 4), ("fork", 5), ("stop", 3)]
    assert placement_of(out).same_as(dec.placement)
    assert placement_of(out).num_copies() == {1: 1, 2: 1, 4: 1, 5: 2}


def test_applying_a_list_twice_changes_nothing_the_second_time() -> None:
    api = FakeSlurm([job(1), job(2)], NODES)
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    dec = Decision(0, Placement(np.array([1, 2]), np.array([0, 1]), np.array([1, 1])),
                   np.full(snap.num_jobs, Reason.PLACED, dtype=np.int8))
    changes = b.reconcile(snap, dec)
    first = b.apply(changes, 2000.0)
    assert [e["action"] for e in first.applied] == ["place", "release"] * 2
    calls = list(api.log)
    again = b.apply(changes, 2000.0)
    assert api.log == calls and again.applied == [] and again.skipped == len(changes)


def test_the_applier_reports_what_it_did_and_writes_nothing_into_the_decision() -> None:
    api = FakeSlurm([job(1, gpus=4)], NODES)
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    dec = Decision(0, Placement(np.array([1, 1]), np.array([0, 1]), np.array([3, 1])),
                   np.full(snap.num_jobs, Reason.PLACED, dtype=np.int8))
    report = b.apply(b.reconcile(snap, dec), 2000.0)
    assert dec.detail == {} and "unequal GPU counts" in report.detail[1]
    assert report is b.report and report.errors == []


def test_crash_drill_kills_before_the_change_after_the_nth(
        monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[int] = []

    class KilledError(Exception):
        pass

    def kill(pid: int, sig: int) -> None:
        assert pid == os.getpid() and sig == signal.SIGKILL
        killed.append(pid)
        raise KilledError

    monkeypatch.setattr(slurm_api.os, "kill", kill)
    inner = FakeSlurm([job(1), job(2)], NODES)
    api = CrashDrillApi(inner, 2)
    api.read_jobs()
    api.hold(1)
    api.update_job(1, {"AdminComment": "x"})
    assert killed == [] and api.writes == 2
    with pytest.raises(KilledError):
        api.release(1)  # the third change: never made
    assert ("release", 1) not in inner.log and killed
    assert isinstance(with_drills(inner, {CRASH_ENV: "3"}), CrashDrillApi)
    assert with_drills(inner, {}) is inner and with_drills(inner, {CRASH_ENV: "x"}) is inner
