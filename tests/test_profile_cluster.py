"""``profile --slurm`` on the real dev cluster: one profiling job per GPU type (node1 v100,
node2 p100, node3 k80, node4 a100; fake GPUs, so the jobs train on the CPU), each recorded as a
measured rate under its type in the submitter's store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hadar_slurm.rates.store import ThroughputStore
from hadar_slurm.slurm import commands, parse_squeue_json
from tests.slurm_cluster import DevCluster, nodes_conf

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent


def profile_cli(cluster: DevCluster, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m hadar_slurm.cli.nvml profile --slurm ARGS`` against the dev cluster."""
    env = {**os.environ, "SLURM_CONF": cluster.runner.slurm_conf,
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "hadar_slurm.cli.nvml", "profile", "--slurm", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=240, check=False)


def test_profile_slurm_records_one_entry_per_gpu_type(
    dev_cluster: DevCluster, submitted: list[int], tmp_path: Path,
) -> None:
    tmp_path.chmod(0o777)  # the jobs write their output here
    db, work = tmp_path / "throughputs.db", tmp_path / "work"
    proc = profile_cli(dev_cluster, "--model", "digits", "--batch-size", "32", "--warmup", "3",
                       "--seconds", "1", "--threads", "1", "--db", str(db), "--workdir",
                       str(work), "--timeout", "180", "--json", cwd=tmp_path)
    rows = json.loads(proc.stdout) if proc.stdout.startswith("[") else []
    submitted.extend(r["job_id"] for r in rows if r["job_id"] is not None)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"

    types = sorted({kind for kind, _gpus in nodes_conf().values()})
    assert [r["gpu_type"] for r in rows] == types  # a100, k80, p100, v100
    for row in rows:
        assert row["state"] == "COMPLETED" and row["recorded"], row
        result = row["result"]
        assert result["device"] == "cpu" and result["timed_seconds"] >= 1.0
        assert result["warmup_iters"] == 3 and result["steps_per_second"] > 0
        assert (work / f"profile-{row['gpu_type']}-{row['job_id']}.out").is_file()

    with ThroughputStore(db) as store:
        entries = {e.gpu_type: e for e in store.entries()}
    assert sorted(entries) == types
    for row in rows:
        entry = entries[row["gpu_type"]]
        assert (entry.job_type, entry.scale_factor, entry.source) == (
            "Digits (batch size 32)", 1, "measured")
        assert entry.rate == pytest.approx(row["result"]["steps_per_second"])

    # Each job asked Slurm for one GPU of its type, and ran on a node of that type.
    listed = {j.job_id: j for j in parse_squeue_json(
        dev_cluster.runner.run(commands.squeue_json()).stdout)}
    by_node = nodes_conf()
    for row in rows:
        job = listed[row["job_id"]]
        assert job.gpu_type == row["gpu_type"] and job.gpus_per_node == 1
        assert [by_node[n][0] for n in job.node_names] == [row["gpu_type"]]


def test_profile_slurm_type_without_a_big_enough_node(
    dev_cluster: DevCluster, tmp_path: Path,
) -> None:
    """node3 has 2 k80s: a 4-GPU profile of k80 is not submitted, and the exit status says
    that some type has no result."""
    tmp_path.chmod(0o777)
    db = tmp_path / "throughputs.db"
    proc = profile_cli(dev_cluster, "--model", "digits", "--batch-size", "32", "--gpus", "4",
                       "--gpu-type", "k80", "--iters", "5", "--db", str(db), "--workdir",
                       str(tmp_path / "work"), cwd=tmp_path)
    assert proc.returncode == 1, f"{proc.stdout}\n{proc.stderr}"
    assert "k80: not submitted: no up node has 4 k80 GPUs" in proc.stdout
    with ThroughputStore(db) as store:
        assert store.entries() == []


def test_profile_slurm_failed_job_is_reported(
    dev_cluster: DevCluster, submitted: list[int], tmp_path: Path,
) -> None:
    """A job that cannot profile (CUDA asked for on a node without it) ends FAILED; its error
    line comes back and nothing is recorded."""
    tmp_path.chmod(0o777)
    db = tmp_path / "throughputs.db"
    proc = profile_cli(dev_cluster, "--model", "digits", "--batch-size", "32", "--device", "cuda",
                       "--gpu-type", "v100", "--iters", "5", "--db", str(db), "--workdir",
                       str(tmp_path / "work"), "--timeout", "120", "--json", cwd=tmp_path)
    rows = json.loads(proc.stdout) if proc.stdout.startswith("[") else []
    submitted.extend(r["job_id"] for r in rows if r["job_id"] is not None)
    assert proc.returncode == 1, f"{proc.stdout}\n{proc.stderr}"
    (row,) = rows
    assert row["gpu_type"] == "v100" and row["state"] == "FAILED" and not row["recorded"]
    assert row["error"].startswith("exit status 2: no JSON result")
    assert "CUDA is not available here" in row["error"]
    with ThroughputStore(db) as store:
        assert store.entries() == []
