"""Integration tests against a real Slurm: the dev cluster of ``slurm_conf/dev-cluster.sh``
(started once per test session by the ``dev_cluster`` fixture, see tests/slurm_cluster.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hadar_slurm.sidecar.observe import held_by_hadar
from hadar_slurm.slurm import (
    SlurmCommandError,
    commands,
    parse_scontrol_show,
    parse_sinfo_json,
)
from hadar_slurm.slurm.api import CliApi
from hadar_slurm.slurm.schedconf import SchedulerConfig, fork_warning
from tests.slurm_cluster import DevCluster, dev_script, jobs, nodes_conf, submit, wait_job


def test_nodes_idle_with_their_gpu_types(dev_cluster: DevCluster) -> None:
    nodes = {n.name: n for n in
             parse_sinfo_json(dev_cluster.runner.run(commands.sinfo_json()).stdout)}
    expect = nodes_conf()
    assert set(expect) == {"node1", "node2", "node3", "node4"}
    assert sorted(nodes) == sorted(expect)
    for name, (gpu_type, gpus) in expect.items():
        node = nodes[name]
        assert node.state == "IDLE" and node.state_flags == (), node
        assert (node.gpu_type, node.gpus, node.gpus_used) == (gpu_type, gpus, 0)
        assert gpu_type in node.features


def test_the_dev_cluster_starts_forks_at_once(dev_cluster: DevCluster) -> None:
    # hadare's forks start from the backfill scheduler only: the dev cluster runs it every
    # second (slurm_conf), and the sidecar reads that as it does at start
    sched = CliApi(dev_cluster.runner).scheduler_config()
    assert sched == SchedulerConfig("sched/backfill", 1)
    assert fork_warning(sched, 360.0) is None


def test_typed_constraint_job_runs_on_node2(dev_cluster: DevCluster, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    out = tmp_path / "job.out"
    job_id = submit(
        dev_cluster, wrap='echo "host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES"',
        gres="gpu:1", constraint="p100", job_name="hadar-it-p100", chdir=str(tmp_path),
        output=str(out), comment="test=p100")
    job = wait_job(dev_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=30)
    assert job.state == "COMPLETED", job
    assert job.node_names == ("node2",) and job.features == "p100"
    assert job.gres[0].count == 1 and job.comment == "test=p100"
    assert out.read_text().split() == ["host=node2", "gpus=0"]


def test_held_job_retargeted_then_released(dev_cluster: DevCluster, tmp_path: Path) -> None:
    # The form that works on 22.05 (SchedMD bug 17184): untyped GPUs plus a node feature; the
    # pending job is moved by NodeList+Features, then released.
    job_id = submit(dev_cluster, wrap="sleep 1", gres="gpu:2", constraint="v100", hold=True,
                    job_name="hadar-it-held", chdir=str(tmp_path), output="/dev/null")
    job = wait_job(dev_cluster, job_id, {"PENDING"}, timeout=10)
    assert job.held and job.node_names == (), job
    time.sleep(1)
    assert jobs(dev_cluster)[job_id].state == "PENDING"  # stays held

    dev_cluster.runner.run(commands.scontrol_update_job(
        job_id, {"NodeList": "node2", "Features": "p100", "AdminComment": "hadar:placed=node2"}))
    job = jobs(dev_cluster)[job_id]
    assert job.features == "p100" and job.admin_comment == "hadar:placed=node2" and job.held
    shown = parse_scontrol_show(
        dev_cluster.runner.run(commands.scontrol_show_job(job_id)).stdout)
    assert shown["ReqNodeList"] == "node2" and shown["JobState"] == "PENDING"

    dev_cluster.runner.run(commands.scontrol_release(job_id))
    job = wait_job(dev_cluster, job_id, {"RUNNING", "COMPLETED"}, timeout=30)
    assert job.node_names == ("node2",)
    assert wait_job(dev_cluster, job_id, {"COMPLETED"}, timeout=30).gpus_per_node == 2


def test_cancel_and_command_errors(dev_cluster: DevCluster, tmp_path: Path) -> None:
    job_id = submit(dev_cluster, wrap="sleep 300", gres="gpu:k80:1", chdir=str(tmp_path),
                    output="/dev/null")
    wait_job(dev_cluster, job_id, {"RUNNING"}, timeout=30)
    dev_cluster.runner.run(commands.scancel(job_id))
    assert wait_job(dev_cluster, job_id, {"CANCELLED"}, timeout=30).node_names == ("node3",)
    with pytest.raises(SlurmCommandError) as exc:
        dev_cluster.runner.run(commands.scontrol_release(999999))
    assert exc.value.returncode != 0 and "scontrol release 999999" in str(exc.value)
    assert "Invalid job id" in exc.value.stderr


def test_up_is_idempotent_and_status(dev_cluster: DevCluster) -> None:
    again = dev_script("up", dev_cluster.env, timeout=60)
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stderr
    assert again.stdout.strip() == f"export SLURM_CONF={dev_cluster.dir}/etc/slurm.conf"
    status = dev_script("status", dev_cluster.env, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "slurmctld" in status.stdout and "node4" in status.stdout



@pytest.mark.parametrize("traps_term", [False, True])
def test_requeue_hold_leaves_an_operator_hold(dev_cluster: DevCluster, tmp_path: Path,
                                              traps_term: bool) -> None:
    """``CliApi.requeue_hold`` (how the sidecar stops a job it moves) puts a running job back in
    the queue held by the operator (``JobHeldAdmin``, which the sidecar knows for its own), not
    with the user's hold of ``scontrol requeuehold``; the job does not start by itself, also
    when it ignores SIGTERM and ends only by Slurm's SIGKILL; released, it runs again."""
    wrap = "trap '' TERM; sleep 300 & wait; sleep 300" if traps_term else "sleep 300"
    job_id = submit(dev_cluster, wrap=wrap, gres="gpu:k80:1", chdir=str(tmp_path),
                    output="/dev/null", requeue=True)
    wait_job(dev_cluster, job_id, {"RUNNING"}, timeout=30)
    try:
        CliApi(dev_cluster.runner).requeue_hold(job_id)
        job = wait_job(dev_cluster, job_id, {"PENDING"}, timeout=60)
        assert job.held and job.state_reason == "JobHeldAdmin" and held_by_hadar(job), job
        time.sleep(3)
        job = jobs(dev_cluster)[job_id]
        assert job.state == "PENDING" and job.state_reason == "JobHeldAdmin", job
        dev_cluster.runner.run(commands.scontrol_release(job_id))
        dev_cluster.runner.run(commands.scontrol_update_job(job_id, {"StartTime": "now"}))
        assert wait_job(dev_cluster, job_id, {"RUNNING"}, timeout=60).node_names == ("node3",)
    finally:
        dev_cluster.runner.run(commands.scancel(job_id), check=False)
