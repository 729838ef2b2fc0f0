"""Whom a running job shares its GPU with: the file through which the sidecar tells it (issue #16).

The sidecar may place two 1-GPU jobs on one GPU (Slurm's ``gres/shard``).  A real job simply
runs slower while it shares; an emulated one (:mod:`hadar_slurm.runtime.emulate`) has to be told,
so that it advances at the co-located rate the throughput table gives for the pair
(:meth:`~hadar_slurm.rates.colocated.ColocatedTable.pair_rate`) instead of its isolated rate.
The sidecar writes :data:`SHARING_FILE` into the job's tracker dir (the dir of its
``progress.json``) when it places the partner, and, when the pair is split, removes it or
(writing as the job's owner, :func:`sharing_text`) replaces it with ``{"format": 1,
"partner": 0}``, which reads as no sharing::

    {"format": 1, "partner": 4243, "partner_type": "CycleGAN", "gpu_type": "k80", "scale": 1,
     "partner_tracker": "/home/u/w/.hadar-tracker/4243", "since": 1700000000.0}

``partner``: the partner's job id; ``partner_type``: its job type (as in the table);
``gpu_type``: the type of the shared GPU; ``scale``: the pair's scale factor (GPUs each job
has); ``partner_tracker``: the partner's tracker dir, whose ``progress.json`` says
``"complete": true`` once the partner has done its work ("" when unknown): the job is alone
again from then on, even before the sidecar gets round to removing the file; ``since``: when
the sharing began (seconds since the epoch, 0 unknown).  Fields this version does not know are
ignored; another ``format`` is not read.

The file is replaced atomically, so a reader sees the old file or the whole new one.  Reading
never raises: the job must keep running whatever the file holds, so a damaged file reads as no
sharing, with one warning line on stderr.  No torch here.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hadar_slurm.errors import InputError
from hadar_slurm.runtime.tracker import PROGRESS_FILE, atomic_write_json, read_small_object

__all__ = [
    "SHARING_FILE",
    "Sharing",
    "clear_sharing",
    "partner_done",
    "read_sharing",
    "sharing_text",
    "write_sharing",
]

#: The sharing file in a job's tracker dir (next to its ``progress.json``).
SHARING_FILE = "sharing.json"
#: Version of the sharing file.
_FORMAT = 1
#: Read at most this much of a sharing or progress file: a few hundred bytes are expected, and
#: the reader is a training job that must not stall on a runaway file.
_MAX_BYTES = 1 << 16


@dataclass(frozen=True)
class Sharing:
    """The job shares its ``scale`` GPUs of ``gpu_type`` with job ``partner`` (of job type
    ``partner_type``) since ``since``; ``partner_tracker``: the partner's tracker dir ("" when
    unknown), from which :func:`partner_done` tells whether the partner has finished."""

    partner: int
    partner_type: str
    gpu_type: str
    scale: int = 1
    partner_tracker: str = ""
    since: float = 0.0

    def __post_init__(self) -> None:
        for name in _FIELDS:
            problem = _problem(name, getattr(self, name))
            if problem is not None:
                raise InputError(problem, source="Sharing", field=name)


def _problem(name: str, value: object) -> str | None:
    """What is wrong with ``value`` as field ``name`` of a :class:`Sharing`, or None."""
    if name in ("partner", "scale"):
        low = 0 if name == "partner" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"expected a whole number >= {low}, got {value!r}"
    elif name in ("partner_type", "gpu_type"):
        if not isinstance(value, str) or not value.strip():
            return f"expected a non-empty string, got {value!r}"
    elif name == "partner_tracker":
        if not isinstance(value, str):
            return f"expected a string, got {value!r}"
    elif name == "since" and (isinstance(value, bool) or not isinstance(value, int | float)
                              or not math.isfinite(value)):
        return f"expected a number of seconds, got {value!r}"
    return None


#: The fields of the file besides ``format``, and whether each must be there.
_FIELDS: dict[str, bool] = {"partner": True, "partner_type": True, "gpu_type": True,
                            "scale": False, "partner_tracker": False, "since": False}


def _path(tracker_dir: str | os.PathLike[str]) -> Path:
    return Path(tracker_dir) / SHARING_FILE


def write_sharing(tracker_dir: str | os.PathLike[str], sharing: Sharing) -> None:
    """Tell the job of ``tracker_dir`` whom it shares its GPU with (creating the dir when
    missing: the sidecar may place a pair before the job has committed anything).  Atomic: the
    job, which polls the file while it runs, never sees half of one."""
    atomic_write_json(_path(tracker_dir), {"format": _FORMAT, **asdict(sharing)})


def sharing_text(sharing: Sharing | None) -> str:
    """The sharing file's text for ``sharing``, or, for None, the text that says the job has
    its GPU to itself again (``"partner": 0``): for a writer that can replace the file but
    not remove it (the sidecar writes it as the job's owner, through
    :meth:`~hadar_slurm.slurm.api.SlurmApi.write_files`)."""
    if sharing is None:
        return json.dumps({"format": _FORMAT, "partner": 0}) + "\n"
    return json.dumps({"format": _FORMAT, **asdict(sharing)}) + "\n"


def clear_sharing(tracker_dir: str | os.PathLike[str]) -> None:
    """The job of ``tracker_dir`` has its GPU to itself again (no file is fine: nothing to
    undo)."""
    try:
        os.unlink(_path(tracker_dir))
    except (FileNotFoundError, NotADirectoryError):
        pass


def _read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (at most :data:`_MAX_BYTES` of it); see
    :func:`~hadar_slurm.runtime.tracker.read_small_object`."""
    return read_small_object(path, _MAX_BYTES)


def _warn(path: Path, problem: str, field: str | None = None) -> None:
    print(f"hadar: warning: {InputError(problem, source=str(path), field=field)}; "
          "read as no sharing", file=sys.stderr, flush=True)


def read_sharing(tracker_dir: str | os.PathLike[str]) -> Sharing | None:
    """Whom the job of ``tracker_dir`` shares its GPU with; None when it has the GPU to itself
    (no file).  A file that cannot be read, is not JSON, has another ``format`` or a bad field
    also reads as None, with one warning line on stderr naming the file and the field: the job
    must keep running, and its isolated rate is the safe guess (the sidecar fixes the file)."""
    path = _path(tracker_dir)
    try:
        data = _read_object(path)
    except (OSError, ValueError) as e:  # (json's JSONDecodeError and UnicodeError included)
        _warn(path, f"cannot be read: {e}")
        return None
    if data is None:
        return None
    if data.get("format") == _FORMAT and data.get("partner") == 0:
        return None  # (:func:`sharing_text` of None: the sidecar says it runs alone again)
    if data.get("format") != _FORMAT:
        _warn(path, f"unknown format {data.get('format')!r} (this version reads {_FORMAT})",
              "format")
        return None
    values: dict[str, Any] = {}
    for name, required in _FIELDS.items():
        if name not in data:
            if required:
                _warn(path, "missing", name)
                return None
            continue
        problem = _problem(name, data[name])
        if problem is not None:
            _warn(path, problem, name)
            return None
        values[name] = data[name]
    if "since" in values:
        values["since"] = float(values["since"])
    return Sharing(**values)


def partner_done(sharing: Sharing) -> bool:
    """Whether the partner has finished its work: its tracker dir's ``progress.json`` says
    ``"complete": true``.  False when that is unknown (no ``partner_tracker``, no progress yet,
    a file that cannot be read — e.g. another user's workdir): the sidecar, which knows when the
    partner left, then removes the sharing file."""
    if not sharing.partner_tracker:
        return False
    try:
        data = _read_object(Path(sharing.partner_tracker) / PROGRESS_FILE)
    except (OSError, ValueError):
        return False
    return data is not None and data.get("complete") is True
