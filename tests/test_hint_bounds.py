"""Every value a user writes in a ``hadar:`` comment is bounded, and the four readers of a comment
agree on one table of cases, good and hostile: ``parse_hints`` (Python), ``hadar-slurm hints
check`` (a subprocess, as a user runs it), job_submit.lua (sbatch on the dev cluster) and the
sidecar (SlurmBackend over the fake Slurm of tests/test_sidecar_backend.py), which releases a job
whose hints it cannot use to Slurm, unsteered, with the message as the reason.

Each case names what the table expects (accepted, or the field of the error), so a reader that
accepts what it should refuse fails here, not only a reader that disagrees with Python.

A case may be a job array (sbatch --array): a study (``study=NAME``) must be one.  Every reader
is told: job_submit.lua by sbatch, ``hints check`` by ``--array``, the sidecar by the job's
record (an array task), ``parse_hints`` by ``array=``; ``array=None`` (unknown) skips that check
(:attr:`Case.want_array_unknown`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from hadar_slurm.hints import (
    HINT_KEYS,
    MAX_COMMENT_BYTES,
    MAX_STEPS,
    MAX_VALUE_BYTES,
    QUOTE_BYTES,
    HintError,
    parse_hints,
    quote,
)
from hadar_slurm.sidecar.record import decode, mark
from hadar_slurm.slurm import Gres, parse_sbatch_parsable
from tests.helpers import REPO
from tests.slurm_cluster import DevCluster, jobs
from tests.test_sidecar_backend import NODES, FakeSlurm, backend, decide, job
from tests.test_submit_lua import ADMIN_COMMENT

NINES_400 = "9" * 400
HUGE = "hadar: model=a3c steps=" + "1" * 5000
ARG_MAX = 128 * 1024  # Linux's limit on one argv string: beyond it, only stdin


@dataclass(frozen=True)
class Case:
    comment: str  # a str as Python's argv decodes it (surrogateescape for non-UTF-8 bytes)
    want: str | None  # None: accepted; else the field of the HintError
    gpus: int = 1
    message: str | None = None  # the exact message, where the table pins it
    array: bool = False  # submitted as a job array (sbatch --array)

    @property
    def want_array_unknown(self) -> str | None:
        """What a reader that does not know whether the job is an array expects (``hints
        check``, the sidecar): the same, but for the job-array check, which it skips."""
        return None if self.want == "array" else self.want

    @property
    def argv_ok(self) -> bool:
        """Whether the comment can be a command-line argument at all (no NUL, < 128 KiB)."""
        return "\0" not in self.comment and len(os.fsencode(self.comment)) < ARG_MAX


def _bytes(text: bytes) -> str:
    return text.decode("utf-8", "surrogateescape")


STEPS = "steps must be a whole number of iterations from 1 to 1000000000000, got '{}' " \
        "(e.g. steps=40000)"
WEIGHT = "weight must be a number from 0.001 to 1000, got '{}' (e.g. weight=2)"
TOO_LONG = "hint '{}' has a value longer than 64 bytes (write {}=N)"
COMMENT_LONG = ("comment is longer than 512 bytes (write only the hints, e.g. "
                "'hadar: model=resnet50 bs=64 steps=40000')")
RUNGS = "rungs must be a whole number from 1 to 10, got '{}' (e.g. rungs=4, three halvings)"
ETA = ("eta must be a whole number from 2 to 16, got '{}' (e.g. eta=3: the best third of the "
       "trials go on at each rung)")
FIRST_RUNG = ("the first rung would train less than one step: steps={} < eta^(rungs-1) = {} "
              "(fewer rungs, a smaller eta or more steps)")
STUDY_NAME = ("study must be letters, digits, '_', '.' or '-', starting with a letter or digit, "
              "got '{}' (e.g. study=lr-search)")
# a comment with every key, each value at its longest usual spelling (295 bytes)
EVERY_KEY = ("hadar: model=recommendation bs=8192 steps=1000000000000 sync=false weight=1000 "
             "fork=16 preempt=checkpoint share=false study=" + "s" * 64 + " rule=asha "
             "rungs=10 eta=16 metric=" + "m" * 64 + " mode=max")

CASES: list[Case] = [
    # accepted, at the bounds
    Case("hadar: model=resnet50 bs=64 steps=1000000000000", None),
    Case("hadar: model=a3c steps=1_000_000_000_000", None),
    Case("hadar: model=a3c steps=" + "0" * 63 + "1", None),  # a value of exactly 64 bytes
    Case("hadar: model=a3c steps=1 weight=0.001", None),
    Case("hadar: model=a3c steps=1 weight=1000", None),
    Case("hadar: model=a3c steps=1 weight=1e3", None),
    Case("hadar: model=a3c steps=1 weight=1E-3", None),
    Case("hadar: model=lm bs=0080 steps=10 fork=16", None, gpus=8),
    Case("hadar: model=a3c" + " " * (MAX_COMMENT_BYTES - 23) + "steps=1", None),  # 512 bytes
    Case("hadar:\tmodel=a3c\x0bsteps=1\x0cweight=2\rsync=no", None),  # ASCII whitespace
    Case("hadar: model=a3c\nsteps=1", None),
    # steps: huge, just above the bound, zero, negative, not ASCII digits
    Case(f"hadar: model=resnet50 bs=64 steps={NINES_400}", "steps",
         message=TOO_LONG.format("steps", "steps")),
    Case(HUGE, "hints", message=COMMENT_LONG),
    Case("hadar: model=a3c steps=1000000000001", "steps",
         message=STEPS.format("1000000000001")),
    Case("hadar: model=a3c steps=" + "9" * 20, "steps", message=STEPS.format("9" * 20)),
    Case("hadar: model=a3c steps=" + "9" * 64, "steps",
         message=STEPS.format("9" * QUOTE_BYTES + "...")),
    Case("hadar: model=a3c steps=0", "steps", message=STEPS.format("0")),
    Case("hadar: model=a3c steps=" + "0" * 64, "steps"),
    Case("hadar: model=a3c steps=-1", "steps"),
    Case("hadar: model=a3c steps=+1", "steps"),
    Case("hadar: model=a3c steps=1_", "steps"),
    Case("hadar: model=a3c steps=1__0", "steps"),
    Case("hadar: model=a3c steps=1e3", "steps"),
    Case("hadar: model=a3c steps=\u0663", "steps", message=STEPS.format("\\xd9\\xa3")),
    Case("hadar: model=a3c steps=\uff13\uff10", "steps",
         message=STEPS.format("\\xef\\xbc\\x93\\xef\\xbc\\x90")),
    Case("hadar: model=a3c steps=1\u00a0", "steps"),  # a no-break space is not whitespace
    # weight: overflow, underflow, nan/inf spellings, out of range
    Case("hadar: model=a3c steps=1 weight=1e400", "weight", message=WEIGHT.format("1e400")),
    Case("hadar: model=a3c steps=1 weight=1e-400", "weight"),
    Case("hadar: model=a3c steps=1 weight=1e308", "weight"),
    Case("hadar: model=a3c steps=1 weight=nan", "weight", message=WEIGHT.format("nan")),
    Case("hadar: model=a3c steps=1 weight=NaN", "weight"),
    Case("hadar: model=a3c steps=1 weight=inf", "weight"),
    Case("hadar: model=a3c steps=1 weight=Infinity", "weight"),
    Case("hadar: model=a3c steps=1 weight=-inf", "weight"),
    Case("hadar: model=a3c steps=1 weight=0", "weight", message=WEIGHT.format("0")),
    Case("hadar: model=a3c steps=1 weight=-2", "weight"),
    Case("hadar: model=a3c steps=1 weight=0.000999", "weight"),
    Case("hadar: model=a3c steps=1 weight=1000.0001", "weight"),
    Case("hadar: model=a3c steps=1 weight=1_0", "weight"),
    Case("hadar: model=a3c steps=1 weight=0x10", "weight"),
    Case("hadar: model=a3c steps=1 weight=\u0662", "weight"),
    # fork and bs: whole numbers compared by their digits
    Case("hadar: model=a3c steps=1 fork=17", "fork"),
    Case("hadar: model=a3c steps=1 fork=" + "9" * 30, "fork"),
    Case("hadar: model=a3c steps=1 fork=0", "fork"),
    Case("hadar: model=resnet50 bs=" + "9" * 30 + " steps=1", "bs",
         message="bs " + "9" * 30 + " not available for resnet50 (choose 16, 32, 64, 128)"),
    Case("hadar: model=resnet50 bs=" + "6" * 50 + " steps=1", "bs",
         message="bs " + "6" * 40 + "... not available for resnet50 (choose 16, 32, 64, 128)"),
    Case("hadar: model=resnet50 bs=\u0666\u0664 steps=1", "bs"),
    Case("hadar: model=resnet50 bs=" + "0" * 70 + "64 steps=1", "bs"),
    # models, keys and tokens: unicode, control bytes, non-UTF-8, long ones
    Case("hadar: model=\uff52\uff45\uff53\uff4e\uff45\uff54\uff15\uff10 bs=64 steps=1",
         "model"),
    Case("hadar: model=a3c\x01\x1b[31m steps=1", "model",
         message="unknown model 'a3c\\x01\\x1b[31m' (known: a3c, cyclegan, lm, "
         "recommendation, resnet18, resnet50, transformer)"),
    Case(_bytes(b"hadar: model=\xff\xfe steps=1"), "model"),
    Case(_bytes(b"hadar: model=a3c steps=1 \xc3"), "hints"),
    Case("hadar: model=" + "\u00e9" * 32 + " steps=1", "model"),  # 64 bytes: a value
    Case("hadar: model=" + "\u00e9" * 33 + " steps=1", "model",  # 66 bytes: too long
         message="hint 'model' has a value longer than 64 bytes (write model=NAME)"),
    Case("hadar: model=a3c steps=1 " + "x" * 100 + "=1", "hints",
         message="unknown hint '" + "x" * 40 + "...' (keys: " + ", ".join(HINT_KEYS) + ")"),
    Case("hadar: model=a3c steps=1 " + "y" * 100, "hints"),
    Case("hadar: \uff4dodel=a3c steps=1", "hints"),
    Case("hadar: model=a3c steps=1 sync=1 weight=1 fork=1 bs=1 x=1", "hints"),
    Case("hadar: model=a3c steps=1 sync=\u0131", "sync"),
    Case("hadar: model=a3c steps=1 preempt=Never", "preempt"),
    Case("hadar: model=a3c steps=1 preempt=never\x1b", "preempt"),
    Case("hadar: model=a3c steps=1 preempt=" + "r" * 65, "preempt"),
    # the whole comment: bytes, not characters; whitespace counts
    Case("hadar: model=a3c" + " " * (MAX_COMMENT_BYTES - 22) + "steps=1", "hints",
         message=COMMENT_LONG),
    Case("hadar: model=a3c steps=1 " + "\u00a0" * 250, "hints", message=COMMENT_LONG),
    Case("hadar: model=a3c steps=1 sync=" + "1" * 100_000, "hints", message=COMMENT_LONG),
    Case("hadar: model=a3c steps=1 " + "z" * 1_000_000, "hints", message=COMMENT_LONG),
    # NUL: only stdin can carry it (and the sidecar, from a comment of another source)
    Case("hadar: model=a3c steps=1\0", "steps", message=STEPS.format("1\\x00")),
    # studies: whole numbers bounded by their digits, eta^(rungs-1) up to 16^9 = 2^36 exactly,
    # names of 64 bytes, a job array
    Case(EVERY_KEY, None, array=True),
    Case("hadar: model=a3c steps=68719476736 study=s rungs=10 eta=16", None, array=True),
    Case("hadar: model=a3c steps=68719476735 study=s rungs=10 eta=16", "rungs", array=True,
         message=FIRST_RUNG.format(68719476735, "16^9 = 68719476736")),
    Case("hadar: model=a3c steps=1 study=s rungs=1 eta=16", None, array=True),
    Case("hadar: model=a3c steps=26 study=s", "rungs", array=True,
         message=FIRST_RUNG.format(26, "3^3 = 27")),
    Case("hadar: model=a3c steps=1000 study=s rungs=0_4 eta=0_3", None, array=True),
    Case("hadar: model=a3c steps=1000 study=s rungs=" + "9" * 30, "rungs", array=True,
         message=RUNGS.format("9" * 30)),
    Case("hadar: model=a3c steps=1000 study=s rungs=" + "0" * 63 + "4", None, array=True),
    Case("hadar: model=a3c steps=1000 study=s rungs=" + "0" * 64, "rungs", array=True),
    Case("hadar: model=a3c steps=1000 study=s eta=" + "9" * 64, "eta", array=True,
         message=ETA.format("9" * 40 + "...")),
    Case("hadar: model=a3c steps=1000 study=s eta=\u0663", "eta", array=True,
         message=ETA.format("\\xd9\\xa3")),
    Case("hadar: model=a3c steps=1000 study=s eta=1e1", "eta", array=True),
    Case("hadar: model=a3c steps=1000 study=" + "S" * 64, None, array=True),
    Case("hadar: model=a3c steps=1000 study=" + "S" * 65, "study", array=True,
         message="hint 'study' has a value longer than 64 bytes (write study=NAME)"),
    Case("hadar: model=a3c steps=1000 study=\u00e9t\u00e9", "study", array=True,
         message=STUDY_NAME.format("\\xc3\\xa9t\\xc3\\xa9")),
    Case(_bytes(b"hadar: model=a3c steps=1000 study=a\xff"), "study", array=True),
    Case("hadar: model=a3c steps=1000 study=a\x1b[0m", "study", array=True),
    Case("hadar: model=a3c steps=1000 study=s metric=-" + "m" * 63, "metric", array=True),
    Case("hadar: model=a3c steps=1000 study=s rule=ASHA", "rule", array=True),
    Case("hadar: model=a3c steps=1000 study=s mode=Min", "mode", array=True),
    Case("hadar: model=a3c steps=1000 rungs=4", "rungs", array=True,
         message="hint 'rungs' is only for a study (add study=NAME, or remove rungs=4)"),
    Case("hadar: model=a3c steps=1000 study=s", "array",
         message="a study is a job array (submit with --array=0-N, one task per trial)"),
    Case("hadar: model=a3c steps=1000", None, array=True),  # any job may be an array
    # the GPU count is checked last
    Case("hadar: model=resnet50 bs=64 steps=1000000000000", "gpus", gpus=3),
    Case("hadar: model=a3c steps=1", "gpus", gpus=9999,
         message="a3c runs on 1 GPU; the job asks for 9999 (use --gres=gpu:1)"),
    Case("hadar: model=a3c steps=1", "gpus", gpus=10000,
         message="a3c runs on 1 GPU; the job asks for more than 9999 (use --gres=gpu:1)"),
    Case("hadar: model=a3c steps=1", "gpus", gpus=2**32 - 1),
    Case("hadar: model=a3c steps=1", "gpus", gpus=int("9" * 400)),  # Lua's tonumber: inf
]

IDS = [f"{i:02d}" for i in range(len(CASES))]


def python_message(case: Case, *, array_known: bool = True) -> tuple[str | None, str | None]:
    """(field, message) of parse_hints, (None, None) when it accepts.  ``array_known``: told
    whether the job is an array (as job_submit.lua knows), else not (hints check, sidecar)."""
    try:
        parse_hints(case.comment, gpus=case.gpus, array=case.array if array_known else None)
    except HintError as exc:
        return exc.field, str(exc)
    return None, None


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_python_decides_as_the_table(case: Case) -> None:
    field, message = python_message(case)
    assert field == case.want, message
    assert python_message(case, array_known=False)[0] == case.want_array_unknown
    if case.message is not None:
        assert message == case.message
    if message is not None:  # one short printable line, whatever the input
        assert message.isascii() and message.isprintable(), message
        assert len(message) < 300, message


def test_the_bounds_are_the_documented_ones() -> None:
    assert (MAX_COMMENT_BYTES, MAX_VALUE_BYTES, MAX_STEPS, QUOTE_BYTES) == (512, 64, 10**12, 40)
    assert quote("a\0b\u00e9" + "c" * 50) == "a\\x00b\\xc3\\xa9" + "c" * 35 + "..."
    parse_hints("hadar: model=a3c steps=1000000000000")  # a float without loss
    assert float(parse_hints("hadar: model=a3c steps=1000000000000").steps) == 1e12


def _hints_check(case: Case) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "hadar_slurm", "hints", "check", "--gpus", str(case.gpus),
            *(["--array"] if case.array else [])]
    if case.argv_ok:
        return subprocess.run([*argv, case.comment], cwd=REPO, capture_output=True,
                              timeout=60, check=False)
    return subprocess.run([*argv, "-"], cwd=REPO, capture_output=True, timeout=60,
                          check=False, input=os.fsencode(case.comment))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hints_check_decides_as_python(case: Case) -> None:
    _, message = python_message(case)  # (hints check --array says the job is an array)
    proc = _hints_check(case)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Traceback" not in err, err
    if case.want is None:
        assert (proc.returncode, err) == (0, ""), err
        assert out.startswith("hadar: model=") and out.count("\n") == 1, out
    else:
        assert (proc.returncode, out) == (2, ""), (proc.returncode, out, err)
        assert err == f"hadar-slurm: error: {message}\n"


def test_hints_check_stdin_keeps_bytes_and_drops_one_newline() -> None:
    ok = Case("hadar: model=a3c steps=7\n", None)
    proc = subprocess.run([sys.executable, "-m", "hadar_slurm", "hints", "check", "-"],
                          cwd=REPO, capture_output=True, timeout=60, check=False,
                          input=os.fsencode(ok.comment))
    assert proc.returncode == 0 and b"steps=7 " in proc.stdout, proc.stderr
    # 511 bytes and a newline: within the bound; one byte more: not
    for size, rc in ((MAX_COMMENT_BYTES, 0), (MAX_COMMENT_BYTES + 1, 2)):
        text = "hadar: model=a3c steps=1".ljust(size) + "\n"
        proc = subprocess.run([sys.executable, "-m", "hadar_slurm", "hints", "check", "-"],
                              cwd=REPO, capture_output=True, timeout=60, check=False,
                              input=text.encode())
        assert proc.returncode == rc, (size, proc.stderr)


# -- the sidecar: a job whose comment bypassed job_submit.lua ---------------------------------

def test_sidecar_releases_unusable_hints_unsteered_and_finishes_the_snapshot() -> None:
    # ids from 1; 1000 + i: a job with the case's comment and GPU count (a task of a job
    # array of its own where the case is submitted as one: the sidecar knows from its record)
    api = FakeSlurm([replace(job(1000 + i, comment=c.comment, gpus=c.gpus),
                             array_job_id=1000 + i if c.array else None,
                             array_task_id=0 if c.array else None)
                     for i, c in enumerate(CASES)], NODES)
    b = backend(api)
    _decision, actions = decide(b, {})  # the snapshot completes
    b.apply(actions, 2000.0)
    for i, case in enumerate(CASES):
        _, message = python_message(case)
        rec = decode(api.jobs[1000 + i].admin_comment)
        if case.want is None:
            assert rec.state != "unsteered", (case.comment[:80], rec)
        else:
            assert ("release", 1000 + i) in api.log, case.comment[:80]
            assert (rec.state, rec.why) == ("unsteered", f"bad hints: {message}"), rec


def test_sidecar_survives_400_nines() -> None:
    # the report: this comment, in a queue without job_submit.lua, stopped every epoch
    api = FakeSlurm([job(1, comment=f"hadar: model=resnet50 bs=64 steps={NINES_400}"),
                     job(2)], NODES)
    b = backend(api)
    snap = b.snapshot(0, 2000.0, 60.0, None)
    assert snap.num_jobs == 1  # job 2 only
    _decision, actions = decide(b, {0: [(0, 1)]}, epoch=1)
    b.apply(actions, 2001.0)
    rec = decode(api.jobs[1].admin_comment)
    assert rec.state == "unsteered" and "steps" in rec.why and "64 bytes" in rec.why, rec


# -- job_submit.lua on the dev cluster ---------------------------------------------------------

@pytest.fixture
def lua_jobs(dev_cluster: DevCluster) -> Iterator[list[int]]:
    ids: list[int] = []
    try:
        yield ids
    finally:
        if ids:
            dev_cluster.runner.run(["scancel", *map(str, ids)], check=False)


LUA_CASES = [(i, c) for i, c in zip(IDS, CASES, strict=True) if c.argv_ok]


@pytest.mark.parametrize("case", [c for _, c in LUA_CASES], ids=[i for i, _ in LUA_CASES])
def test_lua_decides_as_python(dev_cluster: DevCluster, lua_jobs: list[int], tmp_path: Path,
                               case: Case) -> None:
    _, message = python_message(case)
    tmp_path.chmod(0o755)
    argv = ["sbatch", "--parsable", "--job-name=hadar-it-bounds",
            f"--chdir={tmp_path}", "--output=/dev/null", f"--gres=gpu:{case.gpus}",
            f"--comment={case.comment}", "--wrap=sleep 1", *(["--array=0-1"] * case.array)]
    out = dev_cluster.runner.run(argv, check=False)
    if out.returncode == 0:
        lua_jobs.append(parse_sbatch_parsable(out.stdout))
    if case.want is None:
        assert out.returncode == 0, f"Lua refused what the table accepts: {out.stderr}"
        job_ = jobs(dev_cluster)[lua_jobs[-1]]
        assert mark(job_.admin_comment) == ADMIN_COMMENT and decode(job_.admin_comment).args == ()
        assert job_.gres == (Gres("gpu", None, case.gpus),)
    else:
        assert out.returncode != 0, f"Lua accepted what the table refuses: {message}"
        assert f"sbatch: error: hadar: {message}\n" in out.stderr, out.stderr
