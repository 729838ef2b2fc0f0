"""``hadare``: HadarE, Hadar with a job forker and a job tracker (Sultana et al., 2025).

HadarE may fork a job into copies that train at once on separate nodes; the job tracker adds
up the copies' iterations (the job is done when they reach its work) and consolidates their
models at the end of every round, which costs time (:mod:`hadar_slurm.consolidation`).  Copies
compete for GPUs like any job.  One epoch:

0. **Jobs that bind the makespan** (``pin_binding``, on by default; docs/algorithm.md, "Jobs
   that bind the fork makespan").  A job whose own fork-limited time, its remaining work over
   the summed rates of its ``cap`` fastest node-disjoint copies net of consolidation
   (:meth:`HadarEPolicy.own_fork_time`), is past the fork window below cannot end by it
   however the others run: the makespan is its own.  Only a job at least as wide as every job
   with work left may bind, and none while a study has a trial with work left
   (:meth:`HadarEPolicy.may_bind`): a narrower one's copies would take part of nodes a wider
   job needs whole, and what a study will still ask is unknown until its halving decides.
   When it first binds it gets a deadline, its soonest end plus
   ``pin_tolerance`` of its time (carried in ``HadarEState.deadlines``); from the round its
   deadline is within ``margin_rounds`` rounds of its soonest end, it runs on exactly those
   fastest copies (:meth:`HadarEPolicy.pin`), as the fork LP runs it.  Hadar's type split
   would put its copies on the types that are cheapest for the cluster's drain instead, and
   the job would end later than the fork bound.  The other jobs are planned below on the
   GPUs left, with Hadar's target no sooner than the binding jobs' deadline.
1. **Which jobs are long.**  A lower bound on the time to drain all remaining work when jobs
   may be forked (:func:`fork_drain`, the Lagrangian dual of the fork LP with Hadar's type
   prices) sets a *window*, kept across epochs as an absolute target that only moves later.  A
   job whose remaining time on its best type (one copy) exceeds the window would end after
   everything else however it is placed: it is offered as many copies as it may have (its cap,
   ``Snapshot.max_copies`` or ``max_copies`` in the simulator, and at most what the cluster has
   room for, node-disjoint).  The others keep one copy (``fork_all`` offers every job its cap:
   a much lower average JCT for a longer makespan and lower utilisation; see bench/quality.py).
   A job the world asks to spread (``Snapshot.spread``: a study's trials, whose cap is the
   study's water-filling share of the cluster) is offered its cap whatever its length.  A job
   that runs as copies (step 3's, say) is offered at least as many (:meth:`HadarEPolicy.runs_as`,
   up to its cap): dropping one restarts the job as adding one did, so Hadar plans them and its
   rule that moves must pay weighs the restart (planned as one copy, such a job lost its copies
   at the next full epoch and got them back later, a restart each way: docs/algorithm.md).
2. **Hadar plans the copies.**  Each offered copy becomes a job of its own in a virtual snapshot:
   its share of the remaining work, the job's rate less the consolidation overhead, and its share
   of the job's weight, so that in Hadar's shortest-remaining-time order a copy ranks by the whole
   job's remaining time, not by its slice; and, the copies pooling their progress
   (``Snapshot.pool``), Hadar's test of which jobs cannot wait gives every copy the job's time to
   finish (its copies' work over their summed pace on their split), not its slice's time on the
   type the split puts it on.  Hadar (:class:`~hadar_slurm.policy.hadar.HadarPolicy`, which reads
   nothing else of HadarE's) orders, prices and places the copies like any job: a long job's copies
   run when they can no longer wait for the target (critical) or when GPUs are free, so short jobs
   are not starved.  Hadar's matcher does not know that copies must be node-disjoint (best fit
   puts a job's one-GPU copies on one node), so a one-row copy on a node another copy of the job
   holds first trades nodes with a one-row job of another owner, of the same GPU count on another
   node of the same type (:func:`separate_copies`: the per-type counts and each node's GPUs in use
   stay as planned, and no row its job held there last epoch moves).  Copies still on such a node,
   or (copies being one node each) over several nodes or types, are dropped; where that leaves
   GPUs idle while a job waits that would fit in them, the job's copies are lowered to those kept
   and Hadar plans again (``replans`` times at most), so that the waiting jobs get those GPUs.
3. **Fill idle GPUs.**  GPUs nobody took this epoch, once no waiting job fits in them (an
   8-GPU gang beside 7 idle GPUs does not), go to more copies of the placed jobs,
   longest expected finish first, each on the fastest type with room, on nodes the job's other
   copies do not use, preferring nodes where the job ran a copy last epoch; a copy is only added
   when it speeds the job up net of the consolidation it adds (and, where the job would end
   within the round, only when it ends the job sooner, its restart counted).  The copies of
   the jobs the world asks to spread that start anew (a study's trials) are then dealt out
   again so that the slowest of them ends as soon as it can (:meth:`HadarEPolicy.
   balance_spread`).
4. **GPU sharing** (``share``, off by default as Hadar's; only where the snapshot offers
   it): a job still waiting joins
   an unforked placed job on its GPUs by Hadar's rule
   (:func:`~hadar_slurm.policy.sharing.pack_waiting`), each host still ending by the fork
   target when it shares to its end.  (That window stretched while jobs keep arriving, as
   Hadar's is, ``share_arrivals``, :func:`~hadar_slurm.policy.hadar.arrivals_forecast`: Gavel's
   poisson_200, mean of 21 runs, average JCT 8,827 to 8,396 s, but on the regime suite its
   traces worse with sharing than without on the mean of five draws go from 4 to 5, and the
   tuning studies amid other jobs meet 85 of 90 goals either way, ASHA's speed-up 2.6% lower
   in geometric mean; off.  docs/sharing.md, "While jobs keep arriving".)  The next epoch
   plans a pair's GPUs as its host's alone (the guests carried in ``HadarEState.guests``), as
   Hadar's plan does
   (:func:`~hadar_slurm.policy.hadar.without_guests`): seen held by both, the copies' plan
   planned both as running, kept the first row it met (the guest's where its id was lower,
   moving the host) and sent the other elsewhere, so pairs broke up.

The decision numbers the copies of each job in ``Placement.copy``; ``detail`` says how many
copies a forked job runs as.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.policy.base import (
    BoolArray,
    Decision,
    FloatArray,
    IntArray,
    Placement,
    Reason,
    Snapshot,
    gpus_in_use,
    joined,
)
from hadar_slurm.policy.hadar import (
    Arrivals,
    HadarPolicy,
    HadarState,
    after_restart,
    arrivals_forecast,
    carried_window,
    drain_estimate,
    without_guests,
)
from hadar_slurm.policy.sharing import pack_waiting


# The algorithm: docs/algorithm.md, "How many copies".
def fork_drain(remaining: FloatArray, scale: IntArray, rate: FloatArray,
               capacity: IntArray) -> float:
    """A lower bound on the time to finish ``remaining`` when jobs may use any number of GPUs.

    For type prices ``pi >= 0`` with ``sum pi * c = 1`` (Hadar's drain prices), every unit of
    work costs at least ``min_h pi_h * S / rate_h`` price-weighted GPU-seconds and the cluster
    supplies one per second, so ``sum_i R_i * min_h pi_h * S_i / rate_ih`` bounds the fork
    makespan from below (unlike Hadar's drain, no job is limited to its scale factor of GPUs).
    """
    runs = rate > 0
    ok = runs.any(axis=1) & (remaining > 0)
    if not ok.any():
        return 0.0
    _, pi = drain_estimate(remaining[ok], scale[ok], rate[ok], capacity)
    cost = np.where(runs[ok], pi[None, :] * scale[ok, None] / np.where(runs[ok], rate[ok], 1.0),
                    np.inf)
    return float((remaining[ok] * cost.min(axis=1)).sum())


@dataclass(frozen=True)
class Basics:
    """What step 0 and steps 1-4 both read of one snapshot (:meth:`HadarEPolicy.basics`):
    per job the share of a round a copy spends consolidating and the most copies it may run
    as, and :func:`fork_drain` of the snapshot's work."""

    overhead: FloatArray
    cap: IntArray
    drain: float


@dataclass(frozen=True)
class HadarEState:
    """Carried from epoch to epoch: Hadar's own state, the fork drain target, and the copies
    Hadar's gang-chain rule made critical (``HadarState.chain``), as ``(job id, copy)``: the
    virtual ids Hadar saw are renumbered every epoch.  ``deadlines``: ``(job id, time)`` for the
    jobs that bind the fork makespan (``pin_binding``, step 0), when each must end.
    ``guests``: with sharing, the jobs that joined a host on its GPUs (step 4), as
    ``HadarState.guests`` for Hadar."""

    hadar: object
    target: float
    chain: tuple[tuple[int, int], ...] = ()
    deadlines: tuple[tuple[int, float], ...] = ()
    guests: tuple[int, ...] = ()


# The algorithm: docs/algorithm.md, "HadarE: forking jobs into copies".
@dataclass
class HadarEPolicy:
    """HadarE.  Settings: ``max_copies``: the cap on copies per job when the snapshot has none
    (the simulator); ``consolidation``: what a consolidation costs; a job whose consolidation
    takes ``max_overhead`` of a round or more is not forked.  What the world allows comes from
    the snapshot, set by the backend: ``round_s`` for the overhead, and ``multi_node_copies``,
    whether one copy may span nodes (a gang, as the job itself may; ``False`` in Slurm, where
    each copy is one component on one node, and in the simulator unless told otherwise).
    ``replans``: how many times at most Hadar plans the copies again without those the merge
    dropped (step 2).  ``pin_binding``: step 0, the jobs that bind the fork makespan on their
    fastest copies (on by default), ``pin_tolerance`` of their soonest end after it at most.
    ``share_arrivals``: with ``share``, the fork target's window that a pair must keep is
    stretched while jobs keep arriving, and the jobs forecast to arrive count with those
    behind a guest, as Hadar's are (step 4); off: measured (2026-12-08), it adds a trace
    worse with sharing than without on the regime suite's mean (4 to 5) and meets as many
    study goals (85 of 90), for 4.9% on Gavel's poisson_200, where HadarE already beats
    Gavel's packed figure by far (docs/sharing.md, "While jobs keep arriving")."""

    max_copies: int = 4
    consolidation: ConsolidationCost = field(default_factory=ConsolidationCost)
    hadar: HadarPolicy = field(default_factory=HadarPolicy)
    fork_all: bool = False
    max_overhead: float = 0.5
    share: bool = False
    share_arrivals: bool = False
    replans: int = 2
    pin_binding: bool = True
    pin_tolerance: float = 0.05
    name: str = "hadare"

    def allocate(self, snapshot: Snapshot) -> Decision:
        if self.pin_binding and snapshot.num_jobs:
            # (what step 0 and, where it pins nothing, steps 1-4 both read, computed once)
            basics = self.basics(snapshot)
            pinned, deadlines = self.pin(snapshot, basics)
            decision = pinned if pinned is not None else self.plan(snapshot, basics)
            state = decision.policy_state
            if isinstance(state, HadarEState):
                decision = replace(decision, policy_state=replace(state, deadlines=deadlines))
            return decision
        return self.plan(snapshot)

    def basics(self, snapshot: Snapshot) -> Basics:
        """:class:`Basics` of ``snapshot``."""
        overhead = self.overhead(snapshot)
        return Basics(overhead, self.copies_allowed(snapshot, overhead),
                      fork_drain(snapshot.remaining, snapshot.scale.astype(np.int64),
                                 snapshot.rate, snapshot.capacity()))

    def pin(self, snapshot: Snapshot, basics: Basics | None = None,
            ) -> tuple[Decision | None, tuple[tuple[int, float], ...]]:
        """Step 0: the jobs that bind the fork makespan, once their deadline is near, on their
        fastest node-disjoint copies, the others planned (:meth:`plan`) on the GPUs left; the
        decision (None when no job is due) and the deadlines to carry.  ``basics``:
        :meth:`basics` of ``snapshot``, where the caller has them."""
        may = self.may_bind(snapshot)
        if not may.any():
            return None, ()
        if basics is None:
            basics = self.basics(snapshot)
        overhead, cap = basics.overhead, basics.cap
        prev = snapshot.policy_state
        window, _ = carried_window(
            basics.drain, prev.target if isinstance(prev, HadarEState) else None, snapshot.now)
        fixed = (np.asarray(snapshot.fixed, dtype=np.bool_) if snapshot.fixed is not None
                 else np.zeros(snapshot.num_jobs, dtype=np.bool_))
        soonest = self.own_fork_time(snapshot, cap, overhead)
        own = np.where(fixed | (cap < 2), np.inf, soonest)
        binds = np.isfinite(own) & (own >= window) & may
        if not binds.any():
            return None, ()
        # A binding job's deadline, set when it first binds: its soonest end, plus
        # ``pin_tolerance`` of its time, in which the others may still go first.
        now = float(snapshot.now)
        before = dict(prev.deadlines) if isinstance(prev, HadarEState) else {}
        ids = snapshot.job_ids.tolist()
        due_at = {ids[i]: before.get(ids[i], now + float(own[i]) * (1.0 + self.pin_tolerance))
                  for i in np.nonzero(binds)[0].tolist()}
        deadlines = tuple(sorted(due_at.items()))
        slack = float(snapshot.round_s) * self.hadar.margin_rounds
        binding = binds & (now + own + slack >= np.array(
            [due_at.get(j, np.inf) for j in ids], dtype=np.float64))
        if not binding.any():
            return None, deadlines
        # (a job that runs until it ends keeps its GPUs: the loop holds it where it runs)
        fixed_ids = snapshot.job_ids[fixed]
        cur = snapshot.current
        left = snapshot.node_gpus.astype(np.int64) - gpus_in_use(
            cur.select(np.isin(cur.job, fixed_ids)), (), snapshot.node_gpus.shape[0])
        rows = self.fastest_copies(snapshot, binding, own, cap, left)
        if not rows:
            return None, deadlines
        keep = np.ones(snapshot.num_jobs, dtype=np.bool_)
        keep[[i for i, _k, _nd, _c in rows]] = False
        # Hadar's target no sooner than the binding jobs' end: no other job need end before it.
        end = max(due_at[ids[i]] for i in np.nonzero(binding)[0].tolist())
        if isinstance(prev, HadarEState):
            inner = prev.hadar
            if isinstance(inner, HadarState):
                inner = replace(inner, target=max(inner.target, end))
            else:
                inner = HadarState(end)
            prev = replace(prev, hadar=inner)
        else:
            prev = HadarEState(HadarState(end), float(snapshot.now))
        # (a type the binding jobs took whole is no type the others may be planned on)
        full = np.bincount(snapshot.node_type, weights=left,
                           minlength=len(snapshot.gpu_types)) <= 0
        others = snapshot.select_jobs(keep)
        rate = np.where(full[None, :], 0.0, others.rate)
        rest = self.plan(replace(others, rate=rate, node_gpus=left, policy_state=prev))
        pinned = self._placement(snapshot, rows)
        reason = np.full(snapshot.num_jobs, np.int8(Reason.PLACED), dtype=np.int8)
        reason[keep] = rest.reason
        detail = {**rest.detail, **forked_detail(pinned)}
        names = ", ".join(str(j) for j in sorted(set(pinned.job.tolist())))
        kept = np.nonzero(keep)[0]
        for k in np.nonzero((others.rate.max(axis=1) > 0) & (rate.max(axis=1) <= 0))[0].tolist():
            reason[kept[k]] = Reason.NO_FREE_GPU
            detail[int(others.job_ids[k])] = (
                f"every GPU of its types is held by the jobs that bind the makespan ({names})")
        return replace(rest, placement=joined(pinned, rest.placement), reason=reason,
                       detail=detail), deadlines

    @staticmethod
    def may_bind(snapshot: Snapshot) -> BoolArray:
        """Per job, whether step 0 may pin it: none while a study has a trial with work left
        (the study water-fills its trials' copies, ``Snapshot.spread``, and what it will
        still ask is unknown until its halving decides), and otherwise a job at least as
        wide as every job with work left that can run, so that its copies, one node each,
        never take part of a node that a wider job needs whole (a pinned 4-GPU job held half
        of the only h100 and a100 nodes for tens of thousands of seconds while 8-GPU jobs
        waited)."""
        if snapshot.spread is not None and (
                np.asarray(snapshot.spread, dtype=np.bool_) & (snapshot.remaining > 0)).any():
            # While a study has a trial with work left, the work that follows it is unknown
            # until its halving decides, so which job binds is unknown too.
            return np.zeros(snapshot.num_jobs, dtype=np.bool_)
        alive = (snapshot.remaining > 0) & (snapshot.rate.max(axis=1) > 0)
        widest = int(snapshot.scale[alive].max()) if alive.any() else 0
        out: BoolArray = snapshot.scale >= widest
        return out

    def own_fork_time(self, snapshot: Snapshot, cap: IntArray,
                      overhead: FloatArray) -> FloatArray:
        """Per job, its remaining work over the summed rates of its ``cap`` fastest
        node-disjoint copies (one node each, with at least its scale factor of GPUs), net of
        consolidation where it has more than one: the soonest it can end, whatever else
        runs (``inf`` where it runs nowhere)."""
        scale = snapshot.scale.astype(np.int64)
        rate = snapshot.rate
        out = np.full(snapshot.num_jobs, np.inf)
        for s in np.unique(scale).tolist():
            jobs = np.nonzero(scale == s)[0]
            fits = snapshot.node_gpus >= s
            nodes = np.bincount(snapshot.node_type[fits], minlength=len(snapshot.gpu_types))
            # Each job's types fastest first; its copies take their nodes in that order.
            order = np.argsort(-rate[jobs], axis=1, kind="stable")
            fast = np.take_along_axis(rate[jobs], order, axis=1)
            room = np.where(fast > 0, nodes[order], 0)
            before = np.cumsum(room, axis=1) - room
            take = np.clip(cap[jobs, None] - before, 0, room)
            speed = (take * fast).sum(axis=1)
            speed = np.where(take.sum(axis=1) > 1, speed * (1.0 - overhead[jobs]), speed)
            left = snapshot.remaining[jobs]
            ok = (speed > 0) & (left > 0)
            out[jobs[ok]] = left[ok] / speed[ok]
        return out

    @staticmethod
    def nodes_held(snapshot: Snapshot) -> dict[int, set[int]]:
        """Per job index, the nodes it holds GPUs on now (``current``)."""
        held: dict[int, set[int]] = {}
        for r, i in enumerate(snapshot.current_index().tolist()):
            if i >= 0:
                held.setdefault(i, set()).add(int(snapshot.current.node[r]))
        return held

    @staticmethod
    def fastest_copies(snapshot: Snapshot, binding: BoolArray, own: FloatArray, cap: IntArray,
                       left: IntArray) -> list[tuple[int, int, int, int]]:
        """Rows (job index, copy, node, GPUs) for the ``binding`` jobs, longest first, each on
        its ``cap`` fastest nodes with room (``left``, lowered as they are taken): among nodes
        of equal speed, those the job holds now, then the fullest that fits."""
        held = HadarEPolicy.nodes_held(snapshot)
        rows: list[tuple[int, int, int, int]] = []
        for i in sorted(np.nonzero(binding)[0].tolist(), key=lambda i: (-own[i], i)):
            need = int(snapshot.scale[i])
            speed = snapshot.rate[i, snapshot.node_type]
            mine = held.get(i, set())
            cand = np.nonzero((speed > 0) & (left >= need))[0].tolist()
            cand.sort(key=lambda nd: (-float(speed[nd]), nd not in mine, int(left[nd]), nd))
            for k, nd in enumerate(cand[:int(cap[i])]):
                left[nd] -= need
                rows.append((i, k, nd, need))
        return rows

    def plan(self, snapshot: Snapshot, basics: Basics | None = None) -> Decision:
        """Steps 1-4 of the module docstring.  ``basics``: :meth:`basics` of ``snapshot``,
        where the caller has them."""
        n = snapshot.num_jobs
        prev = snapshot.policy_state
        prev_hadar = prev.hadar if isinstance(prev, HadarEState) else None
        prev_chain = prev.chain if isinstance(prev, HadarEState) else ()
        if n == 0:
            return Decision(snapshot.epoch, Placement.empty(), np.zeros(0, dtype=np.int8),
                            HadarEState(prev_hadar, snapshot.now))
        if basics is None:
            basics = self.basics(snapshot)
        overhead, cap = basics.overhead, basics.cap
        # (with sharing, the GPUs of a pair that ran are planned as its host's alone, as
        # Hadar's plan sees them; the guest waits, and step 4 may pair it again)
        world = snapshot
        if self.share and snapshot.colocated is not None:
            snapshot = without_guests(
                world, prev.guests if isinstance(prev, HadarEState) else ())

        # 1: copies wanted per job.
        window, target = carried_window(
            basics.drain, prev.target if isinstance(prev, HadarEState) else None, snapshot.now)
        window = max(window, float(snapshot.round_s))
        best = snapshot.rate.max(axis=1)
        single = np.divide(snapshot.remaining, best, out=np.zeros(n), where=best > 0)
        want = np.ones(n, dtype=np.int64)
        long_job = ((single > window) | self.fork_all) & (cap > 1)
        if snapshot.spread is not None:  # (a study's trials once few remain, issue #17)
            long_job |= snapshot.spread & (cap > 1)
        want[long_job] = cap[long_job]
        # A job that runs as copies (step 3's, say) is planned as at least those copies.
        # (copies_allowed's cap still applies: a job over its cap now loses copies)
        want = np.maximum(want, np.minimum(self.runs_as(snapshot), cap))

        # 2: Hadar over the copies; planned again, without the copies the merge had to drop,
        # while their GPUs would idle as jobs wait.
        runnable = snapshot.rate.max(axis=1) > 0
        for _ in range(1 + self.replans):
            virt, owner, copy_no = self.expand(snapshot, want, overhead, prev_hadar,
                                               prev_chain)
            inner = self.hadar.allocate(virt)
            inner = replace(inner, placement=separate_copies(virt, inner.placement, owner))
            placement, reason = self.merge(snapshot, inner, owner, copy_no)
            # (a job left waiting that fits in no type's idle GPUs, e.g. an 8-GPU gang beside
            # 7 idle GPUs, gains nothing from them)
            unused = not self.waiting_fits(snapshot, placement, runnable)
            fewer = None if unused else self.dropped_copies(snapshot, want, inner.placement,
                                                            owner, placement)
            if fewer is None:
                break
            want = fewer

        # 3: idle GPUs to more copies, once no waiting job could use them; a study's trials
        # that start anew share their copies' GPUs so that none ends long after the others.
        if unused:
            placement = self.fill(snapshot, placement, cap, overhead)
        placement = self.balance_spread(snapshot, placement, cap, overhead)
        # 4: GPU sharing, where the world offers it: a waiting job joins an unforked placed
        # job (Hadar's rule), each host still ending by the fork target.
        pairs: tuple[tuple[int, int], ...] = ()
        shared: dict[int, str] = {}
        guest_ids: tuple[int, ...] = ()
        if self.share and snapshot.colocated is not None:
            srpt = np.divide(snapshot.remaining, best * snapshot.weight,
                             out=np.full(n, np.inf), where=best > 0)
            order = np.lexsort((snapshot.job_ids, srpt)).astype(np.int64)
            state = inner.policy_state
            ahead = (arrivals_forecast(world, window, state.since)
                     if self.share_arrivals and isinstance(state, HadarState)
                     else Arrivals(window, 0.0))
            placement, pairs, guests, shared = pack_waiting(world, placement, order,
                                                            ahead.window, ahead.weight)
            guest_ids = tuple(sorted(int(j) for j in world.job_ids[guests].tolist()))
        reason = np.where(np.isin(snapshot.job_ids, placement.job), np.int8(Reason.PLACED),
                          reason).astype(np.int8)
        detail = forked_detail(placement)
        detail.update(shared)
        return Decision(snapshot.epoch, placement, reason,
                        HadarEState(inner.policy_state, target,
                                    self.chain_copies(snapshot, inner.policy_state, owner,
                                                      copy_no), guests=guest_ids),
                        detail, packed=pairs)

    def fill_running(self, snapshot: Snapshot, decision: Decision) -> Decision:
        """A fill epoch's decision (:func:`hadar_slurm.loop.fill_decision`: the jobs that
        run keep their GPUs, the others were placed on the free ones) with the GPUs nobody took
        given to more copies of the placed jobs the world asks to spread (``Snapshot.spread``:
        a study's trials), as step 3 of a full epoch does, once no waiting job fits in them.
        A trial left alone at the end of its rung, beside GPUs its cohort freed, spreads over
        them at once rather than at the next full epoch.  Other jobs keep to the full epochs'
        cadence (copies added mid-round restart the job, and on the regime suite doing so for
        every job missed more goals, docs/algorithm.md).  A job that shares its GPUs (a pair
        of ``packed``) or may not be stopped (``fixed``) gets no copy."""
        if snapshot.spread is None or not snapshot.spread.any():
            return decision
        runnable = snapshot.rate.max(axis=1) > 0
        if self.waiting_fits(snapshot, decision.placement, runnable):
            return decision
        overhead = self.overhead(snapshot)
        cap = np.where(snapshot.spread, self.copies_allowed(snapshot, overhead), 1)
        paired = {j for pr in decision.packed for j in pr}
        hold = np.isin(snapshot.job_ids, np.array(sorted(paired), dtype=np.int64))
        if snapshot.fixed is not None:
            hold |= np.asarray(snapshot.fixed, dtype=np.bool_)
        cap = np.where(hold, 1, cap)
        placement = self.fill(snapshot, decision.placement, cap, overhead)
        if len(placement) == len(decision.placement):
            return decision
        return replace(decision, placement=placement,
                       detail={**decision.detail, **forked_detail(placement)})

    # -- pieces -------------------------------------------------------------------------------

    @staticmethod
    def runs_as(snapshot: Snapshot) -> IntArray:
        """Per job, how many copies it runs as now (0: it holds no GPU)."""
        jobs, counts, _first = snapshot.current.copy_counts()
        ix = snapshot.index_of(jobs)
        out = np.zeros(snapshot.num_jobs, dtype=np.int64)
        out[ix[ix >= 0]] = counts[ix >= 0]
        return out

    def copies_allowed(self, snapshot: Snapshot, overhead: FloatArray) -> IntArray:
        """Per job, the most copies it may run as: its cap (``Snapshot.max_copies``, or
        ``max_copies``), at most what the cluster has room for, and 1 for a job whose
        consolidation would take ``max_overhead`` of the round or more (with short epochs, e.g.
        a sidecar's, forking it would only lose time)."""
        cap = np.minimum(snapshot.copies_cap(self.max_copies), self.room_for_copies(snapshot))
        return np.where(overhead < self.max_overhead, cap, 1).astype(np.int64)

    def overhead(self, snapshot: Snapshot) -> FloatArray:
        """Per job, the share of a round a forked copy spends consolidating."""
        per_type = {t: self.consolidation.seconds(t) for t in set(snapshot.job_types)}
        secs = np.array([per_type[t] for t in snapshot.job_types], dtype=np.float64)
        return np.clip(secs / max(float(snapshot.round_s), 1e-9), 0.0, 1.0)

    def room_for_copies(self, snapshot: Snapshot) -> IntArray:
        """Per job, how many copies the cluster could hold at once (node-disjoint)."""
        scale = np.maximum(snapshot.scale.astype(np.int64), 1)
        num_types = len(snapshot.gpu_types)
        runs = snapshot.rate > 0  # [job, type]
        if snapshot.multi_node_copies:
            # copies may span the nodes of a type: its GPUs over the scale factor
            per_type = np.bincount(snapshot.node_type, weights=snapshot.node_gpus,
                                   minlength=num_types).astype(np.int64)
            out = (runs * (per_type[None, :] // scale[:, None])).sum(axis=1)
        else:
            # one node each: the nodes of the types it runs on with room for its scale factor
            out = np.zeros(snapshot.num_jobs, dtype=np.int64)
            raw = snapshot.scale.astype(np.int64)
            for s in np.unique(raw).tolist():
                mine = raw == s
                fits = np.bincount(snapshot.node_type[snapshot.node_gpus >= s],
                                   minlength=num_types)
                out[mine] = (runs[mine] * fits[None, :]).sum(axis=1)
        room: IntArray = np.maximum(out, 1).astype(np.int64)
        return room

    @staticmethod
    def chain_copies(snapshot: Snapshot, state: object, owner: IntArray,
                     copy_no: IntArray) -> tuple[tuple[int, int], ...]:
        """The copies, ``(job id, copy)``, behind the virtual ids of Hadar's chain gangs."""
        if not isinstance(state, HadarState):
            return ()
        return tuple((int(snapshot.job_ids[owner[v]]), int(copy_no[v])) for v in state.chain)

    def expand(self, snapshot: Snapshot, want: IntArray, overhead: FloatArray,
               prev_hadar: object, chain: tuple[tuple[int, int], ...] = (),
               ) -> tuple[Snapshot, IntArray, IntArray]:
        """The virtual snapshot with one job per wanted copy; ``owner``/``copy_no`` per copy.
        ``chain``: the copies Hadar's chain made critical last epoch (``HadarEState.chain``),
        given to Hadar as this epoch's virtual ids."""
        owner = np.repeat(np.arange(snapshot.num_jobs, dtype=np.int64), want)
        starts = np.cumsum(want) - want
        copy_no = np.arange(owner.shape[0], dtype=np.int64) - starts[owner]
        share = want[owner].astype(np.float64)
        factor = np.where(want[owner] > 1, 1.0 - overhead[owner], 1.0)
        # Current copies map to virtual jobs (job, copy) while that copy is still wanted.
        cur = snapshot.current
        idx = snapshot.current_index()
        cp = cur.copy_index()
        keep = (idx >= 0) & (cp < np.where(idx >= 0, want[np.maximum(idx, 0)], 0))
        virt_id = starts[np.maximum(idx, 0)] + cp
        current = Placement(virt_id[keep], cur.node[keep], cur.count[keep])
        if isinstance(prev_hadar, HadarState):
            wanted = set(chain)
            prev_hadar = replace(prev_hadar, chain=tuple(
                v for v, (i, k) in enumerate(zip(owner.tolist(), copy_no.tolist(), strict=True))
                if (int(snapshot.job_ids[i]), k) in wanted) if wanted else ())
        virt = replace(
            snapshot,
            job_ids=np.arange(owner.shape[0], dtype=np.int64),
            job_types=tuple(map(snapshot.job_types.__getitem__, owner.tolist())),
            arrival=snapshot.arrival[owner],
            total=snapshot.total[owner] / share,
            remaining=snapshot.remaining[owner] / share,
            scale=snapshot.scale[owner],
            weight=snapshot.weight[owner] / share,
            sync=snapshot.sync[owner],
            rate=snapshot.rate[owner] * factor[:, None],
            attained=snapshot.attained[owner],
            current=current,
            policy_state=prev_hadar,
            max_copies=None,
            # (copies do not share: HadarE pairs the real jobs after the merge, step 4)
            colocated=None, packed=(), may_share=None, cpus=None,
            # (the loop keeps a fixed job where it runs, on the real jobs' decision)
            fixed=None,
            pool=owner, spread=None if snapshot.spread is None else snapshot.spread[owner],
            after=None if snapshot.after is None else snapshot.after[owner] / share,
        )
        return virt, owner, copy_no

    def merge(self, snapshot: Snapshot, inner: Decision, owner: IntArray,
              copy_no: IntArray) -> tuple[Placement, np.ndarray]:
        """Hadar's placement of the copies as a placement of the jobs (node-disjoint copies).
        ``owner`` ascending, as :meth:`expand` makes it (a job's copies are consecutive virtual
        jobs)."""
        if owner.shape[0] > 1 and bool((np.diff(owner) < 0).any()):
            raise ValueError("owner must be ascending: a job's copies consecutive virtual jobs")
        p = inner.placement
        # The rows by virtual job (copy), in row order within one; copies of a job in a row.
        rows = np.lexsort((np.arange(len(p)), p.job))
        virt = p.job[rows]
        firsts = np.flatnonzero(np.r_[True, virt[1:] != virt[:-1]]) if len(p) else \
            np.zeros(0, dtype=np.int64)
        ends = np.r_[firsts[1:], len(p)].astype(np.int64)
        job_of = owner[virt[firsts]]
        kept = np.ones(firsts.shape[0], dtype=np.bool_)
        # Only a job with several copies placed may lose some: a copy on a node another copy of
        # the job holds is dropped (step 3 may refill); of those left, a forked job keeps the
        # copies on GPUs of one type (and one node each unless copies may span nodes), or its
        # first copy alone (a job left with one copy is a plain gang and may mix).
        twin = np.r_[job_of[1:] == job_of[:-1], False] | np.r_[False, job_of[1:] == job_of[:-1]]
        size = ends - firsts
        forked = np.flatnonzero(twin)
        # A job whose copies each hold one row (one node): a copy is kept where no earlier copy
        # of the job holds its node, which is the loop below where every copy fits.
        spans = np.isin(job_of[forked], job_of[forked][size[forked] > 1])
        simple = forked[~spans]
        if simple.shape[0]:
            where = p.node[rows[firsts[simple]]].astype(np.int64)
            _pairs, first_seen = np.unique(job_of[simple] * (int(where.max()) + 1) + where,
                                           return_index=True)
            kept[simple] = False
            kept[simple[first_seen]] = True
        groups = forked[spans].tolist()
        at = 0
        while at < len(groups):
            end = at
            while end + 1 < len(groups) and job_of[groups[end + 1]] == job_of[groups[at]]:
                end += 1
            taken: set[int] = set()
            accepted: list[int] = []
            for g in groups[at:end + 1]:
                nodes = set(p.node[rows[firsts[g]:ends[g]]].tolist())
                if nodes & taken:
                    kept[g] = False
                    continue
                taken |= nodes
                accepted.append(g)
            if len(accepted) > 1:
                fit = [g for g in accepted
                       if len({int(snapshot.node_type[nd])
                               for nd in p.node[rows[firsts[g]:ends[g]]].tolist()}) == 1
                       and (snapshot.multi_node_copies or ends[g] - firsts[g] == 1)]
                for g in accepted:
                    kept[g] = g in (fit if fit else accepted[:1])
            at = end + 1
        # The copies kept, numbered 0.. per job in order.
        keep_rows = rows[np.repeat(kept, size)]
        jobs_kept = job_of[kept]
        at_k = np.arange(jobs_kept.shape[0])
        new_job = np.r_[True, jobs_kept[1:] != jobs_kept[:-1]] if jobs_kept.shape[0] else \
            np.zeros(0, dtype=np.bool_)
        copy_of = at_k - np.maximum.accumulate(np.where(new_job, at_k, 0))
        placement = Placement(snapshot.job_ids[owner[p.job[keep_rows]]].astype(np.int64),
                              p.node[keep_rows].astype(np.int64),
                              p.count[keep_rows].astype(np.int64),
                              np.repeat(copy_of, size[kept]).astype(np.int64)) \
            if keep_rows.shape[0] else Placement.empty()
        # Reason per job: placed if any copy is; else the first copy's reason.
        reason = np.full(snapshot.num_jobs, Reason.PRICED_OUT, dtype=np.int8)
        first = np.nonzero(copy_no == 0)[0]
        reason[owner[first]] = inner.reason[first]
        return placement, reason

    @staticmethod
    def waiting_fits(snapshot: Snapshot, placement: Placement, runnable: np.ndarray) -> bool:
        """Whether a runnable job left waiting would fit in the GPUs ``placement`` leaves idle
        on one type where it runs (Hadar's back-fill left it out, so only GPUs freed by
        dropped copies could make it fit)."""
        waiting = runnable & ~np.isin(snapshot.job_ids, placement.job)
        if not waiting.any():
            return False
        free = snapshot.node_gpus - gpus_in_use(placement, (), snapshot.node_gpus.shape[0])
        per_type = np.bincount(snapshot.node_type, weights=free,
                               minlength=len(snapshot.gpu_types))
        room = np.where(snapshot.rate[waiting] > 0, per_type[None, :], -1.0).max(axis=1)
        return bool((room >= snapshot.scale[waiting]).any())

    @staticmethod
    def dropped_copies(snapshot: Snapshot, want: IntArray, planned: Placement,
                       owner: IntArray, placement: Placement) -> IntArray | None:
        """``want`` lowered to the copies the merge kept, for each forked job whose copies Hadar
        placed where they cannot run (on a node another copy holds, over several types or
        nodes); None when it dropped none."""
        n = snapshot.num_jobs
        placed = np.bincount(owner[np.unique(planned.job)], minlength=n)
        jobs, copies, _first = placement.copy_counts()
        ix = snapshot.index_of(jobs)
        kept = np.zeros(n, dtype=np.int64)
        kept[ix[ix >= 0]] = copies[ix >= 0]
        lower = (want > 1) & (placed > 1) & (kept > 0) & (kept < placed)
        if not lower.any():
            return None
        out = want.copy()
        out[lower] = kept[lower]
        return out

    @staticmethod
    def _placement(snapshot: Snapshot, rows: list[tuple[int, int, int, int]]) -> Placement:
        """Rows of (job index, copy key, node, count) -> Placement with copies renumbered 0..k-1."""
        if not rows:
            return Placement.empty()
        renum: dict[tuple[int, int], int] = {}
        per_job: dict[int, int] = {}
        job, node, count, copy = [], [], [], []
        for i, key, nd, c in rows:
            k = renum.get((i, key))
            if k is None:
                k = per_job.get(i, 0)
                per_job[i] = k + 1
                renum[(i, key)] = k
            job.append(int(snapshot.job_ids[i]))
            node.append(nd)
            count.append(c)
            copy.append(k)
        return Placement(np.array(job, dtype=np.int64), np.array(node, dtype=np.int64),
                         np.array(count, dtype=np.int64), np.array(copy, dtype=np.int64))

    def fill(self, snapshot: Snapshot, placement: Placement, cap: IntArray,
             overhead: FloatArray) -> Placement:
        """Give GPUs nobody took to more copies of placed jobs (step 3)."""
        free = snapshot.node_gpus - gpus_in_use(placement, (), snapshot.node_gpus.shape[0])
        if free.sum() <= 0:
            return placement
        index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
        copies = placement.by_job_copies()
        rows = [(index_of[j], k, nd, c) for j, cps in copies.items() for k, rs in cps.items()
                for nd, c in rs]
        prev_nodes = self.nodes_held(snapshot)
        worker = snapshot.rate / snapshot.scale[:, None]
        state: dict[int, tuple[int, float, set[int]]] = {}  # i -> (copies, rate, nodes)
        for j, cps in copies.items():
            i = index_of[j]
            if not snapshot.multi_node_copies and any(
                    len({nd for nd, _ in rs}) > 1 for rs in cps.values()):
                continue  # a gang over nodes: as a copy it may not span them, so no more copies
            rate = 0.0
            nodes: set[int] = set()
            for rs in cps.values():
                types = {int(snapshot.node_type[nd]) for nd, _ in rs}
                gpus = sum(c for _, c in rs)
                rate += gpus * float(min(worker[i, h] for h in types))
                nodes |= {nd for nd, _ in rs}
            state[i] = (len(cps), rate, nodes)
        next_key = {i: k for i, (k, _rate, _nodes) in state.items()}  # copies are 0..k-1
        # A job that runs now as the decision has it would restart, all its copies, if it got
        # one more: that pays only if the faster rest of the round makes up for the restart.
        now_runs = snapshot.current.by_job_copies()
        restart = {index_of[j] for j, cps in copies.items()
                   if _copy_sets(now_runs.get(j, {})) == _copy_sets(cps)}
        kept_after_restart = after_restart(float(snapshot.migration_s), float(snapshot.round_s))
        while True:
            best: tuple[float, int, list[tuple[int, int]], float] | None = None
            for i, (k, rate, nodes) in state.items():
                if k >= cap[i] or rate <= 0 or snapshot.remaining[i] <= 0:
                    continue
                finish = float(snapshot.remaining[i]) / rate
                if best is not None and finish <= best[0]:
                    continue
                spot = self._spot(snapshot, i, free, nodes, prev_nodes.get(i, set()))
                if spot is None:
                    continue
                gangs, add = spot
                eff_now = 1.0 - overhead[i] if k > 1 else 1.0
                kept = kept_after_restart if i in restart else 1.0
                if (rate + add) * (1.0 - overhead[i]) * kept <= rate * eff_now:
                    continue
                if not self._copy_repays(snapshot, i, rate, add, overhead[i], k,
                                         i in restart):
                    continue
                best = (finish, i, gangs, add)
            if best is None:
                break
            _, i, gangs, add = best
            restart.discard(i)  # (it restarts now: a further copy costs no more)
            k, rate, nodes = state[i]
            for nd, c in gangs:
                free[nd] -= c
                rows.append((i, next_key[i], nd, c))
            next_key[i] += 1
            state[i] = (k + 1, rate + add, nodes | {nd for nd, _ in gangs})
        return self._placement(snapshot, rows)

    @staticmethod
    def balance_spread(snapshot: Snapshot, placement: Placement, cap: IntArray,
                       overhead: FloatArray) -> Placement:
        """The copies of the jobs the world asks to spread (``Snapshot.spread``: a study's
        trials) that start anew this epoch, dealt out again among them and the trials of
        their kind left waiting, so that the last of them ends as soon as it can.  Hadar plans
        each copy as a job of its own, so two equal trials could get copies of unequal speed
        (traced: recsys-48 alone, the last rung's three trials on 67, 102 and 88 steps/s; a
        rung ends with its last trial), and it ranks the copies of equal trials one trial
        after the other, so one trial could run as several copies while its equals waited or
        ran on one (recsys-48 draw 1 amid other jobs, docs/algorithm.md).  Per job type,
        scale factor and path (``Snapshot.after``: a study's trials of one rung; across rungs
        Hadar's order stands), the copies' nodes (one node each) are handed out fastest
        first, each to the job that ends last on what it has so far (at most its cap of
        copies, ``cap``, never two copies of one job on a node), and the result is kept if
        its last job ends sooner, counting consolidation (``overhead``, once a job has two
        copies) and restarts (``migration_s``); a job left waiting starts on the GPUs of the
        planned job that ends first.  A job that keeps its GPUs as they run now (it would
        restart), that may not be stopped (``fixed``), or whose copies span nodes is left
        alone."""
        if snapshot.spread is None or not snapshot.spread.any() or len(placement) == 0:
            return placement
        index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
        copies = placement.by_job_copies()
        now_runs = snapshot.current.by_job_copies()
        fixed = snapshot.fixed
        after = (snapshot.after if snapshot.after is not None
                 else np.zeros(snapshot.num_jobs, dtype=np.float64))
        groups: dict[tuple[str, int, float], list[int]] = {}
        for j, cps in copies.items():
            i = index_of[j]
            if (not snapshot.spread[i] or (fixed is not None and fixed[i])
                    or snapshot.remaining[i] <= 0
                    or _copy_sets(now_runs.get(j, {})) == _copy_sets(cps)
                    or any(len({nd for nd, _ in rs}) != 1 for rs in cps.values())):
                continue
            groups.setdefault((snapshot.job_types[i], int(snapshot.scale[i]), float(after[i])),
                              []).append(i)
        # A trial left waiting beside one of its kind may take some of its GPUs, where that
        # ends the last of them sooner than its waiting for them (Hadar ranks the copies of
        # equal trials one trial after the other, so one ran as two copies while the other
        # waited).
        waiting = (snapshot.spread & (snapshot.remaining > 0) & (snapshot.rate.max(axis=1) > 0)
                   & ~np.isin(snapshot.job_ids, placement.job))
        if fixed is not None:
            waiting &= ~np.asarray(fixed, dtype=np.bool_)
        for i in np.nonzero(waiting)[0].tolist():
            key = (snapshot.job_types[i], int(snapshot.scale[i]), float(after[i]))
            if key in groups:
                groups[key].append(i)
        if all(len(members) < 2 for members in groups.values()):
            return placement
        rows = [(index_of[j], k, nd, c) for j, cps in copies.items() for k, rs in cps.items()
                for nd, c in rs]
        restart_s = float(snapshot.migration_s)

        def ends(members: list[int], got: dict[int, list[tuple[int, int]]],
                 worker: FloatArray) -> float:
            """When the last of ``members`` ends on ``got``, restarts counted; a job with no
            GPUs in ``got`` starts on those of the job that ends first (longest first)."""
            free: list[list[float]] = []  # [when its GPUs come free, their speed] per job
            for i in members:
                if not got[i]:
                    continue
                speed = sum(c * float(worker[snapshot.node_type[nd]]) for nd, c in got[i])
                if len(got[i]) > 1:
                    speed *= 1.0 - float(overhead[i])
                now = _copy_sets(now_runs.get(int(snapshot.job_ids[i]), {}))
                moved = now != frozenset(frozenset([slot]) for slot in got[i])
                free.append([float(snapshot.remaining[i]) / speed
                             + (restart_s if moved else 0.0), speed])
            if not free:
                return float("inf")
            last = max(t for t, _ in free)
            for i in sorted((i for i in members if not got[i]),
                            key=lambda m: (-float(snapshot.remaining[m]), m)):
                slot = min(free)
                slot[0] += restart_s + float(snapshot.remaining[i]) / slot[1]
                last = max(last, slot[0])
            return last

        changed = False
        for members in groups.values():
            if len(members) < 2:
                continue
            worker = snapshot.rate[members[0]] / snapshot.scale[members[0]]
            planned: dict[int, list[tuple[int, int]]] = {}
            for i in members:
                planned[i] = [(rs[0][0], sum(g for _nd, g in rs))  # (one node per copy)
                              for rs in copies.get(int(snapshot.job_ids[i]), {}).values()]
            slots = sorted((s for i in members for s in planned[i]),
                           key=lambda s: (-s[1] * float(worker[snapshot.node_type[s[0]]]), s[0]))
            got = HadarEPolicy._deal(snapshot, members, slots, cap, worker)
            if got is None:
                continue  # (fewer nodes than jobs: who runs is Hadar's order)
            if ends(members, got, worker) >= ends(members, planned, worker) * (1.0 - 1e-9):
                continue
            dealt = set(members)
            rows = [r for r in rows if r[0] not in dealt]
            rows += [(i, k, nd, c) for i in members for k, (nd, c) in enumerate(got[i])]
            changed = True
        return HadarEPolicy._placement(snapshot, rows) if changed else placement

    @staticmethod
    def _deal(snapshot: Snapshot, members: list[int], slots: list[tuple[int, int]],
              cap: IntArray, worker: FloatArray) -> dict[int, list[tuple[int, int]]] | None:
        """``slots`` (node, GPUs), fastest first, each to the job of ``members`` that ends
        last on what it has so far (at most ``cap`` copies, one per node); None where a job
        is left with none."""
        got: dict[int, list[tuple[int, int]]] = {i: [] for i in members}
        left = {i: float(snapshot.remaining[i]) for i in members}
        speed = dict.fromkeys(members, 0.0)
        for nd, c in slots:
            open_ = [i for i in members
                     if len(got[i]) < max(int(cap[i]), 1) and all(nd != x for x, _ in got[i])]
            if not open_:
                break
            i = max(open_, key=lambda m: (left[m] / speed[m] if speed[m] > 0 else np.inf,
                                          left[m], -m))
            got[i].append((nd, c))
            speed[i] += c * float(worker[snapshot.node_type[nd]])
        return None if any(not got[i] for i in members) else got

    @staticmethod
    def _copy_repays(snapshot: Snapshot, i: int, rate: float, add: float, overhead: float,
                     copies: int, restarts: bool) -> bool:
        """Whether one more copy (``add`` steps/s beside ``rate``) ends job ``i`` sooner,
        where it would end within the round as it runs: the copy costs the whole job a
        consolidation each round and, if it runs now (``restarts``), a restart
        (``migration_s``) before any copy trains again.  A job that runs past the round is left
        to the round's test (the caller's).  A trial near its rung's end, whose fill epochs
        come seconds apart as its cohort reports, got a copy at each one and restarted each
        time, making no progress."""
        round_s = max(float(snapshot.round_s), 1e-9)
        consolidate = overhead * round_s
        now = (consolidate if copies > 1 else 0.0) + float(snapshot.remaining[i]) / rate
        if now >= round_s:
            return True
        then = ((float(snapshot.migration_s) if restarts else 0.0) + consolidate
                + float(snapshot.remaining[i]) / (rate + add))
        return then < now

    def _spot(self, snapshot: Snapshot, i: int, free: IntArray, avoid: set[int],
              prefer: set[int]) -> tuple[list[tuple[int, int]], float] | None:
        """Where one more copy of job ``i`` goes: the fastest type with room, on nodes the job
        does not use; ``(rows, rate)`` or None."""
        need = int(snapshot.scale[i])
        order = np.argsort(-snapshot.rate[i], kind="stable")
        for h in order.tolist():
            if snapshot.rate[i, h] <= 0:
                break
            cand = [nd for nd in np.nonzero((snapshot.node_type == h) & (free > 0))[0].tolist()
                    if nd not in avoid]
            if not cand:
                continue
            # Whole copy on one node: preferred nodes first, then the best fit.
            whole = [nd for nd in cand if free[nd] >= need]
            if whole:
                nd = min(whole, key=lambda x: (x not in prefer, int(free[x]), x))
                return [(nd, need)], float(snapshot.rate[i, h])
            if not snapshot.multi_node_copies:
                continue
            cand.sort(key=lambda x: (x not in prefer, -int(free[x]), x))
            gangs: list[tuple[int, int]] = []
            left = need
            for nd in cand:
                take = min(int(free[nd]), left)
                gangs.append((nd, take))
                left -= take
                if left == 0:
                    return gangs, float(snapshot.rate[i, h])
        return None


def forked_detail(placement: Placement) -> dict[int, str]:
    """``Decision.detail`` for each job ``placement`` forks: "forked into k copies"."""
    return {j: f"forked into {k} copies" for j, k in placement.num_copies().items() if k > 1}


def _copy_sets(copies: dict[int, list[tuple[int, int]]]) -> frozenset[frozenset[tuple[int, int]]]:
    """A job's copies as a set of row sets: the same for the same copies, however numbered."""
    return frozenset(frozenset(rows) for rows in copies.values())


def separate_copies(virt: Snapshot, placement: Placement, owner: IntArray) -> Placement:
    """Hadar's placement of the copies (``virt``'s, ``owner`` per copy) with the copies that
    its matcher put on a node another copy of the same job holds moved off it where a swap
    allows: a one-row copy trades nodes with a one-row job of another owner, of the same GPU
    count on another node of the same type, where neither owner then has two rows on one node
    and neither row is one its job held there last epoch (a swap moves no running job).  The
    per-type counts and the GPUs in use per node are unchanged; only who is where."""
    p = placement
    if len(p) < 2:
        return p
    vj = p.job
    rows_per = np.bincount(vj, minlength=virt.num_jobs)
    own = owner[vj]
    node = p.node.astype(np.int64)  # (a copy: the swaps write to it)
    num_nodes = int(virt.node_gpus.shape[0])
    key = own * num_nodes + node
    uniq, cnt = np.unique(key, return_counts=True)
    if not bool((cnt > 1).any()):
        return p
    cur = virt.current
    held_keys = np.unique(cur.job.astype(np.int64) * num_nodes + cur.node.astype(np.int64))
    held = np.isin(vj * num_nodes + node, held_keys)
    single = (rows_per[vj] == 1) & ~held
    # rows that repeat an owner's node: all but one (a held row, else the first, stays)
    dup = np.zeros(len(p), dtype=np.bool_)
    order = np.lexsort((~held, key))  # per key, held rows first
    sk = key[order]
    repeat = np.r_[False, sk[1:] == sk[:-1]]
    dup[order[repeat]] = True
    occupied: dict[int, int] = dict(zip(uniq.tolist(), cnt.tolist(), strict=True))
    ntype = virt.node_type.astype(np.int64)
    for r in np.flatnonzero(dup & single).tolist():
        o, x = int(own[r]), int(node[r])
        cand = np.flatnonzero(single & (ntype[node] == ntype[x]) & (p.count == p.count[r])
                              & (node != x) & (own != o))
        for s in cand.tolist():
            y, q = int(node[s]), int(own[s])
            if occupied.get(o * num_nodes + y, 0) or occupied.get(q * num_nodes + x, 0):
                continue
            for k, d in ((o * num_nodes + x, -1), (q * num_nodes + y, -1),
                         (o * num_nodes + y, 1), (q * num_nodes + x, 1)):
                occupied[k] = occupied.get(k, 0) + d
            node[r], node[s] = y, x
            break
    return Placement(p.job, node, p.count, p.copy)


__all__ = ["Basics", "HadarEPolicy", "HadarEState", "fork_drain", "separate_copies"]
