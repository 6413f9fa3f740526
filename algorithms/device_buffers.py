"""GPU buffers at the MPI boundary: CUDA-aware pass-through or pinned host staging.

The rule (``DESIGN.md``, "Arrays and backends"): on the GPU backend a model's flat
buffers are CuPy arrays. A CUDA-aware MPI library gets them as they are in
blocking collectives (mpi4py reads ``__cuda_array_interface__``); otherwise
every MPI call goes through a pinned host mirror (device -> host copy, the call
on the mirror, host -> device copy when the data is final). Direct calls
synchronize the current CUDA stream first: kernels are asynchronous and MPI
knows nothing of streams. Nonblocking collectives are staged even with a
CUDA-aware library, unless ``--cuda-aware-nonblocking yes``: Open MPI's
(``coll/libnbc``) reduce on the CPU and may crash on device memory
(open-mpi/ompi issues 9845, 12045).

A staged ``Iallreduce`` does not stall the GPU: it records an event after the
kernels queued so far, copies into its mirror on a copy stream that waits for
that event, and posts the MPI call once the copy completed; inside ``compute``
(SSGD's buckets during backward) the post waits for the next :meth:`poll`,
``Test`` or ``Wait`` that finds the copy done. Posts keep the program's order,
and every other collective first posts what is deferred, so all ranks issue
their collectives in the same order. :class:`Staging` counts the time a rank
waited for a copy, not the copy's duration on the GPU.

``--cuda-aware yes|no|auto`` (:func:`detect_cuda_aware`): ``auto`` asks the
library (``MPIX_Query_cuda_support()``), else known environment settings
(Cray MPICH, MVAPICH2, Open MPI); otherwise no (staging), which always works.
One-sided windows stay in host memory (:class:`HostMirror`). Nothing here
imports CuPy on the CPU backend, whose plain
:class:`~syncbench.algorithms.communicator.Communicator` pays nothing for this.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from syncbench.algorithms.communicator import Communicator, EventSink
from syncbench.algorithms.mpi import MPI
from syncbench.algorithms.timing import PhaseTimer
from syncbench.kernels.backend import Backend

CUDA_AWARE_CHOICES = ("auto", "yes", "no")
#: Environment settings that switch CUDA support on in MPI libraries without a query.
CUDA_ENV_SETTINGS: dict[str, tuple[str, ...]] = {
    "MPICH_GPU_SUPPORT_ENABLED": ("1",),  # Cray MPICH
    "MV2_USE_CUDA": ("1",),  # MVAPICH2
    "OMPI_MCA_opal_cuda_support": ("1", "true", "yes"),  # Open MPI (smcuda/ucx)
}
#: Host mirrors kept for distinct device buffers before idle ones are dropped.
MAX_MIRRORS = 64


# -- detection -------------------------------------------------------------------
@dataclass(frozen=True)
class CudaAwareness:
    """Whether device buffers go to MPI directly, and why."""

    enabled: bool
    reason: str


def query_library_cuda_support() -> bool | None:
    """``MPIX_Query_cuda_support()`` of the running MPI library; None if it has none.

    Must be called after MPI is initialized (importing ``mpi4py.MPI`` does it).
    """
    query = getattr(MPI, "Query_cuda_support", None)  # a future mpi4py may expose it
    if callable(query):
        return bool(query())
    try:
        lib = ctypes.CDLL(MPI.__file__)  # resolves symbols of the MPI library it links
        function = lib.MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return bool(function())


def env_cuda_support(environ: Mapping[str, str] | None = None) -> str | None:
    """The first known CUDA-enabling setting present in ``environ`` (``NAME=value``), or None."""
    environ = os.environ if environ is None else environ
    for name, values in CUDA_ENV_SETTINGS.items():
        value = environ.get(name, "").strip().lower()
        if value in values:
            return f"{name}={environ[name]}"
    return None


def detect_cuda_aware(
    choice: str = "auto",
    environ: Mapping[str, str] | None = None,
    query: bool | None | str = "library",
) -> CudaAwareness:
    """Resolve ``--cuda-aware``: ``yes``/``no`` as told; ``auto`` asks the library, then the
    environment, and defaults to no (host staging).

    ``query`` is the library's answer; the default ``"library"`` asks it
    (:func:`query_library_cuda_support`); None means it has no query.
    """
    if choice not in CUDA_AWARE_CHOICES:
        raise ValueError(f"--cuda-aware must be one of {', '.join(CUDA_AWARE_CHOICES)}, "
                         f"got {choice!r}")
    if choice != "auto":
        return CudaAwareness(choice == "yes", f"--cuda-aware {choice}")
    answer = query_library_cuda_support() if query == "library" else query
    if answer is not None:
        return CudaAwareness(bool(answer), f"MPIX_Query_cuda_support() = {int(bool(answer))}")
    setting = env_cuda_support(environ)
    if setting is not None:
        return CudaAwareness(True, f"{setting} in the environment")
    return CudaAwareness(False, "no CUDA support detected: host staging")


# -- copies between device and host ------------------------------------------------
def host_empty(backend: Backend, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialized host array: page-locked (pinned) on the GPU backend."""
    if backend.is_gpu:
        import cupyx  # lazy: CuPy exists only where the GPU backend runs

        return cupyx.empty_pinned(shape, dtype=dtype)
    return np.empty(shape, dtype=dtype)


def copy_to_host(backend: Backend, device: Any, host: np.ndarray) -> None:
    """``host[...] = device``, complete when it returns (the stream is synchronized)."""
    if backend.is_gpu:
        device.get(out=host)
        backend.synchronize()
    else:
        np.copyto(host, device)


def copy_to_device(backend: Backend, host: np.ndarray, device: Any) -> None:
    """``device[...] = host``, complete when it returns.

    ``ndarray.set`` only queues the copy on the current stream in CuPy 13/14
    (from pinned memory it is truly asynchronous), so the stream is
    synchronized before returning: the caller may then reuse ``host``.
    """
    if backend.is_gpu:
        device.set(host)
        backend.synchronize()
    else:
        np.copyto(device, host)


class CopyEvent(Protocol):
    """What :meth:`Staging.to_host_async` returns: ``cupy.cuda.Event``'s ``done`` property
    and ``synchronize`` method."""

    @property
    def done(self) -> bool: ...

    def synchronize(self) -> None: ...


class CompletedCopy:
    """The event of a copy that completed before it was returned (the CPU backend)."""

    done = True

    def synchronize(self) -> None:
        return None


COMPLETED = CompletedCopy()


def _address(buf: Any) -> int:
    interface = getattr(buf, "__cuda_array_interface__", None) or buf.__array_interface__
    return int(interface["data"][0])


class Staging:
    """Host mirrors of device buffers, one per distinct buffer, reused across calls."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._mirrors: dict[tuple[int, int, str], np.ndarray] = {}
        #: Seconds spent copying, and bytes copied, in each direction.
        self.seconds = {"to_host": 0.0, "to_device": 0.0}
        self.bytes = {"to_host": 0, "to_device": 0}
        self._copy_stream: Any = None

    def mirror(self, buf: Any, busy: tuple[np.ndarray, ...] = ()) -> np.ndarray:
        """The host mirror of ``buf`` (allocated once); ``busy`` mirrors are never dropped."""
        key = (_address(buf), int(buf.nbytes), np.dtype(buf.dtype).str)
        host = self._mirrors.get(key)
        if host is None or host.shape != buf.shape:
            if len(self._mirrors) >= MAX_MIRRORS:
                self._mirrors = {k: m for k, m in self._mirrors.items()
                                 if any(m is b for b in busy)}
            host = self._mirrors[key] = host_empty(self.backend, buf.shape, buf.dtype)
        return host

    def to_host(self, buf: Any, host: np.ndarray) -> None:
        start = time.perf_counter()
        copy_to_host(self.backend, buf, host)
        self.seconds["to_host"] += time.perf_counter() - start
        self.bytes["to_host"] += int(buf.nbytes)

    def to_host_async(self, buf: Any, host: np.ndarray) -> CopyEvent:
        """Queue ``host[...] = buf`` after the work queued so far; returns its completion event.

        GPU: an event recorded on the current stream, a copy stream that waits
        for it, ``cudaMemcpyAsync`` into the pinned ``host`` there, and an event
        after the copy; kernels queued later on the current stream run
        meanwhile. CPU: the copy is done at once.
        """
        start = time.perf_counter()
        self.bytes["to_host"] += int(buf.nbytes)
        if not self.backend.is_gpu:
            np.copyto(host, buf)
            self.seconds["to_host"] += time.perf_counter() - start
            return COMPLETED
        cuda = self.backend.xp.cuda
        if not buf.flags.c_contiguous:
            raise ValueError("staged buffers must be contiguous")
        if self._copy_stream is None:
            self._copy_stream = cuda.Stream(non_blocking=True)
        ready = cuda.Event(disable_timing=True)
        ready.record(cuda.get_current_stream())
        self._copy_stream.wait_event(ready)
        cuda.runtime.memcpyAsync(host.ctypes.data, buf.data.ptr, int(buf.nbytes),
                                 cuda.runtime.memcpyDeviceToHost, self._copy_stream.ptr)
        done = cuda.Event(disable_timing=True)
        done.record(self._copy_stream)
        self.seconds["to_host"] += time.perf_counter() - start
        return done

    def wait_copy(self, event: CopyEvent) -> None:
        """Block until ``event``'s copy is done, counting the time waited."""
        start = time.perf_counter()
        event.synchronize()
        self.seconds["to_host"] += time.perf_counter() - start

    def to_device(self, host: np.ndarray, buf: Any) -> None:
        start = time.perf_counter()
        copy_to_device(self.backend, host, buf)
        self.seconds["to_device"] += time.perf_counter() - start
        self.bytes["to_device"] += int(buf.nbytes)


class HostMirror:
    """A host copy of a device buffer, for one-sided windows that live in host memory.

    ``host`` may be given (e.g. a NumPy view of an MPI window's memory);
    otherwise a pinned buffer is allocated. ``seconds`` and ``copies`` add up
    the copies made, so an algorithm can report them. On the CPU backend the
    copies are plain NumPy copies.
    """

    def __init__(self, backend: Backend, like: Any, host: np.ndarray | None = None) -> None:
        self.backend = backend
        self.host = host_empty(backend, like.shape, like.dtype) if host is None else host
        if self.host.shape != like.shape or self.host.dtype != like.dtype:
            raise ValueError(f"host buffer {self.host.shape} {self.host.dtype} does not match "
                             f"{like.shape} {like.dtype}")
        self.seconds = 0.0
        self.copies = 0

    def pull(self, device: Any) -> np.ndarray:
        """Copy ``device`` into :attr:`host` (after the stream's queued work) and return it."""
        start = time.perf_counter()
        self.backend.synchronize()
        copy_to_host(self.backend, device, self.host)
        self._count(start)
        return self.host

    def push(self, device: Any) -> None:
        """Copy :attr:`host` into ``device``; complete on return (``host`` may be reused)."""
        start = time.perf_counter()
        copy_to_device(self.backend, self.host, device)
        self._count(start)

    def _count(self, start: float) -> None:
        self.seconds += time.perf_counter() - start
        self.copies += 1


# -- the communicator of the GPU backend ------------------------------------------------
@dataclass(eq=False)
class StagedRequest:
    """A staged nonblocking reduction: the device buffer, its pinned mirror, the event of
    the copy into the mirror, and the MPI request once posted (None before)."""

    buf: Any
    host: np.ndarray
    copied: CopyEvent
    request: MPI.Request | None = field(default=None)


class DeviceCommunicator(Communicator):
    """:class:`Communicator` for device buffers: direct when CUDA-aware, else staged.

    Staging copies are charged to the ``comm`` phase (they are part of the
    cost of communicating from a GPU) and added up in :attr:`staging`. A
    staged nonblocking request (a :class:`StagedRequest`, which this class's
    ``Test``/``Wait``/``Waitall`` take like an ``MPI.Request``) is posted as
    the module docstring says; its result is copied back to the device when
    :meth:`Test` sees it complete or :meth:`Wait`/:meth:`Waitall` returns.
    ``nonblocking_direct`` (``--cuda-aware-nonblocking yes``) hands device
    buffers to nonblocking collectives too when ``cuda_aware``.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        timer: PhaseTimer | None,
        backend: Backend,
        cuda_aware: bool,
        nonblocking_direct: bool = False,
        events: EventSink | None = None,
    ) -> None:
        super().__init__(comm, timer, events)
        self.backend, self.cuda_aware = backend, cuda_aware
        self.nonblocking_direct = cuda_aware and nonblocking_direct
        self.staging = Staging(backend)
        #: Staged requests not completed yet, in the order they were started.
        self._landing: list[StagedRequest] = []

    def _wire(self, buf: Any, send: bool = True) -> Any:
        """What a blocking call gets for ``buf``: itself (CUDA-aware) or its mirror."""
        self.backend.synchronize()
        if self.cuda_aware:
            return buf
        host = self.staging.mirror(buf, tuple(s.host for s in self._landing))
        if send:
            self.staging.to_host(buf, host)
        return host

    def _land(self, buf: Any, wire: Any) -> None:
        if wire is not buf:
            self.staging.to_device(wire, buf)

    # -- posting staged requests in order ---------------------------------------
    def _post(self, staged: StagedRequest) -> None:
        t = self._clock()  # an event's post is the MPI call's, after the staging copy
        staged.request = self.mpi_comm.Iallreduce(MPI.IN_PLACE, staged.host, op=MPI.SUM)
        self.outstanding.append(staged.request)
        self._posted(staged.request, staged.host.nbytes, t)

    def _post_ready(self) -> None:
        """Post the deferred requests whose copies are done, oldest first, stopping at
        the first whose copy is still running."""
        for staged in self._landing:
            if staged.request is None:
                if not staged.copied.done:
                    return
                self._post(staged)

    def _flush(self, upto: StagedRequest | None = None) -> None:
        """Post every deferred request (up to ``upto``), waiting for their copies."""
        with self.timer.phase("comm"):
            for staged in self._landing:
                if staged.request is None:
                    self.staging.wait_copy(staged.copied)
                    self._post(staged)
                if staged is upto:
                    return

    # -- collectives --------------------------------------------------------------
    def Allreduce(self, buf: Any) -> None:
        """In-place sum of ``buf`` over all ranks."""
        self._flush()
        t = self._clock()
        with self.timer.phase("comm"):
            wire = self._wire(buf)
            self.mpi_comm.Allreduce(MPI.IN_PLACE, wire, op=MPI.SUM)
            self._land(buf, wire)
        self._blocking("allreduce", buf.nbytes, t)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        self._flush()
        t = self._clock()
        with self.timer.phase("comm"):
            wire = self._wire(buf, send=self.rank == root)
            self.mpi_comm.Bcast(wire, root=root)
            if self.rank != root:
                self._land(buf, wire)
        self._blocking("bcast", buf.nbytes, t)

    def Barrier(self) -> None:
        self._flush()
        super().Barrier()

    def allreduce_scalar(self, value: float, op: MPI.Op | None = None) -> float:
        self._flush()
        return super().allreduce_scalar(value, op)

    def Iallreduce(self, buf: Any) -> Any:
        """Start an in-place sum of ``buf``: an ``MPI.Request`` when direct, else a
        :class:`StagedRequest` whose result lands on the device when it completes."""
        defer = self.timer.current == "compute"
        if self.nonblocking_direct:
            self._flush()
            t = self._clock()
            with self.timer.phase("comm"):
                self.backend.synchronize()
                req = self.mpi_comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            self.outstanding.append(req)
            self._posted(req, buf.nbytes, t)
            return req
        with self.timer.phase("comm"):
            host = self.staging.mirror(buf, tuple(s.host for s in self._landing))
            staged = StagedRequest(buf, host, self.staging.to_host_async(buf, host))
            self._landing.append(staged)
            if defer:
                self._post_ready()
        if not defer:
            self._flush(staged)
        return staged

    def poll(self) -> None:
        """Post deferred requests whose copies are done, then drive progress (``Testall``)."""
        if any(s.request is None for s in self._landing):
            with self.timer.phase("comm"):
                self._post_ready()
        super().poll()

    def Test(self, req: Any) -> bool:
        if isinstance(req, StagedRequest):
            with self.timer.phase("comm"):
                self._post_ready()
            if req.request is None:
                return False
            done = super().Test(req.request)
            if done:
                self._complete(req)
            return done
        return super().Test(req)

    def Wait(self, req: Any) -> None:
        if isinstance(req, StagedRequest):
            self._flush(req)
            super().Wait(req.request)
            self._complete(req)
        else:
            super().Wait(req)

    def Waitall(self, reqs: list[Any]) -> None:
        staged = [r for r in reqs if isinstance(r, StagedRequest)]
        landing = [r for r in staged if r in self._landing]  # not completed yet
        if landing:
            self._flush(max(landing, key=self._landing.index))
        super().Waitall([r.request if isinstance(r, StagedRequest) else r for r in reqs])
        for req in staged:
            self._complete(req)

    def _complete(self, staged: StagedRequest) -> None:
        """Copy a completed staged request's result back to its device buffer (once)."""
        for index, pending in enumerate(self._landing):
            if pending is staged:
                del self._landing[index]
                with self.timer.phase("comm"):
                    self._land(staged.buf, staged.host)
                return
