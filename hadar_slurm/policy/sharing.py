"""GPU sharing in Hadar (issue #16): a waiting job joins a placed one on its GPUs where that pays.

Hadar's plan (:class:`~hadar_slurm.policy.hadar.HadarPolicy`) gives every GPU to at most one
job, and back-fills idle GPUs, so a job is left waiting only when every GPU it could use runs a
job ahead of it in the queue order.  Where the backend can run two jobs of the same scale factor
on the same GPUs (``Snapshot.colocated``: each then runs at its co-located rate), such a job may
instead *join* a placed job, the *host*, on the host's GPUs.  :func:`pack_waiting` decides it,
waiting jobs in queue order, each with the host where it pays most, a host taking one guest:

1. **Throughput.**  On the host's GPU type ``h``, the pair's normalised throughput beats taking
   turns: ``s_host + s_guest > 1``, with ``s = co-located rate / isolated rate on h`` (what
   Gavel's packing LP rewards): the two jobs together do more than one of them alone.
2. **Completion times** (:func:`pair_gain`).  Sharing slows the host.  The two jobs are
   compared as they would run apart (``A``): the host alone on its GPUs, the guest from the
   moment it would start without sharing, the first moment GPUs of the host's type free up
   for it once the waiting jobs ahead of it in the queue order have been served
   (:func:`waiting_starts`: each placed job ends after its remaining work at its rates), the
   host's own end at the latest, or on GPUs of another type where it would end sooner (it
   starts there by the same rule); or together until one ends and the other alone after
   (``B``).  The pair is formed only where ``B`` lowers the weighted sum of their completion
   times, plus the weight of the waiting jobs behind the guest that these GPUs serve (their
   weight over the cluster's GPUs), each of which starts when both are done.  So a short job
   about to end keeps its GPUs to itself unless the guest gains more than it loses; where the
   queue is long, the throughput of step 1 dominates, as it does for the average JCT of a
   loaded queue.  A guest that is not on the host's GPUs already pays a start it would not
   pay waiting (``migration_s``, while the host shares): it counts against the gain.
   (Until 2026-12-02 ``A`` was the two one after the other on the host's GPUs, in queue
   order: a guest that would soon have started on GPUs another job frees joined a host it
   slowed for nothing, and with HadarE pinning the jobs that bind its fork makespan, more
   jobs waited beside GPUs about to free up.  On ``bench.sharing --draws 4`` the traces worse
   on the mean of five draws went from 10 to 7 for Hadar and for HadarE.  Counting also that
   a GPU freed mid-round idles to the round's end in fixed rounds paired more: 10 and 9.
   Until the same day ``A`` kept the guest to the host's type: a job preempted from its fast
   type for a round joined a host on a slow one for that round, two restarts for nothing
   (dgx/bursty-1.5: Hadar's JCT 1.018 of the unshared in all five draws, now 1.000).)
3. **The makespan.**  Both jobs must still end by the drain target (``window``: Hadar's
   ``target - now``, HadarE's fork target), the one that outlives the other alone on the
   host's GPUs after it (:func:`shared_finish`), so that no pair pushes the plan's makespan
   out: a guest stays on GPUs the plan did not choose for it, and checking the host alone let
   guests hold GPUs that gang chains needed (``bench.sharing``: Hadar's worst makespan with
   sharing, over without, went from 1.028 to 1.006).
4. **The queue.**  No new pair forms on a GPU type that a multi-GPU job left waiting (other
   than the guest itself), anywhere in the queue order, can use.  Such a gang needs whole GPUs
   of one type at once; a pair keeps its host on its GPUs longer and the guest may stay after,
   while step 2 counts only the two jobs and, per GPU, those behind the guest.  Until
   2026-12-05 only a gang *ahead* of the guest blocked the type; but a gang behind it jumps
   the queue once it is critical, and under load it waited for types that pairs kept busy: on
   ``bench.sharing --draws 4`` the traces whose average JCT or utilization was worse with
   sharing on the mean of five draws went from 4 to 1 (Hadar) and from 6 to 2 (HadarE),
   gavel/bursty-1.5 (Hadar 1.056) and gavel/bursty-0.8 (HadarE 1.065) among them, at the cost
   of Gavel's static_48_multigpu, where a 2- or 4-GPU job always waits and sharing no longer
   shortens the average JCT by 3.2% (docs/sharing.md).  (The rule before, gangs ahead only,
   took those counts from 10 to 5 and from 9 to 7; holding every waiting job ahead so, one-GPU
   jobs too, took both to 6 but cost HadarE 2.7% of makespan on Gavel's static_32, which
   single-GPU pairs help.)
5. **Never** a pair the table forbids (a co-located rate of 0), of unequal scale factors, a
   job whose user said ``share=no`` (``Snapshot.may_share``), a forked job (HadarE's copies),
   or a host spread over several GPU types; and, where the world says so (the Slurm sidecar),
   never a new pair whose host may not be joined (``Snapshot.may_host``: it holds whole GPUs),
   whose guest may not join (``Snapshot.may_join``: it runs), or on GPUs that may not be
   shared (``Snapshot.share_nodes``), or on a node without a CPU for the guest
   (``Snapshot.node_free_cpus``: the CPUs free at the read must cover those of every job placed
   on the node this epoch, the guest's included, as the sidecar's applier requires).  A pair
   that ran in the last epoch may always form again.

Nothing here runs where ``Snapshot.colocated`` is None (a backend that cannot share, or the
sidecar with sharing off): Hadar then decides exactly as without sharing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hadar_slurm.model import GpuType
from hadar_slurm.policy.base import BoolArray, FloatArray, IntArray, PairRates, Placement, Snapshot

Pairs = tuple[tuple[int, int], ...]



@dataclass
class SharingRates:
    """Co-located rates of a snapshot's jobs, looked up as needed and remembered: ``kind[i]``
    is job ``i``'s (job type, scale factor) class (``keys``).  :meth:`rates` gives
    ``(rate of i, rate of j)``, whole-job steps/s while ``i`` and ``j`` share GPUs of type
    ``h``, ``(0, 0)`` where they may not (the table forbids or lacks the pair, or the scale
    factors differ)."""

    table: PairRates
    gpu_types: tuple[GpuType, ...]
    kind: IntArray
    keys: list[tuple[str, int]]
    seen: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)

    def rates(self, i: int, j: int, h: int) -> tuple[float, float]:
        x, y = int(self.kind[i]), int(self.kind[j])
        got = self.seen.get((x, y, h))
        if got is None:
            (tx, sx), (ty, sy) = self.keys[x], self.keys[y]
            got = (0.0, 0.0)
            if sx == sy:
                ra, rb = self.table.pair_rate(tx, ty, sx, self.gpu_types[h])
                if ra > 0 and rb > 0:
                    got = (float(ra), float(rb))
            self.seen[(x, y, h)] = got
        return got


def sharing_rates(snapshot: Snapshot) -> SharingRates | None:
    """The co-located rates of the snapshot's jobs, or None where sharing is not offered."""
    table = snapshot.colocated
    if table is None:
        return None
    kinds: dict[tuple[str, int], int] = {}
    kind = np.array([kinds.setdefault((t, int(s)), len(kinds)) for t, s in
                     zip(snapshot.job_types, snapshot.scale.tolist(), strict=True)],
                    dtype=np.int64)
    return SharingRates(table, snapshot.gpu_types, kind, list(kinds))


def shared_finish(t1: float, t2: float, s1: float, s2: float) -> tuple[float, float]:
    """When two jobs end that share GPUs until one of them ends, the other alone after:
    ``t1``/``t2`` their remaining times alone on those GPUs, ``s1``/``s2`` the share of its own
    speed each keeps while they share."""
    if t1 / s1 <= t2 / s2:
        b1 = t1 / s1
        return b1, b1 + t2 - s2 * b1
    b2 = t2 / s2
    return b2 + t1 - s1 * b2, b2


def pair_gain(t1: float, t2: float, s1: float, s2: float, w1: float, w2: float,
              behind: float = 0.0, wait: float | None = None,
              elsewhere: float | None = None) -> float:
    """How much sharing lowers weighted completion times, two jobs on one set of GPUs.

    ``t1``/``t2``: the remaining times alone of the job that holds the GPUs (the host) and of
    the one that would join it; ``s1``/``s2``: the share of its own speed each keeps while they
    share; ``w1``/``w2`` their weights; ``behind``: the weight of jobs that start on these GPUs
    only once both are done; ``wait``: when the second would start if it did not share (by
    default ``t1``, when the first ends: the two one after the other).  ``A``: apart, the
    first alone, the second from ``wait`` (ends ``t1`` and ``wait + t2``), or, where it ends
    sooner on other GPUs (``elsewhere``: when it would end there, from now), there, the
    first's GPUs then free at ``t1``.  ``B``: together until one ends, the other alone after
    (:func:`shared_finish`).  Returns ``A - B`` of the weighted completion times (> 0: the
    pair pays)."""
    b1, b2 = shared_finish(t1, t2, s1, s2)
    start = t1 if wait is None else max(wait, 0.0)
    end2, free = start + t2, max(t1, start + t2)
    if elsewhere is not None and elsewhere < end2:
        end2, free = elsewhere, t1
    return w1 * (t1 - b1) + w2 * (end2 - b2) + behind * (free - max(b1, b2))


def job_cpus(snapshot: Snapshot) -> IntArray:
    """Per job, the CPUs it asks on each node (``Snapshot.cpus``), at least one."""
    if snapshot.cpus is None:
        return np.ones(snapshot.num_jobs, dtype=np.int64)
    out: IntArray = np.maximum(snapshot.cpus.astype(np.int64), 1)
    return out


def cpus_after(snapshot: Snapshot, placement: Placement, cpus: IntArray) -> IntArray | None:
    """Per node, the CPUs left for a guest: those free at the read
    (``Snapshot.node_free_cpus``) less those that the jobs ``placement`` puts on the node
    and that do not run there now ask (``cpus``: :func:`job_cpus`), as the sidecar's applier
    counts them (a job stopped this epoch frees its CPUs only once it has left).  None where
    the snapshot does not count CPUs."""
    if snapshot.node_free_cpus is None:
        return None
    left = snapshot.node_free_cpus.astype(np.int64).copy()
    index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
    now = {(int(j), int(nd)) for j, nd in zip(snapshot.current.job.tolist(),
                                              snapshot.current.node.tolist(), strict=True)}
    for j, nd in {(int(j), int(nd)) for j, nd in zip(placement.job.tolist(),
                                                     placement.node.tolist(), strict=True)}:
        i = index_of.get(j)
        if i is None or (j, nd) in now:
            continue
        left[nd] -= int(cpus[i])
    return left


def waiting_starts(snapshot: Snapshot, placement: Placement, order: IntArray,
                   placed: BoolArray) -> Callable[[int, int], float]:
    """When a waiting job would start on GPUs of a type if it shared none: ``starts(x, h)``,
    the seconds until the placed jobs on type ``h`` (each ending after its remaining work over
    the summed rates of its copies) have freed as many GPUs as job ``x`` and the waiting jobs
    ahead of it in ``order`` that can run on ``h`` ask (``inf`` if they never do).  A waiting
    job's other chance is that, not only its host's end."""
    rate = snapshot.rate
    scale = snapshot.scale.astype(np.int64)
    n_types = rate.shape[1]
    index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
    ends: list[list[tuple[float, int]]] = [[] for _ in range(n_types)]
    for job_id, copies in placement.by_job_copies().items():
        i = index_of.get(int(job_id))
        if i is None:
            continue
        speed = sum(min(float(rate[i, int(snapshot.node_type[nd])]) for nd, _c in rows)
                    for rows in copies.values())
        end = float(snapshot.remaining[i]) / speed if speed > 0 else np.inf
        for rows in copies.values():
            for nd, c in rows:
                ends[int(snapshot.node_type[nd])].append((end, int(c)))
    times: list[FloatArray] = []
    freed: list[IntArray] = []
    for h in range(n_types):
        got = sorted(ends[h])
        times.append(np.array([t for t, _c in got], dtype=np.float64))
        freed.append(np.cumsum(np.array([c for _t, c in got], dtype=np.int64)))
    # per type, the GPUs that the waiting jobs before each position in the queue ask
    waits = ~placed & (snapshot.remaining > 0)
    in_order = order.astype(np.int64)
    asked = np.where(waits[in_order, None] & (rate[in_order] > 0), scale[in_order, None], 0)
    ahead = np.cumsum(asked, axis=0) - asked  # (position, type)
    pos = np.empty(snapshot.num_jobs, dtype=np.int64)
    pos[in_order] = np.arange(in_order.shape[0])

    seen: dict[tuple[int, int], float] = {}  # (a guest is weighed against many hosts of a type)

    def starts(x: int, h: int) -> float:
        got = seen.get((x, h))
        if got is None:
            need = int(scale[x]) + int(ahead[pos[x], h])
            k = int(np.searchsorted(freed[h], need, side="left"))
            got = seen[(x, h)] = float(times[h][k]) if k < times[h].shape[0] else np.inf
        return got

    return starts


def pack_waiting(snapshot: Snapshot, placement: Placement, order: IntArray,
                 window: float = np.inf
                 ) -> tuple[Placement, Pairs, BoolArray, dict[int, str]]:
    """Waiting jobs join placed ones on their GPUs where it pays (see the module docstring).

    ``placement``: the decision so far (no pairs); ``order``: the queue order (job indices);
    ``window``: seconds to the drain target, by which a host must still end if it shares to
    its end.  Returns the placement with the guests' rows (the same as their
    hosts'), the pairs ``(lower id, higher id)``, the mask of the guests, and a detail line per
    job of a pair and per waiting job whose pair would have paid on a node without a CPU for
    it."""
    n = snapshot.num_jobs
    guests = np.zeros(n, dtype=np.bool_)
    rates = sharing_rates(snapshot)
    if rates is None or n < 2 or len(placement) == 0:
        return placement, (), guests, {}
    ids = [int(j) for j in snapshot.job_ids.tolist()]
    index_of = {j: i for i, j in enumerate(ids)}
    rate = snapshot.rate
    scale = snapshot.scale
    weight = snapshot.weight
    remaining = snapshot.remaining
    ok = snapshot.sharing_allowed() & (remaining > 0)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(order.shape[0])
    placed = np.zeros(n, dtype=np.bool_)
    shares_on = snapshot.sharing_nodes()
    may_host = snapshot.hosting_allowed()
    may_join = snapshot.joining_allowed()
    hosts: dict[int, tuple[int, list[tuple[int, int]]]] = {}  # index -> (type, rows)
    for job_id, copies in placement.by_job_copies().items():
        i = index_of.get(int(job_id))
        if i is None:
            continue
        placed[i] = True
        if len(copies) != 1 or not ok[i]:
            continue  # (a forked job's copies, or a job that may not share)
        rows = sorted(next(iter(copies.values())))
        if not all(shares_on[nd] for nd, _c in rows):
            continue  # (its GPUs may not be shared: the node has no shards)
        types = {int(snapshot.node_type[nd]) for nd, _c in rows}
        h = types.pop()
        if not types and rate[i, h] > 0 and sum(c for _nd, c in rows) == int(scale[i]):
            hosts[i] = (h, rows)
    waiting = np.array([not placed[i] and bool(ok[i]) and rate[i].max() > 0
                        for i in range(n)], dtype=np.bool_)
    if not hosts or not waiting.any():
        return placement, (), guests, {}
    per_gpu = 1.0 / max(float(snapshot.node_gpus.sum()), 1.0)
    start_s = float(snapshot.migration_s)
    before = {a: b for p in snapshot.packed for a, b in (p, p[::-1])}
    cpus = job_cpus(snapshot)
    cpus_left = cpus_after(snapshot, placement, cpus)
    starts = waiting_starts(snapshot, placement, order, placed)

    def elsewhere(x: int, h: int) -> float:
        """When waiting job ``x`` would end apart on a type other than ``h``, at the soonest
        (``inf``: on none)."""
        return min((starts(x, g) + float(remaining[x]) / float(rate[x, g])
                    for g in range(rate.shape[1]) if g != h and rate[x, g] > 0),
                   default=np.inf)

    def gain_with(x: int, p: int, h: int) -> float | None:
        """What waiting job ``x`` joining host ``p`` on type ``h`` gains (None: not allowed)."""
        if scale[p] != scale[x] or rate[x, h] <= 0:
            return None
        again = before.get(ids[x]) == ids[p]  # (the pair ran in the last epoch)
        if not again and not (may_host[p] and may_join[x]):
            return None  # the world cannot put these two together now
        cp, cx = rates.rates(p, x, h)
        if cp <= 0 or cx <= 0:
            return None  # the table forbids the pair there
        rp, rx = float(rate[p, h]), float(rate[x, h])
        sp, sx = cp / rp, cx / rx
        if sp + sx <= 1.0:
            return None  # 1: the pair does no more than taking turns
        tp, tx = float(remaining[p]) / rp, float(remaining[x]) / rx
        if max(shared_finish(tp, tx, sp, sx)) > window:
            return None  # 3: the pair (the one left alone after) would end after the target
        # 2: the completion times, the waiting jobs behind the guest included (per GPU).
        behind = float(weight[waiting & (pos > pos[x])].sum()) * per_gpu * float(scale[x])
        wait = min(starts(x, h), tp)
        gain = pair_gain(tp, tx, sp, sx, float(weight[p]), float(weight[x]), behind, wait,
                         elsewhere(x, h))
        if not again:
            # A guest that starts on the host's GPUs pays a start it would not pay waiting
            # (``migration_s``, once now and at most once when the pair ends), and the host
            # shares at its co-located rate while the guest starts.
            gain -= start_s * (float(weight[x]) + float(weight[p]) * (1.0 - sp))
        return gain

    pairs: list[tuple[int, int]] = []
    job: list[int] = []
    node: list[int] = []
    count: list[int] = []
    detail: dict[int, str] = {}
    # 4: per GPU type, the multi-GPU jobs left waiting that can use it (anywhere in the queue).
    gangs = ~placed & (remaining > 0) & (scale > 1)
    gangs_on = (gangs[:, None] & (rate > 0)).sum(axis=0)
    # Waiting jobs in queue order, each with the host where it gains most.
    for x in order.tolist():
        if not hosts:
            break
        if not waiting[x]:
            continue
        # (the gangs that wait for each type, the guest itself aside)
        blocked = gangs_on - (gangs[x] & (rate[x] > 0)) > 0
        best: tuple[float, int] | None = None
        no_cpu: tuple[float, int, int] | None = None  # (gain, host, node) short of CPUs
        for p, (h, rows) in hosts.items():
            if blocked[h] and before.get(ids[x]) != ids[p]:
                continue  # 4: a gang waits for this type's GPUs whole
            gain = gain_with(x, p, h)
            if gain is None or gain <= 0.0:
                continue
            if cpus_left is not None and before.get(ids[x]) != ids[p]:
                tight = [nd for nd, _c in rows if cpus_left[nd] < cpus[x]]
                if tight:  # (it would wait for a CPU, and then the pair split)
                    if no_cpu is None or gain > no_cpu[0]:
                        no_cpu = (gain, p, tight[0])
                    continue
            if best is None or gain > best[0]:
                best = (gain, p)
        if best is None:
            if no_cpu is not None:
                _g, p, nd = no_cpu
                left = 0 if cpus_left is None else max(int(cpus_left[nd]), 0)
                detail[ids[x]] = (
                    f"would share a GPU with job {ids[p]} on {snapshot.node_names[nd]}, but "
                    f"the node has {left} free CPU(s) for the "
                    f"{int(cpus[x])} it asks, this epoch's placements counted")
            continue
        p = best[1]
        _h, rows = hosts.pop(p)
        if cpus_left is not None:
            for nd, _c in rows:
                cpus_left[nd] -= cpus[x]
        guests[x] = True
        waiting[x] = False
        pairs.append((min(ids[p], ids[x]), max(ids[p], ids[x])))
        detail[ids[p]] = f"shares its GPUs with job {ids[x]}"
        detail[ids[x]] = f"shares its GPUs with job {ids[p]} (joined it)"
        for nd, c in rows:
            job.append(ids[x])
            node.append(nd)
            count.append(c)
    if not pairs:
        return placement, (), guests, detail
    k = len(job)
    out = Placement(np.concatenate([placement.job, np.array(job, dtype=np.int64)]),
                    np.concatenate([placement.node, np.array(node, dtype=np.int64)]),
                    np.concatenate([placement.count, np.array(count, dtype=np.int64)]),
                    None if placement.copy is None else np.concatenate(
                        [placement.copy, np.zeros(k, dtype=np.int64)]))
    return out, tuple(sorted(pairs)), guests, detail


__all__ = ["SharingRates", "cpus_after", "job_cpus", "pack_waiting", "pair_gain",
           "shared_finish", "sharing_rates", "waiting_starts"]
