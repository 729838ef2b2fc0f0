"""Safe state on the real dev cluster (issue #11, item 4): a second real sidecar on the same
state_dir, a configured sidecar whose throughput store is damaged, and a hung slurmctld
(``kill -STOP``), each against a real ``hadar-slurm run`` process.

The cluster is the session's (shared by every cluster test module): the hung slurmctld is always
continued (``kill -CONT``, in a ``finally``) and answers again before the test ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from hadar_slurm.rates.store import ThroughputStore
from hadar_slurm.rates.store_recovery import DAMAGED_SUFFIX
from tests.test_sidecar_cluster import Sidecar, Workdir, work

__all__ = ["work"]  # the fixture, imported for pytest

REPO = Path(__file__).resolve().parent.parent


def wait_for(sidecar: Sidecar, what: Callable[[list[dict[str, object]]], bool],
             timeout: float) -> list[dict[str, object]]:
    """Poll the sidecar's log until ``what(events)``; fail when it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        events = sidecar.events()
        if what(events):
            return events
        if sidecar.proc.poll() is not None:
            out = sidecar.proc.stdout.read() if sidecar.proc.stdout else ""
            raise AssertionError(f"sidecar exited {sidecar.proc.returncode}: {out[-2000:]}")
        assert time.monotonic() < deadline, f"not seen after {timeout:g} s: {events[-5:]}"
        time.sleep(0.3)


def named(events: list[dict[str, object]], name: str) -> list[dict[str, object]]:
    return [e for e in events if e.get("event") == name]


def test_second_sidecar_on_the_same_state_dir_is_refused(work: Workdir) -> None:
    """Issue #11: a second sidecar (even --dry-run) on the same state_dir ran unchecked and
    overwrote state.json."""
    first = work.start_sidecar()
    wait_for(first, lambda ev: bool(named(ev, "epoch")), 60)
    second = work.start_sidecar("--dry-run", "--once")
    assert second.proc.wait(timeout=60) == 2
    out = second.proc.stdout.read() if second.proc.stdout else ""
    assert out.count("\n") == 1 and "Traceback" not in out, out
    assert out.startswith("hadar-slurm: error: ") and "field '[sidecar] state_dir'" in out, out
    assert f"another sidecar (pid {first.proc.pid}" in out and str(work.state_dir) in out, out
    assert "stop that sidecar first" in out
    assert not named(second.events(), "start")  # it never began
    assert first.proc.poll() is None
    # beside it, a dry run with a state_dir of its own runs
    own = work.start_sidecar("--dry-run", "--once", "--state-dir", str(work.path / "shadow"))
    assert own.proc.wait(timeout=60) == 0, own.proc.stdout.read() if own.proc.stdout else ""
    assert (work.path / "shadow" / "state.json").exists()
    # killed with SIGKILL, the holder does not block its successor
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=30)
    after = work.start_sidecar("--once")
    assert after.proc.wait(timeout=60) == 0, after.proc.stdout.read() if after.proc.stdout else ""
    assert named(after.events(), "epoch")


def test_damaged_store_of_a_configured_sidecar_is_recovered_at_start(work: Workdir) -> None:
    """Issue #11: a damaged store (database disk image is malformed) made every start exit
    with a traceback."""
    db = work.state_dir / "throughputs.db"
    with ThroughputStore(db) as store:
        for k in range(300):
            store.record(f"model {k} (batch size 8)", 1, "v100", 1.0 + k)
    data = db.read_bytes()
    data = data[:4096] + b"\x13" * (len(data) - 4096)  # the header survives, the tables do not
    db.write_bytes(data)
    listed = work.cli("throughputs", "list", "--db", str(db))
    assert listed.returncode == 2 and listed.stderr.count("\n") == 1, listed.stderr
    assert "field '[scheduler] throughput_db': the throughput store is damaged" in listed.stderr
    sidecar = work.start_sidecar("--once")
    assert sidecar.proc.wait(timeout=90) == 0, (
        sidecar.proc.stdout.read() if sidecar.proc.stdout else "")
    events = sidecar.events()
    recovered = named(events, "store_recovered")
    assert len(recovered) == 1 and recovered[0]["level"] == "warning", events
    kept = Path(str(recovered[0]["kept"]))
    assert kept.name.startswith(f"throughputs.db{DAMAGED_SUFFIX}") and kept.read_bytes() == data
    assert named(events, "epoch")
    # the fresh store holds the config's table (slurm_conf/dev-throughputs.csv), imported
    with ThroughputStore(db) as store:
        imported = store.entries("imported")
    assert imported and {e.gpu_type for e in imported} == {"a100"}


def slurmctld_pid(work: Workdir) -> int:
    pid = int((work.cluster.dir / "run" / "slurmctld.bgpid").read_text().strip())
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    return pid


def scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(hadar_slurm_unreachable|hadar_slurm_outages_total) (\S+)$", text, re.M)}


def test_hung_slurmctld_is_slurm_unreachable(work: Workdir) -> None:
    """Issue #11: a hung slurmctld showed as epoch_failed (Unspecified error) with no
    unreachable event.  slurmctld is stopped (SIGSTOP) after the first epoch: each epoch's read
    times out ([slurm] command_timeout_s = 2), a slurm_unreachable warning per epoch with the
    time it has been unreachable, the gauge reads 1; continued, it answers again: a
    slurm_reachable event, epochs go on, the gauge reads 0."""
    work.config.write_text(work.config.read_text().replace(
        "[scheduler]", "command_timeout_s = 2\n[scheduler]", 1) + (
        '[metrics]\naddress = "127.0.0.1:0"\n'))
    sidecar = work.start_sidecar()
    events = wait_for(sidecar, lambda ev: bool(named(ev, "epoch")), 60)
    address = str(named(events, "start")[0]["metrics"])
    assert scrape(address) == {"hadar_slurm_unreachable": 0.0, "hadar_slurm_outages_total": 0.0}
    pid = slurmctld_pid(work)
    os.kill(pid, signal.SIGSTOP)
    try:
        events = wait_for(sidecar, lambda ev: len(named(ev, "slurm_unreachable")) >= 2, 90)
        down = scrape(address)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert down == {"hadar_slurm_unreachable": 1.0, "hadar_slurm_outages_total": 1.0}
    unreachable = named(events, "slurm_unreachable")
    assert all(e["level"] == "warning" and "timed out after 2 s" in str(e["error"])
               for e in unreachable), unreachable
    assert float(str(unreachable[1]["unreachable_s"])) > float(
        str(unreachable[0]["unreachable_s"]))
    first_down = events.index(unreachable[0])
    events = wait_for(sidecar, lambda ev: any(
        e.get("event") == "epoch" for e in ev[ev.index(named(ev, "slurm_reachable")[0]):])
        if named(ev, "slurm_reachable") else False, 120)
    assert not [e for e in events[first_down:] if e.get("event") == "epoch_failed"], events
    back = named(events, "slurm_reachable")
    assert len(back) == 1 and float(str(back[0]["unreachable_s"])) > 0
    assert scrape(address) == {"hadar_slurm_unreachable": 0.0, "hadar_slurm_outages_total": 1.0}
    assert sidecar.stop() == 0
    ping = subprocess.run(["scontrol", "ping"], env=work.env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert "is UP" in ping.stdout, ping  # the shared cluster is left as it was found
