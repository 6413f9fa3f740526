"""Example inputs for every CUDA operation, shared by the tests and the benchmark.

Each :class:`Case` of :data:`CASES` builds the host arguments of one
operation of :mod:`syncbench.kernels.ops` (by its name), small for the tests
(odd sizes, ties, exact zeros, several reduction chunks, one-block grids) or
at benchmark size (LeNet's and ResNet-8's layer shapes at their batch
sizes; ``gpt``'s default at batch 16, and its parameter count for AdamW).
The emulated kernels (``tests/unit/test_cuda_kernels.py``), the GPU tests
(``tests/unit/test_gpu.py``) and :mod:`syncbench.kernels.cuda_bench` run the same
cases and apply the same rules: a case marked exact must match the NumPy
reference bit for bit (same operations in the same order), the others
within :func:`tolerance` (sums in another order, or another ``exp``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.kernels import ops
from syncbench.kernels import transformer_ops as T
from syncbench.kernels.cuda_ops import BIAS_CHUNK


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


#: Parameters of ``gpt``'s default size (d 128, 4 layers, ctx 128, 256 tokens): AdamW's
#: buffers at benchmark size.
GPT_PARAMS = 842_496


def _adamw_case(decay: str):
    """AdamW at step 3 (beta1 0.9, beta2 0.999, lr 1e-3, eps 1e-8): moments already
    non-zero, the second one non-negative; ``decay`` none, number or array (a third
    exempt)."""
    def build(rng, dtype, large):
        n = GPT_PARAMS if large else 1000
        w, g, m = (rng.standard_normal(n).astype(dtype) for _ in range(3))
        v = (0.01 * rng.random(n)).astype(dtype)
        v[::11] = 0  # sqrt(0): the step is m / eps
        lr, beta1, beta2, eps, steps = 1e-3, 0.9, 0.999, 1e-8, 3
        scalars = (1 - beta1, beta2, 1 - beta2, (1 - beta2 ** steps) ** 0.5, eps,
                   -lr / (1 - beta1 ** steps))
        wd: Any = {"none": 0.0, "number": 0.1}.get(decay)
        if wd is None:
            wd = (0.1 * (rng.random(w.size) < 0.7)).astype(dtype)
        return (w, g, m, v, wd, lr, scalars)
    return build


#: The transformer's activations: (batch, tokens, width); ``gpt``'s default width and
#: context at batch 16 at benchmark size.
GPT_SHAPE = (16, 128, 128)
#: Heads of ``gpt``'s default (4); attention's scores are (batch, heads, t, t).
GPT_HEADS = 4


def _tokens_shape(large: bool, small: tuple[int, int, int]) -> tuple[int, int, int]:
    return GPT_SHAPE if large else small


def _layernorm_forward_case(rng, dtype, large):
    b, t, d = _tokens_shape(large, (2, 5, 37))
    x = (2 * rng.standard_normal((b, t, d)) + 0.5).astype(dtype)
    return (x, _per_channel(rng, dtype, d, 0.5, 1.5), _per_channel(rng, dtype, d))


def _layernorm_backward_case(rows: int):
    """(dy, xhat, rstd, gamma) from the reference forward; ``rows`` per batch element
    (more than :data:`~syncbench.kernels.cuda_ops.LN_CHUNK` in all: several chunks)."""
    def build(rng, dtype, large):
        b, t, d = _tokens_shape(large, (3, rows, 19))
        x = rng.standard_normal((b, t, d)).astype(dtype)
        gamma, beta = _per_channel(rng, dtype, d, 0.5, 1.5), _per_channel(rng, dtype, d)
        _, (xhat, rstd) = T.layernorm_forward(x, gamma, beta)
        return (rng.standard_normal((b, t, d)).astype(dtype), xhat, rstd, gamma)
    return build


def _gelu_input(rng, dtype, large):
    b, t, d = _tokens_shape(large, (2, 5, 37))
    x = (2 * rng.standard_normal((b * t, 4 * d))).astype(dtype)
    x.reshape(-1)[::13] = 0
    x.reshape(-1)[1] = 9.5  # beyond tanh's range: t rounds to 1
    x.reshape(-1)[2] = -9.5
    return x


def _gelu_backward_case(rng, dtype, large):
    x = _gelu_input(rng, dtype, large)
    return (rng.standard_normal(x.shape).astype(dtype), x, T.gelu_tanh(x))


def _scores(rng, dtype, large):
    b, t, d = _tokens_shape(large, (2, 7, 12))
    return (3 * rng.standard_normal((b, GPT_HEADS if large else 3, t, t))).astype(dtype), d


def _causal_softmax_case(rng, dtype, large):
    scores, d = _scores(rng, dtype, large)
    return (scores, 1.0 / (d // GPT_HEADS) ** 0.5)


def _causal_softmax_backward_case(rng, dtype, large):
    scores, d = _scores(rng, dtype, large)
    scale = 1.0 / (d // GPT_HEADS) ** 0.5
    probs = T.causal_softmax(scores, scale)
    return (rng.standard_normal(scores.shape).astype(dtype), probs, scale)


def _embedding_backward_case(rng, dtype, large):
    """Tokens with repeats and a vocabulary row no token uses; ``wte_grad`` holds the tied
    output layer's part (added to), ``wpe_grad`` stale values (overwritten; a context
    longer than the windows)."""
    b, t, d = _tokens_shape(large, (3, 5, 4))
    vocab, ctx = (256, t) if large else (7, 8)
    tokens = rng.integers(0, vocab - 1, size=(b, t)).astype(np.int64)
    return (rng.standard_normal((b, t, d)).astype(dtype), tokens,
            rng.standard_normal((vocab, d)).astype(dtype),
            rng.standard_normal((ctx, d)).astype(dtype))


CASES: tuple[Case, ...] = (
    Case("sgd_momentum_", "sgd_momentum_",
         lambda r, d, b: (*_flat(r, d, b, 3), 0.05, 0.9, 1e-4)),
    Case("sgd_momentum_/no-decay", "sgd_momentum_",
         lambda r, d, b: (*_flat(r, d, b, 3), 0.1, 0.0, 0.0)),
    Case("sgd_momentum_/array-decay", "sgd_momentum_", _decay_array_case),
    Case("adamw_", "adamw_", _adamw_case("number")),
    Case("adamw_/no-decay", "adamw_", _adamw_case("none")),
    Case("adamw_/array-decay", "adamw_", _adamw_case("array")),
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
    Case("layernorm_forward", "layernorm_forward", _layernorm_forward_case, exact=False),
    Case("layernorm_backward", "layernorm_backward", _layernorm_backward_case(7),
         exact=False),
    Case("layernorm_backward/chunks", "layernorm_backward", _layernorm_backward_case(100),
         exact=False),
    Case("gelu_forward", "gelu_forward", lambda r, d, b: (_gelu_input(r, d, b),),
         exact=False),
    Case("gelu_backward", "gelu_backward", _gelu_backward_case),
    Case("causal_softmax", "causal_softmax", _causal_softmax_case, exact=False),
    Case("causal_softmax_backward", "causal_softmax_backward",
         _causal_softmax_backward_case, exact=False),
    Case("embedding_backward", "embedding_backward", _embedding_backward_case),
)


def run_case(fn: Callable[..., Any], args: tuple) -> list[Any]:
    """Call ``fn`` on ``args`` (mutated in place) and return what a comparison looks at:
    the returned arrays/floats (a 0-d array, the kernels' loss, as a float), then every
    array argument after the call."""
    result = fn(*args)
    returned = list(result) if isinstance(result, tuple) else [result]
    returned = [float(r) if getattr(r, "ndim", None) == 0 else r for r in returned]
    return [r for r in returned if r is not None] + [a for a in args if hasattr(a, "shape")]
