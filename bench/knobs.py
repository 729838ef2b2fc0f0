"""Knobs: Hadar's and HadarE's settings moved one at a time, judged on the regime suite.

    python -m bench.knobs [--seed-base 0 100 200] [--variant NAME KNOB=VALUE ...]
                          [--draws 0] [--workers 2] [--json bench/results/knobs.json]

Every knob of :class:`~hadar_slurm.policy.hadar.HadarPolicy` and
:class:`~hadar_slurm.policy.hadare.HadarEPolicy` has a default that needs no tuning (their
docstrings).  This bench asks whether that holds on the regime suite (:mod:`bench.robustness`):
each variant (:data:`VARIANTS`, one knob moved either way from its default; ``--variant``
gives others, ``hadar.NAME=VALUE`` or ``hadare.NAME=VALUE``, several knobs at once allowed)
runs ``hadar`` and ``hadare`` on the 36 traces of each seed base, beside the defaults and the
baselines (``gavel-las``, ``fifo-perf``, ``fifo``: they have no knobs, so they run once per
seed base).  Per variant and seed base it prints issue #15's goals missed
(:func:`bench.robustness.misses`) and the geometric means of Hadar's and HadarE's makespan
and average JCT over the defaults' runs.  A variant that missed fewer goals on every seed base
and was no worse in geometric mean would be a better default; one that trades seed bases
against each other is noise ("How much of a ratio is noise", docs/algorithm.md).  Below the
table, per variant and seed base, the traces whose makespan or average JCT moved most from the
defaults' either way (:data:`MOVES` of them, :func:`largest_moves`): a goal missed before and
after does not change the count, however much worse it got.

Each seed base takes about a minute for the baselines and 40 s a variant on 2 cores once the
traces' bounds are in ``bench/results/.cache``; the default sweep of three seed bases about
35 minutes.  ``--json`` gets ``{"summary": [...]}``, the figures per variant and seed base, and
with ``--with-rows`` also ``"rows"``, every run's row with its ``variant`` and ``seed_base``.

Every run's row also goes, as it ends, to a log beside ``--json`` (``OUT.runs.jsonl``, one
JSON row a line, removed once the summary is written), each with the fingerprint of the code
that ran it (:func:`code_fingerprint`).  ``--resume`` takes from that log the runs of a sweep
that stopped (killed, a lost session) whose trace, policy, knobs and code are this sweep's,
and runs only the rest; a row of other code is never taken.

``--draws N`` runs every trace ``N`` more times, each with every job's length perturbed by
at most 1e-4 of itself (:func:`~hadar_slurm.sim.trace.perturbed_jobs`, seeded with the draw;
the defaults, the variants and the baselines on the same lengths), since one run of a trace
can be a rule's luckiest or unluckiest (docs/algorithm.md, "How much of a ratio is noise").
The geometric means then pair each run with the defaults' run of the same draw, and a second
table counts the goals missed in geometric mean over each trace's ``N + 1`` runs, each ratio
taken against the baselines of its own draw; then, per variant and seed base, the goals it
misses on that mean where the defaults do not (``+``) and the reverse (``-``).  It costs
``N + 1`` times the runs (``--against-committed``: the draws of the defaults and baselines
run, the trace as generated comes from the committed rows); ``--draws 3`` with one variant
over three seed bases took about 20 minutes on 2 cores.

``--against-committed`` runs the variants only: the defaults' and the baselines' rows of each
seed base come from the committed suite rows (``bench/results/robustness.json``,
``robustness_seed100.json``, ...: :func:`bench.robustness.default_stem`), a third of the runs
of a sweep.  Those rows must be this code's: first ``hadar`` and ``hadare`` run on two of the
traces (:data:`CHECKED`, or the first two that ``--only`` leaves) and must give the committed
rows' makespan and average JCT to the tenth of a second, else the bench stops and says which
suite to run again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.compare import geo_mean, read_rows
from bench.report import progress
from bench.robustness import (
    BASELINES,
    GOALS,
    Case,
    add_ratios,
    default_stem,
    misses,
    named,
    run_one,
    suite,
    with_knobs,
)
from hadar_slurm.errors import InputError

Row = dict[str, Any]
DEFAULTS = "defaults"
JUDGED = ("hadar", "hadare")
#: How many of a variant's largest moves, trace by trace, :func:`largest_moves` lists.
MOVES = 6

#: One knob moved either way from its default (the defaults in brackets): Hadar's
#: ``margin_rounds`` (1.5), ``chain_factor`` (0.95), ``split_share`` (0.5), ``held_speed`` (0.3),
#: ``move_margin`` (0.25), ``horizon`` (8), ``min_floor`` (0.05); HadarE's ``max_overhead`` (0.5),
#: ``replans`` (2) and ``pin_tolerance`` (0.05).
VARIANTS: tuple[tuple[str, dict[str, object]], ...] = (
    ("margin_rounds=1.0", {"hadar.margin_rounds": 1.0}),
    ("margin_rounds=2.0", {"hadar.margin_rounds": 2.0}),
    ("chain_factor=0.85", {"hadar.chain_factor": 0.85}),
    ("chain_factor=1.0", {"hadar.chain_factor": 1.0}),
    ("split_share=0.4", {"hadar.split_share": 0.4}),
    ("split_share=0.6", {"hadar.split_share": 0.6}),
    ("held_speed=0.2", {"hadar.held_speed": 0.2}),
    ("held_speed=0.4", {"hadar.held_speed": 0.4}),
    ("move_margin=0", {"hadar.move_margin": 0.0}),
    ("move_margin=0.5", {"hadar.move_margin": 0.5}),
    ("horizon=4", {"hadar.horizon": 4}),
    ("horizon=12", {"hadar.horizon": 12}),
    ("min_floor=0.1", {"hadar.min_floor": 0.1}),
    ("max_overhead=0.3", {"hadare.max_overhead": 0.3}),
    ("replans=3", {"hadare.replans": 3}),
    ("pin_tolerance=0.1", {"hadare.pin_tolerance": 0.1}),
)


def parse_variant(words: Sequence[str]) -> tuple[str, dict[str, object]]:
    """``NAME KNOB=VALUE ...`` as ``(NAME, {KNOB: value})``: a value is an int, a float or
    true/false; the knobs are checked as :func:`bench.robustness.with_knobs` builds them."""
    if len(words) < 2:
        raise InputError("a variant is NAME KNOB=VALUE [KNOB=VALUE ...]", field="--variant",
                         fix="e.g. --variant late hadar.chain_factor=1.0")
    knobs: dict[str, object] = {}
    for word in words[1:]:
        key, eq, text = word.partition("=")
        if not eq or not key or not text:
            raise InputError(f"{word!r} is not KNOB=VALUE", field="--variant",
                             fix="e.g. hadar.chain_factor=1.0")
        value: object
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            try:
                value = int(text)
            except ValueError:
                try:
                    value = float(text)
                except ValueError:
                    raise InputError(f"{word!r}: {text!r} is no number", field="--variant",
                                     fix="give a number, or true/false") from None
        knobs[key] = value
    for policy in JUDGED:
        with_knobs(policy, knobs)  # an unknown knob fails here, before any run
    return words[0], knobs


Task = tuple[Case, str, str, int, Mapping[str, object], int]
#: The most ``--draws``.
MAX_DRAWS = 50
#: What a run's result depends on: the package and the suite's definition (bench.robustness).
CODE_ROOTS = ("hadar_slurm", "bench/robustness.py")


def code_fingerprint(root: Path | None = None) -> str:
    """A digest of the source a run's result depends on (:data:`CODE_ROOTS` under ``root``,
    the checkout: every ``.py``, ``.pyx`` and ``.json`` file's path and bytes), so that a row
    logged by other code is never taken for this code's."""
    base = Path(__file__).resolve().parent.parent if root is None else root
    digest = hashlib.sha256()
    for name in CODE_ROOTS:
        top = base / name
        files = [top] if top.is_file() else sorted(
            f for f in top.rglob("*") if f.suffix in (".py", ".pyx", ".json") and f.is_file())
        for f in files:
            digest.update(str(f.relative_to(base)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def task_key(case: Case, policy: str, knobs: Mapping[str, object], draw: int = 0) -> str:
    """What identifies a run in the log: the command that generates its trace (its seed and
    job count included), the policy, the knobs (the variant's name does not: two names
    for the same knobs are the same run) and the draw (``--draws``), where there is one."""
    key: list[object] = [case.command(), policy, sorted(knobs.items())]
    return json.dumps([*key, draw] if draw else key)


def _task(args: Task) -> Row:
    case, policy, variant, seed_base, knobs, draw = args
    row = run_one(case, policy, free_moves=False, knobs=knobs, draw=draw)
    row["variant"], row["seed_base"] = variant, seed_base
    return row


def logged_rows(log: Path, code: str) -> dict[str, Row]:
    """The rows of ``log`` (see the module docstring) that ``code`` ran, by their key; a line
    cut short by a kill is skipped."""
    rows: dict[str, Row] = {}
    if not log.exists():
        return rows
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("code") == code and "key" in entry:
            rows[str(entry["key"])] = entry["row"]
    return rows


#: The traces ``--against-committed`` runs again to check the committed rows: one-GPU jobs
#: only, and a gang-heavy static queue (where most of the queue-order rules act).
CHECKED = ("gavel/static-1gpu", "dgx/static-gangs")
#: What a committed row and a run again may differ by (rows keep a tenth of a second).
SAME_S = 0.05


def committed_rows(folder: Path, seed_base: int, cases: Sequence[Case]) -> list[Row]:
    """The committed suite rows of ``seed_base`` (under ``folder``) of ``cases``, as this
    bench's rows: the baselines' as ``baselines``, Hadar's and HadarE's as the defaults'.
    An :class:`InputError` where the file or a row is missing."""
    path = folder / (default_stem(seed_base, free_moves=False, reschedule=False,
                                  pin_binding=True, whole=True) + ".json")
    fix = f"run python -m bench.robustness --seed-base {seed_base} (it writes {path})"
    try:
        got = read_rows(str(path))
    except InputError as exc:
        raise InputError(f"no committed suite rows to judge against: {exc.problem}",
                         field="--against-committed", fix=fix) from None
    by = {(r["trace"], r["policy"]): r for r in got}
    rows: list[Row] = []
    for case in cases:
        for policy in (*BASELINES, *JUDGED):
            row = by.get((case.name, policy))
            if row is None:
                raise InputError(f"{path} has no {policy} row of {case.name}",
                                 field="--against-committed", fix=fix)
            variant = "baselines" if policy in BASELINES else DEFAULTS
            rows.append(dict(row, variant=variant, seed_base=seed_base))
    return rows


def stale(ran: Row, committed: Row) -> str | None:
    """Where a run again differs from its committed row: a line naming it, else None."""
    for key in ("makespan_s", "avg_jct_s"):
        if abs(float(ran[key]) - float(committed[key])) > SAME_S:
            return (f"{ran['trace']} {ran['policy']}: {key} {ran[key]} now, "
                    f"{committed[key]} committed")
    return None


def checked_rows(folder: Path, seed_base: int, cases: Sequence[Case],
                 check: Sequence[Case]) -> list[Row]:
    """:func:`committed_rows`, once ``hadar`` and ``hadare`` run again on the ``check`` cases
    give their committed rows (:func:`stale`); an :class:`InputError` naming the first that
    does not."""
    rows = committed_rows(folder, seed_base, cases)
    was = {(r["trace"], r["policy"]): r for r in rows}
    for case in check:
        for policy in JUDGED:
            why = stale(_task((case, policy, DEFAULTS, seed_base, {}, 0)),
                        was[(case.name, policy)])
            if why:
                raise InputError(
                    f"the committed rows of seed base {seed_base} are not this code's ({why})",
                    field="--against-committed",
                    fix=f"run python -m bench.robustness --seed-base {seed_base} first, or "
                    "leave out --against-committed")
    return rows


def _draw(row: Row) -> int:
    return int(row.get("draw", 0))


def judge(rows: Sequence[Row], variant: str, seed_base: int) -> dict[str, Any]:
    """A variant's figures on a seed base: goals missed on the traces as generated (draw 0),
    and its geometric means over the defaults' runs (Hadar's and HadarE's makespan and average
    JCT, each run against the defaults' run of the same trace and draw), and ``moves``: the
    :data:`MOVES` largest of those ratios trace by trace (geometric mean over the draws), as
    ``[trace, policy, figure, ratio]``, the figures that did not move left out.

    Where the rows hold perturbed draws too (``--draws``), also ``draws`` (the runs per trace)
    and ``mean_missed`` / ``mean_misses``: the goals whose ratio, in geometric mean over a
    trace's draws (the trace as generated among them), misses; each ratio of a draw is taken
    against the baselines of the same draw."""
    here = [r for r in rows if r["seed_base"] == seed_base]
    draws = sorted({_draw(r) for r in here if r["variant"] == variant})
    # (trace, policy, goal: its key, bound, what and of what) -> the ratio in each draw
    ratios: dict[tuple[str, str, str, float, str, str], list[float]] = {}
    missed: list[str] = []
    mine_all: list[Row] = []
    for d in draws:
        base = [dict(r) for r in here if r["policy"] in BASELINES and _draw(r) == d]
        mine = [dict(r) for r in here if r["variant"] == variant and r["policy"] in JUDGED
                and _draw(r) == d]
        add_ratios(mine + base)
        mine_all += mine
        if d == 0:
            missed = misses(mine)
        for r in mine:
            for spec in GOALS[r["policy"]]:
                if r[spec[0]]:
                    ratios.setdefault((r["trace"], r["policy"], *spec), []).append(r[spec[0]])
    ref = {(r["trace"], r["policy"], _draw(r)): r for r in here if r["variant"] == DEFAULTS}
    out: dict[str, Any] = {"variant": variant, "seed_base": seed_base, "missed": len(missed),
                           "misses": missed}
    # (trace, policy, figure) -> log of the variant's figure over the defaults', per draw
    per_trace: dict[tuple[str, str, str], list[float]] = {}
    for policy in JUDGED:
        for key in ("makespan_s", "avg_jct_s"):
            logs = []
            for r in mine_all:
                other = ref.get((r["trace"], policy, _draw(r)))
                if r["policy"] != policy or other is None or not other[key] > 0:
                    continue
                logs.append(math.log(r[key] / other[key]))
                per_trace.setdefault((r["trace"], policy, key), []).append(logs[-1])
            out[f"{policy}_{key}"] = round(math.exp(sum(logs) / len(logs)), 4) if logs else None
    # The largest moves trace by trace, either way (geometric mean over the draws): a goal
    # the defaults already miss can get far worse without changing the count of misses.
    moved = sorted(((trace, policy, key, math.exp(sum(v) / len(v)))
                    for (trace, policy, key), v in per_trace.items()),
                   key=lambda m: -abs(math.log(m[3])))
    out["moves"] = [[t, p, k, round(x, 4)] for t, p, k, x in moved[:MOVES] if x != 1.0]
    if len(draws) > 1:
        mean_misses: dict[str, str] = {}
        for (trace, policy, key, goal, what, of), values in ratios.items():
            mean = geo_mean(values)
            if mean > goal:
                worse = sum(v > goal for v in values)
                mean_misses[f"{trace} {policy} {key}"] = (
                    f"{trace}: {policy} {what} {mean:.3f}x {of} (geometric mean of "
                    f"{len(values)} draws, {worse} of them missed)")
        out.update(draws=len(draws), mean_missed=len(mean_misses), mean_misses=mean_misses)
    return out


def mean_miss_changes(judged: Sequence[dict[str, Any]]) -> str:
    """Per variant and seed base, the goals missed in geometric mean over the draws that the
    defaults meet (``+``) or miss while the variant meets them (``-``)."""
    by = {(j["variant"], j["seed_base"]): j for j in judged}
    lines = []
    for j in judged:
        ref = by.get((DEFAULTS, j["seed_base"]))
        if j["variant"] == DEFAULTS or ref is None or "mean_misses" not in j:
            continue
        mine, theirs = j["mean_misses"], ref["mean_misses"]
        plus = [mine[k] for k in mine if k not in theirs]
        minus = [theirs[k] for k in theirs if k not in mine]
        lines.append(f"{j['variant']}, seed base {j['seed_base']}: {len(plus)} more, "
                     f"{len(minus)} fewer missed in geometric mean over the draws")
        lines += [f"  + {t}" for t in plus] + [f"  - {t} (the defaults')" for t in minus]
    return "\n".join(lines)


def largest_moves(judged: Sequence[dict[str, Any]]) -> str:
    """Per variant and seed base, the traces whose makespan or average JCT moved most from the
    defaults', either way (each the geometric mean of the variant's figure over the defaults'
    over the draws): the count of goals missed is blind to a goal missed before and after by
    far more."""
    lines = []
    for j in judged:
        if j["variant"] == DEFAULTS or not j.get("moves"):
            continue
        lines.append(f"{j['variant']}, seed base {j['seed_base']}: largest moves over the "
                     "defaults (the variant's figure over theirs)")
        lines += [f"  {policy:6s} {trace:24s} {key.removesuffix('_s'):9s} {ratio:.4f}"
                  for trace, policy, key, ratio in j["moves"]]
    return "\n".join(lines)


def table(judged: Sequence[dict[str, Any]], seed_bases: Sequence[int]) -> str:
    """One line per variant: goals missed per seed base and in all, and the geometric means."""
    variants = list(dict.fromkeys(j["variant"] for j in judged))
    by = {(j["variant"], j["seed_base"]): j for j in judged}
    head = (f"{'variant':22s} " + " ".join(f"{'s' + str(s):>5s}" for s in seed_bases)
            + "   all   per seed base: hadar makespan / JCT, hadare makespan / JCT "
            "(geometric means over the defaults)")
    lines = [head, "-" * len(head)]
    for v in variants:
        cells = [by[(v, s)] for s in seed_bases]
        means = "  ".join(
            f"{c['hadar_makespan_s']:.4f}/{c['hadar_avg_jct_s']:.4f} "
            f"{c['hadare_makespan_s']:.4f}/{c['hadare_avg_jct_s']:.4f}" for c in cells)
        lines.append(f"{v:22s} " + " ".join(f"{c['missed']:5d}" for c in cells)
                     + f" {sum(c['missed'] for c in cells):5d}   {means}")
    if all("mean_missed" in j for j in judged):
        runs = judged[0]["draws"] if judged else 0
        lines += ["", f"goals missed in geometric mean over each trace's {runs} draws (the "
                  "trace as generated and its perturbed lengths), per seed base and in all:"]
        for v in variants:
            cells = [by[(v, s)] for s in seed_bases]
            lines.append(f"{v:22s} " + " ".join(f"{c['mean_missed']:5d}" for c in cells)
                         + f" {sum(c['mean_missed'] for c in cells):5d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seed-base", type=int, nargs="+", default=[0, 100, 200])
    ap.add_argument("--variant", nargs="+", action="append", metavar="WORD",
                    help="NAME KNOB=VALUE [KNOB=VALUE ...] (repeatable; default: the sweep "
                    "of bench.knobs.VARIANTS)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="only these traces, as bench.robustness --only (a quick look)")
    ap.add_argument("--jobs-scale", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--draws", type=int, default=0, metavar="N",
                    help="also run every trace N more times with its jobs' lengths perturbed "
                    "by at most 1e-4 (defaults, variants and baselines alike) and judge the "
                    f"goals on the geometric mean over the draws too (0 to {MAX_DRAWS})")
    ap.add_argument("--json", default="bench/results/knobs.json")
    ap.add_argument("--with-rows", action="store_true",
                    help="also write every run's row (about 4 MB for the default sweep)")
    ap.add_argument("--against-committed", nargs="?", const="bench/results", default=None,
                    metavar="DIR", help="run the variants only, against the committed suite "
                    "rows under DIR (default bench/results), checked first on two traces")
    ap.add_argument("--resume", action="store_true",
                    help="take the runs already in the log beside --json (OUT.runs.jsonl) "
                    "that this code ran, from a sweep that stopped, and run only the rest")
    args = ap.parse_args(argv)
    try:
        variants = ([parse_variant(v) for v in args.variant] if args.variant
                    else list(VARIANTS))
    except InputError as exc:
        ap.error(exc.one_line())
    if DEFAULTS in {name for name, _ in variants}:
        ap.error(f"--variant: {DEFAULTS!r} names the runs with no knob moved; pick another name")
    if not 0 <= args.draws <= MAX_DRAWS:
        ap.error(f"--draws: {args.draws} is not from 0 to {MAX_DRAWS}")
    if args.against_committed is not None and args.jobs_scale != 1.0:
        ap.error("--against-committed: the committed rows are of the whole traces; "
                 "leave out --jobs-scale")
    tasks: list[Task] = []
    given: list[Row] = []
    for s in args.seed_base:
        cases = suite(s, args.jobs_scale)
        if args.only:
            cases = named(cases, args.only)
            if not cases:
                ap.error(f"no trace matches {args.only}")
        if args.against_committed is not None:
            try:
                given += checked_rows(Path(args.against_committed), s, cases,
                                      cases[:2] if args.only else named(cases, list(CHECKED)))
            except InputError as exc:
                ap.error(exc.one_line())
        # (the committed rows are the traces as generated: their draws run here)
        first = 0 if args.against_committed is None else 1
        for d in range(first, args.draws + 1):
            tasks += [(c, p, "baselines", s, {}, d) for c in cases for p in BASELINES]
            tasks.extend((c, p, DEFAULTS, s, {}, d) for c in cases for p in JUDGED)
        for name, knobs in variants:
            tasks += [(c, p, name, s, knobs, d) for d in range(args.draws + 1) for c in cases
                      for p in JUDGED]
    out = Path(args.json)
    log = out.with_name(out.name + ".runs.jsonl")
    code = code_fingerprint()
    keys = [task_key(c, p, k, d) for c, p, _v, _s, k, d in tasks]
    done = logged_rows(log, code) if args.resume else {}
    rows: list[Row | None] = [dict(done[key], variant=t[2]) if key in done else None
                              for key, t in zip(keys, tasks, strict=True)]
    todo = [k for k, row in enumerate(rows) if row is None]
    if args.resume:
        print(f"{len(tasks) - len(todo)} of {len(tasks)} runs taken from {log}", flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("a" if args.resume else "w") as sink, \
            ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        ran = pool.map(_task, [tasks[k] for k in todo])
        for n, (k, row) in enumerate(zip(todo, ran, strict=True)):
            rows[k] = row
            sink.write(json.dumps({"key": keys[k], "code": code, "row": row}) + "\n")
            sink.flush()
            progress(n + 1, len(todo), time.perf_counter() - t0)
    rows_done = given + [row for row in rows if row is not None]
    judged = [judge(rows_done, name, s) for s in args.seed_base
              for name in [DEFAULTS, *(n for n, _ in variants)]]
    print(table(judged, args.seed_base))
    moves = largest_moves(judged)
    if moves:
        print("\n" + moves)
    if args.draws:
        print("\n" + mean_miss_changes(judged))
    data: dict[str, Any] = {"summary": judged}
    if args.with_rows:
        data["rows"] = rows_done
    out.write_text(json.dumps(data, indent=2) + "\n")
    log.unlink()
    print(f"\nsummary{' and rows' if args.with_rows else ''} written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
