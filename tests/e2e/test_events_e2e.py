"""Recorded collective events (``--events on``): the bounded log, the run file, trace, report:
the tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off mpi_inproc/test_events.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import numpy as np

from syncbench.bench.train.events import KIND, EventLog

ALLREDUCE, IALLREDUCE = KIND["allreduce"], KIND["iallreduce"]  # the stored codes


def test_nothing_is_recorded_before_start():
    from mpi4py import MPI

    from syncbench.algorithms.communicator import Communicator

    log = EventLog(capacity=4)
    comm = Communicator(MPI.COMM_SELF, events=log)
    buf = np.ones(3)
    comm.Allreduce(buf)
    assert log.recorded == 0
    log.start()
    comm.Allreduce(buf)
    comm.Wait(comm.Iallreduce(buf))
    cols = log.columns()
    assert cols["kind"].tolist() == [ALLREDUCE, IALLREDUCE]
    assert cols["bytes"].tolist() == [buf.nbytes] * 2
    assert np.all(cols["t_done"] >= cols["t_post"])
