"""Mixed synchronous gangs give their fast GPUs to jobs that use them
(:func:`hadar_slurm.policy.gangs.exchange_fast_gpus`), on scenarios worked by hand.

Two types, 0 = fast (one GPU) and 1 = slow (four GPUs).  Gang ``g`` (job 0, 4 GPUs, synchronous)
is planned on the fast GPU and three slow ones: it runs at its slow workers' pace, 4 x 4 = 16
steps/s, so the fast GPU does no more than a slow one would.  Job 1 (1 GPU) is planned on the
fourth slow GPU, where it runs now: 4 steps/s there, 10 on the fast type.
"""

from __future__ import annotations

import numpy as np

from hadar_slurm.policy.gangs import exchange_fast_gpus

ALLOC = np.array([[1, 3], [0, 1]], dtype=np.int64)
RATE = np.array([[8.0, 4.0], [10.0, 4.0]])  # steps/s per worker
ORDER = np.array([0, 1], dtype=np.int64)
CAP = np.array([1, 4], dtype=np.int64)
REMAINING = np.array([40000.0, 1000.0])


def _run(current: list[list[int]], migration_s: float, sync: bool = True,
         capacity: np.ndarray = CAP, alloc: np.ndarray = ALLOC) -> list[list[int]]:
    out = exchange_fast_gpus(alloc, np.array(current, dtype=np.int64), REMAINING, RATE,
                             np.array([sync, True]), ORDER, capacity, migration_s)
    rows: list[list[int]] = out.tolist()
    return rows


def test_the_gangs_fast_gpu_goes_to_the_job_that_finishes_sooner_there() -> None:
    # job 1: 1000 / 4 = 250 s where it is; 1000 / 10 + 30 = 130 s after a 30 s move: swapped.
    # The gang runs on four slow GPUs, at the same 16 steps/s; every type keeps its count.
    assert _run([[0, 0], [0, 1]], migration_s=30.0) == [[0, 4], [1, 0]]


def test_no_swap_when_the_move_costs_more_than_it_saves() -> None:
    # 1000 / 10 + 200 = 300 s > 250 s: job 1 stays, and so does the plan
    assert _run([[0, 0], [0, 1]], migration_s=200.0) == ALLOC.tolist()
    # a job that does not hold its GPUs now starts either way: 100 s < 250 s, swapped
    assert _run([[0, 0], [0, 0]], migration_s=200.0) == [[0, 4], [1, 0]]


def test_no_swap_for_a_gang_already_running_on_the_fast_gpu_or_an_asynchronous_one() -> None:
    assert _run([[1, 3], [0, 1]], migration_s=30.0) == ALLOC.tolist()
    # an asynchronous job runs at the sum of its workers: its fast GPU is not wasted
    assert _run([[0, 0], [0, 1]], migration_s=30.0, sync=False) == ALLOC.tolist()


def test_an_idle_slow_gpu_is_taken_first_and_no_job_is_split() -> None:
    # with a fifth, idle slow GPU the gang takes it and job 1 stays where it is
    assert _run([[0, 0], [0, 1]], migration_s=30.0, capacity=np.array([1, 5])) == [
        [0, 4], [0, 1]]
    # a 2-GPU job on the slow type cannot make up the gang's one GPU exactly: no swap
    two = np.array([[1, 3], [0, 2]], dtype=np.int64)
    assert _run([[0, 0], [0, 2]], migration_s=0.0, capacity=np.array([1, 5]),
                alloc=two) == two.tolist()
