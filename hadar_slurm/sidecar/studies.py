"""The sidecar's study controller (issue #17): successive halving applied live.

A study is a hadar job array whose hints name it (``study=NAME rule=... rungs=... eta=...``);
each array task is one trial.  Every epoch, inside the read (:meth:`StudyBook.observe`):

1. the book learns the study and its trials from the read (the array's pending record lists
   the tasks not split yet, :mod:`hadar_slurm.sidecar.apply` splits them);
2. it reads each live trial's reports (``study/rung-K.json`` in its tracker dir, written by
   :class:`~hadar_slurm.studies.reporter.StudyTrial`; :mod:`hadar_slurm.studies.protocol`);
3. a trial whose job ended (or left Slurm's queue) without reporting the rung it trained for
   is *lost*: under ``sh`` it counts as the worst report of its cohort, so the cohort
   completes and no trial waits for it; under ``asha`` it is one report fewer to wait for;
4. the halving rule (:func:`hadar_slurm.studies.halving.verdicts`, the simulator's) says, for
   each new report, ``go``, ``stop``, ``wait`` or ``done``; a verdict once given is never
   changed, except ``wait``, which becomes ``go`` or ``stop`` later (``sh``: when the cohort
   is in; ``asha``: when the trial ranks among the best ``1/eta`` of its rung's reports so far,
   or can no longer).  Reports rank in the order the sidecar read them (earlier epochs first;
   within one epoch, by the trials' report times).

What each trial then is, for the epoch (:class:`TrialStatus`):

* ``train``: it trains toward its next rung; the policy sees it as a job whose work ends at
  that rung's steps (as the simulator's trials), on the same prices as every other job;
* ``wait``: its rule has not decided yet (``sh``: its cohort has not reported in full;
  ``asha``: it does not rank high enough yet); it is not offered to the policy, so a running
  one is stopped (requeued held: checkpoint signal, grace) and a pending one stays held, until
  the verdict turns;
* ``stopped``: the rule stopped it; the trial reads its verdict and exits by itself (status 0;
  its checkpoint is the rung's); one still pending, or still running the grace period after
  it was told, is cancelled (``CANCEL``);
* ``done``: it reported its last rung and finishes as any job.

The applier writes what the trials are told (:meth:`StudyBook.to_tell`: ``steered.json`` once
per trial, then each verdict), as the trial's owner, at the start of the epoch's changes; the
book is saved to ``studies.json`` in the state dir after every epoch that changed it, so a
restarted sidecar keeps the reports of trials Slurm has forgotten.  ``status`` shows each study
rung by rung (:func:`study_summary`), ``explain`` each trial's verdict.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hadar_slurm.errors import InputError
from hadar_slurm.hints import Hints
from hadar_slurm.logs import log_event
from hadar_slurm.runtime.tracker import atomic_write_json
from hadar_slurm.sidecar import fork as hadare
from hadar_slurm.sidecar.fork import ForkError
from hadar_slurm.slurm import SlurmJob
from hadar_slurm.slurm.parse import (
    FINAL_STATES,
    PENDING_STATES,
    RUNNING_STATES,
    SlurmParseError,
    expand_array_tasks,
)
from hadar_slurm.studies.halving import Verdict, verdicts
from hadar_slurm.studies.protocol import (
    STEERED_FILE,
    STUDY_SUBDIR,
    RungReport,
    Steered,
    VerdictNote,
    report_name,
    verdict_name,
)
from hadar_slurm.studies.reporter import rung_targets
from hadar_slurm.studies.spec import Rule, StudySpec

__all__ = ["STUDIES_FILE", "StudyBook", "TrialStatus", "study_summary"]

logger = logging.getLogger("hadar_slurm.sidecar")

#: The book of studies in the sidecar's state dir.
STUDIES_FILE = "studies.json"
_FORMAT = 1
#: Studies that ended are kept in the book this long (for status), then forgotten.
KEEP_ENDED_S = 7 * 86400.0
#: The job type the rule's spec carries (the halving rules do not use it).
_ANY_TYPE = "trial"


@dataclass
class Trial:
    """The book's record of one trial (a task of the study's array)."""

    task: int
    job_id: int = 0  # the task's job id (0: not seen as a job of its own yet)
    tracker: str = ""  # its tracker dir ("" unknown)
    rung: int = 0  # the rung it trains toward (or waits at, or ended at)
    #: rung -> (value, report time, epoch first read): what it reported
    reports: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    verdicts: dict[int, str] = field(default_factory=dict)  # rung -> verdict given
    told: dict[int, str] = field(default_factory=dict)  # rung -> verdict written to it
    steered: bool = False  # steered.json written
    final: str = ""  # "" (live), "stop", "done" or "lost"
    config: dict[str, Any] | None = None
    why: str = ""  # the last verdict's reason, for explain
    told_at: dict[int, float] = field(default_factory=dict)  # rung -> when it was told

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "job_id": self.job_id, "tracker": self.tracker,
                "rung": self.rung,
                "reports": {str(k): list(v) for k, v in sorted(self.reports.items())},
                "verdicts": {str(k): v for k, v in sorted(self.verdicts.items())},
                "told": {str(k): v for k, v in sorted(self.told.items())},
                "told_at": {str(k): v for k, v in sorted(self.told_at.items())},
                "steered": self.steered, "final": self.final, "config": self.config,
                "why": self.why}

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Trial:
        return Trial(
            task=int(obj["task"]), job_id=int(obj.get("job_id", 0)),
            tracker=str(obj.get("tracker", "")), rung=int(obj.get("rung", 0)),
            reports={int(k): (float(v[0]), float(v[1]), int(v[2]))
                     for k, v in dict(obj.get("reports", {})).items()},
            verdicts={int(k): str(v) for k, v in dict(obj.get("verdicts", {})).items()},
            told={int(k): str(v) for k, v in dict(obj.get("told", {})).items()},
            told_at={int(k): float(v) for k, v in dict(obj.get("told_at", {})).items()},
            steered=bool(obj.get("steered", False)), final=str(obj.get("final", "")),
            config=obj.get("config") if isinstance(obj.get("config"), dict) else None,
            why=str(obj.get("why", "")))


@dataclass
class Study:
    """The book's record of one study: a hadar job array with study hints."""

    array: int  # the array's job id
    name: str
    user: str
    rule: str
    rungs: int
    eta: int
    steps: int
    metric: str
    mode: str
    trials: dict[int, Trial] = field(default_factory=dict)  # by task index
    first_seen: float = 0.0
    ended: float | None = None  # when every trial had stopped, finished or was lost

    @property
    def spec(self) -> StudySpec:
        return StudySpec(name=self.name, job_type=_ANY_TYPE, trials=max(1, len(self.trials)),
                         max_steps=float(self.steps), rungs=self.rungs, eta=float(self.eta),
                         rule=Rule(self.rule), metric=self.metric, mode=self.mode)

    @property
    def targets(self) -> tuple[int, ...]:
        return rung_targets(self.steps, self.rungs, self.eta)

    def best(self) -> tuple[Trial, float] | None:
        """The trial with the best report at the highest rung any trial reached (the study's
        best so far; its best configuration once the study has ended).  Ties go to the report
        read first, as the halving rule's ranking (:func:`~hadar_slurm.studies.halving.
        best_trial`)."""
        for rung in range(self.rungs - 1, -1, -1):
            got = [(t, t.reports[rung][0]) for t in self.trials.values()
                   if rung in t.reports]
            if got:
                sign = -1.0 if self.mode == "max" else 1.0
                return min(got, key=lambda tv: (sign * tv[1], tv[0].reports[rung][2],
                                                tv[0].reports[rung][1], tv[0].task))
        return None

    def to_json(self) -> dict[str, Any]:
        return {"array": self.array, "name": self.name, "user": self.user, "rule": self.rule,
                "rungs": self.rungs, "eta": self.eta, "steps": self.steps,
                "metric": self.metric, "mode": self.mode, "first_seen": self.first_seen,
                "ended": self.ended,
                "trials": [t.to_json() for _, t in sorted(self.trials.items())]}

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Study:
        study = Study(
            array=int(obj["array"]), name=str(obj["name"]), user=str(obj.get("user", "")),
            rule=str(obj["rule"]), rungs=int(obj["rungs"]), eta=int(obj["eta"]),
            steps=int(obj["steps"]), metric=str(obj.get("metric", "accuracy")),
            mode=str(obj.get("mode", "max")), first_seen=float(obj.get("first_seen", 0.0)),
            ended=None if obj.get("ended") is None else float(obj["ended"]))
        for t in obj.get("trials", []):
            trial = Trial.from_json(t)
            study.trials[trial.task] = trial
        return study


@dataclass(frozen=True)
class TrialStatus:
    """What one trial's job is this epoch (see the module docstring)."""

    array: int
    task: int
    study: str
    state: str  # train, wait, stopped, done
    rung: int
    target: int  # the steps of the rung it trains toward (train, done) or reached
    detail: str  # for explain
    cancel: bool = False  # stopped: cancel its job this epoch
    full: int = 0  # the steps of the study's last rung (its full budget); 0: not told
    trials: int = 1  # the study's trials (its array's tasks seen), for its weight

    @property
    def after(self) -> int:
        """The steps of the rungs after the one it trains toward, to the full budget: the work
        that follows it on its path to the study's end, were it promoted each time
        (``Snapshot.after``)."""
        return max(0, self.full - self.target) if self.state == "train" else 0

    @property
    def offered(self) -> bool:
        """Whether the policy sees it this epoch."""
        return self.state in ("train", "done")


@dataclass(frozen=True)
class Note:
    """A file to write into a trial's study dir, as its owner."""

    array: int
    task: int
    job_id: int
    name: str  # file name in the study dir
    text: str
    rung: int  # -1: steered.json
    verdict: str  # "" for steered.json


class StudyBook:
    """The studies the sidecar steers (see the module docstring).  ``path``: where the book is
    kept (None: in memory only); ``wait_s``: how long a trial waits for a verdict before it
    trains on (told in ``steered.json``); ``grace_s``: how long a trial told to stop has to
    leave by itself before it is cancelled (the sidecar's preemption grace)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 wait_s: float = 900.0, grace_s: float = 30.0) -> None:
        self.path = None if path is None else Path(path)
        self.wait_s = wait_s
        self.grace_s = grace_s
        self.studies: dict[int, Study] = {}
        self.status: dict[int, TrialStatus] = {}  # by job id, this epoch
        self.dirty = False
        self.epoch = -1
        self.load_error = ""
        if self.path is not None:
            self._load()

    # -------------------------------------------------------------------- the book
    def _load(self) -> None:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self._set_aside(f"cannot be read: {exc}")
            return
        try:
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError(f"not a book of format {_FORMAT}")
            self.studies = {s.array: s for s in map(Study.from_json, data.get("studies", []))}
        except (KeyError, TypeError, ValueError, IndexError, InputError) as exc:
            self.studies = {}
            self._set_aside(f"damaged: {exc}")

    def _set_aside(self, problem: str) -> None:
        """A damaged book is moved aside (kept for a look) and a new one begun: the trials'
        own report files are read again, so only the report order of ended trials is lost."""
        assert self.path is not None
        kept = self.path.with_name(f"{self.path.name}.damaged")
        try:
            os.replace(self.path, kept)
        except OSError:
            kept = self.path
        self.load_error = f"{self.path}: {problem} (kept as {kept})"
        log_event(logger, "studies_book_damaged", logging.WARNING, path=str(self.path),
                  problem=problem, kept=str(kept))

    def save(self) -> None:
        """Write the book when it changed (atomic); an error is logged, not raised (the next
        epoch tries again)."""
        if self.path is None or not self.dirty:
            return
        try:
            atomic_write_json(self.path, {"format": _FORMAT, "studies": [
                s.to_json() for _, s in sorted(self.studies.items())]})
        except OSError as exc:
            log_event(logger, "state_write_failed", logging.WARNING, path=str(self.path),
                      error=str(exc))
            return
        self.dirty = False

    # -------------------------------------------------------------------- each epoch
    def observe(self, jobs: Sequence[SlurmJob], hints: Mapping[int, Hints], now: float,
                epoch: int) -> dict[int, TrialStatus]:
        """Learn from one read (see the module docstring): ``jobs`` every job of the read,
        ``hints`` the parsed hints of the hadar jobs among them (by job id; a study's array
        record that waits for its split included).  Returns each live trial's status, by job
        id (also kept in :attr:`status`)."""
        self.epoch = epoch
        seen: dict[int, dict[int, SlurmJob | None]] = {}  # array -> task -> its job (or None)
        live = {j.array_job_id for j in jobs if j.state not in FINAL_STATES}
        for job in jobs:
            h = hints.get(job.job_id)
            if h is None or h.study is None or job.array_job_id is None:
                continue
            if job.array_job_id not in self.studies and job.array_job_id not in live:
                continue  # (a study that ended before this book knew it: nothing to steer)
            study = self._study(job, h, now)
            tasks = seen.setdefault(study.array, {})
            if job.array_task_id is not None:
                tasks[job.array_task_id] = job
            try:
                pending = expand_array_tasks(job.array_tasks)
            except SlurmParseError:
                pending = ()
            for task in pending:
                tasks.setdefault(task, None)
        self.status = {}
        for array, study in sorted(self.studies.items()):
            if study.ended is not None and array not in seen:
                if now - study.ended > KEEP_ENDED_S:
                    del self.studies[array]
                    self.dirty = True
                continue
            # (an ended study whose jobs Slurm still shows: its stopped trials that have not
            # left yet stay its own, never the policy's)
            self._step(study, seen.get(array, {}), now, epoch)
        return self.status

    def _study(self, job: SlurmJob, h: Hints, now: float) -> Study:
        assert h.study is not None and job.array_job_id is not None
        study = self.studies.get(job.array_job_id)
        if study is None:
            s = h.study
            study = Study(array=job.array_job_id, name=s.name, user=job.user, rule=s.rule,
                          rungs=s.rungs, eta=s.eta, steps=h.steps, metric=s.metric,
                          mode=s.mode, first_seen=now)
            self.studies[study.array] = study
            self.dirty = True
            log_event(logger, "study_seen", study=s.name, array=study.array, user=job.user,
                      rule=s.rule, rungs=s.rungs, eta=s.eta, steps=h.steps, metric=s.metric,
                      mode=s.mode)
        return study

    def _step(self, study: Study, tasks: Mapping[int, SlurmJob | None], now: float,
              epoch: int) -> None:
        for task in tasks:
            if task not in study.trials:
                study.trials[task] = Trial(task)
                self.dirty = True
        for task, job in tasks.items():
            trial = study.trials[task]
            if job is not None and job.job_id != trial.job_id:
                trial.job_id = job.job_id
                self.dirty = True
            if job is not None and not trial.tracker:
                try:
                    trial.tracker = hadare.tracker_dir(job, None)
                    self.dirty = True
                except ForkError:
                    pass
        for trial in study.trials.values():
            if not trial.final:
                self._read_reports(study, trial, epoch)
        for task, trial in sorted(study.trials.items()):
            if trial.final or trial.rung in trial.reports:
                continue
            job = tasks.get(task)
            gone = task not in tasks or (job is not None and job.state in FINAL_STATES)
            if gone:
                trial.final = "lost"
                trial.why = (f"its job ended ({job.state}) " if job is not None else
                             "its job left Slurm's queue ") + (
                             f"before it reported rung {trial.rung}")
                self.dirty = True
                log_event(logger, "trial_lost", logging.WARNING, study=study.name,
                          array=study.array, task=task, job=trial.job_id, rung=trial.rung,
                          why=trial.why)
        self._judge(study)
        if study.ended is None and study.trials and all(
                t.final for t in study.trials.values()):
            study.ended = now
            self.dirty = True
            best = study.best()
            log_event(logger, "study_done", study=study.name, array=study.array,
                      trials=len(study.trials),
                      best_task=None if best is None else best[0].task,
                      best=None if best is None else best[1],
                      config=None if best is None else best[0].config,
                      seconds=round(now - study.first_seen, 1))
        targets = study.targets
        for task, trial in study.trials.items():
            job = tasks.get(task)
            if job is None or trial.final == "lost":
                continue
            self.status[job.job_id] = self._trial_status(study, trial, job, targets, now)

    def _read_reports(self, study: Study, trial: Trial, epoch: int) -> None:
        """Read the trial's reports from its current rung on (a trial that ran without a
        sidecar may have reported several)."""
        if not trial.tracker:
            return
        rung = trial.rung
        while rung < study.rungs and rung not in trial.reports:
            try:
                report = RungReport.read(trial.tracker, rung)
            except InputError as exc:
                log_event(logger, "trial_report_bad", logging.WARNING, study=study.name,
                          array=study.array, task=trial.task, job=trial.job_id, rung=rung,
                          error=exc.one_line())
                return
            if report is None:
                return
            trial.reports[rung] = (report.value, report.time, epoch)
            if report.config is not None and trial.config is None:
                trial.config = report.config
            self.dirty = True
            log_event(logger, "trial_report", study=study.name, array=study.array,
                      task=trial.task, job=trial.job_id, rung=rung, value=report.value,
                      steps=report.steps)
            if trial.verdicts.get(rung) != Verdict.GO.value:
                return
            rung += 1

    def _judge(self, study: Study) -> None:
        """Give the verdicts the new reports call for (see the module docstring), until none
        changes (a trial stopped may complete a rung that others wait on)."""
        while self._judge_once(study):
            pass

    def _judge_once(self, study: Study) -> bool:
        """One pass of :meth:`_judge`: whether a verdict other than ``wait`` was given."""
        spec = study.spec
        tasks = sorted(study.trials)
        worst = -math.inf if study.mode == "max" else math.inf
        reports: list[dict[int, float]] = []
        for rung in range(study.rungs):
            got = sorted(((t.reports[rung][2], t.reports[rung][1], t.task), t.reports[rung][0])
                         for t in study.trials.values() if rung in t.reports)
            row = {task: value for (_, _, task), value in got}
            for t in study.trials.values():
                # sh, hyperband: a lost trial is the worst of its cohort at the rung it
                # trained for (and after, were it promoted), so that the cohort completes
                if (study.rule in (Rule.SH.value, Rule.HYPERBAND.value) and t.final == "lost"
                        and t.rung <= rung and rung not in t.reports):
                    row[t.task] = worst
            reports.append(row)
        pending = {t.task: t.rung for t in study.trials.values()
                   if not t.final and t.rung in t.reports
                   and t.verdicts.get(t.rung) in (None, Verdict.WAIT.value)}
        if not pending:
            return False
        # (asha: the trials that will report nothing more, for when a rung is complete)
        stopped = [t.task for t in study.trials.values() if t.final in ("stop", "lost")]
        out = verdicts(spec, tasks, reports, pending, stopped)
        settled = False
        for task, verdict in sorted(out.items()):
            trial = study.trials[task]
            rung = pending[task]
            before = trial.verdicts.get(rung)
            if before == verdict.value:
                continue
            settled = settled or verdict is not Verdict.WAIT
            trial.verdicts[rung] = verdict.value
            trial.why = self._why(study, trial, rung, verdict, reports[rung])
            self.dirty = True
            if verdict is Verdict.GO:
                trial.rung = rung + 1
            elif verdict is Verdict.STOP:
                trial.final = "stop"
            elif verdict is Verdict.DONE:
                trial.final = "done"
            log_event(logger, "trial_verdict", study=study.name, array=study.array,
                      task=task, job=trial.job_id, rung=rung, verdict=verdict.value,
                      value=trial.reports[rung][0], why=trial.why)
        return settled

    def _why(self, study: Study, trial: Trial, rung: int, verdict: Verdict,
             row: Mapping[int, float]) -> str:
        value = trial.reports[rung][0]
        head = f"{study.metric} {value:.4g} at rung {rung}"
        if verdict is Verdict.DONE:
            return f"{head}, its last: done"
        if study.rule == Rule.NONE.value:
            return f"{head}; rule none: every trial trains to the end"
        sign = -1.0 if study.mode == "max" else 1.0
        if study.rule == Rule.ASHA.value:
            rank = 1 + sum(1 for v in row.values() if sign * v < sign * value)
            says = {Verdict.GO: "is among the best 1/eta: go on",
                    Verdict.WAIT: "waits until it is among the best 1/eta of them, or cannot "
                                  "be",
                    Verdict.STOP: "can no longer be among the best 1/eta of them: stop"}
            return (f"{head} ranks {rank} of the {len(row)} reports of that rung so far; "
                    f"asha: it {says.get(verdict, verdict.value)}")
        start = study.spec.brackets(sorted(study.trials))
        first = start[trial.task]
        if rung < first:
            return (f"{head}; hyperband: its bracket starts halving at rung {first}: "
                    f"{verdict.value}")
        mates = {t for t, b in start.items() if b == first}
        rule = "sh" if study.rule == Rule.SH.value else f"hyperband (bracket {first})"
        if verdict is Verdict.WAIT:
            missing = [t.task for t in study.trials.values()
                       if not t.final and t.rung == rung and rung not in t.reports
                       and t.task in mates]
            return (f"{head}; {rule} waits for the rest of its cohort ({len(missing)} "
                    "trial(s) still training to that rung)")
        cohort = [v for t, v in row.items() if t in mates]
        keep = study.spec.survivors(len(cohort))
        rank = 1 + sum(1 for v in cohort if sign * v < sign * value)
        return (f"{head} ranks {rank} of its cohort of {len(cohort)}; {rule} keeps the best "
                f"{keep}: {verdict.value}")

    def _trial_status(self, study: Study, trial: Trial, job: SlurmJob,
                      targets: Sequence[int], now: float) -> TrialStatus:
        head = f"trial {trial.task} of study {study.name} (array {study.array}, {study.rule})"
        last = study.rungs - 1
        if trial.final == "stop":
            stop_rung = max((k for k, v in trial.verdicts.items()
                             if v == Verdict.STOP.value), default=trial.rung)
            told = trial.told_at.get(stop_rung)
            cancel = job.state in PENDING_STATES or (
                job.state in RUNNING_STATES and told is not None
                and now >= told + self.grace_s)
            return TrialStatus(study.array, trial.task, study.name, "stopped", stop_rung,
                               targets[stop_rung], f"{head}: stopped: {trial.why}", cancel)
        if trial.final == "done":
            return TrialStatus(study.array, trial.task, study.name, "done", last,
                               targets[last], f"{head}: {trial.why}")
        rung = min(trial.rung, last)
        if trial.verdicts.get(rung) == Verdict.WAIT.value:
            return TrialStatus(study.array, trial.task, study.name, "wait", rung,
                               targets[rung], f"{head}: waits at rung {rung}: {trial.why}")
        if rung in trial.reports:  # reported, no verdict yet (a rule-less moment: never)
            detail = f"{head}: reported rung {rung}, waits for its verdict"
        else:
            detail = (f"{head}: trains to rung {rung} ({targets[rung]} steps)"
                      + (f"; {trial.why}" if trial.why else ""))
        return TrialStatus(study.array, trial.task, study.name, "train", rung, targets[rung],
                           detail, full=targets[last], trials=max(1, len(study.trials)))

    def reported_since(self, live: Iterable[int]) -> list[int]:
        """Jobs (of ``live``) whose trial has written the report of the rung it trains toward
        since the last epoch read it: worth an early epoch, since the trial waits for its
        verdict.  One ``stat`` per trial of ``live`` that has not reported that rung."""
        out = []
        wanted = set(live)
        for study in self.studies.values():
            if study.ended is not None:
                continue
            for trial in study.trials.values():
                if (trial.final or trial.job_id not in wanted or not trial.tracker
                        or trial.rung in trial.reports):
                    continue
                if os.path.exists(os.path.join(trial.tracker, STUDY_SUBDIR,
                                               report_name(trial.rung))):
                    out.append(trial.job_id)
        return sorted(out)

    # -------------------------------------------------------------------- telling
    def to_tell(self, now: float) -> list[Note]:
        """The files the trials must be told now: ``steered.json`` to each trial with a
        tracker dir that has not had it, and each verdict not written yet (wait, then the
        verdict that replaces it)."""
        out: list[Note] = []
        for study in self.studies.values():
            if study.ended is not None and all(
                    t.told.get(k) == v for t in study.trials.values()
                    for k, v in t.verdicts.items()):
                continue
            steered = Steered(study.name, study.rule, self.wait_s, now).text()
            for trial in study.trials.values():
                if not trial.tracker or not trial.job_id or trial.final == "lost":
                    continue
                if not trial.steered and not trial.final:
                    out.append(Note(study.array, trial.task, trial.job_id, STEERED_FILE,
                                    steered, -1, ""))
                for rung, verdict in sorted(trial.verdicts.items()):
                    if trial.told.get(rung) == verdict:
                        continue
                    note = VerdictNote(rung, Verdict(verdict), trial.why, now)
                    out.append(Note(study.array, trial.task, trial.job_id, verdict_name(rung),
                                    note.text(), rung, verdict))
        return out

    def told(self, note: Note, now: float) -> None:
        """``note`` was written at ``now``."""
        trial = self.studies[note.array].trials[note.task]
        if note.rung < 0:
            trial.steered = True
        else:
            trial.told[note.rung] = note.verdict
            trial.told_at[note.rung] = now
        self.dirty = True

    def tracker_of(self, note: Note) -> str:
        return self.studies[note.array].trials[note.task].tracker


def study_summary(study: Study) -> dict[str, Any]:
    """What ``status`` shows of one study: per rung, how many trials reported, went on, were
    stopped or wait; the best report so far and its trial's configuration."""
    rungs = []
    for rung in range(study.rungs):
        reported = [t for t in study.trials.values() if rung in t.reports]
        verdict = [t.verdicts.get(rung) for t in reported]
        rungs.append({
            "rung": rung, "steps": study.targets[rung], "reported": len(reported),
            "go": verdict.count(Verdict.GO.value), "stop": verdict.count(Verdict.STOP.value),
            "wait": verdict.count(Verdict.WAIT.value), "done": verdict.count(Verdict.DONE.value),
            "lost": sum(1 for t in study.trials.values()
                        if t.final == "lost" and t.rung == rung),
            "best": _best_of(study, reported, rung),
        })
    best = study.best()
    return {
        "name": study.name, "array": study.array, "user": study.user, "rule": study.rule,
        "rungs": study.rungs, "eta": study.eta, "steps": study.steps, "metric": study.metric,
        "mode": study.mode, "trials": len(study.trials),
        "live": sum(1 for t in study.trials.values() if not t.final),
        "ended": study.ended, "first_seen": study.first_seen, "by_rung": rungs,
        "best": None if best is None else {
            "task": best[0].task, "job": best[0].job_id, "value": best[1],
            "rung": max(best[0].reports), "config": best[0].config,
            "final": study.ended is not None},
    }


def _best_of(study: Study, trials: Sequence[Trial], rung: int) -> float | None:
    values = [t.reports[rung][0] for t in trials]
    if not values:
        return None
    return max(values) if study.mode == "max" else min(values)
