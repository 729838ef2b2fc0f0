"""bench.solver_scaling's steady epoch (``--steady``), its move counter and ``--share``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bench.instances import ONE_GPU, gavel_cluster, snapshot, steady
from bench.solver_scaling import measure, moves
from hadar_slurm.costs import DEFAULT
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Decision, Placement, Policy, Snapshot
from hadar_slurm.policy.hadare import HadarEPolicy
from hadar_slurm.rates.table import default_table


def test_steady_is_the_epoch_after_with_the_placed_jobs_running() -> None:
    snap = snapshot(64, gavel_cluster(16), seed=5)
    first = make_policy("hadar").allocate(snap)
    after = steady(snap, "hadar", seed=5)
    assert after.epoch == snap.epoch + 1 and after.now == snap.now + snap.round_s
    assert after.migration_s == DEFAULT.move_s > 0
    # The jobs hold what the first decision gave them.
    for a, b in ((after.current.job, first.placement.job),
                 (after.current.node, first.placement.node),
                 (after.current.count, first.placement.count)):
        assert np.array_equal(a, b)
    ran = after.held().sum(axis=1) > 0
    assert ran.any() and (~ran).any()
    # Placed jobs progressed (between a half and a whole round on their GPUs), the others not.
    assert (after.remaining[ran] < snap.remaining[ran]).all()
    assert np.array_equal(after.remaining[~ran], snap.remaining[~ran])
    i = int(np.flatnonzero(ran & (snap.scale == 1))[0])
    h = int(np.flatnonzero(after.held()[i])[0])
    done = snap.remaining[i] - after.remaining[i]
    rate = snap.rate[i, h]
    assert 0.5 * snap.round_s * rate - 1e-6 <= done <= snap.round_s * rate + 1e-6
    assert np.isfinite(after.remaining).all()


def test_moves_counts_running_jobs_given_other_gpus_and_jobs_kept() -> None:
    snap = snapshot(4, gavel_cluster(4), seed=1)
    # Job 0 on node 0, job 1 on nodes 1 and 2, job 2 on node 3; job 3 waits.
    cur = Placement(np.array([0, 1, 1, 2]), np.array([0, 1, 2, 3]), np.array([1, 1, 1, 1]))
    snap = replace(snap, current=cur)
    # Job 0 stays, job 1 has the same rows in another order (stays), job 2 moves to node 4,
    # job 3 starts; a job that is stopped (none here) would not count.
    job = np.array([0, 1, 1, 2, 3])
    node = np.array([0, 2, 1, 4, 5])
    count = np.array([1, 1, 1, 1, 1])
    detail = {0: "kept on its GPUs: the plan that moved it gained less than 0.25 of ...",
              3: "forked into 2 copies"}
    assert moves(snap, Placement(job, node, count), detail) == (1, 1)
    # Job 2 stopped: not a move.
    rest = [0, 1, 2, 4]
    assert moves(snap, Placement(job[rest], node[rest], count[rest]), {}) == (0, 0)


def test_measure_reports_the_state_and_what_moved() -> None:
    row = measure("hadar", 32, gavel_cluster(8), repeats=1, max_seconds=1.0, steady_state=True)
    assert row["state"] == "steady" and row["runs"] == 1
    assert isinstance(row["moved"], int) and isinstance(row["kept"], int)
    fresh = measure("hadar", 32, gavel_cluster(8), repeats=1, max_seconds=1.0)
    # From a fresh state no job runs, so none can move or be kept.
    assert fresh["state"] == "fresh" and fresh["moved"] == 0 and fresh["kept"] == 0


def test_measure_passes_the_settings_to_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    # --no-pin-binding: hadare's decision with step 0 off is what is timed, and the row says so.
    import bench.solver_scaling as bench

    built: list[object] = []

    def spy(name: str, **settings: object) -> Policy:
        policy = make_policy(name, **settings)
        built.append(policy)
        return policy

    monkeypatch.setattr(bench, "make_policy", spy)
    cluster = gavel_cluster(4)
    plain = measure("hadare", 16, cluster, repeats=1, max_seconds=5.0)
    assert plain["settings"] == {}
    assert [p.pin_binding for p in built if isinstance(p, HadarEPolicy)] == [True, True]
    built.clear()
    unpinned = measure("hadare", 16, cluster, repeats=1, max_seconds=5.0,
                       settings={"pin_binding": False})
    assert unpinned["settings"] == {"pin_binding": False} and unpinned["runs"] == 1
    assert [p.pin_binding for p in built if isinstance(p, HadarEPolicy)] == [False, False]


def test_measure_with_share_times_decisions_that_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    # --share --one-gpu: the snapshot offers Gavel's co-located rates, the policy is built with
    # share=True, the jobs are 1-GPU ones, and the decision timed makes pairs.
    import bench.solver_scaling as bench

    decided: list[Decision] = []

    class Spy:
        def __init__(self, policy: Policy) -> None:
            self.policy = policy

        def allocate(self, snap: Snapshot) -> Decision:
            assert snap.colocated is not None and (snap.scale == 1).all()
            decided.append(self.policy.allocate(snap))
            return decided[-1]

    monkeypatch.setattr(bench, "make_policy",
                        lambda name, **settings: Spy(make_policy(name, **settings)))
    row = measure("hadar", 64, gavel_cluster(8), repeats=1, max_seconds=5.0,
                  settings={"share": True}, one_gpu=True)
    assert row["settings"] == {"share": True} and row["jobs_mix"] == "1-GPU"
    assert decided and all(d.packed for d in decided)
    # The steady epoch: the first decision's pairs run on into it.
    after = steady(replace(snapshot(64, gavel_cluster(8), seed=64, scale_mix=ONE_GPU),
                           colocated=default_table().colocated), "hadar", seed=64,
                   settings={"share": True})
    assert after.packed
