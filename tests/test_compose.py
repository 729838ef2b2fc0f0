"""The docker-compose cluster and the local dev cluster come from one configuration.

``slurm_conf/nodes.conf`` and the templates beside it are the one source: ``render.py`` renders
slurm.conf/gres.conf for the local cluster (through ``dev-cluster.sh render``, as ``up`` does) and
for the containers, and renders ``docker-compose.yml`` itself.  These tests fail when one side is
edited alone: a hand-edited compose file, a node added to nodes.conf without re-rendering, a key
of the local slurm.conf changed outside the documented target-specific ones.

There is no container engine here: the compose file is validated with Debian's
``docker-compose config`` (required on CI), and its services are run *emulated* on this host
(one mount+UTS namespace per service, each on its own 127.x address, running
``docker/entrypoint.sh`` with the service's command and environment) against Debian's Slurm.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.slurm_cluster import nodes_conf, not_installed

REPO = Path(__file__).resolve().parent.parent
SLURM_CONF_DIR = REPO / "slurm_conf"
COMPOSE = REPO / "docker-compose.yml"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"

# The documented target-specific keys (render.py's docstring, README "Try it with Docker").
TARGET_KEYS = {"SlurmctldHost", "SlurmctldPort", "SlurmdPort"}
TARGET_NODE_KEYS = {"NodeAddr", "Port"}


def _load_render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slurm_conf_render", SLURM_CONF_DIR / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


render = _load_render()


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _conf_lines(text: str) -> list[tuple[str, str]]:
    """slurm.conf/gres.conf lines as (first key, whole line), comments and blanks left out."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append((line.split("=", 1)[0], line))
    return out


def _pairs(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split())


# ------------------------------------------------------------------ the compose file
def test_compose_file_is_what_nodes_conf_renders() -> None:
    assert COMPOSE.read_text() == render.compose_file(render.read_nodes()), (
        "docker-compose.yml is generated: run `python3 slurm_conf/render.py compose-file`")
    check = subprocess.run([sys.executable, str(SLURM_CONF_DIR / "render.py"), "compose-file",
                            "--check"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_compose_file_check_fails_on_a_hand_edit(tmp_path: Path) -> None:
    edited = tmp_path / "docker-compose.yml"
    edited.write_text(COMPOSE.read_text().replace('HADAR_GPU_TYPE: "v100"',
                                                  'HADAR_GPU_TYPE: "h100"'))
    check = subprocess.run([sys.executable, str(SLURM_CONF_DIR / "render.py"), "compose-file",
                            "--check", str(edited)], capture_output=True, text=True, check=False)
    assert check.returncode == 1 and "render.py compose-file" in check.stderr


def test_compose_services_are_the_nodes_of_nodes_conf() -> None:
    services = _compose()["services"]
    nodes = {name: svc for name, svc in services.items() if svc["command"][0] == "slurmd"}
    seen = {name: (svc["environment"]["HADAR_GPU_TYPE"], int(svc["environment"]["HADAR_GPUS"]))
            for name, svc in nodes.items()}
    assert seen == nodes_conf()  # tests/slurm_cluster.py's own reading of nodes.conf
    assert len(seen) >= 4 and len({t for t, _ in seen.values()}) >= 4
    for name, svc in nodes.items():
        assert svc["command"] == ["slurmd", name] and svc["hostname"] == name
        assert svc["depends_on"] == ["slurmctld"]
    assert services["slurmctld"]["command"] == ["slurmctld"]
    assert services["slurmctld"]["hostname"] == render.COMPOSE_CTLD_HOST == "slurmctld"
    assert set(services) == {"slurmctld", "sidecar", *nodes}


def test_compose_services_mount_slurm_conf_and_stay_on_their_network() -> None:
    compose = _compose()
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    stages = {line.split()[-1] for line in dockerfile.splitlines()
              if line.startswith("FROM ") and " AS " in line}
    assert compose["networks"] == {"slurm": {"internal": True}}
    for name, svc in compose["services"].items():
        assert "./slurm_conf:/opt/hadar/slurm_conf:ro" in svc["volumes"], name
        assert "munge-key:/etc/hadar-munge" in svc["volumes"], name
        assert svc["networks"] == ["slurm"], name
        assert "ports" not in svc and "network_mode" not in svc, name
        assert svc["build"]["dockerfile"] == "docker/Dockerfile", name
        assert svc["build"]["target"] in stages, (name, stages)
    sidecar = compose["services"]["sidecar"]
    assert sidecar["command"] == ["sidecar"] and sidecar["build"]["target"] == "sidecar"
    config = sidecar["environment"]["HADAR_CONFIG"]
    assert config.startswith("/opt/hadar/slurm_conf/")
    assert (SLURM_CONF_DIR / config.removeprefix("/opt/hadar/slurm_conf/")).is_file()
    # the containers render their configuration from the mounted directory
    entry = ENTRYPOINT.read_text()
    assert 'python3 "$SRC/render.py" compose --dir "$DIR" --out "$DIR/etc"' in entry
    assert os.access(ENTRYPOINT, os.X_OK)
    # no configuration baked into the images: only the entrypoint (and, in the wheel stage,
    # the sources to build from) is copied
    copies = [line for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert copies == ["COPY docker/entrypoint.sh /usr/local/bin/hadar-cluster-entrypoint",
                      "COPY . /src", "COPY --from=wheel /dist/ /tmp/dist/"]


def test_docker_compose_config_validates() -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        not_installed("docker-compose is not installed (`make deps` installs Debian's)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    quiet = subprocess.run([tool, "-f", str(COMPOSE), "config", "-q"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert quiet.returncode == 0, quiet.stderr
    names = subprocess.run([tool, "-f", str(COMPOSE), "config", "--services"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=120, check=True)
    assert set(names.stdout.split()) == set(_compose()["services"])


# ------------------------------------------------------------------ slurm.conf of both targets
def test_local_and_compose_configs_differ_only_in_target_keys(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    port = 17900
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HADAR_DEVCLUSTER_")},
           "HADAR_DEVCLUSTER_DIR": str(state), "HADAR_DEVCLUSTER_PORT": str(port),
           "HADAR_DEVCLUSTER_LUA": "1"}
    # the local cluster's files, written the way `dev-cluster.sh up` writes them
    local = subprocess.run(["bash", str(SLURM_CONF_DIR / "dev-cluster.sh"), "render"], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
    assert local.returncode == 0, local.stderr
    compose_etc = tmp_path / "compose-etc"
    comp = subprocess.run([sys.executable, str(SLURM_CONF_DIR / "render.py"), "compose",
                           "--dir", str(state), "--out", str(compose_etc)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert comp.returncode == 0, comp.stderr

    a = _conf_lines((state / "etc" / "slurm.conf").read_text())
    b = _conf_lines((compose_etc / "slurm.conf").read_text())
    assert [k for k, _ in a] == [k for k, _ in b]  # same keys, same order
    differ = {ka for (ka, la), (_, lb) in zip(a, b, strict=True) if la != lb}
    assert differ == TARGET_KEYS | {"NodeName"}
    assert set(render.TARGET_KEYS) == TARGET_KEYS
    assert set(render.TARGET_NODE_KEYS) == TARGET_NODE_KEYS
    la, lb = dict(a), dict(b)  # (NodeName: the last node line; all are compared below)
    assert la["SlurmctldHost"] == "SlurmctldHost=localhost(127.0.0.1)"
    assert lb["SlurmctldHost"] == "SlurmctldHost=slurmctld"
    assert (la["SlurmctldPort"], la["SlurmdPort"]) == (f"SlurmctldPort={port}",
                                                       f"SlurmdPort={port + 1}")
    assert (lb["SlurmctldPort"], lb["SlurmdPort"]) == ("SlurmctldPort=6817", "SlurmdPort=6818")
    assert la["JobSubmitPlugins"] == lb["JobSubmitPlugins"] == "JobSubmitPlugins=lua"

    nodes_a = [_pairs(line) for k, line in a if k == "NodeName"]
    nodes_b = [_pairs(line) for k, line in b if k == "NodeName"]
    want = nodes_conf()
    assert [n["NodeName"] for n in nodes_a] == [n["NodeName"] for n in nodes_b] == list(want)
    for i, (na, nb) in enumerate(zip(nodes_a, nodes_b, strict=True)):
        name = na["NodeName"]
        assert {k for k in na if na[k] != nb[k]} == TARGET_NODE_KEYS
        assert (na["NodeAddr"], na["Port"]) == ("127.0.0.1", str(port + 2 + i))
        assert (nb["NodeAddr"], nb["Port"]) == (name, "6818")
        gpu_type, gpus = want[name]
        assert na["Gres"] == f"gpu:{gpu_type}:{gpus}" and na["Feature"] == gpu_type

    gres_a = _conf_lines((state / "etc" / "gres.conf").read_text())
    assert gres_a == _conf_lines((compose_etc / "gres.conf").read_text())
    assert len(gres_a) == len(want)
    prolog = (state / "etc" / "prolog.sh")
    assert prolog.read_text() == (compose_etc / "prolog.sh").read_text()
    assert os.access(prolog, os.X_OK) and la["Prolog"] == f"Prolog={prolog}" == lb["Prolog"]
    lua = (SLURM_CONF_DIR / "job_submit.lua").read_text()
    assert (state / "etc" / "job_submit.lua").read_text() == lua
    assert (compose_etc / "job_submit.lua").read_text() == lua


def test_render_without_lua_drops_the_plugin(tmp_path: Path) -> None:
    files = render.render(render.local_target(str(tmp_path), 17900, lua=False),
                          render.read_nodes())
    assert set(files) == {"slurm.conf", "gres.conf", "prolog.sh"}
    assert "JobSubmitPlugins" not in files["slurm.conf"]


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("line", "field", "words"), [
    ("node1 v100 4 4", None, "want 5 fields, got 4"),
    ("Node1 v100 4 4 4000", "name", "bad node name 'Node1'"),
    ("node1 V100 4 4 4000", "gpu_type", "bad GPU type 'V100'"),
    ("node1 v100 0 4 4000", "gpus", "want a positive whole number, got '0'"),
    ("node1 v100 4 4 4G", "mem_mb", "got '4G'"),
    ("slurmctld v100 4 4 4000", "name", "reserved"),
])
def test_bad_nodes_conf_names_line_and_field(
        tmp_path: Path, line: str, field: str | None, words: str) -> None:
    path = tmp_path / "nodes.conf"
    path.write_text(f"# name gpu_type gpus cpus mem_mb\nnode0 k80 2 2 2000\n{line}\n")
    with pytest.raises(render.ConfigError) as exc:
        render.read_nodes(path)
    err = exc.value
    assert (err.source, err.line, err.field) == ("nodes.conf", 3, field)
    assert words in str(err) and err.fix


def test_duplicate_node_and_empty_nodes_conf(tmp_path: Path) -> None:
    path = tmp_path / "nodes.conf"
    path.write_text("node1 v100 4 4 4000\nnode1 p100 4 4 4000\n")
    with pytest.raises(render.ConfigError, match=r"nodes.conf:2: field 'name': .* twice"):
        render.read_nodes(path)
    path.write_text("# nothing\n")
    with pytest.raises(render.ConfigError, match="lists no nodes"):
        render.read_nodes(path)


def test_unknown_placeholder_is_an_error() -> None:
    with pytest.raises(render.ConfigError, match=r"slurm.conf.in:3: unknown placeholder @PORT@"):
        render.fill("# @ANY@ in a comment is fine\nA=@DIR@\nB=@PORT@\n", "slurm.conf.in",
                    {"DIR": "/x"})


@pytest.mark.parametrize(("args", "status"), [
    (["node1", "v100", "4"], 0),
    (["node1", "p100", "4"], 2),
    (["node1", "v100", "2"], 2),
    (["node9", "v100", "4"], 2),
])
def test_check_node(args: list[str], status: int) -> None:
    # what docker/entrypoint.sh asks before a container starts slurmd for a node
    out = subprocess.run([sys.executable, str(SLURM_CONF_DIR / "render.py"), "check-node", *args],
                         capture_output=True, text=True, check=False)
    assert out.returncode == status, out.stderr
    if status:
        assert out.stderr.startswith("render.py: error: docker-compose.yml: node ")


# ------------------------------------------------------------------ the services, emulated
EMU_TOOLS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "unshare", "nsenter")
# In each service's namespace: its hostname, the cluster's /etc/hosts, no DNS beyond loopback,
# and its own state dir mounted where every container has it.
SERVICE_SH = """
hostname "$1"
mount --bind "$2" /etc/hosts
mount --bind "$3" /etc/resolv.conf
mount --bind "$4" "$5"
shift 5
exec "$@"
"""


@dataclass
class EmulatedCompose:
    dir: Path
    procs: dict[str, subprocess.Popen[bytes]]
    namespaces: dict[str, str]
    conf: Path

    def client(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm command in the slurmctld service (`docker-compose exec slurmctld ...`)."""
        pid = self.procs["slurmctld"].pid
        return subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "env",
                               f"SLURM_CONF={self.conf}", *argv],
                              capture_output=True, text=True, timeout=30, check=check)

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.out").read_text(errors="replace")


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _stop_namespaces(namespaces: set[str]) -> None:
    """SIGTERM every process in the given mount namespaces (the services'), SIGKILL those
    left after 10 s."""
    def members() -> list[int]:
        return [int(p.name) for p in Path("/proc").iterdir()
                if p.name.isdigit() and _mnt_ns(int(p.name)) in namespaces]

    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in members():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait_s
        while members() and time.monotonic() < end:
            time.sleep(0.2)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCompose]:
    missing = [t for t in EMU_TOOLS if shutil.which(t) is None]
    if os.geteuid() != 0:
        pytest.skip("the emulated compose services need root (mount/UTS namespaces)")
    if missing:
        not_installed(f"the emulated compose services need {', '.join(missing)} (`make deps`)")
    top = tmp_path_factory.mktemp("compose")
    top.chmod(0o755)
    services: dict[str, Any] = _compose()["services"]
    # one 127.X.Y.0/24 block per session; daemons bind to their hostname's address
    # (CommunicationParameters=NoInAddrAny), so 6817/6818 are taken on these addresses only
    block = f"127.{100 + os.getpid() % 100}.{1 + (os.getpid() // 100) % 250}"
    ips = {name: f"{block}.{10 + i}" for i, name in enumerate(services)}
    hosts = top / "hosts"
    hosts.write_text("127.0.0.1 localhost\n"
                     + "".join(f"{ip} {name}\n" for name, ip in ips.items()))
    resolv = top / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    cluster_dir = top / "cluster"  # every service's HADAR_CLUSTER_DIR, as /srv/... in each
    key_dir = top / "munge-key"
    for d in (cluster_dir, key_dir):
        d.mkdir()
    key_dir.chmod(0o700)
    bin_dir = Path(sys.executable).parent  # hadar-slurm of this checkout, for the sidecar
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("HADAR_", "SLURM_"))}
    base_env.update(PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                    HADAR_CLUSTER_DIR=str(cluster_dir),
                    HADAR_SLURM_CONF_SRC=str(SLURM_CONF_DIR),
                    HADAR_MUNGE_KEY_DIR=str(key_dir))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    namespaces: dict[str, str] = {}
    host_ns = _mnt_ns(os.getpid())
    emu = EmulatedCompose(top, procs, namespaces, cluster_dir / "etc" / "slurm.conf")
    try:
        for name, svc in services.items():  # slurmctld first (depends_on)
            own = top / "c" / name
            own.mkdir(parents=True)
            env = dict(base_env)
            for key, value in (svc.get("environment") or {}).items():
                env[key] = str(value).replace("/opt/hadar/slurm_conf", str(SLURM_CONF_DIR))
            with (top / f"{name}.out").open("wb") as out:
                procs[name] = subprocess.Popen(
                    ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                     "/bin/sh", "-ec", SERVICE_SH, "sh", svc["hostname"], str(hosts),
                     str(resolv), str(own), str(cluster_dir), str(ENTRYPOINT),
                     *svc["command"]],
                    env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
        end = time.monotonic() + 90
        want = nodes_conf()
        while True:
            for name, proc in procs.items():
                ns = _mnt_ns(proc.pid)
                if ns is not None and ns != host_ns:
                    namespaces[name] = ns
                if proc.poll() is not None:
                    pytest.fail(f"service {name} exited {proc.returncode}:\n{emu.log(name)}")
            info = emu.client("sinfo", "-h", "-N", "-o", "%N %t %G", check=False)
            idle = {line.split()[0]: line.split()[2] for line in info.stdout.splitlines()
                    if line.split()[1] == "idle"}
            if idle == {n: f"gpu:{t}:{g}" for n, (t, g) in want.items()} \
                    and len(namespaces) == len(procs):
                break
            if time.monotonic() > end:
                pytest.fail(f"nodes not idle after 90 s: {info.stdout}{info.stderr}\n"
                            + "\n".join(f"--- {n}\n{emu.log(n)[-1500:]}" for n in procs))
            time.sleep(0.5)
        yield emu
    finally:
        for name, proc in procs.items():
            ns = _mnt_ns(proc.pid)
            if ns is not None and ns != host_ns:
                namespaces[name] = ns
        _stop_namespaces(set(namespaces.values()))
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_emulated_compose_services_run_the_cluster_and_the_sidecar(
        emulated: EmulatedCompose) -> None:
    # every node's own config is the one it rendered from the mounted slurm_conf/
    for name in nodes_conf():
        etc = emulated.dir / "c" / name / "etc"
        assert (etc / "slurm.conf").read_text().count("SlurmctldHost=slurmctld") == 1
    # job_submit.lua is loaded: a bad hint is refused at sbatch
    bad = emulated.client("sbatch", "--comment=hadar: model=resnet51 steps=10", "--gres=gpu:1",
                          "--wrap", "true", check=False)
    assert bad.returncode != 0 and "unknown model 'resnet51'" in bad.stderr
    # a good one is parked for the sidecar, which places and starts it
    sub = emulated.client("sbatch", "--parsable", "--gres=gpu:2", "--chdir=/tmp",
                          "--output=/dev/null", "--comment=hadar: model=resnet50 bs=64 steps=400",
                          "--wrap", "sleep 60")
    job = sub.stdout.strip()
    end = time.monotonic() + 60
    row: list[str] = []
    while time.monotonic() < end:
        out = emulated.client("squeue", "-h", "-j", job, "-o", "%T %N %f").stdout.split()
        if out and out[0] == "RUNNING":
            row = out
            break
        time.sleep(0.5)
    assert row, f"job {job} never ran:\n{emulated.log('sidecar')[-3000:]}"
    node, feature = row[1], row[2]
    assert nodes_conf()[node][0] == feature  # placed by GPU type (Features=TYPE)
    log = emulated.log("sidecar")
    assert f'"job": {job}, "action": "place", "nodes": ["{node}"]' in log
    assert '"event": "epoch_failed"' not in log
