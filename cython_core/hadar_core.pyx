# cython: language_level=3
"""Compiled Hadar core (placeholder until the primal-dual port lands)."""


def version() -> int:
    return 0
