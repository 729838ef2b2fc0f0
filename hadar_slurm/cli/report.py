"""``hadar-slurm report``: plots of a sidecar's last day from its JSON log.

::

    hadar-slurm report --config CFG | --log FILE [--since 24h] [--out report.png|report.html]

``--config`` reads the log named by the config's ``[sidecar] log_file``; ``--log`` names the log
(a sidecar logging to the journal: ``journalctl -u hadar-slurm -o cat > sidecar.log``).  Rotated
files beside it are read too.  See :mod:`hadar_slurm.sidecar.daily_report` for what is drawn.
``python -m hadar_slurm.cli.report`` runs the same command on its own.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence

from hadar_slurm.errors import InputError
from hadar_slurm.sidecar.config import load_config
from hadar_slurm.sidecar.daily_report import load_report, write_report

__all__ = ["cmd_report", "main", "parse_duration", "register"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``24h``, ``90m``, ``2d``, ``3600s`` or ``3600`` (seconds), > 0."""
    m = _DURATION.match(text)
    value = float(m.group(1)) * _UNIT_S[m.group(2).lower()] if m else 0.0
    if value <= 0:
        raise InputError(f"expected a duration such as 24h, 90m or 2d, got {text!r}",
                         field="--since", fix="e.g. --since 24h")
    return value


def cmd_report(args: argparse.Namespace) -> int:
    since = parse_duration(args.since)
    if args.log:
        log = args.log
    else:
        config = load_config(args.config)
        if not config.log_file:
            raise InputError(
                "the sidecar logs to stderr (the journal), not to a file", source=config.source,
                field="[sidecar] log_file",
                fix="give --log FILE, e.g. from journalctl -u hadar-slurm -o cat > sidecar.log")
        if config.log_format != "json":
            raise InputError(
                f"the report reads JSON logs, this sidecar logs {config.log_format!r}",
                source=config.source, field="[sidecar] log_format", fix='set log_format = "json"')
        log = config.log_file
    report = load_report(log, since, time.time())
    path = write_report(report, args.out)
    n, done = len(report.epochs), len(report.finished)
    print(f"report: {path} ({n} epoch{'s' * (n != 1)}, {done} job{'s' * (done != 1)} "
          "finished)")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", metavar="CFG",
                     help="the sidecar's TOML config: its [sidecar] log_file is read")
    src.add_argument("--log", metavar="FILE", help="the sidecar's JSON log")
    p.add_argument("--since", default="24h", metavar="DURATION",
                   help="the window before now: 24h, 90m, 2d, 3600 (default: %(default)s)")
    p.add_argument("--out", default="report.png", metavar="FILE",
                   help="a .png (the plots) or .html (the plots and a summary table) "
                   "(default: %(default)s)")
    p.set_defaults(func=cmd_report)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``report`` to the main parser's subcommands."""
    p = subparsers.add_parser(
        "report", help="plots of the sidecar's last day (GPUs busy, queue, JCTs) from its log",
        description="GPUs busy per type and the queue length over time, and the CDF of the "
        "completion times of the jobs that finished, from the sidecar's JSON log (rotated "
        "files too), as a PNG or a self-contained HTML page with a summary table.")
    add_arguments(p)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hadar_slurm.cli.report``: the report command alone (errors as the main CLI
    prints them, exit status 2)."""
    parser = argparse.ArgumentParser(prog="hadar-slurm report")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_report(args)
    except InputError as exc:
        message = exc.one_line().replace("\r", " ").replace("\n", " ")
        print(f"hadar-slurm: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
