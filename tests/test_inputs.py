"""Parsers of user input: traces, throughput tables, cluster specs, policy names.

Every bad input must raise :class:`InputError` naming the source, the line where there is one,
and the field, so that the one-line message tells a person what to fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.model import ClusterSpec
from hadar_slurm.policy import make_policy
from hadar_slurm.rates.table import (
    ThroughputTable,
    default_table,
    load_table,
    parse_csv,
    parse_gavel_json,
)
from hadar_slurm.sim.cluster import load_cluster, load_cluster_file, parse_counts
from hadar_slurm.sim.trace import (
    BUNDLED_TRACES,
    check_runnable,
    job_line_numbers,
    load_trace,
    parse_trace,
)
from tests.helpers import TOY_CSV, make_job, trace_line, trace_text

WriteTrace = Callable[[Sequence[str]], Path]


# -- InputError ------------------------------------------------------------------------------


def test_input_error_one_line_names_source_line_field_and_fix() -> None:
    err = InputError("bad", source="a.trace", line=3, field="total_steps", fix="make it > 0")
    assert err.one_line() == "a.trace:3: field 'total_steps': bad (make it > 0)"
    assert str(err) == err.one_line()
    assert InputError("bad").one_line() == "bad"
    assert InputError("bad", source="x.csv").one_line() == "x.csv: bad"


# -- traces ----------------------------------------------------------------------------------


def test_trace_parses_fields_and_skips_comments(toy_table: ThroughputTable) -> None:
    text = trace_text([
        "# a comment",
        "",
        trace_line("toy", 720, 0, weight=2, slo=3600),
        trace_line("toy2", 100, 50, scale=2),
    ])
    jobs = parse_trace(text, "t.trace", toy_table)
    assert [j.job_id for j in jobs] == [0, 1]
    assert (jobs[0].job_type, jobs[0].total_steps, jobs[0].arrival_s) == ("toy", 720, 0)
    assert jobs[0].weight == 2 and jobs[0].slo_s == 3600
    assert jobs[1].scale_factor == 2 and jobs[1].slo_s is None
    assert job_line_numbers(text) == [3, 4]


@pytest.mark.parametrize(
    ("bad_line", "field", "problem"),
    [
        ("toy\tonly\tthree", None, "expected 10 TAB-separated fields, got 3"),
        (trace_line("toy", -5, 10), "total_steps", "work must be positive, got '-5'"),
        (trace_line("toy", 0, 10), "total_steps", "work must be positive"),
        (trace_line("toy", 720, 10).replace("\t720\t", "\tlots\t"), "total_steps",
         "expected a number, got 'lots'"),
        (trace_line("toy", 720, 10).replace("\t1\t1\t", "\t1.5\t1\t"), "scale_factor",
         "expected an integer, got '1.5'"),
        (trace_line("toy", 720, 10, scale=0), "scale_factor", "scale factor must be >= 1"),
        (trace_line("toy", 720, 10, weight=0), "priority_weight", "must be > 0"),
        (trace_line("toy", 720, -1), "arrival_time", "arrival time must be >= 0"),
        (trace_line("toy", 720, 5), "arrival_time",
         "arrival time 5 goes backwards (previous job arrived at 10)"),
        (trace_line("nope", 720, 10), "job_type", "unknown job type 'nope' on 1 GPU(s)"),
        (trace_line("toy", 720, 10, scale=4), "job_type", "unknown job type 'toy' on 4 GPU(s)"),
    ],
)
def test_trace_errors_name_line_and_field(
    toy_table: ThroughputTable, bad_line: str, field: str | None, problem: str
) -> None:
    # Line 1 is a comment and line 2 a good job, so the bad one is line 3.
    text = trace_text(["# jobs", trace_line("toy", 720, 10), bad_line])
    with pytest.raises(InputError) as info:
        parse_trace(text, "jobs.trace", toy_table)
    err = info.value
    assert err.source == "jobs.trace"
    assert err.line == 3
    assert err.field == field
    assert problem in err.problem
    assert err.one_line().startswith(f"jobs.trace:3: {f'field {field!r}: ' if field else ''}")


def test_trace_without_table_does_not_check_job_types() -> None:
    jobs = parse_trace(trace_line("anything", 10, 0) + "\n", "t")
    assert jobs[0].job_type == "anything"


def test_empty_trace_is_an_error(toy_table: ThroughputTable) -> None:
    with pytest.raises(InputError, match="no jobs"):
        parse_trace("# nothing\n\n", "empty.trace", toy_table)


def test_trace_file_and_bundled_names(write_trace: WriteTrace, toy_table: ThroughputTable) -> None:
    path = write_trace([trace_line("toy", 720, 0)])
    assert len(load_trace(path, toy_table)) == 1
    sizes = {name: len(load_trace(name, default_table())) for name in BUNDLED_TRACES}
    assert sizes == {"static_32_seed0": 32, "static_48_multigpu_seed1": 48,
                     "poisson_200_lam900_seed0": 200}
    with pytest.raises(InputError, match="cannot read trace") as info:
        load_trace(path.parent / "missing.trace")
    assert info.value.source == str(path.parent / "missing.trace")


def test_check_runnable_accepts_jobs_some_gpu_type_can_run(toy_table: ThroughputTable) -> None:
    jobs = [make_job(0, 10, 0), make_job(1, 10, 0, "toy2", scale=2)]
    check_runnable(jobs, toy_table, parse_counts("v100=2"), source="t", lines=[1, 2])
    # "toy" runs on k80 alone.
    check_runnable(jobs[:1], toy_table, parse_counts("k80=1"), source="t")


def test_check_runnable_names_line_job_type_and_cluster_types(
    toy_table: ThroughputTable,
) -> None:
    jobs = [make_job(0, 10, 0), make_job(1, 10, 0, "v100only")]
    with pytest.raises(InputError) as info:
        check_runnable(jobs, toy_table, parse_counts("k80=2:p100=1"), source="jobs.trace",
                       lines=[4, 7])
    err = info.value
    assert (err.source, err.line, err.field) == ("jobs.trace", 7, "job_type")
    assert "'v100only'" in err.problem
    assert "(2 k80, 1 p100)" in err.problem
    assert "it has rates for v100" in err.problem


def test_check_runnable_rejects_job_larger_than_usable_gpus(toy_table: ThroughputTable) -> None:
    jobs = [make_job(0, 10, 0, "toy2", scale=2)]
    with pytest.raises(InputError) as info:
        check_runnable(jobs, toy_table, parse_counts("v100=1:k80=4"), source="t", lines=[1])
    assert info.value.field == "scale_factor"
    assert "needs 2 GPUs but the cluster has only 1" in info.value.problem


# -- throughput tables -----------------------------------------------------------------------


def test_csv_table(toy_table: ThroughputTable) -> None:
    assert toy_table.rate("toy", 1, "v100") == 1.0
    assert toy_table.rate("toy", 1, "k80") == 0.5
    assert toy_table.rate("toy2", 2, "v100") == 2.0
    assert toy_table.rate("toy", 1, "p100") == 0.0  # not measured: cannot run there
    assert toy_table.rate("toy", 2, "v100") == 0.0
    assert set(toy_table.gpu_types()) == {"v100", "k80"}
    upper = parse_csv("job_type,scale_factor,gpu_type,steps_per_second\nm,1, A100 ,3\n", "x")
    assert upper.rate("m", 1, "a100") == 3.0


def test_csv_quoted_job_type_with_comma() -> None:
    text = 'job_type,scale_factor,gpu_type,steps_per_second\n"LM (a, b)",1,v100,2.5\n'
    assert parse_csv(text, "x").rate("LM (a, b)", 1, "v100") == 2.5


@pytest.mark.parametrize(
    ("text", "line", "field", "problem"),
    [
        ("", None, None, "empty throughput file"),
        ("model,sf,gpu,rate\nm,1,v100,1\n", 1, None, "header is"),
        ("# c\njob_type,scale_factor,gpu_type,steps_per_second\nm,1,v100\n", 3, None,
         "expected 4 comma-separated fields, got 3"),
        ("job_type,scale_factor,gpu_type,steps_per_second\nm,0,v100,1\n", 2, "scale_factor",
         "scale factor must be an integer >= 1"),
        ("job_type,scale_factor,gpu_type,steps_per_second\nm,1,v100,fast\n", 2,
         "steps_per_second", "expected a number of steps per second, got 'fast'"),
        ("job_type,scale_factor,gpu_type,steps_per_second\nm,1,v100,-2\n", 2,
         "steps_per_second", "must be finite and >= 0"),
        ("job_type,scale_factor,gpu_type,steps_per_second\nm,1,,2\n", 2, "gpu_type",
         "empty GPU type"),
    ],
)
def test_csv_errors(text: str, line: int | None, field: str | None, problem: str) -> None:
    with pytest.raises(InputError) as info:
        parse_csv(text, "rates.csv")
    err = info.value
    assert (err.source, err.line, err.field) == ("rates.csv", line, field)
    assert problem in err.problem


GAVEL_JSON = {
    "v100": {"('toy', 1)": {"null": 1.0, "('other', 1)": [0.5, 0.4]}, "('toy2', 2)": 2.0},
    "k80": {"('toy', 1)": {"null": 0.5}},
    "v100_unconsolidated": {"('toy', 1)": {"null": 99.0}},
}


def test_gavel_json_reads_isolated_rates_and_skips_unconsolidated() -> None:
    table = parse_gavel_json(json.dumps(GAVEL_JSON), "g.json")
    assert table.rate("toy", 1, "v100") == 1.0
    assert table.rate("toy", 1, "k80") == 0.5
    assert table.rate("toy2", 2, "v100") == 2.0
    assert set(table.gpu_types()) == {"v100", "k80"}


@pytest.mark.parametrize(
    ("text", "line", "field", "problem"),
    [
        ('{"v100": {"(\'toy\', 1)": {"null": 1.0}}\n,,', 2, None, "not valid JSON"),
        ("[1, 2]", None, None, "expected a JSON object keyed by GPU type"),
        ('{"v100": 3}', None, "v100", "expected an object keyed by"),
        ('{"v100": {"toy": {"null": 1}}}', None, "v100", "job key 'toy' is not of the form"),
        ('{"v100": {"(\'toy\', 0)": {"null": 1}}}', None, "v100", "is not of the form"),
        ('{"v100": {"(\'toy\', 1)": {"x": 1}}}', None, "v100.('toy', 1)", "no isolated"),
        ('{"v100": {"(\'toy\', 1)": {"null": "fast"}}}', None, "v100.('toy', 1)",
         "expected a number of steps per second"),
        ("{}", None, None, "no throughputs found"),
    ],
)
def test_gavel_json_errors(text: str, line: int | None, field: str | None, problem: str) -> None:
    with pytest.raises(InputError) as info:
        parse_gavel_json(text, "g.json")
    err = info.value
    assert (err.source, err.line, err.field) == ("g.json", line, field)
    assert problem in err.problem


def test_load_table_picks_format_by_extension(tmp_path: Path) -> None:
    csv_path = tmp_path / "rates.csv"
    csv_path.write_text(TOY_CSV)
    json_path = tmp_path / "rates.json"
    json_path.write_text(json.dumps(GAVEL_JSON))
    assert load_table(csv_path).rate("toy", 1, "k80") == 0.5
    assert load_table(json_path).rate("toy2", 2, "v100") == 2.0
    # A CSV named .json is read as JSON and fails as such.
    wrong = tmp_path / "csv.json"
    wrong.write_text(TOY_CSV)
    with pytest.raises(InputError, match="not valid JSON") as info:
        load_table(wrong)
    assert info.value.source == str(wrong)
    with pytest.raises(InputError, match="cannot read throughput file"):
        load_table(tmp_path / "missing.csv")


def test_default_table_is_gavels() -> None:
    table = default_table()
    assert set(table.gpu_types()) == {"v100", "p100", "k80"}
    assert table.has_job("ResNet-50 (batch size 64)", 1)
    assert table.rate("ResNet-50 (batch size 64)", 1, "v100") > table.rate(
        "ResNet-50 (batch size 64)", 1, "k80") > 0


def test_merge_overrides_entry_by_entry_and_adds_gpu_types() -> None:
    base = default_table()
    job = "ResNet-50 (batch size 64)"
    extra = parse_csv(
        "job_type,scale_factor,gpu_type,steps_per_second\n"
        f"{job},1,a100,9.8\n{job},1,v100,123\nnew model,1,a100,4\n", "a100.csv")
    merged = base.merged(extra)
    assert merged.rate(job, 1, "a100") == 9.8  # added
    assert merged.rate(job, 1, "v100") == 123  # overridden
    assert merged.rate(job, 1, "k80") == base.rate(job, 1, "k80")  # kept
    assert merged.rate("new model", 1, "a100") == 4
    assert "a100" in merged.gpu_types()
    assert merged.source == "gavel:simulation_throughputs.json+a100.csv"
    assert base.rate(job, 1, "v100") != 123  # the base table is not modified


# -- cluster specs ---------------------------------------------------------------------------


def test_counts_are_v100_p100_k80_one_gpu_per_node() -> None:
    cluster = parse_counts("4:4:4")
    assert cluster.gpu_types == ("v100", "p100", "k80")
    assert [cluster.capacity(g) for g in cluster.gpu_types] == [4, 4, 4]
    assert len(cluster.nodes) == 12 and all(n.gpus == 1 for n in cluster.nodes)
    assert cluster.describe() == "4 v100 + 4 p100 + 4 k80 on 12 nodes"


def test_counts_drop_zero_types_and_accept_names() -> None:
    assert parse_counts("2:0:1").gpu_types == ("v100", "k80")
    named = parse_counts("V100=1:a100=3")
    assert named.gpu_types == ("v100", "a100")
    assert named.capacity("a100") == 3 and named.total_gpus == 4


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("4:x:4", "P100 count 'x' in '4:x:4' is not a whole number >= 0"),
        ("4:-1:4", "P100 count '-1'"),
        ("1:2:3:4", "has 4 counts but only V100:P100:K80 are implied"),
        ("v100=1:V100=2", "a GPU type appears twice"),
        ("0:0:0", "has no GPUs"),
        ("=3", "empty GPU type"),
    ],
)
def test_bad_counts(spec: str, problem: str) -> None:
    with pytest.raises(InputError) as info:
        parse_counts(spec)
    assert info.value.source == "--cluster"
    assert info.value.field == "cluster"
    assert problem in info.value.problem


CLUSTER_TOML = """\
[[nodes]]
gpu_type = "A100"
gpus = 8
count = 2
name = "dgx"

[[nodes]]
gpu_type = "v100"
gpus = 4
"""


def test_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(CLUSTER_TOML)
    cluster = load_cluster_file(path)
    assert [(n.name, n.gpu_type, n.gpus) for n in cluster.nodes] == [
        ("dgx-000", "a100", 8), ("dgx-001", "a100", 8), ("v100-000", "v100", 4)]
    assert cluster.gpu_types == ("a100", "v100")
    assert load_cluster(str(path)) == cluster  # a path that exists is read as a file
    assert isinstance(load_cluster("1:1:1"), ClusterSpec)


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("[[nodes]\n", None, "not valid TOML"),
        ('gpus = 3\n[[nodes]]\ngpu_type = "v100"\ngpus = 1\n', "gpus", "unknown key 'gpus'"),
        ("# nothing\n", "nodes", "no [[nodes]] tables"),
        ("[[nodes]]\ngpus = 2\n", "nodes[0].gpu_type", "missing or empty"),
        ('[[nodes]]\ngpu_type = "v100"\ngpus = 0\n', "nodes[0].gpus", "whole number >= 1"),
        ('[[nodes]]\ngpu_type = "v100"\n', "nodes[0].gpus", "got None"),
        ('[[nodes]]\ngpu_type = "v100"\ngpus = 1\ncount = "2"\n', "nodes[0].count",
         "got '2'"),
        ('[[nodes]]\ngpu_type = "v100"\ngpus = 1\n[[nodes]]\ngpu_type = "k80"\ngpus = 1\n'
         "memory = 3\n", "nodes[1].memory", "unknown key 'memory'"),
        ('[[nodes]]\ngpu_type = "v100"\ngpus = 1\nname = "n"\n'
         '[[nodes]]\ngpu_type = "k80"\ngpus = 1\nname = "n"\n', "nodes.name",
         "node name 'n-000' appears twice"),
    ],
)
def test_cluster_file_errors(tmp_path: Path, text: str, field: str | None, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_cluster_file(path)
    err = info.value
    assert err.source == str(path)
    assert err.field == field
    assert problem in err.problem
    assert "\n" not in err.one_line()


# -- policies --------------------------------------------------------------------------------


def test_unknown_policy_lists_known_ones() -> None:
    assert make_policy("FIFO").name == "fifo"
    with pytest.raises(InputError) as info:
        make_policy("nope")
    assert info.value.field == "policy"
    assert "unknown policy 'nope'" in info.value.problem
    assert info.value.fix is not None and "fifo" in info.value.fix


def test_one_throughput_loader_for_simulate_and_the_sidecar(tmp_path: Path) -> None:
    from hadar_slurm.cli.main import load_throughputs
    from hadar_slurm.rates.synthetic import synthetic_table
    from hadar_slurm.rates.table import default_table, load_tables
    from hadar_slurm.sidecar.config import default_config, load_table_for

    bundled = default_table().rates
    assert load_tables([]).rates == bundled
    # the sidecar never reads the illustrative a100/h100 rates; the simulator has them beside
    # Gavel's measured ones
    assert load_table_for(default_config()).rates == bundled
    assert "h100" not in default_table().gpu_types()
    assert load_throughputs(None).rates == default_table().merged(synthetic_table()).rates
    assert set(load_throughputs(None).gpu_types()) == {"v100", "p100", "k80", "a100", "h100"}
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    header = "job_type,scale_factor,gpu_type,steps_per_second\n"
    first.write_text(header + "X,1,v100,1.0\nY,1,v100,2.0\n")
    second.write_text(header + "X,1,v100,3.0\n")
    merged = load_tables([first, second]).rates
    assert merged[("X", 1)]["v100"] == 3.0 and merged[("Y", 1)]["v100"] == 2.0
    assert load_throughputs(str(first)).rates == default_table().merged(
        synthetic_table()).merged(load_tables([first])).rates
