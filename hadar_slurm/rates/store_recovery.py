"""Recovering a damaged throughput store: keep the damaged file aside, start a fresh one.

A store whose file is damaged (SQLite's "database disk image is malformed", "file is not a
database": a truncated file, garbage bytes, a disk fault) cannot be repaired in place, and what
it held is re-measurable: the learned rates are re-learned from the jobs that run, the imported
tables are imported again.  :func:`recover_store` moves the file (and its ``-wal`` and ``-shm``)
to ``<name>.damaged-<UTC time>`` (kept for a person to look at, or to salvage with the
``sqlite3`` shell's ``.recover``), creates a fresh store at the same path and imports the given
throughput files into it.

Who calls it: the sidecar at start (:func:`hadar_slurm.sidecar.controller.open_store`, under its
state_dir lock), and an admin with ``hadar-slurm throughputs recover``.  Nothing else may use the
store while it runs (a ``profile`` writing to it would keep writing to the kept file).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hadar_slurm.errors import InputError
from hadar_slurm.rates.store import StoreDamagedError, ThroughputStore

__all__ = ["DAMAGED_SUFFIX", "Recovered", "check_store", "recover_if_damaged", "recover_store"]

#: The kept file is ``<name>.damaged-<UTC time>`` next to the store.
DAMAGED_SUFFIX = ".damaged-"
#: SQLite's companion files of a WAL database, moved with it.
COMPANIONS = ("-wal", "-shm")


@dataclass(frozen=True)
class Recovered:
    """What :func:`recover_store` did."""

    path: Path  # the fresh store
    kept: Path  # where the damaged file went
    error: str  # what was wrong with it
    imported: int  # entries written to the fresh store from the files
    files: tuple[str, ...]  # the throughput files imported


def check_store(path: str | os.PathLike[str]) -> None:
    """Open the store at ``path`` and read all of it once; raises
    :class:`~hadar_slurm.rates.store.StoreDamagedError` when it is damaged (and creates an empty
    store where there is none)."""
    with ThroughputStore(path) as store:
        store.check()


def _kept_path(path: Path, now: float) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    kept = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}")
    n = 1
    while any(Path(f"{kept}{c}").exists() for c in ("", *COMPANIONS)):
        kept = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}.{n}")
        n += 1
    return kept


def recover_store(path: str | os.PathLike[str], files: Sequence[str] = (), *,
                  error: str = "", now: float | None = None) -> Recovered:
    """Move the damaged store at ``path`` aside and rebuild a fresh one from ``files`` (the
    config's throughput tables, imported as ``imported``).  ``error``: what was found wrong
    (for the record).  Raises :class:`~hadar_slurm.errors.InputError` when the file cannot be
    moved or a file cannot be imported."""
    store_path = Path(path)
    kept = _kept_path(store_path, time.time() if now is None else now)
    try:
        for suffix in ("", *COMPANIONS):
            src = Path(f"{store_path}{suffix}")
            if src.exists():
                os.replace(src, f"{kept}{suffix}")
    except OSError as exc:
        raise InputError(f"cannot move the damaged throughput store aside: {exc.strerror}",
                         source=str(store_path), field="[scheduler] throughput_db",
                         fix="make its directory writable for the sidecar's user, or move the "
                         "file away by hand") from None
    imported = 0
    with ThroughputStore(store_path) as store:
        for f in files:
            imported += store.import_file(f)
    return Recovered(store_path, kept, error, imported, tuple(files))


def recover_if_damaged(path: str | os.PathLike[str],
                       files: Sequence[str] = ()) -> Recovered | None:
    """:func:`recover_store` when the store at ``path`` is damaged; None when it is sound."""
    try:
        check_store(path)
    except StoreDamagedError as exc:
        return recover_store(path, files, error=exc.error)
    return None
