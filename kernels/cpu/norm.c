/* BatchNorm's four passes on one contiguous row per channel, (C, M), float32.
 *
 * The same quantities as kernels/cpu_norm.py's NumPy functions (see its docstring: the
 * rows about the running mean, ``work = x - shift``, are kept instead of xhat; the
 * output is one folded affine; the ReLU fused by its mask). Memory bounds them: each
 * function here reads each array once, in one pass per channel, where the NumPy path
 * needs a temporary and several passes per block. Sums are taken in float32 vector
 * lanes over runs of SUM_RUN elements, each run's lanes added into a double, so their
 * error does not grow with the row (a ResNet's first stage: 50,176 elements per
 * channel). The ReLU is ``y * (y > 0)``, as kernels/ops.py's relu_in_place, so NaN and
 * -0 come out as there; the mask is one byte (NumPy's bool) per element. Products are
 * not contracted into FMAs here, so the element-wise passes (the affine, the input
 * gradient) round as the NumPy path's separate multiplies and adds do and equal it bit
 * for bit: a fused rounding can move a value next to 0 across the ReLU's kink.
 */
#pragma GCC optimize("fp-contract=off")
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));

#define VL 16
#define SUM_RUN 1024

static inline v16 vload(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }

static inline double lanes_sum(v16 v)
{
    double s = 0.0;
    for (int l = 0; l < VL; l++)
        s += v[l];
    return s;
}

/* sums[c] = sum(x - shift), sums[C + c] = sum((x - shift)^2), work = x - shift. */
void sb_bn_sums_about(const float *x, const float *shift, float *work, double *sums, int c_n,
                      size_t m)
{
    for (int c = 0; c < c_n; c++) {
        const float *xr = x + c * m;
        float *wr = work + c * m;
        const float s = shift[c];
        double s1 = 0.0, s2 = 0.0;
        for (size_t i0 = 0; i0 < m; i0 += SUM_RUN) {
            const size_t end = i0 + SUM_RUN < m ? i0 + SUM_RUN : m;
            v16 a1 = {0}, a2 = {0};
            size_t i = i0;
            for (; i + VL <= end; i += VL) {
                v16 w = vload(xr + i) - s;
                memcpy(wr + i, &w, sizeof w);
                a1 += w;
                a2 += w * w;
            }
            s1 += lanes_sum(a1);
            s2 += lanes_sum(a2);
            for (; i < end; i++) {
                const float w = xr[i] - s;
                wr[i] = w;
                s1 += w;
                s2 += (double)(w * w);
            }
        }
        sums[c] = s1;
        sums[c_n + c] = s2;
    }
}

/* y = x * scale + offset per row; with ``mask`` (not NULL) then mask = y > 0,
 * y = y * mask. */
void sb_bn_affine(const float *x, const float *scale, const float *offset, float *y,
                  uint8_t *mask, int c_n, size_t m)
{
    for (int c = 0; c < c_n; c++) {
        const float *xr = x + c * m;
        float *yr = y + c * m;
        const float a = scale[c], b = offset[c];
        if (mask) {
            uint8_t *mr = mask + c * m;
            for (size_t i = 0; i < m; i++) {
                const float v = xr[i] * a + b;
                const uint8_t pos = v > 0.0f;
                mr[i] = pos;
                yr[i] = v * (float)pos;
            }
        } else {
            for (size_t i = 0; i < m; i++)
                yr[i] = xr[i] * a + b;
        }
    }
}

/* sums[c] = sum(g), sums[C + c] = sum(g * work) of g = dy * mask (dy without a mask). */
void sb_bn_grad_sums(const float *dy, const float *work, const uint8_t *mask, double *sums,
                     int c_n, size_t m)
{
    for (int c = 0; c < c_n; c++) {
        const float *dr = dy + c * m, *wr = work + c * m;
        const uint8_t *mr = mask ? mask + c * m : 0;
        double s1 = 0.0, s2 = 0.0;
        for (size_t i0 = 0; i0 < m; i0 += SUM_RUN) {
            const size_t end = i0 + SUM_RUN < m ? i0 + SUM_RUN : m;
            float g_run[SUM_RUN];
            const size_t len = end - i0;
            if (mr) {
                for (size_t i = 0; i < len; i++)
                    g_run[i] = dr[i0 + i] * (float)mr[i0 + i];
            } else {
                memcpy(g_run, dr + i0, len * sizeof(float));
            }
            v16 a1 = {0}, a2 = {0};
            size_t i = 0;
            for (; i + VL <= len; i += VL) {
                v16 g = vload(g_run + i);
                a1 += g;
                a2 += g * vload(wr + i0 + i);
            }
            s1 += lanes_sum(a1);
            s2 += lanes_sum(a2);
            for (; i < len; i++) {
                s1 += g_run[i];
                s2 += (double)(g_run[i] * wr[i0 + i]);
            }
        }
        sums[c] = s1;
        sums[c_n + c] = s2;
    }
}

/* out = scale * g + k1 * work + k0 per row, g = dy * mask (dy without a mask). */
void sb_bn_input_grad(const float *dy, const float *work, const uint8_t *mask,
                      const float *scale, const float *k1, const float *k0, float *out,
                      int c_n, size_t m)
{
    for (int c = 0; c < c_n; c++) {
        const float *dr = dy + c * m, *wr = work + c * m;
        float *orow = out + c * m;
        const float a = scale[c], b = k1[c], z = k0[c];
        if (mask) {
            const uint8_t *mr = mask + c * m;
            for (size_t i = 0; i < m; i++)
                orow[i] = dr[i] * (float)mr[i] * a + (wr[i] * b + z);
        } else {
            for (size_t i = 0; i < m; i++)
                orow[i] = dr[i] * a + (wr[i] * b + z);
        }
    }
}
