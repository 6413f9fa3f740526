"""The compiled CPU kernels (``kernels/cpu/*.c``): built for this core on first use, run by ctypes.

The CPU convolution's NumPy path (:mod:`syncbench.kernels.cpu_conv`) copies
every window into a column matrix and multiplies it with BLAS; on a ResNet's
3 x 3 convolutions the copies and the GEMMs' poor shapes (16 to 64 rows) cost
as much again as the multiply-adds (docs/RESULTS.md). ``kernels/cpu/conv.c``
is a direct convolution on the same (C, H, W, N) layout that reads the
windows where they lie. As the CUDA sources are compiled at run time by NVRTC,
it is compiled at run time by the C compiler (``$CC``, else ``cc``) with
``-O3 -march=native``, once per source, flags, compiler and core: the shared
library is kept under ``$SYNCBENCH_CACHE`` (default ``~/.cache/syncbench``),
named by a hash of all four, written to a temporary name and renamed into
place, so ranks starting together never load half a file.

Where no compiler works, or ``SYNCBENCH_CPU_KERNELS=numpy`` is set (an A/B
of the two paths, the equivalence tests), :func:`library` returns ``None``
and the layers use the NumPy path; :func:`status` says which and why (the
``speed`` header prints it). The NumPy path stays the reference: every
compiled kernel is tested against it (tests/test_cpu_native.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

#: ``SYNCBENCH_CPU_KERNELS``: ``native`` (default: compiled where a compiler works) or
#: ``numpy`` (the NumPy path everywhere).
MODE_VARIABLE = "SYNCBENCH_CPU_KERNELS"
SOURCES = Path(__file__).resolve().parent / "cpu"
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fPIC", "-shared", "-fno-math-errno")
#: The direct kernels take samples by vectors of this many floats (kernels/cpu/conv.c).
LANES = 16
_SIZE = ctypes.c_size_t
_PTR = ctypes.c_void_p
_INT = ctypes.c_int

_reason = "not loaded yet"


def compiler() -> str | None:
    """The C compiler: ``$CC`` or ``cc`` (``gcc``), if on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def cache_dir() -> Path:
    """Where built libraries are kept: ``$SYNCBENCH_CACHE`` or ``~/.cache/syncbench``."""
    root = os.environ.get("SYNCBENCH_CACHE") or Path.home() / ".cache" / "syncbench"
    return Path(root) / "cpu-kernels"


def _cpu_id() -> str:
    """The core's model and flags: -march=native code is only valid on such a core."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(lines[:2])


def _build(source: Path, cc: str) -> Path:
    """Compile ``source`` into the cache (if not there yet) and return the library."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                             check=False).stdout
    key = hashlib.sha256("\0".join([source.read_text(), " ".join(FLAGS), version,
                                    _cpu_id()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *FLAGS, "-o", partial, str(source)], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise OSError(f"{cc} failed on {source.name}: {proc.stderr.strip()[:500]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """``kernels/cpu/conv.c`` built and loaded, or ``None`` (NumPy path; :func:`status`)."""
    global _reason
    if os.environ.get(MODE_VARIABLE, "native") == "numpy":
        _reason = f"{MODE_VARIABLE}=numpy"
        return None
    cc = compiler()
    if cc is None:
        _reason = "no C compiler (cc, gcc or $CC) on PATH"
        return None
    try:
        lib = ctypes.CDLL(str(_build(SOURCES / "conv.c", cc)))
    except OSError as err:
        _reason = str(err)
        return None
    lib.sb_conv_forward.argtypes = [_PTR] * 5 + [_INT] * 9
    lib.sb_conv_forward.restype = None
    lib.sb_conv_weight_grad.argtypes = [_PTR] * 5 + [_INT] * 9
    lib.sb_conv_weight_grad.restype = None
    _reason = f"compiled with {cc} {' '.join(FLAGS[:2])}"
    return lib


def status() -> str:
    """Which convolution path the CPU layers take, and why: ``native (...)`` or ``numpy (...)``."""
    lib = library()
    return f"{'native' if lib is not None else 'numpy'} ({_reason})"


def usable(n: int, dtype: np.dtype) -> bool:
    """Whether the direct kernels take a batch of ``n`` samples of ``dtype``: float32, ``n``
    a multiple of :data:`LANES`, and the library built."""
    return dtype == np.float32 and n % LANES == 0 and library() is not None


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def pack_weights(weight: np.ndarray, out: np.ndarray) -> np.ndarray:
    """(K, C, k, k) weights into ``out``, ((K + 3) // 4, C, k, k, 4), zero past K: the layout
    the forward kernel broadcasts from (4 output channels' weights of one tap together)."""
    k_out, taps = weight.shape[0], weight[0].size
    full = k_out // 4 * 4
    blocks = out.reshape(out.shape[0], taps, 4)
    if full:
        np.copyto(blocks[: full // 4], weight[:full].reshape(full // 4, 4, taps).transpose(0, 2, 1))
    if full < k_out:
        blocks[-1].fill(0)
        np.copyto(blocks[-1][:, : k_out - full], weight[full:].reshape(k_out - full, taps).T)
    return out


def packed_shape(weight_shape: tuple[int, int, int, int]) -> tuple[int, ...]:
    k_out, c, k, _ = weight_shape
    return ((k_out + 3) // 4, c, k, k, 4)


def conv_forward(planes: np.ndarray, packed: np.ndarray, bias: np.ndarray | None,
                 out: np.ndarray, tap: np.ndarray, stride: int) -> None:
    """``out`` (K, OH, OW, N) = the convolution of zero-padded ``planes`` (C, Hp, Wp, N) by
    the :func:`pack_weights` of the (K, C, k, k) weights (+ ``bias``), stride ``stride``;
    ``tap`` holds C*k*k uintp window offsets (filled by the kernel)."""
    c, hp, wp, n = planes.shape
    k_out, oh, ow, _ = out.shape
    k = packed.shape[2]
    for a in (planes, packed, out) + ((bias,) if bias is not None else ()):
        assert a.flags.c_contiguous and a.dtype == np.float32
    assert tap.dtype == np.uintp and tap.size >= c * k * k
    library().sb_conv_forward(_ptr(planes), _ptr(packed), _ptr(bias), _ptr(out), _ptr(tap),
                              c, hp, wp, n, k_out, k, stride, oh, ow)


def weight_grad_work(c: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the float32 lane sums and the size_t tap offsets :func:`conv_weight_grad`
    needs for ``c`` input channels and a k x k kernel."""
    taps = c * k * k
    return ((taps + 5) // 6 * 6 * 4 * LANES,), (taps,)


def conv_weight_grad(planes: np.ndarray, dy: np.ndarray, dweight: np.ndarray,
                     work: np.ndarray, tap: np.ndarray, stride: int) -> None:
    """``dweight`` (K, C, k, k) = the sum over pixels and samples of ``dy`` (K, OH, OW, N)
    times the windows of ``planes`` (C, Hp, Wp, N); ``work`` and ``tap`` as
    :func:`weight_grad_work` says (float32, uintp)."""
    c, hp, wp, n = planes.shape
    k_out, oh, ow, _ = dy.shape
    k = dweight.shape[2]
    for a in (planes, dy, dweight, work):
        assert a.flags.c_contiguous and a.dtype == np.float32
    assert tap.dtype == np.uintp and tap.size >= c * k * k
    library().sb_conv_weight_grad(_ptr(planes), _ptr(dy), _ptr(dweight), _ptr(work),
                                  _ptr(tap), c, hp, wp, n, k_out, k, stride, oh, ow)
