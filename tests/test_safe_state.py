"""Safe state (issue #11, item 4): one sidecar per state_dir, a damaged throughput store
recovered, epochs that never go back, an unreachable slurmctld reported as such.

The sidecar runs here over the in-memory Slurm of tests/test_sidecar_backend.py;
tests/test_safe_state_cluster.py runs the same faults against the real dev cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hadar_slurm.cli.main import main
from hadar_slurm.errors import InputError
from hadar_slurm.logs import read_events
from hadar_slurm.rates import learn
from hadar_slurm.rates.store import StoreDamagedError, ThroughputStore
from hadar_slurm.rates.store_recovery import DAMAGED_SUFFIX, check_store
from hadar_slurm.sidecar.config import SidecarConfig, load_config
from hadar_slurm.sidecar.controller import Sidecar, SidecarStore
from hadar_slurm.sidecar.record import JobRecord
from hadar_slurm.sidecar.statedir import (
    EPOCH_FILE,
    LOCK_FILE,
    StateDirLock,
    is_unreachable,
    read_epoch,
    write_epoch,
)
from hadar_slurm.slurm import SlurmCommandError, SlurmJob
from hadar_slurm.slurm.errors import SlurmParseError, SlurmTimeoutError
from tests.helpers import run_cli
from tests.test_sidecar_backend import NODES, FakeSlurm, job

REPO = Path(__file__).resolve().parent.parent
CSV = "job_type,scale_factor,gpu_type,steps_per_second\nResNet-50 (batch size 64),1,a100,9.5\n"


@pytest.fixture
def config_file(tmp_path: Path, clean_logger: None) -> Path:
    table = tmp_path / "extra.csv"
    table.write_text(CSV)
    path = tmp_path / "sidecar.toml"
    path.write_text(f"""
[scheduler]
epoch_seconds = 0.05
finish_poll_s = 0.05
throughputs = ["{table}"]
[sidecar]
state_dir = "{tmp_path / 'state'}"
log_file = "{tmp_path / 'sidecar.log'}"
""")
    return path


def config_of(path: Path, **overrides: object) -> SidecarConfig:
    config = load_config(path)
    return config.with_overrides(**overrides) if overrides else config


def events(config: SidecarConfig, name: str | None = None) -> list[dict[str, object]]:
    assert config.log_file is not None
    all_events = read_events(config.log_file) if Path(config.log_file).exists() else []
    return [e for e in all_events if name is None or e.get("event") == name]


def held_jobs(epoch: int | None = None, n: int = 2) -> list[SlurmJob]:
    admin = "hadar: held for the sidecar" if epoch is None else JobRecord(
        epoch=epoch, state="held").encode()
    return [job(k, admin=admin) for k in range(1, n + 1)]


def damage(path: Path, how: str) -> bytes:
    """Damage the store file at ``path`` as a disk or a person would; returns its bytes."""
    data = path.read_bytes()
    if how == "garbage":
        data = bytes((b * 7 + 3) % 256 for b in data)
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "pages":  # the header is intact, the tables' pages are not
        data = data[:4096] + b"\x13" * (len(data) - 4096)
    path.write_bytes(data)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return data


def filled_store(path: Path) -> None:
    with ThroughputStore(path) as store:
        for k in range(300):
            store.record(f"model {k} (batch size 8)", 1, "v100", 1.0 + k)


# -- one sidecar per state_dir ---------------------------------------------------------------


def test_second_lock_is_refused_with_the_holder(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path / "state", source="a.toml")
    first.acquire(dry_run=True)
    second = StateDirLock(tmp_path / "state", source="b.toml")
    with pytest.raises(InputError) as info:
        second.acquire()
    e = info.value
    assert e.field == "[sidecar] state_dir" and e.source == "b.toml"
    assert f"pid {os.getpid()}" in e.problem and str(tmp_path / "state") in e.problem
    assert "a dry run" in e.problem and "config a.toml" in e.problem
    assert e.fix is not None and "stop that sidecar" in e.fix and "state_dir of its own" in e.fix
    assert "\n" not in str(e)
    first.release()
    second.acquire()
    assert second.held
    second.release()


def test_lock_of_a_killed_sidecar_is_free(tmp_path: Path) -> None:
    """flock dies with its process: a SIGKILLed sidecar never blocks the next one."""
    state = tmp_path / "state"
    code = ("import sys, time; from hadar_slurm.sidecar.statedir import StateDirLock; "
            "StateDirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(state)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(InputError, match=f"pid {proc.pid}"):
            StateDirLock(state).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    lock = StateDirLock(state)
    lock.acquire()
    lock.release()


def test_sidecar_holds_the_lock_for_its_life_dry_run_too(config_file: Path) -> None:
    """Issue #11: a second sidecar (even --dry-run) on the same state_dir ran unchecked."""
    config = config_of(config_file)
    first = Sidecar(config.with_overrides(dry_run=True), api=FakeSlurm(held_jobs(), NODES))
    try:
        with pytest.raises(InputError) as info:
            Sidecar(config, api=FakeSlurm(held_jobs(), NODES))
        assert info.value.field == "[sidecar] state_dir"
        assert f"pid {os.getpid()}" in info.value.problem
        assert first.run(max_epochs=1) == 0
    finally:
        first.close()
    second = Sidecar(config, api=FakeSlurm(held_jobs(), NODES))  # free again after run()
    assert second.run(max_epochs=1) == 0
    assert (Path(str(config.state_dir)) / LOCK_FILE).exists()


def test_second_run_cli_exits_at_once(config_file: Path, tmp_path: Path) -> None:
    """The CLI: one line naming the state_dir, the holder's pid and the fix; exit status 2."""
    config = config_of(config_file)
    lock = StateDirLock(str(config.state_dir), source="other.toml")
    lock.acquire()
    try:
        out = run_cli("run", "--config", str(config_file), "--once", "--dry-run",
                      env={"SLURM_CONF": str(tmp_path / "none.conf")}, timeout=60)
    finally:
        lock.release()
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"another sidecar (pid {os.getpid()}" in out.stderr
    assert str(config.state_dir) in out.stderr and "stop that sidecar first" in out.stderr


# -- monotonic epochs ------------------------------------------------------------------------


def test_epochs_never_go_back_after_slurm_forgets_the_jobs(config_file: Path) -> None:
    """Issue #11: the next epoch came from the records on jobs in Slurm only, so it went back
    when those jobs were purged."""
    config = config_of(config_file)
    first = Sidecar(config, api=FakeSlurm(held_jobs(epoch=40), NODES))
    assert first.run(max_epochs=3) == 0
    assert [e["epoch"] for e in events(config, "epoch")] == [41, 42, 43]
    assert read_epoch(str(config.state_dir)) == 43
    second = Sidecar(config, api=FakeSlurm([], NODES))  # the jobs are gone from Slurm
    assert second.run(max_epochs=1) == 0
    assert events(config, "resume")[-1]["epoch"] == 44
    third = Sidecar(config, api=FakeSlurm(held_jobs(epoch=90), NODES))  # Slurm's is later
    assert third.recover_epoch() == 91
    third.close()


def test_epoch_file_is_written_atomically_and_bad_ones_are_ignored(tmp_path: Path) -> None:
    assert read_epoch(tmp_path) == -1
    write_epoch(tmp_path, 7)
    assert read_epoch(tmp_path) == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == [EPOCH_FILE]
    for text in ("", "{", '{"epoch": -3}', '{"epoch": true}', "[1]"):
        (tmp_path / EPOCH_FILE).write_text(text)
        assert read_epoch(tmp_path) == -1


# -- the damaged store -----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["garbage", "truncated", "pages"])
def test_damaged_store_is_recovered_at_start(config_file: Path, how: str) -> None:
    """Issue #11: a damaged store made every start exit with a traceback.  Now it is moved
    aside (kept, with the time in its name), a fresh one is built from the config's tables,
    a store_recovered warning names the kept file, and the sidecar runs."""
    config = config_of(config_file)
    db = config.store_path
    filled_store(db)
    data = damage(db, how)
    sidecar = Sidecar(config, api=FakeSlurm(held_jobs(), NODES))
    assert sidecar.run(max_epochs=1) == 0
    recovered = events(config, "store_recovered")
    assert len(recovered) == 1 and recovered[0]["level"] == "warning"
    kept = Path(str(recovered[0]["kept"]))
    assert kept.parent == db.parent and kept.name.startswith(db.name + DAMAGED_SUFFIX)
    assert kept.read_bytes() == data
    assert recovered[0]["imported"] == 1 and recovered[0]["path"] == str(db)
    with ThroughputStore(db) as store:
        rows = [(e.job_type, e.gpu_type, e.rate, e.source) for e in store.entries()
                if e.source != "estimated"]
    assert rows == [("ResNet-50 (batch size 64)", "a100", 9.5, "imported")]
    assert len(events(config, "epoch")) == 1
    check_store(db)  # sound


def test_store_failure_mid_run_goes_on_with_the_base_table(
        config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage found while the sidecar runs (here: the store's reads fail from the first epoch
    on) is one store_failed warning; the epochs go on with the base tables, no job is released
    unsteered for it, and the store is no longer used."""
    config = config_of(config_file)
    sidecar = Sidecar(config, api=FakeSlurm(held_jobs(), NODES))
    store = sidecar.store
    assert store is not None

    def broken(self: ThroughputStore, source: str | None = None) -> list[object]:
        raise StoreDamagedError(str(self.path), "database disk image is malformed")

    monkeypatch.setattr(ThroughputStore, "entries", broken)
    assert sidecar.run(max_epochs=2) == 0
    failed = events(config, "store_failed")
    assert len(failed) == 1 and failed[0]["error"] == "database disk image is malformed"
    assert failed[0]["path"] == str(store.path) and failed[0]["epoch"] == 0
    epochs = events(config, "epoch")
    assert len(epochs) == 2 and all(e["unsteered"] == 0 for e in epochs), epochs
    assert not events(config, "job_error")
    assert sidecar.backend.knowledge.store is None and sidecar.store is None
    assert 'hadar_errors_total{kind="store_failed"} 1.0' in sidecar.metrics.exposition()


def test_sidecar_store_answers_as_an_empty_store_once_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Knowledge calls inside one job's handling (learn) never raises the damage: it
    would count against the job."""
    store = SidecarStore(tmp_path / "t.db")
    store.record("m (batch size 1)", 1, "v100", 2.0)
    assert store.learn("m (batch size 1)", 1, "v100", 2.5) is not None

    def broken(self: ThroughputStore, *args: object, **kwargs: object) -> None:
        raise StoreDamagedError(str(self.path), "database disk image is malformed")

    monkeypatch.setattr(ThroughputStore, "learn", broken)
    assert store.learn("m (batch size 1)", 1, "v100", 2.5) is None
    assert store.failure is not None and store.failure.error == "database disk image is malformed"
    assert store.entries() == [] and store.anchors() == {}  # no more reads
    assert store.estimate("m (batch size 1)", 1, "k80", 1.0) is None
    store.close()


def test_cli_commands_on_a_damaged_store_say_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "t.db"
    filled_store(db)
    damage(db, "pages")
    csv = tmp_path / "in.csv"
    csv.write_text(CSV)
    for argv in (["list"], ["export", str(tmp_path / "o.json")], ["import", str(csv)]):
        assert main(["throughputs", *argv, "--db", str(db)]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("hadar-slurm: error: "), err
        assert f"{db}: field '[scheduler] throughput_db': the throughput store is damaged" in err
        assert f"hadar-slurm throughputs recover --db {db}" in err


def test_throughputs_recover(tmp_path: Path, config_file: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    config = config_of(config_file)
    db = config.store_path
    filled_store(db)
    data = damage(db, "garbage")
    lock = StateDirLock(str(config.state_dir))
    lock.acquire()
    try:  # not while the sidecar runs
        assert main(["throughputs", "recover", "--config", str(config_file)]) == 2
        assert "another sidecar" in capsys.readouterr().err
    finally:
        lock.release()
    assert db.read_bytes() == data
    assert main(["throughputs", "recover", "--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert f"{db} was damaged (file is not a database)" in out and "1 entries" in out
    kept = [p for p in db.parent.iterdir() if p.name.startswith(db.name + DAMAGED_SUFFIX)]
    assert len(kept) == 1 and kept[0].read_bytes() == data
    assert main(["throughputs", "list", "--db", str(db), "--source", "imported"]) == 0
    assert "9.5" in capsys.readouterr().out
    assert main(["throughputs", "recover", "--db", str(db)]) == 0
    assert capsys.readouterr().out == f"{db} is sound: nothing to do\n"


# -- slurmctld unreachable -------------------------------------------------------------------


class FlakySlurm(FakeSlurm):
    """Reads fail with ``error`` while ``failures`` is above 0 (one less per failed read)."""

    def __init__(self, error: Exception, failures: int) -> None:
        super().__init__(held_jobs(), NODES)
        self.error = error
        self.failures = failures
        self.seen_gauge: list[str] = []
        self.sidecar: Sidecar | None = None

    def read_jobs(self) -> list[SlurmJob]:
        if self.sidecar is not None:
            self.seen_gauge.append(self.sidecar.metrics.exposition())
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        return super().read_jobs()


@pytest.fixture
def ran_over_outage(config_file: Path) -> Iterator[tuple[SidecarConfig, FlakySlurm, Sidecar]]:
    config = config_of(config_file)
    api = FlakySlurm(SlurmTimeoutError(["squeue", "--json"], "timed out after 3 s"), 0)
    sidecar = Sidecar(config, api=api)
    api.sidecar = sidecar
    yield config, api, sidecar
    sidecar.close()


def test_unreachable_slurmctld_is_an_event_and_a_metric(
        ran_over_outage: tuple[SidecarConfig, FlakySlurm, Sidecar]) -> None:
    """Issue #11: a hung slurmctld showed as epoch_failed with no unreachable event."""
    config, api, sidecar = ran_over_outage
    original = sidecar.loop.run_epoch
    calls = [0]

    def run_epoch(full: bool | None = None) -> bool:
        calls[0] += 1
        if calls[0] == 2:
            api.failures = 3  # slurmctld stops answering after the first epoch
        return original(full)

    sidecar.loop.run_epoch = run_epoch  # type: ignore[method-assign]
    assert sidecar.run(max_epochs=3) == 0
    down = events(config, "slurm_unreachable")
    assert len(down) == 3 and not events(config, "epoch_failed")
    assert all(e["level"] == "warning" and "timed out after 3 s" in str(e["error"])
               for e in down)
    assert down[0]["unreachable_s"] == 0.0
    assert [float(str(e["unreachable_s"])) for e in down] == sorted(
        float(str(e["unreachable_s"])) for e in down)
    back = events(config, "slurm_reachable")
    assert len(back) == 1 and back[0]["level"] == "info"
    assert [e.get("event") for e in events(config) if e.get("event") in (
        "slurm_unreachable", "slurm_reachable", "epoch")] == [
        "epoch", "slurm_unreachable", "slurm_unreachable", "slurm_unreachable",
        "slurm_reachable", "epoch", "epoch"]
    # reads: the start's, the first epoch's, then three that fail; from the second failed
    # one on the gauge reads 1, before the first it read 0, and 0 again after
    assert "hadar_slurm_unreachable 0.0" in api.seen_gauge[2]
    assert "hadar_slurm_unreachable 1.0" in api.seen_gauge[3]
    assert "hadar_slurm_unreachable 1.0" in api.seen_gauge[5]
    final = sidecar.metrics.exposition()
    assert "hadar_slurm_unreachable 0.0" in final
    assert "hadar_slurm_outages_total 1.0" in final
    assert 'hadar_errors_total{kind="slurm_unreachable"} 3.0' in final


def test_other_slurm_errors_stay_epoch_failed(config_file: Path) -> None:
    config = config_of(config_file)
    api = FlakySlurm(SlurmCommandError(["squeue"], "failed with exit status 1",
                                       stderr="squeue: error: Invalid user"), 1)
    sidecar = Sidecar(config, api=api)
    sidecar.loop.epoch = 0
    # the start's read fails too: not unreachable, so no slurm_unreachable event
    assert sidecar.run(max_epochs=1) == 0
    assert not events(config, "slurm_unreachable")
    assert events(config, "start_read_failed")
    assert "hadar_slurm_unreachable 0.0" in sidecar.metrics.exposition()


@pytest.mark.parametrize(("error", "unreachable"), [
    (SlurmTimeoutError(["squeue"], "timed out after 3 s"), True),
    (SlurmCommandError(["squeue"], "failed with exit status 1", stderr=(
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")), True),
    (SlurmCommandError(["sinfo"], "failed with exit status 1", stderr=(
        "slurm_load_partitions: Socket timed out on send/recv operation")), True),
    (SlurmCommandError(["scontrol"], "failed with exit status 1",
                       stderr="Invalid job id specified"), False),
    (SlurmCommandError(["squeue"], "failed with exit status 1", stderr="Unspecified error"),
     False),
    (ValueError("Socket timed out"), False),
    # squeue/sinfo --json with a hung slurmctld (bench.soak, Slurm 22.05)
    (SlurmParseError("squeue --json", "errors", "Failed while looking for jobs"), True),
    (SlurmParseError("sinfo --json", "errors", "Unspecified error"), True),
    (SlurmParseError("sinfo --json", "nodes", "not a list"), False),
])
def test_is_unreachable(error: Exception, unreachable: bool) -> None:
    assert is_unreachable(error) is unreachable


# -- the first epoch is not late ---------------------------------------------------------------


def test_throughputs_are_estimated_before_the_first_epoch(
        config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first estimate of what the table lacks chooses its fit by cross-validation (about a
    second): made inside the first epoch, it delayed every placement of that epoch after the
    epoch's start (``bench.fidelity``: 10 first starts 1.5 s late).  The sidecar makes it when
    it reads Slurm at start, and the epochs reuse it while nothing changed."""
    table = config_file.parent / "extra.csv"
    table.write_text(CSV + "MyNet,1,v100,10.0\n")  # (MyNet lacks p100 and k80: estimated)
    fits: list[tuple[str, ...]] = []
    real_complete = learn.complete

    def counted(*args: object, **kw: object) -> object:
        fits.append(tuple(kw["gpu_types"]))  # type: ignore[arg-type]
        return real_complete(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(learn, "complete", counted)
    sidecar = Sidecar(config_of(config_file), api=FakeSlurm(held_jobs(), NODES))
    try:
        assert sidecar.recover_epoch() == 0
        assert fits == [("v100", "p100", "k80")]
        assert sidecar.backend.gpu_types == ("v100", "p100", "k80")
        assert sidecar.backend.knowledge.source("MyNet", 1, "k80") == "estimated"
        fits.clear()
        sidecar.loop.run_epoch()
        assert fits == []  # the epoch reused the fit
    finally:
        sidecar.close()
