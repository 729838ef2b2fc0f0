"""Argv builders for the Slurm commands the backends use.  Pure: they only build lists.

Options go out as single ``--name=value`` arguments (a value that starts with ``-`` cannot be
taken for an option), and nothing here goes through a shell.  Run them with
:meth:`hadar_slurm.slurm.runner.SlurmRunner.run`.

Slurm 22.05 notes: ``squeue --json`` ignores ``-j`` (it dumps all jobs), so callers filter by job
id after parsing; ``scontrol`` has no ``--json``; ``sbatch --parsable`` prints ``ID`` or
``ID;CLUSTER``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from hadar_slurm.slurm.parse import SQUEUE_LIVE_STATES

_UPDATE_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


#: A job as the commands name it: its job id, or ``"A_T"``, task ``T`` of the job array
#: ``A``: the one name of the array task whose record keeps the array's job id (Slurm's last
#: pending task; ``A`` alone there names every task of the array).
JobRef = int | str
_TASK_REF = re.compile(r"[1-9][0-9]{0,9}_[0-9]{1,10}")


def _job_id(job_id: JobRef) -> str:
    if isinstance(job_id, str):
        if _TASK_REF.fullmatch(job_id):
            return job_id
        raise ValueError(f"job id must be a positive int or ARRAY_TASK, got {job_id!r}")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise ValueError(f"job id must be a positive int, got {job_id!r}")
    return str(job_id)


def _value(name: str, value: object) -> str:
    text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise ValueError(f"{name} must be one line without NUL bytes, got {text!r}")
    return text


def squeue_json() -> list[str]:
    """All jobs (pending, running, and finished ones younger than MinJobAge) as JSON.  22.05
    lists them all anyway; 24.11+ apply squeue's default state filter without ``--states=all``."""
    return ["squeue", "--json", "--states=all"]


#: Every job state that is not final, as ``squeue --states`` names them (Slurm 22.05+).
LIVE_STATES = SQUEUE_LIVE_STATES


def squeue_live_ids() -> list[str]:
    """The ids of the jobs that have not ended (:data:`LIVE_STATES`), one per line: a light
    read (no JSON, no other field) for polling between epochs.  A heterogeneous job's
    components are listed by their own ids (``%A``)."""
    return ["squeue", "--noheader", f"--states={','.join(LIVE_STATES)}", "--format=%A"]


def sinfo_json() -> list[str]:
    """All nodes as JSON (22.05: a ``nodes`` list; 23.x+: a ``sinfo`` list of node groups)."""
    return ["sinfo", "--json"]


def sbatch(
    *, wrap: str | None = None, script: str | None = None, job_name: str | None = None,
    gres: str | None = None, constraint: str | None = None, nodelist: str | None = None,
    partition: str | None = None, comment: str | None = None, hold: bool = False,
    output: str | None = None, error: str | None = None, chdir: str | None = None,
    time_limit: str | None = None, nodes: int | None = None, ntasks: int | None = None,
    cpus_per_task: int | None = None, mem: str | None = None, requeue: bool | None = None,
    dependency: str | None = None, extra: Sequence[str] = (), script_args: Sequence[str] = (),
) -> list[str]:
    """``sbatch --parsable ...`` with either ``wrap`` (a command line, which sbatch itself runs
    with /bin/sh in the job) or ``script`` (a path, followed by ``script_args``).  ``extra``
    (more options) is appended as given."""
    if (wrap is None) == (script is None):
        raise ValueError("sbatch needs exactly one of wrap= or script=")
    if script_args and script is None:
        raise ValueError("script_args= needs script=")
    argv = ["sbatch", "--parsable"]
    options: list[tuple[str, object | None]] = [
        ("job-name", job_name), ("gres", gres), ("constraint", constraint),
        ("nodelist", nodelist), ("partition", partition), ("comment", comment),
        ("output", output), ("error", error), ("chdir", chdir), ("time", time_limit),
        ("nodes", nodes), ("ntasks", ntasks), ("cpus-per-task", cpus_per_task), ("mem", mem),
        ("dependency", dependency),
    ]
    for name, value in options:
        if value is not None:
            argv.append(f"--{name}={_value(name, value)}")
    if hold:
        argv.append("--hold")
    if requeue is not None:
        argv.append("--requeue" if requeue else "--no-requeue")
    for item in extra:
        argv.append(_value("extra", item))
    if wrap is not None:
        argv.append(f"--wrap={_value('wrap', wrap)}")
    else:
        assert script is not None
        argv.append(_value("script", script))
        argv.extend(_value("script_args", a) for a in script_args)
    return argv


def scancel(
    job_ids: JobRef | Iterable[JobRef], *, signal: str | None = None, full: bool = False,
) -> list[str]:
    """``scancel`` (or, with ``signal``, send a signal).  ``full``: to the batch script and
    every step too (without it, a signal reaches only the steps, not a batch script)."""
    ids = [job_ids] if isinstance(job_ids, int | str) else list(job_ids)
    if not ids:
        raise ValueError("scancel needs at least one job id")
    argv = ["scancel"]
    if signal is not None:
        argv.append(f"--signal={_value('signal', signal)}")
    if full:
        argv.append("--full")
    argv.extend(_job_id(j) for j in ids)
    return argv


def scontrol_hold(job_id: JobRef) -> list[str]:
    return ["scontrol", "hold", _job_id(job_id)]


def scontrol_release(job_id: JobRef) -> list[str]:
    return ["scontrol", "release", _job_id(job_id)]


def scontrol_release_jobs(job_ids: Iterable[int]) -> list[str]:
    """``scontrol release ID,ID,...``: several held jobs in one request, so that slurmctld may
    start them in the same scheduling pass (a placed pair of jobs sharing a GPU)."""
    ids = list(job_ids)
    if not ids:
        raise ValueError("scontrol release needs at least one job id")
    return ["scontrol", "release", ",".join(_job_id(j) for j in ids)]


def scontrol_requeue(job_id: JobRef, *, hold: bool = False) -> list[str]:
    """``requeue`` (back to pending), or ``requeuehold`` (pending and held)."""
    return ["scontrol", "requeuehold" if hold else "requeue", _job_id(job_id)]


def scontrol_update_job(job_id: JobRef, fields: Mapping[str, object]) -> list[str]:
    """``scontrol update JobId=ID Key=Value ...``, e.g. ``{"NodeList": "node2",
    "Features": "p100", "AdminComment": "hadar:epoch=3"}``; one argv element per field."""
    if not fields:
        raise ValueError("scontrol update needs at least one field")
    argv = ["scontrol", "update", f"JobId={_job_id(job_id)}"]
    for key, value in fields.items():
        if not _UPDATE_KEY.match(key) or key.lower() == "jobid":
            raise ValueError(f"bad scontrol update field name {key!r}")
        argv.append(f"{key}={_value(key, value)}")
    return argv


def scontrol_split_array_task(array_job_id: int, task_id: int, admin_comment: str) -> list[str]:
    """Give the pending task ``task_id`` of the job array ``array_job_id`` a job record of its
    own: ``scontrol update JobId=A_T AdminComment=...`` with the array's admin comment as it
    is.  Any update of one pending task splits it off the array's record (Slurm 22.05, 24.11
    and 26.05), as Slurm does itself when a task starts; the new record keeps the array's
    settings and gets the next job id."""
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
        raise ValueError(f"array task id must be an int >= 0, got {task_id!r}")
    return ["scontrol", "update", f"JobId={_job_id(array_job_id)}_{task_id}",
            f"AdminComment={_value('AdminComment', admin_comment)}"]


def scontrol_write_batch_script(job_id: JobRef) -> list[str]:
    """The batch script of a job (pending ones too), to stdout: ``scontrol write batch_script
    ID -`` (Slurm 22.05 has it; root, SlurmUser or the job's owner may ask)."""
    return ["scontrol", "write", "batch_script", _job_id(job_id), "-"]


def scontrol_show_job_details(job_id: JobRef) -> list[str]:
    """``scontrol --details --oneliner show job ID``: as :func:`scontrol_show_job`, plus what
    the job holds on each node (``Nodes=node1 CPU_IDs=0 Mem=256 GRES=shard:1(IDX:0)``; 24.11+:
    ``GRES=shard:1(1/2,0/2)``), the GPU indices of its gres."""
    return ["scontrol", "--details", "--oneliner", "show", "job", _job_id(job_id)]


def scontrol_show_job(job_id: JobRef) -> list[str]:
    """``scontrol --oneliner show job ID``: one line of ``Key=Value`` (no ``--json`` in
    22.05); read it with :func:`hadar_slurm.slurm.parse.parse_scontrol_show`."""
    return ["scontrol", "--oneliner", "show", "job", _job_id(job_id)]
