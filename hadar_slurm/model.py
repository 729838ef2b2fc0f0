"""The domain: GPU types, nodes, the cluster, and deep-learning jobs.

These are plain frozen dataclasses.  The hot paths (policies, the compiled core) work on the
array views built from them (:class:`hadar_slurm.policy.base.Snapshot`), never on these objects
one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

GpuType = str
"""A GPU type is its Slurm type name, lower case: ``v100``, ``p100``, ``k80``, ``a100``..."""


def normalize_gpu_type(name: str) -> GpuType:
    """Return the canonical (lower-case, stripped) name of a GPU type."""
    return name.strip().lower()


@dataclass(frozen=True)
class Node:
    """A server with ``gpus`` GPUs, all of one ``gpu_type`` (as Slurm nodes in a GPU partition)."""

    name: str
    gpu_type: GpuType
    gpus: int


@dataclass(frozen=True)
class ClusterSpec:
    """The nodes of a cluster, in a stable order; GPU types in the order they were first named."""

    nodes: tuple[Node, ...]
    gpu_types: tuple[GpuType, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.gpu_types:
            seen: list[GpuType] = []
            for node in self.nodes:
                if node.gpu_type not in seen:
                    seen.append(node.gpu_type)
            object.__setattr__(self, "gpu_types", tuple(seen))

    def capacity(self, gpu_type: GpuType) -> int:
        """Total GPUs of ``gpu_type``."""
        return sum(n.gpus for n in self.nodes if n.gpu_type == gpu_type)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def describe(self) -> str:
        """``4 v100 + 4 p100 + 4 k80 on 12 nodes``."""
        parts = [f"{self.capacity(t)} {t}" for t in self.gpu_types]
        return f"{' + '.join(parts)} on {len(self.nodes)} nodes"

    @staticmethod
    def uniform(counts: Sequence[tuple[GpuType, int]], gpus_per_node: int = 1) -> ClusterSpec:
        """A cluster with ``count`` GPUs of each type on nodes of ``gpus_per_node`` GPUs.

        With the default of one GPU per node this is the cluster of Gavel's simulations.
        """
        nodes: list[Node] = []
        for gpu_type, count in counts:
            full, rest = divmod(count, gpus_per_node)
            sizes = [gpus_per_node] * full + ([rest] if rest else [])
            for i, size in enumerate(sizes):
                nodes.append(Node(f"{gpu_type}-{i:03d}", gpu_type, size))
        return ClusterSpec(tuple(nodes), tuple(t for t, _ in counts))


@dataclass(frozen=True)
class Job:
    """A training job as the scheduler sees it.

    ``job_type`` plus ``scale_factor`` is the key of the throughput table (Gavel's convention:
    e.g. ``ResNet-50 (batch size 64)`` on 4 GPUs).  ``total_steps`` is the work in iterations;
    ``scale_factor`` is the most workers (GPUs) it uses at once.  ``sync`` says whether workers
    step together (data-parallel, the slowest sets the pace), the default, or asynchronously.
    """

    job_id: int
    job_type: str
    scale_factor: int
    total_steps: float
    arrival_s: float
    weight: float = 1.0
    sync: bool = True
    slo_s: float | None = None
