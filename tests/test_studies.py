"""Tuning studies in the simulator (issue #17): spec checks, the halving rules worked by hand,
the synthetic curves, the study controller's mechanics and the static baseline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Decision, Snapshot
from hadar_slurm.rates.table import ThroughputTable, default_table
from hadar_slurm.studies.curves import LearningCurves
from hadar_slurm.studies.halving import Verdict, best_trial, cohorts, verdicts
from hadar_slurm.studies.sim import StudyCluster, StudyRun, simulate_studies
from hadar_slurm.studies.spec import Rule, StudySpec, trial_weight
from hadar_slurm.studies.static import StaticTrialsPolicy

MODEL = "toy"


def table(fast: float = 10.0, slow: float = 2.0) -> ThroughputTable:
    return ThroughputTable({(MODEL, 1): {"fast": fast, "slow": slow},
                            (MODEL, 2): {"fast": 2 * fast, "slow": 2 * slow}})


def spec(rule: Rule = Rule.SH, trials: int = 4, max_steps: float = 800.0, rungs: int = 3,
         eta: float = 2.0, mode: str = "max") -> StudySpec:
    return StudySpec("s", MODEL, trials, max_steps, rungs=rungs, eta=eta, rule=rule, mode=mode)


# -- spec ---------------------------------------------------------------------------------------

def test_rungs_are_geometric_up_to_the_full_budget() -> None:
    s = StudySpec("s", MODEL, 27, 81.0, rungs=4, eta=3.0)
    assert s.rung_steps == pytest.approx((3.0, 9.0, 27.0, 81.0))
    assert [s.survivors(n) for n in (27, 9, 3, 2, 1)] == [9, 3, 1, 1, 1]


@pytest.mark.parametrize("kwargs, field", [
    ({"trials": 0}, "trials"), ({"eta": 1.5}, "eta"), ({"rungs": 0}, "rungs"),
    ({"rungs": 11}, "rungs"), ({"mode": "up"}, "mode"), ({"max_steps": -1.0}, "max_steps"),
    ({"max_steps": float("nan")}, "max_steps"), ({"name": "a b"}, "study"),
    ({"metric": ""}, "metric"), ({"max_steps": 8.0, "rungs": 5, "eta": 3.0}, "rungs"),
])
def test_a_bad_study_names_its_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"name": "s", "job_type": MODEL, "trials": 4, "max_steps": 100.0}
    args.update(kwargs)
    with pytest.raises(InputError) as err:
        StudySpec(**args)  # type: ignore[arg-type]
    assert err.value.field == field
    assert err.value.fix


def test_an_unknown_rule_lists_the_rules() -> None:
    with pytest.raises(InputError, match=r"asha.*sh.*hyperband.*none"):
        Rule.parse("bohb")
    assert Rule.parse(" ASHA ") is Rule.ASHA
    assert Rule.parse("Hyperband") is Rule.HYPERBAND


# -- halving, worked by hand --------------------------------------------------------------------

def test_asha_promotes_within_the_best_1_over_eta_of_the_reports_so_far() -> None:
    s = spec(Rule.ASHA, trials=4, eta=2.0)
    reports: list[dict[int, float]] = [{0: 0.5}, {}, {}]
    # one report: floor(1/2) = 0 go on yet; with the 3 still to come it could be among the best
    # floor(4/2) = 2: it waits
    assert verdicts(s, range(4), reports, {0: 0}) == {0: Verdict.WAIT}
    reports[0][1] = 0.7
    # two reports keep floor(2/2) = 1: t1 (.7) goes on; t0 may still be second of four
    assert verdicts(s, range(4), reports, {0: 0, 1: 0}) == {0: Verdict.WAIT, 1: Verdict.GO}
    reports[0] |= {2: 0.6, 3: 0.4}
    # rung 0 complete: the best 2 of 4 (.7, .6) go on; t1 already has: t2 goes, t0, t3 stop
    assert verdicts(s, range(4), reports, {0: 0, 2: 0, 3: 0}) == {
        0: Verdict.STOP, 2: Verdict.GO, 3: Verdict.STOP}
    # rung 1: t1 and t2 were promoted; it is complete once both reported (or stopped)
    reports[1] = {2: 0.8}
    assert verdicts(s, range(4), reports, {2: 1}, stopped=[0, 3]) == {2: Verdict.WAIT}
    assert verdicts(s, range(4), reports, {2: 1}, stopped=[0, 1, 3]) == {2: Verdict.GO}


def test_asha_stops_a_trial_that_can_no_longer_go_on() -> None:
    # 6 trials, eta 3: at most floor(6/3) = 2 go on from rung 0; a report that ranks 4th of
    # the 4 so far can never be among them, whatever the 2 still to come report
    s = spec(Rule.ASHA, trials=6, eta=3.0)
    reports: list[dict[int, float]] = [{0: 0.9, 1: 0.8, 2: 0.7, 3: 0.1}, {}, {}]
    assert verdicts(s, range(6), reports, {1: 0, 2: 0, 3: 0}) == {
        1: Verdict.WAIT, 2: Verdict.STOP, 3: Verdict.STOP}
    # (t2 ranks 3rd: with the two to come it could be 3rd of 6, outside the best 2: stop)


def test_asha_with_a_loss_keeps_the_lowest() -> None:
    s = spec(Rule.ASHA, trials=2, eta=2.0, mode="min")
    got = verdicts(s, range(2), [{0: 0.5, 1: 0.7}, {}, {}], {1: 0})
    assert got == {1: Verdict.STOP}


def test_sh_waits_for_the_cohort_then_keeps_the_best_half() -> None:
    s = spec(Rule.SH, trials=4, eta=2.0)
    reports: list[dict[int, float]] = [{0: 0.5, 1: 0.7, 2: 0.6}, {}, {}]
    assert verdicts(s, range(4), reports, {0: 0, 1: 0, 2: 0}) == {
        0: Verdict.WAIT, 1: Verdict.WAIT, 2: Verdict.WAIT}
    reports[0][3] = 0.1
    assert verdicts(s, range(4), reports, {0: 0, 1: 0, 2: 0, 3: 0}) == {
        0: Verdict.STOP, 1: Verdict.GO, 2: Verdict.GO, 3: Verdict.STOP}
    assert cohorts(s, range(4), reports) == [[0, 1, 2, 3], [1, 2]]
    reports[1] = {2: 0.8, 1: 0.75}
    assert verdicts(s, range(4), reports, {1: 1, 2: 1}) == {1: Verdict.STOP, 2: Verdict.GO}
    reports[2] = {2: 0.9}
    assert verdicts(s, range(4), reports, {2: 2}) == {2: Verdict.DONE}
    assert best_trial(s, reports) == 2


def test_hyperband_brackets_have_the_papers_sizes() -> None:
    # Li et al., JMLR 2018, Table 1 (R = 81, eta = 3): brackets of 81, 34, 15, 8 and 5 trials
    # starting at budgets 1, 3, 9, 27 and 81, i.e. rungs 0 to 4 of a 5-rung study of 143 trials
    s = spec(Rule.HYPERBAND, trials=143, max_steps=81.0, rungs=5, eta=3.0)
    start = s.brackets(range(143))
    assert [sum(1 for b in start.values() if b == k) for k in range(5)] == [81, 34, 15, 8, 5]
    # in submission order: the first 81 trials start at rung 0, the last 5 at rung 4
    assert (start[0], start[80], start[81], start[138], start[142]) == (0, 0, 1, 4, 4)
    # few trials: one per bracket first (weights 6.75, 3, 1.5, 1 for 5 trials: 2.76, 1.22,
    # 0.61, 0.41 -> 2, 1, 0, 0 and the largest remainders 0.76, 0.61 -> 3, 1, 1, 0 -> the
    # empty last bracket takes one from the first)
    few = spec(Rule.HYPERBAND, trials=5, max_steps=81.0, rungs=4, eta=3.0).brackets(range(5))
    assert list(few.values()) == [0, 0, 1, 2, 3]
    assert spec(Rule.HYPERBAND, trials=2, rungs=3).brackets([7, 9]) == {7: 0, 9: 1}
    assert set(spec(Rule.SH, trials=4).brackets(range(4)).values()) == {0}


def test_hyperband_halves_each_bracket_apart_from_its_first_rung() -> None:
    # 7 trials, 3 rungs, eta 2: weights 4/3, 1, 1 -> 2.8, 2.1, 2.1 -> brackets of 3, 2, 2:
    # trials 0-2 halve from rung 0, 3-4 from rung 1, 5-6 train to the end
    s = spec(Rule.HYPERBAND, trials=7, rungs=3, eta=2.0)
    assert s.brackets(range(7)) == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2}
    reports: list[dict[int, float]] = [{0: 0.5, 3: 0.9, 1: 0.7, 5: 0.1}, {}, {}]
    # below their first rung, trials 3 and 5 go on whatever they report; bracket 0 waits
    # for trial 2
    assert verdicts(s, range(7), reports, {0: 0, 1: 0, 3: 0, 5: 0}) == {
        0: Verdict.WAIT, 1: Verdict.WAIT, 3: Verdict.GO, 5: Verdict.GO}
    reports[0][2] = 0.6
    # bracket 0 complete: the best max(1, 3 // 2) = 1 of its 3 goes on
    assert verdicts(s, range(7), reports, {0: 0, 1: 0, 2: 0}) == {
        0: Verdict.STOP, 1: Verdict.GO, 2: Verdict.STOP}
    assert cohorts(s, [3, 4], reports, 1) == [[3, 4]]
    # rung 1: trial 1 is bracket 0's whole cohort there and goes on at once, though trial 3
    # (bracket 1) reported better; bracket 1 waits for trial 4
    reports[1] = {3: 0.95, 1: 0.8}
    assert verdicts(s, range(7), reports, {1: 1, 3: 1}) == {1: Verdict.GO, 3: Verdict.WAIT}
    reports[1][4] = 0.97
    assert verdicts(s, range(7), reports, {3: 1, 4: 1}) == {3: Verdict.STOP, 4: Verdict.GO}
    assert cohorts(s, [3, 4], reports, 1) == [[3, 4], [4]]
    reports[2] = {1: 0.85, 4: 0.96, 5: 0.99}
    assert verdicts(s, range(7), reports, {1: 2, 4: 2, 5: 2}) == {
        1: Verdict.DONE, 4: Verdict.DONE, 5: Verdict.DONE}
    assert best_trial(s, reports) == 5  # (the bracket that never halves found it)


def test_none_never_stops() -> None:
    s = spec(Rule.NONE, trials=2)
    reports = [{0: 0.1, 1: 0.9}, {0: 0.2}, {}]
    assert verdicts(s, range(2), reports, {0: 1, 1: 0}) == {0: Verdict.GO, 1: Verdict.GO}


def test_a_verdict_needs_the_report() -> None:
    with pytest.raises(ValueError, match="no report"):
        verdicts(spec(), range(4), [{}, {}, {}], {0: 0})


# -- curves -------------------------------------------------------------------------------------

def test_curves_are_seeded_and_reports_do_not_depend_on_order() -> None:
    a, b = LearningCurves(16, seed=3), LearningCurves(16, seed=3)
    assert a.configs == b.configs
    late = [b.report(t, 1, 0.25) for t in reversed(range(16))][::-1]
    assert [a.report(t, 1, 0.25) for t in range(16)] == late
    assert LearningCurves(16, seed=4).configs != a.configs


def test_a_curve_starts_at_chance_and_rises_to_its_final() -> None:
    c = LearningCurves(8, seed=0, noise=0.0)
    for t in range(8):
        assert c.mean(t, 0.0) == pytest.approx(0.10)
        values = [c.mean(t, f) for f in (0.01, 0.1, 0.5, 1.0)]
        assert values == sorted(values)
        assert c.report(t, 3, 1.0) == c.final(t)
    assert c.final(c.best_trial()) == max(c.final(t) for t in range(8))


# -- the study controller -----------------------------------------------------------------------

def one_gpu() -> ClusterSpec:
    return ClusterSpec.uniform([("fast", 1)])


def test_synchronous_halving_on_one_gpu_worked_by_hand() -> None:
    # 2 trials, rungs at 400 and 800 steps, 10 steps/s on the one GPU: both first rungs take
    # 80 s (trial 0, then trial 1), the survivor 40 s more: 120 s.  The survivor was the last
    # to report if it is trial 1 (it never stopped: no restart cost), else it waited and
    # restarts (50 s).
    curves = LearningCurves(2, seed=5, noise=0.0)
    s = spec(Rule.SH, trials=2, max_steps=800.0, rungs=2, eta=2.0)
    run = StudyRun(s, curves, first_job_id=10)
    res = simulate_studies([], [run], one_gpu(), table(), StaticTrialsPolicy(run.job_ids),
                           migration_cost_s=50.0)
    out = res.studies[0]
    first = {t: curves.report(t, 0, 0.5) for t in range(2)}
    survivor = max(range(2), key=lambda t: (first[t], -t))
    assert out.best_trial == survivor
    assert out.stopped_at == [1, 0]
    assert out.time_to_best_s == pytest.approx(120.0 + (50.0 if survivor == 0 else 0.0))
    assert out.best_final == curves.final(survivor)


def test_asha_promotion_in_place_costs_no_restart() -> None:
    curves = LearningCurves(1, seed=1)
    s = spec(Rule.ASHA, trials=1, max_steps=800.0, rungs=3, eta=2.0)
    run = StudyRun(s, curves, first_job_id=1)
    res = simulate_studies([], [run], one_gpu(), table(), StaticTrialsPolicy(run.job_ids),
                           migration_cost_s=50.0)
    # three rungs (200, 400, 800 steps) at 10 steps/s, promoted in place twice: 80 s
    assert res.studies[0].time_to_best_s == pytest.approx(80.0)
    assert [len(r) for r in res.studies[0].reports] == [1, 1, 1]


def test_a_job_kept_on_its_gpus_pays_its_start_once() -> None:
    # A 1-GPU job of 10,000 steps at 10 steps/s beside a one-trial study, on two fast GPUs,
    # 360-s rounds, a start costing 30 s: the job starts at 0 and runs through the epochs at
    # 360, 720 and 1,080 s on the same GPU, so it ends at 30 + 1,000 s.  The study simulator
    # advanced the schedule twice per epoch (before its halving, then in the base snapshot),
    # and the second advance took the round's start as still owed: the job paid 30 s more at
    # each later epoch (70 s, the trial's end, then 360, 720, 1,080: 1,150 s).  The trial (400
    # steps, 40 s) ends at 30 + 40 s.
    cl = ClusterSpec.uniform([("fast", 2)])
    run = StudyRun(spec(Rule.NONE, trials=1, max_steps=400.0, rungs=1), LearningCurves(1),
                   first_job_id=50)
    other = Job(1, MODEL, 1, 10_000.0, 0.0)
    res = simulate_studies([other], [run], cl, table(), make_policy("hadar"),
                           start_cost_s=30.0, migration_cost_s=40.0)
    assert res.others_avg_jct_s == pytest.approx(1030.0)
    assert res.studies[0].time_to_best_s == pytest.approx(70.0)


def test_a_stopped_trial_frees_its_gpu_for_the_next() -> None:
    # ASHA, eta 2, 3 trials on one GPU: one or two of the three go on (the best of the first
    # two reports, and the third if it is the best of all three); each rung-0 run takes 20 s
    # (200 steps at 10/s), each rung-1 run 20 s more
    curves = LearningCurves(3, seed=2, noise=0.0)
    s = spec(Rule.ASHA, trials=3, max_steps=400.0, rungs=2, eta=2.0)
    run = StudyRun(s, curves, first_job_id=1)
    res = simulate_studies([], [run], one_gpu(), table(), StaticTrialsPolicy(run.job_ids))
    out = res.studies[0]
    first = {t: curves.report(t, 0, 0.5) for t in range(3)}
    best_of_two = max((0, 1), key=lambda t: first[t])
    expected = {best_of_two} | ({2} if first[2] > max(first[0], first[1]) else set())
    assert set(out.reports[1]) == expected
    assert out.time_to_best_s == pytest.approx(3 * 20.0 + len(expected) * 20.0)


def test_static_trials_take_one_gpu_each_first_fit_and_keep_it() -> None:
    cl = ClusterSpec.uniform([("slow", 2), ("fast", 2)])  # slow nodes first, as listed
    curves = LearningCurves(3, seed=0)
    run = StudyRun(spec(Rule.NONE, trials=3), curves, first_job_id=1)
    backend = StudyCluster([], [run], cl, table())
    policy = StaticTrialsPolicy(run.job_ids)
    snap = backend.snapshot(0, 0.0, 360.0, None)
    d = policy.allocate(snap)
    assert sorted(zip(d.placement.job.tolist(), d.placement.node.tolist(),
                      d.placement.count.tolist(), strict=True)) == [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
    backend.apply(backend.reconcile(snap, d), 0.0)
    snap2 = backend.snapshot(1, 5.0, 360.0, None)
    assert policy.allocate(snap2).placement.by_job() == d.placement.by_job()


def test_the_static_pool_is_the_studys_only_while_it_lives() -> None:
    cl = ClusterSpec.uniform([("fast", 2)])
    run = StudyRun(spec(Rule.NONE, trials=1, max_steps=8.0, rungs=1), LearningCurves(1),
                   first_job_id=50)
    other = Job(1, MODEL, 2, 1000.0, 0.0)
    policy = StaticTrialsPolicy(run.job_ids, pool=[0], inner=make_policy("hadar"))
    res = simulate_studies([other], [run], cl, table(), policy)
    # the trial (0.8 s on node 0) first; the 2-GPU job (20 steps/s) needs both nodes: after
    assert res.others_completed == 1
    assert res.others_avg_jct_s == pytest.approx(0.8 + 1000.0 / 20.0, abs=1e-6)


def test_a_trial_left_alone_spreads_over_the_gpus_its_study_freed_at_once() -> None:
    # Two trials of one rung (4,000 steps) on 3 fast (10 steps/s) GPUs and a slow one (2):
    # each may run as 2 copies (4 GPUs over 2 live trials); dealt fastest first to the trial
    # with the most time left (HadarEPolicy.balance_spread), trial 1 has two fast GPUs (20
    # steps/s), trial 2 a fast and the slow one (12).  A round of a forked job pays one
    # consolidation, c = 2 s + 100 MB at 10 s/GB.  Trial 1 ends at 4000 / 20 + c, trial 2 has
    # then 1,600 steps left; the epoch trial 1's end brings forward is a fill, and there trial
    # 2, alone now (4 copies allowed), takes the two fast GPUs too (HadarEPolicy.fill_running):
    # its 1,600 steps at 32 steps/s after one more consolidation.  Waiting for the next full
    # epoch (360 s) it would run at 12 steps/s until then.
    c = 2.0 + 100.0 / 1024.0 * 10.0
    cl = ClusterSpec.uniform([("fast", 3), ("slow", 1)])
    run = StudyRun(spec(Rule.NONE, trials=2, max_steps=4000.0, rungs=1), LearningCurves(2),
                   first_job_id=1)
    res = simulate_studies([], [run], cl, table(), make_policy("hadare"))
    first = 4000.0 / 20.0 + c
    assert res.result.finish.tolist() == pytest.approx([first, first + c + 1600.0 / 32.0])
    assert res.result.copies == [(0.0, {1: 2, 2: 2}), (pytest.approx(first), {2: 4})]
    fill = res.result.records[1]
    assert fill.start == pytest.approx(first) and (fill.full, fill.moves) == (False, 1)


def test_few_live_trials_may_fork_over_the_cluster() -> None:
    cl = ClusterSpec.uniform([("fast", 6)])
    run = StudyRun(spec(Rule.NONE, trials=4), LearningCurves(4), first_job_id=1)
    backend = StudyCluster([], [run], cl, table())
    snap = backend.snapshot(0, 0.0, 360.0, None)
    assert snap.max_copies is not None and snap.max_copies.tolist() == [2, 2, 2, 2]
    # and HadarE offers them that cap whatever their length (the other jobs: when long)
    assert snap.spread is not None and snap.spread.tolist() == [True, True, True, True]
    # each trial's path to its study's end: the rungs after the one it trains toward (rung 0,
    # 200 of 800 steps); without a halving rule every trial goes on through them
    assert snap.after is not None and snap.after.tolist() == [600.0] * 4
    one = StudyCluster([], [StudyRun(spec(Rule.SH, trials=2, rungs=1), LearningCurves(2),
                                     first_job_id=1)], cl, table()).snapshot(0, 0.0, 360.0, None)
    assert one.after is not None and one.after.tolist() == [0.0, 0.0]
    res = simulate_studies([], [StudyRun(spec(Rule.NONE, trials=1), LearningCurves(1),
                                         first_job_id=1)], cl, table(), make_policy("hadare"))
    assert res.result.max_copies > 1  # one trial, six GPUs: HadarE forks it


def test_a_study_keeps_its_weight_as_its_trials_are_stopped() -> None:
    # 48 trials, 12 left after two halvings by 2: each weighs 4; a study of fewer trials than
    # are offered (never: the offered are its trials) weighs 1 a trial, never less.
    assert [trial_weight(48, k) for k in (48, 24, 12, 3, 1)] == [1.0, 2.0, 4.0, 16.0, 48.0]
    assert trial_weight(4, 8) == 1.0 and trial_weight(4, 0) == 4.0


def test_the_trials_a_halving_keeps_weigh_what_the_stopped_ones_did() -> None:
    # sh, 4 trials, rungs of 400 and 800 steps, eta 2, on 5 equal GPUs beside one other job
    # (weight 3, work that outlasts the study): the four trials report rung 0 at once, the
    # rule keeps 2, and each of those weighs 4 / 2 = 2 (times its own 1); the other job keeps
    # its 3 throughout.
    seen: list[tuple[list[int], list[float]]] = []
    inner = make_policy("hadar")

    class Recording:
        name = "recording"

        def allocate(self, snapshot: Snapshot) -> Decision:
            seen.append((snapshot.job_ids.tolist(), snapshot.weight.tolist()))
            return inner.allocate(snapshot)

    cl = ClusterSpec.uniform([("fast", 5)])
    run = StudyRun(spec(Rule.SH, trials=4, rungs=2), LearningCurves(4), first_job_id=1)
    other = Job(9, MODEL, 1, 40_000.0, 0.0, weight=3.0)
    simulate_studies([other], [run], cl, table(), Recording())
    assert seen[0] == ([1, 2, 3, 4, 9], [1.0, 1.0, 1.0, 1.0, 3.0])
    # (the epoch the reports bring forward offers the jobs without GPUs: the two promoted)
    promoted = [(ids, w) for ids, w in seen if 9 not in ids and ids]
    assert promoted and len(promoted[0][0]) == 2 and promoted[0][1] == [2.0, 2.0], seen
    assert all(w[ids.index(9)] == 3.0 for ids, w in seen if 9 in ids)


def test_trial_ids_must_not_collide() -> None:
    run = StudyRun(spec(trials=2), LearningCurves(2), first_job_id=1)
    with pytest.raises(ValueError, match="collide"):
        StudyCluster([Job(2, MODEL, 1, 10.0, 0.0)], [run], one_gpu(), table())


def test_study_run_needs_one_curve_per_trial() -> None:
    with pytest.raises(ValueError, match="curves"):
        StudyRun(spec(trials=3), LearningCurves(2), first_job_id=1)


# -- the benchmark ------------------------------------------------------------------------------

def test_bench_studies_writes_every_run_and_its_checks(tmp_path: Path) -> None:
    from bench import studies

    out = tmp_path / "studies.json"
    assert studies.main(["--only", "lm-32", "--scenario", "alone", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    runs = [r["run"] for r in rows if "run" in r]
    assert runs == ["array", "static-asha", "static-sh", "static-hb", "ours-asha", "ours-sh",
                    "ours-hb", "static-asha/k80", "static-asha/p100"]
    check = next(r for r in rows if r.get("check"))
    assert check["same_best_sh"] is True  # synchronous halving decides on reports alone
    assert check["same_best_hb"] is True  # (so do Hyperband's brackets)
    by = {r["run"]: r for r in rows if "run" in r}
    assert by["array"]["stopped_at"] == [0, 0, 0]
    assert by["array"]["best_trial"] == by["array"]["oracle_trial"]
    assert all(math.isfinite(r["time_to_best_s"]) for r in by.values())
    assert np.isclose(check["sh_speedup"],
                      by["static-sh"]["time_to_best_s"] / by["ours-sh"]["time_to_best_s"],
                      rtol=1e-2)
    assert np.isclose(check["hb_speedup"],
                      by["static-hb"]["time_to_best_s"] / by["ours-hb"]["time_to_best_s"],
                      rtol=1e-2)
    # alone, no schedule beats the study's fluid time: ours-sh is at most that much faster
    assert by["static-sh"]["sh_fluid_s"] > 0
    assert check["sh_speedup_reachable"] == pytest.approx(
        by["static-sh"]["time_to_best_s"] / by["static-sh"]["sh_fluid_s"], rel=1e-2)
    assert check["sh_speedup"] <= check["sh_speedup_reachable"]
    # static ASHA with the nodes listed K80s first and P100s first: the checks gather its bests
    assert by["static-asha/k80"]["node_order"] == ["k80", "p100", "v100"]
    bests = {by[k]["best_trial"] for k in ("static-asha", "static-asha/k80", "static-asha/p100")}
    assert check["asha_static_bests"] == sorted(bests)
    assert check["same_best_asha_any_order"] is (by["ours-asha"]["best_trial"] in bests)
    # Hyperband's last bracket (rung 2 of lm-32's 3) trains its trials to the end unstopped,
    # so it sends more trials to the last rung than sh, which halves all of them from rung 0
    assert sum(by["ours-hb"]["stopped_at"]) < sum(by["ours-sh"]["stopped_at"])


def test_bench_studies_runs_draws_from_the_first_one_asked(tmp_path: Path) -> None:
    # --first-draw K starts the draws at K (other trials' curves, seeds case.seed + 1000 K):
    # draws no one tuned on, without running the ones before them
    from bench import studies

    out = tmp_path / "later.json"
    assert studies.main(["--only", "recsys-48", "--scenario", "alone", "--first-draw", "5",
                         "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["draw"] for r in rows} == {5}
    assert [r["case"] for r in rows if r.get("check")] == ["recsys-48"]


def test_bench_studies_weighs_the_other_jobs_against_their_run_without_the_study() -> None:
    from bench import studies

    def row(run: str, jct: float, to_best: float = 3600.0) -> dict[str, object]:
        return {"case": "c", "scenario": "mixed", "draw": 0, "run": run,
                "time_to_best_s": to_best, "best_trial": 1, "best_final": 0.9,
                "oracle_trial": 1, "stopped_at": [0], "others_avg_jct_s": jct}

    rows = [{"case": "c", "scenario": "mixed", "draw": 0, "run": "no study",
             "others_avg_jct_s": 1000.0}]
    rows += [row(r, 1000.0, 7200.0) for r in ("array", "static-asha", "static-sh")]
    rows += [row("static-hb", 900.0, 7200.0), row("ours-asha", 1020.0), row("ours-sh", 990.0),
             row("ours-hb", 990.0)]
    (v,) = studies.verdicts(rows)
    # ours over static (the goal) and each over the run without the study: under hyperband
    # ours is 10% above the static run's, but 1% below the other jobs' run without the study
    assert v["others_jct_ratio_hb"] == 1.1
    assert v["others_vs_no_study_hb"] == [0.99, 0.9]
    assert v["others_vs_no_study_asha"] == [1.02, 1.0]
    assert "hb 0.990, 0.900" in studies.table_text(rows, [v])


def test_the_sh_fluid_time_is_every_rungs_work_over_the_clusters_rate() -> None:
    # recsys-48: 48 trials, eta 4, 3 rungs at M/16, M/4 and M steps; synchronous halving
    # sends 12 on, then 3: 48 M/16 + 12 (M/4 - M/16) + 3 (M - M/4) = 3 M + 2.25 M + 2.25 M.
    # Per GPU the better of one trial alone and two sharing it: on a P100 two do 1.25 times
    # one's work (the table's 19.24 steps/s each against 30.74 alone), on a K80 0.82 times,
    # on a V100 0.44 times.
    from bench import studies

    case = next(c for c in studies.CASES if c.name == "recsys-48")
    table = default_table()
    cl = studies.cluster()
    m = case.spec(table, Rule.SH).max_steps
    alone = {t: table.rate(case.job_type, 1, t) for t in ("v100", "p100", "k80")}
    pair = {t: sum(table.colocated.pair_rate(case.job_type, case.job_type, 1, t))
            for t in alone}
    assert pair["p100"] > alone["p100"] and pair["k80"] < alone["k80"]
    rate = 4 * (alone["v100"] + pair["p100"] + alone["k80"])
    assert studies.sh_fluid_s(case, table, cl) == pytest.approx(7.5 * m / rate)
