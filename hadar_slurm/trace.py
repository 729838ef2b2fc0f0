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
from importlib import resources
from pathlib import Path

from hadar_slurm.errors import InputError
from hadar_slurm.model import Job
from hadar_slurm.throughputs import ThroughputTable

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
