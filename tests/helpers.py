"""Helpers the tests share (imported as ``tests.helpers``; the fixtures built on them are in
conftest.py): tiny traces and throughput tables whose numbers are easy to work by hand, and the
command line run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hadar_slurm.model import Job
from hadar_slurm.policy.base import Placement, Snapshot

REPO = Path(__file__).resolve().parent.parent

# "toy" runs at 1 step/s on a v100 and 0.5 step/s on a k80; "toy2" is a 2-GPU job at 2 steps/s
# (whole job) on v100; "v100only" has no k80 rate.
TOY_CSV = """\
# job_type,scale_factor,gpu_type,steps_per_second
job_type,scale_factor,gpu_type,steps_per_second
toy,1,v100,1.0
toy,1,k80,0.5
toy2,2,v100,2.0
v100only,1,v100,1.0
"""


def trace_line(
    job_type: str, steps: float, arrival: float, *, scale: int = 1, weight: float = 1.0,
    slo: float = -1.0,
) -> str:
    """One line of a Gavel-format trace (10 TAB-separated fields)."""
    cols = [
        job_type, "python3 train.py", "toy", "--steps", "0",
        f"{steps:g}", str(scale), f"{weight:g}", f"{slo:f}", f"{arrival:g}",
    ]
    return "\t".join(cols)


def trace_text(lines: Sequence[str]) -> str:
    return "".join(line + "\n" for line in lines)


def make_job(job_id: int, steps: float, arrival: float, job_type: str = "toy",
             scale: int = 1) -> Job:
    return Job(job_id=job_id, job_type=job_type, scale_factor=scale, total_steps=steps,
               arrival_s=arrival)


def run_cli(
    *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``python -m hadar_slurm ARGS`` in a subprocess, as a user would run it (``env``: more
    environment variables)."""
    full = dict(os.environ)
    full["PYTHONPATH"] = str(REPO) + os.pathsep + full.get("PYTHONPATH", "")
    full["MPLBACKEND"] = "Agg"
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hadar_slurm", *args], capture_output=True, text=True,
        cwd=cwd, env=full, timeout=timeout, check=False,
    )


#: Snapshots as a policy saw them (``snapshot_from_json``), for tests that replay one decision.
SNAPSHOTS = REPO / "tests" / "data" / "snapshots"


def snapshot_from_json(d: Mapping[str, Any], policy_state: object = None,
                       refill_on_finish: bool = False) -> Snapshot:
    """The :class:`Snapshot` stored as ``d`` (one file of ``tests/data/snapshots``: the
    snapshot's arrays as lists, ``current`` as its placement's columns), with ``policy_state``
    (each file stores its policy's own)."""
    c = d["current"]
    i64 = np.int64
    return Snapshot(
        epoch=d["epoch"], now=d["now"], round_s=d["round_s"], gpu_types=tuple(d["gpu_types"]),
        node_names=tuple(d["node_names"]), node_type=np.array(d["node_type"], dtype=i64),
        node_gpus=np.array(d["node_gpus"], dtype=i64), job_ids=np.array(d["job_ids"], dtype=i64),
        job_types=tuple(d["job_types"]), arrival=np.array(d["arrival"], dtype=np.float64),
        total=np.array(d["total"], dtype=np.float64),
        remaining=np.array(d["remaining"], dtype=np.float64),
        scale=np.array(d["scale"], dtype=i64), weight=np.array(d["weight"], dtype=np.float64),
        sync=np.array(d["sync"], dtype=np.bool_), rate=np.array(d["rate"], dtype=np.float64),
        attained=np.array(d["attained"], dtype=np.float64),
        current=Placement(np.array(c["job"], dtype=i64), np.array(c["node"], dtype=i64),
                          np.array(c["count"], dtype=i64),
                          np.array(c["copy"], dtype=i64) if c.get("copy") is not None else None),
        policy_state=policy_state,
        max_copies=(np.array(d["max_copies"], dtype=i64) if d.get("max_copies") is not None
                    else None),
        migration_s=d["migration_s"], even_gangs=d["even_gangs"],
        refill_on_finish=refill_on_finish)
