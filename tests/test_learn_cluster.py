"""Online learning on the real dev cluster: a hinted job trains examples/digits_train.py through
the runtime, unforked; the sidecar reads the rounds its runtime commits, folds the achieved rate
into the throughput store (the config's ``throughput_db``), plans the next epochs with it, and
``explain`` says the rate is learned."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hadar_slurm.store import ThroughputStore
from tests.slurm_cluster import submit
from tests.test_sidecar_cluster import NODE_TYPE, Workdir, wait_all, work

pytest.importorskip("torch")
pytest.importorskip("sklearn")

__all__ = ["work"]  # the fixture, imported for pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "digits_train.py"
JOB_TYPE = "ResNet-18 (batch size 32)"


def test_sidecar_learns_a_running_jobs_rate_and_uses_it(work: Workdir) -> None:
    db = work.path / "throughputs.db"
    work.config.write_text(work.config.read_text().replace(
        "[sidecar]", f'throughput_db = "{db}"\n[sidecar]', 1))
    script = work.path / "train.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={REPO} OMP_NUM_THREADS=1\n"
        f'exec {sys.executable} {EXAMPLE} --steps "$1" --round-iters "$2" --threads 1\n')
    script.chmod(0o755)
    steps = 40_000
    job_id = submit(
        work.cluster, script=str(script), job_name="learn", gres="gpu:1",
        comment=f"hadar: model=resnet18 bs=32 steps={steps}", output=str(work.path / "%j.out"),
        chdir=str(work.path), script_args=[str(steps), "2000"])
    work.submitted.append(job_id)
    sidecar = work.start_sidecar()
    # Wait until the sidecar has learned from the job (while reading Slurm in epoch N: the
    # epoch line of N follows) and then run epoch N+1, which planned with the learned rate;
    # explain shows the last epoch's state.
    deadline = time.monotonic() + 180
    while True:
        events = sidecar.events()
        seen = [k for k, e in enumerate(events) if e.get("event") == "learned"]
        if seen and sum(e.get("event") == "epoch" for e in events[seen[0] + 1:]) >= 2:
            break
        assert time.monotonic() < deadline, events[-5:]
        assert sidecar.proc.poll() is None, events[-5:]
        time.sleep(0.5)
    explained = work.cli("explain", str(job_id), "--config", str(work.path / "sidecar-0.toml"))
    final = wait_all(work.cluster, [job_id], timeout=240, sidecars=[sidecar])
    assert sidecar.stop() == 0
    job = final[job_id]
    assert job.state == "COMPLETED", (job, (work.path / f"{job_id}.out").read_text())
    gpu_type = NODE_TYPE[job.node_names[0]]

    # what the runtime measured, round by round (history.jsonl), against what was learned
    tracker = work.path / ".hadar-tracker" / str(job_id)
    history = [json.loads(x) for x in (tracker / "history.jsonl").read_text().splitlines()]
    rates = sorted(x["iters"][0] / x["seconds"][0] for x in history[1:])  # round 1: warm-up
    learned = [e for e in sidecar.events() if e.get("event") == "learned"]
    assert {e["job"] for e in learned} == {job_id}
    assert {e["gpu_type"] for e in learned} == {gpu_type}
    assert all(e["job_type"] == JOB_TYPE and e["gpus"] == 1 for e in learned)
    with ThroughputStore(db) as store:
        entry = store.get(JOB_TYPE, 1, gpu_type)
    assert entry is not None and entry.source == "learned", entry
    assert entry.samples == len(learned) <= len(history) - 1
    assert rates[0] <= entry.rate <= rates[-1]  # a robust statistic of the observed rounds
    # explain (run after an epoch that planned with it) shows the learned rate, marked
    assert explained.returncode == 0, explained.stderr
    line = next(x for x in explained.stdout.splitlines() if x.startswith("throughput of"))
    assert f"{gpu_type} " in line and "learned" in line, explained.stdout
