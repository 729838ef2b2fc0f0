"""bench.sharing's figures on plain rows, and one trace run through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sharing import main, over_draws, ratios, summary


def row(trace: str, share: bool, makespan: float, jct: float, useful: float,
        draw: int = 0) -> dict[str, object]:
    return {"trace": trace, "regime": trace.split("/")[1], "cluster": trace.split("/")[0],
            "policy": "hadar", "share": share, "draw": draw, "makespan_s": makespan,
            "avg_jct_s": jct, "p95_jct_s": jct, "utilization": 0.5, "useful_utilization": useful,
            "pair_rounds": 3 if share else 0}


def test_ratios_and_misses() -> None:
    rows = [row("a/static", False, 100.0, 50.0, 0.8), row("a/static", True, 99.0, 45.0, 0.81),
            row("b/poisson", False, 100.0, 50.0, 0.8), row("b/poisson", True, 101.0, 50.5, 0.79)]
    out = {r["trace"]: r for r in ratios(rows)}
    assert out["a/static"]["avg_jct_ratio"] == 0.9 and not out["a/static"]["miss"]
    assert out["b/poisson"]["avg_jct_ratio"] == 1.01 and out["b/poisson"]["miss"]
    text = summary(list(out.values()))
    assert "misses: 1 of 2: b/poisson (JCT 1.010, useful util 0.988)" in text


def test_draws_tell_a_mean_miss_from_a_chance_one() -> None:
    # a/static: sharing worse in draw 1 only (JCT 1.04, then 0.90 and 0.95): geometric mean
    # (0.90 * 1.04 * 0.95) ** (1/3) = 0.9616, no mean miss.  b/poisson: worse in draws 0 and 2
    # (1.02, 0.99, 1.03): mean 1.0132, a mean miss.
    rows = []
    for trace, jcts in (("a/static", (0.90, 1.04, 0.95)), ("b/poisson", (1.02, 0.99, 1.03))):
        for draw, jct in enumerate(jcts):
            rows += [row(trace, False, 100.0, 100.0, 0.8, draw),
                     row(trace, True, 100.0, 100.0 * jct, 0.8, draw)]
    out = ratios(rows)
    assert len(out) == 6
    means = {m["trace"]: m for m in over_draws(out)}
    a, b = means["a/static"], means["b/poisson"]
    assert (a["draws"], a["draws_missed"], a["mean_miss"]) == (3, 1, False)
    assert a["avg_jct_ratio_mean"] == pytest.approx(0.9616, abs=1e-4)
    assert (a["avg_jct_ratio_min"], a["avg_jct_ratio_max"]) == (0.9, 1.04)
    assert (b["draws_missed"], b["mean_miss"]) == (2, True)
    assert b["avg_jct_ratio_mean"] == pytest.approx(1.0132, abs=1e-4)
    text = summary(out)
    # the per-regime table and its misses are the unperturbed draw's
    assert "misses: 1 of 2: b/poisson (JCT 1.020, useful util 1.000)" in text
    assert "hadar: 2 traces, JCT geo-mean 0.987; mean misses 1, missed in some draws only 1" in text
    assert "b/poisson              JCT 1.013 [0.990, 1.030]" in text and "MEAN MISS" in text


def test_one_trace_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.json"
    assert main(["--only", "gavel/static-1gpu", "--policies", "hadar", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    runs = [r for r in rows if "ratio" not in r]
    assert {r["share"] for r in runs} == {False, True} and all(
        r["completed"] == r["jobs"] for r in runs)
    assert "hadar:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--only", "nowhere/none"])
    with pytest.raises(SystemExit):
        main(["--only", "gavel/static-1gpu", "--draws", "-1"])


def test_a_draw_perturbs_the_lengths_of_both_runs(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert main(["--only", "gavel/poisson-0.2", "--policies", "hadar", "--draws", "1",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    runs = {(r["share"], r["draw"]): r for r in rows if "ratio" not in r and "over_draws" not in r}
    assert set(runs) == {(False, 0), (True, 0), (False, 1), (True, 1)}
    # the perturbed lengths change what the runs do (one job's length by up to 1e-4 of it)
    assert runs[False, 0]["avg_jct_s"] != runs[False, 1]["avg_jct_s"]
    [mean] = [r for r in rows if r.get("over_draws")]
    assert mean["draws"] == 2 and mean["trace"] == "gavel/poisson-0.2"
