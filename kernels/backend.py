"""Array backend selection: one ``xp`` module (NumPy or CuPy) per run.

The backend is chosen once from ``--device auto|cpu|gpu``. Everything that
allocates arrays takes the :class:`Backend` (or its ``xp``) instead of
importing NumPy directly, so the same layers and algorithms run on either.
CuPy is imported only when a GPU is asked for or probed, never on the CPU path.

A GPU is chosen only after it has run something (:func:`probe_gpu`): a
trivial kernel compiled with NVRTC and a tiny ``cupy.matmul`` (cuBLAS), so a
machine whose driver works but whose NVRTC or cuBLAS does not load falls back
to the CPU under ``--device auto`` (and fails with one clear line under
``--device gpu``) instead of failing at the first step.

CuPy 13 and 14 are supported, as ``cupy-cuda12x`` (CUDA 12, the ``[gpu]``
extra) or ``cupy-cuda13x`` (CUDA 13, ``[gpu-cuda13]``); :func:`cupy_distribution`
names the one installed (what run files record as ``cupy_package`` and
``cupy_version``). CUDA libraries from the NVIDIA wheels of that CUDA major
are loaded first (:func:`preload_cuda_wheels`): CuPy 13's extension modules
link ``libnvrtc.so.12`` and ``libcublas.so.12`` by name, which the loader
does not find under ``site-packages/nvidia``; CuPy 14 finds them itself
(``cuda-pathfinder``), and the preload changes nothing there.

The device is bound before MPI starts (:func:`bind_before_mpi`, called by
the command line before ``mpi4py.MPI`` is imported): Open MPI's smcuda and
PSM2 transports allocate CUDA resources on the current device at
``MPI_Init``, device 0 unless a rank chose another.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

import numpy as np

DEVICES = ("auto", "cpu", "gpu")
#: Launcher variables that give a rank's index on its node, in the order they are read.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
#: Libraries of the NVIDIA wheels CuPy needs, per CUDA major, in load order (dependencies
#: first): the ``nvidia-*-cu12`` wheels (one folder per library) and the CUDA 13 ones
#: (``nvidia-cuda-runtime``, ``nvidia-cuda-nvrtc``, ``nvidia-cublas`` 13.x: ``nvidia/cu13``).
CUDA_WHEEL_LIBRARIES_BY_MAJOR: dict[int, tuple[str, ...]] = {
    12: ("nvidia/cuda_runtime/lib/libcudart.so.12",
         "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
         "nvidia/cublas/lib/libcublasLt.so.12",
         "nvidia/cublas/lib/libcublas.so.12"),
    13: ("nvidia/cu13/lib/libcudart.so.13",
         "nvidia/cu13/lib/libnvrtc.so.13",
         "nvidia/cu13/lib/libcublasLt.so.13",
         "nvidia/cu13/lib/libcublas.so.13"),
}
#: The CUDA 12 set (CuPy 13's ``cupy-cuda12x``), under its former name.
CUDA_WHEEL_LIBRARIES = CUDA_WHEEL_LIBRARIES_BY_MAJOR[12]
#: ``cupy-cuda12x``, ``cupy-cuda13x``...: CuPy's binary distributions, one per CUDA major.
_CUPY_WHEEL = re.compile(r"cupy[-_.]cuda(\d+)x")


class BackendError(RuntimeError):
    """The requested device cannot be used on this machine."""


@dataclass(frozen=True)
class Backend:
    """The array module of a run and the device it computes on."""

    name: str  # "numpy" or "cupy"
    xp: ModuleType
    device: str  # human-readable device description
    #: The physical GPU on its host (``pci:<bus id>``, else ``cuda:<index>``); "" on the CPU.
    #: Ranks of one host with the same id share one GPU (the machine context flags it).
    device_id: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.name == "cupy"

    def asarray(self, array: Any, dtype: Any = None) -> Any:
        """Move ``array`` to this backend's device (no copy when already there)."""
        return self.xp.asarray(array, dtype=dtype)

    def to_numpy(self, array: Any) -> np.ndarray:
        """A host NumPy view or copy of ``array``."""
        if self.is_gpu:
            return self.xp.asnumpy(array)
        return np.asarray(array)

    def synchronize(self) -> None:
        """Wait for queued device work; a no-op on the CPU."""
        if self.is_gpu:
            self.xp.cuda.get_current_stream().synchronize()


def numpy_backend() -> Backend:
    """The CPU backend."""
    return Backend("numpy", np, "cpu")


def env_local_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This rank's index on its node from the launcher's environment, or None.

    Read before MPI starts: ``OMPI_COMM_WORLD_LOCAL_RANK`` (Open MPI),
    ``MPI_LOCALRANKID`` (MPICH's Hydra), ``SLURM_LOCALID`` (srun), the first
    one set to an integer.
    """
    environ = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def cupy_cuda_major(dist: str) -> int | None:
    """The CUDA major a CuPy distribution is built for (``cupy-cuda13x`` -> 13), else None
    (``cupy`` built from source, ``cupy-rocm-*``)."""
    match = _CUPY_WHEEL.fullmatch(dist.strip().lower())
    return int(match.group(1)) if match else None


def cupy_distribution(
    module: Any = None,
    owners: Mapping[str, Sequence[str]] | None = None,
    version_of: Callable[[str], str] | None = None,
) -> tuple[str, str]:
    """``(distribution, version)`` of the installed CuPy, e.g. ``("cupy-cuda13x", "14.2.0")``;
    ``("", "")`` without one.

    The distributions that install the ``cupy`` package (``owners``: what
    ``importlib.metadata.packages_distributions()`` maps ``"cupy"`` to) whatever
    their name (``cupy-cuda12x``, ``cupy-cuda13x``, ``cupy``, ``cupy-rocm-*``).
    With the imported ``module``, the one whose version is its ``__version__``
    wins (two installed side by side: the one Python imports); a module no
    distribution installed (a source tree on the path) is ``("cupy", its version)``.
    ``version_of`` is ``importlib.metadata.version`` unless given (tests).
    """
    version_of = version_of or metadata.version
    if owners is None and module is None and importlib.util.find_spec("cupy") is None:
        # no cupy package on the path: no distribution to name (a scan of every
        # installed distribution's file list costs half a second of each run's start)
        return ("", "")
    if owners is None:
        try:
            owners = metadata.packages_distributions()
        except Exception:  # a broken distribution's metadata: say nothing rather than fail
            owners = {}
    found: list[tuple[str, str]] = []
    for name in sorted(dict.fromkeys(owners.get("cupy", ()))):
        try:
            found.append((name, version_of(name)))
        except metadata.PackageNotFoundError:
            continue
    imported = str(getattr(module, "__version__", "") or "") if module is not None else ""
    if imported:
        return next(((n, v) for n, v in found if v == imported), ("cupy", imported))
    # binary wheels before a source build, the newest CUDA first: what an import would
    # most likely find when several are installed
    found.sort(key=lambda nv: -(cupy_cuda_major(nv[0]) or 0))
    return found[0] if found else ("", "")


def preload_cuda_wheels(paths: list[str] | None = None, major: int | None = None) -> list[str]:
    """Load the CUDA libraries of installed NVIDIA wheels (global symbols).

    CuPy 13 opens ``libnvrtc.so.12`` and ``libcublas.so.12`` by name; the
    wheels put them under ``site-packages/nvidia/*/lib`` (CUDA 13's under
    ``nvidia/cu13/lib``), off the loader's path. A library already loaded under
    the same name is what a later ``dlopen`` by name returns. ``major``: the
    CUDA major of the installed CuPy (:func:`cupy_cuda_major` of
    :func:`cupy_distribution`) unless given; both sets when unknown. Returns
    the files loaded (none without the wheels: CuPy then finds a system CUDA
    toolkit as usual).
    """
    if major is None:
        major = cupy_cuda_major(cupy_distribution()[0])
    sets = [CUDA_WHEEL_LIBRARIES_BY_MAJOR[major]] if major in CUDA_WHEEL_LIBRARIES_BY_MAJOR \
        else list(CUDA_WHEEL_LIBRARIES_BY_MAJOR.values())
    loaded = []
    for relative in (lib for libs in sets for lib in libs):
        for site in paths if paths is not None else sys.path:
            found = glob.glob(os.path.join(site or ".", relative))
            if found:
                try:
                    ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
                    loaded.append(found[0])
                except OSError:
                    pass
                break
    return loaded


def cupy_cache_untrusted() -> str:
    """Why CuPy's kernel disk cache (``$CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``)
    could hold kernels another user planted, else "": the folder (or, before CuPy makes
    it, its parent) belongs to another user or others may write to it. CuPy loads a
    cached kernel by a hash of public inputs (source, options, GPU), checking only its
    own checksum, as :mod:`.cpu_native` would a library (its docstring)."""
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "").strip() == "1":  # CuPy's test
        return ""
    folder = os.environ.get("CUPY_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cupy", "kernel_cache")
    for path in (folder, os.path.dirname(os.path.abspath(folder))):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid != os.geteuid():
            return f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        if st.st_mode & 0o022:
            return f"{path} is writable by its group or others (mode {st.st_mode & 0o7777:04o})"
        return ""
    return ""


@functools.lru_cache(maxsize=1)
def _import_cupy() -> ModuleType | None:
    """CuPy, imported after the wheels' CUDA libraries; None (nothing loaded) without it.

    Cached per process: the wheels are searched and loaded once, however many of
    :func:`bind_before_mpi`, :func:`select_backend` and :func:`probe_gpu` ask.
    """
    if importlib.util.find_spec("cupy") is None:
        return None
    preload_cuda_wheels()
    untrusted = cupy_cache_untrusted()
    if untrusted:  # kernels in memory only (one line)
        os.environ["CUPY_CACHE_IN_MEMORY"] = "1"
        print(f"syncbench: CuPy's kernel cache not used: {untrusted}", file=sys.stderr,
              flush=True)
    try:
        import cupy  # lazy: after the preload, and only where a GPU is asked for
    except Exception:  # ImportError, or a broken CUDA install
        return None
    return cupy


#: The probe kernel: NVRTC compiles it, the device runs it.
_PROBE_SOURCE = 'extern "C" __global__ void sb_probe(float* x) { x[threadIdx.x] = threadIdx.x; }'


@functools.lru_cache(maxsize=1)
def probe_gpu() -> tuple[ModuleType | None, str]:
    """``(cupy, "")`` if the current GPU runs a kernel and a GEMM, else ``(None, reason)``.

    Launches a trivial NVRTC-compiled kernel and a 4x4 ``cupy.matmul``
    (cuBLAS) and checks both results, so every library a training step uses
    has loaded. Cached per process (the first call binds nothing: call it
    after choosing the device).
    """
    cupy = _import_cupy()
    if cupy is None:
        return None, "CuPy is not installed or does not import"
    try:
        if not cupy.cuda.is_available():
            return None, "cupy.cuda.is_available() is False (no GPU or no driver)"
        x = cupy.zeros(32, dtype=cupy.float32)
        cupy.RawKernel(_PROBE_SOURCE, "sb_probe")((1,), (32,), (x,))
        product = cupy.ones((4, 4), dtype=cupy.float32) @ cupy.ones((4, 4), dtype=cupy.float32)
        cupy.cuda.get_current_stream().synchronize()
        if x.get().tolist() != list(range(32)) or float(product.sum().get()) != 64.0:
            return None, "the probe kernel or GEMM gave a wrong result"
    except Exception as exc:  # NVRTC, cuBLAS or the driver failed to load or run
        return None, f"probe failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
    return cupy, ""


def _bind(cupy: ModuleType, local: int) -> int | None:
    """Make GPU ``local % count`` current and return its index; None when none is counted.

    A failing device count reads as no GPU; a failing bind raises (each caller
    handles it its own way).
    """
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return None
    if count < 1:
        return None
    cupy.cuda.Device(local % count).use()
    return local % count


def _cupy_if_available() -> ModuleType | None:
    """CuPy when a GPU passes :func:`probe_gpu`, else None."""
    return probe_gpu()[0]


def bind_before_mpi(device: str, environ: Mapping[str, str] | None = None) -> int | None:
    """Make GPU ``local rank % count`` current before MPI starts; returns it, or None.

    Does nothing for ``--device cpu`` or when no launcher variable gives the
    local rank (:func:`env_local_rank`): :func:`select_backend` then binds
    after ``MPI_Init`` from the shared-memory communicator, as before. Never
    raises: a GPU problem is reported by :func:`select_backend`.
    """
    local = env_local_rank(environ)
    if device == "cpu" or local is None:
        return None
    cupy = _import_cupy()
    if cupy is None:
        return None
    try:
        return _bind(cupy, local)
    except Exception:
        return None


def select_backend(device: str = "auto", local_rank: int = 0) -> Backend:
    """Pick the backend for ``device`` and bind GPU ranks to ``local_rank % count``.

    The launcher's local rank (:func:`env_local_rank`) wins over ``local_rank``
    when set, so the binding agrees with :func:`bind_before_mpi`. ``auto``
    takes the GPU when it passes :func:`probe_gpu`, else the CPU; ``gpu``
    without a usable GPU raises :class:`BackendError` saying why.
    """
    if device not in DEVICES:
        raise BackendError(f"unknown --device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cpu":
        return numpy_backend()
    cupy = _import_cupy()
    if cupy is not None:
        local = env_local_rank()
        _bind(cupy, local_rank if local is None else local)
    cupy, reason = probe_gpu() if cupy is not None else (None, "CuPy is not installed")
    if cupy is None:
        if device == "gpu":
            raise BackendError(
                f"--device gpu: no usable CUDA GPU ({reason}); install syncbench[gpu] on a "
                "GPU machine or use --device cpu"
            )
        return numpy_backend()
    index = cupy.cuda.Device().id
    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    if isinstance(name, bytes):
        name = name.decode()
    return Backend("cupy", cupy, f"cuda:{index} {name}", gpu_identity(cupy, index))


def gpu_identity(cupy: Any, index: int) -> str:
    """The physical GPU ``index`` is on this host: ``pci:<bus id>`` (the same GPU whatever
    ``CUDA_VISIBLE_DEVICES`` numbers it), else ``cuda:<index>``."""
    try:
        bus = cupy.cuda.Device(index).pci_bus_id
    except Exception:  # an older CuPy, or a driver that does not say
        bus = ""
    return f"pci:{str(bus).lower()}" if bus else f"cuda:{index}"
