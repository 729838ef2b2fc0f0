"""``hadar-slurm run``: the sidecar's main loop.

One :class:`~hadar_slurm.loop.EpochLoop` (the same loop the simulator runs) over a
:class:`~hadar_slurm.sidecar.backend.SlurmBackend`.  Every epoch: one read of jobs and nodes, the
policy, the diff, the actions; then one ``epoch`` log line and the epoch's decisions written to
``state_dir/state.json`` for ``hadar-slurm status`` and ``explain``.

Safe state (:mod:`hadar_slurm.sidecar.statedir`): the sidecar holds the lock of its
``state_dir`` for its whole life (dry runs too), so a second one on the same directory exits at
once with one line naming the holder.  Restarts: the epoch counter resumes after the later of
the latest epoch recorded on any job in Slurm (the records in admin comments) and the one in
``state_dir/epoch.json`` (written before each epoch), so it never goes back; every action is a
reconciliation against what Slurm says, so a sidecar that was killed mid-epoch neither places a
job twice nor forgets one.  When slurmctld does not answer (a read timed out, or the client says
it cannot reach it), each failed epoch is a ``slurm_unreachable`` warning (with how long it has
not answered) and the ``hadar_slurm_unreachable`` gauge reads 1, until a ``slurm_reachable``
event; other Slurm errors are ``epoch_failed``.  Either way the epoch is retried after
``epoch_seconds``; nothing is decided on stale data.  The throughput store is read whole at
start; a damaged one is moved aside and rebuilt (``store_recovered``, :func:`open_store`); damage
found later is ``store_failed`` and the epochs go on with the base tables (:class:`SidecarStore`).
SIGTERM/SIGINT stop it after the current epoch (the wait between epochs is cut short).

The Slurm release: before the first read the sidecar asks its API for it (``scontrol version``)
and logs it (``slurm_version``: ``release``, ``series``, ``tested``, ``allow_untested``).  A
series not in :data:`~hadar_slurm.slurm.version.TESTED_SERIES` stops the start with one line
(an :class:`InputError` naming ``[sidecar] allow_untested_slurm``, exit status 2) unless that
key is true; output that is not a version counts as an untested release.  A failure to ask is
handled as the start's first read is (``slurm_unreachable`` or ``start_read_failed``, retried):
``scontrol`` missing or a broken slurm.conf would fail every read after it too.  The release is
in ``state.json`` (``slurm_version``) and in the ``hadar_slurm_info`` metric.

Metrics (:mod:`hadar_slurm.sidecar.metrics`): with ``[metrics] address`` set, ``/metrics`` is
served there while :meth:`Sidecar.run` runs (dry runs too); each epoch's summary updates them
and extends the ``epoch`` log line (GPUs busy per type, queue, jobs seen finished and their
JCTs), which ``hadar-slurm report`` plots.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.core.info import core_kind
from hadar_slurm.errors import InputError
from hadar_slurm.logs import log_event, log_exception, setup_logging
from hadar_slurm.loop import EpochLoop, EpochRecord
from hadar_slurm.policy import REGISTRY, make_policy, policy_settings
from hadar_slurm.policy.base import Decision, Reason, Snapshot
from hadar_slurm.rates.learn import Knowledge
from hadar_slurm.rates.store import Entry, Key, StoreDamagedError, ThroughputStore
from hadar_slurm.rates.store_recovery import recover_store
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.config import SidecarConfig, load_table_for
from hadar_slurm.sidecar.metrics import FinishTracker, SidecarMetrics, summarize_epoch
from hadar_slurm.sidecar.observe import JobView
from hadar_slurm.sidecar.statedir import StateDirLock, is_unreachable, read_epoch, write_epoch
from hadar_slurm.sidecar.studies import STUDIES_FILE, StudyBook, study_summary
from hadar_slurm.slurm import SlurmConfigError, SlurmError, SlurmParseError, SlurmRunner
from hadar_slurm.slurm.api import DryRunApi, SlurmApi, with_drills
from hadar_slurm.slurm.pyslurm_api import make_api
from hadar_slurm.slurm.schedconf import fork_warning
from hadar_slurm.slurm.version import SlurmVersion, check_version, tested_text

STATE_FILE = "state.json"
#: The config key that lets the sidecar run on a Slurm series it was not tested on.
UNTESTED_FIELD = "[sidecar] allow_untested_slurm"
UNTESTED_FIX = ("set allow_untested_slurm = true under [sidecar] to run on it anyway, or run a "
                "tested Slurm")

_T = TypeVar("_T")


def slurm_api(config: SidecarConfig) -> SlurmApi:
    """The Slurm interface the config asks for (``[slurm] backend``, ``conf``, timeout)."""
    return make_api(config.backend, lambda: SlurmRunner(
        config.slurm_conf, timeout=config.command_timeout_s))


class StopClock:
    """Wall-clock time whose waits end early when ``stop`` is set, or, with ``wake``, when
    ``wake()`` (asked every ``poll_s`` seconds of the wait) says so."""

    def __init__(self, stop: threading.Event, *, wake: Callable[[], bool] | None = None,
                 poll_s: float = 15.0) -> None:
        if poll_s <= 0:
            raise ValueError(f"poll_s must be positive, got {poll_s}")
        self.stop = stop
        self.wake = wake
        self.poll_s = poll_s

    def now(self) -> float:
        return time.time()

    def sleep_until(self, t: float) -> None:
        while not self.stop.is_set():
            delay = t - time.time()
            if delay <= 0:
                return
            if self.wake is None:
                self.stop.wait(delay)
                return
            if self.stop.wait(min(delay, self.poll_s)):
                return
            if time.time() < t and self.wake():
                return


class SidecarStore(ThroughputStore):
    """The sidecar's store: damage found while it runs never escapes into an epoch.

    The calls :class:`~hadar_slurm.rates.learn.Knowledge` makes (``entries``, ``anchors``,
    ``estimate``, ``learn``) are made from inside the epoch's read, some of them inside one
    job's handling, where an exception would count against that job (and release it to Slurm
    unsteered).  Here the first :class:`~hadar_slurm.rates.store.StoreDamagedError` is kept in
    :attr:`failure`, and from then on every such call answers as an empty store would (no
    entries, nothing written), so the epoch plans with the base tables; the controller then
    detaches the store (``store_failed``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.failure: StoreDamagedError | None = None

    def _soft(self, call: Callable[[], _T], empty: _T) -> _T:
        if self.failure is not None:
            return empty
        try:
            return call()
        except StoreDamagedError as exc:
            self.failure = exc
            return empty

    def entries(self, source: str | None = None) -> list[Entry]:
        return self._soft(lambda: super(SidecarStore, self).entries(source), [])

    def anchors(self) -> dict[Key, tuple[float, str]]:
        return self._soft(lambda: super(SidecarStore, self).anchors(), {})

    def estimate(self, *args: Any, **kwargs: Any) -> Entry | None:
        return self._soft(lambda: super(SidecarStore, self).estimate(*args, **kwargs), None)

    def learn(self, *args: Any, **kwargs: Any) -> Entry | None:
        return self._soft(lambda: super(SidecarStore, self).learn(*args, **kwargs), None)


def _open_checked(path: Path) -> SidecarStore:
    store = SidecarStore(path)
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store


def open_store(config: SidecarConfig, logger: logging.Logger | None = None) -> SidecarStore:
    """The config's throughput store, opened (created when missing) and read once whole.

    A damaged store (:class:`~hadar_slurm.rates.store.StoreDamagedError`) is moved aside and a fresh
    one rebuilt from the config's throughput files (:func:`~hadar_slurm.rates.store_recovery.
    recover_store`); a ``store_recovered`` warning names the kept file.  Called under the
    state_dir lock, so no other sidecar uses the store while it is moved."""
    path = config.store_path
    try:
        try:
            return _open_checked(path)
        except StoreDamagedError as exc:
            recovered = recover_store(path, config.throughputs, error=exc.error)
            if logger is not None:
                log_event(logger, "store_recovered", logging.WARNING, path=str(path),
                          kept=str(recovered.kept), error=exc.error,
                          imported=recovered.imported, files=list(recovered.files),
                          note="learned rates are lost and re-learned")
            return _open_checked(path)
    except InputError as exc:
        raise InputError(f"cannot open the throughput store {path}: {exc.problem}",
                         source=config.source, field="[scheduler] throughput_db",
                         fix=exc.fix if isinstance(exc, StoreDamagedError) else
                         "give a path in a writable directory on a local file system, "
                         "or create the state_dir") from None


class Reachability:
    """Whether slurmctld answers: a ``slurm_unreachable`` warning for each Slurm read that
    failed because it did not (with how long it has not), a ``slurm_reachable`` event when it
    answers again, and the metrics of both."""

    def __init__(self, logger: logging.Logger, metrics: SidecarMetrics) -> None:
        self.logger = logger
        self.metrics = metrics
        self.since: float | None = None  # when the current outage was first seen

    def failed(self, exc: SlurmError, **fields: object) -> None:
        now = time.time()
        if self.since is None:
            self.since = now
            self.metrics.unreachable_since(now)
        log_event(self.logger, "slurm_unreachable", logging.WARNING, error=str(exc),
                  unreachable_s=round(now - self.since, 1), **fields)

    def answered(self) -> None:
        if self.since is None:
            return
        down_s = time.time() - self.since
        self.since = None
        self.metrics.reachable()
        log_event(self.logger, "slurm_reachable", unreachable_s=round(down_s, 1))


class Sidecar:
    """The controller: config in, epochs out, until stopped."""

    def __init__(self, config: SidecarConfig, *, api: SlurmApi | None = None) -> None:
        self.config = config
        self.state_dir = config.require_state_dir()
        self.logger = setup_logging(config.log_format, config.log_file, config.log_level)
        # one sidecar per state_dir, dry runs too; held until close() (run() closes)
        self.lock = StateDirLock(self.state_dir, source=config.source)
        self.lock.acquire(dry_run=config.dry_run)
        try:
            self._setup(config, api)
        except BaseException:
            self.lock.release()
            raise

    def _setup(self, config: SidecarConfig, api: SlurmApi | None) -> None:
        self.stop = threading.Event()
        self.max_epochs: int | None = None
        self._epochs_run = 0
        if api is None:
            api = slurm_api(config)
        # the restart tests' crash drill and the dry run are wrappers of the API
        api = with_drills(api)
        self.api: SlurmApi = DryRunApi(api) if config.dry_run else api
        # What Slurm allows (one node per copy) and what a move costs reach the policy
        # through the backend's snapshots, not as settings.
        self.policy = make_policy(config.policy, **share_setting(config),
                                  **consolidation_setting(config), **pin_setting(config))
        table = load_table_for(config)
        self.store: SidecarStore | None = open_store(config, self.logger)
        self.backend = SlurmBackend(
            self.api, table, partition=config.partition,
            preempt_grace_s=config.preempt_grace_s, preempt_signal=config.preempt_signal,
            should_stop=self._should_stop,  # (the grace period is not cut short by a stop)
            sleep=_no_wait if config.dry_run else time.sleep,  # (a dry run signals nobody)
            tracker_root=config.tracker_root,
            knowledge=Knowledge(table, self.store, learn=config.learn_throughputs,
                                optimism=config.estimate_optimism),
            migration_s=config.move_cost_s, restart_s=config.restart_s, share=config.share,
            refill_on_finish=config.reschedule_on_finish,
            studies=StudyBook(Path(self.state_dir) / STUDIES_FILE,
                              wait_s=max(300.0, 2 * config.epoch_seconds),
                              grace_s=config.preempt_grace_s),
        )
        clock = StopClock(self.stop, wake=self._job_ended if config.reschedule_on_finish
                          else None, poll_s=config.finish_poll_s)
        self.loop = EpochLoop(self.backend, self.policy, clock,
                              round_s=config.epoch_seconds, on_epoch=self._on_epoch)
        self.metrics = SidecarMetrics(config.policy, dry_run=config.dry_run)
        self.reach = Reachability(self.logger, self.metrics)
        self.finishes = FinishTracker()
        self.slurm_version: SlurmVersion | None = None
        self._slurm_checked = False

    def _job_ended(self) -> bool:
        """Whether a job that ran at the last epoch has ended since (its GPUs are free), a
        job arrived while the last epoch left GPUs free, or a study's trial reported a rung
        (it waits for its verdict): then the next epoch starts now.  A Slurm error only means
        no early epoch."""
        reported = self.backend.reported_since_epoch()
        if reported:
            log_event(self.logger, "trials_reported", jobs=reported, epoch=self.loop.epoch,
                      early=True)
            return True
        try:
            ended, arrived = self.backend.since_epoch()
        except SlurmError as exc:
            if is_unreachable(exc):
                self.reach.failed(exc, at="finish_poll")
            else:
                log_event(self.logger, "finish_poll_failed", logging.WARNING, error=str(exc))
            return False
        if ended:
            log_event(self.logger, "jobs_ended", jobs=ended, epoch=self.loop.epoch,
                      early=True)
        if arrived:
            log_event(self.logger, "jobs_arrived", jobs=arrived, epoch=self.loop.epoch,
                      free_gpus=self.backend.free_gpus, early=True)
        return bool(ended or arrived)

    def _should_stop(self) -> bool:
        return self.stop.is_set() or (
            self.max_epochs is not None and self._epochs_run >= self.max_epochs)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            log_event(self.logger, "stopping", signal=signal.Signals(signum).name)
            self.stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def recover_epoch(self) -> int:
        """Read Slurm once and make the throughputs ready for the first epoch
        (:meth:`~hadar_slurm.sidecar.observe.SlurmObserver.prepare`); the next epoch follows
        the latest one recorded on a job or in the state_dir's epoch file, whichever is later
        (Slurm forgets finished jobs, so its records alone could take the counter back)."""
        self.backend.read()
        self.backend.prepare()
        return max(self.backend.last_epoch(), read_epoch(self.state_dir)) + 1

    def check_slurm_version(self) -> None:
        """Ask Slurm its release, log it (``slurm_version``) and refuse an untested series
        unless the config allows it (:class:`InputError`, one line).  Errors of the asking
        itself (:class:`SlurmError`) are the caller's, as for any Slurm read at start."""
        c = self.config
        try:
            version = self.api.slurm_version()
        except SlurmParseError as exc:  # not a version: an untested Slurm, or not Slurm at all
            level = logging.WARNING if c.allow_untested_slurm else logging.ERROR
            log_event(self.logger, "slurm_version", level, release=None, series=None,
                      tested=False, allow_untested=c.allow_untested_slurm, error=str(exc))
            if not c.allow_untested_slurm:
                raise InputError(
                    f"cannot tell which Slurm this is ({exc}): this hadar-slurm was tested on "
                    f"Slurm {tested_text()}", source=c.source, field=UNTESTED_FIELD,
                    fix=UNTESTED_FIX) from None
            self._slurm_checked = True
            return
        refused = check_version(version, c.allow_untested_slurm)
        level = (logging.INFO if version.tested else
                 logging.ERROR if refused else logging.WARNING)
        log_event(self.logger, "slurm_version", level, release=version.release,
                  series=version.series, tested=version.tested,
                  allow_untested=c.allow_untested_slurm)
        if refused is not None:
            raise InputError(refused, source=c.source, field=UNTESTED_FIELD, fix=UNTESTED_FIX)
        self.slurm_version = version
        self.backend.slurm_version = version
        self._slurm_checked = True
        self.metrics.slurm(version.release, tested=version.tested)
        self.check_fork_scheduler()

    def check_fork_scheduler(self) -> None:
        """Where the policy forks jobs (``hadare``), read how Slurm schedules and log it
        (``fork_scheduler``), a warning where forks would start late or never
        (:func:`~hadar_slurm.slurm.schedconf.fork_warning`).  A failed read is logged and
        the sidecar goes on: it only informs."""
        if self.config.policy != "hadare" or not self.api.can_fork:
            return
        try:
            sched = self.api.scheduler_config()
        except SlurmError as exc:
            log_event(self.logger, "fork_scheduler", logging.WARNING, error=str(exc))
            return
        warning = fork_warning(sched, self.config.epoch_seconds)
        log_event(self.logger, "fork_scheduler", logging.WARNING if warning else logging.INFO,
                  scheduler_type=sched.scheduler_type, bf_interval_s=sched.bf_interval_s,
                  **({"warning": warning} if warning else {}))

    def close(self) -> None:
        """Close the store and release the state_dir lock (idempotent)."""
        if self.store is not None:
            self.store.close()
        self.lock.release()

    def _check_store(self) -> None:
        """Detach the store if its damage was found (and hidden from the epoch) by
        :class:`SidecarStore`."""
        if self.store is not None and self.store.failure is not None:
            self._detach_store(self.store.failure)

    def _detach_store(self, exc: StoreDamagedError) -> None:
        """The store failed mid-run: plan with the base table from now on (see _run)."""
        log_event(self.logger, "store_failed", logging.WARNING, epoch=self.loop.epoch,
                  path=exc.path, error=exc.error,
                  fix="restart the sidecar (it recovers the store at start) or run "
                  "`hadar-slurm throughputs recover`; until then the base tables are used")
        store, self.store = self.store, None
        self.backend.knowledge.store = None
        if store is not None:
            store.close()

    def run(self, *, max_epochs: int | None = None) -> int:
        """Run epochs until stopped (or ``max_epochs`` ran).  Returns the exit status."""
        self.max_epochs = max_epochs
        c = self.config
        if c.metrics_address:
            self.metrics.start(c.metrics_address, source=c.source)
        self.logger.addHandler(self.metrics.error_handler)
        try:
            return self._run()
        except (SlurmConfigError, InputError):
            raise  # (one line on stderr from the CLI: a configuration to fix)
        except Exception as exc:
            # whatever stops the sidecar is in its log, with the traceback
            log_exception(self.logger, "crashed", exc, logging.CRITICAL, epoch=self.loop.epoch,
                          error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.logger.removeHandler(self.metrics.error_handler)
            self.metrics.stop()
            self.close()

    def _run(self) -> int:
        c = self.config
        log_event(self.logger, "start", policy=c.policy, epoch_seconds=c.epoch_seconds,
                  dry_run=c.dry_run, backend=self.api.name, config=c.source,
                  pid=os.getpid(), metrics=self.metrics.address,
                  throughput_db=str(c.store_path), learn=c.learn_throughputs,
                  state_dir=self.state_dir, core=core_kind())
        while not self.stop.is_set():
            try:
                if not self._slurm_checked:
                    self.check_slurm_version()
                self.loop.epoch = self.recover_epoch()
                self.reach.answered()
                break
            except SlurmConfigError:
                raise
            except SlurmError as exc:
                if is_unreachable(exc):
                    self.reach.failed(exc, at="start")
                else:
                    log_event(self.logger, "start_read_failed", logging.WARNING,
                              error=str(exc))
                self.stop.wait(min(c.epoch_seconds, 5.0))
        log_event(self.logger, "resume", epoch=self.loop.epoch)
        while not self._should_stop():
            self._check_store()
            try:
                write_epoch(self.state_dir, self.loop.epoch)
            except OSError as exc:
                log_event(self.logger, "state_write_failed", logging.WARNING,
                          path=self.state_dir, error=str(exc))
            try:
                if not self.loop.run_epoch():
                    break
            except SlurmConfigError:
                raise
            except StoreDamagedError as exc:
                # Corruption found mid-run (SidecarStore answers Knowledge's calls as an empty
                # store and keeps the error; this is for any other store call): go on with the
                # base table at once (the epoch stopped before its actions: the store is read
                # and written while the epoch reads).  The store is not rebuilt in place: other
                # processes (profile, the CLI) may have it open and would go on writing to the
                # file moved aside, and a failing disk would be rebuilt every epoch; the next
                # start, under the lock, recovers it (or an admin runs `hadar-slurm throughputs
                # recover`).
                self._detach_store(exc)
            except SlurmError as exc:
                if is_unreachable(exc):
                    self.reach.failed(exc, epoch=self.loop.epoch)
                else:
                    log_event(self.logger, "epoch_failed", logging.WARNING,
                              epoch=self.loop.epoch, error=str(exc))
                self.stop.wait(c.epoch_seconds)
            except Exception as exc:
                # Not a job's (the backend guards each job: job_error) but the epoch's, e.g. a
                # bug in a policy: logged with its traceback, and the next epoch tries again
                # (a sidecar that exits would leave every held job held until a restart).
                log_exception(self.logger, "epoch_error", exc, epoch=self.loop.epoch,
                              error=f"{type(exc).__name__}: {exc}")
                self.stop.wait(c.epoch_seconds)
        log_event(self.logger, "stop", epoch=self.loop.epoch)
        return 0

    def _on_epoch(self, record: EpochRecord) -> None:
        self._epochs_run += 1
        self.reach.answered()  # the epoch read Slurm
        self._check_store()
        st = self.backend.stats
        snapshot, decision = self.loop.last_snapshot, self.loop.last_decision
        summary = summarize_epoch(record, time.time() - record.start, snapshot, decision,
                                  self.backend, self.finishes)
        log_event(
            self.logger, "epoch", logging.INFO, epoch=record.epoch, jobs=record.num_jobs,
            placed=record.num_placed, changes=len(st.applied), moves=record.moves,
            preemptions=record.preemptions, full=record.full, unsteered=len(
                self.backend.unsteered), read_s=round(st.read_s, 4),
            decide_s=round(record.decision_s, 4), apply_s=round(st.apply_s, 4),
            slurm_commands=st.commands_read + st.commands_apply, dry_run=self.config.dry_run,
            **summary.log_fields(),
        )
        self.metrics.observe(summary)
        if snapshot is not None and decision is not None:
            try:
                write_state(self.config, self.backend, snapshot, decision,
                            slurm_version=self.slurm_version)
            except OSError as exc:
                log_event(self.logger, "state_write_failed", logging.WARNING,
                          path=self.config.state_dir, error=str(exc))


def consolidation_setting(config: SidecarConfig) -> dict[str, object]:
    """The policy's ``consolidation`` setting (what a consolidation of a forked job's copies
    costs) from ``[hadare] consolidation_base_s`` and ``consolidation_s_per_gb``, for a policy
    that forks; ``{}`` for one that does not."""
    if "consolidation" not in policy_settings(config.policy):
        return {}
    return {"consolidation": ConsolidationCost(base_s=config.consolidation_base_s,
                                               s_per_gb=config.consolidation_s_per_gb)}


def pin_setting(config: SidecarConfig) -> dict[str, object]:
    """The policy's ``pin_binding`` and ``pin_tolerance`` settings from ``[hadare]
    pin_binding`` and ``pin_tolerance``, for a policy that forks (``{}`` for one that does
    not: no job of its binds the makespan as a forked job, as ``[hadare]``'s consolidation
    settings do not apply to it)."""
    if "pin_binding" not in policy_settings(config.policy):
        return {}
    return {"pin_binding": config.pin_binding, "pin_tolerance": config.pin_tolerance}


def share_setting(config: SidecarConfig) -> dict[str, object]:
    """The policy's ``share`` setting from ``[scheduler] share``: ``{"share": True}`` when it is
    on (an :class:`InputError` when the policy cannot share), ``{}`` when it is off."""
    if not config.share:
        return {}
    _require_setting(config, "share", "[scheduler] share", "does not share GPUs",
                     "set share = false, or use a policy that shares")
    return {"share": True}


def _require_setting(config: SidecarConfig, setting: str, field: str, problem: str,
                     fix: str) -> None:
    """An :class:`InputError` naming ``field`` unless the configured policy takes ``setting``:
    "policy 'P' ``problem``", with ``fix`` and the policies that take it."""
    if setting in policy_settings(config.policy):
        return
    takers = sorted(n for n in REGISTRY if setting in policy_settings(n))
    raise InputError(f"policy {config.policy!r} {problem}", source=config.source, field=field,
                     fix=f"{fix}: {', '.join(takers)}")


def _no_wait(seconds: float) -> None:
    """Grace periods of a dry run: nothing was signalled, nothing to wait for."""


def _job_info(view: JobView, snapshot: Snapshot, rows: Sequence[tuple[int, int]],
              remaining: float, *, reason: str, reason_text: str, component: str,
              detail: str) -> dict[str, object]:
    """What status/explain show of one job: its hints, estimates, rates, where it is placed
    (``rows``: (node index, GPUs)) and why; and, with GPU sharing, the GPU index whose shards
    it holds as the read found it (``shard_gpu``, None: none) and the job holding that GPU's
    other shards (``mate``, 0: none)."""
    return {
        "model": view.hints.model, "batch_size": view.hints.batch_size,
        "job_type": view.hints.job_type, "gpus": view.gpus, "steps": view.hints.steps,
        "done_est": round(view.done, 1), "remaining_est": round(remaining, 1),
        "rates": {t: round(float(r), 4)
                  for t, r in zip(snapshot.gpu_types, view.rates, strict=False)},
        "rate_sources": dict(zip(snapshot.gpu_types, view.rate_sources, strict=False)),
        "reason": reason, "reason_text": reason_text, "component": component,
        "detail": detail,
        "placed": [[snapshot.node_names[k], c] for k, c in rows],
        "gpu_type": "|".join(sorted({snapshot.gpu_types[snapshot.node_type[k]]
                                     for k, _ in rows})),
        "slurm_state": view.job.state, "running": view.running,
        "mate": view.mate, "shard_gpu": view.shard_gpu,
    }


def epoch_state(
    config: SidecarConfig, backend: SlurmBackend, snapshot: Snapshot, decision: Decision,
    *, slurm_version: SlurmVersion | None = None,
) -> dict[str, object]:
    """What ``status``/``explain`` show about the last epoch, JSON-ready.  GPU sharing:
    ``sharing`` is ``"on"`` or why it is not offered, ``share`` whether the config turned it
    on, ``shards`` the shards per GPU of the nodes that have them, and each job's
    ``shares_with`` the job the decision puts on the same GPU (``decision.packed``; None)."""
    placed = decision.placement.by_job_sorted()
    copies_of = decision.placement.by_job_copies()
    partner = {int(a): int(b) for a, b in decision.packed} | {
        int(b): int(a) for a, b in decision.packed}
    jobs: dict[str, object] = {}
    for i, job_id in enumerate(snapshot.job_ids.tolist()):
        view = backend.views.get(job_id) or backend.pinned[job_id]
        code = Reason(int(decision.reason[i]))
        cp = copies_of.get(job_id, {})
        info = _job_info(
            view, snapshot, placed.get(job_id, []), float(snapshot.remaining[i]),
            reason=code.name, reason_text=code.text, component=code.component,
            detail=backend.report.detail.get(job_id) or decision.detail.get(job_id, ""))
        info.update(max_copies=view.max_copies, fork_blocked=view.fork_blocked,
                    copies=len(cp), placed_copies=[[c, snapshot.node_names[k], n]
                                                   for c, cr in sorted(cp.items())
                                                   for k, n in cr],
                    shares_with=partner.get(job_id))
        jobs[str(job_id)] = info
        if view.group is not None:
            info["forked"] = {
                "group": view.group.leader,
                "copies": [[index, node, view.group.components[k].state]
                           for k, (index, node, _) in enumerate(view.group.copies())],
            }
        if view.progress is not None:
            p = view.progress
            info["progress"] = {
                "done": p.done, "work": p.work, "rounds": p.rounds, "complete": p.complete,
                "rates": {str(c): round(r, 4) for c, r in sorted(p.rates.items())},
                "gpu_types": {str(c): t for c, t in sorted(p.gpu_types.items())},
                "updated_at": p.updated_at, "tracker": view.tracker,
            }
    in_snapshot = set(snapshot.job_ids.tolist())
    for job_id, view in sorted(backend.views.items()):
        # a study's trial that waits for a verdict or was stopped: not the policy's
        st = view.study
        if job_id in in_snapshot or st is None:
            continue
        info = _job_info(
            view, snapshot, list(view.rows) if view.running else [],
            max(0.0, st.target - view.done),
            reason="STUDY_WAIT" if st.state == "wait" else "STUDY_STOPPED",
            component="study.halving",
            reason_text=("waits, requeued, for its study's halving rule to decide (sh: the "
                         "rest of its cohort; asha: a rank among the best 1/eta of its rung)"
                         if st.state == "wait" else
                         "stopped early by its study's halving rule"),
            detail=backend.report.detail.get(job_id) or st.detail)
        info.update(max_copies=1, fork_blocked="", copies=0, placed_copies=[],
                    shares_with=None)
        jobs[str(job_id)] = info
    # a trial's weight for the policy: its study's trials over those offered (trial_weight)
    weight_of = dict(zip(snapshot.job_ids.tolist(), snapshot.weight.tolist(), strict=True))
    for job_id_s, entry in jobs.items():
        seen = backend.views.get(int(job_id_s))
        if seen is not None and seen.study is not None and isinstance(entry, dict):
            st = seen.study
            entry["study"] = {"name": st.study, "array": st.array, "task": st.task,
                             "state": st.state, "rung": st.rung, "target": st.target,
                             "detail": st.detail, "trials": st.trials,
                             "offered": backend.trials_offered.get(st.array, 0),
                             "weight": weight_of.get(int(job_id_s))}
    for job_id, view in sorted(backend.pinned.items()):
        # running jobs hadar may not stop: not the policy's, but explain tells about them
        info = _job_info(
            view, snapshot, list(view.rows), max(0.0, view.hints.steps - view.done),
            reason="PINNED", component="hints",
            reason_text="runs where it was placed until it ends (preempt=never)", detail="")
        info.update(max_copies=1, fork_blocked="", copies=0, placed_copies=[], pinned=True,
                    shares_with=partner.get(job_id))
        jobs[str(job_id)] = info
    return {
        "epoch": decision.epoch, "time": snapshot.now, "policy": config.policy,
        "dry_run": config.dry_run, "epoch_seconds": config.epoch_seconds,
        "slurm_version": None if slurm_version is None else slurm_version.release,
        "sharing": backend.share_off or "on", "share": backend.share,
        "shards": {n: s for n, s in sorted(backend.shards.items()) if s},
        "gpu_types": list(snapshot.gpu_types),
        "nodes": [{"name": n, "gpu_type": snapshot.gpu_types[int(snapshot.node_type[k])],
                   "gpus_for_hadar": int(snapshot.node_gpus[k])}
                  for k, n in enumerate(snapshot.node_names)],
        "jobs": jobs,
        "unsteered": {str(u.job.job_id): u.why for u in backend.unsteered},
        # running jobs hadar may not stop (preempt=never), jobs their users hold, and the jobs
        # that are copies hadar made (a hadar-copy-of= comment alone is not one)
        "pinned": sorted(backend.pinned),
        "user_held": sorted(backend.user_held),
        "copy_jobs": sorted(backend.copy_ids),
        "actions": backend.stats.applied,
        "studies": [study_summary(s) for _, s in sorted(backend.studies.studies.items())],
    }


def write_state(config: SidecarConfig, backend: SlurmBackend, snapshot: Snapshot,
                decision: Decision, *, slurm_version: SlurmVersion | None = None) -> Path:
    state_dir = Path(config.require_state_dir())
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(f".tmp.{os.getpid()}")
    tmp.write_text(json.dumps(epoch_state(config, backend, snapshot, decision,
                                          slurm_version=slurm_version), indent=1))
    os.replace(tmp, path)
    return path


def read_state(config: SidecarConfig) -> dict[str, object] | None:
    """The last epoch's state file, or ``None`` when there is none (yet, or no state_dir is
    configured)."""
    if config.state_dir is None:
        return None
    path = Path(config.state_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the sidecar's state: {exc}", source=str(path)) from None
    return data if isinstance(data, dict) else None
