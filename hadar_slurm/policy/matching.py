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
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hadar_slurm import core
from hadar_slurm.policy.base import IntArray, Placement, Snapshot


def match_nodes(
    snapshot: Snapshot, counts: npt.NDArray[np.int64], order: IntArray
) -> tuple[Placement, npt.NDArray[np.bool_]]:
    """Place ``counts[i, h]`` GPUs of type ``h`` for job index ``i``, jobs in ``order``.

    Returns the placement and ``placed[i]`` (True where the job got all it asked for; jobs with
    no counts at all are False).  Pure; O(jobs x nodes of a type) in the worst case.
    """
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
