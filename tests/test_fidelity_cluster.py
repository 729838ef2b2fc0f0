"""bench.fidelity, shortened, on the real dev cluster: a handful of emulated jobs run by the
sidecar (policy hadar, 6-second epochs, 60x compressed), and the a100 node drained on the way so
that the jobs on it must move.  Only what cannot be noisy is asserted:

* every job completes, once (one successful end of its payload), and none is left held;
* every run of every job ran on the node the sidecar placed it on, and the payload ran at the
  rate of that node's GPU type (it says which type it found);
* the moves happen within the epoch: every job an epoch moves (the drain forces some) is
  placed on its new GPUs in the epoch that signalled it, none is deferred.

The figures (makespan, JCTs against the simulator's) are the bench's, not this test's.
"""

from __future__ import annotations

import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.epoch_overhead import Cluster
from bench.fidelity import Settings, _runs, payload_restart, run_live
from hadar_slurm.logs import read_events
from hadar_slurm.model import Job
from hadar_slurm.runtime.warmstart import warm_server
from tests.slurm_cluster import DevCluster, nodes_conf

pytest.importorskip("torch")

NODE_TYPE = {name: t for name, (t, _) in nodes_conf().items()}
#: (job type, GPUs, steps, arrival in real seconds): 40 to 90 wall seconds each at 60x.
JOBS = (("ResNet-50 (batch size 64)", 1, 30000, 0), ("Transformer (batch size 128)", 2, 40000, 0),
        ("A3C", 1, 25000, 0), ("ResNet-50 (batch size 128)", 4, 30000, 0),
        ("ResNet-18 (batch size 256)", 1, 40000, 300))


def _ts(text: object) -> float:
    """A log line's ``ts`` (UTC, milliseconds) as Unix time."""
    return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=UTC).timestamp()


def test_short_fidelity_run_completes_every_job_once_where_it_was_placed(
        dev_cluster: DevCluster, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    cluster = Cluster(dev_cluster.dir / "etc" / "slurm.conf", dev_cluster.runner, None)
    jobs = [Job(k, t, scale_factor=g, total_steps=float(s), arrival_s=float(a))
            for k, (t, g, s, a) in enumerate(JOBS)]
    # the payloads start warm, as the bench's do (a Unix socket's path must stay short)
    with tempfile.TemporaryDirectory(prefix="hadar-warm-") as wd, \
            warm_server(Path(wd) / "sock", log=tmp_path / "warmstart.log") as warm:
        pad, restart = payload_restart(warm=warm)
        st = Settings(compression=60, epoch_s=6, restart_s=restart, pad_s=pad)
        run = run_live(cluster, jobs, "hadar", st, tmp_path, timeout_s=400,
                       drain=(15.0, "node4"), warm=warm)
    assert run.problems == [], run.problems
    assert sorted(run.jct) == list(range(len(JOBS)))
    ids: dict[int, int] = run.detail["slurm_ids"]
    events = read_events(tmp_path / "sidecar-hadar.log")
    places: dict[int, list[tuple[float, list[str]]]] = {}  # job -> (time, nodes) of each place
    epoch_of: dict[tuple[int, str], list[int]] = {}
    for e in events:
        if e.get("event") == "action":
            job, action = int(e["job"]), str(e["action"])  # type: ignore[call-overload]
            epoch_of.setdefault((job, action), []).append(int(e["epoch"]))  # type: ignore
            if action == "place":
                places.setdefault(job, []).append(
                    (_ts(e["ts"]), [str(n) for n in e["nodes"]]))  # type: ignore[attr-defined]
    for slurm in ids.values():
        runs = _runs(tmp_path / "out-hadar" / f"{slurm}.log")
        # each run where the sidecar last placed it before it started (an early epoch may
        # place a job again before its delayed start)
        placed: list[list[str]] = []  # the nodes of each run
        for run_ in runs:
            last = [nodes for t, nodes in places[slurm] if t <= run_["start"] + 0.2]
            assert last and last[-1][0] == run_["host"], (slurm, runs, places[slurm])
            placed.append(last[-1])
        out = (tmp_path / "out-hadar" / f"{slurm}.out").read_text()
        segments = out.split("== run on ")[1:]
        assert len(segments) == len(runs), (slurm, out)
        for run_, seg, nodes in zip(runs, segments, placed, strict=True):
            assert seg.startswith(run_["host"] + "\n")
            found = re.findall(r"emulate: .+? on \d+ GPU\(s\) of (\S+): ", seg)
            # the payload ran at the rate of the types of the nodes it was placed on (a gang
            # over two types names both: it runs at the slower's rate), or was stopped while
            # it started (a move right after a placement): a preemption's 75 (or killed by it
            # in Python's own start: 138, below)
            assert (len(found) == 1 and set(found[0].split("/")) == {
                NODE_TYPE[n] for n in nodes}) or (not found and run_["rc"] in (75, 138)), (
                    seg, nodes)
        # every run but the last stopped on the signal (75), or was killed by it before the
        # payload could take it, in Python's own start (138 = 128 + USR1: the sidecar requeues
        # it, nothing was done)
        assert [r["rc"] for r in runs][-1] == 0
        for run_, seg in zip(runs[:-1], segments[:-1], strict=True):
            assert run_["rc"] == 75 or (run_["rc"] == 138 and "emulate:" not in seg), seg
    # the moves happen within the epoch: in every epoch, the jobs it signalled and placed
    # again are as many as the moves it decided (a preempted job is signalled, not placed;
    # a moved job that completed in its grace period is not placed again either)
    decided = {int(e["epoch"]): int(e["moves"])  # type: ignore[call-overload]
               for e in events if e.get("event") == "epoch"}
    ended = {(int(e["epoch"]), int(e["job"])) for e in events  # type: ignore[call-overload]
             if e.get("event") == "preempt_skipped" and "COMPLETED" in str(e.get("why"))}
    for epoch, moves in decided.items():
        done = {j for (j, a), epochs in epoch_of.items() if a == "signal" and epoch in epochs
                and (epoch in epoch_of.get((j, "place"), []) + epoch_of.get((j, "fork"), [])
                     or (epoch, j) in ended)}
        assert len(done) == moves, (epoch, moves, done)
    assert sum(decided.values()) >= 1  # the drained a100 node had jobs on it: they moved
    assert sum(decided.values()) == run.moves
    assert not [e for e in events if e.get("event") == "move_deferred"]
