"""Two steps of Hadar's decision made faster (plain Python over each job's few types, and the
mixed gangs found at once) against the versions they replace, kept here as references: the
same per-type counts on random plans, busy and idle clusters, synchronous and not, with moves
that cost and that do not.  The scenarios worked by hand are in test_hadar_policy.py and
test_gangs.py."""

from __future__ import annotations

import numpy as np
import pytest

from hadar_slurm.policy.base import BoolArray, FloatArray, IntArray
from hadar_slurm.policy.gangs import _slow_gpus_for, exchange_fast_gpus
from hadar_slurm.policy.hadar import upgrade_idle


def upgrade_idle_reference(alloc: IntArray, current: IntArray, worker_rate: FloatArray,
                           sync: BoolArray, order: IntArray, capacity: IntArray, round_s: float,
                           migration_s: float) -> IntArray:
    """The numpy version :func:`upgrade_idle` had (the reference)."""
    out = alloc.copy()
    free = capacity - out.sum(axis=0)
    moved_share = max(round_s - migration_s, 0.0) / round_s

    def share(i: int, row: IntArray) -> float:
        """The share of the round job ``i`` works on ``row``: all of it where it holds it."""
        return 1.0 if (current[i] == row).all() else moved_share

    counts = out.sum(axis=1)
    for i in order[counts[order] > 0].tolist():
        top = int(free.max())
        if top <= 0:
            break  # no GPU idle: nothing can move (a move idles only what it leaves)
        row = out[i]
        count = int(counts[i])
        if count > top + int(row.max()):
            continue  # fits whole on no type, its own GPUs there and the idle ones counted
        on = row > 0
        if sync[i]:
            speed = float(worker_rate[i][on].min()) * count
        else:
            speed = float((worker_rate[i] * row).sum())
        best = None
        best_prog = speed * share(i, row)
        for h in range(capacity.shape[0]):
            if int(free[h]) + int(row[h]) < count or worker_rate[i, h] * count <= speed:
                continue
            whole = np.zeros_like(row)
            whole[h] = count
            prog = float(worker_rate[i, h]) * count * share(i, whole)
            if prog > best_prog * (1.0 + 1e-9):
                best, best_prog = whole, prog
        if best is not None:
            free += row - best
            out[i] = best
    return out



def exchange_fast_gpus_reference(alloc: IntArray, current: IntArray, remaining: FloatArray,
                       worker_rate: FloatArray, sync: BoolArray, order: IntArray,
                       capacity: IntArray, migration_s: float) -> IntArray:
    """The version :func:`exchange_fast_gpus` had before it looked at the mixed gangs alone
    (the reference)."""
    out = alloc.copy()
    n, num_types = out.shape
    if n == 0 or num_types < 2:
        return out
    for g in order.tolist():
        if not sync[g]:
            continue
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



def plan(seed: int) -> tuple[IntArray, IntArray, FloatArray, FloatArray, BoolArray, IntArray,
                              IntArray]:
    """A random plan: jobs of 1 to 8 GPUs over 2 to 5 types, some spread over several, some
    idle capacity (or none), a current placement that partly agrees."""
    rng = np.random.default_rng(seed)
    n, t = int(rng.integers(1, 60)), int(rng.integers(2, 6))
    alloc = np.zeros((n, t), dtype=np.int64)
    for i in range(n):
        if rng.random() < 0.2:
            continue  # not placed
        k = int(rng.choice([1, 1, 2, 4, 8]))
        if rng.random() < 0.3:
            for _ in range(k):
                alloc[i, int(rng.integers(t))] += 1
        else:
            alloc[i, int(rng.integers(t))] = k
    current = np.where(rng.random((n, 1)) < 0.5, alloc, 0)
    rate = rng.uniform(0.1, 5.0, size=(n, t)) * (rng.random((n, t)) > 0.1)
    rate = np.where(alloc > 0, np.maximum(rate, 0.05), rate)
    sync = rng.random(n) < 0.6
    capacity = alloc.sum(axis=0) + rng.integers(0, 9, size=t) * (rng.random() < 0.7)
    order = rng.permutation(n)
    return alloc, current, rate, rng.uniform(10, 1000, size=n), sync, order, capacity


@pytest.mark.parametrize("seed", range(300))
def test_upgrade_idle_is_what_it_was(seed: int) -> None:
    alloc, current, rate, _rem, sync, order, capacity = plan(seed)
    for migration_s in (0.0, 120.0, 400.0):
        got = upgrade_idle(alloc, current, rate, sync, order, capacity, 360.0, migration_s)
        want = upgrade_idle_reference(alloc, current, rate, sync, order, capacity, 360.0,
                                      migration_s)
        assert np.array_equal(got, want) and got.dtype == want.dtype


@pytest.mark.parametrize("seed", range(300))
def test_exchange_fast_gpus_is_what_it_was(seed: int) -> None:
    alloc, current, rate, remaining, sync, order, capacity = plan(seed)
    for migration_s in (0.0, 60.0):
        got = exchange_fast_gpus(alloc, current, remaining, rate, sync, order, capacity,
                                 migration_s)
        want = exchange_fast_gpus_reference(alloc, current, remaining, rate, sync, order,
                                            capacity, migration_s)
        assert np.array_equal(got, want)


def test_the_random_plans_exercise_both_steps() -> None:
    # (the comparisons above mean something only if the steps change plans)
    moved = exchanged = 0
    for seed in range(300):
        alloc, current, rate, remaining, sync, order, capacity = plan(seed)
        moved += not np.array_equal(
            upgrade_idle(alloc, current, rate, sync, order, capacity, 360.0, 0.0), alloc)
        exchanged += not np.array_equal(
            exchange_fast_gpus(alloc, current, remaining, rate, sync, order, capacity, 0.0),
            alloc)
    assert moved >= 50 and exchanged >= 10, (moved, exchanged)
