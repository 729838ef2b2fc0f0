"""The Hadar primal-dual epoch planner: plain-Python reference implementation.

This is the slow, obviously-correct twin of the compiled core (``cython_core/hadar_core.pyx``).
Both take and return NumPy arrays only, do the same floating-point operations in the same order,
and must return identical decisions (tests compare them on random instances).

What it computes (Hadar's online primal-dual scheduler, reconstructed in the OASiS family
(INFOCOM 2018) from the papers' abstracts: Sultana et al., arXiv 2503.10918, 2025; Hadar,
IPDPS 2024):

* **Prices.**  A price per GPU-second
  ``p[h, t] = price_floor[h] * price_ratio ** (g[h, t] / c[h])`` for each GPU type ``h`` and
  epoch ``t`` of the rolling horizon, where ``g`` is what admitted jobs already hold.  The
  caller passes ``price_ratio = U / L``, with ``L`` and ``U`` the smallest and largest utility
  per GPU-second among the jobs in play (:func:`hadar_slurm.policy.hadar.utility_bounds`), and
  a floor of at most ``L / 2`` per type (the textbook form has ``L``).  Prices are per GPU
  *type*, not per node: nodes of one type are interchangeable to the price, and which nodes a
  job gets is decided afterwards by the matcher (the queue-order / resource-matching split).
* **Dual subroutine** (:func:`_best_schedule`), per job against the current prices: in each
  epoch the cheapest way to run it, i.e. its workers cheapest-first by price per iteration
  ``p / (D * r)``, at most ``S`` of them, on free GPUs only.  A synchronous job runs ``S`` workers
  in a gang whose pace is set by its slowest type, so for each possible pace type ``m`` the gang
  takes the cheapest free GPUs among the types at least as fast as ``m``; an asynchronous job
  takes up to ``S`` workers, each progressing at its own type's rate.  Then, for every finishing
  epoch ``T`` of the horizon, the cheapest set of epoch options up to ``T`` that completes the
  remaining work; and, for a job that cannot finish within the horizon, every cheapest prefix of
  options with the rest of its work valued after the horizon on its best type at the floor
  price ``L``.  It keeps the candidate that maximises ``utility(finish) - cost``.
* **Admission.**  Jobs are taken in the given queue order; a job whose best payoff is positive
  is admitted on that schedule and ``g`` grows, raising the prices the next jobs see; otherwise
  it waits (``PRICED_OUT``) and is tried again next epoch.
* **Migration.**  A job placed in epoch 0 on other GPU types than it held loses ``migration_s``
  seconds of that epoch (checkpoint and restart), so it moves only when the move pays.
* **Back-fill.**  GPUs still idle in epoch 0 go, in queue order, to jobs that do not run in
  epoch 0, each on its fastest feasible option, whatever the price: an idle GPU earns nothing.

Only epoch 0 of the plan is dispatched; the next epoch re-plans from scratch (rolling horizon).

Utility: ``f(T) = k / (T + age)`` with ``T`` the finish time from now and ``k = w * ideal``
(weight times the job's runtime alone on its best type), as in the Hadar papers.

Also here, with their compiled twins: :func:`balance_split` (the type split),
:func:`drain_prices` (the drain bound and the type prices that certify it), :func:`match`
(resource matching: per-type GPU counts to nodes), :func:`upgrade_idle` (placed jobs onto idle
GPUs of faster types) and :func:`pair_guests` (GPU sharing: which waiting job joins which
placed one).

The algorithm, step by step with pointers into the code: docs/algorithm.md.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B8 = npt.NDArray[np.bool_]

INF = float("inf")
#: The type split's tolerances, relative so that they mean the same in any time unit: work or
#: slack below ``_REL`` of a job's GPU-seconds is none; loads within ``_TIE`` are level.
_REL = 1e-12
_TIE = 1e-9
_MANTISSA = float(1 << 30)


def _run_seconds(
    i: int, t: int, trial: I64, current: I64, round_s: float, migration_s: float,
) -> float:
    """Seconds of epoch ``t`` that job ``i`` computes on GPUs ``trial`` (counts per type).

    In epoch 0, GPUs other than those it holds (``current[i]``) cost ``migration_s`` of the
    epoch (checkpoint and restart); otherwise it computes the whole epoch.
    """
    if t == 0 and migration_s > 0.0:
        for h in range(current.shape[1]):
            if trial[h] != current[i, h]:
                run_s = round_s - migration_s
                if run_s < 0.0:
                    run_s = 0.0
                return run_s
    return round_s


# The algorithm: docs/algorithm.md, "A job's best schedule (the dual subroutine)".
def _epoch_option(
    i: int, t: int, remaining_work: float, scale: I64, rate: F64, sync: I64, current: I64,
    free: I64, price: F64, round_s: float, migration_s: float, counts_out: I64,
) -> tuple[float, float, float]:
    """Cheapest way to run job ``i`` in epoch ``t``: (cost, progress, raw progress); counts in
    ``counts_out``.

    ``progress`` is clamped to ``remaining_work`` (what the epoch can contribute); ``raw`` is
    what the option would do in the whole epoch, unclamped (for the finish time inside the
    epoch).  Returns ``(inf, 0, 0)`` when it cannot run in that epoch.  Picks the option with
    the least cost per (clamped) iteration; ties go to more progress, then to the lower
    pace-type index.
    """
    num_types = rate.shape[1]
    s = int(scale[i])
    best_cpi = INF
    best_cost = INF
    best_prog = 0.0
    best_raw = 0.0
    trial = np.zeros(num_types, dtype=np.int64)
    for h in range(num_types):
        counts_out[h] = 0
    if sync[i]:
        for m in range(num_types):
            rm = float(rate[i, m])
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
                        ph = float(price[h, t])
                        if ph < pick_price:
                            pick_price = ph
                            pick = h
                if pick < 0:
                    break
                take = min(need, int(free[pick, t] - trial[pick]))
                trial[pick] += take
                need -= take
                cost += take * pick_price * round_s
            if need > 0:
                continue
            run_s = _run_seconds(i, t, trial, current, round_s, migration_s)
            prog = s * rm * run_s
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
        return best_cost, best_prog, best_raw
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
            rh = float(rate[i, h])
            if rh > 0.0 and free[h, t] - trial[h] > 0:
                ppi = float(price[h, t]) / rh
                if ppi < pick_ppi:
                    pick_ppi = ppi
                    pick = h
        if pick < 0:
            break
        take = min(need, int(free[pick, t] - trial[pick]))
        trial[pick] += take
        need -= take
        cost += take * float(price[pick, t]) * round_s
        prog += take * float(rate[i, pick]) * round_s
    if prog <= 0.0:
        return INF, 0.0, 0.0
    run_s = _run_seconds(i, t, trial, current, round_s, migration_s)
    if run_s != round_s:
        prog = prog * (run_s / round_s)
        if prog <= 0.0:
            return INF, 0.0, 0.0
    raw = prog
    if prog > remaining_work:
        prog = remaining_work
    for h in range(num_types):
        counts_out[h] = trial[h]
    return cost, prog, raw


def _best_schedule(
    i: int, remaining: F64, scale: I64, rate: F64, ukey: F64, age: F64, sync: I64,
    current: I64, free: I64, price: F64, round_s: float, horizon: int, migration_s: float,
    best_rate: float, tail_price: float, opt_counts: I64, chosen: I64,
) -> float:
    """The dual subroutine for job ``i``.  Marks chosen epochs in ``chosen``; returns payoff.

    ``opt_counts[t, h]`` receives each epoch's option.  Payoff is ``-inf`` when the job cannot
    run anywhere in the horizon.
    """
    num_types = rate.shape[1]
    work = float(remaining[i])
    opt_cost = np.zeros(horizon)
    opt_prog = np.zeros(horizon)
    opt_raw = np.zeros(horizon)  # unclamped progress of each epoch's option
    row = np.zeros(num_types, dtype=np.int64)
    n_opt = 0
    for t in range(horizon):
        c, p, raw = _epoch_option(i, t, work, scale, rate, sync, current, free, price,
                                  round_s, migration_s, row)
        opt_cost[t] = c
        opt_prog[t] = p
        opt_raw[t] = raw
        for h in range(num_types):
            opt_counts[t, h] = row[h]
        if p > 0.0:
            n_opt += 1
        chosen[t] = 0
    if n_opt == 0:
        return -INF
    # Options in order of cost per iteration (stable: earlier epoch first on ties).
    order = np.zeros(n_opt, dtype=np.int64)
    cpi = np.zeros(n_opt)
    k = 0
    for t in range(horizon):
        if opt_prog[t] > 0.0:
            c_t = opt_cost[t] / opt_prog[t]
            # insertion sort keeps the reference obviously equal to the compiled twin
            j = k
            while j > 0 and cpi[j - 1] > c_t:
                cpi[j] = cpi[j - 1]
                order[j] = order[j - 1]
                j -= 1
            cpi[j] = c_t
            order[j] = t
            k += 1
    best_payoff = -INF
    best_kind = -1  # 0: finish by T (value = T); 1: prefix of length best_len, tail after
    best_val = 0
    # (a) Finish within the horizon, by epoch T.
    for T in range(horizon):
        got = 0.0
        cost = 0.0
        last = -1
        for j in range(n_opt):
            t = int(order[j])
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
        # Finish inside epoch `last`: work done before it in time order, then the rest at the
        # epoch's full (unclamped) pace: a job that needs half an epoch finishes half-way.
        before = got - opt_prog[last]
        frac = (work - before) / opt_raw[last]
        if frac > 1.0:
            frac = 1.0
        finish = last * round_s + frac * round_s
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
            t = int(order[j])
            got += opt_prog[t]
            cost += opt_cost[t]
            tail_s = (work - got) / best_rate
            finish = horizon * round_s + tail_s
            tail_cost = tail_s * scale[i] * tail_price
            payoff = ukey[i] / (finish + age[i]) - cost - tail_cost
            if payoff > best_payoff:
                best_payoff = payoff
                best_kind = 1
                best_val = j + 1
    if best_kind == 0:
        got = 0.0
        for j in range(n_opt):
            t = int(order[j])
            if t > best_val:
                continue
            chosen[t] = 1
            got += opt_prog[t]
            if got >= work:
                break
    elif best_kind == 1:
        for j in range(best_val):
            chosen[int(order[j])] = 1
    return best_payoff


# The algorithm: docs/algorithm.md, "Prices", "Admission and the dual variable".
def plan(
    remaining: F64, scale: I64, rate: F64, fill_rate: F64, ukey: F64, age: F64, sync: I64,
    current: I64, order: I64, capacity: I64, round_s: float, horizon: int, migration_s: float,
    price_floor: F64, price_ratio: float,
) -> tuple[I64, F64, I64]:
    """One epoch of Hadar.  Arrays in, arrays out.

    Inputs (``J`` jobs, ``H`` GPU types): ``remaining[J]`` steps; ``scale[J]`` max workers;
    ``rate[J, H]`` one worker's steps/s on the types the dual pass may use (0: not there);
    ``fill_rate[J, H]`` the same on every type it can run on, for back-fill;
    ``ukey[J] = w * ideal``; ``age[J]``
    seconds since arrival; ``sync[J]`` 1/0; ``current[J, H]`` workers held last epoch;
    ``order`` the queue order (job indices); ``capacity[H]``; the price of type ``h`` per
    GPU-second rises from ``price_floor[h]`` (idle) to ``price_floor[h] * price_ratio`` (full).

    Returns ``alloc[J, H]`` (workers per type in this epoch), ``payoff[J]`` (of the admitted
    schedule; ``-inf`` if never runnable, ``nan`` if not admitted) and ``status[J]``
    (0 admitted and runs now, 1 admitted for a later epoch, 2 priced out, 3 cannot run,
    4 back-filled).  A job with ``remaining <= 0`` (finished) is skipped: status 2, payoff
    ``nan``, no GPUs.

    Raises ``ValueError`` unless ``horizon >= 1`` and ``round_s > 0``.
    """
    if not horizon >= 1:
        raise ValueError(f"plan: horizon must be at least 1 epoch, got {horizon!r}")
    if not round_s > 0.0:
        raise ValueError(f"plan: round_s must be positive (seconds), got {round_s!r}")
    num_jobs, num_types = rate.shape
    g = np.zeros((num_types, horizon), dtype=np.int64)
    free = np.zeros((num_types, horizon), dtype=np.int64)
    price = np.zeros((num_types, horizon))
    alloc = np.zeros((num_jobs, num_types), dtype=np.int64)
    payoff = np.full(num_jobs, np.nan)
    status = np.full(num_jobs, 2, dtype=np.int64)
    for h in range(num_types):
        for t in range(horizon):
            free[h, t] = capacity[h]
            price[h, t] = price_floor[h]
    opt_counts = np.zeros((horizon, num_types), dtype=np.int64)
    chosen = np.zeros(horizon, dtype=np.int64)
    for q in range(order.shape[0]):
        i = int(order[q])
        if remaining[i] <= 0.0:
            continue  # finished: nothing to plan
        best_rate = 0.0
        tail_price = 0.0
        runnable = False
        for h in range(num_types):
            if fill_rate[i, h] > 0.0:
                runnable = True
            if rate[i, h] * scale[i] > best_rate:
                best_rate = rate[i, h] * scale[i]
                tail_price = price_floor[h]
        if not runnable:
            status[i] = 3
            payoff[i] = -INF
            continue
        if best_rate <= 0.0:
            continue
        pay = _best_schedule(i, remaining, scale, rate, ukey, age, sync, current, free, price,
                             round_s, horizon, migration_s, best_rate, tail_price, opt_counts,
                             chosen)
        if pay == -INF:
            continue  # no free GPUs anywhere in the horizon: waits
        if not pay > 0.0:
            payoff[i] = pay
            continue
        payoff[i] = pay
        status[i] = 1
        for t in range(horizon):
            if chosen[t] == 0:
                continue
            for h in range(num_types):
                c = opt_counts[t, h]
                if c == 0:
                    continue
                g[h, t] += c
                free[h, t] -= c
                price[h, t] = price_floor[h] * price_ratio ** (g[h, t] / capacity[h])
                if t == 0:
                    alloc[i, h] = c
            if t == 0:
                status[i] = 0
    # Back-fill epoch 0: first on the types the job may use, then on any type it can run on.
    for rates in (rate, fill_rate):
        for q in range(order.shape[0]):
            i = int(order[q])
            if status[i] == 0 or status[i] == 3 or status[i] == 4:
                continue
            if remaining[i] <= 0.0:
                continue
            best_prog, best = _fastest_option(i, scale, rates, sync, free)
            if best_prog <= 0.0:
                continue
            for h in range(num_types):
                if best[h] > 0:
                    free[h, 0] -= best[h]
                    alloc[i, h] = best[h]
            status[i] = 4
    return alloc, payoff, status


def _fastest_option(i: int, scale: I64, rate: F64, sync: I64, free: I64) -> tuple[float, I64]:
    """The option of job ``i`` in epoch 0 with the most progress, on free GPUs."""
    num_types = rate.shape[1]
    s = int(scale[i])
    best = np.zeros(num_types, dtype=np.int64)
    best_prog = 0.0
    trial = np.zeros(num_types, dtype=np.int64)
    if sync[i]:
        # A gang on one type if any fits; else mixed, paced by its slowest type m and filled
        # from the slowest types still at least as fast as m (faster GPUs stay for others).
        for mixed in range(2):
            for m in range(num_types):
                rm = float(rate[i, m])
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
                            pick_rate = float(rate[i, h])
                            pick = h
                    if pick < 0:
                        break
                    take = min(need, int(free[pick, 0] - trial[pick]))
                    trial[pick] += take
                    need -= take
                if need > 0:
                    continue
                prog = s * rm
                if prog > best_prog:
                    best_prog = prog
                    for h in range(num_types):
                        best[h] = trial[h]
            if best_prog > 0.0:
                break
        return best_prog, best
    need = s
    while need > 0:
        pick = -1
        pick_rate = 0.0
        for h in range(num_types):
            if free[h, 0] - best[h] > 0 and rate[i, h] > pick_rate:
                pick_rate = float(rate[i, h])
                pick = h
        if pick < 0:
            break
        take = min(need, int(free[pick, 0] - best[pick]))
        best[pick] += take
        need -= take
        best_prog += take * pick_rate
    return best_prog, best


# The algorithm: docs/algorithm.md, "Drain prices and the type split".
def balance_split(
    gpu_s: F64, capacity: I64, pi: F64, scale: I64, window: float, max_moves: int,
    level_to: float = 0.0,
) -> F64:
    """Split each job's remaining work over GPU types so that no type is overloaded.

    ``gpu_s[i, h]`` is the GPU-seconds job ``i`` needs on type ``h`` alone (``inf``, or
    ``<= 0`` as for a finished job: it cannot run there); on its ``scale[i]`` GPUs that takes
    ``gpu_s / scale`` seconds.  The split is the
    primal side of the drain prices ``pi`` and lands close to the fluid makespan LP's
    assignment (within a fraction of a percent on Gavel's traces):

    1. each job starts on its cheapest type at the prices (its comparative advantage);
    2. a job that would then take longer than ``window`` moves just enough of its work to its
       fastest type to fit (a job runs on one set of GPUs at a time), if that type is faster;
    3. **level**: work moves from the most loaded type (per GPU) to the least loaded one, the
       job that loses least by the move first, never making a job longer than ``window``;
    4. **exchange**: between two types, a job moves one way and another the other way when
       that saves GPU-seconds (a 2-cycle of the LP); then level again.  At most 8 rounds.

    Returns ``phi[i, h] >= 0``, the fraction of job ``i``'s work on type ``h`` (rows sum to
    1, or 0 for a job with no positive finite ``gpu_s`` on a type with GPUs).
    """
    n, num_types = gpu_s.shape
    phi = np.zeros((n, num_types))
    load = np.zeros(num_types)
    slack = np.zeros(n)
    if n == 0:
        return phi
    for i in range(n):
        first = -1
        first_cost = INF
        fastest = -1
        for h in range(num_types):
            gih = float(gpu_s[i, h])
            if capacity[h] <= 0 or not (gih > 0.0 and gih < INF):
                continue  # no GPUs there, or the job cannot run there
            cost = gih * float(pi[h])
            if cost < first_cost or first < 0:
                first_cost = cost
                first = h
            if fastest < 0 or gih < gpu_s[i, fastest]:
                fastest = h
        if first < 0:
            continue
        phi[i, first] = 1.0
        sf = float(scale[i])
        t_slow = float(gpu_s[i, first]) / sf
        if t_slow > window and fastest != first:
            t_fast = float(gpu_s[i, fastest]) / sf
            if t_fast < t_slow:  # equally fast types: moving would not shorten it
                f = (t_slow - window) / (t_slow - t_fast)
                if f > 1.0:
                    f = 1.0
                phi[i, first] -= f
                phi[i, fastest] += f
        used = 0.0
        for h in range(num_types):
            if phi[i, h] > 0.0:
                used += phi[i, h] * float(gpu_s[i, h])
                load[h] += phi[i, h] * float(gpu_s[i, h])
        slack[i] = window * sf - used
    index = _MoveIndex(phi, gpu_s, slack)
    moves = 0
    for _ in range(8):
        moves += _level(phi, gpu_s, capacity, load, slack, max_moves - moves, index, level_to)
        if _max_per_gpu(load, capacity) <= level_to * (1.0 + 1e-9):
            break  # every type drains by level_to: nothing to gain from exchanges
        if not _exchange(phi, gpu_s, capacity, load, slack, index):
            break
    # Rounding leaves entries of about -1e-16 where work moved away: clip them to 0.
    for i in range(n):
        for h in range(num_types):
            if phi[i, h] < 0.0:
                phi[i, h] = 0.0
    return phi


def _movable(phi: F64, gpu_s: F64, slack: F64, i: int, s: int, d: int) -> bool:
    """May job ``i`` move work from type ``s`` to type ``d``?

    It must hold work on ``s``, be able to run on ``d`` (``0 < gpu_s[i, d] < inf``) and, if
    the move makes it longer, have slack left.  (The exchange's test ``0 < gx < inf and
    0 < gy < inf and phi[i, x] > 1e-12 and (gy <= gx or slack > 1e-9)`` is the same set: work
    is only ever put on types with ``0 < gpu_s < inf``, and for such values
    ``not gy - gx > 0`` is ``gy <= gx``.)
    """
    if not phi[i, s] > 1e-12 or not (gpu_s[i, d] > 0.0 and gpu_s[i, d] < INF):
        return False
    grow = float(gpu_s[i, d]) - float(gpu_s[i, s])
    return not (grow > 0.0 and not slack[i] > _REL * float(gpu_s[i, d]))


class _MoveIndex:
    """Which job a move from type ``s`` to type ``d`` takes, kept up to date as work moves.

    The job is the first in index order with the least ``gpu_s[i, d] / gpu_s[i, s]`` among the
    jobs that may move (:func:`_movable`), i.e. what a scan over all jobs with a strict ``<``
    against ``inf`` returns.  Rescanning all jobs after every move would cost ``O(jobs)`` per
    move; since a move changes only the jobs it moves, one tournament tree per ordered pair of
    types keeps the answer at its root instead (``O(types^2 log jobs)`` per moved job).  A leaf
    holds the quotient of a job that may move, ``inf`` otherwise (and where the quotient is not
    ``< inf``); a node holds the lesser key of its children, the left one on ties, so the root
    holds the first least, as the scan would.  The scan would divide by ``gpu_s[i, s] == 0.0``
    for such a job and raise ``ZeroDivisionError``; :meth:`best` raises it in the same case
    (``zeros`` counts those jobs per pair; unreachable from :func:`balance_split`, which never
    puts work on a type with ``gpu_s <= 0``).  A pair's tree is built when first asked for (from
    the arrays as they are then, which is what updating it all along would give).
    """

    def __init__(self, phi: F64, gpu_s: F64, slack: F64) -> None:
        n, num_types = gpu_s.shape
        size = 1
        while size < n:
            size *= 2
        self.phi = phi
        self.gpu_s = gpu_s
        self.slack = slack
        self.num_types = num_types
        self.size = size
        self.built: list[int] = []  # pairs p = s * num_types + d with a tree, in build order
        self.key = np.full((num_types * num_types, 2 * size), INF)
        self.job = np.full((num_types * num_types, 2 * size), -1, dtype=np.int64)
        self.movable = np.zeros((num_types * num_types, n), dtype=np.int64)
        self.zeros = np.zeros(num_types * num_types, dtype=np.int64)
        self.has_tree = np.zeros(num_types * num_types, dtype=np.int64)

    def _build(self, p: int) -> None:
        n = self.gpu_s.shape[0]
        for i in range(n):
            self.job[p, self.size + i] = i
            self._set(p, i)
        for node in range(self.size - 1, 0, -1):
            self._pull(p, node)
        self.has_tree[p] = 1
        self.built.append(p)

    def _set(self, p: int, i: int) -> bool:
        """Job ``i``'s leaf of pair ``p``; True when it changed."""
        s = p // self.num_types
        d = p % self.num_types
        m = 1 if _movable(self.phi, self.gpu_s, self.slack, i, s, d) else 0
        if m == self.movable[p, i]:
            return False
        self.movable[p, i] = m
        g_s = float(self.gpu_s[i, s])
        if g_s == 0.0:
            self.zeros[p] += 1 if m else -1
        key = INF
        if m and g_s != 0.0:
            ratio = float(self.gpu_s[i, d]) / g_s
            if ratio < INF:
                key = _coarse(ratio)
        self.key[p, self.size + i] = key
        return True

    def _pull(self, p: int, node: int) -> None:
        left = 2 * node
        right = left + 1
        if self.key[p, right] < self.key[p, left]:
            left = right
        self.key[p, node] = self.key[p, left]
        self.job[p, node] = self.job[p, left]

    def refresh(self, i: int) -> None:
        """Job ``i``'s work or slack changed: update its leaves."""
        for p in self.built:
            if self._set(p, i):
                node = (self.size + i) // 2
                while node >= 1:
                    self._pull(p, node)
                    node //= 2

    def best(self, s: int, d: int) -> tuple[int, float]:
        """The job a move from ``s`` to ``d`` takes and its quotient; ``(-1, inf)``: none."""
        p = s * self.num_types + d
        if not self.has_tree[p]:
            self._build(p)
        if self.zeros[p] > 0:
            raise ZeroDivisionError("float division by zero")
        if not self.key[p, 1] < INF:
            return -1, INF
        return int(self.job[p, 1]), float(self.key[p, 1])


def _extremes(load: F64, capacity: I64) -> tuple[int, int]:
    """The most and the least loaded type per GPU (``-1, -1``: no type has GPUs).  Loads within
    ``_TIE`` of each other count as equal and the first such type is taken, so that the same
    cluster in other time units (or summed in another order) levels along the same moves."""
    top = -INF
    low = INF
    for h in range(load.shape[0]):
        if capacity[h] > 0:
            per = load[h] / float(capacity[h])
            top = max(top, per)
            low = min(low, per)
    src = -1
    dst = -1
    for h in range(load.shape[0]):
        if capacity[h] <= 0:
            continue
        per = load[h] / float(capacity[h])
        if src < 0 and per >= top - _TIE * abs(top):
            src = h
        if dst < 0 and per <= low + _TIE * abs(low):
            dst = h
    return src, dst


def coarse(x: F64) -> F64:
    """:func:`_coarse` elementwise (any sign; 0, ``inf`` and NaN stay as they are): for sort
    keys that must not order values equal but for rounding by their rounding."""
    m, e = np.frexp(x)
    out: F64 = np.ldexp(np.floor(m * _MANTISSA + 0.5) / _MANTISSA, e)
    return np.where(np.isfinite(x), out, x)


def _coarse(x: float) -> float:
    """``x > 0`` with its mantissa rounded to 30 bits: quotients equal but for rounding (two
    jobs of one model, the same job in other time units) tie, and the first job wins."""
    m, e = math.frexp(x)
    return math.ldexp(math.floor(m * _MANTISSA + 0.5) / _MANTISSA, e)


def _max_per_gpu(load: F64, capacity: I64) -> float:
    """The greatest load per GPU over the types with GPUs."""
    top = 0.0
    for h in range(load.shape[0]):
        if capacity[h] > 0 and load[h] / float(capacity[h]) > top:
            top = load[h] / float(capacity[h])
    return top


def _level(phi: F64, gpu_s: F64, capacity: I64, load: F64, slack: F64, max_moves: int,
           index: _MoveIndex, level_to: float = 0.0) -> int:
    """Move work from the most to the least loaded type until level, or until the most loaded
    one drains by ``level_to`` (seconds per GPU); returns the moves made."""
    moves = 0
    while moves < max_moves:
        src, dst = _extremes(load, capacity)
        if src < 0:
            break
        per_src = load[src] / float(capacity[src])
        per_dst = load[dst] / float(capacity[dst])
        if per_src <= level_to * (1.0 + 1e-9):
            break
        gap = per_src - per_dst
        scale_gap = per_src if per_src > 1.0 else 1.0
        if gap <= 1e-9 * scale_gap:
            break
        # The job that loses least by the move (least gpu_s[dst] / gpu_s[src], first on ties).
        best, _ = index.best(src, dst)
        if best < 0:
            break
        i = best
        g_src = float(gpu_s[i, src])
        g_dst = float(gpu_s[i, dst])
        grow = g_dst - g_src
        d = gap / (g_src / float(capacity[src]) + g_dst / float(capacity[dst]))
        if level_to > 0.0 and d > (per_src - level_to) * float(capacity[src]) / g_src:
            d = (per_src - level_to) * float(capacity[src]) / g_src  # just down to level_to
        if d > phi[i, src]:
            d = float(phi[i, src])
        if grow > 0.0 and d > slack[i] / grow:
            d = float(slack[i]) / grow
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


def _exchange(phi: F64, gpu_s: F64, capacity: I64, load: F64, slack: F64,
              index: _MoveIndex) -> bool:
    """Swap work between two types where that saves GPU-seconds (a 2-cycle of the LP).

    For types X and Y, job a moves from X to Y at ``gpu_s[a,Y]/gpu_s[a,X]`` GPU-seconds on Y
    per GPU-second freed on X, job b from Y to X at ``gpu_s[b,X]/gpu_s[b,Y]``; when the product
    is below 1 the swap frees capacity on X and leaves Y as loaded as it was.  Returns True when
    it swapped anything (the loads then need levelling again).
    """
    num_types = gpu_s.shape[1]
    changed = False
    for x in range(num_types):
        for y in range(num_types):
            if x == y or capacity[x] <= 0 or capacity[y] <= 0:
                continue
            for _ in range(64):
                a, ra = index.best(x, y)
                b, rb = index.best(y, x)
                if a < 0 or b < 0 or a == b:
                    break
                gax = float(gpu_s[a, x])
                gay = float(gpu_s[a, y])
                gbx = float(gpu_s[b, x])
                gby = float(gpu_s[b, y])
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


# The algorithm: docs/algorithm.md, "Drain prices and the type split".
def drain_prices(
    remaining: F64, scale: I64, rate: F64, capacity: I64, iterations: int,
) -> tuple[float, F64]:
    """A lower bound on the time to finish ``remaining`` work, and the prices that certify it.

    ``rate[i, h]`` is job ``i``'s whole-job steps/s on type ``h`` (0: cannot run).  Lagrangian
    dual of the fluid makespan LP: for type prices ``pi >= 0`` with ``sum pi * c = 1``, the sum
    over jobs of ``min_h pi_h * gpu_s[i, h]`` (``gpu_s = remaining / rate * scale``, the
    GPU-seconds the job needs on ``h``) bounds the makespan from below.  ``iterations``
    multiplicative steps move the prices towards the types whose demand at the current prices
    exceeds their capacity; the best bound seen is kept.  The bound is also at least the longest
    job on its fastest type.  Jobs no type can run are left out.  Returns ``(bound, pi)``, with
    ``pi`` 0 on types without GPUs.
    """
    n, num_types = rate.shape
    pi = np.zeros(num_types)
    best_pi = np.zeros(num_types)
    load = np.zeros(num_types)
    total_cap = 0.0
    usable = 0
    for h in range(num_types):
        if capacity[h] > 0:
            total_cap += float(capacity[h])
            usable += 1
    if usable == 0:
        return 0.0, pi
    for h in range(num_types):
        if capacity[h] > 0:
            pi[h] = 1.0 / total_cap
            best_pi[h] = pi[h]
    longest = 0.0
    any_job = False
    for i in range(n):
        fastest = INF
        for h in range(num_types):
            if capacity[h] > 0 and rate[i, h] > 0.0:
                t = float(remaining[i]) / float(rate[i, h])
                if t < fastest:
                    fastest = t
        if fastest < INF:
            any_job = True
            if fastest > longest:
                longest = fastest
    if not any_job:
        return 0.0, best_pi
    bound = 0.0
    for _ in range(iterations):
        value = 0.0
        for h in range(num_types):
            load[h] = 0.0
        for i in range(n):
            pick = -1
            pick_cost = INF
            pick_gpu_s = 0.0
            for h in range(num_types):
                if capacity[h] > 0 and rate[i, h] > 0.0:
                    gpu_s = float(remaining[i]) / float(rate[i, h]) * float(scale[i])
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
            if capacity[h] > 0:
                load[h] = load[h] / float(capacity[h])
                mean += load[h]
        mean = mean / usable
        if not mean > 0.0:
            break
        norm = 0.0
        for h in range(num_types):
            if capacity[h] > 0:
                pi[h] = pi[h] * math.exp(0.5 * (load[h] / mean - 1.0))
                norm += pi[h] * float(capacity[h])
        for h in range(num_types):
            pi[h] = pi[h] / norm
    if longest > bound:
        bound = longest
    return bound, best_pi


# The algorithm: docs/algorithm.md, "Gang repacking and the matcher".
def match(
    node_type: I64, node_gpus: I64, counts: I64, order: I64,
    cur_job: I64, cur_node: I64, cur_count: I64,
) -> tuple[I64, I64, I64, I64]:
    """Resource matching: turn per-type GPU counts into (job, node, GPUs) rows.

    ``counts[i, h]``: GPUs of type ``h`` job index ``i`` should get; jobs are served in
    ``order``.  ``cur_job/cur_node/cur_count`` are last epoch's rows (job *indices*, -1 for a
    job no longer there).  Rules: a job first keeps the GPUs it held on the nodes it held them,
    as far as its counts allow; the rest of each type goes to the node with the fewest free
    GPUs that holds the whole request (best fit, first such node on ties), or else to the nodes
    with the most free GPUs first (fewest nodes).  A job whose counts cannot all be met gets
    nothing (a partial synchronous job would waste its GPUs).  Returns ``rows_job`` (indices),
    ``rows_node``, ``rows_count`` (jobs in service order, nodes ascending within a job) and
    ``placed[i]`` (1 when job ``i`` got all it asked for).
    """
    num_nodes = node_type.shape[0]
    n, num_types = counts.shape
    free = np.zeros(num_nodes, dtype=np.int64)
    for k in range(num_nodes):
        free[k] = node_gpus[k]
    want = np.zeros((n, num_types), dtype=np.int64)
    for i in range(n):
        for h in range(num_types):
            want[i, h] = counts[i, h]
    placed = np.zeros(n, dtype=np.int64)
    # Nodes of each type, ascending (CSR), so a request scans only its type's nodes.
    type_start = np.zeros(num_types + 1, dtype=np.int64)
    for k in range(num_nodes):
        if 0 <= node_type[k] < num_types:
            type_start[int(node_type[k]) + 1] += 1
    for h in range(num_types):
        type_start[h + 1] += type_start[h]
    type_nodes = np.zeros(type_start[num_types], dtype=np.int64)
    type_fill = np.zeros(num_types, dtype=np.int64)
    for k in range(num_nodes):
        if 0 <= node_type[k] < num_types:
            h = int(node_type[k])
            type_nodes[type_start[h] + type_fill[h]] = k
            type_fill[h] += 1
    # 1. Stay put: kept[r] GPUs of row r stay with its job.
    rows_cur = cur_job.shape[0]
    kept = np.zeros(rows_cur, dtype=np.int64)
    for r in range(rows_cur):
        i = int(cur_job[r])
        k = int(cur_node[r])
        if i < 0 or k < 0 or k >= num_nodes:
            continue
        h = int(node_type[k])
        take = int(cur_count[r])
        if want[i, h] < take:
            take = int(want[i, h])
        if free[k] < take:
            take = int(free[k])
        if take > 0:
            free[k] -= take
            want[i, h] -= take
            kept[r] = take
    # Rows held by each job, to list them and to give them back on failure.
    held_start = np.zeros(n + 1, dtype=np.int64)
    for r in range(rows_cur):
        if kept[r] > 0:
            held_start[int(cur_job[r]) + 1] += 1
    for i in range(n):
        held_start[i + 1] += held_start[i]
    held = np.zeros(held_start[n], dtype=np.int64)
    fill = np.zeros(n, dtype=np.int64)
    for r in range(rows_cur):
        if kept[r] > 0:
            i = int(cur_job[r])
            held[held_start[i] + fill[i]] = r
            fill[i] += 1
    jobs_out: list[int] = []
    nodes_out: list[int] = []
    counts_out: list[int] = []
    took = np.zeros(num_nodes, dtype=np.int64)  # GPUs this job takes per node (new + kept)
    touched = np.zeros(num_nodes, dtype=np.int64)
    for q in range(order.shape[0]):
        i = int(order[q])
        total = 0
        for h in range(num_types):
            total += int(counts[i, h])
        if total <= 0:
            continue
        n_touched = 0
        ok = True
        for h in range(num_types):
            need = int(want[i, h])
            if need <= 0:
                continue
            # Best fit: fewest free GPUs that still hold the whole request.
            best = -1
            for t in range(type_start[h], type_start[h + 1]):
                k = int(type_nodes[t])
                if free[k] - took[k] >= need:
                    if best < 0 or free[k] - took[k] < free[best] - took[best]:
                        best = k
            if best >= 0:
                if took[best] == 0:
                    touched[n_touched] = best
                    n_touched += 1
                took[best] += need
                continue
            # Spread: most free first.
            while need > 0:
                pick = -1
                for t in range(type_start[h], type_start[h + 1]):
                    k = int(type_nodes[t])
                    if free[k] - took[k] > 0:
                        if pick < 0 or free[k] - took[k] > free[pick] - took[pick]:
                            pick = k
                if pick < 0:
                    break
                take = int(free[pick] - took[pick])
                if need < take:
                    take = need
                if took[pick] == 0:
                    touched[n_touched] = pick
                    n_touched += 1
                took[pick] += take
                need -= take
            if need > 0:
                ok = False
                break
        if not ok:
            for t in range(n_touched):
                took[touched[t]] = 0
            # Give back what it kept: a partial synchronous job wastes GPUs.
            for t in range(held_start[i], held_start[i + 1]):
                r = int(held[t])
                free[int(cur_node[r])] += kept[r]
            continue
        placed[i] = 1
        for t in range(n_touched):
            k = int(touched[t])
            free[k] -= took[k]
        for t in range(held_start[i], held_start[i + 1]):
            r = int(held[t])
            k = int(cur_node[r])
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
            k = int(touched[t])
            if took[k] > 0:
                jobs_out.append(i)
                nodes_out.append(k)
                counts_out.append(int(took[k]))
            took[k] = 0
    out_job = np.asarray(jobs_out, dtype=np.int64)
    out_node = np.asarray(nodes_out, dtype=np.int64)
    out_count = np.asarray(counts_out, dtype=np.int64)
    return out_job, out_node, out_count, placed


def check_upgrade_args(alloc: npt.NDArray[np.generic], current: npt.NDArray[np.generic],
                       worker_rate: npt.NDArray[np.generic], sync: npt.NDArray[np.generic],
                       order: npt.NDArray[np.generic], capacity: npt.NDArray[np.generic],
                       ) -> None:
    """:func:`upgrade_idle`'s arguments checked, in both twins (the compiled one reads them
    unchecked in its loop): arrays of the wrong shape raise ``ValueError``, a job index of
    ``order`` out of range ``IndexError``."""
    if alloc.ndim != 2:
        raise ValueError("alloc must be [job, GPU type]")
    n, num_types = alloc.shape
    for name, a in (("current", current), ("worker_rate", worker_rate)):
        if a.shape != (n, num_types):
            raise ValueError(f"{name} must be [job, GPU type], as alloc")
    if sync.shape != (n,):
        raise ValueError("sync must have one entry per job, as alloc")
    if capacity.shape != (num_types,):
        raise ValueError("capacity must have one entry per GPU type, as alloc")
    if alloc.size and int(alloc.min()) < 0:
        raise ValueError("alloc must not be negative")
    if order.ndim != 1:
        raise ValueError("order must be a list of job indices")
    if order.shape[0] and (int(order.min()) < 0 or int(order.max()) >= n):
        raise IndexError("order holds a job index out of range")


def upgrade_idle(alloc: I64, current: I64, worker_rate: F64, sync: I64 | B8, order: I64,
                 capacity: I64, round_s: float, migration_s: float) -> I64:
    """Move a placed job whole onto idle GPUs of a faster type when it progresses more there.

    The type split keeps a job off a fast type so that other jobs can have it; in a round where
    they do not use all of it (a gang leaves GPUs over, a job it was kept for has not arrived)
    those GPUs would idle while the job crawls on a slower type.  In queue order, each placed
    job moves onto the type with room for all its GPUs where it makes the most progress this
    round: ``count`` workers at that type's rate, times the share of the round left after a
    move (``migration_s``) unless it holds exactly those GPUs already; against where it is
    (a synchronous job at its slowest worker's pace, an asynchronous one at the sum).  A job
    already placed on its best option stays; the next epoch plans afresh.

    ``alloc``, ``current``: GPUs per job and type, planned and held; ``sync``: nonzero for a
    synchronous job; ``order``: the queue order (job indices); ``capacity``: GPUs per type.
    Returns the new ``alloc`` (int64, a copy).
    """
    alloc_a = np.asarray(alloc)
    current_a = np.asarray(current)
    rate_a = np.asarray(worker_rate)
    sync_a = np.asarray(sync)
    order_a = np.asarray(order)
    capacity_a = np.asarray(capacity)
    check_upgrade_args(alloc_a, current_a, rate_a, sync_a, order_a, capacity_a)
    # (plain Python over each job's few types: numpy's per-call cost, paid for every placed job
    # in order, made this the decision's longest step on a mostly idle cluster; the compiled
    # twin is faster still)
    out = alloc_a.astype(np.int64)
    free = (capacity_a.astype(np.int64) - out.sum(axis=0)).tolist()
    if not free or max(free) <= 0:
        return out  # no GPU idle: nothing can move (a move idles only what it leaves)
    types = range(len(free))
    moved_share = max(round_s - migration_s, 0.0) / round_s
    counts = out.sum(axis=1)
    order_a = order_a.astype(np.int64)
    for i in order_a[counts[order_a] > 0].tolist():
        top = max(free)
        if top <= 0:
            break
        row = out[i].tolist()
        count = sum(row)
        if count > top + max(row):
            continue  # fits whole on no type, its own GPUs there and the idle ones counted
        r = rate_a[i].tolist()
        if sync_a[i]:
            speed = min(r[h] for h in types if row[h] > 0) * count
        else:
            speed = sum([r[h] * row[h] for h in types])
        now = current_a[i].tolist()
        best = -1
        # the share of the round it works: all of it where it holds those GPUs already
        best_prog = speed * (1.0 if now == row else moved_share)
        for h in types:
            if free[h] + row[h] < count or r[h] * count <= speed:
                continue
            whole = [count if k == h else 0 for k in types]
            prog = r[h] * count * (1.0 if now == whole else moved_share)
            if prog > best_prog * (1.0 + 1e-9):
                best, best_prog = h, prog
        if best >= 0:
            for h in types:
                free[h] += row[h]
            free[best] -= count
            out[i] = 0
            out[i, best] = count
    return out


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
    share; ``w1``/``w2`` their weights; ``behind``: the weight of the jobs waiting behind the
    two; ``wait``: when the second would start if it did not share (by default ``t1``, when the
    first ends: the two one after the other).  ``A``: apart, the first alone, the second from
    ``wait`` (ends ``t1`` and ``wait + t2``), or, where it ends sooner on other GPUs
    (``elsewhere``: when it would end there, from now), there.  ``B``: together until one
    ends, the other alone after (:func:`shared_finish`).  The jobs behind gain the GPU time the
    pair saves: apart the two hold GPUs ``t1 + t2`` (the second's run counted wherever it
    starts: GPUs it takes are GPUs a job behind does not get; on the other GPUs at most until
    ``elsewhere``), or until the second ends apart where that is later (GPUs idle before
    ``wait``); together ``max(b1, b2)``.  Returns
    ``A - B`` of the weighted completion times (> 0: the pair pays)."""
    b1, b2 = shared_finish(t1, t2, s1, s2)
    start = t1 if wait is None else max(wait, 0.0)
    end2, run2 = start + t2, t2
    if elsewhere is not None and elsewhere < end2:
        end2, run2 = elsewhere, min(t2, elsewhere)
    free = max(t1 + run2, end2)
    return w1 * (t1 - b1) + w2 * (end2 - b2) + behind * (free - max(b1, b2))


def check_pair_args(
    order: I64, g_scale: I64, g_kind: I64, g_rem: F64, g_weight: F64, g_rate: F64,
    g_open: I64, g_partner: I64, g_start: F64, g_else: F64, g_behind: F64, g_cpus: I64,
    h_kind: I64, h_type: I64, h_scale: I64, h_may: I64, h_rp: F64, h_tp: F64, h_wp: F64,
    row_ptr: I64, row_node: I64, pair_host: F64, pair_guest: F64, cpus_left: I64,
) -> None:
    """:func:`pair_guests`' arguments checked, in both twins (the compiled one reads them
    unchecked in its loop): arrays of the wrong shape raise ``ValueError``, indices out of
    range ``IndexError``."""
    n = g_scale.shape[0]
    num_hosts = h_kind.shape[0]
    num_types = g_rate.shape[1] if g_rate.ndim == 2 else -1
    for name, a in (("g_kind", g_kind), ("g_rem", g_rem), ("g_weight", g_weight),
                    ("g_partner", g_partner), ("g_behind", g_behind), ("g_cpus", g_cpus)):
        if a.shape != (n,):
            raise ValueError(f"{name} must have one entry per job, as g_scale")
    for name, a in (("g_rate", g_rate), ("g_open", g_open), ("g_start", g_start),
                    ("g_else", g_else)):
        if a.ndim != 2 or a.shape != (n, num_types):
            raise ValueError(f"{name} must be [job, GPU type], as g_rate")
    for name, a in (("h_type", h_type), ("h_scale", h_scale), ("h_may", h_may),
                    ("h_rp", h_rp), ("h_tp", h_tp), ("h_wp", h_wp)):
        if a.shape != (num_hosts,):
            raise ValueError(f"{name} must have one entry per host, as h_kind")
    if row_ptr.shape != (num_hosts + 1,):
        raise ValueError("row_ptr must have one entry per host and one more")
    if (pair_host.ndim != 3 or pair_host.shape != pair_guest.shape
            or pair_host.shape[2] != num_types):
        raise ValueError("pair_host and pair_guest must be [host kind, guest kind, GPU type]")
    for name, a, low, high in (("order", order, 0, n), ("g_kind", g_kind, 0, pair_host.shape[1]),
                               ("g_partner", g_partner, -1, num_hosts),
                               ("h_kind", h_kind, 0, pair_host.shape[0]),
                               ("h_type", h_type, 0, num_types)):
        if a.shape[0] and (int(a.min()) < low or int(a.max()) >= high):
            raise IndexError(f"{name} holds an index out of range")
    if (int(row_ptr[0]) < 0 or bool((np.diff(row_ptr) < 0).any())
            or int(row_ptr[num_hosts]) > row_node.shape[0]):
        raise IndexError("row_ptr must rise from 0 to at most the rows of row_node")
    nodes = row_node[int(row_ptr[0]):int(row_ptr[num_hosts])]
    if nodes.shape[0] and (int(nodes.min()) < 0 or int(nodes.max()) >= cpus_left.shape[0]):
        raise IndexError("row_node holds a node out of range of cpus_left")


def pair_guests(
    order: I64, g_scale: I64, g_kind: I64, g_rem: F64, g_weight: F64, g_rate: F64,
    g_open: I64, g_partner: I64, g_start: F64, g_else: F64, g_behind: F64, g_cpus: I64,
    h_kind: I64, h_type: I64, h_scale: I64, h_may: I64, h_rp: F64, h_tp: F64, h_wp: F64,
    row_ptr: I64, row_node: I64, pair_host: F64, pair_guest: F64, cpus_left: I64,
    count_cpus: int, window: float, start_s: float,
) -> tuple[I64, I64, I64, I64]:
    """GPU sharing's pairing (:func:`hadar_slurm.policy.sharing.pack_waiting`, whose docstring
    has the rules): waiting jobs in ``order``, each weighed against every host left, joining
    the one where its pair gains most (the first of equal gains).

    Per job ``x`` (indices into the ``g_`` arrays; types ``h``): ``g_open[x, h]`` whether it
    may join a new host on type ``h`` (rule 4 and the world's leave), ``g_partner[x]`` the host
    it shared with in the last epoch (``-1``: none; that pair may always form again),
    ``g_start[x, h]`` when it would start on ``h`` apart, ``g_else[x, h]`` when it would end
    apart on another type than ``h`` at the soonest, ``g_behind[x]`` the weight per GPU of
    the waiting jobs behind it, times its GPUs.  Per host ``k``: its kind, type, scale factor,
    whether a new partner may join it, its rate, remaining time and weight, and its nodes
    ``row_node[row_ptr[k]:row_ptr[k + 1]]``.  ``pair_host[a, b, h]`` and ``pair_guest[a, b, h]``:
    the co-located rates of a host of kind ``a`` and a guest of kind ``b`` on type ``h`` (0:
    forbidden).  ``cpus_left``: per node, the CPUs a guest may still take (counted where
    ``count_cpus``; updated in place as guests join).  Returns, per job, the host it joins
    (``-1``: none), and for a job whose best pairs all lack a CPU the best of them, its first
    node without one and that node's free CPUs (``-1`` where not).

    Arrays of the wrong shape raise ``ValueError``, indices out of range ``IndexError``
    (:func:`check_pair_args`, which the compiled twin calls too)."""
    check_pair_args(order, g_scale, g_kind, g_rem, g_weight, g_rate, g_open, g_partner, g_start,
                    g_else, g_behind, g_cpus, h_kind, h_type, h_scale, h_may, h_rp, h_tp, h_wp,
                    row_ptr, row_node, pair_host, pair_guest, cpus_left)
    n = g_scale.shape[0]
    num_hosts = h_kind.shape[0]
    num_types = g_rate.shape[1]
    host_for = np.full(n, -1, dtype=np.int64)
    tight_host = np.full(n, -1, dtype=np.int64)
    tight_node = np.full(n, -1, dtype=np.int64)
    tight_left = np.full(n, -1, dtype=np.int64)
    alive = np.ones(num_hosts, dtype=np.int64)
    hosts_left = num_hosts
    for q in range(order.shape[0]):
        if hosts_left == 0:
            break
        x = int(order[q])
        again_k = int(g_partner[x])
        if again_k < 0 and not any(g_open[x, h] for h in range(num_types)):
            continue
        rem_x = float(g_rem[x])
        w_x = float(g_weight[x])
        best = -1
        best_gain = 0.0
        tight = -1
        tight_gain = 0.0
        for k in range(num_hosts):
            if not alive[k] or h_scale[k] != g_scale[x]:
                continue
            h = int(h_type[k])
            rx = float(g_rate[x, h])
            rp = float(h_rp[k])
            if not (rx > 0.0 and rp > 0.0):
                continue
            again = k == again_k
            if not again and not (g_open[x, h] and h_may[k]):
                continue
            cp = float(pair_host[h_kind[k], g_kind[x], h])
            cx = float(pair_guest[h_kind[k], g_kind[x], h])
            if not (cp > 0.0 and cx > 0.0):
                continue  # the table forbids the pair there
            sp = cp / rp
            sx = cx / rx
            if sp + sx <= 1.0:
                continue  # 1: the pair does no more than taking turns
            tp = float(h_tp[k])
            tx = rem_x / rx
            if max(shared_finish(tp, tx, sp, sx)) > window:
                continue  # 3: the pair (the one left alone after) would end after the target
            # 2: apart, the guest from when it would start (the host's end at the latest), or
            # on another type where it would end sooner.
            gain = pair_gain(tp, tx, sp, sx, float(h_wp[k]), w_x, float(g_behind[x]),
                             min(float(g_start[x, h]), tp), float(g_else[x, h]))
            if not again:
                gain -= start_s * (w_x + float(h_wp[k]) * (1.0 - sp))
            if not gain > 0.0:
                continue
            if count_cpus and not again:
                short = False
                for r in range(row_ptr[k], row_ptr[k + 1]):
                    if cpus_left[row_node[r]] < g_cpus[x]:
                        short = True
                        break
                if short:  # (it would wait for a CPU, and then the pair split)
                    if tight < 0 or gain > tight_gain:
                        tight = k
                        tight_gain = gain
                    continue
            if best < 0 or gain > best_gain:
                best = k
                best_gain = gain
        if best < 0:
            if tight >= 0:
                tight_host[x] = tight
                for r in range(row_ptr[tight], row_ptr[tight + 1]):
                    if cpus_left[row_node[r]] < g_cpus[x]:
                        tight_node[x] = row_node[r]
                        tight_left[x] = cpus_left[row_node[r]]
                        break
            continue
        host_for[x] = best
        alive[best] = 0
        hosts_left -= 1
        if count_cpus:
            for r in range(row_ptr[best], row_ptr[best + 1]):
                cpus_left[row_node[r]] -= g_cpus[x]
    return host_for, tight_host, tight_node, tight_left
