"""Tuning studies in the simulator: trials that report at rungs and are stopped early.

:class:`StudyCluster` is the trace-driven simulator (:class:`~hadar_slurm.sim.backend.
SimulatedCluster`) with a study controller in front of each snapshot, the part the sidecar
will play live:

* each trial is a one-GPU job (its model's rates from the table) whose work is the steps to its
  next rung;
* when a trial reaches its rung (its segment's work is done) it reports its metric
  (:class:`~hadar_slurm.studies.curves.LearningCurves`), and at the next epoch the halving rule
  (:func:`~hadar_slurm.studies.halving.verdicts`) says whether it goes on (its work grows to the
  next rung and it waits to be placed again), stops, or waits (``sh``: for its cohort;
  ``asha``: until it ranks among the best ``1/eta`` of its rung's reports, or cannot);
* a trial that goes on at once and is placed on the GPUs it reported from carries no restart
  cost: live it never stopped.  A trial placed elsewhere, or one that waited, restarts from its
  checkpoint (the simulator's move cost);
* the study ends when each trial has stopped or reached the last rung; its best configuration
  is known then (:class:`StudyOutcome`).

The policy sees trials as jobs like any other, but for two marks in its snapshot: ``spread``
(HadarE offers a trial its water-filling cap of copies) and ``after`` (the steps of the rungs
after the one a trial trains toward: its path to the study's end, which Hadar weighs where it
asks which jobs cannot wait).  With ``reschedule_on_finish`` (the sidecar's
default, used here) a trial that reports brings the next epoch forward, so promotions and the
GPUs that stopped trials free are acted on within the wake delay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hadar_slurm.loop import ApplyReport, Change
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy.base import Policy, Snapshot
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.run import SimResult, run_backend
from hadar_slurm.studies.curves import LearningCurves
from hadar_slurm.studies.halving import Verdict, best_trial, verdicts
from hadar_slurm.studies.spec import StudySpec, copies_cap, trial_weight

#: The copies cap of the jobs that are not trials (HadarE's default ``max_copies``).
OTHER_COPIES = 4

__all__ = ["StudyCluster", "StudyOutcome", "StudyRun", "StudySimResult", "simulate_studies"]


@dataclass(frozen=True)
class StudyRun:
    """A study to simulate: its spec, its trials' curves, the job id of its first trial (the
    others follow, one per trial, as a Slurm array's tasks) and when it is submitted."""

    spec: StudySpec
    curves: LearningCurves
    first_job_id: int
    arrival_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.curves) != self.spec.trials:
            raise ValueError(f"study {self.spec.name}: {len(self.curves)} curves for "
                             f"{self.spec.trials} trials")

    @property
    def job_ids(self) -> tuple[int, ...]:
        return tuple(range(self.first_job_id, self.first_job_id + self.spec.trials))

    def jobs(self) -> list[Job]:
        first = self.spec.rung_steps[0]
        return [Job(job_id=j, job_type=self.spec.job_type, scale_factor=1, total_steps=first,
                    arrival_s=self.arrival_s) for j in self.job_ids]


@dataclass
class StudyOutcome:
    """What happened to one study."""

    name: str
    rule: str
    trials: int
    arrival_s: float
    end_s: float  # when its last trial stopped or finished (nan: it did not end)
    best_trial: int | None  # the trial index (0-based) with the best last-rung report
    best_config: str
    best_report: float  # its last-rung report
    best_final: float  # its noise-free full-budget metric
    oracle_trial: int  # the trial an exhaustive search would pick
    oracle_final: float
    stopped_at: list[int]  # trials stopped at each rung
    reports: list[dict[int, float]] = field(repr=False, default_factory=list)

    @property
    def time_to_best_s(self) -> float:
        return self.end_s - self.arrival_s

    def row(self) -> dict[str, Any]:
        return {"study": self.name, "rule": self.rule, "trials": self.trials,
                "time_to_best_s": round(self.time_to_best_s, 3),
                "best_trial": self.best_trial, "best_config": self.best_config,
                "best_report": round(self.best_report, 5),
                "best_final": round(self.best_final, 5),
                "oracle_trial": self.oracle_trial, "oracle_final": round(self.oracle_final, 5),
                "stopped_at": self.stopped_at}


class _Study:
    """The controller's record of one study."""

    def __init__(self, run: StudyRun, index_of: dict[int, int]) -> None:
        self.run = run
        self.spec = run.spec
        self.ids = run.job_ids
        self.index = [index_of[j] for j in self.ids]
        self.reports: list[dict[int, float]] = [{} for _ in range(self.spec.rungs)]
        self.rung = [0] * self.spec.trials  # the rung each trial trains towards
        self.pending: dict[int, int] = {}  # trial -> rung it waits at for a verdict
        self.final: dict[int, Verdict] = {}  # trial -> STOP or DONE
        self.stopped_at = [0] * self.spec.rungs
        self.end_s = float("nan")


class StudyCluster(SimulatedCluster):
    """The simulator with studies (see the module docstring).  ``jobs``: the other jobs of the
    cluster; the trials' jobs are added from ``studies`` (their ids must not collide)."""

    def __init__(self, jobs: Sequence[Job], studies: Sequence[StudyRun], cluster: ClusterSpec,
                 table: ThroughputTable, **kwargs: Any) -> None:
        trial_jobs = [j for s in studies for j in s.jobs()]
        ids = [j.job_id for j in jobs] + [j.job_id for j in trial_jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("job ids of the studies' trials collide with other jobs'")
        super().__init__([*jobs, *trial_jobs], cluster, table, **kwargs)
        self.studies = [_Study(s, self.index_of) for s in studies]
        self.trial_ids = frozenset(j.job_id for j in trial_jobs)
        self._reported_from: dict[int, list[tuple[int, int]]] = {}  # job id -> rows

    def snapshot(self, epoch: int, now: float, round_s: float, policy_state: object) -> Snapshot:
        rows = self.current.by_job()
        self._advance(now)
        for study in self.studies:
            self._halve(study, now, rows)
        snap = super().snapshot(epoch, now, round_s, policy_state)
        trials = np.isin(snap.job_ids, np.fromiter(self.trial_ids, dtype=np.int64))
        pos = {int(j): k for k, j in enumerate(snap.job_ids.tolist())}
        return replace(snap, max_copies=self._copies_cap(snap, pos), spread=trials,
                       after=self._after(snap, pos), weight=self._weights(snap, pos))

    def _weights(self, snap: Snapshot, pos: dict[int, int]) -> np.ndarray:
        """Per job, its weight: a trial's times :func:`trial_weight` (its study's trials
        over those live now: the study's weight is kept as its halving stops trials); the
        other jobs' as they are.  ``pos``: each job id's index in ``snap``."""
        weight = snap.weight.astype(np.float64, copy=True)
        for study in self.studies:
            live = self._live(study, pos)
            if live:
                weight[live] *= trial_weight(study.spec.trials, len(live))
        return weight

    @staticmethod
    def _live(study: _Study, pos: dict[int, int]) -> list[int]:
        """The indices in the snapshot (``pos``: each job id's) of ``study``'s trials offered
        in it: their water-filling cap and their weight follow from how many they are."""
        return [pos[j] for j in study.ids if j in pos]

    def _copies_cap(self, snap: Snapshot, pos: dict[int, int]) -> np.ndarray:
        """How many copies each job may run as (HadarE): a trial, the cluster's GPUs over its
        study's live trials (water-filling: few trials left may spread over the cluster; the
        snapshot's ``spread`` asks HadarE to offer a trial that cap whatever its length);
        another job, :data:`OTHER_COPIES`.  ``pos``: each job id's index in ``snap``."""
        cap = np.full(snap.num_jobs, OTHER_COPIES, dtype=np.int64)
        gpus = int(self.node_gpus.sum())
        for study in self.studies:
            live = self._live(study, pos)
            if live:
                cap[live] = copies_cap(gpus, len(live))
        return cap

    def _after(self, snap: Snapshot, pos: dict[int, int]) -> np.ndarray:
        """Per job, the steps that follow its end (``Snapshot.after``): a trial's rungs after
        the one it trains toward, to the full budget; 0 for the other jobs.  ``pos``: each job
        id's index in ``snap``."""
        after = np.zeros(snap.num_jobs, dtype=np.float64)
        for study in self.studies:
            steps = study.spec.rung_steps  # (a property: built once per study, not per trial)
            for t, j in enumerate(study.ids):
                k = pos.get(j)
                if k is not None:
                    after[k] = study.spec.max_steps - steps[study.rung[t]]
        return after

    def apply(self, changes: list[Change], now: float) -> ApplyReport:
        report = super().apply(changes, now)
        placed = self.current.by_job()
        for job_id, rows in self._reported_from.items():
            if sorted(placed.get(job_id, [])) == sorted(rows):
                self._moved.pop(job_id, None)  # (it never stopped: no restart)
        self._reported_from = {}
        return report

    def _halve(self, study: _Study, now: float,
               rows: dict[int, list[tuple[int, int]]]) -> None:
        st = self.state
        spec = study.spec
        new = [(float(st.finish[i]), t) for t, i in enumerate(study.index)
               if t not in study.pending and t not in study.final and not np.isnan(st.finish[i])]
        for _t, trial in sorted(new):
            rung = study.rung[trial]
            frac = spec.rung_steps[rung] / spec.max_steps
            study.reports[rung][trial] = study.run.curves.report(trial, rung, frac)
            study.pending[trial] = rung
        if not study.pending:
            return
        fresh = {t for _f, t in new}
        settled = True
        while settled and study.pending:  # (a stop may complete a rung others wait on)
            settled = False
            stopped = [t for t, v in study.final.items() if v is Verdict.STOP]
            out = verdicts(spec, range(spec.trials), study.reports, study.pending, stopped)
            for trial, verdict in out.items():
                if verdict is Verdict.WAIT:
                    continue
                settled = True
                rung = study.pending.pop(trial)
                i = study.index[trial]
                if verdict is Verdict.GO:
                    nxt = spec.rung_steps[rung + 1]
                    st.remaining[i] = nxt - spec.rung_steps[rung]
                    self.total[i] = nxt
                    st.finish[i] = np.nan
                    study.rung[trial] = rung + 1
                    job_id = study.ids[trial]
                    if trial in fresh and job_id in rows:
                        self._reported_from[job_id] = rows[job_id]
                else:
                    study.final[trial] = verdict
                    if verdict is Verdict.STOP:
                        study.stopped_at[rung] += 1
        if len(study.final) == spec.trials and np.isnan(study.end_s):
            study.end_s = float(max(st.finish[i] for i in study.index))

    def outcomes(self) -> list[StudyOutcome]:
        out = []
        for study in self.studies:
            spec, curves = study.spec, study.run.curves
            best = best_trial(spec, study.reports)
            oracle = curves.best_trial()
            out.append(StudyOutcome(
                name=spec.name, rule=spec.rule.value, trials=spec.trials,
                arrival_s=study.run.arrival_s, end_s=study.end_s, best_trial=best,
                best_config=curves.configs[best].text() if best is not None else "",
                best_report=(study.reports[-1][best] if best is not None else float("nan")),
                best_final=curves.final(best) if best is not None else float("nan"),
                oracle_trial=oracle, oracle_final=curves.final(oracle),
                stopped_at=list(study.stopped_at), reports=study.reports))
        return out


@dataclass
class StudySimResult:
    """A simulation with studies: the schedule, each study's outcome and the other jobs'
    average JCT (nan without other jobs)."""

    result: SimResult
    studies: list[StudyOutcome]
    others_avg_jct_s: float
    others_completed: int


def simulate_studies(
    jobs: Sequence[Job],
    studies: Sequence[StudyRun],
    cluster: ClusterSpec,
    table: ThroughputTable,
    policy: Policy,
    *,
    round_s: float = 360.0,
    migration_cost_s: float = 0.0,
    start_cost_s: float = 0.0,
    wake_delay_s: float = 0.0,
    seed: int = 0,
    gpu_sharing: bool = True,
) -> StudySimResult:
    """Run ``policy`` over the other ``jobs`` and the ``studies`` (epochs brought forward by
    finishes and reports, as the sidecar's: ``reschedule_on_finish``)."""
    backend = StudyCluster(jobs, studies, cluster, table, migration_cost_s=migration_cost_s,
                           start_cost_s=start_cost_s, reschedule_on_finish=True,
                           wake_delay_s=wake_delay_s, seed=seed, gpu_sharing=gpu_sharing)
    result = run_backend(backend, policy, round_s=round_s)
    others = np.array([j.job_id not in backend.trial_ids for j in backend.jobs])
    done = others & ~np.isnan(backend.state.finish)
    jct = backend.state.finish[done] - backend.arrival[done]
    return StudySimResult(result, backend.outcomes(),
                          float(jct.mean()) if jct.size else float("nan"), int(done.sum()))
