"""The Slurm release: ``scontrol version`` parsed, the tested series, and the sidecar's check at
start (the ``slurm_version`` event; one line and exit status 2 on an untested series unless
``[sidecar] allow_untested_slurm``).  The fake SlurmApi of tests/test_sidecar_backend.py stands
in for Slurm; the pyslurm backend's version is tested in tests/test_pyslurm_api.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

import hadar_slurm.cli.main as cli
from hadar_slurm.core.info import core_kind
from hadar_slurm.sidecar import controller
from hadar_slurm.sidecar.config import SidecarConfig
from hadar_slurm.sidecar.controller import Sidecar
from hadar_slurm.sidecar.status import format_status
from hadar_slurm.slurm import CommandResult, SlurmCommandError, SlurmParseError, SlurmTimeoutError
from hadar_slurm.slurm.api import CliApi, DryRunApi
from hadar_slurm.slurm.version import (
    TESTED_SERIES,
    SlurmVersion,
    check_version,
    parse_release,
    parse_version,
    scontrol_version,
)
from tests.test_safe_state import config_file, config_of, events, held_jobs  # noqa: F401
from tests.test_sidecar_backend import NODES, FakeSlurm

# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "release", "series"), [
    ("slurm 22.05.8\n", "22.05.8", "22.05"),  # Debian bookworm
    ("slurm 24.11.5\n", "24.11.5", "24.11"),  # Debian trixie
    ("slurm 26.05.5\n", "26.05.5", "26.05"),  # Debian sid
    ("slurm-wlm 24.11.5", "24.11.5", "24.11"),
    ("  slurm 25.05.0-0rc1  \n", "25.05.0-0rc1", "25.05"),
])
def test_parse_version(text: str, release: str, series: str) -> None:
    v = parse_version(text)
    assert (v.release, v.series, str(v)) == (release, series, release)
    assert v.tested is (series in TESTED_SERIES)
    assert (v.major, v.minor) == tuple(int(n) for n in series.split("."))


@pytest.mark.parametrize("text", [
    "", "\n", "22.05.8", "slurm 22.05", "slurm 22.05.8 extra", "slurm 22.05.8\nslurm 24.11.5",
    "slurmctld 22.05.8", "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error",
    "slurm v22.05.8", "slurm 22.5.8",
])
def test_parse_version_refuses_anything_else(text: str) -> None:
    with pytest.raises(SlurmParseError) as info:
        parse_version(text)
    assert str(info.value).startswith("scontrol version: field 'version': expected one line "
                                      "'slurm MAJOR.MINOR.MICRO' such as 'slurm 24.11.5', got ")
    assert repr(text) in str(info.value)


def test_parse_release() -> None:
    assert parse_release("25.11.2", source="pyslurm") == SlurmVersion("25.11.2", 25, 11)
    with pytest.raises(SlurmParseError) as info:
        parse_release("None", source="pyslurm")
    assert str(info.value) == ("pyslurm: field 'version': expected a Slurm release "
                               "MAJOR.MINOR.MICRO such as '24.11.5', got 'None'")


def test_check_version() -> None:
    assert TESTED_SERIES == ("22.05", "24.11", "26.05")
    for series in TESTED_SERIES:
        assert check_version(parse_version(f"slurm {series}.1"), False) is None
    old = parse_version("slurm 23.02.7")
    assert check_version(old, True) is None
    assert check_version(old, False) == ("Slurm 23.02.7 is not a tested release: this "
                                         "hadar-slurm was tested on Slurm 22.05, 24.11 and 26.05")


class Runner:
    """A SlurmRunner that prints ``out`` for every command."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.argvs: list[list[str]] = []

    def run(self, argv: Sequence[str]) -> CommandResult:
        self.argvs.append(list(argv))
        return CommandResult(tuple(argv), 0, self.out, "")


def test_cli_api_asks_scontrol_version_and_dry_run_delegates() -> None:
    runner = Runner("slurm 24.11.5\n")
    api = CliApi(runner)  # type: ignore[arg-type]
    assert api.slurm_version() == SlurmVersion("24.11.5", 24, 11)
    assert runner.argvs == [scontrol_version()] == [["scontrol", "version"]]
    assert api.commands == 1
    assert DryRunApi(api).slurm_version().series == "24.11" and api.commands == 2


# -- the sidecar at start ------------------------------------------------------------------------


def fake(version: str) -> FakeSlurm:
    api = FakeSlurm(held_jobs(), NODES)
    api.version = version
    return api


def write_config(config_file: Path, extra: str) -> Path:  # noqa: F811
    config_file.write_text(config_file.read_text().replace("[sidecar]\n", f"[sidecar]\n{extra}"))
    return config_file


def test_a_tested_slurm_is_logged_and_kept(config_file: Path) -> None:  # noqa: F811
    config = config_of(config_file)
    sidecar = Sidecar(config, api=fake("slurm 24.11.5"))
    assert sidecar.run(max_epochs=1) == 0
    [event] = events(config, "slurm_version")
    assert event["level"] == "info"
    assert {k: event[k] for k in ("release", "series", "tested", "allow_untested")} == {
        "release": "24.11.5", "series": "24.11", "tested": True, "allow_untested": False}
    names = [e["event"] for e in events(config)]
    assert names.index("start") < names.index("slurm_version") < names.index("resume")
    [start] = events(config, "start")
    assert start["core"] == core_kind() in ("compiled", "numpy")
    state = json.loads((Path(str(config.state_dir)) / controller.STATE_FILE).read_text())
    assert state["slurm_version"] == "24.11.5"
    assert format_status([], state).splitlines()[0].endswith(", policy hadar, Slurm 24.11.5")
    assert 'hadar_slurm_info{release="24.11.5",tested="true"} 1.0' in (
        sidecar.metrics.exposition())


def run_cli(config_file: Path, api: FakeSlurm, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    monkeypatch.setattr(controller, "slurm_api", lambda _config: api)
    rc = cli.main(["run", "--config", str(config_file), "--once"])
    return rc, capsys.readouterr().err


def test_an_untested_slurm_is_refused_with_one_line(
        config_file: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run_cli(config_file, fake("slurm 23.02.7"), monkeypatch, capsys)
    assert rc == 2
    assert err == (
        f"hadar-slurm: error: {config_file}: field '[sidecar] allow_untested_slurm': Slurm "
        "23.02.7 is not a tested release: this hadar-slurm was tested on Slurm 22.05, 24.11 "
        "and 26.05 (set allow_untested_slurm = true under [sidecar] to run on it anyway, or "
        "run a tested Slurm)\n")
    config = config_of(config_file)
    [event] = events(config, "slurm_version")
    assert event["level"] == "error" and event["release"] == "23.02.7"
    assert event["tested"] is False and event["allow_untested"] is False
    assert not events(config, "epoch") and not events(config, "crashed")
    assert not (Path(str(config.state_dir)) / controller.STATE_FILE).exists()


def test_allow_untested_slurm_starts_on_it(
        config_file: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    write_config(config_file, "allow_untested_slurm = true\n")
    rc, err = run_cli(config_file, fake("slurm 23.02.7"), monkeypatch, capsys)
    assert rc == 0 and err == ""
    config = config_of(config_file)
    assert config.allow_untested_slurm
    [event] = events(config, "slurm_version")
    assert event["level"] == "warning" and event["tested"] is False
    assert event["allow_untested"] is True
    assert len(events(config, "epoch")) == 1
    state = json.loads((Path(str(config.state_dir)) / controller.STATE_FILE).read_text())
    assert state["slurm_version"] == "23.02.7"


@pytest.mark.parametrize("allow", [False, True])
def test_output_that_is_not_a_version_counts_as_untested(
        config_file: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str], allow: bool) -> None:
    if allow:
        write_config(config_file, "allow_untested_slurm = true\n")
    rc, err = run_cli(config_file, fake("SchedMD Slurm 27.x"), monkeypatch, capsys)
    config = config_of(config_file)
    [event] = events(config, "slurm_version")
    assert event["release"] is None and event["tested"] is False
    assert "expected one line 'slurm MAJOR.MINOR.MICRO'" in str(event["error"])
    if allow:
        assert (rc, err, event["level"]) == (0, "", "warning")
        assert len(events(config, "epoch")) == 1
    else:
        assert rc == 2 and err.count("\n") == 1 and event["level"] == "error"
        assert err.startswith(f"hadar-slurm: error: {config_file}: field '[sidecar] "
                              "allow_untested_slurm': cannot tell which Slurm this is "
                              "(scontrol version: field 'version': expected one line "), err
        assert "tested on Slurm 22.05, 24.11 and 26.05 (set allow_untested_slurm = true" in err


class FlakyVersion(FakeSlurm):
    """``slurm_version`` raises ``error`` ``failures`` times, then answers."""

    def __init__(self, error: Exception, failures: int) -> None:
        super().__init__(held_jobs(), NODES)
        self.error = error
        self.failures = failures
        self.asked = 0

    def slurm_version(self) -> SlurmVersion:
        self.asked += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        return super().slurm_version()


@pytest.mark.parametrize(("error", "event"), [
    (SlurmTimeoutError(["scontrol", "version"], "timed out after 30 s"), "slurm_unreachable"),
    (SlurmCommandError(["scontrol", "version"], "failed: 'scontrol' not found (install the "
                       "Slurm client, e.g. Debian's slurm-client)"), "start_read_failed"),
])
def test_a_failed_scontrol_version_is_retried_as_the_start_read(
        config_file: Path, error: Exception, event: str) -> None:  # noqa: F811
    config = config_of(config_file)
    api = FlakyVersion(error, 2)
    sidecar = Sidecar(config, api=api)
    assert sidecar.run(max_epochs=1) == 0
    failed = events(config, event)
    assert len(failed) == 2 and all(e["level"] == "warning" for e in failed)
    assert str(error) in str(failed[0]["error"])
    assert api.asked == 3 and len(events(config, "slurm_version")) == 1
    assert len(events(config, "epoch")) == 1


def test_the_version_is_asked_once(config_file: Path) -> None:  # noqa: F811
    """A failed start read after the version check does not ask for the version again."""
    config: SidecarConfig = config_of(config_file)
    api = FlakyVersion(RuntimeError("never"), 0)
    reads = [0]
    original = api.read_jobs

    def read_jobs() -> list[object]:
        reads[0] += 1
        if reads[0] == 1:
            raise SlurmCommandError(["squeue"], "failed with exit status 1",
                                    stderr="Unspecified error")
        return original()  # type: ignore[return-value]

    api.read_jobs = read_jobs  # type: ignore[method-assign, assignment]
    assert Sidecar(config, api=api).run(max_epochs=1) == 0
    assert api.asked == 1 and len(events(config, "start_read_failed")) == 1
