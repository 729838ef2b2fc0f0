"""What the sidecar needs from Slurm, as one small interface with two implementations.

:class:`SlurmApi` is the whole surface: the Slurm release (read once, at start), one batched
read of all jobs, one of all nodes, and a handful of per-job actions.  :class:`CliApi` speaks the
Slurm CLI (``scontrol version``, ``squeue --json``, ``sinfo --json``, ``scontrol``,
``scancel``) through :class:`~hadar_slurm.slurm.SlurmRunner`;
:mod:`hadar_slurm.sidecar.pyslurm_api` maps the same calls onto pyslurm.  Everything else
(parsing hints, the snapshot, the diff, the decisions) is shared code above this interface.

Every implementation counts the Slurm calls it issued in :attr:`SlurmApi.commands`, so the
epoch overhead benchmark can show that reads per epoch are constant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from hadar_slurm.slurm import RunAs, SlurmJob, SlurmNode, SlurmRunner, commands
from hadar_slurm.slurm.parse import (
    parse_job_ids,
    parse_sbatch_parsable,
    parse_sinfo_json,
    parse_squeue_json,
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

    def requeue_hold(self, job_id: int) -> None:
        """Stop a running job and put it back in the queue, held (``scontrol requeuehold``)."""
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

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        """Submit the batch script at path ``script`` as ``owner`` (``sbatch --parsable``),
        optionally with ``--dependency``; the new job's (leader's) id."""
        ...


class CliApi:
    """:class:`SlurmApi` over the Slurm command line tools (tested with Slurm 22.05, 24.11 and
    26.05)."""

    name = "cli"
    can_fork = True

    def __init__(self, runner: SlurmRunner) -> None:
        self.runner = runner
        self.commands = 0

    def _run(self, argv: list[str]) -> str:
        self.commands += 1
        return self.runner.run(argv).stdout

    def slurm_version(self) -> SlurmVersion:
        return parse_version(self._run(scontrol_version()))

    def read_jobs(self) -> list[SlurmJob]:
        return list(parse_squeue_json(self._run(commands.squeue_json()), source="squeue --json"))

    def read_nodes(self) -> list[SlurmNode]:
        return list(parse_sinfo_json(self._run(commands.sinfo_json()), source="sinfo --json"))

    def live_job_ids(self) -> frozenset[int]:
        return parse_job_ids(self._run(commands.squeue_live_ids()))

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        unknown = set(fields) - set(UPDATE_FIELDS)
        if unknown:
            raise ValueError(f"update_job: unsupported fields {sorted(unknown)}")
        self._run(commands.scontrol_update_job(job_id, fields))

    def hold(self, job_id: int) -> None:
        self._run(commands.scontrol_hold(job_id))

    def release(self, job_id: int) -> None:
        self._run(commands.scontrol_release(job_id))

    def requeue_hold(self, job_id: int) -> None:
        self._run(commands.scontrol_requeue(job_id, hold=True))

    def signal(self, job_id: int, signal: str) -> None:
        self._run(commands.scancel(job_id, signal=signal, full=True))

    def cancel(self, job_id: int) -> None:
        self._run(commands.scancel(job_id))

    def signal_steps(self, job_id: int, signal: str) -> None:
        self._run(commands.scancel(job_id, signal=signal))

    def batch_script(self, job_id: int) -> str:
        return self._run(commands.scontrol_write_batch_script(job_id))

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        self.commands += 1
        out = self.runner.run(commands.sbatch(script=script, dependency=dependency),
                              as_user=owner)
        return parse_sbatch_parsable(out.stdout)


class DryRunApi:
    """Shadow mode: reads go to Slurm, changes are only written down (and logged by the
    caller); nothing in Slurm changes.  ``would`` lists ``(call, job_id, detail)``."""

    def __init__(self, inner: SlurmApi) -> None:
        self.inner = inner
        self.name = f"dry-run({inner.name})"
        self.would: list[tuple[str, int, str]] = []

    @property
    def commands(self) -> int:
        return self.inner.commands

    def slurm_version(self) -> SlurmVersion:
        return self.inner.slurm_version()

    def read_jobs(self) -> list[SlurmJob]:
        return self.inner.read_jobs()

    def read_nodes(self) -> list[SlurmNode]:
        return self.inner.read_nodes()

    def live_job_ids(self) -> frozenset[int]:
        return self.inner.live_job_ids()

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        self.would.append(("update", job_id, " ".join(f"{k}={v}" for k, v in fields.items())))

    def hold(self, job_id: int) -> None:
        self.would.append(("hold", job_id, ""))

    def release(self, job_id: int) -> None:
        self.would.append(("release", job_id, ""))

    def requeue_hold(self, job_id: int) -> None:
        self.would.append(("requeuehold", job_id, ""))

    def signal(self, job_id: int, signal: str) -> None:
        self.would.append(("signal", job_id, signal))

    def cancel(self, job_id: int) -> None:
        self.would.append(("cancel", job_id, ""))

    @property
    def can_fork(self) -> bool:
        return self.inner.can_fork

    def signal_steps(self, job_id: int, signal: str) -> None:
        self.would.append(("signal-steps", job_id, signal))

    def batch_script(self, job_id: int) -> str:
        return self.inner.batch_script(job_id)  # a read

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        self.would.append(("sbatch", owner.uid, f"{script} dependency={dependency or ''}"))
        return 0
