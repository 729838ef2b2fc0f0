"""The sidecar (``hadar-slurm run``) steering the real dev cluster, end to end.

Jobs are submitted with ``sbatch`` (hinted ones go through slurm_conf/job_submit.lua, which holds
them); the sidecar runs as its own process with 3-second epochs, as an admin would run it.  Every
job's payload appends to a log of its own (start, signal, done lines with host and restart
count), so a test can tell where and how often it ran.  Each test cancels its jobs at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from hadar_slurm.logs import JsonLinesReader
from hadar_slurm.sidecar.observe import is_parked
from hadar_slurm.slurm import SlurmJob, commands
from tests.helpers import run_cli
from tests.slurm_cluster import REPO, DevCluster, dev_script, jobs, nodes_conf, submit

NODE_TYPE = {name: t for name, (t, _) in nodes_conf().items()}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}

PAYLOAD = """#!/bin/sh
# test payload: log start/signal/done with host and restart count; a requeued run is short.
# The checkpoint signal reaches every process of the job (scancel --full), sleep included:
# the loop goes on until the work time is over (or the requeue kills the job).
log="$1/$SLURM_JOB_ID.log"
echo "start $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
trap 'echo "signal $(hostname)" >> "$log"' USR1
secs=$2
[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && secs=3
end=$(( $(date +%s) + secs ))
while [ "$(date +%s)" -lt "$end" ]; do sleep 1 & wait $!; done
echo "done $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
"""


@dataclass
class Sidecar:
    proc: subprocess.Popen[str]
    log: Path
    reader: JsonLinesReader
    seen: list[dict[str, object]] = field(default_factory=list)

    def events(self) -> list[dict[str, object]]:
        """Every event the sidecar has logged so far (the log is read on from where the last
        call stopped)."""
        self.seen.extend(self.reader.read_new())
        return list(self.seen)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


@dataclass
class Workdir:
    path: Path
    config: Path
    cluster: DevCluster
    submitted: list[int]
    sidecars: list[Sidecar]

    @property
    def state_dir(self) -> Path:
        return self.path / "state"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.cluster.dir / "etc" / "slurm.conf")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(extra)
        return env

    def start_sidecar(self, *args: str, **env: str) -> Sidecar:
        log = self.path / f"sidecar-{len(self.sidecars)}.log"
        cfg = self.config.read_text().replace("@LOG@", str(log))
        path = self.path / f"sidecar-{len(self.sidecars)}.toml"
        path.write_text(cfg)
        proc = subprocess.Popen(
            [sys.executable, "-m", "hadar_slurm", "run", "--config", str(path), *args],
            env=self.env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sidecar = Sidecar(proc, log, JsonLinesReader(log))
        self.sidecars.append(sidecar)
        return sidecar

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={"SLURM_CONF": str(self.cluster.dir / "etc" / "slurm.conf")},
                       timeout=120)

    def submit(self, name: str, secs: int, *, hints: str | None, gres: str = "gpu:1",
               constraint: str | None = None) -> int:
        job_id = submit(
            self.cluster, script=str(self.path / "payload.sh"), job_name=name, gres=gres,
            constraint=constraint, comment=hints, output="/dev/null", chdir=str(self.path),
            script_args=[str(self.path / "out"), str(secs)])
        self.submitted.append(job_id)
        return job_id

    def job_log(self, job_id: int) -> list[list[str]]:
        path = self.path / "out" / f"{job_id}.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def work(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[Workdir]:
    yield from make_workdir(dev_cluster, tmp_path)


def make_workdir(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[Workdir]:
    """Behind the fixture ``work`` (also of other modules): a work dir with the payload and a
    sidecar config (3 s epochs, 2 s grace); every sidecar started is stopped at the end, and
    the jobs submitted through it that still live are cancelled."""
    tmp_path.chmod(0o755)
    (tmp_path / "out").mkdir()
    (tmp_path / "out").chmod(0o777)
    payload = tmp_path / "payload.sh"
    payload.write_text(PAYLOAD)
    payload.chmod(0o755)
    config = tmp_path / "sidecar.toml.in"
    config.write_text(f"""
[slurm]
conf = "{dev_cluster.dir}/etc/slurm.conf"
[scheduler]
policy = "hadar"
epoch_seconds = 3
preempt_grace_s = 2
throughputs = ["{REPO}/slurm_conf/dev-throughputs.csv"]
[sidecar]
state_dir = "{tmp_path}/state"
log_format = "json"
log_file = "@LOG@"
""")
    wd = Workdir(tmp_path, config, dev_cluster, [], [])
    try:
        yield wd
    finally:
        for s in wd.sidecars:
            s.stop()
        active = [j for j, job in jobs(dev_cluster).items()
                  if j in wd.submitted and job.state not in FINAL]
        if active:
            dev_cluster.runner.run(commands.scancel(active), check=False)


def check_alive(sidecars: Sequence[Sidecar]) -> None:
    """Fail with its output when a sidecar exited by itself (one a test killed is fine)."""
    for s in sidecars:
        if s.proc.poll() is not None and s.proc.returncode != -signal.SIGKILL:
            out = s.proc.stdout.read() if s.proc.stdout else ""
            raise AssertionError(f"sidecar exited {s.proc.returncode}: {out[-3000:]}")


def wait_all(cluster: DevCluster, ids: Sequence[int], timeout: float,
             sidecars: Sequence[Sidecar] = ()) -> dict[int, SlurmJob]:
    end = time.monotonic() + timeout
    while True:
        now = jobs(cluster)
        if all(i in now and now[i].state in FINAL for i in ids):
            return now
        check_alive(sidecars)
        if time.monotonic() > end:
            left = {i: (now[i].state, now[i].state_reason, now[i].admin_comment)
                    for i in ids if i in now and now[i].state not in FINAL}
            raise AssertionError(f"jobs not finished after {timeout:g} s: {left}")
        time.sleep(0.5)


def assert_completed_once(work: Workdir, job_id: int, job: SlurmJob,
                          events: Sequence[dict[str, object]]) -> None:
    """Slurm says COMPLETED (once: a job has one final state) and the payload's last run ended
    with "done".  An earlier run may also have written "done" only when the sidecar's requeue
    met the job's natural end (a run killed right after its last line): then the sidecar logged
    a requeue of the job, and the next run has a higher restart count."""
    assert job.state == "COMPLETED", job
    log = work.job_log(job_id)
    assert log and log[-1][0] == "done", log
    done = [k for k, w in enumerate(log) if w[0] == "done"]
    if len(done) > 1:
        requeues = [e for e in events if e.get("event") == "action" and e.get("job") == job_id
                    and e.get("action") == "requeue"]
        assert len(requeues) >= len(done) - 1, (log, requeues)
        restarts = [int(w[2]) for w in log if w[0] == "start"]
        assert restarts == sorted(set(restarts)), log


def last_place(events: Sequence[dict[str, object]], job_id: int) -> dict[str, object]:
    places = [e for e in events if e.get("event") == "action" and e.get("action") == "place"
              and e.get("job") == job_id]
    assert places, f"the sidecar never placed job {job_id}"
    return places[-1]


# A mixed workload: (name, hints, GPUs, seconds); every model of the catalog, 1 to 4 GPUs.
WORKLOAD = [
    ("rn50-1", "model=resnet50 bs=64 steps=40000", 1, 6),
    ("rn50-2", "model=resnet50 bs=32 steps=20000", 2, 5),
    ("rn50-4", "model=resnet50 bs=128 steps=80000", 4, 7),
    ("rn18-2", "model=resnet18 bs=128 steps=30000", 2, 4),
    ("tf-1", "model=transformer bs=32 steps=15000 sync=false", 1, 5),
    ("tf-2", "model=transformer bs=128 steps=25000", 2, 6),
    ("lm-1", "model=lm bs=20 steps=50000", 1, 4),
    ("lm-4", "model=lm bs=80 steps=100000 weight=2", 4, 5),
    ("rec-1", "model=recommendation bs=512 steps=9000", 1, 4),
    ("rec-1b", "model=recommendation bs=2048 steps=5000", 1, 3),
    ("a3c-1", "model=a3c steps=12000", 1, 5),
    ("gan-1", "model=cyclegan steps=3000", 1, 6),
]


def test_mixed_workload_runs_where_the_policy_placed_it(work: Workdir) -> None:
    hinted = {work.submit(name, secs, hints=f"hadar: {h}", gres=f"gpu:{g}"): (name, g)
              for name, h, g, secs in WORKLOAD}
    plain = [work.submit("plain-k80", 4, hints=None, gres="gpu:k80:1"),
             work.submit("plain-a100", 4, hints=None, gres="gpu:2", constraint="a100")]
    before = jobs(work.cluster)
    for j in hinted:
        # job_submit.lua parks hadar jobs for the sidecar (a begin time years ahead)
        assert is_parked(before[j], time.time()), before[j]
    sidecar = work.start_sidecar()
    config = str(work.path / "sidecar-0.toml")
    end = time.monotonic() + 60
    # (the epoch's log line comes before its state file: wait for both)
    while not any(e.get("event") == "epoch" for e in sidecar.events()) or not (
            work.state_dir / "state.json").exists():
        assert time.monotonic() < end and sidecar.proc.poll() is None
        time.sleep(0.2)
    # status and explain, from other processes, while the sidecar runs: every hinted job is
    # either placed or waits for a reason the policy gave
    status = work.cli("status", "--config", config)
    assert status.returncode == 0, status.stderr
    explained = {j: work.cli("explain", str(j), "--config", config) for j in hinted}
    final = wait_all(work.cluster, [*hinted, *plain], timeout=180, sidecars=[sidecar])
    assert sidecar.stop() == 0
    for j, out in explained.items():
        assert out.returncode == 0, out.stderr
        assert f"job {j} ({hinted[j][0]}" in out.stdout
        # (a running job without a preempt hint is not the policy's any more: it runs where
        # it was placed)
        assert ("placed on node" in out.stdout or "waits:" in out.stdout
                or "finished" in out.stdout or "runs where epoch" in out.stdout), out.stdout
    assert "model" in status.stdout.splitlines()[1].lower(), status.stdout
    assert any("placed on node" in out.stdout and "throughput of" in out.stdout
               for out in explained.values()), [out.stdout for out in explained.values()]
    done_status = work.cli("status", "--config", config, "--all")
    assert done_status.returncode == 0, done_status.stderr

    events = sidecar.events()
    epochs = [e for e in events if e.get("event") == "epoch"]
    assert len(epochs) >= 2
    for j, (name, gpus) in hinted.items():
        job = final[j]
        assert job.state == "COMPLETED", (name, job)
        place = last_place(events, j)
        # it ran on the nodes and GPU type the policy chose, with the GPUs it asked for
        assert list(job.node_names) == place["nodes"], (name, job.nodes, place)
        assert {NODE_TYPE[n] for n in job.node_names} == set(str(place["gpu_type"]).split("|"))
        assert place["gpus"] == gpus
        assert_completed_once(work, j, job, events)
        assert work.job_log(j)[-1][1] in job.node_names
        assert any(line.split()[:1] == [str(j)] for line in done_status.stdout.splitlines())
    for j in plain:
        job = final[j]
        assert job.state == "COMPLETED" and job.admin_comment == "", job  # left alone
    assert final[plain[0]].gpu_type == "k80" and final[plain[0]].node_names == ("node3",)
    assert final[plain[1]].features == "a100" and final[plain[1]].node_names == ("node4",)
    # nothing left held: every job of this test has finished
    assert not [j for j in work.submitted if final[j].state not in FINAL]


def test_drained_node_job_is_signaled_requeued_and_completes(work: Workdir) -> None:
    job_id = work.submit("long", 60,
                         hints="hadar: model=resnet50 bs=64 steps=400000 preempt=checkpoint")
    sidecar = work.start_sidecar()
    end = time.monotonic() + 60
    job = jobs(work.cluster)[job_id]
    while job.state != "RUNNING":
        assert time.monotonic() < end, job
        time.sleep(0.5)
        job = jobs(work.cluster)[job_id]
    first_node = job.node_names[0]
    run = work.cluster.runner.run
    try:
        run(["scontrol", "update", f"NodeName={first_node}", "State=DRAIN",
             "Reason=hadar-test"])
        final = wait_all(work.cluster, [job_id], timeout=120, sidecars=[sidecar])
    finally:
        run(["scontrol", "update", f"NodeName={first_node}", "State=RESUME"], check=False)
    assert sidecar.stop() == 0
    assert final[job_id].state == "COMPLETED", final[job_id]
    log = work.job_log(job_id)
    kinds = [w[0] for w in log]
    # the checkpoint signal came first, on the drained node; then a second run elsewhere
    assert kinds[:2] == ["start", "signal"] and log[1][1] == first_node, log
    assert kinds.count("done") == 1 and kinds.count("start") == 2, log
    assert log[-1][1] != first_node and int(log[-1][2]) >= 1, log
    events = sidecar.events()
    acts = [e["action"] for e in events if e.get("event") == "action" and e.get("job") == job_id]
    assert "signal" in acts and "requeue" in acts
    assert acts.index("signal") < acts.index("requeue") < len(acts) - 1 - acts[::-1].index(
        "place")
    # the move happens within the epoch: signalled, requeued and placed on its new node by
    # the same epoch, and started there with StartTime=now (not after the requeue's delay)
    mine = [e for e in events if e.get("event") == "action" and e.get("job") == job_id]
    signalled = next(e for e in mine if e["action"] == "signal")
    placed = [e for e in mine if e["action"] == "place" and e["epoch"] == signalled["epoch"]]
    assert placed and placed[0]["nodes"] != [first_node], mine


def test_sidecar_crash_and_slurmctld_restart(work: Workdir) -> None:
    ids = [work.submit(f"f{k}", 5 + k % 3, hints=f"hadar: model=lm bs=20 steps={1000 * (k + 1)}")
           for k in range(8)]
    # killed (SIGKILL) right after its 3rd change to Slurm: mid-epoch, some jobs placed
    crashed = work.start_sidecar(HADAR_SIDECAR_CRASH_AFTER_WRITES="3")
    crashed.proc.wait(timeout=60)
    assert crashed.proc.returncode == -signal.SIGKILL
    assert any(e.get("event") == "crash_drill" for e in crashed.events())
    sidecar = work.start_sidecar()
    time.sleep(4)
    restart = dev_script("restart-ctld", work.cluster.env, timeout=90)
    assert restart.returncode == 0, restart.stderr
    final = wait_all(work.cluster, ids, timeout=180, sidecars=[sidecar])
    assert sidecar.stop() == 0
    events = crashed.events() + sidecar.events()
    for j in ids:
        assert_completed_once(work, j, final[j], events)
    events = sidecar.events()
    resume = next(e for e in events if e.get("event") == "resume")
    placed_before = {e["job"]: e["nodes"] for e in crashed.events()
                     if e.get("event") == "action" and e.get("action") == "place"}
    assert placed_before and int(str(resume["epoch"])) >= 1  # picked up after the crash epoch
    # The new sidecar does not place again where the crashed one placed (the record in the
    # AdminComment says it is done): its first change to such a job is not that same place.
    # The policy may still move a pending job elsewhere, or preempt a running one and later
    # place it back on the same nodes (a new decision, after a requeue).
    for placed_job, nodes in placed_before.items():
        acts = [e for e in events if e.get("event") == "action" and e.get("job") == placed_job]
        first = acts[0] if acts else None
        assert first is None or first["action"] != "place" or first["nodes"] != nodes, (
            placed_job, nodes, acts)


def test_dry_run_changes_nothing(work: Workdir) -> None:
    ids = [work.submit(f"d{k}", 3, hints="hadar: model=a3c steps=100") for k in range(3)]
    before = {j: jobs(work.cluster)[j] for j in ids}
    sidecar = work.start_sidecar("--once", "--dry-run")
    assert sidecar.proc.wait(timeout=60) == 0
    after = jobs(work.cluster)
    for j in ids:
        assert is_parked(after[j], time.time())
        assert after[j].admin_comment == before[j].admin_comment
        assert after[j].features == before[j].features
    acts = [e for e in sidecar.events() if e.get("event") == "action"]
    assert {e["job"] for e in acts if e["action"] == "place"} == set(ids)
    epoch = next(e for e in sidecar.events() if e.get("event") == "epoch")
    assert epoch["dry_run"] is True and epoch["slurm_commands"] == 2


def test_bad_config_stops_at_start(work: Workdir) -> None:
    bad = work.path / "bad.toml"
    bad.write_text("[scheduler]\nepoch_secs = 5\n")
    out = work.cli("run", "--config", str(bad), "--once")
    assert out.returncode == 2
    assert "epoch_secs" in out.stderr and "unknown key" in out.stderr, out.stderr
    bad.write_text("[scheduler]\nepoch_seconds = -1\n")
    out = work.cli("run", "--config", str(bad), "--once")
    assert out.returncode == 2 and "epoch_seconds" in out.stderr, out.stderr


def test_epoch_starts_early_when_a_job_ends(work: Workdir) -> None:
    """[scheduler] reschedule_on_finish (the default): with 60 s epochs, a job that ends 4 s
    into the epoch frees its GPUs for an epoch a poll later, not 56 s later."""
    work.config.write_text(work.config.read_text().replace(
        "epoch_seconds = 3", "epoch_seconds = 60\nfinish_poll_s = 1"))
    job_id = work.submit("short", 4, hints="hadar: model=resnet50 bs=64 steps=40000")
    sidecar = work.start_sidecar()
    deadline = time.monotonic() + 45
    while True:
        events = sidecar.events()
        epochs = [e for e in events if e.get("event") == "epoch"]
        if len(epochs) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(epochs) >= 2, events
    ended = [e for e in events if e.get("event") == "jobs_ended"]
    assert ended and job_id in ended[0]["jobs"], events  # type: ignore[operator]
    placed = [e for e in events if e.get("event") == "action" and e.get("action") == "place"
              and e.get("job") == job_id]
    assert placed and placed[0]["epoch"] == epochs[0]["epoch"], events
    assert jobs(work.cluster)[job_id].state in FINAL
    t0, t1 = (datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")) for e in epochs[:2])
    gap = (t1 - t0).total_seconds()
    assert gap < 30, (gap, events)  # 4 s of payload plus polls, far from the 60 s epoch
