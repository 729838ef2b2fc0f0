"""Errors of the Slurm boundary: each names the command or the field it is about."""

from __future__ import annotations

from collections.abc import Sequence


class SlurmError(RuntimeError):
    """Base class of everything :mod:`hadar_slurm.slurm` raises."""


class SlurmConfigError(SlurmError):
    """The Slurm client cannot be used as configured (e.g. ``SLURM_CONF`` is not set)."""


class SlurmCommandError(SlurmError):
    """A Slurm command failed (non-zero exit, not found, or timed out)."""

    def __init__(
        self, argv: Sequence[str], problem: str, *, returncode: int | None = None,
        stdout: str = "", stderr: str = "",
    ) -> None:
        self.argv = tuple(argv)
        self.problem = problem
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        detail = stderr.strip() or stdout.strip()
        if len(detail) > 2000:
            detail = detail[:2000] + " ..."
        msg = f"`{' '.join(self.argv)}` {problem}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class SlurmTimeoutError(SlurmCommandError):
    """A Slurm command did not finish within its timeout."""


class SlurmParseError(SlurmError, ValueError):
    """Output of a Slurm command that the parsers cannot read; names the source and field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: field '{field}': {problem}")
