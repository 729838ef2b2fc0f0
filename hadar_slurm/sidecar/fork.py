"""HadarE in the sidecar: what a forked job looks like in Slurm, and the pieces of a fork.

A hinted job ``J`` (hint ``fork=N``) that the policy forks into ``k >= 2`` copies keeps its place
in the queue, held, with ``Dependency=afterany:K`` and the record ``state=forked group=K
copies=k`` in its AdminComment, while its copies run as ONE heterogeneous job ``K`` (one
component per copy, :func:`hadar_slurm.slurm.hetjob.render_hetjob`) whose components carry the
comment ``hadar-copy-of=J``.  That comment is the link Slurm itself keeps: a restarted sidecar
finds a fork by it alone (:func:`find_groups`), also one it submitted but had no time to record.

The copies run J's own batch script (fetched with ``scontrol write batch_script``, saved in J's
*tracker directory* with J's hints), as J's owner, in J's working directory; the job tracker
(``hadar_slurm.runtime``) adds up their iterations in the tracker directory and writes
``progress.json`` there, which the sidecar reads as the job's progress (:func:`read_progress`).
When the copies end, J itself runs (unforked, as usual) and its runtime continues from, or
finishes with, the tracker's state.

Files go into the tracker directory as J's owner (``mkdir``/``tee`` run as that user when the
sidecar is root), never as root in a directory a user controls.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from hadar_slurm.runtime.tracker import PROGRESS_FILE
from hadar_slurm.slurm import RunAs, SlurmJob
from hadar_slurm.slurm.parse import QUEUED_STATES, RUNNING_STATES

#: The comment of every component of a fork of job J: ``hadar-copy-of=J``.
COPY_OF = "hadar-copy-of="
#: The tracker directory of job J under a root: ``<root>/.hadar-tracker/<J>``.
TRACKER_SUBDIR = ".hadar-tracker"
SCRIPT_FILE = "job.sh"
HINTS_FILE = "hints"
PLAN_FILE = "fork.sbatch"
#: Component states of a fork that still runs or waits.
LIVE_STATES = QUEUED_STATES
_MAX_PROGRESS_BYTES = 1 << 20
_COPY_OF = re.compile(r"^hadar-copy-of=([0-9]+)$")
_DEP_JOB = re.compile(r"^[a-z]+:([0-9]+)")


class ForkError(RuntimeError):
    """A fork cannot be made (or a step of it failed); the message says why, in one line."""


def copy_of(comment: str) -> int | None:
    """The original job of a fork's component (its comment ``hadar-copy-of=J``), else None."""
    m = _COPY_OF.match(comment.strip())
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class CopyGroup:
    """The copies of job ``original``: the heterogeneous job ``leader``, by component."""

    original: int
    leader: int
    components: tuple[SlurmJob, ...]  # by het_job_offset (copy index)

    @property
    def live(self) -> bool:
        """Some component waits or runs (one being cancelled, COMPLETING, is not live)."""
        return any(c.state in LIVE_STATES for c in self.components)

    @property
    def running(self) -> bool:
        return any(c.state in RUNNING_STATES for c in self.components)

    @property
    def completed(self) -> bool:
        """Every component ended COMPLETED (the copies exited 0)."""
        return all(c.state == "COMPLETED" for c in self.components)

    @property
    def size(self) -> int:
        return len(self.components)

    def copies(self) -> list[tuple[int, str, int]]:
        """``(copy index, node, GPUs)`` of each component: where it runs, or, while pending,
        where it asked to run (``--nodelist``)."""
        out = []
        for k, c in enumerate(self.components):
            index = c.het_job_offset if c.het_job_offset is not None else k
            nodes = c.node_names or tuple(
                n for n in c.required_nodes.split(",") if n)
            out.append((index, nodes[0] if nodes else "", c.gpus_per_node))
        return out

    def start_time(self) -> float | None:
        times = [c.start_time for c in self.components if c.start_time]
        return float(min(times)) if times and self.running else None

    def describe(self) -> str:
        """``hetjob K: 0 node1, 1 node2 (RUNNING)``."""
        where = ", ".join(f"{i} {n or '?'}" for i, n, _ in self.copies())
        states = "/".join(sorted({c.state for c in self.components}))
        return f"hetjob {self.leader}: {where} ({states})"


def find_groups(jobs: Iterable[SlurmJob]) -> dict[int, list[CopyGroup]]:
    """The forks in a read of all jobs: ``{original job id: [groups, oldest first]}``.  A
    component without heterogeneous job fields (a one-copy fork is a plain job) is its own
    group."""
    parts: dict[tuple[int, int], list[SlurmJob]] = {}
    for job in jobs:
        original = copy_of(job.comment)
        if original is None:
            continue
        leader = job.het_job_id or job.job_id
        parts.setdefault((original, leader), []).append(job)
    out: dict[int, list[CopyGroup]] = {}
    for (original, leader), comps in sorted(parts.items()):
        comps.sort(key=lambda c: (c.het_job_offset or 0, c.job_id))
        out.setdefault(original, []).append(CopyGroup(original, leader, tuple(comps)))
    return out


def dependency_jobs(dependency: str) -> list[int]:
    """Job ids a Slurm dependency string names (``afterany:57(unfulfilled),afterok:3``)."""
    out = []
    for part in re.split(r"[,?]", dependency):
        m = _DEP_JOB.match(part.strip())
        if m:
            out.append(int(m.group(1)))
    return out


# -- the owner ---------------------------------------------------------------------------------


def owner_of(job: SlurmJob) -> RunAs:
    """Who the copies of ``job`` must be submitted as: its owner, with a plain environment
    (PATH from the sidecar, HOME/USER/LOGNAME/SHELL of the owner).  Raises :class:`ForkError`
    when this process cannot act as the owner (it is neither root nor the owner)."""
    uid, gid = job.user_id, job.group_id
    if uid is None or gid is None:
        raise ForkError("Slurm did not report the job's user and group id")
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise ForkError(f"uid {uid} has no passwd entry on the sidecar's host") from None
    me = os.geteuid()
    if me != 0 and me != uid:
        raise ForkError(f"the sidecar runs as uid {me}, not root, so it cannot submit jobs for "
                        f"uid {uid} ({entry.pw_name})")
    try:
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, gid))))
    except OSError:
        groups = (gid,)
    env = {
        "PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin",
        "HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name,
        "SHELL": entry.pw_shell or "/bin/sh",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    return RunAs(uid, gid, groups, env)


# -- the tracker directory ---------------------------------------------------------------------


def array_env(job: SlurmJob) -> dict[str, str]:
    """What Slurm tells a task of a job array about its place in the array, for the copies of
    a forked task (``ForkPlan.env``): the copies are a job of their own, not a task of the
    array, so without it a script that picks its work by ``$SLURM_ARRAY_TASK_ID`` (a study's
    trial launcher, :mod:`hadar_slurm.studies.trial`) would not know which task it is.  Empty
    for a job that is not an array task."""
    if job.array_job_id is None or job.array_task_id is None:
        return {}
    return {"SLURM_ARRAY_JOB_ID": str(job.array_job_id),
            "SLURM_ARRAY_TASK_ID": str(job.array_task_id)}


def tracker_dir(job: SlurmJob, root: str | None) -> str:
    """``<root>/.hadar-tracker/<J>``, where ``root`` is ``tracker_root`` when set, else the
    job's working directory (where the runtime looks when the job itself runs).  Raises
    :class:`ForkError` when the job has no (absolute) working directory."""
    base = root or job.workdir
    if not base or not base.startswith("/"):
        raise ForkError(f"job {job.job_id} has no absolute working directory "
                        f"({job.workdir!r}) for its tracker")
    return os.path.join(base, TRACKER_SUBDIR, str(job.job_id))


@dataclass(frozen=True)
class Progress:
    """The job tracker's ``progress.json`` (format 1 of :mod:`hadar_slurm.runtime`):
    iterations ``done`` of ``work``, the copies' rates of the last round (iterations/s, by copy
    index, with their GPU types), rounds committed, whether the work is complete, and when it
    was written."""

    done: float
    work: float | None
    rates: dict[int, float]
    gpu_types: dict[int, str]
    rounds: int | None
    complete: bool
    updated_at: float | None
    #: the copies that reported in the last round: copy index -> (iterations, seconds)
    measured: dict[int, tuple[float, float]] = field(default_factory=dict)
    run: str | None = None
    #: rounds the current run committed (None from a runtime that does not say)
    run_rounds: int | None = None
    #: the most GPU memory each copy held, MiB, where its runtime says (on CUDA)
    gpu_mem: dict[int, float] = field(default_factory=dict)

    @property
    def total_rate(self) -> float:
        return sum(self.rates.values())


def read_progress(directory: str) -> Progress | None:
    """``progress.json`` of a tracker directory; None when there is none or it cannot be read
    (a half-written file is read again next epoch).  Read without following a symlink, and at
    most 1 MiB of it."""
    path = os.path.join(directory, PROGRESS_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(_MAX_PROGRESS_BYTES + 1)[:_MAX_PROGRESS_BYTES])
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    done = _number(data.get("done"))
    if done is None:
        return None
    rates: dict[int, float] = {}
    types: dict[int, str] = {}
    measured: dict[int, tuple[float, float]] = {}
    mem: dict[int, float] = {}
    raw = data.get("copy_rates")
    for k, entry in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(entry, dict):
            continue
        index = entry.get("copy", k)
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        rate = _number(entry.get("iters_per_s"))
        if rate is not None:
            rates[index] = rate
        if isinstance(entry.get("gpu_type"), str):
            types[index] = entry["gpu_type"]
        iters, seconds = _number(entry.get("iters")), _number(entry.get("seconds"))
        if iters is not None and seconds is not None and iters > 0 and seconds > 0:
            measured[index] = (iters, seconds)
        held = _number(entry.get("gpu_mem_mib"))
        if held is not None and held > 0:
            mem[index] = held
    rounds = _number(data.get("rounds"))
    run_rounds = _number(data.get("run_rounds"))
    run = data.get("run")
    return Progress(done=done, work=_number(data.get("work")), rates=rates, gpu_types=types,
                    rounds=int(rounds) if rounds is not None else None,
                    complete=data.get("complete") is True,
                    updated_at=_number(data.get("updated_at")), measured=measured,
                    run=run if isinstance(run, str) else None,
                    run_rounds=int(run_rounds) if run_rounds is not None else None,
                    gpu_mem=mem)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    x = float(value)
    return x if math.isfinite(x) and x >= 0 else None


def sbatch_name(name: str, job_id: int) -> str:
    """J's name as it may stand in an ``#SBATCH --job-name=`` line (other characters become
    ``_``)."""
    clean = re.sub(r"[^A-Za-z0-9._+=:,@%/-]", "_", name)
    return clean or f"hadar-{job_id}"
