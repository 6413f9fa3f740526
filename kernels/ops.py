"""Fused operations of the training hot loop: NumPy references, dispatched by backend.

Every public operation is ONE entry point for both backends: with NumPy
arrays it runs its NumPy body (the CPU implementation, and the oracle the
CUDA kernels are tested against); with CuPy arrays (its first argument
decides) the hand-written kernel of the same name in
:mod:`syncbench.kernels.cuda_ops`. ``op.reference`` is the NumPy body.

Update rules (``ALGORITHMS.md``; element-wise, in place, no allocation when a
``scratch`` buffer of the same shape is given): ``sgd_momentum_``,
``v = mu * v + (g + wd * w)``; ``w = w - lr * v`` (PyTorch momentum SGD with
L2 weight decay; ``wd`` a number or one decay per element, zero where a
parameter is exempt, ``MomentumSGD.decay``); ``adamw_``, AdamW's step
(:class:`~syncbench.algorithms.adamw.AdamW`, PyTorch's bias corrections); ``axpy_``,
``y += a * x`` (Oscars' model averaging). OD-SGD's local step and DC-ASGD's compensation
stay array expressions in their algorithms: ASGD updates in host memory (its
RMA windows), and each OD-SGD variant would need a fused kernel of its own.

Layer operations (the references reproduce the CPU layers of
:mod:`syncbench.kernels.layers`): ``softmax_xent`` (fused forward + backward
of the mean cross-entropy), ``relu_*``, ``bias_add_``/``bias_grad``,
``im2col``/``col2im`` (convolution as one GEMM, windows ``stride`` apart),
``maxpool_*`` (non-overlapping, first maximum wins); for ResNets BatchNorm's
passes (``bn_sums``, ``bn_normalize``, ``bn_grad_sums``, ``bn_backward``),
``add_relu``, the option-A shortcut (``shortcut_*``) and global average
pooling (``avgpool_*``); for the transformer (``gpt``) the non-GEMM passes of
:mod:`~syncbench.kernels.transformer_ops`, whose functions are the references
(``layernorm_*``, ``gelu_*``, attention's ``causal_softmax`` and its backward,
``embedding_backward``'s scatter-add).

The NumPy bodies do the kernels' floating-point operations in the same
order (the kernels are built with ``--fmad=false``): element-wise results are
bit-identical; reductions may differ in the last bits, the kernels summing
in fixed chunks without atomics (deterministic), NumPy pairwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from syncbench.kernels import cpu_native
from syncbench.kernels import transformer_ops as T

Shape = tuple[int, ...]

#: name -> NumPy reference body, for every dispatched operation.
REFERENCES: dict[str, Callable[..., Any]] = {}


def on_device(array: Any) -> bool:
    """True for a CuPy array (checked by type, without importing CuPy)."""
    return type(array).__module__.startswith("cupy")


def _device_ops() -> Any:
    """The GPU implementations (:mod:`syncbench.kernels.cuda_ops`)."""
    from syncbench.kernels import cuda_ops  # lazy: it imports this module; GPU path only

    return cuda_ops


def _dispatch(reference: Callable[..., Any] | None = None, *,
              host: Callable[..., bool] | None = None) -> Any:
    """Run ``cuda_ops.<name>`` for CuPy arrays, else the NumPy ``reference``; with ``host``
    (``@_dispatch(host=...)``), host arrays first go to ``host``, which returns whether it
    ran (a compiled CPU kernel equal to the reference, :mod:`cpu_native`)."""
    if reference is None:
        return functools.partial(_dispatch, host=host)
    name = reference.__name__
    first_name = reference.__code__.co_varnames[0]

    @functools.wraps(reference)
    def op(*args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else kwargs.get(first_name)
        if on_device(first):
            return getattr(_device_ops(), name)(*args, **kwargs)
        if host is not None and host(*args, **kwargs):
            return None
        return reference(*args, **kwargs)

    op.reference = reference  # type: ignore[attr-defined]
    REFERENCES[name] = reference
    return op


# -- optimizer updates over flat buffers -------------------------------------
@_dispatch(host=cpu_native.sgd_momentum_)
def sgd_momentum_(
    params: Any,
    grads: Any,
    velocity: Any,
    lr: float,
    momentum: float,
    weight_decay: float,
    scratch: Any = None,
) -> None:
    """Momentum SGD with L2 weight decay, in place (the PyTorch convention).

    ``v = mu * v + (g + wd * w)``; ``w = w - lr * v``. With ``momentum == 0``
    the velocity buffer just holds the decayed gradient. ``grads`` is left
    unchanged. ``weight_decay`` is a number (0: no decay term) or an array of
    the params' shape and dtype, one decay per element (its product is added
    even where it is 0).
    """
    velocity *= momentum
    velocity += grads
    if not np.isscalar(weight_decay) or weight_decay:
        velocity += np.multiply(params, weight_decay, out=scratch)
    params -= np.multiply(velocity, lr, out=scratch)


def flush_subnormals_(x: np.ndarray, scratch: np.ndarray) -> None:
    """Set the subnormal elements of CPU float array ``x`` to zero, in place (``scratch``:
    ``x``'s shape and dtype; a boolean mask is allocated).

    Why: a velocity whose gradient has become exactly 0 (a dead ReLU unit) decays
    geometrically, ``v *= mu``, into the subnormal range, and ``mu = 0.9`` leaves 1 to 4
    times the smallest subnormal fixed under rounding to nearest, so it stays there. On
    x86 cores that take a microcode assist per subnormal operand (Intel's), the update
    then runs several times slower for the rest of the run: the 235k-parameter mlp's
    update went from 0.16 to 1.0 ms after 800 steps on one batch (docs/RESULTS.md).
    Zeroing them is what ``torch.set_flush_denormal(True)`` does for every operation;
    here it touches only values below ``finfo.tiny``, every element above it unchanged.
    """
    # On the bit patterns: |x| - 1 < the mantissa's mask exactly for subnormals (zero wraps
    # around to the largest unsigned value), so zeros, which a dead velocity has many of,
    # do not count, and the usual flush (none found) writes nothing.
    info = np.finfo(x.dtype)
    unsigned = np.dtype(f"u{x.itemsize}")
    magnitude = np.bitwise_and(x.view(unsigned), unsigned.type((1 << (info.bits - 1)) - 1),
                               out=scratch.view(unsigned))
    magnitude -= unsigned.type(1)
    subnormal = magnitude < unsigned.type((1 << info.nmant) - 1)
    if subnormal.any():
        np.putmask(x, subnormal, 0)


@_dispatch
def axpy_(y: Any, alpha: float, x: Any, scratch: Any = None) -> None:
    """``y += alpha * x`` in place (model averaging, compensations)."""
    if alpha == 1.0:
        y += x
    else:
        y += np.multiply(x, alpha, out=scratch)


@_dispatch
def adamw_(params: Any, grads: Any, exp_avg: Any, exp_avg_sq: Any, decay: Any, lr: float,
           scalars: tuple[float, ...], num: Any = None, den: Any = None) -> None:
    """One AdamW step in place (:class:`~syncbench.algorithms.adamw.AdamW`, PyTorch's
    ``torch.optim.AdamW`` rule), the step count already advanced.

    ``decay``: the weight decay, a number (0: none) or one per element (the
    ``--wd-exempt`` mask times it); ``scalars``: (1 - beta1, beta2, 1 - beta2,
    sqrt(1 - beta2^t), eps, -lr / (1 - beta1^t)), Python floats; ``num``, ``den``:
    scratch buffers of the params' shape (allocated when None)::

        w = w * (1 - lr * decay)
        m = m + (g - m) * (1 - beta1)
        v = v * beta2 + (g * (1 - beta2)) * g
        w = w + (m * -step) / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    """
    one_minus_b1, beta2, one_minus_b2, correction2_sqrt, eps, neg_step = scalars
    num = np.empty_like(params) if num is None else num
    den = np.empty_like(params) if den is None else den
    if isinstance(decay, (int, float)):
        if decay:
            params *= 1 - lr * decay
    else:  # per element: 1 - lr * (wd * mask), as wd * mask * (-lr) + 1
        np.multiply(decay, -lr, out=num)
        num += 1
        params *= num
    np.subtract(grads, exp_avg, out=num)
    num *= one_minus_b1
    exp_avg += num
    exp_avg_sq *= beta2
    np.multiply(grads, one_minus_b2, out=num)
    num *= grads
    exp_avg_sq += num
    np.sqrt(exp_avg_sq, out=den)
    den /= correction2_sqrt
    den += eps
    np.multiply(exp_avg, neg_step, out=num)
    num /= den
    params += num


# -- layer kernels ------------------------------------------------------------
def check_labels(labels: np.ndarray, classes: int) -> None:
    """``ValueError`` unless every host label is in ``[0, classes)``.

    NumPy indexing would wrap a negative label to another class without a
    word; the CUDA kernel would read outside the row.
    """
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        bad = labels[(labels < 0) | (labels >= classes)]
        raise ValueError(f"softmax_xent: label {int(bad[0])} is outside 0..{classes - 1}")


@_dispatch
def softmax_xent(logits: Any, labels: Any) -> tuple[float, Any]:
    """Mean softmax cross-entropy of (n, k) ``logits`` and its gradient.

    Returns ``(loss, dlogits)`` with ``dlogits = (softmax - onehot) / n``.
    Labels outside ``[0, k)`` raise ``ValueError`` (:func:`check_labels`).
    The CUDA version returns the loss as a 0-d device array.
    """
    check_labels(labels, logits.shape[1])
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    n = logits.shape[0]
    rows = np.arange(n)
    loss = float((np.log(total[:, 0]) - shifted[rows, labels]).mean())
    probs = exp / total
    probs[rows, labels] -= 1.0
    probs /= n
    return loss, probs


@_dispatch
def relu_forward(x: Any, out: Any = None) -> Any:
    """``max(x, 0)``."""
    return np.multiply(x, x > 0, out=out)


@_dispatch
def relu_backward(dy: Any, y: Any, out: Any = None) -> Any:
    """``dy`` where the forward output ``y`` was positive, else 0."""
    return np.multiply(dy, y > 0, out=out)


def relu_in_place(y: np.ndarray, mask: np.ndarray) -> None:
    """CPU: ``y = y * (y > 0)`` in place, keeping the mask in ``mask`` (ReLU's own formula,
    so NaN stays NaN and negatives become -0 exactly as :func:`relu_forward` gives them):
    the ReLU a CPU layer fuses into its output (``layers.fuse_relus``, ``cpu_norm``)."""
    np.greater(y, 0, out=mask)
    np.multiply(y, mask, out=y)


@_dispatch
def bias_add_(y: Any, bias: Any, axis: int = 1) -> None:
    """Add ``bias`` along ``axis`` of a 2-D ``y``, in place.

    ``axis=1``: ``y[r, c] += bias[c]`` (Linear, (batch, features));
    ``axis=0``: ``y[c, j] += bias[c]`` (Conv2d, (channels, n*oh*ow)).
    """
    y += bias if axis == 1 else bias[:, None]


@_dispatch
def bias_grad(dy: Any, out: Any = None, axis: int = 1) -> Any:
    """Bias gradient: sum of a 2-D ``dy`` over every axis but ``axis`` (see :func:`bias_add_`)."""
    return dy.sum(axis=1 - axis, out=out)


def conv_output_hw(h: int, w: int, k: int, pad: int, stride: int = 1) -> tuple[int, int]:
    """Output height and width of a ``k`` x ``k`` convolution with padding ``pad``."""
    return (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1


@_dispatch
def im2col(x: Any, k: int, pad: int, stride: int = 1) -> Any:
    """Unfold every ``k`` x ``k`` window of NCHW ``x`` (zero-padded by ``pad``; windows
    ``stride`` apart).

    Returns a (c*k*k, n*oh*ow) matrix: row (ch, ki, kj), column (b, oy, ox)
    (the layout of :class:`~syncbench.kernels.layers.Conv2d`).
    """
    n, c, h, w = x.shape
    oh, ow = conv_output_hw(h, w, k, pad, stride)
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    windows = windows[:, :, : (oh - 1) * stride + 1 : stride, : (ow - 1) * stride + 1 : stride]
    # windows[b, ch, oy, ox, ki, kj] -> (ch, ki, kj, b, oy, ox)
    return windows.transpose(1, 4, 5, 0, 2, 3).reshape(c * k * k, n * oh * ow)


@_dispatch
def col2im(cols: Any, in_shape: Shape, k: int, pad: int, stride: int = 1) -> Any:
    """Fold a (c*k*k, n*oh*ow) column gradient onto NCHW ``in_shape`` (the adjoint of im2col).

    Window contributions are added in (ki, kj) order, starting from zero.
    """
    n, c, h, w = in_shape
    oh, ow = conv_output_hw(h, w, k, pad, stride)
    dcols = cols.reshape(c, k, k, n, oh, ow)
    dx = np.zeros((c, n, h + 2 * pad, w + 2 * pad), dtype=cols.dtype)
    s = stride
    for i in range(k):
        for j in range(k):
            dx[:, :, i : i + (oh - 1) * s + 1 : s, j : j + (ow - 1) * s + 1 : s] += dcols[:, i, j]
    dx = dx.transpose(1, 0, 2, 3)
    if pad:
        dx = dx[:, :, pad:-pad, pad:-pad]
    return np.ascontiguousarray(dx)


def _pool_blocks(x: Any, k: int) -> Any:
    n, c, h, w = x.shape
    blocks = x.reshape(n, c, h // k, k, w // k, k).transpose(0, 1, 2, 4, 3, 5)
    return blocks.reshape(n, c, h // k, w // k, k * k)


@_dispatch
def maxpool_forward(x: Any, k: int) -> tuple[Any, Any]:
    """Non-overlapping ``k`` x ``k`` max pooling of NCHW ``x``.

    Returns ``(y, argmax)``: ``argmax`` (int32, shape of ``y``) is ``ki*k + kj``
    of the first maximum of each window.
    """
    blocks = _pool_blocks(x, k)
    arg = blocks.argmax(axis=-1)
    y = np.take_along_axis(blocks, arg[..., None], axis=-1)[..., 0]
    return y, arg.astype(np.int32)


@_dispatch
def maxpool_backward(dy: Any, argmax: Any, k: int) -> Any:
    """Route each pooled gradient to the position of its window's maximum (NCHW result)."""
    n, c, oh, ow = dy.shape
    blocks = np.zeros((n, c, oh, ow, k * k), dtype=dy.dtype)
    np.put_along_axis(blocks, argmax[..., None].astype(np.intp), dy[..., None], axis=-1)
    blocks = blocks.reshape(n, c, oh, ow, k, k).transpose(0, 1, 2, 4, 3, 5)
    return blocks.reshape(n, c, oh * k, ow * k)


# -- BatchNorm, residual blocks, global average pooling (ResNets) ------------------------
# Per-channel statistics of NCHW activations. Only the passes over the whole
# activation tensor are kernels; the per-channel vectors (length C) they
# produce are combined with plain array arithmetic by the layer
# (:class:`~syncbench.kernels.layers.BatchNorm2d`).
@_dispatch
def bn_sums(x: Any, shift: Any) -> Any:
    """Per-channel sums of NCHW ``x`` about ``shift`` (length C): a (2, C) array of
    ``sum(x - shift)`` and ``sum((x - shift)**2)`` over samples, rows and columns.

    The shift (the running mean) keeps ``var = S2/n - (S1/n)**2`` free of
    cancellation; any shift gives the same statistics in exact arithmetic, and
    the sums of several ranks add up (one Allreduce for SyncBatchNorm).
    """
    d = x - shift[None, :, None, None]
    return np.stack([d.sum(axis=(0, 2, 3)), (d * d).sum(axis=(0, 2, 3))])


@_dispatch
def bn_normalize(x: Any, mean: Any, invstd: Any, gamma: Any, beta: Any) -> tuple[Any, Any]:
    """``xhat = (x - mean) * invstd`` and ``y = xhat * gamma + beta`` per channel of NCHW
    ``x``; returns ``(y, xhat)``."""
    xhat = (x - mean[None, :, None, None]) * invstd[None, :, None, None]
    y = xhat * gamma[None, :, None, None] + beta[None, :, None, None]
    return y, xhat


@_dispatch
def bn_grad_sums(dy: Any, xhat: Any) -> Any:
    """Per-channel (2, C) sums of ``dy`` and of ``dy * xhat`` (NCHW): the gradients of
    beta and gamma, and what the input gradient needs (summed over ranks with
    SyncBatchNorm)."""
    return np.stack([dy.sum(axis=(0, 2, 3)), (dy * xhat).sum(axis=(0, 2, 3))])


@_dispatch
def bn_backward(dy: Any, xhat: Any, scale: Any, mean_dy: Any, mean_dy_xhat: Any) -> Any:
    """Input gradient of batch normalization with batch statistics (NCHW):
    ``dx = scale * (dy - mean_dy - xhat * mean_dy_xhat)`` per channel, with
    ``scale = gamma * invstd`` and the means over the (global) batch."""
    t = dy - mean_dy[None, :, None, None]
    t -= xhat * mean_dy_xhat[None, :, None, None]
    t *= scale[None, :, None, None]
    return t


@_dispatch
def add_relu(a: Any, b: Any) -> Any:
    """``max(a + b, 0)``: a residual block's sum and its ReLU (backward:
    :func:`relu_backward` of the result)."""
    s = a + b
    return np.multiply(s, s > 0, out=s)


@_dispatch
def shortcut_forward(x: Any, channels: int, stride: int) -> Any:
    """He et al.'s option-A shortcut: ``x`` subsampled by ``stride`` (every
    ``stride``-th row and column, from the first), zero channels appended up to
    ``channels``. No parameters."""
    n, c, h, w = x.shape
    sub = x[:, :, ::stride, ::stride]
    y = np.zeros((n, channels, sub.shape[2], sub.shape[3]), dtype=x.dtype)
    y[:, :c] = sub
    return y


@_dispatch
def shortcut_backward(dy: Any, in_shape: Shape, stride: int) -> Any:
    """The adjoint of :func:`shortcut_forward`: the first ``c`` channels of ``dy`` back
    at the sampled positions of NCHW ``in_shape``, zero elsewhere."""
    n, c, h, w = in_shape
    dx = np.zeros(in_shape, dtype=dy.dtype)
    dx[:, :, ::stride, ::stride] = dy[:, :c]
    return dx


@_dispatch
def avgpool_forward(x: Any) -> Any:
    """Global average pooling: (n, c, h, w) -> (n, c), the mean of each plane."""
    n, c, h, w = x.shape
    return x.reshape(n, c, h * w).sum(axis=2) * (1.0 / (h * w))


@_dispatch
def avgpool_backward(dy: Any, hw: tuple[int, int]) -> Any:
    """The adjoint of :func:`avgpool_forward`: each (n, c) gradient / (h*w) over its plane."""
    h, w = hw
    scaled = dy * (1.0 / (h * w))
    return np.ascontiguousarray(np.broadcast_to(scaled[:, :, None, None], (*dy.shape, h, w)))


# -- the transformer (gpt): kernels of transformer_ops' non-GEMM passes ----------------------
@_dispatch
def layernorm_forward(x: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> tuple[Any, Any, Any]:
    """LayerNorm over the last axis (:func:`~syncbench.kernels.transformer_ops.layernorm_forward`):
    ``(y, xhat, rstd)``, ``rstd`` of shape ``(..., 1)``."""
    y, (xhat, rstd) = T.layernorm_forward(x, gamma, beta, eps)
    return y, xhat, rstd


@_dispatch
def layernorm_backward(dy: Any, xhat: Any, rstd: Any, gamma: Any) -> tuple[Any, Any, Any]:
    """``(dx, dgamma, dbeta)`` of :func:`layernorm_forward`
    (:func:`~syncbench.kernels.transformer_ops.layernorm_backward`)."""
    return T.layernorm_backward(dy, (xhat, rstd), gamma)


@_dispatch
def gelu_forward(x: Any) -> tuple[Any, Any]:
    """GELU, tanh approximation: ``(y, t)``, ``t`` the tanh term :func:`gelu_backward`
    reuses (:func:`~syncbench.kernels.transformer_ops.gelu_forward`)."""
    t = T.gelu_tanh(x)
    return T.gelu_forward(x, t), t


@_dispatch
def gelu_backward(dy: Any, x: Any, t: Any) -> Any:
    """``dy * gelu'(x)`` (:func:`~syncbench.kernels.transformer_ops.gelu_backward`)."""
    return T.gelu_backward(dy, x, t)


@_dispatch
def causal_softmax(scores: Any, scale: float) -> Any:
    """Attention's probabilities from (..., t, t) ``scores``: the softmax of each row of
    ``scores * scale`` with the causal mask (:func:`~syncbench.kernels.transformer_ops.
    causal_softmax`); a new array."""
    return T.causal_softmax(scores, scale)


@_dispatch
def causal_softmax_backward(dp: Any, probs: Any, scale: float) -> Any:
    """The scores' gradient from the probabilities' (:func:`~syncbench.kernels.
    transformer_ops.causal_softmax_backward`)."""
    return T.causal_softmax_backward(dp, probs, scale)


@_dispatch
def embedding_backward(dh: Any, tokens: Any, wte_grad: Any, wpe_grad: Any) -> None:
    """The embedding's gradients: ``dh`` (B, T, d) scatter-added into ``wte_grad`` by token,
    summed over the batch into ``wpe_grad`` (:func:`~syncbench.kernels.transformer_ops.
    embedding_backward`)."""
    T.embedding_backward(dh, tokens, wte_grad, wpe_grad)
