"""Synthetic scheduling instances for the benchmarks: Gavel's job mix at any size.

Jobs are drawn (seeded) from the job types of Gavel's throughput table with the scale-factor mix
of Gavel's traces; GPU types beyond Gavel's (``a100``) get rates derived from ``v100`` by a
per-model speed-up drawn between 1.5x and 2.5x (synthetic, for timing only).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hadar_slurm.costs import DEFAULT as LIVE_COSTS
from hadar_slurm.model import ClusterSpec, Node
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Placement, Snapshot
from hadar_slurm.policy.hadar import job_speed
from hadar_slurm.rates.table import default_table

SCALE_MIX = ((1, 0.7), (2, 0.1), (4, 0.15), (8, 0.05))
#: 1-GPU jobs only.
ONE_GPU = ((1, 1.0),)


def snapshot(num_jobs: int, cluster: ClusterSpec, seed: int = 0,
             scale_mix: tuple[tuple[int, float], ...] = SCALE_MIX) -> Snapshot:
    """A mid-run snapshot: ``num_jobs`` jobs with random progress and ages, none placed, their
    scale factors drawn from ``scale_mix`` (``(scale factor, probability)`` pairs)."""
    rng = np.random.default_rng(seed)
    table = default_table()
    types = cluster.gpu_types
    keys = sorted(table.job_keys())
    sfs = np.array([s for s, _ in scale_mix])
    probs = np.array([p for _, p in scale_mix])
    rows: list[list[float]] = []
    scale: list[int] = []
    names: list[str] = []
    speedup: dict[str, float] = {}
    for _ in range(num_jobs):
        sf = int(rng.choice(sfs, p=probs))
        cands = [k for k in keys if k[1] == sf] or [k for k in keys if k[1] == 1]
        job_type, sf = cands[int(rng.integers(len(cands)))]
        if job_type not in speedup:
            speedup[job_type] = float(rng.uniform(1.5, 2.5))
        row = []
        for g in types:
            if g == "a100":
                row.append(table.rate(job_type, sf, "v100") * speedup[job_type])
            else:
                row.append(table.rate(job_type, sf, g))
        rows.append(row)
        scale.append(sf)
        names.append(job_type)
    rate = np.array(rows, dtype=np.float64)
    best = rate.max(axis=1)
    hours = rng.uniform(0.5, 8.0, num_jobs)
    total = best * hours * 3600.0
    remaining = total * rng.uniform(0.2, 1.0, num_jobs)
    arrival = -rng.uniform(0.0, 6 * 3600.0, num_jobs)
    nodes = cluster.nodes
    return Snapshot(
        epoch=0, now=0.0, round_s=360.0, gpu_types=types,
        node_names=tuple(n.name for n in nodes),
        node_type=np.array([types.index(n.gpu_type) for n in nodes], dtype=np.int64),
        node_gpus=np.array([n.gpus for n in nodes], dtype=np.int64),
        job_ids=np.arange(num_jobs, dtype=np.int64), job_types=tuple(names),
        arrival=arrival, total=total, remaining=remaining,
        scale=np.array(scale, dtype=np.int64), weight=np.ones(num_jobs),
        sync=np.ones(num_jobs, dtype=np.bool_), rate=rate,
        attained=np.zeros_like(rate), current=Placement.empty(),
    )


def steady(snap: Snapshot, policy_name: str, seed: int = 0,
           settings: dict[str, object] | None = None) -> Snapshot:
    """The epoch after ``snap``: ``policy_name`` placed the jobs of ``snap``, they ran one round
    (each placed job's progress drawn between a half and a whole round at the rate of the GPUs
    it holds, as estimates of live progress differ), and a move costs what it costs live
    (:data:`hadar_slurm.costs.DEFAULT`).  The decision on it is a sidecar's steady epoch, where
    a policy weighs moving running jobs (Hadar's "moves must pay" plans twice there).
    ``settings``: the policy's, as in the epoch after (its pairs, where it shares, run on)."""
    rng = np.random.default_rng(seed)
    first = make_policy(policy_name, **(settings or {})).allocate(snap)
    after = replace(snap, epoch=snap.epoch + 1, now=snap.now + float(snap.round_s),
                    current=first.placement, policy_state=first.policy_state,
                    migration_s=LIVE_COSTS.move_s, packed=first.packed)
    worker = snap.rate / np.maximum(snap.scale, 1)[:, None]
    speed = job_speed(after.held(), worker, snap.sync)  # (a gang at its slowest worker)
    run_s = float(snap.round_s) * rng.uniform(0.5, 1.0, snap.num_jobs)
    return replace(after, remaining=np.maximum(snap.remaining - speed * run_s, 0.01 * snap.total))


def gavel_cluster(gpus_per_type: int, gpus_per_node: int = 4) -> ClusterSpec:
    """``gpus_per_type`` V100, P100 and K80 GPUs on nodes of ``gpus_per_node``."""
    return ClusterSpec.uniform(
        [("v100", gpus_per_type), ("p100", gpus_per_type), ("k80", gpus_per_type)],
        gpus_per_node,
    )


def large_cluster(num_nodes: int = 1000) -> ClusterSpec:
    """``num_nodes`` nodes of 4 GPU types (a100, v100, p100, k80), 8 GPUs each."""
    types = ("a100", "v100", "p100", "k80")
    nodes = tuple(Node(f"{types[i % 4]}-{i:04d}", types[i % 4], 8) for i in range(num_nodes))
    return ClusterSpec(nodes, types)
