/* GELU, tanh approximation (Hendrycks and Gimpel 2016, section 2; GPT-2's), forward and
 * backward in one pass each over float32 arrays (kernels/transformer_ops.py's gelu_*).
 *
 * The NumPy reference makes about ten passes over the (tokens, 4 d) activations and
 * calls NumPy's tanh; here each element is read once. tanh is Eigen's rational
 * approximation of float tanh (Eigen, MathFunctionsImpl.h, generic_fast_tanh_float:
 * a degree-13 odd numerator over a degree-6 even denominator on [-7.9053, 7.9053];
 * exactly +-1 beyond, so that GELU's slope there is exactly 1 or 0), plain arithmetic that the compiler vectorizes where libm's tanhf would
 * not be; its error is a few float32 ulps, so the results equal the reference within
 * the tolerance that tests/unit/test_cpu_transformer.py states, not to the bit.
 *
 * Forward: t = tanh(c (x + a x^3)), y = 0.5 x (1 + t); t is kept for the backward.
 * Backward: dx = dy (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vector_math.h"


static const float GELU_C = 0.7978845608028654f; /* sqrt(2 / pi) */
static const float GELU_A = 0.044715f;

static inline float fast_tanh(float x0)
{
    const float clamp = 7.90531110763549805f;
    const int beyond = (x0 > clamp) | (x0 < -clamp);
    const float x = select(x0, 0.0f, beyond); /* no overflow in the polynomials */
    const float x2 = x * x;
    float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = x2 * p + -8.60467152213735e-11f;
    p = x2 * p + 5.12229709037114e-08f;
    p = x2 * p + 1.48572235717979e-05f;
    p = x2 * p + 6.37261928875436e-04f;
    p = x2 * p + 4.89352455891786e-03f;
    p = x * p;
    float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = x2 * q + 2.26843463243900e-03f;
    q = x2 * q + 4.89352518554385e-03f;
    return select(p / q, select(1.0f, -1.0f, x0 < 0.0f), beyond); /* +-1 beyond */
}

void sb_gelu_forward_f32(const float *restrict x, float *restrict y, float *restrict t,
                         size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float xi = x[i];
        const float ti = fast_tanh(GELU_C * (xi + GELU_A * xi * xi * xi));
        t[i] = ti;
        y[i] = 0.5f * xi * (1.0f + ti);
    }
}

void sb_gelu_backward_f32(const float *restrict dy, const float *restrict x,
                          const float *restrict t, float *restrict dx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float xi = x[i], ti = t[i];
        const float slope = GELU_C * (1.0f + 3.0f * GELU_A * xi * xi) * (1.0f - ti * ti);
        dx[i] = dy[i] * (0.5f * (1.0f + ti) + 0.5f * xi * slope);
    }
}
