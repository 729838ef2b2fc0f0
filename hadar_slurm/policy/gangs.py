"""Gangs over GPU types: give the fast GPUs of a mixed synchronous gang to jobs that use them.

A synchronous job whose GPUs are of several types runs at its slowest worker's pace
(``count * min worker rate``): a GPU of a faster type in it does no more than one of its
slowest type would.  The planner, which levels work over types, can still plan such gangs
(e.g. a 4-GPU job on three V100s and one A100), and they cost twice: the fast GPU's speed is
lost, and where one Slurm job must ask for the same GPU count on each of its nodes
(``Snapshot.even_gangs``) a gang of 3 + 1 cannot run at all, so the job stays where it was and
the jobs planned onto its GPUs are stopped for nothing.

:func:`exchange_fast_gpus` swaps those fast GPUs with GPUs of the gang's slowest type held (in
the plan) by jobs that run faster on the fast type: the gang keeps its pace (its workers are
as slow as before), each job moved gains, and every type keeps its planned count.
"""

from __future__ import annotations

import numpy as np

from hadar_slurm.policy.base import BoolArray, FloatArray, IntArray


def exchange_fast_gpus(alloc: IntArray, current: IntArray, remaining: FloatArray,
                       worker_rate: FloatArray, sync: BoolArray, order: IntArray,
                       capacity: IntArray, migration_s: float) -> IntArray:
    """Per-type counts ``alloc[i, h]`` with the fast GPUs of mixed synchronous gangs swapped
    for GPUs of the gang's slowest type (see the module docstring).

    For each synchronous job ``g`` planned over several types, in ``order``, and each type
    ``f`` of it faster for ``g`` than its slowest type ``s``: its ``k`` GPUs of ``f`` are
    traded for ``k`` GPUs of ``s``: idle ones first, then those of jobs planned whole on ``s``
    (most gain first) that finish sooner on ``f`` (``remaining`` work at the whole job's rate
    there), a move's ``migration_s`` counted where the job holds its GPUs of ``s`` now
    (``current``).  The trade is made only
    when it yields exactly ``k`` GPUs of ``s`` (GPUs of ``f`` left over stay idle for the next
    steps), and never for a gang that holds GPUs of ``f`` now (it would restart for nothing).
    """
    out = alloc.copy()
    n, num_types = out.shape
    if n == 0 or num_types < 2:
        return out
    # (an exchange only ever leaves rows on fewer types: the mixed synchronous gangs of the
    # plan are all the jobs to look at, found at once)
    mixed = sync & ((out > 0).sum(axis=1) >= 2)
    for g in order[mixed[order]].tolist():
        used = np.nonzero(out[g] > 0)[0]
        if used.shape[0] < 2:
            continue
        s = int(used[np.argmin(worker_rate[g, used])])
        for f in used.tolist():
            k = int(out[g, f])
            if f == s or k == 0 or worker_rate[g, f] <= worker_rate[g, s]:
                continue
            if current[g, f] > 0:
                continue
            got = _slow_gpus_for(out, current, remaining, worker_rate, capacity, g, s, f, k,
                                 migration_s)
            if got is None:
                continue
            for j in got:
                c = int(out[j, s])
                out[j, s] = 0
                out[j, f] = c
            out[g, f] = 0
            out[g, s] += k
    return out


def _slow_gpus_for(out: IntArray, current: IntArray, remaining: FloatArray,
                   worker_rate: FloatArray, capacity: IntArray, g: int, s: int, f: int, k: int,
                   migration_s: float) -> list[int] | None:
    """The jobs whose GPUs of type ``s`` (with the idle ones) make exactly ``k`` for gang
    ``g`` in exchange for its GPUs of ``f``, or None."""
    idle = int(capacity[s] - out[:, s].sum())
    need = k - min(idle, k)
    if need == 0:
        return []
    counts = out.sum(axis=1)
    whole = np.nonzero((out[:, s] > 0) & (counts == out[:, s]))[0]
    cands: list[tuple[float, int]] = []
    for j in whole.tolist():
        if j == g or worker_rate[j, f] <= 0:
            continue
        c = int(out[j, s])
        if c > need:
            continue
        # where it holds its GPUs of s now, staying costs nothing and a move costs migration_s;
        # otherwise it starts (or moves) either way
        stays = bool(current[j, s] == c and current[j].sum() == c)
        before = float(remaining[j]) / (float(worker_rate[j, s]) * c)
        after = float(remaining[j]) / (float(worker_rate[j, f]) * c) + (
            migration_s if stays else 0.0)
        if after < before * (1.0 - 1e-9):
            cands.append((before - after, j))
    cands.sort(key=lambda x: (-x[0], x[1]))
    chosen: list[int] = []
    left = need
    for _gain, j in cands:
        c = int(out[j, s])
        if c <= left:
            chosen.append(j)
            left -= c
            if left == 0:
                return chosen
    return None
