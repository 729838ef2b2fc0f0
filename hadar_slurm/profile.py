"""Measure a model's training throughput: ``hadar-slurm profile``.

:func:`profile_model` trains a built-in benchmark model (below) for a few warm-up iterations,
then times a number of iterations (or seconds), and returns a :class:`ProfileResult`: steps per
second of the whole job (Gavel's convention, the rate :class:`~hadar_slurm.store.ThroughputStore`
keys by ``(job_type, scale_factor, gpu_type)``), iteration time percentiles, the device, and
GPU utilization and memory sampled through NVML (:class:`hadar_slurm.nvml.GpuSampler`) where
there is one.  :func:`record_result` stores the rate as ``measured``.
:func:`profile_on_slurm` submits one such benchmark job per GPU type of a Slurm cluster, waits
for them and records each type's rate.

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

Benchmark models (proxies)
--------------------------
The models are *small proxies* of the job types of Gavel's throughput table, built from torch
layers and trained on synthetic data made once on the device (so no data loading is measured
and nothing is downloaded); they are sized by the batch size hint, not by the real models'
widths.  Their absolute rates are *not* those of the real models: they are meant to compare GPU
types (and a node's health) with the same work, and to exercise the measuring path end to end.
A site that wants real rates records its own jobs' rates (the sidecar learns them).

=============  ========================================================================
model          proxy (per iteration: forward, backward, SGD step on one batch)
=============  ========================================================================
resnet18       ResNet-like conv net, 3 stages of basic blocks, 3x32x32 inputs (CIFAR-10)
resnet50       ResNet-like conv net, 3 stages of 2 bottleneck blocks, 3x64x64 inputs
transformer    encoder-decoder Transformer, d_model 64, 2+2 layers, 20-token sentences
lm             2-layer LSTM language model, vocabulary 1000, 35-token sequences
recommendation user/item embeddings (10000/5000 x 32) and an MLP predicting a rating
a3c            MLP actor-critic on 128-byte Atari RAM states, rollouts of 20 steps
cyclegan       small conv generator (encoder, 2 residual blocks, decoder), 3x64x64, L1
digits         the MLP of examples/digits_train.py (64-64-10) on 8x8 images
=============  ========================================================================

The batch size must be one the catalog (:class:`hadar_slurm.hints.ModelCatalog`) has for the
model, and the GPU count one of its scale factors (``digits``, not in the catalog, takes any
batch size and records as ``Digits (batch size N)``).  With ``gpus`` > 1 on CUDA the model runs
under :class:`torch.nn.DataParallel` on the first ``gpus`` visible GPUs with ``batch size x
gpus`` samples per step (each GPU a batch of the hint's size).

Slurm
-----
:func:`profile_on_slurm` submits, for every GPU type of the cluster's nodes that have at least
``gpus`` GPUs (and are not down or drained), one batch job ``--gres=gpu:<type>:<gpus>
--nodes=1`` running ``python -m hadar_slurm.cli_nvml profile ... --gpu-type <type> --no-record
--json`` (an argv, given to a fixed wrapper script as its arguments: no shell parses it), waits
for them all (at most ``timeout_s``, then cancels the rest), reads each job's JSON result from
its output file in ``workdir`` and records the rates into the store here, in the submitting
process: the store's SQLite WAL file must be on a local file system, while ``workdir`` must be
one the nodes share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hadar_slurm.errors import InputError
from hadar_slurm.hints import ModelCatalog
from hadar_slurm.model import normalize_gpu_type
from hadar_slurm.nvml import GpuSampler, GpuUsage, NvmlUnavailable, list_gpus
from hadar_slurm.slurm import SlurmError, SlurmNode, SlurmRunner, commands
from hadar_slurm.slurm.parse import (
    UNFINISHED_STATES,
    parse_sbatch_parsable,
    parse_sinfo_json,
    parse_squeue_json,
)

if TYPE_CHECKING:
    import torch

    from hadar_slurm.store import Entry, ThroughputStore

__all__ = [
    "BENCHMARKS",
    "DEFAULT_ITERS",
    "DEFAULT_WARMUP",
    "Benchmark",
    "ProfileRequest",
    "ProfileResult",
    "SlurmProfile",
    "cluster_gpu_types",
    "job_type_for",
    "profile_model",
    "profile_on_slurm",
    "record_result",
]

DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20
#: Most timed iterations in --seconds mode (the runtime needs a finite amount of work).
MAX_TIMED_ITERS = 10**8
_GPU_TYPE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
#: Job states of a profiling job that has not ended.
_LIVE = UNFINISHED_STATES
_WRAPPER = """#!/bin/sh
# hadar-slurm profile: a benchmark job.  Its command is this script's arguments (an argv given
# to sbatch), run as is: no shell parses it.
exec "$@"
"""


# ---------------------------------------------------------------------------------- catalog

@dataclass(frozen=True)
class Benchmark:
    """A built-in benchmark model: ``name`` (the hints' short model name), ``title`` (the job
    type's model part, e.g. ``ResNet-18``), the batch size used when the model has none in the
    catalog (``fixed_batch``), and what the proxy is (``proxy``)."""

    name: str
    title: str
    proxy: str
    fixed_batch: int | None = None  # a3c's rollout length, cyclegan's batch of 1


BENCHMARKS: Mapping[str, Benchmark] = {b.name: b for b in (
    Benchmark("resnet18", "ResNet-18", "ResNet-like conv net, 3 stages, 3x32x32 inputs"),
    Benchmark("resnet50", "ResNet-50", "ResNet-like bottleneck conv net, 3x64x64 inputs"),
    Benchmark("transformer", "Transformer", "encoder-decoder Transformer, d_model 64, 20 tokens"),
    Benchmark("lm", "LM", "2-layer LSTM language model, vocabulary 1000, 35 tokens"),
    Benchmark("recommendation", "Recommendation", "user/item embeddings and an MLP"),
    Benchmark("a3c", "A3C", "MLP actor-critic on 128-byte states, 20-step rollouts", 20),
    Benchmark("cyclegan", "CycleGAN", "small conv generator, 3x64x64, L1 loss", 1),
    Benchmark("digits", "Digits", "the MLP of examples/digits_train.py, 8x8 images"),
)}


def job_type_for(model: str, batch_size: int | None, gpus: int = 1,
                 catalog: ModelCatalog | None = None) -> str:
    """The throughput table's job type of a benchmark, checking the batch size and GPU count
    against the catalog (:class:`InputError` naming ``model``, ``batch-size`` or ``gpus``)."""
    if model not in BENCHMARKS:
        raise InputError(f"no benchmark for model {model!r}", field="model",
                         fix="choose one of " + ", ".join(BENCHMARKS))
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InputError(f"GPU count must be a whole number >= 1, got {gpus!r}", field="gpus")
    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
        raise InputError(f"batch size must be a whole number >= 1, got {batch_size!r}",
                         field="batch-size")
    if model == "digits":
        if batch_size is None:
            raise InputError("digits needs a batch size", field="batch-size",
                             fix="e.g. --batch-size 32")
        return f"Digits (batch size {batch_size})"
    cat = catalog if catalog is not None else ModelCatalog.default()
    sizes = cat.batch_sizes(model)
    if not sizes and batch_size is not None:
        raise InputError(f"{model} has no batch size in the catalog", field="batch-size",
                         fix="leave out --batch-size")
    if sizes and batch_size not in sizes:
        got = "no batch size" if batch_size is None else f"batch size {batch_size}"
        raise InputError(f"{got} is not one of {model}'s", field="batch-size",
                         fix="choose " + ", ".join(map(str, sizes)))
    counts = cat.gpu_counts(model, batch_size)
    if gpus not in counts:
        raise InputError(f"{model} runs on {', '.join(map(str, counts))} GPUs, not {gpus}",
                         field="gpus", fix="choose " + ", ".join(map(str, counts)))
    return cat.job_type(model, batch_size)


def check_gpu_type(gpu_type: str) -> str:
    """A Slurm GPU type name, normalized (lower case); :class:`InputError` when it is not one."""
    name = normalize_gpu_type(gpu_type)
    if not _GPU_TYPE.match(name):
        raise InputError(f"bad GPU type name {gpu_type!r}", field="gpu-type",
                         fix="give Slurm's type name, e.g. v100 (letters, digits, _ . -)")
    return name


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


# ---------------------------------------------------------------------------------- models

Batch = tuple["torch.Tensor", ...]
LossFn = Callable[["torch.nn.Module", Batch], "torch.Tensor"]


def _build(name: str, batch: int, device: torch.device,
           gen: torch.Generator) -> tuple[torch.nn.Module, Batch, LossFn]:
    """The proxy model of ``name``, one synthetic batch of ``batch`` samples on ``device`` and
    the loss of the model on it."""
    import torch
    from torch import nn
    from torch.nn import functional

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    def ints(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=gen).to(device)

    def classify(model: nn.Module, b: Batch) -> torch.Tensor:
        return functional.cross_entropy(model(b[0]), b[1])

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                nn.BatchNorm2d(cout))
            self.skip: nn.Module = nn.Identity() if stride == 1 and cin == cout else \
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return functional.relu(self.body(x) + self.skip(x))

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip: nn.Module = nn.Identity() if stride == 1 and cin == cout else \
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return functional.relu(self.body(x) + self.skip(x))

    def stem(cout: int) -> list[nn.Module]:
        return [nn.Conv2d(3, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True)]

    def head(cin: int) -> list[nn.Module]:
        return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]

    if name == "resnet18":
        model: nn.Module = nn.Sequential(
            *stem(16), Basic(16, 16, 1), Basic(16, 32, 2), Basic(32, 64, 2), *head(64))
        return model, (rand(batch, 3, 32, 32), ints(10, batch)), classify
    if name == "resnet50":
        blocks: list[nn.Module] = []
        cin = 16
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            blocks += [Bottleneck(cin, width, stride), Bottleneck(width * 4, width, 1)]
            cin = width * 4
        model = nn.Sequential(*stem(16), *blocks, *head(cin))
        return model, (rand(batch, 3, 64, 64), ints(10, batch)), classify
    if name == "transformer":
        vocab, seq = 1000, 20

        class Translator(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.src_embed = nn.Embedding(vocab, 64)
                self.tgt_embed = nn.Embedding(vocab, 64)
                self.core = nn.Transformer(64, 4, 2, 2, 128, 0.1, batch_first=True)
                self.out = nn.Linear(64, vocab)

            def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
                mask = self.core.generate_square_subsequent_mask(tgt.shape[1]).to(tgt.device)
                hidden = self.core(self.src_embed(src), self.tgt_embed(tgt), tgt_mask=mask)
                out: torch.Tensor = self.out(hidden)
                return out

        def translate(model: nn.Module, b: Batch) -> torch.Tensor:
            logits = model(b[0], b[1][:, :-1])
            return functional.cross_entropy(logits.reshape(-1, vocab), b[1][:, 1:].reshape(-1))

        return Translator(), (ints(vocab, batch, seq), ints(vocab, batch, seq + 1)), translate
    if name == "lm":
        vocab, seq = 1000, 35

        class LanguageModel(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(vocab, 64)
                self.lstm = nn.LSTM(64, 128, num_layers=2, batch_first=True)
                self.out = nn.Linear(128, vocab)

            def forward(self, tokens: torch.Tensor) -> torch.Tensor:
                hidden, _ = self.lstm(self.embed(tokens))
                out: torch.Tensor = self.out(hidden)
                return out

        def next_token(model: nn.Module, b: Batch) -> torch.Tensor:
            logits = model(b[0][:, :-1])
            return functional.cross_entropy(logits.reshape(-1, vocab), b[0][:, 1:].reshape(-1))

        return LanguageModel(), (ints(vocab, batch, seq + 1),), next_token
    if name == "recommendation":
        users, items = 10_000, 5_000

        class Recommender(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.users = nn.Embedding(users, 32)
                self.items = nn.Embedding(items, 32)
                self.mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

            def forward(self, u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
                both = torch.cat([self.users(u), self.items(i)], dim=1)
                out: torch.Tensor = self.mlp(both).squeeze(1)
                return out

        def rating(model: nn.Module, b: Batch) -> torch.Tensor:
            return functional.mse_loss(model(b[0], b[1]), b[2])

        return Recommender(), (ints(users, batch), ints(items, batch), rand(batch)), rating
    if name == "a3c":
        actions = 6

        class ActorCritic(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256),
                                          nn.ReLU())
                self.policy = nn.Linear(256, actions)
                self.value = nn.Linear(256, 1)

            def forward(self, states: torch.Tensor) -> torch.Tensor:
                h = self.body(states)
                return torch.cat([self.policy(h), self.value(h)], dim=1)

        def actor_critic(model: nn.Module, b: Batch) -> torch.Tensor:
            out: torch.Tensor = model(b[0])
            logp = functional.log_softmax(out[:, :actions], dim=1)
            taken = logp.gather(1, b[1].unsqueeze(1)).squeeze(1)
            advantage = b[2] - out[:, actions]
            return -(taken * advantage.detach()).mean() + 0.5 * advantage.pow(2).mean()

        return ActorCritic(), (rand(batch, 128), ints(actions, batch), rand(batch)), actor_critic
    if name == "cyclegan":
        def res(ch: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(ch, ch, 3, 1, 1), nn.InstanceNorm2d(ch), nn.ReLU(True),
                                 nn.Conv2d(ch, ch, 3, 1, 1), nn.InstanceNorm2d(ch))

        class Residual(nn.Module):
            def __init__(self, ch: int) -> None:
                super().__init__()
                self.body = res(ch)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                out: torch.Tensor = x + self.body(x)
                return out

        model = nn.Sequential(
            nn.Conv2d(3, 16, 7, 1, 3), nn.InstanceNorm2d(16), nn.ReLU(True),
            nn.Conv2d(16, 32, 3, 2, 1), nn.InstanceNorm2d(32), nn.ReLU(True),
            Residual(32), Residual(32),
            nn.ConvTranspose2d(32, 16, 3, 2, 1, output_padding=1), nn.InstanceNorm2d(16),
            nn.ReLU(True), nn.Conv2d(16, 3, 7, 1, 3), nn.Tanh())

        def translate_image(model: nn.Module, b: Batch) -> torch.Tensor:
            return functional.l1_loss(model(b[0]), b[1])

        return model, (rand(batch, 3, 64, 64), rand(batch, 3, 64, 64).tanh()), translate_image
    if name == "digits":
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        return model, (rand(batch, 64).abs().clamp(max=1.0), ints(10, batch)), classify
    raise InputError(f"no benchmark for model {name!r}", field="model",
                     fix="choose one of " + ", ".join(BENCHMARKS))


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
        return float(self._torch.cuda.max_memory_allocated(self.device)) / (1024 * 1024)


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
    """Benchmark ``model`` (see the module docstring) with ``batch_size`` on ``gpus`` GPUs:
    ``warmup_iters`` untimed iterations (at least 0), then ``timed_iters`` timed ones (default
    :data:`DEFAULT_ITERS`) or as many as fit in ``seconds`` (at least one).  ``device``:
    ``cpu``, ``cuda`` or ``cuda:N``; default the runtime's choice (``HADAR_DEVICE``, else CUDA
    when available).  ``on_iteration(i)`` is called before iteration ``i`` (0-based, warm-up
    included).  Raises :class:`InputError` for a bad model, batch size, GPU count, count of
    iterations or device."""
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


def record_result(store: ThroughputStore, result: ProfileResult, gpu_type: str,
                  *, when: float | None = None) -> Entry:
    """Store ``result``'s rate as ``measured`` for ``(job_type, scale_factor, gpu_type)``."""
    return store.record(result.job_type, result.scale_factor, check_gpu_type(gpu_type),
                        result.steps_per_second, source="measured", when=when)


# ---------------------------------------------------------------------------------- Slurm

@dataclass(frozen=True)
class ProfileRequest:
    """What to profile, as the ``profile`` command's options (what a Slurm job is told)."""

    model: str
    batch_size: int | None
    gpus: int = 1
    warmup_iters: int = DEFAULT_WARMUP
    timed_iters: int | None = None
    seconds: float | None = None
    device: str | None = None
    threads: int | None = None

    def argv(self, gpu_type: str) -> list[str]:
        """``python -m hadar_slurm.cli_nvml profile ...`` for a job on ``gpu_type``: it prints
        its result as JSON and records nothing (the submitter records)."""
        args = [sys.executable, "-m", "hadar_slurm.cli_nvml", "profile", "--model", self.model]
        if self.batch_size is not None:
            args += ["--batch-size", str(self.batch_size)]
        args += ["--gpus", str(self.gpus), "--warmup", str(self.warmup_iters),
                 "--gpu-type", gpu_type, "--no-record", "--json"]
        if self.timed_iters is not None:
            args += ["--iters", str(self.timed_iters)]
        if self.seconds is not None:
            args += ["--seconds", repr(float(self.seconds))]
        if self.device is not None:
            args += ["--device", self.device]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        return args


@dataclass(frozen=True)
class SlurmProfile:
    """One GPU type's profiling job: its ``job_id`` (None when not submitted), final ``state``,
    ``result`` (None when it failed: ``error`` says why) and the ``entry`` recorded."""

    gpu_type: str
    job_id: int | None
    state: str
    result: ProfileResult | None = None
    error: str | None = None
    entry: Entry | None = None

    def summary(self) -> str:
        if self.job_id is None:
            return f"{self.gpu_type}: not submitted: {self.error}"
        job = f"job {self.job_id}"
        if self.result is None:
            return f"{self.gpu_type}: {job} {self.state}: {self.error}"
        r = self.result
        recorded = " (recorded)" if self.entry is not None else ""
        return (f"{self.gpu_type}: {job} {self.state}: {r.steps_per_second:.3f} steps/s on "
                f"{r.device}, p50 {r.iter_ms_p50:.2f} ms{recorded}")


def cluster_gpu_types(nodes: Sequence[SlurmNode], gpus: int) -> dict[str, int]:
    """GPU type -> the most GPUs of it on one node, for the nodes that have at least ``gpus``
    of one type and are not down or drained."""
    out: dict[str, int] = {}
    for node in nodes:
        flags = set(node.state_flags)
        if node.state == "DOWN" or flags & {"DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING"}:
            continue
        for gres in node.gres:
            if gres.name == "gpu" and gres.type and gres.count >= gpus:
                kind = normalize_gpu_type(gres.type)
                out[kind] = max(out.get(kind, 0), gres.count)
    return dict(sorted(out.items()))


def _job_result(out_file: Path, err_file: Path) -> tuple[ProfileResult | None, str | None]:
    """The JSON result a job printed last, else why there is none (its last stderr line)."""
    try:
        lines = out_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        lines, why = [], f"no output file {out_file} ({exc.strerror})"
    else:
        why = "no JSON result in its output"
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return ProfileResult.from_json(json.loads(line), str(out_file)), None
            except (ValueError, InputError) as exc:
                return None, f"bad result in {out_file}: {exc}"
    with contextlib.suppress(OSError):
        tail = [x for x in err_file.read_text(errors="replace").splitlines() if x.strip()]
        if tail:
            why += f"; stderr: {tail[-1][:300]}"
    return None, why


def profile_on_slurm(
    runner: SlurmRunner,
    request: ProfileRequest,
    *,
    store: ThroughputStore | None,
    workdir: Path,
    gpu_types: Sequence[str] | None = None,
    partition: str | None = None,
    timeout_s: float = 600.0,
    poll_s: float = 1.0,
    log: Callable[[str], None] | None = None,
) -> list[SlurmProfile]:
    """Submit one profiling job per GPU type (``gpu_types``, default every type of the
    cluster with a node of at least ``request.gpus`` GPUs), wait for all of them (at most
    ``timeout_s``; the rest are cancelled) and record each result in ``store`` (None: record
    nothing).  ``workdir`` (created if needed) holds the job script and the jobs' output; it
    must be readable and writable on the nodes.  A type with no such node is reported as
    not submitted.  Raises :class:`InputError` for a bad request and
    :class:`~hadar_slurm.slurm.SlurmError` when Slurm cannot be asked."""
    say = log or (lambda _text: None)
    job_type_for(request.model, request.batch_size, request.gpus)  # fail before submitting
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise InputError(f"timeout must be a positive number of seconds, got {timeout_s!r}",
                         field="timeout")
    available = cluster_gpu_types(parse_sinfo_json(runner.run(commands.sinfo_json()).stdout),
                                  request.gpus)
    wanted = [check_gpu_type(t) for t in gpu_types] if gpu_types else list(available)
    if not wanted:
        raise InputError(f"no node of the cluster has {request.gpus} GPUs of one type",
                         field="gpus", fix="profile fewer GPUs per job")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        script = workdir / "profile-job.sh"
        script.write_text(_WRAPPER, encoding="utf-8")
        script.chmod(0o755)
    except OSError as exc:
        raise InputError(f"cannot write the job script: {exc.strerror}", source=str(workdir),
                         field="workdir", fix="give a writable directory the nodes share") \
            from None
    minutes = max(2, math.ceil(timeout_s / 60.0))
    outcomes: dict[str, SlurmProfile] = {}
    jobs: dict[str, int] = {}
    files: dict[str, tuple[Path, Path]] = {}
    try:
        for kind in wanted:
            if kind not in available:
                outcomes[kind] = SlurmProfile(kind, None, "NOT SUBMITTED", error=(
                    f"no up node has {request.gpus} {kind} GPUs"))
                continue
            out, err = workdir / f"profile-{kind}-%j.out", workdir / f"profile-{kind}-%j.err"
            argv = commands.sbatch(
                script=str(script), script_args=request.argv(kind),
                job_name=f"hadar-profile-{kind}", gres=f"gpu:{kind}:{request.gpus}", nodes=1,
                ntasks=1, output=str(out), error=str(err), chdir=str(workdir),
                time_limit=str(minutes), partition=partition, requeue=False)
            job_id = parse_sbatch_parsable(runner.run(argv).stdout)
            jobs[kind] = job_id
            files[kind] = (workdir / f"profile-{kind}-{job_id}.out",
                           workdir / f"profile-{kind}-{job_id}.err")
            say(f"{kind}: submitted job {job_id} (--gres=gpu:{kind}:{request.gpus})")
        states = _wait(runner, jobs, timeout_s, poll_s)
    except BaseException:
        if jobs:  # interrupted or failed: leave no job behind
            runner.run(commands.scancel(list(jobs.values())), check=False)
        raise
    late = [j for kind, j in jobs.items() if states[kind][0] in _LIVE]
    if late:
        runner.run(commands.scancel(late), check=False)
    for kind, job_id in jobs.items():
        state, exit_code = states[kind]
        if state in _LIVE:
            outcomes[kind] = SlurmProfile(kind, job_id, "TIMEOUT", error=(
                f"still {state} after {timeout_s:g} s: cancelled"))
            continue
        result, why = _job_result(*files[kind])
        if result is None:
            code = "" if exit_code is None else f"exit status {exit_code}: "
            outcomes[kind] = SlurmProfile(kind, job_id, state, error=f"{code}{why}")
            continue
        entry = record_result(store, result, kind) if store is not None else None
        outcomes[kind] = SlurmProfile(kind, job_id, state, result=result, entry=entry)
    return [outcomes[k] for k in wanted]


def _wait(runner: SlurmRunner, jobs: Mapping[str, int], timeout_s: float,
          poll_s: float) -> dict[str, tuple[str, int | None]]:
    """Poll squeue until every job has ended or ``timeout_s`` passed: type -> (state, exit
    status).  A job squeue no longer lists (past MinJobAge) has ended: ``GONE``."""
    deadline = time.monotonic() + timeout_s
    states: dict[str, tuple[str, int | None]] = {k: ("PENDING", None) for k in jobs}
    while True:
        try:
            listed = {j.job_id: j for j in parse_squeue_json(
                runner.run(commands.squeue_json()).stdout)}
        except SlurmError:
            listed = None  # a slow or restarting slurmctld: ask again
        if listed is not None:
            for kind, job_id in jobs.items():
                job = listed.get(job_id)
                states[kind] = ("GONE", None) if job is None else (job.state, job.exit_code)
            if all(s not in _LIVE for s, _ in states.values()):
                return states
        if time.monotonic() >= deadline:
            return states
        time.sleep(poll_s)
