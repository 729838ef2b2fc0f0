"""Which scheduling core is in use: the compiled ``hadar_slurm._hadar_core`` or the NumPy
reference that :mod:`hadar_slurm.core` falls back to (silently) when the compiled one is not
built.  ``hadar-slurm run`` logs it in its ``start`` event, ``hadar-slurm simulate`` prints it
on stderr at start."""

from __future__ import annotations

import importlib

from hadar_slurm import core

COMPILED_MODULE = "hadar_slurm._hadar_core"


def core_kind() -> str:
    """``"compiled"`` or ``"numpy"`` (read from :data:`hadar_slurm.core.COMPILED`)."""
    return "compiled" if core.COMPILED else "numpy"


def _why_not_compiled() -> str:
    try:
        importlib.import_module(COMPILED_MODULE)
    except ImportError as exc:
        return str(exc) or type(exc).__name__
    return f"{COMPILED_MODULE} lacks a function hadar_slurm.core needs"


def core_line() -> str:
    """One line for a person: ``core: compiled (hadar_slurm._hadar_core)`` or
    ``core: NumPy reference (the compiled core is not built: <why>)``."""
    if core.COMPILED:
        return f"core: compiled ({COMPILED_MODULE})"
    return f"core: NumPy reference (the compiled core is not built: {_why_not_compiled()})"


__all__ = ["core_kind", "core_line"]
