"""Helpers for a private dev cluster (slurm_conf/dev-cluster.sh), used by the benches and the
tests: free loopback ports, and running the script."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "slurm_conf" / "dev-cluster.sh"


def dev_script(
    action: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``dev-cluster.sh ACTION`` with ``env`` (its HADAR_DEVCLUSTER_* settings), output kept."""
    return subprocess.run(["bash", str(SCRIPT), action], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def ports_free(base: int, n: int) -> bool:
    """Whether ``base .. base+n-1`` can all be bound on 127.0.0.1 now."""
    for port in range(base, base + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port_base(start: int, slots: int, n: int = 16, what: str = "the dev cluster") -> int:
    """A base port with ``n`` free ports after it, among ``slots`` blocks of 16 from
    ``start``; the first block tried depends on the pid, so concurrent runs spread out."""
    for k in range(slots):
        base = start + ((os.getpid() + k) % slots) * 16
        if ports_free(base, n):
            return base
    raise RuntimeError(f"no {n} free TCP ports found in {start}..{start + slots * 16} for {what}")
