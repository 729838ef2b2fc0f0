"""The job tracker's files: layout, atomic writes, the committed state and the round plan.

No torch here, so that the sidecar (and anything else that only reads progress) can use it.
The layout is described in the docstring of :mod:`hadar_slurm.runtime`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from hadar_slurm.runtime.config import DEFAULT_ROUND_SECONDS

__all__ = [
    "FORMAT",
    "CommittedState",
    "TrackerPaths",
    "atomic_write_bytes",
    "atomic_write_json",
    "plan_round",
    "read_json",
    "read_progress",
    "read_small_object",
]

#: Version of state.json / progress.json / report metadata.
FORMAT = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
#: The progress report in a tracker dir (format in :mod:`hadar_slurm.runtime`); the sidecar
#: reads it too (:func:`hadar_slurm.sidecar.fork.read_progress`).
PROGRESS_FILE = "progress.json"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one
    (a temporary file in the same directory, then :func:`os.replace`).  ``durable``: fsync the
    file and the directory too (for what a crash must not lose: checkpoints, state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; others (the sidecar) read these
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, obj: object, *, durable: bool = False) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode(), durable=durable)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when the file is missing (files are replaced
    atomically, so a reader never sees half of one)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return obj


def read_small_object(path: str | os.PathLike[str], max_bytes: int, *,
                      follow: bool = True) -> dict[str, Any] | None:
    """The JSON object in ``path``, read without blocking on a FIFO; None when there is no such
    file.  Raises ValueError for a file that is not one JSON object of at most ``max_bytes``,
    OSError when it cannot be read (with ``follow=False``, a symlink: it is not followed).
    For the small files a job and the sidecar exchange, which the other side may damage."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def read_progress(tracker_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``progress.json`` of a job's tracker dir (format in :mod:`hadar_slurm.runtime`), or
    None when no round has been committed yet."""
    return read_json(Path(tracker_dir) / PROGRESS_FILE)


def _safe(name: str) -> str:
    return _UNSAFE.sub("_", name) or "_"


@dataclass(frozen=True)
class TrackerPaths:
    """Where each file of a tracker dir lives."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def progress(self) -> Path:
        return self.root / PROGRESS_FILE

    @property
    def history(self) -> Path:
        return self.root / "history.jsonl"

    def checkpoint(self, round_: int) -> Path:
        return self.root / f"consolidated-{round_:06d}.pt"

    def checkpoints(self) -> list[tuple[int, Path]]:
        out = []
        for path in self.root.glob("consolidated-*.pt"):
            digits = path.stem.removeprefix("consolidated-")
            if digits.isdigit():
                out.append((int(digits), path))
        return sorted(out)

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def report_dir(self, round_: int) -> Path:
        return self.reports / f"round-{round_:06d}"

    def report_meta(self, round_: int, copy: int) -> Path:
        return self.report_dir(round_) / f"copy-{copy}.json"

    def report_data(self, round_: int, copy: int) -> Path:
        return self.report_dir(round_) / f"copy-{copy}.pt"

    def live_dir(self, run_id: str | None) -> Path:
        return self.root / "live" / ("no-run-id" if run_id is None else _safe(run_id))

    def heartbeat(self, run_id: str | None, copy: int) -> Path:
        return self.live_dir(run_id) / f"copy-{copy}.json"


@dataclass(frozen=True)
class CommittedState:
    """``state.json``: the one committed state of the job after ``round`` rounds.

    ``done``: iterations consolidated so far (all copies, all runs); ``checkpoint``: file name of
    the consolidated model and optimizer state in the tracker dir (None before the first
    commit); ``copies``: k of the run that committed it; ``rates``: each copy's iterations/s in
    that round (None where unknown), which plan the next round; ``stop``: why the copies of that
    run stopped after this round (None: they go on).
    """

    work: int
    round: int = 0
    done: int = 0
    checkpoint: str | None = None
    copies: int = 1
    rates: tuple[float | None, ...] = ()
    stop: str | None = None
    run: str | None = None
    job: str = "local"
    updated_at: float = field(default=0.0, compare=False)

    @property
    def complete(self) -> bool:
        return self.done >= self.work

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "job": self.job, "work": self.work, "round": self.round,
            "done": self.done, "checkpoint": self.checkpoint, "copies": self.copies,
            "rates": list(self.rates), "stop": self.stop, "run": self.run,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CommittedState:
        rates = tuple(None if r is None else float(r) for r in obj.get("rates", ()))
        return cls(
            work=int(obj["work"]), round=int(obj["round"]), done=int(obj["done"]),
            checkpoint=obj.get("checkpoint"), copies=int(obj.get("copies", 1)), rates=rates,
            stop=obj.get("stop"), run=obj.get("run"), job=str(obj.get("job", "local")),
            updated_at=float(obj.get("updated_at", 0.0)))

    @classmethod
    def load(cls, path: Path) -> CommittedState | None:
        obj = read_json(path)
        return None if obj is None else cls.from_json(obj)


def _split(total: int, weights: Sequence[Fraction]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder, ties to the lower
    index): whole numbers summing to exactly ``total``."""
    wsum = sum(weights, Fraction(0))
    if wsum <= 0:
        weights = [Fraction(1)] * len(weights)
        wsum = Fraction(len(weights))
    shares = [total * w / wsum for w in weights]
    out = [int(s) for s in shares]  # floor: shares are >= 0
    left = total - sum(out)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - out[i]), i))
    for i in order[:left]:
        out[i] += 1
    return out


def plan_round(
    remaining: int,
    copies: int,
    rates: Sequence[float | None],
    *,
    round_iters: int | None = None,
    round_seconds: float | None = None,
    probe_iters: int = 10,
) -> tuple[int, ...]:
    """Each copy's iteration quota for the next round: a pure function of the committed state
    (so that every copy computes the same plan) whose sum is ``min(target, remaining)``.

    ``rates``: each copy's iterations/s in the last committed round; used only when there is
    one known rate per copy, otherwise the copies are treated as equal.  ``round_iters``: the
    round's iterations (all copies together), split in proportion to the rates.  Else
    ``round_seconds``: each copy gets about what it does in that time (at least 1); with
    unknown rates, a probe round of ``probe_iters`` per copy.  The last round is cut to what
    remains, in the same proportions, so the quotas of all rounds add up to the work exactly.
    """
    if remaining <= 0:
        return (0,) * copies
    known = len(rates) == copies and all(r is not None and r > 0 for r in rates)
    weights = [Fraction(r) for r in rates if r is not None] if known else [Fraction(1)] * copies
    if round_iters is not None:
        targets = _split(round_iters, weights)
    elif known:
        seconds = Fraction(round_seconds if round_seconds is not None else DEFAULT_ROUND_SECONDS)
        targets = [max(1, round(w * seconds)) for w in weights]
    else:
        targets = [probe_iters] * copies
    if sum(targets) <= remaining:
        return tuple(targets)
    return tuple(_split(remaining, [Fraction(t) for t in targets]))


def now() -> float:
    """Wall-clock time for the files' ``updated_at`` fields (seconds since the epoch)."""
    return time.time()
