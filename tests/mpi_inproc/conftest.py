"""Fixtures of the in-process MPI tier (every rank runs each test)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """One folder every rank of ``COMM_WORLD`` sees (rank 0 makes it, the name is
    broadcast), removed by rank 0 once every rank is done with it: pytest's ``tmp_path``
    is a different folder on each rank, and a run file is written by all of them."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    name = tempfile.mkdtemp(prefix="syncbench-mpi-") if comm.Get_rank() == 0 else None
    folder = Path(comm.bcast(name, root=0))
    yield folder
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
