"""``hadar-slurm tune``: a study from a small search-space file, as a Slurm job array.

The file (TOML)::

    [study]
    name = "lr-search"        # the study's name (study=NAME)
    model = "resnet18"        # the hints of every trial: model, bs, steps (a trial's budget)
    bs = 64
    steps = 40000
    trials = 64               # one array task per trial
    rule = "sh"               # asha (default), sh, hyperband, none
    rungs = 4                 # default 4
    eta = 3                   # default 3
    metric = "accuracy"       # default accuracy
    mode = "max"              # default max
    gpus = 1                  # GPUs per trial, default 1
    seed = 0                  # draws the trials' configurations, default 0

    [command]
    argv = ["python3", "train.py"]   # what each trial runs (no shell)

    [space]                   # one entry per hyperparameter
    lr = { log_uniform = [1e-4, 0.1] }
    dropout = { uniform = [0.0, 0.5] }
    width = { choice = [64, 128, 256] }
    layers = { int_uniform = [2, 6] }

:func:`prepare` draws every trial's configuration (NumPy's PCG64 seeded with ``seed``: the same
trials on every machine), writes them to ``trials.json`` and renders ``study.sbatch``
(``hadar_slurm/slurm/templates/study.sbatch.j2``), which runs
``python3 -m hadar_slurm.studies.trial trials.json -- ARGV...`` in each task: that launcher
puts task ``i``'s configuration in the environment (``HADAR_TRIAL_CONFIG``, JSON) and runs the
command.  The study's hints go to ``sbatch --comment`` on the command line
(:func:`sbatch_argv`; job_submit.lua checks them at submit, as for any job).  Every bad value is
an :class:`~hadar_slurm.errors.InputError` naming the file, the key and the fix.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hadar_slurm.errors import InputError
from hadar_slurm.hints import HintError, parse_hints
from hadar_slurm.slurm.hetjob import check_shell_text, template_environment

__all__ = ["TEMPLATE", "TuneSpec", "draw_trials", "load_tune", "prepare", "sbatch_argv"]

TEMPLATE = "study.sbatch.j2"
DISTRIBUTIONS = ("uniform", "log_uniform", "int_uniform", "choice")
MAX_TRIALS = 10_000
_STUDY_KEYS = {"name", "model", "bs", "steps", "trials", "rule", "rungs", "eta", "metric",
               "mode", "gpus", "seed"}


@dataclass(frozen=True)
class TuneSpec:
    """A study to submit (see the module docstring)."""

    name: str
    model: str
    bs: int | None
    steps: int
    trials: int
    argv: tuple[str, ...]
    space: Mapping[str, tuple[str, tuple[Any, ...]]]  # name -> (distribution, arguments)
    rule: str = "asha"
    rungs: int = 4
    eta: int = 3
    metric: str = "accuracy"
    mode: str = "max"
    gpus: int = 1
    seed: int = 0

    def comment(self) -> str:
        """The study's ``hadar:`` comment (every trial's hints)."""
        bs = f" bs={self.bs}" if self.bs is not None else ""
        return (f"hadar: model={self.model}{bs} steps={self.steps} study={self.name} "
                f"rule={self.rule} rungs={self.rungs} eta={self.eta} metric={self.metric} "
                f"mode={self.mode}")


def _bad(source: str, key: str, problem: str, fix: str) -> InputError:
    return InputError(problem, source=source, field=key, fix=fix)


def _int(table: Mapping[str, Any], key: str, source: str, default: int | None, least: int,
         most: int) -> int:
    value = table.get(key, default)
    if value is None:
        raise _bad(source, f"study.{key}", "missing", f"add {key} = N to [study]")
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise _bad(source, f"study.{key}", f"must be a whole number from {least} to {most}, "
                   f"got {value!r}", f"e.g. {key} = {max(least, min(most, 4))}")
    return value


def _str(table: Mapping[str, Any], key: str, source: str, default: str | None) -> str:
    value = table.get(key, default)
    if value is None:
        raise _bad(source, f"study.{key}", "missing", f'add {key} = "..." to [study]')
    if not isinstance(value, str):
        raise _bad(source, f"study.{key}", f"must be a string, got {value!r}",
                   f'write {key} = "..."')
    return value


def _space(raw: object, source: str) -> dict[str, tuple[str, tuple[Any, ...]]]:
    if not isinstance(raw, Mapping) or not raw:
        raise _bad(source, "space", "missing or empty",
                   "add a [space] table, e.g. lr = { log_uniform = [1e-4, 0.1] }")
    out: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for name, dist in raw.items():
        key = f"space.{name}"
        if not name.isidentifier():
            raise _bad(source, key, f"bad hyperparameter name {name!r}",
                       "letters, digits and '_', not starting with a digit")
        if not isinstance(dist, Mapping) or len(dist) != 1:
            raise _bad(source, key, "must be one distribution",
                       f"e.g. {name} = {{ uniform = [0.0, 1.0] }}; one of "
                       + ", ".join(DISTRIBUTIONS))
        (kind, args), = dist.items()
        if kind not in DISTRIBUTIONS:
            raise _bad(source, key, f"unknown distribution {kind!r}",
                       "one of " + ", ".join(DISTRIBUTIONS))
        if not isinstance(args, list) or not args:
            raise _bad(source, key, f"{kind} needs a list", f"e.g. {kind} = [LOW, HIGH]")
        if kind == "choice":
            if not all(isinstance(a, str | int | float | bool) for a in args):
                raise _bad(source, key, "choices must be strings, numbers or booleans",
                           'e.g. choice = [64, 128] or choice = ["adam", "sgd"]')
        else:
            nums = len(args) == 2 and all(
                isinstance(a, int | float) and not isinstance(a, bool) and math.isfinite(a)
                for a in args)
            if not nums or not args[0] < args[1]:
                raise _bad(source, key, f"{kind} needs [LOW, HIGH] with LOW < HIGH, got {args}",
                           f"e.g. {kind} = [1, 10]")
            if kind == "log_uniform" and args[0] <= 0:
                raise _bad(source, key, f"log_uniform needs LOW > 0, got {args[0]}",
                           "e.g. log_uniform = [1e-4, 0.1]")
            if kind == "int_uniform" and not all(isinstance(a, int) for a in args):
                raise _bad(source, key, f"int_uniform needs whole numbers, got {args}",
                           "e.g. int_uniform = [2, 6]")
        out[name] = (kind, tuple(args))
    return out


def load_tune(path: str | Path) -> TuneSpec:
    """Read and check a search-space file (see the module docstring)."""
    source = str(path)
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", source=source,
                         fix="give the path of a search-space file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", source=source,
                         fix="see the example in docs/studies.md") from exc
    for section in doc:
        if section not in ("study", "command", "space"):
            raise _bad(source, section, f"unknown section [{section}]",
                       "the sections are [study], [command] and [space]")
    study = doc.get("study")
    if not isinstance(study, Mapping):
        raise _bad(source, "study", "missing", "add a [study] table (docs/studies.md)")
    for key in study:
        if key not in _STUDY_KEYS:
            raise _bad(source, f"study.{key}", "unknown key",
                       "the keys of [study]: " + ", ".join(sorted(_STUDY_KEYS)))
    command = doc.get("command")
    argv = command.get("argv") if isinstance(command, Mapping) else None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise _bad(source, "command.argv", "missing or not a list of strings",
                   'add [command] argv = ["python3", "train.py"] (no shell: one string per '
                   "argument)")
    for k, arg in enumerate(argv):
        check_shell_text(arg, f"command.argv[{k}]")
    bs = study.get("bs")
    if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int)):
        raise _bad(source, "study.bs", f"must be a whole number, got {bs!r}", "e.g. bs = 64")
    spec = TuneSpec(
        name=_str(study, "name", source, None), model=_str(study, "model", source, None),
        bs=bs, steps=_int(study, "steps", source, None, 1, 10**12),
        trials=_int(study, "trials", source, None, 1, MAX_TRIALS), argv=tuple(argv),
        space=_space(doc.get("space"), source), rule=_str(study, "rule", source, "asha"),
        rungs=_int(study, "rungs", source, 4, 1, 10), eta=_int(study, "eta", source, 3, 2, 16),
        metric=_str(study, "metric", source, "accuracy"),
        mode=_str(study, "mode", source, "max"), gpus=_int(study, "gpus", source, 1, 1, 64),
        seed=_int(study, "seed", source, 0, 0, 2**32 - 1))
    try:  # (the hints exactly as job_submit.lua will check them)
        parse_hints(spec.comment(), gpus=spec.gpus, array=True)
    except HintError as exc:
        raise InputError(exc.problem, source=source, field=f"study.{exc.field}",
                         fix=exc.fix) from None
    return spec


def draw_trials(space: Mapping[str, tuple[str, tuple[Any, ...]]], trials: int,
                seed: int) -> list[dict[str, Any]]:
    """Each trial's configuration: one draw per hyperparameter, in the order of ``space``."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for _ in range(trials):
        config: dict[str, Any] = {}
        for name, (kind, args) in space.items():
            if kind == "uniform":
                config[name] = float(rng.uniform(args[0], args[1]))
            elif kind == "log_uniform":
                config[name] = float(math.exp(rng.uniform(math.log(args[0]),
                                                          math.log(args[1]))))
            elif kind == "int_uniform":
                config[name] = int(rng.integers(args[0], args[1], endpoint=True))
            else:
                config[name] = args[int(rng.integers(0, len(args)))]
        out.append(config)
    return out


def prepare(spec: TuneSpec, out_dir: str | Path, python: str = "python3") -> Path:
    """Write ``trials.json`` and ``study.sbatch`` into ``out_dir`` (made if missing; an
    absolute path, as the nodes read it); the script's path."""
    out = Path(out_dir).resolve()
    check_shell_text(str(out), "out_dir")
    out.mkdir(parents=True, exist_ok=True)
    trials = draw_trials(spec.space, spec.trials, spec.seed)
    doc = {"study": spec.name, "metric": spec.metric, "mode": spec.mode, "seed": spec.seed,
           "steps": spec.steps, "rungs": spec.rungs, "eta": spec.eta, "rule": spec.rule,
           "trials": trials}
    (out / "trials.json").write_text(json.dumps(doc, indent=2) + "\n")
    script = out / "study.sbatch"
    script.write_text(template_environment().get_template(TEMPLATE).render(
        spec=spec, trials_path=str(out / "trials.json"), workdir=str(out), python=python))
    return script


def sbatch_argv(spec: TuneSpec, script: str | Path, extra: Sequence[str] = ()) -> list[str]:
    """``sbatch --parsable --comment=HINTS [extra...] SCRIPT``: an argv, no shell."""
    return ["sbatch", "--parsable", f"--comment={spec.comment()}", *extra, str(script)]
