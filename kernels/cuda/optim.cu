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
