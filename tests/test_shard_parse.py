"""Shards in Slurm's output, on real captures of 22.05.8, 24.11.5 and 26.05.5
(``tests/data/slurm/shard``, README.md there says how they were made), and the pure part of the
pair placement (:mod:`hadar_slurm.sidecar.shard`).  No Slurm needed.

Every capture shows the same moment of a dev cluster with 2 shards per GPU: on node4 (8 a100),
jobs 1 and 2 hold one shard each of GPU 0, job 3 holds GPU 1 whole (``--gres=gpu:1``) and job 4
holds both shards of GPU 2 (``--gres=shard:2``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from hadar_slurm.sidecar.shard import (
    GpuShards,
    ShardError,
    busy_gpus,
    first_fit,
    gres_prefix,
    job_shards_on,
    node_gpus,
    pair_commands,
    pair_gpu,
    shard_holders,
    shards_per_gpu,
    shared_gpu,
)
from hadar_slurm.slurm import Gres, SlurmJob, SlurmNode, commands
from hadar_slurm.slurm.parse import (
    GresUse,
    parse_gres_use,
    parse_scontrol_show,
    parse_sinfo_json,
    parse_squeue_json,
)
from hadar_slurm.slurm.version import SlurmVersion, parse_release

DATA = Path(__file__).resolve().parent / "data" / "slurm" / "shard"
VERSIONS = ("22.05", "24.11", "26.05")
V22, V24 = parse_release("22.05.8", source="test"), parse_release("24.11.5", source="test")


def load(name: str) -> str:
    return (DATA / name).read_text()


def captured(v: str) -> tuple[dict[int, SlurmJob], dict[str, SlurmNode]]:
    jobs = {j.job_id: j for j in parse_squeue_json(load(f"{v}-squeue.json"))}
    nodes = {n.name: n for n in parse_sinfo_json(load(f"{v}-sinfo.json"))}
    return jobs, nodes


# ------------------------------------------------------------------ the captures
@pytest.mark.parametrize("v", VERSIONS)
def test_jobs_shards_by_gpu(v: str) -> None:
    jobs, _ = captured(v)
    slash = "gres:" if v == "22.05" else "gres/"
    assert jobs[1].gres == jobs[2].gres == (Gres("shard", None, 1),)
    assert jobs[1].gpus_per_node == 0  # (a shard is not a GPU to the rest of the sidecar)
    assert jobs[4].gres == (Gres("shard", None, 2),)
    assert jobs[3].gres == (Gres("gpu", None, 1),) and jobs[3].gpus_per_node == 1
    assert {j.job_id: j.node_names for j in jobs.values()} == dict.fromkeys(range(1, 5),
                                                                            ("node4",))
    # squeue --json prints each job's GPU indices on every release (shards: 22.05 the index,
    # 24.11+ the job's share of each GPU)
    if v == "22.05":
        assert jobs[1].gres_detail == ("shard:1(IDX:0)",)
        assert jobs[4].gres_detail == ("shard:2(IDX:2)",)
    else:
        assert jobs[1].gres_detail == ("shard:1(1/2,0/2,0/2,0/2,0/2,0/2,0/2,0/2)",)
        assert jobs[4].gres_detail == ("shard:2(0/2,0/2,2/2,0/2,0/2,0/2,0/2,0/2)",)
    assert jobs[3].gres_detail == ("gpu:a100:1(IDX:1)",)
    assert [job_shards_on(jobs[j], "node4") for j in (1, 2, 3, 4)] == [
        {0: 1}, {0: 1}, {}, {2: 2}]
    assert shared_gpu(jobs[1], jobs[2], "node4") == 0
    assert shared_gpu(jobs[1], jobs[4], "node4") is None
    assert load(f"{v}-squeue-format-b.txt").split() == [
        "JOBID", "STATE", "NODELIST", "TRES_PER_NODE",
        "1", "RUNNING", "node4", f"{slash}shard:1", "2", "RUNNING", "node4", f"{slash}shard:1",
        "3", "RUNNING", "node4", f"{slash}gpu:1", "4", "RUNNING", "node4", f"{slash}shard:2"]


@pytest.mark.parametrize("v", VERSIONS)
def test_nodes_shards(v: str) -> None:
    jobs, nodes = captured(v)
    node4 = nodes["node4"]
    # the shards take their GPU's type; GPUs are counted as before
    assert node4.gres == (Gres("gpu", "a100", 8), Gres("shard", "a100", 16))
    assert node4.gpus == 8 and node4.gpus_used == 1 and shards_per_gpu(node4) == 2
    assert shards_per_gpu(nodes["node3"]) == 2 and nodes["node3"].gpus == 2
    gpu, shard = parse_gres_use(node4.gres_used_text)
    assert gpu == GresUse("gpu", "a100", 1, ((1, None),))
    if v == "22.05":
        # which GPUs have shards in use, and a count that is not the shards' (4 are used)
        assert shard == GresUse("shard", "a100", 2, ((0, None), (2, None)))
    else:
        whole = (1,) if v == "26.05" else ()  # 26.05 marks the GPU given whole with "-"
        assert shard == GresUse("shard", "a100", 4, ((0, 2), (2, 2)), (2,) * 8, whole)
    # what the sidecar reads: every GPU from the jobs' gres_detail, the same on each release
    assert node_gpus(node4, jobs.values()) == (
        GpuShards(0, 2, 2), GpuShards(1, 2, 0, whole=True), GpuShards(2, 2, 2),
        *(GpuShards(i, 2) for i in range(3, 8)))
    assert shard_holders("node4", jobs.values()) == {0: (1, 2), 2: (4,)}
    # the node's own gres_used says which GPUs are taken, shards included (gpus_used does not)
    assert busy_gpus(node4) == {0, 1, 2} and busy_gpus(nodes["node1"]) == frozenset()
    assert pair_gpu(node_gpus(node4, jobs.values())) == 3
    idle = node_gpus(nodes["node1"], jobs.values())
    assert idle == tuple(GpuShards(i, 2) for i in range(4))


@pytest.mark.parametrize("v", VERSIONS)
def test_scontrol_show_shards(v: str) -> None:
    for name in (f"{v}-scontrol-show-job-d-shard.txt",
                 f"{v}-scontrol-show-job-d-oneliner-shard.txt"):
        job = parse_scontrol_show(load(name))
        assert job["JobId"] == "1" and job["JOB_GRES"] == "shard:1", name
        assert job["Nodes"] == "node4"
        (use,) = parse_gres_use(job["GRES"])
        assert (use.name, use.count, use.indices) == ("shard", 1, (0,)), name
    gpu = parse_scontrol_show(load(f"{v}-scontrol-show-job-d-gpu.txt"))
    assert parse_gres_use(gpu["GRES"]) == (GresUse("gpu", "a100", 1, ((1, None),)),)
    for name in (f"{v}-scontrol-show-node-d.txt", f"{v}-scontrol-show-node-oneliner.txt"):
        node = parse_scontrol_show(load(name))
        assert node["Gres"] == "gpu:a100:8,shard:a100:16", name
    used = parse_scontrol_show(load(f"{v}-scontrol-show-node-d.txt"))["GresUsed"]
    sinfo_used = captured(v)[1]["node4"].gres_used_text
    assert used == sinfo_used
    # sinfo -O GresUsed prints the same, cut to its column width
    line = next(x for x in load(f"{v}-sinfo-gresused.txt").splitlines()
                if x.startswith("node4"))
    assert sinfo_used.startswith(line.split()[-1])


def test_parse_gres_use_shapes() -> None:
    assert parse_gres_use("") == ()
    assert parse_gres_use("gpu:v100:0(IDX:N/A),shard:v100:0(IDX:N/A)") == (
        GresUse("gpu", "v100", 0, ()), GresUse("shard", "v100", 0, ()))
    assert parse_gres_use("gpu:a100:6(IDX:1,3-5)")[0].indices == (1, 3, 4, 5)
    assert parse_gres_use("shard:v100:3(2/2,1/2,0/2,0/2)") == (
        GresUse("shard", "v100", 3, ((0, 2), (1, 1)), (2, 2, 2, 2)),)
    assert parse_gres_use("gpu:v100:4(S:0-1)") == (GresUse("gpu", "v100", 4, ()),)
    with pytest.raises(Exception, match="cannot read"):
        parse_gres_use("shard:1(1/2,x/2)")


# ------------------------------------------------------------------ choosing the GPU
def gpus(*free: int | str, total: int = 2) -> tuple[GpuShards, ...]:
    """GPUs by their free shards; "w": given whole."""
    return tuple(GpuShards(i, total, 0, True) if f == "w" else GpuShards(i, total, total - int(f))
                 for i, f in enumerate(free))


def test_first_fit_is_the_lowest_index_with_room() -> None:
    # as Slurm did on every release: a half-used GPU 1 does not draw a job from a free GPU 0
    assert first_fit(gpus(2, 1, 2), 1) == 0
    assert first_fit(gpus("w", 1, 2), 1) == 1
    assert first_fit(gpus(1, 1, 2), 2) == 2  # a job's shards come from one GPU
    assert first_fit(gpus("w", 0), 1) is None


def test_pair_gpu() -> None:
    assert pair_gpu(gpus(2, 2)) == 0
    assert pair_gpu(gpus("w", 0, 2)) == 2
    assert pair_gpu(gpus(1, 2)) is None  # the first gets GPU 0's last shard, the second GPU 1
    assert pair_gpu(gpus(0, 1)) is None
    assert pair_gpu(gpus(4, 4, total=4), 2) == 0
    assert pair_gpu(gpus(3, 4, total=4), 2) is None


def job(job_id: int, gres: tuple[Gres, ...], *, state: str = "PENDING",
        reason: str = "JobHeldUser", node: str = "", detail: tuple[str, ...] = ()) -> SlurmJob:
    return SlurmJob(job_id=job_id, name="j", user="u", state=state, state_flags=(),
                    state_reason=reason, partition="gpu", nodes=node,
                    node_names=(node,) if node else (), gres=gres, features="", comment="",
                    admin_comment="", priority=1, submit_time=None, start_time=None,
                    time_limit_min=None, gres_detail=detail)


def node(name: str = "node1", n: int = 4, shards: int = 2) -> SlurmNode:
    gres = (Gres("gpu", "v100", n),) + ((Gres("shard", "v100", n * shards),) if shards else ())
    return SlurmNode(name=name, state="IDLE", state_flags=(), gres=gres, gres_used=(),
                     features=("v100",), active_features=("v100",), cpus=4, alloc_cpus=0,
                     real_memory_mb=4000, partitions=("gpu",))


@pytest.mark.parametrize(("version", "spelled"), [(V22, "gres:"), (V24, "gres/")])
def test_pair_commands(version: SlurmVersion, spelled: str) -> None:
    a, b = job(7, (Gres("shard", None, 2),)), job(8, ())
    running = job(5, (Gres("gpu", None, 1),), state="RUNNING", reason="None", node="node1",
                  detail=("gpu:v100:1(IDX:0)",))
    gpu, argvs = pair_commands(a, b, node(), [a, b, running], version)
    assert gpu == 1 and gres_prefix(version) == spelled
    fields = {"NumNodes": "1", "NodeList": "node1", "TresPerNode": f"{spelled}shard:1",
              "Features": "v100"}
    assert argvs == [commands.scontrol_update_job(7, fields),
                     commands.scontrol_update_job(8, fields),
                     ["scontrol", "release", "7,8"]]


def test_pair_commands_refusals() -> None:
    a, b = job(7, (Gres("gpu", None, 1),)), job(8, (Gres("gpu", None, 1),))
    assert pair_commands(a, b, node(), [a, b], V24)[0] == 0  # 24.11+: GPUs become shards
    with pytest.raises(ShardError, match="cannot turn that into shards"):
        pair_commands(a, b, node(), [a, b], V22)
    with pytest.raises(ShardError, match="not pending and held"):
        pair_commands(job(7, (), reason="None"), b, node(), [], V24)
    with pytest.raises(ShardError, match="two jobs"):
        pair_commands(a, a, node(), [a], V24)
    with pytest.raises(ShardError, match="1 shards per GPU"):
        pair_commands(a, b, node(shards=1), [a, b], V24)
    half = job(5, (Gres("shard", None, 1),), state="RUNNING", reason="None", node="node1",
               detail=("shard:1(1/2,0/2,0/2,0/2)",))
    with pytest.raises(ShardError, match=r"free shards by GPU \{0: 1, 1: 2"):
        pair_commands(a, b, node(), [a, b, half], V24)
    waiting = job(6, (Gres("shard", None, 1),), reason="Priority")
    with pytest.raises(ShardError, match=r"shard jobs \[6\] wait"):
        pair_commands(a, b, node(), [a, b, waiting], V24)


def test_render_shards(tmp_path: Path) -> None:
    """slurm_conf/render.py: shards only when asked for; without, the files of before."""
    spec = importlib.util.spec_from_file_location(
        "slurm_conf_render_shard",
        Path(__file__).resolve().parent.parent / "slurm_conf" / "render.py")
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = render  # dataclasses look their module up
    spec.loader.exec_module(render)
    nodes = render.read_nodes()
    plain = render.render(render.local_target(str(tmp_path), 17900, lua=False), nodes)
    assert "GresTypes=gpu\n" in plain["slurm.conf"] and "Name=shard" not in plain["gres.conf"]
    assert ",shard:" not in plain["slurm.conf"]
    sharded = render.render(render.local_target(str(tmp_path), 17900, lua=False, shards=2),
                            nodes)
    conf, gres = sharded["slurm.conf"], sharded["gres.conf"]
    assert "GresTypes=gpu,shard\n" in conf
    assert " Gres=gpu:v100:4,shard:8 " in conf and " Gres=gpu:k80:2,shard:4 " in conf
    assert (f"NodeName=node3 Name=shard Count=2 File={tmp_path}/dev/node3/nvidia1"
            in gres.splitlines())
    assert sum(line.count("Name=shard") for line in gres.splitlines()) == sum(
        n.gpus for n in nodes)
    # everything else is as without shards
    assert [x for x in conf.splitlines() if "Gres" not in x] == [
        x for x in plain["slurm.conf"].splitlines() if "Gres" not in x]
    with pytest.raises(render.ConfigError, match="shards per GPU"):
        render.local_target(str(tmp_path), 17900, lua=False, shards=-1)


def test_commands() -> None:
    assert commands.scontrol_release_jobs([3, 4]) == ["scontrol", "release", "3,4"]
    with pytest.raises(ValueError):
        commands.scontrol_release_jobs([])
    assert commands.scontrol_show_job_details(3) == [
        "scontrol", "--details", "--oneliner", "show", "job", "3"]
