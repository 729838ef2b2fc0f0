"""Generate the illustrative a100/h100 throughput tables.

    python -m bench.gen_dev_throughputs [--synthetic] [--out FILE] [--check]

Gavel measured v100, p100 and k80 only.  Two tables add the GPU types it never measured, both
ILLUSTRATIVE, NOT MEASURED (:mod:`hadar_slurm.rates.synthetic`: the v100 rate times a fixed
factor per model family, so the files are deterministic and a v100 rate of 0.0 stays 0.0):

* ``slurm_conf/dev-throughputs.csv`` (the default): a100 rates for the dev cluster's fake
  ``a100`` nodes (``slurm_conf/nodes.conf``);
* ``hadar_slurm/data/synthetic/throughputs.csv`` (``--synthetic``): a100 and h100 rates for the
  simulator and the workload generator (``hadar-slurm trace generate``).

``--check`` exits 1 when the file on disk differs from what this script would write (a test
runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hadar_slurm.rates.synthetic import SYNTHETIC_GPUS, render_csv

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "slurm_conf" / "dev-throughputs.csv"
SYNTHETIC_OUT = REPO / "hadar_slurm" / "data" / "synthetic" / "throughputs.csv"
TITLE = "a100 rates for the hadar-slurm dev cluster's fake GPUs (slurm_conf/nodes.conf)."
SYNTHETIC_TITLE = ("a100 and h100 rates for the simulator and `hadar-slurm trace generate` "
                   "(hadar_slurm/rates/synthetic.py).")


def render() -> str:
    """The dev cluster's CSV text: the a100 rates of :mod:`hadar_slurm.rates.synthetic`."""
    return render_csv(("a100",), title=TITLE)


def render_synthetic() -> str:
    """The simulator's a100/h100 table (``hadar_slurm/data/synthetic/throughputs.csv``)."""
    return render_csv(SYNTHETIC_GPUS, title=SYNTHETIC_TITLE)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gen_dev_throughputs",
                                 description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--synthetic", action="store_true",
                    help="the simulator's a100/h100 table instead of the dev cluster's")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"CSV to write (default: {DEFAULT_OUT.relative_to(REPO)}, or "
                         f"{SYNTHETIC_OUT.relative_to(REPO)} with --synthetic)")
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 when --out is not up to date")
    args = ap.parse_args(argv)
    text = render_synthetic() if args.synthetic else render()
    out: Path = args.out or (SYNTHETIC_OUT if args.synthetic else DEFAULT_OUT)
    if args.check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print(f"{out} is out of date: run python -m bench.gen_dev_throughputs"
                  + (" --synthetic" if args.synthetic else ""), file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    rows = sum(1 for line in text.splitlines() if line and not line.startswith("#")) - 1
    print(f"wrote {out} ({rows} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
