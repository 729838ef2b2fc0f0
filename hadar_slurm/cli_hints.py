"""``hadar-slurm hints``: check a job's hints as job_submit.lua will, and print the Lua catalog.

::

    hadar-slurm hints check "hadar: model=resnet50 bs=64 steps=40000" [--gpus N] [--json]
    hadar-slurm hints lua

``check`` prints the parsed hints on one line (``--json``: one JSON object); bad hints raise
:class:`~hadar_slurm.hints.HintError`, which the main CLI prints as ``hadar-slurm: error: ...``
with exit status 2.  ``lua`` prints the catalog block of slurm_conf/job_submit.lua.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from hadar_slurm.hints import Hints, ModelCatalog, lua_catalog_block, parse_hints

__all__ = ["format_hints", "register"]


def format_hints(hints: Hints) -> str:
    """One line: the canonical comment and the throughput table's job type."""
    return f"{hints.to_comment()}  job_type={hints.job_type!r}"


def _gpus(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a GPU count >= 1, got {text!r}")
    return value


def cmd_check(args: argparse.Namespace) -> int:
    hints = parse_hints(args.comment, ModelCatalog.default(), gpus=args.gpus)
    if args.json:
        data: dict[str, Any] = dataclasses.asdict(hints)
        if args.gpus is not None:
            data["gpus"] = args.gpus
        print(json.dumps(data, sort_keys=True))
    else:
        print(format_hints(hints))
    return 0


def cmd_lua(args: argparse.Namespace) -> int:
    print(lua_catalog_block(ModelCatalog.default()), end="")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hints check`` and ``hints lua`` to the main parser's subcommands."""
    hints = subparsers.add_parser(
        "hints", help="check job hints (the hadar: comment); print the job_submit.lua catalog",
        description="Job hints: sbatch --comment='hadar: model=NAME bs=N steps=N "
        "[sync=true|false] [weight=W]'.")
    sub = hints.add_subparsers(dest="hints_command", required=True, metavar="{check,lua}")
    check = sub.add_parser("check", help="parse and check a comment as job_submit.lua will")
    check.add_argument("comment", help="the job's comment, e.g. 'hadar: model=a3c steps=1000'")
    check.add_argument("--gpus", type=_gpus, default=None,
                       help="the job's GPU count, checked against the model's GPU counts")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(func=cmd_check)
    lua = sub.add_parser("lua", help="print the model catalog block of slurm_conf/job_submit.lua")
    lua.set_defaults(func=cmd_lua)
