"""``python -m hadar_slurm`` runs the command-line interface."""

from __future__ import annotations

from hadar_slurm.cli.main import main

raise SystemExit(main())
