/* Float helpers the vectorizer takes, shared by the transformer's kernels (gelu.c,
 * layernorm.c, softmax.c, xent.c; row sums, dot products and maxima in LANES partial
 * results): plain arithmetic and bit operations, no libm calls and no branches
 * on floats, so loops over them vectorize (GCC refuses both). */
#ifndef SYNCBENCH_VECTOR_MATH_H
#define SYNCBENCH_VECTOR_MATH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ``a`` where ``take_b`` is 0, else ``b``: a bitwise select, which the vectorizer takes
 * where it refuses the branch of ``?:`` on floats. */
static inline float select(float a, float b, int take_b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    const int32_t mask = -(int32_t)take_b;
    const int32_t out = (ia & ~mask) | (ib & mask);
    float f;
    memcpy(&f, &out, sizeof f);
    return f;
}

/* exp(x) for x <= 0 (a softmax's argument once the row's maximum is subtracted): Cephes'
 * expf (S. Moshier, Cephes Math Library, expf.c: x = n ln 2 + r with |r| <= ln 2 / 2, a
 * degree-5 polynomial in r, 2^n set in the exponent bits), about one float32 ulp. Below
 * -87 exp leaves float32's normal range: clamped there (1e-38 against a row sum of at
 * least 1, the maximum's own term). */
static inline float exp_nonpositive(float x)
{
    x = select(x, -87.0f, x < -87.0f);
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round */
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (int32_t)((uint32_t)((int32_t)n + 127) << 23);
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

#define LANES 8

/* The sum of a[0..n) by LANES partial sums (one vector register). */
static inline float row_sum(const float *restrict a, size_t n)
{
    float part[LANES] = {0};
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++)
            part[l] += a[j + l];
    float total = 0.0f;
    for (int l = 0; l < LANES; l++)
        total += part[l];
    for (; j < n; j++)
        total += a[j];
    return total;
}

/* The sum of a[i] b[i] over [0..n) by LANES partial sums. */
static inline float row_dot(const float *restrict a, const float *restrict b, size_t n)
{
    float part[LANES] = {0};
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++)
            part[l] += a[j + l] * b[j + l];
    float total = 0.0f;
    for (int l = 0; l < LANES; l++)
        total += part[l];
    for (; j < n; j++)
        total += a[j] * b[j];
    return total;
}

/* The largest of s[0..n), n >= 1, by LANES partial maxima (the order does not matter). */
static inline float row_max(const float *restrict s, size_t n)
{
    float part[LANES];
    for (int l = 0; l < LANES; l++)
        part[l] = s[0];
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++)
            part[l] = select(part[l], s[j + l], s[j + l] > part[l]);
    float top = part[0];
    for (int l = 1; l < LANES; l++)
        top = part[l] > top ? part[l] : top;
    for (; j < n; j++)
        top = s[j] > top ? s[j] : top;
    return top;
}

/* GCC's -march=znver1 (what AMD EPYC virtual machines may report) vectorizes 4 floats
 * at a time; 8 (AVX2) ran GELU 15% faster there. Intel's tunings prefer 256 already.
 * Applies to the functions that follow the include. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC target("prefer-vector-width=256")
#endif

#endif
