/* Attention's causal softmax, forward and backward, over float32 (count, t, t) scores
 * (kernels/transformer_ops.py's causal_softmax*; Vaswani et al. 2017, eq. 1, with the
 * decoder's mask).
 *
 * The NumPy reference makes six passes over every (t, t) square, the masked upper half
 * included, with NumPy's expf; here row i reads and exponentiates only its i + 1 visible
 * scores and writes zeros after them. exp is Cephes' expf (S. Moshier, Cephes Math
 * Library, expf.c: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-5 polynomial in r,
 * 2^n set in the exponent bits), in plain arithmetic that the compiler vectorizes; its
 * error is about one float32 ulp on the arguments here (x <= 0 once the row's maximum
 * is subtracted), so the results equal the reference within the tolerance that
 * tests/unit/test_cpu_transformer.py states, not to the bit.
 *
 * Forward:  p_j = exp(s_j scale - max) / sum, j <= i; p_j = 0 for j > i.
 * Backward: ds_j = scale p_j (dp_j - sum_k dp_k p_k); 0 for j > i.
 * Both may work in place (probs == scores, ds == dp): a row is copied to the output
 * first where it is not, and then worked on there.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vector_math.h"



/* One row in place: p[0..n) holds the scores, then the probabilities; p[n..t) zeros. */
static inline void softmax_row(float *restrict p, size_t n, size_t t, float scale)
{
    const float top = row_max(p, n) * scale; /* scale > 0: the scaled row's maximum */
    for (size_t j = 0; j < n; j++)
        p[j] = exp_nonpositive(p[j] * scale - top);
    const float total = row_sum(p, n);
    for (size_t j = 0; j < n; j++)
        p[j] /= total;
    memset(p + n, 0, (t - n) * sizeof *p);
}

void sb_causal_softmax_f32(const float *scores, float *probs, size_t count, size_t t,
                           float scale)
{
    for (size_t row = 0; row < count * t; row++) {
        float *p = probs + row * t;
        const size_t n = row % t + 1; /* row i of its square sees columns 0..i */
        if (p != scores + row * t)
            memcpy(p, scores + row * t, n * sizeof *p);
        softmax_row(p, n, t, scale);
    }
}

/* One row in place: g[0..n) holds dp, then ds; g[n..t) zeros. */
static inline void softmax_backward_row(float *restrict g, const float *restrict p, size_t n,
                                        size_t t, float scale)
{
    const float dot = row_dot(g, p, n);
    for (size_t j = 0; j < n; j++)
        g[j] = p[j] * (g[j] - dot) * scale;
    memset(g + n, 0, (t - n) * sizeof *g);
}

void sb_causal_softmax_backward_f32(const float *dp, const float *probs, float *ds,
                                    size_t count, size_t t, float scale)
{
    for (size_t row = 0; row < count * t; row++) {
        float *g = ds + row * t;
        if (g != dp + row * t)
            memcpy(g, dp + row * t, (row % t + 1) * sizeof *g);
        softmax_backward_row(g, probs + row * t, row % t + 1, t, scale);
    }
}
