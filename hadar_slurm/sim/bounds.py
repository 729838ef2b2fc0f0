"""Lower bounds on the makespan, from fluid linear programs (solved with SciPy's HiGHS).

Time is cut at the distinct arrival times ``t_0 < t_1 < ... < t_K`` of the jobs; the last
interval ``[t_K, T]`` has a variable length.  ``x[i, h, k]`` is the time job ``i`` runs on
``scale[i]`` GPUs of type ``h`` in interval ``k`` (only after it arrives).  Minimise ``T``
subject to: every job does its work, ``sum_h,k x[i,h,k] * rate[i,h] >= R[i]``; a job runs at
most the length of an interval, ``sum_h x[i,h,k] <= len_k`` (at most its scale factor of GPUs
at a time); and no type is over-committed, ``sum_i scale[i] * x[i,h,k] <= c[h] * len_k``.

:func:`fluid_makespan_bound` is the bound of issue #2 ("every job on at most its scale
factor of GPUs"); :func:`fork_makespan_bound` drops the per-job cap (a job may be forked over
any number of GPUs, HadarE's bound), or with ``copies`` raises it to that many times the scale
factor (HadarE forks a job into at most ``max_copies`` copies: ``sum_h x[i,h,k] <= copies *
len_k``).

:func:`config_makespan_bound` is the exact preemptive bound of a static queue (every job there
at the start) when each job runs on one GPU type at a time: the *configuration* LP, whose
columns are the sets of jobs that can run at once (each on its scale factor of GPUs of one
type, no type over-committed), solved by column generation.  The fluid LP lets two jobs wider
than half a type share it in time fractions that no such schedule has; the configuration LP
does not, and its value is what the best preemptive schedule reaches, rounds and restart costs
aside.  The simulator also lets a synchronous gang mix types (at its slowest type's pace);
such gangs add configurations, so there the configuration LP is no bound, but it is never
below the fluid bound, which is one: where the two are equal, both are the exact bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.optimize as opt
import scipy.sparse as sp

from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy.base import FloatArray, IntArray
from hadar_slurm.rates.table import ThroughputTable


def _bound(
    arrival: FloatArray, remaining: FloatArray, scale: IntArray, rate: FloatArray,
    capacity: IntArray, per_job_cap: float | FloatArray | None,
    type_cap: FloatArray | None = None,
) -> float:
    n, h = rate.shape
    job_cap = (None if per_job_cap is None
               else np.broadcast_to(np.asarray(per_job_cap, dtype=np.float64), (n,)))
    t0 = float(arrival.min())
    cuts = np.unique(arrival)
    k_count = cuts.shape[0]
    lengths = np.diff(cuts)  # fixed intervals 0..K-2; interval K-1 ends at T
    # Variable layout: T, then x[i, g, k] for k >= interval of arrival[i] and rate > 0.
    first_k = np.searchsorted(cuts, arrival, side="left")
    var_i: list[int] = []
    var_g: list[int] = []
    var_k: list[int] = []
    for i in range(n):
        for g in range(h):
            if rate[i, g] <= 0:
                continue
            for k in range(int(first_k[i]), k_count):
                var_i.append(i)
                var_g.append(g)
                var_k.append(k)
    vi = np.asarray(var_i)
    vg = np.asarray(var_g)
    vk = np.asarray(var_k)
    nv = 1 + vi.shape[0]
    cols = np.arange(1, nv)
    rows_a: list[IntArray] = []
    cols_a: list[IntArray] = []
    vals_a: list[FloatArray] = []
    rhs: list[FloatArray] = []
    r = 0
    # Work: -sum x * rate <= -R.
    rows_a.append(vi)
    cols_a.append(cols)
    vals_a.append(-rate[vi, vg])
    rhs.append(-remaining.astype(np.float64))
    r += n
    last = k_count - 1
    t_rows: list[int] = []
    t_vals: list[float] = []
    rhs_extra: list[float] = []
    if job_cap is not None:
        # sum_g x[i, g, k] <= cap_i * len_k  (last interval: - cap_i * T <= -cap_i * t_last)
        key = vi * k_count + vk
        uniq, inv = np.unique(key, return_inverse=True)
        rows_a.append(r + inv)
        cols_a.append(cols)
        vals_a.append(np.ones(cols.shape[0]))
        for u in uniq.tolist():
            i, k = divmod(u, k_count)
            cap = float(job_cap[i])
            if k == last:
                t_rows.append(r)
                t_vals.append(-cap)
                rhs_extra.append(cap * (-float(cuts[last]) + t0))
            else:
                rhs_extra.append(cap * float(lengths[k]))
            r += 1
    if type_cap is not None:
        # x[i, g, k] <= cap_ig * len_k, where that binds before the job's own cap does.
        binds = np.nonzero(type_cap[vi, vg] < (np.inf if job_cap is None else job_cap[vi]))[0]
        caps = type_cap[vi[binds], vg[binds]]
        rows = r + np.arange(binds.shape[0])
        rows_a.append(rows)
        cols_a.append(binds + 1)
        vals_a.append(np.ones(binds.shape[0]))
        in_last = vk[binds] == last
        t_rows.extend(rows[in_last].tolist())
        t_vals.extend((-caps[in_last]).tolist())
        # the right-hand side's length per interval (the last one's is T - (t_last - t0))
        rhs_len = np.append(lengths, t0 - float(cuts[last]))
        rhs_extra.extend((caps * rhs_len[vk[binds]]).tolist())
        r += int(binds.shape[0])
    # Capacity: sum_i scale * x[i, g, k] <= c_g * len_k.
    key = vg * k_count + vk
    uniq, inv = np.unique(key, return_inverse=True)
    rows_a.append(r + inv)
    cols_a.append(cols)
    vals_a.append(scale[vi].astype(np.float64))
    for u in uniq.tolist():
        g, k = divmod(u, k_count)
        if k == last:
            t_rows.append(r)
            t_vals.append(-float(capacity[g]))
            rhs_extra.append(-float(capacity[g]) * (float(cuts[last]) - t0))
        else:
            rhs_extra.append(float(capacity[g]) * float(lengths[k]))
        r += 1
    rows_all = np.concatenate([*rows_a, np.asarray(t_rows, dtype=np.int64)])
    cols_all = np.concatenate([*cols_a, np.zeros(len(t_rows), dtype=np.int64)])
    vals_all = np.concatenate([*vals_a, np.asarray(t_vals)])
    a_ub = sp.csr_matrix((vals_all, (rows_all, cols_all)), shape=(r, nv))
    b_ub = np.concatenate([*rhs, np.asarray(rhs_extra)])
    c = np.zeros(nv)
    c[0] = 1.0
    bounds = [(float(cuts[last]) - t0, None)] + [(0.0, None)] * (nv - 1)
    res = opt.linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"makespan bound LP failed: {res.message}")
    return float(res.x[0])


def bound_inputs(
    jobs: Sequence[Job], cluster: ClusterSpec, table: ThroughputTable,
) -> tuple[FloatArray, FloatArray, IntArray, FloatArray, IntArray]:
    """The arguments of the bounds for a trace on a cluster: arrivals, work, scale factors,
    whole-job rates per GPU type of the cluster, and its GPUs per type."""
    capacity = np.array([cluster.capacity(g) for g in cluster.gpu_types], dtype=np.int64)
    rate = np.array([[table.rate(j.job_type, j.scale_factor, g) for g in cluster.gpu_types]
                     for j in jobs], dtype=np.float64)
    return (np.array([j.arrival_s for j in jobs], dtype=np.float64),
            np.array([j.total_steps for j in jobs], dtype=np.float64),
            np.array([j.scale_factor for j in jobs], dtype=np.int64), rate, capacity)


def fluid_makespan_bound(
    arrival: FloatArray, remaining: FloatArray, scale: IntArray, rate: FloatArray,
    capacity: IntArray,
) -> float:
    """Makespan lower bound (seconds from the first arrival), each job on <= scale GPUs."""
    return _bound(arrival, remaining, scale, rate, capacity, per_job_cap=1.0)


def fork_makespan_bound(
    arrival: FloatArray, remaining: FloatArray, scale: IntArray, rate: FloatArray,
    capacity: IntArray, copies: int | None = None, room: IntArray | None = None,
) -> float:
    """Makespan lower bound when a job may use any number of GPUs (forked copies), or at most
    ``copies`` times its scale factor.

    ``room`` (jobs x types): how many copies of each job one type can hold at once, when
    copies are node-disjoint and each lies on one node (Slurm's heterogeneous jobs, and the
    simulator unless told otherwise): the type's nodes with at least the job's scale factor
    of GPUs (:func:`copy_room`).  A job runs as one gang, which may span nodes, or as copies
    within that room: at most ``max(1, room)`` at a time on a type and ``max(1, min(copies,
    sum of room))`` in all.
    """
    if copies is not None and copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    if room is None:
        return _bound(arrival, remaining, scale, rate, capacity,
                      per_job_cap=None if copies is None else float(copies))
    if room.shape != rate.shape:
        raise ValueError(f"room has shape {room.shape}, rates {rate.shape}")
    total = room.sum(axis=1).astype(np.float64)
    if copies is not None:
        total = np.minimum(total, float(copies))
    per_type = np.maximum(room.astype(np.float64), 1.0)
    if copies is not None:
        per_type = np.minimum(per_type, float(copies))
    return _bound(arrival, remaining, scale, rate, capacity,
                  per_job_cap=np.maximum(total, 1.0), type_cap=per_type)


def config_makespan_bound(
    remaining: FloatArray, scale: IntArray, rate: FloatArray, capacity: IntArray,
    max_columns: int = 2000, tol: float = 1e-7,
) -> tuple[float, bool]:
    """Makespan bound of a static queue from the configuration LP, each job on one type at a
    time (see the module docstring for gangs that mix types); ``(bound, exact)``.

    ``min sum_C len_C`` over configurations ``C`` (each job on at most one type, its
    ``scale`` GPUs there; per type at most its ``capacity`` GPUs), such that every job does its
    work, ``sum_C len_C * rate[i, type of i in C] >= remaining[i]``.  Columns are generated: the
    pricing problem (a configuration of the greatest value at the master's duals ``y``,
    ``max sum_i y_i * rate[i, h] * z_ih``) is a small assignment with knapsacks, solved as a
    MIP by HiGHS.  Every iteration gives a valid bound, the master's value over the pricing
    value's upper bound (Farley's bound), and the best one is returned; ``exact`` says whether
    the generation ended because no column could improve the master (the bound is then the LP's
    optimum) rather than at ``max_columns``.  Raises ``ValueError`` for a job with work left
    that fits on no type.
    """
    n, h = rate.shape
    fits = (rate > 0) & (scale[:, None] <= capacity[None, :])
    work = remaining > 0
    if not work.any():
        return 0.0, True
    if not fits[work].any(axis=1).all():
        bad = int(np.nonzero(work & ~fits.any(axis=1))[0][0])
        raise ValueError(f"job {bad} fits on no GPU type (scale {int(scale[bad])})")
    ii, hh = np.nonzero(fits & work[:, None])
    m = ii.shape[0]
    val_rate = rate[ii, hh]
    # Pricing constraints over z[ii, hh]: one type per job, the type's GPUs.
    one = sp.csr_matrix((np.ones(m), (ii, np.arange(m))), shape=(n, m))
    room = sp.csr_matrix((scale[ii].astype(np.float64), (hh, np.arange(m))), shape=(h, m))
    pricing = opt.LinearConstraint(sp.vstack([one, room]).tocsr(), -np.inf,
                                   np.concatenate([np.ones(n), capacity.astype(np.float64)]))
    # Start: each job alone on its fastest type.
    best = np.argmax(np.where(fits, rate, -1.0), axis=1)
    cols = [np.where(np.arange(n) == i, rate[i, best[i]], 0.0) for i in np.nonzero(work)[0]]
    need = np.where(work, remaining, 0.0)
    bound = 0.0
    while True:
        a = np.array(cols).T
        res = opt.linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-need, bounds=(0, None),
                          method="highs")
        if res.status != 0:
            raise RuntimeError(f"configuration LP failed: {res.message}")
        y = np.maximum(-res.ineqlin.marginals, 0.0)
        price = opt.milp(-(y[ii] * val_rate), constraints=pricing,
                         integrality=np.ones(m), bounds=opt.Bounds(0, 1),
                         options={"mip_rel_gap": tol})
        if price.x is None:
            raise RuntimeError(f"configuration pricing failed: {price.message}")
        top = max(-float(price.mip_dual_bound), -float(price.fun), 1.0)
        bound = max(bound, float(res.fun) / top)
        if top <= 1.0 + tol or len(cols) >= max_columns:
            return bound, top <= 1.0 + tol
        z = np.round(price.x)
        col = np.zeros(n)
        chosen = z > 0.5
        col[ii[chosen]] = val_rate[chosen]
        cols.append(col)


def copy_room(scale: IntArray, cluster: ClusterSpec) -> IntArray:
    """Per job and GPU type of ``cluster``: the nodes of that type with at least the job's
    scale factor of GPUs, i.e. how many node-disjoint one-node copies of it the type holds."""
    gpus = {t: np.array([nd.gpus for nd in cluster.nodes if nd.gpu_type == t], dtype=np.int64)
            for t in cluster.gpu_types}
    return np.array([[int((gpus[t] >= s).sum()) for t in cluster.gpu_types]
                     for s in np.asarray(scale).tolist()], dtype=np.int64).reshape(
                         len(scale), len(cluster.gpu_types))
