"""The job-type naming convention: one reading, ``<model> (batch size <N>)``.

Before, three parsers disagreed on the names below: the estimator (trailing suffix, any
spaces), the consolidation cost (everything before the first " (") and the hints' catalog
(exact trailing suffix).  The answer now is the catalog's: only the exact suffix is a batch
size, other parentheses belong to the model name.
"""

from __future__ import annotations

import pytest

from hadar_slurm.consolidation import model_name
from hadar_slurm.rates.estimate import model_family
from hadar_slurm.rates.table import split_job_type


@pytest.mark.parametrize(("job_type", "expected"), [
    ("ResNet-50 (batch size 64)", ("ResNet-50", 64)),
    ("A3C", ("A3C", None)),
    ("Digits (batch size 0)", ("Digits", 0)),
    # the names the three parsers read differently before:
    ("ResNet-50 (fp16)", ("ResNet-50 (fp16)", None)),
    ("ResNet-50 (fp16) (batch size 64)", ("ResNet-50 (fp16)", 64)),
    ("ResNet-50  (batch size 64)", ("ResNet-50 ", 64)),
    ("ResNet-50 (batch size 64) ", ("ResNet-50 (batch size 64) ", None)),
    ("ResNet-50(batch size 64)", ("ResNet-50(batch size 64)", None)),
    ("ResNet-50 (batch size x)", ("ResNet-50 (batch size x)", None)),
])
def test_one_reading(job_type: str, expected: tuple[str, int | None]) -> None:
    assert split_job_type(job_type) == expected
    assert model_family(job_type) == expected[0]
    assert model_name(job_type) == expected[0]
