"""The Hadar core: the compiled planner when it is built, the NumPy reference otherwise.

``plan`` has the same signature and results in both (see :mod:`hadar_slurm.core.reference`).
"""

from __future__ import annotations

from hadar_slurm.core import reference

try:
    import hadar_slurm._hadar_core as _compiled

    plan = _compiled.plan
    COMPILED = True
except (ImportError, AttributeError):  # not built (e.g. running from a bare source tree)
    plan = reference.plan
    COMPILED = False

__all__ = ["COMPILED", "plan", "reference"]
