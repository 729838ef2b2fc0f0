"""Errors that carry enough context for a person to fix their input.

Every problem with user-provided input (a trace, a cluster spec, a throughput file, a hint or a
config) is raised as :class:`InputError`, which names the source, the line where known, the field,
what is wrong and how to fix it.  The CLI prints it as one line and exits with status 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """A problem with user input, reported as one line: ``FILE:LINE: field 'F': problem (fix)``."""

    def __init__(
        self,
        problem: str,
        *,
        source: str | None = None,
        line: int | None = None,
        field: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.problem = problem
        self.source = source
        self.line = line
        self.field = field
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.source is not None:
            where = self.source if self.line is None else f"{self.source}:{self.line}"
            where += ": "
        field = f"field '{self.field}': " if self.field else ""
        fix = f" ({self.fix})" if self.fix else ""
        return f"{where}{field}{self.problem}{fix}"
