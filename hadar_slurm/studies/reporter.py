"""A trial's side of a live study (issue #17): report the metric at each rung, and do what the
study's halving rule says.

One task of the study's job array trains one trial.  With the project's runtime it reads::

    from hadar_slurm.runtime import JobRuntime, RuntimeConfig
    from hadar_slurm.studies.reporter import StudyTrial
    from hadar_slurm.studies.halving import Verdict

    config = RuntimeConfig.from_env(work=STEPS, round_seconds=30)
    trial = StudyTrial.from_env(config.tracker_dir)      # rungs, metric: from the environment
    with JobRuntime(model, optimizer, config) as rt:
        for rung, target in trial.rungs_ahead(rt.done):
            for _ in rt.steps(until=target):              # the runtime commits at the rung
                train_one_step()
            verdict = trial.report(rung, evaluate(), steps=rt.done,
                                   interrupted=rt.stop_requested)
            if verdict is Verdict.STOP:
                break                                     # stopped early: its GPU goes on
        rt.finish()

:meth:`StudyTrial.report` writes the rung's report (:mod:`hadar_slurm.studies.protocol`) and,
before the last rung, waits for the sidecar's verdict: ``go`` (train on), ``stop`` (end now:
the checkpoint at the rung is kept) or ``wait`` (the rule has not decided yet: ``sh``, the rest
of the cohort has not reported; ``asha``, the trial does not rank high enough yet; the sidecar
requeues the trial held, which sends the preemption signal: the runtime exits 75 and the trial
resumes at the rung when the sidecar places it again).  It never leaves a trial stuck:
without a sidecar steering the study (no ``steered.json``: none runs, or it runs in shadow
mode) it answers ``go`` at once, and after the sidecar's ``wait_s`` without a ``go`` or
``stop`` it answers ``go`` too, saying so.  A
preemption signal while it waits (``interrupted``) ends the wait with ``go``: the runtime then
stops at its next iteration and saves nothing new (its state is the rung's).

The study's settings come from the environment that ``hadar-slurm tune``'s launcher
(:mod:`hadar_slurm.studies.trial`) sets, or from the arguments: ``HADAR_STUDY_STEPS`` (a
trial's whole budget, the ``steps`` hint), ``HADAR_STUDY_RUNGS``, ``HADAR_STUDY_ETA`` (the
study's ``rungs`` and ``eta`` hints; default 4 and 3), ``HADAR_STUDY``, ``HADAR_STUDY_METRIC``,
``HADAR_STUDY_MODE``, ``HADAR_TRIAL_INDEX`` and ``HADAR_TRIAL_CONFIG`` (recorded with each
report).  Rung ``k`` is reached after ``round(steps / eta ** (rungs - 1 - k))`` steps, the
sidecar's own rounding (:func:`rung_targets`).  No torch here.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hadar_slurm.errors import InputError
from hadar_slurm.runtime.tracker import atomic_write_bytes
from hadar_slurm.studies.halving import Verdict
from hadar_slurm.studies.protocol import (
    STUDY_SUBDIR,
    RungReport,
    Steered,
    VerdictNote,
    report_name,
)

__all__ = ["StudyTrial", "rung_targets"]

_SOURCE = "study trial environment"


def rung_targets(steps: int, rungs: int, eta: float) -> tuple[int, ...]:
    """The step counts at which each rung is reached: ``steps / eta ** (rungs - 1 - k)``
    rounded, at least 1, never two rungs at the same count (the last is ``steps``)."""
    out: list[int] = []
    for k in range(rungs):
        target = max(1, round(steps * eta ** -(rungs - 1 - k)))
        out.append(max(target, out[-1] + 1 if out else 1))
    out[-1] = max(out[-1], steps)
    return tuple(out)


def _env_int(env: Mapping[str, str], name: str, default: int | None, low: int,
             high: int) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise InputError(f"{name}={text!r} is not a whole number {low} to {high}",
                         source=_SOURCE, field=name)
    return int(text)


@dataclass
class StudyTrial:
    """One trial of a live study (see the module docstring).  ``tracker_dir``: the trial's
    tracker dir (the runtime's ``RuntimeConfig.tracker_dir``), where the study's files live;
    ``targets``: the step count of each rung (:func:`rung_targets`)."""

    tracker_dir: Path
    targets: tuple[int, ...]
    study: str = ""
    metric: str = "accuracy"
    mode: str = "max"
    index: int | None = None
    config: dict[str, Any] | None = None
    poll_s: float = 0.5
    log: IO[str] = field(default_factory=lambda: sys.stdout)
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if not self.targets or any(b <= a for a, b in zip(self.targets, self.targets[1:],
                                                          strict=False)) or self.targets[0] < 1:
            raise InputError(f"rung step counts must rise from 1 up, got {self.targets!r}",
                             source="StudyTrial", field="targets")
        if self.mode not in ("max", "min"):
            raise InputError(f"mode must be max or min, got {self.mode!r}",
                             source="StudyTrial", field="mode")

    @classmethod
    def from_env(cls, tracker_dir: str | os.PathLike[str], *, steps: int | None = None,
                 rungs: int | None = None, eta: int | None = None,
                 env: Mapping[str, str] | None = None, **kwargs: Any) -> StudyTrial:
        """The trial of this process: its study's settings from ``env`` (``os.environ``), the
        arguments given here first.  A missing budget or a bad value is an InputError naming
        the variable."""
        env = os.environ if env is None else env
        steps = steps if steps is not None else _env_int(env, "HADAR_STUDY_STEPS", None, 1,
                                                          10**12)
        if steps is None:
            raise InputError("the trial's budget is unknown", source=_SOURCE,
                             field="HADAR_STUDY_STEPS",
                             fix="run it through hadar-slurm tune's launcher, or pass steps= "
                                 "(the study's steps hint)")
        rungs = rungs if rungs is not None else _env_int(env, "HADAR_STUDY_RUNGS", 4, 1, 10)
        eta = eta if eta is not None else _env_int(env, "HADAR_STUDY_ETA", 3, 2, 100)
        assert rungs is not None and eta is not None
        config: dict[str, Any] | None = None
        if env.get("HADAR_TRIAL_CONFIG"):
            try:
                parsed = json.loads(env["HADAR_TRIAL_CONFIG"])
            except ValueError as exc:
                raise InputError(f"not JSON: {exc}", source=_SOURCE,
                                 field="HADAR_TRIAL_CONFIG") from None
            config = parsed if isinstance(parsed, dict) else {"value": parsed}
        index = _env_int(env, "HADAR_TRIAL_INDEX", None, 0, 10**9)
        if index is None:
            index = _env_int(env, "SLURM_ARRAY_TASK_ID", None, 0, 10**9)
        kwargs.setdefault("study", env.get("HADAR_STUDY", ""))
        kwargs.setdefault("metric", env.get("HADAR_STUDY_METRIC", "") or "accuracy")
        kwargs.setdefault("mode", env.get("HADAR_STUDY_MODE", "") or "max")
        return cls(Path(tracker_dir), rung_targets(steps, rungs, eta), index=index,
                   config=config, **kwargs)

    @property
    def last_rung(self) -> int:
        return len(self.targets) - 1

    def rungs_ahead(self, done: int) -> Iterator[tuple[int, int]]:
        """``(rung, target steps)`` of the rungs not passed yet at ``done`` steps (a rung
        reached exactly is still ahead: its verdict is asked again, e.g. after a wait)."""
        for rung, target in enumerate(self.targets):
            if target >= done:
                yield rung, target

    def report(self, rung: int, value: float, *, steps: float,
               interrupted: Callable[[], bool] | None = None) -> Verdict:
        """Report ``value`` (the metric at ``rung``, trained ``steps``) and return what the
        study's rule says (see the module docstring).  A trial that reported this rung before
        (a run before a requeue) keeps its first report."""
        if not 0 <= rung <= self.last_rung:
            raise InputError(f"rung {rung} of a study of {len(self.targets)} rungs",
                             source="StudyTrial.report", field="rung")
        if not math.isfinite(value):
            raise InputError(f"the metric must be a finite number, got {value!r}",
                             source="StudyTrial.report", field="value",
                             fix="report a number (a diverged trial: its worst possible "
                                 "value, e.g. 0 accuracy)")
        report = self._reported(rung)
        if report is None:
            report = RungReport(rung, float(value), float(steps), self.clock(), self.metric,
                                self.config)
            atomic_write_bytes(self._dir / report_name(rung), report.text().encode(),
                               durable=True)
            self._say(f"rung {rung} ({steps:g} steps): {self.metric} {value:.6g}")
        if rung == self.last_rung:
            return Verdict.DONE
        return self._verdict(rung, interrupted)

    # -------------------------------------------------------------------- internals
    @property
    def _dir(self) -> Path:
        return self.tracker_dir / STUDY_SUBDIR

    def _reported(self, rung: int) -> RungReport | None:
        try:
            return RungReport.read(self.tracker_dir, rung)
        except InputError as exc:
            self._say(f"warning: {exc.one_line()}; reported again")
            return None

    def _steered(self) -> Steered | None:
        try:
            return Steered.read(self.tracker_dir)
        except InputError as exc:
            self._say(f"warning: {exc.one_line()}; taken as no sidecar")
            return None

    def _note(self, rung: int) -> VerdictNote | None:
        try:
            return VerdictNote.read(self.tracker_dir, rung)
        except InputError:
            return None  # (read again at the next poll: the sidecar replaces it whole)

    def _verdict(self, rung: int, interrupted: Callable[[], bool] | None) -> Verdict:
        steered = self._steered()
        if steered is None:
            self._say("no sidecar steers this study: it trains on")
            return Verdict.GO
        deadline = self.clock() + steered.wait_s
        said_wait = False
        while True:
            note = self._note(rung)
            if note is not None and note.verdict in (Verdict.GO, Verdict.STOP, Verdict.DONE):
                why = f" ({note.why})" if note.why else ""
                if note.verdict is Verdict.STOP:
                    self._say(f"stopped at rung {rung}{why}")
                    return Verdict.STOP
                self._say(f"goes on from rung {rung}{why}")
                return Verdict.GO
            if note is not None and note.verdict is Verdict.WAIT and not said_wait:
                self._say(f"waits at rung {rung} for the rest of its cohort"
                          + (f" ({note.why})" if note.why else ""))
                said_wait = True
            if interrupted is not None and interrupted():
                return Verdict.GO  # (the runtime stops at once: nothing new is saved)
            if self.clock() >= deadline:
                self._say(f"no verdict at rung {rung} within {steered.wait_s:g} s: it trains "
                          "on")
                return Verdict.GO
            self.sleep(self.poll_s)

    def _say(self, text: str) -> None:
        who = "trial" if self.index is None else f"trial {self.index}"
        study = f" of study {self.study}" if self.study else ""
        print(f"hadar: {who}{study}: {text}", file=self.log, flush=True)
