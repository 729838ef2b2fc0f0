"""``hadar-slurm tune``: a tuning study from a search-space file, as a Slurm job array.

::

    hadar-slurm tune search.toml --out /shared/studies/lr-search            # write, print sbatch
    hadar-slurm tune search.toml --out /shared/studies/lr-search --submit   # and submit it

The file and what is written: :mod:`hadar_slurm.studies.tune` and docs/studies.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from hadar_slurm.slurm.parse import parse_sbatch_parsable
from hadar_slurm.slurm.runner import SlurmRunner
from hadar_slurm.studies.tune import load_tune, prepare, sbatch_argv

__all__ = ["cmd_tune", "register"]


def cmd_tune(args: argparse.Namespace) -> int:
    spec = load_tune(args.space)
    script = prepare(spec, args.out, python=args.python)
    argv = sbatch_argv(spec, script)
    print(f"study {spec.name}: {spec.trials} trials written to {script.parent}/trials.json")
    if not args.submit:
        print("submit it with:")
        print("  " + shlex.join(argv))
        return 0
    out = SlurmRunner(args.slurm_conf).run(argv)
    job_id = parse_sbatch_parsable(out.stdout)
    print(f"submitted job array {job_id} (tasks {job_id}_0 to {job_id}_{spec.trials - 1})")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``tune`` to the main parser's subcommands."""
    tune = subparsers.add_parser(
        "tune", help="write (and submit) a tuning study as a job array from a search space",
        description=(__doc__ or "").split("\n\n")[0])
    tune.add_argument("space", help="the search-space file (TOML: [study], [command], [space])")
    tune.add_argument("--out", required=True,
                      help="folder for trials.json and study.sbatch (the nodes must reach it)")
    tune.add_argument("--submit", action="store_true", help="submit it with sbatch")
    tune.add_argument("--python", default=sys.executable if sys.executable else "python3",
                      help="the Python the tasks run the trial launcher with (default: this "
                           "one)")
    tune.add_argument("--slurm-conf", default=None,
                      help="the cluster's slurm.conf (default: $SLURM_CONF)")
    tune.set_defaults(func=cmd_tune)
