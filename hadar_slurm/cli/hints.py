"""``hadar-slurm hints``: check a job's hints as job_submit.lua will, and print the Lua catalog.

::

    hadar-slurm hints check "hadar: model=resnet50 bs=64 steps=40000" [--gpus N] [--json]
    hadar-slurm hints check - [--gpus N] [--json] < comment.txt
    hadar-slurm hints lua

``check`` prints the parsed hints on one line (``--json``: one JSON object); bad hints raise
:class:`~hadar_slurm.hints.HintError`, which the main CLI prints as ``hadar-slurm: error: ...``
with exit status 2.  ``-`` reads the comment from standard input (its bytes as they are, one
trailing newline dropped; at most a little more than the comment bound is read), for comments
an argv cannot hold (NUL bytes, more than 128 KiB).  No input makes ``check`` fail otherwise:
every value is bounded before it is converted (hadar_slurm/hints.py).  ``lua`` prints the
catalog block of slurm_conf/job_submit.lua.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from hadar_slurm.errors import InputError
from hadar_slurm.hints import (
    MAX_COMMENT_BYTES,
    MAX_GPUS,
    Hints,
    ModelCatalog,
    lua_catalog_block,
    parse_hints,
    quote,
    whole_number,
)

__all__ = ["format_hints", "register"]


def format_hints(hints: Hints) -> str:
    """One line: the canonical comment and the throughput table's job type."""
    return f"{hints.to_comment()}  job_type={hints.job_type!r}"


def _gpus(text: str) -> int:
    """ASCII digits (int() would take '\u0663', and 5,000 digits not at all), compared by their
    count before any conversion as job_submit.lua reads the job's GPU request: any count above
    MAX_GPUS is MAX_GPUS + 1, which parse_hints reports as "more than 9999"."""
    count = whole_number(text, MAX_GPUS)
    if count is None or count < 1:
        raise argparse.ArgumentTypeError(f"expected a GPU count >= 1, got '{quote(text)}'")
    return count


def _stdin_comment() -> str:
    """The comment from standard input: bytes as they are (decoded as argv is, with
    surrogateescape), one trailing newline dropped.  Only enough is read to know it is too
    long; what is cut does not matter, parse_hints refuses it."""
    data = sys.stdin.buffer.read(MAX_COMMENT_BYTES + 2)
    if data.endswith(b"\n"):
        data = data[:-1]
    return data.decode("utf-8", "surrogateescape")


def cmd_check(args: argparse.Namespace) -> int:
    if args.comment == "-" and sys.stdin.isatty():
        raise InputError("'-' reads the comment from standard input, which is a terminal",
                         field="COMMENT", fix="pipe the comment in, or give it as an argument")
    comment = _stdin_comment() if args.comment == "-" else args.comment
    hints = parse_hints(comment, ModelCatalog.default(), gpus=args.gpus, array=args.array)
    if args.json:
        data: dict[str, Any] = dataclasses.asdict(hints)
        data["preempt"] = hints.preempt_mode  # (the hint, or its default)
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
        "[sync=true|false] [weight=W] [fork=N] [preempt=MODE] [share=true|false] "
        "[study=NAME rule=asha|sh|hyperband|none rungs=N eta=N metric=NAME mode=max|min]'.")
    sub = hints.add_subparsers(dest="hints_command", required=True, metavar="{check,lua}")
    check = sub.add_parser("check", help="parse and check a comment as job_submit.lua will")
    check.add_argument("comment", help="the job's comment, e.g. 'hadar: model=a3c steps=1000'; "
                       "- reads it from standard input")
    check.add_argument("--gpus", type=_gpus, default=None,
                       help="the job's GPU count, checked against the model's GPU counts")
    check.add_argument("--array", action="store_true",
                       help="the job is a job array (sbatch --array), as a study must be")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(func=cmd_check)
    lua = sub.add_parser("lua", help="print the model catalog block of slurm_conf/job_submit.lua")
    lua.set_defaults(func=cmd_lua)
