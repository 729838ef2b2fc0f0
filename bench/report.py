"""Writing benchmark rows: one JSON list per benchmark, under ``bench/results/`` by default."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO


def write_rows(rows: list[dict[str, Any]], path: str) -> None:
    """Write ``rows`` as an indented JSON list to ``path`` (folders made) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\nrows written to {out}")


def progress(done: int, total: int, elapsed_s: float, stream: TextIO | None = None) -> None:
    """Say how many of ``total`` runs are done: on a terminal one line rewritten in place,
    elsewhere (a log, ``| tee``) a line at each tenth of the runs and at the last, so that a
    captured log does not hold one line per run glued together by carriage returns."""
    out = sys.stderr if stream is None else stream
    text = f"{done}/{total} runs ({elapsed_s:.0f} s)"
    if out.isatty():
        print("\r" + text, end="\n" if done == total else "", file=out, flush=True)
    elif done == total or done * 10 // max(total, 1) > (done - 1) * 10 // max(total, 1):
        print(text, file=out, flush=True)
