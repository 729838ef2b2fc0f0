"""``bench.packed``: ours with and without sharing next to Gavel's packed figures, with the
means over perturbed draws (``--draws``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench.packed import main, ours_goals, run
from hadar_slurm.sim.run import SimResult, spread_over_draws


def test_spread_over_draws_takes_mean_lowest_and_highest() -> None:
    runs = [cast(SimResult, SimpleNamespace(makespan_s=m, avg_jct_s=j))
            for m, j in ((100.0, 10.0), (130.0, 4.0), (160.0, 7.0))]
    assert spread_over_draws(runs) == {
        "runs": 3, "makespan_s_mean": 130.0, "makespan_s_min": 100.0,
        "makespan_s_max": 160.0, "avg_jct_s_mean": 7.0, "avg_jct_s_min": 4.0,
        "avg_jct_s_max": 10.0}


def test_draws_add_the_figures_over_the_trace_and_its_perturbed_lengths() -> None:
    rows = run(["static_32_seed0"], "4:4:4", draws=1)
    assert [r["run"] for r in rows][:1] == ["gavel-las-packed"] and len(rows) == 7
    for r in rows:
        o = r["over_draws"]
        assert o["runs"] == 2
        # the trace as generated is one of the two runs
        assert o["makespan_s_min"] <= r["makespan_s"] <= o["makespan_s_max"]
        assert o["avg_jct_s_min"] <= r["avg_jct_s"] <= o["avg_jct_s_max"]
        assert o["makespan_s_min"] <= o["makespan_s_mean"] <= o["makespan_s_max"]
    # Hadar with sharing: the draw's lengths differ by at most 1e-4 but its run parts from
    # the trace's (the trace as generated 26,972 s; draw 1 27,104 s, 2026-12-07)
    hadar = next(r for r in rows if r["run"] == "hadar")["over_draws"]
    assert hadar["makespan_s_max"] > hadar["makespan_s_min"]
    assert run(["static_32_seed0"], "4:4:4")[0].get("over_draws") is None


def test_main_refuses_negative_draws(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--draws", "-1"])
    assert "--draws -1" in capsys.readouterr().err


def test_ours_goals_judge_the_trace_and_the_mean_of_its_draws() -> None:
    gavel = [100.0, 50.0]
    rows: list[dict[str, Any]] = [
        {"trace": "t", "run": "hadar", "gavel_packed": gavel, "makespan_s": 99.0,
         "avg_jct_s": 51.0, "over_draws": {"runs": 3, "makespan_s_mean": 99.5,
                                            "avg_jct_s_mean": 49.0}},
        {"trace": "t", "run": "hadare", "gavel_packed": gavel, "makespan_s": 100.0,
         "avg_jct_s": 50.0},
        {"trace": "t", "run": "hadar (share=False)", "gavel_packed": gavel,
         "makespan_s": 1.0, "avg_jct_s": 1.0},
        {"trace": "u", "run": "hadar", "gavel_packed": None, "makespan_s": 1.0,
         "avg_jct_s": 1.0},
    ]
    assert ours_goals(rows) == [
        "goal t: hadar shared no worse than Gavel's packed: as generated: NOT met (JCT) "
        "(0.990 / 1.020); mean of 3: met (0.995 / 0.980)",
        "goal t: hadare shared no worse than Gavel's packed: as generated: met "
        "(1.000 / 1.000)",
    ]
