"""The BatchNorm networks: resnet8/resnet20 layers against finite differences and direct
formulas, their running statistics, weight-decay exemptions, and train's flags for them.

Split off this module: ``tests/e2e/test_resnet_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles import assert_layer_gradients, bind_fresh, numeric_grad

from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.kernels.layers import BasicBlock, BatchNorm2d, Conv2d, GlobalAvgPool
from syncbench.kernels.zoo import build_model

TOL = 1e-6


def bind_buffers(layer):
    """Fresh running statistics for a layer that has some (zeros and ones, as built)."""
    values = [v.copy() for v in layer.init_buffers()]
    layer.bind_buffers(values)
    return values


LAYERS = [
    ("conv_stride2_pad1", lambda: Conv2d(2, 3, 3, padding=1, stride=2), (2, 2, 7, 6)),
    ("conv_no_bias", lambda: Conv2d(2, 3, 3, padding=1, bias=False), (2, 2, 5, 5)),
    ("batchnorm", lambda: BatchNorm2d(3), (4, 3, 5, 4)),
    ("block", lambda: BasicBlock(3, 3), (2, 3, 6, 6)),
    ("block_stride2_widen", lambda: BasicBlock(2, 4, stride=2), (2, 2, 7, 7)),
    ("global_avgpool", GlobalAvgPool, (3, 4, 5, 2)),
]


@pytest.mark.parametrize("name,make,in_shape", LAYERS, ids=[x[0] for x in LAYERS])
def test_layer_gradients_match_finite_differences(name, make, in_shape):
    """Training-mode backward (batch statistics) of every new layer, input and parameters."""
    rng = np.random.default_rng(1)
    layer = make()
    params, grads = bind_fresh(layer, rng)
    saved = bind_buffers(layer)
    start = [b.copy() for b in saved]

    def reset() -> None:  # running statistics move at each forward
        for b, s in zip(saved, start):
            b[...] = s

    assert_layer_gradients(layer, params, grads, rng.standard_normal(in_shape), rng, reset)


def test_batchnorm_statistics_are_pytorchs():
    """Batch mean and biased variance normalise; the running statistics move by momentum
    0.1 towards the mean and the UNBIASED variance; evaluation uses them."""
    rng = np.random.default_rng(2)
    bn = BatchNorm2d(3)
    (gamma, beta), _ = bind_fresh(bn, rng)
    mean0, var0 = bind_buffers(bn)
    x = 3.0 + 2.0 * rng.standard_normal((5, 3, 4, 4))
    y = bn.forward(x)
    mu = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    expected = (x - mu[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5)
    expected = expected * gamma[:, None, None] + beta[:, None, None]
    np.testing.assert_allclose(y, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(mean0, 0.1 * mu, rtol=1e-12)
    np.testing.assert_allclose(var0, 0.9 + 0.1 * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-12)
    evaluated = bn.forward(x, train=False)
    manual = (x - mean0[:, None, None]) / np.sqrt(var0[:, None, None] + 1e-5)
    np.testing.assert_allclose(evaluated, manual * gamma[:, None, None] + beta[:, None, None],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-11), (np.float32, 2e-5)])
def test_cpu_batchnorm_equals_the_numpy_references_about_a_far_running_mean(dtype, tol):
    """The CPU layer's folded passes (cpu_norm: rows about the running mean kept instead of
    xhat, y as one affine, dx as a * dy + k1 * work + k0) against ops' references, in a
    step whose running mean (the shift) is far from the batch's, so every term matters."""
    from syncbench.kernels import ops

    rng = np.random.default_rng(7)
    bn = BatchNorm2d(3)
    params = [rng.uniform(0.5, 1.5, 3).astype(dtype), rng.standard_normal(3).astype(dtype)]
    grads = [np.zeros(3, dtype), np.zeros(3, dtype)]
    bn.bind(params, grads)
    running = [np.array([40.0, -7.0, 0.5], dtype), np.array([4.0, 1.0, 9.0], dtype)]
    bn.bind_buffers(running)
    x = (5.0 + 3.0 * rng.standard_normal((6, 3, 5, 4))).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    y = bn.forward(x)
    dx = bn.backward(dy)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    invstd = 1.0 / np.sqrt(var + 1e-5)
    y_ref, xhat = ops.bn_normalize(x, mean, invstd, params[0], params[1])
    sums = ops.bn_grad_sums(dy, xhat)
    count = x.size // 3
    dx_ref = ops.bn_backward(dy, xhat, params[0] * invstd, sums[0] / count, sums[1] / count)
    for got, want in [(y, y_ref), (dx, dx_ref), (grads[1], sums[0]), (grads[0], sums[1])]:
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    evaluated = bn.forward(x, train=False)
    scale = params[0] / np.sqrt(running[1] + 1e-5)
    manual = (x - running[0][:, None, None]) * scale[:, None, None] + params[1][:, None, None]
    np.testing.assert_allclose(evaluated, manual, rtol=tol, atol=tol * np.abs(manual).max())


def test_option_a_shortcut_subsamples_and_appends_zero_channels():
    """A widening block's shortcut: x[:, :, ::2, ::2] in its first channels, zeros after."""
    rng = np.random.default_rng(3)
    block = BasicBlock(2, 4, stride=2)
    bind_fresh(block, rng)
    bind_buffers(block)
    x = rng.standard_normal((2, 2, 7, 7))
    for param in block.params:
        param[...] = 0.0  # conv weights, gammas and betas 0: the main path adds nothing
    y = block.forward(x)
    assert y.shape == (2, 4, 4, 4)
    np.testing.assert_array_equal(y[:, :2], np.maximum(x[:, :, ::2, ::2], 0))
    np.testing.assert_array_equal(y[:, 2:], 0)


@pytest.mark.parametrize("name,blocks", [("resnet8", 1), ("resnet20", 3)])
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_resnets_shapes_and_parameter_counts(name, blocks, shape):
    """He et al.'s CIFAR ResNets: 6n+2 layers with weights, 16/32/64 channels."""
    m = build_model(name, shape, 10, dtype=np.float64)
    convs = [layer for layer in m.all_layers() if isinstance(layer, Conv2d)]
    assert len(convs) + 1 == 6 * blocks + 2  # + the linear layer
    stage = [16 * 9 * 16 * 2 + 4 * 16, 16 * 9 * 32 + 32 * 9 * 32 + 4 * 32,
             32 * 9 * 64 + 64 * 9 * 64 + 4 * 64]
    repeat = [32 * 9 * 32 * 2 + 4 * 32, 64 * 9 * 64 * 2 + 4 * 64]
    expected = shape[0] * 9 * 16 + 32 + sum(stage) + (blocks - 1) * (stage[0] + sum(repeat))
    assert m.size == expected + 64 * 10 + 10
    assert m.buffers.size == 2 * sum(layer.channels for layer in m.batchnorm_layers())
    logits = m.forward(np.zeros((2, *shape)), train=False)
    assert logits.shape == (2, 10)


def test_resnet8_flat_gradient_matches_finite_differences():
    rng = np.random.default_rng(4)
    m = build_model("resnet8", (1, 28, 28), 10, dtype=np.float64, seed=1)
    x = rng.standard_normal((3, 1, 28, 28))
    y = rng.integers(0, 10, 3)
    start = m.buffers.copy()
    m.loss_and_grad(x, y)
    analytic = m.grads.copy()
    idx = [(int(i),) for i in rng.choice(m.size, 30, replace=False)]

    def loss():
        m.buffers[...] = start
        return m.loss_and_grad(x, y)

    np.testing.assert_allclose([analytic[i] for i in idx], numeric_grad(loss, m.params, idx),
                               atol=TOL)


def test_warm_up_leaves_the_running_statistics_alone():
    m = build_model("resnet8", (1, 28, 28), 10, dtype=np.float64)
    m.buffers[...] = np.random.default_rng(5).random(m.buffers.size)
    before = m.buffers.copy()
    m.warm_up(8)
    np.testing.assert_array_equal(m.buffers, before)


def test_decay_mask_exempts_biases_and_betas_as_mxnet():
    """Only conv/linear weights and BatchNorm gammas decay (MXNet's set_wd_mult), and the
    optimizer applies exactly that: an exempt element moves by its gradient alone."""
    m = build_model("resnet8", (1, 28, 28), 10, dtype=np.float64)
    mask = m.decay_mask()
    gammas = sum(layer.channels for layer in m.batchnorm_layers())
    assert mask.sum() == m.size - gammas - 10  # every beta and the linear bias
    w = np.ones(m.size)
    opt = MomentumSGD(w, lr=0.1, momentum=0.0, weight_decay=0.5, decay_mask=mask)
    opt.step(w, np.zeros(m.size))
    np.testing.assert_allclose(w, np.where(mask == 1, 1 - 0.1 * 0.5, 1.0), rtol=1e-15)
