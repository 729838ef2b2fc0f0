"""Job traces in Gavel's 10-column format.

One job per line, TAB-separated, no header; job ids are 0-based line numbers among the jobs::

    job_type  command  working_directory  num_steps_arg  needs_data_dir
    total_steps  scale_factor  priority_weight  SLO  arrival_time

Only ``job_type``, ``total_steps``, ``scale_factor``, ``priority_weight``, ``SLO`` and
``arrival_time`` matter to the scheduler.  Blank lines and lines starting with ``#`` are skipped.
Every problem is an :class:`~hadar_slurm.errors.InputError` naming the file, line and field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from hadar_slurm.errors import InputError
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.rates.table import ThroughputTable

FIELDS = (
    "job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir",
    "total_steps", "scale_factor", "priority_weight", "SLO", "arrival_time",
)

BUNDLED_TRACES = ("static_32_seed0", "static_48_multigpu_seed1", "poisson_200_lam900_seed0")


def _number(text: str, *, source: str, line: int, field: str, integer: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (integer and value != int(value)):
        kind = "an integer" if integer else "a number"
        raise InputError(f"expected {kind}, got {text!r}", source=source, line=line, field=field)
    return value


def parse_trace(text: str, source: str, table: ThroughputTable | None = None) -> list[Job]:
    """Parse a trace; with ``table``, also check that every job type is in it."""
    jobs: list[Job] = []
    last_arrival = -math.inf
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        cols = raw.rstrip("\r\n").split("\t")
        if len(cols) != len(FIELDS):
            raise InputError(
                f"expected {len(FIELDS)} TAB-separated fields, got {len(cols)}",
                source=source, line=n, fix="fields are " + ", ".join(FIELDS),
            )
        job_type = cols[0].strip()
        if not job_type:
            raise InputError("empty job type", source=source, line=n, field="job_type")
        steps = _number(cols[5], source=source, line=n, field="total_steps")
        if steps <= 0:
            raise InputError(
                f"work must be positive, got {cols[5]!r}", source=source, line=n,
                field="total_steps", fix="give the number of iterations to run, > 0",
            )
        sf = int(_number(cols[6], source=source, line=n, field="scale_factor", integer=True))
        if sf < 1:
            raise InputError(
                f"scale factor must be >= 1, got {cols[6]!r}", source=source, line=n,
                field="scale_factor",
            )
        weight = _number(cols[7], source=source, line=n, field="priority_weight")
        if weight <= 0:
            raise InputError(
                f"priority weight must be > 0, got {cols[7]!r}", source=source, line=n,
                field="priority_weight",
            )
        slo = _number(cols[8], source=source, line=n, field="SLO")
        arrival = _number(cols[9], source=source, line=n, field="arrival_time")
        if arrival < 0:
            raise InputError(
                f"arrival time must be >= 0, got {cols[9]!r}", source=source, line=n,
                field="arrival_time",
            )
        if arrival < last_arrival:
            raise InputError(
                f"arrival time {arrival:g} goes backwards (previous job arrived at "
                f"{last_arrival:g})", source=source, line=n, field="arrival_time",
                fix="sort the trace by arrival time",
            )
        last_arrival = arrival
        if table is not None and not table.has_job(job_type, sf):
            raise InputError(
                f"unknown job type {job_type!r} on {sf} GPU(s): not in the throughput table "
                f"{table.source}", source=source, line=n, field="job_type",
                fix="use a job type of the table or pass --throughputs with its rates",
            )
        jobs.append(Job(
            job_id=len(jobs), job_type=job_type, scale_factor=sf, total_steps=steps,
            arrival_s=arrival, weight=weight, sync=True, slo_s=slo if slo > 0 else None,
        ))
    if not jobs:
        raise InputError("the trace has no jobs", source=source)
    return jobs


def load_trace(path: str | Path, table: ThroughputTable | None = None) -> list[Job]:
    """Read a trace file; the name of a bundled trace (e.g. ``static_32_seed0``) also works."""
    text, source = read_trace_text(path)
    return parse_trace(text, source, table)


def read_trace_text(path: str | Path) -> tuple[str, str]:
    p = Path(path)
    if not p.exists() and str(path) in BUNDLED_TRACES:
        ref = resources.files("hadar_slurm") / "data" / "gavel" / "traces" / f"{path}.trace"
        return ref.read_text(), f"bundled:{path}"
    try:
        return p.read_text(), str(path)
    except OSError as exc:
        raise InputError(f"cannot read trace: {exc.strerror}", source=str(path)) from None


def job_line_numbers(text: str) -> list[int]:
    """1-based line numbers of the job lines of a trace, in order (``job_id`` indexes it)."""
    return [
        n for n, raw in enumerate(text.splitlines(), start=1)
        if raw.strip() and not raw.lstrip().startswith("#")
    ]


def check_runnable(
    jobs: Sequence[Job],
    table: ThroughputTable,
    cluster: ClusterSpec,
    *,
    source: str,
    lines: Sequence[int] | None = None,
) -> None:
    """Raise an :class:`InputError` for the first job that no GPU of ``cluster`` can run.

    A job can run when the GPU types of the cluster that have a throughput for it hold at least
    ``scale_factor`` GPUs together.  ``lines[job_id]`` is the job's line in ``source``
    (see :func:`job_line_numbers`).
    """
    types = cluster.gpu_types
    listed = ", ".join(f"{cluster.capacity(g)} {g}" for g in types)
    for job in jobs:
        line = lines[job.job_id] if lines is not None and job.job_id < len(lines) else None
        runnable = [g for g in types if table.rate(job.job_type, job.scale_factor, g) > 0]
        if not runnable:
            elsewhere = [
                g for g in table.gpu_types()
                if table.rate(job.job_type, job.scale_factor, g) > 0
            ]
            known = f"; it has rates for {', '.join(elsewhere)}" if elsewhere else ""
            raise InputError(
                f"job {job.job_id} ({job.job_type!r} on {job.scale_factor} GPU(s)) has no "
                f"throughput on any GPU type of the cluster ({listed}){known}",
                source=source, line=line, field="job_type",
                fix="add a GPU type it runs on to --cluster, or its rates to --throughputs",
            )
        usable = sum(cluster.capacity(g) for g in runnable)
        if usable < job.scale_factor:
            raise InputError(
                f"job {job.job_id} ({job.job_type!r}) needs {job.scale_factor} GPUs but the "
                f"cluster has only {usable} it can run on ({listed})",
                source=source, line=line, field="scale_factor",
                fix="use a larger --cluster or a smaller scale factor",
            )


#: How much a draw changes a job's length at most (relative): ``simulate --draws``,
#: ``bench.packed --draws`` (:func:`perturbed_jobs`).
DRAW_REL = 1e-4


def perturbed_jobs(jobs: Sequence[Job], rel: float, seed: int) -> list[Job]:
    """``jobs`` with every length (``total_steps``) times ``1 + rel * u``, ``u`` uniform on
    [-1, 1], drawn in job order from a generator seeded with ``seed``."""
    if not 0.0 <= rel < 1.0:
        raise ValueError(f"rel must be in [0, 1), got {rel!r}")
    u = np.random.default_rng(seed).uniform(-1.0, 1.0, len(jobs))
    return [replace(j, total_steps=j.total_steps * (1.0 + rel * float(x)))
            for j, x in zip(jobs, u, strict=True)]
