"""How the CUDA kernels of ``kernels/cuda/*.cu`` are built and launched.

The sources are compiled by CuPy (``cupy.RawModule``, NVRTC) once per
precision with ``-DSB_REAL=float`` or ``-DSB_REAL=double`` and
``--fmad=false`` (no fused multiply-add, so element-wise kernels round
exactly like their NumPy references; CuPy also adds ``-ftz=true``, which
flushes float32 subnormals to zero, the one difference). The text compiled
carries the digest of the headers (:func:`module_source`), so CuPy's kernel
disk cache never serves a kernel built from an older ``common.cuh``.

Launch rules: 1-D grids of :data:`BLOCK` threads, at most :data:`MAX_BLOCKS`
blocks; every kernel is a grid-stride loop whose elements are each written
by one thread (no shared memory, atomics or barriers), so the result does
not depend on the launch shape. Kernels run on CuPy's current stream, in
order with CuPy's own operations; whoever hands a buffer to MPI synchronizes
first (:mod:`syncbench.algorithms.device_buffers`).

Each kernel's parameter types are read from its ``extern "C" __global__``
declaration (:func:`kernel_signatures`), which tells a launch which source
to build and lets the host emulator check every argument. The launcher is
pluggable (:func:`use_launcher`): the default compiles and launches with
CuPy; the tests plug in :class:`syncbench.kernels.compile_check.HostEmulator`,
which runs the same sources, built as C++, on NumPy arrays. CuPy is
imported only inside :class:`CupyLauncher`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

KERNEL_DIR = Path(__file__).resolve().parent / "cuda"
#: Threads per block of every launch.
BLOCK = 256
#: Upper bound on blocks per launch (grid-stride loops cover the rest).
MAX_BLOCKS = 4096
#: NVRTC/nvcc options shared by every build of the sources (plus -DSB_REAL).
COMPILE_OPTIONS: tuple[str, ...] = ("--fmad=false",)
#: Options ``cupy.RawModule`` adds by itself (CuPy 13/14, NVRTC backend);
#: ``compile_check`` adds them too so it builds what the GPU path builds.
CUPY_ADDED_OPTIONS: tuple[str, ...] = ("-ftz=true", "--device-as-default-execution-space")
#: NumPy dtype -> C type substituted for ``real``.
REAL_CTYPES: dict[np.dtype, str] = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')


# -- sources and signatures -----------------------------------------------------
def source_files(directory: Path = KERNEL_DIR) -> list[Path]:
    """Every ``.cu`` file of the kernel directory, sorted."""
    return sorted(directory.glob("*.cu"))


def header_digest(directory: Path = KERNEL_DIR) -> str:
    """SHA-256 of every header (``*.cuh``) of the kernel directory, names and texts."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.cuh")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def module_source(source: str, directory: Path = KERNEL_DIR) -> str:
    """The text compiled for ``source``.cu: the file with its headers' digest on line 1.

    CuPy's kernel disk cache (``~/.cupy/kernel_cache``) keys on the source
    string and the options only, not on files it ``#include``s; with the
    digest in the string, an edit of ``common.cuh`` (the precision typedef,
    the grid-stride loop) gives a new key instead of a stale kernel.
    """
    text = (directory / f"{source}.cu").read_text()
    return f"// syncbench headers sha256 {header_digest(directory)}\n{text}"


def compile_options(dtype: Any) -> tuple[str, ...]:
    """Compiler options of the ``dtype`` build of a source."""
    return (f"-DSB_REAL={REAL_CTYPES[np.dtype(dtype)]}", f"-I{KERNEL_DIR}", *COMPILE_OPTIONS)


def _param_type(decl: str) -> str:
    """``const real* __restrict__ x`` -> ``real*``; ``long long n`` -> ``long long``."""
    words = decl.replace("*", " * ").split()
    words = [w for w in words if w not in ("const", "__restrict__")]
    pointer = "*" in words
    base = " ".join(w for w in words[:-1] if w != "*")
    return base + "*" if pointer else base


@dataclass(frozen=True)
class KernelSignature:
    """A kernel's source file (stem) and its parameter types (``real`` left symbolic)."""

    source: str
    params: tuple[str, ...]


def parse_signatures(text: str, source: str) -> dict[str, KernelSignature]:
    """The ``extern "C" __global__`` kernels declared in one source text."""
    found = {}
    for name, params in _KERNEL_RE.findall(text):
        types = tuple(_param_type(p) for p in params.split(",") if p.strip())
        found[name] = KernelSignature(source, types)
    return found


@functools.lru_cache(maxsize=1)
def kernel_signatures() -> dict[str, KernelSignature]:
    """name -> signature for every kernel of :data:`KERNEL_DIR` (names are unique)."""
    table: dict[str, KernelSignature] = {}
    for path in source_files():
        for name, sig in parse_signatures(path.read_text(), path.stem).items():
            if name in table:
                raise ValueError(f"kernel {name} defined in {table[name].source}.cu and {path}")
            table[name] = sig
    return table


# -- launchers ------------------------------------------------------------------
class Launcher(Protocol):
    """Runs kernel ``kernel`` of ``source`` (a file stem) built for ``dtype``."""

    def __call__(
        self, source: str, kernel: str, dtype: np.dtype, grid: int, block: int, args: tuple
    ) -> None: ...


class CupyLauncher:
    """Compiles each source once per dtype with ``cupy.RawModule`` and launches on the
    current stream."""

    def __init__(self) -> None:
        self._modules: dict[tuple[str, np.dtype], Any] = {}
        self._functions: dict[tuple[str, np.dtype], Any] = {}

    def function(self, source: str, kernel: str, dtype: np.dtype) -> Any:
        """The compiled ``cupy.RawKernel`` (cached)."""
        key = (kernel, dtype)
        fn = self._functions.get(key)
        if fn is None:
            module = self._modules.get((source, dtype))
            if module is None:
                import cupy  # lazy: only the GPU path has CuPy

                module = cupy.RawModule(code=module_source(source),
                                        options=compile_options(dtype))
                self._modules[(source, dtype)] = module
            fn = self._functions[key] = module.get_function(kernel)
        return fn

    def precompile(self, dtype: np.dtype) -> None:
        """Compile every kernel of every source for ``dtype`` now (NVRTC, or the disk cache)."""
        for kernel, signature in kernel_signatures().items():
            self.function(signature.source, kernel, np.dtype(dtype))

    def __call__(
        self, source: str, kernel: str, dtype: np.dtype, grid: int, block: int, args: tuple
    ) -> None:
        self.function(source, kernel, dtype)((grid,), (block,), args)


_launcher: Launcher | None = None


def get_launcher() -> Launcher:
    """The launcher in use (a :class:`CupyLauncher` unless :func:`use_launcher` says otherwise)."""
    global _launcher
    if _launcher is None:
        _launcher = CupyLauncher()
    return _launcher


@contextmanager
def use_launcher(launcher: Launcher) -> Iterator[Launcher]:
    """Launch through ``launcher`` inside the block (tests: the host emulator)."""
    global _launcher
    previous = _launcher
    _launcher = launcher
    try:
        yield launcher
    finally:
        _launcher = previous


def grid_size(work: int) -> int:
    """Blocks for ``work`` elements: one thread each, at most :data:`MAX_BLOCKS` blocks."""
    return max(1, min(math.ceil(work / BLOCK), MAX_BLOCKS))


def precompile(dtype: Any) -> None:
    """Compile every kernel for ``dtype`` before training (the untimed warm-up), when the
    launcher compiles (CuPy); the host emulator builds on first use anyway."""
    launcher = get_launcher()
    if hasattr(launcher, "precompile"):
        launcher.precompile(np.dtype(dtype))


def launch(kernel: str, dtype: np.dtype, work: int, *args: Any) -> None:
    """Run ``kernel`` of its source over ``work`` elements (nothing for none) with ``args``,
    through the launcher in use, on a grid of :func:`grid_size` blocks of :data:`BLOCK`."""
    if work <= 0:
        return
    source = kernel_signatures()[kernel].source
    get_launcher()(source, kernel, dtype, grid_size(work), BLOCK, args)
