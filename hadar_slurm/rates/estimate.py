"""Estimating throughputs never measured, from the rest of the table (matrix completion).

The table is a matrix: rows are ``(job_type, scale_factor)``, columns GPU types.  Throughputs are
multiplicative (a GPU twice as fast runs every job about twice as fast), so the model works on
``L[i, g] = log rate[i, g]`` and explains it as a sum of effects, fitted on the observed entries
only::

    L[i, g] = mu + b[g]                                  global level, column (GPU type) effect
            + a[i] + A_job[job(i)] + A_fs[fam(i), sf(i)] + A_sf[sf(i)]         row level
            + T_fam[fam(i), g] + T_job[job(i), g] + T_fs[fam(i), sf(i), g] + T_sf[sf(i), g]
            + u[i] . v[g]                                low-rank interaction (rank k)

* ``job(i)`` is the row's job type, ``sf(i)`` its scale factor and ``fam(i)`` its model family:
  the job type without a trailing ``(batch size N)`` (``ResNet-50 (batch size 64)`` ->
  ``ResNet-50``; a name without it is its own family).
* The ``T`` terms are interactions between a GPU type and a *group* of rows: how much better a
  V100 is than a K80 is shared by all scale factors of one job type, by all batch sizes of a
  family at one scale factor, and so on.  They are ridge-penalised with weight ``reg``, so a
  group with little evidence stays near the global column effect.
* The row level ``a[i]`` (how fast this row is overall) is ridge-penalised with weight
  ``row_reg`` towards the level of its job type and of its family at that scale factor, so the
  other scale factors of a job on the same GPU type inform it (``row_reg = 0``: a free row
  effect, determined by the row's own observations only).
* ``u[i] . v[g]`` is a rank-``k`` interaction, ridge-penalised with weight ``reg``, fitted by
  alternating least squares (ALS) together with the linear terms: linear terms given ``U V^T``
  (one regularised least-squares solve), then ``U`` given ``V``, then ``V`` given ``U``, from a
  deterministic start (the SVD of the residuals), for a fixed number of sweeps.

With ``rank``, ``reg`` and ``row_reg`` left as None, each is chosen by K-fold cross-validation
on the observed entries (folds drawn with a fixed seed, so the result is deterministic): the
candidate with the smallest mean ``|log estimate - log observed|`` over the held-out entries
wins.  Only observed entries are ever used; an entry being estimated is never seen.

What is observed: a positive rate.  An explicit ``0.0`` means the job type does not run on that
GPU type (Gavel's table has such entries, e.g. out of memory); it is kept as it is, neither used
in the fit nor estimated.  A row with no positive rate at all cannot be estimated: it is left as
it is and returned in :attr:`Completion.unestimable`.  A GPU type asked for with no positive rate
in the table is an :class:`~hadar_slurm.errors.InputError`.

Everything here is a pure function of its arguments (NumPy only).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hadar_slurm.errors import InputError
from hadar_slurm.model import GpuType, normalize_gpu_type
from hadar_slurm.rates.table import JobKey, ThroughputTable, split_job_type

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

EntryKey = tuple[str, int, GpuType]
"""``(job_type, scale_factor, gpu_type)``: one entry of a throughput table."""

#: Candidates tried by cross-validation for each hyperparameter left as None.
RANKS = (0, 1)
REGS = (0.1, 0.3, 1.0)
ROW_REGS = (0.0, 1.0, 3.0, 10.0)
#: Folds of the inner cross-validation, and the seed that draws them.
FOLDS = 5
FOLD_SEED = 0
#: ALS sweeps when ``rank > 0``.
SWEEPS = 30
#: Weight that keeps the "unpenalised" terms (mu, b, A_*) identifiable; small enough that a
#: table the model explains exactly is recovered to about 1e-7 relative.
TINY = 1e-7

def model_family(job_type: str) -> str:
    """``ResNet-50 (batch size 64)`` -> ``ResNet-50``; a name without a batch size is its own
    (:func:`hadar_slurm.rates.table.split_job_type`)."""
    return split_job_type(job_type)[0]


@dataclass(frozen=True)
class Completion:
    """A completed table and what in it is an estimate.

    ``table`` holds every observed entry unchanged plus one estimate for each missing entry of
    an estimable row (over the GPU types asked for); ``estimated`` names exactly those
    estimates.  ``unestimable`` rows had no positive rate and are left as they were.
    ``rank``, ``reg`` and ``row_reg`` are the hyperparameters used (given or chosen);
    ``cv_error`` is the winner's cross-validated mean absolute log error (NaN when nothing was
    chosen by cross-validation).
    """

    table: ThroughputTable
    estimated: frozenset[EntryKey]
    unestimable: frozenset[JobKey]
    rank: int
    reg: float
    row_reg: float
    cv_error: float = math.nan

    def estimates(self) -> Iterator[tuple[str, int, GpuType, float]]:
        """``(job_type, scale_factor, gpu_type, rate)`` of each estimate, in a stable order;
        e.g. ``for job, sf, gpu, rate in c.estimates(): store.estimate(job, sf, gpu, rate)``."""
        for job, sf, gpu in sorted(self.estimated):
            yield job, sf, gpu, self.table.rate(job, sf, gpu)

    def optimistic(self, factor: float) -> ThroughputTable:
        """The completed table with every estimate multiplied by ``factor`` (>= 1): what a
        scheduler that learns the true rates once a job runs (the sidecar's online learning)
        plans with, so that it tries the pairs never measured instead of never placing a job
        where an estimate happens to be too low ("optimism in the face of uncertainty"; an
        estimate that is too high is corrected after one round, one too low never is)."""
        if not (math.isfinite(factor) and factor >= 1):
            raise InputError(f"the optimism factor must be >= 1, got {factor}", field="factor",
                             fix="use 1 (plain estimates) or more")
        rates = {key: dict(per_gpu) for key, per_gpu in self.table.rates.items()}
        for job, sf, gpu in self.estimated:
            rates[(job, sf)][gpu] *= factor
        return ThroughputTable(rates, f"{self.table.source}*optimism{factor:g}")


@dataclass(frozen=True)
class _Matrix:
    """The table as a matrix over estimable rows, and the fixed design of the linear terms."""

    rows: tuple[JobKey, ...]
    cols: tuple[GpuType, ...]
    log_rate: FloatArray  # (n, m); NaN where not observed (missing or 0)
    observed: BoolArray  # (n, m)
    design: FloatArray  # (n * m, p): linear terms of entry (i, g) at row i * m + g
    reg_kind: IntArray  # (p,): 0 tiny, 1 reg (column interactions), 2 row_reg (row level)


def _one_hot(labels: Sequence[object]) -> tuple[IntArray, int]:
    index: dict[object, int] = {}
    ids = np.array([index.setdefault(x, len(index)) for x in labels], dtype=np.int64)
    return ids, len(index)


def _matrix(table: ThroughputTable, rows: Sequence[JobKey], cols: Sequence[GpuType]) -> _Matrix:
    n, m = len(rows), len(cols)
    rate = np.array([[table.rate(job, sf, g) for g in cols] for job, sf in rows],
                    dtype=np.float64).reshape(n, m)
    observed = rate > 0
    log_rate = np.full((n, m), np.nan)
    log_rate[observed] = np.log(rate[observed])
    row_of = np.repeat(np.arange(n), m)
    col_of = np.tile(np.arange(m), n)
    fam: list[object] = [model_family(job) for job, _sf in rows]
    groups: dict[str, list[object]] = {
        "job": [job for job, _sf in rows],
        "fam": fam,
        "fam_sf": [(model_family(job), sf) for job, sf in rows],
        "sf": [sf for _job, sf in rows],
        "row": list(range(n)),
    }
    blocks: list[FloatArray] = []
    kinds: list[int] = []

    def add(ids: IntArray, k: int, kind: int) -> None:
        block = np.zeros((n * m, k))
        used = ids >= 0
        block[np.flatnonzero(used), ids[used]] = 1.0
        blocks.append(block)
        kinds.extend([kind] * k)

    add(np.zeros(n * m, dtype=np.int64), 1, 0)  # mu
    add(col_of, m, 0)  # b[g]
    for name, kind in (("job", 0), ("fam_sf", 2), ("sf", 2), ("row", 2)):  # row level
        ids, k = _one_hot(groups[name])
        add(ids[row_of], k, kind)
    for name in ("fam", "job", "fam_sf", "sf"):  # group x GPU type interactions
        # Only groups of two rows or more: a one-row group's interaction is that row's own
        # deviation, which carries nothing to other entries (the low-rank term may explain it).
        shared = [x if groups[name].count(x) > 1 else None for x in groups[name]]
        ids, k = _one_hot([x for x in shared if x is not None])
        level = np.full(n, -1, dtype=np.int64)
        level[[i for i, x in enumerate(shared) if x is not None]] = ids
        add(np.where(level[row_of] >= 0, level[row_of] * m + col_of, -1), k * m, 1)
    return _Matrix(tuple(rows), tuple(cols), log_rate, observed, np.hstack(blocks),
                   np.array(kinds, dtype=np.int64))


def _fit(mat: _Matrix, mask: BoolArray, rank: int, reg: float, row_reg: float) -> FloatArray:
    """Fit on the entries of ``mask`` (all observed) and return the (n, m) log-rate model."""
    n, m = mask.shape
    flat = np.flatnonzero(mask.ravel())
    x = mat.design[flat]
    y = mat.log_rate.ravel()[flat]
    penalty = np.array([TINY, reg, row_reg], dtype=np.float64)[mat.reg_kind] + TINY
    # The linear terms' fit is a fixed linear map of the targets: hat = D (X'X + P)^-1 X'.
    hat = mat.design @ np.linalg.solve(x.T @ x + np.diag(penalty), x.T)
    ii, gg = np.divmod(flat, m)
    base = (hat @ y).reshape(n, m)
    if rank == 0:
        return base
    resid = np.zeros((n, m))
    resid[ii, gg] = y - base[ii, gg]
    _u, s, vt = np.linalg.svd(resid, full_matrices=False)
    k = min(rank, m)
    v = vt[:k].T * np.sqrt(s[:k])
    u = np.zeros((n, k))
    w = mask.astype(np.float64)
    ridge = reg * np.eye(k)
    for _ in range(SWEEPS):
        resid = np.where(mask, mat.log_rate - base, 0.0)
        # u[i] = (sum_{g obs} v_g v_g' + reg I)^-1 sum_{g obs} v_g r_ig, all rows at once.
        u = np.linalg.solve(np.einsum("ig,ga,gb->iab", w, v, v) + ridge,
                            (resid @ v)[:, :, None])[:, :, 0]
        v = np.linalg.solve(np.einsum("ig,ia,ib->gab", w, u, u) + ridge,
                            (resid.T @ u)[:, :, None])[:, :, 0]
        inter = u @ v.T
        base = (hat @ (y - inter[ii, gg])).reshape(n, m)
    model: FloatArray = base + u @ v.T
    return model


def _cv_error(mat: _Matrix, folds: int, rank: int, reg: float, row_reg: float) -> float:
    """Mean |log estimate - log observed| over K folds of the observed entries."""
    obs = np.flatnonzero(mat.observed.ravel())
    fold = np.random.default_rng(FOLD_SEED).permutation(obs.shape[0]) % folds
    errors: list[FloatArray] = []
    truth = mat.log_rate.ravel()
    for f in range(folds):
        held = obs[fold == f]
        if held.shape[0] == 0:
            continue
        mask = mat.observed.copy().ravel()
        mask[held] = False
        model = _fit(mat, mask.reshape(mat.observed.shape), rank, reg, row_reg).ravel()
        errors.append(np.abs(model[held] - truth[held]))
    return float(np.concatenate(errors).mean()) if errors else math.inf


def _columns(table: ThroughputTable, gpu_types: Sequence[str] | None) -> tuple[GpuType, ...]:
    if gpu_types is None:
        cols = table.gpu_types()
    else:
        cols = tuple(dict.fromkeys(normalize_gpu_type(g) for g in gpu_types))
    if not cols:
        raise InputError("no GPU types to estimate over", source=table.source,
                         field="gpu_types", fix="name at least one GPU type")
    for g in cols:
        if not any(per_gpu.get(g, 0.0) > 0 for per_gpu in table.rates.values()):
            raise InputError(
                f"GPU type {g!r} has no measured throughput, so nothing on it can be estimated",
                source=table.source, field="gpu_types",
                fix=f"measure at least one job type on {g}, or leave {g} out",
            )
    return cols


def complete(
    table: ThroughputTable,
    *,
    gpu_types: Sequence[str] | None = None,
    rank: int | None = None,
    reg: float | None = None,
    row_reg: float | None = None,
    folds: int = FOLDS,
) -> Completion:
    """Estimate every missing ``(job_type, scale_factor, gpu_type)`` entry of ``table``.

    ``gpu_types``: the columns (default: every GPU type in the table).  ``rank``, ``reg`` and
    ``row_reg`` (see the module docstring) are chosen by ``folds``-fold cross-validation on the
    observed entries when None.  Observed entries, and entries outside ``gpu_types``, are
    returned unchanged; a row with no positive rate is returned unchanged and listed in
    :attr:`Completion.unestimable`.  Deterministic.
    """
    cols = _columns(table, gpu_types)
    if rank is not None and not 0 <= rank <= len(cols):
        raise InputError(f"rank must be between 0 and {len(cols)} (the GPU types), got {rank}",
                         field="rank", fix=f"use 0..{len(cols)}")
    for name, value in (("reg", reg), ("row_reg", row_reg)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InputError(f"{name} must be finite and >= 0, got {value}", field=name,
                             fix="use a number >= 0")
    if folds < 2:
        raise InputError(f"folds must be at least 2, got {folds}", field="folds", fix="use 5")
    rows = [key for key, per_gpu in table.rates.items() if any(r > 0 for r in per_gpu.values())]
    unestimable = frozenset(key for key in table.rates if key not in set(rows))
    mat = _matrix(table, rows, cols)
    missing = [(i, g) for i, (job, sf) in enumerate(rows) for g, gpu in enumerate(cols)
               if gpu not in table.rates[(job, sf)]]
    ranks = RANKS if rank is None else (rank,)
    regs = REGS if reg is None else (reg,)
    row_regs = ROW_REGS if row_reg is None else (row_reg,)
    candidates = [(k, lam, rlam) for k in ranks for lam in regs for rlam in row_regs
                  if not (k > 0 and lam == 0)]
    if not candidates:
        raise InputError("rank > 0 needs reg > 0", field="reg", fix="use reg > 0 or rank 0")
    best, cv = candidates[0], math.nan
    if missing and len(candidates) > 1:
        scored = [(_cv_error(mat, folds, *c), n, c) for n, c in enumerate(candidates)]
        cv, _n, best = min(scored)
    out = {key: dict(per_gpu) for key, per_gpu in table.rates.items()}
    estimated: set[EntryKey] = set()
    if missing:
        model = _fit(mat, mat.observed, *best)
        for i, g in missing:
            job, sf = rows[i]
            out[(job, sf)][cols[g]] = float(np.exp(model[i, g]))
            estimated.add((job, sf, cols[g]))
    return Completion(
        table=ThroughputTable(out, f"{table.source}+estimated" if estimated else table.source),
        estimated=frozenset(estimated), unestimable=unestimable,
        rank=best[0], reg=best[1], row_reg=best[2], cv_error=cv,
    )


def without(table: ThroughputTable, keys: Sequence[EntryKey] | frozenset[EntryKey]
            ) -> ThroughputTable:
    """``table`` with the entries ``keys`` removed (as if never measured)."""
    drop = set(keys)
    rates = {(job, sf): {g: r for g, r in per_gpu.items() if (job, sf, g) not in drop}
             for (job, sf), per_gpu in table.rates.items()}
    return ThroughputTable(rates, table.source)


def hide_random(table: ThroughputTable, fraction: float, *, seed: int) -> frozenset[EntryKey]:
    """A seeded random ``fraction`` of the positive entries, keeping at least one per row.

    Rows are visited in a seeded random order; an entry is hidden while its row would keep at
    least one positive entry, until ``round(fraction * positive entries)`` are hidden (fewer
    when the rows cannot spare that many).
    """
    if not 0 <= fraction < 1:
        raise InputError(f"fraction must be in [0, 1), got {fraction}", field="fraction",
                         fix="e.g. 0.33 to hide a third")
    entries = [(job, sf, g) for (job, sf), per_gpu in sorted(table.rates.items())
               for g, r in sorted(per_gpu.items()) if r > 0]
    target = round(fraction * len(entries))
    left = {key: sum(1 for r in per_gpu.values() if r > 0) for key, per_gpu in table.rates.items()}
    hidden: set[EntryKey] = set()
    for n in np.random.default_rng(seed).permutation(len(entries)).tolist():
        if len(hidden) >= target:
            break
        job, sf, g = entries[n]
        if left[(job, sf)] > 1:
            hidden.add((job, sf, g))
            left[(job, sf)] -= 1
    return frozenset(hidden)


@dataclass(frozen=True)
class LooEntry:
    """One entry hidden in turn: its true rate and the estimate from the rest of the table."""

    key: EntryKey
    true_rate: float
    estimate: float

    @property
    def rel_error(self) -> float:
        return abs(self.estimate - self.true_rate) / self.true_rate


def leave_one_out(
    table: ThroughputTable,
    *,
    gpu_types: Sequence[str] | None = None,
    keys: Sequence[EntryKey] | None = None,
    rank: int | None = None,
    reg: float | None = None,
    row_reg: float | None = None,
    folds: int = FOLDS,
) -> list[LooEntry]:
    """Hide each positive entry (or each of ``keys``) in turn and estimate it from the rest.

    Each estimate comes from :func:`complete` on the table without that entry, so any
    cross-validation happens on the remaining entries only.  An entry whose row has nothing
    else observed is skipped (it could not be estimated).
    """
    cols = _columns(table, gpu_types)
    if keys is None:
        keys = [(job, sf, g) for (job, sf), per_gpu in table.rates.items()
                for g in cols if per_gpu.get(g, 0.0) > 0]
    out: list[LooEntry] = []
    for job, sf, g in keys:
        truth = table.rate(job, sf, g)
        if truth <= 0:
            raise InputError(f"no positive rate to hide for {job!r} x{sf} on {g}",
                             source=table.source, field="keys", fix="hide measured entries")
        c = complete(without(table, [(job, sf, g)]), gpu_types=cols, rank=rank, reg=reg,
                     row_reg=row_reg, folds=folds)
        if (job, sf, g) in c.estimated:
            out.append(LooEntry((job, sf, g), truth, c.table.rate(job, sf, g)))
    return out
