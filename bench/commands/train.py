"""``syncbench train``: one training run on every rank of the job (its flags, checked).

Launch it under ``mpiexec -n N`` (or ``srun``). Every rank trains the model of
``--model`` on its shard of ``--dataset`` with the synchronization strategy of
``--algorithm`` until the sample budget (``--epochs`` passes over the training
set) is consumed, timing every step by phase (compute, communication, waiting);
the consensus model is evaluated on the test split every ``--eval-every``
epochs. Rank 0 writes every rank's timings and the evaluations to one HDF5 run
file (``--out``), which ``syncbench report`` and ``syncbench trace`` read.

``--slowdown`` slows chosen ranks (a heterogeneous cluster on one machine);
``--timeout`` ends a job whose ranks stop making progress; a crashed run keeps
its rows next to ``--out`` (``syncbench recover``), and ``--checkpoint-every``
with ``--resume`` continues it. A bad flag ends every rank before MPI starts,
with one line and exit status 2. ``run``, ``compare`` and ``sweep`` hand the
flags they do not know to every ``syncbench train`` they launch.
"""

from __future__ import annotations

import argparse

# The flags are defined beside their checks (the runner's plans and scenario files
# build train's parser too); importing them does not start MPI (``cli.mpi_not_started``).
from syncbench.bench.train.options import add_train_arguments

HELP = "one training run (launch under mpiexec -n N)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench train`` (:func:`~syncbench.bench.train.options.add_train_arguments`)."""
    add_train_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench train``: one run on every rank of ``MPI.COMM_WORLD``, which
    starts here (:func:`syncbench.bench.train.driver.main`)."""
    from syncbench.bench.cli import import_command, mpi_not_started

    # the driver's modules load mpi4py.MPI: not initialized there, so that the GPU is
    # bound before MPI starts (in the driver's body); what cannot load is one line
    with mpi_not_started():
        driver = import_command("train", "syncbench.bench.train.driver")
    return driver.main(args)  # starts MPI
