"""Hadar with GPU sharing (issue #16): a waiting job joins a placed one on its GPUs where the
pair's normalised throughput beats taking turns and the two jobs' completion times gain
(:mod:`hadar_slurm.policy.sharing`), only where the simulator offers sharing.

The tables here (Gavel's format) are small enough to work by hand: on a v100, ``x`` and ``y``
do 1 step/s alone; sharing, each keeps 0.8 of that (``good``) or 0.4 (``poor``); ``a`` (2 steps/s)
and ``b`` (1 step/s) keep 1.5 and 0.5; ``c`` may share with nobody.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from hadar_slurm.loop import fill_decision, fill_snapshot
from hadar_slurm.model import ClusterSpec, Node
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import (
    Decision,
    IntArray,
    Placement,
    Reason,
    Snapshot,
    gpus_in_use,
)
from hadar_slurm.policy.hadar import HadarPolicy, HadarState, arrivals_forecast
from hadar_slurm.policy.hadare import HadarEPolicy, HadarEState
from hadar_slurm.policy.sharing import pack_waiting, pair_gain, shared_finish, waiting_starts
from hadar_slurm.rates.table import ThroughputTable, default_table, parse_gavel_json
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.cluster import load_cluster, parse_counts
from hadar_slurm.sim.run import SimResult, simulate
from hadar_slurm.sim.trace import load_trace
from tests.helpers import make_job


def table_with(co: float) -> ThroughputTable:
    """``x`` and ``y`` at 1 step/s alone, ``co`` each while they share (also ``x`` with
    ``x``); ``a``/``b`` as in tests/test_packing.py; ``c`` shares with nobody."""
    pair = [co, co]
    return parse_gavel_json(json.dumps({"v100": {
        "('x', 1)": {"null": 1.0, "('y', 1)": pair, "('x', 1)": pair, "('c', 1)": [0, 0]},
        "('y', 1)": {"null": 1.0, "('x', 1)": pair, "('c', 1)": [0, 0]},
        "('a', 1)": {"null": 2.0, "('b', 1)": [1.5, 0.5]},
        "('b', 1)": {"null": 1.0, "('a', 1)": [0.5, 1.5]},
        "('c', 1)": {"null": 1.0, "('x', 1)": [0, 0], "('y', 1)": [0, 0]},
    }}), "pairs.json")


def hadar(share: bool = True) -> HadarPolicy:
    return HadarPolicy(share=share)


# -- the rule, worked by hand -----------------------------------------------------------------


def test_pair_gain_by_hand() -> None:
    # Two jobs of 720 s alone, 0.8 of their speed each while they share: together both end
    # at 900; one after the other at 720 and 1440.  A - B = (720 - 900) + (1440 - 900) = 360.
    assert shared_finish(720.0, 720.0, 0.8, 0.8) == pytest.approx((900.0, 900.0))
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0) == pytest.approx(360.0)
    # b (360 s, keeps 0.5) before a (450 s, keeps 0.75): a ends first, at 600; b has done
    # 300 s of its work by then and ends at 660.  A - B = (360 - 660) + (810 - 600) = -90.
    assert shared_finish(360.0, 450.0, 0.5, 0.75) == pytest.approx((660.0, 600.0))
    assert pair_gain(360.0, 450.0, 0.5, 0.75, 1.0, 1.0) == pytest.approx(-90.0)
    # ... unless jobs wait behind both: each starts 1440 - 900 = 540 s earlier, times their
    # weight (here 1): the pair of equal jobs gains 360 + 540.
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, behind=1.0) == pytest.approx(900.0)
    # weights count: job 1 weighted 2 loses 2 x 180, job 2 gains 540
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 2.0, 1.0) == pytest.approx(180.0)


def test_pair_gain_counts_when_the_guest_would_start_apart() -> None:
    # The pair of equal 720 s jobs above, but apart the second starts at 100 (GPUs another job
    # frees), not at 720: it ends at 820 instead of 1440.  A - B = (720 - 900) + (820 - 900) =
    # -260: the pair does not pay.  Starting at 720 (the host's end) is the default's 360.
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, wait=100.0) == pytest.approx(-260.0)
    # Jobs behind it (weight 1): apart, the guest takes the GPUs freed at 100 from them, so
    # the two hold GPUs 1440 s in all; together 900 s: 540 more, 280.
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, behind=1.0,
                     wait=100.0) == pytest.approx(280.0)
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, wait=720.0) == pytest.approx(360.0)
    # A guest that would start only at 1080 apart (the round's end after the host's): it ends
    # at 1800; A - B = (720 - 900) + (1800 - 900) = 720.  With jobs behind both (weight 1):
    # they start at 1800 apart, at 900 together: 900 more, 1620.
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, wait=1080.0) == pytest.approx(720.0)
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, behind=1.0,
                     wait=1080.0) == pytest.approx(1620.0)


def test_waiting_starts_serves_the_jobs_ahead_first() -> None:
    # Three v100s running jobs that end in 100, 300 and 720 s (1 step/s); jobs 3 and 4 wait.
    # The first of them in the queue order gets the GPU freed at 100, the second the one
    # freed at 300.
    jobs = [make_job(0, 100, 0, "x"), make_job(1, 300, 0, "x"), make_job(2, 720, 0, "x"),
            make_job(3, 720, 0, "y"), make_job(4, 720, 0, "y")]
    snap = SimulatedCluster(jobs, parse_counts("v100=3"), table_with(0.8)).snapshot(
        0, 0.0, 360.0, None)
    placed = Placement(np.array([0, 1, 2]), np.array([0, 1, 2]), np.array([1, 1, 1]))
    ran = np.array([True, True, True, False, False])
    starts = waiting_starts(snap, placed, np.arange(5, dtype=np.int64), ran)
    assert (starts[3, 0], starts[4, 0]) == (100.0, 300.0)
    starts = waiting_starts(snap, placed, np.array([0, 1, 2, 4, 3], dtype=np.int64), ran)
    assert (starts[3, 0], starts[4, 0]) == (300.0, 100.0)


def test_a_guest_joins_the_host_whose_end_it_would_wait_for() -> None:
    # Two v100s: x0 ends in 100 s, x1 in 720 s; y (720 s) waits.  Apart, y would start when
    # x0 ends, at 100, and end at 820.  Joining x1 (0.8 each) ends both at 900: A - B =
    # (720 - 900) + (820 - 900) = -260.  Joining x0 ends x0 at 125 and y at 745: (100 - 125)
    # + (820 - 745) = 50.  y joins x0.  (Counted as one after the other on the host's GPUs,
    # as before, y would have joined x1: 720 + 720 = 1440 apart, a gain of 360.)
    jobs = [make_job(0, 100, 0, "x"), make_job(1, 720, 0, "x"), make_job(2, 720, 0, "y")]
    snap = SimulatedCluster(jobs, parse_counts("v100=2"), table_with(0.8)).snapshot(
        0, 0.0, 360.0, None)
    placed = Placement(np.array([0, 1]), np.array([0, 1]), np.array([1, 1]))
    _p, pairs, _g, _d = pack_waiting(snap, placed, np.array([0, 1, 2], dtype=np.int64))
    assert pairs == ((0, 2),)
    # With x0 gone (a 1-GPU cluster of x1 alone), y would wait for x1's end: it joins x1.
    alone = SimulatedCluster(jobs[1:], parse_counts("v100=1"), table_with(0.8)).snapshot(
        0, 0.0, 360.0, None)
    _p, pairs, _g, _d = pack_waiting(alone, Placement(np.array([1]), np.array([0]),
                                                      np.array([1])),
                                     np.array([0, 1], dtype=np.int64))
    assert pairs == ((1, 2),)


def test_pair_gain_counts_a_guest_that_would_end_sooner_elsewhere() -> None:
    # The equal 720 s pair, the guest starting apart at the host's end (A - B = 360), but on
    # GPUs of another type it would end at 460 (from now) apart: A - B = (720 - 900) + (460 -
    # 900) = -620.  Ending there only at 1500, after 1440 on the host's GPUs, changes nothing.
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, wait=720.0,
                     elsewhere=460.0) == pytest.approx(-620.0)
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, wait=720.0,
                     elsewhere=1500.0) == pytest.approx(360.0)
    # Jobs behind (weight 1) gain the GPU time the pair saves.  Apart, the guest's run
    # elsewhere takes GPUs that a job behind does not get, at most until it ends there (460):
    # the two hold GPUs 720 + 460 = 1180 s; together 900 s.  So 280 more, -340: the pair
    # still does not pay.  (Until 2026-12-07 they got the host's GPUs at 720 apart, the GPUs
    # the guest took elsewhere not counted: -800.)
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, behind=1.0, wait=720.0,
                     elsewhere=460.0) == pytest.approx(-340.0)
    # With three times the weight behind, 3 x 280 outweighs the two jobs' 620: 220.
    assert pair_gain(720.0, 720.0, 0.8, 0.8, 1.0, 1.0, behind=3.0, wait=720.0,
                     elsewhere=460.0) == pytest.approx(220.0)


def two_types(y_p100: float) -> ThroughputTable:
    """``x`` and ``y`` as in :func:`table_with` (0.8) on a v100; on a p100 ``x`` at 1 step/s,
    ``y`` at ``y_p100``, and the two may not share there."""
    pair = [0.8, 0.8]
    return parse_gavel_json(json.dumps({
        "v100": {"('x', 1)": {"null": 1.0, "('y', 1)": pair},
                 "('y', 1)": {"null": 1.0, "('x', 1)": pair}},
        "p100": {"('x', 1)": {"null": 1.0, "('y', 1)": [0, 0]},
                 "('y', 1)": {"null": y_p100, "('x', 1)": [0, 0]}},
    }), "pairs.json")


def y_beside_two_hosts(y_p100: float) -> tuple[Snapshot, Placement, IntArray]:
    """``(snapshot, placement, order)``: a v100 and a p100 at t = 0, x0 (720 s) placed on the
    v100, x1 (100 s) on the p100, y (720 steps, ``y_p100`` steps/s on the p100) waiting
    last in the queue order (:func:`two_types`)."""
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 100, 0, "x"), make_job(2, 720, 0, "y")]
    snap = SimulatedCluster(jobs, parse_counts("v100=1:p100=1"),
                            two_types(y_p100)).snapshot(0, 0.0, 360.0, None)
    placed = Placement(np.array([0, 1]), np.array([0, 1]), np.array([1, 1]))
    return snap, placed, np.array([0, 1, 2], dtype=np.int64)


def test_a_guest_that_would_end_sooner_on_other_gpus_does_not_join() -> None:
    # A v100 and a p100: x0 (720 s) on the v100, x1 (100 s) on the p100; y (720 steps)
    # waits.  Joining x0 gains 360 if y would otherwise wait for x0's end (above).  But y does
    # 2 steps/s on the p100: apart it starts there when x1 ends, at 100, and ends at 460, so
    # the pair loses 620 and y does not join.  At 0.5 step/s on the p100 it would end there
    # at 1540, after 1440: y joins x0 as before.
    for y_p100, want in ((2.0, ()), (0.5, ((0, 2),))):
        snap, placed, order = y_beside_two_hosts(y_p100)
        _p, pairs, _g, _d = pack_waiting(snap, placed, order)
        assert pairs == want, y_p100


def test_jobs_forecast_to_arrive_count_behind_the_guest() -> None:
    # The case above where y would end sooner on the p100 (the pair loses 620): no job waits
    # behind y, but jobs forecast to arrive (``arriving``, weight per GPU) gain the 280 s of
    # GPU time the pair saves (pair_gain above).  At 1.5 per GPU: -620 + 420 < 0, no pair;
    # at 3: -620 + 840 = 220 > 0, y joins x0.
    snap, placed, order = y_beside_two_hosts(2.0)
    assert snap.migration_s == 0.0
    for arriving, want in ((0.0, ()), (1.5, ()), (3.0, ((0, 2),))):
        _p, pairs, _g, _d = pack_waiting(snap, placed, order, arriving=arriving)
        assert pairs == want, arriving


# -- scenarios in the simulator ----------------------------------------------------------------


def test_a_pair_that_beats_taking_turns_is_packed_and_both_end_when_worked_out() -> None:
    # One v100; x (720 steps) and y (720 steps), 1 step/s alone, 0.8 each together.  Hadar
    # places x (the id breaks the tie), y waits and joins it (gain 360 s, above).
    # [0, 360): 288 steps each, 432 left; [360, 720): again, 144 left; then 144 / 0.8 = 180 s:
    # both end at 900.  Without sharing: 720 and 1440.
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    r = simulate(jobs, parse_counts("v100=1"), table_with(0.8), hadar())
    assert r.finish.tolist() == pytest.approx([900.0, 900.0])
    assert [pairs for _t, pairs in r.packed] == [((0, 1),)] * 3
    alone = simulate(jobs, parse_counts("v100=1"), table_with(0.8), hadar(share=False))
    assert alone.finish.tolist() == [720.0, 1440.0] and alone.packed == []


def test_a_pair_that_does_not_beat_taking_turns_is_not_packed() -> None:
    # 0.4 + 0.4 <= 1: the pair does less than one job alone; the jobs take turns.
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    r = simulate(jobs, parse_counts("v100=1"), table_with(0.4), hadar())
    assert r.finish.tolist() == [720.0, 1440.0] and r.packed == []


def test_a_pair_that_beats_turns_but_delays_the_queue_is_not_packed() -> None:
    # a (900 steps: 450 s) and b (360 steps: 360 s): 0.75 + 0.5 > 1, but b goes first and
    # sharing would end them at 660 and 600 instead of 360 and 810 (A - B = -90, above):
    # not packed.  b ends at 360, a runs 360 to 810.
    jobs = [make_job(0, 900, 0, "a"), make_job(1, 360, 0, "b")]
    r = simulate(jobs, parse_counts("v100=1"), table_with(0.8), hadar())
    assert r.finish.tolist() == [810.0, 360.0] and r.packed == []


def test_a_forbidden_pair_is_never_packed() -> None:
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "c"), make_job(2, 720, 0, "y")]
    r = simulate(jobs, parse_counts("v100=1"), table_with(0.8), hadar())
    pairs = {p for _t, ps in r.packed for p in ps}
    assert pairs and all(1 not in p for p in pairs)


def test_two_gpu_jobs_share_both_their_gpus() -> None:
    # One node of two v100s; 2-GPU jobs a2 (1080 steps at 4/s: 270 s) and b2 (540 at 2/s:
    # 270 s), 3 and 1.5 steps/s together (0.75 each).  One after the other: 270 and 540;
    # together both end at 360 (A - B = 810 - 720 = 90): packed on the same two GPUs.
    table = parse_gavel_json(json.dumps({"v100": {
        "('a2', 2)": {"null": 4.0, "('b2', 2)": [3.0, 1.5]},
        "('b2', 2)": {"null": 2.0, "('a2', 2)": [1.5, 3.0]}}}), "multi.json")
    jobs = [make_job(0, 1080, 0, "a2", scale=2), make_job(1, 540, 0, "b2", scale=2)]
    log: list[tuple[Snapshot, Decision]] = []

    class Logged(HadarPolicy):
        def allocate(self, snapshot: Snapshot) -> Decision:
            d = super().allocate(snapshot)
            log.append((snapshot, d))
            return d

    r = simulate(jobs, parse_counts("v100=1x2"), table, Logged(share=True))
    assert r.finish.tolist() == [360.0, 360.0]
    first = log[0][1]
    assert first.packed == ((0, 1),)
    assert first.placement.by_job_sorted() == {0: [(0, 2)], 1: [(0, 2)]}
    assert first.reason.tolist() == [Reason.PLACED, Reason.PLACED]
    alone = simulate(jobs, parse_counts("v100=1x2"), table, hadar(share=False))
    assert alone.finish.tolist() == [270.0, 540.0]


def test_a_job_that_may_not_share_is_never_paired() -> None:
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    sim = SimulatedCluster(jobs, parse_counts("v100=1"), table_with(0.8))
    snap = sim.snapshot(0, 0.0, 360.0, None)
    assert hadar().allocate(snap).packed == ((0, 1),)
    for mask in ([True, False], [False, True]):
        d = hadar().allocate(dataclasses.replace(snap, may_share=np.array(mask)))
        assert d.packed == () and d.placement.by_job_sorted() == {0: [(0, 1)]}
        assert d.reason.tolist() == [Reason.PLACED, Reason.PRICED_OUT]


def test_a_guest_joins_only_where_the_node_has_a_cpu_for_it() -> None:
    # One v100 node: x is placed there this epoch and y would join it (as above).  The node's
    # free CPUs must cover both: with 1 free, y waits; with 2, the pair forms; with 2 free and
    # y asking 2 CPUs, y waits again.  A pair that ran last epoch forms again whatever the
    # CPUs (both hold theirs already).
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    sim = SimulatedCluster(jobs, parse_counts("v100=1"), table_with(0.8))
    snap = sim.snapshot(0, 0.0, 360.0, None)
    for free, cpus, packed in ((1, None, ()), (2, None, ((0, 1),)), (2, [1, 2], ()),
                               (3, [1, 2], ((0, 1),))):
        d = hadar().allocate(dataclasses.replace(
            snap, node_free_cpus=np.array([free]),
            cpus=None if cpus is None else np.array(cpus)))
        assert d.packed == packed, (free, cpus)
        if not packed:
            assert d.placement.by_job_sorted() == {0: [(0, 1)]}
            assert d.detail[1] == (
                f"would share a GPU with job 0 on {snap.node_names[0]}, but the node has "
                f"{free - 1} free CPU(s) for the {1 if cpus is None else 2} it asks, this "
                "epoch's placements counted")
    ran = dataclasses.replace(snap, node_free_cpus=np.array([0]), packed=((0, 1),),
                              current=Placement(np.array([0, 1]), np.array([0, 0]),
                                                np.array([1, 1])))
    assert hadar().allocate(ran).packed == ((0, 1),)


def test_without_sharing_offered_hadar_decides_as_without_the_setting() -> None:
    # Gavel's table has pairs; where the simulator does not offer them (or the setting is
    # off) every decision is the one Hadar made before sharing existed (share=False).
    table = default_table()
    jobs = load_trace("static_48_multigpu_seed1", table)[:14]
    cluster = parse_counts("4:4:4")
    runs = [simulate(jobs, cluster, table, make_policy(p, share=s), gpu_sharing=g)
            for p in ("hadar", "hadare") for s, g in ((True, False), (False, True),
                                                     (False, False))]
    for k in (0, 3):
        want = runs[k + 2]
        for r in runs[k: k + 2]:
            assert r.finish.tolist() == want.finish.tolist() and r.packed == []
    # and with sharing offered, the decisions differ (the setting does something)
    shared = simulate(jobs, cluster, table, make_policy("hadar", share=True))
    assert shared.packed != []
    # (off by default)
    default = simulate(jobs, cluster, table, make_policy("hadar"))
    assert default.finish.tolist() == runs[2].finish.tolist() and default.packed == []
    sim = SimulatedCluster(jobs, cluster, table, gpu_sharing=False)
    snap = sim.snapshot(0, 0.0, 360.0, None)
    a, b = hadar().allocate(snap), hadar(share=False).allocate(snap)
    assert a.placement.by_job_sorted() == b.placement.by_job_sorted()
    assert a.reason.tolist() == b.reason.tolist() and a.policy_state == b.policy_state
    assert a.packed == () and a.detail == b.detail


def test_hadar_packed_decisions_keep_the_contract_and_are_pure() -> None:
    table = default_table()
    jobs = load_trace("static_32_seed0", table)[:20]
    log: list[tuple[Snapshot, Decision]] = []

    class Logged(HadarPolicy):
        def allocate(self, snapshot: Snapshot) -> Decision:
            d = super().allocate(snapshot)
            log.append((snapshot, d))
            return d

    r = simulate(jobs, parse_counts("4:4:4"), table, Logged(share=True))
    assert r.num_completed == 20 and r.packed_jobs > 0
    for snap, d in log:
        rows = d.placement.by_job_sorted()
        for a, b in d.packed:
            assert a < b and rows[a] == rows[b]
            ia, ib = (int(np.nonzero(snap.job_ids == j)[0][0]) for j in (a, b))
            assert snap.scale[ia] == snap.scale[ib]
            h = int(snap.node_type[rows[a][0][0]])
            assert snap.colocated is not None
            ra, rb = snap.colocated.pair_rate(snap.job_types[ia], snap.job_types[ib],
                                              int(snap.scale[ia]), snap.gpu_types[h])
            # the pair beats taking turns on that type
            assert ra / snap.rate[ia, h] + rb / snap.rate[ib, h] > 1.0
        assert (gpus_in_use(d.placement, d.packed, snap.node_gpus.shape[0])
                <= snap.node_gpus).all()
        placed = set(d.placement.job.tolist())
        for j, code in zip(snap.job_ids.tolist(), d.reason.tolist(), strict=True):
            assert (code == Reason.PLACED) == (j in placed)
    for snap, d in log[::5]:
        again = HadarPolicy(share=True).allocate(snap)
        assert again.placement.by_job_sorted() == d.placement.by_job_sorted()
        assert again.packed == d.packed and again.reason.tolist() == d.reason.tolist()


# -- epochs that only fill free GPUs (reschedule_on_finish) ----------------------------------


def test_pairs_with_reschedule_on_finish() -> None:
    # One v100; x (360 steps) and y (720), 0.8 each together.  x goes first (360 s < 720 s);
    # together x ends at 450 and y at 810 (A - B = 1440 - 1260 = 180): packed.
    # [0, 360): 288 each (72 and 432 left).  At 360 they pair again (x 72 s, y 432 s:
    # together 90 and 450, apart 72 and 504: A - B = 36); x ends at 450.
    # Fixed rounds: y keeps its co-located rate to 720 (288 more, 144 left), then alone:
    # ends at 864.  Ending on finish: the epoch at 450 only fills; y keeps its GPU and runs
    # alone from there (432 - 72 = 360 left): ends at 810.
    jobs = [make_job(0, 360, 0, "x"), make_job(1, 720, 0, "y")]
    fixed = simulate(jobs, parse_counts("v100=1"), table_with(0.8), hadar())
    assert fixed.finish.tolist() == pytest.approx([450.0, 864.0])
    ends = simulate(jobs, parse_counts("v100=1"), table_with(0.8), hadar(),
                    reschedule_on_finish=True)
    assert ends.finish.tolist() == pytest.approx([450.0, 810.0])
    assert [p for _t, p in ends.packed] == [((0, 1),), ((0, 1),)]


TWO_NODES = ClusterSpec((Node("n0", "v100", 2), Node("n1", "v100", 1)), ("v100",))


def fill_case(first: int = 0) -> Snapshot:
    """Two nodes (two v100s, one v100), at t = 100; job 1 (y, 720 steps) shares a GPU of node
    0 with job 0 (x), which has ended where ``first`` is 1; jobs 2 (x, 100 steps), 3 (y, 720)
    and 4 (x, 720) wait."""
    jobs = [make_job(k, steps, 0, t) for k, (t, steps) in
            enumerate((("x", 720), ("y", 720), ("x", 100), ("y", 720), ("x", 720)))][first:]
    sim = SimulatedCluster(jobs, TWO_NODES, table_with(0.8), reschedule_on_finish=True)
    snap = sim.snapshot(0, 100.0, 360.0, None)
    held = [0, 1][first:]
    return dataclasses.replace(
        snap, current=Placement(np.array(held), np.zeros(len(held), dtype=np.int64),
                                np.ones(len(held), dtype=np.int64)),
        packed=((0, 1),))


def test_a_fill_keeps_running_pairs_and_packs_new_ones_on_free_gpus() -> None:
    snap = fill_case()
    assert snap.colocated is not None  # (offered with reschedule_on_finish now)
    sub, holds = fill_snapshot(snap)
    assert holds.tolist() == [True, True, False, False, False]
    # the pair holds one GPU of node 0 (not two): node 0 has one free, node 1 one
    assert sub.node_gpus.tolist() == [1, 1] and sub.job_ids.tolist() == [2, 3, 4]
    assert sub.packed == () and sub.colocated is not None
    # The fill plans jobs 2 to 4 on the two free GPUs: the drain bound is 770 s (their
    # 1540 s of work on 2 GPUs), job 3 is critical (720 s > 770 s less 1.5 rounds) and goes
    # first, then job 2 (shortest); job 4 waits.  Job 3 may not host it (720 / 0.8 = 900 s
    # > 770 s: it would end after the drain target); job 2 may: together 2 ends at 125 and
    # 4 at 745, against 100 and 820 apart (A - B = 50).
    d = fill_decision(snap, holds, hadar().allocate(sub), None)
    assert d.packed == ((0, 1), (2, 4))
    rows = d.placement.by_job_sorted()
    assert rows[0] == rows[1] == [(0, 1)] and rows[2] == rows[4] != rows[3]
    assert (gpus_in_use(d.placement, d.packed, 2) <= snap.node_gpus).all()
    assert d.reason.tolist() == [Reason.PLACED] * 5
    # the simulator takes it as it is (no refusal)
    sim = SimulatedCluster([make_job(k, 720, 0, t) for k, t in enumerate("xyxyx")],
                           TWO_NODES, table_with(0.8), reschedule_on_finish=True)
    sim.snapshot(0, 100.0, 360.0, None)
    assert {c.job_id for c in sim.reconcile(snap, d)} == {0, 1, 2, 3, 4}


def test_a_fill_drops_a_pair_whose_partner_ended() -> None:
    snap = fill_case(first=1)  # job 0 ended; job 1 runs alone on the pair's GPU
    sub, holds = fill_snapshot(snap)
    assert holds.tolist() == [True, False, False, False]
    assert sub.node_gpus.tolist() == [1, 1]
    d = fill_decision(snap, holds, hadar(share=False).allocate(sub), None)
    assert d.packed == ()


def test_a_start_that_costs_more_than_the_pair_gains_is_not_made() -> None:
    # x and y, 720 s each, 0.8 each together: the pair gains 360 s (above).  Where a start
    # costs m seconds (Snapshot.migration_s), a guest that does not hold the host's GPUs pays
    # one start it would not pay waiting, and the host shares at 0.8 while it starts:
    # 360 - m * (1 + 0.2) > 0 for m = 200 (120), not for m = 400 (-120).  A pair that ran
    # last epoch (the guest already on the host's GPU) pays nothing to go on.
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    sim = SimulatedCluster(jobs, parse_counts("v100=1"), table_with(0.8))
    snap = sim.snapshot(0, 0.0, 360.0, None)
    assert hadar().allocate(dataclasses.replace(snap, migration_s=200.0)).packed == ((0, 1),)
    late = dataclasses.replace(snap, migration_s=400.0)
    assert hadar().allocate(late).packed == ()
    both = Placement(np.array([0, 1]), np.array([0, 0]), np.array([1, 1]))
    going_on = dataclasses.replace(late, current=both, packed=((0, 1),))
    assert hadar().allocate(going_on).packed == ((0, 1),)


def test_the_plan_sees_a_pairs_gpus_held_by_its_host() -> None:
    # Job 1 joined job 0 last epoch (HadarState.guests): the plan sees job 0 alone on the
    # GPU, and job 1 waiting; the sharing step pairs them again (no start: job 1 is there).
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    sim = SimulatedCluster(jobs, parse_counts("v100=1"), table_with(0.8))
    first = hadar().allocate(sim.snapshot(0, 0.0, 360.0, None))
    assert first.packed == ((0, 1),)
    assert isinstance(first.policy_state, HadarState) and first.policy_state.guests == (1,)
    both = Placement(np.array([0, 1]), np.array([0, 0]), np.array([1, 1]))
    snap = dataclasses.replace(sim.snapshot(1, 360.0, 360.0, first.policy_state),
                               current=both, packed=((0, 1),), migration_s=400.0)
    assert hadar().plan_view(snap).current.by_job_sorted() == {0: [(0, 1)]}
    again = hadar().allocate(snap)
    assert again.packed == ((0, 1),) and again.placement.by_job_sorted() == {
        0: [(0, 1)], 1: [(0, 1)]}
    # without sharing (off, or not offered) the plan sees the snapshot as it is
    assert hadar(share=False).plan_view(snap) is snap
    off = dataclasses.replace(snap, colocated=None)
    assert hadar().plan_view(off) is off


def test_after_pairs_ran_the_drain_target_is_taken_afresh() -> None:
    # One v100, x and y of 720 s each.  At t = 0 the drain (no pairs counted) is 1440 s of work
    # on one GPU: target 1440; the two pair.  They ran the round at 0.8 each: 288 steps done,
    # 432 left each, a drain of 864 s from t = 360: target 1224.  The pair's extra work brings
    # the target in; a carried target only moves later, so it stays at 1440 where no pair ran,
    # or with share_refresh off.
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    sim = SimulatedCluster(jobs, parse_counts("v100=1"), table_with(0.8))
    first = hadar().allocate(sim.snapshot(0, 0.0, 360.0, None))
    assert first.packed == ((0, 1),)
    assert isinstance(first.policy_state, HadarState)
    assert first.policy_state.target == pytest.approx(1440.0)
    both = Placement(np.array([0, 1]), np.array([0, 0]), np.array([1, 1]))
    snap = dataclasses.replace(sim.snapshot(1, 360.0, 360.0, first.policy_state),
                               current=both, packed=((0, 1),), remaining=np.array([432.0, 432.0]))

    def target(policy: HadarPolicy, s: Snapshot) -> float:
        state = policy.allocate(s).policy_state
        assert isinstance(state, HadarState)
        return state.target

    assert target(hadar(), snap) == pytest.approx(1224.0)
    assert target(HadarPolicy(share=True, share_refresh=False), snap) == pytest.approx(1440.0)
    assert target(hadar(), dataclasses.replace(snap, packed=())) == pytest.approx(1440.0)
    # without sharing offered the setting does nothing
    assert target(hadar(), dataclasses.replace(snap, colocated=None)) == pytest.approx(1440.0)


def test_a_pair_must_end_by_the_target_the_job_left_alone_after_included() -> None:
    """One v100 at t = 0: x (100 steps, placed) and y (720 steps, waiting), 0.8 of their speed
    each while they share.  Sharing, x ends at 100 / 0.8 = 125 and y at 125 + 720 - 0.8 x 125
    = 745 (then alone on x's GPU).  With 700 s to the drain target x would end in time but y,
    left on x's GPU, would not: no pair (the host alone ending in time was the old test, and
    guests left on GPUs the plan did not choose for them pushed gang chains past the target:
    bench.sharing, gavel/static-gangs 1.028 -> 1.006 of the unshared makespan).  With 750 s
    it pairs."""
    jobs = [make_job(0, 100, 0, "x"), make_job(1, 720, 0, "y")]
    snap = SimulatedCluster(jobs, parse_counts("v100=1"), table_with(0.8)).snapshot(
        0, 0.0, 360.0, None)
    placed = Placement(np.array([0]), np.array([0]), np.array([1]))
    order = np.array([0, 1], dtype=np.int64)
    _p, pairs, guests, _d = pack_waiting(snap, placed, order, window=700.0)
    assert pairs == () and not guests.any()
    _p, pairs, guests, _d = pack_waiting(snap, placed, order, window=750.0)
    assert pairs == ((0, 1),) and guests.tolist() == [False, True]


def test_arrivals_forecast_by_hand() -> None:
    """Two v100s at t = 1000, a window of 600 s: the jobs that arrived in (400, 1000] after
    the policy's first epoch count, each with its whole work alone on its fastest type.  x
    (arrived 500, 720 steps at 1 step/s) adds 720 GPU-seconds over 2 GPUs: 960 s.  a (arrived
    at 0, before the lookback) and b (arrived 450, 300 steps at 2 steps/s, 150 GPU-seconds)
    too where the first epoch was at 0: 1035 s; a first epoch at 480 leaves b out (a queue
    found waiting is no arrival), and at 600 leaves out x too."""
    jobs = [make_job(0, 5000, 0.0, "a"), make_job(1, 300, 450.0, "a"),
            make_job(2, 720, 500.0, "x")]
    snap = SimulatedCluster(jobs, parse_counts("v100=2"), table_with(0.8)).snapshot(
        0, 1000.0, 360.0, None)
    assert arrivals_forecast(snap, 600.0, 0.0).window == pytest.approx(600.0 + (150 + 720) / 2)
    assert arrivals_forecast(snap, 600.0, 480.0).window == pytest.approx(960.0)
    assert arrivals_forecast(snap, 600.0, 600.0).window == pytest.approx(600.0)
    # a shorter window looks back less far: from 700, nothing arrived
    assert arrivals_forecast(snap, 300.0, 0.0).window == pytest.approx(300.0)
    # the jobs forecast to arrive: the same jobs' weight (1 each) over the 2 GPUs
    assert [arrivals_forecast(snap, 600.0, since).weight for since in (0.0, 480.0, 600.0)
            ] == pytest.approx([1.0, 0.5, 0.0])
    assert arrivals_forecast(snap, 300.0, 0.0).weight == 0.0


def test_while_jobs_arrive_pairs_keep_the_forecast_makespan() -> None:
    """Gavel's poisson_200 (jobs arriving all along): the stretched window and the jobs
    forecast to wait behind every guest form pairs the queue alone refused (more rounds of
    pairs), and the average JCT falls; on static_32 (every job there at the
    first epoch) every decision is as without the setting."""
    table = default_table()
    cluster = load_cluster("4:4:4")
    arriving = load_trace("poisson_200_lam900_seed0", table)
    on = simulate(arriving, cluster, table, HadarPolicy(share=True), gpu_sharing=True)
    off = simulate(arriving, cluster, table, HadarPolicy(share=True, share_arrivals=False),
                   gpu_sharing=True)
    def pair_rounds(res: SimResult) -> int:
        return sum(len(pairs) for _t, pairs in res.packed)

    assert pair_rounds(on) > pair_rounds(off)
    assert on.avg_jct_s < 0.99 * off.avg_jct_s
    static = load_trace("static_32_seed0", table)
    a = simulate(static, cluster, table, HadarPolicy(share=True), gpu_sharing=True)
    b = simulate(static, cluster, table, HadarPolicy(share=True, share_arrivals=False),
                 gpu_sharing=True)
    assert a.packed == b.packed and a.avg_jct_s == b.avg_jct_s
    # HadarE keeps its fork target's window unless told (docs/sharing.md: the studies moved)
    plain = simulate(arriving, cluster, table, HadarEPolicy(share=True), gpu_sharing=True)
    told = simulate(arriving, cluster, table, HadarEPolicy(share=True, share_arrivals=True),
                    gpu_sharing=True)
    assert told.packed_jobs > plain.packed_jobs and told.avg_jct_s < plain.avg_jct_s


def test_no_pair_forms_on_a_type_a_waiting_gang_can_use() -> None:
    """One node of two v100s at t = 0: x (1 GPU, placed), g (2 GPUs, waiting: one GPU is
    free) and y (1 GPU, waiting).  y joining x would pay (the pair test above), but the pair
    would keep x on its GPU longer while g waits for both GPUs whole: no pair, whether g is
    ahead of y in the queue order or behind it (a gang behind jumps the queue once it is
    critical, and under load it waited for types that pairs kept busy: bench.sharing,
    gavel/bursty-1.5).  Without g, y joins x; and a pair that ran in the last epoch may always
    form again."""
    table = parse_gavel_json(json.dumps({"v100": {
        "('x', 1)": {"null": 1.0, "('y', 1)": [0.8, 0.8]},
        "('y', 1)": {"null": 1.0, "('x', 1)": [0.8, 0.8]},
        "('g', 2)": {"null": 2.0}}}), "gang.json")
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "g", scale=2),
            make_job(2, 720, 0, "y")]
    snap = SimulatedCluster(jobs, parse_counts("v100=1x2"), table).snapshot(0, 0.0, 360.0, None)
    placed = Placement(np.array([0]), np.array([0]), np.array([1]))
    for order in ([0, 1, 2], [0, 2, 1]):
        _p, pairs, guests, _d = pack_waiting(snap, placed, np.array(order, dtype=np.int64))
        assert pairs == () and not guests.any()
    alone = SimulatedCluster([jobs[0], jobs[2]], parse_counts("v100=1x2"), table).snapshot(
        0, 0.0, 360.0, None)
    _p, pairs, guests, _d = pack_waiting(alone, placed, np.array([0, 1], dtype=np.int64))
    assert pairs == ((0, 2),) and guests.tolist() == [False, True]
    again = dataclasses.replace(snap, packed=((0, 2),))
    _p, pairs, _g, _d = pack_waiting(again, placed, np.array([0, 1, 2], dtype=np.int64))
    assert pairs == ((0, 2),)


def test_a_waiting_gang_may_join_a_gang_of_its_width() -> None:
    """Two 2-GPU jobs on a node of two v100s: a (placed) and b (waiting).  b is itself the only
    gang that waits for the type, so it does not block its own pair: b joins a where the table
    says the pair gains.  A second waiting 2-GPU job c blocks it."""
    table = parse_gavel_json(json.dumps({"v100": {
        "('a', 2)": {"null": 2.0, "('b', 2)": [1.6, 1.6]},
        "('b', 2)": {"null": 2.0, "('a', 2)": [1.6, 1.6]},
        "('c', 2)": {"null": 2.0}}}), "gangs.json")
    jobs = [make_job(0, 720, 0, "a", scale=2), make_job(1, 720, 0, "b", scale=2)]
    placed = Placement(np.array([0]), np.array([0]), np.array([2]))
    snap = SimulatedCluster(jobs, parse_counts("v100=1x2"), table).snapshot(0, 0.0, 360.0, None)
    _p, pairs, guests, _d = pack_waiting(snap, placed, np.array([0, 1], dtype=np.int64))
    assert pairs == ((0, 1),) and guests.tolist() == [False, True]
    three = SimulatedCluster([*jobs, make_job(2, 720, 0, "c", scale=2)], parse_counts("v100=1x2"),
                             table).snapshot(0, 0.0, 360.0, None)
    _p, pairs, guests, _d = pack_waiting(three, placed, np.array([0, 1, 2], dtype=np.int64))
    assert pairs == () and not guests.any()


def test_simulate_cli_takes_share(tmp_path: Path) -> None:
    """``hadar-slurm simulate --share`` turns sharing on for hadar and hadare, as the sidecar's
    ``[scheduler] share``: the run is the library's with ``share=True`` (the same costs),
    jobs share GPUs and the output says how many; without it nobody shares."""
    from hadar_slurm.costs import LiveCosts
    from hadar_slurm.sim.cluster import load_cluster
    from tests.helpers import run_cli

    rows: dict[bool, dict[str, dict[str, object]]] = {}
    for share in (False, True):
        out = tmp_path / f"r{int(share)}.json"
        proc = run_cli("simulate", "--trace", "static_32_seed0", "--cluster", "4:4:4",
                       "--policy", "hadar,hadare", *(["--share"] if share else []),
                       "--json", str(out))
        assert proc.returncode == 0, proc.stderr
        rows[share] = {str(r["policy"]): r for r in json.loads(out.read_text())}
        if share:
            for name in ("hadar", "hadare"):
                n = rows[share][name]["shared_jobs"]
                assert f"{name}: {n} job(s) shared GPUs, in " in proc.stdout, proc.stdout
        else:
            assert "shared GPUs" not in proc.stdout
    assert all(r["shared_jobs"] == 0 for r in rows[False].values())
    table = default_table()
    live = LiveCosts()
    res = simulate(load_trace("static_32_seed0", table), load_cluster("4:4:4"), table,
                   make_policy("hadar", share=True), migration_cost_s=live.move_s,
                   start_cost_s=live.start_s)
    got = rows[True]["hadar"]
    assert got["shared_jobs"] == res.packed_jobs > 0
    assert got["makespan_s"] == round(res.makespan_s, 3)
    assert got["avg_jct_s"] == round(res.avg_jct_s, 3)
    assert int(str(rows[True]["hadare"]["shared_jobs"])) > 0


def test_hadare_plans_a_pairs_gpus_as_its_hosts() -> None:
    """HadarE sees a pair's GPUs as Hadar's plan does (``HadarEState.guests``): held by the
    host alone, the guest waiting."""
    # One v100: y (job 0, 1,000 steps) and x (job 1, 720), 0.8 each together. x goes first
    # (shorter) and y joins it; the next epoch, both on the GPU, y is named the guest and
    # joins again, with no start (migration_s 400 s would refuse a new pair, as for Hadar).
    jobs = [make_job(0, 1000, 0, "y"), make_job(1, 720, 0, "x")]
    sim = SimulatedCluster(jobs, parse_counts("v100=1"), table_with(0.8))
    policy = HadarEPolicy(share=True, max_copies=1)
    first = policy.allocate(sim.snapshot(0, 0.0, 360.0, None))
    assert first.packed == ((0, 1),)
    assert isinstance(first.policy_state, HadarEState) and first.policy_state.guests == (0,)
    both = Placement(np.array([0, 1]), np.array([0, 0]), np.array([1, 1]))
    snap = dataclasses.replace(sim.snapshot(1, 360.0, 360.0, first.policy_state),
                               current=both, packed=first.packed, migration_s=400.0)
    again = policy.allocate(snap)
    assert again.packed == ((0, 1),) and again.placement.by_job_sorted() == {
        0: [(0, 1)], 1: [(0, 1)]}
    assert isinstance(again.policy_state, HadarEState) and again.policy_state.guests == (0,)
    # Two v100 nodes of one GPU: x (job 1, 720 steps) hosts y (job 0, 500) on node 1, and a
    # longer x (job 2, 2,000) runs on node 0. Shortest first, jobs 0 and 1 run apart and job
    # 2 waits: the host keeps its node and the guest takes node 0. (Seen held by both, the
    # plan kept the guest there, the lower id's row first, and moved the host.)
    jobs = [make_job(0, 500, 0, "y"), make_job(1, 720, 0, "x"), make_job(2, 2000, 0, "x")]
    sim = SimulatedCluster(jobs, parse_counts("v100=2"), table_with(0.8))
    prev = HadarEState(HadarState(float("inf")), 0.0, guests=(0,))
    rows = Placement(np.array([0, 1, 2]), np.array([1, 1, 0]), np.array([1, 1, 1]))
    snap = dataclasses.replace(sim.snapshot(1, 360.0, 360.0, prev), current=rows,
                               packed=((0, 1),), migration_s=30.0)
    d = policy.allocate(snap)
    assert d.placement.by_job_sorted() == {0: [(0, 1)], 1: [(1, 1)]}
    assert d.packed == () and d.reason[2] != Reason.PLACED
