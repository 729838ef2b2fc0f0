"""A user's forged progress report on the real dev cluster (issue #11, item 3): a hinted job's
script writes its own ``progress.json`` claiming 1e6 it/s for ResNet-50, a new round every
second; the sidecar (the real one, with a throughput store) reads it every epoch and must leave
the store's rate for that job type on the GPU type Slurm ran it on as it was, and plan with the
table's rate (``explain`` shows what the last epoch planned with)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from hadar_slurm.rates.store import ThroughputStore
from hadar_slurm.rates.table import default_table, load_table
from hadar_slurm.slurm import commands
from tests.slurm_cluster import jobs, submit
from tests.test_sidecar_cluster import NODE_TYPE, Workdir, work

__all__ = ["work"]  # the fixture, imported for pytest

REPO = Path(__file__).resolve().parent.parent
JOB_TYPE = "ResNet-50 (batch size 64)"

FORGER = """#!/bin/sh
# a user's job that writes its runtime's progress report itself: 1e6 it/s, a round a second
d="$PWD/.hadar-tracker/$SLURM_JOB_ID"
mkdir -p "$d"
r=1
while [ $r -le 60 ]; do
  r=$((r + 1))
  printf '{"format": 1, "done": %d, "work": 1000000000, "rounds": %d, "copies": 1, \
"copy_rates": [{"copy": 0, "gpu_type": null, "iters": 1000000, "seconds": 1.0, \
"iters_per_s": 1000000.0}], "complete": false, "run": "%s.0", "run_rounds": %d, \
"updated_at": %s}\\n' $((r * 1000000)) $r "$SLURM_JOB_ID" $r "$(date +%s)" > "$d/.p"
  mv "$d/.p" "$d/progress.json"
  sleep 1
done
"""


def test_a_forged_progress_report_does_not_reach_the_store_or_the_plan(work: Workdir) -> None:
    db = work.path / "throughputs.db"
    work.config.write_text(work.config.read_text().replace(
        "[sidecar]", f'throughput_db = "{db}"\n[sidecar]', 1))
    script = work.path / "forger.sh"
    script.write_text(FORGER)
    script.chmod(0o755)
    job_id = submit(
        work.cluster, script=str(script), job_name="forger", gres="gpu:1",
        comment="hadar: model=resnet50 bs=64 steps=1000000 preempt=checkpoint",
        output=str(work.path / "%j.out"), chdir=str(work.path))
    work.submitted.append(job_id)
    sidecar = work.start_sidecar()
    # wait until the sidecar has read a forged report (learn_rejected, or learned, in epoch N)
    # and has run two more epochs, which would have planned with what it learned
    deadline = time.monotonic() + 120
    while True:
        events = sidecar.events()
        seen = [k for k, e in enumerate(events)
                if e.get("event") in ("learn_rejected", "learned")]
        if seen and sum(e.get("event") == "epoch" for e in events[seen[0] + 1:]) >= 2:
            break
        assert time.monotonic() < deadline, events[-5:]
        assert sidecar.proc.poll() is None, events[-5:]
        time.sleep(0.5)
    explained = work.cli("explain", str(job_id), "--config", str(work.path / "sidecar-0.toml"))
    running = jobs(work.cluster)[job_id]
    assert running.state == "RUNNING", running
    work.cluster.runner.run(commands.scancel([job_id]), check=False)
    assert sidecar.stop() == 0
    gpu_type = NODE_TYPE[running.node_names[0]]

    events = sidecar.events()
    rejected = [e for e in events if e.get("event") == "learn_rejected"]
    assert len(rejected) == 1, rejected  # logged once for the job, though read every epoch
    assert rejected[0]["job"] == job_id and rejected[0]["gpu_type"] == gpu_type
    assert "prior" in str(rejected[0]["why"]), rejected
    assert [e for e in events if e.get("event") in ("learned", "learned_ignored")] == []
    assert not any("Traceback" in str(e) for e in events)
    # the store holds nothing learned, nothing of the report waits in it
    with ThroughputStore(db) as store:
        assert [e for e in store.entries() if e.source != "estimated"] == []
        assert store.get(JOB_TYPE, 1, gpu_type) is None
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM observation").fetchone()[0] == 0
    finally:
        conn.close()
    # what the last epoch planned with: the table's rate on that type, not a learned one
    table = default_table().merged(load_table(REPO / "slurm_conf" / "dev-throughputs.csv"))
    rate = table.rate(JOB_TYPE, 1, gpu_type)
    assert explained.returncode == 0, explained.stderr
    line = next((x for x in explained.stdout.splitlines() if x.startswith("throughput of")), "")
    assert f"{gpu_type} {rate:.3g} it/s" in line and "learned" not in line, explained.stdout
