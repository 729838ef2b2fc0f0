"""The workload generator (``hadar-slurm trace generate``), the illustrative a100/h100 table,
``NxG`` cluster specs and the robustness bench's bookkeeping."""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench import gen_dev_throughputs, report, robustness
from hadar_slurm.cli.main import main as cli_main
from hadar_slurm.errors import InputError
from hadar_slurm.rates.synthetic import sim_table, synthetic_rate, synthetic_table
from hadar_slurm.rates.table import default_table
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.generate import (
    WorkloadSpec,
    format_trace,
    generate,
    mean_gpu_rates,
    offered_load,
)
from hadar_slurm.sim.trace import parse_trace

TABLE = sim_table()
DGX = parse_counts("h100=2x8:a100=2x8:v100=4x4")
GAVEL = parse_counts("4:4:4")


def test_nxg_cluster_spec_builds_nodes_of_g_gpus() -> None:
    nodes = DGX.nodes
    assert [(n.gpu_type, n.gpus) for n in nodes] == [("h100", 8)] * 2 + [("a100", 8)] * 2 + [
        ("v100", 4)] * 4
    assert len({n.name for n in nodes}) == len(nodes)
    assert DGX.gpu_types == ("h100", "a100", "v100")
    assert (DGX.capacity("h100"), DGX.capacity("v100"), DGX.total_gpus) == (16, 16, 48)
    # plain counts are one GPU per node, as before
    assert [n.gpus for n in GAVEL.nodes] == [1] * 12
    for bad in ("h100=2x0", "h100=x8", "v100=3x", "h100=2x8x2"):
        with pytest.raises(InputError) as info:
            parse_counts(bad)
        assert info.value.field == "cluster" and "NxG" in info.value.problem


def test_synthetic_table_is_generated_and_ordered_by_generation() -> None:
    assert gen_dev_throughputs.SYNTHETIC_OUT.read_text() == gen_dev_throughputs.render_synthetic()
    syn, gavel = synthetic_table(), default_table()
    assert set(syn.gpu_types()) == {"a100", "h100"}
    assert set(syn.job_keys()) == set(gavel.job_keys())
    for job_type, sf in gavel.job_keys():
        v100 = gavel.rate(job_type, sf, "v100")
        a100, h100 = syn.rate(job_type, sf, "a100"), syn.rate(job_type, sf, "h100")
        assert (a100 == 0.0) == (v100 == 0.0) == (h100 == 0.0)
        assert v100 == 0.0 or v100 < a100 < h100
    # ResNet-50: a100 = 2.4 x v100, h100 = 1.9 x a100, rounded to 4 places
    assert synthetic_rate("ResNet-50 (batch size 64)", 10.0, "h100") == 45.6
    with pytest.raises(ValueError, match="no a100/h100 factor"):
        synthetic_rate("Mystery (batch size 1)", 1.0, "a100")


def test_same_spec_same_trace_and_another_seed_another() -> None:
    spec = WorkloadSpec(seed=11, jobs=40, arrivals="poisson", load=0.7, multi_gpu=0.3)
    first, again = generate(spec, DGX, TABLE), generate(spec, DGX, TABLE)
    assert format_trace(first) == format_trace(again)
    other = generate(WorkloadSpec(seed=12, jobs=40, arrivals="poisson", load=0.7,
                                  multi_gpu=0.3), DGX, TABLE)
    assert format_trace(other) != format_trace(first)


@pytest.mark.parametrize("arrivals", ["poisson", "bursty"])
@pytest.mark.parametrize("load", [0.2, 1.0, 1.5])
def test_offered_load_is_what_was_asked(arrivals: str, load: float) -> None:
    spec = WorkloadSpec(seed=3, jobs=80, arrivals=arrivals, load=load, multi_gpu=0.4,
                        lengths="pareto")
    jobs = generate(spec, DGX, TABLE)
    assert jobs[0].arrival_s == 0.0
    times = [j.arrival_s for j in jobs]
    assert times == sorted(times)
    # arrivals are rounded to 0.1 s, so the realized load is within a hair of the target
    assert offered_load(jobs, DGX, TABLE) == pytest.approx(load, rel=1e-3)


def test_bursts_share_arrivals_and_poisson_does_not() -> None:
    bursty = generate(WorkloadSpec(seed=5, jobs=100, arrivals="bursty", burst=8), DGX, TABLE)
    poisson = generate(WorkloadSpec(seed=5, jobs=100, arrivals="poisson"), DGX, TABLE)
    assert len({j.arrival_s for j in bursty}) < 40  # about 100 / 8 bursts
    assert len({j.arrival_s for j in poisson}) > 95


def test_static_jobs_all_arrive_at_zero_and_load_is_infinite() -> None:
    jobs = generate(WorkloadSpec(seed=1, jobs=20, arrivals="static"), GAVEL, TABLE)
    assert {j.arrival_s for j in jobs} == {0.0}
    assert math.isinf(offered_load(jobs, GAVEL, TABLE))


def test_gang_share_and_scales_that_fit_one_type() -> None:
    jobs = generate(WorkloadSpec(seed=2, jobs=400, multi_gpu=0.6), GAVEL, TABLE)
    scales = Counter(j.scale_factor for j in jobs)
    # 4 GPUs per type: an 8-GPU gang fits on no type, so only 2 and 4 are drawn
    assert set(scales) == {1, 2, 4}
    assert 0.5 < (scales[2] + scales[4]) / 400 < 0.7
    none = generate(WorkloadSpec(seed=2, jobs=100, multi_gpu=0.0), DGX, TABLE)
    assert {j.scale_factor for j in none} == {1}
    eights = generate(WorkloadSpec(seed=2, jobs=200, multi_gpu=1.0, scales=(8,)), DGX, TABLE)
    assert {j.scale_factor for j in eights} == {8}


def test_work_is_the_drawn_length_on_the_mean_gpu_and_heavy_tailed() -> None:
    jobs = generate(WorkloadSpec(seed=4, jobs=500, arrivals="static", lengths="gavel"),
                    DGX, TABLE)
    hours = np.array([j.total_steps / mean_gpu_rates(j.job_type, j.scale_factor, TABLE, DGX)
                      for j in jobs]) / 3600
    # Gavel's: 10**U(1.5, 3) minutes (0.53 h to 16.7 h) with probability 0.8, else
    # 10**U(3, 4) minutes (16.7 h to 167 h)
    assert hours.min() > 0.5 and hours.max() < 167
    long = (hours > 16.7).mean()
    assert 0.15 < long < 0.25
    assert np.sort(hours)[-100:].sum() > 0.5 * hours.sum()  # the long fifth has most work
    for lengths, cap in (("pareto", 100.0), ("lognormal", 100.0)):
        h = [j.total_steps / mean_gpu_rates(j.job_type, j.scale_factor, TABLE, DGX) / 3600
             for j in generate(WorkloadSpec(seed=4, jobs=300, lengths=lengths), DGX, TABLE)]
        assert max(h) <= cap + 1e-6 and np.median(h) < 2.0


def test_every_job_runs_somewhere_on_the_cluster() -> None:
    five = parse_counts("h100=1x8:a100=1x8:v100=2x4:p100=2x4:k80=2x4")
    jobs = generate(WorkloadSpec(seed=9, jobs=300, multi_gpu=0.6), five, TABLE)
    for j in jobs:
        fits = [g for g in five.gpu_types if TABLE.rate(j.job_type, j.scale_factor, g) > 0
                and five.capacity(g) >= j.scale_factor]
        assert fits, j


@pytest.mark.parametrize(("field", "kwargs"), [
    ("--jobs", {"jobs": 0}), ("--arrivals", {"arrivals": "uniform"}),
    ("--load", {"load": 0.0}), ("--multi-gpu", {"multi_gpu": 1.5}),
    ("--scales", {"scales": (1,)}), ("--lengths", {"lengths": "short"}),
    ("--burst", {"burst": 0.5}),
])
def test_bad_spec_names_the_option(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(InputError) as info:
        generate(WorkloadSpec(**kwargs), GAVEL, TABLE)  # type: ignore[arg-type]
    assert info.value.field == field and info.value.fix


def test_gangs_that_fit_nowhere_are_refused_clearly() -> None:
    with pytest.raises(InputError) as info:
        generate(WorkloadSpec(multi_gpu=0.5, scales=(8,)), GAVEL, TABLE)
    assert info.value.field == "--scales"


def test_cli_writes_a_trace_simulate_reads(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.trace"
    argv = ["trace", "generate", "--cluster", "h100=1x8:v100=2x4", "--jobs", "12", "--seed",
            "4", "--arrivals", "bursty", "--load", "1.2", "--multi-gpu", "0.5", "--out",
            str(out)]
    assert cli_main(argv) == 0
    text = out.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert "--seed 4 --jobs 12 --arrivals bursty --load 1.2" in header[0]
    assert "offered load 1.20" in header[1]
    cluster = parse_counts("h100=1x8:v100=2x4")
    jobs = parse_trace(text, str(out), TABLE)
    expected = generate(WorkloadSpec(seed=4, jobs=12, arrivals="bursty", load=1.2,
                                     multi_gpu=0.5), cluster, TABLE)
    assert [(j.job_type, j.scale_factor, j.total_steps, j.arrival_s) for j in jobs] == [
        (j.job_type, j.scale_factor, j.total_steps, j.arrival_s) for j in expected]
    # to stdout, and the same text
    capsys.readouterr()
    assert cli_main(argv[:-2]) == 0
    assert capsys.readouterr().out == text
    # and the simulator runs it on the same cluster
    assert cli_main(["simulate", "--trace", str(out), "--cluster", "h100=1x8:v100=2x4",
                     "--policy", "fifo-perf"]) == 0
    assert "12/12" in capsys.readouterr().out


def test_cli_bad_option_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["trace", "generate", "--cluster", "4:4:4", "--load", "lots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "load" in err[0] and "e.g. --load 0.8" in err[0]


def test_robustness_suite_spans_the_regimes() -> None:
    cases = robustness.suite()
    assert len(cases) >= 30 and len({c.name for c in cases}) == len(cases)
    assert len({c.spec.seed for c in cases}) == len(cases)
    specs = [c.spec for c in cases]
    assert {s.arrivals for s in specs} == {"static", "poisson", "bursty"}
    loads = {s.load for s in specs if s.arrivals != "static"}
    assert min(loads) <= 0.2 and max(loads) >= 1.5
    assert min(s.multi_gpu for s in specs) == 0.0 and max(s.multi_gpu for s in specs) >= 0.6
    assert {s.lengths for s in specs} == {"gavel", "pareto", "lognormal"}
    types = {g for c in cases for g in parse_counts(c.cluster).gpu_types}
    assert {"a100", "h100"} <= types
    sizes = {n.gpus for c in cases for n in parse_counts(c.cluster).nodes}
    assert {1, 4, 8} <= sizes
    counts = {len(parse_counts(c.cluster).gpu_types) for c in cases}
    assert min(counts) == 3 and max(counts) == 5
    # another seed base is another suite of the same regimes
    other = robustness.suite(seed_base=100)
    assert [c.name for c in other] == [c.name for c in cases]
    assert other[0].spec.seed == 100


def _row(trace: str, policy: str, jct: float, mk: float = 1.0, fork: float = 1.0) -> dict:
    return {"trace": trace, "regime": "r", "cluster": "c", "policy": policy,
            "avg_jct_s": jct, "makespan_over_gang_bound": mk, "makespan_over_fork_bound": fork,
            "completed": 3, "jobs": 3}


def test_ratios_and_missed_goals_on_plain_rows() -> None:
    rows = [_row("t", "hadar", 90.0, mk=1.04), _row("t", "hadare", 95.0, fork=1.2),
            _row("t", "gavel-las", 100.0), _row("t", "fifo-perf", 80.0), _row("t", "fifo", 120.0)]
    robustness.add_ratios(rows)
    by = {r["policy"]: r for r in rows}
    assert by["hadar"]["best_baseline_jct_s"] == 80.0
    assert by["hadar"]["jct_over_best_baseline"] == pytest.approx(1.125)
    assert by["hadare"]["jct_over_hadar"] == pytest.approx(95 / 90, abs=1e-4)
    missed = robustness.misses(rows)
    assert missed == ["t: hadar makespan 1.040x the gang bound",
                      "t: hadar avg JCT 1.125x the best baseline's",
                      "t: hadare makespan 1.200x the fork bound",
                      "t: hadare avg JCT 1.056x hadar's"]
    text = robustness.summary(rows)
    assert "1.040 / 1.040" in text and "1.125 / 1.125" in text


def test_robustness_bench_runs_a_small_suite_end_to_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert robustness.main(["--only", "gavel/static-1gpu", "dgx/poisson-0.5", "--jobs-scale",
                            "0.1", "--workers", "1", "--policies", "hadar,hadare,fifo",
                            "--json", str(out), "--plot", str(png)]) == 0
    rows = json.loads(out.read_text())
    assert {(r["trace"], r["policy"]) for r in rows} == {
        (t, p) for t in ("gavel/static-1gpu", "dgx/poisson-0.5")
        for p in ("hadar", "hadare", "fifo")}
    for r in rows:
        assert r["completed"] == r["jobs"] == (5 if "static" in r["trace"] else 10)
        # the bounds are lower bounds of every schedule that forks no job
        assert (r["gang_bound_s"] >= r["fork_bound_s"] >= r["fork_free_bound_s"]
                >= r["fork_any_bound_s"] > 0)
        if r["policy"] != "hadare":
            assert r["makespan_over_gang_bound"] >= 1.0 - 1e-6
        assert r["jct_over_best_baseline"] == pytest.approx(
            r["avg_jct_s"] / r["best_baseline_jct_s"], abs=1e-4)
        assert r["generate"].startswith("hadar-slurm trace generate --cluster ")
    assert png.stat().st_size > 0
    assert "worst / median" in capsys.readouterr().out


def test_robustness_default_outputs_never_overwrite_a_whole_run() -> None:
    stem = robustness.default_stem
    plain = {"free_moves": False, "reschedule": False, "pin_binding": True}
    # the committed results' names, each from the switches it was run with
    assert stem(0, whole=True, **plain) == "robustness"
    assert stem(100, whole=True, **plain) == "robustness_seed100"
    assert stem(0, whole=True, **{**plain, "reschedule": True}) == "robustness_reschedule"
    assert (stem(100, whole=True, **{**plain, "pin_binding": False})
            == "robustness_no_pin_binding_seed100")
    assert (stem(0, whole=True, **{**plain, "pin_binding": False, "reschedule": True})
            == "robustness_no_pin_binding_reschedule")
    # a partial run (some traces or policies, scaled jobs) gets a name of its own
    assert stem(0, whole=False, **plain) == "robustness-partial"
    assert stem(200, whole=False, **{**plain, "free_moves": True}) == (
        "robustness_free_moves_seed200-partial")


def test_robustness_partial_run_writes_beside_the_committed_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert robustness.main(["--only", "gavel/static-1gpu", "--jobs-scale", "0.1",
                            "--workers", "1", "--policies", "fifo", "--seed-base", "100"]) == 0
    written = sorted(p.name for p in (tmp_path / "bench" / "results").iterdir())
    assert written == ["robustness_seed100-partial.json", "robustness_seed100-partial.png"]
    assert "robustness_seed100-partial.json" in capsys.readouterr().out


def test_robustness_refuses_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        robustness.main(["--policies", "hadar,gavel"])
    err = capsys.readouterr().err
    assert "--policies: unknown gavel" in err and "gavel-las" in err


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_is_a_line_per_tenth_in_a_log_and_one_line_on_a_terminal() -> None:
    log = _Stream(tty=False)
    for k in range(1, 26):
        report.progress(k, 25, float(k), log)
    # 25 runs: a line where the tenths change (3, 5, 8, 10, 13, 15, 18, 20, 23, 25)
    assert log.getvalue().splitlines() == [f"{k}/25 runs ({k} s)"
                                           for k in (3, 5, 8, 10, 13, 15, 18, 20, 23, 25)]
    assert "\r" not in log.getvalue()
    term = _Stream(tty=True)
    for k in range(1, 4):
        report.progress(k, 3, 0.0, term)
    assert term.getvalue() == "\r1/3 runs (0 s)\r2/3 runs (0 s)\r3/3 runs (0 s)\n"


def _tiny_bound_inputs() -> tuple[robustness.BoundArgs, np.ndarray]:
    case = robustness.named(robustness.suite(0, jobs_scale=0.1), ["dgx/static-gangs"])[0]
    table = robustness.sim_throughputs(None)
    cluster = parse_counts(case.cluster)
    jobs = generate(case.spec, cluster, table)
    args = robustness.bound_inputs(jobs, cluster, table)
    return args, robustness.copy_room(args[2], cluster)


def test_trace_bounds_are_solved_once_and_then_read_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(robustness.CACHE_ENV, str(tmp_path))
    args, room = _tiny_bound_inputs()
    solved = robustness.trace_bounds(args, room, 4)
    fluid = robustness.fluid_makespan_bound(*args)
    assert solved == (max(fluid, robustness.gang_makespan_bound(*args)),
                      robustness.fork_makespan_bound(*args, copies=4, room=room),
                      robustness.fork_makespan_bound(*args, copies=4),
                      robustness.fork_makespan_bound(*args), fluid)
    assert len(list(tmp_path.glob("bounds-*.json"))) == 1

    def no_lp(*_a: object, **_k: object) -> float:
        raise AssertionError("solved again")

    monkeypatch.setattr(robustness, "fluid_makespan_bound", no_lp)
    monkeypatch.setattr(robustness, "fork_makespan_bound", no_lp)
    monkeypatch.setattr(robustness, "gang_makespan_bound", no_lp)
    assert robustness.trace_bounds(args, room, 4) == solved  # read back, exactly
    # other inputs, another copy limit: never answered from the cache
    with pytest.raises(AssertionError, match="solved again"):
        robustness.trace_bounds(args, room, 3)
    longer = (args[0], args[1] * 2.0, args[2], args[3], args[4])
    with pytest.raises(AssertionError, match="solved again"):
        robustness.trace_bounds(longer, room, 4)
    with pytest.raises(AssertionError, match="solved again"):  # asynchronous jobs
        robustness.trace_bounds(args, room, 4, np.zeros(args[1].shape[0], dtype=np.bool_))


def test_trace_bounds_solve_again_over_a_damaged_entry_and_without_a_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(robustness.CACHE_ENV, str(tmp_path))
    args, room = _tiny_bound_inputs()
    solved = robustness.trace_bounds(args, room, 4)
    (entry,) = tmp_path.glob("bounds-*.json")
    for damaged in ("{not json", '{"gang_bound_s": 1.0}', json.dumps(
            {"gang_bound_s": -1, "fork_bound_s": 1, "fork_free_bound_s": 1,
             "fork_any_bound_s": 1, "fluid_bound_s": 1})):
        entry.write_text(damaged)
        assert robustness.trace_bounds(args, room, 4) == solved
        assert json.loads(entry.read_text())["gang_bound_s"] == solved[0]  # rewritten
    monkeypatch.setenv(robustness.CACHE_ENV, "off")
    assert robustness.bounds_cache_dir() is None
    entry.unlink()
    assert robustness.trace_bounds(args, room, 4) == solved
    assert not list(tmp_path.glob("bounds-*"))
