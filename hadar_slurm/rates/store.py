"""The throughput store: measured, learned, imported and estimated rates in one SQLite file.

The sidecar, the simulator and the CLI share one :class:`ThroughputStore`, keyed like a
:class:`~hadar_slurm.rates.table.ThroughputTable` by ``(job_type, scale_factor, gpu_type)`` with
a whole-job rate in steps/s (Gavel's convention).  Each entry also says where its value came from
(``source``), how many observations back it (``samples``) and when it was last seen (``updated``,
unix time).

**Sources and precedence.**  Every write carries a source, ranked::

    measured = learned  (real, current)   rank 2
    imported            (real, older)     rank 1
    estimated           (not real)        rank 0

A write replaces the stored entry of its key unless it ranks *lower*, or it ranks the same and is
*older* (its ``when`` is before the stored ``updated``).  So the most recent measured or learned
value wins; an imported table fills in what was never measured and replaces older imports, but
never a measurement; an estimate is stored only where no real value exists (it does replace an
older estimate).  Rates of 0 in an imported table ("does not run there", Gavel's OOM entries) are
not stored: a missing entry already means that (:meth:`ThroughputTable.rate` is 0.0).

**Learning.**  :meth:`ThroughputStore.learn` keeps the last :data:`LEARN_WINDOW` observations per
key, each with the job it came from; by default the learned rate is their median (mean of the
two middle ones for an even count), so fewer than half of the window being outliers or slow
first iterations cannot drag it, and a job whose rate really changed is followed within half a
window.  The caller may decide otherwise (``decide``): the sidecar takes one vote per job and
waits for a quorum of jobs, bounded by a prior (:mod:`hadar_slurm.rates.learn`); until it
decides, observations wait in the window and the entry keeps its value.  A measured (or
imported-from-our-format learned) value is the window's first row (a seed); an imported or
estimated value is replaced, not averaged in.  A measured or imported value that a learned rate
replaces is kept as the key's *anchor* (:meth:`ThroughputStore.anchors`), what learning stays
bounded by.  ``samples`` of a learned entry counts every observation folded in since it was
seeded (plus the seed's samples), not just the window.  A database from before per-job
observations gets the new columns on open and loses its windows (they name no job).

**Concurrency.**  The database is in WAL mode (readers never block the writer) with a busy
timeout; every write is one short ``BEGIN IMMEDIATE`` transaction that reads, decides and writes,
so several processes may record and learn at once without losing an update.  Open one store per
process (a store is refused in a process it was not opened in); within a process, one store may
be shared by threads.  WAL needs the file on a local file system (not NFS).

Commits use ``synchronous=NORMAL``: a committed write survives a crash of the process, but the
last writes before a power loss may be lost (the data is re-measurable).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from hadar_slurm.errors import InputError
from hadar_slurm.model import GpuType, normalize_gpu_type
from hadar_slurm.rates.memory import MemoryLimits, check_gpu_memory
from hadar_slurm.rates.table import CSV_HEADER, ThroughputTable, parse_csv, parse_gavel_json

__all__ = [
    "EXPORT_FORMATS",
    "FILE_FORMAT",
    "FILE_VERSION",
    "LEARN_WINDOW",
    "SOURCES",
    "Decide",
    "Entry",
    "ThroughputStore",
    "WindowRow",
    "as_table",
    "default_store_path",
    "median_of_window",
]

SOURCES: tuple[str, ...] = ("imported", "measured", "learned", "estimated")
RANK: Mapping[str, int] = {"measured": 2, "learned": 2, "imported": 1, "estimated": 0}
LEARN_WINDOW = 32
"""How many recent observations per key :meth:`ThroughputStore.learn` keeps."""

EXPORT_FORMATS: tuple[str, ...] = ("json", "csv", "gavel")
FILE_FORMAT = "hadar-slurm throughputs"
FILE_VERSION = 1
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0

ENV_DB = "HADAR_THROUGHPUT_DB"

Key = tuple[str, int, GpuType]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entry (
    job_type     TEXT    NOT NULL,
    scale_factor INTEGER NOT NULL,
    gpu_type     TEXT    NOT NULL,
    rate         REAL    NOT NULL,
    source       TEXT    NOT NULL,
    samples      INTEGER NOT NULL,
    updated      REAL    NOT NULL,
    PRIMARY KEY (job_type, scale_factor, gpu_type)
);
CREATE TABLE IF NOT EXISTS observation (
    job_type     TEXT    NOT NULL,
    scale_factor INTEGER NOT NULL,
    gpu_type     TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    rate         REAL    NOT NULL,
    seen         REAL    NOT NULL,
    job          INTEGER,
    seed         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_type, scale_factor, gpu_type, seq)
);
CREATE TABLE IF NOT EXISTS footprint (
    job_type     TEXT    NOT NULL,
    scale_factor INTEGER NOT NULL,
    gpu_type     TEXT    NOT NULL,
    mib          REAL    NOT NULL,
    source       TEXT    NOT NULL,
    updated      REAL    NOT NULL,
    PRIMARY KEY (job_type, scale_factor, gpu_type)
);
CREATE TABLE IF NOT EXISTS pair_observation (
    job_type     TEXT    NOT NULL,
    mate_type    TEXT    NOT NULL,
    scale_factor INTEGER NOT NULL,
    gpu_type     TEXT    NOT NULL,
    job          INTEGER NOT NULL,
    rate         REAL    NOT NULL,
    seen         REAL    NOT NULL,
    PRIMARY KEY (job_type, mate_type, scale_factor, gpu_type, job)
);
CREATE TABLE IF NOT EXISTS gpu_memory (
    gpu_type     TEXT    NOT NULL PRIMARY KEY,
    mib          REAL    NOT NULL,
    updated      REAL    NOT NULL
);
CREATE TABLE IF NOT EXISTS anchor (
    job_type     TEXT    NOT NULL,
    scale_factor INTEGER NOT NULL,
    gpu_type     TEXT    NOT NULL,
    rate         REAL    NOT NULL,
    source       TEXT    NOT NULL,
    PRIMARY KEY (job_type, scale_factor, gpu_type)
);
"""

#: Columns a database written before per-job observations lacks (added on open; its windows,
#: which say nothing of the job they came from, are dropped then).
_OBSERVATION_COLUMNS = (("job", "INTEGER"), ("seed", "INTEGER NOT NULL DEFAULT 0"))

_COLUMNS = "job_type, scale_factor, gpu_type, rate, source, samples, updated"
_ENTRY_FIELDS = ("job_type", "scale_factor", "gpu_type", "rate", "source", "samples", "updated")


def as_table(entries: Iterable[Entry], source: str,
             memory: MemoryLimits | None = None) -> ThroughputTable:
    """The rates of ``entries`` as a :class:`ThroughputTable` named ``source``."""
    rates: dict[tuple[str, int], dict[GpuType, float]] = {}
    for e in entries:
        rates.setdefault((e.job_type, e.scale_factor), {})[e.gpu_type] = e.rate
    return ThroughputTable(rates, source, memory=memory if memory is not None else MemoryLimits())


def default_store_path() -> Path:
    """``$HADAR_THROUGHPUT_DB`` if set, else ``~/.local/state/hadar-slurm/throughputs.db``."""
    env = os.environ.get(ENV_DB)
    if env:
        return Path(env)
    return Path.home() / ".local" / "state" / "hadar-slurm" / "throughputs.db"


#: SQLite's primary result codes that mean the file itself is damaged (not a passing problem
#: such as a lock): SQLITE_CORRUPT ("database disk image is malformed") and SQLITE_NOTADB ("file
#: is not a database": garbage bytes, a file that was never a database).
_DAMAGE_CODES = (11, 26)


class StoreDamagedError(InputError):
    """The store's file is damaged (corrupt, truncated, not a database): one line naming
    ``[scheduler] throughput_db``, the path and the way out (:mod:`hadar_slurm.rates.store_recovery`
    moves it aside and rebuilds a fresh one; the sidecar does that at start)."""

    def __init__(self, path: str, error: str) -> None:
        self.path = path
        self.error = " ".join(error.split())
        super().__init__(
            f"the throughput store is damaged ({self.error})", source=path,
            field="[scheduler] throughput_db",
            fix=f"run `hadar-slurm throughputs recover --db {path}` (or restart the sidecar, "
            "which recovers it at start): the damaged file is kept aside and a fresh store "
            "rebuilt from the imported tables; learned rates are re-learned")


def is_damage(exc: BaseException) -> bool:
    """Whether ``exc`` (an :class:`sqlite3.DatabaseError`) says the database file is damaged."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in _DAMAGE_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


@dataclass(frozen=True)
class Entry:
    """One stored throughput and where it came from."""

    job_type: str
    """e.g. ``ResNet-50 (batch size 64)``"""
    scale_factor: int
    """GPUs of the job"""
    gpu_type: GpuType
    """normalized with :func:`hadar_slurm.model.normalize_gpu_type`"""
    rate: float
    """whole-job steps/s (Gavel's convention, as :class:`ThroughputTable`)"""
    source: str
    """one of :data:`SOURCES`"""
    samples: int
    """how many observations back this value (0 for an estimate)"""
    updated: float
    """unix time last seen"""

    @property
    def key(self) -> Key:
        return (self.job_type, self.scale_factor, self.gpu_type)


# -- validation ------------------------------------------------------------------------------


def _check_job_type(value: object, where: str, field: str = "job_type") -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"job type must be a non-empty string, got {value!r}", source=where,
                         field=field, fix="give the model and batch size, e.g. "
                         "'ResNet-50 (batch size 64)'")
    if value != value.strip() or "\n" in value or "\r" in value:
        raise InputError(f"job type {value!r} has surrounding spaces or a line break",
                         source=where, field=field, fix="give it on one line, stripped")
    return value


def _check_scale_factor(value: object, where: str, field: str = "scale_factor") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"scale factor must be a whole number >= 1, got {value!r}",
                         source=where, field=field, fix="give the job's GPU count")
    return value


def _check_gpu_type(value: object, where: str, field: str = "gpu_type") -> GpuType:
    gpu = normalize_gpu_type(value) if isinstance(value, str) else ""
    if not gpu or "\n" in gpu or "\r" in gpu:
        raise InputError(f"GPU type must be a non-empty name, got {value!r}", source=where,
                         field=field, fix="give Slurm's GPU type name, e.g. v100")
    return gpu


def _check_rate(value: object, where: str, field: str = "rate") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"rate must be a number of steps per second, got {value!r}",
                         source=where, field=field, fix="give a finite number > 0")
    rate = float(value)
    if not math.isfinite(rate) or rate <= 0:
        raise InputError(f"rate must be finite and > 0, got {value!r}", source=where,
                         field=field, fix="give a finite number > 0 (leave out a GPU type a job "
                         "cannot run on)")
    return rate


def _check_source(value: object, where: str, field: str = "source") -> str:
    if value not in SOURCES:
        raise InputError(f"unknown source {value!r}", source=where, field=field,
                         fix="use one of " + ", ".join(SOURCES))
    assert isinstance(value, str)
    return value


def _check_when(value: object, where: str, field: str = "when") -> float:
    """``when``: a unix time, or None for now."""
    return time.time() if value is None else _check_time(value, where, field)


def _check_time(value: object, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(float(value)):
        raise InputError(f"time must be a finite unix time, got {value!r}", source=where,
                         field=field, fix="give seconds since the epoch, e.g. time.time()")
    return float(value)


def _check_count(value: object, where: str, field: str, what: str = "samples") -> int:
    """A whole number >= 0 (a count of samples, a job id)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{what} must be a whole number >= 0, got {value!r}", source=where,
                         field=field)
    return value


def _row_entry(row: Sequence[Any]) -> Entry:
    return Entry(str(row[0]), int(row[1]), str(row[2]), float(row[3]), str(row[4]),
                 int(row[5]), float(row[6]))


def _migrate_observations(cur: sqlite3.Cursor) -> None:
    """Give a database from before per-job observations the ``job`` and ``seed`` columns.  Its
    windows are dropped: they do not say which job each observation came from, and nothing
    checked them (the entries are kept; :class:`~hadar_slurm.rates.learn.Knowledge` checks a
    learned entry against its prior before it uses it).  A database opened by an older
    hadar-slurm afterwards still works (it writes observations without a job, which learning
    with a quorum of jobs ignores)."""
    have = {str(row[1]) for row in cur.execute("PRAGMA table_info(observation)")}
    missing = [(name, decl) for name, decl in _OBSERVATION_COLUMNS if name not in have]
    if missing:
        cur.execute("DELETE FROM observation")
    for name, decl in missing:
        cur.execute(f"ALTER TABLE observation ADD COLUMN {name} {decl}")


class WindowRow(NamedTuple):
    """One observation in a key's learning window (:meth:`ThroughputStore.learn`)."""

    rate: float
    #: the job it came from; None when the caller did not say (or for a seed)
    job: int | None
    #: the stored measured or learned value the window started from, not an observation
    seed: bool


#: What :meth:`ThroughputStore.learn` asks to decide a key's learned rate: given the window
#: (oldest first, the new observation last) and the stored entry, the rate to store, or None to
#: leave the entry as it is (the observation stays in the window).
Decide = Callable[[Sequence[WindowRow], "Entry | None"], "float | None"]


def median_of_window(window: Sequence[WindowRow], old: Entry | None) -> float:
    """The default decision: the median of the whole window, seed included."""
    return float(statistics.median(r.rate for r in window))


def _replaces(new: Entry, old: Entry | None) -> bool:
    """The precedence rule (module docstring): does ``new`` replace the stored ``old``?"""
    if old is None:
        return True
    if RANK[new.source] != RANK[old.source]:
        return RANK[new.source] > RANK[old.source]
    return new.updated >= old.updated


# -- the store -------------------------------------------------------------------------------


class ThroughputStore:
    """An embedded SQLite store of throughputs, safe with several writer processes.

    Opening creates the file, its directory and the schema where needed.  Every method is one
    transaction: a write is atomic and either fully applied or not at all; reads see the last
    committed state.  Bad arguments raise :class:`~hadar_slurm.errors.InputError` naming the
    field.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._where = str(self.path)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the database's directory: {exc.strerror}",
                             source=self._where, field="db",
                             fix="give a path in a writable directory") from None
        try:
            self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S,
                                         isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the throughput database: {exc}", source=self._where,
                             field="db", fix="give a path in a writable directory") from None
        try:
            self._setup()
        except BaseException:
            self._conn.close()
            raise

    def _setup(self) -> None:
        conn = self._conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            deadline = time.monotonic() + BUSY_TIMEOUT_S
            while True:  # switching to WAL needs a moment alone with a new file
                try:
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            if str(mode).lower() != "wal":
                raise InputError(f"cannot use WAL mode (journal mode is {mode!r})",
                                 source=self._where, field="db",
                                 fix="put the database on a local file system")
            conn.execute("PRAGMA synchronous = NORMAL")
            with self._write() as cur:
                version = int(cur.execute("PRAGMA user_version").fetchone()[0])
                if version > SCHEMA_VERSION:
                    raise InputError(
                        f"database schema version {version} is newer than this hadar-slurm's "
                        f"({SCHEMA_VERSION})", source=self._where, field="db",
                        fix="upgrade hadar-slurm or use another --db")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        cur.execute(statement)
                _migrate_observations(cur)
                if version < SCHEMA_VERSION:
                    cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            if is_damage(exc):
                raise StoreDamagedError(self._where, str(exc)) from None
            raise InputError(f"not a usable throughput database: {exc}", source=self._where,
                             field="db", fix="give a database written by hadar-slurm, or a new "
                             "path") from None

    # -- plumbing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ThroughputStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise RuntimeError(f"ThroughputStore({self._where!r}) was opened in process "
                               f"{self._pid}; open a new one in process {os.getpid()}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on error.
        A damaged file raises :class:`StoreDamagedError`."""
        self._check_process()
        with self._lock:
            try:
                cur = self._conn.cursor()
                cur.execute("BEGIN IMMEDIATE")
                try:
                    yield cur
                except BaseException:
                    try:
                        cur.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # a damaged file may refuse even that; the first error tells
                    raise
                cur.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                if is_damage(exc):
                    raise StoreDamagedError(self._where, str(exc)) from None
                raise

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self._check_process()
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                if is_damage(exc):
                    raise StoreDamagedError(self._where, str(exc)) from None
                raise

    def check(self) -> None:
        """Read the whole file once (SQLite's ``quick_check`` and every table): raises
        :class:`StoreDamagedError` when it is damaged.  Cheap for a store's size."""
        rows = self._read("PRAGMA quick_check")
        problems = [str(r[0]) for r in rows if str(r[0]).lower() != "ok"]
        if problems:
            raise StoreDamagedError(self._where, "; ".join(problems[:3]))
        for (table,) in self._read("SELECT name FROM sqlite_master WHERE type = 'table'"):
            self._read(f'SELECT * FROM "{table}"')

    def _key(self, job_type: object, scale_factor: object, gpu_type: object) -> Key:
        return (_check_job_type(job_type, self._where), _check_scale_factor(scale_factor,
                self._where), _check_gpu_type(gpu_type, self._where))

    @staticmethod
    def _select(cur: sqlite3.Cursor, key: Key) -> Entry | None:
        row = cur.execute(f"SELECT {_COLUMNS} FROM entry WHERE job_type = ? AND "
                          "scale_factor = ? AND gpu_type = ?", key).fetchone()
        return None if row is None else _row_entry(row)

    @classmethod
    def _put(cls, cur: sqlite3.Cursor, new: Entry) -> Entry | None:
        """Write ``new`` if the precedence rule lets it; returns what was written."""
        if not _replaces(new, cls._select(cur, new.key)):
            return None
        cur.execute(f"INSERT OR REPLACE INTO entry ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (*new.key, new.rate, new.source, new.samples, new.updated))
        if RANK[new.source] == RANK["measured"]:
            # a new measurement: learning starts again from it.  An import or estimate leaves
            # the observations that wait for a quorum (learn) where they are
            cur.execute("DELETE FROM observation WHERE job_type = ? AND scale_factor = ? AND "
                        "gpu_type = ?", new.key)
        return new

    # -- writes ------------------------------------------------------------------------------

    def record(self, job_type: str, scale_factor: int, gpu_type: str, rate: float, *,
               source: str = "measured", when: float | None = None) -> Entry:
        """Set the rate of a key as ``source`` says (one observation), by the precedence rule.

        With the default source (``measured``) it replaces any older value, an estimate or an
        imported value; it does not replace a measured or learned value seen after ``when``.
        Returns the entry now stored (the existing one where the write did not win).
        """
        key = self._key(job_type, scale_factor, gpu_type)
        value = _check_rate(rate, self._where)
        src = _check_source(source, self._where)
        at = _check_when(when, self._where)
        new = Entry(*key, value, src, 0 if src == "estimated" else 1, at)
        with self._write() as cur:
            written = self._put(cur, new)
            if written is not None:
                return written
            stored = self._select(cur, key)
        assert stored is not None
        return stored

    def record_footprint(self, job_type: str, scale_factor: int, gpu_type: str, mib: float, *,
                         source: str = "measured", when: float | None = None) -> float:
        """Set the memory one worker of ``(job_type, scale_factor)`` held on one GPU of
        ``gpu_type``, in MiB (:mod:`hadar_slurm.rates.memory`).  A ``measured`` value (a
        ``profile`` run, done on purpose) replaces what was stored; a ``learned`` one (a running
        job's report) only raises it: a pair that fit once must fit every time.  Returns the
        footprint now stored."""
        key = self._key(job_type, scale_factor, gpu_type)
        value = check_gpu_memory(mib, self._where, "mib")
        src = _check_source(source, self._where)
        if src not in ("measured", "learned"):
            raise InputError(f"a footprint is measured or learned, not {src}",
                             source=self._where, field="source", fix="use measured or learned")
        at = _check_when(when, self._where)
        with self._write() as cur:
            row = cur.execute("SELECT mib FROM footprint WHERE job_type = ? AND scale_factor = ? "
                              "AND gpu_type = ?", key).fetchone()
            if row is not None and src == "learned" and float(row[0]) >= value:
                return float(row[0])
            cur.execute("INSERT OR REPLACE INTO footprint VALUES (?, ?, ?, ?, ?, ?)",
                        (*key, value, src, at))
        return value

    def learn_pair(self, job_type: str, mate_type: str, scale_factor: int, gpu_type: str,
                   rate: float, *, job: int, when: float | None = None) -> int:
        """Fold a co-located rate into the store (issue #16): whole-job steps/s of
        ``job_type`` while it shared ``scale_factor`` GPUs of ``gpu_type`` with a job of
        ``mate_type``, seen in a round of ``job``.  Each job has one vote (its latest round);
        the :data:`LEARN_WINDOW` latest jobs' are kept.  Returns how many votes the key has
        (what they make is :class:`~hadar_slurm.rates.learn.Knowledge`'s to decide)."""
        key = self._key(job_type, scale_factor, gpu_type)
        mate = _check_job_type(mate_type, self._where, "mate_type")
        value = _check_rate(rate, self._where)
        at = _check_when(when, self._where)
        pair = (key[0], mate, key[1], key[2])
        where = "job_type = ? AND mate_type = ? AND scale_factor = ? AND gpu_type = ?"
        with self._write() as cur:
            cur.execute("INSERT OR REPLACE INTO pair_observation VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (*pair, int(job), value, at))
            jobs = [int(j) for (j,) in cur.execute(
                f"SELECT job FROM pair_observation WHERE {where} ORDER BY seen DESC",
                pair).fetchall()]
            for old_job in jobs[LEARN_WINDOW:]:
                cur.execute(f"DELETE FROM pair_observation WHERE {where} AND job = ?",
                            (*pair, old_job))
        return min(len(jobs), LEARN_WINDOW)

    def pair_votes(self) -> dict[tuple[str, str, int], dict[GpuType, list[float]]]:
        """``(job_type, mate_type, scale_factor) -> {gpu_type: [one rate per job]}`` of every
        co-located rate learned (:meth:`learn_pair`)."""
        rows = self._read("SELECT job_type, mate_type, scale_factor, gpu_type, rate FROM "
                          "pair_observation ORDER BY job_type, mate_type, scale_factor, "
                          "gpu_type, job")
        out: dict[tuple[str, str, int], dict[GpuType, list[float]]] = {}
        for j, m, sf, g, r in rows:
            out.setdefault((str(j), str(m), int(sf)), {}).setdefault(str(g), []).append(
                float(r))
        return out

    def record_gpu_memory(self, gpu_type: str, mib: float, *, when: float | None = None
                          ) -> float:
        """Set the memory of one GPU of ``gpu_type`` in MiB (NVML's total, from ``profile``)."""
        gpu = _check_gpu_type(gpu_type, self._where)
        value = check_gpu_memory(mib, self._where, "mib")
        at = _check_when(when, self._where)
        with self._write() as cur:
            cur.execute("INSERT OR REPLACE INTO gpu_memory VALUES (?, ?, ?)", (gpu, value, at))
        return value

    def learn(self, job_type: str, scale_factor: int, gpu_type: str, rate: float, *,
              when: float | None = None, job: int | None = None,
              decide: Decide | None = None) -> Entry | None:
        """Fold one observed rate of a running job into the key's learned value.

        The key keeps its last :data:`LEARN_WINDOW` observations (each with the ``job`` it came
        from, when given).  ``decide`` (default :func:`median_of_window`: their median, so
        outliers and slow first iterations, fewer than half of the window, do not move it)
        says from the window what the learned rate is now, or None: not yet (the sidecar's
        :class:`~hadar_slurm.rates.learn.Knowledge` waits for a quorum of jobs and bounds the
        rate by a prior); the entry is then left as it is and the observation waits in the
        window.  A stored measured or learned value is the window's first row (a *seed*, not
        an observation) when the window is empty; an imported or estimated value is replaced
        outright.  When the learned rate replaces a measured or imported value, that value is
        kept as the key's anchor (:meth:`anchors`).  A written entry's source is ``learned``,
        its ``samples`` the stored samples plus the observations since (one more per
        observation once learned) and ``updated`` the latest of ``when`` and the stored time.
        Returns the entry now stored (None where there is none).
        """
        key = self._key(job_type, scale_factor, gpu_type)
        value = _check_rate(rate, self._where)
        at = _check_when(when, self._where)
        if job is not None and (isinstance(job, bool) or not isinstance(job, int)):
            raise InputError(f"job must be a Slurm job id, got {job!r}", source=self._where,
                             field="job", fix="give the job's id (an int) or None")
        where_key = "job_type = ? AND scale_factor = ? AND gpu_type = ?"
        with self._write() as cur:
            old = self._select(cur, key)
            live = old is not None and old.source in ("measured", "learned")
            rows = [(int(q), WindowRow(float(r), None if j is None else int(j), bool(sd)))
                    for q, r, j, sd in cur.execute(
                        f"SELECT seq, rate, job, seed FROM observation WHERE {where_key} "
                        "ORDER BY seq", key)]
            insert = ("INSERT INTO observation (job_type, scale_factor, gpu_type, seq, rate, "
                      "seen, job, seed) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
            if live and not rows:
                assert old is not None
                rows = [(0, WindowRow(old.rate, None, True))]
                cur.execute(insert, (*key, 0, old.rate, old.updated, None, 1))
            seq = rows[-1][0] + 1 if rows else 0
            cur.execute(insert, (*key, seq, value, at, job, 0))
            rows.append((seq, WindowRow(value, job, False)))
            if len(rows) > LEARN_WINDOW:
                cur.execute(f"DELETE FROM observation WHERE {where_key} AND seq <= ?",
                            (*key, seq - LEARN_WINDOW))
                rows = rows[-LEARN_WINDOW:]
            window = [r for _, r in rows]
            learned = (decide or median_of_window)(window, old)
            if learned is None:
                return old
            learned = _check_rate(learned, self._where, "decide")
            if old is not None and old.source == "learned":
                samples, updated = old.samples + 1, max(at, old.updated)
            else:
                samples = (old.samples if live and old is not None else 0) + sum(
                    not r.seed for r in window)
                updated = max(at, old.updated) if live and old is not None else at
            if old is not None and old.source in ("measured", "imported"):
                cur.execute("INSERT OR REPLACE INTO anchor (job_type, scale_factor, gpu_type, "
                            "rate, source) VALUES (?, ?, ?, ?, ?)",
                            (*key, old.rate, old.source))
            new = Entry(*key, learned, "learned", samples, updated)
            cur.execute(f"INSERT OR REPLACE INTO entry ({_COLUMNS}) VALUES "
                        "(?, ?, ?, ?, ?, ?, ?)",
                        (*key, new.rate, new.source, new.samples, new.updated))
        return new

    def estimate(self, job_type: str, scale_factor: int, gpu_type: str, rate: float, *,
                 when: float | None = None) -> Entry | None:
        """Store an estimate only where no real (measured, learned, imported) value exists.

        Replaces an older estimate.  Returns the stored entry, or None where it was not stored.
        """
        key = self._key(job_type, scale_factor, gpu_type)
        new = Entry(*key, _check_rate(rate, self._where), "estimated", 0,
                    _check_when(when, self._where))
        with self._write() as cur:
            return self._put(cur, new)

    def import_table(self, table: ThroughputTable, *, source: str = "imported") -> int:
        """Write every rate > 0 of ``table`` as ``source``, by the precedence rule, atomically.

        Returns how many entries were written (those the precedence rule let through).
        """
        src = _check_source(source, self._where)
        at = time.time()
        where = table.source
        news = [
            Entry(_check_job_type(job, where), _check_scale_factor(sf, where),
                  _check_gpu_type(gpu, where), _check_rate(rate, where, f"{gpu}.{job}"),
                  src, 0 if src == "estimated" else 1, at)
            for (job, sf), per_gpu in table.rates.items()
            for gpu, rate in per_gpu.items() if rate != 0
        ]
        return self._put_all(news)

    def _put_all(self, news: Sequence[Entry]) -> int:
        with self._write() as cur:
            return sum(self._put(cur, new) is not None for new in news)

    def import_file(self, path: str | os.PathLike[str], *, source: str | None = None) -> int:
        """Import a throughput file; returns how many entries were written.

        The format is told by the content: our own JSON export (an object with ``version`` and
        ``entries``), Gavel's JSON (any other object), or our CSV (anything else).  Gavel's and
        CSV rates are written as ``source`` (``imported`` when None); our export's entries keep
        their own source, samples and time unless ``source`` is given.  Either way the
        precedence rule decides per entry, and the file is imported whole or not at all.
        """
        where = str(path)
        src = None if source is None else _check_source(source, where)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read throughput file: {exc.strerror}", source=where,
                             field="FILE") from None
        except UnicodeDecodeError:
            raise InputError("not a UTF-8 text file", source=where, field="FILE",
                             fix="give a .json or .csv throughput file") from None
        if not text.lstrip().startswith("{"):
            return self.import_table(parse_csv(text, where), source=src or "imported")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # parse_gavel_json reports it
        if isinstance(data, dict) and "version" in data and "entries" in data:
            news = _parse_export(data, where)
            if src is not None:
                news = [Entry(*e.key, e.rate, src, e.samples, e.updated) for e in news]
            feet, mems = _parse_export_memory(data, where)
            pairs = _parse_export_pairs(data, where)
            written = self._put_all(news)
            for job, sf, gpu, mib, fsrc, updated in feet:
                self.record_footprint(job, sf, gpu, mib, source=fsrc, when=updated)
            for gpu, mib, updated in mems:
                self.record_gpu_memory(gpu, mib, when=updated)
            for a, b, sf, gpu, job_id, rate, seen in pairs:
                self.learn_pair(a, b, sf, gpu, rate, job=job_id, when=seen)
            return written
        return self.import_table(parse_gavel_json(text, where), source=src or "imported")

    # -- reads -------------------------------------------------------------------------------

    def get(self, job_type: str, scale_factor: int, gpu_type: str) -> Entry | None:
        """The stored entry of a key, or None."""
        key = self._key(job_type, scale_factor, gpu_type)
        rows = self._read(f"SELECT {_COLUMNS} FROM entry WHERE job_type = ? AND "
                          "scale_factor = ? AND gpu_type = ?", key)
        return _row_entry(rows[0]) if rows else None

    def entries(self, source: str | None = None) -> list[Entry]:
        """Every entry (of ``source`` only, if given), sorted by key."""
        order = " ORDER BY job_type, scale_factor, gpu_type"
        if source is None:
            rows = self._read(f"SELECT {_COLUMNS} FROM entry{order}")
        else:
            src = _check_source(source, self._where)
            rows = self._read(f"SELECT {_COLUMNS} FROM entry WHERE source = ?{order}", (src,))
        return [_row_entry(r) for r in rows]

    def footprints(self) -> dict[tuple[str, int], dict[GpuType, float]]:
        """``(job_type, scale_factor) -> {gpu_type: MiB}`` of every stored footprint."""
        out: dict[tuple[str, int], dict[GpuType, float]] = {}
        for j, sf, g, mib in self._read("SELECT job_type, scale_factor, gpu_type, mib FROM "
                                        "footprint ORDER BY job_type, scale_factor, gpu_type"):
            out.setdefault((str(j), int(sf)), {})[str(g)] = float(mib)
        return out

    def gpu_memory(self) -> dict[GpuType, float]:
        """``gpu_type -> MiB`` of every GPU type whose memory was stored."""
        return {str(g): float(m) for g, m in self._read(
            "SELECT gpu_type, mib FROM gpu_memory ORDER BY gpu_type")}

    def memory(self) -> MemoryLimits:
        return MemoryLimits(self.footprints(), self.gpu_memory())

    def table(self, base: ThroughputTable | None = None) -> ThroughputTable:
        """``base`` (e.g. the bundled Gavel table) with the store's entries (and footprints and
        GPU memory) merged over it."""
        mine = as_table(self.entries(), f"store:{self._where}", self.memory())
        return mine if base is None else base.merged(mine)

    def anchors(self) -> dict[Key, tuple[float, str]]:
        """Key -> (rate, source) of the measured or imported value a learned rate replaced
        (:meth:`learn`): what learning is bounded by after its own value took that key's
        place."""
        rows = self._read("SELECT job_type, scale_factor, gpu_type, rate, source FROM anchor")
        return {(str(j), int(sf), str(g)): (float(r), str(src)) for j, sf, g, r, src in rows}

    def sources(self) -> dict[Key, str]:
        """Key -> source of every entry (to mark measured/learned/estimated values in UIs)."""
        return {e.key: e.source for e in self.entries()}

    def export(self, path: str | os.PathLike[str], *, fmt: str = "json") -> int:
        """Write every entry to ``path`` (replaced atomically); returns how many.

        ``json``: our format, ``{"format", "version", "entries": [every Entry field],
        "footprints", "gpu_memory", "pair_votes"}`` (memory footprints, GPU memory sizes and
        the co-located rates learned from running pairs, one vote per job), which
        :meth:`import_file` reads back exactly.  ``csv``: ``job_type,scale_factor,gpu_type,
        steps_per_second`` (:func:`hadar_slurm.rates.table.load_table` reads it).  ``gavel``:
        Gavel's ``simulation_throughputs.json`` layout (``{"null": rate}`` entries).  The CSV and
        Gavel formats keep only the rates.
        """
        if fmt not in EXPORT_FORMATS:
            raise InputError(f"unknown export format {fmt!r}", field="format",
                             fix="use one of " + ", ".join(EXPORT_FORMATS))
        entries = self.entries()
        if fmt == "json":
            feet = [{"job_type": j, "scale_factor": sf, "gpu_type": g, "mib": m, "source": src,
                     "updated": u} for j, sf, g, m, src, u in self._read(
                         "SELECT job_type, scale_factor, gpu_type, mib, source, updated FROM "
                         "footprint ORDER BY job_type, scale_factor, gpu_type")]
            mems = [{"gpu_type": g, "mib": m, "updated": u} for g, m, u in self._read(
                "SELECT gpu_type, mib, updated FROM gpu_memory ORDER BY gpu_type")]
            pairs = [dict(zip(PAIR_FIELDS, row, strict=True)) for row in self._read(
                f"SELECT {', '.join(PAIR_FIELDS)} FROM pair_observation ORDER BY job_type, "
                "mate_type, scale_factor, gpu_type, job")]
            body = json.dumps({"format": FILE_FORMAT, "version": FILE_VERSION,
                               "entries": [asdict(e) for e in entries],
                               "footprints": feet, "gpu_memory": mems,
                               "pair_votes": pairs}, indent=1) + "\n"
        elif fmt == "csv":
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(CSV_HEADER)
            for e in entries:
                writer.writerow([e.job_type, e.scale_factor, e.gpu_type, repr(e.rate)])
            body = out.getvalue()
        else:
            gavel: dict[str, dict[str, dict[str, float]]] = {}
            for e in entries:
                gavel.setdefault(e.gpu_type, {})[repr((e.job_type, e.scale_factor))] = {
                    "null": e.rate}
            body = json.dumps(gavel, indent=1) + "\n"
        _write_atomically(Path(path), body)
        return len(entries)


def _write_atomically(path: Path, body: str) -> None:
    where = str(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", source=where, field="FILE",
                         fix="give a path in a writable directory") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write: {exc.strerror}", source=where, field="FILE",
                         fix="give a path in a writable directory") from None


def _parse_export_memory(data: Mapping[str, Any], where: str
                         ) -> tuple[list[tuple[str, int, str, float, str, float]],
                                    list[tuple[str, float, float]]]:
    """The footprints and GPU memory sizes of our own JSON export (optional keys: an export
    of a hadar-slurm without them has none), every field checked."""
    feet: list[tuple[str, int, str, float, str, float]] = []
    mems: list[tuple[str, float, float]] = []
    for name, fields in (("footprints", ("job_type", "scale_factor", "gpu_type", "mib",
                                         "source", "updated")),
                         ("gpu_memory", ("gpu_type", "mib", "updated"))):
        items = data.get(name, [])
        if not isinstance(items, list):
            raise InputError("expected a list", source=where, field=name)
        for i, item in enumerate(items):
            at = f"{name}[{i}]"
            if not isinstance(item, dict) or set(item) != set(fields):
                raise InputError("expected an object with exactly " + ", ".join(fields),
                                 source=where, field=at)
            gpu = _check_gpu_type(item["gpu_type"], where, f"{at}.gpu_type")
            mib = check_gpu_memory(item["mib"], where, f"{at}.mib")
            updated = _check_time(item["updated"], where, f"{at}.updated")
            if name == "gpu_memory":
                mems.append((gpu, mib, updated))
                continue
            src = _check_source(item["source"], where, f"{at}.source")
            if src not in ("measured", "learned"):
                raise InputError(f"a footprint is measured or learned, not {src}",
                                 source=where, field=f"{at}.source")
            feet.append((_check_job_type(item["job_type"], where, f"{at}.job_type"),
                         _check_scale_factor(item["scale_factor"], where,
                                             f"{at}.scale_factor"), gpu, mib, src, updated))
    return feet, mems


#: The fields of one learned co-located rate (a vote) in our JSON export, in column order.
PAIR_FIELDS = ("job_type", "mate_type", "scale_factor", "gpu_type", "job", "rate", "seen")


def _parse_export_pairs(data: Mapping[str, Any], where: str
                        ) -> list[tuple[str, str, int, GpuType, int, float, float]]:
    """The learned co-located rates of our own JSON export (``pair_votes``, optional: an export
    of a hadar-slurm without them has none), every field checked.  A vote keeps the job it
    came from: one vote per job and key, as :meth:`ThroughputStore.learn_pair` counts them."""
    items = data.get("pair_votes", [])
    if not isinstance(items, list):
        raise InputError("expected a list", source=where, field="pair_votes")
    out: list[tuple[str, str, int, GpuType, int, float, float]] = []
    for i, item in enumerate(items):
        at = f"pair_votes[{i}]"
        if not isinstance(item, dict) or set(item) != set(PAIR_FIELDS):
            raise InputError("expected an object with exactly " + ", ".join(PAIR_FIELDS),
                             source=where, field=at)
        job_id = _check_count(item["job"], where, f"{at}.job", "job")
        out.append((_check_job_type(item["job_type"], where, f"{at}.job_type"),
                    _check_job_type(item["mate_type"], where, f"{at}.mate_type"),
                    _check_scale_factor(item["scale_factor"], where, f"{at}.scale_factor"),
                    _check_gpu_type(item["gpu_type"], where, f"{at}.gpu_type"), job_id,
                    _check_rate(item["rate"], where, f"{at}.rate"),
                    _check_time(item["seen"], where, f"{at}.seen")))
    return out


def _parse_export(data: Mapping[str, Any], where: str) -> list[Entry]:
    """The entries of our own JSON export, every field checked."""
    if data.get("version") != FILE_VERSION:
        raise InputError(f"unknown version {data.get('version')!r}", source=where,
                         field="version", fix=f"this hadar-slurm reads version {FILE_VERSION}")
    items = data["entries"]
    if not isinstance(items, list):
        raise InputError("expected a list of entries", source=where, field="entries")
    out: list[Entry] = []
    seen: set[Key] = set()
    for i, item in enumerate(items):
        at = f"entries[{i}]"
        if not isinstance(item, dict):
            raise InputError("expected an object", source=where, field=at)
        missing = [f for f in _ENTRY_FIELDS if f not in item]
        extra = sorted(set(item) - set(_ENTRY_FIELDS))
        if missing or extra:
            raise InputError(
                ("missing " + ", ".join(missing) if missing else "")
                + ("; " if missing and extra else "")
                + ("unknown " + ", ".join(extra) if extra else ""),
                source=where, field=at, fix="give exactly " + ", ".join(_ENTRY_FIELDS))
        entry = Entry(
            _check_job_type(item["job_type"], where, f"{at}.job_type"),
            _check_scale_factor(item["scale_factor"], where, f"{at}.scale_factor"),
            _check_gpu_type(item["gpu_type"], where, f"{at}.gpu_type"),
            _check_rate(item["rate"], where, f"{at}.rate"),
            _check_source(item["source"], where, f"{at}.source"),
            _check_count(item["samples"], where, f"{at}.samples"),
            _check_time(item["updated"], where, f"{at}.updated"),
        )
        if entry.key in seen:
            raise InputError(f"a second entry for {entry.key!r}", source=where, field=at,
                             fix="keep one entry per job_type, scale_factor and gpu_type")
        seen.add(entry.key)
        out.append(entry)
    return out
