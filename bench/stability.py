"""Decision stability: how often a policy's decision changes when every running job's estimated
progress is off by a fraction of a second, as a live sidecar's estimates are.

    python -m bench.stability [--policies hadar,hadare,fifo] [--seeds 3] [--draws 6]
                              [--offsets 0.05,0.5,2] [--move-margin M]
                              [--json bench/results/stability.json]

Why: live, two runs of one trace by the same policy part at an epoch where their snapshots
hold the same jobs on the same GPUs and differ only by a run-wide offset of 0.03-1.5% in the
jobs' estimated progress (``docs/architecture.md``, "What you simulate is what you get"); a
policy whose decision turns on such an offset cannot be reproduced live job by job, however
faithful the simulator (issue #14's per-job target).

How: the trace and settings of :mod:`bench.fidelity` (its bundled trace on the dev cluster, the
live costs, compression 60, epochs of 12 wall seconds ending when a job ends); ``--seeds``
simulated runs per policy record every decision with its snapshot.  For each snapshot in which
jobs run, ``--draws`` times per offset ``d``: every running job's remaining work is lowered
by what its held GPUs do in ``u`` wall seconds, ``u`` drawn uniformly from ``[-d, d]`` once for
the whole snapshot (seeded), and the policy decides again.  A decision *flips* when any job's
GPU count on any type differs from the unperturbed decision's.

Rows: ``policy``, ``offset_s``, ``decisions`` (perturbed decisions made), ``flip_rate`` (share
of them that flip), ``job_flip_rate`` (share of (decision, job) pairs whose GPUs differ),
``moved_share`` (share of the flipped jobs that held GPUs in the snapshot), and the simulated
runs' median ``makespan_s``, ``avg_jct_s`` and ``moves`` (wall seconds), and ``move_margin``
(``--move-margin``: Hadar's rule that moves must pay, ``-1`` to run without it; None: the
default).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bench import fidelity
from bench.report import write_rows
from hadar_slurm.policy import Decision, Policy, Snapshot, make_policy
from hadar_slurm.policy.hadar import HadarPolicy

#: The live settings of bench.fidelity's results (its ``--pad-s 4.5 --restart-s 4.9``).
SETTINGS = fidelity.Settings(60.0, 12.0, 4.9, pad_s=4.5)


@dataclass
class Recorder:
    """A policy that decides as ``inner`` does and keeps every (snapshot, decision)."""

    inner: Policy
    seen: list[tuple[Snapshot, Decision]] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.inner.name

    def allocate(self, snapshot: Snapshot) -> Decision:
        decision = self.inner.allocate(snapshot)
        self.seen.append((snapshot, decision))
        return decision


def gpus_by_type(snapshot: Snapshot, decision: Decision) -> dict[int, tuple[int, ...]]:
    """Job id -> GPUs per type (in ``snapshot.gpu_types`` order) that ``decision`` gives it."""
    out: dict[int, list[int]] = {}
    pl = decision.placement
    for j, n, c in zip(pl.job.tolist(), pl.node.tolist(), pl.count.tolist(), strict=True):
        row = out.setdefault(int(j), [0] * len(snapshot.gpu_types))
        row[int(snapshot.node_type[n])] += int(c)
    return {j: tuple(v) for j, v in out.items()}


def offset_progress(snapshot: Snapshot, seconds: float) -> Snapshot:
    """``snapshot`` with every running job ``seconds`` further along (behind, if negative) at
    the rate of the GPUs it holds; remaining work stays positive."""
    held = snapshot.held()
    worker_rate = snapshot.rate / np.maximum(snapshot.scale, 1)[:, None]
    step = (held * worker_rate).sum(axis=1) * seconds
    remaining = np.maximum(snapshot.remaining - step, 1e-9 * snapshot.total)
    return replace(snapshot, remaining=remaining)


def policy_settings(policy_name: str, move_margin: float | None = None) -> dict[str, Any]:
    """As bench.fidelity builds the policy; ``move_margin``: Hadar's (also HadarE's Hadar),
    None for the default."""
    out: dict[str, Any] = {"max_copies": fidelity.FORK} if policy_name == "hadare" else {}
    if move_margin is not None and policy_name == "hadar":
        out["move_margin"] = move_margin
    elif move_margin is not None and policy_name == "hadare":
        out["hadar"] = HadarPolicy(move_margin=move_margin)
    return out


def probe(policy_name: str, seeds: int, draws: int, offsets: Sequence[float],
          st: fidelity.Settings = SETTINGS, move_margin: float | None = None,
          ) -> list[dict[str, Any]]:
    """The rows of one policy, one per offset."""
    settings = policy_settings(policy_name, move_margin)
    jobs = fidelity.load_trace(fidelity.TRACE)
    c = st.compression
    counts = {d: [0, 0, 0, 0, 0] for d in offsets}  # decisions, flips, job flips, jobs, moved
    spans, jcts, moves = [], [], []
    for seed in range(seeds):
        rec = Recorder(make_policy(policy_name, **settings))
        res = fidelity.simulate_live(jobs, rec, st, seed)
        spans.append(res.makespan_s / c)
        jcts.append(res.avg_jct_s / c)
        moves.append(sum(r.moves for r in res.records))
        rng = random.Random(seed)
        for snapshot, decision in rec.seen:
            held = snapshot.held().sum(axis=1) > 0
            if not held.any():
                continue
            running = {int(j) for j in snapshot.job_ids[held].tolist()}
            base = gpus_by_type(snapshot, decision)
            for d in offsets:
                tally = counts[d]
                for _ in range(draws):
                    again = make_policy(policy_name, **settings)
                    shifted = offset_progress(snapshot, rng.uniform(-d, d) * c)
                    alt = gpus_by_type(snapshot, again.allocate(shifted))
                    differ = {j for j in set(base) | set(alt) if base.get(j) != alt.get(j)}
                    tally[0] += 1
                    tally[1] += bool(differ)
                    tally[2] += len(differ)
                    tally[3] += snapshot.num_jobs
                    tally[4] += len(differ & running)
    rows = []
    for d in offsets:
        n, flips, jflips, pairs, ran = counts[d]
        rows.append({
            "policy": policy_name, "offset_s": d, "seeds": seeds, "draws": draws,
            "move_margin": move_margin,
            "decisions": n, "flip_rate": round(flips / n, 4) if n else None,
            "job_flip_rate": round(jflips / pairs, 4) if pairs else None,
            "moved_share": round(ran / jflips, 4) if jflips else None,
            "makespan_s": round(statistics.median(spans), 2),
            "avg_jct_s": round(statistics.median(jcts), 2),
            "moves": round(statistics.median(moves)),
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="hadar,hadare,fifo")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--draws", type=int, default=6)
    p.add_argument("--offsets", default="0.05,0.5,2", help="wall seconds, comma-separated")
    p.add_argument("--move-margin", type=float, default=None, metavar="M",
                   help="Hadar's move_margin (hadar, and hadare's Hadar); -1: moves not "
                        "weighed, as before it (default: the policy's own)")
    p.add_argument("--json", default="bench/results/stability.json")
    args = p.parse_args(argv)
    if args.seeds < 1 or args.draws < 1:
        p.error("--seeds and --draws must be at least 1")
    try:
        offsets = [float(x) for x in args.offsets.split(",") if x.strip()]
    except ValueError:
        p.error(f"--offsets: comma-separated seconds, e.g. 0.05,0.5,2; got {args.offsets!r}")
    if not offsets or any(not d >= 0 for d in offsets):
        p.error(f"--offsets: non-negative seconds, e.g. 0.05,0.5,2; got {args.offsets!r}")
    rows: list[dict[str, Any]] = []
    head = (f"{'policy':8s} {'offset s':>8s} {'decisions':>9s} {'flip rate':>9s} "
            f"{'job flips':>9s} {'moved':>6s} {'makespan s':>10s} {'avg JCT s':>9s} "
            f"{'moves':>5s}")
    print(head)
    print("-" * len(head))
    for name in [x.strip() for x in args.policies.split(",") if x.strip()]:
        for r in probe(name, args.seeds, args.draws, offsets, move_margin=args.move_margin):
            rows.append(r)
            print(f"{r['policy']:8s} {r['offset_s']:8.2f} {r['decisions']:9d} "
                  f"{_pct(r['flip_rate']):>9s} {_pct(r['job_flip_rate']):>9s} "
                  f"{_pct(r['moved_share']):>6s} {r['makespan_s']:10.1f} "
                  f"{r['avg_jct_s']:9.1f} {r['moves']:5d}")
            sys.stdout.flush()
    write_rows(rows, args.json)
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


if __name__ == "__main__":
    raise SystemExit(main())
