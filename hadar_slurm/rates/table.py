"""Throughput tables: how fast each job type runs on each GPU type.

A :class:`ThroughputTable` maps ``(job_type, scale_factor, gpu_type)`` to the iterations per
second of the *whole job* running alone on ``scale_factor`` GPUs of that type (Gavel's
convention; divide by ``scale_factor`` for one worker's rate).

Two file formats are read:

* **Gavel's JSON** (``simulation_throughputs.json``): ``{gpu: {"('<model>', <sf>)": {"null":
  rate, "('<other model>', <sf>)": [rate, other rate], ...}}}``.  The isolated ``null`` rates
  are the table; the pair entries, co-located throughputs of two jobs sharing the same GPUs,
  go to :attr:`ThroughputTable.pairs` (:mod:`hadar_slurm.rates.colocated`; pairs of unequal
  scale factors are skipped: no job is packed with one of another scale).  The
  ``*_unconsolidated`` keys are not GPU types and are skipped.
* **Our CSV** (for GPU types Gavel never measured, such as ``a100`` or ``h100``): one
  row per measurement, ``#`` starts a comment, and the first non-comment line is the header::

      job_type,scale_factor,gpu_type,steps_per_second
      ResNet-50 (batch size 64),1,a100,9.8
      ResNet-50 (batch size 64),1,h100,15.2

A file ending in ``.json`` is read as Gavel's format, anything else as our CSV.  Later files
override earlier ones entry by entry (:meth:`ThroughputTable.merged`).
"""

from __future__ import annotations

import ast
import csv
import functools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from hadar_slurm.errors import InputError
from hadar_slurm.model import GpuType, normalize_gpu_type
from hadar_slurm.rates.colocated import ColocatedTable, PairKey
from hadar_slurm.rates.memory import MemoryLimits

JobKey = tuple[str, int]

CSV_HEADER = ("job_type", "scale_factor", "gpu_type", "steps_per_second")


@dataclass(frozen=True)
class ThroughputTable:
    """Isolated throughputs, ``rates[(job_type, scale_factor)][gpu_type] = steps/s``."""

    rates: Mapping[JobKey, Mapping[GpuType, float]] = field(default_factory=dict)
    source: str = "<table>"
    #: Co-located throughputs of pairs of jobs sharing the same GPUs (Gavel's JSON only;
    #: empty for our CSV format).
    pairs: ColocatedTable = field(default_factory=ColocatedTable)
    #: Footprints of job types and memory of GPU types (:mod:`hadar_slurm.rates.memory`): a
    #: pair is offered only where it fits (empty: the pair table's word alone).
    memory: MemoryLimits = field(default_factory=MemoryLimits)

    def rate(self, job_type: str, scale_factor: int, gpu_type: GpuType) -> float:
        """Whole-job steps/s; 0.0 when the job type does not run on ``gpu_type``."""
        return float(self.rates.get((job_type, scale_factor), {}).get(gpu_type, 0.0))

    def has_job(self, job_type: str, scale_factor: int) -> bool:
        return (job_type, scale_factor) in self.rates

    def gpu_types(self) -> tuple[GpuType, ...]:
        seen: dict[GpuType, None] = {}
        for per_gpu in self.rates.values():
            for g in per_gpu:
                seen.setdefault(g, None)
        return tuple(seen)

    def job_keys(self) -> Iterator[JobKey]:
        return iter(self.rates)

    @functools.cached_property
    def colocated(self) -> ColocatedTable:
        """:attr:`pairs`, with the pairs on this table's GPU types that were not measured
        estimated (:meth:`ColocatedTable.with_estimates`) and those whose two jobs do not fit
        in the GPU's memory forbidden (:meth:`ColocatedTable.within_memory`): what the policy
        and the emulated payload use."""
        return self.pairs.with_estimates(self.rate, self.gpu_types()).within_memory(self.memory)

    def merged(self, other: ThroughputTable) -> ThroughputTable:
        """Entries of ``other`` override ours, one ``(job, gpu)`` entry at a time."""
        out: dict[JobKey, dict[GpuType, float]] = {k: dict(v) for k, v in self.rates.items()}
        for key, per_gpu in other.rates.items():
            out.setdefault(key, {}).update(per_gpu)
        return ThroughputTable(out, f"{self.source}+{other.source}",
                               self.pairs.merged(other.pairs), self.memory.merged(other.memory))


def _check_rate(value: object, *, source: str, line: int | None, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(
            f"expected a number of steps per second, got {value!r}",
            source=source, line=line, field=field_name, fix="use a number >= 0",
        )
    try:
        rate = float(value)
    except ValueError:
        raise InputError(
            f"expected a number of steps per second, got {value!r}",
            source=source, line=line, field=field_name, fix="use a number >= 0",
        ) from None
    if not math.isfinite(rate) or rate < 0:
        raise InputError(
            f"steps per second must be finite and >= 0, got {value!r}",
            source=source, line=line, field=field_name, fix="use a number >= 0",
        )
    return rate


def load_gavel_json(path: str | Path) -> ThroughputTable:
    """Read Gavel's ``simulation_throughputs.json`` (isolated rates and co-located pairs)."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read throughput file: {exc.strerror}", source=source) from None
    return parse_gavel_json(text, source)


def parse_gavel_json(text: str, source: str) -> ThroughputTable:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not valid JSON: {exc.msg}", source=source, line=exc.lineno,
            fix="give Gavel's simulation_throughputs.json or a CSV with header "
            + ",".join(CSV_HEADER),
        ) from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object keyed by GPU type", source=source)
    rates: dict[JobKey, dict[GpuType, float]] = {}
    pairs: dict[PairKey, dict[GpuType, tuple[float, float]]] = {}
    pair_field: dict[tuple[PairKey, GpuType], str] = {}
    for gpu_name, per_job in data.items():
        if "unconsolidated" in gpu_name:
            continue
        gpu = normalize_gpu_type(gpu_name)
        if not isinstance(per_job, dict):
            raise InputError(
                "expected an object keyed by \"('<model>', <scale_factor>)\"",
                source=source, field=gpu_name,
            )
        for key_text, entry in per_job.items():
            key = _parse_gavel_key(key_text, source, gpu_name)
            if isinstance(entry, dict):
                if "null" not in entry:
                    raise InputError(
                        "no isolated throughput ('null' key)", source=source,
                        field=f"{gpu_name}.{key_text}", fix="add \"null\": <steps/s>",
                    )
                value = entry["null"]
                for other_text, pair in entry.items():
                    if other_text != "null":
                        _add_pair(pairs, pair_field, key, other_text, pair, gpu,
                                  source=source, where=f"{gpu_name}.{key_text}")
            else:
                value = entry
            rates.setdefault(key, {})[gpu] = _check_rate(
                value, source=source, line=None, field_name=f"{gpu_name}.{key_text}"
            )
    if not rates:
        raise InputError("no throughputs found", source=source)
    return ThroughputTable(rates, source, ColocatedTable(pairs, source))


def _add_pair(pairs: dict[PairKey, dict[GpuType, tuple[float, float]]],
              seen: dict[tuple[PairKey, GpuType], str], key: JobKey, other_text: str,
              value: object, gpu: GpuType, *, source: str, where: str) -> None:
    """Check one co-located entry ``"('<other>', <sf>)": [rate, other rate]`` under job
    ``key`` and store it in both orders (unless the scale factors differ: then it is skipped).
    The same pair seen under the other job must mirror it."""
    field_name = f"{where}.{other_text}"
    other = _parse_gavel_key(other_text, source, field_name)
    fix = ("give [steps/s of this job, steps/s of the other] while they share the GPUs, two "
           "numbers >= 0 ([0, 0]: the pair may not share)")
    if not isinstance(value, list) or len(value) != 2:
        raise InputError(
            f"co-located throughputs must be a list of two numbers, got {value!r}",
            source=source, field=field_name, fix=fix)
    rate_a, rate_b = (_check_rate(v, source=source, line=None, field_name=field_name)
                      for v in value)
    if other[1] != key[1]:
        return  # only jobs of the same scale factor are packed
    fwd: PairKey = (key[0], other[0], key[1])
    back: PairKey = (other[0], key[0], key[1])
    if fwd == back and not _close(rate_a, rate_b):
        raise InputError(
            f"two jobs of the same type share the GPUs at different rates [{rate_a!r}, "
            f"{rate_b!r}]", source=source, field=field_name,
            fix="give the same steps/s twice: the two jobs are alike")
    mirror = pairs.get(back, {}).get(gpu)
    if fwd != back and mirror is not None and not (
            _close(mirror[0], rate_b) and _close(mirror[1], rate_a)):
        raise InputError(
            f"co-located throughputs [{rate_a!r}, {rate_b!r}] disagree with the same pair "
            f"under {seen.get((back, gpu), field_name)!r}: [{mirror[0]!r}, {mirror[1]!r}]",
            source=source, field=field_name,
            fix="the two entries of a pair must mirror each other ([a, b] and [b, a])")
    pairs.setdefault(fwd, {})[gpu] = (rate_a, rate_b)
    pairs.setdefault(back, {})[gpu] = (rate_b, rate_a)
    seen[(fwd, gpu)] = field_name
    seen.setdefault((back, gpu), field_name)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _parse_gavel_key(text: str, source: str, gpu_name: str) -> JobKey:
    try:
        key = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        key = None
    if (
        not isinstance(key, tuple) or len(key) != 2 or not isinstance(key[0], str)
        or not isinstance(key[1], int) or key[1] < 1
    ):
        raise InputError(
            f"job key {text!r} is not of the form \"('<model>', <scale_factor>)\"",
            source=source, field=gpu_name,
        )
    return (key[0], key[1])


def load_csv(path: str | Path) -> ThroughputTable:
    """Read our CSV format (see the module docstring)."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read throughput file: {exc.strerror}", source=source) from None
    return parse_csv(text, source)


def parse_csv(text: str, source: str) -> ThroughputTable:
    rows = [
        (n, line) for n, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rows:
        raise InputError("empty throughput file", source=source, fix="add a header and rows")
    header_line, header = rows[0]
    cols = tuple(c.strip() for c in next(csv.reader([header])))
    if cols != CSV_HEADER:
        raise InputError(
            f"header is {','.join(cols)!r}", source=source, line=header_line,
            fix="the first line must be " + ",".join(CSV_HEADER),
        )
    rates: dict[JobKey, dict[GpuType, float]] = {}
    for n, line in rows[1:]:
        cells = [c.strip() for c in next(csv.reader([line]))]
        if len(cells) != len(CSV_HEADER):
            raise InputError(
                f"expected {len(CSV_HEADER)} comma-separated fields, got {len(cells)}",
                source=source, line=n, fix="quote a job type that contains a comma",
            )
        job_type, sf_text, gpu_text, rate_text = cells
        if not job_type:
            raise InputError("empty job type", source=source, line=n, field="job_type")
        try:
            sf = int(sf_text)
        except ValueError:
            sf = 0
        if sf < 1:
            raise InputError(
                f"scale factor must be an integer >= 1, got {sf_text!r}",
                source=source, line=n, field="scale_factor",
            )
        gpu = normalize_gpu_type(gpu_text)
        if not gpu:
            raise InputError("empty GPU type", source=source, line=n, field="gpu_type")
        rates.setdefault((job_type, sf), {})[gpu] = _check_rate(
            rate_text, source=source, line=n, field_name="steps_per_second"
        )
    return ThroughputTable(rates, source)


def load_table(path: str | Path) -> ThroughputTable:
    """Read a throughput file in either format (``.json``: Gavel's; otherwise our CSV)."""
    if str(path).endswith(".json"):
        return load_gavel_json(path)
    return load_csv(path)


def default_table() -> ThroughputTable:
    """Gavel's measured table for v100, p100 and k80, shipped with the package."""
    ref = resources.files("hadar_slurm") / "data" / "gavel" / "simulation_throughputs.json"
    return parse_gavel_json(ref.read_text(), "gavel:simulation_throughputs.json")


def load_tables(paths: Iterable[str | Path],
                base: ThroughputTable | None = None) -> ThroughputTable:
    """The bundled Gavel table (:func:`default_table`, or ``base``: that table, already
    parsed) with the entries of each of ``paths`` merged over it, in order (a later file
    wins).  The simulator's ``--throughputs`` and the sidecar's ``[scheduler] throughputs``
    both read their tables here."""
    table = default_table() if base is None else base
    for path in paths:
        table = table.merged(load_table(path))
    return table


#: A job type with a batch size: ``<model> (batch size <N>)``, as Gavel names them.
_BATCHED = re.compile(r"^(.*) \(batch size ([0-9]+)\)$")


def split_job_type(job_type: str) -> tuple[str, int | None]:
    """The model and batch size a job type names: ``"ResNet-50 (batch size 64)"`` ->
    ``("ResNet-50", 64)``; ``"A3C"`` -> ``("A3C", None)``.

    The one reading of the naming convention (the hints' model catalog, the estimator's model
    families and the consolidation cost's model sizes all use it).  A batch size is only the
    exact trailing suffix `` (batch size N)`` (one space before it, ASCII digits, nothing
    after it); everything before it is the model, other parentheses included:
    ``"ResNet-50 (fp16)"`` is the model ``ResNet-50 (fp16)`` without batch size (a model of its
    own, with throughputs of its own), and ``"ResNet-50 (fp16) (batch size 64)"`` is
    ``("ResNet-50 (fp16)", 64)``.  Names that only resemble the suffix (``"X (batch size 64) "``,
    ``"X(batch size 64)"``) are models without batch size.
    """
    match = _BATCHED.match(job_type)
    return (match.group(1), int(match.group(2))) if match else (job_type, None)
