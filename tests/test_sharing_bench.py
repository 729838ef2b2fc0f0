"""bench.sharing's figures on plain rows, and one trace run through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sharing import main, ratios, summary


def row(trace: str, share: bool, makespan: float, jct: float, useful: float) -> dict[str, object]:
    return {"trace": trace, "regime": trace.split("/")[1], "cluster": trace.split("/")[0],
            "policy": "hadar", "share": share, "makespan_s": makespan, "avg_jct_s": jct,
            "p95_jct_s": jct, "utilization": 0.5, "useful_utilization": useful,
            "pair_rounds": 3 if share else 0}


def test_ratios_and_misses() -> None:
    rows = [row("a/static", False, 100.0, 50.0, 0.8), row("a/static", True, 99.0, 45.0, 0.81),
            row("b/poisson", False, 100.0, 50.0, 0.8), row("b/poisson", True, 101.0, 50.5, 0.79)]
    out = {r["trace"]: r for r in ratios(rows)}
    assert out["a/static"]["avg_jct_ratio"] == 0.9 and not out["a/static"]["miss"]
    assert out["b/poisson"]["avg_jct_ratio"] == 1.01 and out["b/poisson"]["miss"]
    text = summary(list(out.values()))
    assert "misses: 1 of 2: b/poisson (JCT 1.010, useful util 0.988)" in text


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
