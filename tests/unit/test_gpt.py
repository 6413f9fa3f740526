"""The transformer's operations and the ``gpt`` model's hand-written backward against central
finite differences in float64, and its flat layout."""

from __future__ import annotations

import math

import numpy as np
import pytest

from syncbench.kernels import transformer_ops as T
from syncbench.kernels.gpt import GPT, GPTSpec, flops_per_token, lm_metrics, parse_gpt_spec
from syncbench.kernels.zoo import build_model, has_batchnorm, model_context, model_name

EPS = 1e-6
#: Relative error allowed between an analytic and a central-difference gradient.
TOL = 1e-6


def numeric(f, array, count=20, seed=0):
    """(indices, central differences of scalar ``f()``) at ``count`` entries of ``array``."""
    rng = np.random.default_rng(seed)
    flat = array.reshape(-1)
    picks = rng.choice(flat.size, size=min(count, flat.size), replace=False)
    out = []
    for i in picks:
        old = flat[i]
        flat[i] = old + EPS
        up = f()
        flat[i] = old - EPS
        down = f()
        flat[i] = old
        out.append((up - down) / (2 * EPS))
    return picks, np.array(out)


def assert_close(analytic, array, f, count=20):
    picks, expected = numeric(f, array, count)
    got = np.asarray(analytic).reshape(-1)[picks]
    scale = max(1.0, float(np.max(np.abs(expected))))
    assert np.max(np.abs(got - expected)) <= TOL * scale, (got, expected)


def test_layernorm_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 8))
    gamma, beta = rng.standard_normal(8), rng.standard_normal(8)
    w = rng.standard_normal((3, 5, 8))  # a random linear function of the output

    def loss():
        return float(np.sum(T.layernorm_forward(x, gamma, beta)[0] * w))

    _, saved = T.layernorm_forward(x, gamma, beta)
    dx, dgamma, dbeta = T.layernorm_backward(w, saved, gamma)
    for analytic, array in ((dx, x), (dgamma, gamma), (dbeta, beta)):
        assert_close(analytic, array, loss)


def test_layernorm_normalizes_rows():
    x = np.random.default_rng(2).standard_normal((4, 16)) * 3 + 5
    y, _ = T.layernorm_forward(x, np.ones(16), np.zeros(16), eps=0.0)
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=-1), 1, atol=1e-12)


def test_gelu_is_the_tanh_approximation_and_its_backward_matches():
    x = np.linspace(-4, 4, 41)
    exact_tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(T.gelu_forward(x), exact_tanh_form, rtol=1e-15, atol=1e-15)
    w = np.random.default_rng(3).standard_normal(x.shape)
    assert_close(T.gelu_backward(w, x), x, lambda: float(np.sum(T.gelu_forward(x) * w)), 41)


def test_attention_is_causal_and_its_backward_matches():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 6, 4)) for _ in range(3))
    y, probs = T.attention_forward(q, k, v)
    assert np.all(probs[..., np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, atol=1e-12)
    # position i's output depends on positions <= i only
    k2, v2 = k.copy(), v.copy()
    k2[..., 4:, :] += 1.0
    v2[..., 4:, :] -= 2.0
    np.testing.assert_array_equal(T.attention_forward(q, k2, v2)[0][..., :4, :], y[..., :4, :])
    w = rng.standard_normal(y.shape)
    dq, dk, dv = T.attention_backward(w, q, k, v, probs)
    for analytic, array in ((dq, q), (dk, k), (dv, v)):
        assert_close(analytic, array, lambda: float(np.sum(T.attention_forward(q, k, v)[0] * w)))


def test_embedding_scatter_adds_repeated_tokens():
    rng = np.random.default_rng(5)
    wte, wpe = rng.standard_normal((7, 3)), rng.standard_normal((5, 3))
    tokens = np.array([[1, 1, 4], [6, 1, 0]])
    w = rng.standard_normal((2, 3, 3))
    dwte, dwpe = np.full((7, 3), 0.5), np.full((5, 3), 9.0)  # wte's is added to, wpe's not
    T.embedding_backward(w, tokens, dwte, dwpe)

    def loss():
        return float(np.sum(T.embedding_forward(tokens, wte, wpe) * w))

    assert_close(dwte - 0.5, wte, loss, 21)
    assert_close(dwpe, wpe, loss, 15)
    np.testing.assert_array_equal(dwpe[3:], 0)


def test_sequence_cross_entropy_is_nats_per_token_and_its_gradient_matches():
    rng = np.random.default_rng(6)
    logits, targets = rng.standard_normal((10, 7)), rng.integers(0, 7, 10)
    loss, grad = T.sequence_xent(logits, targets)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    assert loss == pytest.approx(-log_probs[np.arange(10), targets].mean(), rel=1e-14)
    assert T.sequence_xent(np.zeros((4, 256)), np.arange(4))[0] == pytest.approx(math.log(256))
    assert_close(grad, logits, lambda: T.sequence_xent(logits, targets)[0], 30)


def small_gpt(seed=0, dtype=np.float64):
    return GPT(GPTSpec(d=8, layers=2, heads=2, ctx=6), 11, dtype=dtype, seed=seed)


def test_model_gradient_matches_finite_differences_in_every_layer():
    model = small_gpt()
    model.params += np.random.default_rng(7).normal(0, 0.3, model.size)  # away from init
    rng = np.random.default_rng(8)
    x, y = rng.integers(0, 11, (3, 6)), rng.integers(0, 11, (3, 6))
    model.loss_and_grad(x, y)
    analytic = model.grads.copy()
    for lo, hi in zip(model.layer_offsets, [*model.layer_offsets[1:], model.size]):
        section = model.params[lo:hi]
        picks, expected = numeric(lambda: model.loss_and_grad(x, y), section, 25)
        np.testing.assert_allclose(analytic[lo:hi][picks], expected, rtol=1e-5, atol=1e-8)


def test_grads_ready_offsets_descend_to_zero_and_grads_are_overwritten():
    model = small_gpt()
    x = np.arange(12).reshape(2, 6) % 11
    seen = []
    model.loss_and_grad(x, x, on_grads_ready=seen.append)
    assert seen == sorted(model.layer_offsets, reverse=True) and seen[-1] == 0
    first = model.grads.copy()
    model.loss_and_grad(x, x)  # a second step overwrites, the tied wte gradient included
    np.testing.assert_array_equal(model.grads, first)


def test_layers_are_views_of_the_flat_buffers_and_init_is_seeded():
    model = small_gpt(seed=3)
    model.embedding.params[0][0, 0] = 42.0
    assert model.params[0] == 42.0
    assert np.shares_memory(model.blocks[1].grads[4], model.grads)
    np.testing.assert_array_equal(small_gpt(seed=3).params[1:], model.params[1:])
    assert not np.array_equal(small_gpt(seed=4).params, small_gpt(seed=3).params)


def test_shorter_windows_use_the_first_positions():
    model = small_gpt()
    x = np.array([[1, 2, 3, 4, 5, 6]])
    np.testing.assert_allclose(model.forward(x[:, :4]), model.forward(x)[:, :4], rtol=1e-12)


def test_default_size_parameters_and_flops():
    spec = GPTSpec()
    model = build_model("gpt", (spec.ctx,), 256, seed=0)
    d, n = 128, 64
    per_block = 2 * 2 * d + d * 3 * d + 3 * d + d * d + d + d * 4 * d + 4 * d + 4 * d * d + d
    assert model.size == 256 * d + n * d + 4 * per_block + 2 * d == 834_304
    assert flops_per_token(spec, 256)["forward"] == 1_769_472


def test_model_spec_parsing_and_one_line_errors():
    assert parse_gpt_spec("gpt") == GPTSpec()
    assert parse_gpt_spec("gpt:d=64,heads=2") == GPTSpec(d=64, heads=2)
    assert parse_gpt_spec("mlp:3") is None
    assert parse_gpt_spec("gpt-gpu") == GPTSpec(d=384, layers=6, heads=6, ctx=256)
    assert parse_gpt_spec("gpt-gpu:ctx=128") == GPTSpec(d=384, layers=6, heads=6, ctx=128)
    assert model_context("gpt-gpu") == 256 and parse_gpt_spec("gpt-large") is None
    assert model_name("gpt:layers=2") == "gpt:layers=2" and model_context("gpt:ctx=32") == 32
    assert model_context("mlp") is None and not has_batchnorm("gpt")
    for bad, words in (("gpt:d=130", "do not divide"), ("gpt:depth=3", "expected gpt:"),
                       ("gpt:d=x", "positive integer"), ("gpt:ctx=0", "positive integer")):
        with pytest.raises(ValueError, match=words) as info:
            parse_gpt_spec(bad)
        assert "\n" not in str(info.value)


def test_evaluate_reports_nats_per_token_and_no_accuracy():
    model = small_gpt()
    rng = np.random.default_rng(9)
    x, y = rng.integers(0, 11, (5, 6)), rng.integers(0, 11, (5, 6))
    loss, accuracy = model.evaluate(x, y, batch_size=2)
    assert loss == pytest.approx(model.loss_and_grad(x, y), rel=1e-12) and math.isnan(accuracy)
    metrics = lm_metrics(math.log(4.0))
    assert metrics["bits_per_char"] == pytest.approx(2.0) and metrics["perplexity"] == 4.0


def test_generation_follows_the_logits_and_sees_the_last_ctx_bytes():
    model = GPT(GPTSpec(d=8, layers=1, heads=2, ctx=4), 256, dtype=np.float64, seed=1)
    greedy = model.generate(b"to be", 6)
    assert len(greedy) == 6 and model.generate(b"to be", 6) == greedy
    first = int(np.argmax(model.forward(np.array([list(b"o be")]))[0, -1]))
    assert model.generate(b"o be", 1)[0] == first == model.generate(b"to be", 1)[0]
    sampled = model.generate(b"to", 20, temperature=1.0, rng=np.random.default_rng(2))
    assert len(sampled) == 20 and sampled != greedy
