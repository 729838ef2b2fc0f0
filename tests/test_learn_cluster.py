"""Online learning on the real dev cluster: two hinted jobs train examples/digits_train.py
through the runtime, unforked; the sidecar reads the rounds their runtime commits, checks each
against what Slurm says of the job (node, GPU type, run time) and the prior, folds the achieved
rates into the throughput store (the config's ``throughput_db``) and, once two jobs have
reported (one job alone never sets a rate: tests/test_learn_trust.py), plans the next epochs
with the learned rate; ``explain`` says the rate is learned.

The prior (the rate the table gives) has to be near what a job achieves, or its reports are
refused as implausible; the digits model on this machine's CPU is far from any GPU's ResNet-18,
so the test first measures the example here (the runtime's own history of rounds) and gives the
sidecar that rate as the table's, on the ``a100`` nodes (the others get a tenth of it, so the
policy puts both jobs on the same GPU type)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hadar_slurm.rates.store import LEARN_WINDOW, ThroughputStore
from tests.slurm_cluster import submit
from tests.test_sidecar_cluster import NODE_TYPE, Workdir, wait_all, work

pytest.importorskip("torch")
pytest.importorskip("sklearn")

__all__ = ["work"]  # the fixture, imported for pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "digits_train.py"
JOB_TYPE = "ResNet-18 (batch size 32)"
GPU_TYPE = "a100"


def calibrate(where: Path) -> float:
    """The example's rate (iterations/s) on this machine, from the runtime's history of a short
    run outside Slurm (the first round, warm-up, left out)."""
    where.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_JOB_ID", None)
    subprocess.run([sys.executable, str(EXAMPLE), "--steps", "3000", "--round-iters", "1000",
                    "--threads", "1"], cwd=where, env=env, check=True, timeout=300,
                   stdout=subprocess.DEVNULL)
    [history] = where.glob(".hadar-tracker/*/history.jsonl")
    rounds = [json.loads(x) for x in history.read_text().splitlines()][1:]
    return float(statistics.median(x["iters"][0] / x["seconds"][0] for x in rounds))


def test_sidecar_learns_running_jobs_rate_and_uses_it(work: Workdir) -> None:
    prior = calibrate(work.path / "calibrate")
    rates = work.path / "prior.csv"
    rates.write_text("job_type,scale_factor,gpu_type,steps_per_second\n" + "".join(
        f'"{JOB_TYPE}",1,{t},{prior if t == GPU_TYPE else prior / 10}\n'
        for t in sorted(set(NODE_TYPE.values()))))
    db = work.path / "throughputs.db"
    config = work.config.read_text().replace(
        "[sidecar]", f'throughput_db = "{db}"\n[sidecar]', 1)
    config = config.replace('dev-throughputs.csv"]', f'dev-throughputs.csv", "{rates}"]', 1)
    assert str(rates) in config
    work.config.write_text(config)
    script = work.path / "train.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={REPO} OMP_NUM_THREADS=1\n"
        f'exec {sys.executable} {EXAMPLE} --steps "$1" --round-iters "$2" --threads 1\n')
    script.chmod(0o755)
    # about 25 s of training whatever this machine's speed (at least 40,000 steps), so that
    # both jobs still run when the sidecar has learned their rate and planned two epochs with
    # it (at 6,400 it/s, 40,000 steps ended before the second of those epochs)
    steps = max(40_000, 2000 * round(prior * 25 / 2000))
    job_ids = []
    for k in range(2):
        job_ids.append(submit(
            work.cluster, script=str(script), job_name=f"learn{k}", gres="gpu:1",
            comment=f"hadar: model=resnet18 bs=32 steps={steps} preempt=checkpoint",
            output=str(work.path / "%j.out"), chdir=str(work.path),
            script_args=[str(steps), "2000"]))
        work.submitted.append(job_ids[-1])
    sidecar = work.start_sidecar()
    # Wait until the sidecar has learned a rate from both jobs (while reading Slurm in epoch
    # N: the epoch line of N follows) and then run epoch N+1, which planned with the learned
    # rate; explain shows the last epoch's state.
    deadline = time.monotonic() + 180
    while True:
        events = sidecar.events()
        seen = [k for k, e in enumerate(events)
                if e.get("event") == "learned" and e.get("applied")]
        if seen and sum(e.get("event") == "epoch" for e in events[seen[0] + 1:]) >= 2:
            break
        assert time.monotonic() < deadline, events[-5:]
        assert sidecar.proc.poll() is None, events[-5:]
        time.sleep(0.5)
    explained = work.cli("explain", str(job_ids[0]),
                         "--config", str(work.path / "sidecar-0.toml"))
    final = wait_all(work.cluster, job_ids, timeout=240, sidecars=[sidecar])
    assert sidecar.stop() == 0
    for job_id in job_ids:
        job = final[job_id]
        assert job.state == "COMPLETED", (job, (work.path / f"{job_id}.out").read_text())
        assert NODE_TYPE[job.node_names[0]] == GPU_TYPE, job

    events = sidecar.events()
    assert [e for e in events if e.get("event") == "learn_rejected"] == []
    learned = [e for e in events if e.get("event") == "learned"]
    assert {e["job"] for e in learned} == set(job_ids)
    assert {e["gpu_type"] for e in learned} == {GPU_TYPE}
    assert all(e["job_type"] == JOB_TYPE and e["gpus"] == 1 for e in learned)
    # what each job's runtime measured, round by round (history.jsonl), against what was learned
    observed = {}
    for job_id in job_ids:
        tracker = work.path / ".hadar-tracker" / str(job_id)
        history = [json.loads(x) for x in (tracker / "history.jsonl").read_text().splitlines()]
        rounds = {round(x["iters"][0] / x["seconds"][0], 4) for x in history[1:]}  # 1: warm-up
        mine = [float(str(e["observed"])) for e in learned if e["job"] == job_id]
        assert set(mine) <= rounds  # each observation is a round the runtime committed
    # The store decides over its window, the key's last LEARN_WINDOW observations: two jobs of
    # 20 rounds each overflow it, and the earliest rounds no longer vote.
    window = learned[-LEARN_WINDOW:]
    for job_id in job_ids:
        mine = [float(str(e["observed"])) for e in window if e["job"] == job_id]
        if mine:
            observed[job_id] = statistics.median(mine)
    with ThroughputStore(db) as store:
        entry = store.get(JOB_TYPE, 1, GPU_TYPE)
    assert entry is not None and entry.source == "learned", entry
    assert entry.samples == len(learned)
    # one vote per job (the median of its rounds) and one for the prior
    assert entry.rate == pytest.approx(statistics.median([*observed.values(), prior]), rel=1e-3)
    # explain (run after an epoch that planned with it) shows the learned rate, marked
    assert explained.returncode == 0, explained.stderr
    line = next((x for x in explained.stdout.splitlines() if x.startswith("throughput of")), "")
    assert f"{GPU_TYPE} " in line and "learned" in line, explained.stdout
