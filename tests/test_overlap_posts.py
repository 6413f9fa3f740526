"""When reductions are posted and waited on: SSGD buckets and OD-SGD's one-step delay.

The communicator is wrapped by a real :class:`Communicator` subclass that
records the order of its calls (the MPI calls still run), and the model's
first trained layer records when its backward runs: the last backward work of
a step. SSGD must post buckets *before* that, and OD-SGD must wait on a
request only in the next step, after polls. Either would still pass the
equivalence tests with a ``Wait`` right after every post; these would not.

Bucket planning is serial; the rest runs under ``mpiexec -n 2`` (and 4).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rank_streams, train_config

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.not_lock_step import protocol_of
from syncbench.algorithms.reducers.buckets import bucket_bytes, plan_buckets
from syncbench.algorithms.registry import get_algorithm, validate
from syncbench.bench.data.catalog import make_synthetic
from syncbench.kernels.zoo import build_model


# -- bucket planning (serial) -----------------------------------------------------
def test_plan_closes_a_bucket_before_a_layer_would_overflow_it():
    # layers (reverse order): 5, 40, 800 elements, then a layer without parameters
    offsets = [0, 0, 800, 840]  # Flatten (empty), L1 [0,800), L2 [800,840), L3 [840,845)
    assert plan_buckets(offsets, 845, 100) == [(800, 845), (0, 800)]
    # the old rule (close once the pending gradient reaches the size) gave one bucket
    # here; closing before the overflow gives the big first layer its own
    assert plan_buckets(offsets, 845, 45) == [(800, 845), (0, 800)]
    assert plan_buckets(offsets, 845, 44) == [(840, 845), (800, 840), (0, 800)]
    assert plan_buckets(offsets, 845, 10_000) == [(0, 845)]
    assert plan_buckets(offsets, 845, 1) == [(840, 845), (800, 840), (0, 800)]


@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_auto_bucket_size_gives_mlp_and_lenet_several_buckets(model_name, dtype):
    model = build_model(model_name, (1, 28, 28), 10, dtype=dtype)
    elems = bucket_bytes("auto", model.grads.nbytes) // model.grads.itemsize
    plan = plan_buckets(model.layer_offsets, model.size, elems)
    assert len(plan) >= 2
    # the buckets tile the gradient, in the order backward completes them
    assert plan[0][1] == model.size and plan[-1][0] == 0
    assert all(a[0] == b[1] for a, b in zip(plan, plan[1:]))


def test_ssgd_bucket_count_is_recorded_per_mode():
    from mpi4py import MPI

    cls = get_algorithm("ssgd")
    model = build_model("lenet", (1, 28, 28), 10)
    budget = Budget(64, 8, 1)
    comm = Communicator(MPI.COMM_SELF)
    overlap = cls(model, comm, train_config("--comm", "overlap"), budget)
    blocking = cls(model, comm, train_config("--comm", "blocking"), budget)
    assert overlap.run_attributes["buckets"] == 3 and blocking.run_attributes["buckets"] == 1


def test_bucket_mb_flag_accepts_auto_and_numbers():
    assert train_config().bucket_mb == "auto"
    assert train_config("--bucket-mb", "0.5").bucket_mb == 0.5
    with pytest.raises(ValueError, match="--bucket-mb must be auto or > 0"):
        validate(get_algorithm("ssgd"), train_config("--bucket-mb", "0"), 2)


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
