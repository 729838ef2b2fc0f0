"""``fifo``: what Slurm does today.  First come, first fit, blind to GPU type.

Jobs run to completion where they started (Slurm does not preempt them).  Waiting jobs are taken
in arrival order; each goes to the first GPU type, in the cluster's node order, that has
``scale_factor`` free GPUs, whatever that type's speed for the job.  A job that does not fit
lets later, smaller jobs pass (Slurm's backfill).
"""

from __future__ import annotations

import numpy as np

from hadar_slurm.policy.base import Decision, Reason, Snapshot
from hadar_slurm.policy.matching import match_nodes


class FifoPolicy:
    name = "fifo"

    def allocate(self, snapshot: Snapshot) -> Decision:
        num_types = len(snapshot.gpu_types)
        counts = np.zeros((snapshot.num_jobs, num_types), dtype=np.int64)
        free = snapshot.capacity().copy()
        index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
        running = np.zeros(snapshot.num_jobs, dtype=np.bool_)
        cur = snapshot.current
        for j, n, c in zip(cur.job.tolist(), cur.node.tolist(), cur.count.tolist(), strict=True):
            i = index_of.get(j)
            if i is not None:
                h = int(snapshot.node_type[n])
                counts[i, h] += c
                free[h] -= c
                running[i] = True
        # Types in the order their first node appears: "first fit" over the node list.
        type_order = list(dict.fromkeys(snapshot.node_type.tolist()))
        reason = np.full(snapshot.num_jobs, Reason.QUEUE_ORDER, dtype=np.int8)
        order = np.lexsort((snapshot.job_ids, snapshot.arrival))
        for i in order.tolist():
            if running[i]:
                continue
            need = int(snapshot.scale[i])
            runnable = [h for h in type_order if snapshot.rate[i, h] > 0]
            if not runnable:
                reason[i] = Reason.NO_THROUGHPUT
                continue
            for h in runnable:
                if free[h] >= need:
                    counts[i, h] = need
                    free[h] -= need
                    break
        placement, placed = match_nodes(snapshot, counts, order)
        reason[placed] = Reason.PLACED
        return Decision(snapshot.epoch, placement, reason)
