"""``syncbench comm``: every operation under ``mpiexec -n 2``, rows, HDF5, RMA windows: the
tests that run in process on every rank (pytest-mpi).

Split off e2e/test_commbench.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.bench.micro import comm as commbench


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", commbench.RMA_OPS)
def test_rma_ops_update_the_target_exactly_and_free_the_window(op):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    bufs = commbench.make_buffers("numpy", False, 0)
    dtype = commbench.element_type(op)
    nbytes, iterations, skip = 64, 7, 3
    with commbench.rma_window(comm, 256, dtype.itemsize) as win:
        local = np.frombuffer(win.tomemory(), dtype=dtype)
        local[:] = 0
        comm.Barrier()
        samples = commbench.rma_samples(op, comm, win, bufs, nbytes, iterations, skip)
        assert samples.shape == (iterations,) and np.all(samples > 0)
        count = nbytes // dtype.itemsize
        # exactly one origin ((rank - 1) % N) adds 1 per element per iteration; get reads only
        expected = 0 if op == "rma-get" else skip + iterations
        np.testing.assert_array_equal(local[:count], expected)
        np.testing.assert_array_equal(local[count:], 0)
        comm.Barrier()
    assert commbench.open_windows() == 0


@pytest.mark.mpi(min_size=2)
def test_window_is_freed_when_the_body_raises():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with pytest.raises(RuntimeError, match="inside the epoch"):
        with commbench.rma_window(comm, 64, 4):
            assert commbench.open_windows() == 1
            raise RuntimeError("inside the epoch")
    assert commbench.open_windows() == 0
    comm.Barrier()
