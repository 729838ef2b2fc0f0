"""Jobs fixed where they run (``Snapshot.fixed``: the sidecar's ``preempt=never`` jobs that
run): the epoch loop keeps them there whatever the policy planned (:func:`keep_fixed`), on
scenarios worked by hand; and the loop applies it to a policy that would move one."""

from __future__ import annotations

import numpy as np

from hadar_slurm.loop import keep_fixed
from hadar_slurm.policy.base import Decision, Placement, Reason, Snapshot


def placement(rows: list[tuple[int, int, int]]) -> Placement:
    """``(job, node, count)`` rows."""
    return Placement(np.array([r[0] for r in rows], dtype=np.int64),
                     np.array([r[1] for r in rows], dtype=np.int64),
                     np.array([r[2] for r in rows], dtype=np.int64))


def snapshot(current: list[tuple[int, int, int]], fixed: list[int],
             jobs: tuple[int, ...] = (1, 2, 3)) -> Snapshot:
    """Two nodes of two GPUs each, one type; jobs of one GPU unless the rows say more."""
    n = len(jobs)
    ids = np.array(jobs, dtype=np.int64)
    return Snapshot(
        epoch=1, now=100.0, round_s=60.0, gpu_types=("v100",), node_names=("n0", "n1"),
        node_type=np.zeros(2, dtype=np.int64), node_gpus=np.array([2, 2], dtype=np.int64),
        job_ids=ids, job_types=("t",) * n, arrival=np.zeros(n), total=np.full(n, 100.0),
        remaining=np.full(n, 50.0), scale=np.ones(n, dtype=np.int64), weight=np.ones(n),
        sync=np.ones(n, dtype=np.bool_), rate=np.ones((n, 1)), attained=np.zeros((n, 1)),
        current=placement(current), fixed=np.isin(ids, fixed))


def decision(snap: Snapshot, rows: list[tuple[int, int, int]]) -> Decision:
    placed = np.isin(snap.job_ids, [r[0] for r in rows])
    reason = np.where(placed, Reason.PLACED, Reason.PRICED_OUT).astype(np.int8)
    return Decision(snap.epoch, placement(rows), reason)


def test_a_fixed_job_stays_and_a_job_planned_on_its_gpus_waits() -> None:
    # job 1 (fixed) runs on n0; the policy moves it to n1 and puts job 3, two GPUs, on n0
    snap = snapshot(current=[(1, 0, 1), (2, 1, 1)], fixed=[1])
    out = keep_fixed(snap, decision(snap, [(1, 1, 1), (2, 1, 1), (3, 0, 2)]))
    # job 1 back on n0: n0 would give out 3 GPUs of 2, job 3 is the newcomer there and holds
    # nothing now: not placed; job 2 keeps n1
    assert out.placement.by_job_sorted() == {1: [(0, 1)], 2: [(1, 1)]}
    assert out.reason.tolist() == [Reason.PLACED, Reason.PLACED, Reason.NO_FREE_GPU]
    assert "preempt=never" in out.detail[3]


def test_a_running_job_planned_on_a_fixed_jobs_gpus_stays_where_it_runs() -> None:
    # job 1 (fixed) holds both GPUs of n0, job 2 runs on n1; the plan swaps them
    snap = snapshot(current=[(1, 0, 2), (2, 1, 1)], fixed=[1], jobs=(1, 2))
    out = keep_fixed(snap, decision(snap, [(1, 1, 2), (2, 0, 1)]))
    assert out.placement.by_job_sorted() == {1: [(0, 2)], 2: [(1, 1)]}
    assert out.reason.tolist() == [Reason.PLACED, Reason.PLACED]
    assert out.detail[2].startswith("stays where it runs")


def test_no_fixed_job_leaves_the_decision_as_it_is() -> None:
    snap = snapshot(current=[(1, 0, 1)], fixed=[])
    d = decision(snap, [(1, 1, 1), (3, 0, 2)])
    assert keep_fixed(snap, d) is d
