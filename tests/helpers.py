"""Helpers the tests share (imported as ``tests.helpers``; the fixtures built on them are in
conftest.py): tiny traces and throughput tables whose numbers are easy to work by hand, and the
command line run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hadar_slurm.model import Job

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
