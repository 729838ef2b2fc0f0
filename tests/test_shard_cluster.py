"""Two jobs on one GPU through gres/shard, on the real dev cluster (docs/sharing.md): a pair
placed by :func:`hadar_slurm.sidecar.shard.place_pair` runs at once on the GPU it foretold
(both jobs see that GPU), a job asking for whole GPUs never gets the half-shared one, and a pair
that first fit would split is refused before anything changes.

The tests' shard cluster (the fixture ``shard_cluster``) has 2 shards per GPU.  The pair jobs are
submitted held as a sharing job can be on each release: on 22.05, which cannot turn a GPU
request into shards, as ``--gres=shard:2`` (one whole GPU's shards); on 24.11 and later as
job_submit.lua leaves a hadar job (``--gres=gpu:1`` and a feature of another GPU type)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hadar_slurm.sidecar.shard import (
    ShardError,
    job_gres_on,
    job_shards_on,
    node_gpus,
    pair_commands,
    place_pair,
    shard_holders,
    shards_per_gpu,
)
from hadar_slurm.slurm import SlurmCommandError, SlurmJob, SlurmNode, commands, parse_sinfo_json
from hadar_slurm.slurm.parse import parse_gres_use
from hadar_slurm.slurm.version import SlurmVersion, parse_release
from tests.slurm_cluster import DevCluster, jobs, submit, wait_job

NODE = "node1"  # 4 GPUs, 4 CPUs: a pair takes 2 CPUs, and the whole-GPU jobs' 1 is left
BUSY = {"RUNNING", "CONFIGURING", "COMPLETING", "PENDING", "SUSPENDED"}


def version_of(cluster: DevCluster) -> SlurmVersion:
    return parse_release(cluster.version, source="scontrol version")


def node_of(cluster: DevCluster, name: str = NODE) -> SlurmNode:
    out = cluster.runner.run(commands.sinfo_json())
    return next(n for n in parse_sinfo_json(out.stdout) if n.name == name)


@pytest.fixture
def submitted(shard_cluster: DevCluster) -> Iterator[list[int]]:
    """Job ids a test submitted to the shard cluster; those still queued are cancelled."""
    ids: list[int] = []
    yield ids
    if ids:
        shard_cluster.runner.run(commands.scancel(ids), check=False)


@pytest.fixture
def shard_node(shard_cluster: DevCluster) -> SlurmNode:
    """node1 with shards and nothing on it (waits up to 60 s for earlier tests' jobs to end)."""
    node = node_of(shard_cluster)
    if shards_per_gpu(node) < 2:
        pytest.fail("the shard cluster has no shards (tests/slurm_cluster.py SHARDS_PER_GPU)")
    end = time.monotonic() + 60
    while any(NODE in j.node_names and j.state in BUSY for j in jobs(shard_cluster).values()):
        if time.monotonic() > end:
            pytest.fail(f"{NODE} still has jobs after 60 s")
        time.sleep(0.5)
    return node_of(shard_cluster)


def held_pair(cluster: DevCluster, submitted: list[int], tmp_path: Path) -> tuple[int, int]:
    """Two held jobs that print the GPUs they see, then sleep."""
    old = (cluster.version.split(".")[:2]) == ["22", "05"]
    wrap = ('echo "cuda=$CUDA_VISIBLE_DEVICES job_gpus=$SLURM_JOB_GPUS '
            'shards=$SLURM_SHARDS_ON_NODE"; sleep 60')
    ids = []
    for k in range(2):
        ids.append(submit(cluster, wrap=wrap, job_name=f"hadar-shard-{k}", hold=True,
                          gres="shard:2" if old else "gpu:1",
                          constraint=None if old else "p100",
                          output=str(tmp_path / "%j.out"), chdir=str(tmp_path),
                          time_limit="5"))
        submitted.append(ids[-1])
    return ids[0], ids[1]


def printed(path: Path, timeout: float = 30) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and "cuda=" in path.read_text():
            return path.read_text().strip()
        time.sleep(0.3)
    raise AssertionError(f"{path} printed nothing in {timeout:g} s")


def stays_pending(cluster: DevCluster, job_id: int, seconds: float = 8) -> SlurmJob:
    """The job is still pending after several scheduling passes (sched_interval=2,
    bf_interval=1)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        job = jobs(cluster)[job_id]
        assert job.state == "PENDING", (job, job.gres_detail)
        time.sleep(1)
    return jobs(cluster)[job_id]


def test_pair_shares_one_gpu_and_whole_gpus_keep_out(
        shard_cluster: DevCluster, shard_node: SlurmNode, submitted: list[int],
        tmp_path: Path) -> None:
    a, b = held_pair(shard_cluster, submitted, tmp_path)
    now = jobs(shard_cluster)
    gpu = place_pair(shard_cluster.runner, now[a], now[b], shard_node, list(now.values()),
                     version_of(shard_cluster))
    assert gpu == 0  # (the node is empty: first fit)
    ja = wait_job(shard_cluster, a, {"RUNNING"}, 60)
    jb = wait_job(shard_cluster, b, {"RUNNING"}, 60)
    # both on node1, one shard each, of the same GPU; and each job sees that GPU
    assert ja.node_names == jb.node_names == (NODE,)
    assert job_shards_on(ja, NODE) == job_shards_on(jb, NODE) == {gpu: 1}, (
        ja.gres_detail, jb.gres_detail)
    for j in (a, b):
        assert printed(tmp_path / f"{j}.out") == f"cuda={gpu} job_gpus={gpu} shards=1"
    now = jobs(shard_cluster)
    assert shard_holders(NODE, now.values()) == {gpu: (a, b)}
    node = node_of(shard_cluster)
    assert [g.free for g in node_gpus(node, now.values())] == [0, 2, 2, 2]
    shard_use = [u for u in parse_gres_use(node.gres_used_text) if u.name == "shard"]
    assert shard_use and shard_use[0].indices == (gpu,)
    detail = shard_cluster.runner.run(commands.scontrol_show_job_details(a)).stdout
    assert f"Nodes={NODE} " in detail and "GRES=shard:1(" in detail

    # a job asking for all 4 GPUs of node1 waits: the shared GPU is not a whole one to give
    whole = submit(shard_cluster, wrap="sleep 30", gres="gpu:4", nodelist=NODE,
                   output="/dev/null", time_limit="2")
    submitted.append(whole)
    assert stays_pending(shard_cluster, whole).state_reason in ("Resources", "Priority")
    shard_cluster.runner.run(commands.scancel(whole))
    # three whole GPUs it gets: the three the pair does not share
    three = submit(shard_cluster, wrap="sleep 30", gres="gpu:3", nodelist=NODE,
                   output="/dev/null", time_limit="2")
    submitted.append(three)
    j3 = wait_job(shard_cluster, three, {"RUNNING"}, 60)
    (use,) = [u for u in job_gres_on(j3, NODE) if u.name == "gpu"]
    assert set(use.indices) == {0, 1, 2, 3} - {gpu}
    # and the pair's GPU has no shard left for a third job, nor any other GPU now
    third = submit(shard_cluster, wrap="sleep 30", gres="shard:1", nodelist=NODE,
                   output="/dev/null", time_limit="2")
    submitted.append(third)
    stays_pending(shard_cluster, third, 5)


def test_pair_refused_where_first_fit_would_split_it(
        shard_cluster: DevCluster, shard_node: SlurmNode, submitted: list[int],
        tmp_path: Path) -> None:
    # one shard job alone on GPU 0: a pair's first job would take GPU 0's last shard and the
    # second GPU 1, so no pair may go to node1 now
    alone = submit(shard_cluster, wrap="sleep 60", gres="shard:1", nodelist=NODE,
                   output="/dev/null", time_limit="2")
    submitted.append(alone)
    assert job_shards_on(wait_job(shard_cluster, alone, {"RUNNING"}, 60), NODE) == {0: 1}
    a, b = held_pair(shard_cluster, submitted, tmp_path)
    now = jobs(shard_cluster)
    before = {j: now[j] for j in (a, b)}
    with pytest.raises(ShardError, match=r"free shards by GPU \{0: 1, 1: 2, 2: 2, 3: 2\}"):
        place_pair(shard_cluster.runner, now[a], now[b], node_of(shard_cluster),
                   list(now.values()), version_of(shard_cluster))
    after = jobs(shard_cluster)
    for j in (a, b):  # nothing was changed
        assert after[j].held and after[j].gres == before[j].gres
        assert after[j].required_nodes == before[j].required_nodes


def test_gpu_request_to_shards_by_release(
        shard_cluster: DevCluster, shard_node: SlurmNode, submitted: list[int],
        tmp_path: Path) -> None:
    """24.11+ rewrite a held job's GPU request into shards (what place_pair does with a hadar
    job); 22.05 refuses, and place_pair says so before asking it."""
    job_id = submit(shard_cluster, wrap="sleep 1", gres="gpu:1", constraint="v100", hold=True,
                    output="/dev/null", time_limit="2")
    submitted.append(job_id)
    version = version_of(shard_cluster)
    update = commands.scontrol_update_job(job_id, {"TresPerNode": "gres:shard:1"})
    if (version.major, version.minor) <= (22, 5):
        with pytest.raises(SlurmCommandError, match="Invalid generic resource"):
            shard_cluster.runner.run(update)
        other = submit(shard_cluster, wrap="sleep 1", gres="gpu:1", hold=True,
                       output="/dev/null", time_limit="2")
        submitted.append(other)
        now = jobs(shard_cluster)
        with pytest.raises(ShardError, match="cannot turn that into shards"):
            pair_commands(now[job_id], now[other], shard_node, list(now.values()), version)
    else:
        shard_cluster.runner.run(update)
        shown = shard_cluster.runner.run(commands.scontrol_show_job(job_id)).stdout
        assert "TresPerNode=gres/shard:1" in shown
        assert jobs(shard_cluster)[job_id].gres[0].name == "shard"
