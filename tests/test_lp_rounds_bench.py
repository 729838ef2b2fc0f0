"""``bench.lp_rounds``: the configuration LP realized in rounds, and the bound for rounds that
all run their full length, on queues small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lp_rounds import ROUND_S, full_rounds_bound, realize
from hadar_slurm.costs import LiveCosts


def test_two_gangs_that_cannot_overlap_need_four_full_rounds() -> None:
    # One type of 2 GPUs; two 2-GPU jobs, each 1.1 rounds of work: 2 rounds each, never at
    # once, so 4 rounds; the last may end early, so more than 3 rounds' time.  (The fluid
    # bound is 2.2 rounds, 792 s.)
    work = np.array([1.1 * ROUND_S, 1.1 * ROUND_S])
    bound = full_rounds_bound(work, np.array([2, 2]), np.array([[1.0], [1.0]]), np.array([2]))
    assert bound == pytest.approx(3 * ROUND_S)


def test_one_gpu_jobs_round_up_their_rounds_and_share_the_type() -> None:
    # Three 1-GPU jobs of 1.5 rounds each on 2 GPUs: 2 rounds each, 6 GPU-rounds over 2 GPUs
    # is 3 rounds: more than 2 rounds' time.
    work = np.full(3, 1.5 * ROUND_S)
    bound = full_rounds_bound(work, np.ones(3, dtype=np.int64), np.ones((3, 1)), np.array([2]))
    assert bound == pytest.approx(2 * ROUND_S)


def test_a_gang_wider_than_its_fast_type_runs_at_the_slow_pace() -> None:
    # Types A (rate 2) and B (rate 1), one GPU each; a 2-GPU job cannot run on A alone, so it
    # runs on A and B at B's pace: 720 steps at 1 step/s is 2 rounds, so more than 1 round.
    bound = full_rounds_bound(np.array([2 * ROUND_S]), np.array([2]), np.array([[2.0, 1.0]]),
                              np.array([1, 1]))
    assert bound == pytest.approx(ROUND_S)


def test_realize_charges_the_start_and_ends_the_last_round_with_its_work() -> None:
    # Two 1-GPU jobs of one round's work on 2 GPUs: the LP runs both for 360 s.  The start
    # (``start_s``) costs each that much work, which the second round does in as long.
    costs = LiveCosts(restart_s=0.0)
    lp, made, jct, moves = realize(np.full(2, ROUND_S), np.ones(2, dtype=np.int64), np.ones((2, 1)),
                              np.array([2]), np.ones((2, 1), dtype=np.int64), costs)
    assert lp == pytest.approx(ROUND_S)
    assert made == pytest.approx(ROUND_S + costs.start_s)
    assert jct == pytest.approx(ROUND_S + costs.start_s)  # both end then
    assert moves == 2  # the two starts; staying put in the second round is no move


def test_realize_with_copies_runs_a_job_on_both_nodes() -> None:
    # One 1-GPU job of two rounds' work, two 1-GPU nodes, two copies allowed: the LP runs it
    # as two copies for one round; the copies' starts cost 2 * start_s of work, done at 2
    # steps/s in start_s seconds of the next round.
    costs = LiveCosts(restart_s=0.0)
    lp, made, _, _ = realize(np.array([2 * ROUND_S]), np.array([1]), np.array([[1.0]]),
                          np.array([2]), np.array([[2]]), costs, max_copies=2)
    assert lp == pytest.approx(ROUND_S)
    assert made == pytest.approx(ROUND_S + costs.start_s)
    # with one copy in all, two rounds (and the start's work in a third's beginning)
    lp, made, _, _ = realize(np.array([2 * ROUND_S]), np.array([1]), np.array([[1.0]]),
                             np.array([2]), np.array([[2]]), costs, max_copies=1)
    assert lp == pytest.approx(2 * ROUND_S)
    assert made == pytest.approx(2 * ROUND_S + costs.start_s)


def test_the_bench_refuses_a_negative_restart() -> None:
    from bench.lp_rounds import main

    with pytest.raises(SystemExit) as exc:
        main(["--restart-s", "-1", "--only", "gavel/static-gangs"])
    assert exc.value.code == 2
