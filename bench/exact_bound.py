"""Is the gang bound tight?  The exact preemptive bound of the suite's static traces.

    python -m bench.exact_bound [--seed-base 0 100] [--policies hadar,gavel-makespan]
                                [--only NAME ...] [--json bench/results/exact_bound.json]

``bench.robustness`` measures makespans against the *fluid* bound (the LP where each job runs
on at most its scale factor of GPUs).  The fluid LP lets two gangs wider than half a type
share it in fractions of time that no schedule has, so a policy far from it may be far from
a bound that cannot be reached rather than from the best schedule.  For a static queue (every
job there at the start) the exact preemptive bound is the configuration LP
(:func:`hadar_slurm.sim.bounds.config_makespan_bound`, with gangs that may mix types at the
slowest one's pace, as the simulator runs them): no preemptive schedule, rounds and restart
costs aside, ends sooner.  Per static trace of the suite (both regimes, every cluster): the
fluid and configuration bounds, whether the column generation ended exact, and each policy's
makespan (as ``bench.robustness`` runs it: 360 s rounds, the live world's start and move
costs) over both.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench.report import write_rows
from bench.robustness import CLUSTERS, Case, Instance, instance, run_one, suite
from hadar_slurm.policy.base import FloatArray, IntArray
from hadar_slurm.sim.bounds import bound_inputs, config_makespan_bound


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """HiGHS's MIP prints debugging lines straight to the process's stdout; drop them."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


StaticTrace = tuple[int, Case, Instance, FloatArray, IntArray, FloatArray, IntArray]


def static_traces(seed_bases: Sequence[int], only: Sequence[str] = ()) -> Iterator[StaticTrace]:
    """The suite's static traces (``only``: those whose names are listed), each as ``(seed
    base, case, instance, work, scale factors, rates, GPUs per type)``."""
    for seed_base in seed_bases:
        for case in suite(seed_base):
            if not case.regime.startswith("static") or (only and case.name not in only):
                continue
            inst = instance(case)
            _, work, scale, rate, capacity = bound_inputs(inst.jobs, inst.cluster, inst.table)
            yield seed_base, case, inst, work, scale, rate, capacity


def measure(seed_bases: Sequence[int], policies: Sequence[str],
            only: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The rows, one per static trace (``only``: those whose names are listed)."""
    rows = []
    for seed_base, case, inst, work, scale, rate, capacity in static_traces(seed_bases, only):
        t0 = time.perf_counter()
        with quiet_stdout():
            config, exact = config_makespan_bound(work, scale, rate, capacity)
        row: dict[str, Any] = {
            "trace": case.name, "seed_base": seed_base, "generate": case.command(),
            "fluid_bound_s": round(inst.bound, 1), "config_bound_s": round(config, 1),
            "config_over_fluid": round(config / inst.bound, 5), "config_exact": exact,
            "config_wall_s": round(time.perf_counter() - t0, 2),
        }
        for policy in policies:
            res = run_one(case, policy, free_moves=False)
            row[f"{policy}_makespan_s"] = res["makespan_s"]
            row[f"{policy}_over_fluid"] = round(res["makespan_s"] / inst.bound, 4)
            row[f"{policy}_over_config"] = round(res["makespan_s"] / config, 4)
        rows.append(row)
        print(f"{seed_base:4d} {case.name:20s} config/fluid {row['config_over_fluid']:.4f}"
              f" ({'exact' if exact else 'not exact'}, {row['config_wall_s']:.1f} s)  "
              + "  ".join(f"{p} {row[f'{p}_over_fluid']:.3f} / {row[f'{p}_over_config']:.3f}"
                          for p in policies), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.exact_bound", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-base", type=int, nargs="+", default=[0, 100])
    ap.add_argument("--policies", default="hadar,gavel-makespan")
    ap.add_argument("--only", nargs="*", default=[], metavar="NAME",
                    help="only these static traces (e.g. gavel/static-gangs)")
    ap.add_argument("--json", default="bench/results/exact_bound.json")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    print("makespan over the fluid bound / over the configuration (exact preemptive) bound")
    rows = measure(args.seed_base, policies, args.only)
    if not rows:
        print(f"--only: no static trace is named {' '.join(args.only)}; the names are "
              "CLUSTER/static-1gpu or CLUSTER/static-gangs, CLUSTER one of "
              f"{', '.join(CLUSTERS)}", file=sys.stderr)
        return 2
    worst = max(r["config_over_fluid"] for r in rows)
    print(f"\nconfiguration over fluid bound: at most {worst:.4f} over {len(rows)} static traces;"
          f" exact on {sum(r['config_exact'] for r in rows)}")
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
