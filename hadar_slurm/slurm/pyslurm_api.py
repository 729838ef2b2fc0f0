"""A thin :class:`~hadar_slurm.slurm.api.SlurmApi` over pyslurm (the 25.11 API), and the choice
of backend (:func:`make_api`).

pyslurm talks to slurmctld through libslurm, so it saves the fork/exec and JSON round trip of the
CLI, but a pyslurm release builds and runs only against the Slurm release of the same
major.minor (pyslurm 25.11.x needs Slurm 25.11).  This module therefore imports pyslurm lazily,
in :class:`PyslurmApi`; it imports fine without pyslurm, and :func:`make_api` falls back to the
CLI (``"auto"``) when pyslurm cannot be imported.

**Tested against a fake, not a real pyslurm.**  pyslurm 25.11 cannot be installed where this was
written (Debian's Slurm 22.05), so the mapping is unit-tested against a fake module shaped after
pyslurm's own source (repository PySlurm/pyslurm): ``pyslurm/core/job/job.pyx`` (``Jobs.load``,
``Job`` and its ``modify``/``hold``/``release``/``requeue``/``send_signal``/``cancel``),
``pyslurm/core/job/submission.pyx`` (``JobSubmitDescription``), ``pyslurm/core/node.pyx``
(``Nodes.load``, ``Node``), ``pyslurm/utils/cstr.pyx`` (``to_gres_dict``, ``to_list``),
``pyslurm/utils/ctime.pyx`` / ``uint.pyx`` (None for unset numbers, ``"UNLIMITED"``),
``pyslurm/core/error.pyx`` (``RPCError`` with ``errno`` and ``msg``) and
``pyslurm/xcollections.pyx`` (``Jobs``/``Nodes`` are multi-cluster maps: iterate ``values()``).

Mapping (each pyslurm object to what the CLI parsers of :mod:`hadar_slurm.slurm.parse` give):

- Job: ``id``, ``name``, ``user_name`` (else ``user_id``), ``state``, ``state_reason``,
  ``partition``, ``allocated_nodes`` (expanded into ``node_names``), ``gres_per_node`` (a dict
  ``{"gpu:v100": 2}``; ``gres/``/``gres:`` prefixes of newer Slurm are dropped), ``constraints``
  (a list, joined with ``,``), ``comment``, ``admin_comment``, ``priority``, ``submit_time``,
  ``start_time``, ``time_limit`` (minutes), ``user_id``, ``group_id``, ``working_directory``,
  ``het_job_id``, ``het_job_offset``, ``account``, ``qos``, ``memory_per_node``,
  ``memory_per_cpu``, ``min_cpus_per_node``.
- Node: ``name``, ``state`` (``"MIXED+DRAIN"``: base and flags), ``configured_gres``,
  ``allocated_gres`` (values may be ``{"count": n, "indexes": ...}``), ``available_features``,
  ``active_features``, ``total_cpus``, ``allocated_cpus``, ``real_memory``, ``partitions``.

Known differences from the CLI, all from pyslurm itself:

- ``Job.state`` is Slurm's ``job_state_string``: a state flag, when set, replaces the base state
  (``"REQUEUE_HOLD"`` instead of ``PENDING`` + flag).  Flags whose base state is certain are
  mapped back (``REQUEUED``, ``REQUEUE_HOLD``, ``REQUEUE_FED``, ``SPECIAL_EXIT``,
  ``RESV_DEL_HOLD`` -> ``PENDING``; ``CONFIGURING``, ``RESIZING``, ``STOPPED`` -> ``RUNNING``), as
  ``squeue --json`` of Slurm 23.02+ reports them; others (``COMPLETING``, ``STAGE_OUT``,
  ``SIGNALING``, ``REVOKED``) stay as the state, as on Slurm 22.05.
- ``Job.state_reason`` is the reason's description when Slurm set one (``state_desc``), else the
  reason code (``"JobHeldUser"``); ``squeue --json`` always gives the code.  slurmctld's hold
  after a failed launch (``"launch failed requeued held"``) is read back as ``JobHeldUser`` with
  that description, as ``squeue --json`` gives it; other descriptions stay in place of the code.
- pyslurm cannot submit a batch script as another user nor hand out a pending job's script,
  so HadarE forks go through the Slurm CLI: :meth:`PyslurmApi.batch_script` and
  :meth:`PyslurmApi.submit_as` are the :class:`~hadar_slurm.slurm.api.CliApi`'s (``scontrol
  write batch_script``, ``sbatch`` as the owner), over a runner made on first use from
  ``fork_runner`` (:func:`make_api` passes its ``runner_factory``).  Without ``fork_runner``
  :attr:`PyslurmApi.can_fork` is False and the sidecar never offers the policy more than one
  copy of a job.  Ending a fork stays in pyslurm (``signal_steps`` is
  ``send_signal(steps="children")``, every step but the batch step).
- :meth:`PyslurmApi.slurm_version` is slurmctld's (``pyslurm.slurmctld.Config.load().version``,
  ``pyslurm/core/slurmctld/config.pyx``); ``scontrol version`` gives the client's.  When its
  series is not the one this pyslurm was built for (``__version__``'s ``major.minor``), it
  raises :class:`PyslurmMismatchError`, as :func:`make_api` does when pyslurm cannot be
  imported: one line with what was found, what pyslurm needs, and the fix (the CLI backend).
- :meth:`PyslurmApi.update_job` cannot set ``NumNodes`` (``JobSubmitDescription`` ignores
  ``nodes`` on update) nor clear a field (an empty value means "unchanged" in pyslurm); both raise
  :class:`PyslurmUnsupportedError` before anything is sent.
"""

from __future__ import annotations

import importlib
import re
import signal as _signal
from collections.abc import Callable, Mapping
from typing import Any

from hadar_slurm.slurm.api import UPDATE_FIELDS, CliApi, SlurmApi, array_refs, task_refs
from hadar_slurm.slurm.errors import (
    SlurmCommandError,
    SlurmConfigError,
    SlurmError,
    SlurmParseError,
)
from hadar_slurm.slurm.parse import (
    FINAL_STATES,
    LAUNCH_FAILED_HELD,
    Gres,
    SlurmJob,
    SlurmNode,
    array_fields,
    expand_hostlist,
    parse_gres,
)
from hadar_slurm.slurm.runner import RunAs, SlurmRunner, write_files_as
from hadar_slurm.slurm.schedconf import SchedulerConfig
from hadar_slurm.slurm.version import SlurmVersion, parse_release, tested_text

__all__ = [
    "BACKENDS",
    "PYSLURM_SERIES",
    "PyslurmApi",
    "PyslurmMismatchError",
    "PyslurmUnsupportedError",
    "make_api",
    "pyslurm_available",
]

#: Values of the ``backend`` argument of :func:`make_api`.
BACKENDS = ("auto", "cli", "pyslurm")

SOURCE = "pyslurm"

#: The pyslurm release series this backend is written for; it needs the Slurm of that series.
PYSLURM_SERIES = "25.11"

#: Job state flags that pyslurm reports instead of the base state, with that base state (the
#: flag is set only on jobs of that base state); see Slurm's ``job_state_string``.
_JOB_FLAG_BASE = {
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "SPECIAL_EXIT": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "CONFIGURING": "RUNNING",
    "RESIZING": "RUNNING",
    "STOPPED": "RUNNING",
}

#: ``scontrol update`` field -> ``pyslurm.JobSubmitDescription`` attribute (submission.pyx).
_UPDATE_ATTRS = {
    "NodeList": "required_nodes",
    "Features": "constraints",
    "AdminComment": "admin_comment",
    "TresPerNode": "gres_per_node",
    "Dependency": "dependencies",  # a string as scontrol takes it ("afterany:42")
    "StartTime": "begin_time",  # "now", or a time as scontrol takes it
}



class PyslurmUnsupportedError(SlurmConfigError, ValueError):
    """A request that pyslurm cannot express (use the ``cli`` backend for it)."""


class PyslurmMismatchError(SlurmConfigError):
    """The pyslurm backend cannot work here (pyslurm cannot be imported, or it is not built for
    the Slurm that answers): one line with ``found``, what pyslurm needs, and the fix."""

    #: The config key to fix, for the CLI's one-line error.
    field = "[slurm] backend"

    def __init__(self, found: str) -> None:
        self.found = found
        super().__init__(
            f"{found}; the pyslurm backend is written for pyslurm {PYSLURM_SERIES}, which "
            f"builds and runs only against Slurm {PYSLURM_SERIES} (fix: set backend = \"cli\" "
            f"under [slurm]: the default CLI backend, tested with Slurm {tested_text()})")


# ------------------------------------------------------------------------------ import


def pyslurm_available() -> bool:
    """True when ``import pyslurm`` works here."""
    try:
        importlib.import_module("pyslurm")
    except (ImportError, OSError):
        return False
    return True


def _import_pyslurm() -> Any:
    try:
        return importlib.import_module("pyslurm")
    except (ImportError, OSError) as exc:
        raise PyslurmMismatchError(
            f"pyslurm cannot be imported ({type(exc).__name__}: {exc})") from exc


def _slurm_found(runner_factory: Callable[[], SlurmRunner]) -> str:
    """``"Slurm 24.11.5 found"`` (``scontrol version``), or ``""`` when the CLI cannot say."""
    try:
        return f"Slurm {CliApi(runner_factory()).slurm_version().release} found"
    except SlurmError:
        return ""


def make_api(backend: str, runner_factory: Callable[[], SlurmRunner]) -> SlurmApi:
    """The :class:`SlurmApi` for ``backend``: ``"pyslurm"`` (:class:`PyslurmApi`; a
    :class:`PyslurmMismatchError` naming the Slurm found when pyslurm cannot be imported),
    ``"cli"`` (:class:`CliApi` over ``runner_factory()``) or ``"auto"`` (pyslurm when it
    imports, else the CLI).  ``runner_factory`` is called when the CLI is chosen, by pyslurm's
    backend the first time it forks a job (HadarE's forks go through the CLI), and for
    ``scontrol version`` when pyslurm cannot be imported."""
    if backend == "pyslurm":
        try:
            return PyslurmApi(fork_runner=runner_factory)
        except PyslurmMismatchError as exc:
            found = _slurm_found(runner_factory)
            if not found:
                raise
            raise PyslurmMismatchError(f"{found}, but {exc.found}") from exc
    if backend == "cli":
        return CliApi(runner_factory())
    if backend == "auto":
        if pyslurm_available():
            return PyslurmApi(fork_runner=runner_factory)
        return CliApi(runner_factory())
    raise ValueError(f"unknown Slurm backend {backend!r}: expected one of {', '.join(BACKENDS)}")


# ------------------------------------------------------------------------------ the API


class PyslurmApi:
    """:class:`~hadar_slurm.slurm.api.SlurmApi` over pyslurm 25.11 (see the module docstring
    for the mapping and its limits).  ``module`` replaces ``import pyslurm`` (tests inject a
    fake); every pyslurm call counts in :attr:`commands`, and a ``pyslurm.RPCError`` is raised
    as :class:`SlurmCommandError` naming the call, e.g. ``("pyslurm", "Job.hold", "123")``."""

    name = "pyslurm"

    def __init__(self, module: Any = None,
                 fork_runner: Callable[[], SlurmRunner] | None = None) -> None:
        self._pyslurm: Any = _import_pyslurm() if module is None else module
        self._calls = 0  # pyslurm calls; the fork CLI's commands are counted by it
        self.version = str(getattr(self._pyslurm, "__version__", "unknown"))
        self._errors = _error_types(self._pyslurm)
        self._fork_runner = fork_runner
        self._cli: CliApi | None = None
        #: Array tasks named ``A_T`` (:func:`~hadar_slurm.slurm.api.task_refs`): pyslurm's
        #: ``Job(id)`` would name the whole array, so their actions go through the CLI.
        self.task_refs: dict[int, str] = {}
        #: Every array task as ``A_T``: cancelled through the CLI (:func:`array_refs`).
        self.array_refs: dict[int, str] = {}

    @property
    def commands(self) -> int:
        """pyslurm calls plus the Slurm commands of forks (through the CLI)."""
        return self._calls + (self._cli.commands if self._cli is not None else 0)

    @property
    def can_fork(self) -> bool:
        """HadarE forks need the batch script and a submission as the job's owner, which go
        through the CLI: possible when a runner for it was given."""
        return self._fork_runner is not None

    def scheduler_config(self) -> SchedulerConfig:
        """Through the CLI, as forks go (only a forking sidecar asks)."""
        return self._fork_cli("scontrol show config").scheduler_config()

    def _fork_cli(self, what: str) -> CliApi:
        if self._fork_runner is None:
            raise PyslurmUnsupportedError(
                f"{what}: this pyslurm backend was made without a Slurm CLI runner, and forks "
                "(HadarE) go through the CLI; use make_api() or the 'cli' backend")
        if self._cli is None:
            self._cli = CliApi(self._fork_runner())
        return self._cli

    def _task_cli(self, job_id: int) -> CliApi | None:
        """The CLI for an action on ``job_id`` when it is an array task named ``A_T``."""
        if job_id not in self.task_refs:
            return None
        cli = self._fork_cli(f"array task {self.task_refs[job_id]}")
        cli.task_refs = self.task_refs
        return cli

    def _call(self, what: tuple[str, ...], fn: Callable[[], Any]) -> Any:
        self._calls += 1
        try:
            return fn()
        except self._errors as exc:
            raise SlurmCommandError(what, f"failed: {_describe(exc)}") from exc

    # reads

    def slurm_version(self) -> SlurmVersion:
        """slurmctld's release; :class:`PyslurmMismatchError` when this pyslurm is not built for
        its series."""
        config_cls = getattr(getattr(self._pyslurm, "slurmctld", None), "Config", None)
        if config_cls is None:
            raise PyslurmMismatchError(
                f"pyslurm {self.version} has no slurmctld.Config (pyslurm "
                f"{PYSLURM_SERIES} has it)")
        config = self._call((SOURCE, "slurmctld.Config.load"), lambda: config_cls.load())
        found = parse_release(str(getattr(config, "version", None)),
                              source=f"{SOURCE} slurmctld.Config")
        built = re.match(r"\d+\.\d+", self.version)
        if built is None or built.group() != found.series:
            raise PyslurmMismatchError(
                f"pyslurm {self.version} (built for Slurm "
                f"{built.group() if built else 'unknown'}) talks to slurmctld of Slurm "
                f"{found.release}")
        return found

    def read_jobs(self) -> list[SlurmJob]:
        jobs = self._call((SOURCE, "Jobs.load"), lambda: self._pyslurm.Jobs.load())
        out = [_job(j) for j in _values(jobs)]
        self.task_refs = task_refs(out)
        self.array_refs = array_refs(out)
        return out

    def read_nodes(self) -> list[SlurmNode]:
        nodes = self._call((SOURCE, "Nodes.load"), lambda: self._pyslurm.Nodes.load())
        return [_node(n) for n in _values(nodes)]

    def live_job_ids(self) -> frozenset[int]:
        # (pyslurm has no lighter query than loading every job; it is in-process, no fork)
        return frozenset(j.job_id for j in self.read_jobs() if j.state not in FINAL_STATES)

    # actions

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        if (cli := self._task_cli(job_id)) is not None:
            return cli.update_job(job_id, fields)
        jid = _job_id(job_id)
        unknown = set(fields) - set(UPDATE_FIELDS)
        if unknown:
            raise ValueError(f"update_job: unsupported fields {sorted(unknown)}")
        if not fields:
            raise ValueError("update_job needs at least one field")
        changes: dict[str, object] = {}
        for key, value in fields.items():
            if key == "NumNodes":
                raise PyslurmUnsupportedError(
                    f"update_job {jid}: pyslurm cannot change NumNodes of a job "
                    "(JobSubmitDescription ignores 'nodes' on update); use the 'cli' backend")
            if "\0" in value:
                raise ValueError(f"update_job {jid}: {key} contains a NUL byte: {value!r}")
            if not value.strip():
                raise PyslurmUnsupportedError(
                    f"update_job {jid}: pyslurm cannot clear {key} (an empty value leaves it "
                    "unchanged); use the 'cli' backend")
            if key == "TresPerNode":
                changes[_UPDATE_ATTRS[key]] = _gres_request(jid, value)
            else:
                changes[_UPDATE_ATTRS[key]] = value
        what = (SOURCE, "Job.modify", jid, *(f"{k}={v}" for k, v in fields.items()))
        desc = self._pyslurm.JobSubmitDescription(**changes)
        self._call(what, lambda: self._pyslurm.Job(job_id).modify(desc))

    def hold(self, job_id: int) -> None:
        if (cli := self._task_cli(job_id)) is not None:
            return cli.hold(job_id)
        # pyslurm's default is an admin hold (priority 0, JobHeldAdmin), as `scontrol hold`
        # run by the operator.
        self._job_action(job_id, "hold", lambda job: job.hold())

    def release(self, job_id: int) -> None:
        if (cli := self._task_cli(job_id)) is not None:
            return cli.release(job_id)
        self._job_action(job_id, "release", lambda job: job.release())

    def split_array_task(self, array_job_id: int, task_id: int, admin_comment: str) -> None:
        # (pyslurm's Job(id) takes an int: a task of an unsplit array has no id of its own yet,
        # so this goes through the CLI, as forks do)
        self._fork_cli(f"split array task {array_job_id}_{task_id}").split_array_task(
            array_job_id, task_id, admin_comment)

    def requeue_hold(self, job_id: int) -> None:
        if (cli := self._task_cli(job_id)) is not None:
            return cli.requeue_hold(job_id)
        # (a plain requeue, then the operator's hold: SlurmApi.requeue_hold says why)
        self._job_action(job_id, "requeue", lambda job: job.requeue(hold=False), "hold=False")
        self.hold(job_id)

    def signal(self, job_id: int, signal: str) -> None:
        if (cli := self._task_cli(job_id)) is not None:
            return cli.signal(job_id, signal)
        sig = _signal_name(signal)
        # steps="all" is KILL_FULL_JOB: the batch script and every step (`scancel --full`).
        self._job_action(
            job_id, "send_signal", lambda job: job.send_signal(sig, steps="all"), sig,
            "steps=all")

    def cancel(self, job_id: int) -> None:
        if job_id in self.array_refs:
            via = self._fork_cli(f"array task {self.array_refs[job_id]}")
            via.array_refs = self.array_refs
            return via.cancel(job_id)
        self._job_action(job_id, "cancel", lambda job: job.cancel())

    def signal_steps(self, job_id: int, signal: str) -> None:
        if (cli := self._task_cli(job_id)) is not None:
            return cli.signal_steps(job_id, signal)
        sig = _signal_name(signal)
        # steps="children": every step but the batch step (`scancel --signal` without --full).
        self._job_action(
            job_id, "send_signal", lambda job: job.send_signal(sig, steps="children"), sig,
            "steps=children")

    def batch_script(self, job_id: int) -> str:
        cli = self._task_cli(job_id) or self._fork_cli(f"batch_script {job_id}")
        return cli.batch_script(job_id)

    def write_files(self, owner: RunAs, directory: str, files: Mapping[str, str]) -> None:
        write_files_as(owner, directory, files)

    def submit_as(self, script: str, owner: RunAs, *, dependency: str | None = None) -> int:
        return self._fork_cli(f"submit {script}").submit_as(script, owner,
                                                            dependency=dependency)

    def _job_action(
        self, job_id: int, method: str, act: Callable[[Any], object], *args: str,
    ) -> None:
        what = (SOURCE, f"Job.{method}", _job_id(job_id), *args)
        self._call(what, lambda: act(self._pyslurm.Job(job_id)))


# ------------------------------------------------------------------------------ helpers


def _error_types(module: Any) -> tuple[type[BaseException], ...]:
    """pyslurm's exception classes: ``RPCError`` (and its base ``PyslurmError`` where there
    is one)."""
    out: list[type[BaseException]] = []
    for attr in ("RPCError", "PyslurmError"):
        cls = getattr(module, attr, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            out.append(cls)
    return tuple(out)


def _describe(exc: BaseException) -> str:
    msg = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
    errno = getattr(exc, "errno", None)
    if isinstance(errno, int) and not isinstance(errno, bool):
        return f"{msg} (slurm errno {errno})"
    return str(msg)


def _job_id(job_id: int) -> str:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
        raise ValueError(f"job id must be a positive int, got {job_id!r}")
    return str(job_id)


def _signal_name(signal: str) -> str:
    """``USR1``/``SIGUSR1``/``10`` -> what pyslurm's ``signal_to_num`` takes (``SIGUSR1``,
    ``10``): it looks names up in :class:`signal.Signals`, which needs the ``SIG`` prefix."""
    text = str(signal).strip().upper()
    if text.isdigit():
        return text
    name = text if text.startswith("SIG") else f"SIG{text}"
    if name not in _signal.Signals.__members__:
        raise ValueError(f"unknown signal {signal!r}")
    return name


def _gres_request(job_id: str, value: str) -> dict[str, int]:
    """``gres:gpu:v100:2`` (any form :func:`parse_gres` reads) -> ``{"gpu:v100": 2}``, the dict
    ``JobSubmitDescription.gres_per_node`` takes."""
    items = parse_gres(value, source=f"update_job {job_id}", field="TresPerNode")
    if not items:
        raise PyslurmUnsupportedError(
            f"update_job {job_id}: pyslurm cannot clear TresPerNode ({value!r}); "
            "use the 'cli' backend")
    out: dict[str, int] = {}
    for g in items:
        key = f"{g.name}:{g.type}" if g.type else g.name
        out[key] = out.get(key, 0) + g.count
    return out


def _values(collection: Any) -> list[Any]:
    """The objects of a pyslurm collection: ``Jobs``/``Nodes`` are multi-cluster maps whose
    ``values()`` yields the objects of every cluster (iterating them yields keys); older
    ``Nodes`` were lists."""
    values = getattr(collection, "values", None)
    return list(values() if callable(values) else collection)


class _Reader:
    """Typed reads of one pyslurm object's attributes; errors name the object and attribute.

    A missing attribute reads as None (neutral defaults, as the CLI parsers give for missing
    keys); an attribute whose pyslurm property raises becomes a :class:`SlurmParseError`."""

    def __init__(self, obj: Any, what: str) -> None:
        self.obj = obj
        self.what = what

    def error(self, attr: str, problem: str) -> SlurmParseError:
        return SlurmParseError(f"{SOURCE}: {self.what}", attr, problem)

    def get(self, attr: str) -> object:
        try:
            value: object = getattr(self.obj, attr, None)
        except Exception as exc:  # a pyslurm property that cannot parse Slurm's value
            raise self.error(attr, f"pyslurm raised {type(exc).__name__}: {exc}") from exc
        return value

    def text(self, attr: str) -> str:
        value = self.get(attr)
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return ",".join(value)  # cstr.to_list splits Slurm's comma-separated strings
        raise self.error(attr, f"expected a string, got {type(value).__name__} {value!r}")

    def strings(self, attr: str) -> tuple[str, ...]:
        value = self.get(attr)
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(v for v in (s.strip() for s in value.split(",")) if v)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(v for v in value if v)
        raise self.error(attr, f"expected a list of strings, got {value!r}")

    def number(self, attr: str) -> int | None:
        """An int, or None for unset (None) and unlimited (``"UNLIMITED"``, uint.pyx)."""
        value = self.get(attr)
        if value is None:
            return None
        if isinstance(value, bool):
            raise self.error(attr, f"expected a number, got a boolean {value}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value == int(value):
            return int(value)
        if isinstance(value, str):
            if value.isdigit():
                return int(value)
            if value.upper() in ("UNLIMITED", "INFINITE"):
                return None
        raise self.error(attr, f"expected a number, got {type(value).__name__} {value!r}")

    def gres(self, attr: str) -> tuple[Gres, ...]:
        return _gres(self.get(attr), self, attr)


def _gres(value: object, reader: _Reader, attr: str) -> tuple[Gres, ...]:
    """pyslurm's gres dict (``cstr.to_gres_dict``): ``{"gpu:v100": 2, "gpu": 1}``, values
    ``{"count": n, "indexes": ...}`` for allocated gres, keys ``gres/gpu:v100`` from the TRES
    strings of newer Slurm; also objects with ``count`` and a plain gres string."""
    if value is None:
        return ()
    if isinstance(value, str):
        return parse_gres(value, source=f"{SOURCE}: {reader.what}", field=attr)
    if not isinstance(value, Mapping):
        raise reader.error(attr, f"expected a gres dict, got {type(value).__name__} {value!r}")
    out: list[Gres] = []
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise reader.error(attr, f"bad gres key {key!r}")
        name = key
        for prefix in ("gres/", "gres:"):
            if name.startswith(prefix):
                name = name[len(prefix):]
        name, _, type_ = name.partition(":")
        if isinstance(item, Mapping):
            count = item.get("count")
        elif isinstance(item, int | str):
            count = item
        else:  # an object with a count (newer pyslurm's gres layout objects)
            count = getattr(item, "count", None)
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int):
            raise reader.error(attr, f"bad count {item!r} of gres {key!r}")
        out.append(Gres(name, type_ or None, count))
    return tuple(out)


def _job_state(raw: str, reader: _Reader) -> tuple[str, tuple[str, ...]]:
    state = raw.strip().upper()
    if not state:
        raise reader.error("state", "missing or empty")
    base = _JOB_FLAG_BASE.get(state)
    return (state, ()) if base is None else (base, (state,))


def _job(job: Any) -> SlurmJob:
    r = _Reader(job, "job")
    job_id = r.number("id")
    if job_id is None:
        raise r.error("id", "missing")
    r.what = f"job {job_id}"
    state, flags = _job_state(r.text("state"), r)
    try:
        user = r.text("user_name")
    except SlurmParseError:  # uid_to_name of a user that no longer exists (pyslurm < 25.11)
        user = ""
    if not user:
        uid = r.number("user_id")
        user = "" if uid is None else str(uid)
    nodes = r.text("allocated_nodes")
    # pyslurm gives the reason's description in place of its code when Slurm set one: the one
    # the sidecar acts on (slurmctld's hold after a failed launch) is given its code back
    reason, desc = r.text("state_reason"), ""
    if reason == LAUNCH_FAILED_HELD:
        reason, desc = "JobHeldUser", LAUNCH_FAILED_HELD
    return SlurmJob(
        job_id=job_id,
        name=r.text("name"),
        user=user,
        state=state,
        state_flags=flags,
        state_reason=reason,
        partition=r.text("partition"),
        nodes=nodes,
        node_names=expand_hostlist(nodes),
        gres=r.gres("gres_per_node"),
        features=r.text("constraints"),
        comment=r.text("comment"),
        admin_comment=r.text("admin_comment"),
        priority=r.number("priority"),
        submit_time=r.number("submit_time") or None,
        start_time=r.number("start_time") or None,
        time_limit_min=r.number("time_limit"),
        user_id=r.number("user_id"),
        group_id=r.number("group_id"),
        workdir=r.text("working_directory"),
        het_job_id=r.number("het_job_id") or None,
        het_job_offset=r.number("het_job_offset") if r.number("het_job_id") else None,
        account=r.text("account"),
        qos=r.text("qos"),
        mem_per_node_mb=r.number("memory_per_node") or None,
        mem_per_cpu_mb=r.number("memory_per_cpu") or None,
        cpus_per_node=r.number("min_cpus_per_node") or None,
        eligible_time=r.number("eligible_time") or None,
        **array_fields(r.number("array_id"), r.number("array_task_id"),
                        r.text("array_tasks_waiting")),
        state_desc=desc,
    )


def _node(node: Any) -> SlurmNode:
    r = _Reader(node, "node")
    name = r.text("name")
    if not name:
        raise r.error("name", "missing or empty")
    r.what = f"node {name}"
    parts = [p.strip().upper() for p in r.text("state").replace(",", "+").split("+") if p.strip()]
    if not parts:
        raise r.error("state", "missing or empty")
    return SlurmNode(
        name=name,
        state=parts[0],
        state_flags=tuple(parts[1:]),
        gres=r.gres("configured_gres"),
        gres_used=r.gres("allocated_gres"),
        features=r.strings("available_features"),
        active_features=r.strings("active_features"),
        cpus=r.number("total_cpus"),
        alloc_cpus=r.number("allocated_cpus"),
        real_memory_mb=r.number("real_memory"),
        partitions=r.strings("partitions"),
    )
