"""The sidecar: the epoch loop steering a real Slurm cluster (see :mod:`.backend`)."""
