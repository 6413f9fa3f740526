"""Test-session set-up: one BLAS/OpenMP thread per process (ranks share the cores).

Helpers (configs with the command line's defaults, launching ``mpiexec``) are in
``tests/helpers.py``."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
