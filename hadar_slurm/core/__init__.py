"""The Hadar core: compiled when built, with the NumPy reference twin otherwise.

Both expose the same functions with the same results (see :mod:`hadar_slurm.core.reference`):
``plan`` (one epoch of the primal-dual planner) and ``balance_split`` (the type split).
"""

from __future__ import annotations

from hadar_slurm.core import reference

try:
    import hadar_slurm._hadar_core as _compiled

    plan = _compiled.plan
    balance_split = _compiled.balance_split
    COMPILED = True
except (ImportError, AttributeError):  # not built (e.g. a bare source tree)
    plan = reference.plan
    balance_split = reference.balance_split
    COMPILED = False

__all__ = ["COMPILED", "balance_split", "plan", "reference"]
