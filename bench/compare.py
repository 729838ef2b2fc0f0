"""Compare two runs of the regime suite: what a change did to issue #15's goals.

    python -m bench.compare BEFORE.json AFTER.json [--moved 0.005] [--json OUT]

``BEFORE`` and ``AFTER`` are rows written by ``python -m bench.robustness --json`` (the
committed ``bench/results/robustness.json``, and a run of the changed code, often with
``--policies hadar,hadare`` only, which is six times quicker).  The rows compared are the
(trace, policy) pairs both files hold.  The baselines do not change with a change to Hadar, so
where ``AFTER`` has no baseline rows on a trace its best baseline's average JCT is taken from
``BEFORE`` (and HadarE's JCT goal uses ``AFTER``'s own ``hadar`` row where it has one); the
ratios of :mod:`bench.robustness` are computed again on those terms.

It prints, per trace and policy whose makespan or average JCT moved by more than ``--moved``
(0.5%), the two ratios before and after; the goals missed before and after, and which of them
are new or met now; and per policy the geometric means over the compared traces of makespan,
average JCT and p95 JCT, after over before.  A change to the policies is judged on all of these
(docs/algorithm.md records each one tried with them); the goal count alone moves by threshold
flips.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import write_rows
from bench.robustness import BASELINES, GOALS, add_ratios, missed_goals, misses
from hadar_slurm.errors import InputError

Row = dict[str, Any]


def read_rows(path: str) -> list[Row]:
    """The rows of a ``bench.robustness --json`` file; an :class:`InputError` that names the
    file and the fix for anything else."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and {"trace", "policy", "makespan_s", "avg_jct_s"} <= r.keys()
            for r in rows):
        raise InputError(f"{path} is not a list of bench.robustness rows (each with trace, "
                         "policy, makespan_s and avg_jct_s); write one with python -m "
                         "bench.robustness --json FILE")
    return rows


def load_rows(path: str) -> list[Row]:
    """:func:`read_rows`, its error ending the command."""
    try:
        return read_rows(path)
    except InputError as exc:
        raise SystemExit(f"bench.compare: {exc.problem}") from None


def rejudged(after: Sequence[Row], before: Sequence[Row]) -> list[Row]:
    """Copies of ``after``'s rows with the ratios of :func:`bench.robustness.add_ratios`
    computed again, with ``before``'s baseline rows on the traces where ``after`` has none and
    ``before``'s ``hadar`` row where ``after`` has none."""
    rows = [dict(r) for r in after]
    mine = {(r["trace"], r["policy"]) for r in rows}
    based = {r["trace"] for r in rows if r["policy"] in BASELINES}
    borrowed = [dict(r) for r in before
                if (r["policy"] in BASELINES and r["trace"] not in based)
                or (r["policy"] == "hadar" and (r["trace"], "hadar") not in mine)]
    add_ratios(rows + borrowed)
    return rows


def geo_mean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values`` (1.0 for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0


def compare(before: Sequence[Row], after: Sequence[Row], moved: float = 0.005,
            ) -> dict[str, Any]:
    """What changed from ``before`` to ``after`` (module docstring), as a dict: ``compared``
    (pairs), ``changed`` (rows that moved), ``missed_before`` / ``missed_after`` (goal lines
    over the compared pairs, as :func:`bench.robustness.misses` writes them), ``new_misses`` /
    ``met_now`` (``[trace, policy, ratio key, ratio]``) and ``geo_means`` per policy."""
    old = {(r["trace"], r["policy"]): r for r in rejudged(before, before)}
    new = {(r["trace"], r["policy"]): r for r in rejudged(after, before)}
    both = [k for k in new if k in old]
    was = missed_goals([old[k] for k in both])
    now = missed_goals([new[k] for k in both])
    changed = []
    ratios: dict[str, dict[str, list[float]]] = {}
    for k in both:
        b, a = old[k], new[k]
        mk = a["makespan_s"] / b["makespan_s"]
        jct = a["avg_jct_s"] / b["avg_jct_s"]
        per = ratios.setdefault(k[1], {"makespan": [], "avg_jct": [], "p95_jct": []})
        per["makespan"].append(mk)
        per["avg_jct"].append(jct)
        if b.get("p95_jct_s") and a.get("p95_jct_s"):
            per["p95_jct"].append(a["p95_jct_s"] / b["p95_jct_s"])
        if abs(mk - 1.0) > moved or abs(jct - 1.0) > moved:
            row: Row = {"trace": k[0], "policy": k[1], "makespan_after_over_before": round(mk, 4),
                        "avg_jct_after_over_before": round(jct, 4)}
            for key, _goal, _what, _of in GOALS.get(k[1], ()):
                row[key] = [b.get(key), a.get(key)]
            changed.append(row)
    return {
        "compared": len(both),
        "changed": changed,
        "missed_before": misses([old[k] for k in both]),
        "missed_after": misses([new[k] for k in both]),
        "new_misses": [[*k, v] for k, v in now.items() if k not in was],
        "met_now": [[*k, v] for k, v in was.items() if k not in now],
        "geo_means": {p: {what: round(geo_mean(v), 4) for what, v in per.items() if v}
                      for p, per in ratios.items()},
    }


def report(result: dict[str, Any]) -> str:
    """The comparison as text."""
    lines = [f"{result['compared']} (trace, policy) pairs compared; "
             f"{len(result['changed'])} moved"]
    for r in result["changed"]:
        goals = "  ".join(f"{key.replace('_over_', ' / ')} {v[0]} -> {v[1]}"
                          for key, v in r.items() if isinstance(v, list))
        lines.append(f"  {r['trace']:24s} {r['policy']:7s} makespan x"
                     f"{r['makespan_after_over_before']:.3f}  avg JCT x"
                     f"{r['avg_jct_after_over_before']:.3f}  {goals}")
    lines.append("")
    lines.append(f"goals missed: {len(result['missed_before'])} before, "
                 f"{len(result['missed_after'])} after")
    for title, key in (("new", "new_misses"), ("met now", "met_now")):
        for trace, policy, ratio, value in result[key]:
            lines.append(f"  {title}: {trace}: {policy} {ratio} {value:.3f}")
    lines.append("")
    lines.append("geometric means, after over before:")
    for p, per in result["geo_means"].items():
        lines.append(f"  {p:15s} " + "  ".join(f"{what} {v:.4f}" for what, v in per.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("before", help="rows of bench.robustness --json (e.g. the committed ones)")
    ap.add_argument("after", help="rows of bench.robustness --json with the change")
    ap.add_argument("--moved", type=float, default=0.005,
                    help="list a row whose makespan or average JCT moved by more than this "
                    "share (default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the comparison here")
    args = ap.parse_args(argv)
    result = compare(load_rows(args.before), load_rows(args.after), args.moved)
    if not result["compared"]:
        print("bench.compare: the two files share no (trace, policy) pair: were they run "
              "with the same --seed-base?", file=sys.stderr)
        return 2
    print(report(result))
    if args.json:
        write_rows([result], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
