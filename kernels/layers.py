"""Layers with hand-written forward and backward passes.

A layer owns no parameter memory: :meth:`Layer.bind` hands it views into the
model's single flat parameter buffer and the matching views into the flat
gradient buffer. ``backward`` overwrites (never accumulates) its gradient
views and returns the gradient with respect to its input. Every layer works
on whatever array module its inputs come from (NumPy or CuPy). On the GPU
(CuPy inputs) the element-wise parts, im2col/col2im, pooling and the loss run
as the hand-written CUDA kernels of :mod:`syncbench.kernels.ops` and the GEMMs
as ``cupy.matmul`` (cuBLAS); the NumPy code of the CPU path is unchanged.

The CPU path allocates nothing in a steady training loop: work arrays
(im2col columns, padded inputs, pooling masks) are kept per layer while the
batch shape stays the same (:meth:`Layer.scratch`), and outputs reuse the
previous step's array once no caller holds it any more
(:meth:`Layer.recycled`), since fresh multi-megabyte arrays cost page faults
every step. ``forward(train=False)`` keeps nothing, so evaluating big
batches holds no memory afterwards. Global average pooling still calls its
NumPy reference (small outputs).

CPU activations are batch-innermost in memory, (C, H, W, N), handed on as
NCHW-indexed views (:mod:`syncbench.kernels.cpu_conv` says why); element-wise
layers, pooling and BatchNorm work in memory order (:func:`_stored`) and keep
that layout, and Flatten hands a dense layer the transposed (C*H*W, N) matrix
as its (N, C*H*W) view. A ReLU after a Conv2d, Linear or BatchNorm2d is
applied by that layer (:func:`fuse_relus`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from syncbench.kernels import cpu_conv, cpu_native, cpu_norm, ops

Shape = tuple[int, ...]


def _xp(array: Any):
    """The array module (NumPy or CuPy) that owns ``array``."""
    if type(array).__module__.startswith("cupy"):
        import cupy  # lazy: only the GPU path has CuPy

        return cupy
    return np


def _on_gpu(array: Any) -> bool:
    """True for CuPy arrays: the layer then runs its GPU path (CUDA kernels, cuBLAS)."""
    return type(array).__module__.startswith("cupy")


_BOOL = np.dtype(np.bool_)
#: Work arrays start on a cache line: NumPy aligns to 16 bytes only, and the compiled
#: kernels' 64-byte vector loads from a misaligned array each touch two lines.
CACHE_LINE = 64


def aligned_array(shape: Shape, dtype: Any, zero: bool = False) -> np.ndarray:
    """An uninitialised (``zero``: zeroed) C-contiguous array whose data starts on a
    :data:`CACHE_LINE` boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = (np.zeros if zero else np.empty)(nbytes + CACHE_LINE, dtype=np.uint8)
    skip = -raw.ctypes.data % CACHE_LINE
    return raw[skip : skip + nbytes].view(dtype).reshape(shape)
#: Outputs smaller than this (glibc's default mmap threshold) are not recycled.
RECYCLE_MIN_BYTES = 128 * 1024


def _stored(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """``x`` in the CPU layers' memory order: the (C, H, W, N) view of a 4-D array
    (:func:`cpu_conv.stored`; contiguous when a CPU layer made it) and True, else ``x``
    itself and False. Element-wise layers and pooling work on this view so that they
    read and write memory in order and hand the layout on."""
    if x.ndim == 4:
        return cpu_conv.stored(x), True
    return x, False


def _as_stored(x: np.ndarray, four_d: bool) -> np.ndarray:
    """An incoming NCHW-indexed array (a gradient) in the memory order :func:`_stored`
    chose for the layer's input: its (C, H, W, N) view when 4-D, else ``x``."""
    return cpu_conv.stored(x) if four_d else x


def _handed_on(x: np.ndarray, four_d: bool) -> np.ndarray:
    """A (C, H, W, N) result as the NCHW-indexed view layers exchange (when 4-D)."""
    return cpu_conv.nchw(x) if four_d else x


def _int_view_type(dtype: Any) -> np.dtype:
    """The signed integer type of the same width (for branch-free bitwise selects)."""
    return np.dtype(f"i{np.dtype(dtype).itemsize}")


class Layer:
    """Base class: a differentiable function with optional parameters."""

    #: CPU path: keep work and output arrays between calls (set by ``forward(x, train)``).
    keep_buffers: bool = True

    #: CPU path: this layer also applies the ReLU that follows it (:func:`fuse_relus`).
    fused_relu: bool = False

    def __init__(self) -> None:
        self.params: list[Any] = []
        self.grads: list[Any] = []
        #: False for a model's first layer: its input gradient is never used.
        self.needs_input_grad = True

    def param_shapes(self) -> list[Shape]:
        """Shapes of this layer's parameters, in flat-buffer order."""
        return []

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Initial values (float64, host) for :meth:`param_shapes`."""
        return []

    def param_decays(self) -> list[bool]:
        """Per parameter of :meth:`param_shapes`: does weight decay apply under
        ``--wd-exempt``? MXNet's rule (``Optimizer.set_wd_mult``): only names
        ending in ``_weight`` or ``_gamma`` decay, so biases and BatchNorm's beta
        do not. Default: the first parameter is a weight, the others biases."""
        return [i == 0 for i in range(len(self.param_shapes()))]

    def buffer_shapes(self) -> list[Shape]:
        """Shapes of state that is not trained (BatchNorm's running statistics), in the
        order of the model's flat ``buffers``."""
        return []

    def init_buffers(self) -> list[np.ndarray]:
        """Initial values (float64, host) for :meth:`buffer_shapes`."""
        return []

    def bind_buffers(self, buffers: list[Any]) -> None:
        """Attach views into the model's flat buffer of running statistics."""
        self.buffers = buffers

    def sublayers(self) -> list[Layer]:
        """The layers inside this one (a residual block's), else none."""
        return []

    def output_shape(self, input_shape: Shape) -> Shape:
        """Per-sample output shape for a per-sample ``input_shape``."""
        return input_shape

    def bind(self, params: list[Any], grads: list[Any]) -> None:
        """Attach views into the model's flat parameter and gradient buffers."""
        self.params, self.grads = params, grads

    def scratch(self, name: str, shape: Shape, dtype: Any, zero: bool = False) -> np.ndarray:
        """A host work array, kept between training steps while its shape and dtype hold.

        The CPU path's hot loop reuses these instead of allocating (and
        page-faulting in) fresh arrays every step. ``zero`` arrays start as
        zeros and callers only overwrite the parts that change, so the rest
        (padding borders, pad columns) stays zero. Outside training
        (``forward(train=False)`` sets :attr:`keep_buffers` False) the array
        is fresh and not kept, so evaluating large batches holds no memory.
        """
        if self.keep_buffers:
            cache = self.__dict__.get("_scratch")
            if cache is None:
                cache = self._scratch = {}
            buf = cache.get(name)
            if buf is not None and buf.shape == shape and buf.dtype == dtype:
                return buf
        buf = aligned_array(shape, dtype, zero)
        if self.keep_buffers:
            cache[name] = buf
        return buf

    def recycled(self, name: str, shape: Shape, dtype: Any) -> np.ndarray:
        """An array for a layer OUTPUT (activation or input gradient), uninitialised.

        The array handed out under ``name`` last time is reused when nothing
        but this layer refers to it any more (no caller kept it or a view of
        it; the reference count says so), else a fresh one is made. Outputs
        therefore never change under a caller that still holds them, and the
        steady training loop allocates nothing big. Arrays under
        :data:`RECYCLE_MIN_BYTES` are always fresh: malloc serves them from
        its free lists without page faults, faster than the bookkeeping.
        """
        if math.prod(shape) * np.dtype(dtype).itemsize < RECYCLE_MIN_BYTES:
            return np.empty(shape, dtype=dtype)
        buf = self.scratch(name, shape, dtype)
        # References: the cache, ``buf`` and getrefcount's argument; any more is a user.
        if self.keep_buffers and sys.getrefcount(buf) > 3:
            buf = self._scratch[name] = aligned_array(shape, dtype)
        return buf

    def channel_rows(self, x: np.ndarray, name: str, mask: np.ndarray | None = None) -> np.ndarray:
        """The (C, H*W*N) rows of 4-D ``x``'s (C, H, W, N) memory, one per channel: a view
        of ``x`` itself when it is laid out so and no ``mask`` is given (callers only read
        it), else a kept copy, multiplied by ``mask`` (a fused ReLU's, of that shape)."""
        planes = cpu_conv.stored(x)
        if mask is None and planes.flags.c_contiguous:
            return planes.reshape(planes.shape[0], -1)
        rows = self.scratch(name, (planes.shape[0], planes[0].size), x.dtype)
        if mask is None:
            np.copyto(rows.reshape(planes.shape), planes)
        else:
            np.multiply(planes, mask.reshape(planes.shape), out=rows.reshape(planes.shape))
        return rows

    def forward(self, x: Any, train: bool = True) -> Any:
        raise NotImplementedError

    def backward(self, dy: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__


class Linear(Layer):
    """``y = x @ W + b`` with ``W`` of shape (in, out); Kaiming-uniform init."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._x: Any = None

    def param_shapes(self) -> list[Shape]:
        return [(self.in_features, self.out_features), (self.out_features,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        bound = math.sqrt(6.0 / self.in_features)
        weight = rng.uniform(-bound, bound, size=(self.in_features, self.out_features))
        return [weight, np.zeros(self.out_features)]

    def output_shape(self, input_shape: Shape) -> Shape:
        if input_shape != (self.in_features,):
            raise ValueError(f"Linear({self.in_features}) got input shape {input_shape}")
        return (self.out_features,)

    def forward(self, x: Any, train: bool = True) -> Any:
        self._x = x
        if _on_gpu(x):
            y = x @ self.params[0]
            ops.bias_add_(y, self.params[1])
            return y
        self.keep_buffers = train
        y = np.matmul(x, self.params[0], out=self._big_output("out", x, self.out_features))
        y += self.params[1]
        if self.fused_relu:
            self._mask = self.scratch("relu_mask", y.shape, _BOOL)
            ops.relu_in_place(y, self._mask)
        return y

    def backward(self, dy: Any) -> Any:
        xp = _xp(dy)
        if _on_gpu(dy):
            return self._gpu_backward(xp, dy)
        if self.fused_relu:
            dy = np.multiply(dy, self._mask, out=self.scratch("relu_dy", dy.shape, dy.dtype))
        # Let go of the input (the layer before owns it: Layer.recycled reuses it only
        # when no one else holds it, and Flatten's view holds the pooling's output).
        x, self._x = self._x, None
        xp.matmul(x.T, dy, out=self.grads[0])
        dy.sum(axis=0, out=self.grads[1])
        if not self.needs_input_grad:
            return None
        if not x.flags.c_contiguous and x.T.flags.c_contiguous:
            # A transposed input (Flatten's view of (C, H, W, N) memory): dx^T = W @ dy^T,
            # so the gradient has the input's orientation (and Flatten needs no copy).
            dx_t = self._big_output("dx_t", dy.T, self.in_features, rows=dy.shape[0])
            return np.matmul(self.params[0], dy.T, out=dx_t).T
        dx = self._big_output("dx", dy, self.in_features)
        return np.matmul(dy, self.params[0].T, out=dx)

    def _big_output(self, name: str, x: Any, features: int,
                    rows: int | None = None) -> np.ndarray | None:
        """A recycled (x's rows, features) output array if it is big, else None (numpy
        allocates); ``rows`` given: a (features, rows) array (a transposed output)."""
        dtype = np.result_type(x, self.params[0])
        count = x.shape[0] if rows is None else rows
        if count * features * dtype.itemsize < RECYCLE_MIN_BYTES:
            return None
        shape = (count, features) if rows is None else (features, rows)
        return self.recycled(name, shape, dtype)

    def _gpu_backward(self, xp: Any, dy: Any) -> Any:
        """cuBLAS GEMMs and the bias-gradient kernel."""
        xp.matmul(self._x.T, dy, out=self.grads[0])
        ops.bias_grad(dy, out=self.grads[1])
        if not self.needs_input_grad:
            return None
        return dy @ self.params[0].T

    def __repr__(self) -> str:
        return f"Linear({self.in_features}, {self.out_features})"


class ReLU(Layer):
    """``max(x, 0)``; the gradient passes where the input was positive."""

    #: CPU path: the layer before applies this ReLU (:func:`fuse_relus`); this one passes.
    absorbed: bool = False

    def forward(self, x: Any, train: bool = True) -> Any:
        if _on_gpu(x):
            self._y = ops.relu_forward(x)  # the backward kernel reads y > 0
            return self._y
        if self.absorbed:
            return x
        self.keep_buffers = train
        x, self._four_d = _stored(x)
        if x.nbytes < RECYCLE_MIN_BYTES:  # small: malloc's free lists beat the bookkeeping
            self._mask = x > 0
            y = x * self._mask
        else:
            self._mask = np.greater(x, 0, out=self.scratch("mask", x.shape, _BOOL))
            y = np.multiply(x, self._mask, out=self.recycled("out", x.shape, x.dtype))
        return _handed_on(y, self._four_d)

    def backward(self, dy: Any) -> Any:
        if _on_gpu(dy):
            return ops.relu_backward(dy, self._y)
        if self.absorbed:
            return dy
        dy = _as_stored(dy, self._four_d)
        if dy.nbytes < RECYCLE_MIN_BYTES:
            dx = dy * self._mask
        else:
            dx = np.multiply(dy, self._mask, out=self.recycled("dx", dy.shape, dy.dtype))
        return _handed_on(dx, self._four_d)


class Flatten(Layer):
    """(n, ...) -> (n, prod(...)).

    On the CPU a 4-D input kept (C, H, W, N) in memory is handed on without a
    copy, as the (N, C*H*W) view of its (C*H*W, N) matrix; :class:`Linear`
    multiplies that transposed operand in place (BLAS's transpose flag) and
    returns the input gradient in the same orientation, which is then this
    layer's (C, H, W, N) gradient, again without a copy.
    """

    def output_shape(self, input_shape: Shape) -> Shape:
        return (int(np.prod(input_shape)),)

    def forward(self, x: Any, train: bool = True) -> Any:
        self._shape = x.shape
        if x.ndim == 4 and not _on_gpu(x):
            planes = cpu_conv.stored(x)
            if planes.flags.c_contiguous:
                return planes.reshape(-1, x.shape[0]).T
        return x.reshape(x.shape[0], -1)

    def backward(self, dy: Any) -> Any:
        if len(self._shape) == 4 and not _on_gpu(dy):
            n, c, h, w = self._shape
            return cpu_conv.nchw(np.ascontiguousarray(dy.T).reshape(c, h, w, n))
        return dy.reshape(self._shape)


class Conv2d(Layer):
    """2-D convolution (zero padding, stride 1 or more) through im2col and one GEMM.

    Weights have shape (out_channels, in_channels, k, k). The forward pass
    unfolds every k x k window into a column of a (C*k*k, n*oh*ow) matrix
    and multiplies it by the (out, C*k*k) weight matrix; the backward pass
    multiplies by the same matrix for the weight gradient and folds the
    column gradient back (col2im) for the input gradient.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int, padding: int = 0,
                 stride: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.cin, self.cout, self.k, self.pad = in_channels, out_channels, kernel, padding
        self.stride, self.bias = stride, bias

    def param_shapes(self) -> list[Shape]:
        weight = (self.cout, self.cin, self.k, self.k)
        return [weight, (self.cout,)] if self.bias else [weight]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        fan_in = self.cin * self.k * self.k
        bound = math.sqrt(6.0 / fan_in)
        weight = rng.uniform(-bound, bound, size=self.param_shapes()[0])
        return [weight, np.zeros(self.cout)] if self.bias else [weight]

    def output_shape(self, input_shape: Shape) -> Shape:
        c, h, w = input_shape
        if c != self.cin:
            raise ValueError(f"Conv2d expects {self.cin} input channels, got {c}")
        oh, ow = ops.conv_output_hw(h, w, self.k, self.pad, self.stride)
        if h + 2 * self.pad < self.k or w + 2 * self.pad < self.k:
            raise ValueError(f"Conv2d kernel {self.k} does not fit input {h}x{w}")
        return (self.cout, oh, ow)

    def forward(self, x: Any, train: bool = True) -> Any:
        if _on_gpu(x):
            return self._gpu_forward(_xp(x), x)
        self.keep_buffers = train
        n, c, h, w = x.shape
        g = cpu_conv.ConvGeometry(n, c, h, w, self.k, self.pad, self.stride)
        planes = self.scratch("planes", g.planes_shape, x.dtype, zero=True)
        cpu_conv.fill_planes(planes, x, g)
        self._planes, self._geometry = planes, g
        out = self.recycled("out", (self.cout, g.oh, g.ow, n), x.dtype)  # (C, H, W, N)
        rows = out.reshape(self.cout, -1)
        self._direct = cpu_native.usable(n, x.dtype)
        if self._direct:
            self._direct_forward(planes, out, rows)
            return cpu_conv.nchw(out)
        weight = self.params[0].reshape(self.cout, -1)
        # Training keeps every chunk's columns for the weight gradient if they are few
        # (cpu_conv.KEEP_COLUMNS_BYTES); else backward builds them again, chunk by chunk.
        keep = train and g.rows * g.oh * g.per_row * x.dtype.itemsize <= cpu_conv.KEEP_COLUMNS_BYTES
        chunk = cpu_conv.gemm_chunk(g, self.cout, x.dtype.itemsize, cpu_conv.chunk_budget(keep))
        cols = self.scratch("cols", (g.rows, (g.oh if keep else chunk) * g.per_row), x.dtype)
        if self.fused_relu:
            self._mask = self.scratch("relu_mask", out.shape, _BOOL)
            mask = self._mask.reshape(self.cout, -1)
        for span, y in cpu_conv.convolve(weight, planes, g, cols, rows, chunk, keep):
            if self.bias:
                y += self.params[1][:, None]
            if self.fused_relu:
                ops.relu_in_place(y, mask[:, span])
        self._cols = cols if keep else None
        return cpu_conv.nchw(out)

    def _direct_forward(self, planes: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
        """The forward pass by the compiled direct convolution (:mod:`cpu_native`): the
        windows are read where they lie in ``planes``, no column matrix is built; the
        fused ReLU is one pass over the output."""
        weight = self.params[0]
        packed = self.scratch("packed", cpu_native.packed_shape(weight.shape), weight.dtype)
        cpu_native.conv_forward(planes, cpu_native.pack_weights(weight, packed),
                                self.params[1] if self.bias else None, out,
                                self._window_taps(planes), self.stride)
        if self.fused_relu:
            self._mask = self.scratch("relu_mask", out.shape, _BOOL)
            ops.relu_in_place(rows, self._mask.reshape(self.cout, -1))
        self._cols = None

    def backward(self, dy: Any) -> Any:
        if _on_gpu(dy):
            return self._gpu_backward(_xp(dy), dy)
        g = self._geometry
        laid = self._output_grad(dy)
        if self.bias:
            laid.sum(axis=1, out=self.grads[1])
        if self._direct:
            self._direct_weight_grad(laid, g)
        else:
            self._weight_grad(laid, g)
        if not self.needs_input_grad:
            return None
        if self._direct and self._grad_as_convolution(g, direct=True):
            return self._direct_input_grad(laid, g)
        if self._grad_as_convolution(g):
            return self._input_grad_by_convolution(laid, g)
        dplanes = self.recycled("dplanes", g.planes_shape, dy.dtype)
        dplanes.fill(0)
        weight_t = self.params[0].reshape(self.cout, -1).T
        chunk = g.chunk(dy.dtype.itemsize, cpu_conv.BACKWARD_CHUNK_BYTES)
        dcols = self.scratch("dcols", (g.rows, chunk * g.per_row), dy.dtype)
        for first, count in cpu_conv.chunks(g.oh, chunk):
            block = laid[:, first * g.per_row : (first + count) * g.per_row]
            part = np.matmul(weight_t, block, out=dcols[:, : count * g.per_row])
            cpu_conv.fold(dplanes, part, g, first, count)
        return cpu_conv.interior(dplanes, g)

    def _grad_as_convolution(self, g: cpu_conv.ConvGeometry, direct: bool = False) -> bool:
        """Whether the input gradient is computed as a convolution (stride 1, padding at
        most k - 1, and its column matrix no larger than col2im's: a ResNet's 3 x 3
        convolutions, not LeNet's, whose padded 10 x 10 gradient would be 5x larger).
        The compiled kernels (``direct``) take any stride by phases, and their
        correlation the full k x k taps per input pixel, so they need only the padding."""
        if direct:
            return g.pad <= g.k - 1
        return (g.stride == 1 and g.pad <= g.k - 1
                and self.cout * g.h * g.w <= self.cin * g.oh * g.ow)

    def _input_grad_by_convolution(self, laid: np.ndarray,
                                   g: cpu_conv.ConvGeometry) -> np.ndarray:
        """``dx`` of a stride-1 convolution as the convolution of the output gradient,
        padded by ``k - 1 - pad``, with the kernel flipped in both axes and its channel
        axes swapped (Dumoulin and Visin 2016, "A guide to convolution arithmetic for deep
        learning", section 4.1): im2col and GEMMs by chunks as in the forward pass, each
        chunk's GEMM writing the gradient's rows, instead of ``W^T @ dy`` and col2im's
        k*k read-modify-write passes. Same sums, in another order."""
        n, k = g.n, self.k
        back = cpu_conv.ConvGeometry(n, self.cout, g.oh, g.ow, k, k - 1 - self.pad, 1)
        planes = self.scratch("grad_planes", back.planes_shape, laid.dtype, zero=True)
        cpu_conv.fill_planes(planes, cpu_conv.nchw(laid.reshape(self.cout, g.oh, g.ow, n)), back)
        flipped = self.scratch("flipped", (self.cin, self.cout, k, k), laid.dtype)
        np.copyto(flipped, self.params[0].transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
        weight = flipped.reshape(self.cin, -1)
        dx = self.recycled("dx", (self.cin, g.h, g.w, n), laid.dtype)
        chunk = cpu_conv.gemm_chunk(back, self.cin, laid.dtype.itemsize,
                                    cpu_conv.chunk_budget(False))
        cols = self.scratch("grad_cols", (back.rows, chunk * back.per_row), laid.dtype)
        for _ in cpu_conv.convolve(weight, planes, back, cols, dx.reshape(self.cin, -1), chunk):
            pass  # each chunk's GEMM writes its rows of dx
        return cpu_conv.nchw(dx)

    def _weight_grad(self, laid: np.ndarray, g: cpu_conv.ConvGeometry) -> None:
        """``dW = dy @ cols^T``, computed as its transpose ``cols @ dy^T`` into a (rows, cout)
        work array: BLAS runs that orientation faster at a ResNet's shapes (16 output
        channels: 72-73 against 54-58 GFLOP/s here; docs/RESULTS.md). On kept columns one
        GEMM, or a sum over chunks where that keeps each a small GEMM
        (:func:`cpu_conv.small_gemm_rows`); else a sum of GEMMs on the columns built again
        chunk by chunk."""
        dweight = self.grads[0].reshape(self.cout, -1)
        dweight_t = self.scratch("dweight_t", (g.rows, self.cout), laid.dtype)
        kept = self._cols is not None
        chunk = (cpu_conv.small_gemm_rows(g, self.cout) if kept else
                 cpu_conv.gemm_chunk(g, self.cout, laid.dtype.itemsize,
                                     cpu_conv.chunk_budget(False)))
        cols = self._cols if kept else self.scratch("cols", (g.rows, chunk * g.per_row),
                                                    laid.dtype)
        for first, count in cpu_conv.chunks(g.oh, chunk):
            span = slice(first * g.per_row, (first + count) * g.per_row)
            block_t = laid[:, span].T
            chunk_cols = (cols[:, span] if kept
                          else cpu_conv.columns(cols, self._planes, g, first, count))
            if first == 0:
                np.matmul(chunk_cols, block_t, out=dweight_t)
            else:
                part = self.scratch("dweight_part", dweight_t.shape, laid.dtype)
                dweight_t += np.matmul(chunk_cols, block_t, out=part)
        np.copyto(dweight, dweight_t.T)

    def _window_taps(self, planes: np.ndarray) -> np.ndarray:
        """The window's tap offsets in ``planes`` (:func:`cpu_native.window_taps`), kept
        while their shape holds: the forward pass's and the weight gradient's."""
        return self._kept("taps", planes.shape, lambda: cpu_native.window_taps(
            self.cin, *planes.shape[1:], self.k))

    def _kept(self, name: str, key: Any, make: Any) -> Any:
        """``make()``, kept under ``name`` while ``key`` (a geometry) holds."""
        cache = self.__dict__.setdefault("_kept_values", {})
        if name not in cache or cache[name][0] != key:
            cache[name] = (key, make())
        return cache[name][1]

    def _direct_input_grad(self, laid: np.ndarray, g: cpu_conv.ConvGeometry) -> np.ndarray:
        """``dx`` by the compiled kernel: for each of the stride x stride phases of the
        input pixels (:func:`cpu_native.input_grad_phases`), a stride-1 correlation of the
        zero-bordered output gradient with the kernel taps that reach that phase, written
        to every stride-th pixel of ``dx``. Stride 1 is one phase: the correlation with
        the flipped kernel. The same multiply-adds as col2im's GEMM, no column matrix."""
        n, k, s = g.n, self.k, self.stride
        rows = self._kept("phases", g, lambda: cpu_native.input_grad_phases(
            g.h, g.oh, k, self.pad, s))
        cols = self._kept("col_phases", g, lambda: cpu_native.input_grad_phases(
            g.w, g.ow, k, self.pad, s))
        hq, wq = rows[0] + g.oh + rows[1], cols[0] + g.ow + cols[1]
        planes = self.scratch("grad_planes", (self.cout, hq, wq, n), laid.dtype, zero=True)
        np.copyto(planes[:, rows[0] : rows[0] + g.oh, cols[0] : cols[0] + g.ow],
                  laid.reshape(self.cout, g.oh, g.ow, n))
        dx = self.recycled("dx", (self.cin, g.h, g.w, n), laid.dtype)
        by_input = self.params[0].transpose(1, 0, 2, 3)  # (C, K, k, k)
        for py, taps_i, shifts_i in rows[2]:
            for px, taps_j, shifts_j in cols[2]:
                out = dx[:, py::s, px::s]
                if not taps_i or not taps_j:
                    out.fill(0)
                    continue
                weight = by_input[:, :, taps_i][:, :, :, taps_j]
                packed = self.scratch(f"packed_phase{py}_{px}",
                                      cpu_native.packed_shape(weight.shape), laid.dtype)
                taps = self._kept(f"taps_phase{py}_{px}", g, lambda ti=shifts_i, tj=shifts_j:
                                  cpu_native.window_taps(self.cout, hq, wq, n, k, ti, tj))
                cpu_native.correlate(planes, (wq * n, n), taps,
                                     cpu_native.pack_weights(weight, packed), None, out)
        return cpu_conv.nchw(dx)

    def _direct_weight_grad(self, laid: np.ndarray, g: cpu_conv.ConvGeometry) -> None:
        """``dW`` by the compiled kernel (:mod:`cpu_native`): for each output channel block,
        every window tap's product with ``dy`` summed over pixels and samples in vector
        lanes, from the forward pass's padded planes (no column matrix)."""
        dweight = self.grads[0]
        if not dweight.flags.c_contiguous:
            dweight = self.scratch("dweight", dweight.shape, laid.dtype)
        work = self.scratch("dweight_lanes", cpu_native.weight_grad_work(self.cin, self.k),
                            laid.dtype)
        cpu_native.conv_weight_grad(self._planes, laid.reshape(self.cout, g.oh, g.ow, g.n),
                                    dweight, work, self._window_taps(self._planes), self.stride)
        if dweight is not self.grads[0]:
            np.copyto(self.grads[0], dweight)

    def _output_grad(self, dy: np.ndarray) -> np.ndarray:
        """``dy`` (masked by the fused ReLU) as the (cout, OH*OW*N) rows of the output's
        layout (:meth:`Layer.channel_rows`)."""
        return self.channel_rows(dy, "dy_rows", self._mask if self.fused_relu else None)

    def _gpu_forward(self, xp: Any, x: Any) -> Any:
        """im2col kernel, one cuBLAS GEMM, bias kernel (the CPU path's layout)."""
        n, c, h, w = x.shape
        oh, ow = ops.conv_output_hw(h, w, self.k, self.pad, self.stride)
        cols = ops.im2col(x, self.k, self.pad, self.stride)  # (c*k*k, n*oh*ow)
        self._cols, self._in_shape, self._out_hw = cols, (n, c, h, w), (oh, ow)
        y = self.params[0].reshape(self.cout, -1) @ cols  # (cout, n*oh*ow)
        if self.bias:
            ops.bias_add_(y, self.params[1], axis=0)
        return xp.ascontiguousarray(y.reshape(self.cout, n, oh, ow).transpose(1, 0, 2, 3))

    def _gpu_backward(self, xp: Any, dy: Any) -> Any:
        """cuBLAS GEMMs, the bias-gradient kernel and the col2im kernel."""
        n, _, oh, ow = dy.shape
        dy2 = xp.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(self.cout, n * oh * ow)
        xp.matmul(dy2, self._cols.T, out=self.grads[0].reshape(self.cout, -1))
        if self.bias:
            ops.bias_grad(dy2, out=self.grads[1], axis=0)
        if not self.needs_input_grad:
            return None
        dcols = self.params[0].reshape(self.cout, -1).T @ dy2  # (c*k*k, n*oh*ow)
        return ops.col2im(dcols, self._in_shape, self.k, self.pad, self.stride)

    def __repr__(self) -> str:
        extra = (f", stride={self.stride}" if self.stride != 1 else "") + (
            "" if self.bias else ", bias=False")
        return f"Conv2d({self.cin}, {self.cout}, k={self.k}, pad={self.pad}{extra})"


class MaxPool2d(Layer):
    """Non-overlapping k x k max pooling (stride k); ties go to the first maximum."""

    def __init__(self, kernel: int = 2) -> None:
        super().__init__()
        self.k = kernel

    def output_shape(self, input_shape: Shape) -> Shape:
        c, h, w = input_shape
        if h % self.k or w % self.k:
            raise ValueError(f"MaxPool2d({self.k}) needs sides divisible by {self.k}, got {h}x{w}")
        return (c, h // self.k, w // self.k)

    def forward(self, x: Any, train: bool = True) -> Any:
        if _on_gpu(x):
            y, self._arg = ops.maxpool_forward(x, self.k)
            return y
        self.keep_buffers = train
        x, self._four_d = _stored(x)  # (C, H, W, N): pooling acts on axes 1 and 2
        if self.k == 2:
            y = self._max_of_four(x, train)
            if y is not None:
                return _handed_on(y, self._four_d)
        self._quad_input = None
        c, h, w, n = x.shape
        k = self.k
        itype = _int_view_type(x.dtype)
        # Stage 1, along each row: the first maximum of every k columns.
        row_best = self.scratch("row_best", (c, h, w // k, n), x.dtype)
        np.copyto(row_best, x[:, :, 0::k])
        self._col_arg = self.scratch("col_arg", row_best.shape, itype)
        self._col_arg.fill(0)
        for j in range(1, k):
            self._take_first_max(row_best, self._col_arg, x[:, :, j::k], j, "cols")
        # Stage 2, down each window: the first maximum of those k row maxima.
        y = self.recycled("out", (c, h // k, w // k, n), x.dtype)
        np.copyto(y, row_best[:, 0::k])
        self._row_arg = self.scratch("row_arg", y.shape, itype)
        self._row_arg.fill(0)
        for i in range(1, k):
            self._take_first_max(y, self._row_arg, row_best[:, i::k], i, "rows")
        self._in_shape = x.shape
        return _handed_on(y, self._four_d)

    @staticmethod
    def _quads(x: np.ndarray) -> tuple[np.ndarray, ...]:
        """The four elements of every 2 x 2 window of (C, H, W, N) ``x``, in row-major
        order, as strided views."""
        return x[:, 0::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 0::2], x[:, 1::2, 1::2]

    def _max_of_four(self, x: np.ndarray, train: bool) -> np.ndarray | None:
        """2 x 2 pooling as three ``np.maximum`` passes over the window's strided views,
        the window's first maximum found again in the backward pass by comparison; None
        (the general path then runs) if a window is NaN, where ``argmax``'s first-NaN
        rule must be followed exactly. Without NaN the values are the general path's
        (a tie of -0 and +0 may keep either sign)."""
        a, b, c, d = self._quads(x)
        y = self.recycled("out", a.shape, x.dtype)
        upper = self.scratch("upper", a.shape, x.dtype)
        np.maximum(a, b, out=upper)
        np.maximum(c, d, out=y)
        np.maximum(upper, y, out=y)
        if np.isnan(y).any():
            return None
        # Read again by backward, then let go (a kept reference would make the layers
        # that own these arrays allocate new ones: Layer.recycled).
        self._quad_input, self._last_out = (x, y) if train else (None, None)
        return y

    def _route_quads(self, dy: np.ndarray) -> np.ndarray:
        """The backward pass of :meth:`_max_of_four`: each gradient to its window's first
        element equal to the maximum, +0 to the others (selected on the bits, so every
        value of ``dy``, NaN included, is copied, never multiplied)."""
        x, y = self._quad_input, self._last_out
        self._quad_input = self._last_out = None
        quads = self._quads(x)
        dx = self.recycled("dx", x.shape, dy.dtype)
        itype = _int_view_type(dy.dtype)
        taken = self.scratch("taken", y.shape, _BOOL)
        hit = self.scratch("hit", y.shape, _BOOL)
        mask = self.scratch("bits", y.shape, itype)
        bits = np.ascontiguousarray(dy).view(itype)
        for index, (quad, target) in enumerate(zip(quads, self._quads(dx))):
            if index == 0:
                np.equal(quad, y, out=taken)
                np.copyto(hit, taken)
            elif index < 3:
                np.equal(quad, y, out=hit)
                np.greater(hit, taken, out=hit)  # equal to the maximum, none before it
                np.logical_or(taken, hit, out=taken)
            else:
                np.logical_not(taken, out=hit)
            np.negative(hit.view(np.int8), out=mask, casting="unsafe")
            np.bitwise_and(bits, mask, out=target.view(itype))
        return dx

    def _take_first_max(self, best: np.ndarray, arg: np.ndarray, cand: Any, index: int,
                        stage: str) -> None:
        """Where ``cand`` beats ``best`` as ``argmax`` rules it, take it and set ``arg = index``.

        Scanning a window's elements in row-major order and taking a later one
        only when it is greater (or NaN where the best is not) picks exactly
        ``argmax``'s first maximum (first NaN). Row maxima first, then the
        maximum over rows, keeps that order. Selection is branch-free on the
        bits (``best ^= (best ^ cand) & mask``), so values, signed zeros and
        NaNs are copied, never recomputed. Work arrays are contiguous.
        """
        itype = arg.dtype
        shape = best.shape
        cont = self.scratch(f"{stage}_cand", shape, best.dtype)
        np.copyto(cont, cand)  # one strided copy; the comparisons then run contiguous
        keep = self.scratch(f"{stage}_keep", shape, _BOOL)
        nan = self.scratch(f"{stage}_nan", shape, _BOOL)
        np.less_equal(cont, best, out=keep)
        np.not_equal(best, best, out=nan)
        np.logical_or(keep, nan, out=keep)
        mask = self.scratch(f"{stage}_mask", shape, itype)
        np.subtract(keep, 1, out=mask, dtype=itype)  # -1 (all bits) where cand wins, else 0
        diff = self.scratch(f"{stage}_diff", shape, itype)
        bits = best.view(itype)
        np.bitwise_xor(bits, cont.view(itype), out=diff)
        np.bitwise_and(diff, mask, out=diff)
        np.bitwise_xor(bits, diff, out=bits)
        np.bitwise_xor(arg, index, out=diff)
        np.bitwise_and(diff, mask, out=diff)
        np.bitwise_xor(arg, diff, out=arg)

    def backward(self, dy: Any) -> Any:
        if _on_gpu(dy):
            return ops.maxpool_backward(dy, self._arg, self.k)
        dy = _as_stored(dy, self._four_d)
        if self._quad_input is not None:
            return _handed_on(self._route_quads(dy), self._four_d)
        c, h, w, n = self._in_shape
        k = self.k
        itype = self._col_arg.dtype
        # Route each gradient to its window's row (+0 elsewhere), then to its column:
        # ``g & -(arg == i)`` selects on the bits (exact, branch-free).
        rows = self.scratch("rows", (c, h, w // k, n), dy.dtype)
        self._route(dy, self._row_arg, k, lambda i: rows[:, i::k].view(itype), "rows")
        dx = self.recycled("dx", (c, h, w, n), dy.dtype)
        self._route(rows, self._col_arg, k, lambda j: dx[:, :, j::k].view(itype), "cols")
        return _handed_on(dx, self._four_d)

    def _route(self, g: np.ndarray, arg: np.ndarray, k: int, dest: Any, stage: str) -> None:
        """``dest(i)[...] = g where arg == i else +0``, for every ``i < k``."""
        itype = arg.dtype
        hit = self.scratch(f"{stage}_hit", arg.shape, _BOOL)
        mask = self.scratch(f"{stage}_mask", arg.shape, itype)
        bits = np.ascontiguousarray(g).view(itype)
        for i in range(k):
            np.equal(arg, i, out=hit)
            np.negative(hit.view(np.int8), out=mask)
            np.bitwise_and(bits, mask, out=dest(i))

    def __repr__(self) -> str:
        return f"MaxPool2d({self.k})"


class BatchNorm2d(Layer):
    """Batch normalization of NCHW activations (Ioffe and Szegedy 2015), PyTorch's conventions.

    Training normalizes with the batch's per-channel mean and biased variance
    and updates the running statistics, ``running = (1 - momentum) * running
    + momentum * batch`` with the unbiased variance (momentum 0.1, eps 1e-5,
    as ``torch.nn.BatchNorm2d``); evaluation normalizes with the running
    statistics. Parameters: gamma (initially 1) then beta (0); buffers (the
    model's flat ``buffers``, not trained): running mean (0) then variance (1).

    The statistics come from per-channel sums about a shift, the running mean
    (:func:`~syncbench.kernels.ops.bn_sums`), so the variance
    ``S2/n - (S1/n)**2`` does not cancel. ``sync`` (set by ``--sync-bn``; None:
    this rank's batch only) sums a small array over every rank in place:
    SyncBatchNorm, as PyTorch's and Horovod's. It is called once in the forward
    pass (the sums and the count) and once in the backward pass (the sums of
    ``dy`` and ``dy * xhat``), so the statistics and the input gradient are those
    of the global batch; the gamma and beta gradients stay this rank's sums,
    averaged over ranks with the other gradients. With ``sync`` the running
    statistics, hence the shift, are the same on every rank.
    """

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.channels, self.eps, self.momentum = channels, eps, momentum
        self.sync: Any = None
        self.buffers: list[Any] = []

    def param_shapes(self) -> list[Shape]:
        return [(self.channels,), (self.channels,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.ones(self.channels), np.zeros(self.channels)]

    def param_decays(self) -> list[bool]:
        return [True, False]  # gamma decays, beta does not (MXNet's set_wd_mult)

    def buffer_shapes(self) -> list[Shape]:
        return [(self.channels,), (self.channels,)]

    def init_buffers(self) -> list[np.ndarray]:
        return [np.zeros(self.channels), np.ones(self.channels)]

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 3 or input_shape[0] != self.channels:
            raise ValueError(f"BatchNorm2d({self.channels}) got input shape {input_shape}")
        return input_shape

    def _summed(self, sums: Any, count: int) -> tuple[Any, float]:
        """``sums`` and ``count`` over every rank (``sync``), else as they are."""
        if self.sync is None:
            return sums, float(count)
        xp = _xp(sums)
        packed = xp.empty(sums.size + 1, dtype=sums.dtype)
        packed[:-1] = sums.ravel()
        packed[-1] = count
        self.sync(packed)
        return packed[:-1].reshape(sums.shape), float(packed[-1])

    def forward(self, x: Any, train: bool = True) -> Any:
        if not _on_gpu(x):
            return self._cpu_forward(x, train)
        gamma, beta = self.params
        running_mean, running_var = self.buffers
        xp = _xp(x)
        if not train:
            invstd = 1.0 / xp.sqrt(running_var + self.eps)
            return ops.bn_normalize(x, running_mean, invstd, gamma, beta)[0]
        n, c, h, w = x.shape
        shift = running_mean.copy()
        sums, count = self._summed(ops.bn_sums(x, shift), n * h * w)
        mean, invstd = self._statistics(sums, count, xp)
        y, self._xhat = ops.bn_normalize(x, mean, invstd, gamma, beta)
        self._scale = gamma * invstd
        return y

    def _statistics(self, sums: Any, count: float, xp: Any) -> tuple[Any, Any]:
        """The batch mean and 1/std from the sums about the running mean, and the running
        statistics' update (PyTorch's: the unbiased variance)."""
        running_mean, running_var = self.buffers
        centred = sums[0] / count
        var = xp.maximum(sums[1] / count - centred * centred, 0.0)
        mean = running_mean + centred
        invstd = 1.0 / xp.sqrt(var + self.eps)
        m = self.momentum
        running_mean *= 1.0 - m
        running_mean += m * mean
        running_var *= 1.0 - m
        running_var += (m * count / max(count - 1.0, 1.0)) * var
        return mean, invstd

    def _cpu_forward(self, x: np.ndarray, train: bool) -> np.ndarray:
        """The CPU path: :mod:`syncbench.kernels.cpu_norm` on each channel's row of the
        (C, H, W, N) layout, into kept work arrays, by blocks that stay in cache; a ReLU
        that follows is applied in the same blocks when fused (:func:`fuse_relus`)."""
        self.keep_buffers = train
        gamma, beta = self.params
        running_mean, running_var = self.buffers
        n, c, h, w = x.shape
        rows = self.channel_rows(x, "rows")  # a copy only of an NCHW input (a first layer)
        y = self.recycled("out", rows.shape, x.dtype)
        self._mask = self.scratch("relu_mask", y.shape, _BOOL) if self.fused_relu else None
        if not train:
            scale = gamma / np.sqrt(running_var + self.eps)
            cpu_norm.affine(rows, scale, beta - running_mean * scale, y, self._mask)
        else:
            # The rows about the running mean (the shift) are kept for the backward pass
            # in place of xhat (cpu_norm's docstring).
            work = self.scratch("work", rows.shape, x.dtype)
            sums, count = self._summed(cpu_norm.sums_about(rows, running_mean, work), rows.shape[1])
            centred = sums[0] / count  # batch mean - shift, before the running mean moves
            _, invstd = self._statistics(sums, count, np)
            self._work, self._centred, self._invstd = work, centred, invstd
            self._scale = cpu_norm.normalize_centred(work, centred, invstd, gamma, beta, y,
                                                     self._mask)
        return cpu_conv.nchw(y.reshape(c, h, w, n))

    def backward(self, dy: Any) -> Any:
        if not _on_gpu(dy):
            return self._cpu_backward(dy)
        local = ops.bn_grad_sums(dy, self._xhat)
        self.grads[1][...] = local[0]  # beta
        self.grads[0][...] = local[1]  # gamma
        sums, count = self._summed(local, dy.shape[0] * dy.shape[2] * dy.shape[3])
        if not self.needs_input_grad:
            return None
        return ops.bn_backward(dy, self._xhat, self._scale, sums[0] / count, sums[1] / count)

    def _cpu_backward(self, dy: np.ndarray) -> np.ndarray | None:
        n, c, h, w = dy.shape
        rows = self.channel_rows(dy, "dy")  # the fused ReLU's mask is applied by blocks
        tmp = self.scratch("dwork", (c, cpu_norm.block_width(rows)), dy.dtype)
        local = cpu_norm.grad_sums(rows, self._work, self._centred, self._invstd, self._mask, tmp)
        self.grads[1][...] = local[0]  # beta
        self.grads[0][...] = local[1]  # gamma
        sums, count = self._summed(local, rows.shape[1])
        if not self.needs_input_grad:
            return None
        dx = self.recycled("dx", rows.shape, dy.dtype)
        cpu_norm.input_grad(rows, self._work, self._centred, self._invstd, self._scale,
                            sums[0] / count, sums[1] / count, dx, tmp, self._mask)
        return cpu_conv.nchw(dx.reshape(c, h, w, n))

    def __repr__(self) -> str:
        return f"BatchNorm2d({self.channels})"


class BasicBlock(Layer):
    """A ResNet basic block (He et al. 2016): conv3x3(stride)-BN-ReLU-conv3x3-BN, plus the
    shortcut, then ReLU of the sum.

    The shortcut is the identity, or, where the block subsamples (stride 2) or
    widens, the paper's option A for CIFAR: the input sampled every
    ``stride``-th row and column with zero channels appended
    (:func:`~syncbench.kernels.ops.shortcut_forward`), no parameters. The block
    is one layer of the model: its parameters (conv1, bn1, conv2, bn2, in that
    order) and buffers are contiguous in the flat buffers.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.cin, self.cout, self.stride = in_channels, out_channels, stride
        self.conv1 = Conv2d(in_channels, out_channels, 3, padding=1, stride=stride, bias=False)
        self.bn1 = BatchNorm2d(out_channels)
        self.relu = ReLU()
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = BatchNorm2d(out_channels)
        self.project = stride != 1 or in_channels != out_channels

    def sublayers(self) -> list[Layer]:
        return [self.conv1, self.bn1, self.relu, self.conv2, self.bn2]

    def param_shapes(self) -> list[Shape]:
        return [shape for layer in self.sublayers() for shape in layer.param_shapes()]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [value for layer in self.sublayers() for value in layer.init_params(rng)]

    def param_decays(self) -> list[bool]:
        return [d for layer in self.sublayers() for d in layer.param_decays()]

    def buffer_shapes(self) -> list[Shape]:
        return [shape for layer in self.sublayers() for shape in layer.buffer_shapes()]

    def init_buffers(self) -> list[np.ndarray]:
        return [value for layer in self.sublayers() for value in layer.init_buffers()]

    def bind(self, params: list[Any], grads: list[Any]) -> None:
        super().bind(params, grads)
        counts = [len(layer.param_shapes()) for layer in self.sublayers()]
        for layer, p, g in zip(self.sublayers(), _split(params, counts), _split(grads, counts)):
            layer.bind(p, g)

    def bind_buffers(self, buffers: list[Any]) -> None:
        super().bind_buffers(buffers)
        counts = [len(layer.buffer_shapes()) for layer in self.sublayers()]
        for layer, b in zip(self.sublayers(), _split(buffers, counts)):
            layer.bind_buffers(b)

    def output_shape(self, input_shape: Shape) -> Shape:
        shape = input_shape
        for layer in self.sublayers():
            shape = layer.output_shape(shape)
        return shape

    def forward(self, x: Any, train: bool = True) -> Any:
        h = x
        for layer in self.sublayers():
            h = layer.forward(h, train)
        if not _on_gpu(x):
            return self._cpu_sum(x, h, train)
        shortcut = ops.shortcut_forward(x, self.cout, self.stride) if self.project else x
        y = ops.add_relu(h, shortcut)
        self._y, self._in_shape = y, x.shape
        return y

    def _cpu_sum(self, x: np.ndarray, h: np.ndarray, train: bool) -> np.ndarray:
        """``relu(h + shortcut(x))`` into a kept (C, H, W, N) array, with the mask kept for
        the backward pass (the formulas of ``ops.add_relu`` and ``ops.shortcut_forward``;
        the option-A shortcut is added where it is non-zero instead of being built)."""
        self.keep_buffers = train
        n, c, oh, ow = h.shape
        out = self.recycled("out", (c, oh, ow, n), h.dtype)
        hm, xm = cpu_conv.stored(h), cpu_conv.stored(x)
        if self.project:
            s, cin = self.stride, x.shape[1]
            np.copyto(out, hm)
            sampled = out[:cin]
            np.add(sampled, xm[:, ::s, ::s], out=sampled)
        else:
            np.add(hm, xm, out=out)
        self._mask = self.scratch("relu_mask", out.shape, _BOOL)
        ops.relu_in_place(out, self._mask)
        self._in_shape = x.shape
        return cpu_conv.nchw(out)

    def _cpu_backward(self, dy: np.ndarray) -> np.ndarray | None:
        n, c, oh, ow = dy.shape
        d = self.recycled("d", (c, oh, ow, n), dy.dtype)
        np.multiply(cpu_conv.stored(dy), self._mask, out=d)
        dh = cpu_conv.nchw(d)
        for layer in reversed(self.sublayers()):
            dh = layer.backward(dh)
        if not self.needs_input_grad:
            return None
        if self.project:  # the shortcut's gradient: d's first channels at the sampled places
            s, cin = self.stride, self._in_shape[1]
            target = dh[:, :, ::s, ::s]
            np.add(target, cpu_conv.nchw(d[:cin]), out=target)
        else:
            np.add(dh, cpu_conv.nchw(d), out=dh)
        return dh

    def backward(self, dy: Any) -> Any:
        if not _on_gpu(dy):
            return self._cpu_backward(dy)
        d = ops.relu_backward(dy, self._y)
        dh = d
        for layer in reversed(self.sublayers()):
            dh = layer.backward(dh)
        if not self.needs_input_grad:
            return None
        shortcut = ops.shortcut_backward(d, self._in_shape, self.stride) if self.project else d
        ops.axpy_(dh, 1.0, shortcut)
        return dh

    def __repr__(self) -> str:
        return f"BasicBlock({self.cin}, {self.cout}, stride={self.stride})"


def _split(items: list[Any], counts: list[int]) -> list[list[Any]]:
    """``items`` cut into consecutive runs of ``counts`` (one per sublayer)."""
    out, start = [], 0
    for count in counts:
        out.append(items[start : start + count])
        start += count
    return out


def all_layers(layers: list[Layer]) -> list[Layer]:
    """Every layer of ``layers``, those inside residual blocks included (depth first)."""
    out: list[Layer] = []
    stack = list(reversed(layers))
    while stack:
        layer = stack.pop()
        out.append(layer)
        stack.extend(reversed(layer.sublayers()))
    return out


def first_trained(layers: Sequence[Layer]) -> int:
    """Index of the first layer with parameters (0 if none): backward stops there, and that
    layer computes no input gradient (``Model.first_trained``)."""
    return next((i for i, layer in enumerate(layers) if layer.param_shapes()), 0)


def fuse_relus(layers: list[Layer]) -> None:
    """Let every Conv2d, Linear or BatchNorm2d directly followed by a ReLU apply it (CPU path).

    The fused layer rectifies its output while writing it (no separate pass
    and output array) and masks the incoming gradient while copying it; the
    ReLU layer then passes arrays through. Same formula as :class:`ReLU`
    (``x * (x > 0)``), so outputs and gradients are the same bits. The GPU
    path is unchanged (the ReLU kernel runs as before). Residual blocks are
    searched too (their first BatchNorm and ReLU).
    """
    for before, after in zip(layers, layers[1:]):
        if isinstance(before, (Conv2d, Linear, BatchNorm2d)) and type(after) is ReLU:
            before.fused_relu = True
            after.absorbed = True
    for layer in layers:
        if layer.sublayers():
            fuse_relus(layer.sublayers())


class GlobalAvgPool(Layer):
    """(n, c, h, w) -> (n, c): the mean of each channel's plane."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return (input_shape[0],)

    def forward(self, x: Any, train: bool = True) -> Any:
        self._hw = x.shape[2:]
        if _on_gpu(x):
            return ops.avgpool_forward(x)
        # The CPU path, on the (C, H, W, N) layout: the (C, N) means, handed on as their
        # (N, C) view; the formula of ops.avgpool_forward (a sum, then one scaling).
        self.keep_buffers = train
        planes = np.ascontiguousarray(cpu_conv.stored(x))
        c, h, w, n = planes.shape
        return (planes.reshape(c, h * w, n).sum(axis=1) * (1.0 / (h * w))).T

    def backward(self, dy: Any) -> Any:
        if _on_gpu(dy):
            return ops.avgpool_backward(dy, self._hw)
        h, w = self._hw
        n, c = dy.shape
        dx = self.recycled("dx", (c, h, w, n), dy.dtype)
        np.copyto(dx, (dy.T * (1.0 / (h * w)))[:, None, None, :])
        return cpu_conv.nchw(dx)


class SoftmaxCrossEntropy:
    """Mean softmax cross-entropy over a batch, forward and backward together."""

    def forward(self, logits: Any, labels: Any) -> float:
        # ops.softmax_xent: one fused kernel on the GPU, its NumPy reference on the CPU.
        loss, self._dlogits = ops.softmax_xent(logits, labels)
        return loss

    def backward(self) -> Any:
        """Gradient of the mean loss with respect to the logits."""
        return self._dlogits
