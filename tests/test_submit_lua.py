"""slurm_conf/job_submit.lua on a real slurmctld (the session's dev cluster, started with the
plugin): hadar jobs are checked, normalized to untyped GPUs and parked; bad hints are refused at
sbatch time with the same decision and message as hadar_slurm.hints.parse_hints; other jobs are
left alone.  Every job a test submits is cancelled when the test ends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hadar_slurm.hints import HintError, is_hadar_comment, parse_hints
from hadar_slurm.sidecar.observe import is_parked
from hadar_slurm.sidecar.record import MAX_ARGS_BYTES, decode, mark
from hadar_slurm.slurm import Gres, commands, parse_sbatch_parsable, parse_scontrol_show
from tests.slurm_cluster import DevCluster, jobs, spelled, wait_job

ADMIN_COMMENT = "hadar: waits for the sidecar"
USER_HELD_COMMENT = "hadar: held by its user"  # sbatch --hold: the user's own hold


class Submitter:
    """sbatch on the dev cluster; remembers the jobs to cancel them at the end of the test."""

    def __init__(self, cluster: DevCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.ids: list[int] = []

    def sbatch(self, comment: str | None, *options: str, wrap: str = "sleep 1",
               hold: bool = False, gres: str | None = None, constraint: str | None = None,
               script: Path | None = None, args: tuple[str, ...] = (),
               ) -> tuple[int | None, str]:
        """(job id or None when refused, sbatch's stderr)."""
        argv = commands.sbatch(
            wrap=None if script else wrap, script=str(script) if script else None,
            script_args=args, comment=comment, gres=gres, constraint=constraint, hold=hold,
            job_name="hadar-it-lua", chdir=str(self.workdir), output="/dev/null",
            extra=options)
        out = self.cluster.runner.run(argv, check=False)
        if out.returncode != 0:
            return None, out.stderr
        job_id = parse_sbatch_parsable(out.stdout)
        self.ids.append(job_id)
        return job_id, out.stderr

    def show(self, job_id: int) -> dict[str, str]:
        return parse_scontrol_show(
            self.cluster.runner.run(commands.scontrol_show_job(job_id)).stdout)

    def cancel_all(self) -> None:
        if self.ids:
            self.cluster.runner.run(commands.scancel(self.ids), check=False)


@pytest.fixture
def sub(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[Submitter]:
    tmp_path.chmod(0o755)
    submitter = Submitter(dev_cluster, tmp_path)
    try:
        yield submitter
    finally:
        submitter.cancel_all()


def test_hinted_job_is_normalized_and_parked(sub: Submitter) -> None:
    job_id, _ = sub.sbatch("hadar: model=resnet50 bs=64 steps=40000 sync=true", "--prefer=v100",
                           gres="gpu:v100:2", constraint="v100")
    assert job_id is not None
    job = jobs(sub.cluster)[job_id]
    # parked for the sidecar: a begin time years ahead, not a hold (a hold of the user's shows)
    assert job.state == "PENDING" and job.state_reason == "BeginTime" and not job.held, job
    assert is_parked(job, time.time())
    assert job.gres == (Gres("gpu", None, 2),) and job.gpu_type is None  # untyped
    assert job.features == ""  # the sidecar picks the GPU type
    assert mark(job.admin_comment) == ADMIN_COMMENT
    assert decode(job.admin_comment).args == ()  # (sbatch --wrap: a script without arguments)
    assert job.comment == "hadar: model=resnet50 bs=64 steps=40000 sync=true"
    shown = sub.show(job_id)
    assert shown["TresPerNode"] == spelled(sub.cluster, "gres:gpu:2") and shown["Requeue"] == "1"
    assert shown["Features"] == "(null)" and "Prefer" not in shown and "TresPerJob" not in shown


def test_normalized_job_can_be_placed_and_started(sub: Submitter) -> None:
    # --gpus=2 (tres_per_job) becomes --gres=gpu:2; the operator (as the sidecar will) sets
    # NodeList, Features and StartTime=now on the parked job: it runs there.
    job_id, _ = sub.sbatch("hadar: model=transformer bs=32 steps=100", "--gpus=v100:2")
    assert job_id is not None
    assert jobs(sub.cluster)[job_id].gres == (Gres("gpu", None, 2),)
    sub.cluster.runner.run(commands.scontrol_update_job(
        job_id, {"NodeList": "node2", "Features": "p100", "StartTime": "now"}))
    job = wait_job(sub.cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=30)
    assert job.state == "COMPLETED" and job.node_names == ("node2",), job
    assert job.gpus_per_node == 2


def test_unhinted_job_is_left_as_submitted(sub: Submitter) -> None:
    comment = "not for hadar: model=nonsense"
    # (a begin time an hour ahead keeps it pending: 24.11+ drop Prefer from a running job)
    job_id, _ = sub.sbatch(comment, "--prefer=k80", "--no-requeue", "--begin=now+3600",
                           wrap="sleep 30", gres="gpu:k80:1", constraint="k80")
    assert job_id is not None
    job = jobs(sub.cluster)[job_id]
    assert not job.held and job.state == "PENDING" and job.priority != 0, job
    assert job.state_reason == "BeginTime" and not is_parked(job, time.time())  # its own
    assert job.gres == (Gres("gpu", "k80", 1),) and job.features == "k80"
    assert job.comment == comment and job.admin_comment == ""
    shown = sub.show(job_id)
    assert shown["TresPerNode"] == spelled(sub.cluster, "gres:gpu:k80:1")
    assert shown["Prefer"] == "k80"
    assert shown["Requeue"] == "0"

    no_comment, _ = sub.sbatch(None, hold=True, gres="gpu:2")
    assert no_comment is not None
    job = jobs(sub.cluster)[no_comment]
    assert job.comment == "" and job.admin_comment == "" and job.gres == (Gres("gpu", None, 2),)


ARGS = ("a", "b c", "", "--steps=3", "x,y:z=%20", "é", "-", "2:a,b", "'; rm -rf / #")


def test_script_arguments_are_recorded(sub: Submitter, tmp_path: Path) -> None:
    # Slurm 24.11+ report only the script's path as the job's command, 22.05 its arguments
    # joined by spaces: job_submit.lua records them, exactly, in the admin comment.
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    comment = "hadar: model=resnet50 bs=64 steps=10"
    job_id, stderr = sub.sbatch(comment, script=script, args=ARGS, gres="gpu:1")
    assert job_id is not None, stderr
    job = jobs(sub.cluster)[job_id]
    assert mark(job.admin_comment) == ADMIN_COMMENT
    assert decode(job.admin_comment).args == ARGS, job.admin_comment

    held, stderr = sub.sbatch(comment, script=script, args=("only",), hold=True)
    assert held is not None, stderr
    assert decode(jobs(sub.cluster)[held].admin_comment).args == ("only",)

    # too long to record: the job is accepted (and never forked: its arguments are unknown)
    long_args = ("%" * (MAX_ARGS_BYTES // 3 + 1),)
    long_id, stderr = sub.sbatch(comment, script=script, args=long_args)
    assert long_id is not None, stderr
    job = jobs(sub.cluster)[long_id]
    assert job.admin_comment == ADMIN_COMMENT + " args=-" and decode(job.admin_comment).args is None


STUDY = ("hadar: model=resnet18 bs=64 steps=40000 study=lr-search rule=sh rungs=4 eta=3 "
         "metric=accuracy mode=max")

# (comment, extra sbatch options, the GPU count job_submit.lua reads from them)
PARITY: list[tuple[str, tuple[str, ...], int]] = [
    ("hadar: model=resnet50 bs=64 steps=40000 sync=true", ("--gres=gpu:v100:2",), 2),
    ("  HADAR:model=ResNet-18\tbs=16 steps=4_000 weight=.5", (), 1),
    ("hadar: steps=7 sync=No model=a3c weight=2e1", ("--gres=gpu:1",), 1),
    ("hadar: model=recommendation bs=0512 steps=1", ("--gpus=1",), 1),
    ("hadar: model=lm bs=80 steps=10 weight=3.", ("--gpus-per-node=8",), 8),
    ("hadar: model=lm bs=40 steps=10", ("--gpus-per-task=1", "--ntasks=4"), 4),
    ("hadar: model=lm bs=10 steps=10", ("--gpus-per-socket=1", "--sockets-per-node=2"), 2),
    ("hadar model=nonsense (no colon: not a hadar job)", ("--gres=gpu:k80:1",), 1),
    ("see hadar: later", (), 1),
    ("hadar:", (), 1),
    ("hadar: model=resnet51 bs=64 steps=1", (), 1),
    ("hadar: model=resnet50 bs=65 steps=1", (), 1),
    ("hadar: model=resnet50 bs=6_4x steps=1", (), 1),
    ("hadar: model=resnet50 steps=10", (), 1),
    ("hadar: model=a3c bs=32 steps=10", (), 1),
    ("hadar: model=a3c", (), 1),
    ("hadar: model=resnet50 bs=64 steps=-5", (), 1),
    ("hadar: model=resnet50 bs=64 steps=1.5", (), 1),
    ("hadar: model=lm bs=5 steps=1__0", (), 1),
    ("hadar: model=a3c steps=10 sync=maybe", (), 1),
    ("hadar: model=a3c steps=10 weight=inf", (), 1),
    ("hadar: model=a3c steps=10 weight=0x10", (), 1),
    ("hadar: model=a3c steps=10 weight=0", (), 1),
    ("hadar: model=a3c steps=10 foo=1", (), 1),
    ("hadar: Model=a3c steps=10", (), 1),
    ("hadar: model=a3c steps=10 steps=11", (), 1),
    ("hadar: model=a3c steps", (), 1),
    ("hadar: =a3c", (), 1),
    ("hadar: model=a3c steps=", (), 1),
    ("hadar: model=a3c steps=10", ("--gres=gpu:2",), 2),
    ("hadar: model=resnet50 bs=64 steps=10", ("--gpus-per-task=1", "--ntasks=3"), 3),
    ("hadar: model=resnet50 bs=64 steps=10", ("--gpus=v100:16",), 16),
    ("hadar: model=a3c steps=10 fork=3", (), 1),
    ("hadar: model=lm bs=20 steps=10 fork=1_6", ("--gres=gpu:2",), 2),
    ("hadar: model=a3c steps=10 fork=01", (), 1),
    ("hadar: model=a3c steps=10 fork=0", (), 1),
    ("hadar: model=a3c steps=10 fork=17", (), 1),
    ("hadar: model=a3c steps=10 fork=99999999999999999999", (), 1),
    ("hadar: model=a3c steps=10 fork=2.5", (), 1),
    ("hadar: model=a3c steps=10 fork=-1", (), 1),
    ("hadar: model=a3c steps=10 fork=", (), 1),
    ("hadar: model=a3c steps=10 fork=2 fork=2", (), 1),
    ("hadar: fork=0 weight=0 model=a3c steps=1", (), 1),
    ("hadar: fork=0 model=a3c steps=1", ("--gres=gpu:2",), 2),
    ("hadar: model=a3c steps=10 share=no", (), 1),
    ("hadar: model=resnet50 bs=64 steps=10 share=YES sync=0", ("--gres=gpu:2",), 2),
    ("hadar: model=lm bs=5 steps=10 fork=2 share=False", ("--gres=gpu:4",), 4),
    ("hadar: model=a3c steps=10 share=maybe", (), 1),
    ("hadar: model=a3c steps=10 share=2", (), 1),
    ("hadar: model=a3c steps=10 share=", (), 1),
    ("hadar: model=a3c steps=10 share=no share=no", (), 1),
    ("hadar: model=a3c steps=10 Share=no", (), 1),
    ("hadar: model=a3c steps=10 share=" + "y" * 65, (), 1),
    ("hadar: share=x sync=x model=a3c steps=1", (), 1),
    ("hadar: share=x preempt=x model=a3c steps=1", (), 1),
    ("hadar: share=x model=a3c steps=1", ("--gres=gpu:2",), 2),
    ("hadar: share=no model=a3c steps=1", ("--gres=gpu:2",), 2),
    # studies (issue #17): a study is a job array (--array), one task per trial
    (STUDY, ("--array=0-3", "--gres=gpu:1"), 1),
    (STUDY, ("--gres=gpu:1",), 1),  # not an array: refused
    (STUDY, ("--array=0-3", "--gres=gpu:2"), 2),
    (STUDY, ("--gres=gpu:2",), 2),  # the array is checked before the GPU count
    ("hadar: model=a3c steps=27 study=s", ("--array=1,3,5", "--gres=gpu:1"), 1),
    ("hadar: model=a3c steps=26 study=s", ("--array=0-1", "--gres=gpu:1"), 1),
    ("hadar: model=a3c steps=26 study=s", ("--gres=gpu:1",), 1),  # the first rung comes first
    ("hadar: model=a3c steps=26 study=s rungs=1", ("--array=0-7%2", "--gres=gpu:1"), 1),
    ("hadar: model=a3c steps=68719476735 study=s rungs=10 eta=16", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=68719476736 study=s rungs=10 eta=16",
     ("--array=0-1", "--gres=gpu:1"), 1),
    ("hadar: model=lm bs=5 steps=10000 fork=2 study=fork.ok mode=min metric=val_loss",
     ("--array=0-1", "--gres=gpu:2"), 2),
    ("hadar: model=a3c steps=1000 study=s rule=none rungs=0_2 eta=016",
     ("--array=0-1", "--gres=gpu:1"), 1),
    ("hadar: model=a3c steps=1000 study=-s", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s/t", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s rule=Sh", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s rule=bohb", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s rule=hyperband", ("--array=0-1", "--gres=gpu:1"), 1),
    ("hadar: model=a3c steps=1000 study=s rungs=0", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s rungs=11", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s rungs=4.0", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s eta=1", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s eta=17", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s eta=" + "9" * 50, ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s metric=a+b", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s mode=MAX", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s mode=", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s study=t", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 study=s Rule=sh", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 mode=x rule=sh", ("--array=0-1",), 1),  # rule: key order
    ("hadar: model=a3c steps=1000 eta=2", (), 1),
    ("hadar: model=a3c steps=1000 metric=loss", ("--array=0-1",), 1),
    ("hadar: share=x rule=x model=a3c steps=1", ("--array=0-1",), 1),
    ("hadar: model=a3c steps=1000 mode=x eta=x rungs=x study=s", (), 1),
    ("hadar: model=a3c steps=10", ("--array=0-1", "--gres=gpu:1"), 1),  # any job may be one
]


def python_decision(comment: str, gpus: int, array: bool = False) -> str | None:
    """None when accepted, else the message (``array``: a job array, sbatch --array)."""
    if not is_hadar_comment(comment):
        return None
    try:
        parse_hints(comment, gpus=gpus, array=array)
    except HintError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("comment, options, gpus", PARITY,
                         ids=[f"{i:02d}" for i in range(len(PARITY))])
def test_lua_decides_as_python(sub: Submitter, comment: str, options: tuple[str, ...],
                               gpus: int) -> None:
    expect = python_decision(comment, gpus, any(o.startswith("--array") for o in options))
    job_id, stderr = sub.sbatch(comment, *options, hold=True)
    if expect is None:
        assert job_id is not None, f"Lua refused what Python accepts: {stderr}"
        job = jobs(sub.cluster)[job_id]
        if is_hadar_comment(comment):  # submitted with --hold: the user's own hold
            # (no GPU asked: none written; the sidecar sets the count when it places the job)
            assert job.gres == ((Gres("gpu", None, gpus),) if options else ())
            assert mark(job.admin_comment) == USER_HELD_COMMENT
        else:
            assert job.admin_comment == ""
    else:
        assert job_id is None, f"Lua accepted what Python refuses: {expect}"
        assert f"sbatch: error: hadar: {expect}\n" in stderr, stderr
        assert "Batch job submission failed" in stderr
