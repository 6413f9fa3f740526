"""Every layer's hand-written backward against central finite differences (float64)."""

from __future__ import annotations

import numpy as np
import pytest
from oracles import TOL, assert_layer_gradients, bind_fresh, numeric_grad, sample_indices

from syncbench.kernels.layers import (
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    SoftmaxCrossEntropy,
)
from syncbench.kernels.zoo import build_model

LAYERS = [
    ("linear", lambda: Linear(7, 5), (4, 7)),
    ("relu", ReLU, (3, 11)),
    ("flatten", Flatten, (2, 3, 4, 5)),
    ("conv_pad0", lambda: Conv2d(2, 3, 3), (2, 2, 6, 5)),
    ("conv_pad2", lambda: Conv2d(3, 2, 5, padding=2), (2, 3, 7, 7)),
    ("maxpool", lambda: MaxPool2d(2), (2, 3, 6, 4)),
]


@pytest.mark.parametrize("name,make,in_shape", LAYERS, ids=[x[0] for x in LAYERS])
def test_layer_gradients_match_finite_differences(name, make, in_shape):
    rng = np.random.default_rng(1)
    layer = make()
    params, grads = bind_fresh(layer, rng)
    x = rng.standard_normal(in_shape)
    if name == "relu":  # keep inputs away from the kink
        x += np.sign(x) * 0.1
    assert_layer_gradients(layer, params, grads, x, rng)


def test_softmax_cross_entropy_gradient():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((6, 10)) * 3
    labels = rng.integers(0, 10, 6)
    ce = SoftmaxCrossEntropy()
    ce.forward(logits, labels)
    analytic = ce.backward().copy()
    idx = sample_indices(logits.shape, rng, 60)
    numeric = numeric_grad(lambda: SoftmaxCrossEntropy().forward(logits, labels), logits, idx)
    np.testing.assert_allclose([analytic[i] for i in idx], numeric, atol=TOL)
    # the loss itself against a direct formula
    expected = np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(6), labels])
    assert ce.forward(logits, labels) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model,shape", [("mlp", (1, 28, 28)), ("lenet", (1, 28, 28)),
                                         ("lenet", (3, 32, 32))])
def test_model_flat_gradient_matches_finite_differences(model, shape):
    rng = np.random.default_rng(3)
    m = build_model(model, shape, 10, dtype=np.float64, seed=4)
    x = rng.random((3, *shape))
    y = rng.integers(0, 10, 3)
    m.loss_and_grad(x, y)
    analytic = m.grads.copy()
    idx = [(int(i),) for i in rng.choice(m.size, 40, replace=False)]

    def loss():
        return SoftmaxCrossEntropy().forward(m.forward(x), y)

    np.testing.assert_allclose([analytic[i] for i in idx], numeric_grad(loss, m.params, idx),
                               atol=TOL)


def test_layers_are_views_of_the_flat_buffers():
    m = build_model("mlp", (1, 28, 28), 10, dtype=np.float64)
    total = sum(p.size for layer in m.layers for p in layer.params)
    assert total == m.size
    for layer in m.layers:
        for p, g in zip(layer.params, layer.grads):
            assert np.shares_memory(p, m.params) and np.shares_memory(g, m.grads)


def test_grads_ready_offsets_are_monotone_and_cover_the_buffer():
    m = build_model("lenet", (1, 28, 28), 10, dtype=np.float64)
    seen = []
    m.loss_and_grad(np.zeros((2, 1, 28, 28)), np.array([1, 2]), on_grads_ready=seen.append)
    assert seen == sorted(seen, reverse=True) and seen[-1] == 0
    assert len(seen) == len(m.layers)


def test_init_is_deterministic_per_seed():
    a = build_model("lenet", (1, 28, 28), 10, seed=7).params
    b = build_model("lenet", (1, 28, 28), 10, seed=7).params
    c = build_model("lenet", (1, 28, 28), 10, seed=8).params
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_held_outputs_are_never_overwritten_by_later_steps():
    """Reused layer buffers must not change arrays a caller still holds."""
    rng = np.random.default_rng(5)
    m = build_model("lenet", (1, 28, 28), 10, dtype=np.float32, seed=1)
    x1 = rng.random((8, 1, 28, 28)).astype(np.float32)
    x2 = rng.random((8, 1, 28, 28)).astype(np.float32)
    held = m.forward(x1)
    kept = held.copy()
    for _ in range(3):
        m.loss_and_grad(x2, np.arange(8) % 10)
        m.forward(x2)
    np.testing.assert_array_equal(held, kept)


# -- the CPU convolution's chunks and layouts (kernels/cpu_conv.py) ----------------------
@pytest.mark.parametrize("n,c,h,w,cout,k,pad,stride", [
    (3, 2, 7, 6, 4, 3, 1, 1),
    (7, 6, 14, 14, 16, 5, 0, 1),  # LeNet's second convolution
    (4, 1, 28, 28, 6, 5, 2, 1),   # LeNet's first
    (5, 3, 8, 8, 4, 3, 1, 2),     # a stride-2 ResNet convolution
    (2, 3, 9, 7, 5, 3, 0, 2),
    (3, 4, 7, 6, 4, 3, 1, 1),     # the input gradient as a convolution (a ResNet's 3 x 3)
    (2, 5, 6, 6, 3, 3, 2, 1),     # the same with padding k - 1
])
@pytest.mark.parametrize("budget", ["default", "one output row per chunk",
                                    "small GEMMs of one output row"])
@pytest.mark.parametrize("kept", [True, False])
def test_cpu_convolution_equals_the_im2col_references(monkeypatch, n, c, h, w, cout, k, pad,
                                                      stride, budget, kept):
    """Forward, weight, bias and input gradients equal W @ im2col and col2im (float64, to
    rounding), whatever the chunks, the column layout and whether the columns are kept."""
    from syncbench.kernels import cpu_conv, ops

    if budget == "small GEMMs of one output row":  # kept columns multiplied by chunks too
        ow = ops.conv_output_hw(h, w, k, pad, stride)[1]
        monkeypatch.setattr(cpu_conv, "SMALL_GEMM_MNK", max(cout, c) * c * k * k * ow * n)
    elif budget != "default":
        monkeypatch.setattr(cpu_conv, "CHUNK_BYTES", 1)
        monkeypatch.setattr(cpu_conv, "BACKWARD_CHUNK_BYTES", 1)
        monkeypatch.setattr(cpu_conv, "STREAMED_CHUNK_BYTES", 1)
    if not kept:
        monkeypatch.setattr(cpu_conv, "KEEP_COLUMNS_BYTES", 0)
    rng = np.random.default_rng(n * 100 + k)
    conv = Conv2d(c, cout, k, padding=pad, stride=stride)
    (weight, bias), grads = bind_fresh(conv, rng)
    x = rng.standard_normal((n, c, h, w))
    y = conv.forward(x)
    cols = ops.im2col(x, k, pad, stride)
    oh, ow = ops.conv_output_hw(h, w, k, pad, stride)
    expected = (weight.reshape(cout, -1) @ cols + bias[:, None]).reshape(cout, n, oh, ow)
    np.testing.assert_allclose(y, expected.transpose(1, 0, 2, 3), rtol=1e-12, atol=1e-12)
    assert y.transpose(1, 2, 3, 0).flags.c_contiguous  # handed on as (C, H, W, N)
    dy = rng.standard_normal(y.shape)
    dx = conv.backward(dy)
    dy2 = np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(cout, -1)
    np.testing.assert_allclose(grads[0].reshape(cout, -1), dy2 @ cols.T, rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(grads[1], dy2.sum(axis=1), rtol=1e-12, atol=1e-11)
    dcols = weight.reshape(cout, -1).T @ dy2
    np.testing.assert_allclose(dx, ops.col2im(dcols, x.shape, k, pad, stride),
                               rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("model_name", ["mlp", "lenet", "resnet8"])
def test_fused_relus_give_the_unfused_models_bits(model_name):
    """A ReLU applied by the layer before it (fuse_relus) gives the same loss, gradient
    and running statistics as the ReLU layers on their own, bit for bit."""
    from syncbench.kernels.layers import all_layers

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 5)
    fused = build_model(model_name, (1, 28, 28), 10, seed=1)
    plain = build_model(model_name, (1, 28, 28), 10, seed=1)
    layers = all_layers(plain.layers)
    assert any(layer.fused_relu for layer in all_layers(fused.layers))
    for layer in layers:
        layer.fused_relu = False
        if isinstance(layer, ReLU):
            layer.absorbed = False
    assert fused.loss_and_grad(x, y) == plain.loss_and_grad(x, y)
    np.testing.assert_array_equal(fused.grads, plain.grads)
    np.testing.assert_array_equal(fused.buffers, plain.buffers)
    np.testing.assert_array_equal(fused.forward(x, train=False), plain.forward(x, train=False))


def test_two_by_two_pooling_routes_ties_and_nans_like_argmax():
    """The 2 x 2 fast path (maximum of four views) and the general path agree with
    ops.maxpool_*: ties go to the first maximum; a window with NaN takes the general
    path (its first NaN)."""
    from syncbench.kernels import ops

    rng = np.random.default_rng(4)
    for with_nan in (False, True):
        x = rng.integers(-2, 3, size=(3, 4, 6, 8)).astype(np.float64)  # many ties
        if with_nan:
            x[1, 2, 3, 5] = np.nan
        pool = MaxPool2d(2)
        y = pool.forward(x)
        ref_y, arg = ops.maxpool_forward.reference(x, 2)
        np.testing.assert_array_equal(y, ref_y)
        dy = rng.standard_normal(y.shape)
        np.testing.assert_array_equal(pool.backward(dy), ops.maxpool_backward.reference(dy, arg, 2))


@pytest.mark.parametrize("model_name,bound_kib", [
    ("lenet", 1024), pytest.param("resnet8", 1024, marks=pytest.mark.slow),
    ("mlp:1024,1024", 200)])
def test_a_steady_training_step_allocates_no_activation_sized_array(model_name, bound_kib):
    """After warm-up, a CPU training step reuses its work and output arrays (Layer.scratch,
    Layer.recycled): its peak of new memory stays under ``bound_kib``, less than one
    activation (lenet's first: 1.2 MB at batch 64; resnet8's: 3.2 MB; a 1024-wide dense
    layer's: 256 KiB, which a Linear holding its input across steps would allocate)."""
    import tracemalloc

    model = build_model(model_name, (1, 28, 28), 10, dtype=np.float32, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    for _ in range(3):
        model.loss_and_grad(x, y)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        model.loss_and_grad(x, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - base < bound_kib * 1024
