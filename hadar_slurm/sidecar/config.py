"""The sidecar's configuration: one TOML file, every key validated.

The file has five sections::

    [slurm]       how to reach Slurm (slurm.conf, backend, partition, command timeout)
    [scheduler]   what to decide (policy, epoch length, preemption, throughput tables)
    [hadare]      forked jobs (where their job trackers live, what consolidation costs,
                  whether the jobs that bind the makespan run on their fastest copies)
    [sidecar]     how to run (dry run, state directory, logs)
    [metrics]     the Prometheus endpoint (address; loopback only unless allow_remote)

:data:`CONFIG_SCHEMA` is the one description of the keys: :func:`parse_config` validates against
it, :func:`default_config` takes its defaults from it, ``slurm_conf/hadar-slurm.toml`` lists it
(a test checks that) and :func:`render_config_reference` turns it into the admin docs' table.

Every problem is an :class:`~hadar_slurm.errors.InputError` naming the file, the line where it
can be found, the key as ``[section] key``, what is wrong and how to fix it.  Relative paths in
the file are resolved against the file's directory (the sidecar usually runs with ``/`` as its
working directory), relative paths given to :meth:`SidecarConfig.with_overrides` (command line
flags) against the current directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import re
import signal
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from pathlib import Path

from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.costs import DEFAULT_RESTART_S, SLURM_MOVE_S, LiveCosts
from hadar_slurm.durations import parse_seconds_value
from hadar_slurm.errors import InputError
from hadar_slurm.model import normalize_gpu_type
from hadar_slurm.policy import REGISTRY
from hadar_slurm.rates.memory import is_memory_size
from hadar_slurm.rates.table import ThroughputTable, load_tables
from hadar_slurm.slurm.version import tested_text

SECTIONS = ("slurm", "scheduler", "hadare", "sidecar", "metrics")
DEFAULTS_SOURCE = "<defaults>"
OVERRIDES_SOURCE = "<overrides>"

STATE_DIR_FIELD = "[sidecar] state_dir"
STATE_DIR_UNSET = ("is not set: the sidecar keeps its lock, last epoch, decisions and "
                   "throughput store there, and it has no default")
STATE_DIR_FIX = ('add state_dir = "/var/lib/hadar-slurm" under [sidecar], a directory of its '
                 "own for each sidecar")

BACKENDS = ("auto", "cli", "pyslurm")
LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Signals that cannot be caught, so no job could checkpoint on them.
UNCATCHABLE_SIGNALS = ("KILL", "STOP")


class _InvalidValueError(Exception):
    """A value failed its check: ``problem`` and an optional ``fix`` (turned into InputError)."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


Check = Callable[[object, Path], object]


@dataclass(frozen=True)
class ConfigKey:
    """One key of the config file: where it lives, what it takes, its default and what it does.

    ``default_text`` is the default written as a TOML value (the default config is parsed from
    it); ``attr`` is the :class:`SidecarConfig` field (``key`` unless given); ``check`` turns a
    parsed value into the field's value or raises.
    """

    section: str
    key: str
    type_name: str
    default_text: str
    help: str
    attr: str = ""
    check: Check = dataclasses.field(default=lambda v, _base: v, repr=False, compare=False)

    @property
    def name(self) -> str:
        """``[section] key``, as error messages and the docs name it."""
        return f"[{self.section}] {self.key}"

    @property
    def field_name(self) -> str:
        return self.attr or self.key


# -- value checks ----------------------------------------------------------------------------


def _show(value: object) -> str:
    """A value as it would be written in TOML (for "got ..." in messages)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, (datetime, date, time)):
        return f"the date/time {value.isoformat()}"
    if isinstance(value, os.PathLike):
        return json.dumps(os.fspath(value))
    if value is None:
        return "nothing"
    return repr(value)


def _seconds(*, allow_zero: bool) -> Check:
    bound = ">= 0" if allow_zero else "> 0"

    def check(value: object, _base: Path) -> float:
        try:
            return parse_seconds_value(value, positive=not allow_zero, text=False)
        except ValueError:
            raise _InvalidValueError(
                f"must be a number of seconds {bound}, got {_show(value)}") from None

    return check


def _auto_seconds(value: object, _base: Path) -> float | None:
    """``"auto"`` (None: derived from ``restart_s``) or a number of seconds >= 0."""
    if value == "auto":
        return None
    try:
        return parse_seconds_value(value, positive=False, text=False)
    except ValueError:
        raise _InvalidValueError(
            f'must be "auto" or a number of seconds >= 0, got {_show(value)}') from None


def _factor(value: object, _base: Path) -> float:
    problem = f"must be a number >= 1, got {_show(value)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _InvalidValueError(problem, "e.g. 3 (the default), or 1 for the plain estimates")
    factor = float(value)
    if not math.isfinite(factor) or factor < 1:
        raise _InvalidValueError(problem, "e.g. 3 (the default), or 1 for the plain estimates")
    return factor


def _tolerance(value: object, _base: Path) -> float:
    problem = f"must be a number from 0 to 1, got {_show(value)}"
    fix = "e.g. 0.05 (the default: 5% of the job's soonest time), or 0 to pin at once"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _InvalidValueError(problem, fix)
    tolerance = float(value)
    if not math.isfinite(tolerance) or not 0.0 <= tolerance <= 1.0:
        raise _InvalidValueError(problem, fix)
    return tolerance


def _gpu_memory(value: object, _base: Path) -> tuple[tuple[str, float], ...]:
    example = "e.g. gpu_memory_mib = { v100 = 32768, a100 = 81920 }"
    if not isinstance(value, dict):
        raise _InvalidValueError(f"must be a table of GPU type = MiB, got {_show(value)}",
                                 example)
    out: list[tuple[str, float]] = []
    for gpu, mib in value.items():
        if not is_memory_size(mib):
            raise _InvalidValueError(f"{gpu}: must be a size in MiB above 0, got {_show(mib)}",
                                     example)
        out.append((normalize_gpu_type(str(gpu)), float(mib)))
    return tuple(sorted(out))


def _bool(value: object, _base: Path) -> bool:
    if not isinstance(value, bool):
        raise _InvalidValueError(f"must be true or false, got {_show(value)}",
                                 "write a TOML boolean, unquoted: true or false")
    return value


def _choice(choices: tuple[str, ...]) -> Check:
    def check(value: object, _base: Path) -> str:
        problem = "must be one of " + ", ".join(json.dumps(c) for c in choices)
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise _InvalidValueError(f"{problem}, got {_show(value)}")
        return value.strip().lower()

    return check


def _resolve(path: str, base: Path) -> str:
    p = Path(path)
    return os.path.normpath(p if p.is_absolute() else base / p)


def _path_text(value: object, what: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise _InvalidValueError(f"must be {what} (a string), got {_show(value)}")
    return value


def _optional_path(value: object, base: Path) -> str | None:
    """A path, or unset: ``""`` in the file (TOML has no null), ``None`` as an override."""
    if value is None:
        return None
    text = _path_text(value, "a path")
    return _resolve(text, base) if text.strip() else None


def _not_a_file(path: str | None, fix: str) -> str | None:
    """``path`` (None: unset), which must not name an existing non-directory."""
    if path is not None and Path(path).exists() and not Path(path).is_dir():
        raise _InvalidValueError(f"{path} is not a directory", fix)
    return path


def _state_dir(value: object, base: Path) -> str | None:
    """The state directory; ``""`` (unset) is refused by :func:`parse_config` (no default)."""
    return _not_a_file(_optional_path(value, base), 'give a directory of its own for this '
                       'sidecar, e.g. "/var/lib/hadar-slurm"')


def _optional_dir(value: object, base: Path) -> str | None:
    """A directory path or unset (``""``); it must not name an existing non-directory."""
    return _not_a_file(_optional_path(value, base), 'give a directory shared by the nodes, or '
                       '"" for each job\'s working directory')


def _partition(value: object, _base: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _InvalidValueError(f"must be a partition name (a string), got {_show(value)}")
    name = value.strip()
    if not name:
        return None
    if re.search(r"[\s,]", name):
        raise _InvalidValueError(
            f"must be one partition name, got {_show(value)}",
            'give a single name without spaces or commas, or "" for all partitions',
        )
    return name


def _policy(value: object, _base: Path) -> str:
    known = ", ".join(sorted(REGISTRY))
    if not isinstance(value, str):
        raise _InvalidValueError(f"must be a policy name (a string), got {_show(value)}",
                                 f"known: {known}")
    name = value.strip().lower()
    if name not in REGISTRY:
        raise _InvalidValueError(f"unknown policy {_show(value)}", f"known: {known}")
    return name


def _signal(value: object, _base: Path) -> str:
    problem = f"must be a signal name such as USR1, USR2, TERM, INT, HUP, got {_show(value)}"
    if not isinstance(value, str):
        raise _InvalidValueError(problem)
    name = value.strip().upper()
    if name.startswith("SIG"):
        name = name[3:]
    if not name or f"SIG{name}" not in signal.Signals.__members__:
        raise _InvalidValueError(problem)
    if name in UNCATCHABLE_SIGNALS:
        raise _InvalidValueError(f"SIG{name} cannot be caught, so no job could checkpoint on it",
                                 "use a catchable signal such as USR1")
    return name


def _throughput_files(value: object, base: Path) -> tuple[str, ...]:
    if isinstance(value, (str, os.PathLike)):
        raise _InvalidValueError(f"must be a list of file paths, got {_show(value)}",
                                 f"write it as a list: [{_show(value)}]")
    if not isinstance(value, (list, tuple)):
        raise _InvalidValueError(f"must be a list of file paths, got {_show(value)}")
    paths: list[str] = []
    for item in value:
        text = _path_text(item, "a list of file paths")
        if not text.strip():
            raise _InvalidValueError("contains an empty path")
        path = _resolve(text, base)
        if not Path(path).is_file():
            what = "is not a file" if Path(path).exists() else "not found"
            raise _InvalidValueError(
                f"throughput file {path} {what}",
                "give an existing Gavel .json or a CSV with header "
                "job_type,scale_factor,gpu_type,steps_per_second",
            )
        paths.append(path)
    return tuple(paths)


_HOST_PORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+)):(?P<port>\d{1,5})$")


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6) as ``(host, port)``; port 0 picks a free
    one.  Raises :class:`ValueError` with the problem."""
    m = _HOST_PORT.match(text.strip())
    if m is None:
        raise ValueError(f"must be HOST:PORT such as \"127.0.0.1:9810\", got {_show(text)}")
    host = m.group("v6") or m.group("host")
    port = int(m.group("port"))
    if port > 65535:
        raise ValueError(f"port {port} is out of range (0-65535)")
    if m.group("v6"):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback IP literal (names are not resolved)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _metrics_address(value: object, _base: Path) -> str:
    if not isinstance(value, str):
        raise _InvalidValueError(f"must be HOST:PORT (a string), got {_show(value)}",
                                 'write it quoted, e.g. "127.0.0.1:9810", or "" to disable')
    if not value.strip():
        return ""
    try:
        parse_address(value)
    except ValueError as exc:
        raise _InvalidValueError(str(exc), 'e.g. "127.0.0.1:9810", or "" to disable') from None
    return value.strip()


# -- the schema ------------------------------------------------------------------------------

CONFIG_SCHEMA: tuple[ConfigKey, ...] = (
    ConfigKey(
        "slurm", "conf", "path", '""',
        "Path of slurm.conf, passed as SLURM_CONF to every Slurm command. "
        '"" (the default) uses $SLURM_CONF of the sidecar\'s environment.',
        attr="slurm_conf", check=_optional_path,
    ),
    ConfigKey(
        "slurm", "backend", "string", '"auto"',
        'How to talk to Slurm: "cli" (squeue/sinfo/scontrol/scancel), "pyslurm", or "auto" '
        "(pyslurm when it can be imported, else the CLI).",
        check=_choice(BACKENDS),
    ),
    ConfigKey(
        "slurm", "partition", "string", '""',
        'Steer only the hadar jobs of this partition. "" (the default) steers them in all '
        "partitions.",
        check=_partition,
    ),
    ConfigKey(
        "slurm", "command_timeout_s", "seconds", "30",
        "Time limit of one Slurm command, in seconds (> 0).",
        check=_seconds(allow_zero=False),
    ),
    ConfigKey(
        "scheduler", "policy", "string", '"hadar"',
        "Scheduling policy: " + ", ".join(sorted(REGISTRY)) + ".",
        check=_policy,
    ),
    ConfigKey(
        "scheduler", "epoch_seconds", "seconds", "360",
        "Length of one scheduling epoch (round), in seconds (> 0).",
        check=_seconds(allow_zero=False),
    ),
    ConfigKey(
        "scheduler", "reschedule_on_finish", "bool", "true",
        "Start the next epoch early, as soon as a job that was running at the last epoch has "
        "ended (or a job arrives while GPUs are free), rather than leave its GPUs idle until "
        "the epoch is over. The sidecar checks every finish_poll_s seconds with one light "
        "squeue (job ids and states only). Such an early epoch only gives out the free GPUs: "
        "it moves and stops no running job (the next regular epoch re-plans all), except that "
        "hadare may fork a running trial of a tuning study (fork=N) onto GPUs no waiting job "
        "fits in.",
        check=_bool,
    ),
    ConfigKey(
        "scheduler", "finish_poll_s", "seconds", "15",
        "How often, between epochs, the sidecar checks whether a running job has ended (> 0; "
        "used with reschedule_on_finish). Epochs are never closer together than this.",
        check=_seconds(allow_zero=False),
    ),
    ConfigKey(
        "scheduler", "preempt_grace_s", "seconds", "30",
        "Seconds between the checkpoint signal and the requeue of a preempted job (>= 0).",
        check=_seconds(allow_zero=True),
    ),
    ConfigKey(
        "scheduler", "restart_s", "seconds", f"{DEFAULT_RESTART_S:g}",
        "A job's own restart, in seconds (>= 0): its checkpoint on the signal, then its process "
        "start, framework import and checkpoint load until its first step. Part of what a move "
        "costs (migration_s).",
        check=_seconds(allow_zero=True),
    ),
    ConfigKey(
        "scheduler", "migration_s", 'seconds or "auto"', '"auto"',
        "What moving a running job costs it, in seconds of lost progress; the hadar policy "
        'weighs it against a faster GPU type (>= 0). "auto": restart_s plus the '
        f"{SLURM_MOVE_S:g} s that Slurm and the sidecar take from the job's exit to its start "
        "on its new GPUs (measured on the dev cluster; docs/architecture.md).",
        check=_auto_seconds,
    ),
    ConfigKey(
        "scheduler", "preempt_signal", "signal", '"USR1"',
        "Signal sent to a job before it is preempted, so that it can checkpoint: a name such "
        "as USR1, USR2, TERM, INT or HUP (the SIG prefix is optional).",
        check=_signal,
    ),
    ConfigKey(
        "scheduler", "throughputs", "list of paths", "[]",
        "Throughput tables (Gavel .json or CSV) merged, in order, over the bundled Gavel table; "
        "each must exist. Relative paths are resolved against this file's directory.",
        check=_throughput_files,
    ),
    ConfigKey(
        "scheduler", "throughput_db", "path", '""',
        "The throughput store (an SQLite file, shared with `hadar-slurm profile` and "
        "`hadar-slurm throughputs`): measured, learned, imported and estimated throughputs, "
        'used over the tables above. "" (the default) uses <state_dir>/throughputs.db. Keep '
        "it on a local file system (SQLite's locking is not safe over NFS). Relative paths are "
        "resolved against this file's directory.",
        check=_optional_path,
    ),
    ConfigKey(
        "scheduler", "learn_throughputs", "bool", "true",
        "Online learning: fold the iterations per second that running jobs achieve (reported "
        "by the training runtime in their tracker's progress.json) into the store, and plan "
        "with them from the next epoch on.",
        check=_bool,
    ),
    ConfigKey(
        "scheduler", "estimate_optimism", "number", "3",
        "While learn_throughputs is on, estimated throughputs (a job type never measured on a "
        "GPU type) are planned with this many times the estimate (>= 1), so that the policy "
        "tries the type and learns the true rate, rather than keeping jobs off it for good "
        "when the estimate is too low. 1 plans with the estimates as they are (also what is "
        "used when learning is off).",
        check=_factor,
    ),
    ConfigKey(
        "scheduler", "share", "bool", "false",
        "GPU sharing: let the policy (hadar, hadare) run two 1-GPU jobs on one GPU where the "
        "throughput table's co-located rates say the pair does more than taking turns. It "
        "needs Slurm 24.11 or later, the cli backend, a table with co-located rates (Gavel's "
        "JSON) and nodes whose GPUs are split into shards (gres/shard, 2 or more per GPU; "
        "only those nodes share). Jobs with the hint share=no never share. See "
        "docs/sharing.md.",
        check=_bool,
    ),
    ConfigKey(
        "scheduler", "gpu_memory_mib", "table", "{}",
        "Memory of one GPU of a type, in MiB, where it is not what hadar-slurm takes for it "
        "(the smallest variant commonly sold: 16384 for a v100, 40960 for an a100), e.g. { v100 "
        "= 32768 }. With share on, two jobs share a GPU only where their memory footprints "
        "(measured by `hadar-slurm profile`, learned from running jobs on CUDA) fit in it; "
        "see docs/sharing.md.",
        check=_gpu_memory,
    ),
    ConfigKey(
        "hadare", "tracker_root", "path", '""',
        "Where the job trackers of forked jobs (hint fork=N) live: job J's is "
        "<root>/.hadar-tracker/J, a directory the nodes share; the copies' progress, J's saved "
        'batch script and hints go there. "" (the default) uses each job\'s working directory, '
        "which is also where the job itself looks when it runs unforked after its copies; with "
        "another root the job's script must export HADAR_TRACKER_DIR=<root>/.hadar-tracker/"
        "$SLURM_JOB_ID, or its own runs start from their own progress and redo what its "
        "copies did.",
        check=_optional_dir,
    ),
    ConfigKey(
        "hadare", "consolidation_base_s", "seconds", f"{ConsolidationCost.base_s:g}",
        "What one consolidation of a forked job's copies costs (the tracker gathers and averages "
        "their models at the end of every round; they make no progress meanwhile): this many "
        "seconds plus consolidation_s_per_gb per GB of the model's parameters. hadare forks a "
        "job only where its copies gain net of that cost, and never where it takes half a "
        "round (epoch_seconds) or more. The defaults assume about 200 MB/s of effective "
        "bandwidth to the tracker; measure yours.",
        check=_seconds(allow_zero=True),
    ),
    ConfigKey(
        "hadare", "consolidation_s_per_gb", "seconds", f"{ConsolidationCost.s_per_gb:g}",
        "Seconds a consolidation of a forked job takes per GB of the model's parameters (see "
        "consolidation_base_s).",
        check=_seconds(allow_zero=True),
    ),
    ConfigKey(
        "hadare", "pin_binding", "bool", "true",
        "Run the jobs that bind the makespan on their fastest copies: a forked job (hint "
        "fork=N) whose work, over its N fastest node-disjoint copies, takes longer than all "
        "the cluster's work spread over every GPU is what the last finish waits for, so once "
        "its deadline nears (its soonest end plus pin_tolerance) it runs on exactly those "
        "copies and the other jobs are planned on the GPUs left. Only a job at least as "
        "wide as every other job with work left may bind, and none does while a study has a "
        "trial with work left. Simulated on the regime suite, hadare's makespan is 0.4 to "
        "1.3% shorter in geometric mean and its average JCT within 0.7% of what it is "
        "without it. Set false to plan every job by Hadar's type split. Applies to policies "
        "that fork (hadare). See docs/algorithm.md, \"Jobs that bind the fork makespan\".",
        check=_bool,
    ),
    ConfigKey(
        "hadare", "pin_tolerance", "number", "0.05",
        "With pin_binding: how late, as a share of a binding job's soonest time (0 to 1), "
        "its end may come; until its deadline nears, the other jobs may go first. 0 pins "
        "the job from the epoch it first binds.",
        check=_tolerance,
    ),
    ConfigKey(
        "sidecar", "dry_run", "bool", "false",
        "Shadow mode: compute and log every decision but change nothing in Slurm.",
        check=_bool,
    ),
    ConfigKey(
        "sidecar", "state_dir", "path", '""',
        "Required (no default): the sidecar's own directory. It holds the lock that keeps a "
        "second sidecar off it (sidecar.lock), the last epoch number (epoch.json, so that "
        "epochs never go back after a restart), the last epoch's decisions (state.json, read by "
        "`hadar-slurm status` and `explain`), the book of the tuning studies it steers "
        "(studies.json: their trials' reports and verdicts) and, unless throughput_db says "
        "otherwise, the throughput store. Give each sidecar its own (a dry run too). Relative "
        "paths are "
        "resolved against this file's directory.",
        check=_state_dir,
    ),
    ConfigKey(
        "sidecar", "log_format", "string", '"json"',
        'Log line format: "json" (one JSON object per line) or "text".',
        check=_choice(LOG_FORMATS),
    ),
    ConfigKey(
        "sidecar", "log_file", "path", '""',
        'File to append the log to. "" (the default) logs to stderr (the journal under '
        "systemd).",
        check=_optional_path,
    ),
    ConfigKey(
        "sidecar", "log_level", "string", '"info"',
        'Least severe level logged: "debug", "info", "warning" or "error".',
        check=_choice(LOG_LEVELS),
    ),
    ConfigKey(
        "sidecar", "allow_untested_slurm", "bool", "false",
        "Run on a Slurm release series this hadar-slurm was not tested on. At start the "
        "sidecar reads the release (`scontrol version`; slurmctld's with pyslurm), logs it "
        "(slurm_version event) and, unless this is true, refuses to start (exit status 2) on "
        f"a series other than {tested_text()}.",
        check=_bool,
    ),
    ConfigKey(
        "metrics", "address", "string", '""',
        'Where the sidecar serves its Prometheus metrics (/metrics), as HOST:PORT, e.g. '
        '"127.0.0.1:9810"; port 0 picks a free port (logged in the start event). "" (the '
        "default) serves none. Only loopback hosts unless allow_remote is true.",
        attr="metrics_address", check=_metrics_address,
    ),
    ConfigKey(
        "metrics", "allow_remote", "bool", "false",
        "Allow a metrics address that is not loopback (the endpoint has no authentication).",
        attr="metrics_allow_remote", check=_bool,
    ),
)

_BY_SECTION: dict[str, dict[str, ConfigKey]] = {s: {} for s in SECTIONS}
for _k in CONFIG_SCHEMA:
    _BY_SECTION[_k.section][_k.key] = _k
_BY_FIELD: dict[str, ConfigKey] = {k.field_name: k for k in CONFIG_SCHEMA}


# -- the config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SidecarConfig:
    """The validated configuration (see :data:`CONFIG_SCHEMA` for what each field means)."""

    source: str
    slurm_conf: str | None
    backend: str
    partition: str | None
    command_timeout_s: float
    policy: str
    epoch_seconds: float
    reschedule_on_finish: bool
    share: bool
    gpu_memory_mib: tuple[tuple[str, float], ...]
    finish_poll_s: float
    preempt_grace_s: float
    restart_s: float
    migration_s: float | None
    preempt_signal: str
    throughputs: tuple[str, ...]
    throughput_db: str | None
    learn_throughputs: bool
    estimate_optimism: float
    tracker_root: str | None
    consolidation_base_s: float
    consolidation_s_per_gb: float
    pin_binding: bool
    pin_tolerance: float
    dry_run: bool
    state_dir: str | None
    log_format: str
    log_file: str | None
    log_level: str
    allow_untested_slurm: bool
    metrics_address: str
    metrics_allow_remote: bool

    @property
    def move_cost_s(self) -> float:
        """What a move costs a job, as the policy is told: ``migration_s``, or with ``"auto"``
        :class:`~hadar_slurm.costs.LiveCosts` of ``restart_s``."""
        if self.migration_s is not None:
            return self.migration_s
        return LiveCosts(self.restart_s).move_s

    @property
    def store_path(self) -> Path:
        """The throughput store: ``throughput_db``, else ``<state_dir>/throughputs.db``."""
        if self.throughput_db:
            return Path(self.throughput_db)
        return Path(self.require_state_dir()) / "throughputs.db"

    def require_state_dir(self) -> str:
        """``state_dir``, or a one-line error when it is not set (it has no default)."""
        if self.state_dir is None:
            raise InputError(STATE_DIR_UNSET, source=self.source, field=STATE_DIR_FIELD,
                             fix=STATE_DIR_FIX)
        return self.state_dir

    def with_overrides(self, **kw: object) -> SidecarConfig:
        """A copy with some fields replaced (e.g. from command line flags), validated as in the
        file; relative paths are resolved against the current directory.  ``None`` unsets the
        optional fields (``slurm_conf``, ``partition``, ``tracker_root``, ``log_file``)."""
        unknown = sorted(set(kw) - set(_BY_FIELD) - {"source"})
        if unknown:
            raise TypeError(
                f"unknown SidecarConfig field(s): {', '.join(unknown)} "
                f"(known: {', '.join(_BY_FIELD)})"
            )
        values: dict[str, object] = {}
        base = Path.cwd()
        for name, value in kw.items():
            if name == "source":
                if not isinstance(value, str):
                    raise TypeError(f"source must be a str, got {value!r}")
                values[name] = value
                continue
            key = _BY_FIELD[name]
            values[name] = _checked(key, value, base, source=OVERRIDES_SOURCE, line=None)
        config = dataclasses.replace(self, **values)  # type: ignore[arg-type]
        _check_metrics_host(config, OVERRIDES_SOURCE, None)
        return config


def _check_metrics_host(config: SidecarConfig, source: str, line: int | None) -> None:
    """A metrics address that is not loopback needs ``allow_remote = true``."""
    if not config.metrics_address or config.metrics_allow_remote:
        return
    host, port = parse_address(config.metrics_address)
    if not is_loopback(host):
        raise InputError(
            f"{host} is not a loopback address: the metrics (no authentication) would be "
            "served to the network", source=source, line=line, field="[metrics] address",
            fix=f'use "127.0.0.1:{port}" (scrape it through a local agent or an SSH tunnel), '
            "or set [metrics] allow_remote = true to serve it on purpose")


def _checked(
    key: ConfigKey, value: object, base: Path, *, source: str, line: int | None
) -> object:
    try:
        return key.check(value, base)
    except _InvalidValueError as exc:
        raise InputError(exc.problem, source=source, line=line, field=key.name,
                         fix=exc.fix) from None


def _build(values: Mapping[str, object], source: str) -> SidecarConfig:
    return SidecarConfig(source=source, **values)  # type: ignore[arg-type]


def _default_values() -> dict[str, object]:
    values: dict[str, object] = {}
    for key in CONFIG_SCHEMA:
        parsed = tomllib.loads(f"v = {key.default_text}")["v"]
        values[key.field_name] = _checked(key, parsed, Path("/"), source=DEFAULTS_SOURCE,
                                          line=None)
    return values


def default_config() -> SidecarConfig:
    """The configuration with every key at its default (``source`` is ``"<defaults>"``)."""
    return _build(_default_values(), DEFAULTS_SOURCE)


# -- parsing ---------------------------------------------------------------------------------

_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_AT_END = re.compile(r"\s*\(at end of document\)\s*$")
_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"""^\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*=""")


def _locate(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """Best-effort line numbers: of each ``[section]`` header and of each ``[section] key``.

    Only plain ``[section]`` headers and ``key = ...`` lines are found (enough for the messages;
    an unusual spelling just gives a message without a line)."""
    sections: dict[str, int] = {}
    keys: dict[str, int] = {}
    current = ""
    for n, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header and not line.lstrip().startswith("[["):
            current = header.group(1).strip().strip('"').strip("'")
            sections.setdefault(current, n)
            continue
        key = _KEY.match(line)
        if key:
            name = next(g for g in key.groups() if g is not None)
            keys.setdefault(f"[{current}] {name}" if current else name, n)
    return sections, keys


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


def parse_config(text: str, source: str, base_dir: Path) -> SidecarConfig:
    """Parse and validate a config file's text; relative paths are resolved against
    ``base_dir``.  Absent keys take their defaults, except ``[sidecar] state_dir``, which
    has none (every sidecar needs a directory of its own): a file without it is refused."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        line: int | None = None
        at = _TOML_AT.search(msg)
        if at:
            line = int(at.group(1))
            msg = f"{msg[:at.start()]} (column {at.group(2)})"
        elif _TOML_AT_END.search(msg):
            line = max(1, len(text.splitlines()))
            msg = _TOML_AT_END.sub(" (at end of file)", msg)
        raise InputError(f"invalid TOML: {msg}", source=source, line=line,
                         fix="see https://toml.io for the syntax") from None
    section_lines, key_lines = _locate(text)
    values = _default_values()
    known_sections = [f"[{s}]" for s in SECTIONS]
    for section, table in data.items():
        if section not in _BY_SECTION:
            if not isinstance(table, dict):
                raise InputError(
                    "key outside any section", source=source, line=key_lines.get(section),
                    field=section,
                    fix="put every key under one of " + ", ".join(known_sections),
                )
            raise InputError(
                "unknown section", source=source, line=section_lines.get(section),
                field=f"[{section}]",
                fix=_suggest(f"[{section}]", known_sections) + "known: "
                + ", ".join(known_sections),
            )
        if not isinstance(table, dict):
            raise InputError(
                f"must be a section, got {_show(table)}", source=source,
                line=key_lines.get(section), field=section,
                fix=f"write it as a [{section}] header followed by its keys",
            )
        schema = _BY_SECTION[section]
        for key_name, value in table.items():
            label = f"[{section}] {key_name}"
            key = schema.get(key_name)
            if key is None:
                known = list(schema)
                raise InputError(
                    "unknown key", source=source, line=key_lines.get(label), field=label,
                    fix=_suggest(key_name, known) + "known: " + ", ".join(known),
                )
            values[key.field_name] = _checked(key, value, base_dir, source=source,
                                              line=key_lines.get(label))
    config = _build(values, source)
    _check_metrics_host(config, source, key_lines.get("[metrics] address"))
    if config.state_dir is None:
        raise InputError(STATE_DIR_UNSET, source=source,
                         line=key_lines.get(STATE_DIR_FIELD, section_lines.get("sidecar")),
                         field=STATE_DIR_FIELD, fix=STATE_DIR_FIX)
    return config


def load_config(path: str | Path) -> SidecarConfig:
    """Read and validate the TOML config file at ``path`` (see :func:`parse_config`)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(
            f"cannot read config file: {exc.strerror or exc}", source=source,
            fix="give the path of a TOML file such as slurm_conf/hadar-slurm.toml",
        ) from None
    except UnicodeDecodeError:
        raise InputError("config file is not UTF-8 text", source=source,
                         fix="save it as UTF-8") from None
    return parse_config(text, source, Path(path).absolute().parent)


def load_table_for(config: SidecarConfig) -> ThroughputTable:
    """The bundled Gavel table with ``config.throughputs`` merged over it, in order, and the
    GPU memory sizes of ``config.gpu_memory_mib``."""
    table = load_tables(config.throughputs)
    if config.gpu_memory_mib:
        table = dataclasses.replace(table, memory=table.memory.with_gpu_memory(
            dict(config.gpu_memory_mib), config.source))
    return table


# -- docs ------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_config_reference() -> str:
    """The reference of every config key, as a Markdown table (for the admin docs)."""
    lines = [
        "| Section | Key | Type | Default | Description |",
        "|---|---|---|---|---|",
    ]
    for key in CONFIG_SCHEMA:
        lines.append(
            f"| `[{key.section}]` | `{key.key}` | {_md_cell(key.type_name)} | "
            f"`{_md_cell(key.default_text)}` | {_md_cell(key.help)} |"
        )
    return "\n".join(lines) + "\n"


__all__ = [
    "CONFIG_SCHEMA",
    "ConfigKey",
    "SidecarConfig",
    "default_config",
    "is_loopback",
    "load_config",
    "load_table_for",
    "parse_address",
    "parse_config",
    "render_config_reference",
]
