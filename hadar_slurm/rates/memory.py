"""GPU memory: whether two jobs that may share a GPU fit in its memory together (issue #16).

Gavel's pair table says which pairs of job types ran together on a GPU type (``[0, 0]``: they
did not, e.g. out of memory, on *its* GPUs).  A site's GPUs and models differ, so a pair is
offered only where the two jobs' **footprints** fit in the GPU's **memory** as well:

* a *footprint* is the most memory one worker of a job type (at a scale factor) held on one GPU,
  in MiB: ``hadar-slurm profile`` measures it on a real GPU (what NVML saw the profiling
  process hold, else the GPU's whole use, else torch's peak allocation plus
  :data:`CONTEXT_MIB`: :func:`hadar_slurm.rates.profile.footprint_mib`), and a running job's
  runtime reports it on CUDA (torch's peak reservation plus :data:`CONTEXT_MIB`), which the
  sidecar learns; both land in the throughput store;
* a GPU type's *memory* is what NVML reports as the GPU's total (``profile`` stores it), else
  :data:`KNOWN_GPU_MIB` (the smallest variant commonly sold of each type), else unknown; the
  sidecar's ``[scheduler] gpu_memory_mib`` overrides both (a site with 32 GB V100s says so).

A footprint measured on one GPU type stands for every type (the model's tensors do not depend
on the GPU); where several types measured it, the largest counts.  A pair fits when the sum of
its two footprints is at most the memory less :data:`HEADROOM_MIB` (the second CUDA context
and the allocator's slack).  Where a footprint or the memory is unknown, the pair table's word
stands (:meth:`MemoryLimits.fits` says None): that is no guess, the table's entry is itself a
measurement of the two jobs sharing a GPU.  Nothing tells a user so yet; the sidecar's
``sharing`` log event counts only the pairs refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeGuard

from hadar_slurm.errors import InputError
from hadar_slurm.model import GpuType, normalize_gpu_type

__all__ = ["CONTEXT_MIB", "HEADROOM_MIB", "KNOWN_GPU_MIB", "MIB", "MemoryLimits",
           "check_gpu_memory", "is_memory_size"]

#: Memory per GPU, MiB, of the smallest variant commonly sold of each type (a V100 may have
#: 32 GB, an A100 80 GB: ``[scheduler] gpu_memory_mib`` or a ``profile`` run says so).
KNOWN_GPU_MIB: Mapping[GpuType, float] = {
    "k80": 12 * 1024, "p100": 16 * 1024, "v100": 16 * 1024, "t4": 16 * 1024,
    "a10": 24 * 1024, "l4": 24 * 1024, "rtx_3090": 24 * 1024, "a40": 48 * 1024,
    "l40s": 48 * 1024, "rtx_a6000": 48 * 1024, "a100": 40 * 1024, "h100": 80 * 1024,
    "h200": 141 * 1024,
}

#: What a pair leaves free of the GPU's memory, MiB: a second CUDA context (about 300-500 MiB)
#: and the caching allocator's fragments.
HEADROOM_MIB = 512.0

#: Bytes in a MiB.
MIB = 1024 * 1024

#: A CUDA context's memory, MiB, added to torch's peak where NVML cannot tell what the process
#: held (torch's count leaves the context out; 300-500 MiB on current drivers).
CONTEXT_MIB = 512.0

#: ``(job_type, scale_factor)``.
JobKey = tuple[str, int]


def is_memory_size(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a memory size in MiB: a finite number above 0 (not a bool)."""
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and value > 0)


def check_gpu_memory(value: object, where: str, field_name: str) -> float:
    """A memory size in MiB: a finite number above 0."""
    if not is_memory_size(value):
        raise InputError(f"{value!r} is not a memory size in MiB (a number above 0)",
                         source=where, field=field_name,
                         fix="give the size in MiB, e.g. 16384 for 16 GiB")
    return float(value)


@dataclass(frozen=True)
class MemoryLimits:
    """Footprints of job types and memory of GPU types (see the module docstring).

    ``footprint[(job_type, scale)][gpu_type]``: MiB one worker held on one GPU of that type;
    ``gpu_mib[gpu_type]``: MiB of one GPU (measured or configured; :data:`KNOWN_GPU_MIB` fills
    in the types it lacks)."""

    footprint: Mapping[JobKey, Mapping[GpuType, float]] = field(default_factory=dict)
    gpu_mib: Mapping[GpuType, float] = field(default_factory=dict)

    def job_mib(self, job_type: str, scale: int) -> float | None:
        """One worker's footprint: the largest over the GPU types that measured it."""
        seen = self.footprint.get((job_type, scale))
        return max(seen.values()) if seen else None

    def memory_mib(self, gpu_type: GpuType) -> float | None:
        got = self.gpu_mib.get(gpu_type, KNOWN_GPU_MIB.get(gpu_type))
        return float(got) if got is not None else None

    def fits(self, job_a: str, job_b: str, scale: int, gpu_type: GpuType) -> bool | None:
        """Whether a worker of each job fits on one GPU of ``gpu_type`` together; None when
        a footprint or the GPU's memory is unknown."""
        fa, fb = self.job_mib(job_a, scale), self.job_mib(job_b, scale)
        mem = self.memory_mib(gpu_type)
        if fa is None or fb is None or mem is None:
            return None
        return fa + fb <= mem - HEADROOM_MIB

    def why_not(self, job_a: str, job_b: str, scale: int, gpu_type: GpuType) -> str:
        """Why the pair does not fit, for people ("" when it fits or nobody knows)."""
        if self.fits(job_a, job_b, scale, gpu_type) is not False:
            return ""
        fa, fb = self.job_mib(job_a, scale), self.job_mib(job_b, scale)
        mem = self.memory_mib(gpu_type)
        assert fa is not None and fb is not None and mem is not None
        return (f"{job_a} ({fa:.0f} MiB) and {job_b} ({fb:.0f} MiB) need {fa + fb:.0f} MiB; a "
                f"{gpu_type} has {mem:.0f} MiB, {HEADROOM_MIB:.0f} of it kept free")

    def merged(self, other: MemoryLimits) -> MemoryLimits:
        """``other``'s entries override ours, one ``(job, GPU type)`` or GPU type at a time."""
        foot: dict[JobKey, dict[GpuType, float]] = {k: dict(v)
                                                    for k, v in self.footprint.items()}
        for key, per_gpu in other.footprint.items():
            foot.setdefault(key, {}).update(per_gpu)
        return MemoryLimits(foot, {**self.gpu_mib, **other.gpu_mib})

    def with_gpu_memory(self, gpu_mib: Mapping[str, object], where: str) -> MemoryLimits:
        """These limits with the memory of some GPU types set (configured), checked."""
        sizes = {normalize_gpu_type(str(g)): check_gpu_memory(v, where, f"gpu_memory_mib.{g}")
                 for g, v in gpu_mib.items()}
        return MemoryLimits(self.footprint, {**self.gpu_mib, **sizes})
