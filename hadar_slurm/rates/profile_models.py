"""The benchmark models of ``hadar-slurm profile``: the catalogue and the models' construction.

:data:`BENCHMARKS` lists the built-in benchmark models; :func:`job_type_for` gives a benchmark's
job type in the throughput table (checking its batch size and GPU count against the catalog),
:func:`check_gpu_type` checks a Slurm GPU type name, and ``_build`` builds a proxy model with its
synthetic batch and loss.  :mod:`hadar_slurm.rates.profile` measures a model's throughput;
:mod:`hadar_slurm.rates.profile_slurm` profiles every GPU type of a Slurm cluster.

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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hadar_slurm.errors import InputError
from hadar_slurm.hints import ModelCatalog
from hadar_slurm.model import normalize_gpu_type

if TYPE_CHECKING:
    import torch

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "check_gpu_type",
    "job_type_for",
]

_GPU_TYPE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


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
