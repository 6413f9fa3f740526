"""The transformer's element-wise and row-wise passes on the CPU, compiled: GELU
(``kernels/cpu/gelu.c``), LayerNorm (``layernorm.c``), attention's causal softmax
(``softmax.c``), the embedding's scatter-add (``embedding.c``) and the loss
(``xent.c``).

Profiling the ``gpt`` step on one core (cProfile, CPU time) with GELU alone compiled
put the GEMMs at about 55% of the step, attention's batched products and softmax at
18%, GELU's forward and backward at 13%, LayerNorm at 7%; with these passes compiled
the GEMMs are about 80% (docs/RESULTS.md). The NumPy references
(:mod:`syncbench.kernels.transformer_ops`) make about ten passes over GELU's
(tokens, 4 d) activations, seven over LayerNorm's rows and six over every (t, t)
attention square, the masked half included; the compiled passes read each row
once or twice and skip the masked half. GELU and the softmax use vectorizable
approximations of tanh and exp (the C files say which) and the row sums run in
eight lanes, so float32 results equal the references within a few float32 ulps
(tests/unit/test_cpu_transformer.py states the tolerances), not to the bit.
float64 arrays, arrays that are not contiguous, a library that did not build, and
``SYNCBENCH_CPU_KERNELS=numpy`` take the reference.
"""

from __future__ import annotations

import numpy as np

from syncbench.kernels import cpu_native
from syncbench.kernels import transformer_ops as T


def _compiled(*arrays: np.ndarray) -> bool:
    """Whether the float32 kernels take these arrays (and the library is built)."""
    return (not cpu_native.numpy_only and cpu_native.library() is not None
            and all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays))


def gelu_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(GELU of ``x``, its tanh term for :func:`gelu_backward`)."""
    if not _compiled(x):
        t = T.gelu_tanh(x)
        return T.gelu_forward(x, t), t
    y, t = np.empty_like(x), np.empty_like(x)
    cpu_native.library().sb_gelu_forward_f32(x.ctypes.data, y.ctypes.data, t.ctypes.data,
                                             x.size)
    return y, t


def gelu_backward(dy: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``dy * gelu'(x)`` with ``t`` from :func:`gelu_forward`."""
    if not _compiled(dy, x, t):
        return T.gelu_backward(dy, x, t)
    dx = np.empty_like(x)
    cpu_native.library().sb_gelu_backward_f32(dy.ctypes.data, x.ctypes.data, t.ctypes.data,
                                              dx.ctypes.data, x.size)
    return dx


def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y, xhat, rstd)`` of LayerNorm over the last axis (``rstd`` of shape (..., 1)),
    as :func:`~syncbench.kernels.ops.layernorm_forward`."""
    if not _compiled(x, gamma, beta):
        y, (xhat, rstd) = T.layernorm_forward(x, gamma, beta, eps)
        return y, xhat, rstd
    d = x.shape[-1]
    rows = x.size // d
    y, xhat = np.empty_like(x), np.empty_like(x)
    rstd = np.empty((*x.shape[:-1], 1), dtype=x.dtype)
    cpu_native.library().sb_layernorm_forward_f32(
        x.ctypes.data, gamma.ctypes.data, beta.ctypes.data, y.ctypes.data, xhat.ctypes.data,
        rstd.ctypes.data, rows, d, eps)
    return y, xhat, rstd


def layernorm_backward(dy: np.ndarray, xhat: np.ndarray, rstd: np.ndarray, gamma: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dgamma, dbeta)`` of :func:`layernorm_forward`."""
    if not _compiled(dy, xhat, rstd, gamma):
        return T.layernorm_backward(dy, (xhat, rstd), gamma)
    d = dy.shape[-1]
    dx = np.empty_like(dy)
    dgamma, dbeta = np.empty(d, dtype=dy.dtype), np.empty(d, dtype=dy.dtype)
    cpu_native.library().sb_layernorm_backward_f32(
        dy.ctypes.data, xhat.ctypes.data, rstd.ctypes.data, gamma.ctypes.data, dx.ctypes.data,
        dgamma.ctypes.data, dbeta.ctypes.data, dy.size // d, d)
    return dx, dgamma, dbeta


def causal_softmax(scores: np.ndarray, scale: float, out: np.ndarray | None = None
                   ) -> np.ndarray:
    """:func:`~syncbench.kernels.transformer_ops.causal_softmax` (``out`` may be
    ``scores``)."""
    if out is None:
        out = np.empty_like(scores)
    if not _compiled(scores, out):
        return T.causal_softmax(scores, scale, out=out)
    t = scores.shape[-1]
    cpu_native.library().sb_causal_softmax_f32(scores.ctypes.data, out.ctypes.data,
                                               scores.size // (t * t), t, scale)
    return out


def causal_softmax_backward(dp: np.ndarray, probs: np.ndarray, scale: float,
                            out: np.ndarray | None = None) -> np.ndarray:
    """:func:`~syncbench.kernels.transformer_ops.causal_softmax_backward` (``out`` may be
    ``dp``)."""
    if not _compiled(dp, probs) or (out is not None and not _compiled(out)):
        ds = T.causal_softmax_backward(dp, probs, scale)
        if out is None:
            return ds
        out[...] = ds
        return out
    out = np.empty_like(dp) if out is None else out
    t = dp.shape[-1]
    cpu_native.library().sb_causal_softmax_backward_f32(
        dp.ctypes.data, probs.ctypes.data, out.ctypes.data, dp.size // (t * t), t, scale)
    return out


def attention_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~syncbench.kernels.transformer_ops.attention_forward` with the compiled
    softmax (the two batched products in BLAS, as there)."""
    return T.attention_forward(q, k, v, softmax=causal_softmax)


def _softmax_backward_over_dp(dp: np.ndarray, probs: np.ndarray, scale: float) -> np.ndarray:
    """:func:`causal_softmax_backward` written over ``dp``."""
    return causal_softmax_backward(dp, probs, scale, out=dp)


def attention_backward(dy: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                       probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~syncbench.kernels.transformer_ops.attention_backward` with the compiled
    softmax backward, in place over the probabilities' gradient."""
    return T.attention_backward(dy, q, k, v, probs, softmax_backward=_softmax_backward_over_dp)


def _tokens_in_range(tokens: np.ndarray, count: int) -> bool:
    """Whether every token indexes one of ``count`` rows (the reference would raise on
    one that does not; the kernel must never see it)."""
    return tokens.size == 0 or (int(tokens.min()) >= 0 and int(tokens.max()) < count)


def embedding_backward(dh: np.ndarray, tokens: np.ndarray, wte_grad: np.ndarray,
                       wpe_grad: np.ndarray) -> None:
    """:func:`~syncbench.kernels.transformer_ops.embedding_backward`: the scatter-add
    compiled (``embedding.c``, equal to ``np.add.at`` to the bit), the positions' sum in
    NumPy."""
    ids = np.ascontiguousarray(tokens, dtype=np.int64)
    if not (_compiled(dh, wte_grad) and _tokens_in_range(ids, wte_grad.shape[0])):
        T.embedding_backward(dh, tokens, wte_grad, wpe_grad)
        return
    d = dh.shape[-1]
    cpu_native.library().sb_embedding_scatter_add_f32(dh.ctypes.data, ids.ctypes.data,
                                                      ids.size, d, wte_grad.ctypes.data)
    T.position_backward(dh, wpe_grad)


def sequence_xent(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """:func:`~syncbench.kernels.transformer_ops.sequence_xent` in one compiled pass per
    row (``xent.c``)."""
    ids = np.ascontiguousarray(targets, dtype=np.int64)
    if not (_compiled(logits) and logits.ndim == 2
            and _tokens_in_range(ids, logits.shape[1]) and ids.size == logits.shape[0]):
        return T.sequence_xent(logits, targets)
    grad = np.empty_like(logits)
    loss = cpu_native.library().sb_sequence_xent_f32(
        logits.ctypes.data, ids.ctypes.data, logits.shape[0], logits.shape[1], grad.ctypes.data)
    return float(loss), grad
