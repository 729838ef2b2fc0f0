"""What the sidecar needs from Slurm, as one small interface with two implementations.

:class:`SlurmApi` is the whole surface: the Slurm release (read once, at start), one batched
read of all jobs, one of all nodes, and a handful of per-job actions.  :class:`CliApi` speaks the
Slurm CLI (``scontrol version``, ``squeue --json``, ``sinfo --json``, ``scontrol``,
``scancel``) through :class:`~hadar_slurm.slurm.SlurmRunner`;
:mod:`hadar_slurm.slurm.pyslurm_api` maps the same calls onto pyslurm.  Everything else
(parsing hints, the snapshot, the diff, the decisions) is shared code above this interface.

Every implementation counts the Slurm calls it issued in :attr:`SlurmApi.commands`, so the
epoch overhead benchmark can show that reads per epoch are constant.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from hadar_slurm.logs import log_event
from hadar_slurm.slurm import RunAs, SlurmJob, SlurmNode, SlurmRunner, commands
from hadar_slurm.slurm.parse import (
    parse_job_ids,
    parse_sbatch_parsable,
    parse_sinfo_json,
    parse_squeue_json,
)
from hadar_slurm.slurm.runner import write_files_as
from hadar_slurm.slurm.schedconf import (
    SchedulerConfig,
    parse_scheduler_config,
    scontrol_show_config,
)
from hadar_slurm.slurm.version import SlurmVersion, parse_version, scontrol_version

#: Fields the sidecar sets with :meth:`SlurmApi.update_job` (``scontrol update`` names).
UPDATE_FIELDS = ("NodeList", "Features", "AdminComment", "NumNodes", "TresPerNode", "Dependency",
                 "StartTime")


class SlurmApi(Protocol):
    """The Slurm calls of the sidecar.  Errors raise :class:`hadar_slurm.slurm.SlurmError`."""

    @property
    def name(self) -> str:
        """Which implementation, for the logs (``cli``, ``pyslurm``, ``dry-run(cli)``)."""
        ...

    @property
    def commands(self) -> int:
        """Slurm calls issued so far (reads and actions)."""
        ...

    def slurm_version(self) -> SlurmVersion:
        """The Slurm release this implementation talks to (read once, at start)."""
        ...

    def read_jobs(self) -> list[SlurmJob]:
        """All jobs Slurm knows (pending, running, recently finished), in one call."""
        ...

    def read_nodes(self) -> list[SlurmNode]:
        """All nodes, in one call."""
        ...

    def live_job_ids(self) -> frozenset[int]:
        """The ids of the jobs that have not ended (pending, running, completing, ...): a
        light read, for polling between epochs."""
        ...

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        """Set fields of a job (keys from :data:`UPDATE_FIELDS`)."""
        ...

    def hold(self, job_id: int) -> None: ...

    def release(self, job_id: int) -> None: ...

    def split_array_task(self, array_job_id: int, task_id: int, admin_comment: str) -> None:
        """Give a pending task of a job array a job record of its own (its admin comment
        unchanged): :func:`~hadar_slurm.slurm.commands.scontrol_split_array_task`."""
        ...

    def requeue_hold(self, job_id: int) -> None:
        """Stop a running job and put it back in the queue, held by the operator: ``scontrol
        requeue``, then ``scontrol hold`` (``JobHeldAdmin``).  Not ``scontrol requeuehold``:
        its hold reads as the user's (``JobHeldUser``), and a requeuehold that reaches
        slurmctld late (sent by a sidecar killed before the answer came, while a new sidecar
        placed the job again) would leave a placed job that looks held by its user, which no
        sidecar releases.  A late plain requeue only restarts the job; a late operator hold is
        the sidecar's own.  (slurmctld delays a requeued job's start by seconds, so the hold
        comes first.)"""
        ...

    def signal(self, job_id: int, signal: str) -> None:
        """Send ``signal`` (e.g. ``USR1``) to the job's batch script and all its steps."""
        ...

    def cancel(self, job_id: int) -> None: ...

    # HadarE: forking a job into copies (a heterogeneous job) and ending them

    @property
    def can_fork(self) -> bool:
        """Whether :meth:`batch_script` and :meth:`submit_as` work here."""
        ...

    def signal_steps(self, job_id: int, signal: str) -> None:
        """Send ``signal`` to every step of the job (of every component of a heterogeneous
        job), not to its batch script."""
        ...

    def batch_script(self, job_id: int) -> str:
        """The job's batch script (pending jobs too)."""
        ...

    def scheduler_config(self) -> SchedulerConfig:
        """How slurmctld schedules (its plugin and backfill interval): whether and how soon
        forks start.  Read once at start by a sidecar whose policy forks."""
        ...

    def write_files(self, owner: RunAs, directory: str, files: Mapping[str, str]) -> None:
        """Write ``files`` (``{name: text}``) into ``directory`` as ``owner``: what a
        submission as the owner runs (:func:`~hadar_slurm.slurm.runner.write_files_as`)."""
        ...

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        """Submit the batch script at path ``script`` as ``owner`` (``sbatch --parsable``),
        optionally with ``--dependency``; the new job's (leader's) id."""
        ...


def task_refs(jobs: Iterable[SlurmJob]) -> dict[int, str]:
    """``{job id: "A_T"}`` for the array tasks among ``jobs`` whose record keeps the array's
    job id (Slurm reuses the array's record for its last pending task): a command on that id
    alone would act on every task of the array (``scontrol release 41`` releases them all,
    ``scontrol update JobId=41 NodeList=...`` is refused: "Job resizing not supported")."""
    return {j.job_id: f"{j.array_job_id}_{j.array_task_id}" for j in jobs
            if j.array_job_id == j.job_id and j.array_task_id is not None}


def array_refs(jobs: Iterable[SlurmJob]) -> dict[int, str]:
    """``{job id: "A_T"}`` for every array task among ``jobs``: ``scancel`` of a pending array
    task by its own job id does nothing on Slurm 22.05 (it prints "Invalid job id specified"
    and exits 0), so a task is cancelled as ``A_T``."""
    return {j.job_id: f"{j.array_job_id}_{j.array_task_id}" for j in jobs
            if j.array_job_id is not None and j.array_task_id is not None}


class CliApi:
    """:class:`SlurmApi` over the Slurm command line tools (tested with Slurm 22.05, 24.11 and
    26.05)."""

    name = "cli"
    can_fork = True

    def __init__(self, runner: SlurmRunner) -> None:
        self.runner = runner
        self.commands = 0
        #: Array tasks whose record keeps the array's job id, by that id: they are named
        #: ``A_T`` (:data:`~hadar_slurm.slurm.commands.JobRef`), refreshed by every read.
        self.task_refs: dict[int, str] = {}
        #: Every array task as ``A_T``, for ``scancel`` (:func:`array_refs`).
        self.array_refs: dict[int, str] = {}

    def _ref(self, job_id: int) -> commands.JobRef:
        return self.task_refs.get(job_id, job_id)

    def _run(self, argv: list[str]) -> str:
        self.commands += 1
        return self.runner.run(argv).stdout

    def slurm_version(self) -> SlurmVersion:
        return parse_version(self._run(scontrol_version()))

    def scheduler_config(self) -> SchedulerConfig:
        return parse_scheduler_config(self._run(scontrol_show_config()))

    def read_jobs(self) -> list[SlurmJob]:
        jobs = list(parse_squeue_json(self._run(commands.squeue_json()),
                                      source="squeue --json"))
        self.task_refs = task_refs(jobs)
        self.array_refs = array_refs(jobs)
        return jobs

    def read_nodes(self) -> list[SlurmNode]:
        return list(parse_sinfo_json(self._run(commands.sinfo_json()), source="sinfo --json"))

    def live_job_ids(self) -> frozenset[int]:
        return parse_job_ids(self._run(commands.squeue_live_ids()))

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        unknown = set(fields) - set(UPDATE_FIELDS)
        if unknown:
            raise ValueError(f"update_job: unsupported fields {sorted(unknown)}")
        self._run(commands.scontrol_update_job(self._ref(job_id), fields))

    def hold(self, job_id: int) -> None:
        self._run(commands.scontrol_hold(self._ref(job_id)))

    def release(self, job_id: int) -> None:
        self._run(commands.scontrol_release(self._ref(job_id)))

    def split_array_task(self, array_job_id: int, task_id: int, admin_comment: str) -> None:
        self._run(commands.scontrol_split_array_task(array_job_id, task_id, admin_comment))

    def requeue_hold(self, job_id: int) -> None:
        self._run(commands.scontrol_requeue(self._ref(job_id)))
        self.hold(job_id)

    def signal(self, job_id: int, signal: str) -> None:
        self._run(commands.scancel(self._ref(job_id), signal=signal, full=True))

    def cancel(self, job_id: int) -> None:
        self._run(commands.scancel(self.array_refs.get(job_id) or self._ref(job_id)))

    def signal_steps(self, job_id: int, signal: str) -> None:
        self._run(commands.scancel(self._ref(job_id), signal=signal))

    def batch_script(self, job_id: int) -> str:
        return self._run(commands.scontrol_write_batch_script(self._ref(job_id)))

    def write_files(self, owner: RunAs, directory: str, files: Mapping[str, str]) -> None:
        write_files_as(owner, directory, files)

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        self.commands += 1
        out = self.runner.run(commands.sbatch(script=script, dependency=dependency),
                              as_user=owner)
        return parse_sbatch_parsable(out.stdout)


#: Job ids a dry run hands out for the forks it would submit: above any id Slurm gives
#: (``MaxJobId`` is at most 67,043,328), so they never name a real job.
DRY_RUN_IDS = 1_000_000_000
#: Ids reserved per dry-run fork (its components' ids count up from the leader's).
_DRY_RUN_SPAN = 1000


class ApiWrapper:
    """The reads of a :class:`SlurmApi` wrapper: passed to ``inner`` as they are.  The
    wrappers (:class:`DryRunApi`, :class:`PassThroughApi`) say what they do with changes."""

    def __init__(self, inner: SlurmApi) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def commands(self) -> int:
        return self.inner.commands

    @property
    def can_fork(self) -> bool:
        return self.inner.can_fork

    def slurm_version(self) -> SlurmVersion:
        return self.inner.slurm_version()

    def read_jobs(self) -> list[SlurmJob]:
        return self.inner.read_jobs()

    def read_nodes(self) -> list[SlurmNode]:
        return self.inner.read_nodes()

    def live_job_ids(self) -> frozenset[int]:
        return self.inner.live_job_ids()

    def batch_script(self, job_id: int) -> str:
        return self.inner.batch_script(job_id)  # a read

    def scheduler_config(self) -> SchedulerConfig:
        return self.inner.scheduler_config()


class DryRunApi(ApiWrapper):
    """Shadow mode: reads go to Slurm, changes are only written down (and logged by the
    caller); nothing in Slurm, and no file, changes.  ``would`` lists ``(call, job_id,
    detail)``.  A fork it would submit gets ids no real job has (:data:`DRY_RUN_IDS`), which
    it reports live, so that the sidecar sees its shadow world as consistent.  (The sidecar
    does not wait out grace periods in a dry run: nothing was signalled.)"""

    def __init__(self, inner: SlurmApi) -> None:
        super().__init__(inner)
        self.name = f"dry-run({inner.name})"
        self.would: list[tuple[str, int, str]] = []
        self._next_id = DRY_RUN_IDS

    def live_job_ids(self) -> frozenset[int]:
        return self.inner.live_job_ids() | frozenset(range(DRY_RUN_IDS, self._next_id))

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        self.would.append(("update", job_id, " ".join(f"{k}={v}" for k, v in fields.items())))

    def hold(self, job_id: int) -> None:
        self.would.append(("hold", job_id, ""))

    def release(self, job_id: int) -> None:
        self.would.append(("release", job_id, ""))

    def split_array_task(self, array_job_id: int, task_id: int, admin_comment: str) -> None:
        self.would.append(("split", array_job_id, f"task {task_id}"))

    def requeue_hold(self, job_id: int) -> None:
        self.would.append(("requeuehold", job_id, ""))

    def signal(self, job_id: int, signal: str) -> None:
        self.would.append(("signal", job_id, signal))

    def cancel(self, job_id: int) -> None:
        self.would.append(("cancel", job_id, ""))

    def signal_steps(self, job_id: int, signal: str) -> None:
        self.would.append(("signal-steps", job_id, signal))

    def write_files(self, owner: RunAs, directory: str, files: Mapping[str, str]) -> None:
        self.would.append(("files", owner.uid, f"{directory}: {' '.join(sorted(files))}"))

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        self.would.append(("sbatch", owner.uid, f"{script} dependency={dependency or ''}"))
        leader = self._next_id
        self._next_id += _DRY_RUN_SPAN
        return leader


class PassThroughApi(ApiWrapper):
    """A wrapper that passes every change to ``inner`` through :meth:`_change` (here: as it
    is); a subclass that watches or alters changes overrides :meth:`_change`, one that alters
    reads overrides them.  (:class:`DryRunApi` makes no change, so it is not one of these.)"""

    def _change(self, call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return call(*args, **kw)

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        self._change(self.inner.update_job, job_id, fields)

    def hold(self, job_id: int) -> None:
        self._change(self.inner.hold, job_id)

    def release(self, job_id: int) -> None:
        self._change(self.inner.release, job_id)

    def split_array_task(self, array_job_id: int, task_id: int, admin_comment: str) -> None:
        self._change(self.inner.split_array_task, array_job_id, task_id, admin_comment)

    def requeue_hold(self, job_id: int) -> None:
        self._change(self.inner.requeue_hold, job_id)

    def signal(self, job_id: int, signal: str) -> None:
        self._change(self.inner.signal, job_id, signal)

    def cancel(self, job_id: int) -> None:
        self._change(self.inner.cancel, job_id)

    def signal_steps(self, job_id: int, signal: str) -> None:
        self._change(self.inner.signal_steps, job_id, signal)

    def write_files(self, owner: RunAs, directory: str, files: Mapping[str, str]) -> None:
        self.inner.write_files(owner, directory, files)  # (files, not a change to Slurm)

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        return int(self._change(self.inner.submit_as, script, owner, dependency=dependency))


#: Fault drill: with ``HADAR_SIDECAR_CRASH_AFTER_WRITES=N`` in its environment the sidecar
#: kills itself (SIGKILL, no cleanup) once it has made N changes to Slurm, as it is about to
#: make the next one, i.e. in the middle of applying an epoch.  The restart tests use it;
#: nothing else should set it.
CRASH_ENV = "HADAR_SIDECAR_CRASH_AFTER_WRITES"


class CrashDrillApi(PassThroughApi):
    """A :class:`SlurmApi` that passes every call to ``inner`` and kills this process (SIGKILL)
    when asked for a change after ``after`` changes went through (:data:`CRASH_ENV`)."""

    def __init__(self, inner: SlurmApi, after: int) -> None:
        super().__init__(inner)
        self.after = after
        self.writes = 0

    def _change(self, call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if self.writes >= self.after:
            log = logging.getLogger("hadar_slurm.sidecar")
            log_event(log, "crash_drill", logging.WARNING, writes=self.writes,
                      next_call=getattr(call, "__name__", "?"))
            for h in logging.getLogger("hadar_slurm").handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        out = call(*args, **kw)
        self.writes += 1
        return out


def with_drills(api: SlurmApi, environ: Mapping[str, str] | None = None) -> SlurmApi:
    """``api``, wrapped in :class:`CrashDrillApi` when :data:`CRASH_ENV` is set."""
    value = (os.environ if environ is None else environ).get(CRASH_ENV, "")
    return CrashDrillApi(api, int(value)) if value.isdigit() else api
