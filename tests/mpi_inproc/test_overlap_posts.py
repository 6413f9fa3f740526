"""When reductions are posted and waited on: SSGD buckets and OD-SGD's one-step delay.

The communicator is wrapped by a real :class:`Communicator` subclass that
records the order of its calls (the MPI calls still run), and the model's
first trained layer records when its backward runs: the last backward work of
a step. SSGD must post buckets *before* that, and OD-SGD must wait on a
request only in the next step, after polls. Either would still pass the
equivalence tests with a ``Wait`` right after every post; these would not.

Bucket planning is serial; the rest runs under ``mpiexec -n 2`` (and 4).

Split off this module: ``tests/unit/test_overlap_posts_unit.py`` (its tests that need
neither) and ``tests/e2e/test_overlap_posts_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config
from oracles import rank_streams

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.not_lock_step import protocol_of
from syncbench.algorithms.registry import get_algorithm
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model


# -- call order under MPI -----------------------------------------------------------
class RecordingCommunicator(Communicator):
    """A real communicator that also logs ``(event, request)`` in call order."""

    def __init__(self, comm) -> None:
        super().__init__(comm)
        self.log: list[tuple[str, object]] = []

    def Iallreduce(self, buf):
        req = super().Iallreduce(buf)
        self.log.append(("post", req))
        return req

    def Allreduce(self, buf) -> None:
        self.log.append(("allreduce", None))
        super().Allreduce(buf)

    def Wait(self, req) -> None:
        self.log.append(("wait", req))
        super().Wait(req)

    def Waitall(self, reqs) -> None:
        for req in reqs:
            self.log.append(("wait", req))
        super().Waitall(reqs)

    def Test(self, req) -> bool:
        self.log.append(("poll", req))
        return super().Test(req)

    def poll(self) -> None:
        if self.outstanding:
            self.log.append(("poll", None))
        super().poll()


def _mark_backward_end(model, log) -> None:
    """Log ``backward_end`` after the first trained layer's backward (a step's last)."""
    layer = model.layers[model.first_trained]
    backward = layer.backward

    def logged(dy):
        out = backward(dy)
        log.append(("backward_end", None))
        return out

    layer.backward = logged


def _setup(algorithm, model_name, *flags, steps=4):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    batch, seed = 8, 3
    data = make_synthetic(256, 32, (1, 28, 28), 10, seed=1)
    config = train_config("--algorithm", algorithm, *flags)
    model = build_model(model_name, data.input_shape, 10, dtype=np.float64, seed=seed)
    comm = RecordingCommunicator(world)
    algo = get_algorithm(algorithm)(model, comm, config, Budget(steps * batch * size, batch, size))
    _mark_backward_end(model, comm.log)
    stream = rank_streams(data.train_x, data.train_y, size, batch, seed)[rank]
    return algo, comm, stream


def _steps(log):
    """Split the log at ``step`` markers: one list of events per step."""
    out: list[list[tuple[str, object]]] = []
    for event in log:
        if event[0] == "step":
            out.append([])
        elif out:
            out[-1].append(event)
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_ssgd_posts_buckets_before_backward_ends(model_name):
    algo, comm, stream = _setup("ssgd", model_name, "--comm", "overlap")
    assert algo.reducer.posts_per_step >= 2  # the default bucket size
    for _ in range(3):
        comm.log.append(("step", None))
        algo.step(*stream.next())
    for events in _steps(comm.log):
        kinds = [k for k, _ in events]
        end = kinds.index("backward_end")
        posts = [i for i, k in enumerate(kinds) if k == "post"]
        assert len(posts) == algo.reducer.posts_per_step
        early = [i for i in posts if i < end]
        assert len(early) == algo.reducer.posts_per_step - 1 >= 1, kinds  # not the first layer
        # nothing waits between the first post and the end of backward, and the
        # in-flight buckets are polled while backward runs
        assert "wait" not in kinds[posts[0]:end], kinds
        assert "poll" in kinds[posts[0]:end], kinds
        # every posted request is waited on once, in this step, after backward
        waits = [(i, req) for i, (k, req) in enumerate(events) if k == "wait"]
        assert [req for _, req in waits] == [events[i][1] for i in posts]
        assert all(i > end for i, _ in waits)


@pytest.mark.mpi(min_size=2)
def test_a_slowed_ssgd_rank_delays_before_its_last_bucket():
    """A processor f times slower posts its last bucket at f times its compute time:
    the emulated delay must come before that post, not hide the whole reduction."""
    algo, comm, stream = _setup("ssgd", "lenet", "--comm", "overlap")
    algo.slowdown = lambda seconds: comm.log.append(("delay", seconds)) or 0.0
    for _ in range(2):
        comm.log.append(("step", None))
        algo.step(*stream.next())
    for events in _steps(comm.log):
        kinds = [k for k, _ in events]
        assert kinds.count("delay") == 1, kinds
        posts = [i for i, k in enumerate(kinds) if k == "post"]
        assert posts[-2] < kinds.index("delay") < posts[-1], kinds
        assert events[kinds.index("delay")][1] > 0  # the step's compute so far


@pytest.mark.mpi(min_size=2)
def test_a_slowed_rank_polls_its_requests_during_the_delay():
    """A slower processor polls between the layers it is still computing; the emulated
    delay must too, or the other ranks' reductions stall behind the straggler."""
    from syncbench.bench.train.slowdown import Slowdown

    algo, comm, stream = _setup("ssgd", "lenet", "--comm", "overlap")
    slow = Slowdown(3.0, mode="spin")
    slow.progress = protocol_of(algo).drive_progress

    def logged(seconds):
        comm.log.append(("delay_start", None))
        slow.debt = 0.0  # a preemption across the last deadline must not skip this delay
        spent = slow(max(seconds, 0.002))
        comm.log.append(("delay_end", None))
        return spent

    algo.slowdown = logged
    for _ in range(2):
        comm.log.append(("step", None))
        algo.step(*stream.next())
    for events in _steps(comm.log):
        kinds = [k for k, _ in events]
        during = kinds[kinds.index("delay_start"):kinds.index("delay_end")]
        assert "poll" in during, kinds  # the buckets posted before it progress


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_odsgd_waits_on_each_request_only_in_the_next_step_after_polls(model_name):
    warmup, steps = 2, 7
    algo, comm, stream = _setup("odsgd", model_name, "--warmup-steps", str(warmup),
                                steps=steps)
    for _ in range(steps):
        comm.log.append(("step", None))
        algo.step(*stream.next())
    comm.log.append(("step", None))  # finish() drains the last request
    algo.finish()
    per_step = _steps(comm.log)
    for t, events in enumerate(per_step[:steps]):
        kinds = [k for k, _ in events]
        if t < warmup:
            assert kinds.count("allreduce") == 1 and "post" not in kinds
            continue
        posts = [req for k, req in events if k == "post"]
        assert len(posts) == 1, kinds
        request = posts[0]
        post_at = kinds.index("post")
        # not waited on in the step that posted it
        assert all(req is not request for k, req in events[post_at:] if k == "wait"), kinds
        # waited on exactly once in the next step (or finish, for the last one)
        nxt = per_step[t + 1]
        waits = [i for i, (k, req) in enumerate(nxt) if k == "wait" and req is request]
        assert len(waits) == 1, [k for k, _ in nxt]
        if t + 1 < steps:  # after a whole forward/backward that polled it
            assert any(k == "poll" for k, _ in nxt[: waits[0]]), [k for k, _ in nxt]
            assert ("backward_end", None) in nxt[: waits[0]]
