#!/usr/bin/env python3
"""Render the Slurm configuration of hadar-slurm's test clusters from one source.

The one source is this directory: ``nodes.conf`` (the node list), ``slurm.conf.in``,
``gres.conf.in`` and ``prolog.sh.in`` (the templates) and ``job_submit.lua``.  Two targets are
rendered from it:

``local``
    the loopback dev cluster of ``dev-cluster.sh``: every node on 127.0.0.1 with its own port
    (``--port BASE``: slurmctld on BASE, slurmd's default BASE+1, node *i* on BASE+2+i).
``compose``
    the docker-compose cluster (``docker-compose.yml``): one container per daemon, each addressed
    by its hostname (``slurmctld``, the node names), on Slurm's default ports 6817/6818.

Given the same ``--dir`` and ``--lua``, the two ``slurm.conf`` files differ only in the keys of
:data:`TARGET_KEYS` and ``NodeName`` lines only in :data:`TARGET_NODE_KEYS`; ``gres.conf``,
``prolog.sh`` (a fault drill) and ``job_submit.lua`` are the same (``tests/test_compose.py``
checks this).  ``docker-compose.yml`` itself is rendered from ``nodes.conf`` too
(``compose-file``), and its containers render their
``slurm.conf`` at start from this directory, mounted read-only (``docker/entrypoint.sh``).

Usage::

    render.py nodes                               the validated node list, one per line:
                                                  name gpu_type gpus cpus mem_mb
    render.py local --dir DIR --port BASE [--lua] --out ETC
    render.py compose --dir DIR --out ETC         (job_submit.lua always on)
    render.py check-node NAME GPU_TYPE GPUS       exit 0 when nodes.conf has exactly that node
    render.py compose-file [--check] [PATH]       write docker-compose.yml (default: the
                                                  repository's); --check: fail if it differs

This script uses the standard library only (Python >= 3.11): it runs inside the Slurm
containers, where hadar-slurm is not installed, which is also why its errors are its own
:class:`ConfigError` (``render.py: error: nodes.conf:3: field 'gpus': ...``, exit status 2)
rather than ``hadar_slurm.errors.InputError``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
COMPOSE_FILE = REPO / "docker-compose.yml"

#: slurm.conf keys whose values depend on the target (everything else is shared).
TARGET_KEYS = ("SlurmctldHost", "SlurmctldPort", "SlurmdPort")
#: NodeName-line keys whose values depend on the target.
TARGET_NODE_KEYS = ("NodeAddr", "Port")

COMPOSE_CTLD_HOST = "slurmctld"
COMPOSE_CTLD_PORT = 6817
COMPOSE_SLURMD_PORT = 6818
#: Where the containers mount this directory, and the cluster's state dir inside them.
COMPOSE_SRC = "/opt/hadar/slurm_conf"
COMPOSE_DIR = "/srv/hadar-cluster"
#: The sidecar's config in the compose cluster: the dev cluster's, from the mounted directory.
COMPOSE_SIDECAR_CONFIG = f"{COMPOSE_SRC}/dev-sidecar.toml"
SLURM_IMAGE = "hadar-slurm/slurm:22.05"
SIDECAR_IMAGE = "hadar-slurm/sidecar:latest"

_NAME = re.compile(r"[a-z][a-z0-9-]*")
_GPU_TYPE = re.compile(r"[a-z0-9_]+")
_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


class ConfigError(ValueError):
    """A problem with an input of the renderer, located and with a fix."""

    def __init__(self, problem: str, source: str, line: int | None = None,
                 field: str | None = None, fix: str | None = None) -> None:
        self.problem, self.source, self.line, self.field, self.fix = (
            problem, source, line, field, fix)
        where = source if line is None else f"{source}:{line}"
        text = f"{where}: " + (f"field '{field}': " if field else "") + problem
        super().__init__(text + (f" ({fix})" if fix else ""))


@dataclass(frozen=True)
class Node:
    """One line of nodes.conf."""

    name: str
    gpu_type: str
    gpus: int
    cpus: int
    mem_mb: int


@dataclass(frozen=True)
class Target:
    """What differs between the clusters: how slurmctld and each node are addressed."""

    name: str
    dir: str  # the cluster's state dir (@DIR@): etc/ run/ log/ state/ dev/
    ctld_host: str
    ctld_port: int
    slurmd_port: int
    lua: bool
    #: gres/shard per GPU (0: no shards, the default).  With N > 0 every GPU also counts as N
    #: shards (``GresTypes=gpu,shard``, node ``Gres=gpu:TYPE:G,shard:G*N``, one gres.conf
    #: ``Name=shard Count=N File=...nvidiaK`` line per GPU), so that jobs asking ``--gres=shard:K``
    #: may share a GPU (docs/sharing.md).
    shards: int = 0

    def node_addr(self, index: int, node: Node) -> tuple[str, int]:
        """(NodeAddr, Port) of the index-th node of nodes.conf."""
        if self.name == "local":
            return "127.0.0.1", self.ctld_port + 2 + index
        return node.name, self.slurmd_port


def local_target(state_dir: str, port: int, lua: bool, shards: int = 0) -> Target:
    if not state_dir.startswith("/"):
        raise ConfigError(f"state dir must be an absolute path, got {state_dir!r}",
                          "render.py local",
                          field="--dir", fix="e.g. /tmp/hadar-devcluster")
    if not 1024 <= port <= 65000:
        raise ConfigError(f"port base must be in 1024..65000, got {port}", "render.py local",
                          field="--port", fix="HADAR_DEVCLUSTER_PORT, default 17810")
    if not 0 <= shards <= 64:
        raise ConfigError(f"shards per GPU must be in 0..64, got {shards}", "render.py local",
                          field="--shards", fix="HADAR_DEVCLUSTER_SHARDS, default 0 (none)")
    return Target("local", state_dir, "localhost(127.0.0.1)", port, port + 1, lua, shards)


def compose_target(state_dir: str = COMPOSE_DIR) -> Target:
    if not state_dir.startswith("/"):
        raise ConfigError(f"state dir must be an absolute path, got {state_dir!r}",
                          "render.py compose", field="--dir", fix=f"e.g. {COMPOSE_DIR}")
    return Target("compose", state_dir, COMPOSE_CTLD_HOST, COMPOSE_CTLD_PORT, COMPOSE_SLURMD_PORT,
                  lua=True)


def read_nodes(path: Path = HERE / "nodes.conf") -> list[Node]:
    """The nodes of ``path`` (columns ``name gpu_type gpus cpus mem_mb``), validated."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror}", str(path),
                          fix="slurm_conf/nodes.conf lists the test clusters' nodes") from None
    nodes: list[Node] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        src = path.name
        if len(fields) != 5:
            raise ConfigError(f"want 5 fields, got {len(fields)}", src, lineno,
                              fix="columns: name gpu_type gpus cpus mem_mb")
        name, gpu_type = fields[0], fields[1]
        if not _NAME.fullmatch(name):
            raise ConfigError(f"bad node name {name!r}", src, lineno, "name",
                              "a lower-case letter, then letters, digits or '-'")
        if name in seen or name == COMPOSE_CTLD_HOST or name == "sidecar":
            raise ConfigError(f"node name {name!r} is used twice or reserved", src, lineno,
                              "name", f"names are unique, not {COMPOSE_CTLD_HOST} or sidecar")
        if not _GPU_TYPE.fullmatch(gpu_type):
            raise ConfigError(f"bad GPU type {gpu_type!r}", src, lineno, "gpu_type",
                              "lower-case letters, digits and '_', e.g. v100")
        numbers: list[int] = []
        for column, value in zip(("gpus", "cpus", "mem_mb"), fields[2:], strict=True):
            if not re.fullmatch(r"[1-9][0-9]*", value):
                raise ConfigError(f"want a positive whole number, got {value!r}", src, lineno,
                                  column, "e.g. 4")
            numbers.append(int(value))
        seen.add(name)
        nodes.append(Node(name, gpu_type, numbers[0], numbers[1], numbers[2]))
    if not nodes:
        raise ConfigError("lists no nodes", path.name, fix="add a line: name gpu_type gpus "
                          "cpus mem_mb")
    return nodes


def fill(template: str, source: str, values: dict[str, str]) -> str:
    """``template`` with every ``@KEY@`` replaced; an unknown placeholder outside a comment
    (comments may mention them) is an error."""
    for lineno, line in enumerate(template.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for found in _PLACEHOLDER.findall(line):
            if found.strip("@") not in values:
                raise ConfigError(f"unknown placeholder {found}", source, lineno,
                                  fix="known: " + ", ".join(f"@{k}@" for k in sorted(values)))
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    return template if template.endswith("\n") else template + "\n"


def render(target: Target, nodes: Sequence[Node], src: Path = HERE) -> dict[str, str]:
    """File name -> text of the target's configuration (slurm.conf, gres.conf and, with lua,
    job_submit.lua, which Slurm reads beside slurm.conf)."""
    node_lines, gres_lines = [], []
    shards = target.shards
    for i, n in enumerate(nodes):
        addr, port = target.node_addr(i, n)
        gres = f"gpu:{n.gpu_type}:{n.gpus}" + (f",shard:{n.gpus * shards}" if shards else "")
        node_lines.append(
            f"NodeName={n.name} NodeAddr={addr} Port={port} CPUs={n.cpus} "
            f"RealMemory={n.mem_mb} Gres={gres} Feature={n.gpu_type} "
            "State=UNKNOWN")
        gres_lines.append(f"NodeName={n.name} Name=gpu Type={n.gpu_type} "
                          f"File={target.dir}/dev/{n.name}/nvidia[0-{n.gpus - 1}]")
        # one line per GPU: its shards are on that device file (shard index k -> GPU k)
        gres_lines += [f"NodeName={n.name} Name=shard Count={shards} "
                       f"File={target.dir}/dev/{n.name}/nvidia{k}"
                       for k in range(n.gpus) if shards]
    common = {"DIR": target.dir, "CTLD_HOST": target.ctld_host,
              "CTLD_PORT": str(target.ctld_port), "SLURMD_PORT": str(target.slurmd_port)}
    out = {
        "slurm.conf": fill((src / "slurm.conf.in").read_text(), "slurm.conf.in", {
            **common, "NODES": "\n".join(node_lines),
            "GRES_TYPES": "gpu,shard" if shards else "gpu",
            "JOB_SUBMIT": "JobSubmitPlugins=lua" if target.lua else ""}),
        "gres.conf": fill((src / "gres.conf.in").read_text(), "gres.conf.in",
                          {**common, "GRES": "\n".join(gres_lines)}),
    }
    out["prolog.sh"] = fill((src / "prolog.sh.in").read_text(), "prolog.sh.in", common)
    if target.lua:
        out["job_submit.lua"] = (src / "job_submit.lua").read_text()
    return out


def write(files: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        if name.endswith(".sh"):
            tmp.chmod(0o755)  # (slurmd runs the prolog)
        tmp.replace(out / name)  # atomic: a daemon never reads half a file


# ------------------------------------------------------------------ docker-compose.yml
def compose_file(nodes: Sequence[Node]) -> str:
    """docker-compose.yml for ``nodes``: slurmctld, one slurmd container per node and the
    sidecar, on an internal network, no published ports."""
    slurm_build = ("    build:\n      context: .\n      dockerfile: docker/Dockerfile\n"
                   "      target: slurm\n")
    volumes = ("    volumes:\n"
               f"      - ./slurm_conf:{COMPOSE_SRC}:ro\n"
               "      - munge-key:/etc/hadar-munge\n"
               "      - shared:/shared\n")
    net = "    networks:\n      - slurm\n"
    out = [
        "# docker-compose.yml - a Slurm 22.05 test cluster for hadar-slurm (README: \"Try it with\n"
        "# Docker\").  GENERATED from slurm_conf/nodes.conf by `python3 slurm_conf/render.py\n"
        "# compose-file` (`make compose-file`); do not edit by hand: tests/test_compose.py fails\n"
        "# when this file and nodes.conf disagree.\n"
        "#\n"
        "# Every container mounts slurm_conf/ and renders slurm.conf, gres.conf and\n"
        "# job_submit.lua from it at start (render.py compose), the same templates as the local\n"
        "# cluster of slurm_conf/dev-cluster.sh.  Fake GPUs are symlinks to /dev/null, as there.\n"
        "# The network is internal and no port is published.\n"
        "services:\n",
        "  slurmctld:\n", f"    image: {SLURM_IMAGE}\n", slurm_build,
        f"    hostname: {COMPOSE_CTLD_HOST}\n",
        "    command: [\"slurmctld\"]\n", volumes, net,
    ]
    for n in nodes:
        out += [
            f"  {n.name}:\n", f"    image: {SLURM_IMAGE}\n", slurm_build,
            f"    hostname: {n.name}\n",
            f"    command: [\"slurmd\", \"{n.name}\"]\n",
            "    environment:\n",
            f"      HADAR_GPU_TYPE: \"{n.gpu_type}\"\n",
            f"      HADAR_GPUS: \"{n.gpus}\"\n",
            "    depends_on:\n      - slurmctld\n", volumes, net,
        ]
    out += [
        "  sidecar:\n", f"    image: {SIDECAR_IMAGE}\n",
        "    build:\n      context: .\n      dockerfile: docker/Dockerfile\n"
        "      target: sidecar\n",
        "    hostname: sidecar\n",
        "    command: [\"sidecar\"]\n",
        "    environment:\n", f"      HADAR_CONFIG: \"{COMPOSE_SIDECAR_CONFIG}\"\n",
        "    depends_on:\n      - slurmctld\n", volumes, net,
        "volumes:\n  munge-key: {}\n  shared: {}\n",
        "networks:\n  slurm:\n    internal: true\n",
    ]
    return "".join(out)


# ------------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="render.py", description="Render the test clusters' Slurm configuration from "
        "slurm_conf/ (nodes.conf, slurm.conf.in, gres.conf.in, job_submit.lua).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("nodes", help="print the validated node list: name gpu_type gpus cpus mem_mb")
    local = sub.add_parser("local", help="slurm.conf etc. of the loopback dev cluster")
    local.add_argument("--dir", required=True, help="the cluster's state dir (absolute)")
    local.add_argument("--port", required=True, type=int, help="port base (slurmctld's port)")
    local.add_argument("--lua", action="store_true", help="load job_submit.lua")
    local.add_argument("--shards", type=int, default=0,
                       help="gres/shard per GPU (default 0: no shards; docs/sharing.md)")
    local.add_argument("--out", required=True, type=Path, help="directory to write to")
    comp = sub.add_parser("compose", help="slurm.conf etc. of a docker-compose container")
    comp.add_argument("--dir", default=COMPOSE_DIR,
                      help="the cluster's state dir (default: %(default)s)")
    comp.add_argument("--out", required=True, type=Path, help="directory to write to")
    check = sub.add_parser("check-node", help="exit 0 when nodes.conf has exactly this node")
    check.add_argument("name")
    check.add_argument("gpu_type")
    check.add_argument("gpus")
    cf = sub.add_parser("compose-file", help="write docker-compose.yml from nodes.conf")
    cf.add_argument("path", nargs="?", type=Path, default=COMPOSE_FILE,
                    help="default: %(default)s")
    cf.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when the file differs from the rendering")
    args = parser.parse_args(argv)
    try:
        nodes = read_nodes()
        if args.command == "nodes":
            for n in nodes:
                print(n.name, n.gpu_type, n.gpus, n.cpus, n.mem_mb)
        elif args.command == "local":
            write(render(local_target(args.dir, args.port, args.lua, args.shards), nodes),
                  args.out)
        elif args.command == "compose":
            write(render(compose_target(args.dir), nodes), args.out)
        elif args.command == "check-node":
            want = {(n.name, n.gpu_type, str(n.gpus)) for n in nodes}
            if (args.name, args.gpu_type, args.gpus) not in want:
                raise ConfigError(
                    f"node {args.name} with {args.gpus} x {args.gpu_type} is not in nodes.conf",
                    "docker-compose.yml", fix="re-render it: python3 slurm_conf/render.py "
                    "compose-file")
        else:
            text = compose_file(nodes)
            if args.check:
                old = args.path.read_text() if args.path.exists() else ""
                if old != text:
                    print(f"render.py: {args.path} is not what nodes.conf renders; run "
                          "python3 slurm_conf/render.py compose-file", file=sys.stderr)
                    return 1
            else:
                args.path.write_text(text)
    except ConfigError as exc:
        print(f"render.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
