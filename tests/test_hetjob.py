"""HadarE's heterogeneous sbatch script (hadar_slurm/slurm/hetjob.py and
hadar_slurm/slurm/templates/): golden files, ``bash -n``, refusal of unsafe input, and the
rendered script run by bash with a stub ``srun`` (no Slurm) to show that the quoting hands every
copy the user's argv unchanged.

Golden files live in tests/data/hetjob/.  After an intended change of the template, regenerate
them with ``HADAR_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_hetjob.py`` and review the diff.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.errors import InputError
from hadar_slurm.slurm.hetjob import MAX_COPIES, CopySpec, ForkPlan, render_hetjob
from tests.helpers import REPO

GOLDEN = REPO / "tests" / "data" / "hetjob"
UPDATE = bool(os.environ.get("HADAR_UPDATE_GOLDEN"))

# Arguments a user's command may carry; the golden file shows each shell-quoted.
HOSTILE_ARGS = (
    "$(rm -rf /)", "'; echo pwned", "`id`", "a b  c", 'double "quoted"', "it's", "back\\slash",
    "new\nline", "ünïcødé ☃", "", "--flag=$HOME", "*", "~", "!!", "$((1+1))", "\ttab", "-n",
    ";|&<>", "#not-a-comment",
)

THREE = ForkPlan(
    original_job_id=1234, job_name="resnet50-fork", command=("python3", "train.py", "--bs", "64"),
    copies=(CopySpec("node1", "v100", 2), CopySpec("node2", "p100", 4),
            CopySpec("node4", "a100", 8)),
    workdir="/shared/hadar/work", tracker_dir="/shared/hadar/tracker/1234",
    output="fork-%j.out", env={"OMP_NUM_THREADS": "4"}, error="fork-%j.err",
)
ONE = ForkPlan(
    original_job_id=7, job_name="lm", command=("./train.sh",),
    copies=(CopySpec("node3", "k80", 1),), workdir="/home/alice", tracker_dir="/home/alice/t",
)
HOSTILE = ForkPlan(
    original_job_id=99, job_name="hostile", command=("printf", "%s\\n", *HOSTILE_ARGS),
    copies=(CopySpec("node1", "v100", 1), CopySpec("node2", "p100", 1)),
    workdir="/tmp", tracker_dir="/tmp/tracker dir/$(touch pwned)/'x'",
    env={"NOTE": "it's $(not) `run`\n", "EMPTY": ""},
)
PLANS = {"three_copies": THREE, "one_copy": ONE, "hostile_input": HOSTILE}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_golden(name: str) -> None:
    text = render_hetjob(PLANS[name])
    path = GOLDEN / f"{name}.sbatch"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing {path}: run with HADAR_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path} differs from the rendered script; if the change is intended, rerun with "
        "HADAR_UPDATE_GOLDEN=1 and review the diff")


@pytest.mark.parametrize("name", sorted(PLANS))
def test_bash_syntax(name: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render_hetjob(PLANS[name]), encoding="utf-8")
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stderr


def sbatch_components(text: str) -> list[dict[str, str]]:
    """The ``#SBATCH`` options of a script as sbatch reads them (up to the first command),
    one dict per heterogeneous job component."""
    comps: list[dict[str, str]] = [{}]
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in lines[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            continue
        words = line.split()
        assert len(words) == 2, f"one option per #SBATCH line: {line!r}"
        if words[1] == "hetjob":
            comps.append({})
            continue
        key, _, value = words[1].partition("=")
        assert key not in comps[-1], line
        comps[-1][key] = value
    return comps


def test_sbatch_options_per_component() -> None:
    comps = sbatch_components(render_hetjob(THREE))
    assert len(comps) == 3
    for copy, comp in zip(THREE.copies, comps, strict=True):
        assert comp == {
            "--job-name": "resnet50-fork", "--nodes": "1", "--nodelist": copy.node,
            "--ntasks": "1", "--gres": f"gpu:{copy.gpus}", "--constraint": copy.gpu_type,
            "--chdir": "/shared/hadar/work", "--output": "fork-%j.out",
            "--error": "fork-%j.err", "--comment": "hadar-copy-of=1234",
        }
    one = sbatch_components(render_hetjob(ONE))
    assert len(one) == 1 and "--output" not in one[0] and "--error" not in one[0]


def test_body_launches_one_step_per_copy() -> None:
    text = render_hetjob(THREE)
    assert "export HADAR_ORIGINAL_JOB_ID=1234\n" in text
    assert "export HADAR_COPIES=3\n" in text
    assert "export HADAR_TRACKER_DIR=/shared/hadar/tracker/1234\n" in text
    steps = re.findall(r"HADAR_COPY_INDEX=(\d) HADAR_COPY_GPU_TYPE=(\w+) \\\n"
                       r"  srun --het-group=(\d) --nodes=1 --ntasks=1 -- ", text)
    assert steps == [("0", "v100", "0"), ("1", "p100", "1"), ("2", "a100", "2")]
    assert text.count(" &\n") == 3 and text.rstrip().endswith('exit "$_hadar_status"')
    # One copy is a plain job: Slurm 22.05's srun refuses --het-group outside a hetjob.
    one = render_hetjob(ONE)
    assert "--het-group=" not in one and "#SBATCH hetjob" not in one
    assert "srun --nodes=1 --ntasks=1 -- " in one


def test_plan_normalizes_and_is_read_only() -> None:
    env = {"B": "2"}
    plan = ForkPlan(1, "j", ["a", "b"], [CopySpec("n1", "v100", 1)],  # type: ignore[arg-type]
                    "/w", "/t", env=env)
    env["C"] = "3"
    assert plan.command == ("a", "b") and isinstance(plan.copies, tuple)
    assert dict(plan.env) == {"B": "2"}
    with pytest.raises(TypeError):
        plan.env["D"] = "4"  # type: ignore[index]
    assert plan == replace(plan) and hash(plan) == hash(replace(plan))


def refused(field: str, **changes: Any) -> InputError:
    with pytest.raises(InputError) as exc:
        replace(THREE, **changes)
    assert exc.value.field == field, exc.value
    return exc.value


def test_refuses_unsafe_sbatch_values() -> None:
    err = refused("job_name", job_name="train\n#SBATCH --nodelist=node3")
    assert "newline" in str(err) and "job_name" in str(err)
    refused("job_name", job_name="two words")
    refused("job_name", job_name="a#b")
    refused("job_name", job_name="quote'd")
    refused("job_name", job_name="")
    refused("job_name", job_name="ünï")
    refused("output", output="out put.txt")
    refused("output", output="x\ny")
    refused("error", error='"e"')
    refused("workdir", workdir="/has space")
    refused("workdir", workdir="relative/dir")
    refused("tracker_dir", tracker_dir="relative")


def test_refuses_bad_copies() -> None:
    with pytest.raises(InputError) as exc:
        CopySpec("node1\n#SBATCH --exclusive", "v100", 1)
    assert exc.value.field == "node" and "node" in str(exc.value)
    for node in ("", "node 1", "node1;x", "node1/2"):
        with pytest.raises(InputError, match="field 'node'"):
            CopySpec(node, "v100", 1)
    with pytest.raises(InputError, match="field 'gpu_type'"):
        CopySpec("node1", "v100\n", 1)
    for gpus in (0, -1, True, 1.5):
        with pytest.raises(InputError, match="field 'gpus'"):
            CopySpec("node1", "v100", gpus)  # type: ignore[arg-type]
    refused("copies", copies=())
    many = tuple(CopySpec(f"n{k}", "v100", 1) for k in range(MAX_COPIES + 1))
    refused("copies", copies=many)
    assert len(replace(THREE, copies=many[:MAX_COPIES]).copies) == MAX_COPIES
    err = refused("copies", copies=(CopySpec("node1", "v100", 1), CopySpec("node1", "v100", 2)))
    assert "different nodes" in str(err)


def test_refuses_bad_command_env_and_id() -> None:
    refused("command", command=())
    refused("command[0]", command=("",))
    refused("command[1]", command=("echo", "nul\0byte"))
    refused("env", env={"1BAD": "x"})
    refused("env", env={"A-B": "x"})
    refused("env", env={"HADAR_COPY_INDEX": "5"})
    refused("env[X]", env={"X": "a\0b"})
    refused("original_job_id", original_job_id=0)
    refused("original_job_id", original_job_id=True)


def test_template_refuses_what_slipped_past_the_plan() -> None:
    # Defence in depth: the template's own `sbatch` filter checks #SBATCH values again.
    plan = replace(THREE)
    object.__setattr__(plan, "job_name", "x\n#SBATCH --nodelist=node3")
    with pytest.raises(InputError, match="field 'job_name'"):
        render_hetjob(plan)
    with pytest.raises(TypeError):
        render_hetjob("not a plan")  # type: ignore[arg-type]


def test_template_ships_with_the_package() -> None:
    assert (REPO / "hadar_slurm" / "slurm" / "templates" / "hetjob.sbatch.j2").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "templates/*.j2" in data["tool"]["setuptools"]["package-data"]["hadar_slurm"]


# ------------------------------------------------------------------ running it with a stub srun

STUB_SRUN = """\
#!/bin/bash
# Stub srun: record the options and the copy's environment, then run the command (after --).
opts=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
shift
out="$STUB_OUT/copy$HADAR_COPY_INDEX"
printf '%s\\n' "${opts[*]}" "$HADAR_COPY_GPU_TYPE" "$HADAR_COPIES" "$HADAR_ORIGINAL_JOB_ID" \\
  "$HADAR_TRACKER_DIR" > "$out.meta"
printf '%s' "$NOTE" > "$out.note"
exec "$@" > "$out.stdout"
"""


def run_with_stub(plan: ForkPlan, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(STUB_SRUN)
    srun.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(render_hetjob(plan), encoding="utf-8")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
           "STUB_OUT": str(out), "LC_ALL": "C.UTF-8", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60, check=False)
    return proc, out


def test_quoting_is_safe_when_run(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    args = (*HOSTILE_ARGS, f"$(touch {canary})", f"'; touch {canary}; echo '",
            f"`touch {canary}`", f'"; touch {canary}; "')
    tracker = tmp_path / "tracker dir" / f"$(touch {canary})" / "'x'"
    plan = replace(
        HOSTILE, command=("printf", "%s\\n", *args), workdir=str(tmp_path),
        tracker_dir=str(tracker),
        copies=(CopySpec("node1", "v100", 1), CopySpec("node2", "p100", 2),
                CopySpec("node4", "a100", 8)))
    proc, out = run_with_stub(plan, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not canary.exists() and not (tmp_path / "pwned").exists()
    assert tracker.is_dir()  # created by the script, under its exact name
    expected = "".join(a + "\n" for a in args)
    for index, copy in enumerate(plan.copies):
        assert (out / f"copy{index}.stdout").read_text(encoding="utf-8") == expected
        meta = (out / f"copy{index}.meta").read_text().splitlines()
        assert meta == [f"--het-group={index} --nodes=1 --ntasks=1", copy.gpu_type, "3", "99",
                        str(tracker)]
        assert (out / f"copy{index}.note").read_text() == "it's $(not) `run`\n"


def test_exit_status_is_the_first_failed_copy(tmp_path: Path) -> None:
    # Copy 2 fails first (in time), copy 1 later: the script exits with copy 1's status.
    script = 'case "$HADAR_COPY_INDEX" in 1) sleep 0.3; exit 7;; 2) exit 9;; esac'
    plan = replace(THREE, command=("bash", "-c", script), workdir=str(tmp_path),
                   tracker_dir=str(tmp_path / "t"))
    proc, _ = run_with_stub(plan, tmp_path)
    assert proc.returncode == 7, proc.stderr


def test_exit_status_zero_when_all_succeed(tmp_path: Path) -> None:
    plan = replace(ONE, command=("true",), workdir=str(tmp_path), tracker_dir=str(tmp_path / "t"))
    proc, out = run_with_stub(plan, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (out / "copy0.meta").read_text().splitlines()[:3] == ["--nodes=1 --ntasks=1", "k80",
                                                                  "1"]


def test_partition_and_time_limit_go_to_every_component() -> None:
    text = render_hetjob(replace(THREE, partition="gpu", time_limit_min=90))
    comps = sbatch_components(text)
    assert [c.get("--partition") for c in comps] == ["gpu"] * 3
    assert [c.get("--time") for c in comps] == ["90"] * 3
    assert "--partition" not in render_hetjob(THREE) and "--time" not in render_hetjob(THREE)
    with pytest.raises(InputError, match="field 'partition'"):
        replace(THREE, partition="gpu debug")
    with pytest.raises(InputError, match="field 'time_limit_min'"):
        replace(THREE, time_limit_min=0)


def test_account_qos_memory_and_cpus_go_to_every_component() -> None:
    """A copy is charged and sized as the job was: its account, QOS, memory and CPUs per task."""
    plan = replace(THREE, account="proj-7", qos="normal", mem_per_node_mb=16000, cpus_per_task=6)
    comps = sbatch_components(render_hetjob(plan))
    for comp in comps:
        assert (comp["--account"], comp["--qos"], comp["--mem"], comp["--cpus-per-task"]) == (
            "proj-7", "normal", "16000M", "6")
        assert "--mem-per-cpu" not in comp
    per_cpu = sbatch_components(render_hetjob(replace(THREE, mem_per_cpu_mb=512)))
    assert [c.get("--mem-per-cpu") for c in per_cpu] == ["512M"] * 3
    assert all("--mem" not in c for c in per_cpu)
    plain = sbatch_components(render_hetjob(THREE))[0]
    assert not {"--account", "--qos", "--mem", "--mem-per-cpu", "--cpus-per-task"} & set(plain)
    err = refused("account", account="a b")
    assert "account" in str(err) and "use letters, digits" in str(err)
    refused("qos", qos="high\n#SBATCH --exclusive")
    refused("mem_per_node_mb", mem_per_node_mb=0)
    refused("cpus_per_task", cpus_per_task=-2)
    refused("mem_per_cpu_mb", mem_per_node_mb=1000, mem_per_cpu_mb=100)
