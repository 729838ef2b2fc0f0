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
        counts = snapshot.held()
        running = counts.sum(axis=1) > 0
        free = snapshot.capacity() - counts.sum(axis=0)
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
        reason[(counts.sum(axis=1) > 0) & ~placed] = Reason.NO_FREE_GPU  # the matcher refused
        reason[placed] = Reason.PLACED
        return Decision(snapshot.epoch, placement, reason)
