"""One trial of a live tuning study (issue #17): the MLP of digits_train.py on scikit-learn's
digits, trained through the project's runtime, reporting its validation accuracy at each rung
and doing what the sidecar's halving rule says.

A task of the study's job array (``hadar-slurm tune examples/digits_study.toml``) runs::

    python examples/digits_trial.py --result result.json

Its configuration comes from ``HADAR_TRIAL_CONFIG`` (``{"lr": 0.05, "hidden": 64, "seed": 7}``,
set by the tune launcher, :mod:`hadar_slurm.studies.trial`), the study's budget and rungs from
``HADAR_STUDY_STEPS``, ``HADAR_STUDY_RUNGS`` and ``HADAR_STUDY_ETA``
(:class:`~hadar_slurm.studies.reporter.StudyTrial`).  At each rung the runtime commits a
checkpoint (model and optimizer, momentum buffers included), the trial reports its validation
accuracy and waits for the verdict: it trains on, stops (exit 0), or, under synchronous
halving, is requeued by the sidecar and resumes from the rung's checkpoint when promoted.

The batch of step ``s`` is drawn by a generator seeded with the trial's seed and ``s`` alone,
so a trial trained rung by rung, stopped, requeued and resumed is bit for bit the trial
trained straight through: ``--alone`` does the latter (no study, no reports), which is how a
study's best configuration is checked against the same configuration trained alone.

``--result`` (default ``result.json`` in the trial's tracker dir; copy 0 writes it at the
end): the configuration, the steps done, the validation and test accuracy, whether the trial
was stopped early and at which rung.  The
splits are digits_study.py's: 20% of digits_train.py's training split for validation (what the
study ranks on), its test split only to report.  Exit status: 0 done or stopped by the study,
75 preempted (checkpoint saved: requeue it), 2 bad arguments or environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from digits_study import Data  # type: ignore[import-not-found]
from digits_train import accuracy, build_model  # type: ignore[import-not-found]
from torch.nn import functional

from hadar_slurm.errors import InputError
from hadar_slurm.runtime import JobRuntime, RuntimeConfig
from hadar_slurm.studies.halving import Verdict
from hadar_slurm.studies.reporter import StudyTrial

PROG = "digits_trial"
MOMENTUM = 0.9
BATCH_SIZE = 32


def trial_config(text: str | None) -> tuple[float, int, int]:
    """``(lr, hidden, seed)`` from ``HADAR_TRIAL_CONFIG``."""
    if not text:
        raise InputError("no configuration", source="environment", field="HADAR_TRIAL_CONFIG",
                         fix='run it as a task of hadar-slurm tune, or set it: {"lr": 0.05, '
                             '"hidden": 64, "seed": 0}')
    try:
        doc: Any = json.loads(text)
    except ValueError as exc:
        raise InputError(f"not JSON: {exc}", source="environment",
                         field="HADAR_TRIAL_CONFIG") from None
    try:
        lr, hidden, seed = float(doc["lr"]), int(doc["hidden"]), int(doc.get("seed", 0))
    except (KeyError, TypeError, ValueError):
        raise InputError(f"expected lr, hidden and seed, got {text!r}", source="environment",
                         field="HADAR_TRIAL_CONFIG") from None
    if not (lr > 0 and hidden >= 1):
        raise InputError(f"lr must be > 0 and hidden >= 1, got {text!r}", source="environment",
                         field="HADAR_TRIAL_CONFIG")
    return lr, hidden, seed


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Data,
               seed: int, step: int) -> None:
    """One SGD step on the batch of ``step`` (a function of the seed and the step alone)."""
    batches = torch.Generator(device="cpu")
    batches.manual_seed(seed * 1_000_003 + step)
    idx = torch.randint(0, len(data.y_fit), (BATCH_SIZE,), generator=batches)
    loss = functional.cross_entropy(model(data.x_fit[idx]), data.y_fit[idx])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--result", type=Path,
                   help="where the result JSON goes (default: result.json in the tracker dir)")
    p.add_argument("--alone", action="store_true",
                   help="train straight to the budget, no study (the retraining check)")
    p.add_argument("--steps", type=int, help="the budget (default: HADAR_STUDY_STEPS)")
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--round-seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    try:
        lr, hidden, seed = trial_config(os.environ.get("HADAR_TRIAL_CONFIG"))
        budget = os.environ.get("HADAR_STUDY_STEPS", "").strip()
        steps = args.steps or (int(budget) if budget.isdigit() else 0)
        if steps < 1:
            raise InputError(f"the budget is {budget!r}", source="environment",
                             field="HADAR_STUDY_STEPS", fix="pass --steps, or run it as a "
                             "task of hadar-slurm tune")
        config = RuntimeConfig.from_env(steps, round_seconds=args.round_seconds)
        trial = None if args.alone else StudyTrial.from_env(config.tracker_dir, steps=steps)
    except InputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    data = Data.load(args.split_seed)
    model = build_model(seed, hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    stopped_at: int | None = None
    with JobRuntime(model, optimizer, config) as rt:
        if args.alone or trial is None:
            for step in rt.steps():
                train_step(model, optimizer, data, seed, step)
        else:
            for rung, target in trial.rungs_ahead(rt.done):
                for step in rt.steps(until=target):
                    train_step(model, optimizer, data, seed, step)
                verdict = trial.report(rung, accuracy(model, data.x_val, data.y_val),
                                       steps=rt.done, interrupted=rt.stop_requested)
                if verdict is Verdict.STOP:
                    stopped_at = rung
                    break
        summary = rt.finish()
    result = {"lr": lr, "hidden": hidden, "seed": seed, "steps": summary.done,
              "budget": steps, "complete": summary.complete, "stopped_at_rung": stopped_at,
              "val_accuracy": accuracy(model, data.x_val, data.y_val),
              "test_accuracy": accuracy(model, data.x_test, data.y_test)}
    print(f"{PROG}: lr {lr:.4g}, hidden {hidden}, seed {seed}: {summary.done}/{steps} steps, "
          f"val {result['val_accuracy']:.4f}, test {result['test_accuracy']:.4f}"
          + (f" (stopped at rung {stopped_at})" if stopped_at is not None else ""), flush=True)
    if config.coordinator:
        out = args.result or config.tracker_dir / "result.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
