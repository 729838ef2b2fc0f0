"""What the sidecar does with an error it did not expect (issue #11): an error with one job is a
``job_error`` event (tests/test_sidecar_backend.py); an error of a whole epoch (e.g. a policy
bug) is an ``epoch_error`` event with its traceback and the next epoch tries again; whatever
stops the sidecar is a ``crashed`` event with its traceback in the JSON log, not only on stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hadar_slurm.policy.base import Decision, Snapshot
from hadar_slurm.sidecar.controller import Sidecar
from tests.test_safe_state import config_file, config_of, events, held_jobs  # noqa: F401
from tests.test_sidecar_backend import NODES, FakeSlurm


class FailsOnce:
    """A policy that raises in its first epoch, then decides as ``inner``."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = "fails-once"
        self.calls = 0

    def allocate(self, snapshot: Snapshot) -> Decision:
        self.calls += 1
        if self.calls == 1:
            raise ZeroDivisionError("a policy bug")
        return self.inner.allocate(snapshot)  # type: ignore[attr-defined, no-any-return]


def test_an_epoch_error_is_logged_with_its_traceback_and_the_sidecar_goes_on(
        config_file: Path) -> None:  # noqa: F811
    config = config_of(config_file)
    sidecar = Sidecar(config, api=FakeSlurm(held_jobs(), NODES))
    sidecar.loop.policy = FailsOnce(sidecar.loop.policy)
    assert sidecar.run(max_epochs=2) == 0
    errors = events(config, "epoch_error")
    assert len(errors) == 1 and errors[0]["error"] == "ZeroDivisionError: a policy bug"
    assert "Traceback" in str(errors[0]["exc"]) and "allocate" in str(errors[0]["exc"])
    assert len(events(config, "epoch")) == 2


def test_a_crash_is_in_the_json_log(config_file: Path,  # noqa: F811
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_of(config_file)
    sidecar = Sidecar(config, api=FakeSlurm(held_jobs(), NODES))

    def broken() -> int:
        raise RuntimeError("something nobody expected")

    monkeypatch.setattr(sidecar, "recover_epoch", broken)
    with pytest.raises(RuntimeError):
        sidecar.run(max_epochs=1)
    crashed = events(config, "crashed")
    assert len(crashed) == 1 and crashed[0]["level"] == "critical"
    assert "something nobody expected" in str(crashed[0]["exc"])
