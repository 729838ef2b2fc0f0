"""Write a trace where a few long jobs dominate: ``bench/traces/long_tail_seed0.trace``.

    python -m bench.gen_long_tail [--seed 0] [--out bench/traces/long_tail_seed0.trace]

HadarE's case (issue #4): on Gavel's 4:4:4 cluster, 28 jobs drawn (seeded) from
``static_32_seed0`` arrive at once, and so do 3 long jobs whose work takes 20-30 hours on one
V100 each, about three times what the rest of the trace keeps the whole cluster busy.  Without
forking the makespan is the longest job alone; with it, the long jobs can spread over the GPUs
the short ones leave.  The file is in Gavel's trace format (``hadar_slurm.sim.trace``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hadar_slurm.rates.table import default_table
from hadar_slurm.sim.trace import load_trace

LONG_TYPES = ("ResNet-50 (batch size 64)", "Transformer (batch size 128)", "LM (batch size 20)")


def lines(seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    table = default_table()
    base = load_trace("static_32_seed0", table)
    pick = sorted(rng.choice(len(base), size=28, replace=False).tolist())
    out = []
    for i in pick:
        j = base[i]
        out.append((j.job_type, int(j.total_steps), j.scale_factor, j.arrival_s))
    for job_type in LONG_TYPES:
        hours = float(rng.uniform(20.0, 30.0))
        steps = int(table.rate(job_type, 1, "v100") * hours * 3600)
        out.append((job_type, steps, 1, 0.0))
    return [f"{t}\tpython3 train.py\tsynthetic\t--steps\t0\t{s}\t{sf}\t1\t-1.000000\t{a:g}"
            for t, s, sf, a in out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/traces/long_tail_seed0.trace")
    args = ap.parse_args(argv)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines(args.seed)) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
