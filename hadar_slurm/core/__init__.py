"""The Hadar core: compiled when built, with the NumPy reference twin otherwise.

Both expose the same functions with the same results (see :mod:`hadar_slurm.core.reference`):
``plan`` (one epoch of the primal-dual planner), ``balance_split`` (the type split),
``drain_prices`` (the drain bound and its type prices), ``match`` (resource matching),
``upgrade_idle`` (placed jobs onto idle GPUs of faster types) and ``pair_guests`` (GPU
sharing's pairing of waiting jobs with placed ones).
The algorithm they implement: docs/algorithm.md.
"""

from __future__ import annotations

from hadar_slurm.core import reference

try:
    import hadar_slurm._hadar_core as _compiled

    plan = _compiled.plan
    balance_split = _compiled.balance_split
    drain_prices = _compiled.drain_prices
    match = _compiled.match
    pair_guests = _compiled.pair_guests
    upgrade_idle = _compiled.upgrade_idle
    COMPILED = True
except (ImportError, AttributeError):  # not built (e.g. a bare source tree)
    plan = reference.plan
    balance_split = reference.balance_split
    drain_prices = reference.drain_prices
    match = reference.match
    pair_guests = reference.pair_guests
    upgrade_idle = reference.upgrade_idle
    COMPILED = False

__all__ = ["COMPILED", "balance_split", "drain_prices", "match", "pair_guests", "plan",
           "reference", "upgrade_idle"]
