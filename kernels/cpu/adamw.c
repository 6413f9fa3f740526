/* AdamW over a flat buffer in one pass (algorithms/adamw.py's AdamW.step).
 *
 * The NumPy reference makes about a dozen passes over buffers of the model's size; this
 * is one pass doing the same operations in the same order per element, with the same
 * scalars rounded to the buffers' type by the caller, without fused multiply-adds, and
 * with the correctly rounded sqrt and division both sides use, so the result equals the
 * reference to the bit:
 *   w = w * (wd[i] * neg_lr + 1)     (wd an array of n decays)  or  w = w * factor
 *   m = m + (g - m) * one_minus_b1
 *   v = v * b2 + (g * one_minus_b2) * g
 *   w = w + (m * neg_step) / (sqrt(v) / c2 + eps)
 * ``wd`` NULL and ``has_factor`` 0: no decay (the reference multiplies by nothing).
 * ``no-math-errno`` lets the square root vectorize (v >= 0: errno is never set, and the
 * root is the same correctly rounded one).
 */
#pragma GCC optimize("fp-contract=off", "no-math-errno")
#include <math.h>
#include <stddef.h>

#define ADAMW(NAME, T, SQRT)                                                              \
    void NAME(T *restrict w, const T *restrict g, T *restrict m, T *restrict v, size_t n,  \
              const T *restrict wd, T neg_lr, int has_factor, T factor, T one_minus_b1,   \
              T b2, T one_minus_b2, T c2, T eps, T neg_step)                              \
    {                                                                                     \
        for (size_t i = 0; i < n; i++) {                                                  \
            T wi = w[i];                                                                  \
            if (wd)                                                                       \
                wi = wi * (wd[i] * neg_lr + (T)1);                                        \
            else if (has_factor)                                                          \
                wi = wi * factor;                                                         \
            const T gi = g[i];                                                            \
            const T mi = m[i] + (gi - m[i]) * one_minus_b1;                               \
            const T vi = v[i] * b2 + (gi * one_minus_b2) * gi;                            \
            m[i] = mi;                                                                    \
            v[i] = vi;                                                                    \
            w[i] = wi + (mi * neg_step) / (SQRT(vi) / c2 + eps);                          \
        }                                                                                 \
    }

ADAMW(sb_adamw_f32, float, sqrtf)
ADAMW(sb_adamw_f64, double, sqrt)
