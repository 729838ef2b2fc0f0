"""What the sidecar records on a job in Slurm itself: the job's ``AdminComment``.

Slurm keeps the admin comment with the job (users cannot write it), shows it in
``scontrol show job`` and ``squeue --json``, and saves it across slurmctld restarts.  The sidecar
writes it with every decision it applies to a job (in the same ``scontrol update`` as the
placement), so that a restarted sidecar knows, from Slurm alone, what it decided and in which
epoch, and how much work a job did in its earlier runs.  The text reads as one line::

    hadar epoch=12 state=placed place=node2:2 gpus=2 done=1234.5 att=v100:120,p100:40

``state`` is ``placed`` (released to run on ``place``), ``held`` (waits for a placement),
``preempting`` (a move has begun: the job was sent its checkpoint signal and must be back in the
queue by ``deadline``; a restarted sidecar finishes the move, see
``SlurmBackend._preempt``), ``preempted`` (stopped, back in the queue held, to be placed again),
``forked`` (HadarE: the job itself stays held while ``copies`` copies of it run as the
heterogeneous job ``group`` on ``place``), ``forking`` (the sidecar is submitting such copies;
``group`` is then the newest earlier fork, 0 if none), or ``unsteered`` (released to Slurm's own
scheduler because the sidecar cannot steer it; ``why`` says why, always last since it may hold
spaces).  ``nofork=1`` marks a job that is not forked again (a fork of
it failed, or its copies ended by themselves: it finishes unforked).
``done`` is the steps done and ``att`` the seconds run per GPU type in earlier (finished or
preempted) runs; the current run adds to them from its start time, or from ``until`` when that
is later (the work up to ``until`` is already in ``done``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

PREFIX = "hadar"
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
        if self.why:
            parts.append("why=" + " ".join(self.why.split()))
        return " ".join(parts)


def decode(text: str) -> JobRecord:
    """Read an admin comment; anything that is not a record of ours gives an empty record
    (a site may use admin comments for other things: they are never an error here)."""
    words = text.strip().split(" ")
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
            deadline=_finite(values.get("deadline", "0")), why=values.get("why", ""),
        )
    except ValueError:
        return JobRecord()


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
