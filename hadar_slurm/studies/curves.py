"""Synthetic learning curves for a study's trials: the simulator's stand-in for training.

A trial is a configuration (a learning rate and a width, as in a search over a network's
optimiser and size).  Its metric (an accuracy: higher is better) after a fraction ``f`` of the
study's ``max_steps`` follows a saturating power law, the shape that learning curves of SGD
training take (Domhan et al., IJCAI 2015; the benchmarks of Klein et al., ICLR 2017)::

    acc(f) = q - (q - 0.10) * (1 + f / tau) ** -1.2          (+ noise at each report)

* ``q``, the trial's asymptote, is best near a learning rate ``lr*`` and a width of 256, and
  falls with the squared distance in decades of learning rate and in doublings of width::

      q = 0.93 - 0.045 * (log10 lr - log10 lr*) ** 2 - 0.012 * log2(width / 256) ** 2 + e_q

  (``e_q ~ N(0, 0.004)``, clipped to [0.15, 0.97]);
* ``tau``, how fast it gets there, is smaller for larger learning rates and narrower networks::

      tau = 0.08 * 10 ** (-0.35 * (log10 lr - log10 lr*)) * (width / 256) ** 0.25

  so a too-large learning rate leads early and ends lower: curves cross, and a halving rule can
  stop the trial that would have been best (as on real studies);
* each report adds ``N(0, noise)`` (0.005 by default), drawn from the trial's and the rung's
  own seed, so a report does not depend on when or where the trial ran.

Draws: ``log10 lr ~ U(-4, 0)``, ``width`` uniform over 32..512 (powers of two), ``log10 lr* ~
U(-2.5, -1.9)`` once per study; all from NumPy's PCG64 seeded with ``seed``: the same curves on
every machine.  :mod:`hadar_slurm.studies.halving` and the simulator only see the reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LearningCurves", "TrialConfig"]

_WIDTHS = (32, 64, 128, 256, 512)
_FLOOR = 0.10  # the metric of an untrained network (chance on ten classes)


@dataclass(frozen=True)
class TrialConfig:
    """One trial's hyperparameters."""

    lr: float
    width: int

    def text(self) -> str:
        return f"lr={self.lr:.3g} width={self.width}"


class LearningCurves:
    """The curves of ``trials`` trials of one study (see the module docstring)."""

    def __init__(self, trials: int, seed: int = 0, noise: float = 0.005) -> None:
        if trials < 1:
            raise ValueError(f"a study has at least one trial, got {trials}")
        if not noise >= 0:
            raise ValueError(f"noise must be >= 0, got {noise!r}")
        self.seed = seed
        self.noise = noise
        rng = np.random.default_rng([seed, 17])
        self.best_log_lr = float(rng.uniform(-2.5, -1.9))
        log_lr = rng.uniform(-4.0, 0.0, size=trials)
        widths = rng.choice(np.array(_WIDTHS), size=trials)
        e_q = rng.normal(0.0, 0.004, size=trials)
        self.configs = tuple(TrialConfig(float(10 ** x), int(w))
                             for x, w in zip(log_lr, widths, strict=True))
        d_lr = log_lr - self.best_log_lr
        d_w = np.log2(widths / 256.0)
        self.asymptote = np.clip(0.93 - 0.045 * d_lr ** 2 - 0.012 * d_w ** 2 + e_q, 0.15, 0.97)
        self.tau = 0.08 * 10 ** (-0.35 * d_lr) * (widths / 256.0) ** 0.25

    def __len__(self) -> int:
        return len(self.configs)

    def mean(self, trial: int, fraction: float) -> float:
        """The noise-free metric of ``trial`` after ``fraction`` of the full budget."""
        q = float(self.asymptote[trial])
        left = (1.0 + max(fraction, 0.0) / float(self.tau[trial])) ** -1.2
        return float(q - (q - _FLOOR) * left)

    def report(self, trial: int, rung: int, fraction: float) -> float:
        """What ``trial`` reports at ``rung``, reached after ``fraction`` of the full budget."""
        if self.noise == 0:
            return self.mean(trial, fraction)
        rng = np.random.default_rng([self.seed, 29, trial, rung])
        return self.mean(trial, fraction) + float(rng.normal(0.0, self.noise))

    def final(self, trial: int) -> float:
        """The metric ``trial`` would report after the full budget (noise-free)."""
        return self.mean(trial, 1.0)

    def best_trial(self) -> int:
        """The trial whose full-budget metric is best (what an exhaustive search finds)."""
        finals = [self.final(i) for i in range(len(self))]
        best: int = max(range(len(finals)), key=lambda i: (finals[i], -i))
        return best

