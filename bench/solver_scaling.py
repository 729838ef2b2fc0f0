"""Decision speed: one epoch decision of each policy, for growing numbers of jobs.

    python -m bench.solver_scaling [--sizes 32 128 512 2048] [--large 10000]
                                   [--policies hadar,gavel-las,gavel-makespan] [--repeats 7]
                                   [--json bench/results/solver_scaling.json]

Instances (:mod:`bench.instances`): ``n`` jobs of Gavel's job mix with random progress, on a
cluster of ``n/4`` GPUs per type (V100, P100, K80; 4 GPUs a node), and ``--large`` jobs on
1,000 nodes of 4 GPU types (A100, V100, P100, K80; 8 GPUs a node).  Each policy decides one
epoch from a fresh state (the LP baselines solve their LP, as on every change of the job set);
the figure is the median wall time over ``--repeats`` runs, the peak of memory allocated
during one decision (tracemalloc, which NumPy reports to), and the process's peak resident
memory so far (ru_maxrss, an upper bound that includes everything loaded).  Goals for
``hadar`` (issue #2): <= 10 ms at 2,048 jobs, <= 1 s at 10,000 jobs, peak memory < 1 GB.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc

from bench.instances import gavel_cluster, large_cluster, snapshot
from bench.report import write_rows
from hadar_slurm.core import COMPILED
from hadar_slurm.model import ClusterSpec
from hadar_slurm.policy import make_policy


def measure(policy_name: str, num_jobs: int, cluster: ClusterSpec, repeats: int,
            max_seconds: float) -> dict[str, object]:
    snap = snapshot(num_jobs, cluster, seed=num_jobs)
    times: list[float] = []
    spent = 0.0
    for _ in range(repeats):
        policy = make_policy(policy_name)
        t0 = time.perf_counter()
        policy.allocate(snap)
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if spent > max_seconds:
            break
    tracemalloc.start()
    make_policy(policy_name).allocate(snap)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "policy": policy_name, "jobs": num_jobs, "gpus": cluster.total_gpus,
        "nodes": len(cluster.nodes), "gpu_types": len(cluster.gpu_types),
        "median_ms": round(statistics.median(times) * 1000, 3),
        "min_ms": round(min(times) * 1000, 3), "runs": len(times),
        "peak_mb": round(peak / 2**20, 1),
        # The whole process's peak resident memory so far (includes the interpreter, NumPy,
        # SciPy and any memory the compiled core takes outside NumPy).
        "process_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                     1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[32, 128, 512, 2048])
    ap.add_argument("--large", type=int, default=10000, help="jobs on 1,000 nodes (0: skip)")
    ap.add_argument("--policies", default="hadar,gavel-las,gavel-makespan")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-seconds", type=float, default=60.0,
                    help="stop repeating a case after this much time (at least one run)")
    ap.add_argument("--json", default="bench/results/solver_scaling.json")
    args = ap.parse_args(argv)
    cases: list[tuple[int, ClusterSpec]] = [(n, gavel_cluster(max(n // 4, 1))) for n in args.sizes]
    if args.large:
        cases.append((args.large, large_cluster(1000)))
    print(f"compiled core: {COMPILED}")
    print(f"{'policy':15s} {'jobs':>6s} {'GPUs':>6s} {'median ms':>10s} {'min ms':>9s} "
          f"{'runs':>4s} {'peak MB':>8s} {'RSS MB':>7s}")
    rows: list[dict[str, object]] = []
    for n, cluster in cases:
        for policy in [p for p in args.policies.split(",") if p]:
            row = measure(policy, n, cluster, args.repeats, args.max_seconds)
            rows.append(row)
            print(f"{policy:15s} {n:6d} {cluster.total_gpus:6d} {row['median_ms']:10.2f} "
                  f"{row['min_ms']:9.2f} {row['runs']:4d} {row['peak_mb']:8.1f} "
                  f"{row['process_peak_rss_mb']:7.1f}", flush=True)
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
