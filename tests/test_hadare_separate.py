"""HadarE moves apart the copies of one job that Hadar's matcher put on one node
(:func:`hadar_slurm.policy.hadare.separate_copies`), by swaps that change nothing but who is
where: worked by hand, then checked on random placements of copies."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hadar_slurm.policy.base import Placement, Snapshot
from hadar_slurm.policy.hadare import HadarEPolicy, separate_copies
from tests.test_hadare_merge import merge_case


def virt_snapshot(node_type: list[int], node_gpus: list[int], owner: list[int],
                  current: Placement | None = None) -> Snapshot:
    """A virtual snapshot (one job per copy, ids 0..) on nodes of the given types and sizes."""
    n = len(owner)
    rate = np.ones((n, 2))
    return Snapshot(
        epoch=1, now=0.0, round_s=360.0, gpu_types=("v100", "k80"),
        node_names=tuple(f"n{k}" for k in range(len(node_type))),
        node_type=np.array(node_type, dtype=np.int64),
        node_gpus=np.array(node_gpus, dtype=np.int64),
        job_ids=np.arange(n, dtype=np.int64), job_types=("ResNet-18 (batch size 32)",) * n,
        arrival=np.zeros(n), total=np.full(n, 100.0), remaining=np.full(n, 100.0),
        scale=np.ones(n, dtype=np.int64), weight=np.ones(n), sync=np.ones(n, dtype=np.bool_),
        rate=rate, attained=np.zeros_like(rate),
        current=current if current is not None else Placement.empty(),
        pool=np.array(owner, dtype=np.int64))


def rows(job: list[int], node: list[int], count: list[int]) -> Placement:
    return Placement(np.array(job, dtype=np.int64), np.array(node, dtype=np.int64),
                     np.array(count, dtype=np.int64))


def where(p: Placement) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for j, k in zip(p.job.tolist(), p.node.tolist(), strict=True):
        out.setdefault(j, []).append(k)
    return out


def test_a_copy_on_its_twins_node_trades_places_with_another_job() -> None:
    # Job 0 runs as copies 0 and 1 (virtual 0, 1), jobs 1 and 2 as one each (virtual 2, 3);
    # two v100 nodes of 2 GPUs. The matcher put both copies on node 0.
    owner = [0, 0, 1, 2]
    virt = virt_snapshot([0, 0], [2, 2], owner)
    got = separate_copies(virt, rows([0, 1, 2, 3], [0, 0, 1, 1], [1, 1, 1, 1]),
                          np.array(owner))
    # copy 1 swaps with job 1, the first that may move: one copy of job 0 per node
    assert where(got) == {0: [0], 1: [1], 2: [0], 3: [1]}
    assert got.count.tolist() == [1, 1, 1, 1]


def test_a_row_its_job_held_there_stays() -> None:
    owner = [0, 0, 1, 2]
    # job 1 (virtual 2) ran on node 1 last epoch: the swap takes job 2 (virtual 3) instead
    held = rows([2], [1], [1])
    virt = virt_snapshot([0, 0], [2, 2], owner, current=held)
    got = separate_copies(virt, rows([0, 1, 2, 3], [0, 0, 1, 1], [1, 1, 1, 1]),
                          np.array(owner))
    assert where(got) == {0: [0], 1: [1], 2: [1], 3: [0]}
    # both ran there: nothing moves (the merge drops copy 1, as before)
    virt = virt_snapshot([0, 0], [2, 2], owner, current=rows([2, 3], [1, 1], [1, 1]))
    before = rows([0, 1, 2, 3], [0, 0, 1, 1], [1, 1, 1, 1])
    got = separate_copies(virt, before, np.array(owner))
    assert where(got) == where(before)
    # a held copy keeps its node and its twin is the one that moves
    virt = virt_snapshot([0, 0], [2, 2], owner, current=rows([1], [0], [1]))
    got = separate_copies(virt, before, np.array(owner))
    assert where(got) == {0: [1], 1: [0], 2: [0], 3: [1]}


def test_no_swap_across_types_sizes_or_onto_a_twin() -> None:
    owner = [0, 0, 1, 2]
    # the other jobs sit on a k80 node: another type, no swap
    virt = virt_snapshot([0, 1], [2, 2], owner)
    before = rows([0, 1, 2, 3], [0, 0, 1, 1], [1, 1, 1, 1])
    assert where(separate_copies(virt, before, np.array(owner))) == where(before)
    # the other job holds 2 GPUs where the copy holds 1: no swap
    virt = virt_snapshot([0, 0], [2, 2], [0, 0, 1])
    before = rows([0, 1, 2], [0, 0, 1], [1, 1, 2])
    assert where(separate_copies(virt, before, np.array([0, 0, 1]))) == where(before)
    # the only job on the other node is a third copy of the same job: no swap
    virt = virt_snapshot([0, 0], [2, 2], [0, 0, 0])
    before = rows([0, 1, 2], [0, 0, 1], [1, 1, 1])
    assert where(separate_copies(virt, before, np.array([0, 0, 0]))) == where(before)


def test_a_swap_never_puts_the_other_job_beside_its_own_twin() -> None:
    # job 1 runs as copies 2 and 3: copy 2 on node 1, copy 3 on node 0. Job 0's copy 1 may not
    # trade with copy 2 (it would put job 1's copies both on node 0); it trades with job 2.
    owner = [0, 0, 1, 1, 2]
    virt = virt_snapshot([0, 0, 0], [2, 2, 1], owner)
    got = separate_copies(virt, rows([0, 1, 3, 2, 4], [0, 0, 0, 1, 2], [1, 1, 1, 1, 1]),
                          np.array(owner))
    assert where(got) == {0: [0], 1: [2], 2: [1], 3: [0], 4: [0]}


def separate_case(seed: int) -> tuple[Snapshot, Placement, np.ndarray]:
    """merge_case's copies (some overlapping on nodes) in a virtual snapshot made by
    :meth:`HadarEPolicy.expand`, with some of their rows held last epoch."""
    snap, inner, owner, _copy_no = merge_case(seed)
    want = np.bincount(owner, minlength=snap.num_jobs).astype(np.int64)
    virt, owner2, _ = HadarEPolicy().expand(snap, want, np.zeros(snap.num_jobs), None)
    assert owner2.tolist() == owner.tolist()
    rng = np.random.default_rng(30_000 + seed)
    p = inner.placement
    held = rng.random(len(p)) < 0.2
    virt = dataclasses.replace(virt, current=Placement(p.job[held], p.node[held],
                                                       p.count[held]))
    return virt, p, owner


def twins(p: Placement, owner: np.ndarray) -> int:
    """Rows on a node where another row of the same job (owner) is."""
    key = owner[p.job] * 100_000 + p.node
    _u, cnt = np.unique(key, return_counts=True)
    return int((cnt[cnt > 1]).sum())


@pytest.mark.parametrize("seed", range(120))
def test_separating_changes_only_who_is_where(seed: int) -> None:
    virt, p, owner = separate_case(seed)
    got = separate_copies(virt, p, owner)
    assert got.job.tolist() == p.job.tolist() and got.count.tolist() == p.count.tolist()
    num_nodes = virt.node_gpus.shape[0]
    # the GPUs in use per node, and per copy per type, are what they were
    assert np.array_equal(np.bincount(got.node, weights=got.count, minlength=num_nodes),
                          np.bincount(p.node, weights=p.count, minlength=num_nodes))
    kinds = virt.node_type
    assert sorted(zip(p.job.tolist(), kinds[p.node].tolist(), p.count.tolist(), strict=True)) \
        == sorted(zip(got.job.tolist(), kinds[got.node].tolist(), got.count.tolist(),
                      strict=True))
    # a row its job held on its node stays there; only one-row copies move
    cur = {(int(j), int(k)) for j, k in zip(virt.current.job, virt.current.node, strict=True)}
    per = np.bincount(p.job, minlength=virt.num_jobs)
    for r in range(len(p)):
        if (int(p.job[r]), int(p.node[r])) in cur or per[p.job[r]] > 1:
            assert got.node[r] == p.node[r]
    assert twins(got, owner) <= twins(p, owner)


def test_the_separate_cases_move_copies_apart() -> None:
    # (else the checks above prove little)
    fewer = 0
    for seed in range(120):
        virt, p, owner = separate_case(seed)
        fewer += twins(separate_copies(virt, p, owner), owner) < twins(p, owner)
    assert fewer >= 20, fewer
