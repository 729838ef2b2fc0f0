"""hadar_slurm.runtime: averaging, round plans, the environment, and real multi-process runs.

The multi-process tests start copies as local subprocesses sharing one tracker dir, with the
environment the HadarE heterogeneous job gives each copy (hadar_slurm.slurm.hetjob) and the one
Slurm gives a (requeued) job.  examples/digits_train.py trains the real example;
tests/runtime_driver.py is a torch-only trainer that starts faster and counts every iteration
it runs in a file (exactly, even through SIGKILL), which is how lost work is measured.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.runtime import (
    EXIT_COPY_LOST,
    EXIT_PREEMPTED,
    CommittedState,
    RuntimeConfig,
    plan_round,
    read_progress,
)

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "digits_train.py"
DRIVER = REPO / "tests" / "runtime_driver.py"


# ----------------------------------------------------------------------------------- helpers

@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    out: Path
    err: Path

    def wait(self, timeout: float = 60) -> int:
        return self.popen.wait(timeout=timeout)

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    @property
    def stderr(self) -> str:
        return self.err.read_text()


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HADAR_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def launch(script: Path, args: Sequence[str], env: Mapping[str, str], cwd: Path,
           name: str) -> Proc:
    out, err = cwd / f"{name}.out", cwd / f"{name}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        popen = subprocess.Popen([sys.executable, str(script), *args], cwd=cwd,
                                 env=clean_env(env), stdout=o, stderr=e)
    return Proc(popen, out, err)


def copy_env(job: int, k: int, i: int, tracker: Path, restarts: int = 0) -> dict[str, str]:
    """What the hetjob gives copy i (and Slurm: the leader's job id, the restart count)."""
    env = {"HADAR_COPY_INDEX": str(i), "HADAR_COPIES": str(k),
           "HADAR_ORIGINAL_JOB_ID": str(job), "HADAR_TRACKER_DIR": str(tracker),
           "HADAR_COPY_GPU_TYPE": ["v100", "p100", "a100"][i % 3],
           "SLURM_JOB_ID": str(job + 1000)}
    if restarts:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    return env


def wait_until(what: str, pred: Callable[[], bool], procs: Sequence[Proc],
               timeout: float = 60) -> None:
    """Poll ``pred`` (bounded); fail early if a process ended first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        for p in procs:
            if p.popen.poll() is not None:
                raise AssertionError(f"a process ended (rc {p.popen.returncode}) before "
                                     f"{what}:\n{p.stdout}\n{p.stderr}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def committed(tracker: Path) -> CommittedState | None:
    return CommittedState.load(tracker / "state.json")


def history(tracker: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tracker / "history.jsonl").read_text().splitlines()]


def count(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def finish_all(procs: Sequence[Proc], timeout: float = 60) -> list[int]:
    codes = [p.wait(timeout) for p in procs]
    return codes


def kill_all(procs: Sequence[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
            p.popen.wait()


@pytest.fixture
def procs() -> Any:
    started: list[Proc] = []
    yield started
    kill_all(started)


# ----------------------------------------------------------------------------------- in process

def test_weighted_average_math() -> None:
    from hadar_slurm.runtime import weighted_average

    def model(w: float, b: float) -> Any:
        m = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.BatchNorm1d(1))
        with torch.no_grad():
            m[0].weight.fill_(w)
            m[0].bias.fill_(b)
        return m

    a, b = model(1.0, -2.0), model(4.0, 10.0)
    a[1].num_batches_tracked.fill_(3)
    b[1].num_batches_tracked.fill_(7)
    avg = weighted_average([a.state_dict(), b.state_dict()], [1, 2])
    assert torch.equal(avg["0.weight"], torch.full((1, 2), (1.0 * 1 + 4.0 * 2) / 3))
    assert torch.equal(avg["0.bias"], torch.full((1,), (-2.0 * 1 + 10.0 * 2) / 3))
    assert avg["0.weight"].dtype == torch.float32
    assert int(avg["1.num_batches_tracked"]) == 7  # not a float: from the heaviest copy
    # iterations as weights: a copy that ran nothing does not count
    same = weighted_average([a.state_dict(), b.state_dict()], [5, 0])
    assert torch.equal(same["0.weight"], a.state_dict()["0.weight"])
    # nested optimizer states: floating tensors averaged, the rest from the heaviest
    s1 = {"state": {0: {"momentum_buffer": torch.tensor([2.0, 0.0])}},
          "param_groups": [{"lr": 0.1, "params": [0]}]}
    s2 = {"state": {0: {"momentum_buffer": torch.tensor([6.0, 4.0])}},
          "param_groups": [{"lr": 0.2, "params": [0]}]}
    opt = weighted_average([s1, s2], [3, 1])
    assert torch.equal(opt["state"][0]["momentum_buffer"], torch.tensor([3.0, 1.0]))
    assert opt["param_groups"] == [{"lr": 0.1, "params": [0]}]
    with pytest.raises(ValueError, match="zero"):
        weighted_average([s1, s2], [0, 0])
    with pytest.raises(ValueError, match="shape"):
        weighted_average([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}], [1, 1])


def test_plan_round_adds_up_to_the_work_exactly() -> None:
    assert plan_round(100, 3, ()) == (10, 10, 10)  # probe round: unknown rates
    assert plan_round(100, 3, (), round_iters=30) == (10, 10, 10)
    assert plan_round(1000, 2, (30.0, 10.0), round_iters=100) == (75, 25)
    assert plan_round(1000, 2, (30.0, 10.0), round_seconds=2.0) == (60, 20)
    assert plan_round(40, 2, (30.0, 10.0), round_seconds=2.0) == (30, 10)  # cut to what's left
    assert plan_round(2, 3, (1.0, 1.0, 1.0), round_iters=30) == (1, 1, 0)
    assert plan_round(0, 2, (1.0, 1.0)) == (0, 0)
    assert plan_round(1000, 3, (5.0, 5.0), round_iters=30) == (10, 10, 10)  # rates of a k=2 run
    # Whatever the rates do from round to round, the quotas of all rounds sum to the work.
    for work, k, mode in [(997, 3, "iters"), (1234, 5, "seconds"), (7, 4, "iters")]:
        done, rounds = 0, 0
        rates: tuple[float, ...] = ()
        gen = torch.Generator().manual_seed(work)
        while done < work:
            kw = {"round_iters": 50} if mode == "iters" else {"round_seconds": 0.5}
            quotas = plan_round(work - done, k, rates, **kw)
            assert len(quotas) == k and min(quotas) >= 0 and 0 < sum(quotas) <= work - done
            done += sum(quotas)
            rates = tuple(float(x) for x in (torch.rand(k, generator=gen) * 100 + 1))
            rounds += 1
        assert done == work and rounds < 100


def test_config_from_env(tmp_path: Path) -> None:
    cfg = RuntimeConfig.from_env(100, env={}, cwd=tmp_path)
    assert (cfg.copies, cfg.index, cfg.job_key, cfg.run_id) == (1, 0, "local", None)
    assert cfg.tracker_dir == tmp_path / ".hadar-tracker" / "local"
    assert cfg.preempt_signals == ("USR1", "TERM")
    plain = RuntimeConfig.from_env(100, env={"SLURM_JOB_ID": "81", "SLURM_RESTART_COUNT": "2"},
                                   cwd=tmp_path)
    assert plain.tracker_dir == tmp_path / ".hadar-tracker" / "81"
    assert (plain.run_id, plain.restart_count) == ("81.2", 2)
    # a copy of job 42 (the hetjob's leader is job 90): the tracker dir the sidecar gave it
    env = copy_env(42, 3, 2, tmp_path / "t")
    env.update({"SLURM_JOB_ID": "90", "HADAR_PREEMPT_SIGNAL": "SIGUSR2",
                "HADAR_DEVICE": "cpu", "HADAR_BARRIER_TIMEOUT": "7.5"})
    copy = RuntimeConfig.from_env(100, env=env, cwd=tmp_path)
    assert (copy.copies, copy.index, copy.job_key, copy.run_id) == (3, 2, "42", "90.0")
    assert copy.tracker_dir == tmp_path / "t" and copy.gpu_type == "a100"
    assert copy.preempt_signals == ("USR2", "TERM") and copy.device == "cpu"
    assert copy.barrier_timeout_s == 7.5 and not copy.coordinator
    # unforked J later: the same dir as its fork's <workdir>/.hadar-tracker/J
    assert RuntimeConfig.from_env(1, env={"SLURM_JOB_ID": "42"}, cwd=tmp_path).tracker_dir == \
        RuntimeConfig.from_env(1, env={"HADAR_ORIGINAL_JOB_ID": "42"}, cwd=tmp_path).tracker_dir
    for bad in ({"HADAR_COPIES": "3", "HADAR_COPY_INDEX": "3"}, {"HADAR_COPIES": "x"},
                {"HADAR_PREEMPT_SIGNAL": "KILL"}, {"HADAR_BARRIER_TIMEOUT": "-1"},
                {"SLURM_JOB_ID": "../x"}):
        with pytest.raises(InputError):
            RuntimeConfig.from_env(100, env=bad, cwd=tmp_path)
    with pytest.raises(InputError, match="work"):
        RuntimeConfig.from_env(0, env={}, cwd=tmp_path)


def test_checkpoint_restores_model_and_optimizer(tmp_path: Path) -> None:
    """In process, unforked: a run that stops mid-round leaves the last commit; a new run
    starts from exactly that model and optimizer state and does only the rest of the work."""
    from hadar_slurm.runtime import JobRuntime

    def setup(seed: int) -> tuple[Any, Any]:
        torch.manual_seed(seed)
        model = torch.nn.Linear(3, 1)
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(model: Any, opt: Any) -> None:
        x = torch.randn(4, 3)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    cfg = RuntimeConfig(work=50, tracker_dir=tmp_path / "t", round_iters=20)
    log = io.StringIO()
    model, opt = setup(1)
    rt = JobRuntime(model, opt, cfg, log=log)
    steps = rt.steps()
    assert isinstance(steps, Generator)  # (closed below, as a generator)
    for _ in range(25):  # round 1 (20 iterations) is committed, 5 of round 2 are not
        next(steps)
        step(model, opt)
    steps.close()
    rt.close()
    state = committed(cfg.tracker_dir)
    assert state is not None and (state.round, state.done) == (1, 20)
    assert state.checkpoint is not None
    saved = torch.load(cfg.tracker_dir / state.checkpoint, weights_only=True)

    model2, opt2 = setup(2)  # another init: the checkpoint must replace it
    rt2 = JobRuntime(model2, opt2, cfg, output=tmp_path / "out.pt", log=log)
    assert rt2.done == 20
    for key, value in saved["model"].items():
        assert torch.equal(model2.state_dict()[key], value)
    buffers = [opt2.state_dict()["state"][k]["momentum_buffer"] for k in (0, 1)]
    assert all(torch.equal(b, saved["optim"]["state"][k]["momentum_buffer"])
               for k, b in enumerate(buffers))
    ran = 0
    for _ in rt2.steps():
        step(model2, opt2)
        ran += 1
    summary = rt2.finish()
    assert ran == 30 and summary.done == 50 and summary.complete and summary.rounds == 3
    assert (tmp_path / "out.pt").exists()
    assert "round 3: 50/50 iterations (100.0%)" in log.getvalue()


def test_signal_at_a_round_boundary_is_committed(tmp_path: Path) -> None:
    """In process: a preemption signal that lands while round 1 is being committed stops the
    copy before its first iteration of round 2.  There is no new model to save, but state.json
    and progress.json must still carry the stop (CI once caught the stop missing there), and a
    resumed run does exactly the rest of the work."""
    from hadar_slurm.runtime import JobRuntime, Preempted

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = RuntimeConfig(work=50, tracker_dir=tmp_path / "t", round_iters=20,
                        preempt_signals=("USR1",))
    log = io.StringIO()
    rt = JobRuntime(model, opt, cfg, log=log)
    real_commit = rt._commit
    signalled: list[int] = []

    def commit_then_signal(*args: Any, **kwargs: Any) -> CommittedState:
        state = real_commit(*args, **kwargs)
        if not signalled:
            signalled.append(state.round)
            os.kill(os.getpid(), signal.SIGUSR1)
        return state

    rt._commit = commit_then_signal  # type: ignore[method-assign]
    ran = 0
    with pytest.raises(Preempted, match="stopped \\(signal USR1\\) after round 1: 20/50"):
        for _ in rt.steps():
            ran += 1
    assert signalled == [1] and ran == 20
    state = committed(cfg.tracker_dir)
    assert state is not None and (state.round, state.done) == (1, 20)
    assert state.stop == "signal USR1"
    progress = read_progress(cfg.tracker_dir)
    assert progress is not None and progress["stop"] == "signal USR1" and progress["done"] == 20
    assert "round 1: nothing new since the last commit; stopping (signal USR1)" in log.getvalue()

    rt2 = JobRuntime(torch.nn.Linear(3, 1), None, cfg, log=log)
    assert rt2.done == 20
    assert sum(1 for _ in rt2.steps()) == 30
    assert rt2.finish().done == 50


def test_steps_until_commits_at_each_rung_and_a_signal_between_rungs_saves_it(
        tmp_path: Path) -> None:
    """A study's trial trains to a rung (``steps(until=...)``): the rounds are cut so that one
    commits exactly there (rounds of 20: 20, 25 for a rung at 25), and a preemption signal
    while it waits at the rung (``stop_requested``) stops the next ``steps`` at once with the
    rung's state: resumed, it trains exactly the rest."""
    from hadar_slurm.runtime import JobRuntime, Preempted

    torch.manual_seed(0)
    cfg = RuntimeConfig(work=100, tracker_dir=tmp_path / "t", round_iters=20,
                        preempt_signals=("USR1",))
    rt = JobRuntime(torch.nn.Linear(3, 1), None, cfg, log=io.StringIO())
    assert sum(1 for _ in rt.steps(until=25)) == 25
    state = committed(cfg.tracker_dir)
    assert state is not None and (state.round, state.done) == (2, 25)
    assert [h["done"] for h in history(cfg.tracker_dir)] == [20, 25]
    assert sum(1 for _ in rt.steps(until=25)) == 0 and not rt.stop_requested()
    assert sum(1 for _ in rt.steps(until=50)) == 25 and rt.done == 50
    os.kill(os.getpid(), signal.SIGUSR1)  # (the trial waits at rung 50 for its verdict)
    assert rt.stop_requested()
    with pytest.raises(Preempted, match="after round 4: 50/100"):
        for _ in rt.steps(until=100):
            raise AssertionError("no iteration after the signal")
    rt2 = JobRuntime(torch.nn.Linear(3, 1), None, cfg, log=io.StringIO())
    assert rt2.done == 50
    assert sum(1 for _ in rt2.steps()) == 50 and rt2.finish().complete


def test_settings_and_progress_need_no_torch(tmp_path: Path) -> None:
    (tmp_path / "progress.json").write_text('{"done": 3}')
    code = ("import sys; sys.modules['torch'] = None\n"
            "import hadar_slurm.runtime as r, hadar_slurm.cli, hadar_slurm.slurm.hetjob\n"
            f"assert r.read_progress({str(tmp_path)!r}) == {{'done': 3}}\n"
            "r.RuntimeConfig.from_env(5, env={})\n"
            "try:\n    r.JobRuntime\nexcept ImportError:\n    print('lazy')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env({}), check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "lazy"


# ----------------------------------------------------------------------------------- processes

def test_three_copies_train_the_example_to_exactly_w(tmp_path: Path, procs: list[Proc]) -> None:
    tracker, work = tmp_path / "tracker", 2400
    output = tmp_path / "model.pt"
    args = ["--steps", str(work), "--round-iters", "300", "--output", str(output),
            "--result", str(tmp_path / "result.json"), "--lr", "0.05"]
    procs += [launch(EXAMPLE, args, copy_env(7, 3, i, tracker), tmp_path, f"copy{i}")
              for i in range(3)]
    codes = finish_all(procs)
    assert codes == [0, 0, 0], [p.stderr for p in procs]

    state = committed(tracker)
    assert state is not None and state.done == work and state.complete
    rounds = history(tracker)
    assert rounds[0]["round"] == 0 and rounds[0]["iters"] == []  # copy 0's initial model
    assert sum(sum(r["iters"]) for r in rounds) == work
    assert all(len(r["iters"]) == 3 and sum(r["iters"]) <= 300 for r in rounds[1:])
    progress = read_progress(tracker)
    assert progress is not None
    assert (progress["work"], progress["done"], progress["rounds"], progress["complete"]) == \
        (work, work, len(rounds) - 1, True)
    assert [c["gpu_type"] for c in progress["copy_rates"]] == ["v100", "p100", "a100"]
    assert all(c["iters_per_s"] > 0 for c in progress["copy_rates"])
    assert not any((tracker / "reports").glob("*/*"))  # reports removed once committed

    # the consolidated model: saved where asked, loads into the example's model, and learned
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import digits_train  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(REPO / "examples"))
    model = digits_train.build_model(seed=123, hidden=64)
    model.load_state_dict(torch.load(output, weights_only=True))
    _, _, x_test, y_test = digits_train.load_split(0)
    acc = digits_train.accuracy(model, x_test, y_test)
    result = json.loads((tmp_path / "result.json").read_text())
    assert acc > 0.8  # chance is 0.1
    assert result["iterations"] == work and abs(result["accuracy"] - acc) < 1e-6
    for i, p in enumerate(procs):  # every copy ended with the same consolidated model
        assert f"copy {i}/3: test accuracy {acc:.4f}" in p.stdout


def test_a_copy_slower_than_its_probe_ends_its_round_in_time(tmp_path: Path,
                                                            procs: list[Proc]) -> None:
    # Rounds of 0.5 s, two copies.  Copy 0 steps every 5 ms throughout (about 200/s).  Copy 1
    # steps every 1 ms for the 10-iteration probe, then every 20 ms (about 50/s): the probe
    # puts its rate near 1,000/s, so its next quota (about 500 iterations) would take it 10 s
    # while copy 0 waits at the barrier.  A copy's round also ends after its 0.5 s: copy 1
    # reports what it did and the next round's quota follows its measured rate.  The work
    # still ends exactly at W.
    tracker, work = tmp_path / "tracker", 600
    common = ["--steps", str(work), "--round-seconds", "0.5"]
    own = [["--sleep-ms", "5"], ["--sleep-ms", "1", "--slow-from", "10", "--slow-sleep-ms", "20"]]
    procs += [launch(DRIVER, [*common, *own[i], "--count", str(tmp_path / f"count{i}")],
                     copy_env(11, 2, i, tracker), tmp_path, f"copy{i}") for i in range(2)]
    assert finish_all(procs, timeout=120) == [0, 0], [p.stderr for p in procs]
    state = committed(tracker)
    assert state is not None and state.done == work and state.complete
    rounds = history(tracker)
    assert sum(sum(r["iters"]) for r in rounds) == work
    assert rounds[1]["iters"] == [10, 10]  # the probe
    # the round after the probe: copy 1 stopped at about 0.5 s, well short of its quota
    assert rounds[2]["seconds"][1] < 1.5
    assert rounds[2]["iters"][1] < 200
    # (one iteration of copy 1 is 20 ms: no copy's round lasts much past its 0.5 s)
    assert max(s for r in rounds[1:] for s in r["seconds"]) < 1.5


def test_unforked_signal_then_kill_then_resume(tmp_path: Path, procs: list[Proc]) -> None:
    """USR1: checkpoint at the next iteration boundary, exit 75, nothing lost.  SIGKILL: at
    most the round in progress lost.  Each requeue resumes from the last commit; the total is
    exactly W."""
    work, per_round = 3000, 150
    tracker = tmp_path / ".hadar-tracker" / "500"
    out = tmp_path / "model.pt"

    def run(restarts: int, name: str) -> Proc:
        env = {"SLURM_JOB_ID": "500"}
        if restarts:
            env["SLURM_RESTART_COUNT"] = str(restarts)
        args = ["--steps", str(work), "--round-iters", str(per_round), "--sleep-ms", "1",
                "--count", str(tmp_path / f"{name}.count"), "--output", str(out)]
        proc = launch(DRIVER, args, env, tmp_path, name)
        procs.append(proc)
        return proc

    first = run(0, "run0")
    wait_until("a commit", lambda: (s := committed(tracker)) is not None and s.round >= 2,
               [first])
    first.popen.send_signal(signal.SIGUSR1)
    assert first.wait() == EXIT_PREEMPTED, first.stderr
    assert "stopped (signal USR1)" in first.stderr
    s1 = committed(tracker)
    assert s1 is not None and s1.stop == "signal USR1"
    assert count(tmp_path / "run0.count") == s1.done  # checkpoint of the exact progress

    second = run(1, "run1")
    wait_until("two more commits", lambda: (s := committed(tracker)) is not None
               and s.round >= s1.round + 2, [second])
    second.popen.kill()
    second.wait()
    s2 = committed(tracker)
    assert s2 is not None
    ran2 = count(tmp_path / "run1.count")
    lost = ran2 - (s2.done - s1.done)
    assert 0 <= lost <= per_round  # at most the round in progress
    assert "resuming at round" in second.stdout and f"{s1.done}/{work}" in second.stdout

    third = run(2, "run2")
    assert third.wait() == 0, third.stderr
    s3 = committed(tracker)
    assert s3 is not None and s3.done == work
    assert count(tmp_path / "run2.count") == work - s2.done
    assert sum(sum(r["iters"]) for r in history(tracker)) == work
    assert out.exists()


def test_a_kill_between_commit_and_history_line_is_repaired_on_resume(
        tmp_path: Path, procs: list[Proc]) -> None:
    """SIGKILL after state.json is written but before the history line: the history is a round
    short (or ends in half a line).  The next run writes the committed round's line from the
    state, so the history still adds up to the work done."""
    work, per_round = 600, 100
    tracker = tmp_path / ".hadar-tracker" / "501"
    args = ["--steps", str(work), "--round-iters", str(per_round), "--sleep-ms", "1",
            "--count", str(tmp_path / "count")]
    first = launch(DRIVER, args, {"SLURM_JOB_ID": "501"}, tmp_path, "run0")
    procs.append(first)
    wait_until("three commits", lambda: (s := committed(tracker)) is not None and s.round >= 3,
               [first])
    first.popen.send_signal(signal.SIGUSR1)
    assert first.wait() == EXIT_PREEMPTED, first.stderr
    state = committed(tracker)
    assert state is not None
    lines = (tracker / "history.jsonl").read_text().splitlines()
    rounds = [json.loads(line)["round"] for line in lines]
    assert rounds[-1] == state.round
    # as if killed right after the commit, in the middle of the history line.  The stop may
    # also have written a "nothing new" line for the same round (iters []): cut both.
    before = [line for line, r in zip(lines, rounds, strict=True) if r < state.round]
    cut = lines[rounds.index(state.round)][:9]
    prev_done = json.loads(before[-1])["done"] if before else 0
    (tracker / "history.jsonl").write_text("".join(line + "\n" for line in before) + cut)
    second = launch(DRIVER, args, {"SLURM_JOB_ID": "501", "SLURM_RESTART_COUNT": "1"},
                    tmp_path, "run1")
    procs.append(second)
    assert second.wait() == 0, second.stderr
    rows = history(tracker)
    recovered = [r for r in rows if r.get("recovered")]
    assert [(r["round"], r["done"], r["iters"]) for r in recovered] == [
        (state.round, state.done, [state.done - prev_done])]
    assert sum(sum(r["iters"]) for r in rows) == work
    assert [r["round"] for r in rows] == sorted(r["round"] for r in rows)


def test_lost_copy_times_out_then_requeue_completes(
    tmp_path: Path, procs: list[Proc],
) -> None:
    """SIGKILL copy 2: copies 0 and 1 give up at the barrier (exit 76, naming copy 2); a
    requeue (same job, restart count 1) of all copies finishes with exactly W, having lost at
    most one round per copy."""
    work, per_round = 4000, 300
    tracker = tmp_path / "tracker"
    timeout = {"HADAR_BARRIER_TIMEOUT": "3"}

    def group(restarts: int) -> list[Proc]:
        out = []
        for i in range(3):
            args = ["--steps", str(work), "--round-iters", str(per_round), "--sleep-ms", "1",
                    "--count", str(tmp_path / f"r{restarts}c{i}.count")]
            env = copy_env(9, 3, i, tracker, restarts) | timeout
            out.append(launch(DRIVER, args, env, tmp_path, f"r{restarts}c{i}"))
        procs.extend(out)
        return out

    first = group(0)
    wait_until("two commits", lambda: (s := committed(tracker)) is not None and s.round >= 2,
               first)
    first[2].popen.kill()
    codes = [p.wait() for p in first]
    assert codes[:2] == [EXIT_COPY_LOST, EXIT_COPY_LOST], [p.stderr for p in first]
    assert codes[2] == -signal.SIGKILL
    assert "copy 2" in first[0].stderr and "no sign of life" in first[0].stderr
    # copy 1 waits for copy 0's commit: it learns from copy 0's goodbye, or times out itself
    assert "copy 2" in first[1].stderr or "copy 0" in first[1].stderr
    s1 = committed(tracker)
    assert s1 is not None and s1.done < work
    ran = [count(tmp_path / f"r0c{i}.count") for i in range(3)]
    by_copy = [sum(r["iters"][i] for r in history(tracker)[1:]) for i in range(3)]
    lost = [r - c for r, c in zip(ran, by_copy, strict=True)]
    assert all(0 <= x <= per_round for x in lost) and sum(lost) <= per_round, lost

    second = group(1)
    assert [p.wait() for p in second] == [0, 0, 0], [p.stderr for p in second]
    s2 = committed(tracker)
    assert s2 is not None and s2.done == work
    assert sum(count(tmp_path / f"r1c{i}.count") for i in range(3)) == work - s1.done
    assert sum(sum(r["iters"]) for r in history(tracker)) == work


def test_three_copies_then_unforked_then_already_done(
    tmp_path: Path, procs: list[Proc],
) -> None:
    """Job 31 forked into 3 copies (time limit: they stop at a round boundary), then run
    unforked from its workdir: it continues from the same committed state to exactly W; run
    once more, it only rewrites the missing output and exits 0."""
    work = 3000
    tracker = tmp_path / ".hadar-tracker" / "31"  # what the sidecar gives the fork of job 31
    out = tmp_path / "model.pt"

    def args(name: str, *more: str) -> list[str]:
        return ["--steps", str(work), "--round-seconds", "0.2",
                "--count", str(tmp_path / f"{name}.count"), "--output", str(out), *more]

    # at most 1000 iterations/s per copy (1 ms sleep each): the time limit comes first
    forked = [launch(DRIVER, args(f"c{i}", "--time-limit-s", "0.6", "--sleep-ms", "1"),
                     copy_env(31, 3, i, tracker), tmp_path, f"c{i}") for i in range(3)]
    procs.extend(forked)
    assert [p.wait() for p in forked] == [0, 0, 0], [p.stderr for p in forked]
    s1 = committed(tracker)
    assert s1 is not None and 0 < s1.done < work and s1.stop == "time limit"
    assert sum(count(tmp_path / f"c{i}.count") for i in range(3)) == s1.done  # none lost

    alone = launch(DRIVER, args("alone"), {"SLURM_JOB_ID": "31"}, tmp_path, "alone")
    procs.append(alone)
    assert alone.wait() == 0, alone.stderr
    assert f"resuming at round {s1.round}, {s1.done}/{work}" in alone.stdout
    s2 = committed(tracker)
    assert s2 is not None and s2.done == work and s2.copies == 1
    assert count(tmp_path / "alone.count") == work - s1.done

    out.unlink()
    again = launch(DRIVER, args("again"), {"SLURM_JOB_ID": "31"}, tmp_path, "again")
    procs.append(again)
    assert again.wait() == 0, again.stderr
    assert "work already done" in again.stdout
    assert count(tmp_path / "again.count") == 0 and out.exists()
    assert committed(tracker) == s2
