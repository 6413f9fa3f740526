"""The CUDA kernels and their NumPy references, checked on a machine without a GPU.

* every ``kernels/cuda/*.cu`` compiles with NVRTC (else ``nvcc -ptx``) for
  float and double, and ``compile_check`` reports a broken source as a failure;
* the NumPy references of :mod:`syncbench.kernels.ops` equal straightforward
  formulas (loops, the update rules of ALGORITHMS.md, strided convolution
  windows, BatchNorm's statistics and its input gradient by finite
  differences, the shortcut's and pooling's adjoints) and the CPU layers;
* the kernels themselves, built as C++ and run thread by thread by the host
  emulator through the real wrappers (:mod:`syncbench.kernels.cuda_ops`) and launch code,
  equal the references (bit for bit where the operations are the same), also
  with a one-block grid (grid-stride loops), and at benchmark sizes with the
  exactness rules and tolerances the GPU test applies;
* the wrappers reject mismatched shapes before any launch; ``sgd_momentum_``
  launches the per-element-decay kernel for an array decay (``MomentumSGD``
  with a decay mask, bit-identical); the reductions (bias gradient,
  BatchNorm sums, average pooling) give the same bits for any launch shape,
  and BatchNorm's sums add in the documented chunk order;
* NaN and bad labels: the kernels propagate NaN as the CPU layers do and
  ``softmax_xent`` rejects labels outside ``[0, classes)``;
* the compiled source carries the digest of ``common.cuh`` (CuPy's kernel
  cache key);
* the layers' GPU path (kernels + GEMMs), emulated the same way, gives the
  CPU path's loss and gradients, ``gpt``'s too (the transformer kernels), and
  AdamW's fused kernel steps bit for bit as the reference; the CPU path never
  imports CuPy.

Split off this module: ``tests/e2e/test_cuda_kernels_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

import inspect
import shutil

import numpy as np
import pytest

from syncbench.kernels import (
    compile_check,
    cuda_launch,
    cuda_ops,
    ops,
)
from syncbench.kernels.layers import Conv2d, Linear, MaxPool2d, ReLU, SoftmaxCrossEntropy

DTYPES = [np.float32, np.float64]
SOURCES = cuda_launch.source_files()
GPU_COMPILERS = [c for c in ("nvrtc", "nvcc") if c in compile_check.available_compilers()]
NO_COMPILER = ("neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is available: "
               "the CUDA sources cannot be compiled here")
needs_gpu_compiler = pytest.mark.skipif(not GPU_COMPILERS, reason=NO_COMPILER)
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="g++ is needed to build the kernels for the host emulator")


# -- compilation -----------------------------------------------------------------
def test_sources_and_signatures_are_consistent():
    assert {p.stem for p in SOURCES} == {"batchnorm", "conv", "dense", "optim", "pool",
                                         "resnet", "softmax_xent", "transformer"}
    table = cuda_launch.kernel_signatures()
    launched = set()
    text = inspect.getsource(cuda_ops)
    for name in table:
        if f'"{name}"' in text:
            launched.add(name)
    assert launched == set(table), f"kernels never launched: {set(table) - launched}"
    assert table["sgd_momentum"].params == (
        "real*", "real*", "real*", "real", "real", "real", "long long")
    assert table["sgd_momentum_array_decay"].params == (
        "real*", "real*", "real*", "real*", "real", "real", "long long")


def test_every_op_has_a_kernel_path_with_the_same_signature():
    assert set(cuda_ops.OPS) == set(ops.REFERENCES)
    for name, reference in ops.REFERENCES.items():
        device = getattr(cuda_ops, name)
        assert list(inspect.signature(device).parameters) == list(
            inspect.signature(reference).parameters), name
        assert getattr(ops, name).reference is reference


@needs_gpu_compiler
@pytest.mark.parametrize("dtype", DTYPES, ids=["float", "double"])
@pytest.mark.parametrize("source", SOURCES, ids=[p.name for p in SOURCES])
def test_source_compiles(source, dtype):
    compiler = GPU_COMPILERS[0]  # NVRTC when installed, else nvcc -ptx
    result = compile_check.build(source, compiler, np.dtype(dtype))
    assert result.ok, f"{compiler} failed on {source.name} ({dtype.__name__}):\n{result.log}"


# -- NumPy references against straightforward formulas ------------------------------
def _rand(rng, *shape):
    return rng.standard_normal(shape)


def test_sgd_momentum_reference_is_the_pytorch_rule():
    rng = np.random.default_rng(0)
    w, g, v = _rand(rng, 50), _rand(rng, 50), _rand(rng, 50)
    lr, mu, wd = 0.05, 0.9, 1e-3
    v_expected = mu * v + (g + wd * w)
    w_expected = w - lr * v_expected
    ops.sgd_momentum_(w, g, v, lr, mu, wd)
    np.testing.assert_allclose(v, v_expected, rtol=1e-13)
    np.testing.assert_allclose(w, w_expected, rtol=1e-13)


def test_axpy_reference():
    rng = np.random.default_rng(1)
    y, x = _rand(rng, 40), _rand(rng, 40)
    y0 = y.copy()
    ops.axpy_(y, 0.25, x)
    np.testing.assert_allclose(y, y0 + 0.25 * x, rtol=1e-13)


def test_softmax_xent_reference_against_loops_and_finite_differences():
    rng = np.random.default_rng(4)
    logits, labels = 3 * _rand(rng, 6, 5), rng.integers(0, 5, size=6)
    loss, dlogits = ops.softmax_xent(logits, labels)
    expected = np.mean([-np.log(np.exp(row[t]) / np.exp(row).sum())
                        for row, t in zip(logits, labels)])
    assert loss == pytest.approx(expected, rel=1e-13)
    eps = 1e-6
    for i, j in [(0, 0), (2, 3), (5, labels[5])]:
        up, down = logits.copy(), logits.copy()
        up[i, j] += eps
        down[i, j] -= eps
        numeric = (ops.softmax_xent(up, labels)[0] - ops.softmax_xent(down, labels)[0]) / (2 * eps)
        assert dlogits[i, j] == pytest.approx(numeric, abs=1e-8)


def test_relu_and_bias_references():
    rng = np.random.default_rng(5)
    x, dy = _rand(rng, 4, 6), _rand(rng, 4, 6)
    y = ops.relu_forward(x)
    np.testing.assert_array_equal(y, np.where(x > 0, x, 0.0))
    np.testing.assert_array_equal(ops.relu_backward(dy, y), np.where(x > 0, dy, 0.0))
    b = _rand(rng, 6)
    z = x.copy()
    ops.bias_add_(z, b)
    assert all(np.array_equal(z[r], x[r] + b) for r in range(4))
    np.testing.assert_allclose(ops.bias_grad(dy), [sum(dy[r, c] for r in range(4))
                                                   for c in range(6)], rtol=1e-13)
    z = x.copy()
    ops.bias_add_(z, b[:4], axis=0)
    assert all(np.array_equal(z[:, c], x[:, c] + b[:4]) for c in range(6))
    np.testing.assert_allclose(ops.bias_grad(dy, axis=0), dy.sum(axis=1), rtol=1e-13)


def _naive_im2col(x, k, pad, stride=1):
    n, c, h, w = x.shape
    oh, ow = ops.conv_output_hw(h, w, k, pad, stride)
    cols = np.zeros((c * k * k, n * oh * ow))
    for ch in range(c):
        for ki in range(k):
            for kj in range(k):
                for b in range(n):
                    for oy in range(oh):
                        for ox in range(ow):
                            iy, ix = oy * stride + ki - pad, ox * stride + kj - pad
                            if 0 <= iy < h and 0 <= ix < w:
                                cols[(ch * k + ki) * k + kj, (b * oh + oy) * ow + ox] = \
                                    x[b, ch, iy, ix]
    return cols


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("pad", [0, 1, 2])
def test_im2col_col2im_references_against_loops_and_adjointness(pad, stride):
    rng = np.random.default_rng(6)
    x, k = _rand(rng, 2, 3, 7, 6), 3  # an odd and an even side
    cols = ops.im2col(x, k, pad, stride)
    np.testing.assert_array_equal(cols, _naive_im2col(x, k, pad, stride))
    # col2im is the adjoint: <im2col(x), C> == <x, col2im(C)>
    c = _rand(rng, *cols.shape)
    dx = ops.col2im(c, x.shape, k, pad, stride)
    assert np.sum(cols * c) == pytest.approx(np.sum(x * dx), rel=1e-12)


def test_sgd_momentum_reference_with_a_decay_per_element():
    rng = np.random.default_rng(2)
    w, g, v = _rand(rng, 50), _rand(rng, 50), _rand(rng, 50)
    wd = 1e-3 * (rng.random(50) < 0.5)  # zero: exempt from decay
    expected_v = 0.9 * v + (g + wd * w)
    expected_w = w - 0.05 * expected_v
    plain_v, plain_w = 0.9 * v + g, w - 0.05 * (0.9 * v + g)
    ops.sgd_momentum_(w, g, v, 0.05, 0.9, wd)
    np.testing.assert_allclose(v, expected_v, rtol=1e-13)
    np.testing.assert_allclose(w, expected_w, rtol=1e-13)
    exempt = wd == 0
    np.testing.assert_array_equal(w[exempt], plain_w[exempt])
    np.testing.assert_array_equal(v[exempt], plain_v[exempt])


def _batch_norm(x, shift, gamma, beta, eps=1e-5):
    """Training-mode BatchNorm through the references (batch statistics from shifted sums)."""
    count = x.size // x.shape[1]
    s1, s2 = ops.bn_sums(x, shift)
    mean = shift + s1 / count
    var = s2 / count - (s1 / count) ** 2
    invstd = 1 / np.sqrt(var + eps)
    y, xhat = ops.bn_normalize(x, mean, invstd, gamma, beta)
    return y, xhat, mean, var, invstd


def test_batchnorm_references_against_formulas_and_finite_differences():
    rng = np.random.default_rng(9)
    x = 2 * _rand(rng, 3, 4, 5, 6) + 1.5
    shift, gamma, beta = _rand(rng, 4), 1 + 0.1 * _rand(rng, 4), _rand(rng, 4)
    count = 3 * 5 * 6
    sums = ops.bn_sums(x, shift)
    assert sums.shape == (2, 4)
    for ch in range(4):
        d = [x[b, ch, i, j] - shift[ch] for b, i, j in np.ndindex(3, 5, 6)]
        assert sums[0, ch] == pytest.approx(sum(d), rel=1e-12)
        assert sums[1, ch] == pytest.approx(sum(e * e for e in d), rel=1e-12)
    y, xhat, mean, var, invstd = _batch_norm(x, shift, gamma, beta)
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(var, x.var(axis=(0, 2, 3)), rtol=1e-10)
    for b, ch, i, j in np.ndindex(*x.shape):
        assert xhat[b, ch, i, j] == (x[b, ch, i, j] - mean[ch]) * invstd[ch]
        assert y[b, ch, i, j] == xhat[b, ch, i, j] * gamma[ch] + beta[ch]
    dy = _rand(rng, *x.shape)
    grad_sums = ops.bn_grad_sums(dy, xhat)
    assert grad_sums.shape == (2, 4)
    np.testing.assert_allclose(grad_sums[0], dy.sum(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(grad_sums[1], (dy * xhat).sum(axis=(0, 2, 3)), rtol=1e-12)
    # the input gradient of L(x) = sum(dy * BN(x)), batch statistics included
    dx = ops.bn_backward(dy, xhat, gamma * invstd, grad_sums[0] / count, grad_sums[1] / count)
    assert dx.shape == x.shape
    eps = 1e-6
    for index in [(0, 0, 0, 0), (1, 2, 3, 4), (2, 3, 4, 5)]:
        up, down = x.copy(), x.copy()
        up[index] += eps
        down[index] -= eps
        numeric = (np.sum(dy * _batch_norm(up, shift, gamma, beta)[0])
                   - np.sum(dy * _batch_norm(down, shift, gamma, beta)[0])) / (2 * eps)
        assert dx[index] == pytest.approx(numeric, rel=1e-6, abs=1e-8)


def test_residual_references_against_loops_and_adjointness():
    rng = np.random.default_rng(10)
    a, b = _rand(rng, 2, 3, 7, 6), _rand(rng, 2, 3, 7, 6)
    np.testing.assert_array_equal(ops.add_relu(a, b), np.maximum(a + b, 0))
    y = ops.shortcut_forward(a, 5, 2)
    assert y.shape == (2, 5, 4, 3)
    for n, ch, oy, ox in np.ndindex(*y.shape):
        assert y[n, ch, oy, ox] == (a[n, ch, 2 * oy, 2 * ox] if ch < 3 else 0.0)
    dy = _rand(rng, *y.shape)
    dx = ops.shortcut_backward(dy, a.shape, 2)
    assert dx.shape == a.shape
    assert np.sum(y * dy) == pytest.approx(np.sum(a * dx), rel=1e-12)
    np.testing.assert_array_equal(ops.shortcut_forward(a, 3, 1), a)  # the identity
    pooled = ops.avgpool_forward(a)
    assert pooled.shape == (2, 3)
    np.testing.assert_allclose(pooled, a.mean(axis=(2, 3)), rtol=1e-12)
    dp = _rand(rng, 2, 3)
    dxp = ops.avgpool_backward(dp, (7, 6))
    assert dxp.shape == a.shape and dxp.flags.c_contiguous
    assert np.sum(pooled * dp) == pytest.approx(np.sum(a * dxp), rel=1e-12)


def test_maxpool_references_against_loops():
    rng = np.random.default_rng(7)
    x = rng.integers(-2, 2, size=(2, 2, 4, 6)).astype(np.float64)  # many ties
    y, arg = ops.maxpool_forward(x, 2)
    assert arg.dtype == np.int32
    dy = _rand(rng, *y.shape)
    dx = ops.maxpool_backward(dy, arg, 2)
    expected_dx = np.zeros_like(x)
    for b, ch, oy, ox in np.ndindex(*y.shape):
        window = [x[b, ch, 2 * oy + i, 2 * ox + j] for i in range(2) for j in range(2)]
        first = window.index(max(window))  # the first maximum
        assert y[b, ch, oy, ox] == max(window) and arg[b, ch, oy, ox] == first
        expected_dx[b, ch, 2 * oy + first // 2, 2 * ox + first % 2] = dy[b, ch, oy, ox]
    np.testing.assert_array_equal(dx, expected_dx)


# -- references against the CPU layers (what the CPU computes) ---------------------------
def _bind(layer, rng):
    params = [rng.standard_normal(s) for s in layer.param_shapes()]
    layer.bind(params, [np.zeros(s) for s in layer.param_shapes()])
    return params


def test_references_reproduce_the_cpu_layers():
    rng = np.random.default_rng(8)
    conv = Conv2d(3, 4, 3, padding=1)
    weight, bias = _bind(conv, rng)
    x = _rand(rng, 2, 3, 6, 5)
    y = conv.forward(x)
    # The CPU layer sums its GEMMs by chunks of output rows (kernels/cpu_conv.py):
    # the same products, summed in another order, so equal to rounding.
    expected = weight.reshape(4, -1) @ ops.im2col(x, 3, 1)
    ops.bias_add_(expected, bias, axis=0)
    np.testing.assert_allclose(y, expected.reshape(4, 2, 6, 5).transpose(1, 0, 2, 3), rtol=1e-13)
    dy = _rand(rng, *y.shape)
    dx = conv.backward(dy)
    dy2 = np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(4, -1)
    np.testing.assert_allclose(dx, ops.col2im(weight.reshape(4, -1).T @ dy2, x.shape, 3, 1),
                               rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(conv.grads[1], ops.bias_grad(dy2, axis=0), rtol=1e-13)
    np.testing.assert_allclose(conv.grads[0].reshape(4, -1), dy2 @ ops.im2col(x, 3, 1).T,
                               rtol=1e-13, atol=1e-15)

    pool = MaxPool2d(2)
    xp = rng.integers(-2, 2, size=(2, 3, 4, 6)).astype(np.float64)
    yp = pool.forward(xp)
    ref_y, ref_arg = ops.maxpool_forward(xp, 2)
    np.testing.assert_array_equal(yp, ref_y)
    dyp = _rand(rng, *yp.shape)
    np.testing.assert_array_equal(pool.backward(dyp), ops.maxpool_backward(dyp, ref_arg, 2))

    relu, xr, dyr = ReLU(), _rand(rng, 5, 7), _rand(rng, 5, 7)
    np.testing.assert_array_equal(relu.forward(xr), ops.relu_forward(xr))
    np.testing.assert_array_equal(relu.backward(dyr), ops.relu_backward(dyr, ops.relu_forward(xr)))

    lin = Linear(7, 3)
    _, lbias = _bind(lin, rng)
    yl = lin.forward(xr)
    expected = xr @ lin.params[0]
    ops.bias_add_(expected, lbias)
    np.testing.assert_array_equal(yl, expected)
    lin.backward(dyl := _rand(rng, 5, 3))
    np.testing.assert_array_equal(lin.grads[1], ops.bias_grad(dyl))

    loss_fn, logits, labels = SoftmaxCrossEntropy(), _rand(rng, 9, 10), rng.integers(0, 10, 9)
    loss = loss_fn.forward(logits, labels)
    ref_loss, ref_d = ops.softmax_xent(logits, labels)
    assert loss == ref_loss
    np.testing.assert_array_equal(loss_fn.backward(), ref_d)


def _bad_calls():
    """(label, call, message) of wrapper calls with mismatched shapes."""
    f32 = np.float32
    x, v3, v4 = np.zeros((2, 4, 3, 3), f32), np.zeros(3, f32), np.zeros(4, f32)
    flat = np.zeros(8, f32)
    wte, wpe, toks = np.zeros((5, 3), f32), np.zeros((3, 3), f32), np.zeros((4, 3), np.int64)
    return [
        ("bn_sums/shift", lambda: cuda_ops.bn_sums(x, v3), "shift of shape"),
        ("bn_sums/2-d", lambda: cuda_ops.bn_sums(x.reshape(8, 9), v4), "NCHW"),
        ("bn_normalize/invstd", lambda: cuda_ops.bn_normalize(x, v4, v3, v4, v4),
         "invstd of shape"),
        ("bn_grad_sums/xhat", lambda: cuda_ops.bn_grad_sums(x, x[:1]), "xhat of shape"),
        ("bn_backward/mean_dy", lambda: cuda_ops.bn_backward(x, x, v4, v3, v4),
         "mean_dy of shape"),
        ("add_relu", lambda: cuda_ops.add_relu(x, x[:, :3]), "b of shape"),
        ("shortcut_forward/channels", lambda: cuda_ops.shortcut_forward(x, 3, 2),
         "3 output channels"),
        ("shortcut_forward/stride", lambda: cuda_ops.shortcut_forward(x, 4, 0), "stride 0"),
        ("shortcut_backward", lambda: cuda_ops.shortcut_backward(x, (2, 4, 3, 3), 2),
         "does not match"),
        ("avgpool_backward", lambda: cuda_ops.avgpool_backward(x, (3, 3)), r"\(n, c\)"),
        ("im2col/stride", lambda: cuda_ops.im2col(x, 3, 1, 0), "stride 0"),
        ("im2col/fit", lambda: cuda_ops.im2col(x, 5, 0, 2), "does not fit"),
        ("col2im/columns", lambda: cuda_ops.col2im(np.zeros((36, 18), f32), x.shape, 3, 1, 2),
         "do not match"),
        ("sgd_momentum_/decay", lambda: cuda_ops.sgd_momentum_(flat, flat, flat, 0.1, 0.9,
                                                               np.zeros(7, f32)),
         "weight_decay of shape"),
        ("adamw_/decay", lambda: cuda_ops.adamw_(flat, flat, flat, flat, np.zeros(7, f32), 0.1,
                                                 (0.1, 0.9, 0.1, 1.0, 1e-8, -0.1)),
         "decay of shape"),
        ("layernorm_forward/gamma", lambda: cuda_ops.layernorm_forward(x, v4, v4),
         "gamma of shape"),
        ("layernorm_backward/rstd",
         lambda: cuda_ops.layernorm_backward(x, x, np.zeros(5, f32), v3), "rstd of shape"),
        ("gelu_backward/t", lambda: cuda_ops.gelu_backward(flat, flat, flat[:7]), "t of shape"),
        ("causal_softmax/square", lambda: cuda_ops.causal_softmax(x[..., :2], 0.5),
         r"\(\.\.\., t, t\)"),
        ("causal_softmax_backward/probs",
         lambda: cuda_ops.causal_softmax_backward(x, x[:1], 0.5), "probs of shape"),
        ("embedding_backward/tokens",
         lambda: cuda_ops.embedding_backward(x[0], toks[:, :2], wte, wpe), "for tokens of shape"),
        ("embedding_backward/ctx",
         lambda: cuda_ops.embedding_backward(x[0], toks, wte, wpe[:2]), "gradients of shapes"),
        ("embedding_backward/token-range",
         lambda: cuda_ops.embedding_backward(x[0], toks + 5, wte, wpe), r"outside 0\.\.4"),
    ]


@pytest.mark.parametrize("call, message", [c[1:] for c in _bad_calls()],
                         ids=[c[0] for c in _bad_calls()])
def test_wrappers_reject_mismatched_shapes_before_launch(call, message):
    emulator = compile_check.HostEmulator()
    with cuda_launch.use_launcher(emulator), pytest.raises(ValueError, match=message):
        call()
    assert emulator.launches == []


def test_compiled_source_carries_the_header_digest(tmp_path):
    for name in ("common.cuh", "dense.cu"):
        (tmp_path / name).write_text((cuda_launch.KERNEL_DIR / name).read_text())
    before = cuda_launch.module_source("dense", tmp_path)
    assert before.endswith((cuda_launch.KERNEL_DIR / "dense.cu").read_text())
    assert cuda_launch.module_source("dense", tmp_path) == before  # stable
    header = tmp_path / "common.cuh"
    header.write_text(header.read_text().replace("SB_REAL float", "SB_REAL double"))
    assert cuda_launch.module_source("dense", tmp_path) != before  # a new cache key


# -- NaN and labels -------------------------------------------------------------------------
def test_softmax_xent_reference_rejects_out_of_range_labels():
    logits = np.zeros((3, 4))
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="outside 0..3"):
            ops.softmax_xent(logits, np.array([0, bad, 1]))


@needs_gxx
def test_softmax_xent_kernel_rejects_host_labels_before_launch():
    emulator = compile_check.HostEmulator()
    with cuda_launch.use_launcher(emulator), pytest.raises(ValueError, match="outside 0..3"):
        cuda_ops.softmax_xent(np.zeros((3, 4), np.float32), np.array([0, 4, 1]))
    assert emulator.launches == []
