"""Decision speed: one epoch decision of each policy, for growing numbers of jobs.

    python -m bench.solver_scaling [--sizes 32 128 512 2048] [--large 10000]
                                   [--policies hadar,gavel-las,gavel-makespan] [--repeats 7]
                                   [--steady] [--no-pin-binding] [--share] [--one-gpu]
                                   [--idle] [--json bench/results/solver_scaling.json]

Instances (:mod:`bench.instances`): ``n`` jobs of Gavel's job mix with random progress, on a
cluster of ``n/4`` GPUs per type (V100, P100, K80; 4 GPUs a node), and ``--large`` jobs on
1,000 nodes of 4 GPU types (A100, V100, P100, K80; 8 GPUs a node).  Each policy decides one
epoch from a fresh state (the LP baselines solve their LP, as on every change of the job set);
the figure is the median wall time over ``--repeats`` runs, the peak of memory allocated
during one decision (tracemalloc, which NumPy reports to), and the process's peak resident
memory so far (ru_maxrss, an upper bound that includes everything loaded).

``--steady`` adds, per size and policy, the epoch after that one (``state`` ``steady``;
:func:`bench.instances.steady`): the jobs the policy placed have run a round and hold their
GPUs, and a move costs what it costs live, so that the policy weighs moving running jobs (Hadar
plans the epoch twice where its plan moves any, step 9 "moves must pay").  ``--no-pin-binding``
runs ``hadare`` without its step 0 (the jobs that bind the fork makespan, on by default; rows
carry ``settings``).  ``--share`` offers GPU sharing (Gavel's co-located rates) and runs
``hadar`` and ``hadare`` with ``share=True`` (issue #16: each waiting job is weighed against
every placed one); ``--one-gpu`` draws 1-GPU jobs only, so that no waiting gang holds a type
back from pairs and every waiting job is weighed against every host, the most there is to
weigh (rows carry ``jobs_mix``).  ``--idle`` puts the ``n`` jobs on ``n`` GPUs per type
(``3n`` in all), a lightly loaded cluster where GPUs idle and every placed job is weighed for
a faster idle type (step 8, ``upgrade_idle``; rows carry ``gpus``).  ``moved``: running
jobs the decision gives other GPUs, ``kept``: jobs Hadar kept on their GPUs because the moving
plan did not pay (their ``explain`` detail).  Goals for
``hadar`` (issue #2): <= 10 ms at 2,048 jobs, <= 1 s at 10,000 jobs, peak memory < 1 GB.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace

from bench.instances import ONE_GPU, SCALE_MIX, gavel_cluster, large_cluster, snapshot, steady
from bench.report import write_rows
from hadar_slurm.core import COMPILED
from hadar_slurm.model import ClusterSpec
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Placement, Snapshot
from hadar_slurm.policy.hadar import KEPT_DETAIL
from hadar_slurm.rates.table import default_table


def measure(policy_name: str, num_jobs: int, cluster: ClusterSpec, repeats: int,
            max_seconds: float, steady_state: bool = False,
            settings: dict[str, object] | None = None, one_gpu: bool = False,
            ) -> dict[str, object]:
    given = settings or {}
    snap = snapshot(num_jobs, cluster, seed=num_jobs, scale_mix=ONE_GPU if one_gpu else SCALE_MIX)
    if given.get("share"):
        snap = replace(snap, colocated=default_table().colocated)
    if steady_state:
        snap = steady(snap, policy_name, seed=num_jobs, settings=given)
    times: list[float] = []
    spent = 0.0
    for _ in range(repeats):
        policy = make_policy(policy_name, **given)
        t0 = time.perf_counter()
        policy.allocate(snap)
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
        if spent > max_seconds:
            break
    tracemalloc.start()
    decision = make_policy(policy_name, **given).allocate(snap)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    moved, kept = moves(snap, decision.placement, decision.detail)
    return {
        "policy": policy_name, "settings": dict(given),
        "jobs_mix": "1-GPU" if one_gpu else "Gavel's",
        "state": "steady" if steady_state else "fresh",
        "moved": moved, "kept": kept,
        "jobs": num_jobs, "gpus": cluster.total_gpus,
        "nodes": len(cluster.nodes), "gpu_types": len(cluster.gpu_types),
        "median_ms": round(statistics.median(times) * 1000, 3),
        "min_ms": round(min(times) * 1000, 3), "runs": len(times),
        "peak_mb": round(peak / 2**20, 1),
        # The whole process's peak resident memory so far (includes the interpreter, NumPy,
        # SciPy and any memory the compiled core takes outside NumPy).
        "process_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                     1),
    }


def moves(snap: Snapshot, placement: Placement, detail: dict[int, str]) -> tuple[int, int]:
    """``(moved, kept)``: running jobs of ``snap`` that ``placement`` gives other GPUs than
    they hold (stopped ones not counted), and jobs whose ``detail`` says Hadar kept them on
    their GPUs."""
    before, after = snap.current.by_job_sorted(), placement.by_job_sorted()
    moved = sum(1 for j, held in before.items() if j in after and after[j] != held)
    kept = sum(1 for text in detail.values() if text.startswith(KEPT_DETAIL))
    return moved, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[32, 128, 512, 2048])
    ap.add_argument("--large", type=int, default=10000, help="jobs on 1,000 nodes (0: skip)")
    ap.add_argument("--policies", default="hadar,gavel-las,gavel-makespan")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-seconds", type=float, default=60.0,
                    help="stop repeating a case after this much time (at least one run)")
    ap.add_argument("--steady", action="store_true",
                    help="also the epoch after, with the placed jobs running and moves charged")
    ap.add_argument("--no-pin-binding", dest="pin_binding", action="store_false",
                    help="hadare without pin_binding (step 0: the jobs that bind the makespan; "
                    "on by default)")
    ap.add_argument("--share", action="store_true",
                    help="offer GPU sharing and run hadar and hadare with share=True")
    ap.add_argument("--one-gpu", action="store_true",
                    help="1-GPU jobs only (every waiting job weighed against every host)")
    ap.add_argument("--idle", action="store_true",
                    help="n GPUs per type for n jobs (a lightly loaded cluster) instead of n/4")
    ap.add_argument("--json", default="bench/results/solver_scaling.json")
    args = ap.parse_args(argv)
    per_type = (lambda n: n) if args.idle else (lambda n: max(n // 4, 1))
    cases: list[tuple[int, ClusterSpec]] = [(n, gavel_cluster(per_type(n))) for n in args.sizes]
    if args.large:
        cases.append((args.large, large_cluster(1000)))
    print(f"compiled core: {COMPILED}")
    print(f"{'policy':15s} {'state':6s} {'jobs':>6s} {'GPUs':>6s} {'median ms':>10s} "
          f"{'min ms':>9s} {'runs':>4s} {'peak MB':>8s} {'RSS MB':>7s} {'moved':>6s} {'kept':>5s}")
    rows: list[dict[str, object]] = []
    states = (False, True) if args.steady else (False,)
    for n, cluster in cases:
        for policy in [p for p in args.policies.split(",") if p]:
            for state in states:
                settings: dict[str, object] = (
                    {"pin_binding": False} if not args.pin_binding and policy == "hadare"
                    else {})
                if args.share and policy in ("hadar", "hadare"):
                    settings["share"] = True
                row = measure(policy, n, cluster, args.repeats, args.max_seconds, state,
                              settings, args.one_gpu)
                rows.append(row)
                print(f"{policy:15s} {row['state']:6s} {n:6d} {cluster.total_gpus:6d} "
                      f"{row['median_ms']:10.2f} {row['min_ms']:9.2f} {row['runs']:4d} "
                      f"{row['peak_mb']:8.1f} {row['process_peak_rss_mb']:7.1f} "
                      f"{row['moved']:6d} {row['kept']:5d}", flush=True)
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
