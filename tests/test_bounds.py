"""The makespan bounds of ``hadar_slurm.sim.bounds``: the fluid LP, the gang bound and the
configuration LP."""

from __future__ import annotations

import numpy as np
import pytest

from hadar_slurm.model import ClusterSpec, Node
from hadar_slurm.sim.bounds import (
    config_makespan_bound,
    copy_room,
    fluid_makespan_bound,
    fork_makespan_bound,
    gang_makespan_bound,
)

I64 = np.int64


def both(work: list[float], scale: list[int], rate: list[list[float]], capacity: list[int],
         arrival: list[float] | None = None, mixed: bool = True,
         ) -> tuple[float, float, bool]:
    w, s = np.array(work), np.array(scale, dtype=I64)
    r, c = np.array(rate), np.array(capacity, dtype=I64)
    t = np.zeros(len(work)) if arrival is None else np.array(arrival)
    fluid = fluid_makespan_bound(t, w, s, r, c)
    config, exact = config_makespan_bound(w, s, r, c, arrival=t, mixed=mixed)
    return fluid, config, exact


def test_two_gangs_wider_than_half_a_type_never_share_it() -> None:
    # Three GPUs, three 2-GPU jobs of 1 s each.  The fluid LP runs them side by side in
    # fractions (6 GPU-seconds over 3 GPUs: 2 s); two of them never fit at once, so any
    # schedule takes 3 s.
    fluid, config, exact = both([1.0, 1.0, 1.0], [2, 2, 2], [[1.0]] * 3, [3])
    assert fluid == pytest.approx(2.0)
    assert config == pytest.approx(3.0)
    assert exact is True  # a plain bool (bench.exact_bound writes it to JSON)


def test_one_gang_per_type_at_a_time_over_two_types_unless_gangs_mix_types() -> None:
    # Two types of 3 GPUs, the same three 2-GPU jobs of 1 s at the same speed on both.  Each
    # job on one type: at most two run at once (one per type), so 3 job-seconds take 1.5 s.
    # Gangs that mix types (the simulator's synchronous gangs): the third job takes the GPU
    # left on each type, all three run at once, 1 s, as the fluid LP says (the area, and each
    # job's own second).
    fluid, config, exact = both([1.0, 1.0, 1.0], [2, 2, 2], [[1.0, 1.0]] * 3, [3, 3],
                                mixed=False)
    assert fluid == pytest.approx(1.0)
    assert config == pytest.approx(1.5)
    assert exact
    _, mixed, exact = both([1.0, 1.0, 1.0], [2, 2, 2], [[1.0, 1.0]] * 3, [3, 3])
    assert mixed == pytest.approx(1.0)
    assert exact


def test_a_mixed_gang_runs_at_its_slowest_type() -> None:
    # One 2-GPU job of 2 steps, 2 steps/s on type a (1 GPU) and 1 step/s on type b (1 GPU):
    # it fits only across both, at b's pace: 2 s.  The fluid LP runs it as fractions of a
    # type (2 GPUs' worth of a for at most half the time, of b too): 2 * T/2 + 1 * T/2 >= 2,
    # 4/3 s.
    fluid, config, exact = both([2.0], [2], [[2.0, 1.0]], [1, 1])
    assert config == pytest.approx(2.0)
    assert exact
    assert fluid == pytest.approx(4.0 / 3.0)


def test_arrivals_cut_time_and_a_late_gang_waits_for_the_first() -> None:
    # Three GPUs; a 2-GPU job of 1 s at 0 and another at 0.5 s.  They never run together,
    # so the second starts at 1 and ends at 2; the fluid LP shares the GPUs from 0.5 s and
    # ends at 1.5 s (the area of 3 GPU-seconds left over 3 GPUs, and the late job's second).
    fluid, config, exact = both([1.0, 1.0], [2, 2], [[1.0]] * 2, [3], arrival=[0.0, 0.5])
    assert fluid == pytest.approx(1.5)
    assert config == pytest.approx(2.0)
    assert exact
    # merged into one interval (both allowed from 0): a relaxation, still a bound
    w, s, r, c = np.ones(2), np.array([2, 2], dtype=I64), np.ones((2, 1)), np.array([3], I64)
    merged, exact = config_makespan_bound(w, s, r, c, arrival=np.array([0.0, 0.5]),
                                          max_intervals=1)
    assert not exact
    assert merged <= 2.0 + 1e-9


def test_one_gpu_jobs_reach_the_fluid_bound() -> None:
    # Jobs of one GPU each: preemptive scheduling on unrelated machines (Lawler and
    # Labetoulle) reaches the fluid LP, so the two bounds agree.
    rng = np.random.default_rng(3)
    for _ in range(4):
        n = int(rng.integers(3, 9))
        rate = rng.uniform(0.1, 2.0, size=(n, 2))
        fluid, config, exact = both(rng.uniform(1, 10, size=n).tolist(), [1] * n,
                                    rate.tolist(), [2, 1])
        assert exact
        assert config == pytest.approx(fluid, rel=1e-6)


def test_the_configuration_bound_is_never_below_the_fluid_one() -> None:
    rng = np.random.default_rng(11)
    for _ in range(4):
        n = int(rng.integers(4, 10))
        scale = rng.choice([1, 2, 4], size=n).tolist()
        rate = rng.uniform(0.1, 2.0, size=(n, 3))
        fluid, config, exact = both(rng.uniform(1, 10, size=n).tolist(), scale, rate.tolist(),
                                    [4, 4, 4])
        assert exact
        assert config >= fluid * (1 - 1e-6)


def test_a_column_limit_still_gives_a_valid_bound() -> None:
    work, scale = np.array([1.0, 1.0, 1.0]), np.array([2, 2, 2], dtype=I64)
    rate, cap = np.ones((3, 2)), np.array([3, 3], dtype=I64)
    bound, exact = config_makespan_bound(work, scale, rate, cap, mixed=False, max_columns=3)
    assert not exact
    assert 0 <= bound <= 1.5 + 1e-9


def test_a_job_that_fits_nowhere_is_named() -> None:
    with pytest.raises(ValueError, match="job 1 fits on no GPU type"):
        config_makespan_bound(np.array([1.0, 1.0]), np.array([1, 8], dtype=I64),
                              np.ones((2, 1)), np.array([4], dtype=I64))
    assert config_makespan_bound(np.zeros(2), np.array([1, 8], dtype=I64), np.ones((2, 1)),
                                 np.array([4], dtype=I64)) == (0.0, True)


def test_the_exact_bound_bench_on_two_static_traces() -> None:
    # bench.exact_bound on two of seed base 0's static traces (the quick ones), bounds only:
    # the column generation ends exact, and the configuration bound is at least the fluid one.
    from bench.exact_bound import measure

    rows = measure([0], [], only=["gavel/static-1gpu", "five/static-gangs"])
    assert [r["trace"] for r in rows] == ["gavel/static-1gpu", "five/static-gangs"]
    assert all(r["config_exact"] for r in rows)
    assert all(r["config_over_fluid"] >= 1 - 1e-6 for r in rows)


def test_the_exact_bound_bench_with_forks_measures_against_the_fork_bound() -> None:
    # --forks: the fluid side is the fork bound (a third of the gang bound on this one-GPU
    # trace, where every job may run as up to 4 copies), and the configuration LP with copies
    # is at least it, and exact.
    from bench.exact_bound import measure
    from bench.robustness import instance, named, suite

    rows = measure([0], [], only=["gavel/static-1gpu"], forks=True)
    inst = instance(named(suite(0), ["gavel/static-1gpu"])[0])
    assert [r["forks"] for r in rows] == [True]
    assert rows[0]["fluid_bound_s"] == pytest.approx(inst.fork, abs=0.1)
    assert inst.fork < 0.5 * inst.bound
    assert rows[0]["config_exact"]
    assert rows[0]["config_over_fluid"] >= 1 - 1e-6


def fork_both(work: list[float], scale: list[int], rate: list[list[float]],
              nodes: list[tuple[str, int]], copies: int) -> tuple[float, float, bool]:
    """The fork bound's fluid and configuration LPs on a cluster of ``nodes`` (gpu type,
    GPUs), rates per type in the order the types first appear."""
    cluster = ClusterSpec(tuple(Node(f"n{k}", t, g) for k, (t, g) in enumerate(nodes)),
                          tuple(dict.fromkeys(t for t, _ in nodes)))
    w, s, r = np.array(work), np.array(scale, dtype=I64), np.array(rate)
    c = np.array([cluster.capacity(t) for t in cluster.gpu_types], dtype=I64)
    room = copy_room(s, cluster)
    fluid = fork_makespan_bound(np.zeros(len(work)), w, s, r, c, copies=copies, room=room)
    config, exact = config_makespan_bound(w, s, r, c, room=room, copies=copies)
    return fluid, config, exact


def test_fork_bound_copies_fill_the_gpus_a_gang_leaves_and_gangs_still_never_overlap() -> None:
    # Two nodes of 2 GPUs.  A: a 2-GPU job of 4 s (it fits on one node, so it may fork: one
    # copy per node, twice its speed); B: a 4-GPU job of 2 s, which spans both nodes and can
    # never fork.  A and B never run at once (6 GPUs).  Without copies: 4 s + 2 s = 6 s.
    # With two copies A takes 2 s on all four GPUs, then B 2 s: 4 s, and the fluid fork
    # bound (A's 8 GPU-seconds and B's 8 over 4 GPUs) says 4 s too.
    nodes = [("v100", 2), ("v100", 2)]
    fluid, config, exact = fork_both([4.0, 2.0], [2, 4], [[1.0], [1.0]], nodes, copies=2)
    assert config == pytest.approx(4.0)
    assert fluid == pytest.approx(4.0)
    assert exact is True
    # One copy at most: no fork, the plain configuration bound.
    _, one, _ = fork_both([4.0, 2.0], [2, 4], [[1.0], [1.0]], nodes, copies=1)
    assert one == pytest.approx(6.0)


def test_fork_bound_two_gangs_that_cannot_fork_still_take_turns() -> None:
    # Three nodes of 2 GPUs, two 4-GPU jobs of 2 s: neither fits on a node, so neither forks,
    # and two never fit at once (8 GPUs): 4 s.  The fluid fork bound runs them side by side
    # in fractions: 16 GPU-seconds over 6 GPUs, 2.67 s (each job's own 2 s less).
    nodes = [("v100", 2)] * 3
    fluid, config, exact = fork_both([2.0, 2.0], [4, 4], [[1.0], [1.0]], nodes, copies=4)
    assert fluid == pytest.approx(16.0 / 6.0)
    assert config == pytest.approx(4.0)
    assert exact is True


def test_fork_bound_copies_only_on_types_with_room_and_at_their_rates() -> None:
    # A 1-GPU job of 6 s on a v100 (3 s on an a100); a v100 node of 1 GPU and two a100 nodes
    # of 2.  Copies are node-disjoint: room for 1 on the v100s, 2 on the a100s (not 4).  At
    # most 3 copies: 1/6 + 2/3 of its work a second, 1.2 s; capped at 2, the two a100 ones,
    # 1.5 s; at 1, no fork: 3 s.
    nodes = [("v100", 1), ("a100", 2), ("a100", 2)]
    _, config, exact = fork_both([6.0], [1], [[1.0, 2.0]], nodes, copies=3)
    assert config == pytest.approx(6.0 / 5.0)
    assert exact is True
    _, capped, _ = fork_both([6.0], [1], [[1.0, 2.0]], nodes, copies=2)
    assert capped == pytest.approx(1.5)
    _, one, _ = fork_both([6.0], [1], [[1.0, 2.0]], nodes, copies=1)
    assert one == pytest.approx(3.0)


def gang(work: list[float], scale: list[int], rate: list[list[float]], capacity: list[int],
         arrival: list[float] | None = None, sync: list[bool] | None = None) -> float:
    t = np.zeros(len(work)) if arrival is None else np.array(arrival)
    return gang_makespan_bound(t, np.array(work), np.array(scale, dtype=I64), np.array(rate),
                               np.array(capacity, dtype=I64),
                               sync=None if sync is None else np.array(sync))


def test_the_gang_bound_keeps_a_gang_as_wide_as_its_type_apart_from_every_other_job() -> None:
    # One type of 8 GPUs: an 8-GPU gang and a 1-GPU job, 8,000 s each.  The fluid LP runs the
    # gang 7/8 of the time beside the 1-GPU job all the time ((8 * 8,000 + 8,000) / 8 GPUs:
    # 9,000 s); they never fit at once, so any schedule takes 16,000 s, as the exact
    # configuration LP says.
    fluid, config, exact = both([8000.0, 8000.0], [8, 1], [[1.0], [1.0]], [8])
    assert fluid == pytest.approx(9000.0)
    assert exact and config == pytest.approx(16000.0)
    assert gang([8000.0, 8000.0], [8, 1], [[1.0], [1.0]], [8]) == pytest.approx(16000.0)


def test_the_gang_bound_lets_two_of_three_run_where_two_fill_the_type() -> None:
    # 16 GPUs: two 8-GPU gangs and a 1-GPU job of 1,000 s each.  At most two of the three run
    # at once (8 + 8 + 1 > 16): 3,000 job-seconds two at a time, 1,500 s (gangs a and b, a and
    # the job, b and the job, 500 s each).  The fluid LP: 17,000 GPU-seconds over 16 GPUs.
    fluid, config, exact = both([1000.0] * 3, [8, 8, 1], [[1.0]] * 3, [16])
    assert fluid == pytest.approx(1062.5)
    assert exact and config == pytest.approx(1500.0)
    assert gang([1000.0] * 3, [8, 8, 1], [[1.0]] * 3, [16]) == pytest.approx(1500.0)


def test_the_gang_bound_counts_a_gang_spread_over_types_and_asynchronous_jobs() -> None:
    # Type a has 8 GPUs, type b one; an 8-GPU gang as fast on both, and a 1-GPU job that runs
    # on a only, 8,000 s each.  The gang spread over 7 GPUs of a and b's one runs beside the
    # job (the simulator's synchronous gang at its slowest type's pace): 8,000 s, no cut may
    # say otherwise.
    work, rate = [8000.0, 8000.0], [[1.0, 1.0], [1.0, 0.0]]
    fluid, config, exact = both(work, [8, 1], rate, [8, 1])
    assert exact and fluid == pytest.approx(8000.0) and config == pytest.approx(8000.0)
    assert gang(work, [8, 1], rate, [8, 1]) == pytest.approx(8000.0)
    # Type a alone, a 2-GPU type: a 2-GPU job and a 1-GPU job of 1,000 s.  Synchronous, the
    # two never fit at once (2,000 s); an asynchronous job's rate is its GPUs' sum, so it is
    # cut nowhere (the fluid LP's 1,500 s).
    assert gang([1000.0, 1000.0], [2, 1], [[1.0], [1.0]], [2]) == pytest.approx(2000.0)
    assert gang([1000.0, 1000.0], [2, 1], [[1.0], [1.0]], [2],
                sync=[False, True]) == pytest.approx(1500.0)


def test_the_gang_bound_lies_between_the_fluid_and_the_exact_bound() -> None:
    # Random small queues with arrivals, one to three types, gangs of 1 to 8 GPUs that may
    # spread over types: the gang bound is never below the fluid LP, never above the
    # configuration LP where that is exact (the best preemptive schedule), and above the fluid
    # LP on some of them (else the cuts did nothing).
    rng = np.random.default_rng(1)
    tighter = checked = 0
    for _ in range(60):
        num_types = int(rng.integers(1, 4))
        cap = rng.choice([2, 4, 8, 16], size=num_types).astype(I64)
        n = int(rng.integers(2, 6))
        scale = np.minimum(rng.choice([1, 2, 4, 8], size=n), cap.sum()).astype(I64)
        rate = rng.uniform(0.2, 2.0, size=(n, num_types)) * (rng.random((n, num_types)) > 0.2)
        for i in np.nonzero(~(rate > 0).any(axis=1))[0]:
            rate[i, rng.integers(num_types)] = 1.0
        work = rng.uniform(100.0, 2000.0, size=n)
        arrival = np.where(rng.random(n) < 0.5, 0.0, rng.choice([0.0, 300.0, 700.0], size=n))
        try:
            config, exact = config_makespan_bound(work, scale, rate, cap, arrival=arrival)
        except ValueError:  # a job that fits on no type
            with pytest.raises(ValueError, match="fits on no GPU type"):
                gang_makespan_bound(arrival, work, scale, rate, cap)
            continue
        fluid = fluid_makespan_bound(arrival, work, scale, rate, cap)
        bound = gang_makespan_bound(arrival, work, scale, rate, cap)
        assert bound >= fluid * (1 - 1e-6)
        if exact:
            checked += 1
            assert bound <= config * (1 + 1e-6)
        tighter += bound > fluid * (1 + 1e-6)
    assert checked >= 40 and tighter >= 10
