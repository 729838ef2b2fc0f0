# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
# distutils: extra_compile_args = -ffp-contract=off -falign-loops=32
# (-falign-loops=32 aligns the hot loops, so that their speed moves less with where unrelated
# code puts them: adding the matcher's bitsets made pair_guests 12% slower at the default
# alignment, and as fast as before with this; 2026-12-06)
"""The compiled Hadar core: the twin of :mod:`hadar_slurm.core.reference`.

Same functions (``plan``, ``balance_split``, ``drain_prices``, ``match``, ``upgrade_idle``,
``pair_guests``), same signatures, same arrays in and out, and the same floating-point
operations in the same order, so that both return identical decisions
(``tests/test_core_twins.py`` compares them on random instances; ``pair_guests``
``tests/test_sharing_twins.py``).  Each private helper mirrors the reference helper of the same name line by
line (``_epoch_option``, ``_best_schedule``, ``_fastest_option``, ``_movable``, ``_MoveIndex``,
``_level``, ``_exchange``; ``_shared_finish`` is its ``shared_finish``, and ``pair_guests``
inlines its ``pair_gain``); read the reference for the *why*.  Two search where the reference
scans, with the same pick: ``match`` keeps each type's nodes in bitsets by free GPUs
(``_bucket_move``, ``_bucket_first``: best fit is the lowest node of the first bucket from the
request up, as the reference's scan for the fewest free GPUs, lowest node first), and
``pair_guests`` weighs hosts in groups of one kind, type, scale factor and rate.

How the twin stays exact:

* every comparison keeps the reference's direction and strictness (``<`` vs ``<=``), its
  ``not x < y`` forms (true for NaN) and its tie-breaks (first index wins);
* Python ``int * float`` becomes ``<double>int * float``, left to right; ``g / c`` (int / int
  true division) is done in double; ``x ** y`` is libc ``pow``, which is what Python and NumPy
  call for floats;
* ``-ffp-contract=off`` keeps the C compiler from fusing ``a * b + c`` into one FMA, which
  would round differently from Python;
* where the reference divides two Python floats (not NumPy scalars) by zero it raises
  ``ZeroDivisionError``; the helpers here return an error code in the same case and the public
  function raises the same exception.  Divisions where the reference holds a NumPy scalar give
  IEEE ``inf``/``nan`` in both (``cdivision``).

Scratch buffers (and ``_MoveIndex``'s trees) are allocated once per call; the inner loops touch
only C scalars and typed memoryviews and run without the GIL.  Arrays may come in any layout
and integer/bool dtype: they are converted with ``np.ascontiguousarray`` at the boundary.
"""

import numpy as np

cimport numpy as cnp
from libc.math cimport INFINITY, exp, fabs, floor, frexp, ldexp, pow

cnp.import_array()

ctypedef long long i64

cdef double INF = INFINITY
# Twins of ``reference._REL``, ``_TIE`` and ``_MANTISSA`` (the type split's tolerances).
cdef double _REL = 1e-12
cdef double _TIE = 1e-9
cdef double _MANTISSA = <double>(1 << 30)

# Error codes of the nogil helpers (0: fine).  Each stands for a ZeroDivisionError the
# reference raises at the same point.
cdef enum:
    ERR_NONE = 0
    ERR_ZERODIV = 1
    ERR_OVERFLOW = 2  # math.exp overflows (OverflowError in the reference)
    ERR_INDEX = 3  # an index out of range (IndexError in the reference)


# ----------------------------------------------------------------------------------------------
# plan
# The algorithm: docs/algorithm.md, "Prices" to "Admission and the dual variable".


cdef inline double _run_seconds(
    Py_ssize_t i, Py_ssize_t t, i64[::1] trial, const i64[:, ::1] current, double round_s,
    double migration_s,
) noexcept nogil:
    """Twin of ``reference._run_seconds``."""
    cdef Py_ssize_t h
    cdef double run_s
    if t == 0 and migration_s > 0.0:
        for h in range(current.shape[1]):
            if trial[h] != current[i, h]:
                run_s = round_s - migration_s
                if run_s < 0.0:
                    run_s = 0.0
                return run_s
    return round_s


cdef inline int _epoch_option(
    Py_ssize_t i, Py_ssize_t t, double remaining_work, const i64[::1] scale,
    const double[:, ::1] rate, const i64[::1] sync, const i64[:, ::1] current,
    i64[:, ::1] free, double[:, ::1] price, double round_s, double migration_s,
    i64[::1] counts_out, i64[::1] trial, double* cost_out, double* prog_out, double* raw_out,
) noexcept nogil:
    """Twin of ``reference._epoch_option``: (cost, progress, raw progress) in the outs."""
    cdef Py_ssize_t num_types = rate.shape[1]
    cdef i64 s = scale[i]
    cdef double best_cpi = INF
    cdef double best_cost = INF
    cdef double best_prog = 0.0
    cdef double best_raw = 0.0
    cdef Py_ssize_t m, h, pick
    cdef double rm, rh, cost, prog, raw, pick_price, ph, pick_ppi, ppi, run_s, cpi
    cdef i64 need, take, avail
    for h in range(num_types):
        counts_out[h] = 0
    if sync[i] != 0:
        for m in range(num_types):
            rm = rate[i, m]
            if rm <= 0.0:
                continue
            # Gang of s workers on types at least as fast as m, cheapest price first.
            for h in range(num_types):
                trial[h] = 0
            need = s
            cost = 0.0
            while need > 0:
                pick = -1
                pick_price = INF
                for h in range(num_types):
                    if rate[i, h] >= rm and free[h, t] - trial[h] > 0:
                        ph = price[h, t]
                        if ph < pick_price:
                            pick_price = ph
                            pick = h
                if pick < 0:
                    break
                avail = free[pick, t] - trial[pick]
                take = avail if avail < need else need
                trial[pick] += take
                need -= take
                cost += <double>take * pick_price * round_s
            if need > 0:
                continue
            run_s = _run_seconds(i, t, trial, current, round_s, migration_s)
            prog = <double>s * rm * run_s
            if prog <= 0.0:
                continue
            raw = prog
            if prog > remaining_work:
                prog = remaining_work
            cpi = cost / prog
            if cpi < best_cpi or (cpi == best_cpi and prog > best_prog):
                best_cpi = cpi
                best_cost = cost
                best_prog = prog
                best_raw = raw
                for h in range(num_types):
                    counts_out[h] = trial[h]
        cost_out[0] = best_cost
        prog_out[0] = best_prog
        raw_out[0] = best_raw
        return ERR_NONE
    # Asynchronous: up to s workers, cheapest price per iteration first.
    for h in range(num_types):
        trial[h] = 0
    need = s
    cost = 0.0
    prog = 0.0
    while need > 0:
        pick = -1
        pick_ppi = INF
        for h in range(num_types):
            rh = rate[i, h]
            if rh > 0.0 and free[h, t] - trial[h] > 0:
                ppi = price[h, t] / rh
                if ppi < pick_ppi:
                    pick_ppi = ppi
                    pick = h
        if pick < 0:
            break
        avail = free[pick, t] - trial[pick]
        take = avail if avail < need else need
        trial[pick] += take
        need -= take
        cost += <double>take * price[pick, t] * round_s
        prog += <double>take * rate[i, pick] * round_s
    if prog <= 0.0:
        cost_out[0] = INF
        prog_out[0] = 0.0
        raw_out[0] = 0.0
        return ERR_NONE
    run_s = _run_seconds(i, t, trial, current, round_s, migration_s)
    if run_s != round_s:
        prog = prog * (run_s / round_s)
        if prog <= 0.0:
            cost_out[0] = INF
            prog_out[0] = 0.0
            raw_out[0] = 0.0
            return ERR_NONE
    raw = prog
    if prog > remaining_work:
        prog = remaining_work
    for h in range(num_types):
        counts_out[h] = trial[h]
    cost_out[0] = cost
    prog_out[0] = prog
    raw_out[0] = raw
    return ERR_NONE


cdef inline int _best_schedule(
    Py_ssize_t i, const double[::1] remaining, const i64[::1] scale,
    const double[:, ::1] rate, const double[::1] ukey, const double[::1] age,
    const i64[::1] sync, const i64[:, ::1] current, i64[:, ::1] free, double[:, ::1] price,
    double round_s, Py_ssize_t horizon, double migration_s,
    double best_rate, double tail_price, i64[:, ::1] opt_counts, i64[::1] chosen,
    double[::1] opt_cost, double[::1] opt_prog, double[::1] opt_raw, i64[::1] order,
    double[::1] cpi,
    i64[::1] row, i64[::1] trial, double* payoff_out,
) noexcept nogil:
    """Twin of ``reference._best_schedule``; the payoff goes to ``payoff_out``."""
    cdef Py_ssize_t num_types = rate.shape[1]
    cdef double work = remaining[i]
    cdef Py_ssize_t n_opt = 0
    cdef Py_ssize_t t, h, j, k, T, last, best_kind, best_val
    cdef double c, p, raw, c_t, got, cost, before, frac, finish, payoff, best_payoff
    cdef double total_prog, tail_s, tail_cost
    cdef int err
    for t in range(horizon):
        err = _epoch_option(i, t, work, scale, rate, sync, current, free, price, round_s,
                            migration_s, row, trial, &c, &p, &raw)
        if err != ERR_NONE:
            return err
        opt_cost[t] = c
        opt_prog[t] = p
        opt_raw[t] = raw
        for h in range(num_types):
            opt_counts[t, h] = row[h]
        if p > 0.0:
            n_opt += 1
        chosen[t] = 0
    if n_opt == 0:
        payoff_out[0] = -INF
        return ERR_NONE
    # Options in order of cost per iteration (stable: earlier epoch first on ties).
    k = 0
    for t in range(horizon):
        if opt_prog[t] > 0.0:
            c_t = opt_cost[t] / opt_prog[t]
            j = k
            while j > 0 and cpi[j - 1] > c_t:
                cpi[j] = cpi[j - 1]
                order[j] = order[j - 1]
                j -= 1
            cpi[j] = c_t
            order[j] = t
            k += 1
    best_payoff = -INF
    best_kind = -1  # 0: finish by T (value = T); 1: prefix of length best_val, tail after
    best_val = 0
    # (a) Finish within the horizon, by epoch T.
    for T in range(horizon):
        got = 0.0
        cost = 0.0
        last = -1
        for j in range(n_opt):
            t = order[j]
            if t > T:
                continue
            got += opt_prog[t]
            cost += opt_cost[t]
            if t > last:
                last = t
            if got >= work:
                break
        if got < work or last != T:
            continue
        before = got - opt_prog[last]
        frac = (work - before) / opt_raw[last]
        if frac > 1.0:
            frac = 1.0
        finish = <double>last * round_s + frac * round_s
        payoff = ukey[i] / (finish + age[i]) - cost
        if payoff > best_payoff:
            best_payoff = payoff
            best_kind = 0
            best_val = T
    # (b) Cannot finish within the horizon: a cheapest prefix, the rest afterwards.
    total_prog = 0.0
    for t in range(horizon):
        total_prog += opt_prog[t]
    if total_prog < work and best_rate > 0.0:
        got = 0.0
        cost = 0.0
        for j in range(n_opt):
            t = order[j]
            got += opt_prog[t]
            cost += opt_cost[t]
            tail_s = (work - got) / best_rate
            finish = <double>horizon * round_s + tail_s
            tail_cost = tail_s * <double>scale[i] * tail_price
            payoff = ukey[i] / (finish + age[i]) - cost - tail_cost
            if payoff > best_payoff:
                best_payoff = payoff
                best_kind = 1
                best_val = j + 1
    if best_kind == 0:
        got = 0.0
        for j in range(n_opt):
            t = order[j]
            if t > best_val:
                continue
            chosen[t] = 1
            got += opt_prog[t]
            if got >= work:
                break
    elif best_kind == 1:
        for j in range(best_val):
            chosen[order[j]] = 1
    payoff_out[0] = best_payoff
    return ERR_NONE


cdef inline double _fastest_option(
    Py_ssize_t i, const i64[::1] scale, const double[:, ::1] rate, const i64[::1] sync,
    i64[:, ::1] free, i64[::1] best, i64[::1] trial,
) noexcept nogil:
    """Twin of ``reference._fastest_option``: returns the progress, the option in ``best``."""
    cdef Py_ssize_t num_types = rate.shape[1]
    cdef i64 s = scale[i]
    cdef double best_prog = 0.0
    cdef Py_ssize_t mixed, m, h, pick
    cdef double rm, pick_rate, prog
    cdef i64 need, take, avail
    for h in range(num_types):
        best[h] = 0
    if sync[i] != 0:
        # A gang on one type if any fits; else mixed, paced by its slowest type m and filled
        # from the slowest types still at least as fast as m.
        for mixed in range(2):
            for m in range(num_types):
                rm = rate[i, m]
                if rm <= 0.0:
                    continue
                for h in range(num_types):
                    trial[h] = 0
                need = s
                while need > 0:
                    pick = -1
                    pick_rate = INF
                    for h in range(num_types):
                        if mixed == 0 and h != m:
                            continue
                        if (rate[i, h] >= rm and free[h, 0] - trial[h] > 0
                                and rate[i, h] < pick_rate):
                            pick_rate = rate[i, h]
                            pick = h
                    if pick < 0:
                        break
                    avail = free[pick, 0] - trial[pick]
                    take = avail if avail < need else need
                    trial[pick] += take
                    need -= take
                if need > 0:
                    continue
                prog = <double>s * rm
                if prog > best_prog:
                    best_prog = prog
                    for h in range(num_types):
                        best[h] = trial[h]
            if best_prog > 0.0:
                break
        return best_prog
    need = s
    while need > 0:
        pick = -1
        pick_rate = 0.0
        for h in range(num_types):
            if free[h, 0] - best[h] > 0 and rate[i, h] > pick_rate:
                pick_rate = rate[i, h]
                pick = h
        if pick < 0:
            break
        avail = free[pick, 0] - best[pick]
        take = avail if avail < need else need
        best[pick] += take
        need -= take
        best_prog += <double>take * pick_rate
    return best_prog


def plan(remaining, scale, rate, fill_rate, ukey, age, sync, current, order, capacity,
         round_s, horizon, migration_s, price_floor, price_ratio):
    """One epoch of Hadar (see ``reference.plan``).  Arrays in, arrays out.

    Returns ``alloc[J, H]`` (int64), ``payoff[J]`` (float64) and ``status[J]`` (int64).
    Raises ``ValueError`` unless ``horizon >= 1`` and ``round_s > 0`` (as the reference).
    """
    if not horizon >= 1:
        raise ValueError(f"plan: horizon must be at least 1 epoch, got {horizon!r}")
    if not round_s > 0.0:
        raise ValueError(f"plan: round_s must be positive (seconds), got {round_s!r}")
    cdef const double[::1] rem_v = np.ascontiguousarray(remaining, dtype=np.float64)
    cdef const i64[::1] scale_v = np.ascontiguousarray(scale, dtype=np.int64)
    cdef const double[:, ::1] rate_v = np.ascontiguousarray(rate, dtype=np.float64)
    cdef const double[:, ::1] fill_v = np.ascontiguousarray(fill_rate, dtype=np.float64)
    cdef const double[::1] ukey_v = np.ascontiguousarray(ukey, dtype=np.float64)
    cdef const double[::1] age_v = np.ascontiguousarray(age, dtype=np.float64)
    cdef const i64[::1] sync_v = np.ascontiguousarray(sync, dtype=np.int64)
    cdef const i64[:, ::1] cur_v = np.ascontiguousarray(current, dtype=np.int64)
    cdef const i64[::1] cap_v = np.ascontiguousarray(capacity, dtype=np.int64)
    cdef const double[::1] floor_v = np.ascontiguousarray(price_floor, dtype=np.float64)
    cdef Py_ssize_t num_jobs = rate_v.shape[0]
    cdef Py_ssize_t num_types = rate_v.shape[1]
    cdef Py_ssize_t hor = horizon
    cdef double c_round = round_s
    cdef double c_mig = migration_s
    cdef double c_ratio = price_ratio

    # Shapes: the reference indexes these by job and type; reject what it could not index.
    if fill_v.shape[0] != num_jobs or fill_v.shape[1] != num_types:
        raise ValueError("fill_rate must have the shape of rate")
    if cur_v.shape[0] != num_jobs or cur_v.shape[1] != num_types:
        raise ValueError("current must have the shape of rate")
    if (rem_v.shape[0] != num_jobs or scale_v.shape[0] != num_jobs
            or ukey_v.shape[0] != num_jobs or age_v.shape[0] != num_jobs
            or sync_v.shape[0] != num_jobs):
        raise ValueError("remaining, scale, ukey, age and sync must have one entry per job")
    if cap_v.shape[0] != num_types or floor_v.shape[0] != num_types:
        raise ValueError("capacity and price_floor must have one entry per GPU type")
    # Queue order: Python indexing semantics (negative indices count from the end).
    order_a = np.ascontiguousarray(order, dtype=np.int64)
    if order_a.ndim != 1:
        raise ValueError("order must be one-dimensional")
    if order_a.shape[0] > 0:
        if int(order_a.min()) < -num_jobs or int(order_a.max()) >= num_jobs:
            raise IndexError("order holds a job index out of range")
        if int(order_a.min()) < 0:
            order_a = np.where(order_a < 0, order_a + num_jobs, order_a)
    cdef const i64[::1] order_v = order_a

    g_a = np.zeros((num_types, horizon), dtype=np.int64)  # ValueError if horizon < 0, as ref
    cdef i64[:, ::1] g = g_a
    cdef i64[:, ::1] free = np.zeros((num_types, horizon), dtype=np.int64)
    cdef double[:, ::1] price = np.zeros((num_types, horizon))
    alloc_a = np.zeros((num_jobs, num_types), dtype=np.int64)
    payoff_a = np.full(num_jobs, np.nan)
    status_a = np.full(num_jobs, 2, dtype=np.int64)
    cdef i64[:, ::1] alloc = alloc_a
    cdef double[::1] payoff = payoff_a
    cdef i64[::1] status = status_a
    # Scratch, once per call.
    cdef i64[:, ::1] opt_counts = np.zeros((horizon, num_types), dtype=np.int64)
    cdef i64[::1] chosen = np.zeros(horizon, dtype=np.int64)
    cdef double[::1] opt_cost = np.zeros(horizon)
    cdef double[::1] opt_prog = np.zeros(horizon)
    cdef double[::1] opt_raw = np.zeros(horizon)
    cdef i64[::1] opt_order = np.zeros(horizon, dtype=np.int64)
    cdef double[::1] cpi = np.zeros(horizon)
    cdef i64[::1] row = np.zeros(num_types, dtype=np.int64)
    cdef i64[::1] trial = np.zeros(num_types, dtype=np.int64)
    cdef i64[::1] best = np.zeros(num_types, dtype=np.int64)

    cdef Py_ssize_t q, i, h, t, npass
    cdef double best_rate, tail_price, pay, best_prog
    cdef bint runnable
    cdef i64 c
    cdef int err = ERR_NONE
    cdef const double[:, ::1] rates

    with nogil:
        for h in range(num_types):
            for t in range(hor):
                free[h, t] = cap_v[h]
                price[h, t] = floor_v[h]
        for q in range(order_v.shape[0]):
            i = order_v[q]
            if rem_v[i] <= 0.0:
                continue  # finished: nothing to plan
            best_rate = 0.0
            tail_price = 0.0
            runnable = False
            for h in range(num_types):
                if fill_v[i, h] > 0.0:
                    runnable = True
                if rate_v[i, h] * <double>scale_v[i] > best_rate:
                    best_rate = rate_v[i, h] * <double>scale_v[i]
                    tail_price = floor_v[h]
            if not runnable:
                status[i] = 3
                payoff[i] = -INF
                continue
            if best_rate <= 0.0:
                continue
            err = _best_schedule(i, rem_v, scale_v, rate_v, ukey_v, age_v, sync_v, cur_v,
                                 free, price, c_round, hor, c_mig, best_rate,
                                 tail_price, opt_counts, chosen, opt_cost, opt_prog,
                                 opt_raw, opt_order, cpi, row, trial, &pay)
            if err != ERR_NONE:
                break
            if pay == -INF:
                continue  # no free GPUs anywhere in the horizon: waits
            if not pay > 0.0:
                payoff[i] = pay
                continue
            payoff[i] = pay
            status[i] = 1
            for t in range(hor):
                if chosen[t] == 0:
                    continue
                for h in range(num_types):
                    c = opt_counts[t, h]
                    if c == 0:
                        continue
                    g[h, t] += c
                    free[h, t] -= c
                    price[h, t] = floor_v[h] * pow(c_ratio, <double>g[h, t] / <double>cap_v[h])
                    if t == 0:
                        alloc[i, h] = c
                if t == 0:
                    status[i] = 0
    if err == ERR_ZERODIV:
        raise ZeroDivisionError("float division by zero")
    # Back-fill epoch 0: first on the types the job may use, then on any type it can run on.
    with nogil:
        for npass in range(2):
            rates = rate_v if npass == 0 else fill_v
            for q in range(order_v.shape[0]):
                i = order_v[q]
                if status[i] == 0 or status[i] == 3 or status[i] == 4:
                    continue
                if rem_v[i] <= 0.0:
                    continue
                best_prog = _fastest_option(i, scale_v, rates, sync_v, free, best, trial)
                if best_prog <= 0.0:
                    continue
                for h in range(num_types):
                    if best[h] > 0:
                        free[h, 0] -= best[h]
                        alloc[i, h] = best[h]
                status[i] = 4
    return alloc_a, payoff_a, status_a


# ----------------------------------------------------------------------------------------------
# balance_split
# The algorithm: docs/algorithm.md, "Drain prices and the type split".


cdef inline bint _movable(
    double[:, ::1] phi, const double[:, ::1] gpu_s, double[::1] slack, Py_ssize_t i,
    Py_ssize_t s, Py_ssize_t d,
) noexcept nogil:
    """Twin of ``reference._movable``: may job ``i`` move work from type ``s`` to ``d``?"""
    cdef double grow
    if not phi[i, s] > 1e-12 or not (gpu_s[i, d] > 0.0 and gpu_s[i, d] < INF):
        return False
    grow = gpu_s[i, d] - gpu_s[i, s]
    return not (grow > 0.0 and not slack[i] > _REL * gpu_s[i, d])


cdef inline double _coarse(double x) noexcept nogil:
    """Twin of ``reference._coarse``: ``x > 0`` with its mantissa rounded to 30 bits."""
    cdef int e
    cdef double m = frexp(x, &e)
    return ldexp(floor(m * _MANTISSA + 0.5) / _MANTISSA, e)


cdef class _MoveIndex:
    """Twin of ``reference._MoveIndex``: a tournament tree per ordered pair of types.

    ``key[p, node]`` / ``job[p, node]`` for pair ``p = s * H + d``: leaves at ``size + i``,
    node ``k`` the lesser of ``2k`` and ``2k + 1`` (the left on ties), root at 1.  A pair's
    tree is built when first asked for; the buffers of pairs never asked for stay untouched.
    """

    cdef double[:, ::1] phi
    cdef const double[:, ::1] gpu_s
    cdef double[::1] slack
    cdef Py_ssize_t n, num_types, size, num_built
    cdef double[:, ::1] key
    cdef i64[:, ::1] job
    cdef unsigned char[:, ::1] movable
    cdef i64[::1] zeros
    cdef i64[::1] built
    cdef unsigned char[::1] has_tree

    def __cinit__(self, double[:, ::1] phi, const double[:, ::1] gpu_s, double[::1] slack):
        cdef Py_ssize_t n = gpu_s.shape[0]
        cdef Py_ssize_t num_types = gpu_s.shape[1]
        cdef Py_ssize_t size = 1
        while size < n:
            size *= 2
        self.phi = phi
        self.gpu_s = gpu_s
        self.slack = slack
        self.n = n
        self.num_types = num_types
        self.size = size
        self.num_built = 0
        # np.empty: the pages of a pair's rows are first touched when its tree is built.
        self.key = np.empty((num_types * num_types, 2 * size))
        self.job = np.empty((num_types * num_types, 2 * size), dtype=np.int64)
        self.movable = np.empty((num_types * num_types, n), dtype=np.uint8)
        self.zeros = np.zeros(num_types * num_types, dtype=np.int64)
        self.built = np.zeros(num_types * num_types, dtype=np.int64)
        self.has_tree = np.zeros(num_types * num_types, dtype=np.uint8)

    cdef inline void _build(self, Py_ssize_t p) noexcept nogil:
        cdef Py_ssize_t i, node
        for node in range(2 * self.size):
            self.key[p, node] = INF
            self.job[p, node] = -1
        for i in range(self.n):
            self.movable[p, i] = 0
            self.job[p, self.size + i] = i
            self._set(p, i)
        for node in range(self.size - 1, 0, -1):
            self._pull(p, node)
        self.has_tree[p] = 1
        self.built[self.num_built] = p
        self.num_built += 1

    cdef inline bint _set(self, Py_ssize_t p, Py_ssize_t i) noexcept nogil:
        """Job ``i``'s leaf of pair ``p``; True when it changed."""
        cdef Py_ssize_t s = p // self.num_types
        cdef Py_ssize_t d = p % self.num_types
        cdef unsigned char m = 1 if _movable(self.phi, self.gpu_s, self.slack, i, s, d) else 0
        cdef double g_s, ratio
        cdef double k = INF
        if m == self.movable[p, i]:
            return False
        self.movable[p, i] = m
        g_s = self.gpu_s[i, s]
        if g_s == 0.0:
            self.zeros[p] += 1 if m else -1
        if m and g_s != 0.0:
            ratio = self.gpu_s[i, d] / g_s
            if ratio < INF:
                k = _coarse(ratio)
        self.key[p, self.size + i] = k
        return True

    cdef inline void _pull(self, Py_ssize_t p, Py_ssize_t node) noexcept nogil:
        cdef Py_ssize_t left = 2 * node
        cdef Py_ssize_t right = left + 1
        if self.key[p, right] < self.key[p, left]:
            left = right
        self.key[p, node] = self.key[p, left]
        self.job[p, node] = self.job[p, left]

    cdef inline void refresh(self, Py_ssize_t i) noexcept nogil:
        """Job ``i``'s work or slack changed: update its leaves."""
        cdef Py_ssize_t q, p, node
        for q in range(self.num_built):
            p = self.built[q]
            if self._set(p, i):
                node = (self.size + i) // 2
                while node >= 1:
                    self._pull(p, node)
                    node //= 2

    cdef inline int best(self, Py_ssize_t s, Py_ssize_t d, Py_ssize_t* job,
                         double* ratio) noexcept nogil:
        """The job a move from ``s`` to ``d`` takes and its quotient (-1, inf: none)."""
        cdef Py_ssize_t p = s * self.num_types + d
        if not self.has_tree[p]:
            self._build(p)
        if self.zeros[p] > 0:
            return ERR_ZERODIV  # reference: float division by zero
        if not self.key[p, 1] < INF:
            job[0] = -1
            ratio[0] = INF
        else:
            job[0] = self.job[p, 1]
            ratio[0] = self.key[p, 1]
        return ERR_NONE


cdef inline void _extremes(const double[::1] load, const i64[::1] capacity,
                           Py_ssize_t* src, Py_ssize_t* dst) noexcept nogil:
    """Twin of ``reference._extremes``: the most and the least loaded type per GPU, loads
    within ``_TIE`` counting as equal, the first such type taken."""
    cdef double top = -INF
    cdef double low = INF
    cdef double per
    cdef Py_ssize_t h
    for h in range(load.shape[0]):
        if capacity[h] > 0:
            per = load[h] / <double>capacity[h]
            if per > top:
                top = per
            if per < low:
                low = per
    src[0] = -1
    dst[0] = -1
    for h in range(load.shape[0]):
        if capacity[h] <= 0:
            continue
        per = load[h] / <double>capacity[h]
        if src[0] < 0 and per >= top - _TIE * fabs(top):
            src[0] = h
        if dst[0] < 0 and per <= low + _TIE * fabs(low):
            dst[0] = h


cdef inline double _max_per_gpu(const double[::1] load, const i64[::1] capacity) noexcept nogil:
    """Twin of ``reference._max_per_gpu``."""
    cdef double top = 0.0
    cdef Py_ssize_t h
    for h in range(load.shape[0]):
        if capacity[h] > 0 and load[h] / <double>capacity[h] > top:
            top = load[h] / <double>capacity[h]
    return top


cdef inline i64 _level(
    double[:, ::1] phi, const double[:, ::1] gpu_s, const i64[::1] capacity,
    double[::1] load, double[::1] slack, i64 max_moves, _MoveIndex index, int* err,
    double level_to,
) noexcept nogil:
    """Twin of ``reference._level``; returns the moves made (``err`` on ZeroDivisionError)."""
    cdef i64 moves = 0
    cdef Py_ssize_t i, src, dst, best
    cdef double per_src, per_dst, gap, scale_gap, best_ratio, grow
    cdef double g_src, g_dst, d
    while moves < max_moves:
        _extremes(load, capacity, &src, &dst)
        if src < 0:
            break
        per_src = load[src] / <double>capacity[src]
        per_dst = load[dst] / <double>capacity[dst]
        if per_src <= level_to * (1.0 + 1e-9):
            break
        gap = per_src - per_dst
        scale_gap = per_src if per_src > 1.0 else 1.0
        if gap <= 1e-9 * scale_gap:
            break
        # The job that loses least by the move (least gpu_s[dst] / gpu_s[src], first on ties).
        err[0] = index.best(src, dst, &best, &best_ratio)
        if err[0] != ERR_NONE:
            return moves
        if best < 0:
            break
        i = best
        g_src = gpu_s[i, src]
        g_dst = gpu_s[i, dst]
        grow = g_dst - g_src
        d = gap / (g_src / <double>capacity[src] + g_dst / <double>capacity[dst])
        if level_to > 0.0 and d > (per_src - level_to) * <double>capacity[src] / g_src:
            d = (per_src - level_to) * <double>capacity[src] / g_src  # just down to level_to
        if d > phi[i, src]:
            d = phi[i, src]
        if grow > 0.0 and d > slack[i] / grow:
            d = slack[i] / grow
        moves += 1
        if d <= 1e-12:
            if grow <= 0.0:
                break
            slack[i] = 0.0
            index.refresh(i)
            continue
        phi[i, src] -= d
        phi[i, dst] += d
        load[src] -= d * g_src
        load[dst] += d * g_dst
        slack[i] -= d * grow
        index.refresh(i)
    return moves


cdef inline bint _exchange(
    double[:, ::1] phi, const double[:, ::1] gpu_s, const i64[::1] capacity,
    double[::1] load, double[::1] slack, _MoveIndex index, int* err,
) noexcept nogil:
    """Twin of ``reference._exchange``; True when it swapped anything."""
    cdef Py_ssize_t num_types = gpu_s.shape[1]
    cdef bint changed = False
    cdef Py_ssize_t x, y, rep, a, b
    cdef double ra, rb, gax, gay, gbx, gby, u, lim, grow_a, grow_b, v
    for x in range(num_types):
        for y in range(num_types):
            if x == y or capacity[x] <= 0 or capacity[y] <= 0:
                continue
            for rep in range(64):
                err[0] = index.best(x, y, &a, &ra)
                if err[0] != ERR_NONE:
                    return changed
                err[0] = index.best(y, x, &b, &rb)
                if err[0] != ERR_NONE:
                    return changed
                if a < 0 or b < 0 or a == b:
                    break
                gax = gpu_s[a, x]
                gay = gpu_s[a, y]
                gbx = gpu_s[b, x]
                gby = gpu_s[b, y]
                # (the index's quotients are coarse, for the pick: the swap uses exact ones)
                ra = gay / gax
                rb = gbx / gby
                if ra * rb >= 1.0 - 1e-9:
                    break
                # u GPU-seconds of a leave X and land as u*ra on Y; v = u*ra of b leave Y and
                # land as v*rb on X.  Limited by what a and b hold and by their lengths.
                u = phi[a, x] * gax
                lim = phi[b, y] * gby / ra
                if lim < u:
                    u = lim
                grow_a = (gay - gax) / gax
                grow_b = (gbx - gby) / gby
                if grow_a > 0.0 and slack[a] / grow_a < u:
                    u = slack[a] / grow_a
                if grow_b > 0.0 and slack[b] / (grow_b * ra) < u:
                    u = slack[b] / (grow_b * ra)
                if u <= _REL * gax:
                    break
                v = u * ra
                phi[a, x] -= u / gax
                phi[a, y] += u / gax
                phi[b, y] -= v / gby
                phi[b, x] += v / gby
                load[x] += -u + v * rb
                slack[a] -= u * grow_a
                slack[b] -= v * grow_b
                index.refresh(a)
                index.refresh(b)
                changed = True
    return changed


def balance_split(gpu_s, capacity, pi, scale, window, max_moves, level_to=0.0):
    """Split each job's remaining work over GPU types (see ``reference.balance_split``).

    Returns ``phi[J, H]`` (float64), the fraction of each job's work on each type.
    """
    cdef const double[:, ::1] gs = np.ascontiguousarray(gpu_s, dtype=np.float64)
    cdef const i64[::1] cap_v = np.ascontiguousarray(capacity, dtype=np.int64)
    cdef const double[::1] pi_v = np.ascontiguousarray(pi, dtype=np.float64)
    cdef const i64[::1] scale_v = np.ascontiguousarray(scale, dtype=np.int64)
    cdef Py_ssize_t n = gs.shape[0]
    cdef Py_ssize_t num_types = gs.shape[1]
    cdef double c_window = window
    cdef i64 c_max_moves = max_moves
    cdef double c_level_to = level_to
    if cap_v.shape[0] != num_types or pi_v.shape[0] != num_types:
        raise ValueError("capacity and pi must have one entry per GPU type")
    if scale_v.shape[0] != n:
        raise ValueError("scale must have one entry per job")
    phi_a = np.zeros((n, num_types))
    cdef double[:, ::1] phi = phi_a
    cdef double[::1] load = np.zeros(num_types)
    cdef double[::1] slack = np.zeros(n)
    if n == 0:
        return phi_a
    cdef Py_ssize_t i, h, first, fastest, rnd
    cdef double first_cost, gih, cost, sf, t_slow, t_fast, f, used
    cdef i64 moves = 0
    cdef int err = ERR_NONE
    with nogil:
        for i in range(n):
            first = -1
            first_cost = INF
            fastest = -1
            for h in range(num_types):
                gih = gs[i, h]
                if cap_v[h] <= 0 or not (gih > 0.0 and gih < INF):
                    continue
                cost = gih * pi_v[h]
                if cost < first_cost or first < 0:
                    first_cost = cost
                    first = h
                if fastest < 0 or gih < gs[i, fastest]:
                    fastest = h
            if first < 0:
                continue
            phi[i, first] = 1.0
            sf = <double>scale_v[i]
            if sf == 0.0:
                err = ERR_ZERODIV  # reference: float(gpu_s) / float(scale) with scale 0
                break
            t_slow = gs[i, first] / sf
            if t_slow > c_window and fastest != first:
                t_fast = gs[i, fastest] / sf
                if t_fast < t_slow:
                    f = (t_slow - c_window) / (t_slow - t_fast)
                    if f > 1.0:
                        f = 1.0
                    phi[i, first] -= f
                    phi[i, fastest] += f
            used = 0.0
            for h in range(num_types):
                if phi[i, h] > 0.0:
                    used += phi[i, h] * gs[i, h]
                    load[h] += phi[i, h] * gs[i, h]
            slack[i] = c_window * sf - used
    if err == ERR_ZERODIV:
        raise ZeroDivisionError("float division by zero")
    cdef _MoveIndex index = _MoveIndex(phi, gs, slack)
    with nogil:
        for rnd in range(8):
            moves += _level(phi, gs, cap_v, load, slack, c_max_moves - moves, index, &err,
                            c_level_to)
            if err != ERR_NONE:
                break
            if _max_per_gpu(load, cap_v) <= c_level_to * (1.0 + 1e-9):
                break
            if not _exchange(phi, gs, cap_v, load, slack, index, &err):
                break
            if err != ERR_NONE:
                break
        if err == ERR_NONE:
            # Rounding leaves entries of about -1e-16 where work moved away: clip them to 0.
            for i in range(n):
                for h in range(num_types):
                    if phi[i, h] < 0.0:
                        phi[i, h] = 0.0
    if err == ERR_ZERODIV:
        raise ZeroDivisionError("float division by zero")
    return phi_a


# ----------------------------------------------------------------------------------------------
# drain_prices
# The algorithm: docs/algorithm.md, "Drain prices and the type split".


def drain_prices(remaining, scale, rate, capacity, iterations):
    """A lower bound on the time to finish ``remaining`` work and its type prices.

    Twin of ``reference.drain_prices``; returns ``(bound, pi)`` (float, float64 array).
    ``math.exp`` is libc ``exp``; where it would overflow (``OverflowError`` in the reference,
    which needs thousands of GPU types) the same exception is raised.  The GPU-seconds
    ``remaining / rate * scale`` that the reference computes in every iteration are computed
    once (the same operations on the same values: the same bits).
    """
    cdef const double[::1] rem_v = np.ascontiguousarray(remaining, dtype=np.float64)
    cdef const i64[::1] scale_v = np.ascontiguousarray(scale, dtype=np.int64)
    cdef const double[:, ::1] rate_v = np.ascontiguousarray(rate, dtype=np.float64)
    cdef const i64[::1] cap_v = np.ascontiguousarray(capacity, dtype=np.int64)
    cdef Py_ssize_t n = rate_v.shape[0]
    cdef Py_ssize_t num_types = rate_v.shape[1]
    cdef i64 iters = iterations
    if rem_v.shape[0] != n or scale_v.shape[0] != n:
        raise ValueError("remaining and scale must have one entry per job")
    if cap_v.shape[0] != num_types:
        raise ValueError("capacity must have one entry per GPU type")
    pi_a = np.zeros(num_types)
    best_a = np.zeros(num_types)
    cdef double[::1] pi = pi_a
    cdef double[::1] best_pi = best_a
    cdef double[::1] load = np.zeros(num_types)
    cdef double[:, ::1] gs
    cdef double total_cap = 0.0
    cdef i64 usable = 0
    cdef double longest = 0.0
    cdef bint any_job = False
    cdef double bound = 0.0
    cdef double fastest, t, value, pick_cost, pick_gpu_s, gpu_s, cost, mean, norm, x, e
    cdef Py_ssize_t h, i, pick
    cdef i64 it
    cdef int err = ERR_NONE
    with nogil:
        for h in range(num_types):
            if cap_v[h] > 0:
                total_cap += <double>cap_v[h]
                usable += 1
    if usable == 0:
        return 0.0, pi_a
    with nogil:
        for h in range(num_types):
            if cap_v[h] > 0:
                pi[h] = 1.0 / total_cap
                best_pi[h] = pi[h]
        for i in range(n):
            fastest = INF
            for h in range(num_types):
                if cap_v[h] > 0 and rate_v[i, h] > 0.0:
                    t = rem_v[i] / rate_v[i, h]
                    if t < fastest:
                        fastest = t
            if fastest < INF:
                any_job = True
                if fastest > longest:
                    longest = fastest
    if not any_job:
        return 0.0, best_a
    gs = np.zeros((n if iters > 0 else 0, num_types))
    with nogil:
        if iters > 0:
            for i in range(n):
                for h in range(num_types):
                    if cap_v[h] > 0 and rate_v[i, h] > 0.0:
                        gs[i, h] = rem_v[i] / rate_v[i, h] * <double>scale_v[i]
        for it in range(iters):
            value = 0.0
            for h in range(num_types):
                load[h] = 0.0
            for i in range(n):
                pick = -1
                pick_cost = INF
                pick_gpu_s = 0.0
                for h in range(num_types):
                    if cap_v[h] > 0 and rate_v[i, h] > 0.0:
                        gpu_s = gs[i, h]
                        cost = gpu_s * pi[h]
                        if cost < pick_cost:
                            pick_cost = cost
                            pick = h
                            pick_gpu_s = gpu_s
                if pick >= 0:
                    value += pick_cost
                    load[pick] += pick_gpu_s
            if value > bound:
                bound = value
                for h in range(num_types):
                    best_pi[h] = pi[h]
            mean = 0.0
            for h in range(num_types):
                if cap_v[h] > 0:
                    load[h] = load[h] / <double>cap_v[h]
                    mean += load[h]
            mean = mean / <double>usable
            if not mean > 0.0:
                break
            norm = 0.0
            for h in range(num_types):
                if cap_v[h] > 0:
                    x = 0.5 * (load[h] / mean - 1.0)
                    e = exp(x)
                    if e == INF and x != INF:
                        err = ERR_OVERFLOW
                        break
                    pi[h] = pi[h] * e
                    norm += pi[h] * <double>cap_v[h]
            if err != ERR_NONE:
                break
            for h in range(num_types):
                pi[h] = pi[h] / norm
    if err == ERR_OVERFLOW:
        raise OverflowError("math range error")
    if longest > bound:
        bound = longest
    return bound, best_a


# ----------------------------------------------------------------------------------------------
# match
# The algorithm: docs/algorithm.md, "Gang repacking and the matcher".


ctypedef unsigned long long u64

cdef extern from *:
    int __builtin_ctzll(unsigned long long x) nogil


cdef inline void _bucket_move(u64[::1] bits, const i64[::1] base, const i64[::1] words,
                              const i64[::1] pos, Py_ssize_t h, Py_ssize_t k, i64 old_free,
                              i64 new_free, i64 top) noexcept nogil:
    """Node ``k`` (of type ``h``) from the bucket of ``old_free`` free GPUs to that of
    ``new_free`` (clamped to ``[0, top]``: a node with none free is never picked)."""
    cdef i64 a = old_free if old_free > 0 else 0
    cdef i64 b = new_free if new_free > 0 else 0
    if a > top:
        a = top
    if b > top:
        b = top
    if a == b:
        return
    cdef i64 p = pos[k]
    cdef u64 mask = (<u64>1) << (p & 63)
    bits[base[h] + a * words[h] + (p >> 6)] &= ~mask
    bits[base[h] + b * words[h] + (p >> 6)] |= mask


cdef inline i64 _bucket_first(const u64[::1] bits, const i64[::1] base, const i64[::1] words,
                              Py_ssize_t h, i64 f) noexcept nogil:
    """The lowest position (within type ``h``'s nodes, ascending) in the bucket of ``f`` free
    GPUs, or -1."""
    cdef Py_ssize_t w
    cdef i64 start = base[h] + f * words[h]
    cdef u64 x
    for w in range(words[h]):
        x = bits[start + w]
        if x != 0:
            return w * 64 + __builtin_ctzll(x)
    return -1


def match(node_type, node_gpus, counts, order, cur_job, cur_node, cur_count):
    """Resource matching: per-type GPU counts to (job, node, GPUs) rows.

    Twin of ``reference.match``; returns ``rows_job, rows_node, rows_count, placed`` (int64).
    The rows go to buffers sized by a bound on what the jobs in ``order`` can touch (per job,
    at most the nodes of the types it asks for plus the nodes it keeps, and never more than all
    nodes).  Entries of ``order`` must be job indices in ``[0, J)`` (``IndexError`` otherwise).
    """
    cdef const i64[::1] nt = np.ascontiguousarray(node_type, dtype=np.int64)
    cdef const i64[::1] ng = np.ascontiguousarray(node_gpus, dtype=np.int64)
    cdef const i64[:, ::1] cnt = np.ascontiguousarray(counts, dtype=np.int64)
    cdef const i64[::1] order_v = np.ascontiguousarray(order, dtype=np.int64)
    cdef const i64[::1] cj = np.ascontiguousarray(cur_job, dtype=np.int64)
    cdef const i64[::1] cn = np.ascontiguousarray(cur_node, dtype=np.int64)
    cdef const i64[::1] cc = np.ascontiguousarray(cur_count, dtype=np.int64)
    cdef Py_ssize_t num_nodes = nt.shape[0]
    cdef Py_ssize_t n = cnt.shape[0]
    cdef Py_ssize_t num_types = cnt.shape[1]
    cdef Py_ssize_t rows_cur = cj.shape[0]
    if ng.shape[0] != num_nodes:
        raise ValueError("node_type and node_gpus must have one entry per node")
    if cn.shape[0] != rows_cur or cc.shape[0] != rows_cur:
        raise ValueError("cur_job, cur_node and cur_count must have the same length")
    cdef Py_ssize_t q, i, h, k, r, t, a, b
    for q in range(order_v.shape[0]):
        if order_v[q] < 0 or order_v[q] >= n:
            raise IndexError("order holds a job index out of range")
    cdef i64[::1] free = np.empty(num_nodes, dtype=np.int64)
    cdef i64[:, ::1] want = np.empty((n, num_types), dtype=np.int64)
    placed_a = np.zeros(n, dtype=np.int64)
    cdef i64[::1] placed = placed_a
    cdef i64[::1] type_start = np.zeros(num_types + 1, dtype=np.int64)
    cdef i64[::1] type_fill = np.zeros(num_types, dtype=np.int64)
    cdef i64[::1] kept = np.zeros(rows_cur, dtype=np.int64)
    cdef i64[::1] held_start = np.zeros(n + 1, dtype=np.int64)
    cdef i64[::1] fill = np.zeros(n, dtype=np.int64)
    cdef i64[::1] took = np.zeros(num_nodes, dtype=np.int64)
    cdef i64[::1] touched = np.zeros(num_nodes, dtype=np.int64)
    cdef i64[::1] type_nodes
    cdef i64[::1] held
    cdef i64 take, total, need, v, bound_rows, row_bound, top, f, p
    cdef Py_ssize_t best, pick, n_touched, n_rows
    cdef bint ok
    cdef int err = ERR_NONE
    # Nodes in buckets by free GPUs (``free - took`` while a job is matched), per type: a
    # bitset per (type, free count) over the type's nodes in ascending order, so that best fit
    # (fewest free that hold the request, lowest node first) and spread (most free first) read
    # the first set bit of a few words instead of scanning every node of the type.
    cdef i64[::1] pos = np.zeros(num_nodes, dtype=np.int64)
    cdef i64[::1] words = np.zeros(num_types, dtype=np.int64)
    cdef i64[::1] base = np.zeros(num_types + 1, dtype=np.int64)
    cdef u64[::1] bits
    with nogil:
        for k in range(num_nodes):
            free[k] = ng[k]
        for i in range(n):
            for h in range(num_types):
                want[i, h] = cnt[i, h]
        # Nodes of each type, ascending (CSR).
        for k in range(num_nodes):
            if 0 <= nt[k] < num_types:
                type_start[nt[k] + 1] += 1
        for h in range(num_types):
            type_start[h + 1] += type_start[h]
    type_nodes = np.zeros(type_start[num_types], dtype=np.int64)
    with nogil:
        for k in range(num_nodes):
            if 0 <= nt[k] < num_types:
                h = nt[k]
                type_nodes[type_start[h] + type_fill[h]] = k
                type_fill[h] += 1
        # 1. Stay put.
        for r in range(rows_cur):
            i = cj[r]
            k = cn[r]
            if i < 0 or k < 0 or k >= num_nodes:
                continue
            h = nt[k]
            if h < 0:
                h += num_types  # NumPy indexing, as the reference's want[i, h]
            if i >= n or h < 0 or h >= num_types:
                err = ERR_INDEX
                break
            take = cc[r]
            if want[i, h] < take:
                take = want[i, h]
            if free[k] < take:
                take = free[k]
            if take > 0:
                free[k] -= take
                want[i, h] -= take
                kept[r] = take
        if err == ERR_NONE:
            for r in range(rows_cur):
                if kept[r] > 0:
                    held_start[cj[r] + 1] += 1
            for i in range(n):
                held_start[i + 1] += held_start[i]
    if err == ERR_INDEX:
        raise IndexError("a current row's job or node type is out of range")
    held = np.zeros(held_start[n], dtype=np.int64)
    # A bound on the rows: per queued job, the nodes it can touch.
    bound_rows = 0
    with nogil:
        for r in range(rows_cur):
            if kept[r] > 0:
                i = cj[r]
                held[held_start[i] + fill[i]] = r
                fill[i] += 1
        for q in range(order_v.shape[0]):
            i = order_v[q]
            total = 0
            row_bound = held_start[i + 1] - held_start[i]
            for h in range(num_types):
                total += cnt[i, h]
                if cnt[i, h] > 0:
                    row_bound += type_start[h + 1] - type_start[h]
            if total <= 0:
                continue
            if row_bound > num_nodes:
                row_bound = num_nodes
            bound_rows += row_bound
    top = 0
    for k in range(num_nodes):
        if 0 <= nt[k] < num_types and ng[k] > top:
            top = ng[k]
    for h in range(num_types):
        words[h] = (type_start[h + 1] - type_start[h] + 63) // 64
        base[h + 1] = base[h] + (top + 1) * words[h]
    bits = np.zeros(base[num_types], dtype=np.uint64)
    with nogil:
        for h in range(num_types):
            for t in range(type_start[h], type_start[h + 1]):
                k = type_nodes[t]
                pos[k] = t - type_start[h]
                p = pos[k]
                f = free[k] if free[k] > 0 else 0
                if f > top:
                    f = top
                bits[base[h] + f * words[h] + (p >> 6)] |= (<u64>1) << (p & 63)
    out_job_a = np.empty(bound_rows, dtype=np.int64)
    out_node_a = np.empty(bound_rows, dtype=np.int64)
    out_count_a = np.empty(bound_rows, dtype=np.int64)
    cdef i64[::1] out_job = out_job_a
    cdef i64[::1] out_node = out_node_a
    cdef i64[::1] out_count = out_count_a
    n_rows = 0
    with nogil:
        for q in range(order_v.shape[0]):
            i = order_v[q]
            total = 0
            for h in range(num_types):
                total += cnt[i, h]
            if total <= 0:
                continue
            n_touched = 0
            ok = True
            for h in range(num_types):
                need = want[i, h]
                if need <= 0:
                    continue
                # Best fit: fewest free GPUs that still hold the whole request (the lowest
                # node of the first bucket from ``need`` up that holds any).
                best = -1
                f = need
                while f <= top:
                    p = _bucket_first(bits, base, words, h, f)
                    if p >= 0:
                        best = type_nodes[type_start[h] + p]
                        break
                    f += 1
                if best >= 0:
                    if took[best] == 0:
                        touched[n_touched] = best
                        n_touched += 1
                    _bucket_move(bits, base, words, pos, h, best, free[best] - took[best],
                                 free[best] - took[best] - need, top)
                    took[best] += need
                    continue
                # Spread: most free first (the lowest node of the fullest bucket).
                while need > 0:
                    pick = -1
                    f = top
                    while f > 0:
                        p = _bucket_first(bits, base, words, h, f)
                        if p >= 0:
                            pick = type_nodes[type_start[h] + p]
                            break
                        f -= 1
                    if pick < 0:
                        break
                    take = free[pick] - took[pick]
                    if need < take:
                        take = need
                    if took[pick] == 0:
                        touched[n_touched] = pick
                        n_touched += 1
                    _bucket_move(bits, base, words, pos, h, pick, free[pick] - took[pick],
                                 free[pick] - took[pick] - take, top)
                    took[pick] += take
                    need -= take
                if need > 0:
                    ok = False
                    break
            if not ok:
                for t in range(n_touched):
                    k = touched[t]
                    _bucket_move(bits, base, words, pos, nt[k], k, free[k] - took[k], free[k],
                                 top)
                    took[k] = 0
                # Give back what it kept.
                for t in range(held_start[i], held_start[i + 1]):
                    r = held[t]
                    k = cn[r]
                    _bucket_move(bits, base, words, pos, nt[k], k, free[k], free[k] + kept[r],
                                 top)
                    free[k] += kept[r]
                continue
            placed[i] = 1
            for t in range(n_touched):
                k = touched[t]
                free[k] -= took[k]
            for t in range(held_start[i], held_start[i + 1]):
                r = held[t]
                k = cn[r]
                if took[k] == 0:
                    touched[n_touched] = k
                    n_touched += 1
                took[k] += kept[r]
            # Rows of this job, nodes ascending (insertion sort of the touched nodes).
            for a in range(1, n_touched):
                v = touched[a]
                b = a - 1
                while b >= 0 and touched[b] > v:
                    touched[b + 1] = touched[b]
                    b -= 1
                touched[b + 1] = v
            for t in range(n_touched):
                k = touched[t]
                if took[k] > 0:
                    out_job[n_rows] = i
                    out_node[n_rows] = k
                    out_count[n_rows] = took[k]
                    n_rows += 1
                took[k] = 0
    return out_job_a[:n_rows], out_node_a[:n_rows], out_count_a[:n_rows], placed_a


def upgrade_idle(alloc, current, worker_rate, sync, order, capacity, round_s, migration_s):
    """Placed jobs onto idle GPUs of faster types: twin of ``reference.upgrade_idle`` (read
    it for the rule).  Returns the new ``alloc`` (int64, a copy).  Arrays of the wrong shape
    raise ``ValueError``, a job index out of range ``IndexError``, as in the reference."""
    from hadar_slurm.core.reference import check_upgrade_args
    check_upgrade_args(*(np.asarray(a) for a in (
        alloc, current, worker_rate, sync, order, capacity)))
    out_a = np.array(alloc, dtype=np.int64, order="C", copy=True)
    cdef i64[:, ::1] out = out_a
    cdef const i64[:, ::1] cur = np.ascontiguousarray(current, dtype=np.int64)
    cdef const double[:, ::1] rate = np.ascontiguousarray(worker_rate, dtype=np.float64)
    cdef const i64[::1] sy = np.ascontiguousarray(sync, dtype=np.int64)
    cdef const i64[::1] order_v = np.ascontiguousarray(order, dtype=np.int64)
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t num_types = out.shape[1]
    cdef i64[::1] free = np.array(capacity, dtype=np.int64, copy=True)
    cdef i64[::1] counts = np.zeros(n, dtype=np.int64)
    cdef Py_ssize_t q, i, h, k, best
    cdef i64 top, count, row_max
    cdef double speed, best_prog, prog, v, moved_share
    cdef bint same, seen
    for i in range(n):
        for h in range(num_types):
            free[h] -= out[i, h]
            counts[i] += out[i, h]
    if num_types == 0:
        return out_a
    top = free[0]
    for h in range(1, num_types):
        if free[h] > top:
            top = free[h]
    if top <= 0:
        return out_a  # no GPU idle: nothing can move
    # (Python's arithmetic on the caller's objects, as in the reference: max() keeps the first
    # of equals, a zero round raises ZeroDivisionError)
    moved_share = max(round_s - migration_s, 0.0) / round_s
    with nogil:
        for q in range(order_v.shape[0]):
            i = order_v[q]
            if counts[i] <= 0:
                continue
            top = free[0]
            for h in range(1, num_types):
                if free[h] > top:
                    top = free[h]
            if top <= 0:
                break
            count = 0
            row_max = out[i, 0]
            for h in range(num_types):
                count += out[i, h]
                if out[i, h] > row_max:
                    row_max = out[i, h]
            if count > top + row_max:
                continue  # fits whole on no type
            if sy[i] != 0:
                seen = False
                speed = 0.0
                for h in range(num_types):
                    if out[i, h] > 0:
                        v = rate[i, h]
                        if not seen:
                            speed = v
                            seen = True
                        elif v < speed:
                            speed = v
                speed = speed * <double>count
            else:
                speed = 0.0
                for h in range(num_types):
                    speed = speed + rate[i, h] * <double>out[i, h]
            same = True
            for h in range(num_types):
                if cur[i, h] != out[i, h]:
                    same = False
                    break
            best = -1
            best_prog = speed * (1.0 if same else moved_share)
            for h in range(num_types):
                if free[h] + out[i, h] < count or rate[i, h] * <double>count <= speed:
                    continue
                same = True
                for k in range(num_types):
                    if cur[i, k] != (count if k == h else 0):
                        same = False
                        break
                prog = rate[i, h] * <double>count * (1.0 if same else moved_share)
                if prog > best_prog * (1.0 + 1e-9):
                    best = h
                    best_prog = prog
            if best >= 0:
                for h in range(num_types):
                    free[h] += out[i, h]
                    out[i, h] = 0
                free[best] -= count
                out[i, best] = count
    return out_a


cdef inline void _shared_finish(double t1, double t2, double s1, double s2,
                                double* b1, double* b2) noexcept nogil:
    cdef double f1 = t1 / s1
    cdef double f2 = t2 / s2
    if f1 <= f2:
        b1[0] = f1
        b2[0] = f1 + t2 - s2 * f1
    else:
        b1[0] = f2 + t1 - s1 * f2
        b2[0] = f2


def pair_guests(order, g_scale, g_kind, g_rem, g_weight, g_rate, g_open, g_partner, g_start,
                g_else, g_behind, g_cpus, h_kind, h_type, h_scale, h_may, h_rp, h_tp, h_wp,
                row_ptr, row_node, pair_host, pair_guest, cpus_left, count_cpus, window,
                start_s):
    """GPU sharing's pairing: twin of ``reference.pair_guests`` (read it for the arguments and
    the rules).  ``cpus_left`` is updated in place, as there; it must be a C-contiguous int64
    array for that (``ValueError`` otherwise).  Arrays of the wrong shape raise
    ``ValueError``, indices out of range ``IndexError``, as in the reference."""
    from hadar_slurm.core.reference import check_pair_args
    check_pair_args(*(np.asarray(a) for a in (
        order, g_scale, g_kind, g_rem, g_weight, g_rate, g_open, g_partner, g_start, g_else,
        g_behind, g_cpus, h_kind, h_type, h_scale, h_may, h_rp, h_tp, h_wp, row_ptr, row_node,
        pair_host, pair_guest, cpus_left)))
    cdef const i64[::1] order_v = np.ascontiguousarray(order, dtype=np.int64)
    cdef const i64[::1] gs = np.ascontiguousarray(g_scale, dtype=np.int64)
    cdef const i64[::1] gk = np.ascontiguousarray(g_kind, dtype=np.int64)
    cdef const double[::1] grem = np.ascontiguousarray(g_rem, dtype=np.float64)
    cdef const double[::1] gw = np.ascontiguousarray(g_weight, dtype=np.float64)
    cdef const double[:, ::1] grate = np.ascontiguousarray(g_rate, dtype=np.float64)
    cdef const i64[:, ::1] gopen = np.ascontiguousarray(g_open, dtype=np.int64)
    cdef const i64[::1] gpart = np.ascontiguousarray(g_partner, dtype=np.int64)
    cdef const double[:, ::1] gstart = np.ascontiguousarray(g_start, dtype=np.float64)
    cdef const double[:, ::1] gelse = np.ascontiguousarray(g_else, dtype=np.float64)
    cdef const double[::1] gbehind = np.ascontiguousarray(g_behind, dtype=np.float64)
    cdef const i64[::1] gcpus = np.ascontiguousarray(g_cpus, dtype=np.int64)
    cdef const i64[::1] hk = np.ascontiguousarray(h_kind, dtype=np.int64)
    cdef const i64[::1] ht = np.ascontiguousarray(h_type, dtype=np.int64)
    cdef const i64[::1] hs = np.ascontiguousarray(h_scale, dtype=np.int64)
    cdef const i64[::1] hmay = np.ascontiguousarray(h_may, dtype=np.int64)
    cdef const double[::1] hrp = np.ascontiguousarray(h_rp, dtype=np.float64)
    cdef const double[::1] htp = np.ascontiguousarray(h_tp, dtype=np.float64)
    cdef const double[::1] hwp = np.ascontiguousarray(h_wp, dtype=np.float64)
    cdef const i64[::1] rptr = np.ascontiguousarray(row_ptr, dtype=np.int64)
    cdef const i64[::1] rnode = np.ascontiguousarray(row_node, dtype=np.int64)
    cdef const double[:, :, ::1] ph = np.ascontiguousarray(pair_host, dtype=np.float64)
    cdef const double[:, :, ::1] pg = np.ascontiguousarray(pair_guest, dtype=np.float64)
    if not (isinstance(cpus_left, np.ndarray) and cpus_left.dtype == np.int64
            and cpus_left.flags.c_contiguous):
        raise ValueError("cpus_left must be a C-contiguous int64 array (updated in place)")
    cdef i64[::1] cleft = cpus_left
    cdef bint count = bool(count_cpus)
    cdef double win = window
    cdef double cost_s = start_s
    cdef Py_ssize_t n = gs.shape[0]
    cdef Py_ssize_t num_hosts = hk.shape[0]
    cdef Py_ssize_t num_types = grate.shape[1]
    host_for_a = np.full(n, -1, dtype=np.int64)
    tight_host_a = np.full(n, -1, dtype=np.int64)
    tight_node_a = np.full(n, -1, dtype=np.int64)
    tight_left_a = np.full(n, -1, dtype=np.int64)
    cdef i64[::1] host_for = host_for_a
    cdef i64[::1] tight_host = tight_host_a
    cdef i64[::1] tight_node = tight_node_a
    cdef i64[::1] tight_left = tight_left_a
    cdef i64[::1] alive = np.ones(num_hosts, dtype=np.int64)
    cdef Py_ssize_t hosts_left = num_hosts
    # The hosts in groups of one kind, type, scale factor and rate, in index order within a
    # group: what a pair's throughput and its guest's times depend on is then weighed once per
    # guest and group, and only the host's own time per host.  (The first of equal gains in
    # index order still wins: ties go to the lower index.)
    by_group = np.lexsort((np.arange(num_hosts), np.asarray(hrp), np.asarray(hs),
                           np.asarray(ht), np.asarray(hk))).astype(np.int64)
    cdef const i64[::1] members = by_group
    starts_a = np.zeros(num_hosts, dtype=np.bool_)
    if num_hosts:
        starts_a[0] = True
        for arr in (np.asarray(hk), np.asarray(ht), np.asarray(hs), np.asarray(hrp)):
            in_groups = arr[by_group]
            starts_a[1:] |= in_groups[1:] != in_groups[:num_hosts - 1]
    firsts = np.flatnonzero(starts_a).astype(np.int64)
    cdef Py_ssize_t num_groups = firsts.shape[0]
    cdef const i64[::1] gptr = np.append(firsts, num_hosts).astype(np.int64)
    cdef const i64[::1] grp_kind = np.asarray(hk)[by_group[firsts]].astype(np.int64)
    cdef const i64[::1] grp_type = np.asarray(ht)[by_group[firsts]].astype(np.int64)
    cdef const i64[::1] grp_scale = np.asarray(hs)[by_group[firsts]].astype(np.int64)
    cdef const double[::1] grp_rate = np.asarray(hrp)[by_group[firsts]].astype(np.float64)
    group_of_a = np.zeros(num_hosts, dtype=np.int64)
    group_of_a[by_group] = np.cumsum(starts_a) - 1
    cdef const i64[::1] group_of = group_of_a
    cdef i64[::1] grp_alive = np.diff(np.append(firsts, num_hosts)).astype(np.int64)
    cdef Py_ssize_t q, x, k, h, r, g, m, best, tight
    cdef i64 again_k, again_g
    cdef bint again, any_open, short, open_g
    cdef double rem_x, w_x, rx, rp, cp, cx, sp, sx, tp, tx, b1, b2, bmax, start, end2, free
    cdef double sooner, wp, gain, best_gain, tight_gain, waiting_start, f1, f2, start_h
    with nogil:
        for q in range(order_v.shape[0]):
            if hosts_left == 0:
                break
            x = order_v[q]
            again_k = gpart[x]
            again_g = group_of[again_k] if again_k >= 0 else -1
            if again_k < 0:
                any_open = False
                for h in range(num_types):
                    if gopen[x, h]:
                        any_open = True
                        break
                if not any_open:
                    continue
            rem_x = grem[x]
            w_x = gw[x]
            best = -1
            best_gain = 0.0
            tight = -1
            tight_gain = 0.0
            for g in range(num_groups):
                if grp_alive[g] == 0 or grp_scale[g] != gs[x]:
                    continue
                h = grp_type[g]
                rx = grate[x, h]
                rp = grp_rate[g]
                if not (rx > 0.0 and rp > 0.0):
                    continue
                open_g = gopen[x, h] != 0
                if not open_g and again_g != g:
                    continue
                cp = ph[grp_kind[g], gk[x], h]
                cx = pg[grp_kind[g], gk[x], h]
                if not (cp > 0.0 and cx > 0.0):
                    continue
                sp = cp / rp
                sx = cx / rx
                if sp + sx <= 1.0:
                    continue
                tx = rem_x / rx
                f2 = tx / sx
                start_h = gstart[x, h]
                sooner = gelse[x, h]
                for m in range(gptr[g], gptr[g + 1]):
                    k = members[m]
                    if not alive[k]:
                        continue
                    again = k == again_k
                    if not again and not (open_g and hmay[k]):
                        continue
                    tp = htp[k]
                    # (_shared_finish, with the guest's part computed once per group)
                    f1 = tp / sp
                    if f1 <= f2:
                        b1 = f1
                        b2 = f1 + tx - sx * f1
                    else:
                        b1 = f2 + tp - sp * f2
                        b2 = f2
                    bmax = b2 if b2 > b1 else b1
                    if bmax > win:
                        continue
                    waiting_start = start_h
                    if tp < waiting_start:
                        waiting_start = tp
                    start = waiting_start if not (0.0 > waiting_start) else 0.0
                    end2 = start + tx
                    free = tp + tx
                    if sooner < end2:
                        end2 = sooner
                        free = tp + (tx if tx < sooner else sooner)
                    # (the reference's ``max(t1 + run2, end2)``, which is ``t1 + run2`` here:
                    # ``start <= tp``, and ``sooner < start + tx``)
                    wp = hwp[k]
                    gain = wp * (tp - b1) + w_x * (end2 - b2) + gbehind[x] * (free - bmax)
                    if not again:
                        gain -= cost_s * (w_x + wp * (1.0 - sp))
                    if not gain > 0.0:
                        continue
                    if count and not again:
                        short = False
                        for r in range(rptr[k], rptr[k + 1]):
                            if cleft[rnode[r]] < gcpus[x]:
                                short = True
                                break
                        if short:
                            if tight < 0 or gain > tight_gain or (gain == tight_gain
                                                                  and k < tight):
                                tight = k
                                tight_gain = gain
                            continue
                    if best < 0 or gain > best_gain or (gain == best_gain and k < best):
                        best = k
                        best_gain = gain
            if best < 0:
                if tight >= 0:
                    tight_host[x] = tight
                    for r in range(rptr[tight], rptr[tight + 1]):
                        if cleft[rnode[r]] < gcpus[x]:
                            tight_node[x] = rnode[r]
                            tight_left[x] = cleft[rnode[r]]
                            break
                continue
            host_for[x] = best
            alive[best] = 0
            grp_alive[group_of[best]] -= 1
            hosts_left -= 1
            if count:
                for r in range(rptr[best], rptr[best + 1]):
                    cleft[rnode[r]] -= gcpus[x]
    return host_for_a, tight_host_a, tight_node_a, tight_left_a
