"""HadarE's training runtime on the real dev cluster: examples/digits_train.py forked into three
copies on node1 (v100), node2 (p100) and node4 (a100) as one heterogeneous job, requeued
mid-run, ends with exactly W iterations and the consolidated model where it was asked for.

What Slurm 22.05 does with a heterogeneous job on ``scontrol requeue LEADER`` (checked here and
by hand on the dev cluster): the whole job is requeued — every component's steps get SIGTERM
(SIGKILL after KillWait, 2 s here), all components go back to PENDING (reason BeginTime, about
11 s on the dev cluster: cred_expire=10) and then start again together, with the same job ids,
``Restarts=1`` and ``SLURM_RESTART_COUNT=1`` in every copy's environment (every copy also sees
the leader's id as ``SLURM_JOB_ID``, so the runtime's run id ``<leader>.<restarts>`` is the same
in all copies and new after each requeue).  ``scontrol requeue`` on a non-leader component is
refused ("Job not heterogeneous job leader for job N", exit 1).

The runtime treats the SIGTERM as its preemption signal: every copy stops at its next iteration
boundary and reports, copy 0 commits that partial round (stop "signal TERM") and all exit 75
well within KillWait; the requeued run resumes from that commit.  So the work lost is at most
what was run since the last consolidation, and here, where the commit beats SIGKILL, none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hadar_slurm.runtime import EXIT_PREEMPTED, CommittedState, read_progress
from hadar_slurm.slurm import commands, parse_sbatch_parsable
from hadar_slurm.slurm.hetjob import CopySpec, ForkPlan, render_hetjob
from tests.slurm_cluster import DevCluster, wait_job

pytest.importorskip("torch")
pytest.importorskip("sklearn")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "digits_train.py"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
COPIES = (CopySpec("node1", "v100", 1), CopySpec("node2", "p100", 1), CopySpec("node4", "a100", 2))



def test_forked_example_requeued_mid_run_ends_with_exactly_w(
    dev_cluster: DevCluster, submitted: list[int], tmp_path: Path,
) -> None:
    tmp_path.chmod(0o777)  # /tmp is shared with the nodes; the copies write here
    original, work, per_round = 6161, 60_000, 3000
    tracker = tmp_path / ".hadar-tracker" / str(original)  # what the sidecar would give it
    output, result = tmp_path / "out" / "model.pt", tmp_path / "result.json"
    command = (sys.executable, str(EXAMPLE), "--steps", str(work), "--round-iters",
               str(per_round), "--output", str(output), "--result", str(result))
    plan = ForkPlan(original_job_id=original, job_name="hadar-rt-fork", command=command,
                    copies=COPIES, workdir=str(tmp_path), tracker_dir=str(tracker),
                    output="fork-%j.out", env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    script = tmp_path / "fork.sbatch"
    script.write_text(render_hetjob(plan), encoding="utf-8")
    leader = parse_sbatch_parsable(
        dev_cluster.runner.run(["sbatch", "--parsable", str(script)]).stdout)
    submitted.append(leader)
    log = tmp_path / f"fork-{leader}.out"

    # Mid-run: two rounds committed, far from the end.
    wait_job(dev_cluster, leader, {"RUNNING"}, timeout=30)
    _wait_for_round(tracker, 2, log)
    before = CommittedState.load(tracker / "state.json")
    assert before is not None and before.done < work // 2, "the job ran too fast to requeue"
    refused = dev_cluster.runner.run(["scontrol", "requeue", str(leader + 1)], check=False)
    assert refused.returncode != 0 and "not heterogeneous job leader" in refused.stderr
    dev_cluster.runner.run(["scontrol", "requeue", str(leader)])

    # (bounded; three torch copies on a 2-core machine, slower when it is busy: one run on a
    # loaded machine was still training 59 s after its restart when 75 s were up)
    job = wait_job(dev_cluster, leader, FINAL, timeout=240)
    detail = dev_cluster.runner.run(commands.scontrol_show_job(leader), check=False).stdout
    assert job.state == "COMPLETED", f"{job}\n{detail}\n{log.read_text()}"
    assert detail.count("Restarts=1") == len(COPIES)  # every component restarted once

    # Exactly W, and the second run went on from the first run's last commit.
    lines = [json.loads(x) for x in (tracker / "history.jsonl").read_text().splitlines()]
    first_run, second_run = f"{leader}.0", f"{leader}.1"
    assert {x["run"] for x in lines} == {first_run, second_run}
    run0 = [x for x in lines if x["run"] == first_run]
    run1 = [x for x in lines if x["run"] == second_run]
    assert sum(sum(x["iters"]) for x in lines) == work
    assert run1[0]["done"] - sum(run1[0]["iters"]) == run0[-1]["done"] >= before.done
    state = CommittedState.load(tracker / "state.json")
    assert state is not None and state.done == work and state.complete

    # Work lost to the requeue: what the first run's copies ran minus what it committed.  The
    # copies stopped on SIGTERM and committed the partial round, so nothing was lost (and at
    # most the round in progress could have been).
    assert run0[-1]["stop"] == "signal TERM", run0[-1]
    beats = [json.loads((tracker / "live" / first_run / f"copy-{i}.json").read_text())
             for i in range(len(COPIES))]
    assert all(b["state"] == "exited" and "signal TERM" in b["reason"] for b in beats), beats
    lost = sum(b["executed"] for b in beats) - run0[-1]["done"]
    assert 0 <= lost <= per_round
    assert lost == 0
    # (the job's output file is truncated when the requeued job starts, so its exit 75
    # lines are gone; the heartbeats above keep the copies' goodbyes)
    assert all(f"exit {EXIT_PREEMPTED}" in b["reason"] for b in beats)

    # The consolidated model, where it was asked for, and what each copy reported.
    assert output.is_file()
    res = json.loads(result.read_text())
    assert res["iterations"] == work and res["accuracy"] > 0.8 and res["copies"] == 3
    progress = read_progress(tracker)
    assert progress is not None and progress["done"] == work
    assert [c["gpu_type"] for c in progress["copy_rates"]] == ["v100", "p100", "a100"]


def _wait_for_round(tracker: Path, rounds: int, log: Path) -> None:
    import time

    end = time.monotonic() + 45
    while time.monotonic() < end:
        state = CommittedState.load(tracker / "state.json")
        if state is not None and state.round >= rounds:
            return
        time.sleep(0.05)
    text = log.read_text() if log.exists() else "(no log)"
    raise AssertionError(f"no round {rounds} committed within 45 s:\n{text}")
