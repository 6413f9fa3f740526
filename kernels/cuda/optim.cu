// Fused parameter updates over flat buffers (syncbench.kernels.ops has the NumPy references).
//
// Compiled once per precision with -DSB_REAL=float or -DSB_REAL=double and
// --fmad=false, so every kernel performs the same IEEE operations, in the
// same order, as its NumPy reference (bit-identical results).
// Every kernel is a grid-stride loop where element i is read and written by
// exactly one thread: no shared memory, no atomics, no synchronisation.
#include "common.cuh"

// Momentum SGD with L2 weight decay (the PyTorch convention):
//   v = mu * v + (g + wd * w);   w = w - lr * v
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

// y = y + a * x
extern "C" __global__ void axpy(real* y, real a, const real* x, long long n) {
    SB_GRID_LOOP(i, n) { y[i] = y[i] + x[i] * a; }
}

// y = a * x + b * y   (weighted model averaging)
extern "C" __global__ void axpby(real* y, real a, const real* x, real b, long long n) {
    SB_GRID_LOOP(i, n) { y[i] = y[i] * b + x[i] * a; }
}

// OD-SGD local step, LocalOpt = sgd:  w_loc = w_g - scale * g   (scale = lr_local / N)
extern "C" __global__ void odsgd_local_sgd(real* w_loc, const real* w_g, const real* g,
                                           real scale, long long n) {
    SB_GRID_LOOP(i, n) { w_loc[i] = w_g[i] - g[i] * scale; }
}

// OD-SGD local step, LocalOpt = dc (DC-ASGD, Zheng et al. 2017, Eq. 10):
//   c = g + lambda * g * g * (w_loc - w_prev);  w_prev = w_loc;  w_loc = w_g - scale * c
extern "C" __global__ void odsgd_local_dc(real* w_loc, const real* w_g, const real* g,
                                          real* w_prev, real scale, real lambda, long long n) {
    SB_GRID_LOOP(i, n) {
        real w = w_loc[i];
        real gi = g[i];
        real c = w - w_prev[i];
        w_prev[i] = w;
        c = c * gi;
        c = c * gi;
        c = c * lambda;
        c = c + gi;
        w_loc[i] = w_g[i] - c * scale;
    }
}

// DC-ASGD delay compensation: out = g + lambda * g * g * (w_now - w_then)
extern "C" __global__ void dc_compensate(real* out, const real* g, const real* w_now,
                                         const real* w_then, real lambda, long long n) {
    SB_GRID_LOOP(i, n) {
        real gi = g[i];
        real c = w_now[i] - w_then[i];
        c = c * gi;
        c = c * gi;
        c = c * lambda;
        out[i] = c + gi;
    }
}
