"""The throughput store (hadar_slurm/rates/store.py) and ``hadar-slurm throughputs`` (cli_store.py):
schema, precedence, learning, import/export round trips, bad input, and several writer
processes at once."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sqlite3
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.cli import store as cli_store
from hadar_slurm.errors import InputError
from hadar_slurm.rates.store import (
    LEARN_WINDOW,
    Entry,
    ThroughputStore,
    WindowRow,
    default_store_path,
)
from hadar_slurm.rates.table import ThroughputTable, default_table, load_table, parse_csv

RN = "ResNet-50 (batch size 64)"


@pytest.fixture
def store(tmp_path: Path) -> ThroughputStore:
    return ThroughputStore(tmp_path / "t.db")


# -- schema ----------------------------------------------------------------------------------


def test_creates_directory_schema_wal_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "t.db"
    with ThroughputStore(path) as s:
        e = s.record(RN, 2, "  V100 ", 7.5, when=1000.0)
    assert e == Entry(RN, 2, "v100", 7.5, "measured", 1, 1000.0)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    with ThroughputStore(path) as s:
        assert s.get(RN, 2, "v100") == e
        assert s.get(RN, 2, "V100") == e  # lookups normalize the GPU type too
        assert s.get(RN, 1, "v100") is None
        assert s.entries() == [e]


def test_default_store_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HADAR_THROUGHPUT_DB", str(tmp_path / "x.db"))
    assert default_store_path() == tmp_path / "x.db"
    monkeypatch.delenv("HADAR_THROUGHPUT_DB")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_store_path() == tmp_path / ".local/state/hadar-slurm/throughputs.db"


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("this is not SQLite\n" * 100)
    with pytest.raises(InputError) as err:
        ThroughputStore(bad)
    assert err.value.field == "[scheduler] throughput_db" and err.value.source == str(bad)
    assert "is damaged (file is not a database)" in err.value.problem
    assert err.value.fix is not None and "hadar-slurm throughputs recover" in err.value.fix


def test_used_in_another_process_is_refused(store: ThroughputStore) -> None:
    store.record("a", 1, "v100", 1.0)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_use_inherited, args=(store, queue))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert "open a new one" in queue.get(timeout=5)


def _use_inherited(store: ThroughputStore, queue: Any) -> None:
    try:
        store.get("a", 1, "v100")
        queue.put("no error")
    except RuntimeError as exc:
        queue.put(str(exc))


# -- precedence ------------------------------------------------------------------------------

# Each case: writes in order (method, source, rate, when), then the (source, rate) stored.
PRECEDENCE = [
    # an estimate fills a gap, and a newer estimate replaces it
    ([("estimate", None, 3.0, 1), ("estimate", None, 4.0, 2)], ("estimated", 4.0)),
    # a measurement replaces an estimate; an estimate never replaces a measurement
    ([("estimate", None, 3.0, 1), ("record", "measured", 5.0, 2)], ("measured", 5.0)),
    ([("record", "measured", 5.0, 1), ("estimate", None, 3.0, 2)], ("measured", 5.0)),
    # nor an imported value
    ([("record", "imported", 6.0, 1), ("estimate", None, 3.0, 2)], ("imported", 6.0)),
    # an import replaces an estimate and an older import, but not a measurement
    ([("estimate", None, 3.0, 1), ("record", "imported", 6.0, 2)], ("imported", 6.0)),
    ([("record", "imported", 6.0, 1), ("record", "imported", 7.0, 2)], ("imported", 7.0)),
    ([("record", "measured", 5.0, 1), ("record", "imported", 6.0, 2)], ("measured", 5.0)),
    # a measurement replaces an import; the most recent real value wins
    ([("record", "imported", 6.0, 1), ("record", "measured", 5.0, 2)], ("measured", 5.0)),
    ([("record", "measured", 5.0, 2), ("record", "measured", 9.0, 1)], ("measured", 5.0)),
    ([("learn", None, 8.0, 1), ("record", "measured", 5.0, 2)], ("measured", 5.0)),
    ([("learn", None, 8.0, 3), ("record", "measured", 5.0, 2)], ("learned", 8.0)),
    # learning replaces an import or estimate outright (not averaged with it)
    ([("record", "imported", 6.0, 1), ("learn", None, 8.0, 2)], ("learned", 8.0)),
    ([("estimate", None, 3.0, 1), ("learn", None, 8.0, 2)], ("learned", 8.0)),
]


@pytest.mark.parametrize(("writes", "expected"), PRECEDENCE)
def test_precedence(store: ThroughputStore, writes: list[tuple[str, str | None, float, int]],
                    expected: tuple[str, float]) -> None:
    for method, source, rate, when in writes:
        if method == "record":
            assert source is not None
            store.record("m", 1, "v100", rate, source=source, when=float(when))
        elif method == "estimate":
            store.estimate("m", 1, "v100", rate, when=float(when))
        else:
            store.learn("m", 1, "v100", rate, when=float(when))
    got = store.get("m", 1, "v100")
    assert got is not None and (got.source, got.rate) == expected


def test_estimate_returns_none_when_not_stored(store: ThroughputStore) -> None:
    first = store.estimate("m", 1, "k80", 2.0, when=1.0)
    assert first == Entry("m", 1, "k80", 2.0, "estimated", 0, 1.0)
    real = store.record("m", 1, "k80", 3.0, when=2.0)
    assert store.estimate("m", 1, "k80", 2.5, when=3.0) is None
    assert store.get("m", 1, "k80") == real
    # record() returns what is stored, which is the older real value when it did not win
    assert store.record("m", 1, "k80", 4.0, source="imported", when=4.0) == real


def test_sources_and_table_merged_over_base(store: ThroughputStore) -> None:
    base = default_table()
    before = base.rate(RN, 1, "v100")
    store.record(RN, 1, "v100", before * 2)
    store.learn(RN, 1, "a100", 40.0)
    store.estimate("new model", 2, "h100", 9.0)
    merged = store.table(base)
    assert merged.rate(RN, 1, "v100") == before * 2
    assert merged.rate(RN, 1, "a100") == 40.0
    assert merged.rate(RN, 1, "k80") == base.rate(RN, 1, "k80") > 0  # untouched
    assert merged.rate("new model", 2, "h100") == 9.0
    assert store.table().rates == {(RN, 1): {"v100": before * 2, "a100": 40.0},
                                   ("new model", 2): {"h100": 9.0}}
    assert store.sources() == {(RN, 1, "v100"): "measured", (RN, 1, "a100"): "learned",
                               ("new model", 2, "h100"): "estimated"}
    assert [e.source for e in store.entries("learned")] == ["learned"]
    assert store.entries("imported") == []


# -- learning --------------------------------------------------------------------------------


def test_learn_converges_despite_noise_outliers_and_slow_start(store: ThroughputStore) -> None:
    true_rate = 12.0
    rng = random.Random(5)
    seen: list[float] = []
    for i in range(200):
        if i < 6:
            rate = true_rate * 0.15  # warm-up: the first iterations are slow
        elif rng.random() < 0.15:
            rate = true_rate * rng.choice([0.05, 0.3, 4.0, 20.0])  # stalls and bogus spikes
        else:
            rate = true_rate * rng.gauss(1.0, 0.05)
        seen.append(rate)
        entry = store.learn(RN, 4, "v100", rate, when=float(i))
    assert entry is not None
    assert entry.source == "learned" and entry.samples == 200 and entry.updated == 199.0
    assert abs(entry.rate - true_rate) / true_rate < 0.03
    # the test means something: a mean of the same observations is far off
    assert abs(statistics.fmean(seen[-LEARN_WINDOW:]) - true_rate) / true_rate > 0.1
    assert abs(statistics.fmean(seen) - true_rate) / true_rate > 0.1
    # and already after the warm-up plus a few good samples, the slow start is outvoted
    s2 = ThroughputStore(store.path.parent / "t2.db")
    for r in [1.8] * 6 + [12.0, 12.2, 11.9, 12.1, 11.8, 12.3, 12.0]:
        e2 = s2.learn(RN, 4, "v100", r)
    assert e2 is not None
    assert 11.8 <= e2.rate <= 12.3


def test_learn_window_follows_a_changed_rate(store: ThroughputStore) -> None:
    for _ in range(40):
        store.learn("m", 1, "v100", 10.0)
    half = LEARN_WINDOW // 2
    for _ in range(half):
        e = store.learn("m", 1, "v100", 20.0)
    assert e is not None
    assert e.rate == 15.0  # 16 old and 16 new: median is the mean of the middle two
    e = store.learn("m", 1, "v100", 20.0)
    assert e is not None
    assert e.rate == 20.0 and e.samples == 40 + half + 1
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM observation").fetchone()[0] == LEARN_WINDOW


def test_learn_after_record_starts_from_the_measured_value(store: ThroughputStore) -> None:
    store.record("m", 1, "v100", 8.0, when=1.0)
    e = store.learn("m", 1, "v100", 12.0, when=2.0)
    assert e is not None
    assert (e.rate, e.samples, e.source, e.updated) == (10.0, 2, "learned", 2.0)
    # a new measurement restarts the window from itself
    store.record("m", 1, "v100", 30.0, when=3.0)
    e = store.learn("m", 1, "v100", 40.0, when=4.0)
    assert e is not None
    assert (e.rate, e.samples) == (35.0, 2)


def test_learn_waits_while_decide_says_not_yet(store: ThroughputStore) -> None:
    """A caller's decision (the sidecar's quorum of jobs): observations wait in the window with
    their job ids; an estimate or import meanwhile keeps them; a measurement restarts them."""
    seen: list[list[WindowRow]] = []

    def two_jobs(window: Sequence[WindowRow], old: Entry | None) -> float | None:
        seen.append(list(window))
        jobs = {r.job for r in window if not r.seed and r.job is not None}
        return max(r.rate for r in window) if len(jobs) >= 2 else None

    assert store.learn("m", 1, "v100", 5.0, job=1, decide=two_jobs) is None
    store.estimate("m", 1, "v100", 3.0)
    assert store.learn("m", 1, "v100", 6.0, job=1, decide=two_jobs) == store.get("m", 1, "v100")
    assert store.get("m", 1, "v100").source == "estimated"  # type: ignore[union-attr]
    assert [(r.rate, r.job) for r in seen[-1]] == [(5.0, 1), (6.0, 1)]
    e = store.learn("m", 1, "v100", 7.0, job=2, decide=two_jobs, when=9.0)
    assert e == Entry("m", 1, "v100", 7.0, "learned", 3, 9.0)
    assert store.anchors() == {}  # an estimate is no anchor
    # a measurement restarts the window from itself (a seed, no job): the quorum starts again
    store.record("m", 1, "v100", 4.0, when=10.0)
    assert store.learn("m", 1, "v100", 8.0, job=3, decide=two_jobs) == store.get(
        "m", 1, "v100")
    assert [(r.rate, r.job, r.seed) for r in seen[-1]] == [(4.0, None, True), (8.0, 3, False)]
    e = store.learn("m", 1, "v100", 6.0, job=4, decide=two_jobs, when=11.0)
    assert e is not None and (e.rate, e.source, e.samples) == (8.0, "learned", 3)
    # the measurement it replaced is the key's anchor
    assert store.anchors() == {("m", 1, "v100"): (4.0, "measured")}
    with pytest.raises(InputError) as err:
        store.learn("m", 1, "v100", 1.0, job="7")  # type: ignore[arg-type]
    assert err.value.field == "job"


# -- import / export -------------------------------------------------------------------------


def _filled(store: ThroughputStore) -> None:
    store.record(RN, 1, "v100", 1 / 3, when=1700000000.123456)
    store.record('quote\'s, "comma" model', 8, "a100", 123.456789012345, when=5.5)
    for r in (2.0, 3.0, 5.0):
        store.learn(RN, 2, "h100", r, when=7.25)
    store.estimate("A3C", 1, "k80", 0.1 + 0.2, when=8.0)
    store.record("LM (batch size 80)", 4, "p100", 1e-9, source="imported", when=9.0)


@pytest.mark.parametrize("fmt", ["json", "csv", "gavel"])
def test_export_import_round_trip(tmp_path: Path, store: ThroughputStore, fmt: str) -> None:
    _filled(store)
    out = tmp_path / f"out.{fmt}"
    assert store.export(out, fmt=fmt) == 5
    other = ThroughputStore(tmp_path / "other.db")
    assert other.import_file(out) == 5
    assert other.table().rates == store.table().rates  # rates bit for bit
    if fmt == "json":
        assert other.entries() == store.entries()  # every field, exactly
    else:
        assert {e.source for e in other.entries()} == {"imported"}
        assert {e.samples for e in other.entries()} == {1}
        # and the module that reads throughput files for the simulator reads it too
        path = out.with_suffix(".json") if fmt == "gavel" else out
        out.rename(path)
        assert load_table(path).rates == store.table().rates


def test_import_own_format_with_source_override(tmp_path: Path, store: ThroughputStore) -> None:
    _filled(store)
    store.export(tmp_path / "e.json")
    other = ThroughputStore(tmp_path / "o.db")
    assert other.import_file(tmp_path / "e.json", source="estimated") == 5
    assert {e.source for e in other.entries()} == {"estimated"}
    # importing the real values now replaces every estimate
    assert other.import_file(tmp_path / "e.json") == 5
    assert other.entries() == store.entries()


def test_import_gavel_table_skips_zero_rates_and_keeps_measurements(
        tmp_path: Path, store: ThroughputStore) -> None:
    table = default_table()
    nonzero = sum(1 for per in table.rates.values() for r in per.values() if r > 0)
    zero = sum(1 for per in table.rates.values() for r in per.values() if r == 0)
    assert zero > 0  # Gavel's table has OOM entries, or this test checks nothing
    store.record(RN, 1, "v100", 99.0)
    assert store.import_table(table) == nonzero - 1
    v100 = store.get(RN, 1, "v100")
    assert v100 is not None and (v100.rate, v100.source) == (99.0, "measured")
    assert store.get("ResNet-50 (batch size 128)", 2, "k80") is None
    csv_path = tmp_path / "extra.csv"
    csv_path.write_text("# mine\njob_type,scale_factor,gpu_type,steps_per_second\n"
                        f"{RN},1,A100,9.8\n{RN},1,v100,1.0\n")
    assert store.import_file(csv_path) == 1  # v100 is measured: kept
    a100 = store.get(RN, 1, "a100")
    assert a100 is not None and (a100.rate, a100.source, a100.samples) == (9.8, "imported", 1)


def test_import_is_all_or_nothing(tmp_path: Path, store: ThroughputStore) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "entries": [
        {"job_type": "a", "scale_factor": 1, "gpu_type": "v100", "rate": 1.0,
         "source": "measured", "samples": 1, "updated": 1.0},
        {"job_type": "b", "scale_factor": 1, "gpu_type": "v100", "rate": -1.0,
         "source": "measured", "samples": 1, "updated": 1.0},
    ]}))
    with pytest.raises(InputError) as err:
        store.import_file(bad)
    assert err.value.field == "entries[1].rate" and err.value.source == str(bad)
    assert store.entries() == []


# -- bad input -------------------------------------------------------------------------------

BAD_CALLS: list[tuple[str, Callable[[ThroughputStore], object]]] = [
    ("rate", lambda s: s.record("m", 1, "v100", 0.0)),
    ("rate", lambda s: s.record("m", 1, "v100", -2.0)),
    ("rate", lambda s: s.learn("m", 1, "v100", float("nan"))),
    ("rate", lambda s: s.estimate("m", 1, "v100", float("inf"))),
    ("rate", lambda s: s.record("m", 1, "v100", "3")),  # type: ignore[arg-type]
    ("rate", lambda s: s.record("m", 1, "v100", True)),
    ("job_type", lambda s: s.record("", 1, "v100", 1.0)),
    ("job_type", lambda s: s.learn(" m", 1, "v100", 1.0)),
    ("job_type", lambda s: s.record("a\nb", 1, "v100", 1.0)),
    ("scale_factor", lambda s: s.record("m", 0, "v100", 1.0)),
    ("scale_factor", lambda s: s.estimate("m", 2.0, "v100", 1.0)),  # type: ignore[arg-type]
    ("scale_factor", lambda s: s.get("m", True, "v100")),
    ("gpu_type", lambda s: s.record("m", 1, "  ", 1.0)),
    ("source", lambda s: s.record("m", 1, "v100", 1.0, source="guessed")),
    ("source", lambda s: s.entries("guessed")),
    ("source", lambda s: s.import_table(ThroughputTable({("m", 1): {"v100": 1.0}}), source="x")),
    ("when", lambda s: s.record("m", 1, "v100", 1.0, when=float("nan"))),
    ("format", lambda s: s.export(s.path.parent / "x.xml", fmt="xml")),
]


@pytest.mark.parametrize(("field", "call"), BAD_CALLS)
def test_bad_arguments_name_the_field(store: ThroughputStore, field: str,
                                      call: Callable[[ThroughputStore], object]) -> None:
    with pytest.raises(InputError) as err:
        call(store)
    assert err.value.field == field
    assert store.entries() == []


def _entry(**changes: object) -> dict[str, object]:
    good: dict[str, object] = {"job_type": "a", "scale_factor": 1, "gpu_type": "v100",
                               "rate": 1.0, "source": "measured", "samples": 1, "updated": 1.0}
    good.update(changes)
    return {k: v for k, v in good.items() if v is not ...}


BAD_FILES = [
    ("bad header", "x,y\n1,2\n", None, 1),
    ("bad CSV rate", "job_type,scale_factor,gpu_type,steps_per_second\na,1,v100,fast\n",
     "steps_per_second", 2),
    ("bad JSON", "{not json", None, 1),
    ("bad Gavel", json.dumps({"v100": {"('a', 1)": {"x": 1}}}), "v100.('a', 1)", None),
    ("version", json.dumps({"version": 9, "entries": []}), "version", None),
    ("entries", json.dumps({"version": 1, "entries": {}}), "entries", None),
    ("missing", json.dumps({"version": 1, "entries": [_entry(samples=...)]}), "entries[0]",
     None),
    ("unknown", json.dumps({"version": 1, "entries": [_entry(colour="red")]}), "entries[0]",
     None),
    ("samples", json.dumps({"version": 1, "entries": [_entry(samples=-1)]}),
     "entries[0].samples", None),
    ("updated", json.dumps({"version": 1, "entries": [_entry(updated=None)]}),
     "entries[0].updated", None),
    ("source", json.dumps({"version": 1, "entries": [_entry(source="rumour")]}),
     "entries[0].source", None),
    ("sf", json.dumps({"version": 1, "entries": [_entry(scale_factor="2")]}),
     "entries[0].scale_factor", None),
    ("twice", json.dumps({"version": 1, "entries": [_entry(), _entry(gpu_type="V100")]}),
     "entries[1]", None),
]


@pytest.mark.parametrize(("name", "text", "field", "line"), BAD_FILES,
                         ids=[b[0] for b in BAD_FILES])
def test_bad_files(tmp_path: Path, store: ThroughputStore, name: str, text: str,
                   field: str | None, line: int | None) -> None:
    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        store.import_file(path)
    assert (err.value.source, err.value.field, err.value.line) == (str(path), field, line)
    assert store.entries() == []


def test_missing_file(tmp_path: Path, store: ThroughputStore) -> None:
    with pytest.raises(InputError) as err:
        store.import_file(tmp_path / "nope.csv")
    assert err.value.field == "FILE" and "cannot read" in err.value.problem


# -- several writer processes ----------------------------------------------------------------

PROCS = 4
ROUNDS = 120


def _writer(db: str, proc: int, barrier: Any) -> None:
    barrier.wait()  # every process opens the (new) database at once, then writes at once
    store = ThroughputStore(db)
    for i in range(ROUNDS):
        store.record(f"rec-{proc}-{i}", 1 + i % 4, "a100", proc + 1 + i / 1000)  # distinct keys
        store.learn("shared", 1, "v100", 10.0 + proc)  # every process, one key
        store.learn("shared", 2, ("v100", "k80")[i % 2], 5.0)
        store.learn(f"counter-{proc}", 1, "p100", 3.0)  # only this process
        store.estimate(f"race-{i}", 1, "v100", 1.0)  # every process estimates every race key
        if i % PROCS == proc:
            store.record(f"race-{i}", 1, "v100", 2.0)  # and one measures it
    store.close()


def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    db = str(tmp_path / "shared.db")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCS)
    procs = [ctx.Process(target=_writer, args=(db, p, barrier)) for p in range(PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * PROCS
    with ThroughputStore(db) as store:
        for proc in range(PROCS):
            for i in range(ROUNDS):
                e = store.get(f"rec-{proc}-{i}", 1 + i % 4, "a100")
                assert e is not None and (e.rate, e.source) == (proc + 1 + i / 1000, "measured")
            counter = store.get(f"counter-{proc}", 1, "p100")
            assert counter is not None and counter.samples == ROUNDS
        shared = store.get("shared", 1, "v100")
        assert shared is not None and shared.samples == PROCS * ROUNDS
        assert 10.0 <= shared.rate <= 10.0 + PROCS - 1
        for gpu in ("v100", "k80"):
            e = store.get("shared", 2, gpu)
            assert e is not None and e.samples == PROCS * ROUNDS // 2
        races = [store.get(f"race-{i}", 1, "v100") for i in range(ROUNDS)]
        assert all(e is not None and (e.source, e.rate) == ("measured", 2.0) for e in races)
        assert len(store.entries()) == PROCS * ROUNDS + 1 + 2 + PROCS + ROUNDS


# -- the CLI ---------------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hadar-slurm")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_store.register(sub)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


def test_cli_import_list_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "cli.db")
    csv_path = tmp_path / "in.csv"
    csv_path.write_text("job_type,scale_factor,gpu_type,steps_per_second\n"
                        f"{RN},1,a100,9.8\n{RN},2,a100,18.5\n")
    assert _cli("throughputs", "import", str(csv_path), "--db", db) == 0
    assert "2 entries written" in capsys.readouterr().out
    assert _cli("throughputs", "import", str(csv_path), "--db", db, "--source", "estimated") == 0
    assert "0 entries written" in capsys.readouterr().out  # estimates never replace imports
    assert _cli("throughputs", "list", "--db", db) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["job", "type", "GPUs", "GPU", "type", "steps/s", "source",
                                "samples", "updated", "(UTC)"]
    assert lines[1].startswith(RN) and lines[1].split()[4:8] == ["1", "a100", "9.8", "imported"]
    assert len(lines) == 3
    assert _cli("throughputs", "list", "--db", db, "--source", "measured") == 0
    assert capsys.readouterr().out == "no entries of source measured\n"
    assert _cli("throughputs", "list", "--db", db, "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["scale_factor"], r["rate"], r["source"]) for r in rows] == [
        (1, 9.8, "imported"), (2, 18.5, "imported")]
    for fmt, name in (("json", "o.json"), ("csv", "o.csv"), ("gavel", "g.json")):
        assert _cli("throughputs", "export", str(tmp_path / name), "--db", db,
                    "--format", fmt) == 0
        assert f"2 entries written to {tmp_path / name} ({fmt})" in capsys.readouterr().out
    assert load_table(tmp_path / "o.csv").rates == {(RN, 1): {"a100": 9.8},
                                                   (RN, 2): {"a100": 18.5}}
    assert load_table(tmp_path / "g.json").rates == load_table(tmp_path / "o.csv").rates
    assert parse_csv(csv_path.read_text(), "x").rates == load_table(tmp_path / "o.csv").rates


def test_cli_config_opens_the_sidecars_store(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--config``: the store the sidecar of that config uses (``<state_dir>/throughputs.db``,
    or ``[scheduler] throughput_db``); ``--db`` still wins."""
    state = tmp_path / "state"
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[sidecar]\nstate_dir = "{state}"\n')
    csv_path = tmp_path / "in.csv"
    csv_path.write_text(f"job_type,scale_factor,gpu_type,steps_per_second\n{RN},1,k80,1.5\n")
    assert _cli("throughputs", "import", str(csv_path), "--config", str(config)) == 0
    assert str(state / "throughputs.db") in capsys.readouterr().out
    with ThroughputStore(state / "throughputs.db") as store:
        assert [(e.gpu_type, e.rate) for e in store.entries()] == [("k80", 1.5)]
    assert _cli("throughputs", "list", "--config", str(config), "--json") == 0
    assert [r["rate"] for r in json.loads(capsys.readouterr().out)] == [1.5]

    chosen = tmp_path / "chosen.db"
    config.write_text(f'[sidecar]\nstate_dir = "{state}"\n'
                      f'[scheduler]\nthroughput_db = "{chosen}"\n')
    with pytest.raises(InputError, match="no such throughput database") as err:
        _cli("throughputs", "list", "--config", str(config))
    assert str(chosen) in str(err.value) and "--config" in str(err.value)
    other = tmp_path / "other.db"
    assert _cli("throughputs", "import", str(csv_path), "--config", str(config),
                "--db", str(other)) == 0
    assert other.exists() and not chosen.exists()
    capsys.readouterr()
    config.write_text("[scheduler]\nbogus = 1\n")
    with pytest.raises(InputError, match="bogus"):
        _cli("throughputs", "list", "--config", str(config))


@pytest.mark.parametrize(("argv", "field"), [
    (["list", "--db", "{tmp}/none.db"], "--db"),
    (["export", "{tmp}/o.json", "--db", "{tmp}/none.db"], "--db"),
    (["list", "--db", "{tmp}/made.db", "--source", "bogus"], "source"),
    (["import", "{tmp}/missing.csv", "--db", "{tmp}/made.db"], "FILE"),
    (["import", "{tmp}/made.csv", "--db", "{tmp}/made.db", "--source", "bogus"], "source"),
    (["export", "{tmp}/o.xml", "--db", "{tmp}/made.db", "--format", "xml"], "format"),
    (["export", "{tmp}/no/such/dir/o.json", "--db", "{tmp}/made.db"], "FILE"),
])
def test_cli_errors_are_input_errors(tmp_path: Path, argv: list[str], field: str) -> None:
    ThroughputStore(tmp_path / "made.db").close()
    (tmp_path / "made.csv").write_text("job_type,scale_factor,gpu_type,steps_per_second\n")
    with pytest.raises(InputError) as err:
        _cli("throughputs", *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert err.value.field == field
    assert not (tmp_path / "none.db").exists()  # list/export do not create a database

