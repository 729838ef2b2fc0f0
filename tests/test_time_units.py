"""The same cluster in other time units gets the same decision (issue #14).

The sidecar runs a compressed world in Unix time (rates 60x, epochs of 12 s, ``now`` near
1.8e9); the simulator runs the same world in seconds from 0.  Hadar and HadarE must decide the
same on both, or the simulator does not predict the sidecar: before the type split's relative
tolerances (``reference._coarse``, ``_extremes``, ``_REL``), the window computed without going
through ``now`` and the critical order's ``coarse`` keys, Hadar decided otherwise on 14 of a live
run's 50 snapshots and HadarE on 12, from rounding alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from bench.fidelity import TRACE, dev_cluster_spec, dev_table, load_trace
from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.core import reference
from hadar_slurm.policy import make_policy
from hadar_slurm.policy.base import Decision, Policy, Snapshot
from hadar_slurm.policy.hadare import HadarEPolicy
from hadar_slurm.sim.run import simulate
from tests.test_core_twins import IMPLS

C = 60.0  # compression: the live world runs 60x faster
UNIX = 1.8e9  # where the live world's clock stands


def compressed(s: Snapshot, state: object) -> Snapshot:
    """``s`` as the sidecar would see it: rates 60x, times / 60 from a Unix epoch."""
    return dataclasses.replace(
        s, rate=s.rate * C, round_s=s.round_s / C, migration_s=s.migration_s / C,
        now=UNIX + s.now / C, arrival=UNIX + s.arrival / C, attained=s.attained / C,
        policy_state=state)


class Twin:
    """Runs ``policy`` on each snapshot and ``other`` on it compressed; records the epochs
    where their placements differ.  ``other`` gets the state it returned where ``policy``'s
    snapshot carries the state ``policy`` returned with it (the epoch loop keeps a decision's
    state only when it adopts the decision)."""

    def __init__(self, policy: Policy, other: Policy) -> None:
        self.policy = policy
        self.other = other
        self.name = policy.name
        self.states: dict[int, tuple[object, object]] = {}
        self.epochs = 0
        self.differ: list[int] = []

    def allocate(self, snapshot: Snapshot) -> Decision:
        decision = self.policy.allocate(snapshot)
        mine = snapshot.policy_state
        state = self.states[id(mine)][1] if mine is not None else None
        live = self.other.allocate(compressed(snapshot, state))
        self.states[id(decision.policy_state)] = (decision.policy_state, live.policy_state)
        self.epochs += 1
        if decision.placement.by_job_copies() != live.placement.by_job_copies():
            self.differ.append(snapshot.epoch)
        return decision

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


@pytest.mark.parametrize("name", ["hadar", "hadare"])
def test_the_compressed_world_in_unix_time_gets_the_same_decisions(name: str) -> None:
    # The fidelity bench's trace (26 jobs of 1, 2 and 4 GPUs, arrivals) on its dev cluster,
    # 720 s epochs that end early when a job finishes, the bench's move and start costs.
    if name == "hadar":
        twin = Twin(make_policy("hadar"), make_policy("hadar"))
    else:
        base = ConsolidationCost()
        fast = ConsolidationCost(base.base_s / C, base.s_per_gb / C)
        twin = Twin(HadarEPolicy(max_copies=2), HadarEPolicy(max_copies=2, consolidation=fast))
    res = simulate(load_trace(TRACE), dev_cluster_spec(), dev_table(), twin, round_s=720.0,
                   reschedule_on_finish=True, migration_cost_s=438.6, start_cost_s=316.8,
                   even_gangs=True)
    assert np.isfinite(res.finish).all()
    assert twin.epochs >= 30
    assert twin.differ == []


@pytest.mark.parametrize("impl", IMPLS)
def test_jobs_equal_but_for_rounding_move_in_index_order(impl: Any) -> None:
    # Two jobs of one model on two types of 1 GPU each, equal prices: both start on type 0
    # (30 GPU-s there, 60 on type 1).  Type 0 holds 60 s, type 1 none: levelling moves work of
    # one job, the one with the least gpu_s[1] / gpu_s[0], d = 60 / (30 + 60) = 2/3 of it, which
    # leaves 30 / 3 + 30 = 40 s on type 0 and 2/3 * 60 = 40 s on type 1.  Job 1's 30 s carry a
    # rounding error (3e-14): its quotient, 60 / (30 + 3e-14), is smaller by 1e-15, yet the two
    # tie and the first job (index order) moves, whichever of them carries the error.
    for rows in ([[30.0, 60.0], [30.0 + 3e-14, 60.0]], [[30.0 + 3e-14, 60.0], [30.0, 60.0]]):
        phi = impl.balance_split(np.array(rows), np.array([1, 1]), np.array([1.0, 1.0]),
                                 np.array([1, 1]), 1e6, 100)
        assert phi[0].tolist() == pytest.approx([1 / 3, 2 / 3], rel=1e-12)
        assert phi[1].tolist() == [1.0, 0.0]


def test_coarse_ties_values_equal_but_for_rounding() -> None:
    x = np.array([2.0, 2.0 * (1 + 1e-15), -5.5, 0.0, np.inf, 3.0 * (1 + 1e-6)])
    out = reference.coarse(x)
    assert out[0] == out[1] == 2.0
    assert out[2] == -5.5 and out[3] == 0.0 and out[4] == np.inf
    assert out[5] != 3.0  # a real difference (1e-6) stays one
    assert reference._coarse(2.0 * (1 + 1e-15)) == 2.0
