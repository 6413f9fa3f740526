"""The compiled CPU kernels (``kernels/cpu/*.c``): built for this core on first use, run by ctypes.

The CPU convolution's NumPy path (:mod:`syncbench.kernels.cpu_conv`) copies
every window into a column matrix and multiplies it with BLAS; on a ResNet's
3 x 3 convolutions the copies and the GEMMs' poor shapes (16 to 64 rows) cost
as much again as the multiply-adds (docs/RESULTS.md). ``kernels/cpu/conv.c``
is a direct convolution on the same (C, H, W, N) layout that reads the
windows where they lie. The other sources are one-pass loops: BatchNorm's
(``norm.c``), the optimizers' (``optim.c``, ``adamw.c``), the transformer's GELU,
LayerNorm, causal softmax, embedding scatter and loss (``gelu.c``, ``layernorm.c``,
``softmax.c``, ``embedding.c``, ``xent.c``) and
the gradient codecs' (``codecs.c``: fp16, bf16, int8 and top-k's selection for
:mod:`syncbench.algorithms.codecs`, equal to its NumPy references to the bit). As
the CUDA sources are compiled at run time by NVRTC, the library is compiled at run
time by the C compiler (``$CC``, else ``cc``) with ``-O3 -march=native``, once per
source, flags, compiler and core: the shared library is kept under
``$SYNCBENCH_CACHE`` (default ``~/.cache/syncbench``), named by a hash of all four,
written to a temporary name and renamed into place, so ranks starting together
never load half a file.

The cache is trusted only as far as it is private (:func:`library`'s loader):
its folder (``cpu-kernels``) is made 0700; a library is loaded only if that
folder and the file belong to this user and neither is writable by its group
or others, and if the file's bytes have the SHA-256 that the builder recorded
beside it (``cpu-<key>.so.sha256``). The checks and the load are made on one
open file (``O_NOFOLLOW``; the owner, mode and hash from the descriptor, then
``dlopen`` of ``/proc/self/fd/N``), so the file cannot be swapped in between. A
library that fails them is not loaded, but rebuilt (one line on stderr, once);
a folder that fails them is not used: the kernels are built in a private
temporary folder for this process only (one line). The key is a hash of public
inputs, so without these checks anyone who could write to the folder (a shared
``$SYNCBENCH_CACHE``, another user's ``~/.cache`` under ``sudo -E``) could
plant a library whose constructor runs as whoever loads it.

Where no compiler works, or ``SYNCBENCH_CPU_KERNELS=numpy`` is set (an A/B
of the two paths, the equivalence tests), :func:`library` returns ``None``
and the layers use the NumPy path; :func:`status` says which and why (the
``speed`` header prints it). The NumPy path stays the reference: every
compiled kernel is tested against it (tests/unit/test_cpu_native.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: ``SYNCBENCH_CPU_KERNELS``: ``auto`` (default: compiled where a compiler works, but the
#: direct convolutions only on a core with AVX-512, :func:`direct_convolutions`),
#: ``native`` (compiled everywhere) or ``numpy`` (the NumPy path everywhere).
MODE_VARIABLE = "SYNCBENCH_CPU_KERNELS"
SOURCES = Path(__file__).resolve().parent / "cpu"
FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fPIC", "-shared", "-fno-math-errno")
#: The direct kernels take samples by vectors of this many floats (kernels/cpu/conv.c).
LANES = 16
_SIZE = ctypes.c_size_t
_PTR = ctypes.c_void_p
_INT = ctypes.c_int

#: The file beside each cached library holding the SHA-256 (hex) of the bytes built.
DIGEST_SUFFIX = ".sha256"

_reason = "not loaded yet"
#: Lines already printed (each at most once a process).
_said: set[str] = set()
#: Descriptors of the loaded libraries' files, kept open: ``dlopen`` knows each library
#: by its ``/proc/self/fd/N`` name, which must not come to name another file.
_held_fds: list[int] = []
#: True: this process's layers take the NumPy path (an in-process A/B of the two,
#: tools/conv_ab.py ``native``); :data:`MODE_VARIABLE` does the same for a whole run.
numpy_only = False
#: None: :func:`direct_convolutions` decides; True or False: this process's
#: convolutions take the direct kernels or not (the equivalence tests).
direct_override: bool | None = None


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


def library_name(sources: list[Path], cc: str) -> str:
    """The cached library's file name: ``cpu-<key>.so``, ``key`` a hash of the sources
    (and the headers beside them), the flags, the compiler's version and the core."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                             check=False).stdout
    headers = sorted({h for src in sources for h in src.parent.glob("*.h")})  # included
    texts = [f"{src.name}\0{src.read_text()}" for src in [*sources, *headers]]
    key = hashlib.sha256("\0".join([*texts, " ".join(FLAGS), version,
                                    _cpu_id()]).encode()).hexdigest()[:16]
    return f"cpu-{key}.so"


class Untrusted(OSError):
    """A cache folder or file that could hold code another user planted; ``str()`` is
    one line naming it and why."""


def _say(line: str) -> None:
    """Print ``line`` on stderr, once a process."""
    if line not in _said:
        _said.add(line)
        print(f"syncbench: compiled CPU kernels: {line}", file=sys.stderr, flush=True)


def _check_private(st: os.stat_result, path: Path, kind: str) -> None:
    """Raise :class:`Untrusted` unless ``st`` (of ``path``) is a ``kind`` ("folder" or
    "file") of this user that neither its group nor others can write."""
    if not (stat.S_ISDIR if kind == "folder" else stat.S_ISREG)(st.st_mode):
        raise Untrusted(f"{path} is not a {'folder' if kind == 'folder' else 'regular file'}")
    if st.st_uid != os.geteuid():
        raise Untrusted(f"{kind} {path} belongs to uid {st.st_uid}, not to this user "
                        f"(uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise Untrusted(f"{kind} {path} is writable by its group or others "
                        f"(mode {stat.S_IMODE(st.st_mode):04o})")


def open_cache_dir(folder: Path | None = None) -> int:
    """The cache folder (:func:`cache_dir`), made 0700 where missing, opened (a descriptor
    to close) once checked: this user's, not a symbolic link, nobody else may write to it
    (:class:`Untrusted` otherwise). A folder of this user's that others may read is made
    0700."""
    folder = cache_dir() if folder is None else folder
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    for part in (folder.parent, folder):
        try:
            os.mkdir(part, 0o700)
        except FileExistsError:
            pass
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        if os.path.islink(folder):
            raise Untrusted(f"folder {folder} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        _check_private(st, folder, "folder")
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_private(dir_fd: int, folder: Path, name: str) -> tuple[int, bytes] | None:
    """(descriptor, bytes) of the file ``name`` of the folder ``dir_fd`` once checked
    (:func:`_check_private`; not a symbolic link), None if there is none."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise Untrusted(f"{folder / name} cannot be opened ({err.strerror})") from None
    try:
        _check_private(os.fstat(fd), folder / name, "file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return fd, b"".join(chunks)
    except BaseException:
        os.close(fd)
        raise


def _dlopen(fd: int, data: bytes) -> ctypes.CDLL:
    """Load the library open as ``fd`` (whose bytes are ``data``): that very file, through
    ``/proc/self/fd``, the descriptor then kept; without ``/proc``, a private copy of
    ``data``. Takes ``fd`` over."""
    proc = f"/proc/self/fd/{fd}"
    if os.path.exists(proc):
        try:
            lib = ctypes.CDLL(proc)
        except BaseException:
            os.close(fd)
            raise
        _held_fds.append(fd)
        return lib
    os.close(fd)
    with tempfile.TemporaryDirectory(prefix="syncbench-cpu-") as private:
        copy = Path(private) / "cpu.so"
        copy.write_bytes(data)
        return ctypes.CDLL(str(copy))


def _load_cached(dir_fd: int, folder: Path, name: str) -> ctypes.CDLL | None:
    """The cached library ``name``, checked (module docstring); None if there is none,
    :class:`Untrusted` if it fails a check."""
    found = _read_private(dir_fd, folder, name)
    if found is None:
        return None
    fd, data = found
    try:
        digest = _read_private(dir_fd, folder, name + DIGEST_SUFFIX)
        if digest is None:
            raise Untrusted(f"{folder / name} has no recorded SHA-256 "
                            f"({name}{DIGEST_SUFFIX})")
        os.close(digest[0])
        if digest[1].strip() != hashlib.sha256(data).hexdigest().encode():
            raise Untrusted(f"{folder / name} does not match its recorded SHA-256")
    except BaseException:
        os.close(fd)
        raise
    return _dlopen(fd, data)


def _compile(sources: list[Path], cc: str) -> bytes:
    """The library built from ``sources`` (in a private temporary folder): its bytes."""
    with tempfile.TemporaryDirectory(prefix="syncbench-cpu-build-") as private:
        out = os.path.join(private, "cpu.so")
        proc = subprocess.run([cc, *FLAGS, "-o", out, *map(str, sources)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise OSError(f"{cc} failed on {', '.join(s.name for s in sources)}: "
                          f"{proc.stderr.strip()[:500]}")
        return Path(out).read_bytes()


def _write_new(dir_fd: int, name: str, data: bytes, mode: int) -> tuple[int, str]:
    """``data`` in a new file of the folder ``dir_fd`` under a name nobody can predict
    (``O_EXCL``, ``mode``), synced: (a read-only descriptor of it, its name)."""
    partial = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        return os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=dir_fd), partial
    except BaseException:
        os.unlink(partial, dir_fd=dir_fd)
        raise


def _publish(dir_fd: int, name: str, data: bytes) -> int:
    """Put ``data`` in the cache as ``name``, its SHA-256 beside it first (each written
    under a temporary name, then renamed): a read-only descriptor of the library's file."""
    digest = hashlib.sha256(data).hexdigest().encode() + b"\n"
    fds = []
    try:
        for target, payload, mode in ((name + DIGEST_SUFFIX, digest, 0o644),
                                      (name, data, 0o755)):
            fd, partial = _write_new(dir_fd, target, payload, mode)
            fds.append(fd)
            try:
                os.replace(partial, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                os.unlink(partial, dir_fd=dir_fd)
                raise
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    os.close(fds[0])
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    return fds[1]


def _load_or_build(sources: list[Path], cc: str) -> tuple[ctypes.CDLL, str]:
    """The library of ``sources``: from the cache if it passes the checks, else built
    (into the cache; in a private folder if the cache is not usable). Also a word on
    where it came from for :func:`status` ("" for the cache)."""
    name = library_name(sources, cc)
    folder = cache_dir()
    try:
        dir_fd = open_cache_dir(folder)
    except Untrusted as err:
        _say(f"{err}: cache not used, the kernels are built for this process only")
        data = _compile(sources, cc)
        with tempfile.TemporaryDirectory(prefix="syncbench-cpu-") as private:
            path = Path(private) / name
            path.write_bytes(data)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            return _dlopen(fd, data), f"; not cached: {err}"
    try:
        try:
            lib = _load_cached(dir_fd, folder, name)
        except Untrusted as err:
            _say(f"{err}: not loaded, rebuilt")
            lib = None
        if lib is not None:
            return lib, ""
        data = _compile(sources, cc)
        return _dlopen(_publish(dir_fd, name, data), data), ""
    finally:
        os.close(dir_fd)


def _declare(lib: ctypes.CDLL) -> None:
    """Argument types of every kernel (kernels/cpu/*.c)."""
    signatures = {
        "sb_correlate": [_PTR, _SIZE, _SIZE, _PTR, _INT, _PTR, _PTR, _PTR] + [_SIZE] * 3
        + [_INT] * 4,
        "sb_conv_weight_grad": [_PTR] * 5 + [_INT] * 8,
        "sb_bn_sums_about": [_PTR] * 4 + [_INT, _SIZE],
        "sb_bn_affine": [_PTR] * 5 + [_INT, _SIZE],
        "sb_bn_grad_sums": [_PTR] * 4 + [_INT, _SIZE],
        "sb_bn_input_grad": [_PTR] * 7 + [_INT, _SIZE],
        "sb_gelu_forward_f32": [_PTR] * 3 + [_SIZE],
        "sb_gelu_backward_f32": [_PTR] * 4 + [_SIZE],
        "sb_layernorm_forward_f32": [_PTR] * 6 + [_SIZE, _SIZE, ctypes.c_float],
        "sb_layernorm_backward_f32": [_PTR] * 7 + [_SIZE, _SIZE],
        "sb_causal_softmax_f32": [_PTR, _PTR, _SIZE, _SIZE, ctypes.c_float],
        "sb_causal_softmax_backward_f32": [_PTR] * 3 + [_SIZE, _SIZE, ctypes.c_float],
        "sb_embedding_scatter_add_f32": [_PTR, _PTR, _SIZE, _SIZE, _PTR],
        "sb_sequence_xent_f32": [_PTR, _PTR, _SIZE, _SIZE, _PTR],
        "sb_sgd_momentum_f32": [_PTR] * 3 + [_SIZE] + [ctypes.c_float] * 2 + [_PTR]
        + [ctypes.c_float],
        "sb_sgd_momentum_f64": [_PTR] * 3 + [_SIZE] + [ctypes.c_double] * 2 + [_PTR]
        + [ctypes.c_double],
        "sb_adamw_f32": [_PTR] * 4 + [_SIZE, _PTR, ctypes.c_float, _INT]
        + [ctypes.c_float] * 7,
        "sb_adamw_f64": [_PTR] * 4 + [_SIZE, _PTR, ctypes.c_double, _INT]
        + [ctypes.c_double] * 7,
        "sb_f16_encode": [_PTR, _PTR, _SIZE],
        "sb_f16_decode": [_PTR, _PTR, _SIZE],
        "sb_bf16_encode": [_PTR, _PTR, _SIZE],
        "sb_bf16_decode": [_PTR, _PTR, _SIZE],
        "sb_minmax_u8_encode": [_PTR, _SIZE, _SIZE, _PTR, _PTR, ctypes.c_uint8],
        "sb_minmax_u8_encode_fused": [_PTR, _SIZE, _SIZE, _PTR, _PTR, ctypes.c_uint8, _PTR],
        "sb_minmax_u8_decode": [_PTR, _SIZE, _SIZE, _PTR, _PTR, _INT],
        "sb_topk_f32": [_PTR, _SIZE, _SIZE, _PTR, _PTR],
        "sb_f16_hardware": [],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    lib.sb_topk_f32.restype = lib.sb_f16_hardware.restype = _INT
    lib.sb_minmax_u8_encode_fused.restype = _SIZE
    lib.sb_sequence_xent_f32.restype = ctypes.c_double


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """``kernels/cpu/*.c`` built and loaded, or ``None`` (NumPy path; :func:`status`)."""
    global _reason
    if os.environ.get(MODE_VARIABLE, "native") == "numpy":
        _reason = f"{MODE_VARIABLE}=numpy"
        return None
    cc = compiler()
    if cc is None:
        _reason = "no C compiler (cc, gcc or $CC) on PATH"
        return None
    try:
        lib, where = _load_or_build(sorted(SOURCES.glob("*.c")), cc)
        _declare(lib)
    except (OSError, AttributeError) as err:  # AttributeError: a kernel missing
        _reason = " ".join(str(err).split())
        return None
    _reason = f"compiled with {cc} {' '.join(FLAGS[:2])}{where}"
    return lib


def status() -> str:
    """Which convolution path the CPU layers take, and why: ``native (...)`` or ``numpy (...)``."""
    lib = library()
    if lib is not None and not direct_convolutions():
        return (f"native ({_reason}; convolutions by BLAS: no AVX-512 on this core, where "
                f"the direct kernels run 2-4x slower; {MODE_VARIABLE}=native takes them)")
    return f"{'native' if lib is not None else 'numpy'} ({_reason})"


def rows_usable(*rows: np.ndarray | None) -> bool:
    """Whether the BatchNorm kernels take these (C, M) arrays: contiguous float32 (masks:
    bool) and the library built."""
    return not numpy_only and library() is not None and all(
        r is None or (r.flags.c_contiguous and r.dtype in (np.float32, np.bool_)) for r in rows)


def usable(n: int, dtype: np.dtype) -> bool:
    """Whether the direct kernels take a batch of ``n`` samples of ``dtype``: float32, ``n``
    a multiple of :data:`LANES`, the library built, and :func:`direct_convolutions`."""
    return (not numpy_only and dtype == np.float32 and n % LANES == 0
            and library() is not None and direct_convolutions())


@functools.cache
def _has_avx512() -> bool:
    return "avx512f" in _cpu_id().split()


def direct_convolutions() -> bool:
    """Whether convolutions take the compiled direct kernels rather than BLAS.

    The kernels compute :data:`LANES` = 16 samples per vector, one AVX-512 register; on
    a core without AVX-512 the compiler splits each into two 8-float halves and the
    accumulators no longer fit the 16 registers. Measured on such a core (AMD EPYC
    with AVX2 only, one thread, batch 64 and 32): lenet 35.8 ms per step compiled
    against 16.5 by BLAS, resnet8 415 against 107 (docs/RESULTS.md, "The compiled
    convolutions on a core without AVX-512"); on the AVX-512 cores before, compiled was
    the faster. So ``auto`` takes them only with AVX-512; ``native`` always."""
    if direct_override is not None:
        return direct_override
    mode = os.environ.get(MODE_VARIABLE, "auto")
    return mode == "native" or _has_avx512()


_WRITABLE_BYTES = ctypes.c_char.from_buffer


def _ptr(a: np.ndarray | None) -> int | None:
    """The address of ``a``'s first element. Through the buffer protocol for a writable
    contiguous array (about a microsecond here), else through ``a.ctypes`` (several:
    NumPy builds an object for it), which a codec's few calls a step would feel."""
    if a is None:
        return None
    try:
        return ctypes.addressof(_WRITABLE_BYTES(a))
    except (TypeError, ValueError, BufferError):  # read-only, empty or not contiguous
        return a.ctypes.data


def pack_weights(weight: np.ndarray, out: np.ndarray) -> np.ndarray:
    """(K, ...) weights, each output channel's taps flattened, into ``out``, ((K + 3) // 4,
    taps, 4), zero past K: the layout the kernel broadcasts from (4 output channels'
    weights of one tap together)."""
    k_out, taps = weight.shape[0], weight[0].size
    full = k_out // 4 * 4
    blocks = out.reshape(out.shape[0], taps, 4)
    flat = weight.reshape(k_out, taps)
    if full:
        np.copyto(blocks[: full // 4], flat[:full].reshape(full // 4, 4, taps).transpose(0, 2, 1))
    if full < k_out:
        blocks[-1].fill(0)
        np.copyto(blocks[-1][:, : k_out - full], flat[full:].T)
    return out


def packed_shape(weight_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The shape :func:`pack_weights` packs (K, ...) weights into."""
    return ((weight_shape[0] + 3) // 4, math.prod(weight_shape[1:]), 4)


def window_taps(channels: int, hp: int, wp: int, n: int, k: int,
                rows: Sequence[int] | None = None, cols: Sequence[int] | None = None
                ) -> np.ndarray:
    """Offsets (uintp, in elements) of the taps (channel, row, column) of a window in
    zero-padded planes (channels, hp, wp, n), channel-major as a (K, C, k, k) weight's
    taps: rows and columns ``range(k)`` unless given."""
    rows = range(k) if rows is None else rows
    cols = range(k) if cols is None else cols
    c, i, j = np.meshgrid(np.arange(channels), np.asarray(rows), np.asarray(cols),
                          indexing="ij")
    return (((c * hp + i) * wp + j) * n).astype(np.uintp).ravel()


def correlate(x: np.ndarray, steps: tuple[int, int], taps: np.ndarray, packed: np.ndarray,
              bias: np.ndarray | None, y: np.ndarray) -> None:
    """``y[a, oy, ox, :] = bias[a] + sum_q w[a, q] * x.flat[taps[q] + oy*steps[0] +
    ox*steps[1] + :]`` for ``y`` (K, OH, OW, N), a view with contiguous samples (any
    strides else), contiguous ``x``, and ``packed`` the :func:`pack_weights` of the
    (K, taps) weights ``w``. Every read is checked to fall inside ``x``."""
    k_out, oh, ow, n = y.shape
    for a in (x, packed) + ((bias,) if bias is not None else ()):
        assert a.flags.c_contiguous and a.dtype == np.float32
    assert y.dtype == np.float32 and y.strides[3] == 4 and packed.shape[1] == taps.size
    assert taps.dtype == np.uintp and packed.shape[0] * 4 >= k_out
    last = int(taps.max()) + steps[0] * (oh - 1) + steps[1] * (ow - 1) + n
    assert last <= x.size, "correlate: a tap reads past its planes"
    chan, row, col = (st // 4 for st in y.strides[:3])
    library().sb_correlate(_ptr(x), steps[0], steps[1], _ptr(taps), taps.size, _ptr(packed),
                           _ptr(bias), _ptr(y), chan, row, col, k_out, oh, ow, n)


def conv_forward(planes: np.ndarray, packed: np.ndarray, bias: np.ndarray | None,
                 out: np.ndarray, taps: np.ndarray, stride: int) -> None:
    """``out`` (K, OH, OW, N) = the convolution of zero-padded ``planes`` (C, Hp, Wp, N) by
    the :func:`pack_weights` of the (K, C, k, k) weights (+ ``bias``), stride ``stride``;
    ``taps``: :func:`window_taps` of the planes."""
    _, hp, wp, n = planes.shape
    correlate(planes, (stride * wp * n, stride * n), taps, packed, bias, out)


def input_grad_phases(size: int, out_size: int, k: int, pad: int, stride: int
                      ) -> tuple[int, int, list[tuple[int, list[int], list[int]]]]:
    """How a strided convolution's input gradient along one axis splits into ``stride``
    correlations of the output gradient (the "phases": input pixels ``phase``,
    ``phase + stride``, ...). Input pixel ``stride * m + phase`` takes kernel tap ``i``
    from output pixel ``m + (phase + pad - i) / stride`` wherever that is whole, so each
    phase is a stride-1 correlation with those taps: the sub-pixel decomposition of a
    transposed convolution (Shi et al. 2016, "Real-time single image and video
    super-resolution using an efficient sub-pixel convolutional neural network"). Same
    multiply-adds as col2im, no column matrix. Returns the zero rows the output gradient
    needs before and after, and per phase (phase, taps i, their shifts d + before)."""
    phases = []
    for phase in range(stride):
        taps = [i for i in range(k) if (phase + pad - i) % stride == 0]
        phases.append((phase, taps, [(phase + pad - i) // stride for i in taps]))
    shifts = [d for _, _, ds in phases for d in ds] or [0]
    before = max(0, -min(shifts))
    counts = {phase: len(range(phase, size, stride)) for phase in range(stride)}
    after = max([0] + [counts[p] - 1 + max(ds) - (out_size - 1) for p, _, ds in phases if ds])
    return before, after, [(p, t, [d + before for d in ds]) for p, t, ds in phases]


def weight_grad_work(c: int, k: int) -> tuple[int]:
    """The shape of the float32 lane sums :func:`conv_weight_grad` needs for ``c`` input
    channels and a k x k kernel."""
    return ((c * k * k + 5) // 6 * 6 * 4 * LANES,)


def conv_weight_grad(planes: np.ndarray, dy: np.ndarray, dweight: np.ndarray,
                     work: np.ndarray, taps: np.ndarray, stride: int) -> None:
    """``dweight`` (K, C, k, k) = the sum over pixels and samples of ``dy`` (K, OH, OW, N)
    times the windows of ``planes`` (C, Hp, Wp, N); ``work`` of :func:`weight_grad_work`'s
    shape, ``taps`` the :func:`window_taps` of the planes (the forward pass's)."""
    c, _, wp, n = planes.shape
    k_out, oh, ow, _ = dy.shape
    k = dweight.shape[2]
    for a in (planes, dy, dweight, work):
        assert a.flags.c_contiguous and a.dtype == np.float32
    assert taps.dtype == np.uintp and taps.size == c * k * k
    library().sb_conv_weight_grad(_ptr(planes), _ptr(dy), _ptr(dweight), _ptr(work),
                                  _ptr(taps), c, wp, n, k_out, k, stride, oh, ow)


def _f32(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32)


def bn_sums_about(x: np.ndarray, shift: np.ndarray, work: np.ndarray) -> np.ndarray:
    """kernels/cpu_norm.py's ``sums_about`` (the (2, C) sums, ``work = x - shift``), in one
    pass per row; the sums are added in double and returned as float32."""
    sums = np.empty((2, x.shape[0]), np.float64)
    library().sb_bn_sums_about(_ptr(x), _ptr(_f32(shift)), _ptr(work), _ptr(sums),
                               x.shape[0], x.shape[1])
    return sums.astype(x.dtype)


def bn_affine(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, y: np.ndarray,
              mask: np.ndarray | None) -> None:
    """kernels/cpu_norm.py's ``affine``: ``y = x * scale + offset`` per row, then the fused
    ReLU keeping ``mask``."""
    library().sb_bn_affine(_ptr(x), _ptr(_f32(scale)), _ptr(_f32(offset)), _ptr(y),
                           _ptr(mask), x.shape[0], x.shape[1])


def bn_grad_sums(dy: np.ndarray, work: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """(2, C): per row ``sum(g)`` and ``sum(g * work)`` of ``g = dy * mask``, as float32."""
    sums = np.empty((2, dy.shape[0]), np.float64)
    library().sb_bn_grad_sums(_ptr(dy), _ptr(work), _ptr(mask), _ptr(sums), dy.shape[0],
                              dy.shape[1])
    return sums.astype(dy.dtype)


def bn_input_grad(dy: np.ndarray, work: np.ndarray, mask: np.ndarray | None,
                  scale: np.ndarray, k1: np.ndarray, k0: np.ndarray, out: np.ndarray) -> None:
    """``out = scale * g + k1 * work + k0`` per row of ``g = dy * mask``."""
    library().sb_bn_input_grad(_ptr(dy), _ptr(work), _ptr(mask), _ptr(_f32(scale)),
                               _ptr(_f32(k1)), _ptr(_f32(k0)), _ptr(out), dy.shape[0],
                               dy.shape[1])


def sgd_momentum_(params: np.ndarray, grads: np.ndarray, velocity: np.ndarray, lr: float,
                  momentum: float, weight_decay: float | np.ndarray,
                  scratch: np.ndarray | None = None) -> bool:
    """kernels/ops.py's ``sgd_momentum_`` in one pass (kernels/cpu/optim.c), equal to it to
    the bit, where the library is built and the buffers are contiguous float32 or float64
    host arrays of one dtype (``weight_decay`` a number or such an array); returns whether
    it ran (False: the reference runs). The dispatcher of ``ops.sgd_momentum_`` calls it
    with the reference's arguments (``scratch``: unused, one pass needs none)."""
    dtype = params.dtype
    wd_array = None if np.isscalar(weight_decay) else weight_decay
    arrays = [params, grads, velocity] + ([] if wd_array is None else [wd_array])
    scalars = [_weak(v, dtype) for v in (lr, momentum, 0 if wd_array is not None
                                          else weight_decay)]
    if (numpy_only or not isinstance(params, np.ndarray)
            or dtype not in (np.float32, np.float64) or None in scalars or library() is None
            or not all(isinstance(a, np.ndarray) and a.dtype == dtype and a.flags.c_contiguous
                       and a.size == params.size for a in arrays)):
        return False
    lib = library()
    kernel = lib.sb_sgd_momentum_f32 if dtype == np.float32 else lib.sb_sgd_momentum_f64
    kernel(_ptr(params), _ptr(grads), _ptr(velocity), params.size, scalars[0], scalars[1],
           _ptr(wd_array), scalars[2])
    return True


def adamw_(params: np.ndarray, grads: np.ndarray, exp_avg: np.ndarray,
           exp_avg_sq: np.ndarray, decay: float | np.ndarray, lr: float,
           scalars: tuple[float, ...]) -> bool:
    """algorithms/adamw.py's AdamW step in one pass (kernels/cpu/adamw.c), equal to its
    NumPy reference to the bit, where the library is built and the buffers are contiguous
    float32 or float64 host arrays of one dtype (``lr`` a Python number, ``decay`` one or
    such an array: a NumPy float64 scalar computes in float64 there); returns whether it
    ran. ``scalars``: (1 - beta1, beta2, 1 - beta2, sqrt of the
    second bias correction, eps, -lr / first bias correction), Python floats, rounded to
    the dtype here as NumPy rounds them."""
    dtype = params.dtype
    wd_array = None if isinstance(decay, (int, float)) else decay
    arrays = [params, grads, exp_avg, exp_avg_sq] + ([] if wd_array is None else [wd_array])
    python_scalars = type(lr) in (int, float) and (wd_array is not None
                                                   or type(decay) in (int, float))
    if (numpy_only or not python_scalars or not isinstance(params, np.ndarray)
            or dtype not in (np.float32, np.float64) or library() is None
            or not all(isinstance(a, np.ndarray) and a.dtype == dtype and a.flags.c_contiguous
                       and a.size == params.size for a in arrays)):
        return False
    lib = library()
    kernel = lib.sb_adamw_f32 if dtype == np.float32 else lib.sb_adamw_f64
    factor = 1 - lr * decay if wd_array is None and decay else 0.0
    kernel(_ptr(params), _ptr(grads), _ptr(exp_avg), _ptr(exp_avg_sq), params.size,
           _ptr(wd_array), dtype.type(-lr), int(wd_array is None and bool(decay)),
           dtype.type(factor), *(dtype.type(x) for x in scalars))
    return True


def _weak(value: object, dtype: np.dtype) -> object:
    """``value`` as the array's dtype where NumPy would compute in that dtype with it (a
    Python number, or a NumPy scalar of that dtype), else None: a float64 scalar with
    float32 arrays computes in float64, which the float32 kernel would not reproduce."""
    if type(value) in (int, float) or (isinstance(value, np.generic) and value.dtype == dtype):
        return dtype.type(value)
    return None


# -- gradient codecs (kernels/cpu/codecs.c; algorithms/codecs/) ---------------------------
def _codec_arrays(*arrays: tuple[np.ndarray, type]) -> bool:
    """Whether the codec kernels run on these (array, dtype) pairs: each a contiguous host
    array of its dtype, and the library built."""
    return not numpy_only and library() is not None and all(
        isinstance(a, np.ndarray) and a.dtype == dtype and a.flags.c_contiguous
        for a, dtype in arrays)


@functools.lru_cache(maxsize=1)
def _f16_as_numpy() -> bool:
    """Whether the fp16 kernels run here: built with the core's conversion (F16C; the
    integer rule alone is no faster than NumPy's) and giving NumPy's float16 casts on
    this machine: NumPy's software conversion keeps NaN payloads (the kernels' rule), a
    hardware one would quiet signalling NaNs; probed once on such NaNs and the rounding's
    edges."""
    if not library().sb_f16_hardware():
        return False
    bits = np.array([0x7F800001, 0xFF802000, 0x7FC00000, 0x7F800000, 0x477FF000, 0x477FEFFF,
                     0x33000000, 0x33000001, 0x38800000, 0x387FFFFF, 0x00000001],
                    dtype=np.uint32)
    codes = np.array([0x7C01, 0xFE00, 0x7E00, 0x7C00, 0x0001, 0x03FF, 0x0400, 0x8000],
                     dtype=np.uint16)
    with np.errstate(all="ignore"):
        want_codes = bits.view(np.float32).astype(np.float16).view(np.uint16)
        want_values = codes.view(np.float16).astype(np.float32).view(np.uint32)
    got_codes, got_values = np.empty_like(want_codes), np.empty(codes.size, np.float32)
    library().sb_f16_encode(_ptr(bits), _ptr(got_codes), bits.size)
    library().sb_f16_decode(_ptr(codes), _ptr(got_values), codes.size)
    return (np.array_equal(got_codes, want_codes)
            and np.array_equal(got_values.view(np.uint32), want_values))


def half_encode(x: np.ndarray, kind: str) -> np.ndarray | None:
    """The ``kind`` (``fp16`` or ``bf16``) codes (uint16) of float32 ``x`` by
    kernels/cpu/codecs.c, equal to algorithms/codecs/half.py's reference to the bit;
    None where the kernel does not run (the reference runs)."""
    if not _codec_arrays((x, np.float32)) or (kind == "fp16" and not _f16_as_numpy()):
        return None
    out = np.empty(x.shape, dtype=np.uint16)
    kernel = library().sb_f16_encode if kind == "fp16" else library().sb_bf16_encode
    kernel(_ptr(x), _ptr(out), x.size)
    return out


def half_decode(codes: np.ndarray, kind: str) -> np.ndarray | None:
    """float32 values of ``kind`` codes (uint16) by kernels/cpu/codecs.c (exact, NaN
    payloads as the reference); None where the kernel does not run."""
    if not _codec_arrays((codes, np.uint16)) or (kind == "fp16" and not _f16_as_numpy()):
        return None
    out = np.empty(codes.shape, dtype=np.float32)
    kernel = library().sb_f16_decode if kind == "fp16" else library().sb_bf16_decode
    kernel(_ptr(codes), _ptr(out), codes.size)
    return out


@functools.lru_cache(maxsize=1)
def _nan_code() -> int:
    """The uint8 NumPy's float32 cast gives a NaN (what the int8 reference writes for a
    NaN level: a platform's choice, 0 on x86-64)."""
    with np.errstate(invalid="ignore"):
        out = np.empty(1, dtype=np.uint8)
        out[...] = np.array([np.nan], dtype=np.float32)
    return int(out[0])


def minmax_encode(x: np.ndarray, chunk: int, minmax: np.ndarray, codes: np.ndarray) -> bool:
    """int8 codes of float32 ``x`` into ``codes`` (uint8) from each chunk's ``minmax``
    (float32 (chunks, 2)) by kernels/cpu/codecs.c, equal to minmax.py's reference to the
    bit; returns whether it ran."""
    if not _codec_arrays((x, np.float32), (minmax, np.float32), (codes, np.uint8)):
        return False
    assert codes.size == x.size and minmax.size == 2 * (-(-x.size // chunk))
    library().sb_minmax_u8_encode(_ptr(x), x.size, chunk, _ptr(minmax), _ptr(codes),
                                  _nan_code())
    return True


def minmax_encode_fused(x: np.ndarray, chunk: int, minmax: np.ndarray,
                        codes: np.ndarray) -> np.ndarray | tuple[()] | None:
    """Each chunk's ``[min, max]`` into ``minmax`` and its codes into ``codes`` in one
    read of float32 ``x`` by kernels/cpu/codecs.c, for the chunks whose min and max are
    unique bit patterns (no NaN, neither zero); returns the indices of the chunks it left
    to the caller (:func:`minmax_encode` once their headers are NumPy's), ``()`` where
    none (the kernel counts them: a NumPy search of the flags after a training step
    cost some 15 us, a tenth of an mlp gradient's encode and decode), None where the
    kernel does not run."""
    if not _codec_arrays((x, np.float32), (minmax, np.float32), (codes, np.uint8)):
        return None
    chunks = -(-x.size // chunk)
    assert codes.size == x.size and minmax.size == 2 * chunks
    ask = np.empty(chunks, dtype=np.uint8)
    asked = library().sb_minmax_u8_encode_fused(_ptr(x), x.size, chunk, _ptr(minmax),
                                                _ptr(codes), _nan_code(), _ptr(ask))
    return np.flatnonzero(ask) if asked else ()


def minmax_decode(codes: np.ndarray, chunk: int, minmax: np.ndarray, out: np.ndarray,
                  accumulate: bool = False) -> bool:
    """``out`` (float32) = (or ``+=`` with ``accumulate``) the values of int8 ``codes``
    by kernels/cpu/codecs.c, equal to minmax.py's reference to the bit; returns whether
    it ran."""
    if not _codec_arrays((codes, np.uint8), (minmax, np.float32), (out, np.float32)):
        return False
    assert out.size == codes.size and minmax.size == 2 * (-(-codes.size // chunk))
    library().sb_minmax_u8_decode(_ptr(codes), codes.size, chunk, _ptr(minmax), _ptr(out),
                                  int(accumulate))
    return True


def topk_indices(x: np.ndarray, k: int) -> np.ndarray | None:
    """Sorted int32 indices of the ``k`` entries of float32 ``x`` of largest magnitude
    (NaN largest) by kernels/cpu/codecs.c, where that set is unique: then it is the
    reference's (np.argpartition) to the bit; None where ties at the k-th magnitude
    leave the choice to the reference, or the kernel does not run."""
    if not _codec_arrays((x, np.float32)) or not 1 <= k <= x.size:
        return None
    idx = np.empty(k, dtype=np.int32)
    work = np.empty(x.size, dtype=np.uint32)
    return idx if library().sb_topk_f32(_ptr(x), x.size, k, _ptr(idx), _ptr(work)) else None
