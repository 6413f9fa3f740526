/* The token embedding's backward: rows of dh scatter-added into wte's gradient by token
 * (kernels/transformer_ops.py's embedding_backward), in row order.
 *
 * NumPy's reference, ``np.add.at``, adds the rows one after another in the order of
 * the tokens as well, so the float32 sums are the same operations in the same order:
 * the result equals it to the bit. Tokens are checked by the caller (0 <= token < V). */
#include <stddef.h>
#include <stdint.h>

#include "vector_math.h"

void sb_embedding_scatter_add_f32(const float *restrict dh, const int64_t *restrict tokens,
                                  size_t rows, size_t d, float *restrict wte_grad)
{
    for (size_t r = 0; r < rows; r++) {
        float *out = wte_grad + (size_t)tokens[r] * d;
        const float *in = dh + r * d;
        for (size_t i = 0; i < d; i++)
            out[i] += in[i];
    }
}
