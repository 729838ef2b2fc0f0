"""The lower bound on the average JCT of schedules that end by a horizon
(:mod:`hadar_slurm.sim.jct_bound`), on cases worked by hand, and its bench's argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from bench import jct_bound as bench_jct
from hadar_slurm.sim.jct_bound import config_jct_bound, fastest_times


def bound(work: list[float], scale: list[int], rate: list[list[float]], capacity: list[int],
          horizon: float, interval_s: float) -> float:
    value, exact = config_jct_bound(np.array(work), np.array(scale), np.array(rate),
                                    np.array(capacity), horizon, interval_s)
    assert exact
    return value


def test_one_job_alone_ends_after_its_work_at_its_fastest_rate() -> None:
    # 1,000 steps at 1 step/s on the one GPU: C = 1,000 s, and the bound is exact (the job's
    # work in each 100 s interval is the most it can do there, so the square's tangent is
    # tight)
    assert bound([1000.0], [1], [[1.0]], [1], 2000.0, 100.0) == pytest.approx(1000.0)


def test_shortest_first_on_one_gpu_within_half_an_interval() -> None:
    # 1,000 s and 3,000 s of work on one GPU: shortest first ends them at 1,000 and 4,000 s,
    # 2,500 s on average, the least any schedule has.  The bound is below it, by less than
    # the slack of the intervals' start times (half an interval at most per job).
    value = bound([1000.0, 3000.0], [1, 1], [[1.0], [1.0]], [1], 4000.0, 100.0)
    assert 2450.0 <= value <= 2500.0


def test_two_gangs_wider_than_half_a_type_run_one_after_the_other() -> None:
    # two 2-GPU jobs of 100 s on a 3-GPU type cannot run at once: the best schedule ends them
    # at 100 and 200 s, 150 s on average (a fluid relaxation would run 1.5 of them at a time
    # and average 133 s)
    value = bound([100.0, 100.0], [2, 2], [[1.0], [1.0]], [3], 400.0, 10.0)
    assert 145.0 <= value <= 150.0


def test_ending_by_the_makespan_bound_costs_the_short_job() -> None:
    # A fast and a slow GPU.  L: 1,000 steps, 1 step/s on the fast one, 0.5 on the slow; s: 100
    # steps, 1 and 0.1.  With time to spare, s runs first on the fast GPU (ends at 100 s) while
    # L starts on the slow one (50 steps), then L ends on the fast one at 1,050 s: 575 s on
    # average, the best there is.  To end both by 1,000 s, L must hold the fast GPU the whole
    # time, so s crawls on the slow one and ends at 1,000 s: 1,000 s on average.
    work, scale, rate, cap = [1000.0, 100.0], [1, 1], [[1.0, 0.5], [1.0, 0.1]], [1, 1]
    loose = bound(work, scale, rate, cap, 2000.0, 25.0)
    tight = bound(work, scale, rate, cap, 1000.0, 25.0)
    assert 560.0 <= loose <= 575.0
    assert loose + 150.0 < tight <= 1000.0
    # a horizon in between gives a bound in between
    assert loose <= bound(work, scale, rate, cap, 1025.0, 25.0) <= tight


def test_a_horizon_no_schedule_meets_gives_infinity() -> None:
    value, _ = config_jct_bound(np.array([1000.0]), np.array([1]), np.array([[1.0]]),
                                np.array([1]), 500.0, 100.0)
    assert value == float("inf")


def test_fastest_times_take_the_fastest_type_with_room() -> None:
    # a 4-GPU job fits only on the 4-GPU type, slower for it than the 2-GPU one
    p = fastest_times(np.array([100.0, 100.0]), np.array([1, 4]),
                      np.array([[1.0, 2.0], [1.0, 2.0]]), np.array([4, 2]), mixed=False)
    assert p.tolist() == pytest.approx([50.0, 100.0])


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="fits on no GPU type"):
        config_jct_bound(np.array([10.0]), np.array([4]), np.array([[1.0]]), np.array([2]),
                         100.0, 10.0)
    with pytest.raises(ValueError, match="horizon and interval_s must be > 0"):
        config_jct_bound(np.array([10.0]), np.array([1]), np.array([[1.0]]), np.array([1]),
                         0.0, 10.0)
    assert config_jct_bound(np.array([0.0]), np.array([1]), np.array([[1.0]]), np.array([1]),
                            10.0, 1.0) == (0.0, True)


def test_the_bench_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_jct.main(["--slack", "-0.1", "--json", "/dev/null"]) == 2
    assert "--slack must be >= 0" in capsys.readouterr().err
    assert bench_jct.main(["--interval-s", "0", "--json", "/dev/null"]) == 2
    assert "--interval-s must be > 0" in capsys.readouterr().err
    assert bench_jct.main(["--only", "nowhere/static-gangs", "--json", "/dev/null"]) == 2
    assert "no static trace is named nowhere/static-gangs" in capsys.readouterr().err


def test_the_makespan_lp_hands_its_configurations_on() -> None:
    # two 2-GPU jobs on a 3-GPU type: every configuration the makespan LP used holds one of
    # them (as the whole-job rate it runs at), never both
    from hadar_slurm.sim.bounds import config_makespan_bound

    cols: list[np.ndarray] = []
    value, exact = config_makespan_bound(np.array([100.0, 100.0]), np.array([2, 2]),
                                         np.array([[1.0], [1.0]]), np.array([3]), columns=cols)
    assert exact and value == pytest.approx(200.0)
    assert cols and all(int((c > 0).sum()) == 1 for c in cols)


def test_the_bench_bounds_a_schedule_that_ends_within_its_horizon() -> None:
    # dgx/static-1gpu of seed base 0 (one-GPU jobs, the quick kind), 2-hour intervals and 5 s
    # of column generation: a weak bound, but a bound.  Hadar's run ends within 1.03x the gang
    # bound there, so its average JCT cannot be below it.
    rows = bench_jct.measure([0], ["dgx/static-1gpu"], 0.03, 7200.0, 5.0)
    assert len(rows) == 1
    row = rows[0]
    assert row["trace"] == "dgx/static-1gpu" and row["horizon_s"] > row["gang_bound_s"]
    assert row["hadar_makespan_over_bound"] <= 1.03
    assert 0.0 < row["jct_bound_s"] <= row["hadar_jct_s"]
    assert row["goals_clash"] == (row["jct_bound_s"] > row["best_baseline_jct_s"])
