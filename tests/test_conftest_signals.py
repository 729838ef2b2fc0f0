"""A test session killed with SIGTERM or SIGHUP still tears its fixtures down (tests/conftest.py),
as the dev cluster's session fixture needs to stop its daemons."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

INNER = '''
import time
from pathlib import Path

import pytest

OUT = Path(__file__).parent


@pytest.fixture(scope="session")
def daemon():
    yield
    (OUT / "torn-down").write_text("yes")


def test_runs_long(daemon):
    (OUT / "started").write_text("yes")
    time.sleep(60)
'''


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_killed_session_tears_its_session_fixtures_down(tmp_path: Path,
                                                          sig: signal.Signals) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # (the signal as a fresh shell has it: under nohup, as on CI, SIGHUP is ignored, and
        # conftest leaves an ignored signal ignored)
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the inner test never started"
            time.sleep(0.05)
        proc.send_signal(sig)
        out = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "torn-down").exists(), out
    assert f"signal {sig.name}" in out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED
