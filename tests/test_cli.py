"""``hadar-slurm`` end to end, in a subprocess, as a person runs it."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from hadar_slurm import __version__
from hadar_slurm.cli.main import main
from hadar_slurm.core.info import core_kind, core_line
from hadar_slurm.costs import DEFAULT_RESTART_S, LiveCosts
from tests.helpers import REPO, run_cli, trace_line

WriteTrace = Callable[[Sequence[str]], Path]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def two_jobs(write_trace: WriteTrace) -> Path:
    # The hand-worked schedule of test_sim_basics: JCTs 720 and 1340, makespan 1440.
    return write_trace([trace_line("toy", 720, 0), trace_line("toy", 720, 100)])


def test_version() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"hadar-slurm {__version__}"


def test_simulate_prints_table_and_writes_json(
    tmp_path: Path, two_jobs: Path, toy_csv: Path
) -> None:
    out = tmp_path / "res" / "out.json"
    proc = run_cli("simulate", "--trace", str(two_jobs), "--cluster", "v100=1",
                   "--throughputs", str(toy_csv), "--policy", "fifo", "--json", str(out),
                   "--free-moves")
    assert proc.returncode == 0, proc.stderr
    assert "starts and moves free" in proc.stdout
    # no progress bar when stderr is not a terminal: only the line saying which core runs
    assert proc.stderr == core_line() + "\n"
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("policy"))
    for col in ("makespan", "avg JCT", "p95 JCT", "utilization", "FTF mean", "FTF max",
                "decision ms/epoch (median)", "completed/jobs"):
        assert col in header
    row = next(line for line in lines if line.startswith("fifo"))
    assert "1,440 s (0.40 h)" in row  # makespan
    assert "1,030 s (0.29 h)" in row  # average JCT
    assert "100.0%" in row
    assert row.endswith("2/2")
    rows = json.loads(out.read_text())
    assert isinstance(rows, list) and len(rows) == 1
    assert rows[0]["policy"] == "fifo"
    assert rows[0]["makespan_s"] == 1440.0
    assert rows[0]["avg_jct_s"] == 1030.0
    assert rows[0]["utilization"] == 1.0
    assert (rows[0]["num_jobs"], rows[0]["num_completed"]) == (2, 2)


def test_simulate_charges_the_live_costs_by_default(
    tmp_path: Path, two_jobs: Path, toy_csv: Path
) -> None:
    # The same two jobs, one after the other: each loses a start's cost (the Slurm start
    # measured on the dev cluster plus the job's own restart), the sidecar's defaults.
    for restart in (None, "5"):
        out = tmp_path / f"out-{restart}.json"
        extra = ("--restart-s", restart) if restart else ()
        proc = run_cli("simulate", "--trace", str(two_jobs), "--cluster", "v100=1",
                       "--throughputs", str(toy_csv), "--policy", "fifo", "--json", str(out),
                       *extra)
        assert proc.returncode == 0, proc.stderr
        start_s = LiveCosts(float(restart) if restart else DEFAULT_RESTART_S).start_s
        assert f"a start costs {start_s:g} s" in proc.stdout
        (row,) = json.loads(out.read_text())
        assert row["makespan_s"] == pytest.approx(1440.0 + 2 * start_s)
        assert row["avg_jct_s"] == pytest.approx(((720 + start_s) + (1340 + 2 * start_s)) / 2)
    bad = run_cli("simulate", "--trace", str(two_jobs), "--cluster", "v100=1",
                  "--throughputs", str(toy_csv), "--restart-s", "-1")
    assert bad.returncode == 2 and "restart-s" in bad.stderr


def test_simulate_draws_give_the_spread_over_perturbed_lengths(
    tmp_path: Path, two_jobs: Path, toy_csv: Path
) -> None:
    # The two jobs of 720 steps at 1 step/s, one after the other (makespan 1440 s, JCTs 720
    # and 1340), each length times 1 + 1e-4 u per draw: each draw's makespan within 2 x 0.072
    # s of 1440 s, the JCTs' mean within 0.108 s of 1030 s; the trace as given is one run.
    out = tmp_path / "out.json"
    proc = run_cli("simulate", "--trace", str(two_jobs), "--cluster", "v100=1",
                   "--throughputs", str(toy_csv), "--policy", "fifo", "--json", str(out),
                   "--free-moves", "--draws", "2")
    assert proc.returncode == 0, proc.stderr
    assert "over the trace and 2 draw(s) of it" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("fifo ") and "[" in x)
    assert line.count("1,440 s") == 3 and line.count("1,030 s") == 3
    (row,) = json.loads(out.read_text())
    o = row["over_draws"]
    assert o["runs"] == 3
    assert o["makespan_s_min"] <= row["makespan_s"] == 1440.0 <= o["makespan_s_max"]
    assert o["makespan_s_min"] < o["makespan_s_max"]  # the draws did change the lengths
    assert 1440.0 - 0.15 <= o["makespan_s_min"] and o["makespan_s_max"] <= 1440.0 + 0.15
    assert abs(o["avg_jct_s_mean"] - 1030.0) <= 0.11
    bad = run_cli("simulate", "--trace", str(two_jobs), "--cluster", "v100=1",
                  "--throughputs", str(toy_csv), "--draws", "-1")
    assert bad.returncode == 2 and "draws" in bad.stderr


def test_simulate_bundled_trace_on_gavel_cluster(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = run_cli("simulate", "--trace", "static_32_seed0", "--cluster", "4:4:4",
                   "--policy", "fifo", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "trace bundled:static_32_seed0: 32 jobs" in proc.stdout
    (row,) = json.loads(out.read_text())
    assert row["num_completed"] == 32
    assert row["makespan_s"] > 0 and 0 < row["utilization"] <= 1


def test_simulate_reschedule_on_finish(tmp_path: Path) -> None:
    """--reschedule-on-finish: rounds also end when a job ends, as the sidecar's epochs do, so
    there are more of them, and the GPUs a finish frees go out at once: on static_32 hadar's
    average JCT is shorter (bench/quality.py has the figures)."""
    rows = {}
    for flag in ((), ("--reschedule-on-finish",)):
        out = tmp_path / f"out{len(flag)}.json"
        proc = run_cli("simulate", "--trace", "static_32_seed0", "--cluster", "4:4:4",
                       "--policy", "hadar", "--json", str(out), *flag)
        assert proc.returncode == 0, proc.stderr
        (rows[bool(flag)],) = json.loads(out.read_text())
    assert rows[True]["num_completed"] == rows[False]["num_completed"] == 32
    assert rows[True]["epochs"] > rows[False]["epochs"]
    assert rows[True]["avg_jct_s"] < rows[False]["avg_jct_s"]


def test_throughputs_merge_over_gavel_table_and_cluster_file(
    tmp_path: Path, write_trace: WriteTrace
) -> None:
    # A CSV that only adds a100 rates for one Gavel job type, on an a100 + k80 cluster file;
    # the k80 rate of the other job type comes from the bundled Gavel table.
    rates = tmp_path / "a100.csv"
    rates.write_text("job_type,scale_factor,gpu_type,steps_per_second\n"
                     "ResNet-50 (batch size 64),1,a100,10\n")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[[nodes]]\ngpu_type = "a100"\ngpus = 1\n'
                       '[[nodes]]\ngpu_type = "k80"\ngpus = 1\n')
    trace = write_trace([trace_line("ResNet-50 (batch size 64)", 3600, 0),
                         trace_line("A3C", 1000, 0)])
    out = tmp_path / "out.json"
    proc = run_cli("simulate", "--trace", str(trace), "--cluster", str(cluster),
                   "--throughputs", str(rates), "--policy", "fifo", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["num_completed"] == 2
    assert row["cluster"] == "1 a100 + 1 k80 on 2 nodes"
    # The ResNet job is first and the a100 is the first node: 3600 steps at 10/s = 360 s.
    assert row["makespan_s"] >= 360.0


def test_plots_are_written(tmp_path: Path, two_jobs: Path, toy_csv: Path) -> None:
    plots = tmp_path / "plots"
    proc = run_cli("simulate", "--trace", str(two_jobs), "--cluster", "v100=1:k80=1",
                   "--throughputs", str(toy_csv), "--plots", str(plots), "--policy", "fifo")
    assert proc.returncode == 0, proc.stderr
    for name in ("jct_cdf.png", "gpus_busy.png"):
        data = (plots / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert str(plots / name) in proc.stdout


def write_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


BAD_INPUTS: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("trace column count",
     lambda d: ["--trace", write_file(d, "t", "toy\t1\t2\n")],
     ":1: expected 10 TAB-separated fields, got 3"),
    ("unknown job type",
     lambda d: ["--trace", write_file(d, "t", trace_line("nope", 10, 0) + "\n")],
     ":1: field 'job_type': unknown job type 'nope'"),
    ("arrivals backwards",
     lambda d: ["--trace", write_file(d, "t", trace_line("toy", 10, 50) + "\n"
                                      + trace_line("toy", 10, 20) + "\n")],
     ":2: field 'arrival_time': arrival time 20 goes backwards"),
    ("negative work",
     lambda d: ["--trace", write_file(d, "t", trace_line("toy", -3, 0) + "\n")],
     ":1: field 'total_steps': work must be positive"),
    ("missing trace", lambda d: ["--trace", str(d / "none.trace")],
     "none.trace: field 'trace': no such trace file"),
    ("bad cluster counts", lambda d: ["--cluster", "4:x:4"],
     "--cluster: field 'cluster': P100 count 'x' in '4:x:4' is not a whole number"),
    ("bad cluster file", lambda d: ["--cluster", write_file(d, "c.toml", "[[nodes]\n")],
     "c.toml: not valid TOML"),
    ("missing cluster file", lambda d: ["--cluster", str(d / "none.toml")],
     "none.toml: field 'cluster': no such cluster file"),
    ("throughputs not JSON",
     lambda d: ["--throughputs", write_file(d, "r.json", "not json")],
     "r.json:1: not valid JSON"),
    ("throughputs bad CSV",
     lambda d: ["--throughputs", write_file(d, "r.csv", "job,sf\n")],
     "r.csv:1: header is"),
    ("missing throughputs", lambda d: ["--throughputs", str(d / "none.csv")],
     "none.csv: cannot read throughput file: No such file or directory"),
    ("unknown policy", lambda d: ["--policy", "fifo,nope"],
     "field 'policy': unknown policy 'nope' (choose from "),
    ("bad round", lambda d: ["--round-seconds", "0"],
     "field 'round-seconds': expected a number of seconds > 0"),
    ("job no cluster type can run",
     lambda d: ["--cluster", "k80=2",
                "--trace", write_file(d, "t", "# header\n" + trace_line("toy", 10, 0) + "\n"
                                      + trace_line("v100only", 10, 0) + "\n")],
     ":3: field 'job_type': job 1 ('v100only' on 1 GPU(s)) has no throughput on any GPU "
     "type of the cluster (2 k80)"),
]


@pytest.mark.parametrize(("case", "make_args", "message"), BAD_INPUTS,
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, two_jobs: Path, toy_csv: Path, case: str,
    make_args: Callable[[Path], list[str]], message: str,
) -> None:
    args = {"--trace": str(two_jobs), "--cluster": "v100=1", "--throughputs": str(toy_csv),
            "--policy": "fifo"}
    given = make_args(tmp_path)
    for flag, value in zip(given[::2], given[1::2], strict=True):
        args[flag] = value
    flat = [x for kv in args.items() for x in kv]
    proc = run_cli("simulate", *flat)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hadar-slurm: error: ")
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


def test_main_returns_2_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", "static_32_seed0", "--cluster", "4:x:4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hadar-slurm: error: --cluster:")


def test_missing_subcommand_is_a_usage_error() -> None:
    proc = run_cli()
    assert proc.returncode == 2
    assert "usage: hadar-slurm" in proc.stderr


def test_progress_bar_only_on_a_terminal(two_jobs: Path, toy_csv: Path) -> None:
    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "hadar_slurm", "simulate", "--trace", str(two_jobs),
             "--cluster", "v100=1", "--throughputs", str(toy_csv), "--policy", "fifo"],
            stdout=subprocess.PIPE, stderr=follower, env=env, timeout=120, check=False,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
    assert proc.returncode == 0
    shown = b"".join(chunks).decode()
    assert "fifo: [" in shown and "jobs done" in shown
    assert shown.endswith("\r\x1b[K")  # the bar is cleared before the table is printed


def test_runs_as_installed_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "hadar-slurm"
    if not script.exists():
        pytest.skip("hadar-slurm is not installed next to this interpreter")
    proc = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 0 and __version__ in proc.stdout


def test_simulate_says_which_core_runs(two_jobs: Path, toy_csv: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from hadar_slurm import core

    args = ("simulate", "--trace", str(two_jobs), "--cluster", "v100=1",
            "--throughputs", str(toy_csv), "--policy", "fifo")
    assert main(list(args)) == 0
    expected = ("core: compiled (hadar_slurm._hadar_core)" if core.COMPILED else
                "core: NumPy reference (the compiled core is not built: ")
    assert capsys.readouterr().err.startswith(expected)
    assert core_kind() == ("compiled" if core.COMPILED else "numpy")
    monkeypatch.setattr(core, "COMPILED", False)
    monkeypatch.setitem(sys.modules, "hadar_slurm._hadar_core", None)  # import fails
    assert core_kind() == "numpy"
    assert main(list(args)) == 0
    err = capsys.readouterr().err
    assert err.startswith("core: NumPy reference (the compiled core is not built: ")
    assert "hadar_slurm._hadar_core" in err.splitlines()[0]
