"""The ``hadar-slurm`` command line.

Subcommands::

    hadar-slurm simulate --trace FILE --cluster 4:4:4 [--throughputs FILE]
                         [--policy NAME[,NAME...]] [--round-seconds 360]
                         [--json OUT] [--plots DIR]
    hadar-slurm run --config FILE [--once] [--dry-run] [--state-dir DIR] [--epoch-seconds S]
                    [--max-epochs N]
    hadar-slurm status [--config FILE] [--all] [--json]
    hadar-slurm explain JOBID [--config FILE]
    hadar-slurm hints check "hadar: model=... steps=..." [--gpus N] | hints lua
    hadar-slurm throughputs list|import FILE|export FILE [--db PATH]
    hadar-slurm gpus [--json] | gres-conf [--node NAME]
    hadar-slurm profile --model M --batch-size B [--gpu-type T] [--slurm] [--db PATH]
    hadar-slurm report (--config FILE | --log FILE) [--since 24h] [--out report.png|.html]

Any problem with the input is an :class:`~hadar_slurm.errors.InputError`: it is printed as one
line, ``hadar-slurm: error: ...``, and the exit status is 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from hadar_slurm import __version__
from hadar_slurm.cli import hints as cli_hints
from hadar_slurm.cli import nvml as cli_nvml
from hadar_slurm.cli import report as cli_report
from hadar_slurm.cli import store as cli_store
from hadar_slurm.cli import trace as cli_trace
from hadar_slurm.cli import tune as cli_tune
from hadar_slurm.consolidation import ConsolidationCost
from hadar_slurm.core.info import core_line
from hadar_slurm.costs import DEFAULT_RESTART_S, SLURM_MOVE_S, SLURM_START_S, LiveCosts
from hadar_slurm.durations import parse_seconds_value
from hadar_slurm.errors import InputError
from hadar_slurm.loop import EpochRecord
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy import REGISTRY, Policy, make_policy
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sidecar.config import SidecarConfig, default_config, load_config
from hadar_slurm.sidecar.controller import Sidecar, read_state, slurm_api
from hadar_slurm.sidecar.status import explain, format_status, status_rows
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.cluster import load_cluster
from hadar_slurm.sim.run import SimResult, simulate, spread_over_draws
from hadar_slurm.sim.trace import (
    BUNDLED_TRACES,
    DRAW_REL,
    check_runnable,
    job_line_numbers,
    parse_trace,
    perturbed_jobs,
    read_trace_text,
)
from hadar_slurm.slurm import SlurmConfigError, SlurmError, SlurmJob
from hadar_slurm.slurm.hetjob import MAX_COPIES

PROG = "hadar-slurm"
EXIT_INPUT = 2


def default_policy() -> str:
    """``hadar`` (the scheduler this project is about) once registered, else ``fifo``."""
    return "hadar" if "hadar" in REGISTRY else "fifo"


# -- input ----------------------------------------------------------------------------------


def load_throughputs(path: str | None) -> ThroughputTable:
    """The simulator's table: the bundled Gavel table and illustrative a100/h100 rates
    (:mod:`hadar_slurm.rates.synthetic`), with the entries of ``path`` (if given) merged over
    them."""
    return cli_trace.sim_throughputs(path)


def load_jobs(trace: str, table: ThroughputTable, cluster: ClusterSpec) -> tuple[list[Job], str]:
    """Parse ``--trace`` (a file or a bundled trace name) and check the cluster can run it."""
    if not Path(trace).exists() and trace not in BUNDLED_TRACES:
        raise InputError("no such trace file", source=trace, field="trace",
                         fix="give a trace file or one of: " + ", ".join(BUNDLED_TRACES))
    text, source = read_trace_text(trace)
    jobs = parse_trace(text, source, table)
    check_runnable(jobs, table, cluster, source=source, lines=job_line_numbers(text))
    return jobs, source


def parse_policies(spec: str,
                   settings: Mapping[str, Mapping[str, object]] | None = None) -> list[Policy]:
    """The policies named in ``spec`` (comma-separated), each built with its ``settings``."""
    names = [n.strip() for n in spec.split(",")]
    if not all(names):
        raise InputError(f"empty policy name in {spec!r}", field="policy",
                         fix="separate names by single commas, e.g. hadar,fifo")
    given = settings or {}
    policies = [make_policy(n, **given.get(n.lower(), {})) for n in names]
    seen: set[str] = set()
    for p in policies:
        if p.name in seen:
            raise InputError(f"policy {p.name!r} is named twice", field="policy")
        seen.add(p.name)
    return policies


def parse_seconds(text: str, what: str, *, positive: bool = False,
                  example: str = "2") -> float:
    """A number of seconds given on the command line as ``--WHAT`` (> 0 when ``positive``,
    else >= 0)."""
    try:
        return parse_seconds_value(text, positive=positive)
    except ValueError as exc:
        raise InputError(str(exc), field=what, fix=f"e.g. --{what} {example}") from None


def parse_copies(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_COPIES:
        raise InputError(f"expected a whole number from 1 to {MAX_COPIES}, got {text!r}",
                         field="max-copies", fix="e.g. --max-copies 4")
    return value


def parse_round(text: str) -> float:
    return parse_seconds(text, "round-seconds", positive=True, example="360")


# -- output ---------------------------------------------------------------------------------


def fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    return f"{seconds:,.0f} s ({seconds / 3600:.2f} h)"


def fmt_num(value: float, digits: int) -> str:
    return "-" if not math.isfinite(value) else f"{value:.{digits}f}"


TABLE_HEADER = (
    "policy", "makespan", "avg JCT", "p95 JCT", "utilization", "FTF mean", "FTF max",
    "decision ms/epoch (median)", "completed/jobs",
)


def result_table(results: Sequence[SimResult]) -> str:
    """The results as an aligned plain-text table."""
    rows = [TABLE_HEADER]
    for r in results:
        rows.append((
            r.policy, fmt_time(r.makespan_s), fmt_time(r.avg_jct_s), fmt_time(r.p95_jct_s),
            "-" if not math.isfinite(r.utilization) else f"{100 * r.utilization:.1f}%",
            fmt_num(r.ftf_mean, 3), fmt_num(r.ftf_max, 3), fmt_num(r.decision_ms_median, 3),
            f"{r.num_completed}/{r.num_jobs}",
        ))
    widths = [max(len(row[c]) for row in rows) for c in range(len(TABLE_HEADER))]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Progress:
    """A one-line progress bar on a terminal; silent when ``stream`` is not a TTY."""

    def __init__(self, stream: TextIO, label: str, num_jobs: int, start: float,
                 min_interval_s: float = 0.1) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.label = label
        self.num_jobs = num_jobs
        self.start = start
        self.min_interval_s = min_interval_s
        self._last = -math.inf
        self._shown = False

    def update(self, record: EpochRecord, backend: SimulatedCluster) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.min_interval_s:
            return
        self._last = now
        done = int(np.count_nonzero(~np.isnan(backend.state.finish)))
        frac = done / self.num_jobs if self.num_jobs else 1.0
        width = 24
        filled = round(frac * width)
        bar = "#" * filled + "." * (width - filled)
        sim_h = (record.start - self.start) / 3600
        self.stream.write(
            f"\r{self.label}: [{bar}] {done}/{self.num_jobs} jobs done, epoch {record.epoch}, "
            f"simulated {sim_h:.1f} h\x1b[K"
        )
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def draws_table(policies: Sequence[str], spread: Sequence[dict[str, int | float]],
                draws: int) -> str:
    """``simulate --draws``' second table: per policy, the mean [lowest, highest] makespan
    and average JCT over the trace and its draws."""
    lines = [f"over the trace and {draws} draw(s) of it, every job's length times 1 + "
             f"{DRAW_REL:g} u (u uniform on [-1, 1]): mean [lowest, highest]",
             f"{'policy':14s}  {'makespan':>34s}  {'avg JCT':>34s}"]
    for name, o in zip(policies, spread, strict=True):
        cells = [f"{fmt_seconds(o[k + '_mean'])} [{fmt_seconds(o[k + '_min'])}, "
                 f"{fmt_seconds(o[k + '_max'])}]" for k in ("makespan_s", "avg_jct_s")]
        lines.append(f"{name:14s}  {cells[0]:>34s}  {cells[1]:>34s}")
    return "\n".join(lines)


def fmt_seconds(value: float) -> str:
    return f"{value:,.0f} s"


def write_json(path: str, results: Sequence[SimResult],
               spread: Sequence[dict[str, int | float]] = ()) -> None:
    out = Path(path)
    rows = [r.row() for r in results]
    for row, extra in zip(rows, spread, strict=False):
        row["over_draws"] = extra
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2) + "\n")
    except OSError as exc:
        raise InputError(f"cannot write JSON: {exc.strerror}", source=path,
                         field="json") from None


# -- subcommands ----------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> int:
    round_s = parse_round(args.round_seconds)
    draws = int(args.draws)
    if not 0 <= draws <= 100:
        raise InputError(f"expected 0 to 100 draws, got {draws}", source="simulate",
                         field="draws", fix="--draws 20 runs each policy 20 more times")
    consolidation = ConsolidationCost(
        base_s=parse_seconds(args.consolidation_base_s, "consolidation-base-s"),
        s_per_gb=parse_seconds(args.consolidation_s_per_gb, "consolidation-s-per-gb"))
    # Each policy's own settings from the command line (hadar's and hadare's).
    share: dict[str, object] = {"share": True} if args.share else {}
    settings: dict[str, dict[str, object]] = {
        "hadar": dict(share),
        "hadare": {"max_copies": parse_copies(args.max_copies), "consolidation": consolidation,
                   "pin_binding": bool(args.pin_binding), **share},
    }
    policies = parse_policies(args.policy, settings)
    table = load_throughputs(args.throughputs)
    cluster = load_cluster(args.cluster)
    jobs, source = load_jobs(args.trace, table, cluster)
    plots_dir = Path(args.plots) if args.plots else None
    if plots_dir is not None and plots_dir.exists() and not plots_dir.is_dir():
        raise InputError("exists and is not a directory", source=args.plots, field="plots")

    if args.free_moves:
        move_s = start_s = fork_start_s = fork_interval_s = 0.0
        costs = "starts and moves free"
    else:
        live = LiveCosts(parse_seconds(args.restart_s, "restart-s"))
        move_s, start_s = live.move_s, live.start_s
        fork_start_s, fork_interval_s = live.fork_start_s, live.fork_interval_s
        costs = f"a start costs {start_s:g} s, a move {move_s:g} s"
    print(core_line(), file=sys.stderr)
    print(f"trace {source}: {len(jobs)} jobs; cluster {cluster.describe()}; "
          f"round {round_s:g} s; {costs}")
    start = min(j.arrival_s for j in jobs)

    def run(policy: Policy, trace: Sequence[Job], label: str) -> SimResult:
        progress = Progress(sys.stderr, label, len(trace), start)
        hook: Callable[[EpochRecord, SimulatedCluster], None] | None = (
            progress.update if progress.enabled else None)
        try:
            return simulate(trace, cluster, table, policy, round_s=round_s,
                            consolidation=consolidation, on_epoch=hook,
                            reschedule_on_finish=args.reschedule_on_finish,
                            migration_cost_s=move_s, start_cost_s=start_s,
                            fork_start_s=fork_start_s, fork_interval_s=fork_interval_s,
                            final_run=args.final_run)
        finally:
            progress.close()

    results = [run(policy, jobs, policy.name) for policy in policies]
    print(result_table(results))
    spread: list[dict[str, int | float]] = []
    if draws:
        for policy, r in zip(policies, results, strict=True):
            runs = [r] + [run(policy, perturbed_jobs(jobs, DRAW_REL, d),
                              f"{policy.name} draw {d}") for d in range(1, draws + 1)]
            spread.append(spread_over_draws(runs))
        print(draws_table([r.policy for r in results], spread, draws))
    for r in results:
        if r.packed:
            print(f"{r.policy}: {r.packed_jobs} job(s) shared GPUs, in "
                  f"{len(r.packed)} of {r.epochs} rounds")
    for r in results:
        if r.num_completed < r.num_jobs:
            print(f"note: {r.policy} left {r.num_jobs - r.num_completed} job(s) unfinished")
    if args.json:
        write_json(args.json, results, spread)
        print(f"wrote {args.json}")
    if plots_dir is not None:
        from hadar_slurm.sim.plots import write_plots

        try:
            paths = write_plots(results, plots_dir)
        except OSError as exc:
            raise InputError(f"cannot write plots: {exc.strerror}", source=args.plots,
                             field="plots") from None
        print("plots: " + ", ".join(str(p) for p in paths))
    return 0


# -- the sidecar ------------------------------------------------------------------------------


def _sidecar_config(args: argparse.Namespace) -> SidecarConfig:
    config = load_config(args.config) if args.config else default_config()
    overrides: dict[str, object] = {}
    if getattr(args, "dry_run", False):
        overrides["dry_run"] = True
    if getattr(args, "epoch_seconds", None) is not None:
        overrides["epoch_seconds"] = parse_round(args.epoch_seconds)
    if getattr(args, "state_dir", None) is not None:
        overrides["state_dir"] = args.state_dir
    return config.with_overrides(**overrides) if overrides else config


def cmd_run(args: argparse.Namespace) -> int:
    config = _sidecar_config(args)
    max_epochs = 1 if args.once else args.max_epochs
    if max_epochs is not None and max_epochs < 1:
        raise InputError(f"must be at least 1, got {max_epochs}", field="--max-epochs")
    try:
        sidecar = Sidecar(config)
        sidecar.install_signal_handlers()
        return sidecar.run(max_epochs=max_epochs)
    except SlurmConfigError as exc:
        raise _slurm_config_error(exc, config) from None


def _slurm_config_error(exc: SlurmConfigError, config: SidecarConfig) -> InputError:
    """One line naming the key to fix: ``[slurm] backend`` for the pyslurm backend's errors
    (they carry ``field``), else ``[slurm] conf``."""
    return InputError(str(exc), source=config.source,
                      field=str(getattr(exc, "field", "[slurm] conf")))


def cmd_status(args: argparse.Namespace) -> int:
    config = _sidecar_config(args)
    jobs = _read_jobs(config)
    state = read_state(config)
    if args.json:
        print(json.dumps({"state_epoch": state.get("epoch") if state else None,
                          "jobs": status_rows(jobs, state, args.all),
                          "studies": (state or {}).get("studies", [])}, indent=1))
    else:
        print(format_status(jobs, state, args.all))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    config = _sidecar_config(args)
    try:
        job_id = int(args.jobid)
    except ValueError:
        raise InputError(f"not a job id: {args.jobid!r}", field="JOBID") from None
    print(explain(job_id, _read_jobs(config), read_state(config)))
    return 0


def _read_jobs(config: SidecarConfig) -> list[SlurmJob]:
    try:
        return slurm_api(config).read_jobs()
    except SlurmConfigError as exc:
        raise _slurm_config_error(exc, config) from None
    except SlurmError as exc:
        raise InputError(f"cannot read Slurm's queue: {exc}") from None


def _add_config_arg(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--config", required=required, metavar="FILE",
                   help="the sidecar's TOML config (example: slurm_conf/hadar-slurm.toml)"
                   + ("" if required else "; default: built-in defaults and $SLURM_CONF"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Heterogeneity-aware scheduling of deep-learning jobs on Slurm GPU "
        "clusters.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sim = sub.add_parser(
        "simulate", help="run scheduling policies over a job trace in the simulator",
        description="Run each policy over the trace on a simulated cluster and compare "
        "makespan, job completion time (JCT), utilization and finish-time fairness (FTF).",
    )
    sim.add_argument("--trace", required=True, metavar="FILE",
                     help="a trace in Gavel's format, or a bundled trace: "
                     + ", ".join(BUNDLED_TRACES))
    sim.add_argument("--cluster", required=True, metavar="SPEC",
                     help="V100:P100:K80 GPU counts (e.g. 4:4:4), named counts "
                     "(e.g. v100=4:a100=8), or a TOML cluster file")
    sim.add_argument("--throughputs", metavar="FILE",
                     help="throughput table (Gavel .json or CSV) merged over the bundled "
                     "ones (Gavel's, and illustrative a100/h100 rates)")
    sim.add_argument("--policy", default=default_policy(), metavar="NAME[,NAME...]",
                     help="policies to compare, from: " + ", ".join(sorted(REGISTRY))
                     + " (default: %(default)s)")
    sim.add_argument("--round-seconds", default="360", metavar="S",
                     help="scheduling round (epoch) length in seconds (default: %(default)s)")
    sim.add_argument("--max-copies", default="4", metavar="K",
                     help="hadare: the most copies a job may be forked into "
                     "(default: %(default)s)")
    sim.add_argument("--pin-binding", action=argparse.BooleanOptionalAction, default=True,
                     help="hadare: run the jobs that bind the fork makespan on their fastest "
                     "copies, as the sidecar's [hadare] pin_binding (on by default; "
                     "--no-pin-binding turns it off: docs/algorithm.md)")
    sim.add_argument("--share", action="store_true",
                     help="hadar, hadare: let two jobs of the same scale factor share GPUs "
                     "where the table's co-located rates say the pair gains (the sidecar's "
                     "[scheduler] share; docs/sharing.md). gavel-las-packed always shares")
    sim.add_argument("--final-run", action="store_true",
                     help="hadare: a forked job, once its copies are done, runs once more on "
                     "its own, placed by the policy and holding its GPUs for a start, as the "
                     "sidecar runs it (by default that run costs a start and holds no GPU)")
    sim.add_argument("--consolidation-base-s", default="2", metavar="S",
                     help="hadare: seconds each consolidation of a forked job's copies takes, "
                     "plus the model-size term below (default: %(default)s)")
    sim.add_argument("--consolidation-s-per-gb", default="10", metavar="S",
                     help="hadare: seconds more per GB of model parameters "
                     "(default: %(default)s)")
    sim.add_argument("--reschedule-on-finish", action="store_true",
                     help="start the next round as soon as a job ends, as the sidecar does "
                     "([scheduler] reschedule_on_finish), instead of at the end of the round "
                     "(fixed rounds, as Gavel's simulator); such a round only fills the free "
                     "GPUs, and every job is re-planned a round after the last time")
    sim.add_argument("--restart-s", default=f"{DEFAULT_RESTART_S:g}", metavar="S",
                     help="a job's own restart (as the sidecar's [scheduler] restart_s): a "
                     f"start costs it plus {SLURM_START_S:g} s, a move plus {SLURM_MOVE_S:g} s "
                     "(Slurm's, measured) (default: %(default)s)")
    sim.add_argument("--free-moves", action="store_true",
                     help="charge nothing for starts and moves, as Gavel's simulator")
    sim.add_argument("--draws", type=int, default=0, metavar="N",
                     help="also run each policy N more times with every job's length changed "
                     f"by at most {DRAW_REL:g} of itself (a draw seeded with its number), and "
                     "print the mean, lowest and highest makespan and average JCT: a "
                     "policy's run can part from another's after such a change, so one run "
                     "may be its luckiest (default: %(default)s)")
    sim.add_argument("--json", metavar="OUT", help="write one JSON object per policy to OUT")
    sim.add_argument("--plots", metavar="DIR",
                     help="write jct_cdf.png, gpus_busy.png and, when a policy forked jobs, "
                     "copies.png to DIR")
    sim.set_defaults(func=cmd_simulate)

    run = sub.add_parser(
        "run", help="run the sidecar: steer a Slurm cluster's hadar jobs every epoch",
        description="Every epoch: read Slurm's jobs and nodes, run the policy, and hold, "
        "place, release or requeue hadar jobs (those with 'hadar:' hints in their comment). "
        "Stops on SIGTERM/SIGINT after the current epoch.",
    )
    _add_config_arg(run, required=True)
    run.add_argument("--once", action="store_true", help="run one epoch and exit")
    run.add_argument("--max-epochs", type=int, metavar="N", help="stop after N epochs")
    run.add_argument("--dry-run", action="store_true",
                     help="shadow mode: log what it would do, change nothing in Slurm")
    run.add_argument("--epoch-seconds", metavar="S",
                     help="epoch length in seconds (overrides the config)")
    run.add_argument("--state-dir", metavar="DIR",
                     help="the sidecar's state directory (overrides [sidecar] state_dir): one "
                     "sidecar per state_dir, so a dry run beside a running sidecar needs its "
                     "own")
    run.set_defaults(func=cmd_run)

    status = sub.add_parser(
        "status", help="jobs, GPU types, where each runs and why",
        description="A table of Slurm's jobs as the sidecar sees them: model, GPUs, GPU "
        "type, nodes, and why each runs there or waits (from the sidecar's last epoch).",
    )
    _add_config_arg(status, required=False)
    status.add_argument("--all", action="store_true", help="finished jobs too")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_status)

    expl = sub.add_parser(
        "explain", help="why a job waits, or runs where it does",
        description="The hints, the sidecar's last decision on the job and its reason, the "
        "job's throughput on each GPU type, and what is recorded in Slurm.",
    )
    expl.add_argument("jobid", metavar="JOBID", help="a Slurm job id")
    _add_config_arg(expl, required=False)
    expl.set_defaults(func=cmd_explain)

    cli_hints.register(sub)
    cli_store.register(sub)
    cli_nvml.register(sub)
    cli_report.register(sub)
    cli_trace.register(sub)
    cli_tune.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except InputError as exc:
        sys.stdout.flush()
        message = exc.one_line().replace("\r", " ").replace("\n", " ")  # always one line
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
