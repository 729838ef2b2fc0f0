"""A node's NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

* :func:`list_gpus`: index, name, UUID, memory, minor number (``/dev/nvidiaN``) and the GPU type
  name Slurm's ``AutoDetect=nvml`` gives each GPU.
* :func:`gres_conf`: the ``gres.conf`` lines and the ``slurm.conf`` ``Gres=``/``Feature=`` line of
  a node with those GPUs.
* :class:`GpuSampler`: a thread that samples utilization and memory of some GPUs while a
  benchmark runs (``hadar-slurm profile``).

Without the package, without the NVIDIA driver or its library, or without any GPU, these raise
:class:`NvmlUnavailable`, whose text is one line saying which.  ``pynvml`` is imported on first
use, so importing this module needs neither.

Type names
----------
Slurm's NVML plugin (``src/plugins/gpu/nvml/gpu_nvml.c``, ``_nvml_get_device_name``) takes
``nvmlDeviceGetName()`` and passes it through ``gpu_common_underscorify_tolower()``
(``src/plugins/gpu/common/gpu_common.c``): every character lower-cased, every space turned
into ``_``, nothing else changed.  So ``"NVIDIA A100-SXM4-80GB"`` becomes
``nvidia_a100-sxm4-80gb`` and ``"Tesla V100-SXM2-16GB"`` ``tesla_v100-sxm2-16gb``
(:func:`slurm_type_name`).  gres.conf(5) of Slurm 22.05: "If using autodetect functionality and
defining the Type in your gres.conf file, the Type specified should match or be a substring of
the value that is detected, using an underscore in lieu of any spaces."  Hadar's throughput
tables and clusters name types briefly (``a100``, ``v100``), so :func:`short_type_name` takes the
model part of the detected name — always a substring of it, so the two agree with Slurm's
check: ``a100``, ``v100``, ``h100``, ``rtx_3090``.  MIG devices (whose autodetected type is a
profile such as ``nvidia_a100_3g.20gb``) are listed but left out of :func:`gres_conf`.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hadar_slurm.errors import InputError
from hadar_slurm.rates.memory import MIB

__all__ = [
    "GpuInfo",
    "GpuSampler",
    "GpuUsage",
    "NvmlUnavailable",
    "device_files",
    "gres_conf",
    "list_gpus",
    "short_type_name",
    "slurm_type_name",
]

#: Vendor and product-line words before the model in NVML names ("NVIDIA", "Tesla", ...).
_VENDOR_WORDS = ("nvidia", "tesla", "geforce", "quadro")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class NvmlUnavailable(Exception):  # noqa: N818 (a state, not a bug: named as issue #5 asks)
    """NVML cannot tell us about GPUs here; ``str()`` is one line saying why.

    ``reason``: ``"module"`` (nvidia-ml-py not installed), ``"library"`` (libnvidia-ml.so not
    found), ``"driver"`` (the NVIDIA driver is not loaded), ``"no-gpus"`` (NVML works but sees no
    GPU) or ``"error"`` (another NVML error)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it.  ``index``: NVML's index (PCI bus order, not CUDA's
    ``CUDA_VISIBLE_DEVICES`` order); ``minor_number``: N of ``/dev/nvidiaN`` (None when NVML has
    none, e.g. under WSL: Slurm's autodetection skips such a GPU); ``slurm_type``: the type name
    Slurm's ``AutoDetect=nvml`` gives it; ``mig``: MIG mode is enabled."""

    index: int
    name: str
    uuid: str
    memory_total_mib: int
    minor_number: int | None
    slurm_type: str
    mig: bool = False

    @property
    def device_file(self) -> str | None:
        return None if self.minor_number is None else f"/dev/nvidia{self.minor_number}"

    @property
    def short_type(self) -> str:
        return short_type_name(self.name)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid,
                "memory_total_mib": self.memory_total_mib, "minor_number": self.minor_number,
                "device_file": self.device_file, "slurm_type": self.slurm_type,
                "short_type": self.short_type, "mig": self.mig}


def slurm_type_name(nvml_name: str) -> str:
    """The GPU type Slurm's ``AutoDetect=nvml`` derives from an NVML device name: lower case,
    spaces as underscores (``gpu_common_underscorify_tolower`` in Slurm's gpu_common.c, applied
    to ``nvmlDeviceGetName()`` by gpu_nvml.c).  ``"NVIDIA A100-SXM4-80GB"`` ->
    ``"nvidia_a100-sxm4-80gb"``."""
    return nvml_name.lower().replace(" ", "_")


def short_type_name(nvml_name: str) -> str:
    """A short type for gres.conf and hadar's throughput tables: the model part of
    :func:`slurm_type_name` after the vendor words (nvidia, tesla, geforce, quadro), up to the
    first ``-`` or ``_``; a model word without digits (``rtx``) takes the next word too.  A
    substring of the autodetected name, as gres.conf(5) asks.  ``"NVIDIA A100-SXM4-80GB"`` ->
    ``a100``, ``"Tesla K80"`` -> ``k80``, ``"NVIDIA H100 80GB HBM3"`` -> ``h100``,
    ``"NVIDIA GeForce RTX 3090"`` -> ``rtx_3090``; the whole name when nothing is left."""
    full = slurm_type_name(nvml_name.strip())
    rest = full
    stripped = True
    while stripped:
        stripped = False
        for word in _VENDOR_WORDS:
            if rest.startswith(word + "_"):
                rest, stripped = rest[len(word) + 1:], True
    words = re.split(r"([-_])", rest)  # words and their separators, alternating
    if not words or not words[0]:
        return full
    short = words[0]
    if not any(c.isdigit() for c in short) and len(words) >= 3 and words[1] == "_" and words[2]:
        short += "_" + words[2]
    return short


# ------------------------------------------------------------------------------------ NVML

def _import_pynvml() -> ModuleType:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        raise NvmlUnavailable(
            "module", "NVML is not available: the nvidia-ml-py package is not installed "
            "(pip install nvidia-ml-py)") from None
    module: ModuleType = pynvml
    return module


def _unavailable(pynvml: ModuleType, exc: BaseException) -> NvmlUnavailable:
    """An NVML error as one line: which of library / driver / other."""
    code = getattr(exc, "value", None)
    text = str(exc).replace("\n", " ").strip() or type(exc).__name__
    if code == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return NvmlUnavailable(
            "library", "NVML is not available: the NVIDIA driver's libnvidia-ml.so.1 was not "
            "found (no NVIDIA driver installed on this machine?)")
    if code == getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return NvmlUnavailable(
            "driver", "NVML is not available: the NVIDIA driver is not loaded (no GPU, or "
            "the kernel module failed to load: see dmesg)")
    return NvmlUnavailable("error", f"NVML failed: {text}")


def _init() -> ModuleType:
    """``pynvml``, initialised (``nvmlInit``); :class:`NvmlUnavailable` when it cannot be."""
    pynvml = _import_pynvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _unavailable(pynvml, exc) from None
    return pynvml


@contextlib.contextmanager
def _nvml() -> Iterator[ModuleType]:
    """``pynvml`` between ``nvmlInit()`` and ``nvmlShutdown()``; NVML errors (also those raised
    inside the block) become :class:`NvmlUnavailable`."""
    pynvml = _init()
    try:
        yield pynvml
    except pynvml.NVMLError as exc:
        raise _unavailable(pynvml, exc) from None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _minor(pynvml: ModuleType, handle: object) -> int | None:
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError:
        return None


def _mig_enabled(pynvml: ModuleType, handle: object) -> bool:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except (pynvml.NVMLError, AttributeError):
        return False  # not supported by this GPU or this NVML
    return bool(current == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1))


def list_gpus() -> list[GpuInfo]:
    """The GPUs NVML sees on this machine, in NVML index order.  Raises
    :class:`NvmlUnavailable` without nvidia-ml-py, NVML's library or driver, or any GPU."""
    with _nvml() as pynvml:
        count = int(pynvml.nvmlDeviceGetCount())
        gpus = []
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(pynvml.nvmlDeviceGetName(handle)).strip()
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(GpuInfo(
                index=index, name=name, uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                memory_total_mib=int(memory.total) // MIB,
                minor_number=_minor(pynvml, handle), slurm_type=slurm_type_name(name),
                mig=_mig_enabled(pynvml, handle)))
    if not gpus:
        raise NvmlUnavailable("no-gpus", "NVML works but sees no GPU on this machine")
    return gpus


# ------------------------------------------------------------------------------- gres.conf

def device_files(minors: Sequence[int]) -> str:
    """``/dev/nvidia[0-3,6]`` for minor numbers 0, 1, 2, 3, 6 (``/dev/nvidia5`` for one):
    gres.conf's ``File=`` takes such a range."""
    if not minors:
        raise ValueError("no minor numbers")
    values = sorted(set(minors))
    if len(values) == 1:
        return f"/dev/nvidia{values[0]}"
    parts: list[str] = []
    start = prev = values[0]
    for value in [*values[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return f"/dev/nvidia[{','.join(parts)}]"


def gres_conf(gpus: Sequence[GpuInfo], node_name: str, *, full_type: bool = False) -> str:
    """The gres.conf lines (one per GPU type, its device files as a range) and the slurm.conf
    ``Gres=``/``Feature=`` line for node ``node_name`` with ``gpus``.  Types are
    :func:`short_type_name` (``a100``; hadar's throughput tables use these), or with
    ``full_type`` the exact name ``AutoDetect=nvml`` gives.  GPUs without a minor number and
    MIG GPUs are left out with a comment (Slurm's autodetection skips the former and lists the
    latter per MIG profile).  Raises :class:`InputError` for a bad node name or no usable GPU."""
    if not _NODE_NAME.match(node_name):
        raise InputError(f"bad node name {node_name!r}", field="node",
                         fix="give the node's Slurm NodeName, e.g. --node gpu01")
    lines = [f"# gres.conf on {node_name} (generated by hadar-slurm gres-conf from NVML; "
             "with AutoDetect=nvml, Slurm checks that each Type is part of the detected name)"]
    by_type: dict[str, list[GpuInfo]] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.mig:
            lines.append(f"# GPU {gpu.index} ({gpu.name}) is in MIG mode: left out (use "
                         "AutoDetect=nvml, which lists each MIG device by profile)")
        elif gpu.minor_number is None:
            lines.append(f"# GPU {gpu.index} ({gpu.name}) has no /dev/nvidia minor number: left "
                         "out (Slurm's AutoDetect=nvml skips it too)")
        else:
            kind = gpu.slurm_type if full_type else gpu.short_type
            by_type.setdefault(kind, []).append(gpu)
    if not by_type:
        raise InputError(f"none of the {len(gpus)} GPUs can be listed in gres.conf",
                         field="gpus", fix="see the comments: MIG GPUs need AutoDetect=nvml")
    for kind, group in by_type.items():
        files = device_files([g.minor_number for g in group if g.minor_number is not None])
        detected = sorted({g.slurm_type for g in group})
        lines.append(f"NodeName={node_name} Name=gpu Type={kind} File={files}"
                     f"  # {len(group)} x {', '.join(detected)}")
    gres = ",".join(f"gpu:{kind}:{len(group)}" for kind, group in by_type.items())
    features = ",".join(by_type)
    lines += ["",
              f"# slurm.conf: add to {node_name}'s NodeName= line (with its CPUs=, RealMemory=, "
              "...), and GresTypes=gpu",
              f"NodeName={node_name} Gres={gres} Feature={features}"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- sampling

@dataclass(frozen=True)
class GpuUsage:
    """What :class:`GpuSampler` saw on one GPU: utilization in percent (the share of the
    sample period in which a kernel ran, NVML's definition) and memory used in MiB (by every
    process), mean and maximum over ``samples`` samples; the GPU's total memory; and the most
    memory this process held on it (NVML's per-process count; None where NVML does not give
    it, e.g. in a container whose process ids NVML does not see)."""

    index: int
    samples: int
    util_mean: float
    util_max: float
    memory_used_mean_mib: float
    memory_used_max_mib: float
    memory_total_mib: float | None = None
    memory_own_max_mib: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "samples": self.samples,
                "util_mean": round(self.util_mean, 2), "util_max": self.util_max,
                "memory_used_mean_mib": round(self.memory_used_mean_mib, 1),
                "memory_used_max_mib": self.memory_used_max_mib,
                "memory_total_mib": self.memory_total_mib,
                "memory_own_max_mib": self.memory_own_max_mib}


class GpuSampler:
    """Samples utilization and memory used of NVML GPUs ``indices`` (all GPUs when None) every
    ``interval_s`` seconds in a background thread, between :meth:`start` and :meth:`stop`
    (or as a context manager)::

        with GpuSampler([0]) as sampler:
            run_benchmark()
        usage = sampler.result()

    :meth:`start` initializes NVML in the calling thread, so that a missing NVML raises
    :class:`NvmlUnavailable` there; it samples once at once and once more at :meth:`stop`, so
    even a short run has two samples.  A GPU whose reading fails later is skipped for that
    sample (the error is kept in :attr:`errors`)."""

    def __init__(self, indices: Sequence[int] | None = None, interval_s: float = 0.2) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self.indices = None if indices is None else tuple(indices)
        self.interval_s = interval_s
        self.errors: list[str] = []
        self._util: dict[int, list[float]] = {}
        self._mem: dict[int, list[float]] = {}
        self._total: dict[int, float] = {}
        self._own: dict[int, float] = {}  # the most this process held, where NVML tells
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml: ModuleType | None = None
        self._handles: list[tuple[int, object]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> GpuSampler:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("GpuSampler already started")
        pynvml = _init()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            wanted = range(count) if self.indices is None else self.indices
            for index in wanted:
                if not 0 <= index < count:
                    raise NvmlUnavailable("no-gpus", f"NVML has no GPU {index} "
                                          f"(it sees {count})")
                self._handles.append((index, pynvml.nvmlDeviceGetHandleByIndex(index)))
            if not self._handles:
                raise NvmlUnavailable("no-gpus", "NVML works but sees no GPU on this machine")
        except pynvml.NVMLError as exc:
            self._shutdown(pynvml)
            raise _unavailable(pynvml, exc) from None
        except NvmlUnavailable:
            self._shutdown(pynvml)
            raise
        self._pynvml = pynvml
        self._sample()
        self._thread = threading.Thread(target=self._run, name="hadar-gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (one last sample first) and shut NVML down; safe to call twice."""
        if self._thread is None or self._pynvml is None:
            return
        self._stop.set()
        self._thread.join()
        self._sample()
        self._shutdown(self._pynvml)
        self._pynvml = None

    def result(self) -> tuple[GpuUsage, ...]:
        """Mean and maximum per GPU over the samples so far (GPUs with no sample left out)."""
        with self._lock:
            out = []
            for index, _handle in self._handles:
                util, mem = self._util.get(index, []), self._mem.get(index, [])
                if util and mem:
                    out.append(GpuUsage(index, len(util), sum(util) / len(util), max(util),
                                        sum(mem) / len(mem), max(mem), self._total.get(index),
                                        self._own.get(index)))
            return tuple(out)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        pynvml = self._pynvml
        if pynvml is None:
            return
        for index, handle in self._handles:
            try:
                util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                info = pynvml.nvmlDeviceGetMemoryInfo(handle)
                used = float(info.used) / MIB
                total = float(info.total) / MIB
            except pynvml.NVMLError as exc:
                if len(self.errors) < 10:
                    self.errors.append(f"GPU {index}: {exc}")
                continue
            own = self._own_memory(pynvml, handle)
            with self._lock:
                self._util.setdefault(index, []).append(util)
                self._mem.setdefault(index, []).append(used)
                self._total[index] = total
                if own is not None:
                    self._own[index] = max(self._own.get(index, 0.0), own)

    @staticmethod
    def _own_memory(pynvml: ModuleType, handle: object) -> float | None:
        """MiB this process holds on the GPU (its CUDA context included), None where NVML
        does not list it (no context yet, another process id namespace, no permission)."""
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except (pynvml.NVMLError, AttributeError):
            return None
        pid = os.getpid()
        held = [p.usedGpuMemory for p in procs
                if getattr(p, "pid", None) == pid and getattr(p, "usedGpuMemory", None)]
        return float(sum(held)) / MIB if held else None

    @staticmethod
    def _shutdown(pynvml: ModuleType) -> None:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()

