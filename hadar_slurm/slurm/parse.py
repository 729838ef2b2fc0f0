"""Pure parsers of Slurm's JSON (``squeue --json``, ``sinfo --json``) and text output.

They read the shapes of Slurm 22.05 (data_parser openapi/v0.0.38) and of the newer data parsers
(v0.0.39 .. v0.0.4x, Slurm 23.02 .. 25.x) alike:

- ``job_state`` / node ``state``: a string (``"RUNNING"``, ``"idle"``) or a list of a base state
  and flags (``["PENDING", "REQUEUED"]``, ``["IDLE", "DRAIN"]``);
- numbers: plain, ``null``, or ``{"set": bool, "infinite": bool, "number": n}``;
- node features: a comma-separated string or a list;
- ``sinfo --json``: a ``nodes`` list (22.05) or a ``sinfo`` list of node groups (23.x+);
- GPU requests: ``gres:gpu:v100:2`` (22.05 ``tres_per_node``), ``gres/gpu:v100:2`` (24.11,
  26.05), ``gres/gpu:v100=2`` (TRES form), ``gpu:2``, and node gres such as ``gpu:v100:4(S:0-1)``
  (22.05) or ``gpu:v100:4`` (24.11+, no socket suffix);
- ``meta``: ``meta.Slurm`` and ``meta.plugin.type`` (22.05) or ``meta.slurm`` and
  ``meta.plugin.data_parser`` (23.x+), read by :func:`json_meta`;
- which GPUs a job or a node uses, by index (:func:`parse_gres_use`): a job's ``gres_detail``
  (``gpu:v100:2(IDX:0-1)``; shards ``shard:1(IDX:0)`` on 22.05, ``shard:1(1/2,0/2)`` per GPU on
  24.11+) and a node's ``gres_used`` (shards ``shard:v100:2(IDX:0,2)`` on 22.05, where the count
  is not the shards', ``shard:v100:4(2/2,-/2,2/2,0/2)`` on 24.11+, ``-``: a whole GPU, 26.05).

The tests read real captures of Slurm 22.05.8, 24.11.5 and 26.05.5 (``tests/data/slurm``).

Missing keys get neutral defaults (empty string, ``None``, empty tuple); a value of the wrong
kind raises :class:`SlurmParseError` naming the source, the job or node and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hadar_slurm.slurm.errors import SlurmParseError

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "PENDING_STATES",
    "QUEUED_STATES",
    "RUNNING_STATES",
    "SQUEUE_LIVE_STATES",
    "UNFINISHED_STATES",
    "Gres",
    "GresUse",
    "SlurmJob",
    "SlurmMeta",
    "SlurmNode",
    "expand_hostlist",
    "json_meta",
    "parse_gres",
    "parse_gres_use",
    "parse_sbatch_parsable",
    "parse_scontrol_records",
    "parse_scontrol_show",
    "parse_sinfo_json",
    "parse_squeue_json",
]


@dataclass(frozen=True)
class Gres:
    """One generic resource: ``name`` (``"gpu"``), ``type`` (``"v100"`` or ``None`` when
    untyped) and ``count``."""

    name: str
    type: str | None
    count: int


#: Job states in which a job holds its GPUs.
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED"})
#: Job states after which a job never runs again.
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
#: Job states in which a job waits in the queue.  ``SPECIAL_EXIT``: a job that exited with a
#: status of slurm.conf's ``RequeueExitHold`` (hadar: 75, "checkpointed, run me again"), which
#: slurmctld itself put back in the queue, held.
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                            "SPECIAL_EXIT"})
#: Job states in which a job waits or holds its GPUs (a forked job's copies that still count).
QUEUED_STATES = PENDING_STATES | RUNNING_STATES
#: Job states of a job that has not ended: queued, or still ending (``COMPLETING``).
UNFINISHED_STATES = QUEUED_STATES | {"COMPLETING"}
#: The jobs ``hadar-slurm status`` lists without ``--all``: unlike :data:`UNFINISHED_STATES`,
#: without the held requeued ones (``REQUEUE_HOLD``, ``REQUEUE_FED``, ``SPECIAL_EXIT``), as it
#: always listed them.
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING",
                           "REQUEUED"})
#: slurmctld's description of its own hold of a batch job whose launch failed (its prolog
#: failed, or slurmd refused the launch): reason ``JobHeldUser``, priority 0, requeued.
LAUNCH_FAILED_HELD = "launch failed requeued held"
#: Every job state that is not final, as ``squeue --states`` names them (Slurm 22.05+), in the
#: order the command line gives them: :data:`UNFINISHED_STATES` and the states this module
#: never reads as a base state (``RESV_DEL_HOLD``, ``STOPPED``, ``SIGNALING``, ``STAGE_OUT``,
#: ``RESIZING``).
SQUEUE_LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING",
                      "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
                      "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING")


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    user: str
    state: str  # base state, upper case: PENDING, RUNNING, COMPLETED, ...
    state_flags: tuple[str, ...]  # the rest of a list-form job_state, e.g. ("REQUEUED",)
    state_reason: str  # "None", "Resources", "JobHeldUser", ...
    partition: str
    nodes: str  # Slurm hostlist as given ("node[1-2]"); "" while pending
    node_names: tuple[str, ...]  # the hostlist expanded
    gres: tuple[Gres, ...]  # per-node request (tres_per_node)
    features: str  # --constraint expression, "" when none
    comment: str
    admin_comment: str
    priority: int | None
    submit_time: int | None  # Unix seconds; None when unset / 0
    start_time: int | None  # actual start (running/finished) or expected start (pending)
    time_limit_min: int | None  # None: unlimited or unset
    # (the fields below have defaults so that hand-built jobs need not name them)
    user_id: int | None = None  # the owner's uid (None: not reported)
    group_id: int | None = None  # the owner's primary gid
    workdir: str = ""  # current_working_directory
    #: the batch script's path; 22.05 adds its arguments (joined by spaces), 24.11 and 26.05
    #: give the path alone ("" for ``--wrap``)
    command: str = ""
    dependency: str = ""  # e.g. "afterany:57(unfulfilled)"; "" when none
    required_nodes: str = ""  # --nodelist as asked (a pending job has no ``nodes`` yet)
    het_job_id: int | None = None  # the leader's id of a heterogeneous job's component
    het_job_offset: int | None = None  # the component's index in its heterogeneous job
    exit_code: int | None = None  # the batch script's exit status once ended (None: signal)
    account: str = ""  # --account ("" when none / no accounting)
    qos: str = ""  # --qos ("" when none)
    mem_per_node_mb: int | None = None  # --mem (None when not asked per node)
    mem_per_cpu_mb: int | None = None  # --mem-per-cpu, or DefMemPerCPU when nothing was asked
    cpus_per_node: int | None = None  # CPUs asked per node (--cpus-per-task x tasks per node)
    #: when a pending job may start at the earliest (its begin time; None: unset / 0)
    eligible_time: int | None = None
    #: a job array's id (the first task's job id; None: not an array), this record's task index
    #: (None: a record of several pending tasks, listed in ``array_tasks``, e.g. ``"0-2,5"``:
    #: Slurm gives a task a record of its own when it starts or is updated on its own)
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_tasks: str = ""
    #: what it holds on each of its nodes (``node_names`` order), as squeue's ``gres_detail``
    #: prints it: ``gpu:v100:2(IDX:0-1)``, ``shard:1(IDX:0)`` (22.05), ``shard:1(1/2,0/2)``
    #: (24.11+); read with :func:`parse_gres_use`.  () while pending, and from readers that
    #: do not fill it in (pyslurm's), hence not compared.
    gres_detail: tuple[str, ...] = field(default=(), compare=False)
    #: what Slurm says of the reason beyond its code ("" when nothing): slurmctld's own hold
    #: after a failed launch is ``JobHeldUser`` with :data:`LAUNCH_FAILED_HELD`
    state_desc: str = ""

    @property
    def gpus_per_node(self) -> int:
        return sum(g.count for g in self.gres if g.name == "gpu")

    @property
    def gpu_type(self) -> str | None:
        """The requested GPU type, ``None`` when the request is untyped (or has no GPU)."""
        types = {g.type for g in self.gres if g.name == "gpu" and g.type}
        return types.pop() if len(types) == 1 else None

    @property
    def held(self) -> bool:
        return self.state == "SPECIAL_EXIT" or (
            self.state in PENDING_STATES
            and self.state_reason in ("JobHeldUser", "JobHeldAdmin"))


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
    state_flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, ...
    gres: tuple[Gres, ...]  # configured
    gres_used: tuple[Gres, ...]
    features: tuple[str, ...]  # configured (available) features
    active_features: tuple[str, ...]
    cpus: int | None
    alloc_cpus: int | None
    real_memory_mb: int | None
    partitions: tuple[str, ...]
    #: ``gres_used`` as Slurm prints it (which GPUs, by index), for :func:`parse_gres_use`;
    #: "" from readers that do not fill it in (pyslurm's), hence not compared
    gres_used_text: str = field(default="", compare=False)

    @property
    def gpus(self) -> int:
        return sum(g.count for g in self.gres if g.name == "gpu")

    @property
    def gpus_used(self) -> int:
        return sum(g.count for g in self.gres_used if g.name == "gpu")

    @property
    def gpu_type(self) -> str | None:
        types = {g.type for g in self.gres if g.name == "gpu" and g.type}
        return types.pop() if len(types) == 1 else None

    @property
    def free_cpus(self) -> int | None:
        """CPUs no job holds (CPUTot less CPUAlloc), or None where the read lacks either."""
        if self.cpus is None or self.alloc_cpus is None:
            return None
        return self.cpus - self.alloc_cpus


# ------------------------------------------------------------------------------ field readers


class _Fields:
    """Typed access to one JSON object, with errors naming the source, item and field."""

    def __init__(self, obj: object, source: str, what: str) -> None:
        if not isinstance(obj, Mapping):
            raise SlurmParseError(source, what, f"expected an object, got {_kind(obj)}")
        self.obj: Mapping[str, Any] = obj
        self.source = source
        self.what = what

    def error(self, key: str, problem: str) -> SlurmParseError:
        return SlurmParseError(f"{self.source}: {self.what}", key, problem)

    def text(self, key: str, default: str = "") -> str:
        value = self.obj.get(key)
        if value is None:
            return default
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return ",".join(value)  # newer parsers turn some csv strings into lists
        raise self.error(key, f"expected a string, got {_kind(value)} {_short(value)}")

    def number(self, key: str) -> int | None:
        return _number(self.obj.get(key), lambda p: self.error(key, p))

    def required_int(self, key: str) -> int:
        if key not in self.obj:
            raise self.error(key, "missing")
        value = self.number(key)
        if value is None:
            raise self.error(key, f"expected a number, got {_short(self.obj[key])}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        """A list of strings, or a comma-separated string, as a tuple (no empty items)."""
        value = self.obj.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(v for v in (s.strip() for s in value.split(",")) if v)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(v for v in value if v)
        raise self.error(key, f"expected a string or a list of strings, got {_short(value)}")

    def state(self, key: str) -> tuple[str, tuple[str, ...]]:
        """A state as a string (``"idle"``, ``"IDLE+DRAIN"``) or list, upper-cased:
        ``(base, flags)``."""
        value = self.obj.get(key)
        if value is None:
            raise self.error(key, "missing")
        if isinstance(value, str):
            parts = [p for p in re.split(r"[+,]", value) if p]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            parts = list(value)
        else:
            raise self.error(key, f"expected a string or a list of strings, got {_short(value)}")
        if not parts:
            raise self.error(key, "empty state")
        parts = [p.strip().upper() for p in parts]
        return parts[0], tuple(parts[1:])

    def sub(self, key: str) -> _Fields:
        value = self.obj.get(key)
        return _Fields({} if value is None else value, self.source, f"{self.what}.{key}")


def _number(value: object, error: Callable[[str], SlurmParseError]) -> int | None:
    """Plain number, null, or ``{"set", "infinite", "number"}`` -> int or None (unset or
    infinite)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise error(f"expected a number, got a boolean {value}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value != int(value):
            raise error(f"expected a whole number, got {value}")
        return int(value)
    if isinstance(value, Mapping):
        if value.get("infinite") is True or value.get("set") is False:
            return None
        if "number" not in value:
            raise error(f"number object without 'number': {_short(value)}")
        return _number(value["number"], error)
    raise error(f"expected a number, got {_kind(value)} {_short(value)}")


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _decode(data: str | bytes | Mapping[str, Any], source: str) -> object:
    """``data`` as decoded JSON (a mapping is taken as already decoded)."""
    if not isinstance(data, str | bytes):
        return data
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(source, "(document)", f"not valid JSON: {exc}") from exc


def _load(data: str | bytes | Mapping[str, Any], source: str) -> Mapping[str, Any]:
    obj = _decode(data, source)
    if not isinstance(obj, Mapping):
        raise SlurmParseError(source, "(document)", f"expected an object, got {_kind(obj)}")
    errors = obj.get("errors") or []
    if errors:
        texts = []
        for e in errors if isinstance(errors, list) else [errors]:
            if isinstance(e, Mapping):
                texts.append(str(e.get("description") or e.get("error") or e))
            else:
                texts.append(str(e))
        raise SlurmParseError(source, "errors", "; ".join(texts))
    return obj


# ------------------------------------------------------------------------------ gres strings

_GRES_ITEM = re.compile(
    r"^(?:gres[:/])?(?P<name>[A-Za-z_][\w.-]*)"
    r"(?::(?P<type>[^:=()]+?))?"
    r"(?:[:=](?P<count>\d+[KMGT]?))?"
    r"(?:\((?P<detail>[^)]*)\))?$"
)
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses: ``gpu:v100:2(IDX:0,2),mps:100``."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip()]


def parse_gres(text: str, *, source: str = "gres", field: str = "gres") -> tuple[Gres, ...]:
    """``gres:gpu:v100:2``, ``gres/gpu:v100=2``, ``gpu:2``, ``gpu``, ``gpu:v100:4(S:0-1)``,
    comma-separated; ``(null)``/``N/A``/empty give ``()``.  TRES items that are not gres
    (``cpu=4``, ``mem=1G``, ``node=1``) are skipped."""
    text = text.strip()
    if text in ("", "(null)", "N/A", "none"):
        return ()
    out: list[Gres] = []
    for item in _split_top(text):
        if "=" in item and not item.startswith("gres"):
            continue  # a plain TRES such as cpu=4 or mem=1G
        m = _GRES_ITEM.match(item)
        if m is None:
            raise SlurmParseError(source, field, f"cannot read gres item {item!r} of {text!r}")
        type_ = m.group("type")
        count = m.group("count")
        if type_ is not None and count is None and type_.isdigit():
            type_, count = None, type_  # "gpu:2": the number is the count
        if count is None:
            n = 1
        else:
            n = int(count[:-1] if count[-1] in "KMGT" else count) * _SUFFIX.get(
                count[-1] if count[-1] in "KMGT" else "", 1)
        out.append(Gres(m.group("name"), type_ or None, n))
    return tuple(out)


@dataclass(frozen=True)
class GresUse:
    """One gres of a job's ``gres_detail`` or a node's ``gres_used``, by GPU index: ``name``,
    ``type`` and ``count`` as printed; ``used``: ``(index, count)`` of each GPU index in use,
    the count ``None`` where the release prints only the indices (``IDX:0,2``: every gpu, and
    shards on 22.05); ``totals``: each index's configured count where printed (shards on
    24.11+, ``1/2`` -> 2), else (); ``whole``: the indices printed ``-`` (26.05: a GPU given
    whole to a job, so none of its shards can be had)."""

    name: str
    type: str | None
    count: int
    used: tuple[tuple[int, int | None], ...]
    totals: tuple[int, ...] = ()
    whole: tuple[int, ...] = ()

    @property
    def indices(self) -> tuple[int, ...]:
        """The GPU indices in use."""
        return tuple(i for i, _ in self.used)


_INDEX_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_SHARE = re.compile(r"^(\d+|-)/(\d+)$")


def _index_list(text: str, where: str, source: str, field: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        m = _INDEX_RANGE.match(part.strip())
        if m is None:
            raise SlurmParseError(source, field, f"cannot read index {part!r} of {where!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        out.extend(range(lo, hi + 1))
    return out


def parse_gres_use(text: str, *, source: str = "gres", field: str = "gres_detail",
                   ) -> tuple[GresUse, ...]:
    """The gres of a job's ``gres_detail`` entry or a node's ``gres_used`` with their GPU
    indices: ``gpu:v100:2(IDX:0-1)``, ``gpu:v100:0(IDX:N/A)``, ``shard:1(IDX:0)``,
    ``shard:v100:4(2/2,-/2,2/2,0/2)``, ``gpu:v100:4(S:0)`` (no indices), comma-separated."""
    out: list[GresUse] = []
    for item in _split_top(text.strip()):
        if item in ("(null)", "N/A", "none"):
            continue
        m = _GRES_ITEM.match(item)
        if m is None:
            raise SlurmParseError(source, field, f"cannot read gres item {item!r} of {text!r}")
        (g,) = parse_gres(item.split("(", 1)[0], source=source, field=field)
        detail = (m.group("detail") or "").strip()
        used: list[tuple[int, int | None]] = []
        totals: list[int] = []
        whole: list[int] = []
        if detail.startswith("IDX:"):
            if detail[4:] != "N/A":
                used = [(i, None) for i in _index_list(detail[4:], item, source, field)]
        elif detail and _SHARE.match(detail.split(",", 1)[0]):
            for index, part in enumerate(detail.split(",")):
                sm = _SHARE.match(part.strip())
                if sm is None:
                    raise SlurmParseError(source, field,
                                          f"cannot read share {part!r} of {item!r}")
                totals.append(int(sm.group(2)))
                if sm.group(1) == "-":
                    whole.append(index)
                elif int(sm.group(1)):
                    used.append((index, int(sm.group(1))))
        out.append(GresUse(g.name, g.type, g.count, tuple(used), tuple(totals), tuple(whole)))
    return tuple(out)


# ------------------------------------------------------------------------------ hostlists

_HOSTLIST_GROUP = re.compile(r"\[([^\]]*)\]")


_ARRAY_ITEM = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9})(?::([0-9]{1,9}))?)?")


def expand_array_tasks(text: str, limit: int | None = None) -> tuple[int, ...]:
    """The task indices of a job array's task string as squeue prints it (``array_task_string``:
    ``0-2,5``, ``0-31:2``, ``0-63%4``: the ``%N`` limit on running tasks is not a task),
    ascending as written; at most ``limit`` of them when given.  Raises
    :class:`SlurmParseError` on anything else."""
    body = text.strip().split("%", 1)[0]
    out: list[int] = []
    if not body:
        return ()
    for item in body.split(","):
        m = _ARRAY_ITEM.fullmatch(item.strip())
        if m is None:
            raise SlurmParseError("squeue --json", "array_task_string",
                                  f"cannot read task list {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise SlurmParseError("squeue --json", "array_task_string",
                                  f"bad range {item!r} in {text!r}")
        for task in range(lo, hi + 1, step):
            if limit is not None and len(out) >= limit:
                return tuple(out)
            out.append(task)
    return tuple(out)


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist: ``node[1-3,5],gpu[01-02]`` -> ``node1 node2 node3 node5 gpu01
    gpu02`` (zero padding kept; several bracket groups in one name are expanded in turn)."""
    text = text.strip()
    if not text or text == "(null)":
        return ()
    out: list[str] = []
    for item in _split_hostlist(text):
        out.extend(_expand_one(item, text))
    return tuple(out)


def _split_hostlist(text: str) -> list[str]:
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmParseError("hostlist", "nodes", f"unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmParseError("hostlist", "nodes", f"unbalanced '[' in {text!r}")
    items.append("".join(cur))
    return [i for i in items if i]


def _expand_one(item: str, whole: str) -> list[str]:
    m = _HOSTLIST_GROUP.search(item)
    if m is None:
        return [item]
    head, tail = item[: m.start()], item[m.end():]
    names: list[str] = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmParseError("hostlist", "nodes", f"bad range {part!r} in {whole!r}")
        width = len(lo)
        start, stop = int(lo), int(hi) if sep else int(lo)
        if stop < start or stop - start > 100_000:
            raise SlurmParseError("hostlist", "nodes", f"bad range {part!r} in {whole!r}")
        for k in range(start, stop + 1):
            names.extend(_expand_one(f"{head}{k:0{width}d}{tail}", whole))
    return names


# ------------------------------------------------------------------------------ squeue --json


def parse_squeue_json(
    data: str | bytes | Mapping[str, Any], source: str = "squeue --json",
) -> tuple[SlurmJob, ...]:
    """Jobs of ``squeue --json`` (any data parser version)."""
    doc = _load(data, source)
    jobs = doc.get("jobs")
    if jobs is None:
        return ()
    if not isinstance(jobs, list):
        raise SlurmParseError(source, "jobs", f"expected a list, got {_kind(jobs)}")
    return tuple(_job(raw, source, k) for k, raw in enumerate(jobs))


def _job(raw: object, source: str, index: int) -> SlurmJob:
    f = _Fields(raw, source, f"jobs[{index}]")
    job_id = f.required_int("job_id")
    f.what = f"job {job_id}"
    state, flags = f.state("job_state")
    # One name for one state on every release: 24.11+ list as flags what 22.05 (and `scontrol
    # show job` of every release) name as the state.  A job that RequeueExitHold put back is
    # ["PENDING", "SPECIAL_EXIT"] (22.05: SPECIAL_EXIT); one slurmctld is still ending is
    # ["FAILED", "COMPLETING"] (22.05: COMPLETING): not final yet, it may still be requeued.
    for name in ("SPECIAL_EXIT", "COMPLETING"):
        if name in flags and state != name:
            state, flags = name, (state, *(x for x in flags if x != name))
    nodes = f.text("nodes")
    user = f.text("user_name")
    if not user:
        uid = f.number("user_id")
        user = "" if uid is None else str(uid)
    gres_text = f.text("tres_per_node")
    gres = parse_gres(gres_text, source=f"{source}: job {job_id}", field="tres_per_node")
    return SlurmJob(
        job_id=job_id,
        name=f.text("name"),
        user=user,
        state=state,
        state_flags=flags,
        state_reason=f.text("state_reason"),
        partition=f.text("partition"),
        nodes=nodes,
        node_names=expand_hostlist(nodes),
        gres=gres,
        features=f.text("features"),
        comment=f.text("comment"),
        admin_comment=f.text("admin_comment"),
        priority=f.number("priority"),
        submit_time=f.number("submit_time") or None,
        start_time=f.number("start_time") or None,
        time_limit_min=f.number("time_limit"),
        user_id=f.number("user_id"),
        group_id=f.number("group_id"),
        workdir=f.text("current_working_directory"),
        command=f.text("command"),
        dependency=_none_text(f.text("dependency")),
        required_nodes=_none_text(f.text("required_nodes")),
        # 22.05 reports 0 (and het_job_id_set "") for a job that is not heterogeneous
        het_job_id=f.number("het_job_id") or None,
        het_job_offset=f.number("het_job_offset") if f.number("het_job_id") else None,
        exit_code=_exit_status(raw.get("exit_code") if isinstance(raw, Mapping) else None),
        account=f.text("account"),
        qos=f.text("qos"),
        mem_per_node_mb=f.number("memory_per_node") or None,
        mem_per_cpu_mb=f.number("memory_per_cpu") or None,
        # (22.05 reports cpus_per_task as null even when asked; this one it fills in)
        cpus_per_node=f.number("minimum_cpus_per_node") or None,
        eligible_time=f.number("eligible_time") or None,
        **array_fields(f.number("array_job_id"), f.number("array_task_id"),
                        f.text("array_task_string")),
        gres_detail=f.strings("gres_detail"),
        state_desc=f.text("state_description"),
    )


def array_fields(array_job_id: int | None, task_id: int | None,
                  tasks: str) -> dict[str, Any]:
    """``array_job_id``, ``array_task_id`` and ``array_tasks`` of a job record: none for a job
    that is not an array (22.05: ``0`` and ``null``; 24.11+: ``"set": false``).  A record of
    one pending task is that task: 26.05 lists the last task left in the array's record as
    ``"array_task_string": "2"`` without a task id, where 22.05 and 24.11 give the id."""
    if not array_job_id:
        return {"array_job_id": None, "array_task_id": None, "array_tasks": ""}
    if task_id is None and tasks:
        one = expand_array_tasks(tasks, limit=2)
        if len(one) == 1:
            task_id, tasks = one[0], ""
    return {"array_job_id": array_job_id, "array_task_id": task_id,
            "array_tasks": "" if task_id is not None else tasks}


def _exit_status(value: object) -> int | None:
    """The exit status from squeue's ``exit_code``: 22.05 gives the raw wait status (an int,
    the status in its second byte, a signal in its low 7 bits); newer data parsers give
    ``{"status": [...], "return_code": {"number": N}}``.  None when killed by a signal or
    not reported."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value & 0x7F else (value >> 8) & 0xFF
    if isinstance(value, Mapping):
        rc = value.get("return_code")
        if isinstance(rc, Mapping):
            rc = rc.get("number") if rc.get("set", True) else None
        status = value.get("status")
        if isinstance(status, list) and "SIGNALED" in status:
            return None
        return rc if isinstance(rc, int) and not isinstance(rc, bool) else None
    return None


def _none_text(text: str) -> str:
    return "" if text in ("(null)", "None") else text


# ------------------------------------------------------------------------------ meta


@dataclass(frozen=True)
class SlurmMeta:
    """Who wrote a ``squeue``/``sinfo``/``scontrol`` ``--json`` document: the Slurm ``release``
    (``"24.11.5"``), its ``major`` and ``minor`` numbers (24, 11) and the ``data_parser``
    (``"v0.0.41"``; ``""`` when the document does not name one, as 22.05's does not)."""

    release: str
    major: int
    minor: int
    data_parser: str


def json_meta(data: str | bytes | Mapping[str, Any], source: str = "slurm --json") -> SlurmMeta:
    """The ``meta`` object of any ``--json`` output: 22.05 writes ``meta.Slurm.version`` (numbers)
    and ``meta.plugin.type`` (``openapi/v0.0.38``, not a data parser); 23.x+ write
    ``meta.slurm.version`` (strings: ``"24"``, ``"05"``), ``meta.slurm.release`` and
    ``meta.plugin.data_parser`` (``data_parser/v0.0.42``).  The document's ``errors`` are not
    looked at (a document that reports errors still says who wrote it)."""
    top = _Fields(_decode(data, source), source, "(document)")
    if not isinstance(top.obj.get("meta"), Mapping):
        raise top.error("meta", f"expected an object, got {_kind(top.obj.get('meta'))}")
    meta = top.sub("meta")
    key = "slurm" if "slurm" in meta.obj else "Slurm"
    slurm = meta.sub(key)
    release = slurm.text("release")
    version = slurm.sub("version")
    major, minor = _version_part(version, "major"), _version_part(version, "minor")
    if (major is None or minor is None) and release:
        m = re.match(r"^(\d+)\.(\d+)(?:\.\d+)?", release)
        if m is None:
            raise slurm.error("release", f"expected a release like 24.11.5, got {release!r}")
        major, minor = int(m.group(1)), int(m.group(2))
    if major is None or minor is None:
        raise slurm.error("version", "missing (and no release)")
    if not release:
        micro = _version_part(version, "micro")
        release = f"{major}.{minor:02d}" + ("" if micro is None else f".{micro}")
    parser = meta.sub("plugin").text("data_parser")
    return SlurmMeta(release=release, major=major, minor=minor,
                     data_parser=parser.rpartition("/")[2])


def _version_part(version: _Fields, key: str) -> int | None:
    """``major``/``minor``/``micro`` of ``meta.*.version``: a number (22.05) or a string of
    digits (23.x+: ``"05"``)."""
    value = version.obj.get(key)
    if isinstance(value, str):
        if not value.isdigit():
            raise version.error(key, f"expected digits, got {value!r}")
        return int(value)
    return version.number(key)


# ------------------------------------------------------------------------------ sinfo --json


def parse_sinfo_json(
    data: str | bytes | Mapping[str, Any], source: str = "sinfo --json",
) -> tuple[SlurmNode, ...]:
    """Nodes of ``sinfo --json``: the 22.05 ``nodes`` list, or the ``sinfo`` list of node
    groups of 23.x+ (a node listed in several partitions is returned once)."""
    doc = _load(data, source)
    if "nodes" in doc and doc["nodes"] is not None:
        raw = doc["nodes"]
        if not isinstance(raw, list):
            raise SlurmParseError(source, "nodes", f"expected a list, got {_kind(raw)}")
        return tuple(_node(n, source, k) for k, n in enumerate(raw))
    groups = doc.get("sinfo")
    if groups is None:
        return ()
    if not isinstance(groups, list):
        raise SlurmParseError(source, "sinfo", f"expected a list, got {_kind(groups)}")
    by_name: dict[str, SlurmNode] = {}
    for k, group in enumerate(groups):
        for node in _sinfo_group(group, source, k):
            old = by_name.get(node.name)
            if old is not None:
                parts = old.partitions + tuple(
                    p for p in node.partitions if p not in old.partitions)
                node = replace(node, partitions=parts)
            by_name[node.name] = node
    return tuple(by_name.values())


def _node(raw: object, source: str, index: int) -> SlurmNode:
    f = _Fields(raw, source, f"nodes[{index}]")
    name = f.text("name")
    if not name:
        raise f.error("name", "missing or empty")
    f.what = f"node {name}"
    state, flags = f.state("state")
    extra = tuple(s.upper() for s in f.strings("state_flags"))
    where = f"{source}: node {name}"
    return SlurmNode(
        name=name,
        state=state,
        state_flags=flags + tuple(s for s in extra if s not in flags),
        gres=parse_gres(f.text("gres"), source=where, field="gres"),
        gres_used=parse_gres(f.text("gres_used"), source=where, field="gres_used"),
        features=f.strings("features"),
        active_features=f.strings("active_features"),
        cpus=f.number("cpus"),
        alloc_cpus=f.number("alloc_cpus"),
        real_memory_mb=f.number("real_memory"),
        partitions=f.strings("partitions"),
        gres_used_text=f.text("gres_used"),
    )


def _sinfo_group(raw: object, source: str, index: int) -> list[SlurmNode]:
    f = _Fields(raw, source, f"sinfo[{index}]")
    names = f.sub("nodes").strings("nodes")
    if not names:
        return []
    state, flags = f.sub("node").state("state")
    where = f"{source}: sinfo[{index}]"
    cpus = f.sub("cpus")
    memory = f.sub("memory")
    partition = f.sub("partition").text("name")
    # a group's cpus.allocated is its nodes' sum: one node's own only when the group has one
    # node or nothing is allocated (nodes with different allocations can share a group)
    alloc = cpus.number("allocated")
    if len(names) > 1 and alloc != 0:
        alloc = None
    return [
        SlurmNode(
            name=name,
            state=state,
            state_flags=flags,
            gres=parse_gres(f.sub("gres").text("total"), source=where, field="gres.total"),
            gres_used=parse_gres(f.sub("gres").text("used"), source=where, field="gres.used"),
            features=f.sub("features").strings("total"),
            active_features=f.sub("features").strings("active"),
            cpus=cpus.number("maximum"),
            alloc_cpus=alloc,
            real_memory_mb=memory.number("maximum"),
            partitions=(partition,) if partition else (),
            gres_used_text=f.sub("gres").text("used"),
        )
        for name in names
    ]


# ------------------------------------------------------------------------------ text outputs


def parse_sbatch_parsable(stdout: str) -> int:
    """The job id from ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    head = line.split(";", 1)[0].strip()
    if not head.isdigit():
        raise SlurmParseError("sbatch --parsable", "job id", f"expected a job id, got {stdout!r}")
    return int(head)


def parse_job_ids(stdout: str, *, source: str = "squeue --format=%A") -> frozenset[int]:
    """Job ids, one per line (blank lines ignored), as :func:`commands.squeue_live_ids`
    prints them."""
    ids: set[int] = set()
    for k, line in enumerate(stdout.splitlines(), 1):
        word = line.strip()
        if not word:
            continue
        if not word.isdigit():
            raise SlurmParseError(source, f"line {k}", f"expected a job id, got {line!r}")
        ids.add(int(word))
    return frozenset(ids)


_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$")
_WORD = re.compile(r"\S+")

#: Keys whose value is free text (spaces, ``=``) that Slurm prints last on its line: the value
#: runs to the end of the line (multi-line form) or to the next key Slurm prints after it
#: (``--oneliner``; 22.05 and 24.11 print a space after a comment, so two before the next key,
#: 26.05 only the one between keys).
_FREE_TEXT_KEYS = frozenset({"Command", "SubmitLine", "AdminComment", "SystemComment",
                             "Comment", "Extra"})
#: What may follow a free-text value in a job record (Slurm's ``job_info.c`` order).
_AFTER_FREE_TEXT = re.compile(
    r" (?:SubmitLine|WorkDir|AdminComment|SystemComment|Comment|Extra|StdErr|StdIn|StdOut"
    r"|Power|BurstBuffer|BurstBufferState|CpuFreq(?:Min|Max|Gov)|Gres[A-Za-z]+"
    r"|KillOInInvalidDependent|SpreadJob|OOMKillStep|CpusPerTres|MemPerTres|Tres[A-Za-z]+"
    r"|MailUser|NtasksPerTRES|Container|SELinuxContext|ResvPorts)=")


def parse_scontrol_show(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of one record of ``scontrol show`` (one-line or multi-line form); of
    several records (a heterogeneous job's components) only the first is read: see
    :func:`parse_scontrol_records`.  A word without ``=`` continues the previous value
    (``Reason=Not responding``); the free-text values (``Comment``, ``AdminComment``,
    ``SystemComment``, ``Extra``, ``Command``, ``SubmitLine``) keep their spaces and ``=``
    (``Comment=hadar: model=a3c steps=10``); for keys that repeat, the first wins."""
    records = _scontrol_records(text)
    return _scontrol_record(records[0]) if records else {}


def parse_scontrol_records(text: str) -> tuple[dict[str, str], ...]:
    """Every record of ``scontrol show`` output, each as :func:`parse_scontrol_show` reads it:
    one per line with ``--oneliner``, else one per block whose first line starts in column 0
    (``scontrol show job`` of a heterogeneous job's leader prints one record per component)."""
    return tuple(_scontrol_record(r) for r in _scontrol_records(text))


def _scontrol_records(text: str) -> list[str]:
    records: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if records and line[0].isspace():
            records[-1].append(line)
        else:
            records.append([line])
    return ["\n".join(lines) for lines in records]


def _scontrol_record(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    last: str | None = None
    pos = 0
    while (m := _WORD.search(text, pos)) is not None:
        word, pos = m.group(), m.end()
        km = _KEY.match(word)
        if km is None:
            if last is not None:
                out[last] = f"{out[last]} {word}"
            continue
        key, value = km.group(1), km.group(2)
        if key in _FREE_TEXT_KEYS:
            start = m.start() + len(key) + 1
            pos = _free_text_end(text, start)
            value = text[start:pos].rstrip(" ")
        if key in out:
            last = None  # a repeated key: ignore it and its continuation words
            continue
        out[key] = value
        last = None if key in _FREE_TEXT_KEYS else key
    return out


def _free_text_end(text: str, start: int) -> int:
    line_end = text.find("\n", start)
    if line_end < 0:
        line_end = len(text)
    m = _AFTER_FREE_TEXT.search(text, start, line_end)
    return line_end if m is None else m.start()
