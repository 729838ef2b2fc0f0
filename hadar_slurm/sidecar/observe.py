"""Observe: one read of Slurm's jobs and nodes, turned into what the sidecar steers.

:class:`SlurmObserver` reads all jobs and all nodes (two calls) and sorts the jobs: *hadar
jobs* (whose comment carries hints, ``hadar: model=... steps=...``) become :class:`JobView`
(hints, the record the sidecar keeps in the job's AdminComment, where it runs or was placed,
progress and rates); jobs it will not steer (bad hints, no GPU type of the cluster runs them)
become :class:`Unsteered`; a user's held jobs and every other job are left alone, but the GPUs
they hold are taken out of what the policy may hand out.  ``preempt=never`` jobs that run
(:attr:`~SlurmObserver.pinned`) are left alone too, but the policy sees them as running jobs
fixed where they run (``Snapshot.fixed``), with their GPUs.  HadarE forks are found by their
components' comments and checked to be the sidecar's own (:meth:`~SlurmObserver._made_here`);
forks to end whatever the decision says are :attr:`~SlurmObserver.orphans`.

:meth:`~SlurmObserver.build_snapshot` gives the policy its
:class:`~hadar_slurm.policy.base.Snapshot`; :meth:`~SlurmObserver.observed` gives
:func:`hadar_slurm.sidecar.reconcile.reconcile` what it compares the decision with.
"""


from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hadar_slurm.errors import InputError
from hadar_slurm.hints import Hints, ModelCatalog, is_hadar_comment, parse_hints
from hadar_slurm.logs import log_event
from hadar_slurm.policy.base import FloatArray, Placement, Snapshot, remaining_seen
from hadar_slurm.rates.learn import Knowledge, SlurmRun
from hadar_slurm.rates.store import StoreDamagedError
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sidecar import fork as hadare
from hadar_slurm.sidecar import shard
from hadar_slurm.sidecar.fork import CopyGroup, ForkError, Progress
from hadar_slurm.sidecar.record import MAX_ARGS_BYTES, JobRecord, decode, mark
from hadar_slurm.sidecar.studies import StudyBook, TrialStatus
from hadar_slurm.slurm import SlurmJob, SlurmNode
from hadar_slurm.slurm.api import SlurmApi
from hadar_slurm.slurm.parse import (
    FINAL_STATES,
    LAUNCH_FAILED_HELD,
    PENDING_STATES,
    RUNNING_STATES,
)
from hadar_slurm.slurm.version import SlurmVersion
from hadar_slurm.studies.spec import copies_cap, trial_weight

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
#: How many times the sidecar takes back a job that slurmctld held after its launch failed
#: (:func:`relaunchable`) before it leaves it held for a person: a launch that fails again and
#: again (a prolog that always fails, a job its nodes refuse) must not go round for ever, each
#: round draining a node.
MAX_RELAUNCH = 3
#: Pending reasons that say a placed job can never start as its request stands: the sidecar
#: places it again from scratch (every field of the request rewritten).
STUCK_REASONS = frozenset({"BadConstraints"})

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
    #: GPU sharing: the GPU index (on its one node) whose shards it holds while it runs as a
    #: shard job (None: it holds whole GPUs, or does not run), and the job that holds the
    #: other shards of that GPU (0: none, it runs alone there)
    shard_gpu: int | None = None
    mate: int = 0
    #: A study's trial (issue #17): what its study makes of it this epoch (None: not a trial)
    study: TrialStatus | None = None
    #: slurmctld held it after its launch failed where the sidecar had placed it
    #: (:func:`relaunchable`): it waits as a pending job again, its hold made the sidecar's
    relaunch: bool = False

    @property
    def job_id(self) -> int:
        return self.job.job_id

    @property
    def held(self) -> bool:
        return self.job.held

    @property
    def forked_running(self) -> bool:
        return self.group is not None and self.group.running

    def arrival(self, now: float) -> float:
        """When the job arrived: its first submit time (``JobRecord.submit``; Slurm resets
        ``SubmitTime`` on a requeue), else Slurm's, else ``now``."""
        return float(self.record.submit or self.job.submit_time or now)

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


@dataclass(frozen=True)
class Observed:
    """What reconcile needs of one read of Slurm: the steered jobs (``views``, by job id), the
    jobs given to Slurm (``unsteered``), forks to end whatever the decision (``orphans``: their
    job is gone, finished, or has a newer fork), jobs a move left ended (``moves_left``) and the
    node names (the decision's node indices index them)."""

    views: Mapping[int, JobView]
    unsteered: Sequence[Unsteered]
    orphans: Sequence[GroupEnd]
    moves_left: Sequence[SlurmJob]
    node_names: Sequence[str]


def held_by_hadar(job: SlurmJob) -> bool:
    """Held, and by hadar, not by its user (a user's own hold is respected).  hadar's holds:

    * ``JobHeldAdmin``: only an operator (the sidecar) holds so;
    * ``SPECIAL_EXIT``: slurmctld held it after a checkpoint exit (``RequeueExitHold=75``);
    * ``JobHeldUser`` on a job whose record says the sidecar is moving it (the ``scontrol
      requeuehold`` of earlier versions shows as ``JobHeldUser``), or with :data:`SUBMIT_HELD`,
      the mark of an earlier job_submit.lua that held hadar jobs (today's parks them:
      :func:`is_parked`).

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
    record = decode(job.admin_comment)
    return record.state in MOVE_STATES or relaunchable(job, record)


def launch_failed(job: SlurmJob) -> bool:
    """Held by slurmctld after its launch failed: a prolog failed (the node is drained), or the
    node's slurmd refused the batch launch.  Slurm requeues such a job held with reason
    ``JobHeldUser``, which would read as its user's own hold, and description
    :data:`~hadar_slurm.slurm.parse.LAUNCH_FAILED_HELD`."""
    return (job.state in PENDING_STATES and job.state_reason == "JobHeldUser"
            and job.state_desc == LAUNCH_FAILED_HELD)


def relaunchable(job: SlurmJob, record: JobRecord) -> bool:
    """A job the sidecar placed (record ``placed``) whose launch failed (:func:`launch_failed`):
    the hold is slurmctld's, not its user's, and the sidecar takes the job back to place it
    anew, as a pending job, at most :data:`MAX_RELAUNCH` times over its life (then it stays
    held for a person: ``hadar-slurm explain`` says why)."""
    return launch_failed(job) and record.state == "placed" and record.relaunch < MAX_RELAUNCH


def held_by_user(job: SlurmJob) -> bool:
    """Held by its user (see :func:`held_by_hadar`)."""
    return job.held and not held_by_hadar(job)


def launch_failed_text(job: SlurmJob, record: JobRecord | None = None) -> str | None:
    """What ``status`` and ``explain`` say of a job slurmctld held after a failed launch
    (:func:`launch_failed`), or None for any other job; ``record`` is the job's decoded
    admin comment, where the caller has it."""
    if not launch_failed(job):
        return None
    if record is None:
        record = decode(job.admin_comment)
    where = ", ".join(n for n, _ in record.place) or job.required_nodes or "its node"
    if relaunchable(job, record):
        return (f"Slurm held it after its launch on {where} failed; the sidecar places it "
                f"anew at its next epoch (relaunch {record.relaunch + 1} of {MAX_RELAUNCH})")
    if record.state == "placed":
        return (f"Slurm held it after its launch on {where} failed ({record.relaunch + 1} "
                "failed launches where hadar placed it): hadar leaves it held (see slurmd's "
                "log on that node; a failed prolog drains it), `scontrol "
                f"release {job.job_id}` once the cause is fixed")
    return (f"Slurm held it after its launch on {where} failed (see slurmd's log there); "
            f"`scontrol release {job.job_id}` once the cause is fixed")


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


def error_text(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:297] + "..."


def rows_text(node_names: Sequence[str],
              rows: Iterable[tuple[int, int]]) -> tuple[tuple[str, int], ...]:
    """``(node index, GPUs)`` rows as a record's ``place``: ``(node name, GPUs)``, sorted."""
    return tuple(sorted((node_names[k], c) for k, c in rows))


def log_job_error(epoch: int, stage: str, job_id: int,
                  exc: BaseException) -> tuple[str, int, str]:
    """An unexpected error while reading or applying one job: a ``job_error`` event (with
    where it happened); the epoch goes on without the job.  ``(stage, job, error)``."""
    where = [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
             for f in traceback.extract_tb(exc.__traceback__)][-4:]
    text = error_text(exc)
    log_event(logger, "job_error", logging.ERROR, epoch=epoch, job=job_id, stage=stage,
              error=text, where=where)
    return (stage, job_id, text)


def node_usable(node: SlurmNode) -> bool:
    state = node.state.upper()
    if state not in NODE_USABLE or "DRAIN" in state:
        return False
    return not any(f.upper() in NODE_BAD_FLAGS for f in node.state_flags)


class SlurmObserver:
    """Reads Slurm, and keeps what it read until the next read (see the module's docstring)."""

    def __init__(
        self, api: SlurmApi, table: ThroughputTable, *, catalog: ModelCatalog | None = None,
        partition: str | None = None, tracker_root: str | None = None,
        knowledge: Knowledge | None = None, migration_s: float = 0.0, restart_s: float = 0.0,
        share: bool = False, studies: StudyBook | None = None, refill_on_finish: bool = False,
    ) -> None:
        """``studies``: the book of the tuning studies it steers (issue #17,
        :mod:`hadar_slurm.sidecar.studies`; by default one kept in memory only).
        ``share``: offer the policy GPU sharing (``[scheduler] share``; pairs of 1-GPU jobs
        on one GPU through ``gres/shard``, :mod:`hadar_slurm.sidecar.shard`), where Slurm and
        the nodes allow it (:meth:`share_blocked`).
        ``table``: the base throughput table; ``knowledge``: what the sidecar knows over it
        (a store, online learning, estimates; :mod:`hadar_slurm.rates.learn`), by default
        ``table`` with in-memory estimates; ``migration_s``: what a move costs a job (the
        config's ``[scheduler] migration_s``), told to the policy in every snapshot;
        ``restart_s``: how long a job runs after its start before it makes progress (the
        config's ``[scheduler] restart_s``), for the estimate of its progress from its run
        time when its runtime reports none; ``refill_on_finish``: whether an epoch gives out a
        job's GPUs as soon as it ends (``[scheduler] reschedule_on_finish``), told to the
        policy in every snapshot."""
        self.api = api
        self.refill_on_finish = refill_on_finish
        self.share = share
        self.studies = studies if studies is not None else StudyBook()
        #: The Slurm release (the controller sets it once it has asked): 22.05 cannot turn a
        #: job's GPU request into shards, so nothing is shared there.
        self.slurm_version: SlurmVersion | None = None
        #: Why GPU sharing is not offered this epoch ("" when it is; see share_blocked).
        self.share_off = "not read yet"
        #: Pairs of steered jobs that share a GPU (lower id, higher id), as the last read
        #: found them, and each node's shards per GPU (0: none).
        self.pairs: tuple[tuple[int, int], ...] = ()
        self.shards: dict[str, int] = {}
        self.migration_s = migration_s
        self.restart_s = restart_s
        self.knowledge = knowledge if knowledge is not None else Knowledge(table)
        self.catalog = catalog if catalog is not None else ModelCatalog.from_table(table)
        self.partition = partition
        self.tracker_root = tracker_root
        self.views: dict[int, JobView] = {}
        #: Per study (its array's job id), how many of its trials the last snapshot offered
        #: the policy: their water-filling cap and their weight follow from it.
        self.trials_offered: dict[int, int] = {}
        self.unsteered: list[Unsteered] = []
        self.groups: dict[int, list[CopyGroup]] = {}  # every fork in the last read, by job
        self.orphans: list[GroupEnd] = []  # forks whose job is gone (or has a newer fork)
        #: The components of ``groups`` (and of forks submitted since the read).
        self.copy_ids: set[int] = set()
        self._untrusted_seen: set[int] = set()  # forged forks already logged (by leader)
        #: Running hadar jobs that may not be stopped (``preempt=never``): they run where
        #: they are, outside the policy's snapshot.
        self.pinned: dict[int, JobView] = {}
        #: Jobs that a move left ended (FAILED during the grace, or a checkpoint exit on a
        #: Slurm without ``RequeueExitHold=75``): requeued this epoch.
        self.moves_left: list[SlurmJob] = []
        self.user_held: list[int] = []  # hadar jobs their users hold
        #: Records of hadar job arrays that stand for several pending tasks: each task gets a
        #: record of its own (the applier splits them), and is a job like any other from the
        #: next epoch on.
        self.arrays: list[SlurmJob] = []
        #: Per-job errors of the last epoch (reading and applying): ``(stage, job, error)``.
        self.job_errors: list[tuple[str, int, str]] = []
        self.node_names: tuple[str, ...] = ()
        self.node_type_names: tuple[str, ...] = ()
        self._node_type: dict[str, str] = {}  # node name -> its GPU type (last snapshot)
        self.gpu_types: tuple[str, ...] = ()
        self.jobs: list[SlurmJob] = []
        self.nodes: list[SlurmNode] = []
        self.stats = EpochStats()
        self.epoch = -1

    @property
    def table(self) -> ThroughputTable:
        """The throughputs the policy plans with this epoch."""
        return self.knowledge.table

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

    def prepare(self) -> None:
        """Make the throughputs of the nodes of the last :meth:`read` ready before the first
        epoch: the first estimate of what the table lacks chooses its fit by cross-validation
        (about a second), which would otherwise delay every placement of the first epoch after
        its start (``bench.fidelity``: 10 first starts 1.5 s late).  The epochs refresh again,
        at no cost while nothing changed."""
        self._refresh_knowledge(self._gpu_nodes())

    def _gpu_nodes(self) -> list[SlurmNode]:
        """The nodes of the last :meth:`read` with GPUs, by name."""
        return sorted((n for n in self.nodes if n.gpu_type and n.gpus > 0),
                      key=lambda n: n.name)

    def _refresh_knowledge(self, nodes: Sequence[SlurmNode]) -> None:
        """The GPU types of ``nodes`` (in their order) become :attr:`gpu_types`, and what was
        learned up to now plans the next epoch (estimates fill the gaps)."""
        types: list[str] = []
        for n in nodes:
            assert n.gpu_type is not None
            if n.gpu_type not in types:
                types.append(n.gpu_type)
        self.gpu_types = tuple(types)
        self.knowledge.gpu_types = tuple(types)
        self.knowledge.refresh()

    def build_snapshot(
        self, epoch: int, now: float, round_s: float, policy_state: object,
    ) -> Snapshot:
        """The policy's view of the jobs and nodes of the last :meth:`read`."""
        nodes = self._gpu_nodes()
        self._refresh_knowledge(nodes)
        types = list(self.gpu_types)
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
        self.arrays = []
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
            if job.array_tasks and job.state in PENDING_STATES:
                self.arrays.append(job)  # (several tasks in one record: split, not placed)
                continue
            try:
                view = self._view(job, now, node_index, active.get(job.job_id))
            except StoreDamagedError:
                raise  # the store's, not the job's: the controller plans without the store
            except Exception as exc:  # one job must not stop the epoch
                self._job_error("read", job.job_id, exc)
                self._unsteer(job, decode(job.admin_comment), now,
                              f"sidecar error: {error_text(exc)}")
                count(other_on_node, job)
                continue
            if view is None:
                count(other_on_node, job)  # (a running job the sidecar does not steer)
                continue
            view.parked = is_parked(job, now)
            if view.running and view.group is None and (
                    view.hints.preempt_mode == "never" and view.record.state not in MOVE_STATES):
                # it may not be stopped: it runs where it is until it ends.  The policy sees
                # it as a running job (its work, and the GPUs it holds as hadar's: a job placed
                # last epoch that Slurm started since must not turn its GPUs into someone
                # else's, which would re-plan the others), fixed where it runs
                # (Snapshot.fixed, kept by the epoch loop); reconcile never sees it.
                self.pinned[job.job_id] = view
                for k, c in view.rows:
                    hadar_on_node[k] += c
                continue
            if view.running:
                for k, c in view.rows:
                    hadar_on_node[k] += c
            views[job.job_id] = view
        self.views = views
        self.knowledge.forget(j.job_id for j in self.jobs)
        self._observe_studies(now, epoch)

        # GPUs the policy may hand out: a usable node's GPUs minus those other jobs hold.  The
        # node's count of used GPUs less the hadar jobs' is the other jobs' use; so is the sum
        # over the running non-hadar jobs of the jobs read.  The two differ only for a job that
        # started or ended between the reads (or asked for GPUs per job, not per node): the
        # smaller one wins, since over-counting free GPUs for an epoch is harmless (a released
        # job waits in Slurm) and under-counting them holds jobs for nothing.
        # A node whose GPUs are split into shards is counted by GPU index instead: a GPU with
        # shards in use is not in its count of used GPUs (``gpus_used`` counts gres/gpu only),
        # and two jobs may hold one GPU.
        self.shards = {n.name: shard.shards_per_gpu(n) for n in nodes}
        ours = {j for j in views} | {c for c in self.copy_ids} | set(self.pinned)
        gpus = np.zeros(len(nodes), dtype=np.int64)
        for k, n in enumerate(nodes):
            if not node_usable(n):
                continue
            if self.shards[n.name]:
                foreign = self._foreign_by_index(n, ours)
            else:
                foreign = min(max(0, n.gpus_used - int(hadar_on_node[k])),
                              int(other_on_node[k]))
            gpus[k] = max(0, n.gpus - foreign)
        node_type = np.array([types.index(n.gpu_type or "") for n in nodes], dtype=np.int64)

        # a study's trial that waits for a verdict, or that its study stopped, is not the
        # policy's: the changes stop it or keep it held (reconcile)
        ordered = [v for v in views.values() if v.study is None or v.study.offered]
        ordered += [self.pinned[j] for j in sorted(self.pinned)]
        self.trials_offered = {}
        for v in ordered:
            if v.study is not None:
                arr = v.study.array
                self.trials_offered[arr] = self.trials_offered.get(arr, 0) + 1
        self._cap_trial_copies(ordered, int(gpus.sum()))
        sharing = self._sharing(nodes, ordered)
        if self.knowledge.store is not None and self.knowledge.learn:
            self._learn_pairs(ordered, now)
        rate = np.array(
            [v.rates for v in ordered],
            dtype=np.float64).reshape(len(ordered), len(types))
        attained = np.array(
            [[v.attained.get(t, 0.0) for t in types] for v in ordered],
            dtype=np.float64).reshape(len(ordered), len(types))
        # (a trial's work ends at the rung it trains toward, as the simulator's trials')
        total = np.array([float(v.hints.steps if v.study is None else v.study.target)
                          for v in ordered], dtype=np.float64)
        done = np.minimum(np.array([v.done for v in ordered], dtype=np.float64), total)
        remaining = remaining_seen(total, done)
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
        trial = np.array([v.study is not None for v in ordered], dtype=np.bool_)
        return Snapshot(
            epoch=epoch, now=now, round_s=round_s, gpu_types=self.gpu_types,
            node_names=self.node_names, node_type=node_type, node_gpus=gpus,
            job_ids=ids, job_types=tuple(v.hints.job_type for v in ordered),
            arrival=np.array([v.arrival(now) for v in ordered], dtype=np.float64),
            total=total, remaining=remaining,
            scale=np.array([v.gpus for v in ordered], dtype=np.int64),
            weight=self._weights(ordered),
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
            refill_on_finish=self.refill_on_finish,
            # and a job over several nodes has as many GPUs on each (a count per node)
            even_gangs=True,
            fixed=np.array([v.job_id in self.pinned for v in ordered], dtype=np.bool_),
            # a study's trials: their water-filling cap is offered (:meth:`_cap_trial_copies`)
            spread=trial,
            # and the rungs after the one each trains toward (its path to the study's end)
            after=(np.array([0.0 if v.study is None else float(v.study.after) for v in ordered],
                            dtype=np.float64) if trial.any() else None),
            **sharing,  # type: ignore[arg-type]
        )

    def share_blocked(self) -> str:
        """Why GPU sharing cannot be offered at all ("" when it can): off in the config, a
        table without co-located rates, a backend that does not say which GPU a job holds, or
        a Slurm that cannot turn a pending job's GPU request into shards (22.05)."""
        if not self.share:
            return "off ([scheduler] share = false)"
        if not len(self.table.pairs):
            return ("the throughput table has no co-located rates (pairs of jobs on one GPU: "
                    "Gavel's JSON table has them)")
        if "pyslurm" in self.api.name:
            return (f"the {self.api.name} backend does not say which GPU a job holds (use the "
                    "cli backend)")
        if self.slurm_version is None:
            try:
                self.slurm_version = self.api.slurm_version()
            except Exception as exc:  # (asked again next epoch)
                return f"cannot tell the Slurm release ({error_text(exc)})"
        v = self.slurm_version
        if (v.major, v.minor) <= (22, 5):
            return (f"Slurm {v.release} cannot turn a job's GPU request into shards (24.11 "
                    "and later can; docs/sharing.md)")
        return ""

    def _sharing(self, nodes: Sequence[SlurmNode],
                 ordered: Sequence[JobView]) -> dict[str, object]:
        """What the snapshot says of GPU sharing (``Snapshot.colocated``, ``packed``,
        ``may_share``, ``may_host``, ``may_join``, ``share_nodes``, ``node_free_cpus``,
        ``cpus``), and each running view's
        shard GPU and mate.  A steered 1-GPU job that runs as shards on a GPU holds it with the
        job on its other shards (a *pair*, ``packed``) or alone; one alone there, and one that
        waits, may get a new partner; a job that waits may join one.  Only unforked 1-GPU jobs
        whose hints allow it share (``share=no`` opts out), on nodes with two or more shards
        per GPU."""
        by_gpu: dict[tuple[str, int], list[JobView]] = {}
        for v in ordered:
            if v.running and v.group is None and len(v.job.node_names) == 1:
                node = v.job.node_names[0]
                held = shard.job_shards_on(v.job, node) if self.shards.get(node) else {}
                if len(held) == 1:
                    v.shard_gpu = next(iter(held))
                    by_gpu.setdefault((node, v.shard_gpu), []).append(v)
        pairs: list[tuple[int, int]] = []
        for (_node, _gpu), held_by in by_gpu.items():
            if len(held_by) == 2:
                a, b = sorted(w.job_id for w in held_by)
                pairs.append((a, b))
                held_by[0].mate, held_by[1].mate = held_by[1].job_id, held_by[0].job_id
        self.pairs = tuple(sorted(pairs))
        off = self.share_blocked()
        if self.share and off != self.share_off:
            # (once, and when the reason changes: an admin who turned sharing on sees why
            # nothing is shared)
            offered = self.table.colocated
            guessed = sorted({g for (_key, g) in offered.estimated
                              if g in self.gpu_types}) if not off else []
            memory = self.table.memory
            too_big = sorted(memory.why_not(a, b, s, g) or f"{a} + {b} on {g}"
                             for (a, b, s), g in offered.memory_refused
                             if a <= b and g in self.gpu_types) if not off else []
            log_event(logger, "sharing", logging.WARNING if off else logging.INFO,
                      epoch=self.epoch, on=not off, why=off or "offered to the policy",
                      estimated_on=guessed, memory_refused=len(too_big),
                      memory_refused_first=too_big[:5])
        self.share_off = off
        if self.share_off:
            return {"packed": self.pairs}
        share_nodes = np.array([self.shards.get(n.name, 0) >= 2 and node_usable(n)
                                for n in nodes], dtype=np.bool_)
        room: dict[tuple[str, int], int] = {}
        for n in nodes:
            if self.shards.get(n.name):
                for g in shard.node_gpus(n, self.jobs):
                    room[(n.name, g.index)] = g.free
        # (a job that may not be stopped forms no new pair: it is fixed where it runs)
        may_share = np.array([
            v.hints.share and v.gpus == 1 and v.hints.fork <= 1 and v.group is None
            and (not v.running or v.shard_gpu is not None) and v.job_id not in self.pinned
            for v in ordered], dtype=np.bool_)
        waits = np.array([not v.running and v.group is None for v in ordered], dtype=np.bool_)
        alone = np.array([v.shard_gpu is not None and not v.mate
                          and room.get((v.job.node_names[0], v.shard_gpu), 0) >= 1
                          for v in ordered], dtype=np.bool_)
        # (CPUs, as the applier counts them: a node whose read gives no CPU figures is not
        # limited by them.  A job placed in an earlier epoch that Slurm has not started holds
        # no CPU in the read, yet the policy keeps it where it is (a row of ``current``, which
        # it does not count again) and the applier counts it if it is placed again: its CPUs
        # are taken off here, so that both count it once)
        free_cpus = np.array([np.iinfo(np.int32).max if n.free_cpus is None else n.free_cpus
                              for n in nodes], dtype=np.int64)
        for v in ordered:
            if not v.running:
                for k in {k for k, _count in v.rows}:
                    free_cpus[k] -= v.job.cpus_per_node or 1
        cpus = np.array([v.job.cpus_per_node or 1 for v in ordered], dtype=np.int64)
        return {"colocated": self.table.colocated, "packed": self.pairs,
                "may_share": may_share, "may_host": may_share & (waits | alone),
                "may_join": may_share & waits, "share_nodes": share_nodes,
                "node_free_cpus": free_cpus, "cpus": cpus}

    def _foreign_by_index(self, node: SlurmNode, ours: set[int]) -> int:
        """GPUs of ``node`` (one with shards) that jobs other than the steered ones hold, whole
        or as shards, by index: the busy GPUs of the node's read less those the steered jobs
        hold, and the GPUs the other running jobs hold in the jobs' read, whichever is fewer
        (a job that started or ended between the two reads is in one of them only; see the
        count of nodes without shards)."""
        busy = shard.busy_gpus(node)
        mine: set[int] = set()
        theirs: set[int] = set()
        for job in self.jobs:
            if job.state not in shard.HOLDING_STATES or node.name not in job.node_names:
                continue
            held: set[int] = set()
            for use in shard.job_gres_on(job, node.name):
                if use.name in ("gpu", "shard"):
                    held.update(use.indices)
            if not held and job.gpus_per_node:  # (no index given: counted as GPUs, lowest)
                held = set(range(job.gpus_per_node))
            steered = job.job_id in ours
            (mine if steered else theirs).update(held)
        return min(len(busy - mine), len(theirs - mine))

    def _observe_studies(self, now: float, epoch: int) -> None:
        """The study book's turn (:meth:`StudyBook.observe`): every job of the read that is a
        task of a hadar array with study hints (running, waiting, ended, or the array's
        record of tasks not split yet), and what it makes of each trial, on its view."""
        views = {**self.views, **self.pinned}
        hints: dict[int, Hints] = {}
        for job in self.jobs:
            if job.array_job_id is None or not is_hadar_comment(job.comment) or (
                    self.partition is not None and job.partition != self.partition):
                continue
            view = views.get(job.job_id)
            if view is not None:
                hints[job.job_id] = view.hints
                continue
            try:
                hints[job.job_id] = parse_hints(job.comment, self.catalog,
                                                gpus=max(1, job.gpus_per_node), array=True)
            except InputError:
                continue  # (unsteered: released to Slurm with the reason)
        if not any(h.study is not None for h in hints.values()) and not self.studies.studies:
            self.studies.status = {}
            return
        status = self.studies.observe(self.jobs, hints, now, epoch)
        for job_id, st in status.items():
            view = views.get(job_id)
            if view is not None:
                view.study = st

    def _weights(self, ordered: Sequence[JobView]) -> FloatArray:
        """Per job, its hint's weight; a trial's times :func:`trial_weight`, its study's
        trials over those offered this epoch (``trials_offered``: the study's weight is kept
        as its halving stops trials, as in the simulator)."""
        return np.array([v.hints.weight * (1.0 if v.study is None else trial_weight(
            v.study.trials, self.trials_offered[v.study.array])) for v in ordered],
            dtype=np.float64)

    def _cap_trial_copies(self, ordered: Sequence[JobView], gpus: int) -> None:
        """Water-filling (issue #17): a trial may run as at most as many copies as the
        cluster's GPUs over its study's trials offered this epoch (``trials_offered``,
        :func:`copies_cap`, as in the simulator), and never more than its ``fork`` hint
        allows."""
        for v in ordered:
            if v.study is not None and v.max_copies > 1:
                v.max_copies = min(v.max_copies,
                                   copies_cap(gpus, self.trials_offered[v.study.array]))

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
        if not record.submit and job.submit_time:
            # the first submit time seen is kept (in every record written from this one):
            # Slurm's is reset when the job is requeued (moved or preempted)
            record = record.with_(submit=float(job.submit_time))
        running = job.state in RUNNING_STATES
        gpus = record.gpus or job.gpus_per_node * max(1, len(job.node_names) if running else 1)
        gpus = max(gpus, 1)
        try:
            hints = parse_hints(job.comment, self.catalog, gpus=gpus,
                                array=job.array_job_id is not None)
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
        if hints.fork > 1 or group is not None or hints.study is not None:
            try:
                tracker = hadare.tracker_dir(job, self.tracker_root)
            except ForkError:
                tracker = ""
            progress = hadare.read_progress(tracker) if tracker else None
        done = record.done
        attained = dict(record.attained)
        relaunch = False
        rows: list[tuple[int, int]] = []
        row_copy: list[int] = []
        run_rate, run_start = 0.0, now  # what runs now, for the progress since the tracker's
        if group is not None:
            for index, name, count in group.copies():
                if name in node_index:
                    rows.append((node_index[name], count or gpus))
                    row_copy.append(index)
            start = group.start_time()
            if start is not None:
                run_s = max(0.0, now - max(start, record.until))
                used = [self.node_type_names[k] for k, _ in rows]
                run_rate = sum(rates[self.gpu_types.index(t)] for t in used)
                run_start = start
                if run_s > 0:
                    done += run_rate * self._working(start, record.until, now)
                    for t in used:
                        attained[t] = attained.get(t, 0.0) + run_s
        elif running:
            per_node = job.gpus_per_node or gpus
            rows = [(node_index[n], per_node) for n in job.node_names if n in node_index]
            start = float(job.start_time or now)
            since = max(start, record.until)
            run_s = max(0.0, now - since)
            used = sorted({self.node_type_names[k] for k, _ in rows})
            if used:
                run_rate = min(rates[self.gpu_types.index(t)] for t in used)
                run_start = start
            if used and run_s > 0:
                done += run_rate * self._working(start, record.until, now)
                for t in used:
                    attained[t] = attained.get(t, 0.0) + run_s
        elif record.state == "placed" and job.state_reason in STUCK_REASONS:
            log_event(logger, "stuck", logging.WARNING, job=job.job_id, reason=job.state_reason,
                      record=job.admin_comment)
            return JobView(job, hints, record.with_(state="held", place=()), gpus, False, (),
                           done, attained, rates, repair=True)
        elif relaunchable(job, record):
            log_event(logger, "launch_failed", logging.WARNING, job=job.job_id,
                      nodes=",".join(n for n, _ in record.place), relaunch=record.relaunch + 1,
                      max=MAX_RELAUNCH)
            record = record.with_(state="held", place=(), mate=0, relaunch=record.relaunch + 1)
            relaunch = True
        elif record.state == "placed":
            rows = [(node_index[n], c) for n, c in record.place if n in node_index]
        if progress is not None:
            # The tracker counts every iteration, forked or not, up to its last round: what
            # runs has gone on since (a round may be long), at the rate estimated above.
            done = progress.done
            if run_rate > 0 and progress.updated_at is not None and not progress.complete:
                done += run_rate * self._working(run_start, max(record.until,
                                                                progress.updated_at), now)
                if progress.work:
                    done = min(done, progress.work)
        if self.knowledge.store is not None and self.knowledge.learn and (
                running or group is not None) and not shard.asks_for_shards(job):
            # (a job on a GPU's shards may share it: its rounds are no measure of its speed
            # alone, and learning them would teach the store a slower isolated rate)
            self._learn(job, hints.job_type, gpus, now, group, tracker, progress)
        blocked = self._fork_blocked(job, hints, record, group) if hints.fork > 1 else ""
        order = sorted(range(len(rows)), key=lambda k: (row_copy[k] if row_copy else 0, rows[k]))
        return JobView(
            job, hints, record, gpus, running, tuple(rows[k] for k in order), done, attained,
            rates, row_copy=tuple(row_copy[k] for k in order) if row_copy else (),
            group=group, max_copies=hints.fork if hints.fork > 1 and not blocked else 1,
            fork_blocked=blocked, tracker=tracker, progress=progress,
            rate_sources=tuple(self.knowledge.source(hints.job_type, gpus, t)
                               for t in self.gpu_types), relaunch=relaunch)

    def _working(self, start: float, until: float, now: float) -> float:
        """Seconds of progress of a run that started at ``start`` whose work up to ``until``
        is already counted: none in its first ``restart_s`` (the job's own restart, as the
        simulator charges it; the GPUs count as held all along)."""
        return max(0.0, now - max(start + self.restart_s, until))

    def _learn(self, job: SlurmJob, job_type: str, gpus: int, now: float,
               group: CopyGroup | None, tracker: str, progress: Progress | None) -> None:
        """Fold what a running job (or its copies) achieved into the store: its runtime's
        progress.json, in its tracker dir (a fork's: under ``tracker_root``; an unforked job's:
        under its working directory, where the runtime writes it), checked against what Slurm
        says of each copy (:class:`~hadar_slurm.rates.learn.SlurmRun`: the GPU type of the
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

    def _learn_pairs(self, ordered: Sequence[JobView], now: float) -> None:
        """Fold what each job of a running pair achieved beside its mate into the store's
        co-located rates (:meth:`~hadar_slurm.rates.learn.Knowledge.observe_pair`): a round
        counts only when both jobs held the GPU for all of it."""
        by_id = {v.job_id: v for v in ordered}
        for v in ordered:
            mate = by_id.get(v.mate) if v.mate else None
            if (mate is None or not v.running or not mate.running or v.job.start_time is None
                    or mate.job.start_time is None or len(v.job.node_names) != 1):
                continue
            gpu = self._node_type.get(v.job.node_names[0], "")
            try:
                progress = hadare.read_progress(hadare.tracker_dir(v.job, None))
            except ForkError:
                continue
            if not gpu or progress is None:
                continue
            start = float(v.job.start_time)
            self.knowledge.observe_pair(
                v.job_id, v.hints.job_type, mate.hints.job_type, v.gpus, progress,
                {0: SlurmRun(gpu, start)}, max(start, float(mate.job.start_time)), now=now)

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

    def _job_error(self, stage: str, job_id: int, exc: BaseException) -> None:
        """An unexpected error while reading one job (see :func:`log_job_error`)."""
        self.job_errors.append(log_job_error(self.epoch, stage, job_id, exc))

    def observed(self) -> Observed:
        """What :func:`~hadar_slurm.sidecar.reconcile.reconcile` needs of the last read."""
        return Observed(views=dict(self.views), unsteered=tuple(self.unsteered),
                        orphans=tuple(self.orphans), moves_left=tuple(self.moves_left),
                        node_names=self.node_names)
