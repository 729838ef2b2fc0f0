"""bench.stability: its perturbation and comparison on a captured snapshot, and a short run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.stability import gpus_by_type, main, offset_progress, probe
from hadar_slurm.policy.hadar import HadarPolicy
from tests.test_hadar_policy import sim_snapshot


def test_an_offset_moves_running_jobs_only_at_the_rate_of_their_gpus() -> None:
    snap = sim_snapshot("fidelity-hadar-sim-epoch3.json")
    held = snap.held()
    ahead = offset_progress(snap, 30.0)
    worker = snap.rate / snap.scale[:, None]
    step = (held * worker).sum(axis=1) * 30.0
    assert np.allclose(snap.remaining - ahead.remaining, step)
    assert (step[held.sum(axis=1) == 0] == 0).all()
    assert (step[held.sum(axis=1) > 0] > 0).all()
    # far behind or far ahead, remaining work stays positive
    assert (offset_progress(snap, 1e9).remaining > 0).all()
    assert np.allclose(offset_progress(snap, -30.0).remaining - snap.remaining, step)


def test_gpus_by_type_counts_a_decisions_gpus_per_job_and_type() -> None:
    snap = sim_snapshot("fidelity-hadar-sim-epoch3.json")
    decision = HadarPolicy().allocate(snap)
    got = gpus_by_type(snap, decision)
    assert set(got) == set(decision.placement.job.tolist())
    assert sum(sum(v) for v in got.values()) == int(decision.placement.count.sum())
    assert sum(sum(v) for v in got.values()) <= int(snap.node_gpus.sum())


def test_with_no_offset_no_decision_flips_and_fifo_never_does() -> None:
    # A policy is a pure function of its snapshot: the same snapshot decides the same.  FIFO
    # looks at arrival order only, so no progress offset changes its decisions either.
    rows = probe("hadar", seeds=1, draws=1, offsets=[0.0])
    assert rows[0]["decisions"] > 10
    assert rows[0]["flip_rate"] == 0.0
    assert probe("fifo", seeds=1, draws=2, offsets=[2.0])[0]["flip_rate"] == 0.0


def test_main_writes_rows_and_refuses_bad_offsets(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.json"
    assert main(["--policies", "hadar", "--seeds", "1", "--draws", "2", "--offsets", "2",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["policy"] for r in rows] == ["hadar"]
    assert 0.0 <= rows[0]["flip_rate"] <= 1.0
    assert rows[0]["decisions"] > 0
    assert "flip rate" in capsys.readouterr().out
    for bad in ("x", "-1", ""):
        with pytest.raises(SystemExit):
            main(["--offsets", bad, "--json", str(out)])
    assert "--offsets" in capsys.readouterr().err
