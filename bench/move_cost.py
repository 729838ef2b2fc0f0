"""What moving a running job really costs on Slurm: from the checkpoint signal to the job running
again on its new node, measured on the real dev cluster.

    python -m bench.move_cost [--repeats 8] [--grace 30] [--checkpoint-s 1] [--fork-repeats 8]
                              [--json bench/results/move_cost.json]

(``--repeats 0`` or ``--fork-repeats 0`` runs one part alone; the other keeps its rows in the
``--json`` file.)

Needs root and Debian's Slurm (``make deps``); uses the dev cluster that answers at
``$SLURM_CONF`` or starts its own and stops it again (as ``bench.epoch_overhead`` does).

Each repeat submits one hadar job (``preempt=checkpoint``) whose payload, on the checkpoint
signal, spends ``--checkpoint-s`` seconds "checkpointing" and exits 75 (as
:mod:`hadar_slurm.runtime` does), lets the sidecar (in this process, ``slurm_conf/dev-sidecar
.toml``, policy ``hadar``, grace ``--grace`` s) place it, waits until it runs, drains its node
and runs one epoch: the policy moves the job, the sidecar signals it, waits for it to leave,
and places it on its new node in the same epoch.  The repeats begin that epoch at evenly
spread points of a second (``phase``): how long a moved job waits to start depends on it.
Times, from the signal (all wall clock):

* ``exit_s``: the payload's exit after its checkpoint;
* ``placed_s``: the sidecar's placement on the new node (the end of its work for the move);
* ``start_s``: Slurm's start of the job on the new node (its ``StartTime``, 1 s resolution);
* ``running_s``: the payload's first line on the new node (the job runs again): **the move
  cost**, i.e. the progress a move loses besides what the job's checkpoint itself loses;
* ``apply_s``: the moving epoch's apply (the grace, the requeue, the placement);
* ``first_start_s`` (not from the signal): the job's first placement to its payload's first
  line, i.e. what a start costs besides the payload's own start.

A job slurmctld has just requeued gets a begin time some seconds ahead (about 10 s on the dev
cluster); the sidecar places it with ``StartTime=now+N``, two whole seconds after the second
it left (:func:`hadar_slurm.sidecar.apply.start_time`), without which ``start_s`` was 11.9 s.

The median ``running_s`` is what ``[scheduler] migration_s`` should be (the sidecar tells the
policy, and ``simulate`` charges, that many seconds per move): see ``docs/architecture.md``.

**Forks** (``--fork-repeats``, HadarE): Slurm starts a heterogeneous job only from its backfill
scheduler, never from the main one, so a fork waits for the next backfill cycle (``bf_interval``
is 1 s on the dev cluster).  Each repeat submits, at once, heterogeneous jobs rendered as the
sidecar renders its forks (:func:`hadar_slurm.slurm.hetjob.render_hetjob`, two copies of one
GPU each) in two layouts: ``shared``, three forks on the same two nodes, and ``disjoint``, two
forks on two nodes each, no node in common; per fork, in the order they were submitted
(``rank``), ``fork_start_s``: the first submission to the fork's first copy running.
The medians by layout and rank are what :mod:`hadar_slurm.costs` takes
(``SLURM_FORK_START_S``, ``SLURM_FORK_INTERVAL_S``) and the simulator charges.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.epoch_overhead import DEV_CONFIG, Cluster, all_jobs, cancel_bench_jobs, dev_cluster
from bench.report import write_rows
from hadar_slurm.sidecar.config import load_config
from hadar_slurm.sidecar.controller import Sidecar
from hadar_slurm.slurm import SlurmJob, commands
from hadar_slurm.slurm.hetjob import CopySpec, ForkPlan, render_hetjob
from hadar_slurm.slurm.parse import parse_sbatch_parsable

JOB_NAME = "hadar-bench-move"
PAYLOAD = """#!/bin/bash
# bench.move_cost payload: log start/signal/exit with the time; checkpoint and exit 75 on USR1
log="$1/$SLURM_JOB_ID.log"
echo "start $(date +%s.%N) $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
trap 'echo "signal $(date +%s.%N)" >> "$log"; sleep $2; echo "exit $(date +%s.%N)" >> "$log";
      exit 75' USR1
while true; do sleep 1 & wait $!; done
"""


FORK_JOB_NAME = "hadar-bench-fork"
FORK_PAYLOAD = """#!/bin/bash
# bench.move_cost fork payload: log the start of this copy with the time, then end
echo "start $(date +%s.%N) $(hostname) ${HADAR_COPY_INDEX:-0}" >> "$1/fork-$2.log"
sleep 1
"""
#: The forks' nodes by layout: each fork's two copies (one GPU each, the nodes' GPU types).
FORK_LAYOUTS: dict[str, tuple[tuple[tuple[str, str], ...], ...]] = {
    "shared": ((("node1", "v100"), ("node2", "p100")),) * 3,
    "disjoint": ((("node1", "v100"), ("node2", "p100")),
                 (("node3", "k80"), ("node4", "a100"))),
}


def _jobs(cluster: Cluster) -> dict[int, SlurmJob]:
    return {j.job_id: j for j in all_jobs(cluster)}


def _wait(what: str, timeout: float, check: Any) -> Any:
    end = time.monotonic() + timeout
    while True:
        out = check()
        if out:
            return out
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def _log(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def one_move(cluster: Cluster, work: Path, run: int, grace: float,
             checkpoint_s: float, phase: float = 0.0) -> dict[str, Any]:
    """Place one job, drain its node, let one epoch move it (begun at ``phase``, a fraction
    of a second); the times of the move."""
    payload = work / "payload.sh"
    payload.write_text(PAYLOAD)
    out = cluster.runner.run(commands.sbatch(
        script=str(payload), job_name=JOB_NAME, gres="gpu:1", output="/dev/null",
        chdir=str(work), comment="hadar: model=resnet50 bs=64 steps=400000 preempt=checkpoint",
        script_args=[str(work), f"{checkpoint_s:g}"]))
    job_id = parse_sbatch_parsable(out.stdout)
    log = work / f"{job_id}.log"
    config = load_config(str(DEV_CONFIG)).with_overrides(
        slurm_conf=str(cluster.conf), policy="hadar", state_dir=str(work / f"state-{run}"),
        log_file=str(work / f"sidecar-{run}.log"), preempt_grace_s=grace)
    sidecar = Sidecar(config)
    marks: dict[str, float] = {}
    api = sidecar.api
    signal, update = api.signal, api.update_job

    def timed_signal(jid: int, sig: str) -> None:
        marks.setdefault("signal", time.time())
        signal(jid, sig)

    def timed_update(jid: int, fields: Any) -> None:
        update(jid, fields)
        if "NodeList" in fields:
            marks["placed" if "signal" in marks else "first_placed"] = time.time()

    api.signal = timed_signal  # type: ignore[method-assign,assignment]
    api.update_job = timed_update  # type: ignore[method-assign,assignment]
    sidecar.loop.epoch = sidecar.recover_epoch()
    first = ""
    try:
        sidecar.loop.run_epoch()  # places it
        job = _wait("the job to run", 60, lambda: (
            j if (j := _jobs(cluster).get(job_id)) and j.state == "RUNNING" else None))
        first = job.node_names[0]
        _wait("the payload to start", 30, lambda: _log(log))
        cluster.runner.run(["scontrol", "update", f"NodeName={first}", "State=DRAIN",
                            "Reason=bench.move_cost"])
        # the move's times depend on where in a second the job leaves (a moved job starts
        # two whole seconds after that second at the earliest: see sidecar.apply.start_time):
        # the runs spread their signals evenly over the second, as the epochs of a real
        # sidecar fall where they fall
        time.sleep((phase - time.time()) % 1.0)
        # moves it: signal, grace, requeue, placement (a re-plan of every job: within a
        # round of the first epoch, the loop would only fill free GPUs and move nothing)
        sidecar.loop.run_epoch(full=True)
        apply_s = sidecar.backend.stats.apply_s
        moved = _wait("the job to run again", 120, lambda: (
            j if (j := _jobs(cluster).get(job_id)) and j.state == "RUNNING"
            and j.node_names and j.node_names[0] != first else None))
        lines = _wait("the payload to start again", 60, lambda: [
            x for x in _log(log) if x[0] == "start" and x[2] != first])
    finally:
        if first:
            cluster.runner.run(["scontrol", "update", f"NodeName={first}", "State=RESUME"],
                               check=False)
        cluster.runner.run(commands.scancel([job_id]), check=False)
        sidecar.close()
    events = {x[0]: float(x[1]) for x in _log(log) if x[0] in ("signal", "exit")}
    first_start = next(float(x[1]) for x in _log(log) if x[0] == "start")
    sig = marks["signal"]
    row = {
        "run": run, "job": job_id, "from": first, "to": moved.node_names[0],
        "grace_s": grace, "checkpoint_s": checkpoint_s, "phase": round(phase, 3),
        "apply_s": round(apply_s, 3),
        "exit_s": round(events.get("exit", float("nan")) - sig, 3),
        "placed_s": round(marks.get("placed", float("nan")) - sig, 3),
        "start_s": round(float(moved.start_time or 0) - sig, 3),
        "running_s": round(float(lines[0][1]) - sig, 3),
        "first_start_s": round(first_start - marks["first_placed"], 3),
    }
    print(f"  run {run}: job {job_id} {first} -> {row['to']}: exit {row['exit_s']:.2f} s, "
          f"placed {row['placed_s']:.2f} s, Slurm start {row['start_s']:.2f} s, running "
          f"{row['running_s']:.2f} s after the signal (the epoch's apply: {apply_s:.2f} s)",
          flush=True)
    return row


def fork_starts(cluster: Cluster, work: Path, run: int, layout: str,
                phase: float = 0.0) -> list[dict[str, Any]]:
    """Submit the forks of ``layout`` (:data:`FORK_LAYOUTS`) at once, beginning at ``phase``
    (a fraction of a second); per fork, the seconds from the first submission to its first
    copy's start, and from its own."""
    payload = work / "fork-payload.sh"
    payload.write_text(FORK_PAYLOAD)
    scripts = []
    for k, copies in enumerate(FORK_LAYOUTS[layout]):
        plan = ForkPlan(original_job_id=k + 1, job_name=FORK_JOB_NAME,
                        command=("bash", str(payload), str(work), str(k)),
                        copies=tuple(CopySpec(n, t, 1) for n, t in copies),
                        workdir=str(work), tracker_dir=str(work / f"tracker-{k}"),
                        output="/dev/null")
        path = work / f"fork-{k}.sbatch"
        path.write_text(render_hetjob(plan))
        scripts.append(path)
    time.sleep((phase - time.time()) % 1.0)
    submitted = []
    for path in scripts:
        submitted.append(time.time())
        cluster.runner.run(commands.sbatch(script=str(path)))
    logs = [work / f"fork-{k}.log" for k in range(len(scripts))]
    _wait("the forks to start", 60, lambda: all(_log(x) for x in logs))
    cancel_bench_jobs(cluster, ours=lambda j: j.name == FORK_JOB_NAME)
    rows = []
    for k, log in enumerate(logs):
        first = min(float(x[1]) for x in _log(log) if x[0] == "start")
        rows.append({"run": run, "layout": layout, "rank": k, "phase": round(phase, 3),
                     "fork_start_s": round(first - submitted[0], 3),
                     "own_start_s": round(first - submitted[k], 3)})
    print(f"  forks {run} ({layout}): started " + ", ".join(
        f"{r['fork_start_s']:.2f}" for r in rows) + " s after the first submission",
          flush=True)
    return rows


def fork_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layout and rank, the median ``fork_start_s``."""
    out = []
    for layout in FORK_LAYOUTS:
        for rank in sorted({r["rank"] for r in rows if r["layout"] == layout}):
            v = [r["fork_start_s"] for r in rows if r["layout"] == layout
                 and r["rank"] == rank]
            out.append({"run": "median", "layout": layout, "rank": rank,
                        "fork_start_s": round(statistics.median(v), 3), "forks": len(v)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.move_cost", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--grace", type=float, default=30.0, help="preempt_grace_s (s)")
    p.add_argument("--checkpoint-s", type=float, default=1.0,
                   help="seconds the payload takes to checkpoint on the signal")
    p.add_argument("--fork-repeats", type=int, default=8,
                   help="repeats of each fork layout (0: no forks)")
    # (with --repeats 0 or --fork-repeats 0, the part not run keeps its rows in --json's file)
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    forks: list[dict[str, Any]] = []
    with dev_cluster() as cluster, tempfile.TemporaryDirectory(prefix="hadar-move-") as tmp:
        Path(tmp).chmod(0o755)
        for run in range(args.repeats):
            work = Path(tmp) / f"run{run}"
            work.mkdir()
            rows.append(one_move(cluster, work, run, args.grace, args.checkpoint_s,
                                 phase=(run + 0.5) / args.repeats))
        for run in range(args.fork_repeats):
            for layout in FORK_LAYOUTS:
                work = Path(tmp) / f"fork{run}-{layout}"
                work.mkdir()
                forks += fork_starts(cluster, work, run, layout,
                                     phase=(run + 0.5) / args.fork_repeats)
    keys = ("exit_s", "placed_s", "start_s", "running_s", "apply_s", "first_start_s")
    summary: list[dict[str, Any]] = []
    if rows:
        summary = [{"run": "median", **{k: round(statistics.median(r[k] for r in rows), 3)
                                        for k in keys}}]
        print()
        print(f"{'':8s} " + " ".join(f"{k:>10s}" for k in keys))
        for r in [*rows, *summary]:
            print(f"{r['run']!s:8s} " + " ".join(f"{r[k]:10.2f}" for k in keys))
        print(f"\nmove cost (signal to running on the new node), median of {len(rows)}: "
              f"{summary[0]['running_s']:.1f} s")
    fork_rows = fork_summary(forks) if forks else []
    if fork_rows:
        print("\nforks: first submission to the fork's first copy running (median, s)")
        for r in fork_rows:
            print(f"  {r['layout']:8s} rank {r['rank']}: {r['fork_start_s']:.2f} "
                  f"({r['forks']} forks)")
    if args.json is not None:
        moves_part, forks_part = [*rows, *summary], [*forks, *fork_rows]
        if args.json.exists() and not (moves_part and forks_part):
            # A part not run (--repeats 0 or --fork-repeats 0) keeps its rows in the file.
            kept = json.loads(args.json.read_text())
            moves_part = moves_part or [r for r in kept if "layout" not in r]
            forks_part = forks_part or [r for r in kept if "layout" in r]
            print(f"(kept the {'moves' if not rows else 'forks'}' rows of {args.json})")
        write_rows([*moves_part, *forks_part], str(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
