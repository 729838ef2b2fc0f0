"""Job hints: what a user tells hadar about a job, in its Slurm comment.

A hadar job is submitted with a comment that starts with ``hadar:``, e.g.::

    sbatch --comment="hadar: model=resnet50 bs=64 steps=40000" --gres=gpu:2 job.sh

Syntax (the same rules are implemented in ``slurm_conf/job_submit.lua``, which refuses a bad
job at ``sbatch`` time; keep the two in step, tests/test_submit_lua.py checks they agree):

* The comment, without leading whitespace, starts with ``hadar:`` (any case).  Other comments
  are not hadar jobs and are left alone.
* After the prefix: whitespace-separated ``key=value`` tokens (split at the first ``=``).  Keys
  are lower case; each may be given once; no value may be empty.
* ``model`` (required): a model of the throughput table.  Its name is compared by its lower-case
  letters and digits only, so ``ResNet-50`` is ``resnet50``.
* ``bs``: the batch size; required if and only if the model has batch sizes, and then one of them.
* ``steps`` (required): the work, in training iterations; a whole number from 1 to
  :data:`MAX_STEPS` (10**12), digits with optional single ``_`` between them (``40000``,
  ``40_000``).
* ``sync``: ``true``/``false``/``yes``/``no``/``1``/``0`` (any case); default true.
* ``weight``: a decimal number from :data:`MIN_WEIGHT` to :data:`MAX_WEIGHT` (0.001 to 1000;
  ``2``, ``0.5``, ``1e1``); default 1.
* ``fork``: the most copies HadarE may fork the job into, a whole number from 1 to
  :data:`hadar_slurm.slurm.hetjob.MAX_COPIES`; default 1 (never forked).  Only jobs whose script
  trains through the job tracker (``hadar_slurm.runtime``) should ask for more.
* ``preempt``: ``checkpoint``, ``requeue`` or ``never`` (lower case), how a running job may be
  stopped to move it; default: ``checkpoint`` for a job that may be forked, else ``never``.
* ``share``: ``true``/``false``/``yes``/``no``/``1``/``0`` (any case), as ``sync``; default true:
  the job may share a GPU with another job (Slurm's gres/shard) when the throughput table says
  the pair does more than taking turns.  ``share=no``: it never shares a GPU.
* The job's GPU count must be one the table has for that model and batch size.

A hyperparameter study (issue #17) is a job array, one array task per trial
(``sbatch --array=0-63 --comment="hadar: model=resnet18 bs=64 steps=40000 study=lr-search"``);
these hints say how hadar stops its trials early (:mod:`hadar_slurm.studies.spec`):

* ``study``: the study's name, which makes the job a study: 1 to 64 ASCII letters, digits,
  ``_``, ``.`` or ``-``, starting with a letter or digit.  A study must be a job array
  (``--array``).
* ``rule``: ``asha``, ``sh`` or ``none`` (lower case, as ``preempt``), the halving rule; default
  ``asha``.
* ``rungs``: a whole number from 1 to :data:`MAX_RUNGS` (10); default 4.
* ``eta``: the reduction factor, a whole number from :data:`MIN_ETA` to :data:`MAX_ETA` (2 to
  16); default 3.
* ``metric``: the name of what the trials report, as a study's name; default ``accuracy``.
* ``mode``: ``max`` (higher is better) or ``min`` (lower is better), lower case; default
  ``max``.
* ``rule``, ``rungs``, ``eta``, ``metric`` and ``mode`` are refused without ``study``.
* The first rung must train at least one step: ``steps >= eta ** (rungs - 1)`` (at most
  ``16 ** 9 = 2 ** 36``, exact in Lua's doubles).

Problems are reported in token order for syntax, then in the order of the keys above (model,
bs, steps, sync, weight, fork, preempt, share, then the study's hints: a study hint without
``study``, study, rule, rungs, eta, metric, mode, the first rung, the job array), then the GPU
count.

Bounds: every value a user writes is bounded before it is converted, so no input can overflow
a number or take time (these numbers reach job_submit.lua through the generated block):

* the whole comment: at most :data:`MAX_COMMENT_BYTES` (512) bytes, checked first;
* each value: at most :data:`MAX_VALUE_BYTES` (64) bytes (a model name, a batch size ...);
* at most one token per key, so at most ``len(HINT_KEYS)`` (14) tokens;
* whole numbers (``bs``, ``steps``, ``fork``, ``rungs``, ``eta``, and the GPU count
  job_submit.lua reads from the job's request) are compared by their count of digits before
  they are converted; ``steps`` <= 10**12, ``fork`` <= 16, ``rungs`` <= 10, ``eta`` <= 16;
  ``weight`` is finite, 0.001 to 1000; a GPU count above :data:`MAX_GPUS` (9999) is reported
  as ``more than 9999``;
* digits are ASCII only (``'\\u0663'`` and fullwidth digits are not digits here), whitespace is
  ASCII only (what Lua's ``%s`` is), letter case is ASCII only;
* a message quotes at most :data:`QUOTE_BYTES` (40) bytes of a bad value, with every byte that
  is not printable ASCII written as ``\\xNN`` and ``...`` when cut, so a message is one short
  line whatever the input.

Lengths are in bytes of UTF-8 (Lua's strings are bytes); a ``str`` from a non-UTF-8 argv
(``surrogateescape``) counts its original bytes.

Every problem is a :class:`HintError`, one line that names the hint and says how to fix it; its
text is the same as the Lua plugin's message after ``hadar:``.
"""

from __future__ import annotations

import functools
import math
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hadar_slurm.errors import InputError
from hadar_slurm.rates.table import ThroughputTable, default_table, split_job_type
from hadar_slurm.sidecar.record import MAX_ARGS_BYTES
from hadar_slurm.slurm.hetjob import MAX_COPIES

__all__ = [
    "HINT_KEYS",
    "HINT_PREFIX",
    "LUA_BEGIN",
    "LUA_END",
    "MAX_COMMENT_BYTES",
    "MAX_ETA",
    "MAX_GPUS",
    "MAX_RUNGS",
    "MAX_STEPS",
    "MAX_VALUE_BYTES",
    "MAX_WEIGHT",
    "MIN_ETA",
    "MIN_WEIGHT",
    "QUOTE_BYTES",
    "STUDY_MODES",
    "STUDY_RULES",
    "HintError",
    "Hints",
    "ModelCatalog",
    "StudyHints",
    "is_hadar_comment",
    "lua_catalog_block",
    "parse_hints",
    "quote",
    "whole_number",
]

HINT_PREFIX = "hadar:"
HINT_KEYS = ("model", "bs", "steps", "sync", "weight", "fork", "preempt", "share",
             "study", "rule", "rungs", "eta", "metric", "mode")
#: How a running job may be stopped to move it (the ``preempt`` hint).
PREEMPT_MODES = ("checkpoint", "requeue", "never")
#: The halving rules of a study (the ``rule`` hint; hadar_slurm.studies.spec.Rule).
STUDY_RULES = ("asha", "sh", "hyperband", "none")
#: Whether a study's metric is better higher (``max``) or lower (``min``) (the ``mode`` hint).
STUDY_MODES = ("max", "min")
# the hints that only a study (study=NAME) may have
_STUDY_KEYS = ("rule", "rungs", "eta", "metric", "mode")
LUA_BEGIN = "-- BEGIN HADAR MODELS (generated by: hadar-slurm hints lua)"
LUA_END = "-- END HADAR MODELS"

# The bounds of what a user writes (see the module docstring; job_submit.lua gets them from
# lua_catalog_block, so the plugin and this module share the numbers).
# a valid comment with every key needs about 160 bytes, about 300 with 64-byte study and
# metric names and every other value at its longest usual spelling
MAX_COMMENT_BYTES = 512
MAX_VALUE_BYTES = 64
MAX_STEPS = 10**12
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0
MAX_GPUS = 9999  # a GPU count above it is reported as "more than 9999"
MAX_RUNGS = 10  # a study's rungs: 1 to MAX_RUNGS
MIN_ETA = 2  # a study's reduction factor: MIN_ETA to MAX_ETA
MAX_ETA = 16  # (so eta ** (rungs - 1) <= 2 ** 36: exact in a double)
QUOTE_BYTES = 40

# Lua's %s (C isspace): the only whitespace both sides agree on.
_SPACE = " \t\n\r\f\v"
_SPLIT = re.compile(r"[ \t\n\r\f\v]+")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_NOT_ALNUM = re.compile(r"[^a-z0-9]")
_WHOLE = re.compile(r"[0-9]+(?:_[0-9]+)*")  # fullmatch: ASCII digits, single _ between
_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# fullmatch: the names of a study and of its metric (hadar_slurm/studies/spec.py's _NAME; the
# value bound, MAX_VALUE_BYTES, is its 64)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# the values of sync and share
_SYNC = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_VALUE_FORM = {"model": "model=NAME", "bs": "bs=N", "steps": "steps=N",
               "sync": "sync=true", "weight": "weight=W", "fork": "fork=N",
               "preempt": "preempt=checkpoint", "share": "share=true",
               "study": "study=NAME", "rule": "rule=asha", "rungs": "rungs=N", "eta": "eta=N",
               "metric": "metric=NAME", "mode": "mode=max"}


class HintError(InputError):
    """A bad hint.  ``field`` is the hint's key (``model``, ``bs``, ``steps``, ``sync``,
    ``weight``, ``fork``, ``preempt``, ``share``, ``study``, ``rule``, ``rungs``, ``eta``,
    ``metric``, ``mode``), ``gpus`` for a GPU count the model does not run on, ``array`` for a
    study that is not a job array, or ``hints`` for syntax.
    ``str()`` is one line, ``PROBLEM (FIX)``, the same text job_submit.lua prints."""

    def one_line(self) -> str:
        return self.problem + (f" ({self.fix})" if self.fix else "")


@dataclass(frozen=True)
class StudyHints:
    """The study hints of a job that is one study (a job array, a trial per task)."""

    name: str  # the study's name (study=NAME)
    rule: str = "asha"  # STUDY_RULES
    rungs: int = 4  # 1 to MAX_RUNGS
    eta: int = 3  # MIN_ETA to MAX_ETA
    metric: str = "accuracy"  # what the trials report
    mode: str = "max"  # STUDY_MODES: max, higher is better; min, lower is better

    def to_comment(self) -> str:
        """The study's tokens of the canonical comment (every one written)."""
        return (f"study={self.name} rule={self.rule} rungs={self.rungs} eta={self.eta} "
                f"metric={self.metric} mode={self.mode}")


@dataclass(frozen=True)
class Hints:
    model: str  # canonical short name, e.g. "resnet50"
    batch_size: int | None
    steps: int  # work, iterations, 1 to MAX_STEPS
    sync: bool
    weight: float  # MIN_WEIGHT to MAX_WEIGHT
    job_type: str  # key of the throughput table, e.g. "ResNet-50 (batch size 64)"
    fork: int = 1  # the most copies HadarE may fork it into (1: never forked)
    preempt: str = ""  # how it may be stopped to move it (PREEMPT_MODES); "" when not given
    share: bool = True  # it may share a GPU with another job (False: share=no, never)
    study: StudyHints | None = None  # the study it is (a job array); None: not a study

    @property
    def preempt_mode(self) -> str:
        """``checkpoint``, ``requeue`` or ``never``: the ``preempt`` hint, else ``checkpoint``
        for a job that may be forked (its copies train through the runtime, which checkpoints)
        or is a study's trial (it reports its rungs through the runtime, and waits at a rung
        under synchronous halving: it is requeued to free its GPUs), and ``never`` for any
        other (a job that cannot checkpoint is never stopped by hadar unless its user says it
        may be)."""
        if self.preempt:
            return self.preempt
        return "checkpoint" if self.fork > 1 or self.study is not None else "never"

    def to_comment(self) -> str:
        """The canonical comment, which :func:`parse_hints` reads back to these hints."""
        bs = f" bs={self.batch_size}" if self.batch_size is not None else ""
        fork = f" fork={self.fork}" if self.fork != 1 else ""
        fork += f" preempt={self.preempt}" if self.preempt else ""
        fork += "" if self.share else " share=false"
        fork += f" {self.study.to_comment()}" if self.study is not None else ""
        return (f"{HINT_PREFIX} model={self.model}{bs} steps={self.steps} "
                f"sync={'true' if self.sync else 'false'} weight={self.weight:g}{fork}")


def _utf8(text: str) -> bytes:
    """The bytes of ``text`` as Lua sees them: UTF-8, and a ``str`` decoded with
    ``surrogateescape`` (a non-UTF-8 argv) gives back its original bytes."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def quote(text: str) -> str:
    """What a message shows of a user's value: its first :data:`QUOTE_BYTES` bytes, printable
    ASCII as is and every other byte as ``\\xNN``, then ``...`` when cut (job_submit.lua's
    ``quote`` is the same)."""
    data = _utf8(text)
    shown = "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in data[:QUOTE_BYTES])
    return shown + ("..." if len(data) > QUOTE_BYTES else "")


def whole_number(text: str, most: int) -> int | None:
    """The whole number ``text`` (ASCII digits, single ``_`` between them), None if it is not
    one.  A number with more digits than ``most`` is not converted: it is returned as
    ``most + 1``; any other is converted (a few digits) and may be above ``most`` too, so
    callers compare the result with ``most``."""
    if not _WHOLE.fullmatch(text):
        return None
    digits = text.replace("_", "").lstrip("0") or "0"
    if len(digits) > len(str(most)):
        return most + 1
    return int(digits)


def canonical_model(name: str) -> str:
    """Lower-case ASCII letters and digits of ``name``: ``ResNet-50`` -> ``resnet50``."""
    return _NOT_ALNUM.sub("", name.translate(_ASCII_LOWER))


def _join(items: Iterable[object], last: str = ", ") -> str:
    texts = [str(i) for i in items]
    if len(texts) <= 1 or last == ", ":
        return ", ".join(texts)
    return ", ".join(texts[:-1]) + last + texts[-1]


@dataclass(frozen=True)
class _Variant:
    job_type: str
    gpus: tuple[int, ...]


class ModelCatalog:
    """The models of a throughput table by short name, with their batch sizes and GPU counts.

    ``variants[model][batch_size]`` (``None``: a model without batch size, such as A3C)."""

    def __init__(self, variants: Mapping[str, Mapping[int | None, _Variant]]) -> None:
        self._variants = {m: dict(v) for m, v in sorted(variants.items())}

    @staticmethod
    def from_table(table: ThroughputTable) -> ModelCatalog:
        """Short names from the job types: ``"ResNet-50 (batch size 64)"`` -> ``resnet50``,
        batch size 64; ``"A3C"`` -> ``a3c`` without batch size."""
        gpus: dict[str, dict[int | None, dict[str, set[int]]]] = {}
        for job_type, scale in table.job_keys():
            base, bs = split_job_type(job_type)
            name = canonical_model(base)
            if not name or bs == 0 or len(name) > MAX_VALUE_BYTES:
                raise InputError(
                    f"job type {job_type!r} gives no usable model name", source=table.source,
                    field="job_type", fix=f"name job types with 1 to {MAX_VALUE_BYTES} letters "
                    "or digits, optionally followed by ' (batch size N)' with N >= 1")
            gpus.setdefault(name, {}).setdefault(bs, {}).setdefault(job_type, set()).add(scale)
        variants: dict[str, dict[int | None, _Variant]] = {}
        for name, per_bs in gpus.items():
            if None in per_bs and len(per_bs) > 1:
                raise InputError(
                    f"model {name!r} has job types with and without a batch size",
                    source=table.source, field="job_type",
                    fix="give every job type of one model a ' (batch size N)' suffix, or none")
            variants[name] = {}
            for bs, per_type in sorted(per_bs.items(), key=lambda kv: kv[0] or 0):
                if len(per_type) > 1:
                    raise InputError(
                        f"job types {sorted(per_type)} all have the short name {name!r}",
                        source=table.source, field="job_type",
                        fix="rename job types so their letters and digits differ")
                ((job_type, scales),) = per_type.items()
                variants[name][bs] = _Variant(job_type, tuple(sorted(scales)))
        return ModelCatalog(variants)

    @staticmethod
    def default() -> ModelCatalog:
        """The catalog of the bundled Gavel table (``throughputs.default_table()``)."""
        return _default_catalog()

    def models(self) -> tuple[str, ...]:
        return tuple(self._variants)

    def _model(self, model: str) -> dict[int | None, _Variant]:
        try:
            return self._variants[model]
        except KeyError:
            raise HintError(f"unknown model '{quote(model)}'", field="model",
                            fix="known: " + ", ".join(self._variants)) from None

    def batch_sizes(self, model: str) -> tuple[int, ...]:
        """Sorted batch sizes; ``()`` for a model without batch size (A3C, CycleGAN)."""
        return tuple(sorted(bs for bs in self._model(model) if bs is not None))

    def _variant(self, model: str, batch_size: int | None) -> _Variant:
        per_bs = self._model(model)
        if batch_size not in per_bs:
            sizes = self.batch_sizes(model)
            if not sizes:
                raise HintError(f"{model} has no batch size", field="bs",
                                fix=f"remove bs={batch_size}")
            if batch_size is None:
                raise HintError(f"missing hint bs for {model}", field="bs",
                                fix="add bs=N; choose " + ", ".join(map(str, sizes)))
            raise HintError(f"bs {batch_size} not available for {model}", field="bs",
                            fix="choose " + ", ".join(map(str, sizes)))
        return per_bs[batch_size]

    def gpu_counts(self, model: str, batch_size: int | None) -> tuple[int, ...]:
        """The GPU counts (scale factors) the table has for this model and batch size."""
        return self._variant(model, batch_size).gpus

    def job_type(self, model: str, batch_size: int | None) -> str:
        return self._variant(model, batch_size).job_type


@functools.cache
def _default_catalog() -> ModelCatalog:
    return ModelCatalog.from_table(default_table())


def is_hadar_comment(comment: str) -> bool:
    """True when ``comment`` (leading whitespace ignored) starts with ``hadar:``, any case."""
    return comment.lstrip(_SPACE)[: len(HINT_PREFIX)].translate(_ASCII_LOWER) == HINT_PREFIX


def _tokens(comment: str) -> dict[str, str]:
    """``key -> value`` of the tokens after the prefix; syntax errors in token order."""
    if not is_hadar_comment(comment):
        raise HintError(f"comment does not start with '{HINT_PREFIX}'", field="hints",
                        fix=f"write e.g. '{HINT_PREFIX} model=resnet50 bs=64 steps=40000'")
    if len(_utf8(comment)) > MAX_COMMENT_BYTES:
        raise HintError(f"comment is longer than {MAX_COMMENT_BYTES} bytes", field="hints",
                        fix=f"write only the hints, e.g. '{HINT_PREFIX} model=resnet50 bs=64 "
                        "steps=40000'")
    rest = comment.lstrip(_SPACE)[len(HINT_PREFIX):]
    keys = ", ".join(HINT_KEYS)
    out: dict[str, str] = {}
    for token in _SPLIT.split(rest):
        if not token:
            continue
        key, eq, value = token.partition("=")
        if not eq or not key:
            raise HintError(f"hint '{quote(token)}' is not key=value", field="hints",
                            fix=f"keys: {keys}")
        if key not in HINT_KEYS:
            raise HintError(f"unknown hint '{quote(key)}'", field="hints", fix=f"keys: {keys}")
        if key in out:
            raise HintError(f"hint '{key}' given twice", field=key, fix="give it once")
        if not value:
            raise HintError(f"hint '{key}' has no value", field=key,
                            fix=f"write {_VALUE_FORM[key]}")
        if len(_utf8(value)) > MAX_VALUE_BYTES:
            raise HintError(f"hint '{key}' has a value longer than {MAX_VALUE_BYTES} bytes",
                            field=key, fix=f"write {_VALUE_FORM[key]}")
        out[key] = value
    return out


def _flag(given: Mapping[str, str], key: str) -> bool:
    """A yes/no hint (``sync``, ``share``): true/false, yes/no or 1/0 in any case; true when
    not given."""
    if key not in given:
        return True
    text = given[key]
    if text.translate(_ASCII_LOWER) not in _SYNC:
        raise HintError(f"{key} must be true or false, got '{quote(text)}'", field=key,
                        fix="true/false, yes/no or 1/0")
    return _SYNC[text.translate(_ASCII_LOWER)]


def _whole(given: Mapping[str, str], key: str, default: int, least: int, most: int,
           fix: str) -> int:
    """A whole-number hint (``fork``, ``rungs``, ``eta``) from ``least`` to ``most``;
    ``default`` when not given."""
    if key not in given:
        return default
    text = given[key]
    value = whole_number(text, most) or 0
    if not least <= value <= most:
        raise HintError(f"{key} must be a whole number from {least} to {most}, "
                        f"got '{quote(text)}'", field=key, fix=fix)
    return value


def _choice(given: Mapping[str, str], key: str, choices: tuple[str, ...], fix: str) -> str:
    """A hint that is one of ``choices`` (``rule``, ``mode``), exactly as written (lower case,
    as ``preempt``); the first choice when not given."""
    if key not in given:
        return choices[0]
    text = given[key]
    if text not in choices:
        raise HintError(f"{key} must be {_join(choices, ' or ')}, got '{quote(text)}'",
                        field=key, fix=fix)
    return text


def _name(given: Mapping[str, str], key: str, default: str, fix: str) -> str:
    """A name hint (``study``, ``metric``): ASCII letters, digits, ``_``, ``.``, ``-``,
    starting with a letter or digit (at most MAX_VALUE_BYTES, as every value)."""
    if key not in given:
        return default
    text = given[key]
    if not _NAME.fullmatch(text):
        raise HintError(f"{key} must be letters, digits, '_', '.' or '-', starting with a "
                        f"letter or digit, got '{quote(text)}'", field=key, fix=fix)
    return text


def parse_hints(
    comment: str, catalog: ModelCatalog | None = None, *, gpus: int | None = None,
    array: bool | None = None,
) -> Hints:
    """Parse and check the hints of a ``hadar:`` comment (see the module docstring).

    ``gpus``, the job's GPU count, is checked against the catalog's counts when given.
    ``array``, whether the job is a job array (``sbatch --array``), is checked for a study when
    known: False refuses a study, None (unknown) does not check it."""
    cat = catalog if catalog is not None else ModelCatalog.default()
    given = _tokens(comment)

    if "model" not in given:
        raise HintError("missing hint model", field="model",
                        fix="add model=NAME; known: " + ", ".join(cat.models()))
    model = canonical_model(given["model"])
    if model not in cat.models():
        raise HintError(f"unknown model '{quote(given['model'])}'", field="model",
                        fix="known: " + ", ".join(cat.models()))

    sizes = cat.batch_sizes(model)
    choose = "choose " + ", ".join(map(str, sizes))
    batch_size: int | None = None
    if not sizes:
        if "bs" in given:
            raise HintError(f"{model} has no batch size", field="bs",
                            fix=f"remove bs={quote(given['bs'])}")
    elif "bs" not in given:
        raise HintError(f"missing hint bs for {model}", field="bs", fix=f"add bs=N; {choose}")
    else:
        text = given["bs"]
        batch_size = whole_number(text, max(sizes))
        if batch_size is None:
            raise HintError(f"bs must be a whole number, got '{quote(text)}'", field="bs",
                            fix=choose)
        if batch_size not in sizes:
            raise HintError(f"bs {quote(text)} not available for {model}", field="bs",
                            fix=choose)

    if "steps" not in given:
        raise HintError("missing hint steps", field="steps",
                        fix="add steps=N, the number of training iterations")
    text = given["steps"]
    steps = whole_number(text, MAX_STEPS) or 0
    if not 1 <= steps <= MAX_STEPS:
        raise HintError(f"steps must be a whole number of iterations from 1 to {MAX_STEPS}, "
                        f"got '{quote(text)}'", field="steps", fix="e.g. steps=40000")

    sync = _flag(given, "sync")

    weight = 1.0
    if "weight" in given:
        text = given["weight"]
        weight = float(text) if _DECIMAL.fullmatch(text) else math.nan
        if not MIN_WEIGHT <= weight <= MAX_WEIGHT:  # also refuses nan and inf
            raise HintError(f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, "
                            f"got '{quote(text)}'", field="weight", fix="e.g. weight=2")

    fork = _whole(given, "fork", 1, 1, MAX_COPIES,
                  "e.g. fork=3, the most copies the job may be forked into")

    preempt = ""
    if "preempt" in given:
        text = given["preempt"]
        if text not in PREEMPT_MODES:
            raise HintError(f"preempt must be checkpoint, requeue or never, got '{quote(text)}'",
                            field="preempt", fix="checkpoint: it saves its state on the signal "
                            "and exits 75; requeue: it may be restarted; never")
        preempt = text
        if fork > 1 and preempt != "checkpoint":
            raise HintError(f"fork={fork} needs preempt=checkpoint, got preempt={preempt}",
                            field="preempt", fix="copies are stopped with the checkpoint "
                            "signal: write preempt=checkpoint, or leave preempt out")

    share = _flag(given, "share")

    study = _study(given, steps, array)

    counts = cat.gpu_counts(model, batch_size)
    if gpus is not None and gpus not in counts:
        problem, fix = _gpu_problem(model, batch_size, counts, gpus)
        raise HintError(problem, field="gpus", fix=fix)
    return Hints(model, batch_size, steps, sync, weight, cat.job_type(model, batch_size), fork,
                 preempt, share, study)


def _study(given: Mapping[str, str], steps: int, array: bool | None) -> StudyHints | None:
    """The study hints (None without ``study``), in the order study, rule, rungs, eta, metric,
    mode, the first rung, the job array."""
    if "study" not in given:
        for key in _STUDY_KEYS:
            if key in given:
                raise HintError(f"hint '{key}' is only for a study", field=key,
                                fix=f"add study=NAME, or remove {key}={quote(given[key])}")
        return None
    name = _name(given, "study", "", "e.g. study=lr-search")
    rule = _choice(given, "rule", STUDY_RULES, "asha: asynchronous successive halving; sh: "
                   "synchronous successive halving; hyperband: brackets of sh that start at "
                   "each rung; none: every trial trains to the end")
    rungs = _whole(given, "rungs", 4, 1, MAX_RUNGS, "e.g. rungs=4, three halvings")
    eta = _whole(given, "eta", 3, MIN_ETA, MAX_ETA,
                 "e.g. eta=3: the best third of the trials go on at each rung")
    metric = _name(given, "metric", "accuracy", "e.g. metric=accuracy, what the trials report")
    mode = _choice(given, "mode", STUDY_MODES, "max: higher is better, e.g. accuracy; min: "
                   "lower is better, e.g. loss")
    need = eta ** (rungs - 1)  # at most 16 ** 9 = 2 ** 36
    if steps < need:
        raise HintError(f"the first rung would train less than one step: steps={steps} < "
                        f"eta^(rungs-1) = {eta}^{rungs - 1} = {need}", field="rungs",
                        fix="fewer rungs, a smaller eta or more steps")
    if array is False:
        raise HintError("a study is a job array", field="array",
                        fix="submit with --array=0-N, one task per trial")
    return StudyHints(name, rule, rungs, eta, metric, mode)


def _gpu_problem(
    model: str, batch_size: int | None, counts: tuple[int, ...], gpus: int,
) -> tuple[str, str]:
    label = model if batch_size is None else f"{model} bs={batch_size}"
    plural = "GPU" if counts == (1,) else "GPUs"
    asked = str(gpus) if gpus <= MAX_GPUS else f"more than {MAX_GPUS}"
    problem = f"{label} runs on {_join(counts, ' or ')} {plural}; the job asks for {asked}"
    if len(counts) == 1:
        return problem, f"use --gres=gpu:{counts[0]}"
    return problem, "use --gres=gpu:N with N one of " + ", ".join(map(str, counts))


def _lua_string(text: str) -> str:
    out = []
    for byte in text.encode():
        ch = chr(byte)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def lua_catalog_block(catalog: ModelCatalog) -> str:
    """The catalog as Lua, from the BEGIN line to the END line (both included), as it stands in
    slurm_conf/job_submit.lua: ``HADAR_MODEL_NAMES`` (sorted) and ``HADAR_MODELS[name]`` with
    ``batch_sizes`` (sorted, ``{}`` when none) and ``variants[bs]`` (``[0]`` when none) =
    ``{job_type = ..., gpus = {...}}``; ``HADAR_MAX_COPIES``, the bound of the ``fork`` hint,
    and ``HADAR_LIMITS``, the other bounds (see the module docstring)."""
    limits = {"comment_bytes": MAX_COMMENT_BYTES, "value_bytes": MAX_VALUE_BYTES,
              "quote_bytes": QUOTE_BYTES, "steps": MAX_STEPS, "weight_min": MIN_WEIGHT,
              "weight_max": MAX_WEIGHT, "gpus": MAX_GPUS, "args_bytes": MAX_ARGS_BYTES,
              "rungs": MAX_RUNGS, "eta_min": MIN_ETA, "eta_max": MAX_ETA}
    lines = [LUA_BEGIN, f"local HADAR_MAX_COPIES = {MAX_COPIES}",
             "local HADAR_LIMITS = {",
             *(f"  {k} = {v!r}," for k, v in limits.items()),
             "}"]
    names = ", ".join(_lua_string(m) for m in catalog.models())
    lines.append(f"local HADAR_MODEL_NAMES = {{{names}}}")
    lines.append("local HADAR_MODELS = {")
    for model in catalog.models():
        sizes = catalog.batch_sizes(model)
        lines.append(f"  [{_lua_string(model)}] = {{")
        lines.append(f"    batch_sizes = {{{', '.join(map(str, sizes))}}},")
        lines.append("    variants = {")
        for bs in sizes or (None,):
            gpus = ", ".join(map(str, catalog.gpu_counts(model, bs)))
            job_type = _lua_string(catalog.job_type(model, bs))
            lines.append(f"      [{bs or 0}] = {{job_type = {job_type}, gpus = {{{gpus}}}}},")
        lines.append("    },")
        lines.append("  },")
    lines.append("}")
    lines.append(LUA_END)
    return "\n".join(lines) + "\n"
