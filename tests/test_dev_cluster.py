"""Integration tests against a real Slurm: the dev cluster of ``slurm_conf/dev-cluster.sh``.

The session fixture starts a private cluster (its own state dir and free ports, so concurrent
test sessions on one machine do not meet) and always stops it at the end, also when a test
fails.  With ``HADAR_DEVCLUSTER_DIR`` set, it uses that cluster instead, starting it if needed
(and then stopping it again).  Needs root and Debian's Slurm (``make deps``); skipped otherwise,
except on CI (``CI`` set), where a missing Slurm is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hadar_slurm.slurm import (
    SlurmCommandError,
    SlurmJob,
    SlurmRunner,
    commands,
    parse_sbatch_parsable,
    parse_scontrol_show,
    parse_sinfo_json,
    parse_squeue_json,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "slurm_conf" / "dev-cluster.sh"
PRIVATE_PREFIX = "/tmp/hadar-devcluster-pytest."
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "unshare")


@dataclass(frozen=True)
class DevCluster:
    dir: Path
    env: dict[str, str]  # what dev-cluster.sh needs (dir, port)
    runner: SlurmRunner


def _script(action: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), action], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _nodes_conf() -> dict[str, tuple[str, int]]:
    """name -> (gpu type, gpus) from slurm_conf/nodes.conf, the one list of the nodes."""
    out = {}
    for line in (REPO / "slurm_conf" / "nodes.conf").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            out[fields[0]] = (fields[1], int(fields[2]))
    return out


def _ports_free(base: int, n: int) -> bool:
    for port in range(base, base + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _free_port_base(n: int) -> int:
    """A base port with ``n`` free ports after it (away from the default 17810 of a
    developer's own cluster); starts at a pid-dependent place."""
    for k in range(200):
        base = 18000 + ((os.getpid() + k) % 200) * 16
        if _ports_free(base, n):
            return base
    raise RuntimeError("no 16 free TCP ports found in 18000..21200 for the dev cluster")


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
        _script("down", {**env, "HADAR_DEVCLUSTER_DIR": str(path)}, timeout=90)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    on_ci = bool(os.environ.get("CI"))
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if os.geteuid() != 0:
        pytest.skip("Slurm integration tests need root (slurmd runs in private namespaces)")
    if missing:
        msg = f"Slurm integration tests need {', '.join(missing)} (`make deps` installs them)"
        if on_ci:
            pytest.fail(msg + "; on CI they must run")
        pytest.skip(msg)

    env = {k: v for k, v in os.environ.items() if not k.startswith("HADAR_DEVCLUSTER_")}
    explicit = os.environ.get("HADAR_DEVCLUSTER_DIR")
    if explicit:
        for key in ("HADAR_DEVCLUSTER_DIR", "HADAR_DEVCLUSTER_PORT"):
            if key in os.environ:
                env[key] = os.environ[key]
        own = _script("status", env, timeout=30).returncode != 0
    else:
        _reap_stale(env)
        env["HADAR_DEVCLUSTER_DIR"] = f"{PRIVATE_PREFIX}{os.getpid()}"
        env["HADAR_DEVCLUSTER_PORT"] = str(_free_port_base(2 + len(_nodes_conf())))
        own = True
    cluster_dir = Path(env["HADAR_DEVCLUSTER_DIR"])
    try:
        if own:
            up = _script("up", env, timeout=180)
            if up.returncode != 0:
                pytest.fail(f"dev-cluster.sh up failed ({up.returncode}):\n{up.stderr[-3000:]}")
        conf = cluster_dir / "etc" / "slurm.conf"
        yield DevCluster(cluster_dir, env, SlurmRunner(conf, timeout=30))
    finally:
        if own:
            down = _script("down", env, timeout=120)
            if not explicit:
                if down.returncode == 0:
                    shutil.rmtree(cluster_dir, ignore_errors=True)
                else:  # leave it for the next session's _reap_stale, and say so
                    print(f"dev-cluster.sh down failed:\n{down.stderr}")


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


def submit(cluster: DevCluster, **options: object) -> int:
    out = cluster.runner.run(commands.sbatch(**options))  # type: ignore[arg-type]
    return parse_sbatch_parsable(out.stdout)


# ------------------------------------------------------------------ tests


def test_nodes_idle_with_their_gpu_types(dev_cluster: DevCluster) -> None:
    nodes = {n.name: n for n in
             parse_sinfo_json(dev_cluster.runner.run(commands.sinfo_json()).stdout)}
    expect = _nodes_conf()
    assert set(expect) == {"node1", "node2", "node3", "node4"}
    assert sorted(nodes) == sorted(expect)
    for name, (gpu_type, gpus) in expect.items():
        node = nodes[name]
        assert node.state == "IDLE" and node.state_flags == (), node
        assert (node.gpu_type, node.gpus, node.gpus_used) == (gpu_type, gpus, 0)
        assert gpu_type in node.features


def test_typed_constraint_job_runs_on_node2(dev_cluster: DevCluster, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    out = tmp_path / "job.out"
    job_id = submit(
        dev_cluster, wrap='echo "host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES"',
        gres="gpu:1", constraint="p100", job_name="hadar-it-p100", chdir=str(tmp_path),
        output=str(out), comment="hadar:test=p100")
    job = wait_job(dev_cluster, job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=30)
    assert job.state == "COMPLETED", job
    assert job.node_names == ("node2",) and job.features == "p100"
    assert job.gres[0].count == 1 and job.comment == "hadar:test=p100"
    assert out.read_text().split() == ["host=node2", "gpus=0"]


def test_held_job_retargeted_then_released(dev_cluster: DevCluster, tmp_path: Path) -> None:
    # The form that works on 22.05 (SchedMD bug 17184): untyped GPUs plus a node feature; the
    # pending job is moved by NodeList+Features, then released.
    job_id = submit(dev_cluster, wrap="sleep 1", gres="gpu:2", constraint="v100", hold=True,
                    job_name="hadar-it-held", chdir=str(tmp_path), output="/dev/null")
    job = wait_job(dev_cluster, job_id, {"PENDING"}, timeout=10)
    assert job.held and job.node_names == (), job
    time.sleep(1)
    assert jobs(dev_cluster)[job_id].state == "PENDING"  # stays held

    dev_cluster.runner.run(commands.scontrol_update_job(
        job_id, {"NodeList": "node2", "Features": "p100", "AdminComment": "hadar:placed=node2"}))
    job = jobs(dev_cluster)[job_id]
    assert job.features == "p100" and job.admin_comment == "hadar:placed=node2" and job.held
    shown = parse_scontrol_show(
        dev_cluster.runner.run(commands.scontrol_show_job(job_id)).stdout)
    assert shown["ReqNodeList"] == "node2" and shown["JobState"] == "PENDING"

    dev_cluster.runner.run(commands.scontrol_release(job_id))
    job = wait_job(dev_cluster, job_id, {"RUNNING", "COMPLETED"}, timeout=30)
    assert job.node_names == ("node2",)
    assert wait_job(dev_cluster, job_id, {"COMPLETED"}, timeout=30).gpus_per_node == 2


def test_cancel_and_command_errors(dev_cluster: DevCluster, tmp_path: Path) -> None:
    job_id = submit(dev_cluster, wrap="sleep 300", gres="gpu:k80:1", chdir=str(tmp_path),
                    output="/dev/null")
    wait_job(dev_cluster, job_id, {"RUNNING"}, timeout=30)
    dev_cluster.runner.run(commands.scancel(job_id))
    assert wait_job(dev_cluster, job_id, {"CANCELLED"}, timeout=30).node_names == ("node3",)
    with pytest.raises(SlurmCommandError) as exc:
        dev_cluster.runner.run(commands.scontrol_release(999999))
    assert exc.value.returncode != 0 and "scontrol release 999999" in str(exc.value)
    assert "Invalid job id" in exc.value.stderr


def test_up_is_idempotent_and_status(dev_cluster: DevCluster) -> None:
    again = _script("up", dev_cluster.env, timeout=60)
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stderr
    assert again.stdout.strip() == f"export SLURM_CONF={dev_cluster.dir}/etc/slurm.conf"
    status = _script("status", dev_cluster.env, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "slurmctld" in status.stdout and "node4" in status.stdout

