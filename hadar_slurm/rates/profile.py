"""Measure a model's training throughput: ``hadar-slurm profile``.

:func:`profile_model` trains a built-in benchmark model (:mod:`hadar_slurm.rates.profile_models`
holds them) for a few warm-up iterations, then times a number of iterations (or seconds), and
returns a :class:`ProfileResult`: steps per second of the whole job (Gavel's convention, the rate
:class:`~hadar_slurm.rates.store.ThroughputStore` keys by ``(job_type, scale_factor, gpu_type)``),
iteration time percentiles, the device, and GPU utilization and memory sampled through NVML
(:class:`hadar_slurm.rates.nvml.GpuSampler`) where there is one.  :func:`record_result` stores
the rate as ``measured``.  :mod:`hadar_slurm.rates.profile_slurm` runs this on every GPU type of
a Slurm cluster (one benchmark job per type) and records each type's rate.

Through the training runtime
----------------------------
The benchmark runs as an unforked job of :class:`hadar_slurm.runtime.JobRuntime` (a throw-away
tracker dir, one round of ``warm-up + timed`` iterations): the device is the runtime's choice
(:func:`~hadar_slurm.runtime.pick_device`: ``--device``, else ``HADAR_DEVICE``, else CUDA when
available, else the CPU), the runtime moves the model there and counts the steps, and the
preemption signal (USR1/TERM, ``HADAR_PREEMPT_SIGNAL``) ends a profiling job the way it ends a
training job (exit 75).  What the runtime does not give — per-iteration times — is measured here:
on the CPU with :func:`time.perf_counter` around each iteration; on CUDA with CUDA events
recorded after each iteration (no synchronization inside the timed loop, so the host keeps
queueing work as in training) and :func:`torch.cuda.synchronize` before the timer starts and
after the last timed iteration, so the wall time covers exactly the timed GPU work.  The
profile then leaves the round without committing it (there is nothing to keep), so no
checkpoint is written.  The runtime has no reusable per-iteration timing (its round rates
include everything between two yields of ``steps()``), hence the clock here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import platform
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hadar_slurm.errors import InputError
from hadar_slurm.rates.memory import CONTEXT_MIB, MIB
from hadar_slurm.rates.nvml import GpuSampler, GpuUsage, NvmlUnavailable, list_gpus
from hadar_slurm.rates.profile_models import BENCHMARKS, _build, check_gpu_type, job_type_for

if TYPE_CHECKING:
    import torch

    from hadar_slurm.rates.store import Entry, ThroughputStore

__all__ = [
    "DEFAULT_ITERS",
    "DEFAULT_WARMUP",
    "ProfileResult",
    "footprint_mib",
    "profile_model",
    "record_result",
]

DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20
#: Most timed iterations in --seconds mode (the runtime needs a finite amount of work).
MAX_TIMED_ITERS = 10**8


# ---------------------------------------------------------------------------------- results

@dataclass(frozen=True)
class ProfileResult:
    """One profiling run.  ``steps_per_second``: timed iterations over the wall time of the
    timed region (the whole job's rate with ``scale_factor`` GPUs); ``iter_ms_*``: the
    distribution of single iteration times; ``gpu_usage``: per sampled GPU, utilization and
    memory used by all processes as NVML reports it (empty when not sampled, ``gpu_note`` then
    says why); ``torch_peak_mib``: the most memory torch allocated on the (first) GPU in the
    timed region (None on the CPU)."""

    model: str
    job_type: str
    batch_size: int | None
    scale_factor: int
    device: str
    device_name: str
    warmup_iters: int
    timed_iters: int
    timed_seconds: float
    steps_per_second: float
    iter_ms_p50: float
    iter_ms_p90: float
    iter_ms_max: float
    gpu_usage: tuple[GpuUsage, ...] = ()
    gpu_note: str | None = None
    torch_version: str = ""
    threads: int | None = None
    torch_peak_mib: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["gpu_usage"] = [u.to_json() for u in self.gpu_usage]
        for key in ("timed_seconds", "steps_per_second", "iter_ms_p50", "iter_ms_p90",
                    "iter_ms_max"):
            data[key] = round(float(data[key]), 6)
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any], source: str = "profile result") -> ProfileResult:
        """The inverse of :meth:`to_json` (a job's result read back); :class:`InputError` when
        a field is missing or of the wrong kind."""
        try:
            usage = tuple(GpuUsage(**u) for u in data.get("gpu_usage", []))
            fields = {f.name: data[f.name] for f in dataclasses.fields(ProfileResult)
                      if f.name != "gpu_usage" and f.name in data}
            result = ProfileResult(**fields, gpu_usage=usage)
        except (TypeError, KeyError) as exc:
            raise InputError(f"not a profile result: {exc}", source=source) from None
        rate = result.steps_per_second
        if not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
            raise InputError(f"steps_per_second {rate!r} is not a positive rate", source=source,
                             field="steps_per_second")
        return result

    def summary(self) -> str:
        """One line for people."""
        bs = "" if self.batch_size is None else f" bs={self.batch_size}"
        usage = "".join(f", GPU {u.index} {u.util_mean:.0f}% busy (max {u.util_max:.0f}%) "
                        f"{u.memory_used_max_mib:.0f} MiB" for u in self.gpu_usage)
        if self.torch_peak_mib is not None:
            usage += f", torch peak {self.torch_peak_mib:.0f} MiB"
        note = f" ({self.gpu_note})" if self.gpu_note else ""
        return (f"{self.model}{bs} x{self.scale_factor} on {self.device} ({self.device_name}): "
                f"{self.steps_per_second:.3f} steps/s over {self.timed_iters} iterations "
                f"({self.timed_seconds:.3f} s, after {self.warmup_iters} warm-up); "
                f"iteration p50 {self.iter_ms_p50:.2f} ms, p90 {self.iter_ms_p90:.2f} ms"
                f"{usage}{note}")


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---------------------------------------------------------------------------------- profiling

class _Clock:
    """Per-iteration times: perf_counter on the CPU; on CUDA, events recorded on the stream
    the model runs on (``device``'s current stream), with every GPU of the job (``gpus``
    devices from ``device`` on) synchronized only at the start and the end of the timed
    region."""

    def __init__(self, device: torch.device, gpus: int = 1) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.device = device
        first = device.index if device.index is not None else (
            torch.cuda.current_device() if self.cuda else 0)
        self.sync_devices = list(range(first, first + gpus))
        self.cpu_times: list[float] = []
        self.events: list[torch.cuda.Event] = []
        self.t0 = 0.0
        self._last = 0.0
        self._torch = torch

    def _sync(self) -> None:
        for index in self.sync_devices:
            self._torch.cuda.synchronize(index)

    def _event(self) -> None:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(self._torch.cuda.current_stream(self.device))
        self.events.append(event)

    def start(self) -> None:
        if self.cuda:
            self._sync()
            self._torch.cuda.reset_peak_memory_stats(self.device)
            self._event()
        self.t0 = self._last = time.perf_counter()

    def tick(self) -> float:
        """After one timed iteration; the wall seconds since :meth:`start` (on CUDA the host's
        view, which may run ahead of the GPU by the queued work)."""
        now = time.perf_counter()
        if self.cuda:
            self._event()
        else:
            self.cpu_times.append(now - self._last)
        self._last = now
        return now - self.t0

    def stop(self) -> tuple[float, list[float]]:
        """Wall seconds of the timed region and the iteration times in ms."""
        if self.cuda:
            self._sync()
        t_end = time.perf_counter()
        if self.cuda:
            times = [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:], strict=False)]
        else:
            times = [t * 1000.0 for t in self.cpu_times]
        return t_end - self.t0, times

    def peak_memory_mib(self) -> float | None:
        """The most memory torch held on ``device`` in the timed region (None on the CPU)."""
        if not self.cuda:
            return None
        return float(self._torch.cuda.max_memory_allocated(self.device)) / MIB


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine type."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    return platform.machine() or "cpu"


def _nvml_indices(device: torch.device, gpus: int) -> list[int]:
    """NVML indices of the first ``gpus`` CUDA devices, matched by UUID (CUDA's order follows
    CUDA_VISIBLE_DEVICES and is not NVML's)."""
    import torch

    by_uuid = {g.uuid.lower(): g.index for g in list_gpus()}
    first = device.index or 0
    out = []
    for k in range(first, first + gpus):
        uuid = str(getattr(torch.cuda.get_device_properties(k), "uuid", "")).lower()
        key = uuid if uuid.startswith(("gpu-", "mig-")) else f"gpu-{uuid}"
        if key not in by_uuid:
            raise NvmlUnavailable("error", f"CUDA device {k} (uuid {uuid or '?'}) is not among "
                                  "NVML's GPUs")
        out.append(by_uuid[key])
    return out


def profile_model(
    model: str,
    batch_size: int | None,
    *,
    device: str | None = None,
    gpus: int = 1,
    warmup_iters: int = DEFAULT_WARMUP,
    timed_iters: int | None = None,
    seconds: float | None = None,
    sample_gpus: bool = True,
    threads: int | None = None,
    seed: int = 0,
    on_iteration: Callable[[int], None] | None = None,
) -> ProfileResult:
    """Benchmark ``model`` (:mod:`~hadar_slurm.rates.profile_models`) with ``batch_size`` on
    ``gpus`` GPUs: ``warmup_iters`` untimed iterations (at least 0), then ``timed_iters`` timed
    ones (default :data:`DEFAULT_ITERS`) or as many as fit in ``seconds`` (at least one).
    ``device``: ``cpu``, ``cuda`` or ``cuda:N``; default the runtime's choice (``HADAR_DEVICE``,
    else CUDA when available).  ``on_iteration(i)`` is called before iteration ``i`` (0-based,
    warm-up included).  Raises :class:`InputError` for a bad model, batch size, GPU count, count
    of iterations or device."""
    import torch

    from hadar_slurm.runtime import JobRuntime, RuntimeConfig, pick_device

    job_type = job_type_for(model, batch_size, gpus)
    bench = BENCHMARKS[model]
    if isinstance(warmup_iters, bool) or not isinstance(warmup_iters, int) or warmup_iters < 0:
        raise InputError(f"warm-up iterations must be a whole number >= 0, got "
                         f"{warmup_iters!r}", field="warmup")
    if timed_iters is not None and seconds is not None:
        raise InputError("give timed iterations or seconds, not both", field="iters")
    if timed_iters is None and seconds is None:
        timed_iters = DEFAULT_ITERS
    if timed_iters is not None and (isinstance(timed_iters, bool) or timed_iters < 1):
        raise InputError(f"timed iterations must be a whole number >= 1, got {timed_iters!r}",
                         field="iters")
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise InputError(f"seconds must be a positive number, got {seconds!r}", field="seconds")
    if threads is not None and threads < 1:
        raise InputError(f"threads must be >= 1, got {threads}", field="threads")

    timed_cap = timed_iters if timed_iters is not None else MAX_TIMED_ITERS
    work = warmup_iters + timed_cap
    with tempfile.TemporaryDirectory(prefix="hadar-profile-") as tracker:
        base = RuntimeConfig.from_env(work, round_iters=work, cwd=Path(tracker), env={
            k: os.environ[k] for k in ("HADAR_DEVICE", "HADAR_PREEMPT_SIGNAL")
            if k in os.environ})
        config = dataclasses.replace(base, heartbeat_s=3600.0, device=device or base.device,
                                     job_key="profile")
        try:
            dev = pick_device(config)
        except RuntimeError as exc:
            raise InputError(f"bad device {config.device!r}: {exc}", field="device",
                             fix="use cpu, cuda or cuda:N") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise InputError("CUDA is not available here (torch.cuda.is_available() is "
                                 "false)", field="device", fix="use --device cpu")
            if (dev.index or 0) + gpus > torch.cuda.device_count():
                raise InputError(f"{gpus} GPUs asked for from {dev}, but CUDA sees "
                                 f"{torch.cuda.device_count()}", field="gpus")
            torch.backends.cudnn.benchmark = True  # as training jobs do; warm-up tunes it
        elif dev.type == "cpu":
            if gpus != 1:
                raise InputError(f"{gpus} GPUs asked for on the CPU", field="gpus",
                                 fix="profile several GPUs on CUDA, or use --gpus 1")
        else:
            raise InputError(f"device type {dev.type!r} is not supported", field="device",
                             fix="use cpu or cuda")
        if threads is not None and dev.type == "cpu":
            torch.set_num_threads(threads)

        per_gpu = batch_size if batch_size is not None else (bench.fixed_batch or 1)
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        net, batch, loss_fn = _build(model, per_gpu * gpus, dev, gen)
        wrapped: torch.nn.Module = net
        if dev.type == "cuda" and gpus > 1:
            first = dev.index or 0
            wrapped = torch.nn.DataParallel(net, device_ids=list(range(first, first + gpus)))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

        sampler: GpuSampler | None = None
        note: str | None = None
        if dev.type != "cuda":
            note = "no GPU sampled: device is the CPU"
        elif not sample_gpus:
            note = "GPU sampling off"
        else:
            try:
                sampler = GpuSampler(_nvml_indices(dev, gpus))
            except NvmlUnavailable as exc:
                note = f"no GPU sampled: {exc}"

        clock = _Clock(dev, gpus)
        elapsed = 0.0
        times: list[float] = []
        done = 0
        with JobRuntime(wrapped, optimizer, config, exit_if_done=False,
                        log=io.StringIO()) as rt:
            steps = cast(Generator[int, None, None], rt.steps())
            try:
                for i, _ in enumerate(steps):
                    if i == warmup_iters:
                        if sampler is not None:
                            try:
                                sampler.start()
                            except NvmlUnavailable as exc:
                                sampler, note = None, f"no GPU sampled: {exc}"
                        clock.start()
                    if on_iteration is not None:
                        on_iteration(i)
                    loss = loss_fn(wrapped, batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    if i >= warmup_iters:
                        done += 1
                        wall = clock.tick()
                        if done == timed_iters or (seconds is not None and wall >= seconds):
                            elapsed, times = clock.stop()
                            break
            finally:
                steps.close()  # leave the round uncommitted: nothing to keep
                if sampler is not None:
                    sampler.stop()
            rt.finish()
        if done == 0 or elapsed <= 0:
            raise InputError("no timed iteration ran", field="iters")
        device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name()
        usage = sampler.result() if sampler is not None else ()
        if sampler is not None and not usage:
            note = "no GPU sample could be read: " + "; ".join(sampler.errors[:2])
        return ProfileResult(
            model=model, job_type=job_type, batch_size=batch_size, scale_factor=gpus,
            device=str(dev), device_name=device_name, warmup_iters=warmup_iters,
            timed_iters=done, timed_seconds=elapsed, steps_per_second=done / elapsed,
            iter_ms_p50=_percentile(times, 50), iter_ms_p90=_percentile(times, 90),
            iter_ms_max=max(times) if times else math.nan, gpu_usage=usage, gpu_note=note,
            torch_version=str(torch.__version__),
            threads=torch.get_num_threads() if dev.type == "cpu" else None,
            torch_peak_mib=clock.peak_memory_mib())


def footprint_mib(result: ProfileResult) -> float | None:
    """The memory one worker held on one GPU, MiB (:mod:`hadar_slurm.rates.memory`): the most
    NVML saw this process hold on any profiled GPU; else the most in use on it (by every
    process: an over-count where others share the GPU, never an under-count); else torch's
    peak plus :data:`~hadar_slurm.rates.memory.CONTEXT_MIB`; None on the CPU."""
    own = [u.memory_own_max_mib for u in result.gpu_usage if u.memory_own_max_mib]
    if own:
        return max(own)
    used = [u.memory_used_max_mib for u in result.gpu_usage if u.memory_used_max_mib > 0]
    if used:
        return max(used)
    if result.torch_peak_mib:
        return result.torch_peak_mib + CONTEXT_MIB
    return None


def record_result(store: ThroughputStore, result: ProfileResult, gpu_type: str,
                  *, when: float | None = None) -> Entry:
    """Store ``result``'s rate as ``measured`` for ``(job_type, scale_factor, gpu_type)``,
    and, from a GPU, the job's footprint and the GPU's memory."""
    gpu = check_gpu_type(gpu_type)
    entry = store.record(result.job_type, result.scale_factor, gpu, result.steps_per_second,
                         source="measured", when=when)
    foot = footprint_mib(result)
    if foot is not None:
        store.record_footprint(result.job_type, result.scale_factor, gpu, foot, when=when)
    totals = [u.memory_total_mib for u in result.gpu_usage if u.memory_total_mib]
    if totals:
        store.record_gpu_memory(gpu, min(totals), when=when)
    return entry
