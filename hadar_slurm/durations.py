"""Durations in seconds, as the command line and the config file give them: one reading."""

from __future__ import annotations

import math


def parse_seconds_value(value: object, *, positive: bool, text: bool = True) -> float:
    """``value`` as a number of seconds: finite, ``> 0`` when ``positive``, else ``>= 0``.

    Accepted forms, the union of what the three readers accepted before they became this one
    (``hadar-slurm simulate``'s flags, ``hadar-slurm profile``'s ``--seconds``/``--timeout``
    and the config file's seconds keys):

    - an ``int`` or ``float`` (a TOML number; never a ``bool``);
    - when ``text``, a string that :func:`float` reads (``"360"``, ``"2.5"``, ``"1e3"``,
      ``" 30 "``, ``"1_000"``): command-line values.  The config file passes ``text=False``:
      a quoted number there is still an error, as TOML values are typed.

    Raises :class:`ValueError` (no field name: each caller names its flag or key).
    """
    seconds = math.nan
    if isinstance(value, str) and text:
        try:
            seconds = float(value)
        except ValueError:
            pass
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"expected a number of seconds {'>' if positive else '>='} 0, "
                         f"got {value!r}")
    return seconds


__all__ = ["parse_seconds_value"]
