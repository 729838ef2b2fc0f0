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
import numpy.typing as npt

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


def balance_types(gpu_s: FloatArray, capacity: IntArray, pi: FloatArray, scale: IntArray,
                  window: float, base_load: FloatArray | None = None,
                  start: FloatArray | None = None, max_moves: int = 10000) -> FloatArray:
    """Split each job's remaining work over GPU types so that no type is overloaded.

    ``gpu_s[i, h]`` is the GPU-seconds job ``i`` needs on type ``h`` alone (inf: cannot run);
    a job on ``scale[i]`` GPUs takes ``gpu_s / scale`` seconds.  The split is the primal side
    of the drain estimate, close to the fluid makespan LP's assignment:

    1. each job starts from its split in ``start`` (last epoch's, so that jobs do not hop
       between types for nothing) or, if new, on its cheapest type at the drain prices ``pi``
       (its comparative advantage);
    2. a job that would then take longer than ``window`` moves just enough of its work to its
       fastest type to fit (a job runs on one set of GPUs at a time);
    3. work moves from the most loaded type (per GPU) to the least loaded one, the job that
       loses least by the move first, never making a job longer than ``window``, until the
       loads are level or nothing can move.

    Returns fractions ``phi[i, h]`` of each job's remaining work (rows sum to 1).
    """
    n, num_types = gpu_s.shape
    phi = np.zeros((n, num_types))
    if n == 0:
        return phi
    cap = capacity.astype(np.float64)
    usable = cap > 0
    ok = np.isfinite(gpu_s) & usable[None, :]
    g = np.where(ok, gpu_s, np.inf)
    priced = np.where(ok, g * pi[None, :], np.inf)
    first = np.argmin(np.where(np.isfinite(priced), priced, np.where(ok, 1e300, np.inf)), axis=1)
    rows = np.arange(n)
    runnable = ok[rows, first]
    phi[rows[runnable], first[runnable]] = 1.0
    if start is not None:
        keep = (start * ok).sum(axis=1)
        warm = keep > 0.999
        phi[warm] = (start * ok)[warm] / keep[warm, None]
    sf = scale.astype(np.float64)
    g0 = np.where(ok, g, 0.0)
    # 2. Jobs too long for the window: shift work to the fastest type.
    fastest = np.argmin(np.where(ok, g, np.inf), axis=1)
    length = (phi * g0).sum(axis=1) / sf
    for i in np.nonzero(runnable & (length > window))[0].tolist():
        h0, hf = int(first[i]), int(fastest[i])
        if h0 == hf:
            continue
        t_slow, t_fast = g[i, h0] / sf[i], g[i, hf] / sf[i]
        f = min(1.0, (t_slow - window) / (t_slow - t_fast))
        phi[i, h0] -= f
        phi[i, hf] += f
    load = (phi * g0).sum(axis=0)
    if base_load is not None:
        load = load + base_load
    slack = window * sf - (phi * g0).sum(axis=1)  # GPU-seconds each job may still grow by
    moves = 0
    for _ in range(8):
        moves += _level(phi, g, ok, load, cap, usable, slack, max_moves - moves)
        if not _exchange(phi, g, ok, load, usable, slack):
            break
    return phi


def _level(phi: FloatArray, g: FloatArray, ok: npt.NDArray[np.bool_], load: FloatArray,
           cap: FloatArray, usable: npt.NDArray[np.bool_], slack: FloatArray,
           max_moves: int) -> int:
    """Move work from the most to the least loaded type until level; returns the moves made."""
    moves = 0
    while moves < max_moves:
        per = np.where(usable, load / np.where(usable, cap, 1.0), np.inf)
        src = int(np.argmax(np.where(usable, per, -np.inf)))
        dst = int(np.argmin(per))
        gap = per[src] - per[dst]
        if gap <= 1e-9 * max(per[src], 1.0):
            break
        grow = g[:, dst] - g[:, src]  # GPU-seconds a whole job grows by if moved
        movable = (phi[:, src] > 1e-12) & ok[:, dst] & ((grow <= 0) | (slack > 1e-9))
        if not movable.any():
            break
        ratio = np.where(movable, g[:, dst] / np.where(movable, g[:, src], 1.0), np.inf)
        i = int(np.argmin(ratio))
        g_src = float(g[i, src])
        g_dst = float(g[i, dst])
        # Moving a fraction d of job i's work: load_src -= d*g_src, load_dst += d*g_dst.
        d = gap / (g_src / cap[src] + g_dst / cap[dst])
        d = min(d, float(phi[i, src]))
        if grow[i] > 0:
            d = min(d, float(slack[i]) / float(grow[i]))
        moves += 1
        if d <= 1e-12:
            slack[i] = 0.0
            if grow[i] <= 0:
                break
            continue
        phi[i, src] -= d
        phi[i, dst] += d
        load[src] -= d * g_src
        load[dst] += d * g_dst
        slack[i] -= d * grow[i]
    return moves


def _exchange(phi: FloatArray, g: FloatArray, ok: npt.NDArray[np.bool_], load: FloatArray,
              usable: npt.NDArray[np.bool_], slack: FloatArray) -> bool:
    """Swap work between two types where that saves GPU-seconds (a 2-cycle of the LP).

    For types X and Y, job a moves from X to Y at a cost of ``g[a,Y]/g[a,X]`` GPU-seconds on
    Y per GPU-second freed on X, job b from Y to X at ``g[b,X]/g[b,Y]``; when the product is
    below 1 the swap frees capacity on X while leaving Y as loaded as it was.  Returns True if
    any swap was made (the loads then need levelling again).
    """
    num_types = g.shape[1]
    changed = False
    for x in range(num_types):
        for y in range(num_types):
            if x == y or not (usable[x] and usable[y]):
                continue
            for _ in range(64):
                ca = (phi[:, x] > 1e-12) & ok[:, y] & ((g[:, y] <= g[:, x]) | (slack > 1e-9))
                cb = (phi[:, y] > 1e-12) & ok[:, x] & ((g[:, x] <= g[:, y]) | (slack > 1e-9))
                if not (ca.any() and cb.any()):
                    break
                ra = np.where(ca, g[:, y] / np.where(ca, g[:, x], 1.0), np.inf)
                rb = np.where(cb, g[:, x] / np.where(cb, g[:, y], 1.0), np.inf)
                a = int(np.argmin(ra))
                b = int(np.argmin(rb))
                if a == b or ra[a] * rb[b] >= 1.0 - 1e-9:
                    break
                # u GPU-seconds of a leave X and land as u*ra on Y; v = u*ra of b leave Y and
                # land as v*rb on X.  Limit by what a and b hold there and by job lengths.
                u = float(phi[a, x] * g[a, x])
                u = min(u, float(phi[b, y] * g[b, y]) / float(ra[a]))
                grow_a = float(g[a, y] - g[a, x]) / float(g[a, x])  # per GPU-s moved
                grow_b = float(g[b, x] - g[b, y]) / float(g[b, y])
                if grow_a > 0:
                    u = min(u, float(slack[a]) / grow_a)
                if grow_b > 0:
                    u = min(u, float(slack[b]) / (grow_b * float(ra[a])))
                if u <= 1e-9:
                    break
                v = u * float(ra[a])
                phi[a, x] -= u / g[a, x]
                phi[a, y] += u / g[a, x]
                phi[b, y] -= v / g[b, y]
                phi[b, x] += v / g[b, y]
                load[x] += -u + v * float(rb[b])
                slack[a] -= u * grow_a
                slack[b] -= v * grow_b
                changed = True
    return changed


@dataclass(frozen=True)
class HadarState:
    """Carried from epoch to epoch: the absolute time by which all work should drain."""

    target: float
    phi: dict[int, tuple[float, ...]]


@dataclass
class HadarPolicy:
    """Hadar.  ``horizon`` epochs of look-ahead; ``migration_s`` charged for a move."""

    horizon: int = 8
    migration_s: float = 0.0
    target_slack: float = 0.0
    margin_rounds: float = 1.5
    min_floor: float = 0.05
    type_tolerance: float = 0.0
    total_rule: bool = False
    stable_split: bool = False
    guard_tight: bool = False
    warm_split: bool = False
    chain_factor: float = 0.8
    critical_speedup: bool = False
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
        prev = snapshot.policy_state
        known = prev.phi if isinstance(prev, HadarState) else {}
        phi = np.zeros((n, num_types))
        fresh = np.ones(n, dtype=np.bool_)
        warm = np.zeros((n, num_types))
        for i, j in enumerate(snapshot.job_ids.tolist()):
            row = known.get(j)
            if row is not None:
                warm[i] = row
                if self.stable_split:
                    phi[i] = row
                    fresh[i] = False
        finite_need = np.where(np.isfinite(need), need, 0.0)
        if fresh.any():
            base = (phi[~fresh] * finite_need[~fresh]).sum(axis=0)
            limit = drain * (1.0 + self.target_slack)
            for _ in range(3):
                phi[fresh] = balance_types(need[fresh], capacity, pi, scale[fresh], limit,
                                           base_load=base,
                                           start=warm[fresh] if self.warm_split else None)
                # If the split cannot drain by the limit anyway, relax the job-length limit to
                # what it achieves, so that no job is kept off an idle type for nothing.
                load = base + (phi[fresh] * finite_need[fresh]).sum(axis=0)
                achieved = float((load / np.maximum(capacity, 1)).max())
                if achieved <= limit * 1.0001:
                    break
                limit = achieved
        split = {int(j): tuple(phi[i].tolist()) for i, j in enumerate(snapshot.job_ids.tolist())}
        own = np.argmax(phi, axis=1)
        # Time to finish on the types the balance gives it, one after the other.
        rem_own = (phi * np.where(np.isfinite(need), need, 0.0)).sum(axis=1) / scale
        target = snapshot.now + drain * (1.0 + self.target_slack)
        if isinstance(prev, HadarState) and prev.target > snapshot.now:
            target = max(prev.target, snapshot.now + drain)
        window = target - snapshot.now
        order, critical, tight = self.queue_order(snapshot, rem_best, rem_own, own, window, capacity)
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
        # A type that its own jobs need all of, until the target, serves only them.
        mine = phi > self.type_tolerance
        fill_rate = worker_rate if not self.guard_tight else np.where(
            mine | ~tight[None, :], worker_rate, 0.0)
        worker_rate = np.where(mine, worker_rate, 0.0)
        # A critical job may only use types on which it still finishes by the target; if none
        # is fast enough, only its fastest.
        after = window - snapshot.round_s * self.margin_rounds
        finish_s = np.divide(snapshot.remaining[:, None], snapshot.rate,
                             out=np.full(snapshot.rate.shape, np.inf), where=snapshot.rate > 0)
        fits = finish_s <= after
        fastest = finish_s == finish_s.min(axis=1, keepdims=True)
        usable = np.where(fits.any(axis=1, keepdims=True), fits, fastest)
        crit_rate = np.where(usable & (fill_rate > 0), fill_rate, 0.0)
        # Prefer its balanced types among those that fit.
        crit_pref = np.where(worker_rate > 0, crit_rate, 0.0)
        crit_rate = np.where((crit_pref > 0).any(axis=1, keepdims=True), crit_pref, crit_rate)
        if self.critical_speedup:
            worker_rate = np.where(critical[:, None], crit_rate, worker_rate)
        alloc, _payoff, status = plan(
            snapshot.remaining.astype(np.float64), scale, worker_rate, fill_rate, ukey, age,
            snapshot.sync.astype(np.int64), current, order, capacity, float(snapshot.round_s),
            int(self.horizon), float(self.migration_s), floor, hi / lo,
        )
        placement, placed = match_nodes(snapshot, alloc, order)
        reason[status == 3] = Reason.NO_THROUGHPUT
        reason[(status == 1)] = Reason.NO_FREE_GPU
        reason[placed] = Reason.PLACED
        return Decision(snapshot.epoch, placement, reason, HadarState(target, split))

    def queue_order(self, snapshot: Snapshot, rem_best: FloatArray, rem_own: FloatArray,
                    own: IntArray, window: float, capacity: IntArray,
                    ) -> tuple[IntArray, npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
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
        tight = np.zeros(capacity.shape[0], dtype=np.bool_)
        for h in range(capacity.shape[0]):
            members = np.nonzero(own == h)[0]
            if members.shape[0] == 0:
                continue
            by_len = members[np.argsort(-rem_own[members], kind="stable")]
            # McNaughton's conditions after this round, over the longest jobs first: the k
            # longest (in GPUs) must fit in k GPUs over the window, and all of them in the
            # type's capacity.  The longest prefix that cannot wait must run now.
            gpus = np.cumsum(scale[by_len])
            work = np.cumsum(scale[by_len] * rem_own[by_len])
            # McNaughton's conditions after this round: the k longest jobs (as long as they
            # fit on the type together) must fit in their GPUs over the window; the longest
            # prefix that cannot wait must run now.
            over = (work > gpus * after) & (gpus <= capacity[h])
            hit = np.nonzero(over)[0]
            if hit.shape[0]:
                critical[by_len[: int(hit[-1]) + 1]] = True
            # Jobs wider than half the type can never run side by side: they form a chain
            # that must fit in the window; if it does not, the longest of them runs now.
            wide = by_len[scale[by_len] * 2 > capacity[h]]
            if wide.shape[0] > 1 and float(rem_own[wide].sum()) > after * self.chain_factor:
                critical[wide[0]] = True
            if work[-1] > float(capacity[h]) * after:
                tight[h] = True
                if self.total_rule:
                    critical[members] = True
        srpt = rem_best / snapshot.weight
        key_crit = np.where(critical, -rem_own, np.inf)
        order = np.lexsort((snapshot.job_ids, srpt, key_crit, ~critical)).astype(np.int64)
        return order, critical, tight
