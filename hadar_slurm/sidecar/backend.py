"""The Slurm backend of the epoch loop: observe, reconcile, apply.

:class:`SlurmBackend` implements :class:`hadar_slurm.loop.ClusterBackend`, the same interface as
the simulator, over a :class:`~hadar_slurm.slurm.api.SlurmApi`, in three steps that live in
their own modules:

* :meth:`~SlurmBackend.snapshot` (:mod:`hadar_slurm.sidecar.observe`): one read of all jobs and
  one of all nodes, and the policy's snapshot of them;
* :meth:`~SlurmBackend.reconcile` (:mod:`hadar_slurm.sidecar.reconcile`): a pure function from
  what was read and the policy's decision to the list of changes (place, hold, release,
  requeue, fork, end a fork ...), keyed by epoch and job;
* :meth:`~SlurmBackend.apply` (:mod:`hadar_slurm.sidecar.apply`): carries the list out on Slurm
  and returns a report; applying the same list twice changes nothing.

Jobs the sidecar cannot steer (bad hints, or no GPU type of the cluster can run them) are never
left held: they are released to Slurm's own scheduler with the reason in their admin comment.
A dry run and the restart tests' crash drill are wrappers of the API
(:class:`~hadar_slurm.slurm.api.DryRunApi`, :class:`~hadar_slurm.slurm.api.CrashDrillApi`);
nothing here knows of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hadar_slurm.hints import ModelCatalog
from hadar_slurm.loop import ApplyReport, Change
from hadar_slurm.policy.base import Decision, Reason, Snapshot
from hadar_slurm.rates.learn import Knowledge
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sidecar.apply import SlurmApplier
from hadar_slurm.sidecar.observe import SlurmObserver
from hadar_slurm.sidecar.reconcile import reconcile
from hadar_slurm.sidecar.studies import StudyBook
from hadar_slurm.slurm.api import SlurmApi


class SlurmBackend(SlurmObserver):
    """:class:`~hadar_slurm.loop.ClusterBackend` over a real Slurm cluster: the observer of
    :mod:`~hadar_slurm.sidecar.observe` (whose attributes say what the last read found), with
    reconcile and an applier."""

    def __init__(
        self, api: SlurmApi, table: ThroughputTable, *, catalog: ModelCatalog | None = None,
        partition: str | None = None, preempt_grace_s: float = 30.0,
        preempt_signal: str = "USR1", sleep: Callable[[float], object] = time.sleep,
        should_stop: Callable[[], bool] = lambda: False, tracker_root: str | None = None,
        knowledge: Knowledge | None = None, migration_s: float = 0.0, restart_s: float = 0.0,
        share: bool = False, studies: StudyBook | None = None, refill_on_finish: bool = False,
    ) -> None:
        """``sleep`` waits out grace periods (the controller passes one that does not wait in
        a dry run, where nothing was signalled); ``should_stop``: whether the loop ends after
        this epoch.  The rest: :class:`~hadar_slurm.sidecar.observe.SlurmObserver`."""
        super().__init__(api, table, catalog=catalog, partition=partition,
                         tracker_root=tracker_root, knowledge=knowledge,
                         migration_s=migration_s, restart_s=restart_s, share=share,
                         studies=studies, refill_on_finish=refill_on_finish)
        self._should_stop = should_stop
        self.free_gpus = 0
        self.applier = SlurmApplier(api, self, preempt_grace_s=preempt_grace_s,
                                    preempt_signal=preempt_signal, sleep=sleep,
                                    tracker_root=tracker_root)

    @property
    def watch(self) -> set[int]:
        """Jobs whose end frees GPUs (:meth:`ended_since_epoch`)."""
        return self.applier.watch

    @property
    def report(self) -> ApplyReport:
        """What the last :meth:`apply` did."""
        return self.applier.report

    def reconcile(self, snapshot: Snapshot, decision: Decision) -> list[Change]:
        """The changes that make Slurm run ``decision`` (pure, over the last read)."""
        #: GPUs the decision leaves free: a job that arrives is worth an early epoch then
        #: (:meth:`since_epoch`).
        self.free_gpus = max(0, int(snapshot.node_gpus.sum())
                             - int(decision.placement.count.sum()))
        reasons = {int(j): Reason(int(r)).name
                   for j, r in zip(snapshot.job_ids, decision.reason, strict=True)
                   if r != Reason.PLACED}
        return reconcile(self.observed(), decision, reasons)

    def apply(self, changes: Sequence[Change], now: float) -> ApplyReport:
        return self.applier.apply(changes, now)

    def next_epoch_start(self, now: float, round_s: float) -> float | None:
        return None if self._should_stop() else now + round_s

    def reported_since_epoch(self) -> list[int]:
        """Trials of a study that have reported the rung they trained for since the last
        epoch (one ``stat`` each, no Slurm command): each waits for its verdict, which is
        worth an epoch before the round is over (``[scheduler] reschedule_on_finish``).
        Every trial the last read saw is looked at, not only those it saw running: one the
        last epoch placed (or forked: its copies are a job of their own, the trial stays
        held) starts after the read and may report before the next one."""
        return self.studies.reported_since(self.views)

    def ended_since_epoch(self) -> list[int]:
        """The jobs of :attr:`watch` that have ended (one light ``squeue`` of the live jobs'
        ids; none when nothing is watched): their GPUs are free now, which is worth an epoch
        before the round is over (``[scheduler] reschedule_on_finish``).  A placed job that
        has not started yet is live, so it is no reason."""
        return self.since_epoch()[0]

    def since_epoch(self) -> tuple[list[int], list[int]]:
        """``(ended, arrived)`` since the last epoch, from one light ``squeue`` (none when
        there is nothing to look for): the jobs of :attr:`watch` that have ended (their GPUs
        are free now), and, when the last epoch left GPUs free, jobs that were not in its read
        and are not the sidecar's own fork copies (a job submitted since, which may run on
        them).  Either is worth an epoch before the round is over (``[scheduler]
        reschedule_on_finish``).  A placed job that has not started yet is live, so it is no
        reason."""
        if not self.watch and self.free_gpus <= 0:
            return [], []
        live = self.api.live_job_ids()
        ended = sorted(self.watch - live)
        arrived: list[int] = []
        if self.free_gpus > 0:
            known = {j.job_id for j in self.jobs} | self.copy_ids
            arrived = sorted(live - known)
        return ended, arrived
