"""The compiled direct convolution (kernels/cpu/conv.c) against float64 references and the
NumPy path: kernels alone, the Conv2d layer, whole models' gradients, the fall-back and
the build cache, which loads no library it cannot trust (one planted by another user).

Split off this module: ``tests/e2e/test_cpu_native_e2e.py`` (its tests that launch a process
or start MPI).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from syncbench.kernels import cpu_native, ops
from syncbench.kernels.layers import Conv2d
from syncbench.kernels.zoo import build_model

#: The tests of the kernels themselves: only where the library builds on this core. The
#: cache's checks are tested with a stand-in library wherever a C compiler works.
native = pytest.mark.skipif(cpu_native.library() is None,
                            reason=f"no compiled kernels: {cpu_native.status()}")

#: (n, c, h, K, k, pad, stride): every remainder of the register blocks (K mod 4, n / 16
#: mod 4, C*k*k mod 6), a ResNet's shapes, LeNet's, a 1 x 1 and a stride-2 convolution.
GEOMETRIES = [
    (64, 16, 12, 16, 3, 1, 1),
    (16, 3, 9, 5, 3, 1, 1),
    (32, 6, 10, 6, 5, 0, 1),
    (48, 1, 11, 7, 5, 2, 1),
    (80, 4, 7, 3, 1, 0, 1),
    (64, 16, 10, 32, 3, 1, 2),
    (16, 2, 9, 9, 3, 0, 2),
]


def float64_reference(x, w, pad, stride):
    """The convolution and its column matrix, by ops' im2col in float64."""
    n, _, h, width = x.shape
    cols = ops.im2col(x.astype(np.float64), w.shape[2], pad, stride)
    oh, ow = ops.conv_output_hw(h, width, w.shape[2], pad, stride)
    y = (w.reshape(w.shape[0], -1).astype(np.float64) @ cols).reshape(w.shape[0], n, oh, ow)
    return y, cols


@native
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_kernels_equal_the_float64_im2col_convolution(geometry):
    n, c, h, k_out, k, pad, stride = geometry
    rng = np.random.default_rng(sum(geometry))
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    w = rng.standard_normal((k_out, c, k, k)).astype(np.float32)
    bias = rng.standard_normal(k_out).astype(np.float32)
    planes = np.zeros((c, h + 2 * pad, h + 2 * pad, n), np.float32)
    planes[:, pad : pad + h, pad : pad + h] = x.transpose(1, 2, 3, 0)
    y, cols = float64_reference(x, w, pad, stride)
    oh = y.shape[2]
    out = np.full((k_out, oh, oh, n), np.nan, np.float32)
    packed = cpu_native.pack_weights(w, np.empty(cpu_native.packed_shape(w.shape), np.float32))
    taps = cpu_native.window_taps(c, *planes.shape[1:], k)
    cpu_native.conv_forward(planes, packed, bias, out, taps, stride)
    expect = y.transpose(0, 2, 3, 1) + bias[:, None, None, None]
    np.testing.assert_allclose(out, expect, rtol=0, atol=2e-6 * np.abs(expect).max())

    dy = rng.standard_normal(out.shape).astype(np.float32)
    dweight = np.full(w.shape, np.nan, np.float32)
    work = np.empty(cpu_native.weight_grad_work(c, k), np.float32)
    cpu_native.conv_weight_grad(planes, dy, dweight, work, taps, stride)
    expect_dw = (dy.transpose(0, 3, 1, 2).reshape(k_out, -1).astype(np.float64)
                 @ cols.T).reshape(w.shape)
    np.testing.assert_allclose(dweight, expect_dw, rtol=0,
                               atol=2e-6 * np.abs(expect_dw).max())


@native
def test_packed_weights_put_four_output_channels_of_one_tap_together():
    w = np.arange(6 * 2 * 3 * 3, dtype=np.float32).reshape(6, 2, 3, 3)
    packed = cpu_native.pack_weights(w, np.full(cpu_native.packed_shape(w.shape), -1.0,
                                                np.float32))
    assert packed.shape == (2, 18, 4)
    assert list(packed[0, 9 + 6]) == [w[a, 1, 2, 0] for a in range(4)]
    assert list(packed[1, 1]) == [w[4, 0, 0, 1], w[5, 0, 0, 1], 0.0, 0.0]


@native
def test_input_gradient_phases_of_a_stride_2_convolution():
    # 3 x 3, padding 1, stride 2, 14 -> 7: even input pixels take tap 1 of the same
    # output pixel, odd ones taps 0 and 2 of the next and the same (one zero row after).
    before, after, phases = cpu_native.input_grad_phases(14, 7, 3, 1, 2)
    assert (before, after) == (0, 1)
    assert phases == [(0, [1], [0]), (1, [0, 2], [1, 0])]
    # stride 1 is one phase: the flipped kernel over the gradient padded by k - 1 - pad
    assert cpu_native.input_grad_phases(10, 10, 3, 1, 1) == (1, 1, [(0, [0, 1, 2], [2, 1, 0])])


def layer_pass(make, x, dy, params, direct, monkeypatch):
    """Forward and backward of a fresh layer with ``params``, by the direct kernels or not."""
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(cpu_native, "numpy_only", True)
        else:  # on a core without AVX-512 auto leaves convolutions to BLAS
            patch.setattr(cpu_native, "direct_override", True)
        layer = make()
        grads = [np.zeros_like(p) for p in params]
        layer.bind([p.copy() for p in params], grads)
        y = np.array(layer.forward(x))
        assert layer._direct is direct
        dx = layer.backward(dy)
    return y, (None if dx is None else np.array(dx)), grads


@native
@pytest.mark.parametrize("make, in_shape", [
    (lambda: Conv2d(16, 16, 3, padding=1, bias=False), (64, 16, 8, 8)),
    (lambda: Conv2d(16, 32, 3, padding=1, stride=2, bias=False), (32, 16, 8, 8)),
    (lambda: Conv2d(6, 16, 5), (16, 6, 12, 12)),
    (lambda: Conv2d(1, 6, 5, padding=2), (48, 1, 10, 10)),
    (lambda: Conv2d(8, 4, 3, padding=1, stride=2, bias=False), (16, 8, 7, 9)),
    (lambda: Conv2d(5, 6, 1, stride=2), (16, 5, 6, 6)),
    (lambda: Conv2d(3, 5, 4, padding=2, stride=3), (32, 3, 11, 10)),
])
@native
def test_conv2d_layer_equals_its_numpy_path(make, in_shape, monkeypatch):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(in_shape).astype(np.float32)
    params = [rng.standard_normal(s).astype(np.float32) for s in make().param_shapes()]
    out_shape = (in_shape[0], *make().output_shape(in_shape[1:]))
    dy = rng.standard_normal(out_shape).astype(np.float32)
    fast = layer_pass(make, x, dy, params, True, monkeypatch)
    slow = layer_pass(make, x, dy, params, False, monkeypatch)
    for a, b in zip([fast[0], fast[1], *fast[2]], [slow[0], slow[1], *slow[2]], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


@native
@pytest.mark.parametrize("name, shape", [("resnet8", (3, 32, 32)), ("lenet", (1, 28, 28))])
def test_a_models_float32_gradient_is_near_the_float64_one(name, shape, monkeypatch):
    """The compiled float32 step against the float64 gradient (the NumPy path; the compiled
    kernels take only float32), beside the NumPy float32 step: both within 1e-5 of it in
    norm (they are near 5e-7; a 1 % error in one BatchNorm constant gives 7e-3). The data
    seed matters: at seeds 0 and 3 one pre-activation of resnet8 lies within float32
    rounding of 0 (3e-7 about a scale of 5), one path takes the ReLU's other side, and the
    gradient below it moves by 5e-4 (seed 3, compiled) or 1.4e-3 (seed 0, NumPy)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, *shape))
    labels = rng.integers(0, 10, size=32)

    def gradient(dtype, direct):
        with monkeypatch.context() as patch:
            if not direct:
                patch.setattr(cpu_native, "numpy_only", True)
            model = build_model(name, shape, 10, dtype=dtype, seed=1)
            loss = model.loss_and_grad(x.astype(dtype), labels)
            return loss, model.grads.astype(np.float64)

    loss64, exact = gradient(np.float64, False)
    for direct in (True, False):
        loss, grad = gradient(np.float32, direct)
        assert np.linalg.norm(grad - exact) <= 1e-5 * np.linalg.norm(exact), direct
        assert abs(loss - loss64) <= 1e-5 * abs(loss64)


@native
def test_a_batch_the_kernels_do_not_take_runs_the_numpy_path():
    assert not cpu_native.usable(10, np.dtype(np.float32))
    assert not cpu_native.usable(64, np.dtype(np.float64))
    layer = Conv2d(2, 3, 3, padding=1)
    layer.bind([np.ones((3, 2, 3, 3), np.float32), np.zeros(3, np.float32)],
               [np.zeros((3, 2, 3, 3), np.float32), np.zeros(3, np.float32)])
    y = layer.forward(np.ones((10, 2, 4, 4), np.float32))
    assert not layer._direct and float(y[0, 0, 1, 1]) == 18.0


@native
def test_batchnorm_element_wise_passes_equal_the_numpy_paths_bit_for_bit(monkeypatch):
    """The affine with its ReLU mask and the input gradient round as the NumPy path (no
    fused multiply-add), so they are equal to the bit; the sums, in double, are closer to
    the float64 sums than the NumPy path's float32 ones."""
    from syncbench.kernels import cpu_norm

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 3000)) * 0.5 + 2.0).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    scale, offset, shift = (rng.standard_normal(8).astype(np.float32) for _ in range(3))

    def passes(numpy_only):
        with monkeypatch.context() as patch:
            patch.setattr(cpu_native, "numpy_only", numpy_only)
            work, y, dx = (np.full_like(x, np.nan) for _ in range(3))
            mask, tmp = np.zeros(x.shape, bool), np.empty_like(x)
            sums = cpu_norm.sums_about(x, shift, work)
            cpu_norm.affine(x, scale, offset, y, mask)
            grads = cpu_norm.grad_sums(dy, work, centred, invstd, mask, tmp)
            cpu_norm.input_grad(dy, work, centred, invstd, scale, mean_dy, mean_dy_xhat, dx,
                                tmp, mask)
            return work, y, mask, dx, sums, grads

    centred, invstd, mean_dy, mean_dy_xhat = (
        rng.standard_normal(8).astype(np.float32) for _ in range(4))

    fast, slow = passes(False), passes(True)
    for a, b in zip(fast[:4], slow[:4], strict=True):
        assert np.array_equal(a, b)
    assert mask_has_both(fast[2])
    work, g = fast[0].astype(np.float64), dy.astype(np.float64) * fast[2]
    exact = [work.sum(axis=1), (work * work).sum(axis=1), g.sum(axis=1),
             invstd * ((g * work).sum(axis=1) - centred * g.sum(axis=1))]
    for got, slow_sum, want in zip([*fast[4], *fast[5]], [*slow[4], *slow[5]], exact,
                                   strict=True):
        assert np.abs(got - want).max() <= np.abs(slow_sum - want).max() + 1e-6 * np.abs(
            want).max()


def mask_has_both(mask):
    return bool(mask.any()) and not bool(mask.all())


@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decay", ["none", "scalar", "array"])
def test_momentum_update_equals_the_reference_to_the_bit(dtype, decay):
    rng = np.random.default_rng(11)
    w, g, v = (rng.standard_normal(10_001).astype(dtype) for _ in range(3))
    wd = {"none": 0.0, "scalar": 5e-4, "array": (rng.random(w.size) < 0.5).astype(dtype) * 5e-4}
    wd = wd[decay]
    expect_w, expect_v = w.copy(), v.copy()
    ops.REFERENCES["sgd_momentum_"](expect_w, g, expect_v, 0.1, 0.9, wd, np.empty_like(w))
    assert cpu_native.sgd_momentum_(w, g, v, 0.1, 0.9, wd)
    assert np.array_equal(w, expect_w) and np.array_equal(v, expect_v)
    # a float64 scalar with float32 buffers computes in float64 in NumPy: the reference's
    assert cpu_native.sgd_momentum_(w, g, v, np.float64(0.1), 0.9, wd) == (dtype == np.float64)


def test_cupys_kernel_cache_is_used_only_where_nobody_else_can_write(tmp_path, monkeypatch):
    """CuPy loads cached GPU kernels by a hash of public inputs: a folder another user
    owns or may write to is named (CuPy then keeps kernels in memory, backend)."""
    from syncbench.kernels import backend

    folder = tmp_path / "kernel_cache"
    monkeypatch.setenv("CUPY_CACHE_DIR", str(folder))
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    os.chmod(tmp_path, 0o700)
    assert backend.cupy_cache_untrusted() == ""  # not made yet, in a private folder
    folder.mkdir(mode=0o700)
    assert backend.cupy_cache_untrusted() == ""
    os.chmod(folder, 0o777)
    assert "is writable by its group or others (mode 0777)" in backend.cupy_cache_untrusted()
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    assert backend.cupy_cache_untrusted() == ""
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY")
    if os.geteuid() == 0:
        os.chmod(folder, 0o700)
        os.chown(folder, 65534, 65534)
        assert "belongs to uid 65534" in backend.cupy_cache_untrusted()



def test_an_arrays_address_is_its_first_elements_whether_writable_or_not():
    base = np.arange(100, dtype=np.float32)
    view = base[10:]
    frozen = base[20:].copy()
    frozen.flags.writeable = False
    for array in (base, view, frozen, base[:0], base[::2]):
        assert cpu_native._ptr(array) == array.ctypes.data
    assert cpu_native._ptr(None) is None
    # the writable contiguous ones take the buffer protocol's path
    import ctypes
    for array in (base, view):
        assert ctypes.addressof(ctypes.c_char.from_buffer(array)) == array.ctypes.data
