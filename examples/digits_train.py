"""Train a small MLP on scikit-learn's digits with the HadarE runtime (hadar_slurm.runtime).

The same command runs unforked (a plain job) or as one of the k copies of a HadarE job: the
copies find their index, k and the shared tracker dir in the environment the heterogeneous job
sets (see examples/README.md).  The data set ships inside scikit-learn: nothing is downloaded.

    python examples/digits_train.py --steps 3000 --output model.pt --result result.json

Copy 0 writes the consolidated model (``--output``, a state dict) and the result JSON
(``--result``: test accuracy, iterations done, wall time); every copy prints its test accuracy.
Exit status: 0 done (or stopped by --time-limit-s, or the work was already done), 75 preempted
(checkpoint saved, requeue it), 76 a copy was lost at a round barrier, 2 bad arguments or
environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional

from hadar_slurm.errors import InputError
from hadar_slurm.runtime import JobRuntime, RuntimeConfig, pick_device

TEST_FRACTION = 0.25


def load_split(split_seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits (1797 8x8 images, pixels scaled to [0, 1]) split 75/25 by ``split_seed``."""
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.tensor(np.random.RandomState(split_seed).permutation(len(y)))
    n_test = round(TEST_FRACTION * len(y))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def build_model(seed: int, hidden: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(x).argmax(dim=1)
    model.train()
    return float((pred == y).float().mean())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, required=True, help="the job's work W (iterations)")
    p.add_argument("--output", type=Path, help="where copy 0 writes the consolidated model")
    p.add_argument("--result", type=Path, help="where copy 0 writes the result JSON")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="model init and batch order")
    p.add_argument("--split-seed", type=int, default=0, help="the fixed train/test split")
    rounds = p.add_mutually_exclusive_group()
    rounds.add_argument("--round-iters", type=int,
                        help="iterations per consolidation round, all copies together")
    rounds.add_argument("--round-seconds", type=float,
                        help="seconds per consolidation round (default 2)")
    p.add_argument("--time-limit-s", type=float,
                   help="stop after this much training time even if work remains (checkpoint "
                        "saved); exit 0")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    p.add_argument("--lr-scaling", choices=("linear", "none"), default="linear",
                   help="copies of a forked job train with lr x copies (the linear scaling "
                        "rule of data-parallel training: averaging k copies' models moves "
                        "the model about as far as one copy's steps; default: %(default)s)")
    args = p.parse_args(argv)
    if args.round_iters is None and args.round_seconds is None:
        args.round_seconds = 2.0
    if args.steps < 1 or args.batch_size < 1 or args.threads < 1:
        p.error("--steps, --batch-size and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    try:
        config = RuntimeConfig.from_env(
            args.steps, round_iters=args.round_iters, round_seconds=args.round_seconds,
            time_limit_s=args.time_limit_s)
    except InputError as exc:
        print(f"digits_train: error: {exc}", file=sys.stderr)
        return 2
    device = pick_device(config)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    x_train, y_train, x_test, y_test = (t.to(device) for t in load_split(args.split_seed))
    model = build_model(args.seed, args.hidden)
    lr = args.lr * (config.copies if args.lr_scaling == "linear" else 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)

    try:
        rt = JobRuntime(model, optimizer, config, output=args.output)
    except InputError as exc:  # e.g. the tracker dir holds a job with another --steps
        print(f"digits_train: error: {exc}", file=sys.stderr)
        return 2
    with rt:
        batches = torch.Generator(device="cpu")
        seeded_round = -1
        for _ in rt.steps():
            if rt.round != seeded_round:  # a different batch order per round and per copy
                seeded_round = rt.round
                batches.manual_seed(args.seed * 1_000_003 + rt.round * 1009 + rt.copy_index)
            idx = torch.randint(0, len(y_train), (args.batch_size,), generator=batches)
            idx = idx.to(device)
            loss = functional.cross_entropy(model(x_train[idx]), y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        summary = rt.finish()

    acc = accuracy(model, x_test, y_test)
    print(f"digits_train: copy {config.index}/{config.copies}: test accuracy {acc:.4f} after "
          f"{summary.done}/{summary.work} iterations ({summary.rounds} rounds, this copy ran "
          f"{summary.executed}, {summary.seconds:.2f} s training"
          f"{', stopped: ' + summary.stopped if summary.stopped else ''})", flush=True)
    if args.result is not None and config.coordinator:
        result = {
            "accuracy": acc, "iterations": summary.done, "work": summary.work,
            "complete": summary.complete, "rounds": summary.rounds, "copies": config.copies,
            "executed": summary.executed, "train_seconds": summary.seconds,
            "wall_seconds": time.monotonic() - t_start, "stopped": summary.stopped,
        }
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
