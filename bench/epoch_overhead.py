"""Epoch overhead of the sidecar against the real dev cluster, for growing numbers of pending jobs.

    python -m bench.epoch_overhead [--sizes 50,200,500] [--repeats 3]
                                   [--json bench/results/epoch_overhead.json] [--keep DIR]

Needs root and Debian's Slurm (``make deps``).  Uses the dev cluster that answers at
``$SLURM_CONF`` (or in ``$HADAR_DEVCLUSTER_DIR``); when none answers it starts its own
(``slurm_conf/dev-cluster.sh`` with job_submit.lua, in /tmp/hadar-bench-cluster on free ports)
and always stops it again, also on an error or Ctrl-C.  A cluster it did not start is left
running.

For each size N and each repeat: the bench's leftover jobs are cancelled, N hinted jobs (a mix of
models and GPU counts, payload ``sleep 600``) are submitted with sbatch and job_submit.lua holds
them, and once all N are PENDING in ``squeue`` the sidecar (in this process, with
``slurm_conf/dev-sidecar.toml``, policy hadar) runs ONE epoch: one read of jobs and nodes, the
policy, the actions.  Reported per epoch:

* ``epoch_s``: read + decide + apply (the backend's stats and the loop's record), and
  ``epoch_wall_s``: wall time around the whole epoch call (also building the snapshot, the
  diff, the log line and the state file);
* ``read_s``, ``decide_s``, ``apply_s``; ``slurm_commands`` = ``commands_read`` +
  ``commands_apply`` (``commands_read`` must be 2 at every size: one ``squeue --json``, one
  ``sinfo --json``); ``placed`` (jobs the policy placed) and the actions applied;
* ``steady_*``: the same for a second epoch right after, with nothing new (expected: the 2
  reads and hardly any action); ``steady_undone`` counts jobs the first epoch placed that the
  steady one held or signaled again: the mark of an epoch that saw the jobs Slurm started since
  as something other than the placements it made (a read race: a started job's GPUs taken for
  someone else's; or, before ``Snapshot.fixed``, the bench's ``preempt=never`` jobs leaving the
  snapshot once they ran, so that the jobs placed beside them were re-planned);
* outside the epochs, ``squeue --json`` and ``sinfo --json`` once more, timed alone
  (``squeue_cmd_s``/``sinfo_cmd_s``: the command, ``squeue_parse_s``/``sinfo_parse_s``: parsing
  its output, ``squeue_kb``) to split the read.

Figures are medians over ``--repeats`` runs (fresh jobs each time).  ``jobs_visible`` counts
every job ``squeue`` returned, which includes the bench's cancelled jobs of earlier runs
(the dev cluster keeps finished jobs visible for MinJobAge=300 s).  Goal (issue #2): an epoch
under 1 s at 500 pending jobs, with a constant number of reads.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench.devcluster import dev_script, free_port_base
from bench.report import write_rows
from hadar_slurm.sidecar.config import load_config
from hadar_slurm.sidecar.controller import Sidecar
from hadar_slurm.slurm import SlurmJob, SlurmRunner, commands
from hadar_slurm.slurm.parse import (
    UNFINISHED_STATES,
    parse_sbatch_parsable,
    parse_sinfo_json,
    parse_squeue_json,
)

REPO = Path(__file__).resolve().parent.parent
DEV_CONFIG = REPO / "slurm_conf" / "dev-sidecar.toml"
BENCH_DIR = "/tmp/hadar-bench-cluster"
JOB_NAME = "hadar-bench-epoch"
GOAL_S = 1.0

# (hints, GPUs): every model of the catalog, 1 to 8 GPUs, all valid for job_submit.lua.
MIX: tuple[tuple[str, int], ...] = (
    ("model=resnet50 bs=64 steps=40000", 1),
    ("model=resnet50 bs=32 steps=20000", 2),
    ("model=resnet50 bs=128 steps=80000", 4),
    ("model=resnet18 bs=128 steps=30000", 2),
    ("model=transformer bs=32 steps=15000 sync=false", 1),
    ("model=transformer bs=128 steps=25000", 2),
    ("model=lm bs=20 steps=50000", 1),
    ("model=lm bs=80 steps=100000 weight=2", 4),
    ("model=recommendation bs=512 steps=9000", 1),
    ("model=recommendation bs=2048 steps=5000", 1),
    ("model=a3c steps=12000", 1),
    ("model=cyclegan steps=3000", 1),
    ("model=resnet18 bs=256 steps=60000", 8),
    ("model=lm bs=10 steps=40000", 2),
)


# -- the cluster -------------------------------------------------------------------------------


@dataclass
class Cluster:
    conf: Path
    runner: SlurmRunner
    env: dict[str, str] | None  # dev-cluster.sh environment when this bench started it


def _answers(conf: Path) -> bool:
    if not conf.is_file():
        return False
    try:
        out = SlurmRunner(conf, timeout=15).run(["scontrol", "ping"], check=False)
    except Exception:
        return False
    return "is UP" in out.stdout


def _free_port_base() -> int:
    """16 free ports, away from the developer default (17810), the demo (17900) and the tests
    (18000..21200)."""
    return free_port_base(21600, 100, what="the bench's cluster")


def _dev_script(action: str, env: dict[str, str], timeout: float) -> None:
    out = dev_script(action, env, timeout)
    if out.returncode != 0:
        raise RuntimeError(f"dev-cluster.sh {action} failed ({out.returncode}):\n"
                           f"{out.stderr[-3000:]}")


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def dev_cluster() -> Iterator[Cluster]:
    """The cluster at $SLURM_CONF / $HADAR_DEVCLUSTER_DIR when it answers, else one of our own,
    stopped at the end whatever happens."""
    devdir = os.environ.get("HADAR_DEVCLUSTER_DIR")
    candidates = [Path(p) for p in (os.environ.get("SLURM_CONF"),
                                    devdir and f"{devdir}/etc/slurm.conf") if p]
    for conf in candidates:
        if _answers(conf):
            print(f"using the running cluster at {conf}")
            yield Cluster(conf, SlurmRunner(conf, timeout=60), None)
            return
    if os.geteuid() != 0:
        raise SystemExit("no dev cluster answers and starting one needs root "
                         "(slurm_conf/dev-cluster.sh); run as root or set SLURM_CONF")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADAR_DEVCLUSTER_")}
    env["HADAR_DEVCLUSTER_DIR"] = devdir or BENCH_DIR
    env["HADAR_DEVCLUSTER_PORT"] = os.environ.get("HADAR_DEVCLUSTER_PORT") or str(
        _free_port_base())
    env["HADAR_DEVCLUSTER_LUA"] = "1"
    conf = Path(env["HADAR_DEVCLUSTER_DIR"]) / "etc" / "slurm.conf"
    old_term = signal.signal(signal.SIGTERM, _terminate)  # SIGTERM runs the finally too
    try:
        print(f"starting a dev cluster in {env['HADAR_DEVCLUSTER_DIR']} "
              f"(ports from {env['HADAR_DEVCLUSTER_PORT']})", flush=True)
        _dev_script("up", env, timeout=300)
        yield Cluster(conf, SlurmRunner(conf, timeout=60), env)
    finally:
        # Ctrl-C or SIGTERM now would kill dev-cluster.sh halfway through `down` and leave
        # daemons behind: both are ignored until it is done (the script inherits that).
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            print("stopping the bench's dev cluster", flush=True)
            _dev_script("down", env, timeout=180)
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)


# -- jobs --------------------------------------------------------------------------------------


def all_jobs(cluster: Cluster) -> tuple[SlurmJob, ...]:
    return parse_squeue_json(cluster.runner.run(commands.squeue_json()).stdout)


def cancel_bench_jobs(cluster: Cluster, timeout: float = 120.0,
                      ours: Callable[[SlurmJob], bool] = lambda j: j.name == JOB_NAME) -> None:
    """Cancel every job of a bench (``ours``: by default this one's, by name) and wait until
    none is active."""
    end = time.monotonic() + timeout
    while True:
        active = [j.job_id for j in all_jobs(cluster)
                  if ours(j) and j.state in UNFINISHED_STATES]
        if not active:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"bench jobs still active after {timeout:g} s: {active[:20]}")
        cluster.runner.run(commands.scancel(active), check=False)
        time.sleep(1.0)


def submit_jobs(cluster: Cluster, n: int) -> list[int]:
    def one(k: int) -> int:
        hints, gpus = MIX[k % len(MIX)]
        argv = commands.sbatch(wrap="sleep 600", job_name=JOB_NAME, gres=f"gpu:{gpus}",
                               comment=f"hadar: {hints}", output="/dev/null")
        return parse_sbatch_parsable(cluster.runner.run(argv).stdout)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, range(n)))


def wait_pending(cluster: Cluster, ids: list[int], timeout: float = 120.0) -> int:
    """Wait until every job of ``ids`` is visible and PENDING; returns the jobs visible."""
    want = set(ids)
    end = time.monotonic() + timeout
    while True:
        jobs = all_jobs(cluster)
        pending = {j.job_id for j in jobs if j.job_id in want and j.state == "PENDING"}
        if pending == want:
            return len(jobs)
        if time.monotonic() > end:
            raise RuntimeError(f"only {len(pending)} of {len(want)} jobs PENDING after "
                               f"{timeout:g} s")
        time.sleep(0.5)


# -- one measurement ---------------------------------------------------------------------------


def epoch_figures(sidecar: Sidecar, wall: float, slept: float) -> dict[str, Any]:
    st = sidecar.backend.stats
    rec = sidecar.loop.records[-1]
    kinds: dict[str, int] = {}
    for entry in st.applied:
        kinds[str(entry["action"])] = kinds.get(str(entry["action"]), 0) + 1
    return {
        "epoch_s": st.read_s + rec.decision_s + st.apply_s,
        "epoch_wall_s": wall,
        "read_s": st.read_s,
        "decide_s": rec.decision_s,
        "apply_s": st.apply_s,
        "grace_wait_s": slept,
        "slurm_commands": st.commands_read + st.commands_apply,
        "commands_read": st.commands_read,
        "commands_apply": st.commands_apply,
        "placed": rec.num_placed,
        "hadar_jobs": rec.num_jobs,
        "jobs_visible": len(sidecar.backend.jobs),
        "actions": kinds,
    }


def measure_once(cluster: Cluster, n: int, workdir: Path, run: int) -> dict[str, Any]:
    cancel_bench_jobs(cluster)
    t0 = time.perf_counter()
    ids = submit_jobs(cluster, n)
    submit_s = time.perf_counter() - t0
    wait_pending(cluster, ids)

    state = workdir / f"state-{n}-{run}"
    config = load_config(str(DEV_CONFIG)).with_overrides(
        slurm_conf=str(cluster.conf), policy="hadar", state_dir=str(state),
        log_file=str(workdir / f"sidecar-{n}-{run}.log"))
    sidecar = Sidecar(config)
    # The preemption grace period is a deliberate wait, not overhead: count it apart.
    slept = [0.0]
    wait = sidecar.stop.wait

    def timed_wait(seconds: float) -> object:
        s0 = time.perf_counter()
        out = wait(seconds)
        slept[0] += time.perf_counter() - s0
        return out

    sidecar.backend.applier._sleep = timed_wait
    sidecar.loop.epoch = sidecar.recover_epoch()  # what Sidecar.run does first (not timed)
    out: dict[str, Any] = {"pending_jobs": n, "run": run, "submit_s": submit_s}
    placed_first: set[object] = set()
    for prefix, epochs in (("", 1), ("steady_", 2)):
        sidecar.max_epochs = epochs  # the loop does not wait for the next epoch after it
        slept[0] = 0.0
        t0 = time.perf_counter()
        sidecar.loop.run_epoch(full=True)  # (the steady one too: a re-plan of every job)
        wall = time.perf_counter() - t0
        out.update({prefix + k: v for k, v in epoch_figures(sidecar, wall, slept[0]).items()})
        if not prefix:
            placed_first = {a["job"] for a in sidecar.backend.stats.applied
                            if a["action"] == "place"}
    # Jobs the first epoch placed and released that the steady epoch stopped or held again: a
    # sign that Slurm started them between the epoch's squeue and sinfo reads (their GPUs then
    # look taken by jobs that are not the sidecar's).
    out["steady_undone"] = sum(1 for a in sidecar.backend.stats.applied
                               if a["action"] in ("hold", "signal") and a["job"] in placed_first)

    # The read, split: squeue --json and sinfo --json once more, command and parsing apart.
    t0 = time.perf_counter()
    text = cluster.runner.run(commands.squeue_json()).stdout
    t1 = time.perf_counter()
    parse_squeue_json(text)
    t2 = time.perf_counter()
    nodes_text = cluster.runner.run(commands.sinfo_json()).stdout
    t3 = time.perf_counter()
    parse_sinfo_json(nodes_text)
    out.update(squeue_cmd_s=t1 - t0, squeue_parse_s=t2 - t1,
               squeue_kb=len(text.encode()) / 1024, sinfo_cmd_s=t3 - t2,
               sinfo_parse_s=time.perf_counter() - t3)
    cluster.runner.run(commands.scancel(ids), check=False)
    return out


NUMERIC = ("submit_s", "epoch_s", "epoch_wall_s", "read_s", "decide_s", "apply_s",
           "grace_wait_s", "slurm_commands", "commands_read", "commands_apply", "placed",
           "hadar_jobs", "jobs_visible", "undone", "squeue_cmd_s", "squeue_parse_s", "squeue_kb",
           "sinfo_cmd_s", "sinfo_parse_s")


def summarize(n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs; reads as a list (each run's), so a non-constant count shows."""
    row: dict[str, Any] = {"pending_jobs": n, "repeats": len(runs)}
    for prefix in ("", "steady_"):
        for key in NUMERIC:
            name = prefix + key
            if name in runs[0]:
                value = statistics.median(float(r[name]) for r in runs)
                if name.endswith(("_s", "_kb")):
                    row[name] = round(value, 4)
                else:
                    row[name] = int(value) if value.is_integer() else value
        row[prefix + "commands_read_each"] = [r[prefix + "commands_read"] for r in runs]
        row[prefix + "actions_each"] = [r[prefix + "actions"] for r in runs]
    row["epoch_wall_s_max"] = round(max(r["epoch_wall_s"] for r in runs), 4)
    row["steady_undone_each"] = [r["steady_undone"] for r in runs]
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'pending':>7s} {'epoch s':>8s} {'wall s':>7s} {'read s':>7s} {'decide s':>8s} "
            f"{'apply s':>7s} {'cmds':>5s} {'reads':>5s} {'placed':>6s} | {'steady s':>8s} "
            f"{'wall s':>7s} {'cmds':>5s} {'reads':>5s} {'undone':>6s} | {'visible':>7s} "
            f"{'squeue s':>8s} {'parse s':>7s} {'sinfo s':>7s}")
    print(head)
    for r in rows:
        print(f"{r['pending_jobs']:7d} {r['epoch_s']:8.3f} {r['epoch_wall_s']:7.3f} "
              f"{r['read_s']:7.3f} {r['decide_s']:8.4f} {r['apply_s']:7.3f} "
              f"{r['slurm_commands']:5g} {r['commands_read']:5g} {r['placed']:6g} | "
              f"{r['steady_epoch_s']:8.3f} {r['steady_epoch_wall_s']:7.3f} "
              f"{r['steady_slurm_commands']:5g} {r['steady_commands_read']:5g} "
              f"{r['steady_undone']:6g} | {r['jobs_visible']:7g} {r['squeue_cmd_s']:8.3f} "
              f"{r['squeue_parse_s']:7.3f} {r['sinfo_cmd_s']:7.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="50,200,500",
                    help="pending jobs per case, comma-separated (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per size (default: 3)")
    ap.add_argument("--json", default="bench/results/epoch_overhead.json",
                    help="where to write rows (default: %(default)s)")
    ap.add_argument("--keep", metavar="DIR", type=Path,
                    help="keep each run's sidecar log and state directory in DIR (default: "
                    "a temporary directory, removed)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.replace(" ", ",").split(",") if s]
    except ValueError:
        ap.error(f"--sizes: want comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        ap.error("--sizes must be positive and --repeats at least 1")

    rows: list[dict[str, Any]] = []
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hadar-bench-epoch.") as tmp, \
            dev_cluster() as cluster:
        try:
            for n in sizes:
                runs = []
                for run in range(args.repeats):
                    r = measure_once(cluster, n, args.keep or Path(tmp), run)
                    runs.append(r)
                    print(f"  N={n} run {run}: epoch {r['epoch_s']:.3f} s (wall "
                          f"{r['epoch_wall_s']:.3f}: read {r['read_s']:.3f} decide "
                          f"{r['decide_s']:.4f} apply {r['apply_s']:.3f}), "
                          f"{r['slurm_commands']} commands ({r['commands_read']} reads), "
                          f"placed {r['placed']}; steady {r['steady_epoch_s']:.3f} s, "
                          f"{r['steady_slurm_commands']} commands; submit {r['submit_s']:.1f} s",
                          flush=True)
                rows.append(summarize(n, runs))
        finally:
            cancel_bench_jobs(cluster)
    print()
    print_table(rows)
    for r in rows:
        reads = set(r["commands_read_each"]) | set(r["steady_commands_read_each"])
        if reads != {2}:
            print(f"NOTE: reads per epoch at {r['pending_jobs']} jobs: {sorted(reads)}, not 2")
        if any(r["steady_undone_each"]):
            print(f"NOTE: at {r['pending_jobs']} jobs the steady epoch held or signaled jobs the "
                  f"first epoch had placed ({r['steady_undone_each']} per run): it saw a "
                  "different cluster than the first (see the sidecar logs: --keep DIR)")
    big = [r for r in rows if r["pending_jobs"] >= 500]
    for r in big:
        verdict = "meets" if r["epoch_wall_s"] < GOAL_S else "MISSES"
        print(f"goal (< {GOAL_S:g} s at {r['pending_jobs']} pending jobs): {verdict} "
              f"(median wall {r['epoch_wall_s']:.3f} s)")
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
