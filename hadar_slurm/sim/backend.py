"""The trace-driven simulator: a :class:`~hadar_slurm.loop.ClusterBackend` over a virtual cluster.

Semantics follow Gavel's simulator so numbers compare (see ``data/gavel/README.md``):

* Epochs (rounds) of ``round_s`` seconds (360 s).  A job that arrives during a round is admitted
  at the next round boundary; its JCT still counts from its arrival.
* A placed job runs the whole round, or until it finishes (the exact finish time is recorded).
  The round ends when its last job stops, so a round where every job finishes early is short.
  A GPU freed mid-round stays idle until the round ends; nothing starts mid-round.  With
  ``reschedule_on_finish`` (the sidecar's ``[scheduler] reschedule_on_finish``) a round ends
  as soon as its first job finishes instead, and the next epoch gives its GPUs out; it also
  ends when a job arrives while the round leaves GPUs free (the sidecar's ``jobs_arrived``).
  Such an epoch starts ``wake_delay_s`` late at most (uniform, seeded: the sidecar sees a finish
  or an arrival at its next ``finish_poll_s`` poll); 0 by default.
* When nothing runs and nothing waits, time jumps to the next arrival.
* No start, preemption or checkpoint cost unless ``migration_cost_s`` or ``start_cost_s`` is
  set: then a job that is placed on GPUs other than those it held (or resumes after a pause)
  makes no progress for ``migration_cost_s`` at the start of its round, and a job that starts
  for the first time for ``start_cost_s`` (:class:`~hadar_slurm.costs.LiveCosts` has the live
  world's figures: ``hadar-slurm simulate`` charges them by default).  A round that ends
  sooner (``reschedule_on_finish``) does not cut them short: a job kept on its GPUs pays the
  rest at the start of the next round, as a live job is still starting then.
* A forked start (a heterogeneous job: HadarE's copies, started anew or again) costs a first
  start (``start_cost_s``: a new heterogeneous job, whose old copies, if any, checkpointed)
  and waits for Slurm's backfill scheduler when ``fork_start_s`` or ``fork_interval_s`` is set:
  Slurm starts heterogeneous jobs only from it, and starts no two in one cycle that share a
  node (measured, ``bench/move_cost.py``).  So the forks a round starts, taken in job id order
  (as the sidecar submits them), wait ``fork_start_s`` more than a plain start on average,
  plus ``fork_interval_s`` for each cycle they must wait for an earlier fork that shares a
  node with them (one cycle more than the latest such fork's); all shifted by one draw
  uniform in +-``fork_interval_s / 2`` (seeded: where in the backfill cycle the round
  began).  :class:`~hadar_slurm.costs.LiveCosts` has the dev cluster's figures.
* A forked job ends with a run of its own (its batch script, once its copies' work is done).
  By default that run costs ``start_cost_s`` after the copies end and holds no GPU.  With
  ``final_run`` it is placed as the sidecar places it: once the copies end the job waits, with
  no work left (the policy is told what the sidecar tells it, :func:`remaining_seen`), until an
  epoch places it, unforked (``Snapshot.max_copies`` 1, as the sidecar's ``nofork``), and its
  run holds those GPUs for a first start (``start_cost_s``).

Progress of a job in a round: per-worker rate ``r[h] = rate[h] / scale``; a synchronous job
runs at ``workers * min r over the types it uses`` (the slowest worker sets the pace) times
``spread_factor`` when its workers span several nodes; an asynchronous one at ``sum r``.

What the policy sees: ``policy_table``, when given, is the throughput table the policy plans
with (the ``rate`` of each :class:`~hadar_slurm.policy.base.Snapshot`), e.g. one where some
entries were never measured and are estimates (:mod:`hadar_slurm.rates.estimate`).  Progress,
finish times, forked copies' rates and fairness always follow the true ``table``.  A job placed
on GPUs whose true rate is 0 (the policy's table said it runs there) holds them for the round
without progress; rounds where nothing placed makes progress count as idle epochs.  With
``learn_rates`` the policy's table learns as the sidecar's does (:mod:`hadar_slurm.rates.learn`:
the rate a job's runtime reports replaces the table's from the next epoch on): once any job of a
(job type, scale factor) has run on a GPU type, every job of that kind is planned with its true
rate there from the next snapshot on.

GPU sharing (issue #16): a decision may pack pairs of jobs onto the same GPUs
(:attr:`~hadar_slurm.policy.base.Decision.packed`: both jobs with the same rows, which count
once).  While two jobs share, each advances for the whole round at its co-located rate from
the table's pairs (:attr:`~hadar_slurm.rates.table.ThroughputTable.pairs`; Gavel's simulator
does the same: a job whose partner finishes keeps its co-located rate to the end of the round),
in place of its isolated rate, by the same per-worker rule as above; the GPUs count busy once.
The snapshot offers sharing (``Snapshot.colocated``: the policy table's pairs) with
``gpu_sharing`` on (the default) and a table that has pairs, with fixed rounds or with
``reschedule_on_finish`` (an epoch that only fills free GPUs keeps the running pairs packed
and may pack new pairs on the free GPUs, :func:`~hadar_slurm.loop.fill_decision`).  A decision
that packs where sharing is not offered, or packs a pair the table forbids, jobs of different
scale factors, or jobs on different GPUs, is refused with a :class:`ValueError` (a policy bug).
A decision without pairs runs exactly as before.

HadarE: a job forked into copies (rows with different ``Placement.copy`` indices) progresses at
the sum of its copies' rates, each copy computed as above; the job tracker adds up their
iterations.  Every round a job runs forked it first spends ``consolidation.seconds(job type)``
consolidating the copies' models, making no progress (the GPUs count as busy).  A job whose
copies finish its work ends ``start_cost_s`` later (live, the job itself then runs once, to
the end of its batch script: a start).  The snapshot
says ``multi_node_copies=False`` unless the simulator is built with ``multi_node_copies=True``:
as in Slurm, where each copy is one hetjob component on one node, a copy may not span nodes, so
the simulator scores the HadarE the sidecar can run.  (With ``True`` a copy over several nodes
runs as a gang, slowed by ``spread_factor``, which the live backend cannot do.)  The snapshot's
``migration_s`` is ``migration_cost_s``: the policy is told what a move costs here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.loop import ApplyReport, Change, ChangeKind, diff, even, placement_of
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy.base import (
    Decision,
    FloatArray,
    Placement,
    Snapshot,
    gpus_in_use,
    remaining_seen,
)
from hadar_slurm.rates.colocated import ColocatedTable
from hadar_slurm.rates.table import ThroughputTable

EPS_STEPS = 1e-6
#: Seconds of a start or move below which it counts as over: the clock's rounding (``now +
#: t - now`` differs from ``t`` in the last bits), which left a forked job's own run owing
#: 1e-11 s, re-placed at the same instant for ever.
EPS_S = 1e-6
#: Epochs in a row at one instant after which the simulator stops with an error (a bug: the
#: clock would never move again) rather than loop for ever.
STALL_EPOCHS = 1000


@dataclass(frozen=True)
class SharedChange(Change):
    """A :class:`~hadar_slurm.loop.Change` of a job that shares its GPUs with the job
    ``partner`` this epoch (GPU sharing; the simulator's reconcile makes them for the pairs of
    ``Decision.packed``)."""

    partner: int = -1


@dataclass
class EpochUsage:
    """GPU-seconds used per type in one simulated round."""

    start: float
    end: float
    busy_gpu_s: FloatArray
    running_jobs: int


@dataclass
class SimState:
    remaining: FloatArray
    attained: FloatArray
    finish: FloatArray
    first_start: FloatArray
    usage: list[EpochUsage] = field(default_factory=list)
    #: (round start, {job id: copies}) for every round where some job ran forked.
    copies: list[tuple[float, dict[int, int]]] = field(default_factory=list)
    #: (round start, pairs of job ids sharing GPUs) for every round where some jobs shared.
    packed: list[tuple[float, tuple[tuple[int, int], ...]]] = field(default_factory=list)


class SimulatedCluster:
    """A virtual cluster running a trace.  Implements :class:`~hadar_slurm.loop.ClusterBackend`."""

    def __init__(
        self,
        jobs: Sequence[Job],
        cluster: ClusterSpec,
        table: ThroughputTable,
        *,
        spread_factor: float = 1.0,
        migration_cost_s: float = 0.0,
        start_cost_s: float = 0.0,
        idle_epochs_limit: int = 3,
        consolidation: ConsolidationCost | None = None,
        policy_table: ThroughputTable | None = None,
        learn_rates: bool = False,
        reschedule_on_finish: bool = False,
        multi_node_copies: bool = False,
        wake_delay_s: float = 0.0,
        seed: int = 0,
        even_gangs: bool = False,
        gpu_sharing: bool = True,
        fork_start_s: float = 0.0,
        fork_interval_s: float = 0.0,
        final_run: bool = False,
    ) -> None:
        for name, value in (("wake_delay_s", wake_delay_s), ("fork_start_s", fork_start_s),
                            ("fork_interval_s", fork_interval_s)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        #: A forked start's wait beyond a plain start's (the module docstring).
        self.fork_start_s = fork_start_s
        self.fork_interval_s = fork_interval_s
        #: Whether a forked job's run of its own after its copies is placed and holds GPUs
        #: (the module docstring); ``_final``: the jobs whose copies' work is done and whose
        #: own run has not ended.
        self.final_run = final_run
        self._final: set[int] = set()
        self.reschedule_on_finish = reschedule_on_finish
        #: How late an epoch that a finish or an arrival brings forward starts: uniform in
        #: [0, wake_delay_s) (the sidecar's ``finish_poll_s``: it sees a finish at its next
        #: poll), drawn from a generator seeded with ``seed``.
        self.wake_delay_s = wake_delay_s
        #: Whether a job over several nodes must hold as many GPUs on each (one Slurm job
        #: asks for a GPU count per node): as the sidecar's reconcile, a placement that is not
        #: is not run (a pending job waits, a running one stays where it runs).
        self.even_gangs = even_gangs
        self._rng = np.random.default_rng(seed)
        self.multi_node_copies = multi_node_copies
        self.jobs = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
        self.cluster = cluster
        self.gpu_types = cluster.gpu_types
        self.spread_factor = spread_factor
        self.migration_cost_s = migration_cost_s
        self.start_cost_s = start_cost_s
        self.idle_epochs_limit = idle_epochs_limit
        self.consolidation = consolidation if consolidation is not None else ConsolidationCost()
        n = len(self.jobs)
        h = len(self.gpu_types)
        self.job_ids = np.array([j.job_id for j in self.jobs], dtype=np.int64)
        self.index_of = {int(j): i for i, j in enumerate(self.job_ids)}
        self.arrival = np.array([j.arrival_s for j in self.jobs], dtype=np.float64)
        self.total = np.array([j.total_steps for j in self.jobs], dtype=np.float64)
        self.scale = np.array([j.scale_factor for j in self.jobs], dtype=np.int64)
        self.weight = np.array([j.weight for j in self.jobs], dtype=np.float64)
        self.sync = np.array([j.sync for j in self.jobs], dtype=np.bool_)
        self.rate = np.array(
            [[table.rate(j.job_type, j.scale_factor, g) for g in self.gpu_types]
             for j in self.jobs],
            dtype=np.float64,
        ).reshape(n, h)
        #: What the policy is told (the truth unless ``policy_table`` is given).
        self.policy_rate = self.rate if policy_table is None else np.array(
            [[policy_table.rate(j.job_type, j.scale_factor, g) for g in self.gpu_types]
             for j in self.jobs],
            dtype=np.float64,
        ).reshape(n, h)
        self.learn_rates = learn_rates and policy_table is not None
        #: GPU sharing: the true co-located rates (progress) and those the policy is told
        #: (None: sharing is not offered, see the module docstring).
        # (measured, and estimated on GPU types without measurements: ThroughputTable.colocated)
        self.pairs: ColocatedTable = table.colocated
        told = (table if policy_table is None else policy_table).colocated
        self.offered_pairs: ColocatedTable | None = (
            told if gpu_sharing and len(told) > 0 else None)
        self._partner: dict[int, int] = {}  # job id -> the job it shares its GPUs with
        self._pair_rate: dict[tuple[int, int], FloatArray] = {}  # (index, partner index)
        kinds: dict[tuple[str, int], int] = {}
        self._kind = np.array([kinds.setdefault((j.job_type, j.scale_factor), len(kinds))
                               for j in self.jobs], dtype=np.int64)
        self._learned = np.zeros((len(kinds), h), dtype=np.bool_)  # (kind, type) run so far
        self.node_type = np.array(
            [self.gpu_types.index(nd.gpu_type) for nd in cluster.nodes], dtype=np.int64)
        self.node_gpus = np.array([nd.gpus for nd in cluster.nodes], dtype=np.int64)
        self.node_names = tuple(nd.name for nd in cluster.nodes)
        self.consolidation_s = np.array(
            [self.consolidation.seconds(j.job_type) for j in self.jobs], dtype=np.float64)
        self.state = SimState(
            remaining=self.total.copy(),
            attained=np.zeros((n, h)),
            finish=np.full(n, np.nan),
            first_start=np.full(n, np.nan),
        )
        self.current = Placement.empty()
        self._round_start = 0.0
        self._admitted = 0  # jobs[:admitted] have been admitted
        self._idle_epochs = 0
        self._stalled = 0  # epochs in a row whose next one came at the same instant
        #: Jobs started by the last apply (placed, forked, moved): their seconds without
        #: progress at the start of the round (a first start's cost, or a move's); and jobs
        #: kept on their GPUs whose start or move the last round was too short to pay for
        #: (``_owed``): they pay the rest first.
        self._moved: dict[int, float] = {}
        self._owed: dict[int, float] = {}
        self._advanced_to: float | None = None  # (when _advance last ran, since apply)

    # -- ClusterBackend -------------------------------------------------------------------

    def snapshot(self, epoch: int, now: float, round_s: float, policy_state: object) -> Snapshot:
        self._advance(now)
        if self.learn_rates:
            ran = self.state.attained > 0
            rows, cols = np.nonzero(ran)
            self._learned[self._kind[rows], cols] = True
            known = self._learned[self._kind]
            self.policy_rate[known] = self.rate[known]
        while self._admitted < len(self.jobs) and self.arrival[self._admitted] <= now + 1e-9:
            self._admitted += 1
        active = np.nonzero(np.isnan(self.state.finish[: self._admitted]))[0]
        remaining = self.state.remaining[active]
        max_copies = None
        if self._final:
            # (its own run is not forked: the sidecar marks such a job nofork)
            last = np.isin(self.job_ids[active], np.fromiter(self._final, dtype=np.int64))
            remaining = np.where(last, remaining_seen(self.total[active], self.total[active]),
                                 remaining)
            max_copies = np.where(last, 1, 0).astype(np.int64)  # (0: the policy's own cap)
        return Snapshot(
            epoch=epoch, now=now, round_s=round_s, gpu_types=self.gpu_types,
            node_names=self.node_names, node_type=self.node_type, node_gpus=self.node_gpus,
            job_ids=self.job_ids[active],
            job_types=tuple(self.jobs[i].job_type for i in active.tolist()),
            arrival=self.arrival[active], total=self.total[active],
            remaining=remaining, scale=self.scale[active],
            weight=self.weight[active], sync=self.sync[active], rate=self.policy_rate[active],
            attained=self.state.attained[active], current=self.current,
            policy_state=policy_state,
            multi_node_copies=self.multi_node_copies, migration_s=self.migration_cost_s,
            even_gangs=self.even_gangs, colocated=self.offered_pairs,
            refill_on_finish=self.reschedule_on_finish,
            packed=tuple(sorted((a, b) for a, b in self._partner.items() if a < b)),
            max_copies=max_copies,
        )

    def reconcile(self, snapshot: Snapshot, decision: Decision) -> list[Change]:
        changes = diff(snapshot, decision)
        if decision.packed:
            partner = self._check_packed(snapshot, decision)
            changes = [c if c.job_id not in partner else SharedChange(
                **{f.name: getattr(c, f.name) for f in fields(Change)},
                partner=partner[c.job_id]) for c in changes]
        return self._even(snapshot, changes) if self.even_gangs else changes

    def _check_packed(self, snapshot: Snapshot, decision: Decision) -> dict[int, int]:
        """``{job id: partner}`` of ``decision.packed``, after checking that each pair may
        share (raises :class:`ValueError` where not: a policy bug)."""
        def refuse(why: str) -> ValueError:
            return ValueError(f"epoch {decision.epoch}: decision packs {why}")

        if snapshot.colocated is None:
            raise refuse("jobs on shared GPUs, but this simulator offers no GPU sharing "
                         "(gpu_sharing off, or a table without pairs)")
        placed = decision.placement.by_job_copies()
        partner: dict[int, int] = {}
        for a, b in decision.packed:
            a, b = int(a), int(b)
            if not a < b:
                raise refuse(f"the pair ({a}, {b}): a pair is (lower id, higher id)")
            if a in partner or b in partner:
                raise refuse(f"job {a if a in partner else b} in two pairs")
            if a not in placed or b not in placed:
                raise refuse(f"jobs {a} and {b}, but job {b if a in placed else a} is not "
                             "placed")
            ra, rb = placed[a], placed[b]
            if len(ra) != 1 or len(rb) != 1 or sorted(ra[0]) != sorted(rb[0]):
                raise refuse(f"jobs {a} and {b} on different GPUs (a pair has the same rows)")
            i, j = self.index_of[a], self.index_of[b]
            if self.scale[i] != self.scale[j]:
                raise refuse(f"jobs {a} and {b} of different scale factors")
            for h in {int(self.node_type[n]) for n, _c in ra[0]}:
                g = self.gpu_types[h]
                if snapshot.colocated.pair_rate(self.jobs[i].job_type, self.jobs[j].job_type,
                                                int(self.scale[i]), g)[0] <= 0:
                    raise refuse(f"jobs {a} and {b} on {g}, where the table forbids the pair")
            partner[a], partner[b] = b, a
        return partner

    def _even(self, snapshot: Snapshot, changes: list[Change]) -> list[Change]:
        """``changes`` as the sidecar can make them (``even_gangs``): a placement over nodes
        with unequal GPU counts is not made (a running job keeps its GPUs; a pending one waits),
        and then, on a node that the jobs kept where they were overfill, the jobs the decision
        put there wait (placed ones first, then moved ones, which stop): in Slurm they would
        wait for its GPUs."""
        before = snapshot.current.by_job_copies()
        out: list[Change] = []
        for c in changes:
            uneven = any(len(cp) > 1 and not even(cp) for cp in c.copies)
            if c.kind in (ChangeKind.PLACE, ChangeKind.MOVE) and uneven:
                old = before.get(c.job_id)
                if c.kind is ChangeKind.MOVE and old is not None:
                    out.append(Change(c.epoch, ChangeKind.KEEP, c.job_id,
                                      tuple(tuple(sorted(old[k])) for k in sorted(old)),
                                      "unequal GPUs per node: it stays"))
                continue
            out.append(c)
        used = np.zeros(self.node_gpus.shape[0], dtype=np.int64)
        for c in out:
            if isinstance(c, SharedChange) and c.partner < c.job_id:
                continue  # (the GPUs of a pair count once)
            for cp in c.copies:
                for n, k in cp:
                    used[n] += k
        for kind in (ChangeKind.PLACE, ChangeKind.FORK, ChangeKind.MOVE):
            for k, c in enumerate(out):
                if not (used > self.node_gpus).any():
                    return out
                over = {int(n) for n in np.nonzero(used > self.node_gpus)[0]}
                if c.kind is kind and any(n in over for cp in c.copies for n, _ in cp):
                    for cp in c.copies:
                        for n, g in cp:
                            used[n] -= g
                    out[k] = Change(c.epoch, ChangeKind.STOP, c.job_id, (),
                                    "its GPUs are still held") if kind is ChangeKind.MOVE else (
                        Change(c.epoch, ChangeKind.WAIT, c.job_id, (), "its GPUs are still held"))
        return out

    def apply(self, changes: list[Change], now: float) -> ApplyReport:
        """Run what ``changes`` leave running from ``now`` on (applying them twice is the same
        as once: the placement is what they name)."""
        started = (ChangeKind.PLACE, ChangeKind.FORK, ChangeKind.MOVE)
        # (a forked job's own run after its copies is a first start: nothing to stop)
        self._moved = {
            c.job_id: (self.start_cost_s if np.isnan(self.state.first_start[
                self.index_of[c.job_id]]) or c.job_id in self._final else self.migration_cost_s)
            for c in changes if c.kind in started}
        self._stagger_forks(changes)
        self.current = placement_of(changes)
        self._advanced_to = None
        # A job that keeps its GPUs while its start or move is not over yet (an epoch came
        # sooner: a job ended or arrived) still has the rest of it to go, as live: the epoch
        # does not restart it, and it does not run until its restart is done.
        kept = set(self.current.job.tolist())
        for job_id, owed in self._owed.items():
            if job_id in kept and job_id not in self._moved:
                self._moved[job_id] = owed
        self._owed = {}
        self._partner = {c.job_id: c.partner for c in changes
                         if isinstance(c, SharedChange) and c.copies}
        if self._partner:
            self.state.packed.append(
                (now, tuple(sorted((a, b) for a, b in self._partner.items() if a < b))))
        self._round_start = now
        forked = {j: k for j, k in self.current.num_copies().items() if k > 1}
        if forked:
            self.state.copies.append((now, forked))
        for job_id in set(self.current.job.tolist()):
            i = self.index_of[job_id]
            if np.isnan(self.state.first_start[i]):
                self.state.first_start[i] = now
        return ApplyReport(applied=[{"job": c.job_id, "action": c.kind.value}
                                    for c in changes if c.kind is not ChangeKind.KEEP])

    def _stagger_forks(self, changes: Sequence[Change]) -> None:
        """Charge each forked start of this round (the copies of one job started anew) a first
        start and its wait for Slurm's backfill scheduler (the module docstring)."""
        if not (self.fork_start_s or self.fork_interval_s):
            return
        forks = sorted((c.job_id, {n for rows in c.copies for n, _ in rows}) for c in changes
                       if c.job_id in self._moved and len(c.copies) > 1)
        if not forks:
            return
        shift = (float(self._rng.uniform(-0.5, 0.5)) * self.fork_interval_s
                 if self.fork_interval_s else 0.0)
        cycles: list[tuple[set[int], int]] = []
        for job_id, nodes in forks:
            cycle = 1 + max((k for seen, k in cycles if seen & nodes), default=-1)
            cycles.append((nodes, cycle))
            self._moved[job_id] = self.start_cost_s + max(
                self.fork_start_s + shift + cycle * self.fork_interval_s, 0.0)

    def next_epoch_start(self, now: float, round_s: float) -> float | None:
        nxt = self._next_epoch_start(now, round_s)
        if nxt is not None and nxt <= now + EPS_S:
            self._stalled += 1
            if self._stalled >= STALL_EPOCHS:
                stuck = sorted(self.current.by_job())
                raise RuntimeError(
                    f"the simulator stalled: {STALL_EPOCHS} epochs in a row at t={now:.3f} s "
                    f"(jobs placed: {stuck[:10]}); a bug in the simulator or the policy")
        else:
            self._stalled = 0
        return nxt

    def _next_epoch_start(self, now: float, round_s: float) -> float | None:
        ttf = [self._time_to_finish(j, copies)
               for j, copies in self.current.by_job_copies().items()]
        ends = [t for t in ttf if t > 0]  # 0: the job makes no progress where it is
        arrival = (float(self.arrival[self._admitted]) if self._admitted < len(self.jobs)
                   else None)
        if ends:
            self._idle_epochs = 0
            # the round ends early when every job ended, or (reschedule_on_finish) when the
            # first one did: its GPUs are free for the next epoch instead of idle
            due = now + round_s
            end = now + min(round_s, min(ends) if self.reschedule_on_finish else max(ends))
            if self.reschedule_on_finish and arrival is not None and int(gpus_in_use(
                    self.current, self._pairs(), self.node_gpus.shape[0]).sum()) < int(
                    self.node_gpus.sum()):
                end = min(end, arrival)  # (and as soon as a job arrives while GPUs are free)
            if self.reschedule_on_finish and end < due:
                end = min(end + self._wake(), due)
            return end
        waiting = bool(np.isnan(self.state.finish[: self._admitted]).any())
        if arrival is not None:
            if self.reschedule_on_finish:  # nothing runs: the arrival starts an epoch
                if waiting and arrival >= now + round_s:
                    return now + round_s
                return max(arrival, now) + self._wake()
            return max(arrival, now + round_s) if waiting else max(arrival, now)
        if waiting:
            # Jobs wait but the policy ran nothing; give up after a few such epochs rather than
            # loop forever (e.g. jobs that no GPU type of the cluster can run).
            self._idle_epochs += 1
            if self._idle_epochs >= self.idle_epochs_limit:
                return None
            return now + round_s
        return None

    def _pairs(self) -> tuple[tuple[int, int], ...]:
        """The pairs of the current placement (both jobs still running)."""
        return tuple(sorted((a, b) for a, b in self._partner.items()
                            if a < b and b in self.current.job and a in self.current.job))

    def _wake(self) -> float:
        """How late after a finish or an arrival the epoch it brings forward starts."""
        return float(self._rng.uniform(0.0, self.wake_delay_s)) if self.wake_delay_s else 0.0

    # -- mechanics --------------------------------------------------------------------------

    def job_rate(self, job_id: int, rows: Sequence[tuple[int, int]]) -> float:
        """Steps/s of ``job_id`` on ``rows`` ((node, GPUs) pairs)."""
        i = self.index_of[job_id]
        return self._rate_on(i, self.rate[i] / self.scale[i], rows)

    def _rate_on(self, i: int, per_worker: FloatArray, rows: Sequence[tuple[int, int]]
                 ) -> float:
        """Steps/s of job index ``i`` on ``rows`` with per-worker rates ``per_worker[h]``."""
        workers = np.zeros(len(self.gpu_types))
        for n, c in rows:
            workers[self.node_type[n]] += c
        used = workers > 0
        if not used.any():
            return 0.0
        if self.sync[i]:
            r = float(workers.sum() * per_worker[used].min())
            if len(rows) > 1:
                r *= self.spread_factor
            return r
        return float((workers * per_worker).sum())

    def forked_rate(self, job_id: int, copies: Mapping[int, Sequence[tuple[int, int]]]) -> float:
        """Steps/s of ``job_id`` over its copies: the sum of each copy's :meth:`job_rate`."""
        return sum(self.job_rate(job_id, rows) for rows in copies.values())

    def shared_rate(self, job_id: int, partner: int, rows: Sequence[tuple[int, int]]) -> float:
        """Steps/s of ``job_id`` on ``rows`` while it shares them with ``partner``: as
        :meth:`job_rate`, with the co-located rates of the true table's pairs."""
        i, j = self.index_of[job_id], self.index_of[partner]
        pr = self._pair_rate.get((i, j))
        if pr is None:
            sf = int(self.scale[i])
            pr = np.array([self.pairs.pair_rate(self.jobs[i].job_type, self.jobs[j].job_type,
                                                sf, g)[0] for g in self.gpu_types])
            self._pair_rate[(i, j)] = pr
        return self._rate_on(i, pr / self.scale[i], rows)

    def _running_rate(self, job_id: int, copies: Mapping[int, Sequence[tuple[int, int]]]
                      ) -> float:
        """Steps/s of a job of the current placement (shared or not)."""
        partner = self._partner.get(job_id)
        if partner is None or len(copies) != 1:
            return self.forked_rate(job_id, copies)
        return self.shared_rate(job_id, partner, next(iter(copies.values())))

    def _delay(self, job_id: int, copies: int) -> float:
        """Seconds without progress at the start of the round: restart, then consolidation."""
        moved = self._moved.get(job_id, 0.0)
        consolidate = float(self.consolidation_s[self.index_of[job_id]]) if copies > 1 else 0.0
        return moved + consolidate

    def _time_to_finish(self, job_id: int,
                        copies: Mapping[int, Sequence[tuple[int, int]]]) -> float:
        r = self._running_rate(job_id, copies)
        if r <= 0:
            return 0.0
        return (self._delay(job_id, len(copies))
                + float(self.state.remaining[self.index_of[job_id]]) / r)

    def _advance(self, now: float) -> None:
        """Run the current placement from the round's start to ``now``.  Once per instant: a
        second call at the same ``now`` before the next :meth:`apply` (a subclass that
        advances before its own snapshot work, :class:`~hadar_slurm.studies.sim.StudyCluster`)
        changes nothing; it used to take the whole round's start and move costs as still owed,
        charging every job kept on its GPUs its restart again at each epoch."""
        if self._advanced_to == now:
            return
        self._advanced_to = now
        span = now - self._round_start
        running = set(self.current.job.tolist())
        self._owed = {j: cost - max(span, 0.0) for j, cost in self._moved.items()
                      if j in running and cost > max(span, 0.0) + EPS_S}
        if span <= 0 or len(self.current) == 0:
            return
        busy = np.zeros(len(self.gpu_types))
        st = self.state
        held_by: dict[int, float] = {}
        copies_done: set[int] = set()
        for job_id, copies in self.current.by_job_copies().items():
            i = self.index_of[job_id]
            r = self._running_rate(job_id, copies)
            if r <= 0:
                continue
            rows = [row for cp in copies.values() for row in cp]
            full_delay = self._delay(job_id, len(copies))  # (restart and consolidation, in full)
            delay = min(full_delay, span)
            ttf = float(st.remaining[i]) / r
            run = min(span - delay, ttf)
            st.remaining[i] -= r * run
            held = delay + run
            for h in {int(self.node_type[n]) for n, _ in rows}:
                st.attained[i, h] += held
            for n, c in rows:
                busy[self.node_type[n]] += c * held
            held_by[job_id] = held
            if st.remaining[i] <= EPS_STEPS * max(1.0, float(self.total[i])) or run >= ttf:
                st.remaining[i] = 0.0
                if job_id in self._final:
                    # its own run ends once its start is over (an epoch may come sooner)
                    if full_delay <= span + EPS_S:
                        st.finish[i] = self._round_start + delay
                        self._final.discard(job_id)
                elif self.final_run and len(copies) > 1:
                    self._final.add(job_id)  # (its copies leave their GPUs; it waits for its run)
                    copies_done.add(job_id)
                else:
                    # (a forked job ends with a run of its own, its batch script after the
                    # copies' training: a start, once its copies have freed their GPUs)
                    last = self.start_cost_s if len(copies) > 1 else 0.0
                    st.finish[i] = self._round_start + delay + ttf + last
        for a, b in self._partner.items():
            if a < b and a in held_by and b in held_by:  # shared GPUs are busy once
                for n, c in self.current.rows_of(a):
                    busy[self.node_type[n]] -= c * min(held_by[a], held_by[b])
        st.usage.append(EpochUsage(self._round_start, now, busy, len(self.current.by_job())))
        self._round_start = now
        gone = np.concatenate([self.job_ids[~np.isnan(st.finish)],
                               np.fromiter(copies_done, dtype=np.int64)])
        self.current = self.current.select(np.isin(self.current.job, gone, invert=True))
