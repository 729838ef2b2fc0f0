"""A small hyperparameter-tuning study (issue #17), run for real on the CPU: trials of an MLP on
scikit-learn's digits, stopped early by successive halving.

    python examples/digits_study.py --rule sh --trials 16 --rungs 3 --eta 2 --max-steps 3000 \\
        --json study.json

The search space is the learning rate (log-uniform in [1e-3, 0.3]) and the hidden width
(log-uniform integer in [16, 256]) of examples/digits_train.py's MLP (SGD, momentum 0.9, batch
32); trial ``i``'s configuration (lr, width and its own training seed: model init and batch
order) is the ``i``-th draw of a generator seeded by ``--seed``.  Each trial trains to each
rung's step count (:attr:`~hadar_slurm.studies.spec.StudySpec.rung_steps`, rounded) and reports
its validation accuracy there; :func:`hadar_slurm.studies.halving.verdicts` (the same rules as
the simulator and the sidecar) says whether it goes on, stops or (``sh``) waits for its cohort.
The validation split is 20% of digits_train.py's training split; the test split is
digits_train.py's own (``--split-seed``), used only to report the best configuration.

Order (one worker, deterministic; it mimics a job array whose trials all run at the same
speed): a FIFO queue of (trial, rung) segments, first every trial's rung 0 in submission order,
and a trial that is promoted joins the end of the queue for its next rung.  So trials reach each
rung round-robin in submission order: ASHA promotes a trial once it ranks among the best
1/eta of the reports its rung has had so far, SH promotes a cohort once all of it has reported.

A trial's state crosses rungs only through its checkpoint (``--workdir``/trial-NNN/rung-K.pt:
model, optimizer, batch-order generator and torch RNG state, steps done): a promoted trial is
rebuilt from that file, so a trial trained rung by rung is bit for bit the trial trained
straight to the end.  After the study the best configuration is retrained alone, from scratch to
``--max-steps`` with its seed, and both accuracies are printed with a line saying whether they
match (they should: same weights exactly).

Exit status: 0 done and the accuracies match, 1 they do not, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from digits_train import accuracy, build_model, load_split  # type: ignore[import-not-found]
from torch import nn
from torch.nn import functional

from hadar_slurm.errors import InputError
from hadar_slurm.studies.halving import Verdict, best_trial, verdicts
from hadar_slurm.studies.spec import Rule, StudySpec

PROG = "digits_study"
VAL_FRACTION = 0.2  # of digits_train.py's training split
LR_RANGE = (1e-3, 0.3)
HIDDEN_RANGE = (16, 256)
MOMENTUM = 0.9
BATCH_SIZE = 32
CHECKPOINT_FORMAT = 1
# StudySpec's field -> the option that sets it (errors name the option)
_OPTIONS = {"trials": "--trials", "max_steps": "--max-steps", "rungs": "--rungs",
            "eta": "--eta", "rule": "--rule"}


# -- data, configurations, one trial's training -------------------------------------------------

@dataclass(frozen=True)
class Data:
    """digits_train.py's split (``split_seed``) with 20% of its training part held out for
    validation: the study ranks trials on ``val``; ``test`` only reports the best one."""

    x_fit: torch.Tensor
    y_fit: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @staticmethod
    def load(split_seed: int = 0) -> Data:
        x_train, y_train, x_test, y_test = load_split(split_seed)  # train rows in random order
        n_val = round(VAL_FRACTION * len(y_train))
        return Data(x_train[n_val:], y_train[n_val:], x_train[:n_val], y_train[:n_val],
                    x_test, y_test)


@dataclass(frozen=True)
class TrialConfig:
    lr: float
    hidden: int
    seed: int  # model init and batch order


def draw_configs(n: int, seed: int) -> list[TrialConfig]:
    """``n`` configurations from the search space; the first ``m`` are the same for any
    ``n >= m``."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        lr = math.exp(rng.uniform(math.log(LR_RANGE[0]), math.log(LR_RANGE[1])))
        hidden = round(math.exp(rng.uniform(math.log(HIDDEN_RANGE[0]),
                                            math.log(HIDDEN_RANGE[1]))))
        out.append(TrialConfig(lr=float(lr), hidden=int(hidden),
                               seed=int(rng.randint(0, 2**31 - 1))))
    return out


@dataclass
class TrialState:
    """A trial in memory: its model, optimizer, batch-order generator and the steps done."""

    config: TrialConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batches: torch.Generator
    steps: int = 0

    @staticmethod
    def fresh(config: TrialConfig) -> TrialState:
        model: nn.Module = build_model(config.seed, config.hidden)  # seeds torch, then inits
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=MOMENTUM)
        batches = torch.Generator(device="cpu")
        batches.manual_seed(config.seed)
        return TrialState(config, model, optimizer, batches)

    def train_to(self, steps: int, data: Data) -> None:
        """Train on until ``steps`` steps are done in all."""
        if steps < self.steps:
            raise ValueError(f"trial at {self.steps} steps cannot train back to {steps}")
        n = len(data.y_fit)
        for _ in range(steps - self.steps):
            idx = torch.randint(0, n, (BATCH_SIZE,), generator=self.batches)
            loss = functional.cross_entropy(self.model(data.x_fit[idx]), data.y_fit[idx])
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.steps = steps

    def save(self, path: Path) -> None:
        """The checkpoint: everything a resumed trial needs to go on exactly (written to a
        temporary file, then renamed)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"format": CHECKPOINT_FORMAT, "config": asdict(self.config),
                    "steps": self.steps, "model": self.model.state_dict(),
                    "optim": self.optimizer.state_dict(), "batches": self.batches.get_state(),
                    "torch_rng": torch.get_rng_state()}, tmp)
        os.replace(tmp, path)

    @staticmethod
    def load(config: TrialConfig, path: Path) -> TrialState:
        """The trial as :meth:`save` left it (a new model, optimizer and generator)."""
        ckpt = torch.load(path, weights_only=True)
        if ckpt.get("format") != CHECKPOINT_FORMAT or ckpt.get("config") != asdict(config):
            raise ValueError(f"{path}: a checkpoint of another trial or format")
        state = TrialState.fresh(config)
        state.model.load_state_dict(ckpt["model"])
        state.optimizer.load_state_dict(ckpt["optim"])
        state.batches.set_state(ckpt["batches"])
        torch.set_rng_state(ckpt["torch_rng"])
        state.steps = int(ckpt["steps"])
        return state


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# -- the study ----------------------------------------------------------------------------------

def rung_step_counts(spec: StudySpec) -> tuple[int, ...]:
    """The spec's rung steps as whole steps (strictly increasing: eta >= 2, the first >= 1)."""
    return tuple(round(s) for s in spec.rung_steps)


def checkpoint_path(workdir: Path, trial: int, rung: int) -> Path:
    return workdir / f"trial-{trial:03d}" / f"rung-{rung}.pt"


@dataclass
class TrialRecord:
    trial: int
    config: TrialConfig
    reports: dict[int, float] = field(default_factory=dict)  # rung -> validation accuracy
    verdicts: dict[int, str] = field(default_factory=dict)  # rung -> go / stop / done
    steps: int = 0  # steps trained in all (its segments are contiguous: the steps it reached)
    seconds: float = 0.0  # training, checkpoints and evaluation

    @property
    def status(self) -> str:
        last = self.verdicts.get(max(self.verdicts)) if self.verdicts else None
        return {"done": "finished", "stop": "stopped"}.get(last or "", "running")

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "config": asdict(self.config), "status": self.status,
                "steps": self.steps, "seconds": round(self.seconds, 3),
                "reports": {str(k): v for k, v in self.reports.items()},
                "verdicts": {str(k): v for k, v in self.verdicts.items()}}


@dataclass
class StudyOutcome:
    spec: StudySpec
    steps: tuple[int, ...]  # per rung
    records: list[TrialRecord]
    events: list[dict[str, Any]]  # reports in the order they came, with their first verdict
    reports: list[dict[int, float]]  # as halving.verdicts reads them
    best: int | None

    def rung_counts(self) -> list[int]:
        """How many trials reported at each rung."""
        return [len(r) for r in self.reports]


def run_study(spec: StudySpec, configs: list[TrialConfig], data: Data, workdir: Path,
              say: Callable[[str], None] = print) -> StudyOutcome:
    """Run the study one segment at a time (see the module docstring for the order)."""
    if len(configs) != spec.trials:
        raise ValueError(f"{len(configs)} configurations for a study of {spec.trials} trials")
    steps = rung_step_counts(spec)
    trials = list(range(spec.trials))
    records = [TrialRecord(t, c) for t, c in enumerate(configs)]
    reports: list[dict[int, float]] = [{} for _ in range(spec.rungs)]
    events: list[dict[str, Any]] = []
    queue: deque[tuple[int, int]] = deque((t, 0) for t in trials)
    waiting: dict[int, int] = {}  # trial -> rung (sh: waits for its cohort)

    def settle(trial: int, rung: int, verdict: Verdict) -> None:
        records[trial].verdicts[rung] = verdict.value
        if verdict is Verdict.GO:
            queue.append((trial, rung + 1))

    while queue:
        trial, rung = queue.popleft()
        rec, t0 = records[trial], time.monotonic()
        if rung == 0:
            state = TrialState.fresh(rec.config)
        else:  # promoted: rebuilt from its checkpoint alone
            state = TrialState.load(rec.config, checkpoint_path(workdir, trial, rung - 1))
            if state.steps != steps[rung - 1]:
                raise RuntimeError(f"trial {trial}: checkpoint at {state.steps} steps, "
                                   f"expected {steps[rung - 1]}")
        state.train_to(steps[rung], data)
        state.save(checkpoint_path(workdir, trial, rung))
        acc = accuracy(state.model, data.x_val, data.y_val)
        rec.steps = state.steps
        rec.reports[rung] = reports[rung][trial] = acc
        rec.seconds += time.monotonic() - t0

        pending = {**waiting, trial: rung}
        stopped = [t for t, r in enumerate(records) if Verdict.STOP.value in r.verdicts.values()]
        got = verdicts(spec, trials, reports, pending, stopped)
        events.append({"trial": trial, "rung": rung, "steps": steps[rung], "val_accuracy": acc,
                       "verdict": got[trial].value})
        say(f"{PROG}: trial {trial:3d} rung {rung} at {steps[rung]:5d} steps: val "
            f"{acc:.4f} (lr {rec.config.lr:.4g}, hidden {rec.config.hidden:3d}) -> "
            f"{got[trial].value}")
        cohort: dict[str, list[int]] = {}  # sh: the waiting trials this report released
        for t, verdict in got.items():
            if verdict is Verdict.WAIT:
                waiting[t] = pending[t]
                continue
            if waiting.pop(t, None) is not None or (t == trial and len(got) > 1):
                cohort.setdefault(verdict.value, []).append(t)
            settle(t, pending[t], verdict)
        if cohort:
            say(f"{PROG}: rung {rung} cohort complete: "
                + "; ".join(f"{v} {', '.join(map(str, sorted(ts)))}"
                            for v, ts in sorted(cohort.items())))
    if waiting:  # cannot happen: the last report of a rung settles it (sh and asha alike)
        raise RuntimeError(f"trials still waiting after the study: {sorted(waiting)}")
    return StudyOutcome(spec, steps, records, events, reports, best_trial(spec, reports))


# -- the command ---------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2 (main prints it)
        raise InputError(message)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, StudySpec]:
    p = _Parser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rule", default="sh", help="asha, sh or none (default: %(default)s)")
    p.add_argument("--trials", type=int, default=16, help="default: %(default)s")
    p.add_argument("--rungs", type=int, default=3, help="default: %(default)s")
    p.add_argument("--eta", type=float, default=2.0,
                   help="reduction factor, >= 2 (default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=3000,
                   help="steps of a trial that trains to the end (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="draws the trials' configurations")
    p.add_argument("--split-seed", type=int, default=0,
                   help="digits_train.py's train/test split (default: %(default)s)")
    p.add_argument("--workdir", type=Path,
                   help="where the trials' checkpoints go (default: a temporary directory, "
                        "removed at the end)")
    p.add_argument("--json", type=Path, help="write the study's results here")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    args = p.parse_args(argv)
    if args.threads < 1:
        raise InputError(f"must be >= 1, got {args.threads}", field="--threads")
    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        raise InputError(f"{args.workdir} exists and is not a directory", field="--workdir")
    if args.json is not None and args.json.is_dir():
        raise InputError(f"{args.json} is a directory", field="--json",
                         fix="the path of the JSON file to write")
    try:
        rule = Rule.parse(args.rule)
        spec = StudySpec("digits", "digits-mlp", args.trials, float(args.max_steps),
                         rungs=args.rungs, eta=args.eta, rule=rule)
    except InputError as exc:  # name the option, not the spec's field
        raise InputError(exc.problem, field=_OPTIONS.get(exc.field or "", exc.field),
                         fix=exc.fix) from None
    return args, spec


def error_line(exc: InputError) -> str:
    where = f"{exc.field}: " if exc.field else ""
    fix = f" ({exc.fix})" if exc.fix else ""
    return f"{PROG}: error: {where}{exc.problem}{fix}"


def main(argv: list[str] | None = None) -> int:
    try:
        args, spec = parse_args(argv)
    except InputError as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    t_start = time.monotonic()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    data = Data.load(args.split_seed)
    configs = draw_configs(spec.trials, args.seed)
    say: Callable[[str], None] = (lambda _line: None) if args.quiet else print

    with tempfile.TemporaryDirectory(prefix="digits-study-") as tmp:
        workdir = args.workdir if args.workdir is not None else Path(tmp)
        steps = rung_step_counts(spec)
        say(f"{PROG}: {spec.trials} trials, rule {spec.rule.value}, eta {spec.eta:g}, rungs at "
            f"{', '.join(map(str, steps))} steps, seed {args.seed}, checkpoints in {workdir}")
        out = run_study(spec, configs, data, workdir, say=say)
        study_seconds = time.monotonic() - t_start
        if out.best is None:  # cannot happen: some trial always reaches the last rung
            raise RuntimeError("no trial finished")
        best = TrialState.load(configs[out.best],
                               checkpoint_path(workdir, out.best, spec.rungs - 1))
    study_val = accuracy(best.model, data.x_val, data.y_val)
    study_test = accuracy(best.model, data.x_test, data.y_test)

    t_alone = time.monotonic()
    alone = TrialState.fresh(configs[out.best])
    alone.train_to(steps[-1], data)  # straight through: no checkpoint
    alone_seconds = time.monotonic() - t_alone
    alone_val = accuracy(alone.model, data.x_val, data.y_val)
    alone_test = accuracy(alone.model, data.x_test, data.y_test)
    identical = same_weights(best.model, alone.model)
    match = identical and (study_val, study_test) == (alone_val, alone_test)
    wall = time.monotonic() - t_start

    cfg = configs[out.best]
    trained = sum(r.steps for r in out.records)
    print(f"{PROG}: rule {spec.rule.value}: trials per rung "
          f"{' -> '.join(map(str, out.rung_counts()))}; {trained} steps trained in all "
          f"({trained / (spec.trials * steps[-1]):.0%} of training every trial to the end)")
    print(f"{PROG}: best trial {out.best} (lr {cfg.lr:.4g}, hidden {cfg.hidden}, seed "
          f"{cfg.seed}): study: val {study_val:.4f}, test {study_test:.4f}")
    print(f"{PROG}: best configuration retrained alone from scratch to {steps[-1]} steps: "
          f"val {alone_val:.4f}, test {alone_test:.4f} ({alone_seconds:.1f} s)")
    if match:
        print(f"{PROG}: MATCH: the study's best configuration reaches the accuracy it reaches "
              "trained alone (identical weights)")
    else:
        print(f"{PROG}: MISMATCH: the study's best configuration and the same configuration "
              f"trained alone differ (weights {'identical' if identical else 'differ'})")
    print(f"{PROG}: study {study_seconds:.1f} s, wall time {wall:.1f} s")

    if args.json is not None:
        result = {
            "study": {"rule": spec.rule.value, "trials": spec.trials, "rungs": spec.rungs,
                      "eta": spec.eta, "max_steps": steps[-1], "rung_steps": list(steps),
                      "seed": args.seed, "split_seed": args.split_seed,
                      "val_fraction": VAL_FRACTION, "search_space": {
                          "lr": {"log_uniform": list(LR_RANGE)},
                          "hidden": {"log_uniform_int": list(HIDDEN_RANGE)}},
                      "momentum": MOMENTUM, "batch_size": BATCH_SIZE,
                      "order": "fifo: rung 0 in submission order, promoted trials queue up"},
            "trials": [r.to_json() for r in out.records],
            "events": out.events,
            "rung_counts": out.rung_counts(),
            "steps_trained": trained,
            "best": {"trial": out.best, "config": asdict(cfg), "val_accuracy": study_val,
                     "test_accuracy": study_test},
            "retrained": {"val_accuracy": alone_val, "test_accuracy": alone_test,
                          "identical_weights": identical, "seconds": alone_seconds},
            "match": match,
            "study_seconds": study_seconds,
            "wall_seconds": wall,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
