"""The contract every registered policy keeps, checked on small random snapshots.

For each policy of :data:`hadar_slurm.policy.REGISTRY`: ``allocate`` is pure (the same snapshot
gives the same decision, from the same instance and from a fresh one, and the snapshot is left
as it was); ``reason`` is an int8 array aligned with the jobs, holding :class:`Reason` codes;
a job is placed exactly when its reason is ``PLACED``, and every other job names the component
that refused it; the placement fits the nodes (per node, at most its GPUs), uses only GPU types
the job can run on, and gives each copy of a job its request (a synchronous job exactly its
scale factor, an asynchronous one between 1 and its scale factor); a forked job's copies never
share a node and stay within ``max_copies``.

Snapshots are drawn from a seeded RNG: one to three GPU types, one to six nodes, zero to twelve
jobs (some that no type can run, some synchronous multi-GPU gangs), a valid ``current``
placement of some of them, and ``max_copies`` given or not; plus snapshots taken in the middle
of short simulations, which carry each policy's own state from the epochs before.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.model import Job
from hadar_slurm.policy import REGISTRY, make_policy, policy_settings
from hadar_slurm.policy.base import Decision, Placement, Reason, Snapshot
from hadar_slurm.rates.table import parse_csv
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.cluster import parse_counts

I64 = np.int64
TYPES = ("v100", "p100", "k80")
JOB_TYPES = ("ResNet-18 (batch size 64)", "Transformer (batch size 32)", "A3C", "toy")
POLICIES = sorted(REGISTRY)
SEEDS = list(range(12))


def random_current(rng: np.random.Generator, node_type: np.ndarray, node_gpus: np.ndarray,
                   scale: np.ndarray, rate: np.ndarray, job_ids: np.ndarray) -> Placement:
    """Some jobs, each on GPUs of one type it can run on, within every node's GPUs."""
    free = node_gpus.copy()
    job, node, count = [], [], []
    for i in rng.permutation(job_ids.shape[0]).tolist():
        if rng.random() < 0.5:
            continue
        for h in rng.permutation(rate.shape[1]).tolist():
            on_h = np.nonzero(node_type == h)[0]
            if rate[i, h] <= 0 or free[on_h].sum() < scale[i]:
                continue
            need = int(scale[i])
            for k in on_h.tolist():
                take = min(need, int(free[k]))
                if take > 0:
                    job.append(int(job_ids[i]))
                    node.append(k)
                    count.append(take)
                    free[k] -= take
                    need -= take
            break
    return Placement(np.array(job, dtype=I64), np.array(node, dtype=I64),
                     np.array(count, dtype=I64))


def random_snapshot(seed: int) -> Snapshot:
    rng = np.random.default_rng(seed)
    num_types = int(rng.integers(1, 4))
    num_nodes = int(rng.integers(num_types, 7))
    node_type = np.concatenate([np.arange(num_types),
                                rng.integers(0, num_types, num_nodes - num_types)]).astype(I64)
    node_gpus = rng.choice([1, 2, 4, 8], num_nodes).astype(I64)
    per_type = np.bincount(node_type, weights=node_gpus, minlength=num_types)
    n = int(rng.integers(0, 13)) if seed % 6 else 0
    scale = np.minimum(rng.choice([1, 1, 2, 4], n), int(per_type.max())).astype(I64)
    rate = rng.uniform(0.2, 5.0, (n, num_types)) * scale[:, None]
    rate[rng.random((n, num_types)) < 0.25] = 0.0
    rate[per_type[None, :] < scale[:, None]] = 0.0  # a gang never fits a type that small
    if n > 2:
        rate[int(rng.integers(0, n))] = 0.0  # a job no type of the cluster can run
    total = rng.uniform(1e3, 1e5, n)
    now = 20_000.0
    job_ids = rng.permutation(np.arange(100, 100 + 3 * n, 3)).astype(I64) if n else \
        np.zeros(0, dtype=I64)
    return Snapshot(
        epoch=int(rng.integers(0, 50)), now=now, round_s=360.0,
        gpu_types=TYPES[:num_types], node_names=tuple(f"n{k}" for k in range(num_nodes)),
        node_type=node_type, node_gpus=node_gpus, job_ids=job_ids,
        job_types=tuple(JOB_TYPES[int(k)] for k in rng.integers(0, len(JOB_TYPES), n)),
        arrival=now - rng.uniform(0.0, 10_000.0, n), total=total,
        remaining=total * rng.uniform(0.05, 1.0, n), scale=scale,
        weight=rng.uniform(0.5, 2.0, n), sync=rng.random(n) < 0.7, rate=rate,
        attained=rng.uniform(0.0, 3000.0, (n, num_types)),
        current=random_current(rng, node_type, node_gpus, scale, rate, job_ids),
        max_copies=rng.integers(1, 4, n).astype(I64) if seed % 2 else None,
        multi_node_copies=seed % 4 == 3,
    )


TOY = parse_csv(
    """job_type,scale_factor,gpu_type,steps_per_second
a,1,v100,3.0
a,1,p100,1.5
a,1,k80,0.5
a,2,v100,5.5
a,2,p100,2.8
a,4,v100,10.0
a,4,k80,1.6
b,1,v100,1.0
b,1,p100,0.9
b,2,p100,1.7
b,2,k80,1.2
""",
    "contract.csv",
)


def simulated_snapshots(name: str, seed: int, epochs: int = 6) -> list[Snapshot]:
    """Snapshots of a short simulation of ``name``, each with the state the policy left."""
    rng = np.random.default_rng(1000 + seed)
    jobs = [Job(j, str(rng.choice(["a", "b"])), int(rng.choice([1, 2, 4]) if j % 3 else 2),
                float(rng.uniform(500, 20_000)), float(rng.choice([0.0, 0.0, 400.0, 1500.0])))
            for j in range(int(rng.integers(3, 10)))]
    jobs = [j for j in jobs if TOY.has_job(j.job_type, j.scale_factor)]
    sim = SimulatedCluster(jobs, parse_counts("v100=2:p100=4:k80=4"), TOY)
    policy = make_policy(name)
    out: list[Snapshot] = []
    state: object = None
    now = 0.0
    for epoch in range(epochs):
        snap = sim.snapshot(epoch, now, 360.0, state)
        out.append(snap)
        decision = policy.allocate(snap)
        state = decision.policy_state
        sim.apply(sim.reconcile(snap, decision), now)
        now += 360.0
    return out


# -- the checks ------------------------------------------------------------------------------

def same(a: object, b: object) -> bool:
    """Deep equality that compares arrays by value (NaN equal to NaN) and dataclasses by field."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and bool(
            np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return bool(a == b)


def check_contract(snap: Snapshot, decision: Decision) -> None:
    n = snap.num_jobs
    reason = decision.reason
    assert isinstance(reason, np.ndarray) and reason.dtype == np.int8
    assert reason.shape == (n,), "reasons must be aligned with the jobs"
    valid = {int(r) for r in Reason}
    assert set(reason.tolist()) <= valid
    assert decision.epoch == snap.epoch
    p = decision.placement
    for arr in (p.job, p.node, p.count):
        assert arr.ndim == 1 and arr.shape == p.job.shape
    index_of = {int(j): i for i, j in enumerate(snap.job_ids.tolist())}
    assert set(p.job.tolist()) <= index_of.keys(), "placement names jobs not in the snapshot"
    placed = {index_of[j] for j in p.job.tolist()}
    for i in range(n):
        code = Reason(int(reason[i]))
        if i in placed:
            assert code is Reason.PLACED, f"job {snap.job_ids[i]} placed with reason {code.name}"
        else:
            assert code is not Reason.PLACED, f"job {snap.job_ids[i]} unplaced but PLACED"
            assert code.component and code.text, f"{code.name} names no component"
    # Within capacity: per node, and so per GPU type.
    assert (p.count > 0).all()
    assert ((p.node >= 0) & (p.node < snap.node_gpus.shape[0])).all()
    used = np.bincount(p.node, weights=p.count, minlength=snap.node_gpus.shape[0])
    assert (used <= snap.node_gpus).all(), "a node holds more GPUs than it has"
    by_type = np.bincount(snap.node_type[p.node], weights=p.count,
                          minlength=len(snap.gpu_types))
    assert (by_type <= snap.capacity()).all()
    # Each copy gets its request, on GPU types the job can run on.
    cap = None if snap.max_copies is None else snap.copies_cap(1)
    for job_id, copies in p.by_job_copies().items():
        i = index_of[job_id]
        if cap is not None:
            assert len(copies) <= cap[i], f"job {job_id}: more copies than max_copies"
        if p.copy is None:
            assert len(copies) == 1
        if len(copies) > 1 and not snap.multi_node_copies:
            assert all(len({nd for nd, _ in rows}) == 1 for rows in copies.values()), (
                f"job {job_id}: a copy spans nodes though the snapshot forbids it")
        seen: set[int] = set()
        for rows in copies.values():
            nodes = [nd for nd, _ in rows]
            assert len(set(nodes)) == len(nodes), "a copy lists a node twice"
            assert not seen & set(nodes), f"job {job_id}: copies share a node"
            seen |= set(nodes)
            gpus = sum(c for _, c in rows)
            assert all(snap.rate[i, snap.node_type[nd]] > 0 for nd in nodes), (
                f"job {job_id} placed on a GPU type it cannot run on")
            if snap.sync[i]:
                assert gpus == snap.scale[i], f"sync job {job_id}: {gpus} GPUs, not its scale"
            else:
                assert 1 <= gpus <= snap.scale[i]


def check_pure(name: str, snap: Snapshot) -> Decision:
    before = copy.deepcopy(snap)
    policy = make_policy(name)
    first = policy.allocate(snap)
    assert same(snap, before), f"{name} modified the snapshot"
    again = policy.allocate(snap)
    fresh = make_policy(name).allocate(snap)
    for other in (again, fresh):
        assert same(first.placement, other.placement)
        assert same(first.reason, other.reason)
        assert first.detail == other.detail
        assert first.epoch == other.epoch
        assert same(first.policy_state, other.policy_state)
    assert same(snap, before), f"{name} modified the snapshot"
    return first


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", SEEDS)
def test_policy_contract_on_random_snapshots(name: str, seed: int) -> None:
    snap = random_snapshot(seed)
    check_contract(snap, check_pure(name, snap))


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("seed", range(3))
def test_policy_contract_mid_simulation(name: str, seed: int) -> None:
    for snap in simulated_snapshots(name, seed):
        check_contract(snap, check_pure(name, snap))


def test_factories_take_the_policys_own_settings() -> None:
    hadare = make_policy("hadare", max_copies=2, fork_all=True)
    assert (hadare.max_copies, hadare.fork_all) == (2, True)  # type: ignore[attr-defined]
    assert make_policy("HadarE") == make_policy("hadare")
    assert make_policy("hadar", horizon=4).horizon == 4  # type: ignore[attr-defined]
    gavel = make_policy("gavel-las", min_reset_s=10.0)
    assert (gavel.name, gavel.min_reset_s) == ("gavel-las", 10.0)  # type: ignore[attr-defined]
    assert policy_settings("fifo") == ()
    assert "max_copies" in policy_settings("hadare") and "name" not in policy_settings("hadare")


@pytest.mark.parametrize("name,setting", [
    ("hadar", "max_copies"),  # a HadarE setting, not Hadar's
    ("hadare", "multi_node_copies"),  # what the world allows: the snapshot says it
    ("hadar", "migration_s"),  # what a move costs: likewise
    ("fifo", "horizon"),
])
def test_an_unknown_setting_names_the_setting_and_the_policy(name: str, setting: str) -> None:
    with pytest.raises(InputError, match=f"policy '{name}' has no setting '{setting}'") as exc:
        make_policy(name, **{setting: 1})
    assert exc.value.field == setting


def test_random_snapshots_cover_the_cases() -> None:
    """The draws include no jobs, unrunnable jobs, gangs, async jobs, a current placement and
    max_copies, and every Hadar refusal of a job is one of its components' codes."""
    snaps = [random_snapshot(s) for s in SEEDS]
    assert any(s.num_jobs == 0 for s in snaps)
    assert any((s.rate.max(axis=1, initial=0.0) <= 0).any() for s in snaps if s.num_jobs)
    assert any(((s.scale > 1) & s.sync).any() for s in snaps)
    assert any((~s.sync).any() for s in snaps)
    assert any(len(s.current) for s in snaps)
    assert any(s.max_copies is not None for s in snaps)
    hadar_codes = {Reason.PLACED, Reason.PRICED_OUT, Reason.DEFERRED, Reason.NO_CAPACITY,
                   Reason.NOT_PACKED, Reason.NO_FREE_GPU, Reason.NO_THROUGHPUT}
    for s in snaps:
        got = {Reason(int(r)) for r in make_policy("hadar").allocate(s).reason}
        assert got <= hadar_codes


def test_every_reason_names_a_component_and_a_text() -> None:
    for r in Reason:
        assert r.component and r.text
    assert Reason.NOT_PACKED.component == "hadar.gang"
    assert Reason.NO_CAPACITY.component == "hadar.horizon"
    assert Reason.DEFERRED.component == "hadar.dual"
    assert Reason.PRICED_OUT.component == "hadar.dual"
    assert Reason.NO_FREE_GPU.component == "matcher"
