"""The runtime's settings, read from the environment a copy (or an unforked job) runs in.

No torch here: the sidecar and the tests can use this module without it.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hadar_slurm.errors import InputError

__all__ = [
    "DEFAULT_BARRIER_TIMEOUT_S",
    "DEFAULT_ROUND_SECONDS",
    "EXIT_COPY_LOST",
    "EXIT_PREEMPTED",
    "MAX_COPIES",
    "AlreadyDone",
    "CopyLost",
    "JobStop",
    "Preempted",
    "RuntimeConfig",
]

#: Exit status of a run stopped by the preemption signal (sysexits' EX_TEMPFAIL: "try again").
EXIT_PREEMPTED = 75
#: Exit status of a copy that gave up at a round barrier because another copy was lost.
EXIT_COPY_LOST = 76
#: How long a copy waits for a sign of life from a copy it needs before giving up.
DEFAULT_BARRIER_TIMEOUT_S = 300.0
#: Round length when neither round_iters nor round_seconds is given.
DEFAULT_ROUND_SECONDS = 60.0
#: Most copies a job may be forked into (the same bound as hadar_slurm.slurm.hetjob).
MAX_COPIES = 16

_SOURCE = "environment"


class JobStop(SystemExit):
    """The run must end now; ``code`` is the process exit status.

    A :class:`SystemExit`, so that a training script that does not catch it exits with the
    right status (and ``except Exception`` in user code does not swallow it).  The runtime has
    already printed ``message`` to stderr when it raises one.
    """

    def __init__(self, status: int, message: str, *, reason: str | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.message = message
        self.reason = message if reason is None else reason  # short, for the heartbeat

    def __str__(self) -> str:
        return self.message


class Preempted(JobStop):
    """Stopped by the preemption signal (exit status 75); what could be saved is saved."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_PREEMPTED, message)


class CopyLost(JobStop):
    """A copy this one waited for at a round barrier showed no sign of life (exit status 76)."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(EXIT_COPY_LOST, message, reason=reason)


class AlreadyDone(JobStop):
    """The tracker already holds all of the job's work (exit status 0)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


def _int_env(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name}={raw!r} is not a whole number", source=_SOURCE,
                         field=name) from None
    if not low <= value <= high:
        raise InputError(f"{name}={value} is out of range", source=_SOURCE, field=name,
                         fix=f"use {low}..{high}")
    return value


def _seconds_env(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{name}={raw!r} is not a positive number of seconds", source=_SOURCE,
                         field=name)
    return value


def signal_number(name: str) -> signal.Signals:
    """``USR1``, ``SIGUSR1`` or ``10`` -> :data:`signal.SIGUSR1`; InputError when unknown or
    uncatchable."""
    text = name.strip().upper()
    try:
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[
            text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise InputError(f"unknown signal {name!r}", source=_SOURCE,
                         field="HADAR_PREEMPT_SIGNAL", fix="name a signal such as USR1") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise InputError(f"{sig.name} cannot be caught", source=_SOURCE,
                         field="HADAR_PREEMPT_SIGNAL", fix="use a catchable signal such as USR1")
    return sig


@dataclass(frozen=True)
class RuntimeConfig:
    """Where this process stands in a (possibly forked) job, and how to run its rounds.

    ``work``: the job's total iterations W.  ``copies``/``index``: k and this copy's index
    (1 and 0 for an unforked job).  ``tracker_dir``: shared by all copies and by later runs of
    the job.  ``run_id``: the same for every copy of one run and different for the next run
    (a requeue); ``None`` when unknown.  Rounds: ``round_iters`` (iterations of all copies
    together per round) or ``round_seconds`` (each copy gets what it did in that many seconds
    last round; the first round of a group is a probe of ``probe_iters`` per copy).
    ``barrier_timeout_s``: how long a copy waits at a round barrier without any sign of life
    from a copy it needs.  ``time_limit_s``: stop (at a round boundary, saving a checkpoint)
    after that long even if work remains.  ``heartbeat_s``: how often a copy says it is alive.
    """

    work: int
    tracker_dir: Path
    copies: int = 1
    index: int = 0
    job_key: str = "local"
    run_id: str | None = None
    restart_count: int = 0
    gpu_type: str | None = None
    round_iters: int | None = None
    round_seconds: float | None = None
    probe_iters: int = 10
    barrier_timeout_s: float = DEFAULT_BARRIER_TIMEOUT_S
    heartbeat_s: float = 1.0
    time_limit_s: float | None = None
    preempt_signals: tuple[str, ...] = ("USR1", "TERM")
    device: str | None = None

    def __post_init__(self) -> None:
        def bad(what: str, problem: str, fix: str | None = None) -> InputError:
            return InputError(problem, source="runtime config", field=what, fix=fix)

        if isinstance(self.work, bool) or not isinstance(self.work, int) or self.work < 1:
            raise bad("work", f"work must be a whole number of iterations >= 1, got {self.work!r}")
        if not 1 <= self.copies <= MAX_COPIES:
            raise bad("copies", f"{self.copies} copies", f"use 1..{MAX_COPIES}")
        if not 0 <= self.index < self.copies:
            raise bad("index", f"copy index {self.index} with {self.copies} copies",
                      f"use 0..{self.copies - 1}")
        if self.round_iters is not None and self.round_seconds is not None:
            raise bad("round_iters", "give round_iters or round_seconds, not both")
        if self.round_iters is not None and self.round_iters < 1:
            raise bad("round_iters", f"round_iters must be >= 1, got {self.round_iters}")
        for what in ("round_seconds", "time_limit_s"):
            value = getattr(self, what)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise bad(what, f"{what} must be a positive number of seconds, got {value!r}")
        for what in ("barrier_timeout_s", "heartbeat_s"):
            value = getattr(self, what)
            if not (math.isfinite(value) and value > 0):
                raise bad(what, f"{what} must be a positive number of seconds, got {value!r}")
        if self.probe_iters < 1:
            raise bad("probe_iters", f"probe_iters must be >= 1, got {self.probe_iters}")
        for name in self.preempt_signals:
            signal_number(name)

    @property
    def coordinator(self) -> bool:
        """Copy 0 averages the copies' reports and commits each round."""
        return self.index == 0

    @property
    def round_length(self) -> tuple[str, float]:
        """``("iters", n)`` or ``("seconds", s)``."""
        if self.round_iters is not None:
            return ("iters", float(self.round_iters))
        return ("seconds", self.round_seconds or DEFAULT_ROUND_SECONDS)

    @classmethod
    def from_env(
        cls,
        work: int,
        *,
        round_iters: int | None = None,
        round_seconds: float | None = None,
        time_limit_s: float | None = None,
        probe_iters: int = 10,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> RuntimeConfig:
        """The settings of this process from its environment (``os.environ`` by default).

        Set by the HadarE heterogeneous job (hadar_slurm.slurm.hetjob) for each copy:
        ``HADAR_COPY_INDEX`` (default 0), ``HADAR_COPIES`` (default 1),
        ``HADAR_ORIGINAL_JOB_ID``, ``HADAR_TRACKER_DIR``, ``HADAR_COPY_GPU_TYPE``.
        Set by Slurm: ``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``.  Optional:
        ``HADAR_PREEMPT_SIGNAL`` (default USR1; TERM is always handled too),
        ``HADAR_DEVICE`` (e.g. ``cpu``), ``HADAR_BARRIER_TIMEOUT`` (seconds),
        ``HADAR_RUN_ID`` (overrides the run id taken from Slurm).

        The tracker dir is ``HADAR_TRACKER_DIR`` when set, else
        ``<cwd>/.hadar-tracker/<job key>`` with job key ``HADAR_ORIGINAL_JOB_ID``, else
        ``SLURM_JOB_ID``, else ``local``.
        """
        env = os.environ if env is None else env
        copies = _int_env(env, "HADAR_COPIES", 1, 1, MAX_COPIES)
        index = _int_env(env, "HADAR_COPY_INDEX", 0, 0, copies - 1)
        original = env.get("HADAR_ORIGINAL_JOB_ID", "").strip()
        slurm_job = env.get("SLURM_JOB_ID", "").strip()
        key = original or slurm_job or "local"
        if not all(c.isalnum() or c in "._-" for c in key):
            raise InputError(f"job id {key!r} cannot name a directory", source=_SOURCE,
                             field="HADAR_ORIGINAL_JOB_ID" if original else "SLURM_JOB_ID")
        tracker = env.get("HADAR_TRACKER_DIR", "").strip()
        base = Path.cwd() if cwd is None else cwd
        tracker_dir = Path(tracker) if tracker else base / ".hadar-tracker" / key
        if not tracker_dir.is_absolute():
            tracker_dir = base / tracker_dir
        restarts = _int_env(env, "SLURM_RESTART_COUNT", 0, 0, 10**9)
        run_id = env.get("HADAR_RUN_ID", "").strip() or None
        if run_id is None and slurm_job:
            # Every component of a heterogeneous job sees the leader's id here (checked on
            # Slurm 22.05), and a requeue keeps the id and counts SLURM_RESTART_COUNT up.
            run_id = f"{slurm_job}.{restarts}"
        preempt = env.get("HADAR_PREEMPT_SIGNAL", "").strip() or "USR1"
        sig = signal_number(preempt).name.removeprefix("SIG")
        signals = (sig,) if sig == "TERM" else (sig, "TERM")
        device = env.get("HADAR_DEVICE", "").strip() or None
        barrier = _seconds_env(env, "HADAR_BARRIER_TIMEOUT") or DEFAULT_BARRIER_TIMEOUT_S
        return cls(
            work=work, tracker_dir=tracker_dir, copies=copies, index=index, job_key=key,
            run_id=run_id, restart_count=restarts,
            gpu_type=env.get("HADAR_COPY_GPU_TYPE", "").strip() or None,
            round_iters=round_iters, round_seconds=round_seconds, probe_iters=probe_iters,
            barrier_timeout_s=barrier, time_limit_s=time_limit_s,
            preempt_signals=signals, device=device)
