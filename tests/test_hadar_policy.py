"""The ``hadar`` policy: behaviour on small scenarios worked out by hand, and on Gavel's traces.

Throughputs are written as CSV so that every number is easy to check.  Rounds are 360 s.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Placement, Reason, Snapshot
from hadar_slurm.policy.hadar import (
    HadarPolicy,
    HadarState,
    blocked_types,
    drain_after_round,
    drain_at,
    drain_estimate,
    ends_this_round,
    ideal_seconds,
    job_paths,
    moves_pay,
    near_tie_held,
    restarted,
    round_progress,
    trial_types,
    upgrade_idle,
)
from hadar_slurm.rates.table import ThroughputTable, default_table, parse_csv
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.bounds import fluid_makespan_bound
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.run import simulate
from hadar_slurm.sim.trace import load_trace
from tests.helpers import SNAPSHOTS, snapshot_from_json

# "fair" runs almost as fast on the slow type b as on a; "picky" runs 10x slower on b.
TWO_TYPES = parse_csv(
    """job_type,scale_factor,gpu_type,steps_per_second
fair,1,a,1.0
fair,1,b,0.9
picky,1,a,1.0
picky,1,b,0.1
nowhere,1,c,1.0
""",
    "two-types.csv",
)


def job(job_id: int, job_type: str, steps: float, arrival: float = 0.0) -> Job:
    return Job(job_id, job_type, 1, steps, arrival)


def first_snapshot(jobs: list[Job], cluster: ClusterSpec, table: ThroughputTable):  # type: ignore[no-untyped-def]
    return SimulatedCluster(jobs, cluster, table).snapshot(0, 0.0, 360.0, None)


def first_placement_types(jobs: list[Job], cluster: ClusterSpec, table: ThroughputTable,
                          spread: list[bool] | None = None) -> dict[int, str]:
    """Hadar's first epoch on a fresh cluster: the GPU type each placed job got (``spread``:
    which jobs are a study's trials, ``Snapshot.spread``)."""
    snap = first_snapshot(jobs, cluster, table)
    if spread is not None:
        snap = dataclasses.replace(snap, spread=np.array(spread))
    decision = HadarPolicy().allocate(snap)
    return {int(j): snap.gpu_types[snap.node_type[n]]
            for j, n in zip(decision.placement.job, decision.placement.node, strict=True)}


def test_on_a_mostly_idle_cluster_every_job_runs_on_its_fastest_type() -> None:
    # Four GPUs of each type; two "fair" jobs (1.0 step/s on a, 0.9 on b) of 3600 and 1800
    # steps.  The drain target is 3600 s (the long job alone); on a, the two leave each a-GPU
    # 1350 s of work, well within it: capacity does not bind, so both run on a and end at
    # 3600 s and 1800 s.  (Levelling the two types, as a drained makespan would, puts the
    # short job on b, where it ends at 2000 s.)
    cluster = parse_counts("a=4:b=4")
    jobs = [job(0, "fair", 3600), job(1, "fair", 1800)]
    placed = first_placement_types(jobs, cluster, TWO_TYPES)
    assert placed == {0: "a", 1: "a"}
    result = simulate(jobs, cluster, TWO_TYPES, HadarPolicy())
    assert list(result.finish) == pytest.approx([3600.0, 1800.0])


def test_a_job_kept_off_a_fast_type_takes_its_idle_gpus() -> None:
    # Four GPUs of each type; two 3-GPU gangs of 36000 steps (3 steps/s on a, 0.3 on b) and a
    # 1-GPU "fair" job of 3600 steps (1.0 step/s on a, 0.9 on b).  The gangs' work overloads a,
    # so the split gives it to them and puts fair on b; but only one 3-GPU gang fits on a's four
    # GPUs at a time, and the fourth would idle.  Fair takes it: 1.0 step/s instead of 0.9, it
    # ends at 3600 s instead of 4000 s.  The gangs get what they got without it.
    table = parse_csv("""job_type,scale_factor,gpu_type,steps_per_second
fair,1,a,1.0
fair,1,b,0.9
wide,3,a,3.0
wide,3,b,0.3
""", "gangs.csv")
    cluster = parse_counts("a=4:b=4")
    jobs = [Job(0, "wide", 3, 36000, 0.0), Job(1, "wide", 3, 36000, 0.0), job(2, "fair", 3600)]
    placed = first_placement_types(jobs, cluster, table)
    assert placed[0] == "a" and placed[2] == "a"
    result = simulate(jobs, cluster, table, HadarPolicy())
    assert result.finish[2] == pytest.approx(3600.0)


def test_a_binding_gang_chain_runs_its_shortest_gang_now() -> None:
    # One type of four GPUs; a 4-GPU gang of 360 s and three 1-GPU jobs of 3200 s.  The gang
    # needs the whole type, so it never runs beside them: in either order the last job ends at
    # 3200 + 360 = 3560 s.  With a drain target 4000 s away, the window after this round less
    # the margin is 4000 - 1.5 * 360 = 3460 s; the chain (360 s) leaves the others 3100 s, less
    # than their 3200 s, so they are critical only because of the chain (3200 < 3460 without
    # it).  The chain binds, and its gang's 4 x 360 = 1440 GPU-seconds are less than the 3100 s
    # it would wait: it runs now and ends at 360 s, the others at 3560 s (average JCT 2760 s
    # against 3290 s the other way round, same makespan).  With no target carried over, the
    # target is the drain estimate, 3200 s away: the three are critical even without the chain
    # (3200 > 3200 - 540) and go first.
    table = parse_csv("""job_type,scale_factor,gpu_type,steps_per_second
fair,1,a,1.0
wide,4,a,1.0
""", "chain.csv")
    cluster = parse_counts("a=4")
    jobs = [Job(0, "wide", 4, 360, 0.0)] + [job(i, "fair", 3200) for i in (1, 2, 3)]
    snap = first_snapshot(jobs, cluster, table)
    later = HadarPolicy().allocate(dataclasses.replace(snap, policy_state=HadarState(4000.0)))
    assert sorted(set(later.placement.job.tolist())) == [0]
    now = HadarPolicy().allocate(snap)
    assert sorted(set(now.placement.job.tolist())) == [1, 2, 3]


def test_a_gang_chain_runs_one_gang_at_a_time_shortest_first() -> None:
    # One type of four GPUs and three 4-GPU gangs, A of 3600 s, B of 1800 s and C of 360 s:
    # they never run side by side, so the last ends at 5760 s whatever the order.  The drain
    # target is 5760 s away; the window after this round less the margin, 5760 - 1.5 * 360 =
    # 5220 s, times chain_factor 0.95 is 4959 s < 5760 s of chain: one gang is critical.
    # C, the shortest, goes first, since A still fits after it (360 + 3600 = 3960 <= 4959): C
    # ends at 360 s.  Then the window is 5400 s, 4617 s by the same rule: B first would leave
    # A too late (1800 + 3600 > 4617), so A goes, and keeps the type until it ends at 3960 s
    # (the chain's gang of the last epoch, still running, with the longest in time), then B,
    # 5760 s.  Average JCT (360 + 3960 + 5760) / 3 = 3360 s, no preemption.  (Longest first
    # every round, A ran until it was shorter than B, then the type passed from one gang to the
    # other every round, a restart each time, and C, shortest, waited to the end.)
    table = parse_csv("""job_type,scale_factor,gpu_type,steps_per_second
wide,4,a,1.0
""", "chain2.csv")
    cluster = parse_counts("a=4")
    jobs = [Job(0, "wide", 4, 3600, 0.0), Job(1, "wide", 4, 1800, 0.0),
            Job(2, "wide", 4, 360, 0.0)]
    snap = first_snapshot(jobs, cluster, table)
    first = HadarPolicy().allocate(snap)
    assert sorted(set(first.placement.job.tolist())) == [2]
    assert isinstance(first.policy_state, HadarState) and first.policy_state.chain == (2,)
    result = simulate(jobs, cluster, table, HadarPolicy())
    assert result.finish.tolist() == pytest.approx([3960.0, 5760.0, 360.0])
    assert sum(r.preemptions for r in result.records) == 0


def test_upgrade_idle_moves_whole_jobs_to_faster_idle_gpus_in_queue_order() -> None:
    # Types (fast, slow) with 2 and 4 GPUs; rates per worker 2.0 and 1.0.  Job 0 (1 GPU) runs on
    # slow; job 1, a 2-GPU gang over one GPU of each, is paced by slow; one fast GPU is idle.
    # Job 1 comes first: its own fast GPU and the idle one hold it whole, so it moves (pace 2.0);
    # job 0 then finds no fast GPU free and stays.
    rate = np.array([[2.0, 1.0], [2.0, 1.0]])
    alloc = np.array([[0, 1], [1, 1]])
    capacity = np.array([2, 4])
    sync = np.array([True, True])
    out = upgrade_idle(alloc, alloc, rate, sync, np.array([1, 0]), capacity, 360.0, 0.0)
    assert out.tolist() == [[0, 1], [2, 0]]
    # Both fast GPUs idle and job 0 first: it takes one, and the gang, which needs two, stays.
    alloc = np.array([[0, 1], [0, 2]])
    order = np.array([0, 1])
    out = upgrade_idle(alloc, alloc, rate, sync, order, capacity, 360.0, 0.0)
    assert out.tolist() == [[1, 0], [0, 2]]
    # A move that costs more than it gains this round is not made: 2.0 * (360 - 200) = 320 steps
    # against 1.0 * 360 where it is.  (But a job that has to move anyway, because it held no
    # GPUs, compares both after the move.)
    out = upgrade_idle(alloc, alloc, rate, sync, order, capacity, 360.0, 200.0)
    assert out.tolist() == alloc.tolist()
    out = upgrade_idle(alloc, np.zeros_like(alloc), rate, sync, order, capacity, 360.0, 200.0)
    assert out.tolist() == [[1, 0], [0, 2]]
    # An asynchronous job's workers each go at their own type's rate: 2 + 1 = 3 steps/s over
    # the two types, less than 2 x 2 on fast, so it moves.
    alloc = np.array([[0, 0], [1, 1]])
    out = upgrade_idle(alloc, alloc, rate, np.array([True, False]), order, np.array([3, 4]),
                       360.0, 0.0)
    assert out.tolist() == [[0, 0], [2, 0]]


def test_comparative_advantage_decides_the_type() -> None:
    # One GPU of each type.  Both jobs are fastest on a, but picky loses 10x on b and fair only
    # 10%: picky gets a, fair gets b.  Picky finishes at 3600 s; fair has done 0.9 * 3600 = 3240
    # of its 3600 steps by then and needs 360 s more on a (or 400 s on b): it ends by 4000 s.
    cluster = parse_counts("a=1:b=1")
    jobs = [job(0, "fair", 3600), job(1, "picky", 3600)]
    placed = first_placement_types(jobs, cluster, TWO_TYPES)
    assert placed == {0: "b", 1: "a"}
    result = simulate(jobs, cluster, TWO_TYPES, HadarPolicy())
    assert result.finish[1] == pytest.approx(3600.0)
    assert 3960.0 - 1e-6 <= result.finish[0] <= 4000.0 + 1e-6


def test_equal_jobs_are_not_swapped_between_types() -> None:
    # One GPU of each type; two "fair" jobs of 3600 steps left, job 0 running on a, job 1 on b.
    # Which of the two equal jobs has the fast GPU changes nothing for the makespan or the
    # average JCT, but swapping them costs each a move (60 s of progress).  The type split
    # counts that cost (a running job's work on a type where it holds no GPU also costs
    # ``scale * migration_s`` GPU-seconds), so both stay where they are.  With free moves
    # the split breaks the tie by job order, which swaps them; the decision keeps them anyway:
    # a job may stay on the types it holds, and the dual pass gains nothing by the swap.
    cluster = parse_counts("a=1:b=1")
    snap = first_snapshot([job(0, "fair", 3600), job(1, "fair", 3600)], cluster, TWO_TYPES)
    held = Placement(np.array([0, 1]), np.array([0, 1]), np.array([1, 1]))  # node 0: a
    assert [snap.gpu_types[t] for t in snap.node_type] == ["a", "b"]

    def types(migration_s: float) -> dict[int, str]:
        s = dataclasses.replace(snap, current=held, migration_s=migration_s)
        d = HadarPolicy().allocate(s)
        return {int(j): s.gpu_types[s.node_type[n]]
                for j, n in zip(d.placement.job, d.placement.node, strict=True)}

    def split(migration_s: float) -> dict[int, str]:
        s = dataclasses.replace(snap, current=held, migration_s=migration_s)
        phi = HadarPolicy().split_of(s, s.held())[3]
        return {i: s.gpu_types[int(np.argmax(phi[i]))] for i in range(2)}

    assert split(60.0) == types(60.0) == {0: "a", 1: "b"}
    assert split(0.0) == {0: "b", 1: "a"}
    assert types(0.0) == {0: "a", 1: "b"}


def test_a_job_does_not_hold_a_type_far_slower_for_it_against_the_job_the_split_put_there(
) -> None:
    # One GPU of each type, no move costs.  Job 2 (picky, 1,800 steps) runs on a; job 0
    # (picky, 3,600 steps: 1.0 step/s on a, 0.1 on b) holds b, where it was back-filled while
    # a was busy; job 1 (fair, 3,600 steps: 0.9 step/s on b) waits.  The split puts both picky
    # jobs on a and fair on b.  In the queue (shortest first) job 2 takes a, and job 0 comes
    # before fair, whose start counts in its remaining time.
    # - Job 0 keeping b (it ran there, a type it holds): it does 180 steps by 1,800 s, when
    #   job 2 ends; then job 0 on a ends at 1,800 + 3,420 = 5,220 s and fair on b at 1,800 +
    #   4,000 = 5,800 s.  Average JCT (1,800 + 5,220 + 5,800) / 3 = 4,273 s.
    # - Job 0 waiting for a (b runs it at 0.1 of its pace on a, below ``held_speed``), fair on
    #   b now: fair ends at 4,000 s, job 0 on a from 1,800 s ends at 5,400 s.  Average JCT
    #   (1,800 + 4,000 + 5,400) / 3 = 3,733 s, and the makespan 5,400 s instead of 5,800 s.
    cluster = parse_counts("a=1:b=1")
    snap = first_snapshot([job(0, "picky", 3600), job(1, "fair", 3600), job(2, "picky", 1800)],
                          cluster, TWO_TYPES)
    assert [snap.gpu_types[t] for t in snap.node_type] == ["a", "b"]
    held = Placement(np.array([0, 2]), np.array([1, 0]), np.array([1, 1]))  # 0 on b, 2 on a
    s = dataclasses.replace(snap, current=held)

    def types(policy: HadarPolicy) -> dict[int, str]:
        d = policy.allocate(s)
        return {int(j): s.gpu_types[s.node_type[n]]
                for j, n in zip(d.placement.job, d.placement.node, strict=True)}

    assert types(HadarPolicy()) == {2: "a", 1: "b"}
    # Any held type counted as a near-tie, job 0 keeps b and fair waits.
    assert types(HadarPolicy(held_speed=0.0)) == {2: "a", 0: "b"}


def test_a_held_type_is_a_near_tie_net_of_the_two_moves_leaving_it_takes() -> None:
    # One job holding a GPU of type b (0.1 step/s per GPU), its main type a (1.0), held_speed
    # 0.3.  Moves free: the bar is 0.3 * 1.0 = 0.3 > 0.1, b is dropped.  A move half a
    # round: leaving b costs the job's restart and the start of the job that takes b, so the
    # bar is 0.3 * (1 - 0.5) ** 2 * 1.0 = 0.075 < 0.1, b stays.  A type it holds where it
    # makes no progress never stays; one it does not hold is not added.
    current = np.array([[0, 1], [0, 0]], dtype=np.int64)
    rate = np.array([[1.0, 0.1], [1.0, 0.1]])
    main = np.array([[True, False], [True, False]])
    assert near_tie_held(current, rate, main, 0.3, 0.0, 360.0).tolist() == [
        [False, False], [False, False]]
    assert near_tie_held(current, rate, main, 0.3, 180.0, 360.0).tolist() == [
        [False, True], [False, False]]
    assert near_tie_held(current, np.array([[1.0, 0.0], [1.0, 0.1]]), main, 0.0, 0.0,
                         360.0).tolist() == [[False, False], [False, False]]


def test_a_new_job_displaces_a_running_one_only_if_it_ends_sooner_start_included() -> None:
    # One GPU; job 0 runs with R seconds left, job 1 (360 s) waits; a start or a move costs
    # 60 s.  Keeping job 0: it ends at R, job 1 at R + 60 + 360.  Swapping: job 1 ends at
    # 60 + 360 = 420, job 0 restarts and ends at 420 + 60 + R.  The sum of the two is smaller
    # for keeping when R < 420 (job 1's time, its start included), for swapping when R > 420.
    # With R = 400, plain SRPT (360 < 400) would swap and lose 80 s; with R = 500 it swaps.
    cluster = parse_counts("a=1")
    held = Placement(np.array([0]), np.array([0]), np.array([1]))

    def runs(left: float) -> list[int]:
        snap = first_snapshot([job(0, "fair", left), job(1, "fair", 360)], cluster, TWO_TYPES)
        s = dataclasses.replace(snap, current=held, migration_s=60.0)
        return HadarPolicy().allocate(s).placement.job.tolist()  # type: ignore[no-any-return]

    assert runs(400) == [0]
    assert runs(500) == [1]


def test_ends_this_round_on_the_gpus_a_job_holds() -> None:
    # Types a, b; per-worker rates: job 0 (sync gang of 2 on one a and one b) 4 and 1 steps/s,
    # so 2 * min(4, 1) = 2 steps/s; job 1 (async, 2 on a) 2 * 4 = 8 steps/s; job 2 holds
    # nothing; job 3 holds a GPU where it makes no progress.  Limit 100 s: job 0 ends if it
    # has at most 200 steps left, job 1 at most 800.
    held = np.array([[1, 1], [2, 0], [0, 0], [0, 1]], dtype=np.int64)
    rate = np.array([[4.0, 1.0], [4.0, 1.0], [4.0, 1.0], [4.0, 0.0]])
    sync = np.array([True, False, True, True])
    ends = ends_this_round(np.array([200.0, 800.0, 1.0, 1.0]), held, rate, sync, 100.0)
    assert ends.tolist() == [True, True, False, False]
    ends = ends_this_round(np.array([201.0, 801.0, 1.0, 1.0]), held, rate, sync, 100.0)
    assert ends.tolist() == [False, False, False, False]


def test_shortest_job_first_on_one_gpu() -> None:
    # One GPU, a 3600-step and a 360-step job (1 step/s).  Short first: it ends at 360 s and the
    # long one at 3960 s (average JCT 2160 s); long first would average (3600 + 3960) / 2.
    cluster = parse_counts("a=1")
    jobs = [job(0, "fair", 3600), job(1, "fair", 360)]
    result = simulate(jobs, cluster, TWO_TYPES, HadarPolicy())
    assert result.finish.tolist() == pytest.approx([3960.0, 360.0])
    assert result.avg_jct_s == pytest.approx(2160.0)


def test_long_job_starts_in_time_for_the_makespan() -> None:
    # Two GPUs; one job of 3600 s and three of 1800 s.  The fluid bound is
    # max(total / 2, longest) = max(9000 / 2, 3600) = 4500 s.  Pure shortest-first runs two short
    # jobs, then the third beside the long one, which ends at 1800 + 3600 = 5400 s.  Hadar starts
    # the long job once it can no longer wait (McNaughton: it must fit before the target), so
    # the makespan stays within two rounds of the bound and well under 5400 s.
    cluster = parse_counts("a=2")
    jobs = [job(0, "fair", 3600), job(1, "fair", 1800), job(2, "fair", 1800),
            job(3, "fair", 1800)]
    result = simulate(jobs, cluster, TWO_TYPES, HadarPolicy())
    assert result.num_completed == 4
    assert result.makespan_s <= 4500.0 + 2 * 360.0
    assert result.makespan_s < 5400.0


def test_job_no_type_can_run_is_told_why() -> None:
    cluster = parse_counts("a=1")
    jobs = [job(0, "fair", 360), job(1, "nowhere", 360)]
    snap = first_snapshot(jobs, cluster, TWO_TYPES)
    decision = HadarPolicy().allocate(snap)
    by_id = dict(zip(snap.job_ids.tolist(), decision.reason.tolist(), strict=True))
    assert by_id[0] == Reason.PLACED
    assert by_id[1] == Reason.NO_THROUGHPUT
    assert Reason(by_id[1]).component == "throughputs"


def test_waiting_jobs_carry_a_reason_and_capacity_is_respected() -> None:
    cluster = parse_counts("a=2")
    jobs = [job(i, "fair", 3600 + 100 * i) for i in range(5)]
    snap = first_snapshot(jobs, cluster, TWO_TYPES)
    decision = HadarPolicy().allocate(snap)
    assert int(decision.placement.count.sum()) == 2
    placed = set(decision.placement.job.tolist())
    for j, r in zip(snap.job_ids.tolist(), decision.reason.tolist(), strict=True):
        assert (r == Reason.PLACED) == (j in placed)
        assert Reason(r).text


def test_allocate_is_pure() -> None:
    table = default_table()
    jobs = load_trace("static_48_multigpu_seed1", table)
    snap = first_snapshot(jobs, parse_counts("4:4:4"), table)
    policy = HadarPolicy()
    a = policy.allocate(snap)
    b = policy.allocate(snap)
    assert a.placement.same_as(b.placement)
    assert np.array_equal(a.reason, b.reason)
    assert isinstance(a.policy_state, HadarState) and a.policy_state == b.policy_state


def test_drain_estimate_is_a_lower_bound_near_the_lp() -> None:
    # The Lagrangian bound never exceeds the fluid LP's makespan and comes within 2% of it.
    table = default_table()
    for name in ("static_32_seed0", "static_48_multigpu_seed1"):
        jobs = load_trace(name, table)
        rate = np.array([[table.rate(j.job_type, j.scale_factor, g) for g in ("v100", "p100",
                                                                              "k80")]
                         for j in jobs])
        work = np.array([j.total_steps for j in jobs])
        scale = np.array([j.scale_factor for j in jobs], dtype=np.int64)
        cap = np.array([4, 4, 4], dtype=np.int64)
        lp = fluid_makespan_bound(np.zeros(len(jobs)), work, scale, rate, cap)
        bound, pi = drain_estimate(work, scale, rate, cap)
        assert bound <= lp * (1 + 1e-9)
        assert bound >= lp * 0.98
        assert pi.shape == (3,) and (pi >= 0).all()


# Gavel's max-min fairness (LAS) average JCT on the shared traces (data/gavel/README.md), and
# the makespan Hadar must stay within of the fluid bound: the goals of issue #2.
SHARED = [
    ("static_32_seed0", 20983.0, 1.03),
    ("static_48_multigpu_seed1", 38901.0, 1.03),
    ("poisson_200_lam900_seed0", 16687.0, 1.03),
]


@pytest.mark.parametrize(("trace", "las_jct", "makespan_factor"), SHARED)
def test_quality_on_gavel_traces(trace: str, las_jct: float, makespan_factor: float) -> None:
    table = default_table()
    jobs = load_trace(trace, table)
    cluster = parse_counts("4:4:4")
    result = simulate(jobs, cluster, table, make_policy("hadar"))
    rate = np.array([[table.rate(j.job_type, j.scale_factor, g) for g in cluster.gpu_types]
                     for j in jobs])
    bound = fluid_makespan_bound(
        np.array([j.arrival_s for j in jobs]), np.array([j.total_steps for j in jobs]),
        np.array([j.scale_factor for j in jobs], dtype=np.int64), rate,
        np.array([4, 4, 4], dtype=np.int64))
    assert result.num_completed == len(jobs)
    assert bound <= result.makespan_s <= makespan_factor * bound
    assert result.avg_jct_s <= las_jct


# -- moves must pay (issue #14) -----------------------------------------------------------------

def sim_snapshot(name: str) -> Snapshot:
    """A snapshot the simulator gave Hadar on the fidelity trace (``tests/data/snapshots``)."""
    d = json.loads((SNAPSHOTS / name).read_text())
    s = d["policy_state"]
    return snapshot_from_json(d, HadarState(s["target"], tuple(s["guests"]), tuple(s["chain"])),
                              refill_on_finish=d["refill_on_finish"])


def types_of(snapshot: Snapshot, placement: Placement, job_id: int) -> list[int]:
    """GPUs per type (``snapshot.gpu_types`` order) that ``placement`` gives ``job_id``."""
    out = [0] * len(snapshot.gpu_types)
    for j, n, c in zip(placement.job, placement.node, placement.count, strict=True):
        if j == job_id:
            out[int(snapshot.node_type[n])] += int(c)
    return out


def test_drain_after_round_counts_a_moves_cost_now_and_later() -> None:
    # One 1-GPU job on type a (1 step/s there, 0.5 on b), 1000 steps left, one GPU of each
    # type; rounds of 100 s, a move costs 40 s.  Kept on a: 100 steps this round, 900 left,
    # 900 s on a.  Moved to b: 60 s of the round at 0.5 (30 steps), 970 left; on b it
    # needs 1940 s, or 970 + 40 s back on a (the move's cost again, from b): 1010 s.
    cluster = parse_counts("a=1:b=1")
    table = parse_csv("job_type,scale_factor,gpu_type,steps_per_second\n"
                      "t,1,a,1.0\nt,1,b,0.5\n", "t.csv")
    snap = first_snapshot([job(0, "t", 1000)], cluster, table)
    a = int(np.flatnonzero(snap.node_type == snap.gpu_types.index("a"))[0])
    snap = dataclasses.replace(snap, round_s=100.0, migration_s=40.0,
                   current=Placement(np.array([0]), np.array([a]), np.array([1])))
    cap = snap.capacity()
    ia, ib = snap.gpu_types.index("a"), snap.gpu_types.index("b")
    kept = np.zeros((1, 2), dtype=np.int64)
    kept[0, ia] = 1
    moved = np.zeros((1, 2), dtype=np.int64)
    moved[0, ib] = 1
    # (at any prices: with one job, its time on its fastest type bounds the drain)
    pi = np.array([0.5, 0.5])
    assert drain_after_round(snap, kept, cap, pi) == pytest.approx(900.0)
    assert drain_after_round(snap, moved, cap, pi) == pytest.approx(1010.0)
    # Without a move's cost the job moved is only what the round lost: 950 s.
    free = dataclasses.replace(snap, migration_s=0.0)
    assert drain_after_round(free, moved, cap, pi) == pytest.approx(950.0)
    # The round's work in seconds on the fastest type (a): 100 kept, 30 steps at 1 step/s
    # moved; a job that ends within the round counts only what it had left.
    assert ideal_seconds(snap, kept) == pytest.approx(100.0)
    assert ideal_seconds(snap, moved) == pytest.approx(30.0)
    nearly = dataclasses.replace(snap, remaining=np.array([20.0]))
    assert ideal_seconds(nearly, kept) == pytest.approx(20.0)


def test_drain_at_fixed_prices_compares_two_rounds_by_their_priced_work() -> None:
    # One GPU of type a and one of b; three 1-GPU jobs of 100 steps: x runs at 1 step/s on a
    # and 0.5 on b, y and z at 1 on both.  The fluid drain: x on a (100 s), y and z levelled
    # over both types, 150 s; at the prices (0.5, 0.5) the bound is 50 + 50 + 50 = 150 s,
    # exact, and the fit finds it.  At (0.6, 0.4): x 60, y 40, z 40, 140 s, still a lower
    # bound (the longest job alone is 100 s).
    scale = np.array([1, 1, 1])
    rate = np.array([[1.0, 0.5], [1.0, 1.0], [1.0, 1.0]])
    cap = np.array([1, 1])
    rem = np.array([100.0, 100.0, 100.0])
    assert drain_at(rem, scale, rate, cap, np.array([0.5, 0.5])) == pytest.approx(150.0)
    assert drain_estimate(rem, scale, rate, cap)[0] == pytest.approx(150.0, rel=1e-3)
    assert drain_at(rem, scale, rate, cap, np.array([0.6, 0.4])) == pytest.approx(140.0)
    # A round of 10 s: x on a and y on b leave 90, 90, 100 (140 s at (0.5, 0.5)); x on b
    # and y on a leave 95, 90, 100 (142.5 s).  At one set of prices the two differ by their
    # priced work, 2.5 s, whatever a new fit of each would find.
    pi = np.array([0.5, 0.5])
    assert drain_at(np.array([90.0, 90.0, 100.0]), scale, rate, cap, pi) == pytest.approx(140.0)
    assert drain_at(np.array([95.0, 90.0, 100.0]), scale, rate, cap, pi) == pytest.approx(142.5)
    # The longest job bounds it from below: one job of 1,000 steps alone.
    assert drain_at(np.array([1000.0]), np.array([1]), np.array([[1.0, 0.5]]), cap,
                    pi) == pytest.approx(1000.0)
    # A job no type runs is left out; nothing left drains at once.
    assert drain_at(np.array([5.0]), np.array([1]), np.array([[0.0, 0.0]]), cap, pi) == 0.0


def test_the_copies_of_one_job_restart_together() -> None:
    # HadarE's copies (``pool``): jobs 0 and 1 are two copies of one job; copy 0 runs on
    # type a.  A plan that keeps copy 0 where it is and adds copy 1 on b restarts the job,
    # copy 0 too (the job runs as one set of copies): its round loses the move's 40 s, 60
    # steps of 100.  As two jobs of their own, only the new one starts.
    cluster = parse_counts("a=1:b=1")
    table = parse_csv("job_type,scale_factor,gpu_type,steps_per_second\n"
                      "t,1,a,1.0\nt,1,b,0.5\n", "t.csv")
    snap = first_snapshot([job(0, "t", 500), job(1, "t", 500)], cluster, table)
    a = int(np.flatnonzero(snap.node_type == snap.gpu_types.index("a"))[0])
    snap = dataclasses.replace(snap, round_s=100.0, migration_s=40.0,
                               current=Placement(np.array([0]), np.array([a]), np.array([1])))
    ia, ib = snap.gpu_types.index("a"), snap.gpu_types.index("b")
    both = np.zeros((2, 2), dtype=np.int64)
    both[0, ia] = both[1, ib] = 1
    alone = both.copy()
    alone[1] = 0
    assert restarted(snap, both).tolist() == [False, True]
    assert round_progress(snap, both).tolist() == pytest.approx([100.0, 30.0])
    pooled = dataclasses.replace(snap, pool=np.array([0, 0]))
    assert restarted(pooled, both).tolist() == [True, True]
    assert round_progress(pooled, both).tolist() == pytest.approx([60.0, 30.0])
    # kept as it runs: nothing restarts
    assert restarted(pooled, alone).tolist() == [False, False]


def test_moves_that_gain_less_than_the_margin_are_not_made() -> None:
    # The fidelity trace's fourth epoch in the simulator, where two live runs parted (one
    # moved jobs 7 and 11 between types, the other 5, 11 and 12).  The plan moves jobs 7 and
    # 11 (7 from an A100 to a V100, 11 back): the drain bound after the round is the same
    # (3,326 s) as with both kept, and the round does less work (4,422 s on the jobs'
    # fastest types against 5,020 s), the moves' costs counted: both stay, and say why.
    snap = sim_snapshot("fidelity-hadar-sim-epoch3.json")
    held = {j: types_of(snap, snap.current, j) for j in (7, 11)}
    free = HadarPolicy(move_margin=-1.0).allocate(snap)
    assert all(types_of(snap, free.placement, j) != held[j] for j in (7, 11))
    decision = HadarPolicy().allocate(snap)
    for j in (7, 11):
        assert types_of(snap, decision.placement, j) == held[j]
    assert "kept on its GPUs" in decision.detail[7]
    assert "0.25 of a move's cost (439 s)" in decision.detail[7]


def test_moves_that_pay_are_made() -> None:
    # Epoch 50 of the same run: job 21 from P100s to V100s and job 25 from V100s to A100s
    # drain the workload sooner (a bound of 938 s after the round against 1,330 s, more
    # than a quarter of a move's 439 s), though the round does less work; they are made, as
    # without the rule.
    snap = sim_snapshot("fidelity-hadar-sim-epoch50.json")
    free = HadarPolicy(move_margin=-1.0).allocate(snap)
    decision = HadarPolicy().allocate(snap)
    assert types_of(snap, decision.placement, 21) == [2, 0, 0, 0]
    assert types_of(snap, decision.placement, 25) == [0, 0, 0, 4]
    for j in snap.job_ids.tolist():
        assert types_of(snap, decision.placement, j) == types_of(snap, free.placement, j)
    assert decision.detail == {}
    # A margin of many moves' costs keeps them where they are.
    strict = HadarPolicy(move_margin=50.0).allocate(snap)
    assert types_of(snap, strict.placement, 21) == types_of(snap, snap.current, 21)
    assert types_of(snap, strict.placement, 25) == types_of(snap, snap.current, 25)


def test_a_moves_gain_is_one_sum_so_two_plans_do_not_win_in_turn() -> None:
    # A plan that works 73 s more this round but drains 46 s later, against its reverse, 73 s
    # less for 46 s sooner (a move 7.3 s, margin 1.8 s): either test alone takes both, so two
    # plans can win in turn; as one sum only the first gains.
    margin = 0.25 * 7.3
    assert moves_pay(73.2, -45.7, margin)
    assert not moves_pay(-73.2, 45.7, margin)
    assert moves_pay(-18.3, 64.6, margin)
    assert not moves_pay(18.3, -64.6, margin)
    # The fidelity trace's epochs of the two tests above: 228 s less work for 393 s sooner
    # pays (a move 439 s, margin 110 s); 598 s less work for nothing does not, nor 50 s and
    # 50 s together.
    assert moves_pay(-227.7, 392.7, 109.7)
    assert not moves_pay(-597.9, 0.0, 109.7)
    assert not moves_pay(50.0, 50.0, 109.7)


def test_moves_are_not_weighed_where_they_cost_nothing() -> None:
    # Gavel-style simulation (a move costs nothing): the rule does not apply, the decision is
    # that of the rule switched off.
    snap = dataclasses.replace(sim_snapshot("fidelity-hadar-sim-epoch3.json"), migration_s=0.0)
    a = HadarPolicy().allocate(snap)
    b = HadarPolicy(move_margin=-1.0).allocate(snap)
    assert a.placement.job.tolist() == b.placement.job.tolist()
    assert a.placement.node.tolist() == b.placement.node.tolist()
    assert a.placement.count.tolist() == b.placement.count.tolist()


def test_trial_types_adds_near_tie_types_where_other_jobs_work() -> None:
    # Four types w, x, y, z; per-worker rates of two trials (rows 0, 1) and two jobs that are
    # not (rows 2, 3).  Trial 0's main type is y (2.0); job 2 works on x and z, job 3 on w.
    # x (3.0) is faster and z (1.0) half as fast: both are added at a bar of 0.3 of the main
    # pace; w (0.5, a quarter) is no near-tie.  At a bar of 1.0 only the faster x is added.
    # Trial 1's main type is x, the fastest: z (1/3 of its pace) is added, w (1/6) is not.
    # The jobs that are not trials get nothing.
    main = np.array([[False, False, True, False], [False, True, False, False],
                     [False, True, False, True], [True, False, False, False]])
    rate = np.array([[0.5, 3.0, 2.0, 1.0], [0.5, 3.0, 2.0, 1.0],
                     [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    spread = np.array([True, True, False, False])
    added = trial_types(main, rate, spread, 0.3)
    assert added.tolist() == [[False, True, False, True], [False, False, False, True],
                              [False] * 4, [False] * 4]
    assert trial_types(main, rate, spread, 1.0).tolist() == [
        [False, True, False, False], [False] * 4, [False] * 4, [False] * 4]
    # (a type where the trial does not run is never added, however the others use it)
    rate0 = rate.copy()
    rate0[0, 1] = 0.0
    assert not trial_types(main, rate0, spread, 0.3)[0, 1]
    # (a type no other job's split uses is not added: y, where only trial 0 works)
    assert not trial_types(main, rate, spread, 0.3)[1, 2]
    # (with every job a trial, no type has other jobs' work)
    assert not trial_types(main, rate, np.ones(4, dtype=np.bool_), 0.3).any()


def test_blocked_types_adds_near_ties_where_critical_jobs_leave_no_room() -> None:
    # Two types of four GPUs, a and b; per-worker rates and main types of four jobs.  Job 0 is
    # critical and holds one a-GPU.  Job 1 (4 GPUs, main a) does not fit on a beside it (3 left):
    # b, where it runs at half its a pace (>= 0.3), is added.  Job 2 (1 GPU, main a) fits in the
    # 3 left: nothing.  Job 3 (4 GPUs) holds GPUs already: nothing.  At a bar of 0.6 job 1's b
    # is no near-tie.  Where job 0 is not critical, its GPU does not count: nothing is added.
    main = np.array([[True, False], [True, False], [True, False], [True, False]])
    rate = np.array([[1.0, 0.5], [1.0, 0.5], [1.0, 0.5], [1.0, 0.5]])
    scale = np.array([1, 4, 1, 4])
    current = np.array([[1, 0], [0, 0], [0, 0], [0, 0]])
    current_3 = current.copy()
    current_3[3] = [0, 4]
    critical = np.array([True, False, False, False])
    capacity = np.array([4, 4])
    added = blocked_types(main, rate, scale, current_3, critical, capacity, 0.3)
    assert added.tolist() == [[False, False], [False, True], [False, False], [False, False]]
    assert not blocked_types(main, rate, scale, current, critical, capacity, 0.6).any()
    assert not blocked_types(main, rate, scale, current, np.zeros(4, dtype=np.bool_), capacity,
                             0.3).any()
    # (no room on b either, its GPUs held by critical jobs: nothing to add)
    busy = np.array([[1, 0], [0, 0], [0, 0], [0, 4]])
    assert not blocked_types(main, rate, scale, busy, np.array([True, False, False, True]),
                             capacity, 0.3).any()


def test_a_gang_that_cannot_fit_beside_a_critical_job_runs_on_a_near_tie() -> None:
    # Four 1-GPU nodes of type a and four of b.  "long" (1 GPU, 36,000 s on a, half as fast on
    # b) is the drain target itself and critical; it holds one a-GPU.  "wide" (4 GPUs, 900 s on
    # a, 1,800 s on b) and four "fill" jobs (1 GPU, 5,000 s on b, 0.9 as fast on a).  Capacity
    # does not bind ((36,000 + 4 x 900) / 4 = 9,900 s per a-GPU, the fills 5,000 s on b), so
    # the split gives each job its fastest type: wide's only main type is a, where long leaves
    # it three GPUs until 36,000 s.  Before, it waited while the fills ran on b, and ran on b
    # once they ended: 5,040 + 1,800 = 6,840 s.  Now b, where it runs at half its a pace (a
    # near-tie), is among its types: shortest first, it takes b's four GPUs before the fills
    # (three of which back-fill onto a's idle GPUs, one waits).  In the run, long holds its
    # a-GPU from the second round: wide runs on b from 360 s and ends at 2,160 s, long at
    # 36,000 s as before, and the average JCT falls from 10,473 s to 10,083 s.
    table = parse_csv("""job_type,scale_factor,gpu_type,steps_per_second
long,1,a,1.0
long,1,b,0.5
wide,4,a,4.0
wide,4,b,2.0
fill,1,a,0.9
fill,1,b,1.0
""", "blocked.csv")
    cluster = parse_counts("a=4:b=4")
    jobs = ([Job(0, "long", 1, 36000, 0.0), Job(1, "wide", 4, 3600, 0.0)]
            + [Job(i, "fill", 1, 5000, 0.0) for i in (2, 3, 4, 5)])
    snap = dataclasses.replace(first_snapshot(jobs, cluster, table), current=Placement(
        np.array([0]), np.array([0]), np.array([1])))
    decision = HadarPolicy().allocate(snap)
    on = [snap.gpu_types[snap.node_type[n]]
          for j, n in zip(decision.placement.job, decision.placement.node, strict=True) if j == 1]
    assert on == ["b"] * 4
    result = simulate(jobs, cluster, table, HadarPolicy())
    assert result.finish[1] == pytest.approx(2160.0)
    assert result.finish[0] == pytest.approx(36000.0)
    assert result.avg_jct_s == pytest.approx(10083.33, abs=0.01)


def test_a_trial_is_not_kept_off_a_faster_type_for_other_jobs() -> None:
    # Two GPUs of type a and two of b; four "fair" jobs (1.0 step/s on a, 0.9 on b): jobs 1
    # and 2 of 3,600 steps, jobs 0 and 3 of 1,800.  The target is 3,600 s (a long job alone
    # on a; on b it would take 4,000 s): the split puts both long jobs on a and the short ones
    # on b (2,000 s each).  Made a study's trial (Snapshot.spread), job 3 may also use a:
    # faster for it, and where the split puts work of jobs that are not trials.  In the dual
    # pass job 1 goes first (it cannot wait a round: 3,600 s > the window less 1.5 rounds,
    # 3,060 s) and takes an a-GPU; then the shortest: job 0 on b (its only type) and trial 3 on
    # a, the faster; job 2 takes the b-GPU left.  If all four are trials of one study, no type
    # has other jobs' work and the split stands.  (Run to its end, this trial ends at 1,960 s
    # instead of 2,000 and job 2 at 3,636 s instead of 3,600: the trial's gain is bought with
    # other jobs' time, which bench/studies.py weighs: docs/studies.md.)
    cluster = parse_counts("a=2:b=2")
    jobs = [job(0, "fair", 1800), job(1, "fair", 3600), job(2, "fair", 3600), job(3, "fair", 1800)]
    as_split = first_placement_types(jobs, cluster, TWO_TYPES)
    assert as_split == {0: "b", 1: "a", 2: "a", 3: "b"}
    assert first_placement_types(jobs, cluster, TWO_TYPES, [False, False, False, True]) == {
        0: "b", 1: "a", 2: "b", 3: "a"}
    assert first_placement_types(jobs, cluster, TWO_TYPES, [True] * 4) == as_split


def test_a_trial_with_long_rungs_ahead_cannot_wait_behind_shorter_jobs() -> None:
    # Two a-GPUs; jobs 0, 1 and 2 of 1,000 steps, job 3 of 1,100 (1 step/s): the work drains
    # in 2,050 s, and job 3 can wait a round (1,100 s < 2,050 s less 1.5 rounds).  Shortest
    # first: jobs 0 and 1 run.  Made a study's trial with 10,900 steps of rungs after the one
    # it trains toward (``Snapshot.after``), job 3's path to its study's end is 12,000 s: the
    # workload cannot drain before it (the target is 12,000 s away) and the trial cannot wait
    # a round: it runs, beside job 0.
    jobs = [job(0, "fair", 1000), job(1, "fair", 1000), job(2, "fair", 1000),
            job(3, "fair", 1100)]
    snap = first_snapshot(jobs, parse_counts("a=2"), TWO_TYPES)
    plain = HadarPolicy().allocate(snap)
    assert sorted(plain.placement.by_job_sorted()) == [0, 1]
    assert isinstance(plain.policy_state, HadarState)
    assert plain.policy_state.target == pytest.approx(2050.0)
    with_path = dataclasses.replace(snap, spread=np.array([False, False, False, True]),
                                    after=np.array([0.0, 0.0, 0.0, 10900.0]))
    d = HadarPolicy().allocate(with_path)
    assert sorted(d.placement.by_job_sorted()) == [0, 3]
    assert isinstance(d.policy_state, HadarState)
    assert d.policy_state.target == pytest.approx(12000.0)
    # (the path is the job's time on its split, stretched by the work after it; the longest
    # on the jobs' fastest types bounds the drain)
    path, longest = job_paths(np.array([1000.0, 1200.0]), np.array([1000.0, 1200.0]),
                              np.array([0.0, 10800.0]), np.array([1000.0, 600.0]))
    assert path.tolist() == pytest.approx([1000.0, 12000.0]) and longest == pytest.approx(6000.0)
