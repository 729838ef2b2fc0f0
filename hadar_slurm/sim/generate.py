"""Seeded synthetic workloads: the regimes a site sees, as traces in Gavel's format.

``hadar-slurm trace generate`` (:mod:`hadar_slurm.cli.trace`) is the command; this module is the
pure part: a :class:`WorkloadSpec` and a cluster in, jobs out, the same jobs for the same spec
and seed on every machine (NumPy's PCG64 generator).

What a spec draws, job by job, in this order:

1. **Scale factor.** With probability ``multi_gpu`` the job is a gang of one of ``scales`` GPUs
   (2, 4, 8 by default, equally likely among those that fit on one GPU type of the cluster and
   that the table has), else it has one GPU.
2. **Job type**, uniformly among the table's types that have that scale factor and run on at
   least one GPU type of the cluster.
3. **Length**: its runtime ``d`` on the cluster's *mean GPU* (the rates averaged over the GPU
   types, weighted by how many GPUs each has), heavy-tailed:

   * ``gavel``: Gavel's generator: ``10 ** U(1.5, 3)`` minutes with probability 0.8,
     ``10 ** U(3, 4)`` minutes otherwise (30 min to about 7 days; the long fifth carries most
     of the work);
   * ``pareto``: a Pareto tail of shape 1.5 from 20 minutes, cut at 100 hours;
   * ``lognormal``: median 1 hour, sigma 1.5, cut at 100 hours.

   Its work is ``d`` times its rate on the mean GPU, in steps.
4. **Arrival.**

   * ``static``: every job at time 0 (``load`` is not used: the whole trace is the queue);
   * ``poisson``: exponential gaps;
   * ``bursty``: bursts of jobs that arrive together (burst sizes geometric with mean
     ``burst``), exponential gaps between bursts.

   Either way the gaps are scaled so that the *offered load* is ``load`` exactly: the GPU-seconds
   the jobs need on the mean GPU (``sum of d * scale factor``) over what the cluster offers while
   they arrive (its GPUs times the span from the first arrival to one mean gap after the last).
   Below 1 the cluster keeps up on average; above 1 a queue builds up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hadar_slurm.errors import InputError
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.rates.table import ThroughputTable

__all__ = ["ARRIVALS", "LENGTHS", "WorkloadSpec", "format_trace", "generate",
           "mean_gpu_rates", "offered_load"]

ARRIVALS = ("static", "poisson", "bursty")
LENGTHS = ("gavel", "pareto", "lognormal")
_SOURCE = "trace generate"
MAX_HOURS = 100.0


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate; every field is a ``hadar-slurm trace generate`` option."""

    seed: int = 0
    jobs: int = 100
    arrivals: str = "poisson"
    load: float = 0.8
    multi_gpu: float = 0.2
    scales: tuple[int, ...] = (2, 4, 8)
    lengths: str = "gavel"
    burst: float = 8.0
    #: job types to draw from (default: every type of the table that runs on the cluster)
    job_types: tuple[str, ...] = field(default=())

    def check(self) -> None:
        """An :class:`InputError` naming the option for each value out of range."""
        def bad(what: str, got: object, fix: str) -> InputError:
            return InputError(f"{what}, got {got!r}", source=_SOURCE,
                              field=what.split()[0], fix=fix)

        if self.jobs < 1:
            raise bad("--jobs must be >= 1", self.jobs, "e.g. --jobs 100")
        if self.arrivals not in ARRIVALS:
            raise bad("--arrivals must be one of " + ", ".join(ARRIVALS), self.arrivals,
                      "e.g. --arrivals poisson")
        if self.lengths not in LENGTHS:
            raise bad("--lengths must be one of " + ", ".join(LENGTHS), self.lengths,
                      "e.g. --lengths gavel")
        if not (math.isfinite(self.load) and 0.01 <= self.load <= 100):
            raise bad("--load must be from 0.01 to 100 (offered load, 1 = the cluster's "
                      "capacity)", self.load, "e.g. --load 0.8")
        if not 0.0 <= self.multi_gpu <= 1.0:
            raise bad("--multi-gpu must be a share from 0 to 1", self.multi_gpu,
                      "e.g. --multi-gpu 0.3")
        if not self.scales or any(s < 2 for s in self.scales):
            raise bad("--scales must be GPU counts >= 2", self.scales, "e.g. --scales 2,4,8")
        if not (math.isfinite(self.burst) and self.burst >= 1):
            raise bad("--burst must be >= 1 (mean jobs per burst)", self.burst,
                      "e.g. --burst 8")

    def args(self) -> list[str]:
        """The command-line options that generate this spec (for the trace's header)."""
        out = ["--seed", str(self.seed), "--jobs", str(self.jobs), "--arrivals", self.arrivals,
               "--load", f"{self.load:g}", "--multi-gpu", f"{self.multi_gpu:g}",
               "--scales", ",".join(str(s) for s in self.scales), "--lengths", self.lengths]
        if self.arrivals == "bursty":
            out += ["--burst", f"{self.burst:g}"]
        for t in self.job_types:
            out += ["--job-type", t]
        return out


def mean_gpu_rates(job_type: str, scale: int, table: ThroughputTable,
                   cluster: ClusterSpec) -> float:
    """The job's rate on the cluster's mean GPU: its rates weighted by each type's GPUs."""
    cap = [cluster.capacity(g) for g in cluster.gpu_types]
    rates = [table.rate(job_type, scale, g) for g in cluster.gpu_types]
    return sum(c * r for c, r in zip(cap, rates, strict=True)) / max(sum(cap), 1)


def _fits(scale: int, cluster: ClusterSpec) -> bool:
    return any(cluster.capacity(g) >= scale for g in cluster.gpu_types)


def _choices(spec: WorkloadSpec, table: ThroughputTable,
             cluster: ClusterSpec) -> dict[int, list[str]]:
    """Per scale factor, the job types that can be drawn (sorted, so the draw is stable)."""
    wanted = set(spec.job_types)
    out: dict[int, list[str]] = {}
    for job_type, sf in sorted(table.job_keys()):
        if wanted and job_type not in wanted:
            continue
        if sf != 1 and sf not in spec.scales:
            continue
        if not _fits(sf, cluster):
            continue
        if any(table.rate(job_type, sf, g) > 0 for g in cluster.gpu_types):
            out.setdefault(sf, []).append(job_type)
    return out


def _length_s(rng: np.random.Generator, lengths: str) -> float:
    if lengths == "gavel":
        low, high = (1.5, 3.0) if rng.random() < 0.8 else (3.0, 4.0)
        return 60.0 * 10 ** float(rng.uniform(low, high))
    if lengths == "pareto":
        return float(min(1200.0 * (1.0 - float(rng.random())) ** (-1 / 1.5), MAX_HOURS * 3600.0))
    return min(3600.0 * math.exp(float(rng.normal(0.0, 1.5))), MAX_HOURS * 3600.0)


def _gaps(rng: np.random.Generator, spec: WorkloadSpec) -> np.ndarray:
    """Unscaled gaps before each job (the first is 0): exponential, or bursts."""
    n = spec.jobs
    if spec.arrivals == "poisson":
        gaps = rng.exponential(1.0, n)
    else:  # bursty: a burst's jobs share one arrival; geometric burst sizes
        gaps = np.zeros(n)
        k = 0
        while k < n:
            gaps[k] = rng.exponential(spec.burst)
            k += int(rng.geometric(1.0 / spec.burst))
    gaps[0] = 0.0
    return gaps


def generate(spec: WorkloadSpec, cluster: ClusterSpec, table: ThroughputTable) -> list[Job]:
    """The jobs of ``spec`` on ``cluster``, drawn with ``spec.seed``."""
    spec.check()
    choices = _choices(spec, table, cluster)
    if 1 not in choices:
        raise InputError("no job type of the table runs on one GPU of this cluster's types "
                         f"({', '.join(cluster.gpu_types)})", source=_SOURCE,
                         field="--cluster", fix="use GPU types the throughput table has")
    multi = sorted(s for s in choices if s != 1)
    if spec.multi_gpu > 0 and not multi:
        raise InputError(f"no scale factor of {spec.scales} fits on one GPU type of the "
                         "cluster and is in the table", source=_SOURCE, field="--scales",
                         fix="give smaller scales, or a cluster with more GPUs per type")
    rng = np.random.default_rng(spec.seed)
    drawn: list[tuple[str, int, float]] = []
    for _ in range(spec.jobs):
        sf = int(multi[int(rng.integers(len(multi)))]) if (
            multi and rng.random() < spec.multi_gpu) else 1
        types = choices[sf]
        job_type = types[int(rng.integers(len(types)))]
        drawn.append((job_type, sf, _length_s(rng, spec.lengths)))
    if spec.arrivals == "static":
        arrival = np.zeros(spec.jobs)
    else:
        gaps = _gaps(rng, spec)
        demand = sum(sf * d for _, sf, d in drawn)  # GPU-seconds on the mean GPU
        span = demand / (cluster.total_gpus * spec.load)
        # the span is from the first arrival to one mean gap after the last
        mean_gap = gaps[1:].mean() if spec.jobs > 1 else 1.0
        unit = span / (gaps.sum() + max(mean_gap, 1e-9))
        arrival = np.cumsum(gaps) * unit
    jobs = []
    for k, ((job_type, sf, d), a) in enumerate(zip(drawn, arrival, strict=True)):
        steps = max(1, round(d * mean_gpu_rates(job_type, sf, table, cluster)))
        jobs.append(Job(k, job_type, sf, float(steps), float(round(a, 1))))
    return jobs


def offered_load(jobs: Sequence[Job], cluster: ClusterSpec, table: ThroughputTable) -> float:
    """GPU-seconds on the mean GPU over the cluster's GPU-seconds while the jobs arrive (to one
    mean gap after the last); ``inf`` when they all arrive at once."""
    arrivals = sorted(j.arrival_s for j in jobs)
    if len(jobs) < 2 or arrivals[-1] <= arrivals[0]:
        return math.inf
    span = (arrivals[-1] - arrivals[0]) * len(jobs) / (len(jobs) - 1)
    demand = sum(j.scale_factor * j.total_steps
                 / mean_gpu_rates(j.job_type, j.scale_factor, table, cluster) for j in jobs)
    return demand / (cluster.total_gpus * span)


def format_trace(jobs: Sequence[Job], header: Sequence[str] = ()) -> str:
    """The jobs as a trace in Gavel's 10-column format, ``header`` lines as ``#`` comments."""
    lines = [f"# {h}" for h in header]
    for j in jobs:
        lines.append("\t".join((j.job_type, "python3 train.py", "synthetic", "--steps", "0",
                                str(int(j.total_steps)), str(j.scale_factor),
                                f"{j.weight:g}", "-1.000000", repr(float(j.arrival_s)))))
    return "\n".join(lines) + "\n"
