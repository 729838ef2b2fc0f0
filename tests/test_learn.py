"""The sidecar's throughput knowledge: online learning from the runtime's progress, estimates
for what was never measured, and their use by the backend from the next epoch on.

The store is the real SQLite store, the estimates the real completion; the progress files come
from the real training runtime (torch, on the CPU) where a test needs them to be real, and are
written by hand in the runtime's documented format where a test needs exact numbers.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.rates.learn import Knowledge, SlurmRun
from hadar_slurm.rates.store import ThroughputStore
from hadar_slurm.rates.table import ThroughputTable, default_table
from hadar_slurm.sidecar.backend import SlurmBackend
from hadar_slurm.sidecar.fork import Progress, read_progress
from hadar_slurm.slurm.parse import Gres
from tests.test_sidecar_backend import FakeSlurm, job, node

RESNET = "ResNet-50 (batch size 64)"
#: the sidecar's clock in these tests, and when Slurm started the jobs
NOW = 100_000.0
START = NOW - 3600.0


def progress(rounds: int, run_rounds: int | None, copies: list[tuple[str | None, float, float]],
             run: str = "7.0", updated_at: float = NOW - 1.0) -> Progress:
    """A Progress as fork.read_progress returns it, from (gpu_type, iters, seconds) per copy."""
    return Progress(
        done=float(rounds * 1000), work=100_000.0,
        rates={k: it / s for k, (_, it, s) in enumerate(copies)},
        gpu_types={k: t for k, (t, _, _) in enumerate(copies) if t is not None},
        rounds=rounds, complete=False, updated_at=updated_at,
        measured={k: (it, s) for k, (_, it, s) in enumerate(copies)}, run=run,
        run_rounds=run_rounds)


def on(*gpu_types: str, start: float = START) -> dict[int, SlurmRun]:
    """What Slurm says of a job's copies: copy k runs on ``gpu_types[k]`` since ``start``."""
    return {k: SlurmRun(t, start) for k, t in enumerate(gpu_types)}


def test_observe_skips_warm_up_and_folds_each_round_once(tmp_path: Path) -> None:
    with ThroughputStore(tmp_path / "t.db") as store:
        k = Knowledge(default_table(), store)
        # the first round of a run is warm-up
        assert k.observe(7, RESNET, 1, progress(1, 1, [(None, 10.0, 10.0)]), on("v100"),
                         now=NOW) == []
        learned = k.observe(7, RESNET, 1, progress(2, 2, [(None, 100.0, 10.0)]), on("v100"),
                            now=NOW)
        assert [(o.gpu_type, o.rate) for o in learned] == [("v100", 10.0)]
        # the same committed round seen again next epoch is not folded again
        assert k.observe(7, RESNET, 1, progress(2, 2, [(None, 100.0, 10.0)]), on("v100"),
                         now=NOW) == []
        assert k.learned == 1
        # one job's round waits for other jobs (tests/test_learn_trust.py): nothing stored yet
        assert store.get(RESNET, 1, "v100") is None
        # a runtime that does not say which round of its run it is: not learned from
        assert k.observe(8, RESNET, 1, progress(5, None, [(None, 50.0, 10.0)]), on("v100"),
                         now=NOW) == []
        # an unforked job on two GPU types: the backend has no one type to say it ran on
        assert k.observe(9, RESNET, 2, progress(3, 3, [(None, 50.0, 10.0)]), {}, now=NOW) == []
        # a fork: each copy on its own type (a100: no prior, only the sanity bounds)
        fork = progress(4, 2, [("a100", 400.0, 10.0), ("k80", 20.0, 10.0)], run="11.0")
        got = {o.gpu_type: o.rate for o in k.observe(10, RESNET, 1, fork, on("a100", "k80"),
                                                     now=NOW)}
        assert got == {"a100": 40.0, "k80": 2.0}
        # without a store nothing is learned
        assert Knowledge(default_table()).observe(
            7, RESNET, 1, progress(3, 3, [(None, 100.0, 10.0)]), on("v100"), now=NOW) == []


def test_learned_rate_converges_through_outliers_and_is_used(tmp_path: Path) -> None:
    rng = random.Random(5)
    true_rate = 12.5
    with ThroughputStore(tmp_path / "t.db") as store:
        k = Knowledge(default_table(), store, gpu_types=("v100", "p100", "k80"))
        before = k.table.rate(RESNET, 1, "v100")
        assert k.source(RESNET, 1, "v100") == "table"
        for r in range(2, 40):
            seconds = 10.0
            rate = true_rate * rng.uniform(0.95, 1.05)
            if r % 7 == 0:
                rate = true_rate * 0.1  # a round with a stall
            if r % 11 == 0:
                rate = true_rate * 8  # a bogus clock
            # two jobs, alternating rounds (one job alone does not set a rate)
            k.observe(7 + r % 2, RESNET, 1,
                      progress(r, r, [(None, rate * seconds, seconds)]), on("v100"), now=NOW)
        k.refresh()
        learned = k.table.rate(RESNET, 1, "v100")
        assert learned != pytest.approx(before, rel=0.05)
        assert learned == pytest.approx(true_rate, rel=0.03)
        assert k.source(RESNET, 1, "v100") == "learned"
        # other entries keep the table's values
        assert k.table.rate(RESNET, 1, "p100") == default_table().rate(RESNET, 1, "p100")


def test_missing_types_are_estimated_marked_and_replaced_by_a_measurement(
        tmp_path: Path) -> None:
    base = default_table()
    assert base.rate(RESNET, 1, "a100") == 0.0  # Gavel never measured an A100
    with ThroughputStore(tmp_path / "t.db") as store:
        # one job type measured on an A100: the rest of the table's rows get A100 estimates
        store.record("Transformer (batch size 64)", 1, "a100",
                     3 * base.rate("Transformer (batch size 64)", 1, "v100"))
        k = Knowledge(base, store, gpu_types=("v100", "p100", "k80", "a100"))
        est = k.table.rate(RESNET, 1, "a100")
        assert est > 0 and k.source(RESNET, 1, "a100") == "estimated"
        entry = store.get(RESNET, 1, "a100")
        assert entry is not None and entry.source == "estimated"
        assert entry.rate == pytest.approx(est)
        assert k.source("Transformer (batch size 64)", 1, "a100") == "measured"
        assert k.source(RESNET, 1, "v100") == "table"
        store.record(RESNET, 1, "a100", 2.0 * est)
        k.refresh()
        assert k.source(RESNET, 1, "a100") == "measured"
        assert k.table.rate(RESNET, 1, "a100") == pytest.approx(2.0 * est)
    # without a store the estimates are made in memory, for the cluster's types only
    mem = Knowledge(ThroughputTable({(RESNET, 1): {"v100": 10.0, "p100": 5.0},
                                     ("LM (batch size 20)", 1): {"v100": 4.0, "p100": 2.0,
                                                                 "k80": 1.0}}),
                    gpu_types=("v100", "p100", "k80"))
    assert mem.source(RESNET, 1, "k80") == "estimated"
    assert mem.table.rate(RESNET, 1, "k80") == pytest.approx(2.5, rel=0.05)


def _train_unforked(tracker: Path, work: int, rounds_iters: int) -> dict[str, Any]:
    """Run a real (tiny) model through the runtime, unforked, as a job's script would."""
    torch = pytest.importorskip("torch")
    from hadar_slurm.runtime import JobRuntime, RuntimeConfig

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = RuntimeConfig(work=work, tracker_dir=tracker, round_iters=rounds_iters, device="cpu")
    with open(os.devnull, "w") as quiet, JobRuntime(model, opt, cfg, log=quiet) as rt:
        for _ in rt.steps():
            x = torch.randn(16, 8)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        rt.finish()
    data = json.loads((tracker / "progress.json").read_text())
    assert isinstance(data, dict)
    return data


def test_backend_learns_from_running_jobs_and_plans_the_next_epoch_with_it(
        tmp_path: Path) -> None:
    # three jobs (a rate is learned from several jobs, not one), each a real run of the runtime
    workdirs = {j: tmp_path / f"work{j}" for j in (5, 6, 7)}
    observed = {}
    for j, workdir in workdirs.items():
        data = _train_unforked(workdir / ".hadar-tracker" / str(j), work=600, rounds_iters=200)
        assert data["run_rounds"] == 3 and data["copy_rates"][0]["iters"] == 200
        observed[j] = data["copy_rates"][0]["iters"] / data["copy_rates"][0]["seconds"]
    now = time.time()  # the runtime dates its reports with the wall clock
    # the prior (the base table) as the middle of what they achieve: within the bounds
    prior = statistics.median(observed.values())
    base = default_table().merged(ThroughputTable({(RESNET, 1): {"v100": prior}}, "prior"))
    running = [replace(job(j, state="RUNNING", reason="None", nodes=("n1",),
                           start=int(now - 600), admin="hadar epoch=0 state=placed place=n1:1"),
                       workdir=str(workdirs[j])) for j in workdirs]
    api = FakeSlurm(running, [node("n1", "v100", 4, used=3), node("n2", "p100", 4)])
    with ThroughputStore(tmp_path / "t.db") as store:
        b = SlurmBackend(api, base, preempt_grace_s=5.0, sleep=lambda s: None,
                         knowledge=Knowledge(base, store))
        first = b.snapshot(0, now, 60.0, None)
        v100 = first.gpu_types.index("v100")
        assert first.rate[0, v100] == pytest.approx(prior)
        assert b.views[5].rate_sources[v100] == "table"
        entry = store.get(RESNET, 1, "v100")
        assert entry is not None and entry.source == "learned" and entry.samples == 3
        # the median of one vote per job and one for the prior
        assert entry.rate == pytest.approx(statistics.median([*observed.values(), prior]))
        second = b.snapshot(1, now + 60.0, 60.0, None)  # the next epoch plans with it
        assert second.rate[0, v100] == pytest.approx(entry.rate)
        assert b.views[5].rate_sources[v100] == "learned"
        # the reader the backend uses sees what the runtime wrote
        p = read_progress(str(workdirs[5] / ".hadar-tracker" / "5"))
        assert p is not None and p.run_rounds == 3 and p.measured[0][0] == 200


def test_a_job_on_a_gpus_shards_teaches_nothing(tmp_path: Path) -> None:
    """GPU sharing (issue #16): a job that runs on a GPU's shards may share the GPU with
    another job, so its rounds are no measure of its speed alone.  Jobs 5, 6 and 8 hold whole
    V100s and report 10.0, 11.0 and 12.0 it/s; job 7 holds a shard and reports 5.0 (as it
    would beside a partner): the store learns from 5, 6 and 8 only, one vote each and one for
    the prior (10.5): the median of 10.0, 10.5, 11.0, 12.0 is 10.75 (with job 7's vote it
    would be 10.5, from 4 samples)."""
    now = time.time()
    rates = {5: 10.0, 6: 11.0, 7: 5.0, 8: 12.0}
    for j, rate in rates.items():
        tracker = tmp_path / f"work{j}" / ".hadar-tracker" / str(j)
        tracker.mkdir(parents=True)
        (tracker / "progress.json").write_text(json.dumps({
            "format": 1, "job": str(j), "work": 100_000, "done": 3000, "remaining": 97_000,
            "rounds": 3, "copies": 1, "copy_rates": [
                {"copy": 0, "gpu_type": None, "iters": rate * 20, "seconds": 20.0,
                 "iters_per_s": rate}],
            "iters_per_s": rate, "complete": False, "stop": None, "run": f"{j}.0",
            "run_rounds": 3, "checkpoint": None, "updated_at": now - 1.0}))
    base = default_table().merged(ThroughputTable({(RESNET, 1): {"v100": 10.5}}, "prior"))
    running = [replace(job(j, state="RUNNING", reason="None", nodes=("n1",),
                           start=int(now - 600), admin="hadar epoch=0 state=placed place=n1:1",
                           gpus=1 if j != 7 else 0),
                       workdir=str(tmp_path / f"work{j}")) for j in rates]
    running[2] = replace(running[2], gres=(Gres("shard", None, 1),))
    api = FakeSlurm(running, [node("n1", "v100", 4, used=3), node("n2", "p100", 4)])
    with ThroughputStore(tmp_path / "t.db") as store:
        b = SlurmBackend(api, base, preempt_grace_s=5.0, sleep=lambda s: None,
                         knowledge=Knowledge(base, store))
        b.snapshot(0, now, 60.0, None)
        entry = store.get(RESNET, 1, "v100")
        assert entry is not None and entry.source == "learned" and entry.samples == 3
        assert entry.rate == pytest.approx(10.75)


def test_estimates_are_planned_with_the_optimism_factor_and_stored_plain(
        tmp_path: Path) -> None:
    base = default_table()
    with ThroughputStore(tmp_path / "t.db") as store:
        store.record("Transformer (batch size 64)", 1, "a100",
                     3 * base.rate("Transformer (batch size 64)", 1, "v100"))
        types = ("v100", "p100", "k80", "a100")
        measured = ThroughputTable({("Transformer (batch size 64)", 1): {
            "a100": 3 * base.rate("Transformer (batch size 64)", 1, "v100")}})
        plain = Knowledge(base.merged(measured), None, gpu_types=types)
        k = Knowledge(base, store, optimism=3.0, gpu_types=types)
        entry = store.get(RESNET, 1, "a100")
        assert entry is not None and entry.source == "estimated"
        assert entry.rate == pytest.approx(plain.table.rate(RESNET, 1, "a100"))
        assert k.table.rate(RESNET, 1, "a100") == pytest.approx(3.0 * entry.rate)
        # real values are planned as they are
        assert k.table.rate(RESNET, 1, "v100") == base.rate(RESNET, 1, "v100")
        assert k.table.rate("Transformer (batch size 64)", 1, "a100") == pytest.approx(
            3 * base.rate("Transformer (batch size 64)", 1, "v100"))
