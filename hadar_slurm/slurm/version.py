"""Which Slurm the sidecar talks to, and the Slurm releases hadar-slurm was tested on.

``scontrol version`` prints one line, ``slurm 24.11.5`` (a Debian build may say ``slurm-wlm``);
:func:`parse_version` reads it into a :class:`SlurmVersion`.  The sidecar reads it once at start
and refuses a release series not in :data:`TESTED_SERIES` unless its config allows it
(:func:`check_version`; ``[sidecar] allow_untested_slurm``).

The tested series and what differs between them (docs/admins.md, "Supported Slurm versions"):
22.05 (Debian bookworm), 24.11 (Debian trixie), 26.05 (Debian sid).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hadar_slurm.slurm.errors import SlurmParseError

#: The Slurm release series (``major.minor``) hadar-slurm was tested on.
TESTED_SERIES = ("22.05", "24.11", "26.05")

#: Where :func:`parse_version` reads from by default (the source in its errors).
SOURCE = "scontrol version"

_RELEASE = r"(\d{2})\.(\d{2})\.(\d{1,3})(?:-[0-9A-Za-z][0-9A-Za-z.+~-]*)?"
_VERSION_LINE = re.compile(rf"(?:slurm|slurm-wlm)\s+(?P<release>{_RELEASE})")
_BARE = re.compile(rf"(?P<release>{_RELEASE})")


@dataclass(frozen=True)
class SlurmVersion:
    """A Slurm release: ``release`` as Slurm prints it (``"24.11.5"``, ``"25.05.0-0rc1"``),
    and its ``major`` (24) and ``minor`` (11) numbers."""

    release: str
    major: int
    minor: int

    @property
    def series(self) -> str:
        """The release series, ``"24.11"`` (Slurm's major release)."""
        return f"{self.major:02d}.{self.minor:02d}"

    @property
    def tested(self) -> bool:
        """Whether the series is one of :data:`TESTED_SERIES`."""
        return self.series in TESTED_SERIES

    def __str__(self) -> str:
        return self.release


def scontrol_version() -> list[str]:
    """The argv that prints the Slurm release: ``scontrol version`` (it needs slurm.conf but
    does not contact slurmctld)."""
    return ["scontrol", "version"]


def _version(match: re.Match[str]) -> SlurmVersion:
    release = match.group("release")
    major, minor = (int(n) for n in release.split(".")[:2])
    return SlurmVersion(release, major, minor)


def parse_version(text: str, *, source: str = SOURCE) -> SlurmVersion:
    """The release in the output of ``scontrol version`` (``slurm 24.11.5``, or
    ``slurm-wlm 24.11.5``); anything else raises :class:`SlurmParseError` naming ``source``."""
    m = _VERSION_LINE.fullmatch(text.strip())
    if m is None:
        raise SlurmParseError(source, "version", "expected one line 'slurm MAJOR.MINOR.MICRO' "
                              f"such as 'slurm 24.11.5', got {_shown(text)}")
    return _version(m)


def parse_release(text: str, *, source: str, field: str = "version") -> SlurmVersion:
    """A bare release, ``24.11.5`` (as libslurm and pyslurm report it)."""
    m = _BARE.fullmatch(text.strip())
    if m is None:
        raise SlurmParseError(source, field, "expected a Slurm release MAJOR.MINOR.MICRO such "
                              f"as '24.11.5', got {_shown(text)}")
    return _version(m)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 200 else text[:200] + "...")


def tested_text() -> str:
    """``"22.05, 24.11 and 26.05"``."""
    return ", ".join(TESTED_SERIES[:-1]) + " and " + TESTED_SERIES[-1]


def check_version(version: SlurmVersion, allow_untested: bool) -> str | None:
    """Why the sidecar may not run on ``version`` (one sentence), or None when it may: the
    series is tested, or ``allow_untested``."""
    if version.tested or allow_untested:
        return None
    return (f"Slurm {version.release} is not a tested release: this hadar-slurm was tested on "
            f"Slurm {tested_text()}")


__all__ = [
    "SOURCE",
    "TESTED_SERIES",
    "SlurmVersion",
    "check_version",
    "parse_release",
    "parse_version",
    "scontrol_version",
    "tested_text",
]
