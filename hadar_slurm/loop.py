"""The epoch loop: snapshot -> policy -> reconcile -> apply, the same for Slurm and the simulator.

The mechanism owns the loop, the timing and the diff; a :class:`ClusterBackend` owns the world
(real Slurm, or the trace-driven simulator) and a :class:`Clock` owns time (the sidecar's wall
clock, or simulated time that jumps).  There is no "simulate" flag anywhere in here.

An epoch that comes less than a round after the last full one (a job ended or arrived and the
backend brought the epoch forward: ``reschedule_on_finish``) only fills the GPUs no job holds
(:func:`fill_snapshot`): the jobs that run keep their GPUs, and the policy places the others on
what is free (a policy that also spreads running jobs over what is left, HadarE a study's
trials, says so by a ``fill_running`` method: :class:`~hadar_slurm.policy.base.FillsRunning`).
Full epochs keep their cadence: the next is due a round after the last full one (the backend
is asked for the next epoch within that).  Moving a running job costs it a
restart, so the loop re-plans everything once a round, not at every finish and arrival, which
would move the same jobs back and forth.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from hadar_slurm.policy.base import (
    Decision,
    FillsRunning,
    Placement,
    Policy,
    Reason,
    Snapshot,
    gpus_in_use,
    joined,
)


class Clock(Protocol):
    """Where the loop's time comes from: :class:`SimClock` in the simulator, the sidecar's
    wall clock (``sidecar.controller.StopClock``) on Slurm."""

    def now(self) -> float: ...

    def sleep_until(self, t: float) -> None: ...


class SimClock:
    """Simulated time: ``sleep_until`` jumps."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def sleep_until(self, t: float) -> None:
        self._now = max(self._now, t)


class ChangeKind(enum.Enum):
    """What a :class:`Change` does to one job.  The simulator's :func:`diff` uses the first five;
    the Slurm sidecar's reconcile (:mod:`hadar_slurm.sidecar.reconcile`) all of them."""

    PLACE = "place"  # not running -> runs on ``copies[0]`` (one trainer)
    FORK = "fork"  # not running -> runs as the copies ``copies`` (HadarE)
    KEEP = "keep"  # already where the decision wants it (only what a crash left undone is redone)
    MOVE = "move"  # runs, but elsewhere (or in other copies): stop it, then run it on ``copies``
    STOP = "stop"  # runs, and the decision stops it (requeued with a grace period)
    END_FORK = "end_fork"  # a fork's copies (the hetjob ``group``) end: signal, grace, cancel
    WAIT = "wait"  # pending without GPUs this epoch: kept from starting
    UNSTEER = "unsteer"  # given to Slurm's own scheduler (``why`` says why)
    REQUEUE = "requeue"  # a job a move left ended: requeued held
    CANCEL = "cancel"  # a study's trial its halving rule stopped: cancelled (issue #17)


Rows = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Change:
    """One step that takes the world from what it runs to what a decision wants, as data.

    Keyed by :attr:`key` (epoch, job, kind, fork): an applier that is given a change it has
    already applied skips it, so applying a list twice is harmless.  ``copies`` are the
    ``(node index, GPU count)`` rows of each copy the job should run as (one entry for an
    unforked job; empty when it should not run); ``why`` explains a change that is not what the
    decision literally said (a fallback), or a stop; ``group`` names the fork (hetjob leader)
    an ``END_FORK`` ends, or the one a ``FORK`` replaces (0: none)."""

    epoch: int
    kind: ChangeKind
    job_id: int
    copies: tuple[Rows, ...] = ()
    why: str = ""
    group: int = 0
    #: PLACE of a job whose decision forked it, but which cannot be forked: placed on copy 0's
    #: GPUs instead, and recorded so that it is not forked again.
    nofork: bool = False
    #: PLACE of one job of a pair (GPU sharing, issue #16): the job it shares its GPU with,
    #: placed beside it in the same epoch or running there alone (0: it holds its GPUs alone).
    mate: int = 0

    @property
    def key(self) -> tuple[int, int, str, int]:
        return (self.epoch, self.job_id, self.kind.value, self.group)

    @property
    def rows(self) -> Rows:
        """Every ``(node, GPUs)`` row of every copy, sorted."""
        return tuple(sorted(row for cp in self.copies for row in cp))


@dataclass
class ApplyReport:
    """What applying a list of changes did: ``applied`` (one entry per change made to the
    world, as logged), ``detail`` (per job, why it does not run as the decision said, e.g. a
    fork that failed), ``errors`` (``(stage, job, error)`` of changes that raised) and
    ``skipped`` (changes already applied, by key)."""

    applied: list[dict[str, object]] = field(default_factory=list)
    detail: dict[int, str] = field(default_factory=dict)
    errors: list[tuple[str, int, str]] = field(default_factory=list)
    skipped: int = 0


def diff(snapshot: Snapshot, decision: Decision) -> list[Change]:
    """The changes that take the cluster from ``snapshot.current`` to ``decision.placement``
    (the simulator's reconcile: its world has no holds, records or forks to repair)."""
    before = snapshot.current.by_job_copies()
    after = decision.placement.by_job_copies()
    changes: list[Change] = []
    for job_id, copies in after.items():
        cps = tuple(tuple(sorted(copies[k])) for k in sorted(copies))
        old = before.get(job_id)
        if old is None:
            kind = ChangeKind.FORK if len(cps) > 1 else ChangeKind.PLACE
        else:
            same = (sorted(r for cp in old.values() for r in cp)
                    == sorted(r for cp in copies.values() for r in cp)
                    and len(old) == len(copies))
            kind = ChangeKind.KEEP if same else ChangeKind.MOVE
        changes.append(Change(decision.epoch, kind, job_id, cps))
    for job_id in sorted(before.keys() - after.keys()):
        changes.append(Change(decision.epoch, ChangeKind.STOP, job_id, (), "the decision stops it"))
    return changes


def even(rows: Rows) -> bool:
    """Whether one Slurm job can run on ``rows``: the same GPU count on every node (a job asks
    for a GPU count per node).  The sidecar's reconcile and the simulator's ``even_gangs``
    judge placements by it."""
    return len({c for _, c in rows}) == 1


def placement_of(changes: list[Change]) -> Placement:
    """The placement a list of changes leaves running (every change but STOP and the Slurm-only
    kinds names the job's copies)."""
    job: list[int] = []
    node: list[int] = []
    count: list[int] = []
    copy: list[int] = []
    for ch in changes:
        for k, rows in enumerate(ch.copies):
            for n, c in rows:
                job.append(ch.job_id)
                node.append(n)
                count.append(c)
                copy.append(k)
    forked = any(k > 0 for k in copy)
    return Placement(np.array(job, dtype=np.int64), np.array(node, dtype=np.int64),
                     np.array(count, dtype=np.int64),
                     np.array(copy, dtype=np.int64) if forked else None)


class ClusterBackend(Protocol):
    """The world the loop steers.

    Contract: :meth:`snapshot` is one batched read of jobs and nodes, as of ``now``;
    :meth:`reconcile` is pure: the changes that make the world of the last snapshot run
    ``decision`` (:func:`diff` in the simulator); :meth:`apply` executes them and is idempotent
    (changes already applied are skipped by key); :meth:`next_epoch_start` says when the next
    epoch begins, or ``None`` when there is nothing left to schedule, ever.
    """

    def snapshot(
        self, epoch: int, now: float, round_s: float, policy_state: object
    ) -> Snapshot: ...

    def reconcile(self, snapshot: Snapshot, decision: Decision) -> list[Change]: ...

    def apply(self, changes: list[Change], now: float) -> ApplyReport: ...

    def next_epoch_start(self, now: float, round_s: float) -> float | None: ...


def movements(changes: Sequence[Change]) -> tuple[int, int]:
    """``(moves, preemptions)`` in one epoch's changes: a running job (or fork) that is stopped
    and started again elsewhere in the same epoch moves; one stopped and not started again is
    preempted.  The live sidecar and the simulator count them alike (``bench.fidelity``)."""
    started = {c.job_id for c in changes
               if c.kind in (ChangeKind.PLACE, ChangeKind.FORK, ChangeKind.MOVE)}
    stopped = {c.job_id for c in changes
               if c.kind in (ChangeKind.MOVE, ChangeKind.STOP, ChangeKind.END_FORK)}
    return len(stopped & started), len(stopped - started)


def fill_snapshot(snapshot: Snapshot) -> tuple[Snapshot, npt.NDArray[np.bool_]]:
    """The snapshot of an epoch that only fills free GPUs: the jobs that hold no GPUs, and the
    GPUs that no job holds (``current``); with the mask of the jobs that hold some.  A job's
    rate on a GPU type with fewer free GPUs than it needs is 0 there (it cannot run there this
    epoch, which is all a fill plans for).  GPUs that two jobs share (``Snapshot.packed``, both
    still running) are held once; the fill may pack new pairs on the free GPUs only."""
    idx = snapshot.current_index()
    rows = idx >= 0
    holds = np.zeros(snapshot.num_jobs, dtype=np.bool_)
    holds[idx[rows]] = True
    cur = snapshot.current.select(rows)
    used = gpus_in_use(cur, kept_pairs(snapshot), snapshot.node_gpus.shape[0])
    keep = ~holds
    free = np.maximum(snapshot.node_gpus - used, 0)
    free_of_type = np.bincount(snapshot.node_type, weights=free,
                               minlength=len(snapshot.gpu_types))
    fits = free_of_type[None, :] >= snapshot.scale[keep, None]
    sub = replace(snapshot.select_jobs(keep), node_gpus=free,
                  rate=np.where(fits, snapshot.rate[keep], 0.0), current=Placement.empty(),
                  packed=())
    return sub, holds


def kept_pairs(snapshot: Snapshot) -> tuple[tuple[int, int], ...]:
    """The pairs of ``Snapshot.packed`` whose two jobs both still hold GPUs (``current``): a
    fill keeps them packed; a job whose partner ended runs on alone."""
    running = set(snapshot.current.job[snapshot.current_index() >= 0].tolist())
    return tuple(p for p in snapshot.packed if p[0] in running and p[1] in running)


def keep_fixed(snapshot: Snapshot, decision: Decision) -> Decision:
    """``decision`` with every job of ``Snapshot.fixed`` where it runs (its ``current`` rows),
    whatever the policy planned for it.  A job the policy placed on a node that this leaves
    over-full, with more GPUs there than it holds now, gives way (most GPUs on such nodes
    first): it stays where it runs if it runs and those GPUs are still free, else it is not
    placed (``NO_FREE_GPU``, with the reason in ``detail``).  The policy saw the fixed jobs as
    running jobs, so it rarely plans anything else on their GPUs; this makes sure of it."""
    fixed = snapshot.fixed
    if fixed is None or not np.asarray(fixed, dtype=np.bool_).any():
        return decision
    fixed_ids = snapshot.job_ids[np.asarray(fixed, dtype=np.bool_)]
    cur = snapshot.current
    p = decision.placement
    forked = p.copy is not None or cur.copy is not None
    placement = joined(cur.select(np.isin(cur.job, fixed_ids)),
                       p.select(~np.isin(p.job, fixed_ids)))
    n_nodes = snapshot.node_gpus.shape[0]
    held: dict[tuple[int, int], int] = {}
    for j, n, c in zip(cur.job.tolist(), cur.node.tolist(), cur.count.tolist(), strict=True):
        held[(j, n)] = held.get((j, n), 0) + c
    fixed_set = set(fixed_ids.tolist())
    dropped: list[int] = []
    while True:
        over = snapshot.node_gpus - gpus_in_use(placement, decision.packed, n_nodes) < 0
        if not over.any():
            break
        newcomers: dict[int, int] = {}
        for j, n, c in zip(placement.job.tolist(), placement.node.tolist(),
                           placement.count.tolist(), strict=True):
            if over[n] and j not in fixed_set and c > held.get((j, n), 0):
                newcomers[j] = newcomers.get(j, 0) + c
        if not newcomers:
            break  # (over-full by the fixed jobs alone: nothing the policy placed to undo)
        victim = min(newcomers, key=lambda j: (-newcomers[j], j))
        placement = placement.select(placement.job != victim)
        dropped.append(victim)
    reason = decision.reason.copy()
    detail = dict(decision.detail)
    pos = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
    for j in dropped:
        mine = cur.select(cur.job == j)
        free = snapshot.node_gpus - gpus_in_use(placement, decision.packed, n_nodes)
        need = np.bincount(mine.node, weights=mine.count, minlength=n_nodes)
        if len(mine) and not forked and (need <= free).all():
            placement = joined(placement, mine)  # it stays where it runs
            detail[j] = ("stays where it runs: the GPUs planned for it are held by a job that "
                         "runs until it ends (preempt=never)")
            continue
        if j in pos:
            reason[pos[j]] = Reason.NO_FREE_GPU
        detail[j] = ("the GPUs planned for it are held by a job that runs until it ends "
                     "(preempt=never)")
    for j in fixed_ids.tolist():
        if j in pos and (cur.job == j).any():
            reason[pos[j]] = Reason.PLACED
    placed = set(placement.job.tolist())
    packed = tuple(pr for pr in decision.packed if pr[0] in placed and pr[1] in placed)
    return replace(decision, placement=placement, reason=reason, detail=detail, packed=packed)


def fill_decision(snapshot: Snapshot, holds: npt.NDArray[np.bool_], sub: Decision,
                  policy_state: object) -> Decision:
    """The whole epoch's decision from the fill-only one (``sub``, over the jobs that hold no
    GPUs): the jobs that hold GPUs keep them, with ``policy_state`` (the last full epoch's);
    pairs of them stay packed, beside the pairs ``sub`` packs on the free GPUs."""
    placement = joined(snapshot.current.select(snapshot.current_index() >= 0), sub.placement)
    reason = np.full(snapshot.num_jobs, Reason.PLACED, dtype=np.int8)
    reason[~holds] = sub.reason
    packed = tuple(sorted(kept_pairs(snapshot) + tuple(sub.packed)))
    return Decision(snapshot.epoch, placement, reason, policy_state, dict(sub.detail),
                    packed=packed)


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    start: float
    num_jobs: int
    num_placed: int
    decision_s: float
    changes: int  # changes other than KEEP
    moves: int = 0  # see movements()
    preemptions: int = 0
    full: bool = True  # re-planned every job (False: only filled the free GPUs)


class EpochLoop:
    """Runs epochs of ``policy`` against ``backend`` until the backend has nothing left."""

    def __init__(
        self,
        backend: ClusterBackend,
        policy: Policy,
        clock: Clock,
        round_s: float = 360.0,
        on_epoch: Callable[[EpochRecord], None] | None = None,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.clock = clock
        self.round_s = round_s
        self.on_epoch = on_epoch
        self.epoch = 0
        self.policy_state: object = None
        self.records: list[EpochRecord] = []
        self.last_snapshot: Snapshot | None = None  # of the last epoch, for reports
        self.last_decision: Decision | None = None
        self._last_full: float | None = None  # when the last epoch that re-planned all began

    def run_epoch(self, full: bool | None = None) -> bool:
        """One epoch; False when the backend says nothing is left.  ``full``: whether it
        re-plans every job (True) or only fills the free GPUs (False); by default, it re-plans
        when a round has passed since the last epoch that did (or when nothing runs)."""
        now = self.clock.now()
        snapshot = self.backend.snapshot(self.epoch, now, self.round_s, self.policy_state)
        t0 = time.perf_counter()
        if full is None:
            full = self._last_full is None or now >= self._last_full + self.round_s
        if not full:
            sub, holds = fill_snapshot(snapshot)
            full = not holds.any()  # (nothing runs: the fill is the whole epoch)
        if full:
            decision = keep_fixed(snapshot, self.policy.allocate(snapshot))
            self._last_full = now
        else:
            decision = fill_decision(snapshot, holds, self.policy.allocate(sub),
                                     self.policy_state)
            if isinstance(self.policy, FillsRunning):
                decision = self.policy.fill_running(snapshot, decision)
        decision_s = time.perf_counter() - t0
        self.policy_state = decision.policy_state
        changes = self.backend.reconcile(snapshot, decision)
        self.last_snapshot, self.last_decision = snapshot, decision
        self.backend.apply(changes, now)
        record = EpochRecord(
            self.epoch, now, snapshot.num_jobs,
            int(np.unique(decision.placement.job).shape[0]), decision_s,
            sum(1 for c in changes if c.kind is not ChangeKind.KEEP), *movements(changes),
            full=full,
        )
        self.records.append(record)
        if self.on_epoch is not None:
            self.on_epoch(record)
        self.epoch += 1
        # the next full epoch is due a round after the last one, whatever filled in between
        assert self._last_full is not None
        nxt = self.backend.next_epoch_start(now, self._last_full + self.round_s - now)
        if nxt is None:
            return False
        self.clock.sleep_until(nxt)
        return True

    def run(self, max_epochs: int | None = None) -> list[EpochRecord]:
        while max_epochs is None or self.epoch < max_epochs:
            if not self.run_epoch():
                break
        return self.records
