"""``syncbench env``: what this environment gives a run, and what ``train`` would miss.

Prints, one fact a line with how it was found: the MPI library actually loaded (its
path as ``/proc/self/maps`` shows it after ``mpi4py.MPI`` loaded it, its
``MPI_Get_library_version``, ``mpi4py.MPI.get_vendor()``, which MPI wheels the
environment holds), mpi4py's version and build configuration, whether the MPI is
CUDA-aware and how that was decided (train's ``--cuda-aware`` left to auto:
``algorithms.device_buffers.detect_cuda_aware``), the GPU probe's answer
(``kernels.backend.probe_gpu``), where each dataset is found (``train``'s look-up),
SimGrid, Slurm, the emulated cluster, PyTorch for ``syncbench peers``, and the
BLAS/OpenMP threads ``train`` gives a rank (``bench/mpi/threads.py``).

mpi4py 4.1's binary wheel loads the first ``libmpi`` it finds, the virtual
environment's ``lib/`` before the system's search path (mpi4py's documentation,
"Installation"; ``MPI4PY_LIBMPI`` overrides it), so the path printed here is the
one to check on a cluster. MPI (mpi4py and a library it loads), NumPy and h5py are
what ``train`` needs: each one missing is one line on stderr and the exit status is
1. A missing dataset is reported but is not missing: ``--dataset synthetic`` always
works. The same facts, those that cost no subprocess, go into every run file (root
attribute ``environment``, written by :func:`run_facts`).
"""

from __future__ import annotations

import argparse
import os
import sys

from syncbench.bench.mpi.environment import collect
from syncbench.bench.mpi.errors import launcher_rank

HELP = ("what this environment gives a run (MPI library, GPU, datasets, SimGrid, Slurm, "
        "threads) and what train would miss")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench env``."""
    parser.add_argument("--data-dir", default=None,
                        help="where to look for the datasets first (as train's --data-dir)")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench env``: print the facts (rank 0 of a launcher only); 1 when
    ``train`` would miss a piece."""
    facts = collect(args.data_dir, os.environ)
    missing = [fact.missing for fact in facts if fact.missing]
    if launcher_rank() == 0:
        width = max(len(fact.name) for fact in facts)
        for fact in facts:
            how = f"  ({fact.how})" if fact.how else ""
            print(f"{fact.name:<{width}}  {fact.value}{how}")
        sys.stdout.flush()
        for line in missing:
            print(f"syncbench env: missing: {line}", file=sys.stderr)
    return 1 if missing else 0
