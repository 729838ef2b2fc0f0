"""The sidecar's Prometheus metrics, and what one epoch adds to them (and to its log line).

After every epoch the controller builds an :class:`EpochSummary` (:func:`summarize_epoch`: a
pure read of the epoch's record, snapshot, decision and the backend's last read and actions)
and hands it to :meth:`SidecarMetrics.observe`; the same summary's :meth:`~EpochSummary.
log_fields` extend the ``epoch`` log line, which is what ``hadar-slurm report`` plots.

Metrics (one private :class:`~prometheus_client.CollectorRegistry` per :class:`SidecarMetrics`,
so that tests can make several)::

    hadar_epoch_duration_seconds        histogram  read + decide + apply of an epoch
    hadar_decision_seconds              histogram  the policy's time per epoch
    hadar_epochs_total                  counter    epochs that ran (failed ones: errors below)
    hadar_last_epoch                    gauge      number of the last epoch
    hadar_last_epoch_timestamp_seconds  gauge      when it started (Unix time), for staleness
    hadar_jobs{state}                   gauge      hadar jobs after the last decision: running,
                                                   starting (given GPUs, not running yet),
                                                   waiting (the queue), unsteered
    hadar_gpus_busy{gpu_type}           gauge      GPUs in use in Slurm (any job) at the read
    hadar_gpus_total{gpu_type}          gauge      GPUs of the nodes of that type
    hadar_gpus_hadar{gpu_type}          gauge      GPUs the last decision gave hadar jobs
    hadar_shared_gpus{gpu_type}         gauge      GPUs two hadar jobs share at the read (one
                                                   shard each: the observer's pairs)
    hadar_sharing_jobs                  gauge      hadar jobs sharing a GPU at the read
    hadar_sharing_offered               gauge      1 while GPU sharing is offered to the
                                                   policy, else 0 (off in the config, or not
                                                   possible: the sharing log event and
                                                   state.json's "sharing" say why)
    hadar_actions_total{action}         counter    changes made to Slurm (place, release, ...)
    hadar_last_epoch_actions            gauge      changes made in the last epoch
    hadar_jobs_placed_total             counter    placements (``place`` and ``fork`` actions)
    hadar_jobs_finished_total{state}    counter    hadar jobs seen finished, by final state
    hadar_errors_total{kind}            counter    warning/error log events, by event name:
                                                   epoch_failed, action_failed, fork_failed,
                                                   slurm_unreachable, state_write_failed,
                                                   store_failed, store_recovered,
                                                   launch_failed, ...
    hadar_slurm_unreachable             gauge      1 while slurmctld does not answer (a read
                                                   timed out or could not reach it), else 0
    hadar_slurm_unreachable_since_seconds gauge    when the current outage was first seen
                                                   (Unix time; 0 while reachable)
    hadar_slurm_outages_total           counter    times slurmctld stopped answering
    hadar_info{policy,version,dry_run}  gauge      always 1
    hadar_slurm_info{release,tested}    gauge      1 for the Slurm release read at start

Errors are counted by a :class:`logging.Handler` on the ``hadar_slurm`` logger, so every
warning the sidecar logs is counted, wherever it is raised (the backend, the fork code); a
``log_level`` of ``error`` hides warnings from the counter too.

Job completion times: Slurm's queue read tells when a job was submitted, not when it ended; a
job is seen finished in the first read after it ended.  :class:`FinishTracker` records the two
reads around the end, and the JCT is the midpoint, within half an epoch (``jct_err_s``).  A job
Slurm has already forgotten at that read (``MinJobAge`` shorter than an epoch) is reported with
state ``GONE``.  Jobs that finished while no sidecar ran are not seen.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

from hadar_slurm import __version__
from hadar_slurm.errors import InputError
from hadar_slurm.logs import event_name
from hadar_slurm.loop import EpochRecord
from hadar_slurm.policy.base import Decision, Snapshot
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.config import parse_address
from hadar_slurm.slurm import SlurmJob
from hadar_slurm.slurm.parse import FINAL_STATES

#: States of :data:`hadar_jobs` (always exported, 0 when none).
JOB_STATES = ("running", "starting", "waiting", "unsteered")
#: Error kinds exported from the start (0 until one happens), so that rates work.
ERROR_KINDS = ("epoch_failed", "action_failed", "fork_failed", "slurm_unreachable",
               "state_write_failed", "store_failed", "store_recovered")
#: Actions that start a job somewhere: a placement, or a fork into copies.
PLACING_ACTIONS = ("place", "fork")
#: A job Slurm no longer lists when the sidecar looks for its end.
GONE = "GONE"

EPOCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0)


@dataclass(frozen=True)
class JobFinish:
    """A hadar job seen finished: it was waiting or running at the read at ``end_after`` and
    had ended (``state``) at the read at ``end_by``."""

    job: int
    state: str
    submit: float
    end_after: float
    end_by: float

    @property
    def jct_s(self) -> float:
        """Job completion time (end minus submission), the end taken midway between the
        reads."""
        return max(0.0, (self.end_after + self.end_by) / 2 - self.submit)

    @property
    def jct_err_s(self) -> float:
        """How far :attr:`jct_s` may be off (half the time between the reads)."""
        return max(0.0, self.end_by - self.end_after) / 2

    def to_log(self) -> dict[str, object]:
        return {"job": self.job, "state": self.state, "submit": self.submit,
                "jct_s": round(self.jct_s, 1), "jct_err_s": round(self.jct_err_s, 1)}


class FinishTracker:
    """Notices hadar jobs that finished between two epochs' reads.

    A job is tracked from the first epoch it is a hadar job (waiting or running) of the
    backend's snapshot; it is reported once, in the first epoch whose read shows it in a final
    state or no longer shows it.  While Slurm shows it in any other state (held by its user,
    released to Slurm's own scheduler, completing) it stays tracked.  Its submission time is
    the earliest seen (Slurm moves it on a requeue)."""

    def __init__(self) -> None:
        self._live: dict[int, tuple[float, float]] = {}  # job -> (submit, last seen live)

    @property
    def tracked(self) -> int:
        return len(self._live)

    def update(self, live: Mapping[int, float], jobs: Iterable[SlurmJob],
               now: float) -> list[JobFinish]:
        """``live``: the hadar jobs of this read and their submission times; ``jobs``: every
        job of the same read, taken at ``now``.  Returns the jobs that finished since the
        last call."""
        by_id = {j.job_id: j for j in jobs}
        out: list[JobFinish] = []
        for job_id, (submit, seen) in sorted(self._live.items()):
            if job_id in live:
                continue
            job = by_id.get(job_id)
            if job is None:
                state = GONE
            elif job.state in FINAL_STATES:
                state = job.state
            else:
                continue
            out.append(JobFinish(job_id, state, submit, seen, now))
            del self._live[job_id]
        for job_id, submit in live.items():
            old = self._live.get(job_id)
            self._live[job_id] = (submit if old is None else min(old[0], submit), now)
        return out


@dataclass(frozen=True)
class EpochSummary:
    """What one epoch adds to the metrics and to its ``epoch`` log line."""

    epoch: int
    start: float  # Unix time the epoch began (its read)
    duration_s: float  # read + decide + apply
    decision_s: float
    jobs: Mapping[str, int]  # JOB_STATES -> count
    gpus_busy: Mapping[str, int]  # GPU type -> GPUs in use (any job)
    gpus_total: Mapping[str, int]
    gpus_hadar: Mapping[str, int]  # GPU type -> GPUs the decision gives hadar jobs
    actions: Mapping[str, int]  # action -> count, this epoch
    finished: tuple[JobFinish, ...] = ()
    #: GPU sharing at the read: GPU type -> GPUs two hadar jobs share, the jobs sharing one,
    #: and whether sharing was offered to the policy
    shared_gpus: Mapping[str, int] = field(default_factory=dict)
    sharing_jobs: int = 0
    sharing_offered: bool = False

    @property
    def queue(self) -> int:
        """Hadar jobs waiting after the decision."""
        return int(self.jobs.get("waiting", 0))

    @property
    def placements(self) -> int:
        return sum(int(self.actions.get(a, 0)) for a in PLACING_ACTIONS)

    def log_fields(self) -> dict[str, object]:
        """The fields this summary adds to the ``epoch`` log line."""
        return {
            "epoch_start": round(self.start, 3), "duration_s": round(self.duration_s, 4),
            "queue": self.queue, "job_states": dict(self.jobs),
            "placements": self.placements, "gpus_busy": dict(self.gpus_busy),
            "gpus_total": dict(self.gpus_total), "gpus_hadar": dict(self.gpus_hadar),
            "shared_gpus": dict(self.shared_gpus), "sharing_jobs": self.sharing_jobs,
            "finished": [f.to_log() for f in self.finished],
        }


def summarize_epoch(
    record: EpochRecord, duration_s: float, snapshot: Snapshot | None,
    decision: Decision | None, backend: SlurmBackend, finishes: FinishTracker,
) -> EpochSummary:
    """The summary of the epoch that just ran (``backend`` as it was left by it); updates
    ``finishes`` with the epoch's read."""
    placed = set() if decision is None else {int(j) for j in decision.placement.job.tolist()}
    states = dict.fromkeys(JOB_STATES, 0)
    # (the running jobs hadar may not stop are in the decision, fixed where they run)
    for job_id, view in {**backend.views, **backend.pinned}.items():
        if job_id not in placed:
            states["waiting"] += 1
        elif view.running or view.forked_running:
            states["running"] += 1
        else:
            states["starting"] += 1
    states["unsteered"] = len(backend.unsteered)
    busy: dict[str, int] = {}
    total: dict[str, int] = {}
    for node in sorted(backend.nodes, key=lambda n: n.name):
        if node.gpu_type and node.gpus > 0:
            busy[node.gpu_type] = busy.get(node.gpu_type, 0) + node.gpus_used
            total[node.gpu_type] = total.get(node.gpu_type, 0) + node.gpus
    hadar = dict.fromkeys(total, 0)
    # a pair holds one GPU of its node (1-GPU jobs, one shard each)
    type_of = {n.name: n.gpu_type for n in backend.nodes if n.gpu_type}
    shared = dict.fromkeys(total, 0)
    for a, _b in backend.pairs:
        held = backend.views.get(a)
        t = type_of.get(held.job.node_names[0]) if held and held.job.node_names else None
        if t:
            shared[t] = shared.get(t, 0) + 1
    if decision is not None and snapshot is not None:
        p = decision.placement
        for k, c in zip(p.node.tolist(), p.count.tolist(), strict=True):
            t = snapshot.gpu_types[int(snapshot.node_type[k])]
            hadar[t] = hadar.get(t, 0) + int(c)
    actions = Tally(str(a.get("action", "")) for a in backend.stats.applied)
    now = snapshot.now if snapshot is not None else record.start
    live = {job_id: v.arrival(now) for job_id, v in backend.views.items()}
    finished = finishes.update(live, backend.jobs, now)
    return EpochSummary(
        epoch=record.epoch, start=record.start, duration_s=duration_s,
        decision_s=record.decision_s, jobs=states, gpus_busy=busy, gpus_total=total,
        gpus_hadar=hadar, actions=dict(sorted(actions.items())), finished=tuple(finished),
        shared_gpus=shared, sharing_jobs=len({j for pair in backend.pairs for j in pair}),
        sharing_offered=not backend.share_off)


class _ErrorCounter(logging.Handler):
    """Counts warning and error events into ``hadar_errors_total{kind=<event>}``."""

    def __init__(self, errors: Counter) -> None:
        super().__init__(level=logging.WARNING)
        self.errors = errors

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.errors.labels(kind=event_name(record)).inc()
        except Exception:  # counting must never break logging
            self.handleError(record)


@dataclass
class _Server:
    server: WSGIServer
    thread: threading.Thread
    address: str = field(default="")


class SidecarMetrics:
    """The sidecar's metrics and, once :meth:`start`-ed, their HTTP endpoint (``/metrics``).

    Thread-safe: the endpoint's thread reads while the sidecar's updates."""

    def __init__(self, policy: str, *, dry_run: bool = False,
                 version: str = __version__) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.epoch_duration = Histogram(
            "hadar_epoch_duration_seconds", "Time of one epoch: read, decide and apply",
            registry=r, buckets=EPOCH_BUCKETS)
        self.decision = Histogram(
            "hadar_decision_seconds", "Time the policy took to decide an epoch", registry=r,
            buckets=DECISION_BUCKETS)
        self.epochs = Counter("hadar_epochs", "Epochs that ran", registry=r)
        self.last_epoch = Gauge("hadar_last_epoch", "Number of the last epoch", registry=r)
        self.last_epoch_time = Gauge(
            "hadar_last_epoch_timestamp_seconds", "Unix time the last epoch started",
            registry=r)
        self.jobs = Gauge(
            "hadar_jobs", "Hadar jobs after the last decision: running, starting (given GPUs, "
            "not running yet), waiting (the queue), unsteered (left to Slurm)", ["state"],
            registry=r)
        self.gpus_busy = Gauge(
            "hadar_gpus_busy", "GPUs in use in Slurm (by any job) at the last read",
            ["gpu_type"], registry=r)
        self.gpus_total = Gauge("hadar_gpus_total", "GPUs of the nodes of each type",
                                ["gpu_type"], registry=r)
        self.gpus_hadar = Gauge("hadar_gpus_hadar", "GPUs the last decision gave hadar jobs",
                                ["gpu_type"], registry=r)
        self.shared_gpus = Gauge(
            "hadar_shared_gpus", "GPUs two hadar jobs share (one shard each) at the last read",
            ["gpu_type"], registry=r)
        self.sharing_jobs = Gauge("hadar_sharing_jobs",
                                  "Hadar jobs that share a GPU with another at the last read",
                                  registry=r)
        self.sharing_offered = Gauge(
            "hadar_sharing_offered", "1 while GPU sharing is offered to the policy, else 0 "
            "(off in the config, or not possible here)", registry=r)
        self.actions = Counter("hadar_actions", "Changes made to Slurm, by action",
                               ["action"], registry=r)
        self.last_actions = Gauge("hadar_last_epoch_actions",
                                  "Changes made to Slurm in the last epoch", registry=r)
        self.placed = Counter("hadar_jobs_placed",
                              "Placements of hadar jobs (place and fork actions)", registry=r)
        self.finished = Counter("hadar_jobs_finished",
                                "Hadar jobs seen finished, by Slurm's final state", ["state"],
                                registry=r)
        self.errors = Counter("hadar_errors", "Warning and error events, by event name",
                              ["kind"], registry=r)
        self.unreachable = Gauge(
            "hadar_slurm_unreachable", "1 while slurmctld does not answer the sidecar's reads "
            "(timed out, or could not be reached), else 0", registry=r)
        self.unreachable_since_time = Gauge(
            "hadar_slurm_unreachable_since_seconds",
            "Unix time the current outage of slurmctld was first seen (0 while it answers)",
            registry=r)
        self.outages = Counter("hadar_slurm_outages",
                               "Times slurmctld stopped answering the sidecar", registry=r)
        self.info = Gauge("hadar_info", "The sidecar's policy and version (always 1)",
                          ["policy", "version", "dry_run"], registry=r)
        self.info.labels(policy=policy, version=version,
                         dry_run="true" if dry_run else "false").set(1)
        self.slurm_info = Gauge(
            "hadar_slurm_info", "The Slurm release the sidecar talks to, read at start, and "
            "whether it is a tested series (always 1)", ["release", "tested"], registry=r)
        for state in JOB_STATES:
            self.jobs.labels(state=state).set(0)
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)
        self.error_handler: logging.Handler = _ErrorCounter(self.errors)
        self._types: set[str] = set()
        self._server: _Server | None = None

    # -- updates ---------------------------------------------------------------------------

    def observe(self, s: EpochSummary) -> None:
        """Add one epoch."""
        self.epochs.inc()
        self.epoch_duration.observe(s.duration_s)
        self.decision.observe(s.decision_s)
        self.last_epoch.set(s.epoch)
        self.last_epoch_time.set(s.start)
        for state in JOB_STATES:
            self.jobs.labels(state=state).set(s.jobs.get(state, 0))
        types = set(s.gpus_total) | set(s.gpus_busy) | set(s.gpus_hadar) | set(s.shared_gpus)
        for t in sorted(types | self._types):  # a type that is gone reads 0
            self.gpus_busy.labels(gpu_type=t).set(s.gpus_busy.get(t, 0))
            self.gpus_total.labels(gpu_type=t).set(s.gpus_total.get(t, 0))
            self.gpus_hadar.labels(gpu_type=t).set(s.gpus_hadar.get(t, 0))
            self.shared_gpus.labels(gpu_type=t).set(s.shared_gpus.get(t, 0))
        self._types |= types
        self.sharing_jobs.set(s.sharing_jobs)
        self.sharing_offered.set(1 if s.sharing_offered else 0)
        for action, n in s.actions.items():
            self.actions.labels(action=action).inc(n)
        self.last_actions.set(sum(s.actions.values()))
        self.placed.inc(s.placements)
        for f in s.finished:
            self.finished.labels(state=f.state).inc()

    def slurm(self, release: str, *, tested: bool) -> None:
        """The Slurm release read at start (``hadar_slurm_info``: one sample, the last set)."""
        self.slurm_info.clear()
        self.slurm_info.labels(release=release, tested="true" if tested else "false").set(1)

    def unreachable_since(self, when: float) -> None:
        """slurmctld stopped answering at ``when`` (Unix time): a new outage."""
        self.unreachable.set(1)
        self.unreachable_since_time.set(when)
        self.outages.inc()

    def reachable(self) -> None:
        """slurmctld answers again."""
        self.unreachable.set(0)
        self.unreachable_since_time.set(0)

    def exposition(self) -> str:
        """The metrics in Prometheus' text format (what ``/metrics`` serves)."""
        return generate_latest(self.registry).decode("utf-8")

    # -- the endpoint ----------------------------------------------------------------------

    def start(self, address: str, *, source: str | None = None) -> str:
        """Serve ``/metrics`` on ``address`` (``HOST:PORT``; port 0 picks a free one) in a
        daemon thread.  Returns the address it listens on (the port bound).  The caller
        checks that the host is allowed (the config refuses non-loopback hosts)."""
        if self._server is not None:
            raise RuntimeError(f"metrics already served on {self._server.address}")
        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise InputError(str(exc), source=source, field="[metrics] address") from None
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise InputError(
                f"cannot serve metrics on {address}: {exc.strerror or exc}", source=source,
                field="[metrics] address",
                fix='choose a free port (0 picks one), or "" for no metrics') from None
        bound_port = int(server.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        self._server = _Server(server, thread, f"{shown}:{bound_port}")
        return self._server.address

    @property
    def address(self) -> str:
        """Where ``/metrics`` is served ("" when not started)."""
        return self._server.address if self._server is not None else ""

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server.server_address[1])

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        s, self._server = self._server, None
        if s is not None:
            s.server.shutdown()
            s.server.server_close()
            s.thread.join(timeout=5)


__all__ = [
    "ERROR_KINDS",
    "JOB_STATES",
    "EpochSummary",
    "FinishTracker",
    "JobFinish",
    "SidecarMetrics",
    "summarize_epoch",
]
