"""PNG plots of simulated schedules (matplotlib, Agg backend: no display needed).

* ``jct_cdf.png``: the CDF of job completion times, one line per policy, in hours.
* ``gpus_busy.png``: GPUs busy per type over time, one subplot per policy, stacked by GPU type.
  In a round ``[start, end)`` a type's busy GPUs are ``busy_gpu_s / (end - start)``.
* ``copies.png`` (only when a policy forked jobs, i.e. ``hadare``): copies per job over time,
  one step line per forked job (the 12 forked longest), one subplot per such policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from hadar_slurm.policy.base import FloatArray
from hadar_slurm.sim.run import SimResult

HOUR = 3600.0


def jct_cdf_points(result: SimResult) -> tuple[FloatArray, FloatArray]:
    """``(x, y)``: sorted JCTs in hours and the fraction of all jobs done within each."""
    jct = np.sort(result.jct) / HOUR
    frac = np.arange(1, jct.shape[0] + 1, dtype=np.float64) / max(result.num_jobs, 1)
    return jct, frac


def busy_steps(result: SimResult, t0: float) -> tuple[FloatArray, FloatArray]:
    """Step curve of busy GPUs: ``x`` (hours since ``t0``) and ``y[type, point]``.

    Each round contributes a flat segment; time when nothing ran (no round recorded) is zero.
    """
    xs: list[float] = []
    ys: list[FloatArray] = []
    zero = np.zeros(len(result.gpu_types))
    prev_end: float | None = None
    for u in result.usage:
        span = u.end - u.start
        if span <= 0:
            continue
        if prev_end is not None and u.start > prev_end:
            xs += [prev_end, u.start]
            ys += [zero, zero]
        busy = np.asarray(u.busy_gpu_s, dtype=np.float64) / span
        xs += [u.start, u.end]
        ys += [busy, busy]
        prev_end = u.end
    if not xs:
        return np.zeros(0), np.zeros((len(result.gpu_types), 0))
    x = (np.asarray(xs, dtype=np.float64) - t0) / HOUR
    y = np.stack(ys, axis=1)
    return x, y


def plot_jct_cdf(results: Sequence[SimResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        x, y = jct_cdf_points(r)
        if x.shape[0]:
            ax.step(np.concatenate([[0.0], x]), np.concatenate([[0.0], y]), where="post",
                    label=f"{r.policy} ({r.num_completed}/{r.num_jobs} done)")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    if results:
        ax.set_title(f"JCT CDF on {results[0].cluster}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_gpus_busy(results: Sequence[SimResult], path: Path) -> Path:
    n = max(len(results), 1)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.4 * n + 0.6), sharex=True, squeeze=False)
    t0 = min((float(np.min(r.arrival)) for r in results if r.arrival.shape[0]), default=0.0)
    for ax, r in zip(axes[:, 0], results, strict=False):
        x, y = busy_steps(r, t0)
        total = sum(r.capacity)
        if x.shape[0]:
            ax.stackplot(x, y, labels=[f"{g} ({c})" for g, c in
                                       zip(r.gpu_types, r.capacity, strict=True)])
        ax.axhline(total, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylim(0, total * 1.08 if total else 1)
        ax.set_ylabel("GPUs busy")
        ax.set_title(r.policy, loc="left", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("simulated time (hours)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def copies_steps(result: SimResult, t0: float, top: int = 12) -> dict[int, tuple[
        FloatArray, FloatArray]]:
    """Per forked job (the ``top`` forked in most rounds): ``(x hours, copies)`` over the rounds
    that ran anything; NaN where the job ran unforked or not at all."""
    rounds = [(u.start, u.end) for u in result.usage if u.end > u.start]
    forked_at = dict(result.copies)
    counts: dict[int, int] = {}
    for _t, forked in result.copies:
        for j in forked:
            counts[j] = counts.get(j, 0) + 1
    chosen = sorted(counts, key=lambda j: (-counts[j], j))[:top]
    out: dict[int, tuple[FloatArray, FloatArray]] = {}
    for j in sorted(chosen):
        xs: list[float] = []
        ys: list[float] = []
        for start, end in rounds:
            k = forked_at.get(start, {}).get(j)
            value = float(k) if k is not None else float("nan")
            xs += [start, end]
            ys += [value, value]
        out[j] = ((np.asarray(xs) - t0) / HOUR, np.asarray(ys))
    return out


def plot_copies(results: Sequence[SimResult], path: Path) -> Path:
    forking = [r for r in results if r.copies]
    n = max(len(forking), 1)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.6 * n + 0.6), sharex=True, squeeze=False)
    t0 = min((float(np.min(r.arrival)) for r in results if r.arrival.shape[0]), default=0.0)
    for ax, r in zip(axes[:, 0], forking, strict=False):
        for j, (x, y) in copies_steps(r, t0).items():
            ax.plot(x, y, linewidth=1.2, label=f"job {j}")
        ax.set_ylabel("copies")
        ax.set_ylim(0, r.max_copies + 0.8)
        ax.set_title(f"{r.policy}: {r.forked_jobs} jobs forked, at most {r.max_copies} copies",
                     loc="left", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("simulated time (hours)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(results: Sequence[SimResult], out_dir: str | Path) -> list[Path]:
    """Write ``jct_cdf.png``, ``gpus_busy.png`` and (when a policy forked jobs) ``copies.png``
    under ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        plot_jct_cdf(results, out / "jct_cdf.png"),
        plot_gpus_busy(results, out / "gpus_busy.png"),
    ]
    if any(r.copies for r in results):
        paths.append(plot_copies(results, out / "copies.png"))
    return paths
