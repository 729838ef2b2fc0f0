"""The sidecar's TOML config (every key validated), its example files, and structured logs."""

from __future__ import annotations

import itertools
import json
import logging
import re
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from bench import gen_dev_throughputs
from hadar_slurm.errors import InputError
from hadar_slurm.logs import JsonLinesReader, log_event, read_events, setup_logging
from hadar_slurm.policy import REGISTRY
from hadar_slurm.rates.table import default_table, load_table
from hadar_slurm.sidecar.config import (
    CONFIG_SCHEMA,
    SidecarConfig,
    default_config,
    load_config,
    load_table_for,
    parse_config,
    render_config_reference,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "slurm_conf" / "hadar-slurm.toml"
DEV = REPO / "slurm_conf" / "dev-sidecar.toml"
DEV_CSV = REPO / "slurm_conf" / "dev-throughputs.csv"
UNIT = REPO / "slurm_conf" / "hadar-slurm.service"


STATE = "/var/lib/hadar-test"


def with_state_dir(text: str) -> str:
    """``text`` with ``[sidecar] state_dir`` set (it is required) unless it sets it."""
    if re.search(r"^\s*state_dir\s*=", text, re.M):
        return text
    header = re.search(r"^\s*\[sidecar\][^\n]*$", text, re.M)
    if header is None:
        return f'{text}\n[sidecar]\nstate_dir = "{STATE}"\n'
    return f'{text[:header.end()]}\nstate_dir = "{STATE}"{text[header.end():]}'


def parse(text: str, base: Path = Path("/etc/hadar-slurm")) -> SidecarConfig:
    """A config that is meant to be valid (state_dir added where it lacks one)."""
    return parse_config(with_state_dir(text), "test.toml", base)


def error_of(text: str, base: Path = Path("/etc/hadar-slurm")) -> str:
    """The error of a config that is meant to be refused, as written."""
    with pytest.raises(InputError) as info:
        parse_config(text, "test.toml", base)
    return str(info.value)


# -- defaults and the example files ----------------------------------------------------------


def test_defaults() -> None:
    c = default_config()
    assert c.source == "<defaults>"
    assert c.slurm_conf is None and c.partition is None and c.log_file is None
    assert c.backend == "auto"
    assert c.command_timeout_s == 30.0
    assert c.policy == "hadar"
    assert c.epoch_seconds == 360.0
    assert c.preempt_grace_s == 30.0
    assert c.preempt_signal == "USR1"
    assert c.throughputs == ()
    assert c.dry_run is False
    assert c.state_dir is None  # no default: a config file must set it
    assert (c.log_format, c.log_level) == ("json", "info")
    assert isinstance(c.epoch_seconds, float)


def test_state_dir_only_is_the_defaults() -> None:
    c = parse("")
    assert c.source == "test.toml" and c.state_dir == STATE
    assert c.with_overrides(source="<defaults>", state_dir=None) == default_config()


@pytest.mark.parametrize("text, line", [
    ("", None),
    ("[scheduler]\npolicy = 'hadar'\n", None),
    ("[scheduler]\npolicy = 'hadar'\n[sidecar]\ndry_run = true\n", 3),
    ('[sidecar]\nstate_dir = ""\n', 2),
])
def test_config_without_state_dir_is_refused(text: str, line: int | None) -> None:
    """Issue #11: a config without state_dir silently wrote /var/lib/hadar-slurm."""
    msg = error_of(text)
    where = "test.toml" if line is None else f"test.toml:{line}"
    assert msg.startswith(f"{where}: field '[sidecar] state_dir': is not set"), msg
    assert 'add state_dir = "/var/lib/hadar-slurm" under [sidecar]' in msg
    assert "\n" not in msg


def test_state_dir_is_required_where_it_is_used() -> None:
    """A config built without a file (defaults, as ``status`` uses) has no state_dir: what
    needs one says so in one line; readers get no state."""
    c = default_config()
    with pytest.raises(InputError, match=r"field '\[sidecar\] state_dir': is not set"):
        c.require_state_dir()
    with pytest.raises(InputError, match=r"field '\[sidecar\] state_dir'"):
        _ = c.store_path
    assert c.with_overrides(throughput_db="/x/t.db").store_path == Path("/x/t.db")


def test_example_loads_and_lists_every_key_at_its_default() -> None:
    """Every key at its default, except state_dir, which has none (the unit's directory)."""
    config = load_config(EXAMPLE)
    assert config.state_dir == "/var/lib/hadar-slurm"
    assert config.with_overrides(source="<defaults>", state_dir=None) == default_config()
    data = tomllib.loads(EXAMPLE.read_text())
    listed = {(s, k) for s, table in data.items() for k in table}
    assert listed == {(k.section, k.key) for k in CONFIG_SCHEMA}
    for key in CONFIG_SCHEMA:
        if key.name == "[sidecar] state_dir":
            continue
        default = tomllib.loads(f"v = {key.default_text}")["v"]
        assert data[key.section][key.key] == default, key.name


def test_dev_config() -> None:
    c = load_config(DEV)
    assert c.slurm_conf is None
    assert (c.epoch_seconds, c.preempt_grace_s) == (5.0, 2.0)
    assert c.throughputs == (str(DEV_CSV),)
    assert c.state_dir == "/tmp/hadar-sidecar-state"
    assert c.log_format == "json"


def test_schema_keys_are_unique_and_name_config_fields() -> None:
    names = [(k.section, k.key) for k in CONFIG_SCHEMA]
    assert len(names) == len(set(names))
    fields = set(SidecarConfig.__dataclass_fields__) - {"source"}
    assert {k.field_name for k in CONFIG_SCHEMA} == fields


def test_render_config_reference_lists_every_key() -> None:
    ref = render_config_reference()
    lines = ref.strip().splitlines()
    assert lines[0].startswith("| Section | Key |")
    assert len(lines) == 2 + len(CONFIG_SCHEMA)
    for key in CONFIG_SCHEMA:
        assert f"| `[{key.section}]` | `{key.key}` |" in ref
    assert all(line.count(" | ") == 4 for line in lines if not line.startswith("|---"))


# -- values ----------------------------------------------------------------------------------


def test_all_keys_set() -> None:
    c = parse(
        """
        [slurm]
        conf = "slurm.conf"
        backend = "CLI"
        partition = "gpu"
        command_timeout_s = 5
        [scheduler]
        policy = "FIFO"
        epoch_seconds = 60.5
        reschedule_on_finish = false
        finish_poll_s = 2.5
        preempt_grace_s = 0
        preempt_signal = "SIGUSR2"
        [sidecar]
        dry_run = true
        state_dir = "state"
        log_format = "text"
        log_file = "/var/log/hadar-slurm/sidecar.log"
        log_level = "DEBUG"
        """
    )
    assert c.slurm_conf == "/etc/hadar-slurm/slurm.conf"
    assert (c.backend, c.partition, c.command_timeout_s) == ("cli", "gpu", 5.0)
    assert (c.policy, c.epoch_seconds, c.preempt_grace_s) == ("fifo", 60.5, 0.0)
    assert c.preempt_signal == "USR2"
    assert (c.reschedule_on_finish, c.finish_poll_s) == (False, 2.5)
    assert c.dry_run is True
    assert c.state_dir == "/etc/hadar-slurm/state"
    assert (c.log_format, c.log_file, c.log_level) == (
        "text", "/var/log/hadar-slurm/sidecar.log", "debug")
    assert isinstance(c.command_timeout_s, float)


@pytest.mark.parametrize("name", ["USR1", "usr2", "SIGTERM", " int ", "HUP"])
def test_signal_names_normalized(name: str) -> None:
    c = parse(f'[scheduler]\npreempt_signal = "{name}"')
    assert c.preempt_signal == name.strip().upper().removeprefix("SIG")


def test_relative_paths_resolve_against_the_config_dir(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "a.csv").write_text(DEV_CSV.read_text())
    cfg = tmp_path / "etc" / "hadar.toml"
    cfg.parent.mkdir()
    cfg.write_text(
        '[scheduler]\nthroughputs = ["../tables/a.csv"]\n'
        '[sidecar]\nstate_dir = "state"\nlog_file = "../log/x.log"\n'
    )
    c = load_config(cfg)
    assert c.throughputs == (str(tmp_path / "tables" / "a.csv"),)
    assert c.state_dir == str(tmp_path / "etc" / "state")
    assert c.log_file == str(tmp_path / "log" / "x.log")


def test_absolute_paths_kept(tmp_path: Path) -> None:
    c = parse(f'[scheduler]\nthroughputs = ["{DEV_CSV}"]\n[sidecar]\nstate_dir = "/srv/h"',
              base=tmp_path)
    assert c.throughputs == (str(DEV_CSV),)
    assert c.state_dir == "/srv/h"


def test_empty_string_unsets_optional_paths() -> None:
    c = parse('[slurm]\nconf = ""\npartition = ""\n[sidecar]\nlog_file = ""')
    assert (c.slurm_conf, c.partition, c.log_file) == (None, None, None)


# -- errors ----------------------------------------------------------------------------------


def test_toml_syntax_error_names_the_line() -> None:
    msg = error_of('[scheduler]\npolicy = "hadar"\nepoch_seconds = = 3\n')
    assert msg.startswith("test.toml:3: invalid TOML:"), msg


def test_unknown_section() -> None:
    msg = error_of("[slurm]\n[schedular]\npolicy = 'hadar'\n")
    assert msg.startswith("test.toml:2: field '[schedular]': unknown section"), msg
    assert "did you mean '[scheduler]'" in msg
    assert "[slurm], [scheduler], [hadare], [sidecar]" in msg


def test_key_outside_a_section() -> None:
    msg = error_of('policy = "hadar"\n')
    assert "test.toml:1: field 'policy': key outside any section" in msg


def test_unknown_key_suggests_the_closest() -> None:
    msg = error_of("[scheduler]\n\npolcy = 'hadar'\n")
    assert msg.startswith("test.toml:3: field '[scheduler] polcy': unknown key ("), msg
    assert "did you mean 'policy'?" in msg
    assert "known: policy, epoch_seconds, reschedule_on_finish, finish_poll_s, preempt_grace_s" \
        in msg


def test_unknown_key_without_close_match() -> None:
    msg = error_of("[sidecar]\nzzz = 1\n")
    assert "did you mean" not in msg
    assert "unknown key (known: dry_run, state_dir," in msg


def test_key_in_the_wrong_section_is_unknown() -> None:
    msg = error_of("[slurm]\npolicy = 'hadar'\n")
    assert "field '[slurm] policy': unknown key" in msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[scheduler]\nepoch_seconds = "fast"',
         """test.toml:2: field '[scheduler] epoch_seconds': must be a number of seconds > 0, """
         """got "fast\""""),
        ("[scheduler]\nepoch_seconds = 0",
         "field '[scheduler] epoch_seconds': must be a number of seconds > 0, got 0"),
        ("[scheduler]\nepoch_seconds = -5.5",
         "must be a number of seconds > 0, got -5.5"),
        ("[scheduler]\nepoch_seconds = inf", "must be a number of seconds > 0, got inf"),
        ("[scheduler]\nepoch_seconds = nan", "must be a number of seconds > 0, got nan"),
        ("[scheduler]\nepoch_seconds = true", "must be a number of seconds > 0, got true"),
        ("[scheduler]\nfinish_poll_s = 0",
         "field '[scheduler] finish_poll_s': must be a number of seconds > 0, got 0"),
        ('[scheduler]\nreschedule_on_finish = "no"',
         "field '[scheduler] reschedule_on_finish': must be true or false"),
        ("[scheduler]\npreempt_grace_s = -1",
         "field '[scheduler] preempt_grace_s': must be a number of seconds >= 0, got -1"),
        ("[slurm]\ncommand_timeout_s = [1]", "must be a number of seconds > 0, got [1]"),
        ('[sidecar]\ndry_run = "yes"',
         """field '[sidecar] dry_run': must be true or false, got "yes" """.strip()),
        ("[sidecar]\ndry_run = 1", "field '[sidecar] dry_run': must be true or false, got 1"),
        ('[slurm]\nbackend = "slurmrestd"',
         """field '[slurm] backend': must be one of "auto", "cli", "pyslurm", got "slurmrestd\""""),
        ('[sidecar]\nlog_format = "xml"', "must be one of \"json\", \"text\""),
        ('[sidecar]\nlog_level = "verbose"', "must be one of \"debug\", \"info\""),
        ("[sidecar]\nlog_file = 3", "field '[sidecar] log_file': must be a path (a string)"),
        ('[sidecar]\nstate_dir = ""', "field '[sidecar] state_dir': is not set"),
        ('[slurm]\npartition = "gpu,cpu"', "must be one partition name"),
        ('[scheduler]\nthroughputs = "a.csv"',
         """must be a list of file paths, got "a.csv" (write it as a list: ["a.csv"])"""),
        ("[scheduler]\npolicy = 3", "field '[scheduler] policy': must be a policy name"),
        ("[slurm]\nconf = 1979-05-27", "got the date/time 1979-05-27"),
        ("[sidecar]\nstate_dir = {a = 1}", "got a table"),
        ("slurm = 3", "field 'slurm': must be a section, got 3"),
        ("[scheduler]\ngpu_memory_mib = { v100 = 0 }",
         "field '[scheduler] gpu_memory_mib': v100: must be a size in MiB above 0, got 0"),
        ("[scheduler]\ngpu_memory_mib = { v100 = true }", "v100: must be a size in MiB above 0"),
        ("[scheduler]\ngpu_memory_mib = { a100 = nan }", "a100: must be a size in MiB above 0"),
        ("[scheduler]\ngpu_memory_mib = 32768", "must be a table of GPU type = MiB, got 32768"),
    ],
)
def test_bad_values(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_wrong_type_message_is_one_line() -> None:
    msg = error_of('[scheduler]\nepoch_seconds = "fast"')
    assert msg == ("test.toml:2: field '[scheduler] epoch_seconds': must be a number of "
                   'seconds > 0, got "fast"')


def test_unknown_policy_lists_the_known() -> None:
    msg = error_of('[scheduler]\npolicy = "gavel"')
    assert "field '[scheduler] policy': unknown policy \"gavel\"" in msg
    assert "known: " + ", ".join(sorted(REGISTRY)) in msg


@pytest.mark.parametrize("name", ["USR3", "SIG", "", "KILLME", "1"])
def test_bad_signal(name: str) -> None:
    msg = error_of(f'[scheduler]\npreempt_signal = "{name}"')
    assert "field '[scheduler] preempt_signal': must be a signal name such as USR1" in msg


def test_signal_must_be_a_name() -> None:
    assert "must be a signal name" in error_of("[scheduler]\npreempt_signal = 10")


@pytest.mark.parametrize("name", ["KILL", "SIGSTOP"])
def test_uncatchable_signal(name: str) -> None:
    assert "cannot be caught" in error_of(f'[scheduler]\npreempt_signal = "{name}"')


def test_missing_throughputs_file(tmp_path: Path) -> None:
    msg = error_of('[scheduler]\nthroughputs = ["nope.csv"]', base=tmp_path)
    assert f"field '[scheduler] throughputs': throughput file {tmp_path / 'nope.csv'} " \
        "not found" in msg
    assert msg.startswith("test.toml:2: ")


def test_throughputs_entry_that_is_a_directory(tmp_path: Path) -> None:
    msg = error_of('[scheduler]\nthroughputs = ["."]', base=tmp_path)
    assert "is not a file" in msg


def test_unreadable_config_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")


def test_load_config_error_names_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "h.toml"
    cfg.write_text("[sidecar]\nlog_format = 'yaml'\n")
    with pytest.raises(InputError) as info:
        load_config(cfg)
    assert str(info.value).startswith(f"{cfg}:2: field '[sidecar] log_format'")


# -- overrides -------------------------------------------------------------------------------


def test_with_overrides_validates_like_the_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    base = default_config()
    c = base.with_overrides(policy="FIFO", epoch_seconds=60, dry_run=True, preempt_signal="SIGHUP")
    assert (c.policy, c.epoch_seconds, c.dry_run, c.preempt_signal) == ("fifo", 60.0, True, "HUP")
    assert base.policy == "hadar"
    with pytest.raises(InputError, match=r"\[scheduler\] epoch_seconds': must be a number"):
        base.with_overrides(epoch_seconds="fast")
    with pytest.raises(InputError, match="unknown policy"):
        base.with_overrides(policy="nope")
    assert base.with_overrides(epoch_seconds=10).preempt_grace_s == 30.0
    with pytest.raises(TypeError, match="polcy"):
        base.with_overrides(polcy="hadar")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(DEV_CSV.read_text())
    c = base.with_overrides(throughputs=["t.csv"], log_file=None, state_dir=Path("s"))
    assert c.throughputs == (str(tmp_path / "t.csv"),)
    assert c.state_dir == str(tmp_path / "s")
    assert c.log_file is None


# -- throughput tables -----------------------------------------------------------------------


def test_load_table_for_merges_the_dev_csv() -> None:
    table = load_table_for(load_config(DEV))
    bundled = default_table()
    assert table.rate("ResNet-50 (batch size 64)", 1, "a100") > 0
    assert table.rate("ResNet-50 (batch size 64)", 1, "v100") == bundled.rate(
        "ResNet-50 (batch size 64)", 1, "v100")
    assert "a100" in table.gpu_types()
    assert load_table_for(default_config()).rates == bundled.rates


def test_load_table_for_merges_in_order(tmp_path: Path) -> None:
    header = "job_type,scale_factor,gpu_type,steps_per_second\n"
    (tmp_path / "a.csv").write_text(header + "A3C,1,a100,1.0\nA3C,1,h100,5.0\n")
    (tmp_path / "b.csv").write_text(header + "A3C,1,a100,2.0\n")
    c = parse('[scheduler]\nthroughputs = ["a.csv", "b.csv"]', base=tmp_path)
    table = load_table_for(c)
    assert table.rate("A3C", 1, "a100") == 2.0
    assert table.rate("A3C", 1, "h100") == 5.0


def test_dev_throughputs_cover_the_bundled_table() -> None:
    bundled = default_table()
    dev = load_table(DEV_CSV)
    assert set(dev.job_keys()) == set(bundled.job_keys())
    assert dev.gpu_types() == ("a100",)
    for job_type, sf in bundled.job_keys():
        v100 = bundled.rate(job_type, sf, "v100")
        a100 = dev.rate(job_type, sf, "a100")
        assert (a100 == 0.0) == (v100 == 0.0)
        assert v100 == 0.0 or 1.5 <= a100 / v100 <= 2.5


def test_dev_throughputs_csv_is_generated() -> None:
    assert DEV_CSV.read_text() == gen_dev_throughputs.render()
    assert "NOT MEASURED" in DEV_CSV.read_text().split("job_type,")[0]


def test_service_unit_essentials() -> None:
    unit = UNIT.read_text()
    for line in [
        "ExecStart=/usr/local/bin/hadar-slurm run --config /etc/hadar-slurm/hadar-slurm.toml",
        "Restart=on-failure", "RestartSec=10", "User=hadar",
        "Environment=SLURM_CONF=/etc/slurm/slurm.conf", "StateDirectory=hadar-slurm",
        "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only",
        "PrivateTmp=yes", "KillSignal=SIGTERM",
    ]:
        assert re.search(rf"^{re.escape(line)}$", unit, re.M), line
    assert re.search(r"^After=.*\bslurmctld\.service\b", unit, re.M)
    assert re.search(r"^ReadWritePaths=.*/var/lib/hadar-slurm\b", unit, re.M)
    assert re.search(r"^TimeoutStopSec=\d+", unit, re.M)


# -- logs ------------------------------------------------------------------------------------



@pytest.mark.usefixtures("clean_logger")
def test_json_log_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = setup_logging("json", str(path), "info")
    log_event(log, "epoch", epoch=3, jobs=14, note="two words")
    log_event(log, "skipped", level=logging.DEBUG, x=1)
    log_event(log, "slow", level=logging.WARNING, seconds=1.5)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert list(first)[:3] == ["ts", "level", "event"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert first | {"ts": None} == {"ts": None, "level": "info", "event": "epoch", "epoch": 3,
                                    "jobs": 14, "note": "two words"}
    assert json.loads(lines[1])["level"] == "warning"


@pytest.mark.usefixtures("clean_logger")
def test_json_log_odd_values(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = setup_logging("json", str(path))

    class Odd:
        def __str__(self) -> str:
            return "odd!"

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

        def __repr__(self) -> str:
            raise RuntimeError("no")

    log_event(
        log, "values", i=np.int64(7), f=np.float32(0.5), b=np.bool_(True), arr=np.arange(3),
        t=(1, (2, 3)), s={3, 1}, p=Path("/x"), nan=float("nan"), odd=Odd(), broken=Broken(),
        d={1: np.float64(2.0)}, ts="field named ts",
    )
    (event,) = read_events(path)
    assert event["i"] == 7 and event["f"] == 0.5 and event["b"] is True
    assert event["arr"] == [0, 1, 2] and event["t"] == [1, [2, 3]] and event["s"] == [1, 3]
    assert event["p"] == "/x" and event["nan"] == "nan" and event["odd"] == "odd!"
    assert event["broken"] == "<unprintable Broken>"
    assert event["d"] == {"1": 2.0}
    assert event["ts_"] == "field named ts" and event["ts"] != "field named ts"
    assert "NaN" not in path.read_text()


@pytest.mark.usefixtures("clean_logger")
def test_text_log_line(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    log = setup_logging("text", str(path), "debug")
    log_event(log, "epoch", epoch=3, jobs=14, reason="no gpu free", gpus=("v100", "k80"),
              ok=True, none=None, empty="")
    log_event(log, "dbg", level=logging.DEBUG, x=np.float64(1.25))
    first, second = path.read_text().splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO epoch epoch=3 jobs=14 reason=\"no gpu free\" "
        r'gpus=\["v100","k80"\] ok=true none=null empty=""',
        first,
    ), first
    assert second.endswith(" DEBUG dbg x=1.25")
    assert read_events(path) == []


@pytest.mark.usefixtures("clean_logger")
def test_setup_logging_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    setup_logging("json", str(path))
    log = setup_logging("json", str(path))
    assert log is logging.getLogger("hadar_slurm")
    assert len(log.handlers) == 1
    log_event(log, "once")
    assert [e["event"] for e in read_events(path)] == ["once"]
    setup_logging("text")
    assert len(log.handlers) == 1
    assert isinstance(log.handlers[0], logging.StreamHandler)


@pytest.mark.usefixtures("clean_logger")
def test_plain_logging_calls_and_exceptions(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = setup_logging("json", str(path))
    logging.getLogger("hadar_slurm.sidecar").warning("squeue failed: %s", "timeout")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("oops")
    warn, exc = read_events(path)
    assert warn["event"] == "log" and warn["msg"] == "squeue failed: timeout"
    assert warn["logger"] == "hadar_slurm.sidecar" and warn["level"] == "warning"
    assert exc["level"] == "error" and "ValueError: boom" in str(exc["exc"])


@pytest.mark.usefixtures("clean_logger")
def test_stderr_default(capsys: pytest.CaptureFixture[str]) -> None:
    log = setup_logging()
    log_event(log, "hello", n=1)
    err = capsys.readouterr().err.strip()
    assert json.loads(err)["event"] == "hello"


def test_setup_logging_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="log format"):
        setup_logging("xml")
    with pytest.raises(InputError, match="log level"):
        setup_logging("json", level="loud")
    with pytest.raises(InputError, match="cannot open log file"):
        setup_logging("json", str(tmp_path / "no" / "such" / "dir" / "x.log"))


def test_read_events_skips_non_json(tmp_path: Path) -> None:
    path = tmp_path / "mixed.log"
    path.write_text('{"event": "a"}\nnot json\n[1, 2]\n\n{"event": "b"}\n{"event": "c"')
    assert [e["event"] for e in read_events(path)] == ["a", "b"]


def test_json_lines_reader_follows_a_growing_file(tmp_path: Path) -> None:
    path = tmp_path / "grow.log"
    reader = JsonLinesReader(path)
    assert reader.read_new() == []
    path.write_text('{"event": "a"}\n{"event": ')
    assert reader.read_new() == [{"event": "a"}]
    with path.open("a") as f:
        f.write('"b"}\n')
    assert reader.read_new() == [{"event": "b"}]
    assert reader.read_new() == []
    path.write_text('{"event": "c"}\n')
    assert reader.read_new() == [{"event": "c"}]
    assert [e["event"] for e in reader.read_all()] == ["c"]


def test_hadare_tracker_root(tmp_path: Path) -> None:
    assert default_config().tracker_root is None  # each job's working directory
    c = parse('[hadare]\ntracker_root = "trackers"\n', tmp_path)
    assert c.tracker_root == str(tmp_path / "trackers")  # need not exist yet
    assert parse('[hadare]\ntracker_root = ""\n').tracker_root is None
    (tmp_path / "file").write_text("")
    msg = error_of(f'[hadare]\ntracker_root = "{tmp_path}/file"\n')
    assert msg.startswith("test.toml:2: field '[hadare] tracker_root': ") and "not a directory" \
        in msg
    msg = error_of("[hadare]\ntracker_root = 3\n")
    assert "field '[hadare] tracker_root': must be a path" in msg
    msg = error_of("[hadare]\ntracker = 3\n")
    assert "unknown key (did you mean 'tracker_root'?" in msg


def test_hadare_policy_is_accepted() -> None:
    assert "hadare" in REGISTRY
    assert parse('[scheduler]\npolicy = "hadare"\n').policy == "hadare"


def test_stop_clock_wakes_early_when_a_job_ended() -> None:
    """[scheduler] reschedule_on_finish: the wait between epochs asks ``wake`` every poll and
    ends when it says a job ended; a stop ends it at once; without ``wake`` it waits it out."""
    from hadar_slurm.sidecar.controller import StopClock

    stop = threading.Event()
    asked: list[float] = []

    def wake() -> bool:
        asked.append(time.monotonic())
        return len(asked) == 3

    clock = StopClock(stop, wake=wake, poll_s=0.05)
    t0 = time.monotonic()
    clock.sleep_until(time.time() + 30)
    took = time.monotonic() - t0
    assert len(asked) == 3 and took < 10  # three polls, not 30 s
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(asked))

    never = StopClock(stop, wake=lambda: False, poll_s=0.05)
    timer = threading.Timer(0.1, stop.set)
    timer.start()
    t0 = time.monotonic()
    never.sleep_until(time.time() + 30)
    assert time.monotonic() - t0 < 10 and stop.is_set()
    timer.join()

    stop.clear()
    plain = StopClock(stop, poll_s=0.05)
    t0 = time.monotonic()
    plain.sleep_until(time.time() + 0.2)
    assert time.monotonic() - t0 >= 0.19
    with pytest.raises(ValueError, match="poll_s must be positive"):
        StopClock(stop, poll_s=0)


def test_hadare_takes_its_consolidation_cost_from_the_config() -> None:
    """``[hadare] consolidation_base_s`` / ``consolidation_s_per_gb`` reach the policy that
    forks (e.g. a site with a faster link to the tracker, or the fidelity bench's compressed
    time); a policy that does not fork gets nothing; a bad value names its field."""
    from hadar_slurm.consolidation import ConsolidationCost
    from hadar_slurm.policy import make_policy
    from hadar_slurm.policy.hadare import HadarEPolicy
    from hadar_slurm.sidecar.controller import consolidation_setting

    base = default_config().with_overrides(policy="hadare")
    assert consolidation_setting(base) == {"consolidation": ConsolidationCost(2.0, 10.0)}
    fast = base.with_overrides(consolidation_base_s=0.5, consolidation_s_per_gb=1)
    policy = make_policy("hadare", **consolidation_setting(fast))
    assert isinstance(policy, HadarEPolicy)
    # ResNet-50: 102.4 MB, 0.1 GB (of 1,024 MB): 0.5 + 0.1 * 1 seconds a consolidation
    assert policy.consolidation.seconds("ResNet-50 (batch size 64)") == pytest.approx(0.6)
    assert consolidation_setting(base.with_overrides(policy="hadar")) == {}
    with pytest.raises(InputError, match=r"\[hadare\] consolidation_s_per_gb': must be a number"):
        base.with_overrides(consolidation_s_per_gb=-1)


def test_hadare_takes_pin_binding_from_the_config(tmp_path: Path, clean_logger: None) -> None:
    """``[hadare] pin_binding`` / ``pin_tolerance`` reach the policy that the sidecar builds;
    on by default, ``pin_binding = false`` turns it off; a policy that does not fork gets
    neither (as it gets none of ``[hadare]``'s consolidation settings); a tolerance out of
    [0, 1] names its field."""
    from hadar_slurm.policy.hadare import HadarEPolicy
    from hadar_slurm.sidecar.controller import Sidecar, pin_setting
    from tests.test_sidecar_backend import NODES, FakeSlurm

    c = parse("[scheduler]\npolicy = \"hadare\"\n[hadare]\npin_binding = false\n"
              "pin_tolerance = 0.1\n")
    assert (c.pin_binding, c.pin_tolerance) == (False, 0.1)
    assert pin_setting(c) == {"pin_binding": False, "pin_tolerance": 0.1}
    sidecar = Sidecar(c.with_overrides(state_dir=str(tmp_path / "state"), dry_run=True),
                      api=FakeSlurm([], NODES))
    try:
        policy = sidecar.policy
        assert isinstance(policy, HadarEPolicy)
        assert (policy.pin_binding, policy.pin_tolerance) == (False, 0.1)
    finally:
        sidecar.close()
    on = default_config().with_overrides(policy="hadare")
    assert (on.pin_binding, on.pin_tolerance) == (True, 0.05)
    assert pin_setting(on) == {"pin_binding": True, "pin_tolerance": 0.05}
    assert pin_setting(on.with_overrides(policy="hadar")) == {}
    assert pin_setting(c.with_overrides(policy="gavel-las")) == {}
    for bad in ("1.5", "-0.01", '"5%"', "true"):
        with pytest.raises(InputError, match=r"\[hadare\] pin_tolerance': must be a number "
                                             r"from 0 to 1"):
            parse(f"[hadare]\npin_tolerance = {bad}\n")
