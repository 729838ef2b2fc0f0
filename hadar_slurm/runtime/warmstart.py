"""Warm starts for the emulated payload: one server imports Python's and torch's modules once,
and every payload of the emulated cluster is a fork of it, so that a start costs the same however
many start at once on the host's few cores.

    python -m hadar_slurm.runtime.warmstart serve SOCKET            # beside the dev cluster
    python -m hadar_slurm.runtime.warmstart run SOCKET -- ARGS...    # in a job: emulate ARGS

Why: on the dev cluster every "node" shares the same few cores, so ten payloads placed by one
epoch import torch (seconds of CPU each) at the same time, and each takes two or three times as
long to start as one alone, which a real cluster (one node each) never sees.  Measured on a
2-core host: ten cold starts together took 12.2-13.2 s to their first step against 4.7 s for
the later starts, two or three at a time; that skewed every early decision of a live run.

``run`` (the client, in the job; standard library only, so that it starts in tens of
milliseconds) sends the server its arguments, environment, working directory, standard streams
(as file descriptors) and the time it started; the server forks a child that runs
:func:`hadar_slurm.runtime.emulate.main` there, as ``python -m hadar_slurm.runtime.emulate
ARGS`` would, with ``--restart-s`` counted from the client's start.  The client stays in the
job as the payload's stand-in: a signal it gets (Slurm's preemption signal, its SIGTERM) goes to
the payload, the payload's exit status becomes its own, and if the client dies (SIGKILL: the
job was cancelled) the payload is killed.  When no server answers, the client runs the payload
itself (a cold start) and says so on stderr.

The socket is a Unix socket (nothing listens on the network), created mode 0600: only the
server's user may start payloads through it (on the dev cluster jobs run as that user).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

#: When this process started (the client's: what ``--restart-s`` counts from).
_STARTED = time.monotonic()

#: Signals the client passes on to the payload (SIGKILL cannot be caught: its end is seen as
#: the connection closing, and the payload is killed then).
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
             signal.SIGCONT)
#: Largest request the server reads (arguments and environment), bytes.
MAX_REQUEST = 1 << 20
_FDS = 3  # stdin, stdout, stderr


def _send_msg(sock: socket.socket, payload: bytes, fds: Sequence[int] = ()) -> None:
    head = struct.pack("!I", len(payload))
    if fds:
        socket.send_fds(sock, [head], list(fds))
    else:
        sock.sendall(head)
    sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the connection closed mid-message")
        buf += chunk
    return bytes(buf)


# -- the client ------------------------------------------------------------------------------


def run(path: str, args: Sequence[str]) -> int:
    """Run the emulated payload with ``args`` through the server at ``path`` (or cold, when
    none answers); returns its exit status."""
    pending: list[int] = []

    def on_signal(signum: int, _frame: types.FrameType | None) -> None:
        pending.append(signum)

    wake = _wakeup_pipe()
    for s in FORWARDED:
        signal.signal(s, on_signal)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        request = json.dumps({"args": list(args), "env": dict(os.environ), "cwd": os.getcwd(),
                              "started": _STARTED}).encode()
        _send_msg(sock, request, fds=range(_FDS))
    except OSError as exc:
        sock.close()
        return _cold(args, f"no warm-start server at {path} ({exc.strerror or exc})")
    buf = b""
    while True:
        while pending:
            signum = pending.pop(0)
            with contextlib.suppress(OSError):
                sock.sendall(f"S{signum}\n".encode())
        ready, _, _ = select.select([sock.fileno(), wake], [], [], 1.0)
        if wake in ready:
            _drain(wake)
        if sock.fileno() not in ready:
            continue
        try:
            chunk = sock.recv(64)
        except OSError:
            chunk = b""
        if not chunk:
            print("warmstart: the server closed the connection before the payload ended",
                  file=sys.stderr, flush=True)
            return 1
        buf += chunk
        if b"\n" in buf:
            line = buf.split(b"\n", 1)[0].decode(errors="replace")
            if line.startswith("X") and line[1:].isdigit():
                return int(line[1:])
            print(f"warmstart: unexpected answer from the server: {line!r}", file=sys.stderr,
                  flush=True)
            return 1


def _wakeup_pipe() -> int:
    """A pipe that a signal wakes (:func:`signal.set_wakeup_fd`): its read end, to select on."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    return r


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass


def _cold(args: Sequence[str], why: str) -> int:
    """The payload in this process's place (its own cold start)."""
    print(f"warmstart: {why}: starting cold", file=sys.stderr, flush=True)
    for s in FORWARDED:
        signal.signal(s, signal.SIG_DFL)
    os.execv(sys.executable, [sys.executable, "-m", "hadar_slurm.runtime.emulate", *args])
    return 1  # (not reached)


# -- the server ------------------------------------------------------------------------------


def serve(path: str, *, ready: str | None = None) -> int:
    """Serve warm starts at ``path`` until SIGTERM or SIGINT.  ``ready``: a file written once
    the modules are loaded and the socket listens (for whoever started the server)."""
    import torch

    import hadar_slurm.runtime.emulate as emulate
    import hadar_slurm.runtime.trainer  # noqa: F401

    torch.set_num_threads(1)
    emulate.preload()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    stopping: list[int] = []

    def stop(signum: int, _frame: types.FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # (the per-payload waiters reap themselves)
    if ready:
        with open(ready, "w") as f:
            f.write(f"{os.getpid()}\n")
    print(f"warmstart: serving at {path} (pid {os.getpid()})", flush=True)
    try:
        while not stopping:
            try:
                r, _, _ = select.select([listener], [], [], 0.5)
            except InterruptedError:
                continue
            if not r:
                continue
            try:
                conn, _ = listener.accept()
            except (InterruptedError, BlockingIOError):
                continue
            pid = os.fork()
            if pid == 0:  # the waiter of this payload
                listener.close()
                code = 1
                try:
                    code = _wait_for(conn, emulate)
                finally:
                    os._exit(code)
            conn.close()
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return 0


def _wait_for(conn: socket.socket, emulate: types.ModuleType) -> int:
    """In the waiter (a fork of the server): read the request, fork the payload, pass it the
    client's signals, tell the client how it ended; kill it if the client goes away."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, _FDS)
    if len(head) != 4 or len(fds) != _FDS:
        return 1
    (size,) = struct.unpack("!I", head)
    if size > MAX_REQUEST:
        return 1
    request = json.loads(_recv_exact(conn, size))
    args = [str(a) for a in request["args"]]
    # a preemption signal before the runtime takes over ends the start at once, as in a cold
    # start (set before the fork: the payload has it from its first instruction)
    for s in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, emulate._stop_early)
    # the payload's end wakes the loop below (a handler of SIGCHLD, not the server's SIG_IGN,
    # under which the payload would not stay a zombie for waitpid)
    wake = _wakeup_pipe()
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    pid = os.fork()
    if pid == 0:  # the payload
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake)
            conn.close()
            os.setsid()
            for k, fd in enumerate(fds):
                os.dup2(fd, k)
                os.close(fd)
            os.chdir(str(request["cwd"]))
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in request["env"].items()})
            emulate._STARTED = float(request["started"])  # type: ignore[attr-defined]
            sys.argv = ["python -m hadar_slurm.runtime.emulate", *args]
            code = int(emulate.main(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    buf = b""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            with contextlib.suppress(OSError):
                conn.sendall(f"X{code}\n".encode())
            return 0
        r, _, _ = select.select([conn.fileno(), wake], [], [], 1.0)
        if wake in r:
            _drain(wake)
        if conn.fileno() not in r:
            continue
        try:
            chunk = conn.recv(256)
        except OSError:
            chunk = b""
        if not chunk:  # the client is gone (killed with its job): so is the payload
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith("S") and text[1:].isdigit():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, int(text[1:]))


@contextlib.contextmanager
def warm_server(path: str | Path, *, log: str | Path | None = None,
                env: Mapping[str, str] | None = None, timeout_s: float = 120.0) -> Iterator[str]:
    """A warm-start server at ``path`` (a new process, ``serve``) for the ``with`` block; its
    output goes to ``log`` (default: discarded).  Raises RuntimeError if it does not come up
    within ``timeout_s``."""
    path = str(path)
    ready = Path(path + ".ready")
    ready.unlink(missing_ok=True)
    out = open(log, "ab") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "hadar_slurm.runtime.warmstart", "serve", path, "--ready",
         str(ready)], env=None if env is None else dict(env), stdout=out, stderr=out,
        stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = ""
                if log is not None:
                    with contextlib.suppress(OSError):
                        tail = ": " + Path(log).read_text(errors="replace")[-2000:].strip()
                raise RuntimeError(f"the warm-start server at {path} did not come up{tail}")
            time.sleep(0.05)
        yield path
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        ready.unlink(missing_ok=True)
        if not isinstance(out, int):
            out.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m hadar_slurm.runtime.warmstart",
                                description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="load the payload's modules once and fork a payload per "
                                     "request")
    s.add_argument("socket")
    s.add_argument("--ready", help="a file to write once serving (its pid)")
    r = sub.add_parser("run", help="run the emulated payload through the server (ARGS: those "
                                   "of python -m hadar_slurm.runtime.emulate)")
    r.add_argument("socket")
    rest: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, rest = argv[:k], argv[k + 1:]
    ns = p.parse_args(argv)
    if ns.command == "serve":
        return serve(ns.socket, ready=ns.ready)
    return run(ns.socket, rest)


if __name__ == "__main__":
    sys.exit(main())
