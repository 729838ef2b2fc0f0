"""bench.fidelity's figures, on plain data: the per-job spread between the simulated runs
(the floor under the live run's per-job figure) and the live/simulated comparison."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import bench.fidelity as fidelity
from bench.fidelity import Run, Settings, compare, main, median_run, reference_p90, seed_spread
from hadar_slurm.model import Job


def test_seed_spread_is_the_median_over_seeds_of_each_ones_p90_from_the_others() -> None:
    assert seed_spread([{1: 10.0, 2: 5.0}] * 3) == 0.0
    # one job, JCTs 10, 10, 20: seeds 0 and 1 are 1/3 from the others' median (15), seed 2 is
    # 100% from theirs (10); the median of (1/3, 1/3, 1) is 1/3
    assert seed_spread([{1: 10.0}, {1: 10.0}, {1: 20.0}]) == pytest.approx(0.3333, abs=1e-4)
    assert math.isnan(seed_spread([{1: 10.0}]))


def test_compare_gives_relative_differences_and_the_seed_floor() -> None:
    sim = Run("hadar", "sim", {1: 10.0, 2: 20.0}, {1: 10.0, 2: 20.0}, 0, 0,
              detail={"seed_p90_jct_diff": 0.25})
    live = Run("hadar", "live", {1: 11.0, 2: 20.0}, {1: 11.0, 2: 22.0}, 0, 0)
    out = compare(sim, live, 2)
    assert out["makespan_diff"] == pytest.approx(0.1)
    assert out["avg_jct_diff"] == pytest.approx(31 / 2 / 15 - 1, abs=1e-4)
    assert out["p90_jct_diff"] == pytest.approx(0.09, abs=1e-4)  # p90 of (0.1, 0)
    assert out["seed_p90_jct_diff"] == 0.25
    assert out["within_targets"] is False  # (the makespan is 10% over, the target 5%)


def test_keep_refuses_a_directory_with_an_earlier_runs_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--keep DIR`` over an earlier run's files would count that run's payload logs as this
    one's (every job "completed twice"): refused before anything starts, with the fix."""
    (tmp_path / "out-hadar").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["--keep", str(tmp_path), "--policies", "hadar"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--keep {tmp_path}: the directory is not empty" in err
    assert "give a new or empty directory" in err


def test_repeated_live_runs_count_by_their_medians() -> None:
    # Three live runs of two jobs; job 2 failed in the last one.  Per job, the median over the
    # runs it completed in all: job 1 only (10, 12, 20 -> 12).  The makespan is the median of
    # each run's (30, 22, 20 -> 22), the average JCT the median of each run's averages
    # ((10 + 30) / 2 = 20, (12 + 22) / 2 = 17, 20 -> 20); moves 2, 4, 9 -> 4.  Between runs
    # (job 1 only): 10 is 6/16 from the others' median 16, 12 is 3/15 from 15, 20 is 9/11 from
    # 11; the median of the three is 0.375.
    runs = [Run("hadar", "live", {1: 10.0, 2: 30.0}, {1: 10.0, 2: 30.0}, 2, 1),
            Run("hadar", "live", {1: 12.0, 2: 22.0}, {1: 12.0, 2: 22.0}, 4, 0),
            Run("hadar", "live", {1: 20.0}, {1: 20.0}, 9, 3, ["job 2 (Slurm 7): FAILED"])]
    out = median_run(runs)
    assert out.jct == {1: 12.0} and out.finish == {1: 12.0}
    assert out.makespan_s == 22.0 and out.avg_jct_s == 20.0
    assert (out.moves, out.preemptions) == (4, 1)
    assert out.problems == ["run 2: job 2 (Slurm 7): FAILED"]
    assert out.detail["makespan_range"] == [20.0, 30.0]
    assert out.detail["live_p90_jct_diff"] == 0.375
    sim = Run("hadar", "sim", {1: 12.0}, {1: 12.0}, 0, 0, detail={"seed_p90_jct_diff": 0.1})
    row = compare(sim, out, 2)
    assert row["p90_jct_diff"] == 0.0 and row["live_p90_jct_diff"] == out.detail[
        "live_p90_jct_diff"]
    assert median_run(runs[:1]) is runs[0]


def test_repeats_must_be_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--repeats", "0", "--sim-only"])
    assert exc.value.code == 2
    assert "--repeats 0: give at least 1 live run per policy" in capsys.readouterr().err


def test_the_floor_of_a_live_world_identical_to_the_simulator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Further simulated runs stand in for the live runs, in groups of as many as there were
    live runs, seeds from the last simulated one on.  Here run ``s`` ends job 1 at ``10 + s``
    and job 2 at 20.  Two live runs, two groups: seeds 3 and 4 (job 1's median 13.5, 35% from
    the simulated 10; job 2 0%: p90 of (0.35, 0) = 0.315), then 5 and 6 (15.5: p90 0.495);
    the median of the two is 0.405, the largest 0.495."""
    monkeypatch.setattr(fidelity, "sim_seed",
                        lambda jobs, policy, st, seed: (None, {1: 10.0 + seed, 2: 20.0}))
    jobs = [Job(job_id=k, job_type="A3C", scale_factor=1, total_steps=1.0, arrival_s=0.0)
            for k in (1, 2)]
    sim = Run("hadar", "sim", {1: 10.0, 2: 20.0}, {1: 10.0, 2: 20.0}, 0, 0,
              detail={"seeds": 3, "seed_p90_jct_diff": 0.1})
    st = Settings(compression=1.0, epoch_s=12.0, restart_s=1.0)
    out = reference_p90(jobs, "hadar", st, sim, live_runs=2, groups=2)
    assert out == {"ideal_p90_jct_diff": 0.405, "ideal_p90_jct_diff_max": 0.495,
                   "ideal_live_runs": 2}
    live = Run("hadar", "live", {1: 10.0, 2: 20.0}, {1: 10.0, 2: 20.0}, 0, 0)
    row = compare(sim, live, 2, out)
    assert row["ideal_p90_jct_diff"] == 0.405 and row["p90_jct_diff"] == 0.0
    with pytest.raises(ValueError, match="live_runs"):
        reference_p90(jobs, "hadar", st, sim, live_runs=0)


def test_kept_runs_are_simulated_with_the_poll_they_ran_with(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The simulated runs see finishes up to one ``finish_poll_s`` late, as the live sidecar
    did: ``--from-dir`` over runs whose sidecar polled otherwise is refused, naming the value
    to give, before anything is simulated."""
    run0 = tmp_path / "run0"
    run0.mkdir()
    (run0 / "slurm-ids-hadar.json").write_text("{}")
    (run0 / "sidecar-hadar.toml").write_text("[scheduler]\npolicy = \"hadar\"\n"
                                             "finish_poll_s = 1.0\n")
    assert fidelity.kept_dirs(tmp_path, "hadar") == [run0]
    assert fidelity.kept_dirs(tmp_path, "fifo") == [tmp_path]  # (none of its own: the dir)
    assert fidelity.kept_poll(run0, "hadar") == 1.0
    assert fidelity.kept_poll(run0, "fifo") is None
    with pytest.raises(SystemExit) as exc:
        main(["--from-dir", str(tmp_path), "--policies", "hadar", "--pad-s", "4.5",
              "--restart-s", "4.9"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"the hadar run in {run0} polled every 1 s (sidecar-hadar.toml), not 0.1 s" in err
    assert "give --finish-poll-s 1" in err


def test_forks_at_once_is_a_what_if_of_the_simulator(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--forks-at-once`` drops the simulated forks' wait for Slurm's backfill cycles (the
    first fork's extra start stays); it has no live counterpart, so it needs ``--sim-only``."""
    seen: list[dict[str, object]] = []

    def fake_simulate(*args: object, **kwargs: object) -> None:
        seen.append(kwargs)

    monkeypatch.setattr(fidelity, "simulate", fake_simulate)
    jobs: list[Job] = []
    for stagger in (True, False):
        st = Settings(compression=60.0, epoch_s=12.0, restart_s=4.9, fork_stagger=stagger)
        fidelity.simulate_live(jobs, fidelity.make_policy("hadare"), st, seed=0)
    assert [k["fork_interval_s"] for k in seen] == [60.0, 0.0]
    assert seen[0]["fork_start_s"] == seen[1]["fork_start_s"]
    assert float(seen[0]["fork_start_s"]) > 0  # type: ignore[arg-type]
    assert all(k["final_run"] is True for k in seen)  # (a forked job's last run is placed)
    assert [k["wake_delay_s"] for k in seen] == [pytest.approx(6.0)] * 2  # 0.1 s at 60x
    with pytest.raises(SystemExit) as exc:
        main(["--forks-at-once", "--policies", "hadare"])
    assert exc.value.code == 2
    assert "--forks-at-once is a what-if of the simulator" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--sim-only", "--finish-poll-s", "0"])
    assert "--finish-poll-s 0: give a poll interval above 0 s" in capsys.readouterr().err
