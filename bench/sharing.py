"""GPU sharing on the regime suite (issue #16): Hadar and HadarE with ``share`` on and off.

    python -m bench.sharing [--seed-base 0] [--policies hadar,hadare] [--only NAME ...]
                            [--draws 0] [--rel 1e-4] [--workers 1]
                            [--json bench/results/sharing.json]

Every trace of :func:`bench.robustness.suite` (36 generated workloads: four clusters times nine
regimes, single- and multi-GPU jobs) runs as ``hadar-slurm simulate`` runs it (360 s rounds, a
start and a move costing what the sidecar measures, :class:`~hadar_slurm.costs.LiveCosts`),
with the table's co-located pair rates (Gavel's measured pairs, estimated on the types Gavel
never measured: :attr:`~hadar_slurm.rates.table.ThroughputTable.colocated`), once with
``share=False`` and once with ``share=True``.  Per trace and policy: makespan, average JCT, p95
JCT, the simulator's utilization (GPU-seconds held over GPU-seconds there were; a shared GPU
counts once) and the *useful* utilization (GPU-seconds the jobs would need alone on their
fastest type, over GPU-seconds there were: more work per GPU shows here), each shared over
unshared; then the median and worst ratio per regime.

Goal (issue #16): on every trace, average JCT and utilization with sharing no worse than
without.  A ratio above 1.0 for JCT (or below 1.0 for utilization) is a miss; the summary lists
them.

``--draws N`` also runs every trace ``N`` more times with its jobs' lengths perturbed by
amounts no one could measure (times ``1 + rel * u``, ``u`` uniform on [-1, 1], seeded with the
draw, as :mod:`bench.sensitivity` perturbs them; a 10-hour job moves by at most 3.6 s at the
default ``rel``), shared and unshared with the same lengths.  Hadar's figures move by several
percent under such changes (docs/algorithm.md, "How much of a ratio is noise"), so one run's
ratio says little on a trace near 1.0.  Per trace and policy the summary then adds the
geometric mean of the ``N + 1`` draws' ratios and how many draws were worse: a trace whose mean
is worse loses to sharing whatever the draw (a *mean miss*); one worse in some draws only is
decided by chance.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from bench.compare import geo_mean
from bench.report import write_rows
from bench.robustness import Case, instance, suite
from bench.sensitivity import perturbed_jobs
from hadar_slurm.costs import LiveCosts
from hadar_slurm.policy import make_policy
from hadar_slurm.sim.run import simulate

#: What a ratio may exceed 1.0 by and still count as "no worse" (rounding of the figures).
TOLERANCE = 0.0005


def useful_gpu_s(case: Case) -> float:
    """GPU-seconds the case's jobs need alone on their fastest GPU type (each on its scale
    factor of GPUs)."""
    inst = instance(case)
    types = inst.cluster.gpu_types
    total = 0.0
    for job in inst.jobs:
        best = max(inst.table.rate(job.job_type, job.scale_factor, g) for g in types)
        if best > 0:
            total += job.total_steps / best * job.scale_factor
    return total


def run_one(case: Case, policy: str, share: bool, draw: int = 0,
            rel: float = 1e-4) -> dict[str, Any]:
    """One run: draw 0 is the trace as generated, draw ``k > 0`` its jobs' lengths perturbed
    (:func:`bench.sensitivity.perturbed_jobs` with seed ``k``)."""
    inst = instance(case)
    jobs = perturbed_jobs(inst.jobs, rel, draw) if draw else inst.jobs
    live = LiveCosts()
    t0 = time.perf_counter()
    res = simulate(jobs, inst.cluster, inst.table, make_policy(policy, share=share),
                   migration_cost_s=live.move_s, start_cost_s=live.start_s)
    capacity = inst.cluster.total_gpus * res.makespan_s
    pairs = sum(len(p) for _t, p in res.packed)
    return {
        "trace": case.name, "regime": case.regime, "cluster": case.cluster_name,
        "generate": case.command(), "policy": policy, "share": share, "draw": draw,
        "jobs": len(inst.jobs), "multi_gpu_jobs": sum(j.scale_factor > 1 for j in inst.jobs),
        "makespan_s": round(res.makespan_s, 1), "avg_jct_s": round(res.avg_jct_s, 1),
        "p95_jct_s": round(res.p95_jct_s, 1), "utilization": round(res.utilization, 4),
        "useful_utilization": round(useful_gpu_s(case) / capacity, 4) if capacity > 0 else 0.0,
        "pair_rounds": pairs, "completed": res.num_completed,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def _task(args: tuple[Case, str, bool, int, float]) -> dict[str, Any]:
    return run_one(*args)


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace, policy and draw: shared over unshared of makespan, average JCT, p95 JCT and
    both utilizations, and whether it misses the goal."""
    by = {(r["trace"], r["policy"], r["share"], r.get("draw", 0)): r for r in rows}
    out = []
    for (trace, policy, share, draw), on in by.items():
        off = by.get((trace, policy, False, draw))
        if not share or off is None:
            continue
        row = {"trace": trace, "regime": on["regime"], "cluster": on["cluster"],
               "policy": policy, "draw": draw, "pair_rounds": on["pair_rounds"]}
        for key in ("makespan_s", "avg_jct_s", "p95_jct_s", "utilization",
                    "useful_utilization"):
            row[key.removesuffix("_s") + "_ratio"] = (
                round(on[key] / off[key], 4) if off[key] else math.nan)
        row["miss"] = (row["avg_jct_ratio"] > 1 + TOLERANCE
                       or row["useful_utilization_ratio"] < 1 - TOLERANCE)
        out.append(row)
    return out


def over_draws(ratio_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace and policy, over its draws: the geometric means of the average-JCT and
    useful-utilization ratios, how many draws missed, and whether the means miss the goal."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in ratio_rows:
        groups.setdefault((r["trace"], r["policy"]), []).append(r)
    out = []
    for (trace, policy), rs in groups.items():
        jct = geo_mean([r["avg_jct_ratio"] for r in rs])
        useful = geo_mean([r["useful_utilization_ratio"] for r in rs])
        out.append({"trace": trace, "regime": rs[0]["regime"], "policy": policy,
                    "draws": len(rs), "avg_jct_ratio_mean": round(jct, 4),
                    "avg_jct_ratio_min": min(r["avg_jct_ratio"] for r in rs),
                    "avg_jct_ratio_max": max(r["avg_jct_ratio"] for r in rs),
                    "useful_utilization_ratio_mean": round(useful, 4),
                    "draws_missed": sum(bool(r["miss"]) for r in rs),
                    "mean_miss": jct > 1 + TOLERANCE or useful < 1 - TOLERANCE})
    return out


def summary(rows: Sequence[dict[str, Any]]) -> str:
    """The per-regime table of the unperturbed runs (draw 0) and their misses; with more draws,
    the traces whose mean over the draws misses and those missed in some draws only."""
    base = [r for r in rows if r.get("draw", 0) == 0]
    lines = ["shared over unshared, per policy and regime: median (worst) of makespan, "
             "average JCT, useful utilization"]
    for policy in sorted({r["policy"] for r in base}):
        mine = [r for r in base if r["policy"] == policy]
        lines.append(f"{policy}:")
        for regime in [*sorted({r["regime"] for r in mine}), "all"]:
            rs = [r for r in mine if regime in ("all", r["regime"])]
            cells = []
            for key, worst in (("makespan_ratio", max), ("avg_jct_ratio", max),
                               ("useful_utilization_ratio", min)):
                vals = [r[key] for r in rs]
                cells.append(f"{statistics.median(vals):.3f} ({worst(vals):.3f})")
            gm = geo_mean([r["avg_jct_ratio"] for r in rs])
            lines.append(f"  {regime:<14} {len(rs):>3} traces  makespan {cells[0]}  JCT "
                         f"{cells[1]}  useful util {cells[2]}  JCT geo-mean {gm:.3f}")
        missed = [f"{r['trace']} (JCT {r['avg_jct_ratio']:.3f}, useful util "
                  f"{r['useful_utilization_ratio']:.3f})" for r in mine if r["miss"]]
        lines.append(f"  misses: {len(missed)} of {len(mine)}" + (
            ": " + "; ".join(missed) if missed else ""))
    if len(base) == len(rows):
        return "\n".join(lines)
    lines.append("over the draws (the trace as generated and its perturbed lengths): geometric "
                 "mean of the ratios, [lowest, highest] average-JCT ratio, draws missed")
    for policy in sorted({r["policy"] for r in rows}):
        mine = over_draws([r for r in rows if r["policy"] == policy])
        means = [m for m in mine if m["mean_miss"]]
        some = [m for m in mine if m["draws_missed"] and not m["mean_miss"]]
        gm = geo_mean([m["avg_jct_ratio_mean"] for m in mine])
        lines.append(f"{policy}: {len(mine)} traces, JCT geo-mean {gm:.3f}; mean misses "
                     f"{len(means)}, missed in some draws only {len(some)}")
        for m in sorted(mine, key=lambda m: -m["avg_jct_ratio_mean"]):
            if m["draws_missed"]:
                lines.append(
                    f"  {m['trace']:<22} JCT {m['avg_jct_ratio_mean']:.3f} "
                    f"[{m['avg_jct_ratio_min']:.3f}, {m['avg_jct_ratio_max']:.3f}]  useful "
                    f"util {m['useful_utilization_ratio_mean']:.3f}  missed in "
                    f"{m['draws_missed']} of {m['draws']}"
                    + ("  MEAN MISS" if m["mean_miss"] else ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sharing",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--policies", default="hadar,hadare")
    ap.add_argument("--only", nargs="*", default=None, help="trace names (cluster/regime)")
    ap.add_argument("--draws", type=int, default=0,
                    help="perturbed draws of every trace beside the trace as generated")
    ap.add_argument("--rel", type=float, default=1e-4,
                    help="the draws' relative change of a job's length (at most)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the rows and ratios here")
    args = ap.parse_args(argv)
    cases = [c for c in suite(args.seed_base) if not args.only or c.name in args.only]
    if not cases:
        ap.error(f"--only {args.only}: no such trace (names: cluster/regime, e.g. "
                 f"{suite()[0].name})")
    if args.draws < 0:
        ap.error(f"--draws {args.draws}: give 0 or more perturbed draws")
    if not 0.0 < args.rel < 1.0:
        ap.error(f"--rel {args.rel}: give a relative change in (0, 1), e.g. 1e-4")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    tasks = [(c, p, s, d, args.rel) for c in cases for p in policies
             for d in range(args.draws + 1) for s in (False, True)]
    t0 = time.perf_counter()
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            rows = list(pool.map(_task, tasks, chunksize=2))
    else:
        rows = [_task(t) for t in tasks]
    out = ratios(rows)
    text = summary(out)
    print(text)
    print(f"({len(tasks)} runs in {time.perf_counter() - t0:.0f} s)")
    if args.json:
        means = over_draws(out) if args.draws else []
        write_rows([*rows, *({"ratio": True, **r} for r in out),
                    *({"over_draws": True, **m} for m in means)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
