"""What the sidecar knows of throughputs: the tables it was given, what jobs achieve, estimates.

:class:`Knowledge` is the sidecar's one view of throughputs.  It holds

* the **base table**: the bundled Gavel table with the config's ``throughputs`` files over it;
* an optional **store** (:class:`~hadar_slurm.rates.store.ThroughputStore`, the config's
  ``[scheduler] throughput_db``): measured (``hadar-slurm profile``), learned (below), imported
  and estimated entries, shared with the CLI and other processes;
* the **table** the policy plans with (:attr:`Knowledge.table`) and, per entry, where its value
  came from (:meth:`Knowledge.source`: ``table``, ``imported``, ``measured``, ``learned`` or
  ``estimated``), which ``status`` and ``explain`` show.

**Online learning.**  A job that trains through :mod:`hadar_slurm.runtime` commits a round at a
time and writes ``progress.json`` with each copy's iterations and seconds in the last round.
Every epoch the backend hands the progress of each running hadar job to :meth:`Knowledge.observe`
with what *Slurm* says of it: for each copy (each running component of a fork, or the unforked
job), the GPU type of the node Slurm runs it on and when Slurm started it (:class:`SlurmRun`).
Each *new* committed round (per job, run and round number; a round is folded once) gives one
observation per copy that reported, ``iterations / seconds`` on that copy's GPU type.  A report
written before Slurm started the copy's current run (left by a run before a requeue) is not
this run's and is passed over.  The first
round of each run is left out: it carries the warm-up (process start, data loading, CUDA
context, the first slow iterations).  A job whose GPUs span several types is not observed (its
rate is the slowest gang member's, not any one type's).

**Nothing a user writes reaches the shared store unchecked.**  ``progress.json`` is written by
the user's own script, so a report is a claim, and the store's rates plan every user's jobs.  A
learned rate therefore has to pass three gates:

1. *Checked against Slurm* (:meth:`Knowledge.check`).  An observation counts only for a copy
   Slurm runs, on the GPU type of Slurm's node for it (a report that names another type is
   refused), and only when the round fits what Slurm says: iterations and seconds finite and
   > 0, no more iterations in the round than the job's total, the report written no later than
   now (plus :data:`CLOCK_SLACK_S`), and the round (``updated_at - seconds`` to ``updated_at``)
   inside the time Slurm has run that copy, so a round cannot be longer than the run.  A report
   that fails is dropped, nothing of it is stored, and the first such report of each job is
   logged (event ``learn_rejected``, with the job, GPU type and why).
2. *Bounded by the prior* (:func:`bounds`).  The prior of an entry is what the sidecar trusts
   without any job's say: the base table, the store's measured and imported values (also one a
   learned rate replaced: the store's anchors), or, where those have nothing, the estimate made
   from them.  An observation more than :data:`LEARN_FACTOR` times away from the prior is
   refused (``learn_rejected``), not clipped: a clipped lie would still pull every time by the
   most the bound allows, while a real rate that far off says the prior is wrong, which an
   admin fixes by measuring (``hadar-slurm profile``; a measurement is a new prior).  Without
   any prior only :data:`SANITY_RATES` bound it.  The same bound is applied at every
   :meth:`Knowledge.refresh` to the learned entries in the store, so a learned value stored by
   an older version (or by hand) that is out of bounds is not planned with (event
   ``learned_ignored``, once per entry).
3. *Robust to one outlier and to one job* (:func:`learned_rate`).  Each observation is stored
   with its job id (:meth:`~hadar_slurm.rates.store.ThroughputStore.learn`, a window of the last
   :data:`~hadar_slurm.rates.store.LEARN_WINDOW` per entry); the learned rate takes effect only once
   the window holds at least :data:`LEARN_MIN_SAMPLES` observations from at least
   :data:`LEARN_MIN_JOBS` different jobs, and it is then the median of one vote per job (the
   median of that job's observations) and one for the prior.  So one job, however many rounds
   it reports, has one vote and cannot set a rate alone; with two jobs that disagree, the one
   nearer the prior wins; one bad round is outvoted within its own job.  Until the quorum is
   met the observations wait in the window and the entry (and the table) keep their value.  A
   user who runs several jobs has several votes, each bounded by the prior.

Estimates (below) are made from the trusted values only, never from learned ones, so a learned
rate never moves another entry's estimate, nor its own prior.

**When it is used.**  :meth:`Knowledge.refresh` runs at the start of each epoch's read: it
rebuilds the table from the base and the store, so what was learned in one epoch plans the next.

**Estimates.**  A (job type, GPU count) row that has a throughput on some of the cluster's GPU
types but not on others gets the missing ones estimated from the trusted table (base, measured,
imported; :func:`hadar_slurm.rates.estimate.complete`, low rank in log space), marked ``estimated``,
and written to the store with :meth:`~hadar_slurm.rates.store.ThroughputStore.estimate`, which never
overwrites a real value; a later measurement or learned rate replaces the estimate (the store's
precedence).  Without a store the estimates live in memory only.  While learning, the policy
plans with ``optimism`` times each estimate (``[scheduler] estimate_optimism``, 3 by default):
an estimate that is too high is corrected by what the job then achieves, one that is too low
would keep jobs off that GPU type for good, so the uncertain pairs are tried ("optimism in the
face of uncertainty"; ``bench/estimation.py`` measures what each choice costs a schedule).  The
store keeps the plain estimate.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hadar_slurm.logs import log_event
from hadar_slurm.model import normalize_gpu_type
from hadar_slurm.rates.colocated import ColocatedTable
from hadar_slurm.rates.estimate import complete
from hadar_slurm.rates.store import Entry, ThroughputStore, WindowRow, as_table
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sidecar.fork import Progress

__all__ = [
    "CLOCK_SLACK_S",
    "LEARN_FACTOR",
    "LEARN_MIN_JOBS",
    "LEARN_MIN_SAMPLES",
    "SANITY_RATES",
    "TABLE_SOURCE",
    "Knowledge",
    "Observation",
    "SlurmRun",
    "bounds",
    "learned_rate",
]

logger = logging.getLogger("hadar_slurm.sidecar")

#: The source of a value that comes from the base table (bundled or config files).
TABLE_SOURCE = "table"

#: A learned rate (each observation, and a stored learned value) may be at most this many times
#: above or below its prior (module docstring).  GPU generations and the base table's error put
#: real rates within ~2-3x of a reasonable prior; farther means the prior is wrong (measure it)
#: or the report is.
LEARN_FACTOR = 4.0
#: A learned rate takes effect only with this many different jobs in its window...
LEARN_MIN_JOBS = 2
#: ... and this many observations in all.
LEARN_MIN_SAMPLES = 3
#: Without any prior, a rate (whole-job steps/s) must lie in this range.
SANITY_RATES = (1e-4, 1e5)
#: Seconds a report's times may stray from Slurm's (clocks of the job's node and the sidecar's
#: host, Slurm's whole-second start times).
CLOCK_SLACK_S = 10.0

Key = tuple[str, int, str]


@dataclass(frozen=True)
class SlurmRun:
    """What Slurm says of one copy of a job (a running fork component, or the unforked job):
    the GPU type of the node it runs on and when it started (unix time)."""

    gpu_type: str
    start: float


@dataclass(frozen=True)
class Observation:
    """One round of one copy: ``iters`` in ``seconds`` on ``gpu_type``."""

    job_id: int
    job_type: str
    scale_factor: int
    gpu_type: str
    iters: float
    seconds: float

    @property
    def rate(self) -> float:
        return self.iters / self.seconds


def bounds(prior: float | None) -> tuple[float, float]:
    """The range a learned rate must lie in: :data:`LEARN_FACTOR` times either side of
    ``prior``, or :data:`SANITY_RATES` without one."""
    if prior is None or not math.isfinite(prior) or prior <= 0:
        return SANITY_RATES
    return prior / LEARN_FACTOR, prior * LEARN_FACTOR


def learned_rate(window: Sequence[WindowRow], prior: float | None) -> float | None:
    """The learned rate of a window of observations (module docstring, gate 3), or None while
    it lacks a quorum: at least :data:`LEARN_MIN_SAMPLES` observations in bounds from at least
    :data:`LEARN_MIN_JOBS` jobs.  Then: the median of one vote per job (the median of its
    observations) and one for the prior.  Rows without a job (seeds, or folded by a caller
    that did not say) and rows out of bounds do not count."""
    lo, hi = bounds(prior)
    per_job: dict[int, list[float]] = {}
    for row in window:
        if row.seed or row.job is None or not lo <= row.rate <= hi:
            continue
        per_job.setdefault(row.job, []).append(row.rate)
    if len(per_job) < LEARN_MIN_JOBS or sum(map(len, per_job.values())) < LEARN_MIN_SAMPLES:
        return None
    votes = [float(statistics.median(rates)) for rates in per_job.values()]
    if prior is not None and lo <= prior <= hi:
        votes.append(prior)
    return float(statistics.median(votes))


@dataclass
class Knowledge:
    """The sidecar's throughputs: base table, store, learned rates and estimates (see the
    module docstring)."""

    base: ThroughputTable
    store: ThroughputStore | None = None
    #: fold what running jobs achieve into the store (needs a store)
    learn: bool = True
    #: while learning (``learn`` and a store), estimates are planned with this many times their
    #: value (see the module docstring); without learning nothing would correct them: 1
    optimism: float = 1.0
    gpu_types: tuple[str, ...] = ()
    table: ThroughputTable = field(init=False)
    #: what learned rates are bounded by: base, measured, imported (and anchors)
    trusted: ThroughputTable = field(init=False)
    _sources: dict[Key, str] = field(init=False, default_factory=dict)
    _folded: dict[int, tuple[str | None, int | None]] = field(init=False, default_factory=dict)
    _written: dict[Key, float] = field(init=False, default_factory=dict)
    _fingerprint: object = field(init=False, default=None)
    _estimated: dict[Key, float] = field(init=False, default_factory=dict)
    _settings: tuple[int, float, float] | None = field(init=False, default=None)
    _rejected: set[int] = field(init=False, default_factory=set)
    _ignored: set[tuple[Key, float]] = field(init=False, default_factory=set)
    #: observations folded into the store (they may still wait for a quorum)
    learned: int = field(init=False, default=0)
    #: observations refused (do not fit Slurm, or out of the prior's bounds)
    rejected: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.table = self.trusted = self.base
        self.refresh()

    def source(self, job_type: str, scale_factor: int, gpu_type: str) -> str:
        """Where the rate the policy uses for this entry came from; ``""`` when there is none."""
        if self.table.rate(job_type, scale_factor, gpu_type) <= 0:
            return ""
        return self._sources.get((job_type, scale_factor, gpu_type), TABLE_SOURCE)

    def prior(self, job_type: str, scale_factor: int, gpu_type: str) -> float | None:
        """What a learned rate of this entry is bounded by (module docstring): the trusted
        table's value, else the estimate made from it, else None."""
        rate = self.trusted.rate(job_type, scale_factor, gpu_type)
        if rate > 0:
            return rate
        return self._estimated.get((job_type, scale_factor, gpu_type))

    def refresh(self) -> None:
        """Rebuild :attr:`table` from the base table and the store, then estimate what the
        cluster's GPU types lack.  Learned entries out of their prior's bounds are left out."""
        entries = self.store.entries() if self.store is not None else []
        anchors = self.store.anchors() if self.store is not None else {}
        trusted_entries = [e for e in entries if e.source in ("measured", "imported")]
        sources: dict[Key, str] = {key: src for key, (_, src) in anchors.items()}
        sources.update((e.key, e.source) for e in trusted_entries)
        anchored: dict[tuple[str, int], dict[str, float]] = {}
        for (job, sf, gpu), (rate, _) in anchors.items():
            anchored.setdefault((job, sf), {})[gpu] = rate
        trusted = self.base.merged(ThroughputTable(anchored, "anchors")).merged(
            as_table(trusted_entries, "store"))
        self.trusted = trusted
        estimates = self._estimates(trusted) if self.gpu_types else {}
        accepted: list[Entry] = []
        for e in entries:
            if e.source != "learned":
                continue
            prior = self.prior(*e.key)
            lo, hi = bounds(prior)
            if lo <= e.rate <= hi:
                accepted.append(e)
                sources[e.key] = "learned"
            elif (e.key, e.rate) not in self._ignored:
                self._ignored.add((e.key, e.rate))
                log_event(logger, "learned_ignored", logging.WARNING, job_type=e.job_type,
                          gpus=e.scale_factor, gpu_type=e.gpu_type, rate=e.rate, prior=prior,
                          why=f"more than {LEARN_FACTOR:g}x from the prior" if prior
                          else "outside the sanity bounds")
        real = trusted.merged(as_table(accepted, "learned")) if accepted else trusted
        # estimates the store holds (e.g. for GPU types this cluster lacks), where nothing real is
        stored = [e for e in entries if e.source == "estimated"
                  and e.gpu_type not in real.rates.get((e.job_type, e.scale_factor), {})]
        table = real.merged(as_table(stored, "store estimates")) if stored else real
        sources.update((e.key, e.source) for e in stored)
        factor = self.optimism if self.learn and self.store is not None else 1.0
        planned: dict[tuple[str, int], dict[str, float]] = {}
        for key, rate in sorted(estimates.items()):
            if real.rate(*key) > 0:
                continue  # learned: the estimate stays the prior only
            planned.setdefault((key[0], key[1]), {})[key[2]] = rate * factor
            sources[key] = "estimated"
            written = self._written.get(key)
            if self.store is not None and (
                    written is None or abs(rate - written) > 0.01 * written):
                self.store.estimate(*key, rate)  # never over a real value
                self._written[key] = rate
        if planned:
            table = table.merged(ThroughputTable(planned, "estimates"))
        if self.store is not None:  # (the GPU memory the config gives wins over the store's)
            table = replace(table, memory=self.store.memory().merged(self.base.memory))
            table = self._with_learned_pairs(table)
        self.table = table
        self._sources = sources

    def _with_learned_pairs(self, table: ThroughputTable) -> ThroughputTable:
        """``table`` with the co-located rates running pairs taught the store (issue #16),
        through the same gates as isolated rates: each vote within :func:`bounds` of the
        prior (the table's pair rate, measured or estimated), at least :data:`LEARN_MIN_JOBS`
        jobs, the median of their votes and the prior's.  A pair the table forbids (or whose
        jobs do not fit in the GPU's memory) stays forbidden; a side never learned keeps the
        table's rate."""
        assert self.store is not None
        votes = self.store.pair_votes()
        if not votes:
            return table
        prior = table.colocated
        learned: dict[tuple[str, str, int, str], float] = {}
        for (a, b, scale), per_gpu in votes.items():
            for gpu, rates in per_gpu.items():
                was = prior.pair_rate(a, b, scale, gpu)[0]
                if was <= 0:
                    continue
                lo, hi = bounds(was)
                ok = [r for r in rates if lo <= r <= hi]
                if len(ok) >= LEARN_MIN_JOBS:
                    learned[(a, b, scale, gpu)] = float(statistics.median([*ok, was]))
        if not learned:
            return table
        pairs: dict[tuple[str, str, int], dict[str, tuple[float, float]]] = {}
        for (a, b, scale, gpu), rate_a in learned.items():
            rate_b = learned.get((b, a, scale, gpu), prior.pair_rate(a, b, scale, gpu)[1])
            pairs.setdefault((a, b, scale), {})[gpu] = (rate_a, rate_b)
            pairs.setdefault((b, a, scale), {})[gpu] = (rate_b, rate_a)
        return replace(table, pairs=table.pairs.merged(ColocatedTable(pairs, "learned pairs")))

    def observe_pair(self, job_id: int, job_type: str, mate_type: str, scale_factor: int,
                     progress: Progress, ran: Mapping[int, SlurmRun], since: float, *,
                     now: float) -> Observation | None:
        """Fold a round of a job that shared its GPU with a job of ``mate_type`` since
        ``since`` (the later of the two starts) into the store's co-located rates: checked as
        :meth:`observe` checks a round (Slurm's GPU type and run, warm-up left out, each round
        once), and only a round that began after the two shared the GPU, within the bounds of
        the table's pair rate.  Returns the observation folded in, or None."""
        if self.store is None or not self.learn or 0 not in ran:
            return None
        mark = (progress.run, progress.rounds)
        if self._folded.get(job_id) == mark:
            return None
        self._folded[job_id] = mark
        if progress.run_rounds is None or progress.run_rounds <= 1 or 0 not in progress.measured:
            return None
        gpu = ran[0].gpu_type
        iters, seconds = progress.measured[0]
        obs = Observation(job_id, job_type, scale_factor, gpu, iters, seconds)
        prior = self.table.colocated.pair_rate(job_type, mate_type, scale_factor, gpu)[0]
        why = self.check(progress, 0, ran, now)
        at = progress.updated_at
        if not why and at is not None and at - seconds < since - CLOCK_SLACK_S:
            why = "the round began before the two jobs shared the GPU"
        if not why and prior <= 0:
            why = f"the table does not let {job_type} share a {gpu} with {mate_type}"
        if not why:
            lo, hi = bounds(prior)
            if not lo <= obs.rate <= hi:
                why = (f"{obs.rate:.4g} it/s beside {mate_type} is more than "
                       f"{LEARN_FACTOR:g}x from the table's {prior:.4g}")
        if why:
            self._reject(job_id, job_type=job_type, gpus=scale_factor, gpu_type=gpu,
                         mate=mate_type, why=why)
            return None
        jobs = self.store.learn_pair(job_type, mate_type, scale_factor, gpu, obs.rate,
                                     job=job_id)
        self.learned += 1
        log_event(logger, "learned_pair", job=job_id, job_type=job_type, mate=mate_type,
                  gpus=scale_factor, gpu_type=gpu, observed=round(obs.rate, 4), jobs=jobs,
                  applied=jobs >= LEARN_MIN_JOBS)
        return obs

    def _estimates(self, real: ThroughputTable) -> dict[Key, float]:
        """Estimates of what ``real`` lacks on the cluster's GPU types (those with at least one
        real rate: nothing on a type never measured can be estimated).  The completion is
        recomputed only when the real entries change."""
        cols = tuple(t for t in self.gpu_types
                     if any(per_gpu.get(t, 0.0) > 0 for per_gpu in real.rates.values()))
        fingerprint = (cols, frozenset(
            (key, g, round(r, 9)) for key, per_gpu in real.rates.items()
            for g, r in per_gpu.items() if g in cols))
        if fingerprint == self._fingerprint:
            return self._estimated
        missing = any(per_gpu.get(t, 0.0) <= 0 for per_gpu in real.rates.values()
                      if any(r > 0 for r in per_gpu.values()) for t in cols)
        estimated: dict[Key, float] = {}
        if missing and cols:
            # the fit's settings are chosen by cross-validation once (seconds), then reused
            # while the trusted table changes (a fraction of a second each time)
            rank, reg, row_reg = self._settings if self._settings else (None, None, None)
            filled = complete(real, gpu_types=cols, rank=rank, reg=reg, row_reg=row_reg)
            if self._settings is None:
                self._settings = (filled.rank, filled.reg, filled.row_reg)
            estimated = {(job, sf, gpu): rate for job, sf, gpu, rate in filled.estimates()}
        self._fingerprint, self._estimated = fingerprint, estimated
        return estimated

    def check(self, progress: Progress, copy: int, ran: Mapping[int, SlurmRun],
              now: float) -> str:
        """Why the last round of ``copy`` in ``progress`` does not fit what Slurm says
        (``ran``: the job's copies Slurm runs), or ``""`` when it does (module docstring,
        gate 1; the prior's bounds are checked by :meth:`observe`)."""
        run = ran.get(copy)
        if run is None:
            return f"Slurm runs no copy {copy} of this job"
        claimed = progress.gpu_types.get(copy)
        if claimed is not None and normalize_gpu_type(claimed) != run.gpu_type:
            return f"copy {copy} reports GPU type {claimed!r}, Slurm runs it on {run.gpu_type}"
        iters, seconds = progress.measured[copy]
        if not (math.isfinite(iters) and math.isfinite(seconds) and iters > 0 and seconds > 0):
            return f"copy {copy} reports {iters!r} iterations in {seconds!r} s"
        if not math.isfinite(progress.done) or iters > progress.done + 0.5:
            return f"copy {copy} reports {iters:g} iterations in a round, {progress.done:g} done"
        at = progress.updated_at
        if at is None or not math.isfinite(at):
            return "the report has no updated_at"
        if at > now + CLOCK_SLACK_S:
            return f"the report is dated {at - now:.0f} s in the future"
        if at - seconds < run.start - CLOCK_SLACK_S:
            return (f"copy {copy}'s round of {seconds:g} s ending at {at:.0f} does not fit in "
                    f"the {max(0.0, at - run.start):.0f} s Slurm had run it by then")
        return ""

    def observe(self, job_id: int, job_type: str, scale_factor: int, progress: Progress,
                ran: Mapping[int, SlurmRun], *, now: float) -> list[Observation]:
        """Fold the new rounds of a running job's progress into the store (module docstring):
        each copy's last round, checked against ``ran`` (what Slurm says of the job's copies,
        by copy index; empty: nothing to check against, nothing learned) and bounded by the
        prior.  Returns the observations folded in (they may wait for a quorum)."""
        if self.store is None or not self.learn or not ran:
            return []
        mark = (progress.run, progress.rounds)
        if self._folded.get(job_id) == mark:
            return []
        self._folded[job_id] = mark
        if progress.run_rounds is None or progress.run_rounds <= 1:
            return []  # the first round of a run is warm-up (or the runtime does not say)
        folded: list[Observation] = []
        for copy, (iters, seconds) in sorted(progress.measured.items()):
            at, run = progress.updated_at, ran.get(copy)
            if at is not None and run is not None and at < run.start - CLOCK_SLACK_S:
                continue  # written by an earlier run (the job was requeued): not this run's
            why = self.check(progress, copy, ran, now)
            gpu = ran[copy].gpu_type if copy in ran else ""
            obs = Observation(job_id, job_type, scale_factor, gpu, iters, seconds)
            prior = self.prior(job_type, scale_factor, gpu) if gpu else None
            if not why:
                lo, hi = bounds(prior)
                if not lo <= obs.rate <= hi:
                    why = (f"{obs.rate:.4g} it/s is more than {LEARN_FACTOR:g}x from the prior "
                           f"{prior:.4g}" if prior is not None else
                           f"{obs.rate:.4g} it/s is outside {lo:g}..{hi:g}")
            if why:
                self._reject(job_id, job_type=job_type, gpus=scale_factor,
                             gpu_type=gpu or None, why=why)
                continue
            held = progress.gpu_mem.get(copy)
            if held is not None:
                self.store.record_footprint(job_type, scale_factor, gpu, held, source="learned")
            taken: list[float | None] = []
            entry = self.store.learn(job_type, scale_factor, gpu, obs.rate, job=job_id,
                                     decide=self._decider(prior, taken))
            folded.append(obs)
            log_event(logger, "learned", job=job_id, job_type=job_type, gpus=scale_factor,
                      gpu_type=gpu, observed=round(obs.rate, 4),
                      rate=round(entry.rate, 4) if entry is not None else None,
                      source=entry.source if entry is not None else None,
                      applied=bool(taken and taken[-1] is not None),
                      samples=entry.samples if entry is not None else 0)
        self.learned += len(folded)
        return folded

    def _reject(self, job_id: int, **fields: object) -> None:
        """Count a refused observation; log the first of each job (``learn_rejected``)."""
        self.rejected += 1
        if job_id not in self._rejected:
            self._rejected.add(job_id)
            log_event(logger, "learn_rejected", logging.WARNING, job=job_id, **fields)

    @staticmethod
    def _decider(prior: float | None, taken: list[float | None],
                 ) -> Callable[[Sequence[WindowRow], Entry | None], float | None]:
        def decide(window: Sequence[WindowRow], old: Entry | None) -> float | None:
            rate = learned_rate(window, prior)
            taken.append(rate)
            return rate
        return decide

    def forget(self, live_jobs: Iterable[int]) -> None:
        """Drop the bookkeeping of jobs that are gone."""
        live = set(live_jobs)
        for job_id in [j for j in self._folded if j not in live]:
            del self._folded[job_id]
        self._rejected &= live
