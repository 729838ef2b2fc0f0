"""A bounded soak of the sidecar on the real dev cluster: two users, hundreds of jobs, faults.

    python -m bench.soak [--jobs 200] [--duration 240] [--seed 11] [--quick]
                         [--epoch-seconds 12] [--grace 3] [--drain-timeout 600]
                         [--users nobody,NAME] [--out bench/results/soak.json] [--keep]

Needs root and Debian's Slurm (``make deps``).  It starts its own private dev cluster
(``slurm_conf/dev-cluster.sh up`` with job_submit.lua, in a private directory under /tmp, on free
loopback ports) and always stops it again, also on an error, Ctrl-C or SIGTERM.  The sidecar is
the real ``hadar-slurm run`` process (policy hadar, short epochs and grace, a JSON log file and a
private state_dir), restarted like a service would be whenever it dies.

The workload (``--jobs``, spread over the first 70% of ``--duration``) is submitted with sbatch
by two ordinary users (``nobody`` and a second unprivileged account: the first of uid 1000..59999
in /etc/passwd, else ``hadarsoak``, created with ``useradd --system`` and said so), each from a
working directory of its own:

* hadar jobs with valid hints (several models, batch sizes and GPU counts);
* plain GPU jobs, typed or not, that the sidecar must leave alone;
* hostile submissions: bad hints, huge numbers (400 nines), ``hadar-copy-of=<another user's
  job>`` on a plain job, ``--hold`` and ``scontrol hold`` jobs that must stay held until their
  user releases them (the soak releases them as that user some epochs later; then they must
  complete), odd job names, arguments and hint spellings (a shell injection in them would create
  a sentinel file, which must never appear).

Every job runs the same POSIX sh payload: SECS one-second steps, checkpointed in a file, resumed
from there after a requeue; one line per start, checkpoint signal and finish in a log of its own,
so a job that ran to its end twice shows two ``done`` lines (a run stopped between its last step
and its ``done`` line leaves the next run to log ``already``: that is once too).

Payload modes: ``ckpt`` (exits 75 on the checkpoint signal, as the training runtime does; hint
``preempt=checkpoint``), ``ignore`` (logs the signal, goes on; ``preempt=requeue``), ``die`` (no
trap: the signal kills it; no ``preempt`` hint, or a false ``preempt=checkpoint``).

Faults, at seeded random times during ``--duration`` (every kind once per round, in a shuffled
order; shorter with --quick): SIGKILL of the sidecar (restarted 0-5 s later), slurmctld stopped
(SIGSTOP 20-40 s, then SIGCONT), slurmctld restarted (``dev-cluster.sh restart-ctld``), a node
set DOWN (its jobs are requeued; with ReturnToService=2 it is back at once) or DRAIN for 10-30 s,
then ``State=RESUME``; a second ``hadar-slurm run --dry-run`` on the same state_dir, which must
refuse to start (one clear line, no traceback); the next launch on any node made to fail (the
dev cluster's fault-drill prolog, for 10-30 s or until a launch takes it: slurmd drains that node
and slurmctld requeues the job held, "launch failed requeued held"; a hadar job the sidecar
placed must be placed anew by it, any other is released by the soak as an admin would, and the
node resumed).  Submissions and releases wait while slurmctld
is stopped or restarting.

Slurm 22.05 itself loses the GPUs of jobs it starts right after a slurmctld restart (before the
nodes registered again; reproduced without the sidecar): once those jobs end their node is IDLE
with GresUsed > 0 and jobs wait for Resources forever.  The soak looks for such nodes every few
polls and clears them with ``scontrol reconfigure``, and reports how often.

Job states are tracked all along (``squeue --json`` every few seconds: finished jobs vanish after
MinJobAge=300 s).  After ``--duration`` the faults stop and the soak waits (at most
``--drain-timeout``) until every job has ended, then reports: jobs submitted / refused at submit /
completed exactly once / ran twice / lost (FAILED, CANCELLED, ..., vanished) / still held or
pending; user holds the sidecar broke; the faults done; tracebacks in the sidecar's stderr and
JSON log; with evidence for every failure (job ids, states over time, the job's log lines, the
sidecar's events on it, traceback excerpts).  The result goes to ``--out`` as JSON.

Exit status: 0 when the result is clean (every job completed exactly once or was refused at
submit, no valid job refused, none held or pending at the end, no user hold broken, no sidecar
crash or traceback), 1 when not, 2 when the harness itself could not run.  ``--quick``: 40 jobs,
90 s of faults, 10 s epochs (the setting of tests/test_soak_cluster.py).  ``--keep`` keeps the
private directory (logs, job logs, the cluster's logs); it is also kept when the result is not
clean.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import pwd
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench.devcluster import dev_script, free_port_base
from hadar_slurm.sidecar.observe import launch_failed, relaunchable
from hadar_slurm.sidecar.record import decode
from hadar_slurm.slurm import (
    RunAs,
    SlurmError,
    SlurmJob,
    SlurmRunner,
    commands,
    parse_sbatch_parsable,
    parse_squeue_json,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results" / "soak.json"
THROUGHPUTS = REPO / "slurm_conf" / "dev-throughputs.csv"
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "PREEMPTED"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "COMPLETED"})
TRANSIENT = ("timed out", "Unable to contact", "Connection refused", "Zero Bytes",
             "Socket timed out", "Communication connection failure", "Transport endpoint")
SECOND_USER = "hadarsoak"
TRACEBACK = "Traceback (most recent call last)"

PAYLOAD = """#!/bin/sh
# soak payload: $2 one-second steps of "work", checkpointed in $1/$SLURM_JOB_ID.ckpt and resumed
# from there; $3: ckpt (exit 75 on USR1), ignore (log USR1, go on), die (no trap).
log="$1/$SLURM_JOB_ID.log"
ckpt="$1/$SLURM_JOB_ID.ckpt"
secs=$2
n=$(cat "$ckpt" 2>/dev/null)
case $n in ''|*[!0-9]*) n=0 ;; esac
echo "start $(hostname) ${SLURM_RESTART_COUNT:-0} $n" >> "$log"
if [ "$n" -ge "$secs" ]; then
  echo "already $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
  exit 0
fi
case $3 in
  ckpt) trap 'echo "signal $(hostname) ${SLURM_RESTART_COUNT:-0} ckpt" >> "$log"; exit 75' USR1 ;;
  ignore) trap 'echo "signal $(hostname) ${SLURM_RESTART_COUNT:-0} ignore" >> "$log"' USR1 ;;
esac
while [ "$n" -lt "$secs" ]; do
  sleep 1 & wait $!
  n=$((n + 1))
  echo "$n" > "$ckpt"
done
echo "done $(hostname) ${SLURM_RESTART_COUNT:-0}" >> "$log"
"""

# (hints, GPUs) of valid hadar jobs: every model, 1 to 8 GPUs.
VALID: tuple[tuple[str, int], ...] = (
    ("model=resnet50 bs=64 steps=1000", 1),
    ("model=resnet50 bs=32 steps=2000", 2),
    ("model=resnet50 bs=128 steps=8000", 4),
    ("model=resnet18 bs=128 steps=3000", 2),
    ("model=resnet18 bs=64 steps=500", 1),
    ("model=transformer bs=32 steps=1500 sync=false", 1),
    ("model=transformer bs=128 steps=2500", 2),
    ("model=lm bs=20 steps=5000", 1),
    ("model=lm bs=80 steps=10000 weight=2", 4),
    ("model=recommendation bs=512 steps=900", 1),
    ("model=recommendation bs=2048 steps=500", 1),
    ("model=a3c steps=1200", 1),
    ("model=cyclegan steps=300", 1),
    ("model=resnet18 bs=256 steps=6000", 8),
)
# Plain jobs: (gres, constraint)
PLAIN: tuple[tuple[str, str | None], ...] = (
    ("gpu:1", None), ("gpu:k80:1", None), ("gpu:2", "a100"), ("gpu:v100:1", None),
    ("gpu:p100:2", None),
)
NINES = "9" * 400
BAD_HINTS: tuple[str, ...] = (
    "hadar: model=nosuch steps=100",
    "hadar: model=resnet50 bs=7 steps=100",
    "hadar: model=resnet50 bs=64 steps=-5",
    "hadar: model=resnet50 bs=64 steps=1e400",
    "hadar: model=resnet50 bs=64 steps=nan",
    "hadar: model=resnet50 bs=64 steps=100 weight=inf",
    "hadar: model=resnet50 bs=64 steps=100 fork=99999999999999999999",
    "hadar: ",
    "hadar: model=resnet50 bs=64 steps=100 model=lm",
    "hadar: model=resnet50 bs=64 steps=0x10",
    "hadar: model=resnet50 bs=64 steps=100 colour=blue",
)
HUGE_HINTS: tuple[str, ...] = (
    f"hadar: model=resnet50 bs=64 steps={NINES}",
    f"hadar: model=lm bs=20 steps=1000 weight={NINES}",
    f"hadar: model=resnet50 bs={NINES} steps=1000",
    f"hadar: model=transformer bs=32 steps={'9' * 5000}",
    f"hadar: model=resnet50 bs=64 steps=1000 fork={NINES}",
    "hadar: model=resnet50 bs=64 steps=1" + "0" * 308,
)


# -- options -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    jobs: int = 200
    duration_s: float = 240.0
    seed: int = 11
    epoch_s: float = 12.0
    grace_s: float = 3.0
    finish_poll_s: float = 4.0
    drain_timeout_s: float = 600.0
    poll_s: float = 3.0
    users: tuple[str, ...] = ()
    out: Path | None = DEFAULT_OUT
    keep: bool = False
    policy: str = "hadar"
    ctld_stop_s: tuple[float, float] = (20.0, 40.0)  # SIGSTOP lasts this long (uniform)
    node_s: tuple[float, float] = (10.0, 30.0)  # a node stays DOWN/DRAIN this long
    gap_s: tuple[float, float] = (5.0, 15.0)  # between two faults
    long_s: tuple[int, int] = (20, 50)  # a third of the hadar jobs run this long (preemptions)


def quick_options(**over: Any) -> Options:
    """The ``--quick`` settings: 40 jobs, 90 s of faults (each kind once: shorter stops, node
    faults and gaps), 10 s epochs."""
    base: dict[str, Any] = dict(jobs=40, duration_s=90.0, epoch_s=10.0, drain_timeout_s=150.0,
                                poll_s=2.5, ctld_stop_s=(20.0, 25.0), node_s=(10.0, 15.0),
                                gap_s=(3.0, 6.0), long_s=(20, 35))
    base.update(over)
    return Options(**base)


# -- users ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    dir: Path  # working directory (owned by the user)

    @property
    def out(self) -> Path:
        return self.dir / "out"

    def runas(self) -> RunAs:
        return RunAs(self.uid, self.gid, (), {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                              "HOME": str(self.dir), "USER": self.name})


def pick_users(names: tuple[str, ...], say: Callable[[str], None]) -> list[tuple[str, int, int]]:
    """Two ordinary accounts: ``names`` when given, else nobody and the first account of uid
    1000..59999 in /etc/passwd, else ``hadarsoak`` (created with useradd --system)."""
    if names:
        out = []
        for n in names:
            p = pwd.getpwnam(n)
            out.append((p.pw_name, p.pw_uid, p.pw_gid))
        if len(out) != 2 or out[0][1] == out[1][1] or 0 in (out[0][1], out[1][1]):
            raise SystemExit("--users needs two different non-root accounts")
        return out
    first = pwd.getpwnam("nobody")
    others = sorted((p for p in pwd.getpwall() if 1000 <= p.pw_uid < 60000),
                    key=lambda p: p.pw_uid)
    if others:
        second = others[0]
    else:
        try:
            second = pwd.getpwnam(SECOND_USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                            "/usr/sbin/nologin", SECOND_USER], check=True, timeout=60)
            say(f"created the system account {SECOND_USER} (useradd --system) for the soak")
            second = pwd.getpwnam(SECOND_USER)
    return [(first.pw_name, first.pw_uid, first.pw_gid),
            (second.pw_name, second.pw_uid, second.pw_gid)]


# -- the plan ------------------------------------------------------------------------------


@dataclass
class Spec:
    key: int
    at: float  # seconds after the start
    user: int  # 0 or 1
    kind: str  # hadar plain bad_hint huge copy_of hold user_hold odd
    comment: str | None
    gres: str
    constraint: str | None
    secs: int
    mode: str  # ckpt ignore die
    name_suffix: str = ""
    hold: bool = False
    extra_args: tuple[str, ...] = ()
    release_after: float = 0.0  # hold kinds: the user releases it this long after submitting

    @property
    def valid(self) -> bool:
        """A submission that must be accepted (not refused at submit)."""
        return self.kind in ("hadar", "plain", "hold", "user_hold", "odd", "copy_of")


def plan_jobs(opts: Options, rng: random.Random, sentinel: Path) -> list[Spec]:
    specs: list[Spec] = []
    window = max(opts.duration_s * 0.7, 1.0)
    inject = f"$(touch {sentinel}) `touch {sentinel}`; touch {sentinel}"
    kinds = (["hadar"] * 12 + ["plain"] * 4 + ["bad_hint", "huge", "copy_of", "hold",
                                                "user_hold", "odd"])
    for key in range(opts.jobs):
        kind = kinds[key % len(kinds)] if key < len(kinds) else rng.choice(kinds)
        at = round(rng.uniform(0, window), 2)
        user = key % 2
        secs = rng.randint(3, 7)
        if kind == "hadar":
            secs = rng.randint(*opts.long_s) if rng.random() < 0.35 else rng.randint(3, 12)
        mode = rng.choices(("ckpt", "ignore", "die"), (7, 2, 1))[0]
        hints, gpus = rng.choice(VALID)
        # how it may be moved: a checkpointing job says so; one that does not checkpoint may
        # allow a plain requeue; a job without the trap says nothing, or (hostile) claims it
        # checkpoints and dies of the signal
        preempt = {"ckpt": " preempt=checkpoint", "ignore": " preempt=requeue",
                   "die": rng.choice(("", " preempt=checkpoint"))}[mode]
        spec = Spec(key, at, user, kind, f"hadar: {hints}{preempt}", f"gpu:{gpus}", None, secs,
                    mode)
        if kind == "plain":
            spec.gres, spec.constraint = rng.choice(PLAIN)
            spec.comment, spec.mode = None, "die"
        elif kind == "bad_hint":
            spec.comment = rng.choice(BAD_HINTS)
        elif kind == "huge":
            spec.comment = rng.choice(HUGE_HINTS)
        elif kind == "copy_of":
            spec.comment, spec.gres, spec.mode = "hadar-copy-of=@VICTIM@", "gpu:1", "die"
        elif kind in ("hold", "user_hold"):
            spec.hold = kind == "hold"
            spec.release_after = round(rng.uniform(2.5, 4.5) * opts.epoch_s, 1)
        elif kind == "odd":
            spec.name_suffix = rng.choice((f" {inject}", " \"quoted\" 'name' \\ ;|&",
                                           " ünïcödé ☃ \t tab"))
            spec.extra_args = (inject, "--comment=hadar: model=lm", "-1", "' \" \\", "ü☃")
            spec.comment = rng.choice((
                "  HADAR:  model=ResNet-50   bs=64 steps=1_000",
                "hadar: model=resnet50 bs=64 steps=1000 weight=0.5 sync=yes",
                "hadar:model=lm bs=20 steps=100",
            ))
            spec.gres = "gpu:1"
        specs.append(spec)
    specs.sort(key=lambda s: s.at)
    return specs


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str  # sidecar_kill ctld_stop ctld_restart node_down node_drain launch_fail
    hold_s: float  # how long it lasts (stop, node down) or the restart delay (sidecar)
    node: str = ""


def plan_faults(opts: Options, rng: random.Random, nodes: list[str]) -> list[Fault]:
    out: list[Fault] = []
    t = min(15.0, opts.duration_s / 6)
    kinds: list[str] = []
    while True:
        if not kinds:
            kinds = ["sidecar_kill", "ctld_stop", "ctld_restart", "node", "second_sidecar",
                     "launch_fail"]
            rng.shuffle(kinds)
        kind = kinds.pop()
        if kind == "sidecar_kill":
            f = Fault(t, kind, round(rng.uniform(0, 5), 1))
        elif kind == "ctld_stop":
            f = Fault(t, kind, round(rng.uniform(*opts.ctld_stop_s), 1))
        elif kind in ("ctld_restart", "second_sidecar"):
            f = Fault(t, kind, 0.0)
        elif kind == "launch_fail":
            f = Fault(t, kind, round(rng.uniform(*opts.node_s), 1))
        else:
            f = Fault(t, rng.choice(("node_down", "node_drain", "node_drain")),
                      round(rng.uniform(*opts.node_s), 1), rng.choice(nodes))
        if t >= opts.duration_s:
            return out
        out.append(f)
        t += f.hold_s + rng.uniform(*opts.gap_s)


# -- jobs ----------------------------------------------------------------------------------


@dataclass
class Record:
    spec: Spec
    name: str
    job_id: int | None = None
    comment: str | None = None
    submitted_t: float | None = None
    refused: bool = False
    sbatch_error: str = ""  # stderr of a refused or failed sbatch
    submit_error: bool = False  # sbatch failed for another reason than a refusal
    timeline: list[tuple[float, str, str]] = field(default_factory=list)
    last: SlurmJob | None = None
    vanished_t: float | None = None
    hold_t: float | None = None  # the user's hold (or --hold) is in place since
    release_t: float | None = None  # the user released it
    release_result: str = ""
    hold_broken: str = ""  # what showed the hold was not respected

    def observe(self, job: SlurmJob, t: float) -> None:
        self.last = job
        self.vanished_t = None
        held = "held" if job.held else ""
        key = (job.state, f"{job.state_reason}{' ' + held if held else ''}")
        if not self.timeline or self.timeline[-1][1:] != key:
            if len(self.timeline) < 80:
                self.timeline.append((round(t, 1), *key))
        if (self.hold_t is not None and self.release_t is None and not self.hold_broken
                and (job.state in RUNNING or (job.state == "PENDING" and not job.held))):
            self.hold_broken = (f"t={t:.1f}s state={job.state} reason={job.state_reason} "
                                f"admin_comment={job.admin_comment!r} (user hold since "
                                f"t={self.hold_t:.1f}s, not released by the user)")


# -- the sidecar ---------------------------------------------------------------------------


class Supervisor:
    """Runs ``hadar-slurm run`` and restarts it when it dies (as systemd would); the faults
    kill it through :meth:`kill`."""

    def __init__(self, config: Path, workdir: Path, conf: Path, t0: float,
                 say: Callable[[str], None]) -> None:
        self.config, self.workdir, self.conf, self.t0, self.say = config, workdir, conf, t0, say
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0
        self.kills = 0
        self.crashes: list[dict[str, Any]] = []
        self.stderr_files: list[Path] = []

    @staticmethod
    def base_argv() -> list[str]:
        # this Python's hadar_slurm (the checkout's venv, or a chroot's own Python: a venv's
        # entry point there would name an interpreter of the host)
        return [sys.executable, "-m", "hadar_slurm"]

    def _argv(self) -> list[str]:
        return [*self.base_argv(), "run", "--config", str(self.config)]

    def start(self) -> None:
        with self.lock:
            self._start()

    def _start(self) -> None:
        err = self.workdir / f"sidecar-{self.started}.stderr"
        self.stderr_files.append(err)
        env = dict(os.environ, SLURM_CONF=str(self.conf),
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with err.open("wb") as fh:
            self.proc = subprocess.Popen(self._argv(), stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.started += 1

    def check(self) -> None:
        """Restart it if it ended by itself (3 s later, like Restart=always RestartSec=3)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is None:
                return
            rc = self.proc.returncode
            err = self.stderr_files[-1]
            tail = err.read_text(errors="replace")[-3000:] if err.exists() else ""
            t = time.monotonic() - self.t0
            self.crashes.append({"t": round(t, 1), "returncode": rc, "stderr": err.name,
                                 "stderr_tail": tail})
            self.say(f"t={t:.0f}s sidecar exited by itself with {rc}; restarting in 3 s")
            self.proc = None
        time.sleep(3)
        with self.lock:
            if self.proc is None:
                self._start()

    def kill(self, delay: float, stop: threading.Event) -> None:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
                self.kills += 1
            self.proc = None
        stop.wait(delay)
        with self.lock:
            if self.proc is None:
                self._start()

    def stop(self) -> int | None:
        """SIGTERM, 30 s, then SIGKILL; its exit status (None when none was running)."""
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
                return -9999  # it did not stop on SIGTERM
        return proc.returncode


# -- the soak ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoakCluster:
    dir: Path  # the dev cluster's state dir (HADAR_DEVCLUSTER_DIR)
    env: dict[str, str]  # dev-cluster.sh's environment (dir, port)
    runner: SlurmRunner

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"


def cluster_nodes(cluster: SoakCluster) -> list[str]:
    out = cluster.runner.run(["sinfo", "--noheader", "--Node", "--format=%N"])
    return sorted(set(out.stdout.split()))


class Soak:
    def __init__(self, opts: Options, cluster: SoakCluster, workdir: Path,
                 say: Callable[[str], None]) -> None:
        self.opts, self.cluster, self.workdir, self.say = opts, cluster, workdir, say
        self.runner = SlurmRunner(cluster.conf, timeout=30)
        self.rng = random.Random(opts.seed)
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self.stop = threading.Event()  # stops faults and submissions
        self.done = threading.Event()  # stops the poller
        self.ctld_ok = threading.Event()
        self.ctld_ok.set()
        self.lock = threading.Lock()
        self.sentinel = workdir / "INJECTED"
        # (the private directory's random suffix: a soak run again on the same cluster, whose
        # finished jobs squeue still lists, must not adopt the last run's jobs by name)
        self.prefix = f"soak{os.getpid()}{workdir.name.rsplit('-', 1)[-1]}-"
        self.records: list[Record] = []
        self.by_id: dict[int, Record] = {}
        self.faults_done: list[dict[str, Any]] = []
        self.harness_errors: list[str] = []
        self.poll_errors = 0
        self.ctld_stopped_pid: int | None = None
        self.nodes_changed: set[str] = set()
        self.users: list[User] = []
        self.supervisor: Supervisor | None = None
        self.config = workdir / "sidecar.toml"
        self.log = workdir / "sidecar.log"
        self.second_runs: list[dict[str, Any]] = []
        self.gres_suspect: set[str] = set()
        self.gres_leaks: list[dict[str, Any]] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- setup
    def setup(self) -> None:
        for name, uid, gid in pick_users(self.opts.users, self.say):
            d = self.workdir / "users" / name
            (d / "out").mkdir(parents=True)
            (d / "payload.sh").write_text(PAYLOAD)
            (d / "payload.sh").chmod(0o755)
            for p in (d, d / "out", d / "payload.sh"):
                os.chown(p, uid, gid)
            self.users.append(User(name, uid, gid, d))
        (self.workdir / "users").chmod(0o755)
        log = self.log
        self.config.write_text(
            "[slurm]\n"
            f'conf = "{self.cluster.conf}"\n'
            "command_timeout_s = 20\n"
            "[scheduler]\n"
            f'policy = "{self.opts.policy}"\n'
            f"epoch_seconds = {self.opts.epoch_s:g}\n"
            f"preempt_grace_s = {self.opts.grace_s:g}\n"
            f"finish_poll_s = {self.opts.finish_poll_s:g}\n"
            f'throughputs = ["{THROUGHPUTS}"]\n'
            "[sidecar]\n"
            f'state_dir = "{self.workdir / "state"}"\n'
            'log_format = "json"\n'
            f'log_file = "{log}"\n')

    # -- submissions
    def submit(self, rec: Record) -> None:
        spec = rec.spec
        user = self.users[spec.user]
        comment = spec.comment
        if comment is not None and "@VICTIM@" in comment:
            with self.lock:  # another user's hadar job, a live one when there is one
                other = [r for r in self.records
                         if r.spec.user != spec.user and r.spec.kind == "hadar" and r.job_id]
                live = [r for r in other if r.last is None or r.last.state not in FINAL]
            victim = (live or other)[-1].job_id if other else 1
            comment = comment.replace("@VICTIM@", str(victim))
        rec.comment = comment
        argv = commands.sbatch(
            script=str(user.dir / "payload.sh"), job_name=rec.name, gres=spec.gres,
            constraint=spec.constraint, comment=comment, hold=spec.hold, chdir=str(user.dir),
            output=str(user.out / "slurm-%j.out"), time_limit="10",
            script_args=[str(user.out), str(spec.secs), spec.mode, *spec.extra_args])
        try:
            out = self.runner.run(argv, as_user=user.runas(), check=False, timeout=40)
        except SlurmError as exc:
            rec.submit_error, rec.sbatch_error = True, str(exc)[-500:]
            return
        t = self.now()
        if out.returncode == 0:
            with self.lock:
                rec.job_id = parse_sbatch_parsable(out.stdout)
                rec.submitted_t = t
                self.by_id[rec.job_id] = rec
            if spec.hold:
                rec.hold_t = t
            if spec.kind == "user_hold":
                self.as_user(rec, "hold")
        elif any(s in out.stderr for s in TRANSIENT):
            rec.submit_error, rec.sbatch_error = True, out.stderr.strip()[-500:]
        else:
            rec.refused, rec.sbatch_error = True, out.stderr.strip()[-500:]

    def as_user(self, rec: Record, what: str) -> None:
        """``scontrol hold|release JOB`` as the job's user."""
        assert rec.job_id is not None
        user = self.users[rec.spec.user]
        argv = (commands.scontrol_hold if what == "hold" else commands.scontrol_release)(
            rec.job_id)
        if what == "release":
            rec.release_t = self.now()  # from now on the job may run: the user let it go
        try:
            out = self.runner.run(argv, as_user=user.runas(), check=False, timeout=40)
            result = f"rc={out.returncode} {out.stderr.strip()[-300:]}".strip()
            ok = out.returncode == 0
        except SlurmError as exc:
            result, ok = str(exc)[-300:], False
        wall = utc(time.time())
        if what == "hold":
            rec.hold_t = self.now() if ok else None
            rec.release_result = f"hold returned at t={self.now():.1f}s ({wall}): {result}"
        else:
            rec.release_result += f" release returned at {wall}: {result}"

    def submitter(self, specs: list[Spec]) -> None:
        queue: list[tuple[float, int, str, Record]] = []
        for spec in specs:
            rec = Record(spec, f"{self.prefix}{spec.key:04d}-{spec.kind}{spec.name_suffix}")
            self.records.append(rec)
            heapq.heappush(queue, (spec.at, spec.key, "submit", rec))
        while queue:
            at, key, what, rec = queue[0]
            if self.done.wait(max(0.0, at - self.now())):
                return
            if self.now() < at:
                continue
            heapq.heappop(queue)
            self.ctld_ok.wait()
            if what == "submit":
                self.submit(rec)
                if rec.job_id is not None and rec.spec.release_after > 0 and rec.hold_t:
                    later = rec.spec.release_after
                    if self.stop.is_set():
                        later = min(later, 2 * self.opts.epoch_s)
                    heapq.heappush(queue, (self.now() + later, key, "release", rec))
            else:
                self.as_user(rec, "release")

    # -- tracking
    def poll_once(self) -> None:
        try:
            out = self.runner.run(commands.squeue_json(), timeout=20)
            jobs = parse_squeue_json(out.stdout)
        except (SlurmError, ValueError):
            self.poll_errors += 1
            return
        t = self.now()
        seen: set[int] = set()
        with self.lock:
            for job in jobs:
                rec = self.by_id.get(job.job_id)
                if rec is None and job.name.startswith(self.prefix):
                    rec = self.adopt(job)
                if rec is None:
                    continue
                seen.add(job.job_id)
                rec.observe(job, t)
            for job_id, rec in self.by_id.items():
                if (job_id not in seen and rec.last is not None
                        and rec.last.state not in FINAL and rec.vanished_t is None):
                    rec.vanished_t = t
                    if len(rec.timeline) < 80:
                        rec.timeline.append((round(t, 1), "VANISHED", ""))

    def adopt(self, job: SlurmJob) -> Record | None:
        """A job of ours whose sbatch failed (a timeout) but that Slurm created after all."""
        m = re.match(r"(\d+)-", job.name[len(self.prefix):])
        if not m:
            return None
        for rec in self.records:
            if rec.spec.key == int(m.group(1)) and rec.job_id is None:
                rec.job_id, rec.submitted_t = job.job_id, self.now()
                rec.sbatch_error += " (created after all: adopted from squeue)"
                self.by_id[job.job_id] = rec
                return rec
        return None

    def poller(self) -> None:
        k = 0
        while not self.done.is_set():
            self.poll_once()
            k += 1
            if k % 4 == 0 and self.ctld_ok.is_set():
                self.check_gres_leak()
            self.done.wait(self.opts.poll_s)

    def check_gres_leak(self, *, confirmed: bool = False) -> None:
        """Slurm 22.05 loses the GPUs of jobs it starts right after a slurmctld restart, before
        the nodes registered again: once they end, their node is IDLE with GresUsed > 0 and jobs
        wait for Resources forever (reproduced without the sidecar; ``scontrol reconfigure``
        clears it).  Not the sidecar's doing: an IDLE node with GPUs in use, seen twice in a
        row, is recorded and cleared with ``scontrol reconfigure``."""
        try:
            out = self.runner.run(["scontrol", "-d", "--oneliner", "show", "node"], timeout=20)
        except SlurmError:
            return
        leaking = set()
        for line in out.stdout.splitlines():
            name = re.search(r"NodeName=(\S+)", line)
            state = re.search(r"\bState=(\S+)", line)
            used = re.search(r"GresUsed=gpu:(?:[^:\s]+:)?(\d+)", line)
            if name and state and used and state.group(1) == "IDLE" and int(used.group(1)) > 0:
                leaking.add(f"{name.group(1)} GresUsed={used.group(1)}")
        again = leaking if confirmed else leaking & self.gres_suspect
        self.gres_suspect = leaking
        if again:
            self.gres_leaks.append({"t": round(self.now(), 1), "nodes": sorted(again)})
            self.say(f"t={self.now():.0f}s Slurm GRES leak on idle nodes {sorted(again)}: "
                     "scontrol reconfigure")
            self.runner.run(["scontrol", "reconfigure"], check=False, timeout=30)
            self.gres_suspect = set()

    # -- faults
    def ctld_pid(self) -> int | None:
        path = self.cluster.dir / "run" / "slurmctld.bgpid"
        try:
            pid = int(path.read_text().strip())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):
            return None
        return pid if comm == "slurmctld" else None

    def ctld_answers(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                out = self.runner.run(["scontrol", "ping"], check=False, timeout=15)
                if "is UP" in out.stdout:
                    return True
            except SlurmError:
                pass
            time.sleep(1)
        return False

    def do_fault(self, f: Fault) -> None:
        t = self.now()
        entry: dict[str, Any] = {"t": round(t, 1), "kind": f.kind}
        assert self.supervisor is not None
        if f.kind == "sidecar_kill":
            entry["restart_after_s"] = f.hold_s
            self.supervisor.kill(f.hold_s, self.stop)
        elif f.kind == "ctld_stop":
            pid = self.ctld_pid()
            if pid is None:
                self.harness_errors.append(f"t={t:.0f}s no slurmctld pid to SIGSTOP")
                return
            self.ctld_ok.clear()
            try:
                os.kill(pid, signal.SIGSTOP)
                self.ctld_stopped_pid = pid
                entry["stopped_s"] = f.hold_s
                self.stop.wait(f.hold_s)
            finally:
                self.cont_ctld()
                self.ctld_ok.set()
        elif f.kind == "second_sidecar":
            entry.update(self.second_sidecar())
        elif f.kind == "launch_fail":
            entry.update(self.launch_fail(f.hold_s))
        elif f.kind == "ctld_restart":
            self.ctld_ok.clear()
            try:
                out = dev_script("restart-ctld", self.cluster.env, timeout=120)
                entry["ok"] = out.returncode == 0
                if out.returncode != 0:
                    self.harness_errors.append(f"t={t:.0f}s restart-ctld failed: "
                                               f"{out.stderr[-1000:]}")
                    self.ctld_answers(60)
            finally:
                self.ctld_ok.set()
        else:
            state = "DOWN" if f.kind == "node_down" else "DRAIN"
            entry.update(node=f.node, for_s=f.hold_s)
            self.nodes_changed.add(f.node)
            try:
                self.runner.run(["scontrol", "update", f"NodeName={f.node}", f"State={state}",
                                 "Reason=hadar-soak"], timeout=30)
                self.stop.wait(f.hold_s)
            except SlurmError as exc:
                self.harness_errors.append(f"t={t:.0f}s {state} {f.node}: {exc}")
            finally:
                self.resume_nodes()
        self.faults_done.append(entry)
        self.say(f"t={t:.0f}s fault {f.kind} {f.node} {f.hold_s:g}s".rstrip())

    def launch_fail(self, hold_s: float) -> dict[str, Any]:
        """The next launch on any node fails for ``hold_s`` (the dev cluster's fault-drill
        prolog, ``run/fail-prolog.once``): slurmd drains that node and slurmctld requeues the
        job held, "launch failed requeued held".  A hadar job the sidecar placed is the
        sidecar's to place anew (never touched here); any other (a plain job, one the sidecar
        left to Slurm) stays held, as Slurm leaves it, until an admin releases it, which the
        soak does here (and resumes the node), as it resumes the nodes of the other faults."""
        marker = self.cluster.dir / "run" / "fail-prolog.once"
        marker.touch()
        self.stop.wait(hold_s)
        took = not marker.exists()
        marker.unlink(missing_ok=True)
        out: dict[str, Any] = {"for_s": hold_s, "took": took, "released": []}
        if not took:
            return out
        time.sleep(3)  # (slurmctld requeues the job a moment after the prolog failed)
        try:
            jobs = parse_squeue_json(self.runner.run(commands.squeue_json(), timeout=20).stdout)
            drained = self.runner.run(["sinfo", "--noheader", "--Node", "--format=%N %E"],
                                      timeout=20).stdout
        except (SlurmError, ValueError) as exc:
            self.harness_errors.append(f"t={self.now():.0f}s launch_fail: reading Slurm: {exc}")
            return out
        for job in jobs:
            rec = self.by_id.get(job.job_id)
            if (rec is not None and launch_failed(job)
                    and not relaunchable(job, decode(job.admin_comment))):
                self.runner.run(["scontrol", "release", str(job.job_id)], check=False,
                                timeout=30)
                out["released"].append(job.job_id)
        for line in drained.splitlines():
            name, _, reason = line.partition(" ")
            if "Prolog" in reason:
                self.nodes_changed.add(name)
        self.resume_nodes()
        return out

    def second_sidecar(self) -> dict[str, Any]:
        """A second ``hadar-slurm run --dry-run --max-epochs 1`` on the same config (and so the
        same state_dir) while the first runs: it must refuse to start (one sidecar per
        state_dir), with one clear line and no traceback."""
        assert self.supervisor is not None
        env = dict(os.environ, SLURM_CONF=str(self.cluster.conf))
        argv = [*self.supervisor.base_argv(), "run", "--config", str(self.config), "--dry-run",
                "--max-epochs", "1"]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env,
                                 check=False)
            rc, text = out.returncode, (out.stdout + out.stderr)
        except subprocess.TimeoutExpired as exc:
            rc, text = -1, f"still running after 90 s: {exc}"
        self.second_runs.append({"t": round(self.now(), 1), "returncode": rc,
                                 "output_tail": text[-1500:]})
        return {"returncode": rc}

    def cont_ctld(self) -> None:
        pid, self.ctld_stopped_pid = self.ctld_stopped_pid, None
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def resume_nodes(self) -> None:
        for node in sorted(self.nodes_changed):
            for _ in range(10):
                try:
                    self.runner.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                                    check=False, timeout=30)
                    break
                except SlurmError:
                    time.sleep(2)
        self.nodes_changed.clear()

    def faulter(self, faults: list[Fault]) -> None:
        try:
            for f in faults:
                if self.stop.wait(max(0.0, f.at - self.now())):
                    return
                self.do_fault(f)
        except Exception as exc:  # a harness failure: reported, never hidden
            self.harness_errors.append(f"fault thread: {exc!r}")
        finally:
            self.cont_ctld()
            self.ctld_ok.set()
            self.resume_nodes()

    # -- the run
    def live(self) -> list[Record]:
        with self.lock:
            return [r for r in self.records if r.job_id is not None
                    and (r.last is None or r.last.state not in FINAL)]

    def run(self) -> dict[str, Any]:
        nodes = cluster_nodes(self.cluster)
        specs = plan_jobs(self.opts, self.rng, self.sentinel)
        faults = plan_faults(self.opts, self.rng, nodes)
        self.setup()
        self.say(f"soak: {len(specs)} jobs over {self.opts.duration_s:g}s, {len(faults)} faults, "
                 f"users {', '.join(u.name for u in self.users)}, dir {self.workdir}")
        self.supervisor = Supervisor(self.config, self.workdir, self.cluster.conf, self.t0,
                                     self.say)
        threads = [threading.Thread(target=self.poller, daemon=True),
                   threading.Thread(target=self.submitter, args=(specs,), daemon=True),
                   threading.Thread(target=self.faulter, args=(faults,), daemon=True)]
        final_rc: int | None = None
        drain_s = 0.0
        try:
            self.supervisor.start()
            for th in threads:
                th.start()
            while self.now() < self.opts.duration_s:
                self.supervisor.check()
                time.sleep(1)
            self.stop.set()
            threads[2].join(timeout=120)
            self.say(f"t={self.now():.0f}s faults over; waiting for the jobs to end")
            t_drain = self.now()
            while self.now() - t_drain < self.opts.drain_timeout_s:
                self.supervisor.check()
                if not threads[1].is_alive() and not self.live():
                    break
                time.sleep(2)
            drain_s = self.now() - t_drain
            self.poll_once()
            final_rc = self.supervisor.stop()
        finally:
            self.done.set()
            self.stop.set()
            self.supervisor.stop()
            self.cont_ctld()
            self.ctld_ok.set()
            self.resume_nodes()
            for th in threads:
                if th.ident is not None:  # (not started when the sidecar failed to start)
                    th.join(timeout=60)
            left = [r.job_id for r in self.live() if r.job_id is not None]
            if left:
                self.runner.run(commands.scancel(left), check=False, timeout=60)
            if self.ctld_answers(30):  # leave no leaked GPUs to whoever uses the cluster next
                self.check_gres_leak(confirmed=not left)
        return self.result(faults, final_rc, drain_s)

    # -- the result
    def job_log(self, rec: Record) -> list[str]:
        path = self.users[rec.spec.user].out / f"{rec.job_id}.log"
        try:
            return path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def result(self, faults: list[Fault], final_rc: int | None, drain_s: float
               ) -> dict[str, Any]:
        events, bad_lines = read_log(self.log)
        by_job: dict[int, list[dict[str, Any]]] = {}
        for e in events:
            j = e.get("job")
            if isinstance(j, int):
                by_job.setdefault(j, []).append(e)
        outcome: Counter[str] = Counter()
        failures: list[dict[str, Any]] = []
        jobs_out = []
        signalled = restarted = 0
        for rec in self.records:
            verdict, why = self.judge(rec)
            runs = [ln.split()[0] for ln in self.job_log(rec)] if rec.job_id else []
            signalled += "signal" in runs
            restarted += runs.count("start") > 1
            outcome[verdict] += 1
            entry: dict[str, Any] = {
                "key": rec.spec.key, "job": rec.job_id, "user": self.users[rec.spec.user].name,
                "kind": rec.spec.kind, "verdict": verdict}
            if rec.release_result:
                entry["hold"] = rec.release_result.strip()
            jobs_out.append(entry)
            if why:
                log = self.job_log(rec) if rec.job_id else []
                last = rec.last
                failures.append({
                    **entry, "why": why, "comment": (rec.comment or "")[:160],
                    "gres": rec.spec.gres, "mode": rec.spec.mode, "secs": rec.spec.secs,
                    "sbatch": rec.sbatch_error[-300:],
                    "submitted_t": rec.submitted_t, "hold": rec.release_result.strip(),
                    "t0_utc": utc(self.t0_wall),
                    "final": None if last is None else {
                        "submit_utc": utc(last.submit_time), "start_utc": utc(last.start_time),
                        "state": last.state, "flags": list(last.state_flags),
                        "reason": last.state_reason, "exit_code": last.exit_code,
                        "nodes": last.nodes, "admin_comment": last.admin_comment,
                        "dependency": last.dependency},
                    "timeline": rec.timeline, "job_log": log[-12:],
                    "sidecar_events": [compact(e) for e in by_job.get(rec.job_id or -1, [])][-25:],
                })
        # preemptions: a signalled job placed back on the nodes it was stopped on gained
        # nothing from the move (its grace and restart were lost)
        back = 0
        places: Counter[int] = Counter()
        for j, acts in by_job.items():
            prev: dict[str, Any] | None = None
            signalled_since = False
            for e in acts:
                if e.get("event") != "action":
                    continue
                if e.get("action") == "signal":
                    signalled_since = True
                elif e.get("action") == "place":
                    places[j] += 1
                    if signalled_since and prev is not None and e.get("nodes") == prev.get(
                            "nodes"):
                        back += 1
                    prev, signalled_since = e, False
        tb_stderr: list[dict[str, Any]] = []
        assert self.supervisor is not None
        for path in self.supervisor.stderr_files:
            text = path.read_text(errors="replace") if path.exists() else ""
            for k in [m.start() for m in re.finditer(re.escape(TRACEBACK), text)]:
                tb_stderr.append({"file": path.name, "excerpt": text[k:k + 2500]})
        tb_log = [compact(e, 2500) for e in events if TRACEBACK in json.dumps(e)]
        kinds = Counter(e.get("event") for e in events)
        actions = Counter(str(e.get("action")) for e in events if e.get("event") == "action")
        warn = [compact(e) for e in events if e.get("level") in ("warning", "error")]
        fault_count = Counter(f["kind"] for f in self.faults_done)
        status = self.status_check()
        second_bad = [r for r in self.second_runs
                      if r["returncode"] == 0 or TRACEBACK in r["output_tail"]]
        figures: dict[str, Any] = {
            "jobs_planned": len(self.records),
            "submitted": sum(1 for r in self.records if r.job_id or r.refused or r.submit_error),
            "accepted": sum(1 for r in self.records if r.job_id),
            "refused_at_submit": sum(1 for r in self.records if r.refused),
            "refused_valid": outcome["refused_valid"],
            "submit_errors": outcome["submit_error"],
            "completed_once": outcome["completed_once"],
            "ran_twice": outcome["ran_twice"],
            "lost": outcome["lost"] + outcome["vanished"] + outcome["completed_without_done"],
            "lost_detail": {k: outcome[k] for k in ("lost", "vanished",
                                                    "completed_without_done")},
            "held_at_end": outcome["held_at_end"],
            "pending_at_end": outcome["pending_at_end"],
            "hold_broken": outcome["hold_broken"],
            "injected": self.sentinel.exists(),
            "jobs_signalled": signalled,
            "checkpoint_signals": actions["signal"],
            "placed_back_on_the_same_nodes_after_a_signal": back,
            "most_places_of_one_job": max(places.values(), default=0),
            "jobs_run_more_than_once": restarted,
            "sidecar_kills": self.supervisor.kills,
            "sidecar_starts": self.supervisor.started,
            "sidecar_crashes": len(self.supervisor.crashes),
            "sidecar_final_stop_rc": final_rc,
            "second_sidecars": len(self.second_runs),
            "second_sidecars_not_refused": len(second_bad),
            "ctld_restarts": fault_count["ctld_restart"],
            "ctld_stops": fault_count["ctld_stop"],
            "node_downs": fault_count["node_down"],
            "node_drains": fault_count["node_drain"],
            "launch_fails": sum(1 for f in self.faults_done
                                if f["kind"] == "launch_fail" and f.get("took")),
            "launch_failed_placed_anew": kinds["launch_failed"],
            "launch_failed_released_by_admin": sum(len(f.get("released", []))
                                                   for f in self.faults_done),
            "tracebacks_stderr": len(tb_stderr),
            "tracebacks_log": len(tb_log),
            "log_lines_not_json": bad_lines,
            "epochs": kinds["epoch"],
            "epoch_failed": kinds["epoch_failed"],
            "slurm_unreachable": kinds["slurm_unreachable"],
            "warnings_logged": len(warn),
            "status_rc": status["rc"],
            "poll_errors": self.poll_errors,
            "slurm_gres_leaks_cleared": len(self.gres_leaks),
            "harness_errors": len(self.harness_errors),
            "duration_s": self.opts.duration_s,
            "drain_s": round(drain_s, 1),
            "wall_s": round(self.now(), 1),
        }
        clean = (not failures and not tb_stderr and not tb_log and not self.supervisor.crashes
                 and final_rc == 0 and not figures["injected"] and status["rc"] == 0
                 and not self.harness_errors and not second_bad)
        return {
            "clean": clean, "figures": figures, "outcomes": dict(outcome),
            "t0_utc": utc(self.t0_wall),
            "options": {k: (str(v) if isinstance(v, Path) else v)
                        for k, v in vars(self.opts).items()},
            "users": [u.name for u in self.users], "workdir": str(self.workdir),
            "failures": failures, "sidecar_crashes": self.supervisor.crashes,
            "tracebacks_stderr": tb_stderr[:10], "tracebacks_log": tb_log[:10],
            "harness_errors": self.harness_errors, "faults": self.faults_done,
            "slurm_gres_leaks": self.gres_leaks, "second_sidecars": self.second_runs,
            "faults_planned": [vars(f) for f in faults],
            "events": dict(kinds), "actions": dict(actions), "warnings": warn[:60],
            "status": status, "jobs": jobs_out,
        }

    def judge(self, rec: Record) -> tuple[str, str]:
        """(verdict, why it is a failure or "")."""
        spec = rec.spec
        if rec.refused:
            if spec.valid:
                return "refused_valid", f"a valid submission was refused: {rec.sbatch_error}"
            return "refused", ""
        if rec.job_id is None:
            return "submit_error", f"sbatch failed: {rec.sbatch_error or 'not submitted'}"
        last = rec.last
        if rec.hold_broken:
            why = f"user hold not respected: {rec.hold_broken}"
            return "hold_broken", why
        if last is None or rec.vanished_t is not None:
            return "vanished", "the job vanished from squeue before it ended"
        if last.state not in FINAL:
            if last.held:
                return "held_at_end", f"still held at the end ({last.state_reason})"
            return "pending_at_end", f"still {last.state} at the end ({last.state_reason})"
        log = self.job_log(rec)
        done = sum(1 for line in log if line.startswith("done "))
        if last.state == "COMPLETED":
            if done == 1:
                return "completed_once", ""
            if done == 0 and any(line.startswith("already ") for line in log):
                # its last step was done (checkpointed) by a run stopped just before it wrote
                # "done"; the next run found the work done: it completed once
                return "completed_once", ""
            if done == 0:
                return "completed_without_done", "COMPLETED but the payload never finished"
            return "ran_twice", f"ran to its end {done} times"
        return "lost", f"ended {last.state} (exit {last.exit_code}, {last.state_reason})"

    def status_check(self) -> dict[str, Any]:
        """``hadar-slurm status`` once at the end: it must answer without a traceback."""
        env = dict(os.environ, SLURM_CONF=str(self.cluster.conf))
        try:
            argv = [*Supervisor.base_argv(), "status", "--config", str(self.config), "--all"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                                 check=False)
        except subprocess.TimeoutExpired:
            return {"rc": -1, "stderr": "timed out after 120 s"}
        return {"rc": out.returncode, "stderr": out.stderr[-1500:],
                "lines": len(out.stdout.splitlines())}


def utc(t: float | None) -> str | None:
    """Unix seconds as an ISO UTC time with milliseconds (as the sidecar's log writes them)."""
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def compact(e: dict[str, Any], limit: int = 400) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in e.items():
        if isinstance(v, str) and len(v) > limit:
            v = v[:limit] + "..."
        elif isinstance(v, list | dict) and len(json.dumps(v)) > limit:
            v = json.dumps(v)[:limit] + "..."
        out[k] = v
    return out


def read_log(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON events of the sidecar's log, and how many lines were not JSON objects."""
    events: list[dict[str, Any]] = []
    bad = 0
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return events, 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(e, dict):
            events.append(e)
        else:
            bad += 1
    return events, bad


# -- report --------------------------------------------------------------------------------


def summary(result: dict[str, Any]) -> str:
    f = result["figures"]
    lines = [
        f"soak {'CLEAN' if result['clean'] else 'NOT CLEAN'}: {f['jobs_planned']} jobs, "
        f"{f['duration_s']:g}s of faults, drain {f['drain_s']:g}s, wall {f['wall_s']:g}s",
        f"  submitted {f['submitted']}  refused at submit {f['refused_at_submit']} "
        f"(valid refused {f['refused_valid']})  submit errors {f['submit_errors']}",
        f"  completed exactly once {f['completed_once']}  ran twice {f['ran_twice']}  "
        f"lost {f['lost']} {f['lost_detail']}",
        f"  held at end {f['held_at_end']}  pending at end {f['pending_at_end']}  "
        f"user holds broken {f['hold_broken']}  injection {f['injected']}",
        f"  jobs signalled {f['jobs_signalled']}  started more than once "
        f"{f['jobs_run_more_than_once']}  signals {f['checkpoint_signals']}, placed back on "
        f"the same nodes after one {f['placed_back_on_the_same_nodes_after_a_signal']}, most "
        f"places of one job {f['most_places_of_one_job']}",
        f"  sidecar kills {f['sidecar_kills']}  starts {f['sidecar_starts']}  crashes "
        f"{f['sidecar_crashes']}  final stop rc {f['sidecar_final_stop_rc']}",
        f"  slurmctld restarts {f['ctld_restarts']}  stops {f['ctld_stops']}  node downs "
        f"{f['node_downs']}  drains {f['node_drains']}  (Slurm GRES leaks cleared: "
        f"{f['slurm_gres_leaks_cleared']})",
        f"  second sidecar on the same state_dir: {f['second_sidecars']} tries, "
        f"{f['second_sidecars_not_refused']} not refused (or with a traceback)",
        f"  tracebacks: stderr {f['tracebacks_stderr']}  log {f['tracebacks_log']};  epochs "
        f"{f['epochs']}  epoch_failed {f['epoch_failed']}  slurm_unreachable "
        f"{f['slurm_unreachable']}  status rc {f['status_rc']}",
    ]
    for fail in result["failures"][:40]:
        final = fail.get("final") or {}
        lines.append(f"  FAIL job {fail['job']} ({fail['user']}, {fail['kind']}, "
                     f"{fail['mode']}): {fail['why']} | admin_comment="
                     f"{final.get('admin_comment', '')!r}")
    for fail in result["failures"][:5]:  # the story of the first few, for a CI log
        steps = "  ".join(f"{t:g}s {state}({reason})" for t, state, reason in fail["timeline"])
        lines.append(f"    job {fail['job']} in squeue: {steps}")
        lines.append(f"    its run log: {' | '.join(fail['job_log'])}")
        for e in fail["sidecar_events"]:
            said = " ".join(f"{k}={v}" for k, v in e.items() if k not in ("job", "logger"))
            lines.append(f"    sidecar: {said[:300]}")
    for c in result["sidecar_crashes"][:5]:
        tail = c["stderr_tail"].strip().splitlines()[-1:] or [""]
        lines.append(f"  SIDECAR CRASH t={c['t']}s rc={c['returncode']}: {tail[0][:200]}")
    for tb in result["tracebacks_stderr"][:3]:
        last = [x for x in tb["excerpt"].splitlines() if x.strip()][-1:] or [""]
        lines.append(f"  TRACEBACK {tb['file']}: {last[0][:200]}")
    for err in result["harness_errors"]:
        lines.append(f"  HARNESS {err[:300]}")
    return "\n".join(lines)


def write_result(result: dict[str, Any], out: Path | None) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")


def run_soak(opts: Options, cluster: SoakCluster, say: Callable[[str], None] = print
             ) -> dict[str, Any]:
    """Run the soak on ``cluster`` (which it leaves as it found it: nodes resumed, slurmctld
    running, its jobs cancelled); returns the result (also written to ``opts.out``)."""
    workdir = Path(tempfile.mkdtemp(prefix="hadar-soak-"))
    workdir.chmod(0o755)
    result: dict[str, Any] | None = None
    try:
        result = Soak(opts, cluster, workdir, say).run()
        write_result(result, opts.out)
        return result
    finally:
        if result is None or not result["clean"] or opts.keep:  # evidence: Slurm's own logs
            keep = workdir / "cluster-log"
            keep.mkdir(exist_ok=True)
            for log in (cluster.dir / "log").glob("slurm*.log"):
                shutil.copy2(log, keep / log.name)
        if result is not None and result["clean"] and not opts.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"soak files kept in {workdir}")


# -- the cluster ---------------------------------------------------------------------------


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def own_cluster(say: Callable[[str], None]) -> Iterator[SoakCluster]:
    """A private dev cluster (job_submit.lua loaded), stopped at the end whatever happens."""
    if os.geteuid() != 0:
        raise SystemExit("the soak needs root (slurm_conf/dev-cluster.sh, jobs of two users)")
    nnodes = len([ln for ln in (REPO / "slurm_conf" / "nodes.conf").read_text().splitlines()
                  if ln.split("#", 1)[0].strip()])
    cdir = Path(tempfile.mkdtemp(prefix="hadar-soak-cluster-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADAR_DEVCLUSTER_")}
    env.update(HADAR_DEVCLUSTER_DIR=str(cdir), HADAR_DEVCLUSTER_LUA="1",
               HADAR_DEVCLUSTER_PORT=str(free_port_base(23400, 60, 2 + nnodes, "the soak")))
    old_term = signal.signal(signal.SIGTERM, _terminate)
    ok = False
    try:
        say(f"starting a dev cluster in {cdir} (ports from {env['HADAR_DEVCLUSTER_PORT']})")
        up = dev_script("up", env, timeout=300)
        if up.returncode != 0:
            raise RuntimeError(f"dev-cluster.sh up failed ({up.returncode}):\n"
                               f"{up.stderr[-3000:]}")
        yield SoakCluster(cdir, env, SlurmRunner(cdir / "etc" / "slurm.conf", timeout=30))
        ok = True
    finally:
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            say("stopping the soak's dev cluster")
            down = dev_script("down", env, timeout=180)
            if down.returncode == 0 and ok:
                shutil.rmtree(cdir, ignore_errors=True)
            elif down.returncode != 0:
                say(f"dev-cluster.sh down failed:\n{down.stderr[-2000:]}")
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)


def parse_args(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.soak",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true",
                   help="40 jobs, 90 s of faults, 10 s epochs (the test's setting)")
    p.add_argument("--jobs", type=int, help="jobs to submit (default 200; quick 40)")
    p.add_argument("--duration", type=float, help="seconds of faults (default 240; quick 90)")
    p.add_argument("--seed", type=int, default=11, help="random seed of jobs and faults")
    p.add_argument("--epoch-seconds", type=float, help="sidecar epoch (default 12; quick 10)")
    p.add_argument("--grace", type=float, default=3.0, help="preempt_grace_s (default 3)")
    p.add_argument("--drain-timeout", type=float,
                   help="seconds to wait for the jobs to end after the faults (default 600)")
    p.add_argument("--users", default="", help="two accounts, comma-separated (default: "
                   "nobody and an ordinary account)")
    p.add_argument("--policy", default="hadar", help="the sidecar's policy (default hadar)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="result JSON")
    p.add_argument("--keep", action="store_true", help="keep the private directory")
    a = p.parse_args(argv)
    over: dict[str, Any] = {"seed": a.seed, "grace_s": a.grace, "out": a.out, "keep": a.keep,
                            "policy": a.policy,
                            "users": tuple(u for u in a.users.split(",") if u)}
    for key, val in (("jobs", a.jobs), ("duration_s", a.duration),
                     ("epoch_s", a.epoch_seconds), ("drain_timeout_s", a.drain_timeout)):
        if val is not None:
            over[key] = val
    opts = quick_options(**over) if a.quick else Options(**over)
    if opts.jobs < 1 or opts.duration_s <= 0 or opts.epoch_s <= 0 or opts.drain_timeout_s <= 0:
        p.error("--jobs, --duration, --epoch-seconds and --drain-timeout must be positive")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)

    def say(msg: str) -> None:
        print(msg, flush=True)

    try:
        with own_cluster(say) as cluster:
            result = run_soak(opts, cluster, say)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except (RuntimeError, SlurmError, OSError) as exc:
        say(f"soak harness failed: {exc}")
        return 2
    say(summary(result))
    if opts.out is not None:
        say(f"result: {opts.out}")
    return 0 if result["clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
