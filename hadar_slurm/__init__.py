"""hadar-slurm: heterogeneity-aware scheduling of deep-learning jobs on Slurm GPU clusters."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
