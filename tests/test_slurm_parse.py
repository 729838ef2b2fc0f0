"""Unit tests of the Slurm boundary: parsers on captured 22.05 output and on tolerance/error
cases, argv builders, and the runner's guards.  No Slurm needed.  The captures of Slurm 24.11
and 26.05 have their own tests in ``test_slurm_captures.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hadar_slurm.slurm import (
    Gres,
    RunAs,
    SlurmCommandError,
    SlurmConfigError,
    SlurmParseError,
    SlurmRunner,
    SlurmTimeoutError,
    commands,
    expand_hostlist,
    parse_gres,
    parse_job_ids,
    parse_sbatch_parsable,
    parse_scontrol_show,
    parse_sinfo_json,
    parse_squeue_json,
)
from hadar_slurm.slurm.parse import (
    ACTIVE_STATES,
    FINAL_STATES,
    PENDING_STATES,
    QUEUED_STATES,
    RUNNING_STATES,
    SQUEUE_LIVE_STATES,
    UNFINISHED_STATES,
)

DATA = Path(__file__).resolve().parent / "data" / "slurm"


def load(name: str) -> str:
    return (DATA / name).read_text()


# ------------------------------------------------------------------ squeue, captured on 22.05


def test_squeue_2205_captured() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(load("squeue-22.05.json"))}
    assert sorted(jobs) == [1, 2, 3, 4, 5, 6]

    typed = jobs[1]
    assert (typed.name, typed.user, typed.state, typed.partition) == (
        "train-v100", "root", "RUNNING", "gpu")
    assert typed.nodes == "node1" and typed.node_names == ("node1",)
    assert typed.gres == (Gres("gpu", "v100", 2),)
    assert typed.gpu_type == "v100" and typed.gpus_per_node == 2
    assert typed.comment == "hadar:job=7"
    assert typed.submit_time is not None and typed.start_time is not None
    assert typed.time_limit_min is None  # unlimited

    untyped = jobs[2]
    assert untyped.gres == (Gres("gpu", None, 2),) and untyped.gpu_type is None
    assert untyped.features == "p100" and untyped.node_names == ("node2",)

    held = jobs[3]
    assert held.state == "PENDING" and held.held and held.state_reason == "JobHeldUser"
    assert held.nodes == "" and held.node_names == ()
    assert held.admin_comment == "hadar:placed=node3" and held.features == "k80"
    assert held.start_time is None and held.priority == 0

    assert jobs[5].state == "PENDING" and jobs[5].state_reason == "Resources"
    assert not jobs[5].held
    assert jobs[6].state == "COMPLETED" and jobs[6].gres == ()
    assert all(j.state_flags == () for j in jobs.values())


def test_sinfo_2205_captured() -> None:
    nodes = {n.name: n for n in parse_sinfo_json(load("sinfo-22.05.json"))}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    expect = {"node1": ("v100", 4, 4), "node2": ("p100", 4, 4), "node3": ("k80", 2, 2),
              "node4": ("a100", 8, 8)}
    for name, (gpu_type, gpus, cpus) in expect.items():
        n = nodes[name]
        assert (n.gpu_type, n.gpus, n.cpus) == (gpu_type, gpus, cpus)
        assert n.features == (gpu_type,) and n.active_features == (gpu_type,)
        assert n.partitions == ("gpu",)
    assert nodes["node1"].state == "MIXED" and nodes["node1"].gpus_used == 2
    assert nodes["node3"].state == "IDLE" and nodes["node3"].gpus_used == 0
    assert nodes["node4"].gpus_used == 8 and nodes["node4"].alloc_cpus == 1
    assert nodes["node1"].real_memory_mb == 4000


def test_scontrol_show_job_text() -> None:
    rec = parse_scontrol_show(load("scontrol-show-job-22.05.txt"))
    assert rec["JobId"] == "3" and rec["JobState"] == "PENDING"
    assert rec["Reason"] == "JobHeldUser" and rec["AdminComment"] == "hadar:placed=node3"
    assert rec["TresPerNode"] == "gres:gpu:1" and rec["Features"] == "k80"
    assert rec["AllocNode:Sid"].startswith("localhost:")


# ------------------------------------------------------------------ shapes the captures lack


def test_sinfo_node_in_two_partitions_is_merged() -> None:
    """A node listed in two partitions is two groups of ``sinfo --json`` (23.x+); the captures
    have one partition, so the 24.11 capture's node3 group is given a second partition here."""
    doc = json.loads(load("sinfo-24.11.json"))
    (group,) = [g for g in doc["sinfo"] if g["nodes"]["nodes"] == ["node3"]]
    doc["sinfo"].append({**group, "partition": {**group["partition"], "name": "debug"}})
    nodes = {n.name: n for n in parse_sinfo_json(doc)}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    assert nodes["node3"].partitions == ("gpu", "debug")
    assert nodes["node1"].partitions == ("gpu",)


def test_job_state_flags_of_a_list_state() -> None:
    """A list ``job_state`` keeps its flags (the captures' jobs have none: a requeued job of
    24.11/26.05 is plain PENDING); the 24.11 capture's job 4 with a flag added."""
    doc = json.loads(load("squeue-24.11.json"))
    (raw,) = [j for j in doc["jobs"] if j["job_id"] == 4]
    job = parse_squeue_json({"jobs": [{**raw, "job_state": ["PENDING", "REQUEUED"]}]})[0]
    assert (job.state, job.state_flags, job.state_reason) == ("PENDING", ("REQUEUED",),
                                                              "Resources")


def test_scontrol_free_text_in_the_2605_oneliner() -> None:
    """26.05 ends a free-text value with one space only (24.11: two), so a comment with spaces
    and ``=`` ends at the next key Slurm prints (StdErr): the 26.05 one-line record of job 9 with
    its comment replaced by a hints comment."""
    line = load("scontrol-show-job-26.05-oneliner.txt").splitlines()[-1]
    assert " Comment=note:job=7 StdErr=" in line
    rec = parse_scontrol_show(line.replace(
        "Comment=note:job=7", "Comment=hadar: model=a3c bs=64 steps=10"))
    assert rec["Comment"] == "hadar: model=a3c bs=64 steps=10"
    assert "model" not in rec and "bs" not in rec
    assert rec["StdErr"] == "" and rec["StdOut"] == "/slurm-9.out"
    assert rec["SubmitLine"].endswith("--comment=note:job=7 --wrap=sleep 600")


# ------------------------------------------------------------------ tolerance and errors


def test_minimal_job_and_string_states() -> None:
    doc = {"jobs": [{"job_id": 7, "job_state": "running"}]}
    (job,) = parse_squeue_json(doc)
    assert job.state == "RUNNING" and job.name == "" and job.gres == () and job.priority is None
    assert parse_squeue_json("{}") == ()
    node_doc = {"nodes": [{"name": "n1", "state": "idle+drain", "state_flags": ["DRAIN"]}]}
    (node,) = parse_sinfo_json(node_doc)
    assert node.state == "IDLE" and node.state_flags == ("DRAIN",) and node.gpus == 0


def test_account_qos_memory_and_cpus() -> None:
    """What a fork copies to its components, in 22.05's plain numbers and newer number objects;
    22.05 reports DefMemPerCPU as memory_per_cpu when the job asked for nothing, and the CPUs
    per node in minimum_cpus_per_node (its cpus_per_task stays null even when asked)."""
    jobs = {j.job_id: j for j in parse_squeue_json(load("squeue-22.05.json"))}
    assert (jobs[1].account, jobs[1].qos, jobs[1].mem_per_node_mb) == ("", "", None)
    assert jobs[1].mem_per_cpu_mb == 256 and jobs[1].cpus_per_node == 1
    doc = {"jobs": [
        {"job_id": 1, "job_state": "PENDING", "account": "proj-7", "qos": "normal",
         "memory_per_node": 16000, "memory_per_cpu": None, "cpus_per_task": None,
         "minimum_cpus_per_node": 6},
        {"job_id": 2, "job_state": "PENDING", "memory_per_node": {"set": False, "number": 0},
         "memory_per_cpu": {"set": True, "infinite": False, "number": 512},
         "minimum_cpus_per_node": {"set": True, "infinite": False, "number": 2}},
    ]}
    a, b = parse_squeue_json(doc)
    assert (a.account, a.qos, a.mem_per_node_mb, a.mem_per_cpu_mb, a.cpus_per_node) == (
        "proj-7", "normal", 16000, None, 6)
    assert (b.account, b.mem_per_node_mb, b.mem_per_cpu_mb, b.cpus_per_node) == ("", None, 512, 2)
    with pytest.raises(SlurmParseError, match="field 'memory_per_node'"):
        parse_squeue_json({"jobs": [{"job_id": 3, "job_state": "PENDING",
                                     "memory_per_node": "lots"}]})


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"jobs": [{"job_id": 1}]}, "job_state"),
        ({"jobs": [{"job_state": "RUNNING"}]}, "job_id"),
        ({"jobs": [{"job_id": "x", "job_state": "RUNNING"}]}, "job_id"),
        ({"jobs": [{"job_id": 1, "job_state": 3}]}, "job_state"),
        ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "priority": "high"}]}, "priority"),
        ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "start_time": {"set": True}}]},
         "start_time"),
        ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "name": 5}]}, "name"),
        ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "tres_per_node": "gpu::"}]},
         "tres_per_node"),
        ({"jobs": {"job_id": 1}}, "jobs"),
    ],
)
def test_bad_job_fields_name_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(SlurmParseError) as exc:
        parse_squeue_json(doc)
    assert exc.value.field == field
    assert f"field '{field}'" in str(exc.value)


def test_bad_documents() -> None:
    with pytest.raises(SlurmParseError, match="not valid JSON"):
        parse_squeue_json("squeue: error: oops")
    with pytest.raises(SlurmParseError, match="Unable to contact"):
        parse_sinfo_json(json.dumps({"errors": [{"error": "Unable to contact slurm controller"}]}))
    with pytest.raises(SlurmParseError, match="field 'state'"):
        parse_sinfo_json({"nodes": [{"name": "n1"}]})
    with pytest.raises(SlurmParseError, match="field 'name'"):
        parse_sinfo_json({"nodes": [{"state": "idle"}]})
    with pytest.raises(SlurmParseError, match="expected an object"):
        parse_sinfo_json("[]")


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("gres:gpu:v100:2", [("gpu", "v100", 2)]),
        ("gres/gpu:v100=2", [("gpu", "v100", 2)]),
        ("gres/gpu=2", [("gpu", None, 2)]),
        ("gres:gpu:2", [("gpu", None, 2)]),
        ("gpu:2", [("gpu", None, 2)]),
        ("gpu", [("gpu", None, 1)]),
        ("gpu:v100:4(S:0)", [("gpu", "v100", 4)]),
        ("gpu:v100:2(IDX:0,2),mps:100", [("gpu", "v100", 2), ("mps", None, 100)]),
        ("gpu:k80:0(IDX:N/A)", [("gpu", "k80", 0)]),
        ("cpu=4,mem=1G,gres/gpu:a100=8", [("gpu", "a100", 8)]),
        ("gpu:tesla_v100-sxm2:1", [("gpu", "tesla_v100-sxm2", 1)]),
        ("(null)", []),
        ("", []),
    ],
)
def test_parse_gres(text: str, expect: list[tuple[str, str | None, int]]) -> None:
    assert parse_gres(text) == tuple(Gres(*e) for e in expect)


def test_expand_hostlist() -> None:
    assert expand_hostlist("node[1-3,5],gpu[01-02],x") == (
        "node1", "node2", "node3", "node5", "gpu01", "gpu02", "x")
    assert expand_hostlist("r[1-2]n[1-2]") == ("r1n1", "r1n2", "r2n1", "r2n2")
    assert expand_hostlist("") == ()
    with pytest.raises(SlurmParseError):
        expand_hostlist("node[1-")
    with pytest.raises(SlurmParseError):
        expand_hostlist("node[3-1]")


def test_live_job_ids() -> None:
    argv = commands.squeue_live_ids()
    assert argv[:2] == ["squeue", "--noheader"] and argv[-1] == "--format=%A"
    states = set(argv[2].removeprefix("--states=").split(","))
    assert {"PENDING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"} <= states
    assert not states & FINAL_STATES
    assert parse_job_ids("12\n 7\n\n12\n") == frozenset({7, 12})
    assert parse_job_ids("") == frozenset()
    with pytest.raises(SlurmParseError, match=r"line 2.*expected a job id, got '12\+1'"):
        parse_job_ids("11\n12+1\n")


def test_job_state_sets_are_one_family() -> None:
    """parse.py defines every job-state set; the others are these very objects."""
    from hadar_slurm.sidecar import fork, status

    assert commands.LIVE_STATES is SQUEUE_LIVE_STATES
    assert fork.LIVE_STATES is QUEUED_STATES == PENDING_STATES | RUNNING_STATES
    assert status.ACTIVE is ACTIVE_STATES
    assert commands.squeue_live_ids()[2] == (
        "--states=PENDING,RUNNING,CONFIGURING,SUSPENDED,COMPLETING,REQUEUED,REQUEUE_HOLD,"
        "REQUEUE_FED,RESV_DEL_HOLD,SPECIAL_EXIT,STOPPED,SIGNALING,STAGE_OUT,RESIZING")
    assert UNFINISHED_STATES == QUEUED_STATES | {"COMPLETING"}
    assert ACTIVE_STATES < UNFINISHED_STATES <= set(SQUEUE_LIVE_STATES)
    assert len(set(SQUEUE_LIVE_STATES)) == len(SQUEUE_LIVE_STATES)
    assert not set(SQUEUE_LIVE_STATES) & FINAL_STATES


def test_sbatch_parsable() -> None:
    assert parse_sbatch_parsable("42\n") == 42
    assert parse_sbatch_parsable("43;hadardev\n") == 43
    with pytest.raises(SlurmParseError, match="job id"):
        parse_sbatch_parsable("sbatch: error: Batch job submission failed")


# ------------------------------------------------------------------ argv builders


def test_argv_builders() -> None:
    assert commands.squeue_json() == ["squeue", "--json", "--states=all"]
    assert commands.sinfo_json() == ["sinfo", "--json"]
    assert commands.sbatch(wrap="sleep 1", gres="gpu:1", constraint="p100", hold=True,
                           job_name="-x", comment="a b") == [
        "sbatch", "--parsable", "--job-name=-x", "--gres=gpu:1", "--constraint=p100",
        "--comment=a b", "--hold", "--wrap=sleep 1"]
    assert commands.sbatch(script="/tmp/job.sh", requeue=False)[-2:] == [
        "--no-requeue", "/tmp/job.sh"]
    assert commands.scancel([3, 4]) == ["scancel", "3", "4"]
    assert commands.scancel(5, signal="TERM") == ["scancel", "--signal=TERM", "5"]
    assert commands.scontrol_hold(3) == ["scontrol", "hold", "3"]
    assert commands.scontrol_release(3) == ["scontrol", "release", "3"]
    assert commands.scontrol_requeue(3) == ["scontrol", "requeue", "3"]
    assert commands.scontrol_requeue(3, hold=True) == ["scontrol", "requeuehold", "3"]
    assert commands.scontrol_update_job(3, {"NodeList": "node2", "Features": "p100"}) == [
        "scontrol", "update", "JobId=3", "NodeList=node2", "Features=p100"]
    assert commands.scontrol_show_job(9) == ["scontrol", "--oneliner", "show", "job", "9"]
    assert commands.scontrol_write_batch_script(9) == [
        "scontrol", "write", "batch_script", "9", "-"]
    assert commands.sbatch(script="/t/fork.sbatch", dependency="afterany:5") == [
        "sbatch", "--parsable", "--dependency=afterany:5", "/t/fork.sbatch"]


@pytest.mark.parametrize(
    "build",
    [
        lambda: commands.sbatch(),
        lambda: commands.sbatch(wrap="x", script="y"),
        lambda: commands.sbatch(wrap="echo a\necho b"),
        lambda: commands.scancel([]),
        lambda: commands.scontrol_hold(0),
        lambda: commands.scontrol_hold("3"),  # (a name other than A_T)
        lambda: commands.scontrol_update_job(3, {}),
        lambda: commands.scontrol_update_job(3, {"JobId": "4"}),
        lambda: commands.scontrol_update_job(3, {"Node List": "x"}),
    ],
)
def test_argv_builders_refuse_bad_input(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]


# ------------------------------------------------------------------ runner guards


def test_runner_needs_slurm_conf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(SlurmConfigError, match="SLURM_CONF is not set"):
        SlurmRunner()
    with pytest.raises(SlurmConfigError, match="no such file"):
        SlurmRunner(tmp_path / "missing.conf")


def test_runner_runs_argv_without_shell(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("# empty\n")
    runner = SlurmRunner(conf, timeout=5)
    out = runner.run(["sh", "-c", 'printf "%s" "$SLURM_CONF"; echo "$1"', "sh", "$(id)"])
    assert out.stdout == f"{conf}$(id)\n" and out.returncode == 0
    with pytest.raises(TypeError, match="not one string"):
        runner.run("squeue --json")  # a str is a Sequence[str]: refused at run time only
    with pytest.raises(SlurmCommandError, match="exit status 3") as exc:
        runner.run(["sh", "-c", "echo boom >&2; exit 3"])
    assert exc.value.stderr.strip() == "boom" and exc.value.returncode == 3
    assert "boom" in str(exc.value) and "`sh -c" in str(exc.value)
    with pytest.raises(SlurmCommandError, match="not found"):
        runner.run(["hadar-no-such-command-xyz"])
    with pytest.raises(SlurmTimeoutError, match=r"timed out after 0\.2 s"):
        runner.run(["sleep", "5"], timeout=0.2)
    assert runner.run(["sh", "-c", "exit 1"], check=False).returncode == 1


def test_runner_as_another_user(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("# empty\n")
    runner = SlurmRunner(conf, timeout=5)
    me = RunAs(os.geteuid(), os.getegid(), (), {"PATH": os.environ["PATH"], "HOME": "/h"})
    out = runner.run(["sh", "-c", 'echo "$HOME $SLURM_CONF $(pwd) $(id -u)" ; env | wc -l'],
                     as_user=me)
    line, count = out.stdout.splitlines()
    # only the given environment (and SLURM_CONF), in /
    assert line == f"/h {conf} / {os.geteuid()}" and int(count) <= 6
    if os.geteuid() != 0:
        return
    nobody = RunAs(65534, 65534, (), {"PATH": os.environ["PATH"]})
    out = runner.run(["id", "-u"], as_user=nobody)
    assert out.stdout.strip() == "65534"


def test_squeue_2205_hetjob_captured() -> None:
    """A HadarE fork in flight (tests/data/slurm/README.md): the held original job with its
    dependency, a running and a pending heterogeneous job of its copies."""
    jobs = {j.job_id: j for j in parse_squeue_json(load("squeue-hetjob-22.05.json"))}
    original = jobs[1]
    assert original.het_job_id is None and original.het_job_offset is None
    assert original.held and original.dependency == "afterany:2(unfulfilled)"
    assert original.command == "/tmp/forkexp/s.sh x y" and original.workdir == "/tmp/forkexp"
    assert (original.user_id, original.group_id) == (0, 0)
    assert original.comment == "hadar: model=a3c steps=100 fork=3"
    assert original.admin_comment.startswith("hadar epoch=3 state=forked ")
    for k, leader, node in [(2, 2, "node1"), (3, 2, "node2"), (4, 2, "node4"),
                            (5, 5, "node1"), (6, 5, "node2"), (7, 5, "node4")]:
        comp = jobs[k]
        assert (comp.het_job_id, comp.het_job_offset) == (leader, k - leader)
        assert comp.comment == "hadar-copy-of=1" and comp.required_nodes == node
        assert comp.gpus_per_node == 1 and comp.features in ("v100", "p100", "a100")
    assert jobs[2].state == "RUNNING" and jobs[2].node_names == ("node1",)
    assert jobs[5].state == "PENDING" and jobs[5].node_names == ()
    assert jobs[5].state_reason == "Dependency" and jobs[5].dependency.startswith("afterany:2")
    assert jobs[2].dependency == "" and jobs[2].required_nodes == "node1"


@pytest.mark.parametrize("raw,expected", [
    (0, 0), (19200, 75), (256, 1), (9, None),  # 22.05: raw wait status; 9 = SIGKILL
    ({"status": ["SUCCESS"], "return_code": {"set": True, "infinite": False, "number": 0}}, 0),
    ({"status": ["ERROR"], "return_code": {"set": True, "infinite": False, "number": 75}}, 75),
    ({"status": ["SIGNALED"], "signal": {"id": 9}, "return_code": 0}, None),
    (None, None), (True, None),
])
def test_exit_code_of_ended_jobs(raw: object, expected: int | None) -> None:
    # 22.05 reports a job that ran `exit 75` as exit_code 19200 (checked on the dev cluster)
    doc = {"jobs": [{"job_id": 5, "job_state": "FAILED", "exit_code": raw}]}
    assert parse_squeue_json(doc)[0].exit_code == expected
