"""Resource matching: from "job i gets k GPUs of type h" to concrete nodes.

This is the second of the two policy axes (queue order decides *who*, matching decides *where*):
policies decide per-type GPU counts, and :func:`match_nodes` turns them into a
:class:`~hadar_slurm.policy.base.Placement`.  Rules, in order:

1. **Stay put**: a job keeps the GPUs it held last epoch on the nodes it held them, as far as its
   new counts allow (no needless migration; in Slurm a move is a requeue).
2. **Best fit**: the rest goes, job by job in the given order, to the node of the right type
   with the fewest free GPUs that still holds the whole request (keeps large holes for large
   jobs and keeps a synchronous job on one node when one can hold it).
3. **Spread**: when no single node can hold it, the fullest-free nodes first (fewest nodes).

A job whose counts cannot all be met is left out entirely and reported in the returned mask:
partial placement of a synchronous job would waste the GPUs it got.

4. **Even gangs** (where the world demands it, ``Snapshot.even_gangs``: one Slurm job asks for
   the same GPU count on each of its nodes): a job the rules above spread over nodes with
   unequal counts is not moved there: a running job stays on the GPUs it holds, a waiting one
   waits; and the others are matched again around it, so that no job is placed on GPUs that
   one staying where it is still holds (the sidecar could not start it there).
5. **Stay rather than stop** (``keep_running``): a running job whose new counts cannot be met
   (rules 1 to 4 left it out) keeps the GPUs it holds, when no job placed before it took them:
   stopping it would leave them idle for the epoch (a plan that moves a job is worth a stop
   only where the job gets its new GPUs).  In ``order``, after every other job.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hadar_slurm import core
from hadar_slurm.policy.base import IntArray, Placement, Snapshot


def match_nodes(
    snapshot: Snapshot, counts: npt.NDArray[np.int64], order: IntArray, *,
    keep_running: bool = False,
) -> tuple[Placement, npt.NDArray[np.bool_]]:
    """Place ``counts[i, h]`` GPUs of type ``h`` for job index ``i``, jobs in ``order``.

    Returns the placement and ``placed[i]`` (True where the job got all it asked for, or, with
    ``keep_running``, kept what it held: rule 5; jobs with no counts at all are False).  Pure;
    the reference matcher scans a type's nodes per job (O(jobs x nodes of a type)); the
    compiled one reads them from bitsets by free GPUs (O(jobs x GPUs per node x nodes / 64)).
    """
    placement, placed = _even_match(snapshot, counts, order)
    if keep_running:
        placement, placed = _keep_running(snapshot, counts, order, placement, placed)
    return placement, placed


def _keep_running(snapshot: Snapshot, counts: npt.NDArray[np.int64], order: IntArray,
                  placement: Placement, placed: npt.NDArray[np.bool_]
                  ) -> tuple[Placement, npt.NDArray[np.bool_]]:
    """Rule 5: the running jobs with counts that the match left out keep their GPUs where
    they are still free, in ``order``."""
    held = snapshot.current_index()
    wanted = counts.sum(axis=1) > 0
    in_order = np.asarray(order, dtype=np.int64)
    left = in_order[wanted[in_order] & ~placed[in_order]].tolist()
    if not left or snapshot.current.job.shape[0] == 0:
        return placement, placed
    free = snapshot.node_gpus.astype(np.int64) - np.bincount(
        placement.node, weights=placement.count, minlength=snapshot.node_gpus.shape[0]
    ).astype(np.int64)
    cur = snapshot.current
    copy = cur.copy_index()
    add_job: list[int] = []
    add_node: list[int] = []
    add_count: list[int] = []
    placed = placed.copy()
    for i in left:
        rows = np.nonzero(held == i)[0]
        if rows.shape[0] == 0 or np.any(copy[rows] != 0):
            continue  # (not running, or running forked: its copies are the forker's)
        need = np.bincount(cur.node[rows], weights=cur.count[rows],
                           minlength=free.shape[0]).astype(np.int64)
        if np.any(need > free):
            continue
        free -= need
        placed[i] = True
        for r in rows:
            add_job.append(int(cur.job[r]))
            add_node.append(int(cur.node[r]))
            add_count.append(int(cur.count[r]))
    if not add_job:
        return placement, placed
    return Placement(np.concatenate([placement.job, np.array(add_job, dtype=np.int64)]),
                     np.concatenate([placement.node, np.array(add_node, dtype=np.int64)]),
                     np.concatenate([placement.count, np.array(add_count, dtype=np.int64)])
                     ), placed


def _even_match(
    snapshot: Snapshot, counts: npt.NDArray[np.int64], order: IntArray
) -> tuple[Placement, npt.NDArray[np.bool_]]:
    """Rules 1 to 4."""
    placement, placed = _match(snapshot, counts, order)
    if not snapshot.even_gangs:
        return placement, placed
    keep: IntArray | None = None  # per job and type, the GPUs it may keep where it runs
    for _ in range(snapshot.num_jobs):
        bad = uneven_jobs(snapshot, placement)
        if bad.shape[0] == 0:
            break
        if keep is None:
            keep = snapshot.held()
            keep[uneven_jobs(snapshot, snapshot.current)] = 0
        counts = counts.copy()
        counts[bad] = keep[bad]
        placement, placed = _match(snapshot, counts, order)
    return placement, placed


def uneven_jobs(snapshot: Snapshot, placement: Placement) -> IntArray:
    """Indices of the jobs ``placement`` puts on nodes with unequal GPU counts (rows of jobs
    not in the snapshot are ignored)."""
    if placement.job.shape[0] == 0 or snapshot.num_jobs == 0:
        return np.zeros(0, dtype=np.int64)
    pos = snapshot.index_of(placement.job)
    hit = pos >= 0
    lo = np.full(snapshot.num_jobs, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(snapshot.num_jobs, dtype=np.int64)
    np.minimum.at(lo, pos[hit], placement.count[hit])
    np.maximum.at(hi, pos[hit], placement.count[hit])
    return np.nonzero((hi > 0) & (lo < hi))[0].astype(np.int64)


def _match(
    snapshot: Snapshot, counts: npt.NDArray[np.int64], order: IntArray
) -> tuple[Placement, npt.NDArray[np.bool_]]:
    """The core's matcher (rules 1 to 3)."""
    cur = snapshot.current
    ids = snapshot.job_ids.astype(np.int64)
    rows_job, rows_node, rows_count, placed = core.match(
        np.ascontiguousarray(snapshot.node_type, dtype=np.int64),
        np.ascontiguousarray(snapshot.node_gpus, dtype=np.int64),
        np.ascontiguousarray(counts, dtype=np.int64),
        np.ascontiguousarray(order, dtype=np.int64),
        snapshot.current_index(),
        np.ascontiguousarray(cur.node, dtype=np.int64),
        np.ascontiguousarray(cur.count, dtype=np.int64),
    )
    placement = Placement(ids[rows_job], rows_node, rows_count)
    return placement, placed.astype(np.bool_)
