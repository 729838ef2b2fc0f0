"""The guides (docs/*.md) say only what the code does.

* The configuration reference in docs/admins.md is the one generated from the config schema
  (``python -m hadar_slurm.cli.docs_gen --write`` regenerates it).
* Every shell command in a fenced ``sh``/``shell``/``bash``/``console`` block of docs/*.md is in
  :data:`REGISTRY`, which says where it is run: :class:`Here` (run by this test without a
  cluster, in doc order, with ``/etc``, ``/var/lib/hadar-slurm``, ``/var/log/hadar-slurm`` moved
  into a temp dir), :class:`OnCluster` (run by this test on the real Slurm dev cluster, with the
  site plugin), :class:`RunBy` (a Makefile target that runs it), or :class:`NotRun` (changes a
  real host; the reason is given, and there may be only a few).  A command in a guide that is not
  in the registry fails the test, and so does a registry entry no guide has any more.
* Every row of users.md's error table is run: ``hadar-slurm hints check`` must print exactly the
  message, and ``sbatch`` on the dev cluster must refuse the job with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import hadar_slurm.cli.main as cli
from hadar_slurm.cli import docs_gen
from hadar_slurm.hints import LUA_BEGIN
from hadar_slurm.policy.base import Reason
from hadar_slurm.sidecar.config import CONFIG_SCHEMA, ConfigKey
from tests.slurm_cluster import DevCluster

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
GUIDES = ("users.md", "admins.md", "architecture.md")
SHELL_LANGS = {"sh", "shell", "bash", "console"}
#: Absolute paths of a real host that the commands are run under a temp root instead.
ROOTED = ("/etc/", "/var/lib/hadar-slurm", "/var/log/hadar-slurm")
JOBID = "JOBID"  # the guides' placeholder for a job id


# -- where each command is run ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Here:
    """Run by :func:`test_commands_run_here`: exit status in ``rc``, ``out`` in stdout+stderr,
    ``creates`` (a path, rooted like the command's) exists afterwards."""

    rc: tuple[int, ...] = (0,)
    out: str = ""
    creates: str = ""


@dataclasses.dataclass(frozen=True)
class OnCluster:
    """Run by :func:`test_commands_run_on_the_dev_cluster` (``{JOBID}`` in ``out``: the id of the
    job the guide submitted last)."""

    rc: tuple[int, ...] = (0,)
    out: str = ""


@dataclasses.dataclass(frozen=True)
class RunBy:
    """Run by a Makefile target: ``text`` must be in ``where``."""

    where: str
    text: str


@dataclasses.dataclass(frozen=True)
class NotRun:
    """Changes a real host (users, systemd, the system's Python): not run by any test."""

    reason: str


Where = Here | OnCluster | RunBy | NotRun

CONFIG = "/etc/hadar-slurm/hadar-slurm.toml"
DB = "/var/lib/hadar-slurm/throughputs.db"
SUBMITTED = OnCluster(out="Submitted batch job")
REGISTRY: dict[str, Where] = {
    # users.md
    "sbatch --comment=hadar: model=resnet50 bs=64 steps=40000 --gres=gpu:2 train.sh": SUBMITTED,
    "sbatch --comment=hadar: model=lm bs=20 steps=100_000 weight=2 --gpus=4 train.sh": SUBMITTED,
    "sbatch --comment=hadar: model=a3c steps=12000 sync=false train.sh": SUBMITTED,
    "sbatch --comment=hadar: model=resnet50 bs=64 steps=40000 fork=3 --gres=gpu:1 train.sh "
    "40000": SUBMITTED,
    'hadar-slurm hints check hadar: model=resnet50 bs=64 steps=40000 --gpus 2': Here(
        out="hadar: model=resnet50 bs=64 steps=40000 sync=true weight=1  "
        "job_type='ResNet-50 (batch size 64)'"),
    "hadar-slurm hints check hadar: model=resnet50 bs=64 steps=40000 --json": Here(
        out='"job_type": "ResNet-50 (batch size 64)"'),
    f"hadar-slurm status --config {CONFIG}": OnCluster(out="(dry run: nothing was changed)"),
    f"hadar-slurm explain JOBID --config {CONFIG}": OnCluster(
        out="job {JOBID} (train.sh, user root): PENDING"),
    "squeue --me -o %i %j %T %r %b %f %N": OnCluster(out="{JOBID} train.sh PENDING"),
    "scontrol show job JOBID | grep AdminComment": OnCluster(
        out="AdminComment=hadar: waits for the sidecar"),
    "squeue -o %i %j %T %k %E": OnCluster(out="{JOBID} train.sh PENDING hadar: model=resnet50"),
    # admins.md
    "make dist": NotRun("builds the sdist and wheel with PyPI's build requirements and compiles "
                        "the core: minutes, and it replaces dist/"),
    "pip install dist/hadar_slurm-*.whl": NotRun("installs into the host's Python"),
    "hadar-slurm --version": Here(out="hadar-slurm "),
    "install -m 0644 slurm_conf/job_submit.lua /etc/slurm/job_submit.lua": Here(
        creates="/etc/slurm/job_submit.lua"),
    "scontrol show config | grep JobSubmitPlugins": OnCluster(out="lua"),
    "scontrol show config | grep RequeueExitHold": OnCluster(out="75"),
    "scontrol show config | grep -E SchedulerType|SchedulerParameters": OnCluster(
        out="bf_interval=1"),
    "hadar-slurm hints lua": Here(out=LUA_BEGIN),
    "useradd --system --no-create-home --shell /usr/sbin/nologin hadar": NotRun(
        "adds a system user to the host"),
    f"install -D -m 0644 slurm_conf/hadar-slurm.toml {CONFIG}": Here(creates=CONFIG),
    "install -m 0644 slurm_conf/hadar-slurm.service /etc/systemd/system/": Here(
        creates="/etc/systemd/system/hadar-slurm.service"),
    "systemctl daemon-reload": NotRun("needs systemd as the host's init"),
    "systemctl enable --now hadar-slurm": NotRun("needs systemd and the wheel installed in "
                                                 "/usr/local/bin"),
    "systemctl restart hadar-slurm": NotRun("needs systemd and a running service"),
    f"hadar-slurm run --config {CONFIG} --dry-run --once": OnCluster(out='"event": "epoch"'),
    f"hadar-slurm run --config {CONFIG} --dry-run --once --state-dir "
    "/var/lib/hadar-slurm/upgrade-check": OnCluster(out='"event": "epoch"'),
    "python -m hadar_slurm.cli.docs_gen --write": Here(out="docs/admins.md: config reference"),
    "python -m hadar_slurm.cli.docs_gen --check": Here(out="the config reference is up to date"),
    "journalctl -u hadar-slurm -o cat > sidecar.log": NotRun(
        "needs the host's journal; the dev-cluster test saves the dry run's stderr (what the "
        "journal holds, one JSON line per event) as sidecar.log instead"),
    "hadar-slurm report --log sidecar.log --since 24h --out report.html": OnCluster(
        out="report: report.html (1 epoch"),
    f"hadar-slurm throughputs import slurm_conf/dev-throughputs.csv --config {CONFIG}": Here(
        out="entries written from slurm_conf/dev-throughputs.csv to", creates=DB),
    f"hadar-slurm throughputs list --config {CONFIG} --source imported": Here(
        out="ResNet-50 (batch size 64)     1  a100"),
    "hadar-slurm throughputs export /etc/hadar-slurm/throughputs.csv --config "
    f"{CONFIG} --format csv":
        Here(out="entries written to", creates="/etc/hadar-slurm/throughputs.csv"),
    f"hadar-slurm throughputs recover --config {CONFIG}": Here(out="is sound: nothing to do"),
    "hadar-slurm gpus": Here(rc=(0, 3)),  # 3: no NVML (no NVIDIA driver), as here
    "hadar-slurm gres-conf --node node1": Here(rc=(0, 3)),
    "hadar-slurm profile --model digits --batch-size 32 --iters 20 --no-record": Here(
        out="not recorded (--no-record)"),
    "make demo": RunBy("Makefile", "\ndemo: venv\n\t$(BIN)/hadar-slurm simulate"),
    "make cluster-demo": RunBy("Makefile",
                               "\ncluster-demo: venv\n\tbash slurm_conf/cluster-demo.sh"),
    # architecture.md
    "hadar-slurm simulate --trace static_32_seed0 --cluster 4:4:4 --policy hadar,fifo": Here(
        out="32/32"),
}
MAX_NOT_RUN = 8


# -- reading the guides -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Command:
    doc: str
    line: int
    argv: tuple[str, ...]

    @property
    def key(self) -> str:
        return " ".join(self.argv)


_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


def shell_commands(doc: str) -> list[Command]:
    """The commands of the shell blocks of ``doc``: ``$ `` prompts dropped, ``\\`` continuations
    joined, comments and blank lines skipped, split as the shell would (no expansion)."""
    out: list[Command] = []
    fence: str | None = None
    lang = ""
    pending, start = "", 0
    for n, line in enumerate((DOCS / doc).read_text().splitlines(), start=1):
        m = _FENCE.match(line.strip())
        if fence is None:
            if m:
                fence, lang = m.group(1), m.group(2).lower()
            continue
        if line.strip().startswith(fence):
            fence = None
            continue
        if lang not in SHELL_LANGS:
            continue
        text = line.strip()
        if not pending:
            start = n
            text = text.removeprefix("$ ")
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        argv = shlex.split(pending + text, comments=True)
        pending = ""
        if argv:
            out.append(Command(doc, start, tuple(argv)))
    assert fence is None, f"{doc}: a code block is not closed"
    return out


def all_commands() -> list[Command]:
    return [c for doc in GUIDES for c in shell_commands(doc)]


# -- running them -----------------------------------------------------------------------------

def rooted(token: str, root: Path) -> str:
    return str(root) + token if token.startswith(ROOTED) else token


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_here(argv: Sequence[str], cwd: Path, capsys: pytest.CaptureFixture[str],
             env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run one command: ``hadar-slurm``/``python -m hadar_slurm.cli.docs_gen`` in this process
    (their ``main``), anything else as a subprocess (argv, no shell); pipes ``A | B`` as two
    processes.  Returns the exit status of the last one and stdout+stderr."""
    if "|" in argv:
        k = list(argv).index("|")
        first = subprocess.run(list(argv[:k]), cwd=cwd, env=env, capture_output=True,
                               text=True, timeout=60, check=False)
        second = subprocess.run(list(argv[k + 1:]), input=first.stdout, cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        return second.returncode, second.stdout + second.stderr + first.stderr
    in_process = {"hadar-slurm": cli.main, "python -m hadar_slurm.cli.docs_gen": docs_gen.main}
    for prefix, main in in_process.items():
        words = prefix.split()
        if list(argv[:len(words)]) == words:
            capsys.readouterr()
            with _cwd(cwd):
                try:
                    rc = main(list(argv[len(words):]))
                except SystemExit as exc:  # argparse: --version, --help, usage errors
                    rc = exc.code if isinstance(exc.code, int) else 1
            got = capsys.readouterr()
            return rc, got.out + got.err
    proc = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _check(cmd: Command, want: Here | OnCluster, rc: int, out: str, jobid: str = "") -> None:
    where = f"{cmd.doc}:{cmd.line}: {cmd.key}"
    assert rc in want.rc, f"{where}: exit status {rc}, wanted {want.rc}\n{out[-3000:]}"
    expected = want.out.replace("{JOBID}", jobid)
    squeezed = " ".join(out.split())
    assert " ".join(expected.split()) in squeezed, f"{where}: no {expected!r} in:\n{out[-3000:]}"


# -- the config reference ---------------------------------------------------------------------

def test_config_reference_in_sync() -> None:
    text = (DOCS / "admins.md").read_text()
    diff = docs_gen.check(text, "docs/admins.md")
    assert not diff, ("docs/admins.md's config reference differs from the schema; run "
                      "`python -m hadar_slurm.cli.docs_gen --write`:\n" + "\n".join(diff))


def test_config_reference_has_every_key_and_picks_up_new_ones() -> None:
    block = docs_gen.config_reference()
    for key in CONFIG_SCHEMA:
        section = block.index(f"#### `[{key.section}]`")
        row = block.index(f"| `{key.key}` | {key.type_name} |", section)
        assert block.find("####", section + 1, row) == -1, f"{key.name} not in its section"
    new = ConfigKey("scheduler", "throughput_db", "path", '""', "The store | its <path>.")
    extra = ConfigKey("brandnew", "knob", "bool", "false", "A section the docs never saw.")
    block = docs_gen.config_reference((*CONFIG_SCHEMA, new, extra))
    assert '| `throughput_db` | path | `""` | The store \\| its &lt;path>. |' in block
    assert block.index("#### `[scheduler]`") < block.index("`throughput_db`") < block.index(
        "#### `[hadare]`")
    assert block.index("#### `[brandnew]`") > block.index("#### `[metrics]`")


def test_stale_reference_is_found_and_rewritten(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "admins.md"
    text = (DOCS / "admins.md").read_text()
    doc.write_text(text.replace("| `epoch_seconds` |", "| `epoch_secs` |"))
    assert docs_gen.main(["--check", "--doc", str(doc)]) == 1
    err = capsys.readouterr().err
    assert "run `python -m hadar_slurm.cli.docs_gen --write`" in err
    assert docs_gen.main(["--write", "--doc", str(doc)]) == 0
    assert doc.read_text() == text
    doc.write_text("# no markers\n")
    assert docs_gen.main(["--write", "--doc", str(doc)]) == 2
    assert "no single config reference block" in capsys.readouterr().err


# -- every command is run somewhere -----------------------------------------------------------

def test_every_command_in_the_guides_is_registered() -> None:
    commands = all_commands()
    unknown = [f"{c.doc}:{c.line}: {c.key}" for c in commands if c.key not in REGISTRY]
    assert not unknown, ("commands in the guides that nothing runs (add each to "
                         "tests/test_docs.py's REGISTRY, and run it):\n" + "\n".join(unknown))
    stale = sorted(set(REGISTRY) - {c.key for c in commands})
    assert not stale, "REGISTRY entries no guide has: " + "; ".join(stale)
    not_run = [k for k, w in REGISTRY.items() if isinstance(w, NotRun)]
    assert len(not_run) <= MAX_NOT_RUN, f"too many commands not run: {not_run}"
    assert all(isinstance(w, NotRun) and w.reason for k, w in REGISTRY.items() if k in not_run)


def test_commands_run_by_make_targets_are_there() -> None:
    for key, where in REGISTRY.items():
        if isinstance(where, RunBy):
            assert key.startswith("make ")
            text = (REPO / where.where).read_text()
            assert where.text in text, f"{key}: {where.where} has no {where.text!r}"


@pytest.mark.parametrize("doc", GUIDES)
def test_commands_run_here(doc: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    for d in ("etc/slurm", "etc/systemd/system"):
        (root / d).mkdir(parents=True)
    # docs_gen --write/--check work on a copy of the guide, not on the source tree
    copy = tmp_path / "docs" / "admins.md"
    copy.parent.mkdir()
    shutil.copy(DOCS / "admins.md", copy)
    monkeypatch.setattr(docs_gen, "_default_doc", lambda: Path("docs/admins.md"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    ran = 0
    for cmd in shell_commands(doc):
        want = REGISTRY.get(cmd.key)
        if not isinstance(want, Here):
            continue
        argv = [rooted(t, root) for t in cmd.argv]
        cwd = tmp_path if cmd.key.startswith("python -m hadar_slurm.cli.docs_gen") else REPO
        rc, out = run_here(argv, cwd, capsys)
        _check(cmd, want, rc, out)
        if want.creates:
            assert Path(rooted(want.creates, root)).exists(), f"{cmd.key}: no {want.creates}"
        if want.creates == CONFIG:  # the installed config's state_dir, moved like /var/lib
            path = Path(rooted(CONFIG, root))
            path.write_text(path.read_text().replace('"/var/lib/hadar-slurm"',
                                                     f'"{root}/var/lib/hadar-slurm"'))
        ran += 1
    assert copy.read_text() == (DOCS / "admins.md").read_text()
    assert ran == sum(isinstance(REGISTRY.get(c.key), Here) for c in shell_commands(doc))


# -- users.md's tables ------------------------------------------------------------------------

_ERROR_ROW = re.compile(r"^\| `([^`]*)` \| (\d+) \| `([^`]*)` \| [^|]+ \|$", re.MULTILINE)


def error_rows() -> list[tuple[str, int, str]]:
    text = (DOCS / "users.md").read_text()
    rows = [(c, int(g), m) for c, g, m in _ERROR_ROW.findall(text)]
    assert len(rows) >= 17, f"users.md's error table: {len(rows)} rows found"
    return rows


def test_every_documented_error_is_what_hints_check_prints(
        capsys: pytest.CaptureFixture[str]) -> None:
    for comment, gpus, message in error_rows():
        rc, out = run_here(["hadar-slurm", "hints", "check", comment, "--gpus", str(gpus)],
                           REPO, capsys)
        assert rc == 2, f"{comment!r} --gpus {gpus}: exit {rc}: {out}"
        assert out == f"hadar-slurm: error: {message}\n", f"{comment!r}: {out!r} != {message!r}"


def test_every_hint_problem_of_hints_py_is_documented() -> None:
    """Each HintError raised in hints.py (its problem's first words) has a row."""
    source = (REPO / "hadar_slurm" / "hints.py").read_text()
    problems = re.findall(r'HintError\(\s*f?"([^"{]+)', source)
    documented = " ".join(m for _, _, m in error_rows())
    missing = {p for p in problems if p.strip() and p not in documented}
    assert not missing, f"hints.py messages without a row in users.md: {sorted(missing)}"


def test_lua_internal_error_message_is_the_documented_one() -> None:
    doc = (DOCS / "users.md").read_text()
    message = "hadar: internal error in job_submit.lua, tell the administrators"
    assert f"`{message}`" in doc
    assert f'"{message}"' in (REPO / "slurm_conf" / "job_submit.lua").read_text()


def test_reason_table_is_the_policies_reasons() -> None:
    text = (DOCS / "users.md").read_text()
    rows = set(re.findall(r"^\| `([a-z.]+)` \| ((?:waits|never runs): [^|]+) \|$", text,
                          re.MULTILINE))
    wanted = {(r.component, r.text) for r in Reason if r is not Reason.PLACED}
    assert rows == wanted


# -- on a real Slurm cluster ------------------------------------------------------------------

def test_commands_run_on_the_dev_cluster(dev_cluster: DevCluster, submitted: list[int],
                                         tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """admins.md's commands, then users.md's, in their order: a dry-run epoch over the example
    config (paths moved into tmp_path), hadar jobs submitted through job_submit.lua (held),
    status/explain/squeue/scontrol on them; then every row of the error table through sbatch."""
    root, work = tmp_path / "root", tmp_path / "work"
    (root / "etc" / "hadar-slurm").mkdir(parents=True)
    work.mkdir()
    example = (REPO / "slurm_conf" / "hadar-slurm.toml").read_text()
    (root / CONFIG.lstrip("/")).write_text(
        example.replace('"/var/lib/hadar-slurm"', f'"{root}/var/lib/hadar-slurm"'))
    (work / "train.sh").write_text("#!/bin/sh\nsleep 60\n")
    conf = str(dev_cluster.dir / "etc" / "slurm.conf")
    monkeypatch.setenv("SLURM_CONF", conf)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    env = {**os.environ, "SLURM_CONF": conf, "MPLBACKEND": "Agg",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    jobid = ""
    ran: set[str] = set()
    for doc in ("admins.md", "users.md", "architecture.md"):
        for cmd in shell_commands(doc):
            want = REGISTRY.get(cmd.key)
            if not isinstance(want, OnCluster):
                continue
            argv = [jobid if t == JOBID else rooted(t, root) for t in cmd.argv]
            if argv[:2] == ["hadar-slurm", "run"]:  # the sidecar: its own process
                proc = subprocess.run([sys.executable, "-m", "hadar_slurm", *argv[1:]],
                                      cwd=work, env=env, capture_output=True, text=True,
                                      timeout=120, check=False)
                (work / "sidecar.log").write_text(proc.stderr)  # what the journal would hold
                rc, out = proc.returncode, proc.stdout + proc.stderr
            else:
                rc, out = run_here(argv, work, capsys, env)
            if argv[0] == "sbatch" and rc == 0:
                jobid = out.split()[-1]
                submitted.append(int(jobid))
            _check(cmd, want, rc, out, jobid)
            ran.add(cmd.key)
    assert ran == {k for k, w in REGISTRY.items() if isinstance(w, OnCluster)}

    for comment, gpus, message in error_rows():
        if not comment.lower().startswith("hadar:"):
            continue  # not a hadar job: sbatch takes it as a plain job
        argv = ["sbatch", f"--comment={comment}", f"--gres=gpu:{gpus}", "--output=/dev/null",
                "--wrap", "true"]
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        if proc.returncode == 0:
            submitted.append(int(proc.stdout.split()[-1]))
        assert proc.returncode != 0, f"sbatch accepted {comment!r}: {proc.stdout}"
        assert f"sbatch: error: hadar: {message}\n" in proc.stderr, (comment, proc.stderr)
