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

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hadar_slurm.model import GpuType
from hadar_slurm.rates.memory import MemoryLimits

#: ``(job type a, job type b, scale factor)``.
PairKey = tuple[str, str, int]
#: A job's kind for pairing: ``(job type, scale factor)``.
KindKey = tuple[str, int]
#: How many of :meth:`ColocatedTable.pair_cube`'s answers a table remembers.
CUBES_KEPT = 64


@dataclass(frozen=True)
class ColocatedTable:
    """``rates[(job_a, job_b, scale)][gpu_type] = (steps/s of a, steps/s of b)`` while ``a``
    and ``b`` share ``scale`` GPUs of ``gpu_type``; every pair is present in both orders."""

    rates: Mapping[PairKey, Mapping[GpuType, tuple[float, float]]] = field(default_factory=dict)
    source: str = "<pairs>"
    #: The ``(pair, GPU type)`` entries that are estimates (:meth:`with_estimates`), not
    #: measurements.
    estimated: frozenset[tuple[PairKey, GpuType]] = frozenset()
    #: The ``(pair, GPU type)`` entries the table allowed that the two jobs' memory does not
    #: (:meth:`within_memory`): forbidden here.
    memory_refused: frozenset[tuple[PairKey, GpuType]] = frozenset()
    #: :meth:`pair_rates_on`'s answers, remembered (the table does not change).
    _on_types: dict[tuple[PairKey, tuple[GpuType, ...]],
                    tuple[tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    #: :meth:`pair_cube`'s answers, the :data:`CUBES_KEPT` latest remembered.
    _cubes: dict[tuple[tuple[KindKey, ...], tuple[KindKey, ...], tuple[GpuType, ...]],
                 tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def is_estimate(self, job_a: str, job_b: str, scale: int, gpu_type: GpuType) -> bool:
        return ((job_a, job_b, scale), gpu_type) in self.estimated

    def pair_rate(self, job_a: str, job_b: str, scale: int,
                  gpu_type: GpuType) -> tuple[float, float]:
        """Whole-job steps/s of ``job_a`` and of ``job_b`` while they share ``scale`` GPUs of
        ``gpu_type``; ``(0.0, 0.0)`` where the table forbids the pair (either rate is 0) or
        lacks it."""
        got = self.rates.get((job_a, job_b, scale), {}).get(gpu_type)
        if got is None or got[0] <= 0 or got[1] <= 0:
            return (0.0, 0.0)
        return (float(got[0]), float(got[1]))

    def pair_rates_on(self, job_a: str, job_b: str, scale: int, gpu_types: tuple[GpuType, ...],
                      ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """:meth:`pair_rate` on each of ``gpu_types``: ``(rates of a, rates of b)``, one per
        type (remembered: a policy asks it of every pair of job kinds, every epoch)."""
        key = ((job_a, job_b, scale), gpu_types)
        got = self._on_types.get(key)
        if got is None:
            both = [self.pair_rate(job_a, job_b, scale, g) for g in gpu_types]
            got = self._on_types[key] = (tuple(a for a, _b in both), tuple(b for _a, b in both))
        return got

    def pair_cube(self, kinds_a: tuple[KindKey, ...], kinds_b: tuple[KindKey, ...],
                  gpu_types: tuple[GpuType, ...],
                  ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """:meth:`pair_rates_on` for every kind of ``kinds_a`` with every kind of ``kinds_b``:
        ``(rates of a, rates of b)``, each ``[a, b, GPU type]`` (read-only), 0 where the two
        may not share (their scale factors differ, or the table forbids or lacks the pair).
        Remembered, the latest :data:`CUBES_KEPT` (a policy asks it every epoch, of the kinds
        of its queue, which change slowly)."""
        key = (kinds_a, kinds_b, gpu_types)
        got = self._cubes.get(key)
        if got is not None:
            return got
        of_a = np.zeros((len(kinds_a), len(kinds_b), len(gpu_types)))
        of_b = np.zeros((len(kinds_a), len(kinds_b), len(gpu_types)))
        for x, (ta, sa) in enumerate(kinds_a):
            for y, (tb, sb) in enumerate(kinds_b):
                if sa == sb:
                    of_a[x, y], of_b[x, y] = self.pair_rates_on(ta, tb, sa, gpu_types)
        both = (of_a > 0) & (of_b > 0)  # (a pair either of whose rates is 0 may not share)
        of_a[~both] = 0.0
        of_b[~both] = 0.0
        of_a.setflags(write=False)
        of_b.setflags(write=False)
        if len(self._cubes) >= CUBES_KEPT:
            del self._cubes[next(iter(self._cubes))]
        self._cubes[key] = (of_a, of_b)
        return of_a, of_b

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
        # (a measurement of other's replaces an estimate of ours; its estimates stay ones)
        kept = {e for e in self.estimated if e[1] not in other.rates.get(e[0], {})}
        return ColocatedTable(out, f"{self.source}+{other.source}",
                              frozenset(kept | other.estimated),
                              self.memory_refused | other.memory_refused)

    def within_memory(self, limits: MemoryLimits) -> ColocatedTable:
        """The table with every pair whose two footprints do not fit in the GPU type's memory
        forbidden (:class:`~hadar_slurm.rates.memory.MemoryLimits`; listed in
        :attr:`memory_refused`).  A pair whose footprints or memory are unknown keeps the
        table's word."""
        if not limits.footprint:
            return self
        out: dict[PairKey, dict[GpuType, tuple[float, float]]] = {
            k: dict(v) for k, v in self.rates.items()}
        refused = set(self.memory_refused)
        for (a, b, scale), per_gpu in self.rates.items():
            for g, (ra, rb) in per_gpu.items():
                if ra > 0 and rb > 0 and limits.fits(a, b, scale, g) is False:
                    out[(a, b, scale)][g] = (0.0, 0.0)
                    refused.add(((a, b, scale), g))
        return ColocatedTable(out, self.source, self.estimated, frozenset(refused))

    def with_estimates(self, rate: Callable[[str, int, GpuType], float],
                       gpu_types: Iterable[GpuType]) -> ColocatedTable:
        """The table, with the pairs on ``gpu_types`` it has no measurement for estimated
        (Gavel measured k80, p100 and v100 only: an a100 or h100 has no pair).

        The estimate is conservative: each job keeps the smallest share of its own speed
        (co-located rate / isolated rate, ``rate(job type, scale, GPU type)``) that it kept on
        any measured type, times its isolated rate on the new type; a pair that some measured
        type forbids (out of memory, or slower than taking turns) stays forbidden.  No estimate
        where neither job has a measured type, or a job does not run on the new type.  The
        estimates are listed in :attr:`estimated` (``explain`` and the logs say so)."""
        out: dict[PairKey, dict[GpuType, tuple[float, float]]] = {
            k: dict(v) for k, v in self.rates.items()}
        guessed = set(self.estimated)
        types = tuple(gpu_types)
        for key, per_gpu in self.rates.items():
            a, b, scale = key
            if a > b:
                continue  # (each pair once; the mirror is written with it)
            missing = [g for g in types if g not in per_gpu
                       and rate(a, scale, g) > 0 and rate(b, scale, g) > 0]
            if not missing:
                continue
            share_a = share_b = math.inf
            measured = 0
            for g, (ca, cb) in per_gpu.items():
                ra, rb = rate(a, scale, g), rate(b, scale, g)
                if ra <= 0 or rb <= 0:
                    continue
                measured += 1
                share_a, share_b = min(share_a, ca / ra), min(share_b, cb / rb)
            if not measured:
                continue
            mirror = out.setdefault((b, a, scale), {})
            for g in missing:
                ra, rb = rate(a, scale, g), rate(b, scale, g)
                got = ((share_a * ra, share_b * rb) if share_a > 0 and share_b > 0
                       else (0.0, 0.0))
                out[key][g] = got
                mirror[g] = (got[1], got[0])
                guessed.update({(key, g), ((b, a, scale), g)})
        return ColocatedTable(out, self.source, frozenset(guessed), self.memory_refused)
