"""The transformer's element-wise hot spot on the CPU: GELU through ``kernels/cpu/gelu.c``.

Profiling the default ``gpt`` step on one core (cProfile, CPU time) put the GEMMs
at about 55% of the step, attention's batched products and softmax at 18%,
GELU's forward and backward at 13%, LayerNorm at 7%. The NumPy GELU makes
about ten passes over the (tokens, 4 d) activations; the compiled one makes
one pass each way with a vectorizable rational tanh (the C file says which),
so its float32 results equal the NumPy reference
(:mod:`syncbench.kernels.transformer_ops`) within a few float32 ulps, not to
the bit. float64 arrays, arrays that are not contiguous, a library that did
not build, and ``SYNCBENCH_CPU_KERNELS=numpy`` take the reference.
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
