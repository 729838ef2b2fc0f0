"""Faults and abuse on the real dev cluster (issue #11): moves that finish whatever happens to the
sidecar or slurmctld, jobs that may not be stopped, what users write that must not steer or stop
the sidecar.

Each test runs the real sidecar (``python -m hadar_slurm run``) over the session's dev cluster
(slurm_conf/slurm.conf.in: ``RequeueExitHold=75``, job_submit.lua loaded) with short epochs,
through the ``work`` fixture of tests/test_sidecar_cluster.py.  A move is forced by draining the
node a job runs on (its GPUs are then no longer the policy's, so the job is placed elsewhere).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hadar_slurm.sidecar.observe import (
    MAX_RELAUNCH,
    launch_failed,
    launch_failed_text,
    relaunchable,
)
from hadar_slurm.sidecar.record import decode
from hadar_slurm.slurm import RunAs, SlurmJob, commands, parse_sbatch_parsable
from hadar_slurm.slurm.parse import LAUNCH_FAILED_HELD
from tests.slurm_cluster import DevCluster, clear_prolog_faults, jobs, nodes_conf
from tests.test_sidecar_cluster import (
    FINAL,
    Sidecar,
    Workdir,
    assert_completed_once,
    check_alive,
    make_workdir,
)

# A job that checkpoints on USR1: it notes the signal, "saves" for $3 seconds and exits 75
# (hadar_slurm.runtime's status for "checkpointed, run me again"); a restarted run is short.
CHECKPOINTING = """#!/bin/sh
log="$1/$SLURM_JOB_ID.log"
echo "start $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
stop=0
trap 'stop=1' USR1
secs=$2
[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && secs=3
# (seconds counted, not read with $(date): the signal reaches every process of the job, and a
# command substitution it killed read as "time is up", so the job ended "done")
i=0
while [ "$i" -lt "$secs" ]; do
  if [ "$stop" = 1 ]; then
    echo "signal $(hostname)" >> "$log"
    sleep "$3"
    echo "checkpoint $(hostname)" >> "$log"
    exit 75
  fi
  sleep 1 & wait $!
  i=$((i + 1))
done
[ "$stop" = 1 ] && { echo "signal $(hostname)" >> "$log"; sleep "$3";
                     echo "checkpoint $(hostname)" >> "$log"; exit 75; }
echo "done $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
"""

# A job that knows nothing of signals (the checkpoint signal would kill it).
PLAIN = """#!/bin/sh
log="$1/$SLURM_JOB_ID.log"
echo "start $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
secs=$2
[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && secs=3
sleep "$secs"
echo "done $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
"""

NOBODY = RunAs(65534, 65534, env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def work(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[Workdir]:
    yield from make_workdir(dev_cluster, tmp_path)


@pytest.fixture
def nobody_plain() -> Iterator[Path]:
    """:data:`PLAIN` in a directory of user nobody (outside pytest's private tmp dirs), with
    its ``out/``."""
    path = Path(tempfile.mkdtemp(prefix="hadar-faults-nobody-"))
    try:
        (path / "out").mkdir()
        script = path / "plain.sh"
        script.write_text(PLAIN)
        for p in (path, path / "out", script):
            p.chmod(0o755)
            os.chown(p, NOBODY.uid, NOBODY.gid)
        yield script
    finally:
        shutil.rmtree(path, ignore_errors=True)


def config(work: Workdir, **values: str) -> None:
    """Set ``[scheduler]`` values of the fixture's sidecar config."""
    text = work.config.read_text()
    for key, value in values.items():
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
        k = lines.index("[scheduler]")
        lines.insert(k + 1, f"{key} = {value}")
        text = "\n".join(lines) + "\n"
    work.config.write_text(text)


def script(work: Workdir, name: str, text: str) -> Path:
    path = work.path / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def submit(work: Workdir, path: Path, hints: str | None, *args: str,
           as_user: RunAs | None = None, **options: object) -> int:
    """sbatch ``path`` (it logs to ``out/`` beside it) with ``hints`` as the comment."""
    argv = commands.sbatch(script=str(path), comment=hints, output="/dev/null",
                           chdir=str(path.parent), script_args=[str(path.parent / "out"), *args],
                           gres="gpu:1", **options)  # type: ignore[arg-type]
    job_id = parse_sbatch_parsable(work.cluster.runner.run(argv, as_user=as_user).stdout)
    work.submitted.append(job_id)
    return job_id


class Watch:
    """Every state each job was seen in, polling squeue."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.seen: dict[int, list[str]] = {}

    def poll(self) -> dict[int, SlurmJob]:
        now = jobs(self.cluster)
        for j, job in now.items():
            states = self.seen.setdefault(j, [])
            if not states or states[-1] != job.state:
                states.append(job.state)
        return now

    def until(self, what: str, ok: object, timeout: float,
              sidecars: tuple[Sidecar, ...] = ()) -> dict[int, SlurmJob]:
        end = time.monotonic() + timeout
        while True:
            now = self.poll()
            if callable(ok) and ok(now):
                return now
            check_alive(sidecars)
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not after {timeout:g} s; states {self.seen}")
            time.sleep(0.5)

    def all_final(self, ids: list[int], timeout: float,
                  sidecars: tuple[Sidecar, ...] = ()) -> dict[int, SlurmJob]:
        return self.until(f"jobs {ids} finished",
                          lambda now: all(i in now and now[i].state in FINAL for i in ids),
                          timeout, sidecars)


def actions(sidecar_events: list[dict[str, object]], job_id: int) -> list[str]:
    return [str(e["action"]) for e in sidecar_events
            if e.get("event") == "action" and e.get("job") == job_id]


@pytest.fixture
def drained(work: Workdir) -> Iterator[list[str]]:
    """Nodes a test drains; resumed at the end whatever happens."""
    nodes: list[str] = []
    yield nodes
    for n in nodes:
        work.cluster.runner.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"],
                                check=False)


def drain(work: Workdir, drained: list[str], node: str) -> None:
    work.cluster.runner.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                             "Reason=hadar-fault-test"])
    drained.append(node)


def running_on(watch: Watch, job_id: int, timeout: float,
               sidecars: tuple[Sidecar, ...]) -> str:
    now = watch.until(f"job {job_id} running",
                      lambda n: job_id in n and n[job_id].state == "RUNNING", timeout, sidecars)
    return now[job_id].node_names[0]


def test_a_move_finishes_when_the_sidecar_is_killed_during_the_grace(
        work: Workdir, drained: list[str]) -> None:
    # Before: the job exited 75 during the grace, nobody requeued it, it stayed FAILED, and
    # its afterok dependent stayed DependencyNeverSatisfied.
    config(work, preempt_grace_s="30")
    payload = script(work, "ckpt.sh", CHECKPOINTING)
    job_id = submit(work, payload, "hadar: model=resnet50 bs=64 steps=400000 preempt=checkpoint",
                    "120", "2")
    dependent = parse_sbatch_parsable(work.cluster.runner.run(commands.sbatch(
        wrap="true", output="/dev/null", chdir=str(work.path),
        dependency=f"afterok:{job_id}")).stdout)
    work.submitted.append(dependent)
    watch = Watch(work.cluster)
    first = work.start_sidecar()
    node = running_on(watch, job_id, 60, (first,))
    drain(work, drained, node)
    watch.until("the checkpoint signal", lambda _: "signal" in actions(first.events(), job_id),
                60, (first,))
    first.proc.kill()  # SIGKILL in its grace period: it never requeues the job
    first.proc.wait(timeout=10)
    # slurmctld requeues the checkpoint exit itself, held
    watch.until("the job back in the queue", lambda n: n[job_id].state == "SPECIAL_EXIT", 60)
    second = work.start_sidecar()
    final = watch.all_final([job_id, dependent], 150, (second,))
    assert final[job_id].state == "COMPLETED" and final[dependent].state == "COMPLETED", final
    assert "FAILED" not in watch.seen[job_id], watch.seen[job_id]
    log = work.job_log(job_id)
    kinds = [w[0] for w in log]
    assert kinds == ["start", "signal", "checkpoint", "start", "done"], log
    assert log[0][1] == node and log[-1][1] != node, log
    assert "place" in actions(second.events(), job_id)


def test_a_move_finishes_across_a_hung_slurmctld(work: Workdir, drained: list[str]) -> None:
    # slurmctld stops answering (SIGSTOP) right after the signal, for longer than the grace:
    # the sidecar's requeue cannot reach it, the job's exit 75 waits in slurmd; once
    # slurmctld is back the job is requeued held (by Slurm), placed again and completes.
    config(work, preempt_grace_s="4")
    work.config.write_text(work.config.read_text().replace(
        "[slurm]\n", "[slurm]\ncommand_timeout_s = 5\n"))
    payload = script(work, "ckpt.sh", CHECKPOINTING)
    job_id = submit(work, payload, "hadar: model=resnet50 bs=64 steps=400000 preempt=checkpoint",
                    "120", "1")
    watch = Watch(work.cluster)
    sidecar = work.start_sidecar()
    node = running_on(watch, job_id, 60, (sidecar,))
    pid = int((work.cluster.dir / "run" / "slurmctld.pid").read_text().split()[0])
    drain(work, drained, node)
    watch.until("the checkpoint signal", lambda _: "signal" in actions(sidecar.events(), job_id),
                60, (sidecar,))
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(25)
    finally:
        os.kill(pid, signal.SIGCONT)
    final = watch.all_final([job_id], 180, (sidecar,))
    assert final[job_id].state == "COMPLETED", final[job_id]
    assert "FAILED" not in watch.seen[job_id], watch.seen[job_id]
    kinds = [w[0] for w in work.job_log(job_id)]
    assert kinds == ["start", "signal", "checkpoint", "start", "done"], work.job_log(job_id)


def test_jobs_that_cannot_checkpoint_are_requeued_or_left_alone(
        work: Workdir, drained: list[str]) -> None:
    # preempt=requeue: stopped by Slurm's own requeue (no signal it would die of), restarted
    # elsewhere, never FAILED.  No preempt hint: never stopped; it finishes where it runs.
    # Before: both were signalled; the signal killed them, and they stayed FAILED.
    plain = script(work, "plain.sh", PLAIN)
    may = submit(work, plain, "hadar: model=resnet50 bs=64 steps=400000 preempt=requeue", "40")
    never = submit(work, plain, "hadar: model=resnet50 bs=64 steps=400000", "15")
    watch = Watch(work.cluster)
    sidecar = work.start_sidecar()
    nodes = {running_on(watch, j, 60, (sidecar,)) for j in (may, never)}
    for n in nodes:
        drain(work, drained, n)
    final = watch.all_final([may, never], 150, (sidecar,))
    assert sidecar.stop() == 0
    events = sidecar.events()
    for j in (may, never):
        assert_completed_once(work, j, final[j], events)
        assert "FAILED" not in watch.seen[j], (j, watch.seen[j])
        assert "signal" not in actions(events, j), actions(events, j)
    may_log, never_log = work.job_log(may), work.job_log(never)
    assert [w[0] for w in may_log] == ["start", "start", "done"], may_log
    assert may_log[-1][1] not in nodes and "requeue" in actions(events, may)
    assert [w[0] for w in never_log] == ["start", "done"], never_log
    assert "requeue" not in actions(events, never)


def test_a_forged_copy_of_another_users_job_is_left_alone(
        work: Workdir, nobody_plain: Path) -> None:
    # Before: nobody's plain job commented hadar-copy-of=<root's job> was signalled and
    # cancelled, and its run time credited to root's job.
    plain = script(work, "plain.sh", PLAIN)
    victim = submit(work, plain, "hadar: model=resnet50 bs=64 steps=400000", "40")
    forged = submit(work, nobody_plain, f"hadar-copy-of={victim}", "12", as_user=NOBODY)
    watch = Watch(work.cluster)
    sidecar = work.start_sidecar()
    final = watch.until("the forged job finished",
                        lambda n: n[forged].state in FINAL, 90, (sidecar,))
    assert final[forged].state == "COMPLETED", final[forged]
    events = sidecar.events()
    assert actions(events, forged) == []
    assert any(e.get("event") == "copy_untrusted" and e.get("job") == forged for e in events)
    rec = decode(jobs(work.cluster)[victim].admin_comment)
    assert rec.state != "forked" and rec.group == 0, rec


def test_users_holds_are_kept(work: Workdir, nobody_plain: Path) -> None:
    # Before: the sidecar released a job its user submitted with --hold, or held with
    # scontrol hold while it waited for its first placement, at the next epoch.
    plain = nobody_plain
    hints = "hadar: model=resnet50 bs=64 steps=1000"
    submitted_held = submit(work, plain, hints, "3", as_user=NOBODY, hold=True)
    held_later = submit(work, plain, hints, "3", as_user=NOBODY)
    work.cluster.runner.run(["scontrol", "hold", str(held_later)], as_user=NOBODY)
    other = submit(work, plain, hints, "3", as_user=NOBODY)
    watch = Watch(work.cluster)
    sidecar = work.start_sidecar()
    watch.all_final([other], 90, (sidecar,))
    now = watch.poll()
    for j in (submitted_held, held_later):
        assert now[j].state == "PENDING" and now[j].state_reason == "JobHeldUser", now[j]
        assert actions(sidecar.events(), j) == []
        work.cluster.runner.run(["scontrol", "release", str(j)], as_user=NOBODY)
    # released, they wait for the sidecar (parked), which places them
    final = watch.all_final([submitted_held, held_later], 90, (sidecar,))
    for j in (submitted_held, held_later):
        assert final[j].state == "COMPLETED", final[j]
        assert "place" in actions(sidecar.events(), j)


def test_hints_changed_after_submit_cannot_stop_the_sidecar(
        work: Workdir, nobody_plain: Path) -> None:
    # job_submit.lua checks hints at submit; a user may change the comment afterwards.  Before:
    # steps=<400 nines> crashed every sidecar epoch (OverflowError), holding every job.
    plain = nobody_plain
    bad = submit(work, plain, "hadar: model=resnet50 bs=64 steps=1000", "3", as_user=NOBODY)
    huge = "hadar: model=resnet50 bs=64 steps=" + "9" * 400
    work.cluster.runner.run(["scontrol", "update", f"JobId={bad}", f"Comment={huge}"],
                            as_user=NOBODY)
    good = submit(work, plain, "hadar: model=resnet50 bs=64 steps=1000", "3", as_user=NOBODY)
    watch = Watch(work.cluster)
    sidecar = work.start_sidecar()
    final = watch.all_final([bad, good], 120, (sidecar,))
    assert sidecar.proc.poll() is None, "the sidecar stopped"
    assert sidecar.stop() == 0
    assert final[bad].state == "COMPLETED" and final[good].state == "COMPLETED", final
    rec = decode(final[bad].admin_comment)
    assert rec.state == "unsteered" and "steps" in rec.why, rec
    out = sidecar.proc.stdout.read() if sidecar.proc.stdout else ""
    assert "Traceback" not in out, out[-3000:]
    assert "place" in actions(sidecar.events(), good)


@pytest.fixture
def prolog_faults(work: Workdir) -> Iterator[Path]:
    """The dev cluster's run dir, where the fault files of its prolog go
    (slurm_conf/prolog.sh.in: ``fail-prolog.NODE``, ``fail-prolog.once``).  At the end every
    fault file is removed and the nodes a failed prolog drained are resumed."""
    yield work.cluster.dir / "run"
    clear_prolog_faults(work.cluster)


def launch_failures(events: list[dict[str, object]], job_id: int) -> list[dict[str, object]]:
    return [e for e in events if e.get("event") == "launch_failed" and e.get("job") == job_id]


def test_a_job_whose_launch_failed_is_placed_anew(work: Workdir, prolog_faults: Path) -> None:
    # Before: slurmctld held the job after its launch failed where the sidecar had placed it
    # (JobHeldUser, "launch failed requeued held"), the sidecar took that for its user's hold,
    # and the job stayed held for ever (seen once in CI on 26.05.5, after a node failure).
    (prolog_faults / "fail-prolog.once").touch()
    job_id = submit(work, script(work, "plain.sh", PLAIN), "hadar: model=resnet50 bs=64 "
                    "steps=1000", "3")
    watch = Watch(work.cluster)
    sidecar = work.start_sidecar()
    final = watch.all_final([job_id], 90, (sidecar,))
    assert final[job_id].state == "COMPLETED", final[job_id]
    assert not (prolog_faults / "fail-prolog.once").exists()  # (the launch that failed took it)
    [failed] = launch_failures(sidecar.events(), job_id)
    assert failed["relaunch"] == 1, failed
    node = str(failed["nodes"])
    assert decode(final[job_id].admin_comment).relaunch == 1, final[job_id].admin_comment
    # the failed prolog drained that node: the job ran once, elsewhere
    drained = work.cluster.runner.run(["sinfo", "-h", "-N", "-t", "drain", "-o", "%N"]).stdout
    assert node in drained.split(), (node, drained)
    log = work.job_log(job_id)
    assert [w[0] for w in log] == ["start", "done"] and log[0][1] != node, log
    assert actions(sidecar.events(), job_id).count("place") == 2, sidecar.events()


def test_a_launch_that_keeps_failing_is_left_held_for_a_person(
        work: Workdir, prolog_faults: Path) -> None:
    # Every node's prolog fails: the sidecar places the job anew MAX_RELAUNCH times, each
    # failure draining one more node, then leaves it held as Slurm did (no round for ever).
    for node in nodes_conf():
        (prolog_faults / f"fail-prolog.{node}").touch()
    job_id = submit(work, script(work, "plain.sh", PLAIN), "hadar: model=resnet50 bs=64 "
                    "steps=1000", "3")
    watch = Watch(work.cluster)
    sidecar = work.start_sidecar()

    def given_up(now: dict[int, SlurmJob]) -> bool:
        job = now[job_id]
        return (job.state_desc == LAUNCH_FAILED_HELD
                and decode(job.admin_comment).relaunch == MAX_RELAUNCH)

    watch.until("the last launch failed", given_up, 120, (sidecar,))
    time.sleep(10)  # (three epochs more)
    job = watch.poll()[job_id]
    assert job.state == "PENDING" and job.state_reason == "JobHeldUser", job
    assert job.state_desc == LAUNCH_FAILED_HELD and launch_failed(job), job
    assert not relaunchable(job, decode(job.admin_comment))
    assert [e["relaunch"] for e in launch_failures(sidecar.events(), job_id)] == [1, 2, 3]
    assert actions(sidecar.events(), job_id).count("place") == MAX_RELAUNCH + 1
    assert work.job_log(job_id) == []  # (it never started)
    assert "hadar leaves it held" in str(launch_failed_text(job))
