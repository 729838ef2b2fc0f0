"""Successive halving applied live (issue #17): the files between a trial and the sidecar, the
trial's side (:class:`StudyTrial`), the sidecar's study book and what the backend makes of it,
over the in-memory Slurm of tests/test_sidecar_backend.py.  The same code runs against a real
Slurm in tests/test_study_cluster.py.

Every expected verdict is worked out by hand in a comment, from the rules of
hadar_slurm/studies/halving.py (asha: a report goes on when it ranks within the best
max(1, floor(n / eta)) of the n reports of its rung so far; sh: a cohort's best
max(1, floor(n / eta)) go on once all of it has reported).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.hints import parse_hints
from hadar_slurm.loop import ChangeKind
from hadar_slurm.sidecar.config import default_config
from hadar_slurm.sidecar.controller import epoch_state
from hadar_slurm.sidecar.status import explain
from hadar_slurm.sidecar.studies import STUDIES_FILE, StudyBook, study_summary
from hadar_slurm.slurm import SlurmJob
from hadar_slurm.studies.halving import Verdict
from hadar_slurm.studies.protocol import (
    STUDY_SUBDIR,
    RungReport,
    Steered,
    VerdictNote,
    report_name,
    verdict_name,
)
from hadar_slurm.studies.reporter import StudyTrial, rung_targets
from tests.test_sidecar_backend import NODES, FakeSlurm, backend, decide, job

# 6 trials, 3 rungs, eta 2: rungs at 25, 50 and 100 steps
STUDY = "hadar: model=resnet50 bs=64 steps=100 study=s1 rule={rule} rungs=3 eta=2"


# -- the files ------------------------------------------------------------------------------

def test_rung_targets_round_and_never_repeat() -> None:
    assert rung_targets(40000, 4, 3) == (1481, 4444, 13333, 40000)
    assert rung_targets(100, 3, 2) == (25, 50, 100)
    assert rung_targets(9, 3, 3) == (1, 3, 9)
    assert rung_targets(4, 3, 2) == (1, 2, 4)
    assert rung_targets(5, 1, 3) == (5,)


def test_files_round_trip_and_bad_fields_are_named(tmp_path: Path) -> None:
    rep = RungReport(1, 0.5, 50.0, 1000.0, "accuracy", {"lr": 0.1})
    (tmp_path / STUDY_SUBDIR).mkdir()
    (tmp_path / STUDY_SUBDIR / report_name(1)).write_text(rep.text())
    assert RungReport.read(tmp_path, 1) == rep
    assert RungReport.read(tmp_path, 0) is None
    note = VerdictNote(1, Verdict.WAIT, "cohort", 5.0)
    assert VerdictNote.parse(json.loads(note.text())) == note
    steered = Steered("s1", "sh", 720.0, 3.0)
    assert Steered.parse(json.loads(steered.text())) == steered
    bad = json.loads(rep.text()) | {"value": "high"}
    with pytest.raises(InputError, match="field 'value'"):
        RungReport.parse(bad)
    with pytest.raises(InputError, match=r"field 'verdict'.*go, stop, wait or done"):
        VerdictNote.parse({"format": 1, "rung": 0, "verdict": "maybe"})
    with pytest.raises(InputError, match="field 'format'"):
        Steered.parse({"format": 2, "wait_s": 1})
    # a report in the file of another rung is refused (naming the field)
    (tmp_path / STUDY_SUBDIR / report_name(2)).write_text(rep.text())
    with pytest.raises(InputError, match="field 'rung'"):
        RungReport.read(tmp_path, 2)
    # a symlink is not followed
    os.symlink(tmp_path / STUDY_SUBDIR / report_name(1), tmp_path / STUDY_SUBDIR / "rung-0.json")
    with pytest.raises(InputError, match="cannot be read"):
        RungReport.read(tmp_path, 0)


# -- the trial's side -----------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def trial(tmp_path: Path, clock: Clock, **kw: object) -> StudyTrial:
    return StudyTrial(tmp_path, (25, 50, 100), study="s1", index=3, log=io.StringIO(),
                      clock=clock, sleep=clock.sleep, **kw)  # type: ignore[arg-type]


def test_without_a_sidecar_a_trial_trains_on_at_once(tmp_path: Path) -> None:
    clock = Clock()
    t = trial(tmp_path, clock)
    assert t.report(0, 0.5, steps=25) is Verdict.GO
    assert clock.t == 1000.0  # (no wait at all)
    assert RungReport.read(tmp_path, 0) == RungReport(0, 0.5, 25.0, 1000.0, "accuracy", None)
    assert "no sidecar steers this study" in t.log.getvalue()  # type: ignore[attr-defined]
    assert t.report(2, 0.7, steps=100) is Verdict.DONE  # (the last rung: never waits)


def test_a_trial_waits_for_its_verdict_and_keeps_its_first_report(tmp_path: Path) -> None:
    clock = Clock()
    t = trial(tmp_path, clock)
    d = tmp_path / STUDY_SUBDIR
    d.mkdir()
    (d / "steered.json").write_text(Steered("s1", "sh", 60.0).text())
    polls: list[float] = []

    def sleep(s: float) -> None:  # the sidecar answers after 2 s: wait, then after 5 s: go
        clock.t += s
        polls.append(clock.t)
        if abs(clock.t - 1002.0) < 1e-9:
            (d / verdict_name(0)).write_text(VerdictNote(0, Verdict.WAIT, "cohort").text())
        if abs(clock.t - 1005.0) < 1e-9:
            (d / verdict_name(0)).write_text(VerdictNote(0, Verdict.GO, "ranks 1").text())

    t.sleep = sleep
    assert t.report(0, 0.5, steps=25) is Verdict.GO
    assert clock.t == pytest.approx(1005.0)
    log = t.log.getvalue()  # type: ignore[attr-defined]
    assert "waits at rung 0 for the rest of its cohort (cohort)" in log
    assert "goes on from rung 0 (ranks 1)" in log
    # run again (a requeue): the first report stays, the verdict is read again
    assert t.report(0, 0.9, steps=25) is Verdict.GO
    assert RungReport.read(tmp_path, 0).value == 0.5  # type: ignore[union-attr]
    (d / verdict_name(1)).write_text(VerdictNote(1, Verdict.STOP, "ranks 3 of 4").text())
    assert t.report(1, 0.4, steps=50) is Verdict.STOP


def test_a_trial_never_waits_past_the_bound_nor_through_a_preemption(tmp_path: Path) -> None:
    clock = Clock()
    t = trial(tmp_path, clock)
    (tmp_path / STUDY_SUBDIR).mkdir()
    (tmp_path / STUDY_SUBDIR / "steered.json").write_text(Steered("s1", "asha", 30.0).text())
    assert t.report(0, 0.5, steps=25) is Verdict.GO
    assert clock.t == pytest.approx(1030.0)
    assert "no verdict at rung 0 within 30 s: it trains on" in t.log.getvalue()  # type: ignore
    calls = iter([False, False, True])
    assert t.report(1, 0.5, steps=50, interrupted=lambda: next(calls)) is Verdict.GO
    assert clock.t == pytest.approx(1031.0)  # two polls, then the signal ended the wait
    with pytest.raises(InputError, match="field 'value'"):
        t.report(1, float("nan"), steps=50)


def test_trial_settings_from_the_launchers_environment(tmp_path: Path) -> None:
    env = {"HADAR_STUDY_STEPS": "40000", "HADAR_STUDY_RUNGS": "4", "HADAR_STUDY_ETA": "3",
           "HADAR_STUDY": "lr", "HADAR_STUDY_METRIC": "loss", "HADAR_STUDY_MODE": "min",
           "HADAR_TRIAL_INDEX": "7", "HADAR_TRIAL_CONFIG": '{"lr": 0.01}'}
    t = StudyTrial.from_env(tmp_path, env=env)
    assert (t.targets, t.study, t.metric, t.mode, t.index, t.config) == (
        (1481, 4444, 13333, 40000), "lr", "loss", "min", 7, {"lr": 0.01})
    assert list(t.rungs_ahead(4444)) == [(1, 4444), (2, 13333), (3, 40000)]
    with pytest.raises(InputError, match="HADAR_STUDY_STEPS"):
        StudyTrial.from_env(tmp_path, env={})
    with pytest.raises(InputError, match="HADAR_STUDY_RUNGS"):
        StudyTrial.from_env(tmp_path, env=env | {"HADAR_STUDY_RUNGS": "0"})


# -- the sidecar's study book ---------------------------------------------------------------

def task(array: int, t: int, job_id: int, rule: str, tmp: Path, *, state: str = "RUNNING",
         node_: str = "node1") -> SlurmJob:
    running = state == "RUNNING"
    return replace(job(job_id, state=state, reason="None" if running else "JobHeldAdmin",
                       comment=STUDY.format(rule=rule), nodes=(node_,) if running else (),
                       start=1000 if running else None, admin=(
                           f"hadar epoch=0 state=placed place={node_}:1 gpus=1" if running
                           else "hadar: held for the sidecar")),
                   array_job_id=array, array_task_id=t, workdir=str(tmp),
                   user_id=os.getuid(), group_id=os.getgid())


def report(tmp: Path, job_id: int, rung: int, value: float, when: float) -> None:
    d = tmp / ".hadar-tracker" / str(job_id) / STUDY_SUBDIR
    d.mkdir(parents=True, exist_ok=True)
    (d / report_name(rung)).write_text(
        RungReport(rung, value, float(rung_targets(100, 3, 2)[rung]), when).text())


def told(tmp: Path, job_id: int, rung: int) -> str | None:
    note = VerdictNote.read(tmp / ".hadar-tracker" / str(job_id), rung)
    return None if note is None else note.verdict.value


def hints_of(jobs: Sequence[SlurmJob]) -> dict[int, object]:
    return {j.job_id: parse_hints(j.comment, array=True) for j in jobs}


def test_asha_verdicts_follow_the_order_the_reports_were_read(tmp_path: Path) -> None:
    jobs = [task(10, t, 10 + t, "asha", tmp_path) for t in range(6)]
    book = StudyBook()
    st = book.observe(jobs, hints_of(jobs), 2000.0, 0)  # type: ignore[arg-type]
    assert {j: s.state for j, s in st.items()} == {j.job_id: "train" for j in jobs}
    assert {s.target for s in st.values()} == {25}
    # (the rungs after the one each trains toward, 25 of 100 steps: the policy's
    # ``Snapshot.after``, the trial's path to its study's end)
    assert {s.after for s in st.values()} == {75}
    # epoch 1 reads trials 0 and 1 (1 first by its report time); epoch 2 reads 2, 3, 4
    report(tmp_path, 10, 0, 0.50, 1100.0)
    report(tmp_path, 11, 0, 0.40, 1090.0)
    st = book.observe(jobs, hints_of(jobs), 2001.0, 1)  # type: ignore[arg-type]
    # 2 reports, floor(2/2) = 1 goes on: trial 0 (0.50); trial 1 (0.40) could still be among
    # the best floor(6/2) = 3 once the 4 others report: it waits
    assert (st[10].state, st[10].rung, st[10].target, st[10].after) == ("train", 1, 50, 50)
    assert (st[11].state, st[11].rung, st[11].after) == ("wait", 0, 0)
    report(tmp_path, 12, 0, 0.45, 1200.0)
    report(tmp_path, 13, 0, 0.60, 1201.0)
    report(tmp_path, 14, 0, 0.30, 1202.0)
    st = book.observe(jobs, hints_of(jobs), 2002.0, 2)  # type: ignore[arg-type]
    # 5 reports (.40 .50 .45 .60 .30), floor(5/2) = 2 go on: trial 3 (.60, 1st) goes, trial 0
    # (2nd) had; with one to come at most 3 ever go on: trial 2 (3rd) waits, trials 1 (4th)
    # and 4 (5th) stop
    assert [st[j].state for j in (11, 12, 13, 14, 15)] == [
        "stopped", "wait", "train", "stopped", "train"]
    assert ("ranks 5 of the 5 reports of that rung so far; asha: it can no longer be among "
            "the best 1/eta of them: stop") in st[14].detail
    assert not st[14].cancel  # (running, told nothing yet: it exits by itself once told)
    notes = {(n.job_id, n.name): n for n in book.to_tell(2002.0)}
    # (a trial stopped before it was ever told a sidecar steers it is not told so now)
    assert (13, "steered.json") in notes and (14, "steered.json") not in notes
    assert json.loads(notes[(14, verdict_name(0))].text)["verdict"] == "stop"
    assert json.loads(notes[(12, verdict_name(0))].text)["verdict"] == "wait"
    for n in notes.values():
        book.told(n, 2002.0)
    assert book.to_tell(2003.0) == []
    # a grace period after it was told it still runs: cancelled
    st = book.observe(jobs, hints_of(jobs), 2031.0, 3)  # type: ignore[arg-type]
    assert not st[14].cancel
    st = book.observe(jobs, hints_of(jobs), 2032.0, 4)  # type: ignore[arg-type]
    assert st[14].cancel
    # trial 5 reports .55: rung 0 complete, the best 3 (.60 .55 .50) go on: 5 goes, 2 stops
    report(tmp_path, 15, 0, 0.55, 1300.0)
    st = book.observe(jobs, hints_of(jobs), 2033.0, 5)  # type: ignore[arg-type]
    assert (st[15].state, st[12].state) == ("train", "stopped")


def test_sh_waits_for_the_cohort_and_a_lost_trial_does_not_hold_it(tmp_path: Path) -> None:
    jobs = [task(20, t, 20 + t, "sh", tmp_path) for t in range(4)]
    book = StudyBook()
    book.observe(jobs, hints_of(jobs), 2000.0, 0)  # type: ignore[arg-type]
    for t, v in enumerate((0.5, 0.9, 0.7)):
        report(tmp_path, 20 + t, 0, v, 1100.0 + t)
    st = book.observe(jobs, hints_of(jobs), 2001.0, 1)  # type: ignore[arg-type]
    assert [st[j].state for j in (20, 21, 22, 23)] == ["wait", "wait", "wait", "train"]
    assert "1 trial(s) still training to that rung" in st[20].detail
    # trial 3's job fails before it reports: the worst of its cohort; cohort 4, keep
    # floor(4/2) = 2: trials 1 (0.9) and 2 (0.7) go on, 0 (0.5) stops
    jobs[3] = replace(jobs[3], state="FAILED")
    st = book.observe(jobs, hints_of(jobs), 2002.0, 2)  # type: ignore[arg-type]
    assert [st[j].state for j in (20, 21, 22)] == ["stopped", "train", "train"]
    assert 23 not in st
    study = book.studies[20]
    assert study.trials[3].final == "lost"
    assert "its job ended (FAILED) before it reported rung 0" in study.trials[3].why
    # rung 1: cohort {1, 2}, keep 1: 0.95 over 0.8; rung 2: done
    report(tmp_path, 21, 1, 0.8, 1300.0)
    report(tmp_path, 22, 1, 0.95, 1301.0)
    st = book.observe(jobs, hints_of(jobs), 2003.0, 3)  # type: ignore[arg-type]
    assert (st[21].state, st[22].state, st[22].target) == ("stopped", "train", 100)
    report(tmp_path, 22, 2, 0.97, 1400.0)
    jobs = [replace(j, state="COMPLETED") for j in jobs]
    book.observe(jobs, hints_of(jobs), 2004.0, 4)  # type: ignore[arg-type]
    s = study_summary(study)
    assert s["ended"] == 2004.0 and s["live"] == 0
    assert s["best"]["task"] == 2 and s["best"]["value"] == 0.97
    assert [(r["reported"], r["go"], r["stop"], r["lost"]) for r in s["by_rung"]] == [
        (3, 2, 1, 1), (2, 1, 1, 0), (1, 0, 0, 0)]


def test_hyperband_halves_each_bracket_from_its_own_rung(tmp_path: Path) -> None:
    # 4 trials, 3 rungs, eta 2: Hyperband's weights 4/3, 1, 1 give brackets of 2, 1 and 1:
    # tasks 0 and 1 halve from rung 0, task 2 from rung 1, task 3 trains to the end
    jobs = [task(30, t, 30 + t, "hyperband", tmp_path) for t in range(4)]
    book = StudyBook()
    book.observe(jobs, hints_of(jobs), 2000.0, 0)  # type: ignore[arg-type]
    for t, v in enumerate((0.5, 0.9, 0.1, 0.2)):
        report(tmp_path, 30 + t, 0, v, 1100.0 + t)
    st = book.observe(jobs, hints_of(jobs), 2001.0, 1)  # type: ignore[arg-type]
    # bracket 0 keeps floor(2/2) = 1 of its 2; the worst two reports of rung 0 go on, being
    # below their brackets' first rungs
    assert [st[j].state for j in (30, 31, 32, 33)] == ["stopped", "train", "train", "train"]
    assert "ranks 2 of its cohort of 2; hyperband (bracket 0) keeps the best 1: stop" in (
        st[30].detail)
    assert "hyperband: its bracket starts halving at rung 1: go" in st[32].detail
    assert {st[j].rung for j in (31, 32, 33)} == {1}
    # rung 1: task 1 is bracket 0's cohort there, task 2 bracket 1's, each alone: both go on,
    # though task 3 reported better
    for t, v in ((1, 0.8), (2, 0.3), (3, 0.95)):
        report(tmp_path, 30 + t, 1, v, 1200.0 + t)
    st = book.observe(jobs, hints_of(jobs), 2002.0, 2)  # type: ignore[arg-type]
    assert [(st[j].state, st[j].rung) for j in (31, 32, 33)] == [("train", 2)] * 3
    for t, v in ((1, 0.85), (2, 0.4), (3, 0.97)):
        report(tmp_path, 30 + t, 2, v, 1300.0 + t)
    jobs = [replace(j, state="COMPLETED") for j in jobs]
    book.observe(jobs, hints_of(jobs), 2003.0, 3)  # type: ignore[arg-type]
    s = study_summary(book.studies[30])
    assert s["best"]["task"] == 3 and s["best"]["value"] == 0.97
    assert [(r["reported"], r["go"], r["stop"]) for r in s["by_rung"]] == [
        (4, 3, 1), (3, 3, 0), (3, 0, 0)]


def test_the_book_survives_a_restart_and_a_damaged_one_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "state" / STUDIES_FILE
    jobs = [task(30, t, 30 + t, "asha", tmp_path) for t in range(2)]
    book = StudyBook(path)
    report(tmp_path, 30, 0, 0.5, 1100.0)
    book.observe(jobs, hints_of(jobs), 2000.0, 0)  # type: ignore[arg-type]
    book.save()
    again = StudyBook(path)
    assert again.studies[30].trials[0].reports == {0: (0.5, 1100.0, 0)}
    assert again.studies[30].trials[0].verdicts == {0: "wait"}  # (1 of 2 reports)
    path.write_text("{not json")
    fresh = StudyBook(path)
    assert fresh.studies == {} and "cannot be read" in fresh.load_error
    assert (tmp_path / "state" / f"{STUDIES_FILE}.damaged").exists()


# -- the backend: what Slurm is told --------------------------------------------------------

def test_the_backend_stops_requeues_and_cancels_trials_as_their_study_says(
        tmp_path: Path) -> None:
    # an sh study of 4 trials: 0, 1 and 2 run (node1, node2), 3 waits held
    jobs = [task(40, 0, 40, "sh", tmp_path), task(40, 1, 41, "sh", tmp_path, node_="node2"),
            task(40, 2, 42, "sh", tmp_path, node_="node3"),
            task(40, 3, 43, "sh", tmp_path, state="PENDING")]
    api = FakeSlurm(jobs, NODES)
    b = backend(api, studies=StudyBook(tmp_path / "state" / STUDIES_FILE, grace_s=5.0))
    runs = {40: [(0, 1)], 41: [(1, 1)], 42: [(2, 1)]}  # (node index, GPUs): where they run
    decision, changes = decide(b, runs, epoch=0)
    b.apply(changes, 2000.0)
    # every trial is told that a sidecar steers its study (and how long to wait at most)
    steered = Steered.read(tmp_path / ".hadar-tracker" / "40")
    assert steered is not None and steered.wait_s == 900.0 and steered.rule == "sh"
    report(tmp_path, 40, 0, 0.5, 1100.0)
    report(tmp_path, 41, 0, 0.9, 1101.0)
    assert b.reported_since_epoch() == [40, 41]
    api.log.clear()
    decision, changes = decide(b, {42: [(2, 1)]}, epoch=1, now=2001.0)
    snap = b.snapshot(1, 2001.0, 60.0, None)
    # 40 and 41 wait for the cohort: not the policy's; the changes requeue them held
    assert sorted(snap.job_ids.tolist()) == [42, 43]
    # trials: HadarE offers them their water-filling cap of copies whatever their length
    assert snap.spread is not None and snap.spread.tolist() == [True, True]
    # and, 2 of the study's 4 trials offered, each weighs 4 / 2 (trial_weight): the study's
    # weight is kept as its trials wait or are stopped
    assert snap.weight.tolist() == [2.0, 2.0]
    kinds = {c.job_id: c.kind for c in changes}
    assert (kinds[40], kinds[41], kinds[42], kinds[43]) == (
        ChangeKind.STOP, ChangeKind.STOP, ChangeKind.KEEP, ChangeKind.WAIT)
    b.apply(changes, 2001.0)
    assert told(tmp_path, 40, 0) == "wait" and told(tmp_path, 41, 0) == "wait"
    assert ("requeuehold", 40) in api.log and ("requeuehold", 41) in api.log
    state = epoch_state(default_config(), b, snap, decision)
    info = state["jobs"]["40"]  # type: ignore[index]
    assert info["reason"] == "STUDY_WAIT" and info["study"]["state"] == "wait"
    assert state["studies"][0]["by_rung"][0]["wait"] == 2  # type: ignore[index]
    # explain says what a trial the policy was offered weighs, and why
    trial42 = state["jobs"]["42"]["study"]  # type: ignore[index]
    assert (trial42["weight"], trial42["trials"], trial42["offered"]) == (2.0, 4, 2)
    said = explain(42, list(api.jobs.values()), state)
    assert ("weighs 2 in the policy's order: its study's 4 trial(s) over the 2 offered this "
            "epoch") in said
    assert "weighs" not in explain(40, list(api.jobs.values()), state)  # (it waits)
    # 42 and 43 report (43 ran meanwhile): cohort 4, keep 2: 41 (0.9), 43 (0.8) go on
    api.jobs[43] = replace(api.jobs[43], state="RUNNING", node_names=("node1",),
                           nodes="node1", state_reason="None", start_time=1000)
    report(tmp_path, 42, 0, 0.3, 1200.0)
    report(tmp_path, 43, 0, 0.8, 1201.0)
    api.log.clear()
    decision, changes = decide(b, {43: [(0, 1)]}, epoch=2, now=2002.0)
    snap = b.snapshot(2, 2002.0, 60.0, None)
    # 41 (held, promoted) and 43 (running) train to rung 1; 40 and 42 were stopped
    assert sorted(snap.job_ids.tolist()) == [41, 43]
    assert snap.total.tolist() == [50.0, 50.0]
    kinds = {c.job_id: c.kind for c in changes}
    # 40 waits held: cancelled at once; 42 runs and was never told: told now, it leaves
    # by itself (cancelled after the grace period, 5 s here, if it has not)
    assert (kinds[40], kinds[42], kinds[43]) == (ChangeKind.CANCEL, ChangeKind.KEEP,
                                                 ChangeKind.KEEP)
    b.apply(changes, 2002.0)
    assert ("cancel", 40) in api.log and ("cancel", 42) not in api.log
    assert [told(tmp_path, j, 0) for j in (40, 41, 42, 43)] == ["stop", "go", "stop", "go"]
    b.studies.studies[40].trials[2].told_at[0] = 2003.0 - 1.0  # (told 1 s ago)
    _, changes = decide(b, {43: [(0, 1)]}, epoch=3, now=2003.0)
    assert {c.job_id: c.kind for c in changes}[42] is ChangeKind.KEEP
    b.studies.studies[40].trials[2].told_at[0] = 2004.0 - 10.0  # (told 10 s ago)
    _, changes = decide(b, {43: [(0, 1)]}, epoch=4, now=2004.0)
    assert {c.job_id: c.kind for c in changes}[42] is ChangeKind.CANCEL
    # the book is on disk: a restarted sidecar knows the verdicts it gave
    saved = json.loads((tmp_path / "state" / STUDIES_FILE).read_text())
    assert saved["studies"][0]["trials"][0]["verdicts"] == {"0": "stop"}


def test_a_report_brings_an_epoch_forward_whatever_the_last_read_saw(tmp_path: Path) -> None:
    # Trial 0 runs; trial 1 was pending at the read (the epoch places it, or forks it: its
    # copies are a job of their own and it stays held), starts after the read and reports
    # before the next one: both are worth an early epoch. A report already read is not.
    jobs = [task(50, 0, 50, "sh", tmp_path), task(50, 1, 51, "sh", tmp_path, state="PENDING")]
    api = FakeSlurm(jobs, NODES)
    b = backend(api, studies=StudyBook(tmp_path / "state" / STUDIES_FILE, grace_s=5.0))
    _decision, changes = decide(b, {50: [(0, 1)], 51: [(1, 1)]}, epoch=0)
    b.apply(changes, 2000.0)
    assert b.reported_since_epoch() == []
    report(tmp_path, 51, 0, 0.5, 1100.0)
    assert b.reported_since_epoch() == [51]
    report(tmp_path, 50, 0, 0.7, 1101.0)
    assert b.reported_since_epoch() == [50, 51]
    decide(b, {}, epoch=1, now=2001.0)  # (the next read takes both reports in)
    assert b.reported_since_epoch() == []
