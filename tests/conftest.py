"""Test-session set-up: one BLAS/OpenMP thread per process (ranks share the cores);
Slurm's commands reach the local cluster of ``jobs/slurm/local-cluster.sh`` when it is
there and ``SLURM_CONF`` names no other.

The tiers, by what a test needs (``make test`` runs them in this order):

- ``tests/unit``: computes in the pytest process; no process launched, ``mpi4py.MPI``
  never loaded (``tests/unit/conftest.py`` fails a test that does).
  ``python -m pytest -n 2 -m 'not slow' tests/unit`` (``make test-fast``).
- ``tests/e2e``: launches ``mpiexec``, ``syncbench`` commands, Slurm jobs or the emulated
  cluster, or starts MPI in the pytest process.
  ``python -m pytest -n 2 -m 'not slurm and not cluster and not alone' tests/e2e``
  (``make test-serial`` runs it after the unit tier; ``make test-slurm``,
  ``make test-cluster`` the marked ones).
- ``tests/mpi_inproc``: in-process MPI tests (pytest-mpi, marked ``mpi``), run by every
  rank; each file runs unchanged at any size:
  ``mpiexec -n N python -m pytest --only-mpi tests/mpi_inproc`` (N = 1, 2, 4;
  ``make test-mpi`` runs 2 and 4). Not named ``mpi``: pytest-mpi looks for its mark among
  a test's keywords, which hold the names of the folders above it, so every test in a
  folder ``mpi`` would count as marked.

Shared helpers sit in ``tests/`` (on ``sys.path`` through ``pythonpath`` in
``pyproject.toml``): ``helpers.py`` (configs with the command line's defaults, launching
``mpiexec``), ``oracles.py`` (the serial reference computations), ``cluster_helpers.py``,
``sim_helpers.py``, ``compress_oracles.py`` and ``data/``."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
_LOCAL_SLURM_CONF = os.path.join(os.environ.get("SYNCBENCH_SLURM_DIR", "/run/syncbench-slurm"),
                                 "slurm.conf")
if os.path.exists(_LOCAL_SLURM_CONF):
    os.environ.setdefault("SLURM_CONF", _LOCAL_SLURM_CONF)
