"""``hadar``: the Hadar primal-dual scheduler (HADAR.md), one epoch at a time.

The policy layer prepares arrays, chooses the queue order, calls the core
(:func:`hadar_slurm.core.plan`, compiled, with a NumPy reference twin) for the per-type worker
counts of this epoch, and hands those to the node matcher.

Queue order (which job the dual pass considers first) — the choices HADAR.md leaves open, made
to get both a short makespan and short JCTs:

* **Critical jobs first.**  The policy estimates when the current work could drain at best,
  ``T_drain`` (:func:`drain_estimate`: a Lagrangian lower bound of the fluid makespan LP, from
  type prices fitted in a few dozen multiplicative steps).  A job whose remaining time on its
  best type leaves less than ``slack`` of ``T_drain - now`` is critical: were it delayed further
  it would set the makespan.  Critical jobs go first, least laxity first.
* **Then shortest remaining time first** (weighted), which minimises average JCT.

Utility: ``f(T) = w * ideal / (T - a)``.  ``L`` and ``U`` are the smallest and largest utility
per GPU-second among the jobs in play if each ran alone on its best type from now on
(:func:`utility_bounds`), so an idle cluster admits every job and a full one admits none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hadar_slurm.core import plan
from hadar_slurm.policy.base import Decision, FloatArray, IntArray, Reason, Snapshot
from hadar_slurm.policy.matching import match_nodes


def utility_bounds(ukey: FloatArray, age: FloatArray, rem_best: FloatArray,
                   scale: IntArray) -> tuple[float, float]:
    """(L, U): min and max utility per GPU-second, kept finite, positive and apart."""
    ok = rem_best > 0
    if not ok.any():
        return 1.0, 2.0
    density = ukey[ok] / (age[ok] + rem_best[ok]) / (scale[ok] * rem_best[ok])
    hi = float(density.max())
    lo = float(density.min())
    if not (hi > 0 and np.isfinite(hi)):
        return 1.0, 2.0
    lo = max(lo, hi * 1e-4)
    if hi <= lo * 1.0001:
        hi = lo * 2.0
    return lo, hi


def drain_estimate(remaining: FloatArray, scale: IntArray, rate: FloatArray,
                   capacity: IntArray, iterations: int = 60) -> tuple[float, FloatArray]:
    """A lower bound on the time to finish ``remaining`` work (seconds), cheap to compute.

    ``rate`` is whole-job steps/s.  Lagrangian dual of the fluid makespan LP: for type prices
    ``pi >= 0`` with ``sum pi * c = 1``, ``sum_i R_i * min_h pi_h * S_i / rate_ih`` bounds the
    makespan from below; the prices are improved by multiplicative steps towards the types whose
    demand at the current prices exceeds their capacity.  The bound is also at least the longest
    remaining job on its best type.  Returns the bound and the type prices ``pi`` (normalised
    so that ``sum pi * c = 1``), the shadow value of a GPU-second of each type.
    """
    num_types = capacity.shape[0]
    cap = capacity.astype(np.float64)
    usable = cap > 0
    if not usable.any() or remaining.shape[0] == 0:
        return 0.0, np.where(usable, 1.0 / max(cap.sum(), 1.0), 0.0)
    best = np.where(rate > 0, remaining[:, None] / np.where(rate > 0, rate, 1.0), np.inf)
    longest = float(best.min(axis=1)[np.isfinite(best.min(axis=1))].max(initial=0.0))
    gpu_s = best * scale[:, None]  # GPU-seconds job i needs on type h alone
    gpu_s[:, ~usable] = np.inf
    pi = np.where(usable, 1.0 / max(cap.sum(), 1.0), 0.0)
    bound = 0.0
    best_pi = pi
    for _ in range(iterations):
        priced = gpu_s * pi[None, :]
        choice = np.argmin(priced, axis=1)
        value = float(np.take_along_axis(priced, choice[:, None], axis=1).sum())
        if value > bound:
            bound = value
            best_pi = pi
        demand = np.bincount(choice, weights=gpu_s[np.arange(gpu_s.shape[0]), choice],
                             minlength=num_types)
        load = np.where(usable, demand / np.where(usable, cap, 1.0), 0.0)
        mean = load[usable].mean()
        if mean <= 0:
            break
        pi = pi * np.exp(0.5 * (load / mean - 1.0))
        pi = np.where(usable, pi, 0.0)
        pi = pi / float((pi * cap).sum())
    return max(bound, longest), best_pi


def balance_types(gpu_s: FloatArray, capacity: IntArray, pi: FloatArray,
                  max_moves: int = 10000) -> FloatArray:
    """Split each job's remaining work over GPU types so that no type is overloaded.

    ``gpu_s[i, h]`` is the GPU-seconds job ``i`` needs on type ``h`` alone (inf: cannot run).
    Starts from each job on its cheapest type at the drain prices ``pi`` (its comparative
    advantage), then repeatedly moves work from the most loaded type (per GPU) to the least
    loaded one, taking first the job that loses least by the move, until the loads are level
    or nothing can move.  Returns fractions ``phi[i, h]`` (rows sum to 1): the primal side of
    the drain estimate, close to the fluid makespan LP's assignment.
    """
    n, num_types = gpu_s.shape
    phi = np.zeros((n, num_types))
    if n == 0:
        return phi
    cap = capacity.astype(np.float64)
    usable = cap > 0
    priced = np.where(usable[None, :], gpu_s * pi[None, :], np.inf)
    priced = np.where(np.isfinite(priced), priced, np.inf)
    first = np.argmin(np.where(np.isfinite(priced), priced, np.where(
        np.isfinite(gpu_s) & usable[None, :], 1e300, np.inf)), axis=1)
    runnable = np.isfinite(gpu_s[np.arange(n), first])
    phi[np.arange(n)[runnable], first[runnable]] = 1.0
    load = (phi * np.where(np.isfinite(gpu_s), gpu_s, 0.0)).sum(axis=0)
    for _ in range(max_moves):
        per = np.where(usable, load / np.where(usable, cap, 1.0), np.inf)
        src = int(np.argmax(np.where(usable, per, -np.inf)))
        dst = int(np.argmin(per))
        gap = per[src] - per[dst]
        if gap <= 1e-9 * max(per[src], 1.0):
            break
        cand = (phi[:, src] > 1e-12) & np.isfinite(gpu_s[:, dst])
        if not cand.any():
            break
        ratio = np.where(cand, gpu_s[:, dst] / np.where(cand, gpu_s[:, src], 1.0), np.inf)
        i = int(np.argmin(ratio))
        g_src = float(gpu_s[i, src])
        g_dst = float(gpu_s[i, dst])
        # Moving a fraction d of job i's work: load_src -= d*g_src, load_dst += d*g_dst.
        d = gap / (g_src / cap[src] + g_dst / cap[dst])
        d = min(d, float(phi[i, src]))
        if d <= 0:
            break
        phi[i, src] -= d
        phi[i, dst] += d
        load[src] -= d * g_src
        load[dst] += d * g_dst
        # A move that makes things worse means we are level up to granularity.
        if ratio[i] == np.inf:
            break
    return phi


@dataclass(frozen=True)
class HadarState:
    """Carried from epoch to epoch: the absolute time by which all work should drain."""

    target: float


@dataclass
class HadarPolicy:
    """Hadar.  ``horizon`` epochs of look-ahead; ``migration_s`` charged for a move."""

    horizon: int = 8
    migration_s: float = 0.0
    target_slack: float = 0.02
    margin_rounds: float = 3
    min_floor: float = 0.05
    type_tolerance: float = 0.0
    name: str = "hadar"

    def allocate(self, snapshot: Snapshot) -> Decision:
        n = snapshot.num_jobs
        num_types = len(snapshot.gpu_types)
        reason = np.full(n, Reason.PRICED_OUT, dtype=np.int8)
        if n == 0:
            return Decision(snapshot.epoch, snapshot.current.__class__.empty(), reason)
        scale = snapshot.scale.astype(np.int64)
        worker_rate = snapshot.rate / scale[:, None]
        best_rate = snapshot.rate.max(axis=1)
        ideal = np.divide(snapshot.total, best_rate, out=np.zeros(n), where=best_rate > 0)
        ukey = snapshot.weight * ideal
        age = snapshot.now - snapshot.arrival
        rem_best = np.divide(snapshot.remaining, best_rate, out=np.full(n, np.inf),
                             where=best_rate > 0)
        lo, hi = utility_bounds(ukey, age, rem_best, scale)
        capacity = snapshot.capacity()
        drain, pi = drain_estimate(snapshot.remaining, scale, snapshot.rate, capacity)
        # Remaining time on the type the drain prices assign it (its comparative advantage).
        gpu_s = np.where(snapshot.rate > 0, scale[:, None] / np.where(
            snapshot.rate > 0, snapshot.rate, 1.0) * pi[None, :], np.inf)
        need = np.where(snapshot.rate > 0, scale[:, None] * snapshot.remaining[:, None]
                        / np.where(snapshot.rate > 0, snapshot.rate, 1.0), np.inf)
        phi = balance_types(need, capacity, pi)
        own = np.argmax(phi, axis=1)
        # Time to finish on the types the balance gives it, one after the other.
        rem_own = (phi * np.where(np.isfinite(need), need, 0.0)).sum(axis=1) / scale
        prev = snapshot.policy_state
        target = snapshot.now + drain * (1.0 + self.target_slack)
        if isinstance(prev, HadarState) and prev.target > snapshot.now:
            target = max(prev.target, snapshot.now + drain)
        order = self.queue_order(snapshot, rem_best, rem_own, own, target - snapshot.now,
                                 capacity)
        # Price floors follow the drain prices: a GPU-second of a type in demand costs more.
        # Scaled so that the dearest idle type costs half the least utility density: on an
        # idle cluster every job is worth admitting.
        floor = pi / max(float(pi.max()), 1e-300) * (0.5 * lo)
        floor = np.maximum(floor, 0.5 * lo * self.min_floor)
        current = np.zeros((n, num_types), dtype=np.int64)
        index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
        cur = snapshot.current
        for j, node, c in zip(cur.job.tolist(), cur.node.tolist(), cur.count.tolist(),
                              strict=True):
            i = index_of.get(j)
            if i is not None:
                current[i, snapshot.node_type[node]] += c
        fill_rate = worker_rate
        if self.type_tolerance >= 0:
            worker_rate = np.where(phi > self.type_tolerance, worker_rate, 0.0)
        alloc, _payoff, status = plan(
            snapshot.remaining.astype(np.float64), scale, worker_rate, fill_rate, ukey, age,
            snapshot.sync.astype(np.int64), current, order, capacity, float(snapshot.round_s),
            int(self.horizon), float(self.migration_s), floor, hi / lo,
        )
        placement, placed = match_nodes(snapshot, alloc, order)
        reason[status == 3] = Reason.NO_THROUGHPUT
        reason[(status == 1)] = Reason.NO_FREE_GPU
        reason[placed] = Reason.PLACED
        return Decision(snapshot.epoch, placement, reason, HadarState(target))

    def queue_order(self, snapshot: Snapshot, rem_best: FloatArray, rem_own: FloatArray,
                    own: IntArray, window: float, capacity: IntArray) -> IntArray:
        """Critical jobs first (largest remaining first), then shortest remaining time first.

        A job is critical when, on its own type (the one the drain prices give it), the work
        that would be left after this round could no longer fit before the target: either the
        job alone is longer than the window after this round, or its type's total work would
        exceed the type's capacity over that window (then the longest jobs of that type go
        first, as McNaughton's bound for preemptive parallel machines asks).
        """
        n = snapshot.num_jobs
        d = float(snapshot.round_s)
        after = window - d * self.margin_rounds
        scale = snapshot.scale.astype(np.float64)
        critical = np.zeros(n, dtype=np.bool_)
        for h in range(capacity.shape[0]):
            members = np.nonzero(own == h)[0]
            if members.shape[0] == 0:
                continue
            p = rem_own[members]
            by_len = members[np.argsort(-p, kind="stable")]
            critical[members[p > after]] = True
            # Total GPU-seconds left after this round if only the critical ones run now.
            left = float((scale[members] * rem_own[members]).sum())
            left -= float((scale[members] * np.minimum(rem_own[members], d))[
                critical[members]].sum())
            room = float(capacity[h]) * max(after, 0.0)
            used = float((scale[members] * critical[members]).sum())
            for i in by_len.tolist():
                if left <= room or used + scale[i] > capacity[h]:
                    break
                if critical[i]:
                    continue
                critical[i] = True
                used += scale[i]
                left -= scale[i] * min(float(rem_own[i]), d)
        srpt = rem_best / snapshot.weight
        key_crit = np.where(critical, -rem_own, np.inf)
        return np.lexsort((snapshot.job_ids, srpt, key_crit, ~critical)).astype(np.int64)
