"""The parsers on real output of Slurm 22.05.8, 24.11.5 and 26.05.5 (``tests/data/slurm``, where
README.md says how each file was captured): for each version and each shape, the values that
the file shows.  No Slurm needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hadar_slurm.sidecar.observe import launch_failed
from hadar_slurm.slurm import (
    Gres,
    SlurmJob,
    SlurmMeta,
    SlurmNode,
    SlurmParseError,
    json_meta,
    parse_gres,
    parse_scontrol_records,
    parse_scontrol_show,
    parse_sinfo_json,
    parse_squeue_json,
)
from hadar_slurm.slurm.parse import FINAL_STATES, LAUNCH_FAILED_HELD

DATA = Path(__file__).resolve().parent / "data" / "slurm"


def load(name: str) -> str:
    return (DATA / name).read_text()


def jobs_of(name: str) -> dict[int, SlurmJob]:
    return {j.job_id: j for j in parse_squeue_json(load(name))}


def nodes_of(name: str) -> dict[str, SlurmNode]:
    return {n.name: n for n in parse_sinfo_json(load(name))}


# The job documents: squeue --json (and scontrol show job --json, the same shape), the job ids
# each lists.  24.11 and 26.05 leave finished jobs out unless --states=all (job 5 completed).
NINE = (1, 2, 3, 4, 5, 6, 7, 8, 9)
LIVE = (1, 2, 3, 4, 6, 7, 8, 9)
JOB_DOCS = {
    "squeue-22.05.json": (1, 2, 3, 4, 5, 6),
    "squeue-hetjob-22.05.json": (1, 2, 3, 4, 5, 6, 7),
    "squeue-24.11.json": LIVE,
    "squeue-24.11-v0.0.41.json": LIVE,
    "squeue-24.11-v0.0.40.json": LIVE,
    "scontrol-show-job-24.11.json": NINE,
    "squeue-24.11-states-all-after-actions.json": (*NINE, 10, 11, 12, 13),
    "squeue-26.05.json": LIVE,
    "squeue-26.05-states-all.json": NINE,
}
DOCS_2411 = [n for n in JOB_DOCS if "24.11" in n]
DOCS_2605 = [n for n in JOB_DOCS if "26.05" in n]
#: the 24.11 documents taken before the actions (jobs 1-9 as submitted)
BEFORE_2411 = [n for n in DOCS_2411 if "after-actions" not in n]


# ------------------------------------------------------------------ meta


META = [
    ("squeue-22.05.json", "22.05.8", 22, 5, ""),
    ("squeue-hetjob-22.05.json", "22.05.8", 22, 5, ""),
    ("sinfo-22.05.json", "22.05.8", 22, 5, ""),
    ("squeue-24.11.json", "24.11.5", 24, 11, "v0.0.42"),
    ("squeue-24.11-v0.0.41.json", "24.11.5", 24, 11, "v0.0.41"),
    ("squeue-24.11-v0.0.40.json", "24.11.5", 24, 11, "v0.0.40"),
    ("squeue-24.11-states-all-after-actions.json", "24.11.5", 24, 11, "v0.0.42"),
    ("scontrol-show-job-24.11.json", "24.11.5", 24, 11, "v0.0.42"),
    ("sinfo-24.11.json", "24.11.5", 24, 11, "v0.0.42"),
    ("sinfo-24.11-v0.0.41.json", "24.11.5", 24, 11, "v0.0.41"),
    ("sinfo-24.11-v0.0.40.json", "24.11.5", 24, 11, "v0.0.40"),
    ("sinfo-24.11-after-actions.json", "24.11.5", 24, 11, "v0.0.42"),
    ("sinfo-24.11-drained.json", "24.11.5", 24, 11, "v0.0.42"),
    ("sinfo-24.11-identical-nodes.json", "24.11.5", 24, 11, "v0.0.42"),
    ("sinfo-24.11-identical-nodes-idle.json", "24.11.5", 24, 11, "v0.0.42"),
    ("squeue-26.05.json", "26.05.5", 26, 5, "v0.0.45"),
    ("squeue-26.05-states-all.json", "26.05.5", 26, 5, "v0.0.45"),
    ("sinfo-26.05.json", "26.05.5", 26, 5, "v0.0.45"),
    ("squeue-24.11-special-exit.json", "24.11.5", 24, 11, "v0.0.42"),
    ("squeue-26.05-special-exit.json", "26.05.5", 26, 5, "v0.0.45"),
]


@pytest.mark.parametrize(("name", "release", "major", "minor", "parser"), META)
def test_json_meta(name: str, release: str, major: int, minor: int, parser: str) -> None:
    meta = json_meta(load(name))
    assert meta == SlurmMeta(release=release, major=major, minor=minor, data_parser=parser)
    assert json_meta(json.loads(load(name))) == meta  # a decoded document too


def test_every_json_capture_has_its_meta_tested() -> None:
    assert {p.name for p in DATA.glob("*.json")} == {m[0] for m in META}


def test_json_meta_fallbacks_and_errors() -> None:
    # release alone (no version object), and version alone (no release)
    assert json_meta({"meta": {"slurm": {"release": "25.05.1"}}}) == SlurmMeta(
        "25.05.1", 25, 5, "")
    assert json_meta({"meta": {"slurm": {"version": {"major": "26", "minor": "05",
                                                     "micro": "5"}},
                               "plugin": {"data_parser": "data_parser/v0.0.45"}}}) == SlurmMeta(
        "26.05.5", 26, 5, "v0.0.45")
    # a document that reports errors still says who wrote it
    doc = json.loads(load("squeue-24.11.json"))
    doc["errors"] = [{"description": "Unable to contact slurm controller"}]
    assert json_meta(doc).release == "24.11.5"
    with pytest.raises(SlurmParseError, match="field 'meta'"):
        json_meta('{"jobs": []}')
    with pytest.raises(SlurmParseError, match="field 'version'"):
        json_meta({"meta": {"slurm": {}}})
    with pytest.raises(SlurmParseError, match="field 'major'"):
        json_meta({"meta": {"slurm": {"version": {"major": "x", "minor": "11"}}}})
    with pytest.raises(SlurmParseError, match="field 'release'"):
        json_meta({"meta": {"Slurm": {"release": "next"}}})
    with pytest.raises(SlurmParseError, match="not valid JSON"):
        json_meta("squeue: error: oops")


# ------------------------------------------------------------------ squeue: every document


@pytest.mark.parametrize("name", list(JOB_DOCS))
def test_job_ids_and_what_every_job_shares(name: str) -> None:
    jobs = jobs_of(name)
    assert tuple(jobs) == JOB_DOCS[name]
    for job in jobs.values():
        assert (job.user, job.user_id, job.group_id, job.partition) == ("root", 0, 0, "gpu")
        assert (job.account, job.qos, job.mem_per_node_mb) == ("", "", None)
        assert (job.mem_per_cpu_mb, job.cpus_per_node) == (256, 1)  # DefMemPerCPU, 1 CPU
        assert job.state_flags == ()  # a list job_state with no flags in any capture
        assert job.submit_time is not None and job.submit_time > 1_795_000_000


# ------------------------------------------------------------------ squeue: kinds of job

# (document, job id, submit time, start time) of the running train-v100 job (--gres=gpu:v100:2)
TYPED = [("squeue-22.05.json", 1, 1795325640, 1795325640, "hadar:job=7")] + [
    (n, 9, 1795463722, 1795463723, "note:job=7") for n in BEFORE_2411] + [
    (n, 9, 1795464651, 1795464652, "note:job=7") for n in DOCS_2605]


@pytest.mark.parametrize(("name", "job_id", "submit", "start", "comment"), TYPED)
def test_running_typed_gpu_job(name: str, job_id: int, submit: int, start: int,
                               comment: str) -> None:
    job = jobs_of(name)[job_id]
    assert (job.name, job.state, job.state_reason) == ("train-v100", "RUNNING", "None")
    assert job.nodes == "node1" and job.node_names == ("node1",)
    assert job.gres == (Gres("gpu", "v100", 2),)  # gres:gpu:v100:2 / gres/gpu:v100:2
    assert (job.gpu_type, job.gpus_per_node) == ("v100", 2)
    assert job.comment == comment and job.admin_comment == "" and job.features == ""
    assert (job.submit_time, job.start_time, job.eligible_time) == (submit, start, submit)
    assert job.exit_code == 0 and not job.held and job.het_job_id is None
    assert job.priority is not None and job.priority > 4_294_000_000
    raw = next(j for j in json.loads(load(name))["jobs"] if j["job_id"] == job_id)
    assert raw["tres_per_node"] == ("gres:gpu:v100:2" if "22.05" in name else "gres/gpu:v100:2")


# the running job with an untyped request and a constraint (--gres=gpu:2 --constraint=p100)
UNTYPED = [("squeue-22.05.json", 2)] + [(n, 1) for n in DOCS_2411 + DOCS_2605]


@pytest.mark.parametrize(("name", "job_id"), UNTYPED)
def test_running_untyped_gpu_job_with_constraint(name: str, job_id: int) -> None:
    job = jobs_of(name)[job_id]
    assert (job.name, job.state, job.node_names) == ("untyped", "RUNNING", ("node2",))
    assert job.gres == (Gres("gpu", None, 2),) and job.gpu_type is None
    assert job.gpus_per_node == 2 and job.features == "p100"
    assert job.start_time is not None and job.start_time >= (job.submit_time or 0)


# the held job (--hold --gres=gpu:1 --constraint=k80, AdminComment set)
HELD = [("squeue-22.05.json", 3)] + [(n, 2) for n in DOCS_2411 + DOCS_2605]


@pytest.mark.parametrize(("name", "job_id"), HELD)
def test_held_by_its_user(name: str, job_id: int) -> None:
    job = jobs_of(name)[job_id]
    assert (job.name, job.state, job.state_reason) == ("held", "PENDING", "JobHeldUser")
    assert job.held
    assert job.admin_comment == "hadar:placed=node3" and job.comment == ""
    assert job.gres == (Gres("gpu", None, 1),) and job.features == "k80"
    assert job.nodes == "" and job.node_names == () and job.required_nodes == ""
    assert (job.priority, job.start_time, job.eligible_time) == (0, None, None)
    assert job.time_limit_min is None  # UNLIMITED
    if "22.05" not in name:
        raw = next(j for j in json.loads(load(name))["jobs"] if j["job_id"] == job_id)
        assert raw["hold"] is True and raw["job_state"] == ["PENDING"]


# the job pending on resources: (document, job id, a100 GPUs asked, expected start)
PENDING = [("squeue-22.05.json", 5, 4, 1826861640)] + [
    (n, 4, 8, 1826999711 if "after-actions" in n else 1826999723) for n in DOCS_2411] + [
    (n, 4, 8, 1827000651) for n in DOCS_2605]


@pytest.mark.parametrize(("name", "job_id", "gpus", "expected_start"), PENDING)
def test_pending_on_resources(name: str, job_id: int, gpus: int, expected_start: int) -> None:
    job = jobs_of(name)[job_id]
    assert (job.name, job.state, job.state_reason) == ("waiting", "PENDING", "Resources")
    assert not job.held and job.priority != 0
    assert job.gres == (Gres("gpu", "a100", gpus),) and job.node_names == ()
    assert job.start_time == expected_start  # the backfill's expected start, a year ahead
    assert job.eligible_time == job.submit_time


# the completed job (--wrap=true): only where the document lists finished jobs
COMPLETED = [("squeue-22.05.json", 6), ("scontrol-show-job-24.11.json", 5),
             ("squeue-24.11-states-all-after-actions.json", 5), ("squeue-26.05-states-all.json", 5)]


@pytest.mark.parametrize(("name", "job_id"), COMPLETED)
def test_completed(name: str, job_id: int) -> None:
    job = jobs_of(name)[job_id]
    assert (job.name, job.state, job.state_reason) == ("quick", "COMPLETED", "None")
    assert job.node_names == ("node3",) and job.gres == () and job.gpus_per_node == 0
    assert job.exit_code == 0 and job.time_limit_min == 525600 and not job.held


def test_running_a100_job() -> None:
    big = {n: jobs_of(n)[4 if "22.05" in n else 3] for n in ["squeue-22.05.json", *BEFORE_2411,
                                                             *DOCS_2605]}
    for name, job in big.items():
        assert (job.name, job.state, job.node_names) == ("big", "RUNNING", ("node4",))
        assert job.gres == (Gres("gpu", "a100", 8 if "22.05" in name else 4),)


# ------------------------------------------------------------------ heterogeneous jobs

# (document, leader, [(component id, node, gres)], state, command, workdir)
HET_2411_2605 = [(6, "node1", Gres("gpu", "v100", 1)), (7, "node2", Gres("gpu", "p100", 1)),
                 (8, "node4", Gres("gpu", "a100", 1))]
HETJOBS = [
    ("squeue-hetjob-22.05.json", 2, [(2, "node1", Gres("gpu", None, 1)),
                                     (3, "node2", Gres("gpu", None, 1)),
                                     (4, "node4", Gres("gpu", None, 1))],
     "RUNNING", "/tmp/forkexp/het3.sh", "/tmp/forkexp"),
    *[(n, 6, HET_2411_2605, "RUNNING", "/scratch/jobs/het.sh", "/scratch/jobs")
      for n in BEFORE_2411 + DOCS_2605],
    ("squeue-24.11-states-all-after-actions.json", 6, HET_2411_2605, "FAILED",
     "/scratch/jobs/het.sh", "/scratch/jobs"),
]


@pytest.mark.parametrize(("name", "leader", "components", "state", "command", "workdir"),
                         HETJOBS)
def test_heterogeneous_job_components(name: str, leader: int,
                                      components: list[tuple[int, str, Gres]], state: str,
                                      command: str, workdir: str) -> None:
    jobs = jobs_of(name)
    group = sorted((j for j in jobs.values() if j.het_job_id == leader), key=lambda j: j.job_id)
    assert [j.job_id for j in group] == [c[0] for c in components]
    for offset, (job, (_, node, gres)) in enumerate(zip(group, components, strict=True)):
        assert (job.het_job_id, job.het_job_offset) == (leader, offset)
        assert job.state == state and job.node_names == (node,) and job.required_nodes == node
        assert job.gres == (gres,) and job.comment == "hadar-copy-of=1"
        # 24.11+ give the script path only (22.05 gave its arguments in the hetjob's parent)
        assert job.command == command and job.workdir == workdir
        if state == "FAILED":
            assert job.state_reason == "NonZeroExitCode" and job.exit_code == 138
    # every other job says it is not heterogeneous (22.05: 0; 24.11+: {"number": 0})
    assert all(j.het_job_offset is None for j in jobs.values() if j.het_job_id is None)


def test_hetjob_2205_pending_components_and_parent() -> None:
    jobs = jobs_of("squeue-hetjob-22.05.json")
    assert [(j.job_id, j.het_job_offset, j.required_nodes, j.features) for j in jobs.values()
            if j.het_job_id == 5] == [(5, 0, "node1", "v100"), (6, 1, "node2", "p100"),
                                      (7, 2, "node4", "a100")]
    assert all(jobs[k].state_reason == "Dependency" and jobs[k].node_names == ()
               and jobs[k].dependency == "afterany:2(unfulfilled)" for k in (5, 6, 7))
    parent = jobs[1]
    assert parent.held and parent.command == "/tmp/forkexp/s.sh x y"
    assert parent.admin_comment.startswith("hadar epoch=3 state=forked ")
    assert parent.time_limit_min == 5


# ------------------------------------------------------------------ 24.11 after the actions


def test_2411_after_actions() -> None:
    jobs = jobs_of("squeue-24.11-states-all-after-actions.json")
    killed = jobs[9]  # SIGUSR1: FAILED, RaisedSignal, no exit status
    assert (killed.state, killed.state_reason, killed.exit_code) == ("FAILED", "RaisedSignal",
                                                                     None)
    assert killed.node_names == ("node1",) and killed.gres == (Gres("gpu", "v100", 2),)

    placed = jobs[10]
    assert (placed.name, placed.state, placed.node_names) == ("hintjob", "RUNNING", ("node3",))
    assert placed.comment == "hadar: model=resnet50 bs=64 steps=1000"
    assert placed.admin_comment == "hadar:e=1,s=placed" and placed.required_nodes == "node3"
    assert placed.gres == (Gres("gpu", "k80", 1),) and placed.features == "k80"
    assert (placed.submit_time, placed.eligible_time, placed.start_time) == (
        1795463813, 1795463824, 1795463824)

    released = jobs[11]
    assert (released.name, released.state, released.node_names) == (
        "hintjob4", "RUNNING", ("node1",))
    assert released.comment == "hadar: model=a3c steps=1000"
    assert released.admin_comment == "hadar: held for the sidecar"
    assert released.gres == (Gres("gpu", "v100", 1),) and not released.held

    admin_held = jobs[12]
    assert (admin_held.state, admin_held.state_reason) == ("PENDING", "JobHeldAdmin")
    assert admin_held.held and admin_held.priority == 0 and admin_held.eligible_time is None
    assert admin_held.gres == (Gres("gpu", None, 2),) and admin_held.node_names == ()
    assert admin_held.admin_comment == "hadar: held for the sidecar"
    assert admin_held.comment == "hadar: model=resnet50 bs=64 steps=1000"

    requeued = jobs[13]  # scontrol requeuehold: plain PENDING (no REQUEUED flag), JobHeldUser
    assert (requeued.name, requeued.state, requeued.state_flags, requeued.state_reason) == (
        "typed-move", "PENDING", (), "JobHeldUser")
    assert requeued.held and requeued.priority == 0 and requeued.start_time is None
    assert requeued.gres == (Gres("gpu", "p100", 1),) and requeued.required_nodes == "node2"
    assert requeued.node_names == () and requeued.eligible_time == 1795463823
    raw = next(j for j in json.loads(load("squeue-24.11-states-all-after-actions.json"))["jobs"]
               if j["job_id"] == 13)
    assert raw["state_description"] == "job requeued in held state" and raw["hold"] is True


def test_time_limits_and_infinite_numbers() -> None:
    """``time_limit`` {"set": false, "infinite": true} is None (UNLIMITED); 24.11/26.05 give
    some jobs 525600 (365 days) instead."""
    for name in DOCS_2411 + DOCS_2605:
        jobs = jobs_of(name)
        assert jobs[2].time_limit_min is None and jobs[9].time_limit_min == 525600
        assert jobs[6].time_limit_min is None
    assert jobs_of("squeue-26.05.json")[1].time_limit_min == 525600
    assert jobs_of("squeue-24.11.json")[1].time_limit_min is None


# ------------------------------------------------------------------ sinfo

GPU = {"node1": ("v100", 4, 4, 4000), "node2": ("p100", 4, 4, 4000),
       "node3": ("k80", 2, 2, 2000), "node4": ("a100", 8, 8, 8000),
       "node5": ("v100", 4, 4, 4000)}

# (document, {node: (state, flags, GPUs used, CPUs allocated)})
SINFO = [
    ("sinfo-22.05.json", {"node1": ("MIXED", (), 2, 1), "node2": ("MIXED", (), 2, 1),
                          "node3": ("IDLE", (), 0, 0), "node4": ("MIXED", (), 8, 1)}),
    *[(n, {"node1": ("MIXED", (), 3, 2), "node2": ("MIXED", (), 3, 2),
           "node3": ("IDLE", (), 0, 0), "node4": ("MIXED", (), 5, 2)})
      for n in ["sinfo-24.11.json", "sinfo-24.11-v0.0.41.json", "sinfo-24.11-v0.0.40.json",
                "sinfo-26.05.json"]],
    ("sinfo-24.11-after-actions.json", {"node1": ("MIXED", (), 1, 1), "node2": ("MIXED", (), 2, 1),
                                        "node3": ("MIXED", (), 1, 1),
                                        "node4": ("MIXED", (), 4, 1)}),
    ("sinfo-24.11-drained.json", {"node1": ("MIXED", ("DRAIN",), 1, 1),
                                  "node2": ("IDLE", (), 0, 0),
                                  "node3": ("IDLE", ("DRAIN",), 0, 0),
                                  "node4": ("IDLE", (), 0, 0)}),
    ("sinfo-24.11-identical-nodes.json", {"node1": ("MIXED", (), 1, 1),
                                          "node2": ("IDLE", (), 0, 0),
                                          "node3": ("IDLE", (), 0, 0),
                                          "node4": ("IDLE", (), 0, 0),
                                          "node5": ("MIXED", (), 3, 1)}),
    # node1 and node5 are one group: its cpus.allocated (0) is the group's sum, so each node's
    # own only because it is 0
    ("sinfo-24.11-identical-nodes-idle.json", {n: ("IDLE", (), 0, 0) for n in
                                               ["node1", "node2", "node3", "node4", "node5"]}),
]


@pytest.mark.parametrize(("name", "expect"), SINFO)
def test_sinfo_nodes(name: str, expect: dict[str, tuple[str, tuple[str, ...], int, int]]) -> None:
    nodes = nodes_of(name)
    assert sorted(nodes) == sorted(expect)
    for node_name, (state, flags, used, alloc) in expect.items():
        node = nodes[node_name]
        gpu_type, gpus, cpus, memory = GPU[node_name]
        assert node.gres == (Gres("gpu", gpu_type, gpus),)
        assert (node.gpu_type, node.gpus, node.gpus_used) == (gpu_type, gpus, used)
        assert node.gres_used == (Gres("gpu", gpu_type, used),)
        assert (node.state, node.state_flags) == (state, flags)
        assert (node.cpus, node.alloc_cpus, node.real_memory_mb) == (cpus, alloc, memory)
        assert node.features == (gpu_type,) and node.active_features == (gpu_type,)
        assert node.partitions == ("gpu",)


@pytest.mark.parametrize("name", [s[0] for s in SINFO if "22.05" not in s[0]])
def test_sinfo_gres_totals_have_no_socket_suffix(name: str) -> None:
    """24.11+ write node gres as ``gpu:v100:4`` (22.05: ``gpu:v100:4(S:0)``) and the used
    ones with ``(IDX:...)``."""
    groups = json.loads(load(name))["sinfo"]
    totals = {g["gres"]["total"] for g in groups}
    assert totals <= {"gpu:v100:4", "gpu:p100:4", "gpu:k80:2", "gpu:a100:8"}
    assert all("(IDX:" in g["gres"]["used"] for g in groups)
    for g in groups:
        (total,) = parse_gres(g["gres"]["total"])
        assert total.count == {"v100": 4, "p100": 4, "k80": 2, "a100": 8}[total.type or ""]


def test_sinfo_identical_nodes_group() -> None:
    groups = json.loads(load("sinfo-24.11-identical-nodes-idle.json"))["sinfo"]
    (pair,) = [g for g in groups if len(g["nodes"]["nodes"]) > 1]
    assert pair["nodes"]["nodes"] == ["node1", "node5"] and pair["cpus"]["total"] == 8
    nodes = nodes_of("sinfo-24.11-identical-nodes-idle.json")
    assert nodes["node1"].cpus == nodes["node5"].cpus == 4  # per node, not the group's 8
    # when busy, two nodes of one kind are two groups (their gres used differ)
    busy = json.loads(load("sinfo-24.11-identical-nodes.json"))["sinfo"]
    assert all(len(g["nodes"]["nodes"]) == 1 for g in busy)


def test_sinfo_group_of_busy_identical_nodes_has_no_per_node_alloc() -> None:
    """A group of two nodes with CPUs allocated (the 24.11 idle-pair group with 2 of its 8 CPUs
    allocated): the sum cannot be split, so alloc_cpus is unknown (None)."""
    doc = json.loads(load("sinfo-24.11-identical-nodes-idle.json"))
    (pair,) = [g for g in doc["sinfo"] if len(g["nodes"]["nodes"]) > 1]
    pair["cpus"]["allocated"] = 2
    nodes = {n.name: n for n in parse_sinfo_json(doc)}
    assert nodes["node1"].alloc_cpus is None and nodes["node5"].alloc_cpus is None
    assert nodes["node2"].alloc_cpus == 0


# ------------------------------------------------------------------ scontrol show job (text)

SCONTROL_TEXT = [
    ("scontrol-show-job-22.05.txt", (3,)),
    ("scontrol-show-job-24.11.txt", NINE),
    ("scontrol-show-job-24.11-oneliner.txt", NINE),
    ("scontrol-show-job-24.11-oneliner-after-actions.txt", (*NINE, 10, 11, 12, 13)),
    ("scontrol-show-job-26.05.txt", NINE),
    ("scontrol-show-job-26.05-oneliner.txt", NINE),
]


@pytest.mark.parametrize(("name", "ids"), SCONTROL_TEXT)
def test_scontrol_show_job_records(name: str, ids: tuple[int, ...]) -> None:
    text = load(name)
    records = {int(r["JobId"]): r for r in parse_scontrol_records(text)}
    assert tuple(records) == ids
    # one record: parse_scontrol_show of the whole text is the first record
    assert parse_scontrol_show(text) == records[ids[0]]
    held = records[3 if "22.05" in name else 2]
    assert (held["JobName"], held["JobState"], held["Reason"]) == ("held", "PENDING",
                                                                   "JobHeldUser")
    assert held["AdminComment"] == "hadar:placed=node3" and held["Features"] == "k80"
    assert held["TresPerNode"] == ("gres:gpu:1" if "22.05" in name else "gres/gpu:1")
    assert (held["EligibleTime"], held["StartTime"], held["NodeList"]) == ("Unknown", "Unknown",
                                                                           "")
    assert held["Priority"] == "0" and held["UserId"] == "root(0)"
    if "22.05" in name:
        return
    typed = records[9]
    assert typed["Comment"] == "note:job=7" and typed["NodeList"] == "node1"
    assert parse_gres(typed["TresPerNode"]) == (Gres("gpu", "v100", 2),)
    assert records[5]["JobState"] == "COMPLETED" and records[5]["NodeList"] == "node3"
    assert "TresPerNode" not in records[5]
    assert records[4]["Reason"] == "Resources" and records[4]["TresPerNode"] == "gres/gpu:a100:8"
    for offset, (job_id, node) in enumerate([(6, "node1"), (7, "node2"), (8, "node4")]):
        comp = records[job_id]
        assert (comp["HetJobId"], comp["HetJobOffset"], comp["HetJobIdSet"]) == (
            "6", str(offset), "6-8")
        assert comp["NodeList"] == node and comp["ReqNodeList"] == node
        assert comp["Comment"] == "hadar-copy-of=1" and comp["Command"] == "/scratch/jobs/het.sh"
        assert comp["WorkDir"] == "/scratch/jobs"
    if "26.05" in name:
        assert records[6]["SubmitLine"] == (
            "sbatch --parsable --chdir=/scratch/jobs /scratch/jobs/het.sh x y")
        assert records[9]["SubmitLine"] == ("sbatch --parsable --job-name=train-v100 "
                                            "--gres=gpu:v100:2 --comment=note:job=7 "
                                            "--wrap=sleep 600")
    else:
        assert "SubmitLine" not in records[6]


def test_scontrol_oneliner_after_actions_2411() -> None:
    records = {int(r["JobId"]): r for r in parse_scontrol_records(
        load("scontrol-show-job-24.11-oneliner-after-actions.txt"))}
    # free text with spaces and '=' (a hints comment) stays whole, no stray keys
    assert records[10]["Comment"] == "hadar: model=resnet50 bs=64 steps=1000"
    assert records[10]["AdminComment"] == "hadar:e=1,s=placed"
    assert records[11]["Comment"] == "hadar: model=a3c steps=1000"
    assert records[11]["AdminComment"] == "hadar: held for the sidecar"
    assert not {"model", "bs", "steps"} & set(records[10])
    assert records[10]["StdErr"] == "//slurm-10.out"  # the key after the comment is intact
    assert records[12]["Reason"] == "JobHeldAdmin" and records[12]["Priority"] == "0"
    # the requeued-held job: the text form names the state description, not JobHeldUser
    assert records[13]["Reason"] == "job_requeued_in_held_state"
    assert (records[13]["Restarts"], records[13]["ReqNodeList"]) == ("1", "node2")
    assert records[13]["TresPerNode"] == "gres/gpu:p100:1"
    assert records[9]["Reason"] == "RaisedSignal:10(User_defined_signal_1)"
    assert records[9]["ExitCode"] == "0:10"
    assert all(records[k]["ExitCode"] == "138:0" and records[k]["JobState"] == "FAILED"
               for k in (6, 7, 8))


# the text and the JSON of the same moment agree, comments included
TEXT_VS_JSON = [
    ("scontrol-show-job-24.11.txt", "scontrol-show-job-24.11.json"),
    ("scontrol-show-job-24.11-oneliner.txt", "scontrol-show-job-24.11.json"),
    ("scontrol-show-job-24.11-oneliner-after-actions.txt",
     "squeue-24.11-states-all-after-actions.json"),
    ("scontrol-show-job-26.05.txt", "squeue-26.05-states-all.json"),
    ("scontrol-show-job-26.05-oneliner.txt", "squeue-26.05-states-all.json"),
]


@pytest.mark.parametrize(("text_name", "json_name"), TEXT_VS_JSON)
def test_scontrol_text_agrees_with_json(text_name: str, json_name: str) -> None:
    jobs = jobs_of(json_name)
    records = parse_scontrol_records(load(text_name))
    assert [int(r["JobId"]) for r in records] == list(jobs)
    for rec in records:
        job = jobs[int(rec["JobId"])]
        assert rec["JobName"] == job.name and rec["JobState"] == job.state
        assert rec["NodeList"] == job.nodes
        assert parse_gres(rec.get("TresPerNode", "")) == job.gres
        assert rec.get("Comment", "") == job.comment
        assert rec.get("AdminComment", "") == job.admin_comment
        assert ("" if rec["Features"] == "(null)" else rec["Features"]) == job.features
        assert ("" if rec["ReqNodeList"] == "(null)" else rec["ReqNodeList"]) == (
            job.required_nodes)
        assert ("" if rec["Command"] == "(null)" else rec["Command"]) == job.command
        if "HetJobId" in rec:
            assert (int(rec["HetJobId"]), int(rec["HetJobOffset"])) == (
                job.het_job_id, job.het_job_offset)
        else:
            assert job.het_job_id is None
        if job.exit_code is not None:
            assert rec["ExitCode"] == f"{job.exit_code}:0"


# ------------------------------------------------------------------ scontrol show node (text)


def test_scontrol_show_node_2411() -> None:
    text = load("scontrol-show-node-24.11.txt")
    records = {r["NodeName"]: r for r in parse_scontrol_records(text)}
    assert sorted(records) == ["node1", "node2", "node3", "node4"]
    for name, rec in records.items():
        gpu_type, gpus, cpus, memory = GPU[name]
        assert parse_gres(rec["Gres"]) == (Gres("gpu", gpu_type, gpus),)
        assert rec["AvailableFeatures"] == rec["ActiveFeatures"] == gpu_type
        assert (int(rec["CPUTot"]), int(rec["RealMemory"])) == (cpus, memory)
        assert rec["Partitions"] == "gpu" and rec["Version"] == "24.11.5"
        assert rec["NodeAddr"] == "127.0.0.1"
    assert {n: (r["State"], r["CPUAlloc"]) for n, r in records.items()} == {
        "node1": ("MIXED", "2"), "node2": ("MIXED", "2"), "node3": ("IDLE", "0"),
        "node4": ("MIXED", "2")}
    assert records["node1"]["OS"] == "Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0"
    assert records["node3"]["AllocTRES"] == "" and records["node1"]["AllocTRES"] == (
        "cpu=2,mem=512M")


# A job that exited 75 under RequeueExitHold=75 (job 1, `ckpt`: `sleep 1; exit 75`), put back
# in the queue held by slurmctld: 24.11+ list it as ["PENDING", "SPECIAL_EXIT"], scontrol as
# JobState=SPECIAL_EXIT (22.05: "SPECIAL_EXIT" in both).
SPECIAL_EXIT = ["24.11", "26.05"]


@pytest.mark.parametrize("version", SPECIAL_EXIT)
def test_a_checkpoint_exit_held_by_slurmctld(version: str) -> None:
    (job,) = parse_squeue_json(load(f"squeue-{version}-special-exit.json"))
    assert (job.job_id, job.name, job.state, job.state_reason) == (
        1, "ckpt", "SPECIAL_EXIT", "JobHeldUser")
    assert job.state_flags == ("PENDING",) and job.held and job.exit_code == 75
    shown = parse_scontrol_show(load(f"scontrol-show-job-{version}-special-exit.txt"))
    assert (shown["JobState"], shown["Reason"], shown["Restarts"], shown["ExitCode"]) == (
        "SPECIAL_EXIT", "JobHeldUser", "1", "75:0")


@pytest.mark.parametrize("version", SPECIAL_EXIT)
def test_a_job_slurmctld_is_still_ending_is_completing(version: str) -> None:
    # (the 24.11+ list form a moment before RequeueExitHold: seen on the dev cluster when
    # slurmctld was stopped while the job exited; 22.05 says COMPLETING)
    doc = json.loads(load(f"squeue-{version}-special-exit.json"))
    raw = {**doc["jobs"][0], "job_state": ["FAILED", "COMPLETING"], "state_reason": "None"}
    (job,) = parse_squeue_json({"jobs": [raw]})
    assert (job.state, job.state_flags) == ("COMPLETING", ("FAILED",))
    assert job.state not in FINAL_STATES and not job.held


# A batch job whose launch failed (its prolog failed: the dev cluster's fault drill), requeued
# held by slurmctld, on every release (tests/data/slurm/launch-failed/capture.sh): the reason
# code reads as a user's hold, the description says it is Slurm's.
@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_a_job_slurmctld_held_after_a_failed_launch(version: str) -> None:
    (job,) = parse_squeue_json(load(f"launch-failed/{version}-squeue.json"))
    assert (job.job_id, job.name, job.state, job.state_reason, job.priority) == (
        1, "launch", "PENDING", "JobHeldUser", 0)
    assert job.state_desc == LAUNCH_FAILED_HELD and job.held and launch_failed(job)
    assert job.required_nodes == "node1" and job.node_names == ()
    # scontrol prints the description in place of the reason code
    shown = parse_scontrol_show(load(f"launch-failed/{version}-scontrol-show-job.txt"))
    assert (shown["JobState"], shown["Reason"], shown["Restarts"]) == (
        "PENDING", "launch_failed_requeued_held", "1")
    # no job of the other captures reads so; their descriptions are read as Slurm gave them
    for name in JOB_DOCS:
        assert not any(launch_failed(j) for j in parse_squeue_json(load(name))), name
    other = jobs_of("squeue-24.11-states-all-after-actions.json")
    assert (other[13].state_reason, other[13].state_desc) == ("JobHeldUser",
                                                               "job requeued in held state")


def test_every_capture_is_read_here() -> None:
    read = ({m[0] for m in META} | set(JOB_DOCS) | {s[0] for s in SINFO}
            | {t[0] for t in SCONTROL_TEXT} | {"scontrol-show-node-24.11.txt"}
            | {f"{kind}-{v}-special-exit.{ext}" for v in SPECIAL_EXIT
               for kind, ext in (("squeue", "json"), ("scontrol-show-job", "txt"))})
    # (subdirectories hold captures of their own, read by their own tests: shard/ by
    # tests/test_shard_parse.py)
    assert {p.name for p in DATA.iterdir() if p.is_file() and p.name != "README.md"} == read
