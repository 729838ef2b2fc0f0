"""HadarE's merge (Hadar's placement of the copies as a placement of the jobs) made of arrays,
and its count of the copies the merge dropped (``dropped_copies``),
against the loops they replace, kept here as the reference: the same rows in the same order,
the same copy numbers and reasons, on placements of copies that overlap on nodes, spread over
types and over nodes, with copies allowed to span nodes and not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hadar_slurm.policy.base import Decision, IntArray, Placement, Reason, Snapshot, joined
from hadar_slurm.policy.hadare import HadarEPolicy
from tests.test_sharing_twins import random_case


def merge_reference(snapshot: Snapshot, inner: Decision, owner: IntArray,
                    copy_no: IntArray) -> tuple[Placement, np.ndarray]:
    """The loop :meth:`HadarEPolicy.merge` was (the reference)."""
    p = inner.placement
    by_job: dict[int, list[list[tuple[int, int, int, int]]]] = {}
    used: dict[int, set[int]] = {}
    for v in np.unique(p.job).tolist():
        sel = np.nonzero(p.job == v)[0]
        i = int(owner[v])
        nodes = {int(x) for x in p.node[sel].tolist()}
        taken = used.setdefault(i, set())
        if nodes & taken:
            continue
        taken |= nodes
        by_job.setdefault(i, []).append(
            [(i, int(copy_no[v]), int(p.node[k]), int(p.count[k])) for k in sel.tolist()])
    rows: list[tuple[int, int, int, int]] = []
    for copies in by_job.values():
        if len(copies) > 1:
            fit = [c for c in copies
                   if len({int(snapshot.node_type[nd]) for _, _, nd, _ in c}) == 1
                   and (snapshot.multi_node_copies or len(c) == 1)]
            copies = fit if fit else copies[:1]
        for c in copies:
            rows.extend(c)
    reason = np.full(snapshot.num_jobs, Reason.PRICED_OUT, dtype=np.int8)
    first = np.nonzero(copy_no == 0)[0]
    reason[owner[first]] = inner.reason[first]
    return HadarEPolicy._placement(snapshot, rows), reason


def merge_case(seed: int) -> tuple[Snapshot, Decision, IntArray, IntArray]:
    """A snapshot of random_case's, each job wanting 1 to 4 copies, and rows for a random part
    of the copies: one to three rows each, on any node (so copies of a job may share a node
    or a type, or not), in shuffled order."""
    snap, _placement, _order, _window = random_case(seed)
    rng = np.random.default_rng(20_000 + seed)
    snap = dataclasses.replace(snap, multi_node_copies=bool(rng.random() < 0.5))
    want = rng.integers(1, 5, snap.num_jobs)
    owner = np.repeat(np.arange(snap.num_jobs, dtype=np.int64), want)
    starts = np.cumsum(want) - want
    copy_no = np.arange(owner.shape[0], dtype=np.int64) - starts[owner]
    num_nodes = snap.node_gpus.shape[0]
    job: list[int] = []
    node: list[int] = []
    count: list[int] = []
    for v in range(owner.shape[0]):
        if rng.random() < 0.35:
            continue
        for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
            job.append(v)
            node.append(int(rng.integers(num_nodes)))
            count.append(int(rng.integers(1, 5)))
    shuffle = rng.permutation(len(job))
    placement = Placement(np.array(job, dtype=np.int64)[shuffle],
                          np.array(node, dtype=np.int64)[shuffle],
                          np.array(count, dtype=np.int64)[shuffle])
    reason = rng.integers(0, len(Reason), owner.shape[0]).astype(np.int8)
    return snap, Decision(0, placement, reason), owner, copy_no


@pytest.mark.parametrize("seed", range(120))
def test_merge_is_what_it_was(seed: int) -> None:
    snap, inner, owner, copy_no = merge_case(seed)
    got, got_reason = HadarEPolicy().merge(snap, inner, owner, copy_no)
    want, want_reason = merge_reference(snap, inner, owner, copy_no)
    for a, b in ((got.job, want.job), (got.node, want.node), (got.count, want.count),
                 (got.copy_index(), want.copy_index())):
        assert a.dtype == np.int64 and a.tolist() == b.tolist()
    assert np.array_equal(got_reason, want_reason)


def test_the_merge_cases_drop_and_keep_copies() -> None:
    """Copies dropped for a node another copy holds and for the fit rule, jobs kept whole
    with several copies, and empty placements: else the comparison above proves little."""
    overlap = unfit = several = empty = 0
    for seed in range(120):
        snap, inner, owner, copy_no = merge_case(seed)
        got, _reason = merge_reference(snap, inner, owner, copy_no)
        placed = {int(owner[v]) for v in np.unique(inner.placement.job).tolist()}
        copies = got.num_copies()
        several += any(k > 1 for k in copies.values())
        empty += len(got) == 0
        for i in placed:
            mine = np.unique(inner.placement.job[owner[inner.placement.job] == i])
            kept = copies.get(int(snap.job_ids[i]), 0)
            nodes = [set(inner.placement.node[inner.placement.job == v].tolist()) for v in mine]
            clash = any(a & b for k, a in enumerate(nodes) for b in nodes[:k])
            overlap += clash and kept < len(mine)
            unfit += not clash and kept < len(mine)
    assert min(overlap, unfit, several) >= 10, (overlap, unfit, several, empty)


def dropped_copies_reference(snapshot: Snapshot, want: IntArray, planned: Placement,
                             owner: IntArray, placement: Placement) -> IntArray | None:
    """The loop :meth:`HadarEPolicy.dropped_copies` was (the reference)."""
    kept = placement.num_copies()
    placed = np.bincount(owner[np.unique(planned.job)], minlength=snapshot.num_jobs)
    out = want.copy()
    for i in np.nonzero((want > 1) & (placed > 1))[0].tolist():
        k = kept.get(int(snapshot.job_ids[i]), 0)
        if 0 < k < placed[i]:
            out[i] = k
    return None if (out == want).all() else out


@pytest.mark.parametrize("seed", range(120))
def test_dropped_copies_is_what_it_was(seed: int) -> None:
    snap, inner, owner, _copy_no = merge_case(seed)
    merged, _reason = HadarEPolicy().merge(snap, inner, owner, _copy_no)
    want = np.bincount(owner, minlength=snap.num_jobs).astype(np.int64)
    got = HadarEPolicy.dropped_copies(snap, want, inner.placement, owner, merged)
    ref = dropped_copies_reference(snap, want, inner.placement, owner, merged)
    assert (got is None) == (ref is None)
    if ref is not None and got is not None:
        assert got.tolist() == ref.tolist()


def test_the_dropped_copies_cases_lower_some() -> None:
    # (jobs lowered and jobs kept whole with several copies, else the comparison proves little)
    lowered = whole = 0
    for seed in range(120):
        snap, inner, owner, copy_no = merge_case(seed)
        merged, _reason = HadarEPolicy().merge(snap, inner, owner, copy_no)
        want = np.bincount(owner, minlength=snap.num_jobs).astype(np.int64)
        out = dropped_copies_reference(snap, want, inner.placement, owner, merged)
        placed = np.bincount(owner[np.unique(inner.placement.job)], minlength=snap.num_jobs)
        lowered += 0 if out is None else int((out < want).sum())
        whole += int(((placed > 1) & (out is None or (out == want))).sum())
    assert lowered >= 20 and whole >= 20, (lowered, whole)


def test_dropped_copies_of_one_copy_each_is_none() -> None:
    # A plan that placed one copy of each job dropped none: nothing to lower, in both.
    snap, inner, owner, copy_no = merge_case(3)
    first = inner.placement.select(copy_no[inner.placement.job] == 0)
    merged, _reason = HadarEPolicy().merge(snap, dataclasses.replace(inner, placement=first),
                                           owner, copy_no)
    want = np.bincount(owner, minlength=snap.num_jobs).astype(np.int64)
    assert HadarEPolicy.dropped_copies(snap, want, first, owner, merged) is None
    assert dropped_copies_reference(snap, want, first, owner, merged) is None


def test_merge_of_no_rows() -> None:
    snap, inner, owner, copy_no = merge_case(0)
    inner = dataclasses.replace(inner, placement=Placement.empty())
    got, reason = HadarEPolicy().merge(snap, inner, owner, copy_no)
    want, want_reason = merge_reference(snap, inner, owner, copy_no)
    assert len(got) == 0 == len(want) and np.array_equal(reason, want_reason)


def room_for_copies_reference(snapshot: Snapshot) -> IntArray:
    """The loop :meth:`HadarEPolicy.room_for_copies` was (the reference)."""
    scale = snapshot.scale.astype(np.int64)
    out = np.zeros(snapshot.num_jobs, dtype=np.int64)
    for i in range(snapshot.num_jobs):
        runs_on = snapshot.rate[i, snapshot.node_type] > 0
        if snapshot.multi_node_copies:
            per_type = np.bincount(snapshot.node_type[runs_on],
                                   weights=snapshot.node_gpus[runs_on],
                                   minlength=len(snapshot.gpu_types))
            out[i] = int((per_type // max(int(scale[i]), 1)).sum())
        else:
            out[i] = int((runs_on & (snapshot.node_gpus >= scale[i])).sum())
    return np.maximum(out, 1)


@pytest.mark.parametrize("seed", range(60))
def test_room_for_copies_is_what_it_was(seed: int) -> None:
    snap, _inner, _owner, _copy_no = merge_case(seed)
    rng = np.random.default_rng(seed)
    # (nodes of mixed sizes, some without GPUs, jobs that run nowhere on some types or at all,
    # and a few of scale 0, which the old loop counted as it does)
    snap = dataclasses.replace(
        snap, node_gpus=np.asarray(rng.integers(0, 9, snap.node_gpus.shape[0]), dtype=np.int64),
        scale=np.where(rng.random(snap.num_jobs) < 0.1, 0, snap.scale),
        rate=np.where(rng.random(snap.rate.shape) < 0.3, 0.0, snap.rate))
    got = HadarEPolicy().room_for_copies(snap)
    assert got.dtype == np.int64
    assert got.tolist() == room_for_copies_reference(snap).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_num_copies_is_what_it_was(seed: int) -> None:
    # (Placement.num_copies counts in arrays; the reference is its by_job_copies)
    snap, inner, owner, copy_no = merge_case(seed)
    placement, _reason = HadarEPolicy().merge(snap, inner, owner, copy_no)
    for p in (placement, inner.placement, Placement.empty()):
        want = {j: len(cp) for j, cp in p.by_job_copies().items()}
        got = p.num_copies()
        assert list(got.items()) == list(want.items())
        assert all(type(j) is int and type(k) is int for j, k in got.items())


@pytest.mark.parametrize("seed", range(40))
def test_runs_as_is_what_it_was(seed: int) -> None:
    # (HadarEPolicy.runs_as counts in arrays; the reference is num_copies' dict, looked up per
    # job.)  The running placements: a merge's (some jobs forked, some not placed), one that
    # also names jobs the snapshot does not hold (they ended), and none.
    snap, inner, owner, copy_no = merge_case(seed)
    placement, _reason = HadarEPolicy().merge(snap, inner, owner, copy_no)
    gone = Placement(np.array([10_000, 10_000, -5], dtype=np.int64),
                     np.zeros(3, dtype=np.int64), np.ones(3, dtype=np.int64),
                     np.array([0, 1, 0], dtype=np.int64))
    for cur in (placement, joined(placement, gone), Placement.empty()):
        s = dataclasses.replace(snap, current=cur)
        runs = cur.num_copies()
        want = [runs.get(j, 0) for j in s.job_ids.tolist()]
        got = HadarEPolicy.runs_as(s)
        assert got.dtype == np.int64
        assert got.tolist() == want
    assert max(HadarEPolicy.runs_as(dataclasses.replace(snap, current=placement))) > 1


def test_merge_wants_a_jobs_copies_consecutive() -> None:
    snap, inner, owner, copy_no = merge_case(0)
    with pytest.raises(ValueError, match="owner must be ascending"):
        HadarEPolicy().merge(snap, inner, owner[::-1].copy(), copy_no)
