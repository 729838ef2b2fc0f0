"""The policy interface: a pure function from a :class:`Snapshot` to a :class:`Decision`.

A policy sees the cluster and the jobs of one epoch as arrays (no I/O, no clock), and says, for
the epoch, which GPUs each job gets.  The epoch loop (:mod:`hadar_slurm.loop`) owns everything
else: reading the state, diffing, applying, timing.  The same policy code serves the simulator
and the Slurm sidecar.

State a policy needs across epochs (e.g. Gavel's LP allocation, which it recomputes only when the
set of jobs changes) travels as data: it returns it in :attr:`Decision.policy_state` and gets it
back in the next :attr:`Snapshot.policy_state`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from hadar_slurm.model import GpuType

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class PairRates(Protocol):
    """Co-located throughputs (:class:`hadar_slurm.rates.colocated.ColocatedTable`): whole-job
    steps/s of two jobs while they share ``scale`` GPUs of ``gpu_type``, ``(0.0, 0.0)`` where
    they may not share."""

    def pair_rate(self, job_a: str, job_b: str, scale: int,
                  gpu_type: GpuType) -> tuple[float, float]: ...

    def pair_rates_on(self, job_a: str, job_b: str, scale: int, gpu_types: tuple[GpuType, ...],
                      ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """:meth:`pair_rate` on each of ``gpu_types``: ``(rates of a, rates of b)``."""
        ...

    def pair_cube(self, kinds_a: tuple[tuple[str, int], ...], kinds_b: tuple[tuple[str, int], ...],
                  gpu_types: tuple[GpuType, ...],
                  ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """:meth:`pair_rates_on` of every ``(job type, scale)`` kind of ``kinds_a`` with every
        one of ``kinds_b``: ``[a, b, GPU type]`` each, 0 where they may not share."""
        ...


class Reason(enum.IntEnum):
    """Why a job is (not) placed in an epoch.  Each code names the component that decided.

    A policy stamps each job with the code of the component that refused it, where it refused
    it: the matcher (``NO_FREE_GPU``: given GPU counts, no nodes could hold them), Hadar's gang
    repacking (``NOT_PACKED``), its horizon (``NO_CAPACITY``: none of the GPUs it may use is
    free in any epoch of the plan), its dual (``PRICED_OUT``; ``DEFERRED``: admitted for a
    later epoch and nothing it can use is idle now), Gavel's round and LP, FIFO's queue.
    Values are stable (6 was ``NOT_ARRIVED``, never used: snapshots hold submitted jobs only).
    """

    PLACED = 0
    PRICED_OUT = 1
    NO_FREE_GPU = 2
    NO_THROUGHPUT = 3
    SHARE_SERVED = 4
    QUEUE_ORDER = 5
    AWAITING_ALLOCATION = 7
    NOT_PACKED = 8
    NO_CAPACITY = 9
    DEFERRED = 10

    @property
    def component(self) -> str:
        return _REASON_TEXT[self][0]

    @property
    def text(self) -> str:
        return _REASON_TEXT[self][1]


_REASON_TEXT = {
    Reason.PLACED: ("matcher", "placed"),
    Reason.PRICED_OUT: (
        "hadar.dual",
        "waits: this epoch the GPUs it can use are worth more to jobs ahead of it; it is "
        "offered GPUs again every epoch, as prices fall and jobs finish",
    ),
    Reason.NO_FREE_GPU: (
        "matcher",
        "waits: no free GPUs of a type it can use hold its whole request this epoch (a job over "
        "several nodes needs as many GPUs on each)",
    ),
    Reason.NO_THROUGHPUT: ("throughputs", "never runs: no GPU type of the cluster can run it"),
    Reason.SHARE_SERVED: (
        "gavel.round",
        "waits: it already received its LP share; jobs further below their share go first",
    ),
    Reason.QUEUE_ORDER: ("fifo", "waits: earlier jobs in the queue took the free GPUs"),
    Reason.AWAITING_ALLOCATION: (
        "gavel.lp",
        "waits: arrived after the last LP allocation; gets a share when it is recomputed",
    ),
    Reason.NOT_PACKED: (
        "hadar.gang",
        "waits: a multi-GPU job ahead of it took its GPUs so that its gang can start, and no "
        "other free GPUs fit it this epoch",
    ),
    Reason.NO_CAPACITY: (
        "hadar.horizon",
        "waits: none of the GPUs it runs well on is free in any epoch of the plan's horizon, "
        "and no other GPU it can use is idle now",
    ),
    Reason.DEFERRED: (
        "hadar.dual",
        "waits: the plan runs it in a later epoch, when the GPUs it runs well on are cheaper, "
        "and no GPU it can use is idle now",
    ),
}


@dataclass(frozen=True)
class Placement:
    """GPUs held by jobs, one row per (job, node): ``count`` GPUs of node ``node`` to ``job``.

    ``job`` holds job ids (not indices), so a placement stays meaningful across epochs.
    A node has GPUs of one type, so the type is ``Snapshot.node_type[node]``.

    ``copy`` (HadarE) numbers the copies of a forked job: the rows of one job with the same copy
    index form one trainer (a gang, as an unforked job's rows do); rows with different indices are
    separate copies that train at once and are consolidated by the job tracker.  ``None`` means
    every row is copy 0, i.e. no job is forked (every policy but ``hadare``).
    """

    job: IntArray
    node: IntArray
    count: IntArray
    copy: IntArray | None = None

    @staticmethod
    def empty() -> Placement:
        z = np.zeros(0, dtype=np.int64)
        return Placement(z, z.copy(), z.copy())

    def __len__(self) -> int:
        return int(self.job.shape[0])

    def copy_index(self) -> IntArray:
        """The copy index of every row (zeros when nothing is forked)."""
        if self.copy is None:
            return np.zeros(self.job.shape[0], dtype=np.int64)
        return self.copy

    def select(self, keep: npt.NDArray[np.bool_]) -> Placement:
        """The rows where ``keep`` is True."""
        return Placement(self.job[keep], self.node[keep], self.count[keep],
                         None if self.copy is None else self.copy[keep])

    def copies_of(self, job_id: int) -> dict[int, list[tuple[int, int]]]:
        """``{copy index: [(node, count), ...]}`` of one job (``{0: rows}`` when not forked)."""
        out: dict[int, list[tuple[int, int]]] = {}
        cp = self.copy_index()
        for k in np.nonzero(self.job == job_id)[0].tolist():
            out.setdefault(int(cp[k]), []).append((int(self.node[k]), int(self.count[k])))
        return out

    def by_job_copies(self) -> dict[int, dict[int, list[tuple[int, int]]]]:
        """``{job id: {copy index: [(node, count), ...]}}``."""
        out: dict[int, dict[int, list[tuple[int, int]]]] = {}
        for j, n, c, k in zip(self.job.tolist(), self.node.tolist(), self.count.tolist(),
                              self.copy_index().tolist(), strict=True):
            out.setdefault(j, {}).setdefault(k, []).append((n, c))
        return out

    def copy_counts(self) -> tuple[IntArray, IntArray, IntArray]:
        """``(jobs, copies, first)``: the job ids ascending, how many copies each has (1 for
        an unforked job) and the row where each first appears."""
        if self.job.shape[0] == 0:
            none = np.zeros(0, dtype=np.int64)
            return none, none, none
        cp = self.copy_index()
        by = np.lexsort((cp, self.job))
        job, cps = self.job[by], cp[by]
        new_pair = np.r_[True, (job[1:] != job[:-1]) | (cps[1:] != cps[:-1])]
        jobs, first = np.unique(self.job, return_index=True)
        counts = np.bincount(np.searchsorted(jobs, job[new_pair]), minlength=jobs.shape[0])
        return jobs.astype(np.int64), counts.astype(np.int64), first.astype(np.int64)

    def num_copies(self) -> dict[int, int]:
        """``{job id: number of copies}`` (1 for an unforked job), jobs as they first appear."""
        jobs, counts, first = self.copy_counts()
        in_order = np.argsort(first, kind="stable")
        return dict(zip(jobs[in_order].tolist(), counts[in_order].tolist(), strict=True))

    def rows_of(self, job_id: int) -> list[tuple[int, int]]:
        """``[(node, count), ...]`` of one job."""
        sel = np.nonzero(self.job == job_id)[0]
        return [(int(self.node[k]), int(self.count[k])) for k in sel]

    def by_job(self) -> dict[int, list[tuple[int, int]]]:
        out: dict[int, list[tuple[int, int]]] = {}
        for j, n, c in zip(self.job.tolist(), self.node.tolist(), self.count.tolist(), strict=True):
            out.setdefault(j, []).append((n, c))
        return out

    def same_as(self, other: Placement) -> bool:
        return (self.by_job_sorted() == other.by_job_sorted()
                and self.num_copies() == other.num_copies())

    def by_job_sorted(self) -> dict[int, list[tuple[int, int]]]:
        return {j: sorted(rows) for j, rows in self.by_job().items()}


def joined(a: Placement, b: Placement) -> Placement:
    """The rows of ``a`` and then those of ``b`` (copy indices kept where either has them)."""
    copy = None
    if a.copy is not None or b.copy is not None:
        copy = np.concatenate([a.copy_index(), b.copy_index()])
    return Placement(np.concatenate([a.job, b.job]), np.concatenate([a.node, b.node]),
                     np.concatenate([a.count, b.count]), copy)


def remaining_seen(total: FloatArray, done: FloatArray) -> FloatArray:
    """The work a snapshot says a job has left: ``total - done``, but never under one step nor
    a thousandth of its work, so that a job whose progress has reached its total but that has
    not ended (its last round not yet reported; a forked job's run of its own after its copies)
    is not taken for one with nothing to run."""
    return np.maximum(total - done, np.maximum(1.0, 1e-3 * total))


def _all_unless(mask: BoolArray | None, n: int) -> BoolArray:
    """``mask`` as booleans, or ``n`` times True where it is None (every one may)."""
    if mask is None:
        return np.ones(n, dtype=np.bool_)
    return np.asarray(mask, dtype=np.bool_)


#: The item type of a per-job array (``Snapshot.select_jobs`` keeps it).
_Item = TypeVar("_Item", bound=np.generic)


@dataclass(frozen=True)
class Snapshot:
    """Everything a policy may look at in one epoch, as arrays.

    Jobs are those submitted and not finished.  Per job ``i``:
    ``rate[i, h]`` is the whole-job steps/s on ``scale[i]`` GPUs of type ``h`` (0 if it cannot
    run there); ``attained[i, h]`` the seconds it has run on type ``h`` since it arrived;
    ``remaining[i]`` its steps still to do.  ``current`` is where jobs ran in the epoch that just
    ended.  Nodes: ``node_type[n]`` indexes ``gpu_types``, ``node_gpus[n]`` its GPU count.
    """

    epoch: int
    now: float
    round_s: float
    gpu_types: tuple[GpuType, ...]
    node_names: tuple[str, ...]
    node_type: IntArray
    node_gpus: IntArray
    job_ids: IntArray
    job_types: tuple[str, ...]
    arrival: FloatArray
    total: FloatArray
    remaining: FloatArray
    scale: IntArray
    weight: FloatArray
    sync: BoolArray
    rate: FloatArray
    attained: FloatArray
    current: Placement
    policy_state: object = None
    #: HadarE: the most copies each job may be forked into (None: 1 for every job, none may be
    #: forked, unless the policy has a cap of its own for the simulator; 0 for a job: that
    #: cap of the policy's; see ``copies_cap``).
    max_copies: IntArray | None = None
    #: What the world allows, set by the backend (not a policy setting): whether one copy of a
    #: forked job may span several nodes.  False in Slurm (each copy is one component of a
    #: heterogeneous job, on one node) and, by default, in the simulator, which tells the same.
    multi_node_copies: bool = False
    #: What the world charges, set by the backend: seconds of progress a job loses when it is
    #: moved to GPUs other than those it holds (the sidecar's ``[scheduler] migration_s``; the
    #: simulator's ``migration_cost_s``).
    migration_s: float = 0.0
    #: What the world does, set by the backend: whether GPUs a job frees mid-round go to other
    #: jobs at once (an epoch as soon as a job ends: the sidecar's ``[scheduler]
    #: reschedule_on_finish``, the simulator's ``reschedule_on_finish``) rather than idling to
    #: the end of the round.
    refill_on_finish: bool = False
    #: What the world allows, set by the backend: whether a job over several nodes must hold
    #: as many GPUs on each (one Slurm job asks for a GPU count per node: True in the sidecar
    #: and in the simulator's ``even_gangs``; Gavel's simulator has no such rule).
    even_gangs: bool = False
    #: What the world allows, set by the backend: GPU sharing (issue #16).  The co-located
    #: throughputs of pairs of jobs sharing the same GPUs, by job type (``job_types``) and
    #: scale factor, when the backend can run two jobs on the same GPUs (the simulator; the
    #: Slurm sidecar with ``[scheduler] share`` on, through ``gres/shard``); None where it
    #: cannot, and then no decision may pack.
    colocated: PairRates | None = None
    #: Pairs of job ids ``(lower id, higher id)`` that shared the same GPUs in ``current``,
    #: the epoch that just ended (one job of a pair may have finished since: it is then no
    #: longer in ``job_ids`` or in ``current``).
    packed: tuple[tuple[int, int], ...] = ()
    #: Per job, whether it may share its GPUs with another job (the planned hint ``share=no``
    #: sets False); None: every job may.  Only read where ``colocated`` is set.
    may_share: BoolArray | None = None
    #: Per job, whether a job may join it on its GPUs this epoch, as a new partner (None: every
    #: job may).  The Slurm sidecar allows it of a job it places now and of one that runs alone
    #: on a shared GPU, not of one that holds whole GPUs (Slurm cannot add a job to those).
    #: A job of a pair in ``packed`` may always be joined again by its partner.
    may_host: BoolArray | None = None
    #: Per job, whether it may join another job on that job's GPUs as a new partner (None:
    #: every job may).  The sidecar allows it of a job that waits, not of one that runs (it
    #: would have to be stopped first).  A job of a pair in ``packed`` may always rejoin its
    #: partner.
    may_join: BoolArray | None = None
    #: Per node, whether two jobs may share its GPUs (None: every node); the sidecar: the nodes
    #: whose GPUs are split into shards (``gres/shard``), two or more per GPU.
    share_nodes: BoolArray | None = None
    #: Per node, the CPUs no job holds (None: CPUs are not counted).  The sidecar with
    #: sharing on: ``sinfo``'s CPUTot less CPUAlloc, at the read.  Read by GPU sharing only:
    #: a guest joins a host on a node only where these cover the CPUs that every job placed
    #: there this epoch asks (``cpus``), as the sidecar's applier requires (a job Slurm cannot
    #: give a CPU waits, and then starts on whichever GPU has a free shard: the pair is split).
    node_free_cpus: IntArray | None = None
    #: Per job, the CPUs it asks on each node it runs on (None: one each; read with
    #: ``node_free_cpus``).
    cpus: IntArray | None = None
    #: Per job, whether it runs where it is until it ends, whatever the policy decides (None:
    #: no job does).  The sidecar's running jobs that may not be stopped (``preempt=never``):
    #: the policy sees them, their remaining work and the GPUs they hold as those of any
    #: running job, and the epoch loop keeps them where they run
    #: (:func:`hadar_slurm.loop.keep_fixed`).  Policies need not read it.
    fixed: BoolArray | None = None
    #: Per job, the job it is a copy of (HadarE's virtual snapshot of copies; None: every job
    #: is its own).  Copies of one job pool their progress (the job tracker adds it up), so a
    #: copy's remaining time is the job's: its copies' work over their summed pace.
    pool: IntArray | None = None
    #: Per job, whether HadarE plans it as its full ``max_copies`` whatever its length (None:
    #: no job is asked to).  Set by the world for a study's trials (issue #17): the study's
    #: water-filling gives each live trial the cluster's GPUs over the study's live trials
    #: (``max_copies``), so once few trials remain their copies are offered to Hadar, on the
    #: same prices as every other job, not only when a trial is longer than the fork window.
    spread: BoolArray | None = None
    #: Per job, the work (the job's own steps, at its pace) that must follow its end before
    #: what it is part of is done (None: none).  Set by the world for a study's trials (issue
    #: #17): a trial's work ends at its next rung, and the rungs after it (to the full budget)
    #: follow one after another, so its path to the study's end is its remaining work and
    #: this.  Hadar weighs a job's path, not its remaining work alone, where it asks which jobs
    #: cannot wait for the drain target.
    after: FloatArray | None = None

    @property
    def num_jobs(self) -> int:
        return int(self.job_ids.shape[0])

    def copies_cap(self, default: int) -> IntArray:
        """Per job, the most copies it may run as: ``max_copies``, or ``default`` for all (and
        for a job whose ``max_copies`` is 0)."""
        fallback = max(int(default), 1)
        if self.max_copies is None:
            return np.full(self.num_jobs, fallback, dtype=np.int64)
        cap = self.max_copies.astype(np.int64)
        return np.where(cap == 0, fallback, np.maximum(cap, 1))

    def sharing_allowed(self) -> BoolArray:
        """Per job, whether it may share its GPUs (``may_share``, or True for all)."""
        return _all_unless(self.may_share, self.num_jobs)

    def hosting_allowed(self) -> BoolArray:
        """Per job, whether a new partner may join it (``may_host``, or True for all)."""
        return _all_unless(self.may_host, self.num_jobs)

    def joining_allowed(self) -> BoolArray:
        """Per job, whether it may join a new partner (``may_join``, or True for all)."""
        return _all_unless(self.may_join, self.num_jobs)

    def sharing_nodes(self) -> BoolArray:
        """Per node, whether its GPUs may be shared (``share_nodes``, or True for all)."""
        return _all_unless(self.share_nodes, int(self.node_gpus.shape[0]))

    def capacity(self) -> IntArray:
        """GPUs per type, ``[H]``."""
        return np.bincount(self.node_type, weights=self.node_gpus,
                           minlength=len(self.gpu_types)).astype(np.int64)

    def select_jobs(self, keep: BoolArray) -> Snapshot:
        """The snapshot with the jobs of the mask ``keep`` only: every per-job field sliced,
        ``current`` cut to their rows and ``packed`` to pairs of two kept jobs (the nodes and
        everything else as they are)."""
        ids = self.job_ids[keep]
        kept = set(ids.tolist())

        def opt(a: npt.NDArray[_Item] | None) -> npt.NDArray[_Item] | None:
            return None if a is None else a[keep]

        return replace(
            self, job_ids=ids,
            job_types=tuple(t for t, k in zip(self.job_types, keep, strict=True) if k),
            arrival=self.arrival[keep], total=self.total[keep], remaining=self.remaining[keep],
            scale=self.scale[keep], weight=self.weight[keep], sync=self.sync[keep],
            rate=self.rate[keep], attained=self.attained[keep],
            current=self.current.select(np.isin(self.current.job, ids)),
            packed=tuple(p for p in self.packed if p[0] in kept and p[1] in kept),
            max_copies=opt(self.max_copies), may_share=opt(self.may_share),
            may_host=opt(self.may_host), may_join=opt(self.may_join), fixed=opt(self.fixed),
            cpus=opt(self.cpus),
            pool=opt(self.pool), spread=opt(self.spread), after=opt(self.after))

    def index_of(self, job_ids: npt.ArrayLike) -> IntArray:
        """For each id in ``job_ids``, the index of its job in ``job_ids`` of the snapshot (-1:
        the snapshot has no such job)."""
        wanted = np.asarray(job_ids, dtype=np.int64).reshape(-1)
        out = np.full(wanted.shape[0], -1, dtype=np.int64)
        ids = self.job_ids
        if wanted.shape[0] and ids.shape[0]:
            by_id = np.argsort(ids, kind="stable")
            pos = np.minimum(np.searchsorted(ids, wanted, sorter=by_id), ids.shape[0] - 1)
            hit = ids[by_id[pos]] == wanted
            out[hit] = by_id[pos[hit]]
        return out

    def current_index(self) -> IntArray:
        """For each row of ``current``, the index of its job in ``job_ids`` (-1: gone)."""
        return self.index_of(self.current.job)

    def held(self) -> IntArray:
        """``held[i, h]``: GPUs of type ``h`` job ``i`` held in the epoch that just ended."""
        out = np.zeros((self.num_jobs, len(self.gpu_types)), dtype=np.int64)
        idx = self.current_index()
        keep = idx >= 0
        np.add.at(out, (idx[keep], self.node_type[self.current.node[keep]]),
                  self.current.count[keep])
        return out


@dataclass(frozen=True)
class Decision:
    """What should run in an epoch.  ``reason[i]`` is aligned with ``Snapshot.job_ids``."""

    epoch: int
    placement: Placement
    reason: npt.NDArray[np.int8]
    policy_state: object = None
    detail: dict[int, str] = field(default_factory=dict)
    #: GPU sharing (issue #16): pairs of job ids ``(lower id, higher id)`` that share the same
    #: GPUs this epoch.  Both jobs of a pair have the same rows in ``placement`` (nodes and
    #: counts), those GPUs count once (:func:`gpus_in_use`), and each job runs at its
    #: co-located rate (``Snapshot.colocated``).  Empty for every policy that does not pack;
    #: only allowed where the snapshot offers sharing (``Snapshot.colocated`` is set).
    packed: tuple[tuple[int, int], ...] = ()


def gpus_in_use(placement: Placement, packed: tuple[tuple[int, int], ...],
                num_nodes: int) -> IntArray:
    """GPUs each node gives out under ``placement``, the GPUs shared by a pair of ``packed``
    counted once (the rows of a pair's higher job id are left out)."""
    keep = np.ones(len(placement), dtype=np.bool_)
    if packed:
        second = np.array([b for _a, b in packed], dtype=np.int64)
        keep = ~np.isin(placement.job, second)
    return np.bincount(placement.node[keep], weights=placement.count[keep],
                       minlength=num_nodes).astype(np.int64)


class Policy(Protocol):
    """``allocate`` must be pure: same snapshot, same decision; no I/O, no clock reads."""

    name: str

    def allocate(self, snapshot: Snapshot) -> Decision: ...


@runtime_checkable
class FillsRunning(Protocol):
    """A policy that, in an epoch that only fills free GPUs (the epoch loop's fill epochs),
    may also give GPUs left free to running jobs (HadarE: more copies of a study's trials).
    ``fill_running`` gets the whole snapshot and the fill's decision (running jobs where they
    run, the others placed on the free GPUs) and returns the epoch's decision; pure, as
    ``allocate``."""

    def fill_running(self, snapshot: Snapshot, decision: Decision) -> Decision: ...
