"""Successive halving: which trials of a study train on at a rung, which stop, which wait.

A pure function of the reports (:func:`verdicts`); the simulator's and the sidecar's study
controllers keep the reports and carry the verdicts out.  The rules are those of
:mod:`hadar_slurm.studies.spec`:

* ``asha`` (Li et al., MLSys 2020, as Optuna's ``SuccessiveHalvingPruner`` applies it): a trial
  that reports at rung ``k`` goes on when its metric ranks within the best
  ``max(1, floor(n / eta))`` of the ``n`` reports at rung ``k`` up to and including its own
  (ties to the earlier report), and stops otherwise.  The first trial at a rung always goes on.
* ``sh``: the cohort of rung 0 is every trial; the cohort of rung ``k + 1`` is the best
  ``max(1, floor(n_k / eta))`` of the cohort of rung ``k`` by their rung-``k`` reports.  A trial
  waits at rung ``k`` until every trial of the cohort has reported there.
* ``none``: every trial goes on.

At the last rung every trial is done.  Reports are ``reports[k][trial] = metric`` in the order
they came (a dict keeps it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from hadar_slurm.studies.spec import Rule, StudySpec

__all__ = ["Verdict", "best_trial", "cohorts", "verdicts"]


class Verdict(enum.StrEnum):
    GO = "go"  # train on to the next rung
    STOP = "stop"  # stopped early: its GPU goes to others
    WAIT = "wait"  # (sh) waits at its rung for the rest of its cohort
    DONE = "done"  # reached the last rung


def _ranked(spec: StudySpec, values: Mapping[int, float]) -> list[int]:
    """Trials best first (ties: the earlier report first)."""
    order = {t: i for i, t in enumerate(values)}
    return sorted(values, key=lambda t: (spec.sort_key(values[t]), order[t]))


def cohorts(spec: StudySpec, trials: Sequence[int],
            reports: Sequence[Mapping[int, float]]) -> list[list[int]]:
    """``sh``: the trials of each rung's cohort that are known so far (a cohort is known once
    the one before it has reported in full)."""
    out = [list(trials)]
    for k in range(spec.rungs - 1):
        cohort = out[-1]
        got = reports[k] if k < len(reports) else {}
        if any(t not in got for t in cohort):
            break
        ranked = _ranked(spec, {t: got[t] for t in cohort})
        out.append(ranked[: spec.survivors(len(cohort))])
    return out


def verdicts(spec: StudySpec, trials: Sequence[int], reports: Sequence[Mapping[int, float]],
             pending: Mapping[int, int]) -> dict[int, Verdict]:
    """The verdict for each trial of ``pending`` (trial -> the rung it reported at and waits
    for a verdict on).  ``trials``: every trial of the study, in submission order."""
    last = spec.rungs - 1
    out: dict[int, Verdict] = {}
    known = cohorts(spec, trials, reports) if spec.rule is Rule.SH else []
    for trial, rung in pending.items():
        if trial not in reports[rung]:
            raise ValueError(f"trial {trial} has no report at rung {rung}")
        if rung >= last:
            out[trial] = Verdict.DONE
        elif spec.rule is Rule.NONE:
            out[trial] = Verdict.GO
        elif spec.rule is Rule.ASHA:
            upto: dict[int, float] = {}
            for t, v in reports[rung].items():
                upto[t] = v
                if t == trial:
                    break
            keep = spec.survivors(len(upto))
            out[trial] = Verdict.GO if trial in _ranked(spec, upto)[:keep] else Verdict.STOP
        elif rung + 1 < len(known):
            out[trial] = Verdict.GO if trial in known[rung + 1] else Verdict.STOP
        else:
            out[trial] = Verdict.WAIT
    return out


def best_trial(spec: StudySpec, reports: Sequence[Mapping[int, float]]) -> int | None:
    """The trial with the best report at the last rung (None before any)."""
    final = reports[spec.rungs - 1] if len(reports) >= spec.rungs else {}
    ranked = _ranked(spec, final)
    return ranked[0] if ranked else None
