"""Two jobs on one GPU through Slurm's ``gres/shard`` (issue #16, the Slurm side): a prototype
that nothing in the epoch loop calls yet.  docs/sharing.md has the findings and the design.

What Slurm does with shards, seen on 22.05.8, 24.11.5 and 26.05.5 (tests/test_shard_cluster.py,
captures in tests/data/slurm/shard/), with ``Name=shard Count=S File=<the GPU's device file>``
per GPU in gres.conf:

- A job's shards on a node all come from one GPU (without ``MULTIPLE_SHARING_GRES_PJ``, 24.05+),
  and Slurm takes the **lowest-index** GPU that is not given whole to a job and has enough free
  shards (first fit; not the fullest GPU).  Which GPU a job gets cannot be asked for (a per-GPU
  shard ``Type=`` is refused by slurmd: the shards take their GPU's type), only predicted.
- Shards and whole GPUs exclude each other: a GPU with a shard in use is not given as
  ``gres/gpu``, and a GPU given as ``gres/gpu`` has no shards to give.
- A pending job's request may be rewritten (``scontrol update TresPerNode=gres:shard:K``) from
  GPUs to shards and back on 24.11 and 26.05; 22.05 refuses to turn a ``gpu`` request into a
  ``shard`` one or back ("Invalid generic resource (gres) specification"), and stores the
  ``gres/`` spelling without applying it (the job then runs on what it asked before).

So two jobs placed together on a node (both updated, then released in one request) share one
GPU exactly when the GPU first fit gives the first still has room for the second after it
(:func:`pair_gpu`), and nothing else takes shards there in between.  :func:`place_pair` checks
that against the node's GPUs as the jobs running there hold them (:func:`node_gpus`), and
refuses, changing nothing, where it does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hadar_slurm.slurm import SlurmJob, SlurmNode, SlurmRunner, commands
from hadar_slurm.slurm.parse import (
    PENDING_STATES,
    RUNNING_STATES,
    GresUse,
    expand_hostlist,
    parse_gres_use,
)
from hadar_slurm.slurm.version import SlurmVersion

#: Job states in which a job holds what it was given on its nodes.
HOLDING_STATES = RUNNING_STATES | {"COMPLETING"}


class ShardError(Exception):
    """A pair cannot be placed on one GPU of the node (the reason says why); nothing was
    changed in Slurm."""


@dataclass(frozen=True)
class GpuShards:
    """One GPU of a node as shards: its ``index``, the shards configured on it (``total``), those
    held by jobs (``used``), and whether it is given ``whole`` to a job (``gres/gpu``), which
    leaves none of its shards to have."""

    index: int
    total: int
    used: int = 0
    whole: bool = False

    @property
    def free(self) -> int:
        return 0 if self.whole else max(0, self.total - self.used)


def shards_per_gpu(node: SlurmNode) -> int:
    """The shards configured on each GPU of ``node`` (0: none; the dev cluster and
    docs/sharing.md configure the same count on every GPU of a node)."""
    shards = sum(g.count for g in node.gres if g.name == "shard")
    return shards // node.gpus if node.gpus else 0


def asks_for_shards(job: SlurmJob) -> bool:
    """Whether ``job`` asks for shards of a GPU (``gres/shard``) rather than whole GPUs: while
    it runs it may share its GPU with another job."""
    return any(g.name == "shard" for g in job.gres)


def job_gres_on(job: SlurmJob, node: str) -> tuple[GresUse, ...]:
    """What ``job`` holds on ``node`` by GPU index (its ``gres_detail`` entry for that node)."""
    for name, detail in zip(job.node_names, job.gres_detail, strict=False):
        if name == node:
            return parse_gres_use(detail, source=f"job {job.job_id}", field="gres_detail")
    return ()


def job_shards_on(job: SlurmJob, node: str) -> dict[int, int]:
    """GPU index -> shards ``job`` holds there on ``node``.  22.05 prints only the index
    (``shard:2(IDX:0)``): a job's shards on a node come from one GPU, so the count is the
    job's; several indices without counts (which 22.05 never gives) raise :class:`ShardError`."""
    out: dict[int, int] = {}
    for use in job_gres_on(job, node):
        if use.name != "shard":
            continue
        if all(count is not None for _, count in use.used):
            for index, count in use.used:
                out[index] = out.get(index, 0) + (count or 0)
        elif len(use.used) == 1:
            out[use.used[0][0]] = out.get(use.used[0][0], 0) + use.count
        else:
            raise ShardError(f"job {job.job_id} holds shards of several GPUs of {node} "
                             f"without their counts ({use})")
    return out


def node_gpus(node: SlurmNode, jobs: Iterable[SlurmJob]) -> tuple[GpuShards, ...]:
    """Each GPU of ``node`` with its shards in use and whether it is given whole, from the
    ``gres_detail`` of the jobs that hold something there (``squeue --json``: exact per job on
    every release, unlike the node's ``gres_used``, whose shard count on 22.05 is not the
    shards')."""
    total = shards_per_gpu(node)
    used = dict.fromkeys(range(node.gpus), 0)
    whole: set[int] = set()
    for job in jobs:
        if job.state not in HOLDING_STATES or node.name not in job.node_names:
            continue
        for use in job_gres_on(job, node.name):
            if use.name == "gpu":
                whole.update(use.indices)
        for index, count in job_shards_on(job, node.name).items():
            used[index] = used.get(index, 0) + count
    return tuple(GpuShards(i, total, used.get(i, 0), i in whole) for i in range(node.gpus))


def waiting_for(node: SlurmNode, jobs: Iterable[SlurmJob]) -> list[int]:
    """The shard jobs among ``jobs`` that Slurm may start on ``node`` at any moment (pending,
    not held, asking for shards, and not kept off ``node`` by a node list): while one waits,
    which GPU a new pair's jobs get there cannot be foreseen.  A shard job placed on another
    node does not count."""
    return [j.job_id for j in jobs if j.state in PENDING_STATES and not j.held
            and any(g.name == "shard" for g in j.gres)
            and (not j.required_nodes or node.name in expand_hostlist(j.required_nodes))]


def busy_gpus(node: SlurmNode) -> frozenset[int]:
    """The GPU indices of ``node`` that are given to jobs, whole or as shards, from its
    ``gres_used`` alone (one ``sinfo --json``; every release prints the indices).  The rest of
    the sidecar counts ``gres/gpu`` only (:attr:`SlurmNode.gpus_used`), to which a GPU whose
    shards are in use looks free: with sharing on, this is what is not free."""
    busy: set[int] = set()
    for use in parse_gres_use(node.gres_used_text, source=f"node {node.name}",
                              field="gres_used"):
        if use.name in ("gpu", "shard"):
            busy.update(use.indices)
            busy.update(use.whole)
    return frozenset(busy)


def shard_holders(node: str, jobs: Iterable[SlurmJob]) -> dict[int, tuple[int, ...]]:
    """GPU index -> the jobs holding shards of it on ``node`` (sorted ids): the GPUs that are
    shared (two or more jobs) and by whom."""
    out: dict[int, list[int]] = {}
    for job in jobs:
        if job.state in HOLDING_STATES and node in job.node_names:
            for index in job_shards_on(job, node):
                out.setdefault(index, []).append(job.job_id)
    return {i: tuple(sorted(ids)) for i, ids in sorted(out.items())}


def first_fit(gpus: Sequence[GpuShards], count: int) -> int | None:
    """The GPU Slurm gives a job asking ``count`` shards on this node: the lowest index with
    that many free (None: none has)."""
    return next((g.index for g in gpus if g.free >= count), None)


def pair_gpu(gpus: Sequence[GpuShards], count: int = 1) -> int | None:
    """The GPU two jobs of ``count`` shards each, started together on this node, both get, or
    None when they would not get the same one (the first's GPU has no room left for the
    second, and first fit then gives the second another GPU, or none)."""
    first = first_fit(gpus, count)
    if first is None:
        return None
    after = [replace(g, used=g.used + count) if g.index == first else g for g in gpus]
    return first if first_fit(after, count) == first else None


def gres_prefix(version: SlurmVersion) -> str:
    """How a gres is spelled in ``TresPerNode=``: ``gres:`` on 22.05 (which stores ``gres/``
    without applying it), ``gres/`` on 24.11 and later (which read both)."""
    return "gres:" if (version.major, version.minor) <= (22, 5) else "gres/"


def pair_fields(node: SlurmNode, count: int, version: SlurmVersion) -> dict[str, str]:
    """The ``scontrol update`` fields that put a pending job on ``node`` with ``count`` shards
    (one node; the node's GPU type as the job's feature, as a placement writes it)."""
    fields = {"NumNodes": "1", "NodeList": node.name,
              "TresPerNode": f"{gres_prefix(version)}shard:{count}"}
    if node.gpu_type:
        fields["Features"] = node.gpu_type
    return fields


def pair_commands(a: SlurmJob, b: SlurmJob, node: SlurmNode, jobs: Sequence[SlurmJob],
                  version: SlurmVersion, count: int = 1) -> tuple[int, list[list[str]]]:
    """The GPU index the pending, held jobs ``a`` and ``b`` will share on ``node`` and the
    commands that place them there (an update of each, then one release of both); raises
    :class:`ShardError` when they cannot be placed so.  ``jobs``: every job Slurm lists now
    (``squeue --json``), for what the node's GPUs hold.  Pure."""
    if a.job_id == b.job_id:
        raise ShardError(f"a pair needs two jobs, got job {a.job_id} twice")
    if count < 1:
        raise ShardError(f"each job needs at least one shard, got {count}")
    per_gpu = shards_per_gpu(node)
    if per_gpu < 2 * count:
        raise ShardError(f"{node.name} has {per_gpu} shards per GPU, not the {2 * count} that "
                         f"two jobs of {count} need (docs/sharing.md: enabling sharing)")
    for job in (a, b):
        if job.state not in PENDING_STATES or not job.held:
            raise ShardError(f"job {job.job_id} is {job.state} ({job.state_reason}), not "
                             "pending and held")
        if (version.major, version.minor) <= (22, 5) and job.gpus_per_node:
            raise ShardError(
                f"job {job.job_id} asks for whole GPUs ({job.gres}): Slurm {version} cannot "
                "turn that into shards (submit sharing jobs as shards: docs/sharing.md)")
    others = [j for j in jobs if j.job_id not in (a.job_id, b.job_id)]
    waiting = waiting_for(node, others)
    if waiting:
        raise ShardError(f"shard jobs {waiting} wait for {node.name} too: which GPU each pair "
                         "job gets cannot be foreseen")
    gpus = node_gpus(node, others)
    gpu = pair_gpu(gpus, count)
    if gpu is None:
        free = {g.index: g.free for g in gpus}
        raise ShardError(f"no GPU of {node.name} would take both jobs (free shards by GPU "
                         f"{free}: first fit gives the first job a GPU without room for the "
                         "second)")
    fields = pair_fields(node, count, version)
    return gpu, [commands.scontrol_update_job(a.job_id, fields),
                 commands.scontrol_update_job(b.job_id, fields),
                 commands.scontrol_release_jobs([a.job_id, b.job_id])]


def place_pair(runner: SlurmRunner, a: SlurmJob, b: SlurmJob, node: SlurmNode,
               jobs: Sequence[SlurmJob], version: SlurmVersion, count: int = 1) -> int:
    """Place the pending, held jobs ``a`` and ``b`` on one GPU of ``node``, ``count`` shards
    each: both requests are rewritten, then both are released in one request; the GPU index
    they will share is returned.  Nothing is released unless both updates took; a refusal
    (:class:`ShardError`) changes nothing.  Check where they run with :func:`job_shards_on`
    once they do."""
    gpu, argvs = pair_commands(a, b, node, jobs, version, count)
    for argv in argvs:
        runner.run(argv)
    return gpu


def shared_gpu(a: SlurmJob, b: SlurmJob, node: str) -> int | None:
    """The GPU index ``a`` and ``b`` (running) both hold shards of on ``node``, or None."""
    common = set(job_shards_on(a, node)) & set(job_shards_on(b, node))
    return min(common) if common else None
