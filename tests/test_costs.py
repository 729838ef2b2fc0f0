"""The live world's costs (hadar_slurm.costs): one place for the policy and the simulator, kept
in step with what bench.move_cost measured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hadar_slurm.costs import DEFAULT, SLURM_MOVE_S, SLURM_START_S, LiveCosts
from hadar_slurm.errors import InputError
from hadar_slurm.model import ClusterSpec, Job, Node
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Decision, Placement, Reason, Snapshot
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sidecar.config import default_config, parse_config
from hadar_slurm.sim.run import simulate

REPO = Path(__file__).resolve().parent.parent


def test_slurm_figures_are_the_benchs_medians() -> None:
    rows = json.loads((REPO / "bench" / "results" / "move_cost.json").read_text())
    median = next(r for r in rows if r.get("run") == "median")
    checkpoint = {r["checkpoint_s"] for r in rows if "checkpoint_s" in r}
    assert len(checkpoint) == 1
    # the payload's own checkpoint is the job's part (restart_s), not Slurm's
    assert SLURM_MOVE_S == pytest.approx(median["running_s"] - checkpoint.pop(), abs=0.02)
    assert SLURM_START_S == pytest.approx(median["first_start_s"], abs=0.02)


def test_live_costs_add_the_jobs_restart() -> None:
    assert LiveCosts(2.5).move_s == pytest.approx(SLURM_MOVE_S + 2.5)
    assert LiveCosts(2.5).start_s == pytest.approx(SLURM_START_S + 2.5)
    with pytest.raises(ValueError, match="restart_s"):
        LiveCosts(-1.0)


def test_config_auto_migration_is_the_live_move_cost() -> None:
    assert default_config().migration_s is None
    assert default_config().move_cost_s == pytest.approx(DEFAULT.move_s)
    base = '[sidecar]\nstate_dir = "/tmp/x"\n[scheduler]\n'
    cfg = parse_config(base + "restart_s = 4\n", "t.toml", Path("/"))
    assert cfg.move_cost_s == pytest.approx(SLURM_MOVE_S + 4)
    cfg = parse_config(base + 'restart_s = 4\nmigration_s = 45\n', "t.toml", Path("/"))
    assert cfg.move_cost_s == 45.0
    with pytest.raises(InputError, match=r'\[scheduler\] migration_s.*"auto" or a number'):
        parse_config(base + 'migration_s = "soon"\n', "t.toml", Path("/"))
    with pytest.raises(InputError, match=r"\[scheduler\] restart_s"):
        parse_config(base + "restart_s = -2\n", "t.toml", Path("/"))


class _MoveOnce:
    """Places job 0 on node 0 in epoch 0, on node 1 from epoch 1 on (one move)."""

    name = "move-once"

    def allocate(self, snapshot: Snapshot) -> Decision:
        node = 0 if snapshot.epoch == 0 else 1
        ids = snapshot.job_ids
        return Decision(snapshot.epoch, Placement(
            ids.copy(), np.full(len(ids), node, dtype=np.int64),
            np.ones(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=np.int64)),
            np.full(len(ids), Reason.PLACED, dtype=np.int8))


def test_simulator_charges_a_first_start_and_a_move_apart() -> None:
    cluster = ClusterSpec((Node("n0", "v100", 1), Node("n1", "v100", 1)))
    table = ThroughputTable({("toy", 1): {"v100": 1.0}})
    job = Job(0, "toy", scale_factor=1, total_steps=1000.0, arrival_s=0.0)
    res = simulate([job], cluster, table, _MoveOnce(), round_s=100.0, start_cost_s=7.0,
                   migration_cost_s=20.0)
    # round 0: 7 s start, 93 steps; then a move: 20 s lost, the other 907 steps
    assert res.finish[0] == pytest.approx(100.0 + 20.0 + 907.0)


class _ForkTwo:
    """Job 0 as two copies, one on each node, every epoch."""

    name = "fork-two"

    def allocate(self, snapshot: Snapshot) -> Decision:
        n = 2 * len(snapshot.job_ids)  # (none once it is done)
        return Decision(snapshot.epoch, Placement(
            np.repeat(snapshot.job_ids, 2), np.arange(n, dtype=np.int64) % 2,
            np.ones(n, dtype=np.int64), np.arange(n, dtype=np.int64) % 2),
            np.full(len(snapshot.job_ids), Reason.PLACED, dtype=np.int8))


def test_a_forked_job_ends_with_a_start_of_its_own() -> None:
    # live, a job whose copies did its work runs once more itself (its batch script's end):
    # one more start than an unforked job, after its copies freed their GPUs
    cluster = ClusterSpec((Node("n0", "v100", 1), Node("n1", "v100", 1)))
    table = ThroughputTable({("toy", 1): {"v100": 1.0}})
    job = Job(0, "toy", scale_factor=1, total_steps=1000.0, arrival_s=0.0)

    def finish(policy: object, start: float) -> float:
        res = simulate([job], cluster, table, policy, round_s=10000.0,  # type: ignore[arg-type]
                       start_cost_s=start)
        return float(res.finish[0])

    assert finish(_ForkTwo(), 7.0) - finish(_ForkTwo(), 0.0) == pytest.approx(14.0)
    assert finish(_MoveOnce(), 7.0) - finish(_MoveOnce(), 0.0) == pytest.approx(7.0)


def test_a_start_or_move_is_paid_in_full_when_an_epoch_comes_sooner() -> None:
    # Rounds that end when a job arrives (the sidecar's reschedule_on_finish): job 0 starts at
    # 0 (a start costs 100 s) and job 1 arrives at 30 s, a new epoch, where job 0 keeps its
    # GPU.  Live, job 0 is still starting then and goes on doing so: it runs from 100 s and
    # ends at 100 + 1000 s.  (The simulator used to forget the 70 s left at the new epoch.)
    # Job 1 starts at 30 s on the other GPU: 30 + 100 + 50 s.
    cluster = ClusterSpec((Node("n0", "v100", 1), Node("n1", "v100", 1)))
    table = ThroughputTable({("toy", 1): {"v100": 1.0}})
    jobs = [Job(0, "toy", scale_factor=1, total_steps=1000.0, arrival_s=0.0),
            Job(1, "toy", scale_factor=1, total_steps=50.0, arrival_s=30.0)]
    res = simulate(jobs, cluster, table, make_policy("fifo"), round_s=360.0,
                   start_cost_s=100.0, reschedule_on_finish=True)
    assert res.finish.tolist() == pytest.approx([1100.0, 180.0])
    # A move's cost likewise: job 0 starts at 0 s (7 s), moves to node 1 at 100 s (20 s), and
    # job 1 arrives at 105 s, 5 s into the move: an epoch that fills node 0 with job 1 and
    # keeps job 0, which has 15 s of its move to go (it would end at 1012 s without them).
    moved = simulate([jobs[0], Job(1, "toy", scale_factor=1, total_steps=50.0,
                                   arrival_s=105.0)],
                     cluster, table, _MoveOnce(), round_s=100.0, start_cost_s=7.0,
                     migration_cost_s=20.0, reschedule_on_finish=True)
    assert moved.finish.tolist() == pytest.approx([100.0 + 20.0 + 907.0, 105.0 + 7.0 + 50.0])
