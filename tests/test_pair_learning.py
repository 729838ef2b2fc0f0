"""Co-located rates learned from running pairs (issue #16): a job that shares its GPU with a
mate reports its rounds like any job; the sidecar folds a round into the store's co-located
rates only when both jobs held the GPU for all of it, checks it as it checks isolated rates
(Slurm's GPU type and run, warm-up left out, bounded by the table's pair rate, a quorum of
jobs), and plans with the median of the votes and the prior from the next epoch on."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.rates.learn import LEARN_FACTOR, Knowledge, SlurmRun
from hadar_slurm.rates.store import LEARN_WINDOW, ThroughputStore
from hadar_slurm.rates.table import default_table
from hadar_slurm.sidecar.fork import Progress
from tests.test_learn import NOW, progress
from tests.test_share_sidecar import A3C, RESNET, shard_job, shard_node, sharing
from tests.test_sidecar_backend import FakeSlurm

R50 = "ResNet-50 (batch size 64)"
A3C_TYPE = "A3C"
SINCE = NOW - 600.0


def prior() -> tuple[float, float]:
    rates = default_table().colocated.pair_rate(R50, A3C_TYPE, 1, "v100")
    assert rates[0] > 0 and rates[1] > 0  # Gavel measured this pair on a v100
    return rates


def shared(rate: float, run: str, rounds: int = 3) -> Progress:
    return progress(rounds, rounds, [(None, rate * 20.0, 20.0)], run=run)


def on_v100(start: float = SINCE) -> dict[int, SlurmRun]:
    return {0: SlurmRun("v100", start)}


def test_store_keeps_one_vote_per_job_and_a_window(tmp_path: Path) -> None:
    with ThroughputStore(tmp_path / "t.db") as store:
        assert store.learn_pair(R50, A3C_TYPE, 1, "v100", 2.0, job=1, when=1.0) == 1
        assert store.learn_pair(R50, A3C_TYPE, 1, "v100", 3.0, job=1, when=2.0) == 1  # replaced
        assert store.learn_pair(R50, A3C_TYPE, 1, "v100", 4.0, job=2, when=3.0) == 2
        assert store.pair_votes() == {(R50, A3C_TYPE, 1): {"v100": [3.0, 4.0]}}
        for j in range(3, LEARN_WINDOW + 5):
            store.learn_pair(R50, A3C_TYPE, 1, "v100", 5.0, job=j, when=float(j))
        votes = store.pair_votes()[(R50, A3C_TYPE, 1)]["v100"]
        assert len(votes) == LEARN_WINDOW and 3.0 not in votes and 4.0 not in votes


def test_learned_pairs_travel_in_the_json_export(tmp_path: Path) -> None:
    with ThroughputStore(tmp_path / "t.db") as store:
        store.learn_pair(R50, A3C_TYPE, 1, "v100", 3.0, job=1, when=2.0)
        store.learn_pair(R50, A3C_TYPE, 1, "v100", 4.0, job=2, when=3.0)
        store.record(R50, 1, "v100", 9.0)
        out = tmp_path / "export.json"
        store.export(out)
    data = json.loads(out.read_text())
    assert data["pair_votes"] == [
        {"job_type": R50, "mate_type": A3C_TYPE, "scale_factor": 1, "gpu_type": "v100",
         "job": j, "rate": r, "seen": t} for j, r, t in ((1, 3.0, 2.0), (2, 4.0, 3.0))]
    with ThroughputStore(tmp_path / "copy.db") as copy:
        copy.import_file(out)
        assert copy.pair_votes() == {(R50, A3C_TYPE, 1): {"v100": [3.0, 4.0]}}
        # the same job's vote again replaces it (one vote per job), as it does when learned
        copy.import_file(out)
        assert copy.pair_votes() == {(R50, A3C_TYPE, 1): {"v100": [3.0, 4.0]}}
    # a bad vote names its field and nothing of the file is written
    for field, value, match in (("rate", -1.0, r"pair_votes\[1\]\.rate"),
                                ("job", "seven", r"pair_votes\[1\]\.job"),
                                ("mate_type", "", r"pair_votes\[1\]\.mate_type")):
        votes = [data["pair_votes"][0], dict(data["pair_votes"][1], **{field: value})]
        bad = tmp_path / f"bad-{field}.json"
        bad.write_text(json.dumps(dict(data, pair_votes=votes)))
        with ThroughputStore(tmp_path / f"bad-{field}.db") as other:
            with pytest.raises(InputError, match=match):
                other.import_file(bad)
            assert other.entries() == [] and other.pair_votes() == {}
    # an export without the key (an older hadar-slurm) has no votes
    del data["pair_votes"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    with ThroughputStore(tmp_path / "old.db") as old:
        old.import_file(tmp_path / "old.json")
        assert old.pair_votes() == {} and len(old.entries()) == 1


def test_pairs_are_learned_through_the_gates(tmp_path: Path) -> None:
    ra, rb = prior()
    with ThroughputStore(tmp_path / "t.db") as store:
        k = Knowledge(default_table(), store)
        # warm-up, and a round that began before the two shared the GPU, teach nothing
        assert k.observe_pair(1, R50, A3C_TYPE, 1, progress(1, 1, [(None, 20.0, 20.0)], run="1"),
                              on_v100(), SINCE, now=NOW) is None
        late = progress(2, 2, [(None, 20.0, 20.0)], run="1")
        assert k.observe_pair(1, R50, A3C_TYPE, 1, late, on_v100(), NOW - 5.0,
                              now=NOW) is None
        # far from the table's pair rate: refused, not clipped
        wild = shared(ra * LEARN_FACTOR * 2, run="2")
        assert k.observe_pair(2, R50, A3C_TYPE, 1, wild, on_v100(), SINCE, now=NOW) is None
        assert store.pair_votes() == {}
        # one job is no quorum: the table keeps its rate
        got = k.observe_pair(3, R50, A3C_TYPE, 1, shared(ra * 0.8, run="3"), on_v100(), SINCE,
                             now=NOW)
        assert got is not None and got.rate == pytest.approx(ra * 0.8)
        k.refresh()
        assert k.table.colocated.pair_rate(R50, A3C_TYPE, 1, "v100") == pytest.approx((ra, rb))
        # a second job: the median of 0.8, 0.9 and the prior (1.0) times ra; the mate's side,
        # never learned, keeps the table's rate, in both orders
        k.observe_pair(4, R50, A3C_TYPE, 1, shared(ra * 0.9, run="4"), on_v100(), SINCE,
                       now=NOW)
        k.refresh()
        want = statistics.median([ra * 0.8, ra * 0.9, ra])
        assert k.table.colocated.pair_rate(R50, A3C_TYPE, 1, "v100") == pytest.approx(
            (want, rb))
        assert k.table.colocated.pair_rate(A3C_TYPE, R50, 1, "v100") == pytest.approx(
            (rb, want))
        # the other GPU types' estimates are not moved off the table's own
        assert k.table.rate(R50, 1, "v100") == default_table().rate(R50, 1, "v100")


def test_a_forbidden_pair_stays_forbidden(tmp_path: Path) -> None:
    table = default_table()
    forbidden = next((a, b, g) for (a, b, s), per in table.colocated.rates.items()
                     for g, (x, y) in per.items() if s == 1 and x == 0 and y == 0 and a != b)
    a, b, g = forbidden
    with ThroughputStore(tmp_path / "t.db") as store:
        store.learn_pair(a, b, 1, g, 1.0, job=1)
        store.learn_pair(a, b, 1, g, 1.0, job=2)
        k = Knowledge(table, store)
        assert k.table.colocated.pair_rate(a, b, 1, g) == (0.0, 0.0)
        assert k.observe_pair(3, a, b, 1, shared(1.0, run="3"), {0: SlurmRun(g, SINCE)},
                              SINCE, now=NOW) is None


def test_the_sidecar_learns_a_running_pair(tmp_path: Path) -> None:
    """Jobs 5 (ResNet-50) and 6 (A3C) hold one shard each of GPU 0 of node1 (a v100) since
    1900 and report a round of 20 s ending at 1990; job 7 holds a shard of GPU 1 alone.  The
    store learns one vote for each side of the pair, and no isolated rate of anyone."""
    ra, rb = prior()
    now = 2000.0
    reports = {5: ra * 0.9, 6: rb * 0.9, 7: 1.0}
    jobs = []
    for j, comment, gpu in ((5, RESNET, 0), (6, A3C, 0), (7, RESNET, 1)):
        tracker = tmp_path / f"w{j}" / ".hadar-tracker" / str(j)
        tracker.mkdir(parents=True)
        rate = reports[j]
        (tracker / "progress.json").write_text(json.dumps({
            "format": 1, "job": str(j), "work": 100_000, "done": 3000, "rounds": 3,
            "copies": 1, "copy_rates": [{"copy": 0, "gpu_type": None, "iters": rate * 20,
                                         "seconds": 20.0, "iters_per_s": rate}],
            "iters_per_s": rate, "complete": False, "stop": None, "run": f"{j}.0",
            "run_rounds": 3, "checkpoint": None, "updated_at": 1990.0}))
        jobs.append(dataclasses.replace(shard_job(j, gpu, comment=comment),
                                        workdir=str(tmp_path / f"w{j}")))
    api = FakeSlurm(jobs, [shard_node("node1", "v100", 4, (2, 1, 0, 0))])
    api.version = "slurm 24.11.5"
    with ThroughputStore(tmp_path / "t.db") as store:
        b = sharing(api, knowledge=Knowledge(default_table(), store))
        b.snapshot(0, now, 60.0, None)
        votes = store.pair_votes()
        assert votes == {(R50, A3C_TYPE, 1): {"v100": [pytest.approx(ra * 0.9)]},
                         (A3C_TYPE, R50, 1): {"v100": [pytest.approx(rb * 0.9)]}}
        assert store.entries("learned") == [] and store.get(R50, 1, "v100") is None
