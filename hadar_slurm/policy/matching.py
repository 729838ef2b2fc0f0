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

from hadar_slurm.policy.base import IntArray, Placement, Snapshot


def match_nodes(
    snapshot: Snapshot, counts: npt.NDArray[np.int64], order: IntArray
) -> tuple[Placement, npt.NDArray[np.bool_]]:
    """Place ``counts[i, h]`` GPUs of type ``h`` for job index ``i``, jobs in ``order``.

    Returns the placement and ``placed[i]`` (True where the job got all it asked for; jobs with
    no counts at all are False).  Pure; O(jobs x nodes of a type) in the worst case.
    """
    num_nodes = snapshot.node_gpus.shape[0]
    free = snapshot.node_gpus.astype(np.int64).copy()
    node_type = snapshot.node_type
    nodes_of_type = [np.nonzero(node_type == h)[0] for h in range(len(snapshot.gpu_types))]
    want = counts.astype(np.int64).copy()
    index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}

    # 1. Stay put.
    kept: dict[int, list[tuple[int, int]]] = {}
    cur = snapshot.current
    for j, n, c in zip(cur.job.tolist(), cur.node.tolist(), cur.count.tolist(), strict=True):
        i = index_of.get(j)
        if i is None or n >= num_nodes:
            continue
        h = int(node_type[n])
        take = min(c, int(want[i, h]), int(free[n]))
        if take > 0:
            free[n] -= take
            want[i, h] -= take
            kept.setdefault(i, []).append((n, take))

    rows_job: list[int] = []
    rows_node: list[int] = []
    rows_count: list[int] = []
    placed = np.zeros(snapshot.num_jobs, dtype=np.bool_)
    for i in order.tolist():
        if counts[i].sum() <= 0:
            continue
        rows = list(kept.get(i, []))
        trial = free.copy()
        ok = True
        for h in np.nonzero(want[i] > 0)[0].tolist():
            need = int(want[i, h])
            cand = nodes_of_type[h]
            fits = cand[trial[cand] >= need]
            if fits.shape[0]:
                n = int(fits[np.argmin(trial[fits])])
                trial[n] -= need
                rows.append((n, need))
                continue
            for n in cand[np.argsort(-trial[cand], kind="stable")].tolist():
                if need == 0 or trial[n] == 0:
                    break
                take = min(need, int(trial[n]))
                trial[n] -= take
                need -= take
                rows.append((n, take))
            if need > 0:
                ok = False
                break
        if not ok:
            # Give back what it kept: a partial synchronous job wastes GPUs.
            for n, c in kept.get(i, []):
                free[n] += c
            continue
        free = trial
        placed[i] = True
        jid = int(snapshot.job_ids[i])
        merged: dict[int, int] = {}
        for n, c in rows:
            merged[n] = merged.get(n, 0) + c
        for n, c in sorted(merged.items()):
            rows_job.append(jid)
            rows_node.append(n)
            rows_count.append(c)
    placement = Placement(
        np.asarray(rows_job, dtype=np.int64),
        np.asarray(rows_node, dtype=np.int64),
        np.asarray(rows_count, dtype=np.int64),
    )
    return placement, placed
