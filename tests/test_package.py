"""The package as users get it.

``python -m build`` (isolated: pyproject.toml's build requirements from PyPI; the wheel is built
from the sdist, so a missing file in the sdist breaks the wheel) on a copy of this checkout's
files; the wheel holds the compiled core, the templates and the Gavel data; it is installed into
a fresh virtual environment with its declared dependencies only (from PyPI) and run from a
directory outside the source tree.  And every subcommand's ``--help`` exits 0 and describes each
of its options (the argparse tree is walked, so new subcommands are covered as they come).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hadar_slurm import __version__
from hadar_slurm.cli.main import build_parser, main

REPO = Path(__file__).resolve().parent.parent
SIM_ARGS = ["simulate", "--trace", "static_32_seed0", "--cluster", "4:4:4", "--policy", "hadar"]
# what varies from run to run in a simulate row (wall-clock timings of the policy)
TIMINGS = {"decision_ms_median", "decision_ms_max"}


def _tracked_files() -> list[str]:
    """This checkout's files as a fresh clone plus the work in progress would have them."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, check=True)
    return sorted(p for p in out.stdout.decode().split("\0") if p and (REPO / p).is_file())


def _clean_env() -> dict[str, str]:
    """The environment without this checkout's virtualenv or import paths."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p != venv_bin)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@dataclass(frozen=True)
class Dist:
    source: Path  # the copy the sdist was made from
    files: list[str]  # its files, relative
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    top = tmp_path_factory.mktemp("dist")
    source = top / "src"
    files = _tracked_files()
    for rel in files:
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, source / rel)
    out = top / "out"
    build = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                           capture_output=True, text=True, timeout=1500, check=False,
                           env=_clean_env())
    assert build.returncode == 0, f"python -m build failed:\n{build.stdout[-4000:]}\n" \
                                  f"{build.stderr[-4000:]}"
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(out.iterdir())
    return Dist(source, files, sdists[0], wheels[0])


@pytest.fixture(scope="module")
def installed(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a fresh virtual environment with the wheel and its declared dependencies."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300,
                   env=_clean_env())
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          str(dist.wheel)], capture_output=True, text=True, timeout=1500,
                         check=False, env=_clean_env())
    assert pip.returncode == 0, f"pip install of the wheel failed:\n{pip.stderr[-4000:]}"
    return venv / "bin"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """An empty working directory away from the source tree."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return cwd


def _run(bin_dir: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=cwd, env=_clean_env(),
                          capture_output=True, text=True, timeout=300, check=False)


# ------------------------------------------------------------------ what the artefacts hold
def test_wheel_holds_the_compiled_core_templates_and_data(dist: Dist) -> None:
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    cores = [n for n in names if re.fullmatch(r"hadar_slurm/_hadar_core\.cpython-.*\.so", n)]
    assert len(cores) == 1, sorted(names)
    want = {f for f in dist.files if f.startswith("hadar_slurm/")
            and (f.endswith(".py") or f.startswith(("hadar_slurm/slurm/templates/",
                                                    "hadar_slurm/data/")))}
    assert {"hadar_slurm/slurm/templates/hetjob.sbatch.j2",
            "hadar_slurm/data/gavel/simulation_throughputs.json",
            "hadar_slurm/data/gavel/traces/static_32_seed0.trace"} <= want
    assert want - names == set()
    assert {"hadar_slurm/py.typed", "hadar_slurm/_hadar_core.pyi"} <= names
    assert not [n for n in names if n.endswith((".pyx", ".c", ".pyc")) or n.startswith("tests/")]

    info = f"hadar_slurm-{__version__}.dist-info"
    with zipfile.ZipFile(dist.wheel) as wheel:
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        metadata = wheel.read(f"{info}/METADATA").decode()
    assert re.search(r"^hadar-slurm = hadar_slurm\.cli\.main:main$", entry_points, re.M)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    requires = re.findall(r"^Requires-Dist: ([^;\n]+)$", metadata, re.M)
    assert set(declared) <= {r.strip() for r in requires}
    assert f"\nVersion: {__version__}\n" in metadata


def test_sdist_holds_the_sources_to_build_it(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as tar:
        top = f"hadar_slurm-{__version__}/"
        names = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
    want = {f for f in dist.files if f.startswith(("cython_core/", "hadar_slurm/", "slurm_conf/",
                                                   "docker/"))}
    want |= {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "docker-compose.yml"}
    assert "cython_core/hadar_core.pyx" in want
    assert "hadar_slurm/slurm/templates/hetjob.sbatch.j2" in want
    assert want - names == set()
    assert not [n for n in names if n.endswith((".so", ".pyc")) or n.startswith("tests/")]


# ------------------------------------------------------------------ the installed wheel
def test_installed_version_and_module_come_from_the_wheel(installed: Path, elsewhere: Path) -> None:
    for argv in (["hadar-slurm", "--version"], ["python", "-m", "hadar_slurm", "--version"]):
        out = _run(installed, argv, elsewhere)
        assert (out.returncode, out.stdout.strip()) == (0, f"hadar-slurm {__version__}"), out
    where = _run(installed, ["python", "-c", "import hadar_slurm, hadar_slurm._hadar_core as c; "
                             "print(hadar_slurm.__file__); print(c.__file__)"], elsewhere)
    assert where.returncode == 0, where.stderr
    package, core = where.stdout.split()
    venv = str(installed.parent)
    assert package.startswith(venv) and core.startswith(venv) and core.endswith(".so")


def test_installed_simulate_matches_the_source_tree(
        installed: Path, elsewhere: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(installed, ["hadar-slurm", *SIM_ARGS, "--json", "rows.json"], elsewhere)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^hadar .* 32/32$", out.stdout, re.M), out.stdout
    rows = json.loads((elsewhere / "rows.json").read_text())
    assert [r["policy"] for r in rows] == ["hadar"]
    row = rows[0]
    assert row["num_jobs"] == row["num_completed"] == 32 and row["epochs"] > 0
    assert 0 < row["avg_jct_s"] <= row["p95_jct_s"] <= row["makespan_s"]
    assert 0 < row["utilization"] <= 1

    # the same run in this process, from the source tree (editable install)
    assert main([*SIM_ARGS, "--json", str(tmp_path / "here.json")]) == 0
    capsys.readouterr()
    here = json.loads((tmp_path / "here.json").read_text())[0]
    assert {k: v for k, v in row.items() if k not in TIMINGS} == \
        {k: v for k, v in here.items() if k not in TIMINGS}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), line: str | None = None
          ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """(subcommand path, its parser, its one-line help in the parent's list), depth first."""
    yield path, parser, line
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name), helps.get(name))


def _subcommands() -> list[tuple[str, ...]]:
    return [path for path, _, _ in _walk(build_parser())]


# Runs in the fresh environment: every path's --help through the installed main(), in one
# process (a process per subcommand costs a second each, mostly imports).
HELP_ALL = """
import contextlib, io, json, sys
from hadar_slurm.cli.main import main
out = {}
for path in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main([*path, "--help"])
            code = None
        except SystemExit as exc:
            code = exc.code
    out[" ".join(path)] = [code, buf.getvalue()]
print(json.dumps(out))
"""


def test_installed_help_of_every_subcommand(installed: Path, elsewhere: Path) -> None:
    top = _run(installed, ["hadar-slurm", "--help"], elsewhere)
    assert top.returncode == 0 and top.stdout.startswith("usage: hadar-slurm"), top
    paths = _subcommands()
    assert len(paths) > 5 and "simulate" in top.stdout and "run" in top.stdout
    out = _run(installed, ["python", "-c", HELP_ALL, json.dumps(paths)], elsewhere)
    assert out.returncode == 0, out.stderr
    for path, (code, text) in json.loads(out.stdout).items():
        assert code == 0, (path, text)
        assert text.startswith(f"usage: hadar-slurm {path}".rstrip()), text


# ------------------------------------------------------------------ --help (no build needed)
def test_every_subcommand_help_describes_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    walked = list(_walk(build_parser()))
    assert {("simulate",), ("run",), ("status",), ("explain",)} <= {p for p, _, _ in walked}
    for path, parser, line in walked:
        if path:
            assert line and line.strip(), f"hadar-slurm {' '.join(path)}: no help line"
        with pytest.raises(SystemExit) as exc:
            main([*path, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(" ".join(("usage: hadar-slurm", *path))), text
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            name = "/".join(action.option_strings) or action.dest
            if isinstance(action, argparse._SubParsersAction):
                for choice in action.choices:
                    assert choice in text, (path, choice)
                continue
            assert action.help and action.help.strip(), \
                f"hadar-slurm {' '.join(path)} {name}: no help text"
            for option in action.option_strings:
                assert option in text, (path, option)
