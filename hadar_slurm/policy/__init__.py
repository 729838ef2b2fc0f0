"""Scheduling policies, all behind one interface (:class:`~hadar_slurm.policy.base.Policy`).

Adding a policy is one module plus one line in :data:`REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable

from hadar_slurm.errors import InputError
from hadar_slurm.policy.base import Decision, Policy, Reason, Snapshot
from hadar_slurm.policy.fifo import FifoPolicy
from hadar_slurm.policy.gavel import GavelLasPolicy, GavelMakespanPolicy
from hadar_slurm.policy.hadar import HadarPolicy
from hadar_slurm.policy.hadare import HadarEPolicy

REGISTRY: dict[str, Callable[[], Policy]] = {
    "fifo": FifoPolicy,
    "gavel-las": GavelLasPolicy,
    "gavel-makespan": GavelMakespanPolicy,
    "hadar": HadarPolicy,
    "hadare": HadarEPolicy,
}


def make_policy(name: str) -> Policy:
    """The policy registered as ``name``; an :class:`InputError` lists the known ones."""
    factory = REGISTRY.get(name.strip().lower())
    if factory is None:
        raise InputError(
            f"unknown policy {name!r}", field="policy",
            fix="choose from " + ", ".join(sorted(REGISTRY)),
        )
    return factory()


__all__ = ["REGISTRY", "Decision", "Policy", "Reason", "Snapshot", "make_policy"]
