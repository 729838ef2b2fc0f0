"""GPU sharing in the sidecar (issue #16): what the observer offers the policy, how reconcile
turns a decision's pairs into changes, and how the applier places a pair through Slurm's
``gres/shard`` (one shard of one GPU each), refusing where Slurm's first fit would split it.

The Slurm side is in memory here (tests/test_sidecar_backend.py's FakeSlurm, with shard
gres in the form Slurm 24.11 prints it); tests/test_share_cluster.py runs the same on real
Slurm.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.loop import Change, ChangeKind
from hadar_slurm.policy.base import Decision, Placement, Reason
from hadar_slurm.policy.hadar import HadarPolicy
from hadar_slurm.rates.memory import MemoryLimits
from hadar_slurm.rates.table import default_table
from hadar_slurm.runtime.colocation import SHARING_FILE
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.config import default_config
from hadar_slurm.sidecar.controller import share_setting
from hadar_slurm.sidecar.observe import Observed
from hadar_slurm.sidecar.reconcile import reconcile
from hadar_slurm.sidecar.record import JobRecord, decode
from hadar_slurm.slurm.parse import Gres, SlurmJob, SlurmNode
from hadar_slurm.slurm.version import parse_version
from tests.test_reconcile import decision as decision_of
from tests.test_reconcile import kinds, observed, view
from tests.test_sidecar_backend import FakeSlurm, backend, job, node

#: Two jobs whose pair Gavel's table allows on a v100, and one that may share with neither.
RESNET = "hadar: model=resnet50 bs=64 steps=40000 preempt=checkpoint"
A3C = "hadar: model=a3c steps=40000 preempt=checkpoint"
OPTED_OUT = "hadar: model=resnet50 bs=64 steps=40000 preempt=checkpoint share=no"
#: Two of these on one v100 each keep all of their speed (Gavel's table): a pair always pays.
RESNET18 = "hadar: model=resnet18 bs=32 steps=40000 preempt=checkpoint"


def shard_node(name: str, gpu_type: str, gpus: int, used: tuple[int, ...],
               per_gpu: int = 2) -> SlurmNode:
    """A node whose GPUs have ``per_gpu`` shards each, ``used[k]`` of GPU k's in use (as
    24.11's ``gres_used`` prints them)."""
    base = node(name, gpu_type, gpus)
    text = (f"gpu:{gpu_type}:0(IDX:N/A),shard:{gpu_type}:{sum(used)}("
            + ",".join(f"{u}/{per_gpu}" for u in used) + ")")
    return dataclasses.replace(
        base, gres=(Gres("gpu", gpu_type, gpus), Gres("shard", gpu_type, gpus * per_gpu)),
        gres_used=(Gres("gpu", gpu_type, 0), Gres("shard", gpu_type, sum(used))),
        gres_used_text=text)


def shard_job(job_id: int, gpu: int, gpus: int = 4, *, comment: str = RESNET,
              on: str = "node1") -> SlurmJob:
    """A job running on one shard of GPU ``gpu`` of ``on`` (24.11's ``gres_detail``)."""
    detail = ",".join("1/2" if k == gpu else "0/2" for k in range(gpus))
    j = job(job_id, state="RUNNING", reason="None", comment=comment, nodes=(on,), start=1900,
            admin=JobRecord(epoch=0, state="placed", place=((on, 1),), gpus=1).encode())
    return dataclasses.replace(j, gres=(Gres("shard", None, 1),),
                               gres_detail=(f"shard:1({detail})",))


def pending(job_id: int, comment: str = RESNET, gpus: int = 1) -> SlurmJob:
    return job(job_id, comment=comment, gpus=gpus)


class Recording(FakeSlurm):
    """FakeSlurm that keeps the fields of every update."""

    def __init__(self, jobs: list[SlurmJob], nodes: list[SlurmNode]) -> None:
        super().__init__(jobs, nodes)
        self.version = "slurm 24.11.5"
        self.fields: dict[int, dict[str, str]] = {}

    def update_job(self, job_id: int, fields: Mapping[str, str]) -> None:
        super().update_job(job_id, fields)
        self.fields.setdefault(job_id, {}).update(fields)


def sharing(api: FakeSlurm, **kw: object) -> SlurmBackend:
    b = backend(api, share=True, **kw)
    b.slurm_version = parse_version(api.version)
    return b


def two_nodes(used: tuple[int, ...] = (0, 0, 0, 0)) -> list[SlurmNode]:
    return [shard_node("node1", "v100", 4, used), node("node2", "p100", 4)]


# -- what the observer offers ------------------------------------------------------------------


def test_the_snapshot_offers_pairs_only_where_slurm_can_make_them() -> None:
    jobs = [shard_job(1, 0), shard_job(2, 0, comment=A3C), shard_job(3, 1),
            pending(4), pending(5, comment=OPTED_OUT), pending(6, gpus=2),
            # someone else's shard job on GPU 2 (no hints): its GPU is not the policy's
            dataclasses.replace(shard_job(7, 2), comment="", admin_comment=""),
            job(8, state="RUNNING", reason="None", nodes=("node2",), start=1900,
                admin=JobRecord(epoch=0, state="placed", place=(("node2", 1),),
                                gpus=1).encode())]
    api = Recording(jobs, two_nodes((2, 1, 1, 0)))
    b = sharing(api)
    snap = b.snapshot(1, 2000.0, 60.0, None)
    ids = snap.job_ids.tolist()
    assert ids == [1, 2, 3, 4, 5, 6, 8]
    assert snap.colocated is b.table.colocated and len(b.table.pairs) > 0
    assert snap.packed == ((1, 2),) and b.pairs == ((1, 2),)
    assert b.views[1].shard_gpu == 0 and b.views[1].mate == 2 and b.views[3].mate == 0

    def mask(values: object) -> dict[int, bool]:
        assert isinstance(values, np.ndarray)
        return dict(zip(ids, values.tolist(), strict=True))

    # 5 opted out, 6 has two GPUs, 8 holds a whole GPU
    assert mask(snap.may_share) == {1: True, 2: True, 3: True, 4: True, 5: False, 6: False,
                                    8: False}
    # a new partner may join a job that waits, or one alone on a GPU with a free shard
    assert mask(snap.may_host) == {1: False, 2: False, 3: True, 4: True, 5: False, 6: False,
                                   8: False}
    assert mask(snap.may_join) == {1: False, 2: False, 3: False, 4: True, 5: False, 6: False,
                                   8: False}
    assert snap.share_nodes is not None and snap.share_nodes.tolist() == [True, False]
    # node1: GPU 2 is the other job's (as a shard: not in the node's count of used GPUs)
    assert snap.node_gpus.tolist() == [3, 4]



def test_a_job_that_may_not_be_stopped_forms_no_new_pair() -> None:
    # job 1 runs alone on GPU 0's shards and may not be stopped (no preempt hint): the policy
    # sees it, fixed where it runs, but no job may join it (nor may it join one)
    never = "hadar: model=resnet50 bs=64 steps=40000"
    api = Recording([shard_job(1, 0, comment=never), pending(2)], two_nodes((1, 0, 0, 0)))
    b = sharing(api)
    snap = b.snapshot(1, 2000.0, 60.0, None)
    assert snap.job_ids.tolist() == [2, 1] and 1 in b.pinned
    assert snap.fixed is not None and snap.fixed.tolist() == [False, True]
    assert snap.may_share is not None and snap.may_share.tolist() == [True, False]
    assert snap.may_host is not None and snap.may_host.tolist() == [True, False]
    assert snap.node_gpus.tolist() == [4, 4]  # its GPU is hadar's: it holds it in ``current``
    assert snap.current.by_job_sorted() == {1: [(0, 1)]}


@pytest.mark.parametrize("why, change", [
    ("22.05", {"version": "slurm 22.05.8"}),
    ("share = false", {"share": False}),
])
def test_sharing_is_not_offered_where_it_cannot_be(why: str, change: dict[str, object]) -> None:
    api = Recording([shard_job(1, 0), pending(2)], two_nodes((1, 0, 0, 0)))
    if "version" in change:
        api.version = str(change["version"])
    b = backend(api, share=bool(change.get("share", True)))
    snap = b.snapshot(0, 2000.0, 60.0, None)
    assert snap.colocated is None and snap.may_host is None
    assert why in b.share_off
    # what runs is still read right: the shard job holds GPU 0 of node1
    assert b.views[1].shard_gpu == 0 and snap.node_gpus.tolist() == [4, 4]


def test_hadar_pairs_only_what_the_snapshot_allows() -> None:
    # One v100 with two shards; job 1 runs alone on it as a shard job, 2 holds the other GPU
    # whole, 3 and 4 wait: Hadar may pair 3 (or 4) with 1, never with 2.
    jobs = [shard_job(1, 0, gpus=2, comment=RESNET18),
            dataclasses.replace(job(2, state="RUNNING", reason="None", nodes=("node1",),
                                    start=1900, admin=JobRecord(
                                        epoch=0, state="placed", place=(("node1", 1),),
                                        gpus=1).encode()),
                                gres_detail=("gpu:v100:1(IDX:1)",)),
            pending(3, comment=RESNET18), pending(4, comment=RESNET18)]
    api = Recording(jobs, [shard_node("node1", "v100", 2, (1, 0))])
    b = sharing(api)
    snap = b.snapshot(1, 2000.0, 360.0, None)
    d = HadarPolicy(share=True).allocate(snap)
    assert d.packed and all(1 in pair for pair in d.packed)
    joined = [j for pair in d.packed for j in pair if j != 1]
    assert joined[0] in (3, 4)
    # where the world forbids every host, no pair is formed
    none = dataclasses.replace(snap, may_host=np.zeros(snap.num_jobs, dtype=np.bool_))
    assert HadarPolicy(share=True).allocate(none).packed == ()


# -- reconcile ---------------------------------------------------------------------------------


def packed(d: Decision, *pairs: tuple[int, int]) -> Decision:
    return dataclasses.replace(d, packed=tuple(pairs))


def test_reconcile_places_a_pair_that_waits_and_a_guest_beside_a_lone_shard_job() -> None:
    lone = dataclasses.replace(view(5, running=True, rows=((0, 1),)), shard_gpu=1)
    obs = observed(view(1), view(2), view(3), lone, view(6))
    d = packed(decision_of(2, {1: {0: [(0, 1)]}, 2: {0: [(0, 1)]}, 3: {0: [(1, 1)]},
                               5: {0: [(0, 1)]}, 6: {0: [(0, 1)]}}), (1, 2), (5, 6))
    out = reconcile_(obs, d)
    assert kinds(out) == [("keep", 5), ("place", 1), ("place", 2), ("place", 3),
                          ("place", 6)]
    mates = {c.job_id: c.mate for c in out}
    assert mates == {5: 0, 1: 2, 2: 1, 3: 0, 6: 5}


def reconcile_(obs: Observed, d: Decision) -> list[Change]:
    return reconcile(obs, d)


def test_reconcile_makes_the_later_job_wait_where_slurm_cannot_pair() -> None:
    whole = view(5, running=True, rows=((0, 1),))  # holds its GPU whole (no shard)
    full = dataclasses.replace(view(7, running=True, rows=((2, 1),)), shard_gpu=0, mate=8)
    obs = observed(view(1, gpus=2), view(2, gpus=2), whole, view(6), full, view(9))
    d = packed(decision_of(1, {1: {0: [(1, 2)]}, 2: {0: [(1, 2)]}, 5: {0: [(0, 1)]},
                               6: {0: [(0, 1)]}, 7: {0: [(2, 1)]}, 9: {0: [(2, 1)]}}),
               (1, 2), (5, 6), (7, 9))
    out = {c.job_id: c for c in reconcile_(obs, d)}
    assert out[1].kind is ChangeKind.PLACE and out[1].mate == 0  # the earlier runs alone
    assert out[2].kind is ChangeKind.WAIT and "only two 1-GPU jobs" in out[2].why
    assert out[6].kind is ChangeKind.WAIT and "holds its GPU whole" in out[6].why
    assert out[9].kind is ChangeKind.WAIT and "shared with job 8 already" in out[9].why
    assert out[5].kind is ChangeKind.KEEP and out[7].kind is ChangeKind.KEEP


def test_a_running_pair_is_kept() -> None:
    a = dataclasses.replace(view(1, running=True, rows=((0, 1),)), shard_gpu=0, mate=2)
    b = dataclasses.replace(view(2, running=True, rows=((0, 1),)), shard_gpu=0, mate=1)
    d = packed(decision_of(3, {1: {0: [(0, 1)]}, 2: {0: [(0, 1)]}}), (1, 2))
    assert kinds(reconcile_(observed(a, b), d)) == [("keep", 1), ("keep", 2)]


# -- apply -------------------------------------------------------------------------------------


def place(b: SlurmBackend, rows: dict[int, list[tuple[int, int]]],
          pairs: tuple[tuple[int, int], ...], epoch: int = 1) -> None:
    snap = b.snapshot(epoch, 2000.0, 60.0, None)
    jobs_ = [j for j, rr in rows.items() for _ in rr]
    nodes_ = [n for rr in rows.values() for n, _ in rr]
    counts = [c for rr in rows.values() for _, c in rr]
    d = Decision(epoch, Placement(np.array(jobs_, dtype=np.int64),
                                  np.array(nodes_, dtype=np.int64),
                                  np.array(counts, dtype=np.int64)),
                 np.full(snap.num_jobs, Reason.PLACED, dtype=np.int8), packed=pairs)
    b.apply(b.reconcile(snap, d), 2000.0)


def mine(j: SlurmJob, workdir: Path) -> SlurmJob:
    """``j`` as a job of this process's user, working in ``workdir``."""
    return dataclasses.replace(j, user=pwd.getpwuid(os.geteuid()).pw_name,
                               user_id=os.geteuid(), group_id=os.getegid(),
                               workdir=str(workdir))


def test_a_pair_is_placed_on_one_shard_each_and_told_of_each_other(tmp_path: Path) -> None:
    jobs = [mine(pending(1), tmp_path), mine(pending(2, comment=A3C), tmp_path)]
    api = Recording(jobs, two_nodes())
    b = sharing(api)
    place(b, {1: [(0, 1)], 2: [(0, 1)]}, ((1, 2),))
    for j, mate in ((1, 2), (2, 1)):
        f = api.fields[j]
        assert f["TresPerNode"] == "gres/shard:1" and f["NumNodes"] == "1"
        assert f["NodeList"] == "node1" and f["Features"] == "v100"
        assert decode(f["AdminComment"]).mate == mate
        told = json.loads((tmp_path / ".hadar-tracker" / str(j) / SHARING_FILE).read_text())
        assert told["partner"] == mate and told["gpu_type"] == "v100"
    # both updates come before either release
    order = [w for w in api.log if w[0] in ("update", "release")]
    assert order.index(("release", 1)) > order.index(("update", 2))
    assert ("release", 2) in order


def test_a_pair_that_first_fit_would_split_is_not_placed() -> None:
    # GPU 0 has one free shard (its other job ended), GPUs 1-3 are free: the first job of a
    # pair would get GPU 0 and the second GPU 1.  The earlier job runs alone (a whole GPU),
    # the later one waits with the reason.
    other = dataclasses.replace(shard_job(9, 0), comment="", admin_comment="")
    api = Recording([pending(1), pending(2), other], two_nodes((1, 0, 0, 0)))
    b = sharing(api)
    place(b, {1: [(0, 1)], 2: [(0, 1)]}, ((1, 2),))
    assert api.fields[1].get("TresPerNode", "gres:gpu:1") == "gres:gpu:1"
    assert decode(api.fields[1]["AdminComment"]).mate == 0
    assert ("release", 1) in api.log and ("release", 2) not in api.log
    assert "would take both" in b.report.detail[2]


def test_a_pair_is_not_placed_where_the_node_has_no_cpu_for_both() -> None:
    # node1 has 4 CPUs. Three are in use: the pair's two jobs need two, so the second would wait
    # for a CPU and then get whichever GPU has a free shard. The earlier job runs alone, the
    # later waits with the reason. With two CPUs free, the pair is placed.
    nodes = two_nodes()
    busy = [dataclasses.replace(nodes[0], alloc_cpus=3), nodes[1]]
    api = Recording([pending(1), pending(2)], busy)
    b = sharing(api)
    place(b, {1: [(0, 1)], 2: [(0, 1)]}, ((1, 2),))
    assert api.fields[1].get("TresPerNode", "gres:gpu:1") == "gres:gpu:1"
    assert ("release", 1) in api.log and ("release", 2) not in api.log
    assert "1 free CPU(s) for the 2" in b.report.detail[2]
    # (the policy is told the CPUs, so that it does not offer such a pair: one free on node1;
    # node2, whose read gives no CPU figures, is not limited by them)
    api = Recording([pending(1), pending(2)], [busy[0], dataclasses.replace(
        nodes[1], cpus=None)])
    snap = sharing(api).snapshot(1, 2000.0, 60.0, None)
    assert snap.node_free_cpus is not None and snap.cpus is not None
    assert snap.node_free_cpus.tolist() == [1, np.iinfo(np.int32).max]
    assert snap.cpus.tolist() == [1, 1]
    api = Recording([pending(1), pending(2)], [dataclasses.replace(nodes[0], alloc_cpus=2),
                                               nodes[1]])
    b = sharing(api)
    place(b, {1: [(0, 1)], 2: [(0, 1)]}, ((1, 2),))
    assert api.fields[2]["TresPerNode"] == "gres/shard:1" and ("release", 2) in api.log


def test_a_job_placed_but_not_started_holds_its_cpus_for_the_policy_as_for_the_applier(
        ) -> None:
    # Job 1 was placed on node1 last epoch and released; Slurm has not started it, so the
    # node's read does not count its CPU.  The policy keeps it there (a row of ``current``)
    # and the applier counts its CPU if the pair places it again: the snapshot takes it off
    # the free ones, so that the policy offers no pair the applier refuses for CPUs.
    placed = job(1, reason="Priority", comment=RESNET18, admin=JobRecord(
        epoch=0, state="placed", place=(("node1", 1),), gpus=1).encode())
    for alloc, pair in ((3, False), (2, True)):
        nodes = [dataclasses.replace(shard_node("node1", "v100", 1, (0,)), alloc_cpus=alloc)]
        api = Recording([placed, pending(2, comment=RESNET18)], nodes)
        b = sharing(api)
        snap = b.snapshot(2, 2000.0, 360.0, None)
        assert snap.node_free_cpus is not None
        assert snap.node_free_cpus.tolist() == [4 - alloc - 1]
        d = HadarPolicy(share=True).allocate(snap)
        assert (d.packed == ((1, 2),)) is pair, (alloc, d.packed)
        b.apply(b.reconcile(snap, d), 2000.0)
        assert not any("free CPU" in why for why in b.report.detail.values()), b.report.detail


def test_a_guest_joins_a_lone_shard_job_only_where_first_fit_sends_it_there() -> None:
    # job 1 runs alone on GPU 1's shards; GPU 0 is free: a shard job released now would get
    # GPU 0, not GPU 1, so job 2 waits.  With GPU 0 given whole to someone else, it joins.
    lone = shard_job(1, 1)
    api = Recording([lone, pending(2)], two_nodes((0, 1, 0, 0)))
    b = sharing(api)
    place(b, {1: [(0, 1)], 2: [(0, 1)]}, ((1, 2),))
    assert ("release", 2) not in api.log and "not GPU 1" in b.report.detail[2]
    whole = dataclasses.replace(job(9, state="RUNNING", reason="None", nodes=("node1",),
                                    comment="", admin=""), gres_detail=("gpu:v100:1(IDX:0)",))
    node1 = dataclasses.replace(
        two_nodes((0, 1, 0, 0))[0],
        gres_used_text="gpu:v100:1(IDX:0),shard:v100:1(-/2,1/2,0/2,0/2)")
    api = Recording([lone, pending(2), whole], [node1, node("node2", "p100", 4)])
    b = sharing(api)
    place(b, {1: [(0, 1)], 2: [(0, 1)]}, ((1, 2),), epoch=2)
    assert api.fields[2]["TresPerNode"] == "gres/shard:1"
    assert decode(api.fields[2]["AdminComment"]).mate == 1 and ("release", 2) in api.log


def test_a_job_placed_alone_after_sharing_gets_its_gpu_back() -> None:
    # a job that last ran as a shard job (requeued) asks for no GPU: placed alone, its request
    # is rewritten to a whole GPU
    was_shard = dataclasses.replace(pending(1), gres=(Gres("shard", None, 1),))
    api = Recording([was_shard], two_nodes())
    b = sharing(api)
    place(b, {1: [(1, 1)]}, ())
    assert api.fields[1]["TresPerNode"] == "gres:gpu:1"
    assert decode(api.fields[1]["AdminComment"]).mate == 0


# -- the config --------------------------------------------------------------------------------


def test_share_is_off_by_default_and_refused_for_a_policy_that_cannot_share() -> None:
    config = default_config()
    assert config.share is False and share_setting(config) == {}
    on = config.with_overrides(share=True)
    assert share_setting(on) == {"share": True}  # (hadar, the default policy)
    with pytest.raises(InputError) as err:
        share_setting(on.with_overrides(policy="gavel-las"))
    assert err.value.field == "[scheduler] share" and "hadar, hadare" in err.value.one_line()


def test_only_shard_jobs_waiting_for_the_node_keep_a_pair_off_it() -> None:
    # someone's shard job waits (not held) for node2: a pair on node1 goes ahead; one waiting
    # for node1 (or for any node) keeps it off, since which GPU each gets cannot be foreseen
    for required, placed in (("node2", True), ("node1", False), ("", False)):
        other = dataclasses.replace(pending(9, comment=""), state_reason="Resources",
                                    gres=(Gres("shard", None, 1),), required_nodes=required,
                                    admin_comment="")
        api = Recording([pending(1), pending(2), other], two_nodes())
        b = sharing(api)
        place(b, {1: [(0, 1)], 2: [(0, 1)]}, ((1, 2),))
        assert (("release", 2) in api.log) is placed, (required, b.report.detail)
        if not placed:
            assert "wait for node1 too" in b.report.detail[2]


def test_the_sharing_event_says_why_pairs_do_not_fit_in_memory(
        caplog: pytest.LogCaptureFixture) -> None:
    # ResNet-50 and A3C at 9,000 MiB a worker each: 18,000 MiB do not fit in a v100's 16,384
    # less 512 kept free, so Gavel's measured pair is refused, and the event says so in MiB.
    r50, a3c = "ResNet-50 (batch size 64)", "A3C"
    memory = MemoryLimits({(r50, 1): {"v100": 9000.0}, (a3c, 1): {"v100": 9000.0}})
    table = dataclasses.replace(default_table(), memory=memory)
    api = Recording([shard_job(1, 0), pending(2, comment=A3C)], two_nodes((1, 0, 0, 0)))
    b = SlurmBackend(api, table, preempt_grace_s=5.0, sleep=lambda s: None, share=True)
    b.slurm_version = parse_version(api.version)
    with caplog.at_level(logging.INFO, logger="hadar_slurm"):
        b.snapshot(1, 2000.0, 60.0, None)
    events = [getattr(r, "hadar_fields", {}) for r in caplog.records if r.msg == "sharing"]
    assert events and events[0]["on"] is True
    why = (f"{a3c} (9000 MiB) and {r50} (9000 MiB) need 18000 MiB; a v100 has 16384 MiB, "
           "512 of it kept free")
    assert why in events[0]["memory_refused_first"]
    assert events[0]["memory_refused"] >= 1
