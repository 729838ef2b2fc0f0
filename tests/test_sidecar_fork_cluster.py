"""HadarE end to end on the real dev cluster (Slurm 22.05, job_submit.lua loaded): the sidecar
(``policy = "hadare"``) forks a hinted ``fork=3`` job into three copies, one heterogeneous job on
three nodes of three GPU types, that train examples/digits_train.py through the job tracker on
the CPU; the job itself then runs unforked, finds the work done, and completes.  A fork that
cannot be made (an unwritable tracker root) leaves the job to run unforked; a job of another
user is forked as that user.

Every sidecar here runs for one epoch (``--max-epochs 1``), so what a test sees between epochs
does not depend on timing; a second sidecar (a restart) places the job after its copies ended.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.logs import read_events
from hadar_slurm.sidecar.fork import copy_of
from hadar_slurm.sidecar.observe import is_parked
from hadar_slurm.sidecar.record import decode
from hadar_slurm.slurm import RunAs, SlurmJob, commands, parse_sbatch_parsable
from hadar_slurm.slurm.parse import LAUNCH_FAILED_HELD
from tests.helpers import run_cli
from tests.slurm_cluster import (
    REPO,
    DevCluster,
    clear_prolog_faults,
    jobs,
    nodes_conf,
    wait_job,
)

NODE_TYPE = {name: t for name, (t, _) in nodes_conf().items()}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
WORK = 6000  # iterations of the digits MLP: a few seconds on 3 CPU copies
HINT = f"hadar: model=resnet50 bs=64 steps={WORK} fork=3"
NOBODY = 65534

# The user's job: the example through the runtime, on the CPU, the model where the user says.
TRAIN = f"""#!/bin/bash
#SBATCH --time=10
export HADAR_DEVICE=cpu
exec {sys.executable} {REPO}/examples/digits_train.py --steps "$1" --round-iters 1000 \\
    --output "$PWD/model.pt" --result "$PWD/result.json"
"""

# A stand-in that needs no Python (for a user who cannot run this checkout's interpreter): each
# copy, and the job itself, says who and where it ran.
REPORT = """#!/bin/bash
echo "${HADAR_COPY_INDEX:-job} $(id -u) $(hostname) ${HADAR_COPIES:-1}" >> "$PWD/ran.txt"
"""


@dataclass
class Fork:
    cluster: DevCluster
    path: Path
    submitted: list[int]

    @property
    def conf(self) -> str:
        return str(self.cluster.dir / "etc" / "slurm.conf")

    def config(self, name: str, *, tracker_root: str = "") -> Path:
        path = self.path / f"{name}.toml"
        path.write_text(f"""
[slurm]
conf = "{self.conf}"
[scheduler]
policy = "hadare"
epoch_seconds = 20
preempt_grace_s = 2
throughputs = ["{REPO}/slurm_conf/dev-throughputs.csv"]
[hadare]
tracker_root = "{tracker_root}"
[sidecar]
state_dir = "{self.path}/state"
log_format = "json"
log_file = "{self.path}/{name}.log"
""")
        return path

    def one_epoch(self, config: Path, *, returncode: int = 0,
                  **env: str) -> list[dict[str, object]]:
        """``hadar-slurm run --max-epochs 1``: one epoch, then it stops by itself."""
        full = dict(os.environ, SLURM_CONF=self.conf,
                    PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
        out = subprocess.run(
            [sys.executable, "-m", "hadar_slurm", "run", "--config", str(config),
             "--max-epochs", "1"], env=full, capture_output=True, text=True, timeout=120,
            check=False)
        assert out.returncode == returncode, out.stdout + out.stderr
        return read_events(config.with_suffix(".log"))

    def cli(self, *args: str) -> str:
        out = run_cli(*args, env={"SLURM_CONF": self.conf}, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def submit(self, script: str, workdir: Path, *, as_user: RunAs | None = None,
               **options: Any) -> int:
        path = workdir / "train.sh"
        path.write_text(script)
        path.chmod(0o755)
        argv = commands.sbatch(script=str(path), job_name="digits", gres="gpu:1", comment=HINT,
                               chdir=str(workdir), output=str(workdir / "job-%j.out"),
                               script_args=[str(WORK)], **options)
        job_id = parse_sbatch_parsable(self.cluster.runner.run(argv, as_user=as_user).stdout)
        self.submitted.append(job_id)
        return job_id

    def copies(self, job_id: int) -> list[SlurmJob]:
        comps = [j for j in jobs(self.cluster).values() if copy_of(j.comment) == job_id]
        self.submitted.extend(j.job_id for j in comps)
        return sorted(comps, key=lambda j: j.job_id)

    def wait_copies(self, job_id: int) -> list[SlurmJob]:
        """Until every copy of the job has ended (each one polled with its own bound)."""
        comps = self.copies(job_id)
        return [wait_job(self.cluster, c.job_id, FINAL, timeout=120) for c in comps]


@pytest.fixture
def fork(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[Fork]:
    tmp_path.chmod(0o755)
    f = Fork(dev_cluster, tmp_path, [])
    try:
        yield f
    finally:
        active = [j for j, job in jobs(dev_cluster).items()
                  if j in f.submitted and job.state not in FINAL]
        if active:
            dev_cluster.runner.run(commands.scancel(active), check=False)


def actions(events: list[dict[str, object]], job_id: int) -> list[str]:
    return [str(e["action"]) for e in events if e.get("event") == "action"
            and e.get("job") == job_id]


def test_forked_into_three_copies_then_completes(fork: Fork) -> None:
    work = fork.path / "work"
    work.mkdir()
    # (the account is free text without accounting storage, as on the dev cluster)
    job_id = fork.submit(TRAIN, work, mem="300M", cpus_per_task=2, extra=["--account=proj-7"])
    # job_submit.lua parks it for the sidecar (a begin time years ahead, not a hold)
    assert is_parked(jobs(fork.cluster)[job_id], time.time())

    # epoch 0: forked into 3 copies, one heterogeneous job
    events = fork.one_epoch(fork.config("first"))
    assert actions(events, job_id) == ["fork_intent", "fork", "record"], events
    comps = fork.copies(job_id)
    leader = comps[0].job_id
    assert len(comps) == 3 and all(c.het_job_id == leader for c in comps)
    assert [c.het_job_offset for c in comps] == [0, 1, 2]
    # each copy is charged and sized as the job: its account, memory and CPUs on its node
    assert [(c.account, c.mem_per_node_mb, c.cpus_per_node) for c in comps] == [
        ("proj-7", 300, 2)] * 3, comps
    nodes = [c.required_nodes for c in comps]
    assert len(set(nodes)) == 3 and len({NODE_TYPE[n] for n in nodes}) == 3, nodes
    original = jobs(fork.cluster)[job_id]
    rec = decode(original.admin_comment)
    assert (rec.state, rec.group, rec.copies) == ("forked", leader, 3), original.admin_comment
    # it waits, parked, for its copies (its dependency)
    assert is_parked(original, time.time())
    assert original.dependency.startswith(f"afterany:{leader}")

    # the relation, as squeue, status and explain show it (the job stays forked until the
    # next sidecar epoch, whatever the copies do meanwhile)
    listed = fork.cluster.runner.run(
        ["squeue", "--noheader", "--states=all", "--format=%i|%k|%E|%T"]).stdout.splitlines()
    mine = {line.split("|")[0]: line.split("|")[1:] for line in listed}
    for k in range(3):
        assert mine[f"{leader}+{k}"][0] == f"hadar-copy-of={job_id}", listed
    assert mine[str(job_id)][1].startswith(f"afterany:{leader}"), listed
    shown = fork.cluster.runner.run(commands.scontrol_show_job(job_id)).stdout
    assert "state=forked" in shown and f"group={leader} copies=3" in shown
    config = str(fork.path / "first.toml")
    status = fork.cli("status", "--config", config, "--all")
    assert f"forked into 3 copies as hetjob {leader} on" in status, status
    for k in range(3):
        assert f"copy {k} of job {job_id} (HadarE: hetjob {leader})" in status, status
    text = fork.cli("explain", str(job_id), "--config", config)
    assert f"forked into 3 copies as hetjob {leader} on {nodes[0]} ({NODE_TYPE[nodes[0]]})" \
        in text, text

    # the copies train to the end; the tracker counts exactly the work asked
    ended = fork.wait_copies(job_id)
    assert [c.state for c in ended] == ["COMPLETED"] * 3, ended
    assert [c.node_names for c in ended] == [(n,) for n in nodes]
    tracker = work / ".hadar-tracker" / str(job_id)
    progress = json.loads((tracker / "progress.json").read_text())
    assert progress["done"] == WORK and progress["complete"] and progress["copies"] == 3
    history = [json.loads(line) for line in (tracker / "history.jsonl").read_text().splitlines()]
    assert sum(sum(h["iters"]) for h in history) == WORK
    assert {c["gpu_type"] for c in progress["copy_rates"]} == {NODE_TYPE[n] for n in nodes}
    assert (tracker / "job.sh").read_text() == TRAIN and (tracker / "hints").read_text() == \
        HINT + "\n"
    assert (work / "model.pt").is_file()  # the consolidated model, where the user asked

    # epoch 0 of a restarted sidecar: the copies ended, so the job runs unforked and its
    # runtime finds the work done
    events = fork.one_epoch(fork.config("second"))
    assert actions(events, job_id) == ["place"], events  # (StartTime=now: it was parked)
    text = fork.cli("explain", str(job_id), "--config", str(fork.path / "second.toml"))
    assert f"progress (from the job tracker's progress.json): {WORK} of {WORK}" in text, text
    assert "copies' rates (last round): copy 0" in text, text
    final = wait_job(fork.cluster, job_id, FINAL, timeout=120)
    assert final.state == "COMPLETED", final
    rec = decode(final.admin_comment)
    assert rec.state == "placed" and rec.nofork and f"hetjob {leader}" in rec.why
    out = (work / f"job-{job_id}.out").read_text()
    assert f"work already done ({WORK}/{WORK} iterations" in out, out
    assert json.loads((tracker / "progress.json").read_text())["done"] == WORK
    result = json.loads((work / "result.json").read_text())
    assert result, result


def test_a_fork_whose_launch_failed_is_forked_anew(fork: Fork) -> None:
    # One copy's prolog fails (the dev cluster's fault drill): slurmctld drains that node and
    # holds the whole heterogeneous job ("launch failed requeued held"); the next epoch cancels
    # it and forks the job again, on the nodes left, and the job completes.
    work = fork.path / "work"
    work.mkdir()
    run = fork.cluster.dir / "run"
    job_id = fork.submit(REPORT, work)
    (run / "fail-prolog.once").touch()
    try:
        events = fork.one_epoch(fork.config("first"))
        assert actions(events, job_id) == ["fork_intent", "fork", "record"], events
        first = fork.copies(job_id)
        deadline = time.monotonic() + 60
        while not all(c.state_desc == LAUNCH_FAILED_HELD for c in first):
            assert time.monotonic() < deadline, first
            time.sleep(1)
            now = jobs(fork.cluster)
            first = [now[c.job_id] for c in first]
        failed_on = fork.cluster.runner.run(
            ["sinfo", "-h", "-N", "-t", "drain", "-o", "%N"]).stdout.split()
        assert len(failed_on) == 1, failed_on
        events = fork.one_epoch(fork.config("second"))
        assert actions(events, job_id)[-2:] == ["fork", "record"], events
        again = [c for c in fork.copies(job_id) if c.job_id not in {f.job_id for f in first}]
        assert len(again) == 3 and failed_on[0] not in {c.required_nodes for c in again}
        assert {jobs(fork.cluster)[c.job_id].state for c in first} == {"CANCELLED"}
        ended = [wait_job(fork.cluster, c.job_id, FINAL, timeout=60) for c in again]
        assert [c.state for c in ended] == ["COMPLETED"] * 3, ended
        fork.one_epoch(fork.config("third"))
        final = wait_job(fork.cluster, job_id, FINAL, timeout=60)
        assert final.state == "COMPLETED", final
        ran = sorted((work / "ran.txt").read_text().splitlines())
        assert [line.split()[0] for line in ran] == ["0", "1", "2", "job"], ran
    finally:
        clear_prolog_faults(fork.cluster)


def test_failed_fork_runs_the_job_unforked(fork: Fork) -> None:
    work = fork.path / "work"
    work.mkdir()
    blocker = fork.path / "blocker"
    blocker.write_text("a file: no tracker directory can be made under it\n")
    job_id = fork.submit(REPORT, work)
    # (a root that is a file is refused when the config is read; one under a file is not)
    events = fork.one_epoch(fork.config("first", tracker_root=str(blocker / "trackers")))
    assert actions(events, job_id) == ["place"], events
    failed = [e for e in events if e.get("event") == "fork_failed"]
    assert len(failed) == 1 and failed[0]["job"] == job_id, events
    assert "cannot write the tracker directory" in str(failed[0]["why"])
    final = wait_job(fork.cluster, job_id, FINAL, timeout=60)
    assert final.state == "COMPLETED", final
    assert fork.copies(job_id) == []
    rec = decode(final.admin_comment)
    assert rec.state == "placed" and rec.nofork and rec.why.startswith("fork failed: ")
    (line,) = (work / "ran.txt").read_text().splitlines()
    assert line.split()[0] == "job" and line.split()[2] == final.node_names[0]


# Each copy, and the job itself, writes the arguments it got, one per line after their count.
ARGS_REPORT = """#!/bin/bash
printf '%s\\n' "$#" "$@" > "$PWD/args-${HADAR_COPY_INDEX:-job}.txt"
"""
# what a user would type: sbatch --comment=... --gres=gpu:2 script.sh a 'b c' (and a few harder)
SCRIPT_ARGS = ["a", "b c", "", "it's \"quoted\"", "$(touch pwned)", "x,y=%20"]


def test_copies_and_the_job_get_the_scripts_arguments_exactly(fork: Fork) -> None:
    # Slurm 24.11+ report a job's command as the script's path alone (22.05: the arguments
    # joined by spaces): job_submit.lua records them at submit, and the copies get them, one
    # word each, as the job itself does when Slurm runs it.
    work = fork.path / "work"
    work.mkdir()
    path = work / "train.sh"
    path.write_text(ARGS_REPORT)
    path.chmod(0o755)
    job_id = parse_sbatch_parsable(fork.cluster.runner.run(commands.sbatch(
        script=str(path), script_args=SCRIPT_ARGS, job_name="args", gres="gpu:2",
        comment=HINT, chdir=str(work), output=str(work / "job-%j.out"))).stdout)
    fork.submitted.append(job_id)
    assert decode(jobs(fork.cluster)[job_id].admin_comment).args == tuple(SCRIPT_ARGS)

    events = fork.one_epoch(fork.config("first"))
    assert actions(events, job_id) == ["fork_intent", "fork", "record"], events
    ended = fork.wait_copies(job_id)
    assert [c.state for c in ended] == ["COMPLETED"] * 3, ended
    assert [c.gpus_per_node for c in ended] == [2, 2, 2]
    # a second sidecar places the job itself (its copies ended) where the policy chose
    events = fork.one_epoch(fork.config("second"))
    (placed,) = [e for e in events if e.get("event") == "action" and e.get("job") == job_id]
    assert placed["action"] == "place", events
    final = wait_job(fork.cluster, job_id, FINAL, timeout=60)
    assert final.state == "COMPLETED", final
    assert list(final.node_names) == placed["nodes"], (final, placed)
    for who in ("0", "1", "2", "job"):
        lines = (work / f"args-{who}.txt").read_text().split("\n")
        assert lines[0] == str(len(SCRIPT_ARGS)) and lines[1:-1] == SCRIPT_ARGS, (who, lines)
    assert not (work / "pwned").exists()


# Copies that wait (at most 60 s) until the test creates "go"; the job itself does not wait.
WAIT_FOR_GO = """#!/bin/bash
if [ -n "${HADAR_COPY_INDEX:-}" ]; then
  for _ in $(seq 600); do [ -e "$PWD/go" ] && break; sleep 0.1; done
fi
echo "${HADAR_COPY_INDEX:-job} $(id -u) $(hostname) ${HADAR_COPIES:-1}" >> "$PWD/ran.txt"
"""


def test_sidecar_killed_after_sbatch_adopts_the_fork(fork: Fork) -> None:
    work = fork.path / "work"
    work.mkdir()
    job_id = fork.submit(WAIT_FOR_GO, work)
    # killed right after its 2nd change to Slurm: the intent, then sbatch; not the record
    events = fork.one_epoch(fork.config("first"), returncode=-signal.SIGKILL,
                            HADAR_SIDECAR_CRASH_AFTER_WRITES="2")
    assert actions(events, job_id) == ["fork_intent", "fork"], events
    assert any(e.get("event") == "crash_drill" for e in events)
    comps = fork.copies(job_id)
    leader = comps[0].job_id
    assert len(comps) == 3 and decode(jobs(fork.cluster)[job_id].admin_comment).state == \
        "forking"

    events = fork.one_epoch(fork.config("second"))  # the copies wait for "go": still live
    assert actions(events, job_id) == ["adopt"], events
    assert {c.het_job_id for c in fork.copies(job_id)} == {leader}  # no second fork
    original = jobs(fork.cluster)[job_id]
    rec = decode(original.admin_comment)
    assert (rec.state, rec.group, rec.copies) == ("forked", leader, 3)
    # it waits, parked, for its copies (its dependency)
    assert is_parked(original, time.time())
    assert original.dependency.startswith(f"afterany:{leader}")

    (work / "go").write_text("")
    ended = fork.wait_copies(job_id)
    assert [c.state for c in ended] == ["COMPLETED"] * 3, ended
    events = fork.one_epoch(fork.config("third"))
    assert actions(events, job_id) == ["place"], events  # (StartTime=now: it was parked)
    final = wait_job(fork.cluster, job_id, FINAL, timeout=60)
    assert final.state == "COMPLETED", final
    assert {c.het_job_id for c in fork.copies(job_id)} == {leader}  # one fork, never two
    lines = sorted(line.split()[0] for line in (work / "ran.txt").read_text().splitlines())
    assert lines == ["0", "1", "2", "job"]


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A working directory of user nobody (outside pytest's private tmp dirs)."""
    if os.geteuid() != 0:
        pytest.skip("forking another user's job needs the sidecar to run as root")
    path = Path(tempfile.mkdtemp(prefix="hadar-fork-nobody-"))
    path.chmod(0o755)
    os.chown(path, NOBODY, NOBODY)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_job_of_another_user_is_forked_as_that_user(fork: Fork, nobody_dir: Path) -> None:
    nobody = RunAs(NOBODY, NOBODY, (), {"PATH": os.environ["PATH"]})
    job_id = fork.submit(REPORT, nobody_dir, as_user=nobody)
    events = fork.one_epoch(fork.config("first"))
    assert actions(events, job_id) == ["fork_intent", "fork", "record"], events
    ended = fork.wait_copies(job_id)
    assert [c.state for c in ended] == ["COMPLETED"] * 3, ended
    assert {c.user for c in ended} == {"nobody"}
    tracker = nobody_dir / ".hadar-tracker" / str(job_id)
    for name in ("job.sh", "hints", "fork.sbatch"):  # written as the owner, not as root
        assert (tracker / name).stat().st_uid == NOBODY, name
    assert (tracker / "job.sh").read_text() == REPORT
    fork.one_epoch(fork.config("second"))
    final = wait_job(fork.cluster, job_id, FINAL, timeout=60)
    assert final.state == "COMPLETED", final
    lines = sorted(line.split() for line in (nobody_dir / "ran.txt").read_text().splitlines())
    assert [w[0] for w in lines] == ["0", "1", "2", "job"]
    assert {w[1] for w in lines} == {str(NOBODY)}
    assert {w[2] for w in lines[:3]} == {c.node_names[0] for c in ended}
    assert [w[3] for w in lines] == ["3", "3", "3", "1"]


# Each copy, and the task itself, says which task of which array it is.
ARRAY_REPORT = """#!/bin/bash
echo "${HADAR_COPY_INDEX:-job} ${SLURM_ARRAY_JOB_ID:-none} ${SLURM_ARRAY_TASK_ID:-none}" \\
    >> "$PWD/array.txt"
"""


def test_copies_of_an_array_task_know_which_task_they_are(fork: Fork) -> None:
    # A task of a job array (a study's trial, with fork=N) forked into copies: the copies are
    # a heterogeneous job of their own, for which Slurm sets no SLURM_ARRAY_*; they get the
    # task's, so that a script that picks its work by $SLURM_ARRAY_TASK_ID (the trial
    # launcher of `hadar-slurm tune`) does the same work in every copy as in the task.
    work = fork.path / "array"
    work.mkdir()
    array = fork.submit(ARRAY_REPORT, work, extra=["--array=3"])
    (task_id, task), = [(j, t) for j, t in jobs(fork.cluster).items()
                        if t.array_job_id == array]
    fork.submitted.append(task_id)
    assert task.array_task_id == 3
    events = fork.one_epoch(fork.config("first"))
    assert actions(events, task_id)[-3:] == ["fork_intent", "fork", "record"], events
    ended = fork.wait_copies(task_id)
    assert [c.state for c in ended] == ["COMPLETED"] * 3, ended
    events = fork.one_epoch(fork.config("second"))
    assert "place" in actions(events, task_id), events
    assert wait_job(fork.cluster, task_id, FINAL, timeout=60).state == "COMPLETED"
    lines = sorted((work / "array.txt").read_text().split("\n")[:-1])
    assert lines == [f"{who} {array} 3" for who in ("0", "1", "2", "job")], lines
