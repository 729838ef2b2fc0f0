"""Cluster specs: ``V100:P100:K80`` counts (``4:4:4``), named counts, or a TOML cluster file.

``4:4:4`` is Gavel's simulated cluster: 4 V100, 4 P100 and 4 K80 GPUs, one GPU per server.
Named counts give any types: ``v100=4:a100=8`` is 4 V100 and 8 A100 GPUs, one per node;
``NxG`` is N nodes of G GPUs each, so ``h100=2x8:a100=4x8:v100=8x4`` has two 8-GPU H100 nodes,
four 8-GPU A100 nodes and eight 4-GPU V100 nodes.
A cluster file names any GPU types, as groups of identical nodes::

    # cluster.toml
    [[nodes]]
    gpu_type = "a100"   # the Slurm GPU type name
    gpus = 8            # GPUs per node
    count = 2           # how many such nodes (default 1)
    name = "dgx"        # node name prefix (default: the GPU type)

    [[nodes]]
    gpu_type = "v100"
    gpus = 4
    count = 4
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from hadar_slurm.errors import InputError
from hadar_slurm.model import ClusterSpec, Node, normalize_gpu_type

DEFAULT_TYPES = ("v100", "p100", "k80")
NODE_KEYS = {"gpu_type", "gpus", "count", "name"}


def _count(num: str, gpu: str, spec: str, source: str) -> tuple[int, int]:
    """``"8"`` -> (8 nodes, 1 GPU each); ``"2x8"`` -> (2 nodes, 8 GPUs each)."""
    nodes_text, sep, per_text = num.strip().partition("x")
    try:
        nodes, per = int(nodes_text), (int(per_text) if sep else 1)
    except ValueError:
        nodes = per = -1
    if nodes < 0 or per < 1:
        raise InputError(
            f"{gpu.upper()} count {num!r} in {spec!r} is not a whole number >= 0 (GPUs, one "
            "per node) or NxG (N nodes of G GPUs)", source=source, field="cluster",
            fix="e.g. 4:4:4 for 4 V100, 4 P100, 4 K80, or h100=2x8:v100=4")
    return nodes, per


def parse_counts(spec: str, source: str = "--cluster") -> ClusterSpec:
    """``4:4:4`` (V100:P100:K80, one GPU per node), ``v100=4:a100=8`` with names, or
    ``h100=2x8:v100=8`` (``NxG``: N nodes of G GPUs)."""
    parts = spec.split(":")
    counts: list[tuple[str, int, int]] = []
    for i, part in enumerate(parts):
        part = part.strip()
        if "=" in part:
            name, _, num = part.partition("=")
            gpu = normalize_gpu_type(name)
        else:
            if len(parts) > len(DEFAULT_TYPES):
                raise InputError(
                    f"{spec!r} has {len(parts)} counts but only V100:P100:K80 are implied",
                    source=source, field="cluster", fix="name the types, e.g. v100=4:a100=8",
                )
            gpu, num = DEFAULT_TYPES[i], part
        if not gpu:
            raise InputError(f"empty GPU type in {spec!r}", source=source, field="cluster")
        counts.append((gpu, *_count(num, gpu, spec, source)))
    names = [g for g, _, _ in counts]
    if len(set(names)) != len(names):
        raise InputError(f"a GPU type appears twice in {spec!r}", source=source, field="cluster")
    kept = [(g, n, per) for g, n, per in counts if n > 0]
    if not kept:
        raise InputError(f"{spec!r} has no GPUs", source=source, field="cluster")
    nodes = tuple(Node(f"{g}-{k:03d}", g, per) for g, n, per in kept for k in range(n))
    return ClusterSpec(nodes, tuple(g for g, _, _ in kept))


def load_cluster_file(path: str | Path) -> ClusterSpec:
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read cluster file: {exc.strerror}", source=source) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", source=source) from None
    unknown = set(data) - {"nodes"}
    if unknown:
        raise InputError(
            f"unknown key {sorted(unknown)[0]!r}", source=source, field=sorted(unknown)[0],
            fix="a cluster file has only [[nodes]] tables",
        )
    groups = data.get("nodes")
    if not isinstance(groups, list) or not groups:
        raise InputError("no [[nodes]] tables", source=source, field="nodes",
                         fix="add [[nodes]] with gpu_type, gpus and count")
    nodes: list[Node] = []
    for i, group in enumerate(groups):
        where = f"nodes[{i}]"
        bad = set(group) - NODE_KEYS
        if bad:
            raise InputError(f"unknown key {sorted(bad)[0]!r}", source=source,
                             field=f"{where}.{sorted(bad)[0]}",
                             fix="keys are " + ", ".join(sorted(NODE_KEYS)))
        gpu = group.get("gpu_type")
        if not isinstance(gpu, str) or not gpu.strip():
            raise InputError("missing or empty", source=source, field=f"{where}.gpu_type",
                             fix='e.g. gpu_type = "a100"')
        gpu = normalize_gpu_type(gpu)
        for key, default in (("gpus", None), ("count", 1)):
            value = group.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"must be a whole number >= 1, got {value!r}", source=source,
                                 field=f"{where}.{key}")
        prefix = group.get("name", gpu)
        if not isinstance(prefix, str) or not prefix:
            raise InputError("must be a non-empty string", source=source, field=f"{where}.name")
        for k in range(group.get("count", 1)):
            nodes.append(Node(f"{prefix}-{k:03d}", gpu, group["gpus"]))
    names = [n.name for n in nodes]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InputError(f"node name {sorted(dup)[0]!r} appears twice", source=source,
                         field="nodes.name", fix="give each group its own name prefix")
    return ClusterSpec(tuple(nodes))


def load_cluster(spec: str) -> ClusterSpec:
    """A cluster from ``--cluster``: a file path if one exists, else ``N:N:N`` counts."""
    if Path(spec).is_file():
        return load_cluster_file(spec)
    if spec.endswith(".toml") or "/" in spec:
        raise InputError("no such cluster file", source=spec, field="cluster",
                         fix="give a TOML cluster file or counts such as 4:4:4")
    return parse_counts(spec)
