"""What the compressing reducers share (``--compress``): a reduction per bucket written as
a sequence of nonblocking collectives, run after backward (``--comm blocking``, one bucket:
the whole gradient) or bucket by bucket as backward finishes each (``--comm overlap``).

A codec's reduction of one bucket is a generator (:meth:`CompressedReducer.reduction`):
it encodes, yields each request it posts (an ``Ialltoallv``, ``Iallgather(v)`` or
``Iallreduce`` of codes), decodes between them and returns the bucket's float32 mean,
the same bits on every rank. :class:`CompressedReducer` drives the generators: blocking,
it waits on each request at once; under overlap it posts a bucket's first collective as
soon as backward finishes the bucket (the bucket plans of
:mod:`~syncbench.algorithms.reducers.buckets`, as
:class:`~syncbench.algorithms.reducers.bucketed.BucketedIallreduce`), advances a bucket
whose request a poll finds complete (``Test`` between layers: MPI progresses only inside
MPI calls), and finishes the rest after backward. A codec whose collectives depend on
the whole gradient (PowerSGD's layout) runs blocking only.

This rank's gradient is taken as float32 (the codecs of :mod:`syncbench.algorithms.codecs`
encode float32; a float64 model's gradient is rounded to float32 first, as it would
travel) and each bucket's mean is written back into ``model.grads``, which the update
applies. Encoding, decoding and summing codes are charged to their own phase, ``codec``
(:meth:`CompressedReducer.phase`), so ``comm`` holds only time inside MPI and ``compute``
and ``update`` stay comparable across strategies (the 1/N scaling of the plain reducers
stays in ``update``).

:meth:`CompressedReducer.wire_bytes` is the bytes of the encoded gradient this rank hands
to MPI per step: the same measure as the plain reducers' ``grads.nbytes`` (the buffer of
one Allreduce), so the ratio of the two is the compression ratio.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Generator
from typing import Any

import numpy as np

from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.reducers import GradientReducer

#: A bucket's reduction: yields the requests it posts, returns the bucket's float32 mean.
Reduction = Generator[Any, None, np.ndarray]


def segment_bounds(count: int, ranks: int) -> list[int]:
    """Bounds of the ``ranks`` contiguous segments of a vector of ``count`` elements (rank
    i reduces ``[b[i], b[i + 1])``; sizes differ by at most one, as ``numpy.array_split``)."""
    return [count * i // ranks for i in range(ranks + 1)]


def mean_scale(ranks: int) -> np.float32:
    """The float32 factor 1/N every compressing reducer scales its sum by."""
    return np.float32(1.0 / ranks)


class CompressedReducer(GradientReducer):
    """Drives a codec's per-bucket :meth:`reduction` over the buckets of ``plan``.

    ``plan``: buckets ``[start, end)`` in the order backward completes them; None, one
    bucket of the whole gradient, reduced after backward. Subclasses implement
    :meth:`reduction` and :meth:`bucket_wire_bytes`; :meth:`state` holds the calls made
    so far (``compress_calls``) and whatever the codec keeps.
    """

    #: Whether the codec's reduction can run bucket by bucket.
    bucketed = True
    #: Collectives one bucket's reduction posts one after another (its phases).
    phases = 1

    def __init__(self, core: Any, codec: Any,
                 plan: list[tuple[int, int]] | None = None) -> None:
        super().__init__(core)
        self.codec = codec
        self.count = int(core.model.grads.size)
        self.overlap = plan is not None
        self.plan = plan if plan is not None else [(0, self.count)]
        self.posts_per_step = len(self.plan)
        #: Reductions made so far (random-k's step; restored on resume).
        self.calls = 0
        #: The communicator of each phase: under overlap, phase k > 0 has a duplicate of
        #: the strategy's own, so that every rank posts each communicator's collectives
        #: in the same order (bucket order; see :meth:`poll`).
        self.comms = [core.comm] * self.phases
        if self.overlap:
            self.comms[1:] = [Communicator(core.comm.mpi_comm.Dup(), core.timer,
                                           core.comm.events) for _ in range(self.phases - 1)]
        #: Buckets in flight: index in plan -> (its generator, the request it waits on).
        self._flight: dict[int, tuple[Reduction, Any]] = {}
        #: Collectives each bucket in flight has posted.
        self._posted: dict[int, int] = {}
        self._next = 0  # index in plan of the next bucket to post
        self._straggled = False

    @abstractmethod
    def reduction(self, index: int, values: np.ndarray) -> Reduction:
        """Bucket ``index``'s reduction of this rank's float32 ``values``."""

    @abstractmethod
    def bucket_wire_bytes(self, index: int) -> int:
        """Bytes of bucket ``index``'s encoding this rank hands to MPI."""

    def wire_bytes(self) -> int:
        """Bytes of the encoded gradient this rank hands to MPI per step."""
        return sum(self.bucket_wire_bytes(i) for i in range(len(self.plan)))

    def phase(self) -> Any:
        """The phase encode, decode and the sum of codes are charged to: ``codec``."""
        return self.core.timer.phase("codec")

    def iallreduce(self, buf: np.ndarray) -> Any:
        """Start an in-place sum of host array ``buf``: the plain communicator's call even
        on a GPU run (codes live in host memory; there is nothing to stage)."""
        return Communicator.Iallreduce(self.core.comm, buf)

    # -- driving the buckets ---------------------------------------------------------
    def hooks(self) -> dict[str, Any]:
        if not self.overlap:
            return {}
        return {"on_grads_ready": self.on_grads_ready, "poll": self.poll}

    def start(self) -> None:
        self._next, self._straggled = 0, False

    def on_grads_ready(self, offset: int) -> None:
        """Post every bucket whose gradient is now final (the straggler's delay right
        before the last one, as the plain bucketed reducer), else poll."""
        plan, posted = self.plan, False
        while self._next < len(plan) and plan[self._next][0] >= offset:
            if self._next == len(plan) - 1 and not self._straggled:
                self._straggled = True
                self.core.straggle()
            self._post(self._next)
            self._next += 1
            posted = True
        if not posted:
            self.poll()

    def poll(self) -> None:
        """Advance every bucket whose request completed and that may post its next phase.

        MPI matches a communicator's collectives by the order ranks post them, but a
        request completes at different times on different ranks; so a bucket posts its
        phase k + 1 only after every earlier bucket posted its own (each phase's
        collectives go to that phase's communicator in bucket order on every rank).
        """
        for index in sorted(self._flight):
            gen, request = self._flight[index]
            phase = self._posted[index]
            if any(self._posted[j] <= phase for j in self._flight if j < index):
                continue
            if self.comms[phase - 1].Test(request):
                self._advance(index, gen)

    def complete(self) -> Any:
        core = self.core
        if not self._straggled:
            core.straggle()
        while self._next < len(self.plan):  # blocking: every bucket is posted here
            self._post(self._next)
            self._next += 1
        while self._flight:
            index = min(self._flight)
            gen, request = self._flight[index]
            self.comms[self._posted[index] - 1].Wait(request)
            self._advance(index, gen)
        self.calls += 1
        self.start()  # ready for the next step
        return core.model.grads

    def _post(self, index: int) -> None:
        start, end = self.plan[index]
        model = self.core.model
        with self.phase():
            values = np.array(model.backend.to_numpy(model.grads[start:end]), dtype=np.float32)
        self._advance(index, self.reduction(index, values))

    def _advance(self, index: int, gen: Reduction) -> None:
        """Run bucket ``index``'s generator to its next request, or write its mean."""
        try:
            self._flight[index] = (gen, next(gen))
            self._posted[index] = self._posted.get(index, 0) + 1
        except StopIteration as done:
            self._flight.pop(index, None)
            self._posted.pop(index, None)
            start, end = self.plan[index]
            model = self.core.model
            with self.phase():
                model.grads[start:end] = model.backend.asarray(done.value)

    def close(self) -> None:
        requests = {id(request) for _, request in self._flight.values()}
        for comm in self.comms:
            comm.outstanding = [r for r in comm.outstanding if id(r) not in requests]
        self._flight, self._posted = {}, {}

    # -- state -----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"compress_calls": self.calls}

    def load_state(self, state: dict[str, Any]) -> None:
        self.calls = int(state["compress_calls"])
