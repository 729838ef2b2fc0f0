"""Sensitivity: how far each policy's figures move when its inputs change by nothing measurable.

    python -m bench.sensitivity [--seed-base 0] [--only NAME ...] [--policies P,P]
                                [--draws 2] [--rel 1e-4] [--move-s 1.0] [--workers 2]
                                [--json bench/results/sensitivity.json]

Every trace of the regime suite (:func:`bench.robustness.suite`) runs as the robustness bench
runs it (360 s rounds, the live world's start and move costs), once as drawn and then
perturbed by amounts no one could measure on a real cluster:

* ``work-K`` (``K`` = 1 .. ``--draws``): every job's length (``total_steps``) times
  ``1 + rel * u``, ``u`` uniform on [-1, 1] from a generator seeded with ``K``: with the
  default ``rel`` of 1e-4, a 10-hour job changes by at most 3.6 s;
* ``move+1s``: a move (and a preempted job's resume) costs ``--move-s`` seconds more than the
  sidecar measures (7.3 s, against a 360 s round).

Per trace, policy and perturbation: makespan and average JCT over the unperturbed run's.  A
ratio further from 1.0 than :data:`TOLERANCE` means the perturbation *moved* the trace.  The
summary gives per policy and kind of perturbation the traces moved and the range of the
ratios; then the goals of issue #15 that the unperturbed runs miss, each with its figure over
the perturbed runs and whether one of them meets it (:func:`goal_misses`).  ``--from-json
FILE`` prints the same from the rows of an earlier run.

Why: the goals of issues #15 and #16 compare single runs trace by trace (Hadar no worse than a
baseline, sharing no worse than not sharing), so a policy whose figures move by several
percent when a job is a second longer meets or misses them by chance on traces near the line.
This bench measures that floor for every policy; a policy change is judged against it
(docs/algorithm.md, "How much of a ratio is noise").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.report import progress, write_rows
from bench.robustness import GOALS, POLICIES, Case, instance, named, suite
from bench.robustness import add_ratios as robustness_ratios
from hadar_slurm.costs import LiveCosts
from hadar_slurm.model import Job
from hadar_slurm.policy import make_policy
from hadar_slurm.sim.run import simulate
from hadar_slurm.sim.trace import perturbed_jobs

#: A ratio within this of 1.0 is "not moved" (the figures' rounding, as bench.sharing's).
TOLERANCE = 0.0005
BASE = "base"
MOVE = "move+1s"


def perturbations(draws: int) -> list[str]:
    """The runs of a trace and policy: the base, ``work-1`` .. ``work-DRAWS`` and ``move+1s``."""
    return [BASE, *(f"work-{k}" for k in range(1, draws + 1)), MOVE]


def run_one(case: Case, policy: str, perturbation: str, rel: float,
            move_s: float) -> dict[str, Any]:
    inst = instance(case)
    live = LiveCosts()
    jobs: Sequence[Job] = inst.jobs
    migration = live.move_s
    if perturbation.startswith("work-"):
        jobs = perturbed_jobs(inst.jobs, rel, int(perturbation.split("-", 1)[1]))
    elif perturbation == MOVE:
        migration += move_s
    t0 = time.perf_counter()
    res = simulate(jobs, inst.cluster, inst.table, make_policy(policy),
                   migration_cost_s=migration, start_cost_s=live.start_s)
    return {"trace": case.name, "regime": case.regime, "cluster": case.cluster_name,
            "generate": case.command(), "policy": policy, "perturbation": perturbation,
            "makespan_s": round(res.makespan_s, 3), "avg_jct_s": round(res.avg_jct_s, 3),
            "gang_bound_s": round(inst.bound, 3), "fork_bound_s": round(inst.fork, 3),
            "rel": rel, "move_s": move_s,
            "completed": res.num_completed, "wall_s": round(time.perf_counter() - t0, 2)}


def _task(args: tuple[Case, str, str, float, float]) -> dict[str, Any]:
    return run_one(*args)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each perturbed row's makespan and average JCT over its trace and policy's base row,
    and whether it ``moved`` (either ratio off 1.0 by more than :data:`TOLERANCE`)."""
    base = {(r["trace"], r["policy"]): r for r in rows if r["perturbation"] == BASE}
    for r in rows:
        b = base.get((r["trace"], r["policy"]))
        if r["perturbation"] == BASE or b is None:
            continue
        r["makespan_ratio"] = round(r["makespan_s"] / b["makespan_s"], 5)
        r["avg_jct_ratio"] = round(r["avg_jct_s"] / b["avg_jct_s"], 5)
        r["moved"] = bool(abs(r["makespan_ratio"] - 1.0) > TOLERANCE
                          or abs(r["avg_jct_ratio"] - 1.0) > TOLERANCE)


def kind(perturbation: str) -> str:
    """``work`` (a length draw) or ``move`` (the dearer move)."""
    return "work" if perturbation.startswith("work-") else "move"


def summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy and kind of perturbation (:func:`kind`): the traces it moved, and the range
    and median absolute log of the ratios over its runs.  (A dearer move lengthens every
    policy's runs that move jobs a little by itself; the lengths' draws change nothing a
    steady policy could notice.)"""
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        for k in ("work", "move"):
            mine = [r for r in rows if r["policy"] == policy and "moved" in r
                    and kind(r["perturbation"]) == k]
            if mine:
                out.append(_summary(policy, k, mine))
    return out


def _summary(policy: str, k: str, mine: Sequence[dict[str, Any]]) -> dict[str, Any]:
    traces = sorted({r["trace"] for r in mine})
    moved = sorted({r["trace"] for r in mine if r["moved"]})
    jct = [r["avg_jct_ratio"] for r in mine]
    span = [r["makespan_ratio"] for r in mine]
    return {
        "policy": policy, "kind": k, "traces": len(traces), "runs": len(mine),
        "traces_moved": len(moved), "runs_moved": sum(r["moved"] for r in mine),
        "avg_jct_ratio_min": min(jct), "avg_jct_ratio_max": max(jct),
        "avg_jct_abs_log_median": round(statistics.median(abs(math.log(x)) for x in jct), 5),
        "makespan_ratio_min": min(span), "makespan_ratio_max": max(span),
        "moved": moved,
    }


def goal_misses(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goals of issue #15 (:data:`bench.robustness.GOALS`) that the unperturbed run of a
    trace misses, each with its figure in every run of that trace (the same perturbation for
    the policy and the runs it is compared with) and whether some perturbed run meets it
    (``by_chance``) or none does.  Each perturbation's runs are judged as
    :mod:`bench.robustness` judges its rows, by its own :func:`~bench.robustness.add_ratios`."""
    judged: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for pert in dict.fromkeys(r["perturbation"] for r in rows):
        # (rows as bench.robustness writes them: its ties are ties here too)
        mine = [{"trace": r["trace"], "policy": r["policy"],
                 "avg_jct_s": round(r["avg_jct_s"], 1),
                 "makespan_over_gang_bound": round(r["makespan_s"] / r["gang_bound_s"], 4),
                 "makespan_over_fork_bound": round(r["makespan_s"] / r["fork_bound_s"], 4)}
                for r in rows if r["perturbation"] == pert and "gang_bound_s" in r]
        robustness_ratios(mine)
        for r in mine:
            judged.setdefault((r["trace"], r["policy"]), {})[pert] = r
    out = []
    for (trace, policy), runs in judged.items():
        if BASE not in runs or len(runs) < 2:
            continue
        for key, goal, what, of in GOALS.get(policy, ()):
            ratio = {k: r[key] for k, r in runs.items() if r[key] is not None}
            if BASE not in ratio or ratio[BASE] <= goal:
                continue
            out.append({"trace": trace, "policy": policy, "goal": f"{what} over {of}",
                        "target": goal, "base": ratio[BASE],
                        "perturbed_min": min(ratio.values()),
                        "perturbed_max": max(ratio.values()),
                        "by_chance": any(v <= goal for v in ratio.values())})
    return sorted(out, key=lambda m: (m["policy"], m["trace"], m["goal"]))


def print_misses(misses: Sequence[dict[str, Any]]) -> None:
    if not misses:
        return
    chance = sum(m["by_chance"] for m in misses)
    print(f"\n{len(misses)} goal(s) the unperturbed runs miss; {chance} met by some perturbed "
          f"run (decided by chance), {len(misses) - chance} missed by every run:")
    for m in misses:
        print(f"  {m['policy']:6s} {m['trace']:22s} {m['goal']:38s} {m['base']:.3f} "
              f"({m['perturbed_min']:.3f} .. {m['perturbed_max']:.3f}; goal {m['target']:g})"
              + ("  by chance" if m["by_chance"] else ""))


def print_summary(summ: Sequence[dict[str, Any]], rel: float, move_s: float) -> None:
    print(f"perturbed: every job's length x (1 +- {rel:g}) per draw; a move {move_s:g} s dearer")
    print(f"moved: makespan or average JCT off the unperturbed run's by more than "
          f"{TOLERANCE:.2%}\n")
    print(f"{'policy':15s} {'kind':5s} {'traces moved':>13s} {'runs moved':>11s} "
          f"{'avg JCT ratio':>17s} {'median |log|':>13s} {'makespan ratio':>17s}")
    for s in summ:
        print(f"{s['policy']:15s} {s['kind']:5s} {s['traces_moved']:>6d} of {s['traces']:<4d} "
              f"{s['runs_moved']:>4d} of {s['runs']:<4d} "
              f"{s['avg_jct_ratio_min']:.3f} .. {s['avg_jct_ratio_max']:.3f}  "
              f"{s['avg_jct_abs_log_median']:>12.4f}  "
              f"{s['makespan_ratio_min']:.3f} .. {s['makespan_ratio_max']:.3f}")
    for s in summ:
        if s["moved"] and s["kind"] == "work":
            print(f"  {s['policy']}, moved by the lengths' draws: " + ", ".join(s["moved"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seed-base", type=int, default=0,
                    help="trace k is drawn with seed SEED_BASE + k (default: %(default)s)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="only these traces (cluster/regime), or all of a cluster or regime")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--draws", type=int, default=2,
                    help="perturbations of the job lengths per trace (default: %(default)s)")
    ap.add_argument("--rel", type=float, default=1e-4,
                    help="relative size of a length perturbation (default: %(default)g)")
    ap.add_argument("--move-s", type=float, default=1.0,
                    help="seconds added to a move's cost (default: %(default)g)")
    ap.add_argument("--workers", type=int, default=2, help="processes (default: 2)")
    ap.add_argument("--json", default="bench/results/sensitivity.json")
    ap.add_argument("--from-json", metavar="FILE",
                    help="run nothing: summarize the rows an earlier run wrote to FILE")
    args = ap.parse_args(argv)
    if args.from_json:
        try:
            rows = [r for r in json.loads(Path(args.from_json).read_text())
                    if not r.get("summary") and not r.get("goal_miss")]
        except (OSError, ValueError) as e:
            ap.error(f"--from-json {args.from_json}: {e}")
        add_ratios(rows)
        # (the perturbations' sizes as that run had them, where its rows say)
        rel = next((r["rel"] for r in rows if "rel" in r), args.rel)
        move_s = next((r["move_s"] for r in rows if "move_s" in r), args.move_s)
        print_summary(summary(rows), rel, move_s)
        print_misses(goal_misses(rows))
        return 0
    if args.draws < 0:
        ap.error("--draws must be >= 0")
    if not 0.0 <= args.rel < 1.0:
        ap.error("--rel must be in [0, 1)")
    cases = suite(args.seed_base)
    if args.only:
        cases = named(cases, args.only)
        if not cases:
            ap.error(f"no trace matches {args.only}; traces are "
                     + ", ".join(c.name for c in suite(args.seed_base)))
    policies = [p for p in args.policies.split(",") if p]
    tasks = [(c, p, k, args.rel, args.move_s) for c in cases for p in policies
             for k in perturbations(args.draws)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        rows = []
        for k, row in enumerate(pool.map(_task, tasks)):
            rows.append(row)
            progress(k + 1, len(tasks), time.perf_counter() - t0)
    add_ratios(rows)
    summ = summary(rows)
    print_summary(summ, args.rel, args.move_s)
    misses = goal_misses(rows)
    print_misses(misses)
    write_rows([*rows, *({"summary": True, **s} for s in summ),
                *({"goal_miss": True, **m} for m in misses)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
