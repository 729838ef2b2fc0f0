"""Build the compiled Hadar core; all other metadata is in pyproject.toml."""

from __future__ import annotations

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "hadar_slurm._hadar_core",
        sources=["cython_core/hadar_core.pyx"],
        include_dirs=[np.get_include(), "cython_core"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
        },
    ),
)
