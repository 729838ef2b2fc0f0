"""What keeps the sidecar's state safe: one sidecar per state_dir, epochs that never go back,
and telling an unreachable slurmctld from other Slurm errors.

**The lock.**  :class:`StateDirLock` takes an exclusive, non-blocking ``flock`` on
``<state_dir>/sidecar.lock`` and holds it for the sidecar's life (dry runs too: a shadow sidecar
also writes ``state.json`` and the epoch file).  The holder's pid, start time and config are
written into the file, so that a second sidecar is refused with one line that names them.  The
kernel drops a ``flock`` when its process dies, however it dies (SIGKILL included), so a killed
sidecar never blocks the next; the file itself is left in place (removing it would let two
sidecars lock two different files of the same name).  The descriptor is close-on-exec, so the
Slurm commands the sidecar runs never inherit the lock.  Readers (``status``, ``explain``) do not
take it.

**The epoch file.**  ``<state_dir>/epoch.json`` holds the number of the epoch being run, written
atomically (a temporary file renamed over it) before each epoch.  A restarted sidecar resumes at
one past the larger of that and the latest epoch recorded on a job in Slurm, so its epochs never
go back, even when Slurm has purged the jobs that carried the records.

**Unreachable.**  :func:`is_unreachable` says whether a Slurm error means slurmctld did not answer
(a command timed out, or Slurm's client said it could not reach the controller).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from pathlib import Path

from hadar_slurm.errors import InputError
from hadar_slurm.slurm import SlurmError
from hadar_slurm.slurm.errors import SlurmTimeoutError

__all__ = ["EPOCH_FILE", "LOCK_FILE", "StateDirLock", "is_unreachable", "read_epoch",
           "write_epoch"]

LOCK_FILE = "sidecar.lock"
EPOCH_FILE = "epoch.json"
STATE_DIR_FIELD = "[sidecar] state_dir"

#: What Slurm's clients (squeue, sinfo, scontrol, scancel, sbatch) print when slurmctld does not
#: answer: down, hung, unreachable, or too slow for MessageTimeout.
UNREACHABLE = re.compile(
    r"unable to contact slurm controller|socket timed out|connection refused|"
    r"connection timed out|communication connection failure|slurm_persist_conn|"
    r"unable to connect|zero bytes were transmitted|slurmctld.*not responding|"
    r"no route to host|network is unreachable|"
    # what squeue/sinfo --json (22.05) put in their `errors` when slurmctld does not answer
    # (seen with a SIGSTOPped slurmctld: the client waits MessageTimeout, then reports these)
    r"field 'errors': (unspecified error|failed while looking for jobs)", re.IGNORECASE)


def is_unreachable(exc: BaseException) -> bool:
    """Whether a Slurm error means slurmctld did not answer (a timeout, or the client's own
    word for it), as opposed to a command that failed for another reason."""
    if isinstance(exc, SlurmTimeoutError):
        return True
    return isinstance(exc, SlurmError) and UNREACHABLE.search(str(exc)) is not None


def _state_dir_error(problem: str, state_dir: Path, source: str | None, fix: str) -> InputError:
    return InputError(problem, source=source, field=STATE_DIR_FIELD,
                      fix=fix.replace("STATE_DIR", str(state_dir)))


class StateDirLock:
    """An exclusive ``flock`` on ``<state_dir>/sidecar.lock`` (module docstring)."""

    def __init__(self, state_dir: str | os.PathLike[str], *, source: str | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / LOCK_FILE
        self.source = source
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, dry_run: bool = False) -> None:
        """Take the lock or raise a one-line :class:`InputError` naming the holder."""
        if self._fd is not None:
            return
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _state_dir_error(
                f"cannot create {self.path}: {exc.strerror}", self.state_dir, self.source,
                "give a directory the sidecar's user can write, e.g. /var/lib/hadar-slurm "
                "(hadar-slurm.service creates it)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise _state_dir_error(
                f"another sidecar ({holder}) already runs on the state_dir STATE_DIR "
                f"(it holds {self.path})".replace("STATE_DIR", str(self.state_dir)),
                self.state_dir, self.source,
                "stop that sidecar first, or give this one a state_dir of its own (a dry run "
                "too)") from None
        info = {"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                             time.gmtime()),
                "config": self.source, "dry_run": dry_run}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError:
            pass  # the lock is what counts; the holder's details are only for the message
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent).  The file stays (see the module docstring)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)


def _holder(fd: int) -> str:
    """The holder's details, as its lock file says (the file may be empty for a moment)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict) or "pid" not in data:
        return "pid unknown"
    text = f"pid {data.get('pid')}"
    if data.get("started"):
        text += f", started {data['started']}"
    if data.get("dry_run"):
        text += ", a dry run"
    if data.get("config"):
        text += f", config {data['config']}"
    return text


def read_epoch(state_dir: str | os.PathLike[str]) -> int:
    """The epoch number in ``<state_dir>/epoch.json`` (-1 when there is none, or it cannot be
    read: Slurm's records are then all there is)."""
    try:
        data = json.loads((Path(state_dir) / EPOCH_FILE).read_text())
    except (OSError, ValueError):
        return -1
    epoch = data.get("epoch") if isinstance(data, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        return -1
    return epoch


def write_epoch(state_dir: str | os.PathLike[str], epoch: int) -> None:
    """Write ``epoch`` to ``<state_dir>/epoch.json`` atomically (raises OSError)."""
    path = Path(state_dir) / EPOCH_FILE
    tmp = path.with_name(f".{EPOCH_FILE}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"epoch": int(epoch), "time": time.time()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
