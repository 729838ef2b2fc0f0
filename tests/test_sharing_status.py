"""GPU sharing (issue #16) in ``hadar-slurm status``/``explain``, in the state file and in the
metrics, on the real ``gres/shard`` captures of 22.05.8, 24.11.5 and 26.05.5
(``tests/data/slurm/shard``: on node4, jobs 1 and 2 hold one shard each of GPU 0, job 3 holds
GPU 1 whole, job 4 both shards of GPU 2) made hadar jobs, and small synthetic jobs.  No Slurm
needed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.loop import EpochRecord
from hadar_slurm.policy.base import Decision
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.config import default_config
from hadar_slurm.sidecar.controller import epoch_state
from hadar_slurm.sidecar.metrics import FinishTracker, SidecarMetrics, summarize_epoch
from hadar_slurm.sidecar.record import JobRecord
from hadar_slurm.sidecar.shard import ShardError, job_shards_on
from hadar_slurm.sidecar.status import explain, format_status, held_shards, status_rows
from hadar_slurm.slurm import Gres, SlurmJob, SlurmParseError
from hadar_slurm.slurm.parse import parse_sinfo_json, parse_squeue_json
from hadar_slurm.slurm.version import parse_version
from tests.test_metrics import samples
from tests.test_sidecar_backend import FakeSlurm, backend, decide

DATA = Path(__file__).resolve().parent / "data" / "slurm" / "shard"
VERSIONS = ("22.05", "24.11", "26.05")
HINT = "hadar: model=resnet50 bs=64 steps=40000 preempt=checkpoint"
OPTED_OUT = HINT + " share=no"
#: What state.json says when [scheduler] share is on but the table cannot pair anything.
NO_PAIRS = ("the throughput table has no co-located rates (pairs of jobs on one GPU: Gavel's "
            "JSON table has them)")


def record(node: str = "node4", mate: int = 0, state: str = "placed") -> str:
    return JobRecord(epoch=3, state=state, place=((node, 1),), gpus=1, mate=mate).encode()


def captured(v: str, comment: str = HINT) -> list[SlurmJob]:
    """The capture's four jobs, made hadar jobs placed by epoch 3 (jobs 1 and 2 as a pair)."""
    jobs = parse_squeue_json((DATA / f"{v}-squeue.json").read_text())
    mates = {1: 2, 2: 1}
    return [dataclasses.replace(j, comment=comment, features="a100",
                                admin_comment=record(mate=mates.get(j.job_id, 0)))
            for j in sorted(jobs, key=lambda j: j.job_id)]


def state(**kw: object) -> dict[str, Any]:
    """A state file of a sidecar with sharing on (node4: 2 shards per GPU)."""
    base: dict[str, Any] = {"epoch": 3, "time": 1000.0, "policy": "hadar", "jobs": {},
                            "sharing": "on", "share": True, "shards": {"node4": 2}}
    base.update(kw)
    return base


def pending(job_id: int, *, comment: str = HINT, admin: str = "", gres: str = "gpu",
            count: int = 1) -> SlurmJob:
    return SlurmJob(
        job_id=job_id, name=f"j{job_id}", user="alice", state="PENDING", state_flags=(),
        state_reason="Resources", partition="gpu", nodes="", node_names=(),
        gres=(Gres(gres, None, count),), features="v100", comment=comment,
        admin_comment=admin, priority=0, submit_time=1000, start_time=None,
        time_limit_min=None)


def sharing_lines(text: str) -> list[str]:
    words = ("shar", "shard")
    return [line for line in text.splitlines()
            if any(w in line for w in words) and not line.startswith("hints:")]


# -- explain ------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", VERSIONS)
def test_explain_names_the_job_on_the_other_shard(v: str) -> None:
    jobs = captured(v)
    for me, other in ((1, 2), (2, 1)):
        text = explain(me, jobs, None)
        assert f"sharing GPU 0 of node4 with job {other} (one shard each)" in text.splitlines()
    # job 3 holds a GPU whole: nothing about sharing
    assert sharing_lines(explain(3, jobs, None)) == []


@pytest.mark.parametrize("v", VERSIONS)
def test_explain_of_a_job_alone_on_its_gpu(v: str) -> None:
    # job 4 holds both shards of GPU 2: 24.11 and later print the GPU's shard count in the
    # job's gres_detail, 22.05 does not (the state file's shards per GPU say it then)
    jobs = captured(v)
    full = "runs alone on GPU 2 of node4 as a shard job, on all 2 of its shards"
    if v == "22.05":
        assert sharing_lines(explain(4, jobs, None)) == [
            "runs alone on GPU 2 of node4 as a shard job (2 shards)"]
    else:
        assert sharing_lines(explain(4, jobs, None)) == [full]
    assert sharing_lines(explain(4, jobs, state())) == [full]
    # job 2 ended: job 1 is alone on GPU 0, whose other shard is free
    alone = [j for j in jobs if j.job_id != 2]
    lines = sharing_lines(explain(1, alone, state()))
    assert lines == ["runs alone on GPU 0 of node4 as a shard job (another job may join it)"]


def test_explain_of_a_pair_placed_but_not_started() -> None:
    text = explain(411, [pending(411, gres="shard", admin=record("node3", mate=412))], None)
    assert sharing_lines(text) == [
        "placed to share one GPU of node3 with job 412 (one shard each)"]
    # the same job without a partner in its record says nothing of sharing
    assert sharing_lines(explain(411, [pending(411, admin=record("node3"))], None)) == []


def test_explain_of_a_job_that_opted_out() -> None:
    # share=no: said once, and not the state's "sharing is off" either
    text = explain(7, [pending(7, comment=OPTED_OUT)], state(sharing=NO_PAIRS))
    assert sharing_lines(text) == ["never shares a GPU (hint share=no)"]


def test_explain_says_why_sharing_is_off_once_for_a_one_gpu_job() -> None:
    jobs = [pending(7), pending(8, count=2)]
    assert sharing_lines(explain(7, jobs, state(sharing=NO_PAIRS))) == [
        f"GPU sharing: off ({NO_PAIRS})"]
    assert sharing_lines(explain(7, jobs, state(sharing="off ([scheduler] share = false)"))) \
        == ["GPU sharing: off ([scheduler] share = false)"]
    # a 2-GPU job never shares; sharing on says nothing; the config's own off says nothing
    assert sharing_lines(explain(8, jobs, state(sharing=NO_PAIRS))) == []
    assert sharing_lines(explain(7, jobs, state())) == []
    assert sharing_lines(explain(7, jobs, state(
        sharing="off ([scheduler] share = false)", share=False))) == []
    assert sharing_lines(explain(7, jobs, None)) == []  # (no state file)


@pytest.mark.parametrize(("detail", "error"), [
    ("shard:1(IDX:0,2)", ShardError),  # several GPUs without counts
    ("shard:zz((", SlurmParseError),
    ("shard:1(IDX:a-b)", SlurmParseError),
    ("shard:1(1/2,x/2)", SlurmParseError),
    ("shard:1(1/x)", None),  # (read as no GPU at all)
])
def test_unreadable_gres_detail_never_breaks_status_or_explain(
        detail: str, error: type[Exception] | None) -> None:
    jobs = captured("24.11")
    jobs[1] = dataclasses.replace(jobs[1], gres_detail=(detail,))
    if error is not None:  # what the parsers make of it: status and explain catch it
        with pytest.raises(error):
            job_shards_on(jobs[1], "node4")
    assert held_shards(jobs[1], {"node4": 2}) == []
    text = explain(2, jobs, state())
    assert sharing_lines(text) == [] and "record in Slurm" in text
    # job 2 cannot be read: job 1 shows as if alone (never a crash)
    assert sharing_lines(explain(1, jobs, state())) == [
        "runs alone on GPU 0 of node4 as a shard job (another job may join it)"]
    rows = {r["job"]: r for r in status_rows(jobs, state())}
    assert "shares" not in rows["1"]["why"] and "shares" not in rows["2"]["why"]
    assert rows["2"]["gpus"] == "1/2"  # (from the request and the state's shards per GPU)
    format_status(jobs, state())


# -- status ------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", VERSIONS)
def test_status_rows_of_a_pair(v: str) -> None:
    jobs = captured(v)
    rows = {r["job"]: r for r in status_rows(jobs, None)}
    assert rows["1"]["why"] == "runs where epoch 3 placed it; shares GPU 0 of node4 with job 2"
    assert rows["2"]["why"] == "runs where epoch 3 placed it; shares GPU 0 of node4 with job 1"
    assert rows["3"]["why"] == rows["4"]["why"] == "runs where epoch 3 placed it"
    # gpus: S/T for shards (22.05 prints no per-GPU count: the state file's shards tell it)
    gpus = {k: r["gpus"] for k, r in rows.items()}
    if v == "22.05":
        assert gpus == {"1": "1 shard", "2": "1 shard", "3": "1", "4": "2 shards"}
    else:
        assert gpus == {"1": "1/2", "2": "1/2", "3": "1", "4": "2/2"}
    with_state = {r["job"]: r["gpus"] for r in status_rows(jobs, state())}
    assert with_state == {"1": "1/2", "2": "1/2", "3": "1", "4": "2/2"}
    table = format_status(jobs, state())
    assert "shares GPU 0 of node4 with job 2" in table
    # a state file whose shards make no sense is not used (never an error)
    odd = {r["job"]: r["gpus"] for r in status_rows(jobs, state(shards={"node4": "2"}))}
    assert odd == gpus


def test_a_non_hadar_job_that_shares_says_so_too() -> None:
    jobs = [dataclasses.replace(j, comment="", admin_comment="") for j in captured("26.05")]
    rows = {r["job"]: r for r in status_rows(jobs, None)}
    assert rows["1"]["why"] == ("not a hadar job: Slurm schedules it; shares GPU 0 of node4 "
                                "with job 2")
    assert rows["3"]["why"] == "not a hadar job: Slurm schedules it"


def test_status_of_a_pair_placed_but_not_started() -> None:
    jobs = [pending(411, gres="shard", admin=record("node3", mate=412)),
            pending(412, gres="shard", admin=record("node3", mate=411)),
            pending(413, gres="shard")]
    rows = {r["job"]: r for r in status_rows(jobs, state(shards={"node3": 2}))}
    assert rows["411"]["why"] == ("placed by epoch 3 to share one GPU of node3 with job 412; "
                                  "Slurm starts it when its GPUs are free")
    assert rows["411"]["gpus"] == "1/2"
    assert rows["413"]["gpus"] == "1 shard"  # (not placed: its node's shards are not known)
    rows = {r["job"]: r for r in status_rows(jobs, None)}
    assert rows["412"]["gpus"] == "1 shard"


# -- the state file and the metrics, from a backend over the 24.11 capture ----------------------


def sharing_backend(share: bool = True) -> tuple[FakeSlurm, SlurmBackend]:
    jobs = captured("24.11")
    nodes = list(parse_sinfo_json((DATA / "24.11-sinfo.json").read_text()))
    api = FakeSlurm(jobs, nodes)
    api.version = "slurm 24.11.5"
    b = backend(api, share=share)
    b.slurm_version = parse_version(api.version)
    return api, b


def epoch(b: SlurmBackend, packed: Sequence[tuple[int, int]] = ((1, 2),),
          dry_run: bool = False) -> tuple[Decision, dict[str, Any]]:
    # node4 is the 4th node of the capture's sinfo; a pending job 5 is placed beside job 2's
    # partner in the decision (packed)
    decision, _ = decide(b, {1: [(0, 1)], 2: [(0, 1)], 3: [(0, 1)], 4: [(0, 1)]})
    decision = dataclasses.replace(decision, packed=tuple(packed))
    snap = b.snapshot(0, 2000.0, 60.0, None)
    config = dataclasses.replace(default_config(), dry_run=dry_run)
    return decision, json.loads(json.dumps(epoch_state(config, b, snap, decision)))


def test_the_state_file_says_who_shares_with_whom() -> None:
    _api, b = sharing_backend()
    _decision, st = epoch(b)
    assert st["sharing"] == "on" and st["share"] is True
    assert st["shards"] == {"node1": 2, "node2": 2, "node3": 2, "node4": 2}
    jobs = st["jobs"]
    assert {k: (v["shard_gpu"], v["mate"], v["shares_with"]) for k, v in jobs.items()} == {
        "1": (0, 2, 2), "2": (0, 1, 1), "3": (None, 0, None), "4": (2, 0, None)}


def test_the_state_file_says_why_sharing_is_off() -> None:
    _api, b = sharing_backend(share=False)
    _decision, st = epoch(b, packed=())
    assert st["sharing"] == "off ([scheduler] share = false)" and st["share"] is False
    # the pair runs all the same (Slurm's doing): the read says so
    assert st["jobs"]["1"]["mate"] == 2 and st["jobs"]["1"]["shares_with"] is None
    api, b = sharing_backend()
    api.version = "slurm 22.05.8"
    b.slurm_version = parse_version(api.version)
    _decision, st = epoch(b, packed=())
    assert st["sharing"].startswith("Slurm 22.05.8 cannot turn a job's GPU request into shards")


def test_dry_run_status_and_explain_name_the_planned_partner() -> None:
    api, b = sharing_backend()
    api.jobs[5] = dataclasses.replace(pending(5), features="")
    decision, _ = decide(b, {5: [(3, 1)], 4: [(3, 1)]})
    decision = dataclasses.replace(decision, packed=((4, 5),))
    snap = b.snapshot(0, 2000.0, 60.0, None)
    st = json.loads(json.dumps(epoch_state(
        dataclasses.replace(default_config(), dry_run=True), b, snap, decision)))
    assert st["jobs"]["5"]["shares_with"] == 4
    rows = {r["job"]: r for r in status_rows(list(api.jobs.values()), st)}
    assert rows["5"]["why"] == "dry run: would be placed on node4:1, sharing one GPU with job 4"
    assert "placed on node4:1 (a100), sharing one GPU with job 4" in explain(
        5, list(api.jobs.values()), st)


def test_metrics_count_the_shared_gpus_and_their_jobs() -> None:
    _api, b = sharing_backend()
    decision, _st = epoch(b)
    snap = b.snapshot(1, 2060.0, 60.0, None)
    rec = EpochRecord(epoch=1, start=2060.0, num_jobs=4, num_placed=4, decision_s=0.01,
                      changes=0)
    summary = summarize_epoch(rec, 0.5, snap, decision, b, FinishTracker())
    assert dict(summary.shared_gpus) == {"a100": 1, "k80": 0, "p100": 0, "v100": 0}
    assert summary.sharing_jobs == 2 and summary.sharing_offered is True
    fields = summary.log_fields()
    assert fields["shared_gpus"] == {"a100": 1, "k80": 0, "p100": 0, "v100": 0}
    assert fields["sharing_jobs"] == 2
    m = SidecarMetrics("hadar")
    before = samples(m.exposition())
    assert before[("hadar_sharing_jobs", ())] == 0
    assert before[("hadar_sharing_offered", ())] == 0
    m.observe(summary)
    s = samples(m.exposition())
    assert s[("hadar_shared_gpus", (("gpu_type", "a100"),))] == 1
    assert s[("hadar_shared_gpus", (("gpu_type", "v100"),))] == 0
    assert s[("hadar_sharing_jobs", ())] == 2
    assert s[("hadar_sharing_offered", ())] == 1
    # sharing turned off, the pair gone: the gauges go back to 0
    m.observe(dataclasses.replace(summary, shared_gpus={}, sharing_jobs=0,
                                  sharing_offered=False))
    s = samples(m.exposition())
    assert s[("hadar_shared_gpus", (("gpu_type", "a100"),))] == 0
    assert s[("hadar_sharing_jobs", ())] == 0 and s[("hadar_sharing_offered", ())] == 0


def test_metrics_of_a_sidecar_with_sharing_off() -> None:
    _api, b = sharing_backend(share=False)
    decision, _st = epoch(b, packed=())
    rec = EpochRecord(epoch=0, start=2000.0, num_jobs=4, num_placed=4, decision_s=0.01,
                      changes=0)
    summary = summarize_epoch(rec, 0.5, None, decision, b, FinishTracker())
    # not offered, but the pair Slurm runs is still counted
    assert summary.sharing_offered is False and summary.sharing_jobs == 2
    assert summary.shared_gpus["a100"] == 1


def test_the_metrics_are_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "admins.md").read_text()
    table = doc.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    source = (Path(__file__).resolve().parent.parent / "hadar_slurm" / "sidecar"
              / "metrics.py").read_text()
    for name in ("hadar_shared_gpus", "hadar_sharing_jobs", "hadar_sharing_offered"):
        assert f"`{name}" in table, name
        assert f"    {name}" in source, name  # the module docstring's list
