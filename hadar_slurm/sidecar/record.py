"""What the sidecar records on a job in Slurm itself: the job's ``AdminComment``.

Slurm keeps the admin comment with the job (users cannot write it), shows it in
``scontrol show job`` and ``squeue --json``, and saves it across slurmctld restarts.  The sidecar
writes it with every decision it applies to a job (in the same ``scontrol update`` as the
placement), so that a restarted sidecar knows, from Slurm alone, what it decided and in which
epoch, and how much work a job did in its earlier runs.  The text reads as one line::

    hadar epoch=12 state=placed place=node2:2 gpus=2 done=1234.5 att=v100:120 submit=1795875496

``state`` is ``placed`` (released to run on ``place``), ``held`` (waits for a placement),
``preempting`` (a move has begun: the job was sent its checkpoint signal and must be back in the
queue by ``deadline``; a restarted sidecar finishes the move, see
``SlurmApplier._preempt``), ``preempted`` (stopped, back in the queue held, to be placed again),
``forked`` (HadarE: the job itself stays held while ``copies`` copies of it run as the
heterogeneous job ``group`` on ``place``), ``forking`` (the sidecar is submitting such copies;
``group`` is then the newest earlier fork, 0 if none), or ``unsteered`` (released to Slurm's own
scheduler because the sidecar cannot steer it; ``why`` says why, always last since it may hold
spaces).  ``mate=K`` (GPU sharing) names the job placed beside it on one GPU, each with one
shard of it.  ``nofork=1`` marks a job that is not forked again (a fork of
it failed, or its copies ended by themselves: it finishes unforked).
``args`` is the arguments the job's batch script was submitted with, as job_submit.lua recorded
them at submit (:func:`encode_args`; Slurm 24.11+ keeps them nowhere else, and 22.05 only joined
by spaces): HadarE's copies run the script with them.  The plugin's own marks (``hadar: waits for
the sidecar args=...``) carry them too; every record the sidecar writes keeps them.
``relaunch`` counts the times slurmctld held the job after its launch failed (a prolog that
failed, a node that refused it: ``launch failed requeued held``, which reads as the user's own
hold) and the sidecar took it back to place it anew; after
:data:`~hadar_slurm.sidecar.observe.MAX_RELAUNCH` such failures it is left held for a person.
``submit`` is when the job was submitted, as the sidecar first saw it: Slurm sets a requeued
job's ``SubmitTime`` to the time of the requeue, so after a move or a preemption Slurm's own
figure would make the job look just arrived (its age, which the policy's utility weighs, and its
JCT in the metrics would start again).
``done`` is the steps done and ``att`` the seconds run per GPU type in earlier (finished or
preempted) runs; the current run adds to them from its start time, or from ``until`` when that
is later (the work up to ``until`` is already in ``done``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import unquote_to_bytes

PREFIX = "hadar"
#: How job_submit.lua's marks begin (``hadar: waits for the sidecar``, ...).
MARK_PREFIX = "hadar:"
#: The most bytes the arguments may take encoded; longer ones are recorded as ``args=-`` (not
#: recorded: the job runs, but is never forked).  job_submit.lua has the same bound.
MAX_ARGS_BYTES = 2048
#: Bytes that stand for themselves in an encoded argument; every other byte is ``%XX``.
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/+@-")
_ENCODED_ITEM = re.compile(r"(?:[A-Za-z0-9._/+@-]|%[0-9A-F]{2})*")
STATES = ("placed", "held", "preempting", "preempted", "forking", "forked", "unsteered")


@dataclass(frozen=True)
class JobRecord:
    epoch: int = -1  # -1: the sidecar never decided on this job
    state: str = ""
    place: tuple[tuple[str, int], ...] = ()  # (node name, GPUs), nodes ascending
    gpus: int = 0  # the job's GPU count as first seen (0: not recorded)
    done: float = 0.0
    attained: dict[str, float] = field(default_factory=dict)
    until: float = 0.0  # Unix time up to which the current run's work is in done/attained
    group: int = 0  # HadarE: the heterogeneous job (leader id) running the copies (0: none)
    copies: int = 0  # HadarE: how many copies it runs as (0: not forked)
    nofork: bool = False  # HadarE: never fork it again
    deadline: float = 0.0  # preempting: Unix time by which it must be back in the queue
    args: tuple[str, ...] | None = None  # the script's arguments (None: not recorded)
    mate: int = 0  # GPU sharing: the job placed beside it on one GPU (0: none)
    submit: float = 0.0  # Unix time of the job's first submit, as first seen (0: not recorded)
    #: times the sidecar took the job back after slurmctld held it on a failed launch
    #: (``launch failed requeued held``) to place it anew
    relaunch: int = 0
    why: str = ""

    @property
    def decided(self) -> bool:
        return self.epoch >= 0 and self.state in STATES

    def with_(self, **changes: object) -> JobRecord:
        return replace(self, **changes)  # type: ignore[arg-type]

    def encode(self) -> str:
        parts = [PREFIX, f"epoch={self.epoch}", f"state={self.state}"]
        if self.place:
            parts.append("place=" + ",".join(f"{n}:{c}" for n, c in self.place))
        if self.gpus:
            parts.append(f"gpus={self.gpus}")
        if self.done > 0:
            parts.append(f"done={self.done:.6g}")
        att = {k: v for k, v in self.attained.items() if v > 0}
        if att:
            parts.append("att=" + ",".join(f"{k}:{v:.6g}" for k, v in sorted(att.items())))
        if self.until > 0:
            parts.append(f"until={self.until:.0f}")
        if self.group:
            parts.append(f"group={self.group}")
        if self.copies:
            parts.append(f"copies={self.copies}")
        if self.nofork:
            parts.append("nofork=1")
        if self.deadline > 0:
            parts.append(f"deadline={self.deadline:.0f}")
        if self.mate:
            parts.append(f"mate={self.mate}")
        if self.submit > 0:
            parts.append(f"submit={self.submit:.0f}")
        if self.relaunch:
            parts.append(f"relaunch={self.relaunch}")
        if self.args is not None:
            parts.append("args=" + encode_args(self.args))
        if self.why:
            parts.append("why=" + " ".join(self.why.split()))
        return " ".join(parts)


def decode(text: str) -> JobRecord:
    """Read an admin comment; anything that is not a record of ours gives an empty record
    (a site may use admin comments for other things: they are never an error here)."""
    words = text.strip().split(" ")
    if words and words[0] == MARK_PREFIX:  # job_submit.lua's mark: only the arguments
        given = [w[len("args="):] for w in words if w.startswith("args=")]
        return JobRecord(args=decode_args(given[-1]) if given else None)
    if not words or words[0] != PREFIX:
        return JobRecord()
    values: dict[str, str] = {}
    for k, word in enumerate(words[1:], start=1):
        key, eq, value = word.partition("=")
        if not eq:
            continue
        if key == "why":
            values["why"] = " ".join([value, *words[k + 1:]]).strip()
            break
        values[key] = value
    try:
        epoch = int(values.get("epoch", "-1"))
        place: list[tuple[str, int]] = []
        if values.get("place"):
            for item in values["place"].split(","):
                node, _, count = item.rpartition(":")
                place.append((node, int(count)))
        attained: dict[str, float] = {}
        if values.get("att"):
            for item in values["att"].split(","):
                gpu_type, _, secs = item.rpartition(":")
                attained[gpu_type] = _finite(secs)
        return JobRecord(
            epoch=epoch, state=values.get("state", ""), place=tuple(sorted(place)),
            gpus=int(values.get("gpus", "0")), done=_finite(values.get("done", "0")),
            attained=attained, until=_finite(values.get("until", "0")),
            group=_whole(values.get("group", "0")), copies=_whole(values.get("copies", "0")),
            nofork=values.get("nofork", "0") == "1",
            deadline=_finite(values.get("deadline", "0")),
            mate=_whole(values.get("mate", "0")),
            submit=_finite(values.get("submit", "0")),
            relaunch=_whole(values.get("relaunch", "0")),
            args=decode_args(values["args"]) if "args" in values else None,
            why=values.get("why", ""),
        )
    except ValueError:
        return JobRecord()


def mark(text: str) -> str:
    """job_submit.lua's mark in an admin comment without its recorded arguments
    (``hadar: waits for the sidecar args=1:x`` -> ``hadar: waits for the sidecar``)."""
    return text.strip().split(" args=", 1)[0].strip()


def encode_args(args: Sequence[str]) -> str:
    """``N:item,item`` with each argument's UTF-8 bytes (``surrogateescape``: any bytes) outside
    ``A-Za-z0-9._/+@-`` written ``%XX``: one word, no space, comma or ``=`` in it, and the
    count tells ``0:`` (none) from ``1:`` (one empty argument).  ``-`` when longer than
    :data:`MAX_ARGS_BYTES` (not recorded).  job_submit.lua writes the same text."""
    items = ["".join(chr(b) if b in _PLAIN else f"%{b:02X}"
                     for b in a.encode("utf-8", "surrogateescape")) for a in args]
    text = f"{len(items)}:" + ",".join(items)
    return text if len(text) <= MAX_ARGS_BYTES else "-"


def decode_args(text: str) -> tuple[str, ...] | None:
    """The arguments :func:`encode_args` wrote; None for ``-`` or anything malformed (then
    they are unknown, which keeps the job from being forked, never a wrong argument)."""
    count, colon, rest = text.partition(":")
    if not colon or not count.isdigit() or len(count) > 6:
        return None
    n = int(count)
    items = rest.split(",") if n else ([] if rest == "" else None)
    if items is None or len(items) != n or not all(_ENCODED_ITEM.fullmatch(i) for i in items):
        return None
    return tuple(unquote_to_bytes(i).decode("utf-8", "surrogateescape") for i in items)


def _whole(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value
