"""Crash safety (``syncbench recover``): per-rank row files, resumable state, write errors.

Next to the run file ``RUN.h5`` a run keeps a folder ``RUN.h5.parts/``:

* ``rows-RRRRR.bin``: rank R's step rows, append-only,
  flushed every ``--flush-every`` seconds (default 1) at the cost of the rows
  added since the last flush; ``attrs-RRRRR.json`` holds the rank's attributes,
  ``evals.npz`` rank 0's evaluation rows and ``meta.json`` the root attributes.
  ``syncbench recover RUN.h5`` rebuilds a partial run file from them, marked
  ``complete=False``; it still reads the ``rows-RRRRR.npz`` files of older
  versions.
* ``state-RRRRR-sSSSSSSSS.h5``: rank R's resumable state at step S
  (``--checkpoint-every``), and ``checkpoint.json`` naming the newest step
  for which EVERY rank's state was written (rank 0 writes it after a
  barrier), so ``--resume`` never mixes generations. It also records the
  run's identity (strategy, model, dataset, world size,
  batch size, seed, sample budget, gradient codec); ``--resume`` refuses a checkpoint of
  another run, naming what differs.
* ``heartbeat-RRRRR``: the rank's last step and time, read by the hang guard.

A run that completes removes the folder; what exists after a crash is
exactly what was flushed.

Rank 0 holds an exclusive lock on the run file, ``RUN.h5.lock`` beside it
(:func:`run_lock`, a ``flock`` the kernel drops when its holder dies), from
before anything of an earlier run is removed to the end of the run, and
``syncbench recover`` holds it while it rebuilds the file: a second run on the
same path ends at once with one line naming the holder, and never touches the
first one's parts.

Every file is written whole to a temporary name beside it (HDF5 files are
built in memory first, so the HDF5 library never meets a disk error), then
synced and renamed. A failed write (a full disk, a quota, a read-only
folder, an I/O error) ends the run with one line naming the path
and the cause, and leaves no temporary file and the previous version intact
(a failed append is cut back to the last whole chunk).
"""

from __future__ import annotations

import argparse
import sys

from syncbench.bench.train.checkpoint import recover

HELP = "rebuild a partial run file from the rows a crashed run flushed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench recover``."""
    parser.add_argument("run", metavar="RUN.h5", help="the run file the crashed job was writing")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing RUN.h5")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench recover``."""
    try:
        summary = recover(args.run, overwrite=args.overwrite)
    except (OSError, ValueError, KeyError) as exc:
        print(f"syncbench recover: {exc}", file=sys.stderr)
        return 2
    print(f"{args.run}: partial run rebuilt (complete=False), "
          f"{summary['samples_per_s']:.1f} samples/s over {summary['wall_s']:.2f} s")
    return 0
