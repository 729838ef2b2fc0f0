"""Scheduling policies, all behind one interface (:class:`~hadar_slurm.policy.base.Policy`).

Adding a policy is one module plus one line in :data:`REGISTRY`.  A factory takes the policy's
own settings as keyword arguments (:func:`make_policy`, from the CLI or the config); what the
world allows or charges (whether a copy may span nodes, what a move costs) is not a setting: the
backend says it in the :class:`~hadar_slurm.policy.base.Snapshot`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from hadar_slurm.errors import InputError
from hadar_slurm.policy.base import Decision, Policy, Reason, Snapshot
from hadar_slurm.policy.fifo import FifoPolicy
from hadar_slurm.policy.gavel import FifoPerfPolicy, GavelLasPolicy, GavelMakespanPolicy
from hadar_slurm.policy.gavel_packed import GavelLasPackedPolicy
from hadar_slurm.policy.hadar import HadarPolicy
from hadar_slurm.policy.hadare import HadarEPolicy

REGISTRY: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
    "fifo-perf": FifoPerfPolicy,
    "gavel-las": GavelLasPolicy,
    "gavel-las-packed": GavelLasPackedPolicy,
    "gavel-makespan": GavelMakespanPolicy,
    "hadar": HadarPolicy,
    "hadare": HadarEPolicy,
}

#: Parameters of a factory that are not settings one may give.
_NOT_SETTINGS = frozenset({"name", "self"})


def policy_settings(name: str) -> tuple[str, ...]:
    """The settings the policy registered as ``name`` takes (its factory's keyword arguments)."""
    factory = _factory(name)
    params = inspect.signature(factory).parameters.values()
    return tuple(p.name for p in params
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                 and p.name not in _NOT_SETTINGS)


def make_policy(name: str, **settings: object) -> Policy:
    """The policy registered as ``name``, built with ``settings`` (its own knobs, e.g.
    ``make_policy("hadare", max_copies=2)``).  An :class:`InputError` lists the known policies
    for an unknown name, and names the setting and the policy for a setting it does not take."""
    factory = _factory(name)
    known = policy_settings(name)
    for key in settings:
        if key not in known:
            raise InputError(
                f"policy {name.strip().lower()!r} has no setting {key!r}", field=key,
                fix=("its settings: " + ", ".join(known)) if known
                else "this policy takes no settings",
            )
    return factory(**settings)


def _factory(name: str) -> Callable[..., Policy]:
    factory = REGISTRY.get(name.strip().lower())
    if factory is None:
        raise InputError(
            f"unknown policy {name!r}", field="policy",
            fix="choose from " + ", ".join(sorted(REGISTRY)),
        )
    return factory


__all__ = ["REGISTRY", "Decision", "Policy", "Reason", "Snapshot", "make_policy",
           "policy_settings"]
