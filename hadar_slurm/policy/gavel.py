"""Gavel's heterogeneity-aware baselines: ``gavel-las``, ``gavel-makespan`` and ``fifo-perf``.

Gavel (Narayanan et al., OSDI 2020) schedules in two layers, both reimplemented here from its
published semantics (no Gavel code):

1. **An allocation LP**, recomputed now and then, gives every job ``i`` a time share ``x[i, h]``
   of each GPU type ``h`` (the fraction of wall-clock time it should hold ``scale[i]`` GPUs of
   that type).  Two objectives are offered:

   * ``gavel-las`` -- Gavel's ``max_min_fairness_perf`` (heterogeneity-aware least attained
     service): maximise the smallest normalised throughput, :func:`max_min_fairness_lp`;
   * ``gavel-makespan`` -- Gavel's ``min_total_duration_perf``: the smallest horizon ``T`` by
     which every job can finish, found by bisection over feasibility LPs,
     :func:`min_total_duration_lp`.

   Both LPs are solved with SciPy's HiGHS on sparse matrices.  A third allocation is no LP:
   ``fifo-perf``, Gavel's ``fifo_perf``, gives each job in arrival order all its time on the
   fastest type with room, :func:`fifo_perf_allocation` (its GPUs left over go to no one:
   :attr:`GavelPolicy.backfill`).

2. **A round mechanism** turns the shares into whole GPUs, one round (``Snapshot.round_s``,
   360 s) at a time (:meth:`GavelPolicy.allocate`):

   * counters ``job_time[i, h]`` (seconds ``i`` ran on ``h`` since the last recompute, plus half
     a round) start at ``round_s / 2`` and are reset with every recompute;
   * the priority of job ``i`` on type ``h`` is its share over the time it received,
     ``x[i, h] / job_time[i, h]`` (Gavel divides by the fraction ``job_time / worker_time``;
     ``worker_time[h]`` is common to every job of a type and the ranking is per type, so it is
     left out); a job without a share, or that cannot run on ``h``, has priority 0;
   * per type, jobs are ranked by ``(priority, deficit, share)`` descending, ties to the lower
     job id; the per-type rankings are walked one after the other in the order of
     ``Snapshot.gpu_types`` (V100, then P100, then K80 on Gavel's cluster), each job taking
     ``scale[i]`` GPUs of the type it is met under if that many are left and it is not placed
     yet (a job too large for what is left is skipped, smaller ones behind it still fit);
   * a job that arrived after the last recompute has no share yet: the walk may still pick it,
     but it does not run, and the GPUs it took stay idle this round (as in Gavel);
   * ``deficit[i, h]`` (the tie-breaker) accumulates, at each recompute, the time the job
     should have had on ``h`` since the previous recompute, ``x_old[i, h] * elapsed``, minus
     the time it had.

   **When the allocation is recomputed.**  Only when the set of jobs changed (an arrival or a
   completion) since the last recompute, and then only once at least ``min_reset_s`` (1920 s,
   Gavel's ``minimum_time_between_allocation_resets``) have passed since the last recompute
   (or the last recompute was at time 0, which Gavel cannot tell from "never").  So new jobs
   can wait up to 1920 s for a share
   (:attr:`~hadar_slurm.policy.base.Reason.AWAITING_ALLOCATION`), and finished jobs' shares
   are backfilled by the ranking until the next recompute.  One exception: when the old
   allocation would leave every GPU idle although jobs wait, the allocation is recomputed at
   once (Gavel forces a recompute when nothing runs and nothing more is queued; it cannot know
   about future arrivals, and neither can we).

All of it is a pure function of the :class:`~hadar_slurm.policy.base.Snapshot`: the allocation,
counters, deficits and the time of the last recompute travel in a frozen :class:`GavelState`
through ``Decision.policy_state``.

**Non-unique optima.**  Both LPs have many optimal solutions, and which one a solver returns
changes the schedule.  Gavel used cvxpy with ECOS, an interior-point solver, which returns a
point inside the optimal face; HiGHS returns a vertex.  Max-min fairness breaks ties with a
second objective (the most total normalised throughput); min total duration solves Gavel's
own LP, whose vertex already behaves like Gavel's point.  See the LP functions.

**Validation.**  On Gavel's three published traces (4 V100 : 4 P100 : 4 K80) both baselines
land within 3 % of Gavel's published makespans and average JCTs (``tests/
test_gavel_baselines.py``).  The simulator credits fractional steps; Gavel's truncates each
round's steps to an integer (``int(rate * 360)``), so its rounds end a little early: with that
truncation and Gavel's own solver the round mechanism here reproduces Gavel's figures to the
second on four of the six runs and within 0.5 % on the other two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import scipy.optimize as opt
import scipy.sparse as sp

from hadar_slurm.policy.base import BoolArray, Decision, FloatArray, IntArray, Reason, Snapshot
from hadar_slurm.policy.matching import match_nodes

MIN_RESET_S = 1920.0
"""Gavel's ``minimum_time_between_allocation_resets`` (seconds)."""

SHARE_STEP = 1e-7
"""Shares are rounded to this step, so that shares equal but for the solver's round-off tie
exactly (and Gavel's ranking sends ties to the lower job id)."""

_OPT = {"presolve": True, "dual_feasibility_tolerance": 1e-9,
        "primal_feasibility_tolerance": 1e-9}


class LPError(RuntimeError):
    """HiGHS did not solve an allocation LP (should not happen: every LP here is feasible)."""


# -- the LPs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Base:
    """The constraints every Gavel allocation shares, over the variables ``x[i, h] > 0`` allowed.

    ``x[i, h]`` exists only where ``rate[i, h] > 0`` (no share of a type a job cannot use);
    ``0 <= x <= 1``; a type is not over-committed, ``sum_i scale[i] * x[i, h] <= c[h]``; a job
    holds at most one set of GPUs at a time, ``sum_h x[i, h] <= 1``.
    """

    m: int
    h: int
    row: IntArray  # job of each variable
    col: IntArray  # type of each variable

    @staticmethod
    def of(rate: FloatArray) -> _Base:
        m, h = rate.shape
        row, col = np.nonzero(rate > 0)
        return _Base(m, h, row.astype(np.int64), col.astype(np.int64))

    @property
    def nx(self) -> int:
        return int(self.row.shape[0])

    def a_ub(self, scale: IntArray, extra_cols: int) -> sp.csr_matrix:
        """Capacity rows (``h``) then one-set-at-a-time rows (``m``)."""
        k = np.arange(self.nx)
        rows = np.concatenate([self.col, self.h + self.row])
        cols = np.concatenate([k, k])
        vals = np.concatenate([scale[self.row].astype(np.float64), np.ones(self.nx)])
        return sp.csr_matrix((vals, (rows, cols)), shape=(self.h + self.m, self.nx + extra_cols))

    def b_ub(self, capacity: IntArray) -> FloatArray:
        return np.concatenate([capacity.astype(np.float64), np.ones(self.m)])

    def unflatten(self, values: FloatArray) -> FloatArray:
        """``x[m, H]`` from the LP's variables, clipped to [0, 1] and rounded to ``SHARE_STEP``."""
        x = np.zeros((self.m, self.h))
        x[self.row, self.col] = np.clip(np.round(values[: self.nx] / SHARE_STEP) * SHARE_STEP,
                                        0.0, 1.0)
        return x


def _solve(c: FloatArray, a_ub: sp.csr_matrix, b_ub: FloatArray,
           bounds: list[tuple[float | None, float | None]], what: str,
           method: str = "highs") -> FloatArray:
    res = opt.linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method=method, options=_OPT)
    if res.status != 0 or res.x is None:
        raise LPError(f"{what}: HiGHS status {res.status}: {res.message}")
    return np.asarray(res.x, dtype=np.float64)


def proportional_throughput(rate: FloatArray, capacity: IntArray) -> FloatArray:
    """Each job's throughput under an equal split of every type: ``sum_h rate[i, h] * c[h] / C``.

    Gavel's normaliser for max-min fairness: the split ``x[i, h] = c[h] / m`` scaled so that a
    row sums to one, ``x[i, h] = c[h] / C`` with ``C = sum_h c[h]``.
    """
    cap = capacity.astype(np.float64)
    total = float(cap.sum())
    if total <= 0:
        return np.zeros(rate.shape[0])
    return np.asarray(rate @ cap / total, dtype=np.float64)


def max_min_fairness_lp(rate: FloatArray, scale: IntArray, weight: FloatArray,
                        capacity: IntArray, tie_break: str = "sum") -> FloatArray:
    """Gavel's ``max_min_fairness_perf`` allocation, ``x[m, H]``.

    In words: give every job a time share of every type so that the worst-off job, measured by
    its throughput relative to an equal split of the cluster and divided by its priority
    weight, is as well off as possible.  In maths, with ``p_i`` =
    :func:`proportional_throughput` and ``s_i`` the scale factor::

        maximise    t
        subject to  sum_h (rate[i, h] * s_i / (w_i * p_i)) * x[i, h] >= t    for every job i
                    sum_i s_i * x[i, h] <= c[h]                            for every type h
                    sum_h x[i, h] <= 1,   0 <= x <= 1                       for every job i

    The factor ``s_i`` is Gavel's: of two jobs with the same normalised throughput, the one on
    ``s_i`` GPUs gets ``s_i`` times less time, so both get the same GPU-time.  Jobs no type
    can run (``p_i = 0``) get nothing and are left out of the LP.

    Only ``t`` is optimised, so the shares of the jobs that are not the worst off are not
    unique.  ``tie_break`` picks one:

    * ``"sum"`` (the default): a second LP keeps the optimum, ``t >= t* (1 - 1e-9)``, and
      maximises the total normalised throughput ``sum_i sum_h (rate[i, h] * s_i / (w_i * p_i))
      * x[i, h]``: no share is left unused that would speed some job up (a Pareto-efficient
      max-min allocation);
    * ``"none"``: whatever vertex HiGHS returns for the first LP.
    """
    m, h = rate.shape
    x = np.zeros((m, h))
    prop = proportional_throughput(rate, capacity)
    ok = (prop > 0) & (rate > 0).any(axis=1)
    if not ok.any():
        return x
    idx = np.nonzero(ok)[0]
    r = rate[idx]
    base = _Base.of(r)
    coef = (r[base.row, base.col] * scale[idx][base.row]
            / (weight[idx][base.row] * prop[idx][base.row]))
    n_var = base.nx + 1  # x, then t
    k = np.arange(base.nx)
    fair = sp.csr_matrix(
        (np.concatenate([-coef, np.ones(base.m)]),
         (np.concatenate([base.row, np.arange(base.m)]),
          np.concatenate([k, np.full(base.m, base.nx)]))),
        shape=(base.m, n_var))
    a_ub = sp.vstack([fair, base.a_ub(scale[idx], 1)], format="csr")
    b_ub = np.concatenate([np.zeros(base.m), base.b_ub(capacity)])
    bounds: list[tuple[float | None, float | None]] = [(0.0, 1.0)] * base.nx + [(0.0, None)]
    c = np.zeros(n_var)
    c[-1] = -1.0
    # Every job ties at t* (a very degenerate vertex): HiGHS's interior-point method (with
    # crossover) gets there several times faster than its simplex methods.
    sol = _solve(c, a_ub, b_ub, bounds, "max-min fairness LP", method="highs-ipm")
    if tie_break == "sum":
        t_star = float(sol[-1])
        bounds[-1] = (t_star * (1.0 - 1e-9), None)
        c2 = np.zeros(n_var)
        c2[: base.nx] = -coef
        sol = _solve(c2, a_ub, b_ub, bounds, "max-min fairness LP (tie-break)")
    elif tie_break != "none":
        raise ValueError(f"unknown tie_break {tie_break!r}")
    x[idx] = base.unflatten(sol)
    return x


def _bisect_horizon(t_star: float, lo: float = 100.0, hi: float = 1e6) -> float:
    """The horizon Gavel's search settles on when the smallest feasible one is ``t_star``.

    Gavel bisects ``T`` on ``[100, 1e6]`` (then ``[1e6, 1e7]``, ... while nothing is feasible)
    until ``1.05 * lo >= hi``, keeps the allocation of the last feasible midpoint, and so
    answers with a horizon up to about 5 % above the optimum.  A horizon is feasible exactly
    when ``T >= t_star``, so replaying the same midpoints against ``t_star`` gives the same
    horizon as solving one feasibility LP per midpoint.
    """
    tol = 1e-9 * max(t_star, 1.0)
    last: float | None = None
    top = hi
    while last is None:
        while 1.05 * lo < hi:
            mid = (lo + hi) / 2.0
            if mid >= t_star - tol:
                last = mid
                hi = mid
            else:
                lo = mid
        lo, hi = top, top * 10.0
        top *= 10.0
    return last


def min_total_duration_lp(rate: FloatArray, scale: IntArray, remaining: FloatArray,
                          capacity: IntArray, tie_break: str = "none"
                          ) -> tuple[FloatArray, float]:
    """Gavel's ``min_total_duration_perf`` allocation ``x[m, H]`` and its horizon ``T``.

    In words: the shortest time ``T`` in which every job could do its remaining work ``R_i``
    if each held its shares for the whole of ``T``, and shares that achieve it.  Gavel's
    feasibility LP at horizon ``T`` is::

        find        x
        subject to  sum_h rate[i, h] * x[i, h] >= R_i / T                  for every job i
                    sum_i s_i * x[i, h] <= c[h]                            for every type h
                    sum_h x[i, h] <= 1,   0 <= x <= 1                       for every job i

    (no priority weights, no scale-factor weighting of the throughput), and Gavel bisects
    ``T``.  Here the smallest feasible horizon comes from one LP instead,
    ``T* = 1 / max u`` subject to ``sum_h rate[i, h] * x[i, h] >= u * R_i`` and the same
    constraints; Gavel's bisection is then replayed against ``T*`` (:func:`_bisect_horizon`)
    to get the horizon ``T`` (up to 5 % above ``T*``) that it settles on, and the feasibility
    LP above is solved once, at that ``T``.  Two LPs in all.

    Gavel's objective is a constant, so any feasible point will do, and which one changes
    the schedule.  ``tie_break``:

    * ``"none"`` (the default): Gavel's LP exactly as it is, constant objective, solved by
      HiGHS's (deterministic) simplex, whose answer is a vertex of the feasible set.  In
      practice that vertex keeps nearly every job at exactly its pace, ``sum_h rate[i, h] *
      x[i, h] = R_i / T``, so that all jobs head for the common horizon, as in Gavel; GPUs
      left over are backfilled by the round mechanism.  (Gavel's interior-point solver
      returned a point inside the set instead; re-solving with the jobs in other orders,
      which moves HiGHS to other vertices, changed our makespans by < 1 % and average JCTs by
      < 4 % on Gavel's traces.)
    * ``"min-gpu"``: the feasible point using the fewest GPU-seconds,
      ``min sum_i,h s_i * x[i, h]``: every job exactly at its pace, on its most efficient
      types, spare GPUs left idle in the allocation.

    Jobs no type can run, or with nothing left to do, are left out (share 0).
    """
    m, h = rate.shape
    x = np.zeros((m, h))
    ok = (rate > 0).any(axis=1) & (remaining > 0)
    if not ok.any():
        return x, 0.0
    idx = np.nonzero(ok)[0]
    r = rate[idx]
    rem = remaining[idx]
    base = _Base.of(r)
    # Units: d = the longest best-type runtime, so that v = u * d = d / T* lies in (0, 1].
    d = float((rem / r.max(axis=1)).max())
    coef = r[base.row, base.col] * d / rem[base.row]  # progress per unit share, in R_i / d
    k = np.arange(base.nx)
    n_var = base.nx + 1  # x, then v
    pace = sp.csr_matrix(
        (np.concatenate([-coef, np.ones(base.m)]),
         (np.concatenate([base.row, np.arange(base.m)]),
          np.concatenate([k, np.full(base.m, base.nx)]))),
        shape=(base.m, n_var))
    a_ub = sp.vstack([pace, base.a_ub(scale[idx], 1)], format="csr")
    b_ub = np.concatenate([np.zeros(base.m), base.b_ub(capacity)])
    bounds: list[tuple[float | None, float | None]] = [(0.0, 1.0)] * base.nx + [(0.0, None)]
    c = np.zeros(n_var)
    c[-1] = -1.0
    sol = _solve(c, a_ub, b_ub, bounds, "min total duration LP")
    v_star = float(sol[-1])
    if v_star <= 0:
        raise LPError("min total duration LP: no horizon is feasible")
    horizon = _bisect_horizon(d / v_star)
    bounds[-1] = (d / horizon, d / horizon)  # the pace at horizon T: R_i / T, in R_i / d
    c2 = np.zeros(n_var)
    if tie_break == "min-gpu":
        c2[: base.nx] = scale[idx][base.row]
    elif tie_break != "none":
        raise ValueError(f"unknown tie_break {tie_break!r}")
    sol = _solve(c2, a_ub, b_ub, bounds, "min total duration LP at the horizon")
    x[idx] = base.unflatten(sol)
    return x, horizon


def fifo_perf_allocation(rate: FloatArray, scale: IntArray, capacity: IntArray) -> FloatArray:
    """Gavel's ``fifo_perf`` allocation: jobs in id (arrival) order, each all its time on the
    fastest type (for it) with ``scale`` GPUs still free; the first job that fits on no type
    stops the queue (nothing overtakes it).  A job no type can run is skipped.  Returns
    ``x[m, H]`` (one 1.0 per assigned job)."""
    n, num_types = rate.shape
    x = np.zeros((n, num_types))
    free = capacity.astype(np.int64).copy()
    for i in range(n):
        runs = rate[i] > 0
        if not runs.any():
            continue
        fits = runs & (free >= scale[i])
        if not fits.any():
            break
        h = int(np.argmax(np.where(fits, rate[i], -1.0)))
        x[i, h] = 1.0
        free[h] -= int(scale[i])
    return x


# -- the round mechanism ---------------------------------------------------------------------


@dataclass(frozen=True)
class GavelState:
    """What Gavel remembers between rounds; rows are aligned with ``job_ids`` (ascending).

    ``alloc[i, h]`` is the share of job ``i`` in the last allocation, ``in_alloc[i]`` False for
    jobs that arrived after it; ``base_attained`` is ``Snapshot.attained`` at the last recompute
    (so ``job_time = round_s / 2 + attained - base_attained``); ``deficit`` is Gavel's
    tie-breaker; ``need_update`` says the job set changed since the last recompute;
    ``last_reset`` is the time of the last recompute (0 before the first, as in Gavel);
    ``horizon`` the ``T`` of the last min-total-duration LP (NaN for max-min fairness).
    The arrays are never written to after construction.
    """

    job_ids: IntArray
    in_alloc: BoolArray
    alloc: FloatArray
    base_attained: FloatArray
    deficit: FloatArray
    need_update: bool = True
    last_reset: float = 0.0
    recomputes: int = 0
    horizon: float = math.nan

    @staticmethod
    def initial(num_types: int) -> GavelState:
        z = np.zeros((0, num_types))
        return GavelState(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.bool_), z, z.copy(),
                          z.copy())


_T = TypeVar("_T", bound=np.generic)


def _aligned(state_ids: IntArray, values: npt.NDArray[_T], ids: IntArray,
             default: float | bool) -> tuple[npt.NDArray[_T], BoolArray]:
    """Rows of ``values`` (keyed by ascending ``state_ids``) for ``ids``; ``default`` rows for
    ids the state does not know.  Returns the rows and the mask of known ids."""
    out = np.full((ids.shape[0], *values.shape[1:]), default, dtype=values.dtype)
    if state_ids.shape[0] == 0:
        return out, np.zeros(ids.shape[0], dtype=np.bool_)
    pos = np.minimum(np.searchsorted(state_ids, ids), state_ids.shape[0] - 1)
    known = state_ids[pos] == ids
    out[known] = values[pos[known]]
    return out, known


def _walk(prio: FloatArray, deficit: FloatArray, alloc: FloatArray, rate: FloatArray,
          scale: IntArray, capacity: IntArray) -> IntArray:
    """Gavel's greedy pass over the per-type rankings; returns the type each job took (-1: none).

    Rows are in job-id order.  Per type ``h`` (in the cluster's type order) jobs are ranked by
    ``(prio, deficit, alloc)`` descending, ties to the lower job id; a job takes ``scale``
    GPUs of ``h`` if it has none yet, can run on ``h`` and fits in what is left.
    """
    n, num_types = rate.shape
    took = np.full(n, -1, dtype=np.int64)
    left = capacity.astype(np.int64).copy()
    ids = np.arange(n)
    for h in range(num_types):
        if left[h] <= 0:
            continue
        cand = np.nonzero((rate[:, h] > 0) & (scale <= left[h]))[0]
        rank = cand[np.lexsort((ids[cand], -alloc[cand, h], -deficit[cand, h], -prio[cand, h]))]
        for i in rank.tolist():
            if took[i] >= 0 or scale[i] > left[h]:
                continue
            took[i] = h
            left[h] -= scale[i]
            if left[h] == 0:
                break
    return took


class GavelPolicy:
    """Gavel's round-based scheduler over one of its allocation LPs (see the module docstring).

    ``objective``: ``"las"`` (max-min fairness) or ``"makespan"`` (min total duration).
    """

    def __init__(self, objective: str, *, min_reset_s: float = MIN_RESET_S,
                 tie_break: str | None = None) -> None:
        if objective not in ("las", "makespan", "fifo"):
            raise ValueError(f"unknown Gavel objective {objective!r}")
        self.objective = objective
        self.name = "fifo-perf" if objective == "fifo" else f"gavel-{objective}"
        self.min_reset_s = min_reset_s
        self.tie_break = tie_break or ("sum" if objective == "las" else "none")
        #: Whether GPUs left over in a round go to jobs without a share on them.  Gavel runs a
        #: job on a type only with a positive priority there; its LPs, solved by an interior
        #: point method, give every job some sliver of a share, so in effect every waiting job
        #: may take GPUs left over (as our exact LP solutions' zeros are made to), while
        #: ``fifo_perf``'s allocation is exactly 1 or 0: a job it did not assign waits for the
        #: next recompute.  (With backfill, fifo-perf lands 8% and 27% below Gavel's makespan
        #: and average JCT on static_32 and poisson_200; without, within 3%.)
        self.backfill = objective != "fifo"

    def solve(self, rate: FloatArray, scale: IntArray, weight: FloatArray, remaining: FloatArray,
              capacity: IntArray) -> tuple[FloatArray, float]:
        """The allocation ``x[m, H]`` of the policy's LP (and the horizon, NaN for LAS)."""
        if self.objective == "las":
            x = max_min_fairness_lp(rate, scale, weight, capacity, self.tie_break)
            return x, math.nan
        if self.objective == "fifo":
            return fifo_perf_allocation(rate, scale, capacity), math.nan
        return min_total_duration_lp(rate, scale, remaining, capacity, self.tie_break)

    def allocate(self, snapshot: Snapshot) -> Decision:
        num_types = len(snapshot.gpu_types)
        prev = snapshot.policy_state
        if not isinstance(prev, GavelState) or prev.alloc.shape[1] != num_types:
            prev = GavelState.initial(num_types)
        n = snapshot.num_jobs
        half = snapshot.round_s / 2.0
        now = float(snapshot.now)
        perm = np.argsort(snapshot.job_ids, kind="stable")  # Gavel's order: job id
        ids = snapshot.job_ids[perm]
        rate = snapshot.rate[perm]
        scale = snapshot.scale[perm]
        attained = snapshot.attained[perm]
        capacity = snapshot.capacity()

        # Carry the state over to this epoch's jobs (new jobs: no share, counters at 0).
        alloc, _ = _aligned(prev.job_ids, prev.alloc, ids, 0.0)
        in_alloc, _ = _aligned(prev.job_ids, prev.in_alloc, ids, False)
        deficit, _ = _aligned(prev.job_ids, prev.deficit, ids, 0.0)
        base, known = _aligned(prev.job_ids, prev.base_attained, ids, 0.0)
        base[~known] = attained[~known]
        st = GavelState(ids, in_alloc, alloc, base, deficit,
                        need_update=prev.need_update or not np.array_equal(ids, prev.job_ids),
                        last_reset=prev.last_reset, recomputes=prev.recomputes,
                        horizon=prev.horizon)

        if st.need_update and (now - st.last_reset >= self.min_reset_s or st.last_reset == 0.0):
            st = self._recompute(st, snapshot, perm, attained, half, now)
        took, runs = self._round(st, rate, scale, attained, half, capacity, self.backfill)
        if st.need_update and n > 0 and not runs.any():
            # The old allocation would run nothing although jobs wait: recompute now (Gavel
            # forces a recompute when nothing runs and no more jobs are queued).
            st = self._recompute(st, snapshot, perm, attained, half, now)
            took, runs = self._round(st, rate, scale, attained, half, capacity, self.backfill)

        counts = np.zeros((n, num_types), dtype=np.int64)
        sel = np.nonzero(runs)[0]
        counts[perm[sel], took[sel]] = scale[sel]
        order = np.lexsort((snapshot.job_ids, -snapshot.scale))  # big jobs first, then by id
        placement, placed = match_nodes(snapshot, counts, order)

        reason_sorted = np.full(n, Reason.SHARE_SERVED, dtype=np.int8)
        reason_sorted[~st.in_alloc] = Reason.AWAITING_ALLOCATION
        reason_sorted[~(rate > 0).any(axis=1)] = Reason.NO_THROUGHPUT
        reason_sorted[runs] = Reason.NO_FREE_GPU  # unless the matcher placed it (below)
        reason = np.empty(n, dtype=np.int8)
        reason[perm] = reason_sorted
        reason[placed] = Reason.PLACED
        return Decision(snapshot.epoch, placement, reason, policy_state=st)

    def _recompute(self, st: GavelState, snapshot: Snapshot, perm: IntArray,
                   attained: FloatArray, half: float, now: float) -> GavelState:
        """Gavel's reset: settle the deficits, reset the counters, solve the LP anew."""
        received = attained - st.base_attained  # = job_time - round_s / 2
        deficit = st.deficit + st.alloc * (now - st.last_reset) - received
        alloc, horizon = self.solve(snapshot.rate[perm], snapshot.scale[perm],
                                    snapshot.weight[perm], snapshot.remaining[perm],
                                    snapshot.capacity())
        return GavelState(st.job_ids, np.ones(st.job_ids.shape[0], dtype=np.bool_), alloc,
                          attained.copy(), deficit, need_update=False, last_reset=now,
                          recomputes=st.recomputes + 1, horizon=horizon)

    @staticmethod
    def _round(st: GavelState, rate: FloatArray, scale: IntArray, attained: FloatArray,
               half: float, capacity: IntArray, backfill: bool = True
               ) -> tuple[IntArray, BoolArray]:
        """The type each job takes this round (-1: none) and which of them run (have a share).

        Priority ``x[i, h] / job_time[i, h]``, 0 without a share on ``h``; see :func:`_walk`.
        ``backfill``: GPUs left over go to jobs without a share on them too (see
        :attr:`GavelPolicy.backfill`).
        """
        job_time = half + attained - st.base_attained
        prio = np.zeros_like(st.alloc)
        ok = st.in_alloc[:, None] & (st.alloc > 0) & (rate > 0)
        prio[ok] = st.alloc[ok] / job_time[ok]
        if not backfill:
            rate = np.where(prio > 0, rate, 0.0)  # (a job with no share runs nowhere)
        took = _walk(prio, st.deficit, st.alloc, rate, scale, capacity)
        return took, (took >= 0) & st.in_alloc


class GavelLasPolicy(GavelPolicy):
    """``gavel-las``: Gavel's ``max_min_fairness_perf``."""

    def __init__(self, *, min_reset_s: float = MIN_RESET_S, tie_break: str | None = None) -> None:
        super().__init__("las", min_reset_s=min_reset_s, tie_break=tie_break)


class GavelMakespanPolicy(GavelPolicy):
    """``gavel-makespan``: Gavel's ``min_total_duration_perf``."""

    def __init__(self, *, min_reset_s: float = MIN_RESET_S, tie_break: str | None = None) -> None:
        super().__init__("makespan", min_reset_s=min_reset_s, tie_break=tie_break)


class FifoPerfPolicy(GavelPolicy):
    """``fifo-perf``: Gavel's ``fifo_perf``, its heterogeneity-aware FIFO (a baseline): the
    allocation of :func:`fifo_perf_allocation`, run by Gavel's round mechanism."""

    def __init__(self, *, min_reset_s: float = MIN_RESET_S) -> None:
        super().__init__("fifo", min_reset_s=min_reset_s)
