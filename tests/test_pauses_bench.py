"""``bench.pauses``: a job stopped for one round and started again, counted by hand."""

from __future__ import annotations

from collections import Counter

from bench.pauses import pauses


def test_a_job_off_for_one_full_epoch_between_two_on_is_one_pause() -> None:
    # Job 1 runs, stops, runs, stops, runs: two pauses.  Job 3 runs at the second and fourth
    # epochs and not at the third: one.  Job 2 stops for three epochs: not a one-round pause.
    running = [frozenset(s) for s in ({1, 2}, {3}, {1}, {3}, {1, 2})]
    assert pauses(running) == Counter({1: 2, 3: 1})


def test_a_job_that_ends_or_waits_is_no_pause() -> None:
    assert pauses([frozenset({1}), frozenset(), frozenset()]) == Counter()
    assert pauses([frozenset({1})]) == Counter()
    assert pauses([]) == Counter()


def test_every_gap_of_one_epoch_counts() -> None:
    # 1 and 2 both pause at the second epoch; 2 again at the fourth.
    running = [frozenset(s) for s in ({1, 2}, set(), {1, 2}, {1}, {1, 2})]
    assert pauses(running) == Counter({1: 1, 2: 2})
