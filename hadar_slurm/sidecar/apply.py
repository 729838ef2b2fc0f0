"""Apply: carry out a list of :class:`~hadar_slurm.loop.Change` on Slurm, and say what was done.

:class:`SlurmApplier` is thin: every decision was made by
:func:`~hadar_slurm.sidecar.reconcile.reconcile`; what is left here is how each kind of change
is written to Slurm so that it survives a sidecar or slurmctld that dies half-way (the job's
record is written first, and every step checks what the record already says), and the grace
period that stops and ends of forks share.  Changes already applied (same key) are skipped.  A
Slurm error on one job is logged and leaves that job for the next epoch; an unexpected error
on one job is logged (``job_error``) and the others go on.  Everything done comes back in an
:class:`~hadar_slurm.loop.ApplyReport`; nothing is written into the decision.

A placement is one ``scontrol update`` (NodeList, Features and the job's :mod:`record
<hadar_slurm.sidecar.record>` in its AdminComment) and a release; a running job that must stop
gets its checkpoint signal, a grace period, then a requeue and a hold (:meth:`SlurmApi.requeue_hold
<hadar_slurm.slurm.api.SlurmApi.requeue_hold>`); it is placed again in
a later epoch.  HadarE (:mod:`hadar_slurm.sidecar.fork`): a fork writes the job's batch script,
hints and the copies' plan into its tracker directory as the job's owner and submits the
heterogeneous job as the owner, while the job itself stays held with ``Dependency=afterany:K``;
ending a fork signals its copies' steps and cancels them after the grace period.  Jobs the
sidecar will not steer are released to Slurm's own scheduler with the reason in their record.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from hadar_slurm.errors import InputError
from hadar_slurm.logs import log_event
from hadar_slurm.loop import ApplyReport, Change, ChangeKind, Rows
from hadar_slurm.rates.store import StoreDamagedError
from hadar_slurm.runtime import colocation
from hadar_slurm.runtime.colocation import Sharing
from hadar_slurm.sidecar import fork as hadare
from hadar_slurm.sidecar import shard
from hadar_slurm.sidecar.fork import CopyGroup, ForkError
from hadar_slurm.sidecar.observe import (
    GroupEnd,
    JobView,
    SlurmObserver,
    Unsteered,
    held_by_hadar,
    log_job_error,
    move_left_ended,
    rows_text,
)
from hadar_slurm.sidecar.record import JobRecord, decode
from hadar_slurm.sidecar.studies import Note
from hadar_slurm.slurm import SlurmError, SlurmJob, SlurmNode, SlurmTimeoutError
from hadar_slurm.slurm.api import SlurmApi
from hadar_slurm.slurm.hetjob import CopySpec, ForkPlan, render_hetjob
from hadar_slurm.slurm.parse import PENDING_STATES, RUNNING_STATES, expand_array_tasks
from hadar_slurm.slurm.version import SlurmVersion
from hadar_slurm.studies.protocol import STUDY_SUBDIR

logger = logging.getLogger("hadar_slurm.sidecar")
#: The most tasks of job arrays given a record of their own per epoch (an update each).
MAX_SPLITS = 256

#: The order in which kinds of change are applied: stops and ends of forks share one grace
#: period, begun first; the pending jobs' places are written while it runs (a job placed on
#: GPUs still being freed waits in Slurm and starts when they are free), and the moved jobs'
#: as each leaves; new forks and holds come after it.
PHASES = (ChangeKind.REQUEUE, ChangeKind.UNSTEER, ChangeKind.CANCEL, ChangeKind.KEEP,
          ChangeKind.STOP,
          ChangeKind.MOVE, ChangeKind.END_FORK, ChangeKind.PLACE, ChangeKind.FORK,
          ChangeKind.WAIT)


@dataclass
class _Grace:
    """A grace period begun (:meth:`SlurmApplier._preempt`), to finish
    (:meth:`SlurmApplier._grace`): the stopped jobs (``views``), the forks ended, the jobs
    signalled, the MOVE changes by job, the epoch, and the seconds it lasts at most."""

    views: list[JobView]
    ends: list[GroupEnd]
    signaled: list[JobView]
    moves: dict[int, Change]
    epoch: int
    wait: float


def start_time(left: float | None, now: float) -> str:
    """``StartTime=`` for a job placed to start at once whose last run ended at or before
    ``left`` (None: long ago): ``now``, or ``now+N`` seconds so that it starts two whole
    seconds after ``left`` at the earliest (the end of a run revokes its credential on its
    nodes within about a second, and a credential made in a second that is not later than the
    revocation's is refused)."""
    if left is None:
        return "now"
    wait = math.floor(left) + 2 - now
    return f"now+{math.ceil(wait)}" if wait > 0 else "now"


class SlurmApplier:
    """Applies the changes of an epoch to Slurm over ``api``, reading the jobs they concern
    from ``seen`` (the observer of the same epoch)."""

    def __init__(self, api: SlurmApi, seen: SlurmObserver, *, preempt_grace_s: float = 30.0,
                 preempt_signal: str = "USR1",
                 sleep: Callable[[float], object] = time.sleep,
                 tracker_root: str | None = None, move_poll_s: float = 0.5,
                 move_polls: int = 60, grace_poll_s: float = 0.25) -> None:
        self.api = api
        #: How often the jobs are read during a grace period, to end it once they have left.
        self.grace_poll_s = grace_poll_s
        #: How a moved job is waited for, once stopped, before it is placed on its new GPUs.
        self.move_poll_s = move_poll_s
        self.move_polls = move_polls
        self.seen = seen
        self.preempt_grace_s = preempt_grace_s
        self.preempt_signal = preempt_signal
        self._sleep = sleep
        self.tracker_root = tracker_root
        self.report = ApplyReport()
        #: Jobs whose end frees GPUs (see ``SlurmBackend.ended_since_epoch``): those on GPU
        #: nodes that ran at the last epoch and were not stopped by it, and those it placed or
        #: forked.
        self.watch: set[int] = set()
        self._done: set[tuple[int, int, str, int]] = set()  # keys applied (this epoch)
        #: GPU sharing: nodes where a pair was placed this epoch, and what each job was last
        #: told of its mate (:meth:`_tell_mates`; 0: alone).
        self._shard_nodes: set[str] = set()
        self._cpu_demand: dict[str, int] = {}  # per node: CPUs the epoch's placements ask
        self._told: dict[int, int] = {}
        #: When a moved job was seen back in the queue (its last run ended before), by job.
        self._left: dict[int, float] = {}
        self._done_epoch = -1

    def apply(self, changes: Sequence[Change], now: float) -> ApplyReport:
        """Apply ``changes`` (those not applied before) in :data:`PHASES` order."""
        seen = self.seen
        before = self.api.commands
        t0 = time.perf_counter()
        report = self.report = ApplyReport()
        self._left = {j: t for j, t in self._left.items() if t > time.time() - 60.0}
        todo: list[Change] = []
        for c in changes:
            if c.epoch != self._done_epoch:
                self._done, self._done_epoch = set(), c.epoch
            if c.key in self._done:
                report.skipped += 1
                continue
            self._done.add(c.key)
            todo.append(c)
        todo.sort(key=lambda c: PHASES.index(c.kind))
        views = seen.views
        unsteered = {u.job.job_id: u for u in seen.unsteered}
        left = {j.job_id: j for j in seen.moves_left}
        orphans = {e.group.leader: e for e in seen.orphans}
        ends: list[GroupEnd] = []
        for c in todo:
            if c.kind is ChangeKind.END_FORK:
                view = views.get(c.job_id)
                if view is not None and view.group is not None and view.group.leader == c.group:
                    ends.append(GroupEnd(view.group, view, c.why))
                elif c.group in orphans:
                    ends.append(orphans[c.group])
        stop_changes = {c.job_id: c for c in todo
                        if c.kind in (ChangeKind.STOP, ChangeKind.MOVE)}
        stops = [views[j] for j in stop_changes if j in views]
        stopping = {v.job_id for v in stops} | {
            comp.job_id for e in ends for comp in e.group.components}
        gpu_nodes = {n.name for n in seen.nodes if n.gpus > 0}
        self.watch = {j.job_id for j in seen.jobs if j.state in RUNNING_STATES
                      and gpu_nodes.intersection(j.node_names) and j.job_id not in stopping}
        epoch = seen.epoch if not todo else todo[0].epoch
        # studies: what the trials are told (verdicts first: a trial told to stop leaves its
        # GPUs by itself, one told to go on trains on where it is)
        self._guard("study", 0, self._tell_trials, epoch)
        # GPU sharing: the jobs of pairs already placed (a pair is placed at its first job)
        paired: set[int] = set()
        self._shard_nodes = set()
        self._cpu_demand = self._cpus_placed(todo)
        stopped = False
        grace: _Grace | None = None
        for c in todo:
            job_id = c.job_id
            view = views.get(job_id)
            if c.why and c.kind in (ChangeKind.WAIT, ChangeKind.PLACE, ChangeKind.KEEP):
                report.detail[job_id] = c.why
            if grace is not None and c.kind in (ChangeKind.FORK, ChangeKind.WAIT):
                self._grace(grace)  # (pending jobs are placed before it; forks after)
                grace = None
            if c.kind in (ChangeKind.STOP, ChangeKind.MOVE, ChangeKind.END_FORK):
                if not stopped and (stops or ends):
                    stopped = True
                    grace = self._preempt(stops, ends, epoch, now, stop_changes)
            elif c.kind is ChangeKind.REQUEUE and job_id in left:
                self._guard("requeue", job_id, self._requeue_left, left[job_id], c.epoch)
            elif c.kind is ChangeKind.CANCEL and view is not None:
                self._guard("cancel", job_id, self._cancel_trial, view, c)
            elif c.kind is ChangeKind.UNSTEER and job_id in unsteered:
                self._guard("unsteer", job_id, self._release_unsteered, unsteered[job_id],
                            c.epoch)
            elif view is None or c.kind in (ChangeKind.REQUEUE, ChangeKind.UNSTEER):
                # (a change about a job the last read did not find: nothing to apply it to)
                log_event(logger, "change_skipped", logging.WARNING, epoch=c.epoch,
                          job=job_id, change=c.kind.value, why="not in the last read")
            elif c.kind is ChangeKind.KEEP:
                if view.group is not None:
                    self._guard("keep_fork", job_id, self._keep_fork, view, c.epoch)
                elif not view.running:  # placed, not started: what a crash left undone
                    self.watch.add(job_id)
                    self._guard("place", job_id, self._place, view, c.copies[0], c.epoch,
                                "", c.mate)
            elif c.kind is ChangeKind.PLACE and c.mate:
                self.watch.add(job_id)
                if job_id not in paired:
                    self._guard("place", job_id, self._place_shared, view, c, paired)
            elif c.kind is ChangeKind.PLACE:
                self.watch.add(job_id)
                if c.nofork:
                    self._guard("fork", job_id, self._fork_failed, view, c.copies[0], c.epoch,
                                c.why)
                else:
                    self._guard("place", job_id, self._place, view, c.copies[0], c.epoch)
            elif c.kind is ChangeKind.FORK:
                # the fork it replaces, if any, ends this epoch: the new copies wait for it
                after = view.group if c.group and view.group is not None and (
                    view.group.leader == c.group) else None
                self._guard("fork", job_id, self._fork, view, c.copies, c.epoch, after)
            elif c.kind is ChangeKind.WAIT:
                self._guard("wait", job_id, self._keep_waiting, view, c.epoch)
        if grace is not None:
            self._grace(grace)
        self._guard("sharing", 0, self._tell_mates)
        for job in seen.arrays:
            self._guard("split", job.job_id, self._split_array, job, epoch)
        seen.studies.save()
        seen.stats.apply_s = time.perf_counter() - t0
        seen.stats.commands_apply = self.api.commands - before
        return report

    def _guard(self, stage: str, job_id: int, call: Callable[..., object],
               *args: object) -> None:
        """``call(*args)``; an exception is logged with the job (:meth:`_job_error`), not
        raised."""
        try:
            call(*args)
        except StoreDamagedError:
            raise  # the store's, not the job's: the controller plans without the store
        except Exception as exc:  # one job must not stop the epoch
            self._job_error(stage, job_id, exc)

    def _job_error(self, stage: str, job_id: int, exc: BaseException) -> None:
        """An unexpected error while applying one job: logged, in the report and with the
        observer's errors of the epoch."""
        entry = log_job_error(self.seen.epoch, stage, job_id, exc)
        self.seen.job_errors.append(entry)
        self.report.errors.append(entry)

    def _write(self, what: str, view_id: int, call: Callable[..., None], *args: object,
               **fields: object) -> bool:
        """``call(view_id, *args)``; a Slurm error is logged (the job is left for the next
        epoch to reconcile) and gives False."""
        try:
            call(view_id, *args)
        except SlurmError as exc:
            log_event(logger, "action_failed", level=logging.WARNING, epoch=self.seen.epoch,
                      job=view_id, action=what, error=str(exc))
            return False
        self._did(what, view_id, **fields)
        return True

    def _did(self, what: str, view_id: int, **fields: object) -> None:
        """Log a change made to Slurm, and put it in the report."""
        entry: dict[str, object] = {"epoch": self.seen.epoch, "job": view_id, "action": what,
                                    **fields}
        self.seen.stats.applied.append(entry)
        self.report.applied.append(entry)
        log_event(logger, "action", logging.INFO, **entry)

    def _place(self, view: JobView, rows: Rows, epoch: int, why: str = "", mate: int = 0,
               release: bool = True) -> bool:
        """Place a pending job on ``rows`` (equal GPU counts per node: reconcile checked), or
        only release it when its record says it is placed there already.  ``mate``: the job
        it shares its one GPU with (it then asks for one shard of it, not a GPU).  With
        ``release=False`` it is left held (the caller releases it).  False when Slurm did not
        take the placement."""
        place = rows_text(self.seen.node_names, rows)
        counts = {c for _, c in place}
        job_id = view.job_id
        rec = view.record
        types = sorted({self.seen.node_type_names[k] for k, _ in rows})
        already = rec.state == "placed" and rec.place == place and rec.mate == mate and not why
        if not already:
            if not self._take_hold(view):
                return False
            per_node = counts.pop()
            fields: dict[str, str] = {}
            if mate:
                # one shard of one GPU (24.11+; the observer offers sharing only there)
                fields["NumNodes"] = "1"
                fields["TresPerNode"] = f"{shard.gres_prefix(self._version())}shard:1"
            elif (len(place) > 1 or len(rec.place) > 1 or view.repair
                    or view.job.gpus_per_node != per_node):
                # (22.05 ignores an update of Gres=; TresPerNode= works; a job that last ran
                # as a shard asks for no GPU, and gets its GPUs back here)
                fields["NumNodes"] = str(len(place))
                fields["TresPerNode"] = f"gres:gpu:{per_node}"
            fields["NodeList"] = ",".join(n for n, _ in place)
            fields["Features"] = "|".join(types)
            now = time.time()
            if view.parked:
                fields["StartTime"] = "now"  # its begin time kept it for the sidecar
            elif (view.job.eligible_time or 0.0) > now:
                # slurmctld delays a job it has just requeued (a moved one): it starts when
                # placed, but not in the second its last run ended nor the next (slurmd
                # rejects a credential made in the second it revoked the job's last one: "Job
                # credential revoked", and the job FAILS), which that delay is for; when the
                # end is not known here, it is taken to be now
                fields["StartTime"] = start_time(self._left.get(job_id, now), now)
            fields["AdminComment"] = rec.with_(
                epoch=epoch, state="placed", place=place, gpus=view.gpus, group=0, copies=0,
                mate=mate, why=why or (rec.why if rec.nofork else "")).encode()
            extra: dict[str, object] = {"mate": mate} if mate else {}
            if not self._write("place", job_id, self.api.update_job, fields,
                               nodes=[n for n, _ in place], gpu_type="|".join(types),
                               gpus=view.gpus, **extra):
                return False
        if view.held and release:
            self._write("release", job_id, self.api.release)
        return True

    def _version(self) -> SlurmVersion:
        version = self.seen.slurm_version
        if version is None:
            version = self.seen.slurm_version = self.api.slurm_version()
        return version

    def _place_shared(self, view: JobView, change: Change, paired: set[int]) -> None:
        """Place a job of a pair (``change.mate``: its mate) on one GPU, each with one shard:
        both pending (placed together, then released together), or beside its mate running
        alone on that GPU's shards.  Slurm cannot be told which GPU a shard job gets, only
        foreseen to give the lowest-index one with a free shard (docs/sharing.md), so the
        placement goes ahead only where that lands the two together, with no other shard job
        waiting for the node and no other pair placed on it this epoch; otherwise the earlier
        job is placed alone (as a GPU job) and the later one waits, with the reason."""
        seen = self.seen
        rows = change.copies[0]
        node_name = seen.node_names[rows[0][0]]
        node = next((n for n in seen.nodes if n.name == node_name), None)
        mate = seen.views.get(change.mate)
        both = [view] if mate is None or mate.running else sorted(
            [view, mate], key=lambda v: v.job_id)
        paired.update(v.job_id for v in both)
        why = self._pair_refused(node, [v.job_id for v in both], mate)
        if mate is None or why:
            # (of two that wait, the earlier runs alone; beside a running mate, none does)
            later = both[1:] if len(both) == 2 else [view]
            if len(both) == 2:
                self._place(both[0], rows, change.epoch)
            for v in later:
                text = f"waits: cannot share a GPU with job {change.mate} now ({why})"
                self.report.detail[v.job_id] = text
                self._keep_waiting(v, change.epoch)
            log_event(logger, "share_refused", logging.INFO, epoch=change.epoch,
                      job=view.job_id, mate=change.mate, node=node_name, why=why)
            return
        self._shard_nodes.add(node_name)
        if len(both) == 1:
            self._place(view, rows, change.epoch, "", change.mate)
            return
        a, b = both
        took = [v for v in both if self._place(v, rows, change.epoch, "", (b if v is a else a)
                                                .job_id, release=False)]
        for v in took:  # (both placed: released one after the other, same pass)
            if v.held:
                self._write("release", v.job_id, self.api.release)

    def _tell_mates(self) -> None:
        """Each job of a pair is told whom it shares its GPU with, and a job whose mate left
        that it runs alone again: its tracker dir's sharing file
        (:mod:`hadar_slurm.runtime.colocation`; an emulated payload then advances at the
        pair's co-located rate).  Written as the job's owner, once per change: for the jobs
        placed beside a mate this epoch, and the running ones whose mate (as read) is not
        what they were last told."""
        seen = self.seen
        if not seen.share:
            return
        want: dict[int, tuple[int, str]] = {}  # job -> (mate, the node they share)
        for v in seen.views.values():
            if (v.shard_gpu is not None or v.job_id in self._told) and v.job.node_names:
                want[v.job_id] = (v.mate, v.job.node_names[0])
        for entry in self.report.applied:
            job, nodes = entry.get("job"), entry.get("nodes")
            if entry.get("action") == "place" and isinstance(job, int) and isinstance(
                    nodes, list) and nodes:
                want[job] = (int(str(entry.get("mate") or 0)), str(nodes[0]))
        self._told = {j: m for j, m in self._told.items() if j in seen.views}
        types = dict(zip(seen.node_names, seen.node_type_names, strict=True))
        for job_id, (mate, node) in sorted(want.items()):
            if self._told.get(job_id, 0) == mate:
                continue
            view = seen.views.get(job_id)
            if view is None:
                continue
            other = seen.views.get(mate)
            try:
                tracker = hadare.tracker_dir(view.job, None)
                owner = hadare.owner_of(view.job)
            except ForkError as exc:
                log_event(logger, "share_untold", logging.WARNING, job=job_id, mate=mate,
                          why=str(exc))
                self._told[job_id] = mate
                continue
            partner_tracker = ""
            if other is not None:
                try:
                    partner_tracker = hadare.tracker_dir(other.job, None)
                except ForkError:
                    pass
            text = colocation.sharing_text(None if other is None or not mate else Sharing(
                partner=mate, partner_type=other.hints.job_type,
                gpu_type=types.get(node, "") or "?", scale=1,
                partner_tracker=partner_tracker, since=time.time()))
            try:
                self.api.write_files(owner, tracker, {colocation.SHARING_FILE: text})
            except SlurmError as exc:
                log_event(logger, "action_failed", logging.WARNING, epoch=seen.epoch,
                          job=job_id, action="tell_mate", error=str(exc))
                continue
            self._did("tell_mate", job_id, mate=mate)
            self._told[job_id] = mate

    def _tell_trials(self, epoch: int) -> None:
        """Write what the study book has for the trials (``steered.json``, verdicts;
        :meth:`~hadar_slurm.sidecar.studies.StudyBook.to_tell`) into their study dirs, as
        each trial's owner.  A trial whose owner cannot be acted for, or whose dir cannot be
        written, is told nothing (logged): it trains on by itself (its wait for a verdict is
        bounded), and the next epoch tries again."""
        book = self.seen.studies
        jobs = {j.job_id: j for j in self.seen.jobs}
        by_trial: dict[int, list[Note]] = {}
        now = time.time()
        for note in book.to_tell(now):
            by_trial.setdefault(note.job_id, []).append(note)
        for job_id, notes in sorted(by_trial.items()):
            job = jobs.get(job_id)
            if job is None:
                continue
            try:
                owner = hadare.owner_of(job)
            except ForkError as exc:
                log_event(logger, "trial_untold", logging.WARNING, epoch=epoch, job=job_id,
                          files=[n.name for n in notes], why=str(exc))
                continue
            directory = os.path.join(book.tracker_of(notes[0]), STUDY_SUBDIR)
            try:
                self.api.write_files(owner, directory, {n.name: n.text for n in notes})
            except SlurmError as exc:
                log_event(logger, "action_failed", logging.WARNING, epoch=epoch, job=job_id,
                          action="tell_trial", files=[n.name for n in notes], error=str(exc))
                continue
            for note in notes:
                book.told(note, now)
                if note.verdict:
                    self._did("tell_trial", job_id, rung=note.rung, verdict=note.verdict)

    def _cancel_trial(self, view: JobView, change: Change) -> None:
        """End a trial its study stopped (its checkpoint at the rung stays in its tracker
        dir): ``scancel``.  One that ended meanwhile is fine."""
        self._write("cancel", view.job_id, self.api.cancel, why=change.why)

    def _split_array(self, job: SlurmJob, epoch: int) -> None:
        """Give each pending task of the job array ``job`` stands for a record of its own, up
        to :data:`MAX_SPLITS` per epoch (the last task is the array's record itself once the
        others are split): from the next read on, each is a job the policy places (a study's
        trial, or any task of a hadar array), which Slurm would otherwise start all at once
        when the array is released."""
        array = job.array_job_id if job.array_job_id is not None else job.job_id
        tasks = expand_array_tasks(job.array_tasks, limit=MAX_SPLITS + 1)
        done: list[int] = []
        try:
            for task in tasks[:-1][:MAX_SPLITS]:
                self.api.split_array_task(array, task, job.admin_comment)
                done.append(task)
        except SlurmError as exc:
            log_event(logger, "action_failed", level=logging.WARNING, epoch=epoch,
                      job=job.job_id, action="split", task=f"{array}_{task}", error=str(exc))
        if done:
            self._did("split", job.job_id, array=array, tasks=len(done),
                      first=done[0], last=done[-1], were=job.array_tasks)

    def _cpus_placed(self, todo: Sequence[Change]) -> dict[str, int]:
        """Per node, the CPUs that the jobs this epoch places or moves there (not running
        there now) ask for: at least one each."""
        seen = self.seen
        out: dict[str, int] = {}
        for c in todo:
            view = seen.views.get(c.job_id)
            if c.kind not in (ChangeKind.PLACE, ChangeKind.MOVE) or view is None or not c.copies:
                continue
            for k, _count in c.copies[0]:
                name = seen.node_names[k]
                if view.running and name in view.job.node_names:
                    continue
                out[name] = out.get(name, 0) + (view.job.cpus_per_node or 1)
        return out

    def _pair_refused(self, node: SlurmNode | None, placing: Sequence[int],
                      mate: JobView | None) -> str:
        """Why a pair cannot be placed on ``node`` now ("" when it can): see
        :meth:`_place_shared`."""
        if node is None or mate is None:
            return "its mate or its node is not in the last read"
        if node.name in self._shard_nodes:
            return f"another pair is placed on {node.name} this epoch"
        idle = node.free_cpus
        if idle is not None:
            need = self._cpu_demand.get(node.name, 0)
            if need > idle:
                # (a job Slurm cannot give a CPU waits, and starts later on whichever GPU has
                # a free shard then: the pair would be split)
                return (f"{node.name} has {idle} free CPU(s) for the {need} the jobs placed "
                        "on it this epoch ask; a job of the pair could wait for one and then "
                        "get another GPU")
        others = [j for j in self.seen.jobs if j.job_id not in placing]
        waiting = shard.waiting_for(node, others)
        if waiting:
            return (f"shard jobs {waiting} wait for {node.name} too; which GPU each gets cannot "
                    "be foreseen")
        gpus = shard.node_gpus(node, others)
        if mate.running:
            got = shard.first_fit(gpus, 1)
            if got != mate.shard_gpu:
                return (f"Slurm would give it GPU {got} of {node.name}, not GPU "
                        f"{mate.shard_gpu}, where job {mate.job_id} runs")
            return ""
        if shard.pair_gpu(gpus, 1) is None:
            free = {g.index: g.free for g in gpus}
            return (f"no GPU of {node.name} would take both (free shards by GPU {free})")
        return ""

    def _take_hold(self, view: JobView) -> bool:
        """Before the sidecar writes its record on a job held with a user hold (the plugin's at
        submit, an earlier version's requeuehold, slurmctld's ``SPECIAL_EXIT``), the hold is
        made its own (``scontrol hold`` by an operator: ``JobHeldAdmin``): a sidecar that dies
        between the record and the release must not leave a job that looks held by its user
        (:func:`held_by_user`), which no later sidecar would release.  False when Slurm did
        not take it (nothing more is written on the job this epoch)."""
        if not view.held or view.job.state_reason == "JobHeldAdmin":
            return True
        if not self._write("hold", view.job_id, self.api.hold):
            return False
        view.job = replace(view.job, state_reason="JobHeldAdmin")
        return True

    def _keep_waiting(self, view: JobView, epoch: int) -> None:
        """A pending job without a place this epoch must not be started by Slurm elsewhere."""
        job_id = view.job_id
        if (view.held or view.parked) and view.record.state != "placed" and not view.relaunch:
            return  # (it waits as job_submit.lua left it, or held by the sidecar)
        # (a job slurmctld held after a failed launch: its hold is made the sidecar's, and the
        # record says it waits, so that it no longer reads as held by its user)
        if not view.held:
            if not self._write("hold", job_id, self.api.hold):
                return
        elif not self._take_hold(view):
            return
        rec = view.record.with_(epoch=epoch, state="held", place=(), gpus=view.gpus, group=0,
                                copies=0)
        self._write("record", job_id, self.api.update_job, {"AdminComment": rec.encode()})

    def _preempt(self, views: list[JobView], ends: list[GroupEnd], epoch: int,
                 now: float, changes: Mapping[int, Change] | None = None) -> _Grace:
        """Stop running jobs (to move them, or because the decision stops them), end forks
        (checkpoint signal to the copies' steps, the grace period, cancel), and place the moved
        jobs on their new GPUs, in the same epoch (:meth:`_finish_moves`; ``changes``: the STOP
        and MOVE changes, by job, whose ``why`` goes to the log). This begins it (the
        records, the signals, the requeues that need no grace); :meth:`_grace` finishes it, and
        the pending jobs of the epoch are placed in between (on GPUs still being freed they wait
        in Slurm: they start the moment the GPUs are free, not when the last job of the grace
        has left).

        A move is a small state machine kept in Slurm, so that it finishes whatever happens to
        the sidecar or to slurmctld on the way (a restarted sidecar, or the next epoch, carries
        on from the job's record):

        1. the record ``state=preempting deadline=T`` is written first (nothing is stopped if
           Slurm does not take it);
        2. ``preempt=checkpoint``: the checkpoint signal, then the grace period (until ``T``,
           or until every signalled job has left its GPUs, read every :attr:`grace_poll_s`);
           the job saves its state and exits 75, and slurmctld itself requeues it held
           (``RequeueExitHold=75`` in slurm.conf): it never shows FAILED, so a dependent job
           never sees it fail.  ``preempt=requeue``: no signal, no grace;
        3. what still runs is requeued held (``scontrol requeue``: Slurm's own SIGTERM,
           ``KillWait``, SIGKILL, and the requeue in one step; then the operator's ``scontrol
           hold``, see :meth:`SlurmApi.requeue_hold
           <hadar_slurm.slurm.api.SlurmApi.requeue_hold>`); a job that ended FAILED during
           its grace (killed by the signal), or exited 75 on a Slurm without
           ``RequeueExitHold``, is requeued held too (Slurm requeues finished batch jobs); one
           that completed (exit 0), was cancelled by its user or ran out of time stays ended;
        4. the record becomes ``preempted``; a job the decision moves is placed on its new
           GPUs as soon as Slurm shows it back in the queue (:meth:`_finish_moves`: during
           the grace period, each as it leaves, not after the last one), a job it stops is
           placed again in a later epoch.

        Jobs with ``preempt=never`` (the default of a job that did not say it checkpoints) are
        never given to this: they run where they are (:attr:`pinned`)."""
        deadline = now + self.preempt_grace_s
        signaled: list[JobView] = []
        requeue_now: list[JobView] = []
        for view in views:
            self._guard("preempt", view.job_id, self._begin_move, view, epoch, now, deadline,
                        signaled, requeue_now,
                        c.why if (c := (changes or {}).get(view.job_id)) else "")
        copies_signaled = False
        for end in ends:
            g = end.group
            v = end.view
            if v is not None:
                # first the record: a sidecar that dies after the cancel finds the job
                # waiting (not "forked" with its copies gone, which would mean they ended
                # by themselves)
                rec = v.record.with_(epoch=epoch, state="held", place=(), gpus=v.gpus, group=0,
                                     copies=0, done=v.done, attained=v.attained, until=now,
                                     why="")
                if self._write("record", v.job_id, self.api.update_job,
                               {"AdminComment": rec.encode()}):
                    v.record = rec
                if g.running and self._write(
                        "signal_copies", g.leader, self.api.signal_steps, self.preempt_signal,
                        signal=self.preempt_signal, copy_of=g.original):
                    copies_signaled = True
        for view in requeue_now:
            self._guard("requeue", view.job_id, self._requeue_view, view, epoch)
        wait = max([v.record.deadline for v in signaled]
                   + ([deadline] if copies_signaled else [])) - now if (
                       signaled or copies_signaled) else 0.0
        moves = {j: c for j, c in (changes or {}).items() if c.kind is ChangeKind.MOVE}
        return _Grace(views, ends, signaled, moves, epoch, wait)

    def _grace(self, g: _Grace) -> None:
        """The grace period of :meth:`_preempt`, cut short once every signalled job and copy
        has left: the jobs are read every :attr:`grace_poll_s`; a signalled job that has left
        is done with (:meth:`_end_move`) and, moved, placed on its new GPUs at once.  Then the
        ended forks' copies are cancelled, what still runs is requeued, and the moved jobs not
        placed yet are placed as soon as Slurm shows them back (:meth:`_finish_moves`)."""
        if not g.signaled and not g.ends:
            self._finish_moves(g.views, g.moves, g.epoch)
            return
        pending = {v.job_id: v for v in g.signaled}
        comps = {c.job_id for e in g.ends for c in e.group.components}
        placed: set[int] = set()
        remaining = g.wait
        while True:
            if remaining > 0:
                step = min(self.grace_poll_s, remaining)
                self._sleep(step)
                remaining -= step
            jobs = self._read_jobs()
            if jobs is None:
                return  # the next epoch finishes the moves (their records say preempting)
            by_id = {j.job_id: j for j in jobs}
            for job_id in sorted(pending):
                job = by_id.get(job_id)
                if job is None or not (job.state in RUNNING_STATES
                                       or job.state == "COMPLETING"):
                    self._guard("preempt", job_id, self._end_move, pending.pop(job_id), job,
                                g.epoch)
            # (a job that read shows back in the queue left by itself: it is placed at once)
            placed |= self._finish_moves([v for v in g.views if v.job_id not in placed],
                                         g.moves, g.epoch, jobs, polls=0)
            # (a copy that has left its GPUs is done with the grace: one that checkpointed and
            # exited 75 is requeued held by slurmctld, pending, and cancelled below)
            busy = bool(pending) or any(
                j.job_id in comps and (j.state in RUNNING_STATES or j.state == "COMPLETING")
                for j in jobs)
            if remaining <= 0 or not busy:
                break
        live = {j.job_id for j in jobs if j.state in hadare.LIVE_STATES}
        for end in g.ends:
            grp = end.group
            if not any(c.job_id in live for c in grp.components):
                log_event(logger, "cancel_skipped", logging.INFO, epoch=self.seen.epoch,
                          job=grp.leader, copy_of=grp.original, why="its copies already ended")
                continue
            self._write("cancel_copies", grp.leader, self.api.cancel, copy_of=grp.original,
                        why=end.why)
        for job_id, view in sorted(pending.items()):  # (still on its GPUs: requeued)
            self._guard("preempt", job_id, self._end_move, view, by_id.get(job_id), g.epoch)
        self._finish_moves([v for v in g.views if v.job_id not in placed], g.moves, g.epoch,
                           None if pending else jobs)

    def _read_jobs(self) -> list[SlurmJob] | None:
        """One read of all jobs within an epoch's apply; None (logged) when Slurm did not
        answer, and the next epoch carries on from the jobs' records."""
        try:
            return self.api.read_jobs()
        except SlurmError as exc:
            log_event(logger, "action_failed", logging.WARNING, epoch=self.seen.epoch,
                      action="read_jobs", error=str(exc))
            return None

    def _finish_moves(self, views: Sequence[JobView], moves: Mapping[int, Change],
                      epoch: int, jobs: Sequence[SlurmJob] | None = None,
                      polls: int | None = None) -> set[int]:
        """Step 5 of a move: the jobs of ``moves`` that left their GPUs (record
        ``preempted``) are placed (or forked) on their new GPUs in this epoch, as soon as
        Slurm shows them back in the queue: first in ``jobs`` (a read of the grace period,
        when there was one), then in one ``squeue`` every :attr:`move_poll_s`, at most
        ``polls`` (default :attr:`move_polls`) of them; with ``polls`` 0, only ``jobs``.  One
        that is not back after the reads stays preempted, with the reason in the report (the
        next epoch places it).  The jobs placed."""
        polls = self.move_polls if polls is None else polls
        waiting = {v.job_id: v for v in views
                   if v.job_id in moves and v.record.state == "preempted"}
        placed: set[int] = set()
        reads = 0
        while waiting:
            if jobs is None:
                if reads >= polls:
                    break
                if reads:
                    self._sleep(self.move_poll_s)
                jobs = self._read_jobs()
                reads += 1
                if jobs is None:
                    break
            back = sorted((j.job_id, j) for j in jobs
                          if j.job_id in waiting and j.state in PENDING_STATES)
            jobs = None
            for job_id, job in back:
                self._left[job_id] = time.time()  # (it left before this read)
                view = waiting.pop(job_id)
                placed.add(job_id)
                view.job, view.running, view.rows, view.row_copy = job, False, (), ()
                self.watch.add(job_id)
                change = moves[job_id]
                if change.nofork:
                    self._guard("fork", job_id, self._fork_failed, view, change.copies[0],
                                epoch, change.why)
                elif len(change.copies) > 1:
                    self._guard("fork", job_id, self._fork, view, change.copies, epoch, None)
                else:
                    self._guard("place", job_id, self._place, view, change.copies[0], epoch)
        if polls:
            for job_id in sorted(waiting):
                why = (f"moved: it was still leaving its GPUs after {polls} reads, "
                       f"{self.move_poll_s:g} s apart; placed again next epoch")
                self.report.detail[job_id] = why
                log_event(logger, "move_deferred", logging.WARNING, epoch=self.seen.epoch,
                          job=job_id, why=why)
        return placed

    def _begin_move(self, view: JobView, epoch: int, now: float, deadline: float,
                    signaled: list[JobView], requeue_now: list[JobView],
                    why: str = "") -> None:
        """Steps 1 and 2 of a move (:meth:`_preempt`) for one running job (``why``: for the
        log)."""
        job_id = view.job_id
        mode = view.hints.preempt_mode
        rec = view.record
        if rec.state == "preempting":
            # begun by an earlier epoch (the sidecar restarted, or Slurm did not answer):
            # no second signal; requeued once its grace is over
            (signaled if mode == "checkpoint" and now < rec.deadline else requeue_now).append(
                view)
            return
        checkpoint = mode == "checkpoint"
        rec = rec.with_(epoch=epoch, state="preempting", place=(), gpus=view.gpus,
                        done=view.done, attained=view.attained, until=now,
                        deadline=deadline if checkpoint else now, why="")
        if not self._write("record", job_id, self.api.update_job,
                           {"AdminComment": rec.encode()}, state="preempting", mode=mode,
                           **({"why": why} if why else {})):
            return  # nothing stopped; the next epoch decides again
        view.record = rec
        if checkpoint:
            # (a signal that fails still ends in the requeue after the grace period)
            self._write("signal", job_id, self.api.signal, self.preempt_signal,
                        signal=self.preempt_signal)
            signaled.append(view)
        else:
            requeue_now.append(view)

    def _end_move(self, view: JobView, job: SlurmJob | None, epoch: int) -> None:
        """Step 3 of a move, after the grace period: ``job`` as Slurm shows it now."""
        job_id = view.job_id
        if job is None:
            log_event(logger, "preempt_skipped", logging.WARNING, epoch=self.seen.epoch, job=job_id,
                      why="gone from Slurm during the grace period")
            return
        if job.state in RUNNING_STATES or move_left_ended(job):
            view.record = self._requeue(job_id, view.record, epoch)
        elif job.state in PENDING_STATES:
            # back in the queue by itself: slurmctld requeued its checkpoint exit
            rec = view.record.with_(state="preempted")
            if self._write("record", job_id, self.api.update_job,
                           {"AdminComment": rec.encode()}, state="preempted",
                           slurm_state=job.state):
                view.record = rec
        else:
            log_event(logger, "preempt_skipped", logging.INFO, epoch=self.seen.epoch, job=job_id,
                      why=f"ended {job.state} (exit {job.exit_code}) during the grace period")

    def _requeue_view(self, view: JobView, epoch: int) -> None:
        view.record = self._requeue(view.job_id, view.record, epoch)

    def _requeue(self, job_id: int, record: JobRecord, epoch: int) -> JobRecord:
        """Requeue held (``scontrol requeue`` and an operator's hold: a running job gets
        Slurm's SIGTERM, KillWait, SIGKILL; a finished one is put back), then the record
        ``preempted``; the job's record as it stands in Slurm after that."""
        nodes = [n for n, _ in record.place]
        if self._write("requeue", job_id, self.api.requeue_hold, **(
                {"nodes": nodes} if nodes else {})):
            rec = record.with_(epoch=max(epoch, record.epoch), state="preempted")
            if self._write("record", job_id, self.api.update_job,
                           {"AdminComment": rec.encode()}, state="preempted"):
                return rec
        return record

    def _requeue_left(self, job: SlurmJob, epoch: int) -> None:
        """A job a move left ended (:func:`move_left_ended`): requeued held."""
        log_event(logger, "move_resumed", logging.WARNING, epoch=self.seen.epoch, job=job.job_id,
                  slurm_state=job.state, exit_code=job.exit_code,
                  why="it ended during a move without being requeued")
        self._requeue(job.job_id, decode(job.admin_comment), epoch)

    def _keep_fork(self, view: JobView, epoch: int) -> None:
        """The job's copies run (or wait) where the decision wants them: make sure the job
        records them, waits for them and stays held.  A fork the sidecar submitted but never
        recorded (it died in between) is adopted here."""
        g = view.group
        assert g is not None
        job_id = view.job_id
        rec = view.record
        place = rows_text(self.seen.node_names, view.rows)
        adopt = rec.state != "forked" or rec.group != g.leader
        fields: dict[str, str] = {}
        if adopt or rec.copies != g.size or rec.place != place:
            fields["AdminComment"] = rec.with_(
                epoch=epoch, state="forked", place=place, gpus=view.gpus, group=g.leader,
                copies=g.size, why="").encode()
        if g.leader not in hadare.dependency_jobs(view.job.dependency):
            fields["Dependency"] = f"afterany:{g.leader}"
        if fields and self._take_hold(view):
            self._write("adopt" if adopt else "record", job_id, self.api.update_job, fields,
                        group=g.leader, copies=g.size, nodes=[n for n, _ in place])
        if not (view.held or view.parked):
            self._write("hold", job_id, self.api.hold)

    def _fork(self, view: JobView, copies: Sequence[Rows], epoch: int,
              after: CopyGroup | None) -> None:
        """Fork the (pending, held or parked) job into ``copies``: its batch script and hints
        saved in its tracker directory, one heterogeneous job submitted as its owner, the fork
        recorded on the job, which stays held with ``Dependency=afterany:K``.  ``after``: an
        earlier fork being cancelled, which the new copies wait for."""
        job = view.job
        job_id = view.job_id
        rows0 = copies[0]
        if not self._take_hold(view):
            return
        names, types = self.seen.node_names, self.seen.node_type_names
        try:
            specs: list[CopySpec] = []
            for i, rows in enumerate(copies):
                if len(rows) != 1:
                    raise ForkError(f"copy {i} spans {len(rows)} nodes (a copy runs on one)")
                k, count = rows[0]
                specs.append(CopySpec(names[k], types[k], int(count)))
            owner = hadare.owner_of(job)
            tracker = view.tracker or hadare.tracker_dir(job, self.tracker_root)
            plan = ForkPlan(
                original_job_id=job_id, job_name=hadare.sbatch_name(job.name, job_id),
                command=("bash", os.path.join(tracker, hadare.SCRIPT_FILE),
                         *(view.record.args or ())),
                copies=tuple(specs), workdir=job.workdir, tracker_dir=tracker,
                output=os.path.join(tracker, "fork-%j.out"), partition=job.partition or None,
                time_limit_min=job.time_limit_min or None, account=job.account or None,
                qos=job.qos or None, mem_per_node_mb=job.mem_per_node_mb,
                mem_per_cpu_mb=None if job.mem_per_node_mb else job.mem_per_cpu_mb,
                cpus_per_task=job.cpus_per_node if (job.cpus_per_node or 1) > 1 else None,
                env=hadare.array_env(job))
            text = render_hetjob(plan)
        except (ForkError, InputError) as exc:
            msg = exc.one_line() if isinstance(exc, InputError) else str(exc)
            self._fork_failed(view, rows0, epoch, f"fork failed: {msg}")
            return
        nodes = [c.node for c in specs]
        detail: dict[str, object] = {"copies": len(specs), "nodes": nodes,
                                     "gpu_types": [c.gpu_type for c in specs],
                                     "tracker": tracker}
        try:
            script = self.api.batch_script(job_id)
        except SlurmError as exc:
            self._fork_failed(view, rows0, epoch, f"fork failed: {exc}")
            return
        try:
            self.api.write_files(owner, tracker, {
                hadare.SCRIPT_FILE: script, hadare.HINTS_FILE: job.comment.strip() + "\n",
                hadare.PLAN_FILE: text})
        except SlurmError as exc:
            self._fork_failed(view, rows0, epoch,
                              f"fork failed: cannot write the tracker directory: {exc}")
            return
        # The intent first: a sidecar that dies between sbatch and the record below finds the
        # copies by their comment (and knows, from the newest fork named here, which copies
        # are those of this fork, even once they have ended).
        place = tuple(sorted((c.node, c.gpus) for c in specs))
        known = [g.leader for g in self.seen.groups.get(job_id, ())]
        intent = view.record.with_(epoch=epoch, state="forking", place=place, gpus=view.gpus,
                                   group=max(known, default=0), copies=len(specs), why="")
        if not self._write("fork_intent", job_id, self.api.update_job,
                           {"AdminComment": intent.encode()}):
            return  # (held as it was; the next epoch tries again)
        view.record = intent
        dependency = f"afterany:{after.leader}" if after is not None else None
        try:
            leader = self.api.submit_as(os.path.join(tracker, hadare.PLAN_FILE), owner,
                                        dependency=dependency)
        except SlurmTimeoutError as exc:
            # it may have been submitted all the same: the next epoch adopts it by its
            # comment, or places the job unforked; until then the job stays held
            why = f"fork failed: {' '.join(str(exc).split())}"[:300]
            log_event(logger, "fork_failed", logging.WARNING, epoch=self.seen.epoch, job=job_id,
                      why=why, fallback="held")
            self.report.detail[job_id] = why
            self._write("record", job_id, self.api.update_job,
                        {"AdminComment": intent.with_(nofork=True, why=why).encode()}, why=why)
            return
        except SlurmError as exc:
            self._fork_failed(view, rows0, epoch, f"fork failed: {exc}")
            return
        self._did("fork", job_id, group=leader, **detail)
        self.watch.update(leader + k for k in range(len(specs)))  # the components' own ids
        self.seen.copy_ids.update(leader + k for k in range(len(specs)))
        rec = intent.with_(state="forked", group=leader)
        self._write("record", job_id, self.api.update_job,
                    {"AdminComment": rec.encode(), "Dependency": f"afterany:{leader}"},
                    group=leader)

    def _fork_failed(self, view: JobView, rows0: Rows, epoch: int, why: str) -> None:
        """A fork that cannot be made: say why (log, the report's detail, the job's record,
        which also stops further forks of it) and place the job unforked on copy 0's node
        instead, in this epoch."""
        job_id = view.job_id
        why = " ".join(why.split())
        if len(why) > 300:
            why = why[:297] + "..."
        log_event(logger, "fork_failed", logging.WARNING, epoch=self.seen.epoch, job=job_id,
                  why=why, fallback="unforked")
        self.report.detail[job_id] = why
        view.record = view.record.with_(nofork=True, why=why)
        self._place(view, rows0, epoch, why=why)

    def _release_unsteered(self, u: Unsteered, epoch: int) -> None:
        job_id = u.job.job_id
        if u.record.state != "unsteered":
            rec = u.record.with_(epoch=epoch, state="unsteered", place=(), why=u.why)
            self._write("unsteer", job_id, self.api.update_job, {"AdminComment": rec.encode()},
                        why=u.why)
        if held_by_hadar(u.job):
            self._write("release", job_id, self.api.release)
        elif u.parked:
            self._write("start", job_id, self.api.update_job, {"StartTime": "now"})
