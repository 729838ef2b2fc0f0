"""Profile every GPU type of a Slurm cluster: ``hadar-slurm profile --slurm``.

:func:`profile_on_slurm` submits one benchmark job per GPU type of a Slurm cluster, waits for
them and records each type's rate.  Each job runs the ``profile`` command, which measures with
:func:`hadar_slurm.rates.profile.profile_model` a benchmark model of
:mod:`hadar_slurm.rates.profile_models`.

Slurm
-----
:func:`profile_on_slurm` submits, for every GPU type of the cluster's nodes that have at least
``gpus`` GPUs (and are not down or drained), one batch job ``--gres=gpu:<type>:<gpus>
--nodes=1`` running ``python -m hadar_slurm.cli.nvml profile ... --gpu-type <type> --no-record
--json`` (an argv, given to a fixed wrapper script as its arguments: no shell parses it), waits
for them all (at most ``timeout_s``, then cancels the rest), reads each job's JSON result from
its output file in ``workdir`` and records the rates into the store here, in the submitting
process: the store's SQLite WAL file must be on a local file system, while ``workdir`` must be
one the nodes share.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hadar_slurm.errors import InputError
from hadar_slurm.model import normalize_gpu_type
from hadar_slurm.rates.profile import DEFAULT_WARMUP, ProfileResult, record_result
from hadar_slurm.rates.profile_models import check_gpu_type, job_type_for
from hadar_slurm.slurm import SlurmError, SlurmNode, SlurmRunner, commands
from hadar_slurm.slurm.parse import (
    UNFINISHED_STATES,
    parse_sbatch_parsable,
    parse_sinfo_json,
    parse_squeue_json,
)

if TYPE_CHECKING:
    from hadar_slurm.rates.store import Entry, ThroughputStore

__all__ = [
    "ProfileRequest",
    "SlurmProfile",
    "cluster_gpu_types",
    "profile_on_slurm",
]

#: Job states of a profiling job that has not ended.
_LIVE = UNFINISHED_STATES
_WRAPPER = """#!/bin/sh
# hadar-slurm profile: a benchmark job.  Its command is this script's arguments (an argv given
# to sbatch), run as is: no shell parses it.
exec "$@"
"""


# ---------------------------------------------------------------------------------- Slurm

@dataclass(frozen=True)
class ProfileRequest:
    """What to profile, as the ``profile`` command's options (what a Slurm job is told)."""

    model: str
    batch_size: int | None
    gpus: int = 1
    warmup_iters: int = DEFAULT_WARMUP
    timed_iters: int | None = None
    seconds: float | None = None
    device: str | None = None
    threads: int | None = None

    def argv(self, gpu_type: str) -> list[str]:
        """``python -m hadar_slurm.cli.nvml profile ...`` for a job on ``gpu_type``: it prints
        its result as JSON and records nothing (the submitter records)."""
        args = [sys.executable, "-m", "hadar_slurm.cli.nvml", "profile", "--model", self.model]
        if self.batch_size is not None:
            args += ["--batch-size", str(self.batch_size)]
        args += ["--gpus", str(self.gpus), "--warmup", str(self.warmup_iters),
                 "--gpu-type", gpu_type, "--no-record", "--json"]
        if self.timed_iters is not None:
            args += ["--iters", str(self.timed_iters)]
        if self.seconds is not None:
            args += ["--seconds", repr(float(self.seconds))]
        if self.device is not None:
            args += ["--device", self.device]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        return args


@dataclass(frozen=True)
class SlurmProfile:
    """One GPU type's profiling job: its ``job_id`` (None when not submitted), final ``state``,
    ``result`` (None when it failed: ``error`` says why) and the ``entry`` recorded."""

    gpu_type: str
    job_id: int | None
    state: str
    result: ProfileResult | None = None
    error: str | None = None
    entry: Entry | None = None

    def summary(self) -> str:
        if self.job_id is None:
            return f"{self.gpu_type}: not submitted: {self.error}"
        job = f"job {self.job_id}"
        if self.result is None:
            return f"{self.gpu_type}: {job} {self.state}: {self.error}"
        r = self.result
        recorded = " (recorded)" if self.entry is not None else ""
        return (f"{self.gpu_type}: {job} {self.state}: {r.steps_per_second:.3f} steps/s on "
                f"{r.device}, p50 {r.iter_ms_p50:.2f} ms{recorded}")


def cluster_gpu_types(nodes: Sequence[SlurmNode], gpus: int) -> dict[str, int]:
    """GPU type -> the most GPUs of it on one node, for the nodes that have at least ``gpus``
    of one type and are not down or drained."""
    out: dict[str, int] = {}
    for node in nodes:
        flags = set(node.state_flags)
        if node.state == "DOWN" or flags & {"DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING"}:
            continue
        for gres in node.gres:
            if gres.name == "gpu" and gres.type and gres.count >= gpus:
                kind = normalize_gpu_type(gres.type)
                out[kind] = max(out.get(kind, 0), gres.count)
    return dict(sorted(out.items()))


def _job_result(out_file: Path, err_file: Path) -> tuple[ProfileResult | None, str | None]:
    """The JSON result a job printed last, else why there is none (its last stderr line)."""
    try:
        lines = out_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        lines, why = [], f"no output file {out_file} ({exc.strerror})"
    else:
        why = "no JSON result in its output"
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return ProfileResult.from_json(json.loads(line), str(out_file)), None
            except (ValueError, InputError) as exc:
                return None, f"bad result in {out_file}: {exc}"
    with contextlib.suppress(OSError):
        tail = [x for x in err_file.read_text(errors="replace").splitlines() if x.strip()]
        if tail:
            why += f"; stderr: {tail[-1][:300]}"
    return None, why


def profile_on_slurm(
    runner: SlurmRunner,
    request: ProfileRequest,
    *,
    store: ThroughputStore | None,
    workdir: Path,
    gpu_types: Sequence[str] | None = None,
    partition: str | None = None,
    timeout_s: float = 600.0,
    poll_s: float = 1.0,
    log: Callable[[str], None] | None = None,
) -> list[SlurmProfile]:
    """Submit one profiling job per GPU type (``gpu_types``, default every type of the
    cluster with a node of at least ``request.gpus`` GPUs), wait for all of them (at most
    ``timeout_s``; the rest are cancelled) and record each result in ``store`` (None: record
    nothing).  ``workdir`` (created if needed) holds the job script and the jobs' output; it
    must be readable and writable on the nodes.  A type with no such node is reported as
    not submitted.  Raises :class:`InputError` for a bad request and
    :class:`~hadar_slurm.slurm.SlurmError` when Slurm cannot be asked."""
    say = log or (lambda _text: None)
    job_type_for(request.model, request.batch_size, request.gpus)  # fail before submitting
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise InputError(f"timeout must be a positive number of seconds, got {timeout_s!r}",
                         field="timeout")
    available = cluster_gpu_types(parse_sinfo_json(runner.run(commands.sinfo_json()).stdout),
                                  request.gpus)
    wanted = [check_gpu_type(t) for t in gpu_types] if gpu_types else list(available)
    if not wanted:
        raise InputError(f"no node of the cluster has {request.gpus} GPUs of one type",
                         field="gpus", fix="profile fewer GPUs per job")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        script = workdir / "profile-job.sh"
        script.write_text(_WRAPPER, encoding="utf-8")
        script.chmod(0o755)
    except OSError as exc:
        raise InputError(f"cannot write the job script: {exc.strerror}", source=str(workdir),
                         field="workdir", fix="give a writable directory the nodes share") \
            from None
    minutes = max(2, math.ceil(timeout_s / 60.0))
    outcomes: dict[str, SlurmProfile] = {}
    jobs: dict[str, int] = {}
    files: dict[str, tuple[Path, Path]] = {}
    try:
        for kind in wanted:
            if kind not in available:
                outcomes[kind] = SlurmProfile(kind, None, "NOT SUBMITTED", error=(
                    f"no up node has {request.gpus} {kind} GPUs"))
                continue
            out, err = workdir / f"profile-{kind}-%j.out", workdir / f"profile-{kind}-%j.err"
            argv = commands.sbatch(
                script=str(script), script_args=request.argv(kind),
                job_name=f"hadar-profile-{kind}", gres=f"gpu:{kind}:{request.gpus}", nodes=1,
                ntasks=1, output=str(out), error=str(err), chdir=str(workdir),
                time_limit=str(minutes), partition=partition, requeue=False)
            job_id = parse_sbatch_parsable(runner.run(argv).stdout)
            jobs[kind] = job_id
            files[kind] = (workdir / f"profile-{kind}-{job_id}.out",
                           workdir / f"profile-{kind}-{job_id}.err")
            say(f"{kind}: submitted job {job_id} (--gres=gpu:{kind}:{request.gpus})")
        states = _wait(runner, jobs, timeout_s, poll_s)
    except BaseException:
        if jobs:  # interrupted or failed: leave no job behind
            runner.run(commands.scancel(list(jobs.values())), check=False)
        raise
    late = [j for kind, j in jobs.items() if states[kind][0] in _LIVE]
    if late:
        runner.run(commands.scancel(late), check=False)
    for kind, job_id in jobs.items():
        state, exit_code = states[kind]
        if state in _LIVE:
            outcomes[kind] = SlurmProfile(kind, job_id, "TIMEOUT", error=(
                f"still {state} after {timeout_s:g} s: cancelled"))
            continue
        result, why = _job_result(*files[kind])
        if result is None:
            code = "" if exit_code is None else f"exit status {exit_code}: "
            outcomes[kind] = SlurmProfile(kind, job_id, state, error=f"{code}{why}")
            continue
        entry = record_result(store, result, kind) if store is not None else None
        outcomes[kind] = SlurmProfile(kind, job_id, state, result=result, entry=entry)
    return [outcomes[k] for k in wanted]


def _wait(runner: SlurmRunner, jobs: Mapping[str, int], timeout_s: float,
          poll_s: float) -> dict[str, tuple[str, int | None]]:
    """Poll squeue until every job has ended or ``timeout_s`` passed: type -> (state, exit
    status).  A job squeue no longer lists (past MinJobAge) has ended: ``GONE``."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, tuple[str, int | None]] = {k: ("PENDING", None) for k in jobs}
    while True:
        try:
            listed = {j.job_id: j for j in parse_squeue_json(
                runner.run(commands.squeue_json()).stdout)}
        except SlurmError:
            listed = None  # a slow or restarting slurmctld: ask again
        if listed is not None:
            for kind, job_id in jobs.items():
                job = listed.get(job_id)
                states[kind] = ("GONE", None) if job is None else (job.state, job.exit_code)
            if all(s not in _LIVE for s, _ in states.values()):
                return states
        if time.monotonic() >= deadline:
            return states
        time.sleep(poll_s)
