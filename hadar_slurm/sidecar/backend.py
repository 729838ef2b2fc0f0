"""The Slurm backend of the epoch loop: Slurm's queue and nodes in, hold/place/release/requeue out.

:class:`SlurmBackend` implements :class:`hadar_slurm.loop.ClusterBackend`, the same interface as
the simulator, over a :class:`~hadar_slurm.sidecar.api.SlurmApi`:

* :meth:`~SlurmBackend.snapshot` is one read of all jobs and one of all nodes.  *Hadar jobs*
  are those whose comment carries hints (``hadar: model=... steps=...``); every other job is
  left alone, but the GPUs it holds are taken out of what the policy may hand out.
* :meth:`~SlurmBackend.apply` reconciles Slurm with the decision: it compares what each job
  should do with what Slurm says it does and issues only the commands that close the gap, so
  applying the same decision twice changes nothing.  A placement is one ``scontrol update``
  (NodeList, Features and the job's :mod:`record <hadar_slurm.sidecar.record>` in its
  AdminComment) and a release; a running job that must stop gets its checkpoint signal, a grace
  period, then ``scontrol requeuehold``; it is placed again in a later epoch.

Jobs the sidecar cannot steer (bad hints, or no GPU type of the cluster can run them) are never
left held: they are released to Slurm's own scheduler with the reason in their admin comment.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hadar_slurm.errors import InputError
from hadar_slurm.hints import Hints, ModelCatalog, is_hadar_comment, parse_hints
from hadar_slurm.logs import log_event
from hadar_slurm.loop import Action, ActionKind
from hadar_slurm.policy.base import Decision, Placement, Snapshot
from hadar_slurm.sidecar.api import DryRunApi, SlurmApi
from hadar_slurm.sidecar.record import JobRecord, decode
from hadar_slurm.slurm import SlurmError, SlurmJob, SlurmNode
from hadar_slurm.throughputs import ThroughputTable

#: Job states in which a job holds its GPUs.
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})
#: Job states in which a job waits in the queue.
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
#: Node states (base) whose GPUs may be handed out, and flags that take a node out.
NODE_USABLE = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
NODE_BAD_FLAGS = frozenset({
    "DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "MAINTENANCE", "FAIL", "POWER_DOWN",
    "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVALID_REG",
})
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
#: Pending reasons that say a placed job can never start as its request stands: the sidecar
#: places it again from scratch (every field of the request rewritten).
STUCK_REASONS = frozenset({"BadConstraints"})
#: Fault drill: with ``HADAR_SIDECAR_CRASH_AFTER_WRITES=N`` in its environment the sidecar
#: kills itself (SIGKILL, no cleanup) right after its N-th change to Slurm, i.e. in the middle
#: of applying an epoch.  The restart tests use it; nothing else should set it.
CRASH_ENV = "HADAR_SIDECAR_CRASH_AFTER_WRITES"

logger = logging.getLogger("hadar_slurm.sidecar")


@dataclass
class JobView:
    """One hadar job as the sidecar sees it this epoch."""

    job: SlurmJob
    hints: Hints
    record: JobRecord
    gpus: int  # the job's GPU count (the policy's scale)
    running: bool
    rows: tuple[tuple[int, int], ...]  # (node index, GPUs) it runs on, or was placed on
    done: float  # steps done, estimated
    attained: dict[str, float]  # seconds run per GPU type, estimated
    rates: tuple[float, ...]  # whole-job steps/s on its GPUs of each of the snapshot's types
    repair: bool = False  # Slurm says its request cannot run: rewrite it whole

    @property
    def job_id(self) -> int:
        return self.job.job_id

    @property
    def held(self) -> bool:
        return self.job.state in PENDING_STATES and self.job.state_reason in HELD_REASONS


@dataclass
class Unsteered:
    """A hadar job the sidecar will not steer; it goes to Slurm's own scheduler."""

    job: SlurmJob
    record: JobRecord
    why: str


@dataclass
class EpochStats:
    read_s: float = 0.0
    apply_s: float = 0.0
    commands_read: int = 0
    commands_apply: int = 0
    applied: list[dict[str, object]] = field(default_factory=list)


def held_by_hadar(job: SlurmJob) -> bool:
    """Held, and by the sidecar or the job_submit plugin (not by the user: a user's own hold
    is respected).  ``job_submit.lua`` marks its holds in the admin comment."""
    if job.state not in PENDING_STATES or job.state_reason not in HELD_REASONS:
        return False
    return job.state_reason == "JobHeldAdmin" or job.admin_comment.startswith("hadar")


def node_usable(node: SlurmNode) -> bool:
    state = node.state.upper()
    if state not in NODE_USABLE or "DRAIN" in state:
        return False
    return not any(f.upper() in NODE_BAD_FLAGS for f in node.state_flags)


class SlurmBackend:
    """:class:`~hadar_slurm.loop.ClusterBackend` over a real Slurm cluster."""

    def __init__(
        self, api: SlurmApi, table: ThroughputTable, *, catalog: ModelCatalog | None = None,
        partition: str | None = None, preempt_grace_s: float = 30.0,
        preempt_signal: str = "USR1", sleep: Callable[[float], object] = time.sleep,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.api = api
        self.table = table
        self.catalog = catalog if catalog is not None else ModelCatalog.from_table(table)
        self.partition = partition
        self.preempt_grace_s = preempt_grace_s
        self.preempt_signal = preempt_signal
        self._sleep = sleep
        self._should_stop = should_stop
        self.views: dict[int, JobView] = {}
        self.unsteered: list[Unsteered] = []
        self.node_names: tuple[str, ...] = ()
        self.node_type_names: tuple[str, ...] = ()
        self.gpu_types: tuple[str, ...] = ()
        self.jobs: list[SlurmJob] = []
        self.nodes: list[SlurmNode] = []
        self.stats = EpochStats()
        self.epoch = -1
        self.writes = 0
        crash = os.environ.get(CRASH_ENV, "")
        self._crash_after = int(crash) if crash.isdigit() else None

    # -- reading -------------------------------------------------------------------------

    def read(self) -> None:
        """One read of all jobs and one of all nodes."""
        before = self.api.commands
        t0 = time.perf_counter()
        # Nodes first: a job that starts between the two reads then shows as running in the
        # jobs read, while its GPUs are not yet used in the nodes read (free GPUs are
        # over-counted for one epoch, which is harmless; the other order under-counts them
        # and would hold jobs that were just released).
        self.nodes = self.api.read_nodes()
        self.jobs = self.api.read_jobs()
        self.stats = EpochStats(read_s=time.perf_counter() - t0,
                                commands_read=self.api.commands - before)

    def last_epoch(self) -> int:
        """The latest epoch recorded on any job in Slurm (-1: none): where a restarted sidecar
        picks up.  Uses the jobs of the last :meth:`read`."""
        return max((decode(j.admin_comment).epoch for j in self.jobs
                    if is_hadar_comment(j.comment)), default=-1)

    def snapshot(self, epoch: int, now: float, round_s: float, policy_state: object) -> Snapshot:
        self.epoch = epoch
        self.read()
        return self.build_snapshot(epoch, now, round_s, policy_state)

    def build_snapshot(
        self, epoch: int, now: float, round_s: float, policy_state: object,
    ) -> Snapshot:
        """The policy's view of the jobs and nodes of the last :meth:`read`."""
        nodes = sorted((n for n in self.nodes if n.gpu_type and n.gpus > 0),
                       key=lambda n: n.name)
        types: list[str] = []
        for n in nodes:
            assert n.gpu_type is not None
            if n.gpu_type not in types:
                types.append(n.gpu_type)
        self.gpu_types = tuple(types)
        self.node_names = tuple(n.name for n in nodes)
        self.node_type_names = tuple(n.gpu_type or "" for n in nodes)
        node_index = {name: k for k, name in enumerate(self.node_names)}

        views: dict[int, JobView] = {}
        self.unsteered = []
        hadar_on_node = np.zeros(len(nodes), dtype=np.int64)
        other_on_node = np.zeros(len(nodes), dtype=np.int64)
        for job in sorted(self.jobs, key=lambda j: j.job_id):
            if not is_hadar_comment(job.comment) or (
                    self.partition is not None and job.partition != self.partition):
                if job.state in RUNNING_STATES:
                    for name in job.node_names:
                        if name in node_index:
                            other_on_node[node_index[name]] += job.gpus_per_node
                continue
            if job.state not in RUNNING_STATES and job.state not in PENDING_STATES:
                continue
            if (job.state in PENDING_STATES and job.state_reason in HELD_REASONS
                    and not held_by_hadar(job)):
                continue  # the user holds it: not ours to start
            view = self._view(job, now, node_index)
            if view is None:
                continue
            if view.running:
                for k, c in view.rows:
                    hadar_on_node[k] += c
            views[job.job_id] = view
        self.views = views

        # GPUs the policy may hand out: a usable node's GPUs minus those other jobs hold.  The
        # node's count of used GPUs less the hadar jobs' is the other jobs' use; so is the sum
        # over the running non-hadar jobs of the jobs read.  The two differ only for a job that
        # started or ended between the reads (or asked for GPUs per job, not per node): the
        # smaller one wins, since over-counting free GPUs for an epoch is harmless (a released
        # job waits in Slurm) and under-counting them holds jobs for nothing.
        gpus = np.zeros(len(nodes), dtype=np.int64)
        for k, n in enumerate(nodes):
            if node_usable(n):
                foreign = min(max(0, n.gpus_used - int(hadar_on_node[k])),
                              int(other_on_node[k]))
                gpus[k] = max(0, n.gpus - foreign)
        node_type = np.array([types.index(n.gpu_type or "") for n in nodes], dtype=np.int64)

        ordered = list(views.values())
        rate = np.array(
            [v.rates for v in ordered],
            dtype=np.float64).reshape(len(ordered), len(types))
        attained = np.array(
            [[v.attained.get(t, 0.0) for t in types] for v in ordered],
            dtype=np.float64).reshape(len(ordered), len(types))
        total = np.array([float(v.hints.steps) for v in ordered], dtype=np.float64)
        done = np.array([v.done for v in ordered], dtype=np.float64)
        remaining = np.maximum(total - done, np.maximum(1.0, 1e-3 * total))
        cur_job: list[int] = []
        cur_node: list[int] = []
        cur_count: list[int] = []
        for v in ordered:
            for k, c in v.rows:
                cur_job.append(v.job_id)
                cur_node.append(k)
                cur_count.append(c)
        ids = np.array([v.job_id for v in ordered], dtype=np.int64)
        return Snapshot(
            epoch=epoch, now=now, round_s=round_s, gpu_types=self.gpu_types,
            node_names=self.node_names, node_type=node_type, node_gpus=gpus,
            job_ids=ids, job_types=tuple(v.hints.job_type for v in ordered),
            arrival=np.array([float(v.job.submit_time or now) for v in ordered],
                             dtype=np.float64),
            total=total, remaining=remaining,
            scale=np.array([v.gpus for v in ordered], dtype=np.int64),
            weight=np.array([v.hints.weight for v in ordered], dtype=np.float64),
            sync=np.array([v.hints.sync for v in ordered], dtype=np.bool_),
            rate=rate, attained=attained,
            current=Placement(np.array(cur_job, dtype=np.int64),
                              np.array(cur_node, dtype=np.int64),
                              np.array(cur_count, dtype=np.int64)),
            policy_state=policy_state,
        )

    def _view(self, job: SlurmJob, now: float, node_index: dict[str, int]) -> JobView | None:
        record = decode(job.admin_comment)
        running = job.state in RUNNING_STATES
        gpus = record.gpus or job.gpus_per_node * max(1, len(job.node_names) if running else 1)
        gpus = max(gpus, 1)
        try:
            hints = parse_hints(job.comment, self.catalog, gpus=gpus)
        except InputError as exc:
            self._unsteer(job, record, f"bad hints: {exc.one_line()}")
            return None
        rates = tuple(self.table.rate(hints.job_type, gpus, t) for t in self.gpu_types)
        if not any(r > 0 for r in rates):
            self._unsteer(job, record, f"no GPU type of this cluster ({', '.join(self.gpu_types)})"
                          f" has a throughput for {hints.job_type} on {gpus} GPU(s)")
            return None
        if record.state == "unsteered":
            return None  # released to Slurm earlier; stays so
        done = record.done
        attained = dict(record.attained)
        rows: list[tuple[int, int]] = []
        if running:
            per_node = job.gpus_per_node or gpus
            rows = [(node_index[n], per_node) for n in job.node_names if n in node_index]
            start = float(job.start_time or now)
            since = max(start, record.until)
            run_s = max(0.0, now - since)
            used = sorted({self.node_type_names[k] for k, _ in rows})
            if used and run_s > 0:
                r = min(rates[self.gpu_types.index(t)] for t in used)
                done += r * run_s
                for t in used:
                    attained[t] = attained.get(t, 0.0) + run_s
        elif record.state == "placed" and job.state_reason in STUCK_REASONS:
            log_event(logger, "stuck", logging.WARNING, job=job.job_id, reason=job.state_reason,
                      record=job.admin_comment)
            return JobView(job, hints, record.with_(state="held", place=()), gpus, False, (),
                           done, attained, rates, repair=True)
        elif record.state == "placed":
            rows = [(node_index[n], c) for n, c in record.place if n in node_index]
        return JobView(job, hints, record, gpus, running, tuple(sorted(rows)), done, attained,
                       rates)

    def _unsteer(self, job: SlurmJob, record: JobRecord, why: str) -> None:
        if job.state in PENDING_STATES:
            self.unsteered.append(Unsteered(job, record, why))

    # -- applying ------------------------------------------------------------------------

    def apply(self, decision: Decision, actions: list[Action], now: float) -> None:
        before = self.api.commands
        t0 = time.perf_counter()
        epoch = decision.epoch
        preempt: list[JobView] = []
        place: list[tuple[JobView, tuple[tuple[int, int], ...]]] = []
        placed_ids: set[int] = set()
        for a in actions:
            view = self.views.get(a.job_id)
            if view is None:
                continue
            if a.kind is ActionKind.PREEMPT:
                if view.running:
                    preempt.append(view)
                continue
            placed_ids.add(a.job_id)
            if view.running:
                if view.rows != tuple(sorted(a.rows)):
                    preempt.append(view)  # a move: stop now, placed again next epoch
            else:
                place.append((view, tuple(sorted(a.rows))))

        for u in self.unsteered:
            self._release_unsteered(u, epoch)
        if preempt:
            self._preempt(preempt, epoch, now)
        for view, rows in place:
            self._place(view, rows, epoch, decision)
        for view in self.views.values():
            if not view.running and view.job_id not in placed_ids:
                self._keep_waiting(view, epoch)
        self.stats.apply_s = time.perf_counter() - t0
        self.stats.commands_apply = self.api.commands - before

    def next_epoch_start(self, now: float, round_s: float) -> float | None:
        return None if self._should_stop() else now + round_s

    def _write(self, what: str, view_id: int, call: Callable[..., None], *args: object,
               **fields: object) -> bool:
        """``call(view_id, *args)``; a Slurm error is logged (the job is left for the next
        epoch to reconcile) and gives False."""
        try:
            call(view_id, *args)
        except SlurmError as exc:
            log_event(logger, "action_failed", level=logging.WARNING, epoch=self.epoch,
                      job=view_id, action=what, error=str(exc))
            return False
        entry: dict[str, object] = {"epoch": self.epoch, "job": view_id, "action": what,
                                    **fields}
        self.stats.applied.append(entry)
        log_event(logger, "action", logging.INFO, **entry)
        self.writes += 1
        if self._crash_after is not None and self.writes >= self._crash_after:
            log_event(logger, "crash_drill", logging.WARNING, writes=self.writes)
            for h in logging.getLogger("hadar_slurm").handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return True

    def _rows_text(self, rows: Sequence[tuple[int, int]]) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((self.node_names[k], c) for k, c in rows))

    def _place(self, view: JobView, rows: tuple[tuple[int, int], ...], epoch: int,
               decision: Decision) -> None:
        place = self._rows_text(rows)
        counts = {c for _, c in place}
        job_id = view.job_id
        if len(counts) != 1:
            decision.detail[job_id] = (
                "placed across nodes with unequal GPU counts "
                f"({', '.join(f'{n}:{c}' for n, c in place)}), which one Slurm job cannot "
                "express; it waits for an even placement")
            self._keep_waiting(view, epoch)
            return
        rec = view.record
        types = sorted({self.node_type_names[k] for k, _ in rows})
        already = rec.state == "placed" and rec.place == place
        if not already:
            per_node = counts.pop()
            fields: dict[str, str] = {}
            if (len(place) > 1 or len(rec.place) > 1 or view.repair
                    or view.job.gpus_per_node != per_node):
                # (22.05 ignores an update of Gres=; TresPerNode= works)
                fields["NumNodes"] = str(len(place))
                fields["TresPerNode"] = f"gres:gpu:{per_node}"
            fields["NodeList"] = ",".join(n for n, _ in place)
            fields["Features"] = "|".join(types)
            fields["AdminComment"] = rec.with_(epoch=epoch, state="placed", place=place,
                                               gpus=view.gpus, why="").encode()
            if not self._write("place", job_id, self.api.update_job, fields,
                               nodes=[n for n, _ in place], gpu_type="|".join(types),
                               gpus=view.gpus):
                return
        if view.held:
            self._write("release", job_id, self.api.release)

    def _keep_waiting(self, view: JobView, epoch: int) -> None:
        """A pending job without a place this epoch must not be started by Slurm elsewhere."""
        job_id = view.job_id
        if view.held and view.record.state != "placed":
            return
        if not view.held:
            if not self._write("hold", job_id, self.api.hold):
                return
        rec = view.record.with_(epoch=epoch, state="held", place=(), gpus=view.gpus)
        self._write("record", job_id, self.api.update_job, {"AdminComment": rec.encode()})

    def _preempt(self, views: list[JobView], epoch: int, now: float) -> None:
        signaled: list[JobView] = []
        for view in views:
            job_id = view.job_id
            rec = view.record.with_(epoch=epoch, state="preempted", place=(), gpus=view.gpus,
                                    done=view.done, attained=view.attained, until=now)
            self._write("record", job_id, self.api.update_job, {"AdminComment": rec.encode()})
            if self._write("signal", job_id, self.api.signal, self.preempt_signal,
                           signal=self.preempt_signal):
                signaled.append(view)
        if signaled and self.preempt_grace_s > 0 and not isinstance(self.api, DryRunApi):
            self._sleep(self.preempt_grace_s)  # (a dry run signaled nobody)
        # Slurm requeues finished jobs too: one more read, so that a job that finished during
        # the grace period is not started again.
        try:
            still = {j.job_id for j in self.api.read_jobs() if j.state in RUNNING_STATES}
        except SlurmError as exc:
            log_event(logger, "action_failed", logging.WARNING, epoch=self.epoch,
                      action="read_jobs", error=str(exc))
            return  # the next epoch preempts what still runs
        for view in views:
            job_id = view.job_id
            if job_id not in still:
                log_event(logger, "preempt_skipped", logging.INFO, epoch=self.epoch,
                          job=job_id, why="finished during the grace period")
                continue
            self._write("requeue", job_id, self.api.requeue_hold,
                        nodes=[self.node_names[k] for k, _ in view.rows])

    def _release_unsteered(self, u: Unsteered, epoch: int) -> None:
        job_id = u.job.job_id
        if u.record.state != "unsteered":
            rec = u.record.with_(epoch=epoch, state="unsteered", place=(), why=u.why)
            self._write("unsteer", job_id, self.api.update_job, {"AdminComment": rec.encode()},
                        why=u.why)
        if held_by_hadar(u.job):
            self._write("release", job_id, self.api.release)

