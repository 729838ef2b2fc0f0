"""The live world's costs (hadar_slurm.costs): one place for the policy and the simulator, kept
in step with what bench.move_cost measured."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.costs import (
    DEFAULT,
    SLURM_FORK_INTERVAL_S,
    SLURM_FORK_START_S,
    SLURM_MOVE_S,
    SLURM_START_S,
    LiveCosts,
)
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


_FORK_NODES = {0: (0, 1), 1: (0, 1), 2: (2, 3)}


class _ForkThree:
    """Jobs 0 and 1 as two copies each on nodes 0 and 1, job 2 on nodes 2 and 3, every epoch
    (each holds one GPU per node)."""

    name = "fork-three"

    def allocate(self, snapshot: Snapshot) -> Decision:
        ids = [int(j) for j in snapshot.job_ids]
        job = np.repeat(np.array(ids, dtype=np.int64), 2)
        node = np.array([n for j in ids for n in _FORK_NODES[j]], dtype=np.int64)
        return Decision(snapshot.epoch, Placement(
            job, node, np.ones(len(job), dtype=np.int64), np.tile([0, 1], len(ids))),
            np.full(len(ids), Reason.PLACED, dtype=np.int8))


def test_forks_that_share_a_node_start_a_backfill_cycle_apart() -> None:
    # Slurm starts heterogeneous jobs only from its backfill scheduler, no two that share a
    # node in one cycle (bench.move_cost's forks).  Jobs 0 and 1 share nodes 0 and 1: job 1
    # starts one cycle (fork_interval_s, 10 s) after job 0.  Job 2 shares no node: it starts
    # with job 0.  All three wait fork_start_s (3 s) more than a plain start (7 s), give or
    # take where in the cycle the round began (+-5 s, one draw for the round).
    cluster = ClusterSpec(tuple(Node(f"n{k}", "v100", 2) for k in range(4)))
    table = ThroughputTable({("toy", 1): {"v100": 1.0}})
    jobs = [Job(k, "toy", scale_factor=1, total_steps=1000.0, arrival_s=0.0) for k in range(3)]

    def finish(fork_start_s: float = 0.0, fork_interval_s: float = 0.0) -> list[float]:
        res = simulate(jobs, cluster, table, _ForkThree(), round_s=10000.0,
                       start_cost_s=7.0, consolidation=ConsolidationCost(0.0, 0.0),
                       fork_start_s=fork_start_s, fork_interval_s=fork_interval_s)
        return [float(x) for x in res.finish]

    # two copies at 1 step/s each (consolidation free here): 500 s of work, a start before
    # and one after (the job's own run)
    plain = finish()
    assert plain == pytest.approx([7.0 + 500.0 + 7.0] * 3)
    for seed_like in (3.0, 0.0):
        staggered = finish(fork_start_s=seed_like + 3.0, fork_interval_s=10.0)
        assert staggered[1] - staggered[0] == pytest.approx(10.0)
        assert staggered[2] == pytest.approx(staggered[0])
        assert seed_like + 3.0 - 5.0 <= staggered[0] - plain[0] <= seed_like + 3.0 + 5.0
    assert finish(fork_start_s=3.0) == pytest.approx([7.0 + 3.0 + 500.0 + 7.0] * 3)
    with pytest.raises(ValueError, match="fork_interval_s"):
        finish(fork_interval_s=-1.0)


class _ForkThenLastRun:
    """Job 0 as two copies on nodes 0 and 1 while it has work left; once it has none (the
    snapshot's floor, :func:`remaining_seen`: its own run after the copies) as one copy on node
    0.  Job 1 only ever on node 0, once job 0 is not there.  Keeps what each epoch saw."""

    name = "fork-then-last-run"

    def __init__(self) -> None:
        self.seen: list[tuple[float, dict[int, float]]] = []
        self.caps: list[tuple[float, list[int]]] = []

    def allocate(self, snapshot: Snapshot) -> Decision:
        left = dict(zip(snapshot.job_ids.tolist(), snapshot.remaining.tolist(), strict=True))
        self.seen.append((snapshot.now, left))
        self.caps.append((snapshot.now, snapshot.copies_cap(4).tolist()))
        job: list[int] = []
        node: list[int] = []
        copy: list[int] = []
        if 0 in left and left[0] > 1.0:
            job, node, copy = [0, 0], [0, 1], [0, 1]
        elif 0 in left:
            job, node, copy = [0], [0], [0]
        elif 1 in left:
            job, node, copy = [1], [0], [0]
        placed = set(job)
        return Decision(snapshot.epoch, Placement(
            np.array(job, dtype=np.int64), np.array(node, dtype=np.int64),
            np.ones(len(job), dtype=np.int64), np.array(copy, dtype=np.int64)),
            np.array([Reason.PLACED if j in placed else Reason.PRICED_OUT
                      for j in snapshot.job_ids.tolist()], dtype=np.int8))


def test_a_forked_jobs_own_run_holds_its_gpus_with_final_run() -> None:
    # Job 0 (1,000 steps at 1 step/s per copy) runs as two copies after a 7 s start and is done
    # training at 7 + 500 = 507 s.  Its batch script then runs once more (the sidecar's
    # world).  Without final_run that run costs a start and holds no GPU: job 0 ends at 514
    # and job 1, given node 0 at the epoch its copies' end brings, at 507 + 7 + 100 = 614.
    # With it, job 0 waits at 507 with no work left (the snapshot says one step, as the
    # sidecar's does), is placed on node 0 and holds it for a first start (7 s, not the 20 s
    # of a move): it ends at 514, and job 1 starts only then: 514 + 7 + 100 = 621.
    cluster = ClusterSpec((Node("n0", "v100", 1), Node("n1", "v100", 1)))
    table = ThroughputTable({("toy", 1): {"v100": 1.0}})
    jobs = [Job(0, "toy", scale_factor=1, total_steps=1000.0, arrival_s=0.0),
            Job(1, "toy", scale_factor=1, total_steps=100.0, arrival_s=0.0)]

    def run(final_run: bool) -> tuple[list[float], _ForkThenLastRun]:
        policy = _ForkThenLastRun()
        res = simulate(jobs, cluster, table, policy, round_s=10000.0, start_cost_s=7.0,
                       migration_cost_s=20.0, consolidation=ConsolidationCost(0.0, 0.0),
                       reschedule_on_finish=True, final_run=final_run)
        return [float(x) for x in res.finish], policy

    finish, _ = run(False)
    assert finish == pytest.approx([514.0, 614.0])
    finish, policy = run(True)
    assert finish == pytest.approx([514.0, 621.0])
    at_507 = [left for now, left in policy.seen if now == pytest.approx(507.0)]
    assert at_507 == [{0: 1.0, 1: 100.0}]  # (max(1 step, 1e-3 of 1,000))
    # its own run is not forked (the sidecar marks such a job nofork): one copy at most for
    # it, the policy's own cap (4 here) for the other
    assert [cap for now, cap in policy.caps if now == pytest.approx(507.0)] == [[1, 4]]
    assert policy.caps[0] == (0.0, [4, 4])


@pytest.mark.parametrize("reschedule_on_finish", [True, False])
def test_a_forked_jobs_own_run_ends_when_the_clock_rounds_its_start(
        reschedule_on_finish: bool) -> None:
    # As above with a start of 30.38 s (what LiveCosts charges): the copies are done at
    # 530.38 s, job 0's own run holds node 0 for its start and ends at 560.76, job 1 at
    # 560.76 + 30.38 + 100 = 691.14.  In floating point (530.38 + 30.38) - 530.38 is a few
    # 1e-14 short of 30.38, so the run once owed that much of its start, was kept on its GPU
    # at the same instant, epoch after epoch, and the simulation never ended
    # (`hadar-slurm simulate --final-run` hung on bench/traces/long_tail_seed0.trace).
    cluster = ClusterSpec((Node("n0", "v100", 1), Node("n1", "v100", 1)))
    table = ThroughputTable({("toy", 1): {"v100": 1.0}})
    jobs = [Job(0, "toy", scale_factor=1, total_steps=1000.0, arrival_s=0.0),
            Job(1, "toy", scale_factor=1, total_steps=100.0, arrival_s=0.0)]
    assert (530.38 + 30.38) - 530.38 < 30.38  # (the rounding this is about)
    res = simulate(jobs, cluster, table, _ForkThenLastRun(), round_s=10000.0,
                   start_cost_s=30.38, migration_cost_s=40.0,
                   consolidation=ConsolidationCost(0.0, 0.0),
                   reschedule_on_finish=reschedule_on_finish, final_run=True)
    assert [float(x) for x in res.finish] == pytest.approx([560.76, 691.14])
    assert res.epochs < 10


class _Stay:
    """Keeps job 0 on node 0 and says nothing moves the clock (a broken backend's view)."""

    name = "stay"

    def allocate(self, snapshot: Snapshot) -> Decision:
        return Decision(snapshot.epoch, Placement(
            np.array([0], dtype=np.int64), np.array([0], dtype=np.int64),
            np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)),
            np.array([Reason.PLACED], dtype=np.int8))


def test_a_simulator_whose_clock_stops_raises_rather_than_loops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A simulator whose next epoch never comes later (as the bug above made it) stops with
    # an error naming the instant and the jobs placed, after STALL_EPOCHS epochs.
    from hadar_slurm.sim import backend

    cluster = ClusterSpec((Node("n0", "v100", 1),))
    table = ThroughputTable({("toy", 1): {"v100": 1.0}})
    jobs = [Job(0, "toy", scale_factor=1, total_steps=100.0, arrival_s=5.0)]
    monkeypatch.setattr(backend.SimulatedCluster, "_next_epoch_start",
                        lambda self, now, round_s: now)
    with pytest.raises(RuntimeError, match=r"stalled: 1000 epochs in a row at t=5\.000 s "
                                           r"\(jobs placed: \[0\]\)"):
        simulate(jobs, cluster, table, _Stay())


def test_live_costs_carry_the_measured_fork_start() -> None:
    rows = json.loads((REPO / "bench" / "results" / "move_cost.json").read_text())
    shared = {r["rank"]: r["fork_start_s"] for r in rows
              if r.get("run") == "median" and r.get("layout") == "shared"}
    disjoint = {r["rank"]: r["fork_start_s"] for r in rows
                if r.get("run") == "median" and r.get("layout") == "disjoint"}
    assert SLURM_FORK_START_S == pytest.approx(shared[0], abs=0.02)
    assert SLURM_FORK_INTERVAL_S == pytest.approx(
        statistics.median(np.diff([shared[k] for k in sorted(shared)])), abs=0.02)
    # (no node in common: they start in the same cycle, as the simulator has it)
    assert max(disjoint.values()) - min(disjoint.values()) < 0.5 * SLURM_FORK_INTERVAL_S
    assert DEFAULT.fork_start_s == pytest.approx(SLURM_FORK_START_S - SLURM_START_S)
    assert DEFAULT.fork_interval_s == SLURM_FORK_INTERVAL_S
