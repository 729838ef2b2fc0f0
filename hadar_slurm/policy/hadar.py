"""``hadar``: the Hadar primal-dual scheduler (Hadar, IPDPS 2024), one epoch at a time.

The policy layer prepares arrays, decides the queue order and the GPU types each job may use,
and calls the core (:mod:`hadar_slurm.core`: compiled, with a NumPy reference twin) for the
per-type worker counts of this epoch, which the node matcher turns into a placement.

The papers leave open how to order the jobs and how to weigh the makespan against the JCT; the
choices below get both close to their bounds on Gavel's traces (see ``bench/quality.py``):

1. **Drain prices.**  :func:`drain_estimate` computes a lower bound ``T_drain`` on the time to
   finish all remaining work and the type prices ``pi`` that certify it (a Lagrangian dual of the
   fluid makespan LP, fitted in a few dozen multiplicative steps).  ``pi`` says what a GPU-second
   of each type is worth to the workload as a whole.
2. **Type split.**  :meth:`HadarPolicy.type_split` (with :func:`hadar_slurm.core.balance_split`):
   which fraction of each job's work should run on which type.  Each job on its fastest type,
   moved off only as far as a type must to drain by the target less a margin; if that cannot
   drain, capacity binds and the prices decide (each job's comparative advantage, levelled so
   that no type is overloaded).  A running job's work on a type where it holds no GPU also
   costs the move (:meth:`HadarPolicy.split_need`), so that near-ties do not swap jobs
   between types from one epoch to the next.  In the dual pass a job may use only the main
   types of its split, and the types it holds GPUs of where it runs at least ``held_speed``
   (0.3) of its pace on its main types, net of the two moves leaving them takes
   (:func:`near_tie_held`; staying is then a choice the prices weigh against the move, not
   one the split takes away; a type far slower is no near-tie, and the job would hold it
   against the jobs the split put there); idle GPUs are back-filled on any type.  A study's
   trial (``Snapshot.spread``) may also use the types that run it at least ``held_speed`` of
   its pace on its main ones where the split puts other jobs' work (:func:`trial_types`); so
   may a waiting job that does not fit on any of its main types beside the critical jobs
   there, where they leave it room (:func:`blocked_types`).
3. **Target.**  All work should drain by ``target = now + T_drain`` (carried across epochs in
   :class:`HadarState`, pushed back only when the remaining work cannot make it).  With GPU
   sharing, an epoch after pairs ran takes it afresh (``share_refresh``): ``T_drain`` counts
   no pairs, so the target it set lies later than the work the pairs left needs, and the
   long jobs it leaves slack to waited past it (Gavel's static_32: makespan 27,939 to 26,925
   s in the mean of 20 runs, the trace and 19 perturbed draws of it, docs/sharing.md).  Where work
   follows a job's end (``Snapshot.after``: a study's trial, whose later rungs follow the one
   it trains toward), ``T_drain`` is at least the longest such path on the jobs' fastest
   types (:func:`job_paths`).
4. **Jobs about to end, then critical jobs** (longest first).  Where the world gives a job's
   GPUs out as soon as it ends (``Snapshot.refill_on_finish``: the sidecar's
   ``reschedule_on_finish``), a running job that ends on the GPUs it holds within the round
   plus a move's cost (:func:`ends_this_round`) goes first: its GPUs come back within the
   round anyway, and stopping it would only add its restart (which jobs are critical turns on
   near-ties; live, a 4-GPU job stopped 12 s before its end for critical jobs ended 190 s
   late).  Critical jobs, per type, McNaughton's conditions for preemptive
   parallel machines: the ``k`` longest jobs of the type must fit in their GPUs until the
   target after this round, in the time the type's chain of gangs (multi-GPU jobs wider than
   half the type, which can never overlap) leaves them; and that chain must fit too.  Jobs that
   cannot wait are critical (a job's length there is its time on its split; copies of one job,
   HadarE's ``Snapshot.pool``, pool their progress and each has the job's time,
   :func:`pooled_time`; a study's trial has its path, its time and the rungs after it at the
   same pace: a study's last rungs are as long as a long job, not as short as one rung).
   Where the chain is what makes jobs critical, it must run in the
   window too, and its shortest gang goes first now (right after the jobs that are critical
   without it) if its GPU-seconds are fewer than the time it would otherwise wait: the same
   makespan, a shorter average JCT (Smith's rule), and no gang left waiting to the end behind
   long jobs under overload.
5. **Then shortest remaining time first** (weighted), which minimises the average JCT; a job
   that holds no GPUs counts its start (``migration_s``) in its remaining time.
6. **Gang repacking** (:func:`repack_gangs`): a waiting multi-GPU job takes its main type from
   smaller jobs later in the order, which would otherwise fragment it.
7. **Fast GPUs out of slow gangs** (:func:`~hadar_slurm.policy.gangs.exchange_fast_gpus`): a
   synchronous gang planned over several types runs at its slowest worker's pace, so its GPUs
   of a faster type go to jobs on its slowest type that finish sooner there (a move's cost
   counted), for as many of those: the gang keeps its pace, every type its count, and fewer
   gangs span nodes with unequal counts, which Slurm cannot run.
8. **Idle faster GPUs** (:func:`upgrade_idle`): a placed job moves whole onto idle GPUs of a
   faster type when it progresses more there this round, the move's cost included (the split
   counts capacity as a fluid; gangs leave GPUs over in whole blocks, and the jobs a type was
   kept for may not be there yet).
9. **Moves must pay** (``move_margin``), where a move costs something (``migration_s``): when
   steps 1-8 move running jobs to other GPUs, the epoch is planned again with every running
   job kept to the types it holds (or stopped), and the moving plan is taken only if what it
   gains, the work this round does more (:func:`ideal_seconds`) plus how much sooner the work
   left drains (:func:`drain_after_round`, both plans at this epoch's drain prices,
   :func:`drain_at`), the moves' costs counted, is more than ``move_margin`` of a move's cost
   (:func:`moves_pay`).  The split's levelling and the drain prices turn on small
   changes in the estimated progress (a run-wide offset of up to half a second changed 9% of
   the decisions of ``bench/data/fidelity.tsv``'s runs, ``bench/stability.py``), and live
   two runs of one trace parted there, between moves that gained nearly nothing either way;
   a kept job's ``explain`` says so.
10. **Matching** (:func:`~hadar_slurm.policy.matching.match_nodes`), where a running job whose
   new GPUs do not come free keeps the ones it holds if no job placed before it took them,
   rather than being stopped while they idle (``keep_running``).
11. **GPU sharing** (:func:`hadar_slurm.policy.sharing.pack_waiting`), only where the backend
   offers it (``Snapshot.colocated``) and ``share`` is on: a job left waiting joins a placed
   job of the same scale factor on its GPUs when the pair's normalised throughput beats taking
   turns, the two jobs' completion times (with the queue behind them) gain, and the host,
   sharing to its end, still ends by the target.  That target is the drain of the queue seen;
   while jobs keep arriving it is not the makespan, which the jobs still to come set: the
   window a pair must keep is stretched by the drain of the work that arrived over the last
   window since the policy's first epoch (``share_arrivals``, :func:`arrivals_forecast`), as
   much again being forecast over the next, and the jobs forecast to arrive count with those
   waiting behind every guest.  A static queue is unchanged (nothing arrives after the first
   epoch); Gavel's poisson_200, mean of 21 runs: average JCT 12,313 to 11,946 s, and to
   11,659 s once a pair's gain counted the GPU time it saves (docs/sharing.md).

Prices in the dual pass rise from a floor per type (proportional to ``pi``, at most half the
least utility density, so an idle cluster admits every job) by the factor ``U / L`` when full;
``L`` and ``U`` are the least and the greatest utility per GPU-second of the jobs in play
(:func:`utility_bounds`).  Utility: ``f(T) = w * ideal / (T - a)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from hadar_slurm.core import balance_split, drain_prices, plan, upgrade_idle
from hadar_slurm.core.reference import coarse
from hadar_slurm.policy.base import (
    BoolArray,
    Decision,
    FloatArray,
    IntArray,
    Placement,
    Reason,
    Snapshot,
)
from hadar_slurm.policy.gangs import exchange_fast_gpus
from hadar_slurm.policy.matching import match_nodes
from hadar_slurm.policy.sharing import pack_waiting

#: How the ``explain`` detail of a job that "moves must pay" kept on its GPUs begins.
KEPT_DETAIL = "kept on its GPUs"


def job_speed(gpus: IntArray, worker_rate: FloatArray, sync: BoolArray) -> FloatArray:
    """Per job, its steps/s on ``gpus`` (GPUs per job and type): their count times the slowest
    type's per-worker rate for a synchronous job (the gang's pace), the sum over its GPUs for
    an asynchronous one; 0 without GPUs."""
    slow = np.where(gpus > 0, worker_rate, np.inf).min(axis=1)
    out: FloatArray = np.where(sync, gpus.sum(axis=1) * np.where(np.isfinite(slow), slow, 0.0),
                               (gpus * worker_rate).sum(axis=1))
    return out


def after_restart(migration_s: float, round_s: float) -> float:
    """The share of a round a job that starts (or restarts) in it still works: ``1 -
    migration_s / round_s``, at least 0."""
    return max(0.0, 1.0 - migration_s / max(round_s, 1e-9))


def near_ties(main: BoolArray, worker_rate: FloatArray, bar: float) -> BoolArray:
    """Per job and type, whether the job runs there, at least ``bar`` of its pace on its
    fastest ``main`` type: the near-tie test of ``near_tie_held``, ``trial_types`` and
    ``blocked_types``."""
    pace = np.where(main, worker_rate, 0.0).max(axis=1, keepdims=True)
    out: BoolArray = (worker_rate > 0) & (worker_rate >= bar * pace)
    return out


def near_tie_held(current: IntArray, worker_rate: FloatArray, main: BoolArray,
                  held_speed: float, migration_s: float, round_s: float) -> BoolArray:
    """The types each job holds GPUs of that stay among its types in the dual pass: where it
    runs at least ``held_speed`` of its pace on its ``main`` types, that pace counted net of
    the two moves that leaving the held GPUs takes (the job's own restart, and the start of
    the job that takes them): ``rate >= held_speed * (1 - migration_s / round_s) ** 2 *
    main pace``.  Where moves cost little the bar is about ``held_speed``; where a move is
    most of a round, staying on GPUs far slower still beats two starts."""
    net = after_restart(migration_s, round_s) ** 2
    out: BoolArray = (current > 0) & near_ties(main, worker_rate, held_speed * net)
    return out


def without_guests(snapshot: Snapshot, known: tuple[int, ...]) -> Snapshot:
    """``snapshot`` with the guests of the pairs that ran (``Snapshot.packed``, both jobs still
    holding GPUs) dropped from ``current``: their GPUs held by their hosts alone.  ``known``:
    the guests the last decision named; a pair whose guest it does not name (e.g. after the
    sidecar restarted) takes the job with the higher id, the later one, for the guest."""
    if not snapshot.packed:
        return snapshot
    running = set(snapshot.current.job.tolist())
    named = set(known)
    guests = [b if b in named or a not in named else a for a, b in snapshot.packed
              if a in running and b in running]
    drop = np.isin(snapshot.current.job, np.array(guests, dtype=np.int64))
    if not drop.any():
        return snapshot
    return replace(snapshot, current=snapshot.current.select(~drop))


def pooled_time(own: FloatArray, remaining: FloatArray, pool: IntArray | None) -> FloatArray:
    """``own`` (each job's time to finish on its split) with the copies of one job (``pool``)
    given the job's time: their work over their summed pace, the same for every copy."""
    if pool is None:
        return own
    pace = np.divide(remaining, own, out=np.zeros_like(own), where=own > 0)
    work = np.bincount(pool, weights=remaining)
    speed = np.bincount(pool, weights=pace)
    job = np.divide(work, speed, out=np.zeros_like(work), where=speed > 0)
    out: FloatArray = np.where((own > 0) & np.isfinite(own), job[pool], own)
    return out


def job_paths(rem_own: FloatArray, remaining: FloatArray, after: FloatArray,
              rem_best: FloatArray) -> tuple[FloatArray, float]:
    """Per job, its time to the end of what it is part of (``Snapshot.after``: the work that
    must follow it, a study's later rungs), at the pace of its time on its split
    (``rem_own``); and the longest such path on the jobs' fastest types (``rem_best``), a
    bound on the drain."""
    stretch = 1.0 + np.divide(after, remaining, out=np.zeros_like(after), where=remaining > 0)
    path: FloatArray = rem_own * stretch
    best = rem_best * stretch
    ok = np.isfinite(best)
    return path, float(best[ok].max()) if ok.any() else 0.0


def ends_this_round(remaining: FloatArray, held: IntArray, worker_rate: FloatArray,
                    sync: BoolArray, round_s: float) -> BoolArray:
    """Per job, whether it holds GPUs and ends within ``round_s`` on them, at its
    :func:`job_speed` there."""
    rate = job_speed(held, worker_rate, sync)
    out: BoolArray = (held > 0).any(axis=1) & (rate > 0) & (remaining <= rate * round_s)
    return out


def utility_bounds(ukey: FloatArray, age: FloatArray, rem_best: FloatArray,
                   scale: IntArray) -> tuple[float, float]:
    """(L, U): min and max utility per GPU-second, kept finite, positive and apart.

    A job's utility per GPU-second is ``f(now + rem) / (S * rem)`` with ``rem`` its remaining
    time on its best type, i.e. what it is worth per GPU-second if it ran alone from now on.
    """
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
    return drain_prices(
        np.ascontiguousarray(remaining, dtype=np.float64),
        np.ascontiguousarray(scale, dtype=np.int64),
        np.ascontiguousarray(rate, dtype=np.float64),
        np.ascontiguousarray(capacity, dtype=np.int64),
        int(iterations),
    )



def any_copy(pool: IntArray, mask: BoolArray) -> BoolArray:
    """Per copy (``Snapshot.pool``: the job each is a copy of), whether ``mask`` holds for any
    copy of its job."""
    out: BoolArray = np.bincount(pool, weights=mask)[pool] > 0
    return out


def restarted(snapshot: Snapshot, alloc: IntArray, held: IntArray | None = None) -> BoolArray:
    """Per job, whether ``alloc`` (GPUs per job and type) starts it anew: its GPUs there differ
    from those it holds (``held``: ``snapshot.held()``, where the caller has it).  The copies
    of one job (``Snapshot.pool``: HadarE's) restart together, since the job runs as one set of
    copies: a copy added, stopped or moved restarts the others too."""
    out: BoolArray = (alloc != (snapshot.held() if held is None else held)).any(axis=1)
    if snapshot.pool is not None and out.any():
        out = any_copy(snapshot.pool, out)
    return out


def round_progress(snapshot: Snapshot, alloc: IntArray, held: IntArray | None = None,
                   ) -> FloatArray:
    """The steps each job makes in a round of ``alloc`` (GPUs per job and type), at most what
    it has left: a job that ``alloc`` starts anew (:func:`restarted`; ``held`` as there) works
    the round less a move's cost (``migration_s``; a waiting job's start costs as much), at its
    :func:`job_speed` on them."""
    round_s = float(snapshot.round_s)
    worker_rate = snapshot.rate / np.maximum(snapshot.scale, 1)[:, None]
    run_s = np.where(restarted(snapshot, alloc, held),
                     max(round_s - float(snapshot.migration_s), 0.0), round_s)
    speed = job_speed(alloc, worker_rate, snapshot.sync)
    out: FloatArray = np.minimum(speed * run_s, np.maximum(snapshot.remaining, 0.0))
    return out


def drain_at(remaining: FloatArray, scale: IntArray, rate: FloatArray, capacity: IntArray,
             pi: FloatArray) -> float:
    """The drain bound of :func:`drain_estimate` at the given type prices ``pi`` (normalised,
    ``sum pi * c = 1``) rather than at prices fitted anew: ``sum_i min_h pi_h * GPU-seconds of
    job i on h``, and at least the longest job on its fastest type.  A lower bound at any
    prices; at one set of prices it is linear in the work left, so two workloads compare by
    their difference in priced work, not by two fits' errors."""
    ok = (rate > 0) & (capacity > 0)[None, :]
    rem = np.maximum(remaining, 0.0)[:, None]
    alone = np.divide(rem, rate, out=np.full(rate.shape, np.inf), where=ok)
    gpu_s = np.where(ok, alone, 0.0) * scale[:, None]
    priced = np.where(ok, gpu_s * pi[None, :], np.inf).min(axis=1)
    fastest = alone.min(axis=1)
    some = np.isfinite(fastest)
    if not some.any():
        return 0.0
    return max(float(priced[some].sum()), float(fastest[some].max()))


def drain_after_round(snapshot: Snapshot, alloc: IntArray, capacity: IntArray,
                      pi: FloatArray, done: FloatArray | None = None) -> float:
    """The drain bound at the type prices ``pi`` (:func:`drain_at`; the caller's, so that
    plans compare by their priced work) of the work left after a round of ``alloc``
    (:func:`round_progress`), lower when ``alloc`` drains the workload sooner.

    After the round, a job that holds GPUs in ``alloc`` pays a move's cost again to run on a
    type it does not hold there: staying on a type where its work is dear only puts a move
    off, and the bound says so (without it, the fluid bound takes every later move as free
    and prefers to stay).  ``done``: :func:`round_progress` of ``alloc``, where the caller has
    it."""
    if done is None:
        done = round_progress(snapshot, alloc)
    rem = np.maximum(snapshot.remaining - done, 0.0)
    rate = snapshot.rate
    runs = rate > 0
    # (a move's cost on the types it does not hold, as a lower whole-job rate there)
    alone = np.divide(rem[:, None], rate, out=np.zeros_like(rate), where=runs)
    away = (alloc.sum(axis=1) > 0)[:, None] & (alloc == 0) & runs & (rem[:, None] > 0)
    rate = np.where(away, rem[:, None] / np.maximum(alone + float(snapshot.migration_s), 1e-300),
                    rate)
    return drain_at(rem, snapshot.scale, rate, capacity, pi)


def moves_pay(more: float, sooner: float, margin: float) -> bool:
    """Whether a plan that moves running jobs is taken over the one that keeps them (step 9
    of the module docstring): what it gains, the work this round does more
    (:func:`ideal_seconds`) plus how much sooner the work left drains
    (:func:`drain_after_round`, both plans at this epoch's prices), both in seconds, is more
    than ``margin``.  One sum, not either test alone: with either, two plans won in turn,
    each on its own test (the one that drains sooner, then the one that works more), and
    jobs went back and forth between two types every few rounds, each move a restart
    (docs/algorithm.md, "A move's gain is one sum")."""
    return more + sooner > margin


def trial_types(main: BoolArray, worker_rate: FloatArray, spread: BoolArray,
                speed: float) -> BoolArray:
    """The GPU types a study's trial may use in the dual pass beyond its split's main ones
    (issue #17): those that run it at least ``speed`` of its pace on its fastest main type
    (the policy's ``held_speed``, the near-tie of step 2), where a job that is not a trial
    (``spread`` False) has a main share of its work.

    The split puts each job's work where it is cheapest for the drain of all work, so amid
    other jobs a study's trials went to the type where the others are relatively slowest
    (recsys-48's on the k80s, 1.5 times as fast for it as a v100, while the p100s, 2.3 times
    as fast, went to jobs that run 3 to 6 times slower on a k80), and its last rungs waited
    there an hour behind jobs of many hours.  A trial's report gates its whole cohort, and the
    study is judged by its end; so a trial is not kept off a type for the drain of the other
    jobs, and competes there on the dual pass's prices in shortest-remaining-time order.  Not
    only the faster types: a rung ends with its last trial, so a GPU of a near-tie type that
    another job's split claims still shortens the rung where the trial's own types are full
    (recsys-48 draw 14 amid other jobs, its p100s held by a critical job: synchronous halving
    1.22 to 2.33 times the static run's speed with the near-ties, against as fast only;
    docs/studies.md).  A type far slower is no near-tie: a trial there sets its cohort's end.
    Among trials the split stands: with no other job on a type (a study alone) it levels the
    cohort's trials over the types, which is what ends a rung soonest.  ``main``, the split's
    main types (and the held ones), per job and type; returns the added types."""
    others: BoolArray = np.asarray((main & ~spread[:, None]).any(axis=0), dtype=np.bool_)
    out: BoolArray = (spread[:, None] & others[None, :] & near_ties(main, worker_rate, speed)
                      & ~main)
    return out


def blocked_types(main: BoolArray, worker_rate: FloatArray, scale: IntArray,
                  current: IntArray, critical: BoolArray, capacity: IntArray,
                  speed: float) -> BoolArray:
    """The GPU types a waiting job may use in the dual pass beyond its main ones where
    critical jobs hold too many GPUs of every main type for it to fit there (issue #15): those
    that run it at least ``speed`` of its pace on its fastest main type (the policy's
    ``held_speed``, the near-tie of step 2) and where the critical jobs leave it room.

    The split counts a type's GPUs as a fluid, so it may give a job a type whose GPUs the
    critical jobs, which go first, hold for the window: an 8-GPU job on a type of eight GPUs
    of which a long 1-GPU critical job holds one never fits there, and it waited round after
    round with faster GPUs of its near-tie types running longer jobs that are not critical
    (five/poisson-1.5 of seed base 100: four 8-GPU jobs of one to three hours on an h100 waited
    beside a 1-GPU job with 84 hours left, and the shortest quarter of the jobs averaged three
    times the JCT they had under Gavel's LAS).  On those types it competes in
    shortest-remaining-time order like any job.  ``main``, the main types (and the held
    ones), per job and type; ``current``, the GPUs each job holds per type; returns the
    added types (none for a job that is critical, holds GPUs, or fits on a main type)."""
    held = np.where(critical[:, None], current, 0).sum(axis=0)
    room = (capacity - held)[None, :] >= scale[:, None]
    stuck = ~critical & (current.sum(axis=1) == 0) & ~(main & room).any(axis=1)
    out: BoolArray = stuck[:, None] & room & near_ties(main, worker_rate, speed) & ~main
    return out


def ideal_seconds(snapshot: Snapshot, alloc: IntArray, done: FloatArray | None = None,
                  ) -> float:
    """The work of a round of ``alloc`` (:func:`round_progress`, or ``done`` where the caller
    has it) in seconds of each job alone on its fastest type, summed over the jobs: higher when
    ``alloc`` puts jobs where they progress faster, which shortens their completions even where
    the drain bound (set by the longest work) does not move."""
    best = snapshot.rate.max(axis=1)
    if done is None:
        done = round_progress(snapshot, alloc)
    return float(np.divide(done, best, out=np.zeros_like(done), where=best > 0).sum())


class Arrivals(NamedTuple):
    """:func:`arrivals_forecast`'s answer."""

    #: the window stretched by the drain of the work forecast to arrive over it
    window: float
    #: the weight, per GPU of the cluster, of the jobs forecast to arrive over it
    weight: float


def arrivals_forecast(snapshot: Snapshot, window: float, since: float) -> Arrivals:
    """What GPU sharing (step 11) expects to arrive over the next ``window`` seconds: as much
    as arrived over the last ``window`` seconds after ``since`` (the policy's first epoch, so
    that a queue found waiting is no arrival), counting the jobs still in the snapshot.

    ``window``: ``window`` plus the drain of that work, each job's whole work in GPU-seconds
    alone on its fastest type, over the cluster's GPUs (the window a pair must end by: while
    jobs keep arriving the queue's drain is not the makespan).  ``weight``: those jobs'
    weight over the cluster's GPUs: jobs that will wait behind every guest, for whom the GPU
    time a pair saves counts as it does for the jobs waiting now (:func:`~hadar_slurm.policy.
    sharing.pack_waiting`'s ``arriving``).  Not used by the critical test: the same window
    there gave up the end game's makespan where arrivals stop (docs/tried.md)."""
    best = snapshot.rate.max(axis=1)
    recent = ((snapshot.arrival > since) & (snapshot.arrival > snapshot.now - window)
              & (best > 0))
    gpu_s = snapshot.total[recent] / best[recent] * snapshot.scale[recent]
    gpus = max(float(snapshot.capacity().sum()), 1.0)
    return Arrivals(window + float(gpu_s.sum()) / gpus,
                    float(snapshot.weight[recent].sum()) / gpus)


def carried_window(window: float, prev_target: float | None, now: float) -> tuple[float, float]:
    """``(window, target)``: the seconds to the drain target and the target itself, which only
    moves later (``prev_target``: the one carried from the last epoch, or None).  The window is
    ``window`` itself unless the carried target lies later: never ``(now + window) - now``,
    which rounds it to the precision of ``now`` (a Unix time's 2e-7 s), so that the same
    cluster in other time units gets the same window."""
    if prev_target is not None and prev_target - now > window:
        window = prev_target - now
    return window, now + window


def repack_gangs(alloc: IntArray, scale: IntArray, main: BoolArray, rate: FloatArray,
                 order: IntArray, capacity: IntArray) -> IntArray:
    """Give a waiting multi-GPU job the GPUs that smaller, later jobs hold on its main type.

    A gang needs all its GPUs of one type at once; jobs that come after it in the queue
    order but fit in the GPUs left over can take them first and keep it waiting while GPUs
    idle or run jobs off their best type (fragmentation).  Per type, the first waiting gang
    (in queue order) whose main type it is takes the type's idle GPUs plus those of the
    fewest smaller, later jobs that make room; the jobs it displaces then take idle GPUs of
    any type where they fit, fastest first.  Returns the new per-type counts.
    """
    out = alloc.copy()
    n, num_types = out.shape
    if n == 0:
        return out
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(order.shape[0])
    held = out.sum(axis=1)
    waiting = (held == 0) & (scale > 1)
    if not waiting.any():
        return out
    displaced: list[int] = []
    row = held.copy()  # (GPUs per job, as ``out`` changes)
    for h in range(num_types):
        cands = np.nonzero(waiting & main[:, h] & (scale <= capacity[h]))[0]
        if cands.shape[0] == 0:
            continue
        g = int(cands[np.argmin(pos[cands])])
        idle = int(capacity[h] - out[:, h].sum())
        need = int(scale[g]) - idle
        if need > 0:
            on_h = np.nonzero((out[:, h] > 0) & (out[:, h] == row)
                              & (scale < scale[g]) & (pos > pos[g]))[0]
            victims = on_h[np.argsort(-pos[on_h], kind="stable")]
            freed = np.cumsum(out[victims, h])
            enough = np.nonzero(freed >= need)[0]
            if enough.shape[0] == 0:
                continue
            chosen = victims[: int(enough[0]) + 1]
            row[chosen] -= out[chosen, h]
            out[chosen, h] = 0
            displaced.extend(chosen.tolist())
        out[g, h] = scale[g]
        row[g] += scale[g]
        waiting[g] = False
    free = capacity - out.sum(axis=0)
    for v in sorted(displaced, key=lambda i: int(pos[i])):
        fits = (rate[v] > 0) & (free >= scale[v])
        if fits.any():
            h = int(np.argmax(np.where(fits, rate[v], -1.0)))
            out[v, h] = scale[v]
            free[h] -= scale[v]
    return out


@dataclass(frozen=True)
class HadarState:
    """Carried from epoch to epoch: the absolute time by which all work should drain, and (GPU
    sharing) the jobs that joined a host on its GPUs, the *guests*, of the decision."""

    target: float
    guests: tuple[int, ...] = ()
    #: The gangs a type's chain made critical (the chain rule of ``critical_jobs``), by id.
    chain: tuple[int, ...] = ()
    #: The ``now`` of the policy's first epoch (NaN until one ran): jobs that arrived after it
    #: are arrivals to :func:`arrivals_forecast`, those found waiting then are not.
    since: float = float("nan")


@dataclass
class HadarPolicy:
    """Hadar.  Every knob has a default that needs no tuning; see the module docstring.

    ``horizon``: epochs of look-ahead in the dual pass.  What a move costs a job is not a
    setting: it comes from the world, ``Snapshot.migration_s`` (checkpoint and restart; 0 in
    Gavel-style simulation).
    ``margin_rounds``: rounds of safety when testing whether a job can still wait.
    ``split_share``: a type is one of a job's main types when the job's split puts at least
    this share of the largest one there.
    ``held_speed``: a type a job holds GPUs of stays among its types in the dual pass only
    where it runs the job at least this share of its pace on its main types, net of the
    moves' costs (:func:`near_tie_held`; step 2 of the module docstring; 0: every held type);
    and a study's trial may use, where other jobs' splits work, the types that run it at least
    this share of its pace on its main types (:func:`trial_types`).
    ``chain_factor``: how early jobs wider than half a type start their chain (1.0: as late as
    possible; lower starts them earlier, trading JCT for makespan on gang-heavy workloads).
    ``share``: pair a waiting job with a placed one on the same GPUs where that pays (step 11
    of the module docstring), where the snapshot offers sharing; off (the default for now:
    tests that hold Hadar's runs to the fluid bound without sharing run it where sharing is
    offered), or where sharing is not offered, no decision packs.
    ``share_refresh``: with ``share``, in an epoch after pairs ran (``Snapshot.packed``), the
    drain target is taken afresh rather than carried (step 3 of the module docstring).
    ``share_arrivals``: with ``share``, the window by which a pair must end (step 11) is
    stretched by the work that arrived since the policy's first epoch over the last window
    (:func:`arrivals_forecast`): as much again is forecast over the next, so while jobs keep
    arriving the drain of the queue seen is not the makespan a pair must keep; and the jobs
    forecast to arrive count with those waiting behind a guest (step 2 of the sharing rules).
    ``move_margin``: by how much, in moves' costs (``migration_s``), a plan that moves
    running jobs must drain sooner or work more than one that keeps them where they are (step
    9 of the module docstring); negative: moves are not weighed.  0.25 took the decisions of
    ``bench/stability.py`` that a 0.5 s progress offset changes from 9% to 4% for Hadar (not
    for HadarE: 18% to 29%; docs/algorithm.md, "Moves must pay").
    """

    horizon: int = 8
    margin_rounds: float = 1.5
    chain_factor: float = 0.95
    min_floor: float = 0.05
    split_share: float = 0.5
    held_speed: float = 0.3
    max_moves: int = 20000
    share: bool = False
    share_refresh: bool = True
    share_arrivals: bool = True
    move_margin: float = 0.25
    name: str = "hadar"

    def allocate(self, snapshot: Snapshot) -> Decision:
        n = snapshot.num_jobs
        reason = np.full(n, Reason.PRICED_OUT, dtype=np.int8)
        if n == 0:
            return Decision(snapshot.epoch, Placement.empty(), reason, snapshot.policy_state)
        world = snapshot
        snapshot = self.plan_view(world)
        scale = snapshot.scale.astype(np.int64)
        rate = snapshot.rate
        runs = rate > 0
        worker_rate = rate / scale[:, None]
        best_rate = rate.max(axis=1)
        ideal = np.divide(snapshot.total, best_rate, out=np.zeros(n), where=best_rate > 0)
        ukey = snapshot.weight * ideal
        age = snapshot.now - snapshot.arrival
        rem_best = np.divide(snapshot.remaining, best_rate, out=np.full(n, np.inf),
                             where=best_rate > 0)
        lo, hi = utility_bounds(ukey, age, rem_best, scale)
        capacity = snapshot.capacity()

        # 1-3: drain prices, type split, target.
        current = snapshot.held()
        drain, pi, need, phi = self.split_of(snapshot, current)
        need0 = np.where(runs, need, 0.0)
        own = np.argmax(phi, axis=1)
        rem_own = pooled_time((phi * need0).sum(axis=1) / scale, snapshot.remaining,
                              snapshot.pool)
        path = rem_own
        if snapshot.after is not None:
            # (a study's trial: the rungs after its own follow it, so its path to the study's
            # end is longer than its work, and the workload cannot drain before the longest)
            path, longest = job_paths(rem_own, snapshot.remaining, snapshot.after, rem_best)
            drain = max(drain, longest)
        prev = snapshot.policy_state
        since = (prev.since if isinstance(prev, HadarState) and prev.since == prev.since
                 else float(snapshot.now))
        # (with sharing, after an epoch in which pairs ran, the target is taken afresh: the
        # pairs did more work than the unshared drain that set the carried one counted)
        fresh = (self.share_refresh and self.share and world.colocated is not None
                 and bool(world.packed))
        window, target = carried_window(
            drain, prev.target if isinstance(prev, HadarState) and not fresh else None,
            snapshot.now)

        # 4-5: queue order.
        prev_chain = prev.chain if isinstance(prev, HadarState) else ()
        critical, chain_now, chain_ids = self.critical_jobs(
            snapshot, path, own, window, capacity, current, prev_chain)
        # A job that holds no GPUs must start before it progresses: its remaining time counts
        # the start (``migration_s``), so a new job displaces a running one only if it ends
        # sooner, its start included.
        srpt = (rem_best + np.where(current.sum(axis=1) > 0, 0.0, float(snapshot.migration_s))
                ) / snapshot.weight
        # Critical jobs levelled to the window have equal ``rem_own`` but for rounding: they
        # tie (``coarse``), and the later keys order them as in any other time unit.
        key_crit = np.where(critical, -coarse(path), np.inf)
        ending = ends_this_round(snapshot.remaining, current, worker_rate,
                                 snapshot.sync.astype(np.bool_),
                                 float(snapshot.round_s) + float(snapshot.migration_s))
        ending &= snapshot.refill_on_finish
        order = np.lexsort((snapshot.job_ids, srpt, ~chain_now, key_crit,
                            ~critical, ~ending)).astype(np.int64)

        floor = pi / max(float(pi.max()), 1e-300) * (0.5 * lo)
        floor = np.maximum(floor, 0.5 * lo * self.min_floor)
        # The dual pass uses a job's main types only: a sliver of a split (a job levelled over
        # two types) is for back-fill, not a reason to take a GPU another job needs more.  And
        # the types a job holds GPUs of: the split says where its work is cheapest for the
        # drain, the dual pass whether going there pays (a move loses ``migration_s`` of the
        # epoch), rather than the split's turn forcing it off (the split is one of many
        # near-equal levellings, which turns with the GPUs jobs hold: jobs went back and forth
        # between two types every epoch or two).
        # A held type stays only where it is a near-tie (``held_speed``, step 2).  Far slower
        # (a job back-filled onto GPUs that idled, 30 times slower there than on its main
        # type) it would hold them, early in the queue, against the jobs the split put there,
        # which then took its faster GPUs (docs/algorithm.md, "A held type must be a
        # near-tie").
        main = (phi > 0.0) & (phi >= self.split_share * phi.max(axis=1, keepdims=True))
        main |= near_tie_held(current, worker_rate, main, self.held_speed,
                              float(snapshot.migration_s), float(snapshot.round_s))
        if snapshot.spread is not None:
            main |= trial_types(main, worker_rate, snapshot.spread, self.held_speed)
        # A waiting job that cannot fit on any main type beside the critical jobs there may
        # use its near-tie types where they leave it room (``blocked_types``).
        main |= blocked_types(main, worker_rate, scale, current, critical, capacity,
                              self.held_speed)
        alloc, payoff, status, planned, packed = self._dispatch(
            snapshot, main, current, worker_rate, ukey, age, order, capacity, floor, lo, hi)
        # 9: moves must pay.  Planning anew with every running job kept to the types it holds
        # (or stopped), the plan that moves jobs is taken only if it drains sooner or does
        # more work this round, its moves' costs counted, by more than ``move_margin`` of a
        # move's cost.
        withheld: list[int] = []
        if self.move_margin >= 0.0 and snapshot.migration_s > 0.0:
            running = current.sum(axis=1) > 0
            moved = running & (alloc.sum(axis=1) > 0) & restarted(snapshot, alloc, current)
            if moved.any():
                keep = np.where(running[:, None], (current > 0) & (worker_rate > 0), main)
                if snapshot.pool is not None:
                    # (no copy added to a job that runs: that would restart it too)
                    keep &= ~(any_copy(snapshot.pool, running) & ~running)[:, None]
                stay = self._dispatch(snapshot, keep, current, worker_rate, ukey, age, order,
                                      capacity, floor, lo, hi)
                margin = self.move_margin * float(snapshot.migration_s)
                # (the drain bounds at this epoch's prices, not fitted anew: two fits differed
                # by thousands of seconds where one round could move the bound by at most its
                # length, and the moves their noise let through went back and forth)
                done = round_progress(snapshot, alloc, current)
                done_stay = round_progress(snapshot, stay[0], current)
                more = (ideal_seconds(snapshot, alloc, done)
                        - ideal_seconds(snapshot, stay[0], done_stay))
                sooner = (drain_after_round(snapshot, stay[0], capacity, pi, done_stay)
                          - drain_after_round(snapshot, alloc, capacity, pi, done))
                if not moves_pay(more, sooner, margin):
                    alloc, payoff, status, planned, packed = stay
                    main = keep
                    withheld = np.flatnonzero(moved & (alloc == current).all(axis=1)).tolist()
        split_rate = np.where(main, worker_rate, 0.0)
        placement, placed = match_nodes(snapshot, alloc, order, keep_running=True)
        # 11: GPU sharing, where the world offers it.
        pairs: tuple[tuple[int, int], ...] = ()
        detail: dict[int, str] = {}
        guest_ids: tuple[int, ...] = ()
        if self.share and world.colocated is not None:
            ahead = (arrivals_forecast(world, window, since) if self.share_arrivals
                     else Arrivals(window, 0.0))
            placement, pairs, guests, detail = pack_waiting(world, placement, order,
                                                            ahead.window, ahead.weight)
            placed = placed | guests
            guest_ids = tuple(sorted(int(j) for j in world.job_ids[guests].tolist()))
        reason[:] = self.reasons(status, payoff, snapshot.remaining, split_rate, planned,
                                 packed, placed)
        for i in withheld:
            detail.setdefault(int(snapshot.job_ids[i]), (
                f"{KEPT_DETAIL}: the plan that moved it gained less than "
                f"{self.move_margin:g} of a move's cost ({float(snapshot.migration_s):.0f} s)"))
        return Decision(snapshot.epoch, placement, reason,
                        HadarState(target, guest_ids, chain_ids, since),
                        detail, packed=pairs)

    def _dispatch(self, snapshot: Snapshot, main: BoolArray, current: IntArray,
                  worker_rate: FloatArray, ukey: FloatArray, age: FloatArray, order: IntArray,
                  capacity: IntArray, floor: FloatArray, lo: float, hi: float,
                  ) -> tuple[IntArray, FloatArray, IntArray, BoolArray, BoolArray]:
        """Steps 6-8 of the module docstring around the dual pass, with ``main`` the types
        each job may take there: ``(alloc, payoff, status, planned, packed)``, ``planned`` and
        ``packed`` the jobs with GPUs after the dual pass and after the gang repacking."""
        scale = snapshot.scale.astype(np.int64)
        split_rate = np.where(main, worker_rate, 0.0)
        alloc, payoff, status = plan(
            snapshot.remaining.astype(np.float64), scale, split_rate, worker_rate, ukey, age,
            snapshot.sync.astype(np.int64), current, order, capacity, float(snapshot.round_s),
            int(self.horizon), float(snapshot.migration_s), floor, hi / lo,
        )
        planned = alloc.sum(axis=1) > 0
        alloc = repack_gangs(alloc, scale, main & (worker_rate > 0), worker_rate, order,
                             capacity)
        packed = alloc.sum(axis=1) > 0
        alloc = exchange_fast_gpus(alloc, current, snapshot.remaining, worker_rate,
                                   snapshot.sync.astype(np.bool_), order, capacity,
                                   float(snapshot.migration_s))
        alloc = upgrade_idle(alloc, current, worker_rate, snapshot.sync.astype(np.int64), order,
                             capacity, float(snapshot.round_s), float(snapshot.migration_s))
        return alloc, payoff, status, planned, packed

    def plan_view(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot the plan sees: with sharing, the GPUs of a pair that ran are held by
        its host alone (the guest of the last decision, ``HadarState.guests``, or the pair's
        later job where the state does not say, is planned as a waiting job; the sharing
        step may pair it again, with its host first).  Why: the plan counts a GPU once; seen
        held by both, it moved hosts and guests around and formed new pairs every round, each
        costing a move.  Without sharing, the snapshot."""
        if not self.share or snapshot.colocated is None:
            return snapshot
        prev = snapshot.policy_state
        return without_guests(snapshot, prev.guests if isinstance(prev, HadarState) else ())

    def split_of(self, snapshot: Snapshot, held: IntArray,
                 ) -> tuple[float, FloatArray, FloatArray, FloatArray]:
        """Steps 1-2 of the module docstring on ``snapshot``: the drain bound, the drain
        prices, each job's GPU-seconds of remaining work per type (``inf`` where it cannot
        run) and the type split.  ``held``: ``snapshot.held()``, which the caller has."""
        scale = snapshot.scale.astype(np.int64)
        rate = snapshot.rate
        runs = rate > 0
        capacity = snapshot.capacity()
        drain, pi = drain_estimate(snapshot.remaining, scale, rate, capacity)
        need = np.where(runs, scale[:, None] * snapshot.remaining[:, None]
                        / np.where(runs, rate, 1.0), np.inf)
        phi = self.type_split(
            self.split_need(need, held, scale, float(snapshot.migration_s)),
            capacity, pi, scale, drain, float(snapshot.round_s))
        return drain, pi, need, phi

    @staticmethod
    def split_need(need: FloatArray, current: IntArray, scale: IntArray,
                   migration_s: float) -> FloatArray:
        """``need`` (GPU-seconds of each job's remaining work per type) as the type split
        weighs it: a running job's work on a type where it holds no GPU also costs the move,
        ``scale * migration_s`` GPU-seconds."""
        if migration_s <= 0.0:
            return need
        running = current.sum(axis=1) > 0
        away = running[:, None] & (current == 0)
        return np.where(away & np.isfinite(need), need + scale[:, None] * migration_s, need)

    def type_split(self, need: FloatArray, capacity: IntArray, pi: FloatArray,
                   scale: IntArray, drain: float, round_s: float) -> FloatArray:
        """The share of each job's work on each GPU type (step 2 of the module docstring).

        First the *fastest* split: every job on its fastest type, work moved off a type only
        as far as it must for the type to drain by ``drain`` less a margin of
        ``margin_rounds`` rounds (what a schedule in rounds needs).  If that drains every type
        by then, capacity does not bind: the drain prices carry no information (an LP's dual
        prices are zero on slack constraints), and each job keeps its fastest type.  Otherwise
        the workload is capacity-bound: the *price* split, every job on its cheapest type at
        the drain prices (its comparative advantage), levelled fully.
        """
        need0 = np.where(np.isfinite(need), need, 0.0)
        level_to = drain - self.margin_rounds * round_s
        if level_to > 0.0:
            phi = balance_split(need, capacity, np.ones_like(pi), scale, float(drain),
                                self.max_moves, float(level_to))
            load = (phi * need0).sum(axis=0)
            if float((load / np.maximum(capacity, 1)).max()) <= level_to * (1.0 + 1e-9):
                return phi
        limit = drain
        for _ in range(3):
            phi = balance_split(need, capacity, pi, scale, float(limit), self.max_moves)
            load = (phi * need0).sum(axis=0)
            achieved = float((load / np.maximum(capacity, 1)).max())
            # A split that cannot drain by the limit anyway relaxes the job-length limit to
            # what it achieves, so that no job is kept off an idle type for nothing.
            if achieved <= limit * 1.0001:
                break
            limit = achieved
        return phi

    @staticmethod
    def reasons(status: IntArray, payoff: FloatArray, remaining: FloatArray,
                split_rate: FloatArray, planned: BoolArray, packed: BoolArray,
                placed: BoolArray) -> npt.NDArray[np.int8]:
        """Per job, the code of the component that refused it (``PLACED`` where none did).

        ``status``/``payoff`` are the core planner's (see :func:`hadar_slurm.core.plan`):
        the dual either admitted a job for a later epoch (1: ``DEFERRED``, as back-fill found
        nothing idle for it now) or priced it out (2 with a finite payoff: ``PRICED_OUT``); a
        job with work left and main types that it never priced (2 with no payoff) found no free
        GPU of those types in any epoch of the horizon (``NO_CAPACITY``).  Then ``planned`` (GPUs in
        the plan) minus ``packed`` (GPUs after gang repacking) were displaced by a gang
        (``NOT_PACKED``), and ``packed`` jobs that are not ``placed`` were refused by the
        matcher (``NO_FREE_GPU``).
        """
        reason = np.full(status.shape[0], Reason.PRICED_OUT, dtype=np.int8)
        never_priced = (status == 2) & np.isnan(payoff) & (remaining > 0)
        reason[never_priced & (split_rate > 0).any(axis=1)] = Reason.NO_CAPACITY
        reason[status == 1] = Reason.DEFERRED
        reason[status == 3] = Reason.NO_THROUGHPUT
        reason[planned & ~packed] = Reason.NOT_PACKED
        reason[packed & ~placed] = Reason.NO_FREE_GPU
        reason[placed] = Reason.PLACED
        return reason

    def critical_jobs(self, snapshot: Snapshot, rem_own: FloatArray, own: IntArray,
                      window: float, capacity: IntArray, held: IntArray,
                      prev_chain: tuple[int, ...] = (),
                      ) -> tuple[BoolArray, BoolArray, tuple[int, ...]]:
        """Jobs that cannot wait this round without the target becoming unreachable.

        Per type, its jobs split into *gangs* (multi-GPU jobs wider than half the type, which
        can never run side by side, nor beside much else) and the rest.  The gangs form a chain
        that occupies the whole type for the sum of their times, so the other jobs only have
        the window minus that chain.  Over those jobs, longest first, McNaughton's conditions
        for preemptive parallel machines are checked for after this round: the ``k`` longest
        (while they fit on the type together) must fit in their GPUs over that reduced window;
        the longest prefix that does not is critical.  When the chain no longer fits in
        ``chain_factor`` of the window, one of its gangs is critical: any gang of the chain
        shortens it as much, so the one the chain made critical last epoch (``prev_chain``,
        ids) goes on while it runs on the type (``held``: GPUs per job and type) and the
        longest, started at the round after it ends, still ends by the target (handing the type
        to the next longest every round restarted both gangs each time); else the shortest, if
        the longest still fits after it with the margins (Smith's rule: the shortest first
        lowers the average JCT); else the longest.

        Where the chain *binds* (more jobs fail the test over the reduced window than over the
        whole one), the reserved chain time is only real if the chain runs: its shortest gang
        runs now when its GPU-seconds (``scale * rem``) are fewer than the reduced window it
        would otherwise wait (Smith's rule: a gang that runs now delays at most its ``scale``
        jobs by its time, one that waits is delayed by the window); then only the jobs critical
        over the whole window stay critical.  Running a chain gang now leaves the others' reduced
        window as it was (the window and the chain shrink together), so the makespan test still
        holds.  Returns ``(critical, chain_now, ids of the gangs the chain made critical)``.
        """
        after = window - float(snapshot.round_s) * self.margin_rounds
        scale = snapshot.scale.astype(np.float64)
        was_chain = np.isin(snapshot.job_ids, np.array(prev_chain, dtype=np.int64))
        chain_ids: list[int] = []
        critical = np.zeros(snapshot.num_jobs, dtype=np.bool_)
        chain_now = np.zeros(snapshot.num_jobs, dtype=np.bool_)
        for h in range(capacity.shape[0]):
            members = np.nonzero(own == h)[0]
            if members.shape[0] == 0:
                continue
            # (equal lengths but for rounding tie, in index order: see ``coarse``)
            by_len = members[np.argsort(-coarse(rem_own[members]), kind="stable")]
            is_gang = (scale[by_len] * 2 > capacity[h]) & (scale[by_len] > 1)
            gangs = by_len[is_gang]
            others = by_len[~is_gang]
            chain = float(rem_own[gangs].sum())
            if others.shape[0]:
                gpus = np.cumsum(scale[others])
                work = np.cumsum(scale[others] * rem_own[others])
                over = (work > gpus * (after - chain)) & (gpus < capacity[h])
                alone = (work > gpus * after) & (gpus < capacity[h])
                n_over = int(np.nonzero(over)[0][-1]) + 1 if over.any() else 0
                n_alone = int(np.nonzero(alone)[0][-1]) + 1 if alone.any() else 0
                short = int(gangs[-1]) if gangs.shape[0] else -1
                if (short >= 0 and n_over > n_alone
                        and scale[short] * rem_own[short] < after - chain):
                    chain_now[short] = True
                    critical[others[:n_alone]] = True
                else:
                    critical[others[:n_over]] = True
            if gangs.shape[0] and chain > after * self.chain_factor:
                room = after * self.chain_factor
                going = gangs[was_chain[gangs] & (held[gangs, h] > 0)]
                # (a running gang's end is known: the longest starts at the round after it)
                ends = (np.ceil(rem_own[going[0]] / max(float(snapshot.round_s), 1e-9))
                        * float(snapshot.round_s) if going.shape[0] else np.inf)
                if ends + rem_own[gangs[0]] <= window:
                    pick = int(going[0])  # it goes on: the longest still ends by the target
                elif rem_own[gangs[-1]] + rem_own[gangs[0]] <= room:
                    pick = int(gangs[-1])  # the shortest, ending before the longest must start
                else:
                    pick = int(gangs[0])
                critical[pick] = True
                chain_ids.append(int(snapshot.job_ids[pick]))
        return critical, chain_now, tuple(sorted(chain_ids))


__all__ = ["KEPT_DETAIL", "HadarPolicy", "HadarState", "any_copy", "blocked_types",
           "carried_window", "drain_at", "drain_estimate", "job_speed", "moves_pay",
           "near_ties", "pooled_time", "repack_gangs", "restarted", "round_progress",
           "trial_types", "upgrade_idle", "utility_bounds", "without_guests"]
