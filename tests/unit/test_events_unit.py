"""Recorded collective events (``--events on``): the bounded log, the run file, trace, report:
the tests that launch nothing and load no MPI.

Split off mpi_inproc/test_events.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import numpy as np

from syncbench.bench.train.events import KIND, EventLog

ALLREDUCE, IALLREDUCE = KIND["allreduce"], KIND["iallreduce"]  # the stored codes


# -- the bounded log (serial) ---------------------------------------------------------
def _fill(log: EventLog, steps: range, per_step: int) -> None:
    for step in steps:
        for k in range(per_step):
            log.post("allreduce", 100, step, float(step) + k / 10, t_done=float(step) + 0.05)


def test_a_full_log_keeps_a_stride_sample_of_whole_steps():
    log = EventLog(capacity=8)
    log.start()
    _fill(log, range(10), per_step=2)  # 20 events into 8 slots
    cols = log.columns()
    assert log.stride == 4 and log.attrs()["stride"] == 4
    assert sorted(set(cols["step"].tolist())) == [0, 4, 8]
    assert all(np.count_nonzero(cols["step"] == s) == 2 for s in (0, 4, 8))  # whole steps
    assert log.recorded == 20 and log.dropped == 20 - len(cols["step"])
    assert np.all(np.diff(cols["t_post"]) > 0)  # still in post order
    assert cols["index"].tolist() == [0, 1] * 3  # place among the step's calls of a kind


def test_a_pending_request_keeps_its_event_across_a_compaction():
    log = EventLog(capacity=4)
    log.start()
    _fill(log, range(2), per_step=1)
    log.post("iallreduce", 8, 2, 2.0, key=1234)  # in flight while the buffer fills
    _fill(log, range(3, 4), per_step=1)
    _fill(log, range(4, 5), per_step=1)  # full: compacts to steps 0, 2, 4
    assert log.stride == 2 and log.is_pending(1234)
    log.complete(1234, 2.5, wait_s=0.25)
    cols = log.columns()
    assert cols["step"].tolist() == [0, 2, 4]
    assert cols["t_done"][1] == 2.5 and cols["wait_s"][1] == 0.25
    assert cols["kind"][1] == IALLREDUCE
    # a request of a step the sample leaves out is not kept, and its completion is ignored
    log.post("iallreduce", 8, 5, 5.0, key=99)
    assert not log.is_pending(99)
    log.complete(99, 6.0)
    assert 5 not in log.columns()["step"]


def test_one_step_larger_than_the_buffer_keeps_its_first_events():
    log = EventLog(capacity=3)
    log.start()
    _fill(log, range(1), per_step=5)
    assert len(log.columns()["step"]) == 3 and log.dropped == 2 and log.stride == 1
