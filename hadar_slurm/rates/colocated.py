"""Co-located throughputs: how fast two jobs run while they share the same GPUs (issue #16).

Gavel measured, for every GPU type and every pair of job types with the same scale factor, the
throughputs of the two jobs space-sharing the same ``scale_factor`` GPUs (its
``simulation_throughputs.json``: under ``"('<model>', <sf>)"`` the entry
``"('<other model>', <sf>)": [steps/s of model, steps/s of other model]``, ``[0, 0]`` where the
pair may not share).  A :class:`ColocatedTable` holds them; :func:`hadar_slurm.rates.table.
parse_gavel_json` fills it from that file (it is :attr:`ThroughputTable.pairs
<hadar_slurm.rates.table.ThroughputTable.pairs>`), and :meth:`ColocatedTable.pair_rate` answers
``(rate_a, rate_b)``: whole-job steps/s of each job of the pair, or ``(0.0, 0.0)`` where the
table forbids or lacks the pair.

Only pairs of the same scale factor exist (Gavel only packs jobs with the same scale factor).
The table is symmetric by construction: a pair is stored in both orders.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hadar_slurm.model import GpuType

#: ``(job type a, job type b, scale factor)``.
PairKey = tuple[str, str, int]


@dataclass(frozen=True)
class ColocatedTable:
    """``rates[(job_a, job_b, scale)][gpu_type] = (steps/s of a, steps/s of b)`` while ``a``
    and ``b`` share ``scale`` GPUs of ``gpu_type``; every pair is present in both orders."""

    rates: Mapping[PairKey, Mapping[GpuType, tuple[float, float]]] = field(default_factory=dict)
    source: str = "<pairs>"

    def pair_rate(self, job_a: str, job_b: str, scale: int,
                  gpu_type: GpuType) -> tuple[float, float]:
        """Whole-job steps/s of ``job_a`` and of ``job_b`` while they share ``scale`` GPUs of
        ``gpu_type``; ``(0.0, 0.0)`` where the table forbids the pair (either rate is 0) or
        lacks it."""
        got = self.rates.get((job_a, job_b, scale), {}).get(gpu_type)
        if got is None or got[0] <= 0 or got[1] <= 0:
            return (0.0, 0.0)
        return (float(got[0]), float(got[1]))

    def can_share(self, job_a: str, job_b: str, scale: int, gpu_type: GpuType) -> bool:
        return self.pair_rate(job_a, job_b, scale, gpu_type)[0] > 0

    def __len__(self) -> int:
        """Pairs (unordered) times GPU types with an entry, forbidden ones included."""
        return sum(len(per_gpu) for (a, b, _s), per_gpu in self.rates.items() if a <= b)

    def merged(self, other: ColocatedTable) -> ColocatedTable:
        """Entries of ``other`` override ours, one ``(pair, gpu)`` entry at a time."""
        out: dict[PairKey, dict[GpuType, tuple[float, float]]] = {
            k: dict(v) for k, v in self.rates.items()}
        for key, per_gpu in other.rates.items():
            out.setdefault(key, {}).update(per_gpu)
        return ColocatedTable(out, f"{self.source}+{other.source}")
