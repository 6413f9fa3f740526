"""The GPU implementations of :mod:`syncbench.kernels.ops`: hand-written CUDA kernels.

Each function here has the signature of the :mod:`~syncbench.kernels.ops`
function of the same name (whose NumPy body is its reference): it checks
and marshals its arguments (dtype, contiguity, shapes, the scalars as the
kernel's C types) and launches the kernels of ``kernels/cuda/*.cu`` through
:func:`syncbench.kernels.cuda_launch.launch`. GEMMs are not here: the layers
call ``cupy.matmul`` (cuBLAS).

Kernels by source: ``optim.cu`` (``sgd_momentum`` for a number decay,
``sgd_momentum_array_decay`` for one decay per element, ``adamw`` and
``adamw_array_decay`` likewise, ``axpy``),
``softmax_xent.cu``, ``dense.cu`` (ReLU, bias add, the bias-gradient
reduction), ``conv.cu`` (im2col/col2im, any stride), ``pool.cu`` (max
pooling), ``batchnorm.cu`` (BatchNorm's per-channel sums, normalization and
input gradient) and ``resnet.cu`` (residual add + ReLU, option-A shortcut,
global average pooling), ``transformer.cu`` (``gpt``'s LayerNorm, GELU, causal
softmax and embedding scatter-add).

Reductions over many elements per output (``bias_grad``, ``bn_sums``,
``bn_grad_sums``) take two passes: a partial kernel where one thread sums
one chunk of one channel (:data:`BIAS_CHUNK`, :data:`BN_CHUNK` positions)
and a finish kernel where one thread adds one output's chunks in order; the
summation order is fixed, so the results are deterministic and the host
emulator is exact for them too (they differ from NumPy's pairwise sums in
the last bits, within :func:`syncbench.kernels.cuda_cases.tolerance`).
``avgpool_forward`` sums each plane in one thread. The functions take CuPy
arrays on the GPU path and NumPy arrays under the host emulator (tests).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from syncbench.kernels import ops
from syncbench.kernels.cuda_launch import REAL_CTYPES, launch

#: Rows summed by one thread in the first pass of the bias-gradient reduction.
BIAS_CHUNK = 256
#: Positions (samples x pixels) of one channel summed by one thread in the first
#: pass of BatchNorm's per-channel sums (``bn_sums``, ``bn_grad_sums``).
BN_CHUNK = 256


# -- argument helpers -------------------------------------------------------------
def _xp(array: Any) -> Any:
    """The array module of ``array`` (CuPy on the GPU path, NumPy under the emulator)."""
    if type(array).__module__.startswith("cupy"):
        import cupy  # lazy: only the GPU path has CuPy

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
        launch("sgd_momentum", dt, n, params, grads, velocity,
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
    launch("sgd_momentum_array_decay", dt, n, params, grads, velocity, weight_decay,
            _real(dt, lr), _real(dt, momentum), _i64(n))


def axpy_(y: Any, alpha: float, x: Any, scratch: Any = None) -> None:
    """Kernel ``axpy`` (see :func:`syncbench.kernels.ops.axpy_`)."""
    dt, n = _real_dtype(y), y.size
    _check(dt, n, y=y, x=x)
    launch("axpy", dt, n, y, _real(dt, alpha), x, _i64(n))


def adamw_(params: Any, grads: Any, exp_avg: Any, exp_avg_sq: Any, decay: Any, lr: float,
           scalars: tuple[float, ...], num: Any = None, den: Any = None) -> None:
    """Kernel ``adamw`` for a number ``decay``, ``adamw_array_decay`` for one decay per
    element (see :func:`syncbench.kernels.ops.adamw_`; ``num`` and ``den`` unused: one
    pass needs no scratch). Bit-identical to the reference (float32 subnormals aside:
    CuPy builds with ``-ftz=true``)."""
    dt, n = _real_dtype(params), params.size
    _check(dt, n, params=params, grads=grads, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    if len(scalars) != 6:
        raise ValueError(f"adamw_: 6 scalars expected, got {len(scalars)}")
    reals = [_real(dt, x) for x in scalars]
    if isinstance(decay, (int, float)):
        factor = 1 - lr * decay if decay else 0.0
        launch("adamw", dt, n, params, grads, exp_avg, exp_avg_sq, np.int32(bool(decay)),
                _real(dt, factor), *reals, _i64(n))
        return
    xp = _xp(params)
    if getattr(decay, "ndim", 0) == 0:  # one decay for every element, as the reference
        decay = xp.broadcast_to(xp.asarray(decay, dtype=dt), params.shape)
    elif _xp(decay) is not xp:
        raise TypeError(f"adamw_: decay is a {type(decay).__module__} array, params a "
                        f"{type(params).__module__} one")
    if decay.shape != params.shape:
        raise ValueError(f"adamw_: decay of shape {decay.shape} for params of shape "
                         f"{params.shape}")
    decay = xp.ascontiguousarray(decay)
    _check(dt, n, decay=decay)
    launch("adamw_array_decay", dt, n, params, grads, exp_avg, exp_avg_sq, decay,
            _real(dt, -lr), *reals, _i64(n))


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
    launch("softmax_xent", dt, rows, logits, labels, dlogits, row_loss, bad, _i64(rows),
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
    launch("relu_forward", dt, x.size, x, out, _i64(x.size))
    return out


def relu_backward(dy: Any, y: Any, out: Any = None) -> Any:
    """Kernel ``relu_backward``."""
    xp = _xp(dy)
    dy, y = xp.ascontiguousarray(dy), xp.ascontiguousarray(y)
    dt = _real_dtype(dy)
    out = xp.empty_like(dy) if out is None else out
    _check(dt, dy.size, y=y, out=out)
    launch("relu_backward", dt, dy.size, dy, y, out, _i64(dy.size))
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
    launch("bias_add", dt, y.size, y, bias, _i64(outer), _i64(channels), _i64(inner))


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
    launch("bias_grad_partial", dt, chunks * channels, dy, partial, _i64(outer),
            _i64(channels), _i64(inner), _i64(BIAS_CHUNK))
    launch("bias_grad_finish", dt, channels, partial, out, _i64(chunks), _i64(channels))
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
    launch("im2col", dt, cols.size, x, cols, *map(_i64, (n, c, h, w, k, pad, stride)))
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
    launch("col2im", dt, dx.size, cols, dx, *map(_i64, (n, c, h, w, k, pad, stride)))
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
    launch("maxpool_forward", dt, y.size, x, y, argmax, *map(_i64, (n * c, h, w, k)))
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
    launch("maxpool_backward", dt, dx.size, dy, argmax, dx,
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
    launch(partial_kernel, dt, chunks * c, a, b, partial,
            *map(_i64, (n, c, h * w, BN_CHUNK)))
    launch("bias_grad_finish", dt, 2 * c, partial, sums, _i64(chunks), _i64(2 * c))
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
    launch("bn_normalize", dt, x.size, x, *vectors, y, xhat, *map(_i64, (n, c, h * w)))
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
    launch("bn_backward", dt, dy.size, dy, xhat, *vectors, dx, *map(_i64, (n, c, h * w)))
    return dx


def add_relu(a: Any, b: Any) -> Any:
    """Kernel ``add_relu``: ``max(a + b, 0)`` of two arrays of the same shape."""
    xp = _xp(a)
    _same_shape("add_relu", a.shape, b=b)
    a, b = xp.ascontiguousarray(a), xp.ascontiguousarray(b)
    dt = _real_dtype(a)
    _check(dt, None, b=b)
    y = xp.empty_like(a)
    launch("add_relu", dt, a.size, a, b, y, _i64(a.size))
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
    launch("shortcut_forward", dt, y.size, x, y, *map(_i64, (n, c, h, w, channels, stride)))
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
    launch("shortcut_backward", dt, dx.size, dy, dx,
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
    launch("avgpool_forward", dt, y.size, x, y, _i64(n * c), _i64(h * w),
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
    launch("avgpool_backward", dt, dx.size, dy, dx, _i64(dy.size), _i64(h * w),
            _real(dt, 1.0 / (h * w)))
    return dx


# -- the transformer (gpt) ----------------------------------------------------------------
#: Rows summed by one thread in the first pass of LayerNorm's gain and bias gradients.
LN_CHUNK = 256


def _rows(op: str, x: Any) -> tuple[Any, np.dtype, int, int]:
    """``x`` C-contiguous, its real dtype, and its (rows, d) over the last axis."""
    if x.ndim < 1:
        raise ValueError(f"{op}: expected an array with a last axis, got a scalar")
    x = _xp(x).ascontiguousarray(x)
    d = x.shape[-1]
    return x, _real_dtype(x), (x.size // d if d else 0), d


def layernorm_forward(x: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """Kernels ``layernorm_stats`` (one thread per row: mean, 1/std) then
    ``layernorm_normalize`` (one per element): ``(y, xhat, rstd)``."""
    xp = _xp(x)
    x, dt, rows, d = _rows("layernorm_forward", x)
    gamma, beta = _channel_vectors("layernorm_forward", dt, d, gamma=gamma, beta=beta)
    mean, rstd = xp.empty(rows, dtype=dt), xp.empty(rows, dtype=dt)
    y, xhat = xp.empty_like(x), xp.empty_like(x)
    launch("layernorm_stats", dt, rows, x, mean, rstd, _real(dt, eps), _i64(rows), _i64(d))
    launch("layernorm_normalize", dt, x.size, x, mean, rstd, gamma, beta, y, xhat,
            _i64(rows), _i64(d))
    return y, xhat, rstd.reshape(*x.shape[:-1], 1)


def layernorm_backward(dy: Any, xhat: Any, rstd: Any, gamma: Any) -> tuple[Any, Any, Any]:
    """Kernels ``layernorm_backward_stats`` (per row) and ``layernorm_backward_dx`` (per
    element) for ``dx``; ``layernorm_param_grad_partial`` then ``bias_grad_finish`` for
    the gain's and bias's gradients, summed over the rows in chunks of
    :data:`LN_CHUNK` (deterministic, as :func:`bias_grad`): ``(dx, dgamma, dbeta)``."""
    xp = _xp(dy)
    dy, dt, rows, d = _rows("layernorm_backward", dy)
    _same_shape("layernorm_backward", dy.shape, xhat=xhat)
    if rstd.size != rows:
        raise ValueError(f"layernorm_backward: rstd of shape {rstd.shape} for {rows} rows")
    xhat, rstd = xp.ascontiguousarray(xhat), xp.ascontiguousarray(rstd)
    _check(dt, None, xhat=xhat, rstd=rstd)
    (gamma,) = _channel_vectors("layernorm_backward", dt, d, gamma=gamma)
    mg, mgx = xp.empty(rows, dtype=dt), xp.empty(rows, dtype=dt)
    dx = xp.empty_like(dy)
    launch("layernorm_backward_stats", dt, rows, dy, xhat, gamma, mg, mgx, _i64(rows),
            _i64(d))
    launch("layernorm_backward_dx", dt, dy.size, dy, xhat, gamma, rstd, mg, mgx, dx,
            _i64(rows), _i64(d))
    chunks = max(1, math.ceil(rows / LN_CHUNK))
    partial = xp.empty(chunks * 2 * d, dtype=dt)
    sums = xp.empty((2, d), dtype=dt)
    launch("layernorm_param_grad_partial", dt, chunks * d, dy, xhat, partial, _i64(rows),
            _i64(d), _i64(LN_CHUNK))
    launch("bias_grad_finish", dt, 2 * d, partial, sums, _i64(chunks), _i64(2 * d))
    return dx, sums[0], sums[1]


def gelu_forward(x: Any) -> tuple[Any, Any]:
    """Kernel ``gelu_forward``: ``(y, t)`` in one pass (the device's ``tanh``)."""
    xp = _xp(x)
    x = xp.ascontiguousarray(x)
    dt = _real_dtype(x)
    y, t = xp.empty_like(x), xp.empty_like(x)
    launch("gelu_forward", dt, x.size, x, y, t, _i64(x.size))
    return y, t


def gelu_backward(dy: Any, x: Any, t: Any) -> Any:
    """Kernel ``gelu_backward`` (bit-identical to the reference)."""
    xp = _xp(dy)
    _same_shape("gelu_backward", dy.shape, x=x, t=t)
    dy, x, t = (xp.ascontiguousarray(a) for a in (dy, x, t))
    dt = _real_dtype(dy)
    _check(dt, None, x=x, t=t)
    dx = xp.empty_like(dy)
    launch("gelu_backward", dt, dy.size, dy, x, t, dx, _i64(dy.size))
    return dx


def _square_rows(op: str, scores: Any) -> tuple[Any, np.dtype, int, int]:
    """``scores`` C-contiguous, its dtype, its rows and t; ``ValueError`` unless it is a
    stack of (t, t) matrices."""
    if scores.ndim < 2 or scores.shape[-1] != scores.shape[-2]:
        raise ValueError(f"{op}: expected (..., t, t) scores, got shape {scores.shape}")
    scores, dt, rows, t = _rows(op, scores)
    return scores, dt, rows, t


def causal_softmax(scores: Any, scale: float) -> Any:
    """Kernel ``causal_softmax_forward``: one thread per row of the (..., t, t) scores."""
    xp = _xp(scores)
    scores, dt, rows, t = _square_rows("causal_softmax", scores)
    probs = xp.empty_like(scores)
    launch("causal_softmax_forward", dt, rows, scores, probs, _real(dt, scale), _i64(rows),
            _i64(t))
    return probs


def causal_softmax_backward(dp: Any, probs: Any, scale: float) -> Any:
    """Kernel ``causal_softmax_backward``: one thread per row."""
    xp = _xp(dp)
    dp, dt, rows, t = _square_rows("causal_softmax_backward", dp)
    _same_shape("causal_softmax_backward", dp.shape, probs=probs)
    probs = xp.ascontiguousarray(probs)
    _check(dt, None, probs=probs)
    ds = xp.empty_like(dp)
    launch("causal_softmax_backward", dt, rows, dp, probs, ds, _real(dt, scale), _i64(rows),
            _i64(t))
    return ds


def embedding_backward(dh: Any, tokens: Any, wte_grad: Any, wpe_grad: Any) -> None:
    """Kernels ``embedding_token_grad`` and ``embedding_position_grad``.

    The token gradient is a scatter-add by sorted segments, without atomics:
    the positions are sorted by the key ``token * N + position`` (unique, so
    any sort gives the one order: by token, then by position), and thread
    ``(v, c)`` adds its token's rows in that order to ``wte_grad[v, c]``, as
    ``np.add.at`` does. Deterministic, and equal to the reference to the bit.
    Host tokens outside ``[0, vocab)`` raise ``ValueError``; device ones are
    not read before the launch and fall outside every segment (no gradient).
    """
    xp = _xp(dh)
    if dh.ndim != 3 or tokens.shape != dh.shape[:2]:
        raise ValueError(f"embedding_backward: dh of shape {dh.shape} for tokens of shape "
                         f"{tokens.shape}")
    batch, t, d = dh.shape
    dh = xp.ascontiguousarray(dh)
    dt = _real_dtype(dh)
    vocab, ctx = wte_grad.shape[0], wpe_grad.shape[0]
    if wte_grad.shape != (vocab, d) or wpe_grad.shape != (ctx, d) or t > ctx:
        raise ValueError(f"embedding_backward: gradients of shapes {wte_grad.shape} and "
                         f"{wpe_grad.shape} for dh of shape {dh.shape}")
    _check(dt, None, wte_grad=wte_grad, wpe_grad=wpe_grad)
    flat = xp.ascontiguousarray(tokens.reshape(-1)).astype(np.int64, copy=False)
    if isinstance(flat, np.ndarray) and flat.size and (flat.min() < 0 or flat.max() >= vocab):
        raise ValueError(f"embedding_backward: a token is outside 0..{vocab - 1}")
    n = flat.size
    order = xp.argsort(flat * n + xp.arange(n, dtype=np.int64)).astype(np.int64, copy=False)
    start = xp.searchsorted(flat[order], xp.arange(vocab + 1, dtype=np.int64))
    order, start = xp.ascontiguousarray(order), xp.ascontiguousarray(start.astype(np.int64))
    launch("embedding_token_grad", dt, vocab * d, dh, order, start, wte_grad, _i64(vocab),
            _i64(d))
    launch("embedding_position_grad", dt, ctx * d, dh, wpe_grad, _i64(batch), _i64(t),
            _i64(ctx), _i64(d))


#: Every operation implemented here (the same names as the dispatched ones in ops).
OPS: tuple[str, ...] = (
    "sgd_momentum_", "adamw_", "axpy_",
    "softmax_xent", "relu_forward", "relu_backward", "bias_add_", "bias_grad",
    "im2col", "col2im", "maxpool_forward", "maxpool_backward",
    "bn_sums", "bn_normalize", "bn_grad_sums", "bn_backward",
    "add_relu", "shortcut_forward", "shortcut_backward", "avgpool_forward", "avgpool_backward",
    "layernorm_forward", "layernorm_backward", "gelu_forward", "gelu_backward",
    "causal_softmax", "causal_softmax_backward", "embedding_backward",
)
