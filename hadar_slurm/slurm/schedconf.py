"""How Slurm schedules, as far as HadarE's forks care: its scheduler plugin and backfill interval.

A fork (a job's copies, one heterogeneous job) is started by Slurm's backfill scheduler only
(``sched/backfill``; the main scheduler never starts heterogeneous jobs), at its next cycle:
up to ``bf_interval`` seconds after the sidecar submits it (30 by Slurm's default), one cycle
more for each earlier fork of the epoch that shares a node with it (``bench/move_cost.py``).
Under ``sched/builtin`` forks never start.  The sidecar reads ``scontrol show config`` once
at start when its policy forks (:func:`parse_scheduler_config`) and says what that costs
(:func:`fork_warning`; docs/admins.md, "Forks: the backfill scheduler's interval").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hadar_slurm.slurm.errors import SlurmParseError

#: Where :func:`parse_scheduler_config` reads from by default (the source in its errors).
SOURCE = "scontrol show config"
#: Slurm's ``bf_interval`` when ``SchedulerParameters`` does not set it (seconds).
DEFAULT_BF_INTERVAL_S = 30
#: A backfill interval longer than this share of the epoch is worth a warning: each fork
#: waits up to one interval, more where forks share nodes.
SLOW_SHARE = 0.05

_LINE = re.compile(r"^\s*(?P<key>[A-Za-z][A-Za-z0-9_]*)\s*=\s*(?P<value>.*?)\s*$")


def scontrol_show_config() -> list[str]:
    """The argv that prints slurmctld's configuration."""
    return ["scontrol", "show", "config"]


@dataclass(frozen=True)
class SchedulerConfig:
    """``scheduler_type`` (``sched/backfill``, ``sched/builtin``) and, under backfill, its
    interval in seconds (``bf_interval``, Slurm's default where not set); None otherwise."""

    scheduler_type: str
    bf_interval_s: int | None

    @property
    def starts_forks(self) -> bool:
        """Whether Slurm starts heterogeneous jobs at all (only its backfill scheduler does)."""
        return self.bf_interval_s is not None


def parse_scheduler_config(text: str, source: str = SOURCE) -> SchedulerConfig:
    """The :class:`SchedulerConfig` in ``scontrol show config``'s output (``Key = value``
    lines); :class:`SlurmParseError` naming the field when it is missing or unreadable."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            values.setdefault(m.group("key"), m.group("value"))
    kind = values.get("SchedulerType")
    if not kind:
        raise SlurmParseError(source, "SchedulerType", "missing (is this scontrol show config?)")
    if kind != "sched/backfill":
        return SchedulerConfig(kind, None)
    interval = DEFAULT_BF_INTERVAL_S
    params = values.get("SchedulerParameters", "")
    for item in params.split(","):
        key, _, value = item.strip().partition("=")
        if key == "bf_interval":
            try:
                interval = int(value)
            except ValueError:
                raise SlurmParseError(source, "SchedulerParameters",
                                      f"bf_interval={value!r} is not a whole number") from None
            if interval < 1:
                raise SlurmParseError(source, "SchedulerParameters",
                                      f"bf_interval={interval} is below 1")
    return SchedulerConfig(kind, interval)


def fork_warning(config: SchedulerConfig, epoch_seconds: float) -> str | None:
    """What a forking sidecar should tell its admin about ``config``, or None when forks
    start promptly (within :data:`SLOW_SHARE` of an epoch, or at Slurm's shortest interval,
    1 s)."""
    interval = config.bf_interval_s
    if interval is None:  # (not config.starts_forks)
        return (f"SchedulerType={config.scheduler_type}: Slurm starts heterogeneous jobs only "
                "from sched/backfill, so hadare's forks would never start; set "
                "SchedulerType=sched/backfill (and bf_interval=1 in SchedulerParameters) or "
                "run another policy")
    if interval <= max(1.0, SLOW_SHARE * epoch_seconds):  # (1 s: Slurm's shortest)
        return None
    return (f"bf_interval={interval} s: each fork waits up to {interval} s for Slurm's backfill "
            f"scheduler (more where forks of one epoch share a node), against an epoch of "
            f"{epoch_seconds:g} s; set SchedulerParameters=bf_interval=1 (docs/admins.md, "
            f"\"Forks: the backfill scheduler's interval\")")
