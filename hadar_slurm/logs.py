"""Structured logs: one line per event, JSON (default) or ``key=value`` text.

::

    log = setup_logging("json", file=None, level="info")
    log_event(log, "epoch", epoch=3, jobs=14)

writes, in JSON mode::

    {"ts": "2026-11-22T10:00:00.123Z", "level": "info", "event": "epoch", "epoch": 3, "jobs": 14}

and in text mode::

    2026-11-22T10:00:00Z INFO epoch epoch=3 jobs=14

Times are UTC.  Field values are made JSON-safe (numpy scalars and arrays, tuples, sets, paths,
non-finite floats); anything else is written as its ``str``, so logging never fails on an odd
value.  Plain ``logging`` calls on the ``hadar_slurm`` logger (or its children) come out in the
same format with ``event`` ``"log"`` and the text in ``msg``.

:func:`read_events` and :class:`JsonLinesReader` read a JSON log back (tests, tools).
"""

from __future__ import annotations

import enum
import gzip
import json
import logging
import logging.handlers
import math
import os
import sys
import time
from collections.abc import Mapping
from datetime import date, datetime
from pathlib import Path

import numpy as np

from hadar_slurm.errors import InputError

LOGGER_NAME = "hadar_slurm"
FORMATS = ("json", "text")
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
#: Keys every JSON line starts with; a field of the same name is written as ``<name>_``.
RESERVED = ("ts", "level", "event")

_FIELDS_ATTR = "hadar_fields"
_HANDLER_ATTR = "_hadar_slurm_handler"
_MAX_DEPTH = 16


# -- values ----------------------------------------------------------------------------------


def jsonable(value: object, _depth: int = 0) -> object:
    """``value`` as something :func:`json.dumps` writes as strict JSON; never raises."""
    try:
        return _jsonable(value, _depth)
    except Exception:
        return _safe_str(value)


def _safe_str(value: object) -> str:
    try:
        return str(value)
    except Exception:
        try:
            return repr(value)
        except Exception:
            return f"<unprintable {type(value).__name__}>"


def _jsonable(value: object, depth: int) -> object:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return jsonable(value.item(), depth)
    if depth >= _MAX_DEPTH:
        return _safe_str(value)
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), depth + 1)
    if isinstance(value, enum.Enum):
        return jsonable(value.value, depth + 1)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {_safe_str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [jsonable(v, depth + 1) for v in value]
        try:
            return sorted(items)  # type: ignore[type-var]
        except TypeError:
            return items
    return _safe_str(value)


# -- formatters ------------------------------------------------------------------------------


def _utc(created: float, millis: bool) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    if millis:
        stamp += f".{int((created % 1) * 1000):03d}"
    return stamp + "Z"


def _event_and_fields(record: logging.LogRecord) -> tuple[str, dict[str, object]]:
    fields = getattr(record, _FIELDS_ATTR, None)
    if isinstance(fields, dict):
        return _safe_str(record.msg), dict(fields)
    try:
        msg = record.getMessage()
    except Exception:
        msg = _safe_str(record.msg)
    out: dict[str, object] = {"msg": msg}
    if record.name != LOGGER_NAME:
        out["logger"] = record.name
    return "log", out


def _exception_fields(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, str]:
    if record.exc_info:
        try:
            return {"exc": formatter.formatException(record.exc_info)}
        except Exception:
            return {"exc": _safe_str(record.exc_info[1])}
    return {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``event``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        event, fields = _event_and_fields(record)
        fields.update(_exception_fields(self, record))
        out: dict[str, object] = {
            "ts": _utc(record.created, millis=True),
            "level": record.levelname.lower(),
            "event": event,
        }
        for key, value in fields.items():
            name = _safe_str(key)
            while name in out:
                name += "_"
            out[name] = jsonable(value)
        try:
            return json.dumps(out, allow_nan=False, default=_safe_str)
        except Exception:
            return json.dumps({k: _safe_str(v) for k, v in out.items()})


def _text_value(value: object) -> str:
    value = jsonable(value)
    if isinstance(value, str):
        text = value
        if text == "" or any(c.isspace() or c in "\"'=\\" for c in text):
            return json.dumps(text)
        return text
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False, default=_safe_str)
    except Exception:
        return json.dumps(_safe_str(value))


class TextFormatter(logging.Formatter):
    """``TS LEVEL event key=value ...``; values with spaces or quotes are quoted."""

    def format(self, record: logging.LogRecord) -> str:
        event, fields = _event_and_fields(record)
        fields.update(_exception_fields(self, record))
        parts = [_utc(record.created, millis=False), record.levelname, _text_value(event)]
        parts += [f"{_safe_str(k)}={_text_value(v)}" for k, v in fields.items()]
        return " ".join(parts)


# -- setup and emitting ----------------------------------------------------------------------


def setup_logging(
    fmt: str = "json", file: str | None = None, level: str = "info"
) -> logging.Logger:
    """Configure the ``hadar_slurm`` logger: ``fmt`` ``"json"`` or ``"text"``, to ``file``
    (appended; reopened when logrotate moves it) or stderr, at ``level`` and above.

    Idempotent: a second call replaces the handler of the first instead of adding one.  The
    logger does not propagate to the root logger, so lines are not written twice.
    """
    fmt_name = fmt.strip().lower()
    if fmt_name not in FORMATS:
        raise InputError(f"unknown log format {fmt!r}", field="log_format",
                         fix="use " + " or ".join(FORMATS))
    level_name = level.strip().lower()
    if level_name not in LEVELS:
        raise InputError(f"unknown log level {level!r}", field="log_level",
                         fix="use one of " + ", ".join(LEVELS))
    handler: logging.Handler
    if file:
        try:
            handler = logging.handlers.WatchedFileHandler(file, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot open log file: {exc.strerror or exc}", source=file,
                             field="log_file",
                             fix="create its directory or make it writable") from None
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt_name == "json" else TextFormatter())
    setattr(handler, _HANDLER_ATTR, True)

    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        if getattr(old, _HANDLER_ATTR, False):
            logger.removeHandler(old)
            old.close()
    logger.addHandler(handler)
    logger.setLevel(LEVELS[level_name])
    logger.propagate = False
    return logger


def log_event(
    logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object
) -> None:
    """Emit one event line with ``fields``; never raises on odd field values."""
    logger.log(level, event, extra={_FIELDS_ATTR: fields})


def log_exception(
    logger: logging.Logger, event: str, exc: BaseException, level: int = logging.ERROR,
    **fields: object,
) -> None:
    """:func:`log_event` with ``exc``'s traceback in the line (field ``exc``), not on stderr."""
    logger.log(level, event, extra={_FIELDS_ATTR: fields},
               exc_info=(type(exc), exc, exc.__traceback__))


def event_name(record: logging.LogRecord) -> str:
    """The event a log record is (``"epoch"``, ``"action_failed"``, ...); ``"log"`` for a plain
    ``logging`` call, as the formatters write it."""
    return _event_and_fields(record)[0]


# -- reading logs back -----------------------------------------------------------------------


def _parse_lines(lines: list[str]) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            events.append(obj)
    return events


def read_events(path: str | Path) -> list[dict[str, object]]:
    """Every JSON object line of the log at ``path`` (other lines are skipped); a ``.gz``
    file (rotated by logrotate) is decompressed."""
    p = Path(path)
    if p.suffix == ".gz":
        with gzip.open(p, "rt", encoding="utf-8", errors="replace") as f:
            return _parse_lines(f.read().splitlines())
    return _parse_lines(p.read_text(encoding="utf-8", errors="replace").splitlines())


class JsonLinesReader:
    """Follows a growing JSON log: each :meth:`read_new` returns the events appended since the
    last call (a line still being written is kept for the next call).  A missing file reads as
    no events; a file that shrank (rotated or truncated) is read again from its start."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, object]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:
            self._offset, self._partial = 0, b""
        with self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        return _parse_lines([c.decode("utf-8", errors="replace") for c in complete])

    def read_all(self) -> list[dict[str, object]]:
        """Every event in the file from its start (resets the position)."""
        self._offset, self._partial = 0, b""
        return self.read_new()


__all__ = [
    "JsonFormatter",
    "JsonLinesReader",
    "TextFormatter",
    "event_name",
    "jsonable",
    "log_event",
    "read_events",
    "setup_logging",
]
