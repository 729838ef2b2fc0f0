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
   times, plus what the jobs waiting behind the guest gain: their weight over the cluster's
   GPUs, times the GPU time the pair saves (apart the two hold GPUs for the host's time and
   the guest's run, wherever the guest would run: GPUs it takes apart are GPUs a job behind
   does not get; together for the pair's span).  While jobs keep arriving, the jobs forecast
   to arrive count with them (``arriving``: Hadar's
   :func:`~hadar_slurm.policy.hadar.arrivals_forecast`).  So a short job about to end keeps
   its GPUs to itself unless the guest gains more than it loses; where the queue is long, the
   throughput of step 1 dominates, as it does for the average JCT of a loaded queue.
   (Until 2026-12-07 the jobs behind were counted as starting on the host's GPUs once both
   were done, and the guest's run apart on other GPUs, or on GPUs freed before the host's
   end, was not counted as GPU time they lose, nor the jobs to come; the longest guests, at
   the end of the queue order, had none behind them.  Hadar's poisson_200 average JCT was
   11,946 s on the mean of 21 runs against Gavel's packed 11,778; now 11,659,
   docs/sharing.md.)  A guest that is not on the host's GPUs already pays a start it would
   not pay waiting (``migration_s``, while the host shares): it counts against the gain.
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
   sharing, over without, went from 1.028 to 1.006).  While jobs keep arriving, Hadar
   stretches the window by the drain of the work that arrived over the last one
   (:func:`~hadar_slurm.policy.hadar.arrivals_forecast`; HadarE where its ``share_arrivals``
   says so): the queue's drain is then not the makespan, which the jobs still to come set.
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

from dataclasses import dataclass

import numpy as np

from hadar_slurm import core
from hadar_slurm.core.reference import pair_gain, shared_finish
from hadar_slurm.model import GpuType
from hadar_slurm.policy.base import BoolArray, FloatArray, IntArray, PairRates, Placement, Snapshot

Pairs = tuple[tuple[int, int], ...]



@dataclass
class SharingRates:
    """Co-located rates of a snapshot's jobs by kind: ``kind[i]`` is job ``i``'s (job type,
    scale factor) class (``keys``); :meth:`cube` gives the rates of every pair of kinds on every
    GPU type, ``0`` where the two may not share (the table forbids or lacks the pair, or the
    scale factors differ)."""

    table: PairRates
    gpu_types: tuple[GpuType, ...]
    kind: IntArray
    keys: list[tuple[str, int]]

    def cube(self, hosts: IntArray, guests: IntArray) -> tuple[FloatArray, FloatArray]:
        """``(host rates, guest rates)``, each ``[kind, kind, type]``: whole-job steps/s of
        each job while a job of a kind in ``hosts`` and one of a kind in ``guests`` share GPUs
        of each type (the table's :meth:`~hadar_slurm.rates.colocated.ColocatedTable.pair_cube`;
        0 elsewhere)."""
        kinds = len(self.keys)
        out_host = np.zeros((kinds, kinds, len(self.gpu_types)))
        out_guest = np.zeros((kinds, kinds, len(self.gpu_types)))
        if hosts.shape[0] and guests.shape[0]:
            a, b = self.table.pair_cube(tuple(self.keys[x] for x in hosts.tolist()),
                                        tuple(self.keys[y] for y in guests.tolist()),
                                        self.gpu_types)
            at = np.ix_(hosts, guests)
            out_host[at] = a
            out_guest[at] = b
        return out_host, out_guest


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


#: :func:`_copy_groups`' answer: ``(rows, job, group, firsts)``.
CopyGroups = tuple[IntArray, IntArray, IntArray, IntArray]


def _copy_groups(snapshot: Snapshot, placement: Placement) -> CopyGroups:
    """The placement's rows of the snapshot's jobs, grouped by (job, copy): ``(rows, job, group,
    firsts)``: the kept rows' positions in ``placement``, their job indices, their group
    numbers, and per group (numbered as the groups first appear) its first row's position in
    ``rows``."""
    ix = snapshot.index_of(placement.job)
    rows = np.nonzero(ix >= 0)[0]
    job = ix[rows]
    copy = placement.copy_index()[rows].astype(np.int64)
    key = job * (int(copy.max()) + 1 if copy.shape[0] else 1) + copy
    _keys, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    # number the groups as they first appear
    rank = np.empty(first.shape[0], dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    return rows, job, rank[inverse.reshape(-1)], np.sort(first)


def waiting_starts(snapshot: Snapshot, placement: Placement, order: IntArray,
                   placed: BoolArray, groups: CopyGroups | None = None) -> FloatArray:
    """When each waiting job would start on GPUs of each type if it shared none: ``[x, h]``,
    the seconds until the placed jobs on type ``h`` (each ending after its remaining work over
    the summed rates of its copies) have freed as many GPUs as job ``x`` and the waiting jobs
    ahead of it in ``order`` that can run on ``h`` ask (``inf`` if they never do).  A waiting
    job's other chance is that, not only its host's end.  (Read for waiting jobs only.)
    ``groups``: :func:`_copy_groups` of ``placement``, where the caller has it."""
    rate = snapshot.rate
    scale = snapshot.scale.astype(np.int64)
    n = snapshot.num_jobs
    n_types = rate.shape[1]
    rows, job, group, firsts = _copy_groups(snapshot, placement) if groups is None else groups
    on = snapshot.node_type[placement.node[rows]].astype(np.int64)
    # a copy runs at its slowest GPU's rate; a job at the sum of its copies' (summed in the
    # order the copies first appear)
    slowest = np.full(firsts.shape[0], np.inf)
    np.minimum.at(slowest, group, rate[job, on].astype(np.float64))
    speed = np.zeros(n, dtype=np.float64)
    np.add.at(speed, job[firsts], slowest)
    fast = speed > 0
    end = np.full(n, np.inf)
    end[fast] = snapshot.remaining[fast].astype(np.float64) / speed[fast]
    ends = end[job]
    freeing = placement.count[rows].astype(np.int64)
    # per type, the GPUs that the waiting jobs before each position in the queue ask
    waits = ~placed & (snapshot.remaining > 0)
    in_order = order.astype(np.int64)
    asked = np.where(waits[in_order, None] & (rate[in_order] > 0), scale[in_order, None], 0)
    ahead = np.cumsum(asked, axis=0) - asked  # (position, type)
    need = np.zeros((n, n_types), dtype=np.int64)
    need[in_order] = scale[in_order, None] + ahead
    out = np.full((n, n_types), np.inf)
    for h in range(n_types):
        mine = on == h
        by_end = np.argsort(ends[mine], kind="stable")
        times = np.append(ends[mine][by_end], np.inf)
        freed = np.cumsum(freeing[mine][by_end])
        out[:, h] = times[np.searchsorted(freed, need[:, h], side="left")]
    return out


def sharing_hosts(snapshot: Snapshot, placement: Placement, ok: BoolArray,
                  groups: CopyGroups | None = None,
                  ) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray]:
    """The placed jobs another may join: ``(jobs, types, row_ptr, row_node, row_count)``, per
    host, in the placement's order, its job index, its GPU type and its rows ``(node, GPUs)``
    (``row_ptr[k]:row_ptr[k + 1]``), nodes ascending.  A host is a job that ``ok`` lets share,
    unforked, on GPUs of one type that may be shared (nodes with shards), as many as its scale
    factor.  ``groups``: :func:`_copy_groups` of ``placement``, where the caller has it."""
    n = snapshot.num_jobs
    rows, job, _group, firsts = (_copy_groups(snapshot, placement) if groups is None
                                 else groups)
    node = placement.node[rows].astype(np.int64)
    count = placement.count[rows].astype(np.int64)
    on = snapshot.node_type[node].astype(np.int64)
    copies = np.bincount(job[firsts], minlength=n)
    # per job: whether every row may be shared, its lowest and highest type, its GPUs
    unshared = np.bincount(job, weights=(~snapshot.sharing_nodes()[node]).astype(np.float64),
                           minlength=n)
    low = np.full(n, np.iinfo(np.int64).max)
    high = np.full(n, -1)
    np.minimum.at(low, job, on)
    np.maximum.at(high, job, on)
    gpus = np.bincount(job, weights=count.astype(np.float64), minlength=n)
    h = np.where(copies > 0, low, 0)
    host = ((copies == 1) & ok & (unshared == 0) & (low == high)
            & (snapshot.rate[np.arange(n), h] > 0) & (gpus == snapshot.scale))
    # the hosts in the placement's order (as each job first appears), their rows by node
    first_row = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first_row, job, np.arange(job.shape[0]))
    jobs = np.nonzero(host)[0]
    jobs = jobs[np.argsort(first_row[jobs], kind="stable")]
    rank = np.full(n, -1, dtype=np.int64)
    rank[jobs] = np.arange(jobs.shape[0])
    mine = rank[job] >= 0
    by_host = np.lexsort((count[mine], node[mine], rank[job[mine]]))
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(rank[job[mine]],
                                                         minlength=jobs.shape[0]))])
    return (jobs.astype(np.int64), h[jobs].astype(np.int64), row_ptr.astype(np.int64),
            node[mine][by_host], count[mine][by_host])


def sooner_elsewhere(end: FloatArray) -> FloatArray:
    """``[x, h]``: the soonest of job ``x``'s ends ``end[x, g]`` on the types ``g`` other than
    ``h`` (``inf`` where there is none)."""
    num_types = end.shape[1]
    if num_types < 2:
        return np.full_like(end, np.inf)
    lowest = np.argmin(end, axis=1)
    two = np.sort(end, axis=1)
    out: FloatArray = np.where(np.arange(num_types)[None, :] == lowest[:, None],
                               two[:, 1:2], two[:, 0:1])
    return out


def pack_waiting(snapshot: Snapshot, placement: Placement, order: IntArray,
                 window: float = np.inf, arriving: float = 0.0
                 ) -> tuple[Placement, Pairs, BoolArray, dict[int, str]]:
    """Waiting jobs join placed ones on their GPUs where it pays (see the module docstring).

    ``placement``: the decision so far (no pairs); ``order``: the queue order (job indices);
    ``window``: seconds to the drain target, by which a host must still end if it shares to
    its end; ``arriving``: the weight per GPU of the jobs forecast to arrive (Hadar's
    :func:`~hadar_slurm.policy.hadar.arrivals_forecast`), counted with those waiting behind
    every guest (step 2).  Returns the placement with the guests' rows (the same as their
    hosts'), the pairs ``(lower id, higher id)``, the mask of the guests, and a detail line per
    job of a pair and per waiting job whose pair would have paid on a node without a CPU for
    it.

    The pairs are weighed in the compiled core (:func:`hadar_slurm.core.pair_guests`: a queue
    of thousands of jobs with thousands of hosts is millions of pairs) from arrays made here
    once; of the hosts where a waiting job gains most, it joins the first in the placement's
    order."""
    n = snapshot.num_jobs
    guests = np.zeros(n, dtype=np.bool_)
    if snapshot.colocated is None or n < 2 or len(placement) == 0:
        return placement, (), guests, {}
    ids: list[int] = snapshot.job_ids.tolist()
    rate = snapshot.rate
    scale = snapshot.scale
    weight = snapshot.weight.astype(np.float64)
    remaining = snapshot.remaining.astype(np.float64)
    ok = snapshot.sharing_allowed() & (remaining > 0)
    placed = np.isin(snapshot.job_ids, placement.job)
    waiting = ~placed & ok & (rate.max(axis=1) > 0)
    runs = rate > 0
    # 4: per GPU type, the multi-GPU jobs left waiting that can use it (anywhere in the queue);
    # a waiting job may join a host on a type no gang but itself waits for, where the world
    # lets it join (``open_to``), or the host it shared with in the last epoch (``before``).
    gangs = ~placed & (remaining > 0) & (scale > 1)
    gangs_on = (gangs[:, None] & runs).sum(axis=0)
    open_to = runs & (gangs_on[None, :] - (gangs[:, None] & runs) <= 0)
    open_to &= snapshot.joining_allowed()[:, None]
    # the job each job shared with in the last epoch (its index; -1: none)
    before = np.full(n, -1, dtype=np.int64)
    if snapshot.packed:
        pair_ix = snapshot.index_of(np.array(snapshot.packed, dtype=np.int64))
        for a, b in pair_ix.reshape(-1, 2).tolist():
            if a >= 0:
                before[a] = b
            if b >= 0:
                before[b] = a
    had = np.isin(snapshot.job_ids, np.array(snapshot.packed, dtype=np.int64).reshape(-1))
    if not (waiting & (open_to.any(axis=1) | had)).any():
        return placement, (), guests, {}
    groups = _copy_groups(snapshot, placement)
    hp, ht, row_ptr, row_node, row_count = sharing_hosts(snapshot, placement, ok, groups)
    rates = sharing_rates(snapshot)
    if hp.shape[0] == 0 or rates is None:
        return placement, (), guests, {}
    host_of = np.full(n + 1, -1, dtype=np.int64)  # (index n: no job)
    host_of[hp] = np.arange(hp.shape[0])
    cpus = job_cpus(snapshot)
    cpus_left = cpus_after(snapshot, placement, cpus)
    # 2: when and where each waiting job would start and end apart, and the weight of the
    # waiting jobs behind it in the queue order (per GPU); the guests taken as the queue goes
    # are all ahead of the one weighed, so those behind it still wait.
    start = waiting_starts(snapshot, placement, order, placed, groups)
    elsewhere = sooner_elsewhere(
        np.where(runs, start + remaining[:, None] / np.where(runs, rate, 1.0), np.inf))
    in_order = order.astype(np.int64)
    w_wait = np.where(waiting[in_order], weight[in_order], 0.0)
    behind = np.zeros(n, dtype=np.float64)
    behind[in_order] = np.cumsum(w_wait[::-1])[::-1] - w_wait
    behind *= 1.0 / max(float(snapshot.node_gpus.sum()), 1.0)
    behind += arriving
    behind *= scale
    partner = host_of[np.where(before >= 0, before, n)]
    pair_host, pair_guest = rates.cube(np.unique(rates.kind[hp]), np.unique(rates.kind[waiting]))
    left = (np.zeros(snapshot.node_gpus.shape[0], dtype=np.int64) if cpus_left is None
            else np.ascontiguousarray(cpus_left, dtype=np.int64))
    host_rate = rate[hp, ht].astype(np.float64)
    host_for, tight_host, tight_node, tight_left = core.pair_guests(
        in_order[waiting[in_order]], scale.astype(np.int64), rates.kind,
        remaining, weight, rate.astype(np.float64), open_to.astype(np.int64), partner, start,
        elsewhere, behind, cpus.astype(np.int64), rates.kind[hp], ht,
        scale[hp].astype(np.int64), snapshot.hosting_allowed()[hp].astype(np.int64),
        host_rate, remaining[hp] / host_rate, weight[hp], row_ptr, row_node,
        pair_host, pair_guest, left, cpus_left is not None, float(window),
        float(snapshot.migration_s))

    detail: dict[int, str] = {}
    told = (host_for[in_order] >= 0) | (tight_host[in_order] >= 0)
    for x in in_order[told].tolist():
        k = int(host_for[x])
        if k < 0:
            t = int(tight_host[x])
            detail[ids[x]] = (
                f"would share a GPU with job {ids[int(hp[t])]} on "
                f"{snapshot.node_names[int(tight_node[x])]}, but the node has "
                f"{max(int(tight_left[x]), 0)} free CPU(s) for the {int(cpus[x])} it "
                f"asks, this epoch's placements counted")
            continue
        p = int(hp[k])
        detail[ids[p]] = f"shares its GPUs with job {ids[x]}"
        detail[ids[x]] = f"shares its GPUs with job {ids[p]} (joined it)"
    formed = in_order[host_for[in_order] >= 0]
    if formed.shape[0] == 0:
        return placement, (), guests, detail
    guests[formed] = True
    ks = host_for[formed]
    # each guest takes its host's rows, guests in queue order
    lens = row_ptr[ks + 1] - row_ptr[ks]
    rows = (np.repeat(row_ptr[ks], lens) + np.arange(int(lens.sum()))
            - np.repeat(np.cumsum(lens) - lens, lens))
    out = Placement(np.concatenate([placement.job, np.repeat(snapshot.job_ids[formed], lens)]),
                    np.concatenate([placement.node, row_node[rows]]),
                    np.concatenate([placement.count, row_count[rows]]),
                    None if placement.copy is None else np.concatenate(
                        [placement.copy, np.zeros(rows.shape[0], dtype=np.int64)]))
    host_ids = snapshot.job_ids[hp[ks]]
    guest_ids = snapshot.job_ids[formed]
    pairs = sorted(zip(np.minimum(host_ids, guest_ids).tolist(),
                       np.maximum(host_ids, guest_ids).tolist(), strict=True))
    return out, tuple(sorted(pairs)), guests, detail


__all__ = ["SharingRates", "cpus_after", "job_cpus", "pack_waiting", "pair_gain",
           "shared_finish", "sharing_hosts", "sharing_rates", "sooner_elsewhere",
           "waiting_starts"]
