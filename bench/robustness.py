"""Robustness: every policy on a suite of generated workloads, regime by regime.

    python -m bench.robustness [--seed-base 0] [--only NAME ...] [--policies P,P]
                               [--jobs-scale 1.0] [--workers 2] [--free-moves]
                               [--reschedule-on-finish] [--no-pin-binding]
                               [--json OUT.json] [--plot OUT.png]

The suite (:data:`SUITE`) is 36 traces made by ``hadar-slurm trace generate``
(:mod:`hadar_slurm.sim.generate`), bundled as the generator's arguments, not as files: four
clusters (Gavel's 1-GPU nodes of three types, DGX-like 8-GPU nodes of h100/a100 beside 4-GPU
v100 nodes, four types on 4-GPU nodes, five types on 4- and 8-GPU nodes) times nine regimes
(static queues with and without gangs; Poisson arrivals at offered loads 0.2, 0.5, 0.8, 1.0 and
1.5; bursts at 0.8 and 1.5), with 0 to 60% multi-GPU jobs and the three heavy-tailed length
models in turn.  Trace ``k`` is drawn with seed ``seed_base + k``: ``--seed-base`` gives a new
suite of the same regimes, traces no policy was tuned on.

Each trace runs with ``hadar``, ``hadare``, ``gavel-las``, ``gavel-makespan``, ``fifo-perf`` and
``fifo`` as ``hadar-slurm simulate`` runs them by default (360 s rounds; a start and a move cost
what the sidecar measures, :mod:`hadar_slurm.costs`; ``--free-moves``: nothing, as Gavel's
simulator; ``--reschedule-on-finish``: a round also ends when a job ends, as the sidecar's
epochs do by default).  Per trace and policy: makespan over the gang bound
(:func:`~hadar_slurm.sim.bounds.gang_makespan_bound`: the fluid LP where a job uses its scale
factor of GPUs, with cuts that keep jobs too wide to fit side by side on a type from sharing
it; never below the plain fluid LP, ``fluid_bound_s``) and over the fork bound (a job forked
into at most HadarE's ``max_copies`` copies, each on its scale factor of GPUs of one node, no two on
one node, as Slurm's heterogeneous jobs and the simulator have them; ``fork_free_bound_s``
drops the node rule, ``fork_any_bound_s`` also the copy limit), average JCT over the best of
``gavel-las``, ``fifo-perf`` and ``fifo`` on that trace, p95 JCT and utilization.

Goals (issue #15): ``hadar`` makespan within 3% of the gang bound and average JCT no worse than
the best baseline's, on every trace; ``hadare`` makespan within 10% of the fork bound and
average JCT no worse than ``hadar``'s.  The summary prints the worst and median ratios per
policy and regime, and the traces that miss a goal.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.report import progress, write_rows
from hadar_slurm.cli.trace import sim_throughputs
from hadar_slurm.costs import LiveCosts
from hadar_slurm.errors import InputError
from hadar_slurm.loop import EpochRecord
from hadar_slurm.model import ClusterSpec, Job
from hadar_slurm.policy import Policy, make_policy, policy_settings
from hadar_slurm.policy.base import FloatArray, IntArray
from hadar_slurm.policy.hadar import HadarPolicy
from hadar_slurm.policy.hadare import HadarEPolicy
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sim import bounds as bounds_module
from hadar_slurm.sim.backend import SimulatedCluster
from hadar_slurm.sim.bounds import (
    bound_inputs,
    copy_room,
    fluid_makespan_bound,
    fork_makespan_bound,
    gang_makespan_bound,
)
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.generate import WorkloadSpec, generate, offered_load
from hadar_slurm.sim.run import simulate
from hadar_slurm.sim.trace import DRAW_REL, perturbed_jobs

POLICIES = ("hadar", "hadare", "gavel-las", "gavel-makespan", "fifo-perf", "fifo")
BASELINES = ("gavel-las", "fifo-perf", "fifo")
MAKESPAN_GOAL = 1.03
FORK_GOAL = 1.10

#: name -> cluster spec (``hadar-slurm simulate --cluster``)
CLUSTERS = {
    "gavel": "v100=8:p100=8:k80=8",
    "dgx": "h100=2x8:a100=2x8:v100=4x4",
    "four": "a100=3x4:v100=3x4:p100=3x4:k80=3x4",
    "five": "h100=1x8:a100=1x8:v100=2x4:p100=2x4:k80=2x4",
}

#: (regime, arrivals, offered load, multi-GPU share, jobs)
REGIMES = (
    ("static-1gpu", "static", 1.0, 0.0, 48),
    ("static-gangs", "static", 1.0, 0.6, 48),
    ("poisson-0.2", "poisson", 0.2, 0.2, 100),
    ("poisson-0.5", "poisson", 0.5, 0.4, 100),
    ("poisson-0.8", "poisson", 0.8, 0.2, 120),
    ("poisson-1.0", "poisson", 1.0, 0.6, 120),
    ("poisson-1.5", "poisson", 1.5, 0.4, 120),
    ("bursty-0.8", "bursty", 0.8, 0.2, 120),
    ("bursty-1.5", "bursty", 1.5, 0.6, 120),
)
LENGTHS = ("gavel", "pareto", "lognormal")


@dataclass(frozen=True)
class Case:
    """One trace of the suite: a regime on a cluster, drawn with a seed."""

    name: str
    regime: str
    cluster_name: str
    cluster: str
    spec: WorkloadSpec

    def command(self) -> str:
        return " ".join(["hadar-slurm trace generate --cluster", self.cluster, *self.spec.args()])


def suite(seed_base: int = 0, jobs_scale: float = 1.0) -> list[Case]:
    """The 36 traces: every regime on every cluster, lengths models in turn."""
    cases = []
    for c, (cname, cspec) in enumerate(CLUSTERS.items()):
        for r, (regime, arrivals, load, multi, jobs) in enumerate(REGIMES):
            k = c * len(REGIMES) + r
            spec = WorkloadSpec(seed=seed_base + k, jobs=max(4, round(jobs * jobs_scale)),
                                arrivals=arrivals, load=load, multi_gpu=multi,
                                lengths=LENGTHS[k % len(LENGTHS)])
            cases.append(Case(f"{cname}/{regime}", regime, cname, cspec, spec))
    return cases


def named(cases: Sequence[Case], only: Sequence[str]) -> list[Case]:
    """The cases ``only`` names: a trace (``cluster/regime``), or all of a cluster or of a
    regime (``--only`` of this bench and of ``bench.sensitivity``)."""
    want = set(only)
    return [c for c in cases if want & {c.name, c.regime, c.cluster_name}]


@dataclass(frozen=True)
class Instance:
    """A case's trace on its cluster, with its bounds and offered load (``bound``: the gang
    bound; ``fluid``: the plain fluid LP's, at most ``bound``)."""

    jobs: tuple[Job, ...]
    cluster: ClusterSpec
    table: ThroughputTable
    bound: float
    fork: float
    fork_free: float
    fork_any: float
    load: float
    fluid: float


@functools.lru_cache(maxsize=8)
def instance(case: Case) -> Instance:
    """Drawn and bounded once per process: every policy of a case runs on the same one (the
    tasks of a case follow each other, so a worker meets them together).  The bounds, most
    of a run's time on the loaded traces, come from :func:`trace_bounds`'s cache where an
    earlier run solved the same LPs."""
    table = sim_throughputs(None)
    cluster = parse_counts(case.cluster)
    jobs = tuple(generate(case.spec, cluster, table))
    args = bound_inputs(jobs, cluster, table)
    bound, fork, fork_free, fork_any, fluid = trace_bounds(
        args, copy_room(args[2], cluster), HadarEPolicy().max_copies,
        np.array([j.sync for j in jobs], dtype=np.bool_))
    return Instance(jobs, cluster, table, bound, fork, fork_free, fork_any,
                    offered_load(jobs, cluster, table), fluid)


#: What :func:`bound_inputs` gives: arrivals, work, scale factors, rates, GPUs per type.
BoundArgs = tuple[FloatArray, FloatArray, IntArray, FloatArray, IntArray]

#: Where :func:`trace_bounds` keeps what it solved: ``HADAR_BENCH_CACHE`` names a folder, or
#: ``off`` for none; by default ``bench/results/.cache`` (ignored by git).
CACHE_ENV = "HADAR_BENCH_CACHE"


def bounds_cache_dir() -> Path | None:
    """The folder of :func:`trace_bounds`'s cache, None where ``HADAR_BENCH_CACHE=off``."""
    where = os.environ.get(CACHE_ENV, "").strip()
    if where.lower() in ("off", "0", "no", "false"):
        return None
    return Path(where) if where else Path(__file__).resolve().parent / "results" / ".cache"


def _bounds_key(args: BoundArgs, room: IntArray, copies: int,
                sync: npt.NDArray[np.bool_]) -> str:
    """A digest of everything the bounds are a function of: the LPs' arrays, the copy limit,
    the code that builds and solves them (``hadar_slurm/sim/bounds.py``) and the solver's
    version, so that a changed input or solver is never answered from the cache."""
    import scipy

    h = hashlib.sha256()
    for a in (*args, room, sync):
        arr = np.ascontiguousarray(a)
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(arr.tobytes())
    h.update(f"copies={copies};scipy={scipy.__version__}".encode())
    h.update(Path(bounds_module.__file__ or "").read_bytes())
    return h.hexdigest()[:32]


def trace_bounds(args: BoundArgs, room: IntArray, copies: int,
                 sync: npt.NDArray[np.bool_] | None = None,
                 ) -> tuple[float, float, float, float, float]:
    """The gang bound, the three fork bounds (one node a copy, no two on a node; no node
    rule; neither rule nor copy limit) and the plain fluid bound of a trace's
    :func:`bound_inputs` (``sync``: which jobs are synchronous, default all), read from the
    cache (:func:`bounds_cache_dir`) where the same LPs were solved before, else solved and
    written there.  An unreadable or malformed entry is solved again and rewritten.  The gang
    bound is the larger of :func:`gang_makespan_bound` and the fluid bound (the same LP
    without its cuts, so the two differ only by the solver's tolerance where no cut binds)."""
    sync_ = np.ones(args[1].shape[0], dtype=np.bool_) if sync is None else sync
    folder = bounds_cache_dir()
    path = (folder / f"bounds-{_bounds_key(args, room, copies, sync_)}.json" if folder
            else None)
    if path is not None and path.is_file():
        try:
            got = json.loads(path.read_text())
            values = tuple(float(got[k]) for k in _BOUND_KEYS)
            if all(math.isfinite(v) and v > 0 for v in values):
                return values[0], values[1], values[2], values[3], values[4]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    fluid = fluid_makespan_bound(*args)
    out = (max(fluid, gang_makespan_bound(*args, sync=sync_)),
           fork_makespan_bound(*args, copies=copies, room=room),
           fork_makespan_bound(*args, copies=copies),
           fork_makespan_bound(*args), fluid)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dict(zip(_BOUND_KEYS, out, strict=True))) + "\n")
            tmp.replace(path)
        except OSError:
            pass  # (a read-only checkout: the bounds were solved, just not kept)
    return out


_BOUND_KEYS = ("gang_bound_s", "fork_bound_s", "fork_free_bound_s", "fork_any_bound_s",
               "fluid_bound_s")


def with_knobs(policy: str, knobs: Mapping[str, object] | None = None,
               **settings: object) -> Policy:
    """``policy`` built with ``settings`` and ``knobs``: ``"hadar.NAME"`` sets Hadar's knob
    ``NAME`` (in ``hadar``, and in ``hadare`` the Hadar it plans with), ``"hadare.NAME"``
    HadarE's; a knob of a policy not built here is ignored, so that one set of knobs serves
    a run of both.  An unknown knob is an :class:`InputError` that names it."""
    own: dict[str, object] = dict(settings)
    inner: dict[str, object] = {}
    for key, value in (knobs or {}).items():
        owner, _, name = key.partition(".")
        if owner not in ("hadar", "hadare") or not name:
            raise InputError(f"knob {key!r} is not POLICY.NAME", field=key,
                             fix="write hadar.NAME or hadare.NAME, e.g. hadar.chain_factor")
        if name not in policy_settings(owner) or name == "hadar":
            raise InputError(f"policy {owner!r} has no knob {name!r}", field=key,
                             fix="its knobs: " + ", ".join(
                                 k for k in policy_settings(owner) if k != "hadar"))
        if owner == "hadar" and policy in ("hadar", "hadare"):
            (own if policy == "hadar" else inner)[name] = value
        elif owner == policy:
            own[name] = value
    if inner:
        own["hadar"] = HadarPolicy(**inner)  # type: ignore[arg-type]
    return make_policy(policy, **own)


def run_one(case: Case, policy: str, free_moves: bool,
            reschedule_on_finish: bool = False, pin_binding: bool = True,
            on_epoch: Callable[[EpochRecord, SimulatedCluster], None] | None = None,
            knobs: Mapping[str, object] | None = None, draw: int = 0,
            ) -> dict[str, Any]:
    """One run of ``policy`` on ``case``'s trace, as a row (``on_epoch``: called after each
    epoch with its record and the simulated cluster, as :func:`simulate` does; ``knobs``:
    :func:`with_knobs`, recorded in the row's ``settings``; ``draw`` > 0: every job's length
    perturbed by at most :data:`~hadar_slurm.sim.trace.DRAW_REL` of itself, seeded with the
    draw (:func:`~hadar_slurm.sim.trace.perturbed_jobs`), recorded in the row's ``draw``; the
    bounds stay the trace's, which such a change moves by as little)."""
    inst = instance(case)
    jobs, cluster, table = inst.jobs, inst.cluster, inst.table
    if draw < 0:
        raise InputError(f"draw must be 0 (the trace as generated) or more, got {draw}",
                         field="draw", fix="give 0, 1, 2, ...")
    if draw:
        jobs = tuple(perturbed_jobs(jobs, DRAW_REL, draw))
    bound, fork, fork_any, load = inst.bound, inst.fork, inst.fork_any, inst.load
    live = LiveCosts()
    move_s, start_s = (0.0, 0.0) if free_moves else (live.move_s, live.start_s)
    t0 = time.perf_counter()
    settings: dict[str, object] = {"pin_binding": False} if not pin_binding \
        and policy == "hadare" else {}
    built = with_knobs(policy, knobs, **settings)
    settings.update({k: v for k, v in (knobs or {}).items()
                     if k.partition(".")[0] in (policy, "hadar" if policy == "hadare" else "")})
    res = simulate(jobs, cluster, table, built, migration_cost_s=move_s,
                   start_cost_s=start_s, reschedule_on_finish=reschedule_on_finish,
                   on_epoch=on_epoch)
    return {
        "trace": case.name, "regime": case.regime, "cluster": case.cluster_name,
        "cluster_spec": case.cluster, "generate": case.command(), "policy": policy,
        "rounds": "end on finish" if reschedule_on_finish else "fixed",
        "moves": "free" if free_moves else "charged", "settings": settings,
        "jobs": len(jobs), "offered_load": None if math.isinf(load) else round(load, 3),
        "multi_gpu_jobs": sum(j.scale_factor > 1 for j in jobs),
        "makespan_s": round(res.makespan_s, 1), "avg_jct_s": round(res.avg_jct_s, 1),
        "p95_jct_s": round(res.p95_jct_s, 1), "utilization": round(res.utilization, 4),
        "gang_bound_s": round(bound, 1), "fluid_bound_s": round(inst.fluid, 1),
        "fork_bound_s": round(fork, 1),
        "fork_free_bound_s": round(inst.fork_free, 1), "fork_any_bound_s": round(fork_any, 1),
        "makespan_over_gang_bound": round(res.makespan_s / bound, 4),
        "makespan_over_fluid_bound": round(res.makespan_s / inst.fluid, 4),
        "makespan_over_fork_bound": round(res.makespan_s / fork, 4),
        "completed": res.num_completed, "wall_s": round(time.perf_counter() - t0, 2),
        "decision_ms_median": round(res.decision_ms_median, 3),
        **({"draw": draw} if draw else {}),
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Per row: average JCT over the best baseline's on its trace, and over hadar's."""
    by_trace: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_trace.setdefault(r["trace"], {})[r["policy"]] = r
    for per in by_trace.values():
        base = [per[b]["avg_jct_s"] for b in BASELINES if b in per]
        best = min(base) if base else None
        hadar = per.get("hadar", {}).get("avg_jct_s")
        for r in per.values():
            r["best_baseline_jct_s"] = best
            r["jct_over_best_baseline"] = round(r["avg_jct_s"] / best, 4) if best else None
            r["jct_over_hadar"] = round(r["avg_jct_s"] / hadar, 4) if hadar else None


#: Issue #15's goals, per policy: (the row's ratio, the goal it may not exceed, what the ratio
#: is, of what), as :func:`misses` (and ``bench.sensitivity``) check them.
GOALS: dict[str, tuple[tuple[str, float, str, str], ...]] = {
    "hadar": (("makespan_over_gang_bound", MAKESPAN_GOAL, "makespan", "the gang bound"),
              ("jct_over_best_baseline", 1.0, "avg JCT", "the best baseline's")),
    "hadare": (("makespan_over_fork_bound", FORK_GOAL, "makespan", "the fork bound"),
               ("jct_over_hadar", 1.0, "avg JCT", "hadar's")),
}


def missed_goals(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    """The goals the rows miss, in row order: ``(trace, policy, the ratio's key)`` to the ratio
    (the key ``"completed"`` to the jobs left, for a run that left some)."""
    out: dict[tuple[str, str, str], float] = {}
    for r in rows:
        if r["completed"] < r["jobs"]:
            out[(r["trace"], r["policy"], "completed")] = float(r["jobs"] - r["completed"])
        for key, goal, _what, _of in GOALS.get(r["policy"], ()):
            if r[key] and r[key] > goal:
                out[(r["trace"], r["policy"], key)] = float(r[key])
    return out


def misses(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The goals missed (:func:`missed_goals`), one line each."""
    said = {key: (what, of) for goals in GOALS.values() for key, _goal, what, of in goals}
    out = []
    for (trace, policy, key), value in missed_goals(rows).items():
        if key == "completed":
            out.append(f"{trace}: {policy} left {value:.0f} jobs")
        else:
            what, of = said[key]
            out.append(f"{trace}: {policy} {what} {value:.3f}x {of}")
    return out


def _mk_key(policy: str) -> str:
    """The makespan ratio a policy is judged by: hadare's over the fork bound."""
    return "makespan_over_fork_bound" if policy == "hadare" else "makespan_over_gang_bound"


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{max(values):.3f} / {float(np.median(values)):.3f}"


def summary(rows: list[dict[str, Any]]) -> str:
    """Worst / median ratio per policy, over all traces and per regime and per cluster."""
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    groups: list[tuple[str, str]] = [("all", "")]
    groups += [("regime", g) for g in dict.fromkeys(r["regime"] for r in rows)]
    groups += [("cluster", g) for g in dict.fromkeys(r["cluster"] for r in rows)]
    lines = ["worst / median over the traces: makespan over the gang bound (hadare: fork "
             "bound); average JCT over the best baseline's (gavel-las, fifo-perf, fifo)", ""]
    head = f"{'group':22s} " + " ".join(f"{p:>27s}" for p in policies)
    lines += [head, "-" * len(head)]
    for kind, value in groups:
        sel = [r for r in rows if kind == "all" or r[kind] == value]
        cells = []
        for p in policies:
            mine = [r for r in sel if r["policy"] == p]
            mk = _stats([r[_mk_key(p)] for r in mine])
            jct = _stats([r["jct_over_best_baseline"] for r in mine
                          if r["jct_over_best_baseline"]])
            cells.append(f"{mk:>13s} {jct:>13s}")
        lines.append(f"{value or kind:22s} " + " ".join(cells))
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Two panels, one point per trace and policy: makespan over its bound, average JCT over
    the best baseline's; the goals as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r["trace"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    x = np.arange(len(traces))
    fig, axes = plt.subplots(2, 1, figsize=(max(10.0, 0.33 * len(traces)), 8), sharex=True)
    for k, p in enumerate(policies):
        mine = {r["trace"]: r for r in rows if r["policy"] == p}
        mk = [mine[t][_mk_key(p)] if t in mine else np.nan for t in traces]
        jct = [mine[t]["jct_over_best_baseline"] or np.nan if t in mine else np.nan
               for t in traces]
        style = {"marker": "os^vDx"[k % 6], "linestyle": "none", "label": p, "markersize": 5}
        axes[0].plot(x, mk, **style)
        axes[1].plot(x, jct, **style)
    axes[0].axhline(MAKESPAN_GOAL, color="grey", linewidth=0.8, linestyle="--")
    axes[0].axhline(FORK_GOAL, color="grey", linewidth=0.8, linestyle=":")
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes[0].set_ylabel("makespan / bound\n(hadare: fork bound)")
    axes[1].set_ylabel("avg JCT / best baseline")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
    axes[1].set_xticks(x, traces, rotation=90, fontsize=7)
    axes[0].legend(ncol=len(policies), fontsize=8, loc="upper left")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"plot written to {out}")


def default_stem(seed_base: int, *, free_moves: bool, reschedule: bool, pin_binding: bool,
                 whole: bool) -> str:
    """The name a run's rows and plot get under ``bench/results`` when ``--json`` and
    ``--plot`` are not given: ``robustness``, then ``_no_pin_binding``, ``_free_moves``,
    ``_reschedule`` and ``_seedN`` for the switches and seed base the run was made with (the
    committed results' names), and ``-partial`` where it ran only some traces or policies or
    scaled the job counts, so that an experiment never overwrites a whole run's results
    (before, every run wrote ``robustness.json`` and ``.png`` unless told otherwise: a run
    of two policies, or of seed base 100, over the committed rows of seed base 0)."""
    stem = "robustness"
    if not pin_binding:
        stem += "_no_pin_binding"
    if free_moves:
        stem += "_free_moves"
    if reschedule:
        stem += "_reschedule"
    if seed_base:
        stem += f"_seed{seed_base}"
    return stem if whole else stem + "-partial"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seed-base", type=int, default=0,
                    help="trace k is drawn with seed SEED_BASE + k (default: %(default)s)")
    ap.add_argument("--jobs-scale", type=float, default=1.0,
                    help="scale every trace's job count (for a quick look; default 1)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="run only these traces (cluster/regime, e.g. gavel/poisson-0.2), or "
                    "all of a cluster or regime (gavel, poisson-0.2)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--free-moves", action="store_true",
                    help="charge nothing for starts and moves, as Gavel's simulator")
    ap.add_argument("--reschedule-on-finish", action="store_true",
                    help="a round also ends when a job ends (the sidecar's default)")
    ap.add_argument("--no-pin-binding", dest="pin_binding", action="store_false",
                    help="hadare without its step 0, the jobs that bind the fork makespan on "
                    "their fastest copies (its setting pin_binding, on by default; "
                    "docs/algorithm.md)")
    ap.add_argument("--workers", type=int, default=2, help="processes (default: 2)")
    ap.add_argument("--json", default=None,
                    help="where the rows go (default: bench/results/ROBUSTNESS.json, see "
                    "default_stem: a whole run under its seed base's and switches' name, a "
                    "partial one under that name with -partial, never over a whole run's)")
    ap.add_argument("--plot", default=None,
                    help="where the plot goes (default: as --json, .png)")
    args = ap.parse_args(argv)
    cases = suite(args.seed_base, args.jobs_scale)
    if args.only:
        cases = named(cases, args.only)
        if not cases:
            ap.error(f"no trace matches {args.only}")
    policies = [p for p in args.policies.split(",") if p]
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown or not policies:
        ap.error(f"--policies: unknown {', '.join(unknown) or '(none given)'}; "
                 f"choose from {','.join(POLICIES)}")
    stem = default_stem(args.seed_base, free_moves=args.free_moves,
                        reschedule=args.reschedule_on_finish, pin_binding=args.pin_binding,
                        whole=(not args.only and args.jobs_scale == 1.0
                               and set(policies) == set(POLICIES)))
    json_out = args.json or f"bench/results/{stem}.json"
    plot_out = args.plot or f"bench/results/{stem}.png"
    tasks = [(c, p) for c in cases for p in policies]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(run_one, c, p, args.free_moves, args.reschedule_on_finish,
                               args.pin_binding) for c, p in tasks]
        rows = []
        for k, f in enumerate(futures):
            rows.append(f.result())
            progress(k + 1, len(tasks), time.perf_counter() - t0)
    add_ratios(rows)
    for c in cases:
        mine = [r for r in rows if r["trace"] == c.name]
        load = mine[0]["offered_load"]
        print(f"{c.name:26s} load {'static' if load is None else f'{load:.2f}':>6s} "
              f"gangs {mine[0]['multi_gpu_jobs']:3d}/{mine[0]['jobs']:<3d} " + "  ".join(
                  f"{r['policy']} {r[_mk_key(r['policy'])]:.3f}/"
                  f"{r['jct_over_best_baseline'] or float('nan'):.3f}" for r in mine))
    print()
    print(summary(rows))
    missed = misses(rows)
    print(f"\n{len(missed)} goal(s) missed" + (":" if missed else ""))
    for line in missed:
        print("  " + line)
    write_rows(rows, json_out)
    plot(rows, plot_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
