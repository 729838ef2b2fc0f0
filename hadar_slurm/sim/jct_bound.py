"""A lower bound on the average JCT of a static queue's schedules that end by a given time.

Issue #15 asks Hadar for two things on every trace at once: a makespan within 3% of the gang
bound and an average JCT no worse than the best baseline's.  The makespan bound says how soon a
schedule can end; nothing said how short its average JCT can then be.  This module answers
that for a static queue (every job there at time 0), so that a trace where the two goals
cannot both be met can be told from one where Hadar falls short of them.

:func:`config_jct_bound` is a time-indexed configuration LP.  Time up to ``horizon`` is cut
into intervals of ``interval_s`` (``s_k`` the start of interval ``k``, ``L_k`` its length).  A
*configuration* is a set of jobs that can run at once, as in the makespan's configuration LP
(:func:`hadar_slurm.sim.bounds.config_makespan_bound`: each job on its scale factor of GPUs,
per type at most the type's GPUs; a synchronous gang may mix types at least as fast as its
pace type and runs at that type's rate, as the simulator runs one).  ``x[c]`` is the time
configuration ``c`` runs in its interval, and ``f[j, k]`` the share of job ``j``'s work done in
interval ``k``.  Every job's work is done by the horizon, ``sum_k f[j, k] = 1``.

A job's completion time ``C_j`` is bounded below through its *mean busy time* ``M_j``, the mean
of the times at which its work is done (the mean-busy-time relaxation of preemptive
scheduling, Goemans 1997, here with a rate that may change):

* a job progresses at most at its fastest rate, the whole job alone on its fastest type, so its
  work takes at least ``p_j`` seconds, and of all ways to finish by ``C_j`` the one doing it
  all at that rate just before ``C_j`` has the latest mean busy time: ``C_j >= M_j + p_j / 2``;
* the share ``f[j, k]`` done in interval ``k`` takes at least ``f[j, k] * p_j`` seconds from
  ``s_k`` on, so its mean time is at least ``s_k + f[j, k] * p_j / 2``:
  ``M_j >= sum_k f[j, k] * (s_k + f[j, k] * p_j / 2)``.

The square is replaced by tangent lines below it (``q >= 2 a f - a^2``), so the LP minimises a
value no greater than any schedule's.  Minimising ``sum_j C_j`` over the LP gives a lower bound
on the average JCT of every preemptive schedule that ends by ``horizon`` (rounds, start and
move costs aside, all of which only lengthen a schedule).  With ``horizon`` at 1.03 times the
makespan bound, a trace whose bound exceeds the best baseline's average JCT is a trace where
no schedule meets both of issue #15's goals for Hadar.

Columns are generated per interval by the makespan LP's pricing MIP; every iteration gives a
valid (Lagrangian) bound, the best of which is returned, with whether it met the master LP's
value, i.e. whether the LP was solved to optimality.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import scipy.optimize as opt
import scipy.sparse as sp

from hadar_slurm.policy.base import FloatArray, IntArray
from hadar_slurm.sim.bounds import _Pricing, config_makespan_bound

#: Tangent points of the square, as shares of a job's most work in one interval.
TANGENTS = (0.125, 0.25, 0.5, 0.75, 1.0)


def fastest_times(remaining: FloatArray, scale: IntArray, rate: FloatArray,
                  capacity: IntArray, mixed: bool = True) -> FloatArray:
    """Per job, its work's time alone at its fastest pace (``p_j``); ``inf`` where it fits on
    no type."""
    n = rate.shape[0]
    work = remaining > 0
    alone = _Pricing(scale, rate, capacity, work, mixed)
    best = np.zeros(n)
    for i in np.nonzero(work)[0].tolist():
        y = np.zeros(n)
        y[i] = 1.0
        best[i] = alone.solve(y, 1e-9)[1][i]
    out: FloatArray = np.divide(remaining, best, out=np.full(n, np.inf), where=best > 0)
    return out


def config_jct_bound(
    remaining: FloatArray, scale: IntArray, rate: FloatArray, capacity: IntArray,
    horizon: float, interval_s: float = 360.0, mixed: bool = True,
    max_iterations: int = 400, time_limit_s: float = 1800.0, tol: float = 1e-7,
    progress: Callable[[int, float, float, int], None] | None = None,
    shares: list[FloatArray] | None = None,
) -> tuple[float, bool]:
    """``(bound, exact)``: a lower bound on the average completion time (seconds from 0) of the
    jobs with work left, over the preemptive schedules that finish all of it by ``horizon``
    (see the module docstring).  ``exact``: the column generation ended with the LP solved.
    Returns ``inf`` when no schedule finishes by ``horizon`` (some work is left undone at the
    LP's optimum, and the bound says so).  Raises ``ValueError`` for a job with work left that
    fits on no type, a horizon or an interval that is not positive.

    ``progress``: called after every iteration with its number, the master LP's value, the
    best bound so far (both summed over the jobs, before the constant ``sum p_j / 2``) and the
    number of configurations.  ``shares``: a list that is set to hold the last master LP's
    ``f`` (jobs with work left x intervals)."""
    if not horizon > 0 or not interval_s > 0:
        raise ValueError(f"horizon and interval_s must be > 0, got {horizon!r}, {interval_s!r}")
    keep = remaining > 0
    if not keep.any():
        return 0.0, True
    work = np.asarray(remaining, dtype=np.float64)[keep]
    scale = np.asarray(scale)[keep]
    rate = np.asarray(rate, dtype=np.float64)[keep]
    n = work.shape[0]
    p = fastest_times(work, scale, rate, capacity, mixed)
    if not np.isfinite(p).all():
        bad = int(np.nonzero(~np.isfinite(p))[0][0])
        raise ValueError(f"job {bad} fits on no GPU type (scale {int(scale[bad])})")
    starts = np.arange(0.0, horizon, interval_s)
    k_count = starts.shape[0]
    lengths = np.minimum(interval_s, horizon - starts)
    pricing = _Pricing(scale, rate, capacity, np.ones(n, dtype=np.bool_), mixed)

    # Variables: f[j, k] (n*K, index j*K + k), q[j, k] (n*K), u[j] (n: work left undone, at a
    # price no schedule pays), then the columns.
    nf = n * k_count
    fj = np.repeat(np.arange(n), k_count)
    fk = np.tile(np.arange(k_count), n)
    big = 10.0 * (horizon + float(p.max()))
    cost_fixed = np.concatenate([starts[fk], p[fj] / 2.0, np.full(n, big)])
    most = np.minimum(lengths[fk] / p[fj], 1.0)  # the most of its work a job does in one k
    # rows: work (n), definition of f (n*K), time per interval (K), tangents (n*K*T)
    t_count = len(TANGENTS)
    tan_a = np.concatenate([most * a for a in TANGENTS])
    tan_rows = np.arange(nf * t_count)
    tan_f = np.tile(np.arange(nf), t_count)
    fixed_rows = sp.vstack([
        # -sum_k f[j, k] - u[j] <= -1
        sp.csr_matrix((np.concatenate([-np.ones(nf), -np.ones(n)]),
                       (np.concatenate([fj, np.arange(n)]),
                        np.concatenate([np.arange(nf), 2 * nf + np.arange(n)]))),
                      shape=(n, 2 * nf + n)),
        # f[j, k] - (work done in k) / R_j <= 0  (the columns' part below)
        sp.csr_matrix((np.ones(nf), (np.arange(nf), np.arange(nf))), shape=(nf, 2 * nf + n)),
        sp.csr_matrix((k_count, 2 * nf + n)),
        # 2 a f - q <= a^2
        sp.csr_matrix((np.concatenate([2.0 * tan_a, -np.ones(nf * t_count)]),
                       (np.concatenate([tan_rows, tan_rows]),
                        np.concatenate([tan_f, nf + tan_f]))),
                      shape=(nf * t_count, 2 * nf + n)),
    ]).tocsr()
    b = np.concatenate([-np.ones(n), np.zeros(nf), lengths, tan_a ** 2])

    # Start: the makespan LP's configurations (with the horizon past its bound, they finish
    # the work in time; its first ones are each job alone at its fastest pace); every
    # configuration is offered in every interval, as is each one the pricing finds later.
    seed: list[FloatArray] = []
    config_makespan_bound(work, scale, rate, capacity, mixed=mixed, tol=tol, columns=seed)
    distinct: dict[bytes, FloatArray] = {}
    for col in seed:
        distinct.setdefault(np.asarray(col, dtype=np.float64).tobytes(), col)
    configs = list(distinct.values())
    best = 0.0
    exact = False
    deadline = time.monotonic() + time_limit_s
    for it in range(max_iterations):
        nc = len(configs) * k_count
        a = np.repeat(np.array(configs).T / work[:, None], k_count, axis=1)  # share of each
        # job's work per second of column; column c is configuration c // K in interval c % K
        ck = np.tile(np.arange(k_count), len(configs))
        # definition rows: -a[j, c] for the columns of interval k, in row n + j*K + k
        rr, cc = np.nonzero(a)
        col_rows = sp.vstack([
            sp.csr_matrix((n, nc)),
            sp.csr_matrix((-a[rr, cc], (rr * k_count + ck[cc], cc)), shape=(nf, nc)),
            sp.csr_matrix((np.ones(nc), (ck, np.arange(nc))), shape=(k_count, nc)),
            sp.csr_matrix((nf * t_count, nc)),
        ])
        a_ub = sp.hstack([fixed_rows, col_rows]).tocsr()
        c = np.concatenate([cost_fixed, np.zeros(nc)])
        res = opt.linprog(c, A_ub=a_ub, b_ub=b, bounds=(0.0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"JCT bound LP failed: {res.message}")
        z = float(res.fun)
        eta = np.maximum(-res.ineqlin.marginals[n:n + nf], 0.0).reshape(n, k_count)
        mu = np.maximum(-res.ineqlin.marginals[n + nf:n + nf + k_count], 0.0)
        gain = 0.0
        added = 0
        for k in range(k_count):
            y = eta[:, k] / work
            top, col = pricing.solve(y, tol)
            over = top - mu[k]
            if over > 0.0:
                gain += over * float(lengths[k])
                key = col.tobytes()
                if (col.any() and float(col @ y) > mu[k] * (1.0 + tol) + 1e-12
                        and key not in distinct):
                    distinct[key] = col
                    configs.append(col)
                    added += 1
        best = max(best, z - gain)
        if progress is not None:
            progress(it, z, best, len(configs))
        undone = float(res.x[2 * nf:2 * nf + n].sum())
        if shares is not None:
            shares[:] = [res.x[:nf].reshape(n, k_count)]
        if added == 0:
            exact = best >= z * (1.0 - 1e-6)
            if undone > 1e-6:
                return float("inf"), exact
            break
        if time.monotonic() > deadline:
            break
    return (best + float(p.sum()) / 2.0) / n, exact
