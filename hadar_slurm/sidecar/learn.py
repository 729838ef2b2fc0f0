"""What the sidecar knows of throughputs: the tables it was given, what jobs achieve, estimates.

:class:`Knowledge` is the sidecar's one view of throughputs.  It holds

* the **base table**: the bundled Gavel table with the config's ``throughputs`` files over it;
* an optional **store** (:class:`~hadar_slurm.store.ThroughputStore`, the config's
  ``[scheduler] throughput_db``): measured (``hadar-slurm profile``), learned (below), imported
  and estimated entries, shared with the CLI and other processes;
* the **table** the policy plans with (:attr:`Knowledge.table`) and, per entry, where its value
  came from (:meth:`Knowledge.source`: ``table``, ``imported``, ``measured``, ``learned`` or
  ``estimated``), which ``status`` and ``explain`` show.

**Online learning.**  A job that trains through :mod:`hadar_slurm.runtime` commits a round at a
time and writes ``progress.json`` with each copy's iterations and seconds in the last round.
Every epoch the backend hands the progress of each running hadar job to :meth:`Knowledge.observe`;
each *new* committed round (per job, run and round number; a round is folded once) gives one
observation per copy that reported, ``iterations / seconds`` on that copy's GPU type, folded
into the store with :meth:`~hadar_slurm.store.ThroughputStore.learn` (a robust statistic over a
window of recent observations, so one slow or fast round does not drag it).  The first round of
each run is left out: it carries the warm-up (process start, data loading, CUDA context, the
first slow iterations).  A job whose GPUs span several types is not observed (its rate is the
slowest gang member's, not any one type's).

**When it is used.**  :meth:`Knowledge.refresh` runs at the start of each epoch's read: it
rebuilds the table from the base and the store, so what was learned in one epoch plans the next.

**Estimates.**  A (job type, GPU count) row that has a throughput on some of the cluster's GPU
types but not on others gets the missing ones estimated from the whole table
(:func:`hadar_slurm.estimate.complete`, low rank in log space), marked ``estimated``, and written
to the store with :meth:`~hadar_slurm.store.ThroughputStore.estimate`, which never overwrites a
real value; a later measurement or learned rate replaces the estimate (the store's precedence).
Without a store the estimates live in memory only.  While learning, the policy plans with
``optimism`` times each estimate (``[scheduler] estimate_optimism``, 3 by default): an estimate
that is too high is corrected by what the job then achieves, one that is too low would keep jobs
off that GPU type for good, so the uncertain pairs are tried ("optimism in the face of
uncertainty"; ``bench/estimation.py`` measures what each choice costs a schedule).  The store
keeps the plain estimate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hadar_slurm.estimate import complete
from hadar_slurm.logs import log_event
from hadar_slurm.model import normalize_gpu_type
from hadar_slurm.sidecar.fork import Progress
from hadar_slurm.store import Entry, ThroughputStore, as_table
from hadar_slurm.throughputs import ThroughputTable

__all__ = ["TABLE_SOURCE", "Knowledge", "Observation"]

logger = logging.getLogger("hadar_slurm.sidecar")

#: The source of a value that comes from the base table (bundled or config files).
TABLE_SOURCE = "table"

Key = tuple[str, int, str]


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
    _sources: dict[Key, str] = field(init=False, default_factory=dict)
    _folded: dict[int, tuple[str | None, int | None]] = field(init=False, default_factory=dict)
    _written: dict[Key, float] = field(init=False, default_factory=dict)
    _fingerprint: object = field(init=False, default=None)
    _estimated: dict[Key, float] = field(init=False, default_factory=dict)
    _settings: tuple[int, float, float] | None = field(init=False, default=None)
    learned: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.table = self.base
        self.refresh()

    def source(self, job_type: str, scale_factor: int, gpu_type: str) -> str:
        """Where the rate the policy uses for this entry came from; ``""`` when there is none."""
        if self.table.rate(job_type, scale_factor, gpu_type) <= 0:
            return ""
        return self._sources.get((job_type, scale_factor, gpu_type), TABLE_SOURCE)

    def refresh(self) -> None:
        """Rebuild :attr:`table` from the base table and the store, then estimate what the
        cluster's GPU types lack."""
        entries = self.store.entries() if self.store is not None else []
        real_entries = [e for e in entries if e.source != "estimated"]
        real = self.base.merged(as_table(real_entries, "store"))
        sources: dict[Key, str] = {e.key: e.source for e in real_entries}
        # estimates the store holds (e.g. for GPU types this cluster lacks), where nothing real is
        stored = [e for e in entries if e.source == "estimated"
                  and e.gpu_type not in real.rates.get((e.job_type, e.scale_factor), {})]
        table = real.merged(as_table(stored, "store estimates")) if stored else real
        sources.update((e.key, e.source) for e in stored)
        if self.gpu_types:
            estimates = self._estimates(real)
            factor = self.optimism if self.learn and self.store is not None else 1.0
            estimated: dict[tuple[str, int], dict[str, float]] = {}
            for key, rate in sorted(estimates.items()):
                estimated.setdefault((key[0], key[1]), {})[key[2]] = rate * factor
                sources[key] = "estimated"
                written = self._written.get(key)
                if self.store is not None and (
                        written is None or abs(rate - written) > 0.01 * written):
                    self.store.estimate(*key, rate)  # never over a real value
                    self._written[key] = rate
            if estimated:
                table = table.merged(ThroughputTable(estimated, "estimates"))
        self.table = table
        self._sources = sources

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
            # while the table changes by what is learned (a fraction of a second each time)
            rank, reg, row_reg = self._settings if self._settings else (None, None, None)
            filled = complete(real, gpu_types=cols, rank=rank, reg=reg, row_reg=row_reg)
            if self._settings is None:
                self._settings = (filled.rank, filled.reg, filled.row_reg)
            estimated = {(job, sf, gpu): rate for job, sf, gpu, rate in filled.estimates()}
        self._fingerprint, self._estimated = fingerprint, estimated
        return estimated

    def observe(self, job_id: int, job_type: str, scale_factor: int, progress: Progress,
                gpu_types_used: Sequence[str]) -> list[Entry]:
        """Fold the new rounds of a running job's progress into the store (module docstring).

        ``gpu_types_used``: the GPU types the job's nodes have, for copies whose progress does
        not name one (an unforked job).  Returns what was learned."""
        if self.store is None or not self.learn:
            return []
        mark = (progress.run, progress.rounds)
        if self._folded.get(job_id) == mark:
            return []
        self._folded[job_id] = mark
        if progress.run_rounds is None or progress.run_rounds <= 1:
            return []  # the first round of a run is warm-up (or the runtime does not say)
        default = gpu_types_used[0] if len(set(gpu_types_used)) == 1 else None
        learned: list[Entry] = []
        for copy, (iters, seconds) in sorted(progress.measured.items()):
            gpu = progress.gpu_types.get(copy) or default
            if gpu is None:
                continue
            obs = Observation(job_id, job_type, scale_factor, normalize_gpu_type(gpu), iters,
                              seconds)
            entry = self.store.learn(obs.job_type, obs.scale_factor, obs.gpu_type, obs.rate)
            learned.append(entry)
            log_event(logger, "learned", job=job_id, job_type=job_type, gpus=scale_factor,
                      gpu_type=obs.gpu_type, observed=round(obs.rate, 4),
                      rate=round(entry.rate, 4), samples=entry.samples)
        self.learned += len(learned)
        return learned

    def forget(self, live_jobs: Iterable[int]) -> None:
        """Drop the bookkeeping of jobs that are gone."""
        live = set(live_jobs)
        for job_id in [j for j in self._folded if j not in live]:
            del self._folded[job_id]
