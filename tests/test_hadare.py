"""HadarE in the simulator: forked placements, the consolidation charge, the ``hadare`` policy.

Table (tests/conftest.py): ``toy`` does 1 step/s on a v100 and 0.5 step/s on a k80.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.errors import InputError
from hadar_slurm.loop import ChangeKind, diff, fill_snapshot
from hadar_slurm.model import ClusterSpec, Node
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Decision, Placement, Snapshot
from hadar_slurm.policy.hadar import HadarState, pooled_time
from hadar_slurm.policy.hadare import HadarEPolicy, HadarEState, fork_drain
from hadar_slurm.rates.table import ThroughputTable, default_table, parse_csv
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.bounds import copy_room, fluid_makespan_bound, fork_makespan_bound
from hadar_slurm.sim.cluster import load_cluster, parse_counts
from hadar_slurm.sim.run import simulate
from hadar_slurm.sim.trace import load_trace
from tests.helpers import SNAPSHOTS, TOY_CSV, make_job, run_cli, snapshot_from_json

I64 = np.int64
BENCH_TRACES = Path(__file__).resolve().parents[1] / "bench" / "traces"


def placement(rows: list[tuple[int, int, int, int]]) -> Placement:
    """(job, node, count, copy) rows."""
    a = np.array(rows, dtype=I64).reshape(-1, 4)
    return Placement(a[:, 0], a[:, 1], a[:, 2], a[:, 3])


# -- Placement and diff ----------------------------------------------------------------------


def test_placement_copies_helpers() -> None:
    p = placement([(7, 0, 1, 0), (7, 3, 1, 1), (7, 4, 1, 1), (9, 1, 2, 0)])
    assert p.copies_of(7) == {0: [(0, 1)], 1: [(3, 1), (4, 1)]}
    assert p.num_copies() == {7: 2, 9: 1}
    assert p.by_job_copies()[9] == {0: [(1, 2)]}
    kept = p.select(p.job == 7)
    assert kept.copy_index().tolist() == [0, 1, 1]
    # Without copy numbers every row is copy 0: a multi-node gang, not a forked job.
    gang = Placement(np.array([7, 7], dtype=I64), np.array([0, 3], dtype=I64),
                     np.array([1, 1], dtype=I64))
    assert gang.num_copies() == {7: 1}
    assert not gang.same_as(placement([(7, 0, 1, 0), (7, 3, 1, 1)]))


def test_diff_sees_a_change_of_copies_as_a_move(toy_table: ThroughputTable) -> None:
    sim = SimulatedCluster([make_job(7, 100, 0)], parse_counts("v100=2"), toy_table)
    gang = Placement(np.array([7, 7], dtype=I64), np.array([0, 1], dtype=I64),
                     np.array([1, 1], dtype=I64))
    forked = placement([(7, 0, 1, 0), (7, 1, 1, 1)])
    sim.current = gang
    snap = sim.snapshot(0, 0.0, 360.0, None)
    reason = np.zeros(1, dtype=np.int8)
    same_rows = diff(snap, Decision(0, forked, reason))
    assert [a.kind for a in same_rows] == [ChangeKind.MOVE]
    assert [a.kind for a in diff(snap, Decision(0, gang, reason))] == [ChangeKind.KEEP]


# -- the simulator's forked progress ---------------------------------------------------------


class FixedPolicy:
    """Places job 7 as the given placement every epoch (a test double of a policy)."""

    name = "fixed"

    def __init__(self, p: Placement) -> None:
        self.p = p

    def allocate(self, snapshot: Snapshot) -> Decision:
        p = self.p if 7 in snapshot.job_ids.tolist() else Placement.empty()
        return Decision(snapshot.epoch, p, np.zeros(snapshot.num_jobs, dtype=np.int8))


def test_forked_job_runs_at_the_sum_of_its_copies_less_consolidation(
    toy_table: ThroughputTable,
) -> None:
    # Copies on a v100 (1 step/s) and a k80 (0.5): 1.5 steps/s, after 10 s of consolidation at
    # the start of every round: 350 s * 1.5 = 525 steps per round.  3600 steps: 6 rounds make
    # 3150; the 7th needs 10 s + 450 / 1.5 = 310 s, so the job ends at 6 * 360 + 310 = 2470.
    cost = ConsolidationCost(base_s=10.0, s_per_gb=0.0)
    r = simulate([make_job(7, 3600, 0)], parse_counts("v100=1:k80=1"), toy_table,
                 FixedPolicy(placement([(7, 0, 1, 0), (7, 1, 1, 1)])), consolidation=cost)
    assert r.finish.tolist() == [pytest.approx(2470.0)]
    assert r.utilization == pytest.approx(1.0)  # consolidation holds the GPUs: busy
    assert r.forked_jobs == 1 and r.max_copies == 2
    # The same GPUs as one synchronous gang: 2 workers at the slower k80's pace, 1 step/s.
    gang = Placement(np.array([7, 7], dtype=I64), np.array([0, 1], dtype=I64),
                     np.array([1, 1], dtype=I64))
    r1 = simulate([make_job(7, 3600, 0)], parse_counts("v100=1:k80=1"), toy_table,
                  FixedPolicy(gang), consolidation=cost)
    assert r1.finish.tolist() == [pytest.approx(3600.0)]
    assert r1.forked_jobs == 0 and r1.max_copies == 1


def test_consolidation_cost_by_model_size() -> None:
    cost = ConsolidationCost(base_s=2.0, s_per_gb=10.0)
    assert cost.seconds("ResNet-50 (batch size 64)") == pytest.approx(2.0 + 102.4 / 1024 * 10)
    assert cost.seconds("A3C") < cost.seconds("ResNet-18 (batch size 16)") < cost.seconds(
        "Transformer (batch size 128)")
    assert cost.seconds("unknown model") == pytest.approx(2.0 + 100 / 1024 * 10)
    with pytest.raises(InputError, match="s_per_gb"):
        ConsolidationCost(s_per_gb=-1.0)


# -- the hadare policy -----------------------------------------------------------------------


def test_a_long_job_alone_is_forked_over_every_gpu(toy_table: ThroughputTable) -> None:
    # One 36,000-step toy job on 2 v100 + 2 k80 (one GPU per node): alone it takes 10 h on a
    # v100; forked over all four GPUs (3 steps/s) it needs 12,000 s plus the consolidations.
    jobs = [make_job(7, 36000, 0)]
    cluster = parse_counts("v100=2:k80=2")
    cost = ConsolidationCost(base_s=3.6, s_per_gb=0.0)  # 1% of a round
    r = simulate(jobs, cluster, toy_table, HadarEPolicy(max_copies=4, consolidation=cost),
                 consolidation=cost)
    assert r.max_copies == 4
    # 356.4 s * 3 steps/s = 1069.2 steps a round: 33 rounds and a part.
    rounds = 36000 / (356.4 * 3)
    expected = 33 * 360 + 3.6 + (36000 - 33 * 356.4 * 3) / 3
    assert int(rounds) == 33
    assert r.makespan_s == pytest.approx(expected)
    # The cap holds: at most 2 copies.
    r2 = simulate(jobs, cluster, toy_table, HadarEPolicy(max_copies=2, consolidation=cost),
                  consolidation=cost)
    assert r2.max_copies == 2
    assert r2.makespan_s > 1.4 * r.makespan_s


def test_a_job_the_world_asks_to_spread_is_offered_its_cap(toy_table: ThroughputTable) -> None:
    # Three 1-GPU v100 nodes (toy: 1 step/s). Jobs 1 (3,600 steps) and 3 (20,000) may not be
    # forked; job 2 (1,800) may have 2 copies. The fork window is the drain, 25,400 / 3 =
    # 8,467 s: job 2 is shorter, so HadarE offers it one copy and each job runs on one GPU.
    # Asked to spread (Snapshot.spread, a study's trial), job 2 is offered its 2 copies: job 3
    # cannot wait (20,000 s > the window) and takes one GPU, job 2's copies rank first among
    # the rest (1,800 s against 3,600 s) and take the other two, and job 1 waits.
    sim = SimulatedCluster([make_job(1, 3600, 0), make_job(2, 1800, 0), make_job(3, 20000, 0)],
                           parse_counts("v100=3"), toy_table)
    snap = replace(sim.snapshot(0, 0.0, 360.0, None), max_copies=np.array([1, 2, 1], dtype=I64))
    policy = HadarEPolicy(consolidation=ConsolidationCost(base_s=3.6, s_per_gb=0.0))
    assert policy.allocate(snap).placement.num_copies() == {1: 1, 2: 1, 3: 1}
    spread = policy.allocate(replace(snap, spread=np.array([False, True, False])))
    assert spread.placement.num_copies() == {2: 2, 3: 1}
    assert spread.detail == {2: "forked into 2 copies"}
    # spread asks for the cap, not for more: a job that may not be forked is not
    capped = policy.allocate(replace(snap, spread=np.ones(3, dtype=np.bool_)))
    assert capped.placement.num_copies() == {2: 2, 3: 1}


def test_a_fill_spreads_a_running_trial_only(toy_table: ThroughputTable) -> None:
    # Four 1-GPU v100 nodes; job 5 runs alone on node 0 (3,600 steps left), nothing waits: the
    # fill's decision keeps it there.  Asked to spread (a study's trial, may run as 4 copies)
    # it gets nodes 1-3 as well: a restart costs 36 s of a 360 s round (90% of it left), and
    # 4 copies less consolidation beat one.  Not asked to, sharing its GPU with a partner, or
    # fixed where it runs, it stays as it is; so it does while a waiting job fits beside it.
    sim = SimulatedCluster([make_job(5, 3600, 0), make_job(6, 50000, 0)],
                           parse_counts("v100=4"), toy_table)
    base = sim.snapshot(0, 0.0, 360.0, None)
    one = np.zeros(1, dtype=I64)
    snap = replace(base.select_jobs(np.array([True, False])),
                   current=Placement(np.array([5]), one, np.ones(1, dtype=I64)),
                   max_copies=np.array([4], dtype=I64), spread=np.array([True]),
                   migration_s=36.0)
    fill = Decision(0, snap.current, np.zeros(1, dtype=np.int8))
    policy = HadarEPolicy(consolidation=ConsolidationCost(base_s=3.6, s_per_gb=0.0))
    out = policy.fill_running(snap, fill)
    assert out.placement.num_copies() == {5: 4}
    assert sorted(out.placement.node.tolist()) == [0, 1, 2, 3]
    assert out.detail == {5: "forked into 4 copies"}
    for other in (replace(snap, spread=np.array([False])), replace(snap, spread=None),
                  replace(snap, fixed=np.array([True]))):
        assert policy.fill_running(other, fill) is fill
    paired = replace(fill, packed=((4, 5),))
    assert policy.fill_running(snap, paired) is paired
    waits = replace(base, current=snap.current, max_copies=np.array([4, 1], dtype=I64),
                    spread=np.array([True, False]), migration_s=36.0)
    fill2 = Decision(0, snap.current, np.zeros(2, dtype=np.int8))
    assert policy.fill_running(waits, fill2) is fill2  # (job 6 fits in a free GPU)


@pytest.mark.parametrize("left, copies", [(100.0, 4), (50.0, 1), (3600.0, 4)])
def test_a_fill_forks_a_running_trial_only_where_it_ends_sooner(
        toy_table: ThroughputTable, left: float, copies: int) -> None:
    # The case above with `left` steps to go (1 step/s): a copy restarts the job (36 s) and
    # each round of a forked job pays a consolidation (3.6 s).  100 steps: one copy more ends
    # it at 36 + 3.6 + 50 = 89.6 s against 100 s, then the restart is paid and each further
    # copy gains (3.6 + 100/3 < 3.6 + 100/2, ...): 4 copies.  50 steps: 36 + 3.6 + 25 = 64.6 s
    # against 50 s, so it stays as it is (the round's test, 90% of 360 s left, would fork it;
    # a trial near its rung's end was forked anew at each of the fill epochs its cohort's
    # reports brought forward, seconds apart, and restarted each time).  A job running past
    # the round is left to the round's test: 4 copies.
    sim = SimulatedCluster([make_job(5, left, 0)], parse_counts("v100=4"), toy_table)
    one = np.zeros(1, dtype=I64)
    snap = replace(sim.snapshot(0, 0.0, 360.0, None),
                   current=Placement(np.array([5]), one, np.ones(1, dtype=I64)),
                   max_copies=np.array([4], dtype=I64), spread=np.array([True]),
                   migration_s=36.0)
    fill = Decision(0, snap.current, np.zeros(1, dtype=np.int8))
    policy = HadarEPolicy(consolidation=ConsolidationCost(base_s=3.6, s_per_gb=0.0))
    assert policy.fill_running(snap, fill).placement.num_copies() == {5: copies}


def test_trials_share_their_copies_speed(toy_table: ThroughputTable) -> None:
    # Two trials of 3,600 steps, two copies each, on two v100 nodes (1 step/s) and two k80
    # nodes (0.5): trial 1 on both v100s and trial 2 on both k80s end at 1,800 and 3,600 s;
    # dealt again (fastest node first, to the trial that ends last on what it has so far),
    # each has a v100 and a k80 and both end at 2,400 s.  Jobs not asked to spread are left
    # as planned.
    sim = SimulatedCluster([make_job(1, 3600, 0), make_job(2, 3600, 0)],
                           parse_counts("v100=2:k80=2"), toy_table)
    snap = replace(sim.snapshot(0, 0.0, 360.0, None), spread=np.array([True, True]),
                   migration_s=36.0)
    assert [snap.gpu_types[h] for h in snap.node_type.tolist()] == ["v100"] * 2 + ["k80"] * 2
    planned = Placement(np.array([1, 1, 2, 2]), np.array([0, 1, 2, 3]), np.ones(4, dtype=I64),
                        np.array([0, 1, 0, 1]))
    policy = HadarEPolicy()
    cap = np.array([4, 4], dtype=I64)
    free = np.zeros(2)  # (no consolidation: the speeds are the GPUs' sums)

    def nodes(p: Placement) -> dict[int, list[int]]:
        return {j: sorted(nd for rs in cps.values() for nd, _ in rs)
                for j, cps in p.by_job_copies().items()}

    assert nodes(policy.balance_spread(snap, planned, cap, free)) == {1: [0, 2], 2: [1, 3]}
    assert policy.balance_spread(replace(snap, spread=np.array([True, False])),
                                 planned, cap, free) is planned
    # Trials of two rungs (their paths to the study's end differ) are left in Hadar's order.
    assert policy.balance_spread(replace(snap, after=np.array([0.0, 3600.0])),
                                 planned, cap, free) is planned
    # A trial that runs on its GPUs as planned is left alone: it would restart.
    running = replace(snap, current=planned.select(planned.job == 1))
    assert policy.balance_spread(running, planned, cap, free) is planned
    # Trial 2 left waiting while trial 1 (3,600 steps) starts on all four GPUs (3 steps/s,
    # ends at 36 + 1,200 s), trial 2 then starting on them.  With 360 steps for trial 2 it
    # ends at 1,236 + 36 + 120 = 1,392 s; dealt from scratch, trial 2 gets a v100 and trial 1
    # the rest (2 steps/s: 1,836 s): as planned.  With 3,600 steps and a consolidation of a
    # tenth of each round (four copies: 2.7 steps/s), trial 1 ends at 1,369 s and trial 2 at
    # 2,738 s; dealt, a v100 and a k80 each (1.35 steps/s), both at 2,703 s: dealt.
    alone = Placement(np.array([1, 1, 1, 1]), np.arange(4, dtype=I64), np.ones(4, dtype=I64),
                      np.arange(4, dtype=I64))
    little = replace(snap, remaining=np.array([3600.0, 360.0]))
    assert policy.balance_spread(little, alone, cap, free) is alone
    tenth = np.full(2, 0.1)
    assert nodes(policy.balance_spread(snap, alone, cap, tenth)) == {1: [0, 2], 2: [1, 3]}


def test_trials_dealt_again_may_change_how_many_copies_each_runs(
        toy_table: ThroughputTable) -> None:
    # The last rung of a study amid other jobs (traced: recsys-48, draw 1): step 3 gave four
    # idle k80s (0.5 step/s each) to the trial that then ended last, so trial 3 runs on four
    # k80s (2 steps/s) and trials 1 and 2 on a v100 each (1 step/s), 3,600 steps each: the
    # rung ends at 3,600 s.  Dealt again with at most 4 copies each, fastest first to the
    # trial that ends last: trials 1 and 2 a v100 and a k80 each (1.5 steps/s, the k80s that
    # come after trial 3's two in node order), trial 3 two k80s (1), all three restarting
    # (36 s): the rung ends at 3,636 s, no sooner, so it is kept.  With 2,400 steps left for
    # trial 3 the deal ends all three at 2,436 s against 3,636 s as planned: dealt again.
    sim = SimulatedCluster([make_job(1, 3600, 0), make_job(2, 3600, 0), make_job(3, 2400, 0)],
                           parse_counts("v100=2:k80=4"), toy_table)
    planned = Placement(np.array([1, 2, 3, 3, 3, 3]), np.arange(6, dtype=I64),
                        np.ones(6, dtype=I64), np.array([0, 0, 0, 1, 2, 3]))
    snap = replace(sim.snapshot(0, 0.0, 360.0, None), spread=np.array([True] * 3),
                   migration_s=36.0)
    policy = HadarEPolicy()
    cap = np.array([4, 4, 4], dtype=I64)
    free = np.zeros(3)
    dealt = policy.balance_spread(snap, planned, cap, free)
    assert {j: sorted(nd for rs in cps.values() for nd, _ in rs)
            for j, cps in dealt.by_job_copies().items()} == {1: [0, 4], 2: [1, 5], 3: [2, 3]}
    equal = replace(snap, remaining=np.array([3600.0, 3600.0, 3600.0]))
    assert policy.balance_spread(equal, planned, cap, free) is planned
    # (a cap of one copy each leaves nothing to deal but the nodes themselves)
    assert policy.balance_spread(snap, planned, np.array([1, 1, 4], dtype=I64),
                                 free) is planned


def test_snapshot_max_copies_of_one_means_hadar(toy_table: ThroughputTable) -> None:
    sim = SimulatedCluster([make_job(1, 36000, 0), make_job(2, 100, 0)],
                           parse_counts("v100=2:k80=2"), toy_table)
    snap = sim.snapshot(0, 0.0, 360.0, None)
    forked = HadarEPolicy().allocate(snap)
    assert forked.placement.num_copies()[1] > 1
    assert "forked into" in forked.detail[1]
    one = Snapshot(**{**snap.__dict__, "max_copies": np.ones(2, dtype=I64)})
    plain = HadarEPolicy().allocate(one)
    assert set(plain.placement.num_copies().values()) == {1}
    hadar = make_policy("hadar").allocate(snap)
    assert plain.placement.by_job_sorted() == hadar.placement.by_job_sorted()


def check_copies(sim: SimulatedCluster, cap: int, multi_node: bool) -> int:
    """Invariants of the placement the simulator runs; returns the most copies of a job."""
    p = sim.current
    used = np.bincount(p.node, weights=p.count, minlength=len(sim.node_gpus))
    assert (used <= sim.node_gpus).all()
    most = 1
    for job_id, copies in p.by_job_copies().items():
        i = sim.index_of[job_id]
        most = max(most, len(copies))
        assert len(copies) <= cap
        assert sorted(copies) == list(range(len(copies)))
        seen: set[int] = set()
        for rows in copies.values():
            nodes = {n for n, _ in rows}
            assert not nodes & seen, f"job {job_id}: two copies share a node"
            seen |= nodes
            assert sum(c for _, c in rows) == sim.scale[i]
            if len(copies) > 1:  # a copy of a forked job has GPUs of one type
                assert len({int(sim.node_type[n]) for n in nodes}) == 1
            if not multi_node and len(copies) > 1:
                assert len(rows) == 1, f"job {job_id}: a copy spans nodes"
    return most


@pytest.mark.parametrize("trace,cluster,multi_node", [
    ("poisson_200_lam900_seed0", "4:4:4", True),
    ("static_48_multigpu_seed1", "4:4:4", True),
    ("static_48_multigpu_seed1", "4:4:4", False),
])
def test_copies_never_share_a_node_and_respect_the_cap(trace: str, cluster: str,
                                                       multi_node: bool) -> None:
    table = default_table()
    most = [1]

    def hook(_rec: object, sim: SimulatedCluster) -> None:
        most[0] = max(most[0], check_copies(sim, 3, multi_node))

    r = simulate(load_trace(trace, table), load_cluster(cluster), table,
                 make_policy("hadare", max_copies=3), on_epoch=hook,
                 multi_node_copies=multi_node)
    assert r.num_completed == r.num_jobs
    assert most[0] == r.max_copies
    assert 1 <= r.max_copies <= 3
    # On 1-GPU nodes only a copy spanning nodes lets a multi-GPU job fork.
    assert r.max_copies >= 2 or not multi_node


def test_single_node_copies_on_multi_gpu_nodes() -> None:
    # Nodes of 4 GPUs; the simulator says multi_node_copies=False (as Slurm does) unless told
    # otherwise, so every copy fits one node.
    table = default_table()
    nodes = tuple(Node(f"{t}{k}", t, 4) for t in ("v100", "p100", "k80") for k in range(2))
    cluster = ClusterSpec(nodes)
    most = [1]

    def hook(_rec: object, sim: SimulatedCluster) -> None:
        assert sim.multi_node_copies is False
        most[0] = max(most[0], check_copies(sim, 4, False))

    r = simulate(load_trace("static_48_multigpu_seed1", table), cluster, table,
                 make_policy("hadare", max_copies=4), on_epoch=hook)
    assert r.num_completed == r.num_jobs
    assert most[0] > 1


def test_the_simulator_tells_what_the_world_allows(toy_table: ThroughputTable) -> None:
    jobs = [make_job(1, 36000, 0)]
    snap = SimulatedCluster(jobs, parse_counts("v100=2"), toy_table).snapshot(0, 0.0, 360.0, None)
    assert snap.multi_node_copies is False and snap.migration_s == 0.0
    told = SimulatedCluster(jobs, parse_counts("v100=2"), toy_table, multi_node_copies=True,
                            migration_cost_s=30.0).snapshot(0, 0.0, 360.0, None)
    assert told.multi_node_copies is True and told.migration_s == 30.0


def test_hadars_chain_gang_is_carried_by_job_and_copy(toy_table: ThroughputTable) -> None:
    # Hadar keeps the gang its chain rule made critical by id (HadarState.chain); HadarE's
    # virtual ids are renumbered every epoch, so it carries them as (job, copy)
    # (HadarEState.chain) and maps them to the next epoch's copies.  Jobs 5 (2 copies wanted)
    # and 9 (3): virtual ids 0-1 and 2-4.  Virtual 3 is copy 1 of job 9; next epoch, with job
    # 5 gone, that copy is virtual 1.
    jobs = [make_job(5, 36000, 0), make_job(9, 36000, 0)]
    snap = SimulatedCluster(jobs, parse_counts("v100=4"), toy_table).snapshot(0, 0.0, 360.0, None)
    pol = HadarEPolicy()
    owner = np.array([0, 0, 1, 1, 1], dtype=I64)
    copy_no = np.array([0, 1, 0, 1, 2], dtype=I64)
    state = HadarState(1000.0, (), (3,))
    chain = pol.chain_copies(snap, state, owner, copy_no)
    assert chain == ((9, 1),)
    later = SimulatedCluster(jobs[1:], parse_counts("v100=4"), toy_table).snapshot(
        1, 360.0, 360.0, None)
    virt, _owner, _copy = pol.expand(later, np.array([3], dtype=I64),
                                     pol.overhead(later), state, chain)
    assert isinstance(virt.policy_state, HadarState) and virt.policy_state.chain == (1,)
    assert virt.policy_state.target == 1000.0


def test_copies_pool_their_time_to_finish() -> None:
    # Job 0 as two copies of 100 steps each: on its split one does them in 10 s (10 steps/s),
    # the other in 40 s (2.5 steps/s).  Pooled, the job's 200 steps at 12.5 steps/s take 16 s,
    # and both copies get 16 s; job 1, one copy, keeps its own 5 s.  A copy that cannot run
    # anywhere (inf) keeps inf and adds no pace: job 2's 100 steps at the other copy's 5
    # steps/s (50 steps in 10 s) take 20 s.
    own = np.array([10.0, 40.0, 5.0, 10.0, np.inf])
    remaining = np.array([100.0, 100.0, 50.0, 50.0, 50.0])
    pool = np.array([0, 0, 1, 2, 2], dtype=I64)
    np.testing.assert_allclose(pooled_time(own, remaining, pool), [16.0, 16.0, 5.0, 20.0, np.inf])
    # Without a pool (every snapshot but HadarE's copies) nothing changes.
    np.testing.assert_array_equal(pooled_time(own, remaining, None), own)


def test_the_copies_snapshot_tells_whose_copy_each_job_is(toy_table: ThroughputTable) -> None:
    # HadarE's virtual snapshot names each copy's job (Snapshot.pool = owner), and a fill
    # epoch's snapshot, which keeps only the jobs that hold no GPUs, keeps their pool entries.
    jobs = [make_job(5, 36000, 0), make_job(9, 36000, 0)]
    snap = SimulatedCluster(jobs, parse_counts("v100=4"), toy_table).snapshot(0, 0.0, 360.0, None)
    assert snap.pool is None
    pol = HadarEPolicy()
    virt, owner, _copy = pol.expand(snap, np.array([2, 3], dtype=I64), pol.overhead(snap), None)
    assert virt.pool is not None and virt.pool.tolist() == owner.tolist() == [0, 0, 1, 1, 1]
    held = replace(virt, current=Placement(np.array([1], dtype=I64), np.array([0], dtype=I64),
                                           np.array([1], dtype=I64)))
    sub, holds = fill_snapshot(held)
    assert holds.tolist() == [False, True, False, False, False]
    assert sub.pool is not None and sub.pool.tolist() == [0, 1, 1, 1]


def test_no_copy_spans_nodes_when_the_snapshot_says_so(toy_table: ThroughputTable) -> None:
    # A long 2-GPU job on four 1-GPU v100 nodes: forked, each copy would span two nodes.
    sim = SimulatedCluster([make_job(1, 360000, 0, "toy2", scale=2)], parse_counts("v100=4"),
                           toy_table)
    snap = sim.snapshot(0, 0.0, 360.0, None)
    assert snap.multi_node_copies is False
    policy = make_policy("hadare", max_copies=4)
    for copies in policy.allocate(snap).placement.by_job_copies().values():
        assert len(copies) == 1  # a copy cannot fit one node: the job runs as one gang
    spanning = Snapshot(**{**snap.__dict__, "multi_node_copies": True})
    multi = policy.allocate(spanning).placement.by_job_copies()
    assert len(multi[1]) == 2 and all(len(rows) == 2 for rows in multi[1].values())


def test_fork_drain_is_a_lower_bound_of_the_fork_lp() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        n, h = int(rng.integers(1, 12)), 3
        rate = rng.uniform(0.1, 5.0, size=(n, h)) * (rng.random((n, h)) > 0.2)
        rate[:, 0] = np.maximum(rate[:, 0], 0.1)
        scale = rng.choice([1, 2, 4], size=n).astype(I64)
        remaining = rng.uniform(100, 10000, size=n)
        capacity = np.array([4, 4, 4], dtype=I64)
        lp = fork_makespan_bound(np.zeros(n), remaining, scale, rate, capacity)
        assert 0 < fork_drain(remaining, scale, rate, capacity) <= lp * (1 + 1e-6)


def test_fork_bound_with_a_copy_limit_lies_between_the_two_others() -> None:
    # one job of 100 steps at 1 step/s on one GPU, ten GPUs: alone it takes 100 s; forked over
    # every GPU 10 s; in at most 4 copies 25 s.  A second job of 60 steps arrives at 30 s, when
    # the first is done either way: 6 s on ten GPUs, 15 s on four.
    rate, scale = np.array([[1.0]]), np.array([1], dtype=I64)
    cap, zero, work = np.array([10], dtype=I64), np.zeros(1), np.array([100.0])
    assert fluid_makespan_bound(zero, work, scale, rate, cap) == pytest.approx(100.0)
    assert fork_makespan_bound(zero, work, scale, rate, cap) == pytest.approx(10.0)
    assert fork_makespan_bound(zero, work, scale, rate, cap, copies=4) == pytest.approx(25.0)
    assert fork_makespan_bound(zero, work, scale, rate, cap, copies=1) == pytest.approx(
        fluid_makespan_bound(zero, work, scale, rate, cap))
    two = (np.array([0.0, 30.0]), np.array([100.0, 60.0]), np.array([1, 1], dtype=I64),
           np.array([[1.0], [1.0]]), np.array([10], dtype=I64))
    # the second job's 60 steps on 4 GPUs from 30 s: done at 45 s
    assert fork_makespan_bound(*two, copies=4) == pytest.approx(45.0)
    assert fork_makespan_bound(*two) == pytest.approx(36.0)
    with pytest.raises(ValueError, match="copies"):
        fork_makespan_bound(zero, work, scale, rate, cap, copies=0)


def test_long_jobs_spread_when_they_dominate() -> None:
    # bench/traces/long_tail_seed0.trace: 3 long jobs of 20-30 h on a v100 among 28 short ones.
    # Without forking the makespan is the longest job alone; hadare stays within 10% of the
    # fork bound and lowers the average JCT.
    table = default_table()
    jobs = load_trace(str(BENCH_TRACES / "long_tail_seed0.trace"), table)
    cluster = load_cluster("4:4:4")
    capacity = np.array([cluster.capacity(g) for g in cluster.gpu_types], dtype=I64)
    rate = np.array([[table.rate(j.job_type, j.scale_factor, g) for g in cluster.gpu_types]
                     for j in jobs])
    bound = fork_makespan_bound(np.array([j.arrival_s for j in jobs]),
                                np.array([j.total_steps for j in jobs]),
                                np.array([j.scale_factor for j in jobs], dtype=I64), rate,
                                capacity)
    hadar = simulate(jobs, cluster, table, make_policy("hadar"))
    hadare = simulate(jobs, cluster, table, make_policy("hadare"))
    assert hadare.makespan_s <= 1.10 * bound < hadar.makespan_s
    assert hadare.avg_jct_s < hadar.avg_jct_s
    assert hadare.utilization > hadar.utilization


def test_simulate_cli_runs_hadare_and_plots_copies(tmp_path: Path) -> None:
    out = tmp_path / "plots"
    proc = run_cli("simulate", "--trace", str(BENCH_TRACES / "long_tail_seed0.trace"),
                   "--cluster", "4:4:4", "--policy", "hadar,hadare", "--max-copies", "3",
                   "--plots", str(out), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert (out / "copies.png").stat().st_size > 0
    rows = {r["policy"]: r for r in json.loads((tmp_path / "r.json").read_text())}
    assert rows["hadar"]["max_copies"] == 1 and rows["hadare"]["max_copies"] == 3
    assert rows["hadare"]["forked_jobs"] >= 3


def long_tail_hadare_rows(tmp_path: Path, flag: str) -> dict[tuple[str, ...], dict[str, Any]]:
    """``hadar-slurm simulate`` of hadare on the long-tail trace (4:4:4), without ``flag``
    and with it: the JSON row of each, keyed by the flags given (``()``, ``(flag,)``)."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    flag_sets: tuple[tuple[str, ...], ...] = ((), (flag,))
    for flags in flag_sets:
        out = tmp_path / f"r{len(flags)}.json"
        proc = run_cli("simulate", "--trace", str(BENCH_TRACES / "long_tail_seed0.trace"),
                       "--cluster", "4:4:4", "--policy", "hadare", *flags, "--json", str(out))
        assert proc.returncode == 0, proc.stderr
        rows[flags] = json.loads(out.read_text())[0]
    return rows


def test_simulate_cli_takes_pin_binding(tmp_path: Path) -> None:
    # On by default; --no-pin-binding reaches the policy: the same trace ends otherwise, every
    # job completed, and --pin-binding is the default's run.
    rows = long_tail_hadare_rows(tmp_path, "--no-pin-binding")
    assert all(r["num_completed"] == r["num_jobs"] == 31 for r in rows.values())
    assert rows[()]["makespan_s"] != rows[("--no-pin-binding",)]["makespan_s"]
    on = long_tail_hadare_rows(tmp_path, "--pin-binding")
    assert on[("--pin-binding",)]["makespan_s"] == rows[()]["makespan_s"]


def test_simulate_cli_takes_final_run(tmp_path: Path) -> None:
    # --final-run: a forked job's own run after its copies is placed by the policy, as the
    # sidecar runs it; the run is the library's with final_run=True, the same costs.
    from hadar_slurm.costs import LiveCosts

    rows = long_tail_hadare_rows(tmp_path, "--final-run")
    assert all(r["num_completed"] == r["num_jobs"] == 31 for r in rows.values())
    table = default_table()
    live = LiveCosts()
    res = simulate(load_trace(str(BENCH_TRACES / "long_tail_seed0.trace"), table),
                   load_cluster("4:4:4"), table, make_policy("hadare"),
                   migration_cost_s=live.move_s, start_cost_s=live.start_s,
                   fork_start_s=live.fork_start_s, fork_interval_s=live.fork_interval_s,
                   final_run=True)
    got = rows[("--final-run",)]
    assert got["forked_jobs"] == res.forked_jobs > 0
    assert (got["makespan_s"], got["avg_jct_s"]) == (round(res.makespan_s, 3),
                                                     round(res.avg_jct_s, 3))
    assert got["avg_jct_s"] != rows[()]["avg_jct_s"]


@pytest.mark.parametrize("flag,value", [
    ("--max-copies", "0"), ("--max-copies", "x"), ("--consolidation-base-s", "-1"),
    ("--consolidation-s-per-gb", "nan"),
])
def test_simulate_cli_refuses_bad_hadare_flags(flag: str, value: str) -> None:
    proc = run_cli("simulate", "--trace", "static_32_seed0", "--cluster", "4:4:4",
                   "--policy", "hadare", flag, value)
    assert proc.returncode == 2
    assert flag.lstrip("-") in proc.stderr


def test_no_fork_when_consolidation_would_eat_the_round(toy_table: ThroughputTable) -> None:
    # 3 s epochs and 2 s consolidations: forking would lose two thirds of every round, so the
    # long job runs unforked (and is still placed: its rate is not zeroed).
    sim = SimulatedCluster([make_job(1, 36000, 0)], parse_counts("v100=2:k80=2"), toy_table)
    snap = sim.snapshot(0, 0.0, 3.0, None)
    policy = HadarEPolicy(consolidation=ConsolidationCost(base_s=2.0, s_per_gb=0.0))
    d = policy.allocate(snap)
    assert d.placement.num_copies() == {1: 1}
    snap360 = sim.snapshot(0, 0.0, 360.0, None)
    assert policy.allocate(snap360).placement.num_copies()[1] == 4


def test_a_running_job_gets_no_copy_whose_restart_the_round_cannot_repay(
        toy_table: ThroughputTable) -> None:
    # Job 1 is short next to job 2 (which may not be forked), so step 1 offers it no copies; it
    # runs on node 0, job 2 on node 1 (four v100 nodes), and the fill step would give job 1
    # copies on the two idle ones. Live, adding a copy restarts the job, all of it: when the
    # restart eats most of the round (migration_s 300 of 360 s) the copies cannot repay it and
    # it keeps running as it is; a move that costs nothing, or a job that starts now anyway,
    # gets them.
    sim = SimulatedCluster([make_job(1, 2000, 0), make_job(2, 200000, 0)],
                           parse_counts("v100=4"), toy_table)
    snap = Snapshot(**{**sim.snapshot(0, 0.0, 360.0, None).__dict__,
                       "max_copies": np.array([4, 1], dtype=I64)})
    running = placement([(1, 0, 1, 0), (2, 1, 1, 0)])
    policy = HadarEPolicy(consolidation=ConsolidationCost(base_s=3.6, s_per_gb=0.0))
    cheap = Snapshot(**{**snap.__dict__, "current": running, "migration_s": 0.0})
    assert policy.allocate(cheap).placement.num_copies()[1] > 1
    dear = Snapshot(**{**snap.__dict__, "current": running, "migration_s": 300.0})
    d = policy.allocate(dear)
    assert d.placement.num_copies() == {1: 1, 2: 1}
    assert d.placement.by_job_sorted() == {1: [(0, 1)], 2: [(1, 1)]}
    pending = Snapshot(**{**snap.__dict__, "migration_s": 300.0})
    assert policy.allocate(pending).placement.num_copies()[1] > 1


# -- copies are node-disjoint: the fork bound and Hadar's plan know it -----------------------


def test_the_fork_bound_counts_the_nodes_that_can_hold_a_copy() -> None:
    zero = np.zeros(1)
    # One 1-GPU job of 100 steps at 1 step/s on two 4-GPU nodes: four copies would take 25 s,
    # but no two copies share a node, so at most two run: 50 s.
    one = (zero, np.array([100.0]), np.array([1], dtype=I64), np.array([[1.0]]),
           np.array([8], dtype=I64))
    assert fork_makespan_bound(*one, copies=4) == pytest.approx(25.0)
    assert fork_makespan_bound(*one, copies=4, room=np.array([[2]])) == pytest.approx(50.0)
    # A 4-GPU job (4 steps/s) on sixteen 1-GPU nodes: no node holds a copy, so it runs as one
    # gang over four nodes (400 / 4 = 100 s), not as four copies (25 s).
    gang = (zero, np.array([400.0]), np.array([4], dtype=I64), np.array([[4.0]]),
            np.array([16], dtype=I64))
    assert fork_makespan_bound(*gang, copies=4) == pytest.approx(25.0)
    assert fork_makespan_bound(*gang, copies=4, room=np.array([[0]])) == pytest.approx(100.0)
    # Two types: one node of the fast one (2 steps/s), three of the slow one (1 step/s): at
    # most 1 + 3 copies, 5 steps/s, 20 s for 100 steps.
    two = (zero, np.array([100.0]), np.array([1], dtype=I64), np.array([[2.0, 1.0]]),
           np.array([4, 12], dtype=I64))
    assert fork_makespan_bound(*two, copies=4, room=np.array([[1, 3]])) == pytest.approx(20.0)
    assert fork_makespan_bound(*two, copies=4) == pytest.approx(12.5)  # 4 copies of 2 steps/s
    # copy_room: nodes of each type with at least the job's scale factor of GPUs.
    cluster = parse_counts("v100=2x4:k80=3x2")
    assert copy_room(np.array([1, 2, 4], dtype=I64), cluster).tolist() == [
        [2, 3], [2, 3], [2, 0]]


def test_copies_hadar_could_not_place_go_back_to_the_jobs_that_wait() -> None:
    # Three 2-GPU v100 nodes.  Job 1: 1 GPU, 360,000 steps (100 h): far longer than the drain,
    # so it is offered one copy per node (3).  Job 2: 4 GPUs, 14,400 steps (1 h).  Hadar, not
    # knowing that copies must be node-disjoint, gives job 1's three copies priority; the
    # matcher puts two of them on one node and the merge drops one, so job 1 runs two copies,
    # job 2 (4 GPUs > the 3 left in Hadar's plan) waits, and 4 GPUs idle.  Planned again with
    # job 1 at the copies it kept, both jobs run.
    table = parse_csv(TOY_CSV + "toy4,4,v100,4.0\n", "toy.csv")
    jobs = [make_job(1, 360000, 0), make_job(2, 14400, 0, "toy4", scale=4)]
    sim = SimulatedCluster(jobs, parse_counts("v100=3x2"), table)
    snap = sim.snapshot(0, 0.0, 360.0, None)
    old = HadarEPolicy(replans=0).allocate(snap).placement
    assert set(old.job.tolist()) == {1} and old.num_copies() == {1: 2}
    assert int(old.count.sum()) == 2
    new = HadarEPolicy().allocate(snap)
    assert set(new.placement.job.tolist()) == {1, 2}
    assert int(new.placement.count[new.placement.job == 2].sum()) == 4
    assert int(new.placement.count.sum()) >= 5
    sim.current = new.placement
    check_copies(sim, 3, False)


def test_idle_gpus_no_waiting_job_fits_go_to_copies() -> None:
    # Five 2-GPU v100 nodes.  Three 10-hour jobs: 1 GPU (job 1), 8 GPUs (job 2), 4 GPUs
    # (job 3).  Hadar runs jobs 3 and 1; job 2 waits, and the 5 GPUs left cannot hold it.
    # Those GPUs go to copies of job 1, one per node it does not share with job 3 (nodes 0, 3
    # and 4), where before they idled because a job was waiting.
    table = parse_csv(TOY_CSV + "toy4,4,v100,4.0\ntoy8,8,v100,8.0\n", "toy.csv")
    jobs = [make_job(1, 36000, 0), make_job(2, 288000, 0, "toy8", scale=8),
            make_job(3, 144000, 0, "toy4", scale=4)]
    sim = SimulatedCluster(jobs, parse_counts("v100=5x2"), table)
    snap = sim.snapshot(0, 0.0, 360.0, None)
    d = HadarEPolicy().allocate(snap)
    p = d.placement
    assert 2 not in p.job.tolist()
    assert int(p.count[p.job == 3].sum()) == 4
    copies = p.by_job_copies()[1]
    assert len(copies) == 3 and sorted(nd for rows in copies.values() for nd, _ in rows) == [
        0, 3, 4]
    sim.current = p
    check_copies(sim, 4, False)
    assert HadarEPolicy.waiting_fits(snap, p, snap.rate.max(axis=1) > 0) is False


# -- a job that ends within the round keeps its GPUs (issue #14) ------------------------------

def captured_snapshot(name: str, refill_on_finish: bool) -> tuple[Snapshot, HadarEPolicy]:
    """A snapshot the dev cluster's sidecar read (``tests/data/snapshots``) and the policy it
    ran, with its consolidation cost."""
    d = json.loads((SNAPSHOTS / name).read_text())
    state = d["policy_state"]
    snap = snapshot_from_json(
        d, HadarEState(HadarState(state["hadar_target"], (), ()), state["target"]),
        refill_on_finish=refill_on_finish)
    cost = ConsolidationCost(base_s=d["consolidation_base_s"],
                             s_per_gb=d["consolidation_s_per_gb"])
    return snap, HadarEPolicy(consolidation=cost)


def test_a_job_that_ends_this_round_is_not_stopped_for_critical_jobs() -> None:
    # The fidelity trace's third epoch as the sidecar read it live (HadarE, 12 s rounds, a
    # move costs 7.31 s), with job 10's progress as the simulator had it (0.726 of its work
    # left; the live estimate was 0.75).  Job 2 runs on 4 A100s of node4 with 12,730 of its
    # 31,904 steps left at 1,012 steps/s: 12.6 s, within the round plus what stopping it would
    # cost (19.3 s).  Nine of the 13 jobs are critical for the drain target and come first;
    # they take node4's A100s and job 2 is stopped, as a live run of the trace did (job 2
    # then waited 17 epochs and ended at 229 s; every simulated run ends it at 37 s).  Where
    # the world gives a job's GPUs out as soon as it ends (the sidecar's
    # reschedule_on_finish), job 2 goes first and keeps its GPUs: they come back within the
    # round, and stopping it would only add a restart.
    snap, policy = captured_snapshot("fidelity-hadare-epoch2.json", refill_on_finish=True)
    i = int(np.nonzero(snap.job_ids == 2)[0][0])
    left = snap.remaining[i] / snap.rate[i, snap.gpu_types.index("a100")]
    assert 12.0 < left <= snap.round_s + snap.migration_s
    decision = policy.allocate(snap)
    mine = decision.placement.select(decision.placement.job == 2)
    assert [(snap.node_names[n], c) for n, c in zip(mine.node, mine.count, strict=True)] == [
        ("node4", 4)]
    # With rounds that leave a job's freed GPUs idle to their end, Hadar's rule does not
    # apply: the critical jobs come first, as they did live, and job 2 is stopped.  (Shown
    # with Hadar over the real jobs: HadarE now plans jobs 5, 6 and 10 as the two copies each
    # runs as, test_a_job_running_as_copies_is_planned_as_them, which leaves the critical
    # jobs other GPUs here whichever the rounds.)
    assert 2 in policy.hadar.allocate(snap).placement.job
    snap, policy = captured_snapshot("fidelity-hadare-epoch2.json", refill_on_finish=False)
    assert 2 not in policy.hadar.allocate(snap).placement.job


def test_a_job_running_as_copies_is_planned_as_them() -> None:
    # bench/fidelity's trace in the simulator, 24 s in (tests/data/snapshots): job 9, a
    # 1-GPU ResNet-50 too short for step 1 to fork, runs as the three copies an earlier
    # epoch's step 3 gave it on GPUs nobody took; job 4 runs as two.  Each copy added or
    # dropped restarts the whole job.  Planned as one copy again, as before, job 9 lost two
    # copies here (a restart) and step 3, which gives idle GPUs out only once no waiting job
    # fits in them, did not give them back; in the live runs such jobs went from three copies
    # to one and back to two, a restart each time.  Planned as the copies it runs as, it keeps
    # them, and no running job restarts.
    d = json.loads((SNAPSHOTS / "fidelity-hadare-sim-24s.json").read_text())
    state = d["policy_state"]
    snap = snapshot_from_json(
        d, HadarEState(HadarState(state["hadar_target"], (), ()), state["target"]),
        refill_on_finish=True)
    runs_as = dict(zip(snap.job_ids.tolist(), HadarEPolicy.runs_as(snap).tolist(), strict=True))
    assert {j: k for j, k in runs_as.items() if k != 1} == {0: 0, 4: 2, 5: 2, 6: 0, 8: 0,
                                                              9: 3, 12: 0}
    policy = HadarEPolicy(consolidation=ConsolidationCost(
        base_s=d["consolidation_base_s"], s_per_gb=d["consolidation_s_per_gb"]))
    now = snap.current.by_job_copies()
    new = policy.allocate(snap).placement.by_job_copies()
    assert new[9] == now[9] and new[4] == now[4]
    assert [j for j in now if j in new and new[j] != now[j]] == []


# -- step 0: the jobs that bind the fork makespan (pin_binding) -----------------------------

FASTV_CSV = TOY_CSV + "fastv,1,v100,1.0\nfastv,1,k80,0.1\n"
NO_CONSOLIDATION = ConsolidationCost(base_s=0.0, s_per_gb=0.0)


def binding_snapshot(others: list[tuple[int, float, str]], counts: str) -> Snapshot:
    """Job 1, a 36,000-step ``toy`` (1 step/s on a v100, 0.5 on a k80), and ``others`` as
    (id, steps, type), all there at 0, on 1-GPU nodes (v100 nodes first)."""
    table = parse_csv(FASTV_CSV, "toy.csv")
    jobs = [make_job(1, 36000, 0)] + [make_job(j, s, 0, t) for j, s, t in others]
    return SimulatedCluster(jobs, parse_counts(counts), table).snapshot(0, 0.0, 360.0, None)


def test_a_jobs_own_fork_time_is_its_work_over_its_fastest_copies() -> None:
    table = parse_csv(FASTV_CSV, "toy.csv")
    jobs = [make_job(1, 36000, 0), make_job(2, 4000, 0, "fastv"), make_job(3, 100, 0, "toy2", 2)]
    snap = SimulatedCluster(jobs, parse_counts("v100=2:k80=4"), table).snapshot(
        0, 0.0, 360.0, None)
    cap = np.array([2, 2, 2], dtype=I64)
    none = np.zeros(3)
    # job 1: two copies, both on the v100 nodes: 36,000 / (1 + 1); job 2: 4,000 / (1 + 1);
    # job 3 (2 GPUs) fits on no 1-GPU node.
    own = HadarEPolicy().own_fork_time(snap, cap, none)
    assert own.tolist() == [18000.0, 2000.0, np.inf]
    # With three copies job 1 adds a k80 (0.5): 36,000 / 2.5; a tenth of each round lost to
    # consolidation: 36,000 / (2 * 0.9).
    assert HadarEPolicy().own_fork_time(snap, np.array([3, 2, 2], dtype=I64), none)[0] == 14400.0
    assert HadarEPolicy().own_fork_time(snap, cap, np.full(3, 0.1))[0] == pytest.approx(20000.0)


def test_the_job_that_binds_the_fork_makespan_runs_on_its_fastest_copies() -> None:
    # Job 1 runs 2x faster on a v100 than on a k80; four 4,000-step jobs run 10x faster there.
    # With two copies at most, job 1 ends at 18,000 s at the soonest (both v100s), past the
    # drain of all the work (the fork LP's 12,994 s, which lets job 1 use any number of
    # GPUs): the makespan is job 1's own.  Hadar's price split puts its copies on the k80s,
    # where it gives up the least against the others (36,000 s there); step 0 runs it on the
    # two v100s, as the fork LP does, and the others on the k80s: their average JCT is what
    # it pays (docs/algorithm.md, "Jobs that bind the fork makespan").
    snap = binding_snapshot([(j, 4000, "fastv") for j in (2, 3, 4, 5)], "v100=2:k80=4")
    v100 = {0, 1}
    fork_w = fork_drain(snap.remaining, snap.scale.astype(I64), snap.rate, snap.capacity())
    assert fork_w == pytest.approx(12994.5, abs=1.0)
    plain = HadarEPolicy(max_copies=2, consolidation=NO_CONSOLIDATION,
                         pin_binding=False).allocate(snap)
    assert set(plain.placement.rows_of(1)) == {(2, 1), (5, 1)}  # two k80 nodes
    pin = HadarEPolicy(max_copies=2, consolidation=NO_CONSOLIDATION, pin_binding=True,
                       pin_tolerance=0.0)
    d = pin.allocate(snap)
    assert set(d.placement.rows_of(1)) == {(0, 1), (1, 1)}
    assert d.placement.num_copies()[1] == 2 and d.detail[1] == "forked into 2 copies"
    assert {nd for j in (2, 3, 4, 5) for nd, _ in d.placement.rows_of(j)} == {2, 3, 4, 5}
    assert (d.reason == 0).all()
    # The others' Hadar target is no sooner than job 1's end: none of them need end before.
    assert isinstance(d.policy_state, HadarEState)
    assert isinstance(d.policy_state.hadar, HadarState)
    assert d.policy_state.hadar.target >= 18000.0
    assert d.policy_state.deadlines == ((1, 18000.0),)
    assert not v100 & {nd for j in (2, 3, 4, 5) for nd, _ in d.placement.rows_of(j)}


def test_only_a_job_as_wide_as_every_other_may_bind_and_none_while_a_trial_runs() -> None:
    # Three jobs with work left: 1-GPU jobs 1 and 2, and a 2-GPU job 3.  A 1-GPU job's copy
    # could take half a 2-GPU node that job 3 needs whole: only job 3 may be pinned.  Once job
    # 3 is done, or if it can run nowhere, the 1-GPU jobs may.
    snap = binding_snapshot([(2, 4000, "fastv"), (3, 100, "toy2")], "v100=2:k80=4")
    rate = np.ones((3, snap.rate.shape[1]))
    s = replace(snap, scale=np.array([1, 1, 2], dtype=I64), rate=rate)
    assert HadarEPolicy.may_bind(s).tolist() == [False, False, True]
    assert HadarEPolicy.may_bind(replace(s, remaining=np.array([1.0, 1.0, 0.0]))).tolist() == [
        True, True, True]
    rate[2] = 0.0
    assert HadarEPolicy.may_bind(s).tolist() == [True, True, True]
    # While a study has a trial with work left, no job may bind; once its trials are done,
    # the others may again.
    assert HadarEPolicy.may_bind(replace(s, spread=np.array([True, False, False]))).tolist() == [
        False, False, False]
    done = replace(s, spread=np.array([True, False, False]), remaining=np.array([0.0, 1.0, 1.0]))
    assert HadarEPolicy.may_bind(done).tolist() == [True, True, True]


def test_no_job_binds_while_a_study_has_a_trial_with_work_left() -> None:
    # The snapshot of the test above, where job 1 (18,000 s at the soonest on both v100s)
    # binds.  Job 2 (4,000 steps) is now a study's trial: what the study will still ask (its
    # later rungs, its halving's promotions) is unknown, so which job binds is too, and step 0
    # pins nothing (traced: two 1-GPU jobs among the others bound and held all four v100s
    # while a study that arrived after them ran on p100s and k80s).  The decision is the one
    # without step 0.  Once the trial is done, job 1 binds again and runs on both v100s.
    snap = binding_snapshot([(j, 4000, "fastv") for j in (2, 3, 4, 5)], "v100=2:k80=4")
    trial = replace(snap, after=np.array([0.0, 396000.0, 0.0, 0.0, 0.0]),
                    spread=np.array([False, True, False, False, False]))
    plain = HadarEPolicy(max_copies=2, consolidation=NO_CONSOLIDATION,
                         pin_binding=False).allocate(trial)
    pin = HadarEPolicy(max_copies=2, consolidation=NO_CONSOLIDATION, pin_binding=True,
                       pin_tolerance=0.0)
    assert pin.pin(trial) == (None, ())
    pinned = pin.allocate(trial)
    assert pinned.placement.same_as(plain.placement)
    assert isinstance(pinned.policy_state, HadarEState)
    assert not pinned.policy_state.deadlines
    done = replace(trial, remaining=np.array([36000.0, 0.0, 4000, 4000, 4000]))
    d = pin.allocate(done)
    assert set(d.placement.rows_of(1)) == {(0, 1), (1, 1)}
    assert isinstance(d.policy_state, HadarEState) and d.policy_state.deadlines


def test_a_type_the_binding_job_takes_whole_is_not_planned_for_the_others() -> None:
    # Job 1 (18,000 s on both v100s, past the fork drain's 12,592 s) takes every v100.  The
    # others are planned without v100s: the two 1,000-step jobs on the k80s (each its own),
    # not as if a v100 were free; job 4, which runs on v100s only, waits with the reason.
    snap = binding_snapshot([(2, 1000, "fastv"), (3, 1000, "fastv"), (4, 500, "v100only")],
                            "v100=2:k80=2")
    d = HadarEPolicy(max_copies=2, consolidation=NO_CONSOLIDATION, pin_binding=True,
                     pin_tolerance=0.0).allocate(snap)
    assert set(d.placement.rows_of(1)) == {(0, 1), (1, 1)}
    assert {j: d.placement.rows_of(j) for j in (2, 3)} in (
        {2: [(2, 1)], 3: [(3, 1)]}, {2: [(3, 1)], 3: [(2, 1)]})
    assert d.placement.rows_of(4) == []
    assert d.reason.tolist() == [0, 0, 0, 2]  # NO_FREE_GPU
    assert d.detail[4] == "every GPU of its types is held by the jobs that bind the makespan (1)"


def test_no_job_binds_and_step_0_changes_nothing() -> None:
    # Job 1 with four copies (v100, v100, k80, k80: 36,000 / 3 = 12,000 s) ends before the
    # drain of all the work: no job binds, and the decision is plan()'s.
    snap = binding_snapshot([(j, 4000, "fastv") for j in (2, 3)], "v100=2:k80=2")
    plain = HadarEPolicy(consolidation=NO_CONSOLIDATION, pin_binding=False)
    pin = HadarEPolicy(consolidation=NO_CONSOLIDATION, pin_binding=True)
    cap = pin.copies_allowed(snap, pin.overhead(snap))
    assert pin.own_fork_time(snap, cap, pin.overhead(snap))[0] == 12000.0
    assert fork_drain(snap.remaining, snap.scale.astype(I64), snap.rate,
                      snap.capacity()) > 12000.0
    assert pin.pin(snap) == (None, ())
    assert pin.allocate(snap).placement.same_as(plain.allocate(snap).placement)


def test_a_binding_job_runs_on_its_fastest_copies_once_its_deadline_is_near() -> None:
    # The case above with the default tolerance: job 1 binds (18,000 s at the soonest) and
    # gets a deadline 5% later, 18,900 s.  At 0 that leaves it 900 s, more than the slack of
    # 1.5 rounds (540 s): the others may still go first, and the decision is plan()'s, with
    # the deadline carried.  Given a deadline of 18,400 s (400 s to spare), it is pinned.
    snap = binding_snapshot([(j, 4000, "fastv") for j in (2, 3, 4, 5)], "v100=2:k80=4")
    pin = HadarEPolicy(max_copies=2, consolidation=NO_CONSOLIDATION, pin_binding=True)
    plain = HadarEPolicy(max_copies=2, consolidation=NO_CONSOLIDATION, pin_binding=False)
    d = pin.allocate(snap)
    assert d.placement.same_as(plain.allocate(snap).placement)
    assert isinstance(d.policy_state, HadarEState)
    (job, deadline), = d.policy_state.deadlines
    assert job == 1 and deadline == pytest.approx(18900.0)
    due = replace(snap, policy_state=replace(d.policy_state, deadlines=((1, 18400.0),)))
    assert set(pin.allocate(due).placement.rows_of(1)) == {(0, 1), (1, 1)}
    # (a job that no longer binds loses its deadline)
    gone = pin.allocate(replace(snap, remaining=np.array([1000.0, 4000, 4000, 4000, 4000])))
    assert isinstance(gone.policy_state, HadarEState)
    assert gone.policy_state.deadlines == ()
