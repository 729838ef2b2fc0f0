"""What HadarE's model consolidation costs: seconds per consolidation, by model size.

At every consolidation point (the end of each round) the job tracker gathers the parameters of
every copy of a forked job, averages them (weighted by the iterations each did since the last
consolidation) and sends the result back; the copies make no progress meanwhile.  The time that
takes grows with the size of the model: ``base_s + size_gb * s_per_gb``.  The simulator charges
it to every round a job runs forked, and ``hadare`` weighs it before forking a job.

Model sizes are fp32 parameter counts of the models behind Gavel's job types (ResNet-18 11.7 M,
ResNet-50 25.6 M, the Transformer of "Attention is all you need" (base) 65 M, the 2-layer LSTM
language model 33 M, the recommendation autoencoder 20 M, CycleGAN's generators and
discriminators 28 M, A3C 1 M); a model not listed counts as ``default_mb``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hadar_slurm.errors import InputError
from hadar_slurm.rates.table import split_job_type

#: Parameter sizes in MB (fp32) by the model name before " (batch size ...)".
MODEL_SIZE_MB: Mapping[str, float] = MappingProxyType({
    "ResNet-18": 46.8,
    "ResNet-50": 102.4,
    "Transformer": 260.0,
    "LM": 132.0,
    "Recommendation": 80.0,
    "CycleGAN": 114.0,
    "A3C": 4.0,
})


def model_name(job_type: str) -> str:
    """``"ResNet-50 (batch size 64)"`` -> ``"ResNet-50"``
    (:func:`hadar_slurm.rates.table.split_job_type`)."""
    return split_job_type(job_type)[0]


@dataclass(frozen=True)
class ConsolidationCost:
    """Seconds one consolidation of a forked job takes: ``base_s + size_gb * s_per_gb``.

    The defaults assume parameters travel to the tracker and back over about 200 MB/s of
    effective bandwidth (10 s per GB) plus 2 s of synchronisation.
    """

    base_s: float = 2.0
    s_per_gb: float = 10.0
    default_mb: float = 100.0
    sizes_mb: Mapping[str, float] = field(default_factory=lambda: MODEL_SIZE_MB)

    def __post_init__(self) -> None:
        for name in ("base_s", "s_per_gb", "default_mb"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value >= 0 and value == value
                    and value != float("inf")):
                raise InputError(f"must be a finite number >= 0, got {value!r}",
                                 source="consolidation cost", field=name)

    def size_mb(self, job_type: str) -> float:
        return float(self.sizes_mb.get(model_name(job_type), self.default_mb))

    def seconds(self, job_type: str) -> float:
        """Seconds one consolidation of a job of ``job_type`` takes."""
        return self.base_s + self.size_mb(job_type) / 1024.0 * self.s_per_gb


__all__ = ["MODEL_SIZE_MB", "ConsolidationCost", "model_name"]
