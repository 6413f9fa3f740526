"""The decoder-only transformer's operations, forward and backward, in NumPy.

These are the reference bodies of :mod:`syncbench.kernels.gpt` (and, like
:mod:`syncbench.kernels.ops`, the oracle any compiled kernel of them is held
to). Each backward returns the gradients of a scalar loss with respect to the
forward's inputs, given the gradient with respect to its output; the tests
check every one against central finite differences in float64.

* :func:`layernorm_forward` / :func:`layernorm_backward`: Ba et al. 2016
  (arXiv 1607.06450), over the last axis, biased variance, ``eps`` inside the
  square root (PyTorch's ``F.layer_norm``, GPT-2's ``eps=1e-5``).
* :func:`gelu_forward` / :func:`gelu_backward`: the tanh approximation of
  Hendrycks and Gimpel 2016 (arXiv 1606.08415, section 2),
  ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, the form GPT-2's code
  uses (PyTorch's ``F.gelu(x, approximate="tanh")``).
* :func:`attention_forward` / :func:`attention_backward`: causal scaled
  dot-product attention of Vaswani et al. 2017 (arXiv 1706.03762, eq. (1)),
  ``softmax(q k^T / sqrt(d_head) + mask) v`` with the mask ``-inf`` above the
  diagonal, batched over (batch, heads).
* :func:`embedding_forward` / :func:`embedding_backward`: token rows gathered
  from the embedding plus learned positions; the backward scatter-adds the
  rows back (a token seen twice gets both gradients).
* :func:`sequence_xent`: the mean cross-entropy over every position of every
  sequence, in nats per token, with its gradient with respect to the logits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

#: sqrt(2 / pi), GELU's tanh-approximation constant.
_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                      eps: float = 1e-5) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """``gamma * (x - mean) / sqrt(var + eps) + beta`` over the last axis; returns the
    output and what the backward needs (the normalized input and 1/std per row)."""
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = centred * rstd
    return xhat * gamma + beta, (xhat, rstd)


def layernorm_backward(dy: np.ndarray, saved: tuple[np.ndarray, np.ndarray],
                       gamma: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dgamma, dbeta) of :func:`layernorm_forward`; the parameter gradients are summed
    over every leading axis. ``dx = rstd (g - mean(g) - xhat mean(g xhat))`` with
    ``g = dy gamma``."""
    xhat, rstd = saved
    lead = tuple(range(dy.ndim - 1))
    dgamma = np.sum(dy * xhat, axis=lead)
    dbeta = np.sum(dy, axis=lead)
    g = dy * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """``tanh(sqrt(2/pi) (x + 0.044715 x^3))``, the part of GELU its backward reuses (a
    fresh array, computed in place: no temporaries of ``x``'s size but it)."""
    t = np.multiply(x, x)
    t *= x
    t *= _GELU_A
    t += x
    t *= _GELU_C
    return np.tanh(t, out=t)


def gelu_forward(x: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
    """GELU, tanh approximation (GPT-2's): ``0.5 x (1 + t)`` with ``t`` of
    :func:`gelu_tanh` (computed when not given)."""
    y = gelu_tanh(x) if t is None else t + 0.0
    y += 1.0
    y *= x
    y *= 0.5
    return y


def gelu_backward(dy: np.ndarray, x: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
    """``dy * d gelu(x) / dx`` for :func:`gelu_forward` (``t``: its :func:`gelu_tanh`):
    ``0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)``."""
    t = gelu_tanh(x) if t is None else t
    dt = np.multiply(x, x)
    dt *= 3.0 * _GELU_A
    dt += 1.0
    dt *= _GELU_C
    one_minus = np.multiply(t, t)
    np.subtract(1.0, one_minus, out=one_minus)
    dt *= one_minus
    dt *= x
    dt += t
    dt += 1.0
    dt *= 0.5
    dt *= dy
    return dt


def causal_mask(t: int) -> np.ndarray:
    """(t, t) booleans, True where position ``i`` may not attend to ``j`` (``j > i``)."""
    return np.triu(np.ones((t, t), dtype=bool), k=1)


@functools.lru_cache(maxsize=8)
def _causal_bias(t: int, dtype: np.dtype) -> np.ndarray:
    """(t, t): 0 where attention is allowed, ``-inf`` above the diagonal (added to the
    scores: one pass, where a boolean index would gather)."""
    bias = np.where(causal_mask(t), -np.inf, 0.0).astype(dtype)
    bias.flags.writeable = False
    return bias


def attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      softmax: Callable[..., np.ndarray] | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention on (..., T, d_head) arrays: the output and the attention
    probabilities (..., T, T), which the backward needs. Each row's maximum is
    subtracted before ``exp`` (the masked entries are exactly 0). ``softmax``:
    :func:`causal_softmax` (default) or a function of its signature (the compiled one,
    :mod:`~syncbench.kernels.cpu_transformer`)."""
    softmax = softmax or causal_softmax
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    probs = softmax(scores, 1.0 / math.sqrt(q.shape[-1]), out=scores)
    return np.matmul(probs, v), probs


def causal_softmax(scores: np.ndarray, scale: float, out: np.ndarray | None = None
                   ) -> np.ndarray:
    """The softmax of each row of ``scores * scale`` (..., T, T) with the causal mask
    (row ``i`` sees columns ``j <= i``; the others get exactly 0), into ``out`` (may be
    ``scores``) or a new array."""
    probs = np.multiply(scores, scale, out=out)
    probs += _causal_bias(scores.shape[-1], probs.dtype)
    probs -= probs.max(axis=-1, keepdims=True)
    np.exp(probs, out=probs)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def causal_softmax_backward(dp: np.ndarray, probs: np.ndarray, scale: float) -> np.ndarray:
    """The gradient of :func:`causal_softmax`'s scores from its probabilities' ``dp``:
    ``scale * p * (dp - sum(dp * p))`` row by row (masked entries: ``p = 0``)."""
    ds = probs * (dp - np.sum(dp * probs, axis=-1, keepdims=True))
    ds *= scale
    return ds


def attention_backward(dy: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       probs: np.ndarray,
                       softmax_backward: Callable[..., np.ndarray] | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of :func:`attention_forward`. The softmax's backward is
    ``ds = p * (dp - sum(dp * p))`` row by row; masked entries have ``p = 0`` and get
    no gradient. ``softmax_backward``: :func:`causal_softmax_backward` (default) or a
    function of its signature, which may write ``ds`` over ``dp`` (a temporary here)."""
    softmax_backward = softmax_backward or causal_softmax_backward
    scale = 1.0 / math.sqrt(q.shape[-1])
    dv = np.matmul(np.swapaxes(probs, -1, -2), dy)
    dp = np.matmul(dy, np.swapaxes(v, -1, -2))
    ds = softmax_backward(dp, probs, scale)
    dq = np.matmul(ds, k)
    dk = np.matmul(np.swapaxes(ds, -1, -2), q)
    return dq, dk, dv


def embedding_forward(tokens: np.ndarray, wte: np.ndarray, wpe: np.ndarray) -> np.ndarray:
    """(B, T) integer tokens -> (B, T, d): ``wte[token] + wpe[position]``."""
    return wte[tokens] + wpe[: tokens.shape[1]]


def embedding_backward(dh: np.ndarray, tokens: np.ndarray, wte_grad: np.ndarray,
                       wpe_grad: np.ndarray) -> None:
    """Gradients of :func:`embedding_forward`: ``dh`` rows scatter-added into
    ``wte_grad`` (ADDED to what it holds: the tied output layer wrote its part first),
    and summed over the batch into ``wpe_grad`` (overwritten; positions beyond T are 0)."""
    d = dh.shape[-1]
    np.add.at(wte_grad, tokens.reshape(-1), dh.reshape(-1, d))
    position_backward(dh, wpe_grad)


def position_backward(dh: np.ndarray, wpe_grad: np.ndarray) -> None:
    """The position embedding's gradient: ``dh`` (B, T, d) summed over the batch into
    ``wpe_grad`` (overwritten; positions beyond T are 0)."""
    wpe_grad[...] = 0
    np.sum(dh, axis=0, out=wpe_grad[:dh.shape[1]])


def sequence_xent(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over every (sequence, position) in nats per token, and its
    gradient with respect to ``logits`` (N, V) (``targets`` (N,) integers)."""
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    expd = np.exp(shifted)
    total = expd.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    picked = shifted[rows, targets]
    loss = float(np.mean(np.log(total[:, 0]) - picked))
    grad = expd / total
    grad[rows, targets] -= 1.0
    grad *= 1.0 / n
    return loss, grad


def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, T, d) -> (B, heads, T, d / heads), a copy in that order (contiguous)."""
    b, t, d = x.shape
    return _contiguous(x.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3))


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, heads, T, d_head) -> (B, T, heads * d_head), the inverse of :func:`split_heads`."""
    b, h, t, dh = x.shape
    return _contiguous(x.transpose(0, 2, 1, 3)).reshape(b, t, h * dh)


def _contiguous(x: Any) -> Any:
    """``x`` itself if C-contiguous, else a C-ordered copy (NumPy or CuPy alike)."""
    return x if x.flags.c_contiguous else x.copy()


def as_tokens(x: Any) -> np.ndarray:
    """Token ids as integers (a batch stream may hand them over as floats)."""
    return np.asarray(x).astype(np.intp, copy=False)
