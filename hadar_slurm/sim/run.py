"""Run a policy over a trace in the simulator and measure the schedule."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.loop import EpochLoop, EpochRecord, SimClock
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy.base import FloatArray, Policy
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sim.backend import EpochUsage, SimulatedCluster


@dataclass
class SimResult:
    """A simulated schedule and its figures (seconds unless named otherwise)."""

    policy: str
    cluster: str
    num_jobs: int
    num_completed: int
    makespan_s: float
    avg_jct_s: float
    p95_jct_s: float
    utilization: float
    ftf_mean: float
    ftf_max: float
    decision_ms_median: float
    decision_ms_max: float
    epochs: int
    arrival: FloatArray
    finish: FloatArray
    gpu_types: tuple[str, ...]
    capacity: tuple[int, ...]
    usage: list[EpochUsage]
    records: list[EpochRecord]
    #: HadarE: (round start, {job id: copies}) for each round where some job ran forked.
    copies: list[tuple[float, dict[int, int]]] = field(default_factory=list)
    #: GPU sharing: (round start, pairs of job ids sharing GPUs) for each round where some did.
    packed: list[tuple[float, tuple[tuple[int, int], ...]]] = field(default_factory=list)

    @property
    def packed_jobs(self) -> int:
        """How many jobs shared GPUs with another in at least one round."""
        return len({j for _t, pairs in self.packed for pair in pairs for j in pair})

    @property
    def max_copies(self) -> int:
        """The most copies any job ran as at once (1: nothing was forked)."""
        return max((k for _t, forked in self.copies for k in forked.values()), default=1)

    @property
    def forked_jobs(self) -> int:
        """How many jobs ran forked in at least one round."""
        return len({j for _t, forked in self.copies for j in forked})

    @property
    def jct(self) -> FloatArray:
        done = ~np.isnan(self.finish)
        return self.finish[done] - self.arrival[done]

    def row(self) -> dict[str, object]:
        """The JSON row of ``hadar-slurm simulate --json``."""
        return {
            "policy": self.policy,
            "cluster": self.cluster,
            "makespan_s": round(self.makespan_s, 3),
            "avg_jct_s": round(self.avg_jct_s, 3),
            "p95_jct_s": round(self.p95_jct_s, 3),
            "utilization": round(self.utilization, 4),
            "ftf_mean": round(self.ftf_mean, 4),
            "ftf_max": round(self.ftf_max, 4),
            "decision_ms_median": round(self.decision_ms_median, 3),
            "decision_ms_max": round(self.decision_ms_max, 3),
            "epochs": self.epochs,
            "num_jobs": self.num_jobs,
            "num_completed": self.num_completed,
            "forked_jobs": self.forked_jobs,
            "max_copies": self.max_copies,
            "shared_jobs": self.packed_jobs,
        }


def spread_over_draws(runs: Sequence[SimResult]) -> dict[str, int | float]:
    """The mean, lowest and highest makespan and average JCT over ``runs`` (a trace and its
    draws with perturbed lengths: ``simulate --draws``, ``bench.packed --draws``), with
    ``runs`` their number."""
    out: dict[str, int | float] = {"runs": len(runs)}
    for key, values in (("makespan_s", [r.makespan_s for r in runs]),
                        ("avg_jct_s", [r.avg_jct_s for r in runs])):
        out[f"{key}_mean"] = round(sum(values) / len(values), 1)
        out[f"{key}_min"] = round(min(values), 1)
        out[f"{key}_max"] = round(max(values), 1)
    return out


def finish_time_fairness(
    arrival: FloatArray, finish: FloatArray, isolated_s: FloatArray, num_gpus: int
) -> FloatArray:
    """rho[i] = JCT under the policy / JCT under an equal 1/n share of the cluster.

    Following Gavel's finish-time fairness: with n jobs in the system on average while job i was
    there, an equal share gives it 1/n of its isolated speed when n exceeds the GPU count
    measured in job slots, so its JCT under that share is ``isolated * max(1, n_avg / slots)``.
    ``isolated_s`` is the job's runtime alone on the average GPU of the cluster.
    """
    jct = finish - arrival
    rho = np.full(arrival.shape[0], np.nan)
    done = ~np.isnan(finish)
    events = np.concatenate([arrival[done], finish[done]])
    deltas = np.concatenate([np.ones(done.sum()), -np.ones(done.sum())])
    order = np.argsort(events, kind="stable")
    times = events[order]
    counts = np.cumsum(deltas[order])
    for i in np.nonzero(done)[0].tolist():
        a, f = arrival[i], finish[i]
        lo = np.searchsorted(times, a, side="right") - 1
        hi = np.searchsorted(times, f, side="left")
        seg_t = np.concatenate([[a], times[lo + 1: hi], [f]])
        seg_n = counts[max(lo, 0): hi] if lo >= 0 else np.concatenate([[1], counts[:hi]])
        width = np.diff(seg_t)
        n_avg = float((width * seg_n[: width.shape[0]]).sum() / max(f - a, 1e-9))
        share = max(1.0, n_avg / max(num_gpus, 1))
        rho[i] = jct[i] / (isolated_s[i] * share)
    return rho


def simulate(
    jobs: Sequence[Job],
    cluster: ClusterSpec,
    table: ThroughputTable,
    policy: Policy,
    *,
    round_s: float = 360.0,
    migration_cost_s: float = 0.0,
    start_cost_s: float = 0.0,
    consolidation: ConsolidationCost | None = None,
    on_epoch: Callable[[EpochRecord, SimulatedCluster], None] | None = None,
    policy_table: ThroughputTable | None = None,
    learn_rates: bool = False,
    reschedule_on_finish: bool = False,
    multi_node_copies: bool = False,
    wake_delay_s: float = 0.0,
    seed: int = 0,
    even_gangs: bool = False,
    gpu_sharing: bool = True,
    fork_start_s: float = 0.0,
    fork_interval_s: float = 0.0,
    final_run: bool = False,
) -> SimResult:
    """Run ``policy`` over ``jobs`` on ``cluster`` until every job is done (or cannot run).

    ``consolidation``: what one consolidation of a forked job costs (HadarE); the default
    :class:`~hadar_slurm.consolidation.ConsolidationCost` when None.

    ``policy_table``: the table the policy plans with (its snapshots' ``rate``), when it differs
    from the true ``table`` (e.g. with estimated entries); progress and every figure follow
    ``table``.  ``learn_rates``: the policy's table learns the true rate of a (job type, scale
    factor) on a GPU type once a job of that kind has run there, as the sidecar learns from the
    runtime's reports (see :class:`~hadar_slurm.sim.backend.SimulatedCluster`).
    ``reschedule_on_finish``: a round ends when its first job finishes, as the sidecar's epochs
    do by default, rather than after ``round_s`` or when all its jobs did (fixed rounds, as in
    Gavel's simulator, the default here).  ``multi_node_copies``: whether a forked job's copy
    may span several nodes (the snapshot tells the policy); False, as in Slurm, by default.
    ``wake_delay_s``, ``seed``: with ``reschedule_on_finish``, an epoch a finish or an arrival
    brings forward starts up to ``wake_delay_s`` late (uniform, seeded), as the sidecar sees
    them at its next ``finish_poll_s`` poll.  ``even_gangs``: a job over several nodes must
    hold as many GPUs on each, as one Slurm job does; other placements are not run (see
    :class:`~hadar_slurm.sim.backend.SimulatedCluster`).  ``gpu_sharing``: whether the
    simulator offers GPU sharing to the policy (pairs of jobs on the same GPUs at the table's
    co-located rates; see
    :class:`~hadar_slurm.sim.backend.SimulatedCluster`); no policy but a packing one uses it.
    ``fork_start_s``, ``fork_interval_s``: how much longer than a plain start a forked one
    (a heterogeneous job) takes, the first of a round and each further one (Slurm's backfill
    scheduler starts them one per cycle; see :class:`~hadar_slurm.sim.backend.SimulatedCluster`).
    ``final_run``: a forked job's run of its own after its copies is placed by the policy and
    holds its GPUs for a start, as the sidecar runs it (else it costs a start and holds none).
    """
    backend = SimulatedCluster(jobs, cluster, table, migration_cost_s=migration_cost_s,
                               start_cost_s=start_cost_s,
                               consolidation=consolidation, policy_table=policy_table,
                               learn_rates=learn_rates,
                               reschedule_on_finish=reschedule_on_finish,
                               multi_node_copies=multi_node_copies,
                               wake_delay_s=wake_delay_s, seed=seed, even_gangs=even_gangs,
                               gpu_sharing=gpu_sharing, fork_start_s=fork_start_s,
                               fork_interval_s=fork_interval_s, final_run=final_run)
    return run_backend(backend, policy, round_s=round_s, on_epoch=on_epoch)


def run_backend(
    backend: SimulatedCluster,
    policy: Policy,
    *,
    round_s: float = 360.0,
    on_epoch: Callable[[EpochRecord, SimulatedCluster], None] | None = None,
) -> SimResult:
    """Run ``policy`` on a simulator built by the caller (:func:`simulate` builds the plain one;
    :mod:`hadar_slurm.studies.sim` one whose trials stop early) and measure the schedule."""
    jobs, cluster = backend.jobs, backend.cluster
    start = float(backend.arrival.min()) if len(jobs) else 0.0
    hook = None if on_epoch is None else (lambda rec: on_epoch(rec, backend))
    loop = EpochLoop(backend, policy, SimClock(start), round_s=round_s, on_epoch=hook)
    records = loop.run()
    st = backend.state
    done = ~np.isnan(st.finish)
    jct = st.finish[done] - backend.arrival[done]
    makespan = float(st.finish[done].max() - start) if done.any() else float("nan")
    capacity = tuple(cluster.capacity(g) for g in cluster.gpu_types)
    busy = sum(float(u.busy_gpu_s.sum()) for u in st.usage)
    util = busy / (cluster.total_gpus * makespan) if done.any() and makespan > 0 else 0.0
    # Isolated runtime on the cluster's GPU mix (capacity-weighted mean speed).
    cap = np.asarray(capacity, dtype=np.float64)
    mean_rate = (backend.rate * cap).sum(axis=1) / cap.sum()
    isolated = np.divide(backend.total, mean_rate, out=np.full_like(backend.total, np.inf),
                         where=mean_rate > 0)
    slots = int(cluster.total_gpus)
    rho = finish_time_fairness(backend.arrival, st.finish, isolated * 1.0, slots)
    dec_ms = np.array([r.decision_s * 1000 for r in records]) if records else np.zeros(1)
    return SimResult(
        policy=policy.name,
        cluster=cluster.describe(),
        num_jobs=len(jobs),
        num_completed=int(done.sum()),
        makespan_s=makespan,
        avg_jct_s=float(jct.mean()) if jct.size else float("nan"),
        p95_jct_s=float(np.percentile(jct, 95)) if jct.size else float("nan"),
        utilization=util,
        ftf_mean=float(np.nanmean(rho)) if done.any() else float("nan"),
        ftf_max=float(np.nanmax(rho)) if done.any() else float("nan"),
        decision_ms_median=float(np.median(dec_ms)),
        decision_ms_max=float(dec_ms.max()),
        epochs=len(records),
        arrival=backend.arrival,
        finish=st.finish,
        gpu_types=cluster.gpu_types,
        capacity=capacity,
        usage=st.usage,
        records=records,
        copies=st.copies,
        packed=st.packed,
    )
