"""Tuning studies live (issue #17): the sidecar applies successive halving to three studies of
emulated trials on the real dev cluster, one asynchronous (``asha``), one synchronous (``sh``)
and one in Hyperband's brackets (``hyperband``: with 6 trials, 3 rungs and eta 2, tasks 0-1
halve from rung 0, 2-3 from rung 1, 4-5 train to the end), submitted at once as hadar job
arrays.

Each study: 6 trials of ResNet-18 (batch size 64), 3 rungs, eta 2: a trial reports at 400, 800
and 1600 steps what the simulator's synthetic learning curves say of it
(``python -m hadar_slurm.runtime.emulate --curves-seed S --trials 6``), 10x compressed (1.7 to
5.7 s to its first rung, by GPU type).  The payloads start warm (one preloaded server forks
them).  Asserted, from Slurm, the trials' own files and the sidecar's book and log (nothing
timed):

* every trial ends once: COMPLETED, or CANCELLED by the sidecar after its rule stopped it;
  none is left pending or held, and the book says the study ended;
* every report is the curves' value for that trial and rung, and each trial's steps at each
  report are exactly the rung's (the runtime commits at the rung);
* the verdicts are the halving rule's (:func:`hadar_slurm.studies.halving.verdicts`) over the
  reports in the order the book read them: replayed here, rung by rung;
* a stopped trial never trained past the rung it was stopped at; under ``sh`` the trials that
  waited for their cohort were requeued held and resumed at their rung (a second run) when
  promoted;
* the study's best (the ``study_done`` event and ``status --json``) is the best report at the
  last rung.

A fourth study (``fork=2``, policy ``hadare``) has its trials forked into copies, each copy
told its task's index, and is held to the same checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.logs import JsonLinesReader
from hadar_slurm.runtime.warmstart import warm_server
from hadar_slurm.sidecar.fork import copy_of
from hadar_slurm.slurm import SlurmJob, commands
from hadar_slurm.slurm.parse import FINAL_STATES, PENDING_STATES
from hadar_slurm.studies.curves import LearningCurves
from hadar_slurm.studies.halving import Verdict, verdicts
from hadar_slurm.studies.reporter import rung_targets
from hadar_slurm.studies.spec import Rule, StudySpec
from tests.slurm_cluster import DevCluster, jobs, submit

pytest.importorskip("torch")

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
TRIALS, RUNGS, ETA, STEPS, COMPRESSION = 6, 3, 2, 1600, 10
JOB_TYPE = "ResNet-18 (batch size 64)"
SEEDS = {"asha": 11, "sh": 12, "hyperband": 13}
PAYLOAD = """#!/bin/bash
export PYTHONPATH=@REPO@ OMP_NUM_THREADS=1 HADAR_STUDY_RUNGS=@RUNGS@ HADAR_STUDY_ETA=@ETA@
export HADAR_STUDY="$1"
# the last trial of the sh study starts late the first time it runs (its restart: $4 s), so
# that the others report before it and wait for it
late=0
[ "$SLURM_ARRAY_TASK_ID" = @LAST@ ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ] && late="$4"
exec @PYTHON@ -m hadar_slurm.runtime.warmstart run "$2" -- --job-type "@TYPE@" --gpus 1 \\
    --steps @STEPS@ --compression @COMPRESSION@ --round-seconds 1 --curves-seed "$3" \\
    --trials @TRIALS@ --table @REPO@/slurm_conf/dev-throughputs.csv --restart-s "$late"
"""
#: How late the sh study's last trial starts (s): the others report their first rung seconds
#: before it, with every placement taking under a second.
LATE_S = 8


def _payload(path: Path) -> Path:
    text = PAYLOAD
    for key, value in (("REPO", REPO), ("PYTHON", sys.executable), ("RUNGS", RUNGS),
                       ("ETA", ETA), ("TYPE", JOB_TYPE), ("STEPS", STEPS),
                       ("COMPRESSION", COMPRESSION), ("TRIALS", TRIALS),
                       ("LAST", TRIALS - 1)):
        text = text.replace(f"@{key}@", str(value))
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def warm() -> Iterator[str]:
    # (a Unix socket's path must stay short)
    with tempfile.TemporaryDirectory(prefix="hadar-warm-") as wd, \
            warm_server(Path(wd) / "sock", log=Path(wd) / "warm.log") as sock:
        yield str(sock)


def tasks_of(cluster: DevCluster, array: int) -> dict[int, SlurmJob]:
    return {j: job for j, job in jobs(cluster).items() if job.array_job_id == array}


def study_files(tmp: Path, job_id: int) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """A trial's reports and the verdicts it was told, by rung."""
    d = tmp / ".hadar-tracker" / str(job_id) / "study"
    reports, told = {}, {}
    for rung in range(RUNGS):
        if (d / f"rung-{rung}.json").exists():
            reports[rung] = json.loads((d / f"rung-{rung}.json").read_text())
        if (d / f"verdict-{rung}.json").exists():
            told[rung] = json.loads((d / f"verdict-{rung}.json").read_text())["verdict"]
    return reports, told


def replay(rule: str, trials: list[dict[str, Any]], n: int = TRIALS, rungs: int = RUNGS,
           eta: int = ETA, steps: int = STEPS) -> dict[tuple[int, int], str]:
    """The halving rule's final verdicts over the book's reports, in the order the book read
    them (by epoch, then report time, then task): one epoch's reports at a time, each epoch's
    verdicts given until none changes, as the book does."""
    spec = StudySpec("replay", "trial", n, float(steps), rungs, float(eta), Rule(rule))
    order = sorted((int(r[2]), float(r[1]), t["task"], int(k), float(r[0]))
                   for t in trials for k, r in t["reports"].items())
    reports: list[dict[int, float]] = [{} for _ in range(rungs)]
    out: dict[tuple[int, int], str] = {}
    waiting: dict[int, int] = {}
    stopped: set[int] = set()
    for epoch in sorted({o[0] for o in order}):
        for _, _, task, rung, value in (o for o in order if o[0] == epoch):
            reports[rung][task] = value
            waiting[task] = rung
        settled = True
        while settled and waiting:
            got = verdicts(spec, range(n), reports, waiting, stopped)
            settled = any(v is not Verdict.WAIT for v in got.values())
            for task, verdict in got.items():
                out[(task, waiting[task])] = verdict.value
                if verdict is Verdict.STOP:
                    stopped.add(task)
            waiting = {t: r for t, r in waiting.items() if got[t] is Verdict.WAIT}
    return out


def run_sidecar(cluster: DevCluster, tmp_path: Path, policy: str = "hadar",
                epoch_s: int = 4) -> Path:
    """The sidecar's config (``policy``, epochs of ``epoch_s``, an epoch within a second of a
    report) in ``tmp_path``; returns it."""
    config = tmp_path / "sidecar.toml"
    config.write_text(f"""
[slurm]
conf = "{cluster.dir / "etc" / "slurm.conf"}"
[scheduler]
policy = "{policy}"
epoch_seconds = {epoch_s}
finish_poll_s = 1
preempt_grace_s = 3
learn_throughputs = false
throughputs = ["{REPO}/slurm_conf/dev-throughputs.csv"]
[sidecar]
state_dir = "{tmp_path}/state"
log_format = "json"
log_file = "{tmp_path / "sidecar.log"}"
""")
    return config


def sidecar_env(cluster: DevCluster, **extra: str) -> dict[str, str]:
    """The environment of the sidecar and the command line against ``cluster``."""
    return dict(os.environ, SLURM_CONF=str(cluster.dir / "etc" / "slurm.conf"),
                PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


@contextmanager
def sidecar_running(cluster: DevCluster, config: Path, tmp_path: Path, arrays: Iterable[int],
                    env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``hadar-slurm run --config config`` (its stderr in ``tmp_path/sidecar.err``) while the
    block runs; then stopped, and every task of ``arrays``, or copy of one, still live is
    cancelled."""
    proc = subprocess.Popen([sys.executable, "-m", "hadar_slurm", "run", "--config",
                             str(config)], env=env or sidecar_env(cluster),
                            stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "sidecar.err", "w"))
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        now = jobs(cluster)
        wanted = set(arrays)
        tasks = {j for j, job in now.items() if job.array_job_id in wanted}
        left = [j for j, job in now.items() if (j in tasks or copy_of(job.comment) in tasks)
                and job.state not in FINAL_STATES]
        if left:
            cluster.runner.run(commands.scancel(left), check=False)


def ended_in_book(book: Path) -> set[int]:
    """The arrays whose study the sidecar's book says has ended."""
    try:
        studies = json.loads(book.read_text())["studies"]
    except (OSError, ValueError, KeyError):
        return set()
    return {s["array"] for s in studies if s.get("ended") is not None}


def wait_arrays(cluster: DevCluster, arrays: list[int], proc: subprocess.Popen[bytes],
                err: Path, timeout: float, book: Path) -> None:
    """Until every task of ``arrays`` has ended and the sidecar's ``book`` says so (it reads
    the last reports at the epoch after the last task ended; the sidecar must stay up)."""
    end = time.monotonic() + timeout
    while True:
        now = [tasks_of(cluster, a) for a in arrays]
        if all(t and all(j.state in FINAL_STATES for j in t.values()) for t in now) and (
                set(arrays) <= ended_in_book(book)):
            return
        assert proc.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < end, ([{j: (x.array_task_id, x.state, x.state_reason)
                                          for j, x in t.items()} for t in now],
                                        ended_in_book(book))
        time.sleep(1.0)


def test_studies_are_halved_live_as_their_rules_say(dev_cluster: DevCluster,
                                                         tmp_path: Path, warm: str) -> None:
    cluster = dev_cluster
    tmp_path.chmod(0o755)
    payload = _payload(tmp_path / "trial.sh")
    log = tmp_path / "sidecar.log"
    config = run_sidecar(cluster, tmp_path)
    arrays: dict[str, int] = {}
    for rule, seed in SEEDS.items():
        arrays[rule] = submit(
            cluster, script=str(payload), job_name=f"study-{rule}", gres="gpu:1",
            comment=(f"hadar: model=resnet18 bs=64 steps={STEPS} study=live-{rule} "
                     f"rule={rule} rungs={RUNGS} eta={ETA}"),
            output=str(tmp_path / f"{rule}-%a.out"), chdir=str(tmp_path),
            extra=[f"--array=0-{TRIALS - 1}", "--open-mode=append"],
            script_args=[f"live-{rule}", warm, str(seed), str(LATE_S if rule == "sh" else 0)])
    env = sidecar_env(cluster)
    with sidecar_running(cluster, config, tmp_path, arrays.values()) as proc:
        wait_arrays(cluster, list(arrays.values()), proc, tmp_path / "sidecar.err", 420,
                    tmp_path / "state" / "studies.json")
        status = subprocess.run([sys.executable, "-m", "hadar_slurm", "status", "--config",
                                 str(config), "--json"], env=env, capture_output=True,
                                text=True, timeout=120, check=False)
    events = JsonLinesReader(log).read_new()
    book = {s["array"]: s for s in json.loads(
        (tmp_path / "state" / "studies.json").read_text())["studies"]}
    targets = rung_targets(STEPS, RUNGS, ETA)
    for rule, array in arrays.items():
        curves = LearningCurves(TRIALS, seed=SEEDS[rule])
        final = tasks_of(cluster, array)
        study = book[array]
        assert study["ended"] is not None, study
        trials = study["trials"]
        assert sorted(t["task"] for t in trials) == list(range(TRIALS))
        # the verdicts are the rule's over the reports, in the order the book read them
        given = {(t["task"], int(k)): v for t in trials for k, v in t["verdicts"].items()}
        assert given == replay(rule, trials), (rule, given)
        assert "wait" not in given.values()  # (the study ended: every wait was settled)
        by_task = {job.array_task_id: (j, job) for j, job in final.items()}
        for t in trials:
            task = t["task"]
            job_id, job = by_task[task]
            assert t["job_id"] == job_id
            reports, told = study_files(tmp_path, job_id)
            # what each reported is the curves' value, at exactly the rung's steps
            assert sorted(reports) == sorted(int(k) for k in t["reports"]), (rule, task)
            for rung, rep in reports.items():
                assert rep["value"] == pytest.approx(
                    curves.report(task, rung, targets[rung] / STEPS), abs=1e-12)
                assert rep["steps"] == targets[rung]
            # what it was told is what the book gave; it ended as its last verdict says
            assert told == {int(k): v for k, v in t["verdicts"].items()}, (rule, task)
            last = max(int(k) for k in t["verdicts"])
            verdict = t["verdicts"][str(last)]
            progress = json.loads((tmp_path / ".hadar-tracker" / str(job_id)
                                   / "progress.json").read_text())
            if verdict == "stop":
                assert t["final"] == "stop"
                assert job.state in ("COMPLETED", "CANCELLED"), (rule, task, job)
                assert progress["done"] == targets[last], (rule, task, progress)
            else:
                assert (verdict, t["final"], job.state) == ("done", "done", "COMPLETED")
                assert progress["done"] == STEPS and progress["complete"]
            assert job.state not in PENDING_STATES
        if rule == "hyperband":
            # below its bracket's first rung a trial is told go, whatever it reported
            start = StudySpec("b", "trial", TRIALS, float(STEPS), RUNGS, float(ETA),
                              Rule.HYPERBAND).brackets(range(TRIALS))
            assert start == {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
            for t in trials:
                for k, v in t["verdicts"].items():
                    if int(k) < start[t["task"]]:
                        assert v == "go", (t["task"], k, v)
            assert {t["task"] for t in trials if t["final"] == "done"} >= {4, 5}
        if rule == "sh":
            # the others reported rung 0 before the late trial: they waited for it, requeued
            # held (checkpoint signal), and those promoted ran again from their rung
            waited = [t for t in trials if t["task"] != TRIALS - 1]
            for t in waited:
                out = (tmp_path / f"sh-{t['task']}.out").read_text()
                assert "waits at rung 0 for the rest of its cohort" in out, out
                assert any(e.get("event") == "action" and e.get("job") == t["job_id"]
                           and e.get("action") == "signal" for e in events), t
                if t["verdicts"]["0"] == "go":
                    assert "goes on from rung 0" in out, out
                    runs = json.loads((tmp_path / ".hadar-tracker" / str(t["job_id"])
                                       / "progress.json").read_text())["run"]
                    assert not runs.endswith(".0"), runs  # (a second run: requeued)
        done = [e for e in events if e.get("event") == "study_done"
                and e.get("array") == array]
        assert len(done) == 1, done
        finals = {t["task"]: t["reports"][str(RUNGS - 1)][0] for t in trials
                  if str(RUNGS - 1) in t["reports"]}
        assert finals, trials
        best = max(finals, key=lambda k: (finals[k], -k))
        assert done[0]["best_task"] == best, (done, finals)
        shown = [s for s in json.loads(status.stdout)["studies"]
                 if s["array"] == array]
        assert shown and shown[0]["best"]["task"] == best, status.stdout[-2000:]


def test_a_study_whose_trials_are_forked_is_halved_live(dev_cluster: DevCluster,
                                                        tmp_path: Path, warm: str) -> None:
    """A study with ``fork=2`` under ``hadare``: the water-filling cap lets each of its 4
    trials run as 2 copies on the dev cluster's 18 GPUs, so the sidecar forks them (one
    heterogeneous job per trial, the copies told the task's index). The last trial starts
    late, so the others wait for it at rung 0 as copies. Asserted as for the unforked
    studies: every trial ends once, reports what the curves say at exactly the rung's steps,
    the verdicts are sh's over the reports, and the best is the study's; and a forked trial
    told to wait has its copies ended, and goes on as copies or as itself when promoted."""
    cluster = dev_cluster
    tmp_path.chmod(0o755)
    trials, rungs, seed = 4, 2, 21
    payload = _payload(tmp_path / "trial.sh")
    text = payload.read_text().replace(f"--trials {TRIALS}", f"--trials {trials}")
    text = text.replace(f"HADAR_STUDY_RUNGS={RUNGS}", f"HADAR_STUDY_RUNGS={rungs}")
    # (the last trial starts late, so that the others report rung 0 and wait for it)
    payload.write_text(text.replace(f'= {TRIALS - 1} ]', f'= {trials - 1} ]'))
    # (epochs of 12 s: HadarE forks no job whose consolidation, 2.5 s for a ResNet-18, takes
    # half of a round or more)
    config = run_sidecar(cluster, tmp_path, policy="hadare", epoch_s=12)
    array = submit(
        cluster, script=str(payload), job_name="study-forked", gres="gpu:1",
        comment=(f"hadar: model=resnet18 bs=64 steps={STEPS} study=live-forked rule=sh "
                 f"rungs={rungs} eta={ETA} fork=2"),
        output=str(tmp_path / "forked-%a.out"), chdir=str(tmp_path),
        extra=[f"--array=0-{trials - 1}", "--open-mode=append"],
        script_args=["live-forked", warm, str(seed), str(LATE_S)])
    with sidecar_running(cluster, config, tmp_path, [array]) as proc:
        wait_arrays(cluster, [array], proc, tmp_path / "sidecar.err", 420,
                    tmp_path / "state" / "studies.json")
    events = JsonLinesReader(tmp_path / "sidecar.log").read_new()
    study = {s["array"]: s for s in json.loads(
        (tmp_path / "state" / "studies.json").read_text())["studies"]}[array]
    assert study["ended"] is not None, study
    book = study["trials"]
    forked = {e["job"] for e in events if e.get("event") == "action"
              and e.get("action") == "fork"}
    assert forked & {t["job_id"] for t in book}, events  # (trials ran as copies)
    # the others reported rung 0 before the late trial (their reports bring epochs forward
    # though their jobs are held while their copies run): told to wait, their copies ended,
    # and those promoted went on from the rung (forked or placed again)
    acts = [e for e in events if e.get("event") == "action"]
    waited = {e["job"] for e in acts if e.get("action") == "tell_trial"
              and e.get("verdict") == "wait"}
    assert waited & forked, acts
    ended = {e["copy_of"] for e in acts if e.get("action") == "cancel_copies"}
    assert waited & forked <= ended, acts
    went_on = {t["job_id"] for t in book if t["job_id"] in waited and t["final"] == "done"}
    for job_id in went_on:
        told_go = min(k for k, e in enumerate(acts) if e.get("job") == job_id
                      and e.get("action") == "tell_trial" and e.get("verdict") == "go")
        assert any(e.get("job") == job_id and e.get("action") in ("fork", "place")
                   for e in acts[told_go:]), acts
    given = {(t["task"], int(k)): v for t in book for k, v in t["verdicts"].items()}
    assert given == replay("sh", book, trials, rungs), given
    curves = LearningCurves(trials, seed=seed)
    targets = rung_targets(STEPS, rungs, ETA)
    final = {job.array_task_id: job for job in tasks_of(cluster, array).values()}
    for t in book:
        reports, told = study_files(tmp_path, t["job_id"])
        assert sorted(reports) == sorted(int(k) for k in t["reports"]), t
        for rung, rep in reports.items():
            assert rep["value"] == pytest.approx(
                curves.report(t["task"], rung, targets[rung] / STEPS), abs=1e-12)
            assert rep["steps"] == targets[rung], (t, rep)
        assert told == {int(k): v for k, v in t["verdicts"].items()}, t
        progress = json.loads((tmp_path / ".hadar-tracker" / str(t["job_id"])
                               / "progress.json").read_text())
        last = max(int(k) for k in t["verdicts"])
        if t["final"] == "stop":
            assert progress["done"] == targets[last], (t, progress)
            assert final[t["task"]].state in ("COMPLETED", "CANCELLED"), final[t["task"]]
        else:
            assert (t["final"], final[t["task"]].state) == ("done", "COMPLETED"), t
            assert progress["done"] == STEPS and progress["complete"], progress
    finals = {t["task"]: t["reports"][str(rungs - 1)][0] for t in book
              if str(rungs - 1) in t["reports"]}
    done = [e for e in events if e.get("event") == "study_done" and e.get("array") == array]
    assert len(done) == 1 and done[0]["best_task"] == max(
        finals, key=lambda k: (finals[k], -k)), (done, finals)


DIGITS_TOML = """
[study]
name = "digits-live"
model = "resnet18"
bs = 64
steps = 2000
trials = 8
rule = "sh"
rungs = 3
eta = 2
metric = "val_accuracy"
seed = 0
[command]
argv = ["@PYTHON@", "@REPO@/examples/digits_trial.py"]
[space]
lr = { log_uniform = [0.001, 0.3] }
hidden = { choice = [16, 32, 64, 128, 256] }
seed = { int_uniform = [0, 1000000] }
"""


def test_a_real_digits_study_finds_its_best_configuration_live(dev_cluster: DevCluster,
                                                               tmp_path: Path) -> None:
    """The real example: ``hadar-slurm tune`` submits 8 trials of examples/digits_trial.py
    (torch on the CPU), the sidecar halves them (sh, 3 rungs, eta 2), and the best
    configuration trained alone from scratch reaches exactly the accuracy the study's trial
    reached (trials that waited were requeued and resumed from their rung's checkpoint)."""
    pytest.importorskip("sklearn")
    cluster = dev_cluster
    tmp_path.chmod(0o755)
    space = tmp_path / "digits.toml"
    space.write_text(DIGITS_TOML.replace("@PYTHON@", sys.executable)
                     .replace("@REPO@", str(REPO)))
    env = sidecar_env(cluster, OMP_NUM_THREADS="1")
    out = tmp_path / "study"
    sub = subprocess.run([sys.executable, "-m", "hadar_slurm", "tune", str(space), "--out",
                          str(out), "--submit"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert sub.returncode == 0, sub.stderr
    array = int(sub.stdout.split("submitted job array ")[1].split()[0])
    config = run_sidecar(cluster, tmp_path)
    with sidecar_running(cluster, config, tmp_path, [array], env) as proc:
        wait_arrays(cluster, [array], proc, tmp_path / "sidecar.err", 600,
                    tmp_path / "state" / "studies.json")
    book = json.loads((tmp_path / "state" / "studies.json").read_text())["studies"]
    # (only this study: the arrays of earlier tests that Slurm still shows had ended)
    assert [s["array"] for s in book] == [array]
    study = book[0]
    assert study["ended"] is not None
    trials = study["trials"]
    given = {(t["task"], int(k)): v for t in trials for k, v in t["verdicts"].items()}
    assert given == {k: v for k, v in replay("sh", trials, 8, 3, 2, 2000).items()}, given
    # sh, 3 rungs, eta 2: 8 trials -> 4 -> 2 (none lost)
    counts = [sum(1 for t in trials if str(k) in t["reports"]) for k in range(3)]
    assert counts == [8, 4, 2], trials
    targets = rung_targets(2000, 3, 2)
    results: dict[int, dict[str, Any]] = {}
    for t in trials:
        tracker = out / ".hadar-tracker" / str(t["job_id"])
        last = max(int(k) for k in t["reports"])
        # never trained past where it stopped (its committed steps)
        progress = json.loads((tracker / "progress.json").read_text())
        assert progress["done"] == targets[last], (t, progress)
        if not (tracker / "result.json").exists():
            # (stopped while it waited, requeued held: cancelled before it ran again)
            assert t["final"] == "stop" and last < 2, t
            continue
        r = results[t["task"]] = json.loads((tracker / "result.json").read_text())
        assert r["stopped_at_rung"] == (None if last == 2 else last), (t, r)
        # what the book holds is what the trial measured at that rung
        assert t["reports"][str(last)][0] == r["val_accuracy"], (t, r)
    finals = {t["task"]: t["reports"]["2"][0] for t in trials if "2" in t["reports"]}
    best = max(finals, key=lambda k: (finals[k], -k))
    alone = subprocess.run(
        [sys.executable, str(REPO / "examples" / "digits_trial.py"), "--alone", "--steps",
         "2000", "--result", str(tmp_path / "alone.json")],
        env=dict(env, HADAR_TRIAL_CONFIG=json.dumps(study["trials"][best]["config"]),
                 SLURM_JOB_ID="alone"), cwd=tmp_path, capture_output=True, text=True,
        timeout=300, check=False)
    assert alone.returncode == 0, alone.stderr[-2000:]
    retrained = json.loads((tmp_path / "alone.json").read_text())
    assert (retrained["val_accuracy"], retrained["test_accuracy"]) == (
        results[best]["val_accuracy"], results[best]["test_accuracy"]), (retrained, results)
    assert retrained["val_accuracy"] > 0.9  # (a real model, not a stand-in)
    (tmp_path / "best.json").write_text(json.dumps({"best": best, "study": results[best],
                                                    "alone": retrained}, indent=1))
