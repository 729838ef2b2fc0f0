"""Can a schedule meet both of Hadar's goals?  A lower bound on the average JCT of the static
gang traces' schedules that end within 3% of the gang bound.

    python -m bench.jct_bound [--seed-base 0 100 200] [--only NAME ...] [--slack 0.03]
                              [--interval-s 360] [--time-limit-s 600]
                              [--json bench/results/jct_bound.json]

Issue #15 asks Hadar, on every trace, for a makespan within 3% of the gang bound *and* an
average JCT no worse than the best of ``gavel-las``, ``fifo-perf`` and ``fifo``.  On the static
gang traces Hadar's makespan is up to 1.25 times the bound, and every change that shortened
it lengthened the average JCT (docs/algorithm.md).  Whether the two goals can be met at once
there was open.  Per static gang trace (every job there at time 0, 60% of them gangs), this
prints:

* the gang bound (the fluid LP; on these traces the configuration LP equals it,
  ``bench.exact_bound``);
* the lower bound :func:`hadar_slurm.sim.jct_bound.config_jct_bound` on the average JCT of
  every preemptive schedule that ends by ``(1 + slack)`` times it (the time-indexed
  configuration LP, ``--interval-s`` intervals, with mean busy times), and whether the column
  generation ended with the LP solved within ``--time-limit-s`` (an unfinished one still
  gives a valid bound, only a weaker one);
* the best baseline's average JCT and Hadar's, as ``bench.robustness`` runs them.

Where the bound exceeds the best baseline's JCT, no schedule meets both goals on that trace;
where it does not, the goals are not shown to clash (the bound is a relaxation: a schedule at
it may not exist).  Rows go to ``--json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.exact_bound import quiet_stdout, static_traces
from bench.report import write_rows
from bench.robustness import BASELINES, MAKESPAN_GOAL, run_one
from hadar_slurm.sim.jct_bound import config_jct_bound


def measure(seed_bases: Sequence[int], only: Sequence[str], slack: float, interval_s: float,
            time_limit_s: float) -> list[dict[str, Any]]:
    """The rows, one per static gang trace (``only``: those whose names are listed)."""
    rows = []
    for seed_base, case, inst, work, scale, rate, capacity in static_traces(seed_bases, only):
        if not only and case.regime != "static-gangs":
            continue
        t0 = time.perf_counter()
        horizon = (1.0 + slack) * inst.bound
        with quiet_stdout():
            bound, exact = config_jct_bound(work, scale, rate, capacity, horizon,
                                            interval_s=interval_s, time_limit_s=time_limit_s)
        wall = time.perf_counter() - t0
        runs = {p: run_one(case, p, free_moves=False) for p in ("hadar", *BASELINES)}
        best = min(BASELINES, key=lambda p: runs[p]["avg_jct_s"])
        row: dict[str, Any] = {
            "trace": case.name, "seed_base": seed_base, "generate": case.command(),
            "gang_bound_s": round(inst.bound, 1), "slack": slack, "interval_s": interval_s,
            "horizon_s": round(horizon, 1), "jct_bound_s": round(float(bound), 1),
            "jct_bound_exact": exact, "jct_bound_wall_s": round(wall, 1),
            "best_baseline": best, "best_baseline_jct_s": round(runs[best]["avg_jct_s"], 1),
            "hadar_jct_s": round(runs["hadar"]["avg_jct_s"], 1),
            "hadar_makespan_over_bound": round(runs["hadar"]["makespan_s"] / inst.bound, 4),
            "goals_clash": bool(bound > runs[best]["avg_jct_s"]),
        }
        rows.append(row)
        print(f"{seed_base:4d} {case.name:20s} gang bound {inst.bound:9.0f} s  JCT >= "
              f"{bound:8.0f} s by {horizon:9.0f} s ({'solved' if exact else 'not solved'}, "
              f"{wall:.0f} s)  {best} {row['best_baseline_jct_s']:8.0f} s  hadar "
              f"{row['hadar_jct_s']:8.0f} s at {row['hadar_makespan_over_bound']:.3f}x"
              f"{'  CLASH' if row['goals_clash'] else ''}", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.jct_bound", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-base", type=int, nargs="+", default=[0, 100, 200])
    ap.add_argument("--only", nargs="*", default=[], metavar="NAME",
                    help="only these static traces (e.g. dgx/static-gangs)")
    ap.add_argument("--slack", type=float, default=MAKESPAN_GOAL - 1.0,
                    help="schedules end by (1 + slack) times the gang bound (default: the "
                    "goal's 0.03)")
    ap.add_argument("--interval-s", type=float, default=360.0)
    ap.add_argument("--time-limit-s", type=float, default=600.0,
                    help="per trace, for the column generation (its bound stays valid)")
    ap.add_argument("--json", default="bench/results/jct_bound.json")
    args = ap.parse_args(argv)
    if not args.slack >= 0:
        print(f"--slack must be >= 0, got {args.slack}", file=sys.stderr)
        return 2
    for name, value in (("--interval-s", args.interval_s), ("--time-limit-s", args.time_limit_s)):
        if not value > 0:
            print(f"{name} must be > 0, got {value}", file=sys.stderr)
            return 2
    rows = measure(args.seed_base, args.only, args.slack, args.interval_s, args.time_limit_s)
    if not rows:
        print(f"--only: no static trace is named {' '.join(args.only)}; the names are "
              "CLUSTER/static-1gpu or CLUSTER/static-gangs", file=sys.stderr)
        return 2
    clash = [r for r in rows if r["goals_clash"]]
    print(f"\n{len(clash)} of {len(rows)} traces where no schedule ending by {1 + args.slack:g}x "
          "the gang bound has an average JCT as short as the best baseline's"
          + (": " + ", ".join(f"{r['trace']} ({r['seed_base']})" for r in clash)
             if clash else ""))
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
