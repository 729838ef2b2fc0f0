"""Successive halving: which trials of a study train on at a rung, which stop, which wait.

A pure function of the reports (:func:`verdicts`); the simulator's and the sidecar's study
controllers keep the reports and carry the verdicts out.  The rules are those of
:mod:`hadar_slurm.studies.spec`:

* ``asha``: asynchronous successive halving as Li et al. give it (MLSys 2020, Algorithm 2, its
  promotion form): a trial that reports at rung ``k`` goes on as soon as it ranks within the
  best ``floor(n / eta)`` of the ``n`` reports of rung ``k`` so far; until then it waits
  (pauses).  It stops once it can no longer get there: when rung ``k`` is complete (no other
  trial can still report there) and it is not within the best ``max(1, floor(n / eta))``, or
  earlier when even with every trial still to come reporting below it, it would not be.  A
  promotion is never taken back (a trial promoted early stays promoted when better reports
  come), so a rung sends on about ``n / eta`` trials whatever the order the reports come in,
  and no trial waits for a whole cohort.
* ``sh``: the cohort of rung 0 is every trial; the cohort of rung ``k + 1`` is the best
  ``max(1, floor(n_k / eta))`` of the cohort of rung ``k`` by their rung-``k`` reports.  A trial
  waits at rung ``k`` until every trial of the cohort has reported there.
* ``hyperband``: the trials are split into brackets (:meth:`StudySpec.brackets`); bracket ``b``
  is ``sh`` over its own trials from rung ``b`` on (its cohort at rung ``b`` is all of them),
  and below rung ``b`` its trials go on without waiting.
* ``none``: every trial goes on.

At the last rung every trial is done.  Reports are ``reports[k][trial] = metric`` in the order
they came (a dict keeps it); ties rank the earlier report first.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence

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
            reports: Sequence[Mapping[int, float]], start: int = 0) -> list[list[int]]:
    """``sh``: the trials of each rung's cohort that are known so far (a cohort is known once
    the one before it has reported in full), from rung ``start`` (``hyperband``: a bracket's
    first rung, whose cohort is ``trials``, the bracket's): item ``j`` is rung ``start + j``'s."""
    out = [list(trials)]
    for k in range(start, spec.rungs - 1):
        cohort = out[-1]
        got = reports[k] if k < len(reports) else {}
        if any(t not in got for t in cohort):
            break
        ranked = _ranked(spec, {t: got[t] for t in cohort})
        out.append(ranked[: spec.survivors(len(cohort))])
    return out


def verdicts(spec: StudySpec, trials: Sequence[int], reports: Sequence[Mapping[int, float]],
             pending: Mapping[int, int], stopped: Collection[int] = ()) -> dict[int, Verdict]:
    """The verdict for each trial of ``pending`` (trial -> the rung it reported at and waits
    for a verdict on).  ``trials``: every trial of the study, in submission order;
    ``stopped``: the trials that will report nothing more (stopped earlier, or lost: their job
    ended), which ``asha`` needs to know when a rung is complete."""
    last = spec.rungs - 1
    out: dict[int, Verdict] = {}
    # sh: one bracket of every trial from rung 0; hyperband: one per first rung
    start = spec.brackets(trials)
    known: dict[int, list[list[int]]] = {}
    if spec.rule in (Rule.SH, Rule.HYPERBAND):
        for b in sorted(set(start.values())):
            known[b] = cohorts(spec, [t for t in trials if start[t] == b], reports, b)
    complete = _complete(spec, trials, reports, pending, stopped) if (
        spec.rule is Rule.ASHA) else []
    for trial, rung in pending.items():
        if trial not in reports[rung]:
            raise ValueError(f"trial {trial} has no report at rung {rung}")
        if rung >= last:
            out[trial] = Verdict.DONE
        elif spec.rule is Rule.NONE:
            out[trial] = Verdict.GO
        elif spec.rule is Rule.ASHA:
            got = reports[rung]
            rank = _ranked(spec, got).index(trial)
            n = len(got)
            if rank < (spec.survivors(n) if complete[rung] else int(n // spec.eta)):
                out[trial] = Verdict.GO
            elif complete[rung]:
                out[trial] = Verdict.STOP
            else:
                # it can still go on only if reports still to come lift the quota above it
                to_come = sum(1 for t in trials if t not in got and t not in stopped)
                out[trial] = (Verdict.STOP if rank >= spec.survivors(n + to_come)
                              else Verdict.WAIT)
        elif rung < start[trial]:
            out[trial] = Verdict.GO  # (hyperband: below its bracket's first rung)
        elif rung + 1 - start[trial] < len(known[start[trial]]):
            out[trial] = (Verdict.GO if trial in known[start[trial]][rung + 1 - start[trial]]
                          else Verdict.STOP)
        else:
            out[trial] = Verdict.WAIT
    return out


def _complete(spec: StudySpec, trials: Sequence[int], reports: Sequence[Mapping[int, float]],
              pending: Mapping[int, int], stopped: Collection[int]) -> list[bool]:
    """``asha``: for each rung, whether no trial can report there any more: every trial has
    reported at rung 0 or stopped; at rung ``k``, rung ``k - 1`` is complete and every trial
    promoted from it (it reported there, waits for nothing and is not stopped) has reported at
    ``k`` or stopped."""
    out: list[bool] = []
    came = list(trials)
    for k in range(spec.rungs):
        got = reports[k] if k < len(reports) else {}
        out.append((k == 0 or out[-1]) and all(t in got or t in stopped for t in came))
        came = [t for t in got if t not in stopped and pending.get(t) != k]
    return out


def best_trial(spec: StudySpec, reports: Sequence[Mapping[int, float]]) -> int | None:
    """The trial with the best report at the last rung (None before any)."""
    final = reports[spec.rungs - 1] if len(reports) >= spec.rungs else {}
    ranked = _ranked(spec, final)
    return ranked[0] if ranked else None
