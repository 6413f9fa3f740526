"""``syncbench comm``: every operation under ``mpiexec -n 2``, rows, HDF5, RMA windows.

End-to-end tests launch their own ``mpiexec`` (serial pytest run, bounded by
subprocess timeouts); the statistics stored in the HDF5 file are re-computed
from its raw latencies, the columns are OSU's names, the bandwidths nccl-tests'
(algbw, busbw) and the simulator's ``--calibrate`` reads the file. The MPI
tests (pytest-mpi, ``--only-mpi`` at 2 and 4 ranks) check the RMA targets'
windows exactly and that windows are freed even when the measured body raises.

Split off ``tests/e2e/test_commbench.py``: the in-process MPI tests (marked ``mpi``, every
rank runs them).
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
