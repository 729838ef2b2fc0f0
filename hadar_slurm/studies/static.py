"""The baseline a study gets on Slurm today: a static allocation, one GPU per trial.

:class:`StaticTrialsPolicy` runs a study's trials as a Slurm job array runs them: each trial on
one GPU, first fit over the nodes in their order, blind to GPU type; a trial keeps its GPU while
it trains and is never moved; trials that go on after a rung (their work grew) come before
trials that have not started, and resume on the GPU type they ran on when one is free.  The
trials may use the nodes of ``pool`` only (all nodes when None); the other jobs of the cluster
are scheduled by ``inner`` on the remaining nodes while a trial lives, and on all of them after
(a static partition for the study's life).  A pure function of the
snapshot, as every policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from hadar_slurm.policy.base import Decision, Placement, Policy, Reason, Snapshot

__all__ = ["StaticTrialsPolicy", "select_jobs"]


def select_jobs(snapshot: Snapshot, keep: np.ndarray, node_gpus: np.ndarray) -> Snapshot:
    """``snapshot`` with the jobs of the mask ``keep`` only (their current GPUs and pairs), on
    nodes of ``node_gpus`` GPUs."""
    return replace(snapshot.select_jobs(keep), node_gpus=node_gpus)


class StaticTrialsPolicy:
    """A static allocation for the trials ``trials`` (job ids); see the module docstring."""

    name = "static"

    def __init__(self, trials: Iterable[int], pool: Iterable[int] | None = None,
                 inner: Policy | None = None) -> None:
        self.trials = frozenset(int(t) for t in trials)
        self.pool = None if pool is None else frozenset(int(n) for n in pool)
        self.inner = inner

    def allocate(self, snapshot: Snapshot) -> Decision:
        n_nodes = snapshot.node_gpus.shape[0]
        in_pool = (np.ones(n_nodes, dtype=np.bool_) if self.pool is None
                   else np.isin(np.arange(n_nodes), sorted(self.pool)))
        is_trial = np.isin(snapshot.job_ids, sorted(self.trials))
        if not is_trial.any():  # (the pool is the study's while it lives, no longer)
            in_pool[:] = False
        reason = np.full(snapshot.num_jobs, Reason.QUEUE_ORDER, dtype=np.int8)
        free = np.where(in_pool, snapshot.node_gpus, 0).astype(np.int64)
        cur = snapshot.current
        rows: list[tuple[int, int, int]] = []  # (job id, node, GPUs)
        running: set[int] = set()
        for job, node, count in zip(cur.job.tolist(), cur.node.tolist(), cur.count.tolist(),
                                    strict=True):
            if job in self.trials:
                rows.append((job, node, count))
                free[node] -= count
                running.add(job)
        waiting = [i for i in np.nonzero(is_trial)[0].tolist()
                   if int(snapshot.job_ids[i]) not in running]
        resumed = snapshot.remaining < snapshot.total - 1e-9
        waiting.sort(key=lambda i: (not resumed[i], int(snapshot.job_ids[i])))
        for i in waiting:
            runs = snapshot.rate[i][snapshot.node_type] > 0
            fits = np.nonzero(runs & (free >= 1))[0]
            if fits.size == 0:
                continue
            node = int(fits[0])
            if snapshot.attained[i].sum() > 0:  # (resume on the GPU type it ran on)
                same = fits[snapshot.node_type[fits] == int(np.argmax(snapshot.attained[i]))]
                node = int(same[0]) if same.size else node
            rows.append((int(snapshot.job_ids[i]), node, 1))
            free[node] -= 1
        placed_ids = {r[0] for r in rows}
        reason[np.isin(snapshot.job_ids, sorted(placed_ids))] = Reason.PLACED
        copy = [0] * len(rows)
        state = None
        packed: tuple[tuple[int, int], ...] = ()
        if self.inner is not None and (~is_trial).any():
            sub = select_jobs(snapshot, ~is_trial,
                              np.where(in_pool, 0, snapshot.node_gpus).astype(np.int64))
            inner = self.inner.allocate(sub)
            p = inner.placement
            rows.extend(zip(p.job.tolist(), p.node.tolist(), p.count.tolist(), strict=True))
            copy.extend(p.copy_index().tolist())
            reason[~is_trial] = inner.reason
            state, packed = inner.policy_state, inner.packed
        elif (~is_trial).any():
            reason[~is_trial] = Reason.NO_FREE_GPU
        placement = Placement(
            job=np.array([r[0] for r in rows], dtype=np.int64),
            node=np.array([r[1] for r in rows], dtype=np.int64),
            count=np.array([r[2] for r in rows], dtype=np.int64),
            copy=np.array(copy, dtype=np.int64) if any(copy) else None)
        return Decision(snapshot.epoch, placement, reason, state, packed=packed)
