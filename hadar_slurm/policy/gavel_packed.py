"""``gavel-las-packed``: Gavel's ``max_min_fairness_packed``, max-min fairness with GPU sharing.

Gavel (OSDI 2020) lets two jobs of the same scale factor share the same GPUs ("space sharing")
when their co-located throughputs (``Snapshot.colocated``, Gavel's measured pairs) beat
time-sharing.  This module follows the semantics of Gavel's public implementation (its
``MaxMinFairnessPolicyWithPacking.get_allocation`` and its scheduler's rounds over job
combinations, commit c4fa400), written anew on this project's LP and round code
(:mod:`hadar_slurm.policy.gavel`, whose module docstring explains the round mechanism this one
extends):

**Job combinations.**  Every job alone ("single"), and every pair of jobs with the same scale
factor that may share on some GPU type (both co-located rates > 0 there).  Pairs the table
forbids everywhere are left out (Gavel keeps them, and never runs them).

**The LP** gives every combination ``c`` a time share ``x[c, h]`` of each type ``h``::

    maximise    t
    subject to  sum_{c containing i} sum_h (rate_i(c, h) * s_c / (w_i * n_i)) x[c, h] >= t
                                                                    for every job i
                sum_c s_c * x[c, h] <= cap[h]      for every type h (a pair's GPUs count once)
                sum_{c containing i} sum_h x[c, h] <= 1                for every job i

with ``rate_i(c, h)`` job ``i``'s rate in ``c`` (its isolated rate alone, its co-located rate
in a pair), ``s_c`` the scale factor, ``w_i`` the priority weight and ``n_i = sum_h rate[i, h]``
Gavel's normaliser for packing (the sum of its isolated rates; not the capacity-weighted one of
``max_min_fairness_perf``).  As in ``gavel-las`` a second LP breaks ties among the optimal
allocations (``tie_break="sum"``: the most total normalised throughput), solved by HiGHS.

**The round mechanism** is Gavel's, over combinations instead of jobs:

* ``job_time[c, h]`` counts the time *combination* ``c`` ran on ``h`` since the last recompute
  (a job's time alone counts for its single, its time in a pair for the pair: the round's
  longer of the two), plus half a round; a pair that came to be after the last recompute
  starts at 0, not half a round (Gavel), so that its deficit grows by half a round at the next
  recompute (the tie-breaker of the ranking);
* priority ``x[c, h] / job_time[c, h]``; per type (in the cluster's order) combinations are
  ranked by ``(priority, deficit, share)`` descending, ties in Gavel's order (a job, then its
  pairs with every earlier job, in id order); a combination is taken when none of its jobs is
  placed yet, it can run there, and ``s_c`` GPUs of the type are left;
* a combination the last LP did not know (one of its jobs arrived since) may be taken but does
  not run (its GPUs idle), as in Gavel; recomputes follow the rules of ``gavel-las``.

**Where it runs.**  Only where the backend offers sharing (``Snapshot.colocated``: the simulator
with fixed rounds); elsewhere no pair exists and the policy is ``gavel-las`` with Gavel's
packing normaliser (on a cluster with as many GPUs of every type, that normaliser is a constant
multiple of ``gavel-las``'s and the schedules are the same).  Gavel's packed policies were only
run on single-GPU traces; on traces with multi-GPU jobs this one packs only pairs of the same
scale factor (Gavel's rule), on ``s`` GPUs of one type, both jobs on the same GPUs.

**Validation.**  On Gavel's static_32 and poisson_200 traces (4 V100 : 4 P100 : 4 K80, 360 s
rounds) the makespans and average JCTs land within 1 % of those Gavel's simulator gives for
``max_min_fairness_packed`` (``tests/test_packing.py``, ``python -m bench.packed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from hadar_slurm.policy.base import (
    BoolArray,
    Decision,
    FloatArray,
    IntArray,
    Placement,
    Reason,
    Snapshot,
)
from hadar_slurm.policy.gavel import MIN_RESET_S, SHARE_STEP, _aligned, _solve
from hadar_slurm.policy.matching import match_nodes

_NO_PAIRS = np.zeros((0, 2), dtype=np.int64)


@dataclass(frozen=True)
class Combos:
    """The job combinations of one epoch, rows ``0..m-1`` the jobs alone (in job-id order),
    then the pairs.  ``a``/``b``: the job indices of each (``b = -1`` alone; ``a < b``);
    ``rate_a``/``rate_b``: whole-job steps/s of each member on each type (``rate_b = 0``
    alone); ``scale``: GPUs it takes; ``ok[c, h]``: it can run on ``h``."""

    a: IntArray
    b: IntArray
    rate_a: FloatArray
    rate_b: FloatArray
    scale: IntArray

    @property
    def num(self) -> int:
        return int(self.a.shape[0])

    @property
    def ok(self) -> BoolArray:
        return (self.rate_a > 0) & ((self.b[:, None] < 0) | (self.rate_b > 0))


def job_combinations(snapshot: Snapshot, perm: IntArray) -> Combos:
    """Singles and the pairs that may share somewhere, for the jobs ``perm`` (job-id order)."""
    rate = snapshot.rate[perm]
    scale = snapshot.scale[perm].astype(np.int64)
    m, num_types = rate.shape
    singles = np.arange(m, dtype=np.int64)
    pa = pb = np.zeros(0, dtype=np.int64)
    ra = rb = np.zeros((0, num_types))
    table = snapshot.colocated
    if table is not None and m > 1:
        types = [snapshot.job_types[int(k)] for k in perm.tolist()]
        kinds: dict[tuple[str, int], int] = {}
        kind = np.array([kinds.setdefault((t, int(s)), len(kinds))
                         for t, s in zip(types, scale.tolist(), strict=True)], dtype=np.int64)
        keys = list(kinds)
        kk = np.zeros((len(keys), len(keys), num_types, 2))
        for x, (tx, sx) in enumerate(keys):
            for y, (ty, sy) in enumerate(keys):
                if sx == sy:
                    for h, g in enumerate(snapshot.gpu_types):
                        kk[x, y, h] = table.pair_rate(tx, ty, sx, g)
        ia, ib = np.triu_indices(m, 1)
        pr = kk[kind[ia], kind[ib]]  # [P, H, 2]
        can = ((pr[:, :, 0] > 0) & (pr[:, :, 1] > 0)).any(axis=1) & (scale[ia] == scale[ib])
        pa, pb = ia[can].astype(np.int64), ib[can].astype(np.int64)
        ra, rb = pr[can, :, 0], pr[can, :, 1]
    return Combos(np.concatenate([singles, pa]),
                  np.concatenate([np.full(m, -1, dtype=np.int64), pb]),
                  np.concatenate([rate, ra]), np.concatenate([np.zeros_like(rate), rb]),
                  np.concatenate([scale, scale[pa]]))


def max_min_fairness_packed_lp(combos: Combos, rate: FloatArray, weight: FloatArray,
                               capacity: IntArray, tie_break: str = "sum") -> FloatArray:
    """Gavel's ``max_min_fairness_packed`` allocation ``x[combination, H]`` (see the module
    docstring).  ``rate``: isolated rates of the jobs, ``[m, H]``.  Combinations with a job no
    type can run get nothing.  ``tie_break``: ``"sum"`` (a second LP: the most total
    normalised throughput among the optimal allocations) or ``"none"``."""
    m, num_types = rate.shape
    x = np.zeros((combos.num, num_types))
    norm = rate.sum(axis=1)
    good = norm > 0
    ok = combos.ok & good[combos.a][:, None] & ((combos.b < 0) | good[combos.b])[:, None]
    if not ok.any():
        return x
    cv, hv = np.nonzero(ok)
    nx = int(cv.shape[0])
    jobs = np.nonzero(good)[0]
    row_of = np.full(m, -1, dtype=np.int64)
    row_of[jobs] = np.arange(jobs.shape[0])
    nj = int(jobs.shape[0])
    a, b = combos.a[cv], combos.b[cv]
    sc = combos.scale[cv].astype(np.float64)
    coef_a = combos.rate_a[cv, hv] * sc / (weight[a] * norm[a])
    pair = b >= 0
    bb = b[pair]
    coef_b = combos.rate_b[cv[pair], hv[pair]] * sc[pair] / (weight[bb] * norm[bb])
    k = np.arange(nx)
    # Fairness rows (one per job): -sum coef x + t <= 0.
    fair = sp.csr_matrix(
        (np.concatenate([-coef_a, -coef_b, np.ones(nj)]),
         (np.concatenate([row_of[a], row_of[bb], np.arange(nj)]),
          np.concatenate([k, k[pair], np.full(nj, nx)]))),
        shape=(nj, nx + 1))
    cap_rows = sp.csr_matrix((sc, (hv, k)), shape=(num_types, nx + 1))
    one = sp.csr_matrix(
        (np.ones(nx + int(pair.sum())),
         (np.concatenate([row_of[a], row_of[bb]]), np.concatenate([k, k[pair]]))),
        shape=(nj, nx + 1))
    a_ub = sp.vstack([fair, cap_rows, one], format="csr")
    b_ub = np.concatenate([np.zeros(nj), capacity.astype(np.float64), np.ones(nj)])
    bounds: list[tuple[float | None, float | None]] = [(0.0, 1.0)] * nx + [(0.0, None)]
    c = np.zeros(nx + 1)
    c[-1] = -1.0
    sol = _solve(c, a_ub, b_ub, bounds, "max-min fairness packed LP", method="highs-ipm")
    if tie_break == "sum":
        bounds[-1] = (float(sol[-1]) * (1.0 - 1e-9), None)
        c2 = np.zeros(nx + 1)
        np.add.at(c2, k, -coef_a)
        np.add.at(c2, k[pair], -coef_b)
        sol = _solve(c2, a_ub, b_ub, bounds, "max-min fairness packed LP (tie-break)")
    elif tie_break != "none":
        raise ValueError(f"unknown tie_break {tie_break!r}")
    x[cv, hv] = np.clip(np.round(sol[:nx] / SHARE_STEP) * SHARE_STEP, 0.0, 1.0)
    return x


@dataclass(frozen=True)
class PackedState:
    """What Gavel remembers between rounds, per job and per pair (see the module docstring).

    Jobs (rows aligned with ascending ``job_ids``): ``in_alloc`` (known to the last LP),
    ``alloc`` (share alone), ``time`` (seconds alone since the last recompute), ``deficit``,
    ``attained`` (``Snapshot.attained`` at the last epoch, to tell what ran since).
    Pairs (rows aligned with ``pair_ids``, ``(lower id, higher id)`` ascending): ``pair_in_alloc``,
    ``pair_alloc``, ``pair_time``, ``pair_deficit``, and ``pair_base`` (the half round its
    ``job_time`` started with: 0 for a pair that came to be after the last recompute).
    The arrays are never written to after construction.
    """

    job_ids: IntArray
    in_alloc: BoolArray
    alloc: FloatArray
    time: FloatArray
    deficit: FloatArray
    attained: FloatArray
    pair_ids: IntArray
    pair_in_alloc: BoolArray
    pair_alloc: FloatArray
    pair_time: FloatArray
    pair_deficit: FloatArray
    pair_base: FloatArray
    need_update: bool = True
    last_reset: float = 0.0
    recomputes: int = 0

    @staticmethod
    def initial(num_types: int) -> PackedState:
        z = np.zeros((0, num_types))
        b = np.zeros(0, dtype=np.bool_)
        return PackedState(np.zeros(0, dtype=np.int64), b, z, z, z, z, _NO_PAIRS, b, z, z, z,
                           np.zeros(0))


def _pair_rows(known: IntArray, ids: IntArray) -> tuple[IntArray, BoolArray]:
    """For each pair of ``ids`` (``[P, 2]``), its row in ``known`` (``[Q, 2]``, ascending)
    and whether it is there."""
    if known.shape[0] == 0 or ids.shape[0] == 0:
        return np.zeros(ids.shape[0], dtype=np.int64), np.zeros(ids.shape[0], dtype=np.bool_)
    index = {(int(x), int(y)): r for r, (x, y) in enumerate(known.tolist())}
    rows = np.array([index.get((int(x), int(y)), -1) for x, y in ids.tolist()], dtype=np.int64)
    return np.maximum(rows, 0), rows >= 0


def _walk(combos: Combos, prio: FloatArray, deficit: FloatArray, alloc: FloatArray,
          order_key: IntArray, capacity: IntArray, m: int) -> IntArray:
    """Gavel's greedy pass over the per-type rankings of combinations; the type each
    combination took (-1: none).  ``order_key[c]``: Gavel's insertion order (ties)."""
    num_types = capacity.shape[0]
    took = np.full(combos.num, -1, dtype=np.int64)
    busy = np.zeros(m, dtype=np.bool_)
    left = capacity.astype(np.int64).copy()
    ok = combos.ok
    for h in range(num_types):
        if left[h] <= 0:
            continue
        cand = np.nonzero(ok[:, h] & (combos.scale <= left[h]))[0]
        rank = cand[np.lexsort((order_key[cand], -alloc[cand, h], -deficit[cand, h],
                                -prio[cand, h]))]
        for c in rank.tolist():
            ja, jb = int(combos.a[c]), int(combos.b[c])
            if busy[ja] or (jb >= 0 and busy[jb]) or combos.scale[c] > left[h]:
                continue
            took[c] = h
            left[h] -= int(combos.scale[c])
            busy[ja] = True
            if jb >= 0:
                busy[jb] = True
            if left[h] == 0:
                break
    return took


class GavelLasPackedPolicy:
    """``gavel-las-packed``: Gavel's ``max_min_fairness_packed`` (see the module docstring)."""

    def __init__(self, *, min_reset_s: float = MIN_RESET_S, tie_break: str = "sum") -> None:
        if tie_break not in ("sum", "none"):
            raise ValueError(f"unknown tie_break {tie_break!r}")
        self.name = "gavel-las-packed"
        self.min_reset_s = min_reset_s
        self.tie_break = tie_break

    def allocate(self, snapshot: Snapshot) -> Decision:
        num_types = len(snapshot.gpu_types)
        prev = snapshot.policy_state
        if not isinstance(prev, PackedState) or prev.alloc.shape[1] != num_types:
            prev = PackedState.initial(num_types)
        n = snapshot.num_jobs
        half = snapshot.round_s / 2.0
        now = float(snapshot.now)
        perm = np.argsort(snapshot.job_ids, kind="stable")
        ids = snapshot.job_ids[perm].astype(np.int64)
        rate = snapshot.rate[perm]
        attained = snapshot.attained[perm]
        capacity = snapshot.capacity()
        combos = job_combinations(snapshot, perm)
        pair_ids = np.stack([ids[combos.a[n:]], ids[combos.b[n:]]], axis=1) if \
            combos.num > n else _NO_PAIRS

        # Carry the state over, and book the epoch that just ended: a job's time in a pair
        # counts for the pair (the longer of its two jobs'), its time alone for itself.
        in_alloc, _ = _aligned(prev.job_ids, prev.in_alloc, ids, False)
        alloc, _ = _aligned(prev.job_ids, prev.alloc, ids, 0.0)
        time, _ = _aligned(prev.job_ids, prev.time, ids, 0.0)
        deficit, _ = _aligned(prev.job_ids, prev.deficit, ids, 0.0)
        last, known = _aligned(prev.job_ids, prev.attained, ids, 0.0)
        last[~known] = attained[~known]
        ran = attained - last
        rows, seen = _pair_rows(prev.pair_ids, pair_ids)

        def carry(values: FloatArray, default: float) -> FloatArray:
            out = np.full((pair_ids.shape[0], *values.shape[1:]), default)
            out[seen] = values[rows[seen]]
            return out

        p_alloc = carry(prev.pair_alloc, 0.0)
        p_time = carry(prev.pair_time, 0.0)
        p_deficit = carry(prev.pair_deficit, 0.0)
        p_base = carry(prev.pair_base, 0.0)
        p_in_alloc = np.zeros(pair_ids.shape[0], dtype=np.bool_)
        p_in_alloc[seen] = prev.pair_in_alloc[rows[seen]]
        shared = np.zeros(n, dtype=np.bool_)
        pos = {int(j): k for k, j in enumerate(ids.tolist())}
        if snapshot.packed:
            ran_pairs = np.array(snapshot.packed, dtype=np.int64).reshape(-1, 2)
            for x, y in ran_pairs.tolist():
                for j in (x, y):
                    if j in pos:
                        shared[pos[j]] = True
            prow, pseen = _pair_rows(pair_ids, ran_pairs)
            for r, ok, (x, y) in zip(prow.tolist(), pseen.tolist(), ran_pairs.tolist(),
                                     strict=True):
                if ok:
                    p_time[r] += np.maximum(ran[pos[x]], ran[pos[y]])
        time = time + np.where(shared[:, None], 0.0, ran)
        st = PackedState(ids, in_alloc, alloc, time, deficit, attained.copy(), pair_ids,
                         p_in_alloc, p_alloc, p_time, p_deficit, p_base,
                         need_update=prev.need_update or not np.array_equal(ids, prev.job_ids),
                         last_reset=prev.last_reset, recomputes=prev.recomputes)

        if st.need_update and (now - st.last_reset >= self.min_reset_s or st.last_reset == 0.0):
            st = self._recompute(st, combos, snapshot, perm, half, now)
        took, runs = self._round(st, combos, half, capacity, n)
        if st.need_update and n > 0 and not runs.any():
            st = self._recompute(st, combos, snapshot, perm, half, now)
            took, runs = self._round(st, combos, half, capacity, n)

        counts = np.zeros((n, num_types), dtype=np.int64)
        sel = np.nonzero(runs)[0]
        counts[perm[combos.a[sel]], took[sel]] = combos.scale[sel]
        order = np.lexsort((snapshot.job_ids, -snapshot.scale))
        lead, placed = match_nodes(snapshot, counts, order)
        placement = lead
        packed: list[tuple[int, int]] = []
        detail: dict[int, str] = {}
        pairs_run = sel[combos.b[sel] >= 0]
        if pairs_run.shape[0]:
            extra_job: list[IntArray] = []
            extra_node: list[IntArray] = []
            extra_count: list[IntArray] = []
            for c in pairs_run.tolist():
                ia, ib = int(perm[combos.a[c]]), int(perm[combos.b[c]])
                if not placed[ia]:
                    continue
                id_a, id_b = int(snapshot.job_ids[ia]), int(snapshot.job_ids[ib])
                mine = lead.job == id_a
                extra_job.append(np.full(int(mine.sum()), id_b, dtype=np.int64))
                extra_node.append(lead.node[mine])
                extra_count.append(lead.count[mine])
                placed[ib] = True
                packed.append((id_a, id_b))
                detail[id_a] = f"shares its GPUs with job {id_b}"
                detail[id_b] = f"shares its GPUs with job {id_a}"
            if extra_job:
                placement = Placement(np.concatenate([lead.job, *extra_job]),
                                       np.concatenate([lead.node, *extra_node]),
                                       np.concatenate([lead.count, *extra_count]))

        in_any = np.zeros(n, dtype=np.bool_)
        in_any[combos.a[sel]] = True
        in_any[combos.b[sel][combos.b[sel] >= 0]] = True
        reason_sorted = np.full(n, Reason.SHARE_SERVED, dtype=np.int8)
        reason_sorted[~st.in_alloc] = Reason.AWAITING_ALLOCATION
        reason_sorted[~(rate > 0).any(axis=1)] = Reason.NO_THROUGHPUT
        reason_sorted[in_any] = Reason.NO_FREE_GPU  # unless the matcher placed it (below)
        reason = np.empty(n, dtype=np.int8)
        reason[perm] = reason_sorted
        reason[placed] = Reason.PLACED
        return Decision(snapshot.epoch, placement, reason, policy_state=st, detail=detail,
                        packed=tuple(sorted(packed)))

    def _recompute(self, st: PackedState, combos: Combos, snapshot: Snapshot, perm: IntArray,
                   half: float, now: float) -> PackedState:
        """Gavel's reset: settle the deficits, reset the counters, solve the LP anew."""
        elapsed = now - st.last_reset
        deficit = st.deficit + st.alloc * elapsed - st.time
        # (a pair's job_time started at pair_base, not half a round: received = time + base
        # - half)
        p_deficit = (st.pair_deficit + st.pair_alloc * elapsed
                     - (st.pair_time + st.pair_base[:, None] - half))
        x = max_min_fairness_packed_lp(combos, snapshot.rate[perm], snapshot.weight[perm],
                                       snapshot.capacity(), self.tie_break)
        n = st.job_ids.shape[0]
        p = st.pair_ids.shape[0]
        z = np.zeros((p, x.shape[1]))
        return PackedState(st.job_ids, np.ones(n, dtype=np.bool_), x[:n], np.zeros_like(st.time),
                           deficit, st.attained, st.pair_ids, np.ones(p, dtype=np.bool_),
                           x[n:], z, p_deficit, np.full(p, half), need_update=False,
                           last_reset=now, recomputes=st.recomputes + 1)

    @staticmethod
    def _round(st: PackedState, combos: Combos, half: float, capacity: IntArray, m: int
               ) -> tuple[IntArray, BoolArray]:
        """The type each combination takes this round (-1: none) and which of them run."""
        alloc = np.concatenate([st.alloc, st.pair_alloc])
        deficit = np.concatenate([st.deficit, st.pair_deficit])
        in_alloc = np.concatenate([st.in_alloc, st.pair_in_alloc])
        job_time = np.concatenate([half + st.time, st.pair_base[:, None] + st.pair_time])
        prio = np.zeros_like(alloc)
        ok = in_alloc[:, None] & (alloc > 0) & combos.ok & (job_time > 0)
        prio[ok] = alloc[ok] / job_time[ok]
        ids = st.job_ids
        hi = np.where(combos.b >= 0, ids[np.maximum(combos.b, 0)], ids[combos.a])
        lo = np.where(combos.b >= 0, ids[combos.a], -1)
        order_key = np.lexsort((lo, hi))
        rank = np.empty_like(order_key)
        rank[order_key] = np.arange(order_key.shape[0])
        took = _walk(combos, prio, deficit, alloc, rank, capacity, m)
        return took, (took >= 0) & in_alloc


__all__ = ["Combos", "GavelLasPackedPolicy", "PackedState", "job_combinations",
           "max_min_fairness_packed_lp"]
