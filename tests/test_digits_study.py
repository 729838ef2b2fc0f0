"""examples/digits_study.py (issue #17): a small tuning study trained for real with torch on the
CPU.  The halving worked by hand from eta, stopped trials that never train past their rung,
resume through checkpoints that is bit for bit training straight through, and the study's best
configuration reaching exactly the accuracy it reaches retrained alone."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
SCRIPT = EXAMPLES / "digits_study.py"


@pytest.fixture(scope="module")
def study() -> Any:
    """The example as a module (examples/ is no package)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import digits_study  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLES))
    return digits_study


@pytest.fixture(autouse=True)
def torch_globals() -> Iterator[None]:
    """main() sets torch's threads and deterministic mode, and the trials seed torch: put them
    back for the other tests of the session."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    rng = torch.get_rng_state()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    torch.set_rng_state(rng)


def run_main(study: Any, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "study.json"
    rc = study.main([*args, "--workdir", str(tmp_path / "ckpt"), "--json", str(out), "--quiet"])
    assert rc == 0
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def checkpoints(tmp_path: Path, trial: int) -> list[str]:
    return sorted(p.name for p in (tmp_path / "ckpt" / f"trial-{trial:03d}").iterdir())


def test_sh_study_halves_by_hand_and_its_best_matches_training_alone(
        study: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 6 trials, eta 2, 3 rungs of max-steps 400: rungs at 400/4, 400/2, 400 steps; the cohorts
    # are 6, then floor(6/2) = 3, then floor(3/2) = 1
    r = run_main(study, tmp_path, "--rule", "sh", "--trials", "6", "--rungs", "3", "--eta", "2",
                 "--max-steps", "400", "--seed", "3")
    assert r["study"]["rung_steps"] == [100, 200, 400]
    assert r["rung_counts"] == [6, 3, 1]
    # 3 stop at 100 steps, 2 at 200, 1 trains to 400
    assert r["steps_trained"] == 3 * 100 + 2 * 200 + 400
    trials = {t["trial"]: t for t in r["trials"]}
    assert sorted(trials) == list(range(6))
    configs = study.draw_configs(6, 3)
    for t, rec in trials.items():
        assert rec["config"] == {"lr": configs[t].lr, "hidden": configs[t].hidden,
                                 "seed": configs[t].seed}
        last = max(int(k) for k in rec["reports"])
        # a trial reports at every rung up to where it stopped, and trained no further
        assert sorted(int(k) for k in rec["reports"]) == list(range(last + 1))
        assert rec["steps"] == r["study"]["rung_steps"][last]
        assert checkpoints(tmp_path, t) == [f"rung-{k}.pt" for k in range(last + 1)]
        ckpt = torch.load(tmp_path / "ckpt" / f"trial-{t:03d}" / f"rung-{last}.pt",
                          weights_only=True)
        assert ckpt["steps"] == rec["steps"]
        expect = ["go"] * last + (["done"] if last == 2 else ["stop"])
        assert [rec["verdicts"][str(k)] for k in range(last + 1)] == expect
        assert rec["status"] == ("finished" if last == 2 else "stopped")

    # the cohorts by hand: the best of the cohort before by its accuracy there (a stable sort:
    # ties to the earlier of the cohort, listed best first as halving.cohorts keeps them)
    def best(rung: int, cohort: list[int], n: int) -> list[int]:
        return sorted(cohort, key=lambda t: -trials[t]["reports"][str(rung)])[:n]

    rung1 = [t for t in trials if "1" in trials[t]["reports"]]
    rung2 = [t for t in trials if "2" in trials[t]["reports"]]
    assert sorted(rung1) == sorted(best(0, list(range(6)), 3))
    assert rung2 == best(1, best(0, list(range(6)), 3), 1)
    # sh: everyone waits at a rung until the last of its cohort reports
    rung0 = [e["verdict"] for e in r["events"] if e["rung"] == 0]
    assert rung0[:5] == ["wait"] * 5 and rung0[5] in ("go", "stop")
    assert [e["trial"] for e in r["events"][:6]] == list(range(6))  # submission order

    # the best configuration: the study's accuracy is exactly the one it reaches trained alone
    assert r["best"]["trial"] == rung2[0]
    assert r["best"]["val_accuracy"] == trials[rung2[0]]["reports"]["2"]
    assert r["retrained"]["identical_weights"] is True and r["match"] is True
    assert r["retrained"]["val_accuracy"] == r["best"]["val_accuracy"]
    assert r["retrained"]["test_accuracy"] == r["best"]["test_accuracy"]
    assert r["best"]["test_accuracy"] > 0.5  # it learned (chance is 0.1)
    out = capsys.readouterr().out
    assert "trials per rung 6 -> 3 -> 1" in out and "digits_study: MATCH:" in out


def test_resume_through_checkpoints_is_training_straight_through(study: Any,
                                                                 tmp_path: Path) -> None:
    torch.set_num_threads(1)  # as the study runs (put back by torch_globals)
    cfg = study.TrialConfig(lr=0.05, hidden=32, seed=11)
    data = study.Data.load(0)
    rungs = (60, 120, 240)
    trial = study.TrialState.fresh(cfg)
    for k, steps in enumerate(rungs):  # rung by rung, each rung from the last one's file
        if k:
            trial = study.TrialState.load(cfg, tmp_path / f"rung-{k - 1}.pt")
            assert trial.steps == rungs[k - 1]
        trial.train_to(steps, data)
        trial.save(tmp_path / f"rung-{k}.pt")
    straight = study.TrialState.fresh(cfg)
    straight.train_to(rungs[-1], data)

    assert study.same_weights(trial.model, straight.model)
    a, b = trial.optimizer.state_dict(), straight.optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(torch.equal(a["state"][i]["momentum_buffer"], b["state"][i]["momentum_buffer"])
               for i in b["state"])
    assert torch.equal(trial.batches.get_state(), straight.batches.get_state())

    # the check can fail: resumed without the batch order's state, the weights differ
    careless = study.TrialState.load(cfg, tmp_path / "rung-1.pt")
    careless.batches.manual_seed(cfg.seed)
    careless.train_to(rungs[-1], data)
    assert not study.same_weights(careless.model, straight.model)
    # a checkpoint resumes only its own trial
    with pytest.raises(ValueError, match="another trial"):
        study.TrialState.load(study.TrialConfig(lr=0.05, hidden=32, seed=12),
                              tmp_path / "rung-1.pt")


def test_asha_runs_promoting_as_reports_come(study: Any, tmp_path: Path) -> None:
    r = run_main(study, tmp_path, "--rule", "asha", "--trials", "6", "--rungs", "3", "--eta",
                 "2", "--max-steps", "200", "--seed", "1")
    counts = r["rung_counts"]
    events = r["events"]
    assert [e["trial"] for e in events[:6]] == list(range(6))
    # the first report of a rung waits (floor(1/2) = 0 go on yet), the second ranks among
    # floor(2/2) = 1: the better of the two goes on at once
    assert events[0]["verdict"] == "wait"
    assert events[1]["verdict"] == ("go" if events[1]["val_accuracy"]
                                    > events[0]["val_accuracy"] else "wait")
    # once rung 0 is complete the best max(1, floor(6/2)) = 3 have gone on, and maybe one
    # promoted earlier besides; rung 1 sends on at least max(1, floor(n/2)) of its n
    rung0 = {t["trial"]: t["reports"]["0"] for t in r["trials"]}
    best3 = sorted(rung0, key=lambda t: -rung0[t])[:3]
    on = [t["trial"] for t in r["trials"] if "1" in t["reports"]]
    assert set(best3) <= set(on) and counts[1] == len(on) >= 3
    assert counts[2] >= max(1, counts[1] // 2)
    for t in r["trials"]:
        assert t["steps"] == r["study"]["rung_steps"][max(int(k) for k in t["reports"])]
    finished = [t["trial"] for t in r["trials"] if t["status"] == "finished"]
    assert len(finished) == counts[2] and r["best"]["trial"] in finished
    assert r["match"] is True


def test_none_trains_every_trial_to_the_end(study: Any, tmp_path: Path) -> None:
    r = run_main(study, tmp_path, "--rule", "none", "--trials", "4", "--rungs", "2", "--eta",
                 "2", "--max-steps", "200")
    assert r["study"]["rung_steps"] == [100, 200]
    assert r["rung_counts"] == [4, 4]
    assert all(t["steps"] == 200 and t["status"] == "finished" for t in r["trials"])
    assert r["steps_trained"] == 4 * 200
    vals = {t["trial"]: t["reports"]["1"] for t in r["trials"]}
    assert r["best"]["trial"] == max(vals, key=lambda t: vals[t])  # ties to the earlier
    assert r["match"] is True


def test_bad_argument_exits_2_naming_the_option(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--eta", "1", "--workdir",
                        str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("digits_study: error: --eta:"), p.stderr
    assert not (tmp_path / "ckpt").exists()  # nothing ran


@pytest.mark.parametrize(("args", "option"), [
    (["--rule", "fastest"], "--rule"),
    (["--rungs", "0"], "--rungs"),
    (["--trials", "0"], "--trials"),
    (["--max-steps", "3", "--rungs", "3"], "--rungs"),  # a first rung under one step
    (["--max-steps", "many"], "--max-steps"),
    (["--threads", "0"], "--threads"),
])
def test_bad_arguments_name_the_option(study: Any, capsys: pytest.CaptureFixture[str],
                                       args: list[str], option: str) -> None:
    assert study.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err, err
