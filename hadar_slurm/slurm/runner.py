"""The one place that runs Slurm commands.

Every command is an argv list run without a shell, with ``SLURM_CONF`` set (Slurm 22.05 clients
without it, and without /etc/slurm/slurm.conf, try a "configless" DNS lookup through the system
resolver), with a timeout, and with stdout/stderr captured.  A failure raises
:class:`SlurmCommandError`, which names the command and carries its stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hadar_slurm.slurm.errors import SlurmCommandError, SlurmConfigError, SlurmTimeoutError

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RunAs:
    """Who runs a command, when not this process's user: ``uid``, primary ``gid``,
    supplementary ``groups`` and the whole environment ``env`` (``SLURM_CONF`` is set on top).
    Switching to another uid needs root; the command then runs in ``/``."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)


def as_user_kwargs(as_user: RunAs) -> dict[str, object]:
    """The :func:`subprocess.run` arguments that run a command as ``as_user``: exactly its
    environment (``env``; callers may add to it), ``/`` as the working directory, and its uid,
    primary gid and supplementary groups when it is not this process's user.  The one way a
    command runs as another user: Slurm commands (:meth:`SlurmRunner.run`) and the fork's
    file writes (:func:`write_files_as`) alike."""
    kwargs: dict[str, object] = {"env": dict(as_user.env), "cwd": "/"}
    if as_user.uid != os.geteuid():
        kwargs.update(user=as_user.uid, group=as_user.gid, extra_groups=list(as_user.groups))
    return kwargs


#: Names :func:`write_files_as` accepts (no paths, nothing hidden by a leading separator).
_FILE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
#: Seconds each ``mkdir``/``tee`` run as another user may take.
FILE_TIMEOUT_S = 30.0


def write_files_as(owner: RunAs, directory: str, files: Mapping[str, str]) -> None:
    """Create ``directory`` (and its parents) and write ``files`` (``{name: text}``) in it, as
    ``owner``: directly when this process is the owner, else with ``mkdir -p``/``tee`` run as
    the owner (so root never writes into a directory a user controls).  A failure raises
    :class:`~hadar_slurm.slurm.errors.SlurmCommandError` saying what failed."""
    for name in files:
        if not _FILE_NAME.match(name):
            raise ValueError(f"bad file name {name!r}")
    if owner.uid == os.geteuid():
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                path = Path(directory, name)
                tmp = path.with_name(f".{name}.tmp")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)
        except OSError as exc:
            raise SlurmCommandError(("write", directory), f"cannot write the directory: {exc}"
                                    ) from None
        return
    _as_owner(owner, ["mkdir", "-p", "--", directory], None)
    for name, text in files.items():
        _as_owner(owner, ["tee", "--", os.path.join(directory, name)], text)


def _as_owner(owner: RunAs, argv: list[str], text: str | None) -> None:
    try:
        proc = subprocess.run(  # type: ignore[call-overload]
            argv, input=text, stdin=None if text is not None else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            timeout=FILE_TIMEOUT_S, check=False, **as_user_kwargs(owner))
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmCommandError(argv, f"as uid {owner.uid} failed: {exc}") from None
    if proc.returncode != 0:
        raise SlurmCommandError(argv, f"as uid {owner.uid} failed", returncode=proc.returncode,
                                stderr=proc.stderr or f"exit status {proc.returncode}")


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class SlurmRunner:
    """Runs Slurm client commands against the cluster of one ``slurm.conf``.

    ``slurm_conf`` defaults to ``$SLURM_CONF``; one of the two is required.  ``env`` is the base
    environment of the commands (default: this process's), ``SLURM_CONF`` is set on top of it.
    """

    def __init__(
        self, slurm_conf: str | os.PathLike[str] | None = None, *,
        timeout: float = DEFAULT_TIMEOUT_S, env: Mapping[str, str] | None = None,
    ) -> None:
        conf = os.fspath(slurm_conf) if slurm_conf is not None else os.environ.get("SLURM_CONF")
        if not conf:
            raise SlurmConfigError(
                "SLURM_CONF is not set: set it to the cluster's slurm.conf (for the dev cluster: "
                'eval "$(slurm_conf/dev-cluster.sh env)") or pass slurm_conf=...; without it '
                "Slurm 22.05 falls back to a configless DNS lookup"
            )
        if not os.path.isfile(conf):
            raise SlurmConfigError(f"SLURM_CONF={conf}: no such file")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.slurm_conf = conf
        self.timeout = timeout
        base = dict(os.environ if env is None else env)
        base["SLURM_CONF"] = conf
        self._env = base

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True,
        stdin: str | None = None, as_user: RunAs | None = None,
    ) -> CommandResult:
        """Run ``argv`` (a list, never a shell string); raise on failure when ``check``.
        ``as_user``: run it as that user, with that environment (see :class:`RunAs`)."""
        if isinstance(argv, str | bytes):
            raise TypeError("argv must be a sequence of strings, not one string (no shell here)")
        args = tuple(argv)
        if not args or not all(isinstance(a, str) for a in args):
            raise TypeError(f"argv must be a non-empty sequence of str, got {args!r}")
        for a in args:
            if "\0" in a:
                raise ValueError(f"argument {a!r} of {args[0]} contains a NUL byte")
        limit = self.timeout if timeout is None else timeout
        who: dict[str, object] = {"env": self._env}
        if as_user is not None:
            who = as_user_kwargs(as_user)
            who["env"] = {**as_user.env, "SLURM_CONF": self.slurm_conf}
        try:
            proc = subprocess.run(  # type: ignore[call-overload]
                args, capture_output=True, text=True, timeout=limit,
                input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                check=False, **who,
            )
        except FileNotFoundError as exc:
            raise SlurmCommandError(
                args, f"failed: '{args[0]}' not found (install the Slurm client, e.g. "
                "Debian's slurm-client)") from exc
        except (PermissionError, KeyError) as exc:  # cannot switch to as_user
            raise SlurmCommandError(args, f"failed to run as uid {who.get('user')}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmTimeoutError(
                args, f"timed out after {limit:g} s", stdout=_text(exc.stdout),
                stderr=_text(exc.stderr)) from exc
        result = CommandResult(args, proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise SlurmCommandError(
                args, f"failed with exit status {proc.returncode}", returncode=proc.returncode,
                stdout=proc.stdout, stderr=proc.stderr)
        return result


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data
