"""An emulated training job: it advances at the throughput table's rate for the GPU type it runs
on, so that a cluster of fake GPUs (the dev cluster) behaves like a cluster of those types.

    python -m hadar_slurm.runtime.emulate --job-type "ResNet-50 (batch size 64)" --gpus 1 \\
        --steps 40000 --compression 100 [--table FILE ...] [--gpu-type v100]

It trains through the project's runtime (:class:`~hadar_slurm.runtime.JobRuntime`), so it
checkpoints every round, stops on the preemption signal (exit 75), resumes where it stopped,
reports its progress (``progress.json``) and can be forked (each copy advances at its own GPU
type's rate; the tracker adds their steps up).  One runtime iteration is one step of the job
(the unit of the table and of the ``steps=`` hint); the model is a one-weight stand-in, and
each step waits until the time it would end on the real GPUs, divided by ``--compression``.

Its rate: ``table.rate(job type, GPUs, GPU type)`` steps/s, whole job (Gavel's convention),
times ``--compression``; with several GPU types (a job over nodes of several types) the slowest
type's, as a synchronous job runs.  With ``--restart-s`` its first step comes that long after
the process started (python's and torch's start included), as a real job's restart (loading
its data and model) would: the time a start or a move costs it is then the same every time,
whatever else the host's cores are doing, as long as it is longer than python's and torch's
start there.  The GPU type is ``--gpu-type``, else that of a forked
copy (``HADAR_COPY_GPU_TYPE``), else read from Slurm: the ``gpu`` GRES of every node of
``SLURM_JOB_NODELIST`` (``scontrol show node``, with the job's ``SLURM_CONF``).  A forked job
(more than one copy) also spends :class:`~hadar_slurm.consolidation.ConsolidationCost`'s
seconds per round, divided by ``--compression``, consolidating: as the simulator charges it.

While the sidecar has it share its GPU with another job (issue #16: the tracker dir's
``sharing.json``, :mod:`hadar_slurm.runtime.colocation`), it advances at the co-located rate the
table gives for the pair (``table.colocated.pair_rate(job type, partner's type, GPUs, GPU
type)``, measured or, on a GPU type without measurements, estimated, times ``--compression``),
and at its isolated rate again once the file is gone or the partner's
``progress.json`` says it is complete.  It looks at most every :data:`CHECK_S` seconds, and says
so (one line) when its rate changes.  A pair the table forbids or lacks keeps the isolated rate,
with a warning.  A forked copy ignores sharing: the file is for one unforked job's GPUs.

As a trial of a tuning study (issue #17; ``--curves-seed S --trials N``, in a task of the
study's job array): its budget is ``--steps``; the rungs come from the study's environment
(``HADAR_STUDY_RUNGS``, ``HADAR_STUDY_ETA``, :class:`~hadar_slurm.studies.reporter.StudyTrial`),
its trial index from ``HADAR_TRIAL_INDEX`` (or ``SLURM_ARRAY_TASK_ID``).  At each rung it
reports what the simulator's synthetic learning curves say of that trial
(:class:`~hadar_slurm.studies.curves.LearningCurves` of ``N`` trials drawn with seed ``S``:
the same reports as in ``bench/studies.py``), then does what the study's verdict says: trains
on, stops (exit 0), or waits (and is requeued by the sidecar).
"""

from __future__ import annotations

import os
import signal
import types


def _stop_early(signum: int, _frame: types.FrameType | None) -> None:
    """A preemption signal before the runtime has taken the signals over: nothing was done, so
    nothing is saved or lost; the process ends at once with 75 (``EXIT_PREEMPTED``: requeued
    held), not when Python and torch have finished loading, seconds later, while the GPUs it
    was placed on wait for it to leave."""
    print(f"emulate: stopped by signal {signum} before it started", flush=True)
    os._exit(75)


if __name__ == "__main__":  # (as a program, before the imports below: a move right after the
    # placement may signal it while Python starts; the default action would kill it, exit 138)
    signal.signal(signal.SIGUSR1, _stop_early)

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Mapping, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from hadar_slurm.consolidation import ConsolidationCost  # noqa: E402
from hadar_slurm.errors import InputError  # noqa: E402
from hadar_slurm.rates.table import (  # noqa: E402
    ThroughputTable,
    default_table,
    load_tables,
)
from hadar_slurm.runtime.colocation import (  # noqa: E402
    SHARING_FILE,
    Sharing,
    partner_done,
    read_sharing,
)
from hadar_slurm.runtime.config import (  # noqa: E402
    RuntimeConfig,
    signal_number,
)
from hadar_slurm.slurm import (  # noqa: E402
    SlurmRunner,
    expand_hostlist,
    parse_gres,
    parse_scontrol_show,
)
from hadar_slurm.studies.halving import Verdict  # noqa: E402

if TYPE_CHECKING:
    from hadar_slurm.runtime import trainer

_SOURCE = "hadar_slurm.runtime.emulate"
#: When this process started (as near as Python lets us see it): ``--restart-s`` counts from it.
_STARTED = time.monotonic()
#: Sleep only when this far ahead of the pace (s): shorter sleeps cost more than they keep.
_MIN_SLEEP_S = 0.005
#: Look at the sharing file (and the partner's progress) at most this often (wall seconds): a
#: stat per look, so cheap, and a quarter of a second late is nothing next to a round.
CHECK_S = 0.25


#: The bundled table, parsed once by a warm-start server (:func:`preload`) for all its payloads.
_DEFAULT_TABLE: ThroughputTable | None = None


def preload() -> None:
    """Parse the bundled table now (a warm-start server's forks then need not, each)."""
    global _DEFAULT_TABLE
    _DEFAULT_TABLE = default_table()


def node_gpu_types(env: Mapping[str, str], runner: SlurmRunner | None = None) -> list[str]:
    """The GPU types of the nodes of this job (``SLURM_JOB_NODELIST``), from Slurm."""
    nodelist = env.get("SLURM_JOB_NODELIST", "").strip()
    if not nodelist:
        raise InputError("not in a Slurm job (no SLURM_JOB_NODELIST): give --gpu-type",
                         source=_SOURCE, field="--gpu-type")
    runner = runner or SlurmRunner(env.get("SLURM_CONF"), env=env)
    types: list[str] = []
    for name in expand_hostlist(nodelist):
        record = parse_scontrol_show(runner.run(["scontrol", "show", "node", name]).stdout)
        for g in parse_gres(record.get("Gres", ""), source=f"node {name}", field="Gres"):
            if g.name == "gpu" and g.type and g.type not in types:
                types.append(g.type)
    if not types:
        raise InputError(f"no typed gpu GRES on the nodes {nodelist}: give --gpu-type",
                         source=_SOURCE, field="--gpu-type")
    return types


def emulated_rate(table: ThroughputTable, job_type: str, gpus: int,
                  gpu_types: Sequence[str]) -> float:
    """Steps/s of the whole job on ``gpus`` GPUs of ``gpu_types`` (the slowest one's)."""
    rates = [table.rate(job_type, gpus, t) for t in gpu_types]
    missing = [t for t, r in zip(gpu_types, rates, strict=True) if r <= 0]
    if missing:
        raise InputError(f"the table has no rate for {job_type!r} on {gpus} GPU(s) of type "
                         f"{', '.join(missing)}", source=_SOURCE, field="--job-type")
    return min(rates)


class Pace:
    """Keeps a loop at ``rate`` iterations per second on average: :meth:`step` waits until the
    time the next iteration is due (sleeping only when ahead by :data:`_MIN_SLEEP_S`)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.period = 1.0 / rate
        self._clock = clock
        self._sleep = sleep
        self._due = 0.0
        self.restart()

    def restart(self) -> None:
        """The next iteration is due one period from now (after a pause: no catching up)."""
        self._due = self._clock() + self.period

    def set_rate(self, rate: float) -> None:
        """Go on at ``rate`` from now on.  The wait for the iteration now under way is scaled
        to the new period (the share of it already waited counts as done), so the change
        neither bursts (steps owed at the old rate are not run at once at the new one: any
        backlog is dropped) nor stalls (the next iteration is at most one new period away)."""
        if rate <= 0:
            raise ValueError("rate must be > 0")
        period = 1.0 / rate
        now = self._clock()
        left = min(max(self._due - now, 0.0), self.period)
        self._due = now + left * (period / self.period)
        self.period = period

    def step(self) -> None:
        ahead = self._due - self._clock()
        if ahead > _MIN_SLEEP_S:
            self._sleep(ahead)
        elif ahead < -1.0:
            self._due = self._clock()  # (stalled: do not run fast to catch up)
        self._due += self.period


class SharingWatch:
    """The rate (steps/s, compressed) this payload must advance at, from its tracker dir's
    sharing file: the co-located rate while it shares its GPU with a job that has not finished,
    its isolated rate otherwise.  :meth:`poll`, called every step, looks at most every
    :data:`CHECK_S` seconds (``clock``'s), re-reads the file only when it changed (its stat),
    and re-reads the partner's progress at each look (it completes without the file changing).

    With several GPU types (a job over nodes of several types) only the shared type's rate
    changes: the job advances at the slowest of the pair's rate and the other types'.
    """

    def __init__(self, tracker_dir: Path, table: ThroughputTable, job_type: str, gpus: int,
                 gpu_types: Sequence[str], compression: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = tracker_dir / SHARING_FILE
        self._tracker_dir = tracker_dir
        self._table = table
        self._job_type = job_type
        self._gpus = gpus
        self._types = list(gpu_types)
        self._compression = compression
        self._clock = clock
        self.isolated = emulated_rate(table, job_type, gpus, gpu_types) * compression
        #: The rate now (compressed), and the partner it is shared with (None: alone).
        self.rate = self.isolated
        self.partner: int | None = None
        self._next = clock()
        self._stat: tuple[int, int, int] | None = None
        self._sharing: Sharing | None = None
        self._warned: Sharing | None = None

    def poll(self) -> float | None:
        """The new rate when it changed since the last look (a line says so), else None (also
        when no look is due yet)."""
        if self._clock() < self._next:
            return None
        return self.check()

    def check(self) -> float | None:
        """:meth:`poll` now, whatever the time (the next look is then due :data:`CHECK_S`
        from now)."""
        self._next = self._clock() + CHECK_S
        try:
            st = os.stat(self.path)
            stat: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stat = None
        if stat != self._stat:
            self._stat = stat
            self._sharing = None if stat is None else read_sharing(self._tracker_dir)
        sharing = self._sharing
        rate, partner = self.isolated, None
        if sharing is not None and not partner_done(sharing):
            shared = self._shared_rate(sharing)
            if shared is not None:
                rate, partner = shared, sharing.partner
        if rate == self.rate and partner == self.partner:
            return None
        self.rate, self.partner = rate, partner
        if sharing is not None and partner is not None:
            print(f"emulate: sharing GPU with job {partner} ({sharing.partner_type}): "
                  f"{rate:.3f} steps/s", flush=True)
        else:
            print(f"emulate: alone again: {rate:.3f} steps/s", flush=True)
        return rate

    def _shared_rate(self, sharing: Sharing) -> float | None:
        """The compressed rate while sharing as ``sharing`` says; None (with one warning per
        sharing) where it cannot be had: the pair is forbidden or not in the table, or the
        shared GPU is not of a type this job runs on."""
        own = 0.0
        if sharing.gpu_type in self._types:
            own = self._table.colocated.pair_rate(self._job_type, sharing.partner_type,
                                              self._gpus, sharing.gpu_type)[0]
        if own <= 0:
            if self._warned != sharing:
                self._warned = sharing
                why = (f"it runs on {'/'.join(self._types)}, not {sharing.gpu_type}"
                       if sharing.gpu_type not in self._types else
                       "the table forbids or lacks the pair")
                print(f"emulate: warning: sharing GPU with job {sharing.partner} "
                      f"({sharing.partner_type}) on {self._gpus} GPU(s) of {sharing.gpu_type}: "
                      f"{why}; keeping the isolated rate {self.isolated:.3f} steps/s",
                      file=sys.stderr, flush=True)
            return None
        others = [self._table.rate(self._job_type, self._gpus, t) for t in self._types
                  if t != sharing.gpu_type]
        return min([own, *others]) * self._compression


def _train(rt: trainer.JobRuntime, pace: Pace, watch: SharingWatch | None, copies: int,
           consolidate_s: float, until: int | None) -> None:
    """Run ``rt``'s steps (up to ``until``) at ``pace``."""
    current = -1
    for _ in rt.steps(until=until):
        if rt.round != current:
            if current >= 0 and copies > 1 and consolidate_s > 0:
                time.sleep(consolidate_s)  # (what one consolidation costs, compressed)
            current = rt.round
            pace.restart()
        if watch is not None and (changed := watch.poll()) is not None:
            pace.set_rate(changed)
        pace.step()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hadar_slurm.runtime.emulate",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--job-type", required=True, help='as in the table, e.g. "A3C"')
    p.add_argument("--gpus", type=int, default=1, help="the job's GPU count (its scale)")
    p.add_argument("--steps", type=int, required=True, help="the job's work, in steps")
    p.add_argument("--compression", type=float, default=1.0,
                   help="how many times faster than the real GPUs (>= 1)")
    p.add_argument("--table", action="append", default=[], type=Path,
                   help="throughput table files (default: Gavel's table)")
    p.add_argument("--gpu-type", help="the GPU type (default: from the fork, or Slurm)")
    p.add_argument("--round-seconds", type=float, default=30.0,
                   help="wall seconds per round (checkpoint) of the runtime")
    p.add_argument("--curves-seed", type=int, default=None,
                   help="a trial of a tuning study: the seed of the study's synthetic "
                        "learning curves (with --trials)")
    p.add_argument("--trials", type=int, default=None,
                   help="a trial of a tuning study: how many trials the study has")
    p.add_argument("--restart-s", type=float, default=0.0,
                   help="wall seconds from the process's start to its first step: the "
                        "emulated job's own restart (loading its data and model), of which "
                        "python's and torch's start are part (default 0: only those)")
    args = p.parse_args(argv)
    if args.compression < 1 or args.gpus < 1 or args.steps < 1:
        p.error("--compression, --gpus and --steps must be >= 1")
    if not 0 <= args.restart_s < 3600:
        p.error("--restart-s must be >= 0 and < 3600")
    if (args.curves_seed is None) != (args.trials is None) or (
            args.trials is not None and args.trials < 1):
        p.error("a study's trial needs both --curves-seed and --trials (>= 1)")
    env = os.environ
    table = load_tables([str(t) for t in args.table], base=_DEFAULT_TABLE)
    types = ([args.gpu_type] if args.gpu_type else
             [env["HADAR_COPY_GPU_TYPE"]] if env.get("HADAR_COPY_GPU_TYPE") else
             node_gpu_types(env))
    rate = emulated_rate(table, args.job_type, args.gpus, types) * args.compression
    consolidate_s = ConsolidationCost().seconds(args.job_type) / args.compression
    config = RuntimeConfig.from_env(args.steps, round_seconds=args.round_seconds)
    # The preemption signal may come while torch loads (a job moved right after it started):
    # until the runtime takes the signals over, it only stops the start (exit 75 at once:
    # requeued, nothing was done, nothing is lost), rather than kill the process by default.
    for name in config.preempt_signals:
        signal.signal(signal_number(name), _stop_early)

    import torch  # (the runtime's dependency; imported after the cheap checks)

    from hadar_slurm.runtime import JobRuntime

    # the rest of the restart (a signal ends it: the job stops before it started)
    while (left := _STARTED + args.restart_s - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))
    torch.set_num_threads(1)
    model = torch.nn.Linear(1, 1, bias=False)
    print(f"emulate: {args.job_type} on {args.gpus} GPU(s) of {'/'.join(types)}: "
          f"{rate:.3f} steps/s ({args.compression:g}x), copy {config.index} of "
          f"{config.copies}", flush=True)
    # (a forked copy ignores sharing: its copies share one tracker dir, not one GPU)
    watch = (SharingWatch(config.tracker_dir, table, args.job_type, args.gpus, types,
                          args.compression) if config.copies == 1 else None)
    trial = curves = None
    if args.trials is not None:
        from hadar_slurm.studies.curves import LearningCurves
        from hadar_slurm.studies.reporter import StudyTrial

        trial = StudyTrial.from_env(config.tracker_dir, steps=args.steps)
        if trial.index is None or trial.index >= args.trials:
            p.error(f"trial index {trial.index} (SLURM_ARRAY_TASK_ID) is not one of the "
                    f"{args.trials} trials")
        curves = LearningCurves(args.trials, seed=args.curves_seed)
    with JobRuntime(model, None, config) as rt:
        if watch is not None:
            watch.check()  # (sharing from the start: its first step at the shared rate)
            rate = watch.rate
        pace = Pace(rate)
        if trial is None or curves is None:
            _train(rt, pace, watch, config.copies, consolidate_s, None)
        else:
            for rung, target in trial.rungs_ahead(rt.done):
                _train(rt, pace, watch, config.copies, consolidate_s, target)
                value = curves.report(trial.index or 0, rung, target / args.steps)
                verdict = trial.report(rung, value, steps=rt.done,
                                       interrupted=rt.stop_requested)
                if verdict is Verdict.STOP:
                    break
        summary = rt.finish()
    # The work is done and saved: a preemption signal from now on (the sidecar moving a job
    # it does not know has finished) must not kill the process while Python and torch shut
    # down, which restores the default action (terminate: exit 138, the job FAILED, then
    # requeued and run once more).
    for name in config.preempt_signals:
        signal.signal(signal_number(name), signal.SIG_IGN)
    print(f"emulate: copy {config.index}: done {summary.done}/{summary.work}, ran "
          f"{summary.executed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
