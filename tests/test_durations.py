"""The one reading of a number of seconds (command line and config file)."""

from __future__ import annotations

import math

import pytest

from hadar_slurm.durations import parse_seconds_value


@pytest.mark.parametrize(("value", "expected"), [
    ("360", 360.0), ("2.5", 2.5), ("1e3", 1000.0), (" 30 ", 30.0), ("1_000", 1000.0),
    (360, 360.0), (0.5, 0.5),
])
def test_accepted_forms(value: object, expected: float) -> None:
    assert parse_seconds_value(value, positive=True) == expected


@pytest.mark.parametrize("value", ["0", 0, "-1", -1.5, "inf", math.inf, "nan", math.nan, "fast",
                                   "", True, False, None, [1]])
def test_rejected_when_positive(value: object) -> None:
    with pytest.raises(ValueError, match="expected a number of seconds > 0"):
        parse_seconds_value(value, positive=True)


def test_zero_allowed_unless_positive() -> None:
    assert parse_seconds_value("0", positive=False) == 0.0
    assert parse_seconds_value(0, positive=False, text=False) == 0.0
    with pytest.raises(ValueError, match=">= 0, got -1"):
        parse_seconds_value(-1, positive=False)


def test_text_refused_for_typed_values() -> None:
    with pytest.raises(ValueError):
        parse_seconds_value("30", positive=True, text=False)
