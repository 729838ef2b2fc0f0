"""``hadar-slurm throughputs``: list, import and export the throughput store.

::

    hadar-slurm throughputs list [--db PATH | --config FILE] [--source S] [--json]
    hadar-slurm throughputs import FILE [--db PATH | --config FILE] [--source S]
    hadar-slurm throughputs export FILE [--db PATH | --config FILE] [--format json|csv|gavel]
    hadar-slurm throughputs recover [--db PATH | --config FILE]

The database (:func:`store_path`): ``--db``; else, with ``--config``, the sidecar's own store
(``[scheduler] throughput_db``, else ``<state_dir>/throughputs.db``); else
:func:`~hadar_slurm.rates.store.default_store_path` (``$HADAR_THROUGHPUT_DB``, else
``~/.local/state/hadar-slurm/throughputs.db``).  ``import`` creates the database where
needed; ``list`` and ``export`` want an existing one.  Problems are
:class:`~hadar_slurm.errors.InputError`, which the main CLI prints as one line (exit status 2);
a damaged database is one too (:class:`~hadar_slurm.rates.store.StoreDamagedError`), whose fix is
``recover``: the damaged file is moved to ``<name>.damaged-<UTC time>`` and a fresh store
rebuilt from the ``--config`` sidecar's throughput files (:mod:`hadar_slurm.rates.store_recovery`).
With ``--config`` it first takes that sidecar's state_dir lock, so it never moves the store of
a running sidecar.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

from hadar_slurm.errors import InputError
from hadar_slurm.rates.memory import MemoryLimits
from hadar_slurm.rates.store import (
    EXPORT_FORMATS,
    SOURCES,
    Entry,
    StoreDamagedError,
    ThroughputStore,
    default_store_path,
)
from hadar_slurm.rates.store_recovery import check_store, recover_store

__all__ = ["DB_HELP", "format_entries", "register", "store_path"]

_HEADER = ("job type", "GPUs", "GPU type", "steps/s", "source", "samples", "updated (UTC)")


def format_entries(entries: Sequence[Entry]) -> str:
    """A plain-text table, one entry per line, columns aligned."""
    rows = [_HEADER] + [
        (e.job_type, str(e.scale_factor), e.gpu_type, f"{e.rate:.4g}", e.source, str(e.samples),
         time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.updated)))
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    right = {1, 3, 5}
    lines = [
        "  ".join(c.rjust(w) if i in right else c.ljust(w)
                  for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
        for r in rows
    ]
    return "\n".join(lines) + "\n"


#: The help of ``--db`` and ``--config`` wherever the store is opened (here and ``profile``).
DB_HELP = ("the store's database (default: the --config sidecar's store, else "
           "$HADAR_THROUGHPUT_DB, else ~/.local/state/hadar-slurm/throughputs.db)")
CONFIG_HELP = ("the sidecar's TOML config: use its throughput store ([scheduler] throughput_db, "
               "else <state_dir>/throughputs.db)")


def store_path(db: str | None, config: str | None) -> Path:
    """``db`` if given; else the store of the sidecar config ``config``; else
    :func:`~hadar_slurm.rates.store.default_store_path`."""
    if db is not None:
        return Path(db)
    if config is not None:
        from hadar_slurm.sidecar.config import load_config
        return load_config(config).store_path
    return default_store_path()


def _db(args: argparse.Namespace) -> Path:
    return store_path(args.db, args.config)


def _existing(args: argparse.Namespace) -> ThroughputStore:
    path = _db(args)
    if not path.exists():
        raise InputError("no such throughput database", source=str(path), field="--db",
                         fix="import a table first (hadar-slurm throughputs import FILE), or "
                         "give --db PATH or the sidecar's --config FILE")
    return ThroughputStore(path)


def cmd_list(args: argparse.Namespace) -> int:
    with _existing(args) as store:
        entries = store.entries(args.source)
    if args.json:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=1))
    elif entries:
        print(format_entries(entries), end="")
    else:
        print("no entries" + (f" of source {args.source}" if args.source else ""))
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    """The footprints of job types and the memory of GPU types the store holds (issue #16:
    two jobs share a GPU only where both fit)."""
    with _existing(args) as store:
        feet, mems = store.footprints(), store.gpu_memory()
    limits = MemoryLimits(feet, mems)
    if args.json:
        print(json.dumps({"footprints": [{"job_type": j, "scale_factor": sf, "gpu_type": g,
                                          "mib": m} for (j, sf), per in feet.items()
                                         for g, m in per.items()],
                          "gpu_memory": mems}, indent=1))
        return 0
    if not feet and not mems:
        print("no footprints or GPU memory stored (hadar-slurm profile measures them on a GPU; "
              "running jobs on CUDA report theirs)")
        return 0
    for (job, sf), per in feet.items():
        where = ", ".join(f"{m:.0f} MiB on {g}" for g, m in sorted(per.items()))
        print(f"{job} x{sf}: {limits.job_mib(job, sf):.0f} MiB per GPU ({where})")
    for gpu, mib in mems.items():
        print(f"GPU {gpu}: {mib:.0f} MiB (measured)")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    path = _db(args)
    with ThroughputStore(path) as store:
        written = store.import_file(args.file, source=args.source)
        total = len(store.entries())
    print(f"{written} entries written from {args.file} to {path} ({total} entries in all)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    with _existing(args) as store:
        written = store.export(args.file, fmt=args.format)
    print(f"{written} entries written to {args.file} ({args.format})")
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    files: tuple[str, ...] = ()
    lock = None
    path = _db(args)
    if args.config is not None:
        from hadar_slurm.sidecar.config import load_config
        from hadar_slurm.sidecar.statedir import StateDirLock

        config = load_config(args.config)
        files = config.throughputs
        lock = StateDirLock(config.require_state_dir(), source=config.source)
        lock.acquire()  # refused while that sidecar runs
    try:
        if not path.exists():
            raise InputError("no such throughput database", source=str(path), field="--db",
                             fix="give --db PATH or the sidecar's --config FILE")
        try:
            check_store(path)
        except StoreDamagedError as exc:
            done = recover_store(path, files, error=exc.error)
            print(f"{path} was damaged ({exc.error}); kept it as {done.kept}; the fresh store "
                  f"has {done.imported} entries from {len(files)} throughput file(s); learned "
                  "rates are re-learned")
            return 0
        print(f"{path} is sound: nothing to do")
        return 0
    finally:
        if lock is not None:
            lock.release()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``throughputs list|import|export`` to the main parser's subcommands."""
    top = subparsers.add_parser(
        "throughputs", help="list, import and export the throughput store",
        description="The throughput store: measured, learned, imported and estimated rates "
        "(steps/s of the whole job) per job type, GPU count and GPU type.")
    sub = top.add_subparsers(dest="throughputs_command", required=True,
                             metavar="{list,memory,import,export,recover}")
    sources = ", ".join(SOURCES)

    lst = sub.add_parser("list", help="print the stored throughputs")
    lst.add_argument("--db", metavar="PATH", help=DB_HELP)
    lst.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    lst.add_argument("--source", metavar="S", help=f"only entries of this source ({sources})")
    lst.add_argument("--json", action="store_true", help="print a JSON list of entries")
    lst.set_defaults(func=cmd_list)

    mem = sub.add_parser("memory", help="print the stored memory footprints and GPU memory")
    mem.add_argument("--db", metavar="PATH", help=DB_HELP)
    mem.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    mem.add_argument("--json", action="store_true", help="print JSON")
    mem.set_defaults(func=cmd_memory)

    imp = sub.add_parser(
        "import", help="import Gavel's JSON, our CSV or our JSON export",
        description="Import a throughput file. Measured and learned values are kept over "
        "imported ones; an estimate is stored only where no real value exists.")
    imp.add_argument("file", metavar="FILE", help="a .json (Gavel's or our export) or .csv file")
    imp.add_argument("--db", metavar="PATH", help=DB_HELP)
    imp.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    imp.add_argument("--source", metavar="S", default=None,
                     help=f"store the rates as this source ({sources}; default: imported, or "
                     "each entry's own for our export)")
    imp.set_defaults(func=cmd_import)

    exp = sub.add_parser("export", help="write the stored throughputs to a file")
    exp.add_argument("file", metavar="FILE", help="the file to write (replaced)")
    exp.add_argument("--db", metavar="PATH", help=DB_HELP)
    exp.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    exp.add_argument("--format", default="json", metavar="|".join(EXPORT_FORMATS),
                     help="json: ours, every field (default); csv: job_type,scale_factor,"
                     "gpu_type,steps_per_second; gavel: Gavel's simulation_throughputs.json")
    exp.set_defaults(func=cmd_export)

    rec = sub.add_parser(
        "recover", help="move a damaged store aside and rebuild a fresh one",
        description="When the store is damaged (database disk image is malformed, not a "
        "database), move it to <name>.damaged-<UTC time> and create a fresh one with the "
        "--config sidecar's throughput files imported; learned rates are lost and re-learned. "
        "A sound store is left alone. With --config, refused while that sidecar runs.")
    rec.add_argument("--db", metavar="PATH", help=DB_HELP)
    rec.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    rec.set_defaults(func=cmd_recover)
