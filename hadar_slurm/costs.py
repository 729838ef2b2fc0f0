"""What the live world costs a job: seconds of wall time without progress when it starts, and when
it is moved.  The one place the sidecar's policy (``[scheduler] migration_s``, by default) and the
simulator (``hadar-slurm simulate``, by default) take these figures from.

A cost has two parts:

* **Slurm's and the sidecar's**, measured on the dev cluster by ``python -m bench.move_cost``
  (``bench/results/move_cost.json``; ``docs/architecture.md``, "What a move costs, live"):

  - :data:`SLURM_MOVE_S`: from the moved job's exit (after its checkpoint) to the job running
    on its new GPUs: slurmctld requeues it, the sidecar sees it pending and places it in the
    same epoch (with ``StartTime=now+N``: :func:`hadar_slurm.sidecar.apply.start_time`),
    Slurm starts it;
  - :data:`SLURM_START_S`: from the sidecar's placement of a pending job to the job running.

* **The job's own**, ``restart_s``: on a move, its checkpoint on the signal, and, on every start,
  its process start, framework import and checkpoint load until its first step.  It depends on
  the workload, so it is a setting (``[scheduler] restart_s``); :data:`DEFAULT_RESTART_S` is
  an assumption for a PyTorch training job, not a measurement.  The emulated payload
  (:mod:`hadar_slurm.runtime.emulate`) restarts in about 2 s on the dev cluster's host when it
  starts alone, more when several start at once; ``bench.fidelity`` starts every payload as a
  fork of one warm server (:mod:`hadar_slurm.runtime.warmstart`), pads its start and measures
  it before it runs.

``tests/test_costs.py`` checks the two Slurm figures against the bench's result file, so a new
measurement that moves them fails until this module is updated with it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Exit of a moved job to its running on its new GPUs (median, bench.move_cost: the median
#: ``running_s`` 3.41 s less the payload's own ``checkpoint_s`` of 1.0 s, over moves spread
#: evenly over a second).  It includes the wait that keeps a moved job from starting within a
#: second of its last run's end (1 to 2 s, by where in a second it left).
SLURM_MOVE_S = 2.41
#: Placement of a pending job to its payload's first line (median, bench.move_cost's
#: ``first_start_s``).
SLURM_START_S = 0.38
#: A heterogeneous job's (HadarE's fork's) submission to its payload's first line, the first
#: of those submitted at once (median, bench.move_cost's ``fork_start_s`` at rank 0): Slurm
#: starts heterogeneous jobs only from its backfill scheduler (``bf_interval`` = 1 s on the
#: dev cluster), so it waits for the next cycle.
SLURM_FORK_START_S = 0.58
#: How much later each further heterogeneous job submitted at once starts (median spacing,
#: bench.move_cost's forks): the backfill scheduler starts one per cycle.
SLURM_FORK_INTERVAL_S = 1.0
#: A training job's own restart (checkpoint on the signal, then start to first step): assumed.
DEFAULT_RESTART_S = 30.0


@dataclass(frozen=True)
class LiveCosts:
    """The seconds without progress of a job's start and of its move, for a job that takes
    ``restart_s`` to restart."""

    restart_s: float = DEFAULT_RESTART_S

    def __post_init__(self) -> None:
        if not self.restart_s >= 0:
            raise ValueError(f"restart_s must be >= 0, got {self.restart_s!r}")

    @property
    def move_s(self) -> float:
        """A running job stopped and started on other GPUs (also a preempted job's resume)."""
        return SLURM_MOVE_S + self.restart_s

    @property
    def start_s(self) -> float:
        """A pending job's first start."""
        return SLURM_START_S + self.restart_s

    @property
    def fork_start_s(self) -> float:
        """How much longer than a plain start the first fork (heterogeneous job) of an epoch
        takes to start (the simulator's ``fork_start_s``)."""
        return max(SLURM_FORK_START_S - SLURM_START_S, 0.0)

    @property
    def fork_interval_s(self) -> float:
        """How much later each further fork of the epoch starts (``fork_interval_s``)."""
        return SLURM_FORK_INTERVAL_S


#: What the sidecar and the simulator charge when nothing else is configured.
DEFAULT = LiveCosts()
