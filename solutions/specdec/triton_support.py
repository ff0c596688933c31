"""Where Triton is missing: what needs it, and the one line a learner reads instead of a traceback.

Triton publishes wheels for Linux only (x86_64 and aarch64), so a Mac or native Windows install has none
(``pyproject.toml`` asks for it on Linux alone). Only notebook 08's kernels need it; every other notebook runs and
grades without it.
"""

from __future__ import annotations

import importlib.util

#: The notebooks whose code needs Triton.
NEEDS_TRITON = ("08_gpu_kernels",)

TRITON_NEEDED = ("Notebook 08's kernels need Triton, which publishes wheels for Linux only: run notebook 08 on Linux "
                 "(the course's container or dev container, WSL on Windows, a Linux VM or a hosted Linux notebook); "
                 "every other notebook runs here.")


def triton_installed() -> bool:
    """Whether ``import triton`` can find the package (without importing it: that must wait for
    ``specdec.kernels``, which decides about the interpreter first)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except ImportError:  # a finder that refuses it, as on a machine without it
        return False
