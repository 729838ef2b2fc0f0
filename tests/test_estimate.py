"""Estimating unmeasured throughputs (hadar_slurm.rates.estimate) and planning with them in the sim.

The synthetic tables are exactly what the model can express (rates = a_i * b_g, i.e. log rate =
row effect + column effect), so every hidden entry must come back to rounding.  The real check is
leave-one-out on a slice of Gavel's measured table, against a bound measured on it (below).
"""

from __future__ import annotations

import numpy as np
import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.policy import make_policy
from hadar_slurm.rates.estimate import (
    complete,
    hide_random,
    leave_one_out,
    model_family,
    without,
)
from hadar_slurm.rates.table import ThroughputTable, default_table
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.run import simulate
from tests.helpers import make_job

GPUS = ("k80", "p100", "v100", "a100")
# Rows sharing job types and families across scale factors, so the grouped terms matter.
ROWS = [("M (batch size 16)", 1), ("M (batch size 16)", 2), ("M (batch size 32)", 1),
        ("M (batch size 32)", 4), ("N", 1), ("N", 2), ("Q (batch size 8)", 1)]


def rank1_table() -> tuple[ThroughputTable, dict[tuple[str, int, str], float]]:
    """rates = a_i * b_g over ROWS x GPUS (seeded), as a table and as a dict of entries."""
    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 50.0, len(ROWS))
    b = rng.uniform(0.2, 5.0, len(GPUS))
    truth = {(job, sf, g): float(a[i] * b[h])
             for i, (job, sf) in enumerate(ROWS) for h, g in enumerate(GPUS)}
    rates: dict[tuple[str, int], dict[str, float]] = {}
    for (job, sf, g), r in truth.items():
        rates.setdefault((job, sf), {})[g] = r
    return ThroughputTable(rates, "rank1"), truth


# Hidden: 9 of 28 entries, every row and every column keeps at least one.
HIDDEN = frozenset({
    ("M (batch size 16)", 1, "a100"), ("M (batch size 16)", 2, "k80"),
    ("M (batch size 16)", 2, "p100"), ("M (batch size 32)", 1, "v100"),
    ("M (batch size 32)", 4, "a100"), ("N", 1, "k80"), ("N", 2, "a100"), ("N", 2, "v100"),
    ("Q (batch size 8)", 1, "p100"),
})


def test_rank1_table_is_recovered_exactly_and_only_hidden_entries_are_marked() -> None:
    full, truth = rank1_table()
    observed = without(full, HIDDEN)
    c = complete(observed)
    assert c.estimated == HIDDEN
    assert c.unestimable == frozenset()
    for key in HIDDEN:
        assert c.table.rate(*key) == pytest.approx(truth[key], rel=1e-5), key
    # Observed entries come back bit for bit.
    for (job, sf), per_gpu in observed.rates.items():
        for g, r in per_gpu.items():
            assert c.table.rate(job, sf, g) == r
    assert len(list(c.estimates())) == len(HIDDEN)
    assert {(j, s, g) for j, s, g, _r in c.estimates()} == HIDDEN
    # Cross-validation found an (almost) exact model.
    assert c.cv_error < 1e-5


def test_a_shrunk_row_effect_does_not_recover_rank1_exactly() -> None:
    # The counterpart of the test above: with a heavy penalty on the row level, the row effect
    # of a row with few observations is pulled towards its group, so the estimate is off.  The
    # exact recovery above therefore depends on cross-validation choosing the right model.
    full, truth = rank1_table()
    c = complete(without(full, HIDDEN), rank=0, reg=1.0, row_reg=100.0)
    errors = [abs(c.table.rate(*k) - truth[k]) / truth[k] for k in HIDDEN]
    assert max(errors) > 0.01


def test_low_rank_interaction_is_fitted_when_asked() -> None:
    # log rate = a_i + b_g + u_i * v_g with a real interaction: rank 1 beats rank 0 on it.
    rng = np.random.default_rng(3)
    n = 12
    rows = [(f"J{i}", 1) for i in range(n)]
    a, b = rng.normal(0, 1, n), rng.normal(0, 0.5, len(GPUS))
    u, v = rng.normal(0, 1, n), np.array([1.0, -1.0, 0.5, -0.5])
    log_rate = a[:, None] + b[None, :] + np.outer(u, v)
    rates = {rows[i]: {g: float(np.exp(log_rate[i, h])) for h, g in enumerate(GPUS)}
             for i in range(n)}
    hidden = frozenset((f"J{i}", 1, GPUS[i % len(GPUS)]) for i in range(n))
    table = without(ThroughputTable(rates), hidden)

    def err(rank: int) -> float:
        c = complete(table, rank=rank, reg=0.01, row_reg=0.0)
        return float(max(abs(np.log(c.table.rate(*k)) - log_rate[int(k[0][1:]), GPUS.index(k[2])])
                         for k in hidden))

    assert err(1) < 0.05
    assert err(0) > 3 * err(1)


def test_rows_without_a_positive_rate_are_unestimable_and_zeros_are_kept() -> None:
    full, _truth = rank1_table()
    rates = {k: dict(v) for k, v in without(full, HIDDEN).rates.items()}
    rates[("Empty", 1)] = {}
    rates[("Zeros", 1)] = {"k80": 0.0, "v100": 0.0}
    rates[("N", 1)]["p100"] = 0.0  # does not run there: kept, not estimated, not used
    c = complete(ThroughputTable(rates, "t"))
    assert c.unestimable == frozenset({("Empty", 1), ("Zeros", 1)})
    assert c.table.rates[("Empty", 1)] == {}
    assert c.table.rates[("Zeros", 1)] == {"k80": 0.0, "v100": 0.0}
    assert c.table.rate("N", 1, "p100") == 0.0
    assert not any(job in ("Empty", "Zeros") for job, _sf, _g in c.estimated)
    assert ("N", 1, "p100") not in c.estimated
    assert c.estimated == HIDDEN


def test_complete_is_deterministic() -> None:
    table = without(default_table(), hide_random(default_table(), 0.2, seed=5))
    one, two = complete(table), complete(table)
    assert one.estimated == two.estimated and one.estimated
    assert one.table.rates == two.table.rates
    assert (one.rank, one.reg, one.row_reg, one.cv_error) == (
        two.rank, two.reg, two.row_reg, two.cv_error)


def test_gpu_types_limit_the_columns() -> None:
    full, _truth = rank1_table()
    c = complete(without(full, HIDDEN), gpu_types=["K80", "v100"])
    assert c.estimated == {k for k in HIDDEN if k[2] in ("k80", "v100")}
    assert c.table.rate("M (batch size 16)", 1, "a100") == 0.0  # hidden, not asked for


def test_bad_input_names_the_field() -> None:
    full, _truth = rank1_table()
    with pytest.raises(InputError, match="h100") as exc:
        complete(full, gpu_types=["v100", "h100"])
    assert exc.value.field == "gpu_types" and exc.value.fix
    with pytest.raises(InputError) as exc:
        complete(full, rank=9)
    assert exc.value.field == "rank"
    with pytest.raises(InputError) as exc:
        complete(full, reg=-1.0)
    assert exc.value.field == "reg"
    with pytest.raises(InputError) as exc:
        hide_random(full, 1.5, seed=0)
    assert exc.value.field == "fraction"


def test_model_family() -> None:
    assert model_family("ResNet-50 (batch size 64)") == "ResNet-50"
    assert model_family("LM (batch size 5)") == "LM"
    assert model_family("A3C") == "A3C"


def test_hide_random_keeps_one_entry_per_row_and_depends_on_the_seed() -> None:
    table = default_table()
    positive = sum(1 for v in table.rates.values() for r in v.values() if r > 0)
    hidden = hide_random(table, 1 / 3, seed=0)
    assert len(hidden) == round(positive / 3)
    assert all(table.rate(*k) > 0 for k in hidden)
    left = without(table, hidden)
    assert all(any(r > 0 for r in v.values()) for v in left.rates.values())
    assert hide_random(table, 1 / 3, seed=0) == hidden
    assert hide_random(table, 1 / 3, seed=1) != hidden


# A real slice of Gavel's table: every scale factor of ResNet-50 and of Transformer (36 rows,
# 105 positive entries).  Measured leave-one-out (cross-validated hyperparameters): median
# relative error 0.058, p90 0.219 (and 0.081 / 0.289 on the whole table, bench.estimation).
# Bounds with margin: median 0.09, p90 0.30.  A model with only row and GPU-type effects
# (rank 0, no group interactions to speak of: reg 1e6, free row effect) does much worse on the
# same slice (median 0.227), which the last assert checks so the bound is not trivially loose.
def gavel_slice() -> ThroughputTable:
    t = default_table()
    keep = {k: v for k, v in t.rates.items() if model_family(k[0]) in ("ResNet-50", "Transformer")}
    return ThroughputTable(keep, "gavel-slice")


def test_leave_one_out_on_a_slice_of_gavels_table() -> None:
    table = gavel_slice()
    entries = leave_one_out(table)
    assert len(entries) == 105
    err = np.array([e.rel_error for e in entries])
    assert float(np.median(err)) < 0.09
    assert float(np.percentile(err, 90)) < 0.30
    naive = leave_one_out(table, rank=0, reg=1e6, row_reg=0.0)
    assert float(np.median([e.rel_error for e in naive])) > 2 * float(np.median(err))


# -- the simulator: the policy plans with one table, progress follows another -----------------

def wrong_toy_table() -> ThroughputTable:
    # The truth (conftest's toy table): toy runs 1 step/s on a v100, 0.5 on a k80.  This table
    # claims the k80 is 4x faster than the v100 for it.
    return ThroughputTable({("toy", 1): {"v100": 0.25, "k80": 1.0},
                            ("v100only", 1): {"v100": 1.0, "k80": 1.0}}, "wrong")


def test_policy_plans_with_the_policy_table_and_progress_follows_the_truth(
    toy_table: ThroughputTable,
) -> None:
    # One toy job of 720 steps on one v100 and one k80.  Planning with the truth, hadar puts it
    # on the v100: 720 steps at 1 step/s, finished at 720 s.  Planning with the wrong table it
    # picks the k80, where it truly runs at 0.5 step/s: finished at 1440 s (not the 720 s the
    # wrong table promised).
    cluster = parse_counts("v100=1:k80=1")
    jobs = [make_job(0, 720, 0)]
    right = simulate(jobs, cluster, toy_table, make_policy("hadar"))
    wrong = simulate(jobs, cluster, toy_table, make_policy("hadar"),
                     policy_table=wrong_toy_table())
    v100, k80 = cluster.gpu_types.index("v100"), cluster.gpu_types.index("k80")
    assert right.finish.tolist() == [720.0]
    assert right.usage[0].busy_gpu_s[v100] == 360.0 and right.usage[0].busy_gpu_s[k80] == 0.0
    assert wrong.finish.tolist() == [1440.0]
    assert wrong.usage[0].busy_gpu_s[k80] == 360.0 and wrong.usage[0].busy_gpu_s[v100] == 0.0
    # Fairness is measured against the truth too (isolated runtime on the true mean rate).
    assert wrong.ftf_mean > right.ftf_mean


def test_snapshot_rate_is_the_policy_table_and_copies_run_at_the_true_rate(
    toy_table: ThroughputTable,
) -> None:
    cluster = parse_counts("v100=2:k80=1")
    jobs = [make_job(0, 720, 0)]
    sim = SimulatedCluster(jobs, cluster, toy_table, policy_table=wrong_toy_table())
    snap = sim.snapshot(0, 0.0, 360.0, None)
    types = cluster.gpu_types
    assert snap.rate.tolist() == [[{"v100": 0.25, "k80": 1.0}[g] for g in types]]
    # Two copies (HadarE), one on each v100 node, one on the k80: 1 + 1 + 0.5 steps/s (truth).
    nodes = {t: [n for n, nt in enumerate(sim.node_type.tolist()) if types[nt] == t]
             for t in types}
    copies = {0: [(nodes["v100"][0], 1)], 1: [(nodes["v100"][1], 1)], 2: [(nodes["k80"][0], 1)]}
    assert sim.forked_rate(0, copies) == 2.5
    # Without a policy table, the snapshot is the truth, as before.
    plain = SimulatedCluster(jobs, cluster, toy_table).snapshot(0, 0.0, 360.0, None)
    assert plain.rate.tolist() == [[{"v100": 1.0, "k80": 0.5}[g] for g in types]]


def test_a_job_placed_where_it_truly_cannot_run_makes_no_progress_and_the_sim_ends(
    toy_table: ThroughputTable,
) -> None:
    # v100only has no k80 rate in the truth; the wrong table says it runs there.  On a cluster
    # of one k80 the policy places it, it makes no progress, and after a few idle epochs the
    # simulator gives up instead of looping at the same instant forever.
    cluster = parse_counts("k80=1")
    jobs = [make_job(0, 720, 0, job_type="v100only")]
    r = simulate(jobs, cluster, toy_table, make_policy("hadar"), policy_table=wrong_toy_table())
    assert r.num_completed == 0
    assert 1 <= r.epochs <= 10


def test_learning_corrects_estimates_and_optimism_tries_the_type_an_estimate_undersells(
    toy_table: ThroughputTable,
) -> None:
    # The wrong table undersells the v100 (0.25 for a true 1.0) and oversells the k80 (1.0 for
    # a true 0.5).  With learning, the first round on the k80 shows its true 0.5 step/s, but the
    # v100's 0.25 is never tried: the job stays on the k80 (1440 s).  With the estimates planned
    # at 3x (0.75 on the v100) the job moves to the v100 once the k80's truth is known, learns
    # that it runs at 1.0 there and finishes at 360 + (720 - 180) / 1.0 = 900 s.
    cluster = parse_counts("v100=1:k80=1")
    jobs = [make_job(0, 720, 0)]
    learned = simulate(jobs, cluster, toy_table, make_policy("hadar"),
                       policy_table=wrong_toy_table(), learn_rates=True)
    assert learned.finish.tolist() == [1440.0]
    optimistic = ThroughputTable({("toy", 1): {"v100": 0.75, "k80": 1.0},
                                  ("v100only", 1): {"v100": 1.0, "k80": 1.0}}, "optimistic")
    explored = simulate(jobs, cluster, toy_table, make_policy("hadar"),
                        policy_table=optimistic, learn_rates=True)
    assert explored.finish.tolist() == [900.0]
    # Without learning the same optimistic table keeps it on the k80 (1.0 > 0.75 forever).
    static = simulate(jobs, cluster, toy_table, make_policy("hadar"), policy_table=optimistic)
    assert static.finish.tolist() == [1440.0]


def test_optimistic_multiplies_only_the_estimates() -> None:
    table, _ = rank1_table()
    c = complete(without(table, HIDDEN), gpu_types=GPUS)
    up = c.optimistic(3.0)
    for job, sf in ROWS:
        for g in GPUS:
            factor = 3.0 if (job, sf, g) in HIDDEN else 1.0
            assert up.rate(job, sf, g) == pytest.approx(factor * c.table.rate(job, sf, g))
    with pytest.raises(InputError) as err:
        c.optimistic(0.5)
    assert err.value.field == "factor"
