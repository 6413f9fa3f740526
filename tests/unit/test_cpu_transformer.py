"""The compiled GELU, LayerNorm, causal softmax, embedding scatter and loss
(kernels/cpu/gelu.c, layernorm.c, softmax.c, embedding.c, xent.c) against their NumPy
references in float64 (the scatter against NumPy's float32 ``np.add.at``, to the bit).

Stated tolerances:
- GELU (the kernel's tanh is a rational approximation, a few float32 ulps off):
  |gelu - reference| <= 2e-6 and |gelu' dy - reference| <= 1e-5 max(1, |dy|), over
  inputs spread like activations (N(0, 3^2)) and at the edges (0, +-inf, NaN, beyond
  the tanh's clamp). The float32 NumPy reference itself is off by about half that.
- LayerNorm (float32 sums in eight lanes): y and dx within 1e-5 relative to the row's
  largest entry, dgamma and dbeta within 1e-5 relative to the largest.
- Causal softmax (Cephes' expf, about one ulp): probabilities within 1e-6 absolute,
  exactly 0 above the diagonal, rows summing to 1 within 1e-6; the backward within
  1e-6 of the largest gradient.
- The loss (the same expf, sums in eight lanes, the losses summed in double): within
  1e-6 relative, its gradient within 1e-6 / N.
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.kernels import cpu_native, cpu_transformer
from syncbench.kernels import transformer_ops as T
from syncbench.kernels.gpt import GPT, GPTSpec

pytestmark = pytest.mark.skipif(cpu_native.library() is None,
                                reason=f"no compiled kernels: {cpu_native.status()}")


def reference(x, dy):
    x64 = x.astype(np.float64)
    t = T.gelu_tanh(x64)
    with np.errstate(invalid="ignore"):  # inf * 0 at x = +-inf: NaN, in both
        return T.gelu_forward(x64, t), T.gelu_backward(dy.astype(np.float64), x64, t)


def test_gelu_equals_the_reference_within_the_stated_tolerance():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_003) * 3).astype(np.float32)
    dy = rng.standard_normal(x.size).astype(np.float32)
    y, t = cpu_transformer.gelu_forward(x)
    dx = cpu_transformer.gelu_backward(dy, x, t)
    y64, dx64 = reference(x, dy)
    assert y.dtype == dx.dtype == np.float32
    assert np.max(np.abs(y - y64)) <= 2e-6
    assert np.max(np.abs(dx - dx64) / np.maximum(1.0, np.abs(dy))) <= 1e-5


def test_gelu_edges_match_the_reference():
    x = np.array([0.0, 1e-30, -1e-30, 4.4, 4.6, -4.6, 30.0, -30.0, np.inf, np.nan],
                 dtype=np.float32)
    dy = np.ones_like(x)
    y, t = cpu_transformer.gelu_forward(x)
    y64, dx64 = reference(x, dy)
    np.testing.assert_allclose(y, y64, rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(cpu_transformer.gelu_backward(dy, x, t), dx64, rtol=0,
                               atol=1e-5)
    assert t[6] == 1.0 and t[7] == -1.0  # beyond the clamp: exactly +-1, slopes 1 and 0


def test_float64_and_strided_arrays_take_the_reference():
    x = np.linspace(-3, 3, 12)
    y, t = cpu_transformer.gelu_forward(x)
    np.testing.assert_array_equal(y, T.gelu_forward(x))
    strided = np.linspace(-3, 3, 24, dtype=np.float32)[::2]
    np.testing.assert_array_equal(cpu_transformer.gelu_forward(strided)[0],
                                  T.gelu_forward(strided))


def test_a_float32_step_with_the_kernel_matches_the_numpy_step(monkeypatch):
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 256, (4, 16)), rng.integers(0, 256, (4, 16))
    losses, grads = [], []
    for numpy_only in (False, True):
        monkeypatch.setattr(cpu_native, "numpy_only", numpy_only)
        model = GPT(GPTSpec(d=32, layers=2, heads=4, ctx=16), 256, seed=3)
        losses.append(model.loss_and_grad(x, y))
        grads.append(model.grads.copy())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    np.testing.assert_allclose(grads[0], grads[1], rtol=0, atol=1e-5 * np.abs(grads[1]).max())


def test_layernorm_equals_the_reference_within_the_stated_tolerance():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 70, 96)) * 2 + 0.5).astype(np.float32)
    gamma = rng.standard_normal(96).astype(np.float32)
    beta = rng.standard_normal(96).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y, xhat, rstd = cpu_transformer.layernorm_forward(x, gamma, beta)
    dx, dgamma, dbeta = cpu_transformer.layernorm_backward(dy, xhat, rstd, gamma)
    y64, saved = T.layernorm_forward(*(a.astype(np.float64) for a in (x, gamma, beta)))
    dx64, dg64, db64 = T.layernorm_backward(dy.astype(np.float64), saved,
                                            gamma.astype(np.float64))
    assert y.dtype == dx.dtype == dgamma.dtype == np.float32 and rstd.shape == (3, 70, 1)
    scale = np.abs(y64).max(axis=-1, keepdims=True)
    assert np.max(np.abs(y - y64) / scale) <= 1e-5
    assert np.max(np.abs(dx - dx64) / np.abs(dx64).max(axis=-1, keepdims=True)) <= 1e-5
    assert np.max(np.abs(dgamma - dg64)) <= 1e-5 * np.abs(dg64).max()
    assert np.max(np.abs(dbeta - db64)) <= 1e-5 * np.abs(db64).max()


@pytest.mark.parametrize("t", [1, 7, 8, 33, 128])
def test_causal_softmax_equals_the_reference_within_the_stated_tolerance(t):
    rng = np.random.default_rng(t)
    scores = (rng.standard_normal((2, 3, t, t)) * 8).astype(np.float32)
    scores[0, 0, -1, 0] = 200.0  # a row whose other entries underflow exp
    dp = rng.standard_normal(scores.shape).astype(np.float32)
    scale = 0.25
    probs = cpu_transformer.causal_softmax(scores, scale)
    ds = cpu_transformer.causal_softmax_backward(dp, probs, scale)
    p64 = T.causal_softmax(scores.astype(np.float64), scale)
    ds64 = T.causal_softmax_backward(dp.astype(np.float64), p64, scale)
    assert np.max(np.abs(probs - p64)) <= 1e-6
    above = T.causal_mask(t)
    assert np.all(probs[..., above] == 0) and np.all(ds[..., above] == 0)
    assert np.max(np.abs(probs.sum(axis=-1) - 1)) <= 1e-6
    assert np.max(np.abs(ds - ds64)) <= 1e-6 * max(1.0, np.abs(ds64).max())


def test_the_softmax_works_in_place_as_attention_calls_it():
    rng = np.random.default_rng(9)
    scores = rng.standard_normal((4, 16, 16)).astype(np.float32)
    expected = cpu_transformer.causal_softmax(scores, 0.5)
    inplace = scores.copy()
    assert cpu_transformer.causal_softmax(inplace, 0.5, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, expected)
    dp = rng.standard_normal(scores.shape).astype(np.float32)
    ds = cpu_transformer.causal_softmax_backward(dp, expected, 0.5)
    assert cpu_transformer.causal_softmax_backward(dp, expected, 0.5, out=dp) is dp
    np.testing.assert_array_equal(dp, ds)


def test_the_embedding_scatter_equals_numpys_add_at_to_the_bit():
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 20, (6, 33))  # repeated tokens: the adds' order matters
    dh = rng.standard_normal((6, 33, 24)).astype(np.float32)
    start = rng.standard_normal((20, 24)).astype(np.float32)  # the output layer's part
    ours, theirs = start.copy(), start.copy()
    wpe_ours, wpe_theirs = np.ones((40, 24), np.float32), np.ones((40, 24), np.float32)
    cpu_transformer.embedding_backward(dh, tokens, ours, wpe_ours)
    T.embedding_backward(dh, tokens, theirs, wpe_theirs)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(wpe_ours, wpe_theirs)


def test_a_token_out_of_range_takes_the_reference_and_raises():
    dh = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(IndexError):
        cpu_transformer.embedding_backward(dh, np.array([[0, 9]]), np.zeros((5, 4), np.float32),
                                           np.zeros((2, 4), np.float32))
    with pytest.raises(IndexError):
        cpu_transformer.sequence_xent(np.zeros((2, 5), np.float32), np.array([1, 7]))


def test_the_loss_equals_the_reference_within_the_stated_tolerance():
    rng = np.random.default_rng(6)
    logits = (rng.standard_normal((300, 256)) * 4).astype(np.float32)
    logits[0, 3] = 120.0  # a row where every other exp underflows
    targets = rng.integers(0, 256, 300)
    loss, grad = cpu_transformer.sequence_xent(logits, targets)
    loss64, grad64 = T.sequence_xent(logits.astype(np.float64), targets)
    assert grad.dtype == np.float32
    assert loss == pytest.approx(loss64, rel=1e-6)
    assert np.max(np.abs(grad - grad64)) <= 1e-6 / 300
