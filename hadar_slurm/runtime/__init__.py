"""HadarE's training runtime: the copies of a forked job train one model, a job tracker adds up
their iterations and consolidates their models.

HadarE forks a job of W iterations into k copies (the components of one heterogeneous Slurm
job, :mod:`hadar_slurm.slurm.hetjob`), each a full trainer on its own node.  A training script uses
the runtime the same way whether it runs as one of those copies or unforked (a plain sbatch job,
or the original job run again after its copy group)::

    from hadar_slurm.runtime import JobRuntime, RuntimeConfig

    config = RuntimeConfig.from_env(work=W, round_seconds=60)
    model = build_model()                        # the same way in every copy
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with JobRuntime(model, optimizer, config, output="model.pt") as rt:
        for step in rt.steps():                  # one yield per iteration this copy runs
            train_one_iteration(model, optimizer, rt.round, rt.copy_index)
        rt.finish()                              # copy 0 writes the consolidated model

torch is imported only by this subpackage's :mod:`~hadar_slurm.runtime.trainer` (on first use
of :class:`JobRuntime`, :func:`weighted_average` or :func:`pick_device`); the settings and the
tracker files (:mod:`~hadar_slurm.runtime.config`, :mod:`~hadar_slurm.runtime.tracker`,
:func:`read_progress`) need no torch.

Environment
-----------
Set for each copy by the heterogeneous job: ``HADAR_COPY_INDEX`` (0..k-1, default 0),
``HADAR_COPIES`` (k, default 1), ``HADAR_ORIGINAL_JOB_ID`` (the original job J),
``HADAR_TRACKER_DIR``, ``HADAR_COPY_GPU_TYPE``.  An unforked job has none of them.  Also read:
``SLURM_JOB_ID`` and ``SLURM_RESTART_COUNT`` (the run id ``<job id>.<restarts>``: every component
of a heterogeneous job sees the leader's id, and a requeue counts the restarts up),
``HADAR_RUN_ID`` (overrides that run id), ``HADAR_PREEMPT_SIGNAL`` (default ``USR1``; ``TERM`` is
always handled too), ``HADAR_DEVICE`` (e.g. ``cpu``; default CUDA when available),
``HADAR_BARRIER_TIMEOUT`` (seconds, default 300).

The tracker dir is ``HADAR_TRACKER_DIR`` when set, else ``<cwd>/.hadar-tracker/<key>`` with key
``HADAR_ORIGINAL_JOB_ID``, else ``SLURM_JOB_ID``, else ``local``: the sidecar forks job J with
``<J's workdir>/.hadar-tracker/J``, and J run unforked later (cwd = its workdir) finds the same.

Rounds and exact work
---------------------
The work is done in rounds.  Each round, copy i runs a quota of iterations computed by
:func:`~hadar_slurm.runtime.tracker.plan_round` from the committed state alone, so every copy
computes the same plan: with ``round_seconds``, what the copy did in that many seconds in the
last round (iterations/s measured per copy), the first round of a group being a probe of
``probe_iters`` per copy; with ``round_iters``, that many iterations for all copies together, in
proportion to their rates.  The last round is cut to what remains, so the quotas of all rounds
add up to W exactly and the tracker's count ends at W, never more.  A round can end early (a
preemption signal or the time limit, and with ``round_seconds`` once the copy has trained that
long: a quota from a probe or a rate that no longer holds would keep the other copies waiting at
the barrier): a copy then reports the iterations it did, and the round counts those.

Consolidation
-------------
At the end of a round each copy other than 0 writes its parameters and optimizer state
(``reports/round-R/copy-i.pt``), then their metadata (``copy-i.json``: iterations, seconds,
quota, run, a nonce naming the .pt), each atomically (temporary file + rename).  Copy 0 waits
until every copy's report for this run and plan is in, takes the weighted average
(:func:`weighted_average`; weight = iterations each copy ran this round), writes
``consolidated-R.pt`` and then ``state.json`` naming it — the commit point, exactly one per
round — then ``progress.json`` and a ``history.jsonl`` line, and prints one line.  The other
copies wait for the commit and load the consolidated model.  The optimizer state is averaged
the same way (floating tensors weighted, anything else — step counts in integers,
hyper-parameters — from the copy that ran most), so an unforked job's checkpoint restores its
optimizer exactly and every copy continues from the same optimizer state.  On a fresh job with
k > 1, copy 0 first commits round 0 (its initial model) so that all copies start alike.

Barrier timeout: every copy writes a heartbeat (``live/<run>/copy-i.json``) at least every
``heartbeat_s`` (1 s), while training and while waiting.  A copy waiting at a barrier gives up
when a copy it needs has not changed its heartbeat for ``HADAR_BARRIER_TIMEOUT`` seconds (or
exited, in this run; a copy not heard from at all in this run gets at least 120 s to start):
it prints which copy and why to stderr and exits with status 76
(:class:`CopyLost`), so Slurm or the sidecar can requeue the job.  The work since the last commit
is then lost (at most one round).

Checkpoint, preemption, resume
------------------------------
The committed state is the checkpoint; an unforked job commits one every round too.  On the
preemption signal (USR1 by default, TERM, or ``HADAR_PREEMPT_SIGNAL``) a copy stops at the next
iteration boundary and reports what it did this round; the commit then carries the stop, every
copy exits with status 75 (:class:`Preempted`).  Unforked, that saves the progress up to the
last iteration.  Forked, the copies that got no signal finish their quota first (so keep rounds
shorter than the preemption grace period); when all copies get the signal at once (``scancel
--signal --full``, a requeue's TERM), the round is committed at once.  A copy killed before the
commit loses the work since the last commit: at most one round per copy.  A second signal while
waiting ends the wait at once (75).  Any later run — a requeue (same job id,
``SLURM_RESTART_COUNT`` > 0), another fork with a different k, the job run unforked — resumes from
the committed state.  A run that finds the work done (re)writes the output model if it is missing,
says so and exits 0 (:class:`AlreadyDone`).

Files in the tracker dir
------------------------
``state.json`` (the commit: ``work``, ``round``, ``done``, ``checkpoint``, ``copies``,
``rates``, ``stop``, ``run``, ``job``, ``updated_at``); ``consolidated-RRRRRR.pt`` (``model``,
``optim``, ``round``, ``done``; the last two kept); ``progress.json``; ``history.jsonl`` (one line
per commit: ``round``, ``done``, ``iters`` and ``seconds`` per copy, ``stop``, ``run``, ``time``);
``reports/round-RRRRRR/copy-i.{pt,json}`` (removed once committed); ``live/<run>/copy-i.json``
(heartbeats: ``state`` starting/training/waiting.../exited, ``round``, ``executed`` = iterations
this process ran, ``reason`` when exited, ``host``, ``pid``, ``time``).

``progress.json`` (written by the committing copy after every commit)::

    {"format": 1, "job": "4242", "work": 3000, "done": 1200, "remaining": 1800,
     "rounds": 7, "copies": 3,
     "copy_rates": [{"copy": 0, "gpu_type": "v100", "iters": 160, "seconds": 2.01,
                     "iters_per_s": 79.6, "gpu_mem_mib": 6120.0}, ...],
     "iters_per_s": 231.4, "complete": false, "stop": null, "run": "4242.0",
     "run_rounds": 2, "checkpoint": "consolidated-000007.pt", "updated_at": 1700000000.0}

``copy_rates`` are the last round's (``iters``/``seconds`` null for a copy that did not report;
``iters_per_s`` then the previous one, or null; ``gpu_mem_mib``: the most GPU memory the copy
held, torch's peak reservation plus a CUDA context, null off CUDA: the sidecar learns it as the
job type's footprint, :mod:`hadar_slurm.rates.memory`); ``iters_per_s`` is their sum (the whole
job's rate); ``stop``: why the copies stopped after this commit ("signal USR1", "time limit"), null
while they go on; ``run_rounds``: rounds this run committed (its first round is warm-up: the
sidecar's online learning of throughputs leaves it out); ``updated_at``: seconds since the
epoch.  One human line per commit goes to
stdout, e.g. ``hadar: job 4242 copy 0/3: round 7: 1200/3000 iterations (40.0%), 3 copies at
79.6, 70.1, 81.7 it/s (total 231.4 it/s)``.

Exit statuses
-------------
0: work done (or already done, or the time limit reached); 75: preempted (state saved as
described above); 76: a copy was lost at a barrier; 1: any other error (e.g. a tracker dir of a
job with another W: :class:`~hadar_slurm.errors.InputError`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hadar_slurm.runtime.config import (
    EXIT_COPY_LOST,
    EXIT_PREEMPTED,
    AlreadyDone,
    CopyLost,
    JobStop,
    Preempted,
    RuntimeConfig,
)
from hadar_slurm.runtime.tracker import CommittedState, plan_round, read_progress

if TYPE_CHECKING:
    from hadar_slurm.runtime.trainer import JobRuntime, RunSummary, pick_device, weighted_average

__all__ = [
    "EXIT_COPY_LOST",
    "EXIT_PREEMPTED",
    "AlreadyDone",
    "CommittedState",
    "CopyLost",
    "JobRuntime",
    "JobStop",
    "Preempted",
    "RunSummary",
    "RuntimeConfig",
    "pick_device",
    "plan_round",
    "read_progress",
    "weighted_average",
]

_TORCH_NAMES = frozenset({"JobRuntime", "RunSummary", "pick_device", "weighted_average"})


def __getattr__(name: str) -> Any:
    """The torch-based names, imported on first use."""
    if name in _TORCH_NAMES:
        from hadar_slurm.runtime import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
