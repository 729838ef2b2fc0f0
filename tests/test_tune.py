"""``hadar-slurm tune`` (issue #17): a search-space file to a job array of trials, and the
trial launcher; on the dev cluster, the array submitted, split by the sidecar, every trial run
once with its own configuration."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.studies.trial import trial_environment
from hadar_slurm.studies.tune import draw_trials, load_tune, prepare, sbatch_argv
from tests.slurm_cluster import REPO, jobs
from tests.test_sidecar_cluster import FINAL, Workdir, check_alive
from tests.test_sidecar_cluster import work as work  # (the fixture)

SPACE = """
[study]
name = "lr-search"
model = "resnet18"
bs = 64
steps = 40000
trials = 6
rule = "sh"
seed = 3

[command]
argv = [
  "/bin/sh", "-c",
  "echo \\"$HADAR_TRIAL_INDEX $HADAR_TRIAL_CONFIG\\" > out-$HADAR_TRIAL_INDEX.txt",
]

[space]
lr = { log_uniform = [1e-4, 0.1] }
dropout = { uniform = [0.0, 0.5] }
width = { choice = [64, 128, 256] }
layers = { int_uniform = [2, 6] }
"""


def space_file(tmp_path: Path, text: str = SPACE) -> Path:
    path = tmp_path / "search.toml"
    path.write_text(text)
    return path


def test_a_study_is_read_and_its_trials_are_drawn_the_same_every_time(tmp_path: Path) -> None:
    spec = load_tune(space_file(tmp_path))
    assert (spec.name, spec.trials, spec.rule, spec.rungs, spec.eta) == ("lr-search", 6, "sh",
                                                                        4, 3)
    assert spec.comment() == ("hadar: model=resnet18 bs=64 steps=40000 study=lr-search rule=sh "
                              "rungs=4 eta=3 metric=accuracy mode=max")
    trials = draw_trials(spec.space, spec.trials, spec.seed)
    assert trials == draw_trials(spec.space, spec.trials, spec.seed)
    assert trials != draw_trials(spec.space, spec.trials, spec.seed + 1)
    for t in trials:
        assert list(t) == ["lr", "dropout", "width", "layers"]
        assert 1e-4 <= t["lr"] <= 0.1 and 0.0 <= t["dropout"] <= 0.5
        assert t["width"] in (64, 128, 256) and 2 <= t["layers"] <= 6
    assert {t["layers"] for t in draw_trials(spec.space, 200, 0)} == {2, 3, 4, 5, 6}


@pytest.mark.parametrize("edit, field", [
    (('model = "resnet18"\n', ""), "study.model"),
    (("trials = 6", "trials = 0"), "study.trials"),
    (("trials = 6", "trials = 6\ncolour = 1"), "study.colour"),
    (("rule = \"sh\"", "rule = \"fast\""), "study.rule"),
    (("rule = \"sh\"", "rungs = 11"), "study.rungs"),
    (("steps = 40000", "steps = 20"), "study.rungs"),  # the first rung: less than one step
    (("bs = 64", "bs = 65"), "study.bs"),
    (("{ choice = [64, 128, 256] }", "{ normal = [0, 1] }"), "space.width"),
    (("{ log_uniform = [1e-4, 0.1] }", "{ log_uniform = [0, 0.1] }"), "space.lr"),
    (("{ uniform = [0.0, 0.5] }", "{ uniform = [0.5, 0.0] }"), "space.dropout"),
    (("{ int_uniform = [2, 6] }", "{ int_uniform = [2.5, 6] }"), "space.layers"),
    (('"/bin/sh", "-c",', '1, "-c",'), "command.argv"),
    (("[space]", "[spaces]"), "spaces"),
])
def test_a_bad_study_file_names_the_key(tmp_path: Path, edit: tuple[str, str],
                                        field: str) -> None:
    old, new = edit
    assert old in SPACE
    with pytest.raises(InputError) as err:
        load_tune(space_file(tmp_path, SPACE.replace(old, new, 1)))
    assert err.value.field == field, err.value
    assert err.value.source == str(tmp_path / "search.toml")


def test_not_toml_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not valid TOML"):
        load_tune(space_file(tmp_path, "[study\n"))


def test_the_script_quotes_every_argument_and_runs_the_launcher(tmp_path: Path) -> None:
    text = SPACE.replace('"/bin/sh", "-c",', '"/bin/echo", "it\'s $HOME; `x`", "/bin/sh", "-c",')
    spec = load_tune(space_file(tmp_path, text))
    script = prepare(spec, tmp_path / "out", python="/usr/bin/python3")
    body = script.read_text()
    assert "#SBATCH --array=0-5\n" in body and "#SBATCH --gres=gpu:1\n" in body
    assert "#SBATCH --comment" not in body  # (the hints go on sbatch's command line)
    assert "  'it'\"'\"'s $HOME; `x`'\n" in body
    assert sbatch_argv(spec, script) == ["sbatch", "--parsable", f"--comment={spec.comment()}",
                                         str(script)]
    doc = json.loads((tmp_path / "out" / "trials.json").read_text())
    assert doc["trials"] == draw_trials(spec.space, 6, 3)
    # bash reads the script (syntax only: -n)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_the_launcher_gives_each_task_its_configuration(tmp_path: Path) -> None:
    spec = load_tune(space_file(tmp_path))
    prepare(spec, tmp_path)
    trials = str(tmp_path / "trials.json")
    env = trial_environment(trials, "4", {"PATH": "/bin"})
    assert isinstance(env, dict)
    assert json.loads(env["HADAR_TRIAL_CONFIG"]) == draw_trials(spec.space, 6, 3)[4]
    assert (env["HADAR_TRIAL_INDEX"], env["HADAR_STUDY"], env["HADAR_STUDY_MODE"]) == (
        "4", "lr-search", "max")
    assert "has no trial" in str(trial_environment(trials, "6", {}))
    assert "not an array task" in str(trial_environment(trials, None, {}))
    assert "cannot read" in str(trial_environment(str(tmp_path / "none.json"), "0", {}))
    proc = subprocess.run([sys.executable, "-m", "hadar_slurm.studies.trial", trials, "--",
                           "/bin/sh", "-c", 'echo "$HADAR_TRIAL_INDEX"'],
                          env={"SLURM_ARRAY_TASK_ID": "2", "PATH": "/bin:/usr/bin"},
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout) == (0, "2\n"), proc.stderr


@pytest.mark.slurm
def test_tune_submits_a_study_that_the_sidecar_runs_trial_by_trial(work: Workdir) -> None:
    path = space_file(work.path)
    out = work.path / "study"
    proc = subprocess.run([sys.executable, "-m", "hadar_slurm", "tune", str(path), "--out",
                           str(out), "--submit"], env=work.env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    array = int(proc.stdout.split("submitted job array ")[1].split()[0])
    work.submitted.append(array)
    out.chmod(0o777)
    sidecar = work.start_sidecar()
    end = time.monotonic() + 180
    while True:
        tasks = {j: t for j, t in jobs(work.cluster).items() if t.array_job_id == array}
        if len(tasks) == 6 and all(t.state in FINAL for t in tasks.values()):
            break
        check_alive([sidecar])
        assert time.monotonic() < end, {j: (t.state, t.array_tasks) for j, t in tasks.items()}
        time.sleep(0.5)
    assert sidecar.stop() == 0
    assert all(t.state == "COMPLETED" for t in tasks.values()), tasks
    trials = json.loads((out / "trials.json").read_text())["trials"]
    for i, config in enumerate(trials):
        index, text = (out / f"out-{i}.txt").read_text().split(" ", 1)
        assert int(index) == i and json.loads(text) == config
