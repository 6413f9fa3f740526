"""GPU buffers at the MPI boundary: CUDA-aware pass-through or pinned host staging.

The rule (``DESIGN.md``, "Key decisions"): on the GPU backend a model's flat
buffers are CuPy arrays. When the MPI library is CUDA-aware they are handed
to mpi4py as they are (mpi4py reads ``__cuda_array_interface__``); otherwise
every MPI call goes through a pinned host mirror of the buffer: device ->
host copy, the MPI call on the mirror, host -> device copy when the data is
final (at once for blocking calls, when the request completes for
nonblocking ones). Either way the current CUDA stream is synchronized before
a buffer is handed to MPI, because kernels are asynchronous and MPI knows
nothing of streams. Completing calls (``Test``, ``Wait``) hand MPI no new
buffer and do not synchronize, so polling between layers does not stall the
GPU's queue.

``--cuda-aware yes|no|auto`` (:func:`detect_cuda_aware`): ``auto`` asks the
library (``MPIX_Query_cuda_support()``, through mpi4py if it exposes it, else
the symbol in the MPI library mpi4py loaded; Open MPI and MPICH >= 4 have it),
and only where the library has no such query, known settings in the
environment (``MPICH_GPU_SUPPORT_ENABLED=1`` on Cray MPICH, ``MV2_USE_CUDA=1``
on MVAPICH2, ``OMPI_MCA_opal_cuda_support=true``). Otherwise: no (staging),
which always works; the PyPI MPI wheels are not CUDA-aware.

One-sided windows stay in host memory: :class:`HostMirror` copies device
parameters to and from a host buffer (a window's memory, say) and counts the
copy time. Nothing here imports CuPy on the CPU backend, and the CPU path
keeps the plain :class:`~syncbench.algorithms.communicator.Communicator`
(:func:`make_communicator`), so it pays nothing for any of this.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from syncbench.algorithms.communicator import Communicator
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
        import cupyx  # noqa: PLC0415 - GPU path only

        return cupyx.empty_pinned(shape, dtype=dtype)
    return np.empty(shape, dtype=dtype)


def copy_to_host(backend: Backend, device: Any, host: np.ndarray) -> None:
    """``host[...] = device``, complete when it returns (synchronous on the stream)."""
    if backend.is_gpu:
        device.get(out=host)
    else:
        np.copyto(host, device)


def copy_to_device(backend: Backend, host: np.ndarray, device: Any) -> None:
    """``device[...] = host``, complete when it returns."""
    if backend.is_gpu:
        device.set(host)
    else:
        np.copyto(device, host)


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
        """Copy :attr:`host` into ``device``."""
        start = time.perf_counter()
        copy_to_device(self.backend, self.host, device)
        self._count(start)

    def _count(self, start: float) -> None:
        self.seconds += time.perf_counter() - start
        self.copies += 1


# -- the communicator of the GPU backend ------------------------------------------------
class DeviceCommunicator(Communicator):
    """:class:`Communicator` for device buffers: direct when CUDA-aware, else staged.

    Staging copies are charged to the ``comm`` phase (they are part of the
    cost of communicating from a GPU) and added up in :attr:`staging`. A
    staged nonblocking request's result is copied back to the device when
    :meth:`Test` sees it complete or :meth:`Wait`/:meth:`Waitall` returns.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        timer: PhaseTimer | None,
        backend: Backend,
        cuda_aware: bool,
    ) -> None:
        super().__init__(comm, timer)
        self.backend, self.cuda_aware = backend, cuda_aware
        self.staging = Staging(backend)
        self._landing: list[tuple[MPI.Request, Any, np.ndarray]] = []

    def _wire(self, buf: Any, send: bool = True) -> Any:
        """What MPI gets for ``buf``: itself (CUDA-aware) or its mirror, filled if ``send``."""
        self.backend.synchronize()
        if self.cuda_aware:
            return buf
        host = self.staging.mirror(buf, tuple(m for _, _, m in self._landing))
        if send:
            self.staging.to_host(buf, host)
        return host

    def _land(self, buf: Any, wire: Any) -> None:
        if wire is not buf:
            self.staging.to_device(wire, buf)

    def Allreduce(self, buf: Any) -> None:
        """In-place sum of ``buf`` over all ranks."""
        with self.timer.phase("comm"):
            wire = self._wire(buf)
            self.comm.Allreduce(MPI.IN_PLACE, wire, op=MPI.SUM)
            self._land(buf, wire)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        with self.timer.phase("comm"):
            wire = self._wire(buf, send=self.rank == root)
            self.comm.Bcast(wire, root=root)
            if self.rank != root:
                self._land(buf, wire)

    def Iallreduce(self, buf: Any) -> MPI.Request:
        """Start an in-place sum of ``buf``; a staged result lands when the request completes."""
        with self.timer.phase("comm"):
            wire = self._wire(buf)
            req = self.comm.Iallreduce(MPI.IN_PLACE, wire, op=MPI.SUM)
        self.outstanding.append(req)
        if wire is not buf:
            self._landing.append((req, buf, wire))
        return req

    def Test(self, req: MPI.Request) -> bool:
        done = super().Test(req)
        if done:
            self._forget(req)
            self._complete(req)
        return done

    def Wait(self, req: MPI.Request) -> None:
        super().Wait(req)
        self._complete(req)

    def Waitall(self, reqs: list[MPI.Request]) -> None:
        super().Waitall(reqs)
        for req in reqs:
            self._complete(req)

    def _complete(self, req: MPI.Request) -> None:
        """Copy a completed staged request's result back to its device buffer (once)."""
        for index, (pending, buf, wire) in enumerate(self._landing):
            if pending is req:
                del self._landing[index]
                with self.timer.phase("comm"):
                    self._land(buf, wire)
                return


def make_communicator(
    comm: MPI.Comm,
    timer: PhaseTimer | None,
    backend: Backend,
    cuda_aware: bool = False,
) -> Communicator:
    """The plain :class:`Communicator` on the CPU; a :class:`DeviceCommunicator` on the GPU."""
    if not backend.is_gpu:
        return Communicator(comm, timer)
    return DeviceCommunicator(comm, timer, backend, cuda_aware)
