"""Is the gang bound tight?  The exact preemptive bound of the suite's static traces.

    python -m bench.exact_bound [--seed-base 0 100] [--policies hadar,gavel-makespan]
                                [--only NAME ...] [--forks]
                                [--json bench/results/exact_bound[_forks].json]

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

``--forks``: the same for HadarE's fork bound (``bench.robustness``'s ``fork_bound_s``: a job
may also run as node-disjoint one-node copies, at most HadarE's ``max_copies``) and the
configuration LP with those copies (consolidation not counted); HadarE by default.
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
from hadar_slurm.policy.hadare import HadarEPolicy
from hadar_slurm.sim.bounds import bound_inputs, config_makespan_bound, copy_room


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
            only: Sequence[str] = (), forks: bool = False) -> list[dict[str, Any]]:
    """The rows, one per static trace (``only``: those whose names are listed); ``forks``:
    the fork bound's LPs (a job may also run as node-disjoint one-node copies, at most
    HadarE's ``max_copies``, consolidation not charged) instead of the gang bound's."""
    rows = []
    copies = HadarEPolicy().max_copies
    for seed_base, case, inst, work, scale, rate, capacity in static_traces(seed_bases, only):
        t0 = time.perf_counter()
        fluid = inst.fork if forks else inst.fluid
        with quiet_stdout():
            config, exact = config_makespan_bound(
                work, scale, rate, capacity, room=copy_room(scale, inst.cluster) if forks else None,
                copies=copies if forks else None)
        row: dict[str, Any] = {
            "trace": case.name, "seed_base": seed_base, "generate": case.command(),
            "forks": forks, "fluid_bound_s": round(fluid, 1), "config_bound_s": round(config, 1),
            "config_over_fluid": round(config / fluid, 5), "config_exact": exact,
            "config_wall_s": round(time.perf_counter() - t0, 2),
        }
        for policy in policies:
            res = run_one(case, policy, free_moves=False)
            row[f"{policy}_makespan_s"] = res["makespan_s"]
            row[f"{policy}_over_fluid"] = round(res["makespan_s"] / fluid, 4)
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
    ap.add_argument("--policies", default=None,
                    help="default hadar,gavel-makespan (hadare with --forks)")
    ap.add_argument("--only", nargs="*", default=[], metavar="NAME",
                    help="only these static traces (e.g. gavel/static-gangs)")
    ap.add_argument("--forks", action="store_true",
                    help="the fork bound (jobs may run as node-disjoint copies; hadare)")
    ap.add_argument("--json", default=None, help="default bench/results/exact_bound.json "
                    "(exact_bound_forks.json with --forks)")
    args = ap.parse_args(argv)
    policy_list = args.policies or ("hadare" if args.forks else "hadar,gavel-makespan")
    policies = [p for p in policy_list.split(",") if p]
    out = args.json or ("bench/results/exact_bound_forks.json" if args.forks
                        else "bench/results/exact_bound.json")
    what = "fork" if args.forks else "fluid"
    print(f"makespan over the {what} bound / over the configuration (exact preemptive) bound")
    rows = measure(args.seed_base, policies, args.only, forks=args.forks)
    if not rows:
        print(f"--only: no static trace is named {' '.join(args.only)}; the names are "
              "CLUSTER/static-1gpu or CLUSTER/static-gangs, CLUSTER one of "
              f"{', '.join(CLUSTERS)}", file=sys.stderr)
        return 2
    worst = max(r["config_over_fluid"] for r in rows)
    print(f"\nconfiguration over {what} bound: at most {worst:.4f} over {len(rows)} static "
          f"traces; exact on {sum(r['config_exact'] for r in rows)}")
    write_rows(rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
