"""The compiled Hadar core (``hadar_slurm._hadar_core``) against its NumPy reference twin.

The two must return identical decisions: the same integers and bit-identical floats (NaN and
infinities in the same places), and raise the same exception where the reference raises.  Random
instances cover: 0 to 60 jobs, 1 to 5 GPU types, idle types (capacity 0), types a job cannot
run on (rate 0 / ``inf`` GPU-seconds), synchronous gangs and asynchronous jobs, scale factors
1 to 8, current placements with and without migration cost, horizons 1 to 10, price ratios,
windows that make some jobs too long, ties (repeated rows and columns) and finished jobs
(nothing left: skipped by ``plan``, a zero row of ``balance_split``).  Hand-worked cases pin the
reference itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hadar_slurm.core as core
from hadar_slurm.core import reference

compiled: Any
try:
    import hadar_slurm._hadar_core as compiled
except ImportError:  # pragma: no cover - `make test` always builds it
    compiled = None

needs_compiled = pytest.mark.skipif(
    compiled is None,
    reason="compiled core hadar_slurm._hadar_core is not built "
    "(run `make venv` or `pip install -e .`)",
)

IMPLS = [pytest.param(reference, id="reference"),
         pytest.param(compiled, id="compiled", marks=needs_compiled)]


INF = float("inf")
NUM_PLAN = 1000
NUM_SPLIT = 1000
NUM_DRAIN = 400
NUM_MATCH = 400


def test_compiled_core_is_built() -> None:
    # `make test` builds the extension first; a silent fallback to the reference would hide a
    # broken build (and skip every twin comparison below).
    assert compiled is not None, "hadar_slurm._hadar_core failed to import"
    assert core.COMPILED, "hadar_slurm.core fell back to the NumPy reference"
    assert core.plan is compiled.plan and core.balance_split is compiled.balance_split
    assert core.drain_prices is compiled.drain_prices and core.match is compiled.match
    assert core.pair_guests is compiled.pair_guests
    assert core.upgrade_idle is compiled.upgrade_idle


# -- random instances ----------------------------------------------------------------------------


def plan_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    """Arguments of ``plan`` as the policy builds them, with every corner we can think of."""
    J = int(rng.integers(0, 61))
    H = int(rng.integers(1, 6))
    capacity = rng.integers(0, 13, H).astype(np.int64)
    if rng.random() < 0.3:
        capacity[rng.integers(H)] = 0
    scale = rng.choice([1, 1, 1, 2, 4, 8, 3], J).astype(np.int64)
    if rng.random() < 0.5:  # few discrete rates: ties in price per iteration
        fill_rate = rng.choice([0.5, 1.0, 2.0], (J, H))
    else:
        fill_rate = rng.uniform(0.1, 3.0, (J, H))
    fill_rate[rng.random((J, H)) < 0.2] = 0.0  # types a job cannot run on
    if J > 0:
        fill_rate[rng.random(J) < 0.08] = 0.0  # jobs no type can run
    if J > 1 and rng.random() < 0.4:  # identical jobs
        fill_rate[rng.integers(1, J)] = fill_rate[0]
    if H > 1 and rng.random() < 0.3:  # identical types
        fill_rate[:, 1] = fill_rate[:, 0]
    # The dual pass may use a subset of the types (the split); back-fill uses all of them.
    rate = np.where(rng.random((J, H)) < 0.75, fill_rate, 0.0)
    round_s = float(rng.choice([360.0, 60.0]))
    best = (fill_rate * scale[:, None]).max(axis=1, initial=0.0)
    remaining = np.where(best > 0, best, 1.0) * round_s * rng.uniform(0.05, 15.0, J)
    ideal = remaining / np.where(best > 0, best, 1.0) * rng.uniform(0.3, 1.5, J)
    ukey = np.where(best > 0, rng.uniform(0.5, 3.0, J) * ideal, 0.0)
    age = rng.uniform(0.0, 5000.0, J)
    sync = (rng.random(J) < 0.7).astype(np.int64)
    current = np.zeros((J, H), dtype=np.int64)
    for i in range(J):
        if rng.random() < 0.4:
            current[i, rng.integers(H)] = rng.integers(1, scale[i] + 1)
    order = rng.permutation(J).astype(np.int64)
    if J > 0 and rng.random() < 0.15:  # not every job in the queue
        order = order[: int(rng.integers(0, J + 1))]
    horizon = int(rng.integers(1, 11))
    migration_s = float(rng.choice([0.0, 0.0, rng.uniform(1.0, 100.0), 500.0]))
    price_floor = 10.0 ** rng.uniform(-6.0, -2.0, H)
    if rng.random() < 0.3:
        price_floor[:] = price_floor[0]
    price_ratio = float(rng.choice([1.0, 2.0, 10.0 ** rng.uniform(0.0, 4.0)]))
    return (remaining, scale, rate, fill_rate, ukey, age, sync, current, order, capacity,
            round_s, horizon, migration_s, price_floor, price_ratio)


def split_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    """Arguments of ``balance_split``: GPU-seconds per job and type (``inf``: cannot run)."""
    J = int(rng.integers(0, 61))
    H = int(rng.integers(1, 6))
    capacity = rng.integers(0, 17, H).astype(np.int64)
    if rng.random() < 0.3:
        capacity[rng.integers(H)] = 0
    if rng.random() < 0.5:  # discrete values: ties in every quotient
        gpu_s = rng.integers(1, 6, (J, H)).astype(np.float64) * 100.0
    else:
        gpu_s = rng.uniform(10.0, 1000.0, (J, H))
    if J > 1 and rng.random() < 0.5:
        gpu_s[rng.integers(1, J)] = gpu_s[0]
    if H > 1 and rng.random() < 0.2:  # two equally fast types: nothing to gain by moving
        gpu_s[:, 1] = gpu_s[:, 0]
    gpu_s[rng.random((J, H)) < 0.2] = INF
    gpu_s[rng.random((J, H)) < 0.03] = 0.0  # "cannot run there" too
    if J > 0 and rng.random() < 0.2:
        gpu_s[int(rng.integers(J))] = 0.0  # a finished job: a zero row
    pi = rng.uniform(0.5, 2.0, H) if rng.random() < 0.7 else np.ones(H)
    scale = rng.integers(1, 9, J).astype(np.int64)
    window = float(rng.choice([rng.uniform(1.0, 300.0), rng.uniform(50.0, 2000.0), INF]))
    max_moves = int(rng.choice([0, 1, 3, 50, 20000]))
    # level only down to a load per GPU (the policy's fastest split), or fully (0)
    level_to = 0.0 if rng.random() < 0.5 else float(rng.uniform(10.0, 3000.0))
    return gpu_s, capacity, pi, scale, window, max_moves, level_to


def policy_instance(rng: np.random.Generator, J: int,
                    H: int = 3) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray]:
    """A bigger instance built as the policy builds it (many moves): the arguments of
    ``balance_split``, the whole-job rates and the remaining steps."""
    capacity = rng.integers(20, 60, H).astype(np.int64)
    scale = rng.choice([1, 2, 4, 8], J, p=[0.7, 0.1, 0.15, 0.05]).astype(np.int64)
    rate = rng.uniform(0.2, 4.0, (J, H)) * scale[:, None]
    rate[rng.random((J, H)) < 0.1] = 0.0
    remaining = rng.uniform(1e3, 1e5, J)
    runs = rate > 0
    need = np.where(runs, scale[:, None] * remaining[:, None] / np.where(runs, rate, 1), INF)
    pi = rng.uniform(0.5, 1.5, H) / capacity.sum()
    split = (need, capacity, pi, scale, float(rng.uniform(1e3, 3e4)), 20000)
    return split, rate, remaining


def call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """The result, or the exception type when it raises (the twins must raise alike)."""
    try:
        return fn(*args)
    except (ZeroDivisionError, IndexError, ValueError) as exc:
        return type(exc)


def twin_runs(name: str, instance: Callable[[np.random.Generator], tuple[Any, ...]],
              check: Callable[[Any, Any], None], seed: int, count: int,
              ) -> list[tuple[tuple[Any, ...], Any]]:
    """``count`` random instances of ``instance``'s, each run by both twins' ``name`` and
    compared by ``check``; returns ``(arguments, the reference's result)`` of each, none of
    which may raise."""
    rng = np.random.default_rng(seed)
    out: list[tuple[tuple[Any, ...], Any]] = []
    for _ in range(count):
        args = instance(rng)
        ref = call(getattr(reference, name), args)
        check(ref, call(getattr(compiled, name), args))
        assert not isinstance(ref, type)
        out.append((args, ref))
    return out


def assert_same_arrays(ref: np.ndarray, got: np.ndarray) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if ref.dtype.kind == "f":
        # bit for bit: same values, same NaN and +-inf positions, same signs of zeros
        assert np.array_equal(ref, got, equal_nan=True)
        assert np.array_equal(np.signbit(ref), np.signbit(got))
    else:
        assert np.array_equal(ref, got)


def check_plan(ref: Any, got: Any) -> None:
    if isinstance(ref, type):
        assert got is ref
        return
    assert isinstance(got, tuple) and len(got) == 3
    for r, g in zip(ref, got, strict=True):
        assert_same_arrays(r, g)


def check_plan_invariants(args: tuple[Any, ...], out: tuple[np.ndarray, ...]) -> None:
    """What any plan must satisfy, checked on the reference's output."""
    remaining, scale, sync, capacity = args[0], args[1], args[6], args[9]
    fill_rate, order = args[3], args[8]
    alloc, payoff, status = out
    queued = np.zeros(status.shape[0], dtype=np.bool_)
    queued[order] = True
    skipped = ~queued | (remaining <= 0)  # not in the queue, or finished
    assert (status[skipped] == 2).all() and np.isnan(payoff[skipped]).all()
    assert (alloc[skipped] == 0).all()
    assert (alloc >= 0).all()
    assert (alloc.sum(axis=0) <= np.maximum(capacity, 0)).all()  # never more than the GPUs
    held = alloc.sum(axis=1)
    runs = (status == 0) | (status == 4)
    assert (held[~runs] == 0).all() and (held[runs] > 0).all()
    assert (held[sync == 1] % scale[sync == 1] == 0).all()  # a gang runs whole or not at all
    assert (held[sync == 1] <= scale[sync == 1]).all() and (held <= scale).all()
    assert (alloc[fill_rate <= 0] == 0).all()  # only on types it can run on
    cannot = ~(fill_rate > 0).any(axis=1) & ~skipped
    assert (status[cannot] == 3).all() and (payoff[cannot] == -INF).all()


@needs_compiled
def test_plan_twins_on_random_instances() -> None:
    rng = np.random.default_rng(20260101)
    outcomes: dict[str, int] = {}
    for _ in range(NUM_PLAN):
        args = plan_instance(rng)
        if rng.random() < 0.1 and args[0].shape[0] > 0:  # a finished job: skipped
            args[0][int(rng.integers(args[0].shape[0]))] = 0.0
            outcomes["finished"] = outcomes.get("finished", 0) + 1
        ref = call(reference.plan, args)
        got = call(compiled.plan, args)
        check_plan(ref, got)
        assert not isinstance(ref, type), ref  # valid inputs never raise
        check_plan_invariants(args, ref)
        for s in ref[2]:
            outcomes[f"status{s}"] = outcomes.get(f"status{s}", 0) + 1
    # The instances do exercise every outcome.
    for key in ("status0", "status1", "status2", "status3", "status4", "finished"):
        assert outcomes.get(key, 0) > 20, outcomes


def check_split(ref: Any, got: Any) -> None:
    if isinstance(ref, type):
        assert got is ref
        return
    assert_same_arrays(ref, got)


@needs_compiled
def test_balance_split_twins_on_random_instances() -> None:
    rng = np.random.default_rng(20260102)
    for _ in range(NUM_SPLIT):
        args = split_instance(rng)
        ref = call(reference.balance_split, args)
        got = call(compiled.balance_split, args)
        check_split(ref, got)
        assert not isinstance(ref, type), ref  # no division by zero any more
        gpu_s, capacity = args[0], args[1]
        usable = (gpu_s > 0) & (gpu_s < INF) & (capacity > 0)[None, :]
        rows = ref.sum(axis=1)
        assert np.allclose(rows[usable.any(axis=1)], 1.0, rtol=0, atol=1e-9)
        assert (rows[~usable.any(axis=1)] == 0.0).all()
        assert (ref[~usable] == 0.0).all()  # no work where it cannot run
        assert (ref >= 0.0).all()  # clipped: rounding no longer leaves -1e-16


@needs_compiled
def test_twins_on_policy_like_instances() -> None:
    # Bigger instances (hundreds of jobs) as the policy builds them: more moves, longer queues.
    rng = np.random.default_rng(7)
    for _ in range(4):
        J, H = 400, 3
        split, rate, remaining = policy_instance(rng, J, H)
        check_split(call(reference.balance_split, split), call(compiled.balance_split, split))
        capacity, scale = split[1], split[3]
        phi = reference.balance_split(*split)
        worker_rate = rate / scale[:, None]
        args = (remaining, scale, np.where(phi > 0, worker_rate, 0.0), worker_rate,
                rng.uniform(100, 1e4, J), rng.uniform(0, 1e4, J), np.ones(J, dtype=np.int64),
                np.zeros((J, H), dtype=np.int64), rng.permutation(J).astype(np.int64),
                capacity, 360.0, 8, 0.0, np.full(H, 1e-4), 50.0)
        check_plan(call(reference.plan, args), call(compiled.plan, args))


@needs_compiled
def test_compiled_accepts_any_layout_and_integer_dtype() -> None:
    # Fortran-ordered and strided views, int32 counts, bool flags: converted at the boundary.
    rng = np.random.default_rng(3)
    for _ in range(20):
        args = list(plan_instance(rng))
        ref = reference.plan(*args)
        args[2] = np.asfortranarray(args[2])
        args[3] = np.repeat(args[3], 2, axis=1)[:, ::2]
        args[1] = args[1].astype(np.int32)
        args[6] = args[6].astype(np.bool_)
        args[7] = np.asfortranarray(args[7].astype(np.int32))
        check_plan(ref, compiled.plan(*args))
        split = list(split_instance(rng))
        ref_split = call(reference.balance_split, tuple(split))
        split[0] = np.asfortranarray(split[0])
        split[3] = split[3].astype(np.int32)
        check_split(ref_split, call(compiled.balance_split, tuple(split)))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("round_s", [360.0, np.float64(360.0)])
@pytest.mark.parametrize("sync", [1, 0])
def test_a_finished_job_is_skipped(impl: Any, round_s: float, sync: int) -> None:
    # Nothing left to do: not planned (no division by its zero progress), not back-filled onto
    # the idle GPU, status 2 and payoff nan -- also when no type could run it (not status 3).
    # The job queued after it is planned as usual.
    rate = np.array([[1.0], [1.0], [0.0]])
    args = (np.array([0.0, 500.0, -1.0]), np.array([1, 1, 1]), rate, rate.copy(),
            np.array([1.0, 250.0, 1.0]), np.zeros(3), np.array([sync] * 3),
            np.array([[1], [0], [0]]), np.array([0, 1, 2]), np.array([2]), round_s, 2, 0.0,
            np.array([1e-6]), 2.0)
    alloc, payoff, status = impl.plan(*args)
    assert status.tolist() == [2, 0, 2]
    assert alloc.tolist() == [[0], [1], [0]]
    assert np.isnan(payoff[0]) and np.isnan(payoff[2]) and payoff[1] > 0


@pytest.mark.parametrize("impl", IMPLS)
def test_plan_rejects_a_horizon_below_one_and_a_non_positive_round(impl: Any) -> None:
    args = list(one_job(1000.0, 4, [1.0], [8]))
    for horizon in (0, -1):
        args[11] = horizon
        with pytest.raises(ValueError, match="horizon must be at least 1"):
            impl.plan(*args)
    args[11] = 4
    for round_s in (0.0, -360.0, float("nan")):
        args[10] = round_s
        with pytest.raises(ValueError, match="round_s must be positive"):
            impl.plan(*args)


@needs_compiled
def test_twins_reject_bad_horizons_and_rounds_with_the_same_message() -> None:
    args = list(one_job(1000.0, 4, [1.0], [8]))
    for horizon, round_s in ((0, 360.0), (np.int64(-2), 360.0), (4, np.float64(0.0)),
                             (4, -1.0)):
        args[10], args[11] = round_s, horizon
        messages = []
        for impl in (reference, compiled):
            with pytest.raises(ValueError) as info:
                impl.plan(*args)
            messages.append(str(info.value))
        assert messages[0] == messages[1]


# -- the reference's type split equals the plain scans it replaced ------------------------------


def _level_scan(phi: np.ndarray, gpu_s: np.ndarray, capacity: np.ndarray, load: np.ndarray,
                slack: np.ndarray, max_moves: int, index: object, level_to: float = 0.0) -> int:
    """``_level`` as first written: a scan over all jobs for every move."""
    n = gpu_s.shape[0]
    moves = 0
    while moves < max_moves:
        # (the types are picked as _level picks them: only the job scan is written again)
        src, dst = reference._extremes(load, capacity)
        if src < 0:
            break
        per_src = load[src] / float(capacity[src])
        per_dst = load[dst] / float(capacity[dst])
        if per_src <= level_to * (1.0 + 1e-9):
            break
        gap = per_src - per_dst
        scale_gap = per_src if per_src > 1.0 else 1.0
        if gap <= 1e-9 * scale_gap:
            break
        best = -1
        best_ratio = INF
        for i in range(n):
            if not phi[i, src] > 1e-12 or not 0.0 < gpu_s[i, dst] < INF:
                continue
            grow = float(gpu_s[i, dst]) - float(gpu_s[i, src])
            if grow > 0.0 and not slack[i] > 1e-12 * float(gpu_s[i, dst]):
                continue
            ratio = reference._coarse(float(gpu_s[i, dst]) / float(gpu_s[i, src]))
            if ratio < best_ratio:
                best_ratio = ratio
                best = i
        if best < 0:
            break
        i = best
        g_src = float(gpu_s[i, src])
        g_dst = float(gpu_s[i, dst])
        grow = g_dst - g_src
        d = gap / (g_src / float(capacity[src]) + g_dst / float(capacity[dst]))
        if level_to > 0.0 and d > (per_src - level_to) * float(capacity[src]) / g_src:
            d = (per_src - level_to) * float(capacity[src]) / g_src
        if d > phi[i, src]:
            d = float(phi[i, src])
        if grow > 0.0 and d > slack[i] / grow:
            d = float(slack[i]) / grow
        moves += 1
        if d <= 1e-12:
            if grow <= 0.0:
                break
            slack[i] = 0.0
            continue
        phi[i, src] -= d
        phi[i, dst] += d
        load[src] -= d * g_src
        load[dst] += d * g_dst
        slack[i] -= d * grow
    return moves


def _exchange_scan(phi: np.ndarray, gpu_s: np.ndarray, capacity: np.ndarray, load: np.ndarray,
                   slack: np.ndarray, index: object) -> bool:
    """``_exchange`` as first written: a scan over all jobs for every swap."""
    n, num_types = gpu_s.shape
    changed = False
    for x in range(num_types):
        for y in range(num_types):
            if x == y or capacity[x] <= 0 or capacity[y] <= 0:
                continue
            for _ in range(64):
                a = -1
                ra = INF
                b = -1
                rb = INF
                for i in range(n):
                    gx = float(gpu_s[i, x])
                    gy = float(gpu_s[i, y])
                    if not (0.0 < gx < INF and 0.0 < gy < INF):
                        continue
                    if phi[i, x] > 1e-12 and (gy <= gx or slack[i] > 1e-12 * gy):
                        r = reference._coarse(gy / gx)
                        if r < ra:
                            ra = r
                            a = i
                    if phi[i, y] > 1e-12 and (gx <= gy or slack[i] > 1e-12 * gx):
                        r = reference._coarse(gx / gy)
                        if r < rb:
                            rb = r
                            b = i
                if a < 0 or b < 0 or a == b:
                    break
                gax = float(gpu_s[a, x])
                gay = float(gpu_s[a, y])
                gbx = float(gpu_s[b, x])
                gby = float(gpu_s[b, y])
                ra = gay / gax
                rb = gbx / gby
                if ra * rb >= 1.0 - 1e-9:
                    break
                u = phi[a, x] * gax
                lim = phi[b, y] * gby / ra
                if lim < u:
                    u = lim
                grow_a = (gay - gax) / gax
                grow_b = (gbx - gby) / gby
                if grow_a > 0.0 and slack[a] / grow_a < u:
                    u = slack[a] / grow_a
                if grow_b > 0.0 and slack[b] / (grow_b * ra) < u:
                    u = slack[b] / (grow_b * ra)
                if u <= 1e-12 * gax:
                    break
                v = u * ra
                phi[a, x] -= u / gax
                phi[a, y] += u / gax
                phi[b, y] -= v / gby
                phi[b, x] += v / gby
                load[x] += -u + v * rb
                slack[a] -= u * grow_a
                slack[b] -= v * grow_b
                changed = True
    return changed


def test_move_index_picks_what_a_full_scan_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    # reference._MoveIndex (one tournament tree per pair of types) replaced a scan over all jobs
    # per move; the scan version must give bit-identical splits (and raise alike).
    rng = np.random.default_rng(20260103)
    cases = [split_instance(rng) for _ in range(300)]
    cases += [policy_instance(rng, 150, int(rng.integers(2, 5)))[0] for _ in range(4)]
    with_index = [call(reference.balance_split, args) for args in cases]
    monkeypatch.setattr(reference, "_level", _level_scan)
    monkeypatch.setattr(reference, "_exchange", _exchange_scan)
    monkeypatch.setattr(reference, "_MoveIndex", lambda *a: None)
    for args, ref in zip(cases, with_index, strict=True):
        check_split(call(reference.balance_split, args), ref)


# -- hand-worked cases on the reference (and the compiled twin) ----------------------------------

def one_job(remaining: float, scale: int, rate: list[float], capacity: list[int], *,
            sync: int = 1, horizon: int = 4) -> tuple[Any, ...]:
    H = len(rate)
    r = np.array([rate], dtype=np.float64)
    return (np.array([remaining]), np.array([scale], dtype=np.int64), r, r.copy(),
            np.array([250.0]), np.array([0.0]), np.array([sync], dtype=np.int64),
            np.zeros((1, H), dtype=np.int64), np.array([0], dtype=np.int64),
            np.array(capacity, dtype=np.int64), 360.0, horizon, 0.0, np.full(H, 1e-6), 2.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_one_job_idle_cluster_runs_now_on_all_its_workers(impl: Any) -> None:
    # 1000 steps, 4 workers of 1 step/s on an idle type of 8 GPUs.  Epoch option (every epoch
    # alike): the gang of 4, cost 4 * 1e-6 * 360 = 0.00144, progress 4 * 1 * 360 = 1440 steps
    # clamped to the 1000 left.  Finishing by T = 0: all in epoch 0; at the epoch's full pace
    # (1440 steps, unclamped) the 1000 steps take frac = 1000 / 1440 of it, so
    # finish = 0 * 360 + frac * 360 = 250 s and payoff = 250 / (250 + 0) - 0.00144 > 0 (T >= 1
    # cannot end in epoch T: epoch 0 comes first among equal costs and already finishes).
    # Admitted, runs in epoch 0 (status 0) with its 4 workers.
    alloc, payoff, status = impl.plan(*one_job(1000.0, 4, [1.0], [8]))
    assert alloc.tolist() == [[4]]
    assert status.tolist() == [0]
    frac = (1000.0 - 0.0) / 1440.0
    assert payoff[0] == 250.0 / (0 * 360.0 + frac * 360.0 + 0.0) - 4 * 1e-6 * 360.0
    assert payoff[0] == pytest.approx(1.0 - 0.00144, rel=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_job_no_type_can_run_never_runs(impl: Any) -> None:
    alloc, payoff, status = impl.plan(*one_job(1000.0, 2, [0.0, 0.0], [4, 4]))
    assert status.tolist() == [3]
    assert payoff[0] == -INF
    assert alloc.tolist() == [[0, 0]]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_sync_gang_fits_in_the_free_gpus(impl: Any) -> None:
    # 4 workers; 3 free GPUs of type 0 (2 steps/s), 2 of type 1 (1 step/s), equal prices.
    # Paced by type 0 only type 0 may be used: 3 < 4, no gang.  Paced by type 1 both types may:
    # cheapest first, ties to the lower index, so 3 on type 0 and the last one on type 1.
    alloc, _, status = impl.plan(*one_job(5000.0, 4, [2.0, 1.0], [3, 2]))
    assert status.tolist() == [0]
    assert alloc.tolist() == [[3, 1]]
    # With 3 GPUs in all, a gang of 4 cannot run: it waits, holding nothing.
    alloc, payoff, status = impl.plan(*one_job(5000.0, 4, [2.0, 1.0], [2, 1]))
    assert alloc.tolist() == [[0, 0]] and status.tolist() == [2] and np.isnan(payoff[0])
    # Asynchronous, it takes the 3 there are (fastest per price first: type 0, then type 1).
    alloc, _, status = impl.plan(*one_job(5000.0, 4, [2.0, 1.0], [2, 1], sync=0))
    assert alloc.tolist() == [[2, 1]] and status.tolist() == [0]


@pytest.mark.parametrize("impl", IMPLS)
def test_balance_split_levels_two_identical_types(impl: Any) -> None:
    # Two identical jobs of 100 GPU-seconds on either of two identical types of 4 GPUs, equal
    # prices.  Both start on type 0 (the first of two equally cheap types): loads per GPU
    # 200/4 = 50 and 0.  Level: gap 50; both jobs lose nothing by moving (quotient 1), the first
    # (job 0) moves d = 50 / (100/4 + 100/4) = 1, i.e. all its work.  Loads 25 and 25: level.
    # Exchange: the only swap, job 1 to type 1 for job 0 to type 0, has quotients 1 * 1, no
    # saving.  So each type runs one job: the load splits 50/50.
    gpu_s = np.array([[100.0, 100.0], [100.0, 100.0]])
    phi = impl.balance_split(gpu_s, np.array([4, 4]), np.array([1.0, 1.0]), np.array([1, 1]),
                             1e9, 100)
    assert phi.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert phi.sum(axis=1).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("impl", IMPLS)
def test_balance_split_levels_only_down_to_level_to(impl: Any) -> None:
    # Two jobs on type 0 (100 and 300 GPU-s), one GPU of each of two types; type 1 is twice as
    # slow for both.  Levelled fully: type 0 and 1 end equal (266.7 s each).  Levelled down to
    # 350 s: only what takes type 0 from 400 s to 350 s moves, from the job that loses least
    # (both lose 2x: the first on ties, job 0): half of job 0, 100 s on type 1.  Down to 250 s
    # is below level: it stops level, as fully levelled.
    gpu_s = np.array([[100.0, 200.0], [300.0, 600.0]])
    args = (gpu_s, np.array([1, 1]), np.array([1.0, 1.0]), np.array([1, 1]), INF, 20000)
    full = impl.balance_split(*args)
    load = (full * gpu_s).sum(axis=0)
    assert load[0] == pytest.approx(load[1])
    part = impl.balance_split(*args, 350.0)
    assert (part * gpu_s).sum(axis=0) == pytest.approx([350.0, 100.0])
    assert part[0] == pytest.approx([0.5, 0.5]) and part[1] == pytest.approx([1.0, 0.0])
    below = impl.balance_split(*args, 250.0)
    assert (below * gpu_s).sum(axis=0) == pytest.approx([800.0 / 3, 800.0 / 3])
    # a type already below level_to keeps everything: every job on its cheapest type
    assert (impl.balance_split(*args, 500.0) == np.array([[1.0, 0.0], [1.0, 0.0]])).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_balance_split_moves_a_long_job_to_its_fastest_type(impl: Any) -> None:
    # One job of 1 GPU: 400 GPU-seconds on type 0, 100 on type 1; type 1 costs 5x more, so it
    # starts on type 0 (400 * 1 < 100 * 5).  Window 200 s: t_slow = 400 > 200, t_fast = 100,
    # f = (400 - 200) / (400 - 100) = 2/3 moves to type 1; it then takes exactly 200 s.
    # Level: loads 400/3 on type 0 and 200/3 on type 1 (one GPU each).  Moving work to type 1
    # makes the job shorter (grow = 100 - 400 < 0), so it may move without slack: the gap 200/3
    # over 400/1 + 100/1 gives d = 2/15, phi = (1/5, 4/5), loads 80 and 80.  Exchange: the only
    # job would have to swap with itself (a == b).
    phi = impl.balance_split(np.array([[400.0, 100.0]]), np.array([1, 1]),
                             np.array([1.0, 5.0]), np.array([1]), 200.0, 100)
    assert phi[0].sum() == pytest.approx(1.0, abs=1e-15)
    assert phi[0] * np.array([400.0, 100.0]) == pytest.approx([80.0, 80.0], rel=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("window", [50.0, np.float64(50.0)])
def test_balance_split_with_two_equally_fast_types_and_a_long_job(impl: Any,
                                                                  window: float) -> None:
    # Type 1 is cheaper (100 * 1 < 100 * 2), type 0 is the (first) fastest; both take 100 s,
    # longer than the window of 50 s.  Moving to an equally fast type would not shorten it
    # (f = 50 / 0 before), so it stays on type 1: loads 0 and 100 per GPU.  Level: quotient
    # 100 / 100 = 1, d = 100 / (100/1 + 100/1) = 1/2 moves to type 0 (no longer: grow 0).
    phi = impl.balance_split(np.array([[100.0, 100.0]]), np.array([1, 1]),
                             np.array([2.0, 1.0]), np.array([1]), window, 100)
    assert phi.tolist() == [[0.5, 0.5]]


@pytest.mark.parametrize("impl", IMPLS)
def test_balance_split_zero_gpu_seconds_mean_cannot_run(impl: Any) -> None:
    # Job 0 is finished (all zeros): a zero row.  Job 1 needs 0 on type 0 (no rate there): it
    # stays on type 1 although type 0 is idle and cheaper.  Job 2 runs anywhere: the levelling
    # moves it to the idle type 0.
    gpu_s = np.array([[0.0, 0.0], [0.0, 100.0], [100.0, 100.0]])
    phi = impl.balance_split(gpu_s, np.array([1, 1]), np.array([1.0, 2.0]),
                             np.array([1, 1, 1]), 1e9, 100)
    assert phi[0].tolist() == [0.0, 0.0]
    assert phi[1].tolist() == [0.0, 1.0]
    assert phi[2].sum() == 1.0 and phi[2, 0] > 0.0


@pytest.mark.parametrize("impl", IMPLS)
def test_balance_split_clips_rounding_below_zero(impl: Any) -> None:
    # Found by search: the exchange moves u / gax of job 1 off type 1 where u = phi * gax, and
    # (phi * gax) / gax rounds above phi, which left phi[1, 1] = -3.4e-21.  It is 0 now; the
    # other entries are what they were and the rows still sum to 1.
    gpu_s = np.array([[50.0, 20.0, 90.0], [40.0, 50.0, 60.0], [30.0, 30.0, 80.0]])
    phi = impl.balance_split(gpu_s, np.array([4, 1, 3]), np.array([3.0, 3.0, 2.0]),
                             np.array([2, 1, 1]), 92.0, 100)
    assert (phi >= 0.0).all() and not np.signbit(phi).any()
    assert phi[1, 1] == 0.0
    # (5/17 and 12/17 but for rounding; the bits since the split's relative tolerances)
    assert phi[0].tolist() == [0.29411764727499534, 0.7058823527250048, 0.0]
    assert phi[1, 0] == 0.29411764696875187 and phi[1, 2] == 0.7058823530312481
    assert np.allclose(phi.sum(axis=1), 1.0, rtol=0, atol=1e-12)


# -- drain_prices --------------------------------------------------------------------------------


def drain_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    """Arguments of ``drain_prices``: whole-job rates, idle types, finished and stuck jobs."""
    J = int(rng.integers(0, 61))
    H = int(rng.integers(1, 6))
    capacity = rng.integers(0, 13, H).astype(np.int64)
    if rng.random() < 0.3:
        capacity[rng.integers(H)] = 0
    if rng.random() < 0.05:
        capacity[:] = 0  # no GPUs at all
    scale = rng.choice([1, 1, 1, 2, 4, 8, 3], J).astype(np.int64)
    rate: np.ndarray[Any, np.dtype[np.float64]]
    if rng.random() < 0.5:  # few discrete rates: ties between types
        rate = rng.choice([0.5, 1.0, 2.0], (J, H)) * scale[:, None]
    else:
        rate = rng.uniform(0.1, 3.0, (J, H)) * scale[:, None]
    rate[rng.random((J, H)) < 0.2] = 0.0  # types a job cannot run on
    if J > 0:
        rate[rng.random(J) < 0.08] = 0.0  # jobs no type can run
    if J > 1 and rng.random() < 0.4:  # identical jobs
        rate[rng.integers(1, J)] = rate[0]
    if H > 1 and rng.random() < 0.3:  # identical types
        rate[:, 1] = rate[:, 0]
    remaining = rng.uniform(1.0, 1e5, J)
    remaining[rng.random(J) < 0.05] = 0.0  # finished jobs
    if rng.random() < 0.05:
        remaining[:] = 0.0  # nothing left to do: the mean load is 0
    iterations = int(rng.integers(0, 81))
    return remaining, scale, rate, capacity, iterations


def check_drain(ref: Any, got: Any) -> None:
    if isinstance(ref, type):
        assert got is ref
        return
    assert isinstance(got, tuple) and len(got) == 2
    assert np.float64(got[0]).tobytes() == np.float64(ref[0]).tobytes()  # bit for bit
    assert_same_arrays(ref[1], got[1])


@needs_compiled
def test_drain_prices_twins_on_random_instances() -> None:
    rng = np.random.default_rng(20260104)
    positive = 0
    for _ in range(NUM_DRAIN):
        args = drain_instance(rng)
        ref = call(reference.drain_prices, args)
        got = call(compiled.drain_prices, args)
        check_drain(ref, got)
        assert not isinstance(ref, type)
        bound, pi = ref
        remaining, _, rate, capacity, _ = args
        usable = capacity > 0
        assert (pi >= 0.0).all() and (pi[~usable] == 0.0).all()
        if usable.any():
            assert float((pi * capacity).sum()) == pytest.approx(1.0, rel=1e-9)
        runs = (rate > 0) & usable[None, :]
        per_job = np.where(runs, remaining[:, None] / np.where(runs, rate, 1.0), INF).min(
            axis=1, initial=INF)
        longest = float(per_job[per_job < INF].max(initial=0.0))
        assert bound >= longest  # never below the longest job on its fastest type
        positive += bound > 0.0
    assert positive > NUM_DRAIN // 2


@pytest.mark.parametrize("impl", IMPLS)
def test_drain_bound_of_two_jobs_on_two_identical_types_is_one_jobs_time(impl: Any) -> None:
    # Two jobs of 100 steps at 1 step/s (1 GPU), two types of 1 GPU each.  Start: pi = 1/2 each;
    # both jobs pick type 0 (first of two equal costs 100 * 1/2), value 100: one job's time, the
    # makespan of running them side by side.  Later prices are uneven and both jobs take the
    # cheaper type, value 200 * min(pi) < 100.  The longest job alone is 100 s too.
    args = (np.array([100.0, 100.0]), np.array([1, 1]), np.ones((2, 2)), np.array([1, 1]), 60)
    bound, pi = impl.drain_prices(*args)
    assert bound == 100.0
    assert pi.tolist() == [0.5, 0.5]  # the prices of the best bound: the first ones
    # Without iterations the bound is the longest job.
    bound, pi = impl.drain_prices(*args[:4], 0)
    assert bound == 100.0 and pi.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("impl", IMPLS)
def test_drain_bound_is_at_least_the_longest_job(impl: Any) -> None:
    # One job of 1000 steps at 1 step/s on a type of 4 GPUs: the dual value is 1000 * 1/4,
    # but the job alone takes 1000 s.
    bound, pi = impl.drain_prices(np.array([1000.0]), np.array([1]), np.array([[1.0]]),
                                  np.array([4]), 60)
    assert bound == 1000.0 and pi.tolist() == [0.25]


@pytest.mark.parametrize("impl", IMPLS)
def test_drain_leaves_out_jobs_no_type_can_run(impl: Any) -> None:
    # Job 1 runs only on type 1, which has no GPUs; job 2 runs nowhere.  Both are left out: the
    # bound is job 0's (200 steps at 2 steps/s: 100 s) and type 1 gets no price.
    rate = np.array([[2.0, 2.0], [0.0, 5.0], [0.0, 0.0]])
    args = (np.array([200.0, 1e6, 1e6]), np.array([1, 1, 1]), rate, np.array([1, 0]), 40)
    bound, pi = impl.drain_prices(*args)
    assert bound == 100.0 and pi.tolist() == [1.0, 0.0]
    # No GPUs at all, or no job any type can run: (0, prices 0 / uniform).
    bound, pi = impl.drain_prices(*args[:3], np.array([0, 0]), 40)
    assert bound == 0.0 and pi.tolist() == [0.0, 0.0]
    bound, pi = impl.drain_prices(args[0][1:], args[1][1:], rate[1:], np.array([3, 0]), 40)
    assert bound == 0.0 and pi.tolist() == [1.0 / 3.0, 0.0]


# -- match ---------------------------------------------------------------------------------------


def match_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    """Arguments of ``match``: nodes of a few types (some types without nodes), per-type counts
    (some over several types, some too large to place), last epoch's rows."""
    N = int(rng.integers(0, 25))
    H = int(rng.integers(1, 5))
    kinds = rng.choice(H, int(rng.integers(1, H + 1)), replace=False)  # types that have nodes
    node_type = rng.choice(kinds, N).astype(np.int64)
    node_gpus = rng.choice([1, 2, 4, 4, 8], N).astype(np.int64)
    if N > 0 and rng.random() < 0.2:
        node_gpus[rng.integers(N)] = 0
    J = int(rng.integers(0, 31))
    counts = np.zeros((J, H), dtype=np.int64)
    for i in range(J):
        if rng.random() < 0.1:
            continue  # asks for nothing
        counts[i, rng.integers(H)] = rng.choice([1, 1, 2, 3, 4, 6, 8, 16])
        if rng.random() < 0.25:  # a multi-type row
            counts[i, rng.integers(H)] += rng.integers(1, 5)
    order = rng.permutation(J).astype(np.int64)
    if J > 0 and rng.random() < 0.15:  # not every job in the queue
        order = order[: int(rng.integers(0, J + 1))]
    cur: dict[tuple[int, int], int] = {}
    if N > 0:
        for _ in range(int(rng.integers(0, 2 * J + 2))):
            j = int(rng.integers(-1, J)) if rng.random() < 0.9 else -1  # -1: a job gone
            cur[(j, int(rng.integers(N)))] = int(rng.integers(1, 9))
    pairs = list(cur.items())
    perm = rng.permutation(len(pairs))
    cur_job = np.array([pairs[p][0][0] for p in perm], dtype=np.int64)
    cur_node = np.array([pairs[p][0][1] for p in perm], dtype=np.int64)
    cur_count = np.array([pairs[p][1] for p in perm], dtype=np.int64)
    return node_type, node_gpus, counts, order, cur_job, cur_node, cur_count


def check_match(ref: Any, got: Any) -> None:
    if isinstance(ref, type):
        assert got is ref
        return
    assert isinstance(got, tuple) and len(got) == 4
    for r, g in zip(ref, got, strict=True):
        assert_same_arrays(r, g)


def check_match_invariants(args: tuple[Any, ...], out: tuple[np.ndarray, ...]) -> None:
    """What any matching must satisfy, checked on the reference's output."""
    node_type, node_gpus, counts, order = args[:4]
    rows_job, rows_node, rows_count, placed = out
    assert (rows_count > 0).all()
    used = np.bincount(rows_node, weights=rows_count, minlength=node_gpus.shape[0])
    assert (used <= node_gpus).all()  # never more GPUs than a node has
    got = np.zeros_like(counts)
    np.add.at(got, (rows_job, node_type[rows_node]), rows_count)
    assert np.array_equal(got[placed == 1], counts[placed == 1])  # all it asked for
    assert (got[placed == 0] == 0).all()  # or nothing
    assert set(np.nonzero(placed)[0].tolist()) <= set(order.tolist())
    for j in np.unique(rows_job):
        assert (np.diff(rows_node[rows_job == j]) > 0).all()  # nodes ascending, one row each


@needs_compiled
def test_match_twins_on_random_instances() -> None:
    rng = np.random.default_rng(20260105)
    placed = unplaced = 0
    for _ in range(NUM_MATCH):
        args = match_instance(rng)
        ref = call(reference.match, args)
        got = call(compiled.match, args)
        check_match(ref, got)
        assert not isinstance(ref, type)
        check_match_invariants(args, ref)
        asked = args[2].sum(axis=1) > 0
        asked_q = np.zeros_like(asked)
        asked_q[args[3]] = asked[args[3]]
        placed += int(ref[3].sum())
        unplaced += int((asked_q & (ref[3] == 0)).sum())
    assert placed > 500 and unplaced > 200  # both outcomes are exercised


def big_match_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    """Arguments of ``match`` on 60 to 400 nodes (the compiled matcher keeps each type's nodes
    in bitsets of 64, by free GPUs: several words per type here) and as many jobs, nodes of
    mixed sizes up to 16 GPUs, some held by last epoch's rows."""
    N = int(rng.integers(60, 401))
    H = int(rng.integers(1, 4))
    node_type = rng.integers(0, H, N).astype(np.int64)
    node_gpus = rng.choice([0, 1, 2, 4, 4, 8, 8, 16], N).astype(np.int64)
    J = int(rng.integers(N // 2, 2 * N))
    counts = np.zeros((J, H), dtype=np.int64)
    for i in range(J):
        counts[i, rng.integers(H)] = rng.choice([1, 1, 1, 2, 2, 3, 4, 8, 12, 16, 32])
        if rng.random() < 0.1:
            counts[i, rng.integers(H)] += rng.integers(1, 9)
    order = rng.permutation(J).astype(np.int64)
    cur: dict[tuple[int, int], int] = {}
    for _ in range(int(rng.integers(0, J))):
        cur[(int(rng.integers(-1, J)), int(rng.integers(N)))] = int(rng.integers(1, 9))
    pairs = list(cur.items())
    cur_job = np.array([j for (j, _k), _c in pairs], dtype=np.int64)
    cur_node = np.array([k for (_j, k), _c in pairs], dtype=np.int64)
    cur_count = np.array([c for _jk, c in pairs], dtype=np.int64)
    return node_type, node_gpus, counts, order, cur_job, cur_node, cur_count


@needs_compiled
def test_match_twins_on_large_clusters() -> None:
    placed = unplaced = 0
    for args, ref in twin_runs("match", big_match_instance, check_match, 20261206, 40):
        check_match_invariants(args, ref)
        placed += int(ref[3].sum())
        unplaced += int((ref[3] == 0).sum())
    assert placed > 2000 and unplaced > 1000  # both outcomes are exercised


def _nodes(gpus: list[int], types: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    t = [0] * len(gpus) if types is None else types
    return np.array(t, dtype=np.int64), np.array(gpus, dtype=np.int64)


def _no_rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    z = np.zeros(0, dtype=np.int64)
    return z, z.copy(), z.copy()


def _rows(out: tuple[np.ndarray, ...]) -> list[tuple[int, int, int]]:
    return list(zip(out[0].tolist(), out[1].tolist(), out[2].tolist(), strict=True))


@pytest.mark.parametrize("impl", IMPLS)
def test_match_best_fit_takes_the_smallest_node_that_holds_the_request(impl: Any) -> None:
    # Free GPUs 8, 2, 4, 4; 3 wanted: nodes 2 and 3 hold it with the fewest free (4), the first
    # of them wins.  Then 2 wanted: node 1 (2 free) fits exactly.
    out = impl.match(*_nodes([8, 2, 4, 4]), np.array([[3], [2]]), np.array([0, 1]),
                     *_no_rows())
    assert _rows(out) == [(0, 2, 3), (1, 1, 2)]
    assert out[3].tolist() == [1, 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_match_spreads_over_the_freest_nodes_when_no_node_holds_it(impl: Any) -> None:
    # Free 2, 3, 1; 5 wanted: node 1 (3) then node 0 (2); rows listed by node.
    out = impl.match(*_nodes([2, 3, 1]), np.array([[5]]), np.array([0]), *_no_rows())
    assert _rows(out) == [(0, 0, 2), (0, 1, 3)]


@pytest.mark.parametrize("impl", IMPLS)
def test_match_a_job_that_cannot_get_all_gets_none_and_gives_back_what_it_kept(impl: Any) -> None:
    # Node 0: 4 GPUs of type 0, node 1: 2 of type 1.  Job 0 held 2 GPUs on node 0 and now wants
    # 2 of type 0 and 4 of type 1: type 1 has only 2, so it gets nothing and its 2 GPUs on node
    # 0 go back.  Job 1, served next, wants 4 of type 0: all of node 0.
    out = impl.match(*_nodes([4, 2], [0, 1]), np.array([[2, 4], [4, 0]]), np.array([0, 1]),
                     np.array([0]), np.array([0]), np.array([2]))
    assert _rows(out) == [(1, 0, 4)]
    assert out[3].tolist() == [0, 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_match_keeps_gpus_where_they_were(impl: Any) -> None:
    # Two nodes of 4.  Job 0 held 1 GPU on node 1 and wants 3: it keeps that one, and the other
    # 2 go by best fit to node 1 (3 free left, fewer than node 0's 4): one row of 3 on node 1.
    # A row of a job no longer there (-1) is ignored, and job 1 then fits on node 0.
    out = impl.match(*_nodes([4, 4]), np.array([[3], [4]]), np.array([0, 1]),
                     np.array([-1, 0]), np.array([0, 1]), np.array([4, 1]))
    assert _rows(out) == [(0, 1, 3), (1, 0, 4)]
    # A job keeps at most what it asks for now: held 3, wants 1 -> 1 on the same node.
    out = impl.match(*_nodes([4, 4]), np.array([[1]]), np.array([0]),
                     np.array([0]), np.array([1]), np.array([3]))
    assert _rows(out) == [(0, 1, 1)]


def _match_nodes_numpy(snapshot: Any, counts: np.ndarray,
                       order: np.ndarray) -> tuple[Any, np.ndarray]:
    """``policy.matching.match_nodes`` as it was before it called ``core.match`` (NumPy)."""
    from hadar_slurm.policy.base import Placement

    num_nodes = snapshot.node_gpus.shape[0]
    free = snapshot.node_gpus.astype(np.int64).copy()
    node_type = snapshot.node_type
    nodes_of_type = [np.nonzero(node_type == h)[0] for h in range(len(snapshot.gpu_types))]
    want = counts.astype(np.int64).copy()
    index_of = {int(j): i for i, j in enumerate(snapshot.job_ids.tolist())}
    kept: dict[int, list[tuple[int, int]]] = {}
    cur = snapshot.current
    for j, n, c in zip(cur.job.tolist(), cur.node.tolist(), cur.count.tolist(), strict=True):
        i = index_of.get(j)
        if i is None or n >= num_nodes:
            continue
        h = int(node_type[n])
        take = min(c, int(want[i, h]), int(free[n]))
        if take > 0:
            free[n] -= take
            want[i, h] -= take
            kept.setdefault(i, []).append((n, take))
    rows_job: list[int] = []
    rows_node: list[int] = []
    rows_count: list[int] = []
    placed = np.zeros(snapshot.num_jobs, dtype=np.bool_)
    for i in order.tolist():
        if counts[i].sum() <= 0:
            continue
        rows = list(kept.get(i, []))
        trial = free.copy()
        ok = True
        for h in np.nonzero(want[i] > 0)[0].tolist():
            need = int(want[i, h])
            cand = nodes_of_type[h]
            fits = cand[trial[cand] >= need]
            if fits.shape[0]:
                n = int(fits[np.argmin(trial[fits])])
                trial[n] -= need
                rows.append((n, need))
                continue
            for n in cand[np.argsort(-trial[cand], kind="stable")].tolist():
                if need == 0 or trial[n] == 0:
                    break
                take = min(need, int(trial[n]))
                trial[n] -= take
                need -= take
                rows.append((n, take))
            if need > 0:
                ok = False
                break
        if not ok:
            for n, c in kept.get(i, []):
                free[n] += c
            continue
        free = trial
        placed[i] = True
        jid = int(snapshot.job_ids[i])
        merged: dict[int, int] = {}
        for n, c in rows:
            merged[n] = merged.get(n, 0) + c
        for n, c in sorted(merged.items()):
            rows_job.append(jid)
            rows_node.append(n)
            rows_count.append(c)
    placement = Placement(np.asarray(rows_job, dtype=np.int64),
                          np.asarray(rows_node, dtype=np.int64),
                          np.asarray(rows_count, dtype=np.int64))
    return placement, placed


def test_match_nodes_places_what_the_numpy_matcher_placed() -> None:
    # The policy-level matcher (job ids, not indices) against the NumPy version it replaced, on
    # snapshots with shuffled job ids, rows of jobs that are gone, and multi-type counts.
    from dataclasses import replace

    from bench.instances import gavel_cluster, snapshot
    from hadar_slurm.policy.base import Placement
    from hadar_slurm.policy.matching import match_nodes

    rng = np.random.default_rng(20260106)
    for trial in range(40):
        J = int(rng.integers(1, 120))
        snap = snapshot(J, gavel_cluster(int(rng.choice([4, 8, 16]))), seed=trial)
        ids = rng.permutation(10 * J)[:J].astype(np.int64)
        H = len(snap.gpu_types)
        counts = np.zeros((J, H), dtype=np.int64)
        for i in range(J):
            counts[i, rng.integers(H)] = rng.choice([0, 1, 2, 4, 8])
            if rng.random() < 0.2:
                counts[i, rng.integers(H)] += 1
        num_nodes = snap.node_gpus.shape[0]
        cur_rows = {}
        for _ in range(int(rng.integers(0, J + 1))):
            jid = int(ids[rng.integers(J)]) if rng.random() < 0.8 else int(10 * J + 5)
            cur_rows[(jid, int(rng.integers(num_nodes)))] = int(rng.integers(1, 5))
        cur = Placement(np.array([k[0] for k in cur_rows], dtype=np.int64),
                        np.array([k[1] for k in cur_rows], dtype=np.int64),
                        np.array(list(cur_rows.values()), dtype=np.int64))
        snap = replace(snap, job_ids=ids, current=cur)
        order = rng.permutation(J).astype(np.int64)
        new, placed_new = match_nodes(snap, counts, order)
        old, placed_old = _match_nodes_numpy(snap, counts, order)
        assert placed_new.dtype == np.bool_ and np.array_equal(placed_new, placed_old)
        for a, b in ((new.job, old.job), (new.node, old.node), (new.count, old.count)):
            assert a.dtype == np.int64 and np.array_equal(a, b)


# -- pair_guests (GPU sharing; random worlds in test_sharing_twins.py) ---------------------------


def pair_case(hosts: int = 3, guests: int = 2, cpus: int = 8) -> dict[str, Any]:
    """``hosts`` identical 1-GPU hosts (one kind, one type, one node each) and ``guests``
    identical waiting jobs of another kind: rates 1 step/s alone, 0.8 each while sharing, 720 s
    left each, nothing behind them; the arguments of ``pair_guests`` by name."""
    n = hosts + guests
    f = np.float64
    return dict(
        order=np.arange(hosts, n, dtype=np.int64), g_scale=np.ones(n, dtype=np.int64),
        g_kind=np.array([0] * hosts + [1] * guests, dtype=np.int64),
        g_rem=np.full(n, 720.0), g_weight=np.ones(n), g_rate=np.ones((n, 1)),
        g_open=np.ones((n, 1), dtype=np.int64), g_partner=np.full(n, -1, dtype=np.int64),
        g_start=np.full((n, 1), 720.0), g_else=np.full((n, 1), INF), g_behind=np.zeros(n),
        g_cpus=np.ones(n, dtype=np.int64), h_kind=np.zeros(hosts, dtype=np.int64),
        h_type=np.zeros(hosts, dtype=np.int64), h_scale=np.ones(hosts, dtype=np.int64),
        h_may=np.ones(hosts, dtype=np.int64), h_rp=np.ones(hosts, dtype=f),
        h_tp=np.full(hosts, 720.0), h_wp=np.ones(hosts, dtype=f),
        row_ptr=np.arange(hosts + 1, dtype=np.int64), row_node=np.arange(hosts, dtype=np.int64),
        pair_host=np.full((2, 2, 1), 0.8), pair_guest=np.full((2, 2, 1), 0.8),
        cpus_left=np.full(hosts, cpus, dtype=np.int64), count_cpus=1, window=INF, start_s=0.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_pair_guests_by_hand(impl: Any) -> None:
    # Each pair gains 360 s (test_hadar_sharing.py::test_pair_gain_by_hand): equal gains, so
    # the first guest takes the first host and the second the next; the third host is left.
    got = impl.pair_guests(**pair_case())
    assert [a.tolist() for a in got] == [[-1, -1, -1, 0, 1], [-1] * 5, [-1] * 5, [-1] * 5]
    # A guest that shared with host 2 in the last epoch goes on there, whatever rule 4 says.
    case = pair_case()
    case["g_partner"][4] = 2
    case["g_open"][4] = 0
    assert impl.pair_guests(**case)[0].tolist() == [-1, -1, -1, 0, 2]
    # A host's node without a CPU for the guest: the guest takes the next host; with none
    # left, the best it missed, its node and that node's free CPUs are returned.
    case = pair_case(hosts=2, guests=2, cpus=1)
    case["cpus_left"][0] = 0
    host_for, tight_host, tight_node, tight_left = impl.pair_guests(**case)
    assert host_for.tolist() == [-1, -1, 1, -1]
    assert (tight_host.tolist(), tight_node.tolist(), tight_left.tolist()) == (
        [-1, -1, -1, 0], [-1, -1, -1, 0], [-1, -1, -1, 0])
    assert case["cpus_left"].tolist() == [0, 0]  # (taken in place by the guest that joined)
    # Equal gains in hosts of different kinds: still the first host in index order (the
    # compiled twin weighs hosts in groups of one kind, here host 0 after hosts 1 and 2).
    case = pair_case()
    case["h_kind"][0] = 1
    assert impl.pair_guests(**case)[0].tolist() == [-1, -1, -1, 0, 1]
    case["h_rp"][1] = 0.5  # (host 1 alone at half the pace: its pair gains more)
    assert impl.pair_guests(**case)[0].tolist() == [-1, -1, -1, 1, 0]
    # The window (rule 3): a pair that would end at 900 s does not form before a 899 s target.
    case = pair_case()
    case["window"] = 899.0
    assert impl.pair_guests(**case)[0].tolist() == [-1] * 5


@needs_compiled
def test_pair_guests_takes_the_cpus_it_updates_as_int64_only() -> None:
    case = pair_case()
    case["cpus_left"] = case["cpus_left"].astype(np.int32)
    with pytest.raises(ValueError, match="cpus_left"):
        compiled.pair_guests(**case)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("name", "value", "error"), [
    ("order", np.array([3, 5], dtype=np.int64), IndexError),          # (5 jobs: 0..4)
    ("order", np.array([-1], dtype=np.int64), IndexError),
    ("g_partner", np.array([-1, -1, -1, 3, -1], dtype=np.int64), IndexError),  # (3 hosts)
    ("g_partner", np.array([-2, -1, -1, -1, -1], dtype=np.int64), IndexError),
    ("g_kind", np.array([0, 0, 0, 2, 1], dtype=np.int64), IndexError),  # (2 kinds)
    ("h_kind", np.array([0, 0, 2], dtype=np.int64), IndexError),
    ("h_type", np.array([0, 1, 0], dtype=np.int64), IndexError),       # (1 GPU type)
    ("row_node", np.array([0, 1, 3], dtype=np.int64), IndexError),     # (3 nodes)
    ("row_ptr", np.array([0, 2, 1, 3], dtype=np.int64), IndexError),
    ("row_ptr", np.array([0, 1, 2, 4], dtype=np.int64), IndexError),
    ("g_rem", np.full(4, 720.0), ValueError),
    ("g_start", np.full((5, 2), 720.0), ValueError),
    ("h_tp", np.full(2, 720.0), ValueError),
    ("row_ptr", np.arange(3, dtype=np.int64), ValueError),
    ("pair_guest", np.full((2, 2, 2), 0.8), ValueError),
])
def test_pair_guests_refuses_arguments_out_of_range(impl: Any, name: str, value: Any,
                                                    error: type[Exception]) -> None:
    # (the compiled loop reads them unchecked: out of range, it would read past its arrays)
    case = pair_case()
    case[name] = value
    with pytest.raises(error, match=name):
        impl.pair_guests(**case)


# -- upgrade_idle (placed jobs onto idle GPUs of faster types) ------------------------------------

NUM_UPGRADE = 600


def upgrade_instance(rng: np.random.Generator) -> tuple[Any, ...]:
    """Arguments of ``upgrade_idle``: 0 to 40 jobs over 1 to 4 types, some placed (one type or
    spread over several), some waiting; idle GPUs on some types (or none at all); rates with
    ties, zeros and equal rows; current placements equal to the plan, whole elsewhere or none;
    synchronous and asynchronous jobs; rounds where a move costs nothing, part or all of it."""
    J = int(rng.integers(0, 41))
    H = int(rng.integers(1, 5))
    rate = rng.choice([0.0, 0.5, 1.0, 1.0, 2.0, 3.7], (J, H)) * rng.choice([1.0, 10.0], (J, 1))
    if J > 1 and rng.random() < 0.3:
        rate[1] = rate[0]  # (equal rows: ties in the queue)
    alloc = np.zeros((J, H), dtype=np.int64)
    for i in range(J):
        if rng.random() < 0.25:
            continue  # waiting
        s = int(rng.choice([1, 1, 2, 4, 8]))
        if H > 1 and rng.random() < 0.25:  # spread over two types
            a, b = rng.choice(H, 2, replace=False)
            k = int(rng.integers(1, s + 1)) if s > 1 else 1
            alloc[i, a] += k
            alloc[i, b] += max(s - k, 1)
        else:
            alloc[i, rng.integers(H)] = s
    used = alloc.sum(axis=0)
    capacity = used + rng.choice([0, 0, 1, 2, 4, 9], H)
    current = np.zeros_like(alloc)
    for i in range(J):
        u = rng.random()
        if u < 0.4:
            current[i] = alloc[i]
        elif u < 0.7 and H > 0:
            current[i, rng.integers(H)] = max(int(alloc[i].sum()), 1)
    sync = (rng.random(J) < 0.7).astype(np.int64)
    order = rng.permutation(J).astype(np.int64)
    if J > 0 and rng.random() < 0.15:
        order = order[: int(rng.integers(0, J + 1))]
    round_s = float(rng.choice([360.0, 60.0, 1.0]))
    migration_s = float(rng.choice([0.0, 0.0, 30.0, 200.0, 400.0]))
    return alloc, current, rate, sync, order, capacity, round_s, migration_s


@needs_compiled
def test_upgrade_idle_twins_on_random_instances() -> None:
    moved = kept = 0
    for args, ref in twin_runs("upgrade_idle", upgrade_instance, assert_same_arrays, 20261206,
                               NUM_UPGRADE):
        alloc, capacity = args[0], args[5]
        # what any outcome keeps: every job its GPU count, no type over its capacity, a moved
        # job whole on one type
        assert np.array_equal(ref.sum(axis=1), alloc.sum(axis=1))
        assert (ref.sum(axis=0) <= capacity).all()
        changed = (ref != alloc).any(axis=1)
        assert ((ref[changed] > 0).sum(axis=1) == 1).all()
        moved += int(changed.sum())
        kept += int((~changed & (alloc.sum(axis=1) > 0)).sum())
    assert moved > 300 and kept > 3000  # both outcomes are exercised


@needs_compiled
def test_upgrade_idle_twins_take_any_layout_and_integer_dtype() -> None:
    rng = np.random.default_rng(7)
    args = next(a for a in (upgrade_instance(rng) for _ in range(100)) if a[0].shape[0] > 5)
    alloc, current, rate, sync, order, capacity, round_s, migration_s = args
    ref = reference.upgrade_idle(*args)
    got = compiled.upgrade_idle(np.asfortranarray(alloc.astype(np.int32)), current.T.copy().T,
                                rate, sync.astype(np.bool_), order.astype(np.int32),
                                capacity.astype(np.int16), round_s, migration_s)
    assert_same_arrays(ref, got)
    assert not np.shares_memory(got, alloc)  # a copy, the caller's plan untouched


@pytest.mark.parametrize("impl", IMPLS)
def test_upgrade_idle_by_hand(impl: Any) -> None:
    # Two types, fast (2 GPUs) and slow (4), rates per worker 2.0 and 1.0; one fast GPU idle.
    # A 1-GPU job on slow moves (2.0 against 1.0); a second one, behind it, finds no fast GPU
    # left and stays.
    rate = np.array([[2.0, 1.0], [2.0, 1.0], [2.0, 1.0]])
    alloc = np.array([[1, 0], [0, 1], [0, 1]])
    capacity = np.array([2, 4])
    sync = np.array([1, 1, 1])
    out = impl.upgrade_idle(alloc, alloc, rate, sync, np.array([0, 1, 2]), capacity, 360.0, 0.0)
    assert out.tolist() == [[1, 0], [1, 0], [0, 1]]
    # In the other order the third job gets it.
    out = impl.upgrade_idle(alloc, alloc, rate, sync, np.array([0, 2, 1]), capacity, 360.0, 0.0)
    assert out.tolist() == [[1, 0], [0, 1], [1, 0]]
    # A move that leaves less than half the round does not pay: 2.0 * 150 < 1.0 * 360.
    out = impl.upgrade_idle(alloc, alloc, rate, sync, np.array([0, 1, 2]), capacity, 360.0,
                            210.0)
    assert out.tolist() == alloc.tolist()
    # A job that has to move anyway (it held nothing) compares both after the move: it moves.
    out = impl.upgrade_idle(alloc, np.zeros_like(alloc), rate, sync, np.array([1]), capacity,
                            360.0, 210.0)
    assert out.tolist() == [[1, 0], [1, 0], [0, 1]]
    # No GPU idle: nothing moves, and a zero round is not divided by.
    full = np.array([1, 2])
    out = impl.upgrade_idle(alloc, alloc, rate, sync, np.array([0, 1, 2]), full, 0.0, 0.0)
    assert out.tolist() == alloc.tolist()
    with pytest.raises(ZeroDivisionError):
        impl.upgrade_idle(alloc, alloc, rate, sync, np.array([0, 1, 2]), capacity, 0.0, 0.0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("name", "value", "error"), [
    ("order", np.array([0, 3]), IndexError),          # (3 jobs: 0..2)
    ("order", np.array([-1]), IndexError),
    ("order", np.zeros((1, 1), dtype=np.int64), ValueError),
    ("current", np.zeros((3, 3), dtype=np.int64), ValueError),
    ("worker_rate", np.ones((2, 2)), ValueError),
    ("sync", np.ones(2, dtype=np.int64), ValueError),
    ("capacity", np.ones(3, dtype=np.int64), ValueError),
    ("alloc", np.array([[1, 0], [0, -1], [0, 1]]), ValueError),
    ("alloc", np.ones(3, dtype=np.int64), ValueError),
])
def test_upgrade_idle_refuses_arguments_out_of_range(impl: Any, name: str, value: Any,
                                                     error: type[Exception]) -> None:
    # (the compiled loop reads them unchecked: out of range, it would read past its arrays)
    case: dict[str, Any] = dict(
        alloc=np.array([[1, 0], [0, 1], [0, 1]]), current=np.zeros((3, 2), dtype=np.int64),
        worker_rate=np.array([[2.0, 1.0]] * 3), sync=np.ones(3, dtype=np.int64),
        order=np.array([0, 1, 2]), capacity=np.array([2, 4]), round_s=360.0, migration_s=0.0)
    case[name] = value
    with pytest.raises(error, match=name):
        impl.upgrade_idle(**case)
