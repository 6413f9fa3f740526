/* The language model's loss: the mean cross-entropy of (N, V) float32 logits against N
 * targets and its gradient, in one pass per row (kernels/transformer_ops.py's
 * sequence_xent).
 *
 * Per row: the maximum, exp of the shifted logits (vector_math.h's Cephes expf, about one
 * float32 ulp), their sum in eight lanes, then grad = exp / sum, minus 1 at the target,
 * times 1 / N; the row's loss log(sum) - shifted[target] (libm's logf, once per row) is
 * summed in double. The NumPy reference makes seven passes with a temporary each and
 * sums the losses pairwise in float32, so the two agree within the tolerance
 * tests/unit/test_cpu_transformer.py states, not to the bit. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "vector_math.h"

/* Returns the mean loss; grad may not alias logits. */
double sb_sequence_xent_f32(const float *restrict logits, const int64_t *restrict targets,
                            size_t n, size_t v, float *restrict grad)
{
    double total_loss = 0.0;
    const float inv_n = 1.0f / (float)n;
    for (size_t r = 0; r < n; r++) {
        const float *x = logits + r * v;
        float *g = grad + r * v;
        const float top = row_max(x, v);
        size_t j;
        for (j = 0; j < v; j++)
            g[j] = exp_nonpositive(x[j] - top);
        const float sum = row_sum(g, v);
        const size_t t = (size_t)targets[r];
        total_loss += (double)logf(sum) - (double)(x[t] - top);
        for (j = 0; j < v; j++)
            g[j] /= sum;
        g[t] -= 1.0f;
        for (j = 0; j < v; j++)
            g[j] *= inv_n;
    }
    return total_loss / (double)n;
}
