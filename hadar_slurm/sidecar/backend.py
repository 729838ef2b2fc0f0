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

HadarE (:mod:`hadar_slurm.sidecar.fork`): a job with the hint ``fork=N`` may be placed as ``k``
copies (rows of the decision with copy indices ``0..k-1``, one node each).  The job itself then
stays held, with ``Dependency=afterany:K``, while its copies run as the heterogeneous job ``K``
(components commented ``hadar-copy-of=J``), submitted as the job's owner; the snapshot shows the
copies as the job's current placement.  A decision that changes the copies ends them (checkpoint
signal to their steps, grace period, ``scancel``) and places the job anew in the same epoch (the
dependency keeps it, or the new copies, from starting before the old copies are gone).  When the
copies end by themselves the job runs unforked (its runtime finishes from the tracker's state).
A fork that cannot be made is logged and recorded (``why=``), and the job is placed unforked on
copy 0's node instead; a fork whose job is gone is cancelled.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hadar_slurm.errors import InputError
from hadar_slurm.hetjob import CopySpec, ForkPlan, render_hetjob
from hadar_slurm.hints import Hints, ModelCatalog, is_hadar_comment, parse_hints
from hadar_slurm.logs import log_event
from hadar_slurm.loop import Action
from hadar_slurm.policy.base import Decision, Placement, Snapshot
from hadar_slurm.sidecar import fork as hadare
from hadar_slurm.sidecar.api import DryRunApi, SlurmApi
from hadar_slurm.sidecar.fork import CopyGroup, ForkError, Progress
from hadar_slurm.sidecar.learn import Knowledge, SlurmRun
from hadar_slurm.sidecar.record import MAX_ARGS_BYTES, JobRecord, decode, mark
from hadar_slurm.slurm import SlurmError, SlurmJob, SlurmNode, SlurmTimeoutError
from hadar_slurm.slurm.parse import FINAL_STATES, PENDING_STATES, RUNNING_STATES
from hadar_slurm.store import StoreDamagedError
from hadar_slurm.throughputs import ThroughputTable

#: Node states (base) whose GPUs may be handed out, and flags that take a node out.
NODE_USABLE = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
NODE_BAD_FLAGS = frozenset({
    "DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "MAINTENANCE", "FAIL", "POWER_DOWN",
    "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED", "INVALID_REG",
})
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
#: job_submit.lua's admin comment on a hadar job it holds for the sidecar, and on one its user
#: submitted held (``sbatch --hold``), which the sidecar leaves alone until the user releases it.
SUBMIT_HELD = "hadar: held for the sidecar"  # (by job_submit.lua of earlier versions)
SUBMIT_USER_HELD = "hadar: held by its user"
#: job_submit.lua's admin comment on a hadar job that waits for the sidecar *parked*: pending
#: with a begin time years ahead (not held, so that a hold of its user's shows as JobHeldUser).
SUBMIT_WAIT = "hadar: waits for the sidecar"
#: A pending job whose begin time is further ahead than this is parked for the sidecar, which
#: starts it with ``StartTime=now`` when it places it.
PARK_HORIZON_S = 30 * 86400.0
#: Records of a job the sidecar is moving (:meth:`SlurmBackend._preempt`).
MOVE_STATES = frozenset({"preempting", "preempted"})
#: The exit status with which a job says "checkpointed on the preemption signal, run me again"
#: (EX_TEMPFAIL; hadar_slurm.runtime exits so).  A job the sidecar preempts that ends with it
#: during the grace period is requeued held like one still running, not taken for finished.
CHECKPOINT_EXIT = 75
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
    # HadarE
    row_copy: tuple[int, ...] = ()  # copy index of each of ``rows`` (() when not forked)
    group: CopyGroup | None = None  # its copies, while they wait or run
    max_copies: int = 1  # the most copies the policy may fork it into
    fork_blocked: str = ""  # why it cannot be forked now ("" when it can, or did not ask)
    tracker: str = ""  # its tracker directory ("" when it did not ask to be forked)
    progress: Progress | None = None  # the tracker's progress.json, when there is one
    # where each of ``rates`` came from (Knowledge.source: table/imported/measured/learned/
    # estimated; "" for no rate)
    rate_sources: tuple[str, ...] = ()
    parked: bool = False  # waits for the sidecar by its begin time (is_parked), not held

    @property
    def job_id(self) -> int:
        return self.job.job_id

    @property
    def held(self) -> bool:
        return self.job.held

    @property
    def forked_running(self) -> bool:
        return self.group is not None and self.group.running

    def copy_rows(self) -> list[tuple[tuple[int, int], ...]]:
        """Its current copies as sorted tuples of rows, in a canonical order (for comparing
        with a decision regardless of how copies are numbered)."""
        by_copy: dict[int, list[tuple[int, int]]] = {}
        for k, row in enumerate(self.rows):
            by_copy.setdefault(self.row_copy[k] if self.row_copy else 0, []).append(row)
        return sorted(tuple(sorted(r)) for r in by_copy.values())


@dataclass
class Unsteered:
    """A hadar job the sidecar will not steer; it goes to Slurm's own scheduler."""

    job: SlurmJob
    record: JobRecord
    why: str
    parked: bool = False


@dataclass
class GroupEnd:
    """A fork to end this epoch: ``view`` is its job (None when the job is gone)."""

    group: CopyGroup
    view: JobView | None
    why: str


@dataclass
class EpochStats:
    read_s: float = 0.0
    apply_s: float = 0.0
    commands_read: int = 0
    commands_apply: int = 0
    applied: list[dict[str, object]] = field(default_factory=list)


def held_by_hadar(job: SlurmJob) -> bool:
    """Held, and by hadar, not by its user (a user's own hold is respected).  hadar's holds:

    * ``JobHeldAdmin``: only an operator (the sidecar) holds so;
    * ``SPECIAL_EXIT``: slurmctld held it after a checkpoint exit (``RequeueExitHold=75``);
    * ``JobHeldUser`` on a job whose record says the sidecar is moving it (``scontrol
      requeuehold`` also shows as ``JobHeldUser``), or with :data:`SUBMIT_HELD`, the mark of an
      earlier job_submit.lua that held hadar jobs (today's parks them: :func:`is_parked`).

    Any other ``JobHeldUser`` is the user's: ``sbatch --hold`` (the plugin marks it
    :data:`SUBMIT_USER_HELD`), or ``scontrol hold`` on a parked job, or on one the sidecar had
    released."""
    if mark(job.admin_comment) == SUBMIT_USER_HELD:
        return False  # (whatever the reason: a job an operator submitted held is JobHeldAdmin)
    if job.state == "SPECIAL_EXIT":
        return True
    if job.state not in PENDING_STATES or job.state_reason not in HELD_REASONS:
        return False
    if job.state_reason == "JobHeldAdmin":
        return True
    if mark(job.admin_comment) == SUBMIT_HELD:
        return True
    return decode(job.admin_comment).state in MOVE_STATES


def held_by_user(job: SlurmJob) -> bool:
    """Held by its user (see :func:`held_by_hadar`)."""
    return job.held and not held_by_hadar(job)


def is_parked(job: SlurmJob, now: float) -> bool:
    """Pending, not held, with a begin time beyond :data:`PARK_HORIZON_S`: job_submit.lua's
    way of keeping a hadar job for the sidecar."""
    return (job.state in PENDING_STATES and not job.held and job.eligible_time is not None
            and job.eligible_time > now + PARK_HORIZON_S)


def move_left_ended(job: SlurmJob) -> bool:
    """A job the sidecar was moving (record ``preempting``) that ended without being requeued:
    it failed during its grace period (e.g. died of the checkpoint signal), or exited with the
    checkpoint status on a Slurm that does not requeue it by itself.  It is requeued, never
    left failed.  A job its user cancelled, or that hit its time limit, stays ended."""
    if decode(job.admin_comment).state != "preempting":
        return False
    return job.state == "FAILED" or (
        job.state == "COMPLETED" and job.exit_code == CHECKPOINT_EXIT)


def _error_text(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


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
        should_stop: Callable[[], bool] = lambda: False, tracker_root: str | None = None,
        knowledge: Knowledge | None = None, migration_s: float = 0.0,
    ) -> None:
        """``table``: the base throughput table; ``knowledge``: what the sidecar knows over it
        (a store, online learning, estimates; :mod:`hadar_slurm.sidecar.learn`), by default
        ``table`` with in-memory estimates; ``migration_s``: what a move costs a job (the
        config's ``[scheduler] migration_s``), told to the policy in every snapshot."""
        self.api = api
        self.migration_s = migration_s
        self.knowledge = knowledge if knowledge is not None else Knowledge(table)
        self.catalog = catalog if catalog is not None else ModelCatalog.from_table(table)
        self.partition = partition
        self.preempt_grace_s = preempt_grace_s
        self.preempt_signal = preempt_signal
        self._sleep = sleep
        self._should_stop = should_stop
        self.tracker_root = tracker_root
        self.views: dict[int, JobView] = {}
        self.unsteered: list[Unsteered] = []
        self.groups: dict[int, list[CopyGroup]] = {}  # every fork in the last read, by job
        self.orphans: list[GroupEnd] = []  # forks whose job is gone (or has a newer fork)
        self.copy_ids: set[int] = set()  # the components of ``groups``
        self._untrusted_seen: set[int] = set()  # forged forks already logged (by leader)
        #: Running hadar jobs that may not be stopped (``preempt=never``): they run where
        #: they are, outside the policy's snapshot.
        self.pinned: dict[int, JobView] = {}
        #: Jobs that a move left ended (FAILED during the grace, or a checkpoint exit on a
        #: Slurm without ``RequeueExitHold=75``): requeued this epoch.
        self.moves_left: list[SlurmJob] = []
        self.user_held: list[int] = []  # hadar jobs their users hold
        #: Per-job errors of the last epoch: ``(stage, job, error)``.
        self.job_errors: list[tuple[str, int, str]] = []
        self.node_names: tuple[str, ...] = ()
        self.node_type_names: tuple[str, ...] = ()
        self._node_type: dict[str, str] = {}  # node name -> its GPU type (last snapshot)
        self.gpu_types: tuple[str, ...] = ()
        self.jobs: list[SlurmJob] = []
        self.nodes: list[SlurmNode] = []
        self.stats = EpochStats()
        self.epoch = -1
        self.writes = 0
        #: Jobs whose end frees GPUs (:meth:`ended_since_epoch`): those on GPU nodes that ran
        #: at the last epoch and were not stopped by it, and those it placed or forked.
        self.watch: set[int] = set()
        crash = os.environ.get(CRASH_ENV, "")
        self._crash_after = int(crash) if crash.isdigit() else None

    @property
    def table(self) -> ThroughputTable:
        """The throughputs the policy plans with this epoch."""
        return self.knowledge.table

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
        # what was learned up to the last epoch plans this one (and estimates fill the gaps)
        self.knowledge.gpu_types = tuple(types)
        self.knowledge.refresh()
        self.node_names = tuple(n.name for n in nodes)
        self.node_type_names = tuple(n.gpu_type or "" for n in nodes)
        self._node_type = dict(zip(self.node_names, self.node_type_names, strict=True))
        node_index = {name: k for k, name in enumerate(self.node_names)}

        views: dict[int, JobView] = {}
        self.unsteered = []
        self.job_errors = []
        self.pinned = {}
        self.moves_left = []
        self.user_held = []
        active = self._sort_groups()
        hadar_on_node = np.zeros(len(nodes), dtype=np.int64)
        other_on_node = np.zeros(len(nodes), dtype=np.int64)

        def count(on_node: np.ndarray, job: SlurmJob) -> None:
            if job.state in RUNNING_STATES:
                for name in job.node_names:
                    if name in node_index:
                        on_node[node_index[name]] += job.gpus_per_node

        for job in sorted(self.jobs, key=lambda j: j.job_id):
            if job.job_id in self.copy_ids:
                # a copy of a forked job (one the sidecar made): its GPUs are hadar's (the
                # job's, or a fork's that is cancelled this epoch), never another user's
                count(hadar_on_node, job)
                continue
            if not is_hadar_comment(job.comment) or (
                    self.partition is not None and job.partition != self.partition):
                count(other_on_node, job)
                continue
            if job.state not in RUNNING_STATES and job.state not in PENDING_STATES:
                if move_left_ended(job):
                    self.moves_left.append(job)
                continue
            if held_by_user(job):
                self.user_held.append(job.job_id)
                continue  # the user holds it: not ours to start
            try:
                view = self._view(job, now, node_index, active.get(job.job_id))
            except StoreDamagedError:
                raise  # the store's, not the job's: the controller plans without the store
            except Exception as exc:  # one job must not stop the epoch
                self._job_error("read", job.job_id, exc)
                self._unsteer(job, decode(job.admin_comment), now,
                              f"sidecar error: {_error_text(exc)}")
                count(other_on_node, job)
                continue
            if view is None:
                count(other_on_node, job)  # (a running job the sidecar does not steer)
                continue
            view.parked = is_parked(job, now)
            if view.running and view.group is None and (
                    view.hints.preempt_mode == "never" and view.record.state not in MOVE_STATES):
                # it may not be stopped: it runs where it is, its GPUs are not the policy's
                self.pinned[job.job_id] = view
                count(other_on_node, job)
                continue
            if view.running:
                for k, c in view.rows:
                    hadar_on_node[k] += c
            views[job.job_id] = view
        self.views = views
        self.knowledge.forget(j.job_id for j in self.jobs)

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
        cur_copy: list[int] = []
        for v in ordered:
            for r, (k, c) in enumerate(v.rows):
                cur_job.append(v.job_id)
                cur_node.append(k)
                cur_count.append(c)
                cur_copy.append(v.row_copy[r] if v.row_copy else 0)
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
                              np.array(cur_count, dtype=np.int64),
                              np.array(cur_copy, dtype=np.int64)),
            policy_state=policy_state,
            max_copies=np.array([v.max_copies for v in ordered], dtype=np.int64),
            # a copy is one component of a heterogeneous job, on one node
            multi_node_copies=False, migration_s=self.migration_s,
        )

    def _sort_groups(self) -> dict[int, CopyGroup]:
        """The forks of the last read that the sidecar made (:meth:`_made_here`; a job that
        only carries a ``hadar-copy-of=`` comment is an ordinary job): each job's live one (the
        fork its record names, or the newest one it was submitting), and those to cancel
        (``orphans``): forks of a job that is gone, finished or runs itself, and other live
        forks of a job (older ones, or one its record no longer names)."""
        found = hadare.find_groups(self.jobs)
        by_id = {j.job_id: j for j in self.jobs}
        self.groups = {}
        self.orphans = []
        active: dict[int, CopyGroup] = {}
        for original, groups in found.items():
            job = by_id.get(original)
            rec = decode(job.admin_comment) if job is not None else JobRecord()
            ours = [g for g in groups if self._made_here(job, rec, g)]
            for g in groups:
                if g not in ours and g.leader not in self._untrusted_seen:
                    self._untrusted_seen.add(g.leader)
                    log_event(logger, "copy_untrusted", logging.WARNING, job=g.leader,
                              copy_of=original, user=g.components[0].user,
                              why="not a fork the sidecar submitted (owner, script or job id "
                              "differ): treated as an ordinary job")
            if ours:
                self.groups[original] = ours
            live = [g for g in ours if g.live]
            if not live:
                continue
            if job is None or job.state not in PENDING_STATES:
                what = ("is gone" if job is None else
                        "runs itself" if job.state in RUNNING_STATES else
                        f"ended ({job.state})")
                self.orphans.extend(GroupEnd(g, None, f"job {original} {what}") for g in live)
                continue
            if rec.state == "forked":
                named = [g for g in live if g.leader == rec.group]
            elif rec.state == "forking":
                named = [g for g in live if g.leader > rec.group][-1:]
            else:
                named = []
            if named:
                active[original] = named[-1]
            self.orphans.extend(
                GroupEnd(g, None, f"job {original} has a newer fork, hetjob {named[-1].leader}"
                         if named else f"job {original} no longer runs as hetjob {g.leader}")
                for g in live if not named or g is not named[-1])
        self.copy_ids = {c.job_id for gs in self.groups.values() for g in gs
                         for c in g.components}
        return active

    def _made_here(self, job: SlurmJob | None, rec: JobRecord, group: CopyGroup) -> bool:
        """Whether ``group`` is a fork the sidecar submitted for ``job``: ``job`` is a hadar
        job, every component is its owner's and runs the plan the sidecar wrote into its tracker
        directory, and, while the job's record names a fork, none newer than that one.  (A
        comment ``hadar-copy-of=J`` alone is something any user can write.)"""
        if job is None or not is_hadar_comment(job.comment):
            return False
        if any(c.user != job.user for c in group.components):
            return False
        try:
            plan = os.path.join(hadare.tracker_dir(job, self.tracker_root), hadare.PLAN_FILE)
        except ForkError:
            return False
        if not all(c.command == plan or c.command.startswith(plan + " ")
                   for c in group.components):
            return False
        return not (rec.state == "forked" and group.leader > rec.group)

    def _view(self, job: SlurmJob, now: float, node_index: dict[str, int],
              group: CopyGroup | None = None) -> JobView | None:
        record = decode(job.admin_comment)
        running = job.state in RUNNING_STATES
        gpus = record.gpus or job.gpus_per_node * max(1, len(job.node_names) if running else 1)
        gpus = max(gpus, 1)
        try:
            hints = parse_hints(job.comment, self.catalog, gpus=gpus)
        except InputError as exc:
            self._unsteer(job, record, now, f"bad hints: {exc.one_line()}")
            return None
        rates = tuple(self.table.rate(hints.job_type, gpus, t) for t in self.gpu_types)
        if not any(r > 0 for r in rates):
            self._unsteer(job, record, now, f"no GPU type of this cluster "
                          f"({', '.join(self.gpu_types)}) has a throughput for {hints.job_type} "
                          f"on {gpus} GPU(s)")
            return None
        if record.state == "unsteered":
            return None  # released to Slurm's own scheduler earlier; stays so
        if record.state in ("forked", "forking") and group is None:
            record = self._fork_gone(job, record)
        tracker, progress = "", None
        if hints.fork > 1 or group is not None:
            try:
                tracker = hadare.tracker_dir(job, self.tracker_root)
            except ForkError:
                tracker = ""
            progress = hadare.read_progress(tracker) if tracker else None
        done = record.done
        attained = dict(record.attained)
        rows: list[tuple[int, int]] = []
        row_copy: list[int] = []
        if group is not None:
            for index, name, count in group.copies():
                if name in node_index:
                    rows.append((node_index[name], count or gpus))
                    row_copy.append(index)
            start = group.start_time()
            if start is not None:
                run_s = max(0.0, now - max(start, record.until))
                used = [self.node_type_names[k] for k, _ in rows]
                if run_s > 0:
                    done += sum(rates[self.gpu_types.index(t)] for t in used) * run_s
                    for t in used:
                        attained[t] = attained.get(t, 0.0) + run_s
        elif running:
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
        if progress is not None:
            done = progress.done  # the tracker counts every iteration, forked or not
        if self.knowledge.store is not None and self.knowledge.learn and (
                running or group is not None):
            self._learn(job, hints.job_type, gpus, now, group, tracker, progress)
        blocked = self._fork_blocked(job, hints, record, group) if hints.fork > 1 else ""
        order = sorted(range(len(rows)), key=lambda k: (row_copy[k] if row_copy else 0, rows[k]))
        return JobView(
            job, hints, record, gpus, running, tuple(rows[k] for k in order), done, attained,
            rates, row_copy=tuple(row_copy[k] for k in order) if row_copy else (),
            group=group, max_copies=hints.fork if hints.fork > 1 and not blocked else 1,
            fork_blocked=blocked, tracker=tracker, progress=progress,
            rate_sources=tuple(self.knowledge.source(hints.job_type, gpus, t)
                               for t in self.gpu_types))

    def _learn(self, job: SlurmJob, job_type: str, gpus: int, now: float,
               group: CopyGroup | None, tracker: str, progress: Progress | None) -> None:
        """Fold what a running job (or its copies) achieved into the store: its runtime's
        progress.json, in its tracker dir (a fork's: under ``tracker_root``; an unforked job's:
        under its working directory, where the runtime writes it), checked against what Slurm
        says of each copy (:class:`~hadar_slurm.sidecar.learn.SlurmRun`: the GPU type of the
        node a running component, or the unforked job, runs on, and when it started).
        ``tracker``/``progress``: the dir the view already read (if any), not read again."""
        if group is None:
            try:
                own = hadare.tracker_dir(job, None)
            except ForkError:
                return
            if own != tracker:
                progress = hadare.read_progress(own)
        if progress is None:
            return
        parts = [(0, job)] if group is None else [
            (c.het_job_offset if c.het_job_offset is not None else k, c)
            for k, c in enumerate(group.components)]
        ran: dict[int, SlurmRun] = {}
        for index, part in parts:
            used = {self._node_type.get(name, "") for name in part.node_names}
            if part.state in RUNNING_STATES and part.start_time and len(used) == 1 \
                    and "" not in used:
                ran[index] = SlurmRun(used.pop(), float(part.start_time))
        self.knowledge.observe(job.job_id, job_type, gpus, progress, ran, now=now)

    def _fork_gone(self, job: SlurmJob, record: JobRecord) -> JobRecord:
        """The record of a job whose fork no longer waits or runs.  Its copies ended by
        themselves (or someone else cancelled them): it runs unforked from now on, and its
        runtime finishes from the tracker's state.  For a fork the sidecar was about to submit
        (``forking``: it died before it recorded the fork, or sbatch timed out), the copies are
        those of a fork newer than the one named in the record; when there are none, the fork
        was never submitted and the job waits as before."""
        groups = self.groups.get(job.job_id, ())
        if record.state == "forked":
            ended = [g for g in groups if g.leader == record.group]
        else:
            ended = [g for g in groups if g.leader > record.group][-1:]
            if not ended:
                return record.with_(state="held", place=(), group=0, copies=0)
        leader = ended[0].leader if ended else record.group
        how = ("completed" if ended and ended[0].completed else
               "ended " + "/".join(sorted({c.state for c in ended[0].components}))
               if ended else "ended")
        return record.with_(state="held", place=(), group=0, copies=0, nofork=True,
                            why=f"its copies (hetjob {leader}) {how}: it finishes unforked")

    def _fork_blocked(self, job: SlurmJob, hints: Hints, record: JobRecord,
                      group: CopyGroup | None) -> str:
        """Why ``job`` cannot be forked (into more than one copy) now; "" when it can."""
        if record.nofork:
            return record.why or "a fork of it failed, or its copies ended: it finishes unforked"
        if not self.api.can_fork:
            return f"the {self.api.name} backend cannot fork jobs (use the cli backend)"
        ours = {g.leader for g in self.groups.get(job.job_id, ())}
        alive = {j.job_id for j in self.jobs if j.state not in FINAL_STATES}
        waits = [d for d in hadare.dependency_jobs(job.dependency)
                 if d not in ours and d in alive]
        if waits and group is None:
            return f"it waits for its dependency ({job.dependency})"
        if record.args is None and group is None:
            return ("its script's arguments were not recorded when it was submitted "
                    "(job_submit.lua records them in the admin comment, up to "
                    f"{MAX_ARGS_BYTES} bytes): it runs unforked")
        try:
            hadare.tracker_dir(job, self.tracker_root)
            hadare.owner_of(job)
        except ForkError as exc:
            return str(exc)
        return ""

    def _unsteer(self, job: SlurmJob, record: JobRecord, now: float, why: str) -> None:
        if job.state in PENDING_STATES:
            self.unsteered.append(Unsteered(job, record, why, is_parked(job, now)))

    # -- applying ------------------------------------------------------------------------

    def apply(self, decision: Decision, actions: list[Action], now: float) -> None:
        """Make Slurm run ``decision`` (``actions``, the loop's diff, says the same per job;
        the copies of a decision are read from it directly)."""
        before = self.api.commands
        t0 = time.perf_counter()
        epoch = decision.epoch
        wanted = decision.placement.by_job_copies()
        preempt: list[JobView] = []
        ends: list[GroupEnd] = list(self.orphans)
        keep: list[JobView] = []
        place: list[tuple[JobView, tuple[tuple[int, int], ...]]] = []
        forks: list[tuple[JobView, dict[int, list[tuple[int, int]]], CopyGroup | None]] = []
        waiting: list[JobView] = []
        for view in self.views.values():
            copies = wanted.get(view.job_id)
            after = view.group
            if view.group is not None:
                if copies is not None and len(copies) >= 2 and _same_copies(view, copies):
                    keep.append(view)
                    continue
                ends.append(GroupEnd(view.group, view, _end_why(copies)))
            elif view.running:
                if view.record.state == "preempting" or copies is None or len(copies) >= 2 or (
                        view.rows != tuple(sorted(next(iter(copies.values()))))):
                    # a move (or one begun before a restart): stop now, placed again later
                    preempt.append(view)
                continue
            if copies is None:
                waiting.append(view)
            elif len(copies) == 1:
                place.append((view, tuple(sorted(next(iter(copies.values()))))))
            else:
                forks.append((view, copies, after))

        stopping = {v.job_id for v in preempt} | {
            c.job_id for e in ends for c in e.group.components}
        gpu_nodes = {n.name for n in self.nodes if n.gpus > 0}
        self.watch = {j.job_id for j in self.jobs if j.state in RUNNING_STATES
                      and gpu_nodes.intersection(j.node_names) and j.job_id not in stopping}
        self.watch.update(view.job_id for view, _ in place)
        # Every job's changes are guarded: an error with one job is logged with it (event
        # job_error) and the epoch goes on with the others.
        for job in self.moves_left:
            self._guard("requeue", job.job_id, self._requeue_left, job, epoch)
        for u in self.unsteered:
            self._guard("unsteer", u.job.job_id, self._release_unsteered, u, epoch)
        for view in keep:
            self._guard("keep_fork", view.job_id, self._keep_fork, view, epoch)
        if preempt or ends:
            self._preempt(preempt, ends, epoch, now)
        for view, rows in place:
            self._guard("place", view.job_id, self._place, view, rows, epoch, decision)
        for view, copies, after in forks:
            self._guard("fork", view.job_id, self._fork, view, copies, epoch, decision, after)
        for view in waiting:
            self._guard("wait", view.job_id, self._keep_waiting, view, epoch)
        self.stats.apply_s = time.perf_counter() - t0
        self.stats.commands_apply = self.api.commands - before

    def next_epoch_start(self, now: float, round_s: float) -> float | None:
        return None if self._should_stop() else now + round_s

    def ended_since_epoch(self) -> list[int]:
        """The jobs of :attr:`watch` that have ended (one light ``squeue`` of the live jobs'
        ids; none when nothing is watched): their GPUs are free now, which is worth an epoch
        before the round is over (``[scheduler] reschedule_on_finish``).  A placed job that
        has not started yet is live, so it is no reason."""
        if not self.watch:
            return []
        return sorted(self.watch - self.api.live_job_ids())

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
        """An unexpected error while reading or applying one job: a ``job_error`` event (with
        where it happened), and the epoch goes on without the job."""
        where = [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                 for f in traceback.extract_tb(exc.__traceback__)][-4:]
        text = _error_text(exc)
        self.job_errors.append((stage, job_id, text))
        log_event(logger, "job_error", logging.ERROR, epoch=self.epoch, job=job_id,
                  stage=stage, error=text, where=where)

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
        self._did(what, view_id, **fields)
        return True

    def _did(self, what: str, view_id: int, **fields: object) -> None:
        """Log a change made to Slurm (and count it, for the crash drill)."""
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

    def _rows_text(self, rows: Sequence[tuple[int, int]]) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((self.node_names[k], c) for k, c in rows))

    def _place(self, view: JobView, rows: tuple[tuple[int, int], ...], epoch: int,
               decision: Decision, why: str = "") -> None:
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
        already = rec.state == "placed" and rec.place == place and not why
        if not already:
            if not self._take_hold(view):
                return
            per_node = counts.pop()
            fields: dict[str, str] = {}
            if (len(place) > 1 or len(rec.place) > 1 or view.repair
                    or view.job.gpus_per_node != per_node):
                # (22.05 ignores an update of Gres=; TresPerNode= works)
                fields["NumNodes"] = str(len(place))
                fields["TresPerNode"] = f"gres:gpu:{per_node}"
            fields["NodeList"] = ",".join(n for n, _ in place)
            fields["Features"] = "|".join(types)
            if view.parked:
                fields["StartTime"] = "now"  # (its begin time kept it for the sidecar)
            fields["AdminComment"] = rec.with_(
                epoch=epoch, state="placed", place=place, gpus=view.gpus, group=0, copies=0,
                why=why or (rec.why if rec.nofork else "")).encode()
            if not self._write("place", job_id, self.api.update_job, fields,
                               nodes=[n for n, _ in place], gpu_type="|".join(types),
                               gpus=view.gpus):
                return
        if view.held:
            self._write("release", job_id, self.api.release)

    def _take_hold(self, view: JobView) -> bool:
        """Before the sidecar writes its record on a job held with a user hold (the plugin's at
        submit, a requeue-hold, slurmctld's ``SPECIAL_EXIT``), the hold is made its own
        (``scontrol hold`` by an operator: ``JobHeldAdmin``): a sidecar that dies between the
        record and the release must not leave a job that looks held by its user
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
        if (view.held or view.parked) and view.record.state != "placed":
            return  # (it waits as job_submit.lua left it, or held by the sidecar)
        if not view.held:
            if not self._write("hold", job_id, self.api.hold):
                return
        elif not self._take_hold(view):
            return
        rec = view.record.with_(epoch=epoch, state="held", place=(), gpus=view.gpus, group=0,
                                copies=0)
        self._write("record", job_id, self.api.update_job, {"AdminComment": rec.encode()})

    def _preempt(self, views: list[JobView], ends: list[GroupEnd], epoch: int,
                 now: float) -> None:
        """Stop running jobs to move them, and end forks (checkpoint signal to the copies'
        steps, the grace period, cancel).

        A move is a small state machine kept in Slurm, so that it finishes whatever happens to
        the sidecar or to slurmctld on the way (a restarted sidecar, or the next epoch, carries
        on from the job's record):

        1. the record ``state=preempting deadline=T`` is written first (nothing is stopped if
           Slurm does not take it);
        2. ``preempt=checkpoint``: the checkpoint signal, then the grace period (until ``T``);
           the job saves its state and exits 75, and slurmctld itself requeues it held
           (``RequeueExitHold=75`` in slurm.conf): it never shows FAILED, so a dependent job
           never sees it fail.  ``preempt=requeue``: no signal, no grace;
        3. what still runs is requeued held (``scontrol requeuehold``: Slurm's own SIGTERM,
           ``KillWait``, SIGKILL, and the requeue in one step); a job that ended FAILED during
           its grace (killed by the signal), or exited 75 on a Slurm without
           ``RequeueExitHold``, is requeued held too (Slurm requeues finished batch jobs); one
           that completed (exit 0), was cancelled by its user or ran out of time stays ended;
        4. the record becomes ``preempted``; the job is placed again in a later epoch.

        Jobs with ``preempt=never`` (the default of a job that did not say it checkpoints) are
        never given to this: they run where they are (:attr:`pinned`)."""
        deadline = now + self.preempt_grace_s
        signaled: list[JobView] = []
        requeue_now: list[JobView] = []
        for view in views:
            self._guard("preempt", view.job_id, self._begin_move, view, epoch, now, deadline,
                        signaled, requeue_now)
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
            self._guard("requeue", view.job_id, self._requeue, view.job_id, view.record, epoch)
        wait = max([v.record.deadline for v in signaled]
                   + ([deadline] if copies_signaled else [])) - now if (
                       signaled or copies_signaled) else 0.0
        if wait > 0 and not isinstance(self.api, DryRunApi):
            self._sleep(wait)  # (a dry run signaled nobody)
        if not signaled and not ends:
            return
        # One more read: what ended during the grace period, and how.
        try:
            jobs = self.api.read_jobs()
        except SlurmError as exc:
            log_event(logger, "action_failed", logging.WARNING, epoch=self.epoch,
                      action="read_jobs", error=str(exc))
            return  # the next epoch finishes the moves (their records say preempting)
        by_id = {j.job_id: j for j in jobs}
        live = {j.job_id for j in jobs if j.state in hadare.LIVE_STATES}
        for end in ends:
            g = end.group
            if not any(c.job_id in live for c in g.components):
                log_event(logger, "cancel_skipped", logging.INFO, epoch=self.epoch,
                          job=g.leader, copy_of=g.original, why="its copies already ended")
                continue
            self._write("cancel_copies", g.leader, self.api.cancel, copy_of=g.original,
                        why=end.why)
        for view in signaled:
            self._guard("preempt", view.job_id, self._end_move, view, by_id.get(view.job_id),
                        epoch)

    def _begin_move(self, view: JobView, epoch: int, now: float, deadline: float,
                    signaled: list[JobView], requeue_now: list[JobView]) -> None:
        """Steps 1 and 2 of a move (:meth:`_preempt`) for one running job."""
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
                           {"AdminComment": rec.encode()}, state="preempting", mode=mode):
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
            log_event(logger, "preempt_skipped", logging.WARNING, epoch=self.epoch, job=job_id,
                      why="gone from Slurm during the grace period")
            return
        if job.state in RUNNING_STATES or move_left_ended(job):
            self._requeue(job_id, view.record, epoch)
        elif job.state in PENDING_STATES:
            # back in the queue by itself: slurmctld requeued its checkpoint exit
            rec = view.record.with_(state="preempted")
            self._write("record", job_id, self.api.update_job, {"AdminComment": rec.encode()},
                        state="preempted", slurm_state=job.state)
        else:
            log_event(logger, "preempt_skipped", logging.INFO, epoch=self.epoch, job=job_id,
                      why=f"ended {job.state} (exit {job.exit_code}) during the grace period")

    def _requeue(self, job_id: int, record: JobRecord, epoch: int) -> None:
        """``scontrol requeuehold`` (a running job gets Slurm's SIGTERM, KillWait, SIGKILL; a
        finished one is put back), then the record ``preempted``."""
        nodes = [n for n, _ in record.place]
        if self._write("requeue", job_id, self.api.requeue_hold, **(
                {"nodes": nodes} if nodes else {})):
            rec = record.with_(epoch=max(epoch, record.epoch), state="preempted")
            self._write("record", job_id, self.api.update_job, {"AdminComment": rec.encode()},
                        state="preempted")

    def _requeue_left(self, job: SlurmJob, epoch: int) -> None:
        """A job a move left ended (:func:`move_left_ended`): requeued held."""
        log_event(logger, "move_resumed", logging.WARNING, epoch=self.epoch, job=job.job_id,
                  slurm_state=job.state, exit_code=job.exit_code,
                  why="it ended during a move without being requeued")
        self._requeue(job.job_id, decode(job.admin_comment), epoch)

    # -- HadarE ------------------------------------------------------------------------------

    def _keep_fork(self, view: JobView, epoch: int) -> None:
        """The job's copies run (or wait) where the decision wants them: make sure the job
        records them, waits for them and stays held.  A fork the sidecar submitted but never
        recorded (it died in between) is adopted here."""
        g = view.group
        assert g is not None
        job_id = view.job_id
        rec = view.record
        place = self._rows_text(view.rows)
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

    def _fork(self, view: JobView, copies: dict[int, list[tuple[int, int]]], epoch: int,
              decision: Decision, after: CopyGroup | None) -> None:
        """Fork the (pending) job into ``copies``: its batch script and hints saved in its
        tracker directory, one heterogeneous job submitted as its owner, the fork recorded on
        the job, which stays held with ``Dependency=afterany:K``.  ``after``: an earlier fork
        being cancelled, which the new copies wait for."""
        job = view.job
        job_id = view.job_id
        order = sorted(copies)
        rows0 = tuple(sorted(copies[order[0]]))
        if view.fork_blocked:
            self._fork_failed(view, rows0, epoch, decision, f"not forked: {view.fork_blocked}")
            return
        if not (view.held or view.parked):
            # released by an earlier epoch and not started yet: hold it, fork it next epoch
            if self._write("hold", job_id, self.api.hold):
                rec = view.record.with_(epoch=epoch, state="held", place=(), gpus=view.gpus)
                self._write("record", job_id, self.api.update_job,
                            {"AdminComment": rec.encode()})
            return
        if not self._take_hold(view):
            return
        try:
            specs: list[CopySpec] = []
            for i in order:
                rows = copies[i]
                if len(rows) != 1:
                    raise ForkError(f"copy {i} spans {len(rows)} nodes (a copy runs on one)")
                k, count = rows[0]
                specs.append(CopySpec(self.node_names[k], self.node_type_names[k], int(count)))
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
                cpus_per_task=job.cpus_per_node if (job.cpus_per_node or 1) > 1 else None)
            text = render_hetjob(plan)
        except (ForkError, InputError) as exc:
            msg = exc.one_line() if isinstance(exc, InputError) else str(exc)
            self._fork_failed(view, rows0, epoch, decision, f"fork failed: {msg}")
            return
        nodes = [c.node for c in specs]
        detail: dict[str, object] = {"copies": len(specs), "nodes": nodes,
                                     "gpu_types": [c.gpu_type for c in specs],
                                     "tracker": tracker}
        if isinstance(self.api, DryRunApi):
            self._did("fork", job_id, **detail)
            return
        try:
            script = self.api.batch_script(job_id)
            hadare.write_files(owner, tracker, {
                hadare.SCRIPT_FILE: script, hadare.HINTS_FILE: job.comment.strip() + "\n",
                hadare.PLAN_FILE: text})
        except (SlurmError, ForkError) as exc:
            self._fork_failed(view, rows0, epoch, decision, f"fork failed: {exc}")
            return
        # The intent first: a sidecar that dies between sbatch and the record below finds the
        # copies by their comment (and knows, from the newest fork named here, which copies
        # are those of this fork, even once they have ended).
        place = tuple(sorted((c.node, c.gpus) for c in specs))
        known = [g.leader for g in self.groups.get(job_id, ())]
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
            log_event(logger, "fork_failed", logging.WARNING, epoch=self.epoch, job=job_id,
                      why=why, fallback="held")
            decision.detail[job_id] = why
            self._write("record", job_id, self.api.update_job,
                        {"AdminComment": intent.with_(nofork=True, why=why).encode()}, why=why)
            return
        except SlurmError as exc:
            self._fork_failed(view, rows0, epoch, decision, f"fork failed: {exc}")
            return
        self._did("fork", job_id, group=leader, **detail)
        self.watch.update(leader + k for k in range(len(specs)))  # the components' own ids
        self.copy_ids.update(leader + k for k in range(len(specs)))
        rec = intent.with_(state="forked", group=leader)
        self._write("record", job_id, self.api.update_job,
                    {"AdminComment": rec.encode(), "Dependency": f"afterany:{leader}"},
                    group=leader)

    def _fork_failed(self, view: JobView, rows0: tuple[tuple[int, int], ...], epoch: int,
                     decision: Decision, why: str) -> None:
        """A fork that cannot be made: say why (log, decision detail, the job's record, which
        also stops further forks of it) and place the job unforked on copy 0's node instead,
        in this epoch."""
        job_id = view.job_id
        why = " ".join(why.split())
        if len(why) > 300:
            why = why[:297] + "..."
        log_event(logger, "fork_failed", logging.WARNING, epoch=self.epoch, job=job_id,
                  why=why, fallback="unforked")
        decision.detail[job_id] = why
        view.record = view.record.with_(nofork=True, why=why)
        self._place(view, rows0, epoch, decision, why=why)

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



def _same_copies(view: JobView, copies: Mapping[int, Sequence[tuple[int, int]]]) -> bool:
    """Whether ``view``'s copies run (or wait) exactly as ``copies`` (copy numbers aside)."""
    want = sorted(tuple(sorted((int(k), int(c)) for k, c in rows)) for rows in copies.values())
    return view.copy_rows() == want


def _end_why(copies: Mapping[int, Sequence[tuple[int, int]]] | None) -> str:
    if copies is None:
        return "the decision stops it"
    if len(copies) == 1:
        return "the decision runs it unforked"
    return f"the decision moves it to {len(copies)} other copies"
