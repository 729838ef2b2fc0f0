"""Co-located rates on GPU types without measurements (issue #16): Gavel measured pairs on k80,
p100 and v100 only, so an a100 or h100 never shared.  ``ThroughputTable.colocated`` estimates
them conservatively: each job keeps the smallest share of its own speed it kept on a measured
type, a pair some measured type forbids stays forbidden, and the estimates are marked."""

from __future__ import annotations

import json

import pytest

from hadar_slurm.policy.hadar import HadarPolicy
from hadar_slurm.rates.table import ThroughputTable, parse_csv, parse_gavel_json
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.run import simulate
from tests.helpers import make_job


def table() -> ThroughputTable:
    """x, y: pairs measured on v100 (x keeps 0.8, y 0.6) and p100 (x 0.7, y 0.9); x, z
    forbidden on p100; isolated rates on a100 for x, y, z (and w, which has no pair at all)."""
    measured = parse_gavel_json(json.dumps({
        "v100": {"('x', 1)": {"null": 1.0, "('y', 1)": [0.8, 1.2], "('z', 1)": [0.5, 0.5]},
                 "('y', 1)": {"null": 2.0, "('x', 1)": [1.2, 0.8]},
                 "('z', 1)": {"null": 1.0, "('x', 1)": [0.5, 0.5]}},
        "p100": {"('x', 1)": {"null": 1.0, "('y', 1)": [0.7, 1.8], "('z', 1)": [0, 0]},
                 "('y', 1)": {"null": 2.0, "('x', 1)": [1.8, 0.7]},
                 "('z', 1)": {"null": 1.0, "('x', 1)": [0, 0]}},
    }), "pairs.json")
    a100 = parse_csv("job_type,scale_factor,gpu_type,steps_per_second\n"
                     "x,1,a100,4.0\ny,1,a100,10.0\nz,1,a100,3.0\nw,1,a100,1.0\n", "a100.csv")
    return measured.merged(a100)


def test_an_unmeasured_type_gets_the_smallest_shares_and_keeps_forbidden_pairs() -> None:
    t = table()
    c = t.colocated
    # x kept 0.8 (v100) and 0.7 (p100): 0.7 x 4.0; y kept 0.6 and 0.9: 0.6 x 10.0
    assert c.pair_rate("x", "y", 1, "a100") == pytest.approx((2.8, 6.0))
    assert c.pair_rate("y", "x", 1, "a100") == pytest.approx((6.0, 2.8))
    assert c.is_estimate("x", "y", 1, "a100") and c.is_estimate("y", "x", 1, "a100")
    # measured entries are kept as they are, and are no estimates
    assert c.pair_rate("x", "y", 1, "v100") == (0.8, 1.2)
    assert not c.is_estimate("x", "y", 1, "v100")
    # p100 forbids x with z: so does the estimate on a100
    assert c.pair_rate("x", "z", 1, "a100") == (0.0, 0.0)
    assert c.is_estimate("x", "z", 1, "a100")
    # no measured pair, no estimate
    assert c.pair_rate("x", "w", 1, "a100") == (0.0, 0.0)
    assert not c.is_estimate("x", "w", 1, "a100")
    # the measured table is unchanged
    assert t.pairs.pair_rate("x", "y", 1, "a100") == (0.0, 0.0) and not t.pairs.estimated


def test_a_measurement_replaces_an_estimate_when_tables_merge() -> None:
    c = table().colocated
    more = parse_gavel_json(json.dumps({"a100": {
        "('x', 1)": {"null": 4.0, "('y', 1)": [3.9, 9.0]},
        "('y', 1)": {"null": 10.0, "('x', 1)": [9.0, 3.9]}}}), "a100.json").pairs
    both = c.merged(more)
    assert both.pair_rate("x", "y", 1, "a100") == (3.9, 9.0)
    assert not both.is_estimate("x", "y", 1, "a100")
    assert both.is_estimate("x", "z", 1, "a100")


def test_hadar_pairs_jobs_on_a_gpu_type_gavel_never_measured() -> None:
    # One a100: x (4 steps/s, 720 s alone) and two y (10 steps/s, 720 s and 200 s); x with a y
    # estimated at 2.8 and 6.0 (0.7 and 0.6 of their speeds: 1.3 of one job's work per second).
    jobs = [make_job(0, 2880, 0, "x"), make_job(1, 7200, 0, "y"), make_job(2, 2000, 0, "y")]
    r = simulate(jobs, parse_counts("a100=1"), table(), HadarPolicy(share=True))
    assert r.packed and r.packed[0][1] in (((0, 1),), ((0, 2),))  # (x with a y)
    alone = simulate(jobs, parse_counts("a100=1"), table(), HadarPolicy(share=False))
    assert not alone.packed and r.avg_jct_s < alone.avg_jct_s


def test_pair_rates_on_and_pair_cube_answer_what_pair_rate_does() -> None:
    # The per-type and per-kind forms a policy asks every epoch: each entry is pair_rate's,
    # a forbidden, missing or mixed-scale pair 0 for both jobs.
    c = table().colocated
    types = ("v100", "p100", "a100", "k80")
    a, b = c.pair_rates_on("x", "z", 1, types)
    assert a == (0.5, 0.0, c.pair_rate("x", "z", 1, "a100")[0], 0.0)
    assert b == (0.5, 0.0, c.pair_rate("x", "z", 1, "a100")[1], 0.0)
    kinds_a = (("x", 1), ("y", 1), ("x", 2))
    kinds_b = (("y", 1), ("z", 1), ("w", 1), ("y", 2))
    of_a, of_b = c.pair_cube(kinds_a, kinds_b, types)
    assert of_a.shape == of_b.shape == (3, 4, 4)
    for x, (ta, sa) in enumerate(kinds_a):
        for y, (tb, sb) in enumerate(kinds_b):
            for h, g in enumerate(types):
                want = c.pair_rate(ta, tb, sa, g) if sa == sb else (0.0, 0.0)
                assert (of_a[x, y, h], of_b[x, y, h]) == want, (ta, tb, g)
    assert of_a[0, 0, 0] == 0.8 and of_b[0, 0, 1] == 1.8  # (x with y on v100; on p100)
    assert not of_a[2].any()  # (x on 2 GPUs has no pair of 2 GPUs here)
    # remembered, and read-only so that no caller changes what the next one reads
    assert c.pair_cube(kinds_a, kinds_b, types)[0] is of_a
    with pytest.raises(ValueError):
        of_a[0, 0, 0] = 1.0
