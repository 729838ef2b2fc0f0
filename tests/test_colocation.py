"""GPU sharing for the emulated payload (issue #16): the sidecar tells a job whom it shares its GPU
with through ``sharing.json`` in its tracker dir (hadar_slurm.runtime.colocation: written
atomically, read without ever raising), and the emulated payload then advances at the table's
co-located rate for the pair, and at its isolated rate again once the partner has finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.rates.table import default_table
from hadar_slurm.runtime.colocation import (
    SHARING_FILE,
    Sharing,
    clear_sharing,
    partner_done,
    read_sharing,
    write_sharing,
)
from hadar_slurm.runtime.emulate import CHECK_S, Pace, SharingWatch

REPO = Path(__file__).resolve().parent.parent
TABLE = default_table()
#: A pair the bundled table allows on a k80, where A3C runs at well under half its isolated
#: rate (1.47 against 3.44 steps/s): a payload that ignored the sharing would be seen.
JOB, PARTNER, GPU = "A3C", "CycleGAN", "k80"
#: A pair the bundled table forbids ((0, 0)) on a k80 (and allows on a p100).
FORBIDDEN = "ResNet-50 (batch size 128)"


def _sharing(partner_tracker: Path | str = "", **kw: Any) -> Sharing:
    return Sharing(**{"partner": 4243, "partner_type": PARTNER, "gpu_type": GPU,
                      "partner_tracker": str(partner_tracker), **kw})


def _progress(tracker: Path, complete: bool) -> None:
    tracker.mkdir(parents=True, exist_ok=True)
    tmp = tracker / "progress.json.tmp"
    tmp.write_text(json.dumps({"format": 1, "done": 5, "work": 10, "complete": complete}))
    os.replace(tmp, tracker / "progress.json")


def test_the_table_has_the_pairs_these_tests_use() -> None:
    own, other = TABLE.pairs.pair_rate(JOB, PARTNER, 1, GPU)
    assert 0 < own < 0.5 * TABLE.rate(JOB, 1, GPU) and other > 0
    assert TABLE.pairs.pair_rate(JOB, FORBIDDEN, 1, GPU) == (0.0, 0.0)
    assert TABLE.pairs.pair_rate(JOB, FORBIDDEN, 1, "p100")[0] > 0


# --- the file ---------------------------------------------------------------------------------

def test_write_read_clear_round_trip(tmp_path: Path) -> None:
    tracker = tmp_path / "not" / "yet" / "there"
    assert read_sharing(tracker) is None
    clear_sharing(tracker)  # (nothing to remove: fine)
    sharing = _sharing(tmp_path / "partner", scale=2, since=1700000000.5)
    write_sharing(tracker, sharing)
    assert read_sharing(tracker) == sharing
    data = json.loads((tracker / SHARING_FILE).read_text())
    assert data == {"format": 1, "partner": 4243, "partner_type": PARTNER, "gpu_type": GPU,
                    "scale": 2, "partner_tracker": str(tmp_path / "partner"),
                    "since": 1700000000.5}
    # optional fields may be left out, and fields this version does not know are ignored
    (tracker / SHARING_FILE).write_text(json.dumps(
        {"format": 1, "partner": 7, "partner_type": PARTNER, "gpu_type": GPU, "new": [1]}))
    assert read_sharing(str(tracker)) == Sharing(7, PARTNER, GPU)
    clear_sharing(str(tracker))
    assert read_sharing(tracker) is None and list(tracker.iterdir()) == []
    clear_sharing(tracker)


def test_a_bad_sharing_is_not_written() -> None:
    with pytest.raises(InputError, match="field 'scale'"):
        _sharing(scale=0)
    with pytest.raises(InputError, match="field 'partner_type'"):
        _sharing(partner_type="")
    with pytest.raises(InputError, match="field 'partner'"):
        _sharing(partner=True)


def test_a_reader_sees_the_whole_old_file_or_the_whole_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    old, new = _sharing(partner=1), _sharing(partner=2, partner_type="A3C")
    write_sharing(tmp_path, old)
    # the moment before the rename: the new file is written in full, elsewhere; a reader there
    # still sees the old one, whole
    seen: list[Sharing | None] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        assert Path(src).parent == tmp_path and Path(dst) == tmp_path / SHARING_FILE
        seen.append(read_sharing(tmp_path))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_sharing(tmp_path, new)
    monkeypatch.undo()
    assert seen == [old] and read_sharing(tmp_path) == new

    # a write that fails before the rename leaves the old file and no temporary file behind
    def fail(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_sharing(tmp_path, old)
    monkeypatch.undo()
    assert read_sharing(tmp_path) == new
    assert [p.name for p in tmp_path.iterdir()] == [SHARING_FILE]

    # and writers racing a reader: every read is one whole file, never a warning
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            for s in (old, new):
                write_sharing(tmp_path, s)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        reads = [read_sharing(tmp_path) for _ in range(300)]
    finally:
        stop.set()
        thread.join()
    assert set(reads) <= {old, new}
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("text", "field"), [
    ("", None),
    ('{"format": 1, "partner": 4', None),
    ("[1, 2]", None),
    ("\xff\xfe", None),
    ('{"partner": 1, "partner_type": "A3C", "gpu_type": "k80"}', "format"),
    ('{"format": 2, "partner": 1, "partner_type": "A3C", "gpu_type": "k80"}', "format"),
    ('{"format": 1, "partner_type": "A3C", "gpu_type": "k80"}', "partner"),
    ('{"format": 1, "partner": "12", "partner_type": "A3C", "gpu_type": "k80"}', "partner"),
    ('{"format": 1, "partner": 1, "partner_type": "", "gpu_type": "k80"}', "partner_type"),
    ('{"format": 1, "partner": 1, "partner_type": "A3C", "gpu_type": null}', "gpu_type"),
    ('{"format": 1, "partner": 1, "partner_type": "A3C", "gpu_type": "k80", "scale": 0}',
     "scale"),
    ('{"format": 1, "partner": 1, "partner_type": "A3C", "gpu_type": "k80", '
     '"partner_tracker": 5}', "partner_tracker"),
    ('{"format": 1, "partner": 1, "partner_type": "A3C", "gpu_type": "k80", "since": NaN}',
     "since"),
])
def test_a_damaged_file_reads_as_no_sharing_with_one_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
        field: str | None) -> None:
    (tmp_path / SHARING_FILE).write_text(text, encoding="latin-1")
    assert read_sharing(tmp_path) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hadar: warning: ")
    assert str(tmp_path / SHARING_FILE) in err
    if field is not None:
        assert f"field '{field}'" in err


def test_an_unreadable_file_reads_as_no_sharing(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / SHARING_FILE).mkdir()  # (a directory where the file should be)
    assert read_sharing(tmp_path) is None
    assert str(tmp_path / SHARING_FILE) in capsys.readouterr().err


def test_partner_done_only_when_its_progress_says_complete(tmp_path: Path) -> None:
    partner = tmp_path / "partner"
    assert not partner_done(_sharing(""))  # (unknown tracker)
    assert not partner_done(_sharing(partner))  # (no dir yet)
    partner.mkdir()
    assert not partner_done(_sharing(partner))  # (no progress yet)
    _progress(partner, complete=False)
    assert not partner_done(_sharing(partner))
    _progress(partner, complete=True)
    assert partner_done(_sharing(partner))
    for damaged in ('{"complete": "true"}', '{"complete": 1}', '[true]', '{"complete": tr',
                    "x" * (1 << 17)):
        (partner / "progress.json").write_text(damaged)
        assert not partner_done(_sharing(partner)), damaged
    (partner / "progress.json").unlink()
    (partner / "progress.json").mkdir()
    assert not partner_done(_sharing(partner))


# --- the pace ---------------------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _run(pace: Pace, clock: FakeClock, n: int) -> list[float]:
    """When each of ``n`` steps starts (each iteration's own work: 0.1 ms)."""
    times = []
    for _ in range(n):
        pace.step()
        times.append(clock.t)
        clock.t += 0.0001
    return times


def test_set_rate_changes_the_period_without_a_burst_or_a_stall() -> None:
    clock = FakeClock()
    pace = Pace(10.0, clock=clock, sleep=clock.sleep)
    _run(pace, clock, 5)
    # halfway through the wait for the next step, 4x faster: the half left takes a quarter
    clock.t += 0.05 - 0.0001
    pace.set_rate(40.0)
    assert pace.period == pytest.approx(0.025)
    times = _run(pace, clock, 41)
    assert times[0] == pytest.approx(100.55 + 0.0125, abs=1e-6)  # (not at once, nor 0.05 later)
    assert times[-1] - times[0] == pytest.approx(1.0, abs=1e-3)  # (then 40 steps/s)
    # 4x slower again, just after a step: the next comes one new period later, not at once
    pace.set_rate(10.0)
    start = clock.t
    times = _run(pace, clock, 11)
    assert times[0] - start == pytest.approx(0.1, abs=0.002)
    assert times[-1] - times[0] == pytest.approx(1.0, abs=1e-3)
    # behind the pace (a slow iteration) when it changes: no burst of the steps owed
    clock.t += 0.5
    pace.set_rate(40.0)
    times = _run(pace, clock, 50)
    assert times[-1] - times[0] == pytest.approx(49 * 0.025, abs=1e-3)
    with pytest.raises(ValueError):
        pace.set_rate(0.0)


# --- the payload's rate -----------------------------------------------------------------------

def _watch(tracker: Path, clock: FakeClock, job: str = JOB, gpus: int = 1,
           types: tuple[str, ...] = (GPU,)) -> SharingWatch:
    return SharingWatch(tracker, TABLE, job, gpus, types, 50.0, clock=clock)


def test_the_payload_follows_the_sharing_file_and_the_partners_progress(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tracker, partner = tmp_path / "tracker", tmp_path / "partner"
    isolated = TABLE.rate(JOB, 1, GPU) * 50
    shared = TABLE.pairs.pair_rate(JOB, PARTNER, 1, GPU)[0] * 50
    clock = FakeClock()
    watch = _watch(tracker, clock)
    assert watch.check() is None and watch.rate == isolated  # (alone: nothing said)
    _progress(partner, complete=False)
    write_sharing(tracker, _sharing(partner))
    assert watch.poll() is None  # (the last look was less than CHECK_S ago)
    clock.t += CHECK_S
    assert watch.poll() == pytest.approx(shared) and watch.partner == 4243
    assert capsys.readouterr().out == (
        f"emulate: sharing GPU with job 4243 ({PARTNER}): {shared:.3f} steps/s\n")
    clock.t += CHECK_S
    assert watch.poll() is None  # (nothing changed: nothing said)
    _progress(partner, complete=True)  # (the partner finished: alone, the file still there)
    clock.t += CHECK_S
    assert watch.poll() == pytest.approx(isolated) and watch.partner is None
    assert capsys.readouterr().out == f"emulate: alone again: {isolated:.3f} steps/s\n"
    # a new partner, then the sidecar removes the file
    write_sharing(tracker, _sharing(partner=99, partner_type="A3C"))
    clock.t += CHECK_S
    assert watch.poll() == pytest.approx(TABLE.pairs.pair_rate(JOB, "A3C", 1, GPU)[0] * 50)
    clear_sharing(tracker)
    clock.t += CHECK_S
    assert watch.poll() == pytest.approx(isolated)
    out = capsys.readouterr()
    assert out.out.splitlines()[0].startswith("emulate: sharing GPU with job 99 (A3C): ")
    assert out.out.splitlines()[1].startswith("emulate: alone again: ")
    assert out.err == ""


def test_a_pair_the_table_forbids_keeps_the_isolated_rate_with_one_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    watch = _watch(tmp_path, clock)
    write_sharing(tmp_path, _sharing(partner_type=FORBIDDEN))
    for _ in range(3):
        assert watch.check() is None and watch.rate == watch.isolated
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert "forbids or lacks the pair" in out.err and "keeping the isolated rate" in out.err
    # a GPU type this job does not run on: the same
    write_sharing(tmp_path, _sharing(gpu_type="v100"))
    assert watch.check() is None and watch.rate == watch.isolated
    assert "runs on k80, not v100" in capsys.readouterr().err
    # a damaged file: no sharing (read_sharing's warning), once per change of the file
    (tmp_path / SHARING_FILE).write_text("{")
    assert watch.check() is None and watch.check() is None
    assert capsys.readouterr().err.count("\n") == 1


def test_over_several_gpu_types_only_the_shared_ones_rate_changes(tmp_path: Path) -> None:
    # ResNet-50 on 1 GPU over a k80 node and a v100 node shares the v100: it advances at the
    # slower of the pair's rate on the v100 and its rate on the k80
    rn = "ResNet-50 (batch size 64)"
    watch = _watch(tmp_path, FakeClock(), job=rn, types=("k80", "v100"))
    write_sharing(tmp_path, _sharing(partner_type="Recommendation (batch size 512)",
                                     gpu_type="v100"))
    pair = TABLE.pairs.pair_rate(rn, "Recommendation (batch size 512)", 1, "v100")[0]
    assert pair > 0
    assert watch.check() == pytest.approx(min(pair, TABLE.rate(rn, 1, "k80")) * 50)


# --- a real run -------------------------------------------------------------------------------

def _history(tracker: Path) -> list[dict[str, Any]]:
    try:
        text = (tracker / "history.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _rate(rounds: list[dict[str, Any]]) -> tuple[float, float]:
    """Steps/s over ``rounds`` (each round's own steps and seconds), and their seconds."""
    seconds = sum(r["seconds"][0] for r in rounds)
    return (sum(r["iters"][0] for r in rounds) / seconds if seconds else 0.0), seconds


def test_the_payload_runs_at_the_shared_rate_then_alone_again(tmp_path: Path) -> None:
    # A3C on a k80 at 50x: 171.9 steps/s alone, 73.3 while it shares with CycleGAN
    isolated = TABLE.rate(JOB, 1, GPU) * 50
    shared = TABLE.pairs.pair_rate(JOB, PARTNER, 1, GPU)[0] * 50
    tracker, partner = tmp_path / "tracker", tmp_path / "partner"
    _progress(partner, complete=False)
    write_sharing(tracker, _sharing(partner))
    env = {**os.environ, "HADAR_RUN_ID": f"run{time.monotonic_ns()}", "HADAR_DEVICE": "cpu",
           "PYTHONPATH": str(REPO), "HADAR_TRACKER_DIR": str(tracker)}
    for k in ("SLURM_JOB_ID", "HADAR_COPY_GPU_TYPE", "HADAR_COPIES"):
        env.pop(k, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hadar_slurm.runtime.emulate", "--job-type", JOB, "--steps",
         "100000", "--gpu-type", GPU, "--compression", "50", "--round-seconds", "0.3"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def wait_for(enough: Any) -> list[dict[str, Any]]:
            end = time.monotonic() + 60
            while not enough(rounds := _history(tracker)):
                assert time.monotonic() < end and proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            return rounds

        # shared: every round committed before the partner completes
        before = wait_for(lambda rs: _rate(rs)[1] >= 0.6)
        _progress(partner, complete=True)
        flipped = time.time()
        # alone: the rounds that began after the payload can have seen it (CHECK_S, + slack)
        start = flipped + CHECK_S + 0.1

        def alone(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [r for p, r in pairwise(rs) if p["time"] >= start]

        after = alone(wait_for(lambda rs: _rate(alone(rs))[1] >= 0.6))
    finally:  # (killed: a preemption's save and torch's exit would add a second or more)
        proc.kill()
        out, err = proc.communicate(timeout=60)
    assert "warning" not in err, err
    assert f"emulate: sharing GPU with job 4243 ({PARTNER}): {shared:.3f} steps/s" in out
    assert f"emulate: alone again: {isolated:.3f} steps/s" in out
    got_shared, got_alone = _rate(before)[0], _rate(after)[0]
    assert got_shared == pytest.approx(shared, rel=0.25), (before, out)
    assert got_alone == pytest.approx(isolated, rel=0.25), (after, out)
    assert got_shared < 0.6 * got_alone
