"""GPU sharing live (issue #16): the sidecar, with ``[scheduler] share = true``, runs emulated
jobs on the dev cluster's k80 node alone (the other nodes drained for the test), two GPUs with
two shards each, and Hadar pairs jobs where Gavel's table says the pair beats taking turns.

Five 1-GPU jobs, 60x compressed (10 to 20 s each alone):

* ``O``: LM (batch size 5), the shortest (10 s), with the hint ``share=no``;
* ``P``: LM (batch size 5), 20 s, and ``Q``: Recommendation (batch size 4096), 15 s, which
  together on a k80 keep 0.54 and 0.71 of their speeds (1.25 of one job's work per second);
  with ``F`` and ``G`` waiting behind them, Hadar pairs them (a k80's pairs gain little: with
  less waiting behind, it does not);
* ``F``, ``G``: Transformer (batch size 256), 20 s each, whose pairs with ``P`` and with ``Q``
  the table forbids (and with each other: they never share either).

Asserted, from what Slurm said of every job every half second while they ran:

* Slurm 24.11 and later: ``P`` and ``Q`` ran on one shard each of the same GPU at once, and
  each advanced at the table's co-located rate while they did (its payload says so, and its
  rounds' steps per second are within 25% of it, well below its rate alone); ``O`` never held
  a shard; ``F`` never shared a GPU with ``P`` or ``Q``; every job completed once.
* Slurm 22.05 (which cannot turn a job's GPU request into shards): nothing shares, the sidecar
  logs why, and every job completes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.logs import JsonLinesReader
from hadar_slurm.rates.table import default_table
from hadar_slurm.sidecar.controller import STATE_FILE
from hadar_slurm.sidecar.shard import job_gres_on, shards_per_gpu
from hadar_slurm.slurm import SlurmJob, commands, parse_sinfo_json
from hadar_slurm.slurm.parse import FINAL_STATES
from tests.slurm_cluster import DevCluster, jobs, submit

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
NODE, GPU = "node3", "k80"
COMPRESSION = 60.0
TABLE = default_table()
#: name -> (job type, seconds alone on a k80, compressed, extra hints)
JOBS = {
    "O": ("LM (batch size 5)", 10.0, " share=no"),
    "P": ("LM (batch size 5)", 20.0, ""),
    "Q": ("Recommendation (batch size 4096)", 15.0, ""),
    "F": ("Transformer (batch size 256)", 20.0, ""),
    "G": ("Transformer (batch size 256)", 20.0, ""),
}
PAYLOAD = """#!/bin/bash
export PYTHONPATH=@REPO@ OMP_NUM_THREADS=1
exec @PYTHON@ -m hadar_slurm.runtime.emulate --job-type "$1" --gpus 1 --steps "$2" \\
    --compression "$3" --round-seconds 1
"""


def hints(job_type: str, steps: int, extra: str) -> str:
    model, _, bs = job_type.partition(" (batch size ")
    name = "".join(c for c in model.lower() if c.isalnum())
    return (f"hadar: model={name}" + (f" bs={bs.rstrip(')')}" if bs else "")
            + f" steps={steps} preempt=checkpoint" + extra)


def only(cluster: DevCluster, node: str) -> Iterator[DevCluster]:
    """Every node but ``node`` drained while the test runs (resumed after it)."""
    out = cluster.runner.run(commands.sinfo_json())
    nodes = {n.name: n for n in parse_sinfo_json(out.stdout)}
    if shards_per_gpu(nodes[node]) < 2:
        pytest.fail(f"{node} has no shards: the tests' shard cluster configures 2 per GPU")
    others = sorted(n for n in nodes if n != node)
    cluster.runner.run(["scontrol", "update", f"NodeName={','.join(others)}",
                        "State=DRAIN", "Reason=test_share_cluster"])
    try:
        yield cluster
    finally:
        cluster.runner.run(["scontrol", "update", f"NodeName={','.join(others)}",
                            "State=RESUME"], check=False)


@pytest.fixture
def k80_only(shard_cluster: DevCluster) -> Iterator[DevCluster]:
    """Every node but node3 (two k80s) drained while the test runs (resumed after it)."""
    yield from only(shard_cluster, NODE)


@pytest.fixture
def v100_only(shard_cluster: DevCluster) -> Iterator[DevCluster]:
    """Every node but node1 (four v100s) drained while the test runs (resumed after it)."""
    yield from only(shard_cluster, "node1")


def sharing_config(tmp_path: Path, conf: Path) -> Path:
    """The sidecar's config (``hadar`` with ``share = true``, 4 s epochs, its log in
    ``tmp_path/sidecar.log``) in ``tmp_path``.  The bundled table (Gavel's, with co-located
    rates), as the payloads use it, uncompressed: the policy sees 60x longer jobs and epochs
    than the wall's, which only scales its times."""
    config = tmp_path / "sidecar.toml"
    config.write_text(f"""
[slurm]
conf = "{conf}"
[scheduler]
policy = "hadar"
share = true
epoch_seconds = 4
finish_poll_s = 1
preempt_grace_s = 2
learn_throughputs = false
[sidecar]
state_dir = "{tmp_path}/state"
log_format = "json"
log_file = "{tmp_path / "sidecar.log"}"
""")
    return config


def holdings(job: SlurmJob) -> tuple[str, frozenset[int]] | None:
    """What a running job holds on its node: ``("gpu"|"shard", GPU indices)``."""
    if job.state != "RUNNING" or not job.node_names:
        return None
    for use in job_gres_on(job, job.node_names[0]):
        if use.name in ("gpu", "shard"):
            return use.name, frozenset(use.indices)
    return None


def rounds(tracker: Path) -> list[dict[str, Any]]:
    path = tracker / "history.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_hadar_shares_a_gpu_live_where_the_table_says_the_pair_pays(
        k80_only: DevCluster, tmp_path: Path) -> None:
    cluster = k80_only
    tmp_path.chmod(0o755)
    old = cluster.version.split(".")[:2] == ["22", "05"]
    conf = cluster.dir / "etc" / "slurm.conf"
    payload = tmp_path / "payload.sh"
    payload.write_text(PAYLOAD.replace("@REPO@", str(REPO)).replace("@PYTHON@", sys.executable))
    payload.chmod(0o755)
    log = tmp_path / "sidecar.log"
    config = sharing_config(tmp_path, conf)
    ids: dict[str, int] = {}
    steps: dict[str, int] = {}
    for name, (job_type, secs, extra) in JOBS.items():
        steps[name] = int(TABLE.rate(job_type, 1, GPU) * COMPRESSION * secs)
        ids[name] = submit(cluster, script=str(payload), job_name=f"share-{name}",
                           gres="gpu:1", comment=hints(job_type, steps[name], extra),
                           output=str(tmp_path / f"{name}.out"), chdir=str(tmp_path),
                           script_args=[job_type, str(steps[name]), f"{COMPRESSION:g}"])
    env = dict(os.environ, SLURM_CONF=str(conf),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "hadar_slurm", "run", "--config",
                             str(config)], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "sidecar.err", "w"))
    name_of = {j: n for n, j in ids.items()}
    seen: list[dict[str, tuple[str, frozenset[int]]]] = []  # each poll: name -> holdings
    try:
        end = time.monotonic() + 300
        while True:
            now = jobs(cluster)
            held = {name_of[j]: got for j, job in now.items() if j in name_of
                    and (got := holdings(job)) is not None}
            seen.append(held)
            if all(now.get(j) is not None and now[j].state in FINAL_STATES
                   for j in ids.values()):
                break
            assert proc.poll() is None, (tmp_path / "sidecar.err").read_text()[-3000:]
            assert time.monotonic() < end, {n: (now[j].state, now[j].state_reason)
                                            for n, j in ids.items() if j in now}
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        left = [j for j, job in jobs(cluster).items()
                if j in name_of and job.state not in FINAL_STATES]
        if left:
            cluster.runner.run(commands.scancel(left), check=False)
    final = jobs(cluster)
    assert {n: final[j].state for n, j in ids.items()} == dict.fromkeys(JOBS, "COMPLETED")
    events = JsonLinesReader(log).read_new()
    together = [h for h in seen if "P" in h and "Q" in h and h["P"] == h["Q"]
                and h["P"][0] == "shard"]
    shared_by = {n for h in seen for n, (kind, _) in h.items() if kind == "shard"}
    if old:
        assert not shared_by, seen
        why = [e for e in events if e.get("event") == "sharing"]
        assert why and "cannot turn" in str(why[0].get("why")), why
        return
    # P and Q shared one GPU, one shard each, at once; O (share=no) never held a shard
    assert together, (seen, [e for e in events if e.get("event") in (
        "sharing", "share_refused", "action", "job_error")][:30])
    assert "O" not in shared_by, seen
    # F and G never on a GPU with P, Q or each other (the table forbids those pairs)
    for h in seen:
        for a, b in (("F", "P"), ("F", "Q"), ("G", "P"), ("G", "Q"), ("F", "G")):
            if a in h and b in h:
                assert not h[a][1] & h[b][1], h
    # each of P and Q advanced at the pair's co-located rate while they shared
    rate_p, rate_q = TABLE.pairs.pair_rate(JOBS["P"][0], JOBS["Q"][0], 1, GPU)
    for name, mate, rate in (("P", "Q", rate_p), ("Q", "P", rate_q)):
        job_type = JOBS[name][0]
        shared = rate * COMPRESSION
        alone = TABLE.rate(job_type, 1, GPU) * COMPRESSION
        out = (tmp_path / f"{name}.out").read_text()
        line = f"emulate: sharing GPU with job {ids[mate]} ({JOBS[mate][0]}): {shared:.3f}"
        assert line in out, out
        # the rounds committed while the mate ran (it ends once, the tracker says when)
        mine = rounds(tmp_path / ".hadar-tracker" / str(ids[name]))
        theirs = rounds(tmp_path / ".hadar-tracker" / str(ids[mate]))
        assert mine and theirs
        mate_end = max(r["time"] for r in theirs)
        during = [r for r in mine[1:] if r["time"] < mate_end - 1.0]
        secs = sum(r["seconds"][0] for r in during)
        assert secs >= 3.0, (mine, mate_end)
        got = sum(r["iters"][0] for r in during) / secs
        assert got == pytest.approx(shared, rel=0.25), (name, got, shared, during)
        assert got < 0.85 * alone
    places = [e for e in events if e.get("event") == "action" and e.get("action") == "place"
              and e.get("mate")]
    paired = {name_of.get(int(str(e["job"]))) for e in places}
    assert paired and paired <= {"P", "Q"}, places


STUDY_PAYLOAD = """#!/bin/bash
export PYTHONPATH=@REPO@ OMP_NUM_THREADS=1 HADAR_STUDY_RUNGS=2 HADAR_STUDY_ETA=2
export HADAR_STUDY="$1"
exec @PYTHON@ -m hadar_slurm.runtime.emulate --job-type "$2" --gpus 1 --steps "$3" \\
    --compression "$4" --round-seconds 1 --curves-seed "$5" --trials "$6"
"""


def test_a_studys_trials_share_gpus_live(v100_only: DevCluster, tmp_path: Path) -> None:
    """Issue #17 with #16: a study of 8 trials of Recommendation (batch size 4096), sh, 2 rungs,
    on node1 alone (4 v100s, 2 shards each), ``share = true``. Two such trials on a v100 keep
    0.77 of their speed each (Gavel's table: 1.53 of one's work per second), so with trials
    waiting Hadar would pair them; but node1 has a CPU per GPU, and a pair's second job would
    wait for a CPU, then take whichever GPU has a free shard. On Slurm 24.11 and later the
    policy counts the node's CPUs and offers no pair while the epoch's placements ask more
    than the node has free (the trial's ``explain`` says so), so the sidecar has none to
    refuse. Every trial ends once, the verdicts are sh's over the reports (on 22.05 too, where
    nothing shares)."""
    from hadar_slurm.studies.reporter import rung_targets
    from tests.test_study_cluster import (
        replay,
        sidecar_running,
        study_files,
        tasks_of,
        wait_arrays,
    )

    cluster = v100_only
    tmp_path.chmod(0o755)
    old = cluster.version.split(".")[:2] == ["22", "05"]
    conf = cluster.dir / "etc" / "slurm.conf"
    # (60x compressed, as above: 8 s alone on the wall, 8 minutes to the policy, whose move
    # costs a minute; 10x, a trial's rung would be too short for a pair to repay its start)
    job_type, trials, seed = "Recommendation (batch size 4096)", 8, 31
    steps = int(TABLE.rate(job_type, 1, "v100") * COMPRESSION * 8)
    payload = tmp_path / "trial.sh"
    payload.write_text(STUDY_PAYLOAD.replace("@REPO@", str(REPO))
                       .replace("@PYTHON@", sys.executable))
    payload.chmod(0o755)
    log = tmp_path / "sidecar.log"
    config = sharing_config(tmp_path, conf)
    array = submit(cluster, script=str(payload), job_name="study-share", gres="gpu:1",
                   comment=hints(job_type, steps, " study=live-share rule=sh rungs=2 eta=2"),
                   output=str(tmp_path / "share-%a.out"), chdir=str(tmp_path),
                   extra=[f"--array=0-{trials - 1}", "--open-mode=append"],
                   script_args=["live-share", job_type, str(steps), f"{COMPRESSION:g}",
                                str(seed), str(trials)])
    seen: list[dict[int, tuple[str, frozenset[int]]]] = []  # each poll: job -> holdings
    book_path = tmp_path / "state" / "studies.json"
    state_path = tmp_path / "state" / STATE_FILE
    no_cpu: set[str] = set()  # what explain said of trials the policy did not pair for CPUs
    with sidecar_running(cluster, config, tmp_path, [array]) as proc:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            now = tasks_of(cluster, array)
            seen.append({j: got for j, job in now.items() if (got := holdings(job))})
            with contextlib.suppress(OSError, ValueError):
                jobs_state = json.loads(state_path.read_text()).get("jobs", {})
                no_cpu |= {str(info.get("detail")) for info in jobs_state.values()
                           if "free CPU" in str(info.get("detail"))}
            if now and all(job.state in FINAL_STATES for job in now.values()):
                break
            assert proc.poll() is None, (tmp_path / "sidecar.err").read_text()[-3000:]
            time.sleep(0.5)
        wait_arrays(cluster, [array], proc, tmp_path / "sidecar.err", 60, book_path)
    (tmp_path / "seen.json").write_text(json.dumps(
        [{str(j): [k, sorted(g)] for j, (k, g) in h.items()} for h in seen]))
    study = {s["array"]: s for s in json.loads(book_path.read_text())["studies"]}[array]
    assert study["ended"] is not None, study
    book = study["trials"]
    given = {(t["task"], int(k)): v for t in book for k, v in t["verdicts"].items()}
    assert given == replay("sh", book, trials, 2, 2, steps), given
    for t in book:
        reports, told = study_files(tmp_path, t["job_id"])
        assert told == {int(k): v for k, v in t["verdicts"].items()}, t
        assert all(rep["steps"] == rung_targets(steps, 2, 2)[rung]
                   for rung, rep in reports.items()), (t, reports)
    final = tasks_of(cluster, array)
    assert all(job.state in ("COMPLETED", "CANCELLED") for job in final.values()), final
    events = JsonLinesReader(log).read_new()
    on_shards = {j for h in seen for j, (kind, _) in h.items() if kind == "shard"}
    paired = [e for e in events if e.get("event") == "action" and e.get("action") == "place"
              and e.get("mate")]
    refused = [e for e in events if e.get("event") == "share_refused"]
    if old:
        assert not on_shards and not paired, (seen, paired)
        return
    # node1 has a CPU per GPU, so a pair's second job would wait for a CPU and then start on
    # whichever GPU has a free shard: the policy offers no pair while the epoch's placements
    # ask more CPUs than the node has free, and says so; the sidecar refuses none for CPUs
    assert no_cpu and all("node1" in d for d in no_cpu), no_cpu
    assert not any("free CPU" in str(e.get("why")) for e in refused), refused
    # a pair placed ran on one GPU whenever both ran on shards
    for e in paired:
        for h in seen:
            a, b = h.get(int(str(e["job"]))), h.get(int(str(e["mate"])))
            if a and b and a[0] == b[0] == "shard":
                assert a[1] == b[1], (e, h)
