/* Momentum SGD over a flat buffer in one pass (kernels/ops.py's sgd_momentum_).
 *
 * The NumPy reference makes four passes over the buffers (v *= mu; v += g; the decay
 * term; w -= lr * v), each reading and writing arrays of the model's size from L3 or
 * memory; this is one pass doing the same operations in the same order per element,
 * and without fused multiply-adds, so the result equals the reference to the bit:
 * v = (mu * v + g) [+ w * wd]; w = w - v * lr. ``wd`` is an array of n decays or
 * NULL, then ``wd_scalar`` (0: no decay term, as the reference adds none).
 */
#pragma GCC optimize("fp-contract=off")
#include <stddef.h>

#define SGD_MOMENTUM(NAME, T)                                                             \
    void NAME(T *restrict w, const T *restrict g, T *restrict v, size_t n, T lr, T mu,    \
              const T *restrict wd, T wd_scalar)                                          \
    {                                                                                     \
        if (wd) {                                                                         \
            for (size_t i = 0; i < n; i++) {                                              \
                const T vi = (mu * v[i] + g[i]) + w[i] * wd[i];                           \
                v[i] = vi;                                                                \
                w[i] = w[i] - vi * lr;                                                    \
            }                                                                             \
        } else if (wd_scalar != 0) {                                                      \
            for (size_t i = 0; i < n; i++) {                                              \
                const T vi = (mu * v[i] + g[i]) + w[i] * wd_scalar;                       \
                v[i] = vi;                                                                \
                w[i] = w[i] - vi * lr;                                                    \
            }                                                                             \
        } else {                                                                          \
            for (size_t i = 0; i < n; i++) {                                              \
                const T vi = mu * v[i] + g[i];                                            \
                v[i] = vi;                                                                \
                w[i] = w[i] - vi * lr;                                                    \
            }                                                                             \
        }                                                                                 \
    }

SGD_MOMENTUM(sb_sgd_momentum_f32, float)
SGD_MOMENTUM(sb_sgd_momentum_f64, double)
