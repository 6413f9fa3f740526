/* LayerNorm over the last axis, forward and backward, over float32 rows
 * (kernels/transformer_ops.py's layernorm_*; Ba, Kiros and Hinton 2016, eq. 4).
 *
 * The NumPy reference makes about seven passes over the (tokens, d) activations with a
 * temporary each; here a row is read twice forward (its mean, then its variance about
 * the mean, as the reference computes them) and twice backward. Row sums use LANES
 * partial sums that the compiler keeps in one vector register, so the results equal the
 * reference within the tolerance tests/unit/test_cpu_transformer.py states (NumPy sums
 * pairwise), not to the bit. The parameter gradients are summed over rows in row order,
 * as NumPy sums over a leading axis.
 *
 * Forward:  mean, var = mean((x - mean)^2), rstd = 1 / sqrt(var + eps),
 *           xhat = (x - mean) rstd, y = gamma xhat + beta.
 * Backward: g = dy gamma, dx = rstd (g - mean(g) - xhat mean(g xhat)),
 *           dgamma = sum over rows of dy xhat, dbeta = sum over rows of dy.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "vector_math.h"

void sb_layernorm_forward_f32(const float *restrict x, const float *restrict gamma,
                              const float *restrict beta, float *restrict y,
                              float *restrict xhat, float *restrict rstd, size_t rows,
                              size_t d, float eps)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *hr = xhat + r * d, *yr = y + r * d;
        const float mean = row_sum(xr, d) / (float)d;
        for (size_t i = 0; i < d; i++)
            hr[i] = xr[i] - mean;
        const float var = row_dot(hr, hr, d) / (float)d;
        const float s = 1.0f / sqrtf(var + eps);
        rstd[r] = s;
        for (size_t i = 0; i < d; i++) {
            hr[i] *= s;
            yr[i] = hr[i] * gamma[i] + beta[i];
        }
    }
}

/* dgamma and dbeta are overwritten (not accumulated into). */
void sb_layernorm_backward_f32(const float *restrict dy, const float *restrict xhat,
                               const float *restrict rstd, const float *restrict gamma,
                               float *restrict dx, float *restrict dgamma,
                               float *restrict dbeta, size_t rows, size_t d)
{
    memset(dgamma, 0, d * sizeof *dgamma);
    memset(dbeta, 0, d * sizeof *dbeta);
    for (size_t r = 0; r < rows; r++) {
        const float *gr = dy + r * d, *hr = xhat + r * d;
        float *dr = dx + r * d;
        for (size_t i = 0; i < d; i++) {
            dgamma[i] += gr[i] * hr[i];
            dbeta[i] += gr[i];
            dr[i] = gr[i] * gamma[i]; /* g, kept in dx until the last pass */
        }
        const float mean_g = row_sum(dr, d) / (float)d;
        const float mean_gx = row_dot(dr, hr, d) / (float)d;
        const float s = rstd[r];
        for (size_t i = 0; i < d; i++)
            dr[i] = s * (dr[i] - mean_g - hr[i] * mean_gx);
    }
}
