"""Writing benchmark rows: one JSON list per benchmark, under ``bench/results/`` by default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_rows(rows: list[dict[str, Any]], path: str) -> None:
    """Write ``rows`` as an indented JSON list to ``path`` (folders made) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\nrows written to {out}")
