"""bench/soak.py without a cluster: its plans are fixed by the seed, the quick plan has every
fault, every planned submission is a valid argv, the payload is valid sh, and the verdicts."""

from __future__ import annotations

import random
import subprocess
from collections import defaultdict
from pathlib import Path

from bench.soak import (
    PAYLOAD,
    Fault,
    Options,
    Record,
    Spec,
    plan_faults,
    plan_jobs,
    quick_options,
    read_log,
    summary,
)
from hadar_slurm.slurm import SlurmJob, commands

NODES = ["node1", "node2", "node3", "node4"]


def plans(opts: Options) -> tuple[list[Spec], list[Fault]]:
    rng = random.Random(opts.seed)
    return plan_jobs(opts, rng, Path("/tmp/x")), plan_faults(opts, rng, NODES)


def test_plans_are_fixed_by_the_seed() -> None:
    a, b = plans(quick_options(seed=3)), plans(quick_options(seed=3))
    assert [vars(s) for s in a[0]] == [vars(s) for s in b[0]] and a[1] == b[1]
    assert [vars(s) for s in plans(quick_options(seed=4))[0]] != [vars(s) for s in a[0]]


def test_quick_plan_has_every_fault_and_kind_within_its_duration() -> None:
    opts = quick_options()
    specs, faults = plans(opts)
    assert len(specs) == 40
    assert {s.kind for s in specs} == {"hadar", "plain", "bad_hint", "huge", "copy_of", "hold",
                                       "user_hold", "odd"}
    kinds = {f.kind for f in faults}
    assert {"sidecar_kill", "ctld_stop", "ctld_restart", "second_sidecar"} <= kinds
    assert kinds & {"node_down", "node_drain"}
    assert all(0 <= f.at < opts.duration_s for f in faults)
    assert all(0 <= s.at <= opts.duration_s * 0.7 for s in specs)


def test_every_submission_is_one_argv() -> None:
    for spec in plans(Options())[0]:
        argv = commands.sbatch(script="/p.sh", job_name=f"soak-{spec.kind}{spec.name_suffix}",
                               gres=spec.gres, constraint=spec.constraint, comment=spec.comment,
                               hold=spec.hold, script_args=["/out", str(spec.secs), spec.mode,
                                                            *spec.extra_args])
        assert argv[0] == "sbatch" and "/p.sh" in argv


def test_payload_is_valid_sh_and_resumes(tmp_path: Path) -> None:
    script = tmp_path / "payload.sh"
    script.write_text(PAYLOAD)
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    (tmp_path / "7.ckpt").write_text("2\n")
    env = {"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin", "SLURM_RESTART_COUNT": "1"}
    out = subprocess.run(["sh", str(script), str(tmp_path), "2", "ckpt"], env=env, timeout=30,
                         check=False)
    assert out.returncode == 0
    assert [ln.split()[0] for ln in (tmp_path / "7.log").read_text().splitlines()] == [
        "start", "already"]


def job(state: str, reason: str = "None") -> SlurmJob:
    return SlurmJob(job_id=5, name="soak", user="nobody", state=state, state_flags=(),
                    state_reason=reason, partition="gpu", nodes="", node_names=(), gres=(),
                    features="", comment="", admin_comment="", priority=None, submit_time=None,
                    start_time=None, time_limit_min=None)


def test_a_hold_is_broken_only_before_the_users_release() -> None:
    spec = Spec(0, 0.0, 0, "hold", "hadar: model=a3c steps=1", "gpu:1", None, 3, "ckpt",
                hold=True, release_after=30)
    rec = Record(spec, "soak-0", job_id=5, hold_t=1.0)
    rec.observe(job("PENDING", "JobHeldUser"), 2.0)
    assert not rec.hold_broken
    rec.release_t = 3.0
    rec.observe(job("RUNNING"), 4.0)
    assert not rec.hold_broken
    early = Record(spec, "soak-1", job_id=6, hold_t=1.0)
    early.observe(job("RUNNING"), 2.0)
    assert "state=RUNNING" in early.hold_broken


def test_read_log_counts_lines_that_are_not_json(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text('{"event": "epoch"}\nTraceback (most recent call last):\n[1]\n\n')
    events, bad = read_log(log)
    assert events == [{"event": "epoch"}] and bad == 2


def test_summary_tells_each_failed_jobs_story() -> None:
    """A failed soak's summary (what CI prints) carries the failing job's squeue timeline, its
    run log and the sidecar's events on it, not only the verdict."""
    failure = {
        "job": 151, "user": "hadarsoak", "kind": "hadar", "mode": "ignore",
        "why": "still held at the end (JobHeldUser)",
        "final": {"admin_comment": "hadar epoch=80 state=placed"},
        "timeline": [(3.0, "PENDING", "BeginTime"), (40.5, "RUNNING", "None"),
                     (88.2, "PENDING", "JobHeldUser")],
        "job_log": ["start node1 0 0", "start node1 1 4"],
        "sidecar_events": [{"ts": "T", "event": "action", "job": 151, "action": "requeue",
                            "epoch": 79}],
    }
    result = {"clean": False, "figures": defaultdict(int), "failures": [failure],
              "sidecar_crashes": [], "tracebacks_stderr": [], "harness_errors": []}
    text = summary(result)
    assert "FAIL job 151 (hadarsoak, hadar, ignore): still held at the end" in text
    assert "88.2s PENDING(JobHeldUser)" in text and "40.5s RUNNING(None)" in text
    assert "start node1 0 0 | start node1 1 4" in text
    assert "sidecar: ts=T event=action action=requeue epoch=79" in text
