"""Gavel's baselines (``gavel-las``, ``gavel-makespan``): the LPs by hand, the round mechanism
on tiny schedules, purity, and Gavel's published figures on its three traces.

Table (tests/conftest.py): ``toy`` does 1 step/s on a v100 and 0.5 step/s on a k80.
"""

from __future__ import annotations

import numpy as np
import pytest

from hadar_slurm.model import Job
from hadar_slurm.policy import gavel, make_policy
from hadar_slurm.policy.base import Decision, Reason, Snapshot
from hadar_slurm.policy.gavel import (
    GavelPolicy,
    GavelState,
    _bisect_horizon,
    max_min_fairness_lp,
    min_total_duration_lp,
    proportional_throughput,
)
from hadar_slurm.rates.table import ThroughputTable, default_table
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.run import SimResult, simulate
from hadar_slurm.sim.trace import load_trace
from tests.helpers import make_job


def arr(*rows: tuple[float, ...]) -> np.ndarray:
    return np.array(rows, dtype=np.float64)


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# -- max-min fairness LP -------------------------------------------------------------------------


def test_max_min_fairness_two_jobs_two_types() -> None:
    # One v100 and one k80.  Job A: 2 steps/s on v100, 1 on k80; job B: 1 and 1.
    # Equal split (x = 1/2 of each type): p_A = (2 + 1) / 2 = 1.5, p_B = 1.
    # Normalised throughputs: A = (2 a_v + a_k) / 1.5, B = b_v + b_k <= 1 (B's row sum is at
    # most 1), so t* = 1.  Among the allocations with min = 1, B's row must be full
    # (b_v + b_k = 1); A's total 4/3 a_v + 2/3 a_k with a_v <= 1 - b_v, a_k <= b_v is largest at
    # b_v = 0: A gets the whole v100, B the whole k80 (A at 4/3 of its fair share, B at 1).
    rate = arr((2.0, 1.0), (1.0, 1.0))
    cap = ints(1, 1)
    assert proportional_throughput(rate, cap) == pytest.approx([1.5, 1.0])
    x = max_min_fairness_lp(rate, ints(1, 1), np.ones(2), cap)
    assert x == pytest.approx(arr((1.0, 0.0), (0.0, 1.0)), abs=1e-7)
    # Without the tie-break any optimum will do: both at >= 1 and no type over-committed.
    y = max_min_fairness_lp(rate, ints(1, 1), np.ones(2), cap, tie_break="none")
    norm = (rate * y).sum(axis=1) / proportional_throughput(rate, cap)
    assert norm.min() == pytest.approx(1.0, abs=1e-7)
    assert (y.sum(axis=0) <= 1 + 1e-7).all() and (y.sum(axis=1) <= 1 + 1e-7).all()


def test_max_min_fairness_priority_weights() -> None:
    # One GPU, two identical jobs, weights 1 and 2: x_A >= t, x_B / 2 >= t, x_A + x_B <= 1,
    # so 3 t <= 1: t* = 1/3, x_A = 1/3, x_B = 2/3 (the heavier job gets twice the time).
    x = max_min_fairness_lp(arr((1.0,), (1.0,)), ints(1, 1), np.array([1.0, 2.0]), ints(1))
    assert x[:, 0] == pytest.approx([1 / 3, 2 / 3], abs=1e-7)


def test_max_min_fairness_scale_factor() -> None:
    # Two v100s.  A: 1 GPU, 1 step/s; B: 2 GPUs, 2 steps/s (whole job).  p_A = 1, p_B = 2.
    # Normalised with the scale factor: A = 1 * 1 / 1 * x_A, B = 2 * 2 / 2 * x_B = 2 x_B.
    # Capacity x_A + 2 x_B <= 2 and rows <= 1: t* = 1 at x_A = 1, x_B = 1/2 -- the 2-GPU job
    # gets half the time, so both get one GPU's worth of time.
    x = max_min_fairness_lp(arr((1.0,), (2.0,)), ints(1, 2), np.ones(2), ints(2))
    assert x[:, 0] == pytest.approx([1.0, 0.5], abs=1e-7)


def test_max_min_fairness_leaves_out_jobs_no_type_can_run() -> None:
    x = max_min_fairness_lp(arr((1.0, 0.0), (0.0, 0.0)), ints(1, 1), np.ones(2), ints(1, 1))
    assert x[1].tolist() == [0.0, 0.0]
    assert x[0, 0] == pytest.approx(1.0) and x[0, 1] == 0.0


# -- min total duration LP -----------------------------------------------------------------------


def test_bisection_replays_gavels_midpoints() -> None:
    # Feasible iff T >= 400.  Midpoints of [100, 1e6]: 500050, 250075, ... 588.23 (all
    # feasible), 344.12 (no), 466.17 (yes), 405.145263671875 (yes), 374.63 (no), 389.89 (no);
    # then 1.05 * 389.89 = 409.4 >= 405.15 stops it: Gavel keeps T = 405.145263671875.
    assert _bisect_horizon(400.0) == 405.145263671875
    # Nothing in [100, 1e6] is feasible: Gavel retries on [1e6, 1e7].
    t = _bisect_horizon(2e6)
    assert 2e6 <= t <= 2e6 * 1.05


def test_min_total_duration_one_gpu() -> None:
    # One GPU, both jobs 1 step/s, 100 and 300 steps left: x_A >= 100 / T, x_B >= 300 / T,
    # x_A + x_B <= 1, so T* = 400; Gavel's bisection stops at T = 405.145263671875.
    # The fewest GPU-seconds: each job exactly at its pace, x = (100, 300) / T.
    rate = arr((1.0,), (1.0,))
    rem = np.array([100.0, 300.0])
    x, t = min_total_duration_lp(rate, ints(1, 1), rem, ints(1), tie_break="min-gpu")
    assert t == 405.145263671875
    assert x[:, 0] == pytest.approx([100 / t, 300 / t], abs=1e-7)  # shares: 1e-7 steps
    # Gavel's own (constant-objective) LP: any feasible point; check feasibility.
    y, t2 = min_total_duration_lp(rate, ints(1, 1), rem, ints(1))
    assert t2 == t
    assert (y[:, 0] * t >= rem - 1e-4).all() and y.sum() <= 1 + 1e-6


def test_min_total_duration_two_types() -> None:
    # One v100, one k80.  A: 2 steps/s on v100, 1 on k80, 400 steps; B: 1 and 1, 200 steps.
    # A alone on the v100 needs 200 s and no split does better (A's row sum <= 1 and 2 steps/s
    # is its best); B alone on the k80 also needs 200 s: T* = 200, and Gavel settles on
    # _bisect_horizon(200) = 206.80084228515625.
    rate = arr((2.0, 1.0), (1.0, 1.0))
    rem = np.array([400.0, 200.0])
    for tie_break in ("none", "min-gpu"):
        x, t = min_total_duration_lp(rate, ints(1, 1), rem, ints(1, 1), tie_break=tie_break)
        assert t == 206.80084228515625
        assert ((rate * x).sum(axis=1) * t >= rem - 1e-4).all()
        assert (x.sum(axis=0) <= 1 + 1e-6).all() and (x.sum(axis=1) <= 1 + 1e-6).all()


# -- the round mechanism -------------------------------------------------------------------------


class Recorder:
    """Wraps a policy and keeps every (snapshot, decision) pair."""

    def __init__(self, inner: GavelPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.log: list[tuple[Snapshot, Decision]] = []

    def allocate(self, snapshot: Snapshot) -> Decision:
        d = self.inner.allocate(snapshot)
        self.log.append((snapshot, d))
        return d


def run(jobs: list[Job], cluster: str, table: ThroughputTable, objective: str = "las"
        ) -> tuple[SimResult, Recorder, list[SimulatedCluster]]:
    rec = Recorder(GavelPolicy(objective))
    seen: list[SimulatedCluster] = []
    result = simulate(jobs, parse_counts(cluster), table, rec,
                      on_epoch=lambda _r, b: seen.append(b) if not seen else None)
    return result, rec, seen


def test_las_round_robin_on_one_gpu(toy_table: ThroughputTable) -> None:
    # Three 720-step jobs at t = 0 on one v100: shares 1/3 each.  Priority = share / job_time
    # with job_time starting at 180: all equal, lowest id first -> job 0 runs [0, 360); then
    # job 0 has 540 s and jobs 1, 2 go next, [360, 720) and [720, 1080); all tie again and job
    # 0 runs [1080, 1440) and finishes.  Its completion changes the job set; the last
    # recompute was at t = 0, so the allocation is recomputed at once (1/2 each, deficits
    # equal) and jobs 1 and 2 finish in id order at 1800 and 2160.
    jobs = [make_job(i, 720, 0) for i in range(3)]
    r, _, _ = run(jobs, "v100=1", toy_table)
    assert r.finish.tolist() == [1440.0, 1800.0, 2160.0]
    assert r.avg_jct_s == 1800.0


def test_new_job_waits_for_the_next_recompute(toy_table: ThroughputTable) -> None:
    # Two v100s.  Job 0 (10000 steps) arrives at 10: the allocation is computed then (last
    # recompute 10).  Job 1 (1000 steps) arrives at 400 and is admitted at the boundary 730,
    # but the allocation is only recomputed 1920 s after the last one, at the first boundary
    # at or after 1930: 10 + 6 * 360 = 2170.  Until then job 1 has no share; the walk still
    # takes the second v100 for it, which idles.  Job 1 runs [2170, 3170).
    jobs = [make_job(0, 10000, 10), make_job(1, 1000, 400)]
    r, rec, _ = run(jobs, "v100=2", toy_table)
    assert r.finish.tolist() == [10010.0, 3170.0]
    waits = [(s.now, int(d.reason[1])) for s, d in rec.log if s.num_jobs == 2 and s.now < 2170]
    assert [t for t, _ in waits] == [730.0, 1090.0, 1450.0, 1810.0]
    assert all(reason == Reason.AWAITING_ALLOCATION for _, reason in waits)
    states = [d.policy_state for _, d in rec.log]
    assert all(isinstance(st, GavelState) for st in states)
    assert [st.last_reset for st in states if isinstance(st, GavelState)][:7] == [
        10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 2170.0]
    assert Reason.AWAITING_ALLOCATION.component == "gavel.lp"


def test_recompute_at_once_when_nothing_would_run(toy_table: ThroughputTable) -> None:
    # One v100.  Job 0 (360 steps) runs [10, 370).  Job 1 arrives at 1000 into an idle
    # cluster, 990 s after the last recompute: by the 1920 s rule it would have no share and
    # nothing would run (forever: no arrival is left to change that).  Gavel recomputes when
    # nothing runs and nothing is queued; so do we: job 1 runs [1000, 1360).
    jobs = [make_job(0, 360, 10), make_job(1, 360, 1000)]
    r, _, _ = run(jobs, "v100=1", toy_table, "makespan")
    assert r.finish.tolist() == [370.0, 1360.0]
    assert r.makespan_s == 1350.0


def same_decision(a: Decision, b: Decision) -> bool:
    sa, sb = a.policy_state, b.policy_state
    assert isinstance(sa, GavelState) and isinstance(sb, GavelState)
    return (a.placement.by_job_sorted() == b.placement.by_job_sorted()
            and a.reason.tolist() == b.reason.tolist()
            and all(np.array_equal(getattr(sa, f), getattr(sb, f), equal_nan=True)
                    for f in ("job_ids", "in_alloc", "alloc", "base_attained", "deficit"))
            and (sa.need_update, sa.last_reset, sa.recomputes)
            == (sb.need_update, sb.last_reset, sb.recomputes))


@pytest.mark.parametrize("objective", ["las", "makespan"])
def test_allocate_is_pure(objective: str) -> None:
    # Every snapshot of a real run, given again (twice), gives the same decision, and the
    # snapshot (including the state it carries) is left as it was.
    table = default_table()
    jobs = load_trace("static_48_multigpu_seed1", table)[:20]
    _, rec, _ = run(jobs, "4:4:4", table, objective)
    policy = GavelPolicy(objective)
    for snap, decision in rec.log[:: max(1, len(rec.log) // 12)]:
        before = (snap.attained.copy(), snap.remaining.copy(), snap.job_ids.copy())
        first = policy.allocate(snap)
        second = policy.allocate(snap)
        assert same_decision(first, decision) and same_decision(second, decision)
        assert all(np.array_equal(x, y) for x, y in
                   zip(before, (snap.attained, snap.remaining, snap.job_ids), strict=True))


def test_registered() -> None:
    assert make_policy("gavel-las").name == "gavel-las"
    assert make_policy("gavel-makespan").name == "gavel-makespan"
    assert make_policy("fifo-perf").name == "fifo-perf"


def test_fifo_perf_takes_the_fastest_free_type_in_arrival_order_and_blocks() -> None:
    # Types (v100, k80), 2 GPUs each, jobs in id order.  Job 0 (1 GPU) takes a v100, its
    # fastest (free: 1, 2); job 1 (2 GPUs) fits only on the k80s, though faster on v100
    # (1, 0); job 2 can run nowhere and is skipped; job 3 (1 GPU) is faster on k80, but only a
    # v100 is free (0, 0); job 4 fits nowhere and stops the queue, so job 5 waits too.
    rate = np.array([[4.0, 1.0], [8.0, 2.0], [0.0, 0.0], [3.0, 3.5], [2.0, 1.0], [1.0, 1.0]])
    scale = np.array([1, 2, 1, 1, 1, 1])
    x = gavel.fifo_perf_allocation(rate, scale, np.array([2, 2]))
    assert x.tolist() == [[1, 0], [0, 1], [0, 0], [1, 0], [0, 0], [0, 0]]
    # strict FIFO: a 4-GPU job that fits nowhere keeps a 1-GPU job behind it off the free k80s
    x = gavel.fifo_perf_allocation(np.array([[1.0, 0.5], [1.0, 0.5], [1.0, 0.5]]),
                                   np.array([2, 4, 1]), np.array([2, 2]))
    assert x.tolist() == [[1, 0], [0, 0], [0, 0]]


# -- Gavel's published figures ---------------------------------------------------------------------

# Gavel's own (makespan s, average JCT s) on its traces, cluster 4 V100 : 4 P100 : 4 K80,
# as Gavel published them for its simulator (Gavel commit c4fa400):
# max_min_fairness_perf = gavel-las, min_total_duration_perf = gavel-makespan.
GAVEL = {
    ("gavel-las", "static_32_seed0"): (32825, 20983),
    ("gavel-las", "static_48_multigpu_seed1"): (84009, 38901),
    ("gavel-las", "poisson_200_lam900_seed0"): (179523, 16687),
    ("gavel-makespan", "static_32_seed0"): (28485, 27904),
    ("gavel-makespan", "static_48_multigpu_seed1"): (80764, 79182),
    ("gavel-makespan", "poisson_200_lam900_seed0"): (179278, 45584),
    # fifo_perf = fifo-perf (poisson_200: Gavel's figure as issue #15 quotes it)
    ("fifo-perf", "static_32_seed0"): (40711, 21404),
    ("fifo-perf", "poisson_200_lam900_seed0"): (214657, 30736),
}


@pytest.mark.parametrize(("policy", "trace"), sorted(GAVEL))
def test_within_5_percent_of_gavel(policy: str, trace: str) -> None:
    table = default_table()
    jobs = load_trace(trace, table)
    r = simulate(jobs, parse_counts("4:4:4"), table, make_policy(policy))
    makespan, jct = GAVEL[(policy, trace)]
    assert r.num_completed == len(jobs)
    assert r.makespan_s == pytest.approx(makespan, rel=0.05)
    assert r.avg_jct_s == pytest.approx(jct, rel=0.05)
