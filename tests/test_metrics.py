"""The sidecar's Prometheus metrics, the [metrics] config section, and ``hadar-slurm report``.

Unit tests: the exposition text after epoch summaries built by hand, the HTTP endpoint on a
loopback port, the finish tracker's JCTs, the config checks, and the report drawn from a
synthetic log written with the sidecar's own logger (rotated files included).  The sidecar
itself is exercised on a real cluster in tests/test_metrics_cluster.py.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hadar_slurm.cli.main import main as cli_main
from hadar_slurm.cli.report import main as report_main
from hadar_slurm.cli.report import parse_duration
from hadar_slurm.errors import InputError
from hadar_slurm.logs import log_event, setup_logging
from hadar_slurm.sidecar.config import (
    default_config,
    is_loopback,
    parse_address,
    parse_config,
)
from hadar_slurm.sidecar.daily_report import build_report, html_text, load_report, log_files
from hadar_slurm.sidecar.metrics import (
    ERROR_KINDS,
    EpochSummary,
    FinishTracker,
    JobFinish,
    SidecarMetrics,
)
from hadar_slurm.slurm import SlurmJob
from hadar_slurm.slurm.parse import Gres

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"



def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text: (name, sorted labels) -> value."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def summary(epoch: int, **kw: object) -> EpochSummary:
    base: dict[str, object] = dict(
        epoch=epoch, start=1000.0 + 60 * epoch, duration_s=0.4, decision_s=0.02,
        jobs={"running": 2, "starting": 1, "waiting": 3, "unsteered": 0},
        gpus_busy={"v100": 3, "k80": 1}, gpus_total={"v100": 4, "k80": 2},
        gpus_hadar={"v100": 2, "k80": 1}, actions={"place": 1, "release": 1})
    base.update(kw)
    return EpochSummary(**base)  # type: ignore[arg-type]


# -- the registry ------------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_logger")
def test_exposition_after_two_epochs(tmp_path: Path) -> None:
    m = SidecarMetrics("hadar", dry_run=True, version="9.9")
    m.observe(summary(4))
    # epoch 5: k80 nodes gone, a fork and two places, job 7 completed, job 8 forgotten
    m.observe(summary(
        5, duration_s=2.0, decision_s=0.3, gpus_busy={"v100": 4}, gpus_total={"v100": 4},
        gpus_hadar={"v100": 4}, jobs={"running": 3, "waiting": 1},
        actions={"place": 2, "fork": 1, "record": 3},
        finished=(JobFinish(7, "COMPLETED", 100.0, 1000.0, 1060.0),
                  JobFinish(8, "GONE", 200.0, 1000.0, 1060.0))))
    log = setup_logging("json", str(tmp_path / "log"))
    log.addHandler(m.error_handler)
    log_event(log, "action_failed", logging.WARNING, job=3)
    log_event(log, "action_failed", logging.WARNING, job=4)
    log_event(log, "epoch", epoch=6)  # info: not an error
    log_event(log, "epoch_failed", logging.WARNING, error="slurmctld down")
    s = samples(m.exposition())
    assert s[("hadar_epochs_total", ())] == 2
    assert s[("hadar_last_epoch", ())] == 5
    assert s[("hadar_last_epoch_timestamp_seconds", ())] == 1300.0
    assert s[("hadar_epoch_duration_seconds_count", ())] == 2
    assert s[("hadar_epoch_duration_seconds_sum", ())] == pytest.approx(2.4)
    # 0.4 s falls in the 0.5 bucket, 2.0 s in the 2.5 bucket
    assert s[("hadar_epoch_duration_seconds_bucket", (("le", "0.5"),))] == 1
    assert s[("hadar_epoch_duration_seconds_bucket", (("le", "2.5"),))] == 2
    assert s[("hadar_decision_seconds_sum", ())] == pytest.approx(0.32)
    # the last epoch's job states; a state it did not report reads 0
    assert {k[1][0][1]: v for k, v in s.items() if k[0] == "hadar_jobs"} == {
        "running": 3, "starting": 0, "waiting": 1, "unsteered": 0}
    # the k80 type is gone: its gauges read 0 instead of keeping epoch 4's values
    assert s[("hadar_gpus_busy", (("gpu_type", "v100"),))] == 4
    assert s[("hadar_gpus_busy", (("gpu_type", "k80"),))] == 0
    assert s[("hadar_gpus_total", (("gpu_type", "k80"),))] == 0
    assert s[("hadar_gpus_hadar", (("gpu_type", "v100"),))] == 4
    # counters add up over the epochs: place 1 + 2, fork 1; placements = place + fork = 4
    assert s[("hadar_actions_total", (("action", "place"),))] == 3
    assert s[("hadar_actions_total", (("action", "fork"),))] == 1
    assert s[("hadar_actions_total", (("action", "release"),))] == 1
    assert s[("hadar_last_epoch_actions", ())] == 6
    assert s[("hadar_jobs_placed_total", ())] == 4
    assert s[("hadar_jobs_finished_total", (("state", "COMPLETED"),))] == 1
    assert s[("hadar_jobs_finished_total", (("state", "GONE"),))] == 1
    assert s[("hadar_errors_total", (("kind", "action_failed"),))] == 2
    assert s[("hadar_errors_total", (("kind", "epoch_failed"),))] == 1
    assert s[("hadar_errors_total", (("kind", "fork_failed"),))] == 0
    assert {k for k in ERROR_KINDS} <= {
        dict(k[1])["kind"] for k in s if k[0] == "hadar_errors_total"}
    assert s[("hadar_info", (("dry_run", "true"), ("policy", "hadar"), ("version", "9.9")))] == 1


def test_registries_are_independent() -> None:
    a, b = SidecarMetrics("hadar"), SidecarMetrics("fifo")
    a.observe(summary(0))
    a.observe(summary(1))
    b.observe(summary(0))
    assert samples(a.exposition())[("hadar_epochs_total", ())] == 2
    assert samples(b.exposition())[("hadar_epochs_total", ())] == 1
    assert 'policy="fifo"' not in a.exposition()


def test_summary_log_fields() -> None:
    s = summary(3, finished=(JobFinish(7, "COMPLETED", 100.0, 1000.0, 1060.0),),
                actions={"place": 2, "fork": 1, "hold": 4})
    fields = s.log_fields()
    assert fields["queue"] == 3 and fields["placements"] == 3
    assert fields["gpus_busy"] == {"v100": 3, "k80": 1}
    # ended between the reads at 1000 and 1060: at 1030 +- 30, submitted at 100
    assert fields["finished"] == [{"job": 7, "state": "COMPLETED", "submit": 100.0,
                                   "jct_s": 930.0, "jct_err_s": 30.0}]
    json.dumps(fields)  # JSON-ready


# -- the endpoint ------------------------------------------------------------------------------


def test_serves_metrics_on_a_free_loopback_port_then_stops() -> None:
    m = SidecarMetrics("hadar")
    address = m.start("127.0.0.1:0")
    try:
        assert m.port is not None and m.port > 0 and address == f"127.0.0.1:{m.port}"
        m.observe(summary(0))
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert samples(body)[("hadar_epochs_total", ())] == 1
        with pytest.raises(RuntimeError, match="already served"):
            m.start("127.0.0.1:0")
    finally:
        m.stop()
    m.stop()  # idempotent
    assert m.address == "" and m.port is None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{address}/metrics", timeout=2)


def test_port_in_use_is_an_input_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(InputError) as info:
            SidecarMetrics("hadar").start(f"127.0.0.1:{port}", source="cfg.toml")
    text = str(info.value)
    assert text.startswith("cfg.toml: field '[metrics] address': cannot serve metrics on")
    assert "choose a free port" in text


# -- job completion times ----------------------------------------------------------------------


def slurm_job(job_id: int, state: str, submit: int = 50, reason: str = "None") -> SlurmJob:
    return SlurmJob(
        job_id=job_id, name=f"j{job_id}", user="alice", state=state, state_flags=(),
        state_reason=reason, partition="gpu", nodes="", node_names=(),
        gres=(Gres("gpu", None, 1),), features="", comment="hadar: model=a3c steps=10",
        admin_comment="", priority=0, submit_time=submit, start_time=None,
        time_limit_min=None)


def test_finish_tracker() -> None:
    t = FinishTracker()
    # read at 100: jobs 1-4 are hadar jobs; job 9 already completed (never seen live: ignored)
    assert t.update({1: 50.0, 2: 60.0, 3: 70.0, 4: 80.0},
                    [slurm_job(9, "COMPLETED")], 100.0) == []
    # read at 160: 1 completed, 2 forgotten by Slurm, 3 held by its user (not a hadar job of
    # the snapshot, still pending: not finished), 4 requeued (Slurm moved its submit time)
    out = t.update({4: 150.0}, [slurm_job(1, "COMPLETED"),
                                slurm_job(3, "PENDING", reason="JobHeldUser"),
                                slurm_job(4, "PENDING", submit=150)], 160.0)
    assert out == [JobFinish(1, "COMPLETED", 50.0, 100.0, 160.0),
                   JobFinish(2, "GONE", 60.0, 100.0, 160.0)]
    assert out[0].jct_s == 80.0 and out[0].jct_err_s == 30.0  # ended at 130 +- 30
    assert t.tracked == 2
    # read at 220: 3 cancelled, 4 failed; 4's JCT counts from its first submission (80)
    out = t.update({}, [slurm_job(3, "CANCELLED"), slurm_job(4, "FAILED", submit=150)], 220.0)
    assert out == [JobFinish(3, "CANCELLED", 70.0, 100.0, 220.0),
                   JobFinish(4, "FAILED", 80.0, 160.0, 220.0)]
    assert t.tracked == 0
    assert t.update({}, [], 280.0) == []  # reported once


# -- [metrics] config --------------------------------------------------------------------------


def parse(text: str) -> object:
    return parse_config(text, "test.toml", Path("/etc/hadar-slurm"))


def test_metrics_defaults_serve_nothing() -> None:
    c = default_config()
    assert c.metrics_address == "" and c.metrics_allow_remote is False


@pytest.mark.parametrize("address", ["127.0.0.1:9810", "localhost:0", "[::1]:9810",
                                     " 127.0.0.2:65535 "])
def test_loopback_addresses_accepted(address: str) -> None:
    c = parse_config(f'[sidecar]\nstate_dir = "/s"\n[metrics]\naddress = "{address}"\n',
                     "t.toml", Path("/"))
    assert c.metrics_address == address.strip()


def test_remote_address_refused_unless_allowed() -> None:
    text = '[sidecar]\nstate_dir = "/s"\n[metrics]\naddress = "0.0.0.0:9810"\n'
    with pytest.raises(InputError) as info:
        parse(text)
    e = info.value
    assert (e.source, e.line, e.field) == ("test.toml", 4, "[metrics] address")
    assert "0.0.0.0 is not a loopback address" in e.problem
    assert e.fix is not None and "allow_remote = true" in e.fix and "127.0.0.1:9810" in e.fix
    c = parse_config(text + "allow_remote = true\n", "t.toml", Path("/"))
    assert (c.metrics_address, c.metrics_allow_remote) == ("0.0.0.0:9810", True)
    # a host name is not resolved: only localhost counts as loopback
    with pytest.raises(InputError, match="is not a loopback address"):
        parse('[metrics]\naddress = "metrics.example.org:9810"\n')
    with pytest.raises(InputError, match=r"field '\[metrics\] address'"):
        default_config().with_overrides(metrics_address="10.1.2.3:9810")
    assert default_config().with_overrides(
        metrics_address="10.1.2.3:9810", metrics_allow_remote=True).metrics_address


@pytest.mark.parametrize(("value", "expected"), [
    ('"9810"', "must be HOST:PORT"),
    ('"127.0.0.1"', "must be HOST:PORT"),
    ('":9810"', "must be HOST:PORT"),
    ('"127.0.0.1:70000"', "port 70000 is out of range"),
    ('"[1.2.3]:80"', "is not an IPv6 address"),
    ("9810", "must be HOST:PORT (a string), got 9810"),
])
def test_bad_metrics_address(value: str, expected: str) -> None:
    with pytest.raises(InputError) as info:
        parse(f"[metrics]\naddress = {value}\n")
    assert info.value.field == "[metrics] address" and info.value.line == 2
    assert expected in info.value.problem


def test_allow_remote_must_be_a_bool() -> None:
    with pytest.raises(InputError, match=r"\[metrics\] allow_remote.*true or false"):
        parse('[metrics]\nallow_remote = "yes"\n')


def test_address_helpers() -> None:
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address("node-1.cluster:80") == ("node-1.cluster", 80)
    assert is_loopback("127.8.0.1") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.0.0.1")


# -- the report --------------------------------------------------------------------------------

HOUR = 3600.0


def write_log(path: Path, now: float) -> None:
    """A sidecar's log with the sidecar's own logger: a start, then 20 epochs 6 minutes apart
    over the last two hours (v100: 4 GPUs, k = 0..19 busy k % 5; k80: 2 GPUs, busy 1; queue
    10 - k // 2), jobs 100..103 finishing in epochs 5..8 (JCTs 600, 1200, 1800, 2400 s; 103
    failed), warnings; plus an epoch 30 hours ago with a finished job (outside a 24 h window).
    Then rotated as logrotate would: the oldest lines gzipped, the middle ones in FILE.1."""
    log = setup_logging("json", str(path))
    old = now - 30 * HOUR
    log_event(log, "start", policy="fifo", epoch_seconds=360.0)
    log_event(log, "epoch", epoch=0, epoch_start=old, queue=50, gpus_busy={"v100": 4},
              gpus_total={"v100": 4}, placements=9,
              finished=[{"job": 99, "state": "COMPLETED", "submit": old - 60, "jct_s": 60.0,
                         "jct_err_s": 1.0}])
    log_event(log, "start", policy="hadar", epoch_seconds=360.0)
    t0 = now - 2 * HOUR
    for k in range(20):
        t = t0 + 360 * k
        finished = []
        if 5 <= k <= 8:
            jct = 600.0 * (k - 4)
            finished.append({"job": 95 + k, "state": "FAILED" if k == 8 else "COMPLETED",
                             "submit": t - jct, "jct_s": jct, "jct_err_s": 180.0})
        log_event(log, "epoch", epoch=k + 1, epoch_start=t, duration_s=0.5 + k / 100,
                  decide_s=0.01, queue=10 - k // 2, placements=1,
                  gpus_busy={"v100": k % 5, "k80": 1}, gpus_total={"v100": 4, "k80": 2},
                  finished=finished)
        if k == 3:
            log_event(log, "action_failed", logging.WARNING, job=5, error="timeout")
    for h in list(log.handlers):
        h.flush()
    # events without an epoch_start are placed in time by their ts: set it as if logged then
    when = iter([old - 10, t0 - 10, t0 + 360 * 3 + 1])
    lines = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] in ("start", "action_failed"):
            event["ts"] = datetime.fromtimestamp(next(when), UTC).strftime(
                "%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        lines.append(json.dumps(event) + "\n")
    with gzip.open(path.with_name(path.name + ".2.gz"), "wt") as f:
        f.writelines(lines[:3])
    path.with_name(path.name + ".1").write_text("".join(lines[3:12]))
    path.write_text("".join(lines[12:]))
    # not a rotated file of this log: never read
    path.with_name(path.name + ".bak").write_text(lines[5])
    path.with_name("other.log.1").write_text(lines[5])


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.usefixtures("clean_logger")
def test_report_of_a_rotated_log(tmp_path: Path) -> None:
    log = tmp_path / "sidecar.log"
    now = time.time()
    write_log(log, now)
    assert [p.name for p in log_files(log)] == ["sidecar.log", "sidecar.log.1",
                                                "sidecar.log.2.gz"]
    report = load_report(log, 24 * HOUR, now)
    assert len(report.epochs) == 20 and report.epochs[0].epoch == 1
    assert [p.queue for p in report.epochs][:4] == [10, 10, 9, 9]
    assert report.policies == ("hadar",) and report.starts == 1  # fifo's start is 30 h old
    assert [(f.job, f.state, f.jct_s) for f in report.finished] == [
        (100, "COMPLETED", 600.0), (101, "COMPLETED", 1200.0), (102, "COMPLETED", 1800.0),
        (103, "FAILED", 2400.0)]
    rows = dict(report.summary())
    assert rows["epochs"].startswith("20 ")
    assert rows["placements"] == "20"
    assert rows["queue length"] == "mean 5.5, max 10"  # (10+10+9+...+1+1) / 20
    # v100 busy k % 5 over k = 0..19: mean 2 of 4
    assert rows["GPUs busy, v100"] == "mean 2 of 4 (50%)"
    assert rows["GPUs busy, k80"] == "mean 1 of 2 (50%)"
    assert rows["jobs finished"] == "3 COMPLETED, 1 FAILED"
    # the completed ones: 600, 1200, 1800 s
    assert rows["JCT of completed jobs"] == "mean 20.0 min, median 20.0 min, p95 29.0 min"
    assert rows["warnings/errors"] == "1 action_failed"
    # a week's window takes the old epoch (and its finished job 99) in as well
    week = load_report(log, 7 * 24 * HOUR, now)
    assert len(week.epochs) == 21 and week.finished[0].job == 99 and week.starts == 2


@pytest.mark.usefixtures("clean_logger")
def test_report_cli_writes_png_and_html(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "sidecar.log"
    write_log(log, time.time())
    png = tmp_path / "out" / "report.png"
    assert report_main(["--log", str(log), "--out", str(png)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {png} (20 epochs, 4 jobs finished)"
    width, height = png_size(png.read_bytes())
    assert (width, height) == (900, 1000)  # 9 x 10 inches at 100 dpi
    page = tmp_path / "report.html"
    # the same through the main command line: hadar-slurm report
    assert cli_main(["report", "--log", str(log), "--since", "3h", "--out", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "</html>" in text
    assert "<tr><th>jobs finished</th><td>3 COMPLETED, 1 FAILED</td></tr>" in text
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert m is not None
    assert png_size(base64.b64decode(m.group(1))) == (900, 1000)


@pytest.mark.usefixtures("clean_logger")
def test_report_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "sidecar.log"
    now = time.time()
    write_log(log, now)
    # the last epoch is 6 minutes old: a 3-minute window 5 minutes from now has none
    with pytest.raises(InputError) as info:
        load_report(log, 180.0, now + 300)
    e = info.value
    assert e.field == "--since" and e.source == str(log)
    assert "no epoch in the window" in e.problem and "its last epoch is at" in e.problem
    assert report_main(["--log", str(log), "--since", "1m"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hadar-slurm: error: ")
    assert "no epoch in the window" in err
    assert report_main(["--log", str(tmp_path / "none.log")]) == 2
    assert "none.log: no such log file" in capsys.readouterr().err
    assert report_main(["--log", str(log), "--out", str(tmp_path / "r.pdf")]) == 2
    assert "field '--out': unknown report format '.pdf'" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text("[sidecar]\nstate_dir = \"/s\"\nlog_format = \"json\"\n")
    assert report_main(["--config", str(cfg)]) == 2
    assert "field '[sidecar] log_file'" in capsys.readouterr().err
    cfg.write_text(f'[sidecar]\nstate_dir = "/s"\nlog_format = "text"\nlog_file = "{log}"\n')
    assert report_main(["--config", str(cfg)]) == 2
    assert "field '[sidecar] log_format'" in capsys.readouterr().err
    cfg.write_text(f'[sidecar]\nstate_dir = "/s"\nlog_file = "{log}"\n')
    out = tmp_path / "via-config.png"
    assert report_main(["--config", str(cfg), "--out", str(out)]) == 0
    assert png_size(out.read_bytes())[0] == 900


def test_report_of_epochs_before_the_metrics_fields() -> None:
    # epoch lines of an older sidecar: no queue, no GPU counts; still a report (empty panels)
    events = [{"ts": "2026-11-22T10:00:00.000Z", "level": "info", "event": "epoch",
               "epoch": 1, "jobs": 3, "placed": 2}]
    start = 1795341600.0 - 60  # 2026-11-22T10:00:00Z minus a minute
    report = build_report(events, start, start + 120)
    assert len(report.epochs) == 1 and report.epochs[0].queue is None
    assert report.gpu_types == [] and dict(report.summary())["jobs finished"] == "0"


def test_report_shows_each_tuning_study_rung_by_rung() -> None:
    # the study events of a sidecar's log (hadar_slurm/sidecar/studies.py): an sh study of 4
    # trials, 2 rungs, eta 2 (2 -> 1), read from the events alone
    def ev(second: int, event: str, **kw: object) -> dict[str, object]:
        return {"ts": f"2026-11-22T10:00:{second:02d}.000Z", "level": "info", "event": event,
                "study": "lr", "array": 41, **kw}

    events = [ev(0, "study_seen", rule="sh", rungs=2, eta=2, mode="max")]
    for task, value in enumerate((0.5, 0.7, 0.6, 0.4)):
        events.append(ev(1 + task, "trial_report", task=task, rung=0, value=value))
    events += [ev(6, "trial_verdict", task=0, rung=0, verdict="wait"),
               ev(7, "trial_verdict", task=0, rung=0, verdict="stop")]
    events += [ev(7, "trial_verdict", task=t, rung=0, verdict=v)
               for t, v in ((1, "go"), (2, "go"), (3, "stop"))]
    events += [ev(9, "trial_report", task=1, rung=1, value=0.9),
               ev(9, "trial_report", task=2, rung=1, value=0.8),
               ev(9, "trial_verdict", task=1, rung=1, verdict="done"),
               ev(9, "trial_verdict", task=2, rung=1, verdict="done"),
               ev(10, "study_done", best_task=1, best=0.9, seconds=10.0)]
    start = 1795341600.0 - 60  # 2026-11-22T10:00:00Z minus a minute
    report = build_report(events, start, start + 120)
    (study,) = report.studies
    assert study.row() == (
        "lr (array 41)", "sh, 2 rungs",
        "rung 0: 4 reported, 2 stopped, 2 went on, best 0.7; "
        "rung 1: 2 reported, 2 done, best 0.9", "ended after 10 s; best trial 1 (0.9)")
    assert dict(report.summary())["tuning studies"] == "1 (1 ended)"
    page = html_text(report, png=PNG_MAGIC)
    assert "<h2>Tuning studies</h2>" in page and "best trial 1 (0.9)" in page


@pytest.mark.parametrize(("text", "seconds"), [
    ("24h", 86400.0), ("90m", 5400.0), ("2d", 172800.0), ("3600", 3600.0), ("1.5H", 5400.0),
    ("30s", 30.0)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-1h", "h", "1w", "", "1 day"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(InputError, match="field '--since'"):
        parse_duration(text)
