"""Recorded collective events (``--events on``): the bounded log, the run file, trace, report.

The log's bounds are serial. Under ``mpiexec -n 2`` real runs record every call
where the communicator makes it: SSGD overlap posts one ``Iallreduce`` per bucket
per step whose bytes add up to the gradient, in bucket order, each completing
after its post and inside its step; blocking SSGD one ``Allreduce``; ASGD one pull
and one push epoch; Oscars and Local SGD one reduction per round, at its last
step; OD-SGD's reduction completes in the next step. The trace draws them at the
recorded times and the report's table counts them. A run without the flag has no
events, so nothing changes for it (the old outputs are compared byte for byte
elsewhere).

Split off ``tests/mpi_inproc/test_events.py``: the tests that launch a process (``mpiexec``,
a ``syncbench`` command) or start MPI in the test's own process.
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
