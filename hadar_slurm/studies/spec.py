"""A tuning study as the scheduler sees it: many trials of one model, stopped early by a halving
rule (issue #17).

A study runs ``trials`` configurations of one model.  Each trial trains up to ``max_steps``
iterations and reports its metric at the end of every *rung*: rung ``k`` (``0 <= k < rungs``) is
reached after ``max_steps * eta ** -(rungs - 1 - k)`` steps, so the last rung is the full budget
and each rung has ``eta`` times the budget of the one before (successive halving's geometric
schedule, Jamieson & Talwalkar 2016; Li et al., Hyperband, JMLR 2018).  At a rung the halving
``rule`` (:mod:`hadar_slurm.studies.halving`) promotes a trial (it trains on to the next rung) or
stops it:

* ``asha``: asynchronous successive halving (Li et al., "A System for Massively Parallel
  Hyperparameter Tuning", MLSys 2020, Algorithm 2: its promotion form): a trial that reaches a
  rung goes on as soon as it ranks in the top ``1/eta`` of the trials that reached that rung so
  far, pauses until then, and stops once it no longer can.  No trial waits for a whole
  cohort.
* ``sh``: synchronous successive halving (one Hyperband bracket): trials wait at a rung until
  every trial promoted into it has reported; then the best ``1/eta`` go on and the rest stop.
* ``hyperband``: Hyperband (Li et al., JMLR 2018): the trials are split into ``rungs``
  brackets, each synchronous successive halving that starts at another rung
  (:meth:`StudySpec.brackets`).  The first bracket starts at rung 0 with the most trials and
  halves most often, as ``sh`` does; the last starts at the last rung: its few trials train
  to the end unstopped.  A trial trains on below its bracket's first rung.  Where aggressive
  stopping would drop a configuration that learns slowly but ends best, a later bracket still
  gives some of them the whole budget.
* ``none``: no early stopping: every trial trains to ``max_steps`` (a plain Slurm job array).

A study's best configuration is known when every trial has stopped or finished; the best is the
finished trial with the best metric at the last rung.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hadar_slurm.errors import InputError

__all__ = ["Rule", "StudySpec", "copies_cap", "trial_weight"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Rule(enum.StrEnum):
    """The halving rule of a study (see the module docstring)."""

    ASHA = "asha"
    SH = "sh"
    HYPERBAND = "hyperband"
    NONE = "none"

    @staticmethod
    def parse(text: str, *, field: str = "rule", source: str | None = None) -> Rule:
        try:
            return Rule(text.strip().lower())
        except ValueError:
            raise InputError(f"unknown halving rule {text!r}", source=source, field=field,
                             fix="one of: asha (asynchronous), sh (synchronous successive "
                                 "halving), hyperband (brackets of sh that start at each "
                                 "rung), none (every trial to the end)") from None


@dataclass(frozen=True)
class StudySpec:
    """One study (see the module docstring).  ``job_type`` is the model's key in the throughput
    table (one GPU per trial); ``metric`` and ``mode`` name what the trials report and whether
    higher (``max``) or lower (``min``) is better."""

    name: str
    job_type: str
    trials: int
    max_steps: float
    rungs: int = 4
    eta: float = 3.0
    rule: Rule = Rule.ASHA
    metric: str = "accuracy"
    mode: str = "max"

    def __post_init__(self) -> None:
        src = f"study {self.name!r}"
        if not _NAME.match(self.name):
            raise InputError(f"bad study name {self.name!r}", source="study", field="study",
                             fix="1 to 64 letters, digits, '_', '.' or '-', starting with a "
                                 "letter or digit")
        if not (isinstance(self.trials, int) and self.trials >= 1):
            raise InputError(f"a study needs at least one trial, got {self.trials!r}",
                             source=src, field="trials", fix="a whole number >= 1")
        if not (math.isfinite(self.max_steps) and self.max_steps > 0):
            raise InputError(f"max_steps must be a positive number, got {self.max_steps!r}",
                             source=src, field="max_steps",
                             fix="the iterations of a trial that trains to the end")
        if not (isinstance(self.rungs, int) and 1 <= self.rungs <= 10):
            raise InputError(f"rungs must be 1 to 10, got {self.rungs!r}", source=src,
                             field="rungs", fix="e.g. rungs=4 (three halvings)")
        if not (math.isfinite(self.eta) and self.eta >= 2):
            raise InputError(f"eta must be a number >= 2, got {self.eta!r}", source=src,
                             field="eta", fix="the reduction factor, e.g. eta=3")
        if self.max_steps * self.eta ** -(self.rungs - 1) < 1:
            raise InputError(
                f"the first rung would train {self.max_steps * self.eta ** -(self.rungs - 1):.3g}"
                " steps, less than one", source=src, field="rungs",
                fix="fewer rungs, a smaller eta or a larger max_steps")
        if self.mode not in ("max", "min"):
            raise InputError(f"mode must be max or min, got {self.mode!r}", source=src,
                             field="mode", fix="max: higher is better (accuracy); min: lower "
                                               "is better (loss)")
        if not self.metric or not _NAME.match(self.metric):
            raise InputError(f"bad metric name {self.metric!r}", source=src, field="metric",
                             fix="the name the trials report, e.g. metric=accuracy")

    @property
    def rung_steps(self) -> tuple[float, ...]:
        """The steps at which each rung is reached (the last is ``max_steps``)."""
        return tuple(self.max_steps * self.eta ** -(self.rungs - 1 - k)
                     for k in range(self.rungs))

    def better(self, a: float, b: float) -> bool:
        """Whether metric ``a`` is strictly better than ``b``."""
        return a > b if self.mode == "max" else a < b

    def sort_key(self, value: float) -> float:
        """A key that sorts metrics best first."""
        return -value if self.mode == "max" else value

    def brackets(self, trials: Sequence[int]) -> dict[int, int]:
        """``hyperband``: the rung each trial's bracket starts halving at, for ``trials`` in
        submission order (every other rule: 0 for all).  Bracket ``b`` starts at rung ``b``
        and halves ``s = rungs - 1 - b`` times; it gets trials in Hyperband's proportions,
        ``eta ** s / (s + 1)`` (Li et al., JMLR 2018, Algorithm 1: the same budget per
        bracket), rounded by largest remainder, at least one per bracket while there are
        trials enough (fewer trials than brackets: the first brackets, one trial each).  The
        first bracket takes the first trials of the array, and so on."""
        order = list(trials)
        if self.rule is not Rule.HYPERBAND:
            return {t: 0 for t in order}
        n = len(order)
        count = [0] * self.rungs
        if n < self.rungs:
            count[:n] = [1] * n
        else:
            weights = [self.eta ** (self.rungs - 1 - b) / (self.rungs - b)
                       for b in range(self.rungs)]
            share = [n * w / sum(weights) for w in weights]
            count = [math.floor(x) for x in share]
            by_rest = sorted(range(self.rungs),
                             key=lambda b: (-(share[b] - math.floor(share[b])), b))
            for b in by_rest[:n - sum(count)]:
                count[b] += 1
            for b in range(self.rungs):  # (at least one each, from the largest)
                if count[b] == 0:
                    count[count.index(max(count))] -= 1
                    count[b] = 1
        out: dict[int, int] = {}
        k = 0
        for b, c in enumerate(count):
            for t in order[k:k + c]:
                out[t] = b
            k += c
        return out

    def survivors(self, n: int) -> int:
        """How many of ``n`` trials that completed a rung a synchronous rule promotes: the best
        ``floor(n / eta)``, at least one."""
        return max(1, int(n // self.eta))


def copies_cap(gpus: int, live_trials: int) -> int:
    """Water-filling a study's trials over the cluster (issue #17): the most copies (HadarE
    forks) one trial may run as, the cluster's ``gpus`` over the study's ``live_trials``
    rounded up, at least 1: while many trials live they take a GPU each (or share one); once
    few remain, they may spread over the GPUs the stopped ones left.  The simulator's and the
    sidecar's rule."""
    return max(1, -(-gpus // max(1, live_trials)))


def trial_weight(trials: int, live_trials: int) -> float:
    """A study's weight is kept as its halving stops trials (issue #17): each of its
    ``live_trials`` (those the policy is offered now) weighs its study's ``trials`` over them,
    at least 1, times its own weight.  Each trial of a study that starts weighs what a job
    does; once the rule has stopped three quarters of them, each that goes on weighs four.  The
    study is one piece of work whose end (its best configuration known) follows its last
    trials, and in Hadar's order (weighted shortest remaining time first) and its utility those
    few trials would otherwise count for no more than any other job, however much of the study
    rests on them.  The simulator's and the sidecar's rule."""
    return max(1.0, float(trials) / float(max(1, live_trials)))
