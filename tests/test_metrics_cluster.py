"""The sidecar's Prometheus endpoint and ``hadar-slurm report``, on the real dev cluster.

The sidecar runs as its own process (3-second epochs, tests/test_sidecar_cluster.py's
fixture) with ``[metrics] address = "127.0.0.1:0"``: the kernel picks a free loopback port,
which the sidecar logs in its start event.  The test scrapes ``/metrics`` with urllib while
the sidecar runs and checks the counters against what the sidecar logged; then it draws the
report from the sidecar's log.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hadar_slurm import __version__
from tests.slurm_cluster import nodes_conf
from tests.test_sidecar_cluster import Sidecar, Workdir, wait_all, work  # noqa: F401 (fixture)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# (name, hints, GPUs, seconds of work)
JOBS = [
    ("m-rn50", "model=resnet50 bs=64 steps=40000", 1, 6),
    ("m-rec", "model=recommendation bs=512 steps=9000", 1, 4),
    ("m-lm", "model=lm bs=20 steps=50000", 1, 4),
    ("m-rn18", "model=resnet18 bs=128 steps=30000", 2, 4),
]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metrics_address(sidecar: Sidecar) -> str:
    end = time.monotonic() + 60
    while True:
        start = [e for e in sidecar.events() if e.get("event") == "start"]
        if start:
            return str(start[0]["metrics"])
        assert time.monotonic() < end and sidecar.proc.poll() is None, sidecar.events()
        time.sleep(0.2)


def steady_scrape(address: str, until: float) -> Samples:
    """A scrape taken between two epochs: two scrapes in a row with the same epoch count and
    last epoch (an epoch's log line is written before its metrics are updated, so every
    epoch counted is in the log by then)."""
    last = scrape(address)
    while True:
        time.sleep(0.3)
        now = scrape(address)
        keys = [("hadar_epochs_total", ()), ("hadar_last_epoch", ())]
        if [now.get(k) for k in keys] == [last.get(k) for k in keys]:
            return now
        assert time.monotonic() < until, "the epochs never paused"
        last = now


def list_of(value: object) -> list[dict[str, object]]:
    assert isinstance(value, list)
    return value


def logged_up_to(events: list[dict[str, object]], last_epoch: int) -> tuple[
        list[dict[str, object]], list[dict[str, object]]]:
    """The epoch lines and the placing actions logged for epochs up to ``last_epoch``."""
    epochs = [e for e in events if e.get("event") == "epoch"
              and int(str(e["epoch"])) <= last_epoch]
    places = [e for e in events if e.get("event") == "action"
              and e.get("action") in ("place", "fork") and int(str(e["epoch"])) <= last_epoch]
    return epochs, places


def check_against_log(s: Samples, events: list[dict[str, object]]) -> int:
    """The counters of a steady scrape match the log; returns the last epoch."""
    last = int(s[("hadar_last_epoch", ())])
    epochs, places = logged_up_to(events, last)
    assert s[("hadar_epochs_total", ())] == len(epochs) > 0
    assert [int(str(e["epoch"])) for e in epochs] == list(range(last - len(epochs) + 1,
                                                               last + 1))
    assert s[("hadar_jobs_placed_total", ())] == len(places)
    assert sum(int(str(e["placements"])) for e in epochs) == len(places)
    assert s[("hadar_epoch_duration_seconds_count", ())] == len(epochs)
    assert s[("hadar_decision_seconds_count", ())] == len(epochs)
    # the gauges are the last epoch's
    final = epochs[-1]
    states = final["job_states"]
    assert isinstance(states, Mapping)
    for state, n in states.items():
        assert s[("hadar_jobs", (("state", str(state)),))] == n
    assert final["queue"] == states["waiting"]
    busy = final["gpus_busy"]
    assert isinstance(busy, Mapping)
    for gpu_type, n in busy.items():
        assert s[("hadar_gpus_busy", (("gpu_type", str(gpu_type)),))] == n
    return last


def test_metrics_endpoint_and_report_on_the_dev_cluster(work: Workdir) -> None:  # noqa: F811
    work.config.write_text(work.config.read_text() + '[metrics]\naddress = "127.0.0.1:0"\n')
    ids = {work.submit(name, secs, hints=f"hadar: {h}", gres=f"gpu:{g}"): (name, secs)
           for name, h, g, secs in JOBS}
    sidecar = work.start_sidecar()
    address = metrics_address(sidecar)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", address) and not address.endswith(":0"), address

    # while it runs: wait for a placement, then compare a steady scrape with the log
    end = time.monotonic() + 90
    while scrape(address).get(("hadar_jobs_placed_total", ()), 0) < 1:
        assert time.monotonic() < end and sidecar.proc.poll() is None
        time.sleep(0.3)
    s = steady_scrape(address, end)
    check_against_log(s, sidecar.events())
    assert s[("hadar_info", (("dry_run", "false"), ("policy", "hadar"),
                             ("version", __version__)))] == 1
    totals: dict[str, int] = {}
    for gpu_type, gpus in nodes_conf().values():
        totals[gpu_type] = totals.get(gpu_type, 0) + gpus
    for gpu_type, gpus in totals.items():
        assert s[("hadar_gpus_total", (("gpu_type", gpu_type),))] == gpus

    # every job completes; the sidecar sees each finish in a later epoch
    final = wait_all(work.cluster, list(ids), timeout=180, sidecars=[sidecar])
    assert all(final[j].state == "COMPLETED" for j in ids), final
    end = time.monotonic() + 60
    key = ("hadar_jobs_finished_total", (("state", "COMPLETED"),))
    while scrape(address).get(key, 0) < len(ids):
        assert time.monotonic() < end and sidecar.proc.poll() is None, sidecar.events()[-3:]
        time.sleep(0.5)
    s = steady_scrape(address, time.monotonic() + 30)
    events = sidecar.events()
    last = check_against_log(s, events)
    epochs, places = logged_up_to(events, last)
    assert {int(str(e["job"])) for e in places} == set(ids)  # each placed (at least once)
    finished = {int(str(f["job"])): f for e in epochs for f in list_of(e["finished"])}
    assert set(finished) == set(ids) and s[key] == len(ids)
    for j, (name, secs) in ids.items():
        f = finished[j]
        assert f["state"] == "COMPLETED"
        # the JCT covers at least the job's work; it is known within half an epoch or so
        assert float(str(f["jct_s"])) + float(str(f["jct_err_s"])) >= secs, (name, f)
        assert float(str(f["jct_err_s"])) <= 10, (name, f)
    assert s[("hadar_errors_total", (("kind", "epoch_failed"),))] == 0

    assert sidecar.stop() == 0
    stop = [e for e in sidecar.events() if e.get("event") == "stop"]
    assert stop
    try:
        urllib.request.urlopen(f"http://{address}/metrics", timeout=2)
        raise AssertionError("the endpoint still serves after the sidecar stopped")
    except urllib.error.URLError:
        pass

    # the report of the sidecar's log: hadar-slurm report, as an admin runs it
    logged = [e for e in sidecar.events() if e.get("event") == "epoch"]
    png = work.path / "report.png"
    out = work.cli("report", "--log", str(sidecar.log), "--since", "1h", "--out", str(png))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"report: {png} ({len(logged)} epochs, {len(ids)} jobs finished)")
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    page = work.path / "report.html"
    config = work.path / "sidecar-0.toml"  # the running sidecar's config names its log
    out = work.cli("report", "--config", str(config), "--out", str(page))
    assert out.returncode == 0, out.stderr
    text = Path(page).read_text()
    assert f"<tr><th>jobs finished</th><td>{len(ids)} COMPLETED</td></tr>" in text
    all_places = logged_up_to(sidecar.events(), 1 << 62)[1]
    assert f"<tr><th>placements</th><td>{len(all_places)}</td></tr>" in text
