"""Schedule quality: each policy on Gavel's traces, next to the fluid lower bounds and Gavel.

    python -m bench.quality [--traces NAME|FILE ...] [--cluster 4:4:4]
                            [--policies hadar,hadare,gavel-las,gavel-makespan,fifo]
                            [--json bench/results/quality.json] [--reschedule-on-finish]

For each trace: the makespan lower bound of the fluid LP (every job on at most its scale factor
of GPUs, :func:`hadar_slurm.sim.bounds.fluid_makespan_bound`), then per policy the makespan, average
JCT and utilization, each next to its bound and to Gavel's published figures where Gavel ran
that trace (``data/gavel/README.md``).  Goals for ``hadar`` (issue #2): makespan within 3% of
the bound and average JCT no worse than Gavel's max-min fairness (LAS).  Goals for ``hadare``
(issue #4): makespan within 10% of the *fork* bound (a job may use any number of GPUs,
:func:`hadar_slurm.sim.bounds.fork_makespan_bound`), utilization at least that of every other
policy on the trace, and average JCT no worse than ``hadar``'s.  Besides Gavel's three traces
the default list has ``bench/traces/long_tail_seed0.trace`` (``bench.gen_long_tail``: a few long
jobs dominate).  The JSON rows hold ``trace, cluster, policy, rounds, makespan_s, avg_jct_s,
utilization, lower_bound_s, fork_bound_s`` and more.

Rounds are fixed (360 s, as in Gavel's simulator, where Gavel's figures come from) unless
``--reschedule-on-finish``: then a round also ends when a job ends, as the sidecar's epochs do
by default (``[scheduler] reschedule_on_finish``); its default output is then
``bench/results/quality_reschedule.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench.report import write_rows
from hadar_slurm.policy import make_policy
from hadar_slurm.rates.table import default_table
from hadar_slurm.sim.bounds import bound_inputs, fluid_makespan_bound, fork_makespan_bound
from hadar_slurm.sim.cluster import load_cluster
from hadar_slurm.sim.run import simulate
from hadar_slurm.sim.trace import BUNDLED_TRACES, load_trace

# Gavel's own results, cluster 4 V100 : 4 P100 : 4 K80 (data/gavel/README.md):
# (makespan s, average JCT s) per trace and Gavel policy.
GAVEL = {
    "static_32_seed0": {"min_total_duration_perf": (28485, 27904),
                        "max_min_fairness_perf": (32825, 20983),
                        "fifo_perf": (40711, 21404)},
    "static_48_multigpu_seed1": {"min_total_duration_perf": (80764, 79182),
                                 "max_min_fairness_perf": (84009, 38901)},
    "poisson_200_lam900_seed0": {"min_total_duration_perf": (179278, 45584),
                                 "max_min_fairness_perf": (179523, 16687),
                                 "fifo_perf": (214657, 30736)},
}
OURS_TO_GAVEL = {"gavel-las": "max_min_fairness_perf", "gavel-makespan": "min_total_duration_perf",
                 "fifo-perf": "fifo_perf"}
MAKESPAN_GOAL = 1.03
FORK_MAKESPAN_GOAL = 1.10
LONG_TAIL = str(Path(__file__).resolve().parent / "traces" / "long_tail_seed0.trace")
DEFAULT_TRACES = [*BUNDLED_TRACES, LONG_TAIL]


def run(traces: list[str], cluster_spec: str, policies: list[str],
        reschedule_on_finish: bool = False) -> list[dict[str, Any]]:
    table = default_table()
    cluster = load_cluster(cluster_spec)
    rows: list[dict[str, Any]] = []
    for trace in traces:
        jobs = load_trace(trace, table)
        name = Path(trace).stem if Path(trace).exists() else trace
        args = bound_inputs(jobs, cluster, table)
        bound = fluid_makespan_bound(*args)
        fork_bound = fork_makespan_bound(*args)
        for policy in policies:
            t0 = time.perf_counter()
            res = simulate(jobs, cluster, table, make_policy(policy),
                           reschedule_on_finish=reschedule_on_finish)
            wall = time.perf_counter() - t0
            gavel_las = GAVEL.get(name, {}).get("max_min_fairness_perf")
            gavel_same = GAVEL.get(name, {}).get(OURS_TO_GAVEL.get(policy, ""))
            rows.append({
                "trace": name, "cluster": cluster_spec, "policy": policy,
                "rounds": "end on finish" if reschedule_on_finish else "fixed",
                "makespan_s": round(res.makespan_s, 1), "avg_jct_s": round(res.avg_jct_s, 1),
                "p95_jct_s": round(res.p95_jct_s, 1), "utilization": round(res.utilization, 4),
                "lower_bound_s": round(bound, 1),
                "makespan_over_bound": round(res.makespan_s / bound, 4),
                "fork_bound_s": round(fork_bound, 1),
                "makespan_over_fork_bound": round(res.makespan_s / fork_bound, 4),
                "forked_jobs": res.forked_jobs, "max_copies": res.max_copies,
                "gavel_las_avg_jct_s": gavel_las[1] if gavel_las else None,
                "gavel_same_policy": list(gavel_same) if gavel_same else None,
                "num_jobs": res.num_jobs, "num_completed": res.num_completed,
                "decision_ms_median": round(res.decision_ms_median, 3),
                "wall_s": round(wall, 2),
            })
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'trace':26s} {'policy':15s} {'makespan s':>10s} {'/bound':>7s} {'bound':>8s} "
            f"{'/fork':>6s} {'fork bd':>8s} {'avg JCT s':>10s} {'/LAS':>6s} {'util':>6s} "
            f"{'Gavel same (mk, jct)':>22s} {'dec ms':>7s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        las = r["gavel_las_avg_jct_s"]
        ratio = f"{float(r['avg_jct_s']) / float(las):.3f}" if las else "-"
        same = r["gavel_same_policy"]
        same_txt = f"{same[0]:,} / {same[1]:,}" if same else "-"
        print(f"{r['trace']!s:26s} {r['policy']!s:15s} {float(r['makespan_s']):10,.0f} "
              f"{float(r['makespan_over_bound']):7.3f} {float(r['lower_bound_s']):8,.0f} "
              f"{float(r['makespan_over_fork_bound']):6.3f} {float(r['fork_bound_s']):8,.0f} "
              f"{float(r['avg_jct_s']):10,.0f} {ratio:>6s} {float(r['utilization']):6.4f} "
              f"{same_txt:>22s} {float(r['decision_ms_median']):7.2f}")
    print()
    for r in rows:
        if r["policy"] != "hadar" or not r["gavel_las_avg_jct_s"]:
            continue
        mk_ok = float(r["makespan_over_bound"]) <= MAKESPAN_GOAL
        jct_ok = float(r["avg_jct_s"]) <= float(r["gavel_las_avg_jct_s"])
        print(f"goal {r['trace']}: makespan <= {MAKESPAN_GOAL:.2f} x bound: "
              f"{'met' if mk_ok else 'NOT met'}; avg JCT <= Gavel LAS: "
              f"{'met' if jct_ok else 'NOT met'}")
    for line in hadare_goals(rows):
        print(line)


def hadare_goals(rows: list[dict[str, Any]]) -> list[str]:
    """One line per trace on HadarE's goals (issue #4), where ``hadare`` ran."""
    out = []
    for r in rows:
        if r["policy"] != "hadare":
            continue
        same = [o for o in rows if o["trace"] == r["trace"] and o["policy"] != "hadare"]
        mk_ok = float(r["makespan_over_fork_bound"]) <= FORK_MAKESPAN_GOAL
        util_best = max((float(o["utilization"]) for o in same), default=0.0)
        util_ok = float(r["utilization"]) >= util_best
        hadar = [o for o in same if o["policy"] == "hadar"]
        jct_txt = "hadar not run"
        if hadar:
            jct_ok = float(r["avg_jct_s"]) <= float(hadar[0]["avg_jct_s"])
            jct_txt = (f"{'met' if jct_ok else 'NOT met'} ({float(r['avg_jct_s']):,.0f} vs "
                       f"{float(hadar[0]['avg_jct_s']):,.0f})")
        out.append(
            f"hadare goal {r['trace']}: makespan <= {FORK_MAKESPAN_GOAL:.2f} x fork bound: "
            f"{'met' if mk_ok else 'NOT met'} ({float(r['makespan_over_fork_bound']):.3f}); "
            f"util >= all others: {'met' if util_ok else 'NOT met'} "
            f"({float(r['utilization']):.4f} vs {util_best:.4f}); avg JCT <= hadar: {jct_txt}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", nargs="+", default=DEFAULT_TRACES,
                    help="bundled trace names or trace files (default: the three shared ones "
                         "and bench/traces/long_tail_seed0.trace)")
    ap.add_argument("--cluster", default="4:4:4", help="V100:P100:K80 counts or a cluster file")
    ap.add_argument("--policies", default="hadar,hadare,gavel-las,gavel-makespan,fifo")
    ap.add_argument("--reschedule-on-finish", action="store_true",
                    help="a round also ends when a job ends (the sidecar's default)")
    ap.add_argument("--json", default=None,
                    help="where to write rows (default: bench/results/quality.json, or "
                    "quality_reschedule.json with --reschedule-on-finish)")
    args = ap.parse_args(argv)
    out = args.json or ("bench/results/quality_reschedule.json" if args.reschedule_on_finish
                        else "bench/results/quality.json")
    rows = run(args.traces, args.cluster, [p for p in args.policies.split(",") if p],
               args.reschedule_on_finish)
    print_table(rows)
    write_rows(rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
