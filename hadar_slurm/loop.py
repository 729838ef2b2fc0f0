"""The epoch loop: snapshot -> policy -> diff -> apply, the same for Slurm and the simulator.

The mechanism owns the loop, the timing and the diff; a :class:`ClusterBackend` owns the world
(real Slurm, or the trace-driven simulator) and a :class:`Clock` owns time (the sidecar's wall
clock, or simulated time that jumps).  There is no "simulate" flag anywhere in here.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hadar_slurm.policy.base import Decision, Policy, Snapshot


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


class ActionKind(enum.Enum):
    PLACE = "place"  # not running -> runs on the given GPUs
    KEEP = "keep"  # runs where it ran
    MOVE = "move"  # runs elsewhere: preempt (requeue), then place
    PREEMPT = "preempt"  # ran, must stop (requeue with a grace period)


@dataclass(frozen=True)
class Action:
    """One step of the diff.  Keyed by ``(epoch, job_id)``: applying it twice is harmless."""

    epoch: int
    kind: ActionKind
    job_id: int
    rows: tuple[tuple[int, int], ...]  # (node index, GPU count) it should hold


def diff(snapshot: Snapshot, decision: Decision) -> list[Action]:
    """Actions that take the cluster from ``snapshot.current`` to ``decision.placement``."""
    before = snapshot.current.by_job_sorted()
    after = decision.placement.by_job_sorted()
    copies_before = snapshot.current.num_copies()
    copies_after = decision.placement.num_copies()
    actions: list[Action] = []
    for job_id, rows in after.items():
        old = before.get(job_id)
        same = old == rows and copies_before.get(job_id) == copies_after.get(job_id)
        kind = ActionKind.PLACE if old is None else (
            ActionKind.KEEP if same else ActionKind.MOVE)
        actions.append(Action(decision.epoch, kind, job_id, tuple(rows)))
    for job_id in before.keys() - after.keys():
        actions.append(Action(decision.epoch, ActionKind.PREEMPT, job_id, ()))
    return actions


class ClusterBackend(Protocol):
    """The world the loop steers.

    Contract: :meth:`snapshot` is one batched read of jobs and nodes, as of ``now``;
    :meth:`apply` makes the cluster run ``decision`` and is idempotent (the same actions again
    change nothing); :meth:`next_epoch_start` says when the next epoch begins, or ``None`` when
    there is nothing left to schedule, ever.
    """

    def snapshot(
        self, epoch: int, now: float, round_s: float, policy_state: object
    ) -> Snapshot: ...

    def apply(self, decision: Decision, actions: list[Action], now: float) -> None: ...

    def next_epoch_start(self, now: float, round_s: float) -> float | None: ...


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    start: float
    num_jobs: int
    num_placed: int
    decision_s: float
    actions: int


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

    def run_epoch(self) -> bool:
        """One epoch; False when the backend says nothing is left."""
        now = self.clock.now()
        snapshot = self.backend.snapshot(self.epoch, now, self.round_s, self.policy_state)
        t0 = time.perf_counter()
        decision = self.policy.allocate(snapshot)
        decision_s = time.perf_counter() - t0
        self.policy_state = decision.policy_state
        actions = diff(snapshot, decision)
        self.last_snapshot, self.last_decision = snapshot, decision
        self.backend.apply(decision, actions, now)
        record = EpochRecord(
            self.epoch, now, snapshot.num_jobs,
            int(np.unique(decision.placement.job).shape[0]), decision_s,
            sum(1 for a in actions if a.kind.value != "keep"),
        )
        self.records.append(record)
        if self.on_epoch is not None:
            self.on_epoch(record)
        self.epoch += 1
        nxt = self.backend.next_epoch_start(now, self.round_s)
        if nxt is None:
            return False
        self.clock.sleep_until(nxt)
        return True

    def run(self, max_epochs: int | None = None) -> list[EpochRecord]:
        while max_epochs is None or self.epoch < max_epochs:
            if not self.run_epoch():
                break
        return self.records
