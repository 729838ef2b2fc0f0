"""A tiny training script on hadar_slurm.runtime for the tests (torch only, starts fast).

Each iteration is one plain gradient step on a 4-input linear model plus ``--sleep-ms`` of
sleep (so that rounds take a known time), and appends one byte to ``--count`` (an O_APPEND
write, done before the next iteration starts), so the file's size is exactly the iterations this
process ran, even after a SIGKILL.  No torch.optim optimizer: creating the first one imports
torch._dynamo (seconds); the runtime takes ``optimizer=None``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from hadar_slurm.runtime import JobRuntime, RuntimeConfig


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--round-iters", type=int)
    p.add_argument("--round-seconds", type=float)
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--slow-from", type=int, help="from this iteration (of this process) on, "
                   "sleep --slow-sleep-ms instead (a copy slower than its probe measured)")
    p.add_argument("--slow-sleep-ms", type=float, default=0.0)
    p.add_argument("--count", type=Path, required=True)
    p.add_argument("--output", type=Path)
    p.add_argument("--time-limit-s", type=float)
    args = p.parse_args()
    torch.set_num_threads(1)
    config = RuntimeConfig.from_env(args.steps, round_iters=args.round_iters,
                                    round_seconds=args.round_seconds,
                                    time_limit_s=args.time_limit_s)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    target = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    fd = os.open(args.count, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with JobRuntime(model, None, config, output=args.output) as rt:
        gen = torch.Generator().manual_seed(1000 * rt.copy_index + 1)
        ran = 0
        for _ in rt.steps():
            x = torch.randn(8, 4, generator=gen)
            loss = ((model(x) - x @ target) ** 2).mean()
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for param in model.parameters():
                    assert param.grad is not None  # (set by loss.backward())
                    param.sub_(0.01 * param.grad)  # ``param -=`` (typed: Parameter to Tensor)
            ran += 1
            slow = args.slow_from is not None and ran > args.slow_from
            pause = args.slow_sleep_ms if slow else args.sleep_ms
            if pause > 0:
                time.sleep(pause / 1000.0)
            os.write(fd, b".")
        summary = rt.finish()
    print(f"driver: copy {config.index}: done {summary.done}/{summary.work}, ran "
          f"{summary.executed}, stopped {summary.stopped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
