"""GPU sharing's pairing made faster (the pairs weighed in the compiled core,
``core.pair_guests``, from arrays made once per decision) against the loop it replaces, kept
here as the reference: the same pairs, guests, rows and explanations on random queues,
clusters, CPU counts and worlds that allow pairs only in part, with the compiled core and with
its plain-Python twin (``core.reference.pair_guests``).  The cases worked by hand are in
test_hadar_sharing.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

import hadar_slurm.policy.sharing as sharing
from hadar_slurm import core
from hadar_slurm.core import reference
from hadar_slurm.model import ClusterSpec
from hadar_slurm.policy.base import BoolArray, FloatArray, IntArray, Placement, Snapshot
from hadar_slurm.policy.hadar import HadarPolicy
from hadar_slurm.policy.sharing import (
    Pairs,
    cpus_after,
    job_cpus,
    pack_waiting,
    pair_gain,
    shared_finish,
    sharing_rates,
    waiting_starts,
)
from hadar_slurm.rates.table import default_table


def waiting_starts_reference(snapshot: Snapshot, placement: Placement, order: IntArray,
                   placed: BoolArray) -> Callable[[int, int], float]:
    """The closure :func:`waiting_starts` was (the reference): ``starts(x, h)``,
    the seconds until the placed jobs on type ``h`` (each ending after its remaining work over
    the summed rates of its copies) have freed as many GPUs as job ``x`` and the waiting jobs
    ahead of it in ``order`` that can run on ``h`` ask (``inf`` if they never do).  A waiting
    job's other chance is that, not only its host's end."""
    rate = snapshot.rate
    scale = snapshot.scale.astype(np.int64)
    n_types = rate.shape[1]
    index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
    ends: list[list[tuple[float, int]]] = [[] for _ in range(n_types)]
    for job_id, copies in placement.by_job_copies().items():
        i = index_of.get(int(job_id))
        if i is None:
            continue
        speed = sum(min(float(rate[i, int(snapshot.node_type[nd])]) for nd, _c in rows)
                    for rows in copies.values())
        end = float(snapshot.remaining[i]) / speed if speed > 0 else np.inf
        for rows in copies.values():
            for nd, c in rows:
                ends[int(snapshot.node_type[nd])].append((end, int(c)))
    times: list[FloatArray] = []
    freed: list[IntArray] = []
    for h in range(n_types):
        got = sorted(ends[h])
        times.append(np.array([t for t, _c in got], dtype=np.float64))
        freed.append(np.cumsum(np.array([c for _t, c in got], dtype=np.int64)))
    # per type, the GPUs that the waiting jobs before each position in the queue ask
    waits = ~placed & (snapshot.remaining > 0)
    in_order = order.astype(np.int64)
    asked = np.where(waits[in_order, None] & (rate[in_order] > 0), scale[in_order, None], 0)
    ahead = np.cumsum(asked, axis=0) - asked  # (position, type)
    pos = np.empty(snapshot.num_jobs, dtype=np.int64)
    pos[in_order] = np.arange(in_order.shape[0])

    seen: dict[tuple[int, int], float] = {}  # (a guest is weighed against many hosts of a type)

    def starts(x: int, h: int) -> float:
        got = seen.get((x, h))
        if got is None:
            need = int(scale[x]) + int(ahead[pos[x], h])
            k = int(np.searchsorted(freed[h], need, side="left"))
            got = seen[(x, h)] = float(times[h][k]) if k < times[h].shape[0] else np.inf
        return got

    return starts


def pack_waiting_reference(snapshot: Snapshot, placement: Placement, order: IntArray,
                 window: float = np.inf
                 ) -> tuple[Placement, Pairs, BoolArray, dict[int, str]]:
    """The loop :func:`pack_waiting` was, one pair of jobs at a time (the reference).

    ``placement``: the decision so far (no pairs); ``order``: the queue order (job indices);
    ``window``: seconds to the drain target, by which a host must still end if it shares to
    its end.  Returns the placement with the guests' rows (the same as their
    hosts'), the pairs ``(lower id, higher id)``, the mask of the guests, and a detail line per
    job of a pair and per waiting job whose pair would have paid on a node without a CPU for
    it."""
    n = snapshot.num_jobs
    guests = np.zeros(n, dtype=np.bool_)
    rates = sharing_rates(snapshot)
    if rates is None or n < 2 or len(placement) == 0:
        return placement, (), guests, {}
    ids = [int(j) for j in snapshot.job_ids.tolist()]
    table = snapshot.colocated
    assert table is not None

    def pair_rates(p: int, x: int, h: int) -> tuple[float, float]:
        """The co-located rates of jobs ``p`` and ``x`` on GPU type ``h``, (0, 0) where they
        may not share."""
        (ta, sa), (tb, sb) = rates.keys[int(rates.kind[p])], rates.keys[int(rates.kind[x])]
        if sa != sb:
            return (0.0, 0.0)
        return table.pair_rate(ta, tb, sa, snapshot.gpu_types[h])

    index_of = {j: i for i, j in enumerate(ids)}
    rate = snapshot.rate
    scale = snapshot.scale
    weight = snapshot.weight
    remaining = snapshot.remaining
    ok = snapshot.sharing_allowed() & (remaining > 0)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(order.shape[0])
    placed = np.zeros(n, dtype=np.bool_)
    shares_on = snapshot.sharing_nodes()
    may_host = snapshot.hosting_allowed()
    may_join = snapshot.joining_allowed()
    hosts: dict[int, tuple[int, list[tuple[int, int]]]] = {}  # index -> (type, rows)
    for job_id, copies in placement.by_job_copies().items():
        i = index_of.get(int(job_id))
        if i is None:
            continue
        placed[i] = True
        if len(copies) != 1 or not ok[i]:
            continue  # (a forked job's copies, or a job that may not share)
        rows = sorted(next(iter(copies.values())))
        if not all(shares_on[nd] for nd, _c in rows):
            continue  # (its GPUs may not be shared: the node has no shards)
        types = {int(snapshot.node_type[nd]) for nd, _c in rows}
        h = types.pop()
        if not types and rate[i, h] > 0 and sum(c for _nd, c in rows) == int(scale[i]):
            hosts[i] = (h, rows)
    waiting = np.array([not placed[i] and bool(ok[i]) and rate[i].max() > 0
                        for i in range(n)], dtype=np.bool_)
    if not hosts or not waiting.any():
        return placement, (), guests, {}
    per_gpu = 1.0 / max(float(snapshot.node_gpus.sum()), 1.0)
    start_s = float(snapshot.migration_s)
    before = {a: b for p in snapshot.packed for a, b in (p, p[::-1])}
    cpus = job_cpus(snapshot)
    cpus_left = cpus_after(snapshot, placement, cpus)
    starts = waiting_starts_reference(snapshot, placement, order, placed)

    def elsewhere(x: int, h: int) -> float:
        """When waiting job ``x`` would end apart on a type other than ``h``, at the soonest
        (``inf``: on none)."""
        return min((starts(x, g) + float(remaining[x]) / float(rate[x, g])
                    for g in range(rate.shape[1]) if g != h and rate[x, g] > 0),
                   default=np.inf)

    def gain_with(x: int, p: int, h: int) -> float | None:
        """What waiting job ``x`` joining host ``p`` on type ``h`` gains (None: not allowed)."""
        if scale[p] != scale[x] or rate[x, h] <= 0:
            return None
        again = before.get(ids[x]) == ids[p]  # (the pair ran in the last epoch)
        if not again and not (may_host[p] and may_join[x]):
            return None  # the world cannot put these two together now
        cp, cx = pair_rates(p, x, h)
        if cp <= 0 or cx <= 0:
            return None  # the table forbids the pair there
        rp, rx = float(rate[p, h]), float(rate[x, h])
        sp, sx = cp / rp, cx / rx
        if sp + sx <= 1.0:
            return None  # 1: the pair does no more than taking turns
        tp, tx = float(remaining[p]) / rp, float(remaining[x]) / rx
        if max(shared_finish(tp, tx, sp, sx)) > window:
            return None  # 3: the pair (the one left alone after) would end after the target
        # 2: the completion times, the waiting jobs behind the guest included (per GPU).
        behind = float(weight[waiting & (pos > pos[x])].sum()) * per_gpu * float(scale[x])
        wait = min(starts(x, h), tp)
        gain = pair_gain(tp, tx, sp, sx, float(weight[p]), float(weight[x]), behind, wait,
                         elsewhere(x, h))
        if not again:
            # A guest that starts on the host's GPUs pays a start it would not pay waiting
            # (``migration_s``, once now and at most once when the pair ends), and the host
            # shares at its co-located rate while the guest starts.
            gain -= start_s * (float(weight[x]) + float(weight[p]) * (1.0 - sp))
        return gain

    pairs: list[tuple[int, int]] = []
    job: list[int] = []
    node: list[int] = []
    count: list[int] = []
    detail: dict[int, str] = {}
    # 4: per GPU type, the multi-GPU jobs left waiting that can use it (anywhere in the queue).
    gangs = ~placed & (remaining > 0) & (scale > 1)
    gangs_on = (gangs[:, None] & (rate > 0)).sum(axis=0)
    # Waiting jobs in queue order, each with the host where it gains most.
    for x in order.tolist():
        if not hosts:
            break
        if not waiting[x]:
            continue
        # (the gangs that wait for each type, the guest itself aside)
        blocked = gangs_on - (gangs[x] & (rate[x] > 0)) > 0
        best: tuple[float, int] | None = None
        no_cpu: tuple[float, int, int] | None = None  # (gain, host, node) short of CPUs
        for p, (h, rows) in hosts.items():
            if blocked[h] and before.get(ids[x]) != ids[p]:
                continue  # 4: a gang waits for this type's GPUs whole
            gain = gain_with(x, p, h)
            if gain is None or gain <= 0.0:
                continue
            if cpus_left is not None and before.get(ids[x]) != ids[p]:
                tight = [nd for nd, _c in rows if cpus_left[nd] < cpus[x]]
                if tight:  # (it would wait for a CPU, and then the pair split)
                    if no_cpu is None or gain > no_cpu[0]:
                        no_cpu = (gain, p, tight[0])
                    continue
            if best is None or gain > best[0]:
                best = (gain, p)
        if best is None:
            if no_cpu is not None:
                _g, p, nd = no_cpu
                left = 0 if cpus_left is None else max(int(cpus_left[nd]), 0)
                detail[ids[x]] = (
                    f"would share a GPU with job {ids[p]} on {snapshot.node_names[nd]}, but "
                    f"the node has {left} free CPU(s) for the "
                    f"{int(cpus[x])} it asks, this epoch's placements counted")
            continue
        p = best[1]
        _h, rows = hosts.pop(p)
        if cpus_left is not None:
            for nd, _c in rows:
                cpus_left[nd] -= cpus[x]
        guests[x] = True
        waiting[x] = False
        pairs.append((min(ids[p], ids[x]), max(ids[p], ids[x])))
        detail[ids[p]] = f"shares its GPUs with job {ids[x]}"
        detail[ids[x]] = f"shares its GPUs with job {ids[p]} (joined it)"
        for nd, c in rows:
            job.append(ids[x])
            node.append(nd)
            count.append(c)
    if not pairs:
        return placement, (), guests, detail
    k = len(job)
    out = Placement(np.concatenate([placement.job, np.array(job, dtype=np.int64)]),
                    np.concatenate([placement.node, np.array(node, dtype=np.int64)]),
                    np.concatenate([placement.count, np.array(count, dtype=np.int64)]),
                    None if placement.copy is None else np.concatenate(
                        [placement.copy, np.zeros(k, dtype=np.int64)]))
    return out, tuple(sorted(pairs)), guests, detail


def random_case(seed: int) -> tuple[Snapshot, Placement, IntArray, float]:
    """A queue of Gavel's job types on a cluster of v100, p100 and k80 nodes of 1 to 4 GPUs,
    placed by Hadar without sharing, in a world that allows pairs in part: some jobs may not
    share, host or join, some nodes have no shards or few CPUs, some pairs ran last epoch."""
    rng = np.random.default_rng(seed)
    table = default_table()
    types = ("v100", "p100", "k80")
    per_node = int(rng.choice([1, 2, 4]))
    cluster = ClusterSpec.uniform([(g, per_node * int(rng.integers(1, 4))) for g in types],
                                  per_node)
    keys = sorted(k for k in table.job_keys() if k[1] <= per_node)
    n = int(rng.integers(4, 40))
    picked = [keys[int(i)] for i in rng.integers(0, len(keys), n)]
    rate = np.array([[table.rate(t, s, g) for g in types] for t, s in picked])
    scale = np.array([s for _t, s in picked], dtype=np.int64)
    best = rate.max(axis=1)
    total = best * rng.uniform(600.0, 20_000.0, n)
    remaining = total * rng.uniform(0.05, 1.0, n)
    nodes = cluster.nodes
    num_nodes = len(nodes)
    ids = np.arange(100, 100 + n, dtype=np.int64)

    def maybe(mask: BoolArray) -> BoolArray | None:
        return mask if rng.random() < 0.6 else None

    snap = Snapshot(
        epoch=1, now=0.0, round_s=360.0, gpu_types=types,
        node_names=tuple(nd.name for nd in nodes),
        node_type=np.array([types.index(nd.gpu_type) for nd in nodes], dtype=np.int64),
        node_gpus=np.array([nd.gpus for nd in nodes], dtype=np.int64),
        job_ids=ids, job_types=tuple(t for t, _s in picked),
        arrival=-rng.uniform(0.0, 3600.0, n), total=total, remaining=remaining, scale=scale,
        weight=rng.choice([0.5, 1.0, 2.0], n), sync=np.ones(n, dtype=np.bool_), rate=rate,
        attained=np.zeros_like(rate), current=Placement.empty(),
        migration_s=float(rng.choice([0.0, 32.4])), colocated=table.colocated,
        may_share=maybe(rng.random(n) < 0.9), may_host=maybe(rng.random(n) < 0.8),
        may_join=maybe(rng.random(n) < 0.8), share_nodes=maybe(rng.random(num_nodes) < 0.85),
        node_free_cpus=(rng.integers(0, 6, num_nodes).astype(np.int64)
                        if rng.random() < 0.5 else None),
        cpus=rng.integers(1, 3, n).astype(np.int64) if rng.random() < 0.5 else None,
    )
    pairs = set()  # (of jobs of one scale factor, as a pair that ran is)
    for _ in range(int(rng.integers(0, n // 2 + 1))):
        a = int(rng.integers(n))
        mates = np.flatnonzero((scale == scale[a]) & (np.arange(n) != a))
        if mates.shape[0]:
            pairs.add(tuple(sorted((int(ids[a]), int(ids[int(rng.choice(mates))])))))
    snap = dataclasses.replace(snap, packed=tuple(sorted(
        (a, b) for a, b in pairs if not any(a in q or b in q for q in pairs - {(a, b)}))))
    placement = HadarPolicy().allocate(snap).placement
    order = rng.permutation(n).astype(np.int64)
    window = float(rng.choice([np.inf, float(np.median(remaining / best)) * 2.0]))
    return snap, placement, order, window


def same(a: tuple[Placement, Pairs, BoolArray, dict[int, str]],
         b: tuple[Placement, Pairs, BoolArray, dict[int, str]]) -> bool:
    for x, y in ((a[0].job, b[0].job), (a[0].node, b[0].node), (a[0].count, b[0].count)):
        if not np.array_equal(x, y):
            return False
    return a[1] == b[1] and np.array_equal(a[2], b[2]) and a[3] == b[3]


@pytest.mark.parametrize("impl", ["compiled", "reference"])
@pytest.mark.parametrize("seed", range(200))
def test_pack_waiting_is_what_it_was(seed: int, impl: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # (with the compiled core's pairing, and with its plain-Python twin)
    if impl == "reference":
        monkeypatch.setattr(sharing.core, "pair_guests", reference.pair_guests)
    elif not core.COMPILED:
        pytest.skip("the compiled core is not built (run `make venv`)")
    snap, placement, order, window = random_case(seed)
    assert same(pack_waiting(snap, placement, order, window),
                pack_waiting_reference(snap, placement, order, window))


def test_the_random_cases_exercise_every_branch() -> None:
    """Pairs formed, pairs formed again (a pair that ran), guests kept off by a node's CPUs,
    and cases with none: else the comparison above would prove little."""
    formed = again = no_cpu = empty = 0
    for seed in range(200):
        snap, placement, order, window = random_case(seed)
        _out, pairs, _guests, detail = pack_waiting(snap, placement, order, window)
        formed += bool(pairs)
        again += bool(set(pairs) & set(snap.packed))
        no_cpu += any("free CPU(s)" in text for text in detail.values())
        empty += not pairs
    assert min(formed, again, no_cpu, empty) >= 10, (formed, again, no_cpu, empty)


@pytest.mark.parametrize("seed", range(40))
def test_waiting_starts_is_what_it_was(seed: int) -> None:
    snap, placement, order, _window = random_case(seed)
    placed = np.isin(snap.job_ids, placement.job)
    starts = waiting_starts_reference(snap, placement, order, placed)
    got = waiting_starts(snap, placement, order, placed)
    waiting = np.flatnonzero(~placed & (snap.remaining > 0))
    for x in waiting.tolist():
        for h in range(snap.rate.shape[1]):
            assert got[x, h] == starts(x, h)


def sharing_hosts_reference(snapshot: Snapshot, placement: Placement, ok: BoolArray,
                            ) -> tuple[list[int], list[int], list[list[tuple[int, int]]]]:
    """The loop :func:`sharing_hosts` was (the reference): per host, in the placement's order,
    its job index, its GPU type and its rows ``(node, GPUs)``, nodes ascending."""
    index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
    shares_on = snapshot.sharing_nodes()
    jobs: list[int] = []
    types: list[int] = []
    host_rows: list[list[tuple[int, int]]] = []
    for job_id, copies in placement.by_job_copies().items():
        i = index_of.get(int(job_id))
        if i is None or len(copies) != 1 or not ok[i]:
            continue
        rows = sorted(next(iter(copies.values())))
        if not all(shares_on[nd] for nd, _c in rows):
            continue
        on = {int(snapshot.node_type[nd]) for nd, _c in rows}
        h = on.pop()
        if (not on and snapshot.rate[i, h] > 0
                and sum(c for _nd, c in rows) == int(snapshot.scale[i])):
            jobs.append(i)
            types.append(h)
            host_rows.append(rows)
    return jobs, types, host_rows


def scrambled(snap: Snapshot, seed: int) -> Placement:
    """Rows no policy would make, to reach every branch of the array versions: jobs forked
    into copies (on one type or several), jobs spread over types, rows of jobs the snapshot
    does not hold, repeated rows, counts that fall short of or exceed the scale factor."""
    rng = np.random.default_rng(10_000 + seed)
    num_nodes = snap.node_gpus.shape[0]
    ids = [*snap.job_ids.tolist(), 9_000, 9_001]
    job: list[int] = []
    node: list[int] = []
    count: list[int] = []
    copy: list[int] = []
    for j in rng.permutation(ids)[: int(rng.integers(1, len(ids) + 1))].tolist():
        for c in range(int(rng.choice([1, 1, 1, 2, 3]))):
            for _ in range(int(rng.integers(1, 4))):
                job.append(int(j))
                node.append(int(rng.integers(num_nodes)))
                count.append(int(rng.integers(1, 5)))
                copy.append(c)
    shuffle = rng.permutation(len(job))
    forked = max(copy) > 0 or rng.random() < 0.5

    def arr(values: list[int]) -> IntArray:
        return np.array(values, dtype=np.int64)[shuffle]

    return Placement(arr(job), arr(node), arr(count), arr(copy) if forked else None)


@pytest.mark.parametrize("seed", range(60))
def test_hosts_and_starts_on_any_placement_are_what_they_were(seed: int) -> None:
    snap, _placement, order, _window = random_case(seed)
    placement = scrambled(snap, seed)
    ok = snap.sharing_allowed() & (snap.remaining > 0)
    jobs, types, rows_of = sharing_hosts_reference(snap, placement, ok)
    hp, ht, row_ptr, row_node, row_count = sharing.sharing_hosts(snap, placement, ok)
    assert hp.tolist() == jobs and ht.tolist() == types
    assert [list(zip(row_node[a:b].tolist(), row_count[a:b].tolist(), strict=True))
            for a, b in zip(row_ptr[:-1].tolist(), row_ptr[1:].tolist(), strict=True)] == rows_of
    placed = np.isin(snap.job_ids, placement.job)
    starts = waiting_starts_reference(snap, placement, order, placed)
    got = waiting_starts(snap, placement, order, placed)
    for x in np.flatnonzero(~placed & (snap.remaining > 0)).tolist():
        for h in range(snap.rate.shape[1]):
            assert got[x, h] == starts(x, h)


def test_the_scrambled_placements_reach_hosts_and_refusals() -> None:
    """Hosts found, and jobs refused for copies, for types and for their GPU count."""
    hosts = forked = spread = short = 0
    for seed in range(60):
        snap, _p, _o, _w = random_case(seed)
        placement = scrambled(snap, seed)
        ok = snap.sharing_allowed() & (snap.remaining > 0)
        hosts += len(sharing_hosts_reference(snap, placement, ok)[0])
        for job_id, copies in placement.by_job_copies().items():
            forked += len(copies) > 1
            rows = [r for rs in copies.values() for r in rs]
            spread += len({int(snap.node_type[nd]) for nd, _c in rows}) > 1
            short += (job_id in snap.job_ids and len(copies) == 1
                      and sum(c for _nd, c in rows)
                      != int(snap.scale[int(np.flatnonzero(snap.job_ids == job_id)[0])]))
    assert min(hosts, forked, spread, short) >= 10, (hosts, forked, spread, short)
