"""The files through which a study's trials and the sidecar talk (issue #17), live.

A trial (one task of the study's job array) writes what it reached; the sidecar, which keeps
the study's reports and applies its halving rule (:mod:`hadar_slurm.studies.halving`), writes
back what the trial does next.  Everything lives in the trial's tracker dir (where its runtime
writes ``progress.json``: ``<workdir>/.hadar-tracker/<job id>``), in :data:`STUDY_SUBDIR`::

    study/steered.json    sidecar -> trial: a sidecar steers this study; wait for verdicts
    study/rung-K.json     trial -> sidecar: the metric at rung K (0-based), once per rung
    study/verdict-K.json  sidecar -> trial: what the rule says at rung K

``steered.json``: ``{"format": 1, "study": "lr-search", "rule": "asha", "wait_s": 780.0,
"since": 1700000000.0}``.  Without it no sidecar acts on the study (none runs, or it runs in
shadow mode): a trial then never waits for a verdict and trains every rung, as a plain array
would.  ``wait_s`` bounds how long a trial waits for a verdict (then it trains on, saying so):
a trial is never left stuck by a sidecar that stopped.

``rung-K.json``: ``{"format": 1, "rung": 1, "metric": "accuracy", "value": 0.871, "steps":
4444, "time": 1700000000.0, "config": {"lr": 0.003}}``.  ``steps``: the steps the trial had
trained when it measured; ``time``: when it reported (asynchronous halving ranks a report
among the reports that came before it); ``config``: the trial's configuration
(``HADAR_TRIAL_CONFIG``), or null.  Written once: a trial that runs again (requeued) keeps
its first report of a rung.

``verdict-K.json``: ``{"format": 1, "rung": 1, "verdict": "go", "why": "...", "time": ...}``
with verdict ``go`` (train on to rung K+1), ``stop`` (stopped early: exit), ``wait`` (the rule
has not decided yet: the sidecar requeues the trial held and places it again once the verdict
becomes ``go``, or cancels it on ``stop``) or ``done`` (the last rung).

Every file is replaced atomically (a reader sees the old one or the whole new one) and read
with a size bound, without following a symlink.  Parsing is strict: a bad field is a
:class:`~hadar_slurm.errors.InputError` naming it; the readers here turn it into None plus
the error, so that neither side stops on a damaged file.  No torch here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hadar_slurm.errors import InputError
from hadar_slurm.runtime.tracker import read_small_object
from hadar_slurm.studies.halving import Verdict

__all__ = [
    "FORMAT",
    "STEERED_FILE",
    "STUDY_SUBDIR",
    "RungReport",
    "Steered",
    "VerdictNote",
    "read_object",
    "report_name",
    "verdict_name",
]

FORMAT = 1
STUDY_SUBDIR = "study"
STEERED_FILE = "steered.json"
#: At most this much of one file is read (a few hundred bytes are expected; a trial's
#: configuration may add some).
MAX_BYTES = 1 << 16


def report_name(rung: int) -> str:
    return f"rung-{rung}.json"


def verdict_name(rung: int) -> str:
    return f"verdict-{rung}.json"


def read_object(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is no such file.  Raises ValueError for
    a file that is not one JSON object of at most :data:`MAX_BYTES`, OSError when it cannot
    be read (a symlink, say: it is not followed)."""
    return read_small_object(path, MAX_BYTES, follow=False)


def _read(tracker_dir: str | os.PathLike[str], name: str) -> tuple[str, dict[str, Any] | None]:
    """``(path, its object or None)`` of a study file; InputError (naming the file) when it
    cannot be read."""
    path = Path(tracker_dir, STUDY_SUBDIR, name)
    try:
        return str(path), read_object(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot be read: {exc}", source=str(path)) from None


def _check_rung(rung: int, expected: int, source: str) -> None:
    if rung != expected:
        raise InputError(f"rung {rung} in the file of rung {expected}", source=source,
                         field="rung")


def _check_format(data: dict[str, Any], source: str) -> None:
    if data.get("format") != FORMAT:
        raise InputError(f"unknown format {data.get('format')!r} (this version reads {FORMAT})",
                         source=source, field="format")


def _number(data: dict[str, Any], key: str, source: str, *, low: float | None = None,
            required: bool = True) -> float | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or (low is not None and value < low):
        want = "a finite number" + ("" if low is None else f" >= {low:g}")
        raise InputError(f"expected {want}, got {value!r}", source=source, field=key)
    return float(value)


def _rung(data: dict[str, Any], source: str) -> int:
    value = data.get("rung")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 100:
        raise InputError(f"expected a rung number 0 to 99, got {value!r}", source=source,
                         field="rung")
    return value


@dataclass(frozen=True)
class RungReport:
    """A trial's metric at one rung (``rung-K.json``)."""

    rung: int
    value: float
    steps: float
    time: float
    metric: str = ""
    config: dict[str, Any] | None = None

    def text(self) -> str:
        return json.dumps({"format": FORMAT, "rung": self.rung, "metric": self.metric,
                           "value": self.value, "steps": self.steps, "time": self.time,
                           "config": self.config}, sort_keys=True) + "\n"

    @staticmethod
    def parse(data: dict[str, Any], source: str = "report") -> RungReport:
        _check_format(data, source)
        rung = _rung(data, source)
        value = _number(data, "value", source)
        steps = _number(data, "steps", source, low=0)
        when = _number(data, "time", source, low=0)
        metric = data.get("metric", "")
        if not isinstance(metric, str):
            raise InputError(f"expected a string, got {metric!r}", source=source,
                             field="metric")
        config = data.get("config")
        if config is not None and not isinstance(config, dict):
            raise InputError(f"expected an object or null, got {config!r}", source=source,
                             field="config")
        assert value is not None and steps is not None and when is not None
        return RungReport(rung, value, steps, when, metric, config)

    @staticmethod
    def read(tracker_dir: str | os.PathLike[str], rung: int) -> RungReport | None:
        """The trial's report at ``rung`` (None: none yet).  Raises InputError (naming the
        file and the field) for a damaged one, and for one whose ``rung`` is not its name's."""
        source, data = _read(tracker_dir, report_name(rung))
        if data is None:
            return None
        report = RungReport.parse(data, source)
        _check_rung(report.rung, rung, source)
        return report


@dataclass(frozen=True)
class VerdictNote:
    """What the halving rule says to a trial at one rung (``verdict-K.json``)."""

    rung: int
    verdict: Verdict
    why: str = ""
    time: float = 0.0

    def text(self) -> str:
        return json.dumps({"format": FORMAT, "rung": self.rung, "verdict": self.verdict.value,
                           "why": self.why, "time": self.time}, sort_keys=True) + "\n"

    @staticmethod
    def parse(data: dict[str, Any], source: str = "verdict") -> VerdictNote:
        _check_format(data, source)
        rung = _rung(data, source)
        try:
            verdict = Verdict(str(data.get("verdict")))
        except ValueError:
            raise InputError(f"unknown verdict {data.get('verdict')!r}", source=source,
                             field="verdict", fix="go, stop, wait or done") from None
        why = data.get("why", "")
        when = _number(data, "time", source, low=0, required=False)
        return VerdictNote(rung, verdict, why if isinstance(why, str) else "", when or 0.0)

    @staticmethod
    def read(tracker_dir: str | os.PathLike[str], rung: int) -> VerdictNote | None:
        source, data = _read(tracker_dir, verdict_name(rung))
        if data is None:
            return None
        note = VerdictNote.parse(data, source)
        _check_rung(note.rung, rung, source)
        return note


@dataclass(frozen=True)
class Steered:
    """``steered.json``: a sidecar steers the study; a trial waits at most ``wait_s`` for a
    verdict."""

    study: str
    rule: str
    wait_s: float
    since: float = 0.0

    def text(self) -> str:
        return json.dumps({"format": FORMAT, "study": self.study, "rule": self.rule,
                           "wait_s": self.wait_s, "since": self.since}, sort_keys=True) + "\n"

    @staticmethod
    def parse(data: dict[str, Any], source: str = "steered") -> Steered:
        _check_format(data, source)
        wait_s = _number(data, "wait_s", source, low=0)
        since = _number(data, "since", source, low=0, required=False)
        study, rule = data.get("study", ""), data.get("rule", "")
        assert wait_s is not None
        return Steered(study if isinstance(study, str) else "",
                       rule if isinstance(rule, str) else "", wait_s, since or 0.0)

    @staticmethod
    def read(tracker_dir: str | os.PathLike[str]) -> Steered | None:
        source, data = _read(tracker_dir, STEERED_FILE)
        return None if data is None else Steered.parse(data, source)
