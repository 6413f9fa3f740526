"""Array backend selection: one ``xp`` module (NumPy or CuPy) per run.

The backend is chosen once from ``--device auto|cpu|gpu``. Everything that
allocates arrays takes the :class:`Backend` (or its ``xp``) instead of
importing NumPy directly, so the same layers and algorithms run on either.
CuPy is imported only when a GPU is asked for or probed, never on the CPU path.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

DEVICES = ("auto", "cpu", "gpu")


class BackendError(RuntimeError):
    """The requested device cannot be used on this machine."""


@dataclass(frozen=True)
class Backend:
    """The array module of a run and the device it computes on."""

    name: str  # "numpy" or "cupy"
    xp: ModuleType
    device: str  # human-readable device description

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


def _cupy_if_available() -> ModuleType | None:
    try:
        import cupy  # noqa: PLC0415 - optional dependency, GPU path only
    except Exception:  # ImportError, or a broken CUDA install
        return None
    try:
        return cupy if cupy.cuda.is_available() else None
    except Exception:
        return None


def select_backend(device: str = "auto", local_rank: int = 0) -> Backend:
    """Pick the backend for ``device`` and bind GPU ranks to ``local_rank % count``.

    ``auto`` takes the GPU when CuPy sees one, else the CPU; ``gpu`` without a
    usable GPU raises :class:`BackendError`.
    """
    if device not in DEVICES:
        raise BackendError(f"unknown --device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cpu":
        return numpy_backend()
    cupy = _cupy_if_available()
    if cupy is None:
        if device == "gpu":
            raise BackendError(
                "--device gpu: no usable CUDA GPU (CuPy missing or cupy.cuda.is_available() is "
                "False); install syncbench[gpu] on a GPU machine or use --device cpu"
            )
        return numpy_backend()
    count = cupy.cuda.runtime.getDeviceCount()
    index = local_rank % count
    cupy.cuda.Device(index).use()
    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    if isinstance(name, bytes):
        name = name.decode()
    return Backend("cupy", cupy, f"cuda:{index} {name}")
