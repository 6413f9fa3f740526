"""The GPU implementations of :mod:`syncbench.kernels.ops`: hand-written CUDA kernels.

Each function here has the signature of the :mod:`~syncbench.kernels.ops`
function of the same name (whose NumPy body is its reference) and launches
the kernels of ``kernels/cuda/*.cu``. The sources are compiled by CuPy
(``cupy.RawModule``, NVRTC) once per precision with ``-DSB_REAL=float`` or
``-DSB_REAL=double`` and ``--fmad=false`` (no fused multiply-add, so
element-wise kernels round exactly like their NumPy references; CuPy also
adds ``-ftz=true``, which flushes float32 subnormals to zero, the one
difference). GEMMs are not here: the layers call ``cupy.matmul`` (cuBLAS).

Kernels by source: ``optim.cu`` (``sgd_momentum`` for a number decay,
``sgd_momentum_array_decay`` for one decay per element, ``axpy``),
``softmax_xent.cu``, ``dense.cu`` (ReLU, bias add, the bias-gradient
reduction), ``conv.cu`` (im2col/col2im, any stride), ``pool.cu`` (max
pooling), ``batchnorm.cu`` (BatchNorm's per-channel sums, normalization and
input gradient) and ``resnet.cu`` (residual add + ReLU, option-A shortcut,
global average pooling).

Launch rules: 1-D grids of :data:`BLOCK` threads, at most :data:`MAX_BLOCKS`
blocks; every kernel is a grid-stride loop whose elements are each written by
one thread (no shared memory, atomics or barriers), so the result does not
depend on the launch shape. Reductions over many elements per output
(``bias_grad``, ``bn_sums``, ``bn_grad_sums``) take two passes: a partial
kernel where one thread sums one chunk of one channel (:data:`BIAS_CHUNK`,
:data:`BN_CHUNK` positions) and a finish kernel where one thread adds one
output's chunks in order; the summation order is fixed, so the results are
deterministic and the host emulator is exact for them too (they differ from
NumPy's pairwise sums in the last bits, within :func:`tolerance`).
``avgpool_forward`` sums each plane in one thread. Kernels run on CuPy's
current stream, in order with CuPy's own operations; whoever hands a buffer
to MPI synchronizes first (:mod:`syncbench.algorithms.device_buffers`).

The launcher is pluggable (:func:`use_launcher`): the default compiles and
launches with CuPy; the tests plug in a host emulator
(:class:`syncbench.kernels.compile_check.HostEmulator`) that runs the same
kernel sources, built as C++, on NumPy arrays, so this module's argument
marshalling and the kernels' arithmetic are checked on machines without a GPU.
This module imports CuPy only inside :class:`CupyLauncher` and :func:`main`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from syncbench.kernels import ops

KERNEL_DIR = Path(__file__).resolve().parent / "cuda"
#: Threads per block of every launch.
BLOCK = 256
#: Upper bound on blocks per launch (grid-stride loops cover the rest).
MAX_BLOCKS = 4096
#: Rows summed by one thread in the first pass of the bias-gradient reduction.
BIAS_CHUNK = 256
#: Positions (samples x pixels) of one channel summed by one thread in the first
#: pass of BatchNorm's per-channel sums (``bn_sums``, ``bn_grad_sums``).
BN_CHUNK = 256
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
                import cupy

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


def _launch(kernel: str, dtype: np.dtype, work: int, *args: Any) -> None:
    if work <= 0:
        return
    source = kernel_signatures()[kernel].source
    get_launcher()(source, kernel, dtype, grid_size(work), BLOCK, args)


# -- argument helpers -------------------------------------------------------------
def _xp(array: Any) -> Any:
    """The array module of ``array`` (CuPy on the GPU path, NumPy under the emulator)."""
    if type(array).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _real_dtype(array: Any) -> np.dtype:
    dtype = np.dtype(array.dtype)
    if dtype not in REAL_CTYPES:
        raise TypeError(f"CUDA kernels take float32 or float64 arrays, got {dtype}")
    return dtype


def _check(dtype: np.dtype, size: int | None, **arrays: Any) -> None:
    """Every array C-contiguous, of ``dtype`` and (if given) ``size`` elements."""
    for name, array in arrays.items():
        if np.dtype(array.dtype) != dtype:
            raise TypeError(f"{name}: dtype {array.dtype}, expected {dtype}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{name}: CUDA kernels need C-contiguous arrays")
        if size is not None and array.size != size:
            raise ValueError(f"{name}: {array.size} elements, expected {size}")


def _real(dtype: np.dtype, value: float) -> Any:
    """A scalar of the kernel's ``real`` type (CuPy passes NumPy scalars by their dtype)."""
    return dtype.type(float(value))


def _i64(value: int) -> np.int64:
    return np.int64(value)


# -- optimizer updates ---------------------------------------------------------------
def sgd_momentum_(
    params: Any,
    grads: Any,
    velocity: Any,
    lr: float,
    momentum: float,
    weight_decay: float,
    scratch: Any = None,
) -> None:
    """Kernel ``sgd_momentum`` for a number ``weight_decay``, ``sgd_momentum_array_decay``
    for an array of the params' shape and dtype (one decay per element; see
    :func:`syncbench.kernels.ops.sgd_momentum_`).

    Numbers and arrays are told apart as the reference does (``np.isscalar``);
    a 0-d array is one decay for every element, added even where it is zero,
    as the reference adds any array's product.
    """
    dt, n = _real_dtype(params), params.size
    _check(dt, n, params=params, grads=grads, velocity=velocity)
    if np.isscalar(weight_decay):
        _launch("sgd_momentum", dt, n, params, grads, velocity,
                _real(dt, lr), _real(dt, momentum), _real(dt, weight_decay), _i64(n))
        return
    xp = _xp(params)
    if _xp(weight_decay) is not xp:
        raise TypeError(f"sgd_momentum_: weight_decay is a {type(weight_decay).__module__} "
                        f"array, params a {type(params).__module__} one")
    if weight_decay.ndim == 0:
        weight_decay = xp.broadcast_to(weight_decay, params.shape)
    if weight_decay.shape != params.shape:
        raise ValueError(f"sgd_momentum_: weight_decay of shape {weight_decay.shape} for "
                         f"params of shape {params.shape}")
    weight_decay = xp.ascontiguousarray(weight_decay)
    _check(dt, n, weight_decay=weight_decay)
    _launch("sgd_momentum_array_decay", dt, n, params, grads, velocity, weight_decay,
            _real(dt, lr), _real(dt, momentum), _i64(n))


def axpy_(y: Any, alpha: float, x: Any, scratch: Any = None) -> None:
    """Kernel ``axpy`` (see :func:`syncbench.kernels.ops.axpy_`)."""
    dt, n = _real_dtype(y), y.size
    _check(dt, n, y=y, x=x)
    _launch("axpy", dt, n, y, _real(dt, alpha), x, _i64(n))


# -- layer kernels ------------------------------------------------------------------
#: Flags of ``softmax_xent`` launches on device labels not read yet: (flag, classes).
_label_flags: list[tuple[Any, int]] = []
#: Unread flags kept at most (then they are read: one synchronization).
MAX_LABEL_FLAGS = 256


def softmax_xent(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Kernel ``softmax_xent``; the mean of the per-row losses is a CuPy reduction.

    The loss is returned as a 0-d array on the device (no synchronization
    between forward and backward); :class:`~syncbench.kernels.model.Model`
    reads it after its end-of-backward synchronization. Labels outside
    ``[0, classes)`` are rejected like the NumPy reference does: host labels
    before the launch (:func:`syncbench.kernels.ops.check_labels`); device
    labels cannot be read without a synchronization, so the kernel never
    indexes with them, writes NaN for their rows and raises a flag that
    :func:`raise_on_bad_labels` turns into the same ``ValueError`` at the
    next synchronization point.
    """
    xp = _xp(logits)
    logits = xp.ascontiguousarray(logits)
    dt = _real_dtype(logits)
    rows, classes = logits.shape
    if labels.shape != (rows,):
        raise ValueError(f"labels of shape {labels.shape} for {rows} rows")
    if isinstance(labels, np.ndarray):
        ops.check_labels(labels, classes)
    labels = xp.ascontiguousarray(labels.astype(np.int64, copy=False))
    dlogits = xp.empty_like(logits)
    row_loss = xp.empty(rows, dtype=dt)
    bad = xp.zeros(1, dtype=np.int32)
    _launch("softmax_xent", dt, rows, logits, labels, dlogits, row_loss, bad, _i64(rows),
            _i64(classes))
    if xp is not np:
        if len(_label_flags) >= MAX_LABEL_FLAGS:  # callers outside Model never read them
            raise_on_bad_labels()
        _label_flags.append((bad, classes))
    return row_loss.mean(), dlogits


def raise_on_bad_labels() -> None:
    """Raise ``ValueError`` if a ``softmax_xent`` launch since the last call met a label
    outside its range (reads a flag per launch: call it after a synchronization)."""
    flags = list(_label_flags)
    _label_flags.clear()
    for bad, classes in flags:
        if int(bad[0]):
            raise ValueError(f"softmax_xent: a label is outside 0..{classes - 1}")


def relu_forward(x: Any, out: Any = None) -> Any:
    """Kernel ``relu_forward``."""
    xp = _xp(x)
    x = xp.ascontiguousarray(x)
    dt = _real_dtype(x)
    out = xp.empty_like(x) if out is None else out
    _check(dt, x.size, out=out)
    _launch("relu_forward", dt, x.size, x, out, _i64(x.size))
    return out


def relu_backward(dy: Any, y: Any, out: Any = None) -> Any:
    """Kernel ``relu_backward``."""
    xp = _xp(dy)
    dy, y = xp.ascontiguousarray(dy), xp.ascontiguousarray(y)
    dt = _real_dtype(dy)
    out = xp.empty_like(dy) if out is None else out
    _check(dt, dy.size, y=y, out=out)
    _launch("relu_backward", dt, dy.size, dy, y, out, _i64(dy.size))
    return out


def _bias_layout(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, channels, inner) of a 2-D array whose bias runs along ``axis``."""
    rows, cols = shape
    if axis == 1:
        return rows, cols, 1
    if axis == 0:
        return 1, rows, cols
    raise ValueError(f"bias axis must be 0 or 1, got {axis}")


def bias_add_(y: Any, bias: Any, axis: int = 1) -> None:
    """Kernel ``bias_add`` on a 2-D ``y``, in place (bias along ``axis``)."""
    dt = _real_dtype(y)
    outer, channels, inner = _bias_layout(y.shape, axis)
    bias = _xp(y).ascontiguousarray(bias)
    _check(dt, None, y=y)
    _check(dt, channels, bias=bias)
    _launch("bias_add", dt, y.size, y, bias, _i64(outer), _i64(channels), _i64(inner))


def bias_grad(dy: Any, out: Any = None, axis: int = 1) -> Any:
    """Kernels ``bias_grad_partial`` then ``bias_grad_finish``: sums of 2-D ``dy`` per
    index of ``axis``.

    Each thread of the first pass sums :data:`BIAS_CHUNK` positions of one
    channel; with at most that many the sum is sequential, as NumPy's is over
    rows (``axis=1``).
    """
    xp = _xp(dy)
    dy = xp.ascontiguousarray(dy)
    dt = _real_dtype(dy)
    outer, channels, inner = _bias_layout(dy.shape, axis)
    out = xp.empty(channels, dtype=dt) if out is None else out
    _check(dt, channels, out=out)
    chunks = max(1, math.ceil(outer * inner / BIAS_CHUNK))
    partial = xp.empty(chunks * channels, dtype=dt)
    _launch("bias_grad_partial", dt, chunks * channels, dy, partial, _i64(outer),
            _i64(channels), _i64(inner), _i64(BIAS_CHUNK))
    _launch("bias_grad_finish", dt, channels, partial, out, _i64(chunks), _i64(channels))
    return out


def _conv_geometry(op: str, shape: tuple[int, ...], k: int, pad: int,
                   stride: int) -> tuple[int, int]:
    """(oh, ow) of a convolution of NCHW ``shape``; ``ValueError`` unless it fits."""
    if len(shape) != 4:
        raise ValueError(f"{op}: expected an NCHW shape, got {tuple(shape)}")
    if k < 1 or pad < 0 or stride < 1:
        raise ValueError(f"{op}: kernel {k}, pad {pad}, stride {stride} (need k, stride >= 1, "
                         "pad >= 0)")
    h, w = shape[2], shape[3]
    if h + 2 * pad < k or w + 2 * pad < k:
        raise ValueError(f"{op}: kernel {k} with pad {pad} does not fit {h}x{w}")
    return ops.conv_output_hw(h, w, k, pad, stride)


def im2col(x: Any, k: int, pad: int, stride: int = 1) -> Any:
    """Kernel ``im2col``: (n, c, h, w) -> (c*k*k, n*oh*ow), windows ``stride`` apart."""
    xp = _xp(x)
    x = xp.ascontiguousarray(x)
    dt = _real_dtype(x)
    oh, ow = _conv_geometry("im2col", x.shape, k, pad, stride)
    n, c, h, w = x.shape
    cols = xp.empty((c * k * k, n * oh * ow), dtype=dt)
    _launch("im2col", dt, cols.size, x, cols, *map(_i64, (n, c, h, w, k, pad, stride)))
    return cols


def col2im(cols: Any, in_shape: tuple[int, ...], k: int, pad: int, stride: int = 1) -> Any:
    """Kernel ``col2im``: (c*k*k, n*oh*ow) -> (n, c, h, w), the adjoint of :func:`im2col`."""
    xp = _xp(cols)
    cols = xp.ascontiguousarray(cols)
    dt = _real_dtype(cols)
    oh, ow = _conv_geometry("col2im", tuple(in_shape), k, pad, stride)
    n, c, h, w = in_shape
    if cols.shape != (c * k * k, n * oh * ow):
        raise ValueError(f"col2im: columns of shape {cols.shape} do not match {in_shape}, "
                         f"k={k}, stride={stride}")
    dx = xp.empty((n, c, h, w), dtype=dt)
    _launch("col2im", dt, dx.size, cols, dx, *map(_i64, (n, c, h, w, k, pad, stride)))
    return dx


def maxpool_forward(x: Any, k: int) -> tuple[Any, Any]:
    """Kernel ``maxpool_forward``: returns ``(y, argmax)`` (argmax int32)."""
    xp = _xp(x)
    x = xp.ascontiguousarray(x)
    dt = _real_dtype(x)
    n, c, h, w = x.shape
    if h % k or w % k:
        raise ValueError(f"maxpool: sides {h}x{w} not divisible by {k}")
    y = xp.empty((n, c, h // k, w // k), dtype=dt)
    argmax = xp.empty(y.shape, dtype=np.int32)
    _launch("maxpool_forward", dt, y.size, x, y, argmax, *map(_i64, (n * c, h, w, k)))
    return y, argmax


def maxpool_backward(dy: Any, argmax: Any, k: int) -> Any:
    """Kernel ``maxpool_backward``: (n, c, oh, ow) gradients -> (n, c, oh*k, ow*k)."""
    xp = _xp(dy)
    dy = xp.ascontiguousarray(dy)
    argmax = xp.ascontiguousarray(argmax.astype(np.int32, copy=False))
    dt = _real_dtype(dy)
    n, c, oh, ow = dy.shape
    if argmax.shape != dy.shape:
        raise ValueError(f"maxpool_backward: argmax {argmax.shape} vs dy {dy.shape}")
    dx = xp.empty((n, c, oh * k, ow * k), dtype=dt)
    _launch("maxpool_backward", dt, dx.size, dy, argmax, dx,
            *map(_i64, (n * c, oh * k, ow * k, k)))
    return dx


# -- BatchNorm, residual blocks, global average pooling (ResNets) -----------------------
def _nchw(op: str, name: str, array: Any) -> tuple[Any, np.dtype]:
    """``array`` C-contiguous, and its real dtype; ``ValueError`` unless it is 4-D."""
    if array.ndim != 4:
        raise ValueError(f"{op}: {name} must be NCHW (4-D), got shape {array.shape}")
    array = _xp(array).ascontiguousarray(array)
    return array, _real_dtype(array)


def _same_shape(op: str, shape: tuple[int, ...], **arrays: Any) -> None:
    for name, array in arrays.items():
        if array.shape != shape:
            raise ValueError(f"{op}: {name} of shape {array.shape}, expected {shape}")


def _channel_vectors(op: str, dtype: np.dtype, channels: int, **vectors: Any) -> list[Any]:
    """The per-channel vectors, C-contiguous; ``ValueError`` unless each has shape (C,)."""
    out = []
    for name, vector in vectors.items():
        if vector.shape != (channels,):
            raise ValueError(f"{op}: {name} of shape {vector.shape} for {channels} channels")
        vector = _xp(vector).ascontiguousarray(vector)
        _check(dtype, channels, **{name: vector})
        out.append(vector)
    return out


def _channel_sums(partial_kernel: str, a: Any, b: Any) -> Any:
    """The two per-channel sums of an NCHW pair: ``partial_kernel`` over chunks of
    :data:`BN_CHUNK` positions, then ``bias_grad_finish`` over 2*C channels."""
    xp = _xp(a)
    n, c, h, w = a.shape
    dt = _real_dtype(a)
    chunks = max(1, math.ceil(n * h * w / BN_CHUNK))
    partial = xp.empty(chunks * 2 * c, dtype=dt)
    sums = xp.empty((2, c), dtype=dt)
    _launch(partial_kernel, dt, chunks * c, a, b, partial,
            *map(_i64, (n, c, h * w, BN_CHUNK)))
    _launch("bias_grad_finish", dt, 2 * c, partial, sums, _i64(chunks), _i64(2 * c))
    return sums


def bn_sums(x: Any, shift: Any) -> Any:
    """Kernels ``bn_sums_partial`` then ``bias_grad_finish``: the (2, C) sums of
    ``x - shift`` and ``(x - shift)**2`` per channel.

    Two passes without atomics: each thread of the first sums :data:`BN_CHUNK`
    positions (samples x pixels) of one channel, one thread per channel adds
    the chunks in order. Deterministic; NumPy's pairwise sums may differ in
    the last bits.
    """
    x, dt = _nchw("bn_sums", "x", x)
    (shift,) = _channel_vectors("bn_sums", dt, x.shape[1], shift=shift)
    return _channel_sums("bn_sums_partial", x, shift)


def bn_normalize(x: Any, mean: Any, invstd: Any, gamma: Any, beta: Any) -> tuple[Any, Any]:
    """Kernel ``bn_normalize``: returns ``(y, xhat)``, both of ``x``'s shape."""
    xp = _xp(x)
    x, dt = _nchw("bn_normalize", "x", x)
    n, c, h, w = x.shape
    vectors = _channel_vectors("bn_normalize", dt, c, mean=mean, invstd=invstd, gamma=gamma,
                               beta=beta)
    y, xhat = xp.empty_like(x), xp.empty_like(x)
    _launch("bn_normalize", dt, x.size, x, *vectors, y, xhat, *map(_i64, (n, c, h * w)))
    return y, xhat


def bn_grad_sums(dy: Any, xhat: Any) -> Any:
    """Kernels ``bn_grad_sums_partial`` then ``bias_grad_finish``: the (2, C) sums of
    ``dy`` and ``dy * xhat`` per channel (in chunks, as :func:`bn_sums`)."""
    dy, dt = _nchw("bn_grad_sums", "dy", dy)
    _same_shape("bn_grad_sums", dy.shape, xhat=xhat)
    xhat = _xp(dy).ascontiguousarray(xhat)
    _check(dt, None, xhat=xhat)
    return _channel_sums("bn_grad_sums_partial", dy, xhat)


def bn_backward(dy: Any, xhat: Any, scale: Any, mean_dy: Any, mean_dy_xhat: Any) -> Any:
    """Kernel ``bn_backward``: the input gradient, of ``dy``'s shape."""
    xp = _xp(dy)
    dy, dt = _nchw("bn_backward", "dy", dy)
    n, c, h, w = dy.shape
    _same_shape("bn_backward", dy.shape, xhat=xhat)
    xhat = xp.ascontiguousarray(xhat)
    _check(dt, None, xhat=xhat)
    vectors = _channel_vectors("bn_backward", dt, c, scale=scale, mean_dy=mean_dy,
                               mean_dy_xhat=mean_dy_xhat)
    dx = xp.empty_like(dy)
    _launch("bn_backward", dt, dy.size, dy, xhat, *vectors, dx, *map(_i64, (n, c, h * w)))
    return dx


def add_relu(a: Any, b: Any) -> Any:
    """Kernel ``add_relu``: ``max(a + b, 0)`` of two arrays of the same shape."""
    xp = _xp(a)
    _same_shape("add_relu", a.shape, b=b)
    a, b = xp.ascontiguousarray(a), xp.ascontiguousarray(b)
    dt = _real_dtype(a)
    _check(dt, None, b=b)
    y = xp.empty_like(a)
    _launch("add_relu", dt, a.size, a, b, y, _i64(a.size))
    return y


def _shortcut_hw(op: str, h: int, w: int, stride: int) -> tuple[int, int]:
    if stride < 1:
        raise ValueError(f"{op}: stride {stride}, need >= 1")
    return -(-h // stride), -(-w // stride)


def shortcut_forward(x: Any, channels: int, stride: int) -> Any:
    """Kernel ``shortcut_forward``: (n, c, h, w) -> (n, channels, ceil(h/stride),
    ceil(w/stride)), zero channels appended."""
    xp = _xp(x)
    x, dt = _nchw("shortcut_forward", "x", x)
    n, c, h, w = x.shape
    oh, ow = _shortcut_hw("shortcut_forward", h, w, stride)
    if channels < c:
        raise ValueError(f"shortcut_forward: {channels} output channels for {c} input ones")
    y = xp.empty((n, channels, oh, ow), dtype=dt)
    _launch("shortcut_forward", dt, y.size, x, y, *map(_i64, (n, c, h, w, channels, stride)))
    return y


def shortcut_backward(dy: Any, in_shape: tuple[int, ...], stride: int) -> Any:
    """Kernel ``shortcut_backward``: (n, channels, oh, ow) gradients -> NCHW ``in_shape``."""
    xp = _xp(dy)
    dy, dt = _nchw("shortcut_backward", "dy", dy)
    if len(in_shape) != 4:
        raise ValueError(f"shortcut_backward: in_shape must be NCHW, got {tuple(in_shape)}")
    n, c, h, w = in_shape
    oh, ow = _shortcut_hw("shortcut_backward", h, w, stride)
    channels = dy.shape[1]
    if channels < c or dy.shape != (n, channels, oh, ow):
        raise ValueError(f"shortcut_backward: dy of shape {dy.shape} does not match {in_shape}, "
                         f"stride={stride}")
    dx = xp.empty((n, c, h, w), dtype=dt)
    _launch("shortcut_backward", dt, dx.size, dy, dx,
            *map(_i64, (n, c, h, w, channels, stride)))
    return dx


def avgpool_forward(x: Any) -> Any:
    """Kernel ``avgpool_forward``: (n, c, h, w) -> (n, c), one thread per plane."""
    xp = _xp(x)
    x, dt = _nchw("avgpool_forward", "x", x)
    n, c, h, w = x.shape
    if h * w == 0:
        raise ValueError(f"avgpool_forward: empty planes ({h}x{w})")
    y = xp.empty((n, c), dtype=dt)
    _launch("avgpool_forward", dt, y.size, x, y, _i64(n * c), _i64(h * w),
            _real(dt, 1.0 / (h * w)))
    return y


def avgpool_backward(dy: Any, hw: tuple[int, int]) -> Any:
    """Kernel ``avgpool_backward``: (n, c) gradients -> (n, c, h, w)."""
    xp = _xp(dy)
    if dy.ndim != 2:
        raise ValueError(f"avgpool_backward: dy must be (n, c), got shape {dy.shape}")
    h, w = hw
    if h < 1 or w < 1:
        raise ValueError(f"avgpool_backward: plane {h}x{w}")
    dy = xp.ascontiguousarray(dy)
    dt = _real_dtype(dy)
    dx = xp.empty((*dy.shape, h, w), dtype=dt)
    _launch("avgpool_backward", dt, dx.size, dy, dx, _i64(dy.size), _i64(h * w),
            _real(dt, 1.0 / (h * w)))
    return dx


#: Every operation implemented here (the same names as the dispatched ones in ops).
OPS: tuple[str, ...] = (
    "sgd_momentum_", "axpy_",
    "softmax_xent", "relu_forward", "relu_backward", "bias_add_", "bias_grad",
    "im2col", "col2im", "maxpool_forward", "maxpool_backward",
    "bn_sums", "bn_normalize", "bn_grad_sums", "bn_backward",
    "add_relu", "shortcut_forward", "shortcut_backward", "avgpool_forward", "avgpool_backward",
)


# -- example inputs: shared by the tests (emulated and on GPU) and the benchmark -------
@dataclass(frozen=True)
class Case:
    """Inputs for one operation: ``build(rng, dtype, large)`` returns its host arguments.

    ``exact``: the kernel must match the NumPy reference bit for bit (same
    operations in the same order); otherwise within :func:`tolerance` (sums
    in another order, or another ``exp``). ``exact_large`` overrides it for
    the benchmark-size inputs (None: the same): ``bias_grad/rows`` sums its
    256 test rows sequentially, as NumPy does, but 200704 rows in chunks of
    :data:`BIAS_CHUNK`, which NumPy does not.
    """

    name: str
    op: str
    build: Callable[[np.random.Generator, np.dtype, bool], tuple]
    exact: bool = True
    exact_large: bool | None = None

    def is_exact(self, large: bool) -> bool:
        """Whether the kernel must equal the reference bit for bit at this size."""
        return self.exact if not large or self.exact_large is None else self.exact_large


def tolerance(dtype: Any, large: bool) -> float:
    """Largest accepted difference of an inexact case, relative to the output's magnitude.

    float64: 1e-12. float32: 2e-5 on the small inputs, 1e-4 at benchmark size,
    where a channel sums 200704 rows in another order (float32's unit
    roundoff is 6e-8; a reordered sum of n terms differs by about
    sqrt(n) * 6e-8 of the sum of magnitudes, 3e-5 here).
    """
    if np.dtype(dtype) == np.float64:
        return 1e-12
    return 1e-4 if large else 2e-5


def _flat(rng: np.random.Generator, dtype: np.dtype, large: bool, count: int) -> list[np.ndarray]:
    n = (1 << 22) if large else 1000
    return [rng.standard_normal(n).astype(dtype) for _ in range(count)]


def _image(rng, dtype, shape):
    return rng.standard_normal(shape).astype(dtype)


def _conv_shape(large: bool) -> tuple[tuple[int, int, int, int], int, int]:
    """(x shape, k, pad): LeNet's first convolution at benchmark size."""
    return ((256, 1, 28, 28), 5, 2) if large else ((2, 3, 7, 6), 3, 1)


def _im2col_case(pad: int | None):
    def build(rng, dtype, large):
        shape, k, default_pad = _conv_shape(large)
        return (_image(rng, dtype, shape), k, default_pad if pad is None else pad)
    return build


def _col2im_case(rng, dtype, large):
    shape, k, pad = _conv_shape(large)
    n, c, h, w = shape
    oh, ow = ops.conv_output_hw(h, w, k, pad)
    return (_image(rng, dtype, (c * k * k, n * oh * ow)), shape, k, pad)


#: ResNet-8's stride-2 convolutions at batch 128 on 28x28 (k 3, pad 1): 16 channels
#: at 28x28 into the 14x14 stage, 32 at 14x14 into the 7x7 one.
RESNET_STRIDED = ((128, 16, 28, 28), (128, 32, 14, 14))


def _strided_shape(side: int, large: bool) -> tuple[int, int, int, int]:
    """Stride-2 inputs: ``side`` x ``side`` (7: odd, 6: even) small, ResNet-8's at size."""
    return RESNET_STRIDED[side % 2 == 0] if large else (2, 3, side, side)


def _strided_im2col_case(side: int):
    def build(rng, dtype, large):
        return (_image(rng, dtype, _strided_shape(side, large)), 3, 1, 2)
    return build


def _strided_col2im_case(side: int):
    def build(rng, dtype, large):
        shape = _strided_shape(side, large)
        n, c, h, w = shape
        oh, ow = ops.conv_output_hw(h, w, 3, 1, 2)
        return (_image(rng, dtype, (c * 9, n * oh * ow)), shape, 3, 1, 2)
    return build


def _decay_array_case(rng, dtype, large):
    """Momentum SGD with one decay per element, zero for about a third (exempt)."""
    w, g, v = _flat(rng, dtype, large, 3)
    decay = (1e-4 * (rng.random(w.size) < 0.7)).astype(dtype)
    return (w, g, v, 0.05, 0.9, decay)


#: ResNet-8's largest activation (batch 128, 16 channels at 28x28): BatchNorm, residual sums.
RESNET_ACTIVATION = (128, 16, 28, 28)


def _bn_shape(small: tuple[int, int, int, int], large: bool) -> tuple[int, int, int, int]:
    return RESNET_ACTIVATION if large else small


def _per_channel(rng, dtype, c, low=-1.0, high=1.0):
    return rng.uniform(low, high, size=c).astype(dtype)


def _bn_sums_case(small: tuple[int, int, int, int]):
    """Activations with a per-channel offset; the shift is near (not at) the offset."""
    def build(rng, dtype, large):
        shape = _bn_shape(small, large)
        offset = 3 * rng.standard_normal(shape[1])
        x = (2 * rng.standard_normal(shape) + offset[None, :, None, None]).astype(dtype)
        return (x, (offset + 0.1 * rng.standard_normal(shape[1])).astype(dtype))
    return build


def _bn_normalize_case(rng, dtype, large):
    shape = _bn_shape((3, 4, 5, 6), large)
    c = shape[1]
    return (_image(rng, dtype, shape), _per_channel(rng, dtype, c),
            _per_channel(rng, dtype, c, 0.2, 2.0), _per_channel(rng, dtype, c, 0.5, 1.5),
            _per_channel(rng, dtype, c))


def _bn_grad_sums_case(small: tuple[int, int, int, int]):
    def build(rng, dtype, large):
        shape = _bn_shape(small, large)
        return (_image(rng, dtype, shape), _image(rng, dtype, shape))
    return build


def _bn_backward_case(rng, dtype, large):
    shape = _bn_shape((3, 4, 5, 6), large)
    c = shape[1]
    return (_image(rng, dtype, shape), _image(rng, dtype, shape),
            _per_channel(rng, dtype, c, 0.2, 2.0), _per_channel(rng, dtype, c, -0.1, 0.1),
            _per_channel(rng, dtype, c, -0.1, 0.1))


def _add_relu_case(rng, dtype, large):
    shape = _bn_shape((2, 3, 5, 6), large)
    a, b = _image(rng, dtype, shape), _image(rng, dtype, shape)
    b.reshape(-1)[::7] = -a.reshape(-1)[::7]  # exact zero sums
    return (a, b)


def _shortcut_shapes(large: bool) -> tuple[tuple[int, ...], int]:
    """(input shape, output channels) of a stride-2 option-A shortcut: odd 7x7 sides
    small, ResNet-8's first stage transition (16 -> 32 channels, 28x28 -> 14x14) at size."""
    return (RESNET_ACTIVATION, 32) if large else ((2, 3, 7, 7), 5)


def _shortcut_forward_case(rng, dtype, large):
    shape, channels = _shortcut_shapes(large)
    return (_image(rng, dtype, shape), channels, 2)


def _shortcut_backward_case(rng, dtype, large):
    shape, channels = _shortcut_shapes(large)
    n, _, h, w = shape
    return (_image(rng, dtype, (n, channels, -(-h // 2), -(-w // 2))), shape, 2)


def _avgpool_shape(large: bool) -> tuple[int, int, int, int]:
    """ResNet-8's global pooling (batch 128, 64 channels at 7x7) at size."""
    return (128, 64, 7, 7) if large else (2, 3, 5, 6)


def _pool_input(rng, dtype, large):
    shape = (256, 6, 28, 28) if large else (2, 3, 6, 8)
    # few distinct values: many ties, so the first-maximum rule is exercised
    return rng.integers(-3, 3, size=shape).astype(dtype)


def _pool_backward_case(rng, dtype, large):
    shape = (256, 6, 14, 14) if large else (2, 3, 3, 4)
    return (_image(rng, dtype, shape), rng.integers(0, 4, size=shape).astype(np.int32), 2)


def _softmax_case(rng, dtype, large):
    rows = 8192 if large else 37
    logits = (3 * rng.standard_normal((rows, 10))).astype(dtype)
    return (logits, rng.integers(0, 10, size=rows).astype(np.int64))


def _relu_input(rng, dtype, large):
    x = _flat(rng, dtype, large, 1)[0]
    x[::7] = 0
    return x


def _bias_case(rows_small: int, axis: int):
    """Linear-like (batch, features) for ``axis=1``, Conv2d-like (cout, n*oh*ow) for 0."""
    def build(rng, dtype, large):
        rows, cols = (200704, 6) if large else (rows_small, 5)
        shape = (rows, cols) if axis == 1 else (cols, rows)
        return (_image(rng, dtype, shape), None, axis)
    return build


def _bias_add_case(axis: int):
    def build(rng, dtype, large):
        rows, cols = (200704, 6) if large else (33, 5)
        shape = (rows, cols) if axis == 1 else (cols, rows)
        return (_image(rng, dtype, shape), _image(rng, dtype, (cols,)), axis)
    return build


CASES: tuple[Case, ...] = (
    Case("sgd_momentum_", "sgd_momentum_",
         lambda r, d, b: (*_flat(r, d, b, 3), 0.05, 0.9, 1e-4)),
    Case("sgd_momentum_/no-decay", "sgd_momentum_",
         lambda r, d, b: (*_flat(r, d, b, 3), 0.1, 0.0, 0.0)),
    Case("sgd_momentum_/array-decay", "sgd_momentum_", _decay_array_case),
    Case("axpy_", "axpy_", lambda r, d, b: (_flat(r, d, b, 1)[0], 0.3, _flat(r, d, b, 1)[0])),
    Case("axpy_/alpha-1", "axpy_",
         lambda r, d, b: (_flat(r, d, b, 1)[0], 1.0, _flat(r, d, b, 1)[0])),
    Case("softmax_xent", "softmax_xent", _softmax_case, exact=False),
    Case("relu_forward", "relu_forward", lambda r, d, b: (_relu_input(r, d, b),)),
    Case("relu_backward", "relu_backward",
         lambda r, d, b: (_flat(r, d, b, 1)[0], np.maximum(_relu_input(r, d, b), 0))),
    Case("bias_add_/rows", "bias_add_", _bias_add_case(1)),
    Case("bias_add_/channels", "bias_add_", _bias_add_case(0)),
    Case("bias_grad/rows", "bias_grad", _bias_case(BIAS_CHUNK, 1), exact_large=False),
    Case("bias_grad/rows-chunks", "bias_grad", _bias_case(3 * BIAS_CHUNK + 17, 1), exact=False),
    Case("bias_grad/channels", "bias_grad", _bias_case(3 * BIAS_CHUNK + 17, 0), exact=False),
    Case("im2col", "im2col", _im2col_case(None)),
    Case("im2col/no-pad", "im2col", _im2col_case(0)),
    Case("col2im", "col2im", _col2im_case),
    Case("im2col/stride-2", "im2col", _strided_im2col_case(7)),
    Case("im2col/stride-2-even", "im2col", _strided_im2col_case(6)),
    Case("col2im/stride-2", "col2im", _strided_col2im_case(7)),
    Case("col2im/stride-2-even", "col2im", _strided_col2im_case(6)),
    Case("maxpool_forward", "maxpool_forward", lambda r, d, b: (_pool_input(r, d, b), 2)),
    Case("maxpool_backward", "maxpool_backward", _pool_backward_case),
    Case("bn_sums", "bn_sums", _bn_sums_case((3, 4, 5, 6)), exact=False),
    Case("bn_sums/chunks", "bn_sums", _bn_sums_case((3, 4, 10, 9)), exact=False),
    Case("bn_normalize", "bn_normalize", _bn_normalize_case),
    Case("bn_grad_sums", "bn_grad_sums", _bn_grad_sums_case((3, 4, 5, 6)), exact=False),
    Case("bn_grad_sums/chunks", "bn_grad_sums", _bn_grad_sums_case((3, 4, 10, 9)),
         exact=False),
    Case("bn_backward", "bn_backward", _bn_backward_case),
    Case("add_relu", "add_relu", _add_relu_case),
    Case("shortcut_forward", "shortcut_forward", _shortcut_forward_case),
    Case("shortcut_backward", "shortcut_backward", _shortcut_backward_case),
    Case("avgpool_forward", "avgpool_forward",
         lambda r, d, b: (_image(r, d, _avgpool_shape(b)),), exact=False),
    Case("avgpool_backward", "avgpool_backward",
         lambda r, d, b: (_image(r, d, _avgpool_shape(b)[:2]), _avgpool_shape(b)[2:])),
)


def run_case(fn: Callable[..., Any], args: tuple) -> list[Any]:
    """Call ``fn`` on ``args`` (mutated in place) and return what a comparison looks at:
    the returned arrays/floats (a 0-d array, the kernels' loss, as a float), then every
    array argument after the call."""
    result = fn(*args)
    returned = list(result) if isinstance(result, tuple) else [result]
    returned = [float(r) if getattr(r, "ndim", None) == 0 else r for r in returned]
    return [r for r in returned if r is not None] + [a for a in args if hasattr(a, "shape")]


# -- benchmark ---------------------------------------------------------------------------
def _median_seconds(fn: Callable[[], Any], repeat: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def benchmark(
    dtype: Any = np.float32,
    repeat: int = 10,
    seed: int = 0,
    large: bool = True,
    xp: Any = None,
) -> list[dict[str, Any]]:
    """Time every :data:`CASES` entry: NumPy reference vs CUDA kernel.

    Returns rows with ``case``, ``numpy_ms``, ``cuda_ms`` (medians; the GPU
    time includes the launch and a stream synchronization), ``bytes`` (the
    least memory traffic of the operation, :func:`bytes_moved`), ``cuda_gb_s``
    and ``numpy_gb_s`` (``bytes`` over the time: the effective bandwidth, to
    compare with the device's memory peak), ``max_abs_diff``,
    ``max_rel_diff`` (relative to the largest output magnitude), ``exact``
    (:meth:`Case.is_exact`) and ``ok`` (bit-identical if exact, else within
    :func:`tolerance`). ``xp``
    is CuPy by default; NumPy (with the host emulator as launcher, small
    sizes) lets the tests run this code without a GPU.
    """
    if xp is None:
        import cupy as xp
    on_gpu = xp.__name__ == "cupy"
    sync = xp.cuda.get_current_stream().synchronize if on_gpu else (lambda: None)
    to_host = xp.asnumpy if on_gpu else np.asarray
    dtype = np.dtype(dtype)
    rows = []
    for case in CASES:
        host = case.build(np.random.default_rng(seed), dtype, large)
        device = tuple(xp.asarray(a) if isinstance(a, np.ndarray) else a for a in host)
        reference, kernel = ops.REFERENCES[case.op], globals()[case.op]
        expected = run_case(reference, _copies(host))
        got = run_case(kernel, _copies(device))
        diff, rel = _differences(expected, [to_host(g) for g in got])
        numpy_s = _median_seconds(lambda r=reference, a=host: r(*a), repeat, lambda: None)
        cuda_s = _median_seconds(lambda k=kernel, a=device: k(*a), repeat, sync)
        exact = case.is_exact(large)
        ok = diff == 0.0 if exact else rel <= tolerance(dtype, large)
        moved = bytes_moved(reference, host)
        rows.append({"case": case.name, "numpy_ms": numpy_s * 1e3, "cuda_ms": cuda_s * 1e3,
                     "bytes": moved, "cuda_gb_s": _gb_per_s(moved, cuda_s),
                     "numpy_gb_s": _gb_per_s(moved, numpy_s),
                     "max_abs_diff": diff, "max_rel_diff": rel, "exact": exact, "ok": ok})
    return rows


def bytes_moved(reference: Callable[..., Any], args: tuple) -> int:
    """Least bytes an operation moves: every array argument read once, every array it
    returns and every argument it changes in place written once.

    Found by running the NumPy ``reference`` on copies of ``args``. Reused reads
    (im2col's overlapping windows) are not counted again: this is the traffic an
    ideal kernel needs, so bytes / time is the effective bandwidth to set against
    the memory peak.
    """
    before = _copies(args)
    after = _copies(args)
    result = reference(*after)
    returned = list(result) if isinstance(result, tuple) else [result]
    moved = sum(a.nbytes for a in before if isinstance(a, np.ndarray))
    moved += sum(r.nbytes for r in returned if isinstance(r, np.ndarray) and r.ndim)
    moved += sum(b.nbytes for a, b in zip(before, after)
                 if isinstance(a, np.ndarray) and not np.array_equal(a, b, equal_nan=True))
    return int(moved)


def _gb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else math.inf


def _copies(args: tuple) -> tuple:
    return tuple(a.copy() if hasattr(a, "copy") else a for a in args)


def _differences(expected: list[Any], got: list[Any]) -> tuple[float, float]:
    """Largest absolute difference, and largest one relative to the output's magnitude."""
    worst_abs = worst_rel = 0.0
    for e, g in zip(expected, got):
        e = np.asarray(e, dtype=np.float64)
        diff = float(np.max(np.abs(np.asarray(g, dtype=np.float64) - e), initial=0.0))
        scale = float(np.max(np.abs(e), initial=0.0)) or 1.0
        worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / scale)
    return worst_abs, worst_rel


def format_table(rows: list[dict[str, Any]]) -> str:
    """The benchmark rows as a fixed-width table."""
    lines = [f"{'kernel':<26} {'numpy ms':>10} {'cuda ms':>10} {'speedup':>9} {'MB':>8} "
             f"{'cuda GB/s':>10} {'max|diff|':>10} {'check':>6}"]
    for row in rows:
        speedup = row["numpy_ms"] / row["cuda_ms"] if row["cuda_ms"] > 0 else math.inf
        check = ("exact" if row.get("exact") else "tol") if row.get("ok", True) else "FAIL"
        lines.append(f"{row['case']:<26} {row['numpy_ms']:>10.3f} {row['cuda_ms']:>10.3f} "
                     f"{speedup:>8.1f}x {row.get('bytes', 0) / 1e6:>8.1f} "
                     f"{row.get('cuda_gb_s', math.nan):>10.1f} {row['max_abs_diff']:>10.2e} "
                     f"{check:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m syncbench.kernels.cuda_ops``: kernel timings against the NumPy references."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--repeat", type=int, default=10)
    config = parser.parse_args(argv)
    print(format_table(benchmark(config.dtype, config.repeat)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
