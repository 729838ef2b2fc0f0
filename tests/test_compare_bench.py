"""``bench.compare``: two runs of the regime suite compared on issue #15's goals, on rows small
enough to work out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.compare import compare, main, rejudged


def row(trace: str, policy: str, makespan: float, jct: float, **ratios: float) -> dict[str, Any]:
    return {"trace": trace, "policy": policy, "makespan_s": makespan, "avg_jct_s": jct,
            "p95_jct_s": 2 * jct, "jobs": 10, "completed": 10, **ratios}


def before_rows() -> list[dict[str, Any]]:
    # Trace a: the gang bound is 1,000 s, the best baseline's JCT 500 s (fifo-perf; gavel-las
    # 600 s).  Hadar ends at 1,020 s (1.02x: met) with a JCT of 520 s (1.04x: missed); HadarE
    # at 1,200 s (1.2x the fork bound of 1,000 s: missed) with 400 s (0.769x Hadar's: met).
    # Trace b: Hadar 1.05x the bound (missed), JCT 450 s against 500 s (met).
    return [
        row("a", "hadar", 1020.0, 520.0, makespan_over_gang_bound=1.02),
        row("a", "hadare", 1200.0, 400.0, makespan_over_fork_bound=1.2),
        row("a", "gavel-las", 1500.0, 600.0, makespan_over_gang_bound=1.5),
        row("a", "fifo-perf", 1400.0, 500.0, makespan_over_gang_bound=1.4),
        row("b", "hadar", 2100.0, 450.0, makespan_over_gang_bound=1.05),
        row("b", "fifo", 3000.0, 500.0, makespan_over_gang_bound=1.5),
    ]


def test_rejudged_takes_the_baselines_from_before_where_after_has_none() -> None:
    # A run of hadar and hadare only: trace a's best baseline stays fifo-perf's 500 s, and
    # HadarE's JCT is judged against the new Hadar run's 490 s.
    after = [row("a", "hadar", 1010.0, 490.0, makespan_over_gang_bound=1.01),
             row("a", "hadare", 1050.0, 500.0, makespan_over_fork_bound=1.05)]
    got = {r["policy"]: r for r in rejudged(after, before_rows())}
    assert got["hadar"]["best_baseline_jct_s"] == 500.0
    assert got["hadar"]["jct_over_best_baseline"] == pytest.approx(0.98)
    assert got["hadare"]["jct_over_hadar"] == pytest.approx(round(500 / 490, 4))


def test_compare_counts_goals_met_and_new_and_the_geometric_means() -> None:
    # After: trace a's Hadar JCT 490 s (0.98x: met now) but its makespan 1,040 s (1.04x: a new
    # miss); HadarE 1,050 s (1.05x: met now), JCT 500 s over Hadar's 490 s (1.0204x: new);
    # trace b unchanged.  Misses: before a/hadar JCT, a/hadare makespan, b/hadar makespan (3);
    # after a/hadar makespan, a/hadare JCT, b/hadar makespan (3).
    after = [row("a", "hadar", 1040.0, 490.0, makespan_over_gang_bound=1.04),
             row("a", "hadare", 1050.0, 500.0, makespan_over_fork_bound=1.05),
             row("b", "hadar", 2100.0, 450.0, makespan_over_gang_bound=1.05)]
    got = compare(before_rows(), after)
    assert got["compared"] == 3
    assert len(got["missed_before"]) == 3 and len(got["missed_after"]) == 3
    assert sorted(m[:3] for m in got["new_misses"]) == [
        ["a", "hadar", "makespan_over_gang_bound"], ["a", "hadare", "jct_over_hadar"]]
    assert sorted(m[:3] for m in got["met_now"]) == [
        ["a", "hadar", "jct_over_best_baseline"], ["a", "hadare", "makespan_over_fork_bound"]]
    # Hadar's makespans after over before: 1040/1020 and 1; JCTs 490/520 and 1.
    assert got["geo_means"]["hadar"]["makespan"] == pytest.approx(
        round((1040 / 1020) ** 0.5, 4))
    assert got["geo_means"]["hadar"]["avg_jct"] == pytest.approx(round((490 / 520) ** 0.5, 4))
    assert got["geo_means"]["hadare"]["avg_jct"] == pytest.approx(1.25)
    # Trace b did not move: only trace a's two rows are listed.
    assert [(r["trace"], r["policy"]) for r in got["changed"]] == [("a", "hadar"),
                                                                     ("a", "hadare")]


def test_a_run_that_leaves_jobs_is_a_miss() -> None:
    after = [dict(row("b", "hadar", 2100.0, 450.0, makespan_over_gang_bound=1.05),
                  completed=9)]
    got = compare(before_rows(), after)
    assert ["b", "hadar", "completed", 1.0] in got["new_misses"]


def test_main_refuses_a_file_that_is_not_robustness_rows(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(before_rows()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match=r"not a list of bench\.robustness rows"):
        main([str(good), str(bad)])


def test_main_says_when_the_runs_share_no_trace(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps(before_rows()))
    other = tmp_path / "other.json"
    other.write_text(json.dumps([row("z", "hadar", 1.0, 1.0, makespan_over_gang_bound=1.0)]))
    assert main([str(one), str(other)]) == 2
    assert "same --seed-base" in capsys.readouterr().err


def test_main_prints_and_writes_the_comparison(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps(before_rows()))
    out = tmp_path / "cmp.json"
    assert main([str(one), str(one), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "goals missed: 3 before, 3 after" in text
    assert json.loads(out.read_text())[0]["changed"] == []
