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
 * Both may work in place (probs == scores, ds == dp).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LANES 8

static inline float cephes_expf(float x)
{
    /* below -87.3 exp underflows float32's normal range: clamped, as a probability of
     * 1e-38 against a row sum of at least 1 (the maximum's own term) */
    x = __builtin_fmaxf(x, -87.0f);
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round */
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

/* The largest of s[0..n), n >= 1, by LANES partial maxima (the order does not matter). */
static inline float row_max(const float *s, size_t n)
{
    float part[LANES];
    for (int l = 0; l < LANES; l++)
        part[l] = s[0];
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++)
            part[l] = __builtin_fmaxf(part[l], s[j + l]);
    float top = part[0];
    for (int l = 1; l < LANES; l++)
        top = __builtin_fmaxf(top, part[l]);
    for (; j < n; j++)
        top = __builtin_fmaxf(top, s[j]);
    return top;
}

void sb_causal_softmax_f32(const float *scores, float *probs, size_t count, size_t t,
                           float scale)
{
    for (size_t m = 0; m < count; m++) {
        for (size_t i = 0; i < t; i++) {
            const float *s = scores + (m * t + i) * t;
            float *p = probs + (m * t + i) * t;
            const size_t n = i + 1;
            float top = row_max(s, n);
            top *= scale; /* scale > 0: the maximum of the scaled row */
            for (size_t j = 0; j < n; j++)
                p[j] = cephes_expf(s[j] * scale - top);
            float part[LANES] = {0};
            size_t j = 0;
            for (; j + LANES <= n; j += LANES)
                for (int l = 0; l < LANES; l++)
                    part[l] += p[j + l];
            float total = 0.0f;
            for (int l = 0; l < LANES; l++)
                total += part[l];
            for (; j < n; j++)
                total += p[j];
            for (j = 0; j < n; j++)
                p[j] /= total;
            memset(p + n, 0, (t - n) * sizeof *p);
        }
    }
}

void sb_causal_softmax_backward_f32(const float *dp, const float *probs, float *ds,
                                    size_t count, size_t t, float scale)
{
    for (size_t m = 0; m < count; m++) {
        for (size_t i = 0; i < t; i++) {
            const float *g = dp + (m * t + i) * t, *p = probs + (m * t + i) * t;
            float *out = ds + (m * t + i) * t;
            const size_t n = i + 1;
            float part[LANES] = {0};
            size_t j = 0;
            for (; j + LANES <= n; j += LANES)
                for (int l = 0; l < LANES; l++)
                    part[l] += g[j + l] * p[j + l];
            float dot = 0.0f;
            for (int l = 0; l < LANES; l++)
                dot += part[l];
            for (; j < n; j++)
                dot += g[j] * p[j];
            for (j = 0; j < n; j++)
                out[j] = p[j] * (g[j] - dot) * scale;
            memset(out + n, 0, (t - n) * sizeof *out);
        }
    }
}
