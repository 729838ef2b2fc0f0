"""How often a policy stops a running job for one round only  (issues #14, #15)

    python -m bench.pauses [--policy hadar] [--seed-base 0] [--only NAME ...] [--json OUT]

A *pause* is a job that runs at two full epochs with exactly one full epoch between them at
which it does not run (it was stopped, and started again a round later).  Each pause costs
the job a restart and, unless the GPUs it left idle for the round, a start to whatever took
them.  Per trace of the regime suite (``bench.robustness``, live move and start costs, fixed
rounds): the pauses, the jobs that paused, the three that paused most, and the GPU-rounds
paused (each pause weighed by the job's GPUs).  Only full epochs count: a fill epoch places
jobs on free GPUs and stops none.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.report import write_rows
from bench.robustness import instance, named, run_one, suite
from hadar_slurm.loop import EpochRecord
from hadar_slurm.sim.backend import SimulatedCluster


def pauses(running: Sequence[frozenset[int]]) -> Counter[int]:
    """Per job id, how many times it ran at a full epoch, did not at the next and ran again
    at the one after (``running``: the ids running after each full epoch, in order)."""
    out: Counter[int] = Counter()
    for before, now, after in zip(running, running[1:], running[2:], strict=False):
        out.update((before & after) - now)
    return out


def measure(policy: str, seed_base: int, only: Sequence[str]) -> list[dict[str, Any]]:
    cases = suite(seed_base)
    rows = []
    for case in named(cases, only) if only else cases:
        inst = instance(case)
        running: list[frozenset[int]] = []

        def seen(rec: EpochRecord, cluster: SimulatedCluster,
                 running: list[frozenset[int]] = running) -> None:
            if rec.full:
                running.append(frozenset(int(j) for j in cluster.current.by_job()))

        res = run_one(case, policy, free_moves=False, on_epoch=seen)
        count = pauses(running)
        width = {j.job_id: j.scale_factor for j in inst.jobs}
        row: dict[str, Any] = {
            "trace": case.name, "policy": policy, "seed_base": seed_base,
            "pauses": sum(count.values()), "jobs_paused": len(count),
            "gpu_rounds_paused": sum(n * width[j] for j, n in count.items()),
            "most": [[j, n] for j, n in count.most_common(3)],
            "full_epochs": len(running), "makespan_s": res["makespan_s"],
            "avg_jct_s": res["avg_jct_s"],
        }
        rows.append(row)
        print(f"{case.name:24s} pauses {row['pauses']:4d}  jobs {row['jobs_paused']:3d}  "
              f"GPU-rounds {row['gpu_rounds_paused']:5d}  of {row['full_epochs']:5d} epochs  "
              f"most {row['most']}", flush=True)
    total = sum(r["pauses"] for r in rows)
    print(f"\n{policy}, seed base {seed_base}: {total} pauses over {len(rows)} traces, "
          f"{sum(r['gpu_rounds_paused'] for r in rows)} GPU-rounds")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pauses", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="hadar")
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=[], metavar="NAME",
                    help="only these traces, clusters or regimes (as bench.robustness)")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    rows = measure(args.policy, args.seed_base, args.only)
    if not rows:
        print(f"--only: nothing is named {' '.join(args.only)}", file=sys.stderr)
        return 2
    if args.json:
        write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
