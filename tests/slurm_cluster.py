"""The real Slurm dev cluster of ``slurm_conf/dev-cluster.sh`` for integration tests.

The session fixture starts a private cluster (its own state dir and free ports, so concurrent
test sessions on one machine do not meet) and always stops it at the end, also when a test
fails.  With ``HADAR_DEVCLUSTER_DIR`` set, it uses that cluster instead, starting it if needed
(and then stopping it again).  Needs root and Debian's Slurm (``make deps``); skipped otherwise,
except on CI (``CI`` set), where a missing Slurm is a failure.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from bench.devcluster import dev_script, free_port_base
from hadar_slurm.slurm import (
    SlurmJob,
    SlurmRunner,
    commands,
    parse_sbatch_parsable,
    parse_squeue_json,
)

REPO = Path(__file__).resolve().parent.parent
PRIVATE_PREFIX = "/tmp/hadar-devcluster-pytest."
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "unshare")
#: gres/shard per GPU of the tests' second cluster, the session fixture ``shard_cluster``
#: (docs/sharing.md): every GPU is also 2 shards, so that tests/test_shard_cluster.py and
#: tests/test_share_cluster.py can put two jobs on one GPU.  The main cluster (``dev_cluster``)
#: has none (``HADAR_DEVCLUSTER_SHARDS`` sets its count): Slurm 24.11 loses a node's shard count
#: when slurmctld restarts (the node turns INVAL: "Attempt to change gres/shard Count on node
#: node1 from 0 to 8 invalid with File configuration"), which tests that restart slurmctld do.
SHARDS_PER_GPU = 2


@dataclass(frozen=True)
class DevCluster:
    dir: Path
    env: dict[str, str]  # what dev-cluster.sh needs (dir, port)
    runner: SlurmRunner
    version: str = ""  # `scontrol version` of the cluster's Slurm, e.g. "24.11.5"


#: The Slurm release the session's dev cluster runs ("" before it started); the summary of the
#: real-cluster tests (tests/conftest.py) names it.
SESSION = {"slurm": ""}


def nodes_conf() -> dict[str, tuple[str, int]]:
    """name -> (gpu type, gpus) from slurm_conf/nodes.conf, the one list of the nodes."""
    out = {}
    for line in (REPO / "slurm_conf" / "nodes.conf").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            out[fields[0]] = (fields[1], int(fields[2]))
    return out


def _free_port_base(n: int) -> int:
    """A base port with ``n`` free ports after it (away from the default 17810 of a
    developer's own cluster)."""
    return free_port_base(18000, 200, n)


def _reap_stale(env: dict[str, str]) -> None:
    """Stop clusters of earlier test sessions whose pytest process is gone (killed)."""
    for path in Path("/tmp").glob("hadar-devcluster-pytest.*"):
        pid = path.name.rsplit(".", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # that session is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        dev_script("down", {**env, "HADAR_DEVCLUSTER_DIR": str(path)}, timeout=90)
        shutil.rmtree(path, ignore_errors=True)


def not_installed(msg: str) -> NoReturn:
    """A test needs something `make deps` installs and it is missing: skip it here, fail it on
    CI (env ``CI`` set), where every test must run."""
    if os.environ.get("CI"):
        pytest.fail(msg + "; on CI it must run")
    pytest.skip(msg)


def start_dev_cluster(shards: int | None = None) -> Iterator[DevCluster]:
    """Generator behind the session fixtures ``dev_cluster`` (``shards`` None: the count of
    ``HADAR_DEVCLUSTER_SHARDS``, else 0) and ``shard_cluster`` (a private cluster of its own
    with ``shards`` per GPU, whatever ``HADAR_DEVCLUSTER_DIR`` says) (tests/conftest.py)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if os.geteuid() != 0:
        pytest.skip("Slurm integration tests need root (slurmd runs in private namespaces)")
    if missing:
        not_installed(f"Slurm integration tests need {', '.join(missing)} (`make deps` installs "
                      "them)")

    env = {k: v for k, v in os.environ.items() if not k.startswith("HADAR_DEVCLUSTER_")}
    env["HADAR_DEVCLUSTER_LUA"] = "1"  # hints are validated at sbatch time by job_submit.lua
    env["HADAR_DEVCLUSTER_SHARDS"] = (os.environ.get("HADAR_DEVCLUSTER_SHARDS", "0")
                                      if shards is None else str(shards))
    explicit = os.environ.get("HADAR_DEVCLUSTER_DIR") if shards is None else None
    if explicit:
        for key in ("HADAR_DEVCLUSTER_DIR", "HADAR_DEVCLUSTER_PORT"):
            if key in os.environ:
                env[key] = os.environ[key]
        own = dev_script("status", env, timeout=30).returncode != 0
    else:
        _reap_stale(env)
        # (the shard cluster's name ends with the pid too, for _reap_stale)
        env["HADAR_DEVCLUSTER_DIR"] = (f"{PRIVATE_PREFIX}{os.getpid()}" if shards is None
                                       else f"{PRIVATE_PREFIX}shards.{os.getpid()}")
        env["HADAR_DEVCLUSTER_PORT"] = str(_free_port_base(2 + len(nodes_conf())))
        own = True
    cluster_dir = Path(env["HADAR_DEVCLUSTER_DIR"])
    try:
        if own:
            up = dev_script("up", env, timeout=180)
            if up.returncode != 0:
                pytest.fail(f"dev-cluster.sh up failed ({up.returncode}):\n{up.stderr[-3000:]}")
        conf = cluster_dir / "etc" / "slurm.conf"
        runner = SlurmRunner(conf, timeout=30)
        version = runner.run(["scontrol", "version"]).stdout.split()[-1]
        SESSION["slurm"] = version
        yield DevCluster(cluster_dir, env, runner, version)
    finally:
        if own:
            down = dev_script("down", env, timeout=120)
            if not explicit:
                if down.returncode == 0:
                    shutil.rmtree(cluster_dir, ignore_errors=True)
                else:  # leave it for the next session's _reap_stale, and say so
                    print(f"dev-cluster.sh down failed:\n{down.stderr}")


def spelled(cluster: DevCluster, tres: str) -> str:
    """A GPU request as the cluster's Slurm writes it in ``tres_per_node``: ``gres:gpu:2`` on
    22.05, ``gres/gpu:2`` on 24.11 and later (the releases tested)."""
    major, minor = (int(p) for p in cluster.version.split(".")[:2])
    return tres if (major, minor) <= (22, 5) else tres.replace("gres:", "gres/", 1)


def jobs(cluster: DevCluster) -> dict[int, SlurmJob]:
    out = cluster.runner.run(commands.squeue_json())
    return {j.job_id: j for j in parse_squeue_json(out.stdout)}


def wait_job(cluster: DevCluster, job_id: int, states: set[str], timeout: float) -> SlurmJob:
    """Poll ``squeue --json`` until the job is in one of ``states`` (MinJobAge=300 keeps
    finished jobs visible)."""
    end = time.monotonic() + timeout
    job = None
    while time.monotonic() < end:
        job = jobs(cluster).get(job_id)
        if job is not None and job.state in states:
            return job
        time.sleep(0.5)
    detail = cluster.runner.run(commands.scontrol_show_job(job_id), check=False)
    raise AssertionError(
        f"job {job_id} not in {sorted(states)} after {timeout:g} s: {job}\n{detail.stdout}")


def clear_prolog_faults(cluster: DevCluster) -> None:
    """Undo the fault drill of the cluster's prolog (slurm_conf/prolog.sh.in: the files
    ``fail-prolog.NODE`` and ``fail-prolog.once`` in its run dir): remove every fault file,
    resume the nodes a failed prolog drained, and wait, bounded, until none is drained, since
    the next tests want every node back."""
    for f in (cluster.dir / "run").glob("fail-prolog.*"):
        f.unlink(missing_ok=True)
    for node in nodes_conf():
        cluster.runner.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                           check=False)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        out = cluster.runner.run(["sinfo", "-h", "-N", "-t", "drain,draining,drained",
                                  "-o", "%N"], check=False).stdout
        if not out.strip():
            break
        time.sleep(1)


def submit(cluster: DevCluster, **options: object) -> int:
    out = cluster.runner.run(commands.sbatch(**options))  # type: ignore[arg-type]
    return parse_sbatch_parsable(out.stdout)


