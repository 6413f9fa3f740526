"""Test-session set-up: one BLAS/OpenMP thread per process (ranks share the cores);
Slurm's commands reach the local cluster of ``jobs/slurm/local-cluster.sh`` when it is
there and ``SLURM_CONF`` names no other.

Helpers (configs with the command line's defaults, launching ``mpiexec``) are in
``tests/helpers.py``."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
_LOCAL_SLURM_CONF = os.path.join(os.environ.get("SYNCBENCH_SLURM_DIR", "/run/syncbench-slurm"),
                                 "slurm.conf")
if os.path.exists(_LOCAL_SLURM_CONF):
    os.environ.setdefault("SLURM_CONF", _LOCAL_SLURM_CONF)
