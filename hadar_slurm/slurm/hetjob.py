"""HadarE in Slurm: a job forked into k copies, rendered as ONE heterogeneous sbatch script.

Each copy of the job (HadarE's job forker) is a full trainer of the same
model on one node with GPUs of one type; copies of a job never share a node.  In Slurm that is a
heterogeneous job (``#SBATCH hetjob`` separators) with one component per copy: component ``i`` asks
for its node (``--nodelist``), ``--gres=gpu:N`` untyped plus ``--constraint=TYPE`` (the form that
stays steerable on Slurm 22.05, SchedMD bug 17184), one task, and carries the original job's id in
its comment (``hadar-copy-of=ID``: not a ``hadar:`` comment, so ``job_submit.lua`` leaves the
components exactly as submitted).  The batch step (on component 0's node) launches one
``srun --het-group=i`` per copy, in the background, with ``HADAR_COPY_INDEX=i`` and
``HADAR_COPY_GPU_TYPE`` in its environment, runs the user's command in each, waits for all and
exits with the status of the lowest-numbered copy that failed (0 when none did).  A plan of one
copy renders as a plain job (a heterogeneous job needs two components, and Slurm 22.05's ``srun``
refuses ``--het-group`` outside one), with the same environment and exit status.

Every copy also sees ``HADAR_ORIGINAL_JOB_ID``, ``HADAR_COPIES`` (k) and ``HADAR_TRACKER_DIR``
(a directory shared by the nodes, created by the script, where copies report their progress to
the job tracker), plus the plan's own ``env``.

Slurm 22.05 facts this relies on (checked on the dev cluster, tests/test_hetjob_cluster.py):
``sbatch --parsable`` prints only the leader's id ``ID``; the components are jobs ``ID``,
``ID+1``, ... (``squeue`` shows ``ID+0``, ``ID+1``; ``squeue --json`` has ``het_job_id`` and
``het_job_offset``; ``scontrol show job ID`` prints every component); Slurm itself excludes each
component's node from the other components (``ExcNodeList``); only the backfill scheduler starts
heterogeneous jobs, and all components start together or not at all; each ``srun --het-group=i``
step gets all of component i's GPUs in its own ``CUDA_VISIBLE_DEVICES``.

Quoting: everything user-provided that reaches the shell body goes through :func:`shlex.quote`
(the template's ``q`` filter).  Values in ``#SBATCH`` lines cannot be shell-quoted (sbatch reads
those lines itself: whitespace ends a value, ``#`` starts a comment, quotes and backslashes are
eaten), so they must be plain: anything else is refused with an :class:`InputError` naming the
field, both when the plan is built and again by the template's ``sbatch`` filter.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import jinja2

from hadar_slurm.errors import InputError

__all__ = ["MAX_COPIES", "TEMPLATE", "CopySpec", "ForkPlan", "render_hetjob"]

MAX_COPIES = 16
TEMPLATE = "hetjob.sbatch.j2"
_SOURCE = "fork plan"

_NAME = re.compile(r"[A-Za-z0-9._-]+")
# What may stand in an #SBATCH value: no whitespace, quotes, backslash or '#' (sbatch's own
# parsing of those lines), ASCII only.  '%' stays allowed for output patterns such as %j.
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9._+=:,@%/-]+")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_ENV = ("HADAR_", "_HADAR")


def _check_name(value: object, what: str) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InputError(
            f"bad name {value!r}", source=_SOURCE, field=what,
            fix="use letters, digits, '.', '_' and '-' only")


def _check_sbatch_value(value: object, what: str) -> str:
    """``value`` as it may appear after ``--option=`` in an ``#SBATCH`` line, or InputError."""
    if not isinstance(value, str) or not _SBATCH_VALUE.fullmatch(value):
        problem = f"{value!r} cannot go into an #SBATCH line"
        if isinstance(value, str) and any(c in value for c in "\n\r"):
            problem = f"{value!r} contains a newline and cannot go into an #SBATCH line"
        raise InputError(
            problem, source=_SOURCE, field=what,
            fix="use letters, digits and . _ - + = : , @ % / only (no spaces, quotes, '#', "
                "backslashes, newlines or non-ASCII)")
    return value


def _check_shell_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"expected a string, got {type(value).__name__}", source=_SOURCE,
                         field=what)
    if "\0" in value:
        raise InputError(f"{value!r} contains a NUL byte", source=_SOURCE, field=what,
                         fix="a shell argument cannot hold NUL bytes")
    return value


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"expected a whole number >= 1, got {value!r}", source=_SOURCE,
                         field=what)
    return value


@dataclass(frozen=True)
class CopySpec:
    """One copy of a forked job: the node it runs on, that node's GPU type and how many GPUs."""

    node: str
    gpu_type: str
    gpus: int

    def __post_init__(self) -> None:
        _check_name(self.node, "node")
        _check_name(self.gpu_type, "gpu_type")
        _positive_int(self.gpus, "gpus")


@dataclass(frozen=True)
class ForkPlan:
    """Job ``original_job_id`` forked into ``copies`` (copy ``i`` is component ``i``).

    ``command``: the user's training command as an argv list (never a shell string);
    ``workdir``: absolute, the jobs' working directory (``#SBATCH --chdir``); ``tracker_dir``:
    absolute, shared by the nodes, where copies report; ``output``/``error``: the batch script's
    stdout/stderr (sbatch patterns such as ``%j`` allowed; relative to ``workdir``); ``env``:
    more variables exported to every copy (names must not start with ``HADAR_``);
    ``partition``, ``time_limit_min``, ``account``, ``qos``, ``mem_per_node_mb`` (or
    ``mem_per_cpu_mb``) and ``cpus_per_task``: every component's ``--partition``, ``--time`` (in
    minutes), ``--account``, ``--qos``, ``--mem`` (or ``--mem-per-cpu``, in MB) and
    ``--cpus-per-task``, the original job's, so that each copy is charged and sized as the job
    was (None: Slurm's defaults).  A copy is a whole trainer on one node, so it asks for the
    job's memory per node and CPUs per task, not a share of them.
    """

    original_job_id: int
    job_name: str
    command: tuple[str, ...]
    copies: tuple[CopySpec, ...]
    workdir: str
    tracker_dir: str
    output: str | None = None
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    error: str | None = None
    partition: str | None = None
    time_limit_min: int | None = None
    account: str | None = None
    qos: str | None = None
    mem_per_node_mb: int | None = None
    mem_per_cpu_mb: int | None = None
    cpus_per_task: int | None = None

    def __post_init__(self) -> None:
        _positive_int(self.original_job_id, "original_job_id")
        if not isinstance(self.job_name, str) or any(c in self.job_name for c in "\n\r"):
            raise InputError(f"job name {self.job_name!r} contains a newline", source=_SOURCE,
                             field="job_name", fix="give a one-line job name")
        _check_sbatch_value(self.job_name, "job_name")

        command = tuple(self.command)
        if not command:
            raise InputError("empty command", source=_SOURCE, field="command",
                             fix="give the training command as a list of arguments")
        for k, arg in enumerate(command):
            _check_shell_text(arg, f"command[{k}]")
        if command[0] == "":
            raise InputError("the program name is empty", source=_SOURCE, field="command[0]")
        object.__setattr__(self, "command", command)

        copies = tuple(self.copies)
        if not 1 <= len(copies) <= MAX_COPIES:
            raise InputError(f"{len(copies)} copies", source=_SOURCE, field="copies",
                             fix=f"fork a job into 1 to {MAX_COPIES} copies")
        seen: set[str] = set()
        for k, copy in enumerate(copies):
            if not isinstance(copy, CopySpec):
                raise InputError(f"copy {k} is a {type(copy).__name__}, not a CopySpec",
                                 source=_SOURCE, field="copies")
            if copy.node in seen:
                raise InputError(f"node {copy.node} is given to more than one copy",
                                 source=_SOURCE, field="copies",
                                 fix="copies of one job must run on different nodes")
            seen.add(copy.node)
        object.__setattr__(self, "copies", copies)

        for what in ("workdir", "tracker_dir"):
            path = _check_shell_text(getattr(self, what), what)
            if not path.startswith("/"):
                raise InputError(f"{path!r} is not an absolute path", source=_SOURCE,
                                 field=what, fix="give an absolute path the nodes can reach")
        _check_sbatch_value(self.workdir, "workdir")
        for what in ("output", "error", "partition", "account", "qos"):
            if getattr(self, what) is not None:
                _check_sbatch_value(getattr(self, what), what)
        for what in ("time_limit_min", "mem_per_node_mb", "mem_per_cpu_mb", "cpus_per_task"):
            if getattr(self, what) is not None:
                _positive_int(getattr(self, what), what)
        if self.mem_per_node_mb is not None and self.mem_per_cpu_mb is not None:
            raise InputError("both memory per node and memory per CPU are given",
                             source=_SOURCE, field="mem_per_cpu_mb",
                             fix="give one of them (sbatch refuses --mem with --mem-per-cpu)")

        env: dict[str, str] = {}
        for key, value in dict(self.env).items():
            if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
                raise InputError(f"bad variable name {key!r}", source=_SOURCE, field="env",
                                 fix="use letters, digits and '_', not starting with a digit")
            if key.upper().startswith(_RESERVED_ENV):
                raise InputError(f"variable {key} is reserved", source=_SOURCE, field="env",
                                 fix="names starting with HADAR_ are set by the script itself")
            env[key] = _check_shell_text(value, f"env[{key}]")
        object.__setattr__(self, "env", MappingProxyType(env))


def _sbatch_filter(value: object, what: str) -> str:
    return _check_sbatch_value(value if isinstance(value, str) else str(value), what)


def _quote_filter(value: object) -> str:
    return shlex.quote(value if isinstance(value, str) else str(value))


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hadar_slurm.slurm", "templates"),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["q"] = _quote_filter
    env.filters["sbatch"] = _sbatch_filter
    return env


def check_shell_text(value: object, what: str) -> str:
    """``value`` if it can be one argument of a command (a string without NUL bytes), else an
    :class:`InputError` naming ``what``."""
    return _check_shell_text(value, what)


def template_environment() -> jinja2.Environment:
    """The Jinja environment of the sbatch templates (``hadar_slurm/slurm/templates/``), with
    the ``q`` (shell quoting) and ``sbatch(FIELD)`` filters: see templates/README.md."""
    return _environment()


def render_hetjob(plan: ForkPlan) -> str:
    """The heterogeneous sbatch script of ``plan`` (submit it with ``sbatch --parsable``)."""
    if not isinstance(plan, ForkPlan):
        raise TypeError(f"render_hetjob needs a ForkPlan, got {type(plan).__name__}")
    return _environment().get_template(TEMPLATE).render(plan=plan)
