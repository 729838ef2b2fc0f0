"""How Slurm schedules, as HadarE's forks need it (hadar_slurm.slurm.schedconf): the parser of
``scontrol show config`` and what a forking sidecar says at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from hadar_slurm.sidecar.controller import Sidecar
from hadar_slurm.slurm import SlurmCommandError, SlurmParseError
from hadar_slurm.slurm.schedconf import (
    DEFAULT_BF_INTERVAL_S,
    SchedulerConfig,
    fork_warning,
    parse_scheduler_config,
)
from tests.test_safe_state import config_file, config_of, events, held_jobs  # noqa: F401
from tests.test_sidecar_backend import NODES, FakeSlurm

# The lines of `scontrol show config` that matter, as Slurm 22.05 prints them (the dev
# cluster's), among neighbours that must not be mistaken for them.
SHOW_CONFIG = """\
Configuration data as of 2026-11-30T12:40:01
AccountingStorageBackupHost = (null)
SchedulerParameters     = bf_interval=1,sched_interval=2
SchedulerTimeSlice      = 30 sec
SchedulerType           = sched/backfill
ScronParameters         = (null)
SelectType              = select/cons_tres
"""


def test_the_backfill_interval_is_read_from_the_scheduler_parameters() -> None:
    assert parse_scheduler_config(SHOW_CONFIG) == SchedulerConfig("sched/backfill", 1)
    # not set: Slurm's default
    bare = SHOW_CONFIG.replace("bf_interval=1,sched_interval=2", "(null)")
    assert parse_scheduler_config(bare) == SchedulerConfig("sched/backfill",
                                                           DEFAULT_BF_INTERVAL_S)
    other = SHOW_CONFIG.replace("bf_interval=1,", "bf_continue,bf_interval=45,")
    assert parse_scheduler_config(other).bf_interval_s == 45
    # no backfill scheduler: no fork ever starts
    builtin = parse_scheduler_config(SHOW_CONFIG.replace("sched/backfill", "sched/builtin"))
    assert builtin == SchedulerConfig("sched/builtin", None) and not builtin.starts_forks


@pytest.mark.parametrize(("text", "field", "problem"), [
    ("SelectType = select/cons_tres\n", "SchedulerType", "missing"),
    (SHOW_CONFIG.replace("bf_interval=1", "bf_interval=soon"), "SchedulerParameters",
     "'soon' is not a whole number"),
    (SHOW_CONFIG.replace("bf_interval=1", "bf_interval=0"), "SchedulerParameters",
     "bf_interval=0 is below 1"),
])
def test_unreadable_output_names_the_field(text: str, field: str, problem: str) -> None:
    with pytest.raises(SlurmParseError, match=f"field '{field}'.*{problem}"):
        parse_scheduler_config(text)


def test_a_slow_or_missing_backfill_scheduler_is_worth_a_warning() -> None:
    # a fork waits up to one backfill interval: fine within 5% of the epoch
    assert fork_warning(SchedulerConfig("sched/backfill", 1), 360.0) is None
    assert fork_warning(SchedulerConfig("sched/backfill", 18), 360.0) is None
    # (1 s is Slurm's shortest: nothing to tell even with 12 s epochs, bench.fidelity's)
    assert fork_warning(SchedulerConfig("sched/backfill", 1), 12.0) is None
    assert fork_warning(SchedulerConfig("sched/backfill", 2), 12.0) is not None
    slow = fork_warning(SchedulerConfig("sched/backfill", 30), 360.0)
    assert slow is not None and slow.startswith("bf_interval=30 s: each fork waits up to 30 s")
    assert "set SchedulerParameters=bf_interval=1" in slow
    never = fork_warning(SchedulerConfig("sched/builtin", None), 360.0)
    assert never is not None and "forks would never start" in never


def _start(config_file: Path, sched: SchedulerConfig | Exception,  # noqa: F811
           policy: str = "hadare") -> list[dict[str, object]]:
    config = config_of(config_file, policy=policy)
    api = FakeSlurm(held_jobs(), NODES)
    if isinstance(sched, Exception):
        def fail() -> SchedulerConfig:
            raise sched
        api.scheduler_config = fail  # type: ignore[method-assign]
    else:
        api.sched = sched
    assert Sidecar(config, api=api).run(max_epochs=1) == 0
    assert len(events(config, "epoch")) == 1  # it ran whatever Slurm said
    return events(config, "fork_scheduler")


def test_a_forking_sidecar_says_how_soon_its_forks_start(config_file: Path) -> None:  # noqa: F811
    ok, = _start(config_file, SchedulerConfig("sched/backfill", 1))
    assert ok["level"] == "info" and ok["bf_interval_s"] == 1 and "warning" not in ok


def test_a_forking_sidecar_warns_of_a_slow_backfill(config_file: Path) -> None:  # noqa: F811
    slow, = _start(config_file, SchedulerConfig("sched/backfill", 30))
    assert slow["level"] == "warning" and "waits up to 30 s" in str(slow["warning"])


def test_a_forking_sidecar_warns_where_forks_never_start(config_file: Path) -> None:  # noqa: F811
    never, = _start(config_file, SchedulerConfig("sched/builtin", None))
    assert never["level"] == "warning" and never["scheduler_type"] == "sched/builtin"
    assert "never start" in str(never["warning"])


def test_a_failed_read_is_logged_and_the_sidecar_goes_on(config_file: Path) -> None:  # noqa: F811
    failed, = _start(config_file, SlurmCommandError(["scontrol", "show", "config"], "failed"))
    assert failed["level"] == "warning" and "failed" in str(failed["error"])


def test_a_sidecar_that_does_not_fork_does_not_ask(config_file: Path) -> None:  # noqa: F811
    assert _start(config_file, SchedulerConfig("sched/builtin", None), policy="hadar") == []
