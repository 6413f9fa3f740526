// Fused parameter updates over flat buffers (syncbench.kernels.ops has the NumPy references).
//
// Compiled once per precision with -DSB_REAL=float or -DSB_REAL=double and
// --fmad=false, so every kernel performs the same IEEE operations, in the
// same order, as its NumPy reference (bit-identical results).
// Every kernel is a grid-stride loop where element i is read and written by
// exactly one thread: no shared memory, no atomics, no synchronisation.
#include "common.cuh"

// Momentum SGD with L2 weight decay (the PyTorch convention), one decay for every element:
//   v = mu * v + (g + wd * w);   w = w - lr * v
// A zero wd skips the decay term, as the reference does for the number 0.
extern "C" __global__ void sgd_momentum(real* w, const real* g, real* v, real lr, real mu,
                                        real wd, long long n) {
    SB_GRID_LOOP(i, n) {
        real vi = v[i] * mu;
        vi = vi + g[i];
        if (wd != (real)0) vi = vi + w[i] * wd;
        v[i] = vi;
        w[i] = w[i] - vi * lr;
    }
}

// The same update with a decay per element (wd[i]: the weight decay times a 0/1
// mask, so that exempt parameters, e.g. biases and BatchNorm's gamma and beta,
// do not decay). The term w[i] * wd[i] is added even where wd[i] is 0, as the
// reference adds the whole product array: the results stay bit-identical
// (a -0 velocity becomes +0, an infinite weight gives NaN) as on the CPU.
extern "C" __global__ void sgd_momentum_array_decay(real* w, const real* g, real* v,
                                                    const real* wd, real lr, real mu,
                                                    long long n) {
    SB_GRID_LOOP(i, n) {
        real vi = v[i] * mu;
        vi = vi + g[i];
        vi = vi + w[i] * wd[i];
        v[i] = vi;
        w[i] = w[i] - vi * lr;
    }
}

// y = y + a * x
extern "C" __global__ void axpy(real* y, real a, const real* x, long long n) {
    SB_GRID_LOOP(i, n) { y[i] = y[i] + x[i] * a; }
}

// AdamW (algorithms/adamw.py's reference step; kernels/cpu/adamw.c on the CPU), one pass
// per element with the operations of the reference in its order, so with --fmad=false
// and the correctly rounded sqrt and division (NVRTC's defaults, -prec-sqrt and
// -prec-div) the result equals the reference to the bit:
//   w = w * factor                                 (has_factor: the decay 1 - lr * wd)
//   m = m + (g - m) * one_minus_b1
//   v = v * b2 + (g * one_minus_b2) * g
//   w = w + (m * neg_step) / (sqrt(v) / c2 + eps)
// c2 = sqrt(1 - b2^t) and neg_step = -lr / (1 - b1^t): PyTorch's bias corrections,
// computed in double by the caller and rounded to real as NumPy rounds them.
// The moments and the step of element i, after its decay (wi: w[i] decayed); both
// kernels below end with it.
__device__ __forceinline__ void sb_adamw_step(real* w, const real* g, real* m, real* v,
                                              long long i, real wi, real one_minus_b1,
                                              real b2, real one_minus_b2, real c2, real eps,
                                              real neg_step) {
    real gi = g[i];
    real mi = m[i] + (gi - m[i]) * one_minus_b1;
    real vi = v[i] * b2 + (gi * one_minus_b2) * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi + (mi * neg_step) / (sqrt(vi) / c2 + eps);
}

extern "C" __global__ void adamw(real* w, const real* g, real* m, real* v, int has_factor,
                                 real factor, real one_minus_b1, real b2, real one_minus_b2,
                                 real c2, real eps, real neg_step, long long n) {
    SB_GRID_LOOP(i, n) {
        real wi = w[i];
        if (has_factor) wi = wi * factor;
        sb_adamw_step(w, g, m, v, i, wi, one_minus_b1, b2, one_minus_b2, c2, eps, neg_step);
    }
}

// The same step with a decay per element (wd[i]: the weight decay times the 0/1 mask of
// --wd-exempt): w = w * (wd[i] * neg_lr + 1), as the reference forms 1 - lr * wd[i].
extern "C" __global__ void adamw_array_decay(real* w, const real* g, real* m, real* v,
                                             const real* wd, real neg_lr, real one_minus_b1,
                                             real b2, real one_minus_b2, real c2, real eps,
                                             real neg_step, long long n) {
    SB_GRID_LOOP(i, n) {
        real wi = w[i] * (wd[i] * neg_lr + (real)1);
        sb_adamw_step(w, g, m, v, i, wi, one_minus_b1, b2, one_minus_b2, c2, eps, neg_step);
    }
}
