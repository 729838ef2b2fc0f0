"""The node matcher (:func:`hadar_slurm.policy.matching.match_nodes`) on scenarios worked by
hand; the core's matching rules themselves are checked against their NumPy twin in
``test_core_twins.py``."""

from __future__ import annotations

import dataclasses

import numpy as np

from hadar_slurm.policy.base import Placement, Snapshot
from hadar_slurm.policy.matching import match_nodes, uneven_jobs


def snapshot(scale: list[int], current: Placement) -> Snapshot:
    """Type a on nodes 0 and 1 (4 GPUs each), type b on node 2 (4 GPUs); jobs 0.. of the
    given GPU counts, every one runnable on both types."""
    n = len(scale)
    return Snapshot(
        epoch=1, now=360.0, round_s=360.0, gpu_types=("a", "b"),
        node_names=("n0", "n1", "n2"), node_type=np.array([0, 0, 1]),
        node_gpus=np.array([4, 4, 4]), job_ids=np.arange(n, dtype=np.int64),
        job_types=("x",) * n, arrival=np.zeros(n), total=np.full(n, 100.0),
        remaining=np.full(n, 100.0), scale=np.array(scale, dtype=np.int64),
        weight=np.ones(n), sync=np.ones(n, dtype=np.bool_), rate=np.ones((n, 2)),
        attained=np.zeros((n, 2)), current=current,
    )


def rows(placement: Placement) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for j, nd, c in zip(placement.job.tolist(), placement.node.tolist(),
                        placement.count.tolist(), strict=True):
        out.setdefault(j, []).append((nd, c))
    return out


def test_a_move_slurm_cannot_express_leaves_the_job_where_it_runs() -> None:
    # Job 0 (4 GPUs) runs on node 2 (type b) and the counts move it to type a, where jobs 1
    # (1 GPU on node 0) and 2 (3 GPUs on node 1) stay: a has 3 + 1 GPUs free, on two nodes.
    # Job 3 (4 GPUs, waiting) is given type b, the GPUs job 0 leaves.  Matched freely, job 0
    # gets node 0: 3 and node 1: 1 (the fullest-free nodes first), which one Slurm job cannot
    # ask for (a GPU count per node).  With even gangs, job 0 stays on node 2, and job 3, whose
    # GPUs job 0 still holds, is not placed (not placed on GPUs it could not start on).
    current = Placement(np.array([0, 1, 2]), np.array([2, 0, 1]), np.array([4, 1, 3]))
    snap = snapshot([4, 1, 3, 4], current)
    counts = np.array([[4, 0], [1, 0], [3, 0], [0, 4]], dtype=np.int64)
    order = np.array([0, 1, 2, 3], dtype=np.int64)

    free, placed = match_nodes(snap, counts, order)
    assert rows(free)[0] == [(0, 3), (1, 1)]
    assert rows(free)[3] == [(2, 4)]
    assert uneven_jobs(snap, free).tolist() == [0]
    assert placed.tolist() == [True, True, True, True]

    even, placed = match_nodes(dataclasses.replace(snap, even_gangs=True), counts, order)
    assert rows(even) == {0: [(2, 4)], 1: [(0, 1)], 2: [(1, 3)]}
    assert placed.tolist() == [True, True, True, False]


def test_a_waiting_job_without_an_even_placement_waits() -> None:
    # Jobs 1 and 2 as above; job 0 (4 GPUs) waits and is given type a: 3 + 1 free.  With even
    # gangs it is not placed; a 2-GPU job behind it still fits on node 0 and is.
    current = Placement(np.array([1, 2]), np.array([0, 1]), np.array([1, 3]))
    snap = dataclasses.replace(snapshot([4, 1, 3, 2], current), even_gangs=True)
    counts = np.array([[4, 0], [1, 0], [3, 0], [2, 0]], dtype=np.int64)
    out, placed = match_nodes(snap, counts, np.array([0, 1, 2, 3], dtype=np.int64))
    assert rows(out) == {1: [(0, 1)], 2: [(1, 3)], 3: [(0, 2)]}
    assert placed.tolist() == [False, True, True, True]


def test_a_running_job_whose_new_gpus_do_not_come_free_keeps_its_own() -> None:
    # Job 0 (4 GPUs) runs on node 2 (type b) and is planned onto type a, where its move is
    # uneven (3 + 1 free on nodes 0 and 1), so with even gangs it stays on node 2.  Job 3 (1
    # GPU) runs on node 0 and is planned onto type b, which job 0 still holds: it is not
    # placed.  Job 1 (1 GPU) runs on node 0 and job 2 (3 GPUs) on node 1, both planned where
    # they are.  Without keep_running job 3 would be stopped while its GPU on node 0 idles;
    # with it, job 3 keeps that GPU (node 0 has 4: job 1's, job 3's, and 2 idle).
    current = Placement(np.array([0, 1, 2, 3]), np.array([2, 0, 1, 0]),
                        np.array([4, 1, 3, 1]))
    snap = dataclasses.replace(snapshot([4, 1, 3, 1], current), even_gangs=True)
    counts = np.array([[4, 0], [1, 0], [3, 0], [0, 1]], dtype=np.int64)
    order = np.array([0, 1, 2, 3], dtype=np.int64)

    plain, placed = match_nodes(snap, counts, order)
    assert 3 not in rows(plain) and placed.tolist() == [True, True, True, False]

    kept, placed = match_nodes(snap, counts, order, keep_running=True)
    assert rows(kept) == {0: [(2, 4)], 1: [(0, 1)], 2: [(1, 3)], 3: [(0, 1)]}
    assert placed.tolist() == [True, True, True, True]


def test_a_running_job_keeps_its_gpus_only_where_no_job_placed_before_it_took_them() -> None:
    # Job 1 (4 GPUs, waiting) is planned onto type b (node 2), where job 0 (2 GPUs) runs; job
    # 0 is planned onto type a, whose nodes 0 and 1 are full (jobs 2 and 3, 4 GPUs each, stay).
    # Job 0 cannot move and its GPUs went to job 1, first in the order: it is not kept.  A job
    # that never ran (no GPUs held) is never "kept" either.
    current = Placement(np.array([0, 2, 3]), np.array([2, 0, 1]), np.array([2, 4, 4]))
    snap = snapshot([2, 4, 4, 4, 1], current)
    counts = np.array([[2, 0], [0, 4], [4, 0], [4, 0], [1, 0]], dtype=np.int64)
    order = np.array([1, 2, 3, 0, 4], dtype=np.int64)
    kept, placed = match_nodes(snap, counts, order, keep_running=True)
    assert rows(kept) == {1: [(2, 4)], 2: [(0, 4)], 3: [(1, 4)]}
    assert placed.tolist() == [False, True, True, True, False]
