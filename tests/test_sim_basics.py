"""The simulator on schedules small enough to work out by hand (fifo, 360 s rounds).

Table (tests/conftest.py): ``toy`` does 1 step/s on a v100 and 0.5 step/s on a k80; ``toy2``
is a 2-GPU job doing 2 steps/s (whole job) on two v100s.  Rules (sim/backend.py): rounds of
360 s; a job arriving mid-round is admitted at the next round boundary but its JCT counts from
its arrival; a round ends early when its last running job finishes; with nothing to run, time
jumps to the next arrival.
"""

from __future__ import annotations

import numpy as np
import pytest

from hadar_slurm.model import Job
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Decision, FillsRunning, Placement, Reason, Snapshot
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.run import SimResult, simulate
from tests.helpers import make_job


def run_fifo(jobs: list[Job], cluster: str, table: ThroughputTable) -> SimResult:
    return simulate(jobs, parse_counts(cluster), table, make_policy("fifo"), round_s=360.0)


def finish_times(result: SimResult) -> list[float]:
    return [float(x) for x in result.finish]


def test_one_job_runs_alone(toy_table: ThroughputTable) -> None:
    # 720 steps at 1 step/s on the only v100: rounds [0, 360) and [360, 720); it finishes at
    # 720.  JCT = makespan = 720 s; the GPU was busy all 720 s, so utilization is 1.
    r = run_fifo([make_job(0, 720, 0)], "v100=1", toy_table)
    assert finish_times(r) == [720.0]
    assert r.makespan_s == 720.0
    assert r.avg_jct_s == 720.0 and r.p95_jct_s == 720.0
    assert r.utilization == 1.0
    assert (r.num_jobs, r.num_completed) == (1, 1)
    # Epochs at t = 0, 360 and 720 (the last finds the job done and nothing left).
    assert r.epochs == 3
    assert [(u.start, u.end, u.busy_gpu_s.tolist()) for u in r.usage] == [
        (0.0, 360.0, [360.0]), (360.0, 720.0, [360.0])]
    # Alone on a cluster of one GPU, its finish time is exactly that of its fair share.
    assert r.ftf_mean == pytest.approx(1.0) and r.ftf_max == pytest.approx(1.0)
    assert r.decision_ms_median >= 0


def test_second_job_waits_for_the_gpu_and_jct_counts_from_arrival(
    toy_table: ThroughputTable,
) -> None:
    # Job 0 (720 steps) runs [0, 720).  Job 1 (720 steps) arrives at t=100 and is admitted at
    # the 360 s boundary, but fifo does not preempt: it starts at 720 and ends at 1440.
    # JCTs: 720 and 1440 - 100 = 1340; mean 1030; p95 = 720 + 0.95 * 620 = 1309.
    # Makespan 1440 s from the first arrival; the v100 was busy throughout: utilization 1.
    r = run_fifo([make_job(0, 720, 0), make_job(1, 720, 100)], "v100=1", toy_table)
    assert finish_times(r) == [720.0, 1440.0]
    assert r.jct.tolist() == [720.0, 1340.0]
    assert r.avg_jct_s == 1030.0
    assert r.p95_jct_s == pytest.approx(1309.0)
    assert r.makespan_s == 1440.0
    assert r.utilization == 1.0


def test_job_arriving_mid_round_waits_for_the_next_boundary(toy_table: ThroughputTable) -> None:
    # Two v100s.  Job 0 (720 steps) starts at 0.  Job 1 (360 steps) arrives at t=100 while a
    # v100 is free, but nothing starts mid-round: it is admitted and placed at t=360 and ends at
    # 720.  JCT of job 1 = 720 - 100 = 620; mean JCT (720 + 620) / 2 = 670.
    # Busy GPU-seconds 720 + 360 = 1080 of 2 GPUs x 720 s: utilization 0.75.
    r = run_fifo([make_job(0, 720, 0), make_job(1, 360, 100)], "v100=2", toy_table)
    assert finish_times(r) == [720.0, 720.0]
    assert r.jct.tolist() == [720.0, 620.0]
    assert r.avg_jct_s == 670.0
    assert r.makespan_s == 720.0
    assert r.utilization == 0.75
    assert [(u.start, u.end, u.busy_gpu_s.tolist()) for u in r.usage] == [
        (0.0, 360.0, [360.0]), (360.0, 720.0, [720.0])]


def test_round_ends_when_its_last_job_finishes(toy_table: ThroughputTable) -> None:
    # Job 0 (180 steps) finishes at 180, so the first round is only 180 s long.  Job 1 (360
    # steps, arrived at 100) is admitted at that boundary, t=180, and ends at 540.
    # JCTs 180 and 440; makespan 540; busy 180 + 360 = 540 of 540 GPU-seconds.
    r = run_fifo([make_job(0, 180, 0), make_job(1, 360, 100)], "v100=1", toy_table)
    assert finish_times(r) == [180.0, 540.0]
    assert r.jct.tolist() == [180.0, 440.0]
    assert r.makespan_s == 540.0
    assert r.utilization == 1.0
    assert r.usage[0].start == 0.0 and r.usage[0].end == 180.0


def test_reschedule_on_finish_ends_the_round_at_the_first_finish(
    toy_table: ThroughputTable,
) -> None:
    # Two v100s, three jobs at t=0: job 0 (100 steps) and job 1 (720 steps) run, job 2 (360
    # steps) waits.  Fixed rounds: job 0's GPU idles from 100 to the round's end at 360, job 2
    # runs [360, 720).  reschedule_on_finish: the round ends when job 0 does, at 100, and job 2
    # runs [100, 460); job 1 keeps its GPU (fifo keeps running jobs) and ends at 720 as before.
    jobs = [make_job(0, 100, 0), make_job(1, 720, 0), make_job(2, 360, 0)]
    fixed = run_fifo(jobs, "v100=2", toy_table)
    assert finish_times(fixed) == [100.0, 720.0, 720.0]
    early = simulate(jobs, parse_counts("v100=2"), toy_table, make_policy("fifo"),
                     round_s=360.0, reschedule_on_finish=True)
    assert finish_times(early) == [100.0, 720.0, 460.0]
    assert early.makespan_s == 720.0 and early.avg_jct_s == pytest.approx((100 + 720 + 460) / 3)
    # busy 100 + 720 + 360 = 1180 of 2 x 720 GPU-seconds
    assert early.utilization == pytest.approx(1180 / 1440)
    # (the next full epoch stays due at 360, a round after the last full one)
    assert [(u.start, u.end) for u in early.usage][:3] == [(0.0, 100.0), (100.0, 360.0),
                                                          (360.0, 460.0)]


def test_the_snapshot_says_whether_freed_gpus_go_out_at_once(toy_table: ThroughputTable) -> None:
    # (Snapshot.refill_on_finish: Hadar keeps a job that ends within the round only then)
    jobs = [make_job(0, 100, 0)]
    for refill in (False, True):
        sim = SimulatedCluster(jobs, parse_counts("v100=1"), toy_table,
                               reschedule_on_finish=refill)
        assert sim.snapshot(0, 0.0, 360.0, None).refill_on_finish is refill


def test_idle_gap_jumps_to_the_next_arrival(toy_table: ThroughputTable) -> None:
    # Job 0 runs [0, 100).  Nothing waits until job 1 arrives at 1000; it runs [1000, 1100).
    # Makespan 1100 s; busy 200 GPU-seconds of 1100: utilization 2/11.
    r = run_fifo([make_job(0, 100, 0), make_job(1, 100, 1000)], "v100=1", toy_table)
    assert finish_times(r) == [100.0, 1100.0]
    assert r.jct.tolist() == [100.0, 100.0]
    assert r.makespan_s == 1100.0
    assert r.utilization == pytest.approx(200 / 1100)
    assert all(u.start >= 1000.0 or u.end <= 100.0 for u in r.usage)


def test_makespan_counts_from_the_first_arrival(toy_table: ThroughputTable) -> None:
    # The trace starts at t=500; a 360-step job runs [500, 860): makespan 360, JCT 360.
    r = run_fifo([make_job(0, 360, 500)], "v100=1", toy_table)
    assert finish_times(r) == [860.0]
    assert r.makespan_s == 360.0 and r.avg_jct_s == 360.0


def test_fifo_is_blind_to_speed(toy_table: ThroughputTable) -> None:
    # The k80 comes first in the node list, so fifo puts the job there although the v100 is
    # twice as fast: 720 steps at 0.5 step/s = 1440 s.  Of 2 GPUs x 1440 s only the k80's
    # 1440 s are used: utilization 0.5.
    r = run_fifo([make_job(0, 720, 0)], "k80=1:v100=1", toy_table)
    assert r.makespan_s == 1440.0
    assert r.utilization == 0.5
    assert sum(u.busy_gpu_s[0] for u in r.usage) == 1440.0  # all on the k80 (type 0)
    assert sum(u.busy_gpu_s[1] for u in r.usage) == 0.0


def test_multi_gpu_job_holds_all_its_gpus(toy_table: ThroughputTable) -> None:
    # toy2: 720 steps at 2 steps/s on two v100s = 360 s, holding 2 GPUs: 720 GPU-seconds of
    # 2 x 360: utilization 1.  A 1-GPU toy job arriving with it waits for a free v100 and then
    # runs 360 steps in 360 s: it finishes at 720.
    jobs = [make_job(0, 720, 0, "toy2", scale=2), make_job(1, 360, 0)]
    r = run_fifo(jobs, "v100=2", toy_table)
    assert finish_times(r) == [360.0, 720.0]
    assert r.makespan_s == 720.0
    # Busy: 2 x 360 (job 0) + 360 (job 1) = 1080 of 2 x 720 GPU-seconds.
    assert r.utilization == 0.75


def test_unrunnable_job_does_not_loop_forever(toy_table: ThroughputTable) -> None:
    # "v100only" cannot run on a k80 cluster; the simulator gives up instead of spinning.
    jobs = [make_job(0, 100, 0), make_job(1, 100, 0, "v100only")]
    r = run_fifo(jobs, "k80=1", toy_table)
    assert (r.num_jobs, r.num_completed) == (2, 1)
    assert r.finish[0] == 200.0  # 100 steps at 0.5 step/s
    assert np.isnan(r.finish[1])


def test_row_is_the_json_contract(toy_table: ThroughputTable) -> None:
    r = run_fifo([make_job(0, 720, 0), make_job(1, 720, 100)], "v100=1", toy_table)
    row = r.row()
    assert row["policy"] == "fifo"
    assert row["makespan_s"] == 1440.0
    assert row["avg_jct_s"] == 1030.0
    assert row["utilization"] == 1.0
    assert (row["num_jobs"], row["num_completed"]) == (2, 2)
    assert row["cluster"] == "1 v100 on 1 nodes"


def test_an_arrival_while_gpus_are_free_starts_an_epoch_as_the_sidecar_does(
    toy_table: ThroughputTable,
) -> None:
    # Job 0 runs 720 s on one of two v100s; job 1 arrives at 100.  Fixed rounds (Gavel): it
    # waits for the round at 360.  The sidecar's epochs (reschedule_on_finish): the arrival,
    # with a GPU free, starts an epoch at once (its jobs_arrived wake).
    jobs = [make_job(0, 720, 0), make_job(1, 720, 100)]
    fixed = run_fifo(jobs, "v100=2", toy_table)
    assert finish_times(fixed) == [720.0, 360.0 + 720.0]
    live = simulate(jobs, parse_counts("v100=2"), toy_table, make_policy("fifo"),
                    round_s=360.0, reschedule_on_finish=True)
    assert finish_times(live) == [720.0, 100.0 + 720.0]
    # no GPU free: the arrival waits for the first finish (or the round's end)
    full = simulate(jobs, parse_counts("v100=1"), toy_table, make_policy("fifo"),
                    round_s=360.0, reschedule_on_finish=True)
    assert finish_times(full) == [720.0, 720.0 + 720.0]
    # an idle cluster: the first arrival is the first epoch
    idle = simulate([make_job(0, 720, 50)], parse_counts("v100=1"), toy_table,
                    make_policy("fifo"), round_s=360.0, reschedule_on_finish=True)
    assert finish_times(idle) == [50.0 + 720.0]


class _Reverse:
    """Places the jobs in decreasing id order on nodes 0, 1, 2... (one GPU each), wherever
    they ran: a policy that would move every running job at every epoch."""

    name = "reverse"

    def __init__(self) -> None:
        self.seen: list[tuple[float, list[int], list[int]]] = []

    def allocate(self, snapshot: Snapshot) -> Decision:
        self.seen.append((snapshot.now, sorted(snapshot.job_ids.tolist()),
                          snapshot.node_gpus.tolist()))
        free = [n for n, g in enumerate(snapshot.node_gpus.tolist()) if g > 0]
        order = sorted(snapshot.job_ids.tolist(), reverse=True)[: len(free)]
        n = len(order)
        return Decision(snapshot.epoch, Placement(
            np.array(order, dtype=np.int64), np.array(free[:n], dtype=np.int64),
            np.ones(n, dtype=np.int64)), np.full(snapshot.num_jobs, Reason.PLACED,
                                                 dtype=np.int8))


def test_an_epoch_brought_forward_fills_free_gpus_and_moves_no_running_job(
    toy_table: ThroughputTable,
) -> None:
    # Jobs 3 (100 s), 2 and 1 (1000 s) run on nodes 0, 1, 2 from t=0; job 0 arrives at 50 and
    # waits (no GPU free).  Job 3 ends at 100: the epoch it brings forward sees only job 0 and
    # node 0's GPU, and places it there; jobs 2 and 1 keep theirs (a full re-plan would move
    # both).  The next full epoch, a round after the last (t=360), re-plans all: jobs 2, 1, 0
    # to nodes 0, 1, 2, i.e. three moves.  Each epoch brought forward may start up to
    # wake_delay_s late (the sidecar's poll): the fill comes at 100 + U(0, 20).
    jobs = [make_job(3, 100, 0), make_job(2, 1000, 0), make_job(1, 1000, 0),
            make_job(0, 1000, 50)]
    policy = _Reverse()
    res = simulate(jobs, parse_counts("v100=3"), toy_table, policy, round_s=360.0,
                   reschedule_on_finish=True, wake_delay_s=20.0, seed=1)
    fill = policy.seen[1][0]
    assert 100.0 <= fill < 120.0
    assert policy.seen[:3] == [(0.0, [1, 2, 3], [1, 1, 1]), (fill, [0], [1, 0, 0]),
                               (360.0, [0, 1, 2], [1, 1, 1])]
    assert [(r.start, r.moves) for r in res.records[:3]] == [(0.0, 0), (fill, 0), (360.0, 3)]
    last = [j.job_id for j in sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))].index(0)
    assert res.finish[last] == pytest.approx(fill + 1000.0)  # (job 0 runs from the fill on)


class _ReverseFills(_Reverse):
    """``_Reverse``, which also sees each fill epoch's decision (``FillsRunning``)."""

    name = "reverse-fills"

    def __init__(self) -> None:
        super().__init__()
        self.fills: list[tuple[float, list[tuple[int, int]]]] = []

    def fill_running(self, snapshot: Snapshot, decision: Decision) -> Decision:
        self.fills.append((snapshot.now, sorted(zip(decision.placement.job.tolist(),
                                                    decision.placement.node.tolist(),
                                                    strict=True))))
        return decision


def test_a_policy_that_fills_running_jobs_sees_the_fill_epochs_only(
    toy_table: ThroughputTable,
) -> None:
    # The run above: the loop hands a FillsRunning policy each fill epoch's decision, with the
    # whole snapshot, and never a full epoch's.  At 100, jobs 2 and 1 where they run and job 0
    # on the GPU job 3 freed; the full epochs at 360 and 720 put jobs 2, 1, 0 on nodes 0, 1,
    # 2; jobs 2 and 1 end at 1000 (no cost to move), and that fill has job 0 alone on node 2.
    jobs = [make_job(3, 100, 0), make_job(2, 1000, 0), make_job(1, 1000, 0),
            make_job(0, 1000, 50)]
    policy = _ReverseFills()
    assert isinstance(policy, FillsRunning) and not isinstance(_Reverse(), FillsRunning)
    res = simulate(jobs, parse_counts("v100=3"), toy_table, policy, round_s=360.0,
                   reschedule_on_finish=True)
    fills = [r.start for r in res.records if not r.full]
    assert fills == [100.0, 1000.0]
    assert policy.fills == [(100.0, [(0, 0), (1, 2), (2, 1)]), (1000.0, [(0, 2)])]


class _Fixed:
    """Places each job on the rows given for it, every epoch."""

    name = "fixed"

    def __init__(self, rows: dict[int, list[tuple[int, int]]],
                 later: dict[int, list[tuple[int, int]]] | None = None) -> None:
        self.rows = rows
        self.later = later or rows  # (from epoch 1 on)

    def allocate(self, snapshot: Snapshot) -> Decision:
        job, node, count = [], [], []
        rows = self.rows if snapshot.epoch == 0 else self.later
        for j in snapshot.job_ids.tolist():
            for n, c in rows[j]:
                job.append(j)
                node.append(n)
                count.append(c)
        return Decision(snapshot.epoch, Placement(
            np.array(job, dtype=np.int64), np.array(node, dtype=np.int64),
            np.array(count, dtype=np.int64)),
            np.full(snapshot.num_jobs, Reason.PLACED, dtype=np.int8))


def test_even_gangs_runs_no_job_over_nodes_with_unequal_gpu_counts(
    toy_table: ThroughputTable,
) -> None:
    # toy2 (2 GPUs, 2 steps/s) on node 0 (2 v100s) runs 200 steps in 100 s.  Placed on one GPU
    # of each of nodes 1 and 2 (1 + 1: even) it runs as well.  On nodes 0 and 1 with 1 + 1 it
    # is even too; a 3-GPU placement 2 + 1 is not: with even_gangs the job never starts (one
    # Slurm job asks for one GPU count per node), without it it runs (3 workers: 3 steps/s).
    from hadar_slurm.model import ClusterSpec, Node
    cluster = ClusterSpec((Node("n0", "v100", 2), Node("n1", "v100", 1), Node("n2", "v100", 1)))
    job = [make_job(0, 200, 0, job_type="toy2", scale=2)]
    for rows, even, done in (([(0, 2)], True, 100.0), ([(1, 1), (2, 1)], True, 100.0),
                             ([(0, 1), (1, 1)], True, 100.0),
                             ([(0, 2), (1, 1)], False, 200 / 3),
                             ([(0, 2), (1, 1)], True, None)):
        res = simulate(job, cluster, toy_table, _Fixed({0: rows}), round_s=360.0,
                       even_gangs=even)
        assert (None if np.isnan(res.finish[0]) else float(res.finish[0])) == (
            pytest.approx(done) if done else None), rows
    # running on nodes 1 and 2, moved at 360 to 2 + 1: it stays (280 steps left at 2/s: 500 s);
    # without even_gangs it moves (3/s: 360 + 280 / 3)
    job = [make_job(0, 1000, 0, job_type="toy2", scale=2)]
    for even, done in ((True, 500.0), (False, 360 + 280 / 3)):
        res = simulate(job, cluster, toy_table, _Fixed({0: [(1, 1), (2, 1)]},
                                                       {0: [(0, 2), (1, 1)]}),
                       round_s=360.0, even_gangs=even)
        assert float(res.finish[0]) == pytest.approx(done)
    # and a job the decision moves onto the GPUs the first one kept waits for them: toy job 1
    # (1000 steps at 1/s) runs on node 0, is moved at 360 to node 2 (which job 0 keeps): it
    # stops, and runs again when job 0 has ended (at 500): 360 + 640 s later
    two = [make_job(0, 1000, 0, job_type="toy2", scale=2), make_job(1, 1000, 0)]
    res = simulate(two, cluster, toy_table, _Fixed({0: [(1, 1), (2, 1)], 1: [(0, 1)]},
                                                   {0: [(0, 2), (1, 1)], 1: [(2, 1)]}),
                   round_s=360.0, even_gangs=True)
    assert [float(f) for f in res.finish] == [500.0, 500.0 + 640.0]
    assert [r.preemptions for r in res.records[:2]] == [0, 1]


@pytest.mark.parametrize("policy,settings", [
    ("hadar", {"share": True}), ("hadare", {"share": True}), ("hadare", {"pin_binding": False}),
    ("gavel-las-packed", {}), ("fifo-perf", {}),
])
def test_every_option_combination_completes_every_job(policy: str,
                                                      settings: dict[str, object]) -> None:
    """The simulator's options together (rounds that end on a finish with late wakes, a
    forked job's own run, even gangs, copies over several nodes), with what starts, moves and
    forks cost live: every job completes and the clock never stops (a forked job's own run
    once stalled it, see tests/test_costs.py).  A trace of 14 jobs, 40% of them gangs, on 1-
    and 4-GPU nodes of three types."""
    import itertools

    from hadar_slurm.costs import LiveCosts
    from hadar_slurm.rates.table import default_table
    from hadar_slurm.sim.cluster import load_cluster
    from hadar_slurm.sim.generate import WorkloadSpec, generate

    table = default_table()
    cluster = load_cluster("v100=1x4:p100=1x4:k80=2x2")
    jobs = generate(WorkloadSpec(seed=7, jobs=14, arrivals="bursty", load=1.0, multi_gpu=0.4,
                                 scales=(2, 4)), cluster, table)
    live = LiveCosts()
    for resched, final, even, multi in itertools.product((False, True), repeat=4):
        res = simulate(jobs, cluster, table, make_policy(policy, **settings),
                       migration_cost_s=live.move_s, start_cost_s=live.start_s,
                       fork_start_s=live.fork_start_s, fork_interval_s=live.fork_interval_s,
                       reschedule_on_finish=resched, wake_delay_s=15.0 if resched else 0.0,
                       final_run=final, even_gangs=even, multi_node_copies=multi, seed=3)
        assert res.num_completed == res.num_jobs == 14, (resched, final, even, multi)
        assert np.isfinite(res.makespan_s) and res.makespan_s > 0
